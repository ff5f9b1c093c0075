//! Airtel Money Open API (Kenya, KES): collections, their refunds, disbursements (payouts) — the wire
//! types and an HTTP client for them.
//!
//! Architecture Invariant: Airtel's JSON shapes live only in this file. Callers see [`Msisdn`],
//! [`Collection`], [`Enquiry`], [`TransactionStatus`], [`CallbackBody`] and [`AirtelError`], whose
//! failure kinds say what the caller may conclude about money: `Refused` (Airtel answered and did not
//! start anything), `Unavailable` (certainly not processed; safe to try again) and `OutcomeUnknown`
//! (it may have been processed: keep the record, never send it again, ask by its transaction id).
//!
//! Airtel lets the merchant choose the transaction id: the gateway sends its own payment id, so a
//! collection or a disbursement whose answer was lost can still be asked about
//! (`GET /standard/v1/payments/{id}`, `GET /standard/v1/disbursements/{id}`). A refund is keyed by
//! the collection's Airtel reference and answers at once; it has no id of its own to ask by.
//! A disbursement carries the wallet's PIN encrypted with Airtel's RSA public key (PKCS#1 v1.5,
//! base64), fresh for each request ([`PayoutCredentials`]).
//! This client retries a request only when it certainly was not processed and failed quickly (no
//! connection, HTTP 429 or 503) and once after a refused token (401); a timeout after sending a
//! collection is never retried. A circuit breaker fails fast while Airtel keeps failing.

use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backend::breaker::Breaker;
use crate::backend::outbound::{
    self, Answer, CachedToken, Counted, RESPONSE_BYTES_MAX, Retries, TokenCache, clean_text, code_text,
    describe_send_error, http_client, json_int, read_body, send_failure, send_with_retries, with_token,
};
pub use crate::backend::outbound::{RETRIES_MAX_LIMIT, RETRY_BACKOFF_MAX};
use crate::clock::Clock;
use crate::secret::Secret;

/// Airtel's UAT (sandbox) and production hosts.
pub const STAGING_BASE_URL: &str = "https://openapiuat.airtel.africa";
pub const PRODUCTION_BASE_URL: &str = "https://openapi.airtel.africa";
/// The only country and currency this rail speaks.
pub const COUNTRY: &str = "KE";
pub const CURRENCY: &str = crate::backend::kenya::CURRENCY;
/// The gateway's cap on the `reference` the payer sees (Airtel shows it on the prompt and statement).
pub const REFERENCE_CHARS_MAX: usize = 25;
/// The longest transaction id this client sends or accepts back (the gateway's payment ids are shorter).
pub const TRANSACTION_ID_CHARS_MAX: usize = 64;

const PATH_TOKEN: &str = "/auth/oauth2/token";
const PATH_COLLECT: &str = "/merchant/v1/payments/";
const PATH_ENQUIRY: &str = "/standard/v1/payments/";
const PATH_REFUND: &str = "/standard/v1/payments/refund";
const PATH_DISBURSE: &str = "/standard/v1/disbursements/";
const PATH_DISBURSEMENT_ENQUIRY: &str = "/standard/v1/disbursements/";

/// Digits in an Airtel Money wallet PIN.
pub const PIN_DIGITS: usize = 4;
/// Sizes of Airtel's RSA public key this client accepts, in bits.
pub const PUBLIC_KEY_BITS: std::ops::RangeInclusive<usize> = 1024..=4096;

/// What disbursements need besides the API credentials: the disbursing wallet's PIN, sent encrypted
/// with Airtel's RSA public key (PKCS#1 v1.5, base64). Each request encrypts it afresh. Debug shows
/// neither.
#[derive(Clone)]
pub struct PayoutCredentials {
    pin: Secret,
    key: rsa::PublicKey,
}

impl std::fmt::Debug for PayoutCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("PayoutCredentials(***)")
    }
}

impl PayoutCredentials {
    /// `pin`: [`PIN_DIGITS`] digits. `public_key`: Airtel's key as its portal gives it (base64 of
    /// the DER SubjectPublicKeyInfo, spaces and line breaks ignored) or as a PEM `PUBLIC KEY`.
    pub fn new(pin: &Secret, public_key: &str) -> Result<Self, String> {
        check_pin(pin)?;
        Ok(PayoutCredentials { pin: pin.clone(), key: parse_public_key(public_key)? })
    }

    /// With a key already parsed (the simulator's own).
    pub fn with_key(pin: &Secret, key: rsa::PublicKey) -> Result<Self, String> {
        check_pin(pin)?;
        Ok(PayoutCredentials { pin: pin.clone(), key })
    }

    /// The PIN as a disbursement carries it.
    fn encrypted_pin(&self) -> Result<String, String> {
        use base64::Engine as _;
        let mut rng = getrandom::SysRng;
        let sealed = self
            .key
            .encrypt(&mut rng, rsa::Pkcs1v15Encrypt, self.pin.expose().as_bytes())
            .map_err(|e| format!("encrypting the disbursement PIN failed: {e}"))?;
        Ok(base64::engine::general_purpose::STANDARD.encode(sealed))
    }
}

/// A wallet PIN: [`PIN_DIGITS`] digits.
pub fn check_pin(pin: &Secret) -> Result<(), String> {
    let p = pin.expose();
    if p.len() != PIN_DIGITS || !p.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("the disbursement PIN must be {PIN_DIGITS} digits"));
    }
    Ok(())
}

/// Airtel's RSA public key: a PEM `PUBLIC KEY`, or the base64 of its DER form.
pub fn parse_public_key(text: &str) -> Result<rsa::PublicKey, String> {
    use base64::Engine as _;
    use rsa::pkcs8::DecodePublicKey as _;
    use rsa::traits::PublicKeyParts as _;
    let text = text.trim();
    let key = if text.starts_with("-----BEGIN") {
        rsa::PublicKey::from_public_key_pem(text).map_err(|e| format!("not an RSA public key in PEM: {e}"))?
    } else {
        let b64: String = text.chars().filter(|c| !c.is_whitespace()).collect();
        let der = base64::engine::general_purpose::STANDARD
            .decode(b64)
            .map_err(|_| "not a PEM public key nor base64".to_string())?;
        rsa::PublicKey::from_public_key_der(&der).map_err(|e| format!("not an RSA public key: {e}"))?
    };
    let bits = key.size() * 8;
    if !PUBLIC_KEY_BITS.contains(&bits) {
        return Err(format!(
            "an RSA key of {bits} bits; expected {} to {}",
            PUBLIC_KEY_BITS.start(),
            PUBLIC_KEY_BITS.end()
        ));
    }
    Ok(key)
}

#[derive(Clone)]
pub struct AirtelConfig {
    /// [`STAGING_BASE_URL`], [`PRODUCTION_BASE_URL`], the gateway's own simulator, or a local fake
    /// in tests.
    pub base_url: String,
    pub client_id: Secret,
    pub client_secret: Secret,
    pub connect_timeout: Duration,
    /// Whole request, connect to last byte. After sending, a collection timing out is `OutcomeUnknown`.
    pub request_timeout: Duration,
    /// Refresh the OAuth token this long before Airtel says it expires.
    pub token_refresh_margin_secs: i64,
    /// Retries of a request that certainly was not processed and failed quickly (0 ..= 5).
    pub retries_max: u32,
    /// Consecutive failed requests that open the circuit, and how long it stays open.
    pub breaker_failures_max: u32,
    pub breaker_open: Duration,
    /// Set: disbursements (payouts) are offered.
    pub payouts: Option<PayoutCredentials>,
}

