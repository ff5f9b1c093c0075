//! Rate limits: per agent across all tools and per agent per tool, with quotas from the agent's
//! policy profile; per operator on the approval routes. In process (governor) on one replica; shared
//! through the store ([`SharedQuotas`]) when replicas serve one agent, so N replicas never allow N×
//! its quota. Time comes from the injected [`Clock`], so tests move it instead of sleeping. Idle keys
//! are evicted periodically.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

use crate::clock::Clock;
use crate::domain::error::StoreError;
use crate::domain::policy::Profile;
use crate::store::{QuotaTake, Store};

/// Adapts the injected clock to governor.
#[derive(Clone)]
pub struct GovClock(pub Arc<dyn Clock>);

impl governor::clock::Clock for GovClock {
    type Instant = Nanos;
    fn now(&self) -> Nanos {
        Nanos::from(Duration::from_millis(self.0.monotonic_millis()))
    }
}

type Keyed = RateLimiter<String, DashMapStateStore<String>, GovClock, NoOpMiddleware<Nanos>>;

fn per_minute(n: u32) -> Quota {
    Quota::per_minute(NonZeroU32::new(n.max(1)).unwrap_or(NonZeroU32::MIN))
}

/// One keyed limiter per quota value, so profiles with equal quotas share state cheaply.
pub struct KeyedLimits {
    clock: GovClock,
    limiters: std::sync::Mutex<HashMap<u32, Arc<Keyed>>>,
}

impl KeyedLimits {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        KeyedLimits { clock: GovClock(clock), limiters: std::sync::Mutex::new(HashMap::new()) }
    }

    fn limiter(&self, per_min: u32) -> Arc<Keyed> {
        let mut map = self.limiters.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(per_min)
            .or_insert_with(|| Arc::new(RateLimiter::dashmap_with_clock(per_minute(per_min), self.clock.clone())))
            .clone()
    }

    /// `Err(wait)` when `key` is over `per_min` calls per minute.
    pub fn check(&self, key: &str, per_min: u32) -> Result<(), Duration> {
        let limiter = self.limiter(per_min);
        limiter.check_key(&key.to_string()).map_err(|not_until| {
            let now = governor::clock::Clock::now(&self.clock);
            not_until.wait_time_from(now)
        })
    }

    /// Forget keys that are back at a full bucket (bounded memory).
    pub fn evict_idle(&self) {
        let map = self.limiters.lock().unwrap_or_else(|p| p.into_inner());
        for l in map.values() {
            l.retain_recent();
            l.shrink_to_fit();
        }
    }

    pub fn keys(&self) -> usize {
        let map = self.limiters.lock().unwrap_or_else(|p| p.into_inner());
        map.values().map(|l| l.len()).sum()
    }
}

/// Quotas kept in the store, so every replica takes from one bucket per key: GCRA (governor's own
/// algorithm) with its state in one row, taken in one atomic statement.
///
/// A replica takes a bucket's tokens in chunks of 1% of the quota (at least one): an agent calling at
/// its quota costs at most ~100 store writes a minute per replica, however high the quota, and what N
/// replicas hold unspent is at most N% of it — within the 10% the shared quota promises. A chunk not
/// spent within [`CHUNK_VALID`] is dropped (under-admission, never over). A refusal is remembered for
/// its wait, so a flood is refused here without a store round trip.
pub struct SharedQuotas {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    local: std::sync::Mutex<HashMap<String, Arc<Bucket>>>,
}

/// This replica's view of one shared bucket.
#[derive(Default)]
struct Bucket {
    state: std::sync::Mutex<Local>,
    /// One refill from the store at a time per bucket: concurrent calls that find no token wait for
    /// it instead of each taking a chunk (which would drain the bucket into this replica's hands).
    refill: tokio::sync::Mutex<()>,
}

#[derive(Debug, Default, Clone, Copy)]
struct Local {
    /// Tokens this replica took from the bucket and has not spent yet, and until when they count.
    tokens: u32,
    tokens_until_us: i64,
    /// The bucket refused until then: refuse here without asking the store.
    refused_until_us: i64,
}

impl Local {
    /// Answer from what this replica holds: `Some(Ok)` a token spent, `Some(Err(wait))` refused,
    /// `None` ask the store.
    fn answer(&mut self, now_us: i64) -> Option<Result<(), Duration>> {
        if self.refused_until_us > now_us {
            return Some(Err(Duration::from_micros((self.refused_until_us - now_us) as u64)));
        }
        if self.tokens > 0 && self.tokens_until_us > now_us {
            self.tokens -= 1;
            return Some(Ok(()));
        }
        None
    }

    fn idle(&self, now_us: i64) -> bool {
        self.refused_until_us <= now_us && (self.tokens == 0 || self.tokens_until_us <= now_us)
    }
}

/// How long a replica may spend a chunk it took: a leftover token older than this is dropped.
pub const CHUNK_VALID: Duration = Duration::from_secs(1);
/// Buckets this replica remembers before idle ones are swept (bounded memory).
const LOCAL_KEYS_MAX: usize = 100_000;

