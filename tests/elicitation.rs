//! Approvals through MCP URL-mode elicitation, end to end: an rmcp client that declares URL
//! elicitation asks for an over-limit payment, is sent to the approval page, a human approves it
//! through the route, and the client's retry pays exactly once, in both protocol eras. The rounds
//! are driven by hand (`call_tool_once`), approving in between, as a person would.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use paygate::clock::ManualClock;
use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ClientCapabilities, ClientConfig, CustomNotification,
    ElicitRequestParams, ElicitationCapability, FormElicitationCapability, InputRequest, InputRequiredResult,
    ProtocolVersion, UrlElicitationCapability,
};
use rmcp::service::{NotificationContext, RunningService, ServiceError};
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::{ClientHandler, ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::{Value, json};
use tokio::sync::mpsc;

/// An MCP client with chosen elicitation capabilities that reports `notifications/elicitation/complete`.
#[derive(Clone)]
struct Agent {
    info: ClientConfig,
    completed: mpsc::UnboundedSender<String>,
}

impl ClientHandler for Agent {
    fn get_info(&self) -> ClientConfig {
        self.info.clone()
    }

    async fn on_custom_notification(&self, notification: CustomNotification, _: NotificationContext<RoleClient>) {
        if notification.method == "notifications/elicitation/complete" {
            let id = notification.params.as_ref().and_then(|p| p["elicitationId"].as_str()).unwrap_or_default();
            let _ = self.completed.send(id.to_string());
        }
    }
}

type Conn = RunningService<RoleClient, Agent>;

#[derive(Clone, Copy, PartialEq)]
enum Modes {
    Url,
    FormOnly,
}

async fn agent(app: &TestApp, token: &str, era: Era, modes: Modes) -> (Conn, mpsc::UnboundedReceiver<String>) {
    paygate::install_crypto_provider();
    let mut caps = ClientCapabilities::default();
    let elicitation = match modes {
        Modes::Url => ElicitationCapability::new().with_url(UrlElicitationCapability::new()),
        Modes::FormOnly => ElicitationCapability::new().with_form(FormElicitationCapability::default()),
    };
    caps.elicitation = Some(elicitation);
    let (version, mode) = match era {
        Era::Legacy => (ProtocolVersion::V_2025_11_25, ClientLifecycleMode::Initialize),
        Era::Modern => (
            ProtocolVersion::V_2026_07_28,
            ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
        ),
    };
    let mut info = ClientConfig::default().with_protocol_version(version);
    info.capabilities = caps;
    let (tx, rx) = mpsc::unbounded_channel();
    let transport = StreamableHttpClientTransport::from_config(transport_config(&app.url, token));
    let conn = Agent { info, completed: tx }.serve_with_lifecycle(transport, mode).await.expect("connects");
    (conn, rx)
}

fn params(tool: &str, args: &Value) -> CallToolRequestParams {
    CallToolRequestParams::new(tool.to_string()).with_arguments(args.as_object().cloned().unwrap())
}

/// The retry a client sends after an `input_required`: same call, the state echoed, the page's answer.
fn retry(tool: &str, args: &Value, state: &str, action: &str) -> CallToolRequestParams {
    let responses = [("approval".to_string(), json!({"action": action}))].into();
    params(tool, args).with_request_state(state.to_string()).with_input_responses(responses)
}

async fn once(conn: &Conn, p: CallToolRequestParams) -> CallToolResponse {
    conn.call_tool_once(p).await.expect("a tools/call result")
}

fn input_required(r: CallToolResponse) -> InputRequiredResult {
    match r {
        CallToolResponse::InputRequired(i) => i,
        other => panic!("expected input_required, got {other:?}"),
    }
}

fn completed(r: CallToolResponse) -> CallToolResult {
    match r {
        CallToolResponse::Complete(c) => c,
        other => panic!("expected a complete result, got {other:?}"),
    }
}

/// The approval page the input request sends the user to, and the approval id it is for.
fn page(i: &InputRequiredResult) -> (String, String) {
    let requests = i.input_requests.as_ref().expect("input requests");
    assert_eq!(requests.len(), 1);
    let Some(InputRequest::Elicitation(req)) = requests.get("approval") else { panic!("no approval elicitation") };
    let ElicitRequestParams::UrlElicitationParams { url, message, .. } = &req.params else { panic!("not url mode") };
    assert!(message.contains("approv"), "{message}");
    let apr = url.rsplit('/').next().unwrap().to_string();
    assert!(apr.starts_with("apr_"), "{url}");
    (url.clone(), apr)
}

fn ask(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"})
}

fn minor(b: &str) -> i64 {
    (b.parse::<f64>().unwrap() * 100.0).round() as i64
}

async fn balance_of(app: &TestApp, account: &str) -> i64 {
    let plain = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let b = minor(&balance(&plain, account).await);
    plain.cancel().await.unwrap();
    b
}

#[tokio::test]
async fn a_2026_client_is_sent_to_the_approval_page_and_its_retry_pays_exactly_once() {
    let (app, _dir) = spawn_app().await;
    let (conn, _) = agent(&app, &app.dev_token(), Era::Modern, Modes::Url).await;
    let before = balance_of(&app, "acct-B").await;
    let args = ask("elicit-2026", "5000.00");

    let first = input_required(once(&conn, params("create_payment", &args)).await);
    let (url, apr) = page(&first);
    assert_eq!(url, format!("{}/console#approvals/{apr}", app.base()), "the console's page for this approval");
    let state = first.request_state.clone().expect("a sealed requestState");
    assert_eq!(balance_of(&app, "acct-B").await, before, "nothing moved yet");

    let (status, body) = approve(&app, &apr, "alice").await;
    assert_eq!(status, 200, "{body}");

    let paid = completed(once(&conn, retry("create_payment", &args, &state, "accept")).await);
    let paid = ok(&paid).clone();
    assert_eq!(paid["replayed"], false, "{paid}");
    assert_eq!(paid["status"], "succeeded");
    // The same state again (a lost answer, a replay): the one payment, replayed.
    let again = completed(once(&conn, retry("create_payment", &args, &state, "accept")).await);
    assert_eq!(ok(&again)["replayed"], true);
    assert_eq!(ok(&again)["payment_id"], paid["payment_id"]);
    // And a plain retry of the call: the same payment.
    let plain = completed(once(&conn, params("create_payment", &args)).await);
    assert_eq!(ok(&plain)["payment_id"], paid["payment_id"]);
    assert_eq!(balance_of(&app, "acct-B").await - before, 500_000, "KES 5,000 moved once");

    // The mandate never reached the model: nothing the client saw carries one.
    for seen in [&paid, ok(&again), ok(&plain)] {
        assert!(!seen.to_string().contains("eyJ"), "a JWS in a result: {seen}");
    }
    let audit = app.audit("dev-agent").await;
    assert!(audit.iter().any(|r| r.decision == "mandate_accepted" && r.approval_id.as_deref() == Some(apr.as_str())));
    conn.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
}

/// Finding 4 of the authority review: each sealed state carried its own round number and nothing on
/// the server counted, so replaying the round-1 state after the chain ended answered
/// `input_required` again, forever (each answer a held retry). Now the rounds are counted per
/// approval on the server: an old state, or a fresh chain with no state, gets APPROVAL_REQUIRED.
#[tokio::test]
async fn a_replayed_early_state_cannot_restart_the_rounds() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(
        dir.path(),
        &[("PAYGATE_APPROVALS__ELICITATION_WAIT_SECS", "0"), ("PAYGATE_APPROVALS__ELICITATION_ROUNDS_MAX", "3")],
    )
    .await;
    let (conn, _) = agent(&app, &app.dev_token(), Era::Modern, Modes::Url).await;
    let args = ask("replayed-round", "5000.00");
    let first = input_required(once(&conn, params("create_payment", &args)).await);
    let (_, apr) = page(&first);
    let state1 = first.request_state.clone().unwrap();
    let second = input_required(once(&conn, retry("create_payment", &args, &state1, "accept")).await);
    let third = input_required(
        once(&conn, retry("create_payment", &args, second.request_state.as_ref().unwrap(), "accept")).await,
    );
    // Three rounds answered: the chain's next retry gets APPROVAL_REQUIRED...
    let done =
        completed(once(&conn, retry("create_payment", &args, third.request_state.as_ref().unwrap(), "accept")).await);
    assert_eq!(code(&done), "APPROVAL_REQUIRED");
    // ...and so does the round-1 state replayed, and so does a new chain with no state at all.
    for _ in 0..3 {
        let replayed = completed(once(&conn, retry("create_payment", &args, &state1, "accept")).await);
        assert_eq!(code(&replayed), "APPROVAL_REQUIRED", "{replayed:?}");
        assert_eq!(err(&replayed)["approval_id"], apr.as_str());
        let fresh = completed(once(&conn, params("create_payment", &args)).await);
        assert_eq!(code(&fresh), "APPROVAL_REQUIRED", "{fresh:?}");
    }
    // The approval still stands for a human: approved, the by-hand path pays once.
    let (status, body) = approve(&app, &apr, "alice").await;
    assert_eq!(status, 200, "{body}");
    let paid = completed(once(&conn, retry("create_payment", &args, &state1, "accept")).await);
    assert_eq!(ok(&paid)["replayed"], false);
    conn.cancel().await.unwrap();
    app.assert_integrity().await;
}

