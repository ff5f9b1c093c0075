//! A Daraja simulator inside the gateway (`mpesa.environment = "simulator"`): Daraja-shaped
//! endpoints under `/simulator/mpesa` — OAuth, STK push and query, B2C and B2B payments, reversals,
//! the Transaction Status API — that the gateway's own Daraja client calls over HTTP exactly as it
//! calls Safaricom. Nothing is answered by itself: a person answers each pending prompt or payment
//! (accept, decline, time out) through the operator's control routes, and the simulator then posts
//! Daraja's callback or result to the gateway's real callback routes, with the real secret and the
//! real checks. It can also lose its next answer (the request is processed, its HTTP answer never
//! comes), which is how a newcomer sees an unknown outcome settled by a status query.
//!
//! It moves no money anywhere: it is for local demos and first steps. A config cannot name it and
//! Safaricom's production at once (there is one `mpesa.environment`).
//!
//! Standalone (`paygate rail-simulator --rail mpesa`, [`DarajaSimulator::standalone`]) it serves the
//! same endpoints at its root, for gateways whose `mpesa.base_url` names it, and posts callbacks and
//! results to the URLs each request names, as Daraja does (it takes requests only with a token made
//! from the configured credentials). A request repeated under the same OriginatorConversationID is
//! a new payment, as Daraja documents no idempotency for it: the view lists both.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde_json::{Value, json};

use super::daraja::DarajaConfig;
use crate::backend::simulator::{Answer, AutoAnswer, Pick, RailSimulator, SIMULATOR_ITEMS_MAX, Tokens, pending};

/// Where the simulator's Daraja is served on the gateway (its `base_url` is `<public_url>` + this).
pub const SIMULATOR_PATH: &str = "/simulator/mpesa";
/// How long a request whose answer is "lost" is held before the simulator lets it go (the client's
/// own timeout is far shorter).
const LOST_ANSWER_HOLD: Duration = Duration::from_secs(60);
/// The lifetime of a simulator token, as Daraja's ("3599").
const TOKEN_TTL_SECS: u64 = 3599;

/// What kind of request an item is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Prompt,
    Payout,
    BusinessPayment,
    Reversal,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Item {
    /// The simulator's own number for it, one per request taken (a repeat has its own).
    seq: u64,
    /// The CheckoutRequestID of a prompt; the OriginatorConversationID of anything else.
    id: String,
    /// Daraja's id for it: the CheckoutRequestID of a prompt, the ConversationID of anything else.
    rail_id: String,
    /// The OriginatorConversationID the caller sent (`None`: a prompt, or none sent).
    originator_id: Option<String>,
    kind: Kind,
    /// The customer's phone, or the business paid (payouts, business payments), or the receipt
    /// reversed.
    party: String,
    amount: i64,
    /// "pending", "paid", "declined", "timed_out" (a prompt), "paid_result_lost" (a payment whose
    /// result only a status query reports).
    status: &'static str,
    #[serde(skip)]
    conversation_id: String,
    #[serde(skip)]
    merchant_request_id: String,
    #[serde(skip)]
    reply_to: String,
    #[serde(skip)]
    timeout_to: String,
    #[serde(skip)]
    occasion: String,
    #[serde(skip)]
    receipt: String,
    #[serde(skip)]
    result_code: Option<i64>,
}

#[derive(Default)]
struct Inner {
    tokens: Tokens,
    items: Vec<Item>,
    seq: u64,
    lose_next: bool,
}

/// Where the simulator posts callbacks and results.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Callbacks {
    /// Only to the gateway's own callback routes (inside the gateway: anyone who reached the
    /// simulator could otherwise make the gateway POST to any address of their choosing).
    Gateway,
    /// To the http(s) URLs each request names, as Daraja does (standalone: each replica names its
    /// own).
    AsSent,
}

struct Sim {
    cfg: DarajaConfig,
    callbacks: Callbacks,
    auto: Option<AutoAnswer>,
    /// Items kept before new ones are refused (503).
    items_max: usize,
    inner: Mutex<Inner>,
    http: reqwest::Client,
}

/// The simulator: its Daraja routes ([`DarajaSimulator::router`]) and what a person does to it.
#[derive(Clone)]
pub struct DarajaSimulator {
    sim: Arc<Sim>,
}

