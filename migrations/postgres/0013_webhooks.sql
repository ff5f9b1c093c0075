-- paygate schema v13 (PostgreSQL): the webhook outbox. A message per (event, subscribed endpoint) is
-- written in the same transaction as the event (an approval asked for or decided, a suspension, a
-- payee added, an integrity failure or reconciliation mismatch recorded); the delivery job (one
-- replica at a time, by its lease) sends it until the endpoint answers 2xx or its attempts run out.
-- Its id is the `webhook-id` of every attempt: receivers de-duplicate on it.
CREATE TABLE webhook_outbox (
    id              TEXT PRIMARY KEY,
    endpoint        TEXT NOT NULL,
    event           TEXT NOT NULL,
    body            TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    state           TEXT NOT NULL DEFAULT 'pending' CHECK (state IN ('pending', 'delivered', 'failed')),
    attempts        BIGINT NOT NULL DEFAULT 0,
    next_attempt_at BIGINT NOT NULL,
    delivered_at    BIGINT,
    last_status     BIGINT,
    last_error      TEXT
);
CREATE INDEX webhook_outbox_due ON webhook_outbox (next_attempt_at) WHERE state = 'pending';
CREATE INDEX webhook_outbox_by_time ON webhook_outbox (created_at DESC);
CREATE TABLE webhook_attempts (
    message_id  TEXT NOT NULL,
    attempt     BIGINT NOT NULL,
    at          BIGINT NOT NULL,
    status      BIGINT,
    error       TEXT,
    duration_ms BIGINT NOT NULL,
    PRIMARY KEY (message_id, attempt)
);
