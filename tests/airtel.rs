//! The Airtel Money (Kenya) rail end to end — the rail seam's second implementation: an MCP agent
//! asks for a collection, the local Airtel fake receives it and calls back, and the gateway settles
//! only what Airtel's own transaction enquiry confirms. Beside M-Pesa, the two rails' callbacks
//! never cross.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

#[path = "common/airtel.rs"]
mod airtel;
mod common;
#[path = "common/daraja.rs"]
mod daraja;

use std::sync::Arc;
use std::time::Duration;

use airtel::{AirtelFake, CLIENT_ID, CLIENT_SECRET, CollectMode, EnquiryAnswer, MoneyOutMode, PIN, PUBLIC_KEY_PEM};
use common::*;
use daraja::{DarajaFake, FakeConfig, SANDBOX_PASSKEY};
use paygate::clock::{Clock, ManualClock, SystemClock};
use serde_json::{Value, json};

const SECRET: &str = "airtel-cb-secret-0123456789abcdef";
const MPESA_SECRET: &str = "cb-secret-0123456789abcdefghij";
const SCOPES: &str = "payments:read payments:collect payments:refund payments:integrity";
const POLL_BUDGET: Duration = Duration::from_secs(10);

fn airtel_section(fake: &AirtelFake) -> String {
    format!(
        r#"
[airtel]
enabled = true
base_url = "{base}"
client_id = "{CLIENT_ID}"
client_secret = "{CLIENT_SECRET}"
callback_secret = "{SECRET}"
request_timeout_ms = 500
"#,
        base = fake.base_url()
    )
}

fn mpesa_section(fake: &DarajaFake) -> String {
    format!(
        r#"
[mpesa]
enabled = true
base_url = "{base}"
consumer_key = "fake-consumer-key"
consumer_secret = "fake-consumer-secret"
short_code = "174379"
passkey = "{SANDBOX_PASSKEY}"
callback_secret = "{MPESA_SECRET}"
request_timeout_ms = 500
"#,
        base = fake.base_url()
    )
}

fn overlay(rails: &str) -> String {
    format!(
        r#"
{rails}

[jobs]
enabled = false

[policy]
default_profile = "dev"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent"]
client_ids = []
allowed_accounts = ["acct-A", "acct-B", "airtel-collections", "mpesa-collections"]
autonomous_limit = {{ KES = "1000.00" }}
daily_limit = {{ KES = "100000.00" }}
daily_payments_max = 1000
calls_per_minute = 600
tool_calls_per_minute = {{}}
issuer = ""
"#
    )
}

struct Rig {
    app: TestApp,
    fake: AirtelFake,
    client: Client,
    _dir: tempfile::TempDir,
}

async fn rig_with(overrides: &[(&str, &str)], clock: Arc<dyn Clock>) -> Rig {
    let fake = AirtelFake::start().await;
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(dir.path(), &overlay(&airtel_section(&fake)), overrides, clock).await;
    // Airtel's callback URL is set once, in its portal.
    fake.set_callback_url(&callback_url(&app, SECRET));
    let client = connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    Rig { app, fake, client, _dir: dir }
}

async fn rig() -> Rig {
    rig_with(&[], Arc::new(SystemClock)).await
}

fn collect(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "phone_number": "0733 123 456", "amount": amount,
           "account_reference": "INV-1001", "description": "Order 1001"})
}

async fn payment(c: &Client, id: &str) -> Value {
    ok(&call(c, "get_payment", json!({"payment_id": id})).await).clone()
}

fn callback_url(app: &TestApp, secret: &str) -> String {
    format!("{}/callbacks/airtel/collection/{secret}", app.base())
}

async fn audit_codes(app: &TestApp) -> Vec<String> {
    let records = app.running.store.audit_list(None, 500).await.unwrap();
    records.iter().filter(|r| r.tool == "airtel_callback").filter_map(|r| r.code.clone()).collect()
}

fn id_of(p: &Value) -> String {
    p["payment_id"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn a_collection_is_pending_until_the_enquiry_confirms_the_callback() {
    let r = rig().await;
    let c = &r.client;
    let p = ok(&call(c, "request_airtel_payment", collect("order-1001", "150")).await).clone();
    assert_eq!((p["status"].as_str(), p["replayed"].as_bool()), (Some("pending"), Some(false)));
    assert_eq!((p["amount"].as_str(), p["currency"].as_str()), (Some("150.00"), Some("KES")));
    assert_eq!(p["from_account"], "airtel-254733123456");
    assert_eq!(p["to_account"], "airtel-collections");
    let id = id_of(&p);
    // Airtel received our payment id as its transaction id, the number without country code.
    let sent = r.fake.collections();
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].id.as_str(), sent[0].msisdn.as_str()), (id.as_str(), "733123456"));
    assert_eq!((sent[0].amount, sent[0].reference.as_str()), (150, "INV-1001"));
    assert!(payment(c, &id).await.get("receipt").is_none(), "no receipt before it settles");

    // The agent retries (say the response was lost): the same payment, no second prompt.
    let again = ok(&call(c, "request_airtel_payment", collect("order-1001", "150")).await).clone();
    assert_eq!((again["payment_id"].as_str(), again["replayed"].as_bool()), (Some(id.as_str()), Some(true)));
    assert_eq!(r.fake.collect_requests(), 1);

    // The customer enters their PIN: Airtel calls back, and its enquiry confirms.
    let enquiries = r.fake.enquiry_requests();
    assert_eq!(r.fake.callback(&id, "TS").await, 200);
    assert_eq!(r.fake.enquiry_requests(), enquiries + 1, "the callback was confirmed by enquiry");
    let settled = payment(c, &id).await;
    assert_eq!(settled["status"], "succeeded");
    let receipt = &settled["receipt"];
    assert_eq!(receipt["rail"], "airtel");
    assert_eq!(receipt["reference"], sent[0].airtel_money_id.as_str(), "Airtel's reference is the receipt");
    assert_eq!(receipt["phone"], "25473****456", "the phone is masked");
    assert_eq!(r.fake.callback(&id, "TS").await, 409, "a duplicate changes nothing");

    // A second customer's payment fails.
    let second = ok(&call(c, "request_airtel_payment", collect("order-1002", "20.00")).await).clone();
    let id2 = id_of(&second);
    assert_eq!(r.fake.callback(&id2, "TF").await, 200);
    let failed = payment(c, &id2).await;
    assert_eq!(failed["status"], "failed");
    assert!(failed.get("receipt").is_none());

    let codes = audit_codes(&r.app).await;
    assert_eq!(codes.iter().filter(|c| *c == "SUCCEEDED" || *c == "FAILED").count(), 2, "{codes:?}");
    r.app.assert_secrets_not_logged();
    assert_not_logged(&[SECRET, CLIENT_SECRET]);
    r.app.stop().await;
}

#[tokio::test]
async fn a_forged_success_the_enquiry_contradicts_is_refused() {
    let r = rig().await;
    let c = &r.client;
    let url = callback_url(&r.app, SECRET);
    let p = ok(&call(c, "request_airtel_payment", collect("forged-1", "150")).await).clone();
    let id = id_of(&p);
    let forged = r.fake.callback_body(&id, "TS");

    // Airtel reports a status this gateway does not know: the success is refused, nothing changes.
    r.fake.set_enquiry(&id, EnquiryAnswer::Status("TZ".into()));
    assert_eq!(r.fake.post(&url, forged.clone()).await, 422);
    let still = payment(c, &id).await;
    assert_eq!(still["status"], "pending");
    assert!(still.get("receipt").is_none());
    // Airtel does not know the transaction yet, or it is still in progress: not credited either.
    r.fake.set_enquiry(&id, EnquiryAnswer::NotFound);
    assert_eq!(r.fake.post(&url, forged.clone()).await, 200, "awaiting confirmation");
    assert_eq!(payment(c, &id).await["status"], "pending");

    // Airtel says it failed: the forged success is refused, and Airtel's own word settles it.
    let q = ok(&call(c, "request_airtel_payment", collect("forged-2", "150")).await).clone();
    let id2 = id_of(&q);
    r.fake.set_enquiry(&id2, EnquiryAnswer::Status("TF".into()));
    assert_eq!(r.fake.post(&url, r.fake.callback_body(&id2, "TS")).await, 422);
    assert_eq!(payment(c, &id2).await["status"], "failed");

    // A callback for a transaction the gateway never sent.
    let stranger = r.fake.callback_body("pay_01JDZZZZZZZZZZZZZZZZZZZZZZ", "TS");
    assert_eq!(r.fake.post(&url, stranger).await, 404);

    let codes = audit_codes(&r.app).await;
    assert_eq!(codes.iter().filter(|c| *c == "NOT_CONFIRMED").count(), 2, "{codes:?}");
    assert!(codes.iter().any(|c| c == "AWAITING_CONFIRMATION"), "{codes:?}");
    assert!(!codes.iter().any(|c| c == "SUCCEEDED"), "{codes:?}");
    r.app.stop().await;
}

