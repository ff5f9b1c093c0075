//! Policy as data, the gateway's side: the version in force on this replica (loaded at start,
//! refreshed from the store every `policy.refresh_secs`, swapped whole), and the operators'
//! lifecycle over it — read, diff, propose (a narrowing change applies at once; a widening one
//! waits for a second, distinct operator), approve, reject, roll back — and the dry run against
//! history (`domain::policy_replay`). Every change is audited as the operator's.

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;
use serde_json::Value;

use super::approvals_api::OpError;
use super::operator::internal;
use super::{Decision, Gateway, Operator};
use crate::catalogue::scopes;
use crate::clock::{UnixSecs, rfc3339};
use crate::domain::error::StoreError;
use crate::domain::ids::ProposalId;
use crate::domain::money::MoneyMap;
use crate::domain::policy_doc::{
    LivePolicy, PolicyDocument, PolicyProposal, PolicyVersion, ProposalStatus, Review, may_decide,
};
use crate::domain::policy_replay::{self, Report};

/// Who wrote a version or a proposal from the config file (its bootstrap, a changed file that only
/// narrows before any operator changed the policy, or a pending proposal of any other changed
/// file). Not an operator: its author issuer is empty (`PolicyProposal::is_unauthenticated`).
pub const CONFIG_FILE_AUTHOR: &str = "config-file";
/// Who wrote a version or a proposal with `paygate policy import`: whoever ran the command, whom
/// the gateway did not authenticate (the `--author` given is kept in the reason, as a claim).
pub const CLI_AUTHOR: &str = "cli";
/// Versions and proposals listed at most.
pub const POLICY_LISTED_MAX: u32 = 100;
/// The default window of a dry run: the last 7 days.
pub const SIMULATE_WINDOW_DEFAULT_SECS: i64 = 7 * 86_400;
/// Why a stored version is not put in force or built on: its tag does not hold.
const NOT_THE_GATEWAYS: &str =
    "its tag does not hold: the gateway did not write it (inserted or edited in the database); not in force";

/// What the gateway needs to judge policy documents.
#[derive(Debug, Clone, Default)]
pub struct PolicySettings {
    /// The dev key's issuer while the dev key is on (`dev_key_only` profiles match only it).
    pub dev_issuer: Option<String>,
    /// `approvals.high_risk_amount`: a user's own approval tier stays under it.
    pub high_risk_amount: MoneyMap,
    pub simulate_window_max_secs: i64,
    pub simulate_records_max: u32,
    /// `policy.adopt_untagged_versions`: a store with no tagged version is tagged as it stands.
    pub adopt_untagged_versions: bool,
}

/// One stored version as operators see it.
#[derive(Debug, Clone, Serialize)]
pub struct PolicyVersionView {
    pub version: i64,
    pub author: String,
    pub author_iss: String,
    pub reason: String,
    /// The second operator of a widening change.
    pub approved_by: Option<String>,
    pub proposal_id: Option<String>,
    pub created_at: String,
    pub document: Value,
    /// On this replica now.
    pub in_force: bool,
}

/// A proposal as operators see it, with what it changes against the version it was written on.
#[derive(Debug, Clone, Serialize)]
pub struct ProposalView {
    pub proposal_id: String,
    pub status: ProposalStatus,
    pub base_version: i64,
    pub author: String,
    pub reason: String,
    pub created_at: String,
    pub decided_by: Option<String>,
    pub decided_at: Option<String>,
    pub applied_version: Option<i64>,
    /// Proposed by no authenticated operator (the config file, `paygate policy import`): approving
    /// it when it widens only adopts it, and a second operator approves that.
    pub unauthenticated: bool,
    pub document: Value,
    /// What it does against the version it was written on (`widens`, `changes`, `authority`,
    /// `governance`).
    #[serde(flatten)]
    pub review: Review,
}

/// The answer to a proposed change.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeOutcome {
    /// "applied" (in force now) or "pending" (a second operator must approve it).
    pub status: &'static str,
    pub version: Option<i64>,
    pub proposal_id: Option<String>,
    /// `widens`, the named `changes`, each principal's effective change (`authority`), `governance`.
    #[serde(flatten)]
    pub review: Review,
}

