//! Incremental ledger integrity on both engines: a check reads only what was posted since the last
//! verified checkpoint, catches a posting or a balance tampered with after it, agrees with the full
//! check, and raises no false alarm while payments post concurrently. Tampering goes through a
//! connection of its own, as an attacker with database access would.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

use std::sync::Arc;

use paygate::domain::ids::{AccountId, PaymentId};
use paygate::domain::money::{Currency, Money};
use paygate::domain::payment::AccountSeed;
use paygate::domain::payment::{Attempt, Guards, TransferRequest};
use paygate::domain::payment::{IntegrityReport, RefundRequest};
use paygate::store::postgres::PostgresStore;
use paygate::store::sqlite::SqliteStore;
use paygate::store::{Store, check_ledger};

mod common;

/// A way into the engine's tables that bypasses the store. The PostgreSQL schema is dropped with it.
enum Raw {
    Sqlite(std::path::PathBuf),
    Postgres(common::Db),
}

impl Raw {
    async fn exec(&self, sql: &str) {
        match self {
            Raw::Sqlite(path) => {
                let c = rusqlite::Connection::open(path).unwrap();
                c.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
                c.execute_batch(sql).unwrap();
            }
            Raw::Postgres(db) => {
                let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(conn);
                client.batch_execute(&format!("SET search_path TO {}; {sql}", db.schema)).await.unwrap();
            }
        }
    }
}

