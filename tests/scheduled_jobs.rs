//! The real server's scheduler: audit retention (records past `audit.retention_days` are written to a
//! JSON Lines archive and only then leave the database; the run is audited), and the periodic
//! incremental ledger check (it keeps the integrity checkpoint current, and a failure is audited and
//! keeps being reported until the ledger is mended).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use paygate::clock::ManualClock;
use serde_json::json;

#[tokio::test]
async fn the_scheduler_archives_audit_records_past_retention_and_they_read_back() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(now_secs()));
    let overrides = [
        ("PAYGATE_AUDIT__RETENTION_DAYS", "1"),
        ("PAYGATE_AUDIT__SEAL_EVERY_SECS", "1"),
        ("PAYGATE_JOBS__PURGE_EVERY_SECS", "1"),
        ("PAYGATE_JOBS__TICK_MS", "20"),
    ];
    let app = spawn_with_clock(dir.path(), &overrides, clock.clone()).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let pay = json!({"operation_id": "old-1", "from_account": "acct-A", "to_account": "acct-B",
                     "amount": "10.00", "currency": "KES"});
    ok(&call(&agent, "create_payment", pay).await);
    let old = app.audit("dev-agent").await;
    assert!(!old.is_empty());
    // Sealed within the sealing interval, as a store's records are (a chain is never begun over
    // records older than it: the clock's jump below must come after the first seal).
    let store = app.running.store.clone();
    until("the first sealing run", || {
        let store = store.clone();
        async move { (store.audit_unsealed().await.unwrap().count == 0).then_some(()) }
    })
    .await;

    // Two days later the job finds them past retention: archived, then deleted.
    clock.advance(2 * 86_400);
    let archive = dir.path().join("audit-archive");
    let file = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let found = std::fs::read_dir(&archive).ok().and_then(|d| {
                d.filter_map(Result::ok).map(|e| e.path()).find(|p| p.extension().is_some_and(|x| x == "jsonl"))
            });
            if let Some(f) = found {
                return f;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("an archive file appears");
    let archived = paygate::audit_archive::read(&file).unwrap();
    for r in &old {
        assert!(archived.contains(r), "archived: {r:?}");
    }
    // Gone from the database, and the archival itself is on record.
    let trail = tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            let all = app.running.store.audit_list(None, 1000).await.unwrap();
            if all.iter().any(|r| r.tool == "audit.archive") {
                return all;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .expect("the archival is audited");
    assert!(!trail.iter().any(|r| old.contains(r)), "archived records left the database");
    agent.cancel().await.unwrap();
}

/// Wait (bounded) until `probe` answers something.
async fn until<T, F: std::future::Future<Output = Option<T>>>(what: &str, mut probe: impl FnMut() -> F) -> T {
    tokio::time::timeout(Duration::from_secs(20), async {
        loop {
            if let Some(v) = probe().await {
                return v;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    })
    .await
    .unwrap_or_else(|_| panic!("timed out waiting for {what}"))
}

#[tokio::test]
async fn the_scheduled_integrity_check_keeps_the_checkpoint_current_and_audits_a_failure() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = [("PAYGATE_JOBS__INTEGRITY_EVERY_SECS", "1"), ("PAYGATE_JOBS__TICK_MS", "20")];
    let app = spawn_on(dir.path(), &overrides).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    for i in 0..3 {
        let pay = json!({"operation_id": format!("p-{i}"), "from_account": "acct-A", "to_account": "acct-B",
                         "amount": "10.00", "currency": "KES"});
        ok(&call(&agent, "create_payment", pay).await);
    }
    let store = app.running.store.clone();
    let postings = store.ledger_integrity().await.unwrap().postings_checked;
    // The job's clean checks move the checkpoint past every posting made.
    let covered = until("the checkpoint to cover every posting", || {
        let store = store.clone();
        async move { store.checkpoint_get().await.unwrap().filter(|c| c.postings >= postings) }
    })
    .await;
    assert!(!covered.balances.is_empty());

    // A balance changed behind the ledger's back: the next run audits the failure ...
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute("UPDATE accounts SET balance_minor = balance_minor + 1 WHERE id = 'acct-B'", []).unwrap();
    let failed = until("an audited integrity failure", || {
        let store = store.clone();
        async move {
            let all = store.audit_list(None, 1000).await.unwrap();
            all.into_iter().find(|r| r.decision == "integrity_failed")
        }
    })
    .await;
    assert!(failed.detail.as_deref().is_some_and(|d| d.contains("acct-B")), "{failed:?}");
    // ... and every run after it, until someone mends the ledger.
    until("a second audited failure", || {
        let store = store.clone();
        async move {
            let all = store.audit_list(None, 1000).await.unwrap();
            (all.iter().filter(|r| r.decision == "integrity_failed").count() >= 2).then_some(())
        }
    })
    .await;
    agent.cancel().await.unwrap();
}

/// The ninth review's residual: a daily usage counter reset in the database let an agent pay past
/// its limit, and only a full integrity check — which nothing scheduled — named it. The
/// `check_integrity_full` job runs it: the reset is audited (`integrity_failed`) without anyone
/// asking, though the incremental check finds nothing wrong.
#[tokio::test]
async fn the_scheduled_full_check_names_a_usage_counter_reset_in_the_database() {
    let dir = tempfile::tempdir().unwrap();
    let quiet = [("PAYGATE_JOBS__ENABLED", "false")];
    let app = spawn_on(dir.path(), &quiet).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let pay = json!({"operation_id": "p-1", "from_account": "acct-A", "to_account": "acct-B",
                     "amount": "10.00", "currency": "KES"});
    ok(&call(&agent, "create_payment", pay).await);
    agent.cancel().await.unwrap();
    // A clean check, as the incremental job makes every minute: the checkpoint the next one starts from.
    assert!(app.running.gateway.scheduled_integrity(false).await.unwrap().ok);
    app.stop().await;
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    db.execute("DELETE FROM budget_usage", []).unwrap();
    let overrides = [("PAYGATE_JOBS__INTEGRITY_FULL_EVERY_SECS", "1"), ("PAYGATE_JOBS__TICK_MS", "20")];
    let app = spawn_on(dir.path(), &overrides).await;
    let store = app.running.store.clone();
    let incremental = app.running.gateway.scheduled_integrity(false).await.unwrap();
    assert!(incremental.ok, "the incremental check sees nothing wrong: {incremental:?}");
    let failed = until("an audited full-check failure", || {
        let store = store.clone();
        async move {
            let all = store.audit_list(None, 1000).await.unwrap();
            all.into_iter().find(|r| r.decision == "integrity_failed")
        }
    })
    .await;
    assert!(
        failed.detail.as_deref().is_some_and(|d| d.contains("budget_usage") && d.contains("dev-agent")),
        "{failed:?}"
    );
    app.stop().await;
}

/// The eleventh review (low): a `seal_audit` lease taken with a long `audit.seal_every_secs`
/// outlived a graceful stop, so the restarted gateway, with a short interval, did not seal until
/// it ended. A graceful stop gives its job leases back.
#[tokio::test]
async fn a_graceful_stop_gives_its_job_leases_back() {
    let dir = tempfile::tempdir().unwrap();
    let long = [("PAYGATE_AUDIT__SEAL_EVERY_SECS", "3600"), ("PAYGATE_JOBS__TICK_MS", "20")];
    let app = spawn_on(dir.path(), &long).await;
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    let leases = |db: &rusqlite::Connection| -> i64 {
        db.query_row("SELECT COUNT(*) FROM job_leases WHERE kind = 'seal_audit'", [], |r| r.get(0)).unwrap()
    };
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while leases(&db) == 0 {
        assert!(std::time::Instant::now() < deadline, "the seal_audit lease was never taken");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    app.stop().await;
    assert_eq!(leases(&db), 0, "given back at the stop");
    // Restarted with a short interval, it seals at once.
    let app = spawn_on(dir.path(), &[("PAYGATE_AUDIT__SEAL_EVERY_SECS", "1"), ("PAYGATE_JOBS__TICK_MS", "20")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let pay = json!({"operation_id": "p-1", "from_account": "acct-A", "to_account": "acct-B",
                     "amount": "1.00", "currency": "KES"});
    ok(&call(&agent, "create_payment", pay).await);
    agent.cancel().await.unwrap();
    let store = app.running.store.clone();
    until("the restarted gateway's sealing", || {
        let store = store.clone();
        async move { (store.audit_unsealed().await.unwrap().count == 0).then_some(()) }
    })
    .await;
    app.stop().await;
}

/// The seal_audit job seals what committed onto the hash chain and signs a checkpoint of the head;
/// the chain then verifies whole.
#[tokio::test]
async fn the_scheduler_seals_the_audit_trail_and_signs_checkpoints() {
    let dir = tempfile::tempdir().unwrap();
    let overrides = [("PAYGATE_AUDIT__SEAL_EVERY_SECS", "1"), ("PAYGATE_JOBS__TICK_MS", "20")];
    let app = spawn_on(dir.path(), &overrides).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let pay = json!({"operation_id": "seal-1", "from_account": "acct-A", "to_account": "acct-B",
                     "amount": "10.00", "currency": "KES"});
    ok(&call(&agent, "create_payment", pay).await);
    let store = app.running.store.clone();
    let checkpoint = until("the trail sealed and checkpointed", || {
        let store = store.clone();
        async move {
            let unsealed = store.audit_unsealed().await.unwrap().count;
            let cp = store.audit_checkpoint_latest().await.unwrap();
            cp.filter(|_| unsealed == 0)
        }
    })
    .await;
    let head = store.audit_chain_head().await.unwrap();
    assert!(head.chain_seq >= 1 && checkpoint.chain_seq <= head.chain_seq, "{head:?} {checkpoint:?}");
    let verdict = app.running.gateway.verify_audit(None).await.unwrap();
    assert!(verdict.ok && verdict.checkpoints_matched >= 1, "{verdict:?}");
    // /metrics says sealing runs (alert on a stale checkpoint or rising failures).
    let metrics = reqwest::get(format!("{}/metrics", app.base())).await.unwrap().text().await.unwrap();
    let value = |name: &str| {
        metrics.lines().find_map(|l| l.strip_prefix(&format!("{name} "))).map(|v| v.parse::<f64>().unwrap())
    };
    assert!(value("paygate_audit_sealed_total").unwrap() >= 1.0, "{metrics}");
    assert_eq!(value("paygate_audit_seal_failures_total"), Some(0.0));
    assert!(value("paygate_audit_chain_head").unwrap() >= 1.0);
    assert!(value("paygate_audit_checkpoint_timestamp_seconds").unwrap() > 0.0);
    agent.cancel().await.unwrap();
}
