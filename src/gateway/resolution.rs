//! Two people settle a payout nobody else can: `POST /operator/v1/payments/{id}/resolve`.
//!
//! A payout (or reversal) whose request may have reached the rail, about which the rail has no
//! answer, stays `unknown` for ever: the gateway never sends it again, and neither M-Pesa's status
//! query nor Airtel's enquiry ("Transaction not found") says it failed. People reading the rail's
//! own statement can. One operator with `payments:admin` proposes an outcome (audited, under the
//! writer's tag); a second person confirms exactly that outcome; the rail is asked once more, and
//! its own word, if it has one, wins; else the record settles as they said, in one transaction
//! with the record that names them both. The rule is `domain::rules::resolution`.

use serde::{Deserialize, Serialize};

use super::approvals_api::OpError;
use super::operator::internal;
use super::{Decision, Gateway, Operator};
use crate::catalogue::scopes;
use crate::domain::audit::AuditRecord;
use crate::domain::ids::PaymentId;
use crate::domain::ops::AuditQuery;
use crate::domain::rail::{Lookup, RailPayment, Settlement};
use crate::domain::rules::resolution::{self, Outcome, Plan, Proposal, Refusal};
use crate::error::ErrorCode;

/// The audit `tool` of resolutions, and its decisions.
pub const RESOLVE_TOOL: &str = "resolve_payment";
const PROPOSED: &str = "resolution_proposed";
const CONFIRMED: &str = "resolution_confirmed";
/// A resolution's reason, at most (what the people read on the statement).
pub const RESOLUTION_REASON_CHARS_MAX: usize = 500;
/// A receipt the people give for a success, at most (an M-Pesa or Airtel transaction id).
pub const RESOLUTION_RECEIPT_CHARS_MAX: usize = 64;
/// Proposals looked at, newest first, for the latest one whose writer's tag holds.
const PROPOSALS_READ_MAX: u32 = 20;

/// The body of a resolution (an empty body is refused: it names no outcome).
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ResolveArgs {
    /// `failed` (the statement shows no such payment) or `succeeded` (it shows it paid).
    pub outcome: String,
    /// What the statement shows, in a sentence.
    pub reason: String,
    /// The rail's receipt for a success (required then, refused otherwise).
    #[serde(default)]
    pub receipt: Option<String>,
}

/// Where a resolution stands after this request.
#[derive(Debug, Clone, Serialize)]
pub struct ResolutionView {
    pub payment_id: String,
    /// `proposed` (a second person must confirm) or `resolved`.
    pub status: String,
    pub outcome: String,
    pub proposed_by: String,
    pub confirmed_by: Option<String>,
    /// The payment's status as agents now see it.
    pub payment_status: String,
}

/// What the trail says a proposal record proposed (its detail), if it is one.
#[derive(Debug, Serialize, Deserialize)]
struct ProposalDetail {
    outcome: String,
    receipt: Option<String>,
    reason: String,
}

/// Kept as given: blank, or over `max` characters, is refused (400), never cut.
fn checked_text(name: &str, v: &str, max: usize) -> Result<String, OpError> {
    if v.trim().is_empty() || v.chars().count() > max {
        return Err(OpError::invalid(format!("{name} must be 1 to {max} characters, not blank")));
    }
    Ok(v.to_string())
}

