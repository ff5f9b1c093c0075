//! `HttpLedger`: a `PaymentBackend` over the REST contract in `docs/ledger-api.yaml` (served by
//! `ledger_service`, or by any ledger implementing the contract).
//!
//! The rules that make it safe to move money over a network:
//! - Every money-moving POST carries the request's idempotency key as `Idempotency-Key`, and retries
//!   (connect errors, timeouts, 5xx) resend the same key and the same bytes, so a retry is a replay.
//! - "Nothing moved" (`Unavailable`) is reported only when no attempt can have been applied: every
//!   attempt failed to connect, was answered 503/429, was refused by the open circuit, or was
//!   refused as malformed/unauthorized. Once any attempt may have reached the ledger (a timeout, a
//!   connection closed after sending, another 5xx), only a success or `IDEMPOTENCY_KEY_REUSED` is
//!   definitive; everything else is `OutcomeUnknown`, and the gateway keeps the key in flight.
//! - A success must describe the request (kind, accounts, amount, currency); anything else is
//!   `OutcomeUnknown`, never a wrong success.
//! - A payment or refund authorized by a mandate carries it (`Paygate-Mandate`): the ledger may
//!   verify the human's approval itself from the gateway's published JWKS.
//! - A small circuit breaker fails fast while the ledger is down, timed by the injected clock.
//!
//! Architecture Invariant: the backend sends its own configured credential, never an agent's token,
//! and never logs it (the header value is marked sensitive).

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use reqwest::header::{ACCEPT, AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use reqwest::{Method, StatusCode, Url};
use serde::Deserialize;

use super::breaker::{Breaker, backoff_with_jitter};
use super::{
    BackendError, Balance, EntryQuery, IntegrityReport, LedgerEntry, Page, Payment, PaymentBackend, PaymentKind,
    PaymentQuery, RefundRequest, TransferRequest,
};
use crate::clock::Clock;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::Currency;
use crate::secret::Secret;

/// The header that carries the mandate (compact JWS) a mandated payment or refund was authorized
/// by, so the ledger can verify it itself from the gateway's JWKS (docs/ledger-api.yaml).
pub const MANDATE_HEADER: &str = "paygate-mandate";

/// What a money-moving request is sent under: its idempotency key and, when a human's mandate
/// authorized it, that mandate.
struct Keyed {
    key: HeaderValue,
    mandate: Option<HeaderValue>,
}

/// A retry waits up to this long (jittered); each further retry doubles the cap, up to `RETRY_BACKOFF_MAX`.
const RETRY_BACKOFF_BASE: Duration = Duration::from_millis(50);
const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(1_000);
/// Largest response body read, in bytes (a page of 1000 payments is well under 1 MiB).
const RESPONSE_BYTES_MAX: usize = 8 * 1024 * 1024;
/// Bounds on the configuration, checked in `HttpLedger::new` (config.rs range-checks too).
const RETRIES_MAX_LIMIT: u32 = 10;

pub struct HttpLedgerConfig {
    /// `http(s)://host[:port][/prefix]`; the contract's `/v1/...` paths are appended.
    pub base_url: String,
    /// The bearer credential the ledger service expects from this gateway.
    pub credential: Secret,
    pub connect_timeout: Duration,
    /// Whole-exchange timeout of one attempt (connect, send, and read the full response).
    pub request_timeout: Duration,
    /// Retries after the first attempt (same key, same body).
    pub retries_max: u32,
    /// Consecutive failed attempts that open the circuit.
    pub breaker_failures_max: u32,
    /// How long the circuit stays open before one probe is let through.
    pub breaker_open: Duration,
    /// A private CA and a client certificate (mutual TLS), where the service asks for them.
    pub tls: super::outbound::OutboundTls,
}

/// How an unanswered request's detail begins when the service answered a 5xx that is not
/// retried (`Transport::retry_server_errors` off).
pub const SERVER_FAILED: &str = "the service failed the request and was not asked again";

/// What a contract over the transport asks of it.
pub(crate) struct Transport {
    /// Its name in errors, logs and the breaker.
    pub name: &'static str,
    /// An empty credential is refused; otherwise an empty one means "send no Authorization".
    pub credential_required: bool,
    /// Whether a 5xx other than 503 is retried with the same key (see `HttpLedger`).
    pub retry_server_errors: bool,
}

pub struct HttpLedger {
    base: Url,
    /// `Bearer <credential>`, marked sensitive so it never prints (`None`: a service that takes
    /// none, reached over mutual TLS or a private network: the wallet service).
    auth: Option<HeaderValue>,
    http: reqwest::Client,
    retries_max: u32,
    /// Whether a 5xx other than 503 is retried with the same key. Only where the service keeps
    /// its key through its own failures (the HTTP ledger's contract); the wallet service releases
    /// a key when its saga throws, so a same-key retry after its 500 could pay again.
    retry_server_errors: bool,
    breaker: Breaker,
}

impl HttpLedger {
    pub fn new(cfg: HttpLedgerConfig, clock: Arc<dyn Clock>) -> Result<Self, BackendError> {
        Self::transport(
            cfg,
            clock,
            Transport { name: "http ledger", credential_required: true, retry_server_errors: true },
        )
    }

    /// The transport alone (URL rules, retries with the same key and bytes, the breaker, mutual
    /// TLS), for another contract over it (`backend::wallet`).
    pub(crate) fn transport(cfg: HttpLedgerConfig, clock: Arc<dyn Clock>, t: Transport) -> Result<Self, BackendError> {
        let Transport { name, credential_required, retry_server_errors } = t;
        let invalid = |what: &str| BackendError::Unavailable(format!("invalid {name} configuration: {what}"));
        let base = Url::parse(&cfg.base_url).map_err(|_| invalid("base_url is not a URL"))?;
        if !matches!(base.scheme(), "http" | "https") || base.cannot_be_a_base() || base.host_str().is_none() {
            return Err(invalid("base_url must be an http(s) URL"));
        }
        if !base.username().is_empty() || base.password().is_some() {
            return Err(invalid("base_url must not carry credentials; set the credential instead"));
        }
        if base.query().is_some() || base.fragment().is_some() {
            return Err(invalid("base_url must not have a query or fragment"));
        }
        if credential_required && cfg.credential.expose().is_empty() {
            return Err(invalid("the credential is empty"));
        }
        let auth = match cfg.credential.expose().is_empty() {
            true => None,
            false => {
                let mut auth = HeaderValue::from_str(&format!("Bearer {}", cfg.credential.expose()))
                    .map_err(|_| invalid("the credential is not a valid header value"))?;
                auth.set_sensitive(true);
                Some(auth)
            }
        };
        if cfg.connect_timeout.is_zero() || cfg.request_timeout.is_zero() {
            return Err(invalid("timeouts must be positive"));
        }
        if cfg.retries_max > RETRIES_MAX_LIMIT {
            return Err(invalid(&format!("retries_max must be at most {RETRIES_MAX_LIMIT}")));
        }
        if cfg.breaker_failures_max == 0 || cfg.breaker_open.is_zero() {
            return Err(invalid("breaker_failures_max and breaker_open must be positive"));
        }
        let loopback = matches!(base.host_str(), Some("localhost" | "127.0.0.1" | "[::1]"));
        if base.scheme() == "http" && !loopback {
            tracing::warn!(ledger.url = %base, backend = name, "the backend is reached over plain HTTP: what it is sent travels in clear");
        }
        // No redirects: a redirected POST could be replayed as something else.
        let http = super::outbound::http_client_with(cfg.connect_timeout, cfg.request_timeout, &cfg.tls)
            .map_err(|e| invalid(&e))?;
        Ok(HttpLedger {
            base,
            auth,
            http,
            retries_max: cfg.retries_max,
            retry_server_errors,
            breaker: Breaker::new(name, cfg.breaker_failures_max, cfg.breaker_open, clock),
        })
    }

    /// The circuit breaker's state for metrics: "closed", "open" or "half_open".
    pub fn breaker_state(&self) -> &'static str {
        self.breaker.state()
    }

    pub(super) fn url(&self, segments: &[&str], query: &[(&str, String)]) -> Result<Url, BackendError> {
        let mut url = self.base.clone();
        {
            let mut path = url
                .path_segments_mut()
                .map_err(|_| BackendError::Unavailable("http ledger base_url cannot take a path".into()))?;
            path.pop_if_empty();
            for s in segments {
                // The URL rules would drop a "." or ".." segment (and its percent-encoded forms).
                if matches!(*s, "." | "..") {
                    return Err(BackendError::Unavailable(format!("id {s:?} cannot be addressed over HTTP")));
                }
                path.push(s);
            }
        }
        if !query.is_empty() {
            let mut pairs = url.query_pairs_mut();
            for (k, v) in query {
                pairs.append_pair(k, v);
            }
        }
        Ok(url)
    }

    /// One attempt: never retried here, classified by what the ledger may have seen.
    async fn attempt(&self, method: &Method, url: &Url, key: Option<&Keyed>, body: Option<&[u8]>) -> Attempt {
        // W3C trace context (telemetry on): the ledger service's spans join the gateway's trace.
        let mut rb = crate::telemetry::traced(self.http.request(method.clone(), url.clone()))
            .header(ACCEPT, "application/json, application/problem+json");
        if let Some(auth) = &self.auth {
            rb = rb.header(AUTHORIZATION, auth.clone());
        }
        if let Some(k) = key {
            rb = rb.header("idempotency-key", k.key.clone());
            if let Some(m) = &k.mandate {
                rb = rb.header(MANDATE_HEADER, m.clone());
            }
        }
        if let Some(b) = body {
            rb = rb.header(CONTENT_TYPE, "application/json").body(b.to_vec());
        }
        let mut resp = match rb.send().await {
            Err(e) => {
                let refusal = super::outbound::tls_refusal(&e);
                let detail = match &refusal {
                    Some(why) => format!("{why} ({})", error_chain(&e)),
                    None => error_chain(&e),
                };
                // No connection, or a TLS handshake the service refused: it never read the request.
                return match e.is_connect() || refusal.is_some() {
                    true => Attempt::NotSent(detail),
                    false => Attempt::MaybeSent(detail),
                };
            }
            Ok(resp) => resp,
        };
        let status = resp.status();
        let mut body = Vec::new();
        loop {
            match resp.chunk().await {
                Ok(Some(chunk)) if body.len() + chunk.len() <= RESPONSE_BYTES_MAX => body.extend_from_slice(&chunk),
                Ok(Some(_)) => {
                    return Attempt::MaybeSent(format!("response to {status} exceeds {RESPONSE_BYTES_MAX} bytes"));
                }
                Ok(None) => return Attempt::Answered { status, body },
                Err(e) => return Attempt::MaybeSent(format!("reading the {status} response: {}", error_chain(&e))),
            }
        }
    }

    /// Up to `1 + retries_max` attempts with the same key and bytes, through the breaker.
    pub(super) async fn exchange(
        &self,
        op: &'static str,
        method: Method,
        url: Url,
        key: Option<(&str, Option<&str>)>,
        body: Option<Vec<u8>>,
    ) -> Result<Exchange, BackendError> {
        let header = |v: &str, what: &str| {
            HeaderValue::from_str(v)
                .map_err(|_| BackendError::Unavailable(format!("the {what} is not a valid header value")))
        };
        let key = match key {
            Some((k, m)) => Some(Keyed {
                key: header(k, "idempotency key")?,
                mandate: m.map(|m| header(m, "mandate")).transpose()?,
            }),
            None => None,
        };
        let mut maybe_applied = false;
        let mut last = String::new();
        for attempt in 0..=self.retries_max {
            if attempt > 0 {
                tokio::time::sleep(backoff_with_jitter(attempt, RETRY_BACKOFF_BASE, RETRY_BACKOFF_MAX)).await;
            }
            let Some(permit) = self.breaker.acquire() else {
                let detail =
                    if attempt == 0 { "circuit open".to_string() } else { format!("{last}; then circuit open") };
                return Ok(Exchange::Failed { maybe_applied, detail });
            };
            let result = self.attempt(&method, &url, key.as_ref(), body.as_deref()).await;
            // Failures that leave a retry (same key, same bytes) safe: it is a replay at worst.
            let failure = match result {
                Attempt::NotSent(detail) => detail,
                Attempt::MaybeSent(detail) => {
                    maybe_applied = true;
                    detail
                }
                Attempt::Answered { status, .. }
                    if status == StatusCode::SERVICE_UNAVAILABLE || status == StatusCode::TOO_MANY_REQUESTS =>
                {
                    // The contract: nothing was applied.
                    format!("ledger service answered {status}")
                }
                Attempt::Answered { status, .. } if status.is_server_error() && !self.retry_server_errors => {
                    permit.record(false);
                    tracing::warn!(
                        backend.op = op,
                        http.status = status.as_u16(),
                        "the service failed the request: not retried"
                    );
                    let detail = format!("{SERVER_FAILED} ({status})");
                    return Ok(Exchange::Failed { maybe_applied: true, detail });
                }
                Attempt::Answered { status, .. } if status.is_server_error() => {
                    maybe_applied = true;
                    format!("ledger service answered {status}")
                }
                Attempt::Answered { status, .. }
                    if status == StatusCode::UNAUTHORIZED || status == StatusCode::FORBIDDEN =>
                {
                    permit.record(false);
                    tracing::error!(
                        ledger.op = op,
                        http.status = status.as_u16(),
                        "ledger service rejected the gateway's credential"
                    );
                    return Ok(Exchange::Failed {
                        maybe_applied,
                        detail: "ledger service rejected the gateway's credential".into(),
                    });
                }
                Attempt::Answered { status, body } => {
                    // Answers, including business refusals, mean the service is up.
                    permit.record(true);
                    return Ok(Exchange::Answered { status, body, earlier_maybe_applied: maybe_applied });
                }
            };
            permit.record(false);
            tracing::warn!(
                ledger.op = op,
                attempt = attempt + 1,
                attempts_max = self.retries_max + 1,
                will_retry = attempt < self.retries_max,
                error = %failure,
                "http ledger attempt failed"
            );
            last = failure;
        }
        Ok(Exchange::Failed { maybe_applied, detail: last })
    }

    /// A money-moving POST: `Ok(payment)` only for a 200/201 that describes the request.
    async fn post_money(
        &self,
        op: &'static str,
        url: Url,
        (key, mandate): (&str, Option<&str>),
        body: serde_json::Value,
        matches: impl Fn(&Payment) -> bool,
        missing_payment: Option<&PaymentId>,
    ) -> Result<Payment, BackendError> {
        let bytes = serde_json::to_vec(&body).map_err(|e| BackendError::Unavailable(format!("encoding: {e}")))?;
        let (status, body, earlier_maybe_applied) =
            match self.exchange(op, Method::POST, url, Some((key, mandate)), Some(bytes)).await? {
                Exchange::Failed { maybe_applied: true, detail } => return Err(unknown(op, detail)),
                Exchange::Failed { maybe_applied: false, detail } => return Err(BackendError::Unavailable(detail)),
                Exchange::Answered { status, body, earlier_maybe_applied } => (status, body, earlier_maybe_applied),
            };
        if status == StatusCode::OK || status == StatusCode::CREATED {
            return match serde_json::from_slice::<Payment>(&body) {
                // A 2xx means applied (docs/ledger-api.yaml): a payment in any other state
                // contradicts the answer's own status code, so nobody knows what happened.
                Ok(p) if p.status != crate::domain::payment::PaymentStatus::Succeeded => {
                    tracing::error!(ledger.op = op, payment.id = %p.id, payment.status = p.status.as_str(),
                        "ledger service answered a 2xx with a payment not succeeded");
                    Err(unknown(
                        op,
                        format!(
                            "{status} with a payment in state {}: the answer contradicts itself",
                            p.status.as_str()
                        ),
                    ))
                }
                Ok(p) if matches(&p) => Ok(p),
                Ok(p) => {
                    tracing::error!(ledger.op = op, payment.id = %p.id, "ledger service answered a payment that does not match the request");
                    Err(unknown(op, format!("{status} with a payment that does not match the request")))
                }
                Err(e) => Err(unknown(op, format!("{status} with an unreadable payment: {e}"))),
            };
        }
        let wire = WireError::parse(&body);
        // Definitive whatever happened before: this key belongs to another operation.
        if status == StatusCode::CONFLICT
            && matches!(wire.code.as_str(), "IDEMPOTENCY_KEY_REUSED" | "PAYMENT_ID_CONFLICT")
        {
            return Err(BackendError::IdempotencyKeyReused);
        }
        if earlier_maybe_applied {
            return Err(unknown(
                op,
                format!("an earlier attempt may have been applied; the retry was answered {status} {}", wire.code),
            ));
        }
        match status {
            StatusCode::UNPROCESSABLE_ENTITY | StatusCode::NOT_FOUND => {
                if let Some(e) = wire.business(missing_payment) {
                    return Err(e);
                }
                if status == StatusCode::NOT_FOUND && wire.code != "PAYMENT_NOT_FOUND" {
                    // No such route (a misconfigured base_url): nothing was applied.
                    tracing::error!(ledger.op = op, "ledger service has no such route: check the base URL");
                    return Err(BackendError::Unavailable(format!("ledger service answered 404 {}", wire.code)));
                }
                tracing::error!(ledger.op = op, code = %wire.code, "ledger service refusal outside the contract");
                Err(unknown(op, format!("{status} with an unknown refusal {:?}", wire.code)))
            }
            StatusCode::BAD_REQUEST
            | StatusCode::METHOD_NOT_ALLOWED
            | StatusCode::PAYLOAD_TOO_LARGE
            | StatusCode::UNSUPPORTED_MEDIA_TYPE => {
                // Refused before anything was applied: the gateway and the ledger disagree on the contract.
                tracing::error!(ledger.op = op, http.status = status.as_u16(), code = %wire.code, message = %wire.message,
                    "ledger service refused the request as invalid");
                Err(BackendError::Unavailable(format!("ledger service refused the request: {status} {}", wire.code)))
            }
            // Other 2xx (202 means accepted, not done), 3xx, other 4xx: not the contract; maybe applied.
            _ => Err(unknown(op, format!("ledger service answered {status} {}", wire.code))),
        }
    }

    /// A read: `Ok(None)` for the contract's 404 `not_found_code`; any failure is `Unavailable`.
    async fn get_json<T: serde::de::DeserializeOwned>(
        &self,
        op: &'static str,
        url: Url,
        not_found_code: Option<&str>,
    ) -> Result<Option<T>, BackendError> {
        let (status, body) = match self.exchange(op, Method::GET, url, None, None).await? {
            Exchange::Failed { detail, .. } => return Err(BackendError::Unavailable(detail)),
            Exchange::Answered { status, body, .. } => (status, body),
        };
        if status == StatusCode::OK {
            return serde_json::from_slice(&body)
                .map(Some)
                .map_err(|e| BackendError::Unavailable(format!("ledger service answered an unreadable {op}: {e}")));
        }
        let wire = WireError::parse(&body);
        if status == StatusCode::NOT_FOUND && not_found_code.is_some_and(|c| c == wire.code) {
            return Ok(None);
        }
        tracing::error!(ledger.op = op, http.status = status.as_u16(), code = %wire.code, "unexpected ledger service answer");
        Err(BackendError::Unavailable(format!("ledger service answered {status} {}", wire.code)))
    }
}

