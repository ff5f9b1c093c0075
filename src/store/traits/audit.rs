//! The audit trail: append-only, sealed onto a hash chain (`domain::audit_chain`) after commit;
//! archival deletes only whole checkpointed ranges of the chain, once archived.

use async_trait::async_trait;

use crate::domain::audit::AuditRecord;
use crate::domain::audit_chain::{ChainHead, Checkpoint, LinkKey};
use crate::domain::error::StoreError;
use crate::domain::webhook::OutboxMessage;

#[async_trait]
pub trait AuditStore: Send + Sync {
    /// Append one record in its own transaction; its seq (the gateway witnesses it until sealed).
    async fn audit_append(&self, rec: AuditRecord) -> Result<i64, StoreError>;
    /// Newest first; `principal_sub` filters when given.
    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;
    /// Seal up to `limit` committed records onto the hash chain, in chain order, each link keyed
    /// with `key` (`domain::audit_chain::keyed_link_hash`; one sealing run at a time, whatever the
    /// replicas); how many, and the head after.
    async fn audit_seal(&self, key: &LinkKey, limit: u32) -> Result<(u64, ChainHead), StoreError>;
    /// Store a signed checkpoint with its webhook messages, in one transaction. Again for the same
    /// position: nothing changes, unless `replace` (a retention marker) and the hash is the same,
    /// when its signature and time replace the stored ones.
    async fn audit_checkpoint_put(
        &self,
        cp: Checkpoint,
        replace: bool,
        messages: Vec<OutboxMessage>,
    ) -> Result<(), StoreError>;
    /// Delete a checkpoint a newer one made redundant (`audit_chain::seal`'s thinning).
    async fn audit_checkpoint_drop(&self, chain_seq: i64) -> Result<(), StoreError>;
    /// Delete the records and links of chain positions `..= chain_seq` (archived, and ending at a
    /// checkpoint); how many records.
    async fn audit_delete_through(&self, chain_seq: i64) -> Result<u64, StoreError>;
}
