//! `paygate init` and `paygate doctor`, black-box: the real binary, real config files, and real
//! misconfigurations (closed ports, a JWKS with no usable key, an IdP whose clock is an hour off,
//! a database that is not migrated, Daraja refusing the credentials, …). Each ✗ doctor can print is
//! produced here by the mistake it is meant to catch.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

#[path = "common/airtel.rs"]
mod airtel;
mod common;
#[path = "common/daraja.rs"]
mod daraja;
#[path = "common/wallet.rs"]
mod wallet;

use std::path::Path;
use std::process::{Command, Output};

use jsonwebtoken::jwk::{Jwk, JwkSet};
use jsonwebtoken::{Algorithm, EncodingKey};

fn paygate(args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_paygate"));
    // Only what the test says: no PAYGATE_* from the developer's shell.
    cmd.env_clear().args(args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().expect("paygate runs")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

/// `paygate doctor --config <dir>/paygate.toml` with `toml` as the file.
fn doctor(dir: &Path, toml: &str, env: &[(&str, &str)]) -> (i32, String) {
    let file = dir.join("paygate.toml");
    std::fs::write(&file, toml).unwrap();
    let o = paygate(&["doctor", "--config", file.to_str().unwrap()], env);
    (o.status.code().unwrap_or(-1), stdout(&o))
}

/// The line of check `name`, asserting its mark.
fn line<'a>(out: &'a str, mark: char, name: &str) -> &'a str {
    out.lines()
        .find(|l| l.starts_with(mark) && l[mark.len_utf8()..].trim_start().starts_with(name))
        .unwrap_or_else(|| panic!("no `{mark} {name}` line in:\n{out}"))
}

fn assert_fails(code: i32, out: &str, name: &str, says: &str) {
    assert_eq!(code, 1, "doctor exits 1 on a failed check:\n{out}");
    let l = line(out, '✗', name);
    assert!(l.contains(says), "`{name}` should say {says:?}:\n{out}");
    assert!(out.contains("fix: "), "a fix hint under the ✗:\n{out}");
}

/// A data directory in the temp dir (so the default ./data of the test's cwd is never touched).
fn base_toml(dir: &Path) -> String {
    format!("[storage]\ndata_dir = {:?}\n", dir.join("data").to_str().unwrap())
}

