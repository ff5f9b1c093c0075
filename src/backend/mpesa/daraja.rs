//! Safaricom Daraja (M-Pesa Express / STK push): the wire types and an HTTP client for them.
//!
//! Architecture Invariant: Daraja's JSON shapes live only in this file. Callers see [`StkPush`],
//! [`StkPushAccepted`], [`StkQueryOutcome`], [`StkCallback`] and [`DarajaError`], whose three failure
//! kinds say what the caller may conclude about money: `Rejected` (Daraja refused, nothing started),
//! `Unavailable` (the request was not processed; safe to try again) and `OutcomeUnknown` (it may have
//! been processed; keep the payment pending and reconcile by callback or query).
//!
//! Daraja has no idempotency key: a push retried after an unknown outcome may prompt the customer
//! twice, so this client never retries a push except after a 401 (the request was refused at the
//! gateway, before processing).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::clock::{Clock, UnixSecs};
use crate::secret::Secret;

pub const SANDBOX_BASE_URL: &str = "https://sandbox.safaricom.co.ke";
pub const PRODUCTION_BASE_URL: &str = "https://api.safaricom.co.ke";
/// Daraja rejects a longer `AccountReference`.
pub const ACCOUNT_REFERENCE_CHARS_MAX: usize = 12;
/// Daraja rejects a longer `TransactionDesc`.
pub const TRANSACTION_DESC_CHARS_MAX: usize = 13;
/// Daraja's answers are a few hundred bytes; anything bigger is not Daraja.
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024;
/// East Africa Time is UTC+3 all year (no daylight saving).
const EAT_OFFSET_SECS: i64 = 3 * 3600;

pub const TRANSACTION_TYPE_PAYBILL: &str = "CustomerPayBillOnline";
pub const TRANSACTION_TYPE_BUY_GOODS: &str = "CustomerBuyGoodsOnline";

/// ResultCode of a completed, successful STK transaction.
pub const RESULT_CODE_SUCCESS: i64 = 0;

/// Daraja's `errorCode` for "The transaction is being processed" (query while the prompt is open).
/// The same code also means "wrong credentials / subscriber locked", so the message is checked too.
const ERROR_CODE_PROCESSING: &str = "500.001.1001";
/// Daraja's `errorCode` for an invalid or expired access token (sent with HTTP 401 or 404).
const ERROR_CODE_INVALID_TOKEN: &str = "404.001.03";
/// Spike arrest and quota violations: refused at Daraja's API gateway, before the request is processed.
const ERROR_CODES_GATEWAY_REFUSAL: [&str; 2] = ["500.003.02", "500.003.03"];

#[derive(Clone)]
pub struct DarajaConfig {
    /// [`SANDBOX_BASE_URL`], [`PRODUCTION_BASE_URL`], or a local fake in tests.
    pub base_url: String,
    pub consumer_key: Secret,
    pub consumer_secret: Secret,
    /// `BusinessShortCode` (paybill or store number); also the first part of the password.
    pub short_code: String,
    pub passkey: Secret,
    /// Where Daraja posts the result; should carry an unguessable path or secret (callbacks are unsigned).
    pub callback_url: String,
    /// [`TRANSACTION_TYPE_PAYBILL`] or [`TRANSACTION_TYPE_BUY_GOODS`].
    pub transaction_type: String,
    /// Usually the short code; the till number for buy goods.
    pub party_b: String,
    pub connect_timeout: Duration,
    /// Whole request, connect to last byte. After sending, a push timing out is `OutcomeUnknown`.
    pub request_timeout: Duration,
    /// Refresh the OAuth token this long before Daraja says it expires.
    pub token_refresh_margin_secs: i64,
}

/// The callback URL carries the deployment's path secret: Debug shows neither it nor the credentials.
impl std::fmt::Debug for DarajaConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DarajaConfig")
            .field("base_url", &self.base_url)
            .field("short_code", &self.short_code)
            .field("transaction_type", &self.transaction_type)
            .field("party_b", &self.party_b)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, thiserror::Error)]
pub enum DarajaError {
    /// Daraja answered and refused (4xx with errorCode/errorMessage, or ResponseCode != "0"), or the
    /// request was invalid before sending. Nothing was started.
    #[error("daraja rejected the request: {code}: {message}")]
    Rejected { code: String, message: String },
    /// Definitely not processed: connect error, 503, gateway refusal, OAuth failure. Safe to retry.
    #[error("daraja unavailable: {0}")]
    Unavailable(String),
    /// The request may have been processed: timeout after sending, connection lost mid-response,
    /// 5xx on a push, unparseable success body. Never treat as success or failure; reconcile.
    #[error("daraja outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// The configuration cannot work (returned only by [`DarajaClient::new`]).
    #[error("invalid daraja config: {0}")]
    Config(String),
}

// ---------------------------------------------------------------------------------------------
// Parse-don't-validate inputs

/// A Kenyan mobile number in Daraja's format: `2547XXXXXXXX` or `2541XXXXXXXX` (12 digits).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Msisdn(String);

