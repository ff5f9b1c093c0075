-- Policy versions and proposals carry the gateway's tag (domain::audit_chain::row_tag over every other field,
-- under the audit link key): a version inserted or edited in the database is never put in force, a proposal never approved.
ALTER TABLE policy_versions ADD COLUMN tag TEXT;
ALTER TABLE policy_proposals ADD COLUMN tag TEXT;
