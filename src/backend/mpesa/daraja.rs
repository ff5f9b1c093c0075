//! Safaricom Daraja (M-Pesa Express / STK push): the wire types and an HTTP client for them.
//!
//! Architecture Invariant: Daraja's JSON shapes live only in this file. Callers see [`StkPush`],
//! [`StkPushAccepted`], [`StkQueryOutcome`], [`StkCallback`] and [`DarajaError`], whose three failure
//! kinds say what the caller may conclude about money: `Rejected` (Daraja refused, nothing started),
//! `Unavailable` (the request was not processed; safe to try again) and `OutcomeUnknown` (it may have
//! been processed; keep the payment pending and reconcile by callback or query).
//!
//! Daraja has no idempotency key: a push retried after an unknown outcome may prompt the customer
//! (or pay a payee) twice, so this client retries a request only when it certainly was not
//! processed: after a 401 (refused at Daraja's gateway), and — at most `retries_max` times, after a
//! jittered backoff — after a transient failure that is also quick (no connection, HTTP 429 or 503,
//! a spike-arrest refusal). A timeout is never retried here: for a money-moving request it is an
//! unknown outcome. A circuit breaker fails fast while Daraja keeps failing.
//!
//! Payouts (B2C), reversals and transaction-status queries are asynchronous at Daraja: the answer
//! only says *accepted*, and the result is posted to `result_url` ([`parse_result`]).

use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::backend::breaker::Breaker;
use crate::backend::outbound::{
    self, Answer, CachedToken, Counted, RESPONSE_BYTES_MAX, Retries, TokenCache, clean_text, code_text,
    describe_send_error, http_client, json_int, read_body, send_with_retries, with_token,
};
pub use crate::backend::outbound::{RETRIES_MAX_LIMIT, RETRY_BACKOFF_MAX};
use crate::clock::{Clock, UnixSecs};
use crate::secret::Secret;

pub const SANDBOX_BASE_URL: &str = "https://sandbox.safaricom.co.ke";
pub const PRODUCTION_BASE_URL: &str = "https://api.safaricom.co.ke";
/// Daraja rejects a longer `AccountReference`.
pub const ACCOUNT_REFERENCE_CHARS_MAX: usize = 12;
/// Daraja rejects a longer `TransactionDesc`.
pub const TRANSACTION_DESC_CHARS_MAX: usize = 13;
/// East Africa Time is UTC+3 all year (no daylight saving).
const EAT_OFFSET_SECS: i64 = 3 * 3600;

pub const TRANSACTION_TYPE_PAYBILL: &str = "CustomerPayBillOnline";
pub const TRANSACTION_TYPE_BUY_GOODS: &str = "CustomerBuyGoodsOnline";

/// ResultCode of a completed, successful STK transaction.
pub const RESULT_CODE_SUCCESS: i64 = 0;
/// ResultCode of an STK transaction M-Pesa is still processing: not an answer yet.
pub const RESULT_CODE_STILL_PROCESSING: i64 = 4999;

/// Daraja's `errorCode` for "The transaction is being processed" (query while the prompt is open).
/// The same code also means "wrong credentials / subscriber locked", so the message is checked too.
const ERROR_CODE_PROCESSING: &str = "500.001.1001";
/// Daraja's `errorCode` for an invalid or expired access token (sent with HTTP 401 or 404).
const ERROR_CODE_INVALID_TOKEN: &str = "404.001.03";
/// Spike arrest and quota violations: refused at Daraja's API gateway, before the request is processed.
const ERROR_CODES_GATEWAY_REFUSAL: [&str; 2] = ["500.003.02", "500.003.03"];
/// Daraja rejects longer `Remarks` and `Occasion`.
pub const REMARKS_CHARS_MAX: usize = 100;
/// `CommandID` of a payout to a customer.
const COMMAND_BUSINESS_PAYMENT: &str = "BusinessPayment";
/// `CommandID`s of a payment to a business: to a paybill (with an account reference), to a till.
const COMMAND_BUSINESS_PAY_BILL: &str = "BusinessPayBill";
const COMMAND_BUSINESS_BUY_GOODS: &str = "BusinessBuyGoods";
/// Daraja rejects a longer B2B `AccountReference`.
pub const B2B_ACCOUNT_REFERENCE_CHARS_MAX: usize = 13;
const COMMAND_REVERSAL: &str = "TransactionReversal";
const COMMAND_STATUS: &str = "TransactionStatusQuery";
/// `IdentifierType` / `RecieverIdentifierType` of a short code (organisation).
const IDENTIFIER_SHORT_CODE: &str = "4";
const IDENTIFIER_REVERSAL_RECEIVER: &str = "11";

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
    /// Where Daraja posts the results of payouts, reversals and status queries (unsigned, like
    /// `callback_url`), and where it reports a request that timed out in its queue.
    pub result_url: String,
    pub timeout_url: String,
    /// The API operator ("initiator") for payouts, reversals and status queries, and its password
    /// encrypted with Safaricom's certificate (made on the Daraja portal). Empty: none are offered.
    pub initiator_name: String,
    pub security_credential: Secret,
    /// PartyA of payouts (the B2C short code).
    pub b2c_short_code: String,
    /// Retries of a request that certainly was not processed and failed quickly (0 ..= 5).
    pub retries_max: u32,
    /// Consecutive failed requests that open the circuit, and how long it stays open.
    pub breaker_failures_max: u32,
    pub breaker_open: Duration,
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