#[tokio::test]
async fn a_retry_before_the_decision_is_held_then_answered_again_and_bounded() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(
        dir.path(),
        &[("PAYGATE_APPROVALS__ELICITATION_WAIT_SECS", "0"), ("PAYGATE_APPROVALS__ELICITATION_ROUNDS_MAX", "2")],
    )
    .await;
    let (conn, _) = agent(&app, &app.dev_token(), Era::Modern, Modes::Url).await;
    let before = balance_of(&app, "acct-B").await;
    let args = ask("early-retry", "5000.00");
    let first = input_required(once(&conn, params("create_payment", &args)).await);
    let (_, apr) = page(&first);

    // Still pending: another input_required, state only (the page is not offered twice).
    let second = input_required(
        once(&conn, retry("create_payment", &args, first.request_state.as_ref().unwrap(), "accept")).await,
    );
    assert!(second.input_requests.is_none());
    let state2 = second.request_state.clone().unwrap();
    assert_ne!(Some(&state2), first.request_state.as_ref(), "a fresh state each round");
    // Past elicitation_rounds_max: today's APPROVAL_REQUIRED, naming the approval.
    let third = completed(once(&conn, retry("create_payment", &args, &state2, "accept")).await);
    assert_eq!(code(&third), "APPROVAL_REQUIRED");
    assert_eq!(err(&third)["approval_id"], apr.as_str());

    // The user declined to open the page: APPROVAL_REQUIRED at once, the approval still stands.
    let declined =
        completed(once(&conn, retry("create_payment", &args, first.request_state.as_ref().unwrap(), "decline")).await);
    assert_eq!(code(&declined), "APPROVAL_REQUIRED");

    // A rejection: the retry gets the refusal, and nothing moved.
    let token = app.operator_token("bob", "payments:approve");
    let (status, body) = operator(
        &app,
        reqwest::Method::POST,
        &format!("/approvals/{apr}/reject"),
        &token,
        Some(json!({"reason": "not this month"})),
    )
    .await;
    assert_eq!(status, 200, "{body}");
    let refused = completed(once(&conn, retry("create_payment", &args, &state2, "accept")).await);
    assert_eq!(code(&refused), "APPROVAL_REJECTED");
    assert_eq!(balance_of(&app, "acct-B").await, before, "nothing moved");
    conn.cancel().await.unwrap();
    app.assert_integrity().await;
}

