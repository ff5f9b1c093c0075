//! A local fake of the payments wallet service: a real HTTP server on 127.0.0.1:0 (axum), written
//! from the service's contract and its own integration tests, never its code.
//!
//! - `POST /v1/payments` (`Idempotency-Key` required, 400 without): the key is scoped by
//!   `merchantId`; the request hash covers merchant, payer, payee, amount and currency. A key seen
//!   with another hash is 422 ("… was already used with a different request body"), a key whose
//!   first request is still running is 409, a finished one replays its stored status code (201)
//!   and the payment as it stands now. A new key runs the saga: hold (payer → suspense, status
//!   `PROCESSING`; 422 "insufficient funds in account …" and the key released when the payer lacks
//!   it), the provider, then settle (suspense → payee, `SUCCEEDED`) or reverse (suspense → payer,
//!   `FAILED`). [`Saga`] steers it: settle, decline, leave it `PROCESSING` until [`WalletFake::finish`],
//!   or hold the key in progress until [`WalletFake::release`].
//! - `POST /v1/payments/{id}/refunds`: keyed by the payment's merchant; 422 "payment … is not
//!   refundable in status …" or "refund … exceeds the remaining refundable amount …".
//! - `GET /v1/payments/{id}`, `GET /v1/accounts/{id}/balance`, `GET /v1/accounts/{id}/ledger`,
//!   `GET /v1/reconciliation/report`, `GET /actuator/health`.
//! - Errors are RFC 7807 problem details (`application/problem+json`).
//!
//! Its ledger is double-entry: every posting has two legs, and the report checks that the legs sum
//! to zero and that every balance is its opening plus its postings ([`WalletFake::corrupt`] breaks
//! one on purpose).
//!
//! Include it with `#[path = "common/wallet.rs"] mod wallet;`.
#![allow(dead_code)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

/// The merchant the gateway is configured with in tests.
pub const MERCHANT: &str = "paygate-tests";

/// The demo ledger's accounts (acct-A KES 1,000,000.00, acct-B 0, acct-Z 500.00) and their UUIDs.
pub const ACCOUNTS: &[(&str, &str, i64)] = &[
    ("acct-A", "0a0a0a0a-0000-4000-8000-00000000000a", 100_000_000),
    ("acct-B", "0b0b0b0b-0000-4000-8000-00000000000b", 0),
    ("acct-Z", "0f0f0f0f-0000-4000-8000-00000000000f", 50_000),
];
const SUSPENSE: &str = "5a5a5a5a-0000-4000-8000-000000000001";

/// `backend.wallet_accounts` for [`ACCOUNTS`], as an inline TOML table.
pub fn accounts_toml() -> String {
    let pairs: Vec<String> = ACCOUNTS.iter().map(|(id, uuid, _)| format!("{id} = \"{uuid}\"")).collect();
    format!("{{ {} }}", pairs.join(", "))
}

pub fn uuid_of(account: &str) -> &'static str {
    ACCOUNTS.iter().find(|(id, _, _)| *id == account).map(|(_, u, _)| *u).expect("a mapped account")
}

/// What the saga does with the next new payments.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Saga {
    /// The provider captures: `SUCCEEDED`.
    Settle,
    /// The provider declines: reversed, `FAILED`.
    Decline,
    /// The provider answers later: the payment stays `PROCESSING` (funds held) until `finish`.
    Processing,
    /// The provider authorized and captures asynchronously (the service's `authorizePending`):
    /// `AUTHORIZED`, funds held, until `finish` (the capture webhook, or the hold's expiry).
    Authorized,
    /// The key is claimed, then nothing happens until `release` (a concurrent request gets 409);
    /// then the payment settles.
    Stall,
    /// Answer 422 with a detail the service never writes, after claiming nothing.
    Unknown422,
    /// The provider call throws after the hold committed: the service releases the key (as its
    /// `PaymentService` does on any exception) and answers 500; the payment stays `PROCESSING`.
    ServerErrorAfterHold,
}

