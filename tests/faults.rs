//! The fault suite (issue 33): three gateway replicas, each in its own network namespace, on one
//! PostgreSQL cluster the suite starts itself; concurrent clients record a Jepsen-style history
//! (invoke / ok / fail / unknown) while one fault at a time is injected for a bounded time; after
//! healing every client retries its unknowns until answered, and a checker compares the history
//! with the final database. See tests/faults/README.md.
//!
//! Needs root (network namespaces, `runuser`, `tc`); prints SKIPPED unless `PAYGATE_FAULTS=1` and
//! root. `.ci/run` runs it as root, and again on the build with `weaken-idempotency-for-evals`,
//! where the checker must report duplicates.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;
#[path = "common/wallet.rs"]
mod wallet;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use common::{Client, DEV_ISSUER, Era, try_connect};
use serde_json::{Value, json};

const ROOT: &str = "/tmp/paygate-faults";
const BRIDGE: &str = "pgf-br0";
/// The clients' address (the bridge's primary one) and PostgreSQL's (a second one on the bridge).
const HOST_ADDR: &str = "10.77.0.1";
const PG_ADDR: &str = "10.77.0.2";
const PG_PORT: u16 = 55432;
const REPLICAS: usize = 3;
const SCHEMA: &str = "faults";
/// The ledger service (`paygate ledger-serve`, backend `http`): its own namespace and address.
const LEDGER_NS: &str = "pgf-l";
const LEDGER_ADDR: &str = "10.77.0.20";
const LEDGER_PORT: u16 = 8090;
const LEDGER_SCHEMA: &str = "ledger";
const LEDGER_CREDENTIAL: &str = "fault-suite-ledger-credential";
/// The wallet service's fake (tests/common/wallet.rs), served by this process on the bridge's
/// host address: the replicas reach it over their veths, and the faults cut their side.
const WALLET_PORT: u16 = 18090;
/// `paygate rail-simulator --rail mpesa` listens in the backend's namespace (the ledger's), here.
const RAIL_PORT: u16 = 8091;
const RAIL_CONTROL_TOKEN: &str = "fault-suite-rail-control-token";
/// Daraja's credentials, the same on the replicas and the simulator (which checks them).
const MPESA_ENV: [(&str, &str); 9] = [
    ("PAYGATE_MPESA__ENABLED", "true"),
    ("PAYGATE_MPESA__ENVIRONMENT", "sandbox"),
    ("PAYGATE_MPESA__CONSUMER_KEY", "fault-suite-consumer-key"),
    ("PAYGATE_MPESA__CONSUMER_SECRET", "fault-suite-consumer-secret"),
    ("PAYGATE_MPESA__SHORT_CODE", "174379"),
    ("PAYGATE_MPESA__PASSKEY", "fault-suite-passkey"),
    ("PAYGATE_MPESA__INITIATOR_NAME", "fault-suite-initiator"),
    ("PAYGATE_MPESA__SECURITY_CREDENTIAL", "fault-suite-security-credential"),
    ("PAYGATE_MPESA__CALLBACK_SECRET", "fault-suite-callback-secret-0123456789"),
];
/// The replicas' and the Airtel simulator's `[airtel]` (disbursements: the PIN, sealed for the
/// simulator's key; the replicas get the key's public half).
const AIRTEL_ENV: [(&str, &str); 6] = [
    ("PAYGATE_AIRTEL__ENABLED", "true"),
    ("PAYGATE_AIRTEL__ENVIRONMENT", "uat"),
    ("PAYGATE_AIRTEL__CLIENT_ID", "fault-suite-airtel-client"),
    ("PAYGATE_AIRTEL__CLIENT_SECRET", "fault-suite-airtel-secret"),
    ("PAYGATE_AIRTEL__CALLBACK_SECRET", "fault-suite-airtel-callback-secret-0123"),
    ("PAYGATE_AIRTEL__DISBURSEMENT_PIN", "4321"),
];
const AIRTEL_PUBLIC_KEY_PEM: &str = include_str!("fixtures/rsa1.pub.pem");
const AIRTEL_PRIVATE_KEY_PEM: &str = include_str!("fixtures/rsa1.pem");
/// Short, so a pause or a partition outlives an in-flight claim.
const LEASE_SECS: u64 = 2;
const WAIT_MS_MAX: u64 = 1500;
/// Each of a racing pair of partial refunds of a 1.00 payment: both cannot fit.
const REFUND: &str = "0.60";
/// A call not answered within this is `unknown`.
const CALL_TIMEOUT: Duration = Duration::from_secs(4);
const CLIENTS: usize = 6;
/// Load per fault kind; the fault starts at FAULT_AT and is healed FAULT_FOR later.
const LOAD: Duration = Duration::from_secs(12);
const FAULT_AT: Duration = Duration::from_secs(2);
const FAULT_FOR: Duration = Duration::from_secs(8);
const RESOLVE_FOR: Duration = Duration::from_secs(40);
/// An external backend's open gateway records (answer lost, or not recorded) untouched this long
/// are asked about by the poll job (every second here)...
const SETTLE_AFTER_SECS: u64 = 3;
/// ... and every one is settled within this bound after the clients' resolution.
const SETTLE_WITHIN: Duration = Duration::from_secs(30);
const DEV_KEY: &str = "ZmF1bHQtc3VpdGUtZGV2LWtleS0zMi1ieXRlcyEhISE=";
const FAKETIME_LIB: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

const CONFIG: &str = r#"
[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "100000.00" }
daily_payments_max = 100000
calls_per_minute = 100000
tool_calls_per_minute = {}

[stop_rules]
denials_max = 10000
repeat_max = 0
"#;

/// Codes that say nothing about whether the operation happened: the client retries them.
const TRANSIENT: [&str; 6] =
    ["OPERATION_IN_PROGRESS", "BACKEND_UNAVAILABLE", "OUTCOME_UNKNOWN", "INTERNAL", "TIMEOUT", "RATE_LIMITED"];

