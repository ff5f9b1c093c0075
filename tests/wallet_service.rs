//! The gateway with `backend.kind = "wallet-service"` against a faithful fake of the payments
//! wallet service (tests/common/wallet.rs), behind the fault proxy the HTTP ledger's tests use:
//! the whole flow over MCP, the saga's pending answers settled by the poll job, a response lost
//! after the service committed, a 409 while the key is in progress, the three 422s (and one the
//! service never writes), 64 identical calls at once, and a SIGKILL between the service's commit
//! and the gateway's bookkeeping.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;
#[path = "common/fault_proxy.rs"]
mod fault_proxy;
#[path = "common/wallet.rs"]
mod wallet;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use fault_proxy::{FaultProxy, Mode};
use paygate::backend::PaymentBackend;
use paygate::backend::wallet::{WalletAccount, WalletConfig, WalletService};
use paygate::clock::{Clock, ManualClock, SystemClock};
use paygate::domain::error::BackendError;
use paygate::domain::ids::{AccountId, PaymentId};
use paygate::domain::money::{Currency, Money};
use paygate::domain::payment::{Attempt, Guards, PaymentStatus, RefundRequest, TransferRequest};
use paygate::domain::rail::{RailFlow, RailPayment};
use serde_json::{Value, json};
use wallet::{Saga, WalletFake};

struct Rig {
    app: TestApp,
    fake: WalletFake,
    proxy: FaultProxy,
    clock: ManualClock,
    client: Client,
    _dir: tempfile::TempDir,
}

fn wallet_env(url: &str) -> Vec<(&'static str, String)> {
    vec![
        ("PAYGATE_BACKEND__KIND", "wallet-service".into()),
        ("PAYGATE_BACKEND__HTTP_URL", url.into()),
        ("PAYGATE_BACKEND__WALLET_MERCHANT_ID", wallet::MERCHANT.into()),
        ("PAYGATE_BACKEND__WALLET_ACCOUNTS", wallet::accounts_toml()),
        ("PAYGATE_BACKEND__HTTP_REQUEST_TIMEOUT_MS", "1000".into()),
        ("PAYGATE_BACKEND__HTTP_RETRIES_MAX", "0".into()),
    ]
}

