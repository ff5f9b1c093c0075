//! Operators suspend and resume agents (as the stop rule does by itself): an agent whoever it
//! acts for, or only while it acts for one user. No one acts on themself.

use super::approvals::{OpError, Operator};
use super::reviews::reason_text;
use super::{Decision, Gateway};
use crate::catalogue::scopes;
use crate::domain::principal::{Suspension, SuspensionScope};
use crate::domain::rules::authority::{Target, acts_on_itself, reaches_itself};

/// An agent named by an operator (suspend, resume): its subject, its token issuer (default: the
/// operator's own), and the user it acts for when the action is about that pair only.
#[derive(Debug, Clone)]
pub struct PrincipalArgs {
    pub subject: String,
    pub issuer: Option<String>,
    pub user: Option<String>,
}

impl PrincipalArgs {
    fn issuer<'a>(&'a self, op: &'a Operator) -> Result<&'a str, OpError> {
        named("subject", &self.subject, crate::auth::jwt::SUBJECT_BYTES_MAX)?;
        if let Some(u) = &self.user {
            named("user", u, crate::auth::jwt::SUBJECT_BYTES_MAX)?;
        }
        match self.issuer.as_deref() {
            Some(i) => named("issuer", i, ISSUER_BYTES_MAX).map(|()| i),
            None => Ok(&op.issuer),
        }
    }

    fn describe(&self, issuer: &str) -> String {
        match &self.user {
            Some(u) => format!("subject {} (issuer {issuer}) acting for {u}", self.subject),
            None => format!("subject {} (issuer {issuer})", self.subject),
        }
    }
}

/// Longest token issuer an operator can name, in bytes.
pub const ISSUER_BYTES_MAX: usize = 512;

/// A subject, user or issuer an operator names: empty or with control characters is malformed
/// (400); longer than any token's (in UTF-8 bytes) names no agent at all (404).
fn named(field: &str, value: &str, bytes_max: usize) -> Result<(), OpError> {
    if value.is_empty() || value.chars().any(char::is_control) {
        return Err(OpError::invalid(format!("{field} must be non-empty, without control characters")));
    }
    if value.len() > bytes_max {
        // "no such agent": a token's subject, user or issuer is never this long.
        return Err(OpError::missing("agent (no token carries a name this long)"));
    }
    Ok(())
}

impl Gateway {
    /// Suspend an agent by hand (as the stop rule does by itself) until an admin resumes it: the
    /// agent whoever it acts for (`user` absent), or only while it acts for `user`. `issuer` is the
    /// agent's token issuer (default: the operator's own). No one suspends themself (nor an agent
    /// acting for them): that is a colleague's call.
    pub async fn suspend_principal(
        &self,
        op: &Operator,
        who: &PrincipalArgs,
        reason: Option<String>,
    ) -> Result<bool, OpError> {
        self.require(op, &[scopes::ADMIN])?;
        let issuer = who.issuer(op)?;
        self.not_itself(op, who)?;
        let reason = reason_text(reason)?;
        let why = format!("suspended by {}: {}", op.subject, reason.as_deref().unwrap_or("no reason given"));
        let now = self.clock.now();
        let scope = match &who.user {
            Some(u) => SuspensionScope::Pair(Some(u.clone())),
            None => SuspensionScope::Agent,
        };
        let suspension = Suspension { issuer: issuer.to_string(), subject: who.subject.clone(), scope, reason: why };
        let notify = self.suspended_notice(&suspension);
        let newly = self.store.suspend(suspension, now, notify).await.map_err(|error| {
            tracing::error!(%error, "suspend failed");
            OpError::internal()
        })?;
        let mut d = Decision::new("principals.suspend", if newly { "suspended" } else { "already_suspended" });
        d.detail = Some(who.describe(issuer));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        Ok(newly)
    }

    /// Lift an agent's suspensions (by hand or by the stop rule): every one (`user` absent), or
    /// only that of the agent acting for `user`. No one resumes themself.
    pub async fn resume_principal(&self, op: &Operator, who: &PrincipalArgs) -> Result<bool, OpError> {
        self.require(op, &[scopes::ADMIN])?;
        let issuer = who.issuer(op)?;
        self.not_itself(op, who)?;
        if who.user.is_none() {
            // Without a user the resume lifts every suspension of the agent, the pair of the agent
            // acting for this very operator included: that is acting on themself too.
            let lifted = self.store.agent_suspensions(issuer, &who.subject).await.map_err(|error| {
                tracing::error!(%error, "suspensions read failed");
                OpError::internal()
            })?;
            let users = lifted.iter().filter_map(|s| match &s.scope {
                SuspensionScope::Pair(user) => Some(user.as_deref()),
                SuspensionScope::Agent => None,
            });
            if reaches_itself(&op.subject, &who.subject, users) {
                return Err(OpError::self_review(
                    "this would lift the suspension of an agent acting for you; a colleague resumes it".into(),
                ));
            }
        }
        let resumed =
            self.store.resume(issuer, &who.subject, who.user.as_deref(), self.clock.now()).await.map_err(|error| {
                tracing::error!(%error, "resume failed");
                OpError::internal()
            })?;
        self.forget_suspended();
        let mut d = Decision::new("principals.resume", if resumed { "resumed" } else { "not_suspended" });
        d.detail = Some(who.describe(issuer));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        Ok(resumed)
    }

    fn not_itself(&self, op: &Operator, who: &PrincipalArgs) -> Result<(), OpError> {
        if acts_on_itself(&op.subject, Target { agent: &who.subject, user: who.user.as_deref() }) {
            return Err(OpError::self_review(
                "no one suspends or resumes themself, nor an agent acting for them".into(),
            ));
        }
        Ok(())
    }
}