fn rsa_jwk(kid: &str) -> Jwk {
    let pem = std::fs::read(Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rsa1.pem")).unwrap();
    let mut jwk = Jwk::from_encoding_key(&EncodingKey::from_rsa_pem(&pem).unwrap(), Algorithm::RS256).unwrap();
    jwk.common.key_id = Some(kid.to_string());
    jwk
}

/// An identity provider's JWKS endpoint serving `set`, whose HTTP `Date` is `skew_secs` off ours.
async fn idp(set: serde_json::Value, skew_secs: i64) -> (String, tokio::task::JoinHandle<()>) {
    let router = axum::Router::new().route(
        "/jwks.json",
        axum::routing::get(move || {
            let set = set.clone();
            async move {
                let at = time::OffsetDateTime::now_utc() + time::Duration::seconds(skew_secs);
                let date = at.format(&time::format_description::well_known::Rfc2822).unwrap();
                ([(axum::http::header::DATE, date)], axum::Json(set))
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/jwks.json", listener.local_addr().unwrap());
    let task = tokio::spawn(async move {
        axum::serve(listener, router).await.unwrap();
    });
    (url, task)
}

fn good_jwks() -> serde_json::Value {
    serde_json::to_value(JwkSet { keys: vec![rsa_jwk("k1")] }).unwrap()
}

/// A loopback port nothing listens on.
fn closed_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// In a blocking task: the child process must not hold a runtime worker while the test's own
/// servers (JWKS, Daraja fake) need it to answer.
async fn doctor_async(dir: &Path, toml: String, env: Vec<(String, String)>) -> (i32, String) {
    let dir = dir.to_path_buf();
    tokio::task::spawn_blocking(move || {
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        doctor(&dir, &toml, &env)
    })
    .await
    .unwrap()
}

// ---------------------------------------------------------------------------------------------
// init
// ---------------------------------------------------------------------------------------------

#[test]
fn init_writes_a_dev_config_that_doctor_passes_and_refuses_to_overwrite_it() {
    let dir = tempfile::tempdir().unwrap();
    let target = dir.path().join("gw");
    let o = paygate(&["init", "--dir", target.to_str().unwrap()], &[]);
    assert!(o.status.success(), "init: {}", String::from_utf8_lossy(&o.stderr));
    let out = stdout(&o);
    let file = target.join("paygate.toml");
    assert!(out.contains(&format!("wrote {}", file.display())), "{out}");
    for client in [
        "claude mcp add --transport http paygate http://127.0.0.1:8080/mcp",
        "mcp-remote@0.15.1",
        r#""stdio"],"#,
        r#""PAYGATE_TOKEN":"#,
        "Cursor",
        "VS Code",
        "streamable_http_client(",
        "StreamableHTTPClientTransport",
    ] {
        assert!(out.contains(client), "snippet for {client:?} in:\n{out}");
    }
    let written = std::fs::read_to_string(&file).unwrap();
    assert!(written.contains("dev_key_enabled = true"), "{written}");

    // The fresh dev config is ready to run: every check passes before the first start.
    let o = paygate(&["doctor", "--config", file.to_str().unwrap()], &[]);
    let report = stdout(&o);
    assert!(o.status.success(), "doctor on a fresh dev config:\n{report}");
    assert!(!report.contains('✗'), "{report}");
    assert!(line(&report, '✓', "store").contains("created on first start"), "{report}");

    // Again: refused, exit 1, the file unchanged.
    let o = paygate(&["init", "--mode", "production", "--dir", target.to_str().unwrap()], &[]);
    assert_eq!(o.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&o.stderr).contains("never overwrites"), "{}", String::from_utf8_lossy(&o.stderr));
    assert_eq!(std::fs::read_to_string(&file).unwrap(), written);
}

#[tokio::test]
async fn init_production_config_runs_against_a_real_idp_once_its_secrets_are_set() {
    let (jwks_url, _idp) = idp(good_jwks(), 0).await;
    let dir = tempfile::tempdir().unwrap();
    let issuer = "http://127.0.0.1/issuer";
    let (d, j) = (dir.path().to_str().unwrap().to_string(), jwks_url.clone());
    let o = tokio::task::spawn_blocking(move || {
        paygate(
            &[
                "init",
                "--mode",
                "production",
                "--dir",
                &d,
                "--public-url",
                "https://pay.example.com",
                "--issuer",
                issuer,
                "--jwks-url",
                &j,
            ],
            &[],
        )
    })
    .await
    .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(stdout(&o).contains("https://pay.example.com/mcp"), "{}", stdout(&o));
    let toml = std::fs::read_to_string(dir.path().join("paygate.toml")).unwrap();
    // Without its secrets and database, the production config is not ready, and doctor says why.
    let env =
        vec![("PAYGATE_STORAGE__URL".to_string(), format!("postgres://paygate@127.0.0.1:{}/paygate", closed_port()))];
    let (code, out) = doctor_async(dir.path(), toml.clone(), env).await;
    assert_eq!(code, 1, "{out}");
    line(&out, '✓', "dev key");
    line(&out, '✓', "identity");
    line(&out, '✗', "store");
    assert!(line(&out, '✗', "secrets").contains("idempotency.secret is not set while the store is shared"), "{out}");
}

// ---------------------------------------------------------------------------------------------
// doctor: each ✗ from a real mistake
// ---------------------------------------------------------------------------------------------

#[test]
fn doctor_rejects_an_invalid_config_and_names_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let (code, out) = doctor(dir.path(), "[server]\nbody_bytes_max = 1\n", &[]);
    assert_fails(code, &out, "config", "server.body_bytes_max");
    let (code, out) = doctor(dir.path(), "[server\n", &[]);
    assert_fails(code, &out, "config", "not valid TOML");
}

#[tokio::test]
async fn doctor_flags_the_dev_key_left_on_beside_an_identity_provider() {
    let (jwks, _idp) = idp(good_jwks(), 0).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!("{}[auth]\nissuer = \"http://127.0.0.1/idp\"\njwks_url = {jwks:?}\n", base_toml(dir.path()));
    let on = vec![("PAYGATE_AUTH__DEV_KEY_ENABLED".to_string(), "true".to_string())];
    let (code, out) = doctor_async(dir.path(), toml.clone(), on).await;
    assert_fails(code, &out, "dev key", "on while an identity provider is configured");
    assert!(line(&out, '✓', "identity").contains("k1"), "{out}");
    // Not forced on: beside an identity provider the dev key is off, and that check passes.
    let (_, out) = doctor_async(dir.path(), toml, vec![]).await;
    assert!(line(&out, '✓', "dev key").contains("off"), "{out}");
}

#[tokio::test]
async fn doctor_flags_an_unreachable_jwks_and_one_without_usable_keys() {
    let dir = tempfile::tempdir().unwrap();
    let off = vec![("PAYGATE_AUTH__DEV_KEY_ENABLED".to_string(), "false".to_string())];
    let url = format!("http://127.0.0.1:{}/jwks.json", closed_port());
    let toml = format!("{}[auth]\nissuer = \"http://127.0.0.1/idp\"\njwks_url = {url:?}\n", base_toml(dir.path()));
    let (code, out) = doctor_async(dir.path(), toml, off.clone()).await;
    assert_fails(code, &out, "identity", "unreachable");

    // Only a symmetric key, and an RSA key without a kid: nothing a token could be verified with.
    let mut no_kid = rsa_jwk("x");
    no_kid.common.key_id = None;
    let oct = serde_json::json!({"kty": "oct", "k": "c2VjcmV0", "kid": "h1", "alg": "HS256"});
    let set = serde_json::json!({"keys": [oct, serde_json::to_value(no_kid).unwrap()]});
    let (jwks, _idp) = idp(set, 0).await;
    let toml = format!("{}[auth]\nissuer = \"http://127.0.0.1/idp\"\njwks_url = {jwks:?}\n", base_toml(dir.path()));
    let (code, out) = doctor_async(dir.path(), toml, off).await;
    assert_fails(code, &out, "identity", "no usable signing key");
}

#[tokio::test]
async fn doctor_flags_a_clock_an_hour_off_the_identity_providers() {
    let (jwks, _idp) = idp(good_jwks(), 3600).await;
    let dir = tempfile::tempdir().unwrap();
    let toml = format!(
        "{}[auth]\nissuer = \"http://127.0.0.1/idp\"\njwks_url = {jwks:?}\ndev_key_enabled = false\n",
        base_toml(dir.path())
    );
    let (code, out) = doctor_async(dir.path(), toml, vec![]).await;
    assert_fails(code, &out, "clock", "off the identity provider's clock");
    // Within the leeway: fine.
    let (ok_jwks, _ok_idp) = idp(good_jwks(), 0).await;
    let toml = format!(
        "{}[auth]\nissuer = \"http://127.0.0.1/idp\"\njwks_url = {ok_jwks:?}\ndev_key_enabled = false\n",
        base_toml(dir.path())
    );
    let (code, out) = doctor_async(dir.path(), toml, vec![]).await;
    assert_eq!(code, 0, "{out}");
    line(&out, '✓', "clock");
}

#[test]
fn doctor_flags_a_database_it_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    paygate::private_fs::create_dir(&data).unwrap(); // as paygate makes it: owner-only
    let db = data.join("paygate.sqlite3");

    // Not a database at all.
    std::fs::write(&db, b"this is not sqlite, it is a text file that someone put here").unwrap();
    let (code, out) = doctor(dir.path(), &base_toml(dir.path()), &[]);
    assert_fails(code, &out, "store", "SQLite");

    // A database an older paygate left behind (schema version 1): not migrated.
    std::fs::remove_file(&db).unwrap();
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("CREATE TABLE t (x INTEGER); PRAGMA user_version = 1;").unwrap();
    drop(conn);
    let (code, out) = doctor(dir.path(), &base_toml(dir.path()), &[]);
    assert_fails(code, &out, "store", "not migrated");

    // `paygate migrate` is the fix the doctor names; afterwards the store passes.
    std::fs::remove_file(&db).unwrap();
    let file = dir.path().join("paygate.toml");
    let o = paygate(&["migrate", "--config", file.to_str().unwrap()], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (code, out) = doctor(dir.path(), &base_toml(dir.path()), &[]);
    assert_eq!(code, 0, "{out}");
    assert!(line(&out, '✓', "store").contains("schema version"), "{out}");

    // A newer paygate's database: this binary must not run on it.
    let conn = rusqlite::Connection::open(&db).unwrap();
    conn.execute_batch("PRAGMA user_version = 999;").unwrap();
    drop(conn);
    let (code, out) = doctor(dir.path(), &base_toml(dir.path()), &[]);
    assert_fails(code, &out, "store", "newer than this binary");

    // PostgreSQL that does not answer.
    let url = format!("postgres://paygate@127.0.0.1:{}/paygate", closed_port());
    let (code, out) = doctor(dir.path(), &base_toml(dir.path()), &[("PAYGATE_STORAGE__URL", &url)]);
    assert_fails(code, &out, "store", "PostgreSQL unreachable");
}

#[test]
fn doctor_checks_postgres_migrations() {
    let Some(db) = common::database("doctor_checks_postgres_migrations") else { return };
    let dir = tempfile::tempdir().unwrap();
    let secret = "0123456789abcdef0123456789abcdef";
    let env = [
        ("PAYGATE_STORAGE__URL", db.url.as_str()),
        ("PAYGATE_STORAGE__POSTGRES_SCHEMA", db.schema.as_str()),
        ("PAYGATE_IDEMPOTENCY__SECRET", secret),
        ("PAYGATE_MANDATES__SECRET", secret),
    ];
    let (code, out) = doctor(dir.path(), &base_toml(dir.path()), &env);
    assert_fails(code, &out, "store", "schema version 0 of");
    let file = dir.path().join("paygate.toml");
    let o = paygate(&["migrate", "--config", file.to_str().unwrap()], &env);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let (code, out) = doctor(dir.path(), &base_toml(dir.path()), &env);
    assert_eq!(code, 0, "{out}");
    line(&out, '✓', "store");
    line(&out, '✓', "secrets");
}

#[tokio::test]
async fn doctor_refuses_a_ledger_client_key_others_can_read() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("client.crt"), dir.path().join("client.key"));
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n").unwrap();
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o640)).unwrap();
    let env = vec![
        ("PAYGATE_BACKEND__KIND".to_string(), "http".to_string()),
        ("PAYGATE_BACKEND__HTTP_URL".to_string(), format!("https://127.0.0.1:{}", closed_port())),
        ("PAYGATE_BACKEND__HTTP_CREDENTIAL".to_string(), "a-long-ledger-credential".to_string()),
        ("PAYGATE_BACKEND__TLS_CLIENT_CERT_FILE".to_string(), cert.display().to_string()),
        ("PAYGATE_BACKEND__TLS_CLIENT_KEY_FILE".to_string(), key.display().to_string()),
    ];
    let (code, out) = doctor_async(dir.path(), base_toml(dir.path()), env).await;
    assert_fails(code, &out, "backend tls", "readable by others (mode 640)");
}

