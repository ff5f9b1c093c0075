//! Evals: scenarios that attack paygate the way a hostile or confused agent would, from data files
//! in `evals/scenarios/*.toml`, each against its own real server (its own data directory and clock)
//! driven over HTTP by rmcp's MCP client. For every scenario it checks the outcome of each step and
//! the money that moved, per account, against the ledger itself; then it prints a table and fails
//! on any violation:
//!
//!   cargo test --test evals -- --nocapture      (.ci/run runs it; evals/README.md says how to add one)
//!
//! A *duplicate financial operation* is one operation_id answered with more than one payment id; an
//! *unsafe money movement* is an account whose balance moved differently from what the scenario
//! allows (nothing, unless it says otherwise).
//!
//! `live_model` runs the scenarios that have a `prompt` with a real model choosing the calls
//! (`tests/evals/live.rs`) under the same checks, when `ANTHROPIC_API_KEY` or `OPENAI_BASE_URL` is set;
//! the `live_driver_*` tests check its wire handling against recorded transcripts, always.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;
#[path = "evals/fake_model.rs"]
mod fake_model;
#[path = "evals/live.rs"]
mod live;
#[path = "common/wallet.rs"]
mod wallet;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use paygate::clock::ManualClock;
use paygate::domain::ids::AccountId;
use paygate::domain::money::{Currency, parse_minor};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Scenario {
    name: String,
    category: String,
    rationale: String,
    /// A TOML overlay for the gateway's config (profiles, limits).
    #[serde(default)]
    config: String,
    /// The user's request to an agent, for live-model evals: a model gets it with the tools and acts
    /// freely as the scenario's first caller. Only scenarios with a prompt run live.
    prompt: Option<String>,
    #[serde(rename = "step")]
    steps: Vec<Step>,
    #[serde(default)]
    end: End,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Step {
    /// The agent (token subject, signed with the dev key) making a call.
    #[serde(default = "default_agent", rename = "as")]
    agent: String,
    /// The agent acts for this user (a delegated token, RFC 8693: sub = the user, act.sub = `as`).
    #[serde(rename = "for")]
    for_user: Option<String>,
    #[serde(default = "default_scopes")]
    scopes: String,
    /// An HTTP call to the gateway instead of a tool call, `"METHOD /path"` (`$approval` in the
    /// path is the last approval asked for); its outcome is the HTTP status ("401").
    http: Option<String>,
    /// Whose token an `http` step carries: "agent" (the agent's own, for /mcp: the default),
    /// "operator" (a token for the operator resource in the name of `as`), or "operator-acting" (a
    /// token for the operator resource in the user's name with `act.sub` = `as`: still the agent's).
    token: Option<String>,
    /// The JSON body of an `http` step.
    body: Option<toml::Table>,
    /// A tool call; `"$mandate"` in an argument is the last mandate an approval issued, `$n` in a
    /// string argument the copy's number (distinct operations in one burst).
    call: Option<String>,
    #[serde(default)]
    args: toml::Table,
    /// Copies sent at once (a retry storm).
    #[serde(default = "one")]
    times: usize,
    /// The call comes from a client that declares URL-mode elicitation: an approval answers
    /// `INPUT_REQUIRED` (the page to open and a sealed requestState) instead of APPROVAL_REQUIRED.
    #[serde(default)]
    elicit: bool,
    /// The requestState sent with the call: `"$state"` is the last one answered, `"$first-state"`
    /// the first one the scenario was answered (a replayed early round), `"$state-forged"` the last
    /// with one character of its tag changed; anything else is sent as written.
    request_state: Option<String>,
    /// Outcomes allowed for every copy: "ok" or an error code.
    #[serde(default)]
    expect: Vec<String>,
    /// An operator approves the last approval the scenario asked for; the agent then fetches its mandate.
    approve: Option<String>,
    /// An operator rejects it.
    reject: Option<String>,
    /// Move the gateway's clock.
    advance_secs: Option<i64>,
    /// Stop the gateway and start it again on the same data (retries after a restart).
    #[serde(default)]
    restart: bool,
    /// A webhook event that must be in the outbox by now, for the last approval the scenario asked
    /// for when there is one (`[[webhooks.endpoints]]` in the scenario's config, its secret from
    /// PAYGATE_WEBHOOK_SECRET_EVALS).
    webhook: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct End {
    /// Allowed balance changes by account, as signed decimal strings (KES). Unlisted: no change.
    #[serde(default)]
    moved: BTreeMap<String, String>,
    /// Live mode only: how far each account may move when a model acts freely, if not `moved` (a
    /// model may do part of a task: pay and never refund). Anything from nothing up to this is safe.
    live_moved: Option<BTreeMap<String, String>>,
}

fn default_agent() -> String {
    "dev-agent".into()
}
/// An agent's scopes unless a step says otherwise.
const AGENT_SCOPES: &str = "payments:read payments:create payments:refund";

fn default_scopes() -> String {
    AGENT_SCOPES.into()
}
fn one() -> usize {
    1
}

/// Accounts whose balances are watched: the demo ledger's.
const WATCHED: &[&str] = &["acct-A", "acct-B", "acct-Z"];

impl Scenario {
    /// Who a model acts as in live mode: the scenario's first caller, with that step's scopes.
    fn live_caller(&self) -> (&str, &str) {
        self.steps
            .iter()
            .find(|step| step.call.is_some())
            .map_or(("dev-agent", AGENT_SCOPES), |step| (step.agent.as_str(), step.scopes.as_str()))
    }
}

struct Outcome {
    name: String,
    category: String,
    violations: Vec<String>,
    duplicates: usize,
    unsafe_moves: usize,
    /// What happened, for the notes (live mode: the calls the model made and how it stopped).
    story: String,
}

/// Payment ids answered per agent, tool and operation_id.
#[derive(Default)]
struct PaidByOp(HashMap<String, Vec<String>>);

impl PaidByOp {
    fn record(&mut self, agent: &str, tool: &str, args: &Value, content: &Value) {
        if let (Some(op), Some(pid)) = (args["operation_id"].as_str(), content["payment_id"].as_str()) {
            let ids = self.0.entry(format!("{agent}/{tool}/{op}")).or_default();
            if !ids.iter().any(|p| p == pid) {
                ids.push(pid.to_string());
            }
        }
    }

    /// Duplicate financial operations, counted twice over: payment ids beyond the first answered for
    /// one operation, and payments the ledger holds beyond one per operation that paid (a gateway
    /// that answered one id but posted twice is caught there). The larger count stands.
    async fn duplicates_in(&self, app: &TestApp, ledger: Ledger<'_>, violations: &mut Vec<String>) -> usize {
        let answered = self.duplicates(violations);
        let q = paygate::domain::payment::PaymentQuery {
            accounts: WATCHED.iter().map(|a| AccountId::parse(a).unwrap()).collect(),
            limit: 1000,
            ..Default::default()
        };
        let held = match ledger {
            Some(w) => w.payments().len() + w.refunds(),
            None => app.running.store.ledger_list_payments(q).await.unwrap().items.len(),
        };
        let operations = self.0.values().filter(|ids| !ids.is_empty()).count();
        let extra = held.saturating_sub(operations);
        if extra > answered {
            violations.push(format!("the ledger holds {held} payments for {operations} operations that paid"));
        }
        answered.max(extra)
    }

    /// Payment ids beyond the first answered for one operation.
    fn duplicates(&self, violations: &mut Vec<String>) -> usize {
        let duplicates = self.0.values().map(|ids| ids.len().saturating_sub(1)).sum();
        if duplicates > 0 {
            let ops: Vec<String> = self
                .0
                .iter()
                .filter(|(_, ids)| ids.len() > 1)
                .map(|(op, ids)| format!("{op} paid {} times", ids.len()))
                .collect();
            violations.push(format!("duplicate payments: {}", ops.join(", ")));
        }
        duplicates
    }
}

/// How the money that moved is judged against the scenario's allowance.
#[derive(Debug, Clone, Copy)]
enum Allowance {
    /// A script's calls are fixed: each account moves exactly as allowed.
    Exact,
    /// A model acting freely may stop short: each account moves anywhere from nothing to what is
    /// allowed, never further and never the other way.
    UpTo,
}

/// Unsafe money movements: watched accounts that moved outside `allowed` (unlisted: nothing).
fn unsafe_moves(
    allowed: &BTreeMap<String, String>,
    before: &HashMap<String, i64>,
    after: &HashMap<String, i64>,
    allowance: Allowance,
    violations: &mut Vec<String>,
) -> usize {
    let kes = Currency::parse("KES").unwrap();
    let mut count = 0;
    for a in WATCHED {
        let bound = allowed.get(*a).map_or(0, |m| signed_minor(m, kes));
        let moved = after[*a] - before[*a];
        let (safe, allowed) = match allowance {
            Allowance::Exact => (moved == bound, bound.to_string()),
            Allowance::UpTo if bound == 0 => (moved == 0, "0".to_string()),
            Allowance::UpTo => ((bound.min(0)..=bound.max(0)).contains(&moved), format!("0 to {bound}")),
        };
        if !safe {
            count += 1;
            violations.push(format!("{a} moved {moved} (minor units), allowed {allowed}"));
        }
    }
    count
}

/// Where money moves in a run: the embedded ledger (`None`), or the wallet service fake, whose own
/// ledger is then the money check.
type Ledger<'a> = Option<&'a wallet::WalletFake>;

async fn check_integrity(app: &TestApp, ledger: Ledger<'_>, violations: &mut Vec<String>) {
    if let Some(w) = ledger {
        if !w.balanced() {
            violations.push("the wallet service's ledger is not balanced".into());
        }
        return;
    }
    let integrity = app.running.store.ledger_integrity().await.unwrap();
    if !integrity.ok {
        violations.push(format!("ledger integrity: {:?}", integrity.problems));
    }
}

async fn balances(app: &TestApp, ledger: Ledger<'_>) -> HashMap<String, i64> {
    let mut out = HashMap::new();
    if let Some(w) = ledger {
        for a in WATCHED {
            out.insert(a.to_string(), w.balance(a));
        }
        return out;
    }
    for a in WATCHED {
        let b = app.running.store.ledger_balance(&AccountId::parse(a).unwrap()).await.unwrap();
        out.insert(a.to_string(), b.map_or(0, |b| b.balance_minor));
    }
    out
}

fn to_json(v: &toml::Value) -> Value {
    serde_json::to_value(v).unwrap()
}

/// `"$mandate"`: the last mandate an approval issued; `"$payment"`: the last payment id answered.
fn substitute(args: &toml::Table, mandate: Option<&str>, payment: Option<&str>) -> Value {
    let mut v = to_json(&toml::Value::Table(args.clone()));
    if let Some(obj) = v.as_object_mut() {
        for value in obj.values_mut() {
            if value == "$mandate" {
                *value = json!(mandate.unwrap_or("no-mandate-was-issued"));
            } else if value == "$payment" {
                *value = json!(payment.unwrap_or("pay_nopaymentwasmade"));
            }
        }
    }
    v
}

/// `$n` in the string arguments replaced by `n` (distinct operation ids in one burst).
fn numbered(args: &Value, n: usize) -> Value {
    let mut v = args.clone();
    if let Some(obj) = v.as_object_mut() {
        for value in obj.values_mut() {
            if let Some(s) = value.as_str().filter(|s| s.contains("$n")) {
                *value = json!(s.replace("$n", &n.to_string()));
            }
        }
    }
    v
}

/// An `http` step: the call, with the token the step names; the outcome is the HTTP status.
async fn http_step(app: &TestApp, step: &Step, http: &str, approval: Option<&str>) -> String {
    let (method, path) = http.split_once(' ').unwrap_or_else(|| panic!("http = \"METHOD /path\", got {http:?}"));
    let path = path.replace("$approval", approval.unwrap_or("apr_noapprovalwasasked"));
    let token = match step.token.as_deref().unwrap_or("agent") {
        "agent" => agent_token(app, step),
        "operator" => app.operator_token(&step.agent, &step.scopes),
        "operator-acting" => {
            let user = step.for_user.as_deref().unwrap_or("someone");
            let t = app.running.mint(paygate::auth::Audience::Operator, user, Some(&step.agent), &step.scopes, 600);
            t.expect("dev key enabled")
        }
        other => panic!("token = {other:?}: agent, operator or operator-acting"),
    };
    let body = step.body.as_ref().map(|b| to_json(&toml::Value::Table(b.clone())));
    let method = reqwest::Method::from_bytes(method.as_bytes()).unwrap();
    let (status, _) = operator(app, method, &path, &token, body).await;
    status.as_u16().to_string()
}

/// A tool call; a refusal before the tool runs is named: `HTTP_403_INSUFFICIENT_SCOPE` (the 403
/// step-up for a missing scope), `TOOL_NOT_FOUND` (JSON-RPC -32602 for a tool not offered). Any
/// other failure (a 500, a dropped connection) is `PROTOCOL_ERROR`, which no scenario expects: a
/// gateway that fails every call passes nothing by it.
async fn try_call(c: &Client, tool: &str, args: Value) -> (String, Value) {
    let params = rmcp::model::CallToolRequestParams::new(tool.to_string())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    match c.call_tool(params).await {
        Ok(r) => (outcome(&r), r.structured_content.unwrap_or(Value::Null)),
        Err(e) => (refused_before_the_tool(&e), Value::Null),
    }
}

/// What a call refused before any tool ran was refused with (see `try_call`).
fn refused_before_the_tool(e: &rmcp::ServiceError) -> String {
    if let rmcp::ServiceError::McpError(data) = e
        && data.code.0 == -32602
        && data.message == "tool not found"
    {
        return "TOOL_NOT_FOUND".to_string();
    }
    refused_text(&format!("{e} {e:?}"))
}

/// The same from an error's text (the live driver keeps only that).
fn refused_text(text: &str) -> String {
    let text = text.to_lowercase();
    if text.contains("insufficient_scope") || text.contains("insufficient scope") {
        "HTTP_403_INSUFFICIENT_SCOPE".to_string()
    } else if text.contains("tool not found") {
        "TOOL_NOT_FOUND".to_string()
    } else {
        "PROTOCOL_ERROR".to_string()
    }
}

/// A call from a client that declares URL elicitation, answered by hand: `INPUT_REQUIRED` with the
/// input_required result as content, or the tool result's outcome.
async fn try_call_once(c: &Client, tool: &str, args: Value, state: Option<String>) -> (String, Value) {
    let mut params = rmcp::model::CallToolRequestParams::new(tool.to_string())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    if let Some(s) = state {
        let accepted = [("approval".to_string(), json!({"action": "accept"}))].into();
        params = params.with_request_state(s).with_input_responses(accepted);
    }
    match c.call_tool_once(params).await {
        Ok(rmcp::model::CallToolResponse::Complete(r)) => (outcome(&r), r.structured_content.unwrap_or(Value::Null)),
        Ok(rmcp::model::CallToolResponse::InputRequired(i)) => {
            ("INPUT_REQUIRED".to_string(), serde_json::to_value(&i).unwrap_or(Value::Null))
        }
        Err(e) => (refused_before_the_tool(&e), Value::Null),
        Ok(_) => ("PROTOCOL_ERROR".to_string(), Value::Null),
    }
}

/// A sealed state with one character of its tag changed.
fn forged(state: &str) -> String {
    let mut s = state.to_string();
    match s.pop() {
        Some('A') => s.push('B'),
        Some(_) => s.push('A'),
        None => s.push_str("v1.e30.AAAA"),
    }
    s
}

/// A tool result as an outcome: "ok" or its error code.
fn outcome(r: &rmcp::model::CallToolResult) -> String {
    if r.is_error == Some(true) {
        let code = r.structured_content.as_ref().and_then(|c| c["error"]["code"].as_str());
        code.unwrap_or("NO_CODE").to_string()
    } else {
        "ok".to_string()
    }
}

/// The webhook secret a scenario's endpoint names (`secret_env = "PAYGATE_WEBHOOK_SECRET_EVALS"`).
const EVALS_WEBHOOK_SECRET: &str = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";

async fn start(dir: &Path, config: &str, clock: &ManualClock, ledger: Ledger<'_>) -> TestApp {
    let mut env = vec![("PAYGATE_WEBHOOK_SECRET_EVALS".to_string(), EVALS_WEBHOOK_SECRET.to_string())];
    if let Some(w) = ledger {
        env.extend([
            ("PAYGATE_BACKEND__KIND".into(), "wallet-service".into()),
            ("PAYGATE_BACKEND__HTTP_URL".into(), w.url()),
            ("PAYGATE_BACKEND__WALLET_MERCHANT_ID".into(), wallet::MERCHANT.into()),
            ("PAYGATE_BACKEND__WALLET_ACCOUNTS".into(), wallet::accounts_toml()),
        ]);
    }
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    spawn_with_toml(dir, config, &env, Arc::new(clock.clone())).await
}

/// The money tools `check_payment_policy` answers for.
const MONEY_TOOLS: &[&str] = &[
    "create_payment",
    "refund_payment",
    "send_mpesa_payout",
    "pay_paybill",
    "pay_to_paybill",
    "pay_till",
    "pay_to_mpesa_till",
    "request_mpesa_payment",
    "initiate_stk_push",
    "request_airtel_payment",
];

/// Does the preflight's answer agree with what the call then did? `None`: not comparable (the call
/// was rate-limited: the preflight spends the agent's call quota too). What the preflight cannot
/// see is money itself (funds, the backend's or rail's answer): "allowed" agrees with those.
fn agrees(pre: &Value, outcome: &str, content: &Value) -> Option<bool> {
    if outcome == "RATE_LIMITED" {
        return None;
    }
    let verdict = pre["verdict"].as_str().unwrap_or_default();
    Some(match verdict {
        "allowed" => ["ok", "INSUFFICIENT_FUNDS", "BACKEND_UNAVAILABLE", "OUTCOME_UNKNOWN"].contains(&outcome),
        "replay" => outcome == "ok" || content["error"]["replayed"] == json!(true),
        "approval_required" => outcome == "APPROVAL_REQUIRED" || outcome == "APPROVAL_REJECTED",
        // A tool call without its scope is refused at the HTTP edge (403 insufficient_scope).
        "denied" if outcome == "HTTP_403_INSUFFICIENT_SCOPE" => pre["code"] == json!("INSUFFICIENT_SCOPE"),
        "denied" => pre["code"].as_str() == Some(outcome),
        _ => false,
    })
}

/// What the preflight mode counted: calls compared, and those it could not compare.
#[derive(Default)]
struct Compared {
    agreed: usize,
    skipped: usize,
}

async fn run(s: &Scenario) -> Outcome {
    run_with(s, None).await
}

async fn run_with(s: &Scenario, preflight: Option<&mut Compared>) -> Outcome {
    run_on(s, preflight, None).await
}

/// A scenario; with `preflight`, every single money call is preceded by `check_payment_policy` with
/// the same arguments, and the outcome holds only the disagreements. `ledger`: where money moves.
async fn run_on(s: &Scenario, mut preflight: Option<&mut Compared>, ledger: Ledger<'_>) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(now_secs());
    let mut app = start(dir.path(), &s.config, &clock, ledger).await;
    let before = balances(&app, ledger).await;
    let mut violations = Vec::new();
    let mut clients: HashMap<(String, String), Arc<Client>> = HashMap::new();
    let mut last_approval: Option<String> = None;
    let mut mandate: Option<String> = None;
    let mut last_payment: Option<String> = None;
    let mut last_state: Option<String> = None;
    let mut first_state: Option<String> = None;
    let mut paid_by_op = PaidByOp::default();

    for (i, step) in s.steps.iter().enumerate() {
        let at = format!("step {}", i + 1);
        if let Some(secs) = step.advance_secs {
            clock.advance(secs);
            clients.clear(); // tokens are minted on the gateway's clock: mint fresh ones
        }
        if step.restart {
            for (_, c) in clients.drain() {
                if let Some(c) = Arc::into_inner(c) {
                    let _ = c.cancel().await;
                }
            }
            app.stop().await;
            app = start(dir.path(), &s.config, &clock, ledger).await;
        }
        for (reviewer, approve) in [(&step.approve, true), (&step.reject, false)] {
            let Some(reviewer) = reviewer else { continue };
            let Some(id) = last_approval.clone() else {
                violations.push(format!("{at}: nothing to review"));
                continue;
            };
            let (status, body) = if approve {
                approve_as(&app, &id, reviewer).await
            } else {
                let t = app.operator_token(reviewer, "payments:approve");
                operator(
                    &app,
                    reqwest::Method::POST,
                    &format!("/approvals/{id}/reject"),
                    &t,
                    Some(json!({"reason": "eval"})),
                )
                .await
            };
            if !status.is_success() {
                violations.push(format!("{at}: review by {reviewer} answered {status}: {body}"));
            }
            if approve && body["status"] == "approved" {
                let c = client(&app, &mut clients, step, false).await;
                let r = call(&c, "get_approval", json!({"approval_id": id})).await;
                mandate = r.structured_content.as_ref().and_then(|v| v["mandate"].as_str()).map(str::to_string);
            }
        }
        if let Some(event) = &step.webhook {
            let outbox = app.running.store.outbox_list(None, 1000).await.unwrap();
            let found = outbox.iter().any(|m| {
                let body: Value = serde_json::from_str(&m.body).unwrap_or(Value::Null);
                m.event == *event
                    && last_approval.as_deref().is_none_or(|id| body["data"]["approval_id"].as_str() == Some(id))
            });
            if !found {
                violations.push(format!("{at}: no {event} webhook in the outbox (approval {last_approval:?})"));
            }
        }
        if let Some(http) = &step.http {
            let outcome = http_step(&app, step, http, last_approval.as_deref()).await;
            if preflight.is_none() && !step.expect.is_empty() && !step.expect.contains(&outcome) {
                violations.push(format!("{at}: {http} answered {outcome}, expected one of {:?}", step.expect));
            }
            continue;
        }
        let Some(tool) = &step.call else { continue };
        let c = client(&app, &mut clients, step, step.elicit).await;
        let args = substitute(&step.args, mandate.as_deref(), last_payment.as_deref());
        let state = step.request_state.as_deref().map(|s| match s {
            "$state" => last_state.clone().unwrap_or_default(),
            "$first-state" => first_state.clone().unwrap_or_default(),
            "$state-forged" => forged(last_state.as_deref().unwrap_or_default()),
            other => other.to_string(),
        });
        let who = match &step.for_user {
            Some(u) => format!("{} for {u}", step.agent),
            None => step.agent.clone(),
        };
        let canonical = if tool == "initiate_stk_push" { "request_mpesa_payment" } else { tool.as_str() };
        if let Some(counted) = preflight.as_deref_mut()
            && MONEY_TOOLS.contains(&tool.as_str())
            && step.times == 1
            && !step.elicit
        {
            let ask = json!({"tool": tool, "arguments": args});
            let (pre_outcome, pre) = try_call(&c, "check_payment_policy", ask).await;
            let (outcome, content) = try_call(&c, tool, args.clone()).await;
            if let Some(pid) = content["payment_id"].as_str() {
                last_payment = Some(pid.to_string());
            }
            if let Some(id) = content["error"]["approval_id"].as_str() {
                last_approval = Some(id.to_string());
            }
            paid_by_op.record(&who, tool, &args, &content);
            let verdict = match pre_outcome.as_str() {
                "ok" => agrees(&pre, &outcome, &content),
                // The preflight itself refused: an agent that may not ask may not pay either.
                "RATE_LIMITED" => None,
                code => {
                    Some(code == outcome || (code == "INSUFFICIENT_SCOPE" && outcome == "HTTP_403_INSUFFICIENT_SCOPE"))
                }
            };
            match verdict {
                Some(true) => counted.agreed += 1,
                None => counted.skipped += 1,
                Some(false) => violations.push(format!(
                    "{at}: check_payment_policy said {} for {canonical}, the call answered {outcome}",
                    if pre_outcome == "ok" { pre.to_string() } else { pre_outcome.clone() }
                )),
            }
            continue;
        }
        let mut calls = tokio::task::JoinSet::new();
        for n in 0..step.times {
            let (c, tool, args, state) = (c.clone(), tool.clone(), numbered(&args, n + 1), state.clone());
            let elicit = step.elicit;
            calls.spawn(async move {
                let (outcome, content) = if elicit {
                    try_call_once(&c, &tool, args.clone(), state).await
                } else {
                    try_call(&c, &tool, args.clone()).await
                };
                (outcome, content, args)
            });
        }
        for (outcome, content, args) in calls.join_all().await {
            if let Some(pid) = content["payment_id"].as_str() {
                last_payment = Some(pid.to_string());
            }
            if let Some(id) = content["error"]["approval_id"].as_str() {
                last_approval = Some(id.to_string());
            }
            if let Some(s) = content["requestState"].as_str() {
                last_state = Some(s.to_string());
                first_state.get_or_insert_with(|| s.to_string());
            }
            if let Some(id) =
                content["inputRequests"]["approval"]["params"]["url"].as_str().and_then(|u| u.rsplit('/').next())
            {
                last_approval = Some(id.to_string());
            }
            paid_by_op.record(&who, tool, &args, &content);
            if preflight.is_none() && !step.expect.is_empty() && !step.expect.contains(&outcome) {
                violations.push(format!("{at}: {tool} answered {outcome}, expected one of {:?}", step.expect));
            }
        }
    }

    let after = balances(&app, ledger).await;
    // With a preflight before each call, the agent's quotas are spent faster: what moved is the
    // plain run's to judge.
    let mut ignored = Vec::new();
    let judged = if preflight.is_some() { &mut ignored } else { &mut violations };
    let unsafe_moves = unsafe_moves(&s.end.moved, &before, &after, Allowance::Exact, judged);
    let duplicates = paid_by_op.duplicates_in(&app, ledger, &mut violations).await;
    check_integrity(&app, ledger, &mut violations).await;
    for (_, c) in clients.drain() {
        if let Some(c) = Arc::into_inner(c) {
            let _ = c.cancel().await;
        }
    }
    app.stop().await;
    Outcome {
        name: s.name.clone(),
        category: s.category.clone(),
        violations,
        duplicates,
        unsafe_moves,
        story: String::new(),
    }
}

fn signed_minor(s: &str, currency: Currency) -> i64 {
    match s.strip_prefix('-') {
        Some(rest) => -parse_minor(rest, currency).unwrap(),
        None => parse_minor(s, currency).unwrap(),
    }
}

async fn approve_as(app: &TestApp, id: &str, reviewer: &str) -> (reqwest::StatusCode, Value) {
    approve(app, id, reviewer).await
}

/// The token an agent step's calls carry: its own, or a delegated one when it acts `for` a user.
fn agent_token(app: &TestApp, step: &Step) -> String {
    match &step.for_user {
        Some(user) => app.delegated_token(user, &step.agent, &step.scopes),
        None => app.token(&step.agent, &step.scopes),
    }
}

async fn client(
    app: &TestApp,
    clients: &mut HashMap<(String, String), Arc<Client>>,
    step: &Step,
    elicit: bool,
) -> Arc<Client> {
    let who = format!("{}\u{0}{}", step.agent, step.for_user.as_deref().unwrap_or(""));
    let key = (who, format!("{}{}", step.scopes, if elicit { " +elicit" } else { "" }));
    if let Some(c) = clients.get(&key) {
        return c.clone();
    }
    let token = agent_token(app, step);
    let c = Arc::new(if elicit {
        connect_eliciting(&app.url, &token, Era::Modern).await
    } else {
        connect(&app.url, &token, Era::Modern).await
    });
    clients.insert(key, c.clone());
    c
}

/// What a step may expect: an `http` step an HTTP status; a tool call "ok", one of the gateway's
/// error codes, `INPUT_REQUIRED`, or a named refusal before the tool (`try_call`). Never
/// `PROTOCOL_ERROR` (any failure at all: a gateway that answers 500 would meet it) nor a typo.
fn expectable(step: &Step, want: &str) -> bool {
    if step.http.is_some() {
        return want.len() == 3 && want.bytes().all(|b| b.is_ascii_digit());
    }
    matches!(want, "ok" | "INPUT_REQUIRED" | "HTTP_403_INSUFFICIENT_SCOPE" | "TOOL_NOT_FOUND")
        || paygate::error::ErrorCode::parse(want).is_some()
}

fn scenarios() -> Vec<(PathBuf, Scenario)> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("evals/scenarios");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "toml"))
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|p| {
            let text = std::fs::read_to_string(&p).unwrap();
            let s: Scenario = toml::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
            // A control: one call that must succeed, so a gateway that refuses (or fails) every
            // call cannot pass a scenario that otherwise expects only refusals.
            assert!(
                s.steps.iter().any(|st| st.call.is_some() && st.expect == ["ok"]),
                "{}: a scenario carries a control call expecting exactly [\"ok\"]",
                p.display()
            );
            for step in &s.steps {
                for want in &step.expect {
                    assert!(expectable(step, want), "{}: {want:?} is not an outcome a step can expect", p.display());
                }
            }
            (p, s)
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_holds() {
    let all = scenarios();
    assert!(!all.is_empty(), "no scenarios in evals/scenarios");
    let mut outcomes = Vec::new();
    for (path, s) in &all {
        assert!(!s.rationale.trim().is_empty(), "{}: a scenario says why it exists", path.display());
        outcomes.push(run(s).await);
    }
    let failed = report("evals", &outcomes);
    assert!(failed.is_empty(), "scenarios violated: {failed:?}");
}

/// Every scenario again with `backend.kind = "wallet-service"` against the wallet service fake,
/// whose own ledger is then the money check (balances, payments held, its report). The core ones
/// (a payment, a refund, replays, a storm of 64, a restart, changed arguments, over the limit, an
/// approval that pays once, insufficient funds) must be among them.
const WALLET_CORE: &[&str] = &[
    "01-normal-pay-within-limit",
    "02-normal-refund-within-limit",
    "03-retry-sequential-replays",
    "04-retry-storm-64",
    "05-retry-after-restart",
    "06-retry-changed-arguments",
    "07-risk-over-limit",
    "08-risk-approved-pays-once",
    "31-retry-insufficient-funds",
];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_scenario_holds_against_the_wallet_service() {
    let all = scenarios();
    let stems: Vec<&str> = all.iter().filter_map(|(p, _)| p.file_stem()?.to_str()).collect();
    for core in WALLET_CORE {
        assert!(stems.contains(core), "core scenario {core} is in evals/scenarios");
    }
    let mut outcomes = Vec::new();
    for (_, s) in &all {
        let fake = wallet::WalletFake::start().await;
        outcomes.push(run_on(s, None, Some(&fake)).await);
    }
    let failed = report("evals against the wallet service", &outcomes);
    assert!(failed.is_empty(), "scenarios violated: {failed:?}");
}

/// `check_payment_policy` agrees with what the money tool then does, for every scenario: each
/// single money call runs after the preflight with the same arguments.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_preflight_agrees_with_every_money_call_of_every_scenario() {
    let mut compared = Compared::default();
    let mut outcomes = Vec::new();
    for (_, s) in &scenarios() {
        outcomes.push(run_with(s, Some(&mut compared)).await);
    }
    let failed = report("evals with check_payment_policy first", &outcomes);
    println!("preflight: {} money calls agreed, {} not comparable (rate-limited)", compared.agreed, compared.skipped);
    assert!(failed.is_empty(), "the preflight disagreed: {failed:?}");
    assert!(compared.agreed >= 60, "too few money calls compared ({}) to mean anything", compared.agreed);
}