#[tokio::test]
async fn a_waiting_retry_is_woken_by_the_approval_and_pays() {
    // The default wait (20 s): the retry is held until the human decides, then pays.
    let (app, _dir) = spawn_app().await;
    let (conn, _) = agent(&app, &app.dev_token(), Era::Modern, Modes::Url).await;
    let conn = Arc::new(conn);
    let before = balance_of(&app, "acct-B").await;
    let args = ask("held-retry", "4000.00");
    let first = input_required(once(&conn, params("create_payment", &args)).await);
    let (_, apr) = page(&first);
    let state = first.request_state.unwrap();

    let waiting = {
        let (conn, args, state) = (conn.clone(), args.clone(), state.clone());
        tokio::spawn(async move { once(&conn, retry("create_payment", &args, &state, "accept")).await })
    };
    let (status, body) = approve(&app, &apr, "alice").await;
    assert_eq!(status, 200, "{body}");
    let paid = completed(tokio::time::timeout(Duration::from_secs(25), waiting).await.expect("answered").unwrap());
    assert_eq!(ok(&paid)["status"], "succeeded");
    assert_eq!(balance_of(&app, "acct-B").await - before, 400_000);
    app.assert_integrity().await;
}

#[tokio::test]
async fn a_forged_altered_expired_or_borrowed_request_state_moves_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let clock = Arc::new(ManualClock::new(now_secs()));
    let app = spawn_with_clock(dir.path(), &[], clock.clone()).await;
    let (conn, _) = agent(&app, &app.dev_token(), Era::Modern, Modes::Url).await;
    let args = ask("tamper", "5000.00");
    let first = input_required(once(&conn, params("create_payment", &args)).await);
    let (_, apr) = page(&first);
    let state = first.request_state.clone().unwrap();
    // Approved, so that any state that opened would pay.
    let (status, body) = approve(&app, &apr, "alice").await;
    assert_eq!(status, 200, "{body}");
    let before = balance_of(&app, "acct-B").await;

    let refused = |r: CallToolResponse| {
        let r = completed(r);
        assert_eq!(code(&r), "INVALID_ARGUMENT", "{:?}", r.structured_content);
        assert_eq!(err(&r)["request_state"], "invalid");
        let action = err(&r)["suggested_action"].as_str().unwrap();
        assert!(action.contains("same operation_id") && action.contains("without requestState"), "{action}");
    };
    // Forged: one character of the tag changed; a made-up state.
    let mut forged = state.clone();
    let last = forged.pop().unwrap();
    forged.push(if last == 'A' { 'B' } else { 'A' });
    refused(once(&conn, retry("create_payment", &args, &forged, "accept")).await);
    refused(once(&conn, retry("create_payment", &args, "v1.eyJhcHIiOiJhcHJfeCJ9.AAAA", "accept")).await);
    // The same state for other arguments (a larger amount, another payee) or another operation.
    refused(once(&conn, retry("create_payment", &ask("tamper", "9000.00"), &state, "accept")).await);
    let mut other_payee = args.clone();
    other_payee["to_account"] = json!("acct-A");
    refused(once(&conn, retry("create_payment", &other_payee, &state, "accept")).await);
    refused(once(&conn, retry("create_payment", &ask("tamper-2", "5000.00"), &state, "accept")).await);
    // Another agent presenting it (its own URL-capable client).
    let (mallory, _) =
        agent(&app, &app.token("mallory", "payments:read payments:create"), Era::Modern, Modes::Url).await;
    refused(once(&mallory, retry("create_payment", &args, &state, "accept")).await);
    // A client that did not declare URL elicitation presenting it.
    let (form_only, _) = agent(&app, &app.dev_token(), Era::Modern, Modes::FormOnly).await;
    refused(once(&form_only, retry("create_payment", &args, &state, "accept")).await);
    // Expired: past the state's lifetime (the approval itself is still valid).
    clock.advance(paygate::gateway::REQUEST_STATE_TTL_SECS + 1);
    refused(once(&conn, retry("create_payment", &args, &state, "accept")).await);

    assert_eq!(balance_of(&app, "acct-B").await, before, "nothing moved");
    // Each refusal is in the audit trail, under whoever presented the state.
    let refusals = |audit: Vec<paygate::domain::audit::AuditRecord>| {
        audit.iter().filter(|r| r.detail.as_deref().is_some_and(|d| d.starts_with("requestState refused"))).count()
    };
    assert_eq!(refusals(app.audit("dev-agent").await), 7);
    assert_eq!(refusals(app.audit("mallory").await), 1);
    // The approval still pays its own call exactly once (through a fresh round).
    let again = once(&conn, params("create_payment", &args)).await;
    let paid = completed(again);
    assert_eq!(ok(&paid)["replayed"], false);
    assert_eq!(balance_of(&app, "acct-B").await - before, 500_000);
    for c in [conn, mallory, form_only] {
        c.cancel().await.unwrap();
    }
    app.assert_integrity().await;
}