/// Debug shows neither credential.
impl std::fmt::Debug for AirtelConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AirtelConfig").field("base_url", &self.base_url).finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum AirtelError {
    /// Airtel answered and refused (`status.success: false`, or a 4xx), or the request was invalid
    /// before sending. Nothing was started.
    #[error("airtel refused the request: {code}: {message}")]
    Refused { code: String, message: String },
    /// Definitely not processed: no connection, 429/503, OAuth failure, circuit open. Safe to retry.
    #[error("airtel unavailable: {0}")]
    Unavailable(String),
    /// The request may have been processed: a timeout after sending, a connection lost mid-answer,
    /// a 5xx or an unparseable answer to a collection. Never success nor failure: ask by its id.
    #[error("airtel outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The configuration cannot work (returned only by [`AirtelClient::new`]).
    #[error("invalid airtel config: {0}")]
    Config(String),
}

// ---------------------------------------------------------------------------------------------
// Parse-don't-validate inputs

pub use crate::backend::kenya::Msisdn;

/// The first two digits of the subscriber part of Airtel Kenya's mobile ranges (073X, 075X, 078X, 010X).
const AIRTEL_KE_PREFIXES: [&str; 4] = ["73", "75", "78", "10"];

/// Accepts `07XXXXXXXX`, `01XXXXXXXX`, `7XXXXXXXX`, `1XXXXXXXX`, `254…`, `+254…` in Airtel Kenya's
/// ranges; spaces and dashes are ignored.
pub fn normalize_phone(input: &str) -> Result<Msisdn, String> {
    const EXPECTED: &str = "expected a Kenyan Airtel number such as 0733123456, 733123456 or 254733123456";
    let subscriber = crate::backend::kenya::subscriber(input, EXPECTED)?;
    if !AIRTEL_KE_PREFIXES.iter().any(|p| subscriber.starts_with(p)) {
        return Err(format!("not an Airtel Money Kenya number (must start 073, 075, 078 or 010): {EXPECTED}"));
    }
    Ok(Msisdn::from_subscriber(&subscriber))
}

/// One collection: prompt `msisdn` to pay `amount_whole` shillings, under the gateway's id.
#[derive(Debug, Clone)]
pub struct Collection {
    /// The gateway's payment id: Airtel's `transaction.id`, what callbacks and enquiries name.
    pub id: String,
    pub msisdn: Msisdn,
    /// Whole Kenyan shillings, at least 1.
    pub amount_whole: i64,
    /// Shown to the payer; control characters removed, cut to [`REFERENCE_CHARS_MAX`].
    pub reference: String,
}

/// One disbursement: pay `amount_whole` shillings to `msisdn`'s wallet, under the gateway's id.
#[derive(Debug, Clone)]
pub struct Disbursement {
    /// The gateway's payment id: Airtel's `transaction.id`, what enquiries name.
    pub id: String,
    pub msisdn: Msisdn,
    /// Whole Kenyan shillings, at least 1.
    pub amount_whole: i64,
    /// Shown to the payee; control characters removed, cut to [`REFERENCE_CHARS_MAX`].
    pub reference: String,
}

/// An Airtel transaction status code (enquiry `status`, callback `status_code`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TransactionStatus {
    /// `TS`: paid.
    Success,
    /// `TF`: failed (declined, cancelled, insufficient funds).
    Failed,
    /// `TE`: expired before the payer answered.
    Expired,
    /// `TIP`: in progress (the prompt is open).
    InProgress,
    /// `TA`: ambiguous at Airtel: still being resolved.
    Ambiguous,
    /// Anything else, as sent (cleaned, bounded): never guessed.
    Other(String),
}

impl TransactionStatus {
    fn parse(code: &str) -> Self {
        match code.trim() {
            "TS" => TransactionStatus::Success,
            "TF" => TransactionStatus::Failed,
            "TE" => TransactionStatus::Expired,
            "TIP" => TransactionStatus::InProgress,
            "TA" => TransactionStatus::Ambiguous,
            other => TransactionStatus::Other(
                other.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '_').take(20).collect(),
            ),
        }
    }
}

/// Airtel's answer to an enquiry about one transaction.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Enquiry {
    pub status: TransactionStatus,
    /// Airtel's own reference ("MP…"): the receipt of a success.
    pub airtel_money_id: Option<String>,
    pub message: String,
}

/// What Airtel posts to the callback URL configured in its portal (unsigned: confirm by enquiry).
/// It names neither the amount nor the payer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CallbackBody {
    pub id: String,
    pub status: TransactionStatus,
    pub airtel_money_id: Option<String>,
    pub message: String,
}

/// Parses `{"transaction":{"id","message","status_code","airtel_money_id"}}`. Strict on `id` and
/// `status_code`; the rest is optional.
pub fn parse_callback(body: &[u8]) -> Result<CallbackBody, String> {
    let root: Value = serde_json::from_slice(body).map_err(|e| format!("callback is not valid JSON: {e}"))?;
    let tx = root.get("transaction").and_then(Value::as_object).ok_or("callback has no transaction object")?;
    let text = |name: &str| -> Result<Option<String>, String> {
        match tx.get(name) {
            None | Some(Value::Null) => Ok(None),
            Some(Value::String(s)) if s.trim().is_empty() => Ok(None),
            Some(Value::String(s)) => Ok(Some(s.trim().to_string())),
            Some(_) => Err(format!("callback field transaction.{name} must be a string")),
        }
    };
    let id = text("id")?.ok_or("callback field transaction.id is missing")?;
    if id.chars().count() > TRANSACTION_ID_CHARS_MAX || id.chars().any(char::is_control) {
        return Err("callback field transaction.id is too long or holds control characters".into());
    }
    let status = text("status_code")?.ok_or("callback field transaction.status_code is missing")?;
    let airtel_money_id = text("airtel_money_id")?.filter(|r| is_reference(r));
    Ok(CallbackBody {
        id,
        status: TransactionStatus::parse(&status),
        airtel_money_id,
        message: clean_text(&text("message")?.unwrap_or_default(), 120),
    })
}

/// An Airtel reference ("MP210603.1234.L06941"): short; letters, digits, '.', '-' and '_' only
/// (anything else is not kept as a receipt).
fn is_reference(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= TRANSACTION_ID_CHARS_MAX
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'-' | b'_'))
}

// ---------------------------------------------------------------------------------------------
// Wire types (requests and responses)

#[derive(Serialize)]
struct TokenRequest<'a> {
    client_id: &'a str,
    client_secret: &'a str,
    grant_type: &'a str,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    /// Airtel sends a number (or, in some environments, a string).
    expires_in: Value,
}

#[derive(Serialize)]
struct CollectRequest<'a> {
    reference: &'a str,
    subscriber: Subscriber<'a>,
    transaction: TransactionOut<'a>,
}

#[derive(Serialize)]
struct DisburseRequest<'a> {
    payee: Payee<'a>,
    reference: &'a str,
    pin: &'a str,
    transaction: DisburseTransaction<'a>,
}

#[derive(Serialize)]
struct Payee<'a> {
    msisdn: &'a str,
    wallet_type: &'a str,
}

#[derive(Serialize)]
struct DisburseTransaction<'a> {
    amount: i64,
    id: &'a str,
    #[serde(rename = "type")]
    kind: &'a str,
}