/// A per-minute quota's GCRA parameters: (emission interval, tokens per take), in microseconds and
/// tokens.
fn gcra(per_min: u32) -> (i64, u32) {
    let per_min = per_min.max(1);
    let interval_us = (60_000_000 / i64::from(per_min)).max(1);
    (interval_us, (per_min / 100).max(1))
}

/// A bucket's name in the store: a digest of the key, so any subject an identity provider signed (NUL
/// included, which PostgreSQL text refuses) names a bucket, and every name is 43 characters.
fn bucket_key(key: &str) -> String {
    use base64::Engine;
    use sha2::Digest;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(sha2::Sha256::digest(key.as_bytes()))
}

fn locked(b: &Bucket) -> std::sync::MutexGuard<'_, Local> {
    b.state.lock().unwrap_or_else(|p| p.into_inner())
}

impl SharedQuotas {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        SharedQuotas { store, clock, local: std::sync::Mutex::new(HashMap::new()) }
    }

    fn bucket(&self, key: &str, now_us: i64) -> Arc<Bucket> {
        let mut local = self.local.lock().unwrap_or_else(|p| p.into_inner());
        if local.len() >= LOCAL_KEYS_MAX && !local.contains_key(key) {
            local.retain(|_, b| Arc::strong_count(b) > 1 || !locked(b).idle(now_us));
        }
        local.entry(key.to_string()).or_default().clone()
    }

    /// `Ok(Err(wait))` when `key` is over `per_min` calls per minute across every replica;
    /// `Err` when the store cannot say (the caller fails closed).
    pub async fn check(&self, key: &str, per_min: u32) -> Result<Result<(), Duration>, StoreError> {
        let key = bucket_key(key);
        let bucket = self.bucket(&key, self.clock.unix_micros());
        if let Some(answer) = locked(&bucket).answer(self.clock.unix_micros()) {
            return Ok(answer);
        }
        let _refill = bucket.refill.lock().await;
        // Whoever held the refill before may have brought tokens (or a refusal) for this call too.
        let now_us = self.clock.unix_micros();
        if let Some(answer) = locked(&bucket).answer(now_us) {
            return Ok(answer);
        }
        let (interval_us, chunk) = gcra(per_min);
        let burst_us = interval_us.saturating_mul(i64::from(per_min.max(1)));
        let take = |tokens: u32| QuotaTake { now_us, cost_us: interval_us.saturating_mul(i64::from(tokens)), burst_us };
        let mut taken = chunk;
        let mut refused = self.store.quota_take(&key, take(chunk)).await?;
        if refused.is_some() && chunk > 1 {
            // Too little left for a chunk: one token may still be there.
            taken = 1;
            refused = self.store.quota_take(&key, take(1)).await?;
        }
        let mut l = locked(&bucket);
        match refused {
            None => {
                l.tokens = taken - 1;
                l.tokens_until_us = now_us.saturating_add(CHUNK_VALID.as_micros() as i64);
                Ok(Ok(()))
            }
            Some(wait_us) => {
                let wait_us = wait_us.max(1);
                l.refused_until_us = now_us.saturating_add(wait_us);
                Ok(Err(Duration::from_micros(wait_us as u64)))
            }
        }
    }

    /// Forget buckets with nothing left to say here, and buckets that are full again in the store.
    pub async fn evict_idle(&self) -> Result<u64, StoreError> {
        let now_us = self.clock.unix_micros();
        self.local
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .retain(|_, b| Arc::strong_count(b) > 1 || !locked(b).idle(now_us));
        self.store.quota_forget_full(now_us).await
    }
}

/// Agent-side limits: all tools together, and per tool where the profile names a quota.
pub struct AgentLimits {
    calls: KeyedLimits,
    tools: KeyedLimits,
    /// Set: the quotas hold across replicas (the store's buckets), not per process.
    shared: Option<SharedQuotas>,
}

impl AgentLimits {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        AgentLimits { calls: KeyedLimits::new(clock.clone()), tools: KeyedLimits::new(clock), shared: None }
    }

    /// Quotas shared by every replica on `store`.
    pub fn shared(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        AgentLimits { shared: Some(SharedQuotas::new(store, clock.clone())), ..AgentLimits::new(clock) }
    }

    pub fn is_shared(&self) -> bool {
        self.shared.is_some()
    }

    /// `Ok(Err(wait))` if this call is over either quota; `Err` when shared quotas cannot be read.
    pub async fn check(
        &self,
        principal_key: &str,
        profile: &Profile,
        tool: &str,
    ) -> Result<Result<(), Duration>, StoreError> {
        let calls = format!("{}\u{0}{principal_key}", profile.name);
        let per_tool = profile
            .tool_calls_per_minute
            .get(tool)
            .map(|n| (format!("{}\u{0}{tool}\u{0}{principal_key}", profile.name), *n));
        if let Some(shared) = &self.shared {
            if let Err(wait) = shared.check(&calls, profile.calls_per_minute).await? {
                return Ok(Err(wait));
            }
            if let Some((key, per_min)) = per_tool {
                return shared.check(&format!("tool\u{0}{key}"), per_min).await;
            }
            return Ok(Ok(()));
        }
        if let Err(wait) = self.calls.check(&calls, profile.calls_per_minute) {
            return Ok(Err(wait));
        }
        if let Some((key, per_min)) = per_tool {
            return Ok(self.tools.check(&key, per_min));
        }
        Ok(Ok(()))
    }

    pub async fn evict_idle(&self) {
        self.calls.evict_idle();
        self.tools.evict_idle();
        if let Some(shared) = &self.shared
            && let Err(error) = shared.evict_idle().await
        {
            tracing::warn!(%error, "could not forget full rate buckets; retried at the next sweep");
        }
    }
}