/// A collection recorded failed that Airtel later calls paid is reported for a human; the record
/// stays failed and takes no receipt from that enquiry (a receipt on a record says the money
/// arrived; only a person settling it may say so).
#[tokio::test]
async fn reconciliation_asks_airtel_again_about_a_failed_collection_and_leaves_its_record() {
    let r = rig().await;
    let c = &r.client;
    let p = ok(&call(c, "request_airtel_payment", collect("recheck-1", "150")).await).clone();
    let id = id_of(&p);
    assert_eq!(r.fake.callback(&id, "TF").await, 200);
    assert_eq!(payment(c, &id).await["status"], "failed");
    let clean = r.app.running.gateway.reconcile(None).await.unwrap();
    assert!(!clean.findings.iter().any(|f| f.kind == "status_mismatch"), "{:?}", clean.findings);
    // Later Airtel's enquiry says the customer paid after all, with its reference.
    r.fake.set_enquiry(&id, EnquiryAnswer::Status("TS".into()));
    let report = r.app.running.gateway.reconcile(None).await.unwrap();
    assert!(
        report.findings.iter().any(|f| f.kind == "status_mismatch" && f.payment_id.as_deref() == Some(id.as_str())),
        "{:?}",
        report.findings
    );
    let after = payment(c, &id).await;
    assert_eq!(after["status"], "failed", "terminal states never change: a human decides");
    assert!(after.get("receipt").is_none(), "no receipt on a failed record: {after}");
    let pid = paygate::domain::ids::PaymentId::parse(&id).unwrap();
    let rec = r.app.running.store.rail_get(&pid).await.unwrap().unwrap();
    assert_eq!((rec.state, rec.receipt), (paygate::domain::rail::RailState::Failed, None), "the stored record too");
    r.app.stop().await;
}