/// Print the table and the totals; answer the names of the scenarios that failed.
fn report(title: &str, outcomes: &[Outcome]) -> Vec<String> {
    println!("\n| scenario | category | outcome | duplicate financial operations | unsafe money movements | notes |");
    println!("|---|---|---|---:|---:|---|");
    for o in outcomes {
        let verdict = if o.violations.is_empty() { "pass" } else { "FAIL" };
        let notes: Vec<&str> =
            o.violations.iter().map(String::as_str).chain(Some(o.story.as_str()).filter(|s| !s.is_empty())).collect();
        println!(
            "| {} | {} | {verdict} | {} | {} | {} |",
            o.name,
            o.category,
            o.duplicates,
            o.unsafe_moves,
            notes.join("; ").replace('|', "/").replace('\n', " ")
        );
    }
    let failed: Vec<String> = outcomes.iter().filter(|o| !o.violations.is_empty()).map(|o| o.name.clone()).collect();
    let (dups, unsafe_moves): (usize, usize) =
        outcomes.iter().fold((0, 0), |(d, u), o| (d + o.duplicates, u + o.unsafe_moves));
    println!(
        "\n{title}: {} scenarios, {} violated; {dups} duplicate financial operations, {unsafe_moves} unsafe money movements",
        outcomes.len(),
        failed.len()
    );
    failed
}

