//! Money going out through M-Pesa, end to end: payouts (B2C), payments to businesses (B2B: paybills
//! and tills) and reversals of collections, their
//! asynchronous results, lost answers settled by the Transaction Status API, queue timeouts, the
//! header-secret option and Daraja's "still processing" answer — an MCP agent against the real
//! server on port 0 and the local Daraja fake (tests/common/daraja.rs).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;
#[path = "common/daraja.rs"]
mod daraja;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use daraja::{DarajaFake, FakeConfig, OutboundMode, QueryAnswer, SANDBOX_PASSKEY};
use paygate::clock::{Clock, ManualClock, SystemClock};
use paygate::domain::ids::PaymentId;
use paygate::domain::rail::RailState;
use serde_json::{Value, json};

const SECRET: &str = "cb-secret-0123456789abcdefghij";
const SCOPES: &str = "payments:read payments:collect payments:refund payments:payout payments:integrity";
const HEADER: &str = "x-paygate-callback-secret";

fn overlay(fake: &DarajaFake, extra: &str) -> String {
    format!(
        r#"
[mpesa]
enabled = true
base_url = "{base}"
consumer_key = "fake-consumer-key"
consumer_secret = "fake-consumer-secret"
short_code = "174379"
passkey = "{SANDBOX_PASSKEY}"
callback_secret = "{SECRET}"
initiator_name = "testapi"
security_credential = "fake-security-credential"
b2c_short_code = "600996"
request_timeout_ms = 500
{extra}

[jobs]
enabled = false

[policy]
default_profile = "dev"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent"]
client_ids = []
allowed_accounts = ["acct-A", "acct-B", "mpesa-collections"]
autonomous_limit = {{ KES = "1000.00" }}
daily_limit = {{ KES = "1500.00" }}
daily_refund_limit = {{ KES = "100000.00" }}
daily_payments_max = 1000
calls_per_minute = 600
tool_calls_per_minute = {{}}
issuer = ""
"#,
        base = fake.base_url()
    )
}

struct Rig {
    app: TestApp,
    fake: DarajaFake,
    client: Client,
    _dir: tempfile::TempDir,
}

async fn rig_with(extra: &str, clock: Arc<dyn Clock>) -> Rig {
    rig_waiting(extra, clock, "0").await
}

/// The rig with `idempotency.wait_ms_max` = `wait_ms` (how long a call waits for its key in flight).
async fn rig_waiting(extra: &str, clock: Arc<dyn Clock>, wait_ms: &str) -> Rig {
    let fake = DarajaFake::start(FakeConfig::default()).await;
    let dir = tempfile::tempdir().unwrap();
    let overrides = [("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", wait_ms)];
    let app = spawn_with_toml(dir.path(), &overlay(&fake, extra), &overrides, clock).await;
    let client = connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    Rig { app, fake, client, _dir: dir }
}

async fn rig() -> Rig {
    rig_with("", Arc::new(SystemClock)).await
}

/// 32 identical payouts at once, with the wait for a key in flight on: Daraja receives one B2C
/// request, and the 31 other calls replay the one payout.
#[tokio::test]
async fn concurrent_duplicate_payouts_reach_daraja_once() {
    let r = rig_waiting("", Arc::new(SystemClock), "10000").await;
    let agent = Arc::new(connect(&r.app.url, &r.app.token("dev-agent", SCOPES), Era::Modern).await);
    let mut set = tokio::task::JoinSet::new();
    for _ in 0..32 {
        let agent = agent.clone();
        set.spawn(async move { call(&agent, "send_mpesa_payout", payout("dup-payout", "150")).await });
    }
    let (mut ids, mut replayed) = (std::collections::BTreeSet::new(), 0);
    while let Some(res) = set.join_next().await {
        let res = res.unwrap();
        ids.insert(ok(&res)["payment_id"].as_str().unwrap().to_string());
        replayed += usize::from(ok(&res)["replayed"] == true);
    }
    assert_eq!((ids.len(), replayed), (1, 31), "one payout, 31 replays");
    assert_eq!(r.fake.b2c_requests(), 1, "Daraja received one B2C request");
    let metrics = reqwest::get(format!("{}/metrics", r.app.base())).await.unwrap().text().await.unwrap();
    let waits = metrics.lines().find_map(|l| l.strip_prefix("paygate_idempotency_key_waits_total ")).unwrap();
    assert!(waits.parse::<u64>().unwrap() > 0, "the duplicates ran at once: some waited for the key in flight");
    r.app.stop().await;
}

fn payout(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "phone_number": "0712 345 678", "amount": amount, "remarks": "Cashback for order 7"})
}

fn collect(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "phone_number": "0712 345 678", "amount": amount,
           "account_reference": "INV-1001", "description": "Order 1001"})
}

async fn payment(c: &Client, id: &str) -> Value {
    ok(&call(c, "get_payment", json!({"payment_id": id})).await).clone()
}

async fn audit_codes(app: &TestApp) -> Vec<String> {
    let records = app.running.store.audit_list(None, 500).await.unwrap();
    records.iter().filter(|r| r.tool == "mpesa_callback").filter_map(|r| r.code.clone()).collect()
}

/// A collection the customer paid (callback confirmed by the fake's query).
async fn paid_collection(r: &Rig, op: &str, amount: &str) -> String {
    let p = ok(&call(&r.client, "request_mpesa_payment", collect(op, amount)).await).clone();
    let push = r.fake.pushes().last().cloned().unwrap();
    assert_eq!(r.fake.callback(&push.checkout_request_id, 0).await, 200);
    p["payment_id"].as_str().unwrap().to_string()
}

async fn poll(app: &TestApp) -> usize {
    app.running.gateway.poll_rails(0, Duration::from_secs(10)).await
}

