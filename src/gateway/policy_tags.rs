//! Policy versions carry the gateway's tag (`audit_chain::row_tag` under the audit link key, over
//! every field of the version), so a version a database writer inserted or edited is never put in
//! force: a replica keeps judging under the version it has, logs the error, and refuses policy
//! changes on top of it. Versions written before tags existed are adopted only when the operator
//! asks (`policy.adopt_untagged_versions`), once, and the adoption is recorded in the trail
//! (`policy.adopt_tags`): a store with no tagged version does not start otherwise, so stripping
//! every tag does not make a forged version look old. Proposals carry
//! one over what their author wrote: one inserted, or whose author was rewritten, in the database
//! is never decided (its author is who the four-eyes rule keeps from approving it).

use super::Gateway;
use crate::domain::audit_chain::{row_tag, row_tag_holds};
use crate::domain::policy_doc::{
    PROPOSAL_TAG_DOMAIN, PolicyProposal, PolicyVersion, ProposalStatus, VERSION_TAG_DOMAIN,
};

/// The trail's record of the one adoption of untagged versions.
pub const ADOPT_TAGS_TOOL: &str = "policy.adopt_tags";
/// Versions read for the adoption (a store has far fewer).
const ADOPT_MAX: u32 = 1_000_000;

impl Gateway {
    /// `v` with the gateway's tag (set after its last change, as it is handed to the store).
    pub(super) fn tag_version(&self, mut v: PolicyVersion) -> PolicyVersion {
        let nonce = crate::domain::ids::hex(&rand::random::<[u8; 8]>());
        v.tag = Some(row_tag(&self.audit_link_key, VERSION_TAG_DOMAIN, &v.tag_fields(), &nonce));
        v
    }

    /// `p` with the gateway's tag over what its author wrote.
    pub(super) fn tag_proposal(&self, mut p: PolicyProposal) -> PolicyProposal {
        let nonce = crate::domain::ids::hex(&rand::random::<[u8; 8]>());
        p.tag = Some(row_tag(&self.audit_link_key, PROPOSAL_TAG_DOMAIN, &p.tag_fields(), &nonce));
        p
    }

    /// The tag of `p` as decided: `status` by `by` at `at` (applied as `version`).
    pub(super) fn decided_tag(
        &self,
        p: &PolicyProposal,
        status: ProposalStatus,
        by: (&str, &str),
        at: crate::clock::UnixSecs,
        version: Option<i64>,
    ) -> String {
        let decided = PolicyProposal {
            status,
            decided_iss: Some(by.0.to_string()),
            decided_sub: Some(by.1.to_string()),
            decided_at: Some(at),
            applied_version: version,
            ..p.clone()
        };
        self.tag_proposal(decided).tag.unwrap_or_default()
    }

    /// Whether `p` is a proposal the gateway wrote, unchanged since (author and standing).
    pub(super) fn proposal_tag_holds(&self, p: &PolicyProposal) -> bool {
        p.tag.as_deref().is_some_and(|t| row_tag_holds(&self.audit_link_key, PROPOSAL_TAG_DOMAIN, &p.tag_fields(), t))
    }

    /// Whether `v` is a version the gateway wrote, unchanged since.
    pub(super) fn version_tag_holds(&self, v: &PolicyVersion) -> bool {
        v.tag.as_deref().is_some_and(|t| row_tag_holds(&self.audit_link_key, VERSION_TAG_DOMAIN, &v.tag_fields(), t))
    }

    /// Record a policy change applied as `version`: the record names the version
    /// (`policy_version`), so a store whose versions end before it is named as rolled back.
    pub(super) async fn audit_policy_applied(&self, op: &super::Operator, d: super::Decision<'_>, version: i64) {
        self.metrics.decision(d.tool, d.decision, None);
        let mut rec = self.audit_record(&op.issuer, &op.subject, &op.correlation_id, d);
        rec.policy_version = Some(version);
        self.append_audit(rec).await
    }

    /// Why the store's newest version (`head`) is older than one the trail names — a change
    /// applied, or a call judged under it — (versions deleted in the database: policy rolled back),
    /// or `None`.
    pub(super) async fn policy_rolled_back(&self, head: i64) -> Result<Option<String>, String> {
        let named = self.store.audit_policy_version_max().await.map_err(|e| e.to_string())?;
        Ok(named.filter(|n| *n > head).map(|n| {
            format!(
                "the audit trail names policy version {n}, but the store's newest is {head}: versions were deleted in \
                 the database (policy rolled back); restore them"
            )
        }))
    }

