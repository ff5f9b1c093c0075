//! Store failures on the money path, injected into the real database: a SQLite trigger that
//! raises on one table's writes makes exactly that store call fail (no test hook in the gateway).
//! For each, the agent gets a typed, retryable error (INTERNAL, or BACKEND_UNAVAILABLE where the
//! embedded ledger's own posting transaction failed), nothing moves, and once the fault is gone
//! the same call converges on one payment (or one approval).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use common::*;
use serde_json::{Value, json};

/// A statement against the gateway's own database file, as another process would run it.
fn sql(app: &TestApp, statement: &str) {
    let db = rusqlite::Connection::open(app.data_dir.join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    db.execute_batch(statement).unwrap();
}

/// Make every write of `event` (e.g. "INSERT ON approvals") fail until `heal`.
fn inject(app: &TestApp, event: &str) {
    sql(
        app,
        &format!("CREATE TRIGGER injected_fault BEFORE {event} BEGIN SELECT RAISE(ABORT, 'injected fault'); END;"),
    );
}

fn heal(app: &TestApp) {
    sql(app, "DROP TRIGGER injected_fault");
}

fn pay(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"})
}

async fn payments(agent: &Client) -> usize {
    ok(&call(agent, "list_payments", json!({"limit": 100})).await)["payments"].as_array().unwrap().len()
}

/// The agent's error for a store failure: `want` (INTERNAL for the gateway's own records;
/// BACKEND_UNAVAILABLE when the embedded ledger's posting transaction fails: the payment system
/// could not post, and nothing moved), retryable, in the gateway's own words only.
fn assert_refused(r: &rmcp::model::CallToolResult, want: &str, what: &str) {
    assert_eq!(code(r), want, "{what}: {r:?}");
    assert_eq!(err(r)["retryable"], true, "{what}: the agent is told to retry the same call");
    assert!(!err(r)["message"].as_str().unwrap().contains("injected"), "{what}: store text leaked: {r:?}");
}

#[tokio::test]
async fn a_failing_key_write_in_the_posting_transaction_moves_nothing_and_the_retry_pays_once() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let before = (balance(&agent, "acct-A").await, balance(&agent, "acct-B").await);
    inject(&app, "INSERT ON idempotency_records");
    let r = call(&agent, "create_payment", pay("fault-1", "25.00")).await;
    assert_refused(&r, "BACKEND_UNAVAILABLE", "the key's claim in the posting transaction failed");
    assert_eq!((balance(&agent, "acct-A").await, balance(&agent, "acct-B").await), before, "nothing moved");
    assert_eq!(payments(&agent).await, 0);
    heal(&app);
    let first = call(&agent, "create_payment", pay("fault-1", "25.00")).await;
    assert_eq!((ok(&first)["status"].as_str(), ok(&first)["replayed"].as_bool()), (Some("succeeded"), Some(false)));
    let again = call(&agent, "create_payment", pay("fault-1", "25.00")).await;
    assert_eq!(
        (ok(&again)["payment_id"].clone(), ok(&again)["replayed"].clone()),
        (ok(&first)["payment_id"].clone(), json!(true))
    );
    assert_eq!((payments(&agent).await, balance(&agent, "acct-B").await.as_str()), (1, "25.00"));
    app.assert_integrity().await;
    app.stop().await;
}

#[tokio::test]
async fn a_failing_posting_write_moves_nothing_and_the_retry_pays_once() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    inject(&app, "INSERT ON postings");
    let r = call(&agent, "create_payment", pay("fault-2", "30.00")).await;
    assert_refused(&r, "BACKEND_UNAVAILABLE", "the posting failed");
    assert_eq!((payments(&agent).await, balance(&agent, "acct-B").await.as_str()), (0, "0.00"), "nothing moved");
    heal(&app);
    let paid = call(&agent, "create_payment", pay("fault-2", "30.00")).await;
    assert_eq!(ok(&paid)["replayed"], false, "the key was not left claimed by the failed attempt");
    assert_eq!((payments(&agent).await, balance(&agent, "acct-B").await.as_str()), (1, "30.00"));
    app.assert_integrity().await;
    app.stop().await;
}

#[tokio::test]
async fn a_failing_approval_write_asks_nobody_and_the_retry_asks_once() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    inject(&app, "INSERT ON approvals");
    let r = call(&agent, "create_payment", pay("fault-3", "5000.00")).await;
    assert_refused(&r, "INTERNAL", "the approval was not written");
    let token = app.operator_token("auditor", "payments:audit");
    let (_, listed) = operator(&app, reqwest::Method::GET, "/operator/v1/approvals?status=pending", &token, None).await;
    assert_eq!(listed["items"], json!([]), "no approval half-made: {listed}");
    heal(&app);
    let asked = call(&agent, "create_payment", pay("fault-3", "5000.00")).await;
    assert_eq!(code(&asked), "APPROVAL_REQUIRED");
    let again = call(&agent, "create_payment", pay("fault-3", "5000.00")).await;
    assert_eq!(err(&again)["approval_id"], err(&asked)["approval_id"], "one approval for the operation");
    assert_eq!(payments(&agent).await, 0);
    app.stop().await;
}

/// A stored outcome that no longer reads (a damaged row) is never taken for "not paid yet": the
/// retry is refused (INTERNAL), and nothing is paid a second time.
#[tokio::test]
async fn an_unreadable_stored_outcome_is_refused_never_paid_again() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    assert_eq!(ok(&call(&agent, "create_payment", pay("fault-4", "40.00")).await)["status"], "succeeded");
    sql(&app, "UPDATE idempotency_records SET outcome = '{not json' WHERE state = 'completed'");
    let r = call(&agent, "create_payment", pay("fault-4", "40.00")).await;
    assert_refused(&r, "INTERNAL", "the stored outcome does not read");
    assert_eq!((payments(&agent).await, balance(&agent, "acct-B").await.as_str()), (1, "40.00"), "paid once");
    app.stop().await;
}
