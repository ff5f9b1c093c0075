//! One store contract, two engines: every case runs against SQLite and, when
//! PAYGATE_TEST_DATABASE_URL is set, against PostgreSQL (each case in its own schema).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

use std::sync::Arc;

use paygate::domain::approval::{ApprovalRecord, ApprovalReview, IssuedMandate, MandateIssuer, Review, ReviewError};
use paygate::domain::approval::{ApprovalRequest, ApprovalStatus, PasskeyRecord, ReviewDecision};
use paygate::domain::approval::{ChallengeIssued, EnrolmentCode, EnrolmentProof, PasskeyChallenge};
use paygate::domain::approval::{PasskeyEnrolled, PasskeyEnrolment};
use paygate::domain::audit::AuditRecord;
use paygate::domain::error::BackendError;
use paygate::domain::idempotency::{NewIdempotencyRecord, Reservation};
use paygate::domain::ids::{AccountId, ApprovalId, PaymentId};
use paygate::domain::money::{Currency, Money};
use paygate::domain::ops::ApprovalQuery;
use paygate::domain::ops::{AuditQuery, AuditRelated, MandateQuery, MandateStatus, OpsPaymentQuery};
use paygate::domain::payment::AccountSeed;
use paygate::domain::payment::{Attempt, Claim, EntryQuery, Payment};
use paygate::domain::payment::{
    DailyBudget, Guards, MandateDraw, PaymentKind, PaymentQuery, PaymentStatus, RefundRequest, TransferRequest,
};
use paygate::domain::principal::{PrincipalRef, Suspension, SuspensionScope};
use paygate::domain::rail::{RailFlow, RailPayment, RailQuery, RailState, RailUpdate};
use paygate::domain::rail::{RailMove, RailPage};
use paygate::idempotency::StoredOutcome;
use paygate::mandate::MandateKind;
use paygate::store::postgres::PostgresStore;
use paygate::store::sqlite::SqliteStore;
use paygate::store::{Denials, QuotaTake, Store};
use serde_json::json;

/// A PostgreSQL schema that is dropped when the case ends.
struct Schema {
    url: String,
    name: String,
}

impl Drop for Schema {
    fn drop(&mut self) {
        let (url, name) = (self.url.clone(), self.name.clone());
        // Dropped from a plain thread: the test's runtime may be shutting down.
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                if let Ok((client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
                    tokio::spawn(conn);
                    let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {name} CASCADE")).await;
                }
            });
        })
        .join();
    }
}

enum Engine {
    Sqlite,
    Postgres(String),
}

fn engines() -> Vec<Engine> {
    let mut v = vec![Engine::Sqlite];
    match std::env::var("PAYGATE_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => v.push(Engine::Postgres(url)),
        _ => {
            assert!(
                std::env::var_os("CI").is_none(),
                "store contract: PAYGATE_TEST_DATABASE_URL is not set, and CI requires it"
            );
            say("store contract: PAYGATE_TEST_DATABASE_URL is not set; PostgreSQL cases SKIPPED (SQLite only)")
        }
    }
    v
}

async fn open(engine: &Engine) -> (Arc<dyn Store>, Option<Schema>, &'static str) {
    match engine {
        Engine::Sqlite => (Arc::new(SqliteStore::open_in_memory().unwrap()), None, "sqlite"),
        Engine::Postgres(url) => {
            let name = format!("t_{}", uuid::Uuid::new_v4().simple());
            let store =
                PostgresStore::connect(url, &name).await.expect("PostgreSQL reachable at PAYGATE_TEST_DATABASE_URL");
            (Arc::new(store), Some(Schema { url: url.clone(), name }), "postgres")
        }
    }
}

/// Run `case` against every engine.
macro_rules! contract {
    ($name:ident, $body:expr) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $name() {
            for engine in engines() {
                let (store, _schema, label) = open(&engine).await;
                let case: fn(Arc<dyn Store>, &'static str) -> _ = $body;
                case(store, label).await;
            }
        }
    };
}

fn kes() -> Currency {
    Currency::parse("KES").unwrap()
}
fn acct(s: &str) -> AccountId {
    AccountId::parse(s).unwrap()
}

async fn with_accounts(store: &Arc<dyn Store>, a_minor: i64) {
    for (id, opening) in [("acct-A", a_minor), ("acct-B", 0)] {
        let seed = AccountSeed { id: acct(id), currency: kes(), opening_minor: opening, allow_overdraft: false };
        assert!(store.ledger_open_account(seed.clone(), 0).await.unwrap());
        assert!(!store.ledger_open_account(seed, 0).await.unwrap(), "opening twice is a no-op");
    }
}

fn transfer(key: &str, minor: i64, guards: Guards) -> TransferRequest {
    TransferRequest {
        attempt: Attempt::reserved(key),
        payment_id: PaymentId::generate(),
        from_account: acct("acct-A"),
        to_account: acct("acct-B"),
        amount: Money::from_minor(minor, kes()).unwrap(),
        memo: None,
        principal_sub: "agent".into(),
        principal_user: None,
        guards,
    }
}

/// A suspension of issuer "iss"'s "agent".
fn suspending(scope: SuspensionScope, reason: &str) -> Suspension {
    Suspension { issuer: "iss".into(), subject: "agent".into(), scope, reason: reason.into() }
}

fn rec(key: &str, fp: &str, now: i64) -> NewIdempotencyRecord {
    NewIdempotencyRecord {
        key: key.into(),
        fingerprint: fp.into(),
        tool: "create_payment".into(),
        principal_iss: "iss".into(),
        principal_sub: "agent".into(),
        lease_until: now + 30,
        expires_at: now + 3600,
    }
}

async fn balance(store: &Arc<dyn Store>, id: &str) -> i64 {
    store.ledger_balance(&acct(id)).await.unwrap().unwrap().balance_minor
}

async fn assert_integrity(store: &Arc<dyn Store>, label: &str) {
    let r = store.ledger_integrity().await.unwrap();
    assert!(r.ok, "{label}: {:?}", r.problems);
}

contract!(reservations_follow_their_states, |store, label| async move {
    assert_eq!(store.idem_reserve(rec("k", "fp", 100), 100).await.unwrap(), Reservation::Acquired, "{label}");
    assert_eq!(
        store.idem_reserve(rec("k", "fp", 101), 101).await.unwrap(),
        Reservation::InFlight { fingerprint: "fp".into() }
    );
    // A crashed holder's lease ran out: the same arguments take over, other arguments do not.
    assert_eq!(
        store.idem_reserve(rec("k", "other", 131), 131).await.unwrap(),
        Reservation::InFlight { fingerprint: "fp".into() }
    );
    assert_eq!(store.idem_reserve(rec("k", "fp", 131), 131).await.unwrap(), Reservation::Acquired);
    store.idem_complete("k", "{\"done\":1}").await.unwrap();
    store.idem_complete("k", "{\"done\":2}").await.unwrap();
    assert_eq!(
        store.idem_reserve(rec("k", "fp", 200), 200).await.unwrap(),
        Reservation::Completed { fingerprint: "fp".into(), outcome: "{\"done\":1}".into() },
        "{label}: completion is final"
    );
    assert_eq!(store.idem_peek("k", 3700).await.unwrap(), None, "past retention");
    assert_eq!(store.idem_reserve(rec("k", "new", 3700), 3700).await.unwrap(), Reservation::Acquired);
    assert_eq!(store.idem_purge(10_000).await.unwrap(), 1);
    assert_eq!(store.idem_reserve(rec("r", "fp", 0), 0).await.unwrap(), Reservation::Acquired);
    store.idem_release("r").await.unwrap();
    assert_eq!(store.idem_peek("r", 1).await.unwrap(), None);
});

contract!(concurrent_reservations_of_one_key_acquire_once, |store, label| async move {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let s = store.clone();
        tasks.spawn(async move { s.idem_reserve(rec("race", "fp", 10), 10).await.unwrap() });
    }
    let mut acquired = 0;
    while let Some(r) = tasks.join_next().await {
        if r.unwrap() == Reservation::Acquired {
            acquired += 1;
        }
    }
    assert_eq!(acquired, 1, "{label}");
});

fn passkey(id: &str, sub: &str, at: i64) -> PasskeyRecord {
    PasskeyRecord {
        credential_id: id.into(),
        owner_iss: "ops".into(),
        owner_sub: sub.into(),
        public_key: vec![4; 65],
        sign_count: 0,
        backup_eligible: false,
        name: format!("{id} key"),
        created_at: at,
        revoked_at: None,
        revoked_by: None,
        rp_id: "console.example".into(),
        origin: "https://console.example".into(),
    }
}

fn challenge(hash: &str, sub: &str, at: i64, expires_at: i64) -> PasskeyChallenge {
    PasskeyChallenge {
        challenge_sha256: hash.into(),
        owner_iss: "ops".into(),
        owner_sub: sub.into(),
        created_at: at,
        expires_at,
    }
}

fn code(hash: &str, sub: &str, at: i64, expires_at: i64) -> EnrolmentCode {
    EnrolmentCode {
        code_sha256: hash.into(),
        owner_iss: "ops".into(),
        owner_sub: sub.into(),
        issued_by: "ann".into(),
        issued_at: at,
        expires_at,
    }
}

fn enrolment(rec: PasskeyRecord, challenge: &str, proof: EnrolmentProof, max: i64) -> PasskeyEnrolment {
    PasskeyEnrolment { rec, challenge_sha256: challenge.into(), proof, max, notify: vec![] }
}

fn by_code(hash: &str) -> EnrolmentProof {
    EnrolmentProof::Code { code_sha256: hash.into() }
}

/// Register `rec` the only way there is: a fresh challenge and a fresh code of its owner's.
async fn enrol(store: &Arc<dyn Store>, rec: PasskeyRecord, max: i64) -> PasskeyEnrolled {
    let (c, k) = (format!("c-{}", uuid::Uuid::new_v4()), format!("k-{}", uuid::Uuid::new_v4()));
    let at = rec.created_at;
    let put = store.passkey_challenge_put(challenge(&c, &rec.owner_sub, at, at + 300), 100).await.unwrap();
    assert_eq!(put, ChallengeIssued::Stored);
    store.passkey_code_put(code(&k, &rec.owner_sub, at, at + 3600)).await.unwrap();
    store.passkey_enrol(enrolment(rec, &c, by_code(&k), max), at).await.unwrap()
}

const INSERTED: PasskeyEnrolled = PasskeyEnrolled::Inserted { code_issued_by: None };

fn registered(e: &PasskeyEnrolled) -> bool {
    matches!(e, PasskeyEnrolled::Inserted { .. })
}

// Passkeys: a credential id registers once (to anyone); one person's live passkeys stay within the
// bound under concurrent registrations; the counter moves only from what was read (a replayed or
// concurrent assertion loses); a revoked one stays readable, counts no more and moves no counter.
contract!(passkeys_register_once_within_the_bound_and_count_forward, |store, label| async move {
    assert!(registered(&enrol(&store, passkey("k1", "rita", 1), 3).await), "{label}");
    assert_eq!(enrol(&store, passkey("k1", "bob", 2), 3).await, PasskeyEnrolled::Duplicate, "{label}");
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..8 {
        let s = store.clone();
        tasks.spawn(async move { enrol(&s, passkey(&format!("r{n}"), "rita", 3 + n), 3).await });
    }
    let mut inserted = 0;
    while let Some(r) = tasks.join_next().await {
        if registered(&r.unwrap()) {
            inserted += 1;
        }
    }
    assert_eq!(inserted, 2, "{label}: rita had 1 of 3");
    let mine = store.passkey_list("ops", "rita").await.unwrap();
    assert_eq!(mine.len(), 3, "{label}");
    assert!(mine.windows(2).all(|w| w[0].created_at >= w[1].created_at), "{label}: newest first");
    assert_eq!(store.passkey_list("ops", "bob").await.unwrap(), vec![], "{label}");
    assert_eq!(store.passkey_get("k1").await.unwrap().unwrap(), passkey("k1", "rita", 1), "{label}: round trip");
    // The counter: 0 → 5 once; a second move from 0 (the same assertion again) loses.
    assert!(store.passkey_count("k1", 0, 5).await.unwrap(), "{label}");
    assert!(!store.passkey_count("k1", 0, 5).await.unwrap(), "{label}: a replay");
    assert_eq!(store.passkey_get("k1").await.unwrap().unwrap().sign_count, 5);
    assert!(store.passkey_revoke("k1", "rita", 50).await.unwrap(), "{label}");
    assert!(!store.passkey_revoke("k1", "rita", 51).await.unwrap(), "{label}: once");
    assert!(!store.passkey_count("k1", 5, 6).await.unwrap(), "{label}: a revoked passkey counts no more");
    let revoked = store.passkey_get("k1").await.unwrap().unwrap();
    assert_eq!((revoked.revoked_at, revoked.revoked_by.as_deref()), (Some(50), Some("rita")), "{label}");
    assert!(registered(&enrol(&store, passkey("r9", "rita", 60), 3).await), "{label}: room again");
});