#[tokio::test]
async fn a_payout_is_pending_until_its_result_settles_it_and_is_sent_once() {
    let r = rig().await;
    let c = &r.client;
    let first = ok(&call(c, "send_mpesa_payout", payout("payout-1", "150")).await).clone();
    assert_eq!((first["status"].as_str(), first["replayed"].as_bool()), (Some("pending"), Some(false)));
    assert_eq!(
        (first["from_account"].as_str(), first["to_account"].as_str()),
        (Some("mpesa-collections"), Some("mpesa-254712345678"))
    );
    let id = first["payment_id"].as_str().unwrap().to_string();
    let sent = r.fake.payouts();
    assert_eq!(sent.len(), 1);
    assert_eq!((sent[0].phone.as_str(), sent[0].amount), ("254712345678", 150));
    assert_eq!(sent[0].originator_conversation_id, id, "sent under the gateway's own id");
    assert!(sent[0].result_url.ends_with(&format!("/callbacks/mpesa/result/{SECRET}")), "{}", sent[0].result_url);
    assert!(sent[0].timeout_url.ends_with(&format!("/callbacks/mpesa/timeout/{SECRET}")));

    // The agent retries: the same payout, not a second one.
    let again = ok(&call(c, "send_mpesa_payout", payout("payout-1", "150")).await).clone();
    assert_eq!((again["payment_id"].as_str(), again["replayed"].as_bool()), (Some(id.as_str()), Some(true)));
    assert_eq!(r.fake.b2c_requests(), 1);

    // A queue-timeout notice settles nothing.
    assert_eq!(r.fake.post_timeout(&id).await, 200);
    assert_eq!(payment(c, &id).await["status"], "pending");
    // A result for another amount is refused and changes nothing.
    let mut forged = r.fake.result_body(&id, 0);
    forged["Result"]["ResultParameters"]["ResultParameter"][0]["Value"] = json!(1500);
    let result_url = sent[0].result_url.clone();
    assert_eq!(r.fake.callback_to(&result_url, forged).await, 422);
    assert_eq!(payment(c, &id).await["status"], "pending");

    // M-Pesa posts the result: paid, with its receipt.
    assert_eq!(r.fake.post_result(&id, 0).await, 200);
    let settled = payment(c, &id).await;
    assert_eq!(settled["status"], "succeeded");
    assert_eq!(settled["receipt"]["rail"], "mpesa");
    assert_eq!(settled["receipt"]["reference"].as_str(), Some(r.fake.payouts()[0].receipt.as_str()));
    assert!(settled["receipt"].get("checkout_request_id").is_none_or(Value::is_null), "{settled}");
    assert_eq!(settled["receipt"]["phone"], "25471****678");
    // A duplicate or contrary late result changes nothing (the contrary one is refused loudly).
    assert_eq!(r.fake.post_result(&id, 0).await, 409);
    assert_eq!(r.fake.post_result(&id, 2001).await, 409);
    assert_eq!(payment(c, &id).await["status"], "succeeded");

    // A payout M-Pesa refuses in its result fails, and gives back its share of the daily budget:
    // 1,500 a day: 150 paid + 1,000 failed + 1,000 more fits only because the failure gave back.
    let second = ok(&call(c, "send_mpesa_payout", payout("payout-2", "1000")).await).clone();
    let id2 = second["payment_id"].as_str().unwrap().to_string();
    assert_eq!(r.fake.post_result(&id2, 2001).await, 200);
    let failed = payment(c, &id2).await;
    assert_eq!(failed["status"], "failed");
    let third = call(c, "send_mpesa_payout", payout("payout-3", "1000")).await;
    assert_eq!(ok(&third)["status"], "pending", "{third:?}");
    let over = call(c, "send_mpesa_payout", payout("payout-4", "500")).await;
    assert_eq!(code(&over), "BUDGET_EXCEEDED");
    assert_eq!(r.fake.payouts().len(), 3, "a refused payout is never sent");
    // Reconciliation does not ask M-Pesa again about a payout its own result failed.
    let asked = r.fake.status_requests();
    let report = ok(&call(c, "reconcile", json!({})).await).clone();
    assert_eq!(r.fake.status_requests(), asked, "{report}");
    let codes = audit_codes(&r.app).await;
    for c in ["QUEUE_TIMEOUT", "AMOUNT_MISMATCH", "SUCCEEDED", "DUPLICATE_OR_LATE", "CONTRADICTS_RECORD", "FAILED"] {
        assert!(codes.iter().any(|x| x == c), "{c} not audited: {codes:?}");
    }
    r.app.assert_secrets_not_logged();
    assert_not_logged(&[SECRET, "fake-security-credential", "fake-consumer-secret"]);
    r.app.stop().await;
}

/// A payout M-Pesa never answered, settled failed by two people (M-Pesa answers status only by
/// callback: their word stands), and then paid by M-Pesa after all: its late result cannot move the
/// settled record, and it is refused loudly (CONTRADICTS_RECORD, an error log), not as a duplicate.
#[tokio::test]
async fn a_result_that_contradicts_a_payout_settled_by_hand_is_refused_loudly() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = rig_with("\n[approvals]\nresolution_after_secs = 600\n", clock.clone()).await;
    let c = &r.client;
    r.fake.set_outbound_mode(OutboundMode::Hang);
    assert_eq!(code(&call(c, "send_mpesa_payout", payout("hand-1", "200")).await), "OUTCOME_UNKNOWN");
    r.fake.set_outbound_mode(OutboundMode::Accept);
    let id = r.fake.payouts()[0].originator_conversation_id.clone();
    clock.advance(601);
    let path = format!("/operator/v1/payments/{id}/resolve");
    let body = json!({"outcome": "failed", "reason": "not on the B2C statement"});
    for (who, want) in [("alice", 202), ("bob", 200)] {
        let token = r.app.operator_token(who, "payments:admin");
        let (status, answer) = operator(&r.app, reqwest::Method::POST, &path, &token, Some(body.clone())).await;
        assert_eq!(status.as_u16(), want, "{who}: {answer}");
    }
    assert_eq!(payment(c, &id).await["status"], "failed");
    // M-Pesa paid it after all: its result comes late.
    assert_eq!(r.fake.post_result(&id, 0).await, 409);
    assert_eq!(payment(c, &id).await["status"], "failed", "a settled record never moves");
    let codes = audit_codes(&r.app).await;
    assert!(codes.iter().any(|c| c == "CONTRADICTS_RECORD"), "{codes:?}");
    assert!(!codes.iter().any(|c| c == "DUPLICATE_OR_LATE"), "{codes:?}");
    // Reconciliation lists it, once, for a person to put right.
    let report = r.app.running.gateway.reconcile(None).await.unwrap();
    let named: Vec<_> = report.findings.iter().filter(|f| f.kind == "contradicts_record").collect();
    assert_eq!(named.len(), 1, "{report:?}");
    assert_eq!(named[0].payment_id.as_deref(), Some(id.as_str()), "{report:?}");
    assert_eq!(r.fake.post_result(&id, 0).await, 409, "again: still refused");
    let report = r.app.running.gateway.reconcile(None).await.unwrap();
    assert_eq!(report.findings.iter().filter(|f| f.kind == "contradicts_record").count(), 1, "{report:?}");
    r.app.stop().await;
}