    /// At start: a store whose versions carry no tag at all is refused, unless the operator asked
    /// (`policy.adopt_untagged_versions`) and the trail records no earlier adoption; then its
    /// versions and pending proposals are tagged as they stand, and the adoption recorded. Never
    /// unasked: "no tag anywhere and no adoption recorded" is also what a database writer who
    /// strips every tag and deletes the record leaves, with a forged version among them.
    pub(super) async fn adopt_version_tags(&self) -> Result<(), String> {
        // The versions first (a small table): once one is tagged, no start reads the trail here.
        let versions = self.store.policy_versions(ADOPT_MAX).await.map_err(|e| e.to_string())?;
        if versions.is_empty() || versions.iter().any(|v| v.tag.is_some()) {
            if self.limits.policy.adopt_untagged_versions && !versions.is_empty() {
                tracing::warn!(
                    "policy.adopt_untagged_versions is on, and the store's versions are tagged: turn it off"
                );
            }
            return Ok(());
        }
        let earlier = self.store.audit_first_of_tool(ADOPT_TAGS_TOOL).await.map_err(|e| e.to_string())?;
        if let Some((seq, _)) = earlier {
            return Err(format!(
                "no policy version in the store carries the gateway's tag, yet they were adopted before (audit \
                 record seq {seq}): the tags were stripped in the database since; this store is not adopted again"
            ));
        }
        // A store that has run a gateway that tags (its audit records carry tags: records and
        // versions were tagged together from then on) was never a store from before tags.
        if self.store.audit_tagged_era().await.map_err(|e| e.to_string())? {
            return Err(
                "no policy version in the store carries the gateway's tag, yet its audit records do: the versions \
                 were stripped (or inserted) in the database; this store is never adopted — restore the versions \
                 from a backup"
                    .into(),
            );
        }
        if !self.limits.policy.adopt_untagged_versions {
            return Err(format!(
                "the store's {} policy versions carry no tag: written before versions were tagged (an upgrade), or \
                 in the database by someone other than the gateway. Check policy_versions (author, approver, \
                 document) against what your operators decided, then start once with \
                 policy.adopt_untagged_versions = true (PAYGATE_POLICY__ADOPT_UNTAGGED_VERSIONS=true) to tag them as \
                 they stand",
                versions.len()
            ));
        }
        // Asked: only over a trail that verifies, so the adoption's own record (or any other) was
        // not deleted or edited to make this look like the first time.
        match self.verify_audit(None).await {
            // A trail sealed with keyed links was sealed by a gateway that tagged every version it
            // wrote: with every tag gone (records' too), the tags were stripped in the database.
            Ok(v) if v.ok && v.keyed => {
                return Err(
                    "no policy version in the store carries the gateway's tag, yet its audit trail is sealed with \
                     the gateway's keyed links (made only by gateways that tag): the tags were stripped in the \
                     database; this store is never adopted — restore the versions from a backup"
                        .into(),
                );
            }
            Ok(v) if v.ok => {
                // Records before tags were sealed by the builds that wrote them; an unsealed one
                // without a tag is one stripped, the chain with it (the eleventh review).
                if let Some(seq) =
                    crate::audit_chain::first_untagged_unsealed(&*self.store).await.map_err(|e| e.to_string())?
                {
                    return Err(format!(
                        "untagged policy versions are adopted only over a trail whose unsealed records carry their \
                         writer's tag; record seq {seq} carries none (stripped in the database): this store is not \
                         adopted"
                    ));
                }
            }
            Ok(v) => {
                let why = v.first_break.map(|b| b.reason).unwrap_or_default();
                return Err(format!("untagged policy versions are adopted only over a trail that verifies: {why}"));
            }
            Err(e) => return Err(format!("untagged policy versions are adopted only over a trail that verifies: {e}")),
        }
        let tags: Vec<(i64, String)> =
            versions.into_iter().filter_map(|v| Some((v.version, self.tag_version(v).tag?))).collect();
        let adopted = tags.len();
        self.store.policy_adopt_tags(tags).await.map_err(|e| e.to_string())?;
        // Pending proposals too (decided ones are never decided again).
        let pending =
            self.store.policy_proposals(Some(ProposalStatus::Pending), ADOPT_MAX).await.map_err(|e| e.to_string())?;
        let tags: Vec<(String, String)> =
            pending.into_iter().filter_map(|p| Some((p.id.clone(), self.tag_proposal(p).tag?))).collect();
        self.store.policy_adopt_proposal_tags(tags).await.map_err(|e| e.to_string())?;
        let mut d = super::Decision::new(ADOPT_TAGS_TOOL, "recorded");
        d.detail = Some(format!(
            "{adopted} policy versions written before versions were tagged, tagged as they stood \
             (policy.adopt_untagged_versions)"
        ));
        self.audit_as(super::rails::GATEWAY_ISSUER, "gateway", "-", d).await;
        // Sealed at once: the adoption's record deleted or edited later breaks the chain, so no
        // later adoption (which needs a trail that verifies) can follow it.
        let (store, now, batch) = (&*self.store, self.clock.now(), self.limits.audit_seal_batch_max);
        crate::audit_chain::seal(store, &self.audit_sealer(), now, batch)
            .await
            .map_err(|e| format!("the adoption's audit record could not be sealed: {e}"))?;
        // (Never none: a store without versions returned above.)
        tracing::info!(versions = adopted, "policy versions written before versions were tagged: tagged as they stood");
        Ok(())
    }
}