#[tokio::test]
async fn a_collection_whose_answer_is_lost_is_never_sent_again_and_the_enquiry_settles_it() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = rig_with(&[("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "0")], clock.clone()).await;
    let c = &r.client;
    r.fake.set_collect_mode(CollectMode::Hang);
    let first = call(c, "request_airtel_payment", collect("lost-1", "300")).await;
    assert_eq!(code(&first), "OUTCOME_UNKNOWN");
    assert_eq!(err(&first)["retryable"], true);
    assert_eq!(r.fake.collect_requests(), 1);
    let id = r.fake.collections()[0].id.clone();
    r.fake.set_collect_mode(CollectMode::Accept);
    // While the first attempt's lease lasts, a retry is told to wait.
    let busy = call(c, "request_airtel_payment", collect("lost-1", "300")).await;
    assert_eq!(code(&busy), "OPERATION_IN_PROGRESS");
    // After it, the retry takes the operation over, finds the collection may have been sent, and
    // does not send another.
    clock.advance(120);
    let retry = call(c, "request_airtel_payment", collect("lost-1", "300")).await;
    assert_eq!(code(&retry), "OUTCOME_UNKNOWN");
    assert_eq!(r.fake.collect_requests(), 1, "no second collection");

    // The payer is still answering: the scheduled enquiry keeps it open.
    clock.advance(1);
    assert_eq!(r.app.running.gateway.poll_rails(0, POLL_BUDGET).await, 0);
    assert_eq!(payment(c, &id).await["status"], "pending");
    // The payer paid: the enquiry — by the id we chose — settles it, with Airtel's receipt.
    r.fake.set_enquiry(&id, EnquiryAnswer::Status("TS".into()));
    clock.advance(1);
    assert_eq!(r.app.running.gateway.poll_rails(0, POLL_BUDGET).await, 1);
    let paid = payment(c, &id).await;
    assert_eq!(paid["status"], "succeeded", "{paid}");
    assert_eq!(paid["receipt"]["reference"], r.fake.collections()[0].airtel_money_id.as_str());
    assert_eq!(r.fake.collect_requests(), 1);
    r.app.stop().await;
}

#[tokio::test]
async fn refused_and_unavailable_collections_charge_nothing() {
    let r = rig().await;
    let c = &r.client;
    r.fake.set_collect_mode(CollectMode::Refuse);
    let refused = call(c, "request_airtel_payment", collect("refused-1", "150")).await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT");
    assert!(err(&refused)["message"].as_str().unwrap().contains("nothing was charged"), "{:?}", err(&refused));
    r.fake.set_collect_mode(CollectMode::Unavailable);
    let down = call(c, "request_airtel_payment", collect("down-1", "150")).await;
    assert_eq!(code(&down), "BACKEND_UNAVAILABLE");
    // One quick retry of a certainly-unprocessed 503 (retries_max = 1), then no more.
    assert_eq!(r.fake.collect_requests(), 3);
    assert!(r.fake.collections().is_empty());
    // Airtel is back: the same operation is sent now (nothing was started before).
    r.fake.set_collect_mode(CollectMode::Accept);
    let p = ok(&call(c, "request_airtel_payment", collect("down-1", "150")).await).clone();
    assert_eq!(p["status"], "pending");
    assert_eq!(r.fake.collections().len(), 1);
    // A number Airtel cannot reach is refused before anything is sent.
    let safaricom = json!({"operation_id": "mpesa-number", "phone_number": "0712345678", "amount": "150",
                           "account_reference": "INV-1", "description": "d"});
    let wrong = call(c, "request_airtel_payment", safaricom).await;
    assert_eq!(code(&wrong), "INVALID_ARGUMENT");
    assert_eq!(r.fake.collect_requests(), 4);
    r.app.stop().await;
}

/// Issue 53: each Airtel endpoint has its own circuit breaker, shown on the Health page and in
/// /metrics: collections failing open the collection circuit only.
#[tokio::test]
async fn a_failing_airtel_endpoint_opens_its_own_circuit_and_shows_it() {
    let overrides = [("PAYGATE_AIRTEL__RETRIES_MAX", "0"), ("PAYGATE_AIRTEL__BREAKER_FAILURES_MAX", "2")];
    let r = rig_with(&overrides, Arc::new(SystemClock)).await;
    r.fake.set_collect_mode(CollectMode::Unavailable);
    for i in 0..2 {
        let down = call(&r.client, "request_airtel_payment", collect(&format!("down-{i}"), "150")).await;
        assert_eq!(code(&down), "BACKEND_UNAVAILABLE");
    }
    r.fake.set_collect_mode(CollectMode::Accept);
    let refused = call(&r.client, "request_airtel_payment", collect("while-open", "150")).await;
    assert_eq!(code(&refused), "BACKEND_UNAVAILABLE", "the open circuit refuses, unsent");
    assert_eq!(r.fake.collect_requests(), 2);
    let ops = r.app.operator_token("ops", "payments:audit");
    let (_, h) = operator(&r.app, reqwest::Method::GET, "/operator/v1/health", &ops, None).await;
    let rail = h["checks"].as_array().unwrap().iter().find(|c| c["name"] == "rail").unwrap().clone();
    let detail = rail["detail"].as_str().unwrap();
    assert!(rail["ok"] == false && detail.contains("collection") && !detail.contains("enquiry"), "{h}");
    let metrics = reqwest::get(format!("{}/metrics", r.app.base())).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("paygate_rail_breaker_open{rail=\"airtel\",endpoint=\"collection\"} 1"), "{metrics}");
    assert!(metrics.contains("paygate_rail_breaker_open{rail=\"airtel\",endpoint=\"enquiry\"} 0"), "{metrics}");
    // The log line an operator is paged by names the endpoint's breaker.
    let logs = logs_text();
    assert!(
        logs.lines().any(|l| l.contains("circuit opened") && l.contains("airtel collection")),
        "no 'circuit opened' line naming the airtel collection breaker"
    );
    r.app.stop().await;
}

#[tokio::test]
async fn callbacks_without_the_secret_are_refused_and_change_nothing() {
    let r = rig().await;
    let c = &r.client;
    let p = ok(&call(c, "request_airtel_payment", collect("secret-1", "150")).await).clone();
    let id = id_of(&p);
    // Even with Airtel's enquiry saying paid, a callback without the secret is never read.
    r.fake.set_enquiry(&id, EnquiryAnswer::Status("TS".into()));
    let body = r.fake.callback_body(&id, "TS");
    let enquiries = r.fake.enquiry_requests();
    for wrong in [
        callback_url(&r.app, "not-the-airtel-secret-000000000"),
        callback_url(&r.app, MPESA_SECRET),
        format!("{}/callbacks/airtel/collection", r.app.base()),
    ] {
        assert_eq!(r.fake.post(&wrong, body.clone()).await, 404, "{wrong}");
    }
    // Airtel posts collection callbacks only: another channel is malformed for this rail.
    assert_eq!(r.fake.post(&format!("{}/callbacks/airtel/result/{SECRET}", r.app.base()), body.clone()).await, 400);
    assert_eq!(r.fake.enquiry_requests(), enquiries, "nothing was asked");
    assert_eq!(payment(c, &id).await["status"], "pending");
    assert_eq!(
        audit_codes(&r.app).await,
        ["MALFORMED", "BAD_SECRET"],
        "newest first; refusals before reading are throttled"
    );
    // Counted under Airtel's name, every one (the audit throttles, the counters do not), and
    // never as M-Pesa's.
    let metrics = reqwest::get(format!("{}/metrics", r.app.base())).await.unwrap().text().await.unwrap();
    assert!(metrics.contains("paygate_rail_callbacks_total{rail=\"airtel\",outcome=\"bad_secret\"} 3"), "{metrics}");
    assert!(metrics.contains("paygate_rail_callbacks_total{rail=\"airtel\",outcome=\"malformed\"} 1"), "{metrics}");
    assert!(!metrics.contains("paygate_mpesa_callbacks_total{"), "{metrics}");
    r.app.stop().await;
}

#[tokio::test]
async fn mpesa_and_airtel_enabled_together_settle_their_own_and_never_cross() {
    let airtel = AirtelFake::start().await;
    let daraja = DarajaFake::start(FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let rails = format!("{}\n{}", airtel_section(&airtel), mpesa_section(&daraja));
    let app = spawn_with_toml(dir.path(), &overlay(&rails), &[], Arc::new(SystemClock)).await;
    airtel.set_callback_url(&callback_url(&app, SECRET));
    let c = &connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;

    let a = ok(&call(c, "request_airtel_payment", collect("both-airtel", "150")).await).clone();
    let mpesa_args = json!({"operation_id": "both-mpesa", "phone_number": "0712 345 678", "amount": "150",
                            "account_reference": "INV-1001", "description": "Order 1001"});
    let m = ok(&call(c, "request_mpesa_payment", mpesa_args).await).clone();
    let (aid, mid) = (id_of(&a), id_of(&m));
    assert_eq!(
        (a["to_account"].as_str(), m["to_account"].as_str()),
        (Some("airtel-collections"), Some("mpesa-collections"))
    );
    assert_eq!((airtel.collections().len(), daraja.pushes().len()), (1, 1), "each rail got its own request");
    let checkout = daraja.pushes()[0].checkout_request_id.clone();

    // An Airtel callback posted to M-Pesa's URL (with M-Pesa's secret) is not M-Pesa's: refused.
    airtel.set_enquiry(&aid, EnquiryAnswer::Status("TS".into()));
    let mpesa_url = format!("{}/callbacks/mpesa/stk/{MPESA_SECRET}", app.base());
    assert_eq!(airtel.post(&mpesa_url, airtel.callback_body(&aid, "TS")).await, 400);
    // And M-Pesa's callback posted to Airtel's URL is not Airtel's.
    assert_eq!(airtel.post(&callback_url(&app, SECRET), daraja.callback_body(&checkout, 0)).await, 400);
    assert_eq!(payment(c, &aid).await["status"], "pending", "nothing changed");
    assert_eq!(payment(c, &mid).await["status"], "pending", "nothing changed");

    // Each rail's own callback settles its own payment.
    assert_eq!(airtel.callback(&aid, "TS").await, 200);
    assert_eq!(daraja.callback(&checkout, 0).await, 200);
    let (paid_a, paid_m) = (payment(c, &aid).await, payment(c, &mid).await);
    assert_eq!((paid_a["status"].as_str(), paid_m["status"].as_str()), (Some("succeeded"), Some("succeeded")));
    assert_eq!(
        (paid_a["receipt"]["rail"].as_str(), paid_m["receipt"]["rail"].as_str()),
        (Some("airtel"), Some("mpesa"))
    );
    // The scheduler asks each rail about its own records only: nothing is left to settle.
    assert_eq!(app.running.gateway.poll_rails(0, POLL_BUDGET).await, 0);
    app.assert_secrets_not_logged();
    assert_not_logged(&[SECRET, MPESA_SECRET, CLIENT_SECRET, "fake-consumer-secret"]);
    app.stop().await;
}

fn any_rail(op: &str, phone: &str) -> Value {
    json!({"operation_id": op, "phone_number": phone, "amount": "150",
           "account_reference": "INV-1001", "description": "Order 1001"})
}

/// One tool for any rail: `request_payment` (and the seed's `initiate_payment`) chooses the rail by
/// the number's operator — a Safaricom number lands on M-Pesa, an Airtel one on Airtel Money — or
/// by an explicit `rail`; the routed call is the rail's own tool (one operation_id, one prompt,
/// whichever name); a number no enabled rail serves, or an unknown rail, is refused and sends nothing.
#[tokio::test]
async fn request_payment_chooses_the_rail_by_the_numbers_operator() {
    let airtel = AirtelFake::start().await;
    let daraja = DarajaFake::start(FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    // M-Pesa last, with its API operator: it pays customers too.
    let initiator =
        "initiator_name = \"testapi\"\nsecurity_credential = \"fake-security-credential\"\nb2c_short_code = \"600996\"";
    let rails = format!("{}\n{}\n{initiator}\n", airtel_section(&airtel), mpesa_section(&daraja));
    let app = spawn_with_toml(dir.path(), &overlay(&rails), &[], Arc::new(SystemClock)).await;
    airtel.set_callback_url(&callback_url(&app, SECRET));
    let c = &connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;

    let m = ok(&call(c, "request_payment", any_rail("route-1", "0712 345 678")).await).clone();
    let a = ok(&call(c, "initiate_payment", any_rail("route-2", "0733 123 456")).await).clone();
    assert_eq!(
        (m["to_account"].as_str(), a["to_account"].as_str()),
        (Some("mpesa-collections"), Some("airtel-collections"))
    );
    assert_eq!((daraja.pushes().len(), airtel.collections().len()), (1, 1), "each number on its operator's rail");
    assert_eq!(daraja.pushes()[0].phone, "254712345678");
    // 0757 is Safaricom's inside Airtel's 075 block: the longest prefix wins.
    let safaricom_075 = ok(&call(c, "request_payment", any_rail("route-3", "0757 000 111")).await).clone();
    assert_eq!(safaricom_075["to_account"], "mpesa-collections");
    assert_eq!(daraja.pushes().len(), 2);

    // The routed call is the rail's own tool: the same operation_id through either name is one
    // payment and one prompt.
    let again = ok(&call(c, "request_mpesa_payment", any_rail("route-1", "0712 345 678")).await).clone();
    assert_eq!((again["payment_id"].clone(), again["replayed"].as_bool()), (m["payment_id"].clone(), Some(true)));
    let again = ok(&call(c, "request_payment", any_rail("route-2", "0733 123 456")).await).clone();
    assert_eq!((again["payment_id"].clone(), again["replayed"].as_bool()), (a["payment_id"].clone(), Some(true)));
    assert_eq!((daraja.pushes().len(), airtel.collections().len()), (2, 1));

    // An explicit rail is obeyed, and its own rules then apply (an M-Pesa number is not Airtel's).
    let mut named = any_rail("route-4", "0712 345 678");
    named["rail"] = json!("airtel");
    let refused = call(c, "request_payment", named).await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused:?}");
    for (args, needle) in [
        (any_rail("route-5", "0770 123 456"), "no enabled rail serves numbers starting 0770"),
        (any_rail("route-6", "+1 555 0100"), "phone_number"),
        (
            {
                let mut a = any_rail("route-7", "0712 345 678");
                a["rail"] = json!("paypal");
                a
            },
            "rail: \"paypal\" is not enabled",
        ),
    ] {
        let bad = call(c, "request_payment", args).await;
        assert_eq!(code(&bad), "INVALID_ARGUMENT", "{bad:?}");
        assert!(err(&bad)["message"].as_str().unwrap().contains(needle), "{needle}: {bad:?}");
    }
    assert_eq!((daraja.pushes().len(), airtel.collections().len()), (2, 1), "a refusal sends nothing");

    // send_payment: a Safaricom number is an M-Pesa B2C payout; Airtel without its disbursement PIN
    // pays no customers, so an Airtel number's payout is refused.
    let payer = connect(&app.url, &app.token("dev-agent", "payments:read payments:payout"), Era::Modern).await;
    let payout = json!({"operation_id": "route-p0", "phone_number": "0712 345 678", "amount": "10", "remarks": "r"});
    let paid = ok(&call(&payer, "send_payment", payout).await).clone();
    assert_eq!((paid["to_account"].as_str(), daraja.payouts().len()), (Some("mpesa-254712345678"), 1));
    let payout = json!({"operation_id": "route-p1", "phone_number": "0733 123 456", "amount": "10", "remarks": "r"});
    let refused = call(&payer, "send_payment", payout).await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused:?}");
    assert!(err(&refused)["message"].as_str().unwrap().contains("payouts through Airtel"), "{refused:?}");
    // The preflight answers for the routed tools, through the same choice.
    let ask = |tool: &str, args: Value| json!({"tool": tool, "arguments": args});
    let pre = ok(&call(c, "check_payment_policy", ask("initiate_payment", any_rail("route-8", "0733 123 456"))).await)
        .clone();
    assert_eq!(pre["verdict"], "allowed", "{pre}");
    let pre =
        ok(&call(c, "check_payment_policy", ask("request_payment", any_rail("route-9", "0770 123 456"))).await).clone();
    assert_eq!((pre["verdict"].as_str(), pre["code"].as_str()), (Some("denied"), Some("INVALID_ARGUMENT")), "{pre}");
    // `"rail": null` is no rail named, for the preflight as for the call.
    let mut unnamed = any_rail("route-10", "0712 345 678");
    unnamed["rail"] = Value::Null;
    let pre = ok(&call(c, "check_payment_policy", ask("request_payment", unnamed)).await).clone();
    assert_eq!(pre["verdict"], "allowed", "{pre}");
    assert_eq!((daraja.pushes().len(), airtel.collections().len()), (2, 1), "a preflight sends nothing");
    // And the check_transaction_status alias reads the same payment.
    let status = ok(&call(c, "check_payment_status", json!({"payment_id": m["payment_id"]})).await).clone();
    assert_eq!(status["payment_id"], m["payment_id"]);
    app.stop().await;
}

/// M-Pesa (paying customers too) and Airtel (with its disbursement PIN) on one gateway.
async fn both_rails_paying() -> (TestApp, AirtelFake, DarajaFake, tempfile::TempDir) {
    let airtel = AirtelFake::start().await;
    let daraja = DarajaFake::start(FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let initiator =
        "initiator_name = \"testapi\"\nsecurity_credential = \"fake-security-credential\"\nb2c_short_code = \"600996\"";
    let rails = format!("{}\n{}\n{initiator}\n", paying_airtel_section(&airtel), mpesa_section(&daraja));
    let app = spawn_with_toml(dir.path(), &overlay(&rails), &[], Arc::new(SystemClock)).await;
    airtel.set_callback_url(&callback_url(&app, SECRET));
    (app, airtel, daraja, dir)
}

/// The stop-66 review (high): a trigger that swallowed the idempotency record's insert left the
/// key shared across the rails unwritten, so one operation paid out on M-Pesa and then on Airtel
/// (and a collection was pushed on both), every check green. A reservation that did not write
/// its record is now refused retryably and nothing is sent; healed, the operation pays once, on
/// one rail.
#[tokio::test]
async fn a_swallowed_idempotency_record_never_lets_one_operation_pay_on_two_rails() {
    let (app, airtel, daraja, _dir) = both_rails_paying().await;
    let c = connect(&app.url, &app.token("dev-agent", &format!("{SCOPES} payments:payout")), Era::Modern).await;
    let db = rusqlite::Connection::open(app.data_dir.join("paygate.sqlite3")).unwrap();
    db.busy_timeout(Duration::from_secs(5)).unwrap();
    let sent = || (airtel.disburse_requests(), daraja.payouts().len());
    let to = |phone: &str| json!({"operation_id": "s1", "phone_number": phone, "amount": "40", "remarks": "r"});
    db.execute_batch("CREATE TRIGGER sw BEFORE INSERT ON idempotency_records BEGIN SELECT RAISE(IGNORE); END;")
        .unwrap();
    for phone in ["0712 345 678", "0733 123 456"] {
        let refused = call(&c, "send_payment", to(phone)).await;
        assert_eq!(err(&refused)["retryable"], true, "{refused:?}");
        assert_ne!(code(&refused), "OUTCOME_UNKNOWN", "nothing was sent: {refused:?}");
    }
    let pushed = call(&c, "request_payment", any_rail("s3", "0712 345 678")).await;
    assert_eq!(err(&pushed)["retryable"], true, "{pushed:?}");
    assert_eq!((sent(), daraja.pushes().len()), ((0, 0), 0), "nothing went out on either rail");
    db.execute_batch("DROP TRIGGER sw").unwrap();
    let paid = ok(&call(&c, "send_payment", to("0712 345 678")).await).clone();
    assert_eq!(paid["to_account"], "mpesa-254712345678");
    let other = call(&c, "send_payment", to("0733 123 456")).await;
    assert_eq!(code(&other), "IDEMPOTENCY_CONFLICT", "{other:?}");
    assert_eq!(sent(), (0, 1), "one payout, on M-Pesa");
    app.stop().await;
}

/// One operation_id is one payment whichever rail carries it: a retry of `send_payment` (or
/// `request_payment`) that names the other rail, or calls the other rail's own tool, is
/// `IDEMPOTENCY_CONFLICT` and sends nothing there; retried as first called it replays. Racing
/// calls that name different rails for one operation_id send one payout between them.
/// (Stop-65 review: the hint re-keyed the call and the same operation paid out on both rails.)
#[tokio::test]
async fn one_operation_id_pays_on_one_rail_whatever_rail_a_retry_names() {
    let (app, airtel, daraja, _dir) = both_rails_paying().await;
    let scopes = format!("{SCOPES} payments:payout");
    let c = connect(&app.url, &app.token("dev-agent", &scopes), Era::Modern).await;
    let with_rail = |mut args: Value, rail: &str| {
        args["rail"] = json!(rail);
        args
    };
    let sent = || (airtel.disburse_requests(), daraja.payouts().len());

    // A payout routed to Airtel by the number; the retry names M-Pesa, then calls M-Pesa's tool.
    let first = ok(&call(&c, "send_payment", payout("x1", "100")).await).clone();
    assert_eq!(first["to_account"], "airtel-254733123456");
    assert_eq!(sent(), (1, 0));
    for (tool, args) in
        [("send_payment", with_rail(payout("x1", "100"), "mpesa")), ("send_mpesa_payout", payout("x1", "100"))]
    {
        let other = call(&c, tool, args).await;
        assert_eq!(code(&other), "IDEMPOTENCY_CONFLICT", "{tool}: {other:?}");
        assert!(err(&other)["message"].as_str().unwrap().contains("another rail"), "{other:?}");
    }
    assert_eq!(sent(), (1, 0), "nothing went out on M-Pesa");
    // Retried as first called (or naming the rail it went to, or through that rail's own tool): a replay.
    for (tool, args) in [
        ("send_payment", payout("x1", "100")),
        ("send_payment", with_rail(payout("x1", "100"), "airtel")),
        ("send_airtel_payout", payout("x1", "100")),
    ] {
        let again = ok(&call(&c, tool, args).await).clone();
        assert_eq!(
            (again["payment_id"].clone(), again["replayed"].as_bool()),
            (first["payment_id"].clone(), Some(true))
        );
    }
    assert_eq!(sent(), (1, 0));

    // The other way round: M-Pesa first, by name; then Airtel by the number.
    let mpesa = ok(&call(&c, "send_payment", with_rail(payout("x2", "100"), "mpesa")).await).clone();
    assert_eq!(mpesa["to_account"], "mpesa-254733123456");
    assert_eq!(sent(), (1, 1));
    let other = call(&c, "send_payment", payout("x2", "100")).await;
    assert_eq!(code(&other), "IDEMPOTENCY_CONFLICT", "{other:?}");
    assert_eq!(sent(), (1, 1));

    // Collections alike: an STK push for an operation that went to Airtel is never sent.
    let collected = ok(&call(&c, "request_payment", any_rail("c1", "0733 123 456")).await).clone();
    assert_eq!(collected["to_account"], "airtel-collections");
    let other = call(&c, "request_payment", with_rail(any_rail("c1", "0733 123 456"), "mpesa")).await;
    assert_eq!(code(&other), "IDEMPOTENCY_CONFLICT", "{other:?}");
    let other = call(&c, "request_mpesa_payment", any_rail("c1", "0733 123 456")).await;
    assert_eq!(code(&other), "IDEMPOTENCY_CONFLICT", "{other:?}");
    assert_eq!((airtel.collections().len(), daraja.pushes().len()), (1, 0));

    // Racing: eight calls for one operation_id at once, half naming each rail: one payout.
    let c = Arc::new(c);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..8 {
        let c = c.clone();
        let rail = if i % 2 == 0 { "mpesa" } else { "airtel" };
        set.spawn(async move { call(&c, "send_payment", with_rail(payout("x3", "100"), rail)).await });
    }
    let mut paid = std::collections::BTreeSet::new();
    while let Some(res) = set.join_next().await {
        let res = res.unwrap();
        match res.is_error {
            Some(true) => {
                assert!(["IDEMPOTENCY_CONFLICT", "OPERATION_IN_PROGRESS"].contains(&code(&res).as_str()), "{res:?}")
            }
            _ => {
                paid.insert(ok(&res)["payment_id"].as_str().unwrap().to_string());
            }
        }
    }
    assert_eq!(paid.len(), 1, "one payment between them: {paid:?}");
    let (a, m) = sent();
    assert_eq!(a + m, 3, "one more payout in all, on one rail");
    app.stop().await;
}

/// The stop-66 review (medium): a database writer deleting an operation's idempotency records
/// (its rail tool's and its family's) let a retry naming the other rail pay again there. The rail
/// record names the operation's family too, unique across rails: the retry finds it and is
/// `IDEMPOTENCY_CONFLICT`, and nothing goes out on the other rail.
#[tokio::test]
async fn one_operation_pays_on_one_rail_even_with_its_idempotency_records_deleted() {
    let (app, airtel, daraja, _dir) = both_rails_paying().await;
    let scopes = format!("{SCOPES} payments:payout");
    let c = connect(&app.url, &app.token("dev-agent", &scopes), Era::Modern).await;
    let sent = || (airtel.disburse_requests(), daraja.payouts().len());
    let mut to_mpesa = payout("gone-1", "100");
    to_mpesa["rail"] = json!("mpesa");
    ok(&call(&c, "send_payment", payout("gone-1", "100")).await);
    assert_eq!(sent(), (1, 0));
    let db = rusqlite::Connection::open(app.data_dir.join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    let deleted = db.execute("DELETE FROM idempotency_records", []).unwrap();
    assert!(deleted >= 2, "the tool's and the family's records: {deleted}");
    for (tool, args) in [("send_payment", to_mpesa), ("send_mpesa_payout", payout("gone-1", "100"))] {
        let other = call(&c, tool, args).await;
        assert_eq!(code(&other), "IDEMPOTENCY_CONFLICT", "{tool}: {other:?}");
    }
    assert_eq!(sent(), (1, 0), "nothing went out on M-Pesa");
    app.stop().await;
}

/// The third stop-68 review (medium): a payout a human rejected on M-Pesa, asked again under the
/// same operation_id on Airtel, was put before another person, approved and paid there. A
/// rejection sticks to the operation on every rail of its family.
#[tokio::test]
async fn a_rejection_on_one_rail_sticks_on_the_other() {
    let (app, airtel, daraja, _dir) = both_rails_paying().await;
    let scopes = format!("{SCOPES} payments:payout");
    let c = connect(&app.url, &app.token("dev-agent", &scopes), Era::Modern).await;
    let mut on_mpesa = payout("rej-1", "1500");
    on_mpesa["rail"] = json!("mpesa");
    let asked = call(&c, "send_payment", on_mpesa).await;
    assert_eq!(code(&asked), "APPROVAL_REQUIRED", "{asked:?}");
    let approval = err(&asked)["approval_id"].as_str().unwrap().to_string();
    let carol = app.operator_token("carol", "payments:approve");
    let reject = format!("/approvals/{approval}/reject");
    let (status, body) = operator(&app, reqwest::Method::POST, &reject, &carol, Some(json!({"reason": "no"}))).await;
    assert_eq!(status, 200, "{body}");
    for (tool, args) in [("send_payment", payout("rej-1", "1500")), ("send_airtel_payout", payout("rej-1", "1500"))] {
        let again = call(&c, tool, args).await;
        assert_eq!(code(&again), "APPROVAL_REJECTED", "{tool}: {again:?}");
        assert_eq!(err(&again)["approval_id"].as_str(), Some(approval.as_str()), "{again:?}");
    }
    assert_eq!((airtel.disburse_requests(), daraja.payouts().len()), (0, 0), "nothing went out");
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// Payouts (disbursements) and refunds

/// `[airtel]` with the disbursing wallet's PIN and Airtel's public key: payouts are offered.
fn paying_airtel_section(fake: &AirtelFake) -> String {
    format!("{}disbursement_pin = \"{PIN}\"\npublic_key = '''\n{PUBLIC_KEY_PEM}'''\n", airtel_section(fake))
}

/// A rig whose Airtel pays out; `wait_ms`: how long a call waits for its key in flight.
async fn paying_rig(clock: Arc<dyn Clock>, wait_ms: &str) -> Rig {
    paying_rig_with(clock, &[("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", wait_ms)]).await
}

async fn paying_rig_with(clock: Arc<dyn Clock>, overrides: &[(&str, &str)]) -> Rig {
    let fake = AirtelFake::start().await;
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(dir.path(), &overlay(&paying_airtel_section(&fake)), overrides, clock).await;
    fake.set_callback_url(&callback_url(&app, SECRET));
    let client = connect(&app.url, &app.token("dev-agent", &format!("{SCOPES} payments:payout")), Era::Modern).await;
    Rig { app, fake, client, _dir: dir }
}

fn payout(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "phone_number": "0733 123 456", "amount": amount, "remarks": "Refund INV-1001"})
}

/// A payout to an Airtel wallet: 32 identical calls at once send one disbursement (carrying the
/// PIN encrypted with Airtel's key) and replay one payment; the scheduled enquiry settles it with
/// Airtel's receipt. `send_payment` routes an Airtel number there, in the same operation_id space.
#[tokio::test]
async fn an_airtel_payout_is_sent_once_under_concurrent_retries_and_the_enquiry_settles_it() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = paying_rig(clock.clone(), "10000").await;
    let c = &r.client;
    let agent = Arc::new(connect(&r.app.url, &r.app.token("dev-agent", "payments:payout"), Era::Modern).await);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let agent = agent.clone();
        set.spawn(async move { call(&agent, "send_airtel_payout", payout("pay-1", "250")).await });
    }
    let (mut ids, mut replayed) = (std::collections::BTreeSet::new(), 0);
    while let Some(res) = set.join_next().await {
        let res = res.unwrap();
        ids.insert(ok(&res)["payment_id"].as_str().unwrap().to_string());
        replayed += usize::from(ok(&res)["replayed"] == true);
    }
    assert_eq!((ids.len(), replayed), (1, 31), "one payout, 31 replays");
    assert_eq!(r.fake.disburse_requests(), 1, "Airtel received one disbursement");
    let d = r.fake.disbursements()[0].clone();
    assert_eq!((d.msisdn.as_str(), d.amount, d.pin.as_str()), ("733123456", 250, PIN));
    assert_eq!(d.reference, "Refund INV-1001");
    assert_eq!(ids.first(), Some(&d.id), "Airtel's transaction id is the gateway's payment id");
    let p = payment(c, &d.id).await;
    assert_eq!((p["status"].as_str(), p["to_account"].as_str()), (Some("pending"), Some("airtel-254733123456")));

    // Still in progress at Airtel: the enquiry keeps it open; then it is paid.
    clock.advance(120);
    assert_eq!(r.app.running.gateway.poll_rails(0, POLL_BUDGET).await, 0);
    assert_eq!(payment(c, &d.id).await["status"], "pending");
    r.fake.set_disbursement_status(&d.id, "TS");
    clock.advance(1);
    assert_eq!(r.app.running.gateway.poll_rails(0, POLL_BUDGET).await, 1);
    let paid = payment(c, &d.id).await;
    assert_eq!(paid["status"], "succeeded", "{paid}");
    assert_eq!(paid["receipt"]["reference"], d.airtel_money_id.as_str());

    // One tool for any rail: an Airtel number's send_payment is this rail's payout.
    let routed = ok(&call(c, "send_payment", payout("pay-2", "100")).await).clone();
    assert_eq!(routed["to_account"], "airtel-254733123456");
    assert_eq!(r.fake.disburse_requests(), 2);
    // The same operation_id through the rail's own tool is the same payout.
    let again = ok(&call(c, "send_airtel_payout", payout("pay-2", "100")).await).clone();
    assert_eq!((again["payment_id"].clone(), again["replayed"].as_bool()), (routed["payment_id"].clone(), Some(true)));
    assert_eq!(r.fake.disburse_requests(), 2);
    r.app.assert_secrets_not_logged();
    assert_not_logged(&[SECRET, CLIENT_SECRET]);
    r.app.stop().await;
}

