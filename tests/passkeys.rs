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

[webhooks]
enabled = true

[[webhooks.endpoints]]
name = "ops"
url = "http://127.0.0.1:9/paygate"
secret_env = "PAYGATE_WEBHOOK_SECRET_OPS"
events = ["passkey.registered"]
"#;

/// The admin who issues enrolment codes in these tests (never for themself).
const ENROLMENT_ADMIN: &str = "enrol-admin";

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
        self.sign_challenge(&Sha256::digest(payload.as_bytes()))
    }

    /// `navigator.credentials.get` with `options` (an enrolment's request options): vouches for a
    /// new registration.
    fn vouch(&mut self, options: &Value) -> Value {
        let challenge = options["enrolment"]["publicKey"]["challenge"].as_str().expect("a passkey may vouch");
        self.sign_challenge(&B64.decode(challenge).unwrap())
    }

    /// `navigator.credentials.get` over exactly `challenge`.
    fn sign_challenge(&mut self, challenge: &[u8]) -> Value {
        self.count += 1;
        let client_data_json = self.client_data("webauthn.get", challenge);
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
    start_with_clock(dir, extra, Arc::new(paygate::clock::SystemClock)).await
}

async fn start_with_clock(
    dir: &std::path::Path,
    extra: &[(&str, &str)],
    clock: Arc<dyn paygate::clock::Clock>,
) -> TestApp {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (bind, public) = (format!("127.0.0.1:{port}"), format!("http://localhost:{port}"));
    let secret = format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([7u8; 32]));
    let mut overrides = vec![
        ("PAYGATE_SERVER__BIND", bind.as_str()),
        ("PAYGATE_SERVER__PUBLIC_URL", public.as_str()),
        ("PAYGATE_WEBHOOK_SECRET_OPS", secret.as_str()),
    ];
    overrides.extend_from_slice(extra);
    spawn_with_toml(dir, CONFIG, &overrides, clock).await
}

/// An enrolment code for `owner`, issued by another operator holding `payments:admin`.
async fn enrolment_code(app: &TestApp, owner: &str) -> String {
    let admin = app.operator_token(ENROLMENT_ADMIN, "payments:admin");
    let (status, body) =
        operator(app, Method::POST, "/operator/v1/passkeys/enrolment-codes", &admin, Some(json!({"owner": owner})))
            .await;
    assert_eq!(status, 201, "{body}");
    assert_eq!(body["owner"], owner);
    body["code"].as_str().unwrap().to_string()
}

async fn fresh_options(app: &TestApp, token: &str) -> Value {
    let (status, options) = operator(app, Method::POST, "/operator/v1/passkeys/options", token, None).await;
    assert_eq!(status, 200, "{options}");
    options
}

