//! The Daraja client against the local Daraja fake (tests/common/daraja.rs): OAuth caching and
//! refresh, STK push and query, payouts (B2C), reversals and the Transaction Status API, retries of
//! transient failures and the circuit breaker, and how each failure maps to Rejected / Unavailable /
//! OutcomeUnknown.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

#[path = "common/daraja.rs"]
mod daraja;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use daraja::{DarajaFake, FakeConfig, OutboundKind, OutboundMode, PushMode, QueryAnswer};
use paygate::backend::mpesa::daraja::{
    B2bPayment, B2cPayment, BusinessTo, DarajaClient, DarajaConfig, DarajaError, Reversal, Sender, StkPush,
    StkQueryOutcome, failure_reason, normalize_phone, parse_callback, parse_result, timestamp_eat,
};
use paygate::clock::{Clock, ManualClock};

const T0: i64 = 1_700_000_000;
const CALLBACK_URL: &str = "https://paygate.example/callbacks/mpesa/s3cr3t-path";

struct Harness {
    fake: DarajaFake,
    clock: ManualClock,
    client: DarajaClient,
}

async fn harness() -> Harness {
    harness_with(|_| {}).await
}

async fn harness_with(adjust: impl FnOnce(&mut DarajaConfig)) -> Harness {
    let clock = ManualClock::new(T0);
    let fake = DarajaFake::start(FakeConfig { clock: Arc::new(clock.clone()), ..FakeConfig::default() }).await;
    let mut cfg = fake.client_config(CALLBACK_URL);
    adjust(&mut cfg);
    let client = DarajaClient::new(cfg, Arc::new(clock.clone())).expect("client");
    Harness { fake, clock, client }
}

fn push(amount_whole: i64) -> StkPush {
    StkPush {
        phone: normalize_phone("0712 345 678").unwrap(),
        amount_whole,
        account_reference: "INV-1".into(),
        description: "Order 1".into(),
    }
}

/// Bounds every call so a bug can never hang the test binary.
async fn bounded<F: std::future::Future>(f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(20), f).await.expect("call did not finish")
}

#[tokio::test]
async fn token_is_fetched_once_and_cached_across_calls() {
    let h = harness().await;
    let a = h.client.stk_push(&push(10)).await.unwrap();
    let b = h.client.stk_push(&push(20)).await.unwrap();
    assert_ne!(a.checkout_request_id, b.checkout_request_id);
    assert_eq!(h.client.stk_query(&a.checkout_request_id).await.unwrap(), StkQueryOutcome::Pending);
    assert_eq!(h.fake.token_requests(), 1);
    assert_eq!(h.fake.pushes().len(), 2);
}

