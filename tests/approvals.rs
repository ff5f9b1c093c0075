//! The human side of approvals, black box: operator routes over HTTP against a real gateway.
//! Maker/checker, reviewer tiers, expiry, terminal states, scopes, rejection, listing and audit.
//! Every refusal is checked to have moved nothing.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use common::*;
use paygate::clock::{Clock, ManualClock, SystemClock};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const AGENT_SCOPES: &str = "payments:read payments:create payments:refund";

/// "1234.56" → 123456, exactly (no floats).
fn minor(s: &str) -> i64 {
    let (int, frac) = s.split_once('.').unwrap_or((s, ""));
    assert!(frac.len() <= 2, "KES has two decimals: {s}");
    int.parse::<i64>().unwrap() * 100 + format!("{frac:0<2}").parse::<i64>().unwrap()
}

/// What the books look like from the agent's side.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Books {
    a: i64,
    b: i64,
    payments: usize,
}

async fn books(agent: &Client) -> Books {
    let mut payments = 0;
    let mut cursor: Option<String> = None;
    loop {
        let mut args = json!({"limit": 100});
        if let Some(c) = &cursor {
            args["cursor"] = json!(c);
        }
        let r = call(agent, "list_payments", args).await;
        payments += ok(&r)["payments"].as_array().unwrap().len();
        match ok(&r)["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    Books { a: minor(&balance(agent, "acct-A").await), b: minor(&balance(agent, "acct-B").await), payments }
}

async fn pay(agent: &Client, op: &str, amount: &str, mandate: Option<&str>) -> rmcp::model::CallToolResult {
    let mut args = json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B",
                          "amount": amount, "currency": "KES"});
    if let Some(m) = mandate {
        args["mandate"] = json!(m);
    }
    call(agent, "create_payment", args).await
}

/// The agent asks for acct-A → acct-B `amount` (over its limit); returns the error object.
async fn request(agent: &Client, op: &str, amount: &str) -> Value {
    let r = pay(agent, op, amount, None).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED");
    err(&r).clone()
}

async fn request_approval(agent: &Client, op: &str, amount: &str) -> String {
    request(agent, op, amount).await["approval_id"].as_str().unwrap().to_string()
}

/// GET /approvals/{id} as an auditor.
async fn fetch(app: &TestApp, id: &str) -> Value {
    let token = app.operator_token("auditor", "payments:audit");
    let (status, body) = operator(app, Method::GET, &format!("/approvals/{id}"), &token, None).await;
    assert_eq!(status, 200, "{body}");
    body
}

/// GET /approvals?{query} as an auditor: (ids, next_cursor).
async fn list(app: &TestApp, query: &str) -> (Vec<String>, Option<String>) {
    let token = app.operator_token("auditor", "payments:audit");
    let (status, body) = operator(app, Method::GET, &format!("/approvals?{query}"), &token, None).await;
    assert_eq!(status, 200, "{query}: {body}");
    let items = body["approvals"].as_array().unwrap();
    for a in items {
        assert!(a["mandate"].is_null(), "listings never carry mandates");
    }
    let ids = items.iter().map(|a| a["approval_id"].as_str().unwrap().to_string()).collect();
    (ids, body["next_cursor"].as_str().map(str::to_string))
}

/// POST /approvals/{id}/reject as `reviewer` with `body`.
async fn reject(app: &TestApp, id: &str, reviewer: &str, body: Option<Value>) -> (StatusCode, Value) {
    let token = app.operator_token(reviewer, "payments:approve");
    operator(app, Method::POST, &format!("/approvals/{id}/reject"), &token, body).await
}

/// An operator error: the status and the envelope's code, with a correlation id present.
fn refused(resp: &(StatusCode, Value), status: u16, code: &str) {
    let (s, body) = resp;
    assert_eq!(s.as_u16(), status, "{body}");
    assert_eq!(body["error"]["code"], code, "{body}");
    assert!(!body["error"]["message"].as_str().unwrap().is_empty());
    assert!(!body["error"]["correlation_id"].as_str().unwrap().is_empty());
}