/// `sub`'s first passkey (`token` is theirs), registered with an enrolment code another operator
/// issued for them.
async fn register(app: &TestApp, token: &str, sub: &str, name: &str) -> Authenticator {
    let mut a = Authenticator::new(app.base());
    let options = fresh_options(app, token).await;
    assert_eq!(options["enrolment"]["code_required"], true, "{options}");
    let mut reg = a.register(&options, name);
    reg["enrolment_code"] = json!(enrolment_code(app, sub).await);
    let (status, body) = operator(app, Method::POST, "/operator/v1/passkeys", token, Some(reg)).await;
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
    let mut ritas = register(&app, &rita, "rita", "rita's laptop").await;
    let mut bobs = register(&app, &bob, "bob", "bob's phone").await;
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
    // The tier starts at its amount: KES 5,000.00 needs a passkey, a cent less does not.
    let at = call(&agent, "create_payment", pay_args(&format!("{label}-at-tier"), "5000.00", None)).await;
    assert_eq!(
        (code(&at).as_str(), err(&at)["passkey_required"].as_bool()),
        ("APPROVAL_REQUIRED", Some(true)),
        "{label}"
    );
    let below = call(&agent, "create_payment", pay_args(&format!("{label}-below-tier"), "4999.99", None)).await;
    assert_eq!(err(&below)["passkey_required"].as_bool(), Some(false), "{label}");
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
    // A confirm-only sign-in cannot register a passkey on its own say either.
    let a = Authenticator::new(app.base());
    let reg = a.register(&fresh_options(&app, &pat).await, "pat's phone");
    let (status, body) = operator(&app, Method::POST, "/operator/v1/passkeys", &pat, Some(reg)).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (403, Some("ENROLMENT_REQUIRED")), "{body}");
    let mut pats = register(&app, &pat, "pat", "pat's phone").await;
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
    // Bob cannot register with Rita's challenge (even with a code of his own); an auditor cannot
    // register at all.
    let mut stolen = a.register(&options, "x");
    stolen["enrolment_code"] = json!(enrolment_code(&app, "bob").await);
    let (status, body) = operator(&app, Method::POST, "/operator/v1/passkeys", &bob, Some(stolen)).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{body}");
    let auditor = app.operator_token("ann", "payments:audit");
    let (status, _) = operator(&app, Method::POST, "/operator/v1/passkeys/options", &auditor, None).await;
    assert_eq!(status, 403);
    // Another origin's ceremony is refused; the right one registers once.
    let code = enrolment_code(&app, "rita").await;
    let mut elsewhere = Authenticator::new("http://localhost:1");
    elsewhere.rp_id = "localhost".into();
    let mut reg = elsewhere.register(&options, "x");
    reg["enrolment_code"] = json!(code);
    let (status, _) = operator(&app, Method::POST, "/operator/v1/passkeys", &rita, Some(reg)).await;
    assert_eq!(status, 400);
    let mut reg = a.register(&options, "laptop");
    reg["enrolment_code"] = json!(code);
    let (status, _) = operator(&app, Method::POST, "/operator/v1/passkeys", &rita, Some(reg.clone())).await;
    assert_eq!(status, 201, "the refusals before changed nothing: the challenge and the code still worked");
    // The same ceremony again: its code is used (and its challenge spent). The same credential
    // under a new challenge and a new code: registered already (and the code is not used up by
    // the refusal).
    let (status, body) = operator(&app, Method::POST, "/operator/v1/passkeys", &rita, Some(reg)).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (403, Some("ENROLMENT_CODE_INVALID")), "{body}");
    let code = enrolment_code(&app, "rita").await;
    let mut again = a.register(&fresh_options(&app, &rita).await, "laptop");
    again["enrolment_code"] = json!(code);
    let (status, body) = operator(&app, Method::POST, "/operator/v1/passkeys", &rita, Some(again)).await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (409, Some("CONFLICT")), "{body}");
    let b = Authenticator::new(app.base());
    let mut other = b.register(&fresh_options(&app, &rita).await, "phone");
    other["enrolment_code"] = json!(code);
    let (status, body) = operator(&app, Method::POST, "/operator/v1/passkeys", &rita, Some(other)).await;
    assert_eq!(status, 201, "{body}");
    let (_, mine) = operator(&app, Method::GET, "/operator/v1/passkeys", &rita, None).await;
    assert_eq!(mine["items"].as_array().unwrap().len(), 2);
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

// ---- enrolment: what a bearer token alone cannot do ---------------------------------------------

async fn post_registration(app: &TestApp, token: &str, reg: Value) -> (u16, Option<String>, Value) {
    let (status, body) = operator(app, Method::POST, "/operator/v1/passkeys", token, Some(reg)).await;
    (status.as_u16(), body["error"]["code"].as_str().map(str::to_string), body)
}

async fn live_passkeys(app: &TestApp, token: &str) -> usize {
    let (status, mine) = operator(app, Method::GET, "/operator/v1/passkeys", token, None).await;
    assert_eq!(status, 200, "{mine}");
    mine["items"].as_array().unwrap().iter().filter(|p| p["revoked_at"].is_null()).count()
}

