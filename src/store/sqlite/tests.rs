//! The SQLite engine's own tests (the shared contract is tests/store_contract.rs).

use super::*;
use crate::clock::UnixSecs;
use crate::domain::idempotency::{NewIdempotencyRecord, Reservation};
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::{Currency, Money};
use crate::domain::payment::AccountSeed;
use crate::domain::payment::{Attempt, Guards, RefundRequest, TransferRequest};
use crate::idempotency::StoredOutcome;
use crate::store::{IdempotencyStore, LedgerStore};

fn rec(key: &str, fp: &str, now: UnixSecs) -> NewIdempotencyRecord {
    NewIdempotencyRecord {
        key: key.into(),
        fingerprint: fp.into(),
        tool: "create_payment".into(),
        principal_iss: "iss".into(),
        principal_sub: "sub".into(),
        lease_until: now + 30,
        expires_at: now + 3600,
    }
}

async fn store_with_accounts() -> SqliteStore {
    let s = SqliteStore::open_in_memory().unwrap();
    with_accounts(&s, 10_000).await;
    s
}

/// acct-A holding `opening`, acct-B empty (KES).
async fn with_accounts(s: &SqliteStore, opening: i64) {
    let kes = Currency::parse("KES").unwrap();
    for (id, opening) in [("acct-A", opening), ("acct-B", 0)] {
        let seed = AccountSeed {
            id: AccountId::parse(id).unwrap(),
            currency: kes,
            opening_minor: opening,
            allow_overdraft: false,
        };
        assert!(s.ledger_open_account(seed.clone(), 0).await.unwrap());
        assert!(!s.ledger_open_account(seed, 0).await.unwrap(), "opening twice is a no-op");
    }
}

fn transfer(key: &str, minor: i64) -> TransferRequest {
    TransferRequest {
        attempt: Attempt::reserved(key),
        payment_id: PaymentId::generate(),
        from_account: AccountId::parse("acct-A").unwrap(),
        to_account: AccountId::parse("acct-B").unwrap(),
        amount: Money::from_minor(minor, Currency::parse("KES").unwrap()).unwrap(),
        memo: None,
        principal_sub: "sub".into(),
        principal_user: None,
        guards: Guards::default(),
    }
}

#[tokio::test]
async fn reservation_states() {
    let s = SqliteStore::open_in_memory().unwrap();
    assert_eq!(s.idem_reserve(rec("k", "fp", 100), 100).await.unwrap(), Reservation::Acquired);
    // Live lease: a duplicate sees it in flight.
    assert_eq!(
        s.idem_reserve(rec("k", "fp", 101), 101).await.unwrap(),
        Reservation::InFlight { fingerprint: "fp".into() }
    );
    // The holder crashed: after the lease, a retry with the same arguments takes over ...
    assert_eq!(s.idem_reserve(rec("k", "fp", 131), 131).await.unwrap(), Reservation::Acquired);
    // ... but one with other arguments does not.
    assert_eq!(
        s.idem_reserve(rec("k", "other", 200), 200).await.unwrap(),
        Reservation::InFlight { fingerprint: "fp".into() }
    );
    s.idem_complete("k", "{\"done\":1}").await.unwrap();
    assert_eq!(
        s.idem_reserve(rec("k", "fp", 201), 201).await.unwrap(),
        Reservation::Completed { fingerprint: "fp".into(), outcome: "{\"done\":1}".into() }
    );
    // Completion is final: a second completion changes nothing.
    s.idem_complete("k", "{\"done\":2}").await.unwrap();
    assert_eq!(s.idem_peek("k", 202).await.unwrap(), Some(("fp".into(), Some("{\"done\":1}".into()))));
    // Past retention the key is free again, and purge removes it.
    assert_eq!(s.idem_peek("k", 100 + 3600).await.unwrap(), None);
    assert_eq!(s.idem_purge(100 + 3600).await.unwrap(), 1);
    // Release gives back an in-flight key only.
    assert_eq!(s.idem_reserve(rec("r", "fp", 0), 0).await.unwrap(), Reservation::Acquired);
    s.idem_release("r").await.unwrap();
    assert_eq!(s.idem_peek("r", 1).await.unwrap(), None);
}

