//! `paygate doctor`: pre-flight checks of a configuration against the world it will run in, one line
//! each with ✓ or ✗ and, for a ✗, how to fix it. It reads and connects; it writes nothing (no
//! migration, no key file, no audit record) and never prints a secret.

use std::path::Path;
use std::time::Duration;

use crate::config::Config;

/// One check's verdict.
#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
    /// What to do about a failure.
    pub fix: Option<String>,
}

#[derive(Debug, Default)]
pub struct Report {
    pub checks: Vec<Check>,
}

impl Report {
    fn pass(&mut self, name: &'static str, detail: impl Into<String>) {
        self.checks.push(Check { name, ok: true, detail: detail.into(), fix: None });
    }

    fn fail(&mut self, name: &'static str, detail: impl Into<String>, fix: impl Into<String>) {
        self.checks.push(Check { name, ok: false, detail: detail.into(), fix: Some(fix.into()) });
    }

    pub fn failed(&self) -> usize {
        self.checks.iter().filter(|c| !c.ok).count()
    }

    /// One line per check, a fix line under each ✗, and a closing verdict.
    pub fn render(&self) -> String {
        let mut out = String::new();
        for c in &self.checks {
            let mark = if c.ok { '✓' } else { '✗' };
            out.push_str(&format!("{mark} {:<14} {}\n", c.name, c.detail));
            if let Some(fix) = &c.fix {
                out.push_str(&format!("  {:<14} fix: {fix}\n", ""));
            }
        }
        match self.failed() {
            0 => out.push_str(&format!("all {} checks passed\n", self.checks.len())),
            n => out.push_str(&format!("{n} of {} checks failed\n", self.checks.len())),
        }
        out
    }
}

/// Shortest secret accepted for the HMAC keys (idempotency, mandates, dev key), in characters.
pub const SECRET_CHARS_MIN: usize = 32;
/// Shortest credential accepted for the HTTP ledger service, in characters.
pub const CREDENTIAL_CHARS_MIN: usize = 16;

/// Run every check against the config at `file` layered with `env` (the same layering as `serve`).
pub async fn run(file: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> Report {
    crate::install_crypto_provider();
    let mut report = Report::default();
    let config = match Config::load(file, env) {
        Ok(c) => {
            let source = file.map_or_else(|| "built-in defaults".to_string(), |p| p.display().to_string());
            report.pass("config", format!("valid ({source} + PAYGATE_* environment)"));
            c
        }
        Err(e) => {
            report.fail(
                "config",
                e.to_string(),
                "correct the key named above (config/default.toml lists every key with its bounds)",
            );
            return report;
        }
    };
    let timeout = Duration::from_millis(config.auth.jwks_fetch_timeout_ms as u64);
    let http = match reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout)
        .redirect(reqwest::redirect::Policy::none())
        .build()
    {
        Ok(h) => h,
        Err(e) => {
            report.fail("http client", e.to_string(), "this is a bug; please report it");
            return report;
        }
    };
    // Remote clocks seen along the way (HTTP Date headers), for the clock check.
    let mut remote_clocks: Vec<(String, time::OffsetDateTime)> = Vec::new();

    dev_key(&config, &mut report);
    identity_provider(&config, &http, &mut report, &mut remote_clocks).await;
    store(&config, timeout, &mut report).await;
    files(&config, &mut report);
    backend(&config, &http, &mut report, &mut remote_clocks).await;
    urls(&config, &mut report);
    secrets(&config, &mut report);
    clock(&config, &remote_clocks, &mut report);
    report
}

fn dev_key(c: &Config, r: &mut Report) {
    match (c.auth.dev_key_on(), c.auth.idp_configured()) {
        (true, true) => r.fail(
            "dev key",
            "on while an identity provider is configured: tokens signed with the local dev key would be accepted",
            "remove auth.dev_key_enabled = true (PAYGATE_AUTH__DEV_KEY_ENABLED); with an identity provider it is off by default",
        ),
        (true, false) => r.pass("dev key", "on, no identity provider (local development only)"),
        (false, _) => r.pass("dev key", "off"),
    }
    if c.auth.legacy_agent_admin_scope {
        r.fail(
            "scopes",
            "auth.legacy_agent_admin_scope is on: agents' tokens carrying payments:admin are read as payments:integrity",
            "grant agents payments:integrity at the identity provider (payments:admin is an operator scope), then turn it off",
        );
    }
}