// Enrolment: a challenge registers one credential, its owner's, before it expires; a code
// likewise; a passkey vouches only while live, its owner's, with its counter where it was read;
// any refusal leaves the challenge, the code and the counter as they were; the announcement is
// written with the credential and only then; one person's unexpired challenges are bounded.
contract!(passkey_challenges_and_codes_register_once_and_refusals_change_nothing, |store, label| async move {
    use paygate::domain::webhook::{Notice, PASSKEY_REGISTERED};
    let max = 10;
    for (h, sub, exp) in [("c1", "rita", 100), ("c2", "rita", 50), ("c3", "rita", 200), ("c5", "bob", 200)] {
        assert_eq!(store.passkey_challenge_put(challenge(h, sub, 10, exp), 5).await.unwrap(), ChallengeIssued::Stored);
    }
    for (h, sub, exp) in [("k1", "rita", 100), ("k2", "bob", 100), ("k3", "rita", 50), ("k4", "rita", 100)] {
        store.passkey_code_put(code(h, sub, 10, exp)).await.unwrap();
    }
    // Bob's code, then an unknown one, for Rita: refused; c1 and k1 still work after.
    let refused = store.passkey_enrol(enrolment(passkey("p1", "rita", 20), "c1", by_code("k2"), max), 20).await;
    assert_eq!(refused.unwrap(), PasskeyEnrolled::CodeRefused, "{label}");
    let refused = store.passkey_enrol(enrolment(passkey("p1", "rita", 20), "c1", by_code("k9"), max), 20).await;
    assert_eq!(refused.unwrap(), PasskeyEnrolled::CodeRefused, "{label}");
    let notice = Notice { event: PASSKEY_REGISTERED, endpoints: vec!["ops".into()], at: 20 };
    let mut e = enrolment(passkey("p1", "rita", 20), "c1", by_code("k1"), max);
    e.notify = notice.messages(json!({"credential_id": "p1"}));
    assert_eq!(
        store.passkey_enrol(e, 20).await.unwrap(),
        PasskeyEnrolled::Inserted { code_issued_by: Some("ann".into()) },
        "{label}"
    );
    // The challenge and the code are spent.
    let again = store.passkey_enrol(enrolment(passkey("p2", "rita", 21), "c1", by_code("k4"), max), 21).await;
    assert_eq!(again.unwrap(), PasskeyEnrolled::ChallengeSpent, "{label}");
    let again = store.passkey_enrol(enrolment(passkey("p2", "rita", 21), "c3", by_code("k1"), max), 21).await;
    assert_eq!(again.unwrap(), PasskeyEnrolled::CodeRefused, "{label}");
    // Expired: the challenge c2, the code k3; another person's challenge c5.
    let late = store.passkey_enrol(enrolment(passkey("p2", "rita", 60), "c2", by_code("k4"), max), 60).await;
    assert_eq!(late.unwrap(), PasskeyEnrolled::ChallengeSpent, "{label}");
    let late = store.passkey_enrol(enrolment(passkey("p2", "rita", 60), "c3", by_code("k3"), max), 60).await;
    assert_eq!(late.unwrap(), PasskeyEnrolled::CodeRefused, "{label}");
    let theirs = store.passkey_enrol(enrolment(passkey("p2", "rita", 60), "c5", by_code("k4"), max), 60).await;
    assert_eq!(theirs.unwrap(), PasskeyEnrolled::ChallengeSpent, "{label}");
    // A passkey vouches: Rita's own live p1, from the counter read; not Bob's, not a stale read.
    let vouch = |id: &str, seen, count| EnrolmentProof::Passkey { credential_id: id.into(), seen, count };
    let stale = store.passkey_enrol(enrolment(passkey("p2", "rita", 61), "c3", vouch("p1", 7, 8), max), 61).await;
    assert_eq!(stale.unwrap(), PasskeyEnrolled::PasskeyStale, "{label}");
    assert_eq!(store.passkey_get("p1").await.unwrap().unwrap().sign_count, 0, "{label}: nothing moved");
    let ok = store.passkey_enrol(enrolment(passkey("p2", "rita", 61), "c3", vouch("p1", 0, 4), max), 61).await;
    assert_eq!(ok.unwrap(), INSERTED, "{label}: c3 survived the refusals");
    assert_eq!(store.passkey_get("p1").await.unwrap().unwrap().sign_count, 4, "{label}");
    assert!(registered(&enrol(&store, passkey("b1", "bob", 62), max).await));
    store.passkey_challenge_put(challenge("c6", "rita", 62, 300), 5).await.unwrap();
    let bobs = store.passkey_enrol(enrolment(passkey("p3", "rita", 62), "c6", vouch("b1", 0, 1), max), 62).await;
    assert_eq!(bobs.unwrap(), PasskeyEnrolled::PasskeyStale, "{label}: not her passkey");
    assert!(store.passkey_revoke("p1", "rita", 63).await.unwrap());
    let revoked = store.passkey_enrol(enrolment(passkey("p3", "rita", 63), "c6", vouch("p1", 4, 5), max), 63).await;
    assert_eq!(revoked.unwrap(), PasskeyEnrolled::PasskeyStale, "{label}: a revoked passkey");
    // The announcement: written once, with the one registration that carried it.
    let out = store.outbox_list(None, 100).await.unwrap();
    assert_eq!(out.iter().filter(|m| m.event == "passkey.registered").count(), 1, "{label}");
    // A person's unexpired challenges are bounded; expired ones make room.
    for n in 0..3 {
        let put = store.passkey_challenge_put(challenge(&format!("d{n}"), "carl", 100, 110), 3).await.unwrap();
        assert_eq!(put, ChallengeIssued::Stored, "{label}");
    }
    let full = store.passkey_challenge_put(challenge("d3", "carl", 100, 110), 3).await.unwrap();
    assert_eq!(full, ChallengeIssued::TooMany, "{label}");
    let later = store.passkey_challenge_put(challenge("d4", "carl", 111, 411), 3).await.unwrap();
    assert_eq!(later, ChallengeIssued::Stored, "{label}: the expired ones are gone");
    // Eight registrations at once on one challenge, each with its own code: one wins.
    store.passkey_challenge_put(challenge("e1", "dana", 200, 500), 5).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..8 {
        let s = store.clone();
        tasks.spawn(async move {
            let k = format!("ek{n}");
            s.passkey_code_put(code(&k, "dana", 200, 500)).await.unwrap();
            s.passkey_enrol(enrolment(passkey(&format!("e{n}"), "dana", 201), "e1", by_code(&k), max), 201)
                .await
                .unwrap()
        });
    }
    let mut won = 0;
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            PasskeyEnrolled::Inserted { .. } => won += 1,
            other => assert_eq!(other, PasskeyEnrolled::ChallengeSpent, "{label}"),
        }
    }
    assert_eq!(won, 1, "{label}: one challenge, one credential");
    assert_eq!(store.passkey_list("ops", "dana").await.unwrap().len(), 1, "{label}");
});

// A herd on one hot key whose holders keep releasing it (an operation refused before it moved
// money gives its key back): every reservation gets an answer, never a store error, and at most
// one holder holds the key at a time.
contract!(a_herd_on_a_key_that_keeps_being_released_always_gets_an_answer, |store, label| async move {
    let holders = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (s, holders) = (store.clone(), holders.clone());
        tasks.spawn(async move {
            let mut acquired = 0;
            for _ in 0..40 {
                match s.idem_reserve(rec("hot", "fp", 10), 10).await {
                    Ok(Reservation::Acquired) => {
                        assert_eq!(holders.fetch_add(1, std::sync::atomic::Ordering::SeqCst), 0, "one holder");
                        acquired += 1;
                        holders.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
                        s.idem_release("hot").await.unwrap();
                    }
                    Ok(Reservation::InFlight { .. }) => tokio::task::yield_now().await,
                    Ok(other) => panic!("never completed, got {other:?}"),
                    Err(e) => panic!("a reservation failed under contention: {e}"),
                }
            }
            acquired
        });
    }
    let mut acquired = 0;
    while let Some(r) = tasks.join_next().await {
        acquired += r.unwrap();
    }
    assert!(acquired > 0, "{label}: the key was acquired");
});

contract!(a_key_posts_once_and_completes_its_record_with_the_postings, |store, label| async move {
    with_accounts(&store, 10_000).await;
    store.idem_reserve(rec("key-1", "fp", 0), 0).await.unwrap();
    let p1 = store.ledger_transfer(transfer("key-1", 2_500, Guards::default()), 1).await.unwrap();
    let (_, outcome) = store.idem_peek("key-1", 1).await.unwrap().unwrap();
    assert_eq!(
        StoredOutcome::from_json(&outcome.expect("completed")).unwrap(),
        StoredOutcome::Succeeded { payment: p1.clone() }
    );
    let p2 = store.ledger_transfer(transfer("key-1", 2_500, Guards::default()), 2).await.unwrap();
    assert_eq!(p1.id, p2.id, "{label}: the same key returns the same payment");
    assert_eq!(
        store.ledger_transfer(transfer("key-1", 999, Guards::default()), 3).await,
        Err(BackendError::IdempotencyKeyReused)
    );
    assert_eq!(balance(&store, "acct-B").await, 2_500);
    assert_integrity(&store, label).await;
});

contract!(concurrent_transfers_of_one_key_post_once, |store, label| async move {
    with_accounts(&store, 100_000).await;
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let s = store.clone();
        tasks.spawn(async move { s.ledger_transfer(transfer("same", 1_000, Guards::default()), 5).await });
    }
    let mut ids = std::collections::HashSet::new();
    while let Some(r) = tasks.join_next().await {
        ids.insert(r.unwrap().expect("every call gets the payment").id);
    }
    assert_eq!(ids.len(), 1, "{label}");
    assert_eq!(balance(&store, "acct-B").await, 1_000);
    assert_integrity(&store, label).await;
});

contract!(concurrent_transfers_never_overdraw, |store, label| async move {
    with_accounts(&store, 10_000).await;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..32 {
        let s = store.clone();
        tasks.spawn(async move { s.ledger_transfer(transfer(&format!("k{n}"), 500, Guards::default()), 5).await });
    }
    let (mut ok, mut refused) = (0, 0);
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(_) => ok += 1,
            Err(BackendError::InsufficientFunds { .. }) => refused += 1,
            Err(e) => panic!("{label}: {e}"),
        }
    }
    assert_eq!((ok, refused), (20, 12), "{label}");
    assert_eq!(balance(&store, "acct-A").await, 0);
    assert_integrity(&store, label).await;
});

contract!(concurrent_payments_stay_within_the_daily_budget, |store, label| async move {
    with_accounts(&store, 1_000_000).await;
    let budget = DailyBudget { kind: PaymentKind::Payment, since: 0, max_minor: 5_000, max_payments: 1_000 };
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..32 {
        let (s, b) = (store.clone(), budget.clone());
        tasks.spawn(async move {
            s.ledger_transfer(
                transfer(&format!("b{n}"), 1_000, Guards { budget: Some(b), mandate: None, payee: None }),
                10,
            )
            .await
        });
    }
    let mut ok = 0;
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(_) => ok += 1,
            Err(BackendError::BudgetExceeded(_)) => {}
            Err(e) => panic!("{label}: {e}"),
        }
    }
    assert_eq!(ok, 5, "{label}");
    // What the preflight and the headroom read outside the transaction: the same usage.
    let kes = Currency::parse("KES").unwrap();
    let used = store.budget_usage(PaymentKind::Payment, "agent", 0, kes).await.unwrap();
    assert_eq!((used.payments, used.spent_minor), (5, 5_000), "{label}");
    let other = store.budget_usage(PaymentKind::Refund, "agent", 0, kes).await.unwrap();
    assert_eq!((other.payments, other.spent_minor), (0, 0), "{label}: refunds count apart");
    // The count limit holds too.
    let counted = DailyBudget { kind: PaymentKind::Payment, since: 0, max_minor: i64::MAX / 4, max_payments: 6 };
    assert!(
        store
            .ledger_transfer(
                transfer("c1", 1, Guards { budget: Some(counted.clone()), mandate: None, payee: None }),
                11
            )
            .await
            .is_ok()
    );
    assert!(matches!(
        store
            .ledger_transfer(transfer("c2", 1, Guards { budget: Some(counted), mandate: None, payee: None }), 11)
            .await,
        Err(BackendError::BudgetExceeded(_))
    ));
    assert_integrity(&store, label).await;
});

// The queue depth operators and the metrics read: pending approvals not yet past their expiry.
contract!(approvals_pending_counts_the_live_queue, |store, label| async move {
    let (a, b, c) = (ApprovalId::generate(), ApprovalId::generate(), ApprovalId::generate());
    store.approval_insert(approval(&a, MandateKind::Closed, 1, 100)).await.unwrap();
    store.approval_insert(approval(&b, MandateKind::Closed, 1, 1_000)).await.unwrap();
    store.approval_insert(approval(&c, MandateKind::Closed, 1, 1_000)).await.unwrap();
    assert_eq!(store.approvals_pending(50).await.unwrap(), 3, "{label}");
    assert_eq!(store.approvals_pending(100).await.unwrap(), 2, "{label}: one expired at 100");
    store.approval_review(reviewed(&c, "carol", "reject", 60, issuer(1, None))).await.unwrap();
    assert_eq!(store.approvals_pending(60).await.unwrap(), 2, "{label}: one rejected");
});

fn approval(id: &ApprovalId, kind: MandateKind, reviewers: i64, expires_at: i64) -> ApprovalRecord {
    ApprovalRecord {
        id: id.clone(),
        status: ApprovalStatus::Pending,
        kind,
        idempotency_key: format!("key-{id}"),
        fingerprint: "fp".into(),
        principal_iss: "iss".into(),
        principal_sub: "agent".into(),
        principal_user: None,
        tool: "create_payment".into(),
        intent: json!({"payer": "acct-A", "payee": "acct-B"}),
        amount_minor: 5_000,
        currency: kes(),
        reason: "over the limit".into(),
        created_at: 0,
        expires_at,
        reviewers_required: reviewers,
        requested_by: "agent".into(),
        mandate_id: None,
        mandate: None,
        decided_at: None,
        decision_reason: None,
        reviews: vec![],
        approver: Default::default(),
        passkey_required: false,
        tag: None,
    }
    .tagged(&review_key(), [3; 8])
}

