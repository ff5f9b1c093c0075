//! A local Airtel Money (Kenya) Open API fake: a real HTTP server on 127.0.0.1:0 (axum), never the
//! internet.
//!
//! It implements OAuth (`POST /auth/oauth2/token`), collections (`POST /merchant/v1/payments/`), the
//! transaction enquiry (`GET /standard/v1/payments/{id}`), refunds of collections
//! (`POST /standard/v1/payments/refund`, by the collection's Airtel reference, at most once each),
//! disbursements (`POST /standard/v1/disbursements/`, the PIN decrypted with the test private key
//! `tests/fixtures/rsa1.pem` and checked against [`PIN`]) and their enquiry
//! (`GET /standard/v1/disbursements/{id}`), and validates requests the way Airtel does: client credentials, issued Bearer tokens, the `X-Country: KE` / `X-Currency: KES` headers,
//! the body's fields (a 9-digit msisdn without country code, a positive whole amount, KE/KES, a
//! transaction id not seen before). Invalid requests get HTTP 400 with `status.success: false`.
//!
//! Tests steer it: [`AirtelFake::set_collect_mode`] (accept, hang, refuse, 503) and
//! [`AirtelFake::set_enquiry`] (a transaction status, or "not found"), and play Airtel's callback
//! with [`AirtelFake::callback`] (which also makes the enquiry answer the same, as Airtel would) or
//! post any body anywhere with [`AirtelFake::post`]. Airtel's callback URL is set once in its
//! portal: here, [`AirtelFake::set_callback_url`].
//!
//! Include it from a test file with `#[path = "common/airtel.rs"] mod airtel;`.
#![allow(dead_code)]

use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

pub const CLIENT_ID: &str = "fake-airtel-client-id";
pub const CLIENT_SECRET: &str = "fake-airtel-client-secret";
/// The disbursing wallet's PIN the fake expects (encrypted with [`PUBLIC_KEY_PEM`]).
pub const PIN: &str = "4321";
/// The public half of the key the fake decrypts PINs with (a test-only key).
pub const PUBLIC_KEY_PEM: &str = include_str!("../fixtures/rsa1.pub.pem");
const PRIVATE_KEY_PEM: &str = include_str!("../fixtures/rsa1.pem");

