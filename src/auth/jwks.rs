//! The identity provider's JWKS, fetched with reqwest and cached. An unknown `kid` (key rotation)
//! triggers a refetch, but at most one per `refetch_min_interval`, so a flood of tokens with random
//! kids cannot turn paygate into a load generator against the IdP.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use crate::clock::Clock;
use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet, KeyOperations, PublicKeyUse};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::{Mutex, RwLock};

struct CachedKey {
    key: DecodingKey,
    /// The JWK's `alg`, when it names one: tokens must then use exactly it.
    alg: Option<String>,
    /// The JWK as published (canonical JSON): a key replaced under the same `kid` differs here.
    material: String,
}

impl CachedKey {
    /// Whether this key may verify a token signed with `alg`.
    fn fits(&self, alg: Algorithm) -> bool {
        self.alg.as_deref().is_none_or(|a| a == format!("{alg:?}")) && self.key.family() == alg.family()
    }
}

/// Largest JWKS answer read (bytes): an identity provider's key set is a few kilobytes; a bigger
/// answer is refused (the last good set stays) rather than held in memory.
pub const JWKS_BYTES_MAX: usize = 512 * 1024;

/// The key set is fetched again in the background once it is this share of its refresh interval
/// old (refresh-ahead), so a token never waits on the identity provider while a usable set exists.
const REFRESH_AHEAD_PERCENT: u32 = 80;

#[derive(Default)]
struct State {
    /// Keys by `kid`: more than one under a `kid` is resolved by the token's algorithm, never by order.
    keys: HashMap<String, Vec<CachedKey>>,
    /// When the key set in use was fetched, and when a fetch was last tried: readings of the
    /// injected clock's monotonic milliseconds (tests move it instead of sleeping).
    fetched_at: Option<u64>,
    last_attempt: Option<u64>,
}

struct Inner {
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
    /// A background refresh is running (at most one).
    refreshing: std::sync::atomic::AtomicBool,
}

