//! The reference ledger: accounts, payments and their postings, and the integrity check's facts
//! and checkpoints.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::error::BackendError;
use crate::domain::error::StoreError;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::payment::{AccountSeed, EntryQuery};
use crate::domain::payment::{
    Balance, IntegrityReport, LedgerEntry, Page, Payment, PaymentQuery, RefundRequest, TransferRequest,
};
use crate::domain::rules::integrity::{self, Checkpoint, DeltaFacts, IntegrityFacts};

#[async_trait]
pub trait LedgerStore: Send + Sync {
    async fn ledger_open_account(&self, seed: AccountSeed, now: UnixSecs) -> Result<bool, StoreError>;
    /// Post a transfer and complete its idempotency record in one transaction.
    async fn ledger_transfer(&self, req: TransferRequest, now: UnixSecs) -> Result<Payment, BackendError>;
    /// Post a refund and complete its idempotency record in one transaction.
    async fn ledger_refund(&self, req: RefundRequest, now: UnixSecs) -> Result<Payment, BackendError>;
    async fn ledger_payment(&self, id: &PaymentId) -> Result<Option<Payment>, StoreError>;
    async fn ledger_balance(&self, account: &AccountId) -> Result<Option<Balance>, StoreError>;
    async fn ledger_list_payments(&self, query: PaymentQuery) -> Result<Page<Payment>, StoreError>;
    async fn ledger_entries(&self, q: EntryQuery) -> Result<Page<LedgerEntry>, StoreError>;
    /// The full check's facts (every posting, one snapshot) and, from the same snapshot, the
    /// engine's watermark with the per-account sums of the postings below it.
    async fn integrity_full(&self) -> Result<(IntegrityFacts, Checkpoint), StoreError>;
    /// The incremental check's facts: what was posted at or past `watermark`, every account's
    /// balance, and the watermark now (one snapshot).
    async fn integrity_since(&self, watermark: i64) -> Result<DeltaFacts, StoreError>;
    /// The latest verified checkpoint.
    async fn checkpoint_get(&self) -> Result<Option<Checkpoint>, StoreError>;
    /// Record a verified checkpoint (the engine keeps the latest few).
    async fn checkpoint_put(&self, checkpoint: &Checkpoint) -> Result<(), StoreError>;
    /// The full check, judged (saves nothing).
    async fn ledger_integrity(&self) -> Result<IntegrityReport, StoreError> {
        Ok(integrity::report(self.integrity_full().await?.0))
    }
}
