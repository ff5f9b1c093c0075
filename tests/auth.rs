//! Resource-server authentication, black-box: bearer JWT checks and their challenges, scopes, JWKS
//! keys and rotation, session binding, Origin, RFC 9728 metadata, and that no token reaches a log.
//!
//! Every test starts its own paygate on 127.0.0.1:0 and talks HTTP to it: raw reqwest where the
//! HTTP status and `WWW-Authenticate` are the contract, rmcp's client where an MCP client is.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use common::*;
use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use reqwest::StatusCode;
use rmcp::model::CallToolRequestParams;
use serde_json::{Value, json};

const IDP: &str = "https://idp.test";
const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;
const INITIALIZED: &str = r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#;
const TOOLS_LIST: &str = r#"{"jsonrpc":"2.0","id":2,"method":"tools/list"}"#;

// ---------------------------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------------------------

/// reqwest is built with `rustls-no-provider`: a rustls provider must be installed before any
/// reqwest client is built, including the raw clients here. (The server installs it in
/// `app::start`; `paygate_serve_starts_with_a_jwks_url` checks the real binary does.)
fn init() {
    paygate::install_crypto_provider();
}

fn http() -> reqwest::Client {
    init();
    reqwest::Client::builder().redirect(reqwest::redirect::Policy::none()).build().unwrap()
}

fn fixture(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(name)
}

fn fixture_bytes(name: &str) -> Vec<u8> {
    std::fs::read(fixture(name)).unwrap()
}

fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs() as i64
}

fn metadata_url(app: &TestApp) -> String {
    format!("{}/.well-known/oauth-protected-resource/mcp", app.base())
}

/// Claims of a valid token for this app from `iss`; tests break exactly one of them.
fn claims(app: &TestApp, iss: &str, sub: &str, scope: &str) -> Value {
    let t = now();
    json!({"iss": iss, "sub": sub, "aud": app.url, "iat": t, "nbf": t, "exp": t + 3600, "scope": scope})
}

fn dev_claims(app: &TestApp, sub: &str, scope: &str) -> Value {
    claims(app, DEV_ISSUER, sub, scope)
}

fn sign_hs256(secret: &[u8], claims: &Value) -> String {
    jsonwebtoken::encode(&Header::new(Algorithm::HS256), claims, &EncodingKey::from_secret(secret).unwrap()).unwrap()
}

/// Signed with the dev key exactly as paygate uses it: the base64 text's bytes are the HMAC secret.
fn sign_dev(app: &TestApp, claims: &Value) -> String {
    sign_hs256(app.dev_key_text().as_bytes(), claims)
}

fn encoding_key(pem_file: &str, alg: Algorithm) -> EncodingKey {
    let pem = fixture_bytes(pem_file);
    match alg {
        Algorithm::ES256 | Algorithm::ES384 => EncodingKey::from_ec_pem(&pem).unwrap(),
        _ => EncodingKey::from_rsa_pem(&pem).unwrap(),
    }
}

fn sign_with(pem_file: &str, alg: Algorithm, kid: Option<&str>, claims: &Value) -> String {
    let mut header = Header::new(alg);
    header.kid = kid.map(str::to_string);
    jsonwebtoken::encode(&header, claims, &encoding_key(pem_file, alg)).unwrap()
}

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A public JWK for the private key in `pem_file`, named `kid`.
fn jwk(pem_file: &str, alg: Algorithm, kid: &str) -> Jwk {
    let mut jwk = Jwk::from_encoding_key(&encoding_key(pem_file, alg), alg).unwrap();
    jwk.common.key_id = Some(kid.to_string());
    jwk
}

/// A tiny identity-provider JWKS endpoint whose key set the test can swap.
struct JwksServer {
    url: String,
    set: Arc<Mutex<JwkSet>>,
    fetches: Arc<AtomicUsize>,
    /// While set, the endpoint answers 503 (an identity provider outage).
    down: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl JwksServer {
    async fn start(keys: Vec<Jwk>) -> Self {
        let set = Arc::new(Mutex::new(JwkSet { keys }));
        let fetches = Arc::new(AtomicUsize::new(0));
        let down = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (s, f, d) = (set.clone(), fetches.clone(), down.clone());
        let router = axum::Router::new().route(
            "/jwks.json",
            axum::routing::get(move || {
                let (s, f, d) = (s.clone(), f.clone(), d.clone());
                async move {
                    use axum::response::IntoResponse;
                    f.fetch_add(1, Ordering::SeqCst);
                    if d.load(Ordering::SeqCst) {
                        return axum::http::StatusCode::SERVICE_UNAVAILABLE.into_response();
                    }
                    let body = s.lock().unwrap().clone();
                    axum::Json(body).into_response()
                }
            }),
        );
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, router).await.unwrap();
        });
        JwksServer { url, set, fetches, down, task }
    }

    fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    fn replace(&self, keys: Vec<Jwk>) {
        self.set.lock().unwrap().keys = keys;
    }

    fn fetches(&self) -> usize {
        self.fetches.load(Ordering::SeqCst)
    }
}

impl Drop for JwksServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// POST a JSON-RPC body to /mcp with the headers a streamable-HTTP client sends.
fn mcp_post(http: &reqwest::Client, url: &str, body: &str) -> reqwest::RequestBuilder {
    http.post(url)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(body.to_string())
}

struct Reply {
    status: StatusCode,
    headers: reqwest::header::HeaderMap,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<String> {
        self.headers.get(name).map(|v| v.to_str().unwrap().to_string())
    }
}

async fn send(req: reqwest::RequestBuilder) -> Reply {
    let resp = req.send().await.expect("request reaches paygate");
    let status = resp.status();
    let headers = resp.headers().clone();
    let body = resp.text().await.unwrap_or_default();
    Reply { status, headers, body }
}

