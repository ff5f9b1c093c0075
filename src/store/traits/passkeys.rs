//! Passkeys: the WebAuthn credentials people decide approvals with, the single-use registration
//! challenges, and the enrolment codes a person's passkeys are registered with.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::approval::PasskeyRecord;
use crate::domain::approval::{ChallengeIssued, EnrolmentCode, PasskeyChallenge, PasskeyEnrolled, PasskeyEnrolment};
use crate::domain::error::StoreError;

#[async_trait]
pub trait PasskeyStore: Send + Sync {
    /// Store a registration challenge, unless its owner has `max` unexpired ones already (expired
    /// ones, anyone's, are deleted first).
    async fn passkey_challenge_put(&self, c: PasskeyChallenge, max: i64) -> Result<ChallengeIssued, StoreError>;
    /// Store an enrolment code (its hash).
    async fn passkey_code_put(&self, code: EnrolmentCode) -> Result<(), StoreError>;
    /// Register a passkey, in one transaction at `now`: delete its owner's unexpired challenge,
    /// consume the owner's unexpired unused code (naming the credential) or move the vouching live
    /// passkey's counter from what was read, insert the credential (unless its id is registered
    /// already, to anyone, or its owner has `max` live passkeys; concurrent registrations respect
    /// `max`), and write the outbox messages. Any refusal rolls all of it back.
    async fn passkey_enrol(&self, e: PasskeyEnrolment, now: UnixSecs) -> Result<PasskeyEnrolled, StoreError>;
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
