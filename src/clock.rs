//! Time is a seam: approvals, mandates, budgets and idempotency retention read a [`Clock`] so tests
//! can move time instead of sleeping.

use std::sync::Arc;
use std::sync::atomic::{AtomicI64, Ordering};

/// Seconds since the Unix epoch.
pub type UnixSecs = i64;

pub trait Clock: Send + Sync + 'static {
    fn now(&self) -> UnixSecs;
    /// A monotonic reading in milliseconds, for rate limiters.
    fn monotonic_millis(&self) -> u64;
    /// Microseconds since the Unix epoch: what replicas share rate quotas by (a monotonic reading
    /// means nothing to another process).
    fn unix_micros(&self) -> i64 {
        self.now().saturating_mul(1_000_000)
    }
}

#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> UnixSecs {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs() as i64).unwrap_or(0)
    }
    fn monotonic_millis(&self) -> u64 {
        static START: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        START.get_or_init(std::time::Instant::now).elapsed().as_millis() as u64
    }
    fn unix_micros(&self) -> i64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
    }
}

/// A clock tests set and advance by hand.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicI64>);

impl ManualClock {
    pub fn new(start: UnixSecs) -> Self {
        ManualClock(Arc::new(AtomicI64::new(start)))
    }
    pub fn advance(&self, secs: i64) {
        self.0.fetch_add(secs, Ordering::SeqCst);
    }
    pub fn set(&self, now: UnixSecs) {
        self.0.store(now, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> UnixSecs {
        self.0.load(Ordering::SeqCst)
    }
    fn monotonic_millis(&self) -> u64 {
        (self.0.load(Ordering::SeqCst).max(0) as u64).saturating_mul(1000)
    }
}

/// RFC 3339 UTC timestamp for responses and audit records.
pub fn rfc3339(secs: UnixSecs) -> String {
    time::OffsetDateTime::from_unix_timestamp(secs)
        .ok()
        .and_then(|t| t.format(&time::format_description::well_known::Rfc3339).ok())
        .unwrap_or_else(|| secs.to_string())
}