pub use crate::backend::kenya::Msisdn;

/// Accepts `07XXXXXXXX`, `01XXXXXXXX`, `7XXXXXXXX`, `1XXXXXXXX`, `2547…`, `2541…`, `+2547…`, `+2541…`;
/// spaces and dashes are ignored.
pub fn normalize_phone(input: &str) -> Result<Msisdn, String> {
    const EXPECTED: &str = "expected a Kenyan mobile number such as 0712345678, 712345678 or 254712345678";
    let subscriber = crate::backend::kenya::subscriber(input, EXPECTED)?;
    if !(subscriber.starts_with('7') || subscriber.starts_with('1')) {
        return Err(format!("not a Kenyan mobile number (must start 07, 01, 2547 or 2541): {EXPECTED}"));
    }
    Ok(Msisdn::from_subscriber(&subscriber))
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

/// One payout (B2C `BusinessPayment`) to a customer's phone.
#[derive(Debug, Clone)]
pub struct B2cPayment {
    /// The gateway's own id for the request, chosen before sending: Daraja echoes it in the result,
    /// and a status query can ask by it even when the answer to the request was lost.
    pub originator_conversation_id: String,
    pub phone: Msisdn,
    /// Whole shillings, at least 1.
    pub amount_whole: i64,
    /// Cut to [`REMARKS_CHARS_MAX`] characters, control characters removed.
    pub remarks: String,
}

/// One payment to a business (B2B `BusinessPayBill` / `BusinessBuyGoods`) from the business's own
/// short code.
#[derive(Debug, Clone)]
pub struct B2bPayment {
    /// The gateway's own id, as for [`B2cPayment`]: sent as `OriginatorConversationID` and as
    /// `Occassion`, so the result and a status query find the payment even when the answer to the
    /// request was lost.
    pub originator_conversation_id: String,
    /// A paybill (with its account reference) or a till.
    pub to: BusinessTo,
    /// Whole shillings, at least 1.
    pub amount_whole: i64,
    /// Cut to [`REMARKS_CHARS_MAX`] characters, control characters removed.
    pub remarks: String,
}

/// The business a [`B2bPayment`] pays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BusinessTo {
    Paybill { number: String, account_reference: String },
    Till { number: String },
}

/// The reversal of a completed customer payment (a collection), in full.
#[derive(Debug, Clone)]
pub struct Reversal {
    /// The M-Pesa receipt (TransactionID) of the payment to reverse.
    pub transaction_id: String,
    pub amount_whole: i64,
    pub remarks: String,
    /// Echoed in the result's reference data.
    pub occasion: String,
}

/// Which of the business's short codes sent the transaction a status query asks about.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sender {
    /// Payouts to customers and reversals: [`DarajaConfig::b2c_short_code`].
    Payouts,
    /// Payments to businesses: [`DarajaConfig::short_code`].
    Business,
}

/// Daraja accepted an asynchronous request; its result is posted to `result_url`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestAccepted {
    pub conversation_id: String,
    pub originator_conversation_id: String,
}

/// A result Daraja posts to `result_url` (or `timeout_url`): of a payout, a reversal or a
/// transaction-status query. Unsigned, like the STK callback.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ApiResult {
    /// "0" is success; codes may be numbers or text ("R000002").
    pub result_code: String,
    pub result_desc: String,
    pub originator_conversation_id: String,
    pub conversation_id: String,
    pub transaction_id: Option<String>,
    /// `TransactionAmount` (payout) or `Amount` (reversal, status), in cents.
    pub amount_minor: Option<i64>,
    /// `TransactionReceipt` (payout) or `ReceiptNo` (status); else the `TransactionID` of a success.
    pub receipt: Option<String>,
    /// The customer's number: the digits before " - " in `ReceiverPartyPublicName` (payout) or
    /// `CreditPartyPublicName` / `CreditPartyName` (reversal, status).
    pub party: Option<String>,
    /// `TransactionStatus` of a status query's result ("Completed", "Failed", ...).
    pub transaction_status: Option<String>,
    /// `Occasion` from the reference data: the gateway's reference on status queries and reversals.
    pub occasion: Option<String>,
}

