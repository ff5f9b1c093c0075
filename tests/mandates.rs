//! Mandates from the agent's side, black box: a real gateway over HTTP. Tampering, theft, expiry,
//! intent mismatch, reuse, open-mandate constraints (also under concurrency) and the
//! `paygate mandate verify` CLI. Every refusal is checked to have moved nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use common::*;
use paygate::clock::{Clock, ManualClock, SystemClock};
use reqwest::Method;
use serde_json::{Value, json};

/// The agent scopes a second agent gets (no admin).
const AGENT_SCOPES: &str = "payments:read payments:create payments:refund";
/// Other agents get the dev profile (acct-A/acct-B, KES 1000.00 autonomous limit).
const DEV_DEFAULT: (&str, &str) = ("PAYGATE_POLICY__DEFAULT_PROFILE", "dev");
/// For tests that provoke many refusals on purpose: keep the stop rules from suspending the agent
/// half-way (the stop rules have their own tests in tests/governance.rs).
const NO_STOP: (&str, &str) = ("PAYGATE_STOP_RULES__DENIALS_MAX", "10000");
const NO_REPEAT_STOP: (&str, &str) = ("PAYGATE_STOP_RULES__REPEAT_MAX", "0");

/// "1234.56" → 123456, exactly (no floats).
fn minor(s: &str) -> i64 {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    assert!(frac.len() <= 2, "KES has two decimals: {s}");
    int.parse::<i64>().unwrap() * 100 + format!("{frac:0<2}").parse::<i64>().unwrap()
}

/// What the books look like from the agent's side.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Books {
    a: i64,
    b: i64,
    payments: usize,
    b_postings: usize,
}

/// Every item of a paginated list tool, following next_cursor.
async fn count_all(agent: &Client, tool: &str, args: Value, key: &str) -> usize {
    let mut n = 0;
    let mut cursor: Option<String> = None;
    loop {
        let mut a = args.clone();
        a["limit"] = json!(100);
        if let Some(c) = &cursor {
            a["cursor"] = json!(c);
        }
        let r = call(agent, tool, a).await;
        let page = ok(&r);
        n += page[key].as_array().expect("a list").len();
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return n,
        }
    }
}

async fn books(agent: &Client) -> Books {
    Books {
        a: minor(&balance(agent, "acct-A").await),
        b: minor(&balance(agent, "acct-B").await),
        payments: count_all(agent, "list_payments", json!({}), "payments").await,
        b_postings: count_all(agent, "get_account_ledger", json!({"account_id": "acct-B"}), "entries").await,
    }
}

/// `before` plus one payment of `amount_minor` from acct-A to acct-B.
fn paid(before: &Books, amount_minor: i64, count: usize) -> Books {
    Books {
        a: before.a - amount_minor,
        b: before.b + amount_minor,
        payments: before.payments + count,
        b_postings: before.b_postings + count,
    }
}

fn payment(op: &str, from: &str, to: &str, amount: &str, currency: &str, mandate: Option<&str>) -> Value {
    let mut v =
        json!({"operation_id": op, "from_account": from, "to_account": to, "amount": amount, "currency": currency});
    if let Some(m) = mandate {
        v["mandate"] = json!(m);
    }
    v
}

async fn pay(
    agent: &Client,
    op: &str,
    from: &str,
    to: &str,
    amount: &str,
    currency: &str,
    mandate: Option<&str>,
) -> rmcp::model::CallToolResult {
    call(agent, "create_payment", payment(op, from, to, amount, currency, mandate)).await
}

/// The agent asks for acct-A → acct-B `amount` (over its limit) and gets an approval id.
async fn request_approval(agent: &Client, op: &str, amount: &str) -> String {
    let r = pay(agent, op, "acct-A", "acct-B", amount, "KES", None).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED");
    err(&r)["approval_id"].as_str().unwrap().to_string()
}

/// The mandate of an approved approval, as the agent fetches it.
async fn agent_mandate(agent: &Client, approval_id: &str) -> String {
    let r = call(agent, "get_approval", json!({"approval_id": approval_id})).await;
    assert_eq!(ok(&r)["status"], "approved");
    ok(&r)["mandate"].as_str().expect("the agent receives its mandate").to_string()
}

/// Request acct-A → acct-B `amount`, have alice approve it, fetch the closed mandate.
async fn approved_mandate(app: &TestApp, agent: &Client, op: &str, amount: &str) -> (String, String) {
    let approval_id = request_approval(agent, op, amount).await;
    let (status, body) = approve(app, &approval_id, "alice").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "approved");
    let mandate = agent_mandate(agent, &approval_id).await;
    (approval_id, mandate)
}

/// POST /approvals as alice; returns the approval view (201).
async fn preauthorize(app: &TestApp, body: Value) -> Value {
    let token = app.operator_token("alice", "payments:approve");
    let (status, view) = operator(app, Method::POST, "/approvals", &token, Some(body)).await;
    assert_eq!(status, 201, "{view}");
    view
}

fn open_mandate_body(per_payment_max: &str, budget: &str, max_uses: i64) -> Value {
    json!({"subject": "dev-agent", "kind": "open", "currency": "KES",
           "payer": "acct-A", "payees": ["acct-B"], "per_payment_max": per_payment_max, "budget": budget,
           "max_uses": max_uses, "valid_for_secs": 3600})
}

/// The (unverified) claims of a compact JWS.
fn claims(jws: &str) -> Value {
    let payload = jws.split('.').nth(1).expect("three parts");
    serde_json::from_slice(&B64.decode(payload).unwrap()).unwrap()
}