/// The wallet service: its health, then every mapped account asked for by balance. A UUID the
/// service does not know is named with the paygate account it is mapped from.
#[tokio::test]
async fn doctor_checks_the_wallet_service_and_its_account_mapping() {
    let dir = tempfile::tempdir().unwrap();
    let fake = wallet::WalletFake::start().await;
    let env = |accounts: String| {
        vec![
            ("PAYGATE_BACKEND__KIND".to_string(), "wallet-service".to_string()),
            ("PAYGATE_BACKEND__HTTP_URL".to_string(), fake.url()),
            ("PAYGATE_BACKEND__WALLET_MERCHANT_ID".to_string(), wallet::MERCHANT.to_string()),
            ("PAYGATE_BACKEND__WALLET_ACCOUNTS".to_string(), accounts),
        ]
    };
    let (_, out) = doctor_async(dir.path(), base_toml(dir.path()), env(wallet::accounts_toml())).await;
    assert!(line(&out, '✓', "backend").contains("wallet service"), "{out}");
    assert!(line(&out, '✓', "wallet accounts").contains("3 mapped"), "{out}");

    let stray = format!(
        "{{ acct-A = \"{}\", acct-B = \"{}\", acct-Q = \"0c0c0c0c-0000-4000-8000-00000000000c\" }}",
        wallet::uuid_of("acct-A"),
        wallet::uuid_of("acct-B")
    );
    let (code, out) = doctor_async(dir.path(), base_toml(dir.path()), env(stray)).await;
    assert_fails(code, &out, "wallet accounts", "acct-Q → 0c0c0c0c-0000-4000-8000-00000000000c (HTTP 404)");

    let closed = env(wallet::accounts_toml())
        .into_iter()
        .map(|(k, v)| if k.ends_with("HTTP_URL") { (k, format!("http://127.0.0.1:{}", closed_port())) } else { (k, v) })
        .collect();
    let (code, out) = doctor_async(dir.path(), base_toml(dir.path()), closed).await;
    assert_fails(code, &out, "backend", "unreachable");

    // A profile's account with no UUID is refused at load, naming both.
    let partial = format!("{{ acct-A = \"{}\" }}", wallet::uuid_of("acct-A"));
    let (code, out) = doctor_async(dir.path(), base_toml(dir.path()), env(partial)).await;
    assert_eq!(code, 1, "{out}");
    assert!(out.contains("backend.wallet_accounts has no UUID for acct-B"), "{out}");
}

