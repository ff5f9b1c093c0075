//! Load benchmark: the release binary on loopback, 64 connections, RS256 tokens from a JWKS,
//! every response body validated, the ledger checked after each scenario, and a bare axum
//! baseline measured in the same run so figures are also ratios to this machine's limit.
//!
//!   cargo build --release && target/release/paygate-bench [--secs 10] [--connections 64]
//!
//! PostgreSQL rows run when PAYGATE_BENCH_DATABASE_URL (or PAYGATE_TEST_DATABASE_URL) is set.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a benchmark, not a request path: a panic aborts the run

mod load;

use std::io::BufRead;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use jsonwebtoken::{Algorithm, EncodingKey, Header};
use serde_json::{Value, json};

const RSA_KEY: &str = include_str!("../../../tests/fixtures/rsa1.pem");
const ISSUER: &str = "https://bench.idp.test";
const KID: &str = "bench";

/// What the benchmark changes from the defaults, and why. Nothing weakens durability or checks.
/// Payer and payee accounts (and agents) of the "many payers" scenario: payments that share no row
/// lock and no budget, as when many customers pay many merchants.
const PAIRS: usize = 64;

const BENCH_CONFIG: &str = r#"
# Quotas and budgets raised so the limiter and the daily budget are not what is measured.
[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "bench"
subjects = ["bench-agent", "bench-agent-s0", "bench-agent-s1", "bench-agent-s2", "bench-agent-s3", "bench-agent-s4",
            "bench-agent-s5", "bench-agent-s6", "bench-agent-s7", "bench-agent-s8", "bench-agent-s9",
            "bench-agent-r0", "bench-agent-r1", "bench-agent-r2", "bench-agent-r3", "bench-agent-r4",
            "bench-agent-r5", "bench-agent-r6", "bench-agent-r7"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "100000000.00" }
daily_payments_max = 1000000
calls_per_minute = 100000
tool_calls_per_minute = {}

[stop_rules]
denials_max = 10000
repeat_max = 0

# A full integrity check of a ledger of 10M payments (`--growth`) takes longer than the default 30 s.
[server]
request_timeout_ms = 300000

# The over-limit scenario keeps one approval waiting per connection.
[approvals]
pending_per_agent_max = 1000

[ledger]
demo = true
[[ledger.accounts]]
id = "acct-A"
currency = "KES"
opening_balance = "100000000.00"
[[ledger.accounts]]
id = "acct-B"
currency = "KES"
opening_balance = "0.00"
"#;

/// BENCH_CONFIG plus the many-payers scenario's agents and accounts.
fn bench_config() -> String {
    let mut out = BENCH_CONFIG.to_string();
    let subjects: Vec<String> = (0..PAIRS).map(|i| format!("\"bench-agent-{i}\"")).collect();
    let accounts: Vec<String> = (0..PAIRS).flat_map(|i| [format!("\"acct-P{i}\""), format!("\"acct-Q{i}\"")]).collect();
    out.push_str(&format!(
        "\n[[policy.profiles]]\nname = \"bench-pairs\"\nsubjects = [{}]\nallowed_accounts = [{}]\n\
         autonomous_limit = {{ KES = \"1000.00\" }}\ndaily_limit = {{ KES = \"100000000.00\" }}\n\
         daily_payments_max = 1000000\ncalls_per_minute = 100000\ntool_calls_per_minute = {{}}\n",
        subjects.join(", "),
        accounts.join(", ")
    ));
    for i in 0..PAIRS {
        out.push_str(&format!(
            "[[ledger.accounts]]\nid = \"acct-P{i}\"\ncurrency = \"KES\"\nopening_balance = \"1000000.00\"\n\
             [[ledger.accounts]]\nid = \"acct-Q{i}\"\ncurrency = \"KES\"\nopening_balance = \"0.00\"\n"
        ));
    }
    out
}

/// Load benchmark of the release binary against a same-run bare-axum baseline; prints a table.
#[derive(clap::Parser)]
#[command(name = "paygate-bench")]
struct Args {
    /// Seconds per scenario (1 ..= 120).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=120))]
    secs: u64,
    /// Concurrent connections (1 ..= 1024).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1024))]
    connections: u64,
    /// Run only the paygate scenarios whose label contains this text (e.g. "unique"), and skip the
    /// baselines: for profiling one scenario (`perf record -p <paygate pid>`).
    #[arg(long)]
    only: Option<String>,
    /// Growth: for each N (comma-separated, e.g. 0,1000000), pre-load N payments through the
    /// store's own write path (no HTTP: payment, two postings, idempotency record and audit row
    /// each), then measure get_balance, unique payments and the integrity checks on that ledger;
    /// ratios are to the N = 0 row of the same run. Skips the usual table.
    #[arg(long, value_delimiter = ',')]
    growth: Vec<u64>,
    /// SQLite: the largest row's ledger lives in this directory, kept afterwards, instead of in the
    /// temporary one the smaller rows grow; a ledger an earlier run loaded there is reused (counted,
    /// then topped up to N), so a 10M row need not be pre-loaded again.
    #[arg(long)]
    growth_ledger: Option<std::path::PathBuf>,
    /// Sizes for the PostgreSQL rows when they differ from --growth (its pre-load is slower).
    #[arg(long, value_delimiter = ',')]
    growth_postgres: Vec<u64>,
    /// Which stores the growth rows run on (sqlite, postgres; postgres needs a database URL).
    #[arg(long, value_delimiter = ',', default_value = "sqlite,postgres")]
    stores: Vec<String>,
    /// Write path: N payments through the SQLite store's own write path on a fresh ledger (as
    /// `--growth` pre-loads them: keys claimed, payment, two postings, idempotency record and audit
    /// row each, by 64 concurrent writers, so the writer batches them as it does under load); prints
    /// this process's CPU, bytes written and ledger growth per payment. For comparing write sets
    /// (run it under `valgrind --tool=callgrind` for instruction counts).
    #[arg(long)]
    write_path: Option<u64>,
    /// Internal: run as the bare axum baseline server (the benchmark starts itself with this).
    #[arg(long, hide = true)]
    baseline_server: bool,
    /// Internal: run as the minimal Rust ledger baseline (axum + RS256 + SQLite group commit).
    #[arg(long, hide = true)]
    ledger_baseline_server: bool,
    /// PostgreSQL rows run when PAYGATE_BENCH_DATABASE_URL (or PAYGATE_TEST_DATABASE_URL) is set.
    #[arg(skip)]
    database_url: Option<String>,
}

fn args() -> Args {
    let mut a = <Args as clap::Parser>::parse();
    a.database_url = std::env::var("PAYGATE_BENCH_DATABASE_URL")
        .or_else(|_| std::env::var("PAYGATE_TEST_DATABASE_URL"))
        .ok()
        .filter(|u| !u.is_empty());
    a
}

/// The bench-only baseline: a fixed JSON-RPC result, no auth, no MCP, no database.
async fn baseline_server() {
    let app = axum::Router::new().route(
        "/mcp",
        axum::routing::post(|| async {
            axum::Json(
                json!({"jsonrpc": "2.0", "id": 1, "result": {"structuredContent": {"ok": true}, "isError": false}}),
            )
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    println!("baseline http://{}/mcp", listener.local_addr().expect("addr"));
    axum::serve(listener, app).await.expect("serve");
}

/// The same job as paygate with nothing else: one axum handler reading the JSON-RPC body itself,
/// an RS256 check of every token (no cache), and a SQLite ledger (WAL, `synchronous=FULL`) whose
/// writer thread commits each batch of waiting payments together, answering only after COMMIT.
/// It answers `get_balance` and `create_payment` in paygate's result shape, so the same load and
/// checks drive both: how far paygate's own layers (MCP, policy, audit, approvals) are from this.
mod minimal_ledger {
    use std::sync::{Arc, Mutex};

    use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Validation};
    use rusqlite::{Connection, OptionalExtension, params};
    use serde_json::{Value, json};

    type Reply = tokio::sync::oneshot::Sender<Result<(String, bool), String>>;
    struct Pay {
        key: String,
        from: String,
        to: String,
        minor: i64,
        reply: Reply,
    }

    fn open(path: &std::path::Path) -> Connection {
        let c = Connection::open(path).expect("open");
        c.execute_batch("PRAGMA journal_mode = WAL; PRAGMA synchronous = FULL; PRAGMA busy_timeout = 5000;")
            .expect("pragmas");
        c
    }

    /// Group commit: every payment waiting when a batch starts shares its COMMIT.
    fn writer(mut c: Connection, mut rx: tokio::sync::mpsc::Receiver<Pay>) {
        while let Some(first) = rx.blocking_recv() {
            let mut batch = vec![first];
            while batch.len() < 256 {
                match rx.try_recv() {
                    Ok(p) => batch.push(p),
                    Err(_) => break,
                }
            }
            let tx = c.transaction().expect("begin");
            let mut answers = Vec::with_capacity(batch.len());
            for p in batch {
                let answer = (|| -> Result<(String, bool), String> {
                    let e = |e: rusqlite::Error| e.to_string();
                    let found: Option<String> = tx
                        .query_row("SELECT id FROM payments WHERE key = ?1", [&p.key], |r| r.get(0))
                        .optional()
                        .map_err(e)?;
                    if let Some(id) = found {
                        return Ok((id, true));
                    }
                    let balance: i64 = tx
                        .query_row("SELECT balance FROM accounts WHERE id = ?1", [&p.from], |r| r.get(0))
                        .map_err(e)?;
                    if balance < p.minor {
                        return Err("insufficient funds".into());
                    }
                    let id = format!("pay_{}", uuid::Uuid::new_v4().simple());
                    tx.execute("UPDATE accounts SET balance = balance - ?1 WHERE id = ?2", params![p.minor, p.from])
                        .map_err(e)?;
                    tx.execute("UPDATE accounts SET balance = balance + ?1 WHERE id = ?2", params![p.minor, p.to])
                        .map_err(e)?;
                    tx.execute(
                        "INSERT INTO payments (key, id, from_account, to_account, amount) VALUES (?1, ?2, ?3, ?4, ?5)",
                        params![p.key, id, p.from, p.to, p.minor],
                    )
                    .map_err(e)?;
                    Ok((id, false))
                })();
                answers.push((p.reply, answer));
            }
            let committed = tx.commit().is_ok();
            for (reply, answer) in answers {
                let _ = reply.send(if committed { answer } else { Err("commit failed".into()) });
            }
        }
    }

    struct State {
        key: DecodingKey,
        validation: Validation,
        readers: Vec<Mutex<Connection>>,
        next: std::sync::atomic::AtomicUsize,
        writes: tokio::sync::mpsc::Sender<Pay>,
    }

    fn result(sc: Value) -> Value {
        json!({"jsonrpc": "2.0", "id": 1, "result": {"structuredContent": sc, "isError": false}})
    }

    async fn handle(
        axum::extract::State(s): axum::extract::State<Arc<State>>,
        headers: axum::http::HeaderMap,
        body: axum::body::Bytes,
    ) -> Result<axum::Json<Value>, axum::http::StatusCode> {
        let unauthorized = axum::http::StatusCode::UNAUTHORIZED;
        let token = headers
            .get("authorization")
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .ok_or(unauthorized)?;
        jsonwebtoken::decode::<Value>(token, &s.key, &s.validation).map_err(|_| unauthorized)?;
        let req: Value = serde_json::from_slice(&body).map_err(|_| axum::http::StatusCode::BAD_REQUEST)?;
        let args = &req["params"]["arguments"];
        match req["params"]["name"].as_str() {
            Some("get_balance") => {
                let account = args["account_id"].as_str().unwrap_or_default();
                let i = s.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % s.readers.len();
                let balance: i64 = s.readers[i]
                    .lock()
                    .unwrap()
                    .query_row("SELECT balance FROM accounts WHERE id = ?1", [account], |r| r.get(0))
                    .map_err(|_| axum::http::StatusCode::NOT_FOUND)?;
                Ok(axum::Json(result(json!({"account_id": account, "balance_minor": balance}))))
            }
            Some("create_payment") => {
                let minor = args["amount"]
                    .as_str()
                    .and_then(|a| {
                        paygate::domain::money::parse_minor(a, paygate::domain::money::Currency::parse("KES").ok()?)
                            .ok()
                    })
                    .ok_or(axum::http::StatusCode::BAD_REQUEST)?;
                let (reply, answer) = tokio::sync::oneshot::channel();
                let pay = Pay {
                    key: args["operation_id"].as_str().unwrap_or_default().to_string(),
                    from: args["from_account"].as_str().unwrap_or_default().to_string(),
                    to: args["to_account"].as_str().unwrap_or_default().to_string(),
                    minor,
                    reply,
                };
                s.writes.send(pay).await.map_err(|_| axum::http::StatusCode::SERVICE_UNAVAILABLE)?;
                match answer.await {
                    Ok(Ok((id, replayed))) => {
                        Ok(axum::Json(result(json!({"payment_id": id, "status": "succeeded", "replayed": replayed}))))
                    }
                    _ => Err(axum::http::StatusCode::CONFLICT),
                }
            }
            _ => Err(axum::http::StatusCode::NOT_FOUND),
        }
    }

    pub async fn serve(rsa_pem: &str, issuer: &str) {
        let dir = std::env::temp_dir().join(format!("paygate-bench-minimal-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        let path = dir.join("ledger.db");
        let c = open(&path);
        c.execute_batch(
            "CREATE TABLE accounts (id TEXT PRIMARY KEY, balance INTEGER NOT NULL);
             CREATE TABLE payments (key TEXT PRIMARY KEY, id TEXT NOT NULL UNIQUE, from_account TEXT NOT NULL,
                                    to_account TEXT NOT NULL, amount INTEGER NOT NULL);
             INSERT INTO accounts VALUES ('acct-A', 10000000000), ('acct-B', 0);",
        )
        .expect("schema");
        let (writes, rx) = tokio::sync::mpsc::channel(4096);
        std::thread::spawn(move || writer(c, rx));
        let enc = EncodingKey::from_rsa_pem(rsa_pem.as_bytes()).expect("rsa key");
        let jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&enc, Algorithm::RS256).expect("jwk");
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let url = format!("http://{}/mcp", listener.local_addr().expect("addr"));
        let mut validation = Validation::new(Algorithm::RS256);
        validation.set_issuer(&[issuer]);
        validation.set_audience(&[&url]);
        let state = Arc::new(State {
            key: DecodingKey::from_jwk(&jwk).expect("decoding key"),
            validation,
            readers: (0..2).map(|_| Mutex::new(open(&path))).collect(),
            next: Default::default(),
            writes,
        });
        let app = axum::Router::new().route("/mcp", axum::routing::post(handle)).with_state(state);
        println!("ledger {url}");
        axum::serve(listener, app).await.expect("serve");
    }

    /// The machine's durable commit rate: one row per transaction, one thread, WAL + FULL.
    pub fn fsync_probe(secs: f64) -> f64 {
        let dir = std::env::temp_dir().join(format!("paygate-bench-fsync-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).expect("dir");
        let c = open(&dir.join("probe.db"));
        c.execute_batch("CREATE TABLE t (n INTEGER NOT NULL)").expect("table");
        let started = std::time::Instant::now();
        let mut n = 0u64;
        while started.elapsed().as_secs_f64() < secs {
            c.execute("INSERT INTO t (n) VALUES (?1)", [n as i64]).expect("insert");
            n += 1;
        }
        let rate = n as f64 / started.elapsed().as_secs_f64();
        drop(c);
        let _ = std::fs::remove_dir_all(&dir);
        rate
    }
}

struct Server {
    child: Child,
    url: String,
    started: Duration,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Server {
    fn peak_rss_mb(&self) -> Option<f64> {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.child.id())).ok()?;
        let kb: f64 = status.lines().find(|l| l.starts_with("VmHWM:"))?.split_whitespace().nth(1)?.parse().ok()?;
        Some(kb / 1024.0)
    }
}

/// Start the paygate release binary next to this one and wait until it is ready.
fn start_paygate(data_dir: &std::path::Path, jwks_url: &str, database: Option<(&str, &str)>) -> Server {
    let exe = std::env::current_exe().expect("exe").with_file_name("paygate");
    let config = data_dir.join("bench.toml");
    std::fs::create_dir_all(data_dir).expect("data dir");
    std::fs::write(&config, bench_config()).expect("config");
    let mut cmd = Command::new(&exe);
    cmd.env("PAYGATE_CONFIG", &config)
        .env("PAYGATE_SERVER__BIND", "127.0.0.1:0")
        .env("PAYGATE_STORAGE__DATA_DIR", data_dir)
        .env("PAYGATE_AUTH__ISSUER", ISSUER)
        .env("PAYGATE_AUTH__JWKS_URL", jwks_url)
        .env("PAYGATE_AUTH__DEV_KEY_ENABLED", "false")
        .env("PAYGATE_DEV__PRINT_TOKEN", "false")
        .env("PAYGATE_LOG", "error")
        .stdout(Stdio::piped())
        .stderr(Stdio::null());
    if let Some((url, schema)) = database {
        cmd.env("PAYGATE_STORAGE__URL", url).env("PAYGATE_STORAGE__POSTGRES_SCHEMA", schema);
    }
    let t0 = Instant::now();
    let mut child =
        cmd.spawn().unwrap_or_else(|e| panic!("cannot start {}: {e} (run cargo build --release)", exe.display()));
    let stdout = child.stdout.take().expect("stdout");
    let mut url = None;
    for line in std::io::BufReader::new(stdout).lines().map_while(Result::ok) {
        if let Some(u) = line.strip_prefix("paygate MCP endpoint: ") {
            url = Some(u.trim().to_string());
            break;
        }
    }
    let url = url.expect("paygate printed its URL");
    let ready = url.replace("/mcp", "/readyz");
    let wait_until = Instant::now() + Duration::from_secs(30);
    while !probe::ready(&ready) {
        assert!(Instant::now() < wait_until, "paygate did not become ready");
        std::thread::sleep(Duration::from_millis(2));
    }
    Server { child, url, started: t0.elapsed() }
}

mod probe {
    /// A tiny synchronous readiness probe (no blocking client feature needed).
    pub fn ready(url: &str) -> bool {
        let Some(rest) = url.strip_prefix("http://") else { return false };
        let (host, path) = rest.split_once('/').unwrap_or((rest, ""));
        let Ok(mut s) = std::net::TcpStream::connect(host) else { return false };
        use std::io::{Read, Write};
        let _ = s.write_all(format!("GET /{path} HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n").as_bytes());
        let mut buf = [0u8; 16];
        matches!(s.read(&mut buf), Ok(n) if n >= 12 && &buf[9..12] == b"200")
    }
}

fn token_for(aud: &str, sub: &str) -> String {
    let key = EncodingKey::from_rsa_pem(RSA_KEY.as_bytes()).expect("rsa key");
    let mut header = Header::new(Algorithm::RS256);
    header.kid = Some(KID.into());
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("time").as_secs() as i64;
    let claims = json!({"iss": ISSUER, "sub": sub, "aud": aud, "iat": now, "exp": now + 3600,
                        "scope": "payments:read payments:create payments:integrity"});
    jsonwebtoken::encode(&header, &claims, &key).expect("sign")
}

async fn jwks_server() -> String {
    let key = EncodingKey::from_rsa_pem(RSA_KEY.as_bytes()).expect("rsa key");
    let mut jwk = jsonwebtoken::jwk::Jwk::from_encoding_key(&key, Algorithm::RS256).expect("jwk");
    jwk.common.key_id = Some(KID.into());
    let set = json!({"keys": [jwk]});
    let app = axum::Router::new().route("/jwks", axum::routing::get(move || async move { axum::Json(set.clone()) }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.expect("bind");
    let url = format!("http://{}/jwks", listener.local_addr().expect("addr"));
    tokio::spawn(async move { axum::serve(listener, app).await });
    url
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Era {
    Modern,
    Legacy,
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Scenario {
    Balance,
    UniquePayments,
    ManyPayers,
    RetryStorm,
    OverLimit,
    Baseline,
}

impl Scenario {
    fn label(self) -> &'static str {
        match self {
            Scenario::Balance => "get_balance",
            Scenario::UniquePayments => "create_payment (unique)",
            Scenario::ManyPayers => "create_payment (64 agents, 64 account pairs)",
            Scenario::RetryStorm => "retry storm (one op id)",
            Scenario::OverLimit => "over limit (APPROVAL_REQUIRED)",
            Scenario::Baseline => "bare axum baseline",
        }
    }
}

/// The first JSON-RPC message in a response body (plain JSON, or the SSE `data:` carrying a result).
fn jsonrpc(body: &str) -> Option<Value> {
    if body.trim_start().starts_with('{') {
        return serde_json::from_str(body).ok();
    }
    body.lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find(|v| v.get("result").is_some() || v.get("error").is_some())
}

struct Conn {
    http: ::reqwest::Client,
    url: String,
    token: String,
    era: Era,
    session: Option<String>,
    next_id: u64,
}

impl Conn {
    async fn post(&mut self, method: &str, name: Option<&str>, params: Value) -> Result<Value, String> {
        self.next_id += 1;
        let mut params = params;
        let mut req = self
            .http
            .post(&self.url)
            .bearer_auth(&self.token)
            .header("content-type", "application/json")
            .header("accept", "application/json, text/event-stream");
        match self.era {
            Era::Modern => {
                params["_meta"] = json!({"io.modelcontextprotocol/protocolVersion": "2026-07-28",
                                         "io.modelcontextprotocol/clientCapabilities": {}});
                req = req.header("mcp-protocol-version", "2026-07-28").header("mcp-method", method);
                if let Some(n) = name {
                    req = req.header("mcp-name", n);
                }
            }
            Era::Legacy => {
                req = req.header("mcp-protocol-version", "2025-11-25");
                if let Some(s) = &self.session {
                    req = req.header("mcp-session-id", s);
                }
            }
        }
        let body = json!({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params});
        let resp = req.json(&body).send().await.map_err(|e| e.to_string())?;
        if let Some(s) = resp.headers().get("mcp-session-id").and_then(|v| v.to_str().ok()) {
            self.session = Some(s.to_string());
        }
        let status = resp.status();
        let text = resp.text().await.map_err(|e| e.to_string())?;
        if !status.is_success() {
            return Err(format!("HTTP {status}"));
        }
        jsonrpc(&text).ok_or_else(|| "no JSON-RPC message".to_string())
    }

    async fn open(url: &str, token: &str, era: Era) -> Conn {
        let http = ::reqwest::Client::builder().pool_max_idle_per_host(1).build().expect("client");
        let mut c = Conn { http, url: url.into(), token: token.into(), era, session: None, next_id: 0 };
        if era == Era::Legacy {
            let init = json!({"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "bench", "version": "1"}});
            c.post("initialize", None, init).await.expect("initialize");
            let _ = c
                .http
                .post(&c.url)
                .bearer_auth(&c.token)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .header("mcp-protocol-version", "2025-11-25")
                .header("mcp-session-id", c.session.clone().unwrap_or_default())
                .body(r#"{"jsonrpc":"2.0","method":"notifications/initialized"}"#)
                .send()
                .await;
        }
        c
    }

    async fn call(&mut self, tool: &str, args: Value) -> Result<Value, String> {
        let v = self.post("tools/call", Some(tool), json!({"name": tool, "arguments": args})).await?;
        v.get("result").cloned().ok_or_else(|| format!("JSON-RPC error: {}", v["error"]))
    }
}

#[derive(Default)]
struct Outcome {
    ok: u64,
    errors: u64,
    latencies_us: Vec<u32>,
    first_error: Option<String>,
}

/// Validate one response for the scenario: a result, not an error, of the right shape.
fn check(s: Scenario, r: &Value) -> Result<(), String> {
    let sc = &r["structuredContent"];
    let good = match s {
        Scenario::Balance => r["isError"] != true && sc["account_id"] == "acct-A",
        Scenario::UniquePayments | Scenario::ManyPayers => {
            r["isError"] != true && sc["replayed"] == false && sc["status"] == "succeeded"
        }
        Scenario::RetryStorm => r["isError"] != true && sc["payment_id"].is_string(),
        Scenario::OverLimit => r["isError"] == true && sc["error"]["code"] == "APPROVAL_REQUIRED",
        Scenario::Baseline => sc["ok"] == true,
    };
    if good {
        Ok(())
    } else {
        Err(format!("unexpected result: {}", r.to_string().chars().take(200).collect::<String>()))
    }
}

async fn run(s: Scenario, url: &str, token: &str, era: Era, a: &Args, run_id: &str) -> (Outcome, f64) {
    let deadline = Instant::now() + Duration::from_secs(a.secs);
    let mut tasks = tokio::task::JoinSet::new();
    let started = Instant::now();
    for c in 0..a.connections as usize {
        let (url, token, run_id) = (url.to_string(), token.to_string(), run_id.to_string());
        tasks.spawn(async move {
            let mut out = Outcome::default();
            // Many payers: each connection is its own agent paying between its own two accounts.
            let token =
                if s == Scenario::ManyPayers { token_for(&url, &format!("bench-agent-{}", c % PAIRS)) } else { token };
            let mut conn = Conn::open(&url, &token, era).await;
            let mut n = 0u64;
            while Instant::now() < deadline {
                n += 1;
                let t = Instant::now();
                let result = match s {
                    Scenario::Baseline => {
                        conn.post("tools/call", Some("x"), json!({})).await.map(|v| v["result"].clone())
                    }
                    Scenario::Balance => conn.call("get_balance", json!({"account_id": "acct-A"})).await,
                    Scenario::UniquePayments => {
                        conn.call(
                            "create_payment",
                            json!({"operation_id": format!("{run_id}-{c}-{n}"), "from_account": "acct-A",
                                                       "to_account": "acct-B", "amount": "1.00", "currency": "KES"}),
                        )
                        .await
                    }
                    Scenario::ManyPayers => {
                        let i = c % PAIRS;
                        conn.call(
                            "create_payment",
                            json!({"operation_id": format!("{run_id}-{c}-{n}"), "from_account": format!("acct-P{i}"),
                                   "to_account": format!("acct-Q{i}"), "amount": "1.00", "currency": "KES"}),
                        )
                        .await
                    }
                    Scenario::RetryStorm => {
                        conn.call(
                            "create_payment",
                            json!({"operation_id": format!("{run_id}-storm"), "from_account": "acct-A",
                                                       "to_account": "acct-B", "amount": "1.00", "currency": "KES"}),
                        )
                        .await
                    }
                    // An agent retrying its over-limit call: the same approval answers every time.
                    Scenario::OverLimit => {
                        conn.call(
                            "create_payment",
                            json!({"operation_id": format!("{run_id}-big-{c}"), "from_account": "acct-A",
                                                       "to_account": "acct-B", "amount": "5000.00", "currency": "KES"}),
                        )
                        .await
                    }
                };
                let took = t.elapsed();
                match result.and_then(|r| check(s, &r)) {
                    Ok(()) => {
                        out.ok += 1;
                        out.latencies_us.push(took.as_micros().min(u32::MAX as u128) as u32);
                    }
                    Err(e) => {
                        out.errors += 1;
                        out.first_error.get_or_insert(e);
                    }
                }
            }
            out
        });
    }
    let mut total = Outcome::default();
    while let Some(r) = tasks.join_next().await {
        let o = r.expect("task");
        total.ok += o.ok;
        total.errors += o.errors;
        total.latencies_us.extend(o.latencies_us);
        if total.first_error.is_none() {
            total.first_error = o.first_error;
        }
    }
    (total, started.elapsed().as_secs_f64())
}

/// Agents a read scenario spreads its calls over (each agent's quota is at most 100,000 calls a
/// minute; a read scenario can ask for more).
const READ_AGENTS: usize = 4;

/// The tokens scenario `s` rotates through against `url`: the many-payers' 64 agents, a read
/// scenario's `READ_AGENTS` (its own agent first), or the scenario's one agent.
fn scenario_tokens(s: Scenario, url: &str, own: &str, readers: std::ops::Range<usize>) -> Vec<String> {
    match s {
        Scenario::ManyPayers => (0..PAIRS).map(|i| token_for(url, &format!("bench-agent-{i}"))).collect(),
        Scenario::Balance => std::iter::once(token_for(url, own))
            .chain(readers.take(READ_AGENTS - 1).map(|i| token_for(url, &format!("bench-agent-r{i}"))))
            .collect(),
        _ => vec![token_for(url, own)],
    }
}

/// Scenario `s` against `t`: by wrk when there is one, else by the in-process loop; the server's
/// CPU per request either way.
async fn measure(
    load: &load::Load,
    s: Scenario,
    t: &load::Target<'_>,
    era: Era,
    a: &Args,
    run_id: &str,
) -> load::Measured {
    if let Some(wrk) = &load.wrk {
        let mut sessions = Vec::new();
        let mut tokens = t.tokens.clone();
        if era == Era::Legacy {
            // A session per connection, as that many clients would hold (requests of one session
            // are one client's): the tokens repeat to fill them.
            tokens = (0..(a.connections as usize).max(t.tokens.len()))
                .map(|i| t.tokens[i % t.tokens.len()].clone())
                .collect();
            for tok in &tokens {
                sessions.push(Conn::open(t.url, tok, era).await.session.unwrap_or_default());
            }
        }
        let t = load::Target { url: t.url, pid: t.pid, tokens };
        return tokio::task::block_in_place(|| {
            load::run_wrk(wrk, s, era, &t, &sessions, (a.connections, a.secs), run_id)
        });
    }
    let server0 = t.pid.and_then(load::cpu_secs);
    let (o, secs) = run(s, t.url, &t.tokens[0], era, a, run_id).await;
    let server1 = t.pid.and_then(load::cpu_secs);
    let mut lat = o.latencies_us.clone();
    lat.sort_unstable();
    load::Measured {
        ok: o.ok,
        errors: o.errors,
        secs,
        p50_ms: percentile(&lat, 0.5),
        p99_ms: percentile(&lat, 0.99),
        first_error: o.first_error,
        server_cpu_ms: server0.zip(server1).map(|(x, y)| (y - x) * 1000.0 / (o.ok + o.errors).max(1) as f64),
        load_cores: None,
    }
}

/// A row's figures: rate, latency, server CPU per request, each beside its ratio to `reference`
/// when there is one (SQLite: the minimal ledger's same scenario; PostgreSQL payments: pgbench -N).
fn figures(m: &load::Measured, reference: Option<&load::Measured>) -> String {
    let ratio = |x: Option<f64>, y: Option<f64>| match (x, y) {
        (Some(x), Some(y)) if y > 0.0 => format!("{:.2}", x / y),
        _ => "-".into(),
    };
    let cpu = m.server_cpu_ms.map_or("-".into(), |c| format!("{c:.3}"));
    format!(
        "{:.0} | {} | {:.2} | {:.2} | {} | {} | {} | {}",
        m.rps(),
        ratio(Some(m.rps()), reference.map(load::Measured::rps)),
        m.p50_ms,
        m.p99_ms,
        cpu,
        ratio(m.server_cpu_ms, reference.and_then(|r| r.server_cpu_ms)),
        m.load_cores.map_or("-".into(), |c| format!("{c:.2}")),
        m.errors
    )
}

/// The table's header (`figures` fills a row).
const TABLE_HEAD: &str = "| store | era | scenario | ok/s | × reference | p50 ms | p99 ms | server CPU ms/req | × reference | load cores | errors | check |
|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|";

fn percentile(sorted: &[u32], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i] as f64 / 1000.0
}

async fn balance_b(url: &str, token: &str) -> f64 {
    let mut c = Conn::open(url, token, Era::Modern).await;
    let r = c.call("get_balance", json!({"account_id": "acct-B"})).await.expect("balance");
    r["structuredContent"]["balance"].as_str().and_then(|b| b.parse().ok()).expect("decimal balance")
}

/// What the scenario's payees hold, once the server has finished what was sent to it: wrk stops
/// with requests still running in the server, so the figure is read until two reads 200 ms apart
/// agree (at most 10 s).
async fn settled_payees(url: &str, token: &str, s: Scenario) -> f64 {
    let read =
        || async { balance_b(url, token).await + if s == Scenario::ManyPayers { payees_sum(url).await } else { 0.0 } };
    let mut last = read().await;
    for _ in 0..50 {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let now = read().await;
        if now == last {
            break;
        }
        last = now;
    }
    last
}

/// The many-payers scenario's payees, summed (each read by its own agent: allow-lists hold).
async fn payees_sum(url: &str) -> f64 {
    let mut sum = 0.0;
    for i in 0..PAIRS {
        let mut c = Conn::open(url, &token_for(url, &format!("bench-agent-{i}")), Era::Modern).await;
        let r = c.call("get_balance", json!({"account_id": format!("acct-Q{i}")})).await.expect("balance");
        sum += r["structuredContent"]["balance"].as_str().and_then(|b| b.parse::<f64>().ok()).expect("decimal balance");
    }
    sum
}

async fn integrity(url: &str, token: &str) -> bool {
    let mut c = Conn::open(url, token, Era::Modern).await;
    let r = c.call("check_ledger_integrity", json!({})).await.expect("integrity");
    r["structuredContent"]["ok"] == true
}

/// `pgbench -N` (TPC-B-like, without the branch and teller updates: one account update, one
/// history insert, per transaction) by as many clients as the bench has connections, on a scratch
/// database of the same server, scale 1: what this PostgreSQL commits of small write transactions,
/// measured in the same run as paygate's PostgreSQL rows. `None` without pgbench.
async fn pgbench_tps(url: &str, clients: u64, secs: u64) -> Option<f64> {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.ok()?;
    tokio::spawn(conn);
    let db = format!("paygate_pgbench_{}", uuid::Uuid::new_v4().simple());
    client.batch_execute(&format!("CREATE DATABASE {db}")).await.ok()?;
    // The same server, the scratch database (a URL's path names the database).
    let base = url.split('?').next().unwrap_or(url);
    let target = format!("{}/{db}", base.rsplit_once('/').map_or(base, |(server, _)| server));
    let quiet = |args: &[&str]| {
        Command::new("pgbench").args(args).arg(&target).stdout(Stdio::piped()).stderr(Stdio::piped()).output().ok()
    };
    let tps = quiet(&["-i", "-q", "-s", "1"]).filter(|o| o.status.success()).and_then(|_| {
        let (c, t) = (clients.to_string(), secs.to_string());
        let out = quiet(&["-N", "-c", &c, "-j", "2", "-T", &t])?;
        let text = String::from_utf8_lossy(&out.stdout).to_string();
        text.lines().find_map(|l| l.strip_prefix("tps = ")).and_then(|v| v.split_whitespace().next()?.parse().ok())
    });
    let _ = client.batch_execute(&format!("DROP DATABASE IF EXISTS {db}")).await;
    tps
}

/// PostgreSQL's commit round trip on this machine: one connection inserting one row per
/// transaction (autocommit, `synchronous_commit` as configured: on by default), in a throwaway
/// schema. Its inverse is the least time a posting holds its hot accounts' row locks, since their
/// COMMIT is inside that time: the floor under the hot-pair scenario.
async fn postgres_commit_probe(url: &str, secs: f64) -> f64 {
    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("postgres");
    tokio::spawn(conn);
    let schema = format!("bench_probe_{}", uuid::Uuid::new_v4().simple());
    client
        .batch_execute(&format!(
            "CREATE SCHEMA {schema}; CREATE TABLE {schema}.probe (id BIGSERIAL PRIMARY KEY, v INT NOT NULL)"
        ))
        .await
        .expect("probe table");
    let insert = client.prepare(&format!("INSERT INTO {schema}.probe (v) VALUES (1)")).await.expect("prepare");
    let started = std::time::Instant::now();
    let mut commits = 0u64;
    while started.elapsed().as_secs_f64() < secs {
        client.execute(&insert, &[]).await.expect("insert");
        commits += 1;
    }
    let rate = commits as f64 / started.elapsed().as_secs_f64();
    client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.expect("drop probe");
    rate
}

/// The machine's durable commit ceilings, `pgbench -N` (with a database), then the minimal Rust
/// ledger doing the same job: the references of paygate's rows (SQLite rows: the minimal ledger's
/// same scenario; PostgreSQL payments: pgbench -N).
async fn baselines(a: &Args, load: &load::Load) -> Vec<(&'static str, Scenario, load::Measured)> {
    let commits = minimal_ledger::fsync_probe(2.0);
    println!(
        "| sqlite | - | commit ceiling (1 row per commit, 1 thread, WAL + FULL) | {commits:.0} | - | - | - | - | - | - | 0 | - |"
    );
    let mut references = Vec::new();
    if let Some(url) = &a.database_url {
        let commits = postgres_commit_probe(url, 2.0).await;
        println!(
            "| postgres | - | commit ceiling (1 row per commit, 1 connection, synchronous_commit on) | {commits:.0} | - | - | - | - | - | - | 0 | - |"
        );
        match pgbench_tps(url, a.connections, a.secs).await {
            Some(tps) => {
                println!(
                    "| postgres | - | pgbench -N ({} clients, scale 1) | {tps:.0} | 1.00 | - | - | - | - | - | 0 | - |",
                    a.connections
                );
                let m = load::Measured { ok: tps.round() as u64, secs: 1.0, ..Default::default() };
                references.push(("postgres", Scenario::UniquePayments, m));
            }
            None => println!("| postgres | - | pgbench -N: not run (no pgbench) | - | - | - | - | - | - | - | - | - |"),
        }
    }
    let mut ledger = Command::new(std::env::current_exe().expect("exe"))
        .arg("--ledger-baseline-server")
        .stdout(Stdio::piped())
        .spawn()
        .expect("minimal ledger");
    let mut line = String::new();
    std::io::BufReader::new(ledger.stdout.take().expect("stdout")).read_line(&mut line).expect("ledger url");
    let ledger_url = line.trim().trim_start_matches("ledger ").to_string();
    for s in [Scenario::Balance, Scenario::UniquePayments, Scenario::RetryStorm] {
        let run_id = format!("minimal-{s:?}-{}", uuid::Uuid::new_v4().simple());
        let target = load::Target {
            url: &ledger_url,
            pid: Some(ledger.id()),
            tokens: scenario_tokens(s, &ledger_url, "bench-agent", 0..READ_AGENTS),
        };
        let m = measure(load, s, &target, Era::Modern, a, &run_id).await;
        println!("| sqlite | - | minimal Rust ledger: {} | {} | - |", s.label(), figures(&m, Some(&m)));
        references.push(("sqlite", s, m));
    }
    let _ = ledger.kill();
    let _ = ledger.wait();
    references
}

#[tokio::main]
async fn main() {
    let a = args();
    if a.baseline_server {
        baseline_server().await;
        return;
    }
    if a.ledger_baseline_server {
        minimal_ledger::serve(RSA_KEY, ISSUER).await;
        return;
    }
    paygate::install_crypto_provider();
    let jwks = jwks_server().await;
    if !a.growth.is_empty() {
        growth::run(&a, &jwks).await;
        return;
    }
    if let Some(n) = a.write_path {
        growth::write_path(&jwks, n).await;
        return;
    }
    let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
    println!(
        "paygate-bench: {} connections, {} s per scenario, {cores} cores, RS256 tokens from a JWKS",
        a.connections, a.secs
    );
    println!("durability: SQLite WAL + synchronous=FULL; PostgreSQL default (synchronous_commit on)");
    println!("changed from defaults: rate-limit quotas, daily budget and stop rule raised (see BENCH_CONFIG)");
    let load = load::Load::find();
    println!("{}\n", load.note);

    // Baseline in its own process, like paygate.
    let mut base = Command::new(std::env::current_exe().expect("exe"))
        .arg("--baseline-server")
        .stdout(Stdio::piped())
        .spawn()
        .expect("baseline");
    let mut line = String::new();
    std::io::BufReader::new(base.stdout.take().expect("stdout")).read_line(&mut line).expect("baseline url");
    let base_url = line.trim().trim_start_matches("baseline ").to_string();
    let target = load::Target { url: &base_url, pid: Some(base.id()), tokens: vec![String::new()] };
    let b = measure(&load, Scenario::Baseline, &target, Era::Modern, &a, "base").await;
    let _ = base.kill();
    let _ = base.wait();
    println!("{TABLE_HEAD}");
    println!("| - | - | {} | {} | - |", Scenario::Baseline.label(), figures(&b, None));

    let references = if let Some(only) = &a.only {
        println!("(only scenarios matching {only:?}; baselines skipped)");
        Vec::new()
    } else {
        baselines(&a, &load).await
    };
    // The minimal ledger's scenario each of paygate's compares with (many payers: unique payments).
    let reference = |engine: &str, s: Scenario| {
        let s = if s == Scenario::ManyPayers { Scenario::UniquePayments } else { s };
        references.iter().find(|(e, r, _)| *e == engine && *r == s).map(|(_, _, m)| m)
    };

    let mut engines: Vec<(&str, Option<(String, String)>)> = vec![("sqlite", None)];
    if let Some(url) = &a.database_url {
        engines.push(("postgres", Some((url.clone(), format!("bench_{}", uuid::Uuid::new_v4().simple())))));
    }
    let mut notes = Vec::new();
    for (engine, db) in &engines {
        let dir = std::env::temp_dir().join(format!("paygate-bench-{}", uuid::Uuid::new_v4().simple()));
        let database = db.as_ref().map(|(u, s)| (u.as_str(), s.as_str()));
        let first = start_paygate(&dir, &jwks, database);
        drop(first);
        // Start to ready on an existing database.
        let server = start_paygate(&dir, &jwks, database);
        notes.push(format!(
            "{engine}: start to ready on an existing database {:.0} ms",
            server.started.as_secs_f64() * 1000.0
        ));
        for (e, era) in [Era::Modern, Era::Legacy].into_iter().enumerate() {
            for (k, s) in [
                Scenario::Balance,
                Scenario::UniquePayments,
                Scenario::ManyPayers,
                Scenario::RetryStorm,
                Scenario::OverLimit,
            ]
            .into_iter()
            .enumerate()
            {
                if a.only.as_deref().is_some_and(|o| !s.label().contains(o)) {
                    continue;
                }
                // Each scenario is its own agent: one agent's per-minute quota (at most 100,000
                // calls) would otherwise be spent by the scenarios before it.
                let own = format!("bench-agent-s{}", e * 5 + k);
                let tok = token_for(&server.url, &own);
                let run_id = format!("{engine}-{era:?}-{s:?}-{}", uuid::Uuid::new_v4().simple());
                let before = settled_payees(&server.url, &tok, s).await;
                let readers = e * READ_AGENTS..(e + 1) * READ_AGENTS;
                let target = load::Target {
                    url: &server.url,
                    pid: Some(server.child.id()),
                    tokens: scenario_tokens(s, &server.url, &own, readers),
                };
                let o = measure(&load, s, &target, era, &a, &run_id).await;
                let after = settled_payees(&server.url, &tok, s).await;
                let moved = ((after - before) * 100.0).round() as u64;
                // wrk stops with a request in flight on each connection: those may have moved
                // money unanswered (the in-process loop waits for every answer).
                let unanswered = if load.wrk.is_some() { a.connections } else { 0 };
                let ledger_ok = match s {
                    Scenario::UniquePayments | Scenario::ManyPayers => {
                        moved >= o.ok * 100 && moved <= (o.ok + o.errors + unanswered) * 100
                    }
                    Scenario::RetryStorm => moved == 100,
                    _ => moved == 0,
                } && integrity(&server.url, &tok).await;
                println!(
                    "| {engine} | {} | {} | {} | {} |",
                    if era == Era::Modern { "2026-07-28" } else { "2025-11-25" },
                    s.label(),
                    figures(&o, reference(engine, s)),
                    if ledger_ok { "ledger ok" } else { "LEDGER MISMATCH" }
                );
                if let Some(e) = o.first_error {
                    notes.push(format!("{engine} {era:?} {}: first error: {e}", s.label()));
                }
            }
        }
        if let Some(mb) = server.peak_rss_mb() {
            notes.push(format!("{engine}: peak RSS {mb:.1} MB"));
        }
        drop(server);
        let _ = std::fs::remove_dir_all(&dir);
        if let Some((url, schema)) = db {
            // The run's schema holds only bench data: leave the database as it was.
            if let Ok((client, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await {
                tokio::spawn(conn);
                let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
            }
        }
    }
    println!();
    for n in notes {
        println!("- {n}");
    }
}

/// `--growth`: the same scenarios on ledgers of different sizes.
mod growth {
    use std::sync::Arc;
    use std::time::Instant;

    use paygate::domain::audit::AuditRecord;
    use paygate::domain::idempotency::NewIdempotencyRecord;
    use paygate::domain::ids::{AccountId, PaymentId};
    use paygate::domain::money::{Currency, Money};
    use paygate::domain::payment::{Attempt, Claim};
    use paygate::domain::payment::{Guards, TransferRequest};
    use paygate::store::Store;
    use serde_json::json;

    use super::{Args, Conn, Era, PAIRS, Scenario, percentile, start_paygate, token_for};

    /// Concurrent writers while pre-loading, each on its own account pair (no shared row lock); as
    /// many as the SQLite writer batches into one commit.
    const WRITERS: usize = super::PAIRS;

    struct Row {
        engine: &'static str,
        n: u64,
        payments: u64,
        db_mb: f64,
        preload_rate: f64,
        balance_rps: f64,
        unique_rps: f64,
        unique_p99: f64,
        full_ms: f64,
        catchup_ms: f64,
        catchup_postings: i64,
        incremental_ms: f64,
        incremental_postings: i64,
    }

    async fn open(engine: &str, dir: &std::path::Path, db: Option<(&str, &str)>) -> Arc<dyn Store> {
        match (engine, db) {
            ("postgres", Some((url, schema))) => {
                // The pre-load does not wait for each commit's WAL flush (this session only): it is
                // set-up, not a measurement, and the gateway that is measured keeps its own settings.
                let sep = if url.contains('?') { '&' } else { '?' };
                let url = format!("{url}{sep}options=-c%20synchronous_commit%3Doff");
                Arc::new(paygate::store::postgres::PostgresStore::connect(&url, schema).await.expect("postgres"))
            }
            _ => Arc::new(paygate::store::sqlite::SqliteStore::open(&dir.join("paygate.sqlite3")).expect("sqlite")),
        }
    }

    /// Payments in the SQLite ledger in `dir` (0 when there is none yet).
    fn count_payments(dir: &std::path::Path) -> u64 {
        rusqlite::Connection::open(dir.join("paygate.sqlite3"))
            .and_then(|c| c.query_row("SELECT COUNT(*) FROM payments", [], |r| r.get::<_, i64>(0)))
            .map_or(0, |n| n as u64)
    }

    /// N payments through `ledger_transfer`, as the gateway writes them (claim + audit in the posting
    /// transaction); payments/s.
    async fn preload(store: Arc<dyn Store>, already: u64, n: u64) -> f64 {
        let kes = Currency::parse("KES").unwrap();
        let t0 = Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for w in 0..WRITERS {
            let store = store.clone();
            let share = n / WRITERS as u64 + u64::from((w as u64) < n % WRITERS as u64);
            tasks.spawn(async move {
                let (from, to) = (format!("acct-P{}", w % PAIRS), format!("acct-Q{}", w % PAIRS));
                for i in 0..share {
                    let key = format!("idk_growth_{w}_{i}_{}", uuid::Uuid::new_v4().simple());
                    let now = 1_700_000_000 + (already / WRITERS as u64 + i) as i64;
                    let req = TransferRequest {
                        attempt: Attempt {
                            key: key.clone(),
                            alias_key: None,
                            family_key: None,
                            payment_id: PaymentId::generate(),
                            audit: Some(AuditRecord {
                                seq: 0,
                                at: now,
                                correlation_id: uuid::Uuid::new_v4().simple().to_string(),
                                principal_iss: super::ISSUER.into(),
                                principal_sub: format!("bench-agent-{w}"),
                                principal_user: None,
                                tool: "create_payment".into(),
                                decision: "allowed".into(),
                                code: None,
                                idempotency_key: Some(key.clone()),
                                payment_id: None,
                                approval_id: None,
                                detail: None,
                                repeats: 1,
                                policy_version: None,
                                intent: None,
                                // A writer's tag is 64 hex digits (the gateway's key is not here).
                                tag: Some("0".repeat(64)),
                            }),
                            claim: Some(Claim {
                                records: vec![NewIdempotencyRecord {
                                    key,
                                    fingerprint: "growth".into(),
                                    tool: "create_payment".into(),
                                    principal_iss: super::ISSUER.into(),
                                    principal_sub: format!("bench-agent-{w}"),
                                    lease_until: now + 30,
                                    // Far ahead: the records stay, as a busy gateway's would.
                                    expires_at: now + 10 * 365 * 86_400,
                                }],
                            }),
                        },
                        payment_id: PaymentId::generate(),
                        from_account: AccountId::parse(&from).unwrap(),
                        to_account: AccountId::parse(&to).unwrap(),
                        amount: Money::from_minor(1, kes).unwrap(),
                        memo: None,
                        principal_sub: format!("bench-agent-{w}"),
                        principal_user: None,
                        guards: Guards::default(),
                    };
                    store.ledger_transfer(req, now).await.expect("pre-load transfer");
                }
            });
        }
        tasks.join_all().await;
        n as f64 / t0.elapsed().as_secs_f64().max(1e-9)
    }

    async fn db_mb(engine: &str, dir: &std::path::Path, db: Option<(&str, &str)>) -> f64 {
        match (engine, db) {
            ("postgres", Some((url, schema))) => {
                let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("postgres");
                tokio::spawn(conn);
                let row = client
                    .query_one(
                        "SELECT COALESCE(SUM(pg_total_relation_size(c.oid)), 0)::BIGINT FROM pg_class c
                         JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relkind = 'r'",
                        &[&schema],
                    )
                    .await
                    .expect("size");
                row.get::<_, i64>(0) as f64 / 1e6
            }
            _ => ["paygate.sqlite3", "paygate.sqlite3-wal"]
                .iter()
                .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
                .map(|m| m.len() as f64 / 1e6)
                .sum(),
        }
    }

    /// Payments in the fixed delta the incremental check is timed on (two postings each).
    const DELTA_PAYMENTS: usize = 4_000;
    /// Deltas timed per row; the table shows the median.
    const DELTA_ROUNDS: usize = 3;

    /// DELTA_PAYMENTS payments through MCP, by as many connections as account pairs (one pair each).
    async fn write_delta(url: &str, run_id: &str) {
        let mut tasks = tokio::task::JoinSet::new();
        for c in 0..PAIRS {
            let (url, run_id) = (url.to_string(), run_id.to_string());
            tasks.spawn(async move {
                let mut conn = Conn::open(&url, &token_for(&url, &format!("bench-agent-{c}")), Era::Modern).await;
                for n in (c..DELTA_PAYMENTS).step_by(PAIRS) {
                    let r = conn
                        .call(
                            "create_payment",
                            json!({"operation_id": format!("{run_id}-delta-{n}"), "from_account": format!("acct-P{c}"),
                                   "to_account": format!("acct-Q{c}"), "amount": "1.00", "currency": "KES"}),
                        )
                        .await
                        .expect("delta payment");
                    assert_ne!(r["isError"], true, "delta payment refused: {r}");
                }
            });
        }
        tasks.join_all().await;
    }

    async fn timed_integrity(url: &str, token: &str, full: bool) -> (f64, i64) {
        let mut c = Conn::open(url, token, Era::Modern).await;
        let t0 = Instant::now();
        let r = c.call("check_ledger_integrity", json!({"full": full})).await.expect("integrity");
        let ms = t0.elapsed().as_secs_f64() * 1000.0;
        let sc = &r["structuredContent"];
        assert_eq!(sc["ok"], true, "integrity failed: {sc}");
        (ms, sc["postings_checked"].as_i64().unwrap_or(-1))
    }

    /// This process's CPU time so far (user + system, in seconds) and bytes it caused to be written
    /// to storage, from /proc.
    fn self_usage() -> (f64, u64) {
        let cpu = super::load::cpu_secs(std::process::id()).unwrap_or(0.0);
        let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
        let written =
            io.lines().find_map(|l| l.strip_prefix("write_bytes: ")).and_then(|v| v.trim().parse().ok()).unwrap_or(0);
        (cpu, written)
    }

    /// `--write-path N`: N payments through the SQLite store on a fresh ledger; per payment: CPU,
    /// bytes written, database growth.
    pub async fn write_path(jwks: &str, n: u64) {
        let dir = std::env::temp_dir().join(format!("paygate-write-path-{}", uuid::Uuid::new_v4().simple()));
        drop(start_paygate(&dir, jwks, None)); // migrations and demo accounts
        let store = open("sqlite", &dir, None).await;
        // A warm-up (statement caches, the first pages of every index), not counted.
        preload(store.clone(), 0, WRITERS as u64 * 4).await;
        let before_mb = db_mb("sqlite", &dir, None).await;
        let (cpu0, w0) = self_usage();
        let t0 = Instant::now();
        preload(store.clone(), WRITERS as u64 * 4, n).await;
        let wall = t0.elapsed().as_secs_f64();
        let (cpu1, w1) = self_usage();
        drop(store);
        let grown_mb = db_mb("sqlite", &dir, None).await - before_mb;
        let per = |x: f64| x / n.max(1) as f64;
        println!("paygate-bench --write-path {n}: SQLite, {WRITERS} writers through the store, WAL + synchronous=FULL");
        println!("| payments | payments/s | CPU µs/payment | KiB written/payment | DB+WAL growth KiB/payment |");
        println!("|---:|---:|---:|---:|---:|");
        println!(
            "| {n} | {:.0} | {:.1} | {:.1} | {:.2} |",
            n as f64 / wall,
            per((cpu1 - cpu0) * 1e6),
            per((w1 - w0) as f64 / 1024.0),
            per(grown_mb * 1e6 / 1024.0)
        );
        let _ = std::fs::remove_dir_all(&dir);
    }

    pub async fn run(a: &Args, jwks: &str) {
        println!(
            "paygate-bench --growth: {} connections, {} s per scenario, pre-load by {WRITERS} writers through the store",
            a.connections, a.secs
        );
        let mut engines: Vec<(&'static str, Option<String>)> = vec![("sqlite", None)];
        if let Some(url) = &a.database_url {
            engines.push(("postgres", Some(url.clone())));
        }
        engines.retain(|(e, _)| a.stores.iter().any(|s| s == e));
        let mut rows: Vec<Row> = Vec::new();
        for (engine, url) in &engines {
            let mut sizes =
                if *engine == "postgres" && !a.growth_postgres.is_empty() { &a.growth_postgres } else { &a.growth }
                    .clone();
            sizes.sort_unstable();
            sizes.dedup();
            // One ledger per engine that grows from row to row, as a real one does: the N = 1M row's
            // payments are still there at 10M.
            let temp = std::env::temp_dir().join(format!("paygate-growth-{}", uuid::Uuid::new_v4().simple()));
            let schema = format!("growth_{}", uuid::Uuid::new_v4().simple());
            let db = url.as_deref().map(|u| (u, schema.as_str()));
            drop(start_paygate(&temp, jwks, db)); // migrations and demo accounts
            // --growth-ledger: the largest row grows (or reuses) a kept SQLite ledger instead.
            let kept = a.growth_ledger.as_ref().filter(|_| *engine == "sqlite").map(|d| {
                drop(start_paygate(d, jwks, None));
                (d.clone(), count_payments(d))
            });
            let mut loaded = 0;
            for &n in &sizes {
                let (dir, already) = match &kept {
                    Some((d, count)) if n > 0 && Some(&n) == sizes.last() => (d.clone(), *count),
                    _ => (temp.clone(), loaded),
                };
                let store = open(engine, &dir, db).await;
                let preload_rate = if n > already { preload(store.clone(), already, n - already).await } else { 0.0 };
                loaded = already.max(n);
                if let Some((url, schema)) = db {
                    // What autovacuum has done to a ledger that grew over weeks: fresh planner
                    // statistics (a bulk load minutes ago has none, and the planner would scan
                    // everything) and a vacuumed heap. Left to itself, autovacuum would start on the
                    // million freshly inserted rows in the middle of the scenarios (its insert
                    // threshold), and the row would measure that.
                    let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("postgres");
                    tokio::spawn(conn);
                    // Two statements: VACUUM cannot run in the implicit transaction of a batch.
                    client.batch_execute(&format!("SET search_path TO {schema}")).await.expect("search_path");
                    client.batch_execute("VACUUM ANALYZE").await.expect("vacuum analyze");
                }
                // The full check, through the store (a request's timeout does not apply). It also
                // makes the checkpoint that the server's scheduled check and the incremental checks
                // below start from, as on a ledger whose scheduled job kept its checkpoint while it
                // grew. Without it, the server's first scheduled check would scan every posting
                // while the scenarios run (52 s at 10M: get_balance measured 0.15x).
                let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).expect("clock").as_secs();
                let t0 = Instant::now();
                let report = paygate::store::check_ledger(&*store, true, now as i64).await.expect("full check");
                let full_ms = t0.elapsed().as_secs_f64() * 1000.0;
                assert!(report.ok, "integrity failed: {:?}", report.problems);
                drop(store);
                let db_mb = db_mb(engine, &dir, db).await;
                let payments = match db {
                    Some((url, schema)) => {
                        let (client, conn) =
                            tokio_postgres::connect(url, tokio_postgres::NoTls).await.expect("postgres");
                        tokio::spawn(conn);
                        let q = format!("SELECT COUNT(*) FROM {schema}.payments");
                        client.query_one(&q, &[]).await.expect("count").get::<_, i64>(0) as u64
                    }
                    None => count_payments(&dir),
                };
                let server = start_paygate(&dir, jwks, db);
                let tok = |k: usize| token_for(&server.url, &format!("bench-agent-s{k}"));
                let run_id = format!("growth-{engine}-{n}-{}", uuid::Uuid::new_v4().simple());
                let (b, bs) = super::run(Scenario::Balance, &server.url, &tok(0), Era::Modern, a, &run_id).await;
                let (u, us) = super::run(Scenario::UniquePayments, &server.url, &tok(1), Era::Modern, a, &run_id).await;
                // Catching up with everything the scenarios wrote since the full check; then the check
                // the scheduled job keeps it to: a fixed delta of DELTA_PAYMENTS payments, the same at
                // every N, so the rows compare the ledger's size and nothing else.
                let (catchup_ms, catchup_postings) = timed_integrity(&server.url, &tok(9), false).await;
                let mut timed = Vec::new();
                for round in 0..DELTA_ROUNDS {
                    write_delta(&server.url, &format!("{run_id}-{round}")).await;
                    timed.push(timed_integrity(&server.url, &tok(9), false).await);
                }
                timed.sort_by(|x, y| x.0.total_cmp(&y.0));
                let (incremental_ms, incremental_postings) = timed[DELTA_ROUNDS / 2];
                let mut lat = u.latencies_us.clone();
                lat.sort_unstable();
                rows.push(Row {
                    engine,
                    n,
                    payments,
                    db_mb,
                    preload_rate,
                    balance_rps: b.ok as f64 / bs,
                    unique_rps: u.ok as f64 / us,
                    unique_p99: percentile(&lat, 0.99),
                    full_ms,
                    catchup_ms,
                    catchup_postings,
                    incremental_ms,
                    incremental_postings,
                });
                if b.errors + u.errors > 0 {
                    println!(
                        "- {engine} N={n}: {} errors; first: {:?}",
                        b.errors + u.errors,
                        b.first_error.or(u.first_error)
                    );
                }
                drop(server);
                print_rows(&rows);
            }
            let _ = std::fs::remove_dir_all(&temp);
            if let Some(url) = url
                && let Ok((client, conn)) = tokio_postgres::connect(url, tokio_postgres::NoTls).await
            {
                tokio::spawn(conn);
                let _ = client.batch_execute(&format!("DROP SCHEMA IF EXISTS {schema} CASCADE")).await;
            }
        }
        println!("\nfinal:");
        print_rows(&rows);
    }

    fn print_rows(rows: &[Row]) {
        println!(
            "| store | N pre-loaded | payments in ledger | db MB | pre-load/s | get_balance ok/s | × fresh | create_payment ok/s | × fresh | p99 ms | × fresh | integrity full ms | catch-up ms (postings) | incremental ms ({} postings, median of {DELTA_ROUNDS}) | × fresh |",
            DELTA_PAYMENTS * 2
        );
        println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
        for r in rows {
            let fresh = rows.iter().find(|f| f.engine == r.engine && f.n == 0);
            let ratio =
                |x: f64, f: Option<f64>| f.filter(|f| *f > 0.0).map_or("-".to_string(), |f| format!("{:.2}", x / f));
            println!(
                "| {} | {} | {} | {:.0} | {} | {:.0} | {} | {:.0} | {} | {:.1} | {} | {:.0} | {:.0} ({}) | {:.1}{} | {} |",
                r.engine,
                r.n,
                r.payments,
                r.db_mb,
                if r.preload_rate > 0.0 { format!("{:.0}", r.preload_rate) } else { "-".into() },
                r.balance_rps,
                ratio(r.balance_rps, fresh.map(|f| f.balance_rps)),
                r.unique_rps,
                ratio(r.unique_rps, fresh.map(|f| f.unique_rps)),
                r.unique_p99,
                ratio(r.unique_p99, fresh.map(|f| f.unique_p99)),
                r.full_ms,
                r.catchup_ms,
                r.catchup_postings,
                r.incremental_ms,
                // Says so if the delta read was not the fixed one (a posting from elsewhere).
                if r.incremental_postings == (DELTA_PAYMENTS * 2) as i64 {
                    String::new()
                } else {
                    format!(" ({} read)", r.incremental_postings)
                },
                ratio(r.incremental_ms, fresh.map(|f| f.incremental_ms)),
            );
        }
    }
}
