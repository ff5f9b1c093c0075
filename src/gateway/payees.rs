//! Payees (`domain::payee`): made known when a payment a human approved settles, listed, added and
//! revoked by operators (`/operator/v1/payees`). Every change is audited under whoever made it.
//! A mandate that is revoked, or expires unused, teaches nothing: the approval alone never makes a
//! payee known, and revoking a mandate forgets the payee its payment taught (`mandate_revoke`).

use crate::domain::rules::authority::{Target, acts_on_itself};
use serde::{Deserialize, Serialize};

use super::admission::PAYS_PAYEE;
use super::approvals_api::OpError;
use super::operator::internal;
use super::{Decision, Gateway, Operator};
use crate::catalogue::scopes;
use crate::clock::rfc3339;
use crate::domain::approval::ReviewDecision;
use crate::domain::audit_chain::{row_tag, row_tag_holds};
use crate::domain::ids::AccountId;
use crate::domain::payee::{self, PayeeRecord};
use crate::domain::principal::usage_subject;
use crate::domain::principal::valid_subject as is_name;

/// Longest account reference a paybill payee names (M-Pesa B2B's, which every payment is held to).
const ACCOUNT_REFERENCE_CHARS_MAX: usize = crate::backend::mpesa::daraja::B2B_ACCOUNT_REFERENCE_CHARS_MAX;

/// Payees one list answers at most.
pub const PAYEES_LISTED_MAX: u32 = 500;

/// A payee as operators see it.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PayeeView {
    /// The agent it is known to.
    pub agent_subject: String,
    /// The user the agent acts for, when it is known to the agent acting for that user only.
    pub user: Option<String>,
    /// The payee: a ledger account, a customer's phone as its account (`mpesa-2547…`), or a
    /// paybill with its account reference (`mpesa-paybill-247247/SUPPLIER-001`).
    pub payee: String,
    /// "known", "revoked", or "unverified": its row does not carry the gateway's tag (written in
    /// the database, or before payees were tagged), so it makes no payee known until added again.
    pub status: String,
    pub known_since: String,
    pub added_by: String,
    pub approval_id: Option<String>,
    pub revoked_at: Option<String>,
    pub revoked_by: Option<String>,
}

/// `ours`: its row carries the gateway's tag (else it makes no payee known: "unverified").
fn payee_view(r: PayeeRecord, ours: bool) -> PayeeView {
    let (agent, user) = match r.owner.split_once('\u{1f}') {
        Some((a, u)) => (a.to_string(), Some(u.to_string())),
        None => (r.owner.clone(), None),
    };
    PayeeView {
        agent_subject: agent,
        user,
        payee: r.payee,
        status: match (r.revoked_at, ours) {
            (Some(_), _) => "revoked",
            (None, true) => "known",
            (None, false) => "unverified",
        }
        .into(),
        known_since: rfc3339(r.known_since),
        added_by: r.added_by,
        approval_id: r.approval_id,
        revoked_at: r.revoked_at.map(rfc3339),
        revoked_by: r.revoked_by,
    }
}

/// Whose payee, and which: the body of `POST /operator/v1/payees` and `…/payees/revoke`.
#[derive(Debug, Clone, Default, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PayeeArgs {
    /// The agent's subject.
    pub agent_subject: String,
    /// The user the agent acts for, when the payee is for that pairing only.
    #[serde(default)]
    pub user: Option<String>,
    /// A ledger account id, or a customer's phone as its account (`mpesa-254712345678`).
    pub payee: String,
    /// A paybill's account reference: a paybill payee (`mpesa-paybill-…`) is the pair, and needs it.
    #[serde(default)]
    pub account_reference: Option<String>,
    /// Why (kept in the audit trail).
    #[serde(default)]
    pub reason: Option<String>,
}

impl PayeeArgs {
    fn owner_and_payee(&self) -> Result<(String, String), OpError> {
        if !is_name(&self.agent_subject) {
            return Err(bad_name("agent_subject"));
        }
        if self.user.as_deref().is_some_and(|u| !is_name(u)) {
            return Err(bad_name("user"));
        }
        let payee = AccountId::parse(&self.payee).map_err(|e| OpError::invalid(format!("payee: {e}")))?;
        // A paybill credits whatever account the reference names: its payee is the pair.
        let paybill = payee.as_str().contains("-paybill-");
        let reference = match (&self.account_reference, paybill) {
            (None, false) => None,
            (Some(r), true) => Some(
                crate::backend::kenya::customer_text(r, ACCOUNT_REFERENCE_CHARS_MAX)
                    .map_err(|e| OpError::invalid(format!("account_reference {e}")))?,
            ),
            (None, true) => return Err(OpError::invalid("a paybill payee needs its account_reference".into())),
            (Some(_), false) => return Err(OpError::invalid("account_reference is only for a paybill payee".into())),
        };
        let key = payee::key(payee.as_str(), reference.as_deref());
        Ok((usage_subject(&self.agent_subject, self.user.as_deref()), key))
    }
}

/// The domain of a payee row's tag (`audit_chain::row_tag`).
const PAYEE_TAG_DOMAIN: &str = "paygate-payee-v1\n";

