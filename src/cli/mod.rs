//! The command line, one room: `paygate` parses its arguments here (clap) and each subcommand is a
//! function below (serve, token, tools, mandate verify, migrate, ledger-serve, reconcile,
//! check-ledger, probe), with `init`, `doctor`, `stdio` and `rail-simulator` beside them. `src/main.rs` only calls [`run`].

pub mod doctor;
pub mod init;
mod passkeys;
mod policy;
mod rail_simulator;
mod stdio;

use std::path::PathBuf;
use std::process::ExitCode;

use crate::clock::{Clock, SystemClock};
use crate::config::Config;
use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "paygate", version, about = "MCP payment gateway for AI agents")]
struct Cli {
    /// A TOML file layered over the defaults (config/default.toml lists every key).
    #[arg(long, global = true, env = "PAYGATE_CONFIG")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(Subcommand)]
enum Command {
    /// Run the gateway (the default).
    Serve,
    /// Serve MCP over stdin/stdout for the one agent whose token is in PAYGATE_TOKEN (an MCP
    /// client starts it as a subprocess). Same store, policy, audit and limits as `serve`; no port
    /// is bound; logs go to stderr. Exits non-zero, before reading stdin, when the token is missing
    /// or is not an agent's token for <public_url>/mcp.
    Stdio,
    /// Mint a token with the dev key, for local use: an agent's (for <public_url>/mcp) unless
    /// --operator or --console.
    Token {
        /// The token's subject (with --console: "operator" unless given). With --act, the user the
        /// agent acts for.
        #[arg(long, required_unless_present = "console")]
        sub: Option<String>,
        /// Space-separated scopes, e.g. "payments:read payments:create" (with --console: every
        /// operator scope unless given).
        #[arg(long, required_unless_present = "console")]
        scope: Option<String>,
        #[arg(long)]
        ttl_secs: Option<i64>,
        /// An operator's token (audience <public_url>/operator: the approval routes, /principals,
        /// /operator/v1, the console) instead of an agent's.
        #[arg(long)]
        operator: bool,
        /// A delegated agent token (RFC 8693): this agent acts for --sub, the user.
        #[arg(long, conflicts_with_all = ["operator", "console"])]
        act: Option<String>,
        /// An operator's token for the console (implies --operator): prints the token, and where
        /// to paste it on stderr.
        #[arg(long)]
        console: bool,
    },
    /// Print every tool with the scope it needs and its annotations.
    Tools,
    /// Apply the store's migrations and exit.
    Migrate,
    /// Serve the embedded reference ledger over the HTTP ledger contract (docs/ledger-api.yaml), for
    /// a gateway configured with backend.kind = "http". Uses this config's storage and demo accounts;
    /// give it its own data directory. The credential comes from PAYGATE_LEDGER_SERVE_CREDENTIAL.
    LedgerServe {
        /// Address to listen on.
        #[arg(long, default_value = "127.0.0.1:8090")]
        bind: String,
    },
    /// Serve one rail's simulator (M-Pesa's Daraja or Airtel Money) in a process of its own, for
    /// gateways whose mpesa.base_url / airtel.base_url name it: the rail's API at the root, the
    /// control routes and records view at /simulator/control/<rail>. It expects the credentials of
    /// this config's [mpesa] or [airtel] (the gateways' own). Prints its address on stdout. Moves
    /// no money anywhere.
    RailSimulator {
        #[arg(long, value_enum)]
        rail: rail_simulator::Rail,
        /// Address to listen on (port 0: any free port; the line on stdout names it).
        #[arg(long, default_value = "127.0.0.1:8091")]
        bind: String,
        /// Airtel: the gateway (or the balancer in front of its replicas) collection callbacks go
        /// to; the route and its secret come from the config. Default: the config's public URL.
        #[arg(long)]
        callback_base_url: Option<String>,
        /// Answer every prompt and payment by itself, this way (no person needed).
        #[arg(long, value_enum)]
        auto: Option<rail_simulator::Auto>,
        /// How long after a request its automatic answer comes, in milliseconds.
        #[arg(long, default_value_t = 200)]
        auto_after_ms: u64,
        /// The bearer token the control routes ask for (at least 16 characters); without one they
        /// answer loopback peers only. Prefer the environment variable: arguments are visible to
        /// other users of the machine.
        #[arg(long, env = "PAYGATE_RAIL_SIMULATOR_CONTROL_TOKEN", hide_env_values = true)]
        control_token: Option<String>,
        /// Airtel: the RSA private key (PKCS#8 PEM) disbursement PINs are sealed for; give the
        /// gateways its public half as airtel.public_key. Default: a fresh key (payouts refused).
        #[arg(long)]
        pin_key_file: Option<PathBuf>,
        /// Prompts and payments kept (in memory) before new ones are refused with 503; at most
        /// 200000.
        #[arg(long, default_value_t = crate::backend::simulator::SIMULATOR_ITEMS_MAX)]
        items_max: usize,
    },
    /// Compare the gateway's payment records with the backend and the rails, settle what the
    /// backend can answer, print the report (JSON) and audit it. Exit code 1 when problems remain.
    Reconcile {
        /// Only payments created at or after this instant (RFC 3339 or YYYY-MM-DD); default: jobs.reconcile_window_secs.
        #[arg(long)]
        since: Option<String>,
    },
    /// Check the ledger's integrity (what the check_ledger_integrity tool does, with no request
    /// timeout): incremental from the last checkpoint, or every posting with --full. Prints the
    /// report (JSON) and audits it. Exit code 1 when the ledger is not consistent.
    CheckLedger {
        /// Read every posting, not only those since the last verified checkpoint.
        #[arg(long)]
        full: bool,
    },
    /// Write a commented config for local development or production, and print client configuration
    /// (Claude Code and Desktop, Cursor, VS Code, Python, TypeScript) for this gateway. Never overwrites.
    Init {
        #[arg(long, value_enum, default_value = "dev")]
        mode: crate::cli::init::Mode,
        /// The same as --mode demo: M-Pesa simulated inside the gateway, no credentials needed.
        #[arg(long)]
        demo: bool,
        /// Directory to write paygate.toml into (created if missing).
        #[arg(long, default_value = ".")]
        dir: PathBuf,
        /// The URL clients use, scheme://host[:port] (production default: a placeholder to replace).
        #[arg(long)]
        public_url: Option<String>,
        /// Production: your identity provider's issuer.
        #[arg(long)]
        issuer: Option<String>,
        /// Production: your identity provider's JWKS URL.
        #[arg(long)]
        jwks_url: Option<String>,
    },
    /// Check a config before starting: validity, dev key vs identity provider, JWKS, store and
    /// migrations, backend and M-Pesa credentials, URLs and origins, secrets, clock. Exit 1 on any ✗.
    Doctor,
    /// Health check for containers without curl: GET the URL (default the local /readyz) and exit
    /// 0 on a 2xx answer within the timeout, 1 otherwise. Needs no config.
    Probe {
        #[arg(default_value = "http://127.0.0.1:8080/readyz")]
        url: String,
        /// Give up after this many seconds.
        #[arg(long, default_value_t = 3)]
        timeout_secs: u64,
    },
    /// Work with mandates signed by this gateway.
    Mandate {
        #[command(subcommand)]
        command: MandateCommand,
    },
    /// Work with the audit trail.
    Audit {
        #[command(subcommand)]
        command: AuditCommand,
    },
    /// Policy as data (README "Changing policy"): export a version, import a file as a change,
    /// or dry-run a file against the audited history.
    Policy {
        #[command(subcommand)]
        command: PolicyCommand,
    },
    /// Passkeys of the people who decide approvals.
    Passkeys {
        #[command(subcommand)]
        command: PasskeysCommand,
    },
}

#[derive(Subcommand)]
enum PasskeysCommand {
    /// Issue an enrolment code for --owner (printed once): what registers their first passkey
    /// (or a later one without an existing passkey). Single use, valid for
    /// passkeys.enrolment_code_ttl_secs, stored only as a hash, audited. Hand it over out of band.
    EnrolCode {
        /// The person's subject, as their operator tokens carry it.
        #[arg(long)]
        owner: String,
        /// The issuer of their tokens (default: auth.issuer, or the dev key's).
        #[arg(long)]
        issuer: Option<String>,
    },
}

#[derive(Subcommand)]
enum PolicyCommand {
    /// Print a version (default: the newest) as the [policy] and [tools] sections of a config file.
    Export {
        #[arg(long)]
        version: Option<i64>,
    },
    /// Propose FILE's [policy] and [tools] as the next version, by "cli" (whoever runs this is
    /// nobody the gateway authenticated): applied at once when it only narrows; otherwise a
    /// proposal that the first operator to approve adopts and a second, distinct one approves.
    Import {
        file: PathBuf,
        /// Who says they make the change: recorded in the reason as a claim, never as the author.
        #[arg(long)]
        author: String,
        /// Why (recorded with the version).
        #[arg(long)]
        reason: String,
    },
    /// What FILE's policy would have changed over the audited calls of a window (default: the last
    /// 7 days). Writes nothing.
    Simulate {
        file: PathBuf,
        /// RFC 3339 or YYYY-MM-DD.
        #[arg(long)]
        since: Option<String>,
        #[arg(long)]
        until: Option<String>,
    },
}

#[derive(Subcommand)]
enum AuditCommand {
    /// Walk the audit trail's hash chain (every link, every signed checkpoint) and print the
    /// verdict (JSON) naming the first broken record. Exit 0 when it holds, 1 when it does not,
    /// 2 when it could not be read.
    Verify {
        /// Walk the archive files retention wrote (`audit.archive_dir`) before the database, as
        /// one chain.
        #[arg(long)]
        archive_dir: Option<std::path::PathBuf>,
        /// Also trust checkpoints signed by the keys of this JWKS file (written by `paygate mandate
        /// export-keys` before the mandate secret or key id changed). May be given more than once.
        #[arg(long = "keys")]
        keys: Vec<String>,
        /// A head kept outside the database: `POSITION:HASH`, or a file holding a signed
        /// checkpoint (the `audit.checkpoint` webhook event a witness kept, or its `data`). The
        /// position must be on the chain with that hash; missing or different is a rollback.
        #[arg(long)]
        expect: Option<String>,
    },
}

#[derive(Subcommand)]
enum MandateCommand {
    /// Verify a mandate (signature, key id, shape, expiry) and print its claims, or why it fails.
    Verify {
        /// The compact JWS.
        jws: String,
        /// Verify from this JWKS alone (a URL such as
        /// https://paygate.example/.well-known/mandate-jwks.json, or a file), as a ledger or an
        /// auditor would: no config and no secret needed. Without it, the config's mandate keys.
        #[arg(long)]
        jwks: Option<String>,
    },
    /// Print (JSON, a JWKS) every mandate public key from --since through the next rotation
    /// period: keep it before changing the mandate secret or key id, and the audit checkpoints
    /// these keys signed stay verifiable (`paygate audit verify --keys FILE`).
    ExportKeys {
        /// RFC 3339 or YYYY-MM-DD: the first day of the audit trail you keep.
        #[arg(long)]
        since: String,
    },
}

/// Parse the command line and run the command it names.
pub fn run() -> ExitCode {
    let cli = Cli::parse();
    let file = cli.config.as_deref();
    match cli.command.unwrap_or(Command::Serve) {
        // These two work without a valid config: init writes one, doctor reports what is wrong with it.
        Command::Init { mode, demo, dir, public_url, issuer, jwks_url } => {
            let mode = if demo { crate::cli::init::Mode::Demo } else { mode };
            init(crate::cli::init::InitOptions { mode, dir, public_url, issuer, jwks_url })
        }
        Command::Doctor => doctor(file),
        Command::Probe { url, timeout_secs } => probe(&url, timeout_secs),
        Command::Serve => with_config(file, serve),
        Command::Stdio => stdio::run(file),
        Command::Token { sub, scope, ttl_secs, operator, act, console } => with_config(file, |c| {
            let sub = sub.unwrap_or_else(|| "operator".into());
            let scope = scope.unwrap_or_else(|| OPERATOR_SCOPES.into());
            let code = token(&c, &sub, act.as_deref(), &scope, ttl_secs, operator || console);
            if console && code == ExitCode::SUCCESS {
                let public_url = crate::app::configured_public_url(&c);
                eprintln!("paste it at {public_url}/console (the page keeps it in memory only)");
            }
            code
        }),
        Command::Tools => {
            tools();
            ExitCode::SUCCESS
        }
        Command::Mandate { command: MandateCommand::Verify { jws, jwks: Some(jwks) } } => verify_from_jwks(&jwks, &jws),
        Command::Mandate { command: MandateCommand::Verify { jws, jwks: None } } => {
            with_config(file, |c| verify_mandate(&c, &jws))
        }
        Command::Migrate => with_config(file, |c| migrate(&c)),
        Command::LedgerServe { bind } => with_config(file, |c| ledger_serve(c, &bind)),
        Command::RailSimulator {
            rail,
            bind,
            callback_base_url,
            auto,
            auto_after_ms,
            control_token,
            pin_key_file,
            items_max,
        } => {
            let opts = rail_simulator::Options {
                rail,
                bind,
                callback_base_url,
                auto,
                auto_after_ms,
                control_token,
                pin_key_file,
                items_max,
            };
            with_config(file, |c| rail_simulator::run(c, opts))
        }
        Command::Reconcile { since } => with_config(file, |c| reconcile(c, since.as_deref())),
        Command::CheckLedger { full } => with_config(file, |c| check_ledger(c, full)),
        Command::Mandate { command: MandateCommand::ExportKeys { since } } => {
            with_config(file, |c| export_keys(c, &since))
        }
        Command::Audit { command: AuditCommand::Verify { archive_dir, keys, expect } } => {
            with_store(file, |c| verify_audit(c, archive_dir, &keys, expect))
        }
        Command::Policy { command: PolicyCommand::Export { version } } => {
            with_config(file, |c| policy::export(c, version))
        }
        Command::Policy { command: PolicyCommand::Import { file: doc, author, reason } } => {
            with_config(file, |c| policy::import(c, &doc, &author, &reason))
        }
        Command::Policy { command: PolicyCommand::Simulate { file: doc, since, until } } => {
            with_config(file, |c| policy::simulate(c, &doc, since.as_deref(), until.as_deref()))
        }
        Command::Passkeys { command: PasskeysCommand::EnrolCode { owner, issuer } } => {
            with_config(file, |c| passkeys::enrol_code(c, &owner, issuer.as_deref()))
        }
    }
}

/// `with_config` for a command that reads the gateway's store and must not create one: exit 2,
/// naming the path looked for, when the SQLite file the config names does not exist.
fn with_store(file: Option<&std::path::Path>, f: impl FnOnce(Config) -> ExitCode) -> ExitCode {
    with_config(file, |c| match crate::app::existing_store(&c) {
        Ok(()) => f(c),
        Err(e) => {
            crate::logging::fatal(&e);
            could_not_run()
        }
    })
}

/// Load the config (defaults → file → environment) and run `f` with it; exit 2 when it is invalid.
fn with_config(file: Option<&std::path::Path>, f: impl FnOnce(Config) -> ExitCode) -> ExitCode {
    match Config::from_env(file) {
        Ok(c) => f(c),
        Err(e) => {
            crate::logging::fatal(&e.to_string());
            ExitCode::from(2)
        }
    }
}

fn init(opts: crate::cli::init::InitOptions) -> ExitCode {
    let mode = opts.mode;
    let dir = opts.dir.clone();
    match crate::cli::init::write_config(&opts) {
        Ok(written) => {
            println!("wrote {}", written.config_path.display());
            println!("check it:  paygate doctor --config {}", written.config_path.display());
            println!("run it:    paygate serve --config {}\n", written.config_path.display());
            // Absolute paths for a stdio client, which starts paygate from a directory of its own.
            let command = std::env::current_exe().unwrap_or_else(|_| PathBuf::from("paygate"));
            let config = std::fs::canonicalize(&written.config_path).unwrap_or_else(|_| written.config_path.clone());
            // The config names its data directory relative to here when --dir was relative.
            let data_dir = match dir.is_absolute() {
                true => None,
                false => std::fs::canonicalize(&dir).ok().map(|d| d.join("data")),
            };
            let stdio =
                crate::cli::init::StdioLaunch { command: &command, config: &config, data_dir: data_dir.as_deref() };
            print!("{}", crate::cli::init::client_snippets(mode, &written.mcp_url, &dir, &stdio));
            ExitCode::SUCCESS
        }
        Err(e) => {
            crate::logging::fatal(&e.to_string());
            ExitCode::FAILURE
        }
    }
}

fn doctor(file: Option<&std::path::Path>) -> ExitCode {
    let Some(rt) = runtime() else { return ExitCode::FAILURE };
    let report = rt.block_on(crate::cli::doctor::run(file, std::env::vars()));
    print!("{}", report.render());
    if report.failed() == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) }
}

