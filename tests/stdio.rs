//! `paygate stdio`, black-box: the real binary started the way an MCP client starts a stdio server
//! (a subprocess, the agent's token in `PAYGATE_TOKEN`) on a temp data directory, driven by rmcp's
//! client over the child's stdout/stdin. Tokens come from `paygate token` on the same config, as a
//! user mints them, or are forged here with the dev key for the claims that command refuses to
//! mint (expired, a person's scope, another audience).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use common::{Client, DEV_ISSUER, ERAS, Era, balance, call, code, err, ok};
use rmcp::model::{ClientConfig, ProtocolVersion};
use rmcp::{ClientLifecycleMode, ClientServiceExt};
use serde_json::{Value, json};

/// The agent audience with the default `server.bind` (which `paygate stdio` never binds).
const AGENT_AUDIENCE: &str = "http://127.0.0.1:8080/mcp";
/// Bound on a start that must be refused, and on the end after the client leaves.
const EXIT_WAIT: Duration = Duration::from_secs(30);

/// One gateway's config: its own data directory and the tests' fixed dev issuer.
struct Setup {
    dir: tempfile::TempDir,
    env: Vec<(&'static str, String)>,
}

impl Setup {
    fn new(extra: &[(&'static str, &str)]) -> Setup {
        let dir = tempfile::tempdir().unwrap();
        let mut env = vec![
            ("PAYGATE_STORAGE__DATA_DIR", dir.path().join("data").display().to_string()),
            ("PAYGATE_AUTH__DEV_ISSUER", DEV_ISSUER.to_string()),
            ("PAYGATE_LOG", "info".to_string()),
        ];
        env.extend(extra.iter().map(|(k, v)| (*k, v.to_string())));
        Setup { dir, env }
    }

    fn data(&self) -> PathBuf {
        self.dir.path().join("data")
    }

    /// The binary with this config and nothing from the developer's environment.
    fn command(&self, args: &[&str]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_paygate"));
        cmd.env_clear().args(args).kill_on_drop(true);
        for (k, v) in &self.env {
            cmd.env(k, v);
        }
        cmd
    }

    /// `paygate token ARGS` on this config.
    async fn token(&self, args: &[&str]) -> String {
        let o = self.command(&[&["token"], args].concat()).output().await.unwrap();
        assert!(o.status.success(), "paygate token: {}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8(o.stdout).unwrap().trim().to_string()
    }

    /// A token signed with this config's dev key, for claims `paygate token` will not mint.
    async fn forge(&self, audience: &str, scope: &str, now: i64, ttl_secs: i64) -> String {
        self.token(&["--sub", "dev-agent", "--scope", "payments:read"]).await; // the dev key exists
        let key = std::fs::read_to_string(self.data().join("dev-signing.key")).unwrap();
        let token = paygate::auth::DevToken {
            issuer: DEV_ISSUER,
            audience,
            subject: "dev-agent",
            scope,
            actor: None,
            now,
            ttl_secs,
        };
        token.mint(&paygate::auth::Secret::new(key.trim().to_string())).unwrap()
    }

    /// `paygate stdio` that must refuse to start: its exit code and stderr. Its stdin stays open
    /// and unwritten the whole time, so it has to decide (and exit) without reading a message.
    async fn refused(&self, token: Option<&str>) -> (i32, String, String) {
        let mut cmd = self.command(&["stdio"]);
        if let Some(t) = token {
            cmd.env("PAYGATE_TOKEN", t);
        }
        let mut child = cmd.stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped()).spawn().unwrap();
        let _stdin = child.stdin.take(); // held open until the child is gone
        let out = tokio::time::timeout(EXIT_WAIT, child.wait_with_output())
            .await
            .expect("a refused start exits on its own, stdin still open")
            .unwrap();
        let text = |b: &[u8]| String::from_utf8_lossy(b).into_owned();
        (out.status.code().unwrap_or(-1), text(&out.stdout), text(&out.stderr))
    }

    /// `paygate stdio` for `token`, connected in `era`; its stderr goes to a file (`Served::logs`).
    async fn serve(&self, token: &str, era: Era) -> Served {
        let log = self.dir.path().join(format!("stdio-{}.log", uuid::Uuid::new_v4().simple()));
        let mut child = self
            .command(&["stdio"])
            .env("PAYGATE_TOKEN", token)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap();
        let transport = (child.stdout.take().unwrap(), child.stdin.take().unwrap());
        let (mode, version) = match era {
            Era::Legacy => (ClientLifecycleMode::Initialize, ProtocolVersion::V_2025_11_25),
            Era::Modern => (
                ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
                ProtocolVersion::V_2026_07_28,
            ),
        };
        let client = ClientConfig::default()
            .with_protocol_version(version)
            .serve_with_lifecycle(transport, mode)
            .await
            .unwrap_or_else(|e| panic!("MCP over stdio ({era:?}): {e}; stderr:\n{}", read(&log)));
        client.set_response_cache_config(rmcp::service::ClientCacheConfig::disabled()).await;
        Served { child, client, log }
    }
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// A running `paygate stdio` and the client talking to it.
struct Served {
    child: tokio::process::Child,
    client: Client,
    log: PathBuf,
}

impl Served {
    /// The client leaves (its end of stdin closes); the server exits 0 on its own. Its stderr.
    async fn close(mut self) -> String {
        self.client.cancel().await.unwrap();
        let status = tokio::time::timeout(EXIT_WAIT, self.child.wait())
            .await
            .expect("paygate stdio exits when its client leaves")
            .unwrap();
        let logs = read(&self.log);
        assert!(status.success(), "exit {status}; stderr:\n{logs}");
        logs
    }
}

/// A decimal amount as minor units ("1000000.00" → 100000000).
fn minor(amount: &str) -> i64 {
    amount.replace('.', "").parse().unwrap()
}

fn pay(operation_id: &str) -> Value {
    json!({"operation_id": operation_id, "from_account": "acct-A", "to_account": "acct-B", "amount": "2.50",
           "currency": "KES"})
}

#[tokio::test]
async fn without_a_token_nothing_starts() {
    let s = Setup::new(&[]);
    for token in [None, Some(""), Some("   ")] {
        let (code, stdout, stderr) = s.refused(token).await;
        assert_eq!(code, 2, "{token:?}: {stderr}");
        assert!(stderr.contains("PAYGATE_TOKEN is not set"), "{token:?}: {stderr}");
        assert!(stdout.is_empty(), "stdout is the protocol's alone: {stdout}");
    }
    assert!(!s.data().exists(), "nothing was opened or created");
}

#[tokio::test]
async fn a_token_that_is_not_an_agents_for_this_gateway_is_refused_before_anything_opens() {
    let s = Setup::new(&[]);
    let now = common::now_secs();
    let expired = s.forge(AGENT_AUDIENCE, "payments:read payments:create", now - 7200, 600).await;
    let foreign = s.forge("https://other.example/mcp", "payments:read", now, 600).await;
    let persons = s.forge(AGENT_AUDIENCE, "payments:read payments:confirm", now, 600).await;
    let operator = s.token(&["--operator", "--sub", "alice", "--scope", "payments:approve"]).await;
    let cases = [
        ("garbage", "garbage", "PAYGATE_TOKEN is not accepted: malformed token"),
        ("expired", expired.as_str(), "PAYGATE_TOKEN is not accepted: token expired"),
        ("another resource's", foreign.as_str(), "token audience is not this resource"),
        ("a person's (payments:confirm)", persons.as_str(), "cannot be used by an agent"),
        ("an operator's", operator.as_str(), "PAYGATE_TOKEN is an operator's token"),
    ];
    for (what, token, says) in cases {
        let (code, stdout, stderr) = s.refused(Some(token)).await;
        assert_eq!(code, 2, "{what}: {stderr}");
        assert!(stderr.contains(says), "{what}: want {says:?} in:\n{stderr}");
        assert!(stderr.contains(AGENT_AUDIENCE), "{what}: the message names the audience wanted: {stderr}");
        assert!(stdout.is_empty(), "{what}: {stdout}");
        if token.len() > 16 {
            assert!(!stderr.contains(token), "{what}: the token reached stderr");
        }
    }
    assert!(!s.data().join("paygate.sqlite3").exists(), "the store was never opened");
}

#[tokio::test]
async fn an_agent_pays_exactly_once_over_stdio_across_eras_and_restarts() {
    let s = Setup::new(&[]);
    let token = s.token(&["--sub", "dev-agent", "--scope", "payments:read payments:create"]).await;
    let mut paid: Option<String> = None;
    let mut opening = None;
    let mut logs = String::new();
    // Each era is a process of its own: the second is also a restart on the same store.
    for era in ERAS {
        let served = s.serve(&token, era).await;
        let client = &served.client;
        let tools: Vec<String> =
            client.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
        assert!(tools.iter().any(|t| t == "create_payment") && tools.iter().any(|t| t == "get_balance"), "{tools:?}");
        assert!(!tools.iter().any(|t| t == "request_mpesa_payment"), "a rail not configured is not offered: {tools:?}");

        let before = minor(&balance(client, "acct-A").await);
        let opening = *opening.get_or_insert(before);
        let first = call(client, "create_payment", pay("op-stdio-1")).await;
        let again = call(client, "create_payment", pay("op-stdio-1")).await;
        let (first, again) = (ok(&first), ok(&again));
        let id = first["payment_id"].as_str().unwrap().to_string();
        assert_eq!(again["payment_id"], id.as_str(), "{era:?}: a retry is the same payment");
        assert_eq!(again["replayed"], true, "{era:?}");
        match &paid {
            None => assert_eq!(first["replayed"], false, "the first call pays"),
            Some(earlier) => {
                assert_eq!(&id, earlier, "{era:?}: the operation is the one paid before the restart");
                assert_eq!(first["replayed"], true, "{era:?}");
            }
        }
        paid = Some(id.clone());
        assert_eq!(minor(&balance(client, "acct-A").await), opening - 250, "{era:?}: 2.50 left acct-A once");

        let list = call(client, "list_payments", json!({"account_id": "acct-A"})).await;
        let payments = ok(&list)["payments"].as_array().unwrap().clone();
        assert_eq!(payments.len(), 1, "{era:?}: one payment: {payments:?}");
        assert_eq!(payments[0]["payment_id"], id.as_str());
        logs.push_str(&served.close().await);
    }
    assert!(logs.contains("serving MCP on stdin/stdout"), "logs go to stderr:\n{logs}");
    assert!(logs.contains("correlation_id="), "each request is logged with its correlation id:\n{logs}");
    assert!(!logs.contains(&token), "the token reached the logs");
}

#[tokio::test]
async fn a_token_without_payments_create_is_refused_by_the_gateway_on_each_call() {
    let s = Setup::new(&[]);
    let token = s.token(&["--sub", "dev-agent", "--scope", "payments:read"]).await;
    let served = s.serve(&token, Era::Legacy).await;
    let client = &served.client;
    let before = balance(client, "acct-A").await;
    for attempt in 0..2 {
        let refused = call(client, "create_payment", pay("op-no-scope")).await;
        assert_eq!(code(&refused), "INSUFFICIENT_SCOPE", "attempt {attempt}");
        let e = err(&refused);
        assert_eq!(e["required_scopes"], json!(["payments:create"]), "{e}");
        assert_eq!(e["retryable"], false, "{e}");
        assert!(e["correlation_id"].as_str().is_some_and(|c| c.starts_with("corr_")), "{e}");
    }
    assert_eq!(balance(client, "acct-A").await, before, "nothing moved");
    let logs = served.close().await;
    assert!(!logs.contains(&token), "the token reached the logs");
}

#[tokio::test]
async fn a_token_that_expires_mid_session_stops_working_as_over_http() {
    // No leeway, so the token's own exp is the end.
    let s = Setup::new(&[("PAYGATE_AUTH__LEEWAY_SECS", "0")]);
    let valid_secs = 6;
    let now = common::now_secs();
    let token = s.forge(AGENT_AUDIENCE, "payments:read", now - 600 + valid_secs, 600).await;
    let served = s.serve(&token, Era::Legacy).await;
    balance(&served.client, "acct-A").await;
    let left = (now + valid_secs + 1 - common::now_secs()).max(0) as u64;
    tokio::time::sleep(Duration::from_secs(left)).await;
    let after = served
        .client
        .call_tool(
            rmcp::model::CallToolRequestParams::new("get_balance")
                .with_arguments(json!({"account_id": "acct-A"}).as_object().cloned().unwrap()),
        )
        .await;
    match after {
        Err(rmcp::ServiceError::McpError(e)) => {
            assert_eq!(e.code.0, -32600, "{e:?}");
            let data = e.data.clone().unwrap_or_default();
            assert_eq!(data["error"], "invalid_token", "{e:?}");
            assert_eq!(data["error_description"], "token expired", "{e:?}");
        }
        other => panic!("an expired token must be refused on the next request, got {other:?}"),
    }
    served.close().await;
}
