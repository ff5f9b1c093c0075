//! Passkey-signed approvals, black box: a software authenticator (a P-256 key, CBOR by hand, the
//! bytes a browser's WebAuthn API returns) registers with the running gateway over the operator
//! API, and approvals whose amount tier or agent profile requires a passkey are decided only with an
//! assertion over exactly their intent. On SQLite, and on PostgreSQL when
//! PAYGATE_TEST_DATABASE_URL is set. (The console's test does the same with Chromium's virtual
//! authenticator.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use common::*;
use p256::ecdsa::signature::Signer;
use reqwest::Method;
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

const AGENT_SCOPES: &str = "payments:read payments:create payments:refund";

/// The dev agent: a passkey from KES 5,000 (the amount tier); the guarded agent: always (its profile).
const CONFIG: &str = r#"
[passkeys]
required_amount = { KES = "5000.00" }

[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "1000000.00" }
daily_payments_max = 1000
calls_per_minute = 10000

[[policy.profiles]]
name = "guarded"
subjects = ["guarded-agent"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "1000000.00" }
daily_payments_max = 1000
calls_per_minute = 10000
passkey_required = true

[[policy.profiles]]
name = "pat's own"
subjects = ["pat-agent"]
users = ["pat"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "1000000.00" }
daily_payments_max = 1000
calls_per_minute = 10000
approvals_by = "user"
user_approval_max = { KES = "10000.00" }
"#;

// ---- a software authenticator -------------------------------------------------------------------

fn cbor_head(major: u8, n: u64, out: &mut Vec<u8>) {
    match n {
        0..=23 => out.push(major << 5 | n as u8),
        24..=255 => out.extend([major << 5 | 24, n as u8]),
        _ => {
            out.push(major << 5 | 25);
            out.extend((n as u16).to_be_bytes());
        }
    }
}
fn cbor_int(i: i64, out: &mut Vec<u8>) {
    if i >= 0 { cbor_head(0, i as u64, out) } else { cbor_head(1, (-1 - i) as u64, out) }
}
fn cbor_bytes(b: &[u8], out: &mut Vec<u8>) {
    cbor_head(2, b.len() as u64, out);
    out.extend_from_slice(b);
}
fn cbor_text(s: &str, out: &mut Vec<u8>) {
    cbor_head(3, s.len() as u64, out);
    out.extend_from_slice(s.as_bytes());
}

/// One person's passkey: a P-256 key, a credential id and a signature counter, for `origin`.
struct Authenticator {
    key: p256::ecdsa::SigningKey,
    id: Vec<u8>,
    count: u32,
    rp_id: String,
    origin: String,
}

impl Authenticator {
    fn new(origin: &str) -> Self {
        let seed = [*uuid::Uuid::new_v4().as_bytes(), *uuid::Uuid::new_v4().as_bytes()].concat();
        let key = p256::ecdsa::SigningKey::from_slice(&seed).unwrap();
        let id = uuid::Uuid::new_v4().as_bytes().to_vec();
        let rp_id = origin.split("://").nth(1).unwrap().split(':').next().unwrap().to_string();
        Authenticator { key, id, count: 0, rp_id, origin: origin.to_string() }
    }

    fn credential_id(&self) -> String {
        B64.encode(&self.id)
    }

    fn auth_data(&self, attested: bool) -> Vec<u8> {
        let mut d = Sha256::digest(self.rp_id.as_bytes()).to_vec();
        d.push(0x01 | 0x04 | if attested { 0x40 } else { 0 }); // UP, UV (, AT)
        d.extend(self.count.to_be_bytes());
        if attested {
            d.extend([0u8; 16]);
            d.extend((self.id.len() as u16).to_be_bytes());
            d.extend(&self.id);
            let sec1 = self.key.verifying_key().to_sec1_bytes();
            cbor_head(5, 5, &mut d);
            for (k, v) in [(1, 2), (3, -7), (-1, 1)] {
                cbor_int(k, &mut d);
                cbor_int(v, &mut d);
            }
            cbor_int(-2, &mut d);
            cbor_bytes(&sec1[1..33], &mut d);
            cbor_int(-3, &mut d);
            cbor_bytes(&sec1[33..65], &mut d);
        }
        d
    }