/// Parses `{"Result":{…}}`. Strict on the fields every result has; `ResultParameters` and
/// `ReferenceData` items are found by `Key` (a lone item may arrive as an object, not an array).
pub fn parse_result(body: &[u8]) -> Result<ApiResult, String> {
    let root: Value = serde_json::from_slice(body).map_err(|e| format!("result is not valid JSON: {e}"))?;
    let r = root.get("Result").and_then(Value::as_object).ok_or("result has no Result object")?;
    let text = |name: &str, required: bool| -> Result<Option<String>, String> {
        match r.get(name) {
            Some(v) => match json_text(v) {
                Some(s) => Ok(Some(s)),
                None if v.is_null() && !required => Ok(None),
                None => Err(format!("result field {name} must be a non-empty string or number")),
            },
            None if required => Err(format!("result field {name} is missing")),
            None => Ok(None),
        }
    };
    let result_code = match r.get("ResultCode") {
        Some(Value::Number(n)) => n.to_string(),
        Some(Value::String(s)) if !s.trim().is_empty() => s.trim().to_string(),
        Some(_) => return Err("result field ResultCode must be a number or a code".into()),
        None => return Err("result field ResultCode is missing".into()),
    };
    let result_desc = match r.get("ResultDesc") {
        Some(Value::String(s)) => s.clone(),
        Some(_) => return Err("result field ResultDesc must be a string".into()),
        None => return Err("result field ResultDesc is missing".into()),
    };
    let mut out = ApiResult {
        result_code,
        result_desc,
        originator_conversation_id: text("OriginatorConversationID", true)?.unwrap_or_default(),
        conversation_id: text("ConversationID", true)?.unwrap_or_default(),
        transaction_id: text("TransactionID", false)?,
        amount_minor: None,
        receipt: None,
        party: None,
        transaction_status: None,
        occasion: None,
    };
    for (key, value) in keyed_items(r.get("ResultParameters"), "ResultParameter")? {
        match key {
            "TransactionAmount" | "Amount" => {
                out.amount_minor = Some(amount_to_minor(value).map_err(|e| format!("result {key} {value}: {e}"))?);
            }
            "TransactionReceipt" | "ReceiptNo" => out.receipt = json_text(value),
            "ReceiverPartyPublicName" | "CreditPartyPublicName" | "CreditPartyName" => {
                out.party = json_text(value).and_then(|s| {
                    let digits = s.split(" - ").next().unwrap_or_default().trim().to_string();
                    is_digits(&digits).then_some(digits)
                });
            }
            "TransactionStatus" => out.transaction_status = json_text(value),
            _ => {}
        }
    }
    for (key, value) in keyed_items(r.get("ReferenceData"), "ReferenceItem")? {
        if key == "Occasion" || key == "Occassion" {
            out.occasion = json_text(value);
        }
    }
    if out.result_code == "0" && out.receipt.is_none() {
        out.receipt = out.transaction_id.clone().filter(|t| !t.is_empty());
    }
    Ok(out)
}

/// `{"<item>": [{"Key": k, "Value": v}, …]}` or `{"<item>": {"Key": k, "Value": v}}`; items
/// without a value are skipped.
fn keyed_items<'a>(holder: Option<&'a Value>, item: &str) -> Result<Vec<(&'a str, &'a Value)>, String> {
    let items: Vec<&Value> = match holder.and_then(|h| h.get(item)) {
        None | Some(Value::Null) => return Ok(vec![]),
        Some(Value::Array(a)) => a.iter().collect(),
        Some(o @ Value::Object(_)) => vec![o],
        Some(_) => return Err(format!("result {item} must be an object or an array")),
    };
    let mut out = Vec::with_capacity(items.len());
    for i in items {
        let key = i.get("Key").and_then(Value::as_str).ok_or_else(|| format!("result {item} without a Key"))?;
        if let Some(v) = i.get("Value").filter(|v| !v.is_null()) {
            out.push((key, v));
        }
    }
    Ok(out)
}

/// Known failure ResultCodes of payouts and reversals → a human reason; `None` for success and
/// unknown codes (kept pending for reconciliation, never guessed).
pub fn result_failure_reason(result_code: i64) -> Option<&'static str> {
    match result_code {
        1 => Some("insufficient funds in the business's M-Pesa account"),
        11 => Some("the business's M-Pesa account is not in a state to pay"),
        17 => Some("M-Pesa rule limit: same amount to the same customer within 2 minutes"),
        21 => Some("the initiator is not allowed to make this request"),
        2001 => Some("the initiator information is invalid"),
        2028 => Some("the request is not permitted for this product or short code"),
        2040 => Some("the customer's M-Pesa account cannot receive this payment"),
        8006 => Some("the initiator's security credential is locked"),
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

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct B2bRequest<'a> {
    #[serde(rename = "OriginatorConversationID")]
    originator_conversation_id: &'a str,
    initiator: &'a str,
    security_credential: &'a str,
    #[serde(rename = "CommandID")]
    command_id: &'a str,
    sender_identifier_type: &'a str,
    /// Daraja's spelling.
    reciever_identifier_type: &'a str,
    amount: i64,
    party_a: &'a str,
    party_b: &'a str,
    account_reference: &'a str,
    remarks: &'a str,
    #[serde(rename = "QueueTimeOutURL")]
    queue_timeout_url: &'a str,
    #[serde(rename = "ResultURL")]
    result_url: &'a str,
    /// Daraja's spelling.
    occassion: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct B2cRequest<'a> {
    #[serde(rename = "OriginatorConversationID")]
    originator_conversation_id: &'a str,
    initiator_name: &'a str,
    security_credential: &'a str,
    #[serde(rename = "CommandID")]
    command_id: &'a str,
    amount: i64,
    party_a: &'a str,
    party_b: &'a str,
    remarks: &'a str,
    #[serde(rename = "QueueTimeOutURL")]
    queue_timeout_url: &'a str,
    #[serde(rename = "ResultURL")]
    result_url: &'a str,
    /// Daraja's spelling.
    occassion: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct ReversalRequest<'a> {
    initiator: &'a str,
    security_credential: &'a str,
    #[serde(rename = "CommandID")]
    command_id: &'a str,
    #[serde(rename = "TransactionID")]
    transaction_id: &'a str,
    amount: i64,
    receiver_party: &'a str,
    /// Daraja's spelling.
    reciever_identifier_type: &'a str,
    #[serde(rename = "ResultURL")]
    result_url: &'a str,
    #[serde(rename = "QueueTimeOutURL")]
    queue_timeout_url: &'a str,
    remarks: &'a str,
    occasion: &'a str,
}