/// A dry run's answer.
#[derive(Debug, Clone, Serialize)]
pub struct SimulationView {
    pub since: String,
    pub until: String,
    /// The calls read hit `policy.simulate_records_max`: a later part of the window was not read.
    pub truncated: bool,
    /// The document against the newest version: `widens`, `changes`, `authority`, `governance`.
    #[serde(flatten)]
    pub review: Review,
    #[serde(flatten)]
    pub report: Report,
}

/// What a proposal asks.
#[derive(Debug, Clone)]
pub struct ProposeArgs {
    pub document: Value,
    pub reason: Option<String>,
    /// The version the author read; the change applies only while it is the newest.
    pub base_version: Option<i64>,
}

fn json(text: &str) -> Value {
    serde_json::from_str(text).unwrap_or(Value::Null)
}

fn who(iss: &str, sub: &str) -> String {
    if iss.is_empty() { sub.to_string() } else { format!("{sub} ({iss})") }
}

/// Agents read per approver for the no-self-action check of a policy approval.
const AGENTS_FOR_USER_MAX: u32 = 1_000;

impl Gateway {
    /// The policy in force on this replica.
    pub fn policy(&self) -> Arc<LivePolicy> {
        self.policy.read().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Put `live` in force unless a newer version already is (a slow refresh never goes back).
    fn install(&self, live: LivePolicy) {
        let mut current = self.policy.write().unwrap_or_else(|p| p.into_inner());
        if live.version >= current.version {
            tracing::info!(version = live.version, "policy version in force");
            *current = Arc::new(live);
        }
    }

    fn document(&self, text: &str) -> Result<PolicyDocument, String> {
        PolicyDocument::parse(text, &self.limits.policy.high_risk_amount).map_err(|e| e.to_string())
    }

    /// What `after` does over `before`, by effective authority (`domain::policy_authority`).
    fn policy_review(&self, before: &PolicyDocument, after: &PolicyDocument) -> Review {
        crate::domain::policy_doc::review(before, after, self.limits.policy.dev_issuer.as_deref())
    }

    /// `after` over stored version `v`; a version that no longer validates under this
    /// configuration cannot be compared: everything counts as widening (fail closed).
    fn review_over(&self, v: &PolicyVersion, after: &PolicyDocument) -> Review {
        match self.document(&v.document) {
            Ok(before) => self.policy_review(&before, after),
            Err(_) => Review::unknown(),
        }
    }

    /// Whether `after` lets `op` (as an agent or as the person agents act for) do more than the
    /// version in force (`policy_authority::widens_for`). A version that no longer validates
    /// compares as widening.
    async fn widens_for_themself(&self, op: &Operator, newest: &PolicyVersion, after: &PolicyDocument) -> bool {
        let Ok(before) = self.live(newest) else { return true };
        let after = after.live(newest.version + 1, self.limits.policy.dev_issuer.as_deref());
        // The agents that have acted for this operator: their pairs are the operator's too.
        let agents = match self.store.agents_for_user(&op.subject, AGENTS_FOR_USER_MAX).await {
            Ok(a) if a.len() < AGENTS_FOR_USER_MAX as usize => a,
            // Unreadable, or more than it reads: fail closed (a colleague approves it).
            _ => return true,
        };
        crate::domain::policy_authority::widens_for(&before.profiles, &after.profiles, &op.issuer, &op.subject, &agents)
    }

    /// `v` as the policy in force, if it is a version the gateway wrote (its tag holds) and it
    /// still validates.
    fn live(&self, v: &PolicyVersion) -> Result<LivePolicy, String> {
        if !self.version_tag_holds(v) {
            return Err(NOT_THE_GATEWAYS.into());
        }
        Ok(self.document(&v.document)?.live(v.version, self.limits.policy.dev_issuer.as_deref()))
    }

    /// At start: the config file meets the store's versions. An empty store takes the file as
    /// version 1 (the baseline). After that a file that differs from the newest version is never
    /// applied silently: it is the next version only when it narrows (by effective authority)
    /// and no operator has changed the policy since the file last set it; otherwise it becomes a
    /// pending proposal by "config-file" (once per document and base version), which operators
    /// decide like any other — one that widens needs two distinct operators, since the file is
    /// nobody's word — and the store's version stays in force.
    pub async fn load_policy(&self, file: &PolicyDocument) -> Result<i64, String> {
        let _one = self.policy_lock.lock().await;
        self.adopt_version_tags().await?;
        let head = self.store.policy_head().await.map_err(|e| e.to_string())?;
        if let Some(why) = self.policy_rolled_back(head).await? {
            return Err(why);
        }
        let text = file.canonical();
        loop {
            let head = self.store.policy_head().await.map_err(|e| e.to_string())?;
            let latest = match head {
                0 => None,
                v => Some(
                    self.store
                        .policy_version(v)
                        .await
                        .map_err(|e| e.to_string())?
                        .ok_or("a policy version vanished")?,
                ),
            };
            let write = match &latest {
                None => Some("bootstrap from the config file"),
                Some(v) if v.document == text => None,
                Some(v) => {
                    let current = self
                        .document(&v.document)
                        .map_err(|e| format!("policy version {} is invalid: {e}", v.version))?;
                    let file_set_it = v.author_sub == CONFIG_FILE_AUTHOR && v.author_iss.is_empty();
                    if file_set_it && !self.policy_review(&current, file).widens {
                        Some("the config file's [policy] or [tools] changed (it only narrows)")
                    } else {
                        self.propose_file(v, &text).await?;
                        None
                    }
                }
            };
            let Some(reason) = write else {
                let v = latest.ok_or("no policy version")?;
                let live = self.live(&v).map_err(|e| format!("policy version {} is invalid: {e}", v.version))?;
                self.install(live);
                return Ok(v.version);
            };
            let v = self.tag_version(PolicyVersion {
                version: head + 1,
                document: text.clone(),
                author_iss: String::new(),
                author_sub: CONFIG_FILE_AUTHOR.into(),
                reason: reason.into(),
                approver_iss: String::new(),
                approver_sub: String::new(),
                proposal_id: None,
                created_at: self.clock.now(),
                tag: None,
            });
            // `false`: another replica wrote first; read again.
            self.store.policy_append(v).await.map_err(|e| e.to_string())?;
        }
    }

    /// The config file differs from version `v` and may not apply by itself: a pending proposal
    /// by "config-file" on `v`, unless one with this document on `v` is pending already.
    async fn propose_file(&self, v: &PolicyVersion, text: &str) -> Result<(), String> {
        let pending = self
            .store
            .policy_proposals(Some(ProposalStatus::Pending), POLICY_LISTED_MAX)
            .await
            .map_err(|e| e.to_string())?;
        let same = |p: &PolicyProposal| {
            p.document == text
                && p.base_version == v.version
                && p.author_sub == CONFIG_FILE_AUTHOR
                && p.is_unauthenticated()
        };
        let id = match pending.iter().find(|p| same(p)) {
            Some(p) => p.id.clone(),
            None => {
                let id = ProposalId::generate().as_str().to_string();
                let p = self.tag_proposal(PolicyProposal {
                    id: id.clone(),
                    base_version: v.version,
                    document: text.to_string(),
                    author_iss: String::new(),
                    author_sub: CONFIG_FILE_AUTHOR.into(),
                    reason: "the config file's [policy] or [tools] differ from the version in force".into(),
                    created_at: self.clock.now(),
                    status: ProposalStatus::Pending,
                    decided_iss: None,
                    decided_sub: None,
                    decided_at: None,
                    applied_version: None,
                    tag: None,
                });
                self.store.policy_propose(p).await.map_err(|e| e.to_string())?;
                id
            }
        };
        tracing::warn!(
            version = v.version,
            author = %v.author_sub,
            proposal.id = %id,
            "the config file's [policy] or [tools] differ from the version in force and were not applied: they wait \
             as a proposal for operators (one that widens needs two)"
        );
        Ok(())
    }

    /// Put the store's newest version in force if it is newer than this replica's (every
    /// `policy.refresh_secs`). A version that no longer validates is logged and skipped: the
    /// replica keeps judging under the one it has.
    pub async fn refresh_policy(&self) -> Result<i64, StoreError> {
        let head = self.store.policy_head().await?;
        if head < self.policy().version {
            tracing::error!(
                store = head,
                in_force = self.policy().version,
                "the store's newest policy version is older than the one in force: versions were deleted in the \
                 database (policy rolled back); this replica keeps the one it has"
            );
        }
        if head <= self.policy().version {
            return Ok(head);
        }
        let _one = self.policy_lock.lock().await;
        if let Some(v) = self.store.policy_version(head).await? {
            match self.live(&v) {
                Ok(live) => self.install(live),
                Err(error) => tracing::error!(version = v.version, %error, "policy version is invalid; not applied"),
            }
        }
        Ok(head)
    }

    fn version_view(&self, v: PolicyVersion) -> PolicyVersionView {
        PolicyVersionView {
            in_force: v.version == self.policy().version,
            version: v.version,
            author: v.author_sub,
            author_iss: v.author_iss,
            reason: v.reason,
            approved_by: (!v.approver_sub.is_empty()).then(|| who(&v.approver_iss, &v.approver_sub)),
            proposal_id: v.proposal_id,
            created_at: rfc3339(v.created_at),
            document: json(&v.document),
        }
    }

    async fn stored_version(&self, version: i64) -> Result<PolicyVersion, OpError> {
        self.store
            .policy_version(version)
            .await
            .map_err(internal("policy read"))?
            .ok_or(OpError::missing("policy version"))
    }

    /// The newest version, which every change builds on: one the gateway did not write is a
    /// conflict (nothing is built on it; restore the store).
    async fn newest(&self) -> Result<PolicyVersion, OpError> {
        let head = self.store.policy_head().await.map_err(internal("policy read"))?;
        // Nothing is built on a store rolled back under this replica (versions deleted). The trail's
        // check (`policy_rolled_back`, a scan of the records) runs at start, not on every request:
        // a replica running is at or past what the trail named when it started.
        let in_force = self.policy().version;
        if head < in_force {
            return Err(OpError::conflict(format!(
                "the store's newest policy version is {head}, older than version {in_force} in force here: versions \
                 were deleted in the database (policy rolled back); restore them"
            )));
        }
        let v = self.stored_version(head).await?;
        if !self.version_tag_holds(&v) {
            return Err(OpError::conflict(format!("policy version {}: {NOT_THE_GATEWAYS}", v.version)));
        }
        Ok(v)
    }

    /// The newest version (what every replica is, or within `policy.refresh_secs` will be, under).
    pub async fn ops_policy(&self, op: &Operator) -> Result<PolicyVersionView, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        Ok(self.version_view(self.newest().await?))
    }

