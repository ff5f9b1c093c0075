//! The M-Pesa rail end to end: an MCP agent asks for a collection, the local Daraja fake receives the
//! STK push and calls back, and the gateway settles, refuses or keeps the payment pending.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;
#[path = "common/daraja.rs"]
mod daraja;

use std::sync::Arc;

use common::*;
use daraja::{DarajaFake, FakeConfig, PushMode, QueryAnswer, SANDBOX_PASSKEY};
use paygate::clock::{Clock, ManualClock, SystemClock};
use serde_json::{Value, json};

const SECRET: &str = "cb-secret-0123456789abcdefghij";
const SCOPES: &str = "payments:read payments:collect payments:refund payments:integrity";

/// `tool_limits`: the dev profile's `tool_calls_per_minute`. A second profile, "other-agent", may
/// use acct-A only (it sees no collection).
fn overlay_with_limits(fake: &DarajaFake, extra: &str, tool_limits: &str) -> String {
    format!(
        r#"
[mpesa]
enabled = true
base_url = "{base}"
consumer_key = "fake-consumer-key"
consumer_secret = "fake-consumer-secret"
short_code = "174379"
passkey = "{SANDBOX_PASSKEY}"
callback_secret = "{SECRET}"
request_timeout_ms = 500
{extra}

[jobs]
enabled = false

[policy]
default_profile = "dev"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent"]
client_ids = []
allowed_accounts = ["acct-A", "acct-B", "mpesa-collections"]
autonomous_limit = {{ KES = "1000.00" }}
daily_limit = {{ KES = "100000.00" }}
daily_payments_max = 1000
calls_per_minute = 600
tool_calls_per_minute = {tool_limits}
issuer = ""

[[policy.profiles]]
name = "other"
subjects = ["other-agent"]
client_ids = []
allowed_accounts = ["acct-A"]
autonomous_limit = {{ KES = "1000.00" }}
daily_limit = {{ KES = "100000.00" }}
daily_payments_max = 1000
calls_per_minute = 600
tool_calls_per_minute = {{}}
issuer = ""
"#,
        base = fake.base_url()
    )
}

struct Rig {
    app: TestApp,
    fake: DarajaFake,
    client: Client,
    _dir: tempfile::TempDir,
}

async fn rig_with(extra: &str, overrides: &[(&str, &str)], clock: Arc<dyn Clock>) -> Rig {
    rig_limited(extra, "{}", overrides, clock).await
}

async fn rig_limited(extra: &str, tool_limits: &str, overrides: &[(&str, &str)], clock: Arc<dyn Clock>) -> Rig {
    let fake = DarajaFake::start(FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(dir.path(), &overlay_with_limits(&fake, extra, tool_limits), overrides, clock).await;
    let client = connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    Rig { app, fake, client, _dir: dir }
}

async fn rig() -> Rig {
    rig_with("", &[], Arc::new(SystemClock)).await
}

/// 32 identical collections at once, with the wait for a key in flight on: Daraja receives one
/// STK push (the customer is prompted once), and the 31 other calls replay it.
#[tokio::test]
async fn concurrent_duplicate_collections_push_once() {
    let r = rig_with("", &[("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "10000")], Arc::new(SystemClock)).await;
    let agent = Arc::new(connect(&r.app.url, &r.app.token("dev-agent", SCOPES), Era::Modern).await);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let agent = agent.clone();
        set.spawn(async move { call(&agent, "request_mpesa_payment", collect("dup-collect", "150")).await });
    }
    let (mut ids, mut replayed) = (std::collections::BTreeSet::new(), 0);
    while let Some(res) = set.join_next().await {
        let res = res.unwrap();
        ids.insert(ok(&res)["payment_id"].as_str().unwrap().to_string());
        replayed += usize::from(ok(&res)["replayed"] == true);
    }
    assert_eq!((ids.len(), replayed), (1, 31), "one collection, 31 replays");
    assert_eq!(r.fake.push_requests(), 1, "one STK push: the customer is prompted once");
    let metrics = reqwest::get(format!("{}/metrics", r.app.base())).await.unwrap().text().await.unwrap();
    let waits = metrics.lines().find_map(|l| l.strip_prefix("paygate_idempotency_key_waits_total ")).unwrap();
    assert!(waits.parse::<u64>().unwrap() > 0, "the duplicates ran at once: some waited for the key in flight");
    r.app.stop().await;
}

/// Issue 53: the console's Health page said M-Pesa was "ok" while its circuit was open and every
/// push was refused. The health check and /metrics now show each endpoint's circuit.
#[tokio::test]
async fn an_open_circuit_shows_on_the_health_page_and_in_metrics_per_endpoint() {
    let r = rig_with("retries_max = 0\nbreaker_failures_max = 2", &[], Arc::new(SystemClock)).await;
    let ops = r.app.operator_token("ops", "payments:audit");
    let health = async || operator(&r.app, reqwest::Method::GET, "/operator/v1/health", &ops, None).await.1;
    let rail = |h: &Value| h["checks"].as_array().unwrap().iter().find(|c| c["name"] == "rail").unwrap().clone();
    assert_eq!(rail(&health().await)["ok"], true);
    r.fake.fail_next(2);
    for i in 0..2 {
        let res = call(&r.client, "request_mpesa_payment", collect(&format!("down-{i}"), "10")).await;
        assert_eq!(err(&res)["code"], "BACKEND_UNAVAILABLE", "{res:?}");
    }
    let h = health().await;
    assert_eq!((h["status"].clone(), rail(&h)["ok"].clone()), (json!("degraded"), json!(false)), "{h}");
    let detail = rail(&h)["detail"].as_str().unwrap().to_string();
    assert!(
        detail.contains("circuit open") && detail.contains("stk_push") && !detail.contains("stk_query"),
        "{detail}"
    );
    let metrics = reqwest::get(format!("{}/metrics", r.app.base())).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("paygate_rail_breaker_open{rail=\"mpesa\",endpoint=\"stk_push\"} 1"), "{metrics}");
    assert!(metrics.contains("paygate_rail_breaker_open{rail=\"mpesa\",endpoint=\"stk_query\"} 0"), "{metrics}");
    r.app.stop().await;
}

fn collect(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "phone_number": "0712 345 678", "amount": amount,
           "account_reference": "INV-1001", "description": "Order 1001"})
}

