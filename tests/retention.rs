//! Audit retention through the real server's scheduler: with `audit.retention_days` set, records
//! past it are written to a JSON Lines archive and only then leave the database; the run is audited.
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