#[derive(Debug, Clone)]
pub struct FakePayment {
    pub id: String,
    pub merchant: String,
    pub payer: String,
    pub payee: String,
    pub amount: i64,
    pub currency: String,
    pub status: String,
    pub refunded: i64,
    pub created_at: String,
}

#[derive(Debug, Clone)]
enum KeyState {
    InProgress,
    Completed { resource: String, code: u16 },
}

#[derive(Debug, Clone)]
struct KeyRecord {
    hash: String,
    state: KeyState,
}

#[derive(Debug, Clone)]
struct Entry {
    id: i64,
    tx: String,
    account: String,
    credit: bool,
    amount: i64,
}

struct Account {
    currency: String,
    opening: i64,
    balance: i64,
}

#[derive(Default)]
struct Inner {
    accounts: HashMap<String, Account>,
    payments: HashMap<String, FakePayment>,
    /// Payment ids in creation order.
    order: Vec<String>,
    refunds: HashMap<String, Value>,
    keys: HashMap<(String, String), KeyRecord>,
    entries: Vec<Entry>,
    saga: Option<Saga>,
    /// Every `POST /v1/payments` received (replays and refusals included), and new payments made.
    payment_posts: usize,
}

struct FakeState {
    inner: Mutex<Inner>,
    /// Set by `release`: stalled requests go on.
    gate: tokio::sync::watch::Sender<bool>,
}

pub struct WalletFake {
    pub addr: std::net::SocketAddr,
    state: Arc<FakeState>,
    _stop: tokio::sync::oneshot::Sender<()>,
}

impl WalletFake {
    pub async fn start() -> WalletFake {
        WalletFake::start_on("127.0.0.1:0").await
    }

