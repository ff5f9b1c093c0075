//! Bearer JWT verification: signature against an allow-listed algorithm, issuer, audience (this
//! resource), exp/nbf with bounded leeway. Keys: the dev HS256 key; PEM public keys and a JWKS for
//! the identity provider.

use std::collections::{BTreeSet, HashSet};
use std::sync::Arc;

use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation, decode, decode_header, encode};
use serde::{Deserialize, Serialize};

use super::Secret;
use super::jwks::JwksCache;
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
}

/// What a verified token says.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VerifiedClaims {
    pub issuer: String,
    pub subject: String,
    pub client_id: Option<String>,
    pub scopes: BTreeSet<String>,
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
    resource: String,
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
    exp: i64,
    nbf: Option<i64>,
    generation: u64,
}

impl Verifier {
    pub fn new(resource: String, leeway_secs: i64, clock: Arc<dyn Clock>) -> Self {
        Verifier {
            resource: normalize_url(&resource),
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

    pub async fn verify(&self, token: &str) -> Result<VerifiedClaims, AuthError> {
        if self.cache.max == 0 {
            return self.verify_uncached(token).await.map(|(c, _, _)| c);
        }
        let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
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
                return Ok(hit.claims.clone());
            }
        }
        let (claims, exp, nbf) = self.verify_uncached(token).await?;
        let mut entries = self.cache.entries.lock().unwrap_or_else(|p| p.into_inner());
        if entries.len() >= self.cache.max {
            entries.clear();
        }
        entries.insert(digest, CachedToken { claims: claims.clone(), exp, nbf, generation });
        Ok(claims)
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

    /// The canonical resource URL tokens must name as audience.
    pub fn resource(&self) -> &str {
        &self.resource
    }

    /// The full check: signature, issuer, time, audience. Returns the claims with exp and nbf.
    async fn verify_uncached(&self, token: &str) -> Result<(VerifiedClaims, i64, Option<i64>), AuthError> {
        let header = decode_header(token).map_err(|_| AuthError::Invalid("malformed token"))?;
        let (key, expected_issuer) = self.key_for(&header).await?;
        let mut validation = Validation::new(header.alg);
        // exp/nbf/aud are checked below against the injected clock and the canonical resource.
        validation.validate_exp = false;
        validation.validate_nbf = false;
        validation.validate_aud = false;
        validation.required_spec_claims = HashSet::new();
        let data = decode::<RawClaims>(token, &key, &validation).map_err(|e| match e.kind() {
            jsonwebtoken::errors::ErrorKind::InvalidSignature => AuthError::Invalid("bad signature"),
            jsonwebtoken::errors::ErrorKind::InvalidAlgorithm => {
                AuthError::Invalid("algorithm not allowed for this key")
            }
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
        let audiences = c.aud.map(OneOrMany::into_vec).unwrap_or_default();
        if !audiences.iter().any(|a| normalize_url(a) == self.resource) {
            return Err(AuthError::Invalid("token audience is not this resource"));
        }
        let subject = c.sub.filter(|s| !s.is_empty()).ok_or(AuthError::Invalid("token has no sub"))?;
        let mut scopes: BTreeSet<String> = c.scope.unwrap_or_default().split_whitespace().map(str::to_string).collect();
        if let Some(scp) = c.scp {
            scopes.extend(scp.into_vec().iter().flat_map(|s| s.split_whitespace().map(str::to_string)));
        }
        Ok((VerifiedClaims { issuer: expected_issuer, subject, client_id: c.client_id.or(c.azp), scopes }, exp, c.nbf))
    }

    async fn key_for(&self, header: &Header) -> Result<(DecodingKey, String), AuthError> {
        if header.alg == Algorithm::HS256 {
            let dev = self.dev.as_ref().ok_or(AuthError::Invalid("algorithm not allowed"))?;
            return Ok((dev.key.clone(), dev.issuer.clone()));
        }
        if !IDP_ALGORITHMS.contains(&header.alg) {
            return Err(AuthError::Invalid("algorithm not allowed"));
        }
        let idp = self.idp.as_ref().ok_or(AuthError::Invalid("algorithm not allowed"))?;
        let family = header.alg.family();
        if let (Some(kid), Some(jwks)) = (header.kid.as_deref(), idp.jwks.as_ref())
            && let Some(key) = jwks.key(kid, header.alg).await
        {
            return Ok((key, idp.issuer.clone()));
        }
        // PEM keys carry no kid: the one whose family matches the algorithm.
        idp.pem_keys
            .iter()
            .find(|k| k.family() == family)
            .map(|k| (k.clone(), idp.issuer.clone()))
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
    let key = EncodingKey::from_secret(secret.expose().as_bytes()).map_err(|e| e.to_string())?;
    let claims = DevClaims { iss: issuer, sub: subject, aud: audience, iat: now, nbf: now, exp: now + ttl_secs, scope };
    encode(&Header::new(Algorithm::HS256), &claims, &key).map_err(|e| e.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[tokio::test]
    async fn cached_tokens_still_expire_and_are_keyed_by_hash() {
        let clock = ManualClock::new(1_000_000);
        let secret = Secret::new("k".repeat(32));
        let v = Verifier::new("http://gw/mcp".into(), 30, Arc::new(clock.clone()))
            .with_dev_key("iss".into(), &secret)
            .unwrap()
            .with_cache(2);
        let token = mint_dev_token(&secret, "iss", "http://gw/mcp", "agent", "payments:read", 1_000_000, 60).unwrap();
        assert_eq!(v.verify(&token).await.unwrap().subject, "agent");
        assert_eq!(v.verify(&token).await.unwrap().subject, "agent", "a cache hit");
        {
            let entries = v.cache.entries.lock().unwrap();
            assert_eq!(entries.len(), 1);
            let digest: [u8; 32] = sha2::Sha256::digest(token.as_bytes()).into();
            assert!(entries.contains_key(&digest), "keyed by the token's hash");
        }
        clock.advance(60 + 31);
        assert_eq!(v.verify(&token).await, Err(AuthError::Invalid("token expired")), "expiry holds on a hit");
        // Bounded: a third token clears the full cache rather than growing it.
        for sub in ["b", "c", "d"] {
            let t = mint_dev_token(&secret, "iss", "http://gw/mcp", sub, "", clock.now(), 60).unwrap();
            v.verify(&t).await.unwrap();
        }
        assert!(v.cache.entries.lock().unwrap().len() <= 2);
        // A forged token is never served from the cache of a genuine one.
        let mut forged = token.clone();
        forged.push('x');
        assert!(v.verify(&forged).await.is_err());
    }

    #[test]
    fn normalizes_scheme_and_host_only() {
        assert_eq!(normalize_url("HTTPS://Example.COM:8443/MCP"), "https://example.com:8443/MCP");
        assert_ne!(normalize_url("https://example.com/mcp/"), normalize_url("https://example.com/mcp"));
    }
}