impl Msisdn {
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Msisdn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// Accepts `07XXXXXXXX`, `01XXXXXXXX`, `7XXXXXXXX`, `1XXXXXXXX`, `2547…`, `2541…`, `+2547…`, `+2541…`;
/// spaces and dashes are ignored.
pub fn normalize_phone(input: &str) -> Result<Msisdn, String> {
    const EXPECTED: &str = "expected a Kenyan mobile number such as 0712345678, 712345678 or 254712345678";
    let compact: String = input.chars().filter(|c| !matches!(c, ' ' | '-')).collect();
    if compact.is_empty() {
        return Err(format!("phone number is empty: {EXPECTED}"));
    }
    let digits = compact.strip_prefix('+').unwrap_or(&compact);
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("phone number may contain only digits, spaces, dashes and a leading '+': {EXPECTED}"));
    }
    if compact.starts_with('+') && !digits.starts_with("254") {
        return Err(format!("phone number must be Kenyan (+254): {EXPECTED}"));
    }
    // The 9-digit subscriber part: 7XXXXXXXX or 1XXXXXXXX.
    let subscriber = match digits.len() {
        12 if digits.starts_with("254") => &digits[3..],
        10 if digits.starts_with('0') => &digits[1..],
        9 => digits,
        _ => return Err(format!("phone number has the wrong number of digits: {EXPECTED}")),
    };
    if !(subscriber.starts_with('7') || subscriber.starts_with('1')) {
        return Err(format!("not a Kenyan mobile number (must start 07, 01, 2547 or 2541): {EXPECTED}"));
    }
    Ok(Msisdn(format!("254{subscriber}")))
}

/// Daraja's STK password: `base64(ShortCode + Passkey + Timestamp)`.
pub fn password(short_code: &str, passkey: &str, timestamp: &str) -> String {
    BASE64.encode(format!("{short_code}{passkey}{timestamp}"))
}

/// `YYYYMMDDHHmmss` in East Africa Time (UTC+3, no DST), as Daraja expects.
pub fn timestamp_eat(unix: UnixSecs) -> String {
    let t = time::OffsetDateTime::from_unix_timestamp(unix.saturating_add(EAT_OFFSET_SECS))
        .unwrap_or(time::OffsetDateTime::UNIX_EPOCH);
    format!("{:04}{:02}{:02}{:02}{:02}{:02}", t.year(), u8::from(t.month()), t.day(), t.hour(), t.minute(), t.second())
}

/// One STK push: prompt `phone` to pay `amount_whole` shillings.
#[derive(Debug, Clone)]
pub struct StkPush {
    pub phone: Msisdn,
    /// Whole Kenyan shillings, at least 1 (M-Pesa has no cents).
    pub amount_whole: i64,
    /// Shown to the customer; control characters are removed and it is cut to
    /// [`ACCOUNT_REFERENCE_CHARS_MAX`] characters.
    pub account_reference: String,
    /// Cut to [`TRANSACTION_DESC_CHARS_MAX`] characters, control characters removed.
    pub description: String,
}

/// Daraja accepted the push: the prompt is on its way. It says nothing about the payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StkPushAccepted {
    pub merchant_request_id: String,
    pub checkout_request_id: String,
    pub customer_message: String,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StkQueryOutcome {
    /// "The transaction is being processed": the prompt is still open on the handset.
    Pending,
    /// Daraja has a result. `result_code` 0 is success; [`failure_reason`] names the known failures;
    /// any other code (e.g. 4999 "still under processing") must be kept pending by the caller.
    Completed { result_code: i64, result_desc: String },
}

/// Known failure ResultCodes → a human reason. 0 (success) and unknown codes → `None`: an unknown code
/// is not a failure the caller may act on; keep the payment pending and reconcile.
pub fn failure_reason(result_code: i64) -> Option<&'static str> {
    match result_code {
        1 => Some("insufficient M-Pesa balance"),
        17 => Some("M-Pesa rule limit: same amount to the same customer within 2 minutes"),
        1001 => Some("subscriber busy: another M-Pesa transaction is in progress or the account is locked"),
        1019 => Some("the transaction expired before the customer completed it"),
        1025 | 9999 => Some("the payment prompt could not be sent to the phone"),
        1032 => Some("cancelled by the customer"),
        1037 => Some("the customer's phone could not be reached (offline or did not respond)"),
        2001 => Some("wrong M-Pesa PIN"),
        2028 => Some("the request is not permitted for this product or short code"),
        8006 => Some("the customer's M-Pesa security credential is locked"),
        _ => None,
    }
}

// ---------------------------------------------------------------------------------------------
// Callback

/// The result Daraja posts to `CallBackURL` (unsigned: confirm by query before crediting).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StkCallback {
    pub merchant_request_id: String,
    pub checkout_request_id: String,
    pub result_code: i64,
    pub result_desc: String,
    /// KES cents (`Amount` may arrive as 1, 1.0 or "1.00").
    pub amount_minor: Option<i64>,
    /// `MpesaReceiptNumber`.
    pub receipt: Option<String>,
    /// `PhoneNumber`, digits only.
    pub phone: Option<String>,
    /// `TransactionDate`, `YYYYMMDDHHmmss` (EAT) as sent.
    pub transaction_date: Option<String>,
}