#[tokio::test]
async fn a_payout_whose_answer_is_lost_is_settled_by_its_status_and_never_sent_again() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = rig_with("", clock.clone()).await;
    let c = &r.client;
    r.fake.set_outbound_mode(OutboundMode::Hang);
    let first = call(c, "send_mpesa_payout", payout("lost-1", "200")).await;
    assert_eq!(code(&first), "OUTCOME_UNKNOWN");
    r.fake.set_outbound_mode(OutboundMode::Accept);
    // After the first attempt's lease, the retry takes the operation over and does not send again.
    clock.advance(120);
    let retry = call(c, "send_mpesa_payout", payout("lost-1", "200")).await;
    assert_eq!(code(&retry), "OUTCOME_UNKNOWN");
    assert_eq!((r.fake.b2c_requests(), r.fake.payouts().len()), (1, 1), "processed once, sent once");
    let id = r.fake.payouts()[0].originator_conversation_id.clone();
    assert_eq!(payment(c, &id).await["status"], "pending");

    // The scheduler asks M-Pesa where it stands; M-Pesa's answer settles it.
    assert_eq!(poll(&r.app).await, 0, "the answer comes by callback");
    assert_eq!(r.fake.status_requests(), 1);
    assert_eq!(r.fake.answer_status_queries().await, [200]);
    let settled = payment(c, &id).await;
    assert_eq!(settled["status"], "succeeded");
    assert_eq!(settled["receipt"]["reference"].as_str(), Some(r.fake.payouts()[0].receipt.as_str()));
    // The late B2C result itself changes nothing more.
    assert_eq!(r.fake.post_result(&id, 0).await, 409);
    clock.advance(120);
    let replay = ok(&call(c, "send_mpesa_payout", payout("lost-1", "200")).await).clone();
    assert_eq!((replay["payment_id"].as_str(), replay["status"].as_str()), (Some(id.as_str()), Some("succeeded")));
    assert_eq!(r.fake.b2c_requests(), 1);

    // Daraja refusing unprocessed (503) is safe to retry: nothing was sent, the retry sends once.
    r.fake.fail_next(2);
    let refused = call(c, "send_mpesa_payout", payout("busy-1", "300")).await;
    assert_eq!(code(&refused), "BACKEND_UNAVAILABLE");
    assert_eq!(r.fake.payouts().len(), 1);
    let sent = call(c, "send_mpesa_payout", payout("busy-1", "300")).await;
    assert_eq!(ok(&sent)["status"], "pending");
    assert_eq!(r.fake.payouts().len(), 2);

    // A status M-Pesa cannot answer ("no such transaction") never settles: it stays open for
    // reconciliation.
    let busy_id = r.fake.payouts()[1].originator_conversation_id.clone();
    let unanswered = json!({
        "Result": {"ResultType": 0, "ResultCode": 2032, "ResultDesc": "The transaction could not be found",
                   "OriginatorConversationID": "x", "ConversationID": "y",
                   "ResultParameters": {"ResultParameter": [{"Key": "TransactionStatus", "Value": "Unknown"}]},
                   "ReferenceData": {"ReferenceItem": {"Key": "Occasion", "Value": busy_id}}}
    });
    let result_url = r.fake.payouts()[1].result_url.clone();
    assert_eq!(r.fake.callback_to(&result_url, unanswered).await, 200);
    assert_eq!(payment(c, &busy_id).await["status"], "pending");
    r.app.stop().await;
}