/// The gateway on a manual clock, jobs off, calls waiting `wait_ms` for a key in flight.
async fn rig(wait_ms: u64) -> Rig {
    let clock = ManualClock::new(SystemClock.now());
    let fake = WalletFake::start().await;
    let proxy = FaultProxy::start(fake.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let mut env = wallet_env(&proxy.url());
    env.push(("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", wait_ms.to_string()));
    env.push(("PAYGATE_JOBS__ENABLED", "false".into()));
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let app = spawn_with_clock(dir.path(), &env, Arc::new(clock.clone())).await;
    let client = connect(&app.url, &app.dev_token(), Era::Modern).await;
    Rig { app, fake, proxy, clock, client, _dir: dir }
}

fn pay(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"})
}

fn payment_posts(proxy: &FaultProxy) -> Vec<fault_proxy::Seen> {
    proxy.seen().into_iter().filter(|s| s.method == "POST" && s.path == "/v1/payments").collect()
}

#[tokio::test]
async fn the_whole_flow_works_against_the_wallet_service() {
    let r = rig(0).await;
    let c = &r.client;
    let paid = call(c, "create_payment", pay("w-1", "12.50")).await;
    let p = ok(&paid).clone();
    assert_eq!((p["status"].as_str(), p["amount"].as_str()), (Some("succeeded"), Some("12.50")), "{p}");
    // The service holds one payment, in minor units, between the mapped UUIDs, under our merchant.
    let held = r.fake.payments();
    assert_eq!(held.len(), 1);
    let h = &held[0];
    assert_eq!((h.amount, h.status.as_str(), h.merchant.as_str()), (1250, "SUCCEEDED", wallet::MERCHANT));
    assert_eq!((h.payer.as_str(), h.payee.as_str()), (wallet::uuid_of("acct-A"), wallet::uuid_of("acct-B")));
    // The agent reads the service's ledger: balances and the payment.
    assert_eq!(balance(c, "acct-B").await, "12.50");
    assert_eq!(r.fake.balance("acct-B"), 1250);
    let id = p["payment_id"].as_str().unwrap().to_string();
    let got = call(c, "get_payment", json!({"payment_id": id})).await;
    assert_eq!(ok(&got)["status"], "succeeded", "{got:?}");
    // A replay answers the same payment and sends nothing.
    let again = call(c, "create_payment", pay("w-1", "12.50")).await;
    assert_eq!((ok(&again)["payment_id"].as_str(), ok(&again)["replayed"].as_bool()), (Some(id.as_str()), Some(true)));
    // The same operation_id with another amount is a conflict, and sends nothing.
    assert_eq!(code(&call(c, "create_payment", pay("w-1", "13.00")).await), "IDEMPOTENCY_CONFLICT");
    assert_eq!(payment_posts(&r.proxy).len(), 1);
    // A refund goes to the service's refund endpoint under its own key.
    let refund = call(c, "refund_payment", json!({"operation_id": "w-r1", "payment_id": id, "amount": "2.50"})).await;
    assert_eq!(ok(&refund)["status"], "succeeded", "{refund:?}");
    assert_eq!((r.fake.refunds(), r.fake.balance("acct-B")), (1, 1000));
    assert_eq!(r.fake.payments()[0].status, "PARTIALLY_REFUNDED");
    // A refund of "everything left" (no amount) is sent with the amount the gateway fixed when it
    // opened it: the service's refund endpoint takes nothing else.
    let rest = call(c, "refund_payment", json!({"operation_id": "w-r2", "payment_id": id})).await;
    assert_eq!(
        (ok(&rest)["status"].as_str(), ok(&rest)["amount"].as_str()),
        (Some("succeeded"), Some("10.00")),
        "{rest:?}"
    );
    assert_eq!((r.fake.refunds(), r.fake.balance("acct-B")), (2, 0));
    assert_eq!(r.fake.payments()[0].status, "REFUNDED");
    // The service lists nothing: the listing is the gateway's record of what it made there.
    let listed = call(c, "list_payments", json!({"account_id": "acct-B", "limit": 10})).await;
    let listed: Vec<&str> =
        ok(&listed)["payments"].as_array().unwrap().iter().map(|p| p["payment_id"].as_str().unwrap()).collect();
    assert_eq!(listed.len(), 3, "the payment and its refunds: {listed:?}");
    assert!(listed.contains(&id.as_str()));
    // Reconciliation finds the two sides agree.
    let admin = connect(&r.app.url, &r.app.token("ops-bot", "payments:integrity"), Era::Modern).await;
    let rec = ok(&call(&admin, "reconcile", json!({})).await).clone();
    assert_eq!((rec["problems"].as_i64(), rec["findings"].as_array().map(Vec::len)), (Some(0), Some(0)), "{rec}");
    // Integrity is the service's reconciliation report.
    let integrity = call(c, "check_ledger_integrity", json!({})).await;
    assert_eq!(ok(&integrity)["ok"], true, "{integrity:?}");
    r.fake.corrupt("acct-Z", 1);
    let integrity = call(c, "check_ledger_integrity", json!({})).await;
    assert_eq!(ok(&integrity)["ok"], false, "{integrity:?}");
    r.app.stop().await;
}

/// The saga answers `PROCESSING` (funds held, the provider not done): the agent sees `pending`; the
/// poll job asks `GET /v1/payments/{id}` and settles the payment once the service finishes it,
/// without a second POST. A replay then shows where it stands.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_processing_payment_is_pending_until_the_poll_job_settles_it() {
    let fake = WalletFake::start().await;
    let dir = tempfile::tempdir().unwrap();
    let mut env = wallet_env(&fake.url());
    env.extend([
        ("PAYGATE_JOBS__TICK_MS", "50".to_string()),
        ("PAYGATE_JOBS__MPESA_POLL_EVERY_SECS", "1".to_string()),
        ("PAYGATE_JOBS__LEASE_SECS", "1".to_string()),
        ("PAYGATE_MPESA__QUERY_AFTER_SECS", "1".to_string()),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let app = spawn_on(dir.path(), &env).await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;

    fake.set_saga(Saga::Processing);
    let first = call(&c, "create_payment", pay("slow-1", "30.00")).await;
    assert_eq!(ok(&first)["status"], "pending", "{first:?}");
    let id = ok(&first)["payment_id"].as_str().unwrap().to_string();
    let held = fake.payments();
    assert_eq!((held.len(), held[0].status.as_str()), (1, "PROCESSING"));
    assert_eq!(balance(&c, "acct-B").await, "0.00", "nothing reached the payee yet");

    // Still processing: the poll job asks and leaves it pending.
    let still = call(&c, "get_payment", json!({"payment_id": id})).await;
    assert_eq!(ok(&still)["status"], "pending");

    fake.finish(&held[0].id, true);
    let mut status = String::new();
    for _ in 0..100 {
        let r = call(&c, "create_payment", pay("slow-1", "30.00")).await;
        status = ok(&r)["status"].as_str().unwrap().to_string();
        if status == "succeeded" {
            assert_eq!(ok(&r)["payment_id"].as_str(), Some(id.as_str()));
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "succeeded", "the poll job settled the payment");
    assert_eq!(fake.payment_posts(), 1, "settled by GET, never by a second POST");
    assert_eq!(balance(&c, "acct-B").await, "30.00");

    // A payment the provider declines later fails, and nothing moved.
    let second = call(&c, "create_payment", pay("slow-2", "5.00")).await;
    assert_eq!(ok(&second)["status"], "pending");
    let sid = ok(&second)["payment_id"].as_str().unwrap().to_string();
    fake.finish(&fake.payments()[1].id, false);
    let mut status = String::new();
    for _ in 0..100 {
        let r = call(&c, "get_payment", json!({"payment_id": sid})).await;
        status = ok(&r)["status"].as_str().unwrap().to_string();
        if status != "pending" {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(status, "failed");
    assert_eq!((fake.balance("acct-A"), fake.balance("acct-B")), (100_000_000 - 3_000, 3_000));
    // The read said the service's word; the poll job writes it to the gateway's record, with the
    // trail saying so in the same transaction (what the budget and reconciliation read).
    let rec_id = paygate::domain::ids::PaymentId::parse(&sid).unwrap();
    let store = &app.running.store;
    let mut state = None;
    for _ in 0..100 {
        state = store.rail_get(&rec_id).await.unwrap().map(|r| r.state);
        if state == Some(paygate::domain::rail::RailState::Failed) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(state, Some(paygate::domain::rail::RailState::Failed));
    let trail = store.audit_list(None, 10_000).await.unwrap();
    assert!(
        trail.iter().any(|r| r.payment_id.as_deref() == Some(sid.as_str())
            && r.decision == paygate::backend::journal::QUERY_SETTLED
            && r.code.as_deref() == Some("FAILED")),
        "the trail says the service failed it"
    );
    app.stop().await;
}

/// The service committed, and its answer was lost: OUTCOME_UNKNOWN, and after the lease the retry
/// re-sends the same Idempotency-Key: the service replays its payment (one payment).
/// The wallet service lists no payments, so the gateway pages its own records of them. Records of
/// another rail on the same account (an M-Pesa collection into it, say) are skipped, and the
/// listing reads on past a page full of them: every payment is listed once, none is missed, and
/// the call returns.
#[tokio::test]
async fn listing_pages_past_other_rails_records_on_the_same_account() {
    let r = rig(0).await;
    let c = &r.client;
    let mut wallet_ids = Vec::new();
    for i in 0..2 {
        let p = ok(&call(c, "create_payment", pay(&format!("w-list-{i}"), "1.00")).await).clone();
        wallet_ids.push(p["payment_id"].as_str().unwrap().to_string());
    }
    // Three newer records of another rail credit acct-B.
    let now = r.clock.now();
    let mut other_ids = Vec::new();
    for i in 0..3 {
        let id = PaymentId::generate();
        let rec = RailPayment {
            rail: "mpesa".into(),
            flow: RailFlow::Collection,
            created_at: now + 1 + i,
            updated_at: now + 1 + i,
            ..rail_record(&id, &format!("other-rail-{i}"), "mpesa-254700000001", "acct-B", 100)
        };
        r.app.running.store.rail_open(rec, Guards::default(), None, now + 1 + i).await.unwrap();
        other_ids.push(id.to_string());
    }
    // Page through two at a time: the first pages hold the other rail's records, the wallet's
    // payments follow, each once.
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let mut args = json!({"account_id": "acct-B", "limit": 2});
        if let Some(cur) = &cursor {
            args["cursor"] = json!(cur);
        }
        let page = tokio::time::timeout(Duration::from_secs(30), call(c, "list_payments", args))
            .await
            .expect("a listing returns (it does not read the same page forever)");
        let page = ok(&page).clone();
        seen.extend(page["payments"].as_array().unwrap().iter().map(|p| p["payment_id"].as_str().unwrap().to_string()));
        match page["next_cursor"].as_str() {
            Some(next) => cursor = Some(next.to_string()),
            None => break,
        }
    }
    let expected: Vec<String> = other_ids.iter().rev().chain(wallet_ids.iter().rev()).cloned().collect();
    assert_eq!(seen, expected, "newest first, each once");
    r.app.stop().await;
}

#[tokio::test]
async fn a_response_lost_after_the_service_committed_is_replayed_not_repaid() {
    let r = rig(0).await;
    let c = &r.client;
    r.proxy.set_mode(Mode::DropResponseAfterForward).await;
    let lost = call(c, "create_payment", pay("lost-1", "400.00")).await;
    assert_eq!(code(&lost), "OUTCOME_UNKNOWN");
    assert_eq!(r.fake.payments().len(), 1, "the service committed");
    r.proxy.set_mode(Mode::PassThrough).await;
    assert_eq!(code(&call(c, "create_payment", pay("lost-1", "400.00")).await), "OPERATION_IN_PROGRESS");
    r.clock.advance(120);
    let retry = call(c, "create_payment", pay("lost-1", "400.00")).await;
    assert_eq!(ok(&retry)["status"], "succeeded", "{retry:?}");
    assert_eq!(r.fake.payments().len(), 1, "exactly one payment");
    let posts = payment_posts(&r.proxy);
    assert_eq!(posts.len(), 2);
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key, "the same Idempotency-Key");
    assert_eq!(posts[0].body, posts[1].body, "the same body");
    assert_eq!(balance(c, "acct-B").await, "400.00");
    assert_eq!(ok(&call(c, "create_payment", pay("lost-1", "400.00")).await)["replayed"], true);
    r.app.stop().await;
}

/// The service is still running the first request under the key (409): the retry is told the
/// outcome is unknown, never that it failed; once the service finishes, the retry gets the payment.
#[tokio::test]
async fn a_409_while_the_service_is_in_progress_is_unknown_and_the_retry_gets_the_payment() {
    let r = rig(0).await;
    let c = &r.client;
    r.fake.set_saga(Saga::Stall);
    let first = call(c, "create_payment", pay("stall-1", "8.00")).await;
    assert_eq!(code(&first), "OUTCOME_UNKNOWN", "the client timed out: {first:?}");
    r.clock.advance(120);
    let second = call(c, "create_payment", pay("stall-1", "8.00")).await;
    assert_eq!(code(&second), "OUTCOME_UNKNOWN", "409 in progress: {second:?}");
    assert_eq!(err(&second)["retryable"], true);
    assert_eq!(r.fake.payments().len(), 0, "nothing held yet");
    r.fake.set_saga(Saga::Settle);
    r.fake.release();
    for _ in 0..100 {
        if r.fake.payments().first().is_some_and(|p| p.status == "SUCCEEDED") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    r.clock.advance(120);
    let third = call(c, "create_payment", pay("stall-1", "8.00")).await;
    assert_eq!(ok(&third)["status"], "succeeded", "{third:?}");
    assert_eq!(r.fake.payments().len(), 1);
    let keys: std::collections::BTreeSet<_> =
        payment_posts(&r.proxy).into_iter().map(|s| s.idempotency_key.unwrap()).collect();
    assert_eq!(keys.len(), 1, "every attempt under one Idempotency-Key");
    assert_eq!(balance(c, "acct-B").await, "8.00");
    r.app.stop().await;
}

/// 64 identical calls at once: the service receives one payment request and holds one payment;
/// the other 63 calls wait for it and replay it.
#[tokio::test]
async fn concurrent_duplicates_reach_the_wallet_service_once() {
    let r = rig(10_000).await;
    let agent = Arc::new(connect(&r.app.url, &r.app.dev_token(), Era::Modern).await);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..64 {
        let agent = agent.clone();
        set.spawn(async move { call(&agent, "create_payment", pay("dup-1", "10.00")).await });
    }
    let (mut ids, mut replayed) = (std::collections::BTreeSet::new(), 0);
    while let Some(res) = set.join_next().await {
        let res = res.unwrap();
        ids.insert(ok(&res)["payment_id"].as_str().unwrap().to_string());
        replayed += usize::from(ok(&res)["replayed"] == true);
    }
    assert_eq!((ids.len(), replayed), (1, 63), "one payment, 63 replays");
    assert_eq!(r.fake.payment_posts(), 1, "the service received one payment request");
    assert_eq!(r.fake.payments().len(), 1);
    assert_eq!(r.fake.balance("acct-B"), 1_000);
    r.app.stop().await;
}

/// The gateway process is SIGKILLed after the service committed a payment and before the gateway
/// heard the answer. Restarted on the same data, the same call asks the service again with the
/// same Idempotency-Key and gets the same payment: one payment in the service.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_between_the_services_commit_and_its_bookkeeping_pays_once() {
    let fake = WalletFake::start().await;
    let proxy = FaultProxy::start(fake.addr).await;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display().to_string();
    let mut env = wallet_env(&proxy.url());
    env.extend([
        ("PAYGATE_STORAGE__DATA_DIR", data),
        ("PAYGATE_IDEMPOTENCY__LEASE_SECS", "3".into()),
        ("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "10000".into()),
        ("PAYGATE_JOBS__ENABLED", "false".into()),
    ]);
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let mut first = spawn_binary(&env);
    let client = Arc::new(connect(&first.url, &first.token, Era::Modern).await);
    proxy.set_mode(Mode::HoldResponseAfterForward).await;
    let in_flight = {
        let client = client.clone();
        tokio::spawn(async move {
            let args = pay("killed-1", "70.00").as_object().cloned().unwrap();
            client.call_tool(rmcp::model::CallToolRequestParams::new("create_payment").with_arguments(args)).await
        })
    };
    proxy.wait_forwarded(1).await;
    assert_eq!(fake.payments().len(), 1, "the service committed the payment");
    first.kill();
    assert!(in_flight.await.unwrap().is_err(), "the caller never got an answer from the killed gateway");
    proxy.set_mode(Mode::PassThrough).await;

    let second = spawn_binary(&env);
    let c = connect(&second.url, &second.token, Era::Modern).await;
    let retry = call(&c, "create_payment", pay("killed-1", "70.00")).await;
    assert_eq!(ok(&retry)["status"], "succeeded", "{retry:?}");
    assert_eq!(fake.payments().len(), 1, "one payment in the service");
    let posts = payment_posts(&proxy);
    assert_eq!(posts.len(), 2, "asked twice");
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key, "with the same Idempotency-Key");
    let again = call(&c, "create_payment", pay("killed-1", "70.00")).await;
    assert_eq!(
        (ok(&again)["payment_id"].clone(), ok(&again)["replayed"].clone()),
        (ok(&retry)["payment_id"].clone(), json!(true))
    );
    assert_eq!(balance(&c, "acct-B").await, "70.00");
    assert_eq!(fake.balance("acct-B"), 7_000);
}

// The backend alone, against the fake: every refusal the service writes, mapped.

fn wallet_backend(url: &str) -> WalletService {
    wallet_backend_retrying(url, 0)
}

fn wallet_backend_retrying(url: &str, retries_max: u32) -> WalletService {
    let accounts = wallet::ACCOUNTS
        .iter()
        .map(|(id, uuid, _)| (AccountId::parse(id).unwrap(), WalletAccount::parse(uuid).unwrap()))
        .collect();
    let transport = paygate::backend::http::HttpLedgerConfig {
        base_url: url.into(),
        credential: paygate::secret::Secret::new(String::new()),
        connect_timeout: Duration::from_secs(1),
        request_timeout: Duration::from_millis(500),
        retries_max,
        breaker_failures_max: 100,
        breaker_open: Duration::from_secs(1),
        tls: Default::default(),
    };
    let cfg = WalletConfig { transport, merchant_id: wallet::MERCHANT.into(), accounts };
    WalletService::new(cfg, Arc::new(SystemClock)).unwrap()
}

fn transfer(key: &str, from: &str, to: &str, minor: i64) -> TransferRequest {
    TransferRequest {
        attempt: Attempt::reserved(key.to_string()),
        payment_id: PaymentId::generate(),
        from_account: AccountId::parse(from).unwrap(),
        to_account: AccountId::parse(to).unwrap(),
        amount: Money::from_minor(minor, Currency::parse("KES").unwrap()).unwrap(),
        memo: None,
        principal_sub: "agent-1".into(),
        principal_user: None,
        guards: Guards::default(),
    }
}

fn refund(key: &str, payment: &PaymentId, minor: i64) -> RefundRequest {
    RefundRequest {
        attempt: Attempt::reserved(key.to_string()),
        refund_id: PaymentId::generate(),
        payment_id: payment.clone(),
        amount_minor: Some(minor),
        reason: None,
        principal_sub: "agent-1".into(),
        principal_user: None,
        guards: Guards::default(),
        autonomous_cap_minor: None,
    }
}

#[tokio::test]
async fn every_refusal_the_service_writes_is_typed_and_none_is_success() {
    let fake = WalletFake::start().await;
    let w = wallet_backend(&fake.url());
    // Insufficient funds: acct-Z holds 500.00.
    let e = w.transfer(transfer("k-1", "acct-Z", "acct-B", 60_000)).await.unwrap_err();
    assert_eq!(
        e,
        BackendError::InsufficientFunds {
            account: AccountId::parse("acct-Z").unwrap(),
            balance: "500.00".into(),
            needed: "600.00".into()
        }
    );
    // The key was released: the same key with a payable amount pays.
    let paid = w.transfer(transfer("k-1", "acct-Z", "acct-B", 10_000)).await.unwrap();
    assert_eq!(paid.status, PaymentStatus::Succeeded);
    // The same key, another body: reused.
    let e = w.transfer(transfer("k-1", "acct-Z", "acct-B", 10_001)).await.unwrap_err();
    assert_eq!(e, BackendError::IdempotencyKeyReused);
    // The same key, the same body: the same payment.
    let replay = w.transfer(transfer("k-1", "acct-Z", "acct-B", 10_000)).await.unwrap();
    assert_eq!(replay.id, paid.id);
    assert_eq!(fake.payments().len(), 1);
    // Refunds: more than remains, then a declined payment, which is not refundable.
    let e = w.refund(refund("r-1", &paid.id, 10_001)).await.unwrap_err();
    assert_eq!(e, BackendError::RefundExceedsRemaining { requested: "100.01".into(), remaining: "100.00".into() });
    let r1 = w.refund(refund("r-2", &paid.id, 4_000)).await.unwrap();
    assert_eq!((r1.status, r1.amount_minor), (PaymentStatus::Succeeded, 4_000));
    fake.set_saga(Saga::Decline);
    let declined = w.transfer(transfer("k-2", "acct-A", "acct-B", 500)).await.unwrap();
    assert_eq!(declined.status, PaymentStatus::Failed);
    let e = w.refund(refund("r-3", &declined.id, 100)).await.unwrap_err();
    assert_eq!(e, BackendError::NotRefundable(declined.id.clone()));
    // A 422 the service never writes is never success, and never "nothing moved".
    fake.set_saga(Saga::Unknown422);
    let e = w.transfer(transfer("k-3", "acct-A", "acct-B", 500)).await.unwrap_err();
    assert!(matches!(e, BackendError::OutcomeUnknown(_)), "{e:?}");
    // A 409 (the key in progress there) is unknown too.
    fake.set_saga(Saga::Stall);
    let w = Arc::new(w);
    let before = fake.payment_posts();
    let first = {
        let w = w.clone();
        tokio::spawn(async move { w.transfer(transfer("k-4", "acct-A", "acct-B", 700)).await })
    };
    for _ in 0..500 {
        if fake.payment_posts() > before {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let e = w.transfer(transfer("k-4", "acct-A", "acct-B", 700)).await.unwrap_err();
    assert!(matches!(&e, BackendError::OutcomeUnknown(d) if d.contains("still processing")), "{e:?}");
    fake.release();
    let _ = first.await.unwrap();
    fake.set_saga(Saga::Settle);
    let done = w.transfer(transfer("k-4", "acct-A", "acct-B", 700)).await.unwrap();
    assert_eq!(done.status, PaymentStatus::Succeeded);
    // A processing payment is pending, and reads settle once the service finishes it.
    fake.set_saga(Saga::Processing);
    let slow = w.transfer(transfer("k-5", "acct-A", "acct-B", 900)).await.unwrap();
    assert_eq!(slow.status, PaymentStatus::Pending);
    assert_eq!(w.payment(&slow.id).await.unwrap().unwrap().status, PaymentStatus::Pending);
    let wallet_id = fake.payments().last().unwrap().id.clone();
    fake.finish(&wallet_id, true);
    assert_eq!(w.payment(&slow.id).await.unwrap().unwrap().status, PaymentStatus::Succeeded);
    // An unmapped account never reaches the service.
    let before = fake.payment_posts();
    let e = w.transfer(transfer("k-6", "acct-A", "acct-Q", 100)).await.unwrap_err();
    assert_eq!(e, BackendError::AccountNotFound(AccountId::parse("acct-Q").unwrap()));
    assert_eq!(fake.payment_posts(), before);
    // The report: balanced, then a drift found.
    assert!(w.check_integrity(true).await.unwrap().ok);
    fake.corrupt("acct-B", -1);
    let report = w.check_integrity(true).await.unwrap();
    assert!(!report.ok && !report.problems.is_empty(), "{report:?}");
}

/// The service's saga throws after its hold committed: it releases its key and answers 500. A
/// same-key retry would then hold the payer's money a second time, so the client never retries a
/// 500 (it still retries what certainly was not applied): OUTCOME_UNKNOWN after one POST.
#[tokio::test]
async fn a_500_after_the_hold_is_unknown_and_never_retried() {
    let fake = WalletFake::start().await;
    let w = wallet_backend_retrying(&fake.url(), 2);
    fake.set_saga(Saga::ServerErrorAfterHold);
    let e = w.transfer(transfer("k-500", "acct-A", "acct-B", 1_000)).await.unwrap_err();
    assert!(matches!(e, BackendError::OutcomeUnknown(_)), "{e:?}");
    assert_eq!(fake.payment_posts(), 1, "one POST, no automatic retry");
    let held = fake.payments();
    assert_eq!((held.len(), held[0].status.as_str()), (1, "PROCESSING"), "the hold committed");
    assert_eq!(fake.balance("acct-A"), 100_000_000 - 1_000);
}

/// The same 500 through the gateway: OUTCOME_UNKNOWN, and the agent's retry after the lease sends
/// nothing (the key the service released could pay again): the payment stays unknown, for
/// reconciliation and a person, and the service holds one payment.
#[tokio::test]
async fn the_agents_retry_after_a_500_sends_nothing() {
    let r = rig(0).await;
    let c = &r.client;
    r.fake.set_saga(Saga::ServerErrorAfterHold);
    let first = call(c, "create_payment", pay("boom-1", "9.00")).await;
    assert_eq!(code(&first), "OUTCOME_UNKNOWN", "{first:?}");
    r.fake.set_saga(Saga::Settle);
    r.clock.advance(120);
    let retry = call(c, "create_payment", pay("boom-1", "9.00")).await;
    assert_eq!(code(&retry), "OUTCOME_UNKNOWN", "{retry:?}");
    assert_eq!(payment_posts(&r.proxy).len(), 1, "never sent again");
    assert_eq!(r.fake.payments().len(), 1);
    // Another operation still pays.
    assert_eq!(ok(&call(c, "create_payment", pay("boom-2", "1.00")).await)["status"], "succeeded");
    r.app.stop().await;
}

/// Reconciliation settles a pending payment the service has since finished, as the poll job does
/// (here the jobs are off): one `resolved` finding, and the agent's replay shows it succeeded.
/// (`AUTHORIZED`: the provider authorized, the capture comes later.)
#[tokio::test]
async fn reconciliation_settles_a_payment_the_service_finished() {
    let r = rig(0).await;
    let c = &r.client;
    r.fake.set_saga(Saga::Authorized);
    let first = call(c, "create_payment", pay("rec-1", "6.00")).await;
    assert_eq!(ok(&first)["status"], "pending");
    let admin = connect(&r.app.url, &r.app.token("ops-bot", "payments:integrity"), Era::Modern).await;
    let before = ok(&call(&admin, "reconcile", json!({})).await).clone();
    assert_eq!(before["resolved"], 0, "still processing: nothing to settle: {before}");
    r.fake.finish(&r.fake.payments()[0].id, true);
    let after = ok(&call(&admin, "reconcile", json!({})).await).clone();
    assert_eq!((after["resolved"].as_i64(), after["problems"].as_i64()), (Some(1), Some(0)), "{after}");
    let replay = call(c, "create_payment", pay("rec-1", "6.00")).await;
    assert_eq!((ok(&replay)["status"].as_str(), ok(&replay)["replayed"].as_bool()), (Some("succeeded"), Some(true)));
    assert_eq!(r.fake.payment_posts(), 1);
    r.app.stop().await;
}

/// A wallet service answering each path with what the test sets (404 otherwise): the answers the
/// real one should never give.
#[derive(Clone, Default)]
struct ScriptedWallet(Arc<std::sync::Mutex<std::collections::HashMap<String, (u16, String)>>>);

async fn scripted_wallet_answer(
    axum::extract::State(s): axum::extract::State<ScriptedWallet>,
    uri: axum::http::Uri,
) -> (axum::http::StatusCode, String) {
    let (status, body) = s.0.lock().unwrap().get(uri.path()).cloned().unwrap_or((404, String::new()));
    (axum::http::StatusCode::from_u16(status).unwrap(), body)
}

impl ScriptedWallet {
    async fn start() -> (ScriptedWallet, WalletService) {
        let script = ScriptedWallet::default();
        let app = axum::Router::new().fallback(scripted_wallet_answer).with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        (script, wallet_backend(&url))
    }

    fn set(&self, path: &str, status: u16, body: &str) {
        self.0.lock().unwrap().insert(path.to_string(), (status, body.to_string()));
    }
}

/// What the wallet service answers outside its contract means what it can about money: a 404
/// for the route or a payment a new request cannot name, and a 400, applied nothing
/// (unavailable); a 2xx whose payment or refund cannot be read, or a refusal about a payment the
/// request does not name, may have applied (outcome unknown); a payment the service does not
/// know is not found, before anything is posted.
#[tokio::test]
async fn answers_outside_the_wallet_contract_are_unavailable_or_unknown_as_money_may_have_moved() {
    let (script, w) = ScriptedWallet::start().await;
    let send = || w.transfer(transfer("k-scripted", "acct-A", "acct-B", 500));
    for (status, detail, needle) in [
        (404, "payment not found: 1", "404 for a new payment"),
        (404, "no handler", "404 for the route"),
        (400, "bad request", "refused the request: 400"),
    ] {
        script.set("/v1/payments", status, &json!({"detail": detail}).to_string());
        match send().await {
            Err(BackendError::Unavailable(why)) => assert!(why.contains(needle), "{detail}: {why}"),
            other => panic!("{detail}: {other:?}"),
        }
    }
    for (status, body, needle) in [
        (201, "<html>".to_string(), "unreadable payment"),
        (422, json!({"detail": "payment 1 is not refundable in status FAILED"}).to_string(), "does not name"),
        (422, json!({"detail": "something new"}).to_string(), "does not know"),
    ] {
        script.set("/v1/payments", status, &body);
        match send().await {
            Err(BackendError::OutcomeUnknown(why)) => assert!(why.contains(needle), "{body}: {why}"),
            other => panic!("{body}: {other:?}"),
        }
    }

    // Refunds: of a payment id the service never made, nothing is asked; of one it does not
    // know, nothing is posted; an unreadable refund may have happened.
    let foreign = PaymentId::generate();
    assert_eq!(w.refund(refund("r-x", &foreign, 100)).await.unwrap_err(), BackendError::PaymentNotFound(foreign));
    let uuid = "7d6c4a1e-0000-4000-8000-00000000abcd";
    let ours = PaymentId::parse(&format!("pay_{}", uuid.replace('-', ""))).unwrap();
    assert_eq!(w.refund(refund("r-y", &ours, 100)).await.unwrap_err(), BackendError::PaymentNotFound(ours.clone()));
    let payment = json!({"id": uuid, "status": "SUCCEEDED", "amount": 500, "currency": "KES"}).to_string();
    script.set(&format!("/v1/payments/{uuid}"), 200, &payment);
    script.set(&format!("/v1/payments/{uuid}/refunds"), 201, "{");
    assert!(
        matches!(w.refund(refund("r-z", &ours, 100)).await, Err(BackendError::OutcomeUnknown(why)) if why.contains("unreadable refund"))
    );
    script.set(&format!("/v1/payments/{uuid}/refunds"), 404, &json!({"detail": "payment not found: x"}).to_string());
    assert_eq!(w.refund(refund("r-w", &ours, 100)).await.unwrap_err(), BackendError::PaymentNotFound(ours.clone()));

    // Reads: a 500 or an unreadable answer is unavailable, a 404 is none.
    assert_eq!(w.payment(&ours).await.unwrap().unwrap().status, PaymentStatus::Succeeded);
    script.set(&format!("/v1/payments/{uuid}"), 500, "");
    assert!(matches!(w.payment(&ours).await, Err(BackendError::Unavailable(why)) if why.contains("500")));
    script.set(&format!("/v1/payments/{uuid}"), 200, "[]");
    assert!(matches!(w.payment(&ours).await, Err(BackendError::Unavailable(why)) if why.contains("unreadable")));
    script.set(&format!("/v1/payments/{uuid}"), 404, "");
    assert_eq!(w.payment(&ours).await.unwrap(), None);
    assert!(
        matches!(w.check_integrity(true).await, Err(BackendError::Unavailable(why)) if why.contains("no reconciliation report"))
    );
    // The service's report: balanced says no problem; unbalanced names each it can.
    for (report, ok, problems) in [
        (json!({"balanced": true, "ledgerNet": 0, "driftedAccounts": []}), true, vec![]),
        (json!({"ledgerNet": 0}), true, vec![]),
        (
            json!({"balanced": false, "ledgerNet": 0, "driftedAccounts": []}),
            false,
            vec!["the wallet service reports its ledger unbalanced"],
        ),
        (
            json!({"balanced": true, "ledgerNet": 5, "driftedAccounts": ["x"]}),
            false,
            vec!["account x: balance drifted from its postings", "postings sum to 5, not 0"],
        ),
    ] {
        script.set("/v1/reconciliation/report", 200, &report.to_string());
        let got = w.check_integrity(true).await.unwrap();
        assert_eq!((got.ok, got.problems.iter().map(String::as_str).collect::<Vec<_>>()), (ok, problems), "{report}");
    }
    // The service lists no payments (the journal lists the gateway's own records).
    let q = paygate::domain::payment::PaymentQuery {
        accounts: vec![AccountId::parse("acct-A").unwrap()],
        limit: 10,
        ..Default::default()
    };
    assert!(w.list_payments(q).await.unwrap().items.is_empty());
}

/// An account's entries are worked back from its balance, newest first, with the service's times;
/// there is one page only, and a direction the contract does not name is unavailable, never
/// guessed.
#[tokio::test]
async fn account_entries_run_back_from_the_balance_and_refuse_an_unknown_direction() {
    use paygate::domain::payment::EntryQuery;
    let (script, w) = ScriptedWallet::start().await;
    let a = wallet::uuid_of("acct-A");
    script.set(
        &format!("/v1/accounts/{a}/balance"),
        200,
        &json!({"accountId": a, "balance": 10_000, "currency": "KES"}).to_string(),
    );
    let tx = "7d6c4a1e-0000-4000-8000-00000000abcd";
    let lines = json!([
        {"id": 9, "transactionId": tx, "direction": "DEBIT", "amount": 500, "createdAt": "2026-12-01T10:00:00Z"},
        {"id": 8, "transactionId": null, "direction": "CREDIT", "amount": 2_000, "createdAt": "not a time"},
    ]);
    script.set(&format!("/v1/accounts/{a}/ledger"), 200, &lines.to_string());
    let query = |before_seq| EntryQuery { account: AccountId::parse("acct-A").unwrap(), before_seq, limit: 10 };
    let page = w.account_entries(query(None)).await.unwrap();
    let got: Vec<_> = page.items.iter().map(|e| (e.seq, e.amount_minor, e.balance_after_minor, e.created_at)).collect();
    assert_eq!(got, vec![(9, -500, 10_000, 1_796_119_200), (8, 2_000, 10_500, 0)]);
    assert_eq!(
        page.items[0].payment_id.as_ref().map(|p| p.as_str().to_string()),
        Some(format!("pay_{}", tx.replace('-', "")))
    );
    assert_eq!(page.next_cursor, None);
    assert!(w.account_entries(query(Some(8))).await.unwrap().items.is_empty(), "one page only");
    script.set(
        &format!("/v1/accounts/{a}/ledger"),
        200,
        &json!([{"id": 1, "direction": "SIDEWAYS", "amount": 1}]).to_string(),
    );
    assert!(
        matches!(w.account_entries(query(None)).await, Err(BackendError::Unavailable(why)) if why.contains("SIDEWAYS"))
    );
}

/// The wallet configuration is checked before anything is sent: a merchant id that is blank,
/// too long or holds a control character; no accounts, or two accounts on one wallet.
#[test]
fn a_wallet_configuration_that_cannot_work_is_refused() {
    let base = || {
        let transport = paygate::backend::http::HttpLedgerConfig {
            base_url: "http://127.0.0.1:9".into(),
            credential: paygate::secret::Secret::new(String::new()),
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            retries_max: 0,
            breaker_failures_max: 1,
            breaker_open: Duration::from_secs(1),
            tls: Default::default(),
        };
        let accounts = wallet::ACCOUNTS
            .iter()
            .map(|(id, uuid, _)| (AccountId::parse(id).unwrap(), WalletAccount::parse(uuid).unwrap()))
            .collect();
        WalletConfig { transport, merchant_id: "merchant-1".into(), accounts }
    };
    let refused = |cfg: WalletConfig, needle: &str| match WalletService::new(cfg, Arc::new(SystemClock)) {
        Err(BackendError::Unavailable(why)) => assert!(why.contains(needle), "{needle}: {why}"),
        other => panic!("{needle}: {:?}", other.map(|_| ())),
    };
    for m in ["  ", "m\u{7}", &"m".repeat(200)] {
        refused(WalletConfig { merchant_id: m.to_string(), ..base() }, "merchant_id");
    }
    refused(WalletConfig { accounts: Default::default(), ..base() }, "wallet_accounts");
    let longest = WalletConfig { merchant_id: "m".repeat(paygate::backend::wallet::MERCHANT_ID_CHARS_MAX), ..base() };
    assert!(WalletService::new(longest, Arc::new(SystemClock)).is_ok(), "the longest merchant id is taken");
    let mut twice = base();
    let first = twice.accounts.values().next().unwrap().clone();
    twice.accounts.insert(AccountId::parse("acct-twice").unwrap(), first);
    refused(twice, "two accounts map to");
    let ok = WalletService::new(base(), Arc::new(SystemClock)).unwrap();
    assert_eq!(ok.accounts().len(), wallet::ACCOUNTS.len());
}