#[derive(Serialize)]
#[serde(rename_all = "PascalCase")]
struct StatusRequest<'a> {
    initiator: &'a str,
    security_credential: &'a str,
    #[serde(rename = "CommandID")]
    command_id: &'a str,
    /// Empty: the request is found by `OriginatorConversationID`.
    #[serde(rename = "TransactionID")]
    transaction_id: &'a str,
    #[serde(rename = "OriginatorConversationID")]
    originator_conversation_id: &'a str,
    party_a: &'a str,
    identifier_type: &'a str,
    #[serde(rename = "ResultURL")]
    result_url: &'a str,
    #[serde(rename = "QueueTimeOutURL")]
    queue_timeout_url: &'a str,
    remarks: &'a str,
    occasion: &'a str,
}

/// The synchronous answer of an asynchronous API: accepted or not.
#[derive(Deserialize)]
struct AcceptedResponse {
    #[serde(rename = "ConversationID", default)]
    conversation_id: String,
    #[serde(rename = "OriginatorConversationID", default)]
    originator_conversation_id: String,
    #[serde(rename = "ResponseCode")]
    response_code: Value,
    #[serde(rename = "ResponseDescription", default)]
    response_description: String,
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

/// Daraja's answer to a status query while the customer's prompt is still open: HTTP 500 with
/// `errorCode` 500.001.1001 "The transaction is being processed". A state of one payment (pending),
/// not a failure of Daraja.
fn still_processing(answer: &Answer) -> bool {
    let err = parse_error_body(&answer.body);
    err.error_code.as_deref() == Some(ERROR_CODE_PROCESSING)
        && err.error_message.as_deref().is_some_and(|m| m.to_ascii_lowercase().contains("being processed"))
}

struct Inner {
    cfg: DarajaConfig,
    base: String,
    http: reqwest::Client,
    clock: Arc<dyn Clock>,
    token: TokenCache,
    /// One breaker per endpoint (`Op::ALL` order): status queries failing never stop pushes or
    /// payouts, nor the other way round.
    breakers: Vec<Breaker>,
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
    Payout,
    Business,
    Reversal,
    Status,
}

impl Op {
    /// Every endpoint, in declaration order (`op as usize` indexes the breakers).
    const ALL: [Op; 6] = [Op::Push, Op::Query, Op::Payout, Op::Business, Op::Reversal, Op::Status];

    /// The endpoint's breaker, as named in logs.
    fn breaker_name(self) -> &'static str {
        match self {
            Op::Push => "daraja stk_push",
            Op::Query => "daraja stk_query",
            Op::Payout => "daraja b2c_payment",
            Op::Business => "daraja b2b_payment",
            Op::Reversal => "daraja reversal",
            Op::Status => "daraja transaction_status",
        }
    }

    fn as_str(self) -> &'static str {
        match self {
            Op::Push => "stk_push",
            Op::Query => "stk_query",
            Op::Payout => "b2c_payment",
            Op::Business => "b2b_payment",
            Op::Reversal => "reversal",
            Op::Status => "transaction_status",
        }
    }
    /// Whether Daraja processing it may move money: then a failure after sending is an unknown
    /// outcome, never "unavailable".
    fn moves_money(self) -> bool {
        match self {
            Op::Push | Op::Payout | Op::Business | Op::Reversal => true,
            Op::Query | Op::Status => false,
        }
    }
    /// The error for a failure after the request may have reached Daraja.
    fn after_sending(self, why: String) -> DarajaError {
        if self.moves_money() { DarajaError::OutcomeUnknown(why) } else { DarajaError::Unavailable(why) }
    }
}

type Failure = outbound::Failure<DarajaError>;

impl DarajaClient {
    pub fn new(cfg: DarajaConfig, clock: Arc<dyn Clock>) -> Result<Self, DarajaError> {
        let base = outbound::base_url(&cfg.base_url).map_err(DarajaError::Config)?;
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
        let (timeouts, breaker) =
            ((cfg.connect_timeout, cfg.request_timeout), (cfg.breaker_failures_max, cfg.breaker_open));
        outbound::check_bounds(timeouts, cfg.token_refresh_margin_secs, cfg.retries_max, breaker)
            .map_err(DarajaError::Config)?;
        if !cfg.initiator_name.is_empty() {
            for (name, url) in [("result_url", &cfg.result_url), ("timeout_url", &cfg.timeout_url)] {
                if !(url.starts_with("https://") || url.starts_with("http://")) {
                    return Err(DarajaError::Config(format!("{name} must be an http(s) URL")));
                }
            }
            if cfg.security_credential.expose().is_empty() || !is_digits(&cfg.b2c_short_code) {
                return Err(DarajaError::Config(
                    "with initiator_name, security_credential must be set and b2c_short_code must be digits".into(),
                ));
            }
        }
        let http = http_client(cfg.connect_timeout, cfg.request_timeout).map_err(DarajaError::Config)?;
        let breakers = Op::ALL
            .iter()
            .map(|op| Breaker::new(op.breaker_name(), cfg.breaker_failures_max, cfg.breaker_open, clock.clone()))
            .collect();
        Ok(DarajaClient { inner: Arc::new(Inner { cfg, base, http, clock, token: TokenCache::default(), breakers }) })
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
        if still_processing(&answer) {
            return Ok(StkQueryOutcome::Pending);
        }
        Err(self.error_answer(Op::Query, &answer))
    }