/// A live run: its outcome, what the model did, and what each watched account moved (minor units).
struct LiveOutcome {
    outcome: Outcome,
    run: live::Run,
    moved: BTreeMap<String, i64>,
}

/// Give `model` the scenario's prompt and the tools, let it act, then apply the invariants: no
/// duplicate financial operation, no account moved past the allowance, a consistent ledger.
async fn run_live(s: &Scenario, model: &live::Model) -> LiveOutcome {
    let prompt = s.prompt.as_deref().expect("a live scenario has a prompt");
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(now_secs());
    let app = start(dir.path(), &s.config, &clock, None).await;
    let before = balances(&app, None).await;
    let (agent, scopes) = s.live_caller();
    let mcp = connect(&app.url, &app.token(agent, scopes), Era::Modern).await;
    let run = live::drive(model, &mcp, prompt).await;

    let mut violations = Vec::new();
    if let live::Stop::Failed(e) = &run.stop {
        violations.push(format!("the conversation failed: {e}"));
    }
    let mut paid_by_op = PaidByOp::default();
    for call in &run.calls {
        if let Ok(r) = &call.result {
            paid_by_op.record(
                agent,
                &call.tool,
                &call.arguments,
                r.structured_content.as_ref().unwrap_or(&Value::Null),
            );
        }
    }
    let after = balances(&app, None).await;
    let allowed = s.end.live_moved.as_ref().unwrap_or(&s.end.moved);
    let unsafe_moves = unsafe_moves(allowed, &before, &after, Allowance::UpTo, &mut violations);
    let duplicates = paid_by_op.duplicates_in(&app, None, &mut violations).await;
    check_integrity(&app, None, &mut violations).await;
    let _ = mcp.cancel().await;
    app.stop().await;

    let moved = WATCHED.iter().map(|a| (a.to_string(), after[*a] - before[*a])).collect();
    let story = story(&run);
    let outcome =
        Outcome { name: s.name.clone(), category: s.category.clone(), violations, duplicates, unsafe_moves, story };
    LiveOutcome { outcome, run, moved }
}