/// The hostile review's finding, and the rules that answer it, on one engine: a bearer token alone
/// (an approver's or a confirm-only user's) registers nothing; an enrolment code works once, for
/// its owner only, before it expires, and only when someone else issued it; one challenge
/// registers one credential; a second passkey needs an assertion by a live first one; every
/// registration is audited and announced.
async fn enrolment_scenario(extra: &[(&str, &str)], label: &str) {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(paygate::clock::ManualClock::new(now_secs()));
    let mut extra = extra.to_vec();
    extra.push(("PAYGATE_PASSKEYS__ENROLMENT_CODE_TTL_SECS", "120"));
    let app = start_with_clock(dir.path(), &extra, clock.clone()).await;
    let rita = app.operator_token("rita", "payments:approve payments:audit");
    let bob = app.operator_token("bob", "payments:approve");
    let pat = app.operator_token("pat", "payments:confirm");
    let mut codes = Vec::new();

    // 1. The bearer token alone: refused, for an approver and for a confirm-only user alike.
    for (who, token) in [("rita", &rita), ("pat", &pat)] {
        let a = Authenticator::new(app.base());
        let (status, code, body) =
            post_registration(&app, token, a.register(&fresh_options(&app, token).await, "mine")).await;
        assert_eq!((status, code.as_deref()), (403, Some("ENROLMENT_REQUIRED")), "{label}: {who}: {body}");
        assert_eq!(live_passkeys(&app, token).await, 0, "{label}: {who}: nothing registered");
    }

    // 2. Who may issue a code: an admin, for someone else.
    let admin_rita = app.operator_token("rita", "payments:admin");
    let (status, body) = operator(
        &app,
        Method::POST,
        "/operator/v1/passkeys/enrolment-codes",
        &admin_rita,
        Some(json!({"owner": "rita"})),
    )
    .await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (403, Some("SELF_REVIEW")), "{label}: {body}");
    let (status, body) =
        operator(&app, Method::POST, "/operator/v1/passkeys/enrolment-codes", &bob, Some(json!({"owner": "rita"})))
            .await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (403, Some("INSUFFICIENT_SCOPE")), "{label}: {body}");
    let (status, body) =
        operator(&app, Method::POST, "/operator/v1/passkeys/enrolment-codes", &admin_rita, Some(json!({"owner": ""})))
            .await;
    assert_eq!((status.as_u16(), body["error"]["code"].as_str()), (400, Some("INVALID_ARGUMENT")), "{label}: {body}");

    // 3. A code is its owner's only, and works once.
    let bobs_code = enrolment_code(&app, "bob").await;
    let ritas_code = enrolment_code(&app, "rita").await;
    codes.extend([bobs_code.clone(), ritas_code.clone()]);
    let mut ritas = Authenticator::new(app.base());
    let options = fresh_options(&app, &rita).await;
    for (wrong, why) in
        [(bobs_code.as_str(), "bob's code"), ("0000-0000-0000-0000-0000-0000-0000-0000", "a guess"), ("x", "junk")]
    {
        let mut reg = ritas.register(&options, "laptop");
        reg["enrolment_code"] = json!(wrong);
        let (status, code, body) = post_registration(&app, &rita, reg).await;
        assert_eq!((status, code.as_deref()), (403, Some("ENROLMENT_CODE_INVALID")), "{label}: {why}: {body}");
    }
    let mut reg = ritas.register(&options, "laptop");
    reg["enrolment_code"] = json!(ritas_code);
    let (status, _, body) = post_registration(&app, &rita, reg).await;
    assert_eq!(status, 201, "{label}: refusals spent neither the challenge nor the code: {body}");
    let other = Authenticator::new(app.base());
    let mut reg = other.register(&fresh_options(&app, &rita).await, "second laptop");
    reg["enrolment_code"] = json!(ritas_code);
    let (status, code, body) = post_registration(&app, &rita, reg).await;
    assert_eq!((status, code.as_deref()), (403, Some("ENROLMENT_CODE_INVALID")), "{label}: a used code: {body}");
    // Bob's code still works for bob.
    let mut bobs = Authenticator::new(app.base());
    let mut reg = bobs.register(&fresh_options(&app, &bob).await, "bob's phone");
    reg["enrolment_code"] = json!(bobs_code);
    assert_eq!(post_registration(&app, &bob, reg).await.0, 201, "{label}");

    // 4. An expired code registers nothing.
    let late = enrolment_code(&app, "pat").await;
    codes.push(late.clone());
    clock.advance(121);
    let pats = Authenticator::new(app.base());
    let mut reg = pats.register(&fresh_options(&app, &pat).await, "pat's phone");
    reg["enrolment_code"] = json!(late);
    let (status, code, body) = post_registration(&app, &pat, reg).await;
    assert_eq!((status, code.as_deref()), (403, Some("ENROLMENT_CODE_INVALID")), "{label}: expired: {body}");
    assert_eq!(live_passkeys(&app, &pat).await, 0, "{label}");
    // A fresh one does, for the confirm-only user too.
    let mut reg = pats.register(&fresh_options(&app, &pat).await, "pat's phone");
    let fresh = enrolment_code(&app, "pat").await;
    codes.push(fresh.clone());
    reg["enrolment_code"] = json!(fresh);
    assert_eq!(post_registration(&app, &pat, reg).await.0, 201, "{label}");

    // 5. One challenge registers one credential, whatever vouches for each.
    let carl = app.operator_token("carl", "payments:approve");
    let (c1, c2) = (enrolment_code(&app, "carl").await, enrolment_code(&app, "carl").await);
    codes.extend([c1.clone(), c2.clone()]);
    let options = fresh_options(&app, &carl).await;
    let (k1, k2) = (Authenticator::new(app.base()), Authenticator::new(app.base()));
    let mut reg = k1.register(&options, "one");
    reg["enrolment_code"] = json!(c1);
    assert_eq!(post_registration(&app, &carl, reg).await.0, 201, "{label}");
    let mut reg = k2.register(&options, "two");
    reg["enrolment_code"] = json!(c2);
    let (status, code, body) = post_registration(&app, &carl, reg).await;
    assert_eq!((status, code.as_deref()), (400, Some("INVALID_ARGUMENT")), "{label}: a spent challenge: {body}");
    assert_eq!(live_passkeys(&app, &carl).await, 1, "{label}");

    // 6. Rita's second passkey: nothing, someone else's passkey, her own over another challenge or
    // over an approval's payload are refused; her own over this registration's challenge works,
    // once; a revoked passkey vouches for nothing.
    let options = fresh_options(&app, &rita).await;
    assert_eq!(options["enrolment"]["code_required"], false, "{label}: {options}");
    assert_eq!(options["enrolment"]["publicKey"]["allowCredentials"][0]["id"], ritas.credential_id().as_str());
    let phone = Authenticator::new(app.base());
    let (status, code, _) = post_registration(&app, &rita, phone.register(&options, "phone")).await;
    assert_eq!((status, code.as_deref()), (403, Some("ENROLMENT_REQUIRED")), "{label}");
    let stale = fresh_options(&app, &rita).await;
    for (assertion, why) in [
        (bobs.vouch(&options), "bob's passkey"),
        (ritas.vouch(&stale), "another registration's challenge"),
        (ritas.sign(&options["publicKey"]["challenge"].to_string()), "another text"),
    ] {
        let mut reg = phone.register(&options, "phone");
        reg["passkey"] = assertion;
        let (status, code, body) = post_registration(&app, &rita, reg).await;
        assert_eq!((status, code.as_deref()), (403, Some("PASSKEY_INVALID")), "{label}: {why}: {body}");
    }
    let vouched = ritas.vouch(&options);
    let mut reg = phone.register(&options, "phone");
    reg["passkey"] = vouched.clone();
    let (status, _, body) = post_registration(&app, &rita, reg).await;
    assert_eq!(status, 201, "{label}: {body}");
    // The same assertion for another ceremony: not signed for it.
    let tablet = Authenticator::new(app.base());
    let mut reg = tablet.register(&fresh_options(&app, &rita).await, "tablet");
    reg["passkey"] = vouched;
    let (status, code, _) = post_registration(&app, &rita, reg).await;
    assert_eq!((status, code.as_deref()), (403, Some("PASSKEY_INVALID")), "{label}: a replayed assertion");
    let cred = ritas.credential_id();
    let (status, _) = operator(&app, Method::POST, &format!("/operator/v1/passkeys/{cred}/revoke"), &rita, None).await;
    assert_eq!(status, 200);
    let options = fresh_options(&app, &rita).await;
    let mut reg = tablet.register(&options, "tablet");
    reg["passkey"] = ritas.vouch(&options);
    let (status, code, _) = post_registration(&app, &rita, reg).await;
    assert_eq!((status, code.as_deref()), (403, Some("PASSKEY_INVALID")), "{label}: a revoked passkey");
    assert_eq!(live_passkeys(&app, &rita).await, 1, "{label}: the phone only");

    // 7. Audited: each code issued (by whom, for whom), each registration (owner, credential,
    // what vouched), each refusal; announced: one passkey.registered message per registration.
    let issued = app.audit(ENROLMENT_ADMIN).await;
    let issued: Vec<_> =
        issued.iter().filter(|r| r.tool == "passkeys.enrolment_code" && r.decision == "issued").collect();
    assert_eq!(issued.len(), codes.len(), "{label}: every code issued is audited");
    assert!(issued.iter().any(|r| r.detail.as_deref().is_some_and(|d| d.contains("for rita"))), "{label}");
    let ritas_audit = app.audit("rita").await;
    let registered: Vec<_> =
        ritas_audit.iter().filter(|r| r.tool == "passkeys.register" && r.decision == "registered").collect();
    assert_eq!(registered.len(), 2, "{label}");
    let first = registered.iter().find(|r| r.detail.as_deref().unwrap_or("").contains(&ritas.credential_id())).unwrap();
    assert!(first.detail.as_deref().unwrap().contains(&format!("issued by {ENROLMENT_ADMIN}")), "{label}: {first:?}");
    assert!(
        ritas_audit.iter().any(|r| r.tool == "passkeys.register" && r.code.as_deref() == Some("ENROLMENT_REQUIRED"))
    );
    assert!(
        ritas_audit.iter().any(|r| r.tool == "passkeys.enrolment_code" && r.code.as_deref() == Some("SELF_REVIEW"))
    );
    let auditor = app.operator_token("ann", "payments:audit");
    let (status, hooks) = operator(&app, Method::GET, "/operator/v1/webhooks?limit=100", &auditor, None).await;
    assert_eq!(status, 200, "{hooks}");
    let announced: Vec<&Value> =
        hooks["items"].as_array().unwrap().iter().filter(|m| m["event"] == "passkey.registered").collect();
    assert_eq!(announced.len(), 5, "{label}: rita ×2, bob, pat, carl; the refusals none: {hooks}");
    let of_rita =
        announced.iter().find(|m| m["body"]["data"]["credential_id"] == ritas.credential_id().as_str()).unwrap();
    let data = &of_rita["body"]["data"];
    assert_eq!(
        (data["owner"].as_str(), data["registered_with"].as_str(), data["code_issued_by"].as_str()),
        (Some("rita"), Some("enrolment_code"), Some(ENROLMENT_ADMIN)),
        "{label}: {data}"
    );
    let of_phone =
        announced.iter().find(|m| m["body"]["data"]["credential_id"] == phone.credential_id().as_str()).unwrap();
    assert_eq!(of_phone["body"]["data"]["vouching_credential_id"], ritas.credential_id().as_str(), "{label}");
    let codes: Vec<&str> = codes.iter().map(String::as_str).collect();
    assert!(!hooks.to_string().contains(codes[0]), "{label}: no code in a webhook");
    assert_not_logged(&codes);
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn a_bearer_token_alone_cannot_enrol_a_passkey_on_sqlite() {
    enrolment_scenario(&[], "sqlite").await;
}

