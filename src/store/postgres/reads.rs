//! Reads across entities (PostgreSQL): the payment summary's aggregate. The other reads are
//! statements built in `store::queries`, run by `Engine::select_rows`.

use async_trait::async_trait;
use deadpool_postgres::GenericClient;

use super::{Mapped, PostgresStore};
use crate::domain::error::StoreError;
use crate::domain::payment::{SummaryQuery, SummaryRow};
use crate::store::ReadStore;
use crate::store::rows;

async fn summary(c: &impl GenericClient, q: &SummaryQuery) -> Result<Vec<SummaryRow>, StoreError> {
    if q.accounts.is_empty() {
        return Ok(vec![]);
    }
    let accounts: Vec<&str> = q.accounts.iter().map(|a| a.as_str()).collect();
    c.list(
            "SELECT kind, status, currency, COUNT(*), COALESCE(SUM(amount_minor), 0)::BIGINT FROM (
                 SELECT kind, status, currency, amount_minor, from_account, to_account, created_at, principal_user
                   FROM payments
                 UNION ALL
                 SELECT kind, CASE state WHEN 'succeeded' THEN 'succeeded' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
                        currency, amount_minor, from_account, to_account, created_at, principal_user FROM rail_payments
             ) p
             WHERE created_at >= $1 AND created_at < $2 AND ($3::TEXT IS NULL OR currency = $3)
               AND ($5::TEXT IS NULL OR COALESCE(principal_user, '') = $5)
               AND (from_account = ANY($4) OR to_account = ANY($4))
             GROUP BY kind, status, currency ORDER BY kind, status, currency",
            &[&q.from, &q.to, &q.currency.map(|c| c.code()), &accounts, &q.principal_user],
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
}