/// Parses `{"Body":{"stkCallback":{…}}}`. Strict on the required fields; metadata items are found
/// by `Name`, may lack `Value`, and are absent on failures; unknown items are ignored.
pub fn parse_callback(body: &[u8]) -> Result<StkCallback, String> {
    let root: Value = serde_json::from_slice(body).map_err(|e| format!("callback is not valid JSON: {e}"))?;
    let cb = root
        .get("Body")
        .and_then(|b| b.get("stkCallback"))
        .and_then(Value::as_object)
        .ok_or("callback has no Body.stkCallback object")?;
    let required_str = |name: &str| -> Result<String, String> {
        match cb.get(name) {
            Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Value::String(_)) => Err(format!("callback field {name} is empty")),
            Some(_) => Err(format!("callback field {name} must be a string")),
            None => Err(format!("callback field {name} is missing")),
        }
    };
    let merchant_request_id = required_str("MerchantRequestID")?;
    let checkout_request_id = required_str("CheckoutRequestID")?;
    let result_desc = match cb.get("ResultDesc") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("callback field ResultDesc must be a string".into()),
        None => return Err("callback field ResultDesc is missing".into()),
    };
    let result_code = match cb.get("ResultCode") {
        Some(v) => json_int(v).ok_or("callback field ResultCode must be an integer")?,
        None => return Err("callback field ResultCode is missing".into()),
    };

    let mut out = StkCallback {
        merchant_request_id,
        checkout_request_id,
        result_code,
        result_desc,
        amount_minor: None,
        receipt: None,
        phone: None,
        transaction_date: None,
    };
    let items = match cb.get("CallbackMetadata") {
        None | Some(Value::Null) => return Ok(out),
        Some(meta) => {
            meta.get("Item").and_then(Value::as_array).ok_or("callback CallbackMetadata must hold an Item array")?
        }
    };
    for item in items {
        let name = item.get("Name").and_then(Value::as_str).ok_or("callback metadata item without a Name")?;
        let Some(value) = item.get("Value").filter(|v| !v.is_null()) else { continue };
        match name {
            "Amount" => {
                out.amount_minor = Some(amount_to_minor(value).map_err(|e| format!("callback Amount {value}: {e}"))?);
            }
            "MpesaReceiptNumber" => {
                let s = json_text(value).ok_or("callback MpesaReceiptNumber must be a string")?;
                out.receipt = Some(s);
            }
            "PhoneNumber" => {
                let s = json_text(value).filter(|s| is_digits(s));
                out.phone = Some(s.ok_or("callback PhoneNumber must be digits")?);
            }
            "TransactionDate" => {
                let s = json_text(value).filter(|s| is_digits(s));
                out.transaction_date = Some(s.ok_or("callback TransactionDate must be digits")?);
            }
            _ => {}
        }
    }
    Ok(out)
}

fn is_digits(s: &str) -> bool {
    !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit())
}

/// An integer sent as a JSON number or a string of digits ("0", "1032").
fn json_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// A string, or a non-negative integer number written out (phones and dates arrive as numbers).
fn json_text(v: &Value) -> Option<String> {
    match v {
        Value::String(s) if !s.trim().is_empty() => Some(s.trim().to_string()),
        Value::Number(n) => n.as_u64().map(|u| u.to_string()),
        _ => None,
    }
}

/// Shillings (1, 1.0, 1.5, "1.00") → cents, exactly: no floating-point arithmetic.
fn amount_to_minor(v: &Value) -> Result<i64, String> {
    let text = match v {
        Value::Number(n) => n.to_string(),
        Value::String(s) => s.trim().to_string(),
        _ => return Err("must be a number".into()),
    };
    let (whole, frac) = text.split_once('.').unwrap_or((&text, ""));
    if !is_digits(whole) || !(frac.is_empty() || frac.bytes().all(|b| b.is_ascii_digit())) {
        return Err("must be a non-negative decimal with at most 2 decimals".into());
    }
    let frac = frac.trim_end_matches('0');
    if frac.len() > 2 {
        return Err("has more than 2 decimals".into());
    }
    let whole: i64 = whole.parse().map_err(|_| "is too large".to_string())?;
    let cents: i64 = format!("{frac:0<2}").parse().map_err(|_| "is not a decimal".to_string())?;
    whole.checked_mul(100).and_then(|w| w.checked_add(cents)).ok_or_else(|| "is too large".to_string())
}

// ---------------------------------------------------------------------------------------------
// Wire types (requests and responses)

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct StkPushRequest<'a> {
    business_short_code: &'a str,
    password: &'a str,
    timestamp: &'a str,
    transaction_type: &'a str,
    amount: i64,
    party_a: &'a str,
    party_b: &'a str,
    phone_number: &'a str,
    #[serde(rename = "CallBackURL")]
    callback_url: &'a str,
    account_reference: &'a str,
    transaction_desc: &'a str,
}