    pub async fn ops_policy_versions(&self, op: &Operator) -> Result<Vec<PolicyVersionView>, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        let all = self.store.policy_versions(POLICY_LISTED_MAX).await.map_err(internal("policy read"))?;
        Ok(all.into_iter().map(|v| self.version_view(v)).collect())
    }

    pub async fn ops_policy_version(&self, op: &Operator, version: i64) -> Result<PolicyVersionView, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        Ok(self.version_view(self.stored_version(version).await?))
    }

    /// What changes from version `from` to version `to`: each difference named, each principal's
    /// effective change, and whether it widens.
    pub async fn ops_policy_diff(&self, op: &Operator, from: i64, to: i64) -> Result<Review, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        let (a, b) = (self.stored_version(from).await?, self.stored_version(to).await?);
        let (a, b) = (self.document(&a.document), self.document(&b.document));
        match (a, b) {
            (Ok(a), Ok(b)) => Ok(self.policy_review(&a, &b)),
            _ => Err(OpError::conflict("a stored version no longer validates under this configuration".into())),
        }
    }

    fn proposed_document(&self, document: &Value) -> Result<PolicyDocument, OpError> {
        let text = serde_json::to_string(document).map_err(|_| OpError::invalid("document is not JSON".into()))?;
        self.document(&text).map_err(|e| OpError::invalid(format!("document: {e}")))
    }

    /// Propose a change. One that only narrows (a limit lowered, a tool disabled, an account taken
    /// away) applies at once; one that widens waits for a second operator.
    pub async fn ops_policy_propose(&self, op: &Operator, args: ProposeArgs) -> Result<ChangeOutcome, OpError> {
        self.require_op(op, &[scopes::ADMIN])?;
        let reason = required_reason(args.reason)?;
        let doc = self.proposed_document(&args.document)?;
        self.propose(op, doc, reason, args.base_version, "policy.propose").await
    }

    /// Propose going back to version `version` (the same rule: back to a wider one waits).
    pub async fn ops_policy_rollback(
        &self,
        op: &Operator,
        version: i64,
        reason: Option<String>,
        base_version: Option<i64>,
    ) -> Result<ChangeOutcome, OpError> {
        self.require_op(op, &[scopes::ADMIN])?;
        if version < 1 {
            return Err(OpError::invalid("version: the policy version to go back to (a whole number from 1)".into()));
        }
        let reason = required_reason(reason)?;
        let old = self.stored_version(version).await?;
        if !self.version_tag_holds(&old) {
            return Err(OpError::conflict(format!("policy version {version}: {NOT_THE_GATEWAYS}")));
        }
        let doc = self
            .document(&old.document)
            .map_err(|e| OpError::conflict(format!("version {version} no longer validates: {e}")))?;
        self.propose(op, doc, format!("roll back to version {version}: {reason}"), base_version, "policy.rollback")
            .await
    }

    async fn propose(
        &self,
        op: &Operator,
        doc: PolicyDocument,
        reason: String,
        base_version: Option<i64>,
        tool: &'static str,
    ) -> Result<ChangeOutcome, OpError> {
        let _one = self.policy_lock.lock().await;
        let newest = self.newest().await?;
        if let Some(base) = base_version
            && base != newest.version
        {
            return Err(stale(base, newest.version));
        }
        let current = self
            .document(&newest.document)
            .map_err(|e| OpError::conflict(format!("the version in force no longer validates: {e}")))?;
        let text = doc.canonical();
        if text == newest.document {
            return Err(OpError::conflict(format!(
                "the document is version {} as it stands: nothing to change",
                newest.version
            )));
        }
        let review = self.policy_review(&current, &doc);
        let now = self.clock.now();
        if review.widens {
            let id = ProposalId::generate().as_str().to_string();
            let p = self.tag_proposal(PolicyProposal {
                id: id.clone(),
                base_version: newest.version,
                document: text,
                author_iss: op.issuer.clone(),
                author_sub: op.subject.clone(),
                reason: reason.clone(),
                created_at: now,
                status: ProposalStatus::Pending,
                decided_iss: None,
                decided_sub: None,
                decided_at: None,
                applied_version: None,
                tag: None,
            });
            self.store.policy_propose(p).await.map_err(internal("policy propose"))?;
            let mut d = Decision::new(tool, "proposed");
            d.detail = Some(format!("{id} on version {}: {reason}", newest.version));
            self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
            return Ok(ChangeOutcome { status: "pending", version: None, proposal_id: Some(id), review });
        }
        let v = self.tag_version(PolicyVersion {
            version: newest.version + 1,
            document: text,
            author_iss: op.issuer.clone(),
            author_sub: op.subject.clone(),
            reason: reason.clone(),
            approver_iss: String::new(),
            approver_sub: String::new(),
            proposal_id: None,
            created_at: now,
            tag: None,
        });
        let live = doc.live(v.version, self.limits.policy.dev_issuer.as_deref());
        let version = v.version;
        if !self.store.policy_append(v).await.map_err(internal("policy append"))? {
            return Err(stale(newest.version, newest.version + 1));
        }
        self.install(live);
        let mut d = Decision::new(tool, "applied");
        d.detail = Some(format!("version {version} (narrows): {reason}"));
        self.audit_policy_applied(op, d, version).await;
        Ok(ChangeOutcome { status: "applied", version: Some(version), proposal_id: None, review })
    }

    async fn pending(&self, id: &str) -> Result<PolicyProposal, OpError> {
        let p = self.store.policy_proposal(id).await.map_err(internal("policy read"))?;
        let p = p.ok_or(OpError::missing("policy proposal"))?;
        if p.status != ProposalStatus::Pending {
            return Err(OpError::conflict(format!("this proposal is {} already", p.status.as_str())));
        }
        if !self.proposal_tag_holds(&p) {
            return Err(OpError::conflict(format!(
                "policy proposal {}: its tag does not hold: the gateway did not write it (inserted, or its author \
                 rewritten, in the database); it cannot be decided",
                p.id
            )));
        }
        Ok(p)
    }

    /// A second operator approves a widening change: it applies, while the version it was written
    /// on is still the newest.
    pub async fn ops_policy_approve(&self, op: &Operator, id: &str) -> Result<ChangeOutcome, OpError> {
        self.require_op(op, &[scopes::ADMIN])?;
        let _one = self.policy_lock.lock().await;
        let p = self.pending(id).await?;
        if !may_decide(&p, &op.subject) {
            return Err(OpError::self_review(
                "a change that widens policy needs a second operator: its author cannot approve it".into(),
            ));
        }
        let newest = self.newest().await?;
        if newest.version != p.base_version {
            return Err(stale(p.base_version, newest.version));
        }
        let doc = self
            .document(&p.document)
            .map_err(|e| OpError::conflict(format!("the proposal no longer validates: {e}")))?;
        let review = self.review_over(&newest, &doc);
        if review.widens && self.widens_for_themself(op, &newest, &doc).await {
            // No principal acts on itself: what widens the approver's own authority (or that of
            // an agent acting for them) is a colleague's to approve.
            return Err(OpError::self_review(
                "this change widens what you, or an agent acting for you, may do: another operator approves it".into(),
            ));
        }
        if p.is_unauthenticated() && review.widens {
            // Nobody authenticated wrote it: this operator is its first pair of eyes, not its second.
            return self.adopt(op, p, review).await;
        }
        let v = self.tag_version(PolicyVersion {
            version: newest.version + 1,
            document: p.document.clone(),
            author_iss: p.author_iss.clone(),
            author_sub: p.author_sub.clone(),
            reason: p.reason.clone(),
            approver_iss: op.issuer.clone(),
            approver_sub: op.subject.clone(),
            proposal_id: Some(p.id.clone()),
            created_at: self.clock.now(),
            tag: None,
        });
        let version = v.version;
        let live = doc.live(version, self.limits.policy.dev_issuer.as_deref());
        let by = (op.issuer.as_str(), op.subject.as_str());
        let at = self.clock.now();
        let tag = self.decided_tag(&p, ProposalStatus::Applied, by, at, Some(version));
        let decided = self
            .store
            .policy_decide(&p.id, ProposalStatus::Applied, by, at, Some(v), &tag)
            .await
            .map_err(internal("policy decide"))?;
        if !decided {
            return Err(OpError::conflict("the policy or the proposal changed meanwhile: read it again".into()));
        }
        self.install(live);
        let mut d = Decision::new("policy.approve", "applied");
        d.detail = Some(format!("{} as version {version} (by {})", p.id, who(&p.author_iss, &p.author_sub)));
        self.audit_policy_applied(op, d, version).await;
        Ok(ChangeOutcome { status: "applied", version: Some(version), proposal_id: Some(p.id), review })
    }

    /// Close a pending proposal as rejected by `op` (rejected, or taken up as their own); a
    /// proposal someone decided meanwhile is a conflict.
    async fn close_rejected(&self, op: &Operator, id: &str) -> Result<(), OpError> {
        let by = (op.issuer.as_str(), op.subject.as_str());
        let at = self.clock.now();
        let p = self.pending(id).await?;
        let tag = self.decided_tag(&p, ProposalStatus::Rejected, by, at, None);
        let closed = self
            .store
            .policy_decide(id, ProposalStatus::Rejected, by, at, None, &tag)
            .await
            .map_err(internal("policy decide"))?;
        if !closed {
            return Err(OpError::conflict("this proposal was decided meanwhile".into()));
        }
        Ok(())
    }

    /// An operator takes up a widening proposal nobody authenticated wrote (the config file,
    /// `paygate policy import`): it is closed (decided by them) and proposed again as theirs, on
    /// the same version, so a second, distinct operator must approve it.
    async fn adopt(&self, op: &Operator, p: PolicyProposal, review: Review) -> Result<ChangeOutcome, OpError> {
        self.close_rejected(op, &p.id).await?;
        let id = ProposalId::generate().as_str().to_string();
        let reason = format!("adopts {} by {}: {}", p.id, p.author_sub, p.reason);
        let adopted = self.tag_proposal(PolicyProposal {
            id: id.clone(),
            base_version: p.base_version,
            document: p.document,
            author_iss: op.issuer.clone(),
            author_sub: op.subject.clone(),
            reason: reason.chars().take(500).collect(),
            created_at: self.clock.now(),
            status: ProposalStatus::Pending,
            decided_iss: None,
            decided_sub: None,
            decided_at: None,
            applied_version: None,
            tag: None,
        });
        self.store.policy_propose(adopted).await.map_err(internal("policy propose"))?;
        let mut d = Decision::new("policy.adopt", "proposed");
        d.detail = Some(format!("{id} adopts {} (by {}) on version {}", p.id, p.author_sub, p.base_version));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        Ok(ChangeOutcome { status: "pending", version: None, proposal_id: Some(id), review })
    }

    /// `paygate policy import`: a file's document proposed by whoever runs the command, whom the
    /// gateway did not authenticate. The proposal's author is "cli" (no issuer); `claimed_author`
    /// is kept in the reason as a claim. It applies at once only when it narrows; one that widens
    /// waits for operators — the first to approve it adopts it, a second approves that.
    pub async fn import_policy(
        &self,
        document: &Value,
        claimed_author: &str,
        reason: &str,
    ) -> Result<ChangeOutcome, OpError> {
        let reason = required_reason(Some(format!(
            "{reason} (paygate policy import; --author {claimed_author:?}, not verified)"
        )))?;
        let doc = self.proposed_document(document)?;
        let cli = Operator {
            issuer: String::new(),
            subject: CLI_AUTHOR.into(),
            scopes: Default::default(),
            correlation_id: "cli".into(),
        };
        self.propose(&cli, doc, reason, None, "policy.import").await
    }

    /// Reject (or, by its author, withdraw) a pending proposal.
    pub async fn ops_policy_reject(
        &self,
        op: &Operator,
        id: &str,
        reason: Option<String>,
    ) -> Result<ProposalView, OpError> {
        self.require_op(op, &[scopes::ADMIN])?;
        let reason = super::reviews::reason_text(reason)?;
        let p = self.pending(id).await?;
        self.close_rejected(op, &p.id).await?;
        let mut d = Decision::new("policy.reject", "recorded");
        d.detail = Some(match reason {
            Some(r) => format!("{}: {r}", p.id),
            None => p.id.clone(),
        });
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        self.ops_policy_proposal(op, id).await
    }

    pub async fn ops_policy_proposal(&self, op: &Operator, id: &str) -> Result<ProposalView, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        let p = self.store.policy_proposal(id).await.map_err(internal("policy read"))?;
        let p = p.ok_or(OpError::missing("policy proposal"))?;
        Ok(self.proposal_view(p).await)
    }

    pub async fn ops_policy_proposals(
        &self,
        op: &Operator,
        status: Option<&str>,
    ) -> Result<Vec<ProposalView>, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        let status =
            match status {
                None => None,
                Some(s) => Some(ProposalStatus::parse(s).ok_or_else(|| {
                    OpError::invalid(format!("status must be pending, applied or rejected, got {s:?}"))
                })?),
            };
        let all = self.store.policy_proposals(status, POLICY_LISTED_MAX).await.map_err(internal("policy read"))?;
        let mut views = Vec::with_capacity(all.len());
        for p in all {
            views.push(self.proposal_view(p).await);
        }
        Ok(views)
    }

    async fn proposal_view(&self, p: PolicyProposal) -> ProposalView {
        let base = self.store.policy_version(p.base_version).await.ok().flatten();
        let review = match (base.map(|b| self.document(&b.document)), self.document(&p.document)) {
            (Some(Ok(b)), Ok(d)) => self.policy_review(&b, &d),
            // Not comparable any more: shown as widening (fail closed).
            _ => Review::unknown(),
        };
        let unauthenticated = p.is_unauthenticated();
        ProposalView {
            proposal_id: p.id,
            status: p.status,
            base_version: p.base_version,
            author: who(&p.author_iss, &p.author_sub),
            reason: p.reason,
            created_at: rfc3339(p.created_at),
            decided_by: p.decided_sub.as_deref().map(|s| who(p.decided_iss.as_deref().unwrap_or(""), s)),
            decided_at: p.decided_at.map(rfc3339),
            applied_version: p.applied_version,
            unauthenticated,
            document: json(&p.document),
            review,
        }
    }

    /// The dry run: the audited money calls of `since ..= until` (default the last 7 days, at most
    /// `policy.simulate_window_max_secs`) replayed under their own versions and under `document`.
    /// Writes nothing.
    pub async fn ops_policy_simulate(
        &self,
        op: &Operator,
        document: &Value,
        since: Option<&str>,
        until: Option<&str>,
    ) -> Result<SimulationView, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        let doc = self.proposed_document(document)?;
        let now = self.clock.now();
        let instant = |field: &str, s: Option<&str>| -> Result<Option<UnixSecs>, OpError> {
            s.filter(|s| !s.is_empty())
                .map(|s| super::windows::parse_instant(field, s, until_end(field)).map_err(OpError::from))
                .transpose()
        };
        let until = instant("until", until)?.unwrap_or(now);
        let since = instant("since", since)?.unwrap_or(until - SIMULATE_WINDOW_DEFAULT_SECS);
        if since > until {
            return Err(OpError::invalid("since must not be after until".into()));
        }
        let max = self.limits.policy.simulate_window_max_secs;
        if until - since > max {
            return Err(OpError::invalid(format!(
                "the window is at most {max} seconds (policy.simulate_window_max_secs)"
            )));
        }
        let limit = self.limits.policy.simulate_records_max;
        let history = self.store.policy_history(since, until, limit).await.map_err(internal("policy history"))?;
        let mut versions: HashMap<i64, Option<LivePolicy>> = HashMap::new();
        for rec in &history {
            if let Some(v) = rec.policy_version
                && !versions.contains_key(&v)
            {
                let stored = self.store.policy_version(v).await.map_err(internal("policy read"))?;
                versions.insert(v, stored.and_then(|s| self.live(&s).ok()));
            }
        }
        let proposed = doc.live(0, self.limits.policy.dev_issuer.as_deref());
        let report = policy_replay::simulate(&history, |v| versions.get(&v).and_then(Option::as_ref), &proposed);
        let newest = self.newest().await?;
        Ok(SimulationView {
            since: rfc3339(since),
            until: rfc3339(until),
            truncated: history.len() as u64 >= u64::from(limit),
            review: self.review_over(&newest, &doc),
            report,
        })
    }
}

/// A bare date for `until` means the end of that day.
fn until_end(field: &str) -> bool {
    field == "until"
}

fn stale(base: i64, newest: i64) -> OpError {
    OpError::conflict(format!(
        "the policy changed since version {base} (version {newest} is the newest): read it again and propose anew"
    ))
}

/// Every change says why (1-500 characters).
fn required_reason(reason: Option<String>) -> Result<String, OpError> {
    match super::reviews::reason_text(reason)? {
        Some(r) if !r.trim().is_empty() && !r.chars().any(char::is_control) => Ok(r),
        _ => Err(OpError::invalid("a policy change needs a reason (1-500 characters, no control characters)".into())),
    }
}
