//! The exactly-once decision: what each result of a money-moving call does to the operation's
//! idempotency key(s) and how it is audited, from the one classification in
//! `domain::rules::fate` (which the store's posting transaction and the rail journal read too).
//!
//! The protocol around it (peek → policy → claim or reserve → call → settle) is the unit of work
//! in `unit_of_work.rs`; the keys themselves are `keys.rs`.

use crate::domain::error::BackendError;
use crate::domain::payment::Payment;
use crate::domain::rules::fate::{self, KeyFate};
use crate::error::AgentError;
use crate::idempotency::StoredOutcome;

/// What happens to the key(s) once the backend has answered.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Fate {
    /// The backend completed the key(s) and appended the audit record in its own posting
    /// transaction (the embedded ledger's unit of work): nothing is left to write.
    Recorded,
    /// This outcome is the operation's for good, replayed to every retry: a payment, or a business
    /// refusal (TigerBeetle's rule: an id that failed on a state error fails the same way forever).
    Complete(Box<StoredOutcome>),
    /// Nothing moved and the refusal is not the operation's fate (the backend was down, today's
    /// budget is spent): give the key back so the same operation_id can try again.
    Release,
    /// Maybe moved. Keep the key in flight: once its lease ends a retry asks the backend again with
    /// the same key, and reconciliation settles it.
    KeepInFlight,
}

/// A settled call: the key's fate, the audit decision, and what the agent gets.
#[derive(Debug)]
pub(crate) struct Settled {
    pub fate: Fate,
    /// The audit record's decision.
    pub decision: &'static str,
    pub result: Result<Payment, AgentError>,
}

/// Decide what a backend result means. `recorded_in_tx`: the backend records successes in its
/// posting transaction (then a success needs no further writes; a refusal rolled that
/// transaction back, so it is completed here like anyone else's).
pub(crate) fn settle(result: Result<Payment, BackendError>, recorded_in_tx: bool) -> Settled {
    let error = match result {
        Ok(payment) => {
            let fate = if recorded_in_tx {
                Fate::Recorded
            } else {
                Fate::Complete(Box::new(StoredOutcome::Succeeded { payment: payment.clone() }))
            };
            return Settled { fate, decision: "allowed", result: Ok(payment) };
        }
        Err(e) => e,
    };
    let verdict = fate::verdict(&error);
    let agent = AgentError::from(&error);
    let fate = match verdict.key_fate() {
        KeyFate::Complete => Fate::Complete(Box::new(StoredOutcome::failed(&agent))),
        KeyFate::Release => Fate::Release,
        KeyFate::KeepInFlight => Fate::KeepInFlight,
    };
    Settled { fate, decision: verdict.audit_decision(), result: Err(agent) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::{AccountId, PaymentId};
    use crate::domain::money::Currency;
    use crate::domain::payment::{PaymentKind, PaymentStatus};
    use crate::error::ErrorCode;

    fn payment() -> Payment {
        Payment {
            id: PaymentId::generate(),
            kind: PaymentKind::Payment,
            status: PaymentStatus::Succeeded,
            from_account: AccountId::parse("acct-A").unwrap(),
            to_account: AccountId::parse("acct-B").unwrap(),
            amount_minor: 5000,
            currency: Currency::parse("KES").unwrap(),
            refunded_minor: 0,
            refund_of: None,
            memo: None,
            principal_sub: "agent".into(),
            principal_user: None,
            created_at: 0,
        }
    }

    #[test]
    fn a_success_is_completed_unless_the_posting_transaction_recorded_it() {
        let p = payment();
        let s = settle(Ok(p.clone()), false);
        assert_eq!(s.fate, Fate::Complete(Box::new(StoredOutcome::Succeeded { payment: p.clone() })));
        assert_eq!((s.decision, s.result.unwrap()), ("allowed", p.clone()));
        let s = settle(Ok(p.clone()), true);
        assert_eq!(s.fate, Fate::Recorded);
        assert_eq!(s.result.unwrap(), p);
    }

    #[test]
    fn every_backend_error_has_one_fate() {
        let acct = || AccountId::parse("acct-A").unwrap();
        let kes = Currency::parse("KES").unwrap();
        let pid = PaymentId::generate();
        // (error, fate kind, audit decision, agent code). `recorded_in_tx` never changes a refusal's
        // fate: the refused transaction rolled back, so the gateway writes it either way.
        let cases: Vec<(BackendError, &str, &str, ErrorCode)> = vec![
            (BackendError::Unavailable("down".into()), "release", "backend_unavailable", ErrorCode::BackendUnavailable),
            (BackendError::BudgetExceeded("KES".into()), "release", "denied", ErrorCode::BudgetExceeded),
            (BackendError::OutcomeUnknown("timeout".into()), "in_flight", "outcome_unknown", ErrorCode::OutcomeUnknown),
            (BackendError::MandateExhausted("used".into()), "complete", "denied", ErrorCode::MandateInvalid),
            (BackendError::AccountNotFound(acct()), "complete", "failed", ErrorCode::NotFound),
            (
                BackendError::CurrencyMismatch { account: acct(), account_currency: kes, requested: kes },
                "complete",
                "failed",
                ErrorCode::InvalidArgument,
            ),
            (BackendError::SameAccount, "complete", "failed", ErrorCode::InvalidArgument),
            (
                BackendError::InsufficientFunds { account: acct(), balance: "1".into(), needed: "2".into() },
                "complete",
                "failed",
                ErrorCode::InsufficientFunds,
            ),
            (BackendError::PaymentNotFound(pid.clone()), "complete", "failed", ErrorCode::NotFound),
            (BackendError::NotRefundable(pid), "complete", "failed", ErrorCode::InvalidArgument),
            (
                BackendError::RefundExceedsRemaining { requested: "2".into(), remaining: "1".into() },
                "complete",
                "failed",
                ErrorCode::InvalidArgument,
            ),
            (BackendError::IdempotencyKeyReused, "complete", "failed", ErrorCode::IdempotencyConflict),
            (BackendError::Rejected("bad phone".into()), "complete", "failed", ErrorCode::InvalidArgument),
            // Only the posting transaction's claim answers KeyHeld, and the unit of work handles it
            // before settling (replay, conflict or wait). Should one ever reach here it fails
            // closed: the key stays in flight (nothing is written over the holder's) and the agent
            // is told to retry, never that it failed for good.
            (
                BackendError::KeyHeld {
                    key: "k".into(),
                    reservation: crate::domain::idempotency::Reservation::InFlight { fingerprint: "f".into() },
                },
                "in_flight",
                "key_held",
                ErrorCode::Internal,
            ),
        ];
        for (error, fate, decision, code) in cases {
            for in_tx in [false, true] {
                let s = settle(Err(error.clone()), in_tx);
                let kind = match &s.fate {
                    Fate::Recorded => "recorded",
                    Fate::Complete(outcome) => match outcome.as_ref() {
                        StoredOutcome::Failed { code: stored, .. } => {
                            assert_eq!(
                                stored,
                                code.as_str(),
                                "{error:?}: the stored refusal is the one the agent sees"
                            );
                            "complete"
                        }
                        StoredOutcome::Succeeded { .. } => "complete-success",
                    },
                    Fate::Release => "release",
                    Fate::KeepInFlight => "in_flight",
                };
                assert_eq!((kind, s.decision), (fate, decision), "{error:?} (in_tx {in_tx})");
                assert_eq!(s.result.unwrap_err().code, code, "{error:?}");
            }
        }
    }
}
