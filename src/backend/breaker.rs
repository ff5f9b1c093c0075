//! A circuit breaker for calls to a system outside the gateway, and the backoff between retries.
//!
//! The breaker counts consecutive failed attempts; while open it fails fast; after `open` (by
//! the injected clock) one probe goes through, and its result closes or reopens the circuit.
//! Used by the HTTP ledger and the Daraja client, each with its own breaker.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use rand::Rng as _;

use crate::clock::Clock;

/// The wait before retry number `retry` (1-based): "full jitter" — uniform in
/// `[0, min(max, base × 2^(retry-1))]` — so that callers that failed together do not retry together.
pub fn backoff_with_jitter(retry: u32, base: Duration, max: Duration) -> Duration {
    let cap = base.saturating_mul(1u32 << retry.saturating_sub(1).min(16)).min(max);
    let cap_ms = u64::try_from(cap.as_millis()).unwrap_or(u64::MAX);
    Duration::from_millis(rand::rng().random_range(0..=cap_ms))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BreakerState {
    Closed { failures: u32 },
    Open { until_ms: u64 },
    HalfOpen { probing: bool },
}

pub struct Breaker {
    /// Names the breaker in logs ("http ledger", "daraja").
    name: &'static str,
    failures_max: u32,
    open_ms: u64,
    clock: Arc<dyn Clock>,
    state: Mutex<BreakerState>,
}

/// Leave to try one attempt; report its result with `record`. A probe dropped unreported (its
/// future cancelled) frees the probe slot.
pub struct Permit<'a> {
    breaker: &'a Breaker,
    probe: bool,
    recorded: bool,
}

impl Breaker {
    pub fn new(name: &'static str, failures_max: u32, open: Duration, clock: Arc<dyn Clock>) -> Self {
        Breaker {
            name,
            failures_max,
            open_ms: u64::try_from(open.as_millis()).unwrap_or(u64::MAX),
            clock,
            state: Mutex::new(BreakerState::Closed { failures: 0 }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, BreakerState> {
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub fn acquire(&self) -> Option<Permit<'_>> {
        let now = self.clock.monotonic_millis();
        let mut s = self.lock();
        let probe = match *s {
            BreakerState::Closed { .. } => false,
            BreakerState::Open { until_ms } if now < until_ms => return None,
            BreakerState::Open { .. } | BreakerState::HalfOpen { probing: false } => {
                *s = BreakerState::HalfOpen { probing: true };
                tracing::info!(breaker = self.name, "circuit half-open: sending one probe");
                true
            }
            BreakerState::HalfOpen { probing: true } => return None,
        };
        Some(Permit { breaker: self, probe, recorded: false })
    }

    fn record(&self, probe: bool, ok: bool) {
        let mut s = self.lock();
        if ok {
            if !matches!(*s, BreakerState::Closed { .. }) {
                tracing::info!(breaker = self.name, "circuit closed");
            }
            *s = BreakerState::Closed { failures: 0 };
            return;
        }
        let until_ms = self.clock.monotonic_millis().saturating_add(self.open_ms);
        match *s {
            BreakerState::Closed { failures } => {
                let failures = failures.saturating_add(1);
                if failures >= self.failures_max {
                    tracing::warn!(breaker = self.name, failures, open_ms = self.open_ms, "circuit opened");
                    *s = BreakerState::Open { until_ms };
                } else {
                    *s = BreakerState::Closed { failures };
                }
            }
            BreakerState::HalfOpen { .. } if probe => {
                tracing::warn!(breaker = self.name, open_ms = self.open_ms, "probe failed: circuit reopened");
                *s = BreakerState::Open { until_ms };
            }
            // A late failure of an attempt started before the circuit opened: the probe decides.
            BreakerState::HalfOpen { .. } | BreakerState::Open { .. } => {}
        }
    }

    /// "closed", "open" or "half_open" (for metrics).
    pub fn state(&self) -> &'static str {
        match *self.lock() {
            BreakerState::Closed { .. } => "closed",
            BreakerState::Open { until_ms } if self.clock.monotonic_millis() < until_ms => "open",
            BreakerState::Open { .. } | BreakerState::HalfOpen { .. } => "half_open",
        }
    }
}

impl Permit<'_> {
    /// Report the attempt: `ok` when the other side answered (even with a refusal).
    pub fn record(mut self, ok: bool) {
        self.recorded = true;
        self.breaker.record(self.probe, ok);
    }
}

impl Drop for Permit<'_> {
    fn drop(&mut self) {
        if self.probe && !self.recorded {
            let mut s = self.breaker.lock();
            if *s == (BreakerState::HalfOpen { probing: true }) {
                *s = BreakerState::HalfOpen { probing: false };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    fn breaker(clock: &ManualClock) -> Breaker {
        Breaker::new("test", 2, Duration::from_secs(30), Arc::new(clock.clone()))
    }

    #[test]
    fn opens_after_consecutive_failures_and_probes_once() {
        let clock = ManualClock::new(1_000);
        let b = breaker(&clock);
        b.acquire().unwrap().record(false);
        assert_eq!(b.state(), "closed");
        b.acquire().unwrap().record(true);
        b.acquire().unwrap().record(false);
        assert_eq!(b.state(), "closed", "a success resets the count");
        b.acquire().unwrap().record(false);
        assert_eq!(b.state(), "open");
        assert!(b.acquire().is_none());
        clock.advance(30);
        assert_eq!(b.state(), "half_open");
        let probe = b.acquire().unwrap();
        assert!(b.acquire().is_none(), "one probe at a time");
        probe.record(false);
        assert_eq!(b.state(), "open");
        clock.advance(30);
        b.acquire().unwrap().record(true);
        assert_eq!(b.state(), "closed");
    }

    #[test]
    fn a_cancelled_probe_frees_the_slot() {
        let clock = ManualClock::new(1_000);
        let b = breaker(&clock);
        b.acquire().unwrap().record(false);
        b.acquire().unwrap().record(false);
        clock.advance(30);
        drop(b.acquire().unwrap());
        assert!(b.acquire().is_some());
    }

    /// Only the probe's own slot is freed by a drop: an attempt started before the circuit opened
    /// and cancelled while the probe is out lets no second probe through.
    #[test]
    fn a_cancelled_plain_attempt_frees_no_probe_slot() {
        let clock = ManualClock::new(1_000);
        let b = breaker(&clock);
        let late = b.acquire().unwrap();
        b.acquire().unwrap().record(false);
        b.acquire().unwrap().record(false);
        clock.advance(30);
        let probe = b.acquire().unwrap();
        drop(late);
        assert!(b.acquire().is_none(), "one probe at a time, whatever else is dropped");
        probe.record(true);
        assert_eq!(b.state(), "closed");
    }

    #[test]
    fn backoff_is_jittered_within_its_exponential_cap() {
        let (base, max) = (Duration::from_millis(100), Duration::from_millis(1_000));
        for retry in 1..=6 {
            let cap = Duration::from_millis((100u64 << (retry - 1)).min(1_000));
            let waits: Vec<_> = (0..200).map(|_| backoff_with_jitter(retry, base, max)).collect();
            assert!(waits.iter().all(|w| *w <= cap), "retry {retry}: {waits:?}");
            // Jitter: 200 draws from a range of at least 100 ms are not all the same.
            assert!(waits.iter().any(|w| *w != waits[0]), "retry {retry}");
        }
    }
}
