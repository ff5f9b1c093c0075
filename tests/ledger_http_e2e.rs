//! The gateway with `backend.kind = "http"` against a real `ledger-serve` behind a fault proxy,
//! driven by an MCP client: the whole flow, a response lost after the ledger committed, guards
//! drawn on the gateway side, and reconciliation of the two sides. Plus the payment summary
//! against the embedded ledger.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;
#[path = "common/fault_proxy.rs"]
mod fault_proxy;

use std::sync::Arc;

use common::*;
use fault_proxy::{FaultProxy, Mode};
use paygate::auth::Secret;
use paygate::clock::{Clock, ManualClock, SystemClock};
use paygate::domain::ids::{AccountId, PaymentId};
use paygate::domain::money::Currency;
use paygate::domain::payment::AccountSeed;
use paygate::domain::payment::{Attempt, PaymentKind};
use paygate::domain::rail::{RailMove, RailPage};
use paygate::domain::rail::{RailState, RailUpdate};
use paygate::store::Store;
use paygate::store::sqlite::SqliteStore;
use serde_json::{Value, json};

const CREDENTIAL: &str = "ledger-credential-0123456789abcdef";

struct Rig {
    app: TestApp,
    /// The ledger service's own store (the system of record).
    ledger: Arc<dyn Store>,
    ledger_url: String,
    proxy: FaultProxy,
    clock: ManualClock,
    client: Client,
    _stop: tokio::sync::oneshot::Sender<()>,
    _dir: tempfile::TempDir,
}

async fn rig() -> Rig {
    rig_waiting(0).await
}

/// The rig with `idempotency.wait_ms_max` (how long a call waits for its key held in flight).
async fn rig_waiting(wait_ms: u64) -> Rig {
    let wait_ms = wait_ms.to_string();
    let clock = ManualClock::new(SystemClock.now());
    let (ledger, addr, proxy, stop) = ledger_behind_proxy(Arc::new(clock.clone())).await;
    let dir = tempfile::tempdir().unwrap();
    let url = proxy.url();
    let app = spawn_with_clock(
        dir.path(),
        &[
            ("PAYGATE_BACKEND__KIND", "http"),
            ("PAYGATE_BACKEND__HTTP_URL", url.as_str()),
            ("PAYGATE_BACKEND__HTTP_CREDENTIAL", CREDENTIAL),
            ("PAYGATE_BACKEND__HTTP_REQUEST_TIMEOUT_MS", "1000"),
            ("PAYGATE_BACKEND__HTTP_RETRIES_MAX", "0"),
            ("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", wait_ms.as_str()),
            ("PAYGATE_JOBS__ENABLED", "false"),
        ],
        Arc::new(clock.clone()),
    )
    .await;
    let client = connect(&app.url, &app.dev_token(), Era::Modern).await;
    Rig { app, ledger, ledger_url: format!("http://{addr}"), proxy, clock, client, _stop: stop, _dir: dir }
}