#[tokio::test]
async fn doctor_flags_an_unhealthy_ledger_service_and_refused_rail_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("http://127.0.0.1:{}", closed_port());
    let env = vec![
        ("PAYGATE_BACKEND__KIND".to_string(), "http".to_string()),
        ("PAYGATE_BACKEND__HTTP_URL".to_string(), url),
        ("PAYGATE_BACKEND__HTTP_CREDENTIAL".to_string(), "a-long-ledger-credential".to_string()),
    ];
    let (code, out) = doctor_async(dir.path(), base_toml(dir.path()), env).await;
    assert_fails(code, &out, "backend", "unreachable");

    let fake = daraja::DarajaFake::start(daraja::FakeConfig::default()).await;
    let mpesa = |key: &str| {
        vec![
            ("PAYGATE_SERVER__PUBLIC_URL".to_string(), "https://pay.example.com".to_string()),
            ("PAYGATE_MPESA__ENABLED".to_string(), "true".to_string()),
            ("PAYGATE_MPESA__BASE_URL".to_string(), fake.base_url()),
            ("PAYGATE_MPESA__CONSUMER_KEY".to_string(), key.to_string()),
            ("PAYGATE_MPESA__CONSUMER_SECRET".to_string(), "fake-consumer-secret".to_string()),
            ("PAYGATE_MPESA__SHORT_CODE".to_string(), daraja::SANDBOX_SHORT_CODE.to_string()),
            ("PAYGATE_MPESA__PASSKEY".to_string(), daraja::SANDBOX_PASSKEY.to_string()),
            ("PAYGATE_MPESA__CALLBACK_SECRET".to_string(), "cb-secret-0123456789abcdefgh".to_string()),
        ]
    };
    let (code, out) = doctor_async(dir.path(), base_toml(dir.path()), mpesa("someone-elses-key")).await;
    assert_fails(code, &out, "m-pesa", "refused");
    assert!(!out.contains("someone-elses-key") && !out.contains("fake-consumer-secret"), "no secret printed:\n{out}");
    let (_, out) = doctor_async(dir.path(), base_toml(dir.path()), mpesa("fake-consumer-key")).await;
    line(&out, '✓', "m-pesa");

    // Airtel likewise: its token endpoint refusing the client id is a ✗, never a secret printed.
    let fake = airtel::AirtelFake::start().await;
    let airtel = |secret: &str| {
        vec![
            ("PAYGATE_SERVER__PUBLIC_URL".to_string(), "https://pay.example.com".to_string()),
            ("PAYGATE_AIRTEL__ENABLED".to_string(), "true".to_string()),
            ("PAYGATE_AIRTEL__BASE_URL".to_string(), fake.base_url()),
            ("PAYGATE_AIRTEL__CLIENT_ID".to_string(), airtel::CLIENT_ID.to_string()),
            ("PAYGATE_AIRTEL__CLIENT_SECRET".to_string(), secret.to_string()),
            ("PAYGATE_AIRTEL__CALLBACK_SECRET".to_string(), "cb-secret-0123456789abcdefgh".to_string()),
        ]
    };
    let (code, out) = doctor_async(dir.path(), base_toml(dir.path()), airtel("someone-elses-secret")).await;
    assert_fails(code, &out, "airtel", "Airtel: ");
    assert!(!out.contains("someone-elses-secret"), "no secret printed:\n{out}");
    let (_, out) = doctor_async(dir.path(), base_toml(dir.path()), airtel(airtel::CLIENT_SECRET)).await;
    line(&out, '✓', "airtel");
}

