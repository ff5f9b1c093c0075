-- paygate schema v5 (PostgreSQL): per-subject daily refunds, kept apart from budget_usage so that
-- autonomous refunds draw on their own daily budget (and a refund never frees payment budget).
CREATE TABLE refund_usage (
    subject     TEXT NOT NULL,
    day         BIGINT NOT NULL,
    currency    TEXT NOT NULL,
    spent_minor BIGINT NOT NULL,
    payments    BIGINT NOT NULL,
    PRIMARY KEY (subject, day, currency)
);
INSERT INTO refund_usage (subject, day, currency, spent_minor, payments)
SELECT subject, day, currency, SUM(amount_minor), COUNT(*) FROM (
    SELECT principal_sub AS subject, created_at - (created_at % 86400) AS day, currency, amount_minor
    FROM payments WHERE kind = 'refund'
    UNION ALL
    SELECT principal_sub, created_at - (created_at % 86400), currency, amount_minor
    FROM rail_payments WHERE kind = 'refund' AND state <> 'failed'
) AS refunds GROUP BY subject, day, currency;
