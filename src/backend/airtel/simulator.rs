//! An Airtel Money simulator inside the gateway (`airtel.environment = "simulator"`): Airtel-shaped
//! endpoints under `/simulator/airtel` — OAuth, collections and their enquiry, refunds,
//! disbursements and their enquiry — that the gateway's own Airtel client calls over HTTP exactly
//! as it calls Airtel. Nothing is answered by itself: a person answers each pending collection or
//! disbursement (accept, decline, time out) through the operator's control routes. A collection's
//! answer is posted as Airtel's callback to the gateway's real callback route, with the real secret
//! and the real checks (the gateway then confirms it by enquiry, as with Airtel); a disbursement's
//! is found by the gateway's scheduled enquiry, as with Airtel. It can also lose its next answer
//! (the request is processed, its HTTP answer never comes), which is how a newcomer sees an unknown
//! outcome settled by the enquiry.
//!
//! Disbursements carry the PIN sealed with the simulator's own RSA key, made at start (the gateway's
//! client is given its public half): a wrong PIN is refused as Airtel refuses it.
//!
//! It moves no money anywhere: it is for local demos and first steps. A config cannot name it and
//! Airtel's production at once (there is one `airtel.environment`). Its wire shapes are Airtel's,
//! written here on the serving side (the client's are in [`super::wire`]).
//!
//! Standalone (`paygate rail-simulator --rail airtel`, [`AirtelSimulator::standalone`]) it serves
//! the same endpoints at its root and posts collection callbacks to the one URL its terms name (as
//! Airtel posts to the URL registered in its portal); its PIN key may be given, so that a gateway's
//! `airtel.public_key` can be its public half. A transaction id it has taken already is refused
//! (`ESB000041`), nothing moved; the view counts each such refusal.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use base64::Engine as _;
use serde_json::{Value, json};

use crate::backend::simulator::{Answer, AutoAnswer, Pick, RailSimulator, SIMULATOR_ITEMS_MAX, Tokens, pending};
use crate::secret::Secret;

/// How long a request whose answer is "lost" is held before the simulator lets it go (the client's
/// own timeout is far shorter).
const LOST_ANSWER_HOLD: Duration = Duration::from_secs(60);
/// The lifetime of a simulator token, in seconds (Airtel's are short-lived too).
const TOKEN_TTL_SECS: u64 = 180;
/// The size of the simulator's own RSA key (it seals nothing of value).
const KEY_BITS: usize = 2048;

/// What the simulator expects of the gateway's client, and where it calls back.
#[derive(Clone)]
pub struct Terms {
    pub client_id: Secret,
    pub client_secret: Secret,
    /// The disbursing wallet's PIN; `None`: disbursements are refused.
    pub pin: Option<Secret>,
    /// The gateway's collection callback route (with its path secret, unless a header carries it).
    pub callback_url: String,
    /// The header carrying the callback secret, when one is configured.
    pub callback_header: Option<(String, Secret)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
enum Kind {
    Collection,
    Payout,
    Refund,
}

#[derive(Debug, Clone, serde::Serialize)]
struct Item {
    /// The simulator's own number for it, one per request taken.
    seq: u64,
    /// The transaction id the gateway chose (its payment id); a refund's is the simulator's.
    id: String,
    /// Airtel's id for it (`airtel_money_id`).
    rail_id: String,
    /// The transaction id the caller chose (`None`: a refund, which takes none).
    originator_id: Option<String>,
    kind: Kind,
    /// The subscriber (9 digits) prompted or paid; for a refund, the Airtel reference refunded.
    party: String,
    amount: i64,
    /// "pending", "paid", "declined", "expired"; a refunded collection "refunded"; a refund "done".
    status: &'static str,
    #[serde(skip)]
    airtel_money_id: String,
}

impl Item {
    /// A collection or payout the caller named `id`, pending until answered.
    fn taken(id: String, kind: Kind, party: String, amount: i64) -> Item {
        Item {
            seq: 0,
            originator_id: Some(id.clone()),
            id,
            rail_id: String::new(),
            kind,
            party,
            amount,
            status: "pending",
            airtel_money_id: String::new(),
        }
    }

