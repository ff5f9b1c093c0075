-- paygate schema v2 (SQLite): reviewers, mandates, stop rules, budgets.

ALTER TABLE approvals ADD COLUMN kind TEXT NOT NULL DEFAULT 'closed';
ALTER TABLE approvals ADD COLUMN reviewers_required INTEGER NOT NULL DEFAULT 1;
ALTER TABLE approvals ADD COLUMN requested_by TEXT NOT NULL DEFAULT '';
ALTER TABLE approvals ADD COLUMN mandate_id TEXT;
ALTER TABLE approvals ADD COLUMN mandate TEXT;
ALTER TABLE approvals ADD COLUMN decided_at INTEGER;
ALTER TABLE approvals ADD COLUMN decision_reason TEXT;
CREATE INDEX approvals_status ON approvals (status, created_at);

-- One row per reviewer per approval: a reviewer counts once.
CREATE TABLE approval_reviews (
    approval_id  TEXT NOT NULL REFERENCES approvals(id),
    reviewer_iss TEXT NOT NULL,
    reviewer_sub TEXT NOT NULL,
    decision     TEXT NOT NULL CHECK (decision IN ('approve', 'reject')),
    reason       TEXT,
    at           INTEGER NOT NULL,
    PRIMARY KEY (approval_id, reviewer_iss, reviewer_sub)
);

-- Issued mandates and what has been drawn on them (in the posting transaction).
CREATE TABLE mandates (
    id           TEXT PRIMARY KEY,
    kind         TEXT NOT NULL CHECK (kind IN ('closed', 'open')),
    approval_id  TEXT NOT NULL REFERENCES approvals(id),
    subject      TEXT NOT NULL,
    currency     TEXT NOT NULL,
    budget_minor INTEGER,
    max_uses     INTEGER NOT NULL,
    spent_minor  INTEGER NOT NULL DEFAULT 0,
    uses         INTEGER NOT NULL DEFAULT 0,
    expires_at   INTEGER NOT NULL,
    created_at   INTEGER NOT NULL,
    CHECK (uses <= max_uses),
    CHECK (budget_minor IS NULL OR spent_minor <= budget_minor)
);

-- Stop rules: a suspended subject moves no money until an admin resumes it.
CREATE TABLE principal_state (
    subject          TEXT PRIMARY KEY,
    suspended_at     INTEGER,
    suspended_reason TEXT,
    resumed_at       INTEGER,
    -- Audit sequence number at the resume: denials up to it never count again.
    resumed_seq      INTEGER NOT NULL DEFAULT 0
);

ALTER TABLE payments ADD COLUMN mandate_id TEXT;
CREATE INDEX payments_budget ON payments (principal_sub, created_at);
CREATE INDEX audit_denials ON audit_records (principal_sub, at);
