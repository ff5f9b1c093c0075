//! Persistence: one trait, one engine per database. SQLite is the embedded default; PostgreSQL
//! (shared by replicas) implements the same contract.
//!
//! The store owns transactions. Operations that must be atomic (reserve an idempotency key, post a
//! transfer *and* complete its idempotency record) are single store methods, so no caller can
//! split them.

pub mod sqlite;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::backend::{
    BackendError, Balance, IntegrityReport, LedgerEntry, Page, Payment, PaymentQuery, RefundRequest, TransferRequest,
};
use crate::clock::UnixSecs;
use crate::ids::{AccountId, ApprovalId, PaymentId};
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
    pub status: String,
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
    /// The pending, unexpired approval for `rec.idempotency_key`, or `rec` inserted as a new one.
    async fn approval_get_or_create(&self, rec: ApprovalRecord, now: UnixSecs) -> Result<ApprovalRecord, StoreError>;
    async fn approval_get(&self, id: &ApprovalId) -> Result<Option<ApprovalRecord>, StoreError>;

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
