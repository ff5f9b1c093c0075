//! Settling by hand a rail payment whose outcome nobody can learn: money sent out (a payout, a
//! reversal) whose request may or may not have reached the rail, which has no answer about it
//! (M-Pesa's status query, Airtel's "Transaction not found"). The gateway never sends it again
//! (it cannot know the rail did not receive it), so only people reading the rail's own statement
//! can say what happened: one operator proposes an outcome, a second confirms the same one
//! (maker/checker), and neither is the agent or the user the payment was for.
//!
//! The rule is pure: the gateway loads the record and the latest proposal (an audit record whose
//! writer's tag holds), asks it for a plan, asks the rail once more before a confirmation is
//! applied, and writes what it says.

use crate::clock::UnixSecs;
use crate::domain::rail::{RailFlow, RailPayment, RailState};
use crate::domain::rules::authority::{Target, acts_on_itself};

/// How long a proposal waits for its second operator, in seconds: past it, a confirmation is a new
/// proposal (what the first person read on the statement may no longer be what the second reads).
pub const PROPOSAL_TTL_SECS: i64 = 86_400;

/// What the operators say happened at the rail.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The rail's statement shows no such payment: nothing moved.
    Failed,
    /// The rail's statement shows it paid (under the receipt the operators give).
    Succeeded,
}

impl Outcome {
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Failed => "failed",
            Outcome::Succeeded => "succeeded",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "failed" => Some(Outcome::Failed),
            "succeeded" => Some(Outcome::Succeeded),
            _ => None,
        }
    }
}

/// One operator's proposal, as the trail holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Proposal {
    /// The proposing person's subject (a person counts once, whichever issuer vouches for them).
    pub by: String,
    pub outcome: Outcome,
    /// The rail's receipt the statement shows (a success only).
    pub receipt: Option<String>,
    pub at: UnixSecs,
}

/// What an operator's request does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Record it as a proposal; a second operator must confirm it.
    Propose,
    /// A second person confirms what `proposed_by` proposed: apply it (after one more question to
    /// the rail, whose own answer wins).
    Confirm { proposed_by: String },
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Refusal {
    /// Only money sent out is resolved by hand (a collection's customer or an external ledger
    /// answers for the others).
    NotMoneyOut(RailFlow),
    /// Only a record whose outcome is open and unknown (`submitting`, `unknown`): a pending one is
    /// waiting for the rail's own answer, a settled one is settled.
    NotUnknown(RailState),
    /// Too young: the rail may still answer; `wait_secs` more.
    TooSoon { wait_secs: i64 },
    /// The operator is the agent the payment was for, or the user it acted for.
    OwnPayment,
    /// The operator proposed this very outcome: another person must confirm it.
    OwnProposal,
}

