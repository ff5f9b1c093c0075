-- paygate schema v6 (PostgreSQL): indexes for the operator console's reads: a payment's audit
-- trail (by payment, idempotency key or approval), audit search by correlation id and time, and
-- payments and mandates newest first.
CREATE INDEX audit_payment ON audit_records (payment_id) WHERE payment_id IS NOT NULL;
CREATE INDEX audit_key ON audit_records (idempotency_key) WHERE idempotency_key IS NOT NULL;
CREATE INDEX audit_approval ON audit_records (approval_id) WHERE approval_id IS NOT NULL;
CREATE INDEX audit_correlation ON audit_records (correlation_id);
CREATE INDEX audit_at ON audit_records (at);
CREATE INDEX payments_created ON payments (created_at);
CREATE INDEX mandates_created ON mandates (created_at);
