-- The agents that have acted for a person (delegation): an operator approving a policy change is
-- asked whether it widens what those (agent, person) pairs may do (no principal acts on itself).
CREATE INDEX audit_user_agent ON audit_records (principal_user, principal_sub) WHERE principal_user IS NOT NULL;