impl DarajaSimulator {
    /// A simulator inside the gateway that expects exactly the credentials, short codes and passkey
    /// in `cfg` (the gateway's own client config) and calls back only to its callback routes.
    pub fn new(cfg: DarajaConfig) -> Result<Self, String> {
        Self::with(cfg, Callbacks::Gateway, None, SIMULATOR_ITEMS_MAX)
    }

    /// A simulator in a process of its own: the credentials, short codes and passkey in `cfg`;
    /// callbacks to the URLs each request names; every item answered by `auto`, if given; at most
    /// `items_max` items kept.
    pub fn standalone(cfg: DarajaConfig, auto: Option<AutoAnswer>, items_max: usize) -> Result<Self, String> {
        Self::with(cfg, Callbacks::AsSent, auto, items_max)
    }

    fn with(
        cfg: DarajaConfig,
        callbacks: Callbacks,
        auto: Option<AutoAnswer>,
        items_max: usize,
    ) -> Result<Self, String> {
        // Its callbacks may go to https:// URLs: rustls needs its provider before a client is built.
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("simulator http client: {e}"))?;
        let inner = Mutex::new(Inner::default());
        Ok(DarajaSimulator { sim: Arc::new(Sim { cfg, callbacks, auto, items_max, inner, http }) })
    }
}

#[async_trait]
impl RailSimulator for DarajaSimulator {
    fn rail(&self) -> &'static str {
        super::RAIL
    }

    /// Daraja's endpoints, to be nested under `/simulator/mpesa`.
    fn router(&self) -> Router {
        Router::new()
            .route("/oauth/v1/generate", get(oauth))
            .route("/mpesa/stkpush/v1/processrequest", post(stk_push))
            .route("/mpesa/stkpushquery/v1/query", post(stk_query))
            .route("/mpesa/b2c/v3/paymentrequest", post(b2c))
            .route("/mpesa/b2b/v1/paymentrequest", post(b2b))
            .route("/mpesa/reversal/v1/request", post(reversal))
            .route("/mpesa/transactionstatus/v1/query", post(status))
            .with_state(self.sim.clone())
    }

    /// Every prompt and payment, newest first, and whether the next answer will be lost.
    fn view(&self) -> Value {
        let inner = self.sim.lock();
        let items: Vec<&Item> = inner.items.iter().rev().collect();
        json!({"items": items, "lose_next_answer": inner.lose_next})
    }

    /// The next money request is processed and its answer never sent.
    fn lose_next_answer(&self) {
        self.sim.lock().lose_next = true;
    }

    /// Answers a pending item and posts Daraja's callback or result to the gateway: the item's id
    /// and the HTTP status the gateway gave the callback. `Err`: no such pending item (a sentence).
    async fn answer(&self, pick: Pick<'_>, answer: Answer) -> Result<(String, Option<u16>), String> {
        self.sim.answer(pick, answer).await
    }
}

impl Sim {
    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Answers a pending item (see [`RailSimulator::answer`]).
    async fn answer(&self, pick: Pick<'_>, answer: Answer) -> Result<(String, Option<u16>), String> {
        let (item, url, body) = {
            let mut inner = self.lock();
            let item = pending(&mut inner.items, pick, |i| &i.id, |i| i.seq, |i| i.status)?;
            let (status, code) = match (answer, item.kind) {
                (Answer::Accept, _) => ("paid", Some(0)),
                (Answer::Decline, Kind::Prompt) => ("declined", Some(1032)),
                (Answer::Decline, _) => ("declined", Some(2001)),
                (Answer::Timeout, Kind::Prompt) => ("timed_out", Some(1037)),
                // Completed, its result lost: a status query finds it.
                (Answer::Timeout, _) => ("paid_result_lost", Some(0)),
            };
            item.status = status;
            item.result_code = code;
            let item = item.clone();
            let (url, body) = match (item.kind, code, answer) {
                (Kind::Prompt, Some(code), _) => (item.reply_to.clone(), stk_callback(&item, code)),
                (_, _, Answer::Timeout) => (item.timeout_to.clone(), queue_timeout(&item)),
                (_, code, _) => (item.reply_to.clone(), result(&self.cfg, &item, code.unwrap_or_default())),
            };
            (item, url, body)
        };
        tracing::info!(
            item.seq = item.seq,
            item.id = %item.id,
            item.status = item.status,
            "simulator: M-Pesa answered an item"
        );
        let sent = self.http.post(&url).json(&body).send().await;
        match sent {
            Ok(resp) => Ok((item.id, Some(resp.status().as_u16()))),
            Err(e) => Err(format!("the callback for {} could not be delivered: {e}", item.id)),
        }
    }

