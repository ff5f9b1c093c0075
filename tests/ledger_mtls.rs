//! Mutual TLS to an HTTP ledger: `backend.tls_*` gives the client a private CA and a certificate.
//! A real `ledger-serve` sits behind a TLS front (rustls) that requires a client certificate from
//! the test's CA; certificates are made with `openssl` (skipped, saying so, where it is absent).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use paygate::auth::Secret;
use paygate::backend::PaymentBackend;
use paygate::backend::http::{HttpLedger, HttpLedgerConfig};
use paygate::backend::outbound::OutboundTls;
use paygate::clock::{Clock, ManualClock};
use paygate::domain::error::BackendError;
use paygate::domain::ids::{AccountId, PaymentId};
use paygate::domain::money::{Currency, Money};
use paygate::domain::payment::{AccountSeed, Attempt, Guards, TransferRequest};
use paygate::store::Store;
use paygate::store::sqlite::SqliteStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

const CREDENTIAL: &str = "ledger-credential-0123456789abcdef";

#[path = "common/wallet.rs"]
mod wallet;

fn openssl() -> Option<PathBuf> {
    let path = std::env::var("PATH").unwrap_or_default();
    path.split(':').map(|d| Path::new(d).join("openssl")).find(|p| p.is_file())
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(out.status.success(), "{cmd:?}: {}", String::from_utf8_lossy(&out.stderr));
}

/// A CA, a server certificate for 127.0.0.1, a client certificate from that CA ("client") and one
/// from another CA ("rogue"); keys 0600.
fn certificates(openssl: &Path, dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    for (name, cn) in [("ca", "ledger-test-ca"), ("other", "someone-elses-ca")] {
        run(Command::new(openssl)
            .current_dir(dir)
            .args(["req", "-x509"])
            .args(ec)
            .args(["-keyout", &format!("{name}.key"), "-out", &format!("{name}.crt"), "-days", "2"])
            .args(["-subj", &format!("/CN={cn}")]));
    }
    std::fs::write(dir.join("server.cnf"), "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n").unwrap();
    std::fs::write(dir.join("client.cnf"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (name, ca, ext) in
        [("server", "ca", "server.cnf"), ("client", "ca", "client.cnf"), ("rogue", "other", "client.cnf")]
    {
        run(Command::new(openssl).current_dir(dir).args(["req"]).args(ec).args([
            "-keyout",
            &format!("{name}.key"),
            "-out",
            &format!("{name}.csr"),
            "-subj",
            &format!("/CN={name}"),
        ]));
        run(Command::new(openssl).current_dir(dir).args(["x509", "-req", "-in", &format!("{name}.csr")]).args([
            "-CA",
            &format!("{ca}.crt"),
            "-CAkey",
            &format!("{ca}.key"),
            "-CAcreateserial",
            "-out",
            &format!("{name}.crt"),
            "-days",
            "2",
            "-extfile",
            ext,
        ]));
        private(&dir.join(format!("{name}.key")));
    }
}

fn private(path: &Path) {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600)).unwrap();
}

/// ledger-serve (plain HTTP on loopback) with acct-A holding KES 1,000.00.
async fn ledger() -> SocketAddr {
    let clock = ManualClock::new(1_750_000_000);
    let store: Arc<dyn Store> = Arc::new(SqliteStore::open_in_memory().unwrap());
    let seed = AccountSeed {
        id: AccountId::parse("acct-A").unwrap(),
        currency: Currency::parse("KES").unwrap(),
        opening_minor: 100_000,
        allow_overdraft: false,
    };
    store.ledger_open_account(seed, clock.now()).await.unwrap();
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(paygate::ledger_service::serve(
        listener,
        store,
        Arc::new(clock),
        Secret::new(CREDENTIAL.into()),
        std::future::pending(),
    ));
    addr
}

