//! A local Safaricom Daraja fake: a real HTTP server on 127.0.0.1:0 (axum), never the internet.
//!
//! It implements OAuth (`GET /oauth/v1/generate`), STK push (`POST /mpesa/stkpush/v1/processrequest`),
//! STK query (`POST /mpesa/stkpushquery/v1/query`), B2C payouts (`POST /mpesa/b2c/v3/paymentrequest`),
//! B2B payments to paybills and tills (`POST /mpesa/b2b/v1/paymentrequest`),
//! reversals (`POST /mpesa/reversal/v1/request`) and the Transaction Status API
//! (`POST /mpesa/transactionstatus/v1/query`), and validates requests the way Daraja does:
//! Basic auth, issued and unexpired Bearer tokens (by the injected clock), the STK password, field
//! formats and lengths. Invalid requests get Daraja's `400.002.02` error body. Tests steer it with
//! [`DarajaFake::set_push_mode`] and [`DarajaFake::set_query`], and play Daraja's result callback
//! with [`DarajaFake::callback`]. Payouts and reversals are steered with
//! [`DarajaFake::set_outbound_mode`]; their results are posted with [`DarajaFake::post_result`] and
//! [`DarajaFake::post_timeout`], and status queries are answered (from what the fake processed) with
//! [`DarajaFake::answer_status_queries`]. [`DarajaFake::fail_next`] makes the next API calls answer
//! 503 unprocessed (transient failures).
//!
//! Include it from a test file with
//! `#[path = "common/daraja.rs"] mod daraja;`
//! (tests/common/mod.rs does not declare it, so test binaries that do not use it do not build it).
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use paygate::auth::Secret;
use paygate::backend::mpesa::daraja::DarajaConfig;
use paygate::clock::{Clock, SystemClock};
use serde_json::{Value, json};

/// The sandbox passkey from Daraja's documentation (public, test-only).
pub const SANDBOX_PASSKEY: &str = "bfb279f9aa9bdbcf158e97dd71a467cd2e0c893059b10f78e6b72ada1ed2c919";
/// The sandbox paybill short code.
pub const SANDBOX_SHORT_CODE: &str = "174379";

#[derive(Clone)]
pub struct FakeConfig {
    pub consumer_key: String,
    pub consumer_secret: String,
    pub short_code: String,
    pub passkey: String,
    /// What the fake sends as `expires_in` (Daraja: "3599"), and how long its tokens are honoured.
    pub token_ttl_secs: i64,
    /// Token expiry and `TransactionDate` read this clock; share a `ManualClock` with the client.
    pub clock: Arc<dyn Clock>,
    /// The API operator and its credential that payouts, reversals and status queries must carry.
    pub initiator_name: String,
    pub security_credential: String,
    pub b2c_short_code: String,
}

