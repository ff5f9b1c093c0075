-- paygate schema v8 (SQLite): which way money goes through a rail record. A collection comes in
-- from a customer; a payout (B2C) or a reversal goes out to one. An external ledger's own records
-- (rail 'http') are 'ledger'.
ALTER TABLE rail_payments ADD COLUMN flow TEXT NOT NULL DEFAULT 'collection';
UPDATE rail_payments SET flow = 'ledger' WHERE rail = 'http';