async fn agent_view(agent: &Client, id: &str) -> Value {
    let r = call(agent, "get_approval", json!({"approval_id": id})).await;
    ok(&r).clone()
}

fn claims(jws: &str) -> Value {
    let payload = jws.split('.').nth(1).expect("three parts");
    serde_json::from_slice(&B64.decode(payload).unwrap()).unwrap()
}

// 9 ───────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn the_agent_cannot_review_its_own_approval() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let before = books(&agent).await;
    let id = request_approval(&agent, "self-1", "5000.00").await;

    // The agent's own subject, holding the approve scope.
    refused(&approve(&app, &id, "dev-agent").await, 403, "SELF_REVIEW");
    refused(&reject(&app, &id, "dev-agent", Some(json!({"reason": "no"}))).await, 403, "SELF_REVIEW");

    let view = fetch(&app, &id).await;
    assert_eq!(view["status"], "pending");
    assert_eq!(view["approved_by"], json!([]));
    assert!(view["rejected_by"].is_null());
    let mine = agent_view(&agent, &id).await;
    assert_eq!(mine["status"], "pending");
    assert!(mine["mandate"].is_null());
    assert_eq!(books(&agent).await, before);
    let audit = app.audit("dev-agent").await;
    assert!(audit.iter().any(|a| a.tool == "approvals.approve" && a.decision == "refused"));
    assert!(!audit.iter().any(|a| a.tool == "mandates.issue"));

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 10 ──────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn the_high_risk_tier_needs_two_distinct_reviewers() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let before = books(&agent).await;

    // The tier starts at 100000.00 inclusive.
    assert_eq!(request(&agent, "tier-below", "99999.99").await["reviewers_required"], 1);
    assert_eq!(request(&agent, "tier-at", "100000.00").await["reviewers_required"], 2);
    let asked = request(&agent, "big-1", "150000.00").await;
    assert_eq!(asked["reviewers_required"], 2);
    let id = asked["approval_id"].as_str().unwrap().to_string();

    let (status, view) = approve(&app, &id, "alice").await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "pending", "one of two reviewers");
    assert_eq!(view["approved_by"], json!(["alice"]));
    assert!(view["mandate_id"].is_null());

    refused(&approve(&app, &id, "alice").await, 409, "CONFLICT");
    let view = fetch(&app, &id).await;
    assert_eq!(view["status"], "pending", "the same reviewer twice is still one reviewer");
    assert_eq!(view["approved_by"], json!(["alice"]));
    assert!(agent_view(&agent, &id).await["mandate"].is_null());
    assert_eq!(books(&agent).await, before);

    let (status, view) = approve(&app, &id, "bob").await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "approved");
    assert_eq!(view["approved_by"], json!(["alice", "bob"]));
    assert!(view["mandate"].is_null(), "operators do not receive the mandate");

    let mine = agent_view(&agent, &id).await;
    let mandate = mine["mandate"].as_str().unwrap().to_string();
    let c = claims(&mandate);
    assert_eq!(c["approvers"], json!(["alice", "bob"]));
    assert_eq!(c["amount_minor"], 15_000_000);
    assert_eq!(c["jti"], view["mandate_id"]);

    // The daily limit (100000.00) does not refuse a payment a human approved.
    let r = pay(&agent, "big-1", "150000.00", Some(&mandate)).await;
    assert_eq!(ok(&r)["replayed"], false);
    let after = Books { a: before.a - 15_000_000, b: before.b + 15_000_000, payments: before.payments + 1 };
    assert_eq!(books(&agent).await, after);
    // Another operation with the same mandate: refused (the mandate pins the approved operation,
    // and a closed mandate pays once).
    let r = pay(&agent, "big-2", "150000.00", Some(&mandate)).await;
    assert_eq!(code(&r), "MANDATE_MISMATCH", "a closed mandate pays once");
    assert_eq!(books(&agent).await, after);

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 11 ──────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn an_expired_approval_cannot_be_approved() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(SystemClock.now());
    let app = spawn_with_clock(dir.path(), &[("PAYGATE_APPROVALS__TTL_SECS", "600")], Arc::new(clock.clone())).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let before = books(&agent).await;
    let in_time = request_approval(&agent, "ttl-1", "5000.00").await;
    let too_late = request_approval(&agent, "ttl-2", "6000.00").await;
    agent.cancel().await.unwrap();

    // One second before expiry a review still counts.
    clock.advance(599);
    let (status, view) = approve(&app, &in_time, "alice").await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "approved");

    clock.advance(2);
    refused(&approve(&app, &too_late, "alice").await, 410, "EXPIRED");
    let view = fetch(&app, &too_late).await;
    assert_eq!(view["status"], "expired");
    assert_eq!(view["approved_by"], json!([]));
    // Terminal now: any further review is refused.
    let again = approve(&app, &too_late, "bob").await;
    assert!(matches!(again.0.as_u16(), 409 | 410), "{again:?}");
    let again = reject(&app, &too_late, "bob", Some(json!({"reason": "late"}))).await;
    assert!(matches!(again.0.as_u16(), 409 | 410), "{again:?}");
    assert_eq!(fetch(&app, &too_late).await["status"], "expired");
    let (expired, _) = list(&app, "status=expired").await;
    assert_eq!(expired, vec![too_late.clone()]);

    let agent = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let mine = agent_view(&agent, &too_late).await;
    assert_eq!(mine["status"], "expired");
    assert!(mine["mandate"].is_null());
    assert_eq!(books(&agent).await, before);
    // Asking again opens a fresh approval; nothing moves.
    let fresh = request_approval(&agent, "ttl-2", "6000.00").await;
    assert_ne!(fresh, too_late);
    assert_eq!(fetch(&app, &fresh).await["status"], "pending");
    assert_eq!(books(&agent).await, before);

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn an_untouched_approval_past_its_expiry_is_listed_as_expired() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(SystemClock.now());
    let app = spawn_with_clock(dir.path(), &[("PAYGATE_APPROVALS__TTL_SECS", "600")], Arc::new(clock.clone())).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let id = request_approval(&agent, "stale-1", "5000.00").await;
    agent.cancel().await.unwrap();
    assert_eq!(list(&app, "status=pending").await.0, vec![id.clone()]);

    clock.advance(601);
    // Nobody reviewed it; it expired all the same, and every read agrees.
    assert_eq!(fetch(&app, &id).await["status"], "expired");
    let (all, _) = list(&app, "").await;
    assert_eq!(all, vec![id.clone()]);
    let (pending, _) = list(&app, "status=pending").await;
    assert!(pending.is_empty(), "an expired approval is not pending: {pending:?}");
    let (expired, _) = list(&app, "status=expired").await;
    assert_eq!(expired, vec![id.clone()], "status=expired lists it");

    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 12 ──────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn a_decided_approval_cannot_be_reviewed_again() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let before = books(&agent).await;
    let approved = request_approval(&agent, "done-1", "5000.00").await;
    let rejected = request_approval(&agent, "done-2", "6000.00").await;
    assert_eq!(approve(&app, &approved, "alice").await.0, 200);
    assert_eq!(reject(&app, &rejected, "carol", Some(json!({"reason": "not today"}))).await.0, 200);

    for (id, status) in [(&approved, "approved"), (&rejected, "rejected")] {
        let snapshot = fetch(&app, id).await;
        for reviewer in ["alice", "carol", "dave"] {
            refused(&approve(&app, id, reviewer).await, 409, "CONFLICT");
            refused(&reject(&app, id, reviewer, Some(json!({"reason": "changed my mind"}))).await, 409, "CONFLICT");
        }
        let now = fetch(&app, id).await;
        assert_eq!(now["status"], status);
        assert_eq!(now, snapshot, "{status}: a terminal approval never changes");
    }
    assert!(agent_view(&agent, &rejected).await["mandate"].is_null());
    assert!(agent_view(&agent, &approved).await["mandate"].is_string());
    assert_eq!(books(&agent).await, before);

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 13 ──────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn scopes_and_authentication_guard_the_operator_routes() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let before = books(&agent).await;
    let id = request_approval(&agent, "scope-1", "5000.00").await;
    let viewer = app.operator_token("viewer", "payments:audit");

    // A viewer reads the list and the item…
    let (status, body) = operator(&app, Method::GET, "/approvals", &viewer, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["approvals"][0]["approval_id"], id);
    let (status, body) = operator(&app, Method::GET, &format!("/approvals/{id}"), &viewer, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["approval_id"], id);
    assert_eq!(body["status"], "pending");
    assert!(body["mandate"].is_null());

    // …but cannot decide.
    let path = format!("/approvals/{id}/approve");
    refused(
        &operator(&app, Method::POST, &path, &viewer, Some(json!({"reason": "ok"}))).await,
        403,
        "INSUFFICIENT_SCOPE",
    );
    let path = format!("/approvals/{id}/reject");
    refused(
        &operator(&app, Method::POST, &path, &viewer, Some(json!({"reason": "no"}))).await,
        403,
        "INSUFFICIENT_SCOPE",
    );
    let preauth = json!({"subject": "dev-agent", "kind": "closed", "currency": "KES",
                         "payer": "acct-A", "payee": "acct-B", "amount": "2500.00"});
    refused(&operator(&app, Method::POST, "/approvals", &viewer, Some(preauth)).await, 403, "INSUFFICIENT_SCOPE");

    // An agent's token is for the MCP resource: refused here whatever it carries.
    let agent_token = app.token("dev-agent", AGENT_SCOPES);
    for path in ["/approvals".to_string(), format!("/approvals/{id}")] {
        let (status, _) = operator(&app, Method::GET, &path, &agent_token, None).await;
        assert_eq!(status, 401, "{path}");
    }

    // No token, or a bad one: 401 with a challenge.
    paygate::install_crypto_provider();
    let http = reqwest::Client::new();
    for (method, path) in [
        (Method::GET, "/approvals".to_string()),
        (Method::GET, format!("/approvals/{id}")),
        (Method::POST, format!("/approvals/{id}/approve")),
        (Method::POST, format!("/approvals/{id}/reject")),
    ] {
        let resp = http.request(method.clone(), format!("{}{path}", app.base())).send().await.unwrap();
        assert_eq!(resp.status(), 401, "{method} {path}");
        let challenge = resp.headers().get("www-authenticate").expect("WWW-Authenticate").to_str().unwrap();
        assert!(challenge.starts_with("Bearer "), "{challenge}");
        // The operator resource's own metadata, not the MCP resource's.
        assert!(challenge.contains("/.well-known/oauth-protected-resource/operator\""), "{challenge}");
    }
    let resp = http.get(format!("{}/approvals", app.base())).bearer_auth("not-a-token").send().await.unwrap();
    assert_eq!(resp.status(), 401);
    assert!(resp.headers().get("www-authenticate").unwrap().to_str().unwrap().contains("invalid_token"));

    // Unknown approvals are 404 to approvers and viewers alike.
    refused(&approve(&app, "apr_doesnotexist", "alice").await, 404, "NOT_FOUND");
    refused(&approve(&app, "not-an-id", "alice").await, 404, "NOT_FOUND");
    refused(&operator(&app, Method::GET, "/approvals/apr_doesnotexist", &viewer, None).await, 404, "NOT_FOUND");

    let view = fetch(&app, &id).await;
    assert_eq!(view["status"], "pending");
    assert_eq!(view["approved_by"], json!([]));
    assert_eq!(books(&agent).await, before);

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 14 ──────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn a_rejection_needs_a_reason_and_yields_no_mandate() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let other = connect(&app.url, &app.token("other-agent", AGENT_SCOPES), Era::Modern).await;
    let before = books(&agent).await;
    let id = request_approval(&agent, "no-1", "5000.00").await;

    for body in [None, Some(json!({})), Some(json!({"reason": ""})), Some(json!({"reason": "   "}))] {
        refused(&reject(&app, &id, "carol", body.clone()).await, 400, "INVALID_ARGUMENT");
        assert_eq!(fetch(&app, &id).await["status"], "pending", "{body:?}");
    }
    refused(&reject(&app, &id, "carol", Some(json!({"reason": "x", "extra": 1}))).await, 400, "INVALID_ARGUMENT");
    assert_eq!(fetch(&app, &id).await["status"], "pending");

    let (status, view) = reject(&app, &id, "carol", Some(json!({"reason": "not this month"}))).await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "rejected");
    assert_eq!(view["rejected_by"], "carol");
    assert_eq!(view["decision_reason"], "not this month");
    assert!(view["decided_at"].is_string());

    let mine = agent_view(&agent, &id).await;
    assert_eq!(mine["status"], "rejected");
    assert!(mine["mandate"].is_null());
    assert!(mine["mandate_id"].is_null());
    // Someone else's approval does not exist for another agent.
    let r = call(&other, "get_approval", json!({"approval_id": id})).await;
    assert_eq!(code(&r), "NOT_FOUND");
    assert_eq!(books(&agent).await, before);

    agent.cancel().await.unwrap();
    other.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