#[tokio::test]
async fn payouts_need_their_scope_and_a_human_over_the_limit() {
    let r = rig().await;
    let c = &r.client;
    // Without payments:payout: refused, nothing sent.
    let collector = connect(&r.app.url, &r.app.token("dev-agent", "payments:read payments:collect"), Era::Modern).await;
    let denied = collector
        .call_tool(
            rmcp::model::CallToolRequestParams::new("send_mpesa_payout")
                .with_arguments(payout("scope-1", "10").as_object().unwrap().clone()),
        )
        .await;
    assert!(format!("{denied:?}").contains(r#"required_scope: Some("payments:payout")"#), "{denied:?}");
    assert!(r.fake.payouts().is_empty());
    // Bad input is named and sends nothing.
    for (args, needle) in [
        (
            json!({"operation_id": "bad-1", "phone_number": "+1 555 0100", "amount": "10", "remarks": "r"}),
            "phone_number",
        ),
        (
            json!({"operation_id": "bad-2", "phone_number": "0712345678", "amount": "10.50", "remarks": "r"}),
            "whole shillings",
        ),
        (
            json!({"operation_id": "bad-3", "phone_number": "0712345678", "amount": "10", "remarks": "a\u{7}b"}),
            "remarks",
        ),
    ] {
        let bad = call(c, "send_mpesa_payout", args).await;
        assert_eq!(code(&bad), "INVALID_ARGUMENT");
        assert!(err(&bad)["message"].as_str().unwrap().contains(needle), "{bad:?}");
    }
    // Over the autonomous limit: a human approves, the gateway issues the mandate, the payout goes
    // out once.
    let over = call(c, "send_mpesa_payout", payout("big-1", "1200")).await;
    assert_eq!(code(&over), "APPROVAL_REQUIRED");
    assert!(r.fake.payouts().is_empty(), "nothing leaves before approval");
    let approval_id = err(&over)["approval_id"].as_str().unwrap().to_string();
    let (status, body) = approve(&r.app, &approval_id, "alice").await;
    assert_eq!(status, 200, "{body}");
    let approved = ok(&call(c, "get_approval", json!({"approval_id": approval_id})).await).clone();
    let mut with_mandate = payout("big-1", "1200");
    with_mandate["mandate"] = approved["mandate"].clone();
    let paid = ok(&call(c, "send_mpesa_payout", with_mandate.clone()).await).clone();
    assert_eq!(paid["status"], "pending");
    let again = ok(&call(c, "send_mpesa_payout", with_mandate).await).clone();
    assert_eq!((again["payment_id"].clone(), again["replayed"].as_bool()), (paid["payment_id"].clone(), Some(true)));
    // The mandate pins the payee: another phone is refused.
    let mut elsewhere = payout("big-2", "1200");
    elsewhere["phone_number"] = json!("0798765432");
    elsewhere["mandate"] = approved["mandate"].clone();
    let refused = call(c, "send_mpesa_payout", elsewhere).await;
    assert!(code(&refused).starts_with("MANDATE_"), "{refused:?}");
    assert_eq!(r.fake.payouts().len(), 1);
    r.app.stop().await;
}

#[tokio::test]
async fn a_collection_is_reversed_in_full_once() {
    let r = rig().await;
    let c = &r.client;
    // A pending collection cannot be reversed yet.
    let pending = ok(&call(c, "request_mpesa_payment", collect("open-1", "50")).await).clone();
    let not_yet =
        call(c, "refund_payment", json!({"operation_id": "rev-0", "payment_id": pending["payment_id"]})).await;
    assert_eq!(code(&not_yet), "INVALID_ARGUMENT");

    let id = paid_collection(&r, "order-1", "300").await;
    let partial = call(c, "refund_payment", json!({"operation_id": "rev-1", "payment_id": id, "amount": "100"})).await;
    assert_eq!(code(&partial), "INVALID_ARGUMENT");
    assert!(err(&partial)["message"].as_str().unwrap().contains("in full"), "{partial:?}");
    let rev =
        ok(&call(c, "refund_payment", json!({"operation_id": "rev-2", "payment_id": id, "reason": "cancelled"})).await)
            .clone();
    assert_eq!((rev["kind"].as_str(), rev["status"].as_str()), (Some("refund"), Some("pending")));
    assert_eq!(
        (rev["from_account"].as_str(), rev["to_account"].as_str()),
        (Some("mpesa-collections"), Some("mpesa-254712345678"))
    );
    assert_eq!(rev["refund_of"].as_str(), Some(id.as_str()));
    let sent = r.fake.reversals();
    assert_eq!(sent.len(), 1);
    let receipt = payment(c, &id).await["receipt"]["reference"].as_str().unwrap().to_string();
    assert_eq!((sent[0].subject.as_str(), sent[0].amount), (receipt.as_str(), 300));
    // Another operation_id (the agent "forgot" it asked) does not reverse twice: the same reversal.
    let twice = ok(&call(c, "refund_payment", json!({"operation_id": "rev-3", "payment_id": id})).await).clone();
    assert_eq!(twice["payment_id"], rev["payment_id"]);
    assert_eq!(r.fake.reversal_requests(), 1);

    let rev_id = rev["payment_id"].as_str().unwrap().to_string();
    assert_eq!(r.fake.post_result(&sent[0].originator_conversation_id, 0).await, 200);
    let done = payment(c, &rev_id).await;
    assert_eq!(done["status"], "succeeded");
    assert_eq!(done["receipt"]["reference"].as_str(), Some(r.fake.reversals()[0].receipt.as_str()));
    r.app.stop().await;
}

#[tokio::test]
async fn only_after_a_reversal_failed_may_another_be_tried() {
    let r = rig().await;
    let c = &r.client;
    let id = paid_collection(&r, "order-5", "90").await;
    let first = ok(&call(c, "refund_payment", json!({"operation_id": "rev-a", "payment_id": id})).await).clone();
    // M-Pesa refuses it in its result (say the initiator's credential was wrong): nothing moved.
    let sent = r.fake.reversals()[0].originator_conversation_id.clone();
    assert_eq!(r.fake.post_result(&sent, 2001).await, 200);
    assert_eq!(payment(c, first["payment_id"].as_str().unwrap()).await["status"], "failed");
    // Its own retry replays the failure; a new operation tries again, once.
    let replay = ok(&call(c, "refund_payment", json!({"operation_id": "rev-a", "payment_id": id})).await).clone();
    assert_eq!(
        (replay["payment_id"].clone(), replay["status"].as_str()),
        (first["payment_id"].clone(), Some("failed"))
    );
    let second = ok(&call(c, "refund_payment", json!({"operation_id": "rev-b", "payment_id": id})).await).clone();
    assert_ne!(second["payment_id"], first["payment_id"]);
    assert_eq!((second["status"].as_str(), r.fake.reversal_requests()), (Some("pending"), 2));
    // While it is open, another operation finds it: still one at a time.
    let third = ok(&call(c, "refund_payment", json!({"operation_id": "rev-c", "payment_id": id})).await).clone();
    assert_eq!(third["payment_id"], second["payment_id"]);
    let sent = r.fake.reversals()[1].originator_conversation_id.clone();
    assert_eq!(r.fake.post_result(&sent, 0).await, 200);
    let again = ok(&call(c, "refund_payment", json!({"operation_id": "rev-d", "payment_id": id})).await).clone();
    assert_eq!(
        (again["payment_id"].clone(), again["status"].as_str()),
        (second["payment_id"].clone(), Some("succeeded"))
    );
    assert_eq!(r.fake.reversal_requests(), 2, "a succeeded reversal is never followed by another");
    r.app.stop().await;
}

/// Reversals of one collection are bounded: after three failed (nothing moved each time), a
/// fourth is refused before anything is sent, and says where the money can still be returned.
#[tokio::test]
async fn after_three_failed_reversals_the_next_is_refused_unsent_and_names_the_portal() {
    let r = rig().await;
    let c = &r.client;
    let id = paid_collection(&r, "order-6", "70").await;
    let mut tried = std::collections::HashSet::new();
    for n in 0..3 {
        let op = format!("rev-fail-{n}");
        let rev = ok(&call(c, "refund_payment", json!({"operation_id": op, "payment_id": id})).await).clone();
        assert_eq!(rev["status"], "pending", "{rev:?}");
        assert!(tried.insert(rev["payment_id"].as_str().unwrap().to_string()), "a new reversal each time");
        let sent = r.fake.reversals()[n].originator_conversation_id.clone();
        assert_eq!(r.fake.post_result(&sent, 2001).await, 200);
        assert_eq!(payment(c, rev["payment_id"].as_str().unwrap()).await["status"], "failed");
    }
    let refused = call(c, "refund_payment", json!({"operation_id": "rev-fail-3", "payment_id": id})).await;
    assert_eq!(code(&refused), "INVALID_ARGUMENT", "{refused:?}");
    let said = err(&refused)["message"].as_str().unwrap().to_string();
    assert!(said.contains("3 reversals") && said.contains("own portal"), "{said}");
    assert_eq!(r.fake.reversal_requests(), 3, "the fourth was never sent");
    assert_eq!(payment(c, &id).await["status"], "succeeded", "the collection stands");
    r.app.stop().await;
}

#[tokio::test]
async fn a_reversal_whose_answer_is_lost_is_found_by_its_result_and_never_sent_again() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = rig_with("", clock.clone()).await;
    let c = &r.client;
    let id = paid_collection(&r, "order-9", "120").await;
    r.fake.set_outbound_mode(OutboundMode::Hang);
    let lost = call(c, "refund_payment", json!({"operation_id": "rev-9", "payment_id": id})).await;
    assert_eq!(code(&lost), "OUTCOME_UNKNOWN");
    r.fake.set_outbound_mode(OutboundMode::Accept);
    clock.advance(120);
    for op in ["rev-9", "rev-10"] {
        let retry = call(c, "refund_payment", json!({"operation_id": op, "payment_id": id})).await;
        assert_eq!(code(&retry), "OUTCOME_UNKNOWN", "{op}");
    }
    assert_eq!(r.fake.reversal_requests(), 1, "never sent again, whatever the operation_id");
    // Daraja chose the reversal's reference, which the gateway never learned; the result still
    // finds it by the payment id the gateway put in Occasion.
    let sent = r.fake.reversals()[0].clone();
    let rev_id = sent.occasion.clone();
    assert_eq!(r.fake.post_result(&sent.originator_conversation_id, 0).await, 200);
    assert_eq!(payment(c, &rev_id).await["status"], "succeeded");
    r.app.stop().await;
}

#[tokio::test]
async fn results_and_prompts_never_settle_each_others_payments() {
    let r = rig().await;
    let c = &r.client;
    let collection = ok(&call(c, "request_mpesa_payment", collect("order-2", "80")).await).clone();
    let checkout = r.fake.pushes()[0].checkout_request_id.clone();
    let out = ok(&call(c, "send_mpesa_payout", payout("payout-9", "80")).await).clone();
    let out_id = out["payment_id"].as_str().unwrap().to_string();
    let result_url = r.fake.payouts()[0].result_url.clone();
    let stk_url = r.fake.pushes()[0].callback_url.clone();
    // A payout's result naming the collection's reference: no such payout.
    let mut cross = r.fake.result_body(&out_id, 0);
    cross["Result"]["OriginatorConversationID"] = json!(checkout);
    cross["Result"]["ReferenceData"] = json!({"ReferenceItem": {"Key": "Occasion", "Value": collection["payment_id"]}});
    assert_eq!(r.fake.callback_to(&result_url, cross).await, 404);
    // A prompt's answer naming the payout's reference: no such collection.
    let mut prompt = r.fake.callback_body(&checkout, 0);
    prompt["Body"]["stkCallback"]["CheckoutRequestID"] = json!(out_id);
    assert_eq!(r.fake.callback_to(&stk_url, prompt).await, 404);
    // Shapes sent to the wrong address are malformed there.
    assert_eq!(r.fake.callback_to(&result_url, r.fake.callback_body(&checkout, 0)).await, 400);
    assert_eq!(r.fake.callback_to(&stk_url, r.fake.result_body(&out_id, 0)).await, 400);
    assert_eq!(payment(c, collection["payment_id"].as_str().unwrap()).await["status"], "pending");
    assert_eq!(payment(c, &out_id).await["status"], "pending");
    r.app.stop().await;
}

#[tokio::test]
async fn with_a_secret_header_the_urls_carry_no_secret_and_the_header_is_required() {
    let r = rig_with(&format!("callback_secret_header = \"{HEADER}\""), Arc::new(SystemClock)).await;
    let c = &r.client;
    let p = ok(&call(c, "request_mpesa_payment", collect("hdr-1", "60")).await).clone();
    let push = r.fake.pushes()[0].clone();
    assert!(push.callback_url.ends_with("/callbacks/mpesa/stk"), "{}", push.callback_url);
    assert!(!push.callback_url.contains(SECRET));
    // Without the header (as Daraja sends it, with no proxy in front): refused.
    assert_eq!(r.fake.callback(&push.checkout_request_id, 0).await, 404);
    assert_eq!(payment(c, p["payment_id"].as_str().unwrap()).await["status"], "pending");
    // The proxy adds it: accepted.
    let body = r.fake.callback_body(&push.checkout_request_id, 0);
    let http = reqwest::Client::new();
    for (secret, status) in [("wrong-secret-0123456789abcdef", 404), (SECRET, 200)] {
        let resp = http.post(&push.callback_url).header(HEADER, secret).json(&body).send().await.unwrap();
        assert_eq!(resp.status(), status);
    }
    assert_eq!(payment(c, p["payment_id"].as_str().unwrap()).await["status"], "succeeded");
    r.app.stop().await;
}

#[tokio::test]
async fn still_processing_keeps_a_collection_pending_and_it_is_asked_again() {
    let r = rig().await;
    let c = &r.client;
    let p = ok(&call(c, "request_mpesa_payment", collect("slow-1", "70")).await).clone();
    let id = p["payment_id"].as_str().unwrap();
    let checkout = r.fake.pushes()[0].checkout_request_id.clone();
    r.fake.set_query(&checkout, QueryAnswer::Result(4999, "The transaction is still under processing".into()));
    assert_eq!(poll(&r.app).await, 0);
    assert_eq!(payment(c, id).await["status"], "pending");
    let rec = r.app.running.store.rail_get(&PaymentId::parse(id).unwrap()).await.unwrap().unwrap();
    assert_eq!(rec.state, RailState::Pending);
    assert!(rec.reason.as_deref().unwrap_or_default().contains("4999"), "{:?}", rec.reason);
    let asked = r.fake.query_requests();
    r.fake.set_query(&checkout, QueryAnswer::Result(0, "The service request is processed successfully.".into()));
    assert_eq!(poll(&r.app).await, 1);
    assert_eq!(r.fake.query_requests(), asked + 1);
    assert_eq!(payment(c, id).await["status"], "succeeded");
    r.app.stop().await;
}

#[tokio::test]
async fn capabilities_list_the_rails_and_what_each_offers() {
    let r = rig().await;
    let caps =
        r.client.read_resource(rmcp::model::ReadResourceRequestParams::new("payments://capabilities")).await.unwrap();
    let rmcp::model::ResourceContents::TextResourceContents { text, .. } = &caps.contents[0] else { panic!("text") };
    let v: Value = serde_json::from_str(text).unwrap();
    let mpesa = v["rails"].as_array().unwrap().iter().find(|x| x["rail"] == "mpesa").cloned().expect("mpesa listed");
    assert_eq!(
        (mpesa["collections"].as_bool(), mpesa["payouts"].as_bool(), mpesa["reversals"].as_bool()),
        (Some(true), Some(true), Some(true))
    );
    let tools: Vec<&str> = v["tools"].as_array().unwrap().iter().filter_map(|t| t["tool"].as_str()).collect();
    assert_eq!(mpesa["business_payments"].as_bool(), Some(true));
    for t in [
        "send_mpesa_payout",
        "pay_paybill",
        "pay_till",
        "pay_to_paybill",
        "pay_to_mpesa_till",
        "request_mpesa_payment",
        "initiate_stk_push",
        "check_transaction_status",
    ] {
        assert!(tools.contains(&t), "{t} not in {tools:?}");
    }
    r.app.stop().await;
}

fn paybill(op: &str, amount: &str, reference: &str) -> Value {
    json!({"operation_id": op, "paybill": "888880", "account_reference": reference, "amount": amount,
           "remarks": "Power bill"})
}

fn till(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "till": "5123456", "amount": amount, "remarks": "Stock"})
}

