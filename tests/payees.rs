//! Who gets paid (`payees`): an unknown phone needs a human for every slice of a split payout, a
//! human's approval makes the payee known, a new payee's cooling-off limit and every payee's daily
//! cap hold under concurrent payments (on SQLite, and on PostgreSQL where
//! PAYGATE_TEST_DATABASE_URL is set), and operators list, add and revoke payees (audited) — an
//! MCP agent against the real server on port 0.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;
#[path = "common/daraja.rs"]
mod daraja;

use std::sync::Arc;

use common::*;
use daraja::{DarajaFake, FakeConfig, SANDBOX_PASSKEY};
use paygate::clock::SystemClock;
use reqwest::Method;
use serde_json::{Value, json};

const SCOPES: &str = "payments:read payments:create payments:payout";

fn profile(payees: &str) -> String {
    format!(
        r#"
[jobs]
enabled = false

[policy]
default_profile = "dev"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent"]
allowed_accounts = ["acct-A", "acct-B", "mpesa-collections"]
autonomous_limit = {{ KES = "1000.00" }}
daily_limit = {{ KES = "100000.00" }}
daily_payments_max = 1000
calls_per_minute = 6000

[policy.profiles.payees]
{payees}
"#
    )
}

fn mpesa(fake: &DarajaFake) -> String {
    format!(
        r#"
[mpesa]
enabled = true
base_url = "{base}"
consumer_key = "fake-consumer-key"
consumer_secret = "fake-consumer-secret"
short_code = "174379"
passkey = "{SANDBOX_PASSKEY}"
callback_secret = "cb-secret-0123456789abcdefghij"
initiator_name = "testapi"
security_credential = "fake-security-credential"
b2c_short_code = "600996"
request_timeout_ms = 500
"#,
        base = fake.base_url()
    )
}

fn payout(op: &str, phone: &str, amount: &str) -> Value {
    json!({"operation_id": op, "phone_number": phone, "amount": amount, "remarks": "supplier"})
}

fn transfer(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"})
}

async fn payees(app: &TestApp) -> Vec<Value> {
    let token = app.operator_token("auditor", "payments:audit");
    let (status, body) = operator(app, Method::GET, "/operator/v1/payees?agent=dev-agent", &token, None).await;
    assert_eq!(status, 200, "{body}");
    body["items"].as_array().unwrap().clone()
}

async fn audit_actions(app: &TestApp, action: &str) -> Vec<paygate::domain::audit::AuditRecord> {
    let all = app.running.store.audit_list(None, 1000).await.unwrap();
    all.into_iter().filter(|r| r.tool == action).collect()
}

