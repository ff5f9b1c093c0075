-- paygate schema v11 (SQLite): three principals. An agent may act for a user (RFC 8693
-- delegation: the token's sub is the user, act.sub the agent); records name both. NULL user: the
-- agent acted on its own token.
ALTER TABLE audit_records ADD COLUMN principal_user TEXT;
-- A throttled refusal record stands for this many refusals (a flood is one record per interval).
ALTER TABLE audit_records ADD COLUMN repeats INTEGER NOT NULL DEFAULT 1;
ALTER TABLE payments ADD COLUMN principal_user TEXT;
ALTER TABLE rail_payments ADD COLUMN principal_user TEXT;
ALTER TABLE approvals ADD COLUMN principal_user TEXT;
-- URL-elicitation rounds answered for this approval (bounded by approvals.elicitation_rounds_max,
-- whichever sealed state the client presents).
ALTER TABLE approvals ADD COLUMN elicitation_rounds INTEGER NOT NULL DEFAULT 0;
ALTER TABLE mandates ADD COLUMN principal_user TEXT;

-- Suspensions keyed by (issuer, subject) and what they cover: scope 'agent' is the agent whoever
-- it acts for (principal_user ''); scope 'pair' is the agent acting for principal_user ('' = on its
-- own token). The stop rule suspends a pair; an operator may suspend either.
CREATE TABLE principal_state_v11 (
    issuer           TEXT NOT NULL,
    subject          TEXT NOT NULL,
    scope            TEXT NOT NULL CHECK (scope IN ('agent', 'pair')),
    principal_user   TEXT NOT NULL DEFAULT '',
    suspended_at     INTEGER,
    suspended_reason TEXT,
    resumed_at       INTEGER,
    -- Audit sequence number at the resume: denials up to it never count again.
    resumed_seq      INTEGER NOT NULL DEFAULT 0,
    PRIMARY KEY (issuer, subject, scope, principal_user)
);
-- Rows from before issuers were recorded keep applying to the subject under any issuer (issuer ''):
-- fail closed, until an operator resumes it.
INSERT INTO principal_state_v11 (issuer, subject, scope, principal_user, suspended_at, suspended_reason, resumed_at,
                                 resumed_seq)
SELECT '', subject, 'agent', '', suspended_at, suspended_reason, resumed_at, resumed_seq FROM principal_state;
DROP TABLE principal_state;
ALTER TABLE principal_state_v11 RENAME TO principal_state;
