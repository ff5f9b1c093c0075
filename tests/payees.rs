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

    // A human approves one: its payee is known from now, audited, listed.
    let (status, body) = approve(&app, &approvals[0], "alice").await;
    assert_eq!(status, 200, "{body}");
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
    assert_eq!(fake.b2c_requests(), 1, "only the known payee's payout went out");
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
    assert_eq!(fake.b2c_requests(), 1);
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