/// `initialize` with `token` as the bearer token.
async fn initialize_with(http: &reqwest::Client, app: &TestApp, token: &str) -> Reply {
    send(mcp_post(http, &app.url, INITIALIZE).bearer_auth(token)).await
}

/// A challenge `Bearer k="v", k2="v2"` as (scheme, params). Panics on a malformed header or a
/// repeated parameter.
fn parse_challenge(raw: &str) -> (String, BTreeMap<String, String>) {
    let (scheme, mut rest) = raw.split_once(' ').unwrap_or((raw, ""));
    let mut params = BTreeMap::new();
    loop {
        rest = rest.trim_start_matches([' ', ',']);
        if rest.is_empty() {
            break;
        }
        let (key, after) = rest.split_once('=').unwrap_or_else(|| panic!("no '=' in challenge {raw:?}"));
        let after = after.strip_prefix('"').unwrap_or_else(|| panic!("unquoted value in challenge {raw:?}"));
        let end = after.find('"').unwrap_or_else(|| panic!("unterminated value in challenge {raw:?}"));
        let prev = params.insert(key.trim().to_string(), after[..end].to_string());
        assert!(prev.is_none(), "parameter {key} repeated in challenge {raw:?}");
        rest = &after[end + 1..];
    }
    (scheme.to_string(), params)
}

/// 401 with `error="invalid_token"` and the resource metadata URL; the token is nowhere in the reply.
fn assert_invalid_token(app: &TestApp, r: &Reply, case: &str, token: &str) {
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{case}: status (body {})", r.body);
    let raw = r.header("www-authenticate").unwrap_or_else(|| panic!("{case}: 401 without WWW-Authenticate"));
    assert!(raw.starts_with("Bearer "), "{case}: challenge {raw:?}");
    let (scheme, p) = parse_challenge(&raw);
    assert_eq!(scheme, "Bearer", "{case}");
    assert_eq!(p.get("error").map(String::as_str), Some("invalid_token"), "{case}: challenge {raw:?}");
    assert_eq!(p.get("resource_metadata"), Some(&metadata_url(app)), "{case}: challenge {raw:?}");
    if token.len() >= 8 {
        assert!(!raw.contains(token) && !r.body.contains(token), "{case}: the token is echoed back");
    }
}

/// 401 with no `error=` (no credentials were presented), the metadata URL and the scopes to ask for.
fn assert_bare_challenge(app: &TestApp, r: &Reply, case: &str) {
    assert_eq!(r.status, StatusCode::UNAUTHORIZED, "{case}: status (body {})", r.body);
    let raw = r.header("www-authenticate").unwrap_or_else(|| panic!("{case}: 401 without WWW-Authenticate"));
    assert!(raw.starts_with("Bearer "), "{case}: challenge {raw:?}");
    assert!(!raw.contains("error="), "{case}: a request without credentials must not get an error code: {raw:?}");
    let (_, p) = parse_challenge(&raw);
    assert_eq!(p.get("resource_metadata"), Some(&metadata_url(app)), "{case}: challenge {raw:?}");
    let scope = p.get("scope").unwrap_or_else(|| panic!("{case}: no scope in {raw:?}"));
    assert!(scope.split(' ').any(|s| s == "payments:create"), "{case}: scope {scope:?}");
}

/// No token (nor its signature alone) and no secret in anything this test binary has logged.
/// `app_url` proves the capture saw this test's server at all.
fn assert_never_logged(app_url: &str, secrets: &[String]) {
    let logs = logs_text();
    assert!(logs.contains(app_url), "the log capture holds nothing from the server at {app_url}");
    for (i, s) in secrets.iter().enumerate() {
        assert!(!logs.contains(s.as_str()), "secret #{i} appears in the logs");
        if let Some((_, sig)) = s.rsplit_once('.')
            && sig.len() >= 16
        {
            assert!(!logs.contains(sig), "the signature of token #{i} appears in the logs");
        }
    }
}

fn payment_args(op: &str) -> serde_json::Map<String, Value> {
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": "10.00", "currency": "KES"})
        .as_object()
        .unwrap()
        .clone()
}

// ---------------------------------------------------------------------------------------------
// 401: no credentials, and every kind of bad token
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn no_token_gets_a_challenge_without_an_error_code() {
    let http = http();
    let (app, _dir) = spawn_app().await;
    let token = app.dev_token();

    let r = send(mcp_post(&http, &app.url, INITIALIZE)).await;
    assert_bare_challenge(&app, &r, "no Authorization header");

    // A token only in the query string is not a credential: treated exactly as no token.
    let r = send(mcp_post(&http, &format!("{}?access_token={token}", app.url), INITIALIZE)).await;
    assert_bare_challenge(&app, &r, "token only in ?access_token=");

    // The challenge points at a document that describes this resource.
    let doc: Value = http.get(metadata_url(&app)).send().await.unwrap().json().await.unwrap();
    assert_eq!(doc["resource"], json!(app.url));

    // Control: the same request with the token in the header is accepted.
    let r = initialize_with(&http, &app, &token).await;
    assert_eq!(r.status, StatusCode::OK, "valid dev token: {}", r.body);

    let key = app.dev_key_text();
    let url = app.url.clone();
    app.stop().await;
    assert_never_logged(&url, &[token, key]);
}

