//! `paygate init`: a commented starting config for one of two modes, and ready-to-paste client
//! configuration pointing at that gateway. It writes one file and never overwrites one.

use std::io::Write;
use std::path::{Path, PathBuf};

/// Which kind of deployment the written config is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    /// SQLite in a local data directory, the embedded ledger, the dev signing key.
    Dev,
    /// Tokens from your identity provider (issuer + JWKS), PostgreSQL, secrets by environment.
    Production,
    /// Dev, with M-Pesa simulated inside the gateway: STK pushes, payouts and business payments
    /// that a person answers on the simulator, with no credentials and no money moving.
    Demo,
}

/// What `init` needs to fill in. Production values default to placeholders the doctor flags.
#[derive(Debug, Clone)]
pub struct InitOptions {
    pub mode: Mode,
    pub dir: PathBuf,
    /// `scheme://host[:port]` clients use; dev: derived from the bind address.
    pub public_url: Option<String>,
    pub issuer: Option<String>,
    pub jwks_url: Option<String>,
}

pub const CONFIG_FILE: &str = "paygate.toml";
const DEV_BIND: &str = "127.0.0.1:8080";
const PLACEHOLDER_PUBLIC_URL: &str = "https://pay.example.com";
const PLACEHOLDER_ISSUER: &str = "https://idp.example.com/";
const PLACEHOLDER_JWKS_URL: &str = "https://idp.example.com/.well-known/jwks.json";

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("{0} exists; paygate init never overwrites a file (move it away or pick another --dir)")]
    Exists(PathBuf),
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// What was written, and the gateway URL the snippets point at.
#[derive(Debug)]
pub struct Written {
    pub config_path: PathBuf,
    pub mcp_url: String,
}

/// Write `<dir>/paygate.toml` for the mode. Refuses to overwrite (the check and the create are one
/// `create_new` open, so two concurrent inits cannot both write).
pub fn write_config(opts: &InitOptions) -> Result<Written, InitError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| InitError::Io { path, source }
    };
    std::fs::create_dir_all(&opts.dir).map_err(io(&opts.dir))?;
    let path = opts.dir.join(CONFIG_FILE);
    let (text, public_url) = render(opts);
    let mut file = match std::fs::OpenOptions::new().write(true).create_new(true).open(&path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Err(InitError::Exists(path)),
        Err(e) => return Err(io(&path)(e)),
    };
    file.write_all(text.as_bytes()).map_err(io(&path))?;
    file.sync_all().map_err(io(&path))?;
    Ok(Written { config_path: path, mcp_url: format!("{public_url}/mcp") })
}

/// The config text and the public URL it serves at.
fn render(opts: &InitOptions) -> (String, String) {
    match opts.mode {
        Mode::Dev => {
            let public_url = opts.public_url.clone().unwrap_or_else(|| format!("http://{DEV_BIND}"));
            let data_dir = opts.dir.join("data");
            let public_line = match &opts.public_url {
                Some(u) => format!("public_url = {}", toml_str(u)),
                None => "# public_url = \"\"   # empty: derived from bind (http://127.0.0.1:8080)".to_string(),
            };
            let text = DEV_TEMPLATE
                .replace("{bind}", &toml_str(DEV_BIND))
                .replace("{public_url_line}", &public_line)
                .replace("{data_dir}", &toml_str(&data_dir.to_string_lossy()));
            (text, public_url)
        }
        Mode::Demo => {
            let public_url = opts.public_url.clone().unwrap_or_else(|| format!("http://{DEV_BIND}"));
            let public_line = match &opts.public_url {
                Some(u) => format!("public_url = {}", toml_str(u)),
                None => "# public_url = \"\"   # empty: derived from bind (http://127.0.0.1:8080)".to_string(),
            };
            // The callback secret is real: the simulator's callbacks pass the same checks Daraja's do.
            let secret = format!("demo-{}", uuid::Uuid::new_v4().simple());
            let airtel_secret = format!("demo-{}", uuid::Uuid::new_v4().simple());
            // The simulators' credentials, random per config (a demo config copied from another
            // machine's README would otherwise open this one's simulator to whoever read it).
            let random = |label: &str| toml_str(&format!("demo-{label}-{}", uuid::Uuid::new_v4().simple()));
            let pin = uuid::Uuid::new_v4().as_u128() % 10_000;
            let text = DEMO_TEMPLATE
                .replace("{consumer_key}", &random("key"))
                .replace("{consumer_secret}", &random("secret"))
                .replace("{passkey}", &random("passkey"))
                .replace("{security_credential}", &random("credential"))
                .replace("{airtel_client_id}", &random("airtel-client"))
                .replace("{airtel_client_secret}", &random("airtel-secret"))
                .replace("{disbursement_pin}", &toml_str(&format!("{pin:04}")))
                .replace("{bind}", &toml_str(DEV_BIND))
                .replace("{public_url_line}", &public_line)
                .replace("{callback_secret}", &toml_str(&secret))
                .replace("{airtel_callback_secret}", &toml_str(&airtel_secret))
                .replace("{data_dir}", &toml_str(&opts.dir.join("data").to_string_lossy()));
            (text, public_url)
        }
        Mode::Production => {
            let public_url = opts.public_url.clone().unwrap_or_else(|| PLACEHOLDER_PUBLIC_URL.to_string());
            let issuer = opts.issuer.clone().unwrap_or_else(|| PLACEHOLDER_ISSUER.to_string());
            let jwks = opts.jwks_url.clone().unwrap_or_else(|| PLACEHOLDER_JWKS_URL.to_string());
            let text = PRODUCTION_TEMPLATE
                .replace("{public_url}", &toml_str(&public_url))
                .replace("{issuer}", &toml_str(&issuer))
                .replace("{jwks_url}", &toml_str(&jwks))
                .replace("{data_dir}", &toml_str(&opts.dir.join("data").to_string_lossy()));
            (text, public_url)
        }
    }
}

