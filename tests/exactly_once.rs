//! Invariants 1-3 through the real server: one operation_id moves money at most once, changed
//! arguments conflict, and nothing moves without policy.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;

use common::*;
use serde_json::{Value, json};
use tokio::sync::Barrier;

fn pay(op: &str, from: &str, to: &str, amount: &str) -> Value {
    json!({"operation_id": op, "from_account": from, "to_account": to, "amount": amount, "currency": "KES"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sixty_four_concurrent_identical_calls_pay_once() {
    let (app, _dir) = spawn_app().await;
    let token = app.dev_token();
    // 8 clients x 8 calls, all released together.
    let mut clients = Vec::new();
    for i in 0..8 {
        clients.push(Arc::new(connect(&app.url, &token, if i % 2 == 0 { Era::Modern } else { Era::Legacy }).await));
    }
    let barrier = Arc::new(Barrier::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..64 {
        let client = clients[n % 8].clone();
        let barrier = barrier.clone();
        tasks.spawn(async move {
            barrier.wait().await;
            call(&client, "create_payment", pay("concurrent-1", "acct-A", "acct-B", "25.00")).await
        });
    }
    let mut fresh = 0;
    let mut replays = 0;
    let mut ids = std::collections::HashSet::new();
    while let Some(r) = tasks.join_next().await {
        let r = r.unwrap();
        let v = ok(&r);
        ids.insert(v["payment_id"].as_str().unwrap().to_string());
        if v["replayed"] == true { replays += 1 } else { fresh += 1 }
    }
    assert_eq!((fresh, replays), (1, 63));
    assert_eq!(ids.len(), 1, "every call names the same payment");
    // The ledger, not the responses, is the judge.
    let c = &clients[0];
    assert_eq!(balance(c, "acct-B").await, "25.00");
    assert_eq!(balance(c, "acct-A").await, "999975.00");
    let r = call(c, "list_payments", json!({"account_id": "acct-B", "limit": 100})).await;
    assert_eq!(ok(&r)["payments"].as_array().unwrap().len(), 1);
    app.assert_integrity().await;
    let audit = app.audit("dev-agent").await;
    assert_eq!(audit.iter().filter(|a| a.decision == "allowed").count(), 1);
    assert_eq!(audit.iter().filter(|a| a.decision == "replayed").count(), 63);
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn a_retry_after_restart_replays_instead_of_paying_again() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[]).await;
    let c = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let first = call(&c, "create_payment", pay("restart-1", "acct-A", "acct-B", "100.00")).await;
    let first_id = ok(&first)["payment_id"].clone();
    c.cancel().await.unwrap();
    app.stop().await;

    // Same data directory, new process state, new port.
    let app = spawn_on(dir.path(), &[]).await;
    for era in ERAS {
        let c = connect(&app.url, &app.dev_token(), era).await;
        let again = call(&c, "create_payment", pay("restart-1", "acct-A", "acct-B", "100.00")).await;
        assert_eq!(ok(&again)["payment_id"], first_id);
        assert_eq!(ok(&again)["replayed"], true);
        assert_eq!(balance(&c, "acct-B").await, "100.00");
    }
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn changed_arguments_conflict_and_move_nothing() {
    let (app, _dir) = spawn_app().await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    ok(&call(&c, "create_payment", pay("conflict-1", "acct-A", "acct-B", "10.00")).await);
    // "10" and "10.00" are the same amount: a replay, not a conflict.
    let same = call(&c, "create_payment", pay("conflict-1", "acct-A", "acct-B", "10")).await;
    assert_eq!(ok(&same)["replayed"], true);
    for changed in [
        pay("conflict-1", "acct-A", "acct-B", "10.01"),
        pay("conflict-1", "acct-B", "acct-A", "10.00"),
        // Over the limit with a used key: still a conflict, not a new approval.
        pay("conflict-1", "acct-A", "acct-B", "5000.00"),
    ] {
        let r = call(&c, "create_payment", changed).await;
        assert_eq!(code(&r), "IDEMPOTENCY_CONFLICT");
        assert_eq!(err(&r)["retryable"], false);
    }
    assert_eq!(balance(&c, "acct-B").await, "10.00");
    let audit = app.audit("dev-agent").await;
    assert_eq!(audit.iter().filter(|a| a.decision == "conflict").count(), 3);
    assert!(audit.iter().all(|a| a.correlation_id.starts_with("corr_")));
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn over_the_limit_needs_approval_and_moves_nothing() {
    let (app, _dir) = spawn_app().await;
    let c = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let r = call(&c, "create_payment", pay("big-1", "acct-A", "acct-B", "1000.01")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED");
    let approval_id = err(&r)["approval_id"].as_str().unwrap().to_string();
    assert!(approval_id.starts_with("apr_"));
    // The approval is real and pending.
    let stored = app
        .running
        .store
        .approval_get(&paygate::domain::ids::ApprovalId::parse(&approval_id).unwrap())
        .await
        .unwrap()
        .expect("approval stored");
    assert_eq!(stored.status.as_str(), "pending");
    assert_eq!(stored.amount_minor, 100_001);
    // Retrying the same operation names the same approval rather than piling up new ones.
    let again = call(&c, "create_payment", pay("big-1", "acct-A", "acct-B", "1000.01")).await;
    assert_eq!(err(&again)["approval_id"], approval_id.as_str());
    // At the limit is fine.
    ok(&call(&c, "create_payment", pay("at-limit", "acct-A", "acct-B", "1000.00")).await);
    assert_eq!(balance(&c, "acct-B").await, "1000.00");
    let audit = app.audit("dev-agent").await;
    let approvals: Vec<_> = audit.iter().filter(|a| a.decision == "approval_required").collect();
    assert_eq!(approvals.len(), 2);
    assert!(approvals.iter().all(|a| a.approval_id.as_deref() == Some(approval_id.as_str())));
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn disallowed_accounts_are_refused() {
    let (app, _dir) = spawn_app().await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    for args in [pay("z-1", "acct-A", "acct-Z", "1.00"), pay("z-2", "acct-Z", "acct-A", "1.00")] {
        let r = call(&c, "create_payment", args).await;
        assert_eq!(code(&r), "ACCOUNT_NOT_ALLOWED");
    }
    let r = call(&c, "get_balance", json!({"account_id": "acct-Z"})).await;
    assert_eq!(code(&r), "ACCOUNT_NOT_ALLOWED");
    // An agent whose profile names no accounts can move nothing at all.
    let stranger = connect(&app.url, &app.token("stranger", ALL_AGENT_SCOPES), Era::Modern).await;
    let r = call(&stranger, "create_payment", pay("s-1", "acct-A", "acct-B", "1.00")).await;
    assert_eq!(code(&r), "ACCOUNT_NOT_ALLOWED");
    assert_eq!(balance(&c, "acct-A").await, "1000000.00");
    let audit = app.audit("dev-agent").await;
    assert_eq!(audit.iter().filter(|a| a.code.as_deref() == Some("ACCOUNT_NOT_ALLOWED")).count(), 3);
    assert_eq!(app.audit("stranger").await[0].decision, "denied");
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn insufficient_funds_is_this_operations_outcome_for_good() {
    let (app, _dir) = spawn_app().await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    // acct-B starts empty.
    let r = call(&c, "create_payment", pay("overdraft-1", "acct-B", "acct-A", "5.00")).await;
    assert_eq!(code(&r), "INSUFFICIENT_FUNDS");
    let r = call(&c, "create_payment", pay("overdraft-1", "acct-B", "acct-A", "5.00")).await;
    assert_eq!(code(&r), "INSUFFICIENT_FUNDS");
    assert_eq!(err(&r)["replayed"], true);
    // Even once the money is there, the failed operation_id stays failed; a new one succeeds.
    ok(&call(&c, "create_payment", pay("fund-b", "acct-A", "acct-B", "20.00")).await);
    let r = call(&c, "create_payment", pay("overdraft-1", "acct-B", "acct-A", "5.00")).await;
    assert_eq!(code(&r), "INSUFFICIENT_FUNDS");
    let r = call(&c, "create_payment", pay("overdraft-2", "acct-B", "acct-A", "5.00")).await;
    assert_eq!(ok(&r)["replayed"], false);
    assert_eq!(balance(&c, "acct-B").await, "15.00");
    let audit = app.audit("dev-agent").await;
    assert_eq!(audit.iter().filter(|a| a.decision == "failed").count(), 1);
    assert_eq!(
        audit.iter().filter(|a| a.decision == "replayed" && a.code.as_deref() == Some("INSUFFICIENT_FUNDS")).count(),
        2
    );
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn refunds_are_exactly_once_and_bounded() {
    let (app, _dir) = spawn_app().await;
    let c = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let p = call(&c, "create_payment", pay("to-refund", "acct-A", "acct-B", "30.00")).await;
    let pid = ok(&p)["payment_id"].as_str().unwrap().to_string();
    let refund = json!({"operation_id": "r-1", "payment_id": pid, "amount": "20.00"});
    let first = call(&c, "refund_payment", refund.clone()).await;
    let second = call(&c, "refund_payment", refund).await;
    assert_eq!(ok(&first)["payment_id"], ok(&second)["payment_id"]);
    assert_eq!(ok(&second)["replayed"], true);
    // Only 10.00 remains refundable.
    let r = call(&c, "refund_payment", json!({"operation_id": "r-2", "payment_id": pid, "amount": "10.01"})).await;
    assert_eq!(code(&r), "INVALID_ARGUMENT");
    let r = call(&c, "refund_payment", json!({"operation_id": "r-3", "payment_id": pid})).await;
    assert_eq!(ok(&r)["amount"], "10.00");
    assert_eq!(balance(&c, "acct-B").await, "0.00");
    let r = call(&c, "refund_payment", json!({"operation_id": "r-4", "payment_id": pid})).await;
    assert_eq!(code(&r), "INVALID_ARGUMENT");
    // Nothing is left, yet r-3's retry replays r-3's refund; r-3 with other arguments is no retry
    // of it, and is refused like any other call (never answered with r-3's refund).
    let again = call(&c, "refund_payment", json!({"operation_id": "r-3", "payment_id": pid})).await;
    assert_eq!((ok(&again)["amount"].as_str(), ok(&again)["replayed"].as_bool()), (Some("10.00"), Some(true)));
    let other = call(&c, "refund_payment", json!({"operation_id": "r-3", "payment_id": pid, "reason": "again"})).await;
    assert_eq!(code(&other), "INVALID_ARGUMENT", "{other:?}");
    // A refund needs its own scope.
    let no_refund = app.token("dev-agent", "payments:read payments:create");
    let limited = connect(&app.url, &no_refund, Era::Modern).await;
    let denied = limited
        .call_tool(
            rmcp::model::CallToolRequestParams::new("refund_payment")
                .with_arguments(json!({"operation_id": "r-5", "payment_id": pid}).as_object().cloned().unwrap()),
        )
        .await;
    assert_step_up(&denied, "payments:refund");
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

/// A key another attempt holds in flight the old way (reserved before posting, its lease live: a
/// replica on an older version, say) is waited for, never claimed over: nothing posts while it is
/// held. A call that outlasts `idempotency.wait_ms_max` is told OPERATION_IN_PROGRESS; one that is
/// waiting when the key is given back posts exactly once, and retries replay.
#[tokio::test]
async fn a_key_held_in_flight_elsewhere_is_waited_for_then_paid_once() {
    use paygate::domain::idempotency::NewIdempotencyRecord;
    use paygate::idempotency::{KeyDeriver, fingerprint};
    let secret = "idempotency-secret-for-this-test-0123456789abcdef";
    let dir = tempfile::tempdir().unwrap();
    let app =
        spawn_on(dir.path(), &[("PAYGATE_IDEMPOTENCY__SECRET", secret), ("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "300")])
            .await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let args = json!({"operation_id": "held-1", "from_account": "acct-A", "to_account": "acct-B",
                      "amount": "50.00", "currency": "KES"});
    // The key and fingerprint the gateway derives for this call, held elsewhere.
    let key = KeyDeriver::new(paygate::secret::Secret::new(secret.into())).key(
        DEV_ISSUER,
        "dev-agent",
        "create_payment",
        "held-1",
    );
    let fp = fingerprint(&json!({"args": {"from": "acct-A", "to": "acct-B", "amount_minor": 5000,
                                          "currency": "KES", "memo": null}}));
    let now = now_secs();
    let held = NewIdempotencyRecord {
        key: key.clone(),
        fingerprint: fp,
        tool: "create_payment".into(),
        principal_iss: DEV_ISSUER.into(),
        principal_sub: "dev-agent".into(),
        lease_until: now + 600,
        expires_at: now + 3600,
    };
    assert_eq!(
        app.running.store.idem_reserve(held, now).await.unwrap(),
        paygate::domain::idempotency::Reservation::Acquired
    );
    let before = balance(&agent, "acct-A").await;
    let waits = || async {
        let text = reqwest::get(format!("{}/metrics", app.base())).await.unwrap().text().await.unwrap();
        let line = text.lines().find(|l| l.starts_with("paygate_idempotency_key_waits_total ")).unwrap().to_string();
        line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
    };
    // Held past the bounded wait (300 ms): the call waited, then was told to retry; nothing moved.
    let r = call(&agent, "create_payment", args.clone()).await;
    assert_eq!(code(&r), "OPERATION_IN_PROGRESS", "{r:?}");
    assert_eq!(waits().await, 1, "the call waited for the holder before answering");
    assert_eq!(balance(&agent, "acct-A").await, before, "nothing posted under a held key");
    app.stop().await;

    // A long wait: the call is waiting (the gateway counted it) when the key is given back
    // (nothing moved there); then it posts, once, and the retry replays.
    let app =
        spawn_on(dir.path(), &[("PAYGATE_IDEMPOTENCY__SECRET", secret), ("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "60000")])
            .await;
    let agent = Arc::new(connect(&app.url, &app.dev_token(), Era::Modern).await);
    let waiting = {
        let (agent, args) = (agent.clone(), args.clone());
        tokio::spawn(async move { call(&agent, "create_payment", args).await })
    };
    let waits = || async {
        let text = reqwest::get(format!("{}/metrics", app.base())).await.unwrap().text().await.unwrap();
        let line = text.lines().find(|l| l.starts_with("paygate_idempotency_key_waits_total ")).unwrap().to_string();
        line.rsplit(' ').next().unwrap().parse::<u64>().unwrap()
    };
    while waits().await == 0 {
        assert!(!waiting.is_finished(), "the call answered without waiting");
        tokio::task::yield_now().await;
    }
    assert_eq!(balance(&agent, "acct-A").await, before, "nothing posts while the key is held");
    app.running.store.idem_release(&key).await.unwrap();
    let first = waiting.await.unwrap();
    assert_eq!(ok(&first)["replayed"], false, "the waiting call posted: {first:?}");
    let again = call(&agent, "create_payment", args).await;
    assert_eq!(ok(&first)["payment_id"], ok(&again)["payment_id"]);
    assert_eq!(ok(&again)["replayed"], true);
    assert_eq!(balance(&agent, "acct-B").await, "50.00", "one payment");
    app.assert_integrity().await;
    if let Ok(agent) = Arc::try_unwrap(agent) {
        let _ = agent.cancel().await;
    }
    app.stop().await;
}