#[tokio::test]
async fn bad_tokens_get_invalid_token() {
    let http = http();
    let (app, _dir) = spawn_app().await;
    let key = app.dev_key_text();
    let valid = app.dev_token();
    let base = dev_claims(&app, "dev-agent", ALL_AGENT_SCOPES);
    let with = |field: &str, value: Value| {
        let mut c = base.clone();
        c[field] = value;
        c
    };
    let without = |field: &str| {
        let mut c = base.clone();
        c.as_object_mut().unwrap().remove(field);
        c
    };
    let t = now();

    // Controls first: each forged token below differs from these in one respect only.
    let mut accepted = vec![
        ("harness token", valid.clone()),
        ("same claims, same key", sign_dev(&app, &base)),
        ("exp 10s ago, inside the 30s leeway", sign_dev(&app, &with("exp", json!(t - 10)))),
        ("nbf in 10s, inside the 30s leeway", sign_dev(&app, &with("nbf", json!(t + 10)))),
        ("aud as an array", sign_dev(&app, &with("aud", json!(["https://other.example/mcp", app.url])))),
        ("aud with an upper-case scheme", sign_dev(&app, &with("aud", json!(app.url.replacen("http", "HTTP", 1))))),
    ];
    for (case, token) in &accepted {
        let r = initialize_with(&http, &app, token).await;
        assert_eq!(r.status, StatusCode::OK, "{case} must be accepted: {}", r.body);
    }
    let r = send(mcp_post(&http, &app.url, INITIALIZE).header("authorization", format!("bearer {valid}"))).await;
    assert_eq!(r.status, StatusCode::OK, "the auth scheme is case-insensitive (RFC 7235): {}", r.body);

    let header_b64 = |h: &Value| b64(h.to_string().as_bytes());
    let claims_b64 = b64(base.to_string().as_bytes());
    let (valid_head, valid_rest) = valid.split_once('.').unwrap();
    let valid_sig = valid_rest.rsplit_once('.').unwrap().1;

    let mut rejected: Vec<(&str, String)> = vec![
        ("malformed token", "abc".to_string()),
        ("three garbage segments", "abc.def.ghi".to_string()),
        ("signed with another HS256 secret", sign_hs256(b"not-the-dev-key-not-the-dev-key!", &base)),
        (
            // The payload is swapped for one naming another subject; the signature is the original.
            "payload changed after signing",
            format!(
                "{valid_head}.{}.{valid_sig}",
                b64(dev_claims(&app, "other-agent", ALL_AGENT_SCOPES).to_string().as_bytes())
            ),
        ),
        ("signature removed", format!("{valid_head}.{claims_b64}.")),
        ("expired an hour ago", sign_dev(&app, &with("exp", json!(t - 3600)))),
        ("not valid for another hour", sign_dev(&app, &with("nbf", json!(t + 3600)))),
        ("no exp", sign_dev(&app, &without("exp"))),
        ("wrong issuer", sign_dev(&app, &with("iss", json!("https://evil.example")))),
        ("no issuer", sign_dev(&app, &without("iss"))),
        ("audience of another resource", sign_dev(&app, &with("aud", json!("https://other.example/mcp")))),
        ("audience with a trailing slash", sign_dev(&app, &with("aud", json!(format!("{}/", app.url))))),
        ("audience is the server root", sign_dev(&app, &with("aud", json!(app.base())))),
        ("no audience", sign_dev(&app, &without("aud"))),
        ("no subject", sign_dev(&app, &without("sub"))),
    ];
    for alg in ["none", "None", "NONE", "nOnE"] {
        let head = header_b64(&json!({"alg": alg, "typ": "JWT"}));
        rejected.push(("alg none", format!("{head}.{claims_b64}.")));
        rejected.push(("alg none with the original signature", format!("{head}.{claims_b64}.{valid_sig}")));
    }
    for (case, token) in &rejected {
        let r = initialize_with(&http, &app, token).await;
        assert_invalid_token(&app, &r, case, token);
    }

    // Credentials that are not a bearer token, even when the token inside is valid.
    let schemes = [
        ("Token scheme", format!("Token {valid}")),
        ("MAC scheme", format!("MAC {valid}")),
        ("Basic scheme", format!("Basic {}", base64::engine::general_purpose::STANDARD.encode("dev-agent:secret"))),
        ("bare token, no scheme", valid.clone()),
        ("Bearer without a token", "Bearer ".to_string()),
    ];
    for (case, value) in &schemes {
        let r = send(mcp_post(&http, &app.url, INITIALIZE).header("authorization", value.as_str())).await;
        assert_invalid_token(&app, &r, case, &valid);
    }

    let url = app.url.clone();
    app.stop().await;
    let mut secrets: Vec<String> = rejected.into_iter().map(|(_, t)| t).filter(|t| t.len() > 16).collect();
    secrets.extend(accepted.drain(..).map(|(_, t)| t));
    secrets.push(key);
    assert_never_logged(&url, &secrets);
}

