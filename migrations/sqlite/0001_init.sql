-- paygate schema v1 (SQLite). Amounts are integer minor units; times are Unix seconds.

CREATE TABLE accounts (
    id              TEXT PRIMARY KEY,
    currency        TEXT NOT NULL,
    balance_minor   INTEGER NOT NULL DEFAULT 0,
    allow_overdraft INTEGER NOT NULL DEFAULT 0,
    created_at      INTEGER NOT NULL
);

-- One row per payment or refund. The idempotency key is unique: the ledger itself refuses to apply
-- one key twice, whatever happens above it.
CREATE TABLE payments (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    id              TEXT NOT NULL UNIQUE,
    idempotency_key TEXT NOT NULL UNIQUE,
    kind            TEXT NOT NULL CHECK (kind IN ('payment', 'refund')),
    status          TEXT NOT NULL,
    from_account    TEXT NOT NULL REFERENCES accounts(id),
    to_account      TEXT NOT NULL REFERENCES accounts(id),
    amount_minor    INTEGER NOT NULL CHECK (amount_minor > 0),
    currency        TEXT NOT NULL,
    refunded_minor  INTEGER NOT NULL DEFAULT 0 CHECK (refunded_minor >= 0 AND refunded_minor <= amount_minor),
    refund_of       TEXT REFERENCES payments(id),
    memo            TEXT,
    principal_sub   TEXT NOT NULL,
    created_at      INTEGER NOT NULL
);
CREATE INDEX payments_from ON payments (from_account, seq);
CREATE INDEX payments_to ON payments (to_account, seq);

-- Double-entry postings: each payment writes one debit (negative) and one credit (positive).
CREATE TABLE postings (
    seq                 INTEGER PRIMARY KEY AUTOINCREMENT,
    payment_id          TEXT REFERENCES payments(id),
    account_id          TEXT NOT NULL REFERENCES accounts(id),
    amount_minor        INTEGER NOT NULL CHECK (amount_minor <> 0),
    currency            TEXT NOT NULL,
    balance_after_minor INTEGER NOT NULL,
    description         TEXT NOT NULL,
    created_at          INTEGER NOT NULL
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
    lease_until   INTEGER NOT NULL,
    created_at    INTEGER NOT NULL,
    expires_at    INTEGER NOT NULL
);
CREATE INDEX idempotency_expiry ON idempotency_records (expires_at);

CREATE TABLE approvals (
    id              TEXT PRIMARY KEY,
    status          TEXT NOT NULL CHECK (status IN ('pending', 'approved', 'rejected', 'expired')),
    idempotency_key TEXT NOT NULL,
    fingerprint     TEXT NOT NULL,
    principal_iss   TEXT NOT NULL,
    principal_sub   TEXT NOT NULL,
    tool            TEXT NOT NULL,
    intent          TEXT NOT NULL,
    amount_minor    INTEGER NOT NULL,
    currency        TEXT NOT NULL,
    reason          TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL
);
CREATE INDEX approvals_key ON approvals (idempotency_key, status);

-- Append-only. Nothing updates or deletes rows here.
CREATE TABLE audit_records (
    seq             INTEGER PRIMARY KEY AUTOINCREMENT,
    at              INTEGER NOT NULL,
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