    fn client_data(&self, kind: &str, challenge: &[u8]) -> Vec<u8> {
        let c = B64.encode(challenge);
        format!(r#"{{"type":"{kind}","challenge":"{c}","origin":"{}","crossOrigin":false}}"#, self.origin).into_bytes()
    }

    /// `navigator.credentials.create` answering the gateway's options.
    fn register(&self, options: &Value, name: &str) -> Value {
        let challenge = B64.decode(options["publicKey"]["challenge"].as_str().unwrap()).unwrap();
        assert_eq!(options["publicKey"]["rp"]["id"], self.rp_id.as_str());
        let mut obj = Vec::new();
        cbor_head(5, 3, &mut obj);
        cbor_text("fmt", &mut obj);
        cbor_text("none", &mut obj);
        cbor_text("attStmt", &mut obj);
        cbor_head(5, 0, &mut obj);
        cbor_text("authData", &mut obj);
        cbor_bytes(&self.auth_data(true), &mut obj);
        json!({
            "challenge": B64.encode(&challenge),
            "client_data_json": B64.encode(self.client_data("webauthn.create", &challenge)),
            "attestation_object": B64.encode(&obj),
            "name": name,
        })
    }

    /// `navigator.credentials.get` over `payload` (the challenge is its SHA-256).
    fn sign(&mut self, payload: &str) -> Value {
        self.count += 1;
        let challenge = Sha256::digest(payload.as_bytes());
        let client_data_json = self.client_data("webauthn.get", &challenge);
        let authenticator_data = self.auth_data(false);
        let mut signed = authenticator_data.clone();
        signed.extend(Sha256::digest(&client_data_json));
        let sig: p256::ecdsa::Signature = self.key.sign(&signed);
        json!({
            "credential_id": self.credential_id(),
            "client_data_json": B64.encode(&client_data_json),
            "authenticator_data": B64.encode(&authenticator_data),
            "signature": B64.encode(sig.to_der().as_bytes()),
        })
    }
}

// ---- the gateway --------------------------------------------------------------------------------

/// The gateway on a port chosen here, its public URL on `localhost` (a WebAuthn RP id is a host
/// name, never an IP address).
async fn start(dir: &std::path::Path, extra: &[(&str, &str)]) -> TestApp {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (bind, public) = (format!("127.0.0.1:{port}"), format!("http://localhost:{port}"));
    let mut overrides = vec![("PAYGATE_SERVER__BIND", bind.as_str()), ("PAYGATE_SERVER__PUBLIC_URL", public.as_str())];
    overrides.extend_from_slice(extra);
    spawn_with_toml(dir, CONFIG, &overrides, Arc::new(paygate::clock::SystemClock)).await
}

async fn register(app: &TestApp, token: &str, name: &str) -> Authenticator {
    let mut a = Authenticator::new(app.base());
    let (status, options) = operator(app, Method::POST, "/operator/v1/passkeys/options", token, None).await;
    assert_eq!(status, 200, "{options}");
    let (status, body) =
        operator(app, Method::POST, "/operator/v1/passkeys", token, Some(a.register(&options, name))).await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["credential_id"], a.credential_id().as_str());
    assert_eq!(body["public_key_jwk"]["crv"], "P-256");
    a.count = 0;
    a
}

fn pay_args(op: &str, amount: &str, mandate: Option<&str>) -> Value {
    let mut args = json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B",
                          "amount": amount, "currency": "KES"});
    if let Some(m) = mandate {
        args["mandate"] = json!(m);
    }
    args
}

async fn approval(app: &TestApp, token: &str, id: &str) -> Value {
    let (status, body) = operator(app, Method::GET, &format!("/operator/v1/approvals/{id}"), token, None).await;
    assert_eq!(status, 200, "{body}");
    body
}