/// How the fake answers a disbursement or a refund.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MoneyOutMode {
    /// Record it and answer `success: true`.
    Accept,
    /// Record it (money moved at Airtel) and never answer.
    Hang,
    /// Refuse: `success: false` with transaction status `TF`; nothing recorded.
    Refuse,
    /// Answer HTTP 503 before looking at it; nothing recorded.
    Unavailable,
    /// Never answer, and record nothing: the request was lost before Airtel processed it (its
    /// enquiry answers "Transaction not found").
    Swallow,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedDisbursement {
    pub id: String,
    pub msisdn: String,
    pub amount: i64,
    pub reference: String,
    /// The PIN as decrypted from the request.
    pub pin: String,
    pub airtel_money_id: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CollectMode {
    /// Record the collection and answer `success: true`.
    Accept,
    /// Record it (Airtel started it) and never answer: the client's timeout fires after sending.
    Hang,
    /// Refuse with HTTP 200 `success: false` (Airtel's refusal); nothing is recorded.
    Refuse,
    /// Answer HTTP 503 before looking at it; nothing is recorded.
    Unavailable,
}

/// What the enquiry answers about one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnquiryAnswer {
    /// `data.transaction.status`: "TS", "TF", "TIP", "TA", "TE", or anything else.
    Status(String),
    /// `success: false`: Airtel does not know the id.
    NotFound,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordedCollection {
    /// `transaction.id`: the gateway's payment id.
    pub id: String,
    /// `subscriber.msisdn` as sent (no country code).
    pub msisdn: String,
    pub amount: i64,
    pub reference: String,
    /// The reference Airtel gives it ("MP…"), returned by enquiries and callbacks.
    pub airtel_money_id: String,
}

struct FakeState {
    inner: Mutex<Inner>,
    token_requests: AtomicUsize,
    collect_requests: AtomicUsize,
    enquiry_requests: AtomicUsize,
    disburse_requests: AtomicUsize,
    refund_requests: AtomicUsize,
    key: rsa::PrivateKey,
}

struct Inner {
    tokens: HashSet<String>,
    seq: u64,
    mode: CollectMode,
    collections: Vec<RecordedCollection>,
    enquiries: HashMap<String, EnquiryAnswer>,
    callback_url: Option<String>,
    disburse_mode: MoneyOutMode,
    disbursements: Vec<RecordedDisbursement>,
    disbursement_status: HashMap<String, String>,
    refund_mode: MoneyOutMode,
    /// Airtel references of the collections refunded.
    refunds: Vec<String>,
}

pub struct AirtelFake {
    base_url: String,
    state: Arc<FakeState>,
    http: reqwest::Client,
    server: tokio::task::JoinHandle<()>,
}

impl Drop for AirtelFake {
    fn drop(&mut self) {
        self.server.abort();
    }
}

impl AirtelFake {
    pub async fn start() -> AirtelFake {
        paygate::install_crypto_provider();
        let state = Arc::new(FakeState {
            inner: Mutex::new(Inner {
                tokens: HashSet::new(),
                seq: 0,
                mode: CollectMode::Accept,
                collections: Vec::new(),
                enquiries: HashMap::new(),
                callback_url: None,
                disburse_mode: MoneyOutMode::Accept,
                disbursements: Vec::new(),
                disbursement_status: HashMap::new(),
                refund_mode: MoneyOutMode::Accept,
                refunds: Vec::new(),
            }),
            token_requests: AtomicUsize::new(0),
            collect_requests: AtomicUsize::new(0),
            enquiry_requests: AtomicUsize::new(0),
            disburse_requests: AtomicUsize::new(0),
            refund_requests: AtomicUsize::new(0),
            key: {
                use rsa::pkcs8::DecodePrivateKey as _;
                rsa::PrivateKey::from_pkcs8_pem(PRIVATE_KEY_PEM).expect("test private key")
            },
        });
        let app = Router::new()
            .route("/auth/oauth2/token", post(oauth))
            .route("/merchant/v1/payments/", post(collect))
            .route("/standard/v1/payments/{id}", get(enquiry))
            .route("/standard/v1/payments/refund", post(refund))
            .route("/standard/v1/disbursements/", post(disburse))
            .route("/standard/v1/disbursements/{id}", get(disbursement_enquiry))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind airtel fake");
        let addr = listener.local_addr().expect("airtel fake address");
        let server = tokio::spawn(async move {
            let _ = axum::serve(listener, app).await;
        });
        let http = reqwest::Client::builder().timeout(Duration::from_secs(10)).build().expect("callback client");
        AirtelFake { base_url: format!("http://{addr}"), state, http, server }
    }

    pub fn base_url(&self) -> String {
        self.base_url.clone()
    }

    fn inner(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.state.inner.lock().unwrap()
    }

    pub fn set_collect_mode(&self, mode: CollectMode) {
        self.inner().mode = mode;
    }

    pub fn set_enquiry(&self, id: &str, answer: EnquiryAnswer) {
        self.inner().enquiries.insert(id.to_string(), answer);
    }

    /// Where callbacks go (Airtel's portal setting).
    pub fn set_callback_url(&self, url: &str) {
        self.inner().callback_url = Some(url.to_string());
    }

    pub fn set_disburse_mode(&self, mode: MoneyOutMode) {
        self.inner().disburse_mode = mode;
    }

    pub fn set_refund_mode(&self, mode: MoneyOutMode) {
        self.inner().refund_mode = mode;
    }

    /// What the disbursement enquiry answers for `id` ("TS", "TF", "TIP", …; "TIP" until set).
    pub fn set_disbursement_status(&self, id: &str, status: &str) {
        self.inner().disbursement_status.insert(id.to_string(), status.to_string());
    }

    pub fn disbursements(&self) -> Vec<RecordedDisbursement> {
        self.inner().disbursements.clone()
    }

    pub fn disburse_requests(&self) -> usize {
        self.state.disburse_requests.load(Ordering::SeqCst)
    }

    /// The Airtel references of the collections refunded, in order.
    pub fn refunds(&self) -> Vec<String> {
        self.inner().refunds.clone()
    }

    pub fn refund_requests(&self) -> usize {
        self.state.refund_requests.load(Ordering::SeqCst)
    }

    pub fn collections(&self) -> Vec<RecordedCollection> {
        self.inner().collections.clone()
    }

    pub fn collection(&self, id: &str) -> Option<RecordedCollection> {
        self.inner().collections.iter().find(|c| c.id == id).cloned()
    }

    /// Collection requests received, valid or not, answered or not.
    pub fn collect_requests(&self) -> usize {
        self.state.collect_requests.load(Ordering::SeqCst)
    }

    pub fn enquiry_requests(&self) -> usize {
        self.state.enquiry_requests.load(Ordering::SeqCst)
    }

    pub fn token_requests(&self) -> usize {
        self.state.token_requests.load(Ordering::SeqCst)
    }

    /// Airtel's callback body for a recorded collection.
    pub fn callback_body(&self, id: &str, status_code: &str) -> Value {
        let airtel_money_id =
            self.collection(id).map(|c| c.airtel_money_id).unwrap_or_else(|| "MP000000.0000.X00000".into());
        json!({"transaction": {
            "id": id,
            "message": if status_code == "TS" { "Paid successfully" } else { "Transaction failed" },
            "status_code": status_code,
            "airtel_money_id": airtel_money_id,
        }})
    }

    /// The payer answered: the enquiry now says `status_code`, and Airtel posts the callback to the
    /// portal's URL. Returns the gateway's HTTP status.
    pub async fn callback(&self, id: &str, status_code: &str) -> reqwest::StatusCode {
        self.set_enquiry(id, EnquiryAnswer::Status(status_code.to_string()));
        let url = self.inner().callback_url.clone().expect("set_callback_url first");
        self.post(&url, self.callback_body(id, status_code)).await
    }

    /// Posts `body` to `url` as Airtel would (a forged or misdirected callback).
    pub async fn post(&self, url: &str, body: Value) -> reqwest::StatusCode {
        self.http.post(url).json(&body).send().await.expect("callback post").status()
    }
}

fn airtel_status(http: StatusCode, success: bool, result_code: &str, message: &str) -> Value {
    json!({"code": http.as_u16().to_string(), "message": message, "result_code": result_code, "success": success})
}

fn refusal(http: StatusCode, result_code: &str, message: &str) -> Response {
    (http, axum::Json(json!({"data": {}, "status": airtel_status(http, false, result_code, message)}))).into_response()
}

async fn oauth(State(s): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    s.token_requests.fetch_add(1, Ordering::SeqCst);
    if !is_json(&headers) {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "Content-Type must be application/json");
    }
    let Ok(b) = serde_json::from_slice::<Value>(&body) else {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "invalid JSON");
    };
    let valid =
        b["client_id"] == CLIENT_ID && b["client_secret"] == CLIENT_SECRET && b["grant_type"] == "client_credentials";
    if !valid {
        return (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "invalid_client"}))).into_response();
    }
    let mut inner = s.inner.lock().unwrap();
    inner.seq += 1;
    let token = format!("airtel-token-{}-{}", inner.seq, uuid::Uuid::new_v4().simple());
    inner.tokens.insert(token.clone());
    axum::Json(json!({"access_token": token, "expires_in": 180, "token_type": "bearer"})).into_response()
}