    /// Records a processed request: its answer, or (the answer lost) nothing for a long while. With
    /// an auto-answer, the item is answered by itself a little later, lost answer or not.
    async fn record(self: &Arc<Self>, mut item: Item, accepted: impl FnOnce(&Item) -> Value) -> Response {
        let lost = {
            let mut inner = self.lock();
            if inner.items.len() >= self.items_max {
                return error(StatusCode::SERVICE_UNAVAILABLE, "503.001.01", "The simulator is full; restart it");
            }
            inner.seq += 1;
            let seq = inner.seq;
            item.seq = seq;
            item.conversation_id = format!("AG_SIM_{seq:012}");
            item.merchant_request_id = format!("SIM-{seq}");
            if item.id.is_empty() {
                item.id = format!("sim-{seq:012}");
            }
            item.rail_id = match item.kind {
                Kind::Prompt => item.id.clone(),
                Kind::Payout | Kind::BusinessPayment | Kind::Reversal => item.conversation_id.clone(),
            };
            item.receipt = receipt(seq);
            inner.items.push(item.clone());
            std::mem::take(&mut inner.lose_next)
        };
        tracing::info!(
            item.seq = item.seq,
            item.kind = ?item.kind,
            item.id = %item.id,
            item.amount = item.amount,
            answer_lost = lost,
            "simulator: M-Pesa took a request"
        );
        if let Some(auto) = self.auto {
            let (sim, seq) = (self.clone(), item.seq);
            tokio::spawn(async move {
                tokio::time::sleep(auto.after).await;
                if let Err(error) = sim.answer(Pick::Seq(seq), auto.answer).await {
                    tracing::warn!(%error, item.seq = seq, "simulator: an automatic answer was not delivered");
                }
            });
        }
        if lost {
            tokio::time::sleep(LOST_ANSWER_HOLD).await;
        }
        axum::Json(accepted(&item)).into_response()
    }

    fn bearer_ok(&self, headers: &HeaderMap) -> bool {
        self.lock().tokens.authorize(headers.get("authorization").and_then(|v| v.to_str().ok()))
    }

    fn initiator_ok(&self, v: &Value, name_field: &str) -> bool {
        let cfg = &self.cfg;
        !cfg.initiator_name.is_empty()
            && text(v, name_field).as_deref() == Some(cfg.initiator_name.as_str())
            && text(v, "SecurityCredential").as_deref() == Some(cfg.security_credential.expose())
    }
}

fn error(status: StatusCode, code: &str, message: &str) -> Response {
    (status, axum::Json(json!({"requestId": "sim", "errorCode": code, "errorMessage": message}))).into_response()
}

fn bad(field: &str) -> Response {
    error(StatusCode::BAD_REQUEST, "400.002.02", &format!("Bad Request - Invalid {field}"))
}

