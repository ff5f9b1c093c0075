//! The audit trail (PostgreSQL). A posting appends its audit record in its own transaction
//! (`insert_audit`, `INSERT_AUDIT`).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;

use super::{Cached, Mapped, PostgresStore, bind};
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::store::AuditStore;
use crate::store::rows;

pub(super) const INSERT_AUDIT: &str =
    "INSERT INTO audit_records (at, correlation_id, principal_iss, principal_sub, tool, decision, code,
                                                     idempotency_key, payment_id, approval_id, detail, principal_user,
                                                     repeats)
                            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)";

pub(super) async fn insert_audit(
    c: &impl GenericClient,
    r: &AuditRecord,
    payment_id: Option<&str>,
) -> Result<(), StoreError> {
    c.exec(INSERT_AUDIT, &bind(&rows::audit_values(r, payment_id))).await?;
    Ok(())
}

#[async_trait]
impl AuditStore for PostgresStore {
    async fn audit_append(&self, r: AuditRecord) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        insert_audit(&client, &r, None).await
    }

    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {} FROM audit_records WHERE ($1::TEXT IS NULL OR principal_sub = $1) ORDER BY seq DESC LIMIT $2",
            rows::AUDIT_COLS
        );
        client.list(&sql, &[&principal_sub, &i64::from(limit)], rows::audit).await
    }

    async fn audit_before(&self, cutoff: UnixSecs, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!("SELECT {} FROM audit_records WHERE at < $1 ORDER BY seq LIMIT $2", rows::AUDIT_COLS);
        client.list(&sql, &[&cutoff, &i64::from(limit)], rows::audit).await
    }

    async fn audit_delete(&self, first_seq: i64, last_seq: i64, cutoff: UnixSecs) -> Result<u64, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .exec(
                "DELETE FROM audit_records WHERE seq >= $1 AND seq <= $2 AND at < $3",
                &[&first_seq, &last_seq, &cutoff],
            )
            .await?)
    }
}