#[tokio::test]
async fn token_is_refreshed_after_expiry_minus_margin() {
    // The fake says expires_in "3599"; the margin is 60 s: the token is used for 3539 s.
    let h = harness().await;
    h.client.stk_push(&push(10)).await.unwrap();
    h.clock.advance(3538);
    h.client.stk_push(&push(10)).await.unwrap();
    assert_eq!(h.fake.token_requests(), 1);
    h.clock.advance(1);
    h.client.stk_push(&push(10)).await.unwrap();
    assert_eq!(h.fake.token_requests(), 2);
    // Long after the fake's own expiry, the client still never sends a dead token.
    h.clock.advance(10 * 3600);
    h.client.stk_push(&push(10)).await.unwrap();
    assert_eq!(h.fake.token_requests(), 3);
    assert_eq!(h.fake.push_requests(), 4);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_callers_share_one_token_fetch() {
    let h = harness().await;
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..8 {
        let client = h.client.clone();
        tasks.spawn(async move { client.stk_push(&push(10 + i)).await });
    }
    while let Some(joined) = tasks.join_next().await {
        joined.unwrap().unwrap();
    }
    assert_eq!(h.fake.token_requests(), 1);
    assert_eq!(h.fake.pushes().len(), 8);
}

#[tokio::test]
async fn stk_push_sends_what_daraja_accepts() {
    let h = harness().await;
    let accepted = h
        .client
        .stk_push(&StkPush {
            phone: normalize_phone("+254 110-345-678").unwrap(),
            amount_whole: 150,
            account_reference: "  INV-2024-000123-LONG".into(),
            description: "Order\n42 – café payment".into(),
        })
        .await
        .unwrap();
    assert_eq!(accepted.customer_message, "Success. Request accepted for processing");
    assert!(!accepted.merchant_request_id.is_empty());
    // The fake checked Basic auth, the bearer token, the password, the timestamp and every field.
    let recorded = h.fake.push(&accepted.checkout_request_id).expect("recorded");
    assert_eq!(recorded.phone, "254110345678");
    assert_eq!(recorded.party_a, "254110345678");
    assert_eq!(recorded.party_b, daraja::SANDBOX_SHORT_CODE);
    assert_eq!(recorded.amount, 150);
    assert_eq!(recorded.account_reference, "INV-2024-000");
    assert_eq!(recorded.description, "Order42 – caf", "13 characters, not bytes");
    assert_eq!(recorded.callback_url, CALLBACK_URL);
    assert_eq!(recorded.transaction_type, "CustomerPayBillOnline");
    assert_eq!(recorded.timestamp, timestamp_eat(h.clock.now()));
}

#[tokio::test]
async fn invalid_push_is_rejected_before_anything_is_sent() {
    let h = harness().await;
    for bad in [
        push(0),
        push(-5),
        StkPush { account_reference: " \n ".into(), ..push(10) },
        StkPush { description: "\u{7}".into(), ..push(10) },
    ] {
        match h.client.stk_push(&bad).await {
            Err(DarajaError::Rejected { code, .. }) => assert_eq!(code, "paygate.invalid_request"),
            other => panic!("{bad:?}: {other:?}"),
        }
    }
    assert_eq!(h.fake.token_requests(), 0);
    assert_eq!(h.fake.push_requests(), 0);
}

#[tokio::test]
async fn refused_push_is_rejected() {
    let h = harness().await;
    h.fake.set_push_mode(PushMode::Reject);
    match h.client.stk_push(&push(10)).await {
        Err(DarajaError::Rejected { code, message }) => {
            assert_eq!(code, "400.002.02");
            assert!(message.starts_with("Bad Request - Invalid"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert!(h.fake.pushes().is_empty());
}

#[tokio::test]
async fn hung_push_is_outcome_unknown_within_the_request_timeout() {
    let h = harness_with(|c| c.request_timeout = Duration::from_millis(300)).await;
    h.fake.set_push_mode(PushMode::Hang);
    match bounded(h.client.stk_push(&push(10))).await {
        Err(DarajaError::OutcomeUnknown(why)) => assert!(why.contains("timed out"), "{why}"),
        other => panic!("{other:?}"),
    }
    // Daraja did get it: this is exactly why the outcome is unknown, not unavailable.
    assert_eq!(bounded(h.fake.wait_for_pushes(1)).await.len(), 1);
    assert_eq!(h.fake.push_requests(), 1, "a push is never retried after an unknown outcome");
}

#[tokio::test]
async fn push_answered_with_500_is_outcome_unknown() {
    let h = harness().await;
    h.fake.set_push_mode(PushMode::Fail500);
    match h.client.stk_push(&push(10)).await {
        Err(DarajaError::OutcomeUnknown(why)) => assert!(why.contains("500"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.fake.push_requests(), 1, "a push is never retried after an unknown outcome");
}

#[tokio::test]
async fn query_maps_processing_to_pending_and_results_to_completed() {
    let h = harness().await;
    let id = h.client.stk_push(&push(10)).await.unwrap().checkout_request_id;
    assert_eq!(h.client.stk_query(&id).await.unwrap(), StkQueryOutcome::Pending);
    h.fake.set_query(&id, QueryAnswer::Processing);
    assert_eq!(h.client.stk_query(&id).await.unwrap(), StkQueryOutcome::Pending);
    h.fake.set_query(&id, QueryAnswer::Result(1032, "Request cancelled by user".into()));
    let outcome = h.client.stk_query(&id).await.unwrap();
    assert_eq!(
        outcome,
        StkQueryOutcome::Completed { result_code: 1032, result_desc: "Request cancelled by user".into() }
    );
    assert_eq!(failure_reason(1032), Some("cancelled by the customer"));
    h.fake.set_query(&id, QueryAnswer::Result(0, "The service request is processed successfully.".into()));
    match h.client.stk_query(&id).await.unwrap() {
        StkQueryOutcome::Completed { result_code: 0, .. } => {}
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn query_for_an_unknown_checkout_is_rejected() {
    let h = harness().await;
    match h.client.stk_query("ws_CO_000000000000000000").await {
        Err(DarajaError::Rejected { code, .. }) => assert_eq!(code, "400.002.02"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn hung_query_is_unavailable_because_a_query_is_read_only() {
    let h = harness_with(|c| c.request_timeout = Duration::from_millis(300)).await;
    let id = h.client.stk_push(&push(10)).await.unwrap().checkout_request_id;
    h.fake.set_query(&id, QueryAnswer::Hang);
    match bounded(h.client.stk_query(&id)).await {
        Err(DarajaError::Unavailable(why)) => assert!(why.contains("timed out"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn a_401_refreshes_the_token_and_retries_once() {
    let h = harness().await;
    h.client.stk_push(&push(10)).await.unwrap();
    h.fake.revoke_tokens();
    h.client.stk_push(&push(20)).await.unwrap();
    assert_eq!(h.fake.token_requests(), 2);
    assert_eq!(h.fake.push_requests(), 3, "first push, refused push, retried push");
    assert_eq!(h.fake.pushes().len(), 2);

    h.fake.revoke_tokens();
    let id = h.fake.pushes()[0].checkout_request_id.clone();
    assert_eq!(h.client.stk_query(&id).await.unwrap(), StkQueryOutcome::Pending);
    assert_eq!(h.fake.token_requests(), 3);
}

/// Daraja's gateway refuses an unknown token with a bare 401, or with `404.001.03` under another
/// 4xx status: either way the token is fetched again and the request sent once more.
#[tokio::test]
async fn a_token_refused_either_way_daraja_refuses_one_is_fetched_again() {
    let h = harness().await;
    h.client.stk_push(&push(10)).await.unwrap();
    for (n, (status, with_code)) in
        [(StatusCode::UNAUTHORIZED, false), (StatusCode::BAD_REQUEST, true)].into_iter().enumerate()
    {
        h.fake.set_invalid_token_answer(status, with_code);
        h.fake.revoke_tokens();
        h.client.stk_push(&push(20)).await.unwrap_or_else(|e| panic!("{status} (code: {with_code}): {e:?}"));
        assert_eq!(h.fake.token_requests(), 2 + n, "{status}");
    }
    assert_eq!(h.fake.pushes().len(), 3);
}

#[tokio::test]
async fn a_token_refused_twice_is_unavailable_not_a_loop() {
    let h = harness().await;
    h.fake.set_reject_all_tokens(true);
    match h.client.stk_push(&push(10)).await {
        Err(DarajaError::Unavailable(why)) => assert!(why.contains("404.001.03"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.fake.token_requests(), 2);
    assert_eq!(h.fake.push_requests(), 2);
    assert!(h.fake.pushes().is_empty());
}

#[tokio::test]
async fn wrong_consumer_secret_is_unavailable_and_never_printed() {
    let h = harness_with(|c| c.consumer_secret = paygate::auth::Secret::new("wrong-consumer-secret".into())).await;
    let err = h.client.stk_push(&push(10)).await.unwrap_err();
    assert!(matches!(err, DarajaError::Unavailable(_)), "{err:?}");
    let text = format!("{err} {err:?} {:?}", h.client);
    assert!(!text.contains("wrong-consumer-secret"), "{text}");
    assert_eq!(h.fake.push_requests(), 0);
}

#[tokio::test]
async fn connection_refused_is_unavailable() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let h = harness_with(|c| c.base_url = format!("http://127.0.0.1:{port}")).await;
    for err in [h.client.stk_push(&push(10)).await.unwrap_err(), h.client.stk_query("ws_CO_1").await.unwrap_err()] {
        assert!(matches!(err, DarajaError::Unavailable(_)), "{err:?}");
    }
}

/// A token endpoint that refuses the connection left nothing processed: the attempt is tried
/// again, at most `retries_max` times, and each try counts toward the circuit — here three tries
/// of one push open it (a refusal taken as final would have counted one).
#[tokio::test]
async fn a_refused_token_connection_is_tried_again_a_bounded_number_of_times() {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let h = harness_with(|c| {
        c.base_url = format!("http://127.0.0.1:{port}");
        c.retries_max = 2;
        c.breaker_failures_max = 3;
        c.breaker_open = Duration::from_secs(30);
    })
    .await;
    match bounded(h.client.stk_push(&push(10))).await {
        Err(DarajaError::Unavailable(why)) => assert!(why.contains("oauth") && why.contains("connect"), "{why}"),
        other => panic!("{other:?}"),
    }
    match bounded(h.client.stk_push(&push(10))).await {
        Err(DarajaError::Unavailable(why)) => assert!(why.contains("circuit is open"), "{why}"),
        other => panic!("{other:?}"),
    }
}

#[tokio::test]
async fn bad_config_is_refused_at_construction() {
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let fake = DarajaFake::start(FakeConfig::default()).await;
    type Adjust = fn(&mut DarajaConfig);
    let cases: [(&str, Adjust); 11] = [
        ("transaction_type", |c| c.transaction_type = "CustomerPayBill".into()),
        ("base_url", |c| c.base_url = "ftp://x".into()),
        ("callback_url", |c| c.callback_url = "paygate.example/cb".into()),
        ("short_code", |c| c.short_code = "17437a".into()),
        ("token_refresh_margin_secs", |c| c.token_refresh_margin_secs = -1),
        ("consumer_key and consumer_secret", |c| c.consumer_key = paygate::auth::Secret::new(String::new())),
        ("consumer_key and consumer_secret", |c| c.consumer_secret = paygate::auth::Secret::new(String::new())),
        ("passkey must be set", |c| c.passkey = paygate::auth::Secret::new(String::new())),
        ("result_url", |c| c.result_url = "paygate.example/result".into()),
        ("timeout_url", |c| c.timeout_url = "ftp://paygate.example/timeout".into()),
        ("security_credential", |c| c.security_credential = paygate::auth::Secret::new(String::new())),
    ];
    for (needle, adjust) in cases {
        let mut cfg = fake.client_config(CALLBACK_URL);
        adjust(&mut cfg);
        match DarajaClient::new(cfg, clock.clone()) {
            Err(DarajaError::Config(why)) => assert!(why.contains(needle), "{why}"),
            other => panic!("{needle}: {other:?}"),
        }
    }
    // The initiator's settings are checked only when payouts are configured: without one, its
    // URLs and credential may stay empty.
    let mut cfg = fake.client_config(CALLBACK_URL);
    (cfg.initiator_name, cfg.result_url, cfg.b2c_short_code) = (String::new(), String::new(), "x".into());
    assert!(DarajaClient::new(cfg, clock.clone()).is_ok());
    let mut cfg = fake.client_config(CALLBACK_URL);
    cfg.b2c_short_code = "60099x".into();
    assert!(matches!(DarajaClient::new(cfg, clock), Err(DarajaError::Config(why)) if why.contains("b2c_short_code")));
}

/// Money out, reversals and status queries are checked before anything is sent: no amount, no
/// id, an id with a control character, no remarks, a receipt that is not one. Each is refused as
/// the request's own fault, and Daraja hears nothing (not even a token request).
#[tokio::test]
async fn invalid_payouts_reversals_and_status_queries_are_refused_before_anything_is_sent() {
    let h = harness().await;
    let payout = B2cPayment {
        originator_conversation_id: "pay_ok".into(),
        phone: normalize_phone("0712345678").unwrap(),
        amount_whole: 50,
        remarks: "Refund".into(),
    };
    let invalid = |r: Result<paygate::backend::mpesa::daraja::RequestAccepted, DarajaError>, field: &str| match r {
        Err(DarajaError::Rejected { code, message }) => {
            assert_eq!(code, "paygate.invalid_request");
            assert!(message.starts_with(field), "{field}: {message}");
        }
        other => panic!("{field}: {other:?}"),
    };
    invalid(h.client.b2c_payment(&B2cPayment { amount_whole: 0, ..payout.clone() }).await, "Amount");
    invalid(
        h.client.b2c_payment(&B2cPayment { originator_conversation_id: String::new(), ..payout.clone() }).await,
        "OriginatorConversationID",
    );
    invalid(
        h.client.b2c_payment(&B2cPayment { originator_conversation_id: "pay\n1".into(), ..payout.clone() }).await,
        "OriginatorConversationID",
    );
    invalid(h.client.b2c_payment(&B2cPayment { remarks: " \t ".into(), ..payout.clone() }).await, "Remarks");
    let reversal =
        Reversal { transaction_id: "NLJ41HAY6Q".into(), amount_whole: 30, remarks: "r".into(), occasion: "o".into() };
    invalid(h.client.reversal(&Reversal { amount_whole: 0, ..reversal.clone() }).await, "Amount");
    invalid(h.client.reversal(&Reversal { transaction_id: String::new(), ..reversal.clone() }).await, "TransactionID");
    invalid(
        h.client.reversal(&Reversal { transaction_id: "NLJ41-HAY6Q".into(), ..reversal.clone() }).await,
        "TransactionID",
    );
    invalid(h.client.transaction_status("", "o", Sender::Payouts).await, "OriginatorConversationID");
    invalid(h.client.transaction_status("pay\u{1b}1", "o", Sender::Payouts).await, "OriginatorConversationID");
    match h.client.stk_query("ws_CO\n1").await {
        Err(DarajaError::Rejected { code, message }) => {
            assert_eq!(code, "paygate.invalid_request");
            assert!(message.starts_with("CheckoutRequestID"), "{message}");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        (h.fake.token_requests(), h.fake.b2c_requests(), h.fake.reversal_requests(), h.fake.status_requests()),
        (0, 0, 0, 0)
    );
    assert_eq!(h.fake.query_requests(), 0);
}

/// A Daraja answering each API path with what the test sets, and tokens as Daraja does.
#[derive(Clone, Default)]
struct Scripted(Arc<Mutex<std::collections::HashMap<String, (StatusCode, String)>>>);

impl Scripted {
    fn answer(&self, path: &str, status: StatusCode, body: &str) {
        self.0.lock().unwrap().insert(path.to_string(), (status, body.to_string()));
    }
}

async fn scripted_token() -> axum::Json<serde_json::Value> {
    axum::Json(serde_json::json!({"access_token": "scripted-token", "expires_in": "3599"}))
}

async fn scripted_answer(State(s): State<Scripted>, uri: axum::http::Uri) -> (StatusCode, String) {
    s.0.lock().unwrap().get(uri.path()).cloned().unwrap_or((StatusCode::NOT_FOUND, String::new()))
}

const PUSH_PATH: &str = "/mpesa/stkpush/v1/processrequest";
const QUERY_PATH: &str = "/mpesa/stkpushquery/v1/query";
const B2C_PATH: &str = "/mpesa/b2c/v3/paymentrequest";
const STATUS_PATH: &str = "/mpesa/transactionstatus/v1/query";

/// A 200 is not an acceptance unless it says so: a push answered 200 with another ResponseCode is
/// refused with Daraja's code; one whose body cannot be read, or accepted without the id to ask
/// about it by, may have reached the customer (outcome unknown, never "not sent"). A query's odd
/// 200 is only a failed question (unavailable), a payout's may have moved money (outcome unknown),
/// a status query's is a question to ask again.
#[tokio::test]
async fn a_success_status_whose_body_says_otherwise_is_never_taken_for_acceptance() {
    let script = Scripted::default();
    let app = axum::Router::new()
        .route("/oauth/v1/generate", axum::routing::get(scripted_token))
        .fallback(scripted_answer)
        .with_state(script.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let fake = DarajaFake::start(FakeConfig::default()).await;
    let mut cfg = fake.client_config(CALLBACK_URL);
    cfg.base_url = base;
    let client = DarajaClient::new(cfg, Arc::new(ManualClock::new(T0))).unwrap();
    let ok = StatusCode::OK;

    script.answer(
        PUSH_PATH,
        ok,
        r#"{"MerchantRequestID":"m","CheckoutRequestID":"ws_1","ResponseCode":"1","ResponseDescription":"Rejected"}"#,
    );
    match bounded(client.stk_push(&push(10))).await {
        Err(DarajaError::Rejected { code, message }) => {
            assert_eq!((code.as_str(), message.as_str()), ("1", "Rejected"))
        }
        other => panic!("{other:?}"),
    }
    script.answer(PUSH_PATH, ok, r#"{"MerchantRequestID":"m","CheckoutRequestID":"","ResponseCode":"0"}"#);
    match bounded(client.stk_push(&push(10))).await {
        Err(DarajaError::OutcomeUnknown(why)) => assert!(why.contains("without a CheckoutRequestID"), "{why}"),
        other => panic!("{other:?}"),
    }
    script.answer(PUSH_PATH, ok, "<html>ok</html>");
    match bounded(client.stk_push(&push(10))).await {
        Err(DarajaError::OutcomeUnknown(why)) => assert!(why.contains("unparseable success body"), "{why}"),
        other => panic!("{other:?}"),
    }
    script.answer(
        PUSH_PATH,
        ok,
        r#"{"MerchantRequestID":"m","CheckoutRequestID":"ws_2","ResponseCode":0,"CustomerMessage":"Success"}"#,
    );
    let accepted = bounded(client.stk_push(&push(10))).await.unwrap();
    assert_eq!((accepted.checkout_request_id.as_str(), accepted.customer_message.as_str()), ("ws_2", "Success"));

    script.answer(QUERY_PATH, ok, r#"{"ResponseCode":"1","ResponseDescription":"No such request"}"#);
    assert!(matches!(bounded(client.stk_query("ws_2")).await, Err(DarajaError::Rejected { code, .. }) if code == "1"));
    for body in [r#"{"ResponseCode":"0"}"#, r#"{"ResponseCode":"0","ResultCode":"soon"}"#, "garbage"] {
        script.answer(QUERY_PATH, ok, body);
        match bounded(client.stk_query("ws_2")).await {
            Err(DarajaError::Unavailable(why)) => assert!(why.contains("unparseable success body"), "{body}: {why}"),
            other => panic!("{body}: {other:?}"),
        }
    }
    script.answer(
        QUERY_PATH,
        ok,
        r#"{"ResponseCode":"0","ResultCode":"1032","ResultDesc":"Request cancelled by user"}"#,
    );
    assert_eq!(
        bounded(client.stk_query("ws_2")).await.unwrap(),
        StkQueryOutcome::Completed { result_code: 1032, result_desc: "Request cancelled by user".into() }
    );

    let payout = B2cPayment {
        originator_conversation_id: "pay_odd".into(),
        phone: normalize_phone("0712345678").unwrap(),
        amount_whole: 50,
        remarks: "Refund".into(),
    };
    script.answer(
        B2C_PATH,
        ok,
        r#"{"ResponseCode":"2001","ResponseDescription":"The initiator information is invalid."}"#,
    );
    assert!(
        matches!(bounded(client.b2c_payment(&payout)).await, Err(DarajaError::Rejected { code, .. }) if code == "2001")
    );
    script.answer(B2C_PATH, ok, "{");
    match bounded(client.b2c_payment(&payout)).await {
        Err(DarajaError::OutcomeUnknown(why)) => assert!(why.contains("unparseable success body"), "{why}"),
        other => panic!("{other:?}"),
    }
    script.answer(STATUS_PATH, ok, "{");
    assert!(matches!(
        bounded(client.transaction_status("pay_odd", "pay_odd", Sender::Payouts)).await,
        Err(DarajaError::Unavailable(_))
    ));
    script.answer(STATUS_PATH, ok, r#"{"ConversationID":"AG_1","OriginatorConversationID":"st_1","ResponseCode":"0"}"#);
    let asked = bounded(client.transaction_status("pay_odd", "pay_odd", Sender::Payouts)).await.unwrap();
    assert_eq!((asked.conversation_id.as_str(), asked.originator_conversation_id.as_str()), ("AG_1", "st_1"));
    server.abort();
}

/// Everything logged while the client runs, at every level: no token, key or passkey appears.
#[derive(Clone)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

#[tokio::test]
async fn secrets_and_tokens_never_reach_logs_or_errors() {
    let buf = Captured(Arc::new(Mutex::new(Vec::new())));
    let writer = buf.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_max_level(tracing::Level::TRACE)
        .with_ansi(false)
        .with_writer(move || writer.clone())
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let h = harness().await;
    let id = h.client.stk_push(&push(10)).await.unwrap().checkout_request_id;
    h.fake.revoke_tokens();
    h.client.stk_query(&id).await.unwrap();
    h.fake.set_reject_all_tokens(true);
    let err = h.client.stk_push(&push(10)).await.unwrap_err();

    let cfg = FakeConfig::default();
    let logs = String::from_utf8(buf.0.lock().unwrap().clone()).unwrap();
    assert!(logs.contains("daraja"), "the client logged nothing: {logs}");
    let everything = format!("{logs}\n{err}\n{err:?}\n{:?}\n{:?}", h.client, h.fake.client_config(CALLBACK_URL));
    for secret in [cfg.consumer_key.as_str(), cfg.consumer_secret.as_str(), cfg.passkey.as_str(), "fake-access-token"] {
        assert!(!everything.contains(secret), "{secret} leaked:\n{everything}");
    }
}

#[derive(Clone, Default)]
struct Inbox(Arc<Mutex<Vec<Bytes>>>);

async fn receive(State(inbox): State<Inbox>, body: Bytes) -> &'static str {
    inbox.0.lock().unwrap().push(body);
    "ok"
}

#[tokio::test]
async fn fake_callbacks_parse_with_the_client_parser() {
    let inbox = Inbox::default();
    let app = axum::Router::new().route("/cb/{secret}", axum::routing::post(receive)).with_state(inbox.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let cb_url = format!("http://{}/cb/s3cr3t", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });

    let h = harness_with(|c| c.callback_url = cb_url.clone()).await;
    let ok = h.client.stk_push(&push(150)).await.unwrap();
    let cancelled = h.client.stk_push(&push(20)).await.unwrap();
    assert_eq!(h.fake.callback(&ok.checkout_request_id, 0).await, reqwest::StatusCode::OK);
    assert_eq!(h.fake.callback(&cancelled.checkout_request_id, 1032).await, reqwest::StatusCode::OK);

    let received = inbox.0.lock().unwrap().clone();
    assert_eq!(received.len(), 2);
    let success = parse_callback(&received[0]).unwrap();
    assert_eq!(success.checkout_request_id, ok.checkout_request_id);
    assert_eq!(success.merchant_request_id, ok.merchant_request_id);
    assert_eq!(success.result_code, 0);
    assert_eq!(success.amount_minor, Some(15_000));
    assert_eq!(success.phone.as_deref(), Some("254712345678"));
    assert_eq!(success.receipt.as_ref().map(String::len), Some(10));
    assert_eq!(success.transaction_date, Some(timestamp_eat(h.clock.now())));
    let failure = parse_callback(&received[1]).unwrap();
    assert_eq!((failure.result_code, failure.amount_minor, failure.receipt), (1032, None, None));

    // After the callback, a query answers the same result.
    let outcome = h.client.stk_query(&cancelled.checkout_request_id).await.unwrap();
    assert!(matches!(outcome, StkQueryOutcome::Completed { result_code: 1032, .. }), "{outcome:?}");

    // callback_body lets tests tamper; callback_to posts anything anywhere.
    let mut forged = h.fake.callback_body(&ok.checkout_request_id, 0);
    forged["Body"]["stkCallback"]["CallbackMetadata"]["Item"][0]["Value"] = serde_json::json!("1.00");
    assert_eq!(parse_callback(&serde_json::to_vec(&forged).unwrap()).unwrap().amount_minor, Some(100));
    assert_eq!(h.fake.callback_to(&cb_url, forged).await, reqwest::StatusCode::OK);
    assert_eq!(inbox.0.lock().unwrap().len(), 3);
    server.abort();
}

#[tokio::test]
async fn a_request_refused_unprocessed_is_retried_a_bounded_number_of_times() {
    let h = harness().await;
    // Two 503s ("not processed"), then Daraja takes it: one push, three requests.
    h.fake.fail_next(2);
    bounded(h.client.stk_push(&push(10))).await.unwrap();
    assert_eq!((h.fake.push_requests(), h.fake.pushes().len()), (3, 1));
    // More failures than retries (retries_max = 2): unavailable after exactly three requests, no push.
    h.fake.fail_next(10);
    match bounded(h.client.stk_push(&push(11))).await {
        Err(DarajaError::Unavailable(why)) => assert!(why.contains("503"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!((h.fake.push_requests(), h.fake.pushes().len()), (6, 1));
    // A read-only query is retried the same way.
    h.fake.fail_next(1);
    let id = h.fake.pushes()[0].checkout_request_id.clone();
    assert_eq!(bounded(h.client.stk_query(&id)).await.unwrap(), StkQueryOutcome::Pending);
}

#[tokio::test]
async fn a_payout_whose_answer_is_lost_is_never_retried() {
    let h = harness_with(|c| c.request_timeout = Duration::from_millis(300)).await;
    h.fake.set_outbound_mode(OutboundMode::Hang);
    let payout = B2cPayment {
        originator_conversation_id: "pay_lost".into(),
        phone: normalize_phone("0712345678").unwrap(),
        amount_whole: 50,
        remarks: "Refund for order 7".into(),
    };
    match bounded(h.client.b2c_payment(&payout)).await {
        Err(DarajaError::OutcomeUnknown(why)) => assert!(why.contains("timed out"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!((h.fake.b2c_requests(), h.fake.payouts().len()), (1, 1), "processed once, sent once");
}

#[tokio::test]
async fn the_circuit_opens_after_repeated_failures_and_a_probe_closes_it() {
    let h = harness_with(|c| {
        c.retries_max = 0;
        c.breaker_failures_max = 2;
        c.breaker_open = Duration::from_secs(30);
    })
    .await;
    h.fake.fail_next(2);
    for _ in 0..2 {
        assert!(matches!(bounded(h.client.stk_push(&push(10))).await, Err(DarajaError::Unavailable(_))));
    }
    // Open: refused at once, nothing sent.
    match bounded(h.client.stk_push(&push(10))).await {
        Err(DarajaError::Unavailable(why)) => assert!(why.contains("circuit is open"), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(h.fake.push_requests(), 2);
    // After breaker_open, one probe goes through; Daraja answers, the circuit closes.
    h.clock.advance(30);
    bounded(h.client.stk_push(&push(10))).await.unwrap();
    bounded(h.client.stk_push(&push(12))).await.unwrap();
    assert_eq!((h.fake.push_requests(), h.fake.pushes().len()), (4, 2));
}

/// Issue 53: Daraja answers a status query on a prompt still open with HTTP 500 "The transaction
/// is being processed"; the client counted each against one breaker for all of Daraja, so a few
/// customers ignoring their prompts refused every push and payout to anyone. Now that answer is a
/// state (pending), and each endpoint has its own breaker: a status endpoint truly failing stops
/// status queries only.
#[tokio::test]
async fn unanswered_prompts_never_open_the_circuit_and_a_failing_endpoint_stops_only_itself() {
    let h = harness_with(|c| {
        c.retries_max = 0;
        c.breaker_failures_max = 2;
        c.breaker_open = Duration::from_secs(30);
    })
    .await;
    let mut open = Vec::new();
    for i in 0..10 {
        open.push(bounded(h.client.stk_push(&push(10 + i))).await.unwrap().checkout_request_id);
    }
    // Five minutes of status queries every ten seconds, none answered by the customers.
    for _ in 0..30 {
        for id in &open {
            assert_eq!(bounded(h.client.stk_query(id)).await.unwrap(), StkQueryOutcome::Pending);
        }
        h.clock.advance(10);
    }
    bounded(h.client.stk_push(&push(99))).await.expect("a new push still goes out");
    let payout = B2cPayment {
        originator_conversation_id: "pay_still_out".into(),
        phone: normalize_phone("0712 345 678").unwrap(),
        amount_whole: 5,
        remarks: "refund".into(),
    };
    bounded(h.client.b2c_payment(&payout)).await.expect("a payout still goes out");

    // The status endpoint truly failing (503 twice) opens its own circuit only.
    h.fake.fail_next(2);
    for _ in 0..2 {
        assert!(matches!(bounded(h.client.stk_query(&open[0])).await, Err(DarajaError::Unavailable(_))));
    }
    match bounded(h.client.stk_query(&open[0])).await {
        Err(DarajaError::Unavailable(why)) => assert!(why.contains("circuit is open"), "{why}"),
        other => panic!("{other:?}"),
    }
    bounded(h.client.stk_push(&push(98))).await.expect("pushes are another endpoint");
    assert_eq!(h.fake.pushes().len(), 12);
}

#[tokio::test]
async fn payouts_reversals_and_status_queries_send_what_daraja_accepts() {
    let h = harness().await;
    let payout = B2cPayment {
        originator_conversation_id: "pay_0123456789".into(),
        phone: normalize_phone("0712 345 678").unwrap(),
        amount_whole: 75,
        remarks: "Cashback\nfor order 9".into(),
    };
    let accepted = bounded(h.client.b2c_payment(&payout)).await.unwrap();
    assert_eq!(accepted.originator_conversation_id, "pay_0123456789", "Daraja echoes the gateway's id");
    let sent = &h.fake.payouts()[0];
    assert_eq!((sent.phone.as_str(), sent.amount, sent.remarks.as_str()), ("254712345678", 75, "Cashbackfor order 9"));
    assert_eq!(sent.occasion, "pay_0123456789");

    // A reversal needs a collection the fake processed, by its receipt.
    let collected = bounded(h.client.stk_push(&push(30))).await.unwrap();
    let receipt = h.fake.callback_body(&collected.checkout_request_id, 0)["Body"]["stkCallback"]["CallbackMetadata"]
        ["Item"][1]["Value"]
        .as_str()
        .unwrap()
        .to_string();
    let reversal = Reversal {
        transaction_id: receipt.clone(),
        amount_whole: 30,
        remarks: "Order cancelled".into(),
        occasion: "pay_rev".into(),
    };
    let rev = bounded(h.client.reversal(&reversal)).await.unwrap();
    assert!(!rev.originator_conversation_id.is_empty() && !rev.conversation_id.is_empty());
    let sent = &h.fake.reversals()[0];
    assert_eq!((sent.subject.as_str(), sent.amount, sent.phone.as_str()), (receipt.as_str(), 30, "254712345678"));
    // Reversing another amount, or an unknown receipt, is refused: nothing recorded.
    for (tx, amount) in [(receipt.as_str(), 29), ("NOSUCHRCPT", 30)] {
        let bad = Reversal { transaction_id: tx.into(), amount_whole: amount, ..reversal.clone() };
        assert!(matches!(bounded(h.client.reversal(&bad)).await, Err(DarajaError::Rejected { .. })));
    }
    assert_eq!(h.fake.reversals().len(), 1);

    bounded(h.client.transaction_status("pay_0123456789", "pay_0123456789", Sender::Payouts)).await.unwrap();
    let asked = h.fake.outbound().into_iter().find(|o| o.kind == OutboundKind::Status).unwrap();
    assert_eq!((asked.subject.as_str(), asked.occasion.as_str()), ("pay_0123456789", "pay_0123456789"));

    // Without an initiator, none is offered and nothing is sent.
    let bare = harness_with(|c| c.initiator_name = String::new()).await;
    assert!(!bare.client.initiator_configured());
    assert!(matches!(bare.client.b2c_payment(&payout).await, Err(DarajaError::Config(_))));
    assert_eq!(bare.fake.b2c_requests(), 0);
    // The fake's own validation holds: a wrong credential is refused.
    let wrong = harness_with(|c| c.security_credential = paygate::auth::Secret::new("wrong".into())).await;
    assert!(matches!(wrong.client.b2c_payment(&payout).await, Err(DarajaError::Rejected { .. })));
}

#[tokio::test]
async fn fake_results_parse_with_the_client_parser() {
    let inbox = Inbox::default();
    let app = axum::Router::new().route("/cb/{kind}", axum::routing::post(receive)).with_state(inbox.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/cb", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let h = harness_with(|c| {
        c.result_url = format!("{base}/result");
        c.timeout_url = format!("{base}/timeout");
    })
    .await;
    let payout = B2cPayment {
        originator_conversation_id: "pay_abc".into(),
        phone: normalize_phone("0712345678").unwrap(),
        amount_whole: 75,
        remarks: "Cashback".into(),
    };
    h.client.b2c_payment(&payout).await.unwrap();
    let failed = B2cPayment { originator_conversation_id: "pay_def".into(), ..payout.clone() };
    h.client.b2c_payment(&failed).await.unwrap();
    assert_eq!(h.fake.post_result("pay_abc", 0).await, reqwest::StatusCode::OK);
    assert_eq!(h.fake.post_result("pay_def", 2001).await, reqwest::StatusCode::OK);
    h.client.transaction_status("pay_abc", "pay_abc", Sender::Payouts).await.unwrap();
    h.client.transaction_status("pay_never_sent", "pay_never_sent", Sender::Payouts).await.unwrap();
    assert_eq!(h.fake.answer_status_queries().await.len(), 2);
    assert_eq!(h.fake.post_timeout("pay_def").await, reqwest::StatusCode::OK);

    let received: Vec<_> = inbox.0.lock().unwrap().iter().map(|b| parse_result(b).unwrap()).collect();
    assert_eq!(received.len(), 5);
    let ok = &received[0];
    assert_eq!((ok.result_code.as_str(), ok.originator_conversation_id.as_str()), ("0", "pay_abc"));
    assert_eq!((ok.amount_minor, ok.party.as_deref()), (Some(7_500), Some("254712345678")));
    assert_eq!(ok.receipt.as_ref().map(String::len), Some(10));
    let no = &received[1];
    assert_eq!((no.result_code.as_str(), no.amount_minor, no.receipt.as_deref()), ("2001", None, None));
    let status = &received[2];
    assert_eq!(
        (status.transaction_status.as_deref(), status.occasion.as_deref()),
        (Some("Completed"), Some("pay_abc"))
    );
    assert_eq!((status.receipt.clone(), status.amount_minor), (ok.receipt.clone(), Some(7_500)));
    let unknown = &received[3];
    assert_ne!(unknown.result_code, "0");
    assert_eq!(unknown.occasion.as_deref(), Some("pay_never_sent"));
    assert_eq!(received[4].occasion.as_deref(), Some("pay_def"));
    for bad in [
        &b"{}"[..],
        br#"{"Result":{"ResultCode":0}}"#,
        br#"{"Result":{"ResultCode":[],"ResultDesc":"d","OriginatorConversationID":"o","ConversationID":"c"}}"#,
    ] {
        assert!(parse_result(bad).is_err(), "{}", String::from_utf8_lossy(bad));
    }
    server.abort();
}

/// Business Pay Bill and Buy Goods: what Daraja's B2B API takes (sent from the business's short
/// code under the gateway's id), its result parsed by the client's parser (the amount as a decimal
/// string, the business by number), and a status query found only from the short code that paid.
#[tokio::test]
async fn business_payments_send_what_daraja_accepts_and_their_results_parse() {
    let inbox = Inbox::default();
    let app = axum::Router::new().route("/cb/{kind}", axum::routing::post(receive)).with_state(inbox.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/cb", listener.local_addr().unwrap());
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let h = harness_with(|c| {
        c.result_url = format!("{base}/result");
        c.timeout_url = format!("{base}/timeout");
    })
    .await;
    let bill = B2bPayment {
        originator_conversation_id: "pay_bill".into(),
        to: BusinessTo::Paybill { number: "888880".into(), account_reference: "ACC\n-42".into() },
        amount_whole: 2_500,
        remarks: "Power bill".into(),
    };
    let accepted = bounded(h.client.b2b_payment(&bill)).await.unwrap();
    assert_eq!(accepted.originator_conversation_id, "pay_bill");
    let till = B2bPayment {
        originator_conversation_id: "pay_till".into(),
        to: BusinessTo::Till { number: "5123456".into() },
        ..bill.clone()
    };
    bounded(h.client.b2b_payment(&till)).await.unwrap();
    let sent = h.fake.business_payments();
    assert_eq!(
        (sent[0].subject.as_str(), sent[0].phone.as_str(), sent[0].account_reference.as_str(), sent[0].amount),
        ("BusinessPayBill", "888880", "ACC-42", 2_500)
    );
    assert_eq!((sent[1].subject.as_str(), sent[1].phone.as_str()), ("BusinessBuyGoods", "5123456"));
    assert_eq!(sent[0].occasion, "pay_bill");
    // Refused before sending: no amount, a number that is not one, an empty account reference.
    for bad in [
        B2bPayment { amount_whole: 0, ..bill.clone() },
        B2bPayment { to: BusinessTo::Till { number: "12a45".into() }, ..bill.clone() },
        B2bPayment {
            to: BusinessTo::Paybill { number: "888880".into(), account_reference: " ".into() },
            ..bill.clone()
        },
    ] {
        assert!(matches!(h.client.b2b_payment(&bad).await, Err(DarajaError::Rejected { .. })), "{bad:?}");
    }
    assert_eq!(h.fake.b2b_requests(), 2);

    assert_eq!(h.fake.post_result("pay_bill", 0).await, reqwest::StatusCode::OK);
    // Asked from the payouts short code, Daraja does not find a B2B payment; from the business's, it does.
    h.client.transaction_status("pay_bill", "pay_bill", Sender::Payouts).await.unwrap();
    h.client.transaction_status("pay_bill", "pay_bill", Sender::Business).await.unwrap();
    assert_eq!(h.fake.answer_status_queries().await.len(), 2);
    let received: Vec<_> = inbox.0.lock().unwrap().iter().map(|b| parse_result(b).unwrap()).collect();
    let ok = &received[0];
    assert_eq!((ok.result_code.as_str(), ok.originator_conversation_id.as_str()), ("0", "pay_bill"));
    assert_eq!(
        (ok.amount_minor, ok.party.as_deref(), ok.occasion.as_deref()),
        (Some(250_000), Some("888880"), Some("pay_bill"))
    );
    assert_eq!(ok.receipt.as_ref().map(String::len), Some(10));
    assert_ne!(received[1].result_code, "0", "not found from the payouts short code");
    assert_eq!(received[2].transaction_status.as_deref(), Some("Completed"));
    server.abort();
}

/// The standalone M-Pesa simulator (`paygate rail-simulator mpesa`) holds a client to Daraja's
/// rules as the fake does: only the configured app credentials get a token, only the configured
/// passkey makes a password it takes, only the configured initiator pays out, reverses or asks;
/// only a paid receipt is reversed. What it answers reads as Daraja's: a prompt still open is
/// "being processed", a declined or unanswered one completes with Daraja's codes, and a payout's
/// and a reversal's results parse with the client's parser, naming the amount, receipt and party.
#[tokio::test]
async fn the_standalone_simulator_holds_a_client_to_darajas_rules() {
    use paygate::backend::mpesa::simulator::DarajaSimulator;
    use paygate::backend::simulator::{Answer, Pick, RailSimulator};
    let inbox = Inbox::default();
    let app = axum::Router::new().route("/cb/{kind}", axum::routing::post(receive)).with_state(inbox.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let base = format!("http://{}/cb", listener.local_addr().unwrap());
    let receiver = tokio::spawn(async move { axum::serve(listener, app).await });
    let fake = DarajaFake::start(FakeConfig::default()).await;
    let mut cfg = fake.client_config(&format!("{base}/stk"));
    (cfg.result_url, cfg.timeout_url) = (format!("{base}/result"), format!("{base}/timeout"));
    let sim: Arc<dyn RailSimulator> = Arc::new(DarajaSimulator::standalone(cfg.clone(), None, 100).unwrap());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    cfg.base_url = format!("http://{}", listener.local_addr().unwrap());
    let server =
        tokio::spawn(paygate::backend::simulator_server::serve(listener, sim.clone(), None, std::future::pending()));
    let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(T0));
    let client_with = |adjust: fn(&mut DarajaConfig)| {
        let mut c = cfg.clone();
        adjust(&mut c);
        DarajaClient::new(c, clock.clone()).unwrap()
    };
    let client = client_with(|_| {});
    let refused = |r: Result<(), DarajaError>| matches!(r, Err(DarajaError::Unavailable(why)) if why.contains("token request refused"));
    assert!(refused(
        client_with(|c| c.consumer_secret = paygate::auth::Secret::new("wrong".into())).check_credentials().await
    ));
    assert!(refused(
        client_with(|c| c.consumer_key = paygate::auth::Secret::new("other".into())).check_credentials().await
    ));
    client.check_credentials().await.unwrap();
    let bad_field = |r: &Result<_, DarajaError>, field: &str| matches!(r, Err(DarajaError::Rejected { code, message }) if code == "400.002.02" && message.ends_with(field));
    let other_passkey = client_with(|c| c.passkey = paygate::auth::Secret::new("0".repeat(64)));
    assert!(bad_field(&bounded(other_passkey.stk_push(&push(10))).await.map(drop), "Password"));

    // Prompts: open, then declined, then one never answered.
    let declined = bounded(client.stk_push(&push(10))).await.unwrap();
    assert_eq!(bounded(client.stk_query(&declined.checkout_request_id)).await.unwrap(), StkQueryOutcome::Pending);
    let unanswered = bounded(client.stk_push(&push(11))).await.unwrap();
    let paid = bounded(client.stk_push(&push(30))).await.unwrap();
    bounded(client.stk_push(&push(1))).await.expect("one shilling is the least Daraja takes");
    for (id, answer) in [
        (&declined.checkout_request_id, Answer::Decline),
        (&unanswered.checkout_request_id, Answer::Timeout),
        (&paid.checkout_request_id, Answer::Accept),
    ] {
        let (answered, status) = sim.answer(Pick::Id(id), answer).await.unwrap();
        assert_eq!((answered.as_str(), status), (id.as_str(), Some(200)));
    }
    for (id, code) in
        [(&declined.checkout_request_id, 1032), (&unanswered.checkout_request_id, 1037), (&paid.checkout_request_id, 0)]
    {
        match bounded(client.stk_query(id)).await.unwrap() {
            StkQueryOutcome::Completed { result_code, result_desc } => {
                assert_eq!(result_code, code);
                assert!(!result_desc.is_empty());
            }
            other => panic!("{code}: {other:?}"),
        }
    }
    assert!(bad_field(&bounded(client.stk_query("ws_CO_NOSUCH")).await.map(drop), "CheckoutRequestID"));
    let callbacks: Vec<_> = inbox.0.lock().unwrap().iter().map(|b| parse_callback(b).unwrap()).collect();
    let codes: Vec<i64> = callbacks.iter().map(|c| c.result_code).collect();
    assert_eq!(codes, vec![1032, 1037, 0]);
    let receipt = callbacks[2].receipt.clone().unwrap();
    assert_eq!((receipt.len(), callbacks[2].amount_minor), (10, Some(3_000)));
    inbox.0.lock().unwrap().clear();

    // Money out: only the configured initiator; a reversal only of a paid receipt.
    let payout = B2cPayment {
        originator_conversation_id: "pay_sim_1".into(),
        phone: normalize_phone("0712345678").unwrap(),
        amount_whole: 75,
        remarks: "Cashback".into(),
    };
    let impostor = client_with(|c| c.initiator_name = "someone".into());
    assert!(bad_field(&bounded(impostor.b2c_payment(&payout)).await.map(drop), "Initiator"));
    let reversal = Reversal {
        transaction_id: receipt.clone(),
        amount_whole: 30,
        remarks: "Cancelled".into(),
        occasion: "pay_rev".into(),
    };
    assert!(bad_field(&bounded(impostor.reversal(&reversal)).await.map(drop), "Initiator"));
    assert!(bad_field(
        &bounded(impostor.transaction_status("pay_sim_1", "pay_sim_1", Sender::Payouts)).await.map(drop),
        "Initiator"
    ));
    let never_paid = Reversal { transaction_id: "SIM9999999".into(), ..reversal.clone() };
    assert!(bad_field(&bounded(client.reversal(&never_paid)).await.map(drop), "TransactionID"));
    bounded(client.b2c_payment(&payout)).await.unwrap();
    let rev = bounded(client.reversal(&reversal)).await.unwrap();
    sim.answer(Pick::Id("pay_sim_1"), Answer::Accept).await.unwrap();
    sim.answer(Pick::Id(&rev.originator_conversation_id), Answer::Accept).await.unwrap();
    // Asked about once answered, the payout's status is posted with the question.
    bounded(client.transaction_status("pay_sim_1", "pay_sim_1", Sender::Payouts)).await.unwrap();
    let results: Vec<_> = inbox.0.lock().unwrap().iter().map(|b| parse_result(b).unwrap()).collect();
    assert_eq!(results.len(), 3, "{results:?}");
    let paid_out = &results[0];
    assert_eq!(
        (paid_out.result_code.as_str(), paid_out.originator_conversation_id.as_str(), paid_out.amount_minor),
        ("0", "pay_sim_1", Some(7_500))
    );
    assert_eq!(paid_out.party.as_deref(), Some("254712345678"));
    assert_eq!(paid_out.receipt.as_ref().map(String::len), Some(10));
    let reversed = &results[1];
    assert_eq!((reversed.result_code.as_str(), reversed.amount_minor), ("0", Some(3_000)));
    assert_eq!(reversed.occasion.as_deref(), Some("pay_rev"));
    let status = &results[2];
    assert_eq!(status.transaction_status.as_deref(), Some("Completed"));
    assert_eq!((status.receipt.as_ref(), status.occasion.as_deref()), (paid_out.receipt.as_ref(), Some("pay_sim_1")));
    server.abort();
    receiver.abort();
}

/// One shilling is the least Daraja takes, and a push, a payout and a business payment of it go
/// out (the bound refuses nothing it should not).
#[tokio::test]
async fn one_shilling_is_the_least_and_it_goes_out() {
    let h = harness().await;
    bounded(h.client.stk_push(&push(1))).await.unwrap();
    let payout = B2cPayment {
        originator_conversation_id: "pay_one".into(),
        phone: normalize_phone("0712345678").unwrap(),
        amount_whole: 1,
        remarks: "One".into(),
    };
    bounded(h.client.b2c_payment(&payout)).await.unwrap();
    let bill = B2bPayment {
        originator_conversation_id: "pay_one_bill".into(),
        to: BusinessTo::Till { number: "5123456".into() },
        amount_whole: 1,
        remarks: "One".into(),
    };
    bounded(h.client.b2b_payment(&bill)).await.unwrap();
    assert_eq!(
        (h.fake.pushes()[0].amount, h.fake.payouts()[0].amount, h.fake.business_payments()[0].amount),
        (1, 1, 1)
    );
    // And the one-shilling collection is reversed whole.
    let checkout = h.fake.pushes()[0].checkout_request_id.clone();
    let receipt = h.fake.callback_body(&checkout, 0)["Body"]["stkCallback"]["CallbackMetadata"]["Item"][1]["Value"]
        .as_str()
        .unwrap()
        .to_string();
    let reversal =
        Reversal { transaction_id: receipt, amount_whole: 1, remarks: "Undo".into(), occasion: "pay_rev1".into() };
    bounded(h.client.reversal(&reversal)).await.unwrap();
    assert_eq!(h.fake.reversals()[0].amount, 1);
}
