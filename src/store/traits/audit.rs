//! The audit trail: append-only, sealed onto a hash chain (`domain::audit_chain`) after commit;
//! archival deletes only whole checkpointed ranges of the chain, once archived.

use async_trait::async_trait;

use crate::domain::audit::AuditRecord;
use crate::domain::audit_chain::{ChainHead, Checkpoint};
use crate::domain::error::StoreError;

#[async_trait]
pub trait AuditStore: Send + Sync {
    async fn audit_append(&self, rec: AuditRecord) -> Result<(), StoreError>;
    /// Newest first; `principal_sub` filters when given.
    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;
    /// Seal up to `limit` committed records onto the hash chain, in chain order (one sealing run
    /// at a time, whatever the replicas); how many, and the head after.
    async fn audit_seal(&self, limit: u32) -> Result<(u64, ChainHead), StoreError>;
    /// Store a signed checkpoint (again for the same position: nothing changes).
    async fn audit_checkpoint_put(&self, cp: Checkpoint) -> Result<(), StoreError>;
    /// Delete the records and links of chain positions `..= chain_seq` (archived, and ending at a
    /// checkpoint); how many records.
    async fn audit_delete_through(&self, chain_seq: i64) -> Result<u64, StoreError>;
}
