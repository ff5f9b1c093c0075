//! Reads across entities (every payment the gateway knows, audit trails, mandates, principals,
//! volumes): statements built once in `store::queries`, mapped once in `store::rows`; an engine
//! only runs them (`Engine::select_rows`). The summary's aggregate is each engine's own SQL.

use async_trait::async_trait;

use super::Engine;
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::audit_chain::{ChainHead, ChainLink, Checkpoint};
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
    /// Links of the audit hash chain after position `after`, in chain order, each with its record
    /// (`None` where the record row is gone).
    async fn audit_chain_links(&self, after: i64, limit: u32) -> Result<Vec<ChainLink>, StoreError> {
        rows::map_plain(
            self.select_rows(queries::audit_chain_links(after, limit, self.dialect())).await?,
            rows::chain_link,
        )
    }
    /// The chain's newest link (genesis when nothing is sealed).
    async fn audit_chain_head(&self) -> Result<ChainHead, StoreError> {
        let st = queries::plain("SELECT chain_seq, hash FROM audit_chain_head WHERE id = 1", self.dialect());
        let head =
            rows::map_plain(self.select_rows(st).await?, |r| Ok(ChainHead { chain_seq: r.int(0)?, hash: r.text(1)? }))?;
        Ok(head.into_iter().next().unwrap_or_else(ChainHead::genesis))
    }
    /// The oldest link still stored (`None`: none is).
    async fn audit_chain_first(&self) -> Result<Option<i64>, StoreError> {
        let st = queries::plain("SELECT MIN(chain_seq) FROM audit_chain", self.dialect());
        Ok(rows::map_plain(self.select_rows(st).await?, |r| r.opt_int(0))?.into_iter().next().flatten())
    }
    /// Audit records not yet sealed onto the chain.
    async fn audit_unsealed(&self) -> Result<i64, StoreError> {
        let st = queries::plain(
            "SELECT COUNT(*) FROM audit_records a WHERE NOT EXISTS (SELECT 1 FROM audit_chain c WHERE c.seq = a.seq)",
            self.dialect(),
        );
        Ok(rows::map_plain(self.select_rows(st).await?, |r| r.int(0))?.into_iter().next().unwrap_or(0))
    }
    /// The newest signed checkpoint.
    async fn audit_checkpoint_latest(&self) -> Result<Option<Checkpoint>, StoreError> {
        let st = queries::plain(
            "SELECT chain_seq, hash, at, jws FROM audit_checkpoints ORDER BY chain_seq DESC LIMIT 1",
            self.dialect(),
        );
        Ok(rows::map_plain(self.select_rows(st).await?, rows::audit_checkpoint)?.pop())
    }
    /// Signed checkpoints after position `after`, oldest first.
    async fn audit_checkpoints(&self, after: i64, limit: u32) -> Result<Vec<Checkpoint>, StoreError> {
        rows::map_plain(
            self.select_rows(queries::audit_checkpoints(after, limit, self.dialect())).await?,
            rows::audit_checkpoint,
        )
    }
    /// The last chain position before the first record made at or after `cutoff` (every record up
    /// to it is older), or `None` when even the first stored link's record is not older.
    async fn audit_chain_older_than(&self, cutoff: UnixSecs) -> Result<Option<i64>, StoreError> {
        let st = queries::audit_chain_older_than(cutoff, self.dialect());
        Ok(rows::map_plain(self.select_rows(st).await?, |r| r.opt_int(0))?.into_iter().next().flatten())
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