    /// Each endpoint's circuit breaker: (endpoint, state).
    pub fn circuits(&self) -> Vec<(&'static str, &'static str)> {
        Op::ALL.iter().map(|op| (op.as_str(), self.inner.breakers[*op as usize].state())).collect()
    }

    /// Whether payouts, reversals and status queries are configured (an initiator and its credential).
    pub fn initiator_configured(&self) -> bool {
        !self.inner.cfg.initiator_name.is_empty()
    }

    /// Sends a payout. `Ok` means only *accepted*: the result is posted to `result_url`.
    pub async fn b2c_payment(&self, p: &B2cPayment) -> Result<RequestAccepted, DarajaError> {
        let (id, remarks) = money_out(p.amount_whole, &p.originator_conversation_id, &p.remarks)?;
        let cfg = self.initiator()?;
        let body = B2cRequest {
            originator_conversation_id: id,
            initiator_name: &cfg.initiator_name,
            security_credential: cfg.security_credential.expose(),
            command_id: COMMAND_BUSINESS_PAYMENT,
            amount: p.amount_whole,
            party_a: &cfg.b2c_short_code,
            party_b: p.phone.as_str(),
            remarks: &remarks,
            queue_timeout_url: &cfg.timeout_url,
            result_url: &cfg.result_url,
            occassion: id,
        };
        self.accepted(Op::Payout, "/mpesa/b2c/v3/paymentrequest", &body).await
    }

    /// Pays a business from [`DarajaConfig::short_code`]. `Ok` means only *accepted*: the result is
    /// posted to `result_url`.
    pub async fn b2b_payment(&self, p: &B2bPayment) -> Result<RequestAccepted, DarajaError> {
        let (id, remarks) = money_out(p.amount_whole, &p.originator_conversation_id, &p.remarks)?;
        let (command_id, number, account_reference) = match &p.to {
            BusinessTo::Paybill { number, account_reference } => {
                (COMMAND_BUSINESS_PAY_BILL, number, clean_text(account_reference, B2B_ACCOUNT_REFERENCE_CHARS_MAX))
            }
            // A till payment has no account at the business; Daraja wants the field all the same.
            BusinessTo::Till { number } => (COMMAND_BUSINESS_BUY_GOODS, number, number.clone()),
        };
        if !is_digits(number) {
            return Err(invalid("PartyB", "must be a paybill or till number"));
        }
        if account_reference.is_empty() {
            return Err(invalid("AccountReference", "is empty"));
        }
        let cfg = self.initiator()?;
        let body = B2bRequest {
            originator_conversation_id: id,
            initiator: &cfg.initiator_name,
            security_credential: cfg.security_credential.expose(),
            command_id,
            sender_identifier_type: IDENTIFIER_SHORT_CODE,
            reciever_identifier_type: IDENTIFIER_SHORT_CODE,
            amount: p.amount_whole,
            party_a: &cfg.short_code,
            party_b: number,
            account_reference: &account_reference,
            remarks: &remarks,
            queue_timeout_url: &cfg.timeout_url,
            result_url: &cfg.result_url,
            occassion: id,
        };
        self.accepted(Op::Business, "/mpesa/b2b/v1/paymentrequest", &body).await
    }

    /// Asks Daraja to reverse a completed customer payment in full.
    pub async fn reversal(&self, r: &Reversal) -> Result<RequestAccepted, DarajaError> {
        if r.amount_whole < 1 {
            return Err(invalid("Amount", "must be a whole number of shillings, at least 1"));
        }
        if r.transaction_id.is_empty() || !r.transaction_id.bytes().all(|b| b.is_ascii_alphanumeric()) {
            return Err(invalid("TransactionID", "must be an M-Pesa receipt number"));
        }
        let remarks = clean_text(&r.remarks, REMARKS_CHARS_MAX);
        let cfg = self.initiator()?;
        let body = ReversalRequest {
            initiator: &cfg.initiator_name,
            security_credential: cfg.security_credential.expose(),
            command_id: COMMAND_REVERSAL,
            transaction_id: &r.transaction_id,
            amount: r.amount_whole,
            receiver_party: &cfg.short_code,
            reciever_identifier_type: IDENTIFIER_REVERSAL_RECEIVER,
            result_url: &cfg.result_url,
            queue_timeout_url: &cfg.timeout_url,
            remarks: if remarks.is_empty() { "Reversal" } else { &remarks },
            occasion: &clean_text(&r.occasion, REMARKS_CHARS_MAX),
        };
        self.accepted(Op::Reversal, "/mpesa/reversal/v1/request", &body).await
    }

    /// Asks where a payout stands, by the `OriginatorConversationID` it was sent with. Read-only
    /// and asynchronous: `Ok` means the question was accepted; the answer is posted to
    /// `result_url` with `occasion` in its reference data.
    pub async fn transaction_status(
        &self,
        originator_conversation_id: &str,
        occasion: &str,
        sender: Sender,
    ) -> Result<RequestAccepted, DarajaError> {
        if originator_conversation_id.is_empty() || originator_conversation_id.chars().any(char::is_control) {
            return Err(invalid("OriginatorConversationID", "is empty or contains control characters"));
        }
        let cfg = self.initiator()?;
        let body = StatusRequest {
            initiator: &cfg.initiator_name,
            security_credential: cfg.security_credential.expose(),
            command_id: COMMAND_STATUS,
            transaction_id: "",
            originator_conversation_id,
            party_a: match sender {
                Sender::Payouts => &cfg.b2c_short_code,
                Sender::Business => &cfg.short_code,
            },
            identifier_type: IDENTIFIER_SHORT_CODE,
            result_url: &cfg.result_url,
            queue_timeout_url: &cfg.timeout_url,
            remarks: "status",
            occasion: &clean_text(occasion, REMARKS_CHARS_MAX),
        };
        self.accepted(Op::Status, "/mpesa/transactionstatus/v1/query", &body).await
    }

