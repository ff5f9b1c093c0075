//! Asking a human: a call that policy sends to a person becomes (or finds) its approval, bounded
//! per agent, in the user's own tier when there is a user to ask, and answers APPROVAL_REQUIRED
//! with where to decide it.

use super::keys::Idem;
use super::{Caller, Decision, Gateway};
use crate::domain::approval::{ApprovalRecord, ApprovalRequest, ApprovalStatus, Approver, RejectedIntent};
use crate::domain::ids::ApprovalId;
use crate::domain::money::Money;
use crate::domain::webhook;
use crate::error::{AgentError, ErrorCode};
use crate::mandate::MandateKind;

impl Gateway {
    pub(crate) fn approval_url(&self, id: &ApprovalId) -> String {
        format!("{}/approvals/{id}", self.limits.public_url)
    }

    /// The page a person opens to decide one approval (the console's, when it is on): an
    /// operator's review, or the user's own confirmation page for an approval in their tier.
    pub fn approval_page(&self, id: &ApprovalId, approver: Approver) -> String {
        match (&self.limits.approval_page_base, approver) {
            (Some(console), Approver::Operator) => format!("{console}#approvals/{id}"),
            (Some(console), Approver::User) => format!("{console}#confirm/{id}"),
            (None, Approver::Operator) => self.approval_url(id),
            (None, Approver::User) => format!("{}/operator/v1/confirmations/{id}", self.limits.public_url),
        }
    }

