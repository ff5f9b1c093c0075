//! The identity provider's JWKS, fetched with reqwest and cached. An unknown `kid` (key rotation)
//! triggers a refetch, but at most one per `refetch_min_interval`, so a flood of tokens with random
//! kids cannot turn paygate into a load generator against the IdP.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::{Mutex, RwLock};

struct CachedKey {
    key: DecodingKey,
    /// The JWK's `alg`, when it names one: tokens must then use exactly it.
    alg: Option<String>,
    /// The JWK as published (canonical JSON): a key replaced under the same `kid` differs here.
    material: String,
}

#[derive(Default)]
struct State {
    keys: HashMap<String, CachedKey>,
    /// When the key set in use was fetched, and when a fetch was last tried: readings of the
    /// injected clock's monotonic milliseconds (tests move it instead of sleeping).
    fetched_at: Option<u64>,
    last_attempt: Option<u64>,
}

pub struct JwksCache {
    clock: Arc<dyn Clock>,
    /// Bumped whenever the set of key ids changes (rotation): verified-token cache entries from an
    /// older generation are verified again.
    generation: std::sync::atomic::AtomicU64,
    url: String,
    http: reqwest::Client,
    cache_ttl: Duration,
    refetch_min_interval: Duration,
    /// How long past `cache_ttl` the last key set still verifies tokens while the identity provider
    /// cannot be reached (stale-while-error); after that, nothing does until a fetch succeeds.
    stale_max: Duration,
    state: RwLock<State>,
    fetch_lock: Mutex<()>,
}

impl JwksCache {
    pub fn new(
        url: String,
        http: reqwest::Client,
        cache_ttl: Duration,
        refetch_min_interval: Duration,
        clock: Arc<dyn Clock>,
    ) -> Self {
        JwksCache {
            clock,
            generation: std::sync::atomic::AtomicU64::new(0),
            url,
            http,
            cache_ttl,
            refetch_min_interval,
            stale_max: Duration::ZERO,
            state: RwLock::default(),
            fetch_lock: Mutex::new(()),
        }
    }

    /// Keep verifying with the last key set for this long past its refresh interval while fetches
    /// fail (bounded stale-while-error).
    pub fn with_stale_max(mut self, stale_max: Duration) -> Self {
        self.stale_max = stale_max;
        self
    }

    /// Make sure the key set is no older than its refresh interval before a token verified against it
    /// (even one served from the verified-token cache) is accepted: a stale set is fetched again, one
    /// fetch at a time (callers arriving meanwhile wait for it). `false` when no key set may be used:
    /// the fetch failed and the last good set is past `stale_max`, or there never was one.
    pub async fn ensure_fresh(&self) -> bool {
        if self.age().await.is_some_and(|a| a < self.cache_ttl) {
            return true;
        }
        let _guard = self.fetch_lock.lock().await;
        let recently_tried = {
            let s = self.state.read().await;
            let fresh = s.fetched_at.is_some_and(|t| self.since(t) < self.cache_ttl);
            if fresh {
                return true;
            }
            s.last_attempt.is_some_and(|t| self.since(t) < self.refetch_min_interval)
        };
        if !recently_tried {
            self.refresh().await;
        }
        self.age().await.is_some_and(|a| a < self.cache_ttl + self.stale_max)
    }

    /// How long ago a reading of the monotonic clock was.
    fn since(&self, at: u64) -> Duration {
        Duration::from_millis(self.clock.monotonic_millis().saturating_sub(at))
    }

    /// How long ago the key set in use was fetched (`None`: never).
    async fn age(&self) -> Option<Duration> {
        self.state.read().await.fetched_at.map(|t| self.since(t))
    }