async fn decide(app: &TestApp, token: &str, id: &str, verb: &str, body: Value) -> (reqwest::StatusCode, Value) {
    operator(app, Method::POST, &format!("/operator/v1/approvals/{id}/{verb}"), token, Some(body)).await
}

fn mandate_claims(jws: &str) -> Value {
    serde_json::from_slice(&B64.decode(jws.split('.').nth(1).unwrap()).unwrap()).unwrap()
}

async fn scenario(extra: &[(&str, &str)], label: &str) {
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path(), extra).await;
    let rita = app.operator_token("rita", "payments:approve payments:audit");
    let bob = app.operator_token("bob", "payments:approve");
    let mut ritas = register(&app, &rita, "rita's laptop").await;
    let mut bobs = register(&app, &bob, "bob's phone").await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;

    // KES 6,000 is in the passkey tier: the approval says so, and so does the agent's error.
    let r = call(&agent, "create_payment", pay_args(&format!("{label}-big"), "6000.00", None)).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{label}");
    assert_eq!(err(&r)["passkey_required"], true, "{label}");
    let id = err(&r)["approval_id"].as_str().unwrap().to_string();
    let a = approval(&app, &rita, &id).await;
    assert_eq!(a["passkey_required"], true);
    let payload = a["passkey_payloads"]["approve"].as_str().unwrap().to_string();
    let intent: Value = serde_json::from_str(&payload).unwrap();
    assert_eq!((intent["approval_id"].as_str(), intent["amount_minor"].as_str()), (Some(id.as_str()), Some("600000")));
    assert_eq!(intent["intent"]["operation_id"], format!("{label}-big"), "the operation is signed too");

    // A plain click is refused, and so is a rejection without a passkey.
    let (status, body) = decide(&app, &rita, &id, "approve", json!({"reason": "ok"})).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (403, Some("PASSKEY_REQUIRED")), "{body}");
    let (status, body) = decide(&app, &rita, &id, "reject", json!({"reason": "no"})).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (403, Some("PASSKEY_REQUIRED")), "{body}");

    // An assertion made for a different amount (the same approval, operation and payee) is refused.
    let mut other = intent.clone();
    other["amount_minor"] = json!("60000");
    other["intent"]["amount"] = json!("600.00");
    let forged = ritas.sign(&other.to_string());
    let (status, body) = decide(&app, &rita, &id, "approve", json!({"reason": "ok", "passkey": forged})).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (403, Some("PASSKEY_INVALID")), "{body}");
    // So is one for the rejection presented as an approval, and one by someone else's passkey.
    let reject_sig = ritas.sign(a["passkey_payloads"]["reject"].as_str().unwrap());
    let (status, body) = decide(&app, &rita, &id, "approve", json!({"passkey": reject_sig})).await;
    assert_eq!(body["error"]["code"], "PASSKEY_INVALID", "{status} {body}");
    let bobs_sig = bobs.sign(&payload);
    let (status, body) = decide(&app, &rita, &id, "approve", json!({"passkey": bobs_sig})).await;
    assert_eq!(body["error"]["code"], "PASSKEY_INVALID", "{status} {body}");
    assert_eq!(approval(&app, &rita, &id).await["status"], "pending", "{label}: refusals changed nothing");
    let r = call(&agent, "create_payment", pay_args(&format!("{label}-big"), "6000.00", None)).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{label}: still not approved");

    // Rita's own assertion over exactly this intent approves it; the mandate carries its hash.
    let signed = ritas.sign(&payload);
    let (status, body) = decide(&app, &rita, &id, "approve", json!({"reason": "ok", "passkey": signed.clone()})).await;
    assert_eq!((status.as_u16(), body["status"].as_str()), (200, Some("approved")), "{body}");
    // The same assertion again (a replay) finds it decided.
    let (status, _) = decide(&app, &rita, &id, "approve", json!({"passkey": signed})).await;
    assert_eq!(status, 409);
    let got = call(&agent, "get_approval", json!({"approval_id": id})).await;
    let mandate = ok(&got)["mandate"].as_str().unwrap().to_string();
    let claims = mandate_claims(&mandate);
    let (status, proof) =
        operator(&app, Method::GET, &format!("/operator/v1/approvals/{id}/passkeys"), &rita, None).await;
    assert_eq!(status, 200, "{proof}");
    let review = &proof["reviews"][0];
    assert_eq!((review["verified"].as_bool(), review["in_mandate"].as_bool()), (Some(true), Some(true)), "{proof}");
    assert_eq!(claims["passkeys"], json!([review["assertion_sha256"]]), "{claims}");
    assert_eq!(review["credential_id"], ritas.credential_id().as_str());
    // Verified again here from the stored public key alone: the assertion signs the payload.
    let jwk = {
        let (_, mine) = operator(&app, Method::GET, "/operator/v1/passkeys", &rita, None).await;
        mine["items"][0]["public_key_jwk"].clone()
    };
    let mut sec1 = vec![4u8];
    sec1.extend(B64.decode(jwk["x"].as_str().unwrap()).unwrap());
    sec1.extend(B64.decode(jwk["y"].as_str().unwrap()).unwrap());
    let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&sec1).unwrap();
    let stored = &review["assertion"];
    let field = |k: &str| B64.decode(stored[k].as_str().unwrap()).unwrap();
    let client_data: Value = serde_json::from_slice(&field("client_data_json")).unwrap();
    assert_eq!(client_data["challenge"], B64.encode(Sha256::digest(payload.as_bytes())).as_str());
    let mut msg = field("authenticator_data");
    msg.extend(Sha256::digest(field("client_data_json")));
    use p256::ecdsa::signature::Verifier;
    key.verify(&msg, &p256::ecdsa::Signature::from_der(&field("signature")).unwrap()).unwrap();

    let r = call(&agent, "create_payment", pay_args(&format!("{label}-big"), "6000.00", Some(&mandate))).await;
    assert_eq!(ok(&r)["status"], "succeeded", "{label}: the mandate pays");

    // Under the tier a plain click still approves.
    let r = call(&agent, "create_payment", pay_args(&format!("{label}-small"), "2000.00", None)).await;
    assert_eq!(err(&r)["passkey_required"], false);
    let small = err(&r)["approval_id"].as_str().unwrap().to_string();
    let (status, body) = decide(&app, &rita, &small, "approve", json!({"reason": "ok"})).await;
    assert_eq!((status.as_u16(), body["status"].as_str()), (200, Some("approved")), "{body}");

    // The guarded agent's profile needs a passkey at any amount; a revoked passkey signs nothing.
    let guarded = connect(&app.url, &app.token("guarded-agent", AGENT_SCOPES), Era::Modern).await;
    let r = call(&guarded, "create_payment", pay_args(&format!("{label}-guarded"), "1500.00", None)).await;
    assert_eq!(err(&r)["passkey_required"], true, "{label}: the profile asks for a passkey");
    let gid = err(&r)["approval_id"].as_str().unwrap().to_string();
    let gpayload = approval(&app, &bob, &gid).await["passkey_payloads"]["reject"].as_str().unwrap().to_string();
    let cred = bobs.credential_id();
    let (status, body) =
        operator(&app, Method::POST, &format!("/operator/v1/passkeys/{cred}/revoke"), &rita, None).await;
    assert_eq!(status, 404, "someone else's passkey does not exist for rita: {body}");
    let (status, body) =
        operator(&app, Method::POST, &format!("/operator/v1/passkeys/{cred}/revoke"), &bob, None).await;
    assert_eq!((status.as_u16(), body["revoked_by"].as_str()), (200, Some("bob")), "{body}");
    let (_, body) = decide(&app, &bob, &gid, "reject", json!({"reason": "no", "passkey": bobs.sign(&gpayload)})).await;
    assert_eq!(body["error"]["code"], "PASSKEY_INVALID", "{body}");
    let (status, body) =
        decide(&app, &rita, &gid, "reject", json!({"reason": "no", "passkey": ritas.sign(&gpayload)})).await;
    assert_eq!((status.as_u16(), body["status"].as_str()), (200, Some("rejected")), "{body}");

    // Registration and revocation are audited; the approval records which assertion signed it.
    let audit = app.audit("rita").await;
    assert!(audit.iter().any(|r| r.tool == "passkeys.register" && r.decision == "registered"), "{label}");
    assert!(
        audit.iter().any(|r| r.tool == "approvals.approve"
            && r.decision == "refused"
            && r.code.as_deref() == Some("PASSKEY_INVALID")),
        "{label}: refusals are audited"
    );
    assert!(app.audit("bob").await.iter().any(|r| r.tool == "passkeys.revoke" && r.decision == "revoked"));
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;

    // The gateway moves to another origin (a new port): the stored assertion still verifies against
    // the relying party it was made for, and the passkey registered there no longer signs here.
    let app = start(dir.path(), extra).await;
    let rita = app.operator_token("rita", "payments:approve payments:audit");
    let (status, proof) =
        operator(&app, Method::GET, &format!("/operator/v1/approvals/{id}/passkeys"), &rita, None).await;
    assert_eq!((status.as_u16(), proof["reviews"][0]["verified"].as_bool()), (200, Some(true)), "{label}: {proof}");
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let r = call(&agent, "create_payment", pay_args(&format!("{label}-moved"), "7000.00", None)).await;
    let moved = err(&r)["approval_id"].as_str().unwrap().to_string();
    let payload = approval(&app, &rita, &moved).await["passkey_payloads"]["approve"].as_str().unwrap().to_string();
    let (_, body) = decide(&app, &rita, &moved, "approve", json!({"passkey": ritas.sign(&payload)})).await;
    assert_eq!(body["error"]["code"], "PASSKEY_INVALID", "{label}: {body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("registered for"), "{body}");
    app.stop().await;
}