/// The same JWS with its payload edited and re-encoded, signature kept (not re-signed).
fn forge(jws: &str, edit: impl FnOnce(&mut Value)) -> String {
    let parts: Vec<&str> = jws.split('.').collect();
    let mut c = claims(jws);
    edit(&mut c);
    format!("{}.{}.{}", parts[0], B64.encode(c.to_string()), parts[2])
}

/// The same JWS with its header replaced.
fn reheader(jws: &str, header: Value, signature: &str) -> String {
    let parts: Vec<&str> = jws.split('.').collect();
    format!("{}.{}.{signature}", B64.encode(header.to_string()), parts[1])
}

/// The claims of `jws` re-signed HS256 under its own kid, with the published public key (the raw
/// 32 bytes of the JWKS `x`) as the HMAC secret.
async fn hs256_with_public_key(app: &TestApp, jws: &str) -> String {
    let header: Value = serde_json::from_slice(&B64.decode(jws.split('.').next().unwrap()).unwrap()).unwrap();
    let kid = header["kid"].as_str().unwrap();
    let jwks: Value =
        reqwest::get(format!("{}/.well-known/mandate-jwks.json", app.base())).await.unwrap().json().await.unwrap();
    let x = jwks["keys"].as_array().unwrap().iter().find(|k| k["kid"] == kid).expect("signing key published")["x"]
        .as_str()
        .unwrap()
        .to_string();
    hs256_signed(jws, kid, &B64.decode(x).unwrap())
}

/// The claims of `jws` re-signed HS256 under `kid` with the secret in `key_file`.
fn hs256_with(jws: &str, kid: &str, key_file: &std::path::Path) -> String {
    hs256_signed(jws, kid, std::fs::read_to_string(key_file).unwrap().trim().as_bytes())
}

fn hs256_signed(jws: &str, kid: &str, secret: &[u8]) -> String {
    use hmac::{Hmac, Mac};
    let header = json!({"alg": "HS256", "typ": "paygate-mandate+jwt", "kid": kid});
    let input = format!("{}.{}", B64.encode(header.to_string()), jws.split('.').nth(1).unwrap());
    let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
    mac.update(input.as_bytes());
    format!("{input}.{}", B64.encode(mac.finalize().into_bytes()))
}

fn count_audit(records: &[paygate::domain::audit::AuditRecord], tool: &str, decision: &str, code: &str) -> usize {
    records.iter().filter(|a| a.tool == tool && a.decision == decision && a.code.as_deref() == Some(code)).count()
}