async fn identity_provider(
    c: &Config,
    http: &reqwest::Client,
    r: &mut Report,
    clocks: &mut Vec<(String, time::OffsetDateTime)>,
) {
    let a = &c.auth;
    if a.issuer.is_empty() {
        r.pass("identity", "no identity provider (dev key only)");
        return;
    }
    for path in &a.public_key_files {
        let parsed = std::fs::read(path).map_err(|e| e.to_string()).and_then(|pem| {
            jsonwebtoken::DecodingKey::from_rsa_pem(&pem)
                .or_else(|_| jsonwebtoken::DecodingKey::from_ec_pem(&pem))
                .or_else(|_| jsonwebtoken::DecodingKey::from_ed_pem(&pem))
                .map_err(|_| "not an RSA, EC or Ed25519 public key".to_string())
        });
        if let Err(e) = parsed {
            r.fail(
                "identity",
                format!("{}: {e}", path.display()),
                "point auth.public_key_files at the IdP's PEM public keys",
            );
            return;
        }
    }
    if a.jwks_url.is_empty() {
        r.pass("identity", format!("issuer {}, {} static key file(s)", a.issuer, a.public_key_files.len()));
        return;
    }
    let resp = match http.get(&a.jwks_url).send().await {
        Ok(resp) => resp,
        Err(e) => {
            r.fail(
                "identity",
                format!("JWKS {} unreachable: {}", a.jwks_url, describe(e)),
                "check auth.jwks_url (the IdP's jwks_uri) and that this host can reach it",
            );
            return;
        }
    };
    if let Some(date) = date_header(&resp) {
        clocks.push(("the identity provider".into(), date));
    }
    let status = resp.status();
    if !status.is_success() {
        r.fail(
            "identity",
            format!("JWKS {} answered HTTP {status}", a.jwks_url),
            "check auth.jwks_url (the IdP's jwks_uri)",
        );
        return;
    }
    let set = match resp.json::<jsonwebtoken::jwk::JwkSet>().await {
        Ok(set) => set,
        Err(_) => {
            r.fail(
                "identity",
                format!("JWKS {} is not a JSON Web Key Set", a.jwks_url),
                "check auth.jwks_url (the IdP's jwks_uri)",
            );
            return;
        }
    };
    let usable = crate::auth::jwks::usable_key_ids(&set);
    if usable.is_empty() {
        r.fail(
            "identity",
            format!(
                "JWKS {} holds no usable signing key ({} key(s), none asymmetric with a kid)",
                a.jwks_url,
                set.keys.len()
            ),
            "the IdP must publish RSA, EC or Ed25519 public keys with a kid",
        );
    } else {
        r.pass("identity", format!("issuer {}, JWKS reachable, keys {}", a.issuer, usable.join(", ")));
    }
}

