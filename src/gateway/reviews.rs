//! The people's side of approvals: operators list, review (the state machine in
//! `domain::rules::review`), pre-authorize and revoke; a user confirms an approval in their own
//! tier (operators suspending and resuming agents: `principal_admin.rs`). Scopes are checked here;
//! nobody acts on itself.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::approvals::{ApprovalView, OpError, Operator, decision_key};
use super::authority_trail::Trail;
use super::passkeys::PasskeyAssertion;
use super::{Decision, Gateway, decode_cursor, encode_cursor};
use crate::catalogue::scopes;
use crate::domain::approval::{ApprovalRecord, ApprovalReview, InForce, Review, ReviewError};
use crate::domain::approval::{ApprovalStatus, Approver, ReviewDecision};
use crate::domain::ids::{AccountId, ApprovalId};
use crate::domain::money::{Currency, Money};
use crate::domain::ops::ApprovalQuery;
use crate::domain::principal::valid_subject;
use crate::domain::rules::authority::{Target, acts_on_itself};
use crate::mandate::MandateKind;
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

/// A reason an operator or user gives, as kept: at most [`REASON_CHARS_MAX`] characters (longer is
/// refused, never cut: a cut reason could say something else).
pub(super) fn reason_text(reason: Option<String>) -> Result<Option<String>, OpError> {
    match reason {
        Some(r) if r.chars().count() > REASON_CHARS_MAX => {
            Err(OpError::invalid(format!("reason is at most {REASON_CHARS_MAX} characters")))
        }
        r => Ok(r),
    }
}

/// Largest `max_uses` of an open mandate.
pub const OPEN_MANDATE_USES_MAX: i64 = 100_000;

/// Longest review reason kept, in characters.
pub const REASON_CHARS_MAX: usize = 500;

impl Gateway {
    pub(super) fn require(&self, op: &Operator, any_of: &[&'static str]) -> Result<(), OpError> {
        if any_of.iter().any(|s| op.scopes.contains(*s)) { Ok(()) } else { Err(OpError::forbidden(any_of[0])) }
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
            return Err(OpError::invalid("status must be pending, approved, rejected or expired".into()));
        }
        let before = decode_cursor(cursor).map_err(OpError::from)?;
        let limit = self.page_limit(limit).map_err(OpError::from)?;
        let now = self.clock.now();
        let page = self
            .store
            .approval_list(ApprovalQuery { status: status.map(str::to_string), now, before, limit })
            .await
            .map_err(|error| {
                tracing::error!(%error, "approval list failed");
                OpError::internal()
            })?;
        // Each as it is decided now (the policy in force may ask more than when it was created).
        let views = page.items.iter().map(|(_, a)| self.view(&self.judged_now(a.clone()), now, false)).collect();
        Ok((views, page.next_cursor.map(encode_cursor)))
    }

