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
    Change, LivePolicy, PolicyDocument, PolicyProposal, PolicyVersion, ProposalStatus, changes, may_decide,
};
use crate::domain::policy_replay::{self, Report};

/// Who wrote a version from the config file (its bootstrap, or a changed file before any operator
/// changed the policy).
pub const CONFIG_FILE_AUTHOR: &str = "config-file";
/// Versions and proposals listed at most.
pub const POLICY_LISTED_MAX: u32 = 100;
/// The default window of a dry run: the last 7 days.
pub const SIMULATE_WINDOW_DEFAULT_SECS: i64 = 7 * 86_400;

/// What the gateway needs to judge policy documents.
#[derive(Debug, Clone, Default)]
pub struct PolicySettings {
    /// The dev key's issuer while the dev key is on (`dev_key_only` profiles match only it).
    pub dev_issuer: Option<String>,
    /// `approvals.high_risk_amount`: a user's own approval tier stays under it.
    pub high_risk_amount: MoneyMap,
    pub simulate_window_max_secs: i64,
    pub simulate_records_max: u32,
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
    pub document: Value,
    pub changes: Vec<Change>,
}

/// The answer to a proposed change.
#[derive(Debug, Clone, Serialize)]
pub struct ChangeOutcome {
    /// "applied" (in force now) or "pending" (a second operator must approve it).
    pub status: &'static str,
    pub version: Option<i64>,
    pub proposal_id: Option<String>,
    pub widens: bool,
    pub changes: Vec<Change>,
}

/// A dry run's answer.
#[derive(Debug, Clone, Serialize)]
pub struct SimulationView {
    pub since: String,
    pub until: String,
    /// The calls read hit `policy.simulate_records_max`: a later part of the window was not read.
    pub truncated: bool,
    pub changes: Vec<Change>,
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

    fn live(&self, v: &PolicyVersion) -> Result<LivePolicy, String> {
        Ok(self.document(&v.document)?.live(v.version, self.limits.policy.dev_issuer.as_deref()))
    }

