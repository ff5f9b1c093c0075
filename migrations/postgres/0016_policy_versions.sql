-- paygate schema v16 (postgres): policy as data. Every version of the policy (profiles, payee rules,
-- tool governance: domain::policy_doc, canonical JSON) is a row, never changed; the newest is in
-- force on every replica within policy.refresh_secs. Version 1 is the config file's [policy] and
-- [tools] when the store has none. A change that widens what an agent may do waits as a proposal
-- until a second, distinct operator approves it; one that only narrows applies at once.
CREATE TABLE policy_versions (
    version      BIGINT PRIMARY KEY CHECK (version >= 1),
    document     TEXT NOT NULL,
    author_iss   TEXT NOT NULL,
    author_sub   TEXT NOT NULL,
    reason       TEXT NOT NULL,
    -- The second operator of a widening change (empty: it narrowed, or it was the bootstrap).
    approver_iss TEXT NOT NULL DEFAULT '',
    approver_sub TEXT NOT NULL DEFAULT '',
    proposal_id  TEXT,
    created_at   BIGINT NOT NULL
);
CREATE TABLE policy_proposals (
    id           TEXT PRIMARY KEY,
    -- The version it was written against: it applies only while that is still the newest.
    base_version BIGINT NOT NULL,
    document     TEXT NOT NULL,
    author_iss   TEXT NOT NULL,
    author_sub   TEXT NOT NULL,
    reason       TEXT NOT NULL,
    created_at   BIGINT NOT NULL,
    status       TEXT NOT NULL CHECK (status IN ('pending', 'applied', 'rejected')),
    decided_iss  TEXT,
    decided_sub  TEXT,
    decided_at   BIGINT,
    applied_version BIGINT
);
CREATE INDEX policy_proposals_pending ON policy_proposals (created_at) WHERE status = 'pending';
-- The policy version each agent's decision was made under, and a money call's intent as policy
-- judged it (what a dry run replays). Both enter the audit hash chain (link v2).
ALTER TABLE audit_records ADD COLUMN policy_version BIGINT;
ALTER TABLE audit_records ADD COLUMN intent TEXT;
