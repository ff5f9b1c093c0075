//! Idempotency records: one per key, reserved before an operation runs and completed with its outcome.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::domain::idempotency::{NewIdempotencyRecord, Reservation};

#[async_trait]
pub trait IdempotencyStore: Send + Sync {
    /// The record under `key`, if live: (fingerprint, completed outcome or `None` while in flight).
    async fn idem_peek(&self, key: &str, now: UnixSecs) -> Result<Option<(String, Option<String>)>, StoreError>;
    async fn idem_reserve(&self, rec: NewIdempotencyRecord, now: UnixSecs) -> Result<Reservation, StoreError>;
    /// Complete an in-flight record with `outcome`. A record already completed (by the ledger in
    /// the same transaction as its postings) is left as it is.
    async fn idem_complete(&self, key: &str, outcome: &str) -> Result<(), StoreError>;
    /// Give the key back after a failure that moved nothing and should not be replayed.
    async fn idem_release(&self, key: &str) -> Result<(), StoreError>;
    /// Delete records past retention; returns how many.
    async fn idem_purge(&self, now: UnixSecs) -> Result<u64, StoreError>;
}