/// The identity provider's key set. A set that is usable (younger than `cache_ttl + stale_max`)
/// always answers at once; once it is `REFRESH_AHEAD_PERCENT` of `cache_ttl` old it is fetched
/// again in the background (stale-while-revalidate). Only with no usable set, or for a `kid` it
/// does not hold, does a caller wait for a fetch (one at a time, rate-bounded).
#[derive(Clone)]
pub struct JwksCache {
    inner: Arc<Inner>,
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
            inner: Arc::new(Inner {
                clock,
                generation: std::sync::atomic::AtomicU64::new(0),
                url,
                http,
                cache_ttl,
                refetch_min_interval,
                stale_max: Duration::ZERO,
                state: RwLock::default(),
                fetch_lock: Mutex::new(()),
                refreshing: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// Keep verifying with the last key set for this long past its refresh interval while fetches
    /// fail (bounded stale-while-error).
    pub fn with_stale_max(self, stale_max: Duration) -> Self {
        let mut inner = Arc::try_unwrap(self.inner).unwrap_or_else(|_| unreachable!("set before the cache is shared"));
        inner.stale_max = stale_max;
        JwksCache { inner: Arc::new(inner) }
    }

    /// Whether a key set may be used before a token verified against it (even one served from
    /// the verified-token cache) is accepted. A usable set answers at once (refreshed in the
    /// background once it is due); with none, one fetch at a time is waited for. `false` when no
    /// key set may be used: the fetch failed and the last good set is past `stale_max`, or there
    /// never was one.
    pub async fn ensure_fresh(&self) -> bool {
        let i = &self.inner;
        if i.usable(i.age().await) {
            self.refresh_ahead().await;
            return true;
        }
        let _guard = i.fetch_lock.lock().await;
        let recently_tried = {
            let s = i.state.read().await;
            if i.usable(s.fetched_at.map(|t| i.since(t))) {
                return true;
            }
            s.last_attempt.is_some_and(|t| i.since(t) < i.refetch_min_interval)
        };
        if !recently_tried {
            i.refresh().await;
        }
        i.usable(i.age().await)
    }

    pub fn generation(&self) -> u64 {
        self.inner.generation.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// The key for `kid`, usable with `alg`. A usable set that holds the `kid` answers at once
    /// (refreshed in the background when due); an unknown `kid` (key rotation) or no usable set
    /// waits for a fetch, at most one per `refetch_min_interval`.
    pub async fn key(&self, kid: &str, alg: Algorithm) -> Option<DecodingKey> {
        let i = &self.inner;
        if let Some(found) = i.cached(kid, alg).await {
            self.refresh_ahead().await;
            return found;
        }
        let _guard = i.fetch_lock.lock().await;
        // Another task may have refreshed while we waited for the lock.
        if let Some(found) = i.cached(kid, alg).await {
            return found;
        }
        let may_fetch = {
            let s = i.state.read().await;
            s.last_attempt.is_none_or(|t| i.since(t) >= i.refetch_min_interval)
        };
        if may_fetch {
            i.refresh().await;
        }
        i.cached(kid, alg).await.flatten()
    }

    /// Start a background fetch when the set is due (`REFRESH_AHEAD_PERCENT` of `cache_ttl` old),
    /// none is running, and none was tried within `refetch_min_interval`.
    async fn refresh_ahead(&self) {
        let i = &self.inner;
        let due = {
            let s = i.state.read().await;
            let ahead = i.cache_ttl * REFRESH_AHEAD_PERCENT / 100;
            s.fetched_at.is_none_or(|t| i.since(t) >= ahead)
                && s.last_attempt.is_none_or(|t| i.since(t) >= i.refetch_min_interval)
        };
        if !due || i.refreshing.swap(true, std::sync::atomic::Ordering::SeqCst) {
            return;
        }
        let inner = i.clone();
        tokio::spawn(async move {
            {
                let _guard = inner.fetch_lock.lock().await;
                let tried = inner.state.read().await.last_attempt;
                if tried.is_none_or(|t| inner.since(t) >= inner.refetch_min_interval) {
                    inner.refresh().await;
                }
            }
            inner.refreshing.store(false, std::sync::atomic::Ordering::SeqCst);
        });
    }
}

impl Inner {
    /// How long ago a reading of the monotonic clock was.
    fn since(&self, at: u64) -> Duration {
        Duration::from_millis(self.clock.monotonic_millis().saturating_sub(at))
    }

    /// How long ago the key set in use was fetched (`None`: never).
    async fn age(&self) -> Option<Duration> {
        self.state.read().await.fetched_at.map(|t| self.since(t))
    }

    /// A set of this age may verify tokens (past the stale-while-error bound, none does).
    fn usable(&self, age: Option<Duration>) -> bool {
        age.is_some_and(|a| a < self.cache_ttl + self.stale_max)
    }

    /// `Some(answer)` when the usable set can answer for `kid`; `None` to fetch (no usable set, or
    /// the kid is unknown). More than one key under the kid fitting `alg`: ambiguous, none.
    async fn cached(&self, kid: &str, alg: Algorithm) -> Option<Option<DecodingKey>> {
        let s = self.state.read().await;
        if !self.usable(s.fetched_at.map(|t| self.since(t))) {
            return None;
        }
        let under = s.keys.get(kid)?;
        let mut fitting = under.iter().filter(|k| k.fits(alg));
        Some(match (fitting.next(), fitting.next()) {
            (Some(k), None) => Some(k.key.clone()),
            _ => None,
        })
    }

    async fn refresh(&self) {
        let started = self.clock.monotonic_millis();
        let result = async {
            let mut resp = self.http.get(&self.url).send().await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("status {}", resp.status()));
            }
            if resp.content_length().is_some_and(|n| n > JWKS_BYTES_MAX as u64) {
                return Err(format!("the answer is larger than {JWKS_BYTES_MAX} bytes"));
            }
            let mut body = Vec::new();
            while let Some(chunk) = resp.chunk().await.map_err(|e| e.to_string())? {
                if body.len() + chunk.len() > JWKS_BYTES_MAX {
                    return Err(format!("the answer is larger than {JWKS_BYTES_MAX} bytes"));
                }
                body.extend_from_slice(&chunk);
            }
            serde_json::from_slice::<JwkSet>(&body).map_err(|e| e.to_string())
        }
        .await;
        let mut s = self.state.write().await;
        s.last_attempt = Some(started);
        match result {
            Ok(set) => {
                let keys = usable_keys(&set);
                tracing::info!(jwks.url = %self.url, jwks.keys = keys.values().map(Vec::len).sum::<usize>(), "fetched JWKS");
                // Any change of the key set, a key replaced under the same kid included, starts a new
                // generation: tokens verified against the old keys are verified again.
                let fingerprint = |m: &HashMap<String, Vec<CachedKey>>| {
                    let mut v: Vec<String> =
                        m.iter().flat_map(|(k, cs)| cs.iter().map(move |c| format!("{k}={}", c.material))).collect();
                    v.sort();
                    v
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

/// The keys of a JWKS that can verify tokens, by key id: asymmetric keys with a `kid` that parse,
/// published for signatures (`use` absent or "sig"; `key_ops`, when given, including "verify").
/// Symmetric keys never come from a JWKS; keys without a `kid` cannot be selected by a token.
fn usable_keys(set: &JwkSet) -> HashMap<String, Vec<CachedKey>> {
    let mut keys: HashMap<String, Vec<CachedKey>> = HashMap::new();
    for jwk in &set.keys {
        if matches!(jwk.algorithm, AlgorithmParameters::OctetKey(_)) {
            continue;
        }
        let for_signatures = jwk.common.public_key_use.as_ref().is_none_or(|u| *u == PublicKeyUse::Signature)
            && jwk.common.key_operations.as_ref().is_none_or(|ops| ops.contains(&KeyOperations::Verify));
        if !for_signatures {
            continue;
        }
        let (Some(kid), Ok(key)) = (jwk.common.key_id.clone(), DecodingKey::from_jwk(jwk)) else {
            continue;
        };
        let alg = jwk.common.key_algorithm.map(|a| format!("{a:?}"));
        let material = serde_json::to_string(jwk).unwrap_or_default();
        keys.entry(kid).or_default().push(CachedKey { key, alg, material });
    }
    keys
}

/// The key ids of `set` this gateway would accept tokens from (what `paygate doctor` reports).
pub fn usable_key_ids(set: &JwkSet) -> Vec<String> {
    let mut ids: Vec<String> = usable_keys(set).into_keys().collect();
    ids.sort();
    ids
}