    fn initiator(&self) -> Result<&DarajaConfig, DarajaError> {
        if self.initiator_configured() {
            Ok(&self.inner.cfg)
        } else {
            Err(DarajaError::Config("no initiator configured (mpesa.initiator_name)".into()))
        }
    }

    /// An asynchronous request: accepted (`ResponseCode` "0"), refused, or its fate unknown.
    async fn accepted<T: Serialize>(&self, op: Op, path: &str, body: &T) -> Result<RequestAccepted, DarajaError> {
        let answer = self.call(op, path, body).await?;
        if !answer.status.is_success() {
            return Err(self.error_answer(op, &answer));
        }
        let what = op.as_str();
        let ok: AcceptedResponse = serde_json::from_slice(&answer.body)
            .map_err(|_| op.after_sending(format!("{what}: unparseable success body (HTTP {})", answer.status)))?;
        let code = code_text(&ok.response_code);
        if code != "0" {
            return Err(DarajaError::Rejected { code, message: ok.response_description });
        }
        tracing::debug!(daraja.op = what, daraja.conversation_id = %ok.conversation_id, "daraja accepted the request");
        Ok(RequestAccepted {
            conversation_id: ok.conversation_id,
            originator_conversation_id: ok.originator_conversation_id,
        })
    }

    /// Sends one API request through the circuit breaker, retrying (after a jittered backoff, at
    /// most `retries_max` times) only a failure that certainly left nothing processed and was quick.
    async fn call<T: Serialize>(&self, op: Op, path: &str, body: &T) -> Result<Answer, DarajaError> {
        let retries = Retries {
            vendor: "daraja",
            op: op.as_str(),
            breaker: &self.inner.breakers[op as usize],
            retries_max: self.inner.cfg.retries_max,
        };
        // Daraja answered: it is up, even when it refused (a 4xx is about the request), and when a
        // status query is answered "still being processed" (an HTTP 500 that is a state: the
        // customer has not answered the prompt yet), which must never count against the breaker.
        let count = |answer: &Answer| Counted {
            up: still_processing(answer)
                || !(answer.status.is_server_error() || answer.status == reqwest::StatusCode::TOO_MANY_REQUESTS),
            unprocessed: self.is_transient_answer(answer),
        };
        send_with_retries(retries, DarajaError::Unavailable, count, || self.call_once(op, path, body)).await
    }

    /// An answer that says the request was refused before processing, by overload.
    /// (Daraja's "still being processed" is not one: see [`still_processing`].)
    fn is_transient_answer(&self, answer: &Answer) -> bool {
        answer.status == reqwest::StatusCode::TOO_MANY_REQUESTS
            || answer.status == reqwest::StatusCode::SERVICE_UNAVAILABLE
            || parse_error_body(&answer.body)
                .error_code
                .is_some_and(|c| ERROR_CODES_GATEWAY_REFUSAL.contains(&c.as_str()))
    }

    /// One attempt with the cached token; on a 401 (or Daraja's invalid-token code) drops the
    /// token, fetches a new one and sends once more. The token was refused at Daraja's gateway,
    /// so nothing was processed and the second send cannot double a request.
    async fn call_once<T: Serialize>(&self, op: Op, path: &str, body: &T) -> Result<Answer, Failure> {
        let url = format!("{}{path}", self.inner.base);
        let send = |token: Secret| {
            let request = crate::telemetry::traced(self.inner.http.post(&url));
            let sent = request.bearer_auth(token.expose()).json(body).send();
            async move {
                let mut resp = sent.await.map_err(|e| send_error(op, &e))?;
                let status = resp.status();
                let body = read_body(&mut resp, RESPONSE_BYTES_MAX).await.map_err(|why| {
                    Failure::fatal(op.after_sending(format!("{}: {why} (HTTP {status})", op.as_str())))
                })?;
                Ok(Answer { status, body })
            }
        };
        let inner = &self.inner;
        with_token(&inner.token, &*inner.clock, "daraja", || self.fetch_token(), token_refused, send).await
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
        // A 5xx (or anything unexpected) after Daraja read a money-moving request: it may have
        // been processed.
        op.after_sending(format!("{what}: HTTP {status} {code}: {message}"))
    }

    /// Ask Daraja for a fresh OAuth token with the configured app credentials (`paygate doctor`).
    /// The token itself is dropped, never shown.
    pub async fn check_credentials(&self) -> Result<(), DarajaError> {
        self.fetch_token().await.map(drop).map_err(|f| f.error)
    }

