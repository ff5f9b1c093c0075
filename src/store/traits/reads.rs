//! Reads across entities (every payment the gateway knows, audit trails, mandates, principals,
//! volumes): statements built once in `store::queries`, mapped once in `store::rows`; an engine
//! only runs them (`Engine::select_rows`). The summary's aggregate is each engine's own SQL.

use async_trait::async_trait;

use super::Engine;
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::domain::ids::PaymentId;
use crate::domain::money::Currency;
use crate::domain::ops::{
    AuditQuery, AuditRelated, MandateListing, MandateQuery, OpsPayment, OpsPaymentQuery, PrincipalState, VolumeRow,
};
use crate::domain::payment::{PaymentKind, PaymentQuery};
use crate::domain::payment::{SummaryQuery, SummaryRow};
use crate::domain::rail::RailPayment;
use crate::domain::rules::guards::BudgetUsage;
use crate::store::{queries, rows};

#[async_trait]
pub trait ReadStore: Engine {
    /// Rail records listed as payments (`list_payments`), newest first by `seq`, with their `seq`
    /// (the listing's cursor): see `queries::rail_payments` for the filters. `q.limit` at most.
    async fn rail_payments(&self, q: PaymentQuery, except_rail: &str) -> Result<Vec<(i64, RailPayment)>, StoreError> {
        if q.accounts.is_empty() {
            return Ok(vec![]);
        }
        rows::map_plain(self.select_rows(queries::rail_payments(&q, except_rail, self.dialect())).await?, rows::rail)
    }

    /// Every payment the gateway knows (reference ledger and rail records), newest first.
    async fn ops_payments(&self, q: OpsPaymentQuery) -> Result<Vec<OpsPayment>, StoreError> {
        rows::map_plain(self.select_rows(queries::ops_payments(&q, self.dialect())).await?, rows::ops_payment)
    }
    async fn ops_payment(&self, id: &PaymentId) -> Result<Option<OpsPayment>, StoreError> {
        let st = queries::ops_payment(id.as_str(), self.dialect());
        Ok(rows::map_plain(self.select_rows(st).await?, rows::ops_payment)?.pop())
    }
    /// Audit records, newest first.
    async fn audit_query(&self, q: AuditQuery) -> Result<Vec<AuditRecord>, StoreError> {
        rows::map_plain(self.select_rows(queries::audit(&q, self.dialect())).await?, rows::audit)
    }
    /// One payment's audit trail, oldest first.
    async fn audit_related(&self, q: AuditRelated) -> Result<Vec<AuditRecord>, StoreError> {
        rows::map_plain(self.select_rows(queries::audit_related(&q, self.dialect())).await?, rows::audit)
    }
    /// Ids of the approvals asked for under these idempotency keys, oldest first.
    async fn approvals_for_keys(&self, keys: Vec<String>) -> Result<Vec<String>, StoreError> {
        rows::map_plain(self.select_rows(queries::approvals_for_keys(&keys, self.dialect())).await?, |r| r.text(0))
    }
    /// Issued mandates, newest first.
    async fn mandate_list(&self, q: MandateQuery) -> Result<Vec<MandateListing>, StoreError> {
        rows::map_plain(self.select_rows(queries::mandates(&q, self.dialect())).await?, rows::mandate_listing)
    }
    async fn mandate_get(&self, id: &str, now: UnixSecs) -> Result<Option<MandateListing>, StoreError> {
        let st = queries::mandate(id, now, self.dialect());
        Ok(rows::map_plain(self.select_rows(st).await?, rows::mandate_listing)?.pop())
    }
    /// Subjects with stop-rule state, suspended ones first.
    async fn principal_states(&self, limit: u32) -> Result<Vec<PrincipalState>, StoreError> {
        rows::map_plain(
            self.select_rows(queries::principal_states(limit, self.dialect())).await?,
            rows::principal_state,
        )
    }
    /// Subjects that called one of `tools` since `since` under any issuer but `internal_issuer`,
    /// with their last call, latest first.
    async fn agents_seen(
        &self,
        since: UnixSecs,
        tools: &[&str],
        internal_issuer: &str,
        limit: u32,
    ) -> Result<Vec<(String, UnixSecs)>, StoreError> {
        let st = queries::agents_seen(since, tools, internal_issuer, limit, self.dialect());
        rows::map_plain(self.select_rows(st).await?, |r| Ok((r.text(0)?, r.int(1)?)))
    }
    /// Every payment in `[from, to)` counted by hour, kind, status and currency.
    async fn volume(&self, from: UnixSecs, to: UnixSecs) -> Result<Vec<VolumeRow>, StoreError> {
        rows::map_plain(self.select_rows(queries::volume(from, to, self.dialect())).await?, rows::volume)
    }

    /// Counts and totals over every payment the gateway knows (the reference ledger's and the rails').
    async fn payment_summary(&self, query: SummaryQuery) -> Result<Vec<SummaryRow>, StoreError>;

    /// A subject's usage of one kind's daily budget on `day`: its payments (every currency) and
    /// its spend in `currency` — what the posting's guard reads, read outside any transaction (the
    /// preflight tool and the headroom an agent is shown).
    async fn budget_usage(
        &self,
        kind: PaymentKind,
        subject: &str,
        day: UnixSecs,
        currency: Currency,
    ) -> Result<BudgetUsage, StoreError> {
        let st = queries::budget_usage(kind, subject, day, currency.code(), self.dialect());
        let used = rows::map_plain(self.select_rows(st).await?, |r| {
            Ok(BudgetUsage { payments: r.int(0)?, spent_minor: r.int(1)? })
        })?;
        Ok(used.into_iter().next().unwrap_or(BudgetUsage { payments: 0, spent_minor: 0 }))
    }
}