    /// The fake listening on `bind` (the fault suite's: an address its replicas reach).
    pub async fn start_on(bind: &str) -> WalletFake {
        let mut inner = Inner { saga: Some(Saga::Settle), ..Default::default() };
        for (_, uuid, opening) in ACCOUNTS {
            inner
                .accounts
                .insert(uuid.to_string(), Account { currency: "KES".into(), opening: *opening, balance: *opening });
        }
        inner.accounts.insert(SUSPENSE.into(), Account { currency: "KES".into(), opening: 0, balance: 0 });
        let state = Arc::new(FakeState { inner: Mutex::new(inner), gate: tokio::sync::watch::channel(false).0 });
        let app = Router::new()
            .route("/actuator/health", get(|| async { axum::Json(json!({"status": "UP"})) }))
            .route("/v1/payments", post(create_payment))
            .route("/v1/payments/{id}", get(get_payment))
            .route("/v1/payments/{id}/refunds", post(create_refund))
            .route("/v1/accounts/{id}/balance", get(balance))
            .route("/v1/accounts/{id}/ledger", get(ledger))
            .route("/v1/reconciliation/report", get(report))
            .with_state(state.clone());
        let listener = tokio::net::TcpListener::bind(bind).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        tokio::spawn(async move {
            let _ = axum::serve(listener, app)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await;
        });
        WalletFake { addr, state, _stop: stop }
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn set_saga(&self, saga: Saga) {
        self.state.inner.lock().unwrap().saga = Some(saga);
    }

    /// Let stalled requests go on.
    pub fn release(&self) {
        self.state.gate.send_replace(true);
    }

    /// The provider's late answer for a `PROCESSING` payment: settle or reverse it.
    pub fn finish(&self, id: &str, captured: bool) {
        let mut inner = self.state.inner.lock().unwrap();
        let status = inner.payments[id].status.as_str();
        assert!(matches!(status, "PROCESSING" | "AUTHORIZED"), "only an open payment finishes: {status}");
        finish_saga(&mut inner, id, captured);
    }

    pub fn payments(&self) -> Vec<FakePayment> {
        let inner = self.state.inner.lock().unwrap();
        inner.order.iter().map(|id| inner.payments[id].clone()).collect()
    }

    pub fn refunds(&self) -> usize {
        self.state.inner.lock().unwrap().refunds.len()
    }

    pub fn payment_posts(&self) -> usize {
        self.state.inner.lock().unwrap().payment_posts
    }

    /// A paygate account's balance in minor units, by the fake's ledger.
    pub fn balance(&self, account: &str) -> i64 {
        self.state.inner.lock().unwrap().accounts[uuid_of(account)].balance
    }

    /// What the report says: the legs sum to zero and no balance drifted from its postings.
    pub fn balanced(&self) -> bool {
        let inner = self.state.inner.lock().unwrap();
        let net: i64 = inner.entries.iter().map(|e| if e.credit { e.amount } else { -e.amount }).sum();
        net == 0
            && inner.accounts.iter().all(|(id, a)| {
                let posted: i64 = inner
                    .entries
                    .iter()
                    .filter(|e| &e.account == id)
                    .map(|e| if e.credit { e.amount } else { -e.amount })
                    .sum();
                a.balance == a.opening + posted
            })
    }

    /// Move an account's balance without a posting: the report must find the drift.
    pub fn corrupt(&self, account: &str, delta: i64) {
        self.state.inner.lock().unwrap().accounts.get_mut(uuid_of(account)).unwrap().balance += delta;
    }
}

fn problem(status: StatusCode, detail: String) -> Response {
    let body = json!({
        "type": "about:blank",
        "title": status.canonical_reason().unwrap_or(""),
        "status": status.as_u16(),
        "detail": detail,
    });
    (status, [("content-type", "application/problem+json")], body.to_string()).into_response()
}

fn now_text() -> String {
    time::OffsetDateTime::now_utc().format(&time::format_description::well_known::Rfc3339).unwrap()
}

fn view(p: &FakePayment) -> Value {
    json!({"id": p.id, "status": p.status, "amount": p.amount, "currency": p.currency, "createdAt": p.created_at})
}

/// Two legs of one posting: `amount` from `debit` to `credit`.
fn post_legs(inner: &mut Inner, tx: &str, debit: &str, credit: &str, amount: i64) {
    for (account, is_credit) in [(debit, false), (credit, true)] {
        let id = inner.entries.len() as i64 + 1;
        inner.entries.push(Entry { id, tx: tx.into(), account: account.into(), credit: is_credit, amount });
        let a = inner.accounts.get_mut(account).unwrap();
        a.balance += if is_credit { amount } else { -amount };
    }
}

fn finish_saga(inner: &mut Inner, id: &str, captured: bool) {
    let p = inner.payments[id].clone();
    if captured {
        post_legs(inner, id, SUSPENSE, &p.payee, p.amount);
    } else {
        post_legs(inner, id, SUSPENSE, &p.payer, p.amount);
    }
    inner.payments.get_mut(id).unwrap().status = if captured { "SUCCEEDED" } else { "FAILED" }.into();
}

fn replay_or_reject(inner: &Inner, rec: &KeyRecord, key: &str, hash: &str, refund: bool) -> Response {
    if rec.hash != hash {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("idempotency key '{key}' was already used with a different request body"),
        );
    }
    match &rec.state {
        KeyState::InProgress => {
            problem(StatusCode::CONFLICT, format!("a request with idempotency key '{key}' is already in progress"))
        }
        KeyState::Completed { resource, code } => {
            let body = if refund { inner.refunds[resource].clone() } else { view(&inner.payments[resource]) };
            (StatusCode::from_u16(*code).unwrap(), axum::Json(body)).into_response()
        }
    }
}

fn header_key(headers: &HeaderMap) -> Option<String> {
    headers.get("idempotency-key").and_then(|v| v.to_str().ok()).filter(|k| !k.is_empty()).map(str::to_string)
}

