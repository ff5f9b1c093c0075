//! The audit trail (append-only; archival deletes what it has archived).

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;

#[async_trait]
pub trait AuditStore: Send + Sync {
    async fn audit_append(&self, rec: AuditRecord) -> Result<(), StoreError>;
    /// Newest first; `principal_sub` filters when given.
    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;
    /// The oldest records made before `cutoff`, oldest first, at most `limit` (for archival).
    async fn audit_before(&self, cutoff: UnixSecs, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;
    /// Delete the records `first_seq ..= last_seq` made before `cutoff` (once archived); how many.
    async fn audit_delete(&self, first_seq: i64, last_seq: i64, cutoff: UnixSecs) -> Result<u64, StoreError>;
}