#[test]
fn doctor_flags_urls_clients_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_toml(dir.path());
    let (code, out) = doctor(dir.path(), &format!("{base}[server]\nbind = \"0.0.0.0:8080\"\n"), &[]);
    assert_fails(code, &out, "urls", "server.public_url is empty while binding 0.0.0.0:8080");
    let (code, out) = doctor(dir.path(), &format!("{base}[server]\npublic_url = \"http://pay.example.com\"\n"), &[]);
    assert_fails(code, &out, "urls", "plain http on a non-loopback host");
    let (code, out) =
        doctor(dir.path(), &format!("{base}[server]\nallowed_origins = [\"https://console.example.com/\"]\n"), &[]);
    assert_fails(code, &out, "urls", "is not an origin");
    let (code, out) = doctor(
        dir.path(),
        &format!(
            "{base}[server]\npublic_url = \"https://pay.example.com\"\nallowed_origins = [\"https://console.example.com\"]\n"
        ),
        &[],
    );
    assert_eq!(code, 0, "{out}");
    line(&out, '✓', "urls");
}

#[test]
fn doctor_flags_short_missing_and_exposed_secrets_without_printing_them() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_toml(dir.path());
    let short = "c2hvcnQtc2VjcmV0";
    let (code, out) = doctor(dir.path(), &base, &[("PAYGATE_IDEMPOTENCY__SECRET", short)]);
    assert_fails(code, &out, "secrets", "idempotency.secret is 16 characters");
    assert!(!out.contains(short), "the secret itself is never printed:\n{out}");

    // A generated key file others can read.
    let data = dir.path().join("data");
    paygate::private_fs::create_dir(&data).unwrap(); // as paygate makes it: owner-only
    let key = data.join("mandate.key");
    std::fs::write(&key, "MDEyMzQ1Njc4OWFiY2RlZjAxMjM0NTY3ODlhYmNkZWY=").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (code, out) = doctor(dir.path(), &base, &[]);
    assert_fails(code, &out, "secrets", "readable by others");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, out) = doctor(dir.path(), &base, &[]);
    assert_eq!(code, 0, "{out}");
}

