//! Approvals (the human review queue) and the mandates their reviews issue.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::approval::{ApprovalRecord, ApprovalRequest, ApprovalReview, ReviewError, Reviewed, Revoked};
use crate::domain::error::StoreError;
use crate::domain::ids::ApprovalId;
use crate::domain::ops::ApprovalQuery;
use crate::domain::payment::Page;
use crate::domain::webhook::OutboxMessage;

#[async_trait]
pub trait ApprovalStore: Send + Sync {
    /// The approval for `rec.idempotency_key` (`domain::rules::review::on_request` decides which
    /// answers: pending, approved or rejected; an expired one is asked again), or `rec` inserted as a
    /// new one unless its agent has `max` approvals waiting already; all as of
    /// `rec.created_at`, the time it is asked.
    /// `notify`: the `approval.requested` messages, written with the approval when it is created.
    async fn approval_get_or_create(
        &self,
        rec: ApprovalRecord,
        max: i64,
        notify: Vec<OutboxMessage>,
    ) -> Result<ApprovalRequest, StoreError>;
    async fn approval_get(&self, id: &ApprovalId) -> Result<Option<ApprovalRecord>, StoreError>;
    /// Pending, unexpired approvals (the human queue's depth).
    async fn approvals_pending(&self, now: UnixSecs) -> Result<i64, StoreError>;
    /// Mark pending approvals past their expiry `expired` (they already read as expired); returns how many.
    async fn approvals_expire(&self, now: UnixSecs) -> Result<u64, StoreError>;
    /// Insert an operator's pre-authorization as it is (pending until reviewed).
    async fn approval_insert(&self, rec: ApprovalRecord) -> Result<(), StoreError>;
    /// Newest first, by [`ApprovalQuery`].
    async fn approval_list(&self, q: ApprovalQuery) -> Result<Page<(i64, ApprovalRecord)>, StoreError>;
    /// Record one reviewer's decision; the state machine runs in one transaction. Enough approvals
    /// issue the mandate (`r.issue`) in the same transaction.
    async fn approval_review(&self, r: ApprovalReview) -> Result<Reviewed, ReviewError>;

    /// Count one more URL-elicitation round answered for this approval, unless `max` were answered
    /// already: the round's number, or `None` once the bound is reached (whichever sealed state the
    /// client presented: the count is the server's).
    async fn approval_elicitation_round(&self, id: &ApprovalId, max: i64) -> Result<Option<i64>, StoreError>;

    /// Revoke the mandate an approval issued (`None`: none, or it was revoked already). Draws on it
    /// are refused from then on, in the posting transaction.
    async fn mandate_revoke(
        &self,
        id: &ApprovalId,
        by: &str,
        now: UnixSecs,
        record: Option<crate::domain::audit::AuditRecord>,
    ) -> Result<Option<Revoked>, StoreError>;
}