fn is_json(headers: &HeaderMap) -> bool {
    headers.get("content-type").and_then(|v| v.to_str().ok()).is_some_and(|v| v.starts_with("application/json"))
}

/// Bearer token issued here, and the country and currency headers. `Err`: the refusal to answer.
fn authorized(s: &FakeState, headers: &HeaderMap) -> Result<(), Box<Response>> {
    let token = headers
        .get("authorization")
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_string);
    if !token.is_some_and(|t| s.inner.lock().unwrap().tokens.contains(&t)) {
        return Err(Box::new(
            (StatusCode::UNAUTHORIZED, axum::Json(json!({"error": "invalid_token"}))).into_response(),
        ));
    }
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok()).map(str::to_string);
    if header("x-country").as_deref() != Some("KE") || header("x-currency").as_deref() != Some("KES") {
        return Err(Box::new(refusal(
            StatusCode::BAD_REQUEST,
            "ESB000001",
            "X-Country and X-Currency must be KE and KES",
        )));
    }
    Ok(())
}

async fn collect(State(s): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    s.collect_requests.fetch_add(1, Ordering::SeqCst);
    if let Err(r) = authorized(&s, &headers) {
        return *r;
    }
    let mode = s.inner.lock().unwrap().mode;
    if mode == CollectMode::Unavailable {
        return refusal(StatusCode::SERVICE_UNAVAILABLE, "ESB000500", "Service unavailable");
    }
    if !is_json(&headers) {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "Content-Type must be application/json");
    }
    let Ok(b) = serde_json::from_slice::<Value>(&body) else {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "invalid JSON");
    };
    let text = |v: &Value| v.as_str().filter(|s| !s.trim().is_empty()).map(str::to_string);
    let (sub, tx) = (&b["subscriber"], &b["transaction"]);
    let msisdn = text(&sub["msisdn"]).filter(|m| m.len() == 9 && m.bytes().all(|c| c.is_ascii_digit()));
    let amount = tx["amount"].as_i64().filter(|a| *a > 0);
    let fields_ok =
        sub["country"] == "KE" && sub["currency"] == "KES" && tx["country"] == "KE" && tx["currency"] == "KES";
    let (Some(reference), Some(msisdn), Some(amount), Some(id), true) =
        (text(&b["reference"]), msisdn, amount, text(&tx["id"]), fields_ok)
    else {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "invalid collection request");
    };
    if mode == CollectMode::Refuse {
        return refusal(StatusCode::OK, "ESB000014", "Transaction refused");
    }
    {
        let mut inner = s.inner.lock().unwrap();
        if inner.collections.iter().any(|c| c.id == id) {
            return refusal(StatusCode::OK, "ESB000041", "Duplicate transaction id");
        }
        inner.seq += 1;
        let airtel_money_id = format!("MP261201.{:04}.A{:05}", inner.seq, inner.seq * 7);
        inner.collections.push(RecordedCollection { id: id.clone(), msisdn, amount, reference, airtel_money_id });
        inner.enquiries.entry(id.clone()).or_insert_with(|| EnquiryAnswer::Status("TIP".into()));
    }
    if mode == CollectMode::Hang {
        std::future::pending::<()>().await;
    }
    axum::Json(json!({
        "data": {"transaction": {"id": id, "status": "Success."}},
        "status": airtel_status(StatusCode::OK, true, "ESB000010", "SUCCESS"),
    }))
    .into_response()
}

