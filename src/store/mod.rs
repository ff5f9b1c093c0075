//! Persistence: one trait, one engine per database. SQLite is the embedded default; PostgreSQL
//! (shared by replicas) implements the same contract.
//!
//! The store owns transactions. Operations that must be atomic (reserve an idempotency key, post a
//! transfer *and* complete its idempotency record) are single store methods, so no caller can
//! split them.

pub mod postgres;
pub mod sqlite;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::backend::{
    BackendError, Balance, IntegrityReport, LedgerEntry, Page, Payment, PaymentQuery, RefundRequest, TransferRequest,
};
use crate::clock::UnixSecs;
use crate::ids::{AccountId, ApprovalId, PaymentId};
use crate::mandate::MandateKind;
use crate::money::Currency;

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Database(String),
    #[error("stored data is inconsistent: {0}")]
    Corrupt(String),
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(e.to_string())
    }
}

/// Audited refusals that count toward a subject's stop rule: policy denials, not argument typos or
/// business outcomes such as insufficient funds.
pub const DENIAL_CODES: &[&str] = &[
    "ACCOUNT_NOT_ALLOWED",
    "INSUFFICIENT_SCOPE",
    "MANDATE_INVALID",
    "MANDATE_EXPIRED",
    "MANDATE_MISMATCH",
    "BUDGET_EXCEEDED",
    "IDEMPOTENCY_CONFLICT",
];

/// What a reservation found under an idempotency key.
#[derive(Debug, Clone, PartialEq)]
pub enum Reservation {
    /// The key is now ours (fresh, expired, or taken over from a crashed holder whose lease ran out).
    Acquired,
    /// Someone completed it; `outcome` is the stored result.
    Completed { fingerprint: String, outcome: String },
    /// Someone holds it and their lease is live.
    InFlight { fingerprint: String },
}

