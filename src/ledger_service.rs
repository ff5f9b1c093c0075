//! `ledger-serve`: the embedded reference ledger served over the REST contract in
//! `docs/ledger-api.yaml`, so a gateway can sit in front of it as the external `http` backend
//! (`backend::http::HttpLedger`) and tests can put a fault proxy between the two.
//!
//! The service is a thin skin over the `Store`'s `ledger_*` methods: the `Idempotency-Key` header
//! becomes the ledger's `idempotency_key`, so one key posts at most once (the store checks it in the
//! posting transaction). Budgets, mandates, idempotency records and audit stay on the gateway side.
//!
//! Architecture Invariant: the service never sees an agent's token; it checks one bearer credential
//! (the gateway's), compares digests in constant time, keeps only the digest, and never logs it.

use std::future::Future;
use std::sync::Arc;

use axum::Router;
use axum::body::Body;
use axum::extract::rejection::{PathRejection, QueryRejection};
use axum::extract::{Path, Query, Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::clock::Clock;
use crate::domain::error::BackendError;
use crate::domain::error::StoreError;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::{Currency, Money};
use crate::domain::payment::{
    Attempt, EntryQuery, Guards, Payment, PaymentQuery, PaymentStatus, RefundRequest, TransferRequest,
};
use crate::secret::Secret;
use crate::store::Store;

/// Largest request body accepted, in bytes (a transfer is a few hundred).
pub const BODY_BYTES_MAX: usize = 16 * 1024;
/// Longest `Idempotency-Key` accepted, in characters (visible ASCII only).
pub const IDEMPOTENCY_KEY_CHARS_MAX: usize = 255;
/// Longest memo or refund reason, in characters (the gateway's own bound, `MEMO_CHARS_MAX`).
pub const TEXT_CHARS_MAX: usize = 140;
/// Longest `principal_sub`, in characters.
pub const PRINCIPAL_SUB_CHARS_MAX: usize = 512;
/// Page size when `limit` is omitted, and the largest accepted.
pub const LIST_LIMIT_DEFAULT: u32 = 50;
pub const LIST_LIMIT_MAX: u32 = 1000;
/// Most `account` filters in one payment listing.
pub const LIST_ACCOUNTS_MAX: usize = 1000;

#[derive(Clone)]
struct Svc {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// SHA-256 of the credential; `None` (an empty credential) refuses every request.
    credential_digest: Option<[u8; 32]>,
    /// One ledger check at a time; concurrent callers share the next one.
    checks: Arc<crate::store::LedgerChecks>,
}

/// The contract's routes over `store`. Every route but `/v1/health` needs `Authorization: Bearer
/// <credential>`.
pub fn router(store: Arc<dyn Store>, clock: Arc<dyn Clock>, credential: Secret) -> Router {
    let credential_digest = if credential.expose().is_empty() {
        tracing::error!("ledger-serve has an empty credential: every request will be refused");
        None
    } else {
        Some(digest(credential.expose()))
    };
    let svc = Svc { store, clock, credential_digest, checks: Default::default() };
    let api = Router::new()
        .route("/v1/payments", post(create_payment).get(list_payments))
        .route("/v1/payments/{id}", get(get_payment))
        .route("/v1/payments/{id}/refunds", post(create_refund))
        .route("/v1/accounts/{id}/balance", get(get_balance))
        .route("/v1/accounts/{id}/entries", get(get_entries))
        .route("/v1/integrity", get(get_integrity))
        .route_layer(middleware::from_fn_with_state(svc.clone(), require_credential));
    Router::new()
        .route("/v1/health", get(health))
        .merge(api)
        .fallback(|| async { ApiError::new(StatusCode::NOT_FOUND, "NOT_FOUND", "no such route") })
        .method_not_allowed_fallback(|| async {
            ApiError::new(StatusCode::METHOD_NOT_ALLOWED, "METHOD_NOT_ALLOWED", "method not allowed on this route")
        })
        .with_state(svc)
}

/// Serve the contract on `listener` until `shutdown` resolves (in-flight requests finish).
pub async fn serve(
    listener: tokio::net::TcpListener,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    credential: Secret,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    if credential.expose().is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::InvalidInput, "ledger-serve needs a non-empty credential"));
    }
    let addr = listener.local_addr()?;
    tracing::info!(ledger.addr = %addr, "ledger-serve listening");
    axum::serve(listener, router(store, clock, credential)).with_graceful_shutdown(shutdown).await
}

