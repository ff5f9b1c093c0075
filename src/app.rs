//! Assembly: config → keys → store → ledger → gateway → router → a running server.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use base64::Engine;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::auth::jwks::JwksCache;
use crate::auth::{AgentAuth, Audience, DevToken, Secret, Verifier};
use crate::backend::ledger::LedgerBackend;
use crate::backend::mpesa::simulator::SIMULATOR_PATH;
use crate::clock::{Clock, SystemClock};
use crate::config::{AirtelEnvironment, BackendKind, Config, MpesaEnvironment};
use crate::domain::payment::AccountSeed;
use crate::gateway::{Gateway, GatewayLimits};
use crate::http::{self, AppInner, AppState, RouterConfig, SessionBindings};
use crate::idempotency::KeyDeriver;
use crate::mandate::MandateKeys;
use crate::store::Store;
use crate::store::postgres::PostgresStore;
use crate::store::sqlite::SqliteStore;

/// How long a TLS handshake may take before the connection is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot bind {addr}: {source}")]
    Bind { addr: String, source: std::io::Error },
    #[error("data directory {path}: {source}")]
    DataDir { path: PathBuf, source: std::io::Error },
    #[error("store: {0}")]
    Store(#[from] crate::domain::error::StoreError),
    #[error("auth: {0}")]
    Auth(String),
    #[error("backend: {0}")]
    Backend(String),
    #[error("policy: {0}")]
    Policy(String),
}

/// The configured backend: the embedded ledger, or an HTTP ledger service behind the gateway's own
/// record (`Journaled`). The HTTP client is returned too, for its breaker gauge.
#[allow(clippy::type_complexity)]
fn backend(
    config: &Config,
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    links: crate::domain::audit_chain::LinkKey,
) -> Result<(Arc<dyn crate::backend::PaymentBackend>, Option<Arc<crate::backend::http::HttpLedger>>), StartError> {
    if config.backend.kind == BackendKind::Ledger {
        return Ok((Arc::new(LedgerBackend::new(store.clone(), clock.clone())), None));
    }
    let b = &config.backend;
    let transport = crate::backend::http::HttpLedgerConfig {
        base_url: b.http_url.trim_end_matches('/').to_string(),
        credential: b.http_credential.clone(),
        connect_timeout: Duration::from_millis(b.http_connect_timeout_ms as u64),
        request_timeout: Duration::from_millis(b.http_request_timeout_ms as u64),
        retries_max: b.http_retries_max as u32,
        breaker_failures_max: b.http_breaker_failures_max as u32,
        breaker_open: Duration::from_millis(b.http_breaker_open_ms as u64),
        tls: crate::backend::outbound::OutboundTls::load(
            &b.tls_ca_file,
            &b.tls_client_cert_file,
            &b.tls_client_key_file,
        )
        .map_err(StartError::Backend)?,
    };
    if b.kind == BackendKind::WalletService {
        let cfg = crate::backend::wallet::WalletConfig {
            transport,
            merchant_id: b.wallet_merchant_id.clone(),
            accounts: b.wallet_accounts.clone(),
        };
        let wallet = crate::backend::wallet::WalletService::new(cfg, clock.clone())
            .map_err(|e| StartError::Backend(e.to_string()))?;
        // Its transport is an HttpLedger: its breaker is the one the gauge shows.
        let transport = wallet.transport();
        let journaled = crate::backend::journal::Journaled::new(Arc::new(wallet), store.clone(), clock.clone(), links);
        return Ok((Arc::new(journaled), Some(transport)));
    }
    let http = crate::backend::http::HttpLedger::new(transport, clock.clone())
        .map_err(|e| StartError::Backend(e.to_string()))?;
    let http = Arc::new(http);
    let journaled = crate::backend::journal::Journaled::new(http.clone(), store.clone(), clock.clone(), links);
    Ok((Arc::new(journaled), Some(http)))
}

/// Every account some profile may use: what reconciliation asks an external ledger about.
fn known_accounts(config: &Config) -> Vec<crate::domain::ids::AccountId> {
    let mut v: Vec<crate::domain::ids::AccountId> =
        config.policy.profiles.iter().flat_map(|p| p.allowed_accounts.iter().cloned()).collect();
    v.sort_by(|a, b| a.as_str().cmp(b.as_str()));
    v.dedup();
    v
}

/// A running gateway. Dropping it does not stop it; call [`Running::shutdown`].
pub struct Running {
    pub addr: SocketAddr,
    /// `scheme://host:port` clients use.
    pub public_url: String,
    pub store: Arc<dyn Store>,
    pub gateway: Arc<Gateway>,
    dev_key: Option<Secret>,
    config: Config,
    clock: Arc<dyn Clock>,
    shutdown: CancellationToken,
    server: JoinHandle<std::io::Result<()>>,
    /// The policy refresh and the scheduler: a job under way finishes before shutdown returns.
    background: Vec<JoinHandle<()>>,
}

impl Running {
    pub fn mcp_url(&self) -> String {
        agent_resource(&self.public_url)
    }

    /// Mint a dev token for `subject` (dev key only) for the MCP resource: an agent's.
    pub fn mint_token(&self, subject: &str, scope: &str, ttl_secs: i64) -> Option<String> {
        self.mint(Audience::Agent, subject, None, scope, ttl_secs)
    }

    /// Mint a dev token for the operator resource: a person's own (dev key only).
    pub fn mint_operator_token(&self, subject: &str, scope: &str, ttl_secs: i64) -> Option<String> {
        self.mint(Audience::Operator, subject, None, scope, ttl_secs)
    }

    /// Mint a dev token for `audience`; with `actor`, a delegated token (RFC 8693: `sub` is the
    /// user, `act.sub` the agent acting for them).
    pub fn mint(
        &self,
        audience: Audience,
        subject: &str,
        actor: Option<&str>,
        scope: &str,
        ttl_secs: i64,
    ) -> Option<String> {
        let key = self.dev_key.as_ref()?;
        let issuer = dev_issuer(&self.config, &self.public_url);
        let audience = match audience {
            Audience::Agent => agent_resource(&self.public_url),
            Audience::Operator => operator_resource(&self.public_url),
        };
        let now = self.clock.now();
        DevToken { issuer: &issuer, audience: &audience, subject, scope, actor, now, ttl_secs }.mint(key).ok()
    }