impl Gateway {
    /// One operator's word on an unknown payout: a proposal, or the confirmation that settles it.
    pub async fn ops_resolve_payment(
        &self,
        op: &Operator,
        payment_id: &str,
        args: ResolveArgs,
    ) -> Result<ResolutionView, OpError> {
        self.require_op(op, &[scopes::ADMIN])?;
        let outcome = Outcome::parse(&args.outcome)
            .ok_or_else(|| OpError::invalid("outcome must be \"failed\" or \"succeeded\"".into()))?;
        let reason = checked_text("reason", &args.reason, RESOLUTION_REASON_CHARS_MAX)?;
        let receipt = match (outcome, args.receipt.as_deref()) {
            (Outcome::Succeeded, Some(r)) => Some(checked_text("receipt", r, RESOLUTION_RECEIPT_CHARS_MAX)?),
            (Outcome::Succeeded, None) => {
                return Err(OpError::invalid("a success needs the rail's receipt from the statement".into()));
            }
            (Outcome::Failed, Some(_)) => return Err(OpError::invalid("a failure has no receipt".into())),
            (Outcome::Failed, None) => None,
        };
        let id = PaymentId::parse(payment_id).map_err(|_| OpError::missing("payment"))?;
        let rec = self.store.rail_get(&id).await.map_err(internal("rail record read"))?;
        let rec = rec.ok_or(OpError::missing("payment"))?;
        let latest = self.latest_proposal(&rec).await?;
        let now = self.clock.now();
        let plan = resolution::plan(
            &rec,
            &op.subject,
            outcome,
            receipt.as_deref(),
            latest.as_ref(),
            now,
            self.limits.resolution_after_secs,
        )
        .map_err(|r| refusal(&rec, r))?;
        match plan {
            Plan::Propose => {
                let detail = ProposalDetail { outcome: outcome.as_str().into(), receipt, reason };
                let mut d = Decision::new(RESOLVE_TOOL, PROPOSED);
                d.payment_id = Some(rec.id.as_str());
                d.detail = Some(serde_json::to_string(&detail).map_err(|_| OpError::internal())?);
                let record = self.tag_audit(self.audit_record(&op.issuer, &op.subject, &op.correlation_id, d));
                let (tag, at) = (record.tag.clone(), record.at);
                // The proposal is what a second person confirms: it must be written, not logged.
                let seq = self.store.audit_append(record).await.map_err(internal("resolution proposal"))?;
                self.witness(seq, tag.as_deref(), at);
                Ok(view(&rec, "proposed", outcome, &op.subject, None))
            }
            Plan::Confirm { proposed_by } => {
                self.confirm_resolution(op, &rec, outcome, receipt, reason, proposed_by).await
            }
        }
    }

    /// The second person's word: the rail is asked once more (its own word wins), then the record
    /// settles as both said, with the record naming them in the same transaction.
    async fn confirm_resolution(
        &self,
        op: &Operator,
        rec: &RailPayment,
        outcome: Outcome,
        receipt: Option<String>,
        reason: String,
        proposed_by: String,
    ) -> Result<ResolutionView, OpError> {
        let Some(rail) = self.rail(&rec.rail).cloned() else {
            return Err(OpError::conflict(format!("the {} rail is not enabled on this gateway", rec.rail)));
        };
        match rail.lookup(rec).await {
            Lookup::NotFound | Lookup::CannotBeAsked => {}
            Lookup::NoAnswer(why) => {
                return Err(OpError::new(
                    ErrorCode::BackendUnavailable,
                    format!("{} could not be asked about this payment ({why}); try again", rail.display_name()),
                ));
            }
            Lookup::Known(word) => {
                // The rail knows it: its own word settles it (or it is still in progress), not ours.
                if matches!(word, Settlement::Succeeded | Settlement::Failed(_)) {
                    let code = if word == Settlement::Succeeded { "SUCCEEDED" } else { "FAILED" };
                    let said = ("query_settled", code, format!("{word:?}"));
                    self.settle(&*rail, rec, &word, None, Some(said)).await.map_err(internal("rail settle"))?;
                }
                let said = match &word {
                    Settlement::Succeeded => "it paid: settled by its word".to_string(),
                    Settlement::Failed(r) => format!("it failed ({r}): settled by its word"),
                    Settlement::Pending(r) | Settlement::Unrecognised(r) => format!("it is still open ({r})"),
                };
                return Err(OpError::conflict(format!(
                    "{} knows this payment, {said}; it is not settled by hand",
                    rail.display_name()
                )));
            }
        }
        let settlement = match outcome {
            Outcome::Failed => Settlement::Failed(format!("resolved by hand: {reason}")),
            Outcome::Succeeded => Settlement::Succeeded,
        };
        let mut d = Decision::new(RESOLVE_TOOL, CONFIRMED);
        d.payment_id = Some(rec.id.as_str());
        d.detail =
            Some(format!("{} by {proposed_by} (proposed) and {} (confirmed): {reason}", outcome.as_str(), op.subject));
        let mut record: AuditRecord = self.audit_record(&op.issuer, &op.subject, &op.correlation_id, d);
        record.code = Some(outcome.as_str().to_ascii_uppercase());
        record.principal_user = rec.principal_user.clone();
        let settled = self.settle_recorded(&*rail, rec, &settlement, receipt, Some(record)).await;
        match settled.map_err(internal("resolution"))? {
            Some(done) => {
                tracing::warn!(payment_id = %rec.id, outcome = outcome.as_str(), proposed_by = %proposed_by,
                    confirmed_by = %op.subject, "a rail payment was settled by hand");
                Ok(view(&done, "resolved", outcome, &proposed_by, Some(op.subject.clone())))
            }
            None => Err(OpError::conflict(
                "the payment was settled meanwhile (by another confirmation or the rail's own word)".into(),
            )),
        }
    }

