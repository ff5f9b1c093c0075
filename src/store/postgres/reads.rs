//! Reads across entities (PostgreSQL): the payment summary's aggregate. The other reads are
//! statements built in `store::queries`, run by `Engine::select_rows`.

use async_trait::async_trait;
use deadpool_postgres::GenericClient;

use super::{Cached, Mapped, PostgresStore};
use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::domain::money::Currency;
use crate::domain::payment::{PaymentKind, SummaryQuery, SummaryRow};
use crate::domain::rules::guards::{self, BudgetUsage};
use crate::store::ReadStore;
use crate::store::rows;

async fn summary(c: &impl GenericClient, q: &SummaryQuery) -> Result<Vec<SummaryRow>, StoreError> {
    if q.accounts.is_empty() {
        return Ok(vec![]);
    }
    let accounts: Vec<&str> = q.accounts.iter().map(|a| a.as_str()).collect();
    c.list(
            "SELECT kind, status, currency, COUNT(*), COALESCE(SUM(amount_minor), 0)::BIGINT FROM (
                 SELECT kind, status, currency, amount_minor, from_account, to_account, created_at FROM payments
                 UNION ALL
                 SELECT kind, CASE state WHEN 'succeeded' THEN 'succeeded' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
                        currency, amount_minor, from_account, to_account, created_at FROM rail_payments
             ) p
             WHERE created_at >= $1 AND created_at < $2 AND ($3::TEXT IS NULL OR currency = $3)
               AND (from_account = ANY($4) OR to_account = ANY($4))
             GROUP BY kind, status, currency ORDER BY kind, status, currency",
            &[&q.from, &q.to, &q.currency.map(|c| c.code()), &accounts],
        rows::summary,
    )
    .await
}

#[async_trait]
impl ReadStore for PostgresStore {
    async fn payment_summary(&self, query: SummaryQuery) -> Result<Vec<SummaryRow>, StoreError> {
        let client = self.pool.get().await?;
        summary(&client, &query).await
    }

    async fn budget_usage(
        &self,
        kind: PaymentKind,
        subject: &str,
        day: UnixSecs,
        currency: Currency,
    ) -> Result<BudgetUsage, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT COALESCE(SUM(payments), 0)::BIGINT,
                    COALESCE(SUM(CASE WHEN currency = $3 THEN spent_minor ELSE 0 END), 0)::BIGINT
             FROM {} WHERE subject = $1 AND day = $2",
            guards::usage_table(kind)
        );
        let row = client.one(&sql, &[&subject, &day, &currency.code()]).await?;
        Ok(BudgetUsage { payments: row.get(0), spent_minor: row.get(1) })
    }
}