/// A rejected intent asked again under a new operation_id is refused until the cool-down ends (the
/// refusal names that moment), and after it is a fresh question for a person.
#[tokio::test]
async fn a_rejected_intent_is_refused_until_its_cool_down_ends_then_asked_afresh() {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(SystemClock.now());
    let overrides = [("PAYGATE_APPROVALS__REJECTED_COOLDOWN_SECS", "1800"), ("PAYGATE_APPROVALS__TTL_SECS", "600")];
    let app = spawn_with_clock(dir.path(), &overrides, Arc::new(clock.clone())).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let id = request_approval(&agent, "cool-1", "5000.00").await;
    clock.advance(60);
    let decided = clock.now();
    let (status, view) = reject(&app, &id, "carol", Some(json!({"reason": "not now"}))).await;
    assert_eq!(status, 200, "{view}");

    // (Within the agent token's hour.)
    clock.advance(1799);
    let r = pay(&agent, "cool-2", "5000.00", None).await;
    assert_eq!(code(&r), "APPROVAL_REJECTED", "{r:?}");
    let until = paygate::clock::rfc3339(decided + 1800);
    let message = err(&r)["message"].as_str().unwrap().to_string();
    assert!(message.contains(&until), "the refusal names when asking again is allowed ({until}): {message}");

    clock.advance(2);
    let r = pay(&agent, "cool-3", "5000.00", None).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "after the cool-down a person is asked again: {r:?}");
    assert_ne!(err(&r)["approval_id"].as_str(), Some(id.as_str()));
    agent.cancel().await.unwrap();
    app.stop().await;
}