fn probe(url: &str, timeout_secs: u64) -> ExitCode {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
        eprintln!("paygate probe: cannot start runtime");
        return ExitCode::FAILURE;
    };
    crate::install_crypto_provider();
    let timeout = std::time::Duration::from_secs(timeout_secs.clamp(1, 60));
    rt.block_on(async move {
        let client = match reqwest::Client::builder().timeout(timeout).build() {
            Ok(c) => c,
            Err(e) => {
                eprintln!("paygate probe: {e}");
                return ExitCode::FAILURE;
            }
        };
        match client.get(url).send().await {
            Ok(r) if r.status().is_success() => ExitCode::SUCCESS,
            Ok(r) => {
                eprintln!("paygate probe: {url} answered {}", r.status());
                ExitCode::FAILURE
            }
            Err(e) => {
                eprintln!("paygate probe: {url}: {e}");
                ExitCode::FAILURE
            }
        }
    })
}

fn runtime() -> Option<tokio::runtime::Runtime> {
    match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => Some(r),
        Err(e) => {
            crate::logging::fatal(&format!("cannot start runtime: {e}"));
            None
        }
    }
}

fn ledger_serve(config: Config, bind: &str) -> ExitCode {
    init_tracing();
    let Ok(credential) = std::env::var("PAYGATE_LEDGER_SERVE_CREDENTIAL") else {
        crate::logging::fatal("set PAYGATE_LEDGER_SERVE_CREDENTIAL (the bearer credential gateways present)");
        return ExitCode::from(2);
    };
    let Some(rt) = runtime() else { return ExitCode::FAILURE };
    rt.block_on(async move {
        let store = match crate::app::open_store(&config).await {
            Ok(s) => s,
            Err(e) => {
                crate::logging::fatal(&e.to_string());
                return ExitCode::FAILURE;
            }
        };
        if let Err(e) = crate::app::seed_demo_accounts(&config, &store).await {
            crate::logging::fatal(&e.to_string());
            return ExitCode::FAILURE;
        }
        let listener = match tokio::net::TcpListener::bind(bind).await {
            Ok(l) => l,
            Err(e) => {
                crate::logging::fatal(&format!("cannot bind {bind}: {e}"));
                return ExitCode::FAILURE;
            }
        };
        if let Ok(addr) = listener.local_addr() {
            println!("paygate ledger service: http://{addr}");
        }
        let shutdown = shutdown_signal();
        let clock: std::sync::Arc<dyn Clock> = std::sync::Arc::new(SystemClock);
        let secret = crate::auth::Secret::new(credential);
        match crate::ledger_service::serve(listener, store, clock, secret, shutdown).await {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                crate::logging::fatal(&e.to_string());
                ExitCode::FAILURE
            }
        }
    })
}

