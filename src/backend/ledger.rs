//! The embedded double-entry reference ledger: the default backend. Its tables live in the same
//! database as the idempotency records, so a transfer's postings and its idempotency record commit
//! in one transaction (see `Store::ledger_transfer`).

use std::sync::Arc;

use async_trait::async_trait;

use super::{
    BackendError, Balance, EntryQuery, IntegrityReport, LedgerEntry, Page, Payment, PaymentBackend, PaymentQuery,
    RefundRequest, TransferRequest,
};
use crate::clock::Clock;
use crate::domain::ids::{AccountId, PaymentId};
use crate::store::Store;

pub struct LedgerBackend {
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    checks: crate::store::LedgerChecks,
}

impl LedgerBackend {
    pub fn new(store: Arc<dyn Store>, clock: Arc<dyn Clock>) -> Self {
        LedgerBackend { store, clock, checks: Default::default() }
    }
}

#[async_trait]
impl PaymentBackend for LedgerBackend {
    fn name(&self) -> &'static str {
        "ledger"
    }

    fn records_in_transaction(&self) -> bool {
        true
    }

    async fn transfer(&self, req: TransferRequest) -> Result<Payment, BackendError> {
        self.store.ledger_transfer(req, self.clock.now()).await
    }

    async fn refund(&self, req: RefundRequest) -> Result<Payment, BackendError> {
        self.store.ledger_refund(req, self.clock.now()).await
    }

    async fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, BackendError> {
        Ok(self.store.ledger_payment(id).await?)
    }

    async fn balance(&self, account: &AccountId) -> Result<Option<Balance>, BackendError> {
        Ok(self.store.ledger_balance(account).await?)
    }

    async fn list_payments(&self, query: PaymentQuery) -> Result<Page<Payment>, BackendError> {
        Ok(self.store.ledger_list_payments(query).await?)
    }

    async fn account_entries(&self, q: EntryQuery) -> Result<Page<LedgerEntry>, BackendError> {
        Ok(self.store.ledger_entries(q).await?)
    }

    async fn check_integrity(&self, full: bool) -> Result<IntegrityReport, BackendError> {
        Ok(self.checks.check(&*self.store, full, self.clock.now()).await?)
    }
}
