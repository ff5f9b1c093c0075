-- paygate schema v10 (PostgreSQL): storage parameters for a ledger that keeps growing.
--
-- Rows updated in place on every payment (account balances, the day's budget and refund usage, a
-- key's idempotency record, rail records moving through their states, mandates drawn on) leave room
-- in their page, so the update stays on the page and touches no index (a HOT update): fillfactor.
ALTER TABLE accounts SET (fillfactor = 50);
ALTER TABLE budget_usage SET (fillfactor = 50);
ALTER TABLE refund_usage SET (fillfactor = 50);
ALTER TABLE mandates SET (fillfactor = 70);
ALTER TABLE idempotency_records SET (fillfactor = 80);
ALTER TABLE rail_payments SET (fillfactor = 80);
ALTER TABLE approvals SET (fillfactor = 90);
-- The hot little tables churn dead row versions fast: vacuum them after a few hundred changes, not
-- after a fifth of the table (the default scale factor of 0.2).
ALTER TABLE accounts SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
ALTER TABLE budget_usage SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
ALTER TABLE refund_usage SET (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 500);
-- The large append-mostly tables: vacuum (for the visibility map, so index-only scans stay cheap)
-- and analyze after 2% new rows rather than 20%, and never wait for 10% of a billion rows.
ALTER TABLE postings SET (autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE payments SET (autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE audit_records SET (autovacuum_vacuum_insert_scale_factor = 0.02, autovacuum_analyze_scale_factor = 0.02);
ALTER TABLE idempotency_records SET (autovacuum_vacuum_scale_factor = 0.05, autovacuum_analyze_scale_factor = 0.02);