/// A disbursement whose answer was lost may have paid: it is never sent again, and the enquiry by
/// the gateway's id settles it (here a failure: nothing was paid).
#[tokio::test]
async fn an_airtel_payout_whose_answer_is_lost_is_never_resent_and_the_enquiry_settles_it() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = paying_rig(clock.clone(), "0").await;
    let c = &r.client;
    r.fake.set_disburse_mode(MoneyOutMode::Hang);
    let first = call(c, "send_airtel_payout", payout("lost-pay", "300")).await;
    assert_eq!(code(&first), "OUTCOME_UNKNOWN");
    r.fake.set_disburse_mode(MoneyOutMode::Accept);
    clock.advance(120);
    let retry = call(c, "send_airtel_payout", payout("lost-pay", "300")).await;
    assert_eq!(code(&retry), "OUTCOME_UNKNOWN");
    assert_eq!(r.fake.disburse_requests(), 1, "never sent again");
    let id = r.fake.disbursements()[0].id.clone();
    r.fake.set_disbursement_status(&id, "TF");
    clock.advance(1);
    assert_eq!(r.app.running.gateway.poll_rails(0, POLL_BUDGET).await, 1);
    let failed = payment(c, &id).await;
    assert_eq!(failed["status"], "failed", "{failed}");
    assert_eq!(r.fake.disburse_requests(), 1);
    r.app.stop().await;
}

