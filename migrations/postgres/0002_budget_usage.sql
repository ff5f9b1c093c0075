-- paygate schema v2 (PostgreSQL): per-subject daily spend kept with the payments, so a budget check
-- reads one row instead of summing the day's payments.
CREATE TABLE budget_usage (
    subject     TEXT NOT NULL,
    day         BIGINT NOT NULL,
    currency    TEXT NOT NULL,
    spent_minor BIGINT NOT NULL,
    payments    BIGINT NOT NULL,
    PRIMARY KEY (subject, day, currency)
);
INSERT INTO budget_usage (subject, day, currency, spent_minor, payments)
SELECT principal_sub, created_at - (created_at % 86400), currency, SUM(amount_minor), COUNT(*)
FROM payments WHERE kind = 'payment' GROUP BY 1, 2, 3;