fn digest(s: &str) -> [u8; 32] {
    Sha256::digest(s.as_bytes()).into()
}

/// Compares fixed-length digests without an early exit, so timing reveals nothing about the
/// credential (hashing first also hides its length).
fn digests_equal(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b.iter()).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

async fn require_credential(State(svc): State<Svc>, req: Request, next: Next) -> Response {
    let presented = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split_once(' '))
        .filter(|(scheme, _)| scheme.eq_ignore_ascii_case("bearer"))
        .map(|(_, token)| digest(token.trim()));
    let ok = match (&presented, &svc.credential_digest) {
        (Some(p), Some(expected)) => digests_equal(p, expected),
        _ => false,
    };
    if ok {
        return next.run(req).await;
    }
    // A fixed reason, never the header.
    let reason = if presented.is_some() { "wrong credential" } else { "missing bearer credential" };
    tracing::warn!(reason, http.path = %req.uri().path(), "ledger-serve refused a request");
    let mut resp = ApiError::new(StatusCode::UNAUTHORIZED, "UNAUTHORIZED", "a valid bearer credential is required")
        .into_response();
    resp.headers_mut().insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
    resp
}

// ---------------------------------------------------------------------------------------------
// Errors: the contract's `{code, message, …}` body. Structured refusals carry their fields so a
// client can rebuild the typed error.

#[derive(Debug, Serialize)]
struct ErrorBody {
    code: &'static str,
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    account: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    account_currency: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    requested_currency: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    balance: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    needed: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payment_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    requested_amount: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    remaining: Option<String>,
}

#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    /// Boxed: handlers return `Result<_, ApiError>` everywhere.
    body: Box<ErrorBody>,
}

impl ApiError {
    fn new(status: StatusCode, code: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            body: Box::new(ErrorBody {
                code,
                message: message.into(),
                account: None,
                account_currency: None,
                requested_currency: None,
                balance: None,
                needed: None,
                payment_id: None,
                requested_amount: None,
                remaining: None,
            }),
        }
    }

    fn invalid(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::BAD_REQUEST, "INVALID_REQUEST", message)
    }

    /// The store failed: nothing was applied. The detail is logged, not returned.
    fn unavailable(detail: &str) -> Self {
        tracing::error!(error = %detail, "ledger-serve: store unavailable");
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            "the ledger cannot reach its store; nothing was applied",
        )
    }

    fn refused(code: &'static str, e: &BackendError) -> Self {
        ApiError::new(StatusCode::UNPROCESSABLE_ENTITY, code, e.to_string())
    }
}

impl From<StoreError> for ApiError {
    fn from(e: StoreError) -> Self {
        ApiError::unavailable(&e.to_string())
    }
}