// 15 ──────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn listing_filters_by_status_and_paginates() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let before = books(&agent).await;
    let first = request_approval(&agent, "list-1", "5000.00").await;
    let second = request_approval(&agent, "list-2", "6000.00").await;
    let third = request_approval(&agent, "list-3", "7000.00").await;
    assert_eq!(approve(&app, &first, "alice").await.0, 200);
    assert_eq!(reject(&app, &second, "carol", Some(json!({"reason": "no"}))).await.0, 200);

    assert_eq!(list(&app, "status=pending").await, (vec![third.clone()], None));
    assert_eq!(list(&app, "status=approved").await, (vec![first.clone()], None));
    assert_eq!(list(&app, "status=rejected").await, (vec![second.clone()], None));
    assert_eq!(list(&app, "status=expired").await, (vec![], None));
    assert_eq!(list(&app, "").await, (vec![third.clone(), second.clone(), first.clone()], None));

    // One at a time, newest first, each exactly once.
    let mut seen = vec![];
    let mut query = "limit=1".to_string();
    loop {
        let (ids, next) = list(&app, &query).await;
        assert_eq!(ids.len(), 1, "{query}");
        seen.extend(ids);
        match next {
            Some(c) => query = format!("limit=1&cursor={c}"),
            None => break,
        }
    }
    assert_eq!(seen, vec![third.clone(), second.clone(), first.clone()]);
    // Filter and pagination together.
    let (ids, next) = list(&app, "status=approved&limit=1").await;
    assert_eq!((ids, next), (vec![first.clone()], None));

    let auditor = app.operator_token("auditor", "payments:audit");
    for bad in ["status=bogus", "limit=0", "limit=101", "cursor=garbage", "colour=blue"] {
        let resp = operator(&app, Method::GET, &format!("/approvals?{bad}"), &auditor, None).await;
        refused(&resp, 400, "INVALID_ARGUMENT");
    }
    assert_eq!(books(&agent).await, before);

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