#[tokio::test]
async fn doctor_flags_identity_keys_it_cannot_use() {
    let dir = tempfile::tempdir().unwrap();
    let off = vec![("PAYGATE_AUTH__DEV_KEY_ENABLED".to_string(), "false".to_string())];
    // A "public key file" that holds no key.
    let not_a_key = dir.path().join("idp.pub.pem");
    std::fs::write(&not_a_key, "-----BEGIN CERTIFICATE REQUEST-----\nnope\n-----END CERTIFICATE REQUEST-----\n")
        .unwrap();
    let toml = format!(
        "{}[auth]\nissuer = \"http://127.0.0.1/idp\"\npublic_key_files = [{:?}]\n",
        base_toml(dir.path()),
        not_a_key.to_str().unwrap()
    );
    let (code, out) = doctor_async(dir.path(), toml, off.clone()).await;
    assert_fails(code, &out, "identity", "not an RSA, EC or Ed25519 public key");

    // The JWKS URL is wrong (404), or answers something that is not a key set.
    let (jwks, _idp) = idp(serde_json::json!({"issuer": "not a key set"}), 0).await;
    let wrong_path = jwks.replace("/jwks.json", "/.well-known/jwks");
    for (url, says) in [(wrong_path.as_str(), "answered HTTP 404"), (jwks.as_str(), "is not a JSON Web Key Set")] {
        let toml = format!("{}[auth]\nissuer = \"http://127.0.0.1/idp\"\njwks_url = {url:?}\n", base_toml(dir.path()));
        let (code, out) = doctor_async(dir.path(), toml, off.clone()).await;
        assert_fails(code, &out, "identity", says);
    }
}

#[test]
fn doctor_flags_a_data_directory_that_cannot_be_created() {
    let dir = tempfile::tempdir().unwrap();
    // data_dir points below a regular file.
    let file = dir.path().join("not-a-dir");
    std::fs::write(&file, "x").unwrap();
    let toml = format!("[storage]\ndata_dir = {:?}\n", file.join("data").to_str().unwrap());
    let (code, out) = doctor(dir.path(), &toml, &[]);
    assert_fails(code, &out, "store", "cannot be created");
}

#[tokio::test]
async fn doctor_flags_a_ledger_service_that_is_not_healthy() {
    // Something answers at the URL, but not the ledger contract's /v1/health.
    let (jwks, _server) = idp(good_jwks(), 0).await;
    let base = jwks.trim_end_matches("/jwks.json").to_string();
    let dir = tempfile::tempdir().unwrap();
    let env = vec![
        ("PAYGATE_BACKEND__KIND".to_string(), "http".to_string()),
        ("PAYGATE_BACKEND__HTTP_URL".to_string(), base),
        ("PAYGATE_BACKEND__HTTP_CREDENTIAL".to_string(), "a-long-ledger-credential".to_string()),
    ];
    let (code, out) = doctor_async(dir.path(), base_toml(dir.path()), env).await;
    assert_fails(code, &out, "backend", "answered HTTP 404");
}

#[test]
fn doctor_flags_plain_http_identity_urls_and_callbacks_daraja_cannot_reach() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_toml(dir.path());
    let toml = format!(
        "{base}[auth]\nissuer = \"http://idp.example.com/\"\npublic_key_files = [{:?}]\ndev_key_enabled = false\n",
        Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rsa1.pub.pem").to_str().unwrap()
    );
    let (code, out) = doctor(dir.path(), &toml, &[]);
    assert_fails(code, &out, "urls", "auth.issuer http://idp.example.com/ is plain http");

    // M-Pesa on a gateway with no public https URL: Daraja could never call back.
    let env = [
        ("PAYGATE_MPESA__ENABLED", "true"),
        ("PAYGATE_MPESA__BASE_URL", "http://127.0.0.1:1"),
        ("PAYGATE_MPESA__CONSUMER_KEY", "k"),
        ("PAYGATE_MPESA__CONSUMER_SECRET", "s"),
        ("PAYGATE_MPESA__SHORT_CODE", "174379"),
        ("PAYGATE_MPESA__PASSKEY", "p"),
        ("PAYGATE_MPESA__CALLBACK_SECRET", "cb-secret-0123456789abcdefgh"),
    ];
    let (code, out) = doctor(dir.path(), &base, &env);
    assert_fails(code, &out, "urls", "Daraja calls back only on public https URLs");
}

