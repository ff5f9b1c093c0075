//! PostgreSQL over TLS (rustls, through tokio-postgres-rustls): a managed PostgreSQL requires it,
//! and the store's traffic (payments, memos, issued mandates) must not cross a network in clear.
//!
//! `storage.postgres_sslmode`, as libpq names them:
//! - `disable`: no TLS (unless the URL itself says `sslmode=require`: the URL is never downgraded);
//! - `require`: TLS, the server's certificate not checked (encrypted against a passive listener,
//!   libpq's meaning of `require`);
//! - `verify-full`: TLS, the certificate checked against `storage.postgres_ssl_ca_file` (or the
//!   system's roots) and the host name against it.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::domain::error::StoreError;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SslMode {
    Disable,
    Require,
    VerifyFull,
}

impl SslMode {
    pub fn parse(s: &str) -> Option<SslMode> {
        match s {
            "disable" => Some(SslMode::Disable),
            "require" => Some(SslMode::Require),
            "verify-full" => Some(SslMode::VerifyFull),
            _ => None,
        }
    }

    pub fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Require => "require",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// How the store reaches PostgreSQL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: SslMode,
    /// PEM CA certificates for `verify-full`; `None`: the system's roots.
    pub ca_file: Option<PathBuf>,
}

impl Default for TlsSettings {
    fn default() -> Self {
        TlsSettings { mode: SslMode::Disable, ca_file: None }
    }
}

impl TlsSettings {
    /// What is in force for a connection URL: the configured mode, or TLS without checks when the
    /// URL itself asks for it (`sslmode=require`) and the config says nothing stronger.
    pub fn effective(&self, cfg: &tokio_postgres::Config) -> SslMode {
        match (self.mode, cfg.get_ssl_mode()) {
            (SslMode::Disable, tokio_postgres::config::SslMode::Require) => SslMode::Require,
            (mode, _) => mode,
        }
    }

    /// One line for `paygate doctor` and the start-up log.
    pub fn describe(&self, cfg: &tokio_postgres::Config) -> String {
        match (self.effective(cfg), &self.ca_file) {
            (SslMode::Disable, _) => "TLS off (sslmode disable)".into(),
            (SslMode::Require, _) => "TLS on, certificate not checked (sslmode require)".into(),
            (SslMode::VerifyFull, Some(ca)) => {
                format!("TLS on, certificate and host checked against {} (sslmode verify-full)", ca.display())
            }
            (SslMode::VerifyFull, None) => {
                "TLS on, certificate and host checked against the system's roots (sslmode verify-full)".into()
            }
        }
    }
}

/// A URL's `sslmode` that tokio-postgres cannot read: said plainly rather than as a parse error.
pub fn check_url(url: &str) -> Result<(), StoreError> {
    if url.contains("sslmode=verify-") {
        return Err(StoreError::Database(
            "sslmode=verify-ca/verify-full in storage.url: set storage.postgres_sslmode = \"verify-full\" (and \
             storage.postgres_ssl_ca_file) instead"
                .into(),
        ));
    }
    Ok(())
}

/// The rustls connector for `mode` (`None`: no TLS).
pub fn connector(
    mode: SslMode,
    ca_file: Option<&Path>,
) -> Result<Option<tokio_postgres_rustls::MakeRustlsConnect>, StoreError> {
    let bad = |e: String| StoreError::Database(format!("PostgreSQL TLS: {e}"));
    let config = match mode {
        SslMode::Disable => return Ok(None),
        SslMode::Require => {
            let provider = rustls::crypto::CryptoProvider::get_default()
                .cloned()
                .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
            rustls::ClientConfig::builder()
                .dangerous()
                .with_custom_certificate_verifier(Arc::new(Unchecked(provider)))
                .with_no_client_auth()
        }
        SslMode::VerifyFull => {
            let mut roots = rustls::RootCertStore::empty();
            match ca_file {
                Some(path) => {
                    use rustls::pki_types::pem::PemObject;
                    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
                        .and_then(|it| it.collect())
                        .map_err(|e| bad(format!("{}: {e}", path.display())))?;
                    if certs.is_empty() {
                        return Err(bad(format!("{} holds no certificate", path.display())));
                    }
                    for c in certs {
                        roots.add(c).map_err(|e| bad(format!("{}: {e}", path.display())))?;
                    }
                }
                None => {
                    let found = rustls_native_certs::load_native_certs();
                    for c in found.certs {
                        let _ = roots.add(c);
                    }
                    if roots.is_empty() {
                        return Err(bad("no system root certificates found; set storage.postgres_ssl_ca_file".into()));
                    }
                }
            }
            rustls::ClientConfig::builder().with_root_certificates(roots).with_no_client_auth()
        }
    };
    Ok(Some(tokio_postgres_rustls::MakeRustlsConnect::new(config)))
}

/// `sslmode = require`: the handshake's signatures are still checked, the certificate is not.
#[derive(Debug)]
struct Unchecked(Arc<rustls::crypto::CryptoProvider>);

impl ServerCertVerifier for Unchecked {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls12_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.0.signature_verification_algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.signature_verification_algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_url_is_never_downgraded_and_verify_modes_are_named() {
        let url = |u: &str| u.parse::<tokio_postgres::Config>().unwrap();
        let off = TlsSettings::default();
        assert_eq!(off.effective(&url("postgres://u@h/db")), SslMode::Disable);
        assert_eq!(off.effective(&url("postgres://u@h/db?sslmode=require")), SslMode::Require);
        let full = TlsSettings { mode: SslMode::VerifyFull, ca_file: None };
        assert_eq!(full.effective(&url("postgres://u@h/db?sslmode=disable")), SslMode::VerifyFull);
        assert!(check_url("postgres://u@h/db?sslmode=verify-full").is_err());
        assert!(check_url("postgres://u@h/db?sslmode=require").is_ok());
        for m in ["disable", "require", "verify-full"] {
            assert_eq!(SslMode::parse(m).map(SslMode::as_str), Some(m));
        }
        assert_eq!(SslMode::parse("prefer"), None);
    }
}