/// A paybill and a till payment: each sent once (B2B, from the business's short code, under the
/// gateway's own id), pending until M-Pesa's result, the same payment under the seed's names, and
/// a result that names another amount or business refused.
#[tokio::test]
async fn a_paybill_and_a_till_payment_each_pay_once_and_settle_by_their_result() {
    let r = rig().await;
    let c = &r.client;
    let bill = ok(&call(c, "pay_paybill", paybill("bill-1", "250", "ACC-42")).await).clone();
    assert_eq!((bill["status"].as_str(), bill["to_account"].as_str()), (Some("pending"), Some("mpesa-paybill-888880")));
    assert_eq!(bill["from_account"], "mpesa-collections");
    let id = bill["payment_id"].as_str().unwrap().to_string();
    let sent = r.fake.business_payments();
    assert_eq!(sent.len(), 1);
    assert_eq!(
        (sent[0].subject.as_str(), sent[0].phone.as_str(), sent[0].account_reference.as_str(), sent[0].amount),
        ("BusinessPayBill", "888880", "ACC-42", 250)
    );
    assert_eq!(sent[0].originator_conversation_id, id, "sent under the gateway's own id");
    assert!(sent[0].result_url.ends_with(&format!("/callbacks/mpesa/result/{SECRET}")));
    // A retry, and the seed's name for the tool: the same payment, nothing sent again.
    for tool in ["pay_paybill", "pay_to_paybill"] {
        let again = ok(&call(c, tool, paybill("bill-1", "250", "ACC-42")).await).clone();
        assert_eq!(
            (again["payment_id"].as_str(), again["replayed"].as_bool()),
            (Some(id.as_str()), Some(true)),
            "{tool}"
        );
    }
    // The same operation_id for another account at the business is another payment: refused.
    let other = call(c, "pay_paybill", paybill("bill-1", "250", "ACC-43")).await;
    assert_eq!(code(&other), "IDEMPOTENCY_CONFLICT", "{other:?}");
    assert_eq!(r.fake.b2b_requests(), 1);

    // A result for another amount, or naming another business, is refused and changes nothing.
    let result_url = sent[0].result_url.clone();
    let mut forged = r.fake.result_body(&id, 0);
    forged["Result"]["ResultParameters"]["ResultParameter"][1]["Value"] = json!("2500.00");
    assert_eq!(r.fake.callback_to(&result_url, forged).await, 422);
    let mut elsewhere = r.fake.result_body(&id, 0);
    elsewhere["Result"]["ResultParameters"]["ResultParameter"][4]["Value"] = json!("999999 - Someone Else");
    assert_eq!(r.fake.callback_to(&result_url, elsewhere).await, 422);
    assert_eq!(payment(c, &id).await["status"], "pending");
    // M-Pesa posts the result: paid, with its receipt; the receipt shows no phone.
    assert_eq!(r.fake.post_result(&id, 0).await, 200);
    let settled = payment(c, &id).await;
    assert_eq!(settled["status"], "succeeded");
    assert_eq!(settled["receipt"]["reference"].as_str(), Some(r.fake.business_payments()[0].receipt.as_str()));
    assert!(settled["receipt"]["phone"].is_null(), "{settled}");

    // A till, through the seed's name: Buy Goods, and a failure result gives its budget back.
    let goods = ok(&call(c, "pay_to_mpesa_till", till("till-1", "300")).await).clone();
    assert_eq!(goods["to_account"], "mpesa-till-5123456");
    let till_id = goods["payment_id"].as_str().unwrap().to_string();
    let sent = r.fake.business_payments();
    assert_eq!((sent.len(), sent[1].subject.as_str(), sent[1].phone.as_str()), (2, "BusinessBuyGoods", "5123456"));
    let again = ok(&call(c, "pay_till", till("till-1", "300")).await).clone();
    assert_eq!((again["payment_id"].as_str(), again["replayed"].as_bool()), (Some(till_id.as_str()), Some(true)));
    assert_eq!(r.fake.post_result(&till_id, 2001).await, 200);
    assert_eq!(payment(c, &till_id).await["status"], "failed");
    assert_eq!(r.fake.b2b_requests(), 2);
    r.app.assert_secrets_not_logged();
    r.app.stop().await;
}

