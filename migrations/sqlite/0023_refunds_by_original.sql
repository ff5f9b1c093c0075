-- A refund's posting sums the refunds its original already has from their own rows (a reset
-- refunded_minor column never makes a payment refundable twice): only refund rows are indexed.
CREATE INDEX IF NOT EXISTS payments_refund_of ON payments (refund_of) WHERE refund_of IS NOT NULL;
