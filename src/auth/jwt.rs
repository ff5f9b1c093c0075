//! Bearer JWT verification: signature against an allow-listed algorithm, issuer, audience (this
//! resource), exp/nbf with bounded leeway. Keys: the dev HS256 key; PEM public keys and a JWKS for
//! the identity provider.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, decode, decode_header, encode};
use serde::{Deserialize, Serialize};

use super::jwks::JwksCache;
use super::{Audience, Secret};
use crate::clock::{Clock, UnixSecs};
use sha2::Digest;

/// Algorithms accepted from an identity provider. HS* never: a public key must not double as an
/// HMAC secret. `none` is not even representable.
const IDP_ALGORITHMS: &[Algorithm] = &[
    Algorithm::RS256,
    Algorithm::RS384,
    Algorithm::RS512,
    Algorithm::PS256,
    Algorithm::PS384,
    Algorithm::PS512,
    Algorithm::ES256,
    Algorithm::ES384,
    Algorithm::EdDSA,
];

/// Why a request is unauthenticated. The reason goes to logs and the `error_description`; it never
/// contains the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("no bearer token")]
    Missing,
    #[error("{0}")]
    Invalid(&'static str),
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

impl OneOrMany {
    fn into_vec(self) -> Vec<String> {
        match self {
            OneOrMany::One(s) => vec![s],
            OneOrMany::Many(v) => v,
        }
    }
}

#[derive(Debug, Deserialize)]
struct RawClaims {
    iss: Option<String>,
    sub: Option<String>,
    aud: Option<OneOrMany>,
    exp: Option<i64>,
    nbf: Option<i64>,
    scope: Option<String>,
    scp: Option<OneOrMany>,
    client_id: Option<String>,
    azp: Option<String>,
    /// RFC 8693 actor: the party acting for `sub`. Any JSON here is read (`null` included), so a
    /// malformed one is refused rather than ignored.
    #[serde(default, deserialize_with = "present")]
    act: Option<serde_json::Value>,
}

/// A claim that is there, whatever its value (`null` is `Some(Null)`, not absent).
fn present<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<serde_json::Value>, D::Error> {
    serde_json::Value::deserialize(d).map(Some)
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedClaims {
    pub issuer: String,
    /// The token's `sub`: with delegation, the user the actor acts for.
    pub subject: String,
    /// RFC 8693 `act.sub`: the current actor (the agent) when the token is delegated.
    pub actor: Option<String>,
    pub client_id: Option<String>,
    pub scopes: BTreeSet<String>,
}

/// A fully verified token (but its audience): claims, normalized audiences, exp, nbf, and whether a
/// JWKS key verified it.
type Verified = (VerifiedClaims, Vec<String>, i64, Option<i64>, bool);

pub use crate::domain::principal::SUBJECT_BYTES_MAX;
use crate::domain::principal::valid_subject as subject_ok;

/// The current actor of an RFC 8693 `act` claim: its `sub` (a nested `act` names earlier actors,
/// which do not act now).
fn actor_of(act: &serde_json::Value) -> Result<String, AuthError> {
    match act.get("sub").and_then(serde_json::Value::as_str) {
        Some(sub) if subject_ok(sub) => Ok(sub.to_string()),
        _ => Err(AuthError::Invalid("act claim has no valid sub")),
    }
}

struct Idp {
    issuer: String,
    pem_keys: Vec<DecodingKey>,
    jwks: Option<JwksCache>,
}

struct DevKey {
    issuer: String,
    key: DecodingKey,
}

pub struct Verifier {
    /// The canonical resource identifiers tokens must name as audience: the MCP resource and the
    /// operator resource.
    agent_resource: String,
    operator_resource: String,
    dev: Option<DevKey>,
    idp: Option<Idp>,
    leeway_secs: i64,
    clock: Arc<dyn Clock>,
    cache: TokenCache,
}

/// Verified tokens, keyed by the SHA-256 of the token (never the token itself), so a repeated
/// token skips the signature check. Entries honour exp/nbf on every hit and die with a JWKS
/// rotation. Bounded: when full, it is cleared (verification then simply runs again).
struct TokenCache {
    max: usize,
    entries: std::sync::Mutex<std::collections::HashMap<[u8; 32], CachedToken>>,
}

struct CachedToken {
    claims: VerifiedClaims,
    /// Verified with a key from the identity provider's JWKS: a hit first makes sure that key set
    /// is fresh, so a key the IdP removed stops verifying within its refresh interval.
    via_jwks: bool,
    /// The token's audiences, normalized: checked against the resource on every hit.
    audiences: Vec<String>,
    exp: i64,
    nbf: Option<i64>,
    generation: u64,
}

impl Verifier {
    pub fn new(agent_resource: String, operator_resource: String, leeway_secs: i64, clock: Arc<dyn Clock>) -> Self {
        Verifier {
            agent_resource: normalize_url(&agent_resource),
            operator_resource: normalize_url(&operator_resource),
            dev: None,
            idp: None,
            leeway_secs,
            clock,
            cache: TokenCache { max: 0, entries: Default::default() },
        }
    }

    /// Remember up to `max` verified tokens (0 disables the cache).
    pub fn with_cache(mut self, max: usize) -> Self {
        self.cache.max = max;
        self
    }

    fn generation(&self) -> u64 {
        self.idp.as_ref().and_then(|i| i.jwks.as_ref()).map_or(0, JwksCache::generation)
    }

    /// Verify `token` for `audience`: signature, issuer, time, and that its `aud` names this
    /// resource and not the other one.
    pub async fn verify(&self, token: &str, audience: Audience) -> Result<VerifiedClaims, AuthError> {
        if self.cache.max == 0 {
            let (claims, audiences, _, _, _) = self.verify_uncached(token).await?;
            self.check_audience(&audiences, audience)?;
            return Ok(claims);
        }
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
        let via_jwks = {
            let entries = self.cache.entries.lock().unwrap_or_else(|p| p.into_inner());
            entries.get(&digest).is_some_and(|hit| hit.via_jwks)
        };
        if via_jwks && let Some(jwks) = self.idp.as_ref().and_then(|i| i.jwks.as_ref()) {
            // A cache hit asks whether the key set is stale like a miss does: a refresh that finds
            // the key gone starts a new generation, and the token is verified again (and refused).
            if !jwks.ensure_fresh().await {
                return Err(AuthError::Invalid("the identity provider's keys cannot be refreshed"));
            }
        }
        let now = self.clock.now();
        let generation = self.generation();
        {
            let entries = self.cache.entries.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(hit) = entries.get(&digest)
                && hit.generation == generation
            {
                if now > hit.exp.saturating_add(self.leeway_secs) {
                    return Err(AuthError::Invalid("token expired"));
                }
                if hit.nbf.is_some_and(|nbf| now < nbf.saturating_sub(self.leeway_secs)) {
                    return Err(AuthError::Invalid("token not yet valid"));
                }
                self.check_audience(&hit.audiences, audience)?;
                return Ok(hit.claims.clone());
            }
        }
        let (claims, audiences, exp, nbf, via_jwks) = self.verify_uncached(token).await?;
        self.check_audience(&audiences, audience)?;
        let mut entries = self.cache.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= self.cache.max {
            entries.clear();
        }
        entries.insert(digest, CachedToken { claims: claims.clone(), via_jwks, audiences, exp, nbf, generation });
        Ok(claims)
    }

    /// RFC 8707: the token must be meant for this resource, and not also for the other one.
    fn check_audience(&self, audiences: &[String], audience: Audience) -> Result<(), AuthError> {
        let (this, other) = match audience {
            Audience::Agent => (&self.agent_resource, &self.operator_resource),
            Audience::Operator => (&self.operator_resource, &self.agent_resource),
        };
        if !audiences.iter().any(|a| a == this) {
            return Err(AuthError::Invalid("token audience is not this resource"));
        }
        if audiences.iter().any(|a| a == other) {
            return Err(AuthError::Invalid("token names both the agent and the operator resource"));
        }
        Ok(())
    }

    pub fn with_dev_key(mut self, issuer: String, secret: &Secret) -> Result<Self, String> {
        let key = DecodingKey::from_secret(secret.expose().as_bytes()).map_err(|e| e.to_string())?;
        self.dev = Some(DevKey { issuer, key });
        Ok(self)
    }

    pub fn with_idp(mut self, issuer: String, pem_keys: Vec<DecodingKey>, jwks: Option<JwksCache>) -> Self {
        self.idp = Some(Idp { issuer, pem_keys, jwks });
        self
    }

    /// The canonical resource identifier tokens for `audience` must name.
    pub fn resource(&self, audience: Audience) -> &str {
        match audience {
            Audience::Agent => &self.agent_resource,
            Audience::Operator => &self.operator_resource,
        }
    }

    /// The full check but the audience: signature, issuer, time, subject and actor. Returns the
    /// claims with the normalized audiences, exp and nbf, and whether a JWKS key verified it.
    async fn verify_uncached(&self, token: &str) -> Result<Verified, AuthError> {
        let header = decode_header(token).map_err(|_| AuthError::Invalid("malformed token"))?;
        let (key, expected_issuer, via_jwks) = self.key_for(&header).await?;
        let mut validation = Validation::new(header.alg);
        // exp/nbf/aud are checked below against the injected clock and the canonical resource.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims = HashSet::new();
        let data = decode::<RawClaims>(token, &key, &validation).map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::InvalidSignature => AuthError::Invalid("bad signature"),
            // (`key_for` only ever returns a key of the header's algorithm family, so the
            // library's InvalidAlgorithm cannot arise; were it to, it is refused here too.)
            _ => AuthError::Invalid("malformed token"),
        })?;
        let c = data.claims;
        if c.iss.as_deref() != Some(expected_issuer.as_str()) {
            return Err(AuthError::Invalid("wrong issuer"));
        }
        let now = self.clock.now();
        let exp = c.exp.ok_or(AuthError::Invalid("token has no exp"))?;
        if now > exp.saturating_add(self.leeway_secs) {
            return Err(AuthError::Invalid("token expired"));
        }
        if let Some(nbf) = c.nbf
            && now < nbf.saturating_sub(self.leeway_secs)
        {
            return Err(AuthError::Invalid("token not yet valid"));
        }
        let audiences: Vec<String> =
            c.aud.map(OneOrMany::into_vec).unwrap_or_default().iter().map(|a| normalize_url(a)).collect();
        let subject = c.sub.filter(|s| !s.is_empty()).ok_or(AuthError::Invalid("token has no sub"))?;
        if !subject_ok(&subject) {
            return Err(AuthError::Invalid("token sub is too long or has control characters"));
        }
        let actor = c.act.as_ref().map(actor_of).transpose()?;
        let mut scopes: BTreeSet<String> = c.scope.unwrap_or_default().split_whitespace().map(str::to_string).collect();
        if let Some(scp) = c.scp {
            scopes.extend(scp.into_vec().iter().flat_map(|s| s.split_whitespace().map(str::to_string)));
        }
        let claims =
            VerifiedClaims { issuer: expected_issuer, subject, actor, client_id: c.client_id.or(c.azp), scopes };
        Ok((claims, audiences, exp, c.nbf, via_jwks))
    }

    async fn key_for(&self, header: &Header) -> Result<(DecodingKey, String, bool), AuthError> {
        if header.alg == Algorithm::HS256 {
            let dev = self.dev.as_ref().ok_or(AuthError::Invalid("algorithm not allowed"))?;
            return Ok((dev.key.clone(), dev.issuer.clone(), false));
        }
        if !IDP_ALGORITHMS.contains(&header.alg) {
            return Err(AuthError::Invalid("algorithm not allowed"));
        }
        let idp = self.idp.as_ref().ok_or(AuthError::Invalid("algorithm not allowed"))?;
        let family = header.alg.family();
        if let (Some(kid), Some(jwks)) = (header.kid.as_deref(), idp.jwks.as_ref())
            && let Some(key) = jwks.key(kid, header.alg).await
        {
            return Ok((key, idp.issuer.clone(), true));
        }
        // PEM keys carry no kid: the one whose family matches the algorithm.
        idp.pem_keys
            .iter()
            .find(|k| k.family() == family)
            .map(|k| (k.clone(), idp.issuer.clone(), false))
            .ok_or(AuthError::Invalid("no key for this token"))
    }
}