fn reconcile(config: Config, since: Option<&str>) -> ExitCode {
    init_tracing();
    let since = match since.map(crate::gateway::parse_instant_arg).transpose() {
        Ok(s) => s,
        Err(e) => {
            crate::logging::fatal(&format!("--since: {e}"));
            return ExitCode::from(2);
        }
    };
    one_shot(config, |g| async move {
        match g.reconcile(since).await {
            Ok(report) => {
                if let Err(e) = g.store().audit_append(g.reconcile_audit(&report)).await {
                    crate::logging::fatal(&format!("the reconciliation report could not be audited: {e}"));
                }
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
                if report.problems() == 0 { ExitCode::SUCCESS } else { ExitCode::from(1) }
            }
            Err(e) => {
                crate::logging::fatal(&format!("reconciliation failed: {e}"));
                could_not_run()
            }
        }
    })
}

fn check_ledger(config: Config, full: bool) -> ExitCode {
    init_tracing();
    one_shot(config, |g| async move {
        match g.cli_integrity(full).await {
            Ok(report) => {
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
                if report.ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
            }
            Err(e) => {
                crate::logging::fatal(&format!("the ledger could not be checked: {e}"));
                could_not_run()
            }
        }
    })
}

fn verify_audit(
    config: Config,
    archive_dir: Option<std::path::PathBuf>,
    keys: &[String],
    expect: Option<String>,
) -> ExitCode {
    init_tracing();
    let mut retired = Vec::new();
    for source in keys {
        match load_jwks(source).and_then(|d| crate::mandate::JwksVerifier::from_jwks(&d)) {
            Ok(v) => retired.push(v),
            Err(e) => {
                crate::logging::fatal(&format!("cannot read the keys {source}: {e}"));
                return could_not_run();
            }
        }
    }
    one_shot_with(config, false, |g| async move {
        // `--expect`: POSITION:HASH, or a file holding a signed checkpoint (its signature checked).
        let expect = expect.map(|e| match std::path::Path::new(&e).is_file() {
            true => std::fs::read_to_string(&e).map_err(|err| format!("{e}: {err}")),
            false => Ok(e),
        });
        let expect = match expect.map(|e| e.and_then(|spec| g.expected_audit_head(&spec, &retired))).transpose() {
            Ok(e) => e,
            Err(e) => {
                crate::logging::fatal(&format!("--expect: {e}"));
                return could_not_run();
            }
        };
        match g.verify_audit_with(archive_dir.as_deref(), &retired, expect).await {
            Ok(verdict) => {
                println!("{}", serde_json::to_string_pretty(&verdict).unwrap_or_default());
                if let Some(b) = &verdict.first_break {
                    let seq = b.seq.map(|s| format!(" (record seq {s})")).unwrap_or_default();
                    eprintln!("broken at chain position {}{seq}: {}", b.chain_seq, b.reason);
                }
                if verdict.ok { ExitCode::SUCCESS } else { ExitCode::from(1) }
            }
            Err(e) => {
                crate::logging::fatal(&format!("the audit trail could not be verified: {e}"));
                could_not_run()
            }
        }
    })
}

