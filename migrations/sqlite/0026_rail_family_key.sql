-- A rail record names its operation's family key (gateway::routing::operation_family: one
-- operation_id is one payout, or one collection, whichever rail carries it), unique across rails.
-- The family's idempotency record refuses a second rail first; this holds when a database writer
-- deleted that record (the stop-66 review): a second rail's record under the same family is never
-- opened, so never sent. Records from before carry none.
ALTER TABLE rail_payments ADD COLUMN family_key TEXT;
CREATE UNIQUE INDEX rail_payments_family ON rail_payments (family_key) WHERE family_key IS NOT NULL;
