//! Typed configuration: `config/default.toml` (compiled in) → optional file → `PAYGATE_*` env.
//! Every limit is range-checked here, at start, so a bad value never reaches a request path.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::domain::ids::AccountId;
use crate::domain::money::{Currency, MoneyMap, parse_minor};
pub use crate::domain::policy_doc::{
    COOLING_OFF_SECS_MAX, PayeesConfig, PolicyConfig, PolicyDocument, PolicyError, ProfileConfig, ToolsConfig,
};

pub const DEFAULT_TOML: &str = include_str!("../config/default.toml");
const ENV_PREFIX: &str = "PAYGATE_";

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config is not valid TOML: {0}")]
    Parse(String),
    #[error("environment variable {0} does not name a config key")]
    UnknownEnv(String),
    #[error("config key {key} = {value} is out of range {min}..={max}")]
    OutOfRange { key: &'static str, value: i64, min: i64, max: i64 },
    #[error("config is invalid: {0}")]
    Invalid(String),
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub server: ServerConfig,
    pub storage: StorageConfig,
    pub auth: AuthConfig,
    pub dev: DevConfig,
    pub idempotency: IdempotencyConfig,
    pub approvals: ApprovalsConfig,
    pub mandates: MandatesConfig,
    pub stop_rules: StopRulesConfig,
    pub tools: ToolsConfig,
    pub limits: LimitsConfig,
    pub policy: PolicyConfig,
    pub ledger: LedgerConfig,
    pub backend: BackendConfig,
    pub mpesa: MpesaConfig,
    pub airtel: AirtelConfig,
    pub jobs: JobsConfig,
    pub webhooks: WebhooksConfig,
    pub audit: AuditConfig,
    pub console: ConsoleConfig,
    pub passkeys: PasskeysConfig,
    pub telemetry: TelemetryConfig,
}

/// Passkey-signed approvals (`crate::passkey`, `gateway::passkeys`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PasskeysConfig {
    /// WebAuthn relying party id; empty: the host of `server.public_url`.
    pub rp_id: String,
    pub per_person_max: i64,
    /// How long an enrolment code may be used, in seconds.
    pub enrolment_code_ttl_secs: i64,
    /// Unexpired registration challenges one person may hold at once.
    pub registration_challenges_max: i64,
    /// At or above this amount (per currency) deciding an approval needs a passkey.
    pub required_amount: MoneyMap,
}

impl PasskeysConfig {
    /// The relying party (id, origin) for the console at `public_url`, or why there is none: the
    /// origin is `public_url` itself, and a WebAuthn RP id is a domain name (browsers refuse IP
    /// addresses), equal to the host or a suffix of it.
    pub fn relying_party(&self, public_url: &str) -> Result<(String, String), String> {
        let host_port = public_url.split_once("://").map_or("", |(_, rest)| rest);
        let host = match host_port.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(""),
            None => host_port.rsplit_once(':').map_or(host_port, |(h, _)| h),
        };
        if host.parse::<std::net::IpAddr>().is_ok() || host.is_empty() {
            return Err(format!(
                "passkeys need server.public_url to name a host (e.g. http://localhost:8080), not {public_url:?}: \
                 browsers refuse WebAuthn on an IP address"
            ));
        }
        let rp_id = if self.rp_id.is_empty() { host.to_string() } else { self.rp_id.to_lowercase() };
        if host != rp_id && !host.ends_with(&format!(".{rp_id}")) {
            return Err(format!("passkeys.rp_id {rp_id:?} must be the host of server.public_url or a suffix of it"));
        }
        Ok((rp_id, public_url.to_string()))
    }
}

impl TelemetryConfig {
    /// The exporter's settings (ranges were checked at load).
    pub fn settings(&self) -> crate::telemetry::Settings {
        let ms = |v: i64| std::time::Duration::from_millis(u64::try_from(v).unwrap_or(0));
        crate::telemetry::Settings {
            otlp_endpoint: self.otlp_endpoint.clone(),
            service_name: self.service_name.clone(),
            export_interval: ms(self.export_interval_ms),
            export_timeout: ms(self.export_timeout_ms),
            queue_max: usize::try_from(self.queue_max).unwrap_or(2048),
        }
    }
}

/// OpenTelemetry traces (`crate::telemetry`): OTLP over HTTP/protobuf, off by default.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TelemetryConfig {
    pub enabled: bool,
    /// The collector's OTLP/HTTP traces URL, e.g. `http://otel-collector:4318/v1/traces`.
    pub otlp_endpoint: String,
    pub service_name: String,
    /// Spans are sent in batches at least this often (and whenever a batch fills).
    pub export_interval_ms: i64,
    /// One export's deadline; a collector that does not answer in time loses that batch only.
    pub export_timeout_ms: i64,
    /// Spans waiting for export at most; past it new spans are dropped (counted), never blocking a request.
    pub queue_max: i64,
}

/// Audit retention and archival (`crate::audit_archive`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditConfig {
    pub seal_every_secs: i64,
    pub seal_batch_max: i64,
    /// Every sealing run that moves the head signs it; of those, the store keeps the newest and at
    /// most one per this many seconds before it (retention markers always).
    pub checkpoint_every_secs: i64,
    /// `audit verify` fails on records unsealed, or links unsigned, for longer than
    /// `seal_every_secs` plus this.
    pub unsealed_slack_secs: i64,
    /// A graceful stop seals what committed for at most this long before the process exits.
    pub shutdown_seal_ms: i64,
    pub retention_days: i64,
    /// Empty: `<storage.data_dir>/audit-archive`.
    pub archive_dir: String,
    pub archive_batch_max: i64,
    /// Refusals decided before a call's body runs are audited at most once per this many seconds
    /// per principal, tool and code (the record carries the count).
    pub refusals_interval_secs: i64,
}

impl StorageConfig {
    /// The store is a PostgreSQL database (replicas may share it).
    pub fn is_postgres(&self) -> bool {
        self.url.starts_with("postgres://") || self.url.starts_with("postgresql://")
    }

    /// How the PostgreSQL store is reached (validated at load).
    pub fn postgres_tls(&self) -> crate::store::postgres::tls::TlsSettings {
        use crate::store::postgres::tls::{SslMode, TlsSettings};
        TlsSettings {
            mode: SslMode::parse(&self.postgres_sslmode).unwrap_or(SslMode::VerifyFull),
            ca_file: (!self.postgres_ssl_ca_file.is_empty()).then(|| PathBuf::from(&self.postgres_ssl_ca_file)),
        }
    }
}