#[tokio::test]
async fn a_bearer_token_alone_cannot_enrol_a_passkey_on_postgres() {
    let Some(db) = database("passkey enrolment (postgres)") else { return };
    let schema = db.schema.clone();
    let overrides = [("PAYGATE_STORAGE__URL", db.url.as_str()), ("PAYGATE_STORAGE__POSTGRES_SCHEMA", schema.as_str())];
    enrolment_scenario(&overrides, "postgres").await;
}

/// The same challenge and codes answered at once, many times: one credential per challenge, one
/// per code, never more.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_registrations_on_one_challenge_register_one_passkey() {
    let dir = tempfile::tempdir().unwrap();
    let app = Arc::new(start(dir.path(), &[]).await);
    let dana = app.operator_token("dana", "payments:approve");
    let options = fresh_options(&app, &dana).await;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..6 {
        let (app, dana, options) = (app.clone(), dana.clone(), options.clone());
        let code = enrolment_code(&app, "dana").await;
        tasks.spawn(async move {
            let mut reg = Authenticator::new(app.base()).register(&options, &format!("key {n}"));
            reg["enrolment_code"] = json!(code);
            post_registration(&app, &dana, reg).await.0
        });
    }
    let mut statuses = Vec::new();
    while let Some(s) = tasks.join_next().await {
        statuses.push(s.unwrap());
    }
    statuses.sort();
    assert_eq!(statuses, vec![201, 400, 400, 400, 400, 400]);
    assert_eq!(live_passkeys(&app, &dana).await, 1);
}

