//! Passkeys: the WebAuthn credentials people decide approvals with.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::approval::{PasskeyInsert, PasskeyRecord};
use crate::domain::error::StoreError;

#[async_trait]
pub trait PasskeyStore: Send + Sync {
    /// Register `rec`, unless its credential id is registered already (to anyone) or its owner
    /// has `max` live passkeys: one transaction, so concurrent registrations respect `max`.
    async fn passkey_insert(&self, rec: PasskeyRecord, max: i64) -> Result<PasskeyInsert, StoreError>;
    /// One credential (a revoked one too: its stored assertions stay verifiable).
    async fn passkey_get(&self, credential_id: &str) -> Result<Option<PasskeyRecord>, StoreError>;
    /// A person's passkeys, newest first, revoked ones too.
    async fn passkey_list(&self, owner_iss: &str, owner_sub: &str) -> Result<Vec<PasskeyRecord>, StoreError>;
    /// Revoke a live credential; whether it was live.
    async fn passkey_revoke(&self, credential_id: &str, by: &str, at: UnixSecs) -> Result<bool, StoreError>;
    /// Move a live credential's signature counter from `seen` (read before the assertion was
    /// verified) to `count`: false when it moved meanwhile (the same assertion presented twice at
    /// once) or the credential was revoked.
    async fn passkey_count(&self, credential_id: &str, seen: i64, count: i64) -> Result<bool, StoreError>;
}