impl Default for FakeConfig {
    fn default() -> Self {
        FakeConfig {
            consumer_key: "fake-consumer-key".into(),
            consumer_secret: "fake-consumer-secret".into(),
            short_code: SANDBOX_SHORT_CODE.into(),
            passkey: SANDBOX_PASSKEY.into(),
            token_ttl_secs: 3599,
            clock: Arc::new(SystemClock),
            initiator_name: "testapi".into(),
            security_credential: "fake-security-credential".into(),
            b2c_short_code: "600996".into(),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PushMode {
    /// Record the push and answer `ResponseCode "0"`.
    Accept,
    /// Record the push and never answer (the client's timeout fires after sending).
    Hang,
    /// Record the push (it may have been processed) and answer HTTP 500.
    Fail500,
    /// Refuse with HTTP 400 `400.002.02`; nothing is recorded.
    Reject,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum QueryAnswer {
    /// HTTP 500 `500.001.1001` "The transaction is being processed" (the default for a known push).
    Processing,
    /// HTTP 200 with `ResultCode` (as a string, as Daraja sends it) and `ResultDesc`.
    Result(i64, String),
    /// Never answer.
    Hang,
}

/// How the fake answers payouts and reversals.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboundMode {
    /// Record it (processed) and answer `ResponseCode "0"`.
    Accept,
    /// Record it (processed) and never answer.
    Hang,
    /// Refuse with HTTP 400; nothing is recorded.
    Reject,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutboundKind {
    Payout,
    /// A B2B payment to a paybill or a till.
    Business,
    Reversal,
    Status,
}

/// A payout, reversal or status query the fake received (and, for the first two, processed).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedOutbound {
    pub kind: OutboundKind,
    /// The payout's own (sent by the client) or one the fake made (reversals, status queries).
    pub originator_conversation_id: String,
    pub conversation_id: String,
    /// Payouts: the customer (PartyB). Business payments: the paybill or till (PartyB). Reversals:
    /// the customer the original payment came from. Status queries: the PartyA asked from.
    pub phone: String,
    pub amount: i64,
    /// Reversals: the receipt reversed. Status queries: the `OriginatorConversationID` asked about.
    /// Business payments: the CommandID (`BusinessPayBill`, `BusinessBuyGoods`).
    pub subject: String,
    /// Business payments: the AccountReference.
    pub account_reference: String,
    pub remarks: String,
    pub occasion: String,
    pub result_url: String,
    pub timeout_url: String,
    /// The receipt the fake gives it (payouts, reversals).
    pub receipt: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedPush {
    pub checkout_request_id: String,
    pub merchant_request_id: String,
    pub phone: String,
    pub party_a: String,
    pub party_b: String,
    pub amount: i64,
    pub account_reference: String,
    pub description: String,
    pub callback_url: String,
    pub transaction_type: String,
    pub timestamp: String,
}

struct FakeState {
    cfg: FakeConfig,
    inner: Mutex<Inner>,
    token_requests: AtomicUsize,
    push_requests: AtomicUsize,
    query_requests: AtomicUsize,
    b2c_requests: AtomicUsize,
    b2b_requests: AtomicUsize,
    reversal_requests: AtomicUsize,
    status_requests: AtomicUsize,
    pushed: tokio::sync::Notify,
}

struct Inner {
    /// token → expires at (unix secs).
    tokens: HashMap<String, i64>,
    reject_all_tokens: bool,
    /// How a call with a token the fake does not know is refused: (status, with Daraja's
    /// `404.001.03` body); `None`, the usual 401 with it.
    invalid_token_answer: Option<(StatusCode, bool)>,
    push_mode: PushMode,
    pushes: Vec<RecordedPush>,
    queries: HashMap<String, QueryAnswer>,
    seq: u64,
    outbound_mode: OutboundMode,
    outbound: Vec<RecordedOutbound>,
    /// Status queries answered so far (by index into `outbound`).
    answered_status: std::collections::HashSet<usize>,
    /// The result each processed payout or reversal has (by originator id; default 0, success).
    outcomes: HashMap<String, i64>,
    /// API calls still to answer 503 before they are looked at.
    fail_next: usize,
}

pub struct DarajaFake {
    base_url: String,
    state: Arc<FakeState>,
    http: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for DarajaFake {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl DarajaFake {
    pub async fn start(cfg: FakeConfig) -> DarajaFake {
        paygate::install_crypto_provider();
        let state = Arc::new(FakeState {
            cfg,
            inner: Mutex::new(Inner {
                tokens: HashMap::new(),
                reject_all_tokens: false,
                invalid_token_answer: None,
                push_mode: PushMode::Accept,
                pushes: Vec::new(),
                queries: HashMap::new(),
                seq: 0,
                outbound_mode: OutboundMode::Accept,
                outbound: Vec::new(),
                answered_status: Default::default(),
                outcomes: HashMap::new(),
                fail_next: 0,
            }),
            token_requests: AtomicUsize::new(0),
            push_requests: AtomicUsize::new(0),
            query_requests: AtomicUsize::new(0),
            b2c_requests: AtomicUsize::new(0),
            b2b_requests: AtomicUsize::new(0),
            reversal_requests: AtomicUsize::new(0),
            status_requests: AtomicUsize::new(0),
            pushed: tokio::sync::Notify::new(),
        });
        let app = Router::new()
            .route("/oauth/v1/generate", get(oauth))
            .route("/mpesa/stkpush/v1/processrequest", post(stk_push))
            .route("/mpesa/stkpushquery/v1/query", post(stk_query))
            .route("/mpesa/b2c/v3/paymentrequest", post(b2c))
            .route("/mpesa/b2b/v1/paymentrequest", post(b2b))
            .route("/mpesa/reversal/v1/request", post(reversal))
            .route("/mpesa/transactionstatus/v1/query", post(transaction_status))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind daraja fake");
        let addr = listener.local_addr().expect("daraja fake address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("callback client");
        DarajaFake { base_url: format!("http://{addr}"), state, http, server }
    }

    pub fn base_url(&self) -> String {
        self.base_url.clone()
    }

    /// A client config that matches this fake (paybill, 2 s connect, 5 s request, 60 s margin).
    pub fn client_config(&self, callback_url: &str) -> DarajaConfig {
        let cfg = &self.state.cfg;
        DarajaConfig {
            base_url: self.base_url(),
            consumer_key: Secret::new(cfg.consumer_key.clone()),
            consumer_secret: Secret::new(cfg.consumer_secret.clone()),
            short_code: cfg.short_code.clone(),
            passkey: Secret::new(cfg.passkey.clone()),
            callback_url: callback_url.to_string(),
            transaction_type: "CustomerPayBillOnline".into(),
            party_b: cfg.short_code.clone(),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            token_refresh_margin_secs: 60,
            result_url: callback_url.replace("/stk/", "/result/"),
            timeout_url: callback_url.replace("/stk/", "/timeout/"),
            initiator_name: cfg.initiator_name.clone(),
            security_credential: Secret::new(cfg.security_credential.clone()),
            b2c_short_code: cfg.b2c_short_code.clone(),
            retries_max: 2,
            breaker_failures_max: 5,
            breaker_open: Duration::from_secs(30),
        }
    }

    pub fn set_outbound_mode(&self, mode: OutboundMode) {
        self.state.inner.lock().unwrap().outbound_mode = mode;
    }

    /// The next `n` API calls (push, query, payout, reversal, status; not OAuth) answer HTTP 503
    /// before the fake looks at them: nothing is processed or recorded.
    pub fn fail_next(&self, n: usize) {
        self.state.inner.lock().unwrap().fail_next = n;
    }

    /// The result a processed payout or reversal has (success unless set).
    pub fn set_outcome(&self, originator_conversation_id: &str, result_code: i64) {
        self.state.inner.lock().unwrap().outcomes.insert(originator_conversation_id.to_string(), result_code);
    }

    /// Every payout, reversal and status query received and recorded, oldest first.
    pub fn outbound(&self) -> Vec<RecordedOutbound> {
        self.state.inner.lock().unwrap().outbound.clone()
    }

    pub fn payouts(&self) -> Vec<RecordedOutbound> {
        self.outbound().into_iter().filter(|o| o.kind == OutboundKind::Payout).collect()
    }

    /// The B2B payments the fake processed.
    pub fn business_payments(&self) -> Vec<RecordedOutbound> {
        self.outbound().into_iter().filter(|o| o.kind == OutboundKind::Business).collect()
    }

    pub fn b2b_requests(&self) -> usize {
        self.state.b2b_requests.load(Ordering::SeqCst)
    }

    pub fn reversals(&self) -> Vec<RecordedOutbound> {
        self.outbound().into_iter().filter(|o| o.kind == OutboundKind::Reversal).collect()
    }

    /// B2C, reversal and status requests received (valid or not, answered or failed).
    pub fn b2c_requests(&self) -> usize {
        self.state.b2c_requests.load(Ordering::SeqCst)
    }

    pub fn reversal_requests(&self) -> usize {
        self.state.reversal_requests.load(Ordering::SeqCst)
    }

    pub fn status_requests(&self) -> usize {
        self.state.status_requests.load(Ordering::SeqCst)
    }

    fn recorded(&self, originator_conversation_id: &str) -> RecordedOutbound {
        self.outbound()
            .into_iter()
            .find(|o| o.kind != OutboundKind::Status && o.originator_conversation_id == originator_conversation_id)
            .unwrap_or_else(|| panic!("daraja fake: no payout or reversal {originator_conversation_id}"))
    }

    /// The result Daraja would post for a processed payout or reversal with this result code.
    pub fn result_body(&self, originator_conversation_id: &str, result_code: i64) -> Value {
        let o = self.recorded(originator_conversation_id);
        let mut r = json!({
            "ResultType": 0,
            "ResultCode": result_code,
            "ResultDesc": result_desc(result_code),
            "OriginatorConversationID": o.originator_conversation_id,
            "ConversationID": o.conversation_id,
            "TransactionID": if result_code == 0 { o.receipt.clone() } else { "NLJ0000000".to_string() },
            "ReferenceData": {"ReferenceItem": [
                {"Key": "QueueTimeoutURL", "Value": o.timeout_url},
                {"Key": "Occasion", "Value": o.occasion},
            ]},
        });
        if o.kind == OutboundKind::Business {
            r["ReferenceData"] = json!({"ReferenceItem": [
                {"Key": "BillReferenceNumber", "Value": o.account_reference},
                {"Key": "QueueTimeoutURL", "Value": o.timeout_url},
                {"Key": "Occassion", "Value": o.occasion},
            ]});
        }
        if result_code == 0 {
            let party = format!("{} - Jane Doe", o.phone);
            r["ResultParameters"] = match o.kind {
                OutboundKind::Payout => json!({"ResultParameter": [
                    {"Key": "TransactionAmount", "Value": o.amount},
                    {"Key": "TransactionReceipt", "Value": o.receipt},
                    {"Key": "ReceiverPartyPublicName", "Value": party},
                    {"Key": "TransactionCompletedDateTime", "Value": "01.12.2026 12:00:00"},
                    {"Key": "B2CUtilityAccountAvailableFunds", "Value": 10116.00},
                ]}),
                // As Daraja's B2B result shows it: the amount as a decimal string, the business by
                // its number and name.
                OutboundKind::Business => json!({"ResultParameter": [
                    {"Key": "DebitAccountBalance", "Value": "{Amount={CurrencyCode=KES, MinimumAmount=618683, BasicAmount=6186.83}}"},
                    {"Key": "Amount", "Value": format!("{}.00", o.amount)},
                    {"Key": "TransCompletedTime", "Value": "20261201120000"},
                    {"Key": "DebitPartyCharges", "Value": ""},
                    {"Key": "ReceiverPartyPublicName", "Value": format!("{} - Kenya Power", o.phone)},
                    {"Key": "Currency", "Value": "KES"},
                ]}),
                _ => json!({"ResultParameter": [
                    {"Key": "Amount", "Value": o.amount as f64},
                    {"Key": "OriginalTransactionID", "Value": o.subject},
                    {"Key": "CreditPartyPublicName", "Value": party},
                    {"Key": "DebitPartyPublicName", "Value": format!("{} - Business", self.state.cfg.short_code)},
                ]}),
            };
        }
        json!({ "Result": r })
    }

    /// Posts a processed payout's or reversal's result to its ResultURL; the gateway's status.
    pub async fn post_result(&self, originator_conversation_id: &str, result_code: i64) -> reqwest::StatusCode {
        self.set_outcome(originator_conversation_id, result_code);
        let url = self.recorded(originator_conversation_id).result_url;
        self.callback_to(&url, self.result_body(originator_conversation_id, result_code)).await
    }

    /// Posts Daraja's queue-timeout notice for a payout or reversal to its QueueTimeOutURL.
    pub async fn post_timeout(&self, originator_conversation_id: &str) -> reqwest::StatusCode {
        let o = self.recorded(originator_conversation_id);
        let body = json!({"Result": {
            "ResultType": 1, "ResultCode": 1, "ResultDesc": "The request timed out in the queue",
            "OriginatorConversationID": o.originator_conversation_id, "ConversationID": o.conversation_id,
            "ReferenceData": {"ReferenceItem": {"Key": "Occasion", "Value": o.occasion}},
        }});
        self.callback_to(&o.timeout_url, body).await
    }

    /// Answers every status query not yet answered, from what the fake processed: a payout it
    /// recorded is "Completed" (or "Failed" when its outcome is a failure); one it never received
    /// gets a non-zero ResultCode ("no such transaction"). Returns the gateway's statuses.
    pub async fn answer_status_queries(&self) -> Vec<reqwest::StatusCode> {
        let to_answer: Vec<(usize, RecordedOutbound)> = {
            let mut inner = self.state.inner.lock().unwrap();
            let list: Vec<_> = inner
                .outbound
                .iter()
                .enumerate()
                .filter(|(i, o)| o.kind == OutboundKind::Status && !inner.answered_status.contains(i))
                .map(|(i, o)| (i, o.clone()))
                .collect();
            inner.answered_status.extend(list.iter().map(|(i, _)| *i));
            list
        };
        let mut statuses = vec![];
        for (_, q) in to_answer {
            let target = self
                .outbound()
                .into_iter()
                .find(|o| o.kind != OutboundKind::Status && o.originator_conversation_id == q.subject);
            let mut r = json!({
                "ResultType": 0,
                "OriginatorConversationID": q.originator_conversation_id,
                "ConversationID": q.conversation_id,
                "TransactionID": "NLJ0000000",
                "ReferenceData": {"ReferenceItem": {"Key": "Occasion", "Value": q.occasion}},
            });
            // Daraja finds a transaction only from the short code that sent it.
            let sender = |t: &RecordedOutbound| match t.kind {
                OutboundKind::Business => self.state.cfg.short_code.clone(),
                _ => self.state.cfg.b2c_short_code.clone(),
            };
            match target.filter(|t| sender(t) == q.phone) {
                Some(t) => {
                    let code = self.state.inner.lock().unwrap().outcomes.get(&t.originator_conversation_id).copied();
                    let status = if code.unwrap_or(0) == 0 { "Completed" } else { "Failed" };
                    r["ResultCode"] = json!(0);
                    r["ResultDesc"] = json!("The service request is processed successfully.");
                    r["ResultParameters"] = json!({"ResultParameter": [
                        {"Key": "ReceiptNo", "Value": t.receipt},
                        {"Key": "TransactionStatus", "Value": status},
                        {"Key": "Amount", "Value": t.amount},
                        {"Key": "CreditPartyName", "Value": format!("{} - Jane Doe", t.phone)},
                        {"Key": "DebitPartyName", "Value": format!("{} - Business", self.state.cfg.b2c_short_code)},
                    ]});
                }
                None => {
                    r["ResultCode"] = json!(2032);
                    r["ResultDesc"] = json!("The transaction could not be found");
                    r["ResultParameters"] =
                        json!({"ResultParameter": [{"Key": "TransactionStatus", "Value": "Unknown"}]});
                }
            }
            statuses.push(self.callback_to(&q.result_url, json!({ "Result": r })).await);
        }
        statuses
    }

    pub fn set_push_mode(&self, mode: PushMode) {
        self.state.inner.lock().unwrap().push_mode = mode;
    }

    pub fn set_query(&self, checkout_id: &str, answer: QueryAnswer) {
        self.state.inner.lock().unwrap().queries.insert(checkout_id.to_string(), answer);
    }

    /// Forget every issued token: the next API call with a cached token gets 401 `404.001.03`.
    pub fn revoke_tokens(&self) {
        self.state.inner.lock().unwrap().tokens.clear();
    }

    /// Refuse a token the fake does not know with `status`, with Daraja's `404.001.03` body or
    /// none (Daraja's gateway answers both ways).
    pub fn set_invalid_token_answer(&self, status: StatusCode, with_code: bool) {
        self.state.inner.lock().unwrap().invalid_token_answer = Some((status, with_code));
    }

    /// While set, every API call is refused with 401 (even with a fresh token).
    pub fn set_reject_all_tokens(&self, on: bool) {
        self.state.inner.lock().unwrap().reject_all_tokens = on;
    }

    /// Every recorded push (accepted, hung or failed with 500), oldest first.
    pub fn pushes(&self) -> Vec<RecordedPush> {
        self.state.inner.lock().unwrap().pushes.clone()
    }

    pub fn push(&self, checkout_id: &str) -> Option<RecordedPush> {
        self.pushes().into_iter().find(|p| p.checkout_request_id == checkout_id)
    }

    /// Waits (at most 10 s) until at least `n` pushes are recorded, and returns them.
    pub async fn wait_for_pushes(&self, n: usize) -> Vec<RecordedPush> {
        let wait = async {
            loop {
                let notified = self.state.pushed.notified();
                let pushes = self.pushes();
                if pushes.len() >= n {
                    return pushes;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(10), wait).await.expect("daraja fake: pushes never arrived")
    }

    /// Token requests received (valid or not).
    pub fn token_requests(&self) -> usize {
        self.state.token_requests.load(Ordering::SeqCst)
    }

    /// STK push requests received (valid or not).
    pub fn push_requests(&self) -> usize {
        self.state.push_requests.load(Ordering::SeqCst)
    }

    /// STK query requests received (valid or not).
    pub fn query_requests(&self) -> usize {
        self.state.query_requests.load(Ordering::SeqCst)
    }

    /// The callback Daraja would post for this push (ResultCode 0 carries CallbackMetadata).
    pub fn callback_body(&self, checkout_id: &str, result_code: i64) -> Value {
        let push = self.push(checkout_id).unwrap_or_else(|| panic!("daraja fake: no push {checkout_id}"));
        let mut cb = json!({
            "MerchantRequestID": push.merchant_request_id,
            "CheckoutRequestID": push.checkout_request_id,
            "ResultCode": result_code,
            "ResultDesc": result_desc(result_code),
        });
        if result_code == 0 {
            let date: u64 = eat_timestamp(self.state.cfg.clock.now()).parse().expect("digits");
            let phone: u64 = push.phone.parse().expect("digits");
            cb["CallbackMetadata"] = json!({"Item": [
                {"Name": "Amount", "Value": push.amount as f64},
                {"Name": "MpesaReceiptNumber", "Value": receipt_for(&push.checkout_request_id)},
                {"Name": "Balance"},
                {"Name": "TransactionDate", "Value": date},
                {"Name": "PhoneNumber", "Value": phone},
            ]});
        }
        json!({ "Body": { "stkCallback": cb } })
    }

    /// Posts the result callback to the push's CallBackURL and returns the gateway's HTTP status.
    /// Afterwards, a query for this push answers the same result.
    pub async fn callback(&self, checkout_id: &str, result_code: i64) -> reqwest::StatusCode {
        let body = self.callback_body(checkout_id, result_code);
        let url = self.push(checkout_id).map(|p| p.callback_url).expect("known push");
        self.set_query(checkout_id, QueryAnswer::Result(result_code, result_desc(result_code).to_string()));
        self.callback_to(&url, body).await
    }

    /// Posts any body to any URL, as Daraja posts callbacks (JSON, no signature).
    pub async fn callback_to(&self, url: &str, body: Value) -> reqwest::StatusCode {
        let resp = self.http.post(url).json(&body).send().await.unwrap_or_else(|e| panic!("callback to {url}: {e}"));
        resp.status()
    }
}

/// Daraja's result descriptions for the common codes.
pub fn result_desc(code: i64) -> &'static str {
    match code {
        0 => "The service request is processed successfully.",
        1 => "The balance is insufficient for the transaction.",
        1001 => "Unable to lock subscriber, a transaction is already in process for the current subscriber",
        1019 => "Transaction has expired",
        1032 => "Request cancelled by user",
        1037 => "DS timeout user cannot be reached",
        2001 => "The initiator information is invalid.",
        2040 => "Credit Party customer type (Unregistered or Registered Customer) can't be supported by the service.",
        _ => "Fake Daraja result",
    }
}

/// A 10-character receipt like `NLJ7RT61SV`, stable per checkout id.
fn receipt_for(checkout_id: &str) -> String {
    let h = checkout_id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let mut out = String::from("TK");
    let alphabet = b"ABCDEFGHJKLMNPQRSTUVWXYZ0123456789";
    let mut x = h;
    for _ in 0..8 {
        out.push(alphabet[(x % alphabet.len() as u64) as usize] as char);
        x /= alphabet.len() as u64;
    }
    out
}

/// `YYYYMMDDHHmmss` in EAT, computed independently of the client's code.
fn eat_timestamp(unix: i64) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(unix + 3 * 3600).expect("sane clock");
    format!("{:04}{:02}{:02}{:02}{:02}{:02}", t.year(), t.month() as u8, t.day(), t.hour(), t.minute(), t.second())
}

fn request_id(seq: u64) -> String {
    format!("fake-{seq}-{}", std::process::id())
}

fn daraja_error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, axum::Json(json!({"requestId": request_id(0), "errorCode": code, "errorMessage": message})))
        .into_response()
}

fn bad_request(field: &str) -> Response {
    daraja_error(StatusCode::BAD_REQUEST, "400.002.02", &format!("Bad Request - Invalid {field}"))
}

async fn oauth(
    State(st): State<Arc<FakeState>>,
    Query(q): Query<HashMap<String, String>>,
    headers: HeaderMap,
) -> Response {
    st.token_requests.fetch_add(1, Ordering::SeqCst);
    if q.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return daraja_error(StatusCode::BAD_REQUEST, "400.008.02", "Invalid grant type passed");
    }
    let expected = format!("Basic {}", BASE64.encode(format!("{}:{}", st.cfg.consumer_key, st.cfg.consumer_secret)));
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
        return daraja_error(StatusCode::BAD_REQUEST, "400.008.01", "Invalid Authentication passed");
    }
    let mut inner = st.inner.lock().unwrap();
    inner.seq += 1;
    let token = format!("fake-access-token-{}-{}", inner.seq, std::process::id());
    inner.tokens.insert(token.clone(), st.cfg.clock.now() + st.cfg.token_ttl_secs);
    axum::Json(json!({"access_token": token, "expires_in": st.cfg.token_ttl_secs.to_string()})).into_response()
}

/// `None` when the Bearer token is one the fake issued and it has not expired.
fn check_bearer(st: &FakeState, headers: &HeaderMap) -> Option<Response> {
    let inner = st.inner.lock().unwrap();
    let token = headers.get("authorization").and_then(|v| v.to_str().ok()).and_then(|v| v.strip_prefix("Bearer "));
    let valid = token
        .and_then(|t| inner.tokens.get(t))
        .is_some_and(|expires_at| st.cfg.clock.now() < *expires_at && !inner.reject_all_tokens);
    if valid {
        return None;
    }
    Some(match inner.invalid_token_answer.unwrap_or((StatusCode::UNAUTHORIZED, true)) {
        (status, true) => daraja_error(status, "404.001.03", "Invalid Access Token"),
        (status, false) => status.into_response(),
    })
}

/// A field sent as a string or a number, as text.
fn text(v: &Value, name: &str) -> Option<String> {
    match v.get(name)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn is_msisdn(s: &str) -> bool {
    s.len() == 12 && (s.starts_with("2547") || s.starts_with("2541")) && s.bytes().all(|b| b.is_ascii_digit())
}

/// Short code, timestamp and password, common to push and query: the timestamp, or the bad field.
fn check_credentials(st: &FakeState, v: &Value) -> Result<String, &'static str> {
    let short_code = text(v, "BusinessShortCode").filter(|s| *s == st.cfg.short_code).ok_or("BusinessShortCode")?;
    let timestamp = text(v, "Timestamp").filter(|t| t.len() == 14 && t.bytes().all(|b| b.is_ascii_digit()));
    let timestamp = timestamp.ok_or("Timestamp")?;
    let expected = BASE64.encode(format!("{short_code}{}{timestamp}", st.cfg.passkey));
    if text(v, "Password").as_deref() != Some(expected.as_str()) {
        return Err("Password");
    }
    Ok(timestamp)
}

async fn stk_push(State(st): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    st.push_requests.fetch_add(1, Ordering::SeqCst);
    if let Some(refused) = failing(&st).or_else(|| check_bearer(&st, &headers)) {
        return refused;
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return daraja_error(StatusCode::BAD_REQUEST, "400.002.05", "Invalid Request Payload");
    };
    let timestamp = match check_credentials(&st, &v) {
        Ok(t) => t,
        Err(field) => return bad_request(field),
    };
    let transaction_type = match text(&v, "TransactionType") {
        Some(t) if t == "CustomerPayBillOnline" || t == "CustomerBuyGoodsOnline" => t,
        _ => return bad_request("TransactionType"),
    };
    let Some(amount) = v.get("Amount").and_then(Value::as_i64).filter(|a| *a >= 1) else {
        return bad_request("Amount");
    };
    let Some(party_a) = text(&v, "PartyA").filter(|p| is_msisdn(p)) else { return bad_request("PartyA") };
    let Some(phone) = text(&v, "PhoneNumber").filter(|p| is_msisdn(p)) else { return bad_request("PhoneNumber") };
    let party_b = text(&v, "PartyB").filter(|p| !p.is_empty() && p.bytes().all(|b| b.is_ascii_digit()));
    let Some(party_b) = party_b else { return bad_request("PartyB") };
    let callback_url = text(&v, "CallBackURL").filter(|u| {
        u.strip_prefix("https://").or_else(|| u.strip_prefix("http://")).is_some_and(|rest| !rest.is_empty())
    });
    let Some(callback_url) = callback_url else { return bad_request("CallBackURL") };
    let reference = text(&v, "AccountReference").filter(|r| !r.is_empty() && r.chars().count() <= 12);
    let Some(account_reference) = reference else { return bad_request("AccountReference") };
    let Some(description) = text(&v, "TransactionDesc").filter(|d| d.chars().count() <= 13) else {
        return bad_request("TransactionDesc");
    };

    let (mode, merchant_request_id, checkout_request_id) = {
        let mut inner = st.inner.lock().unwrap();
        let mode = inner.push_mode;
        if mode == PushMode::Reject {
            drop(inner);
            return bad_request("PartyB - rejected by the fake");
        }
        inner.seq += 1;
        let seq = inner.seq;
        let merchant_request_id = format!("29115-34620561-{seq}");
        let checkout_request_id = format!("ws_CO_{}{seq:06}", eat_timestamp(st.cfg.clock.now()));
        inner.pushes.push(RecordedPush {
            checkout_request_id: checkout_request_id.clone(),
            merchant_request_id: merchant_request_id.clone(),
            phone,
            party_a,
            party_b,
            amount,
            account_reference,
            description,
            callback_url,
            transaction_type,
            timestamp,
        });
        (mode, merchant_request_id, checkout_request_id)
    };
    st.pushed.notify_waiters();
    match mode {
        PushMode::Reject => unreachable!("refused before recording"),
        PushMode::Accept => axum::Json(json!({
            "MerchantRequestID": merchant_request_id,
            "CheckoutRequestID": checkout_request_id,
            "ResponseCode": "0",
            "ResponseDescription": "Success. Request accepted for processing",
            "CustomerMessage": "Success. Request accepted for processing",
        }))
        .into_response(),
        PushMode::Hang => std::future::pending().await,
        PushMode::Fail500 => daraja_error(StatusCode::INTERNAL_SERVER_ERROR, "500.002.1001", "Internal Server Error"),
    }
}

async fn stk_query(State(st): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    st.query_requests.fetch_add(1, Ordering::SeqCst);
    if let Some(refused) = failing(&st).or_else(|| check_bearer(&st, &headers)) {
        return refused;
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return daraja_error(StatusCode::BAD_REQUEST, "400.002.05", "Invalid Request Payload");
    };
    if let Err(field) = check_credentials(&st, &v) {
        return bad_request(field);
    }
    let Some(checkout_id) = text(&v, "CheckoutRequestID") else { return bad_request("CheckoutRequestID") };
    let (answer, merchant_request_id) = {
        let inner = st.inner.lock().unwrap();
        let push = inner.pushes.iter().find(|p| p.checkout_request_id == checkout_id);
        let answer = inner.queries.get(&checkout_id).cloned();
        if push.is_none() && answer.is_none() {
            drop(inner);
            return bad_request("CheckoutRequestID");
        }
        (answer.unwrap_or(QueryAnswer::Processing), push.map(|p| p.merchant_request_id.clone()).unwrap_or_default())
    };
    match answer {
        QueryAnswer::Processing => {
            daraja_error(StatusCode::INTERNAL_SERVER_ERROR, "500.001.1001", "The transaction is being processed")
        }
        QueryAnswer::Result(code, desc) => axum::Json(json!({
            "ResponseCode": "0",
            "ResponseDescription": "The service request has been accepted successsfully",
            "MerchantRequestID": merchant_request_id,
            "CheckoutRequestID": checkout_id,
            "ResultCode": code.to_string(),
            "ResultDesc": desc,
        }))
        .into_response(),
        QueryAnswer::Hang => std::future::pending().await,
    }
}

/// `Some(503)` while `fail_next` lasts: the call is refused before it is looked at.
fn failing(st: &FakeState) -> Option<Response> {
    let mut inner = st.inner.lock().unwrap();
    if inner.fail_next == 0 {
        return None;
    }
    inner.fail_next -= 1;
    Some(daraja_error(StatusCode::SERVICE_UNAVAILABLE, "503.001.01", "Service Unavailable"))
}

fn is_url(v: &Value, name: &str) -> Option<String> {
    text(v, name)
        .filter(|u| u.strip_prefix("https://").or_else(|| u.strip_prefix("http://")).is_some_and(|r| !r.is_empty()))
}

/// Initiator and credential, common to payouts, reversals and status queries: the bad field.
fn check_initiator(st: &FakeState, v: &Value, name_field: &str) -> Result<(), &'static str> {
    if text(v, name_field).as_deref() != Some(st.cfg.initiator_name.as_str()) {
        return Err("Initiator");
    }
    if text(v, "SecurityCredential").as_deref() != Some(st.cfg.security_credential.as_str()) {
        return Err("SecurityCredential");
    }
    Ok(())
}

fn accepted(o: &RecordedOutbound) -> Response {
    axum::Json(json!({
        "ConversationID": o.conversation_id,
        "OriginatorConversationID": o.originator_conversation_id,
        "ResponseCode": "0",
        "ResponseDescription": "Accept the service request successfully.",
    }))
    .into_response()
}

/// Records a processed payout or reversal (or a status query) and answers by the outbound mode.
async fn record_outbound(st: &FakeState, mut o: RecordedOutbound) -> Response {
    let mode = {
        let mut inner = st.inner.lock().unwrap();
        let mode = if o.kind == OutboundKind::Status { OutboundMode::Accept } else { inner.outbound_mode };
        if mode == OutboundMode::Reject {
            drop(inner);
            return bad_request("PartyB - rejected by the fake");
        }
        inner.seq += 1;
        let seq = inner.seq;
        o.conversation_id = format!("AG_20261201_{seq:020}");
        if o.originator_conversation_id.is_empty() {
            o.originator_conversation_id = format!("f1e2-4b95-a71d-{seq:012}");
        }
        o.receipt = receipt_for(&o.conversation_id);
        inner.outbound.push(o.clone());
        mode
    };
    match mode {
        OutboundMode::Accept | OutboundMode::Reject => accepted(&o),
        OutboundMode::Hang => std::future::pending().await,
    }
}

async fn b2c(State(st): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    st.b2c_requests.fetch_add(1, Ordering::SeqCst);
    if let Some(refused) = failing(&st).or_else(|| check_bearer(&st, &headers)) {
        return refused;
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return daraja_error(StatusCode::BAD_REQUEST, "400.002.05", "Invalid Request Payload");
    };
    if let Err(field) = check_initiator(&st, &v, "InitiatorName") {
        return bad_request(field);
    }
    let Some(originator) = text(&v, "OriginatorConversationID").filter(|o| !o.is_empty()) else {
        return bad_request("OriginatorConversationID");
    };
    if !matches!(text(&v, "CommandID").as_deref(), Some("BusinessPayment" | "SalaryPayment" | "PromotionPayment")) {
        return bad_request("CommandID");
    }
    let Some(amount) = text(&v, "Amount").and_then(|a| a.parse::<i64>().ok()).filter(|a| *a >= 1) else {
        return bad_request("Amount");
    };
    if text(&v, "PartyA").as_deref() != Some(st.cfg.b2c_short_code.as_str()) {
        return bad_request("PartyA");
    }
    let Some(phone) = text(&v, "PartyB").filter(|p| is_msisdn(p)) else { return bad_request("PartyB") };
    let Some(remarks) = text(&v, "Remarks").filter(|r| !r.is_empty() && r.chars().count() <= 100) else {
        return bad_request("Remarks");
    };
    let Some(result_url) = is_url(&v, "ResultURL") else { return bad_request("ResultURL") };
    let Some(timeout_url) = is_url(&v, "QueueTimeOutURL") else { return bad_request("QueueTimeOutURL") };
    let o = RecordedOutbound {
        kind: OutboundKind::Payout,
        originator_conversation_id: originator,
        conversation_id: String::new(),
        phone,
        amount,
        subject: String::new(),
        remarks,
        occasion: text(&v, "Occassion").unwrap_or_default(),
        result_url,
        timeout_url,
        receipt: String::new(),
        account_reference: String::new(),
    };
    record_outbound(&st, o).await
}

/// Business Pay Bill / Business Buy Goods, as Daraja documents them: from the business's own
/// short code (PartyA, identifier type 4) to a paybill or till (PartyB, 4), with an
/// AccountReference of at most 13 characters.
async fn b2b(State(st): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    st.b2b_requests.fetch_add(1, Ordering::SeqCst);
    if let Some(refused) = failing(&st).or_else(|| check_bearer(&st, &headers)) {
        return refused;
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return daraja_error(StatusCode::BAD_REQUEST, "400.002.05", "Invalid Request Payload");
    };
    if let Err(field) = check_initiator(&st, &v, "Initiator") {
        return bad_request(field);
    }
    let Some(command) = text(&v, "CommandID").filter(|c| c == "BusinessPayBill" || c == "BusinessBuyGoods") else {
        return bad_request("CommandID");
    };
    if text(&v, "SenderIdentifierType").as_deref() != Some("4")
        || text(&v, "RecieverIdentifierType").as_deref() != Some("4")
    {
        return bad_request("IdentifierType");
    }
    let Some(amount) = text(&v, "Amount").and_then(|a| a.parse::<i64>().ok()).filter(|a| *a >= 1) else {
        return bad_request("Amount");
    };
    if text(&v, "PartyA").as_deref() != Some(st.cfg.short_code.as_str()) {
        return bad_request("PartyA");
    }
    let short_code = |p: &String| (5..=7).contains(&p.len()) && p.bytes().all(|b| b.is_ascii_digit());
    let Some(party_b) = text(&v, "PartyB").filter(short_code) else { return bad_request("PartyB") };
    let Some(account_reference) = text(&v, "AccountReference").filter(|r| !r.is_empty() && r.chars().count() <= 13)
    else {
        return bad_request("AccountReference");
    };
    let Some(remarks) = text(&v, "Remarks").filter(|r| !r.is_empty() && r.chars().count() <= 100) else {
        return bad_request("Remarks");
    };
    let Some(result_url) = is_url(&v, "ResultURL") else { return bad_request("ResultURL") };
    let Some(timeout_url) = is_url(&v, "QueueTimeOutURL") else { return bad_request("QueueTimeOutURL") };
    let o = RecordedOutbound {
        kind: OutboundKind::Business,
        originator_conversation_id: text(&v, "OriginatorConversationID").unwrap_or_default(),
        conversation_id: String::new(),
        phone: party_b,
        amount,
        subject: command,
        remarks,
        occasion: text(&v, "Occassion").unwrap_or_default(),
        result_url,
        timeout_url,
        receipt: String::new(),
        account_reference,
    };
    record_outbound(&st, o).await
}

async fn reversal(State(st): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    st.reversal_requests.fetch_add(1, Ordering::SeqCst);
    if let Some(refused) = failing(&st).or_else(|| check_bearer(&st, &headers)) {
        return refused;
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return daraja_error(StatusCode::BAD_REQUEST, "400.002.05", "Invalid Request Payload");
    };
    if let Err(field) = check_initiator(&st, &v, "Initiator") {
        return bad_request(field);
    }
    if text(&v, "CommandID").as_deref() != Some("TransactionReversal") {
        return bad_request("CommandID");
    }
    let Some(transaction_id) = text(&v, "TransactionID").filter(|t| !t.is_empty()) else {
        return bad_request("TransactionID");
    };
    // The receipt must be one of the fake's own collections; its customer gets the money back.
    let paid = {
        let inner = st.inner.lock().unwrap();
        inner.pushes.iter().find(|p| receipt_for(&p.checkout_request_id) == transaction_id).cloned()
    };
    let Some(paid) = paid else { return bad_request("TransactionID") };
    let Some(amount) = text(&v, "Amount").and_then(|a| a.parse::<i64>().ok()).filter(|a| *a == paid.amount) else {
        return bad_request("Amount");
    };
    if text(&v, "ReceiverParty").as_deref() != Some(st.cfg.short_code.as_str())
        || text(&v, "RecieverIdentifierType").as_deref() != Some("11")
    {
        return bad_request("ReceiverParty");
    }
    let Some(result_url) = is_url(&v, "ResultURL") else { return bad_request("ResultURL") };
    let Some(timeout_url) = is_url(&v, "QueueTimeOutURL") else { return bad_request("QueueTimeOutURL") };
    let o = RecordedOutbound {
        kind: OutboundKind::Reversal,
        originator_conversation_id: String::new(),
        conversation_id: String::new(),
        phone: paid.phone,
        amount,
        subject: transaction_id,
        remarks: text(&v, "Remarks").unwrap_or_default(),
        occasion: text(&v, "Occasion").unwrap_or_default(),
        result_url,
        timeout_url,
        receipt: String::new(),
        account_reference: String::new(),
    };
    record_outbound(&st, o).await
}

async fn transaction_status(State(st): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    st.status_requests.fetch_add(1, Ordering::SeqCst);
    if let Some(refused) = failing(&st).or_else(|| check_bearer(&st, &headers)) {
        return refused;
    }
    let Ok(v) = serde_json::from_slice::<Value>(&body) else {
        return daraja_error(StatusCode::BAD_REQUEST, "400.002.05", "Invalid Request Payload");
    };
    if let Err(field) = check_initiator(&st, &v, "Initiator") {
        return bad_request(field);
    }
    if text(&v, "CommandID").as_deref() != Some("TransactionStatusQuery") {
        return bad_request("CommandID");
    }
    let by_originator = text(&v, "OriginatorConversationID").filter(|o| !o.is_empty());
    let by_transaction = text(&v, "TransactionID").filter(|t| !t.is_empty());
    let Some(subject) = by_originator.or(by_transaction) else { return bad_request("TransactionID") };
    if text(&v, "PartyA").is_none_or(|p| p.is_empty()) || text(&v, "IdentifierType").as_deref() != Some("4") {
        return bad_request("PartyA");
    }
    let Some(result_url) = is_url(&v, "ResultURL") else { return bad_request("ResultURL") };
    let Some(timeout_url) = is_url(&v, "QueueTimeOutURL") else { return bad_request("QueueTimeOutURL") };
    let o = RecordedOutbound {
        kind: OutboundKind::Status,
        originator_conversation_id: String::new(),
        conversation_id: String::new(),
        phone: text(&v, "PartyA").unwrap_or_default(),
        amount: 0,
        subject,
        remarks: text(&v, "Remarks").unwrap_or_default(),
        occasion: text(&v, "Occasion").unwrap_or_default(),
        result_url,
        timeout_url,
        receipt: String::new(),
        account_reference: String::new(),
    };
    record_outbound(&st, o).await
}
