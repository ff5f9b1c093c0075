-- paygate schema v5 (SQLite): a mandate can be revoked by an operator before it is used up.
ALTER TABLE mandates ADD COLUMN revoked_at INTEGER;
ALTER TABLE mandates ADD COLUMN revoked_by TEXT;
