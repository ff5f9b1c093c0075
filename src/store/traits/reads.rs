//! Reads across entities (every payment the gateway knows, audit trails, mandates, principals,
//! volumes): statements built once in `store::queries`, mapped once in `store::rows`; an engine
//! only runs them (`Engine::select_rows`). The summary's aggregate is each engine's own SQL.

use async_trait::async_trait;

use super::Engine;
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::audit_chain::{ChainHead, ChainLink, Checkpoint, Unsealed};
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
use crate::domain::trail_money::{Decided, OriginalRefunds, PaymentFacts};
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

    /// What the refunds recorded against `payment` add up to, in its minor units
    /// (`queries::rail_refunded`): for a backend that keeps no refunded amount of its own.
    async fn rail_refunded(&self, payment: &PaymentId) -> Result<i64, StoreError> {
        use crate::store::rows::Columns as _;
        match self.select_rows(queries::rail_refunded(payment.as_str(), self.dialect())).await?.first() {
            Some(row) => row.int(0),
            None => Ok(0),
        }
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
    /// Audit records not yet sealed onto the chain: how many, and the oldest's seq and time.
    async fn audit_unsealed(&self) -> Result<Unsealed, StoreError> {
        let st = queries::plain(
            "SELECT COUNT(*), MIN(a.seq), MIN(a.at) FROM audit_records a
             WHERE NOT EXISTS (SELECT 1 FROM audit_chain c WHERE c.seq = a.seq)",
            self.dialect(),
        );
        let found = rows::map_plain(self.select_rows(st).await?, |r| {
            let oldest = match (r.opt_int(1)?, r.opt_int(2)?) {
                (Some(seq), Some(at)) => Some((seq, at)),
                _ => None,
            };
            Ok(Unsealed { count: r.int(0)?, oldest })
        })?;
        Ok(found.into_iter().next().unwrap_or_default())
    }
    /// Records not yet sealed, in seq order, after seq `after`: at most `limit` (`audit verify`
    /// checks their writers' tags).
    async fn audit_unsealed_records(&self, after: i64, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        rows::map_plain(
            self.select_rows(queries::audit_unsealed_records(after, limit, self.dialect())).await?,
            rows::audit,
        )
    }
    /// Of the records `seqs`, those still stored: (seq, tag, sealed) — what a writer checks of the
    /// records it wrote (`Gateway::audit_witness_check`).
    async fn audit_witness_read(&self, seqs: &[i64]) -> Result<Vec<(i64, Option<String>, bool)>, StoreError> {
        if seqs.is_empty() {
            return Ok(Vec::new());
        }
        rows::map_plain(self.select_rows(queries::audit_witness_read(seqs, self.dialect())).await?, |r| {
            Ok((r.int(0)?, r.opt_text(1)?, r.int(2)? != 0))
        })
    }
    /// The first record of `tool` still stored: (seq, detail) — `audit verify` asks for a
    /// witness's break record (`domain::audit_chain::WITNESS_TOOL`).
    async fn audit_first_of_tool(&self, tool: &str) -> Result<Option<(i64, Option<String>)>, StoreError> {
        let found = self.select_rows(queries::audit_first_of_tool(tool, self.dialect())).await?;
        rows::map_plain(found, |r| Ok((r.int(0)?, r.opt_text(1)?))).map(|v| v.into_iter().next())
    }
    /// Whether any audit record carries its writer's tag: the store has run a gateway that tags
    /// (records and policy versions were tagged together from then on).
    async fn audit_tagged_era(&self) -> Result<bool, StoreError> {
        let st = queries::plain("SELECT seq FROM audit_records WHERE tag IS NOT NULL LIMIT 1", self.dialect());
        Ok(!self.select_rows(st).await?.is_empty())
    }
    /// The highest policy version any record names (`queries::audit_policy_version_max`).
    async fn audit_policy_version_max(&self) -> Result<Option<i64>, StoreError> {
        let found = self.select_rows(queries::audit_policy_version_max(self.dialect())).await?;
        Ok(rows::map_plain(found, |r| r.opt_int(0))?.into_iter().next().flatten())
    }
    /// The newest signed checkpoint.
    async fn audit_checkpoint_latest(&self) -> Result<Option<Checkpoint>, StoreError> {
        let st = queries::plain(
            "SELECT chain_seq, hash, at, jws FROM audit_checkpoints ORDER BY chain_seq DESC LIMIT 1",
            self.dialect(),
        );
        Ok(rows::map_plain(self.select_rows(st).await?, rows::audit_checkpoint)?.pop())
    }
    /// The newest signed checkpoint before position `before`.
    async fn audit_checkpoint_before(&self, before: i64) -> Result<Option<Checkpoint>, StoreError> {
        let st = queries::audit_checkpoint_before(before, self.dialect());
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
    /// The newest rejection of the same intent under another operation (`queries::rejected_intent`):
    /// its approval id and when it was rejected.
    async fn rejected_intent(
        &self,
        q: crate::domain::approval::RejectedIntent<'_>,
    ) -> Result<Option<(String, i64)>, StoreError> {
        let found = self.select_rows(queries::rejected_intent(&q, self.dialect())).await?;
        rows::map_plain(found, |r| Ok((r.text(0)?, r.int(1)?))).map(|v| v.into_iter().next())
    }
    /// Who issued the unexpired, unused enrolment code `code_sha256` of this person (read only: the
    /// code is consumed by `PasskeyStore::passkey_enrol`).
    async fn passkey_code_issuer(
        &self,
        code_sha256: &str,
        owner_iss: &str,
        owner_sub: &str,
        now: i64,
    ) -> Result<Option<String>, StoreError> {
        let st = queries::passkey_code_issuer(code_sha256, (owner_iss, owner_sub), now, self.dialect());
        rows::map_plain(self.select_rows(st).await?, |r| r.text(0)).map(|v| v.into_iter().next())
    }
    /// The newest payment's creation and the audit trail's newest record or checkpoint
    /// (`queries::audit_freshness`).
    async fn audit_freshness(&self) -> Result<(Option<i64>, Option<i64>), StoreError> {
        let found = rows::map_plain(self.select_rows(queries::audit_freshness(self.dialect())).await?, |r| {
            Ok((r.opt_int(0)?, r.opt_int(1)?))
        })?;
        Ok(found.into_iter().next().unwrap_or((None, None)))
    }
    /// Where the payments the trail must know about begin: with `retained` (retention has archived
    /// part of the trail), after the oldest record still stored (the boundary second left out;
    /// `None` when no record is left); without, every payment.
    async fn trail_payments_since(&self, retained: bool) -> Result<Option<i64>, StoreError> {
        if !retained {
            return Ok(Some(i64::MIN));
        }
        let oldest =
            rows::map_plain(self.select_rows(queries::oldest_audit_record(self.dialect())).await?, |r| r.opt_int(0))?;
        Ok(oldest.into_iter().next().flatten().map(|at| at + 1))
    }
    /// A ledger payment made before `before` that no audit record names
    /// (`queries::unaudited_payment`): its id and creation time, among the payments
    /// [`trail_payments_since`](Self::trail_payments_since) asks about.
    async fn unaudited_payment(&self, retained: bool, before: i64) -> Result<Option<(String, i64)>, StoreError> {
        let Some(since) = self.trail_payments_since(retained).await? else { return Ok(None) };
        let found = self.select_rows(queries::unaudited_payment(since, before, self.dialect())).await?;
        rows::map_plain(found, |r| Ok((r.text(0)?, r.int(1)?))).map(|v| v.into_iter().next())
    }
    /// The first "allowed" record that names a payment the store no longer holds
    /// (`queries::vanished_payment`), among the records made since
    /// [`trail_payments_since`](Self::trail_payments_since) and before `before`: its seq and the
    /// payment's id.
    async fn vanished_payment(&self, retained: bool, before: i64) -> Result<Option<(i64, String)>, StoreError> {
        let Some(since) = self.trail_payments_since(retained).await? else { return Ok(None) };
        let found = self.select_rows(queries::vanished_payment(since, before, self.dialect())).await?;
        rows::map_plain(found, |r| Ok((r.int(0)?, r.text(1)?))).map(|v| v.into_iter().next())
    }
    /// One page of ledger payments made in `[since, before)` with their "allowed" records
    /// (`queries::payment_decisions`), after `after` (created_at, payment id, record seq): each
    /// row's position, what the payment says and what its record decided.
    async fn payment_decisions(
        &self,
        since: i64,
        before: i64,
        after: (i64, String, i64),
        limit: u32,
    ) -> Result<Vec<((i64, String, i64), PaymentFacts, Decided)>, StoreError> {
        let st = queries::payment_decisions(since, before, (after.0, &after.1, after.2), limit, self.dialect());
        rows::map_plain(self.select_rows(st).await?, |r| {
            let id = r.text(0)?;
            let facts = PaymentFacts {
                id: id.clone(),
                kind: r.text(2)?,
                from_account: r.text(3)?,
                to_account: r.text(4)?,
                amount_minor: r.int(5)?,
                currency: r.text(6)?,
                principal_sub: r.text(7)?,
                principal_user: r.opt_text(8)?,
                mandated: r.opt_text(9)?.is_some(),
                refund_of: r.opt_text(14)?,
                status: r.text(15)?,
                created_at: r.int(1)?,
                original: match r.opt_int(17)? {
                    Some(amount_minor) => {
                        Some(OriginalRefunds { amount_minor, refunded_minor: r.int(18)?, refunds_after: r.int(19)? })
                    }
                    None => None,
                },
            };
            let decided = Decided {
                principal_sub: r.text(10)?,
                principal_user: r.opt_text(11)?,
                intent: r.opt_text(12)?,
                at: r.int(16)?,
            };
            Ok(((r.int(1)?, id, r.int(13)?), facts, decided))
        })
    }
    /// The agents that have acted for `user` (`queries::agents_for_user`).
    async fn agents_for_user(&self, user: &str, limit: u32) -> Result<Vec<String>, StoreError> {
        rows::map_plain(self.select_rows(queries::agents_for_user(user, limit, self.dialect())).await?, |r| r.text(0))
    }
    /// One agent's suspensions in force, under `issuer` (or from before issuers were recorded).
    async fn agent_suspensions(&self, issuer: &str, subject: &str) -> Result<Vec<PrincipalState>, StoreError> {
        rows::map_plain(
            self.select_rows(queries::agent_suspensions(issuer, subject, self.dialect())).await?,
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