/// Whole seconds to wait, rounded up, at least 1.
pub fn retry_after_secs(wait: Duration) -> u64 {
    let ms = wait.as_millis() as u64;
    ms.div_ceil(1000).max(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;
    use crate::store::sqlite::SqliteStore;

    fn two_replicas(clock: &ManualClock) -> (SharedQuotas, SharedQuotas) {
        let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
        let replica = || SharedQuotas::new(store.clone(), Arc::new(clock.clone()));
        (replica(), replica())
    }

    async fn through(q: &SharedQuotas, key: &str, per_min: u32, calls: usize) -> usize {
        let mut ok = 0;
        for _ in 0..calls {
            ok += usize::from(q.check(key, per_min).await.unwrap().is_ok());
        }
        ok
    }

    #[tokio::test]
    async fn two_replicas_on_one_store_take_from_one_bucket() {
        let clock = ManualClock::new(1_000);
        let (a, b) = two_replicas(&clock);
        let mut ok = 0;
        for n in 0..20 {
            ok += usize::from([&a, &b][n % 2].check("k", 10).await.unwrap().is_ok());
        }
        assert_eq!(ok, 10, "ten a minute between them, not ten each");
        let wait = b.check("k", 10).await.unwrap().unwrap_err();
        assert!(wait > Duration::ZERO && wait <= Duration::from_secs(6), "one token every 6 s: {wait:?}");
        assert_eq!(through(&a, "other", 10, 20).await, 10, "another key has its own bucket");
        assert_eq!(through(&b, "nul\u{0}key", 10, 20).await, 10, "any key names a bucket");
        clock.advance(6);
        assert_eq!(through(&a, "k", 10, 5).await + through(&b, "k", 10, 5).await, 1, "one token back after 6 s");
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn concurrent_calls_on_one_replica_refill_one_chunk_at_a_time() {
        let clock = ManualClock::new(1_000);
        let (a, b) = two_replicas(&clock);
        let a = Arc::new(a);
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..64 {
            let a = a.clone();
            calls.spawn(async move { a.check("k", 1000).await.unwrap().is_ok() });
        }
        let mut ok = 0;
        while let Some(r) = calls.join_next().await {
            ok += usize::from(r.unwrap());
        }
        assert_eq!(ok, 64);
        // a took seven chunks of 10 and holds 6: b gets the rest. Had each of the 64 calls taken a
        // chunk of its own, a would hold 576 tokens that nobody spends.
        assert_eq!(through(&b, "k", 1000, 2000).await, 930);
    }

    #[tokio::test]
    async fn a_high_quota_is_taken_in_chunks_and_what_a_replica_holds_is_spent_or_dropped() {
        let clock = ManualClock::new(1_000);
        let (a, b) = two_replicas(&clock);
        // 1,000 a minute: replicas take 10 tokens per store write.
        assert_eq!(through(&a, "k", 1000, 1).await, 1, "a takes a chunk and spends one token of it");
        assert_eq!(through(&b, "k", 1000, 2000).await, 990, "b gets the rest, the last ones singly");
        assert_eq!(through(&a, "k", 1000, 20).await, 9, "a spends what it holds, then is refused");
        // Tokens held past CHUNK_VALID are dropped, never spent late.
        clock.advance(60);
        assert_eq!(through(&a, "k", 1000, 1).await, 1);
        clock.advance(120);
        assert_eq!(through(&b, "k", 1000, 2000).await, 1000, "a full bucket again");
        assert_eq!(through(&a, "k", 1000, 20).await, 0, "the 9 tokens a held for two minutes were dropped");
    }

    #[test]
    fn a_burst_is_limited_and_waiting_the_advised_time_lets_the_next_call_through() {
        let clock = ManualClock::new(1_000);
        let limits = KeyedLimits::new(Arc::new(clock.clone()));
        for _ in 0..3 {
            assert!(limits.check("a", 3).is_ok());
        }
        let wait = limits.check("a", 3).unwrap_err();
        assert!(limits.check("b", 3).is_ok(), "another key is unaffected");
        clock.advance(retry_after_secs(wait) as i64);
        assert!(limits.check("a", 3).is_ok());
        assert!(limits.check("a", 3).is_err());
        clock.advance(3600);
        limits.evict_idle();
        assert_eq!(limits.keys(), 0, "idle keys are forgotten");
    }
}