#[derive(Serialize)]
struct RefundRequest<'a> {
    transaction: RefundTransaction<'a>,
}

#[derive(Serialize)]
struct RefundTransaction<'a> {
    airtel_money_id: &'a str,
}

#[derive(Serialize)]
struct Subscriber<'a> {
    country: &'a str,
    currency: &'a str,
    msisdn: &'a str,
}

#[derive(Serialize)]
struct TransactionOut<'a> {
    amount: i64,
    country: &'a str,
    currency: &'a str,
    id: &'a str,
}

/// `status` of every answer.
#[derive(Deserialize, Default)]
struct StatusBlock {
    #[serde(default)]
    code: Option<Value>,
    #[serde(default)]
    message: Option<String>,
    #[serde(default)]
    result_code: Option<String>,
    #[serde(default)]
    success: Option<bool>,
}

#[derive(Deserialize, Default)]
struct Envelope {
    #[serde(default)]
    data: Option<Data>,
    #[serde(default)]
    status: Option<StatusBlock>,
}

#[derive(Deserialize, Default)]
struct Data {
    #[serde(default)]
    transaction: Option<TransactionIn>,
}

#[derive(Deserialize, Default)]
struct TransactionIn {
    #[serde(default)]
    id: Option<String>,
    #[serde(default)]
    status: Option<String>,
    #[serde(default)]
    airtel_money_id: Option<String>,
    #[serde(default)]
    message: Option<String>,
}

impl StatusBlock {
    /// Airtel's own code for a refusal (`result_code`, else `code`, else the HTTP status).
    fn code(&self, http: reqwest::StatusCode) -> String {
        let code = self.result_code.clone().or_else(|| self.code.as_ref().map(code_text));
        clean_text(&code.unwrap_or_else(|| format!("http_{}", http.as_u16())), 40)
    }
    fn message(&self) -> String {
        clean_text(self.message.as_deref().unwrap_or("no message"), 120)
    }
}

// ---------------------------------------------------------------------------------------------
// Client

/// An Airtel client: one reqwest client (timeouts set once) and a cached OAuth token. Cheap to clone.
#[derive(Clone)]
pub struct AirtelClient {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: AirtelConfig,
    base: String,
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
    token: TokenCache,
    /// One breaker per endpoint (`Op::ALL` order): enquiries failing never stop collections or
    /// disbursements, nor the other way round.
    breakers: Vec<Breaker>,
}

impl std::fmt::Debug for AirtelClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AirtelClient").field("base_url", &self.inner.base).finish_non_exhaustive()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Collect,
    Disburse,
    Refund,
    Enquiry,
}

impl Op {
    /// Every endpoint, in declaration order (`op as usize` indexes the breakers).
    const ALL: [Op; 4] = [Op::Collect, Op::Disburse, Op::Refund, Op::Enquiry];

    /// The endpoint's breaker, as named in logs.
    fn breaker_name(self) -> &'static str {
        match self {
            Op::Collect => "airtel collection",
            Op::Disburse => "airtel disbursement",
            Op::Refund => "airtel refund",
            Op::Enquiry => "airtel enquiry",
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Op::Collect => "collection",
            Op::Disburse => "disbursement",
            Op::Refund => "refund",
            Op::Enquiry => "enquiry",
        }
    }
    /// The error for a failure after the request may have reached Airtel: a collection, a
    /// disbursement or a refund may have started (unknown); an enquiry moves nothing (ask again).
    fn after_sending(self, why: String) -> AirtelError {
        match self {
            Op::Collect | Op::Disburse | Op::Refund => AirtelError::OutcomeUnknown(why),
            Op::Enquiry => AirtelError::Unavailable(why),
        }
    }
}

type Failure = outbound::Failure<AirtelError>;

impl AirtelClient {
    /// Each endpoint's circuit breaker: (endpoint, state).
    pub fn circuits(&self) -> Vec<(&'static str, &'static str)> {
        Op::ALL.iter().map(|op| (op.as_str(), self.inner.breakers[*op as usize].state())).collect()
    }

    pub fn new(cfg: AirtelConfig, clock: Arc<dyn Clock>) -> Result<Self, AirtelError> {
        let base = outbound::base_url(&cfg.base_url).map_err(AirtelError::Config)?;
        if cfg.client_id.expose().is_empty() || cfg.client_secret.expose().is_empty() {
            return Err(AirtelError::Config("client_id and client_secret must be set".into()));
        }
        let (timeouts, breaker) =
            ((cfg.connect_timeout, cfg.request_timeout), (cfg.breaker_failures_max, cfg.breaker_open));
        outbound::check_bounds(timeouts, cfg.token_refresh_margin_secs, cfg.retries_max, breaker)
            .map_err(AirtelError::Config)?;
        let http = http_client(cfg.connect_timeout, cfg.request_timeout).map_err(AirtelError::Config)?;
        let breakers = Op::ALL
            .iter()
            .map(|op| Breaker::new(op.breaker_name(), cfg.breaker_failures_max, cfg.breaker_open, clock.clone()))
            .collect();
        Ok(AirtelClient { inner: Arc::new(Inner { cfg, base, http, clock, token: TokenCache::default(), breakers }) })
    }

    /// Sends the collection (the payer's prompt). `Ok` means only *accepted*: the outcome arrives
    /// by callback or enquiry. Sent at most once per call: a timeout is `OutcomeUnknown`.
    pub async fn collect(&self, c: &Collection) -> Result<(), AirtelError> {
        if c.amount_whole < 1 {
            return Err(invalid("transaction.amount", "must be a whole number of shillings, at least 1"));
        }
        if !is_transaction_id(&c.id) {
            return Err(invalid("transaction.id", "is empty, too long or holds control characters"));
        }
        let reference = clean_text(&c.reference, REFERENCE_CHARS_MAX);
        if reference.is_empty() {
            return Err(invalid("reference", "is empty"));
        }
        let body = CollectRequest {
            reference: &reference,
            subscriber: Subscriber { country: COUNTRY, currency: CURRENCY, msisdn: c.msisdn.subscriber() },
            transaction: TransactionOut { amount: c.amount_whole, country: COUNTRY, currency: CURRENCY, id: &c.id },
        };
        let body = serde_json::to_vec(&body).map_err(|e| invalid("body", &e.to_string()))?;
        let answer = self.call(Op::Collect, reqwest::Method::POST, PATH_COLLECT, Some(body)).await?;
        let envelope: Envelope = serde_json::from_slice(&answer.body).unwrap_or_default();
        let status = envelope.status.unwrap_or_default();
        if answer.status.is_success() {
            return match status.success {
                Some(true) => {
                    tracing::debug!(airtel.transaction_id = %c.id, "airtel accepted the collection");
                    Ok(())
                }
                Some(false) => {
                    Err(AirtelError::Refused { code: status.code(answer.status), message: status.message() })
                }
                None => Err(AirtelError::OutcomeUnknown(format!(
                    "collection: unparseable success body (HTTP {})",
                    answer.status
                ))),
            };
        }
        Err(error_answer(Op::Collect, &answer, &status))
    }

    /// Whether disbursements are configured ([`AirtelConfig::payouts`]).
    pub fn pays_out(&self) -> bool {
        self.inner.cfg.payouts.is_some()
    }