fn sh(cmd: &str) -> bool {
    Command::new("bash")
        .arg("-c")
        .arg(cmd)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

fn must(cmd: &str) {
    let o = Command::new("bash").arg("-c").arg(cmd).output().unwrap();
    assert!(
        o.status.success(),
        "`{cmd}` failed: {}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
}

fn ns(i: usize) -> String {
    format!("pgf-r{i}")
}

fn replica_addr(i: usize) -> String {
    format!("10.77.0.{}", 10 + i)
}

fn pg_url() -> String {
    format!("postgres://postgres@{PG_ADDR}:{PG_PORT}/postgres")
}

fn pg_ctl(args: &str) -> String {
    format!("runuser -u postgres -- /usr/lib/postgresql/15/bin/pg_ctl -D {ROOT}/pg -l {ROOT}/pg.log {args}")
}

/// Everything a previous run may have left: replicas, PostgreSQL, rules, namespaces, the bridge.
fn clean() {
    for i in 0..REPLICAS {
        // The replicas of an earlier run, by the pids of their namespace.
        sh(&format!("for p in $(ip netns pids {} 2>/dev/null); do kill -9 $p; done", ns(i)));
        sh(&format!("ip netns del {}", ns(i)));
        sh(&format!("ip rule del pref {}", 7700 + i));
    }
    sh(&format!("for p in $(ip netns pids {LEDGER_NS} 2>/dev/null); do kill -9 $p; done"));
    sh(&format!("ip netns del {LEDGER_NS}"));
    if Path::new(&format!("{ROOT}/pg/postmaster.pid")).exists() {
        sh(&pg_ctl("stop -m immediate -w"));
    }
    sh(&format!("ip link del {BRIDGE}"));
    let _ = std::fs::remove_dir_all(ROOT);
}

/// Cleans up at the end, whatever happened.
struct Lab {
    replicas: Vec<Option<Child>>,
    service: Option<Child>,
}

impl Drop for Lab {
    fn drop(&mut self) {
        self.stop();
        // The replicas', the ledger service's and PostgreSQL's logs outlive the run, next to the histories.
        let keep = std::env::temp_dir().join("paygate-faults-history");
        let _ = std::fs::create_dir_all(&keep);
        for f in ["r0.log", "r1.log", "r2.log", "ledger.log", "rail.log", "pg.log"] {
            let _ = std::fs::copy(format!("{ROOT}/{f}"), keep.join(f));
        }
        clean();
    }
}

impl Lab {
    /// Stops the replicas and the backend's service: the ledger service or the rail simulator
    /// (between backends, and at the end).
    fn stop(&mut self) {
        for c in self.replicas.iter_mut().chain(std::iter::once(&mut self.service)).filter_map(Option::take) {
            let mut c = c;
            let _ = nix_kill(c.id(), "CONT");
            let _ = c.kill();
            let _ = c.wait();
        }
        self.replicas.clear();
    }
}

fn nix_kill(pid: u32, sig: &str) -> bool {
    sh(&format!("kill -{sig} {pid}"))
}

fn network() {
    must(&format!("ip link add {BRIDGE} type bridge && ip addr add {HOST_ADDR}/24 dev {BRIDGE}"));
    must(&format!("ip addr add {PG_ADDR}/24 dev {BRIDGE} && ip link set {BRIDGE} up"));
    for i in 0..REPLICAS {
        let (n, a) = (ns(i), replica_addr(i));
        must(&format!("ip netns add {n} && ip -n {n} link set lo up"));
        must(&format!("ip link add pgf-h{i} type veth peer name pgf-n{i} && ip link set pgf-n{i} netns {n}"));
        must(&format!("ip link set pgf-h{i} master {BRIDGE} && ip link set pgf-h{i} up"));
        must(&format!("ip -n {n} addr add {a}/24 dev pgf-n{i} && ip -n {n} link set pgf-n{i} up"));
    }
    let n = LEDGER_NS;
    must(&format!("ip netns add {n} && ip -n {n} link set lo up"));
    must(&format!("ip link add pgf-hl type veth peer name pgf-nl && ip link set pgf-nl netns {n}"));
    must(&format!("ip link set pgf-hl master {BRIDGE} && ip link set pgf-hl up"));
    must(&format!("ip -n {n} addr add {LEDGER_ADDR}/24 dev pgf-nl && ip -n {n} link set pgf-nl up"));
}

fn postgres() {
    must(&format!("mkdir -p {ROOT}/pg && chown postgres {ROOT} {ROOT}/pg && chmod 700 {ROOT}/pg"));
    must(&format!(
        "runuser -u postgres -- /usr/lib/postgresql/15/bin/initdb -D {ROOT}/pg -A trust -U postgres --no-sync >/dev/null"
    ));
    let conf = format!(
        "listen_addresses = '{PG_ADDR}'\nport = {PG_PORT}\nunix_socket_directories = '{ROOT}/pg'\nmax_connections = 300\n"
    );
    must(&format!("cat >> {ROOT}/pg/postgresql.conf <<'EOF'\n{conf}EOF"));
    must(&format!("echo 'host all all 10.77.0.0/24 trust' >> {ROOT}/pg/pg_hba.conf"));
    must(&pg_ctl("-w start"));
}

/// Installs a Debian package when `present` says it is missing: the pinned version (bookworm's)
/// first, any version if that one is gone from the mirror, after an `apt-get update` if needed.
fn apt_install(pinned: &str, present: &dyn Fn() -> bool) -> bool {
    if present() {
        return true;
    }
    let name = pinned.split('=').next().unwrap();
    let install =
        |p: &str| sh(&format!("DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends {p}"));
    let _ = install(pinned) || install(name) || (sh("apt-get update -q") && (install(pinned) || install(name)));
    present()
}

/// libfaketime from Debian, for the clock step; `None` (that fault kind says SKIPPED) without it.
fn faketime() -> Option<()> {
    apt_install("libfaketime=0.9.10-2.1", &|| Path::new(FAKETIME_LIB).exists()).then_some(())
}

/// iptables from Debian (the nf_tables backend), for the partitions; without it a replica ↔
/// PostgreSQL partition falls back to blackhole routing rules and the replica ↔ clients one is
/// skipped.
fn iptables() -> bool {
    apt_install("iptables=1.8.9-2", &|| sh("iptables -V"))
}

/// Where the replicas move money: each backend runs the faults that reach it.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Backend {
    /// The embedded reference ledger, in the gateway's own PostgreSQL schema.
    Embedded,
    /// `backend.kind = "http"`: `paygate ledger-serve` in its own namespace, on its own schema of
    /// the same cluster; the gateway keeps its own record (`rail_payments`) of what it sent.
    Http,
    /// `backend.kind = "wallet-service"`: the wallet service's fake (its saga settles at once), on
    /// the host's bridge address; the gateway keeps its own record, and the service names its
    /// payments (the record's `rail_ref`).
    Wallet,
    /// M-Pesa payouts (`send_mpesa_payout`) to `paygate rail-simulator --rail mpesa` in the
    /// backend's namespace, which answers every payout itself (`--auto accept`) with Daraja's
    /// result posted to the replica that sent it; the gateway keeps its record (`rail_payments`,
    /// its id the payout's OriginatorConversationID), and the simulator's records view is what
    /// the rail did. Daraja has no idempotency key: a payout sent twice is paid twice.
    Mpesa,
    /// Airtel Money disbursements (`send_airtel_payout`) to `paygate rail-simulator --rail airtel`
    /// in the backend's namespace (`--auto accept`: each is paid 200 ms after it arrives; Airtel
    /// posts no result for a disbursement, so the poll job's enquiry settles it). The transaction
    /// id is the gateway record's id; the simulator's records view is what the rail did.
    Airtel,
}

impl Backend {
    fn name(self) -> &'static str {
        match self {
            Backend::Embedded => "embedded",
            Backend::Http => "http",
            Backend::Wallet => "wallet",
            Backend::Mpesa => "mpesa",
            Backend::Airtel => "airtel",
        }
    }
    /// A rail's payouts to `paygate rail-simulator` (M-Pesa, Airtel), not a ledger's payments.
    fn is_rail(self) -> bool {
        matches!(self, Backend::Mpesa | Backend::Airtel)
    }
    /// Whether the workload refunds (the wallet fake's refunds are not read back by the checker).
    fn refunds(self) -> bool {
        self != Backend::Wallet && !self.is_rail()
    }
    /// The gateway replicas' schema.
    fn schema(self) -> &'static str {
        match self {
            Backend::Embedded => SCHEMA,
            Backend::Http => "faults_http",
            Backend::Wallet => "faults_wallet",
            Backend::Mpesa => "faults_mpesa",
            Backend::Airtel => "faults_airtel",
        }
    }
    /// Where the payments the backend made are: its own records, not the gateway's (the wallet
    /// fake's are in this process).
    fn money_schema(self) -> &'static str {
        match self {
            Backend::Embedded => SCHEMA,
            Backend::Http | Backend::Wallet | Backend::Mpesa | Backend::Airtel => LEDGER_SCHEMA,
        }
    }
    /// The claim lease: short, so a pause or a partition outlives an in-flight claim; over http it
    /// must also outlast one request to the ledger (config: (retries + 1) × (timeout + 1 s)).
    fn lease_secs(self) -> u64 {
        match self {
            Backend::Embedded => LEASE_SECS,
            Backend::Http | Backend::Wallet | Backend::Mpesa | Backend::Airtel => LEASE_SECS + 1,
        }
    }
    /// The replicas' config file: the payouts' account is allowed on M-Pesa only (the wallet
    /// service refuses a profile naming an account it has no UUID for).
    fn config(self) -> String {
        match self {
            Backend::Mpesa => CONFIG.replace(r#"["acct-A", "acct-B"]"#, r#"["acct-A", "acct-B", "mpesa-collections"]"#),
            Backend::Airtel => {
                CONFIG.replace(r#"["acct-A", "acct-B"]"#, r#"["acct-A", "acct-B", "airtel-collections"]"#)
            }
            _ => CONFIG.to_string(),
        }
    }
    fn faults(self) -> Vec<Fault> {
        match self {
            Backend::Embedded => vec![
                Fault::Partition,
                Fault::PartitionClients,
                Fault::PgRestart,
                Fault::Pause,
                Fault::Kill,
                Fault::Degrade,
                Fault::ClockStep,
            ],
            Backend::Http => vec![
                Fault::PartitionLedger,
                Fault::AnswersLost,
                Fault::LedgerDegrade,
                Fault::LedgerKill,
                Fault::Kill,
                Fault::Pause,
                Fault::PgRestart,
            ],
            Backend::Wallet => {
                vec![Fault::PartitionWallet, Fault::WalletAnswersLost, Fault::Kill, Fault::Pause, Fault::PgRestart]
            }
            Backend::Mpesa | Backend::Airtel => vec![
                Fault::PartitionRail,
                Fault::RailAnswersLost,
                Fault::RailDegrade,
                Fault::Kill,
                Fault::Pause,
                Fault::PgRestart,
            ],
        }
    }
}

/// Replica `i` in its namespace, bound on its veth address; returns it with its MCP URL and dev
/// token (read from its stdout). The last replica runs under libfaketime when it is present.
fn spawn_replica(i: usize, clock: bool, backend: Backend) -> (Child, String, String) {
    use std::io::BufRead;
    let data = format!("{ROOT}/{}-r{i}", backend.name());
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(format!("{ROOT}/config.toml"), backend.config()).unwrap();
    let log = std::fs::OpenOptions::new().create(true).append(true).open(format!("{ROOT}/r{i}.log")).unwrap();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &ns(i), &format!("{ROOT}/paygate")])
        .env("PAYGATE_SERVER__BIND", format!("{}:8080", replica_addr(i)))
        .env("PAYGATE_SERVER__PUBLIC_URL", "http://127.0.0.1:9")
        .env("PAYGATE_AUTH__DEV_ISSUER", DEV_ISSUER)
        .env("PAYGATE_AUTH__DEV_KEY", DEV_KEY)
        .env("PAYGATE_IDEMPOTENCY__SECRET", "ZmF1bHQtc3VpdGUtaWRlbXBvdGVuY3ktc2VjcmV0IQ==")
        .env("PAYGATE_MANDATES__SECRET", "ZmF1bHQtc3VpdGUtbWFuZGF0ZS1zaWduaW5nLWtleSE=")
        .env("PAYGATE_DEV__SCOPES", "payments:read payments:create payments:refund")
        .env("PAYGATE_IDEMPOTENCY__LEASE_SECS", backend.lease_secs().to_string())
        .env("PAYGATE_IDEMPOTENCY__WAIT_MS_MAX", WAIT_MS_MAX.to_string())
        .env("PAYGATE_CONFIG", format!("{ROOT}/config.toml"))
        .env("PAYGATE_STORAGE__URL", pg_url())
        .env("PAYGATE_STORAGE__POSTGRES_SCHEMA", backend.schema())
        .env("PAYGATE_STORAGE__DATA_DIR", &data)
        .env("PAYGATE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log);
    if backend == Backend::Http {
        // One try per call, bounded well under the lease; the breaker reopens quickly after a fault.
        cmd.env("PAYGATE_BACKEND__KIND", "http")
            .env("PAYGATE_BACKEND__HTTP_URL", format!("http://{LEDGER_ADDR}:{LEDGER_PORT}"))
            .env("PAYGATE_BACKEND__HTTP_CREDENTIAL", LEDGER_CREDENTIAL)
            .env("PAYGATE_BACKEND__HTTP_CONNECT_TIMEOUT_MS", "500")
            .env("PAYGATE_BACKEND__HTTP_REQUEST_TIMEOUT_MS", "1500")
            .env("PAYGATE_BACKEND__HTTP_RETRIES_MAX", "0")
            .env("PAYGATE_BACKEND__HTTP_BREAKER_OPEN_MS", "2000")
            // A record left open (its answer lost, or not recorded) that no retry settles is
            // settled from the ledger's word by the poll job: within a few seconds here.
            .env("PAYGATE_JOBS__MPESA_POLL_EVERY_SECS", "1")
            .env("PAYGATE_MPESA__QUERY_AFTER_SECS", SETTLE_AFTER_SECS.to_string());
    }
    if backend == Backend::Wallet {
        cmd.env("PAYGATE_BACKEND__KIND", "wallet-service")
            .env("PAYGATE_BACKEND__HTTP_URL", format!("http://{HOST_ADDR}:{WALLET_PORT}"))
            .env("PAYGATE_BACKEND__WALLET_MERCHANT_ID", wallet::MERCHANT)
            .env("PAYGATE_BACKEND__WALLET_ACCOUNTS", wallet::accounts_toml())
            .env("PAYGATE_BACKEND__HTTP_CONNECT_TIMEOUT_MS", "500")
            .env("PAYGATE_BACKEND__HTTP_REQUEST_TIMEOUT_MS", "1500")
            .env("PAYGATE_BACKEND__HTTP_RETRIES_MAX", "0")
            .env("PAYGATE_BACKEND__HTTP_BREAKER_OPEN_MS", "2000");
    }
    if backend == Backend::Mpesa {
        // One try per request, bounded well under the lease; Daraja's results come back to this
        // replica, and a payout whose result never arrived is asked about by the poll job.
        cmd.envs(MPESA_ENV)
            .env("PAYGATE_DEV__SCOPES", "payments:read payments:payout")
            .env("PAYGATE_MPESA__BASE_URL", format!("http://{LEDGER_ADDR}:{RAIL_PORT}"))
            .env("PAYGATE_MPESA__CALLBACK_BASE_URL", format!("http://{}:8080", replica_addr(i)))
            .env("PAYGATE_MPESA__REQUEST_TIMEOUT_MS", "500")
            .env("PAYGATE_MPESA__RETRIES_MAX", "0")
            // A killed replica holds the poll job's lease until it ends: short here, so another
            // replica's status queries settle the payouts it left open within the resolution.
            .env("PAYGATE_JOBS__LEASE_SECS", "5")
            .env("PAYGATE_JOBS__MPESA_POLL_EVERY_SECS", "1")
            .env("PAYGATE_MPESA__QUERY_AFTER_SECS", SETTLE_AFTER_SECS.to_string());
    }
    if backend == Backend::Airtel {
        // As on M-Pesa: one try per request, bounded well under the lease; a disbursement's
        // outcome comes from the poll job's enquiry (Airtel posts none for it).
        cmd.envs(AIRTEL_ENV)
            .env("PAYGATE_AIRTEL__PUBLIC_KEY", AIRTEL_PUBLIC_KEY_PEM)
            .env("PAYGATE_DEV__SCOPES", "payments:read payments:payout")
            .env("PAYGATE_AIRTEL__BASE_URL", format!("http://{LEDGER_ADDR}:{RAIL_PORT}"))
            .env("PAYGATE_AIRTEL__REQUEST_TIMEOUT_MS", "500")
            .env("PAYGATE_AIRTEL__RETRIES_MAX", "0")
            .env("PAYGATE_JOBS__LEASE_SECS", "5")
            .env("PAYGATE_JOBS__MPESA_POLL_EVERY_SECS", "1")
            .env("PAYGATE_AIRTEL__QUERY_AFTER_SECS", SETTLE_AFTER_SECS.to_string());
    }
    if clock {
        cmd.env("LD_PRELOAD", FAKETIME_LIB)
            .env("FAKETIME_TIMESTAMP_FILE", format!("{ROOT}/faketime"))
            .env("FAKETIME_NO_CACHE", "1")
            .env("FAKETIME_DONT_FAKE_MONOTONIC", "1");
    }
    let mut child = cmd.spawn().expect("paygate starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut url, mut token) = (None, None);
    while let Some(Ok(line)) = lines.next() {
        if let Some(addr) = line.strip_prefix("paygate listening on: ") {
            url = Some(format!("{}/mcp", addr.trim()));
        } else if line.starts_with("dev token") {
            token = lines.next().and_then(Result::ok);
            break;
        }
    }
    (child, url.expect("replica printed its address"), token.expect("replica printed a dev token"))
}

/// The ledger service (`paygate ledger-serve`) in its own namespace, on its own schema (demo
/// accounts opened there: acct-A holds 1,000,000.00 KES); returns once it listens.
fn spawn_ledger() -> Child {
    use std::io::BufRead;
    let data = format!("{ROOT}/ledger");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(format!("{ROOT}/config.toml"), CONFIG).unwrap();
    let log = std::fs::OpenOptions::new().create(true).append(true).open(format!("{ROOT}/ledger.log")).unwrap();
    let mut child = Command::new("ip")
        .args(["netns", "exec", LEDGER_NS, &format!("{ROOT}/paygate"), "ledger-serve", "--bind"])
        .arg(format!("{LEDGER_ADDR}:{LEDGER_PORT}"))
        .env("PAYGATE_LEDGER_SERVE_CREDENTIAL", LEDGER_CREDENTIAL)
        .env("PAYGATE_CONFIG", format!("{ROOT}/config.toml"))
        .env("PAYGATE_STORAGE__URL", pg_url())
        .env("PAYGATE_STORAGE__POSTGRES_SCHEMA", LEDGER_SCHEMA)
        .env("PAYGATE_STORAGE__DATA_DIR", &data)
        .env("PAYGATE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("paygate ledger-serve starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = lines.next().and_then(Result::ok).unwrap_or_default();
    assert!(listening.starts_with("paygate ledger service: "), "the ledger service did not start: {listening:?}");
    child
}

/// `paygate rail-simulator --rail <backend>` (M-Pesa or Airtel) in the backend's namespace,
/// answering every payout itself; returns once it listens.
fn spawn_rail(backend: Backend) -> Child {
    use std::io::BufRead;
    let data = format!("{ROOT}/rail");
    std::fs::create_dir_all(&data).unwrap();
    std::fs::write(format!("{ROOT}/config.toml"), backend.config()).unwrap();
    let log = std::fs::OpenOptions::new().create(true).append(true).open(format!("{ROOT}/rail.log")).unwrap();
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", LEDGER_NS, &format!("{ROOT}/paygate"), "rail-simulator", "--rail", backend.name()]);
    if backend == Backend::Airtel {
        // The key the replicas seal the disbursement PIN for (they are given its public half).
        let key = format!("{ROOT}/airtel-pin-key.pem");
        std::fs::write(&key, AIRTEL_PRIVATE_KEY_PEM).unwrap();
        cmd.args(["--pin-key-file", &key]).envs(AIRTEL_ENV).env("PAYGATE_AIRTEL__PUBLIC_KEY", AIRTEL_PUBLIC_KEY_PEM);
    }
    let mut child = cmd
        // Room for every payout of the six kinds: past the default 10,000 items the simulator
        // answers 503, and operations refused BACKEND_UNAVAILABLE for good never resolve (a run
        // on a quiet machine makes ~10,000 payouts).
        .args(["--auto", "accept", "--auto-after-ms", "200", "--items-max", "100000", "--bind"])
        .arg(format!("{LEDGER_ADDR}:{RAIL_PORT}"))
        .envs(MPESA_ENV)
        .env("PAYGATE_RAIL_SIMULATOR_CONTROL_TOKEN", RAIL_CONTROL_TOKEN)
        .env("PAYGATE_CONFIG", format!("{ROOT}/config.toml"))
        .env("PAYGATE_STORAGE__DATA_DIR", &data)
        .env("PAYGATE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(log)
        .spawn()
        .expect("paygate rail-simulator starts");
    let mut lines = std::io::BufReader::new(child.stdout.take().unwrap()).lines();
    let listening = lines.next().and_then(Result::ok).unwrap_or_default();
    let expected = format!("paygate rail simulator ({}): ", backend.name());
    assert!(listening.starts_with(&expected), "the simulator did not start: {listening:?}");
    child
}

/// What the rail simulator did: every payout it received (`seq`, the caller's originator id =
/// the gateway's record id, amount in whole shillings, status), from its records view.
async fn rail_payouts(backend: Backend) -> Vec<Value> {
    let url = format!("http://{LEDGER_ADDR}:{RAIL_PORT}/simulator/control/{}", backend.name());
    let view: Value = reqwest::Client::new()
        .get(url)
        .bearer_auth(RAIL_CONTROL_TOKEN)
        .send()
        .await
        .and_then(reqwest::Response::error_for_status)
        .expect("the rail simulator's records view")
        .json()
        .await
        .unwrap();
    view["items"].as_array().unwrap().iter().filter(|i| i["kind"] == "payout").cloned().collect()
}

#[derive(Clone, Debug, PartialEq)]
enum Outcome {
    Ok(String),
    /// A definite refusal (its code).
    Refused(String),
    /// A code that says nothing about whether it happened (its code).
    Transient(String),
    /// No answer in time, or the connection broke.
    Unknown,
}

impl Outcome {
    fn determinate(&self) -> bool {
        matches!(self, Outcome::Ok(_) | Outcome::Refused(_))
    }
}

#[derive(Clone, Debug)]
struct Event {
    at_ms: u128,
    op: String,
    replica: usize,
    phase: &'static str,
    outcome: Option<Outcome>,
}

#[derive(Clone, Default)]
struct History(Arc<Mutex<Vec<Event>>>);

impl History {
    fn push(&self, t0: Instant, op: &str, replica: usize, phase: &'static str, outcome: Option<Outcome>) {
        let e = Event { at_ms: t0.elapsed().as_millis(), op: op.to_string(), replica, phase, outcome };
        self.0.lock().unwrap().push(e);
    }
    fn events(&self) -> Vec<Event> {
        self.0.lock().unwrap().clone()
    }
}

/// One operation a client asks for: a payment (memo = its id, so the checker finds each payment's
/// operation in the database) or a partial refund (reason = its id).
#[derive(Clone, Debug)]
struct Op {
    id: String,
    tool: &'static str,
    args: Value,
}

/// A payment of 1.00; `refused`: to acct-C, which policy does not allow.
fn pay_op(id: String, refused: bool) -> Op {
    let to = if refused { "acct-C" } else { "acct-B" };
    let args = json!({"operation_id": id, "from_account": "acct-A", "to_account": to, "amount": "1.00",
                      "currency": "KES", "memo": id});
    Op { id, tool: "create_payment", args }
}

/// An M-Pesa payout of 10 shillings (remarks = its id); `refused`: to a number that is no
/// Kenyan phone (INVALID_ARGUMENT: nothing is sent). (Not over the autonomous limit: asking for
/// approvals that fast is RATE_LIMITED past the pending bound, which is not a refusal.)
fn payout_op(backend: Backend, id: String, refused: bool) -> Op {
    let (tool, phone) = match backend {
        Backend::Airtel => ("send_airtel_payout", "0733 123 456"),
        _ => ("send_mpesa_payout", "0712 345 678"),
    };
    let phone = if refused { "0012 345 678" } else { phone };
    let args = json!({"operation_id": id, "phone_number": phone, "amount": "10", "remarks": id});
    Op { id, tool, args }
}

/// A partial refund of 0.60 of `payment`: two of them on one payment cannot both succeed.
fn refund_op(id: String, payment: &str) -> Op {
    let args = json!({"operation_id": id, "payment_id": payment, "amount": REFUND, "reason": id});
    Op { id, tool: "refund_payment", args }
}

/// One client: a connection per replica, re-made after an unknown.
struct Agent {
    urls: Arc<Vec<String>>,
    token: Arc<String>,
    conns: Vec<Option<Client>>,
    history: History,
    t0: Instant,
}

impl Agent {
    async fn conn(&mut self, r: usize) -> Option<&Client> {
        if self.conns[r].is_none() {
            let c = tokio::time::timeout(CALL_TIMEOUT, try_connect(&self.urls[r], &self.token, Era::Modern)).await;
            self.conns[r] = c.ok().and_then(Result::ok);
        }
        self.conns[r].as_ref()
    }

    /// A second client with the same history and connections of its own (to race this one).
    fn twin(&self) -> Agent {
        Agent {
            urls: self.urls.clone(),
            token: self.token.clone(),
            conns: (0..REPLICAS).map(|_| None).collect(),
            history: self.history.clone(),
            t0: self.t0,
        }
    }

    /// One invocation of `op` on replica `r`, recorded; `None` when no connection could be made (not invoked).
    async fn invoke(&mut self, op: &Op, r: usize) -> Option<Outcome> {
        let (history, t0) = (self.history.clone(), self.t0);
        let c = self.conn(r).await?;
        let op_id = op.id.as_str();
        history.push(t0, op_id, r, "invoke", None);
        let args = op.args.as_object().cloned().unwrap();
        let req = rmcp::model::CallToolRequestParams::new(op.tool).with_arguments(args);
        let outcome = match tokio::time::timeout(CALL_TIMEOUT, c.call_tool(req)).await {
            Ok(Ok(res)) if res.is_error == Some(true) => {
                let v = res.structured_content.unwrap_or_default();
                let code = v["error"]["code"].as_str().unwrap_or("?").to_string();
                if TRANSIENT.contains(&code.as_str()) { Outcome::Transient(code) } else { Outcome::Refused(code) }
            }
            Ok(Ok(res)) => {
                let v = res.structured_content.unwrap_or_default();
                Outcome::Ok(v["payment_id"].as_str().unwrap_or("?").to_string())
            }
            Ok(Err(_)) | Err(_) => Outcome::Unknown,
        };
        if outcome == Outcome::Unknown {
            // Not awaited: a stopped replica would hold the cancel up.
            self.conns[r] = None;
        }
        let phase = match &outcome {
            Outcome::Ok(_) => "ok",
            Outcome::Refused(_) => "fail",
            Outcome::Transient(_) => "fail-transient",
            Outcome::Unknown => "unknown",
        };
        history.push(t0, op_id, r, phase, Some(outcome.clone()));
        Some(outcome)
    }

    /// `op` tried on replica `first`, then the next ones while the answer says nothing about
    /// whether it happened (at most three tries); the last answer.
    async fn attempt(&mut self, op: &Op, first: usize) -> Option<Outcome> {
        let mut last = None;
        for k in 0..3 {
            last = self.invoke(op, (first + k) % REPLICAS).await;
            if last.as_ref().is_some_and(Outcome::determinate) {
                break;
            }
        }
        last
    }
}

/// Each client pays under fresh operation ids until the deadline; an unknown or a transient
/// answer is retried with the same operation id on the next replica (at most three tries, then
/// it is left for the resolution after healing). Every tenth operation is one policy refuses.
/// Every fifth payment answered ok is refunded twice at once, 0.60 each, by this client and a
/// twin on another replica: the two partial refunds race, and at most one may succeed.
/// The first try of each operation on replica `pin` when given: two clients with the
/// same `c` pinned to different replicas race every operation id across them.
async fn load(
    agent: &mut Agent,
    fault: &str,
    c: usize,
    until: Instant,
    pin: Option<usize>,
    backend: Backend,
) -> Vec<Op> {
    let mut twin = agent.twin();
    let mut ops = Vec::new();
    let mut n = 0;
    let refunds = backend.refunds();
    while Instant::now() < until {
        let (id, refused) = (format!("{fault}-c{c}-{n}"), n % 10 == 9);
        let op = if backend.is_rail() { payout_op(backend, id, refused) } else { pay_op(id, refused) };
        let first = pin.unwrap_or(c + n);
        let paid = agent.attempt(&op, first).await;
        if refunds
            && n % 5 == 2
            && let Some(Outcome::Ok(payment)) = paid
        {
            let a = refund_op(format!("{}-ra", op.id), &payment);
            let b = refund_op(format!("{}-rb", op.id), &payment);
            tokio::join!(agent.attempt(&a, first + 1), twin.attempt(&b, first + 2));
            ops.extend([a, b]);
        }
        ops.push(op);
        n += 1;
    }
    ops
}

/// After healing: every operation without a determinate answer is retried until it has one, and
/// every refused one is asked once more (it must stay refused). Answered ones are not asked again:
/// a weakened build would pay those twice with no fault at all, which proves nothing.
async fn resolve(agent: &mut Agent, ops: &[Op], c: usize) {
    let deadline = Instant::now() + RESOLVE_FOR;
    let mut last: BTreeMap<String, Outcome> = BTreeMap::new();
    for e in agent.history.events() {
        if let Some(o) = e.outcome {
            last.insert(e.op, o);
        }
    }
    let mut left: Vec<(usize, &Op)> =
        ops.iter().enumerate().filter(|(_, op)| !matches!(last.get(&op.id), Some(Outcome::Ok(_)))).collect();
    // In rounds, each operation once per round on the next replica, so one that stays unknown
    // (held by the gateway for a person) does not keep the others from being asked.
    // (A refused one asked again may meet a transient answer too: asked until determinate.)
    let mut round = 0;
    while !left.is_empty() && Instant::now() < deadline {
        let mut still = Vec::new();
        for (k, op) in left {
            let r = (c + k + round) % REPLICAS;
            if !agent.invoke(op, r).await.is_some_and(|o| o.determinate()) {
                still.push((k, op));
            }
        }
        left = still;
        round += 1;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[derive(Debug, Default)]
struct Row {
    backend: &'static str,
    fault: String,
    ops: usize,
    acked: usize,
    refused: usize,
    unknown: usize,
    resolved: usize,
    duplicates: usize,
    lost: usize,
    phantom: usize,
    diverged: usize,
    refusal_broken: usize,
    /// Payments refunded more than once by a racing pair, or beyond their amount.
    over_refunded: usize,
    /// Operations whose gateway record (`rail_payments`, backends other than the embedded ledger)
    /// is still unsettled after resolution (`submitting`/`unknown`), or names other payments than
    /// the backend made.
    disagree: usize,
    /// Operations without a definite answer whose payout the rail never received (the rail's
    /// records name none of their gateway records, each still open): nothing moved, and the
    /// gateway never sends them again — held for reconciliation and a person (M-Pesa: Daraja's
    /// status query has no answer for a payout it never received).
    held: usize,
    conserved: bool,
}

impl Row {
    /// Nothing broken — and something tested: a row that acknowledged no payment (a config that
    /// refuses every call) proves nothing, so it is not clean either.
    fn clean(&self) -> bool {
        self.acked > 0
            && self.duplicates == 0
            && self.lost == 0
            && self.phantom == 0
            && self.diverged == 0
            && self.refusal_broken == 0
            && self.over_refunded == 0
            && self.unknown == self.resolved + self.held
            && self.disagree == 0
            && self.conserved
    }
}

fn wall_end_bound() -> i64 {
    common::now_secs() + 2
}

async fn count(sql: &str) -> i64 {
    let db = pg().await;
    let mut n = 0;
    for m in db.simple_query(sql).await.unwrap() {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            n += r.get(0).unwrap_or("0").parse::<i64>().unwrap();
        }
    }
    n
}

async fn pg() -> tokio_postgres::Client {
    let (client, conn) = tokio_postgres::connect(&pg_url(), tokio_postgres::NoTls).await.unwrap();
    tokio::spawn(conn);
    client
}

/// Money conserved: every payment's postings sum to zero, postings in each currency sum to zero,
/// every balance equals its postings, and the gateway's own integrity check passes.
async fn conserved(schema: &str) -> bool {
    let db = pg().await;
    let q = |sql: &str| format!("SET search_path TO {schema}; {sql}");
    let rows = |sql: String| {
        let db = &db;
        async move {
            let mut n = 0i64;
            for m in db.simple_query(&sql).await.unwrap() {
                if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                    n += r.get(0).unwrap_or("0").parse::<i64>().unwrap();
                }
            }
            n
        }
    };
    let unbalanced_payments =
        rows(q("SELECT count(*) FROM (SELECT payment_id FROM postings WHERE payment_id IS NOT NULL \
         GROUP BY payment_id HAVING sum(amount_minor) <> 0) x"))
        .await;
    let unbalanced_currencies = rows(q(
        "SELECT count(*) FROM (SELECT currency FROM postings GROUP BY currency HAVING sum(amount_minor) <> 0) x",
    ))
    .await;
    let wrong_balances = rows(q("SELECT count(*) FROM accounts a WHERE a.balance_minor <> \
         COALESCE((SELECT sum(p.amount_minor) FROM postings p WHERE p.account_id = a.id), 0)"))
    .await;
    let store = paygate::store::postgres::PostgresStore::connect(&pg_url(), schema).await.unwrap();
    let report = paygate::store::LedgerStore::ledger_integrity(&store).await.unwrap();
    if !(report.ok && unbalanced_payments == 0 && unbalanced_currencies == 0 && wrong_balances == 0) {
        eprintln!(
            "conservation: integrity {:?}, unbalanced payments {unbalanced_payments}, currencies \
             {unbalanced_currencies}, balances {wrong_balances}",
            report.problems
        );
    }
    report.ok && unbalanced_payments == 0 && unbalanced_currencies == 0 && wrong_balances == 0
}

/// `memo → [id]` of the rows `sql` selects (memo, id).
async fn by_memo(db: &tokio_postgres::Client, sql: &str) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for m in db.simple_query(sql).await.unwrap() {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            out.entry(r.get(0).unwrap().to_string()).or_default().push(r.get(1).unwrap().to_string());
        }
    }
    for ids in out.values_mut() {
        ids.sort();
    }
    out
}

/// The checker: the history of one fault kind against the final database — the backend's own
/// records of what it paid (the embedded ledger's tables, the ledger service's, or the wallet
/// fake's), and for an external backend the gateway's record of what it sent.
async fn check(
    backend: Backend,
    fault: &str,
    events: &[Event],
    wallet: Option<(&wallet::WalletFake, usize)>,
    rail_from: u64,
) -> Row {
    let db = pg().await;
    let money = backend.money_schema();
    // Every payout the rail received this kind (any status), once its automatic answers are in.
    let rail_seen: BTreeSet<String> = if backend.is_rail() {
        let waiting = Instant::now();
        let mut seen = rail_payouts(backend).await;
        let open =
            |seen: &[Value]| seen.iter().any(|i| i["seq"].as_u64() > Some(rail_from) && i["status"] == "pending");
        while open(&seen) && waiting.elapsed() < Duration::from_secs(10) {
            tokio::time::sleep(Duration::from_millis(200)).await;
            seen = rail_payouts(backend).await;
        }
        seen.iter()
            .filter(|i| i["seq"].as_u64() > Some(rail_from))
            .filter_map(|i| i["originator_id"].as_str())
            .map(str::to_string)
            .collect()
    } else {
        BTreeSet::new()
    };
    // Payments and refunds, each by the operation that made it (memo / reason); the wallet fake's
    // and the rail simulator's by the gateway records that name them, and those no record names.
    let mut amounts_agree = true;
    let (payments, untracked) = match wallet {
        None if backend.is_rail() => {
            let (payments, untracked, agree) = rail_payments(&db, backend, fault, rail_from).await;
            amounts_agree = agree;
            (payments, untracked)
        }
        None => {
            let sql = format!("SELECT memo, id FROM {money}.payments WHERE memo LIKE '{fault}-%'");
            (by_memo(&db, &sql).await, 0)
        }
        Some((fake, from)) => wallet_payments(&db, backend.schema(), fault, fake, from).await,
    };
    let mut by_op: BTreeMap<&str, Vec<&Outcome>> = BTreeMap::new();
    for e in events {
        let list = by_op.entry(e.op.as_str()).or_default();
        if let Some(o) = &e.outcome {
            list.push(o);
        }
    }
    let mut row = Row { backend: backend.name(), fault: fault.to_string(), ops: by_op.len(), ..Row::default() };
    for (op, outcomes) in &by_op {
        let in_db = payments.get(*op).map(Vec::as_slice).unwrap_or(&[]);
        row.duplicates += in_db.len().saturating_sub(1);
        let oks: BTreeSet<&str> =
            outcomes.iter().filter_map(|o| if let Outcome::Ok(id) = o { Some(id.as_str()) } else { None }).collect();
        let refusals: BTreeSet<&str> =
            outcomes.iter().filter_map(|o| if let Outcome::Refused(c) = o { Some(c.as_str()) } else { None }).collect();
        if !oks.is_empty() {
            row.acked += 1;
            if in_db.is_empty() {
                row.lost += 1;
            }
            // Every answer names the same payment, and it is the one in the database.
            if oks.len() > 1 || (in_db.len() == 1 && !oks.contains(in_db[0].as_str())) {
                row.diverged += 1;
            }
        }
        if !refusals.is_empty() {
            row.refused += 1;
            // A refused operation stays refused, with one code, and never pays.
            if !oks.is_empty() || !in_db.is_empty() || refusals.len() > 1 {
                row.refusal_broken += 1;
            }
        }
        if outcomes.iter().any(|o| !o.determinate()) {
            row.unknown += 1;
            if outcomes.last().is_some_and(|o| o.determinate()) {
                row.resolved += 1;
            } else if backend.is_rail() {
                let sql = format!("SELECT state, id FROM {}.rail_payments WHERE memo = '{op}'", backend.schema());
                let records = by_memo(&db, &sql).await;
                let open = records.keys().all(|state| state == "submitting" || state == "unknown");
                let received = records.values().flatten().any(|id| rail_seen.contains(id));
                if !records.is_empty() && open && !received && in_db.is_empty() {
                    row.held += 1;
                } else {
                    let sql = format!(
                        "SELECT id, state || ' (' || COALESCE(reason, '-') || ')' FROM {}.rail_payments WHERE memo = '{op}'",
                        backend.schema()
                    );
                    let at_rail: Vec<Value> = rail_payouts(backend)
                        .await
                        .into_iter()
                        .filter(|i| records.values().flatten().any(|id| i["originator_id"] == *id))
                        .collect();
                    eprintln!(
                        "faults: {fault}: {op} unresolved: records {:?}, at the rail {at_rail:?}, in_db {in_db:?}",
                        by_memo(&db, &sql).await
                    );
                }
            }
        }
    }
    row.phantom = payments.keys().filter(|m| !by_op.contains_key(m.as_str())).count() + untracked;
    // Racing partial refunds of 0.60 on a 1.00 payment: one refund at most, never beyond the amount.
    row.over_refunded = if !backend.refunds() {
        0
    } else {
        count(&format!(
        "SELECT count(*) FROM (SELECT r.refund_of FROM {money}.payments r JOIN {money}.payments p ON p.id = r.refund_of \
         WHERE r.kind = 'refund' AND r.memo LIKE '{fault}-%' GROUP BY r.refund_of, p.amount_minor \
         HAVING count(*) > 1 OR sum(r.amount_minor) > p.amount_minor) x"
    ))
    .await as usize
    };
    if backend != Backend::Embedded {
        // The gateway's record follows the backend's: after resolution none is unsettled, and
        // the payments it says succeeded are exactly those the backend made.
        let gw = backend.schema();
        // (A payout is open until Daraja's result settles it: `pending` too.)
        let open_states =
            if backend.is_rail() { "'submitting', 'unknown', 'pending'" } else { "'submitting', 'unknown'" };
        let open_sql =
            format!("SELECT memo, id FROM {gw}.rail_payments WHERE state IN ({open_states}) AND memo LIKE '{fault}-%'");
        let waiting = Instant::now();
        // (A payout the rail never received is held, not unsettled: see `Row::held`.)
        let unsettled = |mut open: BTreeMap<String, Vec<String>>| {
            if backend.is_rail() {
                open.retain(|_, ids| ids.iter().any(|id| rail_seen.contains(id)));
            }
            open
        };
        let mut open = unsettled(by_memo(&db, &open_sql).await);
        let was_open = open.len();
        // (Not on the weakened build: its retries send new keys, so a record the backend never
        // received is never sent again, and it is caught anyway.)
        // (Nor on the wallet service: it names its payments, so a record never answered has no
        // name to ask by; the clients' retries settle those.)
        let settle_within = if cfg!(feature = "weaken-idempotency-for-evals") || backend == Backend::Wallet {
            Duration::ZERO
        } else {
            SETTLE_WITHIN
        };
        while !open.is_empty() && waiting.elapsed() < settle_within {
            tokio::time::sleep(Duration::from_millis(500)).await;
            open = unsettled(by_memo(&db, &open_sql).await);
        }
        if was_open > 0 {
            eprintln!(
                "faults: {fault}: {was_open} gateway records open after resolution, {} after {:?} of the poll job",
                open.len(),
                waiting.elapsed()
            );
        }
        let sent = by_memo(
            &db,
            &format!("SELECT memo, id FROM {gw}.rail_payments WHERE state = 'succeeded' AND memo LIKE '{fault}-%'"),
        )
        .await;
        let ops: BTreeSet<&String> = sent.keys().chain(payments.keys()).chain(open.keys()).collect();
        row.disagree =
            ops.into_iter().filter(|op| open.contains_key(*op) || sent.get(*op) != payments.get(*op)).count();
        if row.disagree > 0 {
            let sql = format!(
                "SELECT id, state || ' (' || COALESCE(reason, '-') || ')' FROM {gw}.rail_payments \
                 WHERE state IN ({open_states}) AND memo LIKE '{fault}-%'"
            );
            eprintln!("faults: {fault}: gateway records unsettled {open:?}: {:?}", by_memo(&db, &sql).await);
        }
    }
    row.conserved = match wallet {
        // The rail keeps no books here: every payout it paid carried its record's amount.
        None if backend.is_rail() => amounts_agree,
        None => conserved(money).await,
        Some((fake, _)) => wallet_conserved(fake),
    };
    row
}

/// The rail simulator's paid payouts of this kind (received after `from`, its records' `seq`), as
/// the checker counts payments: `memo → [gateway record id]` for each payout whose originator id
/// is a record of this kind (one per time the rail paid it), how many paid payouts no record
/// names, and whether each paid what its record says.
async fn rail_payments(
    db: &tokio_postgres::Client,
    backend: Backend,
    fault: &str,
    from: u64,
) -> (BTreeMap<String, Vec<String>>, usize, bool) {
    let gw = backend.schema();
    let mut records: BTreeMap<String, (String, i64)> = BTreeMap::new();
    let sql = format!("SELECT memo, id, amount_minor FROM {gw}.rail_payments WHERE memo LIKE '{fault}-%'");
    for m in db.simple_query(&sql).await.unwrap() {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            let amount = r.get(2).unwrap().parse().unwrap();
            records.insert(r.get(1).unwrap().to_string(), (r.get(0).unwrap().to_string(), amount));
        }
    }
    let (mut payments, mut untracked, mut agree): (BTreeMap<String, Vec<String>>, usize, bool) =
        (BTreeMap::new(), 0, true);
    for item in rail_payouts(backend).await {
        if item["seq"].as_u64().unwrap() <= from || item["status"] != "paid" {
            continue;
        }
        let id = item["originator_id"].as_str().unwrap_or_default();
        match records.get(id) {
            Some((memo, amount)) => {
                payments.entry(memo.clone()).or_default().push(id.to_string());
                agree &= item["amount"].as_i64() == Some(amount / 100);
            }
            None => untracked += 1,
        }
    }
    for ids in payments.values_mut() {
        ids.sort();
    }
    if !agree {
        eprintln!("conservation ({}): a payout the rail paid carried another amount than its record", backend.name());
    }
    (payments, untracked, agree)
}

