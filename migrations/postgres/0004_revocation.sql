-- paygate schema v4 (PostgreSQL): a mandate can be revoked by an operator before it is used up.
ALTER TABLE mandates ADD COLUMN revoked_at BIGINT;
ALTER TABLE mandates ADD COLUMN revoked_by TEXT;