impl Gateway {
    /// `rec` with the gateway's tag over what made it known.
    fn tag_payee(&self, mut rec: PayeeRecord) -> PayeeRecord {
        let nonce = crate::domain::ids::hex(&rand::random::<[u8; 8]>());
        rec.tag = Some(row_tag(&self.audit_link_key, PAYEE_TAG_DOMAIN, &rec.tag_fields(), &nonce));
        rec
    }

    /// Whether `rec` is a row the gateway wrote: a payee row inserted or edited in the database
    /// (or written before payees were tagged) makes no payee known.
    pub(super) fn payee_tag_holds(&self, rec: &PayeeRecord) -> bool {
        rec.tag.as_deref().is_some_and(|t| row_tag_holds(&self.audit_link_key, PAYEE_TAG_DOMAIN, &rec.tag_fields(), t))
    }

    /// A row for (`owner`, `payee`) that is not the gateway's and not revoked is revoked first, so
    /// that making the payee known writes a row of the gateway's (an unrevoked row is kept as it is).
    async fn retire_unverified_payee(&self, owner: &str, payee: &str) {
        if let Ok((Some(rec), _)) = self.store.payee_state(owner, payee, None).await
            && rec.revoked_at.is_none()
            && !self.payee_tag_holds(&rec)
        {
            tracing::error!(
                payee.owner = owner,
                payee.payee = payee,
                "a payee row the gateway did not write (edited or inserted in the database, or from before tags): \
                 retired"
            );
            if let Err(error) = self.store.payee_revoke(owner, payee, "gateway: unverified row", self.clock.now()).await
            {
                tracing::error!(%error, "retiring an unverified payee row failed");
            }
        }
    }