    pub fn generation(&self) -> u64 {
        self.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The key for `kid`, usable with `alg`, refetching the set when the kid is unknown or the
    /// cache is stale (rate-bounded).
    pub async fn key(&self, kid: &str, alg: Algorithm) -> Option<DecodingKey> {
        if let Some(found) = self.cached(kid, alg, true).await {
            return found;
        }
        let _guard = self.fetch_lock.lock().await;
        // Another task may have refreshed while we waited for the lock.
        if let Some(found) = self.cached(kid, alg, true).await {
            return found;
        }
        let may_fetch = {
            let s = self.state.read().await;
            s.last_attempt.is_none_or(|t| self.since(t) >= self.refetch_min_interval)
        };
        if may_fetch {
            self.refresh().await;
        }
        self.cached(kid, alg, false).await.flatten()
    }

    /// `Some(answer)` when the cache can answer (fresh, or `require_fresh` is false); `None` to fetch.
    async fn cached(&self, kid: &str, alg: Algorithm, require_fresh: bool) -> Option<Option<DecodingKey>> {
        let s = self.state.read().await;
        let fresh = s.fetched_at.is_some_and(|t| self.since(t) < self.cache_ttl);
        // Past the stale-while-error bound, the last key set verifies nothing.
        let usable = s.fetched_at.is_some_and(|t| self.since(t) < self.cache_ttl + self.stale_max);
        if !require_fresh && !usable {
            return Some(None);
        }
        match s.keys.get(kid) {
            Some(k) if fresh || !require_fresh => {
                let alg_ok = k.alg.as_deref().is_none_or(|a| a == format!("{alg:?}")) && k.key.family() == alg.family();
                Some(alg_ok.then(|| k.key.clone()))
            }
            _ if !require_fresh => Some(None),
            _ => None,
        }
    }

    async fn refresh(&self) {
        let started = self.clock.monotonic_millis();
        let result = async {
            let resp = self.http.get(&self.url).send().await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("status {}", resp.status()));
            }
            resp.json::<JwkSet>().await.map_err(|e| e.to_string())
        }
        .await;
        let mut s = self.state.write().await;
        s.last_attempt = Some(started);
        match result {
            Ok(set) => {
                let keys = usable_keys(&set);
                tracing::info!(jwks.url = %self.url, jwks.keys = keys.len(), "fetched JWKS");
                // Any change of the key set, a key replaced under the same kid included, starts a new
                // generation: tokens verified against the old keys are verified again.
                let fingerprint = |m: &HashMap<String, CachedKey>| {
                    let mut v: Vec<(&String, &String)> = m.iter().map(|(k, c)| (k, &c.material)).collect();
                    v.sort();
                    v.into_iter().map(|(k, m)| format!("{k}={m}")).collect::<Vec<_>>()
                };
                if fingerprint(&s.keys) != fingerprint(&keys) {
                    self.generation.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                }
                s.keys = keys;
                s.fetched_at = Some(started);
            }
            Err(error) => {
                // Keep serving the keys we have: an IdP outage must not log everybody out at once.
                tracing::warn!(jwks.url = %self.url, %error, "JWKS fetch failed");
            }
        }
    }
}

/// The keys of a JWKS that can verify tokens, by key id: asymmetric keys with a `kid` that parse.
/// Symmetric keys never come from a JWKS; keys without a `kid` cannot be selected by a token.
fn usable_keys(set: &JwkSet) -> HashMap<String, CachedKey> {
    let mut keys = HashMap::new();
    for jwk in &set.keys {
        if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
            continue;
        }
        let (Some(kid), Ok(key)) = (jwk.common.key_id.clone(), DecodingKey::from_jwk(jwk)) else {
            continue;
        };
        let alg = jwk.common.key_algorithm.map(|a| format!("{a:?}"));
        let material = serde_json::to_string(jwk).unwrap_or_default();
        keys.insert(kid, CachedKey { key, alg, material });
    }
    keys
}

/// The key ids of `set` this gateway would accept tokens from (what `paygate doctor` reports).
pub fn usable_key_ids(set: &JwkSet) -> Vec<String> {
    let mut ids: Vec<String> = usable_keys(set).into_keys().collect();
    ids.sort();
    ids
}