/// The stop-67 review (medium–high): an operator revoked a mandate, then a database writer cleared
/// `revoked_at` in its row, and the mandate paid again. The revocation is on the trail under the
/// writer's tag, and the gateway reads it there too: the mandate stays revoked.
#[tokio::test]
async fn a_revocation_cleared_in_the_database_still_stands() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[DEV_DEFAULT, NO_REPEAT_STOP]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let (approval_id, mandate) = approved_mandate(&app, &agent, "revoked-1", "5000.00").await;
    let bob = app.operator_token("bob", "payments:approve");
    let path = format!("/approvals/{approval_id}/revoke");
    let (status, body) =
        operator(&app, reqwest::Method::POST, &path, &bob, Some(json!({"reason": "wrong payee"}))).await;
    assert_eq!(status, 200, "{body}");
    // Asked again without the mandate, the agent is told it was revoked (the second stop-68
    // review: it was sent to fetch the revoked mandate, round and round).
    let r = pay(&agent, "revoked-1", "acct-A", "acct-B", "5000.00", "KES", None).await;
    assert_eq!(code(&r), "MANDATE_INVALID", "{r:?}");
    assert!(err(&r)["message"].as_str().unwrap().contains("revoked"), "{r:?}");
    let before = books(&agent).await;
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    let cleared = db
        .execute("UPDATE mandates SET revoked_at = NULL, revoked_by = NULL WHERE approval_id = ?1", [&approval_id])
        .unwrap();
    assert_eq!(cleared, 1);
    let r = pay(&agent, "revoked-1", "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)).await;
    assert_eq!(code(&r), "MANDATE_INVALID", "{r:?}");
    assert!(err(&r)["message"].as_str().unwrap().contains("revoked"), "{r:?}");
    // Its record edited too (verify names that): the revocation still stands, never fails open.
    let edited = db.execute("UPDATE audit_records SET tag = NULL WHERE tool = 'mandates.revoke'", []).unwrap();
    assert_eq!(edited, 1);
    let r = pay(&agent, "revoked-1", "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)).await;
    assert_eq!(code(&r), "MANDATE_INVALID", "{r:?}");
    assert_eq!(books(&agent).await, before, "nothing moved");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The second stop-67 review (medium-high): a revocation answered 200 while a trigger swallowed its
/// audit record, and with `revoked_at` then cleared the mandate paid. The record is written in the
/// revocation's transaction now: swallowed, the revocation fails as a whole and says so.
#[tokio::test]
async fn a_revocation_is_never_answered_without_its_record() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[DEV_DEFAULT, NO_REPEAT_STOP]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let (approval_id, _mandate) = approved_mandate(&app, &agent, "swallowed-1", "5000.00").await;
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    db.execute_batch(
        "CREATE TRIGGER s BEFORE INSERT ON audit_records WHEN NEW.tool = 'mandates.revoke' \
         BEGIN SELECT RAISE(IGNORE); END;",
    )
    .unwrap();
    let bob = app.operator_token("bob", "payments:approve");
    let path = format!("/approvals/{approval_id}/revoke");
    let (status, body) =
        operator(&app, reqwest::Method::POST, &path, &bob, Some(json!({"reason": "wrong payee"}))).await;
    assert!(status.is_server_error(), "a revocation without its record is not answered as done: {status} {body}");
    let revoked: Option<i64> =
        db.query_row("SELECT revoked_at FROM mandates WHERE approval_id = ?1", [&approval_id], |r| r.get(0)).unwrap();
    assert_eq!(revoked, None, "nothing half-done: the mandate's row is as it was");
    // Without the trigger the same revocation goes through, with its record.
    db.execute_batch("DROP TRIGGER s;").unwrap();
    let (status, body) =
        operator(&app, reqwest::Method::POST, &path, &bob, Some(json!({"reason": "wrong payee"}))).await;
    assert_eq!(status, 200, "{body}");
    let records: i64 = db
        .query_row(
            "SELECT count(*) FROM audit_records WHERE tool = 'mandates.revoke' AND approval_id = ?1",
            [&approval_id],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(records, 1);
    let _ = agent.cancel().await;
    app.stop().await;
}

// 1 ───────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn tampered_mandates_are_refused_and_move_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[DEV_DEFAULT, NO_STOP, NO_REPEAT_STOP]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let other = connect(&app.url, &app.token("other-agent", AGENT_SCOPES), Era::Modern).await;

    let (approval_id, mandate) = approved_mandate(&app, &agent, "tamper-1", "5000.00").await;
    let decoy = request_approval(&agent, "tamper-decoy", "6000.00").await;
    let original = claims(&mandate);
    assert_eq!(original["approval_id"], approval_id);
    assert_eq!(original["amount_minor"], 500_000);
    let exp = original["exp"].as_i64().unwrap();
    let before = books(&agent).await;

    // Each forgery is paired with the call it would authorize if the signature were not checked.
    let cases: [(&str, Value, bool, [&str; 4]); 7] = [
        ("amount_minor", json!(500_001), false, ["acct-A", "acct-B", "5000.01", "KES"]),
        ("amount_minor", json!(10_000_000), false, ["acct-A", "acct-B", "100000.00", "KES"]),
        ("payee", json!("acct-Z"), false, ["acct-A", "acct-Z", "5000.00", "KES"]),
        ("payer", json!("acct-Z"), false, ["acct-Z", "acct-B", "5000.00", "KES"]),
        ("sub", json!("other-agent"), true, ["acct-A", "acct-B", "5000.00", "KES"]),
        ("exp", json!(exp + 86_400), false, ["acct-A", "acct-B", "5000.00", "KES"]),
        ("currency", json!("USD"), false, ["acct-A", "acct-B", "5000.00", "USD"]),
    ];
    let mut refused_dev = 0;
    let mut refused_other = 0;
    for (i, (field, value, as_other, [from, to, amount, currency])) in cases.into_iter().enumerate() {
        let forged = forge(&mandate, |c| c[field] = value);
        assert_ne!(forged, mandate);
        let client = if as_other { &other } else { &agent };
        let r = pay(client, &format!("forged-{i}"), from, to, amount, currency, Some(&forged)).await;
        assert_eq!(code(&r), "MANDATE_INVALID", "tampered {field}");
        assert_eq!(books(&agent).await, before, "tampered {field}: nothing moved");
        if as_other { refused_other += 1 } else { refused_dev += 1 }
    }
    // approval_id swapped for another real (pending) approval of the same agent.
    let forged = forge(&mandate, |c| c["approval_id"] = json!(decoy));
    let r = pay(&agent, "forged-approval", "acct-A", "acct-B", "5000.00", "KES", Some(&forged)).await;
    assert_eq!(code(&r), "MANDATE_INVALID", "tampered approval_id");
    refused_dev += 1;

    // The signature itself: one character changed, stripped, or the header downgraded.
    let parts: Vec<&str> = mandate.split('.').collect();
    let mut sig = parts[2].to_string();
    sig.replace_range(0..1, if sig.starts_with('A') { "B" } else { "A" });
    let header = |alg: &str, kid: &str| json!({"alg": alg, "typ": "paygate-mandate+jwt", "kid": kid});
    for (what, bad) in [
        ("changed signature", format!("{}.{}.{sig}", parts[0], parts[1])),
        ("no signature", format!("{}.{}.", parts[0], parts[1])),
        ("alg none", reheader(&mandate, header("none", "mk1"), "")),
        ("unknown kid", reheader(&mandate, header("EdDSA", "mk-evil"), parts[2])),
        // Algorithm confusion: the published Ed25519 key used as an HMAC secret under its own kid.
        ("HS256 under the public key", hs256_with_public_key(&app, &mandate).await),
        // HS256 under the old key id, signed with the mandate secret: no migration window is open.
        ("HS256 outside its window", hs256_with(&mandate, "mk1", &app.data_dir.join("mandate.key"))),
        ("not a JWS", "not.a.mandate".to_string()),
    ] {
        let r = pay(&agent, "forged-signature", "acct-A", "acct-B", "5000.00", "KES", Some(&bad)).await;
        assert_eq!(code(&r), "MANDATE_INVALID", "{what}");
        refused_dev += 1;
    }
    assert_eq!(books(&agent).await, before, "no forgery moved money");

    // Every refusal was audited as a denial of the agent that tried it.
    assert_eq!(count_audit(&app.audit("dev-agent").await, "create_payment", "denied", "MANDATE_INVALID"), refused_dev);
    assert_eq!(
        count_audit(&app.audit("other-agent").await, "create_payment", "denied", "MANDATE_INVALID"),
        refused_other
    );

    // The genuine mandate was not consumed by any of that: it pays, exactly once.
    let r = pay(&agent, "tamper-1", "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)).await;
    assert_eq!(ok(&r)["replayed"], false);
    assert_eq!(books(&agent).await, paid(&before, 500_000, 1));

    agent.cancel().await.unwrap();
    other.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 2 ───────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn a_mandate_is_useless_to_another_subject() {
    let dir = tempfile::tempdir().unwrap();
    // The thief offers the mandate twice on purpose (the no-progress rule has its own test).
    let app = spawn_on(dir.path(), &[DEV_DEFAULT, NO_REPEAT_STOP]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let other = connect(&app.url, &app.token("other-agent", AGENT_SCOPES), Era::Legacy).await;

    let (approval_id, mandate) = approved_mandate(&app, &agent, "theft-1", "5000.00").await;
    assert_eq!(claims(&mandate)["sub"], "dev-agent");
    let before = books(&agent).await;

    // The other agent presents the stolen mandate for exactly the approved payment.
    for op in ["theft-1", "theft-2"] {
        let r = pay(&other, op, "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)).await;
        assert_eq!(code(&r), "MANDATE_INVALID", "{op}");
        assert_eq!(books(&agent).await, before);
    }
    // It has the same profile: without a mandate the payment needs a human, so the mandate was
    // the only thing refused.
    let r = pay(&other, "theft-3", "acct-A", "acct-B", "5000.00", "KES", None).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED");
    // It cannot fetch the approval either.
    let r = call(&other, "get_approval", json!({"approval_id": approval_id})).await;
    assert_eq!(code(&r), "NOT_FOUND");
    assert_eq!(books(&agent).await, before);
    assert_eq!(count_audit(&app.audit("other-agent").await, "create_payment", "denied", "MANDATE_INVALID"), 2);

    // The rightful agent still pays with it, once.
    let r = pay(&agent, "theft-1", "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)).await;
    assert_eq!(ok(&r)["replayed"], false);
    assert_eq!(books(&agent).await, paid(&before, 500_000, 1));

    agent.cancel().await.unwrap();
    other.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 3 ───────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn an_expired_mandate_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(SystemClock.now());
    let app = spawn_with_clock(dir.path(), &[], Arc::new(clock.clone())).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Legacy).await;

    // Two mandates issued at the same instant.
    let (_, early) = approved_mandate(&app, &agent, "late-1", "5000.00").await;
    let (_, late) = approved_mandate(&app, &agent, "late-2", "6000.00").await;
    let c = claims(&early);
    assert_eq!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(), 3600, "mandates.ttl_secs default");
    assert_eq!(claims(&late)["exp"], c["exp"]);
    agent.cancel().await.unwrap();

    // One second before expiry the first still pays (fresh token and client: time moved).
    clock.advance(3599);
    let agent = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let before = books(&agent).await;
    let r = pay(&agent, "late-1", "acct-A", "acct-B", "5000.00", "KES", Some(&early)).await;
    assert_eq!(ok(&r)["replayed"], false);
    let after = paid(&before, 500_000, 1);
    assert_eq!(books(&agent).await, after);
    agent.cancel().await.unwrap();

    // At exp, and past it, the second is expired.
    for step in [1, 3600] {
        clock.advance(step);
        let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
        let r = pay(&agent, "late-2", "acct-A", "acct-B", "6000.00", "KES", Some(&late)).await;
        assert_eq!(code(&r), "MANDATE_EXPIRED", "advanced {step}");
        assert_eq!(books(&agent).await, after);
        agent.cancel().await.unwrap();
    }
    let audit = app.audit("dev-agent").await;
    assert_eq!(count_audit(&audit, "create_payment", "denied", "MANDATE_EXPIRED"), 2);

    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 4 ───────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn a_call_differing_from_its_mandate_is_a_mismatch() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let (_, mandate) = approved_mandate(&app, &agent, "exact-1", "5000.00").await;
    // A pre-authorized mandate to acct-Z: with it, acct-A → acct-B differs only in the payee.
    let view = preauthorize(
        &app,
        json!({"subject": "dev-agent", "kind": "closed", "currency": "KES",
               "payer": "acct-A", "payee": "acct-Z", "amount": "5000.00"}),
    )
    .await;
    assert_eq!(view["status"], "approved");
    let to_z = agent_mandate(&agent, view["approval_id"].as_str().unwrap()).await;
    let before = books(&agent).await;

    let cases: [(&str, &str, [&str; 4]); 6] = [
        // acct-B is on the allow-list: only the mandate stands in the way.
        ("payer", mandate.as_str(), ["acct-B", "acct-A", "5000.00", "KES"]),
        ("payee", to_z.as_str(), ["acct-A", "acct-B", "5000.00", "KES"]),
        ("amount", mandate.as_str(), ["acct-A", "acct-B", "5000.01", "KES"]),
        ("amount", mandate.as_str(), ["acct-A", "acct-B", "4999.99", "KES"]),
        // Under the autonomous limit a mandate is not needed, but one that is passed must match.
        ("amount", mandate.as_str(), ["acct-A", "acct-B", "999.00", "KES"]),
        ("currency", mandate.as_str(), ["acct-A", "acct-B", "5000.00", "USD"]),
    ];
    for (i, (what, m, [from, to, amount, currency])) in cases.into_iter().enumerate() {
        let r = pay(&agent, &format!("mismatch-{i}"), from, to, amount, currency, Some(m)).await;
        assert_eq!(code(&r), "MANDATE_MISMATCH", "{what}");
        let message = err(&r)["message"].as_str().unwrap();
        assert!(message.contains(what), "{what}: {message}");
        assert_eq!(books(&agent).await, before, "{what}: nothing moved");
    }
    let audit = app.audit("dev-agent").await;
    assert_eq!(count_audit(&audit, "create_payment", "denied", "MANDATE_MISMATCH"), 6);

    // The mandate still pays the exact payment it pins.
    let r = pay(&agent, "exact-1", "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)).await;
    assert_eq!(ok(&r)["replayed"], false);
    let payment_id = ok(&r)["payment_id"].as_str().unwrap().to_string();
    let after = paid(&before, 500_000, 1);
    assert_eq!(books(&agent).await, after);

    // A create_payment mandate does not authorize refunding that payment (it needs its own approval).
    let refund = |mandate: Option<&str>| {
        let mut a = json!({"operation_id": "exact-refund", "payment_id": payment_id, "amount": "5000.00"});
        if let Some(m) = mandate {
            a["mandate"] = json!(m);
        }
        a
    };
    let r = call(&agent, "refund_payment", refund(None)).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED");
    let r = call(&agent, "refund_payment", refund(Some(&mandate))).await;
    assert_eq!(code(&r), "MANDATE_MISMATCH");
    assert_eq!(books(&agent).await, after);

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 5 ───────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn a_closed_mandate_pays_once_and_replays() {
    // It offers the mandate again under new operation_ids on purpose (the no-progress rule has its own test).
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[NO_REPEAT_STOP]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let (_, mandate) = approved_mandate(&app, &agent, "once-1", "5000.00").await;
    let before = books(&agent).await;

    let first = pay(&agent, "once-1", "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)).await;
    assert_eq!(ok(&first)["replayed"], false);
    let payment_id = ok(&first)["payment_id"].clone();
    let after = paid(&before, 500_000, 1);
    assert_eq!(books(&agent).await, after);

    // A new operation_id with the same mandate is a second payment: refused (the mandate pins the
    // operation the human approved; the race test below covers single use without that pin).
    for op in ["once-2", "once-3"] {
        let r = pay(&agent, op, "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)).await;
        assert_eq!(code(&r), "MANDATE_MISMATCH", "{op}");
        assert_eq!(books(&agent).await, after, "{op}: nothing moved");
    }
    // The same operation_id is a retry: it replays the one payment.
    let again = pay(&agent, "once-1", "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)).await;
    assert_eq!(ok(&again)["replayed"], true);
    assert_eq!(ok(&again)["payment_id"], payment_id);
    assert_eq!(books(&agent).await, after);

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_closed_mandate_raced_under_distinct_operation_ids_pays_once() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[NO_STOP, NO_REPEAT_STOP]).await;
    let agent = Arc::new(connect(&app.url, &app.dev_token(), Era::Modern).await);
    // An operator's closed pre-authorization names no operation, so every racer below passes the
    // mandate's checks and single use is left to the posting transaction.
    let view = preauthorize(
        &app,
        json!({"subject": "dev-agent", "kind": "closed", "currency": "KES",
               "payer": "acct-A", "payee": "acct-B", "amount": "5000.00"}),
    )
    .await;
    assert_eq!(view["status"], "approved", "{view}");
    let mandate = agent_mandate(&agent, view["approval_id"].as_str().unwrap()).await;
    let before = books(&agent).await;

    let mut set = tokio::task::JoinSet::new();
    for i in 0..8 {
        let (agent, mandate) = (agent.clone(), mandate.clone());
        set.spawn(async move {
            call(
                &agent,
                "create_payment",
                payment(&format!("race-closed-{i}"), "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)),
            )
            .await
        });
    }
    let results = set.join_all().await;
    let paid_count = results.iter().filter(|r| r.is_error != Some(true)).count();
    assert_eq!(paid_count, 1, "one closed mandate, one payment");
    for r in results.iter().filter(|r| r.is_error == Some(true)) {
        assert_eq!(code(r), "MANDATE_INVALID");
    }
    assert_eq!(books(&agent).await, paid(&before, 500_000, 1));

    Arc::into_inner(agent).unwrap().cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 6 ───────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn an_open_mandate_holds_to_its_constraints() {
    // A still clock: the validity window is counted from the pre-authorization, the mandate's iat
    // from its issuance, and with a real clock a second may tick between the two.
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_clock(dir.path(), &[], Arc::new(ManualClock::new(SystemClock.now()))).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;

    let view = preauthorize(&app, open_mandate_body("1500.00", "3000.00", 3)).await;
    assert_eq!(view["status"], "approved", "below the high-risk tier the creator's approval suffices");
    assert_eq!(view["kind"], "open");
    assert_eq!(view["reviewers_required"], 1);
    assert_eq!(view["approved_by"], json!(["alice"]));
    assert!(view["mandate"].is_null(), "operators do not receive the agent's mandate");
    let mandate = agent_mandate(&agent, view["approval_id"].as_str().unwrap()).await;
    let c = claims(&mandate);
    assert_eq!(c["kind"], "open");
    assert_eq!(c["sub"], "dev-agent");
    assert_eq!(c["payer"], "acct-A");
    assert_eq!(c["payees"], json!(["acct-B"]));
    assert_eq!(c["per_payment_max_minor"], 150_000);
    assert_eq!(c["budget_minor"], 300_000);
    assert_eq!(c["max_uses"], 3);
    assert_eq!(c["jti"], view["mandate_id"]);
    assert_eq!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(), 3600);
    let before = books(&agent).await;

    // 1500.00 is over the autonomous limit: without the mandate it needs a human.
    let r = pay(&agent, "open-0", "acct-A", "acct-B", "1500.00", "KES", None).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED");

    // Outside the constraints: refused, nothing moved.
    for (op, from, to, amount) in [
        ("open-x1", "acct-A", "acct-Z", "100.00"),  // payee not in payees
        ("open-x2", "acct-B", "acct-A", "100.00"),  // payer not the pinned payer, payee not in payees
        ("open-x3", "acct-A", "acct-B", "1500.01"), // over the per-payment maximum
    ] {
        let r = pay(&agent, op, from, to, amount, "KES", Some(&mandate)).await;
        assert_eq!(code(&r), "MANDATE_MISMATCH", "{op}");
        assert_eq!(books(&agent).await, before, "{op}: nothing moved");
    }

    // Within them: two payments at the per-payment maximum spend the budget.
    let mut ids = vec![];
    for op in ["open-1", "open-2"] {
        let r = pay(&agent, op, "acct-A", "acct-B", "1500.00", "KES", Some(&mandate)).await;
        assert_eq!(ok(&r)["replayed"], false, "{op}");
        ids.push(ok(&r)["payment_id"].clone());
    }
    assert_ne!(ids[0], ids[1]);
    let spent = paid(&before, 300_000, 2);
    assert_eq!(books(&agent).await, spent);

    // Budget spent: even 1.00 (which needs no mandate) is refused when drawn on this one.
    let r = pay(&agent, "open-3", "acct-A", "acct-B", "1.00", "KES", Some(&mandate)).await;
    assert_eq!(code(&r), "MANDATE_INVALID");
    assert_eq!(books(&agent).await, spent);
    // A retry of a payment already made replays; it draws nothing more.
    let r = pay(&agent, "open-1", "acct-A", "acct-B", "1500.00", "KES", Some(&mandate)).await;
    assert_eq!(ok(&r)["replayed"], true);
    assert_eq!(ok(&r)["payment_id"], ids[0]);
    assert_eq!(books(&agent).await, spent);

    // Uses: a large budget but two uses.
    let view = preauthorize(&app, open_mandate_body("1500.00", "50000.00", 2)).await;
    assert_eq!(view["status"], "approved");
    let two_uses = agent_mandate(&agent, view["approval_id"].as_str().unwrap()).await;
    for op in ["uses-1", "uses-2"] {
        let r = pay(&agent, op, "acct-A", "acct-B", "100.00", "KES", Some(&two_uses)).await;
        assert_eq!(ok(&r)["replayed"], false, "{op}");
    }
    let used = paid(&spent, 20_000, 2);
    assert_eq!(books(&agent).await, used);
    let r = pay(&agent, "uses-3", "acct-A", "acct-B", "100.00", "KES", Some(&two_uses)).await;
    assert_eq!(code(&r), "MANDATE_INVALID");
    assert_eq!(books(&agent).await, used);

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 7 ───────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_draws_on_an_open_mandate_never_exceed_its_budget() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[NO_STOP, NO_REPEAT_STOP]).await;
    let token = app.dev_token();
    let mut clients = vec![];
    for era in [Era::Legacy, Era::Modern, Era::Legacy, Era::Modern] {
        clients.push(Arc::new(connect(&app.url, &token, era).await));
    }
    let view = preauthorize(&app, open_mandate_body("1500.00", "4500.00", 100)).await;
    let mandate = agent_mandate(&clients[0], view["approval_id"].as_str().unwrap()).await;
    let before = books(&clients[0]).await;

    let mut set = tokio::task::JoinSet::new();
    for i in 0..16 {
        let (client, mandate) = (clients[i % clients.len()].clone(), mandate.clone());
        set.spawn(async move {
            call(
                &client,
                "create_payment",
                payment(&format!("race-open-{i}"), "acct-A", "acct-B", "1500.00", "KES", Some(&mandate)),
            )
            .await
        });
    }
    let results = set.join_all().await;
    let succeeded: Vec<_> = results.iter().filter(|r| r.is_error != Some(true)).collect();
    assert_eq!(succeeded.len(), 3, "the budget covers exactly three payments");
    let mut ids: Vec<String> = succeeded.iter().map(|r| ok(r)["payment_id"].as_str().unwrap().to_string()).collect();
    ids.sort();
    ids.dedup();
    assert_eq!(ids.len(), 3);
    for r in results.iter().filter(|r| r.is_error == Some(true)) {
        assert_eq!(code(r), "MANDATE_INVALID");
    }
    assert_eq!(books(&clients[0]).await, paid(&before, 450_000, 3));

    for c in clients {
        Arc::into_inner(c).unwrap().cancel().await.unwrap();
    }
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 8 ───────────────────────────────────────────────────────────────────────────────────────────────

fn mandate_verify(data_dir: &std::path::Path, jws: &str) -> std::process::Output {
    std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
        .args(["mandate", "verify", jws])
        .env("PAYGATE_STORAGE__DATA_DIR", data_dir)
        .env_remove("PAYGATE_CONFIG")
        .env_remove("PAYGATE_MANDATES__SECRET")
        .output()
        .expect("paygate runs")
}

#[tokio::test]
async fn the_cli_verifies_mandates() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let (approval_id, mandate) = approved_mandate(&app, &agent, "cli-1", "5000.00").await;
    let r = call(&agent, "get_approval", json!({"approval_id": approval_id})).await;
    let mandate_id = ok(&r)["mandate_id"].as_str().unwrap().to_string();

    let out = mandate_verify(&app.data_dir, &mandate);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "valid mandate: {out:?}");
    assert!(stdout.contains(&mandate_id), "{stdout}");
    let printed: Value = serde_json::from_str(&stdout).expect("claims as JSON");
    assert_eq!(printed["jti"], mandate_id);
    assert_eq!(printed["approval_id"], approval_id);
    assert_eq!(printed["sub"], "dev-agent");
    assert_eq!(printed["amount_minor"], 500_000);
    assert_eq!(printed["approvers"], json!(["alice"]));

    for (what, bad) in [
        ("tampered amount", forge(&mandate, |c| c["amount_minor"] = json!(50_000_000))),
        ("tampered payee", forge(&mandate, |c| c["payee"] = json!("acct-Z"))),
        ("garbage", "not.a.mandate".to_string()),
    ] {
        let out = mandate_verify(&app.data_dir, &bad);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{what} must fail: {out:?}");
        assert!(stderr.to_lowercase().contains("invalid"), "{what}: {stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains(&mandate_id), "{what}: no claims printed");
    }

    // Verifying moved nothing; the mandate still pays once.
    let before = books(&agent).await;
    let r = pay(&agent, "cli-1", "acct-A", "acct-B", "5000.00", "KES", Some(&mandate)).await;
    assert_eq!(ok(&r)["replayed"], false);
    assert_eq!(books(&agent).await, paid(&before, 500_000, 1));

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

/// Invariant 1 across mandates: one operation_id moves money once, even when a human approves the
/// same payment twice and the agent tries both mandates under that operation_id.
#[tokio::test]
async fn one_operation_id_pays_once_even_with_two_mandates() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let closed = json!({"subject": "dev-agent", "kind": "closed", "currency": "KES",
                        "payer": "acct-A", "payee": "acct-B", "amount": "2500.00"});
    let first = preauthorize(&app, closed.clone()).await["approval_id"].as_str().unwrap().to_string();
    let second = preauthorize(&app, closed).await["approval_id"].as_str().unwrap().to_string();
    let (m1, m2) = (agent_mandate(&agent, &first).await, agent_mandate(&agent, &second).await);

    let paid = pay(&agent, "order-7", "acct-A", "acct-B", "2500.00", "KES", Some(&m1)).await;
    let payment_id = ok(&paid)["payment_id"].clone();
    // The same operation under the second mandate, and without any mandate, replays.
    for mandate in [Some(m2.as_str()), None] {
        let again = pay(&agent, "order-7", "acct-A", "acct-B", "2500.00", "KES", mandate).await;
        assert_eq!(ok(&again)["payment_id"], payment_id);
        assert_eq!(ok(&again)["replayed"], true);
    }
    assert_eq!(balance(&agent, "acct-B").await, "2500.00");
    // The second mandate is still good for a different operation.
    let other = pay(&agent, "order-8", "acct-A", "acct-B", "2500.00", "KES", Some(&m2)).await;
    assert_eq!(ok(&other)["replayed"], false);
    assert_eq!(balance(&agent, "acct-B").await, "5000.00");
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 10 ──────────────────────────────────────────────────────────────────────────────────────────────

/// GET the served JWKS: its media type, and every key public (no private member).
async fn served_jwks(app: &TestApp) -> Value {
    let resp = reqwest::get(format!("{}/.well-known/mandate-jwks.json", app.base())).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert_eq!(resp.headers()["content-type"], "application/jwk-set+json");
    let jwks: Value = resp.json().await.unwrap();
    for key in jwks["keys"].as_array().unwrap() {
        assert_eq!(
            (key["kty"].as_str(), key["crv"].as_str(), key["alg"].as_str()),
            (Some("OKP"), Some("Ed25519"), Some("EdDSA"))
        );
        assert!(key.get("d").is_none(), "a published key carries no private part: {key}");
    }
    jwks
}

fn kid(jws: &str) -> String {
    let header: Value = serde_json::from_slice(&B64.decode(jws.split('.').next().unwrap()).unwrap()).unwrap();
    assert_eq!(header["alg"], "EdDSA", "{header}");
    header["kid"].as_str().unwrap().to_string()
}

/// Run a command off the test's runtime (the gateway it may fetch from serves on that runtime).
async fn run(mut cmd: std::process::Command) -> std::process::Output {
    tokio::task::spawn_blocking(move || cmd.output().expect("the command runs")).await.unwrap()
}

/// `paygate mandate verify --jwks <url or file>`: no config, no data directory, no secret.
async fn verify_from_jwks(jwks: &str, jws: &str) -> std::process::Output {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"));
    cmd.args(["mandate", "verify", "--jwks", jwks, jws])
        .env_remove("PAYGATE_CONFIG")
        .env_remove("PAYGATE_MANDATES__SECRET")
        .env("PAYGATE_STORAGE__DATA_DIR", "/nonexistent/paygate-no-data-dir");
    run(cmd).await
}

/// Mandates verify outside the gateway, from its published JWKS alone: with PyJWT (a third-party
/// JOSE library, pinned in tests/python/requirements.txt) and with `paygate mandate verify --jwks`.
/// Across a key rotation the mandate signed before it still verifies (and still pays), and the one
/// signed after it carries the new key id.
#[tokio::test]
async fn mandates_verify_from_the_published_jwks_alone_across_a_key_rotation() {
    let dir = tempfile::tempdir().unwrap();
    // A rotation boundary safely in the past: PyJWT checks exp (and iat) against the real clock.
    let boundary = (SystemClock.now() - 120).div_euclid(3600) * 3600;
    let clock = Arc::new(ManualClock::new(boundary - 30));
    let hourly = [
        ("PAYGATE_MANDATES__ROTATE_SECS", "3600"),
        ("PAYGATE_MANDATES__TTL_SECS", "7200"),
        ("PAYGATE_MANDATES__OPEN_VALID_MAX_SECS", "7200"),
    ];
    let app = spawn_with_clock(dir.path(), &hourly, clock.clone()).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;

    let (_, before_rotation) = approved_mandate(&app, &agent, "rot-1", "5000.00").await;
    let old_kid = kid(&before_rotation);
    assert_eq!(old_kid, format!("mk1-{}", boundary / 3600 - 1));
    // The capabilities resource says where the keys are and which one signs now.
    let caps =
        agent.read_resource(rmcp::model::ReadResourceRequestParams::new("payments://capabilities")).await.unwrap();
    let rmcp::model::ResourceContents::TextResourceContents { text, .. } = &caps.contents[0] else { panic!("text") };
    let caps: Value = serde_json::from_str(text).unwrap();
    let jwks_uri = format!("{}/.well-known/mandate-jwks.json", app.base());
    assert_eq!(caps["mandate_keys"]["jwks_uri"], jwks_uri);
    assert_eq!(caps["mandate_keys"]["alg"], "EdDSA");
    assert_eq!(caps["mandate_keys"]["signing_kid"], old_kid);
    let published: Vec<String> =
        served_jwks(&app).await["keys"].as_array().unwrap().iter().map(|k| k["kid"].as_str().unwrap().into()).collect();
    let new_kid = format!("mk1-{}", boundary / 3600);
    assert!(
        published.contains(&old_kid) && published.contains(&new_kid),
        "the next key is published ahead: {published:?}"
    );

    clock.set(boundary + 30);
    let (_, after_rotation) = approved_mandate(&app, &agent, "rot-2", "6000.00").await;
    assert_eq!(kid(&after_rotation), new_kid, "a new period signs with the new key");
    let jwks = served_jwks(&app).await;
    let file = dir.path().join("jwks.json");
    std::fs::write(&file, jwks.to_string()).unwrap();

    let forged = forge(&after_rotation, |c| c["amount_minor"] = json!(60_000_000));
    for (jws, genuine) in [(&before_rotation, true), (&after_rotation, true), (&forged, false)] {
        for source in [jwks_uri.clone(), file.display().to_string()] {
            let out = verify_from_jwks(&source, jws).await;
            assert_eq!(out.status.success(), genuine, "{source}: {out:?}");
            if genuine {
                let printed: Value = serde_json::from_slice(&out.stdout).unwrap();
                assert_eq!(printed, claims(jws), "the CLI prints the signed claims");
            } else {
                assert!(String::from_utf8_lossy(&out.stderr).contains("invalid"), "{out:?}");
            }
        }
    }

    if let Some(python) = python("mandates (PyJWT)") {
        let script = format!("{}/tests/python/verify_mandate.py", env!("CARGO_MANIFEST_DIR"));
        for (jws, genuine) in [(&before_rotation, true), (&after_rotation, true), (&forged, false)] {
            let mut cmd = std::process::Command::new(&python);
            cmd.args([&script, &jwks_uri, jws.as_str()]);
            let out = run(cmd).await;
            assert_eq!(out.status.success(), genuine, "PyJWT: {out:?}");
            if genuine {
                let verified: Value = serde_json::from_slice(&out.stdout).unwrap();
                assert_eq!(verified["kid"], kid(jws));
                assert_eq!(verified["claims"], claims(jws), "PyJWT read the claims the gateway signed");
            }
        }
    }

    // The gateway too still honours the mandate signed before the rotation.
    let before = books(&agent).await;
    let r = pay(&agent, "rot-1", "acct-A", "acct-B", "5000.00", "KES", Some(&before_rotation)).await;
    assert_eq!(ok(&r)["replayed"], false, "{r:?}");
    let r = pay(&agent, "rot-2", "acct-A", "acct-B", "6000.00", "KES", Some(&after_rotation)).await;
    assert_eq!(ok(&r)["replayed"], false, "{r:?}");
    assert_eq!(books(&agent).await, paid(&paid(&before, 500_000, 1), 600_000, 1));

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

/// An open pre-authorization waiting for its second reviewer across a restart that lowers
/// `mandates.open_valid_max_secs`: the mandate it yields is valid for the bound in force when it
/// is issued, never the wider one it was asked under.
#[tokio::test]
async fn a_lowered_validity_bound_caps_the_open_mandate_issued_after_it() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(SystemClock.now());
    let app = spawn_with_clock(dir.path(), &[], Arc::new(clock.clone())).await;
    let mut body = open_mandate_body("1500.00", "150000.00", 2);
    body["valid_for_secs"] = json!(86_400);
    let view = preauthorize(&app, body).await;
    assert_eq!((view["status"].as_str(), view["reviewers_required"].as_i64()), (Some("pending"), Some(2)), "{view}");
    let id = view["approval_id"].as_str().unwrap().to_string();
    app.stop().await;

    let lowered = [("PAYGATE_MANDATES__OPEN_VALID_MAX_SECS", "3600")];
    let app = spawn_with_clock(dir.path(), &lowered, Arc::new(clock.clone())).await;
    let (status, view) = approve(&app, &id, "bob").await;
    assert_eq!((status.as_u16(), view["status"].as_str()), (200, Some("approved")), "{view}");
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let c = claims(&agent_mandate(&agent, &id).await);
    assert_eq!(c["exp"].as_i64().unwrap() - c["iat"].as_i64().unwrap(), 3600, "{c}");
    agent.cancel().await.unwrap();
    app.stop().await;
}