/// The wallet fake's payments of this kind (made since `from`), as the checker counts payments:
/// `memo → [gateway record id]` for the records whose `rail_ref` names a payment the service
/// made (`SUCCEEDED`), and how many such payments no record names (money moved the gateway does
/// not know of).
async fn wallet_payments(
    db: &tokio_postgres::Client,
    gw: &str,
    fault: &str,
    fake: &wallet::WalletFake,
    from: usize,
) -> (BTreeMap<String, Vec<String>>, usize) {
    // The gateway's reference for a payment the service named: `pay_<its UUID's 32 hex digits>`.
    let made: BTreeSet<String> = fake.payments()[from..]
        .iter()
        .filter(|p| p.status == "SUCCEEDED")
        .map(|p| format!("pay_{}", p.id.replace('-', "").to_ascii_lowercase()))
        .collect();
    let mut payments: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut named = BTreeSet::new();
    let sql = format!("SELECT memo, id, COALESCE(rail_ref, '') FROM {gw}.rail_payments WHERE memo LIKE '{fault}-%'");
    for m in db.simple_query(&sql).await.unwrap() {
        if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
            let rail_ref = r.get(2).unwrap().to_string();
            if made.contains(&rail_ref) {
                payments.entry(r.get(0).unwrap().to_string()).or_default().push(r.get(1).unwrap().to_string());
                named.insert(rail_ref);
            }
        }
    }
    for ids in payments.values_mut() {
        ids.sort();
    }
    (payments, made.len() - named.len())
}