    /// Payees, most recently known first: every agent's, or one agent's (and user's).
    pub async fn ops_payees(
        &self,
        op: &Operator,
        agent: Option<&str>,
        user: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Vec<PayeeView>, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::APPROVE])?;
        let limit = listed(limit, PAYEES_LISTED_MAX)?;
        for (field, v) in [("agent", agent), ("user", user)] {
            if v.is_some_and(|v| !is_name(v)) {
                return Err(bad_name(field));
            }
        }
        let owner = agent.map(|a| usage_subject(a, user));
        // A user alone: that person's payees, whichever agent they are known to, among the newest.
        let fetch = if owner.is_none() && user.is_some() { PAYEES_LISTED_MAX } else { limit };
        let rows = self.store.payee_list(owner.as_deref(), i64::from(fetch)).await.map_err(internal("payee list"))?;
        let views = rows
            .into_iter()
            .map(|r| {
                let ours = self.payee_tag_holds(&r);
                payee_view(r, ours)
            })
            .filter(|v| owner.is_some() || user.is_none_or(|u| v.user.as_deref() == Some(u)));
        Ok(views.take(limit as usize).collect())
    }

    /// An operator makes a payee known (an allow-list entry): its cooling-off starts now.
    pub async fn ops_add_payee(&self, op: &Operator, args: PayeeArgs) -> Result<PayeeView, OpError> {
        self.require_op(op, &[scopes::APPROVE])?;
        let (owner, payee) = args.owner_and_payee()?;
        // A known payee is pre-authorization by another name: never for oneself, nor for an agent
        // acting for oneself (`rules::authority`).
        let target = Target { agent: &args.agent_subject, user: args.user.as_deref() };
        if acts_on_itself(&op.subject, target) {
            return Err(OpError::self_review(
                "no one adds a payee for themself, nor for an agent acting for them".into(),
            ));
        }
        let reason = super::reviews::reason_text(args.reason)?;
        let now = self.clock.now();
        let rec = PayeeRecord {
            owner: owner.clone(),
            payee: payee.clone(),
            known_since: now,
            added_by: format!("{} {}", op.issuer, op.subject),
            approval_id: None,
            revoked_at: None,
            revoked_by: None,
            tag: None,
        };
        let rec = self.tag_payee(rec);
        let notify = self.payee_notice(&rec);
        self.retire_unverified_payee(&owner, &payee).await;
        let added = self.store.payee_add(rec, notify).await.map_err(internal("payee add"))?;
        let mut d = Decision::new("payees.add", if added { "recorded" } else { "unchanged" });
        d.detail = Some(format!("{payee} for {}{}", owner.replace('\u{1f}', " for "), because(&reason)));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        self.payee_now(&owner, &payee).await
    }

    /// An operator revokes a payee: the next payment to it is a first payment again.
    pub async fn ops_revoke_payee(&self, op: &Operator, args: PayeeArgs) -> Result<PayeeView, OpError> {
        self.require_op(op, &[scopes::APPROVE])?;
        let (owner, payee) = args.owner_and_payee()?;
        let reason = super::reviews::reason_text(args.reason)?;
        let by = format!("{} {}", op.issuer, op.subject);
        let revoked =
            self.store.payee_revoke(&owner, &payee, &by, self.clock.now()).await.map_err(internal("payee revoke"))?;
        let mut d = Decision::new("payees.revoke", if revoked { "recorded" } else { "refused" });
        d.detail = Some(format!("{payee} for {}{}", owner.replace('\u{1f}', " for "), because(&reason)));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        if !revoked {
            return Err(OpError::missing("known payee"));
        }
        self.payee_now(&owner, &payee).await
    }

    async fn payee_now(&self, owner: &str, payee: &str) -> Result<PayeeView, OpError> {
        match self.store.payee_state(owner, payee, None).await {
            Ok((Some(rec), _)) => {
                let ours = self.payee_tag_holds(&rec);
                Ok(payee_view(rec, ours))
            }
            Ok((None, _)) => Err(OpError::missing("payee")),
            Err(error) => {
                tracing::error!(%error, "payee read failed");
                Err(OpError::internal())
            }
        }
    }

    /// A payment drawn on `mandate_id` settled (it succeeded): the payee the human approved is
    /// known to the agent (and the user it acts for) from now — unless the mandate was revoked,
    /// which the store checks in the same transaction as it records the payee (a revoke after
    /// that forgets it). The approval alone teaches nothing, so a mandate that is revoked or
    /// expires unused leaves its payee unknown. A payee that cannot be recorded stays unknown
    /// (fail closed: the next payment to it asks again).
    pub(super) async fn learn_payee(&self, mandate_id: &str, correlation_id: &str) {
        let now = self.clock.now();
        let approval = match self.store.mandate_get(mandate_id, now).await {
            Ok(Some(m)) if m.revoked_at.is_none() => match crate::domain::ids::ApprovalId::parse(&m.approval_id) {
                Ok(id) => self.store.approval_get(&id).await,
                Err(_) => Ok(None),
            },
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        };
        let v = match approval {
            Ok(Some(v)) => v,
            Ok(None) => return,
            Err(error) => {
                tracing::error!(%error, "payee learning failed; it stays unknown");
                return;
            }
        };
        if !PAYS_PAYEE.contains(&v.tool.as_str()) {
            return;
        }
        let Some(account) = v.intent.get("payee").and_then(|p| p.as_str()) else { return };
        let payee = super::admission::payee_key(&v.tool, &v.intent).unwrap_or_else(|| account.to_string());
        let owner = usage_subject(&v.principal_sub, v.principal_user.as_deref());
        // Who made it known: the people who approved the payment.
        let approvers: Vec<&crate::domain::approval::Review> =
            v.reviews.iter().filter(|r| r.decision == ReviewDecision::Approve).collect();
        // Every issued mandate has its approving reviews; none found: nothing to vouch for it.
        let Some(last) = approvers.last() else { return };
        let added_by = approvers.iter().map(|r| format!("{} {}", r.reviewer_iss, r.reviewer_sub)).collect::<Vec<_>>();
        let rec = PayeeRecord {
            owner: owner.clone(),
            payee: payee.clone(),
            known_since: now,
            added_by: added_by.join(", "),
            approval_id: Some(v.id.to_string()),
            revoked_at: None,
            revoked_by: None,
            tag: None,
        };
        let rec = self.tag_payee(rec);
        let notify = self.payee_notice(&rec);
        self.retire_unverified_payee(&owner, &payee).await;
        match self.store.payee_learn(rec, mandate_id, notify).await {
            Ok(true) => {
                let mut d = Decision::new("payees.add", "recorded");
                d.approval_id = Some(v.id.as_str());
                d.detail = Some(format!(
                    "{payee} for {} (approved payment settled, mandate {mandate_id})",
                    owner.replace('\u{1f}', " for ")
                ));
                self.audit_as(&last.reviewer_iss, &last.reviewer_sub, correlation_id, d).await;
            }
            Ok(false) => {}
            Err(error) => tracing::error!(%error, "payee record failed; it stays unknown"),
        }
    }

    /// `payee.added`'s messages (written only if the payee was not known).
    fn payee_notice(&self, rec: &PayeeRecord) -> Vec<crate::domain::webhook::OutboxMessage> {
        let view = payee_view(rec.clone(), true);
        self.notice(crate::domain::webhook::PAYEE_ADDED).messages(serde_json::json!({
            "agent_subject": view.agent_subject,
            "user": view.user,
            "payee": view.payee,
            "added_by": view.added_by,
            "approval_id": view.approval_id,
            "known_since": view.known_since,
        }))
    }
}

fn bad_name(field: &str) -> OpError {
    let max = crate::auth::jwt::SUBJECT_BYTES_MAX;
    OpError::invalid(format!("{field} must be 1 to {max} bytes, without control characters"))
}

/// A list's `limit`: absent, the default (100, or the maximum if lower); outside 1..=`max`, refused.
pub(super) fn listed(limit: Option<u32>, max: u32) -> Result<u32, OpError> {
    match limit {
        None => Ok(100.min(max)),
        Some(n) if (1..=max).contains(&n) => Ok(n),
        Some(_) => Err(OpError::invalid(format!("limit must be 1 to {max}"))),
    }
}

fn because(reason: &Option<String>) -> String {
    reason.as_deref().map(|r| format!(": {r}")).unwrap_or_default()
}