/// A TOML basic string. JSON's string escapes (\", \\, \n, \uXXXX, …) are all valid in TOML basic strings.
fn toml_str(s: &str) -> String {
    serde_json::Value::String(s.to_string()).to_string()
}

const DEV_TEMPLATE: &str = r#"# paygate configuration, written by `paygate init --mode dev`.
# Local development: SQLite in data_dir, the embedded reference ledger with demo accounts, and a dev
# signing key (generated into data_dir) that `paygate token` mints agent tokens with.
# Every key, its default and its bounds: config/default.toml. Environment variables
# PAYGATE_<SECTION>__<KEY> override this file.
#
#   paygate serve --config paygate.toml        (from a checkout: cargo run --release -- --config paygate.toml)
#   paygate doctor --config paygate.toml       checks this file, the store and the keys

[server]
bind = {bind}
{public_url_line}

[storage]
# The SQLite database and the generated keys (dev-signing.key, idempotency.key, mandate.key; mode 0600).
data_dir = {data_dir}

[auth]
# Accept HS256 tokens signed with the dev key. Never in production: `paygate init --mode production`.
dev_key_enabled = true

[dev]
# Print a ready-to-use token for this subject at start.
print_token = true
subject = "dev-agent"
scopes = "payments:read payments:create payments:refund"

[ledger]
# Opens acct-A (KES 1,000,000.00), acct-B and acct-Z on first start. The compiled-in "dev" policy
# profile lets dev-agent pay between acct-A and acct-B, up to KES 1,000.00 per payment alone.
demo = true
"#;

const DEMO_TEMPLATE: &str = r#"# paygate configuration, written by `paygate init --demo`.
# A demo: the dev setup (SQLite in data_dir, the embedded ledger, the dev key) with M-Pesa and Airtel
# Money SIMULATED inside the gateway. Agents ask customers to pay (STK push, Airtel collections), pay
# customers (B2C, Airtel disbursements), pay businesses (paybills, tills) and refund; nothing goes to
# Safaricom or Airtel and no money moves. You play the customer's phone and the rail on the
# simulators' control routes (an operator token with payments:admin), <rail> = mpesa or airtel:
#
#   GET  <public_url>/simulator/control/<rail>                      what is pending
#   POST <public_url>/simulator/control/<rail>/latest/accept        pay it (or decline, timeout)
#   POST <public_url>/simulator/control/<rail>/lose-next-answer     the next request's answer is lost
#
#   paygate serve --config paygate.toml        (from a checkout: cargo run --release -- --config paygate.toml)

[server]
bind = {bind}
{public_url_line}

[storage]
data_dir = {data_dir}

[auth]
# Accept HS256 tokens signed with the dev key. Never in production.
dev_key_enabled = true

[dev]
print_token = true
subject = "dev-agent"
scopes = "payments:read payments:create payments:refund payments:collect payments:payout"

[ledger]
demo = true

[mpesa]
enabled = true
# Daraja served by this gateway at <public_url>/simulator/mpesa. Never "production" here.
environment = "simulator"
# The simulator checks these exactly as Daraja checks real ones. Random for each config `init`
# writes: anyone who can reach the port and knows them could put requests to the simulator.
consumer_key = {consumer_key}
consumer_secret = {consumer_secret}
short_code = "174379"
passkey = {passkey}
initiator_name = "demo-initiator"
security_credential = {security_credential}
# Callbacks come back to this gateway's own callback routes, under this secret.
callback_secret = {callback_secret}
# A lost answer shows quickly.
request_timeout_ms = 2000

