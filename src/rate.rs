//! Rate limits (governor): per agent across all tools and per agent per tool, with quotas from the
//! agent's policy profile; per operator on the approval routes. Time comes from the injected
//! [`Clock`], so tests move it instead of sleeping. Idle keys are evicted periodically.

use std::collections::HashMap;
use std::num::NonZeroU32;
use std::sync::Arc;
use std::time::Duration;

use governor::middleware::NoOpMiddleware;
use governor::nanos::Nanos;
use governor::state::keyed::DashMapStateStore;
use governor::{Quota, RateLimiter};

use crate::clock::Clock;
use crate::domain::policy::Profile;

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

/// Agent-side limits: all tools together, and per tool where the profile names a quota.
pub struct AgentLimits {
    calls: KeyedLimits,
    tools: KeyedLimits,
}

impl AgentLimits {
    pub fn new(clock: Arc<dyn Clock>) -> Self {
        AgentLimits { calls: KeyedLimits::new(clock.clone()), tools: KeyedLimits::new(clock) }
    }

    /// `Err(wait)` if this call is over either quota.
    pub fn check(&self, principal_key: &str, profile: &Profile, tool: &str) -> Result<(), Duration> {
        self.calls.check(&format!("{}\u{0}{principal_key}", profile.name), profile.calls_per_minute)?;
        if let Some(per_min) = profile.tool_calls_per_minute.get(tool) {
            self.tools.check(&format!("{}\u{0}{tool}\u{0}{principal_key}", profile.name), *per_min)?;
        }
        Ok(())
    }

    pub fn evict_idle(&self) {
        self.calls.evict_idle();
        self.tools.evict_idle();
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