/// The classic key-confusion forgery: an HS256 token whose HMAC secret is the IdP's RSA public key.
#[tokio::test]
async fn hs256_signed_with_the_rsa_public_key_is_rejected() {
    let http = http();
    let pub_files = format!(r#"["{}"]"#, fixture("rsa1.pub.pem").display());
    let public_pem = fixture_bytes("rsa1.pub.pem");

    for dev_key_enabled in ["true", "false"] {
        let dir = tempfile::tempdir().unwrap();
        let app = spawn_on(
            dir.path(),
            &[
                ("PAYGATE_AUTH__ISSUER", IDP),
                ("PAYGATE_AUTH__PUBLIC_KEY_FILES", &pub_files),
                ("PAYGATE_AUTH__DEV_KEY_ENABLED", dev_key_enabled),
            ],
        )
        .await;
        let base = claims(&app, IDP, "idp-agent", ALL_AGENT_SCOPES);

        // Control: the IdP's RSA key is trusted, so an honest RS256 token from it works.
        let honest = sign_with("rsa1.pem", Algorithm::RS256, None, &base);
        let r = initialize_with(&http, &app, &honest).await;
        assert_eq!(r.status, StatusCode::OK, "RS256 from the trusted PEM key (dev key {dev_key_enabled}): {}", r.body);

        let forged = sign_hs256(&public_pem, &base);
        let r = initialize_with(&http, &app, &forged).await;
        assert_invalid_token(
            &app,
            &r,
            &format!("HS256 keyed with the RSA public key (dev key {dev_key_enabled})"),
            &forged,
        );

        // Same forgery, with the PEM's trimmed text as the secret (a common variant).
        let forged_trimmed = sign_hs256(String::from_utf8_lossy(&public_pem).trim().as_bytes(), &base);
        let r = initialize_with(&http, &app, &forged_trimmed).await;
        assert_invalid_token(&app, &r, "HS256 keyed with the trimmed RSA public key", &forged_trimmed);

        let url = app.url.clone();
        app.stop().await;
        assert_never_logged(&url, &[honest, forged, forged_trimmed]);
    }
}

// ---------------------------------------------------------------------------------------------
// 403: missing scope
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn missing_scope_is_403_insufficient_scope() {
    let http = http();
    let (app, _dir) = spawn_app().await;
    let read_only = app.token("dev-agent", "payments:read");
    let no_scopes = app.token("dev-agent", "");
    let full = app.dev_token();

    // Raw HTTP: the status and the challenge are the contract.
    let call = json!({"jsonrpc": "2.0", "id": 3, "method": "tools/call",
        "params": {"name": "create_payment", "arguments": payment_args("op-raw-403")}})
    .to_string();
    let r = send(mcp_post(&http, &app.url, &call).bearer_auth(&read_only)).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "body {}", r.body);
    let raw = r.header("www-authenticate").expect("403 carries WWW-Authenticate");
    assert!(raw.starts_with("Bearer "), "{raw:?}");
    let (_, p) = parse_challenge(&raw);
    assert_eq!(p.get("error").map(String::as_str), Some("insufficient_scope"), "{raw:?}");
    assert_eq!(p.get("scope").map(String::as_str), Some("payments:create"), "{raw:?}");
    assert_eq!(p.get("resource_metadata"), Some(&metadata_url(&app)), "{raw:?}");

    // Through a real MCP client, in both eras.
    for era in ERAS {
        let client = connect(&app.url, &read_only, era).await;
        let tools = client.list_all_tools().await.expect("tools/list with payments:read");
        assert!(tools.iter().any(|t| t.name == "create_payment"), "{era:?}: tools/list lists create_payment");
        let refused = client
            .call_tool(
                CallToolRequestParams::new("create_payment").with_arguments(payment_args(&format!("op-{era:?}"))),
            )
            .await;
        let e = refused.expect_err("create_payment with only payments:read must fail");
        let text = format!("{e} {e:?}").to_lowercase();
        assert!(
            text.contains("insufficient") && text.contains("payments:create"),
            "{era:?}: not a step-up error naming payments:create: {text}"
        );
        let _ = client.cancel().await;
    }

    // tools/list stays open to any authenticated caller, even one with no scopes at all.
    for era in ERAS {
        let client = connect(&app.url, &no_scopes, era).await;
        let tools = client.list_all_tools().await.expect("tools/list with no scopes");
        assert!(!tools.is_empty(), "{era:?}");
        let _ = client.cancel().await;
    }

    // Nothing moved.
    let client = connect(&app.url, &full, Era::Legacy).await;
    assert_eq!(balance(&client, "acct-A").await, "1000000.00");
    assert_eq!(balance(&client, "acct-B").await, "0.00");
    // Control: the refused arguments were a valid payment; with the scope it goes through.
    let r = client
        .call_tool(CallToolRequestParams::new("create_payment").with_arguments(payment_args("op-raw-403")))
        .await
        .expect("create_payment with payments:create");
    ok(&r);
    assert_eq!(balance(&client, "acct-A").await, "999990.00");
    let _ = client.cancel().await;

    let key = app.dev_key_text();
    let url = app.url.clone();
    app.stop().await;
    assert_never_logged(&url, &[read_only, no_scopes, full, key]);
}

// ---------------------------------------------------------------------------------------------
// Identity-provider tokens from a JWKS
// ---------------------------------------------------------------------------------------------

async fn spawn_with_idp(dir: &std::path::Path, jwks: &JwksServer, refetch_secs: &str) -> TestApp {
    spawn_on(
        dir,
        &[
            ("PAYGATE_AUTH__ISSUER", IDP),
            ("PAYGATE_AUTH__JWKS_URL", &jwks.url),
            ("PAYGATE_AUTH__JWKS_REFETCH_MIN_INTERVAL_SECS", refetch_secs),
            // Shorter than the refetch interval (config requires it; the local IdP answers at once).
            ("PAYGATE_AUTH__JWKS_FETCH_TIMEOUT_MS", "500"),
            ("PAYGATE_POLICY__DEFAULT_PROFILE", "dev"),
            // These tests also mint dev-key tokens; beside an IdP the dev key is on only when asked.
            ("PAYGATE_AUTH__DEV_KEY_ENABLED", "true"),
        ],
    )
    .await
}

/// paygate trusting `jwks` on the test's own clock: the key set is fresh for 60 s, refetched on an
/// unknown kid at most every 10 s (of that clock), plus `extra` settings.
async fn spawn_with_idp_clock(
    dir: &std::path::Path,
    jwks: &JwksServer,
    clock: &paygate::clock::ManualClock,
    extra: &[(&str, &str)],
) -> TestApp {
    let mut env = vec![
        ("PAYGATE_AUTH__ISSUER", IDP),
        ("PAYGATE_AUTH__JWKS_URL", jwks.url.as_str()),
        ("PAYGATE_AUTH__JWKS_CACHE_SECS", "60"),
        ("PAYGATE_AUTH__JWKS_REFETCH_MIN_INTERVAL_SECS", "10"),
        ("PAYGATE_POLICY__DEFAULT_PROFILE", "dev"),
    ];
    env.extend_from_slice(extra);
    spawn_with_clock(dir, &env, Arc::new(clock.clone())).await
}