    /// At start: the store's newest version, after writing the config file's policy as version 1
    /// of an empty store, or as the next version when the file changed and no operator has changed
    /// the policy since the file last set it. When an operator has, the store's stands and the
    /// difference is logged (`paygate policy import` applies a file).
    pub async fn load_policy(&self, file: &PolicyDocument) -> Result<i64, String> {
        let _one = self.policy_lock.lock().await;
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
                Some(v) if v.author_sub == CONFIG_FILE_AUTHOR && v.author_iss.is_empty() => {
                    Some("the config file's [policy] or [tools] changed")
                }
                Some(v) => {
                    tracing::warn!(
                        version = v.version,
                        author = %v.author_sub,
                        "the config file's [policy] or [tools] differ from the version in force, which an operator \
                         wrote: the store's version stands (`paygate policy import` applies a file)"
                    );
                    None
                }
            };
            let Some(reason) = write else {
                let v = latest.ok_or("no policy version")?;
                let live = self.live(&v).map_err(|e| format!("policy version {} is invalid: {e}", v.version))?;
                self.install(live);
                return Ok(v.version);
            };
            let v = PolicyVersion {
                version: head + 1,
                document: text.clone(),
                author_iss: String::new(),
                author_sub: CONFIG_FILE_AUTHOR.into(),
                reason: reason.into(),
                approver_iss: String::new(),
                approver_sub: String::new(),
                proposal_id: None,
                created_at: self.clock.now(),
            };
            // `false`: another replica wrote first; read again.
            self.store.policy_append(v).await.map_err(|e| e.to_string())?;
        }
    }

    /// Put the store's newest version in force if it is newer than this replica's (every
    /// `policy.refresh_secs`). A version that no longer validates is logged and skipped: the
    /// replica keeps judging under the one it has.
    pub async fn refresh_policy(&self) -> Result<i64, StoreError> {
        let head = self.store.policy_head().await?;
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

    async fn newest(&self) -> Result<PolicyVersion, OpError> {
        let head = self.store.policy_head().await.map_err(internal("policy read"))?;
        self.stored_version(head).await
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

    /// What changes from version `from` to version `to`, each difference marked widening or not.
    pub async fn ops_policy_diff(&self, op: &Operator, from: i64, to: i64) -> Result<Vec<Change>, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        let (a, b) = (self.stored_version(from).await?, self.stored_version(to).await?);
        let (a, b) = (self.document(&a.document), self.document(&b.document));
        match (a, b) {
            (Ok(a), Ok(b)) => Ok(changes(&a, &b)),
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
        let list = changes(&current, &doc);
        let widens = list.iter().any(|c| c.widens);
        let now = self.clock.now();
        if widens {
            let id = ProposalId::generate().as_str().to_string();
            let p = PolicyProposal {
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
            };
            self.store.policy_propose(p).await.map_err(internal("policy propose"))?;
            let mut d = Decision::new(tool, "proposed");
            d.detail = Some(format!("{id} on version {}: {reason}", newest.version));
            self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
            return Ok(ChangeOutcome {
                status: "pending",
                version: None,
                proposal_id: Some(id),
                widens,
                changes: list,
            });
        }
        let v = PolicyVersion {
            version: newest.version + 1,
            document: text,
            author_iss: op.issuer.clone(),
            author_sub: op.subject.clone(),
            reason: reason.clone(),
            approver_iss: String::new(),
            approver_sub: String::new(),
            proposal_id: None,
            created_at: now,
        };
        let live = doc.live(v.version, self.limits.policy.dev_issuer.as_deref());
        let version = v.version;
        if !self.store.policy_append(v).await.map_err(internal("policy append"))? {
            return Err(stale(newest.version, newest.version + 1));
        }
        self.install(live);
        let mut d = Decision::new(tool, "applied");
        d.detail = Some(format!("version {version} (narrows): {reason}"));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        Ok(ChangeOutcome { status: "applied", version: Some(version), proposal_id: None, widens, changes: list })
    }

    async fn pending(&self, id: &str) -> Result<PolicyProposal, OpError> {
        let p = self.store.policy_proposal(id).await.map_err(internal("policy read"))?;
        let p = p.ok_or(OpError::missing("policy proposal"))?;
        if p.status != ProposalStatus::Pending {
            return Err(OpError::conflict(format!("this proposal is {} already", p.status.as_str())));
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
        let list = self.document(&newest.document).map(|cur| changes(&cur, &doc)).unwrap_or_default();
        let v = PolicyVersion {
            version: newest.version + 1,
            document: p.document.clone(),
            author_iss: p.author_iss.clone(),
            author_sub: p.author_sub.clone(),
            reason: p.reason.clone(),
            approver_iss: op.issuer.clone(),
            approver_sub: op.subject.clone(),
            proposal_id: Some(p.id.clone()),
            created_at: self.clock.now(),
        };
        let version = v.version;
        let live = doc.live(version, self.limits.policy.dev_issuer.as_deref());
        let by = (op.issuer.as_str(), op.subject.as_str());
        let decided = self
            .store
            .policy_decide(&p.id, ProposalStatus::Applied, by, self.clock.now(), Some(v))
            .await
            .map_err(internal("policy decide"))?;
        if !decided {
            return Err(OpError::conflict("the policy or the proposal changed meanwhile: read it again".into()));
        }
        self.install(live);
        let mut d = Decision::new("policy.approve", "applied");
        d.detail = Some(format!("{} as version {version} (by {})", p.id, who(&p.author_iss, &p.author_sub)));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        Ok(ChangeOutcome {
            status: "applied",
            version: Some(version),
            proposal_id: Some(p.id),
            widens: true,
            changes: list,
        })
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
        let by = (op.issuer.as_str(), op.subject.as_str());
        let decided = self
            .store
            .policy_decide(&p.id, ProposalStatus::Rejected, by, self.clock.now(), None)
            .await
            .map_err(internal("policy decide"))?;
        if !decided {
            return Err(OpError::conflict("this proposal was decided meanwhile".into()));
        }
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
        let list = match (base.map(|b| self.document(&b.document)), self.document(&p.document)) {
            (Some(Ok(b)), Ok(d)) => changes(&b, &d),
            _ => Vec::new(),
        };
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
            document: json(&p.document),
            changes: list,
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
        let list = self.document(&newest.document).map(|cur| changes(&cur, &doc)).unwrap_or_default();
        Ok(SimulationView {
            since: rfc3339(since),
            until: rfc3339(until),
            truncated: history.len() as u64 >= u64::from(limit),
            changes: list,
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
