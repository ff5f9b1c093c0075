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

    /// Whether this principal may see (and so refund) `payment`: it touches one of the profile's
    /// accounts, and it was made for the person this agent acts for (`rules::authority::sees`).
    /// What it may not see does not exist for it (NOT_FOUND).
    pub fn sees(&self, payment: &crate::domain::payment::Payment) -> bool {
        payment.touches_any(&self.profile.allowed_accounts)
            && crate::domain::rules::authority::sees(self.user.as_deref(), payment.principal_user.as_deref())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::clock::{Clock, ManualClock};

    const ISSUER: &str = "https://dev.example";
    const AGENT: &str = "https://pay.example/mcp";
    const OPERATOR: &str = "https://pay.example/operator";
    const NOW: i64 = 1_800_000_000;

    fn auth(legacy_agent_admin_scope: bool) -> (AgentAuth, Secret) {
        let key = Secret::new("agent-auth-test-key-0123456789".into());
        let clock: Arc<dyn Clock> = Arc::new(ManualClock::new(NOW));
        let verifier =
            Verifier::new(AGENT.into(), OPERATOR.into(), 0, clock).with_dev_key(ISSUER.into(), &key).unwrap();
        (AgentAuth { verifier: Arc::new(verifier), legacy_agent_admin_scope }, key)
    }

    fn token(key: &Secret, audience: &str, sub: &str, actor: Option<&str>, scope: &str) -> String {
        DevToken { issuer: ISSUER, audience, subject: sub, scope, actor, now: NOW, ttl_secs: 600 }.mint(key).unwrap()
    }

    async fn principal(auth: &AgentAuth, token: &str) -> Result<AgentPrincipal, AuthError> {
        auth.principal(token, Arc::new(LivePolicy::none())).await
    }

    #[tokio::test]
    async fn an_agent_token_becomes_its_principal_and_nothing_else_does() {
        let (auth, key) = auth(false);
        let p = principal(&auth, &token(&key, AGENT, "bot", None, "payments:read")).await.unwrap();
        assert_eq!((p.issuer.as_str(), p.subject.as_str(), p.user.as_deref()), (ISSUER, "bot", None));
        assert!(p.has_scope("payments:read") && !p.has_scope("payments:create"));
        // Delegation: the actor is the agent, the token's subject the user it acts for.
        let p = principal(&auth, &token(&key, AGENT, "alice", Some("bot"), "payments:read")).await.unwrap();
        assert_eq!((p.subject.as_str(), p.user.as_deref()), ("bot", Some("alice")));

        let operator = token(&key, OPERATOR, "alice", None, "payments:approve");
        assert_eq!(
            principal(&auth, &operator).await.unwrap_err(),
            AuthError::Invalid("token audience is not this resource")
        );
        let persons = token(&key, AGENT, "alice", None, "payments:read payments:confirm");
        let refused = principal(&auth, &persons).await.unwrap_err();
        assert!(matches!(refused, AuthError::Invalid(r) if r.contains("payments:confirm")), "{refused:?}");
    }

    #[tokio::test]
    async fn the_legacy_admin_scope_reads_as_integrity_only_with_the_switch_on() {
        for on in [false, true] {
            let (auth, key) = auth(on);
            let p = principal(&auth, &token(&key, AGENT, "bot", None, "payments:admin")).await.unwrap();
            assert_eq!(p.has_scope(scopes::INTEGRITY), on);
            assert_eq!(p.has_scope(scopes::LEGACY_AGENT_ADMIN), !on);
        }
    }
}
