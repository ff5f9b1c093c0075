//! Leases on scheduled jobs: one runner per job kind across every replica sharing the store.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::error::StoreError;

#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Take (or keep) the lease on a scheduled job: `true` when `holder` may run `kind` now.
    /// One runner per kind across every replica sharing the store.
    async fn job_lease(&self, kind: &str, holder: &str, now: UnixSecs, lease_secs: i64) -> Result<bool, StoreError>;
}