/// 32 identical paybill payments at once: Daraja receives one B2B request.
#[tokio::test]
async fn concurrent_duplicate_business_payments_reach_daraja_once() {
    let r = rig_waiting("", Arc::new(SystemClock), "10000").await;
    let agent = Arc::new(connect(&r.app.url, &r.app.token("dev-agent", SCOPES), Era::Modern).await);
    let mut set = tokio::task::JoinSet::new();
    for i in 0..32 {
        let agent = agent.clone();
        // Half under the seed's name: one tool, one payment.
        let tool = if i % 2 == 0 { "pay_paybill" } else { "pay_to_paybill" };
        set.spawn(async move { call(&agent, tool, paybill("dup-bill", "150", "ACC-1")).await });
    }
    let mut ids = std::collections::BTreeSet::new();
    while let Some(res) = set.join_next().await {
        ids.insert(ok(&res.unwrap())["payment_id"].as_str().unwrap().to_string());
    }
    assert_eq!(ids.len(), 1, "one payment");
    assert_eq!((r.fake.b2b_requests(), r.fake.business_payments().len()), (1, 1), "Daraja received one B2B request");
    r.app.stop().await;
}

/// The answer to a B2B request is lost: the retry never sends it again; the scheduler asks the
/// Transaction Status API (from the short code that paid) and M-Pesa's answer settles it.
#[tokio::test]
async fn a_business_payment_whose_answer_is_lost_is_settled_by_its_status_and_never_sent_again() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = rig_with("", clock.clone()).await;
    let c = &r.client;
    for (tool, args) in [("pay_paybill", paybill("lost-bill", "400", "ACC-9")), ("pay_till", till("lost-till", "500"))]
    {
        r.fake.set_outbound_mode(OutboundMode::Hang);
        let first = call(c, tool, args.clone()).await;
        assert_eq!(code(&first), "OUTCOME_UNKNOWN", "{tool}");
        r.fake.set_outbound_mode(OutboundMode::Accept);
        clock.advance(120);
        let retry = call(c, tool, args.clone()).await;
        assert_eq!(code(&retry), "OUTCOME_UNKNOWN", "{tool}: the retry does not send again");
        let id = r.fake.business_payments().last().unwrap().originator_conversation_id.clone();
        assert_eq!(payment(c, &id).await["status"], "pending");
        let asked = r.fake.status_requests();
        assert_eq!(poll(&r.app).await, 0, "the answer comes by callback");
        assert_eq!(r.fake.status_requests(), asked + 1);
        assert_eq!(r.fake.answer_status_queries().await, [200]);
        assert_eq!(payment(c, &id).await["status"], "succeeded", "{tool}");
        clock.advance(120);
        let replay = ok(&call(c, tool, args).await).clone();
        assert_eq!((replay["payment_id"].as_str(), replay["status"].as_str()), (Some(id.as_str()), Some("succeeded")));
    }
    assert_eq!((r.fake.b2b_requests(), r.fake.business_payments().len()), (2, 2), "each sent once");
    r.app.stop().await;
}

