//! Reads across entities (SQLite): the payment summary's aggregate. The other reads are statements
//! built in `store::queries`, run by `Engine::select_rows`.

use async_trait::async_trait;
use rusqlite::{Connection, params};

use super::{Cached, SqliteStore};
use crate::domain::error::StoreError;
use crate::domain::payment::{SummaryQuery, SummaryRow};
use crate::store::ReadStore;
use crate::store::rows;

fn summary(c: &Connection, q: &SummaryQuery) -> Result<Vec<SummaryRow>, StoreError> {
    if q.accounts.is_empty() {
        return Ok(vec![]);
    }
    let accounts = serde_json::to_string(&q.accounts.iter().map(|a| a.as_str()).collect::<Vec<_>>())
        .map_err(|e| StoreError::Database(e.to_string()))?;
    c.all(
        "SELECT kind, status, currency, COUNT(*), COALESCE(SUM(amount_minor), 0) FROM (
             SELECT kind, status, currency, amount_minor, from_account, to_account, created_at, principal_user
               FROM payments
             UNION ALL
             SELECT kind, CASE state WHEN 'succeeded' THEN 'succeeded' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
                    currency, amount_minor, from_account, to_account, created_at, principal_user FROM rail_payments
         )
         WHERE created_at >= ?1 AND created_at < ?2 AND (?3 IS NULL OR currency = ?3)
           AND (?5 IS NULL OR COALESCE(principal_user, '') = ?5)
           AND (from_account IN (SELECT value FROM json_each(?4)) OR to_account IN (SELECT value FROM json_each(?4)))
         GROUP BY kind, status, currency ORDER BY kind, status, currency",
        params![q.from, q.to, q.currency.map(|c| c.code()), accounts, q.principal_user],
        rows::summary,
    )
}

#[async_trait]
impl ReadStore for SqliteStore {
    async fn payment_summary(&self, query: SummaryQuery) -> Result<Vec<SummaryRow>, StoreError> {
        self.run_heavy(move |c| summary(c, &query)).await
    }
}