/// `reconcile` and `check-ledger` exit 0 when all is well, 1 when they found something a human must
/// look at, and 2 when they could not look (the store or the backend did not answer), so a
/// script can tell "inconsistent" from "unknown", as `diff` and `grep` do.
fn could_not_run() -> ExitCode {
    ExitCode::from(2)
}

/// A one-shot command (`reconcile`, `check-ledger`): the gateway's own assembly (store, backend,
/// rails) on a private port with no scheduler, `run` against it, then a clean shutdown.
fn one_shot<F, Fut>(config: Config, run: F) -> ExitCode
where
    F: FnOnce(std::sync::Arc<crate::gateway::Gateway>) -> Fut,
    Fut: std::future::Future<Output = ExitCode>,
{
    one_shot_with(config, true, run)
}

/// [`one_shot`]; `seal`: seal and sign what the command audited before it exits (it runs no
/// scheduler, and a record left unsealed is editable until a server seals it). `audit verify`
/// does not: it only reads.
fn one_shot_with<F, Fut>(mut config: Config, seal: bool, run: F) -> ExitCode
where
    F: FnOnce(std::sync::Arc<crate::gateway::Gateway>) -> Fut,
    Fut: std::future::Future<Output = ExitCode>,
{
    config.server.bind = "127.0.0.1:0".into();
    config.jobs.enabled = false;
    let Some(rt) = runtime() else { return could_not_run() };
    rt.block_on(async move {
        let running = match crate::app::start_default(config).await {
            Ok(r) => r,
            Err(e) => {
                crate::logging::fatal(&e.to_string());
                return could_not_run();
            }
        };
        let code = run(running.gateway.clone()).await;
        if seal {
            running.gateway.seal_audit_at_stop().await;
        }
        running.shutdown().await;
        code
    })
}