/// Over the autonomous limit a human approves; the mandate pins the paybill and the account
/// reference. Bad input is named and sends nothing; without the payout scope, nothing moves.
#[tokio::test]
async fn business_payments_need_their_scope_and_a_human_over_the_limit() {
    let r = rig().await;
    let c = &r.client;
    let collector = connect(&r.app.url, &r.app.token("dev-agent", "payments:read payments:collect"), Era::Modern).await;
    let denied = collector
        .call_tool(
            rmcp::model::CallToolRequestParams::new("pay_till")
                .with_arguments(till("scope-1", "10").as_object().unwrap().clone()),
        )
        .await;
    assert!(format!("{denied:?}").contains(r#"required_scope: Some("payments:payout")"#), "{denied:?}");
    for (tool, args, needle) in [
        ("pay_till", json!({"operation_id": "bad-1", "till": "12", "amount": "10", "remarks": "r"}), "till:"),
        ("pay_paybill", paybill("bad-2", "10", "an account reference too long"), "account_reference"),
        ("pay_paybill", paybill("bad-3", "10.50", "ACC"), "whole shillings"),
        ("pay_till", json!({"operation_id": "bad-4", "till": "5123456", "amount": "10"}), "remarks"),
    ] {
        let bad = call(c, tool, args).await;
        assert_eq!(code(&bad), "INVALID_ARGUMENT", "{bad:?}");
        assert!(err(&bad)["message"].as_str().unwrap().contains(needle), "{needle}: {bad:?}");
    }
    let over = call(c, "pay_paybill", paybill("big-bill", "1200", "ACC-42")).await;
    assert_eq!(code(&over), "APPROVAL_REQUIRED");
    assert!(r.fake.business_payments().is_empty(), "nothing leaves before approval");
    let approval_id = err(&over)["approval_id"].as_str().unwrap().to_string();
    let (status, body) = approve(&r.app, &approval_id, "alice").await;
    assert_eq!(status, 200, "{body}");
    let approved = ok(&call(c, "get_approval", json!({"approval_id": approval_id})).await).clone();
    // The mandate pins the account at the business and the business itself.
    for (number, reference) in [("888880", "ACC-43"), ("888881", "ACC-42")] {
        let mut elsewhere = paybill("big-bill-2", "1200", reference);
        elsewhere["paybill"] = json!(number);
        elsewhere["mandate"] = approved["mandate"].clone();
        let refused = call(c, "pay_paybill", elsewhere).await;
        assert!(code(&refused).starts_with("MANDATE_"), "{number}/{reference}: {refused:?}");
    }
    let mut with_mandate = paybill("big-bill", "1200", "ACC-42");
    with_mandate["mandate"] = approved["mandate"].clone();
    let paid = ok(&call(c, "pay_paybill", with_mandate).await).clone();
    assert_eq!(paid["status"], "pending");
    assert_eq!(r.fake.business_payments().len(), 1);
    r.app.stop().await;
}

/// The gateway with the Daraja simulator inside it (`mpesa.environment = "simulator"`, what
/// `init --demo` writes), jobs off (the tests run the poll job themselves), one agent profile.
fn simulator_config() -> String {
    format!(
        r#"
[mpesa]
enabled = true
environment = "simulator"
consumer_key = "demo-consumer-key"
consumer_secret = "demo-consumer-secret"
short_code = "174379"
passkey = "demo-passkey"
initiator_name = "demo-initiator"
security_credential = "demo-security-credential"
callback_secret = "{SECRET}"
request_timeout_ms = 300

[jobs]
enabled = false

[policy]
default_profile = "dev"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent"]
client_ids = []
allowed_accounts = ["acct-A", "mpesa-collections"]
autonomous_limit = {{ KES = "1000.00" }}
daily_limit = {{ KES = "100000.00" }}
daily_payments_max = 1000
calls_per_minute = 600
issuer = ""
"#
    )
}

/// The Daraja simulator inside the gateway (`mpesa.environment = "simulator"`), driven as a
/// newcomer drives it: an STK push answered on the simulator goes pending → paid (confirmed by the
/// gateway's own STK query to it); a paybill and a till payment each pay once; a lost answer is
/// never re-sent and the Transaction Status query settles it; over the limit a human is needed;
/// only an operator with payments:admin plays the customer.
#[tokio::test]
async fn the_simulator_answers_like_daraja_and_a_person_plays_the_customer() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let dir = tempfile::tempdir().unwrap();
    let config = simulator_config();
    let app = spawn_with_toml(dir.path(), &config, &[], clock.clone()).await;
    let c = &connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    let control = format!("{}/simulator/control/mpesa", app.base());
    let http = reqwest::Client::new();
    let op = app.operator_token("alice", "payments:admin");
    let post = |path: String| {
        let (http, op) = (http.clone(), op.clone());
        async move {
            let r = http.post(path).bearer_auth(op).send().await.unwrap();
            (r.status().as_u16(), r.json::<Value>().await.unwrap_or_default())
        }
    };

    // An STK push: pending until the "customer" pays on the simulator.
    let push = ok(&call(c, "request_mpesa_payment", collect("sim-1", "150")).await).clone();
    assert_eq!(push["status"], "pending");
    let pushed = push["payment_id"].as_str().unwrap().to_string();
    let (status, answered) = post(format!("{control}/latest/accept")).await;
    assert_eq!((status, answered["callback_status"].as_u64()), (200, Some(200)), "{answered}");
    assert_eq!(payment(c, &pushed).await["status"], "succeeded");
    // A declined prompt fails.
    let declined = ok(&call(c, "request_mpesa_payment", collect("sim-2", "20")).await).clone();
    assert_eq!(post(format!("{control}/latest/decline")).await.0, 200);
    assert_eq!(payment(c, declined["payment_id"].as_str().unwrap()).await["status"], "failed");

    // A paybill payment, paid once.
    let bill = ok(&call(c, "pay_paybill", paybill("sim-bill", "250", "ACC-42")).await).clone();
    let bill_id = bill["payment_id"].as_str().unwrap().to_string();
    assert_eq!(post(format!("{control}/{bill_id}/accept")).await.0, 200, "a payment is answered by its own id");
    assert_eq!(payment(c, &bill_id).await["status"], "succeeded");
    let again = ok(&call(c, "pay_paybill", paybill("sim-bill", "250", "ACC-42")).await).clone();
    assert_eq!((again["payment_id"].as_str(), again["replayed"].as_bool()), (Some(bill_id.as_str()), Some(true)));

    // A till payment whose answer is lost: unknown, never sent again, settled by the status query.
    assert_eq!(post(format!("{control}/lose-next-answer")).await.0, 200);
    let lost = call(c, "pay_till", till("sim-till", "300")).await;
    assert_eq!(code(&lost), "OUTCOME_UNKNOWN", "{lost:?}");
    clock.advance(120);
    assert_eq!(code(&call(c, "pay_till", till("sim-till", "300")).await), "OUTCOME_UNKNOWN");
    let view: Value = http.get(&control).bearer_auth(&op).send().await.unwrap().json().await.unwrap();
    let tills: Vec<&Value> = view["items"].as_array().unwrap().iter().filter(|i| i["party"] == "5123456").collect();
    assert_eq!(tills.len(), 1, "sent once: {view}");
    let till_id = tills[0]["id"].as_str().unwrap().to_string();
    // M-Pesa completed it, but its result is lost: only a queue-timeout notice arrives.
    assert_eq!(post(format!("{control}/{till_id}/timeout")).await.0, 200);
    assert_eq!(payment(c, &till_id).await["status"], "pending");
    assert_eq!(poll(&app).await, 0);
    assert_eq!(payment(c, &till_id).await["status"], "succeeded", "the status query settled it");

    // Over the autonomous limit: a human first; nothing reaches the simulator.
    let over = call(c, "pay_paybill", paybill("sim-big", "1500", "ACC-42")).await;
    assert_eq!(code(&over), "APPROVAL_REQUIRED");
    let view: Value = http.get(&control).bearer_auth(&op).send().await.unwrap().json().await.unwrap();
    assert_eq!(view["items"].as_array().unwrap().len(), 4, "{view}");

    // Only an operator with payments:admin plays the customer; an agent's token is not an operator's.
    let auditor = app.operator_token("bob", "payments:audit");
    assert_eq!(http.get(&control).bearer_auth(&auditor).send().await.unwrap().status(), 403);
    let agent = app.token("dev-agent", SCOPES);
    assert_eq!(http.get(&control).bearer_auth(&agent).send().await.unwrap().status(), 401);
    assert_eq!(post(format!("{control}/no-such-item/accept")).await.0, 404);
    assert_eq!(post(format!("{control}/{till_id}/accept")).await.0, 404, "answered once");
    app.assert_secrets_not_logged();
    app.stop().await;
}

/// Issue 53's outage, as it was found: on the simulator (`init --demo`), pushes the customers
/// never answer are asked about again and again, and Daraja — and the simulator, faithfully —
/// answers each status query with HTTP 500 "The transaction is being processed". Counted as
/// failures, they opened the one breaker all of M-Pesa shared: every push and payout to anyone was
/// refused. Now: ten pushes unanswered through five minutes of status queries (the poll job's, one
/// round every ten seconds), and a new push and a payout still go out; the Health page and
/// /metrics say every M-Pesa circuit is closed.
#[tokio::test]
async fn ten_pushes_unanswered_for_five_minutes_leave_pushes_and_payouts_working() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let dir = tempfile::tempdir().unwrap();
    let config = simulator_config();
    let app = spawn_with_toml(dir.path(), &config, &[], clock.clone()).await;
    let c = &connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    let mut open = Vec::new();
    for i in 0..10 {
        let push = ok(&call(c, "request_mpesa_payment", collect(&format!("ignored-{i}"), "10")).await).clone();
        assert_eq!(push["status"], "pending");
        open.push(push["payment_id"].as_str().unwrap().to_string());
    }
    // Five minutes of status queries, every pending push asked each round, none answered.
    for _ in 0..30 {
        clock.advance(10);
        assert_eq!(poll(&app).await, 0, "nothing settles: the customers never answer");
    }
    for id in &open {
        assert_eq!(payment(c, id).await["status"], "pending", "still open, never failed by the queries");
    }
    let pushed = call(c, "request_mpesa_payment", collect("after-five-minutes", "25")).await;
    assert_eq!(ok(&pushed)["status"], "pending", "a new push still goes out: {pushed:?}");
    let paid = call(c, "send_mpesa_payout", payout("payout-after-five-minutes", "30")).await;
    assert!(matches!(ok(&paid)["status"].as_str(), Some("pending" | "succeeded")), "a payout still goes out: {paid:?}");

    let ops = app.operator_token("ops", "payments:audit");
    let (_, health) = operator(&app, reqwest::Method::GET, "/operator/v1/health", &ops, None).await;
    let rail = health["checks"].as_array().unwrap().iter().find(|c| c["name"] == "rail").unwrap().clone();
    assert_eq!(rail["ok"], true, "{health}");
    let metrics = reqwest::get(format!("{}/metrics", app.base())).await.unwrap().text().await.unwrap();
    let circuits: Vec<&str> =
        metrics.lines().filter(|l| l.starts_with("paygate_rail_breaker_open{rail=\"mpesa\"")).collect();
    assert!(!circuits.is_empty(), "{metrics}");
    assert!(circuits.iter().all(|l| l.ends_with(" 0")), "every M-Pesa circuit closed: {circuits:?}");
    app.stop().await;
}

