//! Approvals: the human side. Operators list, approve and reject; enough distinct approvals turn
//! an approval into a signed mandate; the requesting agent fetches it with `get_approval`.
//!
//! State machine: pending → approved | rejected | expired. Terminal states never change
//! (`Store::approval_review` runs it in one transaction).

use std::collections::BTreeSet;

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use super::{Caller, Decision, Gateway};
use crate::clock::{UnixSecs, rfc3339};
use crate::domain::approval::ApprovalRecord;
use crate::domain::approval::{ApprovalStatus, Approver, ReviewDecision};
use crate::domain::ids::ApprovalId;
use crate::domain::money::format_minor;
use crate::error::{AgentError, ErrorCode};
use crate::mandate::MandateKind;
use crate::request_state::{ApprovalState, Binding, OpenError};

/// An authenticated human operator (approver, auditor, admin).
#[derive(Debug, Clone)]
pub struct Operator {
    pub issuer: String,
    pub subject: String,
    pub scopes: BTreeSet<String>,
    pub correlation_id: String,
}

/// Operator-side refusals: an [`ErrorCode`] and a sentence; the HTTP layer answers
/// `code.http_status()` (one table for every code).
#[derive(Debug, thiserror::Error)]
#[error("{message}")]
pub struct OpError {
    pub code: ErrorCode,
    pub message: String,
}

impl OpError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        OpError { code, message: message.into() }
    }
    pub fn invalid(message: String) -> Self {
        OpError::new(ErrorCode::InvalidArgument, message)
    }
    /// The input itself was refused (a command line exits 2, as for a usage error).
    pub fn is_invalid_argument(&self) -> bool {
        self.code == ErrorCode::InvalidArgument
    }
    pub fn forbidden(scope: &'static str) -> Self {
        OpError::new(ErrorCode::InsufficientScope, format!("this operator lacks scope {scope}"))
    }
    pub fn self_review(message: String) -> Self {
        OpError::new(ErrorCode::SelfReview, message)
    }
    pub fn not_found() -> Self {
        OpError::new(ErrorCode::NotFound, "no such approval")
    }
    /// No such payment, mandate, … (what is named).
    pub fn missing(what: &'static str) -> Self {
        OpError::new(ErrorCode::NotFound, format!("no such {what}"))
    }
    pub fn conflict(message: String) -> Self {
        OpError::new(ErrorCode::Conflict, message)
    }
    pub fn gone(message: String) -> Self {
        OpError::new(ErrorCode::Expired, message)
    }
    /// A person confirming an approval that is not theirs to confirm (an operator's to decide).
    pub fn not_the_user(message: String) -> Self {
        OpError::new(ErrorCode::NotUserApprovable, message)
    }
    pub fn internal() -> Self {
        OpError::new(ErrorCode::Internal, "internal error")
    }
}

/// An agent-side refusal met on the operators' side (a cursor, a page limit, a time window): the
/// same code and sentence.
impl From<AgentError> for OpError {
    fn from(e: AgentError) -> Self {
        OpError { code: e.code, message: e.message }
    }
}

/// An approval as operators and the requesting agent see it.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct ApprovalView {
    pub approval_id: String,
    /// pending | approved | rejected | expired
    pub status: String,
    /// closed (one payment) | open (a standing mandate with constraints)
    pub kind: String,
    pub tool: String,
    pub agent_subject: String,
    /// The user the agent acts for (RFC 8693 delegation), if it does.
    pub user: Option<String>,
    pub requested_by: String,
    /// What was asked for, exactly as it will be pinned.
    pub intent: Value,
    pub amount: String,
    pub currency: String,
    pub reason: String,
    pub reviewers_required: i64,
    pub approved_by: Vec<String>,
    pub rejected_by: Option<String>,
    pub decision_reason: Option<String>,
    pub created_at: String,
    pub expires_at: String,
    pub decided_at: Option<String>,
    pub approval_url: String,
    /// operator | user: whether the user the agent acts for may confirm it themselves.
    pub approver: String,
    pub mandate_id: Option<String>,
    /// The signed mandate: only to the agent it was issued to, once approved.
    pub mandate: Option<String>,
    /// Deciding it needs a passkey assertion (its agent's profile or its amount tier).
    pub passkey_required: bool,
    /// While pending: what a passkey signs to approve or reject it (the challenge is the SHA-256
    /// of the exact text).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub passkey_payloads: Option<super::passkeys::PasskeyPayloads>,
}

