//! The gateway's own record of a payment made through an external rail (`rail_payments`).

use serde::{Deserialize, Serialize};

use crate::clock::UnixSecs;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::Currency;
use crate::domain::payment::{Payment, PaymentKind, PaymentStatus};

/// Where a payment made through an external rail stands, in the gateway's own record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RailState {
    /// Guards drawn, the rail not yet answered (or answered "unavailable": nothing moved yet).
    Submitting,
    /// Sent, and the rail's answer was lost: maybe moved. Reconciliation settles it.
    Unknown,
    /// Accepted by the rail, waiting for its asynchronous outcome (an M-Pesa STK push).
    Pending,
    Succeeded,
    Failed,
}

impl RailState {
    pub fn as_str(self) -> &'static str {
        match self {
            RailState::Submitting => "submitting",
            RailState::Unknown => "unknown",
            RailState::Pending => "pending",
            RailState::Succeeded => "succeeded",
            RailState::Failed => "failed",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "submitting" => RailState::Submitting,
            "unknown" => RailState::Unknown,
            "pending" => RailState::Pending,
            "succeeded" => RailState::Succeeded,
            "failed" => RailState::Failed,
            _ => return None,
        })
    }
    /// The status an agent sees: anything not settled is `pending`.
    pub fn status(self) -> PaymentStatus {
        match self {
            RailState::Succeeded => PaymentStatus::Succeeded,
            RailState::Failed => PaymentStatus::Failed,
            _ => PaymentStatus::Pending,
        }
    }
    pub fn is_terminal(self) -> bool {
        matches!(self, RailState::Succeeded | RailState::Failed)
    }
}

/// Which way money goes through a rail record.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RailFlow {
    /// In, from a customer (an M-Pesa STK push): settled when the rail confirms it.
    Collection,
    /// Out, to a customer (an M-Pesa B2C payment).
    Payout,
    /// Out: a collection given back in full.
    Reversal,
    /// An external ledger's own record of a payment sent to it.
    Ledger,
}

impl RailFlow {
    pub fn as_str(self) -> &'static str {
        match self {
            RailFlow::Collection => "collection",
            RailFlow::Payout => "payout",
            RailFlow::Reversal => "reversal",
            RailFlow::Ledger => "ledger",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "collection" => RailFlow::Collection,
            "payout" => RailFlow::Payout,
            "reversal" => RailFlow::Reversal,
            "ledger" => RailFlow::Ledger,
            _ => return None,
        })
    }
    /// Money leaving through the rail: its result is the rail's final word (there is nothing to
    /// ask synchronously), and it may arrive before the request's own answer, or after it was lost.
    pub fn is_outbound(self) -> bool {
        matches!(self, RailFlow::Payout | RailFlow::Reversal)
    }
}

/// The gateway's record of one payment made through an external rail (`rail_payments`).
#[derive(Debug, Clone, PartialEq)]
pub struct RailPayment {
    pub id: PaymentId,
    pub idempotency_key: String,
    /// "http" or "mpesa".
    pub rail: String,
    pub kind: PaymentKind,
    pub state: RailState,
    pub from_account: AccountId,
    pub to_account: AccountId,
    pub amount_minor: i64,
    pub currency: Currency,
    pub refund_of: Option<PaymentId>,
    pub memo: Option<String>,
    pub principal_sub: String,
    /// The user the agent acted for, if it did.
    pub principal_user: Option<String>,
    pub mandate_id: Option<String>,
    /// The rail's own reference (an M-Pesa CheckoutRequestID).
    pub rail_ref: Option<String>,
    /// The rail's receipt for a settled payment (an M-Pesa receipt number).
    pub receipt: Option<String>,
    /// The customer's phone (who pays a collection, who is paid a payout), normalized; for a
    /// payment to a business, its paybill or till number. A result naming another is refused.
    pub phone: Option<String>,
    /// Why it failed, or what is still unknown.
    pub reason: Option<String>,
    pub created_at: UnixSecs,
    pub updated_at: UnixSecs,
    pub flow: RailFlow,
    /// The operation's family key (`gateway::routing::operation_family`: a payout or a collection
    /// whichever rail carries it): one record per family across rails. `None`: a flow without
    /// one (ledger postings, reversals), or a record from before.
    pub family_key: Option<String>,
}

impl RailPayment {
    /// The subject its budget draw is kept under (`domain::principal::usage_subject`).
    pub fn usage_subject(&self) -> String {
        crate::domain::principal::usage_subject(&self.principal_sub, self.principal_user.as_deref())
    }

    /// The payment as agents see it.
    pub fn payment(&self) -> Payment {
        Payment {
            id: self.id.clone(),
            kind: self.kind,
            status: self.state.status(),
            from_account: self.from_account.clone(),
            to_account: self.to_account.clone(),
            amount_minor: self.amount_minor,
            currency: self.currency,
            refunded_minor: 0,
            refund_of: self.refund_of.clone(),
            memo: self.memo.clone(),
            principal_sub: self.principal_sub.clone(),
            principal_user: self.principal_user.clone(),
            created_at: self.created_at,
        }
    }
}

