//! Resource-server authentication: bearer JWT verification and the principals it yields.
//!
//! Architecture Invariant: paygate never issues agent tokens in production (the dev key is for local
//! use only) and never forwards an agent's token anywhere.

pub mod jwks;
pub mod jwt;

use std::collections::BTreeSet;
use std::sync::Arc;

use serde::Deserialize;

pub use jwt::{AuthError, Verifier, mint_dev_token};

use crate::policy::Profile;

/// A secret string whose `Debug` and `Display` never show it.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(String);

impl Secret {
    pub fn new(s: String) -> Self {
        Secret(s)
    }
    /// The only way to read it. Call sites are few and greppable.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

/// Who is calling: resolved from a verified token on every request.
#[derive(Debug, Clone)]
pub struct AgentPrincipal {
    pub issuer: String,
    pub subject: String,
    pub client_id: Option<String>,
    pub scopes: BTreeSet<String>,
    pub profile: Arc<Profile>,
}

impl AgentPrincipal {
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.contains(scope)
    }
}

pub mod scopes {
    pub const READ: &str = "payments:read";
    pub const CREATE: &str = "payments:create";
    pub const REFUND: &str = "payments:refund";
    pub const COLLECT: &str = "payments:collect";
    pub const ADMIN: &str = "payments:admin";
    pub const APPROVE: &str = "payments:approve";
    pub const AUDIT: &str = "payments:audit";
    /// Every scope an agent token can carry, for the RFC 9728 document.
    pub const AGENT_SCOPES: &[&str] = &[READ, CREATE, REFUND, COLLECT, ADMIN];
}