    /// Stop accepting, end open streams, wait for in-flight requests.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        let _ = self.server.await;
        for task in self.background {
            let _ = task.await;
        }
    }

    /// Wait until the server stops (ctrl-c in `paygate serve`).
    /// The scheduler's job under way finishes before it returns.
    pub async fn wait(self) -> std::io::Result<()> {
        let served = self.server.await.unwrap_or(Ok(()));
        for task in self.background {
            let _ = task.await;
        }
        served
    }

    pub fn shutdown_token(&self) -> CancellationToken {
        self.shutdown.clone()
    }
}

/// Read a base64 secret from `path`, or create one (32 random bytes, mode 0600).
pub fn load_or_create_secret(path: &Path) -> Result<Secret, std::io::Error> {
    if let Ok(text) = std::fs::read_to_string(path) {
        let trimmed = text.trim();
        if !trimmed.is_empty() {
            return Ok(Secret::new(trimmed.to_string()));
        }
    }
    let bytes: [u8; 32] = rand::random();
    let encoded = base64::engine::general_purpose::STANDARD.encode(bytes);
    write_private(path, &encoded)?;
    Ok(Secret::new(encoded))
}

fn write_private(path: &Path, contents: &str) -> std::io::Result<()> {
    use std::io::Write;
    let mut opts = std::fs::OpenOptions::new();
    opts.write(true).create_new(true);
    #[cfg(unix)]
    {
        use std::os::unix::fs::OpenOptionsExt;
        opts.mode(0o600);
    }
    let mut f = opts.open(path)?;
    f.write_all(contents.as_bytes())?;
    f.sync_all()
}

/// The dev signing key: configured, or kept in the data directory.
pub fn dev_key(config: &Config) -> Result<Secret, StartError> {
    if let Some(k) = &config.auth.dev_key {
        return Ok(k.clone());
    }
    let dir = &config.storage.data_dir;
    crate::private_fs::create_dir(dir).map_err(|source| StartError::DataDir { path: dir.clone(), source })?;
    let path = dir.join("dev-signing.key");
    load_or_create_secret(&path).map_err(|source| StartError::DataDir { path, source })
}

/// The MCP resource's identifier: the audience of agents' tokens.
pub fn agent_resource(public_url: &str) -> String {
    format!("{public_url}/mcp")
}

/// The operator resource's identifier: the audience of operators' tokens (the approval routes,
/// `/principals`, `/operator/v1` and the console). Not a path of its own: an identifier.
pub fn operator_resource(public_url: &str) -> String {
    format!("{public_url}/operator")
}

/// The dev key's issuer: configured, or the public URL (the gateway is the dev issuer).
pub fn dev_issuer(config: &Config, public_url: &str) -> String {
    if config.auth.dev_issuer.is_empty() { public_url.to_string() } else { config.auth.dev_issuer.clone() }
}

fn authority(url: &str) -> &str {
    url.split_once("://").map_or(url, |(_, rest)| rest.split('/').next().unwrap_or(rest))
}

fn tls_acceptor(cert_file: &str, key_file: &str) -> Result<tokio_rustls::TlsAcceptor, StartError> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};
    let bad = |what: &str, e: &dyn std::fmt::Display| StartError::Auth(format!("TLS {what}: {e}"));
    let certs = CertificateDer::pem_file_iter(cert_file)
        .map_err(|e| bad(cert_file, &e))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(cert_file, &e))?;
    let key = PrivateKeyDer::from_pem_file(key_file).map_err(|e| bad(key_file, &e))?;
    let mut cfg = rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
        .with_safe_default_protocol_versions()
        .map_err(|e| bad("config", &e))?
        .with_no_client_auth()
        .with_single_cert(certs, key)
        .map_err(|e| bad("certificate", &e))?;
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(tokio_rustls::TlsAcceptor::from(Arc::new(cfg)))
}

/// HTTPS with rustls: one task per connection; on shutdown, stop accepting and let each
/// connection finish its in-flight request.
async fn serve_tls(
    listener: TcpListener,
    acceptor: tokio_rustls::TlsAcceptor,
    router: axum::Router,
    stop: CancellationToken,
) -> std::io::Result<()> {
    let mut conns = tokio::task::JoinSet::new();
    loop {
        let (tcp, peer) = tokio::select! {
            _ = stop.cancelled() => break,
            accepted = listener.accept() => match accepted {
                Ok(a) => a,
                Err(error) => {
                    tracing::warn!(%error, "accept failed");
                    continue;
                }
            },
        };
        let _ = tcp.set_nodelay(true);
        let (acceptor, router, stop) = (acceptor.clone(), router.clone(), stop.clone());
        conns.spawn(async move {
            // A handshake that never completes must not hold a task forever.
            let Ok(Ok(tls)) = tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await else { return };
            // Handlers that check the peer (callback source allow-lists) find it as on plain HTTP.
            let router = router.layer(axum::Extension(axum::extract::ConnectInfo(peer)));
            let service = hyper_util::service::TowerToHyperService::new(router);
            let conn = hyper::server::conn::http1::Builder::new()
                .serve_connection(hyper_util::rt::TokioIo::new(tls), service)
                .with_upgrades();
            tokio::pin!(conn);
            tokio::select! {
                _ = conn.as_mut() => {}
                _ = stop.cancelled() => {
                    conn.as_mut().graceful_shutdown();
                    let _ = conn.await;
                }
            }
        });
        while conns.try_join_next().is_some() {}
    }
    while conns.join_next().await.is_some() {}
    Ok(())
}

