//! The approval flow end to end: an agent over MCP, a human over HTTP, a signed mandate, one payment.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use common::*;
use serde_json::json;

#[tokio::test]
async fn over_limit_payment_is_approved_by_a_human_and_moves_exactly_once() {
    let (app, _dir) = spawn_app().await;
    for era in ERAS {
        let agent = connect(&app.url, &app.dev_token(), era).await;
        let before_b = balance(&agent, "acct-B").await;
        let op = format!("big-{era:?}");
        let ask = json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B",
                         "amount": "5000.00", "currency": "KES"});

        // 1. The agent asks for KES 5,000: over its autonomous limit.
        let r = call(&agent, "create_payment", ask.clone()).await;
        assert_eq!(code(&r), "APPROVAL_REQUIRED");
        let approval_id = err(&r)["approval_id"].as_str().unwrap().to_string();
        assert_eq!(err(&r)["approval_url"], format!("{}/approvals/{approval_id}", app.base()));

        // 2. Pending: no mandate yet.
        let r = call(&agent, "get_approval", json!({"approval_id": approval_id})).await;
        assert_eq!(ok(&r)["status"], "pending");
        assert!(ok(&r)["mandate"].is_null());

        // 3. An operator approves through the route.
        let (status, body) = approve(&app, &approval_id, "alice").await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["status"], "approved");
        assert_eq!(body["approved_by"], json!(["alice"]));
        assert!(body["mandate"].is_null(), "operators do not receive the agent's mandate");

        // A retry without the mandate names the same, now approved, approval.
        let r = call(&agent, "create_payment", ask.clone()).await;
        assert_eq!(err(&r)["approval_id"], approval_id.as_str());
        assert_eq!(err(&r)["approval_status"], "approved");

        // 4. The agent fetches the mandate and pays with it.
        let r = call(&agent, "get_approval", json!({"approval_id": approval_id})).await;
        assert_eq!(ok(&r)["status"], "approved");
        let mandate = ok(&r)["mandate"].as_str().unwrap().to_string();
        let mut with_mandate = ask.clone();
        with_mandate["mandate"] = json!(mandate);
        let paid = call(&agent, "create_payment", with_mandate.clone()).await;
        assert_eq!(ok(&paid)["replayed"], false);
        let payment_id = ok(&paid)["payment_id"].clone();

        // 5. A retry with the same mandate replays; money moved once.
        let again = call(&agent, "create_payment", with_mandate).await;
        assert_eq!(ok(&again)["replayed"], true);
        assert_eq!(ok(&again)["payment_id"], payment_id);
        let moved = |b: &str| (b.parse::<f64>().unwrap() * 100.0).round() as i64;
        assert_eq!(moved(&balance(&agent, "acct-B").await) - moved(&before_b), 500_000);
        agent.cancel().await.unwrap();
    }
    let audit = app.audit("dev-agent").await;
    assert!(audit.iter().any(|a| a.decision == "mandate_accepted"));
    let operator_audit = app.audit("alice").await;
    assert!(operator_audit.iter().any(|a| a.tool == "approvals.approve" && a.decision == "recorded"));
    assert!(operator_audit.iter().any(|a| a.tool == "mandates.issue"));
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}
