//! Resource-server authentication: bearer JWT verification and the principals it yields.
//!
//! Architecture Invariant: paygate never issues agent tokens in production (the dev key is for local
//! use only) and never forwards an agent's token anywhere.

pub mod jwks;
pub mod jwt;

use std::collections::BTreeSet;
use std::sync::Arc;

pub use jwt::{AuthError, DevToken, VerifiedClaims, Verifier, mint_dev_token};
// Re-exported: the scope vocabulary and secrets are used by auth but live with the tool catalogue
// and in their own module.
pub use crate::catalogue::scopes;
pub use crate::secret::Secret;

use crate::domain::policy::Profile;
use crate::domain::policy_doc::LivePolicy;

/// The two protected resources, each with its own resource identifier, RFC 9728 document and
/// scopes. A token is accepted only by the resource its `aud` names (RFC 8707), and a token naming
/// both is accepted by neither: an agent's token never carries operator power.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Audience {
    /// `<public_url>/mcp`: agents, through MCP.
    Agent,
    /// `<public_url>/operator`: people, through the approval routes, `/operator/v1`, `/principals`
    /// and the console.
    Operator,
}

/// Who is calling /mcp: resolved from a verified agent-audience token on every request.
///
/// With delegation (RFC 8693: the token's `sub` is a user and its `act.sub` the agent acting for
/// them) the principal is the pair: `subject` is the agent and `user` the person. Everything the
/// gateway keys on a principal (idempotency keys, budgets, the stop rule, suspension, sessions,
/// rate limits, approvals) is keyed on (issuer, subject, user).
#[derive(Debug, Clone)]
pub struct AgentPrincipal {
    pub issuer: String,
    /// The agent: the token's `act.sub` when it acts for a user, else its `sub`.
    pub subject: String,
    /// The user the agent acts for (the delegated token's `sub`); `None` for an agent acting on
    /// its own token.
    pub user: Option<String>,
    pub client_id: Option<String>,
    pub scopes: BTreeSet<String>,
    pub profile: Arc<Profile>,
    /// The policy version the profile was resolved under (and its tool governance): one per
    /// request, so a call is judged under one version however it is changed meanwhile.
    pub policy: Arc<crate::domain::policy_doc::LivePolicy>,
}

impl AgentPrincipal {
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.contains(scope)
    }

    /// One string per (issuer, subject, user), for in-process maps (sessions, rate limits, held
    /// retries). Never stored; the parts are length-prefixed, so no two principals share one.
    pub fn key(&self) -> String {
        principal_key(&self.issuer, &self.subject, self.user.as_deref())
    }

    /// The principal as records are keyed on it.
    pub fn principal_ref(&self) -> crate::domain::principal::PrincipalRef {
        crate::domain::principal::PrincipalRef {
            issuer: self.issuer.clone(),
            subject: self.subject.clone(),
            user: self.user.clone(),
        }
    }

    /// The subject its budgets and known payees are kept under (`domain::principal::usage_subject`).
    pub fn usage_subject(&self) -> String {
        crate::domain::principal::usage_subject(&self.subject, self.user.as_deref())
    }

    /// How the principal is named to people: `agent`, or `agent for user`.
    pub fn display(&self) -> String {
        match &self.user {
            Some(u) => format!("{} for {u}", self.subject),
            None => self.subject.clone(),
        }
    }
}

/// How a bearer token becomes the agent calling: one path for every edge that serves agents (the
/// /mcp auth layer on each request, `paygate stdio` at start and on each request), so a token is
/// judged alike however it arrives.
#[derive(Clone)]
pub struct AgentAuth {
    pub verifier: Arc<Verifier>,
    /// The migration switch: an identity provider still granting agents the old admin scope.
    pub legacy_agent_admin_scope: bool,
}

impl AgentAuth {
    /// Verify `token` for the agent audience (signature, issuer, audience = the MCP resource and
    /// not the operator's, exp/nbf) and resolve the agent under `policy`, the version in force:
    /// with `act`, the actor acting for the token's subject; its profile matched on the agent, the
    /// user, or both. An operator's token fails the audience check.
    pub async fn principal(&self, token: &str, policy: Arc<LivePolicy>) -> Result<AgentPrincipal, AuthError> {
        let claims = self.verifier.verify(token, Audience::Agent).await?;
        if claims.scopes.contains(scopes::CONFIRM) {
            // A token a person confirms payments with is theirs, never an agent's: an agent holding
            // one could approve its own requests.
            return Err(AuthError::Invalid(
                "a token with payments:confirm is a person's and cannot be used by an agent",
            ));
        }
        let (subject, user) = match claims.actor {
            Some(actor) => (actor, Some(claims.subject)),
            None => (claims.subject, None),
        };
        let mut granted = claims.scopes;
        if self.legacy_agent_admin_scope && granted.remove(scopes::LEGACY_AGENT_ADMIN) {
            granted.insert(scopes::INTEGRITY.to_string());
        }
        let profile = policy.profiles.resolve(&claims.issuer, &subject, user.as_deref(), claims.client_id.as_deref());
        Ok(AgentPrincipal {
            issuer: claims.issuer,
            subject,
            user,
            client_id: claims.client_id,
            scopes: granted,
            profile,
            policy,
        })
    }
}

/// See [`AgentPrincipal::key`].
pub fn principal_key(issuer: &str, subject: &str, user: Option<&str>) -> String {
    let mut key = format!("{}:{issuer}{}:{subject}", issuer.len(), subject.len());
    if let Some(u) = user {
        key.push_str(&format!("{}:{u}", u.len()));
    }
    key
}