async fn enquiry(State(s): State<Arc<FakeState>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    s.enquiry_requests.fetch_add(1, Ordering::SeqCst);
    if let Err(r) = authorized(&s, &headers) {
        return *r;
    }
    let inner = s.inner.lock().unwrap();
    let recorded = inner.collections.iter().find(|c| c.id == id).cloned();
    match (inner.enquiries.get(&id).cloned(), recorded) {
        (Some(EnquiryAnswer::Status(status)), Some(c)) => axum::Json(json!({
            "data": {"transaction": {
                "airtel_money_id": if status == "TS" { Value::from(c.airtel_money_id) } else { Value::Null },
                "id": id,
                "message": format!("status {status}"),
                "status": status,
            }},
            "status": airtel_status(StatusCode::OK, true, "ESB000010", "SUCCESS"),
        }))
        .into_response(),
        _ => refusal(StatusCode::OK, "ESB000008", "Transaction not found"),
    }
}

fn failed_transaction(result_code: &str, message: &str) -> Response {
    axum::Json(json!({
        "data": {"transaction": {"status": "TF", "message": message}},
        "status": airtel_status(StatusCode::OK, false, result_code, message),
    }))
    .into_response()
}

async fn disburse(State(s): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    s.disburse_requests.fetch_add(1, Ordering::SeqCst);
    if let Err(r) = authorized(&s, &headers) {
        return *r;
    }
    let mode = s.inner.lock().unwrap().disburse_mode;
    if mode == MoneyOutMode::Unavailable {
        return refusal(StatusCode::SERVICE_UNAVAILABLE, "ESB000500", "Service unavailable");
    }
    if mode == MoneyOutMode::Swallow {
        std::future::pending::<()>().await;
    }
    if !is_json(&headers) {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "Content-Type must be application/json");
    }
    let Ok(b) = serde_json::from_slice::<Value>(&body) else {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "invalid JSON");
    };
    let text = |v: &Value| v.as_str().filter(|s| !s.trim().is_empty()).map(str::to_string);
    let (payee, tx) = (&b["payee"], &b["transaction"]);
    let msisdn = text(&payee["msisdn"]).filter(|m| m.len() == 9 && m.bytes().all(|c| c.is_ascii_digit()));
    let amount = tx["amount"].as_i64().filter(|a| *a > 0);
    let fields_ok = payee["wallet_type"] == "NORMAL" && tx["type"] == "B2C";
    let (Some(reference), Some(msisdn), Some(amount), Some(id), Some(pin), true) =
        (text(&b["reference"]), msisdn, amount, text(&tx["id"]), text(&b["pin"]), fields_ok)
    else {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "invalid disbursement request");
    };
    use base64::Engine as _;
    let pin = base64::engine::general_purpose::STANDARD
        .decode(pin)
        .ok()
        .and_then(|sealed| s.key.decrypt(rsa::Pkcs1v15Encrypt, &sealed).ok())
        .and_then(|clear| String::from_utf8(clear).ok());
    if pin.as_deref() != Some(PIN) {
        return failed_transaction("DP00900001017", "Incorrect PIN");
    }
    if mode == MoneyOutMode::Refuse {
        return failed_transaction("DP00900001007", "Not enough balance");
    }
    let airtel_money_id = {
        let mut inner = s.inner.lock().unwrap();
        if inner.disbursements.iter().any(|d| d.id == id) {
            return failed_transaction("DP00900001009", "Duplicate transaction id");
        }
        inner.seq += 1;
        let airtel_money_id = format!("DP261201.{:04}.B{:05}", inner.seq, inner.seq * 11);
        inner.disbursements.push(RecordedDisbursement {
            id: id.clone(),
            msisdn,
            amount,
            reference,
            pin: PIN.to_string(),
            airtel_money_id: airtel_money_id.clone(),
        });
        airtel_money_id
    };
    if mode == MoneyOutMode::Hang {
        std::future::pending::<()>().await;
    }
    axum::Json(json!({
        "data": {"transaction": {"reference_id": "18****354", "airtel_money_id": airtel_money_id, "id": id,
                                 "status": "TIP", "message": "in progress"}},
        "status": {"response_code": "DP00900001006", "code": "200", "success": true, "result_code": "ESB000010",
                   "message": "SUCCESS"},
    }))
    .into_response()
}