#[derive(Deserialize)]
struct StkPushResponse {
    #[serde(rename = "MerchantRequestID")]
    merchant_request_id: String,
    #[serde(rename = "CheckoutRequestID")]
    checkout_request_id: String,
    #[serde(rename = "ResponseCode")]
    response_code: Value,
    #[serde(rename = "ResponseDescription", default)]
    response_description: String,
    #[serde(rename = "CustomerMessage", default)]
    customer_message: String,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct StkQueryRequest<'a> {
    business_short_code: &'a str,
    password: &'a str,
    timestamp: &'a str,
    #[serde(rename = "CheckoutRequestID")]
    checkout_request_id: &'a str,
}

#[derive(Deserialize)]
struct StkQueryResponse {
    #[serde(rename = "ResponseCode")]
    response_code: Value,
    #[serde(rename = "ResponseDescription", default)]
    response_description: String,
    #[serde(rename = "ResultCode")]
    result_code: Option<Value>,
    #[serde(rename = "ResultDesc", default)]
    result_desc: String,
}

/// Daraja's error body: `{requestId, errorCode, errorMessage}`.
#[derive(Deserialize, Default)]
struct ErrorBody {
    #[serde(rename = "errorCode", default)]
    error_code: Option<String>,
    #[serde(rename = "errorMessage", default)]
    error_message: Option<String>,
}

#[derive(Deserialize)]
struct TokenResponse {
    access_token: String,
    /// Daraja sends a string ("3599"); accept a number too.
    expires_in: Value,
}

// ---------------------------------------------------------------------------------------------
// Client

/// A Daraja client: one reqwest client (timeouts set once) and a cached OAuth token. Cheap to clone.
#[derive(Clone)]
pub struct DarajaClient {
    inner: Arc<Inner>,
}

struct Inner {
    cfg: DarajaConfig,
    base: String,
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
    /// Held across a refresh so concurrent callers wait for one token fetch instead of stampeding.
    token: tokio::sync::Mutex<Option<CachedToken>>,
}

#[derive(Clone)]
struct CachedToken {
    token: Secret,
    /// Use until this instant (Daraja's expiry minus the refresh margin), by the injected clock.
    use_until: UnixSecs,
}

impl std::fmt::Debug for DarajaClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DarajaClient")
            .field("base_url", &self.inner.base)
            .field("short_code", &self.inner.cfg.short_code)
            .finish_non_exhaustive()
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Op {
    Push,
    Query,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Push => "stk_push",
            Op::Query => "stk_query",
        }
    }
}

/// An API answer, read in full (bounded).
struct Answer {
    status: reqwest::StatusCode,
    body: Vec<u8>,
}