async fn payment(c: &Client, id: &str) -> Value {
    ok(&call(c, "get_payment", json!({"payment_id": id})).await).clone()
}

fn callback_url(app: &TestApp, secret: &str) -> String {
    format!("{}/callbacks/mpesa/stk/{secret}", app.base())
}

async fn audit_codes(app: &TestApp) -> Vec<String> {
    let records = app.running.store.audit_list(None, 500).await.unwrap();
    records.iter().filter(|r| r.tool == "mpesa_callback").filter_map(|r| r.code.clone()).collect()
}

#[tokio::test]
async fn a_collection_is_pending_until_the_callback_settles_it() {
    let r = rig().await;
    let c = &r.client;
    let first = call(c, "request_mpesa_payment", collect("order-1001", "150")).await;
    let p = ok(&first).clone();
    assert_eq!((p["status"].as_str(), p["replayed"].as_bool()), (Some("pending"), Some(false)));
    assert_eq!(p["amount"], "150.00");
    assert_eq!(p["from_account"], "mpesa-254712345678");
    assert_eq!(p["to_account"], "mpesa-collections");
    let pushes = r.fake.pushes();
    assert_eq!(pushes.len(), 1);
    let push = &pushes[0];
    assert_eq!((push.phone.as_str(), push.amount), ("254712345678", 150));
    assert_eq!((push.account_reference.as_str(), push.description.as_str()), ("INV-1001", "Order 1001"));
    assert!(push.callback_url.ends_with(&format!("/callbacks/mpesa/stk/{SECRET}")), "{}", push.callback_url);

    let id = p["payment_id"].as_str().unwrap();
    let pending = payment(c, id).await;
    assert_eq!(pending["status"], "pending");
    assert!(pending.get("receipt").is_none(), "no receipt before it settles");

    // The agent retries (say the response was lost): the same payment, no second prompt.
    let again = call(c, "request_mpesa_payment", collect("order-1001", "150")).await;
    assert_eq!((ok(&again)["payment_id"].as_str(), ok(&again)["replayed"].as_bool()), (Some(id), Some(true)));
    assert_eq!(r.fake.push_requests(), 1);

    // The customer enters their PIN: Daraja calls back.
    assert_eq!(r.fake.callback(&push.checkout_request_id, 0).await, 200);
    let settled = payment(c, id).await;
    assert_eq!(settled["status"], "succeeded");
    let receipt = &settled["receipt"];
    assert_eq!(receipt["rail"], "mpesa");
    assert_eq!(receipt["checkout_request_id"], push.checkout_request_id.as_str());
    let number = receipt["reference"].as_str().unwrap();
    assert!(!number.is_empty() && number.chars().all(|ch| ch.is_ascii_alphanumeric()), "{number}");
    assert_eq!(receipt["phone"], "25471****678", "the phone is masked");
    // Collections cannot be refunded here (that would be an M-Pesa B2C payment): said plainly.
    let refund = call(c, "refund_payment", json!({"operation_id": "refund-1", "payment_id": id})).await;
    assert_eq!(code(&refund), "INVALID_ARGUMENT");
    assert!(err(&refund)["message"].as_str().unwrap().contains("M-Pesa"));
    // A replay now shows where it stands.
    let replay = call(c, "request_mpesa_payment", collect("order-1001", "150")).await;
    assert_eq!(ok(&replay)["status"], "succeeded");

    // A second customer cancels the prompt.
    let second = call(c, "request_mpesa_payment", collect("order-1002", "20.00")).await;
    let id2 = ok(&second)["payment_id"].as_str().unwrap().to_string();
    let push2 = r.fake.pushes()[1].clone();
    // (The fake's callback() also makes its STK query answer the same: a failure is confirmed too.)
    assert_eq!(r.fake.callback(&push2.checkout_request_id, 1032).await, 200);
    let failed = payment(c, &id2).await;
    assert_eq!(failed["status"], "failed");
    assert!(failed.get("receipt").is_none());

    // Today's summary counts both, by status.
    let s = ok(&call(c, "get_payment_summary", json!({"currency": "KES"})).await).clone();
    let line = |status: &str| s["totals"].as_array().unwrap().iter().find(|l| l["status"] == status).cloned();
    let ok_line = line("succeeded").expect("a succeeded line");
    assert_eq!((ok_line["count"].as_i64(), ok_line["total"].as_str()), (Some(1), Some("150.00")));
    let failed_line = line("failed").expect("a failed line");
    assert_eq!((failed_line["count"].as_i64(), failed_line["total"].as_str()), (Some(1), Some("20.00")));
    assert_eq!(audit_codes(&r.app).await.iter().filter(|c| *c == "SUCCEEDED" || *c == "FAILED").count(), 2);
    r.app.assert_secrets_not_logged();
    assert_not_logged(&[SECRET, "fake-consumer-secret", SANDBOX_PASSKEY]);
    r.app.stop().await;
}