/// The plan for `operator` (a subject) saying `outcome` (with `receipt`) about `rec`, given the
/// latest live proposal about it. A request that differs from the latest proposal (another
/// outcome or receipt), or comes after it expired, is a new proposal: a confirmation must say
/// exactly what was proposed.
pub fn plan(
    rec: &RailPayment,
    operator: &str,
    outcome: Outcome,
    receipt: Option<&str>,
    latest: Option<&Proposal>,
    now: UnixSecs,
    after_secs: i64,
) -> Result<Plan, Refusal> {
    if !matches!(rec.flow, RailFlow::Payout | RailFlow::Reversal) {
        return Err(Refusal::NotMoneyOut(rec.flow));
    }
    if !matches!(rec.state, RailState::Submitting | RailState::Unknown) {
        return Err(Refusal::NotUnknown(rec.state));
    }
    let age = now - rec.created_at;
    if age < after_secs {
        return Err(Refusal::TooSoon { wait_secs: after_secs - age });
    }
    if acts_on_itself(operator, Target { agent: &rec.principal_sub, user: rec.principal_user.as_deref() }) {
        return Err(Refusal::OwnPayment);
    }
    let same = latest.filter(|p| {
        p.outcome == outcome && p.receipt.as_deref() == receipt && now - p.at < PROPOSAL_TTL_SECS && p.at <= now
    });
    match same {
        Some(p) if p.by == operator => Err(Refusal::OwnProposal),
        Some(p) => Ok(Plan::Confirm { proposed_by: p.by.clone() }),
        None => Ok(Plan::Propose),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::{AccountId, PaymentId};
    use crate::domain::money::Currency;
    use crate::domain::payment::PaymentKind;

    const NOW: UnixSecs = 1_000_000;
    const AFTER: i64 = 3600;

    fn rec(flow: RailFlow, state: RailState, age: i64) -> RailPayment {
        RailPayment {
            id: PaymentId::generate(),
            idempotency_key: "k".into(),
            rail: "airtel".into(),
            kind: PaymentKind::Payment,
            state,
            from_account: AccountId::parse("airtel-disbursements").unwrap(),
            to_account: AccountId::parse("airtel-254733123456").unwrap(),
            amount_minor: 30_000,
            currency: Currency::parse("KES").unwrap(),
            refund_of: None,
            memo: None,
            principal_sub: "agent-1".into(),
            principal_user: Some("carol".into()),
            family_key: None,
            mandate_id: None,
            rail_ref: None,
            receipt: None,
            phone: None,
            reason: None,
            created_at: NOW - age,
            updated_at: NOW,
            flow,
        }
    }

    fn proposal(by: &str, outcome: Outcome, receipt: Option<&str>, age: i64) -> Proposal {
        Proposal { by: by.into(), outcome, receipt: receipt.map(str::to_string), at: NOW - age }
    }

    fn held() -> RailPayment {
        rec(RailFlow::Payout, RailState::Unknown, AFTER)
    }

    #[test]
    fn only_money_sent_out_whose_outcome_is_unknown_and_old_enough() {
        let failed = Outcome::Failed;
        for flow in [RailFlow::Collection, RailFlow::Ledger] {
            let r = rec(flow, RailState::Unknown, AFTER);
            assert_eq!(plan(&r, "alice", failed, None, None, NOW, AFTER), Err(Refusal::NotMoneyOut(flow)));
        }
        for state in [RailState::Pending, RailState::Succeeded, RailState::Failed] {
            let r = rec(RailFlow::Reversal, state, AFTER);
            assert_eq!(plan(&r, "alice", failed, None, None, NOW, AFTER), Err(Refusal::NotUnknown(state)));
        }
        for (flow, state) in [(RailFlow::Payout, RailState::Submitting), (RailFlow::Reversal, RailState::Unknown)] {
            let r = rec(flow, state, AFTER);
            assert_eq!(plan(&r, "alice", failed, None, None, NOW, AFTER), Ok(Plan::Propose));
        }
        // One second short of the bound: the rail may still answer.
        let young = rec(RailFlow::Payout, RailState::Unknown, AFTER - 1);
        assert_eq!(plan(&young, "alice", failed, None, None, NOW, AFTER), Err(Refusal::TooSoon { wait_secs: 1 }));
        let fresh = rec(RailFlow::Payout, RailState::Submitting, 600);
        assert_eq!(plan(&fresh, "alice", failed, None, None, NOW, AFTER), Err(Refusal::TooSoon { wait_secs: 3000 }));
    }

    #[test]
    fn neither_the_agent_nor_its_user_resolves_their_own_payment() {
        for who in ["agent-1", "carol"] {
            assert_eq!(plan(&held(), who, Outcome::Failed, None, None, NOW, AFTER), Err(Refusal::OwnPayment));
        }
    }

    #[test]
    fn a_second_person_confirms_exactly_what_the_first_proposed() {
        let (failed, paid) = (Outcome::Failed, Outcome::Succeeded);
        let p = proposal("alice", failed, None, 10);
        let confirm = Ok(Plan::Confirm { proposed_by: "alice".into() });
        assert_eq!(plan(&held(), "bob", failed, None, Some(&p), NOW, AFTER), confirm);
        // The proposer again is not a second pair of eyes.
        assert_eq!(plan(&held(), "alice", failed, None, Some(&p), NOW, AFTER), Err(Refusal::OwnProposal));
        // Another outcome, or another receipt, is a new proposal, never a confirmation.
        assert_eq!(plan(&held(), "bob", paid, Some("MP1"), Some(&p), NOW, AFTER), Ok(Plan::Propose));
        let p = proposal("alice", paid, Some("MP1"), 10);
        assert_eq!(plan(&held(), "bob", paid, Some("MP2"), Some(&p), NOW, AFTER), Ok(Plan::Propose));
        assert_eq!(plan(&held(), "bob", paid, None, Some(&p), NOW, AFTER), Ok(Plan::Propose));
        assert_eq!(
            plan(&held(), "bob", paid, Some("MP1"), Some(&p), NOW, AFTER),
            Ok(Plan::Confirm { proposed_by: "alice".into() })
        );
        // An expired proposal, or one from the future, confirms nothing.
        let old = proposal("alice", failed, None, PROPOSAL_TTL_SECS);
        assert_eq!(plan(&held(), "bob", failed, None, Some(&old), NOW, AFTER), Ok(Plan::Propose));
        let fresh = proposal("alice", failed, None, PROPOSAL_TTL_SECS - 1);
        assert_eq!(plan(&held(), "bob", failed, None, Some(&fresh), NOW, AFTER), confirm);
        let ahead = proposal("alice", failed, None, -1);
        assert_eq!(plan(&held(), "bob", failed, None, Some(&ahead), NOW, AFTER), Ok(Plan::Propose));
        // Once it expired, the proposer may propose it again.
        assert_eq!(plan(&held(), "alice", failed, None, Some(&old), NOW, AFTER), Ok(Plan::Propose));
    }

    #[test]
    fn outcomes_round_trip_their_names() {
        for o in [Outcome::Failed, Outcome::Succeeded] {
            assert_eq!(Outcome::parse(o.as_str()), Some(o));
        }
        assert_eq!(Outcome::parse("pending"), None);
    }
}