/// The one place a ledger outcome becomes an HTTP status (exhaustive: a new variant must be mapped).
impl From<BackendError> for ApiError {
    fn from(e: BackendError) -> Self {
        match &e {
            BackendError::AccountNotFound(account) => {
                let mut a = ApiError::refused("ACCOUNT_NOT_FOUND", &e);
                a.body.account = Some(account.to_string());
                a
            }
            BackendError::CurrencyMismatch { account, account_currency, requested } => {
                let mut a = ApiError::refused("CURRENCY_MISMATCH", &e);
                a.body.account = Some(account.to_string());
                a.body.account_currency = Some(account_currency.code().to_string());
                a.body.requested_currency = Some(requested.code().to_string());
                a
            }
            BackendError::SameAccount => ApiError::refused("SAME_ACCOUNT", &e),
            BackendError::InsufficientFunds { account, balance, needed } => {
                let mut a = ApiError::refused("INSUFFICIENT_FUNDS", &e);
                a.body.account = Some(account.to_string());
                a.body.balance = Some(balance.clone());
                a.body.needed = Some(needed.clone());
                a
            }
            BackendError::PaymentNotFound(id) => {
                let mut a = ApiError::new(StatusCode::NOT_FOUND, "PAYMENT_NOT_FOUND", e.to_string());
                a.body.payment_id = Some(id.to_string());
                a
            }
            BackendError::NotRefundable(id) => {
                let mut a = ApiError::refused("NOT_REFUNDABLE", &e);
                a.body.payment_id = Some(id.to_string());
                a
            }
            BackendError::RefundExceedsRemaining { requested, remaining } => {
                let mut a = ApiError::refused("REFUND_EXCEEDS_REMAINING", &e);
                a.body.requested_amount = Some(requested.clone());
                a.body.remaining = Some(remaining.clone());
                a
            }
            BackendError::IdempotencyKeyReused => {
                ApiError::new(StatusCode::CONFLICT, "IDEMPOTENCY_KEY_REUSED", e.to_string())
            }
            BackendError::BudgetExceeded(_) => ApiError::refused("BUDGET_EXCEEDED", &e),
            BackendError::MandateExhausted(_) => ApiError::refused("MANDATE_EXHAUSTED", &e),
            BackendError::Rejected(_) => ApiError::refused("REJECTED", &e),
            BackendError::Unavailable(detail) => ApiError::unavailable(detail),
            // The store never answers this (it is a remote backend's verdict); should it ever, the
            // outcome is unknown to us too: an opaque 500, which clients must treat as "maybe applied".
            BackendError::OutcomeUnknown(detail) => {
                tracing::error!(error = %detail, "ledger-serve: outcome unknown");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "internal error")
            }
            // Requests here claim no keys, so the store cannot answer this; should it, an opaque 500.
            BackendError::KeyHeld { .. } => {
                tracing::error!(error = %e, "ledger-serve: a key claim it never made");
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "INTERNAL", "internal error")
            }
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body)).into_response()
    }
}

// ---------------------------------------------------------------------------------------------
// Request parsing (our own rejections, so every error has the contract's JSON body).

async fn read_json<T: serde::de::DeserializeOwned>(body: Body) -> Result<T, ApiError> {
    let bytes = axum::body::to_bytes(body, BODY_BYTES_MAX).await.map_err(|_| {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BODY_TOO_LARGE",
            format!("the body must be at most {BODY_BYTES_MAX} bytes"),
        )
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ApiError::invalid(format!("invalid JSON body: {e}")))
}

fn idempotency_key(headers: &HeaderMap) -> Result<String, ApiError> {
    let Some(value) = headers.get("idempotency-key") else {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "IDEMPOTENCY_KEY_REQUIRED",
            "the Idempotency-Key header is required",
        ));
    };
    let key = value.to_str().unwrap_or("");
    let ok = !key.is_empty() && key.len() <= IDEMPOTENCY_KEY_CHARS_MAX && key.bytes().all(|b| b.is_ascii_graphic());
    if !ok {
        return Err(ApiError::invalid(format!(
            "Idempotency-Key must be 1-{IDEMPOTENCY_KEY_CHARS_MAX} visible ASCII characters"
        )));
    }
    Ok(key.to_string())
}

/// The `Paygate-Mandate` header, when present, within the spec's bound (`MANDATE_BYTES_MAX`, as the
/// gateway holds mandates to): this service does not verify mandates, but an over-long header is
/// bad input, refused with nothing applied (schemathesis found one accepted).
fn check_mandate_header(headers: &HeaderMap) -> Result<(), ApiError> {
    let max = crate::domain::approval::MANDATE_BYTES_MAX;
    match headers.get(crate::backend::http::MANDATE_HEADER) {
        Some(v) if v.len() > max => Err(ApiError::invalid(format!("Paygate-Mandate must be at most {max} bytes"))),
        _ => Ok(()),
    }
}

fn check_text(field: &str, value: &Option<String>) -> Result<(), ApiError> {
    match value {
        Some(v) if v.chars().count() > TEXT_CHARS_MAX || v.chars().any(char::is_control) => Err(ApiError::invalid(
            format!("{field} must be at most {TEXT_CHARS_MAX} characters, without control characters"),
        )),
        _ => Ok(()),
    }
}

fn check_principal(sub: &str) -> Result<(), ApiError> {
    if sub.is_empty() || sub.chars().count() > PRINCIPAL_SUB_CHARS_MAX || sub.chars().any(char::is_control) {
        return Err(ApiError::invalid(format!(
            "principal_sub must be 1-{PRINCIPAL_SUB_CHARS_MAX} characters, without control characters"
        )));
    }
    Ok(())
}