async fn engines(dir: &std::path::Path) -> Vec<(Arc<dyn Store>, Raw, &'static str)> {
    let path = dir.join("paygate.db");
    let mut v: Vec<(Arc<dyn Store>, Raw, &'static str)> =
        vec![(Arc::new(SqliteStore::open(&path).unwrap()), Raw::Sqlite(path), "sqlite")];
    if let Some(db) = common::database("integrity") {
        let store = PostgresStore::connect(&db.url, &db.schema).await.expect("PostgreSQL reachable");
        v.push((Arc::new(store), Raw::Postgres(db), "postgres"));
    }
    v
}

fn kes() -> Currency {
    Currency::parse("KES").unwrap()
}

async fn seed(store: &Arc<dyn Store>) {
    for (id, opening) in [("acct-A", 100_000_000), ("acct-B", 0)] {
        let seed = AccountSeed {
            id: AccountId::parse(id).unwrap(),
            currency: kes(),
            opening_minor: opening,
            allow_overdraft: false,
        };
        store.ledger_open_account(seed, 0).await.unwrap();
    }
}

async fn pay(store: &Arc<dyn Store>, minor: i64) -> PaymentId {
    let req = TransferRequest {
        attempt: Attempt::reserved(format!("idk_{}", uuid::Uuid::new_v4().simple())),
        payment_id: PaymentId::generate(),
        from_account: AccountId::parse("acct-A").unwrap(),
        to_account: AccountId::parse("acct-B").unwrap(),
        amount: Money::from_minor(minor, kes()).unwrap(),
        memo: None,
        principal_sub: "agent".into(),
        principal_user: None,
        guards: Guards::default(),
    };
    store.ledger_transfer(req, 1).await.unwrap().id
}

async fn check(store: &Arc<dyn Store>, full: bool) -> IntegrityReport {
    check_ledger(&**store, full, 100).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_incremental_check_reads_only_what_is_new_and_catches_tampering_after_its_checkpoint() {
    let dir = tempfile::tempdir().unwrap();
    for (store, raw, label) in engines(dir.path()).await {
        seed(&store).await;
        for _ in 0..3 {
            pay(&store, 100).await;
        }
        // No checkpoint yet: the first check reads everything and makes one.
        let first = check(&store, false).await;
        assert!(first.ok, "{label}: {:?}", first.problems);
        assert_eq!(first.mode, "full", "{label}");
        // Two payments later: only their four postings are read.
        pay(&store, 200).await;
        pay(&store, 300).await;
        let next = check(&store, false).await;
        assert!(next.ok, "{label}: {:?}", next.problems);
        assert_eq!(next.mode, "incremental", "{label}");
        // SQLite has one writer: exactly the new postings. PostgreSQL also re-reads what any
        // transaction in the cluster still running at the checkpoint may have written.
        if label == "sqlite" {
            assert_eq!(next.postings_checked, 4);
        } else {
            assert!(next.postings_checked >= 4, "{label}: {}", next.postings_checked);
        }
        // The full check agrees, reading every posting.
        let full = check(&store, true).await;
        assert!(full.ok, "{label}: {:?}", full.problems);
        assert!(full.postings_checked >= 10, "{label}");

        // A posting changed after the checkpoint: caught, and the checkpoint does not move past it.
        pay(&store, 400).await;
        raw.exec("UPDATE postings SET amount_minor = amount_minor + 1 WHERE seq = (SELECT MAX(seq) FROM postings)")
            .await;
        for _ in 0..2 {
            let r = check(&store, false).await;
            assert!(!r.ok, "{label}: a tampered posting passed");
            assert_eq!(r.mode, "incremental");
            assert!(r.problems.iter().any(|p| p.contains("sum to 1, not 0")), "{label}: {:?}", r.problems);
        }
        assert!(!check(&store, true).await.ok, "{label}: the full check sees it too");
        raw.exec("UPDATE postings SET amount_minor = amount_minor - 1 WHERE seq = (SELECT MAX(seq) FROM postings)")
            .await;
        assert!(check(&store, false).await.ok, "{label}: mended");

        // A balance changed with no posting at all (an account untouched since the checkpoint).
        let r = check(&store, false).await;
        assert!(r.ok, "{label}: {:?}", r.problems);
        if label == "sqlite" {
            assert_eq!(r.postings_checked, 0, "nothing posted since");
        }
        raw.exec("UPDATE accounts SET balance_minor = balance_minor + 7 WHERE id = 'acct-B'").await;
        let r = check(&store, false).await;
        assert!(!r.ok, "{label}: a tampered balance passed");
        assert!(r.problems.iter().any(|p| p.contains("account acct-B balance")), "{label}: {:?}", r.problems);
        let full = check(&store, true).await;
        assert_eq!(full.ok, r.ok, "{label}: the full check reports the same");
        raw.exec("UPDATE accounts SET balance_minor = balance_minor - 7 WHERE id = 'acct-B'").await;

        // A posting changed *before* the checkpoint is the full check's to find.
        raw.exec("UPDATE postings SET amount_minor = amount_minor + 5 WHERE seq = (SELECT MIN(seq) FROM postings WHERE payment_id IS NOT NULL)")
            .await;
        let full = check(&store, true).await;
        assert!(!full.ok, "{label}: the full check misses an old tampered posting");
    }
}

/// Lifts the schema's own `refunded_minor <= amount_minor` check on the tamperer's connection (SQLite)
/// or table (PostgreSQL), as an attacker who owns the database can, so the gateway's check is all
/// that is left to notice.
fn without_refund_check(label: &str, sql: &str) -> String {
    if label == "sqlite" {
        format!("PRAGMA ignore_check_constraints = ON; {sql}")
    } else {
        format!(
            "DO $$ DECLARE c text; BEGIN
               FOR c IN SELECT conname FROM pg_constraint WHERE conrelid = 'payments'::regclass AND contype = 'c'
                          AND pg_get_constraintdef(oid) LIKE '%refunded_minor%' LOOP
                 EXECUTE format('ALTER TABLE payments DROP CONSTRAINT %I', c);
               END LOOP; END $$; {sql}"
        )
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_incremental_check_catches_an_over_refunded_payment_that_a_new_refund_draws_on() {
    let dir = tempfile::tempdir().unwrap();
    for (store, raw, label) in engines(dir.path()).await {
        seed(&store).await;
        let original = pay(&store, 1_000).await;
        assert!(check(&store, false).await.ok, "{label}: the checkpoint");
        // After the checkpoint: a refund of the original (whose own postings are older), and a
        // new payment.
        let refund = RefundRequest {
            attempt: Attempt::reserved(format!("idk_{}", uuid::Uuid::new_v4().simple())),
            refund_id: PaymentId::generate(),
            payment_id: original.clone(),
            amount_minor: Some(300),
            reason: None,
            principal_sub: "agent".into(),
            principal_user: None,
            guards: Guards::default(),
            autonomous_cap_minor: None,
        };
        store.ledger_refund(refund, 2).await.unwrap();
        let newer = pay(&store, 50).await;
        // The original draws on nothing new itself: found through the refund. The newer payment
        // is found through its own postings.
        raw.exec(&without_refund_check(
            label,
            &format!("UPDATE payments SET refunded_minor = amount_minor + 1 WHERE id IN ('{original}', '{newer}')"),
        ))
        .await;
        let r = check(&store, false).await;
        assert_eq!(r.mode, "incremental", "{label}");
        assert!(!r.ok, "{label}: an over-refunded payment passed");
        for id in [&original, &newer] {
            assert!(r.problems.iter().any(|p| p == &format!("{id} violates its bounds")), "{label}: {:?}", r.problems);
        }
        assert!(!check(&store, true).await.ok, "{label}: the full check sees it too");
        raw.exec(&format!(
            "UPDATE payments SET refunded_minor = 300 WHERE id = '{original}';
             UPDATE payments SET refunded_minor = 0 WHERE id = '{newer}'"
        ))
        .await;
        assert!(check(&store, false).await.ok, "{label}: mended");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn incremental_checks_raise_no_false_alarm_while_payments_post() {
    let dir = tempfile::tempdir().unwrap();
    for (store, _raw, label) in engines(dir.path()).await {
        seed(&store).await;
        assert!(check(&store, true).await.ok);
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let mut writers = tokio::task::JoinSet::new();
        for _ in 0..6 {
            let (store, stop) = (store.clone(), stop.clone());
            writers.spawn(async move {
                let mut n = 0u32;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    pay(&store, 1).await;
                    n += 1;
                }
                n
            });
        }
        let mut checked = 0;
        for _ in 0..25 {
            let r = check(&store, false).await;
            assert!(r.ok, "{label}: a false alarm while payments post: {:?}", r.problems);
            checked += r.postings_checked;
        }
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let paid: u32 = writers.join_all().await.into_iter().sum();
        assert!(paid > 0 && checked > 0, "{label}: payments posted during the checks");
        // Everything adds up at the end, incrementally and in full.
        assert!(check(&store, false).await.ok, "{label}");
        let full = check(&store, true).await;
        assert!(full.ok, "{label}: {:?}", full.problems);
    }
}

/// `paygate check-ledger`: the operator's check from the shell (no request timeout to cut off a full
/// scan of a large ledger), reporting and exiting as a script needs, audited like the tool.
#[test]
fn the_check_ledger_command_reports_exits_nonzero_on_a_tampered_ledger_and_audits() {
    let dir = tempfile::tempdir().unwrap();
    let run = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
            .arg("check-ledger")
            .args(args)
            .env("PAYGATE_STORAGE__DATA_DIR", dir.path())
            .env("PAYGATE_LOG", "warn")
            .output()
            .unwrap();
        let report: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("a JSON report: {}", String::from_utf8_lossy(&out.stderr)));
        (out.status.code(), report)
    };
    let (code, report) = run(&["--full"]);
    assert_eq!(code, Some(0), "{report}");
    assert_eq!((report["ok"].as_bool(), report["mode"].as_str()), (Some(true), Some("full")), "{report}");

    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.execute("UPDATE accounts SET balance_minor = balance_minor + 7 WHERE id = 'acct-B'", []).unwrap();
    let (code, report) = run(&[]);
    assert_eq!(code, Some(1), "{report}");
    assert_eq!((report["ok"].as_bool(), report["mode"].as_str()), (Some(false), Some("incremental")), "{report}");
    assert!(report["problems"].to_string().contains("account acct-B balance"), "{report}");
    let audited: (String, String) = db
        .query_row(
            "SELECT principal_sub, detail FROM audit_records
             WHERE tool = 'check_ledger_integrity' AND decision = 'integrity_failed'",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(audited.0, "cli");
    assert!(audited.1.contains("acct-B"), "{audited:?}");
}

/// When the ledger cannot be checked at all (its service does not answer) `check-ledger` and
/// `reconcile` say so and exit 2, not 1, so a script never reads "unknown" as "inconsistent" (or as
/// consistent).
#[test]
fn check_ledger_and_reconcile_exit_2_when_the_ledger_cannot_be_reached() {
    let dir = tempfile::tempdir().unwrap();
    let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap();
    for (args, says) in [
        (&["check-ledger", "--full"][..], "the ledger could not be checked: backend unavailable"),
        (&["reconcile"][..], "reconciliation failed: backend unavailable"),
    ] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
            .args(args)
            .env("PAYGATE_STORAGE__DATA_DIR", dir.path())
            .env("PAYGATE_BACKEND__KIND", "http")
            .env("PAYGATE_BACKEND__HTTP_URL", format!("http://{closed}"))
            .env("PAYGATE_BACKEND__HTTP_CREDENTIAL", "not-a-real-credential-but-long-enough")
            .env("PAYGATE_LOG", "warn")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {stderr}");
        assert!(out.stdout.is_empty(), "{args:?}: no report when nothing was checked");
        assert!(stderr.contains(says), "{args:?}: {stderr}");
        assert!(!stderr.contains("not-a-real-credential"), "{args:?}: the credential is never logged");
    }
}
