//! The business rules, once: pure functions that take the rows a transaction loaded and return a
//! plan (what to write) or a refusal. The engines (`store::sqlite`, `store::postgres`) keep only
//! SQL, locking order and transactions; they load, call a rule here, and write what it says.
//!
//! Architecture Invariant: no rule does I/O or reads a clock; `now` is always an argument, so each
//! rule is tested table-driven without a database.

pub mod authority;
pub mod fate;
pub mod guards;
pub mod integrity;
pub mod ledger;
pub mod rail;
pub mod refund;
pub mod reservation;
pub mod resolution;
pub mod review;
pub mod transfer;

/// Whether to write a new payment or answer with the one an earlier call under the same
/// idempotency key already made.
#[derive(Debug, Clone, PartialEq)]
pub enum PostingPlan {
    /// The key already posted this very operation: complete its records and return it as it is.
    Replay(crate::domain::payment::Payment),
    /// Post this payment: debit `from_account`, credit `to_account` (guards are drawn next).
    Post(crate::domain::payment::Payment),
}