/// The wallet fake's ledger: legs sum to zero, balances are their postings, and what acct-B
/// received is exactly what its succeeded payments carried (and acct-A paid it).
fn wallet_conserved(fake: &wallet::WalletFake) -> bool {
    let paid: i64 = fake.payments().iter().filter(|p| p.status == "SUCCEEDED").map(|p| p.amount).sum();
    let opening_a = wallet::ACCOUNTS.iter().find(|(id, _, _)| *id == "acct-A").unwrap().2;
    let ok = fake.balanced() && fake.balance("acct-B") == paid && fake.balance("acct-A") == opening_a - paid;
    if !ok {
        eprintln!(
            "conservation (wallet): balanced {}, acct-B {} vs paid {paid}, acct-A {}",
            fake.balanced(),
            fake.balance("acct-B"),
            fake.balance("acct-A")
        );
    }
    ok
}

fn table(rows: &[Row]) -> String {
    let mut s = String::from(
        "| backend | fault | operations | acknowledged | refused | unknown→resolved (+held) | duplicates | lost | phantom | diverged | refusal broken | over-refunded | gateway ≠ backend | conservation |\n\
         |---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for r in rows {
        s += &format!(
            "| {} | {} | {} | {} | {} | {}→{}{} | {} | {} | {} | {} | {} | {} | {} | {} |\n",
            r.backend,
            r.fault,
            r.ops,
            r.acked,
            r.refused,
            r.unknown,
            r.resolved,
            if r.held > 0 { format!(" (+{} held)", r.held) } else { String::new() },
            r.duplicates,
            r.lost,
            r.phantom,
            r.diverged,
            r.refusal_broken,
            r.over_refunded,
            if r.backend == "embedded" { "n/a".to_string() } else { r.disagree.to_string() },
            if r.conserved { "ok" } else { "VIOLATED" }
        );
    }
    s
}

