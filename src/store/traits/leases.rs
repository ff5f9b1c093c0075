//! What replicas sharing the store coordinate through: leases on scheduled jobs (one runner per job
//! kind) and rate quotas (one bucket per agent, whichever replica it calls).

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::error::StoreError;

/// One shared rate bucket, as GCRA (the algorithm governor runs in process): a bucket's state is its
/// theoretical arrival time `tat`, in microseconds of Unix time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuotaTake {
    /// Now, in microseconds since the Unix epoch.
    pub now_us: i64,
    /// What this take costs: tokens × the bucket's emission interval, in microseconds.
    pub cost_us: i64,
    /// The bucket's capacity: its quota × its emission interval, in microseconds.
    pub burst_us: i64,
}

impl QuotaTake {
    /// The bucket's state after this take, from its state before (`None`: a new bucket), or
    /// `Err(wait_us)`: the take does not fit, and would in this many microseconds.
    pub fn apply(&self, tat_us: Option<i64>) -> Result<i64, i64> {
        let next = tat_us.unwrap_or(self.now_us).max(self.now_us).saturating_add(self.cost_us);
        let over = next.saturating_sub(self.now_us).saturating_sub(self.burst_us);
        if over <= 0 { Ok(next) } else { Err(over) }
    }
}

#[async_trait]
pub trait LeaseStore: Send + Sync {
    /// Take (or keep) the lease on a scheduled job: `true` when `holder` may run `kind` now.
    /// One runner per kind across every replica sharing the store.
    async fn job_lease(&self, kind: &str, holder: &str, now: UnixSecs, lease_secs: i64) -> Result<bool, StoreError>;

    /// Give up every job lease `holder` has (a graceful stop): another replica, or this one
    /// restarted, may run the jobs at once instead of when the leases would have ended.
    async fn job_release(&self, holder: &str) -> Result<(), StoreError>;

    /// Take from the shared bucket `key` atomically (one statement, whichever replica asks):
    /// `Ok(None)` when taken, `Ok(Some(wait_us))` when the bucket has too little now.
    async fn quota_take(&self, key: &str, take: QuotaTake) -> Result<Option<i64>, StoreError>;

    /// Forget buckets that are full again at `now_us` (their state says nothing any more).
    async fn quota_forget_full(&self, now_us: i64) -> Result<u64, StoreError>;
}