/// Lower-case scheme and host; the path stays as it is (RFC 3986 6.2.2.1).
pub fn normalize_url(url: &str) -> String {
    match url.split_once("://") {
        Some((scheme, rest)) => {
            let (authority, path) = rest.split_at(rest.find('/').unwrap_or(rest.len()));
            format!("{}://{}{}", scheme.to_ascii_lowercase(), authority.to_ascii_lowercase(), path)
        }
        None => url.to_string(),
    }
}

#[derive(Serialize)]
struct DevClaims<'a> {
    iss: &'a str,
    sub: &'a str,
    aud: &'a str,
    iat: UnixSecs,
    nbf: UnixSecs,
    exp: UnixSecs,
    scope: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    act: Option<serde_json::Value>,
}

/// A token to mint with the dev key (local use and tests only).
#[derive(Debug, Clone, Copy)]
pub struct DevToken<'a> {
    pub issuer: &'a str,
    /// The resource it is for (`<public_url>/mcp` or `<public_url>/operator`).
    pub audience: &'a str,
    pub subject: &'a str,
    pub scope: &'a str,
    /// RFC 8693: the agent acting for `subject` (a delegated token), if any.
    pub actor: Option<&'a str>,
    pub now: UnixSecs,
    pub ttl_secs: i64,
}