impl DarajaClient {
    pub fn new(cfg: DarajaConfig, clock: Arc<dyn Clock>) -> Result<Self, DarajaError> {
        let base = cfg.base_url.trim_end_matches('/').to_string();
        if !(base.starts_with("https://") || base.starts_with("http://")) || base.contains(['?', '#']) {
            return Err(DarajaError::Config(format!("base_url must be an http(s) URL without query: {base:?}")));
        }
        if !(cfg.callback_url.starts_with("https://") || cfg.callback_url.starts_with("http://")) {
            return Err(DarajaError::Config("callback_url must be an http(s) URL".into()));
        }
        if !is_digits(&cfg.short_code) || !is_digits(&cfg.party_b) {
            return Err(DarajaError::Config("short_code and party_b must be digits".into()));
        }
        if cfg.transaction_type != TRANSACTION_TYPE_PAYBILL && cfg.transaction_type != TRANSACTION_TYPE_BUY_GOODS {
            return Err(DarajaError::Config(format!(
                "transaction_type must be {TRANSACTION_TYPE_PAYBILL} or {TRANSACTION_TYPE_BUY_GOODS}"
            )));
        }
        if cfg.consumer_key.expose().is_empty() || cfg.consumer_secret.expose().is_empty() {
            return Err(DarajaError::Config("consumer_key and consumer_secret must be set".into()));
        }
        if cfg.passkey.expose().is_empty() {
            return Err(DarajaError::Config("passkey must be set".into()));
        }
        if cfg.connect_timeout.is_zero() || cfg.request_timeout.is_zero() {
            return Err(DarajaError::Config("connect_timeout and request_timeout must be positive".into()));
        }
        if cfg.token_refresh_margin_secs < 0 {
            return Err(DarajaError::Config("token_refresh_margin_secs must not be negative".into()));
        }
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .connect_timeout(cfg.connect_timeout)
            .timeout(cfg.request_timeout)
            // A redirect would re-send credentials elsewhere; Daraja never redirects.
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| DarajaError::Config(format!("HTTP client: {e}")))?;
        Ok(DarajaClient { inner: Arc::new(Inner { cfg, base, http, clock, token: tokio::sync::Mutex::new(None) }) })
    }

    /// Sends the payment prompt. `Ok` means only *accepted*: the result arrives by callback or query.
    pub async fn stk_push(&self, push: &StkPush) -> Result<StkPushAccepted, DarajaError> {
        if push.amount_whole < 1 {
            return Err(invalid("Amount", "must be a whole number of shillings, at least 1"));
        }
        let account_reference = clean_text(&push.account_reference, ACCOUNT_REFERENCE_CHARS_MAX);
        if account_reference.is_empty() {
            return Err(invalid("AccountReference", "is empty"));
        }
        let description = clean_text(&push.description, TRANSACTION_DESC_CHARS_MAX);
        if description.is_empty() {
            return Err(invalid("TransactionDesc", "is empty"));
        }
        let cfg = &self.inner.cfg;
        let timestamp = timestamp_eat(self.inner.clock.now());
        let password = password(&cfg.short_code, cfg.passkey.expose(), &timestamp);
        let body = StkPushRequest {
            business_short_code: &cfg.short_code,
            password: &password,
            timestamp: &timestamp,
            transaction_type: &cfg.transaction_type,
            amount: push.amount_whole,
            party_a: push.phone.as_str(),
            party_b: &cfg.party_b,
            phone_number: push.phone.as_str(),
            callback_url: &cfg.callback_url,
            account_reference: &account_reference,
            transaction_desc: &description,
        };
        let answer = self.call(Op::Push, "/mpesa/stkpush/v1/processrequest", &body).await?;
        if answer.status.is_success() {
            let ok: StkPushResponse = serde_json::from_slice(&answer.body).map_err(|_| {
                DarajaError::OutcomeUnknown(format!("stk push: unparseable success body (HTTP {})", answer.status))
            })?;
            let code = code_text(&ok.response_code);
            if code != "0" {
                return Err(DarajaError::Rejected { code, message: ok.response_description });
            }
            if ok.checkout_request_id.is_empty() {
                return Err(DarajaError::OutcomeUnknown("stk push: accepted without a CheckoutRequestID".into()));
            }
            tracing::debug!(daraja.checkout_request_id = %ok.checkout_request_id, "daraja accepted stk push");
            return Ok(StkPushAccepted {
                merchant_request_id: ok.merchant_request_id,
                checkout_request_id: ok.checkout_request_id,
                customer_message: ok.customer_message,
            });
        }
        Err(self.error_answer(Op::Push, &answer))
    }

    /// Asks Daraja for a push's result. Read-only, so a timeout or 5xx is `Unavailable` (ask again
    /// later), and `Rejected` means only that this *query* was refused (e.g. an unknown
    /// CheckoutRequestID), never that the payment failed.
    pub async fn stk_query(&self, checkout_request_id: &str) -> Result<StkQueryOutcome, DarajaError> {
        if checkout_request_id.is_empty() || checkout_request_id.chars().any(char::is_control) {
            return Err(invalid("CheckoutRequestID", "is empty or contains control characters"));
        }
        let cfg = &self.inner.cfg;
        let timestamp = timestamp_eat(self.inner.clock.now());
        let password = password(&cfg.short_code, cfg.passkey.expose(), &timestamp);
        let body = StkQueryRequest {
            business_short_code: &cfg.short_code,
            password: &password,
            timestamp: &timestamp,
            checkout_request_id,
        };
        let answer = self.call(Op::Query, "/mpesa/stkpushquery/v1/query", &body).await?;
        if answer.status.is_success() {
            let unparseable =
                || DarajaError::Unavailable(format!("stk query: unparseable success body (HTTP {})", answer.status));
            let ok: StkQueryResponse = serde_json::from_slice(&answer.body).map_err(|_| unparseable())?;
            let code = code_text(&ok.response_code);
            if code != "0" {
                return Err(DarajaError::Rejected { code, message: ok.response_description });
            }
            let result_code = ok.result_code.as_ref().and_then(json_int).ok_or_else(unparseable)?;
            return Ok(StkQueryOutcome::Completed { result_code, result_desc: ok.result_desc });
        }
        let err = parse_error_body(&answer.body);
        if err.error_code.as_deref() == Some(ERROR_CODE_PROCESSING)
            && err.error_message.as_deref().is_some_and(|m| m.to_ascii_lowercase().contains("being processed"))
        {
            return Ok(StkQueryOutcome::Pending);
        }
        Err(self.error_answer(Op::Query, &answer))
    }

    /// Sends one API request with the cached token; on a 401 (or Daraja's invalid-token code) drops
    /// the token, fetches a new one and sends once more. The token was refused at Daraja's gateway,
    /// so nothing was processed and the retry cannot double a push.
    async fn call<T: Serialize>(&self, op: Op, path: &str, body: &T) -> Result<Answer, DarajaError> {
        let url = format!("{}{path}", self.inner.base);
        let mut refreshed = false;
        loop {
            let token = self.token().await?;
            let sent = self.inner.http.post(&url).bearer_auth(token.expose()).json(body).send().await;
            let mut resp = sent.map_err(|e| send_error(op, &e))?;
            let status = resp.status();
            let body = read_body(&mut resp).await.map_err(|why| match op {
                Op::Push => DarajaError::OutcomeUnknown(format!("stk push: {why} (HTTP {status})")),
                Op::Query => DarajaError::Unavailable(format!("stk query: {why} (HTTP {status})")),
            })?;
            let answer = Answer { status, body };
            if token_refused(&answer) {
                self.forget_token(&token).await;
                if !refreshed {
                    tracing::debug!(daraja.op = op.as_str(), "daraja refused the access token; refreshing once");
                    refreshed = true;
                    continue;
                }
            }
            return Ok(answer);
        }
    }

    /// A non-2xx answer → the error it means for this operation.
    fn error_answer(&self, op: Op, answer: &Answer) -> DarajaError {
        let status = answer.status;
        let err = parse_error_body(&answer.body);
        let code = err.error_code.clone().unwrap_or_else(|| format!("http_{}", status.as_u16()));
        let message = err
            .error_message
            .clone()
            .unwrap_or_else(|| status.canonical_reason().map_or_else(|| format!("HTTP {status}"), str::to_string));
        tracing::debug!(daraja.op = op.as_str(), http.status = status.as_u16(), daraja.error_code = %code, "daraja error");
        let what = op.as_str();
        if token_refused(answer) {
            return DarajaError::Unavailable(format!("{what}: access token refused twice ({code}: {message})"));
        }
        if status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || status == reqwest::StatusCode::SERVICE_UNAVAILABLE
            || ERROR_CODES_GATEWAY_REFUSAL.contains(&code.as_str())
        {
            return DarajaError::Unavailable(format!("{what}: HTTP {status} {code}: {message}"));
        }
        if status.is_client_error() {
            return DarajaError::Rejected { code, message };
        }
        match op {
            // A 5xx (or anything unexpected) after Daraja read the push: it may have been processed.
            Op::Push => DarajaError::OutcomeUnknown(format!("{what}: HTTP {status} {code}: {message}")),
            Op::Query => DarajaError::Unavailable(format!("{what}: HTTP {status} {code}: {message}")),
        }
    }

    /// Ask Daraja for a fresh OAuth token with the configured app credentials (`paygate doctor`).
    /// The token itself is dropped, never shown.
    pub async fn check_credentials(&self) -> Result<(), DarajaError> {
        self.fetch_token().await.map(drop)
    }

    /// The cached token, or a fresh one. Callers arriving during a fetch wait for it.
    async fn token(&self) -> Result<Secret, DarajaError> {
        let mut guard = self.inner.token.lock().await;
        let now = self.inner.clock.now();
        if let Some(t) = guard.as_ref().filter(|t| now < t.use_until) {
            return Ok(t.token.clone());
        }
        *guard = None;
        let fresh = self.fetch_token().await?;
        let token = fresh.token.clone();
        *guard = Some(fresh);
        Ok(token)
    }

    /// Drops the cached token if it is still the one that was refused (another caller may have
    /// refreshed it already).
    async fn forget_token(&self, refused: &Secret) {
        let mut guard = self.inner.token.lock().await;
        if guard.as_ref().is_some_and(|t| t.token == *refused) {
            *guard = None;
        }
    }

    async fn fetch_token(&self) -> Result<CachedToken, DarajaError> {
        let cfg = &self.inner.cfg;
        let url = format!("{}/oauth/v1/generate?grant_type=client_credentials", self.inner.base);
        let unavailable = |why: String| {
            tracing::warn!(error = %why, "daraja token fetch failed");
            DarajaError::Unavailable(format!("oauth: {why}"))
        };
        let mut resp = self
            .inner
            .http
            .get(&url)
            .basic_auth(cfg.consumer_key.expose(), Some(cfg.consumer_secret.expose()))
            .send()
            .await
            .map_err(|e| unavailable(describe_send_error(&e)))?;
        let status = resp.status();
        // The body is not quoted in errors: only the status and a fixed text.
        let body = read_body(&mut resp).await.map_err(|why| unavailable(format!("{why} (HTTP {status})")))?;
        if !status.is_success() {
            return Err(unavailable(format!("token request refused (HTTP {status})")));
        }
        let parsed: TokenResponse = serde_json::from_slice(&body)
            .map_err(|_| unavailable(format!("unparseable token response (HTTP {status})")))?;
        if parsed.access_token.is_empty() {
            return Err(unavailable("empty access_token".into()));
        }
        let expires_in_secs = json_int(&parsed.expires_in)
            .filter(|s| *s > 0)
            .ok_or_else(|| unavailable("expires_in is not a positive integer".into()))?;
        let lifetime_secs = expires_in_secs.saturating_sub(cfg.token_refresh_margin_secs).max(0);
        tracing::debug!(daraja.token_lifetime_secs = lifetime_secs, "fetched daraja access token");
        Ok(CachedToken {
            token: Secret::new(parsed.access_token),
            use_until: self.inner.clock.now().saturating_add(lifetime_secs),
        })
    }
}