/// Where a collection stands by the rail's word (a callback or a status query).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    /// Paid.
    Succeeded,
    /// Definitely not paid, and why: the record fails and its draws are given back.
    Failed(String),
    /// Still open at the rail (the payer has not answered), or the rail could not be asked: stays
    /// pending with the reason; the next query asks again.
    Pending(String),
    /// An answer this gateway does not know. Never success: stays pending with the reason, and
    /// reconciliation looks at it.
    Unrecognised(String),
}

impl Settlement {
    /// Why it is not (yet) a success; `None` for a success.
    pub fn reason(&self) -> Option<&str> {
        match self {
            Settlement::Succeeded => None,
            Settlement::Failed(reason) | Settlement::Pending(reason) | Settlement::Unrecognised(reason) => Some(reason),
        }
    }
}

/// What a rail says about a record whose outcome is unknown when people are about to settle it by
/// hand (`gateway::resolution`): its own word wins, and only a rail that says it has no such
/// payment, or that has no synchronous answer to give at all, leaves it to them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// The rail knows the payment: its word (settled, or still in progress).
    Known(Settlement),
    /// The rail says it has no such payment.
    NotFound,
    /// The rail could not be asked now (unreachable, or it refused the question): ask again later.
    NoAnswer(String),
    /// The rail cannot be asked about it and answer now: its status answers come by callback
    /// (M-Pesa), or it gave no reference to ask by (an Airtel refund whose answer was lost).
    CannotBeAsked,
}

/// Records (of `rail`, or of every rail) in one of `states` last updated at or before
/// `updated_before`, oldest first: what reconciliation and polling look for.
#[derive(Debug, Clone, PartialEq)]
pub struct RailQuery {
    pub rail: Option<String>,
    pub states: Vec<RailState>,
    pub updated_before: UnixSecs,
    pub limit: u32,
}

/// Records created at or after `since`, oldest first, after `after_seq`: one page of a walk over
/// every record (reconciliation).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RailPage {
    pub since: UnixSecs,
    pub after_seq: i64,
    pub limit: u32,
}

/// The record `rail_open` found or made.
#[derive(Debug, Clone, PartialEq)]
pub struct RailOpened {
    pub rec: RailPayment,
    /// True when this call opened it (and drew its guards); false when an earlier attempt did.
    pub created: bool,
}

/// One compare-and-set move of a rail record: from one of `from` to `to`, writing what `update`
/// knows. A record not in one of `from` does not move (a duplicate or late word changes nothing).
#[derive(Debug, Clone, PartialEq)]
pub struct RailMove<'a> {
    pub id: &'a PaymentId,
    pub from: &'a [RailState],
    pub to: RailState,
    pub update: RailUpdate,
}

/// A settled (or newly learned) fact about a rail payment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RailUpdate {
    pub rail_ref: Option<String>,
    pub receipt: Option<String>,
    pub reason: Option<String>,
    /// The audit record of the word that moved it (a callback, a status query), appended in the
    /// move's transaction: a record never settles without the trail saying why.
    pub audit: Option<crate::domain::audit::AuditRecord>,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names `rail_payments` keeps: each reads back, nothing else parses.
    #[test]
    fn states_and_flows_read_back_as_stored() {
        use RailState::*;
        for s in [Submitting, Unknown, Pending, Succeeded, Failed] {
            assert_eq!(RailState::parse(s.as_str()), Some(s));
        }
        for f in [RailFlow::Collection, RailFlow::Payout, RailFlow::Reversal, RailFlow::Ledger] {
            assert_eq!(RailFlow::parse(f.as_str()), Some(f));
        }
        for junk in ["", "Pending", "refund", "collections"] {
            assert_eq!((RailState::parse(junk), RailFlow::parse(junk)), (None, None), "{junk:?}");
        }
    }

    /// An agent sees settled states as they are and everything else as pending.
    #[test]
    fn agents_see_only_settled_states_as_final() {
        use RailState::*;
        let seen = [Submitting, Unknown, Pending, Succeeded, Failed].map(RailState::status);
        use PaymentStatus as P;
        assert_eq!(seen, [P::Pending, P::Pending, P::Pending, P::Succeeded, P::Failed]);
        let terminal = [Submitting, Unknown, Pending, Succeeded, Failed].map(RailState::is_terminal);
        assert_eq!(terminal, [false, false, false, true, true]);
    }

    #[test]
    fn payouts_and_reversals_are_the_outbound_flows() {
        let out =
            [RailFlow::Collection, RailFlow::Payout, RailFlow::Reversal, RailFlow::Ledger].map(RailFlow::is_outbound);
        assert_eq!(out, [false, true, true, false]);
    }

    #[test]
    fn a_settlement_gives_its_reason_unless_it_succeeded() {
        assert_eq!(Settlement::Succeeded.reason(), None);
        assert_eq!(Settlement::Failed("cancelled".into()).reason(), Some("cancelled"));
        assert_eq!(Settlement::Pending("waiting".into()).reason(), Some("waiting"));
        assert_eq!(Settlement::Unrecognised("code 42".into()).reason(), Some("code 42"));
    }
}