/// A fault: injected at FAULT_AT, healed FAULT_FOR later.
#[derive(Clone, Copy, Debug)]
enum Fault {
    /// Replica 0 cannot reach PostgreSQL, nor PostgreSQL it (iptables DROP in the replica's
    /// namespace, both directions: packets silently dropped; calls in flight mid-commit stall,
    /// then resume). Without iptables, routing rules of type blackhole on both sides.
    Partition,
    /// Replica 2 cannot reach its clients nor they it (iptables DROP in its namespace): calls in
    /// flight keep running against PostgreSQL while the clients time out and retry elsewhere.
    PartitionClients,
    /// `pg_ctl restart -m immediate` under load.
    PgRestart,
    /// Replica 1 SIGSTOPped for FAULT_FOR (past the lease and the claim wait), then SIGCONT.
    Pause,
    /// Replica 0 SIGKILLed, restarted FAULT_FOR later.
    Kill,
    /// Replica 1's link shaped (tbf, both directions): queueing delay and tail drops.
    Degrade,
    /// Replica 2's clock stepped forward 30 s, then back 30 s behind real time, then to real time.
    ClockStep,
    /// Replica 0 cannot reach the ledger service nor it replica 0 (iptables DROP in the replica's
    /// namespace): sends stall to their timeout, unknown whether the ledger read them.
    PartitionLedger,
    /// The ledger service's answers to replica 1 are dropped (iptables OUTPUT DROP in the ledger's
    /// namespace): requests that reached it are applied, their answers never arrive.
    AnswersLost,
    /// The ledger service's link shaped (tbf, both directions): queueing delay and tail drops.
    LedgerDegrade,
    /// The ledger service SIGKILLed with calls in flight, restarted FAULT_FOR later.
    LedgerKill,
    /// Replica 0 cannot reach the wallet service nor it replica 0 (iptables DROP on the service's
    /// port in the replica's namespace).
    PartitionWallet,
    /// The wallet service's answers to replica 1 are dropped (iptables INPUT DROP from its port
    /// in the replica's namespace): requests reach it and are applied, answers never arrive.
    WalletAnswersLost,
    /// Replica 0 cannot reach the rail simulator nor it replica 0 (iptables DROP in the replica's
    /// namespace): payouts stall to their timeout, unknown whether Daraja took them; results for
    /// replica 0 cannot be posted (the poll job's status query settles them).
    PartitionRail,
    /// The rail's answers and results to replica 1 are dropped (iptables OUTPUT DROP in the
    /// rail's namespace): payouts that reached it are paid, their answers never arrive.
    RailAnswersLost,
    /// The rail's link shaped (tbf, both directions): queueing delay and tail drops.
    RailDegrade,
}