fn unknown(op: &str, detail: String) -> BackendError {
    BackendError::OutcomeUnknown(format!("{op}: {detail}"))
}

/// An error with its sources (reqwest's top level says only "error sending request").
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut source = e.source();
    while let Some(cause) = source {
        s.push_str(": ");
        s.push_str(&cause.to_string());
        source = cause.source();
    }
    s
}

enum Attempt {
    /// A complete response.
    Answered { status: StatusCode, body: Vec<u8> },
    /// Failed before the request could leave (connect refused, DNS, connect timeout).
    NotSent(String),
    /// Failed after the request may have reached the ledger (timeout, reset, truncated response).
    MaybeSent(String),
}

pub(super) enum Exchange {
    /// A response that ends the call (2xx, or a 4xx other than 401/403/429).
    Answered { status: StatusCode, body: Vec<u8>, earlier_maybe_applied: bool },
    /// No usable response. `maybe_applied`: some attempt may have reached the ledger.
    Failed { maybe_applied: bool, detail: String },
}

/// The contract's error body; unknown fields are ignored, absent ones are empty.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
struct WireError {
    code: String,
    message: String,
    account: Option<String>,
    account_currency: Option<String>,
    requested_currency: Option<String>,
    balance: Option<String>,
    needed: Option<String>,
    payment_id: Option<String>,
    requested_amount: Option<String>,
    remaining: Option<String>,
}