    /// The approval this call needs (found or created), as the answer the agent gets.
    pub(super) async fn require_approval(
        &self,
        caller: &Caller,
        tool: &str,
        idem: &Idem,
        amount: Money,
        intent: serde_json::Value,
        reason: String,
    ) -> AgentError {
        let now = self.clock.now();
        let p = &caller.principal;
        let reviewers_required = self.reviewers_for(amount.minor(), amount.currency());
        // The user's own tier: only for an agent acting for a user (delegation: there is a person
        // to ask), below the high-risk amount (config checks it) and where one reviewer would do.
        let approver = if p.user.is_some() && p.profile.user_may_approve(amount) && reviewers_required == 1 {
            Approver::User
        } else {
            Approver::Operator
        };
        // Approval fatigue: the intent a human rejected, asked again under a new operation_id, is
        // not put before a person again while the cool-down lasts. Refused (audited, counted
        // toward both stop rules: the windowed count and the no-progress row) instead.
        match self.rejected_before(caller, tool, idem, now).await {
            Ok(Some((approval_id, decided_at))) => {
                let until = decided_at + self.limits.rejected_cooldown_secs;
                let e = AgentError::new(
                    ErrorCode::ApprovalRejected,
                    format!(
                        "a human rejected this same payment (approval {approval_id}); asking again under another \
                         operation_id is refused until {}. Nothing moved.",
                        crate::clock::rfc3339(until)
                    ),
                )
                .with_detail("approval_id", approval_id);
                return self.refuse_as(caller, tool, idem, "denied", e).await;
            }
            Ok(None) => {}
            Err(error) => return self.internal(caller, tool, idem, error).await,
        }
        // A rejection sticks to its operation by the trail's word too: an approval of this
        // operation the trail shows rejected stays so whatever its row says now (the second
        // stop-68 review: its status set to expired, and the operation asked a human again).
        match self.rejected_on_trail(idem).await {
            Ok(Some(approval_id)) => {
                let e = AgentError::new(
                    ErrorCode::ApprovalRejected,
                    "a human rejected this operation; it will not be approved again. Nothing moved.",
                )
                .with_detail("approval_id", approval_id);
                return self.refuse_as(caller, tool, idem, "denied", e).await;
            }
            Ok(None) => {}
            Err(error) => return self.internal(caller, tool, idem, error).await,
        }
        if caller.dry() {
            // A preflight asks nobody: it says who would be asked, and why.
            return AgentError::new(ErrorCode::ApprovalRequired, format!("{reason}; a human must approve it"))
                .with_detail("approver", approver.as_str())
                .with_detail("reviewers_required", reviewers_required);
        }
        let rec = ApprovalRecord {
            approver,
            passkey_required: self.passkey_required_for(p.profile.passkey_required, amount.minor(), amount.currency()),
            id: ApprovalId::generate(),
            status: ApprovalStatus::Pending,
            kind: MandateKind::Closed,
            reviewers_required,
            requested_by: p.subject.clone(),
            mandate_id: None,
            mandate: None,
            decided_at: None,
            decision_reason: None,
            reviews: vec![],
            idempotency_key: idem.key.clone(),
            fingerprint: idem.fingerprint.clone(),
            principal_iss: p.issuer.clone(),
            principal_sub: p.subject.clone(),
            principal_user: p.user.clone(),
            tool: tool.to_string(),
            intent,
            amount_minor: amount.minor(),
            currency: amount.currency(),
            reason: reason.clone(),
            created_at: now,
            expires_at: now + self.limits.approval_ttl_secs,
            tag: None,
        }
        .tagged(&self.audit_link_key, rand::random());
        let page = self.approval_page(&rec.id, rec.approver);
        let notify = self.notice(webhook::APPROVAL_REQUESTED).messages(webhook::approval_data(&rec, &page));
        let max = self.limits.pending_approvals_per_agent_max;
        let approval = match self.store.approval_get_or_create(rec, max, notify).await {
            Ok(ApprovalRequest::Existing(a) | ApprovalRequest::Created(a)) => a,
            Ok(ApprovalRequest::TooManyPending) => {
                // An approval flood: the queue a human works through is bounded per agent.
                let e = AgentError::new(
                    ErrorCode::RateLimited,
                    format!(
                        "{} approvals of this agent are already waiting for a human; wait for them to be decided",
                        self.limits.pending_approvals_per_agent_max
                    ),
                )
                .with_retry_after(60);
                return self.refuse_as(caller, tool, idem, "denied", e).await;
            }
            Err(error) => return self.internal(caller, tool, idem, error).await,
        };
        if approval.fingerprint != idem.fingerprint {
            return self.conflict(caller, tool, idem).await;
        }
        if approval.status == ApprovalStatus::Rejected {
            // A rejection sticks to its operation: asking again is refused (and counts toward the stop rule).
            let e = AgentError::new(
                ErrorCode::ApprovalRejected,
                "a human rejected this operation; it will not be approved again. Nothing moved.",
            )
            .with_detail("approval_id", approval.id.to_string());
            return self.refuse_as(caller, tool, idem, "denied", e).await;
        }
        if approval.status == ApprovalStatus::Approved {
            // Its mandate revoked: the agent is told so, not sent to fetch a mandate that cannot pay.
            match self.revoked_in_trail(approval.id.as_str()).await {
                Ok(false) => {}
                Ok(true) => {
                    let e = AgentError::new(
                        ErrorCode::MandateInvalid,
                        "an operator revoked the mandate this operation's approval issued; it will not be paid \
                         under it. Nothing moved.",
                    )
                    .with_detail("approval_id", approval.id.to_string());
                    return self.refuse_as(caller, tool, idem, "denied", e).await;
                }
                Err(e) => return e,
            }
        }
        let mut d = Decision::new(tool, "approval_required");
        d.code = Some(ErrorCode::ApprovalRequired);
        d.idempotency_key = Some(&idem.key);
        d.approval_id = Some(approval.id.as_str());
        d.detail = Some(reason.clone());
        self.audit(caller, d).await;
        let message = if approval.status == ApprovalStatus::Approved {
            "approved: fetch the mandate with get_approval and repeat this call with it as `mandate`. Nothing moved."
                .to_string()
        } else {
            format!("{reason}; a human must approve it. Nothing moved.")
        };
        AgentError::new(ErrorCode::ApprovalRequired, message)
            .with_detail("approval_id", approval.id.to_string())
            .with_detail("approver", approval.approver.as_str())
            .with_detail("approval_status", approval.status.as_str())
            .with_detail("approval_url", self.approval_url(&approval.id))
            .with_detail("reviewers_required", approval.reviewers_required)
            .with_detail("passkey_required", approval.passkey_required)
            .with_detail("expires_at", crate::clock::rfc3339(approval.expires_at))
    }

    /// A rejection of this call's intent (its fingerprint) under another operation within
    /// `approvals.rejected_cooldown_secs`: its approval id and when it was rejected.
    async fn rejected_before(
        &self,
        caller: &Caller,
        tool: &str,
        idem: &Idem,
        now: crate::clock::UnixSecs,
    ) -> Result<Option<(String, i64)>, crate::domain::error::StoreError> {
        let cooldown = self.limits.rejected_cooldown_secs;
        if cooldown == 0 {
            return Ok(None);
        }
        let p = &caller.principal;
        let q = RejectedIntent {
            issuer: &p.issuer,
            subject: &p.subject,
            user: p.user.as_deref(),
            tool,
            fingerprint: &idem.fingerprint,
            key: &idem.key,
            since: now - cooldown,
            created_since: now - cooldown - self.limits.approval_ttl_secs,
        };
        self.store.rejected_intent(q).await
    }
}