impl Fault {
    fn name(self) -> &'static str {
        match self {
            Fault::Partition => "partition-replica-pg",
            Fault::PartitionClients => "partition-replica-clients",
            Fault::PgRestart => "pg-restart-immediate",
            Fault::Pause => "pause-past-lease",
            Fault::Kill => "sigkill-replica",
            Fault::Degrade => "delay-loss-tbf",
            Fault::ClockStep => "clock-step",
            Fault::PartitionLedger => "partition-replica-ledger",
            Fault::AnswersLost => "ledger-answers-lost",
            Fault::LedgerDegrade => "ledger-delay-loss-tbf",
            Fault::LedgerKill => "sigkill-ledger",
            Fault::PartitionWallet => "partition-replica-wallet",
            Fault::WalletAnswersLost => "wallet-answers-lost",
            Fault::PartitionRail => "partition-replica-rail",
            Fault::RailAnswersLost => "rail-answers-lost",
            Fault::RailDegrade => "rail-delay-loss-tbf",
        }
    }
}

struct Suite {
    backend: Backend,
    /// The wallet service's fake (backend `wallet`).
    wallet: Option<Arc<wallet::WalletFake>>,
    lab: Lab,
    urls: Arc<Vec<String>>,
    token: Arc<String>,
    clock: bool,
    iptables: bool,
}