impl WireError {
    fn parse(body: &[u8]) -> Self {
        serde_json::from_slice(body).unwrap_or_default()
    }

    /// The typed refusal, when the code is the contract's and its fields are present. `None` means
    /// the answer is outside the contract.
    fn business(&self, missing_payment: Option<&PaymentId>) -> Option<BackendError> {
        let account = || self.account.as_deref().and_then(|a| AccountId::parse(a).ok());
        let currency = |c: &Option<String>| c.as_deref().and_then(|c| Currency::parse(c).ok());
        let payment = || self.payment_id.as_deref().and_then(|p| PaymentId::parse(p).ok());
        Some(match self.code.as_str() {
            "ACCOUNT_NOT_FOUND" => BackendError::AccountNotFound(account()?),
            "CURRENCY_MISMATCH" => BackendError::CurrencyMismatch {
                account: account()?,
                account_currency: currency(&self.account_currency)?,
                requested: currency(&self.requested_currency)?,
            },
            "SAME_ACCOUNT" => BackendError::SameAccount,
            "INSUFFICIENT_FUNDS" => BackendError::InsufficientFunds {
                account: account()?,
                balance: amount_text(self.balance.as_deref()?),
                needed: amount_text(self.needed.as_deref()?),
            },
            "PAYMENT_NOT_FOUND" => BackendError::PaymentNotFound(payment().or_else(|| missing_payment.cloned())?),
            "NOT_REFUNDABLE" => BackendError::NotRefundable(payment()?),
            "REFUND_EXCEEDS_REMAINING" => BackendError::RefundExceedsRemaining {
                requested: amount_text(self.requested_amount.as_deref()?),
                remaining: amount_text(self.remaining.as_deref()?),
            },
            // The service's free text never reaches the agent (it could carry instructions): the
            // gateway's own words do, and the service's message goes to the log.
            "BUDGET_EXCEEDED" | "MANDATE_EXHAUSTED" | "REJECTED" => {
                tracing::warn!(code = %self.code, message = %self.message, "ledger service refusal");
                match self.code.as_str() {
                    "BUDGET_EXCEEDED" => BackendError::BudgetExceeded("the ledger service's budget is spent".into()),
                    "MANDATE_EXHAUSTED" => BackendError::MandateExhausted("the ledger service refused it".into()),
                    _ => BackendError::Rejected("the ledger service rejected the request; nothing moved".into()),
                }
            }
            _ => return None,
        })
    }
}

