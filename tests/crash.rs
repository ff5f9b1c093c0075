//! Crash for real: run the paygate binary, SIGKILL it under load, restart it on the same data
//! directory, retry every operation_id, and check that each moved money exactly once.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::path::Path;
use std::sync::Arc;

use common::*;
use serde_json::json;

/// Start the binary on `dir` (and on PostgreSQL when `db` is given).
fn start_binary(dir: &Path, db: Option<&Db>) -> Proc {
    let mut env = vec![
        ("PAYGATE_STORAGE__DATA_DIR", dir.to_str().unwrap()),
        ("PAYGATE_DEV__SCOPES", "payments:read payments:create"),
        // A crashed holder's key is taken over once its lease ends; keep that short for the test.
        ("PAYGATE_IDEMPOTENCY__LEASE_SECS", "1"),
    ];
    if let Some(db) = db {
        env.push(("PAYGATE_STORAGE__URL", &db.url));
        env.push(("PAYGATE_STORAGE__POSTGRES_SCHEMA", &db.schema));
    }
    spawn_binary(&env)
}

fn pay(n: usize) -> serde_json::Value {
    json!({"operation_id": format!("crash-{n}"), "from_account": "acct-A", "to_account": "acct-B",
           "amount": "1.00", "currency": "KES"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn sigkill_under_load_then_retry_moves_each_payment_once() {
    let dir = tempfile::tempdir().unwrap();
    storm_kill_replay(dir.path(), None).await;
    let store = paygate::store::sqlite::SqliteStore::open(&dir.path().join("paygate.sqlite3")).unwrap();
    let report = paygate::store::LedgerStore::ledger_integrity(&store).await.unwrap();
    assert!(report.ok, "{:?}", report.problems);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_postgres_replica_killed_mid_storm_loses_nothing() {
    let Some(db) = database("crash (postgres)") else { return };
    let dir = tempfile::tempdir().unwrap();
    storm_kill_replay(dir.path(), Some(&db)).await;
    let store = paygate::store::postgres::PostgresStore::connect(&db.url, &db.schema).await.unwrap();
    let report = paygate::store::LedgerStore::ledger_integrity(&store).await.unwrap();
    assert!(report.ok, "{:?}", report.problems);
}

async fn storm_kill_replay(dir: &Path, db: Option<&Db>) {
    const N: usize = 60;
    let mut first = start_binary(dir, db);

    let client = Arc::new(connect(&first.url, &first.token, Era::Modern).await);
    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    let mut load = tokio::task::JoinSet::new();
    for n in 0..N {
        let client = client.clone();
        let done = done_tx.clone();
        load.spawn(async move {
            let args = pay(n).as_object().cloned().unwrap();
            let r =
                client.call_tool(rmcp::model::CallToolRequestParams::new("create_payment").with_arguments(args)).await;
            // Only a payment the server confirmed counts as answered.
            let paid = matches!(&r, Ok(res) if res.is_error != Some(true));
            if !paid {
                eprintln!("before the kill: {r:?}");
            }
            let _ = done.send(paid);
        });
    }
    drop(done_tx);
    // Kill once some calls have answered and others are still in flight (counted, not timed).
    let mut answered = 0;
    while answered < 5 {
        match done_rx.recv().await {
            Some(true) => answered += 1,
            Some(false) => {}
            None => panic!("every call ended and only {answered} of {N} succeeded: the gateway failed before the kill"),
        }
    }
    first.kill();
    load.shutdown().await;
    // Every answer that came before the kill is in the channel by now: the kill must have cut
    // some calls short, or the test proved nothing about a crash under load.
    while let Ok(paid) = done_rx.try_recv() {
        answered += usize::from(paid);
    }
    eprintln!("{answered} of {N} calls answered before the kill");
    assert!(answered < N, "all {N} calls finished before the kill: nothing was in flight (raise N)");

    let mut second = start_binary(dir, db);
    let c = connect(&second.url, &second.token, Era::Modern).await;
    let mut replayed = 0;
    for n in 0..N {
        let r = call(&c, "create_payment", pay(n)).await;
        if ok(&r)["replayed"] == true {
            replayed += 1;
        }
    }
    assert!(replayed >= answered, "every call answered before the kill replays ({replayed} of {answered})");
    // Exactly N payments of 1.00, whatever the kill interrupted.
    assert_eq!(balance(&c, "acct-B").await, format!("{N}.00"));
    let r = call(&c, "list_payments", json!({"account_id": "acct-B", "limit": 100})).await;
    assert_eq!(ok(&r)["payments"].as_array().unwrap().len(), N);
    c.cancel().await.unwrap();
    second.kill();
}