/// The Airtel client's settings from `[airtel]`. (Airtel's callback URL is set in its portal, not
/// sent with each request.)
/// The simulator's (`airtel.environment = "simulator"`) base URL is the gateway's own, and its
/// payout credentials are the simulator's to add (it seals PINs with a key of its own).
pub fn airtel_config(config: &Config, public_url: &str) -> Result<crate::backend::airtel::wire::AirtelConfig, String> {
    use crate::backend::airtel::wire::{PRODUCTION_BASE_URL, PayoutCredentials, STAGING_BASE_URL};
    let a = &config.airtel;
    // Validated with the config: both or neither, and they parse.
    let payouts = match (a.disbursement_pin.expose().is_empty(), a.public_key.trim().is_empty()) {
        (false, false) => Some(PayoutCredentials::new(&a.disbursement_pin, &a.public_key)?),
        _ => None,
    };
    Ok(crate::backend::airtel::wire::AirtelConfig {
        base_url: match (a.base_url.as_str(), a.environment) {
            (_, AirtelEnvironment::Simulator) => {
                format!("{}{}", public_url.trim_end_matches('/'), crate::backend::simulator::path("airtel"))
            }
            ("", AirtelEnvironment::Production) => PRODUCTION_BASE_URL.to_string(),
            ("", AirtelEnvironment::Uat) => STAGING_BASE_URL.to_string(),
            (url, _) => url.trim_end_matches('/').to_string(),
        },
        client_id: a.client_id.clone(),
        client_secret: a.client_secret.clone(),
        connect_timeout: Duration::from_millis(a.connect_timeout_ms as u64),
        request_timeout: Duration::from_millis(a.request_timeout_ms as u64),
        token_refresh_margin_secs: a.token_refresh_margin_secs,
        retries_max: a.retries_max as u32,
        breaker_failures_max: a.breaker_failures_max as u32,
        breaker_open: Duration::from_millis(a.breaker_open_ms as u64),
        payouts,
    })
}

/// What the Airtel simulator expects and where it calls back: the gateway's own credentials and PIN,
/// and its collection callback route (the path secret, or the configured header carrying it).
pub fn airtel_simulator_terms(config: &Config, public_url: &str) -> crate::backend::airtel::simulator::Terms {
    let a = &config.airtel;
    let base = format!("{}/callbacks/airtel/collection", public_url.trim_end_matches('/'));
    let (callback_url, callback_header) = if a.callback_secret_header.is_empty() {
        (format!("{base}/{}", a.callback_secret.expose()), None)
    } else {
        (base, Some((a.callback_secret_header.clone(), a.callback_secret.clone())))
    };
    crate::backend::airtel::simulator::Terms {
        client_id: a.client_id.clone(),
        client_secret: a.client_secret.clone(),
        pin: Some(a.disbursement_pin.clone()).filter(|p| !p.expose().is_empty()),
        callback_url,
        callback_header,
    }
}

/// How long an open collection waits before the scheduler asks its rail: the shortest among the
/// enabled rails (the gateway polls every rail with one threshold).
fn rail_query_after_secs(config: &Config) -> i64 {
    let enabled = [
        (config.mpesa.enabled, config.mpesa.query_after_secs),
        (config.airtel.enabled, config.airtel.query_after_secs),
    ];
    enabled.iter().filter(|(on, _)| *on).map(|(_, secs)| *secs).min().unwrap_or(config.mpesa.query_after_secs)
}

/// The Daraja client's settings from `[mpesa]`: base URL by environment, callback URL with its
/// path secret under `mpesa.callback_base_url` (or the public URL).
pub fn daraja_config(config: &Config, public_url: &str) -> crate::backend::mpesa::daraja::DarajaConfig {
    use crate::backend::mpesa::daraja::{DarajaConfig, PRODUCTION_BASE_URL, SANDBOX_BASE_URL};
    let m = &config.mpesa;
    let callback_base = if m.callback_base_url.is_empty() { public_url } else { m.callback_base_url.as_str() };
    // With a secret header, the proxy in front adds the secret: the URLs Daraja holds carry none.
    let callback_url = |channel: &str| {
        let base = callback_base.trim_end_matches('/');
        if m.callback_secret_header.is_empty() {
            format!("{base}/callbacks/mpesa/{channel}/{}", m.callback_secret.expose())
        } else {
            format!("{base}/callbacks/mpesa/{channel}")
        }
    };
    DarajaConfig {
        base_url: match (m.base_url.as_str(), m.environment) {
            ("", MpesaEnvironment::Production) => PRODUCTION_BASE_URL.to_string(),
            ("", MpesaEnvironment::Sandbox) => SANDBOX_BASE_URL.to_string(),
            (_, MpesaEnvironment::Simulator) => format!("{}{SIMULATOR_PATH}", public_url.trim_end_matches('/')),
            (url, _) => url.trim_end_matches('/').to_string(),
        },
        consumer_key: m.consumer_key.clone(),
        consumer_secret: m.consumer_secret.clone(),
        short_code: m.short_code.clone(),
        passkey: m.passkey.clone(),
        callback_url: callback_url("stk"),
        result_url: callback_url("result"),
        timeout_url: callback_url("timeout"),
        initiator_name: m.initiator_name.clone(),
        security_credential: m.security_credential.clone(),
        b2c_short_code: if m.b2c_short_code.is_empty() { m.short_code.clone() } else { m.b2c_short_code.clone() },
        retries_max: m.retries_max as u32,
        breaker_failures_max: m.breaker_failures_max as u32,
        breaker_open: Duration::from_millis(m.breaker_open_ms as u64),
        transaction_type: m.transaction_type.clone(),
        party_b: if m.party_b.is_empty() { m.short_code.clone() } else { m.party_b.clone() },
        connect_timeout: Duration::from_millis(m.connect_timeout_ms as u64),
        request_timeout: Duration::from_millis(m.request_timeout_ms as u64),
        token_refresh_margin_secs: m.token_refresh_margin_secs,
    }
}

/// The public base URL clients use: configured, or derived from the bound address.
pub fn public_url(config: &Config, scheme: &str, addr: &str) -> String {
    if config.server.public_url.is_empty() { format!("{scheme}://{addr}") } else { config.server.public_url.clone() }
}

/// The public URL `serve` will use, as far as the config alone tells (no socket bound):
/// `server.public_url`, or `server.bind` under the scheme its TLS settings give. What the CLI mints
/// tokens for and checks against, so they match the server's audience and issuer.
pub fn configured_public_url(config: &Config) -> String {
    let scheme = if config.server.tls_cert_file.is_empty() { "http" } else { "https" };
    public_url(config, scheme, &config.server.bind)
}

