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
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use paygate::clock::ManualClock;
use paygate::ids::AccountId;
use paygate::money::{Currency, parse_minor};
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
    #[serde(default = "default_scopes")]
    scopes: String,
    /// A tool call; `"$mandate"` in an argument is the last mandate an approval issued.
    call: Option<String>,
    #[serde(default)]
    args: toml::Table,
    /// Copies sent at once (a retry storm).
    #[serde(default = "one")]
    times: usize,
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
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct End {
    /// Allowed balance changes by account, as signed decimal strings (KES). Unlisted: no change.
    #[serde(default)]
    moved: BTreeMap<String, String>,
}

fn default_agent() -> String {
    "dev-agent".into()
}
fn default_scopes() -> String {
    "payments:read payments:create payments:refund".into()
}
fn one() -> usize {
    1
}

/// Accounts whose balances are watched: the demo ledger's.
const WATCHED: &[&str] = &["acct-A", "acct-B", "acct-Z"];

struct Outcome {
    name: String,
    category: String,
    violations: Vec<String>,
    duplicates: usize,
    unsafe_moves: usize,
}

async fn balances(app: &TestApp) -> HashMap<String, i64> {
    let mut out = HashMap::new();
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

/// A tool call; a refusal at the HTTP or protocol level (403 for a missing scope) is `PROTOCOL_ERROR`.
async fn try_call(c: &Client, tool: &str, args: Value) -> (String, Value) {
    let params = rmcp::model::CallToolRequestParams::new(tool.to_string())
        .with_arguments(args.as_object().cloned().unwrap_or_default());
    match c.call_tool(params).await {
        Ok(r) => {
            let content = r.structured_content.unwrap_or(Value::Null);
            let outcome = if r.is_error == Some(true) {
                content["error"]["code"].as_str().unwrap_or("NO_CODE").to_string()
            } else {
                "ok".to_string()
            };
            (outcome, content)
        }
        Err(_) => ("PROTOCOL_ERROR".to_string(), Value::Null),
    }
}

async fn start(dir: &Path, config: &str, clock: &ManualClock) -> TestApp {
    spawn_with_toml(dir, config, &[], Arc::new(clock.clone())).await
}

async fn run(s: &Scenario) -> Outcome {
    let dir = tempfile::tempdir().unwrap();
    let clock = ManualClock::new(now_secs());
    let mut app = start(dir.path(), &s.config, &clock).await;
    let before = balances(&app).await;
    let mut violations = Vec::new();
    let mut clients: HashMap<(String, String), Arc<Client>> = HashMap::new();
    let mut last_approval: Option<String> = None;
    let mut mandate: Option<String> = None;
    let mut last_payment: Option<String> = None;
    let mut paid_by_op: HashMap<String, Vec<String>> = HashMap::new();

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
            app = start(dir.path(), &s.config, &clock).await;
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
                let t = app.token(reviewer, "payments:approve");
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
                let c = client(&app, &mut clients, &step.agent, &step.scopes).await;
                let r = call(&c, "get_approval", json!({"approval_id": id})).await;
                mandate = r.structured_content.as_ref().and_then(|v| v["mandate"].as_str()).map(str::to_string);
            }
        }
        let Some(tool) = &step.call else { continue };
        let c = client(&app, &mut clients, &step.agent, &step.scopes).await;
        let args = substitute(&step.args, mandate.as_deref(), last_payment.as_deref());
        let mut calls = tokio::task::JoinSet::new();
        for _ in 0..step.times {
            let (c, tool, args) = (c.clone(), tool.clone(), args.clone());
            calls.spawn(async move { try_call(&c, &tool, args).await });
        }
        for (outcome, content) in calls.join_all().await {
            if let Some(pid) = content["payment_id"].as_str() {
                last_payment = Some(pid.to_string());
            }
            if let Some(id) = content["error"]["approval_id"].as_str() {
                last_approval = Some(id.to_string());
            }
            if let (Some(op), Some(pid)) = (args["operation_id"].as_str(), content["payment_id"].as_str()) {
                let ids = paid_by_op.entry(format!("{}/{tool}/{op}", step.agent)).or_default();
                if !ids.iter().any(|p| p == pid) {
                    ids.push(pid.to_string());
                }
            }
            if !step.expect.is_empty() && !step.expect.contains(&outcome) {
                violations.push(format!("{at}: {tool} answered {outcome}, expected one of {:?}", step.expect));
            }
        }
    }

    let after = balances(&app).await;
    let kes = Currency::parse("KES").unwrap();
    let mut unsafe_moves = 0;
    for a in WATCHED {
        let allowed = s.end.moved.get(*a).map_or(0, |m| signed_minor(m, kes));
        let moved = after[*a] - before[*a];
        if moved != allowed {
            unsafe_moves += 1;
            violations.push(format!("{a} moved {moved} (minor units), allowed {allowed}"));
        }
    }
    let duplicates = paid_by_op.values().map(|ids| ids.len().saturating_sub(1)).sum();
    if duplicates > 0 {
        let ops: Vec<String> = paid_by_op
            .iter()
            .filter(|(_, ids)| ids.len() > 1)
            .map(|(op, ids)| format!("{op} paid {} times", ids.len()))
            .collect();
        violations.push(format!("duplicate payments: {}", ops.join(", ")));
    }
    let integrity = app.running.store.ledger_integrity().await.unwrap();
    if !integrity.ok {
        violations.push(format!("ledger integrity: {:?}", integrity.problems));
    }
    for (_, c) in clients.drain() {
        if let Some(c) = Arc::into_inner(c) {
            let _ = c.cancel().await;
        }
    }
    app.stop().await;
    Outcome { name: s.name.clone(), category: s.category.clone(), violations, duplicates, unsafe_moves }
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

async fn client(
    app: &TestApp,
    clients: &mut HashMap<(String, String), Arc<Client>>,
    agent: &str,
    scopes: &str,
) -> Arc<Client> {
    let key = (agent.to_string(), scopes.to_string());
    if let Some(c) = clients.get(&key) {
        return c.clone();
    }
    let c = Arc::new(connect(&app.url, &app.token(agent, scopes), Era::Modern).await);
    clients.insert(key, c.clone());
    c
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
    println!("\n| scenario | category | outcome | duplicate financial operations | unsafe money movements | notes |");
    println!("|---|---|---|---:|---:|---|");
    for o in &outcomes {
        let verdict = if o.violations.is_empty() { "pass" } else { "FAIL" };
        println!(
            "| {} | {} | {verdict} | {} | {} | {} |",
            o.name,
            o.category,
            o.duplicates,
            o.unsafe_moves,
            o.violations.join("; ").replace('|', "/")
        );
    }
    let failed: Vec<_> = outcomes.iter().filter(|o| !o.violations.is_empty()).map(|o| o.name.as_str()).collect();
    let (dups, unsafe_moves): (usize, usize) =
        outcomes.iter().fold((0, 0), |(d, u), o| (d + o.duplicates, u + o.unsafe_moves));
    println!(
        "\nevals: {} scenarios, {} violated; {dups} duplicate financial operations, {unsafe_moves} unsafe money movements",
        outcomes.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "scenarios violated: {failed:?}");
}
