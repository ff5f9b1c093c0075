//! Resource-server authentication: bearer JWT verification and the principals it yields.
//!
//! Architecture Invariant: paygate never issues agent tokens in production (the dev key is for local
//! use only) and never forwards an agent's token anywhere.

pub mod jwks;
pub mod jwt;

use std::collections::BTreeSet;
use std::sync::Arc;

pub use jwt::{AuthError, Verifier, mint_dev_token};
// Re-exported: the scope vocabulary and secrets are used by auth but live with the tool catalogue
// and in their own module.
pub use crate::catalogue::scopes;
pub use crate::secret::Secret;

use crate::policy::Profile;

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
