//! The `PaymentBackend` seam: where money actually moves. The embedded double-entry reference
//! ledger is the default; later rails (HTTP ledger, M-Pesa) implement the same trait.
//!
//! Architecture Invariant: every money-moving call carries the idempotency key, and a backend must
//! apply one key at most once. An unknown external outcome is never reported as success.

pub mod http;
pub mod journal;
pub mod ledger;
pub mod mpesa;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::clock::UnixSecs;
use crate::ids::{AccountId, PaymentId};
use crate::money::{Currency, Money, format_minor};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentKind {
    Payment,
    Refund,
}

impl PaymentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PaymentKind::Payment => "payment",
            PaymentKind::Refund => "refund",
        }
    }
}

/// Payment states. `Succeeded` and `Failed` are terminal; `Pending` waits for a rail to settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    Pending,
    Succeeded,
    Failed,
}

impl PaymentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PaymentStatus::Pending => "pending",
            PaymentStatus::Succeeded => "succeeded",
            PaymentStatus::Failed => "failed",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(PaymentStatus::Pending),
            "succeeded" => Some(PaymentStatus::Succeeded),
            "failed" => Some(PaymentStatus::Failed),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Payment {
    pub id: PaymentId,
    pub kind: PaymentKind,
    pub status: PaymentStatus,
    pub from_account: AccountId,
    pub to_account: AccountId,
    pub amount_minor: i64,
    pub currency: Currency,
    pub refunded_minor: i64,
    pub refund_of: Option<PaymentId>,
    pub memo: Option<String>,
    pub principal_sub: String,
    pub created_at: UnixSecs,
}

impl Payment {
    pub fn amount(&self) -> String {
        format_minor(self.amount_minor, self.currency)
    }
    pub fn refundable_minor(&self) -> i64 {
        match (self.kind, self.status) {
            (PaymentKind::Payment, PaymentStatus::Succeeded) => self.amount_minor - self.refunded_minor,
            _ => 0,
        }
    }
    pub fn touches_any(&self, accounts: &[AccountId]) -> bool {
        accounts.contains(&self.from_account) || accounts.contains(&self.to_account)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Balance {
    pub account_id: AccountId,
    pub currency: Currency,
    pub balance_minor: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub seq: i64,
    pub payment_id: Option<PaymentId>,
    pub amount_minor: i64,
    pub currency: Currency,
    pub balance_after_minor: i64,
    pub description: String,
    pub created_at: UnixSecs,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntegrityReport {
    pub ok: bool,
    pub accounts_checked: i64,
    pub postings_checked: i64,
    /// Per currency: the sum of all postings (must be zero).
    pub currency_sums: Vec<(String, i64)>,
    /// Human-readable violations; empty when `ok`.
    pub problems: Vec<String>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Opaque: pass back to get the next page. `None` on the last page.
    pub next_cursor: Option<i64>,
}

/// A UTC day's autonomous spending cap for one subject, checked where payments commit so
/// concurrent calls cannot overshoot it.
#[derive(Debug, Clone, PartialEq)]
pub struct DailyBudget {
    /// Start of the current UTC day.
    pub since: UnixSecs,
    pub max_minor: i64,
    pub max_payments: i64,
}

/// A draw on an issued mandate: its uses and spend are checked and recorded with the payment.
#[derive(Debug, Clone, PartialEq)]
pub struct MandateDraw {
    pub mandate_id: String,
}

/// Checks that must hold in the same transaction as the posting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Guards {
    pub budget: Option<DailyBudget>,
    pub mandate: Option<MandateDraw>,
}

/// Move `amount` from one account to another, exactly once per `idempotency_key`.
#[derive(Debug, Clone)]
pub struct TransferRequest {
    pub idempotency_key: String,
    /// A second idempotency record completed with the same outcome (the operation's own key when
    /// `idempotency_key` is anchored on a closed mandate).
    pub alias_key: Option<String>,
    pub payment_id: PaymentId,
    pub from_account: AccountId,
    pub to_account: AccountId,
    pub amount: Money,
    pub memo: Option<String>,
    pub principal_sub: String,
    pub guards: Guards,
    /// The "allowed" audit record, appended with the postings by backends that record in the
    /// transaction (its payment id is filled in there).
    pub audit: Option<crate::store::AuditRecord>,
}

/// Return (part of) a succeeded payment, exactly once per `idempotency_key`.
#[derive(Debug, Clone)]
pub struct RefundRequest {
    pub idempotency_key: String,
    pub alias_key: Option<String>,
    pub refund_id: PaymentId,
    pub payment_id: PaymentId,
    /// `None` refunds everything still refundable.
    pub amount_minor: Option<i64>,
    pub reason: Option<String>,
    pub principal_sub: String,
    pub guards: Guards,
    pub audit: Option<crate::store::AuditRecord>,
}

#[derive(Debug, Clone, Default)]
pub struct PaymentQuery {
    /// Only payments touching one of these accounts (the principal's allow-list, or one of it).
    pub accounts: Vec<AccountId>,
    pub status: Option<PaymentStatus>,
    pub before_seq: Option<i64>,
    pub limit: u32,
}

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
}

#[async_trait]
pub trait PaymentBackend: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// True when `transfer`/`refund` complete the idempotency record(s) and append the request's
    /// audit record in the posting transaction itself (the embedded ledger): the gateway then
    /// skips its own writes for them.
    fn records_in_transaction(&self) -> bool {
        false
    }
    async fn transfer(&self, req: TransferRequest) -> Result<Payment, BackendError>;
    async fn refund(&self, req: RefundRequest) -> Result<Payment, BackendError>;
    async fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, BackendError>;
    async fn balance(&self, account: &AccountId) -> Result<Option<Balance>, BackendError>;
    async fn list_payments(&self, query: PaymentQuery) -> Result<Page<Payment>, BackendError>;
    async fn account_entries(
        &self,
        account: &AccountId,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Page<LedgerEntry>, BackendError>;
    async fn check_integrity(&self) -> Result<IntegrityReport, BackendError>;
}