    /// Sends the disbursement. `Ok` means only *accepted*: the enquiry says how it ended. Sent at
    /// most once per call: a timeout, a 5xx, or an answer that is neither an acceptance nor a failure
    /// Airtel reports for this transaction (`TF`) is `OutcomeUnknown` — money may have moved; ask
    /// by its id, never send it again.
    pub async fn disburse(&self, d: &Disbursement) -> Result<(), AirtelError> {
        let Some(credentials) = &self.inner.cfg.payouts else {
            return Err(AirtelError::Config("disbursements need airtel.disbursement_pin and airtel.public_key".into()));
        };
        if d.amount_whole < 1 {
            return Err(invalid("transaction.amount", "must be a whole number of shillings, at least 1"));
        }
        if !is_transaction_id(&d.id) {
            return Err(invalid("transaction.id", "is empty, too long or holds control characters"));
        }
        let reference = clean_text(&d.reference, REFERENCE_CHARS_MAX);
        if reference.is_empty() {
            return Err(invalid("reference", "is empty"));
        }
        let pin = credentials.encrypted_pin().map_err(AirtelError::Config)?;
        let body = DisburseRequest {
            payee: Payee { msisdn: d.msisdn.subscriber(), wallet_type: "NORMAL" },
            reference: &reference,
            pin: &pin,
            transaction: DisburseTransaction { amount: d.amount_whole, id: &d.id, kind: "B2C" },
        };
        let body = serde_json::to_vec(&body).map_err(|e| invalid("body", &e.to_string()))?;
        let answer = self.call(Op::Disburse, reqwest::Method::POST, PATH_DISBURSE, Some(body)).await?;
        let envelope: Envelope = serde_json::from_slice(&answer.body).unwrap_or_default();
        let status = envelope.status.unwrap_or_default();
        if !answer.status.is_success() {
            return Err(error_answer(Op::Disburse, &answer, &status));
        }
        let reported =
            envelope.data.and_then(|d| d.transaction).and_then(|t| t.status).map(|s| TransactionStatus::parse(&s));
        match (status.success, reported) {
            (Some(true), _) => {
                tracing::debug!(airtel.transaction_id = %d.id, "airtel accepted the disbursement");
                Ok(())
            }
            // Airtel reports this transaction failed: final, nothing moved.
            (Some(false), Some(TransactionStatus::Failed)) => {
                Err(AirtelError::Refused { code: status.code(answer.status), message: status.message() })
            }
            (_, reported) => Err(AirtelError::OutcomeUnknown(format!(
                "disbursement: HTTP {} {} (transaction status {:?}) is neither an acceptance nor a failure",
                answer.status,
                status.code(answer.status),
                reported
            ))),
        }
    }

    /// Refunds a collection in full, by the reference Airtel gave it. Airtel answers at once:
    /// `Ok` is the refund done, with Airtel's reference when it names one. A refund Airtel did not
    /// report done (a timeout, a 5xx, an answer not saying `SUCCESS`) is `OutcomeUnknown`.
    pub async fn refund(&self, airtel_money_id: &str) -> Result<Option<String>, AirtelError> {
        if !is_reference(airtel_money_id) {
            return Err(invalid("transaction.airtel_money_id", "is not an Airtel reference"));
        }
        let body = RefundRequest { transaction: RefundTransaction { airtel_money_id } };
        let body = serde_json::to_vec(&body).map_err(|e| invalid("body", &e.to_string()))?;
        let answer = self.call(Op::Refund, reqwest::Method::POST, PATH_REFUND, Some(body)).await?;
        let envelope: Envelope = serde_json::from_slice(&answer.body).unwrap_or_default();
        let status = envelope.status.unwrap_or_default();
        if !answer.status.is_success() {
            return Err(error_answer(Op::Refund, &answer, &status));
        }
        let tx = envelope.data.and_then(|d| d.transaction).unwrap_or_default();
        match (status.success, tx.status.as_deref().map(str::trim)) {
            (Some(true), Some("SUCCESS" | "TS")) => Ok(tx.airtel_money_id.filter(|r| is_reference(r))),
            (Some(false), _) => {
                Err(AirtelError::Refused { code: status.code(answer.status), message: status.message() })
            }
            (_, reported) => Err(AirtelError::OutcomeUnknown(format!(
                "refund: HTTP {} {} (status {:?}) does not say the refund was done",
                answer.status,
                status.code(answer.status),
                reported.map(|r| clean_text(r, 20))
            ))),
        }
    }

    /// Asks where a collection stands, by the id it was sent with (see [`AirtelClient::enquire_at`]).
    pub async fn enquire(&self, id: &str) -> Result<Enquiry, AirtelError> {
        self.enquire_at(PATH_ENQUIRY, id).await
    }

    /// Asks where a disbursement stands, by the id it was sent with.
    pub async fn enquire_disbursement(&self, id: &str) -> Result<Enquiry, AirtelError> {
        self.enquire_at(PATH_DISBURSEMENT_ENQUIRY, id).await
    }