#[tokio::test]
async fn a_passkey_tier_takes_only_an_assertion_over_exactly_the_intent_on_sqlite() {
    scenario(&[], "sqlite").await;
}

#[tokio::test]
async fn a_passkey_tier_takes_only_an_assertion_over_exactly_the_intent_on_postgres() {
    let Some(db) = database("passkeys (postgres)") else { return };
    let schema = db.schema.clone();
    let overrides = [("PAYGATE_STORAGE__URL", db.url.as_str()), ("PAYGATE_STORAGE__POSTGRES_SCHEMA", schema.as_str())];
    scenario(&overrides, "postgres").await;
}

#[tokio::test]
async fn in_the_passkey_tier_the_user_confirms_their_own_payment_with_their_own_passkey() {
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path(), &[]).await;
    // pat-agent acts for pat (RFC 8693), whose profile lets pat confirm up to KES 10,000.
    let agent = connect(&app.url, &app.delegated_token("pat", "pat-agent", AGENT_SCOPES), Era::Modern).await;
    let r = call(&agent, "create_payment", pay_args("pat-1", "6000.00", None)).await;
    assert_eq!((err(&r)["approver"].as_str(), err(&r)["passkey_required"].as_bool()), (Some("user"), Some(true)));
    let id = err(&r)["approval_id"].as_str().unwrap().to_string();
    let pat = app.operator_token("pat", "payments:confirm");
    let path = format!("/operator/v1/confirmations/{id}");
    let (status, view) = operator(&app, Method::GET, &path, &pat, None).await;
    assert_eq!(status, 200, "{view}");
    let payload = view["passkey_payloads"]["approve"].as_str().unwrap().to_string();
    // A plain confirmation is refused; pat registers a passkey (payments:confirm is enough) and
    // confirms with it; the mandate pays.
    let (status, body) = operator(&app, Method::POST, &format!("{path}/approve"), &pat, Some(json!({}))).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (403, Some("PASSKEY_REQUIRED")), "{body}");
    let mut pats = register(&app, &pat, "pat's phone").await;
    let body = json!({"passkey": pats.sign(&payload)});
    let (status, body) = operator(&app, Method::POST, &format!("{path}/approve"), &pat, Some(body)).await;
    assert_eq!((status.as_u16(), body["status"].as_str()), (200, Some("approved")), "{body}");
    let got = call(&agent, "get_approval", json!({"approval_id": id})).await;
    let mandate = ok(&got)["mandate"].as_str().unwrap().to_string();
    assert_eq!(mandate_claims(&mandate)["passkeys"].as_array().map(Vec::len), Some(1));
    let r = call(&agent, "create_payment", pay_args("pat-1", "6000.00", Some(&mandate))).await;
    assert_eq!(ok(&r)["status"], "succeeded");
    assert!(app.audit("pat").await.iter().any(|r| r.tool == "approvals.user_confirm" && r.decision == "recorded"));
    app.stop().await;
}