#[tokio::test]
async fn an_stk_push_whose_answer_is_lost_is_never_sent_again() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = rig_with("", &[("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "0")], clock.clone()).await;
    let c = &r.client;
    for (op, mode) in [("lost-1", PushMode::Hang), ("lost-2", PushMode::Fail500)] {
        r.fake.set_push_mode(mode);
        let before = r.fake.push_requests();
        let first = call(c, "request_mpesa_payment", collect(op, "300")).await;
        assert_eq!(code(&first), "OUTCOME_UNKNOWN", "{mode:?}");
        assert_eq!(err(&first)["retryable"], true);
        assert_eq!(r.fake.push_requests(), before + 1);
        // Just made, it is the poll job's to settle, not yet a person's: reconciliation names only
        // what has gone unanswered for longer than the lease (here lost-1, at lost-2's turn).
        let young = ok(&call(c, "reconcile", json!({})).await).clone();
        let named = young["findings"].as_array().unwrap().iter().filter(|f| f["kind"] == "outcome_unknown").count();
        assert_eq!(named, usize::from(op == "lost-2"), "{young}");
        r.fake.set_push_mode(PushMode::Accept);
        // While the first attempt's lease lasts, a retry is told to wait.
        let busy = call(c, "request_mpesa_payment", collect(op, "300")).await;
        assert_eq!(code(&busy), "OPERATION_IN_PROGRESS");
        // After it, the retry takes the operation over, finds the push was sent, and does not send another.
        clock.advance(120);
        let retry = call(c, "request_mpesa_payment", collect(op, "300")).await;
        assert_eq!(code(&retry), "OUTCOME_UNKNOWN");
        assert_eq!(r.fake.push_requests(), before + 1, "{mode:?}: no second STK push");
    }
    // Reconciliation names both for a human.
    clock.advance(120);
    let rec = ok(&call(c, "reconcile", json!({})).await).clone();
    let unknown = rec["findings"].as_array().unwrap().iter().filter(|f| f["kind"] == "outcome_unknown").count();
    assert_eq!(unknown, 2, "{rec}");
    r.app.stop().await;
}

/// A push Daraja refuses (its 400 with an error code) charged nothing: the agent is told M-Pesa
/// refused it, with Daraja's code, and the record is given up (nothing held against the day's
/// limits); a retry of the operation replays the refusal unsent, and a new operation pushes once.
#[tokio::test]
async fn a_push_daraja_refuses_charges_nothing_and_a_new_operation_pushes_once() {
    let r = rig_with("", &[("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "0")], Arc::new(SystemClock)).await;
    let c = &r.client;
    r.fake.set_push_mode(PushMode::Reject);
    let refused = call(c, "request_mpesa_payment", collect("refused-1", "300")).await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused:?}");
    let said = err(&refused)["message"].as_str().unwrap().to_string();
    assert!(
        said.contains("M-Pesa refused the STK push (error 400.002.02)") && said.contains("nothing was charged"),
        "{said}"
    );
    assert!(r.fake.pushes().is_empty());
    let store = &r.app.running.store;
    let open = store.rail_since(paygate::domain::rail::RailPage { since: 0, after_seq: 0, limit: 100 }).await.unwrap();
    assert!(open.is_empty(), "the record was given up: {open:?}");
    r.fake.set_push_mode(PushMode::Accept);
    // The refusal is the operation's answer (a retry replays it, unsent); a new operation pushes.
    let replayed = call(c, "request_mpesa_payment", collect("refused-1", "300")).await;
    assert_eq!((code(&replayed).as_str(), err(&replayed)["replayed"].as_bool()), ("INVALID_ARGUMENT", Some(true)));
    assert_eq!(r.fake.push_requests(), 1);
    let sent = call(c, "request_mpesa_payment", collect("refused-2", "300")).await;
    assert_eq!(ok(&sent)["status"], "pending", "{sent:?}");
    assert_eq!((r.fake.push_requests(), r.fake.pushes().len()), (2, 1));
    r.app.stop().await;
}

#[tokio::test]
async fn callbacks_that_do_not_match_are_refused_audited_and_change_nothing() {
    let r = rig().await;
    let c = &r.client;
    let p = ok(&call(c, "request_mpesa_payment", collect("cb-1", "150")).await).clone();
    let id = p["payment_id"].as_str().unwrap().to_string();
    let checkout = r.fake.pushes()[0].checkout_request_id.clone();
    let good = r.fake.callback_body(&checkout, 0);
    let url = callback_url(&r.app, SECRET);
    let http = reqwest::Client::new();

    let mut wrong_amount = good.clone();
    wrong_amount["Body"]["stkCallback"]["CallbackMetadata"]["Item"][0]["Value"] = json!(1.0);
    // A success that does not say what was paid: M-Pesa's always does, so one without is refused.
    let mut no_amount = good.clone();
    no_amount["Body"]["stkCallback"]["CallbackMetadata"]["Item"].as_array_mut().unwrap().remove(0);
    let mut wrong_phone = good.clone();
    wrong_phone["Body"]["stkCallback"]["CallbackMetadata"]["Item"][4]["Value"] = json!(254700000001u64);
    let mut unknown_checkout = good.clone();
    unknown_checkout["Body"]["stkCallback"]["CheckoutRequestID"] = json!("ws_CO_000000000000000000");
    let mut unknown_code = r.fake.callback_body(&checkout, 1032);
    unknown_code["Body"]["stkCallback"]["ResultCode"] = json!(7777);

    let cases: Vec<(&str, String, Option<Value>, u16)> = vec![
        ("missing secret", format!("{}/callbacks/mpesa/stk", r.app.base()), Some(good.clone()), 404),
        ("wrong secret", callback_url(&r.app, "not-the-secret-000000000000"), Some(good.clone()), 404),
        ("unknown checkout", url.clone(), Some(unknown_checkout), 404),
        ("amount mismatch", url.clone(), Some(wrong_amount), 422),
        ("amount missing", url.clone(), Some(no_amount), 422),
        ("phone mismatch", url.clone(), Some(wrong_phone), 422),
        ("malformed JSON", url.clone(), None, 400),
        ("unknown result code", url.clone(), Some(unknown_code), 200),
    ];
    for (what, to, body, status) in cases {
        let req = http.post(&to).header("content-type", "application/json");
        let req = match body {
            Some(b) => req.json(&b),
            None => req.body("{\"Body\": {\"stkCallback\": "),
        };
        let resp = req.send().await.unwrap();
        assert_eq!(resp.status().as_u16(), status, "{what}");
        assert_eq!(payment(c, &id).await["status"], "pending", "{what}: nothing settled");
    }
    assert_eq!(
        audit_codes(&r.app).await.iter().rev().cloned().collect::<Vec<_>>(),
        [
            // The missing and the wrong secret: refusals before the body is read are audited at
            // most once a minute (the next audit record counts the rest).
            "BAD_SECRET",
            "UNKNOWN_CHECKOUT",
            "AMOUNT_MISMATCH",
            "AMOUNT_MISMATCH",
            "PHONE_MISMATCH",
            "MALFORMED",
            "UNRECOGNISED_RESULT"
        ],
        "every refusal and the unknown code are audited, in order"
    );

    // The real callback (which Daraja's query confirms) settles it; a duplicate and a late contrary
    // one are refused.
    r.fake.set_query(&checkout, QueryAnswer::Result(0, "processed successfully".into()));
    assert_eq!(http.post(&url).json(&good).send().await.unwrap().status(), 200);
    assert_eq!(payment(c, &id).await["status"], "succeeded");
    assert_eq!(http.post(&url).json(&good).send().await.unwrap().status(), 409, "duplicate");
    let late = r.fake.callback_body(&checkout, 1032);
    assert_eq!(http.post(&url).json(&late).send().await.unwrap().status(), 409, "late");
    assert_eq!(payment(c, &id).await["status"], "succeeded", "terminal states never change");
    let codes = audit_codes(&r.app).await;
    assert_eq!(codes.iter().filter(|c| *c == "DUPLICATE_OR_LATE").count(), 2, "{codes:?}");
    r.app.stop().await;
}

#[tokio::test]
async fn callbacks_from_addresses_not_allowed_are_refused() {
    let r = rig_with("callback_allowed_ips = [\"10.9.9.9\"]", &[], Arc::new(SystemClock)).await;
    let p = ok(&call(&r.client, "request_mpesa_payment", collect("ip-1", "150")).await).clone();
    let checkout = r.fake.pushes()[0].checkout_request_id.clone();
    assert_eq!(r.fake.callback(&checkout, 0).await, 403);
    assert_eq!(payment(&r.client, p["payment_id"].as_str().unwrap()).await["status"], "pending");
    assert_eq!(audit_codes(&r.app).await, ["SOURCE_NOT_ALLOWED"]);
    r.app.stop().await;
}

#[tokio::test]
async fn the_scheduled_query_settles_pending_pushes_and_the_callback_adds_the_receipt() {
    let r = rig().await;
    let c = &r.client;
    let a = ok(&call(c, "request_mpesa_payment", collect("poll-1", "100")).await).clone();
    let b = ok(&call(c, "request_mpesa_payment", collect("poll-2", "100")).await).clone();
    let d = ok(&call(c, "request_mpesa_payment", collect("poll-3", "100")).await).clone();
    let pushes = r.fake.pushes();
    r.fake.set_query(
        &pushes[0].checkout_request_id,
        QueryAnswer::Result(1037, "DS timeout user cannot be reached".into()),
    );
    r.fake.set_query(&pushes[1].checkout_request_id, QueryAnswer::Result(0, "processed successfully".into()));
    // pushes[2] is still being processed.
    let budget = std::time::Duration::from_secs(10);
    assert_eq!(r.app.running.gateway.poll_rails(0, budget).await, 2);
    let status = |p: Value| p["status"].as_str().unwrap().to_string();
    assert_eq!(status(payment(c, a["payment_id"].as_str().unwrap()).await), "failed");
    assert_eq!(status(payment(c, d["payment_id"].as_str().unwrap()).await), "pending");
    // Daraja's query says it succeeded (a lost callback cannot leave a paid collection pending);
    // the receipt number comes with the callback, when it arrives.
    let paid = payment(c, b["payment_id"].as_str().unwrap()).await;
    assert_eq!(status(paid.clone()), "succeeded");
    assert!(paid.get("receipt").is_none(), "{paid}");
    assert_eq!(r.fake.callback(&pushes[1].checkout_request_id, 0).await, 200);
    let paid = payment(c, b["payment_id"].as_str().unwrap()).await;
    assert!(paid["receipt"]["reference"].as_str().is_some_and(|n| !n.is_empty()), "{paid}");
    // Only a receipt can be added: a contrary late callback is still refused.
    assert_eq!(r.fake.callback(&pushes[1].checkout_request_id, 1032).await, 409);
    assert_eq!(status(payment(c, b["payment_id"].as_str().unwrap()).await), "succeeded");
    r.app.stop().await;
}

#[tokio::test]
async fn a_success_callback_is_confirmed_by_query_before_it_credits() {
    let r = rig().await;
    let c = &r.client;
    let http = reqwest::Client::new();
    let url = callback_url(&r.app, SECRET);
    let forged = ok(&call(c, "request_mpesa_payment", collect("confirm-1", "100")).await).clone();
    let slow = ok(&call(c, "request_mpesa_payment", collect("confirm-2", "100")).await).clone();
    let pushes = r.fake.pushes();
    // A success callback that Daraja's own query contradicts (the customer cancelled): refused, and
    // the query's answer settles it.
    r.fake.set_query(&pushes[0].checkout_request_id, QueryAnswer::Result(1032, "Request cancelled by user".into()));
    let body = r.fake.callback_body(&pushes[0].checkout_request_id, 0);
    assert_eq!(http.post(&url).json(&body).send().await.unwrap().status(), 422);
    assert_eq!(payment(c, forged["payment_id"].as_str().unwrap()).await["status"], "failed");
    // A success callback Daraja cannot confirm yet: acknowledged, kept pending with its receipt,
    // and settled by the scheduled query.
    let body = r.fake.callback_body(&pushes[1].checkout_request_id, 0);
    assert_eq!(http.post(&url).json(&body).send().await.unwrap().status(), 200);
    let id = slow["payment_id"].as_str().unwrap();
    assert_eq!(payment(c, id).await["status"], "pending");
    r.fake.set_query(&pushes[1].checkout_request_id, QueryAnswer::Result(0, "processed successfully".into()));
    assert_eq!(r.app.running.gateway.poll_rails(0, std::time::Duration::from_secs(10)).await, 1);
    let settled = payment(c, id).await;
    assert_eq!(settled["status"], "succeeded");
    let receipt = body["Body"]["stkCallback"]["CallbackMetadata"]["Item"][1]["Value"].clone();
    assert_eq!(settled["receipt"]["reference"], receipt, "the callback's receipt was kept");
    let codes = audit_codes(&r.app).await;
    assert!(
        codes.contains(&"NOT_CONFIRMED".to_string()) && codes.contains(&"AWAITING_CONFIRMATION".to_string()),
        "{codes:?}"
    );
    r.app.stop().await;
}

/// A retry that finds the record an earlier attempt opened (it pushed, then crashed or outlived its
/// lease) never pushes again.
#[tokio::test]
async fn an_attempt_that_died_after_pushing_is_never_pushed_again() {
    use paygate::backend::mpesa::{Collection, MpesaRail, daraja};
    use paygate::backend::rail::RailOrder;
    let fake = DarajaFake::start(FakeConfig::default()).await;
    let store: Arc<dyn paygate::store::Store> =
        Arc::new(paygate::store::sqlite::SqliteStore::open_in_memory().unwrap());
    let clock: Arc<dyn Clock> = Arc::new(SystemClock);
    let cfg = fake.client_config("https://gateway.example/callbacks/mpesa/stk/secret");
    let client = daraja::DarajaClient::new(cfg, clock.clone()).unwrap();
    let rail = Arc::new(MpesaRail::new(
        client,
        store.clone(),
        clock,
        paygate::domain::ids::AccountId::parse("mpesa-collections").unwrap(),
    ));
    let order = RailOrder {
        idempotency_key: "key-1".into(),
        family_key: None,
        payment_id: paygate::domain::ids::PaymentId::generate(),
        principal_sub: "dev-agent".into(),
        principal_user: None,
        guards: Default::default(),
        audit: None,
    };
    let collection = Collection {
        order: order.clone(),
        phone: daraja::normalize_phone("0712345678").unwrap(),
        amount: paygate::domain::money::Money::parse("100", paygate::domain::money::Currency::parse("KES").unwrap())
            .unwrap(),
        account_reference: "INV-1".into(),
        description: "Order 1".into(),
    };
    // Attempt 1 pushes and dies before recording Daraja's answer.
    fake.set_push_mode(PushMode::Hang);
    let first = tokio::spawn({
        let (rail, c) = (rail.clone(), collection.clone());
        async move { rail.collect(c).await }
    });
    fake.wait_for_pushes(1).await;
    first.abort();
    let _ = first.await;
    // Attempt 2 (the agent's retry, same key): no second push.
    fake.set_push_mode(PushMode::Accept);
    let order = RailOrder { payment_id: paygate::domain::ids::PaymentId::generate(), ..order };
    let retry = Collection { order, ..collection };
    assert!(matches!(rail.collect(retry).await, Err(paygate::domain::error::BackendError::OutcomeUnknown(_))));
    assert_eq!(fake.push_requests(), 1, "exactly one STK push");
    let rec = store.rail_by_key("key-1").await.unwrap().unwrap();
    assert_eq!(rec.state, paygate::domain::rail::RailState::Unknown);
}

#[tokio::test]
async fn policy_and_input_checks_come_before_any_push() {
    let r = rig().await;
    let c = &r.client;
    let over = call(c, "request_mpesa_payment", collect("big-1", "5000")).await;
    assert_eq!(code(&over), "APPROVAL_REQUIRED");
    let cents = call(c, "request_mpesa_payment", collect("cents-1", "150.50")).await;
    assert_eq!(code(&cents), "INVALID_ARGUMENT");
    let mut bad_phone = collect("phone-1", "150");
    bad_phone["phone_number"] = json!("+1 555 0100");
    assert_eq!(code(&call(c, "request_mpesa_payment", bad_phone).await), "INVALID_ARGUMENT");
    let mut long_ref = collect("ref-1", "150");
    long_ref["account_reference"] = json!("THIRTEEN-CHAR");
    assert_eq!(code(&call(c, "request_mpesa_payment", long_ref).await), "INVALID_ARGUMENT");
    // Without payments:collect the call is refused at the HTTP layer (403 + insufficient_scope).
    let reader = try_call(
        &connect(&r.app.url, &r.app.token("dev-agent", "payments:read"), Era::Modern).await,
        "request_mpesa_payment",
        collect("scope-1", "150"),
    )
    .await;
    assert_step_up(&reader, "payments:collect");
    assert_eq!(r.fake.push_requests(), 0, "nothing reached Daraja");
    r.app.stop().await;
}

async fn try_call(client: &Client, tool: &str, args: Value) -> Result<rmcp::model::CallToolResult, rmcp::ServiceError> {
    let args = args.as_object().cloned().unwrap_or_default();
    client.call_tool(rmcp::model::CallToolRequestParams::new(tool.to_string()).with_arguments(args)).await
}

/// Guard-rails hole 7: every wrong-secret POST wrote an audit row (2,000 requests, 2,000 rows), the
/// source check came after the secret check, and behind a proxy the source was always the proxy.
#[tokio::test]
async fn a_flood_of_secret_guesses_writes_one_audit_record_and_a_trusted_proxy_names_the_sender() {
    let r = rig_with(
        "callback_allowed_ips = [\"10.9.9.9\"]\ncallback_trusted_proxies = [\"127.0.0.1\"]",
        &[],
        Arc::new(SystemClock),
    )
    .await;
    let p = ok(&call(&r.client, "request_mpesa_payment", collect("flood-1", "150")).await).clone();
    let id = p["payment_id"].as_str().unwrap().to_string();
    let checkout = r.fake.pushes()[0].checkout_request_id.clone();
    let good = r.fake.callback_body(&checkout, 0);
    let http = reqwest::Client::new();
    let post = |secret: &str, forwarded: &str| {
        http.post(callback_url(&r.app, secret)).header("x-forwarded-for", forwarded.to_string()).json(&good).send()
    };

    // 200 guesses from an allowed sender: one audit record.
    for i in 0..200 {
        let resp = post(&format!("guess-{i:020}"), "10.9.9.9").await.unwrap();
        assert_eq!(resp.status(), 404);
    }
    assert_eq!(audit_codes(&r.app).await, ["BAD_SECRET"], "one record for the whole flood");
    // The right secret from a sender that is not allowed: refused on the source (checked first).
    assert_eq!(post(SECRET, "10.1.1.1").await.unwrap().status(), 403);
    // A forged X-Forwarded-For prefix does not help: the proxy appended the real sender last.
    assert_eq!(post(SECRET, "10.9.9.9, 10.1.1.1").await.unwrap().status(), 403);
    assert_eq!(payment(&r.client, &id).await["status"], "pending", "nothing settled");
    // The allowed sender through the trusted proxy, with the secret: taken in.
    r.fake.set_query(&checkout, QueryAnswer::Result(0, "processed successfully".into()));
    assert_eq!(post(SECRET, "10.9.9.9").await.unwrap().status(), 200);
    assert_eq!(payment(&r.client, &id).await["status"], "succeeded");
    r.app.stop().await;
}

/// Guard-rails hole 8: failure callbacks were trusted without asking Daraja. A forged failure for a
/// collection the customer paid is now refused (the query says it succeeded) and changes nothing.
#[tokio::test]
async fn a_failure_callback_the_query_contradicts_changes_nothing() {
    let r = rig().await;
    let p = ok(&call(&r.client, "request_mpesa_payment", collect("forged-fail", "150")).await).clone();
    let id = p["payment_id"].as_str().unwrap().to_string();
    let checkout = r.fake.pushes()[0].checkout_request_id.clone();
    // Daraja's query says the customer paid; a "cancelled" callback arrives all the same.
    r.fake.set_query(&checkout, QueryAnswer::Result(0, "processed successfully".into()));
    let forged = r.fake.callback_body(&checkout, 1032);
    assert_eq!(r.fake.callback_to(&callback_url(&r.app, SECRET), forged).await, 422);
    assert_eq!(payment(&r.client, &id).await["status"], "pending", "not marked failed");
    assert!(audit_codes(&r.app).await.contains(&"NOT_CONFIRMED".to_string()));
    // The real success callback then settles it.
    assert_eq!(r.fake.callback(&checkout, 0).await, 200);
    assert_eq!(payment(&r.client, &id).await["status"], "succeeded");
    r.app.stop().await;
}

/// Guard-rails hole 8, second half: reconciliation never looked at finished collections again. A
/// collection recorded failed that the rail now calls paid is reported for a human.
#[tokio::test]
async fn reconciliation_asks_again_about_failed_collections() {
    let r = rig().await;
    let p = ok(&call(&r.client, "request_mpesa_payment", collect("recheck-1", "150")).await).clone();
    let id = p["payment_id"].as_str().unwrap().to_string();
    let checkout = r.fake.pushes()[0].checkout_request_id.clone();
    assert_eq!(r.fake.callback(&checkout, 1032).await, 200);
    assert_eq!(payment(&r.client, &id).await["status"], "failed");
    let clean = r.app.running.gateway.reconcile(None).await.unwrap();
    assert!(!clean.findings.iter().any(|f| f.kind == "status_mismatch"), "{:?}", clean.findings);
    // Later Daraja says the customer paid after all.
    r.fake.set_query(&checkout, QueryAnswer::Result(0, "processed successfully".into()));
    let report = r.app.running.gateway.reconcile(None).await.unwrap();
    assert!(
        report.findings.iter().any(|f| f.kind == "status_mismatch" && f.payment_id.as_deref() == Some(id.as_str())),
        "{:?}",
        report.findings
    );
    assert_eq!(payment(&r.client, &id).await["status"], "failed", "terminal states never change: a human decides");
    r.app.stop().await;
}

// --- the M-Pesa MCP server's names, and the reads operators expect of it ---

fn ids(page: &Value) -> Vec<String> {
    page["payments"].as_array().unwrap().iter().map(|p| p["payment_id"].as_str().unwrap().to_string()).collect()
}

fn id_of(r: &rmcp::model::CallToolResult) -> String {
    ok(r)["payment_id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn initiate_stk_push_is_request_mpesa_payment_under_another_name() {
    let r = rig().await;
    let c = &r.client;
    let first = call(c, "request_mpesa_payment", collect("alias-1", "150")).await;
    assert_eq!(ok(&first)["replayed"], false);
    // The same operation_id through the alias is the same operation: replayed, no second prompt.
    let again = call(c, "initiate_stk_push", collect("alias-1", "150")).await;
    assert_eq!((id_of(&again), ok(&again)["replayed"].as_bool()), (id_of(&first), Some(true)));
    assert_eq!(r.fake.push_requests(), 1, "one STK push for one operation_id, whichever the name");
    // ... and other arguments under it through the alias are a conflict, as through the tool.
    let other = call(c, "initiate_stk_push", collect("alias-1", "151")).await;
    assert_eq!(code(&other), "IDEMPOTENCY_CONFLICT");
    // A new operation through the alias alone works like the tool.
    let fresh = call(c, "initiate_stk_push", collect("alias-2", "20")).await;
    assert_eq!((ok(&fresh)["status"].as_str(), ok(&fresh)["replayed"].as_bool()), (Some("pending"), Some(false)));
    assert_eq!(r.fake.push_requests(), 2);
    // Audited under the tool's own name only.
    let audit = r.app.audit("dev-agent").await;
    assert!(audit.iter().any(|a| a.tool == "request_mpesa_payment"));
    assert!(audit.iter().all(|a| a.tool != "initiate_stk_push"), "an alias never appears as a tool of its own");
    // Listed with the tool's input schema and hints.
    let tools = c.list_all_tools().await.unwrap();
    let find = |n: &str| tools.iter().find(|t| t.name == n).cloned().unwrap_or_else(|| panic!("{n} listed"));
    let (tool, alias) = (find("request_mpesa_payment"), find("initiate_stk_push"));
    assert_eq!(alias.input_schema, tool.input_schema);
    assert_eq!(alias.annotations, tool.annotations);
    r.app.stop().await;
}

#[tokio::test]
async fn alternating_names_does_not_double_a_per_tool_rate_limit() {
    let r = rig_limited("", "{ request_mpesa_payment = 3 }", &[], Arc::new(SystemClock)).await;
    let c = &r.client;
    for (n, name) in ["request_mpesa_payment", "initiate_stk_push", "request_mpesa_payment"].iter().enumerate() {
        ok(&call(c, name, collect(&format!("limited-{n}"), "10")).await);
    }
    for (n, name) in ["initiate_stk_push", "request_mpesa_payment"].iter().enumerate() {
        let refused = call(c, name, collect(&format!("over-{n}"), "10")).await;
        assert_eq!(code(&refused), "RATE_LIMITED", "{name}: three calls of the tool, whatever the names");
    }
    assert_eq!(r.fake.push_requests(), 3);
    r.app.stop().await;
}

#[tokio::test]
async fn governance_of_the_tool_governs_its_alias() {
    // approval_required on the tool: the alias needs a human too.
    let r = rig_with("\n[tools]\napproval_required = [\"request_mpesa_payment\"]\n", &[], Arc::new(SystemClock)).await;
    let refused = call(&r.client, "initiate_stk_push", collect("gov-1", "10")).await;
    assert_eq!(code(&refused), "APPROVAL_REQUIRED");
    // The alias needs the tool's scope: without payments:collect, the HTTP layer refuses it (403).
    let reader = connect(&r.app.url, &r.app.token("dev-agent", "payments:read"), Era::Modern).await;
    assert_step_up(&try_call(&reader, "initiate_stk_push", collect("gov-3", "10")).await, "payments:collect");
    assert_eq!(r.fake.push_requests(), 0);
    r.app.stop().await;

    // Disabling the tool hides and refuses the alias as well.
    let r = rig_with("\n[tools]\ndisabled = [\"request_mpesa_payment\"]\n", &[], Arc::new(SystemClock)).await;
    let names: Vec<String> = r.client.list_all_tools().await.unwrap().iter().map(|t| t.name.to_string()).collect();
    assert!(!names.iter().any(|n| n == "request_mpesa_payment" || n == "initiate_stk_push"), "{names:?}");
    assert!(names.iter().any(|n| n == "get_payment"), "other tools stay");
    let refused = try_call(&r.client, "initiate_stk_push", collect("gov-2", "10")).await;
    assert_no_such_tool(&refused);
    assert_eq!(r.fake.push_requests(), 0, "nothing reached Daraja");
    r.app.stop().await;
}

#[tokio::test]
async fn check_transaction_status_and_generate_receipt_by_checkout_request_id() {
    let r = rig().await;
    let c = &r.client;
    let id = id_of(&call(c, "request_mpesa_payment", collect("status-1", "150")).await);
    let checkout = r.fake.pushes()[0].checkout_request_id.clone();
    let queries = r.fake.query_requests();

    let by_ref = call(c, "check_transaction_status", json!({"checkout_request_id": checkout})).await;
    assert_eq!((id_of(&by_ref), ok(&by_ref)["status"].as_str()), (id.clone(), Some("pending")));
    let by_id = call(c, "check_transaction_status", json!({"payment_id": id})).await;
    assert_eq!(ok(&by_id)["status"], "pending");
    // Not (yet) succeeded: no receipt, said plainly.
    let early = call(c, "generate_receipt", json!({"payment_id": id})).await;
    assert_eq!(code(&early), "INVALID_ARGUMENT");
    assert!(err(&early)["message"].as_str().unwrap().contains("pending"), "{:?}", err(&early));
    assert_eq!(r.fake.query_requests(), queries, "status checks read the gateway's records, not Daraja");

    // Unknown, malformed or ambiguous references.
    let unknown = call(c, "check_transaction_status", json!({"checkout_request_id": "ws_CO_000000000000000000"})).await;
    assert_eq!(code(&unknown), "NOT_FOUND");
    for args in
        [json!({}), json!({"payment_id": id, "checkout_request_id": checkout}), json!({"checkout_request_id": ""})]
    {
        let bad = call(c, "check_transaction_status", args.clone()).await;
        assert_eq!(code(&bad), "INVALID_ARGUMENT", "{args}");
    }
    // Another agent, whose accounts the collection does not touch, cannot find it by either handle,
    // and learns nothing about it (not even its payment id).
    let other = connect(&r.app.url, &r.app.token("other-agent", "payments:read"), Era::Modern).await;
    let foreign = call(&other, "check_transaction_status", json!({"checkout_request_id": checkout})).await;
    assert_eq!(code(&foreign), "NOT_FOUND");
    assert!(!err(&foreign)["message"].as_str().unwrap().contains(&id));
    assert_eq!(code(&call(&other, "check_transaction_status", json!({"payment_id": id})).await), "NOT_FOUND");
    assert_eq!(code(&call(&other, "generate_receipt", json!({"payment_id": id})).await), "NOT_FOUND");

    // The customer pays: the status and the receipt show it.
    assert_eq!(r.fake.callback(&checkout, 0).await, 200);
    let settled = ok(&call(c, "check_transaction_status", json!({"checkout_request_id": checkout})).await).clone();
    assert_eq!(settled["status"], "succeeded");
    assert_eq!(settled["receipt"]["checkout_request_id"], checkout.as_str());
    let number = settled["receipt"]["reference"].as_str().unwrap().to_string();
    let receipt = ok(&call(c, "generate_receipt", json!({"payment_id": id})).await).clone();
    assert_eq!(receipt["payment_id"], id.as_str());
    assert_eq!((receipt["kind"].as_str(), receipt["amount"].as_str()), (Some("payment"), Some("150.00")));
    assert_eq!(receipt["currency"], "KES");
    assert_eq!(
        (receipt["from_account"].as_str(), receipt["to_account"].as_str()),
        (Some("mpesa-254712345678"), Some("mpesa-collections"))
    );
    assert_eq!((receipt["rail"].as_str(), receipt["reference"].as_str()), (Some("mpesa"), Some(number.as_str())));
    assert_eq!(receipt["phone"], "25471****678");
    assert!(receipt["created_at"].as_str().unwrap().ends_with('Z'), "RFC 3339 UTC");
    let text = receipt["text"].as_str().unwrap();
    for part in [id.as_str(), "KES 150.00", number.as_str(), "25471****678"] {
        assert!(text.contains(part), "{part} in {text}");
    }
    r.app.stop().await;
}

#[tokio::test]
async fn list_payments_merges_collections_and_ledger_payments_newest_first_on_every_page() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = rig_with("", &[], clock.clone()).await;
    let c = connect(&r.app.url, &r.app.token("dev-agent", &format!("{SCOPES} payments:create")), Era::Modern).await;
    let mut created = Vec::new();
    for n in 0..8 {
        clock.advance(1);
        let res = if n % 3 == 1 {
            let args = json!({"operation_id": format!("ledger-{n}"), "from_account": "acct-A", "to_account": "acct-B",
                              "amount": "1.00", "currency": "KES"});
            call(&c, "create_payment", args).await
        } else {
            call(&c, "request_mpesa_payment", collect(&format!("merge-{n}"), "10")).await
        };
        created.push(id_of(&res));
    }
    created.reverse();
    for limit in [1, 2, 3, 100] {
        let (mut seen, mut cursor) = (Vec::new(), None::<String>);
        for _ in 0..=created.len() {
            let mut args = json!({"limit": limit});
            if let Some(cur) = &cursor {
                args["cursor"] = json!(cur);
            }
            let page = ok(&call(&c, "list_payments", args).await).clone();
            assert!(ids(&page).len() <= limit, "limit {limit}");
            seen.extend(ids(&page));
            cursor = page["next_cursor"].as_str().map(str::to_string);
            if cursor.is_none() {
                break;
            }
        }
        assert!(cursor.is_none(), "limit {limit}: the walk ends");
        assert_eq!(seen, created, "limit {limit}: every payment once, newest first");
    }
    // Filters apply to both sources; a payment made after a walk began does not break it.
    let collections = ok(&call(&c, "list_payments", json!({"account_id": "mpesa-collections"})).await).clone();
    assert_eq!(ids(&collections).len(), 5);
    let page = ok(&call(&c, "list_payments", json!({"limit": 3})).await).clone();
    clock.advance(1);
    call(&c, "request_mpesa_payment", collect("late", "10")).await;
    let cursor = page["next_cursor"].as_str().unwrap();
    let rest = ok(&call(&c, "list_payments", json!({"limit": 100, "cursor": cursor})).await).clone();
    assert_eq!([ids(&page), ids(&rest)].concat(), created);
    let r2 = call(&c, "list_payments", json!({"cursor": "djI6eDp5"})).await;
    assert_eq!(code(&r2), "INVALID_ARGUMENT");
    r.app.stop().await;
}

#[tokio::test]
async fn windows_and_the_today_tools_include_collections() {
    let now = SystemClock.now();
    let today = now - now.rem_euclid(86_400);
    let date = |secs: i64| paygate::clock::rfc3339(secs)[..10].to_string();
    // Yesterday, an hour before midnight (UTC): one collection that fails.
    let clock = Arc::new(ManualClock::new(today - 3600));
    let r = rig_with("", &[], clock.clone()).await;
    let yday = id_of(&call(&r.client, "request_mpesa_payment", collect("yday", "5")).await);
    assert_eq!(r.fake.callback(&r.fake.pushes()[0].checkout_request_id, 1032).await, 200);
    // Today, 01:00: one paid, one cancelled, one still pending.
    clock.advance(7200);
    let c = &connect(&r.app.url, &r.app.token("dev-agent", SCOPES), Era::Modern).await;
    let paid = id_of(&call(c, "request_mpesa_payment", collect("paid", "150")).await);
    clock.advance(1);
    let cancelled = id_of(&call(c, "request_mpesa_payment", collect("cancelled", "20")).await);
    clock.advance(1);
    let pending = id_of(&call(c, "request_mpesa_payment", collect("pending", "7")).await);
    let pushes = r.fake.pushes();
    assert_eq!(r.fake.callback(&pushes[1].checkout_request_id, 0).await, 200);
    assert_eq!(r.fake.callback(&pushes[2].checkout_request_id, 1032).await, 200);

    let list = |args: Value| async move { call(c, "list_payments", args).await };
    let todays = vec![pending.clone(), cancelled.clone(), paid.clone()];
    assert_eq!(ids(ok(&list(json!({"from": date(today)})).await)), todays);
    assert_eq!(
        ids(ok(&list(json!({"to": date(today - 1)})).await)),
        vec![yday.clone()],
        "a bare `to` date: through that day"
    );
    let rfc = paygate::clock::rfc3339;
    assert_eq!(ids(ok(&list(json!({"from": rfc(today - 3600), "to": rfc(today)})).await)), vec![yday.clone()]);
    assert_eq!(ids(ok(&list(json!({"from": rfc(today + 3601), "status": "failed"})).await)), vec![cancelled.clone()]);
    for bad in [
        json!({"from": rfc(today), "to": rfc(today)}),
        json!({"from": "yesterday"}),
        json!({"from": date(today - 400 * 86_400), "to": date(today)}),
    ] {
        assert_eq!(code(&list(bad.clone()).await), "INVALID_ARGUMENT", "{bad}");
    }

    let t = ok(&call(c, "get_today_transactions", json!({})).await).clone();
    assert_eq!(ids(&t), todays, "today's transactions are today's collections");
    let t = ok(&call(c, "get_today_transactions", json!({"status": "succeeded"})).await).clone();
    assert_eq!(ids(&t), vec![paid.clone()]);
    let f = ok(&call(c, "get_failed_transactions", json!({})).await).clone();
    assert_eq!(ids(&f), vec![cancelled.clone()], "failed today");
    assert_eq!(f["payments"][0]["status"], "failed");
    let f = ok(&call(c, "get_failed_transactions", json!({"from": date(today - 1)})).await).clone();
    assert_eq!(ids(&f), vec![cancelled.clone(), yday.clone()]);

    let s = ok(&call(c, "get_today_summary", json!({"currency": "KES"})).await).clone();
    let line = |status: &str| s["totals"].as_array().unwrap().iter().find(|l| l["status"] == status).cloned().unwrap();
    assert_eq!((line("succeeded")["count"].as_i64(), line("succeeded")["total"].as_str()), (Some(1), Some("150.00")));
    assert_eq!((line("failed")["count"].as_i64(), line("failed")["total"].as_str()), (Some(1), Some("20.00")));
    assert_eq!((line("pending")["count"].as_i64(), line("pending")["total"].as_str()), (Some(1), Some("7.00")));
    assert_eq!(s["from"], rfc(today).as_str());
    r.app.stop().await;
}

/// A collection still pending past `mpesa.pending_timeout_secs` (an hour by default) is named by
/// reconciliation with how long it has been pending; before that it is the poll job's alone.
#[tokio::test]
async fn reconciliation_names_a_collection_pending_too_long_with_its_age() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = rig_with("", &[("PAYGATE_JOBS__ENABLED", "false")], clock.clone()).await;
    let p = ok(&call(&r.client, "request_mpesa_payment", collect("slow-1", "120")).await).clone();
    let id = p["payment_id"].as_str().unwrap().to_string();
    let admin = |r: &Rig| r.app.token("ops-bot", "payments:integrity");
    let pending_too_long = |report: &Value| -> Vec<String> {
        report["findings"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|f| f["kind"] == "pending_too_long" && f["payment_id"] == id.as_str())
            .map(|f| f["detail"].as_str().unwrap().to_string())
            .collect()
    };
    clock.advance(3_000);
    let ops = connect(&r.app.url, &admin(&r), Era::Modern).await;
    assert!(pending_too_long(&ok(&call(&ops, "reconcile", json!({})).await).clone()).is_empty());
    clock.advance(700);
    let ops = connect(&r.app.url, &admin(&r), Era::Modern).await;
    let named = pending_too_long(&ok(&call(&ops, "reconcile", json!({})).await).clone());
    assert_eq!(named.len(), 1, "{named:?}");
    assert!(named[0].starts_with("pending since 3700 s"), "{named:?}");
    r.app.stop().await;
}