    /// Asks where a transaction stands, by the id it was sent with. Read-only: a timeout or 5xx is
    /// `Unavailable` (ask again later), and `Refused` means only that this *enquiry* was refused
    /// (e.g. an id Airtel does not know), never that the payment failed.
    async fn enquire_at(&self, prefix: &str, id: &str) -> Result<Enquiry, AirtelError> {
        if !is_transaction_id(id) || !id.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-') {
            return Err(invalid("id", "is not a transaction id this gateway sends"));
        }
        let path = format!("{prefix}{id}");
        let answer = self.call(Op::Enquiry, reqwest::Method::GET, &path, None).await?;
        let unparseable = || AirtelError::Unavailable(format!("enquiry: unparseable answer (HTTP {})", answer.status));
        let envelope: Envelope = serde_json::from_slice(&answer.body).map_err(|_| unparseable())?;
        let status = envelope.status.unwrap_or_default();
        if !answer.status.is_success() {
            return Err(error_answer(Op::Enquiry, &answer, &status));
        }
        if status.success != Some(true) {
            return Err(AirtelError::Refused { code: status.code(answer.status), message: status.message() });
        }
        let tx = envelope.data.and_then(|d| d.transaction).ok_or_else(unparseable)?;
        // An answer about another transaction says nothing about this one.
        if tx.id.as_deref().is_some_and(|echoed| echoed != id) {
            return Err(AirtelError::Unavailable("enquiry: the answer names another transaction".into()));
        }
        let code = tx.status.ok_or_else(unparseable)?;
        Ok(Enquiry {
            status: TransactionStatus::parse(&code),
            airtel_money_id: tx.airtel_money_id.filter(|r| is_reference(r)),
            message: clean_text(tx.message.as_deref().unwrap_or_default(), 120),
        })
    }

    /// Ask Airtel for a fresh OAuth token with the configured credentials. The token is dropped.
    pub async fn check_credentials(&self) -> Result<(), AirtelError> {
        self.fetch_token().await.map(drop).map_err(|f| f.error)
    }

    /// Sends one API request through the circuit breaker (`outbound::send_with_retries`): only an
    /// overload answer (429, 503) is certainly unprocessed; any other 5xx is not retried.
    async fn call(
        &self,
        op: Op,
        method: reqwest::Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Answer, AirtelError> {
        let retries = Retries {
            vendor: "airtel",
            op: op.as_str(),
            breaker: &self.inner.breakers[op as usize],
            retries_max: self.inner.cfg.retries_max,
        };
        let count = |answer: &Answer| {
            let overloaded = is_overload(answer.status);
            Counted { up: !(answer.status.is_server_error() || overloaded), unprocessed: overloaded }
        };
        send_with_retries(retries, AirtelError::Unavailable, count, || {
            self.call_once(op, &method, path, body.as_deref())
        })
        .await
    }

    /// One attempt with the cached token, refreshed once after a 401 (`outbound::with_token`).
    async fn call_once(
        &self,
        op: Op,
        method: &reqwest::Method,
        path: &str,
        body: Option<&[u8]>,
    ) -> Result<Answer, Failure> {
        let url = format!("{}{path}", self.inner.base);
        let send = |token: Secret| {
            let mut request = crate::telemetry::traced(self.inner.http.request(method.clone(), &url))
                .bearer_auth(token.expose())
                .header("Accept", "application/json")
                .header("X-Country", COUNTRY)
                .header("X-Currency", CURRENCY);
            if let Some(body) = body {
                request = request.header("Content-Type", "application/json").body(body.to_vec());
            }
            async move {
                let mut resp = request.send().await.map_err(|e| send_error(op, &e))?;
                let status = resp.status();
                let body = read_body(&mut resp, RESPONSE_BYTES_MAX).await.map_err(|why| {
                    Failure::fatal(op.after_sending(format!("{}: {why} (HTTP {status})", op.as_str())))
                })?;
                Ok(Answer { status, body })
            }
        };
        let refused = |answer: &Answer| answer.status == reqwest::StatusCode::UNAUTHORIZED;
        let inner = &self.inner;
        with_token(&inner.token, &*inner.clock, "airtel", || self.fetch_token(), refused, send).await
    }

    async fn fetch_token(&self) -> Result<CachedToken, Failure> {
        let cfg = &self.inner.cfg;
        let url = format!("{}{PATH_TOKEN}", self.inner.base);
        let unavailable = |why: String, transient: bool| {
            tracing::warn!(error = %why, "airtel token fetch failed");
            Failure { error: AirtelError::Unavailable(format!("oauth: {why}")), transient }
        };
        let body = TokenRequest {
            client_id: cfg.client_id.expose(),
            client_secret: cfg.client_secret.expose(),
            grant_type: "client_credentials",
        };
        let mut resp = self
            .inner
            .http
            .post(&url)
            .header("Accept", "application/json")
            .json(&body)
            .send()
            .await
            .map_err(|e| unavailable(describe_send_error(&e), e.is_connect()))?;
        let status = resp.status();
        // The body is never quoted: only the status and a fixed text.
        let body = read_body(&mut resp, RESPONSE_BYTES_MAX)
            .await
            .map_err(|why| unavailable(format!("{why} (HTTP {status})"), false))?;
        if !status.is_success() {
            return Err(unavailable(format!("token request refused (HTTP {status})"), is_overload(status)));
        }
        let parsed: TokenResponse = serde_json::from_slice(&body)
            .map_err(|_| unavailable(format!("unparseable token response (HTTP {status})"), false))?;
        if parsed.access_token.is_empty() {
            return Err(unavailable("empty access_token".into(), false));
        }
        let expires_in_secs = json_int(&parsed.expires_in)
            .filter(|s| *s > 0)
            .ok_or_else(|| unavailable("expires_in is not a positive integer".into(), false))?;
        let token = Secret::new(parsed.access_token);
        Ok(CachedToken::new(token, expires_in_secs, cfg.token_refresh_margin_secs, &*self.inner.clock))
    }
}

/// A non-2xx answer → the error it means for this operation.
fn error_answer(op: Op, answer: &Answer, status: &StatusBlock) -> AirtelError {
    let http = answer.status;
    let (code, message) = (status.code(http), status.message());
    tracing::debug!(airtel.op = op.as_str(), http.status = http.as_u16(), airtel.code = %code, "airtel error");
    let what = op.as_str();
    if http == reqwest::StatusCode::UNAUTHORIZED {
        return AirtelError::Unavailable(format!("{what}: access token refused twice ({code})"));
    }
    if is_overload(http) {
        return AirtelError::Unavailable(format!("{what}: HTTP {http} {code}: {message}"));
    }
    if http.is_client_error() {
        return AirtelError::Refused { code, message };
    }
    // A 5xx (or anything unexpected) after Airtel read a collection: it may have started.
    op.after_sending(format!("{what}: HTTP {http} {code}: {message}"))
}

/// Refused before processing, by overload.
fn is_overload(status: reqwest::StatusCode) -> bool {
    status == reqwest::StatusCode::TOO_MANY_REQUESTS || status == reqwest::StatusCode::SERVICE_UNAVAILABLE
}

fn invalid(field: &str, why: &str) -> AirtelError {
    AirtelError::Refused { code: "paygate.invalid_request".into(), message: format!("{field} {why}") }
}

fn is_transaction_id(id: &str) -> bool {
    !id.is_empty() && id.chars().count() <= TRANSACTION_ID_CHARS_MAX && !id.chars().any(char::is_control)
}

