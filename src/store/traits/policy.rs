//! Policy as data: its versions (append-only), the widening changes waiting for a second operator,
//! and the audited money decisions a dry run replays.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::domain::policy_doc::{PolicyProposal, PolicyVersion, ProposalStatus};

#[async_trait]
pub trait PolicyStore: Send + Sync {
    /// The newest version's number (0: none yet). Cheap: every replica asks every few seconds.
    async fn policy_head(&self) -> Result<i64, StoreError>;
    /// One version (`None`: no such version).
    async fn policy_version(&self, version: i64) -> Result<Option<PolicyVersion>, StoreError>;
    /// Versions, newest first, at most `limit`.
    async fn policy_versions(&self, limit: u32) -> Result<Vec<PolicyVersion>, StoreError>;
    /// Write `v` as the next version: only when `v.version` is one past the newest (`false`:
    /// another change got there first, nothing was written).
    async fn policy_append(&self, v: PolicyVersion) -> Result<bool, StoreError>;
    /// Give untagged versions (written before versions were tagged) the gateway's tags, once, at
    /// the first start that knows tags: (version, tag) pairs; a version tagged meanwhile is left.
    async fn policy_adopt_tags(&self, tags: Vec<(i64, String)>) -> Result<(), StoreError>;
    /// The same for pending proposals: (id, tag) pairs.
    async fn policy_adopt_proposal_tags(&self, tags: Vec<(String, String)>) -> Result<(), StoreError>;
    async fn policy_propose(&self, p: PolicyProposal) -> Result<(), StoreError>;
    async fn policy_proposal(&self, id: &str) -> Result<Option<PolicyProposal>, StoreError>;
    /// Proposals, newest first, optionally of one status, at most `limit`.
    async fn policy_proposals(
        &self,
        status: Option<ProposalStatus>,
        limit: u32,
    ) -> Result<Vec<PolicyProposal>, StoreError>;
    /// Decide a pending proposal in one transaction: mark it `status` by (iss, sub) at `at` with
    /// the gateway's `tag` over it as decided and, when applied, write `version` as the next
    /// version. `false` (nothing written): it was no longer pending, or `version` is no longer one
    /// past the newest.
    #[allow(clippy::too_many_arguments)]
    async fn policy_decide(
        &self,
        id: &str,
        status: ProposalStatus,
        decided_by: (&str, &str),
        at: UnixSecs,
        version: Option<PolicyVersion>,
        tag: &str,
    ) -> Result<bool, StoreError>;
    /// Audited agent decisions that carry an intent, at `since ..= until`, oldest first, at most
    /// `limit` (what `policy simulate` replays).
    async fn policy_history(
        &self,
        since: UnixSecs,
        until: UnixSecs,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError>;
}