    async fn fetch_token(&self) -> Result<CachedToken, Failure> {
        let cfg = &self.inner.cfg;
        let url = format!("{}/oauth/v1/generate?grant_type=client_credentials", self.inner.base);
        let unavailable = |why: String| {
            tracing::warn!(error = %why, "daraja token fetch failed");
            Failure::fatal(DarajaError::Unavailable(format!("oauth: {why}")))
        };
        let mut resp = self
            .inner
            .http
            .get(&url)
            .basic_auth(cfg.consumer_key.expose(), Some(cfg.consumer_secret.expose()))
            .send()
            .await
            .map_err(|e| Failure { transient: e.is_connect(), ..unavailable(describe_send_error(&e)) })?;
        let status = resp.status();
        // The body is not quoted in errors: only the status and a fixed text.
        let body = read_body(&mut resp, RESPONSE_BYTES_MAX)
            .await
            .map_err(|why| unavailable(format!("{why} (HTTP {status})")))?;
        if !status.is_success() {
            let transient =
                status == reqwest::StatusCode::TOO_MANY_REQUESTS || status == reqwest::StatusCode::SERVICE_UNAVAILABLE;
            return Err(Failure { transient, ..unavailable(format!("token request refused (HTTP {status})")) });
        }
        let parsed: TokenResponse = serde_json::from_slice(&body)
            .map_err(|_| unavailable(format!("unparseable token response (HTTP {status})")))?;
        if parsed.access_token.is_empty() {
            return Err(unavailable("empty access_token".into()));
        }
        let expires_in_secs = json_int(&parsed.expires_in)
            .filter(|s| *s > 0)
            .ok_or_else(|| unavailable("expires_in is not a positive integer".into()))?;
        let token = Secret::new(parsed.access_token);
        Ok(CachedToken::new(token, expires_in_secs, cfg.token_refresh_margin_secs, &*self.inner.clock))
    }
}

/// What every payment out (B2C, B2B) must carry before it is sent: at least a shilling, the
/// gateway's own id, remarks. The id and the cleaned remarks, or the field refused.
fn money_out<'a>(amount_whole: i64, id: &'a str, remarks: &str) -> Result<(&'a str, String), DarajaError> {
    if amount_whole < 1 {
        return Err(invalid("Amount", "must be a whole number of shillings, at least 1"));
    }
    if id.is_empty() || id.chars().any(char::is_control) {
        return Err(invalid("OriginatorConversationID", "is empty or contains control characters"));
    }
    let remarks = clean_text(remarks, REMARKS_CHARS_MAX);
    if remarks.is_empty() {
        return Err(invalid("Remarks", "is empty"));
    }
    Ok((id, remarks))
}

fn invalid(field: &str, why: &str) -> DarajaError {
    DarajaError::Rejected { code: "paygate.invalid_request".into(), message: format!("{field} {why}") }
}

fn parse_error_body(body: &[u8]) -> ErrorBody {
    serde_json::from_slice(body).unwrap_or_default()
}

fn token_refused(answer: &Answer) -> bool {
    answer.status == reqwest::StatusCode::UNAUTHORIZED
        || (answer.status.is_client_error()
            && parse_error_body(&answer.body).error_code.as_deref() == Some(ERROR_CODE_INVALID_TOKEN))
}