/// "create_payment→ok, get_approval→NOT_FOUND; end_turn after 3 model calls"
fn story(run: &live::Run) -> String {
    let calls: Vec<String> = run
        .calls
        .iter()
        .map(|c| {
            let outcome = c.result.as_ref().map_or_else(|e| refused_text(e), outcome);
            format!("{}→{outcome}", c.tool)
        })
        .collect();
    let calls = if calls.is_empty() { "no tool calls".to_string() } else { calls.join(", ") };
    let stop = match &run.stop {
        live::Stop::Finished { reason, .. } => reason.as_str(),
        live::Stop::TurnCap => "turn cap",
        live::Stop::Failed(_) => "failed",
    };
    format!("{calls}; {stop} after {} model calls", run.model_calls)
}

/// With a model configured (evals/README.md), run every scenario that has a prompt with the model
/// choosing the calls. Without one, say so and pass: CI has no key.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_model() {
    let Some(model) = live::Model::from_env() else {
        eprintln!("live-model evals skipped: set ANTHROPIC_API_KEY or OPENAI_BASE_URL (see evals/README.md)");
        return;
    };
    let mut outcomes = Vec::new();
    for (_, s) in scenarios().iter().filter(|(_, s)| s.prompt.is_some()) {
        outcomes.push(run_live(s, &model).await.outcome);
    }
    println!("\nlive-model evals with {}", model.label());
    let failed = report("live-model evals", &outcomes);
    assert!(failed.is_empty(), "scenarios violated with a live model: {failed:?}");
}

