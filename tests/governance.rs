//! Budgets, stop rules, tool governance and rate limits, through the real server.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;

use common::*;
use paygate::clock::ManualClock;
use serde_json::{Value, json};
use tokio::sync::Barrier;

fn pay(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"})
}

/// The dev profile with tighter budgets and quotas, and a second agent on the same profile.
fn profiles(daily_limit: &str, daily_payments_max: i64, calls_per_minute: i64, create_per_minute: i64) -> String {
    format!(
        r#"
[policy]
default_profile = "default"

[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent", "other-agent"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = {{ KES = "1000.00" }}
daily_limit = {{ KES = "{daily_limit}" }}
daily_payments_max = {daily_payments_max}
calls_per_minute = {calls_per_minute}
tool_calls_per_minute = {{ create_payment = {create_per_minute} }}
"#
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_payments_cannot_overshoot_the_daily_budget() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(
        dir.path(),
        &profiles("100.00", 1000, 10_000, 10_000),
        // 54 refusals of one intent: neither stop rule is what this test is about.
        &[("PAYGATE_STOP_RULES__DENIALS_MAX", "10000"), ("PAYGATE_STOP_RULES__REPEAT_MAX", "0")],
        Arc::new(paygate::clock::SystemClock),
    )
    .await;
    let token = app.dev_token();
    let mut clients = Vec::new();
    for i in 0..4 {
        clients.push(Arc::new(connect(&app.url, &token, if i % 2 == 0 { Era::Modern } else { Era::Legacy }).await));
    }
    let barrier = Arc::new(Barrier::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..64 {
        let (client, barrier) = (clients[n % 4].clone(), barrier.clone());
        tasks.spawn(async move {
            barrier.wait().await;
            (n, call(&client, "create_payment", pay(&format!("budget-{n}"), "10.00")).await)
        });
    }
    let (mut paid, mut refused) = (0, Vec::new());
    while let Some(r) = tasks.join_next().await {
        let (n, r) = r.unwrap();
        if r.is_error == Some(true) {
            assert_eq!(code(&r), "BUDGET_EXCEEDED");
            refused.push(n);
        } else {
            paid += 1;
        }
    }
    assert_eq!((paid, refused.len()), (10, 54));
    assert_eq!(balance(&clients[0], "acct-B").await, "100.00");
    // A refused operation keeps nothing: retrying it is judged again (and refused again today).
    let r = call(&clients[0], "create_payment", pay(&format!("budget-{}", refused[0]), "10.00")).await;
    assert_eq!(code(&r), "BUDGET_EXCEEDED");
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn payments_per_day_reset_on_the_next_utc_day() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(now_secs());
    let app =
        spawn_with_toml(dir.path(), &profiles("100000.00", 3, 10_000, 10_000), &[], Arc::new(clock.clone())).await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    for n in 0..3 {
        ok(&call(&c, "create_payment", pay(&format!("day1-{n}"), "1.00")).await);
    }
    let r = call(&c, "create_payment", pay("day1-3", "1.00")).await;
    assert_eq!(code(&r), "BUDGET_EXCEEDED");
    assert_eq!(err(&r)["retryable"], false);
    clock.advance(86_400);
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let r = call(&c, "create_payment", pay("day1-3", "1.00")).await;
    assert_eq!(ok(&r)["replayed"], false, "the same operation_id goes through once the budget resets");
    assert_eq!(balance(&c, "acct-B").await, "4.00");
    app.assert_integrity().await;
    app.stop().await;
}

#[tokio::test]
async fn repeated_denials_suspend_the_agent_until_an_admin_resumes_it() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::new(now_secs()));
    let app = spawn_with_clock(
        dir.path(),
        &[("PAYGATE_STOP_RULES__DENIALS_MAX", "3"), ("PAYGATE_STOP_RULES__WINDOW_SECS", "600")],
        Arc::new(clock.clone()),
    )
    .await;
    let c = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    // Typos are not policy denials: they do not count.
    for n in 0..5 {
        let r = call(&c, "create_payment", pay(&format!("typo-{n}"), "1.001")).await;
        assert_eq!(code(&r), "INVALID_ARGUMENT");
    }
    ok(&call(&c, "create_payment", pay("fine-1", "1.00")).await);
    // Probing a foreign account three times does (three amounts: three intents, so this is the
    // windowed count, not the no-progress rule).
    for n in 0..3 {
        let r = call(
            &c,
            "create_payment",
            json!({"operation_id": format!("probe-{n}"), "from_account": "acct-A", "to_account": "acct-Z",
                   "amount": format!("{}.00", n + 1), "currency": "KES"}),
        )
        .await;
        assert_eq!(code(&r), "ACCOUNT_NOT_ALLOWED");
    }
    let r = call(&c, "create_payment", pay("after-1", "1.00")).await;
    assert_eq!(code(&r), "PRINCIPAL_SUSPENDED");
    let message = err(&r)["message"].as_str().unwrap().to_string();
    // The reason counts what it counted, and names no RATE_LIMITED answers when there were none.
    assert!(message.contains("suspended by the stop rule: 3 policy denials within 600 s"), "{message}");
    assert!(!message.contains("RATE_LIMITED"), "{message}");
    // A suspended agent is stopped: its reads are refused too (before any rate limit or scope).
    let r = call(&c, "get_balance", json!({"account_id": "acct-B"})).await;
    assert_eq!(code(&r), "PRINCIPAL_SUSPENDED");
    let audit = app.audit("dev-agent").await;
    assert_eq!(audit.iter().filter(|a| a.decision == "suspended").count(), 1);

    // Only an admin resumes.
    let (status, _) = operator(
        &app,
        reqwest::Method::POST,
        "/principals/dev-agent/resume",
        &app.operator_token("ops", "payments:approve"),
        None,
    )
    .await;
    assert_eq!(status, 403);
    let (status, body) = operator(
        &app,
        reqwest::Method::POST,
        "/principals/dev-agent/resume",
        &app.operator_token("root", "payments:admin"),
        None,
    )
    .await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["resumed"], true);
    // Nothing moved while it was suspended.
    assert_eq!(balance(&c, "acct-B").await, "1.00");
    ok(&call(&c, "create_payment", pay("after-1", "1.00")).await);
    // Denials from before the resume do not count again.
    let r = call(
        &c,
        "create_payment",
        json!({"operation_id": "probe-again", "from_account": "acct-A", "to_account": "acct-Z",
               "amount": "1.00", "currency": "KES"}),
    )
    .await;
    assert_eq!(code(&r), "ACCOUNT_NOT_ALLOWED");
    ok(&call(&c, "create_payment", pay("after-2", "1.00")).await);
    assert!(app.audit("root").await.iter().any(|a| a.tool == "principals.resume" && a.decision == "resumed"));
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn a_disabled_tool_is_gone_and_a_governed_tool_needs_approval() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(
        dir.path(),
        &[
            ("PAYGATE_TOOLS__DISABLED", r#"["refund_payment"]"#),
            ("PAYGATE_TOOLS__APPROVAL_REQUIRED", r#"["create_payment"]"#),
        ],
    )
    .await;
    for era in ERAS {
        let c = connect(&app.url, &app.dev_token(), era).await;
        let tools = c.list_all_tools().await.unwrap();
        assert!(tools.iter().all(|t| t.name != "refund_payment"));
        let refused = c
            .call_tool(
                rmcp::model::CallToolRequestParams::new("refund_payment")
                    .with_arguments(json!({"operation_id": "r", "payment_id": "pay_x"}).as_object().cloned().unwrap()),
            )
            .await;
        assert_no_such_tool(&refused);
        let r = call(&c, "create_payment", pay(&format!("small-{era:?}"), "1.00")).await;
        assert_eq!(code(&r), "APPROVAL_REQUIRED");
        assert_eq!(balance(&c, "acct-B").await, "0.00");
    }
    app.stop().await;
}

#[tokio::test]
async fn a_burst_is_rate_limited_and_honouring_retry_after_lets_the_next_call_through() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::new(now_secs()));
    let app = spawn_with_toml(dir.path(), &profiles("100000.00", 1000, 5, 2), &[], Arc::new(clock.clone())).await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let other = connect(&app.url, &app.token("other-agent", ALL_AGENT_SCOPES), Era::Modern).await;

    // Per tool: create_payment allows 2 a minute.
    ok(&call(&c, "create_payment", pay("rl-1", "1.00")).await);
    ok(&call(&c, "create_payment", pay("rl-2", "1.00")).await);
    let r = call(&c, "create_payment", pay("rl-3", "1.00")).await;
    assert_eq!(code(&r), "RATE_LIMITED");
    assert_eq!(err(&r)["retryable"], true);
    // Another agent on the same profile is unaffected.
    ok(&call(&other, "create_payment", pay("other-1", "1.00")).await);

    // All tools together: 5 a minute (3 used above).
    balance(&c, "acct-A").await;
    balance(&c, "acct-A").await;
    let r = call(&c, "get_balance", json!({"account_id": "acct-A"})).await;
    assert_eq!(code(&r), "RATE_LIMITED");
    let wait = err(&r)["retry_after_seconds"].as_u64().expect("retry_after_seconds");
    assert!((1..=60).contains(&wait), "{wait}");
    clock.advance(wait as i64);
    let r = call(&c, "get_balance", json!({"account_id": "acct-A"})).await;
    assert_eq!(ok(&r)["account_id"], "acct-A", "honouring retry_after_seconds lets the next call through");
    assert!(app.audit("dev-agent").await.iter().any(|a| a.decision == "rate_limited"));
    // The refused payment did not move money.
    assert_eq!(balance(&other, "acct-B").await, "3.00");
    app.assert_integrity().await;
    app.stop().await;
}

