-- paygate schema v3 (PostgreSQL): the gateway's own record of payments made through external rails
-- (HTTP ledger service, M-Pesa), and leases that keep each scheduled job to one runner at a time.
--
-- state: submitting (guards drawn, not yet answered) | unknown (sent, outcome not known) |
--        pending (accepted, waiting for the rail) | succeeded | failed
CREATE TABLE rail_payments (
    seq             BIGSERIAL PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    idempotency_key TEXT NOT NULL UNIQUE,
    rail            TEXT NOT NULL,
    kind            TEXT NOT NULL,
    state           TEXT NOT NULL,
    from_account    TEXT NOT NULL,
    to_account      TEXT NOT NULL,
    amount_minor    BIGINT NOT NULL CHECK (amount_minor > 0),
    currency        TEXT NOT NULL,
    refund_of       TEXT,
    memo            TEXT,
    principal_sub   TEXT NOT NULL,
    mandate_id      TEXT,
    rail_ref        TEXT,
    receipt         TEXT,
    phone           TEXT,
    reason          TEXT,
    created_at      BIGINT NOT NULL,
    updated_at      BIGINT NOT NULL
);
CREATE UNIQUE INDEX rail_payments_ref ON rail_payments (rail, rail_ref) WHERE rail_ref IS NOT NULL;
CREATE INDEX rail_payments_state ON rail_payments (state, updated_at);
CREATE INDEX rail_payments_created ON rail_payments (created_at);

CREATE TABLE job_leases (
    kind        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    lease_until BIGINT NOT NULL
);