// 16 ──────────────────────────────────────────────────────────────────────────────────────────────

#[tokio::test]
async fn operator_actions_are_audited_under_the_operator() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let before = books(&agent).await;

    // alice pre-authorizes a high-tier payment: her approval counts once, bob's completes it.
    let alice = app.operator_token("alice", "payments:approve");
    let body = json!({"subject": "dev-agent", "kind": "closed", "currency": "KES",
                      "payer": "acct-A", "payee": "acct-B", "amount": "150000.00"});
    let (status, view) = operator(&app, Method::POST, "/approvals", &alice, Some(body)).await;
    assert_eq!(status, 201, "{view}");
    assert_eq!(view["status"], "pending");
    assert_eq!(view["reviewers_required"], 2);
    assert_eq!(view["approved_by"], json!(["alice"]));
    assert_eq!(view["requested_by"], "alice");
    let preauth = view["approval_id"].as_str().unwrap().to_string();
    refused(&approve(&app, &preauth, "alice").await, 409, "CONFLICT");
    let (status, view) = approve(&app, &preauth, "bob").await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(view["status"], "approved");
    let mandate_id = view["mandate_id"].as_str().unwrap().to_string();

    // carol rejects an agent's request.
    let rejected = request_approval(&agent, "audit-1", "5000.00").await;
    assert_eq!(reject(&app, &rejected, "carol", Some(json!({"reason": "duplicate invoice"}))).await.0, 200);

    let has = |records: &[paygate::domain::audit::AuditRecord], tool: &str, decision: &str, id: &str| {
        records.iter().any(|a| {
            a.tool == tool
                && a.decision == decision
                && a.approval_id.as_deref() == Some(id)
                && a.principal_iss == DEV_ISSUER
        })
    };
    let a = app.audit("alice").await;
    assert!(has(&a, "approvals.preauthorize", "created", &preauth), "{a:?}");
    assert!(has(&a, "approvals.approve", "recorded", &preauth), "{a:?}");
    assert!(has(&a, "approvals.approve", "refused", &preauth), "her second approval was refused: {a:?}");
    assert!(!a.iter().any(|r| r.tool == "mandates.issue"), "alice alone did not issue it: {a:?}");

    let b = app.audit("bob").await;
    assert!(has(&b, "approvals.approve", "recorded", &preauth), "{b:?}");
    assert!(has(&b, "mandates.issue", "issued", &preauth), "{b:?}");
    let issue = b.iter().find(|r| r.tool == "mandates.issue").unwrap();
    let detail = issue.detail.as_deref().unwrap_or_default();
    assert!(detail.contains(&mandate_id) && detail.contains("dev-agent"), "{detail}");

    let c = app.audit("carol").await;
    assert!(has(&c, "approvals.reject", "recorded", &rejected), "{c:?}");
    let rec = c.iter().find(|r| r.tool == "approvals.reject").unwrap();
    assert_eq!(rec.detail.as_deref(), Some("duplicate invoice"));

    // None of it is attributed to the agent.
    let d = app.audit("dev-agent").await;
    assert!(!d.iter().any(|r| r.tool.starts_with("approvals.") || r.tool == "mandates.issue"), "{d:?}");
    assert_eq!(books(&agent).await, before);

    agent.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}