/// A TLS front for `upstream` that completes a handshake only with a client certificate from the
/// CA in `dir`; its address.
async fn tls_front(dir: &Path, upstream: SocketAddr) -> SocketAddr {
    paygate::install_crypto_provider();
    let mut roots = rustls::RootCertStore::empty();
    roots.add(CertificateDer::from_pem_file(dir.join("ca.crt")).unwrap()).unwrap();
    let verifier = rustls::server::WebPkiClientVerifier::builder(Arc::new(roots)).build().unwrap();
    let chain = vec![CertificateDer::from_pem_file(dir.join("server.crt")).unwrap()];
    let key = PrivateKeyDer::from_pem_file(dir.join("server.key")).unwrap();
    let config =
        rustls::ServerConfig::builder().with_client_cert_verifier(verifier).with_single_cert(chain, key).unwrap();
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (tcp, _) = listener.accept().await.unwrap();
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                let Ok(mut tls) = acceptor.accept(tcp).await else { return };
                let mut plain = tokio::net::TcpStream::connect(upstream).await.unwrap();
                let _ = tokio::io::copy_bidirectional(&mut tls, &mut plain).await;
            });
        }
    });
    addr
}

fn client(front: SocketAddr, tls: OutboundTls) -> HttpLedger {
    HttpLedger::new(
        HttpLedgerConfig {
            base_url: format!("https://{front}"),
            credential: Secret::new(CREDENTIAL.into()),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            retries_max: 0,
            breaker_failures_max: 100,
            breaker_open: Duration::from_secs(30),
            tls,
        },
        Arc::new(ManualClock::new(1_750_000_000)),
    )
    .unwrap()
}

fn tls(dir: &Path, ca: bool, client: Option<&str>) -> OutboundTls {
    let file = |n: String| dir.join(n).display().to_string();
    let (cert, key) = match client {
        Some(name) => (file(format!("{name}.crt")), file(format!("{name}.key"))),
        None => (String::new(), String::new()),
    };
    let ca = if ca { file("ca.crt".into()) } else { String::new() };
    OutboundTls::load(&ca, &cert, &key).unwrap()
}