async fn store(c: &Config, timeout: Duration, r: &mut Report) {
    let st = &c.storage;
    let result = if st.url.starts_with("postgres://") || st.url.starts_with("postgresql://") {
        let tls = st.postgres_tls();
        // Which TLS is in force, said on the line whatever the outcome.
        let in_force = match st.url.parse::<tokio_postgres::Config>() {
            Ok(cfg) => tls.describe(&cfg),
            Err(_) => format!("sslmode {}", tls.mode.as_str()),
        };
        match crate::store::postgres::PostgresStore::schema_status(
            &st.url,
            &st.postgres_schema,
            &tls,
            timeout.max(Duration::from_secs(2)),
        )
        .await
        {
            Ok(s) => Ok((format!("PostgreSQL, {in_force}"), Some(s))),
            Err(e) => Err((
                format!("PostgreSQL unreachable ({in_force}): {}", redact_url(&e.to_string(), &st.url)),
                "check storage.url (PAYGATE_STORAGE__URL), that the server runs and accepts this user".to_string(),
            )),
        }
    } else {
        let path = match st.url.strip_prefix("sqlite://") {
            Some(p) => std::path::PathBuf::from(p),
            None => st.data_dir.join(&st.sqlite_file),
        };
        let shown = format!("SQLite {}", path.display());
        if path.exists() {
            match crate::store::sqlite::SqliteStore::schema_status(&path) {
                Ok(s) => Ok((shown, Some(s))),
                Err(e) => Err((
                    format!("{shown}: {e}"),
                    "point storage.data_dir / storage.url at paygate's database file".to_string(),
                )),
            }
        } else {
            // Created and migrated on first start: what matters now is that it can be.
            match writable_dir(&path) {
                Ok(()) => Ok((format!("{shown} (created on first start)"), None)),
                Err(e) => Err((
                    format!("{shown}: cannot be created: {e}"),
                    "make storage.data_dir writable by paygate".to_string(),
                )),
            }
        }
    };
    match result {
        Ok((shown, None)) => r.pass("store", shown),
        Ok((shown, Some(s))) if s.applied == s.known => {
            r.pass("store", format!("{shown}, schema version {}", s.applied))
        }
        Ok((shown, Some(s))) if s.applied < s.known => r.fail(
            "store",
            format!("{shown}, schema version {} of {}: not migrated", s.applied, s.known),
            "run `paygate migrate` with this config (the gateway also migrates on start)",
        ),
        Ok((shown, Some(s))) => r.fail(
            "store",
            format!("{shown}, schema version {} is newer than this binary's {}", s.applied, s.known),
            "run the paygate version that migrated this database, or a newer one",
        ),
        Err((detail, fix)) => r.fail("store", detail, fix),
    }
}

/// The data directory, the SQLite files and the audit archive are owner-only: they hold the audit
/// trail, memos, issued mandates and the keys.
fn files(c: &Config, r: &mut Report) {
    let st = &c.storage;
    let mut paths = vec![st.data_dir.clone()];
    if !(st.url.starts_with("postgres://") || st.url.starts_with("postgresql://")) {
        let db = match st.url.strip_prefix("sqlite://") {
            Some(p) => std::path::PathBuf::from(p),
            None => st.data_dir.join(&st.sqlite_file),
        };
        paths.extend(crate::private_fs::database_files(&db));
    }
    if let Some(a) = c.audit_archive() {
        paths.push(a.dir);
    }
    let open: Vec<String> = paths
        .iter()
        .filter_map(|p| crate::private_fs::open_to_others(p).map(|mode| format!("{} (mode {mode:o})", p.display())))
        .collect();
    if open.is_empty() {
        r.pass("files", "data directory, database files and audit archive are owner-only (or not made yet)");
    } else {
        r.fail(
            "files",
            format!("readable by other users: {}", open.join(", ")),
            "chmod 700 the directories and 600 the files (paygate tightens its database files when it opens them)",
        );
    }
}

/// The nearest existing ancestor of `path`'s directory is a directory we may write in.
fn writable_dir(path: &Path) -> Result<(), String> {
    let mut dir = path.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    while !dir.exists() {
        dir = dir.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
    }
    let meta = std::fs::metadata(dir).map_err(|e| e.to_string())?;
    if !meta.is_dir() {
        return Err(format!("{} is not a directory", dir.display()));
    }
    if meta.permissions().readonly() {
        return Err(format!("{} is read-only", dir.display()));
    }
    Ok(())
}

/// The backend's HTTP client as the gateway builds it: its private CA and client certificate.
fn backend_client(c: &Config, http: &reqwest::Client, r: &mut Report) -> reqwest::Client {
    let b = &c.backend;
    let tls =
        crate::backend::outbound::OutboundTls::load(&b.tls_ca_file, &b.tls_client_cert_file, &b.tls_client_key_file)
            .and_then(|tls| {
                let timeout = Duration::from_millis(b.http_connect_timeout_ms as u64);
                crate::backend::outbound::http_client_with(timeout, timeout, &tls)
            });
    match tls {
        Ok(client) => {
            if !b.tls_client_cert_file.is_empty() || !b.tls_ca_file.is_empty() {
                r.pass("backend tls", "backend.tls_* files read; the client key is the owner's alone");
            }
            client
        }
        Err(e) => {
            r.fail("backend tls", e, "fix the backend.tls_* file named above");
            http.clone()
        }
    }
}