    /// The enquiry's transaction status for it.
    fn code(&self) -> &'static str {
        match self.status {
            "paid" | "refunded" | "done" => "TS",
            "declined" => "TF",
            "expired" => "TE",
            _ => "TIP",
        }
    }
}

/// A request refused because its transaction id was taken already (nothing moved).
#[derive(Debug, Clone, serde::Serialize)]
struct Refused {
    originator_id: String,
    kind: Kind,
    amount: i64,
}

#[derive(Default)]
struct Inner {
    tokens: Tokens,
    items: Vec<Item>,
    /// Repeats refused, oldest first (bounded like the items).
    refused_duplicates: Vec<Refused>,
    seq: u64,
    lose_next: bool,
}

struct Sim {
    terms: Terms,
    auto: Option<AutoAnswer>,
    key: rsa::PrivateKey,
    /// Items kept before new ones are refused (503).
    items_max: usize,
    inner: Mutex<Inner>,
    http: reqwest::Client,
}

/// The simulator: its Airtel routes and what a person does to it ([`RailSimulator`]).
#[derive(Clone)]
pub struct AirtelSimulator {
    sim: Arc<Sim>,
}

impl AirtelSimulator {
    /// A simulator expecting exactly the credentials and PIN in `terms`, with a fresh RSA key.
    pub fn new(terms: Terms) -> Result<Self, String> {
        Self::standalone(terms, None, None, SIMULATOR_ITEMS_MAX)
    }

    /// A simulator in a process of its own: the credentials and PIN in `terms`, PINs sealed with
    /// `key`'s public half (`None`: a fresh key), every item answered by `auto`, if given; at most
    /// `items_max` items kept.
    pub fn standalone(
        terms: Terms,
        key: Option<rsa::PrivateKey>,
        auto: Option<AutoAnswer>,
        items_max: usize,
    ) -> Result<Self, String> {
        // Its callbacks may go to https:// URLs: rustls needs its provider before a client is built.
        crate::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| format!("simulator http client: {e}"))?;
        let key = match key {
            Some(key) => key,
            None => rsa::PrivateKey::new(&mut getrandom::SysRng, KEY_BITS)
                .map_err(|e| format!("making the Airtel simulator's key failed: {e}"))?,
        };
        let inner = Mutex::new(Inner::default());
        Ok(AirtelSimulator { sim: Arc::new(Sim { terms, auto, key, items_max, inner, http }) })
    }

    /// The public half of the key disbursement PINs are sealed with.
    pub fn public_key(&self) -> rsa::PublicKey {
        self.sim.key.to_public_key()
    }
}