fn migrate(config: &Config) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            crate::logging::fatal(&e.to_string());
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(crate::app::open_store(config)) {
        Ok(_) => {
            println!("migrations applied");
            ExitCode::SUCCESS
        }
        Err(e) => {
            crate::logging::fatal(&e.to_string());
            ExitCode::FAILURE
        }
    }
}

fn verify_mandate(config: &Config, jws: &str) -> ExitCode {
    use crate::mandate::MandateKeys;
    let secret = match &config.mandates.secret {
        Some(s) => s.clone(),
        None => {
            let path = config.storage.data_dir.join("mandate.key");
            match std::fs::read_to_string(&path) {
                Ok(t) => crate::auth::Secret::new(t.trim().to_string()),
                Err(e) => {
                    crate::logging::fatal(&format!("no mandate key ({}): {e}", path.display()));
                    return ExitCode::FAILURE;
                }
            }
        }
    };
    let keys = match crate::app::mandate_schedule(config)
        .map_err(|e| e.to_string())
        .and_then(|s| MandateKeys::new(s, &secret))
    {
        Ok(k) => k,
        Err(e) => {
            crate::logging::fatal(&e);
            return ExitCode::FAILURE;
        }
    };
    verdict(keys.verify(jws.trim(), SystemClock.now()))
}