/// Most mapped accounts `doctor` asks the wallet service about (one balance read each).
const DOCTOR_WALLET_ACCOUNTS_MAX: usize = 100;

/// The wallet service: reachable (its health), and every mapped account known to it (its balance).
async fn wallet_service(c: &Config, client: &reqwest::Client, r: &mut Report) {
    let b = &c.backend;
    let base = b.http_url.trim_end_matches('/');
    let get = |url: String| {
        let mut rb = client.get(url);
        if !b.http_credential.expose().is_empty() {
            rb = rb.bearer_auth(b.http_credential.expose());
        }
        rb.send()
    };
    let url = format!("{base}/actuator/health");
    match get(url.clone()).await {
        Ok(resp) if resp.status().is_success() => r.pass("backend", format!("wallet service {base} reachable")),
        Ok(resp) => {
            r.fail(
                "backend",
                format!("wallet service {url} answered HTTP {}", resp.status()),
                "check backend.http_url and the service's own health",
            );
            return;
        }
        Err(e) => {
            let detail = match crate::backend::outbound::tls_refusal(&e) {
                Some(why) => why.to_string(),
                None => format!("unreachable: {}", describe(e)),
            };
            r.fail("backend", format!("wallet service {url}: {detail}"), "check backend.http_url, backend.tls_*");
            return;
        }
    }
    let mut unknown = Vec::new();
    for (id, uuid) in b.wallet_accounts.iter().take(DOCTOR_WALLET_ACCOUNTS_MAX) {
        match get(format!("{base}/v1/accounts/{}/balance", uuid.as_str())).await {
            Ok(resp) if resp.status().is_success() => {}
            Ok(resp) => unknown.push(format!("{id} → {} (HTTP {})", uuid.as_str(), resp.status().as_u16())),
            Err(e) => unknown.push(format!("{id} → {} ({})", uuid.as_str(), describe(e))),
        }
    }
    let asked = b.wallet_accounts.len().min(DOCTOR_WALLET_ACCOUNTS_MAX);
    if unknown.is_empty() {
        r.pass("wallet accounts", format!("{asked} mapped account(s) known to the wallet service"));
    } else {
        r.fail(
            "wallet accounts",
            format!("the wallet service does not know: {}", unknown.join(", ")),
            "fix backend.wallet_accounts (paygate account id = the service's account UUID)",
        );
    }
}

