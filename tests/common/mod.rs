//! Test harness: a real paygate on 127.0.0.1:0 with its own data directory, talked to over HTTP.
#![allow(dead_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};

use paygate::app::Running;
use paygate::clock::{Clock, SystemClock};
use paygate::config::Config;
use rmcp::model::{CallToolRequestParams, CallToolResult, ClientConfig, ProtocolVersion};
use rmcp::service::RunningService;
use rmcp::transport::StreamableHttpClientTransport;
use rmcp::transport::common::client_side_sse::NeverRetry;
use rmcp::transport::streamable_http_client::StreamableHttpClientTransportConfig;
use rmcp::{ClientLifecycleMode, ClientServiceExt, RoleClient};
use serde_json::Value;

/// The dev key's issuer in tests: fixed, so principals (and their idempotency keys) survive a
/// restart on a new port. (By default it is the public URL.)
pub const DEV_ISSUER: &str = "https://dev.paygate.test";

pub const ALL_AGENT_SCOPES: &str = "payments:read payments:create payments:refund payments:integrity";

/// Everything the server logs in this test binary, so tests can assert no token leaks.
static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();

#[derive(Clone)]
struct LogWriter(Arc<Mutex<Vec<u8>>>);

impl Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// Install (once) a debug-level subscriber that captures every log line of this test binary.
pub fn capture_logs() -> Arc<Mutex<Vec<u8>>> {
    paygate::install_crypto_provider();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let writer = LogWriter(buf.clone());
        let _ = tracing_subscriber::fmt()
            // The production filter (rmcp's wire dumps capped), unredacted: a test that finds a
            // secret here found code that logs it, whether or not the redactor would catch it.
            .with_env_filter(tracing_subscriber::EnvFilter::new(paygate::logging::filter_spec(Some("debug"))))
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .try_init();
        buf
    })
    .clone()
}

pub fn logs_text() -> String {
    String::from_utf8_lossy(&capture_logs().lock().unwrap()).into_owned()
}

pub enum DataDir {
    Temp(tempfile::TempDir),
    Shared(PathBuf),
}

impl DataDir {
    pub fn path(&self) -> &Path {
        match self {
            DataDir::Temp(t) => t.path(),
            DataDir::Shared(p) => p,
        }
    }
}

pub struct TestApp {
    pub running: Running,
    pub url: String,
    pub data_dir: PathBuf,
    /// Every token this app minted for the test, for the log-leak check.
    minted: Mutex<Vec<String>>,
}

pub fn config_for(dir: &Path, overrides: &[(&str, &str)]) -> Config {
    let mut env = vec![
        ("PAYGATE_SERVER__BIND".to_string(), "127.0.0.1:0".to_string()),
        ("PAYGATE_STORAGE__DATA_DIR".to_string(), dir.display().to_string()),
        ("PAYGATE_AUTH__DEV_ISSUER".to_string(), DEV_ISSUER.to_string()),
    ];
    env.extend(overrides.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    Config::load(None, env).expect("test config")
}

/// Start paygate on a fresh temp data directory.
pub async fn spawn_app() -> (TestApp, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[]).await;
    (app, dir)
}

/// Start paygate on `dir` (reused across restarts) with config overrides.
pub async fn spawn_on(dir: &Path, overrides: &[(&str, &str)]) -> TestApp {
    spawn_with_clock(dir, overrides, Arc::new(SystemClock)).await
}

pub async fn spawn_with_clock(dir: &Path, overrides: &[(&str, &str)], clock: Arc<dyn Clock>) -> TestApp {
    capture_logs();
    let running = paygate::app::start(config_for(dir, overrides), clock).await.expect("paygate starts");
    let url = running.mcp_url();
    TestApp { running, url, data_dir: dir.to_path_buf(), minted: Mutex::new(Vec::new()) }
}

impl TestApp {
    /// A dev-key token for `sub` with `scope`.
    pub fn token(&self, sub: &str, scope: &str) -> String {
        let t = self.running.mint_token(sub, scope, 3600).expect("dev key enabled");
        self.minted.lock().unwrap().push(t.clone());
        t
    }

    /// A dev-key token for the operator resource: a person's own, for the approval routes,
    /// `/principals`, `/operator/v1` and the console.
    pub fn operator_token(&self, sub: &str, scope: &str) -> String {
        let t = self.running.mint_operator_token(sub, scope, 3600).expect("dev key enabled");
        self.minted.lock().unwrap().push(t.clone());
        t
    }

    /// A delegated agent token (RFC 8693): `agent` acting for `user` (`sub` = the user,
    /// `act.sub` = the agent), for the MCP resource.
    pub fn delegated_token(&self, user: &str, agent: &str, scope: &str) -> String {
        let t =
            self.running.mint(paygate::auth::Audience::Agent, user, Some(agent), scope, 3600).expect("dev key enabled");
        self.minted.lock().unwrap().push(t.clone());
        t
    }