/// The ledger service (its own in-memory store, acct-A with KES 1,000,000 and acct-B empty) on a
/// port of its own, behind a fault proxy; dropping the sender stops it.
async fn ledger_behind_proxy(
    clock: Arc<dyn Clock>,
) -> (Arc<dyn Store>, std::net::SocketAddr, FaultProxy, tokio::sync::oneshot::Sender<()>) {
    let ledger: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
    for (id, opening) in [("acct-A", 100_000_000), ("acct-B", 0)] {
        let seed = AccountSeed {
            id: AccountId::parse(id).unwrap(),
            currency: Currency::parse("KES").unwrap(),
            opening_minor: opening,
            allow_overdraft: false,
        };
        ledger.ledger_open_account(seed, clock.now()).await.unwrap();
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let store = ledger.clone();
    tokio::spawn(async move {
        let shutdown = async move {
            let _ = stopped.await;
        };
        paygate::ledger_service::serve(listener, store, clock, Secret::new(CREDENTIAL.into()), shutdown).await.unwrap();
    });
    (ledger, addr, FaultProxy::start(addr).await, stop)
}

fn pay(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"})
}

/// Every payment the ledger service holds between acct-A and acct-B.
async fn ledger_payments(r: &Rig) -> Vec<paygate::domain::payment::Payment> {
    ledger_payments_of(&r.ledger).await
}

async fn ledger_payments_of(ledger: &Arc<dyn Store>) -> Vec<paygate::domain::payment::Payment> {
    let q = paygate::domain::payment::PaymentQuery {
        accounts: vec![AccountId::parse("acct-A").unwrap()],
        status: None,
        before_seq: None,
        limit: 100,
        ..Default::default()
    };
    ledger.ledger_list_payments(q).await.unwrap().items
}

#[tokio::test]
async fn the_whole_flow_works_against_ledger_serve() {
    let r = rig().await;
    let c = &r.client;
    assert!(
        r.app.running.store.ledger_balance(&AccountId::parse("acct-A").unwrap()).await.unwrap().is_none(),
        "with an HTTP backend the gateway's own store holds no ledger accounts"
    );
    let p = ok(&call(c, "create_payment", pay("http-1", "250.00")).await).clone();
    assert_eq!((p["status"].as_str(), p["replayed"].as_bool()), (Some("succeeded"), Some(false)));
    let id = p["payment_id"].as_str().unwrap().to_string();
    assert_eq!(balance(c, "acct-B").await, "250.00", "reads come from the ledger service");
    assert_eq!(balance(c, "acct-A").await, "999750.00");
    let got = ok(&call(c, "get_payment", json!({"payment_id": id})).await).clone();
    assert_eq!(
        (got["receipt"]["rail"].as_str(), got["receipt"]["reference"].as_str()),
        (Some("http"), Some(id.as_str()))
    );

    let refund =
        call(c, "refund_payment", json!({"operation_id": "http-r1", "payment_id": id, "amount": "50.00"})).await;
    assert_eq!(ok(&refund)["kind"], "refund");
    assert_eq!(balance(c, "acct-B").await, "200.00");
    // Listed once each: the gateway's own records of the ledger's payments are not listed again.
    let list = ok(&call(c, "list_payments", json!({})).await).clone();
    assert_eq!(list["payments"].as_array().unwrap().len(), 2);
    // The window reaches the ledger service.
    let tomorrow = paygate::clock::rfc3339(now_secs() + 86_400)[..10].to_string();
    let later = ok(&call(c, "list_payments", json!({"from": tomorrow})).await).clone();
    assert!(later["payments"].as_array().unwrap().is_empty(), "{later}");
    let until = ok(&call(c, "list_payments", json!({"to": tomorrow})).await).clone();
    assert_eq!(until["payments"].as_array().unwrap().len(), 2);
    let ledger = ok(&call(c, "get_account_ledger", json!({"account_id": "acct-B"})).await).clone();
    assert_eq!(ledger["entries"].as_array().unwrap().len(), 2);
    assert_eq!(ok(&call(c, "check_ledger_integrity", json!({})).await)["ok"], true);
    // The same operation again replays; the ledger holds one payment and one refund.
    assert_eq!(ok(&call(c, "create_payment", pay("http-1", "250.00")).await)["replayed"], true);
    assert_eq!(ledger_payments(&r).await.len(), 2);
    // Every request carried the gateway's credential and an idempotency key on the money-moving ones.
    let seen = r.proxy.seen();
    assert!(seen.iter().filter(|s| s.method == "POST").all(|s| s.idempotency_key.is_some()));
    // A refusal by the ledger is typed and moves nothing.
    let broke = call(
        c,
        "create_payment",
        json!({"operation_id": "http-2", "from_account": "acct-B",
        "to_account": "acct-A", "amount": "900.00", "currency": "KES"}),
    )
    .await;
    assert_eq!(code(&broke), "INSUFFICIENT_FUNDS");
    assert!(
        r.app.running.store.rail_since(RailPage { since: 0, after_seq: 0, limit: 100 }).await.unwrap().len() == 2,
        "a refused payment leaves no record"
    );
    r.app.assert_secrets_not_logged();
    assert_not_logged(&[CREDENTIAL]);
    r.app.stop().await;
}

/// 64 identical calls at once against the HTTP ledger, with the wait for a key in flight on (the
/// default): the ledger receives exactly one payment request and holds one payment; the other 63
/// calls wait for it and replay it. Then a race of one operation_id with two different amounts (8
/// calls each: 8 conflicts stay under the stop rule's 10 denials): one request, one payment, every
/// call of the other amount IDEMPOTENCY_CONFLICT.
#[tokio::test]
async fn concurrent_duplicates_reach_the_http_ledger_once() {
    let r = rig_waiting(10_000).await;
    let agent = Arc::new(connect(&r.app.url, &r.app.dev_token(), Era::Modern).await);
    let posts = |r: &Rig| r.proxy.seen().iter().filter(|s| s.method == "POST" && s.idempotency_key.is_some()).count();
    let storm = |args: Vec<Value>| {
        let mut set = tokio::task::JoinSet::new();
        for a in args {
            let agent = agent.clone();
            set.spawn(async move { call(&agent, "create_payment", a).await });
        }
        set
    };
    let mut set = storm((0..64).map(|_| pay("dup-1", "10.00")).collect());
    let (mut ids, mut replayed) = (std::collections::BTreeSet::new(), 0);
    while let Some(res) = set.join_next().await {
        let res = res.unwrap();
        ids.insert(ok(&res)["payment_id"].as_str().unwrap().to_string());
        replayed += usize::from(ok(&res)["replayed"] == true);
    }
    assert_eq!((ids.len(), replayed), (1, 63), "one payment, 63 replays");
    assert_eq!(posts(&r), 1, "the ledger received one payment request");
    assert_eq!(ledger_payments(&r).await.len(), 1);
    let metrics = reqwest::get(format!("{}/metrics", r.app.base())).await.unwrap().text().await.unwrap();
    let waits = metrics.lines().find_map(|l| l.strip_prefix("paygate_idempotency_key_waits_total ")).unwrap();
    assert!(waits.parse::<u64>().unwrap() > 0, "the duplicates ran at once: some waited for the key in flight");

    let before = posts(&r);
    let mut set = storm((0..16).map(|i| pay("dup-2", if i % 2 == 0 { "20.00" } else { "21.00" })).collect());
    let (mut paid, mut conflicts) = (std::collections::BTreeMap::<String, usize>::new(), 0);
    while let Some(res) = set.join_next().await {
        let res = res.unwrap();
        if res.is_error == Some(true) {
            assert_eq!(code(&res), "IDEMPOTENCY_CONFLICT", "{res:?}");
            conflicts += 1;
        } else {
            *paid.entry(ok(&res)["amount"].as_str().unwrap().to_string()).or_default() += 1;
        }
    }
    assert_eq!(paid.len(), 1, "one amount won: {paid:?}");
    assert_eq!((paid.values().sum::<usize>(), conflicts), (8, 8), "{paid:?}");
    assert_eq!(posts(&r) - before, 1, "the race sent the ledger one request");
    assert_eq!(ledger_payments(&r).await.len(), 2);
    r.app.assert_integrity().await;
    r.app.stop().await;
}

/// The gateway process is SIGKILLed after the ledger committed a payment and before the gateway
/// heard the answer (so before it completed its key). Restarted on the same data, the same call
/// (once the dead attempt's lease has ended) asks the ledger again with the same Idempotency-Key and
/// gets the same payment: one payment in the ledger, the id the ledger assigned the first time.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gateway_killed_between_the_ledgers_commit_and_its_key_completion_pays_once() {
    let (ledger, _addr, proxy, _stop) = ledger_behind_proxy(Arc::new(SystemClock)).await;
    let dir = tempfile::tempdir().unwrap();
    let (data, url) = (dir.path().display().to_string(), proxy.url());
    let env = [
        ("PAYGATE_STORAGE__DATA_DIR", data.as_str()),
        ("PAYGATE_BACKEND__KIND", "http"),
        ("PAYGATE_BACKEND__HTTP_URL", url.as_str()),
        ("PAYGATE_BACKEND__HTTP_CREDENTIAL", CREDENTIAL),
        // A lease outlasts one ledger call (1 s, no retries, 1 s backoff): 3 s.
        ("PAYGATE_BACKEND__HTTP_REQUEST_TIMEOUT_MS", "1000"),
        ("PAYGATE_BACKEND__HTTP_RETRIES_MAX", "0"),
        ("PAYGATE_IDEMPOTENCY__LEASE_SECS", "3"),
        ("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "10000"),
        ("PAYGATE_JOBS__ENABLED", "false"),
    ];
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
    // The ledger has answered (and committed); the gateway is still waiting for that answer.
    proxy.wait_forwarded(1).await;
    let committed = ledger_payments_of(&ledger).await;
    assert_eq!(committed.len(), 1, "the ledger committed the payment");
    first.kill();
    assert!(in_flight.await.unwrap().is_err(), "the caller never got an answer from the killed gateway");
    proxy.set_mode(Mode::PassThrough).await;

    let second = spawn_binary(&env);
    let c = connect(&second.url, &second.token, Era::Modern).await;
    let retry = call(&c, "create_payment", pay("killed-1", "70.00")).await;
    assert_eq!(ok(&retry)["payment_id"], committed[0].id.as_str(), "the same payment: {retry:?}");
    assert_eq!(ledger_payments_of(&ledger).await.len(), 1, "one payment in the ledger");
    let posts: Vec<_> = proxy.seen().into_iter().filter(|s| s.method == "POST").collect();
    assert_eq!(posts.len(), 2, "asked twice");
    assert_eq!(posts[0].idempotency_key, posts[1].idempotency_key, "with the same Idempotency-Key");
    let again = call(&c, "create_payment", pay("killed-1", "70.00")).await;
    assert_eq!(
        (ok(&again)["payment_id"].clone(), ok(&again)["replayed"].clone()),
        (ok(&retry)["payment_id"].clone(), json!(true))
    );
    assert_eq!(balance(&c, "acct-B").await, "70.00");
}

/// A payment a human approved reaches the ledger with its mandate (`Paygate-Mandate`), which the
/// ledger can verify itself from the gateway's published JWKS alone, and compare to the request.
/// Retries resend it unchanged; payments nobody approved carry none.
#[tokio::test]
async fn a_mandated_payment_carries_its_mandate_for_the_ledger_to_verify() {
    let r = rig().await;
    let c = &r.client;
    let ask = call(c, "create_payment", pay("http-m1", "5000.00")).await;
    assert_eq!(code(&ask), "APPROVAL_REQUIRED", "over the dev profile's autonomous limit");
    let approval_id = err(&ask)["approval_id"].as_str().unwrap().to_string();
    let (status, body) = approve(&r.app, &approval_id, "alice").await;
    assert_eq!(status, 200, "{body}");
    let got = call(c, "get_approval", json!({"approval_id": approval_id})).await;
    let mandate = ok(&got)["mandate"].as_str().unwrap().to_string();
    let mut args = pay("http-m1", "5000.00");
    args["mandate"] = json!(mandate);
    assert_eq!(ok(&call(c, "create_payment", args).await)["status"], "succeeded");
    assert_eq!(ok(&call(c, "create_payment", pay("http-plain", "10.00")).await)["status"], "succeeded");

    let posts: Vec<_> = r.proxy.seen().into_iter().filter(|s| s.method == "POST" && s.path == "/v1/payments").collect();
    assert_eq!(posts.len(), 2, "{posts:?}");
    let (mandated, plain) = (&posts[0], &posts[1]);
    assert_eq!(plain.mandate, None, "a payment nobody approved carries no mandate");
    let carried = mandated.mandate.as_deref().expect("the mandated payment carries its mandate");
    assert_eq!(carried, mandate);

    // The ledger's side: the gateway's JWKS, fetched over HTTP, is all it needs.
    let jwks: Value =
        reqwest::get(format!("{}/.well-known/mandate-jwks.json", r.app.base())).await.unwrap().json().await.unwrap();
    let verifier = paygate::mandate::JwksVerifier::from_jwks(&jwks).unwrap();
    let claims = verifier.verify(carried, r.clock.now()).expect("verifies from the JWKS alone");
    let request: Value = serde_json::from_slice(&mandated.body).unwrap();
    assert_eq!(claims.payer.as_deref(), request["from_account"].as_str());
    assert_eq!(claims.payee.as_deref(), request["to_account"].as_str());
    assert_eq!(claims.amount_minor, request["amount_minor"].as_i64());
    assert_eq!(Some(claims.currency.as_str()), request["currency"].as_str());
    assert_eq!(claims.approval_id, approval_id);
    assert!(request.get("mandate").is_none(), "a header, not part of the body the ledger hashes");
    r.app.stop().await;
}

#[tokio::test]
async fn a_response_lost_after_the_ledger_committed_is_replayed_not_repaid() {
    let r = rig().await;
    let c = &r.client;
    r.proxy.set_mode(Mode::DropResponseAfterForward).await;
    let lost = call(c, "create_payment", pay("lost-1", "400.00")).await;
    assert_eq!(code(&lost), "OUTCOME_UNKNOWN");
    assert_eq!(err(&lost)["retryable"], true);
    let held = ledger_payments(&r).await;
    assert_eq!(held.len(), 1, "the ledger committed");
    r.proxy.set_mode(Mode::PassThrough).await;
    // While the first attempt's lease lasts, the retry is told to wait; after it, the retry re-sends
    // the same key and payment id, and the ledger answers with the payment it already made.
    assert_eq!(code(&call(c, "create_payment", pay("lost-1", "400.00")).await), "OPERATION_IN_PROGRESS");
    r.clock.advance(120);
    let retry = call(c, "create_payment", pay("lost-1", "400.00")).await;
    assert_eq!(ok(&retry)["payment_id"].as_str(), Some(held[0].id.as_str()));
    assert_eq!(ledger_payments(&r).await.len(), 1, "exactly one payment");
    assert_eq!(balance(c, "acct-B").await, "400.00");
    let keys: Vec<_> =
        r.proxy.seen().iter().filter(|s| s.method == "POST").filter_map(|s| s.idempotency_key.clone()).collect();
    assert_eq!(keys.len(), 2);
    assert_eq!(keys[0], keys[1], "the retry re-sent the same Idempotency-Key");
    // From then on it replays like any completed operation.
    assert_eq!(ok(&call(c, "create_payment", pay("lost-1", "400.00")).await)["replayed"], true);
    r.app.stop().await;
}

/// The same for a refund: the retry re-sends it under the refund id and key the first attempt
/// sent, and the ledger answers with the refund it already made; the money comes back once.
#[tokio::test]
async fn a_refund_whose_response_was_lost_is_replayed_not_refunded_again() {
    let r = rig().await;
    let c = &r.client;
    let paid = ok(&call(c, "create_payment", pay("to-refund", "400.00")).await).clone();
    let refund = json!({"operation_id": "lost-refund", "payment_id": paid["payment_id"], "amount": "150.00"});
    // The payment read (twice: the refund's check, then the backend's), then the refund's answer lost.
    r.proxy.script([Mode::PassThrough, Mode::PassThrough, Mode::DropResponseAfterForward]);
    let first = call(c, "refund_payment", refund.clone()).await;
    assert_eq!(code(&first), "OUTCOME_UNKNOWN", "{first:?}");
    r.clock.advance(120);
    let retry = call(c, "refund_payment", refund.clone()).await;
    assert_eq!(ok(&retry)["amount"], "150.00", "{retry:?}");
    assert_eq!(balance(c, "acct-B").await, "250.00", "refunded once");
    let sent: Vec<Value> = r
        .proxy
        .seen()
        .iter()
        .filter(|s| s.method == "POST" && s.path.ends_with("/refunds"))
        .map(|s| serde_json::from_slice(&s.body).unwrap())
        .collect();
    assert_eq!(sent.len(), 2, "{sent:?}");
    assert_eq!(sent[0]["refund_id"], sent[1]["refund_id"], "the retry re-sent the same refund id");
    assert_eq!(ok(&call(c, "refund_payment", refund).await)["replayed"], true);
    r.app.stop().await;
}

/// The ledger's answer is the only word the gateway may get of a payment it made: a store that
/// refuses to record it for a moment (a database restart or failover) is tried again, and once it
/// is back the answer is recorded and the agent told the payment succeeded. (The store is refused
/// by a trigger, dropped as soon as the gateway says it is trying again.)
#[tokio::test]
async fn an_answer_the_store_refused_to_record_at_first_is_recorded_when_it_is_back() {
    const TRYING_AGAIN: &str = "recording a rail payment's outcome failed; trying again";
    capture_logs();
    let r = rig().await;
    let db = rusqlite::Connection::open(r.app.data_dir.join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    db.execute_batch(
        "CREATE TRIGGER store_away BEFORE UPDATE ON rail_payments WHEN NEW.state = 'succeeded'
         BEGIN SELECT RAISE(ABORT, 'the store went away'); END;",
    )
    .unwrap();
    let paying = call(&r.client, "create_payment", pay("away-1", "10.00"));
    tokio::pin!(paying);
    let mut healed = false;
    let paid = loop {
        tokio::select! {
            done = &mut paying => break done,
            () = tokio::time::sleep(std::time::Duration::from_millis(5)), if !healed => {
                if logs_text().contains(TRYING_AGAIN) {
                    db.execute_batch("DROP TRIGGER store_away").unwrap();
                    healed = true;
                }
            }
        }
    };
    assert!(healed, "the gateway tried again: {paid:?}");
    assert_eq!(ok(&paid)["status"], "succeeded", "{paid:?}");
    assert_eq!(ledger_payments(&r).await.len(), 1, "paid once");
    assert_eq!(balance(&r.client, "acct-B").await, "10.00");
    r.app.stop().await;
}

#[tokio::test]
async fn budgets_are_drawn_on_the_gateway_side_and_given_back_when_nothing_moved() {
    let r = rig().await;
    let c = &r.client;
    // The dev profile allows KES 100000.00 a day; the ledger refuses one payment (unknown account).
    for i in 0..99 {
        ok(&call(c, "create_payment", pay(&format!("b-{i}"), "1000.00")).await);
    }
    let refused = call(
        c,
        "create_payment",
        json!({"operation_id": "b-x", "from_account": "acct-A",
        "to_account": "acct-B", "amount": "1000.00", "currency": "USD"}),
    )
    .await;
    assert_eq!(code(&refused), "APPROVAL_REQUIRED", "no USD limit: a human decides");
    r.proxy.set_mode(Mode::Status(503)).await;
    assert_eq!(code(&call(c, "create_payment", pay("b-99", "1000.00")).await), "BACKEND_UNAVAILABLE");
    r.proxy.set_mode(Mode::PassThrough).await;
    // The unavailable attempt gave its draw back: exactly one more fits, then the budget is spent.
    ok(&call(c, "create_payment", pay("b-99", "1000.00")).await);
    assert_eq!(code(&call(c, "create_payment", pay("b-100", "1000.00")).await), "BUDGET_EXCEEDED");
    assert_eq!(ledger_payments(&r).await.len(), 100);
    r.app.stop().await;
}

#[tokio::test]
async fn reconciliation_finds_what_the_gateway_and_the_ledger_disagree_on() {
    let r = rig().await;
    let c = &r.client;
    let admin = connect(&r.app.url, &r.app.token("ops-bot", "payments:integrity"), Era::Modern).await;
    let clean = ok(&call(&admin, "reconcile", json!({})).await).clone();
    assert_eq!(clean["problems"], 0, "{clean}");

    // 1. Agreed.
    ok(&call(c, "create_payment", pay("rec-1", "10.00")).await);
    // 2. The gateway's record says failed, the ledger says succeeded.
    let p2 = ok(&call(c, "create_payment", pay("rec-2", "20.00")).await).clone();
    let id2 = PaymentId::parse(p2["payment_id"].as_str().unwrap()).unwrap();
    let tampered = r
        .app
        .running
        .store
        .rail_transition(
            RailMove { id: &id2, from: &[RailState::Succeeded], to: RailState::Failed, update: RailUpdate::default() },
            r.clock.now(),
        )
        .await
        .unwrap();
    assert!(tampered.is_some());
    // 3. A payment someone made at the ledger directly: the gateway has no record of it.
    let direct = reqwest::Client::new()
        .post(format!("{}/v1/payments", r.ledger_url))
        .bearer_auth(CREDENTIAL)
        .header("Idempotency-Key", "direct-1")
        .json(&json!({"payment_id": "pay_direct0001", "from_account": "acct-A", "to_account": "acct-B",
                      "amount_minor": 3000, "currency": "KES", "principal_sub": "someone-else"}))
        .send()
        .await
        .unwrap();
    assert_eq!(direct.status(), 201, "{}", direct.text().await.unwrap_or_default());
    // 4. A lost response: the gateway does not know, the ledger does.
    r.proxy.set_mode(Mode::DropResponseAfterForward).await;
    assert_eq!(code(&call(c, "create_payment", pay("rec-4", "40.00")).await), "OUTCOME_UNKNOWN");
    r.proxy.set_mode(Mode::PassThrough).await;

    let report = ok(&call(&admin, "reconcile", json!({})).await).clone();
    let findings = report["findings"].as_array().unwrap();
    let of = |kind: &str| findings.iter().filter(|f| f["kind"] == kind).cloned().collect::<Vec<_>>();
    assert_eq!(of("missing_in_gateway").len(), 1, "{report}");
    assert_eq!(of("missing_in_gateway")[0]["payment_id"], "pay_direct0001");
    assert_eq!(of("status_mismatch").len(), 1, "{report}");
    assert_eq!(of("status_mismatch")[0]["payment_id"], id2.as_str());
    assert_eq!(of("resolved").len(), 1, "the lost response is settled from the ledger's answer: {report}");
    assert_eq!((report["resolved"].as_i64(), report["problems"].as_i64()), (Some(1), Some(2)));
    // Audited, and visible in metrics.
    let audit = r.app.running.store.audit_list(Some("ops-bot"), 10).await.unwrap();
    assert!(audit.iter().any(|a| a.tool == "reconcile" && a.decision == "reconcile_findings"));
    let metrics = reqwest::get(format!("{}/metrics", r.app.base())).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("paygate_reconcile_open_findings 2"), "{metrics}");
    assert!(metrics.contains("paygate_reconcile_findings_total{kind=\"missing_in_gateway\"} 1"));
    // An agent without payments:integrity cannot reconcile (403 at the HTTP layer).
    let reader = connect(&r.app.url, &r.app.token("dev-agent", "payments:read"), Era::Modern).await;
    let denied =
        reader.call_tool(rmcp::model::CallToolRequestParams::new("reconcile").with_arguments(Default::default())).await;
    assert_step_up(&denied, "payments:integrity");
    r.app.stop().await;
}

#[tokio::test]
async fn the_summary_matches_the_embedded_ledger() {
    let (app, _dir) = spawn_app().await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let mut ids = vec![];
    for (i, amount) in ["100.00", "250.50", "999.99", "0.01"].iter().enumerate() {
        let p = ok(&call(&c, "create_payment", pay(&format!("s-{i}"), amount)).await).clone();
        ids.push(p["payment_id"].as_str().unwrap().to_string());
    }
    ok(&call(&c, "refund_payment", json!({"operation_id": "s-r", "payment_id": ids[1], "amount": "50.50"})).await);
    assert_eq!(code(&call(&c, "create_payment", pay("s-big", "5000.00")).await), "APPROVAL_REQUIRED");

    let summary = ok(&call(&c, "get_payment_summary", json!({})).await).clone();
    // The ledger's own view: every payment and refund, summed by kind.
    let store = &app.running.store;
    let q = paygate::domain::payment::PaymentQuery {
        accounts: vec![AccountId::parse("acct-A").unwrap()],
        status: None,
        before_seq: None,
        limit: 100,
        ..Default::default()
    };
    let held = store.ledger_list_payments(q).await.unwrap().items;
    for kind in [PaymentKind::Payment, PaymentKind::Refund] {
        let of_kind: Vec<_> = held.iter().filter(|p| p.kind == kind).collect();
        let total: i64 = of_kind.iter().map(|p| p.amount_minor).sum();
        let line = summary["totals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|l| l["kind"] == kind.as_str() && l["status"] == "succeeded")
            .unwrap_or_else(|| panic!("a {kind:?} line in {summary}"));
        assert_eq!(line["count"].as_i64(), Some(of_kind.len() as i64));
        assert_eq!(
            line["total"].as_str(),
            Some(paygate::domain::money::format_minor(total, Currency::parse("KES").unwrap()).as_str())
        );
    }
    assert_eq!(summary["totals"].as_array().unwrap().len(), 2, "{summary}");
    // The window is honoured: yesterday holds nothing.
    let yesterday = time::OffsetDateTime::now_utc().date().previous_day().unwrap().to_string();
    let empty = ok(&call(&c, "get_payment_summary", json!({"from": yesterday, "to": yesterday})).await).clone();
    assert_eq!(empty["totals"], json!([]));
    assert_eq!(code(&call(&c, "get_payment_summary", json!({"from": "last tuesday"})).await), "INVALID_ARGUMENT");
    app.stop().await;
}

/// The binaries as an operator runs them: `paygate ledger-serve`, a gateway on `backend.kind = "http"`
/// in front of it, and `paygate reconcile` over the gateway's data directory.
#[tokio::test]
async fn the_cli_runs_ledger_serve_a_gateway_on_it_and_reconcile() {
    use std::io::BufRead;
    let ledger_dir = tempfile::tempdir().unwrap();
    let mut ledger = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
        .args(["ledger-serve", "--bind", "127.0.0.1:0"])
        .env("PAYGATE_LEDGER_SERVE_CREDENTIAL", CREDENTIAL)
        .env("PAYGATE_STORAGE__DATA_DIR", ledger_dir.path())
        .env("PAYGATE_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = std::io::BufReader::new(ledger.stdout.take().unwrap()).lines();
    let ledger_url = lines
        .find_map(|l| l.ok()?.strip_prefix("paygate ledger service: ").map(str::to_string))
        .expect("ledger-serve prints its URL");
    let _ledger = Proc::adopt(ledger);

    let gw_dir = tempfile::tempdir().unwrap();
    let data_dir = gw_dir.path().display().to_string();
    let env = [
        ("PAYGATE_STORAGE__DATA_DIR", data_dir.as_str()),
        ("PAYGATE_BACKEND__KIND", "http"),
        ("PAYGATE_BACKEND__HTTP_URL", ledger_url.as_str()),
        ("PAYGATE_BACKEND__HTTP_CREDENTIAL", CREDENTIAL),
    ];
    let gateway = spawn_binary(&env);
    let c = connect(&gateway.url, &gateway.token, Era::Legacy).await;
    ok(&call(&c, "create_payment", pay("cli-1", "75.00")).await);
    assert_eq!(balance(&c, "acct-B").await, "75.00", "the ledger service's demo accounts");

    let out = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
        .arg("reconcile")
        .envs(env)
        .env("PAYGATE_LOG", "warn")
        .output()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).expect("reconcile prints JSON");
    assert_eq!(out.status.code(), Some(0), "{report}");
    assert_eq!((report["backend"].as_str(), report["checked"].as_i64()), (Some("http"), Some(2)), "{report}");
    assert_eq!(report["findings"], json!([]));
}

/// The journal the gateway wraps the HTTP ledger in, over the rig's proxy, on a store of its own
/// (the gateway's records, apart from the running app's): a test drives it directly.
fn journal_over_proxy(r: &Rig) -> (paygate::backend::journal::Journaled, Arc<dyn Store>) {
    use paygate::backend::http::{HttpLedger, HttpLedgerConfig};
    let clock: Arc<dyn Clock> = Arc::new(r.clock.clone());
    let gateway_store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
    let cfg = HttpLedgerConfig {
        base_url: r.proxy.url(),
        credential: Secret::new(CREDENTIAL.into()),
        connect_timeout: std::time::Duration::from_secs(1),
        request_timeout: std::time::Duration::from_secs(1),
        retries_max: 0,
        breaker_failures_max: 100,
        breaker_open: std::time::Duration::from_secs(1),
        tls: Default::default(),
    };
    let http = HttpLedger::new(cfg, clock.clone()).unwrap();
    let links = paygate::domain::audit_chain::LinkKey::new([7; 32]);
    let journal = paygate::backend::journal::Journaled::new(Arc::new(http), gateway_store.clone(), clock, links);
    (journal, gateway_store)
}

/// A retry that finds the record an earlier attempt opened (the ledger applied it, then the attempt
/// died) never reports "nothing moved" and never gives the draws back when the ledger is unreachable.
#[tokio::test]
async fn a_record_an_earlier_attempt_opened_is_never_abandoned() {
    use paygate::backend::PaymentBackend;
    use paygate::domain::error::BackendError;
    use paygate::domain::payment::{DailyBudget, Guards, TransferRequest};
    let r = rig().await;
    let (journal, gateway_store) = journal_over_proxy(&r);
    let today = r.clock.now() - r.clock.now().rem_euclid(86_400);
    let budget = || Guards {
        budget: Some(DailyBudget { kind: PaymentKind::Payment, since: today, max_minor: 1_000_000, max_payments: 1 }),
        mandate: None,
        payee: None,
    };
    let first_id = PaymentId::generate();
    let request = |id: &PaymentId| TransferRequest {
        attempt: Attempt::reserved("k-dead"),
        payment_id: id.clone(),
        from_account: AccountId::parse("acct-A").unwrap(),
        to_account: AccountId::parse("acct-B").unwrap(),
        amount: paygate::domain::money::Money::parse("10.00", Currency::parse("KES").unwrap()).unwrap(),
        memo: None,
        principal_sub: "dev-agent".into(),
        principal_user: None,
        guards: budget(),
    };
    // Attempt 1: opened the record, the ledger applied it, and the attempt died before recording.
    let rec = rail_record(&first_id, "k-dead", "acct-A", "acct-B", 1_000);
    assert!(gateway_store.rail_open(rec, budget(), None, r.clock.now()).await.unwrap().created);
    let applied = r.ledger.ledger_transfer(request(&first_id), r.clock.now()).await.unwrap();
    // Attempt 2 cannot reach the ledger: the outcome is unknown, not "nothing moved".
    r.proxy.set_mode(Mode::Refuse).await;
    let retry = journal.transfer(request(&PaymentId::generate())).await;
    assert!(matches!(retry, Err(BackendError::OutcomeUnknown(_))), "{retry:?}");
    let kept = gateway_store.rail_by_key("k-dead").await.unwrap().expect("the record is kept");
    assert_eq!(kept.state, RailState::Unknown);
    // Its draw was not given back: the day's one payment is still taken.
    let other =
        journal.transfer(TransferRequest { attempt: Attempt::reserved("k-other"), ..request(&PaymentId::generate()) });
    let other = other.await;
    assert!(matches!(other, Err(BackendError::BudgetExceeded(_))), "{other:?}");
    // Attempt 3 reaches the ledger: the same payment, once.
    r.proxy.set_mode(Mode::PassThrough).await;
    let settled = journal.transfer(request(&PaymentId::generate())).await.unwrap();
    assert_eq!(settled.id, applied.id);
    assert_eq!(gateway_store.rail_by_key("k-dead").await.unwrap().unwrap().state, RailState::Succeeded);
    assert_eq!(ledger_payments(&r).await.len(), 1);
    r.app.stop().await;
}

/// A statement against the gateway's own SQLite file, as another process would run it (the
/// store faults below are SQLite triggers: no hook in the gateway).
fn gateway_sql(app: &TestApp, statement: &str) {
    let db = rusqlite::Connection::open(app.data_dir.join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    db.execute_batch(statement).unwrap();
}

fn fail_writes(app: &TestApp, event: &str) {
    gateway_sql(
        app,
        &format!("CREATE TRIGGER injected_fault BEFORE {event} BEGIN SELECT RAISE(ABORT, 'injected fault'); END;"),
    );
}

async fn bookkeeping_failures(app: &TestApp, write: &str) -> u64 {
    let text = reqwest::get(format!("{}/metrics", app.base())).await.unwrap().text().await.unwrap();
    let series = format!("paygate_bookkeeping_failures_total{{write=\"{write}\"}} ");
    text.lines().find_map(|l| l.strip_prefix(series.as_str()).and_then(|v| v.trim().parse().ok())).unwrap_or(0)
}

/// The key's completion fails after the ledger committed: the agent is told it paid, the key stays
/// in flight (counted), a retry during its lease waits, and after the lease the retry asks the
/// ledger again with the same key and gets the same payment: never a second one.
#[tokio::test]
async fn a_failing_key_completion_after_the_ledger_paid_never_pays_twice() {
    let r = rig().await;
    let c = &r.client;
    fail_writes(&r.app, "UPDATE ON idempotency_records");
    let paid = call(c, "create_payment", pay("complete-1", "70.00")).await;
    assert_eq!(ok(&paid)["status"], "succeeded", "the ledger paid, and the agent is told so");
    assert_eq!(bookkeeping_failures(&r.app, "idempotency_complete").await, 1);
    gateway_sql(&r.app, "DROP TRIGGER injected_fault");
    assert_eq!(code(&call(c, "create_payment", pay("complete-1", "70.00")).await), "OPERATION_IN_PROGRESS");
    r.clock.advance(120);
    let retry = call(c, "create_payment", pay("complete-1", "70.00")).await;
    assert_eq!(ok(&retry)["payment_id"], ok(&paid)["payment_id"], "{retry:?}");
    assert_eq!(ledger_payments(&r).await.len(), 1, "exactly one payment");
    assert_eq!(ok(&call(c, "create_payment", pay("complete-1", "70.00")).await)["replayed"], true);
    r.app.stop().await;
}

/// The key's release fails after the ledger refused (nothing moved): the agent gets the ledger's
/// answer, the key stays in flight until its lease ends (counted), then the retry pays once.
#[tokio::test]
async fn a_failing_key_release_after_nothing_moved_holds_the_key_until_its_lease_ends() {
    let r = rig().await;
    let c = &r.client;
    fail_writes(&r.app, "DELETE ON idempotency_records");
    r.proxy.set_mode(Mode::Status(503)).await;
    assert_eq!(code(&call(c, "create_payment", pay("release-1", "80.00")).await), "BACKEND_UNAVAILABLE");
    assert_eq!(bookkeeping_failures(&r.app, "idempotency_release").await, 1);
    r.proxy.set_mode(Mode::PassThrough).await;
    gateway_sql(&r.app, "DROP TRIGGER injected_fault");
    assert_eq!(code(&call(c, "create_payment", pay("release-1", "80.00")).await), "OPERATION_IN_PROGRESS");
    assert!(ledger_payments(&r).await.is_empty(), "nothing moved");
    r.clock.advance(120);
    assert_eq!(ok(&call(c, "create_payment", pay("release-1", "80.00")).await)["replayed"], false);
    assert_eq!(ledger_payments(&r).await.len(), 1);
    r.app.stop().await;
}

/// The first read of the money path (is this operation already recorded?) fails: INTERNAL,
/// retryable, nothing sent to the ledger; once it reads again the same call pays once.
#[tokio::test]
async fn a_failing_key_read_sends_nothing_and_the_retry_pays_once() {
    let r = rig().await;
    let c = &r.client;
    gateway_sql(&r.app, "ALTER TABLE idempotency_records RENAME TO idempotency_records_gone");
    let refused = call(c, "create_payment", pay("peek-1", "90.00")).await;
    assert_eq!((code(&refused).as_str(), &err(&refused)["retryable"]), ("INTERNAL", &json!(true)), "{refused:?}");
    assert!(!err(&refused)["message"].as_str().unwrap().contains("idempotency_records"), "store text leaked");
    assert!(r.proxy.seen().is_empty(), "nothing was sent to the ledger");
    gateway_sql(&r.app, "ALTER TABLE idempotency_records_gone RENAME TO idempotency_records");
    assert_eq!(ok(&call(c, "create_payment", pay("peek-1", "90.00")).await)["replayed"], false);
    assert_eq!(ledger_payments(&r).await.len(), 1);
    r.app.stop().await;
}

/// Issue 53: a payment whose answer was lost after the ledger committed, or arrived and could not
/// be recorded, and that no retry ever settles, left the gateway's record open until a
/// reconciliation run (every 5 minutes, over the whole day's records). The poll job now asks the
/// ledger by id — never posting again — and brings the record to the ledger's word; a payment the
/// ledger never received stays open for the agent's retry and reconciliation.
#[tokio::test]
async fn the_poll_job_settles_open_records_from_the_ledgers_word_without_sending_again() {
    let r = rig().await;
    let c = &r.client;
    // Lost after the ledger committed: OUTCOME_UNKNOWN, the record `unknown`.
    r.proxy.set_mode(Mode::DropResponseAfterForward).await;
    assert_eq!(code(&call(c, "create_payment", pay("open-lost", "40.00")).await), "OUTCOME_UNKNOWN");
    // Never reached the ledger (a 500 from in front of it): also `unknown`.
    r.proxy.set_mode(Mode::Status(500)).await;
    assert_eq!(code(&call(c, "create_payment", pay("open-never", "60.00")).await), "OUTCOME_UNKNOWN");
    r.proxy.set_mode(Mode::PassThrough).await;
    // Paid and answered, but the answer could not be recorded: the record stays `submitting`.
    fail_writes(&r.app, "UPDATE ON rail_payments");
    let paid = call(c, "create_payment", pay("open-unrecorded", "50.00")).await;
    assert_eq!(ok(&paid)["status"], "succeeded", "{paid:?}");
    gateway_sql(&r.app, "DROP TRIGGER injected_fault");

    let store = &r.app.running.store;
    let record = |minor: i64| async move {
        let all = store.rail_since(RailPage { since: 0, after_seq: 0, limit: 100 }).await.unwrap();
        all.into_iter().map(|(_, rec)| rec).find(|rec| rec.amount_minor == minor).unwrap()
    };
    assert_eq!(
        [record(4000).await.state, record(6000).await.state, record(5000).await.state],
        [RailState::Unknown, RailState::Unknown, RailState::Submitting]
    );
    let posts = || r.proxy.seen().iter().filter(|s| s.method == "POST").count();
    let posted = posts();

    // Not yet older than the poll's threshold: left alone.
    assert_eq!(r.app.running.gateway.poll_rails(60, std::time::Duration::from_secs(10)).await, 0);
    r.clock.advance(120);
    assert_eq!(r.app.running.gateway.poll_rails(60, std::time::Duration::from_secs(10)).await, 2);
    assert_eq!(posts(), posted, "settled by asking, never by sending again");
    let held = ledger_payments(&r).await;
    assert_eq!(held.len(), 2, "the lost one and the unrecorded one");
    for minor in [4000, 5000] {
        let rec = record(minor).await;
        assert_eq!(rec.state, RailState::Succeeded, "{rec:?}");
        assert_eq!(rec.rail_ref.as_deref(), Some(rec.id.as_str()), "the ledger's word recorded");
        assert!(held.iter().any(|p| p.id == rec.id));
    }
    assert_eq!(record(6000).await.state, RailState::Unknown, "the ledger never received it: still open");

    // The agent's retries: the settled one replays the ledger's payment, the open one is sent
    // again under the same key and pays once.
    r.clock.advance(120);
    let lost = call(c, "create_payment", pay("open-lost", "40.00")).await;
    assert_eq!(ok(&lost)["payment_id"].as_str(), Some(record(4000).await.id.as_str()), "{lost:?}");
    assert_eq!(posts(), posted, "a settled record is not sent again");
    ok(&call(c, "create_payment", pay("open-never", "60.00")).await);
    assert_eq!(ledger_payments(&r).await.len(), 3);
    assert_eq!(balance(c, "acct-B").await, "150.00");
    r.app.stop().await;
}

/// Whether the audit trail says the ledger's word on `payment`: a record naming it with `decision`
/// and `code`, tagged by the gateway.
async fn trail_says(app: &TestApp, payment: &str, decision: &str, code: &str) -> bool {
    let records = app.running.store.audit_list(None, 10_000).await.unwrap();
    records.iter().any(|r| {
        r.payment_id.as_deref() == Some(payment)
            && r.decision == decision
            && r.code.as_deref() == Some(code)
            && r.tag.is_some()
    })
}

/// Stop 64's review (high): the ledger's answer moved the gateway's record to `succeeded` with no
/// audit record of it in that transaction, and the "allowed" record appended after it could fail
/// unseen: money the ledger moved, settled in the gateway's books, that the trail never said
/// settled. The answer is now audited in the transaction that records it ("answered"), and the
/// poll job's word too ("query_settled"): with every record but the opening one failing, the
/// record is not settled at all until its audit record can be written with it.
#[tokio::test]
async fn no_ledger_payment_settles_in_the_gateways_record_without_the_trail_saying_so() {
    let r = rig().await;
    let c = &r.client;
    let store = &r.app.running.store;
    let record_of = |id: String| async move {
        let id = PaymentId::parse(&id).unwrap();
        store.rail_get(&id).await.unwrap().expect("the gateway's record")
    };

    // A plain payment: submitted, then the ledger's answer in the same write as the record's move.
    let paid = call(c, "create_payment", pay("said-1", "30.00")).await;
    let id = ok(&paid)["payment_id"].as_str().unwrap().to_string();
    assert_eq!(record_of(id.clone()).await.state, RailState::Succeeded);
    assert!(trail_says(&r.app, &id, "answered", "SUCCEEDED").await, "the ledger's answer is in the trail");

    // Every audit write after the opening one fails: the ledger pays and the agent is told so, but
    // the gateway's record does not settle without its record of the ledger's word.
    gateway_sql(
        &r.app,
        "CREATE TRIGGER injected_fault BEFORE INSERT ON audit_records WHEN NEW.decision <> 'submitted'
         BEGIN SELECT RAISE(ABORT, 'injected fault'); END;",
    );
    let paid = call(c, "create_payment", pay("said-2", "20.00")).await;
    assert_eq!(ok(&paid)["status"], "succeeded", "{paid:?}");
    let id = ok(&paid)["payment_id"].as_str().unwrap().to_string();
    assert!(ledger_payments(&r).await.iter().any(|p| p.id.as_str() == id), "the ledger paid");
    let rec = record_of(id.clone()).await;
    assert_eq!(rec.state, RailState::Submitting, "not settled without its audit record: {rec:?}");
    assert!(!trail_says(&r.app, &id, "answered", "SUCCEEDED").await);
    gateway_sql(&r.app, "DROP TRIGGER injected_fault");

    // Healed: the poll job asks the ledger (never sending again) and settles it with its record.
    r.clock.advance(120);
    assert_eq!(r.app.running.gateway.poll_rails(60, std::time::Duration::from_secs(10)).await, 1);
    assert_eq!(record_of(id.clone()).await.state, RailState::Succeeded);
    assert!(trail_says(&r.app, &id, "query_settled", "SUCCEEDED").await, "the ledger's word is in the trail");
    assert_eq!(ledger_payments(&r).await.len(), 2, "paid once each");

    // Every settled record of the gateway's has a record of the ledger's word saying so.
    for (_, rec) in store.rail_since(RailPage { since: 0, after_seq: 0, limit: 100 }).await.unwrap() {
        assert_eq!(rec.state, RailState::Succeeded, "{rec:?}");
        let id = rec.id.to_string();
        assert!(
            trail_says(&r.app, &id, "answered", "SUCCEEDED").await
                || trail_says(&r.app, &id, "query_settled", "SUCCEEDED").await,
            "{rec:?}"
        );
    }
    r.app.stop().await;
}

/// The stop-65 review (medium): the same with triggers that *swallow* the records
/// (`RAISE(IGNORE)`: not written, the statement succeeds) rather than fail them: the payment
/// moved at the ledger, the agent was told `succeeded`, the record settled, and no record of any
/// kind named it; verify, check-ledger, reconcile and Health all said ok. A swallowed record now
/// fails its transaction like a failed one.
#[tokio::test]
async fn swallowed_audit_records_never_let_a_ledger_payment_settle_unnamed() {
    let r = rig().await;
    let c = &r.client;
    let store = &r.app.running.store;
    let swallow = |decisions: &str| {
        format!(
            "CREATE TRIGGER swallow BEFORE INSERT ON audit_records WHEN NEW.decision IN ({decisions})
             BEGIN SELECT RAISE(IGNORE); END;"
        )
    };
    // The opening record swallowed: nothing is sent.
    gateway_sql(&r.app, &swallow("'submitted'"));
    let refused = call(c, "create_payment", pay("swallow-1", "88.00")).await;
    assert_eq!(err(&refused)["retryable"], true, "{refused:?}");
    assert!(r.proxy.seen().is_empty(), "nothing was sent to the ledger");
    gateway_sql(&r.app, "DROP TRIGGER swallow");

    // The answer's record (and the poll job's) swallowed: the ledger pays, the record stays open.
    gateway_sql(&r.app, &swallow("'answered', 'query_settled', 'allowed'"));
    r.clock.advance(120);
    let paid = call(c, "create_payment", pay("swallow-1", "88.00")).await;
    let id = ok(&paid)["payment_id"].as_str().unwrap().to_string();
    let rec = store.rail_get(&PaymentId::parse(&id).unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.state, RailState::Submitting, "not settled without its record: {rec:?}");
    r.clock.advance(120);
    assert_eq!(r.app.running.gateway.poll_rails(60, std::time::Duration::from_secs(10)).await, 0);
    let rec = store.rail_get(&PaymentId::parse(&id).unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.state, RailState::Submitting, "nor by the poll job: {rec:?}");
    gateway_sql(&r.app, "DROP TRIGGER swallow");

    r.clock.advance(120);
    assert_eq!(r.app.running.gateway.poll_rails(60, std::time::Duration::from_secs(10)).await, 1);
    let rec = store.rail_get(&PaymentId::parse(&id).unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.state, RailState::Succeeded);
    assert!(trail_says(&r.app, &id, "query_settled", "SUCCEEDED").await, "named once it can be");
    assert_eq!(ledger_payments(&r).await.len(), 1, "paid once");
    r.app.stop().await;
}

/// A retry of a payment whose first answer was lost, refused for good by the ledger (here: the
/// payer's money went elsewhere meanwhile), settles the open record as failed: the agent hears
/// the ledger's refusal, the trail says the ledger refused it, and the same operation is answered
/// from then on without sending again. (Had the first attempt been applied, the ledger would have
/// answered its payment under the same key, never a refusal.)
#[tokio::test]
async fn a_retry_the_ledger_refuses_after_an_unknown_outcome_fails_the_open_record() {
    use paygate::domain::payment::{Guards, TransferRequest};
    let r = rig().await;
    let c = &r.client;
    r.proxy.set_mode(Mode::Status(500)).await;
    assert_eq!(code(&call(c, "create_payment", pay("refused-late", "40.00")).await), "OUTCOME_UNKNOWN");
    assert!(ledger_payments(&r).await.is_empty(), "the 500 came from in front of the ledger");
    // The payer's money leaves by another way: 10.00 is all acct-A holds now.
    let drain = TransferRequest {
        attempt: Attempt::reserved("drain"),
        payment_id: PaymentId::generate(),
        from_account: AccountId::parse("acct-A").unwrap(),
        to_account: AccountId::parse("acct-B").unwrap(),
        amount: paygate::domain::money::Money::parse("999990.00", Currency::parse("KES").unwrap()).unwrap(),
        memo: None,
        principal_sub: "someone-else".into(),
        principal_user: None,
        guards: Guards::default(),
    };
    r.ledger.ledger_transfer(drain, r.clock.now()).await.unwrap();
    r.proxy.set_mode(Mode::PassThrough).await;
    r.clock.advance(120);
    let refused = call(c, "create_payment", pay("refused-late", "40.00")).await;
    assert_eq!(code(&refused), "INSUFFICIENT_FUNDS", "{refused:?}");
    let store = &r.app.running.store;
    let all = store.rail_since(RailPage { since: 0, after_seq: 0, limit: 100 }).await.unwrap();
    let rec = all.into_iter().map(|(_, rec)| rec).find(|rec| rec.amount_minor == 4_000).unwrap();
    assert_eq!(rec.state, RailState::Failed, "{rec:?}");
    assert!(rec.reason.as_deref().is_some_and(|why| why.contains("insufficient funds")), "{rec:?}");
    assert!(trail_says(&r.app, rec.id.as_str(), paygate::backend::journal::ANSWERED, "FAILED").await);
    let posts = r.proxy.seen().iter().filter(|s| s.method == "POST").count();
    assert_eq!(code(&call(c, "create_payment", pay("refused-late", "40.00")).await), "INSUFFICIENT_FUNDS");
    assert_eq!(r.proxy.seen().iter().filter(|s| s.method == "POST").count(), posts, "answered, not sent again");
    assert_eq!(ledger_payments(&r).await.len(), 1, "the drain alone");
    r.app.stop().await;
}

/// Reconciliation names each way the gateway's record and the ledger's can disagree about money:
/// a payment the gateway recorded as paid (or pending) that the ledger does not hold; one sent,
/// never confirmed and not held past the lease (the retry re-sends it); one held for another
/// amount. A record still within its lease is left alone.
#[tokio::test]
async fn reconciliation_names_payments_the_ledger_lacks_or_holds_for_another_amount() {
    use paygate::domain::payment::{Guards, TransferRequest};
    let r = rig().await;
    let c = &r.client;
    let admin = connect(&r.app.url, &r.app.token("ops-bot", "payments:integrity"), Era::Modern).await;
    let store = &r.app.running.store;
    let now = r.clock.now();
    // Recorded as paid, and as pending, by the gateway; never made at the ledger.
    let (paid_only_here, pending_only_here) = (PaymentId::generate(), PaymentId::generate());
    for (id, key, state) in [
        (&paid_only_here, "only-here-1", RailState::Succeeded),
        (&pending_only_here, "only-here-2", RailState::Pending),
    ] {
        store.rail_open(rail_record(id, key, "acct-A", "acct-B", 1_500), Guards::default(), None, now).await.unwrap();
        let moved = RailMove { id, from: &[RailState::Submitting], to: state, update: RailUpdate::default() };
        assert!(store.rail_transition(moved, now).await.unwrap().is_some());
    }
    // Held at the ledger for 30.00, recorded by the gateway as 31.00.
    let other_amount = PaymentId::generate();
    let at_ledger = TransferRequest {
        attempt: Attempt::reserved("other-amount"),
        payment_id: other_amount.clone(),
        from_account: AccountId::parse("acct-A").unwrap(),
        to_account: AccountId::parse("acct-B").unwrap(),
        amount: paygate::domain::money::Money::parse("30.00", Currency::parse("KES").unwrap()).unwrap(),
        memo: None,
        principal_sub: "dev-agent".into(),
        principal_user: None,
        guards: Guards::default(),
    };
    r.ledger.ledger_transfer(at_ledger, now).await.unwrap();
    store
        .rail_open(rail_record(&other_amount, "other-amount", "acct-A", "acct-B", 3_100), Guards::default(), None, now)
        .await
        .unwrap();
    let moved = RailMove {
        id: &other_amount,
        from: &[RailState::Submitting],
        to: RailState::Succeeded,
        update: RailUpdate::default(),
    };
    assert!(store.rail_transition(moved, now).await.unwrap().is_some());
    // Sent, its answer a 500 from in front of the ledger: never made there.
    r.proxy.set_mode(Mode::Status(500)).await;
    assert_eq!(code(&call(c, "create_payment", pay("never-made", "7.00")).await), "OUTCOME_UNKNOWN");
    r.proxy.set_mode(Mode::PassThrough).await;
    let never_made = store
        .rail_since(RailPage { since: 0, after_seq: 0, limit: 100 })
        .await
        .unwrap()
        .into_iter()
        .map(|(_, rec)| rec)
        .find(|rec| rec.amount_minor == 700)
        .unwrap();

    let kinds_of = |report: &Value, id: &PaymentId| -> Vec<String> {
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["payment_id"] == id.as_str())
            .map(|f| f["kind"].as_str().unwrap().to_string())
            .collect()
    };
    let young = ok(&call(&admin, "reconcile", json!({})).await).clone();
    assert!(kinds_of(&young, &never_made.id).is_empty(), "within its lease it is the retry's to settle: {young}");
    r.clock.advance(300);
    let report = ok(&call(&admin, "reconcile", json!({})).await).clone();
    assert_eq!(kinds_of(&report, &paid_only_here), ["missing_in_backend"], "{report}");
    assert_eq!(kinds_of(&report, &pending_only_here), ["missing_in_backend"], "{report}");
    assert_eq!(kinds_of(&report, &other_amount), ["amount_mismatch"], "{report}");
    assert_eq!(kinds_of(&report, &never_made.id), ["outcome_unknown"], "{report}");
    let detail = |id: &PaymentId| {
        report["findings"].as_array().unwrap().iter().find(|f| f["payment_id"] == id.as_str()).unwrap()["detail"]
            .as_str()
            .unwrap()
            .to_string()
    };
    assert!(detail(&paid_only_here).contains("recorded succeeded"), "{report}");
    assert!(detail(&pending_only_here).contains("recorded pending"), "{report}");
    assert!(detail(&other_amount).contains("31.00") && detail(&other_amount).contains("30.00"), "{report}");
    assert!(detail(&never_made.id).contains("re-sends it"), "{report}");
    assert_eq!(report["problems"].as_i64(), Some(4), "{report}");
    // Reconciliation looks back over its window (jobs.reconcile_window_secs, a day by default):
    // past it, these records are no longer checked.
    r.clock.advance(86_400);
    let admin = connect(&r.app.url, &r.app.token("ops-bot", "payments:integrity"), Era::Modern).await;
    let later = ok(&call(&admin, "reconcile", json!({})).await).clone();
    for id in [&paid_only_here, &pending_only_here, &other_amount, &never_made.id] {
        assert!(kinds_of(&later, id).is_empty(), "{id} is older than the window: {later}");
    }
    r.app.stop().await;
}

/// The journal itself holds one key to one request, whatever the gateway's idempotency records
/// say (a database writer can delete those): a key its record holds for a payment, reused with
/// another payee, amount or currency, or for a refund, is refused as reused — and nothing more
/// reaches the ledger.
#[tokio::test]
async fn a_key_the_journal_holds_is_never_sent_again_for_another_request() {
    use paygate::backend::PaymentBackend;
    use paygate::domain::error::BackendError;
    use paygate::domain::money::Money;
    use paygate::domain::payment::{Guards, RefundRequest, TransferRequest};
    let r = rig().await;
    let (journal, _gateway_store) = journal_over_proxy(&r);
    let kes = Currency::parse("KES").unwrap();
    let request = |to: &str, amount: Money| TransferRequest {
        attempt: Attempt::reserved("k-held"),
        payment_id: PaymentId::generate(),
        from_account: AccountId::parse("acct-A").unwrap(),
        to_account: AccountId::parse(to).unwrap(),
        amount,
        memo: None,
        principal_sub: "dev-agent".into(),
        principal_user: None,
        guards: Guards::default(),
    };
    let paid = journal.transfer(request("acct-B", Money::parse("10.00", kes).unwrap())).await.unwrap();
    let posts = || r.proxy.seen().iter().filter(|s| s.method == "POST").count();
    assert_eq!(posts(), 1);
    for other in [
        request("acct-C", Money::parse("10.00", kes).unwrap()),
        request("acct-B", Money::parse("10.01", kes).unwrap()),
        request("acct-B", Money::parse("10.00", Currency::parse("USD").unwrap()).unwrap()),
    ] {
        let shown = format!("{} {}", other.to_account, other.amount);
        assert_eq!(journal.transfer(other).await.unwrap_err(), BackendError::IdempotencyKeyReused, "{shown}");
    }
    let refund = RefundRequest {
        attempt: Attempt::reserved("k-held"),
        refund_id: PaymentId::generate(),
        payment_id: paid.id.clone(),
        amount_minor: Some(100),
        reason: None,
        principal_sub: "dev-agent".into(),
        principal_user: None,
        guards: Guards::default(),
        autonomous_cap_minor: None,
    };
    assert_eq!(journal.refund(refund).await.unwrap_err(), BackendError::IdempotencyKeyReused);
    assert_eq!(posts(), 1, "nothing more reached the ledger");
    // The same request under its key is its payment, replayed.
    let again = journal.transfer(request("acct-B", Money::parse("10.00", kes).unwrap())).await.unwrap();
    assert_eq!((again.id, posts()), (paid.id, 1));
    r.app.stop().await;
}

/// The poll job settles an open record from the ledger's word only when the ledger holds that
/// payment as recorded: held for another amount, as a refund of another payment, or in another
/// currency, it stays open for reconciliation to name, never settled to what the ledger holds.
#[tokio::test]
async fn the_poll_job_never_settles_a_record_the_ledger_holds_differently() {
    use paygate::domain::payment::{Guards, RefundRequest, TransferRequest};
    let r = rig().await;
    let store = &r.app.running.store;
    let now = r.clock.now();
    let kes = Currency::parse("KES").unwrap();
    let at_ledger = |id: &PaymentId, key: &str, amount: &str| TransferRequest {
        attempt: Attempt::reserved(key),
        payment_id: id.clone(),
        from_account: AccountId::parse("acct-A").unwrap(),
        to_account: AccountId::parse("acct-B").unwrap(),
        amount: paygate::domain::money::Money::parse(amount, kes).unwrap(),
        memo: None,
        principal_sub: "dev-agent".into(),
        principal_user: None,
        guards: Guards::default(),
    };
    // Held for 20.00; recorded (its answer lost) as 25.00.
    let other_amount = PaymentId::generate();
    r.ledger.ledger_transfer(at_ledger(&other_amount, "held-1", "20.00"), now).await.unwrap();
    // Held as a refund of another payment; recorded as a payment.
    let original = PaymentId::generate();
    r.ledger.ledger_transfer(at_ledger(&original, "held-2", "50.00"), now).await.unwrap();
    let as_refund = PaymentId::generate();
    let refund = RefundRequest {
        attempt: Attempt::reserved("held-3"),
        refund_id: as_refund.clone(),
        payment_id: original.clone(),
        amount_minor: Some(1_000),
        reason: None,
        principal_sub: "dev-agent".into(),
        principal_user: None,
        guards: Guards::default(),
        autonomous_cap_minor: None,
    };
    r.ledger.ledger_refund(refund, now).await.unwrap();
    // Held for 30.00 in KES; recorded as 30.00 in USD.
    let other_currency = PaymentId::generate();
    r.ledger.ledger_transfer(at_ledger(&other_currency, "held-4", "30.00"), now).await.unwrap();
    let records = [
        rail_record(&other_amount, "held-1", "acct-A", "acct-B", 2_500),
        // A refund, as held, but of another payment.
        paygate::domain::rail::RailPayment {
            kind: PaymentKind::Refund,
            refund_of: Some(PaymentId::generate()),
            ..rail_record(&as_refund, "held-3", "acct-B", "acct-A", 1_000)
        },
        paygate::domain::rail::RailPayment {
            currency: Currency::parse("USD").unwrap(),
            ..rail_record(&other_currency, "held-4", "acct-A", "acct-B", 3_000)
        },
    ];
    for rec in records {
        let id = rec.id.clone();
        store.rail_open(rec, Guards::default(), None, now).await.unwrap();
        let lost =
            RailMove { id: &id, from: &[RailState::Submitting], to: RailState::Unknown, update: RailUpdate::default() };
        assert!(store.rail_transition(lost, now).await.unwrap().is_some());
    }
    r.clock.advance(120);
    assert_eq!(r.app.running.gateway.poll_rails(60, std::time::Duration::from_secs(10)).await, 0);
    for id in [&other_amount, &as_refund, &other_currency] {
        assert_eq!(store.rail_get(id).await.unwrap().unwrap().state, RailState::Unknown, "{id}");
    }
    r.app.stop().await;
}
