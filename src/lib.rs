//! paygate: a remote MCP server that lets hosted AI agents move money exactly once, within a
//! human-set policy. See ARCHITECTURE.md for the code map and the invariants.

pub mod app;
pub mod audit_archive;
pub mod audit_chain;
pub mod auth;
pub mod backend;
pub mod catalogue;
pub mod cli;
pub mod clock;
pub mod config;
pub mod domain;
pub mod error;
pub mod gateway;
pub mod http;
pub mod idempotency;
pub mod jobs;
pub mod ledger_service;
pub mod logging;
pub mod mcp;
pub mod private_fs;
pub mod request_state;
pub mod secret;
pub mod store;
pub mod telemetry;
pub mod webhooks;

/// Install rustls' ring provider for outbound HTTPS (JWKS). Idempotent; called at start.
pub fn install_crypto_provider() {
    let _ = rustls::crypto::ring::default_provider().install_default();
}
pub mod mandate;
pub mod metrics;
pub mod passkey;
pub mod rate;
