//! `paygate rail-simulator`: the M-Pesa and Airtel simulators as processes of their own (the real
//! binary, started as a child), with a gateway whose `base_url` names them as it would name the
//! real rail (`environment` is not "simulator"). An MCP agent's push, payout and collection are
//! answered by the simulator itself (`--auto accept`), settle through the gateway's real callback
//! routes, and appear in the simulator's records view exactly once; a simulator killed while it
//! holds a payout's answer, and started again, is never sent that payout a second time.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::io::BufRead;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use paygate::clock::SystemClock;
use serde_json::{Value, json};

const MPESA_SECRET: &str = "cb-secret-0123456789abcdefghij";
const AIRTEL_SECRET: &str = "airtel-cb-secret-0123456789abcdef";
const CONTROL_TOKEN: &str = "control-token-0123456789";
const SCOPES: &str = "payments:read payments:collect payments:refund payments:payout payments:integrity";
/// How long a payment may take to settle through the simulator's automatic answer.
const SETTLE_WAIT: Duration = Duration::from_secs(20);

fn mpesa_section(base_url: &str) -> String {
    format!(
        r#"
[mpesa]
enabled = true
environment = "sandbox"
base_url = "{base_url}"
consumer_key = "rail-sim-consumer-key"
consumer_secret = "rail-sim-consumer-secret"
short_code = "174379"
passkey = "rail-sim-passkey"
initiator_name = "rail-sim-initiator"
security_credential = "rail-sim-security-credential"
callback_secret = "{MPESA_SECRET}"
request_timeout_ms = 1000
"#
    )
}

fn airtel_section(base_url: &str) -> String {
    format!(
        r#"
[airtel]
enabled = true
environment = "uat"
base_url = "{base_url}"
client_id = "rail-sim-airtel-client"
client_secret = "rail-sim-airtel-secret"
callback_secret = "{AIRTEL_SECRET}"
request_timeout_ms = 1000
"#
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
allowed_accounts = ["acct-A", "mpesa-collections", "airtel-collections"]
autonomous_limit = {{ KES = "1000.00" }}
daily_limit = {{ KES = "100000.00" }}
daily_payments_max = 1000
calls_per_minute = 600
tool_calls_per_minute = {{}}
issuer = ""
"#
    )
}

/// `paygate rail-simulator` as a child process (SIGKILLed and reaped on drop).
struct RailSim {
    proc: Proc,
    /// `http://ADDR`, as it printed.
    base: String,
}

impl RailSim {
    /// Starts it with `config` (the gateway's rail section) and `args`, and reads the address it prints.
    fn start(dir: &Path, config: &str, args: &[&str], control_token: Option<&str>) -> RailSim {
        let file = dir.join("rail-sim.toml");
        std::fs::write(&file, config).unwrap();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"));
        cmd.arg("--config")
            .arg(&file)
            .arg("rail-simulator")
            .args(args)
            .env("PAYGATE_STORAGE__DATA_DIR", dir)
            .env("PAYGATE_LOG", "warn")
            .env_remove("PAYGATE_RAIL_SIMULATOR_CONTROL_TOKEN")
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::null());
        if let Some(token) = control_token {
            cmd.env("PAYGATE_RAIL_SIMULATOR_CONTROL_TOKEN", token);
        }
        let mut child = cmd.spawn().expect("paygate rail-simulator starts");
        let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
        let line = lines.next().and_then(Result::ok).unwrap_or_default();
        let base = line.split_once(": ").map(|(_, url)| url.trim().to_string());
        let base = base.filter(|b| b.starts_with("http://")).unwrap_or_else(|| panic!("no address printed: {line:?}"));
        RailSim { proc: Proc::adopt(child), base }
    }

    /// The records view (`GET /simulator/control/<rail>`).
    async fn view(&self, rail: &str, token: Option<&str>) -> (u16, Value) {
        let mut request = reqwest::Client::new().get(format!("{}/simulator/control/{rail}", self.base));
        if let Some(token) = token {
            request = request.bearer_auth(token);
        }
        let response = request.send().await.unwrap();
        (response.status().as_u16(), response.json().await.unwrap_or_default())
    }

    /// SIGKILL and reap.
    fn kill(&mut self) {
        self.proc.kill();
    }
}

/// `host:port` of a port free a moment ago (for a server whose address must be known before it starts).
fn free_addr() -> String {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap().to_string()
}