/// `mandate export-keys --since`: the mandate public keys of every period since then.
fn export_keys(config: Config, since: &str) -> ExitCode {
    let since = match crate::gateway::parse_instant_arg(since) {
        Ok(t) => t,
        Err(e) => {
            eprintln!("paygate mandate export-keys: {e}");
            return ExitCode::from(2);
        }
    };
    one_shot(config, |g| async move {
        match g.mandate_keys_since(since) {
            Ok(jwks) => {
                println!("{}", serde_json::to_string_pretty(&jwks).unwrap_or_default());
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("paygate mandate export-keys: {e}");
                ExitCode::from(2)
            }
        }
    })
}

/// A JWKS from a URL or a file.
fn load_jwks(source: &str) -> Result<serde_json::Value, String> {
    if source.starts_with("http://") || source.starts_with("https://") {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start runtime: {e}"))?;
        crate::install_crypto_provider();
        rt.block_on(async {
            let client = reqwest::Client::builder()
                .timeout(std::time::Duration::from_secs(10))
                .build()
                .map_err(|e| e.to_string())?;
            let resp = client.get(source).send().await.map_err(|e| e.to_string())?;
            if !resp.status().is_success() {
                return Err(format!("{source} answered {}", resp.status()));
            }
            resp.json::<serde_json::Value>().await.map_err(|e| e.to_string())
        })
    } else {
        std::fs::read_to_string(source)
            .map_err(|e| e.to_string())
            .and_then(|t| serde_json::from_str(&t).map_err(|e| e.to_string()))
    }
}