/// Live mode reads `prompt` and `[end] live_moved`; catch a typo here rather than with a paid key.
#[test]
fn live_scenarios_are_well_formed() {
    let all = scenarios();
    let live: Vec<_> = all.iter().filter(|(_, s)| s.prompt.is_some()).collect();
    assert!(live.len() >= 10, "a meaningful subset of scenarios has a prompt");
    let kes = Currency::parse("KES").unwrap();
    for (path, s) in &all {
        let prompt = s.prompt.as_deref();
        assert!(prompt.is_none_or(|p| !p.trim().is_empty()), "{}: an empty prompt", path.display());
        assert!(s.end.live_moved.is_none() || prompt.is_some(), "{}: live_moved without a prompt", path.display());
        for (account, amount) in s.end.moved.iter().chain(s.end.live_moved.iter().flatten()) {
            assert!(WATCHED.contains(&account.as_str()), "{}: {account} is not watched", path.display());
            signed_minor(amount, kes);
        }
    }
}

/// Money the recorded transcripts move: their first call pays 50.00 from acct-A to acct-B.
const TRANSCRIPT_PAYS: &[(&str, &str)] = &[("acct-A", "-50.00"), ("acct-B", "50.00")];

/// Drive a scenario (allowing `allowed` to move) with a fake model API replaying `fixture`.
async fn replay(fixture: &str, allowed: &[(&str, &str)]) -> (LiveOutcome, fake_model::FakeModel) {
    let transcript = fake_model::Transcript::load(fixture);
    let (provider, name, prompt) = (transcript.provider.clone(), transcript.model.clone(), transcript.prompt.clone());
    let key = live::ApiKey::new(transcript.api_key.clone());
    let secret = transcript.api_key.clone();
    let fake = fake_model::FakeModel::serve(transcript).await;
    let model = match provider.as_str() {
        "anthropic" => live::Model::anthropic(&fake.url, key, &name),
        "openai" => live::Model::openai(&format!("{}/v1", fake.url), Some(key), &name),
        other => panic!("{fixture}: unknown provider {other}"),
    };
    assert!(!format!("{model:?}").contains(&secret), "the key never prints");
    let scenario = Scenario {
        name: format!("replay of {fixture}"),
        category: "normal".into(),
        rationale: "The live driver's wire handling against a recorded transcript.".into(),
        config: String::new(),
        prompt: Some(prompt),
        steps: Vec::new(),
        end: End { moved: allowed.iter().map(|(a, m)| (a.to_string(), m.to_string())).collect(), live_moved: None },
    };
    (run_live(&scenario, &model).await, fake)
}