/// The command line at the box issues a code (printed once, stored as a hash, audited) that
/// registers the person's first passkey; the gateway never sees it in a request but that one.
#[tokio::test]
async fn the_command_line_issues_an_enrolment_code_out_of_band() {
    let dir = tempfile::tempdir().unwrap();
    // The data directory first (the gateway creates its store and keys), then the command.
    let app = start(dir.path(), &[]).await;
    let base = app.base().to_string();
    app.stop().await;
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
        .args(["passkeys", "enrol-code", "--owner", "erin"])
        .env("PAYGATE_CONFIG", dir.path().join("test-config.toml"))
        .env("PAYGATE_STORAGE__DATA_DIR", dir.path())
        .env("PAYGATE_AUTH__DEV_ISSUER", DEV_ISSUER)
        .env("PAYGATE_SERVER__PUBLIC_URL", &base)
        .env(
            "PAYGATE_WEBHOOK_SECRET_OPS",
            format!("whsec_{}", base64::engine::general_purpose::STANDARD.encode([7u8; 32])),
        )
        .env("USER", "root-at-the-box")
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    let code = String::from_utf8(out.stdout).unwrap().trim().to_string();
    assert_eq!(code.len(), 39, "{code}");
    let app = start(dir.path(), &[]).await;
    let erin = app.operator_token("erin", "payments:approve");
    let a = Authenticator::new(app.base());
    let mut reg = a.register(&fresh_options(&app, &erin).await, "erin's key");
    reg["enrolment_code"] = json!(code);
    let (status, _, body) = post_registration(&app, &erin, reg).await;
    assert_eq!(status, 201, "{body}");
    let audit = app.audit("cli:root-at-the-box").await;
    assert!(audit.iter().any(|r| r.tool == "passkeys.enrolment_code" && r.decision == "issued"), "{audit:?}");
    assert!(!audit.iter().any(|r| r.detail.as_deref().unwrap_or("").contains(&code)), "the code is not audited");
    app.stop().await;
}