/// Open the configured demo accounts that do not exist yet (when `ledger.demo` is on).
pub async fn seed_demo_accounts(config: &Config, store: &Arc<dyn Store>) -> Result<(), StartError> {
    if !config.ledger.demo {
        return Ok(());
    }
    // Concurrently: each account is its own transaction (the pool or SQLite's group commit takes
    // them together), so start-up does not pay one round trip per configured account.
    let mut opening = tokio::task::JoinSet::new();
    for a in &config.ledger.accounts {
        let seed = AccountSeed {
            id: a.id.clone(),
            currency: a.currency,
            opening_minor: a.opening_minor,
            allow_overdraft: a.allow_overdraft,
        };
        let store = store.clone();
        opening.spawn(async move {
            let id = seed.id.clone();
            store.ledger_open_account(seed, SystemClock.now()).await.map(|created| (id, created))
        });
    }
    while let Some(done) = opening.join_next().await {
        let (id, created) = done.map_err(|e| StartError::Backend(format!("opening demo accounts: {e}")))??;
        if created {
            tracing::info!(account.id = %id, "opened demo account");
        }
    }
    Ok(())
}

/// Open the configured store (running its migrations).
/// The SQLite database file the config names (`storage.url` `sqlite://…`, else `storage.data_dir`
/// joined with `storage.sqlite_file`; relative to the directory paygate runs in).
pub fn sqlite_path(config: &Config) -> PathBuf {
    let st = &config.storage;
    match st.url.strip_prefix("sqlite://") {
        Some(p) => PathBuf::from(p),
        None => st.data_dir.join(&st.sqlite_file),
    }
}

/// For a command that reads a store and must not make one (`audit verify`): the SQLite file the config names must already exist. A relative data_dir read
/// from another directory would otherwise open a new, empty store, and "nothing wrong in it" is
/// not an answer about the gateway's. `Err`: why, naming the absolute path looked for.
pub fn existing_store(config: &Config) -> Result<(), String> {
    if config.storage.is_postgres() {
        return Ok(());
    }
    let path = sqlite_path(config);
    let shown = std::path::absolute(&path).unwrap_or_else(|_| path.clone()).display().to_string();
    if !path.is_file() {
        return Err(format!(
            "no store at {shown}: nothing to check (storage.data_dir is relative to the directory paygate runs \
             in; run it where the gateway runs, or give the path whole)"
        ));
    }
    // Read-only: an empty or foreign file is named, never migrated into a fresh store (the stop-65
    // review: `audit verify` on an empty file made a whole store and answered ok).
    let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
    let trail = rusqlite::Connection::open_with_flags(&path, flags).and_then(|c| {
        c.query_row("SELECT count(*) FROM sqlite_master WHERE type = 'table' AND name = 'audit_records'", [], |r| {
            r.get::<_, i64>(0)
        })
    });
    match trail {
        Ok(1) => Ok(()),
        Ok(_) => Err(format!("{shown} is not a paygate store (it holds no audit trail): nothing to check")),
        Err(e) => Err(format!("{shown} cannot be read as a paygate store: {e}")),
    }
}

pub async fn open_store(config: &Config) -> Result<Arc<dyn Store>, StartError> {
    let st = &config.storage;
    if st.is_postgres() {
        let tls = st.postgres_tls();
        let store = PostgresStore::connect_with(&st.url, &st.postgres_schema, &tls).await?;
        return Ok(Arc::new(store));
    }
    let path = sqlite_path(config);
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        crate::private_fs::create_dir(parent)
            .map_err(|source| StartError::DataDir { path: parent.to_path_buf(), source })?;
    }
    let tuning = crate::store::sqlite::Tuning {
        cache_mib: st.sqlite_cache_mib,
        writer_cache_mib: st.sqlite_writer_cache_mib,
        mmap_mib: st.sqlite_mmap_mib,
    };
    Ok(Arc::new(SqliteStore::open_tuned(&path, tuning)?))
}

/// Start the gateway: bind, open state, serve in the background. Each step is a function below.
pub async fn start(config: Config, clock: Arc<dyn Clock>) -> Result<Running, StartError> {
    crate::install_crypto_provider();
    let bound = bind(&config).await?;
    let public_url = bound.public_url.clone();
    let identity = identity(&config, &clock, &public_url)?;
    let core = core(&config, &clock, &public_url, identity.dev_issuer.clone(), &bound.addr.to_string()).await?;
    let dev_key = identity.dev_key.clone();
    let router = router(&config, &bound, identity, core.route_limits, &core.assembled, &core.shutdown);
    let server = serve(bound.listener, bound.tls, router, core.shutdown.clone());
    tracing::info!(http.addr = %bound.addr, mcp.url = %format!("{public_url}/mcp"), "paygate listening");
    Ok(Running {
        addr: bound.addr,
        public_url,
        store: core.store,
        gateway: core.assembled.gateway,
        dev_key,
        config,
        clock,
        shutdown: core.shutdown,
        server,
        background: core.background,
    })
}

/// `paygate stdio`'s first step: who may call, and nothing else opened or started (but the data
/// directory and the dev key in it, which verification needs), so a token is judged before any
/// state is touched. [`HeadlessStart::start`] is the second.
pub struct HeadlessStart {
    config: Config,
    clock: Arc<dyn Clock>,
    public_url: String,
    identity: Identity,
}

impl HeadlessStart {
    /// The public URL is the one `serve` would use with this config (`server.public_url`, or
    /// derived from `server.bind`, which is never bound here), so an agent's token for the HTTP
    /// gateway is its token for this one.
    pub fn new(config: Config, clock: Arc<dyn Clock>) -> Result<HeadlessStart, StartError> {
        crate::install_crypto_provider();
        let public_url = configured_public_url(&config);
        let identity = identity(&config, &clock, &public_url)?;
        Ok(HeadlessStart { config, clock, public_url, identity })
    }

    /// Agent tokens → principals, exactly as /mcp turns them.
    pub fn agents(&self) -> AgentAuth {
        AgentAuth {
            verifier: self.identity.verifier.clone(),
            legacy_agent_admin_scope: self.config.auth.legacy_agent_admin_scope,
        }
    }