fn text(v: &Value, name: &str) -> Option<String> {
    match v.get(name)? {
        Value::String(s) => Some(s.clone()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

fn amount(v: &Value) -> Option<i64> {
    text(v, "Amount").and_then(|a| a.parse::<i64>().ok()).filter(|a| *a >= 1)
}

/// A URL the simulator will post to. Inside the gateway only its own callback routes (the ones its
/// client sends, path secret included): anyone else who reached the simulator could otherwise make
/// the gateway POST to any address of their choosing. Standalone, any http(s) URL, as Daraja.
fn url(sim: &Sim, v: &Value, name: &str) -> Option<String> {
    let own = [&sim.cfg.callback_url, &sim.cfg.result_url, &sim.cfg.timeout_url];
    text(v, name).filter(|u| match sim.callbacks {
        Callbacks::Gateway => own.iter().any(|o| o.as_str() == u.as_str()),
        Callbacks::AsSent => u.starts_with("http://") || u.starts_with("https://"),
    })
}

/// A 10-character receipt (`SIM` and 7 more), unique per simulator run.
fn receipt(seq: u64) -> String {
    format!("SIM{:07}", seq % 10_000_000)
}

/// Parses the body of a request that needs a valid token; `Err` is the answer.
fn authorized(sim: &Sim, headers: &HeaderMap, body: &Bytes) -> Result<Value, Box<Response>> {
    if !sim.bearer_ok(headers) {
        return Err(Box::new(error(StatusCode::UNAUTHORIZED, "404.001.03", "Invalid Access Token")));
    }
    serde_json::from_slice(body)
        .map_err(|_| Box::new(error(StatusCode::BAD_REQUEST, "400.002.05", "Invalid Request Payload")))
}

fn accepted_outbound(item: &Item) -> Value {
    json!({
        "ConversationID": item.conversation_id,
        "OriginatorConversationID": item.id,
        "ResponseCode": "0",
        "ResponseDescription": "Accept the service request successfully.",
    })
}

async fn oauth(State(sim): State<Arc<Sim>>, Query(q): Query<HashMap<String, String>>, headers: HeaderMap) -> Response {
    if q.get("grant_type").map(String::as_str) != Some("client_credentials") {
        return error(StatusCode::BAD_REQUEST, "400.008.02", "Invalid grant type passed");
    }
    let cfg = &sim.cfg;
    let expected =
        format!("Basic {}", BASE64.encode(format!("{}:{}", cfg.consumer_key.expose(), cfg.consumer_secret.expose())));
    if headers.get("authorization").and_then(|v| v.to_str().ok()) != Some(expected.as_str()) {
        return error(StatusCode::BAD_REQUEST, "400.008.01", "Invalid Authentication passed");
    }
    let token = sim.lock().tokens.issue();
    axum::Json(json!({"access_token": token, "expires_in": TOKEN_TTL_SECS.to_string()})).into_response()
}

async fn stk_push(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    let v = match authorized(&sim, &headers, &body) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let cfg = &sim.cfg;
    let timestamp = text(&v, "Timestamp").unwrap_or_default();
    let password = BASE64.encode(format!("{}{}{timestamp}", cfg.short_code, cfg.passkey.expose()));
    if text(&v, "BusinessShortCode").as_deref() != Some(cfg.short_code.as_str())
        || text(&v, "Password").as_deref() != Some(password.as_str())
    {
        return bad("Password");
    }
    let Some(amount) = amount(&v) else { return bad("Amount") };
    let Some(phone) = text(&v, "PhoneNumber").filter(|p| p.len() == 12 && p.starts_with("254")) else {
        return bad("PhoneNumber");
    };
    let Some(reply_to) = url(&sim, &v, "CallBackURL") else { return bad("CallBackURL") };
    let item = Item {
        seq: 0,
        id: String::new(),
        rail_id: String::new(),
        originator_id: None,
        kind: Kind::Prompt,
        party: phone,
        amount,
        status: "pending",
        conversation_id: String::new(),
        merchant_request_id: String::new(),
        reply_to,
        timeout_to: String::new(),
        occasion: String::new(),
        receipt: String::new(),
        result_code: None,
    };
    let item = Item { id: format!("ws_CO_SIM_{}", uuid::Uuid::new_v4().simple()), ..item };
    sim.record(item, |i| {
        json!({
            "MerchantRequestID": i.merchant_request_id,
            "CheckoutRequestID": i.id,
            "ResponseCode": "0",
            "ResponseDescription": "Success. Request accepted for processing",
            "CustomerMessage": "Success. Request accepted for processing",
        })
    })
    .await
}

async fn stk_query(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    let v = match authorized(&sim, &headers, &body) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let id = text(&v, "CheckoutRequestID").unwrap_or_default();
    let found = sim.lock().items.iter().find(|i| i.kind == Kind::Prompt && i.id == id).cloned();
    match found {
        None => bad("CheckoutRequestID"),
        Some(Item { result_code: None, .. }) => {
            error(StatusCode::INTERNAL_SERVER_ERROR, "500.001.1001", "The transaction is being processed")
        }
        Some(i) => axum::Json(json!({
            "ResponseCode": "0",
            "ResponseDescription": "The service request has been accepted successsfully",
            "MerchantRequestID": i.merchant_request_id,
            "CheckoutRequestID": i.id,
            "ResultCode": i.result_code.unwrap_or_default().to_string(),
            "ResultDesc": description(i.result_code.unwrap_or_default()),
        }))
        .into_response(),
    }
}

fn outbound(sim: &Sim, v: &Value, kind: Kind, party: String, amount: i64) -> Option<Item> {
    let originator_id = text(v, "OriginatorConversationID");
    Some(Item {
        seq: 0,
        id: originator_id.clone().unwrap_or_default(),
        rail_id: String::new(),
        originator_id,
        kind,
        party,
        amount,
        status: "pending",
        conversation_id: String::new(),
        merchant_request_id: String::new(),
        reply_to: url(sim, v, "ResultURL")?,
        timeout_to: url(sim, v, "QueueTimeOutURL")?,
        occasion: text(v, "Occassion").or_else(|| text(v, "Occasion")).unwrap_or_default(),
        receipt: String::new(),
        result_code: None,
    })
}

async fn b2c(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    let v = match authorized(&sim, &headers, &body) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    if !sim.initiator_ok(&v, "InitiatorName") {
        return bad("Initiator");
    }
    let (Some(amount), Some(phone)) = (amount(&v), text(&v, "PartyB")) else { return bad("Amount or PartyB") };
    let Some(item) = outbound(&sim, &v, Kind::Payout, phone, amount) else { return bad("ResultURL") };
    sim.record(item, accepted_outbound).await
}

async fn b2b(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    let v = match authorized(&sim, &headers, &body) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    if !sim.initiator_ok(&v, "Initiator") || text(&v, "PartyA").as_deref() != Some(sim.cfg.short_code.as_str()) {
        return bad("Initiator or PartyA");
    }
    let (Some(amount), Some(business)) = (amount(&v), text(&v, "PartyB")) else { return bad("Amount or PartyB") };
    let Some(item) = outbound(&sim, &v, Kind::BusinessPayment, business, amount) else { return bad("ResultURL") };
    sim.record(item, accepted_outbound).await
}

async fn reversal(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    let v = match authorized(&sim, &headers, &body) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    if !sim.initiator_ok(&v, "Initiator") {
        return bad("Initiator");
    }
    let receipt = text(&v, "TransactionID").unwrap_or_default();
    let paid = sim.lock().items.iter().any(|i| i.kind == Kind::Prompt && i.status == "paid" && i.receipt == receipt);
    let Some(amount) = amount(&v).filter(|_| paid) else { return bad("TransactionID") };
    let Some(item) = outbound(&sim, &v, Kind::Reversal, receipt, amount) else { return bad("ResultURL") };
    sim.record(item, accepted_outbound).await
}

/// The Transaction Status API: an answered payment's status is posted to the ResultURL; one still
/// pending is answered when a person answers it (its own result).
async fn status(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    let v = match authorized(&sim, &headers, &body) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    if !sim.initiator_ok(&v, "Initiator") {
        return bad("Initiator");
    }
    let (Some(asked), Some(reply_to)) = (text(&v, "OriginatorConversationID"), url(&sim, &v, "ResultURL")) else {
        return bad("OriginatorConversationID");
    };
    let occasion = text(&v, "Occasion").unwrap_or_default();
    let found = sim.lock().items.iter().find(|i| i.kind != Kind::Prompt && i.id == asked).cloned();
    if let Some(item) = found.filter(|i| i.result_code.is_some()) {
        let code = item.result_code.unwrap_or_default();
        let body = json!({"Result": {
            "ResultType": 0, "ResultCode": 0, "ResultDesc": "The service request is processed successfully.",
            "OriginatorConversationID": format!("status-{asked}"), "ConversationID": item.conversation_id,
            "TransactionID": item.receipt,
            "ResultParameters": {"ResultParameter": [
                {"Key": "ReceiptNo", "Value": item.receipt},
                {"Key": "TransactionStatus", "Value": if code == 0 { "Completed" } else { "Failed" }},
                {"Key": "Amount", "Value": item.amount},
                {"Key": "CreditPartyName", "Value": format!("{} - Simulated", item.party)},
            ]},
            "ReferenceData": {"ReferenceItem": {"Key": "Occasion", "Value": occasion}},
        }});
        // Posted before the question is answered (Daraja answers first, then posts): the gateway
        // settles either way, and a demo or a test sees the answer land with the question.
        if let Err(error) = sim.http.post(&reply_to).json(&body).send().await {
            tracing::warn!(%error, "simulator: a status answer could not be delivered");
        }
    }
    axum::Json(json!({
        "ConversationID": "AG_SIM_STATUS", "OriginatorConversationID": format!("status-{asked}"),
        "ResponseCode": "0", "ResponseDescription": "Accept the service request successfully.",
    }))
    .into_response()
}

fn description(code: i64) -> &'static str {
    match code {
        0 => "The service request is processed successfully.",
        1032 => "Request cancelled by user",
        1037 => "DS timeout user cannot be reached",
        2001 => "The initiator information is invalid.",
        _ => "Simulated result",
    }
}

fn stk_callback(item: &Item, code: i64) -> Value {
    let mut cb = json!({
        "MerchantRequestID": item.merchant_request_id,
        "CheckoutRequestID": item.id,
        "ResultCode": code,
        "ResultDesc": description(code),
    });
    if code == 0 {
        cb["CallbackMetadata"] = json!({"Item": [
            {"Name": "Amount", "Value": item.amount},
            {"Name": "MpesaReceiptNumber", "Value": item.receipt},
            {"Name": "TransactionDate", "Value": 20_261_201_120_000_u64},
            {"Name": "PhoneNumber", "Value": item.party.parse::<u64>().unwrap_or_default()},
        ]});
    }
    json!({"Body": {"stkCallback": cb}})
}

fn result(cfg: &DarajaConfig, item: &Item, code: i64) -> Value {
    let mut r = json!({
        "ResultType": 0,
        "ResultCode": code,
        "ResultDesc": description(code),
        "OriginatorConversationID": item.id,
        "ConversationID": item.conversation_id,
        "TransactionID": item.receipt,
        "ReferenceData": {"ReferenceItem": [
            {"Key": "QueueTimeoutURL", "Value": item.timeout_to},
            {"Key": "Occasion", "Value": item.occasion},
        ]},
    });
    if code == 0 {
        let party = format!("{} - Simulated", item.party);
        r["ResultParameters"] = match item.kind {
            Kind::Payout => json!({"ResultParameter": [
                {"Key": "TransactionAmount", "Value": item.amount},
                {"Key": "TransactionReceipt", "Value": item.receipt},
                {"Key": "ReceiverPartyPublicName", "Value": party},
            ]}),
            Kind::BusinessPayment => json!({"ResultParameter": [
                {"Key": "Amount", "Value": format!("{}.00", item.amount)},
                {"Key": "ReceiverPartyPublicName", "Value": party},
                {"Key": "Currency", "Value": "KES"},
            ]}),
            Kind::Reversal | Kind::Prompt => json!({"ResultParameter": [
                {"Key": "Amount", "Value": item.amount},
                {"Key": "DebitPartyPublicName", "Value": format!("{} - Simulated business", cfg.short_code)},
            ]}),
        };
    }
    json!({"Result": r})
}

fn queue_timeout(item: &Item) -> Value {
    json!({"Result": {
        "ResultType": 1, "ResultCode": 1, "ResultDesc": "The request timed out in the queue",
        "OriginatorConversationID": item.id, "ConversationID": item.conversation_id,
        "ReferenceData": {"ReferenceItem": {"Key": "Occasion", "Value": item.occasion}},
    }})
}

#[cfg(test)]
mod tests {
    use super::{description, receipt};

    /// A receipt looks like M-Pesa's (10 characters) and differs from every other one of the run:
    /// the gateway keeps it as the payment's receipt and a person quotes it.
    #[test]
    fn receipts_are_ten_characters_and_each_its_own() {
        let receipts: Vec<String> = (1..=1_000).map(receipt).collect();
        assert!(receipts.iter().all(|r| r.len() == 10 && r.starts_with("SIM")), "{:?}", &receipts[..3]);
        let distinct: std::collections::HashSet<&String> = receipts.iter().collect();
        assert_eq!(distinct.len(), receipts.len());
    }

    /// The result descriptions are Daraja's own words for each code it documents.
    #[test]
    fn result_descriptions_are_darajas() {
        assert_eq!(description(0), "The service request is processed successfully.");
        assert_eq!(description(1032), "Request cancelled by user");
        assert_eq!(description(1037), "DS timeout user cannot be reached");
        assert_eq!(description(2001), "The initiator information is invalid.");
        assert_eq!(description(4), "Simulated result");
    }
}