#[tokio::test]
async fn the_ledger_applies_a_key_once_and_completes_its_record_in_the_same_transaction() {
    let s = store_with_accounts().await;
    assert_eq!(s.idem_reserve(rec("key-1", "fp", 0), 0).await.unwrap(), Reservation::Acquired);
    let p1 = s.ledger_transfer(transfer("key-1", 2_500), 1).await.unwrap();
    let (_, outcome) = s.idem_peek("key-1", 1).await.unwrap().unwrap();
    let stored = StoredOutcome::from_json(&outcome.expect("completed with the posting")).unwrap();
    assert_eq!(stored, StoredOutcome::Succeeded { payment: p1.clone() });
    // The same key again (e.g. after the idempotency record expired) returns the same payment.
    let p2 = s.ledger_transfer(transfer("key-1", 2_500), 2).await.unwrap();
    assert_eq!(p1.id, p2.id);
    // The same key for a different transfer is refused.
    assert_eq!(s.ledger_transfer(transfer("key-1", 999), 3).await, Err(BackendError::IdempotencyKeyReused));
    let b = s.ledger_balance(&AccountId::parse("acct-B").unwrap()).await.unwrap().unwrap();
    assert_eq!(b.balance_minor, 2_500);
    assert!(s.ledger_integrity().await.unwrap().ok);
}

#[tokio::test]
async fn overdrafts_and_refunds_are_bounded() {
    let s = store_with_accounts().await;
    assert!(matches!(s.ledger_transfer(transfer("big", 10_001), 0).await, Err(BackendError::InsufficientFunds { .. })));
    let p = s.ledger_transfer(transfer("ok", 10_000), 0).await.unwrap();
    let refund = |key: &str, amount: Option<i64>| RefundRequest {
        attempt: Attempt::reserved(key),
        refund_id: PaymentId::generate(),
        payment_id: p.id.clone(),
        amount_minor: amount,
        reason: None,
        principal_sub: "sub".into(),
        principal_user: None,
        guards: Guards::default(),
        autonomous_cap_minor: None,
    };
    assert!(matches!(
        s.ledger_refund(refund("r0", Some(10_001)), 1).await,
        Err(BackendError::RefundExceedsRemaining { .. })
    ));
    s.ledger_refund(refund("r1", Some(4_000)), 1).await.unwrap();
    let rest = s.ledger_refund(refund("r2", None), 1).await.unwrap();
    assert_eq!(rest.amount_minor, 6_000);
    assert!(matches!(s.ledger_refund(refund("r3", None), 1).await, Err(BackendError::NotRefundable(_))));
    let report = s.ledger_integrity().await.unwrap();
    assert!(report.ok, "{:?}", report.problems);
    assert_eq!(report.currency_sums, vec![("KES".to_string(), 0)]);
}

#[tokio::test]
async fn integrity_notices_a_tampered_balance() {
    let s = store_with_accounts().await;
    s.run(|c| {
        Ok::<_, StoreError>(c.execute("UPDATE accounts SET balance_minor = balance_minor + 1 WHERE id = 'acct-B'", [])?)
    })
    .await
    .unwrap();
    let report = s.ledger_integrity().await.unwrap();
    assert!(!report.ok);
    assert!(report.problems.iter().any(|p| p.contains("acct-B")), "{:?}", report.problems);
}

/// The WAL file's size after `commits` one-payment commits, with these checkpoint thresholds.
async fn wal_bytes_after(commits: usize, checkpoints: Checkpoints) -> u64 {
    let path = std::env::temp_dir().join(format!("paygate-wal-{}.sqlite3", uuid::Uuid::new_v4().simple()));
    let s =
        SqliteStore::init_with(&path, Some(Arc::new(TempFile(path.clone()))), checkpoints, Tuning::default()).unwrap();
    with_accounts(&s, 1_000_000).await;
    for n in 0..commits {
        // Awaited one by one: each payment is a commit of its own.
        s.ledger_transfer(transfer(&format!("wal-{n}"), 1), 1).await.unwrap();
    }
    let wal = std::fs::metadata(format!("{}-wal", path.display())).unwrap().len();
    assert_eq!(
        s.ledger_balance(&AccountId::parse("acct-B").unwrap()).await.unwrap().unwrap().balance_minor,
        commits as i64
    );
    wal
}

#[tokio::test]
async fn the_writer_bounds_the_wal_whatever_the_checkpointer_does() {
    // The checkpointer thread never woken: only the writer's own bound can restart the WAL.
    let never = i32::MAX;
    let bounded = wal_bytes_after(300, Checkpoints { background_at: never, writer_at: 64 }).await;
    let unbounded = wal_bytes_after(300, Checkpoints { background_at: never, writer_at: never }).await;
    // A frame is a 4 KiB page and its 24-byte header; a commit of one payment writes a few.
    let frame = 4096 + 24;
    assert!(unbounded > 600 * frame, "without a bound the WAL holds every commit's frames: {unbounded}");
    assert!(bounded < 4 * 64 * frame, "the writer checkpoints past 64 frames and the WAL restarts: {bounded}");
}

