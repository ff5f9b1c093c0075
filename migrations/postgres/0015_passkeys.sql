-- paygate schema v15 (PostgreSQL): passkeys (WebAuthn credentials) of the people who decide
-- approvals, and the passkey evidence of each review. A credential belongs to one person (token
-- issuer and subject); its public key never changes, its signature counter only rises. Revoked
-- credentials are kept (who, when): a stored assertion stays verifiable from the key that made it.
-- public_key is the SEC1 uncompressed P-256 point, base64url; rp_id and origin are the relying party
-- it was made for (its assertions verify against them, whatever server.public_url says later).
CREATE TABLE passkeys (
    credential_id   TEXT PRIMARY KEY,
    owner_iss       TEXT NOT NULL,
    owner_sub       TEXT NOT NULL,
    public_key      TEXT NOT NULL,
    sign_count      BIGINT NOT NULL,
    backup_eligible BIGINT NOT NULL,
    name            TEXT NOT NULL,
    rp_id           TEXT NOT NULL,
    origin          TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    revoked_at      BIGINT,
    revoked_by      TEXT
);
CREATE INDEX passkeys_by_owner ON passkeys (owner_iss, owner_sub);
-- Whether deciding an approval needs a passkey assertion over its intent (its agent's profile or
-- its amount tier said so when it was asked for).
ALTER TABLE approvals ADD COLUMN passkey_required BIGINT NOT NULL DEFAULT 0 CHECK (passkey_required IN (0, 1));
-- The assertion a review was signed with (JSON: credential_id, client_data_json,
-- authenticator_data, signature, base64url), as received.
ALTER TABLE approval_reviews ADD COLUMN passkey TEXT;