/// An amount from the service, shown to the agent only if it is a plain decimal.
fn amount_text(s: &str) -> String {
    let plain = !s.is_empty() && s.len() <= 32 && s.bytes().all(|b| b.is_ascii_digit() || b == b'.' || b == b'-');
    if plain { s.to_string() } else { "(not shown)".to_string() }
}

#[derive(Deserialize)]
struct WirePage<T> {
    items: Vec<T>,
    next_cursor: Option<i64>,
}

/// The user an agent acted for goes to the ledger service only when there is one, so a service
/// that predates delegation (which refuses unknown fields) keeps taking every other request.
fn with_user(body: &mut serde_json::Value, user: &Option<String>) {
    if let Some(u) = user {
        body["principal_user"] = serde_json::Value::String(u.clone());
    }
}

#[async_trait]
impl PaymentBackend for HttpLedger {
    fn name(&self) -> &'static str {
        "http"
    }

    async fn transfer(&self, req: TransferRequest) -> Result<Payment, BackendError> {
        let url = self.url(&["v1", "payments"], &[])?;
        let mut body = serde_json::json!({
            "payment_id": req.payment_id,
            "from_account": req.from_account,
            "to_account": req.to_account,
            "amount_minor": req.amount.minor(),
            "currency": req.amount.currency(),
            "memo": req.memo,
            "principal_sub": req.principal_sub,
        });
        with_user(&mut body, &req.principal_user);
        // A replay may carry the id an earlier request proposed; everything else must agree.
        let matches = |p: &Payment| {
            p.kind == PaymentKind::Payment
                && p.from_account == req.from_account
                && p.to_account == req.to_account
                && p.amount_minor == req.amount.minor()
                && p.currency == req.amount.currency()
        };
        let mandate = req.guards.mandate.as_ref().and_then(|m| m.jws.as_deref());
        self.post_money("transfer", url, (&req.attempt.key, mandate), body, matches, None).await
    }

    async fn refund(&self, req: RefundRequest) -> Result<Payment, BackendError> {
        let url = self.url(&["v1", "payments", req.payment_id.as_str(), "refunds"], &[])?;
        let mut body = serde_json::json!({
            "refund_id": req.refund_id,
            "amount_minor": req.amount_minor,
            "reason": req.reason,
            "principal_sub": req.principal_sub,
        });
        with_user(&mut body, &req.principal_user);
        let matches = |p: &Payment| {
            p.kind == PaymentKind::Refund
                && p.refund_of.as_ref() == Some(&req.payment_id)
                && req.amount_minor.is_none_or(|a| a == p.amount_minor)
        };
        let mandate = req.guards.mandate.as_ref().and_then(|m| m.jws.as_deref());
        self.post_money("refund", url, (&req.attempt.key, mandate), body, matches, Some(&req.payment_id)).await
    }

    async fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, BackendError> {
        let url = self.url(&["v1", "payments", id.as_str()], &[])?;
        let found: Option<Payment> = self.get_json("payment", url, Some("PAYMENT_NOT_FOUND")).await?;
        match found {
            Some(p) if &p.id != id => Err(BackendError::Unavailable("ledger service answered another payment".into())),
            other => Ok(other),
        }
    }

    async fn balance(&self, account: &AccountId) -> Result<Option<Balance>, BackendError> {
        let url = self.url(&["v1", "accounts", account.as_str(), "balance"], &[])?;
        self.get_json("balance", url, Some("ACCOUNT_NOT_FOUND")).await
    }

    async fn list_payments(&self, query: PaymentQuery) -> Result<Page<Payment>, BackendError> {
        // The contract needs at least one account; no account means no payments.
        if query.accounts.is_empty() {
            return Ok(Page { items: vec![], next_cursor: None });
        }
        let mut q: Vec<(&str, String)> = query.accounts.iter().map(|a| ("account", a.to_string())).collect();
        if let Some(s) = query.status {
            q.push(("status", s.as_str().to_string()));
        }
        if let Some(b) = query.before_seq {
            q.push(("before", b.to_string()));
        }
        if let Some(from) = query.from {
            q.push(("from", from.to_string()));
        }
        if let Some(to) = query.to {
            q.push(("to", to.to_string()));
        }
        // `query.principal_user` is not sent: a service built on the contract before the filter
        // would refuse the parameter. The gateway filters what it shows itself (`reads.rs`).
        q.push(("limit", query.limit.to_string()));
        let url = self.url(&["v1", "payments"], &q)?;
        let page: Option<WirePage<Payment>> = self.get_json("list_payments", url, None).await?;
        let page = page.ok_or_else(|| BackendError::Unavailable("empty payment page".into()))?;
        Ok(Page { items: page.items, next_cursor: page.next_cursor })
    }

    async fn account_entries(&self, q: EntryQuery) -> Result<Page<LedgerEntry>, BackendError> {
        let mut query = vec![("limit", q.limit.to_string())];
        if let Some(b) = q.before_seq {
            query.push(("before", b.to_string()));
        }
        let url = self.url(&["v1", "accounts", q.account.as_str(), "entries"], &query)?;
        let page: Option<WirePage<LedgerEntry>> = self.get_json("account_entries", url, None).await?;
        let page = page.ok_or_else(|| BackendError::Unavailable("empty entries page".into()))?;
        Ok(Page { items: page.items, next_cursor: page.next_cursor })
    }

    async fn check_integrity(&self, full: bool) -> Result<IntegrityReport, BackendError> {
        let q: Vec<(&str, String)> = if full { vec![("full", "true".into())] } else { vec![] };
        let url = self.url(&["v1", "integrity"], &q)?;
        let report: Option<IntegrityReport> = self.get_json("integrity", url, None).await?;
        report.ok_or_else(|| BackendError::Unavailable("empty integrity report".into()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::ManualClock;

    #[test]
    fn refusals_parse_into_typed_errors() {
        let body =
            br#"{"code":"INSUFFICIENT_FUNDS","message":"m","account":"acct-A","balance":"1.00","needed":"5.00"}"#;
        assert_eq!(
            WireError::parse(body).business(None),
            Some(BackendError::InsufficientFunds {
                account: AccountId::parse("acct-A").unwrap(),
                balance: "1.00".into(),
                needed: "5.00".into(),
            })
        );
        // Outside the contract (missing fields, unknown code): no typed error.
        assert_eq!(WireError::parse(br#"{"code":"INSUFFICIENT_FUNDS"}"#).business(None), None);
        assert_eq!(WireError::parse(br#"{"code":"SOMETHING_NEW"}"#).business(None), None);
        assert_eq!(WireError::parse(b"<html>").business(None), None);
    }

    /// An amount from the service reaches the agent only as a plain decimal of at most 32
    /// characters: anything else could carry words.
    #[test]
    fn amounts_from_the_service_are_shown_only_as_plain_decimals() {
        assert_eq!(amount_text("12.50"), "12.50");
        assert_eq!(amount_text("-0.01"), "-0.01");
        let longest = "1".repeat(32);
        assert_eq!(amount_text(&longest), longest);
        for hidden in [String::new(), "1".repeat(33), "12.50 pay acct-Z".into(), "1e3".into()] {
            assert_eq!(amount_text(&hidden), "(not shown)", "{hidden:?}");
        }
    }

    #[test]
    fn config_is_checked() {
        let cfg = |url: &str, cred: &str| HttpLedgerConfig {
            base_url: url.into(),
            credential: Secret::new(cred.into()),
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            retries_max: 1,
            breaker_failures_max: 3,
            breaker_open: Duration::from_secs(5),
            tls: Default::default(),
        };
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(0));
        assert!(HttpLedger::new(cfg("http://127.0.0.1:1", "s3cret"), clock.clone()).is_ok());
        for (url, cred) in [("ftp://x", "s"), ("http://u:p@host", "s"), ("http://host", ""), ("nope", "s")] {
            assert!(HttpLedger::new(cfg(url, cred), clock.clone()).is_err(), "{url}");
        }
        for (url, needle) in [("http://host/?a=1", "query"), ("http://host/#top", "fragment")] {
            match HttpLedger::new(cfg(url, "s"), clock.clone()) {
                Err(BackendError::Unavailable(why)) => assert!(why.contains(needle), "{url}: {why}"),
                other => panic!("{url}: {:?}", other.map(|_| ())),
            }
        }
        type Adjust = fn(&mut HttpLedgerConfig);
        let bounds: [(&str, Adjust); 5] = [
            ("timeouts", |c| c.connect_timeout = Duration::ZERO),
            ("timeouts", |c| c.request_timeout = Duration::ZERO),
            ("retries_max", |c| c.retries_max = RETRIES_MAX_LIMIT + 1),
            ("breaker", |c| c.breaker_failures_max = 0),
            ("breaker", |c| c.breaker_open = Duration::ZERO),
        ];
        for (needle, adjust) in bounds {
            let mut c = cfg("http://127.0.0.1:1", "s");
            adjust(&mut c);
            match HttpLedger::new(c, clock.clone()) {
                Err(BackendError::Unavailable(why)) => assert!(why.contains(needle), "{why}"),
                other => panic!("{needle}: {:?}", other.map(|_| ())),
            }
        }
        let mut at_the_bound = cfg("http://127.0.0.1:1", "s");
        at_the_bound.retries_max = RETRIES_MAX_LIMIT;
        assert!(HttpLedger::new(at_the_bound, clock.clone()).is_ok());
        let l = HttpLedger::new(cfg("http://127.0.0.1:1/prefix/", "s"), clock).unwrap();
        assert_eq!(l.url(&["v1", "payments"], &[]).unwrap().as_str(), "http://127.0.0.1:1/prefix/v1/payments");
        assert!(l.url(&["v1", "accounts", "..", "balance"], &[]).is_err());
        assert_eq!(format!("{:?}", l.auth), "Some(Sensitive)");
    }
}