/// Longest a sealed `requestState` stays valid, in seconds (a fresh one is sealed every round;
/// never past the approval's own expiry).
pub const REQUEST_STATE_TTL_SECS: i64 = 900;

/// Retries of one agent held waiting for a decision at once (on this replica); past it a retry
/// answers at once instead of waiting, so an agent cannot pin down the server with held calls.
pub const DECISION_WAITS_PER_AGENT_MAX: usize = 4;

/// One held retry of an agent; released when dropped.
pub struct DecisionWait<'a> {
    gateway: &'a Gateway,
    agent: String,
}

impl Drop for DecisionWait<'_> {
    fn drop(&mut self) {
        let mut waits = self.gateway.decision_waits.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(n) = waits.get_mut(&self.agent) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                waits.remove(&self.agent);
            }
        }
    }
}

/// Where an agent's own approval stands, for resuming the call that asked for it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resume {
    Pending {
        expires_at: UnixSecs,
        approver: Approver,
    },
    /// Approved: the closed mandate it issued, to pay under (it never leaves the server).
    Approved {
        mandate: String,
    },
    /// Rejected, expired, or approved without a mandate to use: the call itself says what holds.
    Closed,
}

/// Whether `a` is this principal's own approval: the same agent, under the same issuer, acting for
/// the same user (or on its own). Anyone else's does not exist for it.
pub(super) fn owns(p: &crate::auth::AgentPrincipal, a: &ApprovalRecord) -> bool {
    a.principal_sub == p.subject && a.principal_iss == p.issuer && a.principal_user == p.user
}

pub(super) fn decision_key(id: &ApprovalId) -> String {
    // Idempotency keys start with "idk_": no waiter key of theirs can equal this.
    format!("decision/{id}")
}

impl Gateway {
    pub(super) fn view(&self, a: &ApprovalRecord, now: UnixSecs, with_mandate: bool) -> ApprovalView {
        let status = a.status_at(now).as_str().to_string();
        ApprovalView {
            approval_id: a.id.to_string(),
            status,
            kind: a.kind.as_str().into(),
            tool: a.tool.clone(),
            agent_subject: a.principal_sub.clone(),
            user: a.principal_user.clone(),
            requested_by: a.requested_by.clone(),
            intent: a.intent.clone(),
            amount: format_minor(a.amount_minor, a.currency),
            currency: a.currency.to_string(),
            reason: a.reason.clone(),
            reviewers_required: a.reviewers_required,
            approved_by: a
                .reviews
                .iter()
                .filter(|r| r.decision == ReviewDecision::Approve)
                .map(|r| r.reviewer_sub.clone())
                .collect(),
            rejected_by: a
                .reviews
                .iter()
                .find(|r| r.decision == ReviewDecision::Reject)
                .map(|r| r.reviewer_sub.clone()),
            decision_reason: a.decision_reason.clone(),
            created_at: rfc3339(a.created_at),
            expires_at: rfc3339(a.expires_at),
            decided_at: a.decided_at.map(rfc3339),
            approval_url: self.approval_url(&a.id),
            approver: a.approver.as_str().into(),
            mandate_id: a.mandate_id.clone(),
            mandate: if with_mandate { a.mandate.clone() } else { None },
            passkey_required: a.passkey_required,
            passkey_payloads: self.passkey_payloads(a, now),
        }
    }

    /// The agent's view of its own approval, with the mandate once approved.
    pub async fn get_approval(&self, caller: &Caller, approval_id: &str) -> Result<ApprovalView, AgentError> {
        let id = ApprovalId::parse(approval_id)?;
        let p = &caller.principal;
        match self.store.approval_get(&id).await {
            Ok(Some(a)) if owns(p, &a) => Ok(self.view(&a, self.clock.now(), true)),
            // Someone else's approval does not exist for this agent.
            Ok(_) => Err(AgentError::new(ErrorCode::NotFound, format!("approval {id} does not exist"))),
            Err(error) => {
                tracing::error!(correlation_id = %caller.correlation_id, %error, "approval read failed");
                Err(AgentError::internal())
            }
        }
    }