async fn backend(c: &Config, http: &reqwest::Client, r: &mut Report, clocks: &mut Vec<(String, time::OffsetDateTime)>) {
    let b = &c.backend;
    if b.kind == crate::config::BackendKind::WalletService {
        let client = backend_client(c, http, r);
        wallet_service(c, &client, r).await;
    } else if b.kind == crate::config::BackendKind::Http {
        let url = format!("{}/v1/health", b.http_url.trim_end_matches('/'));
        // The ledger is reached as the gateway reaches it: its private CA and client certificate.
        let ledger_http = backend_client(c, http, r);
        match ledger_http.get(&url).send().await {
            Ok(resp) => {
                if let Some(date) = date_header(&resp) {
                    clocks.push(("the ledger service".into(), date));
                }
                let status = resp.status();
                let ok =
                    status.is_success() && resp.json::<serde_json::Value>().await.is_ok_and(|v| v["status"] == "ok");
                if ok {
                    r.pass("backend", format!("ledger service {} healthy", b.http_url));
                } else {
                    r.fail(
                        "backend",
                        format!("ledger service {url} answered HTTP {status}, not {{\"status\":\"ok\"}}"),
                        "check backend.http_url and the service's own health (docs/ledger-api.yaml)",
                    );
                }
            }
            Err(e) => match crate::backend::outbound::tls_refusal(&e) {
                Some(why) => r.fail("backend", format!("ledger service {url}: {why}"), "fix backend.tls_*"),
                None => r.fail(
                    "backend",
                    format!("ledger service {url} unreachable: {}", describe(e)),
                    "check backend.http_url and that the ledger service runs",
                ),
            },
        }
    } else {
        r.pass("backend", "embedded reference ledger (in the store)");
    }
    if c.mpesa.enabled && c.mpesa.environment == crate::config::MpesaEnvironment::Simulator {
        r.pass("m-pesa", "SIMULATED inside this gateway (mpesa.environment = \"simulator\"): no money moves");
    } else if c.mpesa.enabled {
        let public_url = crate::app::configured_public_url(c);
        let cfg = crate::app::daraja_config(c, &public_url);
        let base = cfg.base_url.clone();
        let clock: std::sync::Arc<dyn crate::clock::Clock> = std::sync::Arc::new(crate::clock::SystemClock);
        let checked = match crate::backend::mpesa::daraja::DarajaClient::new(cfg, clock) {
            Ok(client) => client.check_credentials().await.map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        match checked {
            Ok(()) => r.pass("m-pesa", format!("Daraja {base} issued an OAuth token for the consumer key")),
            Err(e) => r.fail(
                "m-pesa",
                format!("Daraja {base}: {e}"),
                "check PAYGATE_MPESA__CONSUMER_KEY / __CONSUMER_SECRET for this environment (sandbox and production keys differ)",
            ),
        }
    }
    if c.airtel.enabled && c.airtel.environment == crate::config::AirtelEnvironment::Simulator {
        r.pass("airtel", "SIMULATED inside this gateway (airtel.environment = \"simulator\"): no money moves");
    } else if c.airtel.enabled {
        let public_url = crate::app::configured_public_url(c);
        let clock: std::sync::Arc<dyn crate::clock::Clock> = std::sync::Arc::new(crate::clock::SystemClock);
        let checked = match crate::app::airtel_config(c, &public_url) {
            Ok(cfg) => {
                let base = cfg.base_url.clone();
                let client = crate::backend::airtel::wire::AirtelClient::new(cfg, clock).map_err(|e| e.to_string());
                match client {
                    Ok(client) => client.check_credentials().await.map(|()| base).map_err(|e| e.to_string()),
                    Err(e) => Err(e),
                }
            }
            Err(e) => Err(e),
        };
        match checked {
            Ok(base) => r.pass("airtel", format!("Airtel {base} issued an OAuth token for the client id")),
            Err(e) => r.fail(
                "airtel",
                format!("Airtel: {e}"),
                "check PAYGATE_AIRTEL__CLIENT_ID / __CLIENT_SECRET for this environment (UAT and production differ)",
            ),
        }
    }
}

fn is_loopback_host(host: &str) -> bool {
    let host = host.trim_start_matches('[').trim_end_matches(']');
    host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|ip| ip.is_loopback())
}

/// An origin as browsers send it: `http(s)://host[:port]`, nothing after the authority.
fn is_origin(s: &str) -> bool {
    let Some((scheme, authority)) = s.split_once("://") else { return false };
    if !matches!(scheme, "http" | "https") || authority.is_empty() || authority.contains(['/', '?', '#', '@']) {
        return false;
    }
    let port = match authority.strip_prefix('[') {
        Some(v6) => v6.split_once(']').map(|(_, rest)| rest),
        None => Some(authority.rsplit_once(':').map_or("", |(_, p)| p)),
    };
    match port {
        Some("") => true,
        Some(p) => p.strip_prefix(':').unwrap_or(p).parse::<u16>().is_ok(),
        None => false,
    }
}

fn host_of(url: &str) -> Option<&str> {
    let rest = url.split_once("://")?.1;
    let authority = rest.split(['/', '?', '#']).next()?;
    let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    if let Some(v6) = host.strip_prefix('[') {
        return v6.split(']').next();
    }
    Some(host.rsplit_once(':').map_or(host, |(h, _)| h))
}

