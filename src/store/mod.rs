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
    BackendError, Balance, Guards, IntegrityReport, LedgerEntry, Page, Payment, PaymentKind, PaymentQuery,
    PaymentStatus, RefundRequest, TransferRequest,
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

/// How far a database's schema is migrated, read without changing anything (`paygate doctor`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SchemaStatus {
    /// Migrations the database has applied.
    pub applied: i64,
    /// Migrations this binary knows.
    pub known: i64,
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
    pub mandate_id: Option<String>,
    /// The rail's own reference (an M-Pesa CheckoutRequestID).
    pub rail_ref: Option<String>,
    /// The rail's receipt for a settled payment (an M-Pesa receipt number).
    pub receipt: Option<String>,
    /// The payer's phone (M-Pesa), normalized.
    pub phone: Option<String>,
    /// Why it failed, or what is still unknown.
    pub reason: Option<String>,
    pub created_at: UnixSecs,
    pub updated_at: UnixSecs,
}

impl RailPayment {
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
            created_at: self.created_at,
        }
    }
}

/// The record `rail_open` found or made.
#[derive(Debug, Clone, PartialEq)]
pub struct RailOpened {
    pub rec: RailPayment,
    /// True when this call opened it (and drew its guards); false when an earlier attempt did.
    pub created: bool,
}

/// A settled (or newly learned) fact about a rail payment.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RailUpdate {
    pub rail_ref: Option<String>,
    pub receipt: Option<String>,
    pub reason: Option<String>,
}

/// Counts and totals of payments by kind, status and currency (`get_payment_summary`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SummaryRow {
    pub kind: String,
    pub status: String,
    pub currency: String,
    pub count: i64,
    pub total_minor: i64,
}

#[derive(Debug, Clone, Default)]
pub struct SummaryQuery {
    /// Only payments touching one of these accounts.
    pub accounts: Vec<AccountId>,
    /// `created_at` in `[from, to)`.
    pub from: UnixSecs,
    pub to: UnixSecs,
    pub currency: Option<Currency>,
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
    /// Mark pending approvals past their expiry `expired` (they already read as expired); returns how many.
    async fn approvals_expire(&self, now: UnixSecs) -> Result<u64, StoreError>;
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

    // --- external rails: the gateway's own record ---
    /// Open the record of a rail payment and draw its guards (budget, mandate) in one transaction;
    /// the day's usage counts it. A record already open under the same idempotency key is returned
    /// as it is, with nothing drawn again, and `created: false`: an earlier attempt may have sent it
    /// (a crash, or a retry that took over an expired lease), so the caller must not treat it as
    /// unsent.
    async fn rail_open(&self, rec: RailPayment, guards: Guards, now: UnixSecs) -> Result<RailOpened, BackendError>;
    /// Move a record from one of `from` to `to`, filling what `update` knows. `None` when the record
    /// is missing or not in one of `from` (a duplicate or late update changes nothing). Moving to
    /// `Failed` gives back what it drew (budget usage, mandate use): it moved no money.
    async fn rail_transition(
        &self,
        id: &PaymentId,
        from: &[RailState],
        to: RailState,
        update: RailUpdate,
        now: UnixSecs,
    ) -> Result<Option<RailPayment>, StoreError>;
    /// Delete a `Submitting` record whose payment the rail refused or never received, giving back
    /// what it drew: the operation may then be tried again from scratch.
    async fn rail_abandon(&self, id: &PaymentId) -> Result<bool, StoreError>;
    async fn rail_get(&self, id: &PaymentId) -> Result<Option<RailPayment>, StoreError>;
    async fn rail_by_key(&self, idempotency_key: &str) -> Result<Option<RailPayment>, StoreError>;
    async fn rail_by_ref(&self, rail: &str, rail_ref: &str) -> Result<Option<RailPayment>, StoreError>;
    /// Records in one of `states` last updated at or before `updated_before`, oldest first.
    async fn rail_list(
        &self,
        states: &[RailState],
        updated_before: UnixSecs,
        limit: u32,
    ) -> Result<Vec<RailPayment>, StoreError>;
    /// Records created at or after `since`, oldest first, after `after_seq` (for paging).
    async fn rail_since(
        &self,
        since: UnixSecs,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<(i64, RailPayment)>, StoreError>;

    // --- analytics and jobs ---
    /// Counts and totals over every payment the gateway knows (the reference ledger's and the rails').
    async fn payment_summary(&self, query: SummaryQuery) -> Result<Vec<SummaryRow>, StoreError>;
    /// Take (or keep) the lease on a scheduled job: `true` when `holder` may run `kind` now.
    /// One runner per kind across every replica sharing the store.
    async fn job_lease(&self, kind: &str, holder: &str, now: UnixSecs, lease_secs: i64) -> Result<bool, StoreError>;
}
