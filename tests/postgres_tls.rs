//! Finding 9 of the authority review: the store always connected with `NoTls`, so `sslmode=require`
//! could not work and a managed PostgreSQL (which requires TLS) could not be used at all.
//!
//! The test starts a PostgreSQL cluster of its own (`initdb` + `pg_ctl`, a CA and a server
//! certificate made with `openssl`) that accepts TLS connections only, and talks to it in each
//! `storage.postgres_sslmode`. Where `initdb`, `pg_ctl` or `openssl` is absent it says so and skips.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test
#![cfg(unix)]

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::*;
use paygate::store::Engine;
use paygate::store::postgres::PostgresStore;
use paygate::store::postgres::tls::{SslMode, TlsSettings};
use serde_json::json;

/// A program on PATH or in Debian's PostgreSQL directory.
fn program(name: &str) -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    let mut dirs: Vec<PathBuf> = path.split(':').map(PathBuf::from).collect();
    if let Ok(versions) = std::fs::read_dir("/usr/lib/postgresql") {
        dirs.extend(versions.flatten().map(|v| v.path().join("bin")));
    }
    dirs.into_iter().map(|d| d.join(name)).find(|p| p.is_file())
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The uid and gid of `user` from /etc/passwd.
fn ids_of(user: &str) -> Option<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd").ok()?;
    passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&user)).then(|| Some((f.get(2)?.parse().ok()?, f.get(3)?.parse().ok()?)))?
    })
}

/// A TLS-only PostgreSQL on 127.0.0.1, stopped on drop.
struct Cluster {
    _dir: tempfile::TempDir,
    data: PathBuf,
    pg_ctl: PathBuf,
    as_user: Option<String>,
    port: u16,
    ca: PathBuf,
    other_ca: PathBuf,
}

impl Cluster {
    fn command(&self, program: &Path) -> Command {
        match &self.as_user {
            Some(u) => {
                let mut c = Command::new("runuser");
                c.args(["-u", u, "--"]).arg(program);
                c
            }
            None => Command::new(program),
        }
    }

    fn url(&self, host: &str) -> String {
        format!("postgres://postgres@{host}:{}/postgres", self.port)
    }

    fn start() -> Option<Cluster> {
        let (Some(initdb), Some(pg_ctl), Some(openssl)) = (program("initdb"), program("pg_ctl"), program("openssl"))
        else {
            skipped("postgres_tls: initdb, pg_ctl or openssl not found (PostgreSQL over TLS)");
            return None;
        };
        // initdb refuses to run as root: the cluster is the postgres user's then.
        let root = unsafe { libc::geteuid() } == 0;
        let owner = if root {
            match ids_of("postgres") {
                Some(ids) => Some(ids),
                None => {
                    skipped("postgres_tls: running as root without a postgres user");
                    return None;
                }
            }
        } else {
            None
        };
        let dir = tempfile::tempdir().unwrap();
        let certs = dir.path().join("certs");
        std::fs::create_dir(&certs).unwrap();
        let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
        for (name, cn) in [("ca", "paygate-test-ca"), ("other", "someone-elses-ca")] {
            run(Command::new(&openssl)
                .current_dir(&certs)
                .args(["req", "-x509"])
                .args(ec)
                .args(["-keyout", &format!("{name}.key"), "-out", &format!("{name}.crt"), "-days", "2"])
                .args(["-subj", &format!("/CN={cn}")]));
        }
        run(Command::new(&openssl).current_dir(&certs).args(["req"]).args(ec).args([
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
            "-subj",
            "/CN=localhost",
        ]));
        std::fs::write(certs.join("ext.cnf"), "subjectAltName=DNS:localhost,IP:127.0.0.1\n").unwrap();
        run(Command::new(&openssl).current_dir(&certs).args([
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-out",
            "server.crt",
            "-days",
            "2",
            "-extfile",
            "ext.cnf",
        ]));
        let data = dir.path().join("data");
        if let Some((uid, gid)) = owner {
            for p in [dir.path().to_path_buf(), certs.clone(), certs.join("server.key"), certs.join("server.crt")] {
                std::os::unix::fs::chown(&p, Some(uid), Some(gid)).unwrap();
            }
        }
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(certs.join("server.key"), std::fs::Permissions::from_mode(0o600)).unwrap();
        }
        let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
        let mut cluster = Cluster {
            data: data.clone(),
            pg_ctl,
            as_user: owner.map(|_| "postgres".to_string()),
            port,
            ca: certs.join("ca.crt"),
            other_ca: certs.join("other.crt"),
            _dir: dir,
        };
        run(cluster.command(&initdb).arg("-D").arg(&data).args(["-U", "postgres", "--auth=trust", "-E", "UTF8"]));
        let conf = format!(
            "\nport = {port}\nlisten_addresses = '127.0.0.1'\nunix_socket_directories = '{}'\nssl = on\n\
             ssl_cert_file = '{}'\nssl_key_file = '{}'\nfsync = off\n",
            data.display(),
            certs.join("server.crt").display(),
            certs.join("server.key").display()
        );
        let mut postgresql_conf = std::fs::read_to_string(data.join("postgresql.conf")).unwrap();
        postgresql_conf.push_str(&conf);
        std::fs::write(data.join("postgresql.conf"), postgresql_conf).unwrap();
        // TLS only over TCP: a connection in clear is refused by the server itself.
        std::fs::write(
            data.join("pg_hba.conf"),
            "local all all trust\nhostssl all all 127.0.0.1/32 trust\nhostnossl all all 127.0.0.1/32 reject\n",
        )
        .unwrap();
        let log = data.join("server.log");
        run(cluster
            .command(&cluster.pg_ctl.clone())
            .arg("-D")
            .arg(&data)
            .arg("-l")
            .arg(&log)
            .args(["-w", "-t", "60", "start"]));
        cluster.port = port;
        Some(cluster)
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = self.command(&self.pg_ctl).arg("-D").arg(&self.data).args(["-m", "immediate", "stop"]).output();
    }
}