#[tokio::test]
async fn a_2025_client_gets_the_url_elicitation_error_then_a_completion_notice_and_its_retry_pays_once() {
    let (app, _dir) = spawn_app().await;
    let (conn, mut completions) = agent(&app, &app.dev_token(), Era::Legacy, Modes::Url).await;
    let before = balance_of(&app, "acct-B").await;
    let args = ask("elicit-2025", "5000.00");

    let e = match conn.call_tool_once(params("create_payment", &args)).await {
        Err(ServiceError::McpError(e)) => e,
        other => panic!("expected the -32042 error, got {other:?}"),
    };
    assert_eq!(e.code.0, -32042);
    let data = e.data.expect("error data");
    let elicitation = &data["elicitations"][0];
    assert_eq!(elicitation["mode"], "url");
    let apr = elicitation["elicitationId"].as_str().unwrap().to_string();
    assert!(apr.starts_with("apr_"));
    assert_eq!(elicitation["url"], format!("{}/console#approvals/{apr}", app.base()));
    assert_eq!(data["error"]["code"], "APPROVAL_REQUIRED", "the envelope rides along: {data}");
    // Before the decision a retry gets the same elicitation, for the same approval.
    match conn.call_tool_once(params("create_payment", &args)).await {
        Err(ServiceError::McpError(e)) => assert_eq!(e.data.unwrap()["elicitations"][0]["elicitationId"], apr.as_str()),
        other => panic!("expected the -32042 error again, got {other:?}"),
    }
    assert_eq!(balance_of(&app, "acct-B").await, before);

    let (status, body) = approve(&app, &apr, "alice").await;
    assert_eq!(status, 200, "{body}");
    let done = tokio::time::timeout(Duration::from_secs(20), completions.recv()).await.expect("completion notice");
    assert_eq!(done.as_deref(), Some(apr.as_str()));

    let paid = completed(once(&conn, params("create_payment", &args)).await);
    assert_eq!(ok(&paid)["replayed"], false);
    let again = completed(once(&conn, params("create_payment", &args)).await);
    assert_eq!(ok(&again)["replayed"], true);
    assert_eq!(ok(&again)["payment_id"], ok(&paid)["payment_id"]);
    assert_eq!(balance_of(&app, "acct-B").await - before, 500_000);
    conn.cancel().await.unwrap();
    app.assert_integrity().await;
}