fn urls(c: &Config, r: &mut Report) {
    let s = &c.server;
    let mut problems: Vec<(String, String)> = Vec::new();
    let bind_host = s.bind.rsplit_once(':').map_or(s.bind.as_str(), |(h, _)| h);
    if s.public_url.is_empty() && !is_loopback_host(bind_host) {
        problems.push((
            format!("server.public_url is empty while binding {}: tokens' audience would be http://{}/mcp, which no client uses", s.bind, s.bind),
            "set server.public_url to the https URL clients reach (e.g. https://pay.example.com)".into(),
        ));
    }
    if let Some(host) = host_of(&s.public_url)
        && s.public_url.starts_with("http://")
        && !is_loopback_host(host)
    {
        problems.push((
            format!("server.public_url {} is plain http on a non-loopback host: bearer tokens would cross the network in clear", s.public_url),
            "use https (terminate TLS at the proxy, or set server.tls_cert_file / tls_key_file)".into(),
        ));
    }
    for origin in &s.allowed_origins {
        if !is_origin(origin) {
            problems.push((
                format!("server.allowed_origins entry {origin:?} is not an origin (scheme://host[:port], no path, no trailing slash)"),
                "list browser origins exactly as browsers send them, e.g. \"https://console.example.com\"".into(),
            ));
        }
    }
    for (key, url) in [("auth.issuer", &c.auth.issuer), ("auth.jwks_url", &c.auth.jwks_url)] {
        if url.starts_with("http://") && !host_of(url).is_some_and(is_loopback_host) {
            problems.push((
                format!("{key} {url} is plain http: keys could be swapped in transit"),
                format!("use the IdP's https URL for {key}"),
            ));
        }
    }
    // The simulator calls back on this gateway itself: any URL that reaches it will do.
    if c.mpesa.enabled && c.mpesa.environment != crate::config::MpesaEnvironment::Simulator {
        let base = if c.mpesa.callback_base_url.is_empty() { &s.public_url } else { &c.mpesa.callback_base_url };
        if !base.starts_with("https://") {
            problems.push((
                format!("M-Pesa callbacks would go to {:?}: Daraja calls back only on public https URLs", base),
                "set mpesa.callback_base_url (or server.public_url) to the gateway's public https URL".into(),
            ));
        }
    }
    if problems.is_empty() {
        let shown = if s.public_url.is_empty() {
            format!("http://{} (derived from server.bind)", s.bind)
        } else {
            s.public_url.clone()
        };
        r.pass("urls", format!("public URL {shown}, {} extra origin(s)", s.allowed_origins.len()));
    } else {
        for (detail, fix) in problems {
            r.fail("urls", detail, fix);
        }
    }
}

fn secrets(c: &Config, r: &mut Report) {
    let mut problems: Vec<(String, String)> = Vec::new();
    let shared_store = c.storage.url.starts_with("postgres://") || c.storage.url.starts_with("postgresql://");
    for (key, env, value, file) in [
        ("idempotency.secret", "PAYGATE_IDEMPOTENCY__SECRET", &c.idempotency.secret, "idempotency.key"),
        ("mandates.secret", "PAYGATE_MANDATES__SECRET", &c.mandates.secret, "mandate.key"),
    ] {
        match value {
            Some(v) if v.expose().chars().count() < SECRET_CHARS_MIN => problems.push((
                format!("{key} is {} characters; at least {SECRET_CHARS_MIN} are needed", v.expose().chars().count()),
                format!("set {env} to `openssl rand -base64 32` (the same value on every replica)"),
            )),
            Some(_) => {}
            // Replicas sharing PostgreSQL must share the key, or one operation_id gets a different
            // idempotency key (and pays again) on each replica.
            None if shared_store => problems.push((
                format!("{key} is not set while the store is shared (PostgreSQL): each replica would generate its own"),
                format!("set {env} from your secret store, the same value on every replica"),
            )),
            None => {
                if let Some(p) = key_file_problem(&c.storage.data_dir.join(file)) {
                    problems.push(p);
                }
            }
        }
    }
    if c.auth.dev_key_on() {
        match &c.auth.dev_key {
            Some(k) if k.expose().chars().count() < SECRET_CHARS_MIN => problems.push((
                format!(
                    "auth.dev_key is {} characters; at least {SECRET_CHARS_MIN} are needed",
                    k.expose().chars().count()
                ),
                "unset PAYGATE_AUTH__DEV_KEY (one is generated) or give 32+ random characters".into(),
            )),
            Some(_) => {}
            None => {
                if let Some(p) = key_file_problem(&c.storage.data_dir.join("dev-signing.key")) {
                    problems.push(p);
                }
            }
        }
    }
    if c.backend.kind == crate::config::BackendKind::Http
        && c.backend.http_credential.expose().chars().count() < CREDENTIAL_CHARS_MIN
    {
        problems.push((
            format!("backend.http_credential is shorter than {CREDENTIAL_CHARS_MIN} characters"),
            "set PAYGATE_BACKEND__HTTP_CREDENTIAL to the ledger service's long random credential".into(),
        ));
    }
    if problems.is_empty() {
        r.pass(
            "secrets",
            if shared_store { "set and long enough" } else { "set or generated into data_dir, long enough" },
        );
    } else {
        for (detail, fix) in problems {
            r.fail("secrets", detail, fix);
        }
    }
}

