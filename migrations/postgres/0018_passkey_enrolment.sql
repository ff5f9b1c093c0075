-- paygate schema v18 (PostgreSQL): passkey enrolment a bearer token alone cannot do.
-- A registration challenge is single-use: options stores the SHA-256 of the challenge it hands out
-- (for one person, until expires_at) and a registration deletes that row in the transaction that
-- stores the credential, so one challenge registers at most one credential, on any replica.
CREATE TABLE passkey_challenges (
    challenge_sha256 TEXT PRIMARY KEY,
    owner_iss        TEXT NOT NULL,
    owner_sub        TEXT NOT NULL,
    created_at       BIGINT NOT NULL,
    expires_at       BIGINT NOT NULL
);
CREATE INDEX passkey_challenges_by_owner ON passkey_challenges (owner_iss, owner_sub);
CREATE INDEX passkey_challenges_by_expiry ON passkey_challenges (expires_at);
-- An enrolment code: what a person's first passkey (or any later one, instead of an assertion by a
-- live passkey of theirs) is registered with. Issued for one person by another operator (admin) or
-- by the command line at the box; kept only as the SHA-256 of the code; single-use (used_at and the
-- credential it registered are set in the transaction that stores the credential); expiring.
CREATE TABLE passkey_enrolment_codes (
    code_sha256   TEXT PRIMARY KEY,
    owner_iss     TEXT NOT NULL,
    owner_sub     TEXT NOT NULL,
    issued_by     TEXT NOT NULL,
    issued_at     BIGINT NOT NULL,
    expires_at    BIGINT NOT NULL,
    used_at       BIGINT,
    credential_id TEXT
);
CREATE INDEX passkey_enrolment_codes_by_owner ON passkey_enrolment_codes (owner_iss, owner_sub);