async fn disbursement_enquiry(State(s): State<Arc<FakeState>>, Path(id): Path<String>, headers: HeaderMap) -> Response {
    s.enquiry_requests.fetch_add(1, Ordering::SeqCst);
    if let Err(r) = authorized(&s, &headers) {
        return *r;
    }
    let inner = s.inner.lock().unwrap();
    let Some(d) = inner.disbursements.iter().find(|d| d.id == id) else {
        return refusal(StatusCode::OK, "ESB000008", "Transaction not found");
    };
    let status = inner.disbursement_status.get(&id).cloned().unwrap_or_else(|| "TIP".into());
    axum::Json(json!({
        "data": {"transaction": {
            "airtel_money_id": if status == "TS" { Value::from(d.airtel_money_id.clone()) } else { Value::Null },
            "id": id,
            "message": format!("status {status}"),
            "status": status,
        }},
        "status": airtel_status(StatusCode::OK, true, "ESB000010", "SUCCESS"),
    }))
    .into_response()
}

async fn refund(State(s): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    s.refund_requests.fetch_add(1, Ordering::SeqCst);
    if let Err(r) = authorized(&s, &headers) {
        return *r;
    }
    let mode = s.inner.lock().unwrap().refund_mode;
    if mode == MoneyOutMode::Unavailable {
        return refusal(StatusCode::SERVICE_UNAVAILABLE, "ESB000500", "Service unavailable");
    }
    let Ok(b) = serde_json::from_slice::<Value>(&body) else {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "invalid JSON");
    };
    let Some(reference) = b["transaction"]["airtel_money_id"].as_str().map(str::to_string) else {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "transaction.airtel_money_id is required");
    };
    if mode == MoneyOutMode::Refuse {
        return refusal(StatusCode::OK, "ESB000014", "Refund not allowed");
    }
    {
        let mut inner = s.inner.lock().unwrap();
        let paid = inner
            .collections
            .iter()
            .find(|c| c.airtel_money_id == reference)
            .is_some_and(|c| matches!(inner.enquiries.get(&c.id), Some(EnquiryAnswer::Status(st)) if st == "TS"));
        if !paid {
            return refusal(StatusCode::OK, "ESB000008", "Transaction not found or not successful");
        }
        if inner.refunds.contains(&reference) {
            return refusal(StatusCode::OK, "ESB000041", "Transaction already refunded");
        }
        inner.refunds.push(reference.clone());
    }
    if mode == MoneyOutMode::Hang {
        std::future::pending::<()>().await;
    }
    axum::Json(json!({
        "data": {"transaction": {"airtel_money_id": reference, "status": "SUCCESS"}},
        "status": airtel_status(StatusCode::OK, true, "ESB000010", "SUCCESS"),
    }))
    .into_response()
}