#[async_trait]
impl RailSimulator for AirtelSimulator {
    fn rail(&self) -> &'static str {
        super::RAIL
    }

    fn router(&self) -> Router {
        Router::new()
            .route("/auth/oauth2/token", post(oauth))
            .route("/merchant/v1/payments/", post(collect))
            .route("/standard/v1/payments/refund", post(refund))
            .route("/standard/v1/payments/{id}", get(|s, p, h| enquiry(s, p, h, Kind::Collection)))
            .route("/standard/v1/disbursements/", post(disburse))
            .route("/standard/v1/disbursements/{id}", get(|s, p, h| enquiry(s, p, h, Kind::Payout)))
            .with_state(self.sim.clone())
    }

    /// As every simulator's, and `refused_duplicates`: each request refused because its
    /// transaction id was taken already, oldest first.
    fn view(&self) -> Value {
        let inner = self.sim.lock();
        let items: Vec<&Item> = inner.items.iter().rev().collect();
        json!({"items": items, "lose_next_answer": inner.lose_next, "refused_duplicates": inner.refused_duplicates})
    }

    fn lose_next_answer(&self) {
        self.sim.lock().lose_next = true;
    }

    /// A collection's answer is posted as Airtel's callback (accept: `TS`, decline: `TF`, timeout:
    /// `TE`, the prompt expired). A disbursement's is only recorded (accept: paid, decline: failed,
    /// timeout: expired, nothing paid): Airtel posts no callback the gateway relies on for it, and
    /// its scheduled enquiry finds the outcome.
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
        let item = {
            let mut inner = self.lock();
            let item = pending(&mut inner.items, pick, |i| &i.id, |i| i.seq, |i| i.status)?;
            item.status = match answer {
                Answer::Accept => "paid",
                Answer::Decline => "declined",
                Answer::Timeout => "expired",
            };
            item.clone()
        };
        tracing::info!(
            item.seq = item.seq,
            item.id = %item.id,
            item.status = item.status,
            "simulator: Airtel answered an item"
        );
        if item.kind != Kind::Collection {
            return Ok((item.id, None));
        }
        let body = json!({"transaction": {
            "id": item.id,
            "message": format!("simulated: {}", item.status),
            "status_code": item.code(),
            "airtel_money_id": if item.status == "paid" { Value::from(item.airtel_money_id.clone()) } else { Value::Null },
        }});
        let terms = &self.terms;
        let mut request = self.http.post(&terms.callback_url).json(&body);
        if let Some((header, secret)) = &terms.callback_header {
            request = request.header(header.as_str(), secret.expose());
        }
        match request.send().await {
            Ok(resp) => Ok((item.id, Some(resp.status().as_u16()))),
            Err(e) => Err(format!("the callback for {} could not be delivered: {e}", item.id)),
        }
    }

    /// Records a processed request (refused when the simulator is full, or when its id is not new)
    /// and answers it — or, the answer lost, holds it for a long while. With an auto-answer, a
    /// collection or payout is answered by itself a little later, lost answer or not.
    async fn record(self: &Arc<Self>, mut item: Item, accepted: impl FnOnce(&Item) -> Value) -> Response {
        let lost = {
            let mut inner = self.lock();
            if inner.items.len() >= self.items_max {
                return refusal(StatusCode::SERVICE_UNAVAILABLE, "ESB000500", "The simulator is full; restart it");
            }
            if inner.items.iter().any(|i| i.kind == item.kind && i.id == item.id) {
                if inner.refused_duplicates.len() < self.items_max {
                    let refused = Refused { originator_id: item.id.clone(), kind: item.kind, amount: item.amount };
                    inner.refused_duplicates.push(refused);
                }
                tracing::info!(item.id = %item.id, "simulator: Airtel refused a repeated transaction id");
                return failed(StatusCode::OK, "ESB000041", "Duplicate transaction id");
            }
            inner.seq += 1;
            item.seq = inner.seq;
            item.airtel_money_id = format!("SIM{:07}.{:04}", inner.seq % 10_000_000, inner.seq % 10_000);
            item.rail_id = item.airtel_money_id.clone();
            inner.items.push(item.clone());
            std::mem::take(&mut inner.lose_next)
        };
        tracing::info!(
            item.seq = item.seq,
            item.kind = ?item.kind,
            item.id = %item.id,
            item.amount = item.amount,
            answer_lost = lost,
            "simulator: Airtel took a request"
        );
        if let (Some(auto), true) = (self.auto, item.status == "pending") {
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

    /// A bearer token issued here and Kenya's country and currency headers; `Err`: the refusal.
    fn authorized(&self, headers: &HeaderMap) -> Result<(), Box<Response>> {
        let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
        if !self.lock().tokens.authorize(header("authorization")) {
            let body = json!({"error": "invalid_token", "error_description": "Invalid Access Token"});
            return Err(Box::new((StatusCode::UNAUTHORIZED, axum::Json(body)).into_response()));
        }
        if header("x-country") != Some(super::wire::COUNTRY) || header("x-currency") != Some(super::wire::CURRENCY) {
            let why = "X-Country and X-Currency must be KE and KES";
            return Err(Box::new(refusal(StatusCode::BAD_REQUEST, "ESB000001", why)));
        }
        Ok(())
    }

    /// The PIN a disbursement carries, unsealed, is the configured one.
    fn pin_ok(&self, sealed: &str) -> bool {
        let Some(pin) = &self.terms.pin else { return false };
        base64::engine::general_purpose::STANDARD
            .decode(sealed)
            .ok()
            .and_then(|raw| self.key.decrypt(rsa::Pkcs1v15Encrypt, &raw).ok())
            .is_some_and(|clear| clear == pin.expose().as_bytes())
    }
}

fn status_block(http: StatusCode, success: bool, result_code: &str, message: &str) -> Value {
    json!({"code": http.as_u16().to_string(), "message": message, "result_code": result_code, "success": success})
}

fn refusal(http: StatusCode, result_code: &str, message: &str) -> Response {
    (http, axum::Json(json!({"data": {}, "status": status_block(http, false, result_code, message)}))).into_response()
}

/// A transaction Airtel failed (`TF`): final, nothing moved.
fn failed(http: StatusCode, result_code: &str, message: &str) -> Response {
    let body = json!({
        "data": {"transaction": {"status": "TF", "message": message}},
        "status": status_block(http, false, result_code, message),
    });
    (http, axum::Json(body)).into_response()
}

fn success(transaction: Value) -> Value {
    json!({"data": {"transaction": transaction}, "status": status_block(StatusCode::OK, true, "ESB000010", "SUCCESS")})
}

fn text(v: &Value) -> Option<String> {
    v.as_str().map(str::trim).filter(|s| !s.is_empty()).map(str::to_string)
}

/// A subscriber number as Airtel takes it: 9 digits, no country code.
fn subscriber(v: &Value) -> Option<String> {
    text(v).filter(|m| m.len() == 9 && m.bytes().all(|c| c.is_ascii_digit()))
}

/// A transaction id the gateway sends: bounded, no control characters.
fn transaction_id(v: &Value) -> Option<String> {
    text(v).filter(|id| id.len() <= super::wire::TRANSACTION_ID_CHARS_MAX && !id.chars().any(char::is_control))
}

fn parse(body: &Bytes) -> Result<Value, Box<Response>> {
    serde_json::from_slice(body)
        .map_err(|_| Box::new(refusal(StatusCode::BAD_REQUEST, "ESB000001", "Invalid Request Payload")))
}

async fn oauth(State(sim): State<Arc<Sim>>, body: Bytes) -> Response {
    let v = match parse(&body) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let terms = &sim.terms;
    let valid = v["grant_type"] == "client_credentials"
        && v["client_id"].as_str() == Some(terms.client_id.expose())
        && v["client_secret"].as_str() == Some(terms.client_secret.expose());
    if !valid {
        let body = json!({"error": "invalid_client", "error_description": "Client authentication failed"});
        return (StatusCode::UNAUTHORIZED, axum::Json(body)).into_response();
    }
    let token = sim.lock().tokens.issue();
    axum::Json(json!({"access_token": token, "expires_in": TOKEN_TTL_SECS, "token_type": "bearer"})).into_response()
}

async fn collect(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    let v = match sim.authorized(&headers).and_then(|()| parse(&body)) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let (sub, tx) = (&v["subscriber"], &v["transaction"]);
    let kenya = sub["country"] == "KE" && sub["currency"] == "KES" && tx["country"] == "KE" && tx["currency"] == "KES";
    let amount = tx["amount"].as_i64().filter(|a| *a >= 1);
    let (Some(_), Some(msisdn), Some(amount), Some(id), true) =
        (text(&v["reference"]), subscriber(&sub["msisdn"]), amount, transaction_id(&tx["id"]), kenya)
    else {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "Invalid collection request");
    };
    let item = Item::taken(id, Kind::Collection, msisdn, amount);
    sim.record(item, |i| success(json!({"id": i.id, "status": "Success."}))).await
}