/// The payment id of the only Airtel payment of `amount` the operator API lists.
async fn payout_id_of(app: &TestApp, amount: &str) -> String {
    let token = app.operator_token("auditor", "payments:audit");
    let (status, page) = operator(app, reqwest::Method::GET, "/operator/v1/payments?rail=airtel", &token, None).await;
    assert_eq!(status, 200, "{page}");
    let items = page["items"].as_array().unwrap();
    let open: Vec<&Value> = items.iter().filter(|p| p["amount"] == amount).collect();
    assert_eq!(open.len(), 1, "{amount}: {page}");
    open[0]["payment_id"].as_str().unwrap().to_string()
}

/// A payout that never reached Airtel stays unknown for ever (Airtel's enquiry answers
/// "Transaction not found", which is no failure, and the gateway never sends it again). Two people
/// who read the statement settle it: never one, never the agent it was for, never before
/// `approvals.resolution_after_secs`, never against Airtel's own word; and a proposal a database
/// writer inserts stands in for nobody.
#[tokio::test]
async fn a_payout_airtel_never_received_is_settled_by_two_people_and_only_so() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let overrides = [("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "0"), ("PAYGATE_APPROVALS__RESOLUTION_AFTER_SECS", "600")];
    let r = paying_rig_with(clock.clone(), &overrides).await;
    let c = &r.client;
    // held-1 is lost on its way (Airtel never sees it); held-2 reaches Airtel, which never answers.
    r.fake.set_disburse_mode(MoneyOutMode::Swallow);
    assert_eq!(code(&call(c, "send_airtel_payout", payout("held-1", "300")).await), "OUTCOME_UNKNOWN");
    r.fake.set_disburse_mode(MoneyOutMode::Hang);
    assert_eq!(code(&call(c, "send_airtel_payout", payout("held-2", "200")).await), "OUTCOME_UNKNOWN");
    r.fake.set_disburse_mode(MoneyOutMode::Accept);
    let held = payout_id_of(&r.app, "300.00").await;
    let known = payout_id_of(&r.app, "200.00").await;
    assert_eq!(r.fake.disbursements().len(), 1, "Airtel holds held-2 only");
    // (The sealing job is off here: the trail is sealed by hand before the clock moves on.)
    r.app.running.gateway.seal_audit_at_stop().await;
    // The enquiry cannot settle held-1 (not found) nor held-2 (in progress): both stay open.
    clock.advance(120);
    assert_eq!(r.app.running.gateway.poll_rails(0, POLL_BUDGET).await, 0);
    assert_eq!(payment(c, &held).await["status"], "pending");
    // Reconciliation names both, though the poll job has just touched them (it asks by age since
    // they were made), and says how the one nobody can answer for is settled.
    let report = ok(&call(c, "reconcile", json!({})).await).clone();
    let unknown: Vec<&Value> = report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| {
            f["kind"] == "outcome_unknown" && (f["payment_id"] == held.as_str() || f["payment_id"] == known.as_str())
        })
        .collect();
    assert_eq!(unknown.len(), 2, "{report}");
    assert!(unknown.iter().all(|f| f["detail"].as_str().unwrap().contains("/resolve")), "{report}");

    let app = &r.app;
    let resolve = |id: &str, who: &str, scope: &str, body: Value| {
        let (path, token) = (format!("/operator/v1/payments/{id}/resolve"), app.operator_token(who, scope));
        async move { operator(app, reqwest::Method::POST, &path, &token, Some(body)).await }
    };
    let admin = "payments:admin";
    let failed = json!({"outcome": "failed", "reason": "not on the disbursement statement of the day"});
    let code_of = |b: &Value| b["error"]["code"].as_str().unwrap_or("-").to_string();

    // Too soon: Airtel may still answer.
    let (status, body) = resolve(&held, "alice", admin, failed.clone()).await;
    assert_eq!((status.as_u16(), code_of(&body).as_str()), (409, "CONFLICT"), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("approvals.resolution_after_secs"), "{body}");
    clock.advance(480);
    // Only payments:admin; never the agent the payment was for; a success needs its receipt.
    let (status, _) = resolve(&held, "alice", "payments:approve", failed.clone()).await;
    assert_eq!(status, 403);
    let (status, body) = resolve(&held, "dev-agent", admin, failed.clone()).await;
    assert_eq!((status.as_u16(), code_of(&body).as_str()), (403, "SELF_REVIEW"), "{body}");
    let paid_without = json!({"outcome": "succeeded", "reason": "on the statement"});
    assert_eq!(resolve(&held, "alice", admin, paid_without).await.0, 400);
    // One person proposes; the same person again is no second pair of eyes.
    let (status, body) = resolve(&held, "alice", admin, failed.clone()).await;
    assert_eq!((status.as_u16(), body["status"].as_str()), (202, Some("proposed")), "{body}");
    let (status, body) = resolve(&held, "alice", admin, failed.clone()).await;
    assert_eq!((status.as_u16(), code_of(&body).as_str()), (403, "SELF_REVIEW"), "{body}");
    assert_eq!(payment(c, &held).await["status"], "pending", "a proposal settles nothing");
    // A second person confirms the same outcome: it settles, naming both.
    let (status, body) = resolve(&held, "bob", admin, failed.clone()).await;
    assert_eq!((status.as_u16(), body["status"].as_str()), (200, Some("resolved")), "{body}");
    assert_eq!((body["proposed_by"].as_str(), body["confirmed_by"].as_str()), (Some("alice"), Some("bob")));
    let settled = payment(c, &held).await;
    assert_eq!(settled["status"], "failed", "{settled}");
    // The payment's timeline, as the console shows it, names both steps and both people.
    let auditor = app.operator_token("auditor", "payments:audit");
    let (_, detail) =
        operator(app, reqwest::Method::GET, &format!("/operator/v1/payments/{held}"), &auditor, None).await;
    let steps: Vec<(String, String)> = detail["timeline"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["tool"] == "resolve_payment")
        .map(|e| (e["step"].as_str().unwrap().to_string(), e["actor"].as_str().unwrap().to_string()))
        .collect();
    let want =
        [("resolution_proposed", "alice"), ("settled_by_hand", "bob")].map(|(s, a)| (s.to_string(), a.to_string()));
    assert_eq!(steps, want, "{detail}");
    // The agent's retry learns it failed; nothing is sent, and the operation is closed.
    let retry = ok(&call(c, "send_airtel_payout", payout("held-1", "300")).await).clone();
    assert_eq!((retry["payment_id"].as_str(), retry["status"].as_str()), (Some(held.as_str()), Some("failed")));
    assert_eq!((r.fake.disburse_requests(), r.fake.disbursements().len()), (2, 1), "never sent again");
    let (status, body) = resolve(&held, "carol", admin, failed.clone()).await;
    assert_eq!((status.as_u16(), code_of(&body).as_str()), (409, "CONFLICT"), "settled: {body}");

    // Airtel knows held-2: in progress, its word is awaited; then paid, its word settles it.
    assert_eq!(resolve(&known, "alice", admin, failed.clone()).await.0, 202);
    let (status, body) = resolve(&known, "bob", admin, failed.clone()).await;
    assert_eq!((status.as_u16(), code_of(&body).as_str()), (409, "CONFLICT"), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("still open"), "{body}");
    assert_eq!(payment(c, &known).await["status"], "pending");
    r.fake.set_disbursement_status(&known, "TS");
    let (status, body) = resolve(&known, "bob", admin, failed.clone()).await;
    assert_eq!(status, 409, "{body}");
    let paid = payment(c, &known).await;
    assert_eq!(paid["status"], "succeeded", "Airtel's word, not the people's: {paid}");

    // The trail names both people, and holds.
    let records = r.app.running.store.audit_list(None, 500).await.unwrap();
    let by = |decision: &str| -> Vec<String> {
        records.iter().filter(|a| a.decision == decision).map(|a| a.principal_sub.clone()).collect()
    };
    assert_eq!(by("resolution_proposed"), ["alice", "alice"], "newest first");
    assert_eq!(by("resolution_confirmed"), ["bob"]);
    r.app.running.gateway.seal_audit_at_stop().await;
    let verdict = r.app.running.gateway.verify_audit(None).await.unwrap();
    assert!(verdict.ok, "{verdict:?}");

    // A proposal written into the trail by a database writer (no writer's tag) is nobody's.
    r.fake.set_disburse_mode(MoneyOutMode::Swallow);
    assert_eq!(code(&call(c, "send_airtel_payout", payout("held-3", "100")).await), "OUTCOME_UNKNOWN");
    let forged_for = payout_id_of(&r.app, "100.00").await;
    clock.advance(601);
    let mut forged = records.iter().find(|a| a.decision == "resolution_proposed").unwrap().clone();
    (forged.seq, forged.at, forged.principal_sub, forged.tag) = (0, clock.now(), "mallory".into(), None);
    forged.payment_id = Some(forged_for.clone());
    forged.detail = Some(json!({"outcome": "failed", "receipt": null, "reason": "forged"}).to_string());
    r.app.running.store.audit_append(forged).await.unwrap();
    let (status, body) = resolve(&forged_for, "carol", admin, failed.clone()).await;
    assert_eq!((status.as_u16(), body["status"].as_str()), (202, Some("proposed")), "{body}");
    assert_eq!(payment(c, &forged_for).await["status"], "pending");
    r.app.stop().await;
}