    /// The gateway with no HTTP edge: the same store, backend, rails, policy (kept fresh) and
    /// scheduler as [`start`], listening on no port.
    pub async fn start(self) -> Result<Headless, StartError> {
        let (config, public_url) = (&self.config, &self.public_url);
        let holder = format!("stdio-{}", std::process::id());
        let core = core(config, &self.clock, public_url, self.identity.dev_issuer.clone(), &holder).await?;
        if config.mpesa.enabled || config.airtel.enabled {
            // The rails call back (and the rail simulators answer) at the public URL, which only
            // `paygate serve` answers; the scheduler's polling settles pending collections either way.
            tracing::info!(
                http.public_url = %public_url,
                "no HTTP edge here: rail callbacks and the rail simulators are `paygate serve`'s, at the public URL"
            );
        }
        Ok(Headless {
            agents: self.agents(),
            gateway: core.assembled.gateway,
            disabled_tools: core.assembled.disabled_tools,
            shutdown: core.shutdown,
            background: core.background,
        })
    }
}

/// The gateway with no HTTP edge (`paygate stdio`). Dropping it does not stop the background work;
/// call [`Headless::shutdown`].
pub struct Headless {
    pub gateway: Arc<Gateway>,
    /// Agent tokens → principals, exactly as /mcp turns them.
    pub agents: AgentAuth,
    /// Tools this configuration does not offer (rails not configured), hidden as on /mcp.
    pub disabled_tools: Vec<String>,
    shutdown: CancellationToken,
    background: Vec<JoinHandle<()>>,
}

impl Headless {
    /// Stop the policy refresh and the scheduler, and wait for a job under way to finish.
    pub async fn shutdown(&mut self) {
        self.shutdown.cancel();
        for task in std::mem::take(&mut self.background) {
            let _ = task.await;
        }
    }
}

/// What every edge stands on: the store (migrated; demo accounts opened), the gateway with its
/// policy in force and kept fresh, and the scheduler.
struct Core {
    store: Arc<dyn Store>,
    assembled: Assembled,
    route_limits: Arc<crate::rate::KeyedLimits>,
    shutdown: CancellationToken,
    background: Vec<JoinHandle<()>>,
}

/// Open state and start the background work. `holder`: this process in job leases.
async fn core(
    config: &Config,
    clock: &Arc<dyn Clock>,
    public_url: &str,
    dev_issuer: Option<String>,
    holder: &str,
) -> Result<Core, StartError> {
    let data_dir = &config.storage.data_dir;
    crate::private_fs::create_dir(data_dir).map_err(|source| StartError::DataDir { path: data_dir.clone(), source })?;
    let store = open_store(config).await?;
    if config.backend.kind == BackendKind::Ledger {
        seed_demo_accounts(config, &store).await?;
    }
    let assembled = gateway(config, &store, clock, public_url, dev_issuer)?;
    // The policy in force: the store's newest version (the config file's when the store has none).
    let version = assembled.gateway.load_policy(&config.policy_document()).await.map_err(StartError::Policy)?;
    tracing::info!(policy.version = version, "policy loaded");
    let shutdown = CancellationToken::new();
    let refresh = spawn_policy_refresh(&assembled.gateway, config.policy.refresh_secs, &shutdown);
    // Per-operator limits on the approval routes; the scheduler evicts their idle keys.
    let route_limits = Arc::new(crate::rate::KeyedLimits::new(clock.clone()));
    let jobs = spawn_jobs(config, &assembled, route_limits.clone(), holder, &shutdown);
    Ok(Core { store, assembled, route_limits, shutdown, background: vec![refresh, jobs] })
}

/// The listening socket, TLS when configured, and the public URL clients use.
struct Bound {
    listener: TcpListener,
    addr: SocketAddr,
    tls: Option<tokio_rustls::TlsAcceptor>,
    public_url: String,
}

async fn bind(config: &Config) -> Result<Bound, StartError> {
    let bind_err = |source| StartError::Bind { addr: config.server.bind.clone(), source };
    let listener = TcpListener::bind(&config.server.bind).await.map_err(bind_err)?;
    let addr = listener.local_addr().map_err(bind_err)?;
    let tls = if config.server.tls_cert_file.is_empty() {
        None
    } else {
        Some(tls_acceptor(&config.server.tls_cert_file, &config.server.tls_key_file)?)
    };
    let scheme = if tls.is_some() { "https" } else { "http" };
    let public_url = public_url(config, scheme, &addr.to_string());
    Ok(Bound { listener, addr, tls, public_url })
}

/// Token verification: the dev key (when on) and the identity provider's keys.
struct Identity {
    verifier: Arc<Verifier>,
    dev_key: Option<Secret>,
    /// The dev key's issuer, while the dev key is on.
    dev_issuer: Option<String>,
    /// For the RFC 9728 document.
    authorization_servers: Vec<String>,
}

