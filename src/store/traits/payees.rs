//! Payees (beneficiaries): who each agent has been approved to pay, and since when.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::domain::money::Currency;
use crate::domain::payee::PayeeRecord;
use crate::domain::webhook::OutboxMessage;
use crate::store::rows::Columns as _;
use crate::store::{queries, rows};

use super::Engine;

#[async_trait]
pub trait PayeeStore: Engine {
    /// `owner`'s row for `payee` (a revoked one too), and, when `usage` names a day and currency,
    /// what `owner`'s autonomous payments to it total then (the daily cap's usage, written where
    /// each payment commits; 0 when not asked). Statements built once (`store::queries`) for both
    /// engines.
    async fn payee_state(
        &self,
        owner: &str,
        payee: &str,
        usage: Option<(UnixSecs, Currency)>,
    ) -> Result<(Option<PayeeRecord>, i64), StoreError> {
        let dialect = self.dialect();
        let found = self.select_rows(queries::payee(owner, payee, dialect)).await?;
        let rec = rows::map_plain(found, rows::payee)?.into_iter().next();
        let Some((day, currency)) = usage else { return Ok((rec, 0)) };
        let st = queries::payee_usage(owner, payee, day, currency.code(), dialect);
        let paid = match self.select_rows(st).await?.first() {
            Some(row) => row.int(0)?,
            None => 0,
        };
        Ok((rec, paid))
    }
    /// What `owner`'s autonomous payments to `payee` total since it became known at
    /// `known_since` (the cooling-off total's usage, written where each payment commits).
    async fn payee_cooling_paid(
        &self,
        owner: &str,
        payee: &str,
        known_since: UnixSecs,
        currency: Currency,
    ) -> Result<i64, StoreError> {
        let st = queries::payee_cooling_usage(owner, payee, known_since, currency.code(), self.dialect());
        match self.select_rows(st).await?.first() {
            Some(row) => Ok(row.int(0)?),
            None => Ok(0),
        }
    }
    /// [`PayeeStore::payee_add`] for a payee a settled payment taught: only while the mandate it
    /// was drawn on (`mandate_id`) is issued and not revoked, checked in the same transaction
    /// (the mandate's row locked, so a concurrent revoke comes before, and refuses it, or after,
    /// and forgets it: `ApprovalStore::mandate_revoke`).
    async fn payee_learn(
        &self,
        rec: PayeeRecord,
        mandate_id: &str,
        notify: Vec<OutboxMessage>,
    ) -> Result<bool, StoreError>;
    /// Make `rec.payee` known to `rec.owner` from `rec.known_since`. A payee known already keeps
    /// the time it became known (its cooling-off does not start over); a revoked one is known again
    /// from now. Returns whether it was not known before; only then are `notify` (`payee.added`)
    /// written, in the same transaction.
    async fn payee_add(&self, rec: PayeeRecord, notify: Vec<OutboxMessage>) -> Result<bool, StoreError>;
    /// Revoke a known payee; whether it was known.
    async fn payee_revoke(&self, owner: &str, payee: &str, by: &str, at: UnixSecs) -> Result<bool, StoreError>;
    /// Payees, most recently known first (revoked ones too), of one owner when given.
    async fn payee_list(&self, owner: Option<&str>, limit: i64) -> Result<Vec<PayeeRecord>, StoreError>;
}
