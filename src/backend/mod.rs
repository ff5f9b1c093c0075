//! The `PaymentBackend` seam: where money actually moves. The embedded double-entry reference
//! ledger is the default; the HTTP ledger implements the same trait. Collection rails (M-Pesa)
//! implement the narrower [`rail::CollectionRail`] seam.
//!
//! Architecture Invariant: every money-moving call carries the idempotency key, and a backend must
//! apply one key at most once. An unknown external outcome is never reported as success.

pub mod airtel;
pub mod breaker;
pub mod http;
pub mod journal;
pub mod kenya;
pub mod ledger;
pub mod mpesa;
pub mod outbound;
pub mod rail;
pub mod simulator;
pub mod simulator_server;
pub mod wallet;

use async_trait::async_trait;

use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::rail::RailMove;

use crate::domain::error::BackendError;
use crate::domain::payment::{
    Balance, EntryQuery, Guards, IntegrityReport, LedgerEntry, Page, Payment, PaymentKind, PaymentQuery, PaymentStatus,
    RefundRequest, TransferRequest,
};

#[async_trait]
pub trait PaymentBackend: Send + Sync + 'static {
    fn name(&self) -> &'static str;
    /// True when `transfer`/`refund` complete the idempotency record(s) and append the request's
    /// audit record in the posting transaction itself (the embedded ledger): the gateway then
    /// skips its own writes for them.
    fn records_in_transaction(&self) -> bool {
        false
    }
    /// True when the backend names its payments itself and cannot take the gateway's id (the
    /// wallet service's UUIDs). The journal then keeps the gateway's id, records the backend's as
    /// the record's `rail_ref`, and answers reads from the record plus the backend's word.
    fn names_its_payments(&self) -> bool {
        false
    }
    /// Whether a payment whose earlier attempt ended unanswered, for `reason` (the record's), may
    /// be sent again under the same key. Yes where the backend applies a key at most once whatever
    /// happened; the wallet service releases a key when its saga fails after holding the money.
    fn resend_safe(&self, _reason: Option<&str>) -> bool {
        true
    }
    /// Settle the gateway's pending records of this backend's payments from the backend's word
    /// (an external ledger that answers before it is final). Records untouched for
    /// `older_than_secs`, until `deadline`; returns how many settled. The poll job calls it.
    async fn settle_pending(&self, _older_than_secs: i64, _deadline: std::time::Instant) -> usize {
        0
    }
    async fn transfer(&self, req: TransferRequest) -> Result<Payment, BackendError>;
    async fn refund(&self, req: RefundRequest) -> Result<Payment, BackendError>;
    async fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, BackendError>;
    async fn balance(&self, account: &AccountId) -> Result<Option<Balance>, BackendError>;
    async fn list_payments(&self, query: PaymentQuery) -> Result<Page<Payment>, BackendError>;
    async fn account_entries(&self, q: EntryQuery) -> Result<Page<LedgerEntry>, BackendError>;
    /// The ledger's integrity: incremental from its last verified checkpoint, or every posting
    /// (`full`, or no checkpoint yet).
    async fn check_integrity(&self, full: bool) -> Result<IntegrityReport, BackendError>;
}

/// Mark a rail record whose send may have reached the other side as `unknown` (from
/// `submitting`): it keeps its draws, is never sent again, and reconciliation settles it. A failed
/// write is logged: the record then stays `submitting`, which a retry and reconciliation also
/// treat as maybe-sent.
pub(crate) async fn mark_unknown(
    store: &dyn crate::store::Store,
    id: &PaymentId,
    reason: String,
    now: crate::clock::UnixSecs,
) {
    use crate::domain::rail::{RailState, RailUpdate};
    let update = RailUpdate { reason: Some(reason), ..Default::default() };
    if let Err(error) = store
        .rail_transition(RailMove { id, from: &[RailState::Submitting], to: RailState::Unknown, update }, now)
        .await
    {
        tracing::error!(payment_id = %id, %error, "marking a rail payment's outcome unknown failed");
    }
}