fn identity(config: &Config, clock: &Arc<dyn Clock>, public_url: &str) -> Result<Identity, StartError> {
    let a = &config.auth;
    let dev_issuer = dev_issuer(config, public_url);
    let mut verifier =
        Verifier::new(agent_resource(public_url), operator_resource(public_url), a.leeway_secs, clock.clone())
            .with_cache(a.verified_token_cache_max as usize);
    let dev_key = if a.dev_key_on() { Some(dev_key(config)?) } else { None };
    if let Some(k) = &dev_key {
        verifier = verifier.with_dev_key(dev_issuer.clone(), k).map_err(StartError::Auth)?;
    }
    let mut authorization_servers = Vec::new();
    if !a.issuer.is_empty() {
        let mut pem_keys = Vec::new();
        for path in &a.public_key_files {
            let pem = std::fs::read(path).map_err(|e| StartError::Auth(format!("{}: {e}", path.display())))?;
            let key = jsonwebtoken::DecodingKey::from_rsa_pem(&pem)
                .or_else(|_| jsonwebtoken::DecodingKey::from_ec_pem(&pem))
                .or_else(|_| jsonwebtoken::DecodingKey::from_ed_pem(&pem))
                .map_err(|_| StartError::Auth(format!("{}: not an RSA, EC or Ed25519 public key", path.display())))?;
            pem_keys.push(key);
        }
        let jwks = if a.jwks_url.is_empty() {
            None
        } else {
            let http = reqwest::Client::builder()
                .timeout(Duration::from_millis(a.jwks_fetch_timeout_ms as u64))
                .redirect(reqwest::redirect::Policy::none())
                .build()
                .map_err(|e| StartError::Auth(e.to_string()))?;
            Some(
                JwksCache::new(
                    a.jwks_url.clone(),
                    http,
                    Duration::from_secs(a.jwks_cache_secs as u64),
                    Duration::from_secs(a.jwks_refetch_min_interval_secs as u64),
                    clock.clone(),
                )
                .with_stale_max(Duration::from_secs(a.jwks_stale_max_secs as u64)),
            )
        };
        verifier = verifier.with_idp(a.issuer.clone(), pem_keys, jwks);
        authorization_servers.push(a.issuer.clone());
    }
    let dev_issuer = dev_key.is_some().then_some(dev_issuer);
    if let Some(i) = &dev_issuer {
        authorization_servers.push(i.clone());
    }
    Ok(Identity { verifier: Arc::new(verifier), dev_key, dev_issuer, authorization_servers })
}

/// The gateway over its backend and rails, and what the HTTP edge needs to know of the rails.
struct Assembled {
    gateway: Arc<Gateway>,
    /// The rails simulated here (`<rail>.environment = "simulator"`).
    simulators: Vec<Arc<dyn crate::backend::simulator::RailSimulator>>,
    http_ledger: Option<Arc<crate::backend::http::HttpLedger>>,
    disabled_tools: Vec<String>,
    rail_callbacks: HashMap<String, Arc<http::CallbackGuard>>,
}

/// The mandate key schedule `[mandates]` gives.
pub fn mandate_schedule(config: &Config) -> Result<crate::mandate::KeySchedule, crate::config::ConfigError> {
    let m = &config.mandates;
    Ok(crate::mandate::KeySchedule {
        key_id: m.key_id.clone(),
        rotate_secs: m.rotate_secs,
        lifetime_max_secs: m.ttl_secs.max(m.open_valid_max_secs),
        hs256_accept_until: m.hs256_until()?,
    })
}

/// A key generated into the data directory unless configured (replicas configure a shared one).
fn secret_or_file(config: &Config, configured: &Option<Secret>, file: &str) -> Result<Secret, StartError> {
    match configured {
        Some(s) => Ok(s.clone()),
        None => {
            let path = config.storage.data_dir.join(file);
            load_or_create_secret(&path).map_err(|source| StartError::DataDir { path, source })
        }
    }
}