/// Refusals move nothing: Airtel failing the transaction, Airtel unavailable, a number that is not
/// Airtel's, cents; over the autonomous limit a human must approve first.
#[tokio::test]
async fn refused_and_over_limit_airtel_payouts_move_nothing() {
    let r = paying_rig(Arc::new(SystemClock), "0").await;
    let c = &r.client;
    r.fake.set_disburse_mode(MoneyOutMode::Refuse);
    let refused = call(c, "send_airtel_payout", payout("no-1", "150")).await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT");
    assert!(err(&refused)["message"].as_str().unwrap().contains("no money moved"), "{:?}", err(&refused));
    r.fake.set_disburse_mode(MoneyOutMode::Unavailable);
    assert_eq!(code(&call(c, "send_airtel_payout", payout("no-2", "150")).await), "BACKEND_UNAVAILABLE");
    r.fake.set_disburse_mode(MoneyOutMode::Accept);
    let safaricom = json!({"operation_id": "no-3", "phone_number": "0712345678", "amount": "150", "remarks": "r"});
    assert_eq!(code(&call(c, "send_airtel_payout", safaricom).await), "INVALID_ARGUMENT");
    assert_eq!(code(&call(c, "send_airtel_payout", payout("no-4", "150.50")).await), "INVALID_ARGUMENT");
    let over = call(c, "send_airtel_payout", payout("no-5", "1500")).await;
    assert_eq!(code(&over), "APPROVAL_REQUIRED", "{:?}", err(&over));
    assert!(r.fake.disbursements().is_empty(), "nothing was paid");
    // A refused operation started nothing: once Airtel is back it is sent (once).
    let sent = ok(&call(c, "send_airtel_payout", payout("no-2", "150")).await).clone();
    assert_eq!((sent["status"].as_str(), r.fake.disbursements().len()), (Some("pending"), 1));
    // The smallest payout Airtel takes, one shilling, goes out too.
    let one = ok(&call(c, "send_airtel_payout", payout("one-shilling", "1")).await).clone();
    assert_eq!(one["status"], "pending", "{one}");
    assert_eq!(r.fake.disbursements().last().map(|d| d.amount), Some(1));
    r.app.stop().await;
}

fn refund_args(op: &str, pid: &str, amount: Option<&str>) -> Value {
    let mut a = json!({"operation_id": op, "payment_id": pid, "reason": "goods returned"});
    if let Some(amount) = amount {
        a["amount"] = json!(amount);
    }
    a
}