async fn create_payment(State(s): State<Arc<FakeState>>, headers: HeaderMap, body: Bytes) -> Response {
    let Some(key) = header_key(&headers) else {
        return problem(StatusCode::BAD_REQUEST, "Required header 'Idempotency-Key' is not present.".into());
    };
    let Ok(b) = serde_json::from_slice::<Value>(&body) else {
        return problem(StatusCode::BAD_REQUEST, "Failed to read request".into());
    };
    let text = |f: &str| b[f].as_str().filter(|s| !s.trim().is_empty()).map(str::to_string);
    let (Some(merchant), Some(payer), Some(payee), Some(amount), Some(currency)) =
        (text("merchantId"), text("payerAccountId"), text("payeeAccountId"), b["amount"].as_i64(), text("currency"))
    else {
        return problem(StatusCode::BAD_REQUEST, "Invalid request content.".into());
    };
    if amount <= 0 || currency.len() != 3 {
        return problem(StatusCode::BAD_REQUEST, "Invalid request content.".into());
    }
    let hash = format!("{merchant}|{payer}|{payee}|{amount}|{currency}");
    let id = uuid::Uuid::new_v4().to_string();
    let saga = {
        let mut inner = s.inner.lock().unwrap();
        inner.payment_posts += 1;
        let saga = inner.saga.unwrap_or(Saga::Settle);
        if saga == Saga::Unknown422 {
            return problem(StatusCode::UNPROCESSABLE_ENTITY, "velocity limit reached for this payer".into());
        }
        let k = (merchant.clone(), key.clone());
        if let Some(rec) = inner.keys.get(&k) {
            return replay_or_reject(&inner, rec, &key, &hash, false);
        }
        if !inner.accounts.contains_key(&payer) || !inner.accounts.contains_key(&payee) {
            return problem(StatusCode::NOT_FOUND, format!("account not found: {payer}"));
        }
        inner.keys.insert(k, KeyRecord { hash: hash.clone(), state: KeyState::InProgress });
        saga
    };
    if saga == Saga::Stall {
        let mut released = s.gate.subscribe();
        let _ = released.wait_for(|open| *open).await;
    }
    let mut inner = s.inner.lock().unwrap();
    let k = (merchant.clone(), key.clone());
    // Tx1: hold. Insufficient funds: the key is released, nothing is kept.
    let funds = inner.accounts[&payer].balance;
    if funds < amount {
        inner.keys.remove(&k);
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("insufficient funds in account {payer}: balance={funds}, attempted debit={amount}"),
        );
    }
    let p = FakePayment {
        id: id.clone(),
        merchant,
        payer: payer.clone(),
        payee,
        amount,
        currency,
        status: "PROCESSING".into(),
        refunded: 0,
        created_at: now_text(),
    };
    inner.payments.insert(id.clone(), p);
    inner.order.push(id.clone());
    post_legs(&mut inner, &id, &payer, SUSPENSE, amount);
    // The provider, then Tx2.
    match saga {
        Saga::Settle | Saga::Stall => finish_saga(&mut inner, &id, true),
        Saga::Decline => finish_saga(&mut inner, &id, false),
        Saga::Processing | Saga::Unknown422 => {}
        Saga::Authorized => inner.payments.get_mut(&id).unwrap().status = "AUTHORIZED".into(),
        Saga::ServerErrorAfterHold => {
            inner.keys.remove(&k);
            return problem(StatusCode::INTERNAL_SERVER_ERROR, "provider unavailable".into());
        }
    }
    inner.keys.insert(k, KeyRecord { hash, state: KeyState::Completed { resource: id.clone(), code: 201 } });
    (StatusCode::CREATED, axum::Json(view(&inner.payments[&id]))).into_response()
}

async fn get_payment(State(s): State<Arc<FakeState>>, Path(id): Path<String>) -> Response {
    let inner = s.inner.lock().unwrap();
    match inner.payments.get(&id) {
        Some(p) => axum::Json(view(p)).into_response(),
        None => problem(StatusCode::NOT_FOUND, format!("payment not found: {id}")),
    }
}