fn gateway(
    config: &Config,
    store: &Arc<dyn Store>,
    clock: &Arc<dyn Clock>,
    public_url: &str,
    dev_issuer: Option<String>,
) -> Result<Assembled, StartError> {
    let idem_secret = secret_or_file(config, &config.idempotency.secret, "idempotency.key")?;
    let mandate_secret = secret_or_file(config, &config.mandates.secret, "mandate.key")?;
    let schedule = mandate_schedule(config).map_err(|e| StartError::Auth(e.to_string()))?;
    let mandate_keys = Arc::new(MandateKeys::new(schedule, &mandate_secret).map_err(StartError::Auth)?);
    // The journal of an external ledger tags the records it writes as the gateway does.
    let links = crate::domain::audit_chain::LinkKey::new(
        KeyDeriver::new(idem_secret.clone()).subkey(crate::domain::audit_chain::LINK_KEY_LABEL),
    );
    let (backend, http_ledger) = backend(config, store, clock, links)?;
    let limits = GatewayLimits {
        public_url: public_url.to_string(),
        approval_page_base: config.console.enabled.then(|| format!("{public_url}/console")),
        elicitation_wait: Duration::from_secs(config.approvals.elicitation_wait_secs as u64),
        elicitation_rounds_max: config.approvals.elicitation_rounds_max as u32,
        idempotency_retention_secs: config.idempotency.retention_secs,
        idempotency_lease_secs: config.idempotency.lease_secs,
        idempotency_wait: Duration::from_millis(config.idempotency.wait_ms_max as u64),
        approval_ttl_secs: config.approvals.ttl_secs,
        pending_approvals_per_agent_max: config.approvals.pending_per_agent_max,
        rejected_cooldown_secs: config.approvals.rejected_cooldown_secs,
        reviewers_required: config.approvals.reviewers_required,
        high_risk_reviewers: config.approvals.high_risk_reviewers,
        high_risk_amount_minor: config.approvals.high_risk_amount.iter().collect(),
        passkey_rp: config.passkeys.relying_party(public_url),
        passkey_required_amount_minor: config.passkeys.required_amount.iter().collect(),
        passkeys_per_person_max: config.passkeys.per_person_max,
        passkey_enrolment_code_ttl_secs: config.passkeys.enrolment_code_ttl_secs,
        passkey_challenges_per_person_max: config.passkeys.registration_challenges_max,
        mandate_ttl_secs: config.mandates.ttl_secs,
        open_mandate_valid_max_secs: config.mandates.open_valid_max_secs,
        stop_denials_max: config.stop_rules.denials_max,
        stop_window_secs: config.stop_rules.window_secs,
        rate_limited_per_denial: config.stop_rules.rate_limited_per_denial,
        stop_repeat_max: config.stop_rules.repeat_max as u32,
        refusal_audit_interval_secs: config.audit.refusals_interval_secs,
        audit_seal_batch_max: config.audit.seal_batch_max as u32,
        audit_checkpoint_every_secs: config.audit.checkpoint_every_secs,
        audit_stale_after_secs: config.audit.seal_every_secs + config.audit.unsealed_slack_secs,
        audit_shutdown_seal: Duration::from_millis(config.audit.shutdown_seal_ms as u64),
        list_limit_max: config.limits.list_limit_max as u32,
        list_limit_default: config.limits.list_limit_default as u32,
        reconcile_window_secs: config.jobs.reconcile_window_secs,
        collection_pending_timeout_secs: config.mpesa.pending_timeout_secs,
        resolution_after_secs: config.approvals.resolution_after_secs,
        webhook_routes: match config.webhooks.enabled {
            true => config.webhooks.endpoints.iter().map(|e| (e.name.clone(), e.events.clone())).collect(),
            false => vec![],
        },
        policy: crate::gateway::PolicySettings {
            dev_issuer,
            high_risk_amount: config.approvals.high_risk_amount.clone(),
            simulate_window_max_secs: config.policy.simulate_window_max_secs,
            simulate_records_max: config.policy.simulate_records_max as u32,
            adopt_untagged_versions: config.policy.adopt_untagged_versions,
        },
        shared_quotas: config.limits.shared_quotas(&config.storage),
    };
    let mut gateway =
        Gateway::new(store.clone(), backend, clock.clone(), KeyDeriver::new(idem_secret), mandate_keys, limits)
            .with_known_accounts(known_accounts(config));
    // Tools a rail not configured cannot serve; the policy's `tools.disabled` is applied per call
    // (`mcp`), so a change to it is live.
    let mut disabled_tools = Vec::new();
    let mut rail_callbacks = HashMap::new();
    let mut simulators: Vec<Arc<dyn crate::backend::simulator::RailSimulator>> = Vec::new();
    if config.mpesa.enabled {
        let m = &config.mpesa;
        let daraja = daraja_config(config, public_url);
        if m.environment == MpesaEnvironment::Simulator {
            tracing::warn!(
                "M-Pesa is SIMULATED inside this gateway (mpesa.environment = \"simulator\"): no money moves"
            );
            let sim =
                crate::backend::mpesa::simulator::DarajaSimulator::new(daraja.clone()).map_err(StartError::Backend)?;
            simulators.push(Arc::new(sim));
        }
        let client = crate::backend::mpesa::daraja::DarajaClient::new(daraja, clock.clone())
            .map_err(|e| StartError::Backend(e.to_string()))?;
        let client_offers_payouts = client.initiator_configured();
        let rail = crate::backend::mpesa::MpesaRail::new(client, store.clone(), clock.clone(), m.account.clone());
        if !client_offers_payouts {
            // No initiator configured: payouts are not offered (reversals are refused plainly).
            disabled_tools.extend(["send_mpesa_payout", "pay_paybill", "pay_till"].map(String::from));
        }
        gateway = gateway.with_collection_rail(Arc::new(rail));
        let guard = http::CallbackGuard::new(
            &m.callback_secret,
            m.callback_allowed_ips.clone(),
            m.callback_trusted_proxies.clone(),
            &m.callback_secret_header,
        );
        rail_callbacks.insert(crate::backend::mpesa::RAIL.to_string(), Arc::new(guard));
    } else {
        // Not configured: not offered.
        disabled_tools
            .extend(["request_mpesa_payment", "send_mpesa_payout", "pay_paybill", "pay_till"].map(String::from));
    }
    if config.airtel.enabled {
        let a = &config.airtel;
        let mut airtel = airtel_config(config, public_url).map_err(StartError::Backend)?;
        if a.environment == AirtelEnvironment::Simulator {
            tracing::warn!(
                "Airtel Money is SIMULATED inside this gateway (airtel.environment = \"simulator\"): no money moves"
            );
            let sim =
                crate::backend::airtel::simulator::AirtelSimulator::new(airtel_simulator_terms(config, public_url))
                    .map_err(StartError::Backend)?;
            if !a.disbursement_pin.expose().is_empty() {
                let sealed =
                    crate::backend::airtel::wire::PayoutCredentials::with_key(&a.disbursement_pin, sim.public_key());
                airtel.payouts = Some(sealed.map_err(StartError::Backend)?);
            }
            simulators.push(Arc::new(sim));
        }
        let client = crate::backend::airtel::wire::AirtelClient::new(airtel, clock.clone())
            .map_err(|e| StartError::Backend(e.to_string()))?;
        if !client.pays_out() {
            disabled_tools.push("send_airtel_payout".to_string());
        }
        let rail = crate::backend::airtel::AirtelRail::new(client, store.clone(), clock.clone(), a.account.clone());
        gateway = gateway.with_collection_rail(Arc::new(rail));
        let guard = http::CallbackGuard::new(
            &a.callback_secret,
            a.callback_allowed_ips.clone(),
            a.callback_trusted_proxies.clone(),
            &a.callback_secret_header,
        );
        rail_callbacks.insert(crate::backend::airtel::RAIL.to_string(), Arc::new(guard));
    } else {
        disabled_tools.extend(["request_airtel_payment", "send_airtel_payout"].map(String::from));
    }
    // The tools that choose a rail by phone number route among the enabled rails only.
    let mut tables: Vec<(&str, &[String])> = Vec::new();
    if config.mpesa.enabled {
        tables.push((crate::backend::mpesa::RAIL, &config.mpesa.prefixes));
    }
    if config.airtel.enabled {
        tables.push((crate::backend::airtel::RAIL, &config.airtel.prefixes));
    }
    if tables.is_empty() {
        disabled_tools.push("request_payment".to_string());
    }
    if ["send_mpesa_payout", "send_airtel_payout"].iter().all(|t| disabled_tools.iter().any(|d| d == t)) {
        // No rail pays customers: send_payment has nowhere to route.
        disabled_tools.push("send_payment".to_string());
    }
    gateway = gateway.with_phone_routes(crate::gateway::PhoneRoutes::new(tables));
    Ok(Assembled { gateway: Arc::new(gateway), simulators, http_ledger, disabled_tools, rail_callbacks })
}