/// An approval asked for at `at` (its `created_at`: "now" to `approval_get_or_create`).
fn asked(rec: ApprovalRecord, at: i64) -> ApprovalRecord {
    ApprovalRecord { created_at: at, ..rec }.tagged(&review_key(), [4; 8])
}

/// Reviewer `sub` of issuer "ops" decides approval `id` at `at`.
fn reviewed(id: &ApprovalId, sub: &str, decision: &str, at: i64, issue: MandateIssuer) -> ApprovalReview {
    let review = Review {
        reviewer_iss: "ops".into(),
        reviewer_sub: sub.into(),
        decision: ReviewDecision::parse(decision).unwrap(),
        reason: Some("r".into()),
        at,
        passkey: None,
        as_user: false,
        tag: None,
    }
    .tagged(&review_key(), id, [at as u8; 8]);
    ApprovalReview {
        id: id.clone(),
        review,
        issue,
        decided: Default::default(),
        page: String::new(),
        in_force: Default::default(),
        key: review_key(),
        record: None,
    }
}

/// The link key the contract's reviews are tagged under.
fn review_key() -> paygate::domain::audit_chain::LinkKey {
    paygate::domain::audit_chain::LinkKey::new([9; 32])
}

fn issuer(max_uses: i64, budget: Option<i64>) -> MandateIssuer {
    Box::new(move |rec: &ApprovalRecord, approvers: &[String]| {
        Ok(IssuedMandate {
            id: format!("mdt_{}", rec.id.as_str().trim_start_matches("apr_")),
            jws: format!("signed-by-{}", approvers.join("+")),
            budget_minor: budget,
            max_uses,
            expires_at: 10_000,
        })
    })
}

contract!(approvals_run_their_state_machine, |store, label| async move {
    let id = ApprovalId::generate();
    store.approval_insert(approval(&id, MandateKind::Closed, 2, 1_000)).await.unwrap();
    assert!(matches!(
        store.approval_review(reviewed(&id, "agent", "approve", 1, issuer(1, None))).await,
        Err(ReviewError::SelfReview)
    ));
    let a = store.approval_review(reviewed(&id, "alice", "approve", 2, issuer(1, None))).await.unwrap().approval;
    assert_eq!(a.status.as_str(), "pending", "{label}: one of two reviewers");
    assert!(matches!(
        store.approval_review(reviewed(&id, "alice", "approve", 3, issuer(1, None))).await,
        Err(ReviewError::AlreadyReviewed)
    ));
    let a = store.approval_review(reviewed(&id, "bob", "approve", 4, issuer(1, None))).await.unwrap().approval;
    assert_eq!(a.status.as_str(), "approved");
    assert_eq!(a.mandate.as_deref(), Some("signed-by-alice+bob"));
    assert!(matches!(
        store.approval_review(reviewed(&id, "carol", "reject", 5, issuer(1, None))).await,
        Err(ReviewError::Terminal(_))
    ));

    let expired = ApprovalId::generate();
    store.approval_insert(approval(&expired, MandateKind::Closed, 1, 100)).await.unwrap();
    assert!(matches!(
        store.approval_review(reviewed(&expired, "alice", "approve", 100, issuer(1, None))).await,
        Err(ReviewError::Expired)
    ));
    assert_eq!(store.approval_get(&expired).await.unwrap().unwrap().status.as_str(), "expired");

    let rejected = ApprovalId::generate();
    store.approval_insert(approval(&rejected, MandateKind::Closed, 1, 1_000)).await.unwrap();
    let r = store.approval_review(reviewed(&rejected, "alice", "reject", 6, issuer(1, None))).await.unwrap().approval;
    assert_eq!(r.status.as_str(), "rejected");
    assert!(r.mandate.is_none());

    // get_or_create: the live approval for a key is returned, not duplicated.
    let fresh = approval(&ApprovalId::generate(), MandateKind::Closed, 1, 2_000);
    let key = fresh.idempotency_key.clone();
    let record = |r: ApprovalRequest| match r {
        ApprovalRequest::Existing(a) | ApprovalRequest::Created(a) => a,
        ApprovalRequest::TooManyPending => panic!("{label}: too many pending"),
    };
    let first = record(store.approval_get_or_create(asked(fresh.clone(), 10), 100, vec![]).await.unwrap());
    let again = store
        .approval_get_or_create(
            asked(approval(&ApprovalId::generate(), MandateKind::Closed, 1, 2_000), 10),
            100,
            vec![],
        )
        .await;
    assert_ne!(record(again.unwrap()).idempotency_key, key, "{label}: another key is another approval");
    let mut same_key = approval(&ApprovalId::generate(), MandateKind::Closed, 1, 2_000);
    same_key.idempotency_key = key.clone();
    assert_eq!(
        store.approval_get_or_create(asked(same_key.clone(), 11), 100, vec![]).await.unwrap(),
        ApprovalRequest::Existing(first.clone())
    );
    // A rejection sticks to its operation: asking again answers with the rejected approval.
    store.approval_review(reviewed(&first.id, "carol", "reject", 12, issuer(1, None))).await.unwrap();
    match store.approval_get_or_create(asked(same_key, 13), 100, vec![]).await.unwrap() {
        ApprovalRequest::Existing(a) => {
            assert_eq!((a.id, a.status.as_str()), (first.id.clone(), "rejected"), "{label}")
        }
        other => panic!("{label}: a rejected operation got {other:?}"),
    }
    // The agent's live pending approvals are bounded (this store holds two for "agent" by now).
    let pending_now = store
        .approval_list(ApprovalQuery { status: Some("pending".into()), now: 14, before: None, limit: 100 })
        .await
        .unwrap()
        .items
        .len() as i64;
    let flood = approval(&ApprovalId::generate(), MandateKind::Closed, 1, 2_000);
    assert_eq!(
        store.approval_get_or_create(asked(flood, 14), pending_now, vec![]).await.unwrap(),
        ApprovalRequest::TooManyPending,
        "{label}"
    );

    // Listing: status as of now (an untouched pending approval past expiry is expired); pages.
    let page = store
        .approval_list(ApprovalQuery { status: Some("expired".into()), now: 1_500, before: None, limit: 10 })
        .await
        .unwrap();
    assert!(page.items.iter().any(|(_, a)| a.id == expired), "{label}");
    let all = store.approval_list(ApprovalQuery { status: None, now: 0, before: None, limit: 2 }).await.unwrap();
    assert_eq!(all.items.len(), 2);
    let next =
        store.approval_list(ApprovalQuery { status: None, now: 0, before: all.next_cursor, limit: 100 }).await.unwrap();
    assert!(next.items.iter().all(|(_, a)| all.items.iter().all(|(_, b)| a.id != b.id)));
    assert_eq!(all.items.len() + next.items.len(), 5);
});

contract!(mandates_are_drawn_once_under_concurrency, |store, label| async move {
    with_accounts(&store, 1_000_000).await;
    let id = ApprovalId::generate();
    store.approval_insert(approval(&id, MandateKind::Open, 1, 1_000)).await.unwrap();
    let a = store.approval_review(reviewed(&id, "alice", "approve", 1, issuer(3, Some(2_500)))).await.unwrap().approval;
    let mandate_id = a.mandate_id.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..16 {
        let (s, m) = (store.clone(), mandate_id.clone());
        tasks.spawn(async move {
            let guards = Guards { budget: None, mandate: Some(MandateDraw { mandate_id: m, jws: None }), payee: None };
            s.ledger_transfer(transfer(&format!("m{n}"), 1_000, guards), 5).await
        });
    }
    let mut ok = 0;
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(_) => ok += 1,
            Err(BackendError::MandateExhausted(_)) => {}
            Err(e) => panic!("{label}: {e}"),
        }
    }
    assert_eq!(ok, 2, "{label}: a budget of 25.00 allows two draws of 10.00");
    assert_eq!(balance(&store, "acct-B").await, 2_000);
    assert_integrity(&store, label).await;
});

contract!(refunds_are_bounded_and_exactly_once, |store, label| async move {
    with_accounts(&store, 10_000).await;
    let p = store.ledger_transfer(transfer("pay", 10_000, Guards::default()), 0).await.unwrap();
    let refund = |key: &str, amount: Option<i64>| RefundRequest {
        attempt: Attempt::reserved(key),
        refund_id: PaymentId::generate(),
        payment_id: p.id.clone(),
        amount_minor: amount,
        reason: None,
        principal_sub: "agent".into(),
        principal_user: None,
        guards: Guards::default(),
        autonomous_cap_minor: None,
    };
    assert!(matches!(
        store.ledger_refund(refund("r0", Some(10_001)), 1).await,
        Err(BackendError::RefundExceedsRemaining { .. })
    ));
    let r1 = store.ledger_refund(refund("r1", Some(4_000)), 1).await.unwrap();
    assert_eq!(store.ledger_refund(refund("r1", Some(4_000)), 1).await.unwrap().id, r1.id, "{label}");
    assert_eq!(r1.kind, PaymentKind::Refund);
    assert_eq!(store.ledger_refund(refund("r2", None), 1).await.unwrap().amount_minor, 6_000);
    assert!(matches!(store.ledger_refund(refund("r3", None), 1).await, Err(BackendError::NotRefundable(_))));
    assert_eq!(store.ledger_payment(&p.id).await.unwrap().unwrap().refunded_minor, 10_000);
    let entries =
        store.ledger_entries(EntryQuery { account: acct("acct-B"), before_seq: None, limit: 2 }).await.unwrap();
    assert_eq!(entries.items.len(), 2);
    assert!(entries.next_cursor.is_some());
    assert_integrity(&store, label).await;
});

contract!(concurrent_refunds_stay_within_the_daily_refund_budget, |store, label| async move {
    with_accounts(&store, 1_000_000).await;
    // A day of payments fills the payment budget; refunds draw on their own.
    let paid_budget = DailyBudget { kind: PaymentKind::Payment, since: 0, max_minor: 16_000, max_payments: 1_000 };
    let mut paid = Vec::new();
    for n in 0..16 {
        let guards = Guards { budget: Some(paid_budget.clone()), mandate: None, payee: None };
        paid.push(store.ledger_transfer(transfer(&format!("p{n}"), 1_000, guards), 10).await.unwrap());
    }
    let budget = DailyBudget { kind: PaymentKind::Refund, since: 0, max_minor: 5_000, max_payments: 1_000 };
    let mut tasks = tokio::task::JoinSet::new();
    for (n, p) in paid.iter().enumerate() {
        let (s, b, pid) = (store.clone(), budget.clone(), p.id.clone());
        tasks.spawn(async move {
            let req = RefundRequest {
                attempt: Attempt::reserved(format!("r{n}")),
                refund_id: PaymentId::generate(),
                payment_id: pid,
                amount_minor: None,
                reason: None,
                principal_sub: "agent".into(),
                principal_user: None,
                guards: Guards { budget: Some(b), mandate: None, payee: None },
                autonomous_cap_minor: None,
            };
            s.ledger_refund(req, 10).await
        });
    }
    let mut ok = 0;
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            Ok(_) => ok += 1,
            Err(BackendError::BudgetExceeded(_)) => {}
            Err(e) => panic!("{label}: {e}"),
        }
    }
    assert_eq!(ok, 5, "{label}: a refund budget of 50.00 allows five full refunds of 10.00");
    // Refunding freed nothing of the payment budget: it is still spent.
    let guards = Guards { budget: Some(paid_budget), mandate: None, payee: None };
    assert!(matches!(
        store.ledger_transfer(transfer("p-late", 1, guards), 10).await,
        Err(BackendError::BudgetExceeded(_))
    ));
    assert_integrity(&store, label).await;
});