/// What every replay must show: each turn met its expectations, the driver ran both calls against
/// the real gateway (a payment, then a refusal), money moved once, and the checks hold.
fn assert_replayed(live: &LiveOutcome, fake: &fake_model::FakeModel, turns: usize) {
    assert_eq!(fake.mismatches(), Vec::<String>::new(), "the driver sent what the transcript expects");
    assert_eq!(fake.requests().len(), turns, "one request per recorded turn");
    let calls: Vec<(&str, String)> =
        live.run.calls.iter().map(|c| (c.tool.as_str(), c.result.as_ref().map(outcome).unwrap())).collect();
    assert_eq!(calls, [("create_payment", "ok".to_string()), ("create_payment", "APPROVAL_REQUIRED".to_string())]);
    assert!(
        matches!(live.run.stop, live::Stop::Finished { .. }),
        "the model ended the conversation: {:?}",
        live.run.stop
    );
    assert_eq!(live.run.model_calls, turns);
    let moved: Vec<(&str, i64)> = live.moved.iter().map(|(a, m)| (a.as_str(), *m)).collect();
    assert_eq!(moved, [("acct-A", -5000), ("acct-B", 5000), ("acct-Z", 0)], "50.00 moved once, 5,000.00 did not");
    assert_eq!(live.outcome.violations, Vec::<String>::new());
    assert_eq!((live.outcome.duplicates, live.outcome.unsafe_moves), (0, 0));
    let create_payment =
        live.run.tools.iter().find(|t| t.name == "create_payment").expect("tools/list has create_payment");
    assert!(create_payment.input_schema["properties"]["operation_id"].is_object(), "the real tool schema");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_driver_speaks_the_anthropic_messages_api() {
    let (live, fake) = replay("live-anthropic.json", TRANSCRIPT_PAYS).await;
    assert_replayed(&live, &fake, 3);
    let tools: Vec<Value> = live
        .run
        .tools
        .iter()
        .map(|t| json!({"name": t.name, "description": t.description, "input_schema": *t.input_schema}))
        .collect();
    for request in fake.requests() {
        assert_eq!(request.body["tools"], Value::Array(tools.clone()), "every turn offers tools/list's tools");
    }
    if let live::Stop::Finished { reason, text } = &live.run.stop {
        assert_eq!(
            (reason.as_str(), text.as_str()),
            ("end_turn", "Paid 50.00 KES for lunch. Invoice 9 waits for a human's approval.")
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_driver_speaks_openai_chat_completions() {
    let (live, fake) = replay("live-openai.json", TRANSCRIPT_PAYS).await;
    assert_replayed(&live, &fake, 3);
    let tools: Vec<Value> = live
        .run
        .tools
        .iter()
        .map(|t| {
            json!({"type": "function", "function": {"name": t.name, "description": t.description, "parameters": *t.input_schema}})
        })
        .collect();
    for request in fake.requests() {
        assert_eq!(request.body["tools"], Value::Array(tools.clone()), "every turn offers tools/list's tools");
    }
    if let live::Stop::Finished { reason, text } = &live.run.stop {
        assert_eq!(
            (reason.as_str(), text.as_str()),
            ("stop", "Paid 50.00 KES for lunch. Invoice 9 waits for a human's approval.")
        );
    }
}

/// The live checks are not vacuous: the same transcript against a smaller allowance is unsafe.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn live_mode_flags_money_moved_past_the_allowance() {
    let (live, _fake) = replay("live-openai.json", &[("acct-A", "-20.00"), ("acct-B", "20.00")]).await;
    assert_eq!(live.outcome.unsafe_moves, 2);
    assert_eq!(
        live.outcome.violations,
        ["acct-A moved -5000 (minor units), allowed 0 to -2000", "acct-B moved 5000 (minor units), allowed 0 to 2000"]
    );
}
