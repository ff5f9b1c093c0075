-- Each record carries its writer's keyed tag (HMAC under the link key, which the database never
-- holds: `domain::audit_chain::record_tag`), so `audit verify` names an edit of a record that is
-- not yet sealed. NULL on records written before this migration.
ALTER TABLE audit_records ADD COLUMN tag TEXT;