async fn disburse(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    let v = match sim.authorized(&headers).and_then(|()| parse(&body)) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let (payee, tx) = (&v["payee"], &v["transaction"]);
    let amount = tx["amount"].as_i64().filter(|a| *a >= 1);
    let (Some(_), Some(msisdn), Some(amount), Some(id), Some(pin)) =
        (text(&v["reference"]), subscriber(&payee["msisdn"]), amount, transaction_id(&tx["id"]), text(&v["pin"]))
    else {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "Invalid disbursement request");
    };
    if !sim.pin_ok(&pin) {
        return failed(StatusCode::OK, "DP00900001017", "Incorrect PIN");
    }
    let item = Item::taken(id, Kind::Payout, msisdn, amount);
    sim.record(item, |i| {
        success(json!({"id": i.id, "airtel_money_id": i.airtel_money_id, "status": "TIP", "message": "In process"}))
    })
    .await
}

/// A refund of a paid collection, by its Airtel reference: done at once, at most once.
async fn refund(State(sim): State<Arc<Sim>>, headers: HeaderMap, body: Bytes) -> Response {
    let v = match sim.authorized(&headers).and_then(|()| parse(&body)) {
        Ok(v) => v,
        Err(refused) => return *refused,
    };
    let Some(reference) = text(&v["transaction"]["airtel_money_id"]) else {
        return refusal(StatusCode::BAD_REQUEST, "ESB000001", "transaction.airtel_money_id is required");
    };
    let amount = {
        let mut inner = sim.lock();
        // Full: refused before anything changes (the refund below would be refused by `record`).
        if inner.items.len() >= sim.items_max {
            return refusal(StatusCode::SERVICE_UNAVAILABLE, "ESB000500", "The simulator is full; restart it");
        }
        let found = inner.items.iter_mut().find(|i| i.kind == Kind::Collection && i.airtel_money_id == reference);
        match found {
            Some(c) if c.status == "paid" => {
                c.status = "refunded";
                c.amount
            }
            Some(c) if c.status == "refunded" => {
                return refusal(StatusCode::OK, "ESB000041", "Transaction already refunded");
            }
            _ => return refusal(StatusCode::OK, "ESB000008", "No successful transaction with this reference"),
        }
    };
    let item = Item {
        originator_id: None,
        status: "done",
        ..Item::taken(format!("refund-{reference}"), Kind::Refund, reference, amount)
    };
    sim.record(item, |i| success(json!({"airtel_money_id": i.airtel_money_id, "status": "SUCCESS"}))).await
}