async fn payment(c: &Client, id: &str) -> Value {
    ok(&call(c, "get_payment", json!({"payment_id": id})).await).clone()
}

/// The payment once it is no longer pending (the simulator answers by itself, a little later).
async fn settled(c: &Client, id: &str) -> Value {
    let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
    loop {
        let p = payment(c, id).await;
        if p["status"] != "pending" || tokio::time::Instant::now() > deadline {
            return p;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

fn items<'a>(view: &'a Value, pred: impl Fn(&Value) -> bool + 'a) -> Vec<&'a Value> {
    view["items"].as_array().expect("items").iter().filter(|i| pred(i)).collect()
}

fn id_of(p: &Value) -> String {
    p["payment_id"].as_str().unwrap().to_string()
}

/// M-Pesa: a push (`request_payment`) and a payout (`send_payment`), each answered by the
/// standalone simulator itself, settle through the gateway's real callback routes, and each is in
/// the simulator's records once — the payout under the gateway's payment id as its
/// OriginatorConversationID.
#[tokio::test]
async fn an_mpesa_push_and_payout_settle_through_a_standalone_simulator_once_each() {
    let dir = tempfile::tempdir().unwrap();
    let sim_dir = tempfile::tempdir().unwrap();
    let sim = RailSim::start(
        sim_dir.path(),
        &mpesa_section(""),
        &["--rail", "mpesa", "--bind", "127.0.0.1:0", "--auto", "accept", "--auto-after-ms", "100"],
        None,
    );
    let app = spawn_with_toml(dir.path(), &overlay(&mpesa_section(&sim.base)), &[], Arc::new(SystemClock)).await;
    let c = &connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;

    let push = json!({"operation_id": "sim-push-1", "phone_number": "0712 345 678", "amount": "150",
                      "account_reference": "INV-1001", "description": "Order 1001"});
    let pushed = ok(&call(c, "request_payment", push.clone()).await).clone();
    assert_eq!(pushed["status"], "pending", "{pushed}");
    let pushed_id = id_of(&pushed);
    let done = settled(c, &pushed_id).await;
    assert_eq!(done["status"], "succeeded", "the simulator's callback, confirmed by the gateway's query: {done}");

    let payout = json!({"operation_id": "sim-payout-1", "phone_number": "0712 345 678", "amount": "40",
                        "remarks": "Cashback"});
    let paid = ok(&call(c, "send_payment", payout.clone()).await).clone();
    let paid_id = id_of(&paid);
    let done = settled(c, &paid_id).await;
    assert_eq!(done["status"], "succeeded", "the simulator's result: {done}");
    // The same operation again: replayed by the gateway, never sent to the rail.
    let again = ok(&call(c, "send_payment", payout).await).clone();
    assert_eq!((again["payment_id"].as_str(), again["replayed"].as_bool()), (Some(paid_id.as_str()), Some(true)));
    let again = ok(&call(c, "request_payment", push).await).clone();
    assert_eq!(again["payment_id"].as_str(), Some(pushed_id.as_str()));

    let (status, view) = sim.view("mpesa", None).await;
    assert_eq!(status, 200, "loopback, no token: the control routes answer");
    let prompts = items(&view, |i| i["kind"] == "prompt");
    assert_eq!(prompts.len(), 1, "one prompt: {view}");
    assert_eq!((prompts[0]["amount"].as_i64(), prompts[0]["status"].as_str()), (Some(150), Some("paid")));
    assert_eq!(prompts[0]["originator_id"], Value::Null, "an STK push carries no caller id");
    let payouts = items(&view, |i| i["kind"] == "payout");
    assert_eq!(payouts.len(), 1, "one payout: {view}");
    assert_eq!(payouts[0]["originator_id"].as_str(), Some(paid_id.as_str()), "{view}");
    assert_eq!((payouts[0]["amount"].as_i64(), payouts[0]["status"].as_str()), (Some(40), Some("paid")));
    assert!(payouts[0]["rail_id"].as_str().is_some_and(|r| !r.is_empty()), "{view}");
    assert_eq!(view["items"].as_array().unwrap().len(), 2, "nothing else reached the rail: {view}");
    // The other rail's controls are not here.
    assert_eq!(sim.view("airtel", None).await.0, 404);
    app.stop().await;
}

/// Airtel: a collection answered by the standalone simulator itself is posted as Airtel's callback
/// to the gateway (`--callback-base-url`, the route and secret from the shared config), confirmed
/// by the gateway's enquiry, and in the records once; with a control token, the controls need it.
#[tokio::test]
async fn an_airtel_collection_settles_through_a_standalone_simulator_once() {
    let dir = tempfile::tempdir().unwrap();
    let sim_dir = tempfile::tempdir().unwrap();
    // Airtel's callback URL is set in its portal before any request: the gateway's address first.
    let gateway_addr = free_addr();
    let gateway_url = format!("http://{gateway_addr}");
    let sim = RailSim::start(
        sim_dir.path(),
        &airtel_section(""),
        &["--rail", "airtel", "--bind", "127.0.0.1:0", "--auto", "accept", "--callback-base-url", &gateway_url],
        Some(CONTROL_TOKEN),
    );
    let overrides = [("PAYGATE_SERVER__BIND", gateway_addr.as_str())];
    let app =
        spawn_with_toml(dir.path(), &overlay(&airtel_section(&sim.base)), &overrides, Arc::new(SystemClock)).await;
    assert_eq!(app.base(), gateway_url);
    let c = &connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;

    let collect = json!({"operation_id": "sim-airtel-1", "phone_number": "0733 123 456", "amount": "120",
                         "account_reference": "INV-7", "description": "Order 7"});
    let asked = ok(&call(c, "request_payment", collect.clone()).await).clone();
    assert_eq!(asked["to_account"], "airtel-collections", "{asked}");
    let asked_id = id_of(&asked);
    let done = settled(c, &asked_id).await;
    assert_eq!(done["status"], "succeeded", "the simulator's callback, confirmed by the enquiry: {done}");
    assert_eq!(done["receipt"]["rail"], "airtel", "{done}");
    let again = ok(&call(c, "request_payment", collect).await).clone();
    assert_eq!(again["payment_id"].as_str(), Some(asked_id.as_str()));

    assert_eq!(sim.view("airtel", None).await.0, 401, "a token is set: it is needed, loopback or not");
    assert_eq!(sim.view("airtel", Some("control-token-wrong-0000")).await.0, 401);
    let (status, view) = sim.view("airtel", Some(CONTROL_TOKEN)).await;
    assert_eq!(status, 200);
    let collections = items(&view, |i| i["kind"] == "collection");
    assert_eq!(collections.len(), 1, "one collection: {view}");
    let item = collections[0];
    assert_eq!(item["originator_id"].as_str(), Some(asked_id.as_str()), "{view}");
    assert_eq!((item["amount"].as_i64(), item["status"].as_str()), (Some(120), Some("paid")), "{view}");
    assert_eq!(item["rail_id"], done["receipt"]["reference"], "the receipt is Airtel's id for it: {done}");
    assert_eq!(view["refused_duplicates"], json!([]), "{view}");
    app.stop().await;
}

/// A payout whose answer the simulator holds (lose-next-answer) when it is SIGKILLed: the gateway
/// does not know the outcome, and neither a retry of the operation nor the gateway's status query
/// sends the payout to the restarted simulator. Across both lives the rail took it once.
#[tokio::test]
async fn a_simulator_killed_holding_a_payout_is_never_sent_it_again() {
    let dir = tempfile::tempdir().unwrap();
    let sim_dir = tempfile::tempdir().unwrap();
    let sim_addr = free_addr();
    let args = ["--rail", "mpesa", "--bind", sim_addr.as_str(), "--auto", "accept", "--auto-after-ms", "60000"];
    let mut sim = RailSim::start(sim_dir.path(), &mpesa_section(""), &args, None);
    let app = spawn_with_toml(dir.path(), &overlay(&mpesa_section(&sim.base)), &[], Arc::new(SystemClock)).await;
    let c = &connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    let push = json!({"operation_id": "kill-push", "phone_number": "0712 345 678", "amount": "500",
                      "account_reference": "INV-9", "description": "Float"});
    let pushed = id_of(ok(&call(c, "request_payment", push).await));
    let answered = reqwest::Client::new()
        .post(format!("{}/simulator/control/mpesa/{pushed}/accept", sim.base))
        .send()
        .await
        .unwrap();
    assert_eq!(answered.status(), 404, "a prompt is answered by its CheckoutRequestID, not the gateway's id");
    let r = reqwest::Client::new().post(format!("{}/simulator/control/mpesa/latest/accept", sim.base)).send().await;
    assert_eq!(r.unwrap().status(), 200);
    assert_eq!(settled(c, &pushed).await["status"], "succeeded");

    // The next answer is held; the simulator takes the payout and is killed before answering.
    let lose = reqwest::Client::new().post(format!("{}/simulator/control/mpesa/lose-next-answer", sim.base));
    assert_eq!(lose.send().await.unwrap().status(), 200);
    let payout = json!({"operation_id": "kill-payout", "phone_number": "0712 345 678", "amount": "70",
                        "remarks": "Cashback"});
    let watch_and_kill = async {
        let deadline = tokio::time::Instant::now() + SETTLE_WAIT;
        let before_kill = loop {
            let (_, view) = sim.view("mpesa", None).await;
            if !items(&view, |i| i["kind"] == "payout").is_empty() || tokio::time::Instant::now() > deadline {
                break view;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        sim.proc.child.kill().unwrap();
        before_kill
    };
    let (unknown, before_kill) = tokio::join!(call(c, "send_payment", payout.clone()), watch_and_kill);
    sim.kill();
    let taken = items(&before_kill, |i| i["kind"] == "payout");
    assert_eq!(taken.len(), 1, "the payout reached the rail: {before_kill}");
    assert_eq!(taken[0]["status"], "pending", "{before_kill}");
    let payout_id = taken[0]["originator_id"].as_str().unwrap().to_string();
    assert_eq!(code(&unknown), "OUTCOME_UNKNOWN", "{unknown:?}");

    // Started again on the same address: it remembers nothing, and is sent nothing again.
    let sim = RailSim::start(sim_dir.path(), &mpesa_section(""), &args, None);
    let retried = call(c, "send_payment", payout).await;
    let verdict = match retried.is_error {
        Some(true) => code(&retried),
        _ => ok(&retried)["status"].as_str().unwrap_or_default().to_string(),
    };
    let unsettled = ["OUTCOME_UNKNOWN", "OPERATION_IN_PROGRESS", "pending"];
    assert!(unsettled.contains(&verdict.as_str()), "a retry settles nothing and sends nothing: {retried:?}");
    app.running.gateway.poll_rails(0, Duration::from_secs(10)).await;
    assert_eq!(payment(c, &payout_id).await["status"], "pending", "unknown stays pending, never success");
    let (_, after) = sim.view("mpesa", None).await;
    assert!(items(&after, |i| i["kind"] == "payout").is_empty(), "never sent again: {after}");
    app.stop().await;
}

/// `--items-max`: a simulator keeps that many items, then refuses new ones with 503 (nothing
/// recorded, nothing paid) — and the gateway tells the agent nothing moved. Out of its bounds the
/// simulator does not start. (The fault suite runs one with room for its ~10,000 payouts: at the
/// default of 10,000 a quick run filled it, and its last payouts could never be made.)
#[tokio::test]
async fn a_full_simulator_refuses_new_payments_and_its_bound_is_checked() {
    for bad in ["0", "200001"] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
            .args(["rail-simulator", "--rail", "mpesa", "--bind", "127.0.0.1:0", "--items-max", bad])
            .env_remove("PAYGATE_CONFIG")
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "--items-max {bad}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("--items-max must be between 1 and 200000"), "{bad}");
    }
    let dir = tempfile::tempdir().unwrap();
    let sim_dir = tempfile::tempdir().unwrap();
    let sim = RailSim::start(
        sim_dir.path(),
        &mpesa_section(""),
        &["--rail", "mpesa", "--bind", "127.0.0.1:0", "--auto", "accept", "--auto-after-ms", "50", "--items-max", "1"],
        None,
    );
    let app = spawn_with_toml(dir.path(), &overlay(&mpesa_section(&sim.base)), &[], Arc::new(SystemClock)).await;
    let c = &connect(&app.url, &app.token("dev-agent", SCOPES), Era::Modern).await;
    let payout = |op: &str| json!({"operation_id": op, "phone_number": "0712 345 678", "amount": "40", "remarks": "x"});
    let first = ok(&call(c, "send_payment", payout("full-1")).await).clone();
    assert_eq!(settled(c, &id_of(&first)).await["status"], "succeeded");
    let refused = call(c, "send_payment", payout("full-2")).await;
    assert_eq!(code(&refused), "BACKEND_UNAVAILABLE", "{refused:?}");
    assert_eq!(err(&refused)["retryable"], true, "{refused:?}");
    let (_, view) = sim.view("mpesa", None).await;
    assert_eq!(view["items"].as_array().unwrap().len(), 1, "the full simulator recorded nothing more: {view}");
    app.stop().await;
}