#[tokio::test]
async fn rs256_and_es256_tokens_verify_from_the_jwks() {
    let http = http();
    let jwks =
        JwksServer::start(vec![jwk("rsa1.pem", Algorithm::RS256, "k1"), jwk("ec1.pem", Algorithm::ES256, "e1")]).await;
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_idp(dir.path(), &jwks, "1").await;
    let base = claims(&app, IDP, "idp-agent", "payments:read");
    let mut secrets = Vec::new();

    for (pem, alg, kid) in [("rsa1.pem", Algorithm::RS256, "k1"), ("ec1.pem", Algorithm::ES256, "e1")] {
        let token = sign_with(pem, alg, Some(kid), &base);
        for era in ERAS {
            let client = connect(&app.url, &token, era).await;
            assert_eq!(balance(&client, "acct-A").await, "1000000.00", "{alg:?} {era:?}");
            let _ = client.cancel().await;
        }
        secrets.push(token);
    }
    assert!(jwks.fetches() >= 1, "paygate fetched the JWKS");

    let rejected = [
        (
            "ES256 signed by a key not in the JWKS under kid e1",
            sign_with("ec2.pem", Algorithm::ES256, Some("e1"), &base),
        ),
        (
            "RS256 signed by a key not in the JWKS under kid k1",
            sign_with("rsa2.pem", Algorithm::RS256, Some("k1"), &base),
        ),
        ("RS256 token naming the ES256 key's kid", sign_with("rsa1.pem", Algorithm::RS256, Some("e1"), &base)),
        ("RS256 with no kid and no PEM keys", sign_with("rsa1.pem", Algorithm::RS256, None, &base)),
        (
            "IdP key, dev issuer",
            sign_with("rsa1.pem", Algorithm::RS256, Some("k1"), &{
                let mut c = base.clone();
                c["iss"] = json!(DEV_ISSUER);
                c
            }),
        ),
        (
            "IdP key, wrong audience",
            sign_with("rsa1.pem", Algorithm::RS256, Some("k1"), &{
                let mut c = base.clone();
                c["aud"] = json!("https://other.example/mcp");
                c
            }),
        ),
        (
            "IdP key, expired",
            sign_with("ec1.pem", Algorithm::ES256, Some("e1"), &{
                let mut c = base.clone();
                c["exp"] = json!(now() - 3600);
                c
            }),
        ),
    ];
    for (case, token) in &rejected {
        let r = initialize_with(&http, &app, token).await;
        assert_invalid_token(&app, &r, case, token);
    }

    // The metadata names the IdP as an authorization server.
    let doc: Value = http.get(metadata_url(&app)).send().await.unwrap().json().await.unwrap();
    let servers = doc["authorization_servers"].as_array().expect("authorization_servers");
    assert!(servers.contains(&json!(IDP)), "{servers:?}");

    let url = app.url.clone();
    app.stop().await;
    secrets.extend(rejected.into_iter().map(|(_, t)| t));
    assert_never_logged(&url, &secrets);
}

