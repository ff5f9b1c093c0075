//! The audit trail (SQLite). A posting appends its audit record in its own transaction
//! (`insert_audit`).

use async_trait::async_trait;
use rusqlite::{Connection, params, params_from_iter};

use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::store::AuditStore;
use crate::store::rows;

pub(super) fn insert_audit(c: &Connection, r: &AuditRecord, payment_id: Option<&str>) -> rusqlite::Result<usize> {
    c.exec(
        "INSERT INTO audit_records (at, correlation_id, principal_iss, principal_sub, tool, decision, code,
                                    idempotency_key, payment_id, approval_id, detail, principal_user, repeats)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
        params_from_iter(rows::audit_values(r, payment_id)),
    )
}

#[async_trait]
impl AuditStore for SqliteStore {
    async fn audit_append(&self, r: AuditRecord) -> Result<(), StoreError> {
        self.write(move |c| Ok(insert_audit(c, &r, None).map(|_| ())?)).await
    }

    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let sub = principal_sub.map(str::to_string);
        self.run_heavy(move |c| {
            let sql = format!(
                "SELECT {} FROM audit_records WHERE (?1 IS NULL OR principal_sub = ?1) ORDER BY seq DESC LIMIT ?2",
                rows::AUDIT_COLS
            );
            c.all(&sql, params![sub, limit], rows::audit)
        })
        .await
    }

    async fn audit_before(&self, cutoff: UnixSecs, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        self.run_heavy(move |c| {
            let sql = format!("SELECT {} FROM audit_records WHERE at < ?1 ORDER BY seq LIMIT ?2", rows::AUDIT_COLS);
            c.all(&sql, params![cutoff, limit], rows::audit)
        })
        .await
    }

    async fn audit_delete(&self, first_seq: i64, last_seq: i64, cutoff: UnixSecs) -> Result<u64, StoreError> {
        self.write(move |c| {
            let n = c.exec(
                "DELETE FROM audit_records WHERE seq >= ?1 AND seq <= ?2 AND at < ?3",
                params![first_seq, last_seq, cutoff],
            )?;
            Ok(n as u64)
        })
        .await
    }
}