impl Suite {
    async fn inject(&mut self, fault: Fault) {
        match fault {
            Fault::Partition if self.iptables => {
                must(&format!("ip netns exec {} iptables -w -I INPUT -s {PG_ADDR} -j DROP", ns(0)));
                must(&format!("ip netns exec {} iptables -w -I OUTPUT -d {PG_ADDR} -j DROP", ns(0)));
            }
            Fault::Partition => {
                must(&format!("ip rule add pref 7700 from {PG_ADDR} to {} blackhole", replica_addr(0)));
                must(&format!("ip -n {} rule add pref 7700 to {PG_ADDR} blackhole", ns(0)));
            }
            Fault::PartitionClients => {
                must(&format!("ip netns exec {} iptables -w -I INPUT -s {HOST_ADDR} -j DROP", ns(2)));
                must(&format!("ip netns exec {} iptables -w -I OUTPUT -d {HOST_ADDR} -j DROP", ns(2)));
            }
            Fault::PgRestart => must(&pg_ctl("restart -m immediate -w")),
            Fault::Pause => assert!(nix_kill(self.lab.replicas[1].as_ref().unwrap().id(), "STOP")),
            Fault::Kill => {
                let mut c = self.lab.replicas[0].take().unwrap();
                c.kill().unwrap();
                c.wait().unwrap();
            }
            Fault::Degrade => {
                must("tc qdisc add dev pgf-h1 root tbf rate 16kbit burst 2kb limit 16kb");
                must(&format!(
                    "ip netns exec {} tc qdisc add dev pgf-n1 root tbf rate 16kbit burst 2kb limit 16kb",
                    ns(1)
                ));
            }
            Fault::ClockStep => {
                std::fs::write(format!("{ROOT}/faketime"), "+30\n").unwrap();
                tokio::time::sleep(FAULT_FOR / 2).await;
                std::fs::write(format!("{ROOT}/faketime"), "-30\n").unwrap();
            }
            Fault::PartitionLedger | Fault::PartitionRail => {
                must(&format!("ip netns exec {} iptables -w -I INPUT -s {LEDGER_ADDR} -j DROP", ns(0)));
                must(&format!("ip netns exec {} iptables -w -I OUTPUT -d {LEDGER_ADDR} -j DROP", ns(0)));
            }
            Fault::AnswersLost | Fault::RailAnswersLost => {
                must(&format!("ip netns exec {LEDGER_NS} iptables -w -I OUTPUT -d {} -j DROP", replica_addr(1)));
            }
            Fault::LedgerDegrade | Fault::RailDegrade => {
                must("tc qdisc add dev pgf-hl root tbf rate 16kbit burst 2kb limit 16kb");
                must(&format!(
                    "ip netns exec {LEDGER_NS} tc qdisc add dev pgf-nl root tbf rate 16kbit burst 2kb limit 16kb"
                ));
            }
            Fault::LedgerKill => {
                let mut c = self.lab.service.take().unwrap();
                c.kill().unwrap();
                c.wait().unwrap();
            }
            Fault::PartitionWallet => {
                let n = ns(0);
                must(&format!(
                    "ip netns exec {n} iptables -w -I OUTPUT -d {HOST_ADDR} -p tcp --dport {WALLET_PORT} -j DROP"
                ));
                must(&format!(
                    "ip netns exec {n} iptables -w -I INPUT -s {HOST_ADDR} -p tcp --sport {WALLET_PORT} -j DROP"
                ));
            }
            Fault::WalletAnswersLost => {
                let n = ns(1);
                must(&format!(
                    "ip netns exec {n} iptables -w -I INPUT -s {HOST_ADDR} -p tcp --sport {WALLET_PORT} -j DROP"
                ));
            }
        }
    }

    async fn heal(&mut self, fault: Fault) {
        match fault {
            Fault::Partition if self.iptables => must(&format!("ip netns exec {} iptables -w -F", ns(0))),
            Fault::Partition => {
                sh("ip rule del pref 7700");
                sh(&format!("ip -n {} rule del pref 7700", ns(0)));
            }
            Fault::PartitionClients => must(&format!("ip netns exec {} iptables -w -F", ns(2))),
            Fault::PgRestart => {}
            Fault::Pause => assert!(nix_kill(self.lab.replicas[1].as_ref().unwrap().id(), "CONT")),
            Fault::Kill => {
                let (child, _, _) = spawn_replica(0, false, self.backend);
                self.lab.replicas[0] = Some(child);
            }
            Fault::Degrade => {
                sh("tc qdisc del dev pgf-h1 root");
                sh(&format!("ip netns exec {} tc qdisc del dev pgf-n1 root", ns(1)));
            }
            Fault::ClockStep => std::fs::write(format!("{ROOT}/faketime"), "+0\n").unwrap(),
            Fault::PartitionLedger | Fault::PartitionRail => must(&format!("ip netns exec {} iptables -w -F", ns(0))),
            Fault::AnswersLost | Fault::RailAnswersLost => must(&format!("ip netns exec {LEDGER_NS} iptables -w -F")),
            Fault::LedgerDegrade | Fault::RailDegrade => {
                sh("tc qdisc del dev pgf-hl root");
                sh(&format!("ip netns exec {LEDGER_NS} tc qdisc del dev pgf-nl root"));
            }
            Fault::LedgerKill => self.lab.service = Some(spawn_ledger()),
            Fault::PartitionWallet => must(&format!("ip netns exec {} iptables -w -F", ns(0))),
            Fault::WalletAnswersLost => must(&format!("ip netns exec {} iptables -w -F", ns(1))),
        }
    }

    async fn run(&mut self, fault: Fault) -> Row {
        // The operation ids (and memos) name the backend and the fault. On Airtel a payout's
        // remarks (the memo) are at most 25 characters: the fault by its initials there
        // (`airtel-ral-c3-1234` for rail-answers-lost).
        let short = || fault.name().split('-').filter_map(|w| w.chars().next()).collect::<String>();
        let kind = if self.backend == Backend::Airtel { short() } else { fault.name().to_string() };
        let name: &'static str = format!("{}-{kind}", self.backend.name()).leak();
        let t0 = Instant::now();
        let wall_start = common::now_secs();
        let history = History::default();
        let until = t0 + LOAD;
        let mut tasks = tokio::task::JoinSet::new();
        // For the clock step, two more clients send the same operation ids at once, one to the
        // stepped replica and one to replica 0: the stepped clock judges replica 0's live claims
        // (lease_until) expired 30 s early and may take them over; still one payment per id.
        let racers: &[(usize, Option<usize>)] =
            if matches!(fault, Fault::ClockStep) { &[(CLIENTS, Some(REPLICAS - 1)), (CLIENTS, Some(0))] } else { &[] };
        let clients = (0..CLIENTS).map(|c| (c, None)).chain(racers.iter().copied());
        let backend = self.backend;
        // The rail's payouts received before this kind are not this kind's.
        let rail_from = match self.backend {
            Backend::Mpesa | Backend::Airtel => {
                rail_payouts(self.backend).await.iter().filter_map(|i| i["seq"].as_u64()).max().unwrap_or(0)
            }
            _ => 0,
        };
        // The wallet fake's payments made before this kind are not this kind's.
        let wallet = self.wallet.clone().map(|w| {
            let from = w.payments().len();
            (w, from)
        });
        for (c, pin) in clients {
            let mut agent = Agent {
                urls: self.urls.clone(),
                token: self.token.clone(),
                conns: (0..REPLICAS).map(|_| None).collect(),
                history: history.clone(),
                t0,
            };
            tasks.spawn(async move {
                let ops = load(&mut agent, name, c, until, pin, backend).await;
                (agent, ops, c)
            });
        }
        tokio::time::sleep(FAULT_AT).await;
        eprintln!("faults: {name}: injected at {:?}", t0.elapsed());
        self.inject(fault).await;
        let healed_at = t0 + FAULT_AT + FAULT_FOR;
        tokio::time::sleep(healed_at.saturating_duration_since(Instant::now())).await;
        self.heal(fault).await;
        eprintln!("faults: {name}: healed at {:?}", t0.elapsed());
        let mut agents = Vec::new();
        while let Some(r) = tasks.join_next().await {
            agents.push(r.unwrap());
        }
        // After healing: every client resolves its unknowns (and asks its answered ones again).
        let mut resolving = tokio::task::JoinSet::new();
        for (mut agent, ops, c) in agents {
            agent.conns = (0..REPLICAS).map(|_| None).collect();
            resolving.spawn(async move { resolve(&mut agent, &ops, c).await });
        }
        while let Some(r) = resolving.join_next().await {
            r.unwrap();
        }
        let events = history.events();
        write_history(name, &events);
        let wallet = wallet.as_ref().map(|(w, from)| (w.as_ref(), *from));
        let mut row = check(self.backend, name, &events, wallet, rail_from).await;
        row.fault = fault.name().to_string();
        if matches!(fault, Fault::ClockStep) {
            // The step took: replica 2 stamped payments 30 s ahead of, or behind, the real clock.
            let sql = format!(
                "SELECT count(*) FROM {}.payments WHERE memo LIKE '{name}-%' AND (created_at > {} OR created_at < {})",
                self.backend.money_schema(),
                wall_end_bound(),
                wall_start - 2
            );
            let stepped = count(&sql).await;
            eprintln!("faults: {name}: {stepped} payments stamped by the stepped clock");
            assert!(stepped > 0, "no payment carries the stepped clock: libfaketime did not take");
        }
        eprintln!("faults: {name}: {row:?} in {:?}", t0.elapsed());
        row
    }
}