#[tokio::test]
async fn jwks_key_rotation_is_picked_up() {
    let http = http();
    let jwks = JwksServer::start(vec![jwk("rsa1.pem", Algorithm::RS256, "k1")]).await;
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_idp(dir.path(), &jwks, "1").await;
    let base = claims(&app, IDP, "idp-agent", "payments:read");
    let old = sign_with("rsa1.pem", Algorithm::RS256, Some("k1"), &base);
    let new = sign_with("rsa2.pem", Algorithm::RS256, Some("k2"), &base);

    let r = initialize_with(&http, &app, &old).await;
    assert_eq!(r.status, StatusCode::OK, "k1 before rotation: {}", r.body);
    let r = initialize_with(&http, &app, &new).await;
    assert_invalid_token(&app, &r, "k2 before it is published", &new);

    jwks.replace(vec![jwk("rsa2.pem", Algorithm::RS256, "k2")]);
    // The unknown kid triggers a refetch, at most one per second (the configured rate bound); the
    // previous fetch may be under a second old, so retry within a bounded window.
    let mut accepted = false;
    for _ in 0..20 {
        let r = initialize_with(&http, &app, &new).await;
        if r.status == StatusCode::OK {
            accepted = true;
            break;
        }
        assert_invalid_token(&app, &r, "k2 while waiting for the refetch", &new);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(accepted, "a token signed with the rotated-in key k2 was never accepted");

    // Through an MCP client too.
    let client = connect(&app.url, &new, Era::Modern).await;
    assert_eq!(balance(&client, "acct-A").await, "1000000.00");
    let _ = client.cancel().await;

    // k1 is gone from the published set: its tokens no longer verify.
    let r = initialize_with(&http, &app, &old).await;
    assert_invalid_token(&app, &r, "k1 after it was rotated out", &old);

    let url = app.url.clone();
    app.stop().await;
    assert_never_logged(&url, &[old, new]);
}

/// Finding 6 of the authority review: a verified-token cache hit never asked whether the key set was
/// stale, so after the identity provider removed a key, a token already in the cache kept getting
/// 200 past the refresh interval until an unrelated new token forced a refetch. Now a hit whose key
/// set is older than `auth.jwks_cache_secs` revalidates against a fresh set (the clock is the
/// gateway's, moved by the test).
#[tokio::test]
async fn a_key_the_idp_removed_stops_verifying_cached_tokens_within_the_refresh_interval() {
    let http = http();
    let jwks =
        JwksServer::start(vec![jwk("rsa1.pem", Algorithm::RS256, "k1"), jwk("rsa2.pem", Algorithm::RS256, "k2")]).await;
    let dir = tempfile::tempdir().unwrap();
    let clock = paygate::clock::ManualClock::new(now());
    let app = spawn_with_idp_clock(dir.path(), &jwks, &clock, &[]).await;
    let base = claims(&app, IDP, "idp-agent", "payments:read");
    let cached = sign_with("rsa1.pem", Algorithm::RS256, Some("k1"), &base);
    let kept = sign_with("rsa2.pem", Algorithm::RS256, Some("k2"), &base);
    for t in [&cached, &kept] {
        let r = initialize_with(&http, &app, t).await;
        assert_eq!(r.status, StatusCode::OK, "{}", r.body);
    }
    let fetched = jwks.fetches();
    // The IdP removes k1. Within the refresh interval the cached token still passes (the gateway
    // cannot know yet) and no fetch is made per request.
    jwks.replace(vec![jwk("rsa2.pem", Algorithm::RS256, "k2")]);
    clock.advance(30);
    assert_eq!(initialize_with(&http, &app, &cached).await.status, StatusCode::OK);
    assert_eq!(jwks.fetches(), fetched, "a fresh key set is not fetched again");
    // Past the interval: the next hit starts one refresh in the background (it is answered from
    // the set it has, never waiting on the IdP); once the refresh lands k1 is gone and the token
    // is refused. Bounded: the local IdP answers at once.
    clock.advance(31);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    let r = loop {
        let r = initialize_with(&http, &app, &cached).await;
        if r.status != StatusCode::OK || std::time::Instant::now() > deadline {
            break r;
        }
        tokio::task::yield_now().await;
    };
    assert_invalid_token(&app, &r, "a cached token whose key the IdP removed", &cached);
    assert_eq!(jwks.fetches(), fetched + 1, "one refresh");
    // A token under a key still published keeps working.
    assert_eq!(initialize_with(&http, &app, &kept).await.status, StatusCode::OK);
    app.stop().await;
}

/// The last key set serves while the identity provider is down, but only up to
/// `auth.jwks_stale_max_secs` past its refresh interval: then nothing from the IdP verifies.
#[tokio::test]
async fn stale_keys_serve_through_an_idp_outage_only_up_to_the_hard_limit() {
    let http = http();
    let jwks = JwksServer::start(vec![jwk("rsa1.pem", Algorithm::RS256, "k1")]).await;
    let dir = tempfile::tempdir().unwrap();
    let clock = paygate::clock::ManualClock::new(now());
    let app = spawn_with_idp_clock(dir.path(), &jwks, &clock, &[("PAYGATE_AUTH__JWKS_STALE_MAX_SECS", "120")]).await;
    let mut base = claims(&app, IDP, "idp-agent", "payments:read");
    base["exp"] = json!(now() + 86_400);
    let token = sign_with("rsa1.pem", Algorithm::RS256, Some("k1"), &base);
    assert_eq!(initialize_with(&http, &app, &token).await.status, StatusCode::OK);
    jwks.set_down(true);
    clock.advance(100);
    assert_eq!(initialize_with(&http, &app, &token).await.status, StatusCode::OK, "stale keys serve");
    clock.advance(100); // 200 s: past 60 + 120
    let r = initialize_with(&http, &app, &token).await;
    assert_invalid_token(&app, &r, "keys past the stale-while-error limit", &token);
    // The IdP answers again: the next refresh (past the refetch interval) restores it.
    jwks.set_down(false);
    clock.advance(11);
    assert_eq!(initialize_with(&http, &app, &token).await.status, StatusCode::OK);
    app.stop().await;
}

/// Guard-rails hole 11: the verified-token cache was emptied only when the set of key ids changed, so
/// a key replaced under the same `kid` (a compromised key swapped out) kept its tokens accepted.
#[tokio::test]
async fn a_key_replaced_under_the_same_kid_stops_its_old_tokens() {
    let http = http();
    let jwks = JwksServer::start(vec![jwk("rsa1.pem", Algorithm::RS256, "k1")]).await;
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_idp(dir.path(), &jwks, "1").await;
    let base = claims(&app, IDP, "idp-agent", "payments:read");
    let old = sign_with("rsa1.pem", Algorithm::RS256, Some("k1"), &base);
    // Used twice: the second use is answered from the verified-token cache.
    for _ in 0..2 {
        let r = initialize_with(&http, &app, &old).await;
        assert_eq!(r.status, StatusCode::OK, "k1 (rsa1): {}", r.body);
    }

    // The IdP replaces k1's key material; the set of key ids stays {k1}. A token with an unknown
    // kid makes paygate refetch (at most once a second); the fetch counter shows when it has.
    jwks.replace(vec![jwk("rsa2.pem", Algorithm::RS256, "k1")]);
    let fetched = jwks.fetches();
    let probe = sign_with("rsa2.pem", Algorithm::RS256, Some("unpublished"), &base);
    for _ in 0..20 {
        assert_invalid_token(&app, &initialize_with(&http, &app, &probe).await, "an unpublished kid", &probe);
        if jwks.fetches() > fetched {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(jwks.fetches() > fetched, "the unknown kid never triggered a refetch");
    let r = initialize_with(&http, &app, &old).await;
    assert_invalid_token(&app, &r, "a token signed by k1's replaced key", &old);
    let new = sign_with("rsa2.pem", Algorithm::RS256, Some("k1"), &base);
    assert_eq!(initialize_with(&http, &app, &new).await.status, StatusCode::OK, "k1's new key verifies");

    let url = app.url.clone();
    app.stop().await;
    assert_never_logged(&url, &[old, new, probe]);
}

#[tokio::test]
async fn unknown_kid_is_rejected_without_refetch_flood() {
    let http = http();
    let jwks = JwksServer::start(vec![jwk("rsa1.pem", Algorithm::RS256, "k1")]).await;
    let dir = tempfile::tempdir().unwrap();
    // The longest refetch interval: after the first fetch, no unknown kid may cause another.
    let app = spawn_with_idp(dir.path(), &jwks, "3600").await;
    let base = claims(&app, IDP, "idp-agent", "payments:read");

    let good = sign_with("rsa1.pem", Algorithm::RS256, Some("k1"), &base);
    let r = initialize_with(&http, &app, &good).await;
    assert_eq!(r.status, StatusCode::OK, "k1: {}", r.body);
    let fetches = jwks.fetches();
    assert_eq!(fetches, 1, "one JWKS fetch for the first token");

    let mut secrets = vec![good];
    for i in 0..5 {
        let kid = format!("kid-{i}-{}", uuid::Uuid::new_v4());
        let token = sign_with("rsa2.pem", Algorithm::RS256, Some(&kid), &base);
        let r = initialize_with(&http, &app, &token).await;
        assert_invalid_token(&app, &r, "unknown kid, key not in the JWKS", &token);
        secrets.push(token);
    }
    assert_eq!(jwks.fetches(), fetches, "unknown kids refetched the JWKS inside the rate bound");

    let url = app.url.clone();
    app.stop().await;
    assert_never_logged(&url, &secrets);
}

// ---------------------------------------------------------------------------------------------
// Sessions belong to (issuer, subject)
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn sessions_are_bound_to_their_principal() {
    let http = http();
    let dir = tempfile::tempdir().unwrap();
    let pub_files = format!(r#"["{}"]"#, fixture("rsa1.pub.pem").display());
    // The dev key beside an identity provider: on only because this test says so.
    let app = spawn_on(
        dir.path(),
        &[
            ("PAYGATE_AUTH__ISSUER", IDP),
            ("PAYGATE_AUTH__PUBLIC_KEY_FILES", &pub_files),
            ("PAYGATE_AUTH__DEV_KEY_ENABLED", "true"),
        ],
    )
    .await;
    let a = app.dev_token();
    let a_refreshed = app.token("dev-agent", "payments:read");
    let b = app.token("other-agent", ALL_AGENT_SCOPES);
    // Same subject as A, different issuer: a different principal.
    let c = sign_with("rsa1.pem", Algorithm::RS256, None, &claims(&app, IDP, "dev-agent", ALL_AGENT_SCOPES));
    let a_forged = sign_hs256(b"not-the-dev-key-not-the-dev-key!", &dev_claims(&app, "dev-agent", ALL_AGENT_SCOPES));

    let r = initialize_with(&http, &app, &a).await;
    assert_eq!(r.status, StatusCode::OK, "A initializes: {}", r.body);
    let session = r.header("mcp-session-id").expect("initialize returns Mcp-Session-Id");

    let on_session = |token: &str, body: &str| {
        mcp_post(&http, &app.url, body)
            .bearer_auth(token)
            .header("mcp-session-id", &session)
            .header("mcp-protocol-version", "2025-11-25")
    };

    let r = send(on_session(&a, INITIALIZED)).await;
    assert_eq!(r.status, StatusCode::ACCEPTED, "A's initialized notification: {}", r.body);

    let r = send(on_session(&b, TOOLS_LIST)).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "B on A's session: {}", r.body);
    let r = send(on_session(&c, TOOLS_LIST)).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "A's subject from another issuer on A's session: {}", r.body);
    // Every request is verified, not only the session's first.
    let r = send(on_session(&a_forged, TOOLS_LIST)).await;
    assert_invalid_token(&app, &r, "forged token for A's subject on A's session", &a_forged);

    let r = send(on_session(&a, TOOLS_LIST)).await;
    assert_eq!(r.status, StatusCode::OK, "A on its own session: {}", r.body);
    assert!(r.body.contains("create_payment"), "tools/list result: {}", r.body);
    // Bound to the principal, not the raw token: a refreshed token keeps the session.
    let r = send(on_session(&a_refreshed, TOOLS_LIST)).await;
    assert_eq!(r.status, StatusCode::OK, "A with a new token on its session: {}", r.body);

    let delete = |token: &str| http.delete(&app.url).bearer_auth(token).header("mcp-session-id", &session);
    let r = send(delete(&b).header("mcp-protocol-version", "2025-11-25")).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "B deleting A's session: {}", r.body);
    let r = send(on_session(&a, TOOLS_LIST)).await;
    assert_eq!(r.status, StatusCode::OK, "A's session survives B's DELETE: {}", r.body);

    // A can end its own session; afterwards it is unknown.
    let r = send(delete(&a).header("mcp-protocol-version", "2025-11-25")).await;
    // 204, not rmcp's 202: official clients treat anything but 200/204 as a failed termination.
    assert_eq!(r.status, StatusCode::NO_CONTENT, "A deleting its own session: {}", r.body);
    let r = send(on_session(&a, TOOLS_LIST)).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "A's deleted session: {}", r.body);

    let key = app.dev_key_text();
    let url = app.url.clone();
    app.stop().await;
    assert_never_logged(&url, &[a, a_refreshed, b, c, a_forged, key]);
}