    /// The newest proposal about `rec` whose writer's tag holds (a row a database writer inserted
    /// cannot stand in for the first person).
    async fn latest_proposal(&self, rec: &RailPayment) -> Result<Option<Proposal>, OpError> {
        let q = AuditQuery {
            tool: Some(RESOLVE_TOOL.into()),
            decision: Some(PROPOSED.into()),
            payment_id: Some(rec.id.to_string()),
            limit: PROPOSALS_READ_MAX,
            ..Default::default()
        };
        let records = self.store.audit_query(q).await.map_err(internal("resolution proposals"))?;
        for r in records {
            if crate::domain::audit_chain::tag_fault(&self.audit_link_key, &r, true).is_some() {
                tracing::error!(seq = r.seq, payment_id = %rec.id, "a resolution proposal whose writer's tag does not hold is ignored");
                continue;
            }
            let Some(detail) = r.detail.as_deref().and_then(|d| serde_json::from_str::<ProposalDetail>(d).ok()) else {
                continue;
            };
            let Some(outcome) = Outcome::parse(&detail.outcome) else { continue };
            return Ok(Some(Proposal { by: r.principal_sub, outcome, receipt: detail.receipt, at: r.at }));
        }
        Ok(None)
    }
}

fn view(
    rec: &RailPayment,
    status: &str,
    outcome: Outcome,
    proposed_by: &str,
    confirmed_by: Option<String>,
) -> ResolutionView {
    ResolutionView {
        payment_id: rec.id.to_string(),
        status: status.into(),
        outcome: outcome.as_str().into(),
        proposed_by: proposed_by.into(),
        confirmed_by,
        payment_status: rec.state.status().as_str().into(),
    }
}

fn refusal(rec: &RailPayment, r: Refusal) -> OpError {
    match r {
        Refusal::NotMoneyOut(flow) => OpError::conflict(format!(
            "only money sent out (a payout, a reversal) is settled by hand; this is a {}",
            flow.as_str()
        )),
        Refusal::NotUnknown(state) => OpError::conflict(format!(
            "the payment is {}: only one whose outcome is unknown (never answered) is settled by hand",
            state.as_str()
        )),
        Refusal::TooSoon { wait_secs } => OpError::conflict(format!(
            "the {} rail may still answer: a payment is settled by hand {wait_secs} s from now at the earliest \
             (approvals.resolution_after_secs)",
            rec.rail
        )),
        Refusal::OwnPayment => OpError::self_review("nobody settles a payment made by them or for them".into()),
        Refusal::OwnProposal => {
            OpError::self_review("you proposed this outcome: another person must confirm it".into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_note_is_kept_as_given_within_its_bound_and_refused_blank_or_over_it() {
        assert_eq!(checked_text("reason", " paid by hand", 13).ok().as_deref(), Some(" paid by hand"));
        assert!(checked_text("reason", "paid by hand!!", 13).is_err(), "one character over");
        assert!(checked_text("reason", " \t ", 13).is_err(), "blank");
        // Characters, not bytes.
        assert!(checked_text("reason", &"ñ".repeat(13), 13).is_ok());
    }
}