async fn enquiry(State(sim): State<Arc<Sim>>, Path(id): Path<String>, headers: HeaderMap, kind: Kind) -> Response {
    if let Err(refused) = sim.authorized(&headers) {
        return *refused;
    }
    let inner = sim.lock();
    let Some(item) = inner.items.iter().find(|i| i.kind == kind && i.id == id) else {
        return refusal(StatusCode::OK, "ESB000008", "Transaction not found");
    };
    axum::Json(success(enquiry_answer(item))).into_response()
}

/// What an enquiry says of `item`: its status, and Airtel's money id once it succeeded (none
/// while it is pending or after it failed: nothing was paid).
fn enquiry_answer(item: &Item) -> Value {
    let paid = item.code() == "TS";
    json!({
        "id": item.id,
        "status": item.code(),
        "message": format!("simulated: {}", item.status),
        "airtel_money_id": if paid { Value::from(item.airtel_money_id.clone()) } else { Value::Null },
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The transaction ids the simulator takes are the wire client's: at most
    /// `TRANSACTION_ID_CHARS_MAX` characters, none a control character.
    #[test]
    fn a_transaction_id_is_bounded_and_printable() {
        let max = super::super::wire::TRANSACTION_ID_CHARS_MAX;
        assert_eq!(transaction_id(&json!("pay_01")), Some("pay_01".to_string()));
        assert_eq!(transaction_id(&json!("p".repeat(max))), Some("p".repeat(max)));
        assert_eq!(transaction_id(&json!("p".repeat(max + 1))), None);
        assert_eq!(transaction_id(&json!("pay\u{7}01")), None);
        assert_eq!(transaction_id(&json!("  ")), None);
    }

    /// An enquiry names Airtel's money id of a payment that succeeded, and of no other.
    #[test]
    fn an_enquiry_names_the_money_id_only_of_a_payment_that_succeeded() {
        let mut item = Item::taken("pay_01".into(), Kind::Payout, "733123456".into(), 100);
        item.airtel_money_id = "MP210603.1234.A00001".into();
        for (status, code, money_id) in [
            ("pending", "TIP", Value::Null),
            ("declined", "TF", Value::Null),
            ("expired", "TE", Value::Null),
            ("paid", "TS", json!("MP210603.1234.A00001")),
        ] {
            item.status = status;
            let answer = enquiry_answer(&item);
            assert_eq!((&answer["status"], &answer["airtel_money_id"]), (&json!(code), &money_id), "{status}");
        }
    }
}