/// `mandate verify --jwks`: the published public keys are all it needs.
fn verify_from_jwks(source: &str, jws: &str) -> ExitCode {
    match load_jwks(source).and_then(|d| crate::mandate::JwksVerifier::from_jwks(&d)) {
        Ok(verifier) => verdict(verifier.verify(jws.trim(), SystemClock.now())),
        Err(e) => {
            eprintln!("paygate mandate verify: cannot read the JWKS {source}: {e}");
            ExitCode::FAILURE
        }
    }
}

/// The claims on stdout (exit 0), or why the mandate is invalid on stderr (exit 1).
fn verdict(result: Result<crate::mandate::MandateClaims, crate::mandate::MandateError>) -> ExitCode {
    match result {
        Ok(claims) => {
            println!("{}", serde_json::to_string_pretty(&claims).unwrap_or_default());
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("invalid: {e}");
            ExitCode::from(1)
        }
    }
}

/// Logs go to stderr: readable by default, one JSON object per line with PAYGATE_LOG_FORMAT=json
/// (for log shippers). Filter with PAYGATE_LOG (e.g. "info", "paygate=debug").
fn init_tracing() {
    crate::logging::init();
}

/// One line of the start banner on stdout. Whoever started the server may stop reading once it
/// has the URL: a closed stdout must not take the server down (`println!` would panic).
fn say(line: std::fmt::Arguments<'_>) {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    let _ = writeln!(out, "{line}").and_then(|()| out.flush());
}

fn serve(config: Config) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(r) => r,
        Err(e) => {
            init_tracing();
            crate::logging::fatal(&format!("cannot start runtime: {e}"));
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(async move {
        let Ok(telemetry) = start_logs(&config) else { return ExitCode::FAILURE };
        let code = serve_on(config).await;
        if let Some(t) = telemetry {
            t.shutdown().await;
        }
        code
    })
}

/// The logs (stderr), and with `[telemetry]` on the trace export, which needs the runtime (exports
/// run on it): call inside it. `Err`: the exporter could not start (said on stderr).
fn start_logs(config: &Config) -> Result<Option<crate::telemetry::Telemetry>, ()> {
    if !config.telemetry.enabled {
        init_tracing();
        return Ok(None);
    }
    match crate::telemetry::start(&config.telemetry.settings()) {
        Ok((telemetry, tracer)) => {
            crate::logging::init_with(Some(tracer));
            tracing::info!(otlp.endpoint = %config.telemetry.otlp_endpoint, "exporting traces");
            Ok(Some(telemetry))
        }
        Err(e) => {
            init_tracing();
            crate::logging::fatal(&e);
            Err(())
        }
    }
}