fn write_history(name: &str, events: &[Event]) {
    let dir = std::env::temp_dir().join("paygate-faults-history");
    std::fs::create_dir_all(&dir).unwrap();
    let lines: Vec<String> = events
        .iter()
        .map(|e| {
            let detail = match &e.outcome {
                Some(Outcome::Ok(id)) => id.clone(),
                Some(Outcome::Refused(c) | Outcome::Transient(c)) => c.clone(),
                _ => String::new(),
            };
            json!({"ms": e.at_ms, "op": e.op, "replica": e.replica, "type": e.phase, "detail": detail}).to_string()
        })
        .collect();
    std::fs::write(dir.join(format!("{name}.jsonl")), lines.join("\n") + "\n").unwrap();
}

/// The replicas run the build this test was compiled for: one operation id twice on a healthy
/// replica replays the payment, except on the weakened build, which pays it again.
async fn probe_build(url: &str, token: &str, weakened: bool, backend: Backend) {
    let c = try_connect(url, token, Era::Modern).await.expect("the probe connects");
    let mut ids = Vec::new();
    for _ in 0..2 {
        let op = if backend.is_rail() {
            payout_op(backend, "probe-build".into(), false)
        } else {
            pay_op("probe-build".into(), false)
        };
        let args = op.args.as_object().cloned().unwrap();
        let req = rmcp::model::CallToolRequestParams::new(op.tool).with_arguments(args);
        let r = c.call_tool(req).await.expect("the probe is answered");
        let answer = r.structured_content.unwrap_or_default();
        assert!(answer["payment_id"].is_string(), "the probe's payment was refused: {answer}");
        ids.push(answer["payment_id"].clone());
    }
    assert_eq!(
        ids[0] != ids[1],
        weakened,
        "the replicas do not run the build this test was compiled for (weakened: {weakened}): another \
         cargo run with other features replaced target/debug/paygate; run again"
    );
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}

fn wait_ready(urls: &[String]) {
    let deadline = Instant::now() + Duration::from_secs(30);
    for u in urls {
        let addr = u.trim_start_matches("http://").split('/').next().unwrap().to_string();
        while std::net::TcpStream::connect(&addr).is_err() {
            assert!(Instant::now() < deadline, "replica {addr} does not listen");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn faults_keep_every_payment_exactly_once() {
    // Not asked for: `cargo test` leaves the suite to its own step (`.ci/run`, PAYGATE_FAULTS=1).
    if std::env::var("PAYGATE_FAULTS").as_deref() != Ok("1") {
        common::say("faults: needs PAYGATE_FAULTS=1 (and root: namespaces, runuser, tc); SKIPPED");
        return;
    }
    if !is_root() {
        return common::skipped("faults: PAYGATE_FAULTS=1 but not root (namespaces, runuser, tc)");
    }
    // The binary, copied before waiting for the lock: another cargo run with other features
    // replaces target/debug/paygate when it starts (checked below by behaviour).
    let bin = std::env::temp_dir().join(format!("paygate-faults-bin-{}", std::process::id()));
    std::fs::copy(env!("CARGO_BIN_EXE_paygate"), &bin).unwrap();
    // One run at a time on a machine (the namespaces, the bridge, the port and ROOT are fixed): a
    // second one would tear this one's lab down, so it waits. libc's flock, not File::lock (1.89;
    // the crate's rust-version is 1.88).
    let lock = std::fs::File::create("/tmp/paygate-faults.lock").unwrap();
    // SAFETY: flock on a descriptor this function owns; released when `lock` is dropped at the end.
    assert_eq!(unsafe { libc::flock(std::os::fd::AsRawFd::as_raw_fd(&lock), libc::LOCK_EX) }, 0);
    let started = Instant::now();
    let weakened = cfg!(feature = "weaken-idempotency-for-evals");
    clean();
    std::fs::create_dir_all(ROOT).unwrap();
    // A copy: a build with other features replaces target/debug/paygate, and a replica restarted
    // mid-run (sigkill-replica) must be the same build as the others.
    std::fs::copy(&bin, format!("{ROOT}/paygate")).unwrap();
    let _ = std::fs::remove_file(&bin);
    let clock = faketime().is_some();
    if !clock {
        common::skipped("faults: libfaketime could not be installed; clock-step");
    }
    std::fs::write(format!("{ROOT}/faketime"), "+0\n").unwrap();
    let iptables = iptables();
    if !iptables {
        eprintln!("faults: iptables could not be installed; partitions by routing rules");
    }
    network();
    postgres();
    let mut backends = vec![Backend::Embedded, Backend::Http, Backend::Wallet, Backend::Mpesa, Backend::Airtel];
    if let Ok(only) = std::env::var("PAYGATE_FAULTS_BACKENDS") {
        backends.retain(|b| only.split(',').any(|o| o == b.name()));
    }
    let only = std::env::var("PAYGATE_FAULTS_ONLY").ok();
    let mut rows = Vec::new();
    let mut lab = Lab { replicas: Vec::new(), service: None };
    let ran = backends.clone();
    for backend in backends {
        let up = Instant::now();
        if backend == Backend::Http {
            lab.service = Some(spawn_ledger());
        }
        if backend.is_rail() {
            lab.service = Some(spawn_rail(backend));
        }
        let wallet = match backend {
            Backend::Wallet => {
                Some(Arc::new(wallet::WalletFake::start_on(&format!("{HOST_ADDR}:{WALLET_PORT}")).await))
            }
            _ => None,
        };
        let mut urls = Vec::new();
        let mut token = String::new();
        for i in 0..REPLICAS {
            let (child, url, t) = spawn_replica(i, clock && i == REPLICAS - 1, backend);
            lab.replicas.push(Some(child));
            urls.push(url);
            if i == 0 {
                token = t;
            }
        }
        wait_ready(&urls);
        probe_build(&urls[0], &token, weakened, backend).await;
        eprintln!("faults: {}: {REPLICAS} replicas up in {:?}", backend.name(), up.elapsed());
        let mut suite = Suite { backend, wallet, lab, urls: Arc::new(urls), token: Arc::new(token), clock, iptables };
        let mut faults = backend.faults();
        if let Some(only) = &only {
            faults.retain(|f| only.split(',').any(|o| o == f.name()));
        }
        for f in faults {
            if matches!(f, Fault::ClockStep) && !suite.clock {
                continue;
            }
            let needs_iptables = matches!(
                f,
                Fault::PartitionClients
                    | Fault::PartitionLedger
                    | Fault::AnswersLost
                    | Fault::PartitionWallet
                    | Fault::WalletAnswersLost
                    | Fault::PartitionRail
                    | Fault::RailAnswersLost
            );
            if needs_iptables && !suite.iptables {
                common::skipped(&format!("faults: iptables could not be installed; {}", f.name()));
                continue;
            }
            rows.push(suite.run(f).await);
        }
        lab = suite.lab;
        lab.stop();
    }
    let t = table(&rows);
    println!("\nfaults ({}):\n{t}", if weakened { "weakened build" } else { "normal build" });
    println!("faults: suite wall time {:?}", started.elapsed());
    if weakened {
        // On every backend: a suite that stopped catching it on one proves nothing there.
        // (Every backend that ran: one with no kind selected paid nothing twice, and fails.)
        // Paid twice: a second payment for one operation, or one no gateway record names (the
        // wallet service's: the first attempt's record never learned its payment's name).
        for b in ran.iter().map(|b| b.name()) {
            let duplicates: usize = rows.iter().filter(|r| r.backend == b).map(|r| r.duplicates + r.phantom).sum();
            assert!(
                duplicates > 0,
                "the weakened build paid no operation twice on the {b} backend: the fault suite no longer catches it\n{t}"
            );
        }
    } else {
        assert!(rows.iter().all(Row::clean), "a fault broke exactly-once or conservation\n{t}");
    }
    drop(lab);
    drop(lock);
}