    /// The demo agent with every agent scope.
    pub fn dev_token(&self) -> String {
        self.token("dev-agent", ALL_AGENT_SCOPES)
    }

    pub fn base(&self) -> &str {
        &self.running.public_url
    }

    pub async fn stop(self) {
        self.running.shutdown().await;
    }

    /// The ledger's own integrity check, straight from the store.
    pub async fn assert_integrity(&self) {
        let report = self.running.store.ledger_integrity().await.unwrap();
        assert!(report.ok, "ledger integrity: {:?}", report.problems);
    }

    pub async fn audit(&self, sub: &str) -> Vec<paygate::domain::audit::AuditRecord> {
        self.running.store.audit_list(Some(sub), 10_000).await.unwrap()
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Era {
    /// 2025-11-25: initialize + Mcp-Session-Id.
    Legacy,
    /// 2026-07-28: server/discover, stateless, per-request _meta.
    Modern,
}

pub const ERAS: [Era; 2] = [Era::Legacy, Era::Modern];

pub type Client = RunningService<RoleClient, ClientConfig>;

pub fn transport_config(url: &str, token: &str) -> StreamableHttpClientTransportConfig {
    let mut cfg = StreamableHttpClientTransportConfig::with_uri(url.to_string())
        .auth_header(token.to_string())
        .reinit_on_expired_session(false);
    cfg.retry_config = Arc::new(NeverRetry::default());
    cfg
}

pub async fn connect(url: &str, token: &str, era: Era) -> Client {
    try_connect(url, token, era).await.expect("MCP client connects")
}

pub async fn try_connect(url: &str, token: &str, era: Era) -> Result<Client, rmcp::service::ClientInitializeError> {
    try_connect_with(url, token, era, rmcp::model::ClientCapabilities::default()).await
}

/// A client that declares URL-mode elicitation (it answers input requests by hand: `call_tool_once`).
pub async fn connect_eliciting(url: &str, token: &str, era: Era) -> Client {
    let mut caps = rmcp::model::ClientCapabilities::default();
    caps.elicitation =
        Some(rmcp::model::ElicitationCapability::new().with_url(rmcp::model::UrlElicitationCapability::new()));
    try_connect_with(url, token, era, caps).await.expect("MCP client connects")
}

pub async fn try_connect_with(
    url: &str,
    token: &str,
    era: Era,
    capabilities: rmcp::model::ClientCapabilities,
) -> Result<Client, rmcp::service::ClientInitializeError> {
    paygate::install_crypto_provider();
    let transport = StreamableHttpClientTransport::from_config(transport_config(url, token));
    let mode = match era {
        Era::Legacy => ClientLifecycleMode::Initialize,
        Era::Modern => ClientLifecycleMode::Discover { preferred_versions: vec![ProtocolVersion::V_2026_07_28] },
    };
    let mut client = ClientConfig::default().with_protocol_version(match era {
        Era::Legacy => ProtocolVersion::V_2025_11_25,
        Era::Modern => ProtocolVersion::V_2026_07_28,
    });
    client.capabilities = capabilities;
    let running = client.serve_with_lifecycle(transport, mode).await?;
    running.set_response_cache_config(rmcp::service::ClientCacheConfig::disabled()).await;
    Ok(running)
}

pub async fn call(client: &Client, tool: &str, args: Value) -> CallToolResult {
    let args = args.as_object().cloned().unwrap_or_default();
    client
        .call_tool(CallToolRequestParams::new(tool.to_string()).with_arguments(args))
        .await
        .unwrap_or_else(|e| panic!("{tool} call failed at the protocol level: {e}"))
}

/// The structured success payload; panics with the error envelope otherwise.
pub fn ok(r: &CallToolResult) -> &Value {
    assert_ne!(r.is_error, Some(true), "expected success, got {:?}", r.structured_content);
    r.structured_content.as_ref().expect("structured content")
}

/// The error envelope's `error` object; panics on success.
pub fn err(r: &CallToolResult) -> &Value {
    assert_eq!(r.is_error, Some(true), "expected an error, got {:?}", r.structured_content);
    r.structured_content.as_ref().and_then(|v| v.get("error")).expect("error envelope")
}

pub fn code(r: &CallToolResult) -> String {
    err(r)["code"].as_str().unwrap().to_string()
}

/// A call the HTTP layer refused for a missing scope (403 `insufficient_scope`): the client's error
/// names the step-up and the scope the challenge asks for, not just any failure.
pub fn assert_step_up<T: std::fmt::Debug, E: std::fmt::Display + std::fmt::Debug>(refused: &Result<T, E>, scope: &str) {
    let e = refused.as_ref().expect_err("the call must be refused at the HTTP layer");
    let text = format!("{e} {e:?}").to_lowercase();
    assert!(text.contains("insufficient_scope") || text.contains("insufficient scope"), "not a scope refusal: {text}");
    assert!(text.contains(scope), "the refusal does not name {scope}: {text}");
}

/// A call of a tool that is not offered (disabled, or never there): JSON-RPC invalid params (-32602)
/// "tool not found", as rmcp answers an unknown tool, not any other failure.
pub fn assert_no_such_tool<T: std::fmt::Debug>(refused: &Result<T, rmcp::ServiceError>) {
    match refused {
        Err(rmcp::ServiceError::McpError(e)) => {
            assert_eq!((e.code.0, e.message.as_ref()), (-32602, "tool not found"), "{e:?}");
        }
        other => panic!("want JSON-RPC 'tool not found', got {other:?}"),
    }
}

pub async fn balance(client: &Client, account: &str) -> String {
    let r = call(client, "get_balance", serde_json::json!({"account_id": account})).await;
    ok(&r)["balance"].as_str().unwrap().to_string()
}

/// Invariant 7: none of these (tokens, keys) appears in anything the server logged.
pub fn assert_not_logged(secrets: &[&str]) {
    let logs = logs_text();
    assert!(!logs.is_empty(), "log capture is working");
    for s in secrets {
        assert!(s.len() >= 16, "checking a real secret");
        assert!(!logs.contains(s), "a secret appeared in the logs");
    }
}

impl TestApp {
    /// Invariant 7 for this app: no token it minted and not its dev key appears in the logs.
    pub fn assert_secrets_not_logged(&self) {
        let mut secrets = self.minted.lock().unwrap().clone();
        secrets.push(self.dev_key_text());
        assert_not_logged(&secrets.iter().map(String::as_str).collect::<Vec<_>>());
    }

    /// The dev signing key as the server keeps it (for forging tokens in negative tests).
    pub fn dev_key_text(&self) -> String {
        std::fs::read_to_string(self.data_dir.join("dev-signing.key")).unwrap().trim().to_string()
    }
}

/// An operator route call: (status, JSON body).
pub async fn operator(
    app: &TestApp,
    method: reqwest::Method,
    path: &str,
    token: &str,
    body: Option<Value>,
) -> (reqwest::StatusCode, Value) {
    paygate::install_crypto_provider();
    let mut req = reqwest::Client::new().request(method, format!("{}{path}", app.base())).bearer_auth(token);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.expect("operator request");
    let status = resp.status();
    let text = resp.text().await.unwrap_or_default();
    (status, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

pub async fn approve(app: &TestApp, approval_id: &str, reviewer: &str) -> (reqwest::StatusCode, Value) {
    let token = app.operator_token(reviewer, "payments:approve");
    operator(
        app,
        reqwest::Method::POST,
        &format!("/approvals/{approval_id}/approve"),
        &token,
        Some(serde_json::json!({"reason": "ok"})),
    )
    .await
}

/// Start paygate with a TOML overlay (arrays such as `policy.profiles` replace the defaults whole).
pub async fn spawn_with_toml(dir: &Path, toml: &str, overrides: &[(&str, &str)], clock: Arc<dyn Clock>) -> TestApp {
    capture_logs();
    let file = dir.join("test-config.toml");
    std::fs::write(&file, toml).unwrap();
    let mut env = vec![
        ("PAYGATE_SERVER__BIND".to_string(), "127.0.0.1:0".to_string()),
        ("PAYGATE_STORAGE__DATA_DIR".to_string(), dir.display().to_string()),
        ("PAYGATE_AUTH__DEV_ISSUER".to_string(), DEV_ISSUER.to_string()),
    ];
    env.extend(overrides.iter().map(|(k, v)| (k.to_string(), v.to_string())));
    let config = Config::load(Some(&file), env).expect("test config");
    let running = paygate::app::start(config, clock).await.expect("paygate starts");
    let url = running.mcp_url();
    TestApp { running, url, data_dir: dir.to_path_buf(), minted: Mutex::new(Vec::new()) }
}

pub fn now_secs() -> i64 {
    SystemClock.now()
}

/// The real binary as a child process.
pub struct Proc {
    pub child: std::process::Child,
    pub url: String,
    pub token: String,
}

impl Proc {
    /// Own a child started elsewhere (killed and reaped on drop).
    pub fn adopt(child: std::process::Child) -> Proc {
        Proc { child, url: String::new(), token: String::new() }
    }

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Start `target/debug/paygate` bound to port 0 with `env`, and read its MCP URL and dev token
/// from stdout.
pub fn spawn_binary(env: &[(&str, &str)]) -> Proc {
    use std::io::BufRead;
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"));
    cmd.env("PAYGATE_SERVER__BIND", "127.0.0.1:0")
        .env("PAYGATE_AUTH__DEV_ISSUER", DEV_ISSUER)
        .env("PAYGATE_LOG", "warn")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut child = cmd.spawn().expect("paygate binary starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut url, mut token) = (None, None);
    while let Some(Ok(line)) = lines.next() {
        if let Some(u) = line.strip_prefix("paygate MCP endpoint: ") {
            url = url.or(Some(u.trim().to_string()));
        } else if let Some(addr) = line.strip_prefix("paygate listening on: ") {
            // Behind a public URL (a load balancer's), the replica itself is reached here.
            url = Some(format!("{}/mcp", addr.trim()));
        } else if line.starts_with("dev token") {
            token = lines.next().and_then(Result::ok);
            break;
        }
    }
    Proc { child, url: url.expect("MCP URL printed"), token: token.expect("dev token printed") }
}

/// A fresh schema for this test, dropped at the end.
pub struct Db {
    pub url: String,
    pub schema: String,
}

impl Drop for Db {
    fn drop(&mut self) {
        let (url, schema) = (self.url.clone(), self.schema.clone());
        let _ = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
            rt.block_on(async move {
                if let Ok((client, conn)) = tokio_postgres::connect(&url, tokio_postgres::NoTls).await {
                    tokio::spawn(conn);
                    let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
                }
            });
        })
        .join();
    }
}

pub fn database(test: &str) -> Option<Db> {
    match std::env::var("PAYGATE_TEST_DATABASE_URL") {
        Ok(url) if !url.is_empty() => Some(Db { url, schema: format!("r_{}", uuid::Uuid::new_v4().simple()) }),
        _ => {
            skipped(&format!("{test}: PAYGATE_TEST_DATABASE_URL is not set (PostgreSQL)"));
            None
        }
    }
}

/// A case that cannot run on this machine (a missing program, service or privilege): on a user's
/// machine it says SKIPPED and passes; on CI (`CI` set, as `.ci/run` does) it fails, naming what is
/// missing — a suite that cannot run fails CI, it never skips to green.
pub fn skipped(what: &str) {
    assert!(std::env::var_os("CI").is_none(), "{what}: cannot run, and CI requires it to (CI is set)");
    say(&format!("{what}; SKIPPED"));
}

/// A line on the terminal past the test harness's capture (`eprintln!` inside a passing test is
/// swallowed, so a skip would go unsaid on `cargo test`).
pub fn say(line: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "{line}");
}

/// The python of tests/python/.venv, with the pinned third-party libraries the tests check paygate
/// with (tests/python/requirements.txt), or `None` (the test says it SKIPPED) where python3 or the
/// package index is missing. On CI (`CI` set) a failed install fails the test instead.
pub fn python(test: &str) -> Option<PathBuf> {
    let root = env!("CARGO_MANIFEST_DIR");
    let out = std::process::Command::new("bash").arg(format!("{root}/tests/python/setup.sh")).output();
    match out {
        Ok(o) if o.status.success() => Some(PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())),
        other => {
            skipped(&format!("{test}: python3 with tests/python/requirements.txt is not available ({other:?})"));
            None
        }
    }
}

/// A gateway rail record as the store keeps it: a `submitting` KES payment of `amount_minor` from
/// `from` to `to` under `idempotency_key`, made by the dev agent for no one, on the `http` rail's
/// ledger flow at time 0. Tests that seed the store by hand change what they need with `..`.
pub fn rail_record(
    id: &paygate::domain::ids::PaymentId,
    idempotency_key: &str,
    from: &str,
    to: &str,
    amount_minor: i64,
) -> paygate::domain::rail::RailPayment {
    use paygate::domain::ids::AccountId;
    paygate::domain::rail::RailPayment {
        id: id.clone(),
        idempotency_key: idempotency_key.into(),
        rail: "http".into(),
        kind: paygate::domain::payment::PaymentKind::Payment,
        state: paygate::domain::rail::RailState::Submitting,
        from_account: AccountId::parse(from).unwrap(),
        to_account: AccountId::parse(to).unwrap(),
        amount_minor,
        currency: paygate::domain::money::Currency::parse("KES").unwrap(),
        refund_of: None,
        memo: None,
        principal_sub: "dev-agent".into(),
        principal_user: None,
        mandate_id: None,
        rail_ref: None,
        receipt: None,
        phone: None,
        reason: None,
        created_at: 0,
        updated_at: 0,
        flow: paygate::domain::rail::RailFlow::Ledger,
        family_key: None,
    }
}