    /// Where the caller's approval for `tool` stands. Another agent's approval, or one asked for by
    /// another tool, does not exist for this call.
    pub async fn resume_approval(&self, caller: &Caller, tool: &str, approval_id: &str) -> Result<Resume, AgentError> {
        let id = ApprovalId::parse(approval_id)?;
        let p = &caller.principal;
        let now = self.clock.now();
        match self.store.approval_get(&id).await {
            Ok(Some(a)) if owns(p, &a) && a.tool == tool => Ok(match (a.status_at(now), a.mandate) {
                (ApprovalStatus::Pending, _) => Resume::Pending { expires_at: a.expires_at, approver: a.approver },
                (ApprovalStatus::Approved, Some(mandate)) if a.kind == MandateKind::Closed => {
                    Resume::Approved { mandate }
                }
                _ => Resume::Closed,
            }),
            Ok(_) => Err(AgentError::new(ErrorCode::NotFound, format!("approval {id} does not exist"))),
            Err(error) => {
                tracing::error!(correlation_id = %caller.correlation_id, %error, "approval read failed");
                Err(AgentError::internal())
            }
        }
    }

    /// Wait (at most `wait`) until the approval is no longer pending; whether it is not. Woken at
    /// once by a decision on this replica; one on another is seen by re-reading the store every
    /// `poll`. An approval that cannot be read counts as decided (the caller's next read says why).
    pub async fn await_decision(
        &self,
        approval_id: &str,
        wait: std::time::Duration,
        poll: std::time::Duration,
    ) -> bool {
        let Ok(id) = ApprovalId::parse(approval_id) else { return true };
        let key = decision_key(&id);
        let deadline = tokio::time::Instant::now() + wait;
        let decided = loop {
            let notify = self.waiter(&key);
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.store.approval_get(&id).await {
                Ok(Some(a)) if a.status_at(self.clock.now()) == ApprovalStatus::Pending => {}
                _ => break true,
            }
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                break false;
            }
            let _ = tokio::time::timeout(left.min(poll), notified).await;
        };
        // An approval that expires undecided is never woken: its entry must not outlive its waiters.
        self.unwait(&key);
        decided
    }

    /// Count one more URL-elicitation round answered for this approval: `false` once
    /// `approvals.elicitation_rounds_max` were (the call then answers APPROVAL_REQUIRED as usual).
    pub async fn elicitation_round(&self, caller: &Caller, approval_id: &str) -> Result<bool, AgentError> {
        let id = ApprovalId::parse(approval_id)?;
        let max = i64::from(self.limits.elicitation_rounds_max);
        match self.store.approval_elicitation_round(&id, max).await {
            Ok(counted) => Ok(counted.is_some()),
            Err(error) => {
                tracing::error!(correlation_id = %caller.correlation_id, %error, "elicitation round count failed");
                Err(AgentError::internal())
            }
        }
    }

    /// A slot for holding one of this agent's retries while its approval is pending, unless it
    /// already has [`DECISION_WAITS_PER_AGENT_MAX`] held.
    pub fn decision_wait(&self, caller: &Caller) -> Option<DecisionWait<'_>> {
        let agent = caller.principal.key();
        let mut waits = self.decision_waits.lock().unwrap_or_else(|p| p.into_inner());
        let n = waits.entry(agent.clone()).or_default();
        if *n >= DECISION_WAITS_PER_AGENT_MAX {
            return None;
        }
        *n += 1;
        Some(DecisionWait { gateway: self, agent })
    }

    /// Refuse a `requestState` that did not open, and audit it (a forged or borrowed state is an
    /// attack on the approval, worth a line in the trail). Nothing moved.
    pub async fn refuse_state(&self, caller: &Caller, tool: &str, why: OpenError) -> AgentError {
        let e = AgentError::invalid(
            "requestState is not valid for this call (altered, expired, or sealed for another agent or call); \
             nothing moved",
        )
        .with_detail("request_state", "invalid")
        .with_detail(
            "suggested_action",
            "Call again with the same operation_id and arguments, without requestState. Do not use a new operation_id.",
        );
        let mut d = Decision::new(tool, "denied");
        d.code = Some(e.code);
        d.detail = Some(format!("requestState refused: {why}"));
        self.audit(caller, d).await;
        e
    }

    /// Seal a `requestState` for this call (see [`crate::request_state`]).
    pub fn seal_state(&self, binding: &Binding<'_>, approval_id: &str, expires_at: UnixSecs, round: u32) -> String {
        let exp = expires_at.min(self.clock.now() + REQUEST_STATE_TTL_SECS);
        self.states.seal(binding, &ApprovalState { apr: approval_id.to_string(), exp, n: round })
    }

    /// Open a `requestState` presented with this call.
    pub fn open_state(&self, binding: &Binding<'_>, sealed: &str) -> Result<ApprovalState, OpenError> {
        self.states.open(binding, sealed, self.clock.now())
    }
}
