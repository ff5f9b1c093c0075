//! External rails: the gateway's own record of each payment a rail carries.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::BackendError;
use crate::domain::error::StoreError;
use crate::domain::ids::PaymentId;
use crate::domain::payment::Guards;
use crate::domain::rail::{RailMove, RailOpened, RailPage, RailPayment, RailQuery};

#[async_trait]
pub trait RailStore: Send + Sync {
    /// Open the record of a rail payment and draw its guards (budget, mandate) in one transaction;
    /// the day's usage counts it. A record already open under the same idempotency key is returned
    /// as it is, with nothing drawn again, and `created: false`: an earlier attempt may have sent it
    /// (a crash, or a retry that took over an expired lease), so the caller must not treat it as
    /// unsent. `audit` (the "submitted" record naming the payment) is appended in the same
    /// transaction when the record is created: no rail or external ledger is ever asked to move
    /// money that the audit trail does not name.
    async fn rail_open(
        &self,
        rec: RailPayment,
        guards: Guards,
        audit: Option<AuditRecord>,
        now: UnixSecs,
    ) -> Result<RailOpened, BackendError>;
    /// Move record `m.id` from one of `m.from` to `m.to`, filling what `m.update` knows. `None` when the record
    /// is missing or not in one of `from` (a duplicate or late update changes nothing). Moving to
    /// `Failed` gives back what it drew (budget usage, mandate use): it moved no money.
    async fn rail_transition(&self, m: RailMove<'_>, now: UnixSecs) -> Result<Option<RailPayment>, StoreError>;
    /// Delete a `Submitting` record whose payment the rail refused or never received, giving back
    /// what it drew: the operation may then be tried again from scratch.
    async fn rail_abandon(&self, id: &PaymentId) -> Result<bool, StoreError>;
    async fn rail_get(&self, id: &PaymentId) -> Result<Option<RailPayment>, StoreError>;
    async fn rail_by_key(&self, idempotency_key: &str) -> Result<Option<RailPayment>, StoreError>;
    async fn rail_by_ref(&self, rail: &str, rail_ref: &str) -> Result<Option<RailPayment>, StoreError>;
    /// The records `q` asks for ([`RailQuery`]), oldest first.
    async fn rail_list(&self, q: RailQuery) -> Result<Vec<RailPayment>, StoreError>;
    /// The page `p` asks for ([`RailPage`]), each record with its sequence number (the next
    /// page's `after_seq`).
    async fn rail_since(&self, p: RailPage) -> Result<Vec<(i64, RailPayment)>, StoreError>;
}