/// A statement against the gateway's own SQLite file, as another process (a database writer) would.
fn gateway_sql(app: &TestApp, statement: &str) {
    let db = rusqlite::Connection::open(app.data_dir.join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    db.execute_batch(statement).unwrap();
}

/// The stop-65 review (high): a trigger that swallows the rail record's insert (`RAISE(IGNORE)`:
/// the row is not written, the statement succeeds) let the gateway believe it had opened the
/// record: the payout went to Daraja, and every retry after the key's lease found no record and
/// sent it again — one operation, three payouts. A write that must change one row and changed
/// none now fails its transaction: nothing is sent, the agent is told to retry, and once the
/// trigger is gone the retry pays once. The same for the record's move (a swallowed settle leaves
/// the result callback refused, the payout pending) and for its audit records.
#[tokio::test]
async fn a_swallowed_rail_record_or_audit_record_sends_nothing_and_settles_nothing() {
    let clock = Arc::new(ManualClock::new(SystemClock.now()));
    let r = rig_with("", clock.clone()).await;
    let c = &r.client;
    for swallow in [
        "CREATE TRIGGER swallow BEFORE INSERT ON rail_payments BEGIN SELECT RAISE(IGNORE); END;",
        "CREATE TRIGGER swallow BEFORE INSERT ON audit_records WHEN NEW.decision = 'submitted'
         BEGIN SELECT RAISE(IGNORE); END;",
    ] {
        gateway_sql(&r.app, swallow);
        for _ in 0..3 {
            let refused = call(c, "send_mpesa_payout", payout("swallowed-1", "250")).await;
            assert_eq!(err(&refused)["retryable"], true, "{swallow}: {refused:?}");
            assert_ne!(code(&refused), "OUTCOME_UNKNOWN", "{swallow}: nothing was sent: {refused:?}");
            assert_eq!(r.fake.b2c_requests(), 0, "{swallow}: nothing reached Daraja");
            clock.advance(120);
        }
        gateway_sql(&r.app, "DROP TRIGGER swallow");
    }
    let paid = ok(&call(c, "send_mpesa_payout", payout("swallowed-1", "250")).await).clone();
    assert_eq!((paid["status"].as_str(), r.fake.b2c_requests()), (Some("pending"), 1), "sent once: {paid}");
    let id = paid["payment_id"].as_str().unwrap().to_string();

    // The result callback with the record's move swallowed: refused, the payout stays pending.
    gateway_sql(&r.app, "CREATE TRIGGER swallow BEFORE UPDATE ON rail_payments BEGIN SELECT RAISE(IGNORE); END;");
    assert_ne!(r.fake.post_result(&id, 0).await, 200, "a settle that did not happen is not acknowledged");
    gateway_sql(&r.app, "DROP TRIGGER swallow");
    assert_eq!(payment(c, &id).await["status"], "pending");
    // … and with its settling record swallowed: refused too.
    gateway_sql(
        &r.app,
        "CREATE TRIGGER swallow BEFORE INSERT ON audit_records WHEN NEW.decision = 'callback_settled'
         BEGIN SELECT RAISE(IGNORE); END;",
    );
    assert_ne!(r.fake.post_result(&id, 0).await, 200);
    gateway_sql(&r.app, "DROP TRIGGER swallow");
    assert_eq!(payment(c, &id).await["status"], "pending");
    assert_eq!(r.fake.post_result(&id, 0).await, 200);
    assert_eq!(payment(c, &id).await["status"], "succeeded");
    assert!(audit_codes(&r.app).await.iter().any(|c| c == "SUCCEEDED"), "the settling record is there");
    assert_eq!(r.fake.b2c_requests(), 1, "one payout in all");
    r.app.stop().await;
}