impl DevToken<'_> {
    pub fn mint(&self, secret: &Secret) -> Result<String, String> {
        let key = EncodingKey::from_secret(secret.expose().as_bytes()).map_err(|e| e.to_string())?;
        let claims = DevClaims {
            iss: self.issuer,
            sub: self.subject,
            aud: self.audience,
            iat: self.now,
            nbf: self.now,
            exp: self.now + self.ttl_secs,
            scope: self.scope,
            act: self.actor.map(|a| serde_json::json!({ "sub": a })),
        };
        encode(&Header::new(Algorithm::HS256), &claims, &key).map_err(|e| e.to_string())
    }
}

/// Mint an HS256 token with the dev key (local use and tests only).
pub fn mint_dev_token(
    secret: &Secret,
    issuer: &str,
    audience: &str,
    subject: &str,
    scope: &str,
    now: UnixSecs,
    ttl_secs: i64,
) -> Result<String, String> {
    DevToken { issuer, audience, subject, scope, actor: None, now, ttl_secs }.mint(secret)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[tokio::test]
    async fn cached_tokens_still_expire_and_are_keyed_by_hash() {
        let clock = ManualClock::new(1_000_000);
        let secret = Secret::new("k".repeat(32));
        let v = Verifier::new("http://gw/mcp".into(), "http://gw/operator".into(), 30, Arc::new(clock.clone()))
            .with_dev_key("iss".into(), &secret)
            .unwrap()
            .with_cache(2);
        let token = mint_dev_token(&secret, "iss", "http://gw/mcp", "agent", "payments:read", 1_000_000, 60).unwrap();
        assert_eq!(v.verify(&token, Audience::Agent).await.unwrap().subject, "agent");
        assert_eq!(v.verify(&token, Audience::Agent).await.unwrap().subject, "agent", "a cache hit");
        {
            let entries = v.cache.entries.lock().unwrap();
            assert_eq!(entries.len(), 1);
            let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
            assert!(entries.contains_key(&digest), "keyed by the token's hash");
        }
        clock.advance(60 + 31);
        assert_eq!(
            v.verify(&token, Audience::Agent).await,
            Err(AuthError::Invalid("token expired")),
            "expiry holds on a hit"
        );
        // Bounded: a third token clears the full cache rather than growing it.
        for sub in ["b", "c", "d"] {
            let t = mint_dev_token(&secret, "iss", "http://gw/mcp", sub, "", clock.now(), 60).unwrap();
            v.verify(&t, Audience::Agent).await.unwrap();
        }
        assert!(v.cache.entries.lock().unwrap().len() <= 2);
        // A forged token is never served from the cache of a genuine one.
        let mut forged = token.clone();
        forged.push('x');
        assert!(v.verify(&forged, Audience::Agent).await.is_err());
    }

    #[tokio::test]
    async fn each_resource_takes_only_its_own_tokens_cached_or_not() {
        let clock = ManualClock::new(1_000_000);
        let secret = Secret::new("k".repeat(32));
        for cache in [0, 10] {
            let v = Verifier::new("http://gw/mcp".into(), "http://gw/operator".into(), 30, Arc::new(clock.clone()))
                .with_dev_key("iss".into(), &secret)
                .unwrap()
                .with_cache(cache);
            let mint = |aud: &str| mint_dev_token(&secret, "iss", aud, "who", "", 1_000_000, 60).unwrap();
            let (agent, operator) = (mint("http://gw/mcp"), mint("HTTP://GW/operator"));
            for _ in 0..2 {
                // Twice: the second round is served from the cache when there is one.
                assert!(v.verify(&agent, Audience::Agent).await.is_ok());
                assert!(v.verify(&operator, Audience::Operator).await.is_ok());
                let wrong = Err(AuthError::Invalid("token audience is not this resource"));
                assert_eq!(v.verify(&agent, Audience::Operator).await, wrong);
                assert_eq!(v.verify(&operator, Audience::Agent).await, wrong);
            }
            let key = EncodingKey::from_secret(secret.expose().as_bytes()).unwrap();
            let both = serde_json::json!({"iss": "iss", "sub": "who", "exp": 1_000_060,
                "aud": ["http://gw/mcp", "http://gw/operator"]});
            let both = encode(&Header::new(Algorithm::HS256), &both, &key).unwrap();
            for audience in [Audience::Agent, Audience::Operator] {
                assert_eq!(
                    v.verify(&both, audience).await,
                    Err(AuthError::Invalid("token names both the agent and the operator resource"))
                );
            }
        }
    }

    #[tokio::test]
    async fn a_delegated_token_names_its_actor_and_bad_subjects_are_refused() {
        let clock = ManualClock::new(1_000_000);
        let secret = Secret::new("k".repeat(32));
        let v = Verifier::new("http://gw/mcp".into(), "http://gw/operator".into(), 30, Arc::new(clock.clone()))
            .with_dev_key("iss".into(), &secret)
            .unwrap();
        let token = DevToken {
            issuer: "iss",
            audience: "http://gw/mcp",
            subject: "alice",
            scope: "payments:read",
            actor: Some("billing-bot"),
            now: 1_000_000,
            ttl_secs: 60,
        }
        .mint(&secret)
        .unwrap();
        let claims = v.verify(&token, Audience::Agent).await.unwrap();
        assert_eq!((claims.subject.as_str(), claims.actor.as_deref()), ("alice", Some("billing-bot")));
        let key = EncodingKey::from_secret(secret.expose().as_bytes()).unwrap();
        let with = |extra: serde_json::Value| {
            let mut c = serde_json::json!({"iss": "iss", "sub": "alice", "exp": 1_000_060, "aud": "http://gw/mcp"});
            for (k, val) in extra.as_object().unwrap() {
                c[k] = val.clone();
            }
            encode(&Header::new(Algorithm::HS256), &c, &key).unwrap()
        };
        // A nested act names an earlier actor: the current one is the outer act's sub.
        let nested = with(serde_json::json!({"act": {"sub": "bot", "act": {"sub": "older"}}}));
        assert_eq!(v.verify(&nested, Audience::Agent).await.unwrap().actor.as_deref(), Some("bot"));
        for bad in [
            serde_json::json!({"act": "bot"}),
            serde_json::json!({"act": {}}),
            serde_json::json!({"act": {"sub": ""}}),
            serde_json::json!({"act": {"sub": "bo\nt"}}),
            serde_json::json!({"sub": "ali\u{1}ce"}),
            serde_json::json!({"sub": "alice\u{a0}"}),
            serde_json::json!({"act": {"sub": " bot"}}),
            serde_json::json!({"sub": "a".repeat(SUBJECT_BYTES_MAX + 1)}),
        ] {
            assert!(v.verify(&with(bad.clone()), Audience::Agent).await.is_err(), "{bad}");
        }
    }

    /// A dev-key verifier with a cache of `max` tokens, tokens valid from 1_000_000 for 60 s.
    fn dev_verifier(clock: &ManualClock, secret: &Secret, max: usize) -> Verifier {
        Verifier::new("http://gw/mcp".into(), "HTTP://GW/operator".into(), 30, Arc::new(clock.clone()))
            .with_dev_key("iss".into(), secret)
            .unwrap()
            .with_cache(max)
    }

    /// exp and nbf hold to the second, with the leeway, whether the token is verified or served
    /// from the cache, and when the clock steps back under a cached token.
    #[tokio::test]
    async fn validity_bounds_hold_to_the_second_cached_or_not() {
        let secret = Secret::new("k".repeat(32));
        let key = EncodingKey::from_secret(secret.expose().as_bytes()).unwrap();
        // Valid from nbf 1_000_100 (accepted from 1_000_070 with 30 s leeway) to exp 1_000_200
        // (accepted until 1_000_230).
        let claims = serde_json::json!({"iss": "iss", "sub": "who", "aud": "http://gw/mcp",
            "nbf": 1_000_100, "exp": 1_000_200});
        let token = encode(&Header::new(Algorithm::HS256), &claims, &key).unwrap();
        for max in [0, 10] {
            let clock = ManualClock::new(1_000_069);
            let v = dev_verifier(&clock, &secret, max);
            let early = Err(AuthError::Invalid("token not yet valid"));
            assert_eq!(v.verify(&token, Audience::Agent).await, early, "cache {max}");
            clock.set(1_000_070);
            assert!(v.verify(&token, Audience::Agent).await.is_ok(), "cache {max}: first second of validity");
            assert!(v.verify(&token, Audience::Agent).await.is_ok(), "cache {max}: again (a hit when cached)");
            clock.set(1_000_069);
            assert_eq!(v.verify(&token, Audience::Agent).await, early, "cache {max}: the clock stepped back");
            clock.set(1_000_230);
            assert!(v.verify(&token, Audience::Agent).await.is_ok(), "cache {max}: last second of validity");
            clock.set(1_000_231);
            assert_eq!(v.verify(&token, Audience::Agent).await, Err(AuthError::Invalid("token expired")));
        }
    }

    /// The cache holds up to its bound (then starts over), and what it serves is what a fresh
    /// verification would answer.
    #[tokio::test]
    async fn the_cache_fills_to_its_bound() {
        let clock = ManualClock::new(1_000_000);
        let secret = Secret::new("k".repeat(32));
        let v = dev_verifier(&clock, &secret, 3);
        for (i, sub) in ["a", "b", "c"].into_iter().enumerate() {
            let t = mint_dev_token(&secret, "iss", "http://gw/mcp", sub, "", 1_000_000, 60).unwrap();
            assert_eq!(v.verify(&t, Audience::Agent).await.unwrap().subject, sub);
            assert_eq!(v.cache.entries.lock().unwrap().len(), i + 1, "every verified token is kept");
        }
        let t = mint_dev_token(&secret, "iss", "http://gw/mcp", "d", "", 1_000_000, 60).unwrap();
        v.verify(&t, Audience::Agent).await.unwrap();
        assert_eq!(v.cache.entries.lock().unwrap().len(), 1, "full: cleared, then the new one kept");
    }

    #[tokio::test]
    async fn a_token_signed_with_another_key_is_a_bad_signature() {
        let clock = ManualClock::new(1_000_000);
        let v = dev_verifier(&clock, &Secret::new("k".repeat(32)), 0);
        let other = mint_dev_token(&Secret::new("o".repeat(32)), "iss", "http://gw/mcp", "who", "", 1_000_000, 60);
        assert_eq!(v.verify(&other.unwrap(), Audience::Agent).await, Err(AuthError::Invalid("bad signature")));
        assert_eq!(v.verify("not.a.token", Audience::Agent).await, Err(AuthError::Invalid("malformed token")));
    }

    #[test]
    fn each_audience_names_its_own_canonical_resource() {
        let v = dev_verifier(&ManualClock::new(0), &Secret::new("k".repeat(32)), 0);
        assert_eq!(v.resource(Audience::Agent), "http://gw/mcp");
        assert_eq!(v.resource(Audience::Operator), "http://gw/operator");
    }

    /// An identity provider's JWKS on port 0 whose key set the test swaps.
    async fn jwks_server(set: Arc<std::sync::Mutex<serde_json::Value>>) -> String {
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let set = set.clone();
                async move { axum::Json(set.lock().unwrap().clone()) }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    /// An Ed25519 key of the identity provider: its JWK and a token it signs for `sub`.
    fn idp_key(seed: u8, kid: &str) -> (serde_json::Value, impl Fn(&str) -> String) {
        use base64::Engine as _;
        let public = ed25519_dalek::SigningKey::from_bytes(&[seed; 32]).verifying_key().to_bytes();
        let jwk = serde_json::json!({"kty": "OKP", "crv": "Ed25519", "alg": "EdDSA", "use": "sig", "kid": kid,
            "x": base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(public)});
        // PKCS#8 v1 wrapping of an Ed25519 seed (RFC 8410).
        let mut der =
            vec![0x30, 0x2e, 0x02, 0x01, 0x00, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x04, 0x22, 0x04, 0x20];
        der.extend_from_slice(&[seed; 32]);
        let (kid, key) = (kid.to_string(), EncodingKey::from_ed_der(&der));
        let sign = move |sub: &str| {
            let mut header = Header::new(Algorithm::EdDSA);
            header.kid = Some(kid.clone());
            let claims = serde_json::json!({"iss": "https://idp", "sub": sub, "aud": "http://gw/mcp",
                "exp": 1_000_600});
            encode(&header, &claims, &key).unwrap()
        };
        (jwk, sign)
    }

    /// A configured public key (PEM, no kid) verifies the tokens of its algorithm's family.
    #[tokio::test]
    async fn a_configured_public_key_verifies_its_own_algorithm_family() {
        let clock = ManualClock::new(1_000_000);
        let (_, sign) = idp_key(3, "unused");
        let public = ed25519_dalek::SigningKey::from_bytes(&[3; 32]).verifying_key().to_bytes();
        let v = Verifier::new("http://gw/mcp".into(), "http://gw/operator".into(), 30, Arc::new(clock.clone()))
            .with_idp("https://idp".into(), vec![DecodingKey::from_ed_der(&public)], None);
        assert_eq!(v.verify(&sign("agent"), Audience::Agent).await.unwrap().subject, "agent");
        let (_, other) = idp_key(4, "unused");
        assert_eq!(v.verify(&other("agent"), Audience::Agent).await, Err(AuthError::Invalid("bad signature")));
        // HS256 is the dev key's alone; without one it is not allowed.
        let hs = mint_dev_token(&Secret::new("k".repeat(32)), "https://idp", "http://gw/mcp", "a", "", 1_000_000, 60);
        assert_eq!(v.verify(&hs.unwrap(), Audience::Agent).await, Err(AuthError::Invalid("algorithm not allowed")));
    }

    /// A token verified with a JWKS key stays cached only while that key set does: once the
    /// provider removes the key (seen at the next refresh), the cached token is verified again and
    /// refused; while the set is unchanged, hits are served.
    #[tokio::test]
    async fn a_cached_token_dies_with_the_identity_providers_key() {
        let clock = ManualClock::new(1_000_000);
        let (old, sign_old) = idp_key(1, "k1");
        let (new, _) = idp_key(2, "k2");
        let set = Arc::new(std::sync::Mutex::new(serde_json::json!({"keys": [old]})));
        let url = jwks_server(set.clone()).await;
        let ttl = std::time::Duration::from_secs(60);
        crate::install_crypto_provider();
        let jwks = JwksCache::new(url, reqwest::Client::new(), ttl, std::time::Duration::ZERO, Arc::new(clock.clone()));
        let v = Verifier::new("http://gw/mcp".into(), "http://gw/operator".into(), 30, Arc::new(clock.clone()))
            .with_idp("https://idp".into(), vec![], Some(jwks))
            .with_cache(10);
        let token = sign_old("agent");
        assert_eq!(v.verify(&token, Audience::Agent).await.unwrap().subject, "agent");
        let first = v.generation();
        assert_eq!(v.verify(&token, Audience::Agent).await.unwrap().subject, "agent", "a hit");
        clock.advance(61);
        assert_eq!(v.verify(&token, Audience::Agent).await.unwrap().subject, "agent", "refreshed, same keys");
        assert_eq!(v.generation(), first, "an unchanged key set keeps its generation");
        *set.lock().unwrap() = serde_json::json!({"keys": [new]});
        clock.advance(61);
        assert!(v.verify(&token, Audience::Agent).await.is_err(), "the provider removed k1");
        assert_ne!(v.generation(), first, "a rotation starts a new generation");
    }

    /// What the test identity provider answers for its JWKS.
    #[derive(Clone)]
    enum Answer {
        Set(serde_json::Value),
        /// Never answers (an IdP that hangs).
        Hang,
        /// This body, as is.
        Raw(String),
    }

    async fn idp_server(answer: Arc<std::sync::Mutex<Answer>>) -> String {
        let app = axum::Router::new().route(
            "/jwks",
            axum::routing::get(move || {
                let answer = answer.lock().unwrap().clone();
                async move {
                    match answer {
                        Answer::Set(v) => v.to_string(),
                        Answer::Hang => std::future::pending().await,
                        Answer::Raw(body) => body,
                    }
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        url
    }

    fn idp_verifier(clock: &ManualClock, url: String, stale_max: u64) -> Verifier {
        crate::install_crypto_provider();
        let http = reqwest::Client::builder().timeout(std::time::Duration::from_secs(30)).build().unwrap();
        let jwks = JwksCache::new(
            url,
            http,
            std::time::Duration::from_secs(60),
            std::time::Duration::ZERO,
            Arc::new(clock.clone()),
        )
        .with_stale_max(std::time::Duration::from_secs(stale_max));
        Verifier::new("http://gw/mcp".into(), "http://gw/operator".into(), 30, Arc::new(clock.clone()))
            .with_idp("https://idp".into(), vec![], Some(jwks))
            .with_cache(10)
    }

    /// Issue 53: once the key set was older than jwks_cache_secs, every request refetched it inline
    /// behind one lock, so an identity provider that hangs stalled every call (3–6 s each), cached
    /// tokens included. A usable set now answers at once and is refreshed in the background.
    #[tokio::test]
    async fn no_token_waits_on_a_hanging_identity_provider_while_a_usable_key_set_exists() {
        let clock = ManualClock::new(1_000_000);
        let (jwk, sign) = idp_key(1, "k1");
        let answer = Arc::new(std::sync::Mutex::new(Answer::Set(serde_json::json!({"keys": [jwk]}))));
        let v = idp_verifier(&clock, idp_server(answer.clone()).await, 3600);
        let cached = sign("agent");
        assert_eq!(v.verify(&cached, Audience::Agent).await.unwrap().subject, "agent");
        *answer.lock().unwrap() = Answer::Hang;
        for step in [50, 11, 400] {
            clock.advance(step);
            for token in [cached.clone(), sign(&format!("fresh-{step}"))] {
                let answered =
                    tokio::time::timeout(std::time::Duration::from_secs(2), v.verify(&token, Audience::Agent))
                        .await
                        .expect("answered without waiting on the identity provider");
                assert!(answered.is_ok(), "{step}: {answered:?}");
            }
        }
    }

    /// Keys published for encryption (`use: "enc"`, or `key_ops` without "verify") never verify a
    /// signature; two keys under one kid that both fit the token's algorithm are ambiguous (never
    /// resolved by order); an answer over JWKS_BYTES_MAX is refused and the last good set stays.
    #[tokio::test]
    async fn only_signature_keys_verify_ambiguous_kids_never_and_a_huge_answer_is_refused() {
        let clock = ManualClock::new(1_000_000);
        let (good, sign_good) = idp_key(1, "good");
        let (mut enc, sign_enc) = idp_key(2, "enc");
        enc["use"] = serde_json::json!("enc");
        let (mut ops, sign_ops) = idp_key(3, "ops");
        ops.as_object_mut().unwrap().remove("use");
        ops["key_ops"] = serde_json::json!(["encrypt"]);
        let (dup_a, sign_dup) = idp_key(4, "dup");
        let (dup_b, _) = idp_key(5, "dup");
        let set = serde_json::json!({"keys": [good, enc, ops, dup_a, dup_b]});
        let answer = Arc::new(std::sync::Mutex::new(Answer::Set(set)));
        let v = idp_verifier(&clock, idp_server(answer.clone()).await, 3600);
        assert!(v.verify(&sign_good("a"), Audience::Agent).await.is_ok());
        for (what, token) in [("use enc", sign_enc("a")), ("key_ops", sign_ops("a")), ("ambiguous kid", sign_dup("a"))]
        {
            assert!(v.verify(&token, Audience::Agent).await.is_err(), "{what}");
        }
        let (newer, sign_newer) = idp_key(6, "newer");
        let padding = "x".repeat(super::super::jwks::JWKS_BYTES_MAX);
        *answer.lock().unwrap() = Answer::Raw(serde_json::json!({"keys": [newer], "padding": padding}).to_string());
        clock.advance(61);
        assert!(v.verify(&sign_newer("a"), Audience::Agent).await.is_err(), "the oversized set was not taken");
        assert!(v.verify(&sign_good("b"), Audience::Agent).await.is_ok(), "the last good set stays");
    }

    #[test]
    fn normalizes_scheme_and_host_only() {
        assert_eq!(normalize_url("HTTPS://Example.COM:8443/MCP"), "https://example.com:8443/MCP");
        assert_ne!(normalize_url("https://example.com/mcp/"), normalize_url("https://example.com/mcp"));
    }
}