fn invalid(field: &str, why: &str) -> DarajaError {
    DarajaError::Rejected { code: "paygate.invalid_request".into(), message: format!("{field} {why}") }
}

/// Control characters removed, whitespace trimmed, cut to `chars_max` characters.
fn clean_text(s: &str, chars_max: usize) -> String {
    let cleaned: String = s.chars().filter(|c| !c.is_control()).collect();
    let cut: String = cleaned.trim().chars().take(chars_max).collect();
    cut.trim_end().to_string()
}

/// `ResponseCode` arrives as "0"; tolerate a number.
fn code_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.trim().to_string(),
        other => other.to_string(),
    }
}

fn parse_error_body(body: &[u8]) -> ErrorBody {
    serde_json::from_slice(body).unwrap_or_default()
}

fn token_refused(answer: &Answer) -> bool {
    answer.status == reqwest::StatusCode::UNAUTHORIZED
        || (answer.status.is_client_error()
            && parse_error_body(&answer.body).error_code.as_deref() == Some(ERROR_CODE_INVALID_TOKEN))
}

/// A failed send. A connect error means no byte of the request left; anything else (timeout after
/// connecting, reset mid-response) may have reached Daraja.
fn send_error(op: Op, e: &reqwest::Error) -> DarajaError {
    let why = format!("{}: {}", op.as_str(), describe_send_error(e));
    if e.is_connect() {
        return DarajaError::Unavailable(why);
    }
    match op {
        Op::Push => DarajaError::OutcomeUnknown(why),
        Op::Query => DarajaError::Unavailable(why),
    }
}

