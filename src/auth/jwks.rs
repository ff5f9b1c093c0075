//! The identity provider's JWKS, fetched with reqwest and cached. An unknown `kid` (key rotation)
//! triggers a refetch, but at most one per `refetch_min_interval`, so a flood of tokens with random
//! kids cannot turn paygate into a load generator against the IdP.

use std::collections::HashMap;
use std::time::Duration;

use jsonwebtoken::jwk::{AlgorithmParameters, JwkSet};
use jsonwebtoken::{Algorithm, DecodingKey};
use tokio::sync::{Mutex, RwLock};
use tokio::time::Instant;

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
    fetched_at: Option<Instant>,
    last_attempt: Option<Instant>,
}

pub struct JwksCache {
    /// Bumped whenever the set of key ids changes (rotation): verified-token cache entries from an
    /// older generation are verified again.
    generation: std::sync::atomic::AtomicU64,
    url: String,
    http: reqwest::Client,
    cache_ttl: Duration,
    refetch_min_interval: Duration,
    state: RwLock<State>,
    fetch_lock: Mutex<()>,
}

impl JwksCache {
    pub fn new(url: String, http: reqwest::Client, cache_ttl: Duration, refetch_min_interval: Duration) -> Self {
        JwksCache {
            generation: std::sync::atomic::AtomicU64::new(0),
            url,
            http,
            cache_ttl,
            refetch_min_interval,
            state: RwLock::default(),
            fetch_lock: Mutex::new(()),
        }
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
            s.last_attempt.is_none_or(|t| t.elapsed() >= self.refetch_min_interval)
        };
        if may_fetch {
            self.refresh().await;
        }
        self.cached(kid, alg, false).await.flatten()
    }

    /// `Some(answer)` when the cache can answer (fresh, or `require_fresh` is false); `None` to fetch.
    async fn cached(&self, kid: &str, alg: Algorithm, require_fresh: bool) -> Option<Option<DecodingKey>> {
        let s = self.state.read().await;
        let fresh = s.fetched_at.is_some_and(|t| t.elapsed() < self.cache_ttl);
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
        let started = Instant::now();
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
