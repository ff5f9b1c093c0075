//! A local Safaricom Daraja fake: a real HTTP server on 127.0.0.1:0 (axum), never the internet.
//!
//! It implements OAuth (`GET /oauth/v1/generate`), STK push (`POST /mpesa/stkpush/v1/processrequest`)
//! and STK query (`POST /mpesa/stkpushquery/v1/query`) and validates requests the way Daraja does:
//! Basic auth, issued and unexpired Bearer tokens (by the injected clock), the STK password, field
//! formats and lengths. Invalid requests get Daraja's `400.002.02` error body. Tests steer it with
//! [`DarajaFake::set_push_mode`] and [`DarajaFake::set_query`], and play Daraja's result callback
//! with [`DarajaFake::callback`].
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
    pushed: tokio::sync::Notify,
}

struct Inner {
    /// token → expires at (unix secs).
    tokens: HashMap<String, i64>,
    reject_all_tokens: bool,
    push_mode: PushMode,
    pushes: Vec<RecordedPush>,
    queries: HashMap<String, QueryAnswer>,
    seq: u64,
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
                push_mode: PushMode::Accept,
                pushes: Vec::new(),
                queries: HashMap::new(),
                seq: 0,
            }),
            token_requests: AtomicUsize::new(0),
            push_requests: AtomicUsize::new(0),
            query_requests: AtomicUsize::new(0),
            pushed: tokio::sync::Notify::new(),
        });
        let app = Router::new()
            .route("/oauth/v1/generate", get(oauth))
            .route("/mpesa/stkpush/v1/processrequest", post(stk_push))
            .route("/mpesa/stkpushquery/v1/query", post(stk_query))
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
        }
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
    if valid { None } else { Some(daraja_error(StatusCode::UNAUTHORIZED, "404.001.03", "Invalid Access Token")) }
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
    if let Some(refused) = check_bearer(&st, &headers) {
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
    if let Some(refused) = check_bearer(&st, &headers) {
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