/// A failed send. A connect error means no byte of the request left (transient: try again);
/// anything else (a timeout after connecting, a reset mid-answer) may have reached Airtel.
fn send_error(op: Op, e: &reqwest::Error) -> Failure {
    send_failure(op.as_str(), e, AirtelError::Unavailable, |why| op.after_sending(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Airtel's transaction id is the one reference a lost answer can be asked by: one that is
    /// empty, over the bound or holds control characters is never sent.
    #[test]
    fn a_transaction_id_is_short_printable_text() {
        assert!(is_transaction_id("pay_01JDZZZZZZZZZZZZZZZZZZZZZZ"));
        assert!(is_transaction_id(&"x".repeat(TRANSACTION_ID_CHARS_MAX)));
        for bad in [String::new(), "x".repeat(TRANSACTION_ID_CHARS_MAX + 1), "pay\n1".into(), "pay\u{7f}".into()] {
            assert!(!is_transaction_id(&bad), "{bad:?}");
        }
    }

    #[test]
    fn normalize_phone_accepts_airtel_kenya_forms() {
        for input in ["0733123456", "733123456", "254733123456", "+254733123456", "+254 733-123-456"] {
            let m = normalize_phone(input).unwrap();
            assert_eq!((m.as_str(), m.subscriber()), ("254733123456", "733123456"), "{input}");
        }
        for input in ["0750123456", "0780123456", "0100123456", "254101123456"] {
            assert!(normalize_phone(input).is_ok(), "{input}");
        }
    }

    #[test]
    fn normalize_phone_refuses_other_numbers() {
        for input in ["", "0712345678", "0110345678", "+1 733 123 456", "07331234567", "0733a23456", "+0733123456"] {
            assert!(normalize_phone(input).is_err(), "{input}");
        }
        assert!(normalize_phone("0712345678").unwrap_err().starts_with("not an Airtel Money Kenya number"));
    }

    #[test]
    fn callbacks_parse_strictly() {
        let body = br#"{"transaction":{"id":"pay_1","message":"Paid","status_code":"TS","airtel_money_id":"MP210603.1234.L06941"}}"#;
        let cb = parse_callback(body).unwrap();
        assert_eq!((cb.id.as_str(), cb.status.clone()), ("pay_1", TransactionStatus::Success));
        assert_eq!(cb.airtel_money_id.as_deref(), Some("MP210603.1234.L06941"));
        let body = br#"{"transaction":{"id":"pay_1","status_code":"TF","airtel_money_id":"MP 21<script>"}}"#;
        let cb = parse_callback(body).unwrap();
        assert_eq!((cb.status, cb.airtel_money_id), (TransactionStatus::Failed, None), "not kept as a receipt");
        for bad in
            [&b"not json"[..], br#"{}"#, br#"{"transaction":{"status_code":"TS"}}"#, br#"{"transaction":{"id":"p"}}"#]
        {
            assert!(parse_callback(bad).is_err(), "{}", String::from_utf8_lossy(bad));
        }
        // An M-Pesa STK callback is not an Airtel callback.
        assert!(parse_callback(br#"{"Body":{"stkCallback":{"ResultCode":0}}}"#).is_err());
    }

    #[test]
    fn status_codes_are_never_guessed() {
        assert_eq!(TransactionStatus::parse("TS"), TransactionStatus::Success);
        assert_eq!(TransactionStatus::parse("TIP"), TransactionStatus::InProgress);
        assert_eq!(TransactionStatus::parse("TA"), TransactionStatus::Ambiguous);
        assert_eq!(TransactionStatus::parse("ts"), TransactionStatus::Other("ts".into()));
        assert_eq!(TransactionStatus::parse("T S\n"), TransactionStatus::Other("TS".into()), "cleaned, still not TS");
    }

    #[test]
    fn the_pin_is_four_digits_and_sealed_afresh_for_airtels_key_alone() {
        use rsa::pkcs8::DecodePrivateKey as _;
        let public = include_str!("../../../tests/fixtures/rsa1.pub.pem");
        let private = rsa::PrivateKey::from_pkcs8_pem(include_str!("../../../tests/fixtures/rsa1.pem")).unwrap();
        let creds = PayoutCredentials::new(&Secret::new("4321".into()), public).unwrap();
        assert_eq!(format!("{creds:?}"), "PayoutCredentials(***)");
        let (a, b) = (creds.encrypted_pin().unwrap(), creds.encrypted_pin().unwrap());
        assert_ne!(a, b, "PKCS#1 v1.5 padding is random: a fresh ciphertext each time");
        use base64::Engine as _;
        for sealed in [a, b] {
            let raw = base64::engine::general_purpose::STANDARD.decode(sealed).unwrap();
            assert_eq!(private.decrypt(rsa::Pkcs1v15Encrypt, &raw).unwrap(), b"4321");
        }
        // The portal's form: the base64 of the DER key, with line breaks.
        let der: String = public.lines().filter(|l| !l.starts_with("-----")).collect::<Vec<_>>().join("\n");
        assert!(PayoutCredentials::new(&Secret::new("4321".into()), &der).is_ok());
        for pin in ["", "123", "12345", "12a4", " 4321"] {
            let e = PayoutCredentials::new(&Secret::new(pin.into()), public).unwrap_err();
            assert!(e.contains("4 digits"), "{pin:?}: {e}");
        }
        for key in ["", "not base64!", "AAAA", include_str!("../../../tests/fixtures/ec1.pem")] {
            assert!(PayoutCredentials::new(&Secret::new("4321".into()), key).is_err(), "{key:?}");
        }
    }
    /// A key outside the sizes Airtel issues is refused, and says why: one too small to protect
    /// the PIN (512 bits) the RSA parser itself refuses; one over 4096 bits, this check.
    #[test]
    fn an_rsa_key_outside_the_accepted_sizes_is_refused() {
        let small = "MFwwDQYJKoZIhvcNAQEBBQADSwAwSAJBALXZsrKsqVIGdXbaRHfBBCdy9Ade0L5yfIYbp24CasJThjEmuJERSuDOKKtPY3U0ZLJL+I4BHVQeSLHoYf0iT8cCAwEAAQ==";
        assert!(parse_public_key(small).is_err());
        let large = "MIICLzANBgkqhkiG9w0BAQEFAAOCAhwAMIICFwKCAg4Apixqb1SIea09AZ0Ik0KRs2J16OICd3X1P76idIX2r7AMPLp+PjlQPyWzAGLc+5j0u+NfmHRcV7/F+awqllxctgk7FsHynjy9DSSAKPoCGfkuRrTCsYR/PpFG9C4GxtVH5j3l5D+i+bPgMnVLInjRvATsLwrUV+eTuyb9z2703fqLc88LXa0MrtgNjUKKnfNMAjUQOm09KyHT+i85fDEhUCqRIZxjs35AK49NWlQZrGCD/cpvUsRCvqHY+64Rv4IwBqc0IaHKlCN+Ry0jS5KY2eRyYTxktJy8U6kF5+H+JZNXSFhvs0IJ+38TjzRv2HUR2a9qLMyKFO0IKF7hAttSvsPiPCHciAgPnmOfqFCLFSBpw/tGn9sAJGlztJUuySvd3l0mA6SpGGtTHEoM2M9f0Pw2PmtsO+zThtsad0/LY7sKcPQUrqGWOaH6igr7L2TymeHooMajykIFSDqPI+j8UgA2Jx+5mlISjHQkx/qb40e8m+SPi6of6YNwXz2tDcUHwvTo1LjRAY1p4pvRQ3cj6CTJydQUKtAEMHmihx4L/rt9/0fa8P2jPub1Xu9glhYWcsR1XEoz+sk180a7XVLYH8QuxncDSQEsijF4lg/R56lpypn4ACOD3fx8la9rclsEWfuzQG0bNQTyif6/Tdq8CY/fXFeD70yzqgEz1mbMRU2XHX0T//PgJ1roMSNdAgMBAAE=";
        let e = parse_public_key(large).unwrap_err();
        assert!(e.contains("4200 bits") && e.contains("1024 to 4096"), "{e}");
    }

    #[test]
    fn a_callback_field_of_the_wrong_type_or_an_id_over_the_bound_is_refused() {
        let cases = [
            (r#"{"transaction":{"id":7,"status_code":"TS"}}"#.to_string(), "transaction.id must be a string"),
            (r#"{"transaction":{"id":"p","status_code":["TS"]}}"#.to_string(), "status_code must be a string"),
            (
                format!(
                    r#"{{"transaction":{{"id":"{}","status_code":"TS"}}}}"#,
                    "x".repeat(TRANSACTION_ID_CHARS_MAX + 1)
                ),
                "too long",
            ),
            (r#"{"transaction":{"id":"pay\u0007","status_code":"TS"}}"#.to_string(), "control characters"),
        ];
        for (body, needle) in cases {
            let err = parse_callback(body.as_bytes()).unwrap_err();
            assert!(err.contains(needle), "{body}: {err}");
        }
        let long =
            format!(r#"{{"transaction":{{"id":"{}","status_code":"TS"}}}}"#, "x".repeat(TRANSACTION_ID_CHARS_MAX));
        assert!(parse_callback(long.as_bytes()).is_ok());
        // Airtel's reference is kept up to the same bound, and dropped past it (never cut).
        let with_reference =
            |r: &str| format!(r#"{{"transaction":{{"id":"p","status_code":"TS","airtel_money_id":"{r}"}}}}"#);
        let longest = "M".repeat(TRANSACTION_ID_CHARS_MAX);
        assert_eq!(parse_callback(with_reference(&longest).as_bytes()).unwrap().airtel_money_id, Some(longest));
        let over = "M".repeat(TRANSACTION_ID_CHARS_MAX + 1);
        assert_eq!(parse_callback(with_reference(&over).as_bytes()).unwrap().airtel_money_id, None);
    }

    /// An Airtel answering each path with what the test sets (the token endpoint as Airtel does,
    /// unless set), counting every request it gets.
    #[derive(Clone, Default)]
    struct Scripted {
        answers: Arc<std::sync::Mutex<std::collections::HashMap<String, (u16, String)>>>,
        requests: Arc<std::sync::atomic::AtomicUsize>,
    }

    impl Scripted {
        fn answer(&self, path: &str, status: u16, body: &str) {
            self.answers.lock().unwrap().insert(path.to_string(), (status, body.to_string()));
        }
        fn requests(&self) -> usize {
            self.requests.load(std::sync::atomic::Ordering::SeqCst)
        }
    }

    async fn scripted_answer(
        axum::extract::State(s): axum::extract::State<Scripted>,
        uri: axum::http::Uri,
    ) -> (axum::http::StatusCode, String) {
        s.requests.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        let found = s.answers.lock().unwrap().get(uri.path()).cloned();
        let (status, body) = match found {
            Some(a) => a,
            None if uri.path() == PATH_TOKEN => (200, r#"{"access_token":"t0k3n","expires_in":"3599"}"#.into()),
            None => (404, String::new()),
        };
        (axum::http::StatusCode::from_u16(status).unwrap(), body)
    }

    async fn scripted_client(payouts: bool) -> (Scripted, AirtelClient, tokio::task::JoinHandle<()>) {
        let script = Scripted::default();
        let app = axum::Router::new().fallback(scripted_answer).with_state(script.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base_url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        let payouts = payouts.then(|| {
            PayoutCredentials::new(&Secret::new("4321".into()), include_str!("../../../tests/fixtures/rsa1.pub.pem"))
                .unwrap()
        });
        let cfg = AirtelConfig {
            base_url,
            client_id: Secret::new("id".into()),
            client_secret: Secret::new("secret".into()),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            token_refresh_margin_secs: 60,
            retries_max: 0,
            breaker_failures_max: 50,
            breaker_open: Duration::from_secs(30),
            payouts,
        };
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::ManualClock::new(1_700_000_000));
        (script, AirtelClient::new(cfg, clock).unwrap(), server)
    }

    fn collection(id: &str, amount_whole: i64, reference: &str) -> Collection {
        Collection {
            id: id.into(),
            msisdn: normalize_phone("0733123456").unwrap(),
            amount_whole,
            reference: reference.into(),
        }
    }

    fn disbursement(id: &str, amount_whole: i64, reference: &str) -> Disbursement {
        Disbursement {
            id: id.into(),
            msisdn: normalize_phone("0733123456").unwrap(),
            amount_whole,
            reference: reference.into(),
        }
    }

    fn refused_as_invalid(r: Result<impl std::fmt::Debug, AirtelError>, field: &str) {
        match r {
            Err(AirtelError::Refused { code, message }) => {
                assert_eq!(code, "paygate.invalid_request");
                assert!(message.starts_with(field), "{field}: {message}");
            }
            other => panic!("{field}: {other:?}"),
        }
    }

    /// What cannot be a valid request is refused before Airtel hears anything (not even a token
    /// request): no shilling, an id that is not one, a blank reference, a refund of something that
    /// is not an Airtel reference, an enquiry for an id this gateway never sends; and disbursements
    /// without their PIN and key are a configuration error, not a refusal.
    #[tokio::test]
    async fn invalid_requests_are_refused_before_anything_is_sent() {
        let (script, client, server) = scripted_client(true).await;
        refused_as_invalid(client.collect(&collection("pay_1", 0, "Order 1")).await, "transaction.amount");
        refused_as_invalid(client.collect(&collection("", 10, "Order 1")).await, "transaction.id");
        refused_as_invalid(client.collect(&collection("pay\n1", 10, "Order 1")).await, "transaction.id");
        refused_as_invalid(client.collect(&collection("pay_1", 10, " \u{7} ")).await, "reference");
        refused_as_invalid(client.disburse(&disbursement("pay_2", 0, "Payout")).await, "transaction.amount");
        refused_as_invalid(client.disburse(&disbursement("", 10, "Payout")).await, "transaction.id");
        refused_as_invalid(client.disburse(&disbursement("pay_2", 10, "\t")).await, "reference");
        refused_as_invalid(client.refund("MP 21<script>").await, "transaction.airtel_money_id");
        for id in ["", "pay/1", "pay 1", "pay?x=1"] {
            refused_as_invalid(client.enquire(id).await, "id");
            refused_as_invalid(client.enquire_disbursement(id).await, "id");
        }
        assert_eq!(script.requests(), 0);
        let (script, bare, _bare_server) = scripted_client(false).await;
        assert!(!bare.pays_out());
        assert!(matches!(bare.disburse(&disbursement("pay_2", 10, "Payout")).await, Err(AirtelError::Config(_))));
        assert_eq!(script.requests(), 0);
        server.abort();
    }

    /// A 200 is an acceptance only when Airtel's status block says so: a refusal inside a 200 is a
    /// refusal; a collection or refund answer that says neither may have started the money moving
    /// (outcome unknown, never "not sent"); a disbursement is refused only when Airtel reports the
    /// transaction failed; an enquiry's odd answer is a question to ask again.
    #[tokio::test]
    async fn a_success_status_is_read_from_airtels_status_block_not_the_http_code() {
        let (script, client, server) = scripted_client(true).await;
        let refused =
            r#"{"status":{"code":"200","message":"Insufficient funds","result_code":"DP00800001007","success":false}}"#;
        script.answer(PATH_COLLECT, 200, refused);
        match client.collect(&collection("pay_1", 10, "Order 1")).await {
            Err(AirtelError::Refused { code, message }) => {
                assert_eq!((code.as_str(), message.as_str()), ("DP00800001007", "Insufficient funds"))
            }
            other => panic!("{other:?}"),
        }
        for body in ["", "{}", r#"{"status":{"code":"200"}}"#] {
            script.answer(PATH_COLLECT, 200, body);
            assert!(
                matches!(
                    client.collect(&collection("pay_1", 10, "Order 1")).await,
                    Err(AirtelError::OutcomeUnknown(_))
                ),
                "{body:?}"
            );
        }
        script.answer(PATH_COLLECT, 200, r#"{"status":{"success":true}}"#);
        client.collect(&collection("pay_1", 10, "Order 1")).await.unwrap();
        // One shilling is the least Airtel takes, and it goes out.
        client.collect(&collection("pay_one", 1, "Order 1")).await.unwrap();

        let failed_tx = r#"{"data":{"transaction":{"status":"TF"}},"status":{"result_code":"DP00900001001","message":"Failed","success":false}}"#;
        script.answer(PATH_DISBURSE, 200, failed_tx);
        assert!(
            matches!(client.disburse(&disbursement("pay_2", 10, "Payout")).await, Err(AirtelError::Refused { code, .. }) if code == "DP00900001001")
        );
        for body in [
            r#"{"data":{"transaction":{"status":"TIP"}},"status":{"success":false}}"#,
            r#"{"status":{"success":false}}"#,
            "{",
        ] {
            script.answer(PATH_DISBURSE, 200, body);
            assert!(
                matches!(
                    client.disburse(&disbursement("pay_2", 10, "Payout")).await,
                    Err(AirtelError::OutcomeUnknown(_))
                ),
                "{body}"
            );
        }
        script.answer(PATH_DISBURSE, 200, r#"{"status":{"success":true}}"#);
        client.disburse(&disbursement("pay_2", 10, "Payout")).await.unwrap();

        script.answer(PATH_REFUND, 200, r#"{"data":{"transaction":{"airtel_money_id":"MP210603.1234.R00001","status":"SUCCESS"}},"status":{"success":true}}"#);
        assert_eq!(client.refund("MP210603.1234.L06941").await.unwrap().as_deref(), Some("MP210603.1234.R00001"));
        script.answer(PATH_REFUND, 200, r#"{"data":{"transaction":{"status":"TS"}},"status":{"success":true}}"#);
        assert_eq!(client.refund("MP210603.1234.L06941").await.unwrap(), None);
        script.answer(
            PATH_REFUND,
            200,
            r#"{"status":{"result_code":"ESB000041","message":"No such transaction","success":false}}"#,
        );
        assert!(
            matches!(client.refund("MP210603.1234.L06941").await, Err(AirtelError::Refused { code, .. }) if code == "ESB000041")
        );
        for body in
            [r#"{"data":{"transaction":{"status":"TIP"}},"status":{"success":true}}"#, r#"{"status":{"success":true}}"#]
        {
            script.answer(PATH_REFUND, 200, body);
            assert!(
                matches!(client.refund("MP210603.1234.L06941").await, Err(AirtelError::OutcomeUnknown(_))),
                "{body}"
            );
        }

        let path = format!("{PATH_ENQUIRY}pay_1");
        script.answer(&path, 200, r#"{"status":{"result_code":"ESB000010","message":"Not found","success":false}}"#);
        assert!(matches!(client.enquire("pay_1").await, Err(AirtelError::Refused { code, .. }) if code == "ESB000010"));
        for body in [
            "not json",
            r#"{"status":{"success":true}}"#,
            r#"{"data":{"transaction":{"id":"pay_1"}},"status":{"success":true}}"#,
            r#"{"data":{"transaction":{"id":"pay_9","status":"TS"}},"status":{"success":true}}"#,
        ] {
            script.answer(&path, 200, body);
            assert!(matches!(client.enquire("pay_1").await, Err(AirtelError::Unavailable(_))), "{body}");
        }
        script.answer(&path, 200, r#"{"data":{"transaction":{"id":"pay_1","status":"TS","airtel_money_id":"MP210603.1234.L06941","message":"Paid"}},"status":{"success":true}}"#);
        let e = client.enquire("pay_1").await.unwrap();
        assert_eq!(
            (e.status, e.airtel_money_id.as_deref(), e.message.as_str()),
            (TransactionStatus::Success, Some("MP210603.1234.L06941"), "Paid")
        );
        server.abort();
    }

    /// Error answers mean what they say about money: a token refused twice or an overload is
    /// unavailable (nothing started), a 4xx a refusal, a 5xx after a collection an unknown outcome
    /// and after an enquiry a question to ask again.
    #[tokio::test]
    async fn each_error_answer_says_what_may_have_happened_to_the_money() {
        let (script, client, server) = scripted_client(true).await;
        let err = r#"{"status":{"result_code":"ESB000001","message":"Something went wrong","success":false}}"#;
        let enquiry = format!("{PATH_ENQUIRY}pay_1");
        script.answer(PATH_COLLECT, 401, err);
        match client.collect(&collection("pay_1", 10, "Order 1")).await {
            Err(AirtelError::Unavailable(why)) => assert!(why.contains("refused twice"), "{why}"),
            other => panic!("{other:?}"),
        }
        for status in [429, 503] {
            script.answer(PATH_COLLECT, status, err);
            assert!(
                matches!(client.collect(&collection("pay_1", 10, "Order 1")).await, Err(AirtelError::Unavailable(_))),
                "{status}"
            );
        }
        script.answer(PATH_COLLECT, 400, err);
        assert!(
            matches!(client.collect(&collection("pay_1", 10, "Order 1")).await, Err(AirtelError::Refused { code, .. }) if code == "ESB000001")
        );
        script.answer(PATH_COLLECT, 500, err);
        assert!(matches!(
            client.collect(&collection("pay_1", 10, "Order 1")).await,
            Err(AirtelError::OutcomeUnknown(_))
        ));
        script.answer(PATH_DISBURSE, 502, err);
        assert!(matches!(
            client.disburse(&disbursement("pay_2", 10, "Payout")).await,
            Err(AirtelError::OutcomeUnknown(_))
        ));
        script.answer(PATH_REFUND, 500, err);
        assert!(matches!(client.refund("MP210603.1234.L06941").await, Err(AirtelError::OutcomeUnknown(_))));
        script.answer(&enquiry, 500, err);
        assert!(matches!(client.enquire("pay_1").await, Err(AirtelError::Unavailable(_))));
        script.answer(&enquiry, 404, err);
        assert!(matches!(client.enquire("pay_1").await, Err(AirtelError::Refused { .. })));
        server.abort();
    }

    /// A token Airtel will not give is unavailable, never a refusal of the payment: refused, empty,
    /// or without a positive lifetime. The doctor's credential check says the same.
    #[tokio::test]
    async fn a_token_airtel_will_not_give_leaves_the_request_unsent_and_unavailable() {
        for (status, body, needle) in [
            (401, r#"{"error":"invalid_client"}"#, "token request refused (HTTP 401"),
            (200, r#"{"access_token":"","expires_in":"3599"}"#, "empty access_token"),
            (200, r#"{"access_token":"t","expires_in":"0"}"#, "expires_in"),
            (200, "nope", "unparseable token response"),
        ] {
            let (script, client, server) = scripted_client(true).await;
            script.answer(PATH_TOKEN, status, body);
            match client.check_credentials().await {
                Err(AirtelError::Unavailable(why)) => assert!(why.contains(needle), "{body}: {why}"),
                other => panic!("{body}: {other:?}"),
            }
            match client.collect(&collection("pay_1", 10, "Order 1")).await {
                Err(AirtelError::Unavailable(why)) => assert!(why.contains(needle), "{body}: {why}"),
                other => panic!("{body}: {other:?}"),
            }
            assert_eq!(script.requests(), 2, "two token requests, no collection");
            server.abort();
        }
        let (script, client, server) = scripted_client(true).await;
        client.check_credentials().await.unwrap();
        assert_eq!(script.requests(), 1);
        server.abort();
    }

    #[test]
    fn a_client_needs_its_credentials() {
        let clock: Arc<dyn Clock> = Arc::new(crate::clock::ManualClock::new(0));
        let cfg = |id: &str, secret: &str| AirtelConfig {
            base_url: "http://127.0.0.1:9".into(),
            client_id: Secret::new(id.into()),
            client_secret: Secret::new(secret.into()),
            connect_timeout: Duration::from_secs(1),
            request_timeout: Duration::from_secs(1),
            token_refresh_margin_secs: 60,
            retries_max: 0,
            breaker_failures_max: 1,
            breaker_open: Duration::from_secs(1),
            payouts: None,
        };
        for (id, secret) in [("", "s"), ("i", "")] {
            assert!(
                matches!(AirtelClient::new(cfg(id, secret), clock.clone()), Err(AirtelError::Config(why)) if why.contains("client_id"))
            );
        }
        assert!(AirtelClient::new(cfg("i", "s"), clock).is_ok());
    }
}