fn path_payment(p: Result<Path<String>, PathRejection>) -> Result<PaymentId, ApiError> {
    let Path(raw) = p.map_err(|e| ApiError::invalid(e.body_text()))?;
    PaymentId::parse(&raw).map_err(|e| ApiError::invalid(e.to_string()))
}

fn path_account(p: Result<Path<String>, PathRejection>) -> Result<AccountId, ApiError> {
    let Path(raw) = p.map_err(|e| ApiError::invalid(e.body_text()))?;
    AccountId::parse(&raw).map_err(|e| ApiError::invalid(e.to_string()))
}

fn parse_limit(raw: Option<&str>) -> Result<u32, ApiError> {
    match raw {
        None => Ok(LIST_LIMIT_DEFAULT),
        Some(s) => match s.parse::<u32>() {
            Ok(n) if (1..=LIST_LIMIT_MAX).contains(&n) => Ok(n),
            _ => Err(ApiError::invalid(format!("limit must be 1..={LIST_LIMIT_MAX}"))),
        },
    }
}

fn parse_before(raw: Option<&str>) -> Result<Option<i64>, ApiError> {
    raw.map(|s| s.parse::<i64>().map_err(|_| ApiError::invalid("before must be a cursor from next_cursor"))).transpose()
}

/// A `from` / `to` bound: Unix seconds.
fn parse_instant(raw: Option<&str>, name: &str) -> Result<Option<i64>, ApiError> {
    raw.map(|s| s.parse::<i64>().map_err(|_| ApiError::invalid(format!("{name} must be Unix seconds")))).transpose()
}

/// Query pairs in order (so `account` may repeat); any parameter outside `allowed` is refused.
fn query_pairs(
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
    allowed: &[&str],
) -> Result<Vec<(String, String)>, ApiError> {
    let Query(pairs) = q.map_err(|e| ApiError::invalid(e.body_text()))?;
    if let Some((k, _)) = pairs.iter().find(|(k, _)| !allowed.contains(&k.as_str())) {
        return Err(ApiError::invalid(format!("unknown query parameter {:?}", k.chars().take(32).collect::<String>())));
    }
    Ok(pairs)
}

fn single<'a>(pairs: &'a [(String, String)], name: &str) -> Result<Option<&'a str>, ApiError> {
    let mut found = pairs.iter().filter(|(k, _)| k == name).map(|(_, v)| v.as_str());
    let first = found.next();
    if found.next().is_some() {
        return Err(ApiError::invalid(format!("{name} may appear once")));
    }
    Ok(first)
}

// ---------------------------------------------------------------------------------------------
// Money-moving routes.

/// Integral JSON numbers written with a fraction (`100.0`) are read as minor units below 2^53,
/// where a double stops holding every integer (the schema's maximum is far below it).
const EXACT_FLOAT_MAX: f64 = 9_007_199_254_740_992.0;

/// `amount_minor` as JSON Schema reads `integer`: `100` and `100.0` are the same integer; `100.5`
/// (or anything a double cannot hold exactly) is refused, never rounded.
fn minor_units<'de, D: serde::Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    use serde::de::Error;
    let n = serde_json::Number::deserialize(d)?;
    if let Some(i) = n.as_i64() {
        return Ok(i);
    }
    match n.as_f64() {
        Some(f) if f.fract() == 0.0 && f.abs() < EXACT_FLOAT_MAX => Ok(f as i64),
        _ => Err(D::Error::custom(format!("amount_minor must be an integer number of minor units, got {n}"))),
    }
}