/// A generated key file that exists must be non-empty, long enough and private (0600).
fn key_file_problem(path: &Path) -> Option<(String, String)> {
    let meta = std::fs::metadata(path).ok()?; // Absent: generated on first start.
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Some((
                format!("{} is readable by others (mode {mode:o})", path.display()),
                format!("chmod 600 {}", path.display()),
            ));
        }
    }
    let _ = meta;
    let len = std::fs::read_to_string(path).map(|t| t.trim().chars().count()).unwrap_or(0);
    (len < SECRET_CHARS_MIN).then(|| {
        (
            format!("{} holds {len} characters; at least {SECRET_CHARS_MIN} are needed", path.display()),
            format!("delete {} and start paygate once to generate a new one", path.display()),
        )
    })
}

/// A clock matters relative to the identity provider (token `exp`/`nbf`) and the rails; with none of
/// them configured there is nothing to compare with, and nothing a skew could break.
fn clock(c: &Config, remote: &[(String, time::OffsetDateTime)], r: &mut Report) {
    let now = time::OffsetDateTime::now_utc();
    let leeway = c.auth.leeway_secs;
    // HTTP dates have one-second resolution: allow that on top of the token leeway.
    match remote.iter().map(|(who, t)| (who, (now - *t).whole_seconds())).max_by_key(|(_, s)| s.abs()) {
        Some((who, skew)) if skew.abs() > leeway + 1 => r.fail(
            "clock",
            format!("{skew} s off {who}'s clock (tokens tolerate auth.leeway_secs = {leeway} s)"),
            "synchronise the system clock (NTP) on this host or the other",
        ),
        Some((who, skew)) => r.pass("clock", format!("within {} s of {who}'s clock", skew.abs())),
        None => {
            let shown = now.format(&time::format_description::well_known::Rfc3339).unwrap_or_default();
            r.pass("clock", format!("{shown}; no identity provider or rail to compare with"))
        }
    }
}

fn date_header(resp: &reqwest::Response) -> Option<time::OffsetDateTime> {
    let text = resp.headers().get(reqwest::header::DATE)?.to_str().ok()?;
    time::OffsetDateTime::parse(text, &time::format_description::well_known::Rfc2822).ok()
}

/// A reqwest error without its URL (which may carry credentials).
fn describe(e: reqwest::Error) -> String {
    if e.is_timeout() {
        "timed out".into()
    } else if e.is_connect() {
        "connection refused or unreachable".into()
    } else {
        e.without_url().to_string()
    }
}

/// Drop a connection URL (which may hold a password) from an error text.
fn redact_url(text: &str, url: &str) -> String {
    if url.is_empty() { text.to_string() } else { text.replace(url, "<storage.url>") }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn http_dates_parse() {
        let d = time::OffsetDateTime::parse(
            "Sun, 06 Nov 1994 08:49:37 GMT",
            &time::format_description::well_known::Rfc2822,
        )
        .unwrap();
        assert_eq!(d.unix_timestamp(), 784111777);
    }

    #[test]
    fn origins_and_hosts() {
        assert!(is_origin("https://app.example") && is_origin("http://127.0.0.1:3000") && is_origin("http://[::1]:80"));
        for bad in ["https://app.example/", "https://app.example/path", "app.example", "*", "https://a:b", "ftp://x"] {
            assert!(!is_origin(bad), "{bad}");
        }
        assert_eq!(host_of("http://user:pw@[::1]:8080/x"), Some("::1"));
        assert_eq!(host_of("https://idp.example.com/"), Some("idp.example.com"));
        assert!(is_loopback_host("localhost") && is_loopback_host("127.0.0.2") && is_loopback_host("[::1]"));
        assert!(!is_loopback_host("0.0.0.0") && !is_loopback_host("pay.example.com"));
    }
}