#[tokio::test]
async fn a_ledger_that_requires_a_client_certificate_is_reached_with_one_and_refused_without() {
    let Some(openssl) = openssl() else {
        assert!(std::env::var_os("CI").is_none(), "ledger_mtls: openssl not found, and CI requires it");
        say("ledger_mtls: openssl not found; SKIPPED (mutual TLS to the HTTP ledger)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    certificates(&openssl, dir.path());
    let front = tls_front(dir.path(), ledger().await).await;
    let acct = AccountId::parse("acct-A").unwrap();

    let with_certificate = client(front, tls(dir.path(), true, Some("client")));
    let balance = with_certificate.balance(&acct).await.unwrap().unwrap();
    assert_eq!(balance.balance_minor, 100_000, "the handshake with a client certificate reaches the ledger");

    for (what, tls) in [
        ("no client certificate", tls(dir.path(), true, None)),
        ("a certificate from another CA", tls(dir.path(), true, Some("rogue"))),
    ] {
        let e = client(front, tls).balance(&acct).await.unwrap_err().to_string();
        eprintln!("{what}: {e}");
        assert!(e.contains("client certificate"), "{what}: the error names the client certificate: {e}");
    }
    // A payment refused at the handshake was never read: unavailable (safe to send again), never an
    // unknown outcome.
    let request = TransferRequest {
        attempt: Attempt::reserved("mtls-key-1"),
        payment_id: PaymentId::generate(),
        from_account: acct.clone(),
        to_account: AccountId::parse("acct-B").unwrap(),
        amount: Money::from_minor(100, Currency::parse("KES").unwrap()).unwrap(),
        memo: None,
        principal_sub: "agent-1".into(),
        principal_user: None,
        guards: Guards::default(),
    };
    let refused = client(front, tls(dir.path(), true, None)).transfer(request).await.unwrap_err();
    assert!(matches!(refused, BackendError::Unavailable(_)), "{refused:?}");
    // Without the private CA the ledger's own certificate is not trusted (the system's roots).
    let e = client(front, tls(dir.path(), false, Some("client"))).balance(&acct).await.unwrap_err().to_string();
    eprintln!("no private CA: {e}");
    assert!(e.contains("tls_ca_file"), "the error names the CA setting: {e}");
}

#[test]
fn a_client_key_others_can_read_is_refused_and_a_certificate_needs_its_key() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (dir.path().join("c.crt"), dir.path().join("c.key"));
    std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\n-----END CERTIFICATE-----\n").unwrap();
    std::fs::write(&key, "-----BEGIN PRIVATE KEY-----\n-----END PRIVATE KEY-----\n").unwrap();
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let (c, k) = (cert.display().to_string(), key.display().to_string());
    let e = OutboundTls::load("", &c, &k).unwrap_err();
    assert!(e.contains("readable by others") && e.contains("chmod 600"), "{e}");
    assert!(OutboundTls::load("", &c, "").unwrap_err().contains("go together"));
    assert!(OutboundTls::load("", "", &k).unwrap_err().contains("go together"));
    assert!(
        OutboundTls::load(&dir.path().join("absent.crt").display().to_string(), "", "")
            .unwrap_err()
            .contains("tls_ca_file")
    );
    private(&key);
    let loaded = OutboundTls::load("", &c, &k).unwrap();
    assert!(!format!("{loaded:?}").contains("PRIVATE KEY"), "the key never prints");
}

/// The wallet service behind the same TLS front: the `backend.tls_*` options apply to its client
/// too. With the client certificate a payment goes through; without it the handshake is refused,
/// the payment is unavailable (never unknown) and the service received nothing.
#[tokio::test]
async fn the_wallet_service_is_reached_over_the_same_mutual_tls() {
    let Some(openssl) = openssl() else {
        assert!(std::env::var_os("CI").is_none(), "ledger_mtls: openssl not found, and CI requires it");
        say("ledger_mtls: openssl not found; SKIPPED (mutual TLS to the wallet service)");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    certificates(&openssl, dir.path());
    let fake = wallet::WalletFake::start().await;
    let front = tls_front(dir.path(), fake.addr).await;
    let wallet_client = |tls: OutboundTls| {
        let accounts = wallet::ACCOUNTS
            .iter()
            .map(|(id, uuid, _)| {
                (AccountId::parse(id).unwrap(), paygate::backend::wallet::WalletAccount::parse(uuid).unwrap())
            })
            .collect();
        let transport = HttpLedgerConfig {
            base_url: format!("https://{front}"),
            credential: Secret::new(String::new()),
            connect_timeout: Duration::from_secs(2),
            request_timeout: Duration::from_secs(5),
            retries_max: 0,
            breaker_failures_max: 100,
            breaker_open: Duration::from_secs(30),
            tls,
        };
        let cfg = paygate::backend::wallet::WalletConfig { transport, merchant_id: wallet::MERCHANT.into(), accounts };
        paygate::backend::wallet::WalletService::new(cfg, Arc::new(ManualClock::new(1_750_000_000))).unwrap()
    };
    let request = || TransferRequest {
        attempt: Attempt::reserved("mtls-wallet-1"),
        payment_id: PaymentId::generate(),
        from_account: AccountId::parse("acct-A").unwrap(),
        to_account: AccountId::parse("acct-B").unwrap(),
        amount: Money::from_minor(100, Currency::parse("KES").unwrap()).unwrap(),
        memo: None,
        principal_sub: "agent-1".into(),
        principal_user: None,
        guards: Guards::default(),
    };
    let refused = wallet_client(tls(dir.path(), true, None)).transfer(request()).await.unwrap_err();
    assert!(matches!(refused, BackendError::Unavailable(_)), "{refused:?}");
    assert_eq!(fake.payment_posts(), 0, "nothing reached the service");
    let paid = wallet_client(tls(dir.path(), true, Some("client"))).transfer(request()).await.unwrap();
    assert_eq!(paid.amount_minor, 100);
    assert_eq!((fake.payments().len(), fake.balance("acct-B")), (1, 100));
}

#[path = "common/say.rs"]
mod say;
use say::say;