fn optional_minor_units<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Option<i64>, D::Error> {
    #[derive(Deserialize)]
    struct Minor(#[serde(deserialize_with = "minor_units")] i64);
    Ok(Option::<Minor>::deserialize(d)?.map(|Minor(m)| m))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TransferBody {
    payment_id: PaymentId,
    from_account: AccountId,
    to_account: AccountId,
    #[serde(deserialize_with = "minor_units")]
    amount_minor: i64,
    currency: Currency,
    #[serde(default)]
    memo: Option<String>,
    principal_sub: String,
    #[serde(default)]
    principal_user: Option<String>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RefundBody {
    refund_id: PaymentId,
    #[serde(default, deserialize_with = "optional_minor_units")]
    amount_minor: Option<i64>,
    #[serde(default)]
    reason: Option<String>,
    principal_sub: String,
    #[serde(default)]
    principal_user: Option<String>,
}

#[derive(Serialize)]
struct PageBody<T> {
    items: Vec<T>,
    next_cursor: Option<i64>,
}

/// 201 for a new payment, 200 (and `Idempotent-Replayed: true`) when the key was already applied.
fn created_or_replayed(payment: Payment, replayed: bool) -> Response {
    if replayed {
        let mut resp = (StatusCode::OK, axum::Json(payment)).into_response();
        resp.headers_mut().insert("idempotent-replayed", HeaderValue::from_static("true"));
        resp
    } else {
        (StatusCode::CREATED, axum::Json(payment)).into_response()
    }
}

/// Why an insert under a fresh key failed when the requested id was already taken: with the store
/// answering, it is the id (the store reports its UNIQUE violation as `Unavailable`).
async fn id_conflict_or(svc: &Svc, id: &PaymentId, err: BackendError) -> ApiError {
    if matches!(err, BackendError::Unavailable(_)) && svc.store.ping().await.is_ok() {
        let mut a = ApiError::new(
            StatusCode::CONFLICT,
            "PAYMENT_ID_CONFLICT",
            format!("{id} already names another payment; a new Idempotency-Key needs a new id"),
        );
        a.body.payment_id = Some(id.to_string());
        return a;
    }
    err.into()
}

async fn create_payment(State(svc): State<Svc>, headers: HeaderMap, body: Body) -> Result<Response, ApiError> {
    let key = idempotency_key(&headers)?;
    check_mandate_header(&headers)?;
    let b: TransferBody = read_json(body).await?;
    let amount = Money::from_minor(b.amount_minor, b.currency).map_err(|e| ApiError::invalid(e.to_string()))?;
    check_text("memo", &b.memo)?;
    check_principal(&b.principal_sub)?;
    if let Some(u) = &b.principal_user {
        check_principal(u)?;
    }
    // Only to tell a replay (200) from a creation (201), and an id conflict from an outage.
    let existed = svc.store.ledger_payment(&b.payment_id).await?.is_some();
    let req = TransferRequest {
        attempt: Attempt::reserved(key),
        payment_id: b.payment_id.clone(),
        from_account: b.from_account,
        to_account: b.to_account,
        amount,
        memo: b.memo,
        principal_sub: b.principal_sub,
        principal_user: b.principal_user,
        guards: Guards::default(),
    };
    match svc.store.ledger_transfer(req, svc.clock.now()).await {
        Ok(payment) => {
            // Same key, same transfer: the original payment, whatever id this request proposed.
            let replayed = existed || payment.id != b.payment_id;
            tracing::info!(payment.id = %payment.id, replayed, "ledger-serve: transfer");
            Ok(created_or_replayed(payment, replayed))
        }
        Err(e) if existed => Err(id_conflict_or(&svc, &b.payment_id, e).await),
        Err(e) => Err(e.into()),
    }
}

async fn create_refund(
    State(svc): State<Svc>,
    id: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let payment_id = path_payment(id)?;
    let key = idempotency_key(&headers)?;
    check_mandate_header(&headers)?;
    let b: RefundBody = read_json(body).await?;
    if b.amount_minor.is_some_and(|a| a <= 0) {
        return Err(ApiError::invalid("amount_minor must be greater than zero"));
    }
    check_text("reason", &b.reason)?;
    check_principal(&b.principal_sub)?;
    if let Some(u) = &b.principal_user {
        check_principal(u)?;
    }
    let existed = svc.store.ledger_payment(&b.refund_id).await?.is_some();
    let req = RefundRequest {
        attempt: Attempt::reserved(key),
        refund_id: b.refund_id.clone(),
        payment_id,
        amount_minor: b.amount_minor,
        reason: b.reason,
        principal_sub: b.principal_sub,
        principal_user: b.principal_user,
        guards: Guards::default(),
        autonomous_cap_minor: None,
    };
    match svc.store.ledger_refund(req, svc.clock.now()).await {
        Ok(refund) => {
            let replayed = existed || refund.id != b.refund_id;
            tracing::info!(payment.id = %refund.id, replayed, "ledger-serve: refund");
            Ok(created_or_replayed(refund, replayed))
        }
        Err(e) if existed => Err(id_conflict_or(&svc, &b.refund_id, e).await),
        Err(e) => Err(e.into()),
    }
}

// ---------------------------------------------------------------------------------------------
// Reads.

async fn get_payment(State(svc): State<Svc>, id: Result<Path<String>, PathRejection>) -> Result<Response, ApiError> {
    let id = path_payment(id)?;
    match svc.store.ledger_payment(&id).await? {
        Some(p) => Ok(axum::Json(p).into_response()),
        None => Err(BackendError::PaymentNotFound(id).into()),
    }
}

async fn list_payments(
    State(svc): State<Svc>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let pairs = query_pairs(q, &["account", "status", "from", "to", "before", "limit", "principal_user"])?;
    let accounts = pairs
        .iter()
        .filter(|(k, _)| k == "account")
        .map(|(_, v)| AccountId::parse(v).map_err(|e| ApiError::invalid(e.to_string())))
        .collect::<Result<Vec<_>, _>>()?;
    if accounts.is_empty() || accounts.len() > LIST_ACCOUNTS_MAX {
        return Err(ApiError::invalid(format!("give 1-{LIST_ACCOUNTS_MAX} account parameters")));
    }
    let status = single(&pairs, "status")?
        .map(|s| {
            PaymentStatus::parse(s).ok_or_else(|| ApiError::invalid("status must be pending, succeeded or failed"))
        })
        .transpose()?;
    let query = PaymentQuery {
        accounts,
        status,
        before_seq: parse_before(single(&pairs, "before")?)?,
        limit: parse_limit(single(&pairs, "limit")?)?,
        from: parse_instant(single(&pairs, "from")?, "from")?,
        to: parse_instant(single(&pairs, "to")?, "to")?,
        principal_user: single(&pairs, "principal_user")?
            .map(|u| check_principal(u).map(|()| u.to_string()))
            .transpose()?,
    };
    let page = svc.store.ledger_list_payments(query).await?;
    Ok(axum::Json(PageBody { items: page.items, next_cursor: page.next_cursor }).into_response())
}

async fn get_balance(State(svc): State<Svc>, id: Result<Path<String>, PathRejection>) -> Result<Response, ApiError> {
    let account = path_account(id)?;
    match svc.store.ledger_balance(&account).await? {
        Some(b) => Ok(axum::Json(b).into_response()),
        None => {
            // A read of something absent is a 404, not a refusal.
            let mut e = ApiError::from(BackendError::AccountNotFound(account));
            e.status = StatusCode::NOT_FOUND;
            Err(e)
        }
    }
}

async fn get_entries(
    State(svc): State<Svc>,
    id: Result<Path<String>, PathRejection>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let account = path_account(id)?;
    let pairs = query_pairs(q, &["before", "limit"])?;
    let before_seq = parse_before(single(&pairs, "before")?)?;
    let limit = parse_limit(single(&pairs, "limit")?)?;
    let page = svc.store.ledger_entries(EntryQuery { account, before_seq, limit }).await?;
    Ok(axum::Json(PageBody { items: page.items, next_cursor: page.next_cursor }).into_response())
}

async fn get_integrity(
    State(svc): State<Svc>,
    q: Result<Query<Vec<(String, String)>>, QueryRejection>,
) -> Result<Response, ApiError> {
    let pairs = query_pairs(q, &["full"])?;
    let full = match single(&pairs, "full")? {
        None | Some("false") => false,
        Some("true") => true,
        Some(_) => return Err(ApiError::invalid("full must be true or false")),
    };
    let report = svc.checks.check(&*svc.store, full, svc.clock.now()).await?;
    Ok(axum::Json(report).into_response())
}

/// Unauthenticated (for probes); says only whether the store answers.
async fn health(State(svc): State<Svc>) -> Result<Response, ApiError> {
    svc.store.ping().await?;
    Ok(axum::Json(serde_json::json!({ "status": "ok" })).into_response())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn amount_minor_is_an_integer_however_it_is_written() {
        let body = |amount: &str| {
            serde_json::from_str::<TransferBody>(&format!(
                r#"{{"payment_id":"pay_a1","from_account":"acct-A","to_account":"acct-B","amount_minor":{amount},
                    "currency":"KES","principal_sub":"bot"}}"#
            ))
            .map(|b| b.amount_minor)
        };
        assert_eq!(body("5000").unwrap(), 5000);
        assert_eq!(body("5000.0").unwrap(), 5000, "JSON Schema's integer includes 5000.0");
        assert_eq!(body("5e3").unwrap(), 5000);
        for refused in ["5000.5", "1e300", "\"5000\"", "9007199254740993.0"] {
            assert!(body(refused).is_err(), "{refused} is not an exact integer");
        }
        let refund = |amount: &str| {
            serde_json::from_str::<RefundBody>(&format!(
                r#"{{"refund_id":"pay_r1","amount_minor":{amount},"principal_sub":"bot"}}"#
            ))
            .map(|b| b.amount_minor)
        };
        assert_eq!(refund("null").unwrap(), None);
        assert_eq!(refund("250.0").unwrap(), Some(250));
        assert!(refund("0.25").is_err());
    }

    #[test]
    fn a_mandate_header_over_its_bound_is_refused() {
        let max = crate::domain::approval::MANDATE_BYTES_MAX;
        let with = |len: usize| {
            let mut h = HeaderMap::new();
            h.insert(crate::backend::http::MANDATE_HEADER, HeaderValue::from_str(&"v".repeat(len)).unwrap());
            h
        };
        assert!(check_mandate_header(&HeaderMap::new()).is_ok());
        assert!(check_mandate_header(&with(max)).is_ok(), "exactly the bound");
        let refused = check_mandate_header(&with(max + 1)).unwrap_err();
        assert_eq!(refused.status, StatusCode::BAD_REQUEST);
    }

    #[test]
    fn digests_compare_by_value() {
        assert!(digests_equal(&digest("credential-one"), &digest("credential-one")));
        assert!(!digests_equal(&digest("credential-one"), &digest("credential-two")));
        assert!(!digests_equal(&digest(""), &digest("x")));
    }

    #[test]
    fn every_backend_error_has_a_status_and_code() {
        let acct = AccountId::parse("acct-A").unwrap();
        let pay = PaymentId::parse("pay_1").unwrap();
        let kes = Currency::parse("KES").unwrap();
        let cases = [
            (BackendError::AccountNotFound(acct.clone()), 422, "ACCOUNT_NOT_FOUND"),
            (
                BackendError::CurrencyMismatch { account: acct.clone(), account_currency: kes, requested: kes },
                422,
                "CURRENCY_MISMATCH",
            ),
            (BackendError::SameAccount, 422, "SAME_ACCOUNT"),
            (
                BackendError::InsufficientFunds { account: acct, balance: "1.00".into(), needed: "2.00".into() },
                422,
                "INSUFFICIENT_FUNDS",
            ),
            (BackendError::PaymentNotFound(pay.clone()), 404, "PAYMENT_NOT_FOUND"),
            (BackendError::NotRefundable(pay), 422, "NOT_REFUNDABLE"),
            (
                BackendError::RefundExceedsRemaining { requested: "2.00".into(), remaining: "1.00".into() },
                422,
                "REFUND_EXCEEDS_REMAINING",
            ),
            (BackendError::IdempotencyKeyReused, 409, "IDEMPOTENCY_KEY_REUSED"),
            (BackendError::BudgetExceeded("x".into()), 422, "BUDGET_EXCEEDED"),
            (BackendError::MandateExhausted("x".into()), 422, "MANDATE_EXHAUSTED"),
            (BackendError::Rejected("x".into()), 422, "REJECTED"),
            (BackendError::Unavailable("db".into()), 503, "UNAVAILABLE"),
            (BackendError::OutcomeUnknown("x".into()), 500, "INTERNAL"),
        ];
        for (e, status, code) in cases {
            let a = ApiError::from(e);
            assert_eq!(a.status.as_u16(), status, "{code}");
            assert_eq!(a.body.code, code);
        }
    }

    #[test]
    fn store_failures_are_opaque() {
        let a = ApiError::from(BackendError::Unavailable("disk I/O error at /secret/path".into()));
        assert!(!a.body.message.contains("/secret/path"));
    }
}
