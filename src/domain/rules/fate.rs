//! What a money-moving call's answer means, once: the one classification of [`BackendError`] that
//! the gateway's unit of work (what happens to the operation's keys, how it is audited), the
//! store's posting transaction (what a refusal leaves under the keys it claimed) and the rail
//! journal (what happens to the rail record) all read. One exhaustive `match`: a new variant does
//! not compile until someone decides whether money may have moved and whether the refusal is the
//! operation's fate.

use crate::domain::error::BackendError;

/// What an error says about the money and the operation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing reached the payment system (or it said it did nothing): try again later.
    Unavailable,
    /// Maybe moved: the payment system did not say. Never retried blindly; reconciliation settles it.
    Unknown,
    /// A posting transaction's claim found the key already answering: nothing was done here, the
    /// key's holder decides (replay, conflict, or wait).
    Held,
    /// A guard refused it: nothing moved. `for_good`: the refusal is the operation's fate (a
    /// mandate used up stays used up); otherwise it may succeed later (today's budget is spent).
    Denied { for_good: bool },
    /// The payment system refused it as made: nothing moved, and it never will under this key
    /// (TigerBeetle's rule: an id that failed on a state error fails the same way forever).
    Failed,
}

/// What happens to the operation's idempotency key(s) once the backend has answered.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeyFate {
    /// The answer is the operation's for good: stored, and replayed to every retry.
    Complete,
    /// Nothing moved and the refusal is not the operation's fate: the key is given back, so the
    /// same operation_id can try again.
    Release,
    /// Maybe moved: the key stays in flight; once its lease ends a retry asks the backend again
    /// with the same key.
    KeepInFlight,
}

/// The verdict on one error.
pub fn verdict(e: &BackendError) -> Verdict {
    match e {
        BackendError::Unavailable(_) => Verdict::Unavailable,
        BackendError::OutcomeUnknown(_) => Verdict::Unknown,
        BackendError::KeyHeld { .. } => Verdict::Held,
        BackendError::BudgetExceeded(_) => Verdict::Denied { for_good: false },
        BackendError::MandateExhausted(_) => Verdict::Denied { for_good: true },
        BackendError::AccountNotFound(_)
        | BackendError::CurrencyMismatch { .. }
        | BackendError::SameAccount
        | BackendError::InsufficientFunds { .. }
        | BackendError::PaymentNotFound(_)
        | BackendError::NotRefundable(_)
        | BackendError::RefundExceedsRemaining { .. }
        | BackendError::IdempotencyKeyReused
        | BackendError::Rejected(_) => Verdict::Failed,
    }
}

impl Verdict {
    /// What the operation's key(s) become.
    pub fn key_fate(self) -> KeyFate {
        match self {
            Verdict::Unavailable | Verdict::Denied { for_good: false } => KeyFate::Release,
            // A held key is its holder's: leave it be.
            Verdict::Unknown | Verdict::Held => KeyFate::KeepInFlight,
            Verdict::Denied { for_good: true } | Verdict::Failed => KeyFate::Complete,
        }
    }

    /// The audit record's decision for a call that ended so.
    pub fn audit_decision(self) -> &'static str {
        match self {
            Verdict::Unavailable => "backend_unavailable",
            Verdict::Unknown => "outcome_unknown",
            Verdict::Held => "key_held",
            Verdict::Denied { .. } => "denied",
            Verdict::Failed => "failed",
        }
    }

    /// Whether the payment system certainly moved nothing for this call (a refusal or an
    /// unanswered send): what was drawn for it can be given back.
    pub fn moved_nothing(self) -> bool {
        matches!(self, Verdict::Unavailable | Verdict::Denied { .. } | Verdict::Failed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::{AccountId, PaymentId};
    use crate::domain::money::Currency;

    #[test]
    fn every_error_has_one_verdict_and_one_key_fate() {
        let acct = || AccountId::parse("acct-A").unwrap();
        let kes = Currency::parse("KES").unwrap();
        let pid = PaymentId::generate();
        let held = BackendError::KeyHeld {
            key: "k".into(),
            reservation: crate::domain::idempotency::Reservation::InFlight { fingerprint: "f".into() },
        };
        let cases: Vec<(BackendError, KeyFate, &str, bool)> = vec![
            (BackendError::Unavailable("down".into()), KeyFate::Release, "backend_unavailable", true),
            (BackendError::BudgetExceeded("KES".into()), KeyFate::Release, "denied", true),
            (BackendError::OutcomeUnknown("timeout".into()), KeyFate::KeepInFlight, "outcome_unknown", false),
            (held, KeyFate::KeepInFlight, "key_held", false),
            (BackendError::MandateExhausted("used".into()), KeyFate::Complete, "denied", true),
            (BackendError::AccountNotFound(acct()), KeyFate::Complete, "failed", true),
            (
                BackendError::CurrencyMismatch { account: acct(), account_currency: kes, requested: kes },
                KeyFate::Complete,
                "failed",
                true,
            ),
            (BackendError::SameAccount, KeyFate::Complete, "failed", true),
            (
                BackendError::InsufficientFunds { account: acct(), balance: "1".into(), needed: "2".into() },
                KeyFate::Complete,
                "failed",
                true,
            ),
            (BackendError::PaymentNotFound(pid.clone()), KeyFate::Complete, "failed", true),
            (BackendError::NotRefundable(pid), KeyFate::Complete, "failed", true),
            (
                BackendError::RefundExceedsRemaining { requested: "2".into(), remaining: "1".into() },
                KeyFate::Complete,
                "failed",
                true,
            ),
            (BackendError::IdempotencyKeyReused, KeyFate::Complete, "failed", true),
            (BackendError::Rejected("bad phone".into()), KeyFate::Complete, "failed", true),
        ];
        for (error, fate, decision, nothing) in cases {
            let v = verdict(&error);
            assert_eq!((v.key_fate(), v.audit_decision(), v.moved_nothing()), (fate, decision, nothing), "{error:?}");
        }
    }
}