#[derive(Debug, Clone)]
pub struct NewIdempotencyRecord {
    pub key: String,
    pub fingerprint: String,
    pub tool: String,
    pub principal_iss: String,
    pub principal_sub: String,
    pub lease_until: UnixSecs,
    pub expires_at: UnixSecs,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub id: ApprovalId,
    /// pending | approved | rejected | expired
    pub status: String,
    /// closed (one payment) | open (constraints)
    pub kind: MandateKind,
    pub idempotency_key: String,
    pub fingerprint: String,
    pub principal_iss: String,
    pub principal_sub: String,
    pub tool: String,
    pub intent: serde_json::Value,
    pub amount_minor: i64,
    pub currency: Currency,
    pub reason: String,
    pub created_at: UnixSecs,
    pub expires_at: UnixSecs,
    pub reviewers_required: i64,
    /// Who asked: the agent subject, or the operator who pre-authorized.
    pub requested_by: String,
    pub mandate_id: Option<String>,
    pub mandate: Option<String>,
    pub decided_at: Option<UnixSecs>,
    pub decision_reason: Option<String>,
    /// Filled by `approval_get` / `approval_list`.
    #[serde(default)]
    pub reviews: Vec<Review>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Review {
    pub reviewer_iss: String,
    pub reviewer_sub: String,
    /// approve | reject
    pub decision: String,
    pub reason: Option<String>,
    pub at: UnixSecs,
}

/// Why a review was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("no such approval")]
    NotFound,
    #[error("the approval is already {0}")]
    Terminal(String),
    #[error("the approval has expired")]
    Expired,
    #[error("the requesting agent cannot review its own request")]
    SelfReview,
    #[error("this reviewer has already reviewed this approval")]
    AlreadyReviewed,
    #[error("cannot issue the mandate: {0}")]
    Mandate(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The mandate an approval turns into once enough reviewers approve: signed by the caller (who
/// holds the key) inside the review transaction, given the record and its approvers.
pub type MandateIssuer = Box<dyn FnOnce(&ApprovalRecord, &[String]) -> Result<IssuedMandate, String> + Send + 'static>;

#[derive(Debug, Clone)]
pub struct IssuedMandate {
    pub id: String,
    pub jws: String,
    pub budget_minor: Option<i64>,
    pub max_uses: i64,
    pub expires_at: UnixSecs,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub seq: i64,
    pub at: UnixSecs,
    pub correlation_id: String,
    pub principal_iss: String,
    pub principal_sub: String,
    pub tool: String,
    pub decision: String,
    pub code: Option<String>,
    pub idempotency_key: Option<String>,
    pub payment_id: Option<String>,
    pub approval_id: Option<String>,
    pub detail: Option<String>,
}

#[derive(Debug, Clone)]
pub struct AccountSeed {
    pub id: AccountId,
    pub currency: Currency,
    pub opening_minor: i64,
    pub allow_overdraft: bool,
}

/// The `kind` column of approvals and mandates.
pub(crate) fn kind_str(k: MandateKind) -> &'static str {
    match k {
        MandateKind::Closed => "closed",
        MandateKind::Open => "open",
    }
}

/// Whether an existing payment under an idempotency key is the transfer now asked for.
pub(crate) fn same_transfer(existing: &Payment, req: &TransferRequest) -> bool {
    existing.kind == crate::backend::PaymentKind::Payment
        && existing.from_account == req.from_account
        && existing.to_account == req.to_account
        && existing.amount_minor == req.amount.minor()
        && existing.currency == req.amount.currency()
}

#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Readiness: the database answers.
    async fn ping(&self) -> Result<(), StoreError>;

    // --- idempotency ---
    /// The record under `key`, if live: (fingerprint, completed outcome or `None` while in flight).
    async fn idem_peek(&self, key: &str, now: UnixSecs) -> Result<Option<(String, Option<String>)>, StoreError>;
    async fn idem_reserve(&self, rec: NewIdempotencyRecord, now: UnixSecs) -> Result<Reservation, StoreError>;
    /// Complete an in-flight record with `outcome`. A record already completed (by the ledger in
    /// the same transaction as its postings) is left as it is.
    async fn idem_complete(&self, key: &str, outcome: &str) -> Result<(), StoreError>;
    /// Give the key back after a failure that moved nothing and should not be replayed.
    async fn idem_release(&self, key: &str) -> Result<(), StoreError>;
    /// Delete records past retention; returns how many.
    async fn idem_purge(&self, now: UnixSecs) -> Result<u64, StoreError>;

    // --- approvals ---
    /// The live (pending and unexpired, or approved) approval for `rec.idempotency_key`, or `rec`
    /// inserted as a new one. A rejected or expired request needs a new human decision.
    async fn approval_get_or_create(&self, rec: ApprovalRecord, now: UnixSecs) -> Result<ApprovalRecord, StoreError>;
    async fn approval_get(&self, id: &ApprovalId) -> Result<Option<ApprovalRecord>, StoreError>;
    /// Pending, unexpired approvals (the human queue's depth).
    async fn approvals_pending(&self, now: UnixSecs) -> Result<i64, StoreError>;
    /// Insert an operator's pre-authorization as it is (pending until reviewed).
    async fn approval_insert(&self, rec: ApprovalRecord) -> Result<(), StoreError>;
    /// Newest first; `before` is the cursor of the previous page. `status` is as of `now`: a
    /// pending approval past its expiry lists as expired.
    async fn approval_list(
        &self,
        status: Option<&str>,
        before: Option<i64>,
        limit: u32,
        now: UnixSecs,
    ) -> Result<Page<(i64, ApprovalRecord)>, StoreError>;
    /// Record one reviewer's decision; the state machine runs in one transaction. Enough approvals
    /// issue the mandate (`issue`) in the same transaction.
    async fn approval_review(
        &self,
        id: &ApprovalId,
        review: Review,
        now: UnixSecs,
        issue: MandateIssuer,
    ) -> Result<ApprovalRecord, ReviewError>;

    // --- stop rules ---
    /// `Some((suspended_at, reason))` while suspended.
    async fn suspension(&self, subject: &str) -> Result<Option<(UnixSecs, String)>, StoreError>;
    async fn suspend(&self, subject: &str, reason: &str, now: UnixSecs) -> Result<(), StoreError>;
    /// Returns whether it was suspended.
    async fn resume(&self, subject: &str, now: UnixSecs) -> Result<bool, StoreError>;
    /// Policy denials of `subject` audited since `since` (and since its last resume).
    async fn denials_since(&self, subject: &str, since: UnixSecs) -> Result<i64, StoreError>;

    // --- audit (append-only) ---
    async fn audit_append(&self, rec: AuditRecord) -> Result<(), StoreError>;
    /// Newest first; `principal_sub` filters when given.
    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;

    // --- reference ledger ---
    async fn ledger_open_account(&self, seed: AccountSeed, now: UnixSecs) -> Result<bool, StoreError>;
    /// Post a transfer and complete its idempotency record in one transaction.
    async fn ledger_transfer(&self, req: TransferRequest, now: UnixSecs) -> Result<Payment, BackendError>;
    /// Post a refund and complete its idempotency record in one transaction.
    async fn ledger_refund(&self, req: RefundRequest, now: UnixSecs) -> Result<Payment, BackendError>;
    async fn ledger_payment(&self, id: &PaymentId) -> Result<Option<Payment>, StoreError>;
    async fn ledger_balance(&self, account: &AccountId) -> Result<Option<Balance>, StoreError>;
    async fn ledger_list_payments(&self, query: PaymentQuery) -> Result<Page<Payment>, StoreError>;
    async fn ledger_entries(
        &self,
        account: &AccountId,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Page<LedgerEntry>, StoreError>;
    async fn ledger_integrity(&self) -> Result<IntegrityReport, StoreError>;
}