fn describe_send_error(e: &reqwest::Error) -> String {
    if e.is_connect() {
        format!("could not connect ({})", source_chain(e))
    } else if e.is_timeout() {
        "timed out waiting for the answer".to_string()
    } else {
        format!("request failed ({})", source_chain(e))
    }
}

/// The error's source chain without the URL (reqwest's own Display repeats it).
fn source_chain(e: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    if parts.is_empty() { "no detail".to_string() } else { parts.join(": ") }
}

/// Reads the whole body, at most [`RESPONSE_BYTES_MAX`].
async fn read_body(resp: &mut reqwest::Response) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > RESPONSE_BYTES_MAX {
                    return Err(format!("response larger than {RESPONSE_BYTES_MAX} bytes"));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) if e.is_timeout() => return Err("timed out reading the answer".into()),
            Err(e) => return Err(format!("connection lost reading the answer ({})", source_chain(&e))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_phone_accepts_kenyan_forms() {
        for input in ["0712345678", "712345678", "254712345678", "+254712345678", "+254 712-345-678", "0712 345 678"] {
            assert_eq!(normalize_phone(input).unwrap().as_str(), "254712345678", "{input}");
        }
        for input in ["0110345678", "110345678", "254110345678", "+254110345678"] {
            assert_eq!(normalize_phone(input).unwrap().as_str(), "254110345678", "{input}");
        }
        assert_eq!(normalize_phone("0712345678").unwrap().to_string(), "254712345678");
    }

    #[test]
    fn normalize_phone_rejects_everything_else() {
        for input in [
            "",
            "   ",
            "0812345678",
            "071234567",
            "07123456789",
            "+1 712345678",
            "+0712345678",
            "254812345678",
            "2547123456789",
            "07a2345678",
            "(0712)345678",
            "++254712345678",
            "0712345678\n",
        ] {
            let err = normalize_phone(input).unwrap_err();
            assert!(err.contains("0712345678"), "{input:?}: {err}");
        }
    }

    #[test]
    fn password_matches_daraja_docs_example() {
        let p =
            password("174379", "bfb279f9aa9bdbcf158e97dd71a467cd2e0c893059b10f78e6b72ada1ed2c919", "20160216165627");
        assert_eq!(
            p,
            "MTc0Mzc5YmZiMjc5ZjlhYTliZGJjZjE1OGU5N2RkNzFhNDY3Y2QyZTBjODkzMDU5YjEwZjc4ZTZiNzJhZGExZWQyYzkxOTIwMTYwMjE2MTY1NjI3"
        );
    }

    #[test]
    fn timestamp_is_east_africa_time() {
        // 2019-12-19T07:21:15Z is 10:21:15 in Nairobi.
        assert_eq!(timestamp_eat(1_576_740_075), "20191219102115");
        // 22:30 UTC on 31 December is already the next year in Nairobi.
        assert_eq!(timestamp_eat(1_704_061_800), "20240101013000");
        assert_eq!(timestamp_eat(0), "19700101030000");
    }

    fn callback_json(amount: &str) -> String {
        format!(
            r#"{{"Body":{{"stkCallback":{{"MerchantRequestID":"29115-34620561-1","CheckoutRequestID":"ws_CO_191220191020363925",
            "ResultCode":0,"ResultDesc":"The service request is processed successfully.",
            "CallbackMetadata":{{"Item":[{{"Name":"Amount","Value":{amount}}},{{"Name":"MpesaReceiptNumber","Value":"NLJ7RT61SV"}},
            {{"Name":"Balance"}},{{"Name":"TransactionDate","Value":20191219102115}},{{"Name":"PhoneNumber","Value":254708374149}}]}}}}}}}}"#
        )
    }

    #[test]
    fn parse_callback_success_amount_forms() {
        for amount in ["1", "1.0", "1.00", r#""1.00""#, r#""1""#] {
            let cb = parse_callback(callback_json(amount).as_bytes()).unwrap();
            assert_eq!(cb.amount_minor, Some(100), "{amount}");
            assert_eq!(cb.result_code, 0);
            assert_eq!(cb.merchant_request_id, "29115-34620561-1");
            assert_eq!(cb.checkout_request_id, "ws_CO_191220191020363925");
            assert_eq!(cb.receipt.as_deref(), Some("NLJ7RT61SV"));
            assert_eq!(cb.phone.as_deref(), Some("254708374149"));
            assert_eq!(cb.transaction_date.as_deref(), Some("20191219102115"));
        }
        let cb = parse_callback(callback_json("150.5").as_bytes()).unwrap();
        assert_eq!(cb.amount_minor, Some(15050));
        for bad in ["1.005", "-1", r#""abc""#, "true", r#""1e3""#] {
            let err = parse_callback(callback_json(bad).as_bytes()).unwrap_err();
            assert!(err.contains("Amount"), "{bad}: {err}");
        }
    }

    #[test]
    fn parse_callback_items_without_value() {
        let body = br#"{"Body":{"stkCallback":{"MerchantRequestID":"m","CheckoutRequestID":"c","ResultCode":0,
            "ResultDesc":"ok","CallbackMetadata":{"Item":[{"Name":"Amount","Value":5},{"Name":"MpesaReceiptNumber"},
            {"Name":"PhoneNumber","Value":"254712345678"}]}}}}"#;
        let cb = parse_callback(body).unwrap();
        assert_eq!(cb.amount_minor, Some(500));
        assert_eq!(cb.receipt, None);
        assert_eq!(cb.phone.as_deref(), Some("254712345678"));
        assert_eq!(cb.transaction_date, None);
    }

    #[test]
    fn parse_callback_failure_without_metadata() {
        let body = br#"{"Body":{"stkCallback":{"MerchantRequestID":"29115-34620561-1",
            "CheckoutRequestID":"ws_CO_191220191020363925","ResultCode":1032,"ResultDesc":"Request cancelled by user"}}}"#;
        let cb = parse_callback(body).unwrap();
        assert_eq!(cb.result_code, 1032);
        assert_eq!(cb.result_desc, "Request cancelled by user");
        assert_eq!((cb.amount_minor, cb.receipt, cb.phone, cb.transaction_date), (None, None, None, None));
        assert_eq!(failure_reason(cb.result_code), Some("cancelled by the customer"));
    }

    #[test]
    fn parse_callback_rejects_malformed() {
        let cases: [(&[u8], &str); 6] = [
            (b"{not json", "not valid JSON"),
            (b"{}", "Body.stkCallback"),
            (br#"{"Body":{"stkCallback":{"CheckoutRequestID":"c","ResultCode":0,"ResultDesc":"x"}}}"#, "MerchantRequestID"),
            (
                br#"{"Body":{"stkCallback":{"MerchantRequestID":"m","CheckoutRequestID":"c","ResultCode":"x","ResultDesc":"d"}}}"#,
                "ResultCode",
            ),
            (br#"{"Body":{"stkCallback":{"MerchantRequestID":"m","CheckoutRequestID":"c","ResultDesc":"d"}}}"#, "ResultCode"),
            (
                br#"{"Body":{"stkCallback":{"MerchantRequestID":"m","CheckoutRequestID":"c","ResultCode":0,"ResultDesc":"d","CallbackMetadata":{}}}}"#,
                "Item",
            ),
        ];
        for (body, needle) in cases {
            let err = parse_callback(body).unwrap_err();
            assert!(err.contains(needle), "{}: {err}", String::from_utf8_lossy(body));
        }
    }

    #[test]
    fn failure_reasons() {
        assert_eq!(failure_reason(RESULT_CODE_SUCCESS), None);
        assert_eq!(failure_reason(4999), None);
        assert_eq!(failure_reason(123_456), None);
        for code in [1, 17, 1001, 1019, 1025, 1032, 1037, 2001, 2028, 8006, 9999] {
            assert!(failure_reason(code).is_some(), "{code}");
        }
    }

    #[test]
    fn clean_text_strips_controls_and_truncates_by_chars() {
        assert_eq!(clean_text("  INV\n-2024-000123-LONG ", ACCOUNT_REFERENCE_CHARS_MAX), "INV-2024-000");
        assert_eq!(clean_text("Malipo ya ñéü café ☕ long", TRANSACTION_DESC_CHARS_MAX), "Malipo ya ñéü");
        assert_eq!(clean_text("\u{7}\t", 12), "");
    }
}
