-- The refunds recorded against a payment, found by the payment (`RailStore::rail_refunded`): a
-- backend that keeps no refunded amount of its own (the wallet service) has it from here.
CREATE INDEX rail_payments_refund_of ON rail_payments (refund_of) WHERE refund_of IS NOT NULL;