async fn create_refund(
    State(s): State<Arc<FakeState>>,
    Path(payment_id): Path<String>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(key) = header_key(&headers) else {
        return problem(StatusCode::BAD_REQUEST, "Required header 'Idempotency-Key' is not present.".into());
    };
    let Some(amount) =
        serde_json::from_slice::<Value>(&body).ok().and_then(|b| b["amount"].as_i64()).filter(|a| *a > 0)
    else {
        return problem(StatusCode::BAD_REQUEST, "Invalid request content.".into());
    };
    let mut inner = s.inner.lock().unwrap();
    let Some(p) = inner.payments.get(&payment_id).cloned() else {
        return problem(StatusCode::NOT_FOUND, format!("payment not found: {payment_id}"));
    };
    let hash = format!("{payment_id}|{amount}");
    let k = (p.merchant.clone(), key.clone());
    if let Some(rec) = inner.keys.get(&k) {
        return replay_or_reject(&inner, rec, &key, &hash, true);
    }
    if p.status != "SUCCEEDED" && p.status != "PARTIALLY_REFUNDED" {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("payment {payment_id} is not refundable in status {}", p.status),
        );
    }
    let remaining = p.amount - p.refunded;
    if amount > remaining {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("refund {amount} exceeds the remaining refundable amount {remaining}"),
        );
    }
    let funds = inner.accounts[&p.payee].balance;
    if funds < amount {
        return problem(
            StatusCode::UNPROCESSABLE_ENTITY,
            format!("insufficient funds in account {}: balance={funds}, attempted debit={amount}", p.payee),
        );
    }
    let id = uuid::Uuid::new_v4().to_string();
    post_legs(&mut inner, &payment_id, &p.payee, &p.payer, amount);
    let pay = inner.payments.get_mut(&payment_id).unwrap();
    pay.refunded += amount;
    pay.status = if pay.refunded == pay.amount { "REFUNDED" } else { "PARTIALLY_REFUNDED" }.into();
    let view =
        json!({"id": id, "paymentId": payment_id, "amount": amount, "status": "SUCCEEDED", "createdAt": now_text()});
    inner.refunds.insert(id.clone(), view.clone());
    inner.keys.insert(k, KeyRecord { hash, state: KeyState::Completed { resource: id, code: 201 } });
    (StatusCode::CREATED, axum::Json(view)).into_response()
}

async fn balance(State(s): State<Arc<FakeState>>, Path(id): Path<String>) -> Response {
    let inner = s.inner.lock().unwrap();
    match inner.accounts.get(&id) {
        Some(a) => axum::Json(json!({"accountId": id, "balance": a.balance, "currency": a.currency})).into_response(),
        None => problem(StatusCode::NOT_FOUND, format!("account not found: {id}")),
    }
}

async fn ledger(
    State(s): State<Arc<FakeState>>,
    Path(id): Path<String>,
    Query(q): Query<HashMap<String, String>>,
) -> Response {
    let limit: usize = q.get("limit").and_then(|l| l.parse().ok()).unwrap_or(50);
    let inner = s.inner.lock().unwrap();
    if !inner.accounts.contains_key(&id) {
        return problem(StatusCode::NOT_FOUND, format!("account not found: {id}"));
    }
    let lines: Vec<Value> = inner
        .entries
        .iter()
        .rev()
        .filter(|e| e.account == id)
        .take(limit)
        .map(|e| {
            json!({"id": e.id, "transactionId": e.tx, "accountId": e.account,
                   "direction": if e.credit { "CREDIT" } else { "DEBIT" }, "amount": e.amount, "createdAt": now_text()})
        })
        .collect();
    axum::Json(Value::Array(lines)).into_response()
}

async fn report(State(s): State<Arc<FakeState>>) -> Response {
    let inner = s.inner.lock().unwrap();
    let net: i64 = inner.entries.iter().map(|e| if e.credit { e.amount } else { -e.amount }).sum();
    let mut drifted: Vec<&String> = inner
        .accounts
        .iter()
        .filter(|(id, a)| {
            let posted: i64 = inner
                .entries
                .iter()
                .filter(|e| &e.account == *id)
                .map(|e| if e.credit { e.amount } else { -e.amount })
                .sum();
            a.balance != a.opening + posted
        })
        .map(|(id, _)| id)
        .collect();
    drifted.sort();
    axum::Json(json!({"balanced": net == 0 && drifted.is_empty(), "ledgerNet": net, "driftedAccounts": drifted}))
        .into_response()
}