    pub async fn approval(&self, op: &Operator, approval_id: &str) -> Result<ApprovalView, OpError> {
        self.require(op, &[scopes::AUDIT, scopes::APPROVE])?;
        let id = ApprovalId::parse(approval_id).map_err(|_| OpError::not_found())?;
        match self.store.approval_get(&id).await {
            Ok(Some(a)) => {
                let a = self.judged_now(a);
                Ok(self.view(&a, self.clock.now(), false))
            }
            Ok(None) => Err(OpError::not_found()),
            Err(error) => {
                tracing::error!(%error, "approval read failed");
                Err(OpError::internal())
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
        passkey: Option<PasskeyAssertion>,
    ) -> Result<ApprovalView, OpError> {
        self.require(op, &[scopes::APPROVE])?;
        let reason = reason_text(reason)?;
        if decision == ReviewDecision::Reject && reason.as_deref().is_none_or(|r| r.trim().is_empty()) {
            return Err(OpError::invalid("a rejection needs a reason".into()));
        }
        self.decide(op, approval_id, decision, reason, false, passkey).await
    }

    /// A person's own approval, for the confirmation page: only the user the agent acts for (the
    /// delegating subject, same issuer, their own operator-audience sign-in with `payments:confirm`)
    /// sees it.
    pub async fn user_approval(&self, person: &Operator, approval_id: &str) -> Result<ApprovalView, OpError> {
        let a = self.judged_now(self.users_own(person, approval_id).await?);
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
        passkey: Option<PasskeyAssertion>,
    ) -> Result<ApprovalView, OpError> {
        // Judged under the policy in force too: a tier narrowed since it was asked for is an operator's.
        let a = self.judged_now(self.users_own(person, approval_id).await?);
        if a.approver != Approver::User {
            return Err(OpError::not_the_user(
                "this payment is over your own approval limit: an operator decides it".into(),
            ));
        }
        let reason = reason_text(reason)?
            .filter(|r| !r.trim().is_empty())
            .or_else(|| (decision == ReviewDecision::Reject).then(|| "declined by the user".to_string()));
        self.decide(person, approval_id, decision, reason, true, passkey).await
    }

    async fn users_own(&self, person: &Operator, approval_id: &str) -> Result<ApprovalRecord, OpError> {
        self.require(person, &[scopes::CONFIRM])?;
        let id = ApprovalId::parse(approval_id).map_err(|_| OpError::not_found())?;
        match self.store.approval_get(&id).await {
            // Someone else's approval does not exist for this person, and neither does one the agent
            // asked for on its own (there is no person to confirm it: an operator decides).
            Ok(Some(a))
                if a.principal_user.as_deref() == Some(person.subject.as_str()) && a.principal_iss == person.issuer =>
            {
                Ok(a)
            }
            Ok(_) => Err(OpError::not_found()),
            Err(error) => {
                tracing::error!(%error, "approval read failed");
                Err(OpError::internal())
            }
        }
    }

    /// Record one review (an operator's, or the user's own), signed with a passkey when one is
    /// presented (and required when the approval says so), and audit it.
    async fn decide(
        &self,
        op: &Operator,
        approval_id: &str,
        decision: ReviewDecision,
        reason: Option<String>,
        as_user: bool,
        passkey: Option<PasskeyAssertion>,
    ) -> Result<ApprovalView, OpError> {
        let id = ApprovalId::parse(approval_id).map_err(|_| OpError::not_found())?;
        let now = self.clock.now();
        let action = match (as_user, decision) {
            (false, ReviewDecision::Approve) => "approvals.approve",
            (false, ReviewDecision::Reject) => "approvals.reject",
            (true, ReviewDecision::Approve) => "approvals.user_confirm",
            (true, ReviewDecision::Reject) => "approvals.user_decline",
        };
        let evidence = match self.decision_evidence(op, &id, decision, passkey.as_ref(), now).await {
            Ok(e) => e,
            Err(e) => {
                let mut d = Decision::new(action, "refused");
                d.approval_id = Some(id.as_str());
                d.code = Some(e.code);
                d.detail = Some(e.message.clone());
                self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
                return Err(e);
            }
        };
        let signed = evidence.as_deref().map(crate::domain::approval::passkey_evidence_digest);
        let review = Review {
            reviewer_iss: op.issuer.clone(),
            reviewer_sub: op.subject.clone(),
            decision,
            reason: reason.clone(),
            at: now,
            passkey: evidence,
            as_user,
            tag: None,
        }
        .tagged(&self.audit_link_key, &id, rand::random());
        let issue = self.mandate_issuer(now);
        let (decided, page) = (self.notice(crate::domain::webhook::APPROVAL_DECIDED), self.approval_url(&id));
        let in_force = match self.store.approval_get(&id).await {
            Ok(Some(rec)) => self.in_force(&rec),
            // Not found, or unreadable: the review transaction answers for it.
            _ => InForce::default(),
        };
        // The decision's record, written in the review's transaction: a review on record always
        // has its record on the trail (what `decided_on_trail` reads).
        let record = |detail: Option<String>| {
            let mut d = Decision::new(action, "recorded");
            d.approval_id = Some(id.as_str());
            d.detail = detail;
            if let Some(digest) = &signed {
                // Which assertion signed it: its hash is in the mandate, the assertion with the review.
                d.detail = Some(format!("{} [passkey assertion sha256 {digest}]", d.detail.unwrap_or_default()));
            }
            self.tag_audit(self.audit_record(&op.issuer, &op.subject, &op.correlation_id, d))
        };
        let written = record(reason.clone());
        let record_tag = written.tag.clone();
        let ask = ApprovalReview {
            id: id.clone(),
            review,
            issue,
            decided,
            page,
            in_force,
            key: self.audit_link_key.clone(),
            record: Some(written.clone()),
        };
        // One person decides once, by the trail's word too: their earlier decision's record stands
        // even if a database writer rewrote that review's row (the second stop-67 review); and a
        // decision the trail holds stands even if the approval's row was reopened.
        let result = match self.decided_on_trail(&id, &op.subject).await {
            Ok(Trail { by_subject: true, .. }) => Err(ReviewError::AlreadyReviewed),
            Ok(Trail { settled: Some(status), .. }) => Err(ReviewError::Terminal(status)),
            Ok(Trail { .. }) => self.store.approval_review(ask).await,
            Err(e) => Err(ReviewError::Store(e)),
        };
        let (outcome, error) = match result {
            Ok(done) => {
                // Its record was written with it: witnessed until it is sealed, as any other.
                if let Some(seq) = done.record_seq {
                    self.witness(seq, record_tag.as_deref(), now);
                }
                (Ok(self.view(&done.approval, now, false)), None)
            }
            Err(e) => {
                let mapped = match &e {
                    ReviewError::NotFound => OpError::not_found(),
                    ReviewError::Terminal(s) => OpError::conflict(format!("the approval is already {s}")),
                    ReviewError::Expired => OpError::gone("the approval has expired".into()),
                    ReviewError::SelfReview => {
                        OpError::self_review("the agent a payment is for cannot review it".into())
                    }
                    ReviewError::AlreadyReviewed => OpError::conflict("this reviewer has already reviewed it".into()),
                    ReviewError::NotTheUser => OpError::not_the_user(e.to_string()),
                    ReviewError::Altered => {
                        tracing::error!(approval_id = %id, "an approval's reviews do not hold the gateway's tags: \
                            written outside the gateway; it is decided no further");
                        OpError::conflict(e.to_string())
                    }
                    ReviewError::Mandate(_) | ReviewError::Store(_) => {
                        tracing::error!(error = %e, "approval review failed");
                        OpError::internal()
                    }
                };
                (Err(mapped), Some(e.to_string()))
            }
        };
        if outcome.as_ref().is_ok_and(|v| v.status != "pending") {
            self.wake(&decision_key(&id));
        }
        if outcome.is_ok() {
            // Its record was written with it.
            self.metrics.decision(action, "recorded", None);
        } else {
            let mut d = Decision::new(action, "refused");
            d.approval_id = Some(id.as_str());
            d.detail = error;
            if let Some(digest) = &signed {
                d.detail = Some(format!("{} [passkey assertion sha256 {digest}]", d.detail.unwrap_or_default()));
            }
            self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        }
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
        let bad = |m: String| OpError::invalid(m);
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
            return Err(OpError::self_review("an operator cannot pre-authorize a mandate for themself".into()));
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
        let passkey_required = self.passkey_required_for(false, amount_minor, currency);
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
            passkey_required,
            tag: None,
        }
        .tagged(&self.audit_link_key, rand::random());
        self.store.approval_insert(rec).await.map_err(|error| {
            tracing::error!(%error, "approval insert failed");
            OpError::internal()
        })?;
        let mut d = Decision::new("approvals.preauthorize", "created");
        d.approval_id = Some(id.as_str());
        d.detail = Some(format!("{} for {}", args.kind, args.subject));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        if passkey_required {
            // Its tier needs a passkey over an intent that now has an id: the creator approves it
            // from its page with their passkey, like any reviewer.
            return self.approval(op, id.as_str()).await;
        }
        self.review(op, id.as_str(), ReviewDecision::Approve, args.reason, None).await
    }

    /// What deciding `rec` takes under the policy in force now: its principal's profile as it is now
    /// (the strictest of the profiles it could be, when only a client id would tell), the reviewer
    /// tiers and the passkey tiers. Narrowing policy during an incident reaches pending approvals.
    pub(super) fn in_force(&self, rec: &ApprovalRecord) -> InForce {
        let live = self.policy();
        let amount = crate::domain::money::Money::from_minor(rec.amount_minor, rec.currency);
        let candidates =
            live.profiles.candidates(&rec.principal_iss, &rec.principal_sub, rec.principal_user.as_deref());
        let reviewers_required = self.reviewers_for(rec.amount_minor, rec.currency);
        let user_tier = rec.principal_user.is_some()
            && reviewers_required == 1
            && amount.as_ref().is_ok_and(|a| candidates.iter().all(|p| p.user_may_approve(*a)));
        let profile_passkey = candidates.iter().any(|p| p.passkey_required);
        InForce {
            operator_only: !user_tier,
            reviewers_required,
            passkey_required: self.passkey_required_for(profile_passkey, rec.amount_minor, rec.currency),
        }
    }

    /// `rec` as it is decided now (`ApprovalRecord::under`), while it is pending; a decided one is
    /// shown as it was decided.
    pub(super) fn judged_now(&self, rec: ApprovalRecord) -> ApprovalRecord {
        if rec.status_at(self.clock.now()) != ApprovalStatus::Pending {
            return rec;
        }
        let now = self.in_force(&rec);
        rec.under(&now)
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
        let id = ApprovalId::parse(approval_id).map_err(|_| OpError::not_found())?;
        let now = self.clock.now();
        let internal = |error: crate::domain::error::StoreError| {
            tracing::error!(%error, "mandate revocation failed");
            OpError::internal()
        };
        let rec = self.store.approval_get(&id).await.map_err(internal)?.ok_or(OpError::not_found())?;
        if rec.mandate_id.is_none() {
            return Err(OpError::conflict(format!("the approval is {} and issued no mandate", rec.status_at(now))));
        }
        let reason = reason_text(reason)?;
        let mut d = Decision::new("mandates.revoke", "revoked");
        d.approval_id = Some(id.as_str());
        let named = rec.mandate_id.as_deref().unwrap_or_default();
        d.detail = Some(format!("mandate {named}: {}", reason.as_deref().unwrap_or("no reason given")));
        // Its record is written in the revocation's transaction: a revocation that answered is on
        // the trail, where `revoked_in_trail` reads it whatever the mandate's row says later.
        let record = self.tag_audit(self.audit_record(&op.issuer, &op.subject, &op.correlation_id, d));
        let tag = record.tag.clone();
        let revoked = self.store.mandate_revoke(&id, &op.subject, now, Some(record)).await.map_err(internal)?;
        let Some(revoked) = revoked else {
            return Err(OpError::conflict("its mandate is already revoked".into()));
        };
        if let Some(seq) = revoked.record_seq {
            self.witness(seq, tag.as_deref(), now);
        }
        self.metrics.decision("mandates.revoke", "revoked", None);
        Ok(self.view(&rec, now, false))
    }
}
