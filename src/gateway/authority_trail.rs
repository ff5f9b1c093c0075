//! What the trail says about authority, read beside the rows that say it too: a person's earlier
//! decision on an approval, an approval rejected, and an operator's revocation of a mandate. The
//! rows (`approval_reviews`, `approvals.status`, `mandates.revoked_at`) are what a database writer
//! can rewrite outside the decision's transaction; the trail's records stand (the stop-67 and
//! stop-68 reviews). Any matching record counts, its writer's tag holding or not: a forged one can
//! only refuse, and an edited one is named by `audit verify`.

use super::Gateway;
use super::keys::Idem;
use crate::domain::approval::ApprovalStatus;
use crate::domain::error::StoreError;
use crate::domain::ids::ApprovalId;
use crate::domain::ops::AuditQuery;
use crate::error::AgentError;

/// Decisions on one approval read from the trail, at most (an approval needs at most 10 reviewers;
/// refusals are recorded as "refused", not read).
const DECISIONS_READ_MAX: u32 = 200;

/// An operation's "approval_required" records read from the trail, at most (one per retry while
/// its approval waits: the newest are enough to find every approval it had).
const ASKED_READ_MAX: u32 = 200;

/// Revocation records of one mandate read from the trail, at most (one suffices; more are copies).
const REVOCATIONS_READ_MAX: u32 = 20;

/// The tools whose "recorded" records are a person's decision on an approval.
const DECISION_TOOLS: [&str; 4] =
    ["approvals.approve", "approvals.reject", "approvals.user_confirm", "approvals.user_decline"];

impl Gateway {
    /// An approval of this operation that the trail shows rejected (by an operator, or declined by
    /// its user), if any: the approvals the agent was told about (its "approval_required" records
    /// under the call's key, and, for a rail's payout or collection, under the family's other
    /// rails' tools: a rejection on one rail sticks on the other), each asked about on the trail.
    pub(super) async fn rejected_on_trail(&self, idem: &Idem) -> Result<Option<String>, StoreError> {
        let siblings = idem.family.as_deref().map(|f| f.siblings.as_slice()).unwrap_or_default();
        let mut asked: Vec<String> = Vec::new();
        for key in std::iter::once(&idem.operation().key).chain(siblings) {
            let q = AuditQuery {
                idempotency_key: Some(key.clone()),
                code: Some("APPROVAL_REQUIRED".into()),
                limit: ASKED_READ_MAX,
                ..Default::default()
            };
            asked.extend(self.store.audit_query(q).await?.into_iter().filter_map(|r| r.approval_id));
        }
        asked.dedup();
        for id in asked {
            let Ok(parsed) = ApprovalId::parse(&id) else { continue };
            if self.decided_on_trail(&parsed, "").await?.settled == Some(ApprovalStatus::Rejected) {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// Whether the trail holds an operator's revocation of the mandate `approval_id` issued: a
    /// revocation cleared in the `mandates` row still stands.
    pub(super) async fn revoked_in_trail(&self, approval_id: &str) -> Result<bool, AgentError> {
        let q = AuditQuery {
            tool: Some("mandates.revoke".into()),
            decision: Some("revoked".into()),
            approval_id: Some(approval_id.into()),
            limit: REVOCATIONS_READ_MAX,
            ..Default::default()
        };
        let records = self.store.audit_query(q).await.map_err(|e| {
            tracing::error!(error = %e, "reading a mandate's revocations failed");
            AgentError::new(crate::error::ErrorCode::Internal, "internal error")
        })?;
        if let Some(r) =
            records.iter().find(|r| crate::domain::audit_chain::tag_fault(&self.audit_link_key, r, true).is_some())
        {
            tracing::error!(
                seq = r.seq,
                approval_id,
                "a mandate revocation record's writer's tag does not hold; the revocation stands"
            );
        }
        Ok(!records.is_empty())
    }

    /// What the trail holds about approval `id`: whether `subject` recorded a decision on it (an
    /// operator's approve or reject, a user's confirm or decline: one person decides once), and
    /// whether a decision settled it (a rejection, a user's own decision, a mandate issued): an
    /// approval settled by the trail's word stays settled even if its row was reopened.
    pub(super) async fn decided_on_trail(&self, id: &ApprovalId, subject: &str) -> Result<Trail, StoreError> {
        let q = AuditQuery {
            approval_id: Some(id.to_string()),
            decision: Some("recorded".into()),
            limit: DECISIONS_READ_MAX,
            ..Default::default()
        };
        let records = self.store.audit_query(q).await?;
        let decisions = || records.iter().filter(|r| DECISION_TOOLS.contains(&r.tool.as_str()));
        let by_subject = decisions().any(|r| r.principal_sub == subject);
        let mut settled = decisions().find_map(|r| match r.tool.as_str() {
            "approvals.reject" | "approvals.user_decline" => Some(ApprovalStatus::Rejected),
            "approvals.user_confirm" => Some(ApprovalStatus::Approved),
            _ => None,
        });
        if settled.is_none() {
            let q = AuditQuery {
                tool: Some("mandates.issue".into()),
                decision: Some("issued".into()),
                approval_id: Some(id.to_string()),
                limit: 1,
                ..Default::default()
            };
            if !self.store.audit_query(q).await?.is_empty() {
                settled = Some(ApprovalStatus::Approved);
            }
        }
        Ok(Trail { by_subject, settled })
    }
}

/// What the trail holds about one approval ([`Gateway::decided_on_trail`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Trail {
    /// The person asking recorded a decision on it already.
    pub by_subject: bool,
    /// A decision on record settled it so.
    pub settled: Option<ApprovalStatus>,
}