/// `refund_payment` of a succeeded Airtel collection refunds it through Airtel, in full, once:
/// concurrent retries and a second operation send one refund, which Airtel's answer settles at
/// once; a part refund and a refund of an unpaid collection are refused before anything is sent.
#[tokio::test]
async fn a_paid_airtel_collection_is_refunded_once_in_full() {
    let r = rig_with(&[("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "10000")], Arc::new(SystemClock)).await;
    let c = &r.client;
    let unpaid = ok(&call(c, "request_airtel_payment", collect("to-refund-0", "150")).await).clone();
    let p = ok(&call(c, "request_airtel_payment", collect("to-refund", "400")).await).clone();
    let id = id_of(&p);
    r.fake.set_enquiry(&id, EnquiryAnswer::Status("TS".into()));
    assert_eq!(r.fake.callback(&id, "TS").await, 200);
    assert_eq!(payment(c, &id).await["status"], "succeeded");
    let receipt = r.fake.collections().iter().find(|x| x.id == id).unwrap().airtel_money_id.clone();

    let part = call(c, "refund_payment", refund_args("rf-part", &id, Some("100"))).await;
    assert_eq!(code(&part), "INVALID_ARGUMENT");
    let not_paid = call(c, "refund_payment", refund_args("rf-unpaid", &id_of(&unpaid), None)).await;
    assert_eq!(code(&not_paid), "INVALID_ARGUMENT");
    assert_eq!(r.fake.refund_requests(), 0, "refusals send nothing");

    let agent = Arc::new(connect(&r.app.url, &r.app.token("dev-agent", SCOPES), Era::Modern).await);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (agent, id) = (agent.clone(), id.clone());
        set.spawn(async move { call(&agent, "refund_payment", refund_args("rf-1", &id, None)).await });
    }
    let mut ids = std::collections::BTreeSet::new();
    while let Some(res) = set.join_next().await {
        let res = res.unwrap();
        let refund = ok(&res);
        assert_eq!(
            (refund["status"].as_str(), refund["amount"].as_str()),
            (Some("succeeded"), Some("400.00")),
            "{refund}"
        );
        ids.insert(refund["payment_id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1, "one refund: {ids:?}");
    // Another operation refunding the same collection sends nothing more.
    let _ = call(c, "refund_payment", refund_args("rf-2", &id, None)).await;
    assert_eq!((r.fake.refund_requests(), r.fake.refunds()), (1, vec![receipt]));
    r.app.stop().await;
}

/// A refund Airtel refuses, or cannot take (503), moved nothing: the agent is told so, the
/// record is given up, and a later refund of the same collection is sent and done, once.
#[tokio::test]
async fn a_refused_or_unavailable_airtel_refund_moves_nothing_and_a_later_one_is_done() {
    let r = rig_with(&[("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "0")], Arc::new(SystemClock)).await;
    let c = &r.client;
    let p = ok(&call(c, "request_airtel_payment", collect("rf-refused", "300")).await).clone();
    let id = id_of(&p);
    r.fake.set_enquiry(&id, EnquiryAnswer::Status("TS".into()));
    assert_eq!(r.fake.callback(&id, "TS").await, 200);
    r.fake.set_refund_mode(MoneyOutMode::Refuse);
    let refused = call(c, "refund_payment", refund_args("rf-a", &id, None)).await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused:?}");
    let said = err(&refused)["message"].as_str().unwrap().to_string();
    assert!(said.contains("refused the refund") && said.contains("no money moved"), "{said}");
    r.fake.set_refund_mode(MoneyOutMode::Unavailable);
    let unavailable = call(c, "refund_payment", refund_args("rf-b", &id, None)).await;
    assert_eq!(code(&unavailable), "BACKEND_UNAVAILABLE", "{unavailable:?}");
    assert!(r.fake.refunds().is_empty(), "nothing refunded at Airtel");
    assert_eq!(payment(c, &id).await["status"], "succeeded", "the collection stands");
    r.fake.set_refund_mode(MoneyOutMode::Accept);
    let done = ok(&call(c, "refund_payment", refund_args("rf-c", &id, None)).await).clone();
    assert_eq!((done["status"].as_str(), done["amount"].as_str()), (Some("succeeded"), Some("300.00")));
    assert_eq!(r.fake.refunds().len(), 1);
    r.app.stop().await;
}

/// A refund whose answer was lost may have been done: it is never sent again.
#[tokio::test]
async fn an_airtel_refund_whose_answer_is_lost_is_never_resent() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = rig_with(&[("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", "0")], clock.clone()).await;
    let c = &r.client;
    let p = ok(&call(c, "request_airtel_payment", collect("lost-rf", "400")).await).clone();
    let id = id_of(&p);
    r.fake.set_enquiry(&id, EnquiryAnswer::Status("TS".into()));
    assert_eq!(r.fake.callback(&id, "TS").await, 200);
    r.fake.set_refund_mode(MoneyOutMode::Hang);
    assert_eq!(code(&call(c, "refund_payment", refund_args("rf-lost", &id, None)).await), "OUTCOME_UNKNOWN");
    r.fake.set_refund_mode(MoneyOutMode::Accept);
    clock.advance(120);
    assert_eq!(code(&call(c, "refund_payment", refund_args("rf-lost", &id, None)).await), "OUTCOME_UNKNOWN");
    let other = call(c, "refund_payment", refund_args("rf-lost-2", &id, None)).await;
    assert_eq!(other.is_error, Some(true), "a second operation does not refund again");
    assert_eq!(r.fake.refund_requests(), 1, "one refund request");
    r.app.stop().await;
}

/// The Airtel simulator inside the gateway (`airtel.environment = "simulator"`), driven as a
/// newcomer drives it: a collection answered on the simulator goes pending → paid (confirmed by the
/// gateway's own enquiry to it) and is refunded once; a payout pays once, its answer found by the
/// enquiry; a lost answer is never re-sent and the enquiry settles it; over the limit a human is
/// needed; only an operator with payments:admin plays the customer.
#[tokio::test]
async fn the_airtel_simulator_answers_like_airtel_and_a_person_plays_the_customer() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let dir = tempfile::tempdir().unwrap();
    let section = format!(
        r#"
[airtel]
enabled = true
environment = "simulator"
client_id = "demo-airtel-client"
client_secret = "demo-airtel-secret"
disbursement_pin = "1234"
callback_secret = "{SECRET}"
request_timeout_ms = 300
"#
    );
    let app = spawn_with_toml(dir.path(), &overlay(&section), &[], clock.clone()).await;
    let c = &connect(&app.url, &app.token("dev-agent", &format!("{SCOPES} payments:payout")), Era::Modern).await;
    let control = format!("{}/simulator/control/airtel", app.base());
    let http = reqwest::Client::new();
    let op = app.operator_token("alice", "payments:admin");
    let post = |path: String| {
        let (http, op) = (http.clone(), op.clone());
        async move {
            let r = http.post(path).bearer_auth(op).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or_default())
        }
    };
    let view = || {
        let (http, op, control) = (http.clone(), op.clone(), control.clone());
        async move { http.get(&control).bearer_auth(&op).send().await.unwrap().json::<Value>().await.unwrap() }
    };
    let poll = || async { app.running.gateway.poll_rails(0, POLL_BUDGET).await };

    // A collection: pending until the "customer" pays on the simulator; the callback reaches the
    // gateway's real route and the gateway's enquiry confirms it.
    let paid = ok(&call(c, "request_airtel_payment", collect("sim-1", "150")).await).clone();
    let paid_id = id_of(&paid);
    assert_eq!(paid["status"], "pending");
    let (status, answered) = post(format!("{control}/latest/accept")).await;
    assert_eq!((status, answered["callback_status"].as_u64()), (200, Some(200)), "{answered}");
    let settled = payment(c, &paid_id).await;
    assert_eq!((settled["status"].as_str(), settled["receipt"]["rail"].as_str()), (Some("succeeded"), Some("airtel")));
    let declined = ok(&call(c, "request_airtel_payment", collect("sim-2", "20")).await).clone();
    assert_eq!(post(format!("{control}/latest/decline")).await.0, 200);
    assert_eq!(payment(c, &id_of(&declined)).await["status"], "failed");

    // Refunded once, in full: Airtel's answer settles it at once.
    let refund = ok(&call(c, "refund_payment", refund_args("sim-rf", &paid_id, None)).await).clone();
    assert_eq!((refund["status"].as_str(), refund["amount"].as_str()), (Some("succeeded"), Some("150.00")), "{refund}");
    let _ = call(c, "refund_payment", refund_args("sim-rf-2", &paid_id, None)).await;
    let refunds = |v: &Value| v["items"].as_array().unwrap().iter().filter(|i| i["kind"] == "refund").count();
    assert_eq!(refunds(&view().await), 1, "refunded once");

    // A payout, paid once: Airtel posts no payout callback; the enquiry finds it paid.
    let payout_id = id_of(ok(&call(c, "send_airtel_payout", payout("sim-pay", "250")).await));
    let (status, answered) = post(format!("{control}/{payout_id}/accept")).await;
    assert_eq!((status, answered["callback_status"].clone()), (200, Value::Null), "{answered}");
    assert_eq!(payment(c, &payout_id).await["status"], "pending");
    clock.advance(120);
    assert_eq!(poll().await, 1);
    assert_eq!(payment(c, &payout_id).await["status"], "succeeded");

    // A payout whose answer is lost: unknown, never sent again, settled by the enquiry.
    assert_eq!(post(format!("{control}/lose-next-answer")).await.0, 200);
    assert_eq!(code(&call(c, "send_airtel_payout", payout("sim-lost", "300")).await), "OUTCOME_UNKNOWN");
    clock.advance(120);
    assert_eq!(code(&call(c, "send_airtel_payout", payout("sim-lost", "300")).await), "OUTCOME_UNKNOWN");
    let v = view().await;
    let lost: Vec<&Value> = v["items"].as_array().unwrap().iter().filter(|i| i["amount"] == 300).collect();
    assert_eq!(lost.len(), 1, "sent once: {v}");
    let lost_id = lost[0]["id"].as_str().unwrap().to_string();
    assert_eq!(post(format!("{control}/{lost_id}/accept")).await.0, 200);
    clock.advance(120);
    assert_eq!(poll().await, 1);
    assert_eq!(payment(c, &lost_id).await["status"], "succeeded", "the enquiry settled it");

    // Over the autonomous limit: a human first; nothing reaches the simulator.
    let items = view().await["items"].as_array().unwrap().len();
    assert_eq!(code(&call(c, "send_airtel_payout", payout("sim-big", "1500")).await), "APPROVAL_REQUIRED");
    assert_eq!(view().await["items"].as_array().unwrap().len(), items);

    // Only an operator with payments:admin plays the customer; there is no simulator of other rails.
    let auditor = app.operator_token("bob", "payments:audit");
    assert_eq!(http.get(&control).bearer_auth(&auditor).send().await.unwrap().status(), 403);
    assert_eq!(post(format!("{}/simulator/control/mpesa/latest/accept", app.base())).await.0, 404);
    assert_eq!(post(format!("{control}/{lost_id}/accept")).await.0, 404, "answered once");
    assert_eq!(post(format!("{control}/latest/shrug")).await.0, 400);
    app.stop().await;
}

/// The standalone Airtel simulator (`paygate rail-simulator airtel`) holds a client to Airtel's
/// rules: only the configured credentials get a token; a transaction id is taken once (a repeat is
/// Airtel's duplicate refusal, never a second prompt); only the configured PIN, sealed with the
/// simulator's key, pays out; a refund is of a paid collection only, and once; an enquiry about an
/// id it never took is "not found"; a full simulator refuses new requests unprocessed. Callbacks
/// carry the callback header's secret and Airtel's status codes (TS, TF, TE).
#[tokio::test]
async fn the_standalone_airtel_simulator_holds_a_client_to_airtels_rules() {
    use axum::body::Bytes;
    use paygate::auth::Secret;
    use paygate::backend::airtel::simulator::{AirtelSimulator, Terms};
    use paygate::backend::airtel::wire::{
        self, AirtelClient, AirtelConfig, AirtelError, Collection, Disbursement, PayoutCredentials, TransactionStatus,
    };
    use paygate::backend::simulator::{Answer, Pick, RailSimulator};
    use rsa::pkcs8::DecodePrivateKey as _;
    type Inbox = Arc<std::sync::Mutex<Vec<(Option<String>, Bytes)>>>;
    let inbox: Inbox = Arc::default();
    let receive = |axum::extract::State(inbox): axum::extract::State<Inbox>,
                   headers: axum::http::HeaderMap,
                   body: Bytes| async move {
        let secret = headers.get("x-callback-secret").and_then(|v| v.to_str().ok()).map(str::to_string);
        inbox.lock().unwrap().push((secret, body));
        "ok"
    };
    let app = axum::Router::new().route("/cb", axum::routing::post(receive)).with_state(inbox.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let callback_url = format!("http://{}/cb", listener.local_addr().unwrap());
    let receiver = tokio::spawn(async move { axum::serve(listener, app).await });

    let terms = |items_max| {
        let terms = Terms {
            client_id: Secret::new(CLIENT_ID.into()),
            client_secret: Secret::new(CLIENT_SECRET.into()),
            pin: Some(Secret::new(PIN.into())),
            callback_url: callback_url.clone(),
            callback_header: Some(("X-Callback-Secret".into(), Secret::new("hdr-secret".into()))),
        };
        let key = rsa::PrivateKey::from_pkcs8_pem(include_str!("fixtures/rsa1.pem")).unwrap();
        AirtelSimulator::standalone(terms, Some(key), None, items_max).unwrap()
    };
    let start = |sim: Arc<dyn RailSimulator>| async move {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server =
            tokio::spawn(paygate::backend::simulator_server::serve(listener, sim, None, std::future::pending()));
        (url, server)
    };
    let sim: Arc<dyn RailSimulator> = Arc::new(terms(100));
    let (base_url, server) = start(sim.clone()).await;
    let client_with = |base_url: &str, secret: &str, pin: &str| {
        let cfg = AirtelConfig {
            base_url: base_url.to_string(),
            client_id: Secret::new(CLIENT_ID.into()),
            client_secret: Secret::new(secret.into()),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            token_refresh_margin_secs: 60,
            retries_max: 0,
            breaker_failures_max: 100,
            breaker_open: Duration::from_secs(30),
            payouts: Some(PayoutCredentials::new(&Secret::new(pin.into()), PUBLIC_KEY_PEM).unwrap()),
        };
        AirtelClient::new(cfg, Arc::new(SystemClock)).unwrap()
    };
    let client = client_with(&base_url, CLIENT_SECRET, PIN);
    let wrong = client_with(&base_url, "not-the-secret", PIN);
    assert!(
        matches!(wrong.check_credentials().await, Err(AirtelError::Unavailable(why)) if why.contains("token request refused"))
    );
    client.check_credentials().await.unwrap();
    let refused_with = |r: Result<_, AirtelError>, expected: &str| match r {
        Err(AirtelError::Refused { code, .. }) => assert_eq!(code, expected),
        other => panic!("{expected}: {other:?}"),
    };
    let collection = |id: &str, amount_whole| Collection {
        id: id.into(),
        msisdn: wire::normalize_phone("0733123456").unwrap(),
        amount_whole,
        reference: "Order 1".into(),
    };

    for (id, answer) in
        [("col-paid", Answer::Accept), ("col-declined", Answer::Decline), ("col-expired", Answer::Timeout)]
    {
        client.collect(&collection(id, 40)).await.unwrap();
        assert_eq!(client.enquire(id).await.unwrap().status, TransactionStatus::InProgress);
        assert_eq!(sim.answer(Pick::Id(id), answer).await.unwrap(), (id.to_string(), Some(200)));
    }
    refused_with(client.collect(&collection("col-paid", 40)).await.map(drop), "ESB000041");
    client.collect(&collection("col-one", 1)).await.expect("one shilling is the least Airtel takes");
    refused_with(client.enquire("col-never").await.map(drop), "ESB000008");
    let callbacks: Vec<_> =
        inbox.lock().unwrap().iter().map(|(s, b)| (s.clone(), wire::parse_callback(b).unwrap())).collect();
    let statuses: Vec<_> = callbacks.iter().map(|(_, cb)| cb.status.clone()).collect();
    assert_eq!(statuses, vec![TransactionStatus::Success, TransactionStatus::Failed, TransactionStatus::Expired]);
    assert!(callbacks.iter().all(|(s, _)| s.as_deref() == Some("hdr-secret")), "the header carries the secret");
    let paid = client.enquire("col-paid").await.unwrap();
    let reference = paid.airtel_money_id.clone().unwrap();
    assert_eq!(callbacks[0].1.airtel_money_id.as_deref(), Some(reference.as_str()));
    assert_eq!(
        (callbacks[1].1.airtel_money_id.as_ref(), client.enquire("col-declined").await.unwrap().airtel_money_id),
        (None, None)
    );

    // Refunds: of a paid collection only, and once.
    let declined_ref = "SIM9999999.9999";
    refused_with(client.refund(declined_ref).await.map(drop), "ESB000008");
    assert!(client.refund(&reference).await.unwrap().is_some());
    refused_with(client.refund(&reference).await.map(drop), "ESB000041");

    // Payouts: the configured PIN only.
    let payout = |id: &str| Disbursement {
        id: id.into(),
        msisdn: wire::normalize_phone("0733123456").unwrap(),
        amount_whole: 25,
        reference: "Payout".into(),
    };
    refused_with(
        client_with(&base_url, CLIENT_SECRET, "9999").disburse(&payout("pay-wrong-pin")).await.map(drop),
        "DP00900001017",
    );
    refused_with(client.enquire_disbursement("pay-wrong-pin").await.map(drop), "ESB000008");
    client.disburse(&payout("pay-1")).await.unwrap();
    client.disburse(&Disbursement { amount_whole: 1, ..payout("pay-one") }).await.expect("a one-shilling payout");
    assert_eq!(client.enquire_disbursement("pay-1").await.unwrap().status, TransactionStatus::InProgress);
    assert_eq!(sim.answer(Pick::Id("pay-1"), Answer::Accept).await.unwrap(), ("pay-1".to_string(), None));
    assert_eq!(client.enquire_disbursement("pay-1").await.unwrap().status, TransactionStatus::Success);

    // What the client never sends, the simulator refuses as Airtel would: no token, a token it
    // never issued, requests outside Kenya's country and currency (in the headers or the body).
    let http = reqwest::Client::new();
    let token: Value = http
        .post(format!("{base_url}/auth/oauth2/token"))
        .json(&json!({"client_id": CLIENT_ID, "client_secret": CLIENT_SECRET, "grant_type": "client_credentials"}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let token = token["access_token"].as_str().unwrap().to_string();
    let body = |country: &str, currency: &str, tx_country: &str, tx_currency: &str| {
        json!({"reference": "Order 9", "subscriber": {"country": country, "currency": currency, "msisdn": "733123456"},
               "transaction": {"amount": 10, "country": tx_country, "currency": tx_currency, "id": "col-raw"}})
    };
    let post = |bearer: &str, headers: (&str, &str), body: Value| {
        http.post(format!("{base_url}/merchant/v1/payments/"))
            .bearer_auth(bearer)
            .header("X-Country", headers.0)
            .header("X-Currency", headers.1)
            .json(&body)
            .send()
    };
    assert_eq!(post("sim-never-issued", ("KE", "KES"), body("KE", "KES", "KE", "KES")).await.unwrap().status(), 401);
    assert_eq!(post(&token, ("UG", "UGX"), body("KE", "KES", "KE", "KES")).await.unwrap().status(), 400);
    for outside in [
        body("UG", "KES", "KE", "KES"),
        body("KE", "UGX", "KE", "KES"),
        body("KE", "KES", "UG", "KES"),
        body("KE", "KES", "KE", "UGX"),
    ] {
        let answer = post(&token, ("KE", "KES"), outside.clone()).await.unwrap();
        assert_eq!(answer.status(), 400, "{outside}");
        let said: Value = answer.json().await.unwrap();
        assert_eq!(said["status"]["result_code"], "ESB000001", "{outside}");
    }
    refused_with(client.enquire("col-raw").await.map(drop), "ESB000008");

    // A full simulator refuses a new request unprocessed: Airtel's overload, unavailable.
    let full: Arc<dyn RailSimulator> = Arc::new(terms(1));
    let (full_url, full_server) = start(full.clone()).await;
    let to_full = client_with(&full_url, CLIENT_SECRET, PIN);
    to_full.collect(&collection("col-a", 10)).await.unwrap();
    assert!(matches!(to_full.collect(&collection("col-b", 10)).await, Err(AirtelError::Unavailable(_))));
    refused_with(to_full.enquire("col-b").await.map(drop), "ESB000008");
    server.abort();
    full_server.abort();
    receiver.abort();
}
