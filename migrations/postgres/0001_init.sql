-- paygate schema v1 (PostgreSQL): the same tables as SQLite's 0001 + 0002, shared by replicas.
-- Amounts are integer minor units; times are Unix seconds.

CREATE TABLE accounts (
    id              TEXT PRIMARY KEY,
    currency        TEXT NOT NULL,
    balance_minor   BIGINT NOT NULL DEFAULT 0,
    allow_overdraft BOOLEAN NOT NULL DEFAULT FALSE,
    created_at      BIGINT NOT NULL
);

CREATE TABLE payments (
    seq             BIGSERIAL PRIMARY KEY,
    id              TEXT NOT NULL UNIQUE,
    idempotency_key TEXT NOT NULL UNIQUE,
    kind            TEXT NOT NULL CHECK (kind IN ('payment', 'refund')),
    status          TEXT NOT NULL,
    from_account    TEXT NOT NULL REFERENCES accounts(id),
    to_account      TEXT NOT NULL REFERENCES accounts(id),
    amount_minor    BIGINT NOT NULL CHECK (amount_minor > 0),
    currency        TEXT NOT NULL,
    refunded_minor  BIGINT NOT NULL DEFAULT 0 CHECK (refunded_minor >= 0 AND refunded_minor <= amount_minor),
    refund_of       TEXT REFERENCES payments(id),
    memo            TEXT,
    principal_sub   TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    mandate_id      TEXT
);
CREATE INDEX payments_from ON payments (from_account, seq);
CREATE INDEX payments_to ON payments (to_account, seq);
CREATE INDEX payments_budget ON payments (principal_sub, created_at);

CREATE TABLE postings (
    seq                 BIGSERIAL PRIMARY KEY,
    payment_id          TEXT REFERENCES payments(id),
    account_id          TEXT NOT NULL REFERENCES accounts(id),
    amount_minor        BIGINT NOT NULL CHECK (amount_minor <> 0),
    currency            TEXT NOT NULL,
    balance_after_minor BIGINT NOT NULL,
    description         TEXT NOT NULL,
    created_at          BIGINT NOT NULL
);
CREATE INDEX postings_account ON postings (account_id, seq);

CREATE TABLE idempotency_records (
    key           TEXT PRIMARY KEY,
    fingerprint   TEXT NOT NULL,
    tool          TEXT NOT NULL,
    principal_iss TEXT NOT NULL,
    principal_sub TEXT NOT NULL,
    state         TEXT NOT NULL CHECK (state IN ('in_flight', 'completed')),
    outcome       TEXT,
    lease_until   BIGINT NOT NULL,
    created_at    BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL
);
CREATE INDEX idempotency_expiry ON idempotency_records (expires_at);

CREATE TABLE approvals (
    seq                BIGSERIAL UNIQUE,
    id                 TEXT PRIMARY KEY,
    status             TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'rejected', 'expired')),
    idempotency_key    TEXT NOT NULL,
    fingerprint        TEXT NOT NULL,
    principal_iss      TEXT NOT NULL,
    principal_sub      TEXT NOT NULL,
    tool               TEXT NOT NULL,
    intent             TEXT NOT NULL,
    amount_minor       BIGINT NOT NULL,
    currency           TEXT NOT NULL,
    reason             TEXT NOT NULL,
    created_at         BIGINT NOT NULL,
    expires_at         BIGINT NOT NULL,
    kind               TEXT NOT NULL DEFAULT 'closed',
    reviewers_required BIGINT NOT NULL DEFAULT 1,
    requested_by       TEXT NOT NULL DEFAULT '',
    mandate_id         TEXT,
    mandate            TEXT,
    decided_at         BIGINT,
    decision_reason    TEXT
);
CREATE INDEX approvals_key ON approvals (idempotency_key, status);
CREATE INDEX approvals_status ON approvals (status, created_at);

CREATE TABLE approval_reviews (
    approval_id  TEXT NOT NULL REFERENCES approvals(id),
    reviewer_iss TEXT NOT NULL,
    reviewer_sub TEXT NOT NULL,
    decision     TEXT NOT NULL CHECK (decision IN ('approve', 'reject')),
    reason       TEXT,
    at           BIGINT NOT NULL,
    seq          BIGSERIAL,
    PRIMARY KEY (approval_id, reviewer_iss, reviewer_sub)
);

CREATE TABLE mandates (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('closed', 'open')),
    approval_id  TEXT NOT NULL REFERENCES approvals(id),
    subject      TEXT NOT NULL,
    currency     TEXT NOT NULL,
    budget_minor BIGINT,
    max_uses     BIGINT NOT NULL,
    spent_minor  BIGINT NOT NULL DEFAULT 0,
    uses         BIGINT NOT NULL DEFAULT 0,
    expires_at   BIGINT NOT NULL,
    created_at   BIGINT NOT NULL,
    CHECK (uses <= max_uses),
    CHECK (budget_minor IS NULL OR spent_minor <= budget_minor)
);

CREATE TABLE principal_state (
    subject          TEXT PRIMARY KEY,
    suspended_at     BIGINT,
    suspended_reason TEXT,
    resumed_at       BIGINT,
    resumed_seq      BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE audit_records (
    seq             BIGSERIAL PRIMARY KEY,
    at              BIGINT NOT NULL,
    correlation_id  TEXT NOT NULL,
    principal_iss   TEXT NOT NULL,
    principal_sub   TEXT NOT NULL,
    tool            TEXT NOT NULL,
    decision        TEXT NOT NULL,
    code            TEXT,
    idempotency_key TEXT,
    payment_id      TEXT,
    approval_id     TEXT,
    detail          TEXT
);
CREATE INDEX audit_principal ON audit_records (principal_sub, seq);
CREATE INDEX audit_denials ON audit_records (principal_sub, at);