/// A failed send. A connect error means no byte of the request left (transient: try again);
/// anything else (timeout after connecting, reset mid-response) may have reached Daraja.
fn send_error(op: Op, e: &reqwest::Error) -> Failure {
    outbound::send_failure(op.as_str(), e, DarajaError::Unavailable, |why| op.after_sending(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every payout and reversal failure code Daraja documents fails the payment with its reason
    /// (one left out would keep a failed payout open, its money held, until a person looked);
    /// success and codes this gateway does not know are never a failure.
    #[test]
    fn every_documented_failure_code_has_its_reason() {
        let codes = [1, 11, 17, 21, 2001, 2028, 2040, 8006];
        let reasons: Vec<&str> = codes.iter().map(|c| result_failure_reason(*c).unwrap_or_default()).collect();
        assert!(reasons.iter().all(|r| !r.is_empty()), "{reasons:?}");
        let distinct: std::collections::HashSet<_> = reasons.iter().collect();
        assert_eq!(distinct.len(), codes.len(), "each code its own reason");
        assert!(result_failure_reason(17).unwrap().contains("2 minutes"));
        for other in [0, 2, 1032, 9999, -1] {
            assert_eq!(result_failure_reason(other), None, "{other}");
        }
    }

    /// Daraja answers 500 with errorCode 500.001.1001 for more than one thing: only "being
    /// processed" is a prompt still open (pending, not a failure of Daraja); the same code with
    /// another message, or those words under another code, is a server error.
    #[test]
    fn only_the_documented_being_processed_answer_is_still_processing() {
        let answer = |code: &str, message: &str| crate::backend::outbound::Answer {
            status: reqwest::StatusCode::INTERNAL_SERVER_ERROR,
            body: serde_json::to_vec(&serde_json::json!({"errorCode": code, "errorMessage": message})).unwrap(),
        };
        assert!(still_processing(&answer("500.001.1001", "The transaction is being processed")));
        assert!(!still_processing(&answer("500.001.1001", "Unable to lock subscriber")));
        assert!(!still_processing(&answer("500.003.02", "The transaction is being processed")));
    }

    /// Daraja's ResultCode arrives as a number or as text ("R000002", or a number quoted); a
    /// blank one is no code.
    #[test]
    fn a_result_code_may_be_text_but_not_blank() {
        let body = |code: &str| {
            format!(
                r#"{{"Result":{{"ResultCode":{code},"ResultDesc":"d","OriginatorConversationID":"o","ConversationID":"c"}}}}"#
            )
        };
        assert_eq!(parse_result(body("0").as_bytes()).unwrap().result_code, "0");
        assert_eq!(parse_result(body(r#""0""#).as_bytes()).unwrap().result_code, "0");
        assert_eq!(parse_result(body(r#"" R000002 ""#).as_bytes()).unwrap().result_code, "R000002");
        assert!(parse_result(body(r#""  ""#).as_bytes()).is_err());
    }

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

    /// A result's every required field is checked, each refusal naming the field: a result that
    /// lost its code or description is never read as one that has them.
    #[test]
    fn a_result_missing_or_mistyping_a_required_field_is_refused_by_name() {
        let result = |fields: &str| format!(r#"{{"Result":{{{fields}}}}}"#);
        let ids = r#""OriginatorConversationID":"o","ConversationID":"c""#;
        let cases = [
            (result(&format!(r#""ResultDesc":"d",{ids}"#)), "ResultCode is missing"),
            (result(&format!(r#""ResultCode":true,"ResultDesc":"d",{ids}"#)), "ResultCode must be"),
            (result(&format!(r#""ResultCode":0,{ids}"#)), "ResultDesc is missing"),
            (result(&format!(r#""ResultCode":0,"ResultDesc":7,{ids}"#)), "ResultDesc must be a string"),
            (result(r#""ResultCode":0,"ResultDesc":"d","ConversationID":"c""#), "OriginatorConversationID is missing"),
            (
                result(r#""ResultCode":0,"ResultDesc":"d","OriginatorConversationID":null,"ConversationID":"c""#),
                "OriginatorConversationID must be",
            ),
            (result(&format!(r#""ResultCode":0,"ResultDesc":"d",{ids},"TransactionID":" ""#)), "TransactionID must be"),
            (
                result(&format!(
                    r#""ResultCode":0,"ResultDesc":"d",{ids},"ResultParameters":{{"ResultParameter":"x"}}"#
                )),
                "ResultParameter must be an object or an array",
            ),
            (
                result(&format!(
                    r#""ResultCode":0,"ResultDesc":"d",{ids},"ReferenceData":{{"ReferenceItem":[{{"Value":1}}]}}"#
                )),
                "ReferenceItem without a Key",
            ),
        ];
        for (body, needle) in cases {
            let err = parse_result(body.as_bytes()).unwrap_err();
            assert!(err.contains(needle), "{body}: {err}");
        }
        // An optional field may be null or absent; a lone item may be an object.
        let ok = parse_result(
            result(&format!(
                r#""ResultCode":0,"ResultDesc":"d",{ids},"TransactionID":null,
                "ResultParameters":{{"ResultParameter":{{"Key":"TransactionReceipt","Value":"NLJ41HAY6Q"}}}},
                "ReferenceData":null"#
            ))
            .as_bytes(),
        )
        .unwrap();
        assert_eq!((ok.transaction_id, ok.receipt.as_deref()), (None, Some("NLJ41HAY6Q")));
    }

    /// A callback's identifiers and description must be non-empty strings; its metadata's phone
    /// and date digits. Each refusal names what is wrong.
    #[test]
    fn a_callback_with_a_mistyped_field_is_refused_by_name() {
        let callback = |fields: &str| format!(r#"{{"Body":{{"stkCallback":{{{fields}}}}}}}"#);
        let ids = r#""MerchantRequestID":"m","CheckoutRequestID":"c""#;
        let item = |name: &str, value: &str| {
            callback(&format!(
                r#"{ids},"ResultCode":0,"ResultDesc":"d","CallbackMetadata":{{"Item":[{{"Name":"{name}","Value":{value}}}]}}"#
            ))
        };
        let cases = [
            (
                callback(r#""MerchantRequestID":"","CheckoutRequestID":"c","ResultCode":0,"ResultDesc":"d""#),
                "MerchantRequestID is empty",
            ),
            (
                callback(r#""MerchantRequestID":"m","CheckoutRequestID":5,"ResultCode":0,"ResultDesc":"d""#),
                "CheckoutRequestID must be a string",
            ),
            (callback(&format!(r#"{ids},"ResultCode":0,"ResultDesc":1"#)), "ResultDesc must be a string"),
            (callback(&format!(r#"{ids},"ResultCode":0"#)), "ResultDesc is missing"),
            (item("PhoneNumber", r#""07x""#), "PhoneNumber must be digits"),
            (item("TransactionDate", r#""2019-12-19""#), "TransactionDate must be digits"),
            (item("MpesaReceiptNumber", "true"), "MpesaReceiptNumber must be a string"),
            (
                callback(&format!(
                    r#"{ids},"ResultCode":0,"ResultDesc":"d","CallbackMetadata":{{"Item":[{{"Value":1}}]}}"#
                )),
                "without a Name",
            ),
        ];
        for (body, needle) in cases {
            let err = parse_callback(body.as_bytes()).unwrap_err();
            assert!(err.contains(needle), "{body}: {err}");
        }
        // Items this gateway does not read are skipped, whatever they hold.
        let cb = parse_callback(item("Balance", r#"{"x":1}"#).as_bytes()).unwrap();
        assert_eq!(cb.amount_minor, None);
    }

    #[test]
    fn clean_text_strips_controls_and_truncates_by_chars() {
        assert_eq!(clean_text("  INV\n-2024-000123-LONG ", ACCOUNT_REFERENCE_CHARS_MAX), "INV-2024-000");
        assert_eq!(clean_text("Malipo ya ñéü café ☕ long", TRANSACTION_DESC_CHARS_MAX), "Malipo ya ñéü");
        assert_eq!(clean_text("\u{7}\t", 12), "");
    }
}