async fn serve_on(config: Config) -> ExitCode {
    {
        let dev = config.dev.clone();
        let console_on = config.console.enabled;
        let running = match crate::app::start_default(config).await {
            Ok(r) => r,
            Err(e) => {
                crate::logging::fatal(&e.to_string());
                return ExitCode::FAILURE;
            }
        };
        // A store whose audit chain was deleted (the twelfth review) is not served: the policy
        // and payments it holds are not what the trail proves. One-shot commands still run
        // (`audit verify` names it).
        if let Some(why) = running.gateway.audit_chain_deleted().await {
            crate::logging::fatal(&why);
            running.shutdown().await;
            return ExitCode::FAILURE;
        }
        say(format_args!("paygate MCP endpoint: {}", running.mcp_url()));
        if console_on {
            say(format_args!(
                "operator console: {}/console (paygate token --console prints a token for it)",
                running.public_url
            ));
        }
        if running.public_url != format!("http://{}", running.addr) {
            say(format_args!("paygate listening on: http://{}", running.addr));
        }
        if dev.print_token
            && let Some(token) = running.mint_token(&dev.subject, &dev.scopes, dev.token_ttl_secs)
        {
            // Printed to the terminal for the developer, never to the log.
            say(format_args!("dev token (subject {}, scopes \"{}\"):\n{token}", dev.subject, dev.scopes));
        }
        let stop = running.shutdown_token();
        tokio::spawn(async move {
            shutdown_signal().await;
            tracing::info!("shutting down");
            stop.cancel();
        });
        let gateway = running.gateway.clone();
        let served = running.wait().await;
        // In-flight requests are done and the scheduler stopped: seal what they audited and sign
        // the head, so nothing is left unsealed (editable) while the gateway is down.
        gateway.seal_audit_at_stop().await;
        match served {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                crate::logging::fatal(&e.to_string());
                ExitCode::FAILURE
            }
        }
    }
}

/// Ctrl-C, or SIGTERM (what Kubernetes and `docker stop` send): stop taking requests, finish the
/// ones in flight, flush what is queued.
async fn shutdown_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// Every operator scope: what `paygate token --console` grants unless told otherwise.
const OPERATOR_SCOPES: &str = "payments:audit payments:approve payments:admin";

fn token(
    config: &Config,
    sub: &str,
    act: Option<&str>,
    scope: &str,
    ttl_secs: Option<i64>,
    operator: bool,
) -> ExitCode {
    let ttl = ttl_secs.unwrap_or(config.dev.token_ttl_secs);
    if !(60..=2_592_000).contains(&ttl) {
        crate::logging::fatal("--ttl-secs must be 60..=2592000");
        return ExitCode::from(2);
    }
    // Agents' and operators' scopes are different names: a token for one resource carrying the
    // other's scopes is a mistake worth saying so about (it would be refused or mean nothing).
    let (known, kind) = if operator {
        (crate::catalogue::scopes::OPERATOR_SCOPES, "an operator")
    } else {
        (crate::catalogue::scopes::AGENT_SCOPES, "an agent")
    };
    if let Some(other) = scope.split_whitespace().find(|s| !known.contains(s)) {
        crate::logging::fatal(&format!("{other:?} is not {kind} scope; {kind}'s scopes are {}", known.join(" ")));
        return ExitCode::from(2);
    }
    let key = match crate::app::dev_key(config) {
        Ok(k) => k,
        Err(e) => {
            crate::logging::fatal(&e.to_string());
            return ExitCode::FAILURE;
        }
    };
    let public_url = crate::app::configured_public_url(config);
    let audience =
        if operator { crate::app::operator_resource(&public_url) } else { crate::app::agent_resource(&public_url) };
    let issuer = crate::app::dev_issuer(config, &public_url);
    let token = crate::auth::DevToken {
        issuer: &issuer,
        audience: &audience,
        subject: sub,
        scope,
        actor: act,
        now: SystemClock.now(),
        ttl_secs: ttl,
    };
    match token.mint(&key) {
        Ok(t) => {
            println!("{t}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            crate::logging::fatal(&e.to_string());
            ExitCode::FAILURE
        }
    }
}

fn tools() {
    for tool in crate::mcp::PaygateMcp::tool_list() {
        let scope = crate::catalogue::scope_for_tool(&tool.name).unwrap_or("-");
        let hints = tool
            .annotations
            .as_ref()
            .map(|a| {
                let mut h = Vec::new();
                if a.read_only_hint == Some(true) {
                    h.push("read-only");
                }
                if a.destructive_hint == Some(true) {
                    h.push("destructive");
                }
                if a.idempotent_hint == Some(true) {
                    h.push("idempotent");
                }
                h.join(", ")
            })
            .unwrap_or_default();
        println!("{:<24} {:<18} [{}]", tool.name, scope, hints);
    }
}
