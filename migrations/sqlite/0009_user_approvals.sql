-- paygate schema v9 (SQLite): who may decide an approval besides operators. 'user': the person the
-- agent acts for may confirm it themselves (their profile's user-approval tier).
ALTER TABLE approvals ADD COLUMN approver TEXT NOT NULL DEFAULT 'operator';
