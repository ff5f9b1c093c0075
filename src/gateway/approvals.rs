//! Approvals: the human side. Operators list, approve and reject; enough distinct approvals turn
//! an approval into a signed mandate; the requesting agent fetches it with `get_approval`.
//!
//! State machine: pending → approved | rejected | expired. Terminal states never change
//! (`Store::approval_review` runs it in one transaction).

use std::collections::BTreeSet;
use std::sync::Arc;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{Caller, Decision, Gateway, decode_cursor, encode_cursor};
use crate::catalogue::scopes;
use crate::clock::{UnixSecs, rfc3339};
use crate::domain::approval::{ApprovalStatus, Approver, ReviewDecision};
use crate::domain::principal::{SuspensionScope, valid_subject};
use crate::domain::rules::authority::{Target, acts_on_itself};
use crate::error::{AgentError, ErrorCode};
use crate::ids::{AccountId, ApprovalId};
use crate::mandate::{MANDATE_ISSUER, MandateClaims, MandateKeys, MandateKind};
use crate::money::{Currency, Money, format_minor};
use crate::request_state::{ApprovalState, Binding, OpenError};
use crate::store::{ApprovalRecord, IssuedMandate, MandateIssuer, Review, ReviewError};

/// An authenticated human operator (approver, auditor, admin).
#[derive(Debug, Clone)]
pub struct Operator {
    pub issuer: String,
    pub subject: String,
    pub scopes: BTreeSet<String>,
    pub correlation_id: String,
}

/// Operator-side refusals; the HTTP layer maps each to one status.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    #[error("{0}")]
    Invalid(String),
    #[error("this operator lacks scope {0}")]
    Forbidden(&'static str),
    #[error("{0}")]
    SelfReview(String),
    #[error("no such approval")]
    NotFound,
    /// No such payment, mandate, … (what is named).
    #[error("no such {0}")]
    Missing(&'static str),
    #[error("{0}")]
    Conflict(String),
    #[error("{0}")]
    Gone(String),
    /// A person confirming an approval that is not theirs to confirm (an operator's to decide).
    #[error("{0}")]
    NotTheUser(String),
    #[error("internal error")]
    Internal,
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
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PreauthorizeArgs {
    /// Agent subject the mandate is for.
    pub subject: String,
    /// That agent's token issuer; defaults to the operator's own.
    #[serde(default)]
    pub agent_issuer: Option<String>,
    /// The user the agent acts for under it (RFC 8693 delegation); absent: the agent on its own
    /// token. A mandate is only ever its own pair's.
    #[serde(default)]
    pub user: Option<String>,
    /// closed | open
    pub kind: String,
    pub currency: String,
    /// closed: payer, payee and amount. open: payer optional.
    #[serde(default)]
    pub payer: Option<String>,
    #[serde(default)]
    pub payee: Option<String>,
    #[serde(default)]
    pub amount: Option<String>,
    #[serde(default)]
    pub memo: Option<String>,
    /// open: allowed payees, per-payment maximum, total budget, maximum uses, validity.
    #[serde(default)]
    pub payees: Option<Vec<String>>,
    #[serde(default)]
    pub per_payment_max: Option<String>,
    #[serde(default)]
    pub budget: Option<String>,
    #[serde(default)]
    pub max_uses: Option<i64>,
    #[serde(default)]
    pub valid_for_secs: Option<i64>,
    #[serde(default)]
    pub reason: Option<String>,
}

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
        return Err(OpError::Invalid(format!("{field} must be non-empty, without control characters")));
    }
    if value.len() > bytes_max {
        // "no such agent": a token's subject, user or issuer is never this long.
        return Err(OpError::Missing("agent (no token carries a name this long)"));
    }
    Ok(())
}

/// A reason an operator or user gives, as kept: at most [`REASON_CHARS_MAX`] characters (longer is
/// refused, never cut: a cut reason could say something else).
fn reason_text(reason: Option<String>) -> Result<Option<String>, OpError> {
    match reason {
        Some(r) if r.chars().count() > REASON_CHARS_MAX => {
            Err(OpError::Invalid(format!("reason is at most {REASON_CHARS_MAX} characters")))
        }
        r => Ok(r),
    }
}

/// Largest `max_uses` of an open mandate.
pub const OPEN_MANDATE_USES_MAX: i64 = 100_000;
/// Longest review reason kept, in characters.
pub const REASON_CHARS_MAX: usize = 500;
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
fn owns(p: &crate::auth::AgentPrincipal, a: &ApprovalRecord) -> bool {
    a.principal_sub == p.subject && a.principal_iss == p.issuer && a.principal_user == p.user
}