#[test]
fn doctor_flags_weak_keys_and_credentials() {
    let dir = tempfile::tempdir().unwrap();
    let base = base_toml(dir.path());
    // A generated key file someone truncated.
    let data = dir.path().join("data");
    paygate::private_fs::create_dir(&data).unwrap(); // as paygate makes it: owner-only
    let key = data.join("idempotency.key");
    std::fs::write(&key, "short").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (code, out) = doctor(dir.path(), &base, &[]);
    assert_fails(code, &out, "secrets", "idempotency.key holds 5 characters");
    std::fs::remove_file(&key).unwrap();

    let (code, out) = doctor(dir.path(), &base, &[("PAYGATE_AUTH__DEV_KEY", "dev")]);
    assert_fails(code, &out, "secrets", "auth.dev_key is 3 characters");

    let ledger = format!("http://127.0.0.1:{}", closed_port());
    let env = [
        ("PAYGATE_BACKEND__KIND", "http"),
        ("PAYGATE_BACKEND__HTTP_URL", ledger.as_str()),
        ("PAYGATE_BACKEND__HTTP_CREDENTIAL", "s3cret"),
    ];
    let (code, out) = doctor(dir.path(), &base, &env);
    assert_fails(code, &out, "secrets", "backend.http_credential is shorter than 16 characters");
    assert!(!out.contains("s3cret"), "{out}");
}