impl Config {
    /// The archival settings, when retention is on.
    pub fn audit_archive(&self) -> Option<crate::audit_archive::Settings> {
        let a = &self.audit;
        (a.retention_days > 0).then(|| crate::audit_archive::Settings {
            retention_secs: a.retention_days * 86_400,
            dir: if a.archive_dir.is_empty() {
                self.storage.data_dir.join("audit-archive")
            } else {
                PathBuf::from(&a.archive_dir)
            },
            batch_max: a.archive_batch_max as u32,
        })
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServerConfig {
    pub bind: String,
    pub public_url: String,
    pub allowed_origins: Vec<String>,
    pub body_bytes_max: i64,
    pub request_timeout_ms: i64,
    pub session_idle_secs: i64,
    pub sessions_max: i64,
    pub sessions_per_principal_max: i64,
    pub tls_cert_file: String,
    pub tls_key_file: String,
    pub metrics_token: crate::secret::Secret,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StorageConfig {
    pub data_dir: PathBuf,
    pub sqlite_file: String,
    pub url: String,
    pub postgres_schema: String,
    /// "disable", "require" or "verify-full" (libpq's names); see `store::postgres::tls`.
    pub postgres_sslmode: String,
    /// PEM CA certificate(s) `verify-full` checks the server against; empty: the system's roots.
    pub postgres_ssl_ca_file: String,
    /// SQLite page cache of each reader connection, in MiB.
    pub sqlite_cache_mib: i64,
    /// SQLite page cache of the writer connection, in MiB.
    pub sqlite_writer_cache_mib: i64,
    /// SQLite memory-mapped reads, in MiB (0: none).
    pub sqlite_mmap_mib: i64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuthConfig {
    pub issuer: String,
    pub jwks_url: String,
    pub public_key_files: Vec<PathBuf>,
    pub jwks_cache_secs: i64,
    pub jwks_refetch_min_interval_secs: i64,
    /// How long past `jwks_cache_secs` the last key set keeps verifying while the IdP is unreachable.
    pub jwks_stale_max_secs: i64,
    pub jwks_fetch_timeout_ms: i64,
    pub leeway_secs: i64,
    pub verified_token_cache_max: i64,
    /// `None`: on exactly while no identity provider is configured ([`AuthConfig::dev_key_on`]).
    #[serde(default)]
    pub dev_key_enabled: Option<bool>,
    pub dev_issuer: String,
    /// Migration switch: an agent token's `payments:admin` (the agent-side admin scope's old name)
    /// reads as `payments:integrity`. Off by default: `payments:admin` is an operator scope.
    pub legacy_agent_admin_scope: bool,
    /// The dev HS256 key itself (base64). Normally absent: generated into data_dir. Never logged.
    #[serde(default)]
    pub dev_key: Option<crate::secret::Secret>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DevConfig {
    pub print_token: bool,
    pub subject: String,
    pub scopes: String,
    pub token_ttl_secs: i64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IdempotencyConfig {
    pub retention_secs: i64,
    pub lease_secs: i64,
    pub wait_ms_max: i64,
    /// HMAC secret for idempotency keys (base64). Normally absent: generated into data_dir.
    /// Replicas sharing a database must share it. Never logged.
    #[serde(default)]
    pub secret: Option<crate::secret::Secret>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ApprovalsConfig {
    pub ttl_secs: i64,
    pub reviewers_required: i64,
    pub high_risk_reviewers: i64,
    pub high_risk_amount: MoneyMap,
    pub routes_per_minute: i64,
    pub pending_per_agent_max: i64,
    /// After a human rejects a payment, the same intent asked again under any operation_id is
    /// APPROVAL_REJECTED for this long, in seconds (no new approval, no new webhook).
    pub rejected_cooldown_secs: i64,
    /// URL elicitation: how long a retry waits for a pending approval's decision, in seconds.
    pub elicitation_wait_secs: i64,
    /// URL elicitation: retries answered `input_required` while pending, per sealed state chain.
    pub elicitation_rounds_max: i64,
    /// A payout whose outcome is unknown (the rail has no answer about it) may be settled by two
    /// operators this long after it was made, in seconds.
    pub resolution_after_secs: i64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MandatesConfig {
    pub key_id: String,
    pub rotate_secs: i64,
    /// RFC 3339; empty: HS256 mandates are not accepted.
    pub hs256_accept_until: String,
    pub ttl_secs: i64,
    pub open_valid_max_secs: i64,
    /// HMAC key (base64). Normally absent: generated into data_dir. Never logged.
    #[serde(default)]
    pub secret: Option<crate::secret::Secret>,
}

impl MandatesConfig {
    /// `hs256_accept_until` as Unix seconds; `None` when empty.
    pub fn hs256_until(&self) -> Result<Option<i64>, ConfigError> {
        if self.hs256_accept_until.is_empty() {
            return Ok(None);
        }
        time::OffsetDateTime::parse(&self.hs256_accept_until, &time::format_description::well_known::Rfc3339)
            .map(|t| Some(t.unix_timestamp()))
            .map_err(|_| ConfigError::Invalid("mandates.hs256_accept_until must be an RFC 3339 time or empty".into()))
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StopRulesConfig {
    pub denials_max: i64,
    pub window_secs: i64,
    /// This many RATE_LIMITED answers count as one denial (0: they never count).
    pub rate_limited_per_denial: i64,
    /// The same refusal for the same intent this many times in a row suspends (0: off).
    pub repeat_max: i64,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitsConfig {
    pub list_limit_max: i64,
    pub list_limit_default: i64,
    /// Where agents' rate quotas are kept: "auto" (shared on PostgreSQL, in process on SQLite),
    /// "shared" (the store's buckets, one per agent across replicas), "replica" (in process).
    pub quotas: String,
}

impl LimitsConfig {
    /// Whether agents' quotas are kept in the store, shared by every replica on it.
    pub fn shared_quotas(&self, storage: &StorageConfig) -> bool {
        match self.quotas.as_str() {
            "shared" => true,
            "replica" => false,
            _ => storage.is_postgres(),
        }
    }
}

#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LedgerConfig {
    pub demo: bool,
    #[serde(default)]
    pub accounts: Vec<DemoAccount>,
}

/// Where money moves: the embedded reference ledger, or a ledger service over HTTP.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BackendConfig {
    pub kind: BackendKind,
    pub http_url: String,
    pub http_credential: crate::secret::Secret,
    pub http_connect_timeout_ms: i64,
    pub http_request_timeout_ms: i64,
    pub http_retries_max: i64,
    pub http_breaker_failures_max: i64,
    pub http_breaker_open_ms: i64,
    /// Mutual TLS and a private CA for the ledger service (kind = "http"): PEM files, empty = not set.
    pub tls_ca_file: String,
    pub tls_client_cert_file: String,
    pub tls_client_key_file: String,
    /// kind = "wallet-service": the `merchantId` every payment is made under (the service scopes
    /// idempotency keys by it).
    pub wallet_merchant_id: String,
    /// kind = "wallet-service": each paygate account id and the service's UUID for it.
    pub wallet_accounts: std::collections::BTreeMap<AccountId, crate::backend::wallet::WalletAccount>,
}

/// The Safaricom M-Pesa Daraja rail (STK push collections).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MpesaConfig {
    pub enabled: bool,
    /// `base_url` overrides it.
    pub environment: MpesaEnvironment,
    pub base_url: String,
    pub consumer_key: crate::secret::Secret,
    pub consumer_secret: crate::secret::Secret,
    pub short_code: String,
    pub passkey: crate::secret::Secret,
    pub transaction_type: String,
    pub party_b: String,
    pub account: AccountId,
    pub callback_secret: crate::secret::Secret,
    pub callback_base_url: String,
    pub callback_allowed_ips: Vec<std::net::IpAddr>,
    pub callback_trusted_proxies: Vec<std::net::IpAddr>,
    /// Empty: the callback secret is in the path. Otherwise the header that carries it (put there
    /// by a proxy), and the callback URLs sent to Daraja carry no secret.
    pub callback_secret_header: String,
    pub initiator_name: String,
    pub security_credential: crate::secret::Secret,
    pub b2c_short_code: String,
    pub retries_max: i64,
    pub breaker_failures_max: i64,
    pub breaker_open_ms: i64,
    pub connect_timeout_ms: i64,
    pub request_timeout_ms: i64,
    pub token_refresh_margin_secs: i64,
    pub query_after_secs: i64,
    pub pending_timeout_secs: i64,
    /// Subscriber-number prefixes Safaricom serves (routing by phone number).
    pub prefixes: Vec<String>,
}

/// The Airtel Money (Kenya) rail: collections, callbacks at `/callbacks/airtel/collection/<secret>`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AirtelConfig {
    pub enabled: bool,
    /// `base_url` overrides it (not with the simulator).
    pub environment: AirtelEnvironment,
    /// Empty: the environment's host.
    pub base_url: String,
    pub client_id: crate::secret::Secret,
    pub client_secret: crate::secret::Secret,
    pub account: AccountId,
    pub callback_secret: crate::secret::Secret,
    pub callback_allowed_ips: Vec<std::net::IpAddr>,
    pub callback_trusted_proxies: Vec<std::net::IpAddr>,
    /// Empty: the callback secret is in the path. Otherwise the header that carries it.
    pub callback_secret_header: String,
    pub retries_max: i64,
    pub breaker_failures_max: i64,
    pub breaker_open_ms: i64,
    pub connect_timeout_ms: i64,
    pub request_timeout_ms: i64,
    pub token_refresh_margin_secs: i64,
    pub query_after_secs: i64,
    /// Subscriber-number prefixes Airtel Kenya serves (routing by phone number).
    pub prefixes: Vec<String>,
    /// The disbursing wallet's PIN; with `public_key`, payouts (`send_airtel_payout`) are offered.
    pub disbursement_pin: crate::secret::Secret,
    /// Airtel's RSA public key the PIN is encrypted with (base64 DER as the portal gives it, or PEM).
    pub public_key: String,
}

/// The operator console (`/console`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConsoleConfig {
    pub enabled: bool,
    /// OpenID Connect public client id at `auth.issuer`; empty: sign in by pasting a token.
    pub client_id: String,
}

/// Outbound webhooks (Standard Webhooks): the outbox's delivery and its endpoints.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksConfig {
    pub enabled: bool,
    pub every_secs: i64,
    pub batch_max: i64,
    pub attempts_max: i64,
    pub backoff_initial_secs: i64,
    pub backoff_max_secs: i64,
    pub timeout_ms: i64,
    pub breaker_failures: i64,
    pub breaker_open_secs: i64,
    pub endpoints: Vec<WebhookEndpoint>,
}

/// One receiver of webhooks.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhookEndpoint {
    pub name: String,
    pub url: String,
    /// The environment variable holding its secret (`whsec_…`): secrets never sit in the file.
    pub secret_env: String,
    #[serde(default)]
    pub events: Vec<String>,
    /// Read from `secret_env` when the config loads.
    #[serde(skip)]
    pub secret: Option<crate::secret::Secret>,
}

impl WebhookEndpoint {
    /// Whether this endpoint hears about `event`.
    pub fn wants(&self, event: &str) -> bool {
        self.events.is_empty() || self.events.iter().any(|e| e == event)
    }
}

/// The in-process scheduler: one run of each job at a time across replicas (a lease in the store).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JobsConfig {
    pub enabled: bool,
    pub tick_ms: i64,
    pub mpesa_poll_every_secs: i64,
    pub purge_every_secs: i64,
    pub reconcile_every_secs: i64,
    pub reconcile_window_secs: i64,
    /// The incremental ledger check, whose clean result moves the checkpoint forward.
    pub integrity_every_secs: i64,
    /// The full ledger check (every posting, refunds, usage counters): what the incremental one
    /// does not hold.
    pub integrity_full_every_secs: i64,
    pub lease_secs: i64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// The embedded double-entry reference ledger, in the store's database.
    Ledger,
    /// A ledger service over docs/ledger-api.yaml.
    Http,
    /// The payments wallet service (`backend::wallet`).
    #[serde(rename = "wallet-service")]
    WalletService,
}

impl BackendKind {
    /// An external ledger over HTTP (the gateway keeps its own record of every payment).
    pub fn is_external(self) -> bool {
        match self {
            BackendKind::Ledger => false,
            BackendKind::Http | BackendKind::WalletService => true,
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MpesaEnvironment {
    Sandbox,
    Production,
    /// Daraja simulated inside the gateway (`backend::mpesa::simulator`): no credentials reach
    /// Safaricom and no money moves. For demos and first steps.
    Simulator,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AirtelEnvironment {
    /// Airtel's UAT (sandbox) host.
    Uat,
    Production,
    /// Airtel's API simulated inside the gateway (`backend::airtel::simulator`): no credentials
    /// reach Airtel and no money moves. For demos and first steps.
    Simulator,
}

/// A demo account opened on first start (`ledger.demo`), its opening balance parsed by currency.
#[derive(Debug, Clone, Deserialize)]
#[serde(try_from = "RawDemoAccount")]
pub struct DemoAccount {
    pub id: AccountId,
    pub currency: Currency,
    pub opening_minor: i64,
    pub allow_overdraft: bool,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawDemoAccount {
    id: AccountId,
    currency: Currency,
    opening_balance: String,
    #[serde(default)]
    allow_overdraft: bool,
}

impl TryFrom<RawDemoAccount> for DemoAccount {
    type Error = String;
    fn try_from(raw: RawDemoAccount) -> Result<Self, String> {
        let opening_minor =
            parse_minor(&raw.opening_balance, raw.currency).map_err(|e| format!("ledger account {}: {e}", raw.id))?;
        Ok(DemoAccount { id: raw.id, currency: raw.currency, opening_minor, allow_overdraft: raw.allow_overdraft })
    }
}

impl AuthConfig {
    /// An identity provider issues agents' tokens: an issuer and keys to verify them with.
    pub fn idp_configured(&self) -> bool {
        !self.issuer.is_empty() && (!self.jwks_url.is_empty() || !self.public_key_files.is_empty())
    }

    /// Whether dev-key tokens are accepted: as configured, else only without an identity provider.
    pub fn dev_key_on(&self) -> bool {
        self.dev_key_enabled.unwrap_or(!self.idp_configured())
    }
}

impl Config {
    /// The `[policy]` and `[tools]` sections: the policy the store versions (version 1 of an empty
    /// store; `paygate policy import` applies a file's as a new version).
    pub fn policy_document(&self) -> PolicyDocument {
        PolicyDocument { policy: self.policy.clone(), tools: self.tools.clone() }
    }

    /// Defaults, then the file (if any), then `PAYGATE_*` variables from `env`.
    pub fn load(file: Option<&Path>, env: impl IntoIterator<Item = (String, String)>) -> Result<Config, ConfigError> {
        let mut root: toml::Table =
            DEFAULT_TOML.parse().map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
        if let Some(path) = file {
            let text = std::fs::read_to_string(path)
                .map_err(|source| ConfigError::Read { path: path.to_path_buf(), source })?;
            let overlay: toml::Table = text.parse().map_err(|e: toml::de::Error| ConfigError::Parse(e.to_string()))?;
            merge(&mut root, overlay);
        }
        let env: Vec<(String, String)> = env.into_iter().collect();
        for (name, value) in env.iter().cloned() {
            // Only PAYGATE_<SECTION>__<KEY> names config; PAYGATE_LOG, PAYGATE_CONFIG and
            // PAYGATE_TEST_* belong to others.
            let Some(rest) = name.strip_prefix(ENV_PREFIX).filter(|r| r.contains("__")) else { continue };
            let path: Vec<String> = rest.split("__").map(|p| p.to_ascii_lowercase()).collect();
            if path.len() != 2 || path.iter().any(String::is_empty) {
                return Err(ConfigError::UnknownEnv(name));
            }
            set_from_env(&mut root, &path[0], &path[1], &value).map_err(|_| ConfigError::UnknownEnv(name.clone()))?;
        }
        // Values are parsed into their types here (amounts by currency, account ids, enums, IP
        // addresses), so an invalid one names its key and nothing re-parses config later.
        let mut config: Config = toml::Value::Table(root)
            .try_into()
            .map_err(|e: toml::de::Error| ConfigError::Invalid(e.to_string().trim().replace('\n', " ")))?;
        // Webhook secrets come from the environment only (never the file).
        for ep in &mut config.webhooks.endpoints {
            ep.secret =
                env.iter().find(|(k, _)| *k == ep.secret_env).map(|(_, v)| crate::secret::Secret::new(v.clone()));
        }
        config.validate()?;
        Ok(config)
    }

    /// Defaults plus the process environment; what tests and `paygate token` start from.
    pub fn from_env(file: Option<&Path>) -> Result<Config, ConfigError> {
        Self::load(file, std::env::vars())
    }

    fn validate_rails(&self) -> Result<(), ConfigError> {
        let b = &self.backend;
        range("backend.http_connect_timeout_ms", b.http_connect_timeout_ms, 10, 60_000)?;
        range("backend.http_request_timeout_ms", b.http_request_timeout_ms, 10, 300_000)?;
        range("backend.http_retries_max", b.http_retries_max, 0, 10)?;
        range("backend.http_breaker_failures_max", b.http_breaker_failures_max, 1, 1000)?;
        range("backend.http_breaker_open_ms", b.http_breaker_open_ms, 10, 3_600_000)?;
        if b.kind == BackendKind::WalletService {
            if !(b.http_url.starts_with("http://") || b.http_url.starts_with("https://")) {
                return Err(ConfigError::Invalid(
                    "backend.http_url must be an http(s) URL with backend.kind = \"wallet-service\"".into(),
                ));
            }
            let m = b.wallet_merchant_id.trim();
            let max = crate::backend::wallet::MERCHANT_ID_CHARS_MAX;
            if m.is_empty() || m.chars().count() > max || m.chars().any(char::is_control) {
                return Err(ConfigError::Invalid(format!(
                    "backend.wallet_merchant_id must be 1-{max} printable characters with backend.kind = \"wallet-service\""
                )));
            }
            let accounts_max = crate::backend::wallet::ACCOUNTS_MAX;
            if b.wallet_accounts.is_empty() || b.wallet_accounts.len() > accounts_max {
                return Err(ConfigError::Invalid(format!(
                    "backend.wallet_accounts must map 1-{accounts_max} paygate account ids to the service's UUIDs"
                )));
            }
            let mut seen = std::collections::BTreeSet::new();
            for (id, uuid) in &b.wallet_accounts {
                if !seen.insert(uuid) {
                    return Err(ConfigError::Invalid(format!(
                        "backend.wallet_accounts: {id} maps to {}, which another account maps to",
                        uuid.as_str()
                    )));
                }
            }
            // Every account a profile may use must reach the service.
            for p in &self.policy.profiles {
                for a in &p.allowed_accounts {
                    if !b.wallet_accounts.contains_key(a) {
                        return Err(ConfigError::Invalid(format!(
                            "backend.wallet_accounts has no UUID for {a}, which profile {} may use",
                            p.name
                        )));
                    }
                }
            }
        }
        if b.kind == BackendKind::Http {
            if !(b.http_url.starts_with("http://") || b.http_url.starts_with("https://")) {
                return Err(ConfigError::Invalid(
                    "backend.http_url must be an http(s) URL with backend.kind = \"http\"".into(),
                ));
            }
            if b.http_credential.expose().is_empty() {
                return Err(ConfigError::Invalid(
                    "backend.http_credential is required with backend.kind = \"http\"".into(),
                ));
            }
        }
        // TLS settings with a plain-http URL would be silently unused: the credential, payments and
        // mandates would go in clear while the operator believes the link is mutual TLS.
        let tls_set = [&b.tls_ca_file, &b.tls_client_cert_file, &b.tls_client_key_file].iter().any(|f| !f.is_empty());
        if tls_set && b.kind != BackendKind::Ledger && !b.http_url.to_ascii_lowercase().starts_with("https://") {
            return Err(ConfigError::Invalid(
                "backend.tls_ca_file / tls_client_cert_file / tls_client_key_file are set but backend.http_url is not \
                 https://: TLS would not be used and everything would go in clear; use an https:// URL"
                    .into(),
            ));
        }
        let m = &self.mpesa;
        prefixes("mpesa.prefixes", &m.prefixes)?;
        prefixes("airtel.prefixes", &self.airtel.prefixes)?;
        if let Some(both) = m.prefixes.iter().find(|p| self.airtel.prefixes.contains(p)) {
            return Err(ConfigError::Invalid(format!(
                "prefix {both:?} is in both mpesa.prefixes and airtel.prefixes: a number has one operator"
            )));
        }
        if m.environment == MpesaEnvironment::Simulator && !m.base_url.is_empty() {
            return Err(ConfigError::Invalid(
                "mpesa.environment = \"simulator\" serves Daraja from this gateway: leave mpesa.base_url empty".into(),
            ));
        }
        range("mpesa.connect_timeout_ms", m.connect_timeout_ms, 10, 60_000)?;
        range("mpesa.request_timeout_ms", m.request_timeout_ms, 10, 300_000)?;
        range("mpesa.token_refresh_margin_secs", m.token_refresh_margin_secs, 0, 3000)?;
        range("mpesa.query_after_secs", m.query_after_secs, 1, 86_400)?;
        range("mpesa.pending_timeout_secs", m.pending_timeout_secs, 60, 2_592_000)?;
        range("mpesa.retries_max", m.retries_max, 0, i64::from(crate::backend::mpesa::daraja::RETRIES_MAX_LIMIT))?;
        range("mpesa.breaker_failures_max", m.breaker_failures_max, 1, 1000)?;
        range("mpesa.breaker_open_ms", m.breaker_open_ms, 10, 3_600_000)?;
        if !m.callback_secret_header.is_empty()
            && axum::http::HeaderName::from_bytes(m.callback_secret_header.as_bytes()).is_err()
        {
            return Err(ConfigError::Invalid("mpesa.callback_secret_header must be a valid header name".into()));
        }
        if !m.initiator_name.is_empty()
            && (m.security_credential.expose().is_empty()
                || !(m.b2c_short_code.is_empty() || m.b2c_short_code.bytes().all(|b| b.is_ascii_digit())))
        {
            return Err(ConfigError::Invalid(
                "mpesa.initiator_name needs mpesa.security_credential, and mpesa.b2c_short_code must be digits".into(),
            ));
        }
        if m.enabled {
            for (key, v) in [
                ("mpesa.consumer_key", m.consumer_key.expose()),
                ("mpesa.consumer_secret", m.consumer_secret.expose()),
                ("mpesa.short_code", m.short_code.as_str()),
                ("mpesa.passkey", m.passkey.expose()),
            ] {
                if v.is_empty() {
                    return Err(ConfigError::Invalid(format!("{key} is required with mpesa.enabled")));
                }
            }
            // Daraja callbacks are unsigned: the path secret is what tells a real one from a forgery.
            if m.callback_secret.expose().len() < 24
                || !m.callback_secret.expose().bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
            {
                return Err(ConfigError::Invalid(
                    "mpesa.callback_secret must be at least 24 URL-safe characters (letters, digits, - and _)".into(),
                ));
            }
        }
        // One call must end within the idempotency lease; otherwise a retry takes the operation over
        // while the first attempt is still talking to the rail (safe, but it turns a slow success
        // into OUTCOME_UNKNOWN).
        let lease_ms = self.idempotency.lease_secs * 1000;
        let http_worst_ms = (b.http_retries_max + 1) * (b.http_request_timeout_ms + 1000);
        if b.kind.is_external() && http_worst_ms >= lease_ms {
            return Err(ConfigError::Invalid(format!(
                "backend: (http_retries_max + 1) × (http_request_timeout_ms + 1 s backoff) = {http_worst_ms} ms must be \
                 under idempotency.lease_secs ({lease_ms} ms)"
            )));
        }
        // A push may take a token fetch, the push, a token refresh and the push again; before that,
        // each retry follows a quick failure (a refused connection or an overload answer) and a backoff.
        let backoff_ms = crate::backend::mpesa::daraja::RETRY_BACKOFF_MAX.as_millis() as i64;
        let mpesa_worst_ms = 4 * m.request_timeout_ms + m.retries_max * (2 * m.connect_timeout_ms + backoff_ms);
        if m.enabled && mpesa_worst_ms >= lease_ms {
            return Err(ConfigError::Invalid(format!(
                "mpesa: 4 × request_timeout_ms + retries_max × (2 × connect_timeout_ms + 1 s backoff) = \
                 {mpesa_worst_ms} ms must be under idempotency.lease_secs ({lease_ms} ms)"
            )));
        }
        self.validate_airtel(lease_ms)?;
        let j = &self.jobs;
        range("jobs.tick_ms", j.tick_ms, 10, 60_000)?;
        range("jobs.mpesa_poll_every_secs", j.mpesa_poll_every_secs, 1, 86_400)?;
        range("jobs.purge_every_secs", j.purge_every_secs, 1, 86_400)?;
        range("jobs.reconcile_every_secs", j.reconcile_every_secs, 1, 86_400)?;
        range("jobs.reconcile_window_secs", j.reconcile_window_secs, 60, 2_592_000)?;
        range("jobs.integrity_every_secs", j.integrity_every_secs, 1, 86_400)?;
        range("jobs.integrity_full_every_secs", j.integrity_full_every_secs, 1, 604_800)?;
        range("jobs.lease_secs", j.lease_secs, 1, 3600)?;
        let c = &self.console;
        if !c.client_id.is_empty() && self.auth.issuer.is_empty() {
            return Err(ConfigError::Invalid(
                "console.client_id needs auth.issuer: the console signs operators in there".into(),
            ));
        }
        if c.client_id.len() > 256 || c.client_id.chars().any(char::is_control) {
            return Err(ConfigError::Invalid("console.client_id must be at most 256 printable characters".into()));
        }
        let t = &self.telemetry;
        range("telemetry.export_interval_ms", t.export_interval_ms, 10, 60_000)?;
        range("telemetry.export_timeout_ms", t.export_timeout_ms, 100, 60_000)?;
        range("telemetry.queue_max", t.queue_max, 64, 1_000_000)?;
        if t.enabled && !(t.otlp_endpoint.starts_with("http://") || t.otlp_endpoint.starts_with("https://")) {
            return Err(ConfigError::Invalid(
                "telemetry.otlp_endpoint must be an http(s) URL (the collector's /v1/traces)".into(),
            ));
        }
        if t.service_name.is_empty() || t.service_name.len() > 128 || t.service_name.chars().any(char::is_control) {
            return Err(ConfigError::Invalid("telemetry.service_name must be 1-128 printable characters".into()));
        }
        Ok(())
    }

    fn validate_webhooks(&self) -> Result<(), ConfigError> {
        let w = &self.webhooks;
        range("webhooks.every_secs", w.every_secs, 1, 3600)?;
        range("webhooks.batch_max", w.batch_max, 1, 1000)?;
        range("webhooks.attempts_max", w.attempts_max, 1, 100)?;
        range("webhooks.backoff_initial_secs", w.backoff_initial_secs, 1, 3600)?;
        range("webhooks.backoff_max_secs", w.backoff_max_secs, 1, 86_400)?;
        range("webhooks.timeout_ms", w.timeout_ms, 100, 60_000)?;
        range("webhooks.breaker_failures", w.breaker_failures, 1, 1000)?;
        range("webhooks.breaker_open_secs", w.breaker_open_secs, 1, 3600)?;
        let mut names = std::collections::HashSet::new();
        for ep in &w.endpoints {
            let bad = |why: String| Err(ConfigError::Invalid(format!("webhooks endpoint {:?}: {why}", ep.name)));
            let name_ok = (1..=32).contains(&ep.name.len())
                && ep.name.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_' || b == b'-');
            if !name_ok {
                return bad("name must be 1 to 32 of a-z 0-9 _ -".into());
            }
            if !names.insert(ep.name.as_str()) {
                return bad("defined twice".into());
            }
            let Ok(url) = reqwest::Url::parse(&ep.url) else { return bad("url is not a URL".into()) };
            let loopback = matches!(url.host_str(), Some("127.0.0.1" | "localhost" | "[::1]"));
            if !(url.scheme() == "https" || (url.scheme() == "http" && loopback)) {
                return bad("url must be https (http only to a loopback address)".into());
            }
            if let Some(e) = ep.events.iter().find(|e| !crate::domain::webhook::EVENTS.contains(&e.as_str())) {
                return bad(format!("unknown event {e:?}"));
            }
            if w.enabled {
                match &ep.secret {
                    None => return bad(format!("{} is not set", ep.secret_env)),
                    Some(s) if crate::domain::webhook::key(s.expose()).is_none() => {
                        return bad(format!("{} must be whsec_ and the base64 of 24 to 64 bytes", ep.secret_env));
                    }
                    Some(_) => {}
                }
            }
        }
        Ok(())
    }

    fn validate(&self) -> Result<(), ConfigError> {
        self.validate_webhooks()?;
        let s = &self.server;
        range("server.body_bytes_max", s.body_bytes_max, 1024, 16 * 1024 * 1024)?;
        range("server.request_timeout_ms", s.request_timeout_ms, 100, 300_000)?;
        range("server.session_idle_secs", s.session_idle_secs, 10, 86_400)?;
        range("server.sessions_max", s.sessions_max, 100, 1_000_000)?;
        range("server.sessions_per_principal_max", s.sessions_per_principal_max, 1, 10_000)?;
        let metrics_token_chars = s.metrics_token.expose().chars().count();
        if metrics_token_chars > 0 && metrics_token_chars < 16 {
            return Err(ConfigError::Invalid("server.metrics_token must be at least 16 characters".into()));
        }
        if s.tls_cert_file.is_empty() != s.tls_key_file.is_empty() {
            return Err(ConfigError::Invalid("server.tls_cert_file and server.tls_key_file go together".into()));
        }
        let st = &self.storage;
        if !(st.url.is_empty()
            || st.url.starts_with("sqlite://")
            || st.url.starts_with("postgres://")
            || st.url.starts_with("postgresql://"))
        {
            return Err(ConfigError::Invalid("storage.url must be empty, sqlite://PATH or postgres://…".into()));
        }
        if st.postgres_schema.is_empty() || !st.postgres_schema.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        {
            return Err(ConfigError::Invalid("storage.postgres_schema must be letters, digits and _".into()));
        }
        if crate::store::postgres::tls::SslMode::parse(&st.postgres_sslmode).is_none() {
            return Err(ConfigError::Invalid(
                "storage.postgres_sslmode must be \"disable\", \"require\" or \"verify-full\"".into(),
            ));
        }
        if !st.postgres_ssl_ca_file.is_empty() && st.postgres_sslmode != "verify-full" {
            return Err(ConfigError::Invalid(
                "storage.postgres_ssl_ca_file is used by storage.postgres_sslmode = \"verify-full\" only".into(),
            ));
        }
        let a = &self.auth;
        range("auth.jwks_cache_secs", a.jwks_cache_secs, 10, 86_400)?;
        range("auth.jwks_refetch_min_interval_secs", a.jwks_refetch_min_interval_secs, 1, 3600)?;
        range("auth.jwks_fetch_timeout_ms", a.jwks_fetch_timeout_ms, 100, 30_000)?;
        range("auth.jwks_stale_max_secs", a.jwks_stale_max_secs, 0, 86_400)?;
        if a.jwks_refetch_min_interval_secs * 1000 <= a.jwks_fetch_timeout_ms {
            return Err(ConfigError::Invalid(
                "auth.jwks_refetch_min_interval_secs must be longer than auth.jwks_fetch_timeout_ms: otherwise a \
                 fetch that timed out is tried again at once, by every request"
                    .into(),
            ));
        }
        range("auth.leeway_secs", a.leeway_secs, 0, 300)?;
        range("auth.verified_token_cache_max", a.verified_token_cache_max, 0, 1_000_000)?;
        range("dev.token_ttl_secs", self.dev.token_ttl_secs, 60, 2_592_000)?;
        for scope in self.dev.scopes.split_whitespace() {
            if !crate::catalogue::scopes::AGENT_SCOPES.contains(&scope) {
                let hint = if scope == crate::catalogue::scopes::LEGACY_AGENT_ADMIN {
                    " (payments:admin is an operator scope now; the agent's admin tools need payments:integrity)"
                } else {
                    ""
                };
                return Err(ConfigError::Invalid(format!(
                    "dev.scopes: {scope:?} is not an agent scope{hint}; agents' scopes are {}",
                    crate::catalogue::scopes::AGENT_SCOPES.join(" ")
                )));
            }
        }
        let i = &self.idempotency;
        range("idempotency.retention_secs", i.retention_secs, 3600, 31_536_000)?;
        range("idempotency.lease_secs", i.lease_secs, 1, 3600)?;
        range("idempotency.wait_ms_max", i.wait_ms_max, 0, 60_000)?;
        let ap = &self.approvals;
        range("approvals.ttl_secs", ap.ttl_secs, 60, 2_592_000)?;
        range("approvals.reviewers_required", ap.reviewers_required, 1, 10)?;
        range("approvals.high_risk_reviewers", ap.high_risk_reviewers, ap.reviewers_required, 10)?;
        range("approvals.routes_per_minute", ap.routes_per_minute, 1, 100_000)?;
        range("approvals.pending_per_agent_max", ap.pending_per_agent_max, 1, 1000)?;
        range("approvals.rejected_cooldown_secs", ap.rejected_cooldown_secs, 0, 2_592_000)?;
        range("approvals.elicitation_rounds_max", ap.elicitation_rounds_max, 1, 1000)?;
        range("approvals.resolution_after_secs", ap.resolution_after_secs, 60, 2_592_000)?;
        range("passkeys.per_person_max", self.passkeys.per_person_max, 1, 100)?;
        range("passkeys.enrolment_code_ttl_secs", self.passkeys.enrolment_code_ttl_secs, 60, 604_800)?;
        range("passkeys.registration_challenges_max", self.passkeys.registration_challenges_max, 1, 100)?;
        let pk = &self.passkeys;
        if !pk.rp_id.is_empty()
            && (pk.rp_id.len() > 253 || !pk.rp_id.chars().all(|c| c.is_ascii_alphanumeric() || c == '.' || c == '-'))
        {
            return Err(ConfigError::Invalid(format!("passkeys.rp_id must be a domain name, got {:?}", pk.rp_id)));
        }
        let passkeys_asked = !pk.required_amount.is_empty() || self.policy.profiles.iter().any(|p| p.passkey_required);
        if passkeys_asked && !self.server.public_url.is_empty() {
            pk.relying_party(&self.server.public_url).map_err(ConfigError::Invalid)?;
        }
        range("audit.retention_days", self.audit.retention_days, 0, 36_500)?;
        range("storage.sqlite_cache_mib", self.storage.sqlite_cache_mib, 1, 16_384)?;
        range("storage.sqlite_writer_cache_mib", self.storage.sqlite_writer_cache_mib, 1, 1_024)?;
        range("storage.sqlite_mmap_mib", self.storage.sqlite_mmap_mib, 0, 65_536)?;
        range("audit.archive_batch_max", self.audit.archive_batch_max, 100, 1_000_000)?;
        range("audit.seal_every_secs", self.audit.seal_every_secs, 1, 3600)?;
        range("audit.seal_batch_max", self.audit.seal_batch_max, 100, 100_000)?;
        range("audit.checkpoint_every_secs", self.audit.checkpoint_every_secs, 10, 86_400)?;
        range("audit.unsealed_slack_secs", self.audit.unsealed_slack_secs, 1, 86_400)?;
        range("audit.shutdown_seal_ms", self.audit.shutdown_seal_ms, 0, 60_000)?;
        // A waiting retry must answer before the server's own request timeout cuts it off.
        let wait_max = (self.server.request_timeout_ms / 1000 - 5).clamp(0, 55);
        range("approvals.elicitation_wait_secs", ap.elicitation_wait_secs, 0, wait_max)?;
        let m = &self.mandates;
        range("mandates.ttl_secs", m.ttl_secs, 60, 604_800)?;
        range("mandates.open_valid_max_secs", m.open_valid_max_secs, 60, 31_536_000)?;
        if m.key_id.is_empty() || m.key_id.len() > 64 {
            return Err(ConfigError::Invalid("mandates.key_id must be 1-64 characters".into()));
        }
        range("mandates.rotate_secs", m.rotate_secs, (m.open_valid_max_secs / 60).max(3600), 31_536_000)?;
        m.hs256_until()?;
        range("stop_rules.denials_max", self.stop_rules.denials_max, 1, 10_000)?;
        range("stop_rules.window_secs", self.stop_rules.window_secs, 10, 86_400)?;
        range("stop_rules.rate_limited_per_denial", self.stop_rules.rate_limited_per_denial, 0, 1_000_000)?;
        range("stop_rules.repeat_max", self.stop_rules.repeat_max, 0, 1000)?;
        range("audit.refusals_interval_secs", self.audit.refusals_interval_secs, 1, 3600)?;
        range("limits.list_limit_max", self.limits.list_limit_max, 1, 1000)?;
        self.validate_rails()?;
        range("limits.list_limit_default", self.limits.list_limit_default, 1, self.limits.list_limit_max)?;
        if !matches!(self.limits.quotas.as_str(), "auto" | "shared" | "replica") {
            return Err(ConfigError::Invalid("limits.quotas must be \"auto\", \"shared\" or \"replica\"".into()));
        }
        if !a.dev_key_on() && a.jwks_url.is_empty() && a.public_key_files.is_empty() {
            return Err(ConfigError::Invalid(
                "no token can ever verify: enable auth.dev_key_enabled or set auth.jwks_url / auth.public_key_files"
                    .into(),
            ));
        }
        if (!a.jwks_url.is_empty() || !a.public_key_files.is_empty()) && a.issuer.is_empty() {
            return Err(ConfigError::Invalid(
                "auth.issuer is required with auth.jwks_url or auth.public_key_files".into(),
            ));
        }
        if !s.public_url.is_empty() {
            let ok = (s.public_url.starts_with("http://") || s.public_url.starts_with("https://"))
                && !s.public_url.ends_with('/')
                && s.public_url.matches('/').count() == 2;
            if !ok {
                return Err(ConfigError::Invalid(format!(
                    "server.public_url must be scheme://host[:port] with no path or trailing slash, got {:?}",
                    s.public_url
                )));
            }
        }
        self.policy_document().validate(&self.approvals.high_risk_amount).map_err(|e| match e {
            PolicyError::OutOfRange { key, value, min, max } => ConfigError::OutOfRange { key, value, min, max },
            PolicyError::Invalid(m) => ConfigError::Invalid(m),
        })?;
        Ok(())
    }
}

impl Config {
    fn validate_airtel(&self, lease_ms: i64) -> Result<(), ConfigError> {
        let a = &self.airtel;
        range("airtel.connect_timeout_ms", a.connect_timeout_ms, 10, 60_000)?;
        range("airtel.request_timeout_ms", a.request_timeout_ms, 10, 300_000)?;
        range("airtel.token_refresh_margin_secs", a.token_refresh_margin_secs, 0, 3000)?;
        range("airtel.query_after_secs", a.query_after_secs, 1, 86_400)?;
        range("airtel.retries_max", a.retries_max, 0, i64::from(crate::backend::airtel::wire::RETRIES_MAX_LIMIT))?;
        range("airtel.breaker_failures_max", a.breaker_failures_max, 1, 1000)?;
        range("airtel.breaker_open_ms", a.breaker_open_ms, 10, 3_600_000)?;
        if !a.callback_secret_header.is_empty()
            && axum::http::HeaderName::from_bytes(a.callback_secret_header.as_bytes()).is_err()
        {
            return Err(ConfigError::Invalid("airtel.callback_secret_header must be a valid header name".into()));
        }
        if !a.enabled {
            return Ok(());
        }
        let simulated = a.environment == AirtelEnvironment::Simulator;
        if simulated && !a.base_url.is_empty() {
            return Err(ConfigError::Invalid(
                "airtel.environment = \"simulator\" serves Airtel's API from this gateway: leave airtel.base_url empty"
                    .into(),
            ));
        }
        let url_ok = a.base_url.is_empty() || a.base_url.starts_with("https://") || a.base_url.starts_with("http://");
        if !url_ok {
            return Err(ConfigError::Invalid("airtel.base_url must be an http(s) URL".into()));
        }
        for (key, v) in [("airtel.client_id", a.client_id.expose()), ("airtel.client_secret", a.client_secret.expose())]
        {
            if v.is_empty() {
                return Err(ConfigError::Invalid(format!("{key} is required with airtel.enabled")));
            }
        }
        // Airtel's callbacks are unsigned: the path secret is what tells a real one from a forgery.
        if a.callback_secret.expose().len() < 24
            || !a.callback_secret.expose().bytes().all(|c| c.is_ascii_alphanumeric() || c == b'-' || c == b'_')
        {
            return Err(ConfigError::Invalid(
                "airtel.callback_secret must be at least 24 URL-safe characters (letters, digits, - and _)".into(),
            ));
        }
        match (a.disbursement_pin.expose().is_empty(), a.public_key.trim().is_empty()) {
            (true, true) => {}
            // The simulator seals PINs with a key of its own.
            (_, false) if simulated => {
                return Err(ConfigError::Invalid(
                    "airtel.public_key: the simulator uses a key of its own; leave it empty".into(),
                ));
            }
            (false, true) if simulated => {
                crate::backend::airtel::wire::check_pin(&a.disbursement_pin)
                    .map_err(|e| ConfigError::Invalid(format!("airtel.disbursement_pin: {e}")))?;
            }
            (false, false) => {
                crate::backend::airtel::wire::PayoutCredentials::new(&a.disbursement_pin, &a.public_key)
                    .map_err(|e| ConfigError::Invalid(format!("airtel.disbursement_pin / airtel.public_key: {e}")))?;
            }
            _ => {
                return Err(ConfigError::Invalid(
                    "airtel.disbursement_pin and airtel.public_key go together: payouts need both".into(),
                ));
            }
        }
        // Two rails booking to one account could not be told apart in balances and summaries.
        if self.mpesa.enabled && a.account == self.mpesa.account {
            return Err(ConfigError::Invalid("airtel.account must differ from mpesa.account".into()));
        }
        // A collection may take a token fetch, the request, a token refresh and the request again;
        // before that, each retry follows a quick failure and a backoff. It must end within the lease.
        let backoff_ms = crate::backend::airtel::wire::RETRY_BACKOFF_MAX.as_millis() as i64;
        let worst_ms = 4 * a.request_timeout_ms + a.retries_max * (2 * a.connect_timeout_ms + backoff_ms);
        if worst_ms >= lease_ms {
            return Err(ConfigError::Invalid(format!(
                "airtel: 4 × request_timeout_ms + retries_max × (2 × connect_timeout_ms + 1 s backoff) = \
                 {worst_ms} ms must be under idempotency.lease_secs ({lease_ms} ms)"
            )));
        }
        Ok(())
    }
}

/// Most prefixes one rail's routing table holds.
pub const RAIL_PREFIXES_MAX: usize = 64;
/// Most digits in one routing prefix.
pub const RAIL_PREFIX_DIGITS_MAX: usize = 4;

/// A rail's routing table: 1 ..= [`RAIL_PREFIXES_MAX`] distinct prefixes of 1 ..= [`RAIL_PREFIX_DIGITS_MAX`] digits.
fn prefixes(key: &'static str, list: &[String]) -> Result<(), ConfigError> {
    if list.is_empty() || list.len() > RAIL_PREFIXES_MAX {
        return Err(ConfigError::Invalid(format!("{key} must hold 1 to {RAIL_PREFIXES_MAX} prefixes")));
    }
    for (i, p) in list.iter().enumerate() {
        if p.is_empty() || p.len() > RAIL_PREFIX_DIGITS_MAX || !p.bytes().all(|b| b.is_ascii_digit()) {
            return Err(ConfigError::Invalid(format!(
                "{key}: {p:?} is not a prefix of 1 to {RAIL_PREFIX_DIGITS_MAX} digits (the digits after 0 or 254)"
            )));
        }
        if list[..i].contains(p) {
            return Err(ConfigError::Invalid(format!("{key}: {p:?} is listed twice")));
        }
    }
    Ok(())
}

fn range(key: &'static str, value: i64, min: i64, max: i64) -> Result<(), ConfigError> {
    if (min..=max).contains(&value) { Ok(()) } else { Err(ConfigError::OutOfRange { key, value, min, max }) }
}

fn merge(base: &mut toml::Table, overlay: toml::Table) {
    for (k, v) in overlay {
        match (base.get_mut(&k), v) {
            (Some(toml::Value::Table(b)), toml::Value::Table(o)) => merge(b, o),
            (_, v) => {
                base.insert(k, v);
            }
        }
    }
}

/// Set `section.key` from an env string. A key whose current value is a string takes the text as is;
/// any other key reads it as a TOML value.
fn set_from_env(root: &mut toml::Table, section: &str, key: &str, raw: &str) -> Result<(), ()> {
    let table = root.get_mut(section).and_then(toml::Value::as_table_mut).ok_or(())?;
    let new = match table.get(key) {
        Some(toml::Value::String(_)) => toml::Value::String(raw.to_string()),
        // Secrets that have no default (auth.dev_key, idempotency.secret, mandates.secret) are strings too.
        None if matches!((section, key), ("auth", "dev_key") | ("idempotency", "secret") | ("mandates", "secret")) => {
            toml::Value::String(raw.to_string())
        }
        // Keys whose default is "not set" (auth.dev_key_enabled) read as TOML values too.
        Some(_) | None if table.contains_key(key) || (section, key) == ("auth", "dev_key_enabled") => {
            let doc: toml::Table = format!("v = {raw}").parse().map_err(|_| ())?;
            doc.get("v").cloned().ok_or(())?
        }
        Some(_) | None => return Err(()),
    };
    table.insert(key.to_string(), new);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    #[test]
    fn defaults_load_and_validate() {
        let c = Config::load(None, env(&[])).unwrap();
        assert_eq!(c.server.bind, "127.0.0.1:8080");
        assert_eq!(c.idempotency.retention_secs, 7 * 24 * 3600);
        assert!(c.ledger.demo);
    }

    #[test]
    fn quotas_are_shared_on_postgres_unless_told_and_nothing_else_is_accepted() {
        let sqlite = Config::load(None, env(&[])).unwrap();
        assert!(!sqlite.limits.shared_quotas(&sqlite.storage), "one process owns a SQLite store");
        let pg = Config::load(None, env(&[("PAYGATE_STORAGE__URL", "postgres://db/paygate")])).unwrap();
        assert!(pg.limits.shared_quotas(&pg.storage), "replicas on PostgreSQL share an agent's quota");
        let mut c = pg.clone();
        c.limits.quotas = "replica".into();
        assert!(!c.limits.shared_quotas(&c.storage));
        c.limits.quotas = "shared".into();
        assert!(c.limits.shared_quotas(&sqlite.storage));
        c.limits.quotas = "cluster".into();
        assert!(c.validate().unwrap_err().to_string().contains("limits.quotas"));
    }

    #[test]
    fn governance_names_tools_not_aliases() {
        let mut c = Config::load(None, env(&[])).unwrap();
        c.tools.disabled = vec!["initiate_stk_push".into()];
        assert!(c.validate().is_ok(), "an alias may be hidden alone");
        c.tools.approval_required = vec!["initiate_stk_push".into()];
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("alias of \"request_mpesa_payment\""), "{e}");
        c.tools.approval_required = vec!["request_mpesa_payment".into()];
        assert!(c.validate().is_ok());
        let profile = c.policy.profiles.first_mut().unwrap();
        profile.tool_calls_per_minute.insert("initiate_stk_push".into(), 5);
        assert!(c.validate().unwrap_err().to_string().contains("tool_calls_per_minute"));
    }

    #[test]
    fn the_user_approval_tier_is_named_bounded_and_below_high_risk() {
        let mut c = Config::load(None, env(&[])).unwrap();
        let money = |t: &str| toml::from_str::<MoneyMap>(t).unwrap();
        let err = |c: &Config| c.validate().unwrap_err().to_string();
        let p = c.policy.profiles.first_mut().unwrap();
        p.approvals_by = "user".into();
        assert!(err(&c).contains("needs user_approval_max"), "user without a tier");
        c.policy.profiles[0].user_approval_max = money(r#"KES = "100000.00""#);
        assert!(err(&c).contains("under approvals.high_risk_amount"), "the tier reaches high risk");
        c.policy.profiles[0].user_approval_max = money(r#"USD = "10.00""#);
        assert!(err(&c).contains("under approvals.high_risk_amount"), "no threshold: counts as high risk");
        c.policy.profiles[0].user_approval_max = money(r#"KES = "5000.00""#);
        assert!(c.validate().is_ok());
        c.policy.profiles[0].approvals_by = "operator".into();
        assert!(err(&c).contains("needs approvals_by"), "a tier nobody uses");
        c.policy.profiles[0].approvals_by = "agent".into();
        assert!(err(&c).contains("approvals_by must be"));
    }

    /// `payees.cooling_off_total` (issue 52): compiled-in default empty, and checked when the config
    /// loads against the same profile's new-payee limit.
    #[test]
    fn the_cooling_off_total_defaults_empty_and_is_checked_at_load() {
        let mut c = Config::load(None, env(&[])).unwrap();
        assert!(c.policy.profiles.iter().all(|p| p.payees.cooling_off_total.is_empty()));
        let money = |t: &str| toml::from_str::<MoneyMap>(t).unwrap();
        c.policy.profiles[0].payees.new_payee_limit = money(r#"KES = "100.00""#);
        c.policy.profiles[0].payees.cooling_off_total = money(r#"KES = "99.99""#);
        let e = c.validate().unwrap_err().to_string();
        assert!(e.contains("payees.cooling_off_total for KES must be at least its new_payee_limit"), "{e}");
        c.policy.profiles[0].payees.cooling_off_total = money(r#"KES = "300.00""#);
        assert!(c.validate().is_ok());
        assert!(toml::from_str::<MoneyMap>(r#"KES = "-1.00""#).is_err(), "never negative");
    }

    #[test]
    fn env_overrides_by_type() {
        let c = Config::load(
            None,
            env(&[
                ("PAYGATE_SERVER__BIND", "0.0.0.0:9"),
                ("PAYGATE_LEDGER__DEMO", "false"),
                ("PAYGATE_SERVER__ALLOWED_ORIGINS", r#"["https://a.example"]"#),
                ("PAYGATE_IDEMPOTENCY__LEASE_SECS", "5"),
                ("PAYGATE_MANDATES__SECRET", "c2VjcmV0"),
                ("PAYGATE_AUTH__DEV_KEY", "c2VjcmV0"),
                ("OTHER", "x"),
                ("PAYGATE_LOG", "debug"),
                ("PAYGATE_TEST_DATABASE_URL", "postgres://x"),
            ]),
        )
        .unwrap();
        assert_eq!(c.server.bind, "0.0.0.0:9");
        assert!(!c.ledger.demo);
        assert_eq!(c.server.allowed_origins, vec!["https://a.example"]);
        assert_eq!(c.idempotency.lease_secs, 5);
        assert_eq!(c.mandates.secret.as_ref().map(|s| s.expose()), Some("c2VjcmV0"));
        assert!(c.auth.dev_key.is_some());
    }

    /// The policy's own settings are bounded like every limit, and stay out of the versioned
    /// document.
    #[test]
    fn policy_settings_have_bounds_and_are_not_part_of_a_version() {
        for (key, bad, name) in [
            ("PAYGATE_POLICY__REFRESH_SECS", "0", "policy.refresh_secs"),
            ("PAYGATE_POLICY__REFRESH_SECS", "3601", "policy.refresh_secs"),
            ("PAYGATE_POLICY__SIMULATE_WINDOW_MAX_SECS", "60", "policy.simulate_window_max_secs"),
            ("PAYGATE_POLICY__SIMULATE_RECORDS_MAX", "1000001", "policy.simulate_records_max"),
        ] {
            match Config::load(None, env(&[(key, bad)])) {
                Err(ConfigError::OutOfRange { key, .. }) => assert_eq!(key, name),
                other => panic!("{name} = {bad}: {other:?}"),
            }
        }
        let c = Config::load(None, env(&[("PAYGATE_POLICY__REFRESH_SECS", "7")])).unwrap();
        assert_eq!(
            (c.policy.refresh_secs, c.policy.simulate_window_max_secs, c.policy.simulate_records_max),
            (7, 2_592_000, 100_000)
        );
        let d = Config::load(None, env(&[])).unwrap().policy_document();
        assert_eq!(c.policy_document().canonical(), d.canonical());
        assert!(!d.canonical().contains("refresh_secs"), "{}", d.canonical());
    }

    #[test]
    fn bad_values_stop_the_start() {
        assert!(matches!(
            Config::load(None, env(&[("PAYGATE_SERVER__BODY_BYTES_MAX", "1")])),
            Err(ConfigError::OutOfRange { key: "server.body_bytes_max", .. })
        ));
        assert!(matches!(Config::load(None, env(&[("PAYGATE_SERVER__NOPE", "1")])), Err(ConfigError::UnknownEnv(_))));
        assert!(Config::load(None, env(&[("PAYGATE_SERVER__PUBLIC_URL", "https://x/mcp")])).is_err());
        assert!(Config::load(None, env(&[("PAYGATE_AUTH__JWKS_URL", "https://idp/jwks")])).is_err());
    }

    #[test]
    fn routing_prefixes_are_digits_bounded_and_each_has_one_operator() {
        let c = Config::load(None, env(&[])).unwrap();
        assert!(c.mpesa.prefixes.contains(&"757".to_string()) && c.airtel.prefixes.contains(&"750".to_string()));
        let err = |f: &dyn Fn(&mut Config)| {
            let mut c = c.clone();
            f(&mut c);
            c.validate().unwrap_err().to_string()
        };
        assert!(err(&|c| c.airtel.prefixes.push("757".into())).contains("\"757\" is in both"));
        assert!(err(&|c| c.mpesa.prefixes.push("7a".into())).contains("mpesa.prefixes: \"7a\" is not a prefix"));
        assert!(err(&|c| c.mpesa.prefixes.push("07123".into())).contains("not a prefix of 1 to 4 digits"));
        assert!(err(&|c| c.airtel.prefixes.clear()).contains("airtel.prefixes must hold 1 to 64"));
        assert!(err(&|c| c.mpesa.prefixes = (1000..1065).map(|n| n.to_string()).collect()).contains("1 to 64"));
        assert!(err(&|c| c.mpesa.prefixes.push("70".into())).contains("listed twice"));
        // The simulator serves itself: it cannot be pointed anywhere (Safaricom's production included).
        let e = err(&|c| {
            c.mpesa.environment = MpesaEnvironment::Simulator;
            c.mpesa.base_url = "https://api.safaricom.co.ke".into();
        });
        assert!(e.contains("leave mpesa.base_url empty"), "{e}");
    }

    #[test]
    fn the_wallet_service_needs_a_merchant_and_a_uuid_for_every_profile_account() {
        let a = "0a0a0a0a-0000-4000-8000-00000000000a";
        let b = "0b0b0b0b-0000-4000-8000-00000000000b";
        let accounts = format!("{{ acct-A = \"{a}\", acct-B = \"{b}\" }}");
        let base = |merchant: &str, accounts: &str| {
            Config::load(
                None,
                env(&[
                    ("PAYGATE_BACKEND__KIND", "wallet-service"),
                    ("PAYGATE_BACKEND__HTTP_URL", "http://127.0.0.1:8080"),
                    ("PAYGATE_BACKEND__WALLET_MERCHANT_ID", merchant),
                    ("PAYGATE_BACKEND__WALLET_ACCOUNTS", accounts),
                ]),
            )
        };
        let c = base("paygate", &accounts).unwrap();
        assert_eq!(c.backend.kind, BackendKind::WalletService);
        assert!(c.backend.http_credential.expose().is_empty(), "no credential needed");
        assert_eq!(c.backend.wallet_accounts[&AccountId::parse("acct-B").unwrap()].as_str(), b);
        let e = |merchant: &str, accounts: &str| base(merchant, accounts).unwrap_err().to_string();
        assert!(e("", &accounts).contains("backend.wallet_merchant_id"));
        assert!(e(&"m".repeat(129), &accounts).contains("backend.wallet_merchant_id"));
        assert!(e("paygate", "{}").contains("backend.wallet_accounts must map"));
        assert!(e("paygate", &format!("{{ acct-A = \"{a}\" }}")).contains("no UUID for acct-B"));
        assert!(e("paygate", &format!("{{ acct-A = \"{a}\", acct-B = \"{a}\" }}")).contains("another account maps to"));
        assert!(e("paygate", "{ acct-A = \"nope\", acct-B = \"x\" }").contains("is not a UUID"));
        assert!(e("paygate", &format!("{{ \"bad id!\" = \"{a}\" }}")).contains("account"));
    }

    /// Issue 53: with backend.tls_* set and an http:// URL, mutual TLS silently turned off.
    #[test]
    fn backend_tls_settings_need_an_https_url() {
        let with = |url: &str, key: &str| {
            Config::load(
                None,
                env(&[
                    ("PAYGATE_BACKEND__KIND", "http"),
                    ("PAYGATE_BACKEND__HTTP_URL", url),
                    ("PAYGATE_BACKEND__HTTP_CREDENTIAL", "c".repeat(32).as_str()),
                    (key, "/etc/paygate/ledger.pem"),
                ]),
            )
        };
        for key in [
            "PAYGATE_BACKEND__TLS_CA_FILE",
            "PAYGATE_BACKEND__TLS_CLIENT_CERT_FILE",
            "PAYGATE_BACKEND__TLS_CLIENT_KEY_FILE",
        ] {
            let e = with("http://ledger.internal:8443", key).unwrap_err().to_string();
            assert!(e.contains("not https://"), "{key}: {e}");
            assert!(with("HTTP://ledger.internal", key).is_err(), "{key}: any case");
        }
        assert!(with("https://ledger.internal:8443", "PAYGATE_BACKEND__TLS_CA_FILE").is_ok());
    }

    #[test]
    fn rails_need_their_settings_and_fit_the_lease() {
        let http = [("PAYGATE_BACKEND__KIND", "http"), ("PAYGATE_BACKEND__HTTP_URL", "http://127.0.0.1:8090")];
        assert!(Config::load(None, env(&http)).is_err(), "a credential is required");
        let mut ok = http.to_vec();
        ok.push(("PAYGATE_BACKEND__HTTP_CREDENTIAL", "s3cret"));
        let c = Config::load(None, env(&ok)).unwrap();
        assert_eq!(format!("{:?}", c.backend.http_credential), "Secret(***)", "secrets never print");
        let mut slow = ok.clone();
        slow.push(("PAYGATE_BACKEND__HTTP_REQUEST_TIMEOUT_MS", "20000"));
        assert!(Config::load(None, env(&slow)).is_err(), "3 × 21 s does not fit a 30 s lease");
        assert!(Config::load(None, env(&[("PAYGATE_BACKEND__KIND", "ftp")])).is_err());
        let mpesa = [
            ("PAYGATE_MPESA__ENABLED", "true"),
            ("PAYGATE_MPESA__CONSUMER_KEY", "k"),
            ("PAYGATE_MPESA__CONSUMER_SECRET", "s"),
            ("PAYGATE_MPESA__SHORT_CODE", "174379"),
            ("PAYGATE_MPESA__PASSKEY", "p"),
        ];
        assert!(Config::load(None, env(&mpesa)).is_err(), "a callback secret is required");
        let mut with_secret = mpesa.to_vec();
        with_secret.push(("PAYGATE_MPESA__CALLBACK_SECRET", "short"));
        assert!(Config::load(None, env(&with_secret)).is_err(), "and it must be long");
        with_secret.pop();
        with_secret.push(("PAYGATE_MPESA__CALLBACK_SECRET", "a-callback-secret-of-enough-length"));
        assert!(Config::load(None, env(&with_secret)).is_ok());
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = with_secret.clone();
            v.extend_from_slice(extra);
            Config::load(None, env(&v))
        };
        // Retries are bounded and must fit the lease with the worst push.
        assert!(with(&[("PAYGATE_MPESA__RETRIES_MAX", "6")]).is_err(), "at most 5 retries");
        assert!(with(&[("PAYGATE_MPESA__RETRIES_MAX", "2")]).is_err(), "20 s + 2 × 5 s is not under a 30 s lease");
        assert!(with(&[("PAYGATE_MPESA__RETRIES_MAX", "0")]).is_ok());
        assert!(with(&[("PAYGATE_MPESA__BREAKER_FAILURES_MAX", "0")]).is_err());
        // The secret header must be a header name; an initiator needs its credential.
        assert!(with(&[("PAYGATE_MPESA__CALLBACK_SECRET_HEADER", "bad header")]).is_err());
        assert!(with(&[("PAYGATE_MPESA__CALLBACK_SECRET_HEADER", "x-paygate-callback-secret")]).is_ok());
        assert!(with(&[("PAYGATE_MPESA__INITIATOR_NAME", "apiop")]).is_err(), "a credential is required");
        let payouts = with(&[("PAYGATE_MPESA__INITIATOR_NAME", "apiop"), ("PAYGATE_MPESA__SECURITY_CREDENTIAL", "c")]);
        assert_eq!(format!("{:?}", payouts.unwrap().mpesa.security_credential), "Secret(***)");
    }

    #[test]
    fn airtel_needs_its_credentials_a_long_secret_and_its_own_account() {
        let airtel = [
            ("PAYGATE_AIRTEL__ENABLED", "true"),
            ("PAYGATE_AIRTEL__CLIENT_ID", "airtel-client"),
            ("PAYGATE_AIRTEL__CLIENT_SECRET", "airtel-s3cret"),
        ];
        assert!(Config::load(None, env(&airtel)).is_err(), "a callback secret is required");
        let with = |extra: &[(&'static str, &'static str)]| {
            let mut v = airtel.to_vec();
            v.extend_from_slice(extra);
            Config::load(None, env(&v))
        };
        let secret = ("PAYGATE_AIRTEL__CALLBACK_SECRET", "an-airtel-callback-secret-0123");
        assert!(with(&[("PAYGATE_AIRTEL__CALLBACK_SECRET", "short")]).is_err(), "and it must be long");
        assert!(with(&[("PAYGATE_AIRTEL__CALLBACK_SECRET", "not url safe: 0123456789abcd")]).is_err());
        let c = with(&[secret]).unwrap();
        assert_eq!(c.airtel.account.as_str(), "airtel-collections");
        assert_eq!(format!("{:?}", c.airtel.client_secret), "Secret(***)", "secrets never print");
        assert!(with(&[secret, ("PAYGATE_AIRTEL__CLIENT_SECRET", "")]).is_err());
        assert!(with(&[secret, ("PAYGATE_AIRTEL__BASE_URL", "ftp://airtel")]).is_err());
        assert!(with(&[secret, ("PAYGATE_AIRTEL__RETRIES_MAX", "6")]).is_err(), "at most 5 retries");
        assert!(with(&[secret, ("PAYGATE_AIRTEL__RETRIES_MAX", "2")]).is_err(), "must fit the 30 s lease");
        assert!(with(&[secret, ("PAYGATE_AIRTEL__QUERY_AFTER_SECS", "0")]).is_err());
        assert!(with(&[secret, ("PAYGATE_AIRTEL__CALLBACK_SECRET_HEADER", "bad header")]).is_err());
        // Payouts: the PIN and Airtel's public key together, both valid.
        let key = include_str!("../tests/fixtures/rsa1.pub.pem");
        let (pin, public) = (("PAYGATE_AIRTEL__DISBURSEMENT_PIN", "4321"), ("PAYGATE_AIRTEL__PUBLIC_KEY", key));
        assert!(with(&[secret, pin, public]).is_ok());
        let e = |extra: &[(&'static str, &'static str)]| with(extra).unwrap_err().to_string();
        assert!(e(&[secret, pin]).contains("go together"));
        assert!(e(&[secret, public]).contains("go together"));
        assert!(e(&[secret, ("PAYGATE_AIRTEL__DISBURSEMENT_PIN", "43210"), public]).contains("4 digits"));
        assert!(e(&[secret, pin, ("PAYGATE_AIRTEL__PUBLIC_KEY", "not a key")]).contains("public_key"));
        assert!(
            !format!("{:?}", with(&[secret, pin, public]).unwrap().airtel).contains("4321"),
            "the PIN never prints"
        );
        // The simulator serves itself (it cannot point at Airtel's production) and seals PINs with
        // its own key.
        let sim = ("PAYGATE_AIRTEL__ENVIRONMENT", "simulator");
        assert!(with(&[secret, sim, pin]).is_ok());
        let production = ("PAYGATE_AIRTEL__BASE_URL", "https://openapi.airtel.africa");
        assert!(e(&[secret, sim, production]).contains("leave airtel.base_url empty"));
        assert!(e(&[secret, sim, pin, public]).contains("a key of its own"));
        assert!(e(&[secret, sim, ("PAYGATE_AIRTEL__DISBURSEMENT_PIN", "12")]).contains("4 digits"));
        assert!(with(&[secret, ("PAYGATE_AIRTEL__ENVIRONMENT", "staging")]).is_err(), "uat, production or simulator");
        // Beside M-Pesa, it books to its own account.
        let mpesa = [
            ("PAYGATE_MPESA__ENABLED", "true"),
            ("PAYGATE_MPESA__CONSUMER_KEY", "k"),
            ("PAYGATE_MPESA__CONSUMER_SECRET", "s"),
            ("PAYGATE_MPESA__SHORT_CODE", "174379"),
            ("PAYGATE_MPESA__PASSKEY", "p"),
            ("PAYGATE_MPESA__CALLBACK_SECRET", "a-callback-secret-of-enough-length"),
        ];
        let mut both = mpesa.to_vec();
        both.push(secret);
        assert!(with(&both).is_ok());
        both.push(("PAYGATE_AIRTEL__ACCOUNT", "mpesa-collections"));
        assert!(with(&both).is_err(), "one account for two rails");
    }

    #[test]
    fn passkey_enrolment_limits_are_range_checked() {
        let c = Config::load(None, env(&[])).unwrap();
        assert_eq!((c.passkeys.enrolment_code_ttl_secs, c.passkeys.registration_challenges_max), (86_400, 5));
        for (key, bad) in [
            ("PAYGATE_PASSKEYS__ENROLMENT_CODE_TTL_SECS", "59"),
            ("PAYGATE_PASSKEYS__ENROLMENT_CODE_TTL_SECS", "604801"),
            ("PAYGATE_PASSKEYS__REGISTRATION_CHALLENGES_MAX", "0"),
            ("PAYGATE_PASSKEYS__REGISTRATION_CHALLENGES_MAX", "101"),
        ] {
            let e = Config::load(None, env(&[(key, bad)])).unwrap_err().to_string();
            let name = key.trim_start_matches("PAYGATE_PASSKEYS__").to_lowercase();
            assert!(e.contains(&format!("passkeys.{name}")), "{key}={bad}: {e}");
        }
    }

    #[test]
    fn passkeys_take_their_relying_party_from_the_public_url() {
        let pk = |rp_id: &str| PasskeysConfig {
            rp_id: rp_id.into(),
            per_person_max: 10,
            enrolment_code_ttl_secs: 86_400,
            registration_challenges_max: 5,
            required_amount: Default::default(),
        };
        let rp = |rp_id: &str, url: &str| pk(rp_id).relying_party(url);
        assert_eq!(rp("", "https://pay.example.com"), Ok(("pay.example.com".into(), "https://pay.example.com".into())));
        assert_eq!(rp("", "http://localhost:8080"), Ok(("localhost".into(), "http://localhost:8080".into())));
        assert_eq!(rp("example.com", "https://pay.example.com").map(|r| r.0), Ok("example.com".into()));
        for (rp_id, url) in [
            ("", "http://127.0.0.1:8080"),
            ("", "http://[::1]:8080"),
            ("other.com", "https://pay.example.com"),
            ("ample.com", "https://pay.example.com"),
        ] {
            assert!(rp(rp_id, url).is_err(), "{rp_id:?} at {url}");
        }
    }
}