/// A split payout to a phone nobody approved: every slice, however small, needs a human, and none
/// reaches M-Pesa; a human's approval of one makes the phone known, and from then on the cooling-off
/// limit and the revoke hold.
#[tokio::test]
async fn payouts_to_an_unknown_phone_in_slices_each_need_a_human_until_one_is_approved() {
    let fake = DarajaFake::start(FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = mpesa(&fake)
        + &profile(
            r#"mode = "known"
cooling_off_secs = 3600
new_payee_limit = { KES = "200.00" }"#,
        );
    let overrides = [("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "0")];
    let app = spawn_with_toml(dir.path(), &toml, &overrides, Arc::new(SystemClock)).await;
    let c = connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;

    // Ten slices of 50 (each far under the autonomous limit of 1,000): ten asks for a human.
    let mut approvals = Vec::new();
    for n in 0..10 {
        let r = call(&c, "send_mpesa_payout", payout(&format!("slice-{n}"), "0712 345 678", "50")).await;
        assert_eq!(code(&r), "APPROVAL_REQUIRED", "slice {n}: {r:?}");
        let reason = err(&r)["message"].as_str().unwrap_or_default().to_string();
        assert!(err(&r).to_string().contains("new payee"), "the agent is told why: {reason}");
        approvals.push(err(&r)["approval_id"].as_str().unwrap().to_string());
    }
    assert_eq!(fake.b2c_requests(), 0, "no slice reached M-Pesa");
    assert!(payees(&app).await.is_empty());

    // A human approves one, and its payout settles: its payee is known from now, audited, listed.
    let (status, body) = approve(&app, &approvals[0], "alice").await;
    assert_eq!(status, 200, "{body}");
    let mut args = payout("slice-0", "0712 345 678", "50");
    args["mandate"] = json!(mandate_of(&c, &approvals[0]).await);
    let paid = ok(&call(&c, "send_mpesa_payout", args).await).clone();
    assert_eq!(fake.post_result(paid["payment_id"].as_str().unwrap(), 0).await, 200);
    let known = payees(&app).await;
    assert_eq!(known.len(), 1, "{known:?}");
    assert_eq!((known[0]["payee"].as_str(), known[0]["status"].as_str()), (Some("mpesa-254712345678"), Some("known")));
    assert_eq!(known[0]["approval_id"], json!(approvals[0]));
    let added = audit_actions(&app, "payees.add").await;
    assert_eq!(added.len(), 1);
    assert_eq!(added[0].principal_sub, "alice");

    // In its cooling-off period: up to the new-payee limit alone, over it a human again.
    let r = call(&c, "send_mpesa_payout", payout("after-1", "0712345678", "200")).await;
    assert_eq!(ok(&r)["status"], "pending", "{r:?}");
    let r = call(&c, "send_mpesa_payout", payout("after-2", "0712345678", "201")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{r:?}");
    assert!(err(&r).to_string().contains("became a payee"), "{r:?}");
    // Another phone is a new payee of its own.
    let r = call(&c, "send_mpesa_payout", payout("other-1", "0722 000 111", "10")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{r:?}");
    assert_eq!(fake.b2c_requests(), 2, "only the known payee's payouts went out");
    // A business is a payee like any other: a paybill (under either name) and a till nobody
    // approved need a human, whatever the slice.
    for (tool, args) in [
        (
            "pay_paybill",
            json!({"operation_id": "bill-1", "paybill": "888880", "account_reference": "ACC-1", "amount": "10", "remarks": "r"}),
        ),
        (
            "pay_to_paybill",
            json!({"operation_id": "bill-2", "paybill": "888880", "account_reference": "ACC-2", "amount": "5", "remarks": "r"}),
        ),
        ("pay_till", json!({"operation_id": "till-1", "till": "5123456", "amount": "10", "remarks": "r"})),
    ] {
        let r = call(&c, tool, args).await;
        assert_eq!(code(&r), "APPROVAL_REQUIRED", "{tool}: {r:?}");
        assert!(err(&r).to_string().contains("new payee"), "{tool}: {r:?}");
    }
    assert_eq!(fake.b2b_requests(), 0, "no business payment reached M-Pesa");

    // An operator revokes it: the next payment is a first payment again.
    let admin = app.operator_token("bob", "payments:approve");
    let body = json!({"agent_subject": "dev-agent", "payee": "mpesa-254712345678", "reason": "fraud report"});
    let (status, view) = operator(&app, Method::POST, "/operator/v1/payees/revoke", &admin, Some(body.clone())).await;
    assert_eq!((status.as_u16(), view["status"].as_str()), (200, Some("revoked")), "{view}");
    let (status, _) = operator(&app, Method::POST, "/operator/v1/payees/revoke", &admin, Some(body)).await;
    assert_eq!(status, 404, "revoking twice: nothing known to revoke");
    let r = call(&c, "send_mpesa_payout", payout("after-revoke", "0712345678", "10")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{r:?}");
    assert_eq!(fake.b2c_requests(), 2);
    let revoked = audit_actions(&app, "payees.revoke").await;
    assert_eq!(revoked.iter().filter(|r| r.decision == "recorded").count(), 1);
    assert!(revoked[0].detail.as_deref().unwrap_or_default().contains("fraud report"));

    // The agent cannot add a payee for itself: the operator API takes no agent token.
    let agent = app.token("dev-agent", "payments:read payments:create payments:payout payments:approve");
    let add = json!({"agent_subject": "dev-agent", "payee": "mpesa-254799999999"});
    let (status, _) = operator(&app, Method::POST, "/operator/v1/payees", &agent, Some(add)).await;
    assert_eq!(status, 401);
    app.stop().await;
}

/// Concurrent payments to one payee: its daily cap (checked where each payment commits, under
/// the budget's lock) lets through exactly what fits, and concurrent first payments to a payee no
/// one approved all wait for a human.
async fn concurrent_payments_cannot_pass_the_payee_rules(overrides: &[(&str, &str)], label: &str) {
    let dir = tempfile::tempdir().unwrap();
    let toml = profile(
        r#"mode = "known"
cooling_off_secs = 3600
new_payee_limit = { KES = "100.00" }
daily_cap = { KES = "500.00" }"#,
    );
    let mut env = vec![("PAYGATE_STOP_RULES__REPEAT_MAX", "0")];
    env.extend_from_slice(overrides);
    let app = spawn_with_toml(dir.path(), &toml, &env, Arc::new(SystemClock)).await;
    let c = Arc::new(connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await);
    let before = balance(&c, "acct-B").await;

    // Not known yet: ten concurrent first payments, all asking for a human, none moving money.
    let tasks: Vec<_> = (0..10)
        .map(|n| {
            let c = c.clone();
            tokio::spawn(async move { call(&c, "create_payment", transfer(&format!("first-{n}"), "10")).await })
        })
        .collect();
    for t in tasks {
        let r = t.await.unwrap();
        assert_eq!(code(&r), "APPROVAL_REQUIRED", "{label}: {r:?}");
    }
    assert_eq!(balance(&c, "acct-B").await, before, "{label}");

    // An operator adds it: a new payee (100.00 a payment) with a daily cap of 500.00. Twelve
    // concurrent payments of 100.00: exactly five fit.
    let admin = app.operator_token("bob", "payments:approve");
    let add = json!({"agent_subject": "dev-agent", "payee": "acct-B", "reason": "supplier onboarded"});
    let (status, view) = operator(&app, Method::POST, "/operator/v1/payees", &admin, Some(add)).await;
    assert_eq!((status.as_u16(), view["status"].as_str()), (200, Some("known")), "{label}: {view}");
    let tasks: Vec<_> = (0..12)
        .map(|n| {
            let c = c.clone();
            tokio::spawn(async move { call(&c, "create_payment", transfer(&format!("capped-{n}"), "100")).await })
        })
        .collect();
    let mut paid = 0;
    for t in tasks {
        let r = t.await.unwrap();
        if r.is_error == Some(true) {
            // Refused before (APPROVAL_REQUIRED: the cap as read) or where it commits (the cap as
            // locked: BUDGET_EXCEEDED); never paid.
            assert!(["APPROVAL_REQUIRED", "BUDGET_EXCEEDED"].contains(&code(&r).as_str()), "{label}: {r:?}");
        } else {
            paid += 1;
        }
    }
    assert_eq!(paid, 5, "{label}: the daily cap of 500.00 holds 5 payments of 100.00");
    let moved = |b: &str| b.parse::<f64>().unwrap();
    assert_eq!(moved(&balance(&c, "acct-B").await) - moved(&before), 500.0, "{label}");
    // Over the new-payee limit: a human, however much of the cap is left.
    let r = call(&c, "create_payment", transfer("big", "100.01")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{label}: {r:?}");
    app.assert_integrity().await;
    app.stop().await;
}

#[tokio::test]
async fn concurrent_payments_cannot_pass_the_payee_rules_on_sqlite() {
    concurrent_payments_cannot_pass_the_payee_rules(&[], "sqlite").await;
}

#[tokio::test]
async fn concurrent_payments_cannot_pass_the_payee_rules_on_postgres() {
    let Some(db) = database("payees (postgres)") else { return };
    let env = [("PAYGATE_STORAGE__URL", db.url.as_str()), ("PAYGATE_STORAGE__POSTGRES_SCHEMA", db.schema.as_str())];
    concurrent_payments_cannot_pass_the_payee_rules(&env, "postgres").await;
}

/// `check_payment_policy` answers what the call would get and the headroom, and writes nothing: no
/// approval, no audit record of the money tool, nothing toward the stop rule, however often.
#[tokio::test]
async fn the_preflight_tells_what_would_happen_and_writes_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let toml = profile("mode = \"known\"\ncooling_off_secs = 3600\nnew_payee_limit = { KES = \"100.00\" }");
    let app = spawn_with_toml(dir.path(), &toml, &[], Arc::new(SystemClock)).await;
    let c = connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    let ask = |args: Value| json!({"tool": "create_payment", "arguments": args});
    let records = || async { app.running.store.audit_list(None, 1000).await.unwrap().len() };
    let before = records().await;

    let r = call(&c, "check_payment_policy", ask(transfer("pre-1", "10"))).await;
    let pre = ok(&r).clone();
    assert_eq!(pre["verdict"], "approval_required", "{pre}");
    assert_eq!((pre["approver"].as_str(), pre["payee"]["known"].as_bool()), (Some("operator"), Some(false)), "{pre}");
    assert_eq!(pre["headroom"]["payments"][0]["remaining"], "100000.00", "{pre}");
    // A foreign account, twenty times: denied each time, and never counted.
    let foreign = json!({"operation_id": "pre-2", "from_account": "acct-A", "to_account": "acct-Z",
                         "amount": "10", "currency": "KES"});
    for _ in 0..20 {
        let r = call(&c, "check_payment_policy", ask(foreign.clone())).await;
        assert_eq!(
            (ok(&r)["verdict"].as_str(), ok(&r)["code"].as_str()),
            (Some("denied"), Some("ACCOUNT_NOT_ALLOWED"))
        );
        assert_eq!(ok(&r)["headroom"]["denials_before_suspension"], 9, "{r:?}");
    }
    let token = app.operator_token("auditor", "payments:audit");
    let (_, approvals) = operator(&app, Method::GET, "/operator/v1/approvals", &token, None).await;
    assert_eq!(approvals["items"].as_array().map(Vec::len), Some(0), "no approval was asked for: {approvals}");
    let written: Vec<String> = app.running.store.audit_list(None, 1000).await.unwrap()[..records().await - before]
        .iter()
        .map(|r| r.tool.clone())
        .collect();
    assert!(written.iter().all(|t| t == "check_payment_policy"), "only the read itself is audited: {written:?}");

    // The money tool then does what the preflight said.
    let r = call(&c, "create_payment", transfer("pre-1", "10")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED");
    app.stop().await;
}

// ---- Issue 52, items 7, 8 and 12: payee rules an agent cannot slip past. ----

/// The mandate an approved approval issued, as its agent fetches it.
async fn mandate_of(c: &Client, approval_id: &str) -> String {
    let r = call(c, "get_approval", json!({"approval_id": approval_id})).await;
    ok(&r)["mandate"].as_str().unwrap_or_else(|| panic!("no mandate: {r:?}")).to_string()
}

async fn revoke_mandate(app: &TestApp, approval_id: &str) {
    let bob = app.operator_token("bob", "payments:approve");
    let path = format!("/approvals/{approval_id}/revoke");
    let (status, body) = operator(app, Method::POST, &path, &bob, Some(json!({"reason": "disputed"}))).await;
    assert_eq!(status, 200, "{body}");
}

/// The payees known to dev-agent now (revoked ones left out).
async fn known_payees(app: &TestApp) -> Vec<String> {
    payees(app)
        .await
        .into_iter()
        .filter(|p| p["status"] == "known")
        .map(|p| p["payee"].as_str().unwrap().to_string())
        .collect()
}

/// Ask for a human for `args` (the agent's call is APPROVAL_REQUIRED), have alice approve it,
/// and return the approval id.
async fn approved(app: &TestApp, c: &Client, tool: &str, args: Value) -> String {
    let r = call(c, tool, args).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{tool}: {r:?}");
    let id = err(&r)["approval_id"].as_str().unwrap().to_string();
    let (status, body) = approve(app, &id, "alice").await;
    assert_eq!(status, 200, "{body}");
    id
}

/// Issue 52 item 7: the payee was learned when the mandate was issued, so revoking the mandate
/// (or never using it) left the agent free to pay that payee alone. A payee is learned when the
/// mandated payment settles — never from the approval alone, never when its mandate was revoked
/// before the payout settled — and revoking the mandate afterwards forgets it.
#[tokio::test]
async fn a_payee_is_learned_only_when_its_approved_payout_settles_and_a_revoked_mandate_teaches_nothing() {
    let fake = DarajaFake::start(FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = mpesa(&fake)
        + &profile(
            r#"mode = "known"
cooling_off_secs = 3600
new_payee_limit = { KES = "200.00" }"#,
        );
    let overrides = [("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "0")];
    let app = spawn_with_toml(dir.path(), &toml, &overrides, Arc::new(SystemClock)).await;
    let c = connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;

    // Approved, not yet paid: the approval alone teaches nothing.
    let first = approved(&app, &c, "send_mpesa_payout", payout("p1", "0712345678", "50")).await;
    assert!(known_payees(&app).await.is_empty(), "known from the approval alone");
    let r = call(&c, "send_mpesa_payout", payout("p1-alone", "0712345678", "10")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{r:?}");
    // Paid under the mandate, still pending at M-Pesa: not known yet.
    let mut args = payout("p1", "0712345678", "50");
    args["mandate"] = json!(mandate_of(&c, &first).await);
    let paid = ok(&call(&c, "send_mpesa_payout", args).await).clone();
    assert_eq!(paid["status"], "pending", "{paid}");
    assert!(known_payees(&app).await.is_empty(), "known before the payout settled");
    // M-Pesa's result settles it: the payee is known from now, in alice's name.
    assert_eq!(fake.post_result(paid["payment_id"].as_str().unwrap(), 0).await, 200);
    assert_eq!(known_payees(&app).await, ["mpesa-254712345678"]);
    let added = audit_actions(&app, "payees.add").await;
    assert_eq!((added.len(), added[0].principal_sub.as_str()), (1, "alice"), "{added:?}");
    let r = call(&c, "send_mpesa_payout", payout("p1-known", "0712345678", "100")).await;
    assert_eq!(ok(&r)["status"], "pending", "{r:?}");

    // Another phone: approved and paid, then the mandate is revoked before the payout settles.
    let second = approved(&app, &c, "send_mpesa_payout", payout("p2", "0722000111", "50")).await;
    let mut args = payout("p2", "0722000111", "50");
    args["mandate"] = json!(mandate_of(&c, &second).await);
    let paid2 = ok(&call(&c, "send_mpesa_payout", args).await).clone();
    revoke_mandate(&app, &second).await;
    assert_eq!(fake.post_result(paid2["payment_id"].as_str().unwrap(), 0).await, 200);
    assert_eq!(known_payees(&app).await, ["mpesa-254712345678"], "a revoked mandate taught its payee");
    let before = fake.b2c_requests();
    let r = call(&c, "send_mpesa_payout", payout("p2-alone", "0722000111", "100")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "the agent pays a revoked mandate's payee alone: {r:?}");

    // Revoking the first mandate, after its payout settled, forgets the payee it taught.
    revoke_mandate(&app, &first).await;
    assert!(known_payees(&app).await.is_empty());
    let r = call(&c, "send_mpesa_payout", payout("p1-after-revoke", "0712345678", "100")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{r:?}");
    assert_eq!(fake.b2c_requests(), before, "nothing more reached M-Pesa");
    app.stop().await;
}

/// Issue 52 item 7: a mandate that expires unused leaves its payee unknown; a mandated ledger
/// payment that succeeds teaches it at once.
#[tokio::test]
async fn a_mandate_that_expires_unused_teaches_no_payee_and_a_settled_one_does() {
    let dir = tempfile::tempdir().unwrap();
    let clock = paygate::clock::ManualClock::new(now_secs());
    let toml = profile("mode = \"known\"\ncooling_off_secs = 3600\nnew_payee_limit = { KES = \"100.00\" }");
    let app = spawn_with_toml(dir.path(), &toml, &[], Arc::new(clock.clone())).await;
    let c = connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    let before = balance(&c, "acct-B").await;

    approved(&app, &c, "create_payment", transfer("unused", "10")).await;
    clock.advance(2 * 3600); // past mandates.ttl_secs: the mandate expires unused
    let _ = c.cancel().await;
    let c = connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    assert!(known_payees(&app).await.is_empty(), "an unused mandate taught its payee");
    let r = call(&c, "create_payment", transfer("alone-1", "10")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "the agent pays an expired mandate's payee alone: {r:?}");
    assert_eq!(balance(&c, "acct-B").await, before);

    // Approved and paid: the ledger settles it at once, and the payee is known.
    let id = approved(&app, &c, "create_payment", transfer("used", "10")).await;
    let mut args = transfer("used", "10");
    args["mandate"] = json!(mandate_of(&c, &id).await);
    assert_eq!(ok(&call(&c, "create_payment", args.clone()).await)["status"], "succeeded");
    assert_eq!(known_payees(&app).await, ["acct-B"]);
    let r = call(&c, "create_payment", transfer("alone-2", "10")).await;
    assert_eq!(ok(&r)["status"], "succeeded", "{r:?}");
    // An operator revokes the payee; the agent replays the mandated call: a replay teaches nothing.
    let admin = app.operator_token("bob", "payments:approve");
    let body = json!({"agent_subject": "dev-agent", "payee": "acct-B"});
    let (status, _) = operator(&app, Method::POST, "/operator/v1/payees/revoke", &admin, Some(body)).await;
    assert_eq!(status, 200);
    assert_eq!(ok(&call(&c, "create_payment", args).await)["replayed"], true);
    assert!(known_payees(&app).await.is_empty(), "a replay taught the payee again");
    app.stop().await;
}

fn bill(op: &str, reference: &str, amount: &str) -> Value {
    json!({"operation_id": op, "paybill": "247247", "account_reference": reference, "amount": amount,
           "remarks": "supplier invoice"})
}

/// Issue 52 item 8: approving `247247 / SUPPLIER-001` made the paybill known for every account
/// reference, so `247247 / ATTACKER-999` went to M-Pesa with no human. A paybill payee is the pair
/// (paybill, account reference): in what a settled payment teaches, in the preflight, in the
/// operator's payee routes.
#[tokio::test]
async fn a_known_paybill_reference_does_not_make_another_reference_known() {
    let fake = DarajaFake::start(FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = mpesa(&fake) + &profile("mode = \"known\"\ncooling_off_secs = 0");
    let overrides = [("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "0")];
    let app = spawn_with_toml(dir.path(), &toml, &overrides, Arc::new(SystemClock)).await;
    let c = connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;

    let id = approved(&app, &c, "pay_paybill", bill("b-1", "SUPPLIER-001", "50")).await;
    let mut args = bill("b-1", "SUPPLIER-001", "50");
    args["mandate"] = json!(mandate_of(&c, &id).await);
    let paid = ok(&call(&c, "pay_paybill", args).await).clone();
    assert_eq!(fake.post_result(paid["payment_id"].as_str().unwrap(), 0).await, 200);
    let sent = fake.b2b_requests();

    // The attacker's reference at the same paybill: a new payee, whatever the amount.
    let r = call(&c, "pay_paybill", bill("b-attack", "ATTACKER-999", "50")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "another account at a known paybill paid alone: {r:?}");
    assert!(err(&r).to_string().contains("mpesa-paybill-247247/ATTACKER-999"), "{r:?}");
    assert_eq!(fake.b2b_requests(), sent, "nothing reached M-Pesa");
    assert_eq!(known_payees(&app).await, ["mpesa-paybill-247247/SUPPLIER-001"]);
    // The preflight agrees, and names the pair.
    let ask = json!({"tool": "pay_paybill", "arguments": bill("b-pre", "ATTACKER-999", "50")});
    let pre = ok(&call(&c, "check_payment_policy", ask).await).clone();
    assert_eq!(pre["verdict"], "approval_required", "{pre}");
    assert_eq!(
        (pre["payee"]["payee"].as_str(), pre["payee"]["known"].as_bool()),
        (Some("mpesa-paybill-247247/ATTACKER-999"), Some(false))
    );
    // The known reference itself: paid alone.
    let r = call(&c, "pay_paybill", bill("b-2", "SUPPLIER-001", "50")).await;
    assert_eq!(ok(&r)["status"], "pending", "{r:?}");

    // The operator's routes key a paybill payee by the pair too: a paybill alone is refused (it
    // would match no payment), an account reference on anything else too; nothing is written.
    let admin = app.operator_token("bob", "payments:approve");
    for body in [
        json!({"agent_subject": "dev-agent", "payee": "mpesa-paybill-247247"}),
        json!({"agent_subject": "dev-agent", "payee": "acct-B", "account_reference": "X"}),
        json!({"agent_subject": "dev-agent", "payee": "mpesa-paybill-247247", "account_reference": "bad\u{7}ref"}),
    ] {
        let (status, view) = operator(&app, Method::POST, "/operator/v1/payees", &admin, Some(body.clone())).await;
        assert_eq!(status, 400, "{body}: {view}");
    }
    assert_eq!(known_payees(&app).await, ["mpesa-paybill-247247/SUPPLIER-001"]);
    let add = json!({"agent_subject": "dev-agent", "payee": "mpesa-paybill-247247", "account_reference": "RENT-7"});
    let (status, view) = operator(&app, Method::POST, "/operator/v1/payees", &admin, Some(add)).await;
    assert_eq!((status.as_u16(), view["payee"].as_str()), (200, Some("mpesa-paybill-247247/RENT-7")), "{view}");
    let r = call(&c, "pay_paybill", bill("b-rent", "RENT-7", "50")).await;
    assert_eq!(ok(&r)["status"], "pending", "{r:?}");
    let r = call(&c, "pay_paybill", bill("b-rent-8", "RENT-8", "50")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{r:?}");
    let revoke = json!({"agent_subject": "dev-agent", "payee": "mpesa-paybill-247247", "account_reference": "RENT-7"});
    let (status, view) = operator(&app, Method::POST, "/operator/v1/payees/revoke", &admin, Some(revoke)).await;
    assert_eq!((status.as_u16(), view["status"].as_str()), (200, Some("revoked")), "{view}");
    app.stop().await;
}

/// Issue 52 item 12: the cooling-off limit bounded each payment, not their sum: eight 100.00
/// payments to a payee known for a minute (new_payee_limit 100.00) all went through. The
/// cooling-off total is drawn where each payment commits, under the budget lock: eight concurrent
/// payments of 100.00 against a total of 300.00 pay exactly three.
async fn concurrent_payments_stop_at_the_cooling_off_total(overrides: &[(&str, &str)], label: &str) {
    let dir = tempfile::tempdir().unwrap();
    let toml = profile(
        r#"mode = "known"
cooling_off_secs = 3600
new_payee_limit = { KES = "100.00" }
cooling_off_total = { KES = "300.00" }"#,
    );
    let mut env = vec![("PAYGATE_STOP_RULES__REPEAT_MAX", "0")];
    env.extend_from_slice(overrides);
    let app = spawn_with_toml(dir.path(), &toml, &env, Arc::new(SystemClock)).await;
    let c = Arc::new(connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await);
    let admin = app.operator_token("bob", "payments:approve");
    let add = json!({"agent_subject": "dev-agent", "payee": "acct-B", "reason": "supplier onboarded"});
    let (status, _) = operator(&app, Method::POST, "/operator/v1/payees", &admin, Some(add)).await;
    assert_eq!(status, 200, "{label}");
    let before = balance(&c, "acct-B").await;

    let tasks: Vec<_> = (0..8)
        .map(|n| {
            let c = c.clone();
            tokio::spawn(async move { call(&c, "create_payment", transfer(&format!("cool-{n}"), "100")).await })
        })
        .collect();
    let mut paid = 0;
    for t in tasks {
        let r = t.await.unwrap();
        if r.is_error == Some(true) {
            // Refused as read (APPROVAL_REQUIRED) or as locked where it commits (BUDGET_EXCEEDED).
            assert!(["APPROVAL_REQUIRED", "BUDGET_EXCEEDED"].contains(&code(&r).as_str()), "{label}: {r:?}");
        } else {
            paid += 1;
        }
    }
    assert_eq!(paid, 3, "{label}: a cooling-off total of 300.00 holds 3 payments of 100.00");
    let moved = |b: &str| b.parse::<f64>().unwrap();
    assert_eq!(moved(&balance(&c, "acct-B").await) - moved(&before), 300.0, "{label}");
    // One by one, too: the next is a human's, and says why.
    let r = call(&c, "create_payment", transfer("cool-next", "1")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{label}: {r:?}");
    assert!(err(&r).to_string().contains("cooling-off total"), "{label}: {r:?}");
    let pre = ok(&call(
        &c,
        "check_payment_policy",
        json!({"tool": "create_payment", "arguments": transfer("cool-pre", "1")}),
    )
    .await)
    .clone();
    assert_eq!(pre["verdict"], "approval_required", "{label}: {pre}");
    assert_eq!(pre["payee"]["paid_cooling_off_minor"], 30_000, "{label}: {pre}");
    app.assert_integrity().await;
    app.stop().await;
}

#[tokio::test]
async fn concurrent_payments_stop_at_the_cooling_off_total_on_sqlite() {
    concurrent_payments_stop_at_the_cooling_off_total(&[], "sqlite").await;
}

#[tokio::test]
async fn concurrent_payments_stop_at_the_cooling_off_total_on_postgres() {
    let Some(db) = database("payees cooling-off (postgres)") else { return };
    let env = [("PAYGATE_STORAGE__URL", db.url.as_str()), ("PAYGATE_STORAGE__POSTGRES_SCHEMA", db.schema.as_str())];
    concurrent_payments_stop_at_the_cooling_off_total(&env, "postgres").await;
}

/// The hostile reviews' open item: a `payees` row a database writer inserted made a payee known
/// (no `payees.add` record, verify ok) and the agent paid it alone. Payee rows carry the gateway's
/// tag: an inserted row, or a genuine row's tag copied onto another owner, makes nothing known;
/// operators see it as "unverified", and adding the payee again makes it known for real.
#[tokio::test]
async fn a_payee_row_written_in_the_database_makes_no_payee_known() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(dir.path(), &profile(r#"mode = "known""#), &[], Arc::new(SystemClock)).await;
    let c = connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    let r = call(&c, "create_payment", transfer("t-1", "5.00")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "unknown payee: {r:?}");
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    db.execute(
        "INSERT INTO payees (owner, payee, known_since, added_by, approval_id)
         VALUES ('dev-agent', 'acct-B', 0, 'https://idp.example bob', NULL)",
        [],
    )
    .unwrap();
    let r = call(&c, "create_payment", transfer("t-2", "5.00")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "an inserted row: {r:?}");
    assert_eq!(payees(&app).await[0]["status"], "unverified");
    // A genuine row's tag (another agent's) copied onto the inserted one.
    let bob = app.operator_token("bob", "payments:approve");
    let add = |agent: &str| json!({"agent_subject": agent, "payee": "acct-B", "reason": "supplier onboarded"});
    let (status, body) = operator(&app, Method::POST, "/operator/v1/payees", &bob, Some(add("other-agent"))).await;
    assert_eq!(status, 200, "{body}");
    db.execute(
        "UPDATE payees SET tag = (SELECT tag FROM payees WHERE owner = 'other-agent'),
                known_since = (SELECT known_since FROM payees WHERE owner = 'other-agent'),
                added_by = (SELECT added_by FROM payees WHERE owner = 'other-agent')
         WHERE owner = 'dev-agent'",
        [],
    )
    .unwrap();
    let r = call(&c, "create_payment", transfer("t-3", "5.00")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "a copied tag: {r:?}");
    assert!(
        audit_actions(&app, "payees.add").await.iter().all(|a| !a.detail.as_deref().unwrap().contains("dev-agent"))
    );
    // An operator adds it: the row is the gateway's, and the agent pays it.
    let (status, body) = operator(&app, Method::POST, "/operator/v1/payees", &bob, Some(add("dev-agent"))).await;
    assert_eq!((status, body["status"].clone()), (reqwest::StatusCode::OK, json!("known")), "{body}");
    ok(&call(&c, "create_payment", transfer("t-4", "5.00")).await);
    app.stop().await;
}