[airtel]
enabled = true
# Airtel's API served by this gateway at <public_url>/simulator/airtel. Never "production" here.
environment = "simulator"
# The simulator checks these (and the disbursement PIN, sealed with its own key) as Airtel would.
client_id = {airtel_client_id}
client_secret = {airtel_client_secret}
disbursement_pin = {disbursement_pin}
callback_secret = {airtel_callback_secret}
request_timeout_ms = 2000
# Airtel posts no payout callback: the enquiry finds a payout's outcome; ask soon in a demo.
query_after_secs = 5

[policy]
default_profile = "none"

[[policy.profiles]]
name = "none"
allowed_accounts = []
daily_payments_max = 1
calls_per_minute = 60

[[policy.profiles]]
name = "dev"
dev_key_only = true
subjects = ["dev-agent"]
allowed_accounts = ["acct-A", "acct-B", "mpesa-collections", "airtel-collections"]
# Per payment without a human (KES 1,000.00); above it the call returns APPROVAL_REQUIRED.
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "100000.00" }
daily_refund_limit = { KES = "10000.00" }
daily_payments_max = 1000
calls_per_minute = 600
"#;

const PRODUCTION_TEMPLATE: &str = r#"# paygate configuration, written by `paygate init --mode production`.
# Agents' tokens come from your identity provider; state lives in PostgreSQL (shared by replicas);
# secrets come from the environment, never from this file. Every key, its default and its bounds:
# config/default.toml. Check everything before the first start:
#
#   paygate doctor --config paygate.toml
#
# Secrets, from your secret store, the same values on every replica:
#   PAYGATE_STORAGE__URL=postgres://paygate:<password>@db:5432/paygate   (overrides storage.url below)
#   PAYGATE_IDEMPOTENCY__SECRET=<at least 32 random characters, e.g. `openssl rand -base64 32`>
#   PAYGATE_MANDATES__SECRET=<another 32+ random characters>

[server]
bind = "0.0.0.0:8080"
# The URL clients use. Agents' tokens must carry "<public_url>/mcp" as their audience, operators'
# (the approval routes, /operator/v1, the console) "<public_url>/operator": register both as
# resources (API audiences) at your authorization server. Behind a proxy this is the proxy's https URL.
public_url = {public_url}
# Browser origins allowed to call /mcp, e.g. ["https://console.example.com"].
allowed_origins = []

[storage]
# Without a password here; PAYGATE_STORAGE__URL with the password replaces this value.
url = "postgres://paygate@127.0.0.1:5432/paygate"
postgres_schema = "paygate"
# A managed PostgreSQL needs TLS: "verify-full" with its CA bundle in postgres_ssl_ca_file.
postgres_sslmode = "disable"
postgres_ssl_ca_file = ""
data_dir = {data_dir}

[auth]
# Your authorization server: its issuer ("iss") and JWKS. RS*, PS*, ES* and EdDSA keys.
issuer = {issuer}
jwks_url = {jwks_url}
# The dev key must stay off when an identity provider issues the tokens.
dev_key_enabled = false

[dev]
print_token = false

[policy]
# Agents no profile names get nothing (fail closed).
default_profile = "none"

[[policy.profiles]]
name = "none"
allowed_accounts = []
daily_payments_max = 1
calls_per_minute = 60

# One profile per agent (or kind of agent), matched by token subject or client id.
[[policy.profiles]]
name = "billing-agent"
issuer = {issuer}
client_ids = ["billing-agent"]
allowed_accounts = ["acct-operating", "acct-vendors"]
# Per payment without a human; above it the call returns APPROVAL_REQUIRED.
autonomous_limit = { USD = "100.00" }
daily_limit = { USD = "1000.00" }
# Refunds without a human per day, apart from payments (a currency not listed takes daily_limit).
daily_refund_limit = { USD = "300.00" }
daily_payments_max = 100
calls_per_minute = 120

[ledger]
# No demo accounts in production.
demo = false
"#;

/// How an MCP client starts `paygate stdio` for this config: the binary and the config file, as
/// absolute paths (a client starts its servers from a directory of its own).
pub struct StdioLaunch<'a> {
    pub command: &'a Path,
    pub config: &'a Path,
    /// The data directory as an absolute path, when the config names it relative to where init
    /// ran: from the client's directory it would be another one, with another dev key.
    pub data_dir: Option<&'a Path>,
}