/// `paygate token --console` mints an operator's token (every operator scope) and says where to
/// paste it; a plain `token` still needs its subject and scope.
#[test]
fn token_for_the_console() {
    use base64::Engine;
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("paygate.toml");
    std::fs::write(&file, base_toml(dir.path())).unwrap();
    let o = paygate(&["--config", file.to_str().unwrap(), "token", "--console"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let token = stdout(&o).trim().to_string();
    let payload = token.split('.').nth(1).unwrap();
    let claims: serde_json::Value =
        serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap();
    assert_eq!(claims["sub"], "operator");
    assert_eq!(claims["scope"], "payments:audit payments:approve payments:admin");
    assert_eq!(claims["aud"], "http://127.0.0.1:8080/operator", "for the operator resource, not /mcp");
    let hint = String::from_utf8_lossy(&o.stderr);
    assert!(hint.contains("/console") && !hint.contains(&token), "the hint names the page, never the token: {hint}");
    let o = paygate(&["--config", file.to_str().unwrap(), "token", "--scope", "payments:read"], &[]);
    assert_eq!(o.status.code(), Some(2), "no subject: a usage error");
    let decode = |o: &std::process::Output| -> serde_json::Value {
        let token = stdout(o).trim().to_string();
        let payload = token.split('.').nth(1).unwrap().to_string();
        serde_json::from_slice(&base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(payload).unwrap()).unwrap()
    };
    // An agent's token (the default) and a delegated one: for /mcp, the agent in act.
    let cfg = file.to_str().unwrap();
    let o = paygate(&["--config", cfg, "token", "--sub", "pat", "--act", "bot", "--scope", "payments:read"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let claims = decode(&o);
    assert_eq!((claims["sub"].as_str(), claims["act"]["sub"].as_str()), (Some("pat"), Some("bot")));
    assert_eq!(claims["aud"], "http://127.0.0.1:8080/mcp");
    // Scopes of the other kind are a usage error, said plainly.
    let o = paygate(&["--config", cfg, "token", "--sub", "a", "--scope", "payments:read payments:admin"], &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("not an agent scope"),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let o = paygate(&["--config", cfg, "token", "--operator", "--sub", "a", "--scope", "payments:create"], &[]);
    assert_eq!(o.status.code(), Some(2), "an agent scope on an operator's token");
    // With TLS and no public_url, `serve` answers at https://<bind>: the token is minted for it.
    let fixtures = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/fixtures");
    let tls = format!(
        "{}\n[server]\ntls_cert_file = \"{fixtures}/tls-cert.pem\"\ntls_key_file = \"{fixtures}/tls-key.pem\"\n",
        base_toml(dir.path())
    );
    let tls_file = dir.path().join("tls.toml");
    std::fs::write(&tls_file, tls).unwrap();
    let o =
        paygate(&["--config", tls_file.to_str().unwrap(), "token", "--sub", "pat", "--scope", "payments:read"], &[]);
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let claims = decode(&o);
    assert_eq!(
        (claims["aud"].as_str(), claims["iss"].as_str()),
        (Some("https://127.0.0.1:8080/mcp"), Some("https://127.0.0.1:8080"))
    );
}

// ---------------------------------------------------------------------------------------------
// probe (the container health check: the image has no curl)
// ---------------------------------------------------------------------------------------------

/// `paygate probe <url>`, off the runtime's workers (the server under test must keep answering).
async fn probe(url: String) -> (i32, String) {
    tokio::task::spawn_blocking(move || {
        let o = paygate(&["probe", &url, "--timeout-secs", "5"], &[]);
        (o.status.code().unwrap_or(-1), String::from_utf8_lossy(&o.stderr).into_owned())
    })
    .await
    .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn probe_passes_a_ready_gateway_and_fails_anything_else() {
    let (app, _dir) = common::spawn_app().await;
    let (code, err) = probe(format!("{}/readyz", app.base())).await;
    assert_eq!(code, 0, "a ready gateway passes: {err}");

    // Not ready (503), not found and nothing listening all fail, saying why.
    let router = axum::Router::new()
        .route("/readyz", axum::routing::get(|| async { axum::http::StatusCode::SERVICE_UNAVAILABLE }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    let (code, err) = probe(format!("http://{addr}/readyz")).await;
    assert_eq!((code, err.contains("503")), (1, true), "{err}");
    let (code, err) = probe(format!("http://{addr}/nothing-here")).await;
    assert_eq!((code, err.contains("404")), (1, true), "{err}");
    let (code, _) = probe(format!("http://127.0.0.1:{}/readyz", closed_port())).await;
    assert_eq!(code, 1, "nothing listening");
    task.abort();
    app.stop().await;
}

// ---------------------------------------------------------------------------------------------
// start-up failures under PAYGATE_LOG_FORMAT=json
// ---------------------------------------------------------------------------------------------

#[test]
fn startup_failures_are_json_when_the_log_format_is_json() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let bad = [("PAYGATE_STORAGE__DATA_DIR", data.to_str().unwrap()), ("PAYGATE_LIMITS__LIST_LIMIT_MAX", "0")];
    let mut env = bad.to_vec();
    env.push(("PAYGATE_LOG_FORMAT", "json"));
    let o = paygate(&["serve"], &env);
    assert_eq!(o.status.code(), Some(2), "an invalid config stops the server");
    let stderr = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert!(!lines.is_empty(), "it says why");
    for line in &lines {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"));
        assert_eq!(v["level"], "ERROR", "{line}");
        assert!(v["message"].as_str().unwrap().contains("limits.list_limit_max"), "names the key: {line}");
    }
    // The text format says the same in one plain line.
    let o = paygate(&["serve"], &bad);
    assert_eq!(o.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&o.stderr);
    assert!(stderr.starts_with("paygate: ") && stderr.contains("limits.list_limit_max"), "{stderr}");
}

/// Finding 11 (issue 52): `init --demo` wrote the same simulator credentials into every config, so
/// anyone who read the README could use any demo gateway's simulator. Each config gets its own.
#[test]
fn init_demo_writes_simulator_credentials_of_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let creds = |name: &str| {
        let target = dir.path().join(name);
        let o = paygate(&["init", "--demo", "--dir", target.to_str().unwrap()], &[]);
        assert!(o.status.success(), "init --demo: {}", String::from_utf8_lossy(&o.stderr));
        let written = std::fs::read_to_string(target.join("paygate.toml")).unwrap();
        let value: toml::Value = toml::from_str(&written).unwrap();
        let pick = |section: &str, key: &str| value[section][key].as_str().unwrap().to_string();
        [
            pick("mpesa", "consumer_key"),
            pick("mpesa", "consumer_secret"),
            pick("mpesa", "passkey"),
            pick("mpesa", "security_credential"),
            pick("airtel", "client_id"),
            pick("airtel", "client_secret"),
        ]
    };
    let (one, two) = (creds("one"), creds("two"));
    for (a, b) in one.iter().zip(two.iter()) {
        assert_ne!(a, b, "a credential two demo configs share");
        assert!(a.len() >= 32, "{a}: long enough not to guess");
    }
}

/// The hostile review of issue 52 (F6): the command line issued enrolment codes for owners the API
/// refuses (bidi and zero-width characters: a person reading "bob" would be reading another name).
#[test]
fn the_enrolment_code_command_refuses_owners_no_one_can_read_as_written() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().display().to_string();
    for owner in ["b\u{202e}ob", "bob\u{200b}", "\u{feff}bob", ""] {
        let o = paygate(&["passkeys", "enrol-code", "--owner", owner], &[("PAYGATE_STORAGE__DATA_DIR", &data)]);
        assert_eq!(o.status.code(), Some(2), "{owner:?}: {}", String::from_utf8_lossy(&o.stderr));
        assert!(stdout(&o).is_empty(), "{owner:?}: no code printed");
    }
}