fn decision_key(id: &ApprovalId) -> String {
    // Idempotency keys start with "idk_": no waiter key of theirs can equal this.
    format!("decision/{id}")
}

impl Gateway {
    fn view(&self, a: &ApprovalRecord, now: UnixSecs, with_mandate: bool) -> ApprovalView {
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

    fn require(&self, op: &Operator, any_of: &[&'static str]) -> Result<(), OpError> {
        if any_of.iter().any(|s| op.scopes.contains(*s)) { Ok(()) } else { Err(OpError::Forbidden(any_of[0])) }
    }

    pub async fn list_approvals(
        &self,
        op: &Operator,
        status: Option<&str>,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<(Vec<ApprovalView>, Option<String>), OpError> {
        self.require(op, &[scopes::AUDIT, scopes::APPROVE])?;
        if let Some(s) = status
            && ApprovalStatus::parse(s).is_none()
        {
            return Err(OpError::Invalid("status must be pending, approved, rejected or expired".into()));
        }
        let before = decode_cursor(cursor).map_err(|e| OpError::Invalid(e.message))?;
        let limit = self.page_limit(limit).map_err(|e| OpError::Invalid(e.message))?;
        let now = self.clock.now();
        let page = self.store.approval_list(status, before, limit, now).await.map_err(|error| {
            tracing::error!(%error, "approval list failed");
            OpError::Internal
        })?;
        Ok((page.items.iter().map(|(_, a)| self.view(a, now, false)).collect(), page.next_cursor.map(encode_cursor)))
    }

    pub async fn approval(&self, op: &Operator, approval_id: &str) -> Result<ApprovalView, OpError> {
        self.require(op, &[scopes::AUDIT, scopes::APPROVE])?;
        let id = ApprovalId::parse(approval_id).map_err(|_| OpError::NotFound)?;
        match self.store.approval_get(&id).await {
            Ok(Some(a)) => Ok(self.view(&a, self.clock.now(), false)),
            Ok(None) => Err(OpError::NotFound),
            Err(error) => {
                tracing::error!(%error, "approval read failed");
                Err(OpError::Internal)
            }
        }
    }

    /// One reviewer approves or rejects. Enough distinct approvals issue the mandate.
    pub async fn review(
        &self,
        op: &Operator,
        approval_id: &str,
        decision: ReviewDecision,
        reason: Option<String>,
    ) -> Result<ApprovalView, OpError> {
        self.require(op, &[scopes::APPROVE])?;
        let reason = reason_text(reason)?;
        if decision == ReviewDecision::Reject && reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
            return Err(OpError::Invalid("a rejection needs a reason".into()));
        }
        self.decide(op, approval_id, decision, reason, false).await
    }

    /// A person's own approval, for the confirmation page: only the user the agent acts for (the
    /// delegating subject, same issuer, their own operator-audience sign-in with `payments:confirm`)
    /// sees it.
    pub async fn user_approval(&self, person: &Operator, approval_id: &str) -> Result<ApprovalView, OpError> {
        let a = self.users_own(person, approval_id).await?;
        Ok(self.view(&a, self.clock.now(), false))
    }

    /// The user confirms (or declines) a payment their agent asked for, within their profile's
    /// user-approval tier: their confirmation alone issues the mandate.
    pub async fn confirm(
        &self,
        person: &Operator,
        approval_id: &str,
        decision: ReviewDecision,
        reason: Option<String>,
    ) -> Result<ApprovalView, OpError> {
        let a = self.users_own(person, approval_id).await?;
        if a.approver != Approver::User {
            return Err(OpError::NotTheUser(
                "this payment is over your own approval limit: an operator decides it".into(),
            ));
        }
        let reason = reason_text(reason)?
            .filter(|r| !r.trim().is_empty())
            .or_else(|| (decision == ReviewDecision::Reject).then(|| "declined by the user".to_string()));
        self.decide(person, approval_id, decision, reason, true).await
    }

    async fn users_own(&self, person: &Operator, approval_id: &str) -> Result<ApprovalRecord, OpError> {
        self.require(person, &[scopes::CONFIRM])?;
        let id = ApprovalId::parse(approval_id).map_err(|_| OpError::NotFound)?;
        match self.store.approval_get(&id).await {
            // Someone else's approval does not exist for this person, and neither does one the agent
            // asked for on its own (there is no person to confirm it: an operator decides).
            Ok(Some(a))
                if a.principal_user.as_deref() == Some(person.subject.as_str()) && a.principal_iss == person.issuer =>
            {
                Ok(a)
            }
            Ok(_) => Err(OpError::NotFound),
            Err(error) => {
                tracing::error!(%error, "approval read failed");
                Err(OpError::Internal)
            }
        }
    }

    /// Record one review (an operator's, or the user's own) and audit it.
    async fn decide(
        &self,
        op: &Operator,
        approval_id: &str,
        decision: ReviewDecision,
        reason: Option<String>,
        as_user: bool,
    ) -> Result<ApprovalView, OpError> {
        let id = ApprovalId::parse(approval_id).map_err(|_| OpError::NotFound)?;
        let now = self.clock.now();
        let review = Review {
            reviewer_iss: op.issuer.clone(),
            reviewer_sub: op.subject.clone(),
            decision,
            reason: reason.clone(),
            at: now,
            as_user,
        };
        let issuer = self.mandate_issuer(now);
        let result = self.store.approval_review(&id, review, now, issuer).await;
        let action = match (as_user, decision) {
            (false, ReviewDecision::Approve) => "approvals.approve",
            (false, ReviewDecision::Reject) => "approvals.reject",
            (true, ReviewDecision::Approve) => "approvals.user_confirm",
            (true, ReviewDecision::Reject) => "approvals.user_decline",
        };
        let (outcome, error) = match result {
            Ok(a) => (Ok(self.view(&a, now, false)), None),
            Err(e) => {
                let mapped = match &e {
                    ReviewError::NotFound => OpError::NotFound,
                    ReviewError::Terminal(s) => OpError::Conflict(format!("the approval is already {s}")),
                    ReviewError::Expired => OpError::Gone("the approval has expired".into()),
                    ReviewError::SelfReview => {
                        OpError::SelfReview("the agent a payment is for cannot review it".into())
                    }
                    ReviewError::AlreadyReviewed => OpError::Conflict("this reviewer has already reviewed it".into()),
                    ReviewError::NotTheUser => OpError::NotTheUser(e.to_string()),
                    ReviewError::Mandate(_) | ReviewError::Store(_) => {
                        tracing::error!(error = %e, "approval review failed");
                        OpError::Internal
                    }
                };
                (Err(mapped), Some(e.to_string()))
            }
        };
        if outcome.as_ref().is_ok_and(|v| v.status != "pending") {
            self.wake(&decision_key(&id));
        }
        let mut d = Decision::new(action, if outcome.is_ok() { "recorded" } else { "refused" });
        d.approval_id = Some(id.as_str());
        d.detail = error.or(reason);
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        if let Ok(v) = &outcome
            && let Some(mid) = &v.mandate_id
        {
            let mut d = Decision::new("mandates.issue", "issued");
            d.approval_id = Some(id.as_str());
            d.detail = Some(format!("mandate {mid} for {}", v.agent_subject));
            self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        }
        outcome
    }

    /// Pre-authorize a payment (closed) or a standing mandate (open) for a named agent. The
    /// creator's own approval counts once; a higher tier still needs other reviewers.
    pub async fn preauthorize(&self, op: &Operator, args: PreauthorizeArgs) -> Result<ApprovalView, OpError> {
        self.require(op, &[scopes::APPROVE])?;
        let bad = |m: String| OpError::Invalid(m);
        let currency = Currency::parse(&args.currency).map_err(|e| bad(e.to_string()))?;
        let account = |field: &str, v: &Option<String>| -> Result<Option<AccountId>, OpError> {
            v.as_deref()
                .map(|s| AccountId::parse(s).map_err(|_| bad(format!("{field} is not an account id"))))
                .transpose()
        };
        let money = |field: &str, v: &Option<String>| -> Result<Money, OpError> {
            let s = v.as_deref().ok_or_else(|| bad(format!("{field} is required")))?;
            Money::parse(s, currency).map_err(|e| bad(format!("{field}: {e}")))
        };
        if !valid_subject(&args.subject) {
            return Err(bad("subject is required: 1-256 bytes, no control characters".into()));
        }
        if args.user.as_deref().is_some_and(|u| !valid_subject(u)) {
            return Err(bad("user must be 1-256 bytes, no control characters".into()));
        }
        // Maker/checker before anything is written: an operator never pre-authorizes themself, nor
        // an agent acting for them (the review below would refuse, and the pending approval would be
        // left for a colleague).
        if acts_on_itself(&op.subject, Target { agent: &args.subject, user: args.user.as_deref() }) {
            return Err(OpError::SelfReview("an operator cannot pre-authorize a mandate for themself".into()));
        }
        let now = self.clock.now();
        let payer = account("payer", &args.payer)?;
        let (kind, intent, amount_minor) = match args.kind.as_str() {
            "closed" => {
                let payee = account("payee", &args.payee)?.ok_or_else(|| bad("payee is required".into()))?;
                let payer = payer.ok_or_else(|| bad("payer is required".into()))?;
                let amount = money("amount", &args.amount)?;
                let intent = json!({
                    "tool": "create_payment", "payer": payer, "payee": payee, "amount": amount.to_decimal(),
                    "currency": currency, "memo": args.memo,
                });
                (MandateKind::Closed, intent, amount.minor())
            }
            "open" => {
                let payees =
                    args.payees.as_ref().filter(|p| !p.is_empty()).ok_or_else(|| bad("payees is required".into()))?;
                let payees = payees
                    .iter()
                    .map(|p| AccountId::parse(p).map_err(|_| bad(format!("payee {p:?} is not an account id"))))
                    .collect::<Result<Vec<_>, _>>()?;
                let per = money("per_payment_max", &args.per_payment_max)?;
                let budget = money("budget", &args.budget)?;
                let max_uses = args.max_uses.ok_or_else(|| bad("max_uses is required".into()))?;
                if !(1..=OPEN_MANDATE_USES_MAX).contains(&max_uses) {
                    return Err(bad(format!("max_uses must be 1..={OPEN_MANDATE_USES_MAX}")));
                }
                let valid = args.valid_for_secs.unwrap_or(self.limits.open_mandate_valid_max_secs);
                if !(60..=self.limits.open_mandate_valid_max_secs).contains(&valid) {
                    return Err(bad(format!(
                        "valid_for_secs must be 60..={}",
                        self.limits.open_mandate_valid_max_secs
                    )));
                }
                let intent = json!({
                    "tool": "create_payment", "payer": payer, "payees": payees,
                    "per_payment_max": per.to_decimal(), "per_payment_max_minor": per.minor(),
                    "budget": budget.to_decimal(), "budget_minor": budget.minor(),
                    "max_uses": max_uses, "currency": currency, "valid_until": now + valid,
                });
                (MandateKind::Open, intent, budget.minor())
            }
            _ => return Err(bad("kind must be closed or open".into())),
        };
        let id = ApprovalId::generate();
        let reviewers_required = self.reviewers_for(amount_minor, currency);
        let rec = ApprovalRecord {
            id: id.clone(),
            status: ApprovalStatus::Pending,
            kind,
            idempotency_key: format!("preauth:{id}"),
            fingerprint: String::new(),
            principal_iss: args.agent_issuer.clone().unwrap_or_else(|| op.issuer.clone()),
            principal_sub: args.subject.clone(),
            principal_user: args.user.clone(),
            tool: "create_payment".into(),
            intent,
            amount_minor,
            currency,
            reason: args.reason.clone().unwrap_or_else(|| "pre-authorized by an operator".into()),
            created_at: now,
            expires_at: now + self.limits.approval_ttl_secs,
            reviewers_required,
            requested_by: op.subject.clone(),
            mandate_id: None,
            mandate: None,
            decided_at: None,
            decision_reason: None,
            reviews: vec![],
            approver: Approver::Operator,
        };
        self.store.approval_insert(rec).await.map_err(|error| {
            tracing::error!(%error, "approval insert failed");
            OpError::Internal
        })?;
        let mut d = Decision::new("approvals.preauthorize", "created");
        d.approval_id = Some(id.as_str());
        d.detail = Some(format!("{} for {}", args.kind, args.subject));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        self.review(op, id.as_str(), ReviewDecision::Approve, args.reason).await
    }

    /// Distinct reviewers an approval of `amount_minor` needs: `high_risk_reviewers` at or above the
    /// currency's `approvals.high_risk_amount`, and for a currency with no threshold configured
    /// (an unknown risk counts as high); `reviewers_required` otherwise.
    pub(crate) fn reviewers_for(&self, amount_minor: i64, currency: Currency) -> i64 {
        match self.limits.high_risk_amount_minor.get(&currency) {
            Some(threshold) if amount_minor < *threshold => self.limits.reviewers_required,
            Some(_) | None => self.limits.high_risk_reviewers,
        }
    }

    /// Revoke the mandate an approval issued: every later draw on it is refused (MANDATE_INVALID),
    /// in the same transaction that would have moved the money.
    pub async fn revoke(
        &self,
        op: &Operator,
        approval_id: &str,
        reason: Option<String>,
    ) -> Result<ApprovalView, OpError> {
        self.require(op, &[scopes::APPROVE])?;
        let id = ApprovalId::parse(approval_id).map_err(|_| OpError::NotFound)?;
        let now = self.clock.now();
        let internal = |error: crate::store::StoreError| {
            tracing::error!(%error, "mandate revocation failed");
            OpError::Internal
        };
        let rec = self.store.approval_get(&id).await.map_err(internal)?.ok_or(OpError::NotFound)?;
        if rec.mandate_id.is_none() {
            return Err(OpError::Conflict(format!("the approval is {} and issued no mandate", rec.status_at(now))));
        }
        let revoked = self.store.mandate_revoke(&id, &op.subject, now).await.map_err(internal)?;
        let Some(mandate_id) = revoked else {
            return Err(OpError::Conflict("its mandate is already revoked".into()));
        };
        let reason = reason_text(reason)?;
        let mut d = Decision::new("mandates.revoke", "revoked");
        d.approval_id = Some(id.as_str());
        d.detail = Some(format!("mandate {mandate_id}: {}", reason.as_deref().unwrap_or("no reason given")));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        Ok(self.view(&rec, now, false))
    }

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
        let newly = self.store.suspend(issuer, &who.subject, &scope, &why, now).await.map_err(|error| {
            tracing::error!(%error, "suspend failed");
            OpError::Internal
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
        let resumed =
            self.store.resume(issuer, &who.subject, who.user.as_deref(), self.clock.now()).await.map_err(|error| {
                tracing::error!(%error, "resume failed");
                OpError::Internal
            })?;
        self.forget_suspended();
        let mut d = Decision::new("principals.resume", if resumed { "resumed" } else { "not_suspended" });
        d.detail = Some(who.describe(issuer));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        Ok(resumed)
    }

    fn not_itself(&self, op: &Operator, who: &PrincipalArgs) -> Result<(), OpError> {
        if acts_on_itself(&op.subject, Target { agent: &who.subject, user: who.user.as_deref() }) {
            return Err(OpError::SelfReview(
                "no one suspends or resumes themself, nor an agent acting for them".into(),
            ));
        }
        Ok(())
    }

    /// Signs the mandate inside the review transaction once enough reviewers approved.
    fn mandate_issuer(&self, now: UnixSecs) -> MandateIssuer {
        let keys: Arc<MandateKeys> = self.mandates.clone();
        let ttl = self.limits.mandate_ttl_secs;
        let open_max = self.limits.open_mandate_valid_max_secs;
        Box::new(move |rec: &ApprovalRecord, approvers: &[String]| {
            let s = |k: &str| rec.intent.get(k).and_then(Value::as_str).map(str::to_string);
            let i = |k: &str| rec.intent.get(k).and_then(Value::as_i64);
            let mut claims = MandateClaims {
                jti: format!("mdt_{}", uuid::Uuid::now_v7().simple()),
                iss: MANDATE_ISSUER.into(),
                sub: rec.principal_sub.clone(),
                agent_iss: rec.principal_iss.clone(),
                user: rec.principal_user.clone(),
                kind: rec.kind,
                iat: now,
                exp: now + ttl,
                approval_id: rec.id.to_string(),
                approvers: approvers.to_vec(),
                currency: rec.currency.to_string(),
                tool: None,
                payer: s("payer"),
                payee: None,
                amount_minor: None,
                payment_id: None,
                intent_sha256: None,
                payees: None,
                per_payment_max_minor: None,
                budget_minor: None,
                max_uses: None,
            };
            let (budget_minor, max_uses) = match rec.kind {
                MandateKind::Closed => {
                    claims.tool = Some(rec.tool.clone());
                    claims.payee = s("payee");
                    claims.amount_minor = Some(rec.amount_minor);
                    claims.payment_id = s("payment_id");
                    // An agent's request carries its operation: the mandate pins the whole intent the
                    // reviewers saw (an operator's pre-authorization names no operation).
                    if rec.intent.get("operation_id").is_some() {
                        claims.intent_sha256 = Some(crate::mandate::intent_digest(&rec.intent));
                    }
                    (None, 1)
                }
                MandateKind::Open => {
                    claims.payees = rec
                        .intent
                        .get("payees")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect());
                    claims.per_payment_max_minor = i("per_payment_max_minor");
                    claims.budget_minor = i("budget_minor");
                    claims.max_uses = i("max_uses");
                    claims.exp = i("valid_until").unwrap_or(now + open_max).min(now + open_max);
                    (claims.budget_minor, claims.max_uses.unwrap_or(1))
                }
            };
            let jws = keys.sign(&claims)?;
            Ok(IssuedMandate { id: claims.jti.clone(), jws, budget_minor, max_uses, expires_at: claims.exp })
        })
    }
}