/// Ready-to-paste client configuration for `mcp_url`, with the token kept out of files the client
/// shares (an environment variable, a prompt, or a 0600 header file) — but for a stdio entry, whose
/// client hands the token to `paygate stdio` from its own config file.
pub fn client_snippets(mode: Mode, mcp_url: &str, dir: &Path, stdio: &StdioLaunch<'_>) -> String {
    let headers = dir.join("paygate.headers");
    let headers = headers.to_string_lossy();
    // JSON string literals (quotes and backslashes in a path escaped).
    let json = |p: &Path| serde_json::Value::from(p.to_string_lossy()).to_string();
    let (command, config) = (json(stdio.command), json(stdio.config));
    let data_dir = stdio.data_dir.map(|d| format!(", \"PAYGATE_STORAGE__DATA_DIR\": {}", json(d))).unwrap_or_default();
    let get_token = match mode {
        Mode::Dev | Mode::Demo => format!(
            "export PAYGATE_TOKEN=$(paygate --config {} token --sub dev-agent --scope \"payments:read payments:create\")",
            dir.join(CONFIG_FILE).to_string_lossy()
        ),
        Mode::Production => {
            "export PAYGATE_TOKEN=<an access token from your identity provider, audience = the URL above>".to_string()
        }
    };
    let url = mcp_url;
    format!(
        r#"MCP endpoint: {url}

A token for the agent:
  {get_token}

Claude Code:
  claude mcp add --transport http paygate {url} --header "Authorization: Bearer $PAYGATE_TOKEN"

Claude Desktop or any client that starts its servers (stdio: paygate runs as its subprocess, for the
one agent whose token it is given; no port, no HTTP):
  claude_desktop_config.json:
  {{ "mcpServers": {{ "paygate": {{ "command": {command},
      "args": ["--config", {config}, "stdio"],
      "env": {{ "PAYGATE_TOKEN": "<the agent's token, as above>"{data_dir} }} }} }} }}
  (that file then holds the token: keep it private; it runs the same store, policy and limits as serve)

Claude Desktop bridged to this HTTP gateway through mcp-remote (the token stays in a 0600 header file):
  (umask 077; printf 'Authorization: Bearer %s\n' "$PAYGATE_TOKEN" > {headers})
  claude_desktop_config.json:
  {{ "mcpServers": {{ "paygate": {{ "command": "npx",
      "args": ["mcp-remote@0.15.1", "{url}", "--header-file", "{headers}"] }} }} }}

Cursor (~/.cursor/mcp.json):
  {{ "mcpServers": {{ "paygate": {{ "url": "{url}",
      "headers": {{ "Authorization": "Bearer ${{env:PAYGATE_TOKEN}}" }} }} }} }}

VS Code (.vscode/mcp.json; asks for the token once and keeps it in its secret storage):
  {{ "inputs": [{{ "type": "promptString", "id": "paygate-token", "description": "paygate token", "password": true }}],
    "servers": {{ "paygate": {{ "type": "http", "url": "{url}",
      "headers": {{ "Authorization": "Bearer ${{input:paygate-token}}" }} }} }} }}

Python (pip install mcp==2.3.0):
  import asyncio, os, httpx2
  from mcp.client import Client
  from mcp.client.streamable_http import streamable_http_client

  async def main():
      http = httpx2.AsyncClient(headers={{"Authorization": f"Bearer {{os.environ['PAYGATE_TOKEN']}}"}})
      async with http, Client(streamable_http_client("{url}", http_client=http), mode="auto") as client:
          print(await client.call_tool("get_balance", {{"account_id": "acct-A"}}))

  asyncio.run(main())

TypeScript (npm install @modelcontextprotocol/client@2.4.0):
  import {{ Client, StreamableHTTPClientTransport }} from '@modelcontextprotocol/client';
  const transport = new StreamableHTTPClientTransport(new URL('{url}'), {{
      authProvider: {{ token: async () => process.env.PAYGATE_TOKEN }} }});
  const client = new Client({{ name: 'my-agent', version: '1.0.0' }});
  await client.connect(transport);
  console.log(await client.callTool({{ name: 'get_balance', arguments: {{ account_id: 'acct-A' }} }}));
"#
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opts(mode: Mode, dir: &Path) -> InitOptions {
        InitOptions { mode, dir: dir.to_path_buf(), public_url: None, issuer: None, jwks_url: None }
    }

    #[test]
    fn both_templates_load_as_valid_config_and_say_what_they_promise() {
        let dir = tempfile::tempdir().unwrap();
        for mode in [Mode::Dev, Mode::Production, Mode::Demo] {
            let sub = dir.path().join(format!("{mode:?}"));
            let w = write_config(&opts(mode, &sub)).unwrap();
            let c = crate::config::Config::load(Some(&w.config_path), Vec::<(String, String)>::new())
                .unwrap_or_else(|e| panic!("{mode:?} template: {e}"));
            match mode {
                Mode::Dev => {
                    assert!(c.auth.dev_key_on());
                    assert_eq!(c.storage.url, "", "dev is SQLite");
                    assert_eq!(w.mcp_url, "http://127.0.0.1:8080/mcp");
                }
                Mode::Demo => {
                    assert!(c.auth.dev_key_on() && c.mpesa.enabled);
                    assert_eq!(c.mpesa.environment, crate::config::MpesaEnvironment::Simulator);
                    assert!(c.mpesa.callback_secret.expose().len() >= 24, "a real callback secret");
                    assert_eq!(c.airtel.environment, crate::config::AirtelEnvironment::Simulator);
                    assert!(c.airtel.enabled && c.airtel.callback_secret.expose().len() >= 24);
                    assert_ne!(c.airtel.callback_secret.expose(), c.mpesa.callback_secret.expose());
                    assert!(
                        c.policy
                            .profiles
                            .iter()
                            .any(|p| p.allowed_accounts.iter().any(|a| a.as_str() == "mpesa-collections"))
                    );
                }
                Mode::Production => {
                    assert!(!c.auth.dev_key_on(), "production never accepts the dev key");
                    assert!(!c.dev.print_token);
                    assert!(c.storage.url.starts_with("postgres://"));
                    assert!(!c.auth.issuer.is_empty() && !c.auth.jwks_url.is_empty());
                    assert!(!c.ledger.demo);
                    // The compiled-in dev profile does not survive into production.
                    assert!(c.policy.profiles.iter().all(|p| p.name != "dev"), "{:?}", c.policy.profiles);
                    assert!(c.idempotency.secret.is_none(), "secrets are not in the file");
                }
            }
        }
    }

    #[test]
    fn the_stdio_entry_is_json_that_starts_paygate_stdio_with_the_token_in_its_env() {
        let dir = Path::new("/srv/my \"gw\"");
        let config = dir.join(CONFIG_FILE);
        let entry = |data_dir: Option<&Path>| {
            let launch = StdioLaunch { command: Path::new("/opt/paygate/bin/paygate"), config: &config, data_dir };
            let text = client_snippets(Mode::Dev, "http://127.0.0.1:8080/mcp", dir, &launch);
            let start = text.find(r#"{ "mcpServers": { "paygate": { "command": "/opt"#).expect("a stdio entry");
            let end = start + text[start..].find("} } } }").unwrap() + "} } } }".len();
            let entry: serde_json::Value = serde_json::from_str(&text[start..end]).unwrap();
            entry["mcpServers"]["paygate"].clone()
        };
        let server = entry(None);
        assert_eq!(server["command"], "/opt/paygate/bin/paygate");
        assert_eq!(server["args"], serde_json::json!(["--config", "/srv/my \"gw\"/paygate.toml", "stdio"]));
        assert!(server["env"]["PAYGATE_TOKEN"].is_string(), "{server}");
        assert!(server["env"].get("PAYGATE_STORAGE__DATA_DIR").is_none(), "{server}");
        // A relative data directory is pinned for a client that starts paygate elsewhere.
        let server = entry(Some(Path::new("/home/me/gw/data")));
        assert_eq!(server["env"]["PAYGATE_STORAGE__DATA_DIR"], "/home/me/gw/data");
    }

    #[test]
    fn init_never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        let first = write_config(&opts(Mode::Dev, dir.path())).unwrap();
        let before = std::fs::read(&first.config_path).unwrap();
        let again = write_config(&opts(Mode::Production, dir.path()));
        assert!(matches!(again, Err(InitError::Exists(_))), "{again:?}");
        assert_eq!(std::fs::read(&first.config_path).unwrap(), before);
    }

    #[test]
    fn values_are_escaped_into_toml() {
        let dir = tempfile::tempdir().unwrap();
        let mut o = opts(Mode::Production, dir.path());
        o.issuer = Some("https://idp.example.com/\"\nx = 1".into());
        let (text, _) = render(&o);
        let parsed: toml::Table = text.parse().unwrap();
        assert_eq!(parsed["auth"]["issuer"].as_str(), Some("https://idp.example.com/\"\nx = 1"));
    }
}