fn schema() -> String {
    format!("t_{}", uuid::Uuid::new_v4().simple())
}

async fn connects(url: &str, tls: &TlsSettings) -> Result<(), String> {
    let store = PostgresStore::connect_with(url, &schema(), tls).await.map_err(|e| e.to_string())?;
    store.ping().await.map_err(|e| e.to_string())
}

#[tokio::test]
async fn the_store_reaches_postgresql_over_tls_in_each_sslmode() {
    paygate::install_crypto_provider();
    let Some(pg) = Cluster::start() else { return };
    let off = TlsSettings::default();
    let require = TlsSettings { mode: SslMode::Require, ca_file: None };
    let full = TlsSettings { mode: SslMode::VerifyFull, ca_file: Some(pg.ca.clone()) };

    // In clear: the server refuses (what every connection was before).
    let e = connects(&pg.url("localhost"), &off).await.expect_err("a connection in clear");
    assert!(e.contains("pg_hba") || e.contains("no encryption") || e.contains("rejects"), "{e}");
    // require: encrypted, certificate unchecked.
    connects(&pg.url("localhost"), &require).await.unwrap();
    // The URL's own sslmode=require is honoured (never downgraded by the config's default).
    connects(&format!("{}?sslmode=require", pg.url("localhost")), &off).await.unwrap();
    // verify-full: the certificate chains to the CA file and names the host (DNS or IP).
    connects(&pg.url("localhost"), &full).await.unwrap();
    connects(&pg.url("127.0.0.1"), &full).await.unwrap();
    // ...and is refused under another CA, under the system's roots, or for a name it does not carry.
    let other = TlsSettings { mode: SslMode::VerifyFull, ca_file: Some(pg.other_ca.clone()) };
    assert!(connects(&pg.url("localhost"), &other).await.is_err(), "another CA");
    let system = TlsSettings { mode: SslMode::VerifyFull, ca_file: None };
    assert!(connects(&pg.url("localhost"), &system).await.is_err(), "a private CA is not a system root");
    let Err(e) = PostgresStore::connect_with(&format!("{}?sslmode=verify-full", pg.url("localhost")), "s", &off).await
    else {
        panic!("a verify mode in the URL is named, not misread")
    };
    assert!(e.to_string().contains("storage.postgres_sslmode"), "{e}");
}

#[tokio::test]
async fn the_gateway_runs_on_a_tls_only_postgresql_and_doctor_says_which_tls() {
    paygate::install_crypto_provider();
    let Some(pg) = Cluster::start() else { return };
    let dir = tempfile::tempdir().unwrap();
    let ca = pg.ca.display().to_string();
    let url = pg.url("localhost");
    let schema = schema();
    let env = [
        ("PAYGATE_STORAGE__URL", url.as_str()),
        ("PAYGATE_STORAGE__POSTGRES_SCHEMA", schema.as_str()),
        ("PAYGATE_STORAGE__POSTGRES_SSLMODE", "verify-full"),
        ("PAYGATE_STORAGE__POSTGRES_SSL_CA_FILE", ca.as_str()),
    ];
    let app = spawn_on(dir.path(), &env).await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let paid = call(&c, "create_payment", json!({"operation_id": "tls-1", "from_account": "acct-A", "to_account": "acct-B", "amount": "10.00", "currency": "KES"})).await;
    ok(&paid);
    assert_eq!(balance(&c, "acct-B").await, "10.00");
    let _ = c.cancel().await;
    app.stop().await;

    let mut vars: Vec<(String, String)> = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
    vars.push(("PAYGATE_STORAGE__DATA_DIR".into(), dir.path().display().to_string()));
    let text = paygate::cli::doctor::run(None, vars).await.render();
    let store = text.lines().find(|l| l.contains("store")).unwrap_or_else(|| panic!("{text}"));
    assert!(store.starts_with('✓') && store.contains("sslmode verify-full") && store.contains(&ca), "{text}");
}