contract!(operator_reads_filter_and_page_the_same_on_every_engine, |store, label| async move {
    with_accounts(&store, 100_000).await;
    // Three ledger payments at t = 3600, 3601, 7300 and one refund; one M-Pesa record, pending.
    let mut paid = Vec::new();
    for (i, at) in [3_600, 3_601, 7_300].into_iter().enumerate() {
        paid.push(store.ledger_transfer(transfer(&format!("op{i}"), 1_000, Guards::default()), at).await.unwrap());
    }
    let refund = RefundRequest {
        attempt: Attempt::reserved("op-r"),
        refund_id: PaymentId::generate(),
        payment_id: paid[0].id.clone(),
        amount_minor: Some(400),
        reason: None,
        principal_sub: "agent".into(),
        principal_user: None,
        guards: Guards::default(),
        autonomous_cap_minor: None,
    };
    store.ledger_refund(refund, 7_400).await.unwrap();
    let rec = RailPayment { rail: "mpesa".into(), ..rail(&PaymentId::generate(), "mpesa-op", 2_500) };
    store.rail_open(rec, Guards::default(), None, 7_500).await.unwrap();

    let all = store.ops_payments(OpsPaymentQuery { limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(all.len(), 5, "{label}");
    let times: Vec<i64> = all.iter().map(|p| p.payment.created_at).collect();
    assert!(times.windows(2).all(|w| w[0] >= w[1]), "{label}: newest first {times:?}");
    assert_eq!((all[0].rail.as_str(), all[0].rail_state.as_deref()), ("mpesa", Some("submitting")), "{label}");
    assert_eq!(all[0].payment.status, paygate::domain::payment::PaymentStatus::Pending, "{label}");
    assert!(all[1..].iter().all(|p| p.rail == "ledger" && p.rail_state.is_none()), "{label}");
    let q = |f: fn(&mut OpsPaymentQuery)| {
        let mut q = OpsPaymentQuery { limit: 10, ..Default::default() };
        f(&mut q);
        q
    };
    for (query, n) in [
        (q(|q| q.kind = Some(PaymentKind::Refund)), 1),
        (q(|q| q.rail = Some("ledger".into())), 4),
        (q(|q| q.status = Some(paygate::domain::payment::PaymentStatus::Succeeded)), 4),
        (q(|q| q.agent = Some("nobody".into())), 0),
        (q(|q| q.account = Some(acct("acct-B"))), 5),
        (q(|q| q.account = Some(acct("acct-Z"))), 0),
        (q(|q| (q.from, q.to) = (Some(3_601), Some(7_400))), 2),
        (q(|q| q.before = Some((3_601, "zzz".into()))), 2),
        (q(|q| q.limit = 2), 2),
    ] {
        assert_eq!(store.ops_payments(query.clone()).await.unwrap().len(), n, "{label}: {query:?}");
    }
    let one = store.ops_payment(&paid[0].id).await.unwrap().unwrap();
    assert_eq!((one.payment.refunded_minor, one.idempotency_key.as_str()), (400, "op0"), "{label}");
    assert!(store.ops_payment(&PaymentId::generate()).await.unwrap().is_none());

    // Volume by hour from 0: hour 1 holds two payments, hour 2 the third, a refund and the rail record.
    let volume = store.volume(0, 86_400).await.unwrap();
    let paid_by_hour: Vec<(i64, i64, i64)> = volume
        .iter()
        .filter(|v| v.kind == "payment" && v.status == "succeeded")
        .map(|v| (v.hour, v.count, v.amount_minor))
        .collect();
    assert_eq!(paid_by_hour, vec![(1, 2, 2_000), (2, 1, 1_000)], "{label}");
    assert!(volume.iter().any(|v| v.kind == "refund" && v.amount_minor == 400), "{label}");

    // Audit: filters, the related trail, approvals by key.
    let audit = |sub: &str, tool: &str, payment: Option<&str>, key: Option<&str>, approval: Option<&str>, at: i64| {
        AuditRecord {
            seq: 0,
            at,
            correlation_id: format!("corr-{at}"),
            principal_iss: "iss".into(),
            principal_sub: sub.into(),
            principal_user: None,
            tool: tool.into(),
            decision: "allowed".into(),
            code: None,
            idempotency_key: key.map(str::to_string),
            payment_id: payment.map(str::to_string),
            approval_id: approval.map(str::to_string),
            detail: None,
            repeats: 1,
            policy_version: None,
            intent: None,
            tag: None,
        }
    };
    let pid = paid[1].id.to_string();
    store.audit_append(audit("agent", "create_payment", None, Some("k1"), Some("apr_1"), 10)).await.unwrap();
    store.audit_append(audit("alice", "approvals.approve", None, None, Some("apr_1"), 11)).await.unwrap();
    store.audit_append(audit("agent", "create_payment", Some(&pid), Some("k2"), None, 12)).await.unwrap();
    store.audit_append(audit("other", "get_balance", None, None, None, 13)).await.unwrap();
    let found =
        store.audit_query(AuditQuery { agent: Some("agent".into()), limit: 10, ..Default::default() }).await.unwrap();
    assert_eq!(found.iter().map(|r| r.at).collect::<Vec<_>>(), vec![12, 10], "{label}");
    let q = AuditQuery { correlation_id: Some("corr-11".into()), limit: 10, ..Default::default() };
    assert_eq!(store.audit_query(q).await.unwrap().len(), 1, "{label}");
    let q = AuditQuery { from: Some(11), to: Some(13), limit: 10, ..Default::default() };
    assert_eq!(store.audit_query(q).await.unwrap().len(), 2, "{label}");
    let first = store.audit_query(AuditQuery { limit: 1, ..Default::default() }).await.unwrap();
    let q = AuditQuery { before_seq: Some(first[0].seq), limit: 10, ..Default::default() };
    assert_eq!(store.audit_query(q).await.unwrap().len(), 3, "{label}");
    let trail = AuditRelated {
        payment_id: pid.clone(),
        keys: vec!["k1".into()],
        approval_ids: vec!["apr_1".into()],
        limit: 10,
    };
    let trail = store.audit_related(trail).await.unwrap();
    assert_eq!(trail.iter().map(|r| r.at).collect::<Vec<_>>(), vec![10, 11, 12], "{label}: oldest first");
    assert!(store.approvals_for_keys(vec![]).await.unwrap().is_empty());
    let id = ApprovalId::generate();
    store.approval_insert(approval(&id, MandateKind::Closed, 1, 50_000)).await.unwrap();
    assert_eq!(store.approvals_for_keys(vec![format!("key-{id}")]).await.unwrap(), vec![id.to_string()], "{label}");

    // Mandates by status as of a moment; principals; agents seen.
    store.approval_review(reviewed(&id, "alice", "approve", 20, issuer(2, Some(9_000)))).await.unwrap();
    let mq = |status, now| MandateQuery { status, now, before: None, limit: 10 };
    let active = store.mandate_list(mq(Some(MandateStatus::Active), 100)).await.unwrap();
    assert_eq!(active.len(), 1, "{label}");
    assert_eq!(
        (active[0].approval_id.as_str(), active[0].max_uses, active[0].budget_minor),
        (id.as_str(), 2, Some(9_000))
    );
    assert_eq!(store.mandate_list(mq(Some(MandateStatus::Expired), 10_000)).await.unwrap().len(), 1, "{label}");
    assert!(store.mandate_list(mq(Some(MandateStatus::Revoked), 100)).await.unwrap().is_empty());
    store.mandate_revoke(&id, "bob", 30, None).await.unwrap();
    let got = store.mandate_get(&active[0].id, 100).await.unwrap().unwrap();
    assert_eq!((got.status, got.revoked_by.as_deref()), (MandateStatus::Revoked, Some("bob")), "{label}");
    assert!(store.mandate_get("mdt_none", 100).await.unwrap().is_none());
    store.suspend(suspending(SuspensionScope::Agent, "too many"), 40, vec![]).await.unwrap();
    let states = store.principal_states(10).await.unwrap();
    assert_eq!((states[0].subject.as_str(), states[0].suspended_at), ("agent", Some(40)), "{label}");
    assert_eq!((states[0].issuer.as_str(), &states[0].scope), ("iss", &SuspensionScope::Agent), "{label}");
    let mut internal = audit("scheduler", "get_balance", None, None, None, 14);
    internal.principal_iss = "paygate".into();
    store.audit_append(internal).await.unwrap();
    let seen = store.agents_seen(0, &["create_payment", "get_balance"], "paygate", 10).await.unwrap();
    assert_eq!(seen, vec![("other".to_string(), 13), ("agent".to_string(), 12)], "{label}");
    assert!(store.agents_seen(0, &[], "paygate", 10).await.unwrap().is_empty());
});

fn claimed(key: &str, fp: &str, minor: i64, guards: Guards) -> TransferRequest {
    let mut req = transfer(key, minor, guards);
    req.attempt.claim = Some(Claim { records: vec![rec(key, fp, 100)] });
    req
}

// One write per payment: the posting transaction claims its key, posts, completes the key and
// appends the audit record together. Duplicates replay, a refusal's fate sticks to its key, a
// spent budget gives the key back, and one bad payment in a group commit spoils none of the others.
contract!(claimed_postings_are_one_write_and_exactly_once, |store, label| async move {
    with_accounts(&store, 10_000).await;
    // 32 concurrent payments, two of which cannot be paid; every good one exactly once, even with
    // a duplicate of each racing it.
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..32 {
        for _copy in 0..2 {
            let s = store.clone();
            let minor = if n % 16 == 7 { 1_000_000 } else { 100 };
            tasks.spawn(async move {
                (n, s.ledger_transfer(claimed(&format!("c{n}"), "fp", minor, Guards::default()), 10).await)
            });
        }
    }
    let mut by_key: std::collections::HashMap<i32, Vec<Result<String, BackendError>>> = Default::default();
    while let Some(r) = tasks.join_next().await {
        let (n, result) = r.unwrap();
        by_key.entry(n).or_default().push(result.map(|p| p.id.to_string()));
    }
    for (n, results) in &by_key {
        let paid: Vec<&String> = results.iter().filter_map(|r| r.as_ref().ok()).collect();
        let held = results.iter().filter(|r| matches!(r, Err(BackendError::KeyHeld { .. }))).count();
        if n % 16 == 7 {
            assert!(paid.is_empty(), "{label}: c{n} cannot be paid");
            let refused = results.iter().filter(|r| matches!(r, Err(BackendError::InsufficientFunds { .. }))).count();
            assert_eq!((refused, held), (1, 1), "{label}: c{n}: refused once, then its fate replays: {results:?}");
            let (_, outcome) = store.idem_peek(&format!("c{n}"), 11).await.unwrap().unwrap();
            assert!(outcome.unwrap().contains("insufficient funds"), "{label}: the refusal sticks to the key");
        } else {
            assert_eq!((paid.len(), held), (1, 1), "{label}: c{n}: paid once, the duplicate answered by the key");
            let (fp, outcome) = store.idem_peek(&format!("c{n}"), 11).await.unwrap().unwrap();
            assert_eq!(fp, "fp");
            assert!(outcome.unwrap().contains(paid[0].as_str()), "{label}: completed in the same write");
        }
    }
    assert_eq!(balance(&store, "acct-B").await, 30 * 100, "{label}");
    // The same key with other arguments: the stored answer comes back for the caller to refuse.
    match store.ledger_transfer(claimed("c0", "other-fp", 100, Guards::default()), 12).await {
        Err(BackendError::KeyHeld { key, reservation: Reservation::Completed { fingerprint, .. } }) => {
            assert_eq!((key.as_str(), fingerprint.as_str()), ("c0", "fp"), "{label}");
        }
        other => panic!("{label}: {other:?}"),
    }
    // A spent budget moves nothing and keeps nothing: the key is free to try again tomorrow.
    let spent = DailyBudget { kind: PaymentKind::Payment, since: 0, max_minor: 50, max_payments: 10 };
    let r = store
        .ledger_transfer(claimed("b1", "fp", 100, Guards { budget: Some(spent), mandate: None, payee: None }), 13)
        .await;
    assert!(matches!(r, Err(BackendError::BudgetExceeded(_))), "{label}: {r:?}");
    assert_eq!(store.idem_peek("b1", 14).await.unwrap(), None, "{label}: given back");
    // A mandate's key that already paid this very operation completes the operation's own key too.
    let both = |op: &str| Claim { records: vec![rec(op, "op-fp", 100), rec("c1", "fp", 100)] };
    let mut req = transfer("c1", 100, Guards::default());
    req.attempt.claim = Some(both("op-1"));
    let r = store.ledger_transfer(req, 15).await;
    assert!(matches!(r, Err(BackendError::KeyHeld { ref key, .. }) if key == "c1"), "{label}: {r:?}");
    let (fp, outcome) = store.idem_peek("op-1", 16).await.unwrap().unwrap();
    assert_eq!(fp, "op-fp", "{label}");
    assert_eq!(outcome, store.idem_peek("c1", 16).await.unwrap().unwrap().1, "{label}: the same outcome");
    assert_integrity(&store, label).await;
});

contract!(suspension_and_denials, |store, label| async move {
    let audit = |at: i64, decision: &str, code: &str, user: Option<&str>, repeats: i64| AuditRecord {
        seq: 0,
        at,
        correlation_id: "corr_x".into(),
        principal_iss: "iss".into(),
        principal_sub: "agent".into(),
        principal_user: user.map(str::to_string),
        tool: "create_payment".into(),
        decision: decision.into(),
        code: Some(code.into()),
        idempotency_key: None,
        payment_id: None,
        approval_id: None,
        detail: None,
        repeats,
        policy_version: None,
        tag: None,
        intent: None,
    };
    let agent = PrincipalRef { issuer: "iss".into(), subject: "agent".into(), user: None };
    let for_alice = PrincipalRef { user: Some("alice".into()), ..agent.clone() };
    let for_bob = PrincipalRef { user: Some("bob".into()), ..agent.clone() };
    let elsewhere = PrincipalRef { issuer: "other-iss".into(), ..agent.clone() };
    for rec in [
        audit(100, "denied", "ACCOUNT_NOT_ALLOWED", None, 1),
        audit(100, "denied", "INVALID_ARGUMENT", None, 1),
        audit(100, "conflict", "IDEMPOTENCY_CONFLICT", None, 1),
        audit(10, "denied", "ACCOUNT_NOT_ALLOWED", None, 1),
        audit(100, "denied", "ACCOUNT_NOT_ALLOWED", Some("alice"), 1),
        // A throttled flood of RATE_LIMITED answers, one approval-flood refusal, and a throttled
        // record of three missing-scope refusals (each counts).
        audit(100, "rate_limited", "RATE_LIMITED", None, 45),
        audit(100, "denied", "INSUFFICIENT_SCOPE", None, 3),
        audit(100, "denied", "RATE_LIMITED", None, 1),
    ] {
        store.audit_append(rec).await.unwrap();
    }
    let counted = |d: i64, r: i64| Denials { denials: d, rate_limited: r };
    assert_eq!(
        store.denials_since(&agent, 50).await.unwrap(),
        counted(5, 46),
        "{label}: typos and old denials do not count; a throttled record counts its repeats"
    );
    assert_eq!(store.denials_since(&for_alice, 50).await.unwrap(), counted(1, 0), "{label}: the pair's own");
    assert_eq!(store.denials_since(&elsewhere, 50).await.unwrap(), counted(0, 0), "{label}: another issuer's");

    // The stop rule suspends a pair: the agent on its own token, or for anyone else, is not suspended.
    assert_eq!(store.suspension(&agent).await.unwrap(), None);
    let alice_only = SuspensionScope::Pair(Some("alice".into()));
    assert!(store.suspend(suspending(alice_only.clone(), "too many"), 101, vec![]).await.unwrap(), "{label}");
    assert!(!store.suspend(suspending(alice_only.clone(), "again"), 101, vec![]).await.unwrap(), "{label}: already");
    assert_eq!(store.suspension(&for_alice).await.unwrap(), Some((101, "too many".into())), "{label}");
    assert_eq!(store.suspension(&agent).await.unwrap(), None, "{label}");
    assert_eq!(store.suspension(&for_bob).await.unwrap(), None, "{label}");
    let alice_elsewhere = PrincipalRef { user: Some("alice".into()), ..elsewhere.clone() };
    assert_eq!(store.suspension(&alice_elsewhere).await.unwrap(), None, "{label}: keyed by issuer too");
    // An operator suspends the agent whoever it acts for.
    assert!(store.suspend(suspending(SuspensionScope::Agent, "by hand"), 102, vec![]).await.unwrap());
    for who in [&agent, &for_bob] {
        assert_eq!(store.suspension(who).await.unwrap(), Some((102, "by hand".into())), "{label}: {who:?}");
    }
    assert_eq!(store.suspension(&elsewhere).await.unwrap(), None, "{label}: another issuer's subject");
    // Resuming the pair leaves the agent-wide suspension standing; resuming the agent lifts all.
    assert!(store.resume("iss", "agent", Some("alice"), 103).await.unwrap());
    assert_eq!(store.suspension(&for_alice).await.unwrap(), Some((102, "by hand".into())), "{label}");
    assert!(!store.resume("other-iss", "agent", None, 103).await.unwrap(), "{label}: not that issuer's");
    assert!(store.resume("iss", "agent", None, 104).await.unwrap());
    assert!(!store.resume("iss", "agent", None, 105).await.unwrap(), "{label}: not suspended any more");
    for who in [&agent, &for_alice, &for_bob] {
        assert_eq!(store.suspension(who).await.unwrap(), None, "{label}: {who:?}");
    }
    assert_eq!(store.denials_since(&agent, 50).await.unwrap(), counted(0, 0), "{label}: a resume forgives");
    assert_eq!(store.denials_since(&for_alice, 50).await.unwrap(), counted(0, 0), "{label}");
    let states = store.principal_states(10).await.unwrap();
    assert_eq!(states.len(), 2, "{label}: one row per what was suspended");
    assert_eq!(store.audit_list(Some("agent"), 2).await.unwrap().len(), 2);
});

contract!(a_failing_write_does_not_fail_or_duplicate_its_batch, |store, label| async move {
    // With 40 writes racing, SQLite's writer commits many of them in one batch: the failing ones
    // (an unknown payee) must roll back alone.
    with_accounts(&store, 1_000_000).await;
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..40 {
        let s = store.clone();
        tasks.spawn(async move {
            let mut t = transfer(&format!("batch-{n}"), 100, Guards::default());
            if n % 2 == 1 {
                t.to_account = acct("acct-nowhere");
            }
            (n, s.ledger_transfer(t, 5).await)
        });
    }
    while let Some(r) = tasks.join_next().await {
        let (n, r) = r.unwrap();
        match (n % 2, r) {
            (0, Ok(p)) => assert_eq!(p.amount_minor, 100),
            (1, Err(BackendError::AccountNotFound(_))) => {}
            (_, other) => panic!("{label}: write {n}: {other:?}"),
        }
    }
    assert_eq!(balance(&store, "acct-B").await, 20 * 100, "{label}: every good write once");
    assert_integrity(&store, label).await;
});

fn rail(id: &PaymentId, key: &str, minor: i64) -> RailPayment {
    RailPayment {
        id: id.clone(),
        idempotency_key: key.into(),
        rail: "http".into(),
        kind: PaymentKind::Payment,
        state: RailState::Submitting,
        from_account: acct("acct-A"),
        to_account: acct("acct-B"),
        amount_minor: minor,
        currency: kes(),
        refund_of: None,
        memo: None,
        principal_sub: "agent".into(),
        principal_user: None,
        mandate_id: None,
        rail_ref: None,
        receipt: None,
        phone: None,
        reason: None,
        created_at: 0,
        updated_at: 0,
        flow: RailFlow::Ledger,
        family_key: None,
    }
}

// The refunds recorded against a payment add up to what it has given back, or may have: every
// refund not failed (succeeded, pending, unknown, still submitting), none of another payment's.
contract!(a_payments_recorded_refunds_add_up_to_all_but_the_failed_ones, |store, label| async move {
    let (paid, other) = (PaymentId::generate(), PaymentId::generate());
    assert_eq!(store.rail_refunded(&paid).await.unwrap(), 0, "{label}: none yet");
    let states = [
        (RailState::Succeeded, 1_000),
        (RailState::Failed, 5_000),
        (RailState::Pending, 300),
        (RailState::Unknown, 20),
        (RailState::Submitting, 4),
    ];
    for (i, (state, minor)) in states.into_iter().enumerate() {
        let id = PaymentId::generate();
        let rec = RailPayment {
            kind: PaymentKind::Refund,
            refund_of: Some(paid.clone()),
            ..rail(&id, &format!("rf-{i}"), minor)
        };
        store.rail_open(rec, Guards::default(), None, 10).await.unwrap();
        if state != RailState::Submitting {
            let to = RailMove { id: &id, from: &[RailState::Submitting], to: state, update: RailUpdate::default() };
            assert_eq!(store.rail_transition(to, 11).await.unwrap().map(|r| r.state), Some(state), "{label}");
        }
    }
    let theirs = PaymentId::generate();
    let rec = RailPayment { kind: PaymentKind::Refund, refund_of: Some(other.clone()), ..rail(&theirs, "rf-other", 7) };
    store.rail_open(rec, Guards::default(), None, 10).await.unwrap();
    assert_eq!(store.rail_refunded(&paid).await.unwrap(), 1_324, "{label}");
    assert_eq!(store.rail_refunded(&other).await.unwrap(), 7, "{label}");
});

// Money going out through a rail keeps its flow, is found by the reference it was sent under, and
// settles from any open state (its result may beat the request's own answer, or follow a lost one),
// once; a collection settles only once pushed.
contract!(outbound_records_keep_their_flow_and_settle_once_from_any_open_state, |store, label| async move {
    use paygate::domain::rules::rail::settles_from;
    for (i, open) in [RailState::Submitting, RailState::Unknown, RailState::Pending].into_iter().enumerate() {
        let id = PaymentId::generate();
        let rec = RailPayment {
            rail: "mpesa".into(),
            flow: RailFlow::Payout,
            rail_ref: Some(id.to_string()),
            ..rail(&id, &format!("payout-{i}"), 500)
        };
        store.rail_open(rec, Guards::default(), None, 10).await.unwrap();
        if open != RailState::Submitting {
            let moved = store
                .rail_transition(
                    RailMove { id: &id, from: &[RailState::Submitting], to: open, update: RailUpdate::default() },
                    11,
                )
                .await;
            assert_eq!(moved.unwrap().map(|r| r.state), Some(open), "{label}");
        }
        let found = store.rail_by_ref("mpesa", id.as_str()).await.unwrap().unwrap();
        assert_eq!((found.flow, found.state), (RailFlow::Payout, open), "{label}");
        let paid = RailUpdate { receipt: Some("TKRECEIPT1".into()), ..Default::default() };
        let settled = store
            .rail_transition(
                RailMove { id: &id, from: settles_from(found.flow), to: RailState::Succeeded, update: paid },
                12,
            )
            .await;
        let settled = settled.unwrap().unwrap();
        assert_eq!((settled.state, settled.receipt.as_deref()), (RailState::Succeeded, Some("TKRECEIPT1")), "{label}");
        let late = store.rail_transition(
            RailMove { id: &id, from: settles_from(found.flow), to: RailState::Failed, update: RailUpdate::default() },
            13,
        );
        assert_eq!(late.await.unwrap(), None, "{label}: a second result changes nothing");
    }
    let id = PaymentId::generate();
    let rec = RailPayment { rail: "mpesa".into(), flow: RailFlow::Collection, ..rail(&id, "collect-1", 500) };
    store.rail_open(rec, Guards::default(), None, 10).await.unwrap();
    let early = store.rail_transition(
        RailMove {
            id: &id,
            from: settles_from(RailFlow::Collection),
            to: RailState::Succeeded,
            update: RailUpdate::default(),
        },
        11,
    );
    assert_eq!(early.await.unwrap(), None, "{label}: a collection not yet pushed does not settle");
    assert_eq!(store.rail_get(&id).await.unwrap().unwrap().flow, RailFlow::Collection, "{label}");
});

// One operation is one payout across rails: a record under the family key another rail's record
// holds is never opened (the open answers with that record, which `send_once` refuses as another
// request), whatever became of the family's idempotency record (the stop-66 review: a writer
// deleting it let the other rail pay).
contract!(one_family_opens_one_rail_record, |store, label| async move {
    let payout = |rail: &str, key: &str| RailPayment {
        rail: rail.into(),
        flow: RailFlow::Payout,
        family_key: Some("family-op-1".into()),
        ..rail_payment_for(key)
    };
    let first = store.rail_open(payout("mpesa", "mpesa-key"), Guards::default(), None, 10).await.unwrap();
    assert!(first.created, "{label}");
    let second = store.rail_open(payout("airtel", "airtel-key"), Guards::default(), None, 11).await.unwrap();
    assert!(!second.created, "{label}: no second record under one family");
    assert_eq!((second.rec.id, second.rec.rail.as_str()), (first.rec.id.clone(), "mpesa"), "{label}");
    assert_eq!(store.rail_by_key("airtel-key").await.unwrap(), None, "{label}");
    // Another family, or none, opens as before.
    let other = RailPayment { family_key: Some("family-op-2".into()), ..payout("airtel", "airtel-key-2") };
    assert!(store.rail_open(other, Guards::default(), None, 12).await.unwrap().created, "{label}");
    let none = RailPayment { family_key: None, ..payout("airtel", "airtel-key-3") };
    assert!(store.rail_open(none, Guards::default(), None, 12).await.unwrap().created, "{label}");
    let again = store.rail_get(&first.rec.id).await.unwrap().unwrap();
    assert_eq!(again.family_key.as_deref(), Some("family-op-1"), "{label}: the key is stored");
});

fn rail_payment_for(key: &str) -> RailPayment {
    rail(&PaymentId::generate(), key, 700)
}

// The gateway's record of external-rail payments: guards drawn once per key, given back when
// nothing moved, and states that only move forward from what the caller expects.
contract!(rail_records_draw_guards_once_and_give_them_back_when_nothing_moved, |store, label| async move {
    let budget = || Guards {
        budget: Some(DailyBudget { kind: PaymentKind::Payment, since: 0, max_minor: 3_000, max_payments: 10 }),
        mandate: None,
        payee: None,
    };
    let (p1, p2, p3) = (PaymentId::generate(), PaymentId::generate(), PaymentId::generate());
    let r1 = store.rail_open(rail(&p1, "k1", 2_000), budget(), None, 10).await.unwrap();
    assert_eq!((r1.rec.state, r1.rec.created_at, r1.created), (RailState::Submitting, 10, true));
    // The same key again: the first record, nothing drawn twice (its id wins over the new one).
    let again = store.rail_open(rail(&PaymentId::generate(), "k1", 2_000), budget(), None, 11).await.unwrap();
    assert_eq!((again.rec.id, again.created), (p1.clone(), false), "{label}: an earlier attempt's record");
    assert!(matches!(
        store.rail_open(rail(&p2, "k2", 2_000), budget(), None, 12).await,
        Err(BackendError::BudgetExceeded(_))
    ));
    // Abandoning the first gives its 2000 back: now the second fits.
    assert!(store.rail_abandon(&p1).await.unwrap());
    assert!(store.rail_get(&p1).await.unwrap().is_none());
    store.rail_open(rail(&p2, "k2", 2_000), budget(), None, 13).await.unwrap();
    // Forward moves only from the expected states; a late or duplicate move changes nothing.
    let update = RailUpdate { rail_ref: Some("ref-2".into()), ..Default::default() };
    let sent = store
        .rail_transition(RailMove { id: &p2, from: &[RailState::Submitting], to: RailState::Pending, update }, 14)
        .await
        .unwrap();
    assert_eq!(sent.unwrap().rail_ref.as_deref(), Some("ref-2"));
    assert_eq!(store.rail_by_ref("http", "ref-2").await.unwrap().unwrap().id, p2);
    let receipt = RailUpdate { receipt: Some("RCP1".into()), ..Default::default() };
    let done = store
        .rail_transition(
            RailMove { id: &p2, from: &[RailState::Pending], to: RailState::Succeeded, update: receipt },
            15,
        )
        .await
        .unwrap();
    assert_eq!(done.unwrap().receipt.as_deref(), Some("RCP1"));
    let late = store
        .rail_transition(
            RailMove { id: &p2, from: &[RailState::Pending], to: RailState::Failed, update: RailUpdate::default() },
            16,
        )
        .await;
    assert!(late.unwrap().is_none(), "{label}: terminal states never change");
    assert!(!store.rail_abandon(&p2).await.unwrap(), "only an unsent record can be abandoned");
    // A failure gives the draw back too.
    store.rail_open(rail(&p3, "k3", 1_000), budget(), None, 17).await.unwrap();
    store
        .rail_transition(
            RailMove { id: &p3, from: &[RailState::Submitting], to: RailState::Failed, update: RailUpdate::default() },
            18,
        )
        .await
        .unwrap();
    store.rail_open(rail(&PaymentId::generate(), "k4", 1_000), budget(), None, 19).await.unwrap();
    // Listing and paging.
    let submitting = |rail: Option<&str>| RailQuery {
        rail: rail.map(str::to_string),
        states: vec![RailState::Submitting],
        updated_before: 100,
        limit: 10,
    };
    assert_eq!(store.rail_list(submitting(None)).await.unwrap().len(), 1);
    assert_eq!(store.rail_list(submitting(Some("http"))).await.unwrap().len(), 1, "{label}");
    assert!(store.rail_list(submitting(Some("mpesa"))).await.unwrap().is_empty(), "{label}");
    let page = store.rail_since(RailPage { since: 0, after_seq: 0, limit: 2 }).await.unwrap();
    assert_eq!(page.len(), 2);
    let rest = store.rail_since(RailPage { since: 0, after_seq: page[1].0, limit: 10 }).await.unwrap();
    assert_eq!(page.len() + rest.len(), 3, "{label}");
    // The summary counts rail records by the status agents see.
    let summary = store
        .payment_summary(paygate::domain::payment::SummaryQuery {
            accounts: vec![acct("acct-B")],
            from: 0,
            to: 100,
            currency: None,
            principal_user: None,
        })
        .await
        .unwrap();
    let count = |status: &str| summary.iter().find(|r| r.status == status).map(|r| (r.count, r.total_minor));
    assert_eq!(
        (count("succeeded"), count("failed"), count("pending")),
        (Some((1, 2_000)), Some((1, 1_000)), Some((1, 1_000)))
    );
});

// Rail records as agents' payment listings see them: filtered by account, status (as agents see
// it), window and rail, newest first, paged by their own seq.
contract!(rail_records_list_as_payments_filtered_and_paged, |store, label| async move {
    let mpesa = |to: &str, key: &str| RailPayment {
        rail: "mpesa".into(),
        from_account: acct("mpesa-254712345678"),
        to_account: acct(to),
        ..rail(&PaymentId::generate(), key, 100)
    };
    let open = |rec: RailPayment, at: i64| {
        let store = store.clone();
        async move { store.rail_open(rec, Guards::default(), None, at).await.unwrap().rec.id }
    };
    let a = open(mpesa("mpesa-collections", "a"), 10).await;
    let b = open(mpesa("mpesa-collections", "b"), 20).await;
    store
        .rail_transition(
            RailMove { id: &b, from: &[RailState::Submitting], to: RailState::Failed, update: RailUpdate::default() },
            21,
        )
        .await
        .unwrap();
    let c = open(rail(&PaymentId::generate(), "c", 100), 30).await; // an external ledger's own record
    open(mpesa("elsewhere", "d"), 40).await;
    let e = open(mpesa("mpesa-collections", "e"), 50).await;
    let q = |status, from, to, before_seq, limit| PaymentQuery {
        accounts: vec![acct("mpesa-collections")],
        status,
        before_seq,
        limit,
        from,
        to,
        principal_user: None,
    };
    let ids = |rows: Vec<(i64, RailPayment)>| rows.into_iter().map(|(_, r)| r.id).collect::<Vec<_>>();
    let all = store.rail_payments(q(None, None, None, None, 10), "http").await.unwrap();
    assert!(all.windows(2).all(|w| w[0].0 > w[1].0), "{label}: newest first by seq");
    assert_eq!(ids(all.clone()), vec![e.clone(), b.clone(), a.clone()], "{label}");
    let failed = store.rail_payments(q(Some(PaymentStatus::Failed), None, None, None, 10), "http").await.unwrap();
    assert_eq!(ids(failed), vec![b.clone()], "{label}");
    let pending = store.rail_payments(q(Some(PaymentStatus::Pending), None, None, None, 10), "http").await.unwrap();
    assert_eq!(ids(pending), vec![e.clone(), a.clone()], "{label}: unsettled states read as pending");
    let window = store.rail_payments(q(None, Some(20), Some(50), None, 10), "http").await.unwrap();
    assert_eq!(ids(window), vec![b.clone()], "{label}: from inclusive, to exclusive");
    let after_e = store.rail_payments(q(None, None, None, Some(all[0].0), 1), "http").await.unwrap();
    assert_eq!(ids(after_e), vec![b.clone()], "{label}: paged by seq");
    // The except rail's records are left out (an external ledger lists its own payments).
    let b_side = || PaymentQuery { accounts: vec![acct("acct-B")], limit: 10, ..Default::default() };
    assert_eq!(ids(store.rail_payments(b_side(), "mpesa").await.unwrap()), vec![c], "{label}");
    assert!(store.rail_payments(b_side(), "http").await.unwrap().is_empty(), "{label}");
    let nobody = PaymentQuery { limit: 10, ..Default::default() };
    assert!(store.rail_payments(nobody, "http").await.unwrap().is_empty(), "{label}: no account, nothing");
});

// The ledger's payment listing takes the same window: from inclusive, to exclusive.
contract!(ledger_payments_list_within_a_window, |store, label| async move {
    with_accounts(&store, 10_000).await;
    let mut made = Vec::new();
    for (n, at) in [10, 20, 30].into_iter().enumerate() {
        made.push(store.ledger_transfer(transfer(&format!("w{n}"), 100, Guards::default()), at).await.unwrap().id);
    }
    let list = |from, to| {
        let store = store.clone();
        async move {
            let q = PaymentQuery { accounts: vec![acct("acct-B")], limit: 10, from, to, ..Default::default() };
            store.ledger_list_payments(q).await.unwrap().items.into_iter().map(|p| p.id).collect::<Vec<_>>()
        }
    };
    assert_eq!(list(None, None).await, vec![made[2].clone(), made[1].clone(), made[0].clone()], "{label}");
    assert_eq!(list(Some(20), Some(30)).await, vec![made[1].clone()], "{label}");
    assert_eq!(list(Some(20), None).await, vec![made[2].clone(), made[1].clone()], "{label}");
    assert_eq!(list(None, Some(20)).await, vec![made[0].clone()], "{label}");
});

contract!(a_quota_bucket_is_taken_atomically_and_tells_the_wait, |store, label| async move {
    // A bucket of three one-second tokens.
    let take = |now_us, cost_us| QuotaTake { now_us, cost_us, burst_us: 3_000_000 };
    for n in 0..3 {
        assert_eq!(store.quota_take("k", take(10_000_000, 1_000_000)).await.unwrap(), None, "{label}: take {n}");
    }
    assert_eq!(store.quota_take("k", take(10_000_000, 1_000_000)).await.unwrap(), Some(1_000_000), "{label}");
    assert_eq!(store.quota_take("other", take(10_000_000, 1_000_000)).await.unwrap(), None, "keys are independent");
    // A second and a half later one token is back, and half of the next.
    assert_eq!(store.quota_take("k", take(11_500_000, 1_000_000)).await.unwrap(), None, "{label}");
    assert_eq!(store.quota_take("k", take(11_500_000, 1_000_000)).await.unwrap(), Some(500_000), "{label}");
    assert!(store.quota_take("new", take(10_000_000, 4_000_000)).await.unwrap().is_some(), "more than the bucket");
    assert_eq!(store.quota_forget_full(12_000_000).await.unwrap(), 1, "{label}: only the full bucket is forgotten");
    assert_eq!(store.quota_forget_full(100_000_000).await.unwrap(), 1, "{label}");
    assert_eq!(store.quota_take("k", take(100_000_000, 3_000_000)).await.unwrap(), None, "{label}: full again");
});

contract!(a_job_lease_has_one_holder_until_it_ends, |store, label| async move {
    assert!(store.job_lease("reconcile", "replica-a", 100, 60).await.unwrap());
    assert!(!store.job_lease("reconcile", "replica-b", 120, 60).await.unwrap(), "{label}");
    assert!(store.job_lease("reconcile", "replica-a", 130, 60).await.unwrap(), "the holder renews");
    assert!(store.job_lease("purge", "replica-b", 130, 60).await.unwrap(), "kinds are independent");
    assert!(store.job_lease("reconcile", "replica-b", 190, 60).await.unwrap(), "taken over after it ends");
    // Approvals past expiry are marked expired by the job.
    let id = ApprovalId::generate();
    store.approval_insert(approval(&id, MandateKind::Closed, 1, 150)).await.unwrap();
    assert_eq!(store.approvals_expire(149).await.unwrap(), 0);
    assert_eq!(store.approvals_expire(150).await.unwrap(), 1);
    assert_eq!(store.approval_get(&id).await.unwrap().unwrap().status.as_str(), "expired");
});

contract!(an_appended_record_is_read_back_by_its_seq_with_its_tag_until_and_after_sealing, |store, label| async move {
    let key = paygate::domain::audit_chain::LinkKey::new([7; 32]);
    let record = |at: i64| {
        let r = AuditRecord {
            repeats: 1,
            tag: None,
            policy_version: None,
            intent: None,
            seq: 0,
            at,
            correlation_id: format!("corr-{at}"),
            principal_iss: "iss".into(),
            principal_sub: "agent".into(),
            principal_user: None,
            tool: "get_balance".into(),
            decision: "denied".into(),
            code: Some("ACCOUNT_NOT_ALLOWED".into()),
            idempotency_key: None,
            payment_id: None,
            approval_id: None,
            detail: None,
        };
        paygate::domain::audit_chain::tagged(&key, r, [at as u8; 8])
    };
    let (a, b) = (record(10), record(11));
    let sa = store.audit_append(a.clone()).await.unwrap();
    let sb = store.audit_append_notify(b.clone(), Vec::new()).await.unwrap();
    assert!(sb > sa, "{label}: each append answers its own seq");
    let mut read = store.audit_witness_read(&[sa, sb, sb + 1000]).await.unwrap();
    read.sort();
    assert_eq!(read, vec![(sa, a.tag.clone(), false), (sb, b.tag.clone(), false)], "{label}");
    for _ in 0..500 {
        store.audit_seal(&key, 100).await.unwrap();
        if store.audit_unsealed().await.unwrap().count == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    let mut read = store.audit_witness_read(&[sa, sb]).await.unwrap();
    read.sort();
    assert_eq!(read, vec![(sa, a.tag.clone(), true), (sb, b.tag.clone(), true)], "{label}: sealed");
    let listed = store.audit_list(None, 10).await.unwrap();
    assert!(listed.iter().all(|r| paygate::domain::audit_chain::tag_fault(&key, r, true).is_none()), "{label}");
    assert!(store.audit_witness_read(&[]).await.unwrap().is_empty());
});

contract!(audit_past_retention_is_archived_to_a_file_first_then_deleted, |store, label| async move {
    let record = |at: i64, detail: &str| AuditRecord {
        repeats: 1,
        tag: None,
        policy_version: None,
        intent: None,
        seq: 0,
        at,
        correlation_id: format!("corr-{at}"),
        principal_iss: "iss".into(),
        principal_sub: "agent".into(),
        principal_user: None,
        tool: "create_payment".into(),
        decision: "allowed".into(),
        code: None,
        idempotency_key: Some(format!("k{at}")),
        payment_id: None,
        approval_id: None,
        detail: Some(detail.into()),
    };
    for at in 10..15 {
        // Agent-written text survives the round trip byte for byte.
        // Tagged as the gateway tags every record (the sealer never seals an untagged one).
        let rec = paygate::domain::audit_chain::tagged(
            &paygate::domain::audit_chain::LinkKey::new([7; 32]),
            record(at, &format!("memo \"{at}\"\n\u{202e}line")),
            (at as u64).to_be_bytes(),
        );
        store.audit_append(rec).await.unwrap();
    }
    let before: Vec<AuditRecord> = store.audit_list(None, 100).await.unwrap().into_iter().rev().collect();
    let dir = tempfile::tempdir().unwrap();
    // Retention 100 s at now = 113: the records made before 13 go, in files of at most 2.
    let settings =
        paygate::audit_archive::Settings { retention_secs: 100, dir: dir.path().join("archive"), batch_max: 2 };

    // A directory that cannot be written: an error, and nothing is deleted.
    let blocked = paygate::audit_archive::Settings { dir: dir.path().join("file"), ..settings.clone() };
    std::fs::write(dir.path().join("file"), b"not a directory").unwrap();
    let keys = paygate::mandate::MandateKeys::new(
        paygate::mandate::KeySchedule::new("mk1"),
        &paygate::secret::Secret::new("k".repeat(32)),
    )
    .unwrap();
    let link_key = paygate::domain::audit_chain::LinkKey::new([7; 32]);
    let keys = paygate::audit_chain::Sealer {
        links: &link_key,
        signer: &keys,
        notice: paygate::domain::webhook::Notice::default(),
        keep_every_secs: 0,
        genesis_within_secs: i64::MAX / 2,
    };
    // Sealed first (on PostgreSQL a record is sealed once every older transaction has ended).
    for _ in 0..500 {
        store.audit_seal(&link_key, 100).await.unwrap();
        if store.audit_unsealed().await.unwrap().count == 0 {
            break;
        }
        // Another test's transaction on the cluster is still open: sealing waits for it to end.
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert!(paygate::audit_archive::archive(&*store, &keys, &blocked, 113).await.is_err(), "{label}");
    assert_eq!(store.audit_list(None, 100).await.unwrap().len(), 5, "{label}: nothing deleted");

    let done = paygate::audit_archive::archive(&*store, &keys, &settings, 113).await.unwrap();
    // The range is deleted once all of it is written, and it ends at a signed retention marker.
    assert_eq!(done.iter().map(|b| (b.records, b.deleted)).collect::<Vec<_>>(), vec![(2, 0), (1, 3)], "{label}");
    let checkpoint = store.audit_checkpoints(2, 1).await.unwrap().pop().expect("a checkpoint ends the range");
    assert_eq!(checkpoint.chain_seq, 3, "{label}");
    assert!(keys.signer.verify_checkpoint(&checkpoint.jws).unwrap().retention, "{label}: a retention marker");
    let chained = paygate::audit_chain::read_chained(&done[1].file).unwrap();
    assert_eq!((chained[0].chain_seq, chained[0].hash.as_str()), (3, checkpoint.hash.as_str()), "{label}");
    let mut archived = Vec::new();
    for b in &done {
        archived.extend(paygate::audit_archive::read(&b.file).unwrap());
    }
    assert_eq!(archived, before[..3].to_vec(), "{label}: read back exactly");
    #[cfg(unix)]
    for b in &done {
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(std::fs::metadata(&b.file).unwrap().permissions().mode() & 0o777, 0o600, "{label}: owner only");
    }
    let left = store.audit_list(None, 100).await.unwrap();
    assert_eq!(left.iter().map(|r| r.at).collect::<Vec<_>>(), vec![14, 13], "{label}");
    // Nothing more is due; retention 0 archives nothing.
    assert!(paygate::audit_archive::archive(&*store, &keys, &settings, 113).await.unwrap().is_empty());
    let off = paygate::audit_archive::Settings { retention_secs: 0, ..settings.clone() };
    assert!(paygate::audit_archive::archive(&*store, &keys, &off, 10_000).await.unwrap().is_empty());
    assert_eq!(store.audit_list(None, 100).await.unwrap().len(), 2, "{label}");
});

/// A PostgreSQL store in a schema of its own, for the PostgreSQL-only cases (`None`, said, without
/// PAYGATE_TEST_DATABASE_URL). The schema is dropped when the returned guard is.
async fn postgres_only() -> Option<(PostgresStore, Arc<dyn Store>, Schema)> {
    let Some(Engine::Postgres(url)) = engines().pop() else {
        say("postgres group commit: PAYGATE_TEST_DATABASE_URL is not set; SKIPPED");
        return None;
    };
    let name = format!("t_{}", uuid::Uuid::new_v4().simple());
    let schema = Schema { url: url.clone(), name: name.clone() };
    let pg = PostgresStore::connect(&url, &name).await.unwrap();
    Some((pg.clone(), Arc::new(pg), schema))
}

/// Wait until `n` transfers have reached a lane: with the payers' rows held, they are all queued.
/// (A condition polled, not a race won by sleeping: the test fails if it never holds.)
async fn all_queued(pg: &PostgresStore, n: u64) {
    let since = std::time::Instant::now();
    while pg.batch_stats().submitted.load(std::sync::atomic::Ordering::Relaxed) < n {
        assert!(since.elapsed() < std::time::Duration::from_secs(30), "every transfer reaches a lane");
        tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    }
}

/// A transfer from `from` to `to` under its own claimed key, as `subject`.
fn claimed_between(key: &str, from: &str, to: &str, subject: &str, minor: i64, guards: Guards) -> TransferRequest {
    let mut req = claimed(key, "fp", minor, guards);
    req.from_account = acct(from);
    req.to_account = acct(to);
    req.principal_sub = subject.into();
    req.attempt.claim.as_mut().unwrap().records[0].principal_sub = subject.into();
    req
}

/// PostgreSQL's group commit (`store/postgres/batch.rs`): transfers queued while the payer's row is
/// locked are decided and written as one batch, each on what the ones before it left — the payer's
/// funds, the subject's daily budget — with duplicates of a key and keys already answered in the
/// mix. Exactly the payments the rules allow move, once each; every key keeps its fate; each
/// account's postings chain their balances; and the burst really was grouped.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_group_commit_decides_each_transfer_on_what_the_ones_before_it_left() {
    let Some((pg, store, schema)) = postgres_only().await else { return };
    let (url, name) = (schema.url.clone(), schema.name.clone());
    for (id, opening) in [("acct-A", 2_000), ("acct-B", 0), ("acct-C", 1_000_000), ("acct-D", 0)] {
        let seed = AccountSeed { id: acct(id), currency: kes(), opening_minor: opening, allow_overdraft: false };
        store.ledger_open_account(seed, 0).await.unwrap();
    }
    // A key answered before the burst, under another request's fingerprint.
    assert_eq!(store.idem_reserve(rec("f-done", "other-fp", 10), 10).await.unwrap(), Reservation::Acquired);
    store.idem_complete("f-done", "{\"earlier\":true}").await.unwrap();
    let budget = DailyBudget { kind: PaymentKind::Payment, since: 0, max_minor: 1_000, max_payments: 1_000 };
    let mut burst = Vec::new();
    for n in 0..30 {
        // Funds: acct-A can pay 20 of these 30 (100 each); keys f0..f4 are sent twice.
        burst.push(claimed_between(&format!("f{n}"), "acct-A", "acct-B", "agent", 100, Guards::default()));
        if n < 5 {
            burst.push(claimed_between(&format!("f{n}"), "acct-A", "acct-B", "agent", 100, Guards::default()));
        }
        // Budget: "agent-b" may spend 1,000 today, so 10 of these 30 pass.
        let guards = Guards { budget: Some(budget.clone()), mandate: None, payee: None };
        burst.push(claimed_between(&format!("b{n}"), "acct-C", "acct-D", "agent-b", 100, guards));
    }
    burst.push(claimed_between("f-done", "acct-A", "acct-B", "agent", 100, Guards::default()));
    let expected = burst.len() as u64;

    // Hold both payers' rows from another connection until every transfer is queued in a lane.
    let (locker, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    locker.batch_execute(&format!("SET search_path = {name}; BEGIN")).await.unwrap();
    locker.query("SELECT 1 FROM accounts WHERE id IN ('acct-A', 'acct-C') FOR UPDATE", &[]).await.unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for req in burst {
        let s = store.clone();
        let key = req.attempt.key.clone();
        tasks.spawn(async move { (key, s.ledger_transfer(req, 20).await) });
    }
    let stats = pg.batch_stats();
    all_queued(&pg, expected).await;
    locker.batch_execute("COMMIT").await.unwrap();

    let mut results: std::collections::HashMap<String, Vec<Result<Payment, BackendError>>> = Default::default();
    while let Some(r) = tasks.join_next().await {
        let (key, result) = r.unwrap();
        results.entry(key).or_default().push(result);
    }
    let (mut paid_a, mut short, mut paid_c, mut over) = (0, 0, 0, 0);
    for (key, rs) in &results {
        let paid: Vec<&Payment> = rs.iter().filter_map(|r| r.as_ref().ok()).collect();
        if key == "f-done" {
            assert!(
                matches!(&rs[..], [Err(BackendError::KeyHeld { reservation: Reservation::Completed { fingerprint, .. }, .. })] if fingerprint == "other-fp"),
                "an answered key answers: {rs:?}"
            );
        } else if key.starts_with('f') {
            let refused = rs.iter().filter(|r| matches!(r, Err(BackendError::InsufficientFunds { .. }))).count();
            let held = rs.iter().filter(|r| matches!(r, Err(BackendError::KeyHeld { .. }))).count();
            assert!(paid.len() + refused == 1 && held == rs.len() - 1, "{key}: one answer, the copy held: {rs:?}");
            let (_, outcome) = store.idem_peek(key, 21).await.unwrap().unwrap();
            let outcome = outcome.unwrap();
            match paid.first() {
                Some(p) => {
                    paid_a += 1;
                    assert!(outcome.contains(p.id.as_str()), "{key}: completed with its payment");
                }
                None => {
                    short += 1;
                    assert!(outcome.contains("insufficient funds"), "{key}: the refusal sticks to the key");
                }
            }
        } else {
            match &rs[..] {
                [Ok(_)] => paid_c += 1,
                [Err(BackendError::BudgetExceeded(_))] => {
                    over += 1;
                    assert_eq!(store.idem_peek(key, 21).await.unwrap(), None, "{key}: given back");
                }
                other => panic!("{key}: {other:?}"),
            }
        }
    }
    assert_eq!((paid_a, short), (20, 10), "acct-A pays while its funds last");
    assert_eq!((paid_c, over), (10, 20), "agent-b pays while its day's budget lasts");
    for (id, minor) in [("acct-A", 0), ("acct-B", 2_000), ("acct-C", 999_000), ("acct-D", 1_000)] {
        assert_eq!(balance(&store, id).await, minor, "{id}");
        let page = store.ledger_entries(EntryQuery { account: acct(id), before_seq: None, limit: 100 }).await.unwrap();
        let mut entries = page.items;
        entries.sort_by_key(|e| e.seq);
        let mut running = 0;
        for e in &entries {
            running += e.amount_minor;
            assert_eq!(e.balance_after_minor, running, "{id}: posting {} chains its balance", e.seq);
        }
        assert_eq!(running, minor, "{id}");
    }
    assert_integrity(&store, "postgres").await;
    let grouped = stats.grouped_transfers.load(std::sync::atomic::Ordering::Relaxed);
    assert!(stats.grouped_batches.load(std::sync::atomic::Ordering::Relaxed) >= 1 && grouped >= 2, "grouped");
    assert_eq!(stats.fallbacks.load(std::sync::atomic::Ordering::Relaxed), 0, "no batch rolled back");
}

/// PostgreSQL's group commit: when a batch's transaction fails (here a trigger refuses one payment
/// row, and a key whose record was purged meets its payment's UNIQUE key), nothing of it is kept
/// and each transfer runs again alone — the good ones are paid once, the bad one alone fails and
/// its key is free, the purged key's payment replays.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn postgres_a_failed_batch_runs_each_transfer_again_alone() {
    let Some((pg, store, schema)) = postgres_only().await else { return };
    let (url, name) = (schema.url.clone(), schema.name.clone());
    with_accounts(&store, 1_000_000).await;
    // A payment whose key's record has since expired and been purged: a batch never looks a fresh
    // claim's key up among the payments; the UNIQUE key fails the batch and alone it replays.
    let first = store.ledger_transfer(claimed("purged", "fp", 100, Guards::default()), 10).await.unwrap();
    let (admin, conn) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    admin
        .batch_execute(&format!(
            "SET search_path = {name};
             DELETE FROM idempotency_records WHERE key = 'purged';
             CREATE FUNCTION refuse_boom() RETURNS trigger LANGUAGE plpgsql AS $$
               BEGIN IF NEW.memo = 'boom' THEN RAISE EXCEPTION 'injected fault'; END IF; RETURN NEW; END $$;
             CREATE TRIGGER refuse_boom BEFORE INSERT ON payments FOR EACH ROW EXECUTE FUNCTION refuse_boom();
             BEGIN;
             SELECT 1 FROM accounts WHERE id = 'acct-A' FOR UPDATE;"
        ))
        .await
        .unwrap();
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..20 {
        let mut req = claimed(&format!("g{n}"), "fp", 100, Guards::default());
        if n == 13 {
            req.memo = Some("boom".into());
        }
        let s = store.clone();
        tasks.spawn(async move { (n, s.ledger_transfer(req, 20).await) });
    }
    let s = store.clone();
    tasks.spawn(async move { (99, s.ledger_transfer(claimed("purged", "fp", 100, Guards::default()), 20).await) });
    let stats = pg.batch_stats();
    all_queued(&pg, 22).await;
    admin.batch_execute("COMMIT").await.unwrap();
    while let Some(r) = tasks.join_next().await {
        match r.unwrap() {
            (13, Err(BackendError::Unavailable(why))) => assert!(why.contains("injected fault"), "{why}"),
            (13, other) => panic!("the bad payment fails: {other:?}"),
            (99, Ok(p)) => assert_eq!(p.id, first.id, "the purged key's payment replays"),
            (n, Ok(p)) => assert_eq!(p.amount_minor, 100, "g{n}"),
            (n, Err(e)) => panic!("g{n}: {e}"),
        }
    }
    assert_eq!(balance(&store, "acct-B").await, 20 * 100, "each good transfer once");
    assert_eq!(store.idem_peek("g13", 21).await.unwrap(), None, "the failed transfer's key is free");
    assert!(stats.fallbacks.load(std::sync::atomic::Ordering::Relaxed) >= 1, "a batch rolled back");
    assert_integrity(&store, "postgres").await;
}

// The webhook outbox: an event's messages are written with it only when it takes effect, handed out
// when due, and an attempt moves a message at most once (a replica recording it again changes nothing).
contract!(the_outbox_keeps_messages_with_their_events_and_moves_each_once, |store, label| async move {
    use paygate::domain::webhook::{DeliveryAttempt, Notice, PRINCIPAL_SUSPENDED};
    use paygate::store::AttemptOutcome;
    let notice = Notice { event: PRINCIPAL_SUSPENDED, endpoints: vec!["ops".into(), "audit".into()], at: 50 };
    let msgs = || notice.messages(json!({"subject": "agent"}));
    assert!(store.suspend(suspending(SuspensionScope::Agent, "flood"), 50, msgs()).await.unwrap(), "{label}");
    // Suspended already: nothing took effect, nothing is written.
    assert!(!store.suspend(suspending(SuspensionScope::Agent, "again"), 51, msgs()).await.unwrap(), "{label}");
    let due = store.outbox_due(50, 10).await.unwrap();
    assert_eq!(due.len(), 2, "{label}: one message per endpoint, once");
    assert!(store.outbox_due(49, 10).await.unwrap().is_empty(), "{label}: not due before it was written");
    let attempt = |id: &str, n: i64, status: Option<i64>| DeliveryAttempt {
        message_id: id.to_string(),
        attempt: n,
        at: 60,
        status,
        error: status.filter(|s| *s >= 300).map(|s| format!("answered {s}")),
        duration_ms: 3,
    };
    let (a, b) = (due[0].id.clone(), due[1].id.clone());
    store.outbox_attempted(attempt(&a, 1, Some(200)), AttemptOutcome::Delivered).await.unwrap();
    // The same attempt recorded again (a replica whose lease ended mid-send): no second move.
    store.outbox_attempted(attempt(&a, 1, Some(200)), AttemptOutcome::Delivered).await.unwrap();
    store.outbox_attempted(attempt(&b, 1, Some(503)), AttemptOutcome::RetryAt(120)).await.unwrap();
    let due = store.outbox_due(100, 10).await.unwrap();
    assert!(due.is_empty(), "{label}: delivered is never due, a retry not before its time: {due:?}");
    let due = store.outbox_due(120, 10).await.unwrap();
    assert_eq!((due.len(), due[0].attempts, due[0].last_status), (1, 1, Some(503)), "{label}");
    store.outbox_attempted(attempt(&b, 2, None), AttemptOutcome::GiveUp).await.unwrap();
    assert!(store.outbox_due(10_000, 10).await.unwrap().is_empty(), "{label}");
    let failed = store.outbox_list(Some("failed"), 10).await.unwrap();
    assert_eq!(failed.iter().map(|m| m.id.clone()).collect::<Vec<_>>(), vec![b.clone()], "{label}");
    let delivered = store.outbox_list(Some("delivered"), 10).await.unwrap();
    assert_eq!((delivered.len(), delivered[0].attempts, delivered[0].delivered_at), (1, 1, Some(60)), "{label}");
    let tries = store.outbox_attempts(&b).await.unwrap();
    assert_eq!(tries.iter().map(|t| t.attempt).collect::<Vec<_>>(), vec![1, 2], "{label}");
    assert_eq!(store.outbox_attempts(&a).await.unwrap().len(), 1, "{label}: recorded once");
});

// A payee's row and its daily cap's usage, read the same on both engines (one statement each,
// `store::queries`): nothing known and nothing paid, then known, then what a capped payment wrote.
contract!(payee_state_reads_the_row_and_the_days_usage, |store, label| async move {
    use paygate::domain::payee::{PayeeCap, PayeeRecord};
    with_accounts(&store, 10_000).await;
    let today = Some((0, kes()));
    assert_eq!(store.payee_state("agent", "acct-B", today).await.unwrap(), (None, 0), "{label}");
    let known = PayeeRecord {
        owner: "agent".into(),
        payee: "acct-B".into(),
        known_since: 5,
        added_by: "iss alice".into(),
        approval_id: None,
        revoked_at: None,
        revoked_by: None,
        // The gateway's tag, stored and read back as given.
        tag: Some("0011223344556677.tag".into()),
    };
    assert!(store.payee_add(known.clone(), vec![]).await.unwrap(), "{label}");
    let cap =
        PayeeCap { owner: "agent".into(), payee: "acct-B".into(), since: 0, max_minor: Some(10_000), cooling: None };
    let guards = Guards { budget: None, mandate: None, payee: Some(cap) };
    store.ledger_transfer(claimed("capped", "fp", 250, guards), 10).await.unwrap();
    let (rec, paid) = store.payee_state("agent", "acct-B", today).await.unwrap();
    assert_eq!((rec, paid), (Some(known.clone()), 250), "{label}");
    assert_eq!(store.payee_state("agent", "acct-B", None).await.unwrap(), (Some(known), 0), "{label}: not asked");
    let usd = Currency::parse("USD").unwrap();
    assert_eq!(store.payee_state("agent", "acct-B", Some((0, usd))).await.unwrap().1, 0, "{label}: another currency");
});

// Issue 52 item 7: a settled payment teaches its payee only while its mandate is not revoked, and
// revoking the mandate forgets the payee it taught — in the same transaction, on both engines.
contract!(a_payee_is_learned_only_under_a_live_mandate_and_forgotten_with_it, |store, label| async move {
    use paygate::domain::payee::PayeeRecord;
    let rec = |approval: &ApprovalId| PayeeRecord {
        owner: "agent".into(),
        payee: "acct-B".into(),
        known_since: 7,
        added_by: "ops alice".into(),
        approval_id: Some(approval.to_string()),
        revoked_at: None,
        revoked_by: None,
        tag: None,
    };
    // A mandate revoked before its payment settled teaches nothing.
    let revoked = ApprovalId::generate();
    store.approval_insert(approval(&revoked, MandateKind::Closed, 1, 1_000)).await.unwrap();
    let a = store.approval_review(reviewed(&revoked, "alice", "approve", 1, issuer(1, None))).await.unwrap().approval;
    assert!(store.mandate_revoke(&revoked, "bob", 2, None).await.unwrap().is_some(), "{label}");
    let m = a.mandate_id.unwrap();
    assert!(!store.payee_learn(rec(&revoked), &m, vec![]).await.unwrap(), "{label}: a revoked mandate taught");
    assert!(!store.payee_learn(rec(&revoked), "mdt_nosuchmandate", vec![]).await.unwrap(), "{label}: no mandate");
    assert_eq!(store.payee_state("agent", "acct-B", None).await.unwrap(), (None, 0), "{label}");
    // A live one teaches; revoking it afterwards forgets the payee (and no other owner's).
    let live = ApprovalId::generate();
    store.approval_insert(approval(&live, MandateKind::Closed, 1, 1_000)).await.unwrap();
    let a = store.approval_review(reviewed(&live, "alice", "approve", 3, issuer(1, None))).await.unwrap().approval;
    assert!(store.payee_learn(rec(&live), &a.mandate_id.unwrap(), vec![]).await.unwrap(), "{label}");
    let other = PayeeRecord { owner: "another".into(), approval_id: None, ..rec(&live) };
    assert!(store.payee_add(other, vec![]).await.unwrap(), "{label}");
    let (row, _) = store.payee_state("agent", "acct-B", None).await.unwrap();
    assert_eq!(row.and_then(|r| r.known_since()), Some(7), "{label}");
    assert!(store.mandate_revoke(&live, "bob", 9, None).await.unwrap().is_some(), "{label}");
    let (row, _) = store.payee_state("agent", "acct-B", None).await.unwrap();
    let row = row.unwrap();
    assert_eq!((row.revoked_at, row.revoked_by.as_deref()), (Some(9), Some("bob")), "{label}: forgotten");
    let (other, _) = store.payee_state("another", "acct-B", None).await.unwrap();
    assert_eq!(other.and_then(|r| r.known_since()), Some(7), "{label}: an operator's entry stays");
});

// Issue 52 item 12: the cooling-off total is drawn where the payment commits, kept per the time
// the payee became known, and read back by `payee_cooling_paid`, on both engines.
contract!(the_cooling_off_total_is_drawn_where_the_payment_commits, |store, label| async move {
    use paygate::domain::payee::{CoolingCap, PayeeCap};
    with_accounts(&store, 10_000).await;
    let cap = PayeeCap {
        owner: "agent".into(),
        payee: "acct-B".into(),
        since: 0,
        max_minor: None,
        cooling: Some(CoolingCap { known_since: 5, max_minor: 250 }),
    };
    let guards = || Guards { budget: None, mandate: None, payee: Some(cap.clone()) };
    store.ledger_transfer(claimed("c1", "fp", 200, guards()), 10).await.unwrap();
    let over = store.ledger_transfer(claimed("c2", "fp", 51, guards()), 11).await;
    assert!(matches!(over, Err(BackendError::BudgetExceeded(_))), "{label}: {over:?}");
    store.ledger_transfer(claimed("c3", "fp", 50, guards()), 12).await.unwrap();
    assert_eq!(store.payee_cooling_paid("agent", "acct-B", 5, kes()).await.unwrap(), 250, "{label}");
    // Known again later: a new period, nothing paid in it yet.
    assert_eq!(store.payee_cooling_paid("agent", "acct-B", 6, kes()).await.unwrap(), 0, "{label}");
    assert_eq!(balance(&store, "acct-B").await, 250, "{label}");
});

// Issue 52 item 7, raced: a settled payment's learning and its mandate's revoke at the same time.
// Whichever commits first, the payee ends unknown (the learning sees the revoke, or the revoke
// forgets what was learned) — on both engines.
contract!(a_revoke_racing_a_learning_always_leaves_the_payee_unknown, |store, label| async move {
    use paygate::domain::payee::PayeeRecord;
    for n in 0..20 {
        let id = ApprovalId::generate();
        store.approval_insert(approval(&id, MandateKind::Closed, 1, 1_000)).await.unwrap();
        let a = store.approval_review(reviewed(&id, "alice", "approve", 1, issuer(1, None))).await.unwrap().approval;
        let payee = format!("acct-race-{n}");
        let rec = PayeeRecord {
            owner: "agent".into(),
            payee: payee.clone(),
            known_since: 7,
            added_by: "ops alice".into(),
            approval_id: Some(id.to_string()),
            revoked_at: None,
            revoked_by: None,
            tag: None,
        };
        let mandate = a.mandate_id.unwrap();
        let (s1, s2, id2) = (store.clone(), store.clone(), id.clone());
        let learn = tokio::spawn(async move { s1.payee_learn(rec, &mandate, vec![]).await.unwrap() });
        let revoke = tokio::spawn(async move { s2.mandate_revoke(&id2, "bob", 8, None).await.unwrap() });
        let (_, revoked) = (learn.await.unwrap(), revoke.await.unwrap());
        assert!(revoked.is_some(), "{label}");
        let (row, _) = store.payee_state("agent", &payee, None).await.unwrap();
        assert_eq!(row.and_then(|r| r.known_since()), None, "{label}: round {n} left the payee known");
    }
});

// A posting's "allowed" record is stored as the gateway tagged it, naming the payment its attempt
// drew an id for — also when the key already posted and the ledger replays the earlier payment
// (that payment keeps its own record): the store never rewrites a tagged record's payment id.
contract!(a_postings_record_is_stored_as_tagged_replay_included, |store, label| async move {
    with_accounts(&store, 10_000).await;
    let key = paygate::domain::audit_chain::LinkKey::new([7; 32]);
    let attempt = |nonce: u8| {
        let mut req = transfer("k-tagged", 100, Guards::default());
        req.payment_id = req.attempt.payment_id.clone();
        let r = AuditRecord {
            repeats: 1,
            tag: None,
            policy_version: None,
            intent: None,
            seq: 0,
            at: 10,
            correlation_id: format!("corr-{nonce}"),
            principal_iss: "iss".into(),
            principal_sub: "agent".into(),
            principal_user: None,
            tool: "create_payment".into(),
            decision: "allowed".into(),
            code: None,
            idempotency_key: Some("k-tagged".into()),
            payment_id: Some(req.payment_id.to_string()),
            approval_id: None,
            detail: None,
        };
        req.attempt.audit = Some(paygate::domain::audit_chain::tagged(&key, r, [nonce; 8]));
        req
    };
    let (first, second) = (attempt(1), attempt(2));
    let (drew_first, drew_second) = (first.payment_id.to_string(), second.payment_id.to_string());
    let paid = store.ledger_transfer(first, 10).await.unwrap();
    let again = store.ledger_transfer(second, 11).await.unwrap();
    assert_eq!((paid.id.as_str(), again.id.as_str()), (drew_first.as_str(), drew_first.as_str()), "{label}: replayed");
    let mut records = store.audit_list(None, 10).await.unwrap();
    records.reverse();
    let named: Vec<Option<&str>> = records.iter().map(|r| r.payment_id.as_deref()).collect();
    assert_eq!(named, [Some(drew_first.as_str()), Some(drew_second.as_str())], "{label}");
    for r in &records {
        assert_eq!(paygate::domain::audit_chain::tag_fault(&key, r, true), None, "{label}: {r:?}");
    }
    assert_eq!(balance(&store, "acct-B").await, 100, "{label}: paid once");
});

/// The seventh hostile review: a refunded payment's `refunded_minor` set back to 0 by a database
/// writer let a second refund of the same money through. A refund's posting sums the refunds the
/// original already has from their own rows: the second refund is refused and nothing moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_refunded_column_reset_in_the_database_never_refunds_twice() {
    for engine in engines() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("paygate.sqlite3");
        let (store, schema, label): (Arc<dyn Store>, Option<Schema>, &str) = match &engine {
            Engine::Sqlite => (Arc::new(SqliteStore::open(&path).unwrap()), None, "sqlite"),
            Engine::Postgres(_) => open(&engine).await,
        };
        with_accounts(&store, 10_000).await;
        let p = store.ledger_transfer(transfer("pay", 10_000, Guards::default()), 0).await.unwrap();
        let refund = |key: &str| RefundRequest {
            attempt: Attempt::reserved(key),
            refund_id: PaymentId::generate(),
            payment_id: p.id.clone(),
            amount_minor: None,
            reason: None,
            principal_sub: "agent".into(),
            principal_user: None,
            guards: Guards::default(),
            autonomous_cap_minor: None,
        };
        assert_eq!(store.ledger_refund(refund("r1"), 1).await.unwrap().amount_minor, 10_000, "{label}");
        let reset = format!("UPDATE payments SET refunded_minor = 0 WHERE id = '{}'", p.id);
        match &schema {
            None => rusqlite::Connection::open(&path).unwrap().execute_batch(&reset).unwrap(),
            Some(s) => {
                let (admin, conn) = tokio_postgres::connect(&s.url, tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(conn);
                admin.batch_execute(&format!("SET search_path = {}; {reset}", s.name)).await.unwrap();
            }
        }
        assert_eq!(store.ledger_payment(&p.id).await.unwrap().unwrap().refunded_minor, 0, "{label}: reset");
        let again = store.ledger_refund(refund("r2"), 2).await;
        assert!(matches!(again, Err(BackendError::NotRefundable(_))), "{label}: {again:?}");
        assert_eq!(balance(&store, "acct-A").await, 10_000, "{label}: refunded once");
        assert_eq!(balance(&store, "acct-B").await, 0, "{label}: refunded once");
    }
}

#[path = "common/say.rs"]
mod say;
use say::say;