#[tokio::test]
async fn clients_without_url_elicitation_see_todays_approval_required() {
    let (app, _dir) = spawn_app().await;
    for era in ERAS {
        for (name, conn) in
            [("no elicitation", None), ("form only", Some(agent(&app, &app.dev_token(), era, Modes::FormOnly).await.0))]
        {
            let op = format!("plain-{era:?}-{}", name.replace(' ', "-"));
            let r = match &conn {
                Some(c) => completed(once(c, params("create_payment", &ask(&op, "5000.00"))).await),
                None => {
                    call(&connect(&app.url, &app.dev_token(), era).await, "create_payment", ask(&op, "5000.00")).await
                }
            };
            assert_eq!(code(&r), "APPROVAL_REQUIRED", "{era:?} {name}");
            assert!(err(&r)["approval_url"].as_str().unwrap().ends_with(err(&r)["approval_id"].as_str().unwrap()));
        }
    }
}

/// The dev agent's profile with the user-approval tier: up to KES 10,000 the user confirms it.
const USER_TIER: &str = r#"
[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "100000.00" }
daily_payments_max = 1000
calls_per_minute = 10000
approvals_by = "user"
user_approval_max = { KES = "10000.00" }
"#;

#[tokio::test]
async fn in_their_tier_the_user_confirms_on_their_own_page_and_the_retry_pays_once() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(dir.path(), USER_TIER, &[], Arc::new(paygate::clock::SystemClock)).await;
    // The agent acts for pat (RFC 8693: sub = pat, act.sub = dev-agent): pat is the person to ask.
    let agent_token = app.delegated_token("pat", "dev-agent", "payments:read payments:create payments:refund");
    let (conn, _) = agent(&app, &agent_token, Era::Modern, Modes::Url).await;
    let before = balance_of(&app, "acct-B").await;
    let args = ask("user-tier", "5000.00");
    let first = input_required(once(&conn, params("create_payment", &args)).await);
    let (url, apr) = page(&first);
    assert_eq!(url, format!("{}/console#confirm/{apr}", app.base()), "the user's own confirmation page");
    let state = first.request_state.clone().unwrap();
    let path = format!("/operator/v1/confirmations/{apr}");
    let post = |token: String, decision: &'static str| {
        let (app, path) = (&app, path.clone());
        async move { operator(app, reqwest::Method::POST, &format!("{path}/{decision}"), &token, Some(json!({}))).await }
    };

    // The agent's own token is for the MCP resource: the confirmation route refuses it (401).
    let (status, body) = post(agent_token.clone(), "approve").await;
    assert_eq!(status, 401, "{body}");
    // A delegated token for the operator side is still the agent's (act): refused too.
    let acting = app.running.mint(paygate::auth::Audience::Operator, "pat", Some("dev-agent"), "payments:confirm", 600);
    let (status, body) = post(acting.unwrap(), "approve").await;
    assert_eq!(status, 401, "{body}");
    // The agent signed in as itself is not the person it acts for.
    let (status, _) = post(app.operator_token("dev-agent", "payments:confirm"), "approve").await;
    assert_eq!(status, 404);
    // A token that can confirm is never an agent's: /mcp refuses one even for its own audience.
    let confirm_as_agent = app.token("pat", "payments:read payments:confirm");
    let as_agent = reqwest::Client::new()
        .post(&app.url)
        .bearer_auth(&confirm_as_agent)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "server/discover", "params": {}}))
        .send()
        .await
        .unwrap();
    assert_eq!(as_agent.status(), 401);
    // Another person cannot see or confirm it.
    let mallory = app.operator_token("mallory", "payments:confirm");
    let (status, _) = operator(&app, reqwest::Method::GET, &path, &mallory, None).await;
    assert_eq!(status, 404);
    assert_eq!(post(mallory, "approve").await.0, 404);
    assert_eq!(balance_of(&app, "acct-B").await, before, "nothing moved");

    // The user, signed in themselves for the operator resource: sees the whole intent, confirms alone.
    let confirm_token = app.operator_token("pat", "payments:confirm");
    let (status, body) = operator(&app, reqwest::Method::GET, &path, &confirm_token, None).await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["approver"], "user");
    assert_eq!(body["amount"], "5000.00");
    assert_eq!((body["agent_subject"].as_str(), body["user"].as_str()), (Some("dev-agent"), Some("pat")));
    let (status, body) = post(confirm_token.clone(), "approve").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["status"], "approved");
    assert_eq!(body["approved_by"], json!(["pat"]));

    let paid = completed(once(&conn, retry("create_payment", &args, &state, "accept")).await);
    assert_eq!(ok(&paid)["replayed"], false);
    let again = completed(once(&conn, retry("create_payment", &args, &state, "accept")).await);
    assert_eq!(ok(&again)["payment_id"], ok(&paid)["payment_id"]);
    assert_eq!(balance_of(&app, "acct-B").await - before, 500_000, "paid once");

    // Over the tier: an operator's page, and the user's confirmation is refused.
    let big = input_required(once(&conn, params("create_payment", &ask("over-tier", "20000.00"))).await);
    let (url, big_apr) = page(&big);
    assert_eq!(url, format!("{}/console#approvals/{big_apr}", app.base()));
    let (status, body) = operator(
        &app,
        reqwest::Method::POST,
        &format!("/operator/v1/confirmations/{big_apr}/approve"),
        &confirm_token,
        Some(json!({})),
    )
    .await;
    assert_eq!(status, 403, "{body}");
    assert_eq!(body["error"]["code"], "NOT_USER_APPROVABLE");
    let audit = app.audit("pat").await;
    assert!(audit.iter().any(|r| r.decision == "recorded" && r.tool == "approvals.user_confirm"), "audited");
    conn.cancel().await.unwrap();
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
}