#[tokio::test]
async fn the_page_caches_and_mmap_follow_the_configured_tuning() {
    let dir = tempfile::tempdir().unwrap();
    let tuning = Tuning { cache_mib: 8, writer_cache_mib: 2, mmap_mib: 4096 };
    let s = SqliteStore::open_tuned(&dir.path().join("t.db"), tuning).unwrap();
    fn cache_and_mmap(c: &mut rusqlite::Connection) -> Result<(i64, i64), StoreError> {
        let cache: i64 = c.pragma_query_value(None, "cache_size", |r| r.get(0))?;
        let mmap: i64 = c.pragma_query_value(None, "mmap_size", |r| r.get(0))?;
        Ok((cache, mmap))
    }
    // A reader.
    let (cache, mmap) = s.run(cache_and_mmap).await.unwrap();
    // 4 GiB: past the 2 GiB a stock SQLite build clamps mmap_size to (the build raises its ceiling).
    assert_eq!((cache, mmap), (-8 * 1024, 4096 * 1024 * 1024));
    // The writer: its own (small) cache, the same mmap.
    let (cache, mmap) = s.write(cache_and_mmap).await.unwrap();
    assert_eq!((cache, mmap), (-2 * 1024, 4096 * 1024 * 1024));
}

/// A posting takes no savepoint inside the writer's batch: one that fails after it has written
/// (here a trigger refuses its first posting row, after its payment row and usage are written)
/// rolls its whole batch back. No partial payment survives, every caller hears a failure or
/// success that matches what was kept, and the batch's other payments go through when retried.
#[tokio::test]
async fn a_posting_that_fails_after_writing_rolls_back_its_batch_and_nothing_half_done_is_kept() {
    let s = Arc::new(store_with_accounts().await);
    s.write(|c| {
        Ok::<_, StoreError>(c.execute_batch(
            "CREATE TRIGGER injected_fault BEFORE INSERT ON postings WHEN abs(NEW.amount_minor) = 1313
             BEGIN SELECT RAISE(ABORT, 'injected fault'); END;",
        )?)
    })
    .await
    .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..40 {
        let s = s.clone();
        tasks.spawn(async move {
            let (key, minor) = if n == 20 { ("poison".to_string(), 1313) } else { (format!("ok-{n}"), 100) };
            (key.clone(), minor, s.ledger_transfer(transfer(&key, minor), 1).await)
        });
    }
    let mut failed = Vec::new();
    let mut paid = 0;
    while let Some(joined) = tasks.join_next().await {
        let (key, minor, result) = joined.unwrap();
        match result {
            Ok(p) => {
                assert_ne!(key, "poison");
                assert_eq!(p.amount_minor, minor);
                paid += minor;
            }
            Err(e) => {
                assert!(
                    !matches!(e, BackendError::InsufficientFunds { .. } | BackendError::IdempotencyKeyReused),
                    "{key}: a fault, not a refusal: {e:?}"
                );
                failed.push(key);
            }
        }
    }
    assert!(failed.contains(&"poison".to_string()));
    let count = |s: Arc<SqliteStore>| async move {
        s.run(|c| Ok::<i64, StoreError>(c.query_row("SELECT count(*) FROM payments", [], |r| r.get(0))?)).await.unwrap()
    };
    let acct_b = AccountId::parse("acct-B").unwrap();
    assert_eq!(s.ledger_balance(&acct_b).await.unwrap().unwrap().balance_minor, paid);
    assert_eq!(count(s.clone()).await, paid / 100, "one payment row per payment answered paid, none half done");
    assert!(s.ledger_integrity().await.unwrap().ok);
    // The innocent neighbours of the fault were rolled back with it; retried, each pays once.
    for key in failed.iter().filter(|k| *k != "poison") {
        s.ledger_transfer(transfer(key, 100), 2).await.unwrap();
        paid += 100;
    }
    assert_eq!(s.ledger_balance(&acct_b).await.unwrap().unwrap().balance_minor, 3_900);
    assert_eq!(paid, 3_900);
    assert_eq!(count(s.clone()).await, 39);
    assert!(s.ledger_integrity().await.unwrap().ok);
}
