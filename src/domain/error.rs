//! The errors shared by the layers: business refusals and failures of a money-moving call
//! (`BackendError`), and failures of the store (`StoreError`).

use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::Currency;

/// Business refusals are typed so the gateway can map them exhaustively; everything else is
/// `Unavailable` (nothing moved) or `Unknown` (maybe moved: reconcile, never retry blindly).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum BackendError {
    #[error("account {0} does not exist")]
    AccountNotFound(AccountId),
    #[error("account {account} holds {account_currency}, not {requested}")]
    CurrencyMismatch { account: AccountId, account_currency: Currency, requested: Currency },
    #[error("payer and payee are the same account")]
    SameAccount,
    #[error("insufficient funds in {account}: balance {balance}, needed {needed}")]
    InsufficientFunds { account: AccountId, balance: String, needed: String },
    #[error("payment {0} does not exist")]
    PaymentNotFound(PaymentId),
    #[error("payment {0} cannot be refunded (only succeeded payments can)")]
    NotRefundable(PaymentId),
    #[error("refund of {requested} exceeds the {remaining} still refundable")]
    RefundExceedsRemaining { requested: String, remaining: String },
    #[error("this idempotency key was already used for a different operation")]
    IdempotencyKeyReused,
    #[error("daily budget exceeded: {0}")]
    BudgetExceeded(String),
    #[error("mandate cannot be drawn on: {0}")]
    MandateExhausted(String),
    /// The rail refused the request as made (e.g. M-Pesa rejecting a phone number): nothing moved.
    #[error("{0}")]
    Rejected(String),
    #[error("backend unavailable: {0}")]
    Unavailable(String),
    #[error("backend outcome unknown: {0}")]
    OutcomeUnknown(String),
    /// A posting transaction's claim found its key (`key`) already answering: nothing was done.
    /// Only the gateway sees this; it replays, reports the conflict, or waits.
    #[error("idempotency key {key} is already taken")]
    KeyHeld { key: String, reservation: crate::domain::idempotency::Reservation },
}

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(String),
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
}

impl From<StoreError> for BackendError {
    fn from(e: StoreError) -> Self {
        // The transaction rolled back: nothing moved.
        BackendError::Unavailable(e.to_string())
    }
}