/// The HTTP edge: the app state every handler shares, and the router over it.
fn router(
    config: &Config,
    bound: &Bound,
    identity: Identity,
    route_limits: Arc<crate::rate::KeyedLimits>,
    assembled: &Assembled,
    shutdown: &CancellationToken,
) -> axum::Router {
    let public_url = &bound.public_url;
    let mut allowed_origins = vec![public_url.trim_end_matches('/').to_string()];
    allowed_origins.extend(config.server.allowed_origins.iter().cloned());
    let host = authority(public_url).to_string();
    let mut allowed_hosts = vec![host.clone(), bound.addr.to_string()];
    if let Some((h, _port)) = host.rsplit_once(':') {
        allowed_hosts.push(h.to_string());
    }
    let verifier = identity.verifier;
    let state = AppState::new(AppInner {
        gateway: assembled.gateway.clone(),
        route_limits,
        routes_per_minute: config.approvals.routes_per_minute as u32,
        verifier: verifier.clone(),
        sessions: Arc::new(SessionBindings::new(
            Duration::from_secs(config.server.session_idle_secs as u64),
            config.server.sessions_max as usize,
            config.server.sessions_per_principal_max as usize,
        )),
        session_idle_secs: config.server.session_idle_secs as u64,
        resource_url: agent_resource(public_url),
        metadata_url: format!("{public_url}{}/mcp", http::METADATA_PATH),
        operator_resource_url: operator_resource(public_url),
        operator_metadata_url: format!("{public_url}{}/operator", http::METADATA_PATH),
        agents: AgentAuth { verifier, legacy_agent_admin_scope: config.auth.legacy_agent_admin_scope },
        authorization_servers: identity.authorization_servers,
        allowed_origins,
        body_bytes_max: config.server.body_bytes_max as usize,
        rail_callbacks: Arc::new(assembled.rail_callbacks.clone()),
        simulators: assembled.simulators.clone(),
        metrics_token: Some(config.server.metrics_token.clone()).filter(|t| !t.expose().is_empty()),
        console: config.console.enabled.then(|| http::ConsoleSettings {
            oidc: (!config.console.client_id.is_empty())
                .then(|| (config.auth.issuer.clone(), config.console.client_id.clone())),
            dev_sign_in: identity.dev_issuer.is_some(),
        }),
    });
    http::router(
        state,
        RouterConfig {
            request_timeout: Duration::from_millis(config.server.request_timeout_ms as u64),
            session_idle: Duration::from_secs(config.server.session_idle_secs as u64),
            allowed_hosts,
            shutdown: shutdown.clone(),
            disabled_tools: assembled.disabled_tools.clone(),
        },
    )
}

/// Each replica puts the store's newest policy version in force within `every_secs` (not a leased
/// job: every replica must, and it runs whether or not the scheduler does).
fn spawn_policy_refresh(gateway: &Arc<Gateway>, every_secs: i64, shutdown: &CancellationToken) -> JoinHandle<()> {
    let (gateway, stop) = (gateway.clone(), shutdown.clone());
    let every = Duration::from_secs(every_secs.max(1) as u64);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(every);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = tick.tick() => {
                    if let Err(error) = gateway.refresh_policy().await {
                        tracing::warn!(%error, "policy refresh failed; the version in force stands");
                    }
                }
            }
        }
    })
}

/// The in-process scheduler (M-Pesa polling, idempotency purge, reconciliation).
fn spawn_jobs(
    config: &Config,
    assembled: &Assembled,
    route_limits: Arc<crate::rate::KeyedLimits>,
    holder: &str,
    shutdown: &CancellationToken,
) -> JoinHandle<()> {
    let webhooks = config.webhooks.enabled.then(|| webhooks(config, assembled)).flatten();
    tokio::spawn(crate::jobs::run(crate::jobs::Scheduler {
        webhooks: webhooks.map(|w| (w, config.webhooks.every_secs)),
        gateway: assembled.gateway.clone(),
        route_limits,
        http_ledger: assembled.http_ledger.clone(),
        config: config.jobs.clone(),
        mpesa_query_after_secs: rail_query_after_secs(config),
        audit_archive: config.audit_archive(),
        audit_seal: crate::jobs::SealSettings {
            every_secs: config.audit.seal_every_secs,
            batch_max: config.audit.seal_batch_max as u32,
        },
        holder: format!("{holder}-{}", uuid::Uuid::new_v4().simple()),
        stop: shutdown.clone(),
    }))
}

/// Webhook delivery over the gateway's store and clock (config checked every endpoint's secret).
fn webhooks(config: &Config, assembled: &Assembled) -> Option<Arc<crate::webhooks::Webhooks>> {
    let w = &config.webhooks;
    let endpoints = w
        .endpoints
        .iter()
        .filter_map(|e| {
            let secret = e.secret.clone()?;
            Some(crate::webhooks::Endpoint { name: e.name.clone(), url: e.url.clone(), secret })
        })
        .collect();
    let settings = crate::webhooks::Settings {
        batch_max: w.batch_max,
        attempts_max: w.attempts_max,
        backoff_initial_secs: w.backoff_initial_secs,
        backoff_max_secs: w.backoff_max_secs,
        timeout: Duration::from_millis(w.timeout_ms as u64),
        breaker_failures: w.breaker_failures,
        breaker_open_secs: w.breaker_open_secs,
    };
    let g = &assembled.gateway;
    match crate::webhooks::Webhooks::new(endpoints, settings, g.store().clone(), g.clock().clone()) {
        Ok(w) => Some(Arc::new(w)),
        Err(error) => {
            tracing::error!(%error, "webhooks are off");
            None
        }
    }
}

/// Serve plain HTTP (or HTTPS) until `stop` is cancelled; in-flight requests finish.
fn serve(
    listener: TcpListener,
    tls: Option<tokio_rustls::TlsAcceptor>,
    router: axum::Router,
    stop: CancellationToken,
) -> JoinHandle<std::io::Result<()>> {
    match tls {
        None => tokio::spawn(async move {
            use axum::serve::ListenerExt;
            // Small SSE frames must not wait for Nagle and delayed ACKs (a ~40 ms stall per response).
            let listener = listener.tap_io(|tcp| {
                let _ = tcp.set_nodelay(true);
            });
            axum::serve(listener, router.into_make_service_with_connect_info::<SocketAddr>())
                .with_graceful_shutdown(async move { stop.cancelled_owned().await })
                .await
        }),
        Some(acceptor) => tokio::spawn(serve_tls(listener, acceptor, router, stop)),
    }
}

/// Start with the system clock.
pub async fn start_default(config: Config) -> Result<Running, StartError> {
    start(config, Arc::new(SystemClock)).await
}