// ---------------------------------------------------------------------------------------------
// Origin
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn foreign_origin_is_forbidden() {
    let http = http();
    let (app, _dir) = spawn_app().await;
    let token = app.dev_token();

    let r =
        send(mcp_post(&http, &app.url, INITIALIZE).bearer_auth(&token).header("origin", "https://evil.example")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "foreign Origin: {}", r.body);
    let r = send(mcp_post(&http, &app.url, INITIALIZE).bearer_auth(&token).header("origin", "null")).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN, "opaque Origin: {}", r.body);

    let r = initialize_with(&http, &app, &token).await;
    assert_eq!(r.status, StatusCode::OK, "no Origin (a server-side agent): {}", r.body);
    let r = send(mcp_post(&http, &app.url, INITIALIZE).bearer_auth(&token).header("origin", app.base())).await;
    assert_eq!(r.status, StatusCode::OK, "paygate's own origin: {}", r.body);

    let key = app.dev_key_text();
    let url = app.url.clone();
    app.stop().await;
    assert_never_logged(&url, &[token, key]);
}

// ---------------------------------------------------------------------------------------------
// RFC 9728 protected resource metadata
// ---------------------------------------------------------------------------------------------

#[tokio::test]
async fn protected_resource_metadata_describes_this_resource() {
    let http = http();
    let (app, _dir) = spawn_app().await;
    for path in ["/.well-known/oauth-protected-resource/mcp", "/.well-known/oauth-protected-resource"] {
        let resp = http.get(format!("{}{path}", app.base())).send().await.unwrap();
        assert_eq!(resp.status(), StatusCode::OK, "{path}");
        let doc: Value = resp.json().await.unwrap();
        assert_eq!(doc["resource"], json!(app.url), "{path}: resource is exactly the endpoint URL");
        assert_eq!(doc["bearer_methods_supported"], json!(["header"]), "{path}");
        let servers = doc["authorization_servers"].as_array().unwrap_or_else(|| panic!("{path}: {doc}"));
        assert!(!servers.is_empty(), "{path}");
        // The dev issuer is the gateway itself: an issuer identifier is a URL (RFC 8414).
        assert!(servers.contains(&json!(DEV_ISSUER)), "{path}: {servers:?}");
        assert!(servers.iter().all(|s| s.as_str().is_some_and(|s| s.starts_with("http"))), "{path}: {servers:?}");
        let scopes = doc["scopes_supported"].as_array().unwrap_or_else(|| panic!("{path}: {doc}"));
        assert!(scopes.contains(&json!("payments:create")), "{path}: {scopes:?}");
        assert!(!scopes.contains(&json!("offline_access")), "{path}: {scopes:?}");
        for (k, v) in doc.as_object().unwrap() {
            assert!(v.as_array().is_none_or(|a| !a.is_empty()), "{path}: empty array {k}");
        }
    }
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// The real binary with an identity provider configured
// ---------------------------------------------------------------------------------------------

/// `paygate serve` with `auth.jwks_url` set starts and verifies a JWKS-signed token, and the token
/// does not reach its log output.
#[tokio::test]
async fn paygate_serve_starts_with_a_jwks_url() {
    use std::io::{BufRead, Read};
    use std::process::{Command, Stdio};

    let http = http();
    let jwks = JwksServer::start(vec![jwk("rsa1.pem", Algorithm::RS256, "k1")]).await;
    let dir = tempfile::tempdir().unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_paygate"))
        .arg("serve")
        .env("PAYGATE_SERVER__BIND", "127.0.0.1:0")
        .env("PAYGATE_STORAGE__DATA_DIR", dir.path())
        .env("PAYGATE_AUTH__ISSUER", IDP)
        .env("PAYGATE_AUTH__JWKS_URL", &jwks.url)
        .env("PAYGATE_POLICY__DEFAULT_PROFILE", "dev")
        .env("PAYGATE_DEV__PRINT_TOKEN", "false")
        .env("PAYGATE_LOG", "debug")
        .env("NO_COLOR", "1")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run paygate");

    let stdout = child.stdout.take().unwrap();
    let mut stderr = child.stderr.take().unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<String>();
    let output = Arc::new(Mutex::new(String::new()));
    let out = output.clone();
    let out_reader = std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
            out.lock().unwrap().push_str(&line);
            out.lock().unwrap().push('\n');
            let _ = tx.send(line);
        }
    });
    let err_text = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = stderr.read_to_string(&mut s);
        s
    });

    // Wait (bounded) for the endpoint line, or for the process to end.
    let mut mcp_url = None;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while let Ok(Some(line)) = tokio::time::timeout_at(deadline, rx.recv()).await {
        if let Some(url) = line.strip_prefix("paygate MCP endpoint: ") {
            mcp_url = Some(url.trim().to_string());
            break;
        }
    }
    let Some(mcp_url) = mcp_url else {
        let _ = child.kill();
        let status = child.wait().unwrap();
        panic!("paygate serve did not start ({status}); stderr:\n{}", err_text.join().unwrap());
    };
    // From here on, a failed assertion must not leave the server running.
    struct KillOnDrop(std::process::Child);
    impl Drop for KillOnDrop {
        fn drop(&mut self) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
    let child = KillOnDrop(child);

    let t = now();
    let claims = json!({"iss": IDP, "sub": "idp-agent", "aud": mcp_url, "iat": t, "nbf": t, "exp": t + 3600,
        "scope": "payments:read"});
    let token = sign_with("rsa1.pem", Algorithm::RS256, Some("k1"), &claims);
    let r = send(mcp_post(&http, &mcp_url, INITIALIZE).bearer_auth(&token)).await;

    drop(child);
    let _ = out_reader.join();
    let stderr_text = err_text.join().unwrap();
    assert_eq!(
        r.status,
        StatusCode::OK,
        "JWKS token against paygate serve: {} {}\nstderr:\n{stderr_text}",
        r.status,
        r.body
    );
    assert!(jwks.fetches() >= 1);
    let logged = format!("{}{stderr_text}", output.lock().unwrap());
    assert!(!logged.contains(&token), "the token appears in paygate's output");
}