#[tokio::test]
async fn a_registration_answers_only_its_own_challenge_and_passkeys_need_a_host_name() {
    let dir = tempfile::tempdir().unwrap();
    let app = start(dir.path(), &[]).await;
    let (rita, bob) = (app.operator_token("rita", "payments:approve"), app.operator_token("bob", "payments:approve"));
    let a = Authenticator::new(app.base());
    let (_, options) = operator(&app, Method::POST, "/operator/v1/passkeys/options", &rita, None).await;
    // Bob cannot register with Rita's challenge; an auditor cannot register at all.
    let (status, body) =
        operator(&app, Method::POST, "/operator/v1/passkeys", &bob, Some(a.register(&options, "x"))).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{body}");
    let auditor = app.operator_token("ann", "payments:audit");
    let (status, _) = operator(&app, Method::POST, "/operator/v1/passkeys/options", &auditor, None).await;
    assert_eq!(status, 403);
    // Another origin's ceremony is refused; the right one registers once.
    let mut elsewhere = Authenticator::new("http://localhost:1");
    elsewhere.rp_id = "localhost".into();
    let (status, _) =
        operator(&app, Method::POST, "/operator/v1/passkeys", &rita, Some(elsewhere.register(&options, "x"))).await;
    assert_eq!(status, 400);
    let reg = a.register(&options, "laptop");
    let (status, _) = operator(&app, Method::POST, "/operator/v1/passkeys", &rita, Some(reg.clone())).await;
    assert_eq!(status, 201);
    let (status, body) = operator(&app, Method::POST, "/operator/v1/passkeys", &rita, Some(reg)).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (409, Some("CONFLICT")), "{body}");
    let (_, mine) = operator(&app, Method::GET, "/operator/v1/passkeys", &rita, None).await;
    assert_eq!(mine["items"].as_array().unwrap().len(), 1);
    let (_, theirs) = operator(&app, Method::GET, "/operator/v1/passkeys", &bob, None).await;
    assert_eq!(theirs["items"], json!([]), "a person sees only their own passkeys");
    app.stop().await;

    // On an IP address (no host name) passkeys are unavailable, and a configuration that requires
    // them does not start.
    let dir = tempfile::tempdir().unwrap();
    let (app, _d) = spawn_app().await;
    let token = app.operator_token("rita", "payments:approve");
    let (status, body) = operator(&app, Method::POST, "/operator/v1/passkeys/options", &token, None).await;
    assert_eq!(status, 409, "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("host"), "{body}");
    app.stop().await;
    let file = dir.path().join("c.toml");
    std::fs::write(&file, "[passkeys]\nrequired_amount = { KES = \"1.00\" }\n").unwrap();
    let env = [("PAYGATE_SERVER__PUBLIC_URL".to_string(), "http://10.0.0.1:8080".to_string())];
    let err = paygate::config::Config::load(Some(&file), env).unwrap_err().to_string();
    assert!(err.contains("passkeys need server.public_url to name a host"), "{err}");
}