#[tokio::test]
async fn operator_routes_have_their_own_limit() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::new(now_secs()));
    let app =
        spawn_with_clock(dir.path(), &[("PAYGATE_APPROVALS__ROUTES_PER_MINUTE", "2")], Arc::new(clock.clone())).await;
    let token = app.operator_token("auditor", "payments:audit");
    for _ in 0..2 {
        let (status, _) = operator(&app, reqwest::Method::GET, "/approvals", &token, None).await;
        assert_eq!(status, 200);
    }
    let (status, body) = operator(&app, reqwest::Method::GET, "/approvals", &token, None).await;
    assert_eq!(status, 429);
    assert_eq!(body["error"]["code"], "RATE_LIMITED");
    let (status, _) =
        operator(&app, reqwest::Method::GET, "/approvals", &app.operator_token("auditor-2", "payments:audit"), None)
            .await;
    assert_eq!(status, 200, "another operator is unaffected");
    clock.advance(30);
    let (status, _) = operator(&app, reqwest::Method::GET, "/approvals", &token, None).await;
    assert_eq!(status, 200);
    app.stop().await;
}

/// The no-progress rule (`stop_rules.repeat_max`, default 2): the same refusal for the same
/// payment under a new operation_id suspends at once. A retry of the same operation_id (its answer
/// was lost) is not a new attempt; another intent, or money that moved, starts the row again.
#[tokio::test]
async fn the_same_refusal_for_the_same_payment_twice_in_a_row_suspends() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::new(now_secs()));
    let app =
        spawn_with_clock(dir.path(), &[("PAYGATE_STOP_RULES__DENIALS_MAX", "1000")], Arc::new(clock.clone())).await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let foreign = |op: &str, amount: &str| json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-Z", "amount": amount, "currency": "KES"});
    assert_eq!(code(&call(&c, "create_payment", foreign("x-1", "5.00")).await), "ACCOUNT_NOT_ALLOWED");
    // The same operation again (a lost answer): not a new attempt.
    assert_eq!(code(&call(&c, "create_payment", foreign("x-1", "5.00")).await), "ACCOUNT_NOT_ALLOWED");
    // Another intent in between starts the row again, and so does a payment that went through.
    assert_eq!(code(&call(&c, "create_payment", foreign("y-1", "6.00")).await), "ACCOUNT_NOT_ALLOWED");
    assert_eq!(code(&call(&c, "create_payment", foreign("x-2", "5.00")).await), "ACCOUNT_NOT_ALLOWED");
    ok(&call(&c, "create_payment", pay("fine-1", "1.00")).await);
    assert_eq!(code(&call(&c, "create_payment", foreign("x-3", "5.00")).await), "ACCOUNT_NOT_ALLOWED");
    ok(&call(&c, "get_balance", json!({"account_id": "acct-B"})).await);
    // The same payment under a new operation_id, refused the same way right after: no progress.
    assert_eq!(code(&call(&c, "create_payment", foreign("x-4", "5.00")).await), "ACCOUNT_NOT_ALLOWED");
    let r = call(&c, "create_payment", pay("fine-2", "1.00")).await;
    assert_eq!(code(&r), "PRINCIPAL_SUSPENDED", "suspended at the second refusal in a row");
    let message = err(&r)["message"].as_str().unwrap().to_string();
    assert!(message.contains("no progress") && message.contains("ACCOUNT_NOT_ALLOWED"), "{message}");
    let audit = app.audit("dev-agent").await;
    assert_eq!(audit.iter().filter(|a| a.decision == "suspended").count(), 1, "the suspension is audited once");
    assert_eq!(audit.iter().filter(|a| a.decision == "allowed").count(), 1, "only fine-1 moved money");
    app.assert_integrity().await;
    app.stop().await;
}

/// The no-progress rule also covers a mandate offered again for the same payment under a new
/// operation_id after it was refused (a stale, forged or foreign mandate: "retry with stale mandates").
#[tokio::test]
async fn the_same_refused_mandate_under_a_new_operation_id_suspends() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::new(now_secs()));
    let app =
        spawn_with_clock(dir.path(), &[("PAYGATE_STOP_RULES__DENIALS_MAX", "1000")], Arc::new(clock.clone())).await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let with_mandate = |op: &str| {
        json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": "5000.00",
               "currency": "KES", "mandate": "eyJhbGciOiJIUzI1NiJ9.eyJqdGkiOiJ4In0.c2lnbmF0dXJl"})
    };
    let first = code(&call(&c, "create_payment", with_mandate("m-1")).await);
    assert!(first.starts_with("MANDATE_"), "{first}");
    assert_eq!(code(&call(&c, "create_payment", with_mandate("m-2")).await), first);
    let r = call(&c, "create_payment", pay("fine", "1.00")).await;
    assert_eq!(code(&r), "PRINCIPAL_SUSPENDED");
    assert!(err(&r)["message"].as_str().unwrap().contains("no progress"));
    app.stop().await;
}
