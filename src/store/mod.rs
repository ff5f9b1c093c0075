//! Persistence: one trait, one engine per database. SQLite is the embedded default; PostgreSQL
//! (shared by replicas) implements the same contract.
//!
//! The store owns transactions. Operations that must be atomic (reserve an idempotency key, post a
//! transfer *and* complete its idempotency record) are single store methods, so no caller can
//! split them.

pub mod postgres;
pub(crate) mod queries;
pub(crate) mod rows;
pub mod sqlite;

use async_trait::async_trait;

use crate::clock::UnixSecs;
pub use crate::domain::approval::{ApprovalRecord, ApprovalRequest, IssuedMandate, MandateIssuer, Review, ReviewError};
pub use crate::domain::audit::{AuditRecord, DENIAL_CODES};
use crate::domain::error::BackendError;
pub use crate::domain::error::StoreError;
pub use crate::domain::idempotency::{NewIdempotencyRecord, Reservation};
pub use crate::domain::ops::{
    AuditQuery, AuditRelated, MandateListing, MandateQuery, MandateStatus, OpsPayment, OpsPaymentQuery, PrincipalState,
    VolumeRow,
};
pub use crate::domain::payment::{AccountSeed, SummaryQuery, SummaryRow};
pub use crate::domain::principal::{PrincipalRef, SuspensionScope};

/// What counts toward a principal's stop rule (`store::DENIAL_CODES` and throttled RATE_LIMITED
/// records, counted by the refusals each stands for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Denials {
    /// Audited policy denials.
    pub denials: i64,
    /// RATE_LIMITED answers (a throttled record counts its repeats).
    pub rate_limited: i64,
}
use crate::domain::payment::{
    Balance, Guards, IntegrityReport, LedgerEntry, Page, Payment, PaymentQuery, RefundRequest, TransferRequest,
};
pub use crate::domain::rail::{RailFlow, RailOpened, RailPayment, RailState, RailUpdate};
use crate::domain::rules::integrity::{self, Checkpoint, DeltaFacts, IntegrityFacts};
use crate::ids::{AccountId, ApprovalId, PaymentId};

/// The outcome a posting stores on the idempotency record(s) it completes in its own transaction.
pub(crate) fn completed_outcome(p: &Payment) -> String {
    crate::idempotency::StoredOutcome::Succeeded { payment: p.clone() }.to_json()
}

/// What a posting transaction writes besides the payment itself: the idempotency records it
/// completes and the audit record it appends, and the guards it draws.
pub(crate) struct Posting<'a> {
    pub key: &'a str,
    pub alias: Option<&'a str>,
    pub guards: &'a Guards,
    pub audit: &'a Option<AuditRecord>,
}

impl<'a> From<&'a TransferRequest> for Posting<'a> {
    fn from(r: &'a TransferRequest) -> Self {
        Posting { key: &r.idempotency_key, alias: r.alias_key.as_deref(), guards: &r.guards, audit: &r.audit }
    }
}

impl<'a> From<&'a RefundRequest> for Posting<'a> {
    fn from(r: &'a RefundRequest) -> Self {
        Posting { key: &r.idempotency_key, alias: r.alias_key.as_deref(), guards: &r.guards, audit: &r.audit }
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
    /// The approval for `rec.idempotency_key` (`domain::rules::review::on_request` decides which
    /// answers: pending, approved or rejected; an expired one is asked again), or `rec` inserted as a
    /// new one unless its agent has `pending_max` approvals waiting already.
    async fn approval_get_or_create(
        &self,
        rec: ApprovalRecord,
        now: UnixSecs,
        pending_max: i64,
    ) -> Result<ApprovalRequest, StoreError>;
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

    /// Count one more URL-elicitation round answered for this approval, unless `max` were answered
    /// already: the round's number, or `None` once the bound is reached (whichever sealed state the
    /// client presented: the count is the server's).
    async fn approval_elicitation_round(&self, id: &ApprovalId, max: i64) -> Result<Option<i64>, StoreError>;

    // --- stop rules ---
    /// `Some((suspended_at, reason))` while suspended.
    /// Revoke the mandate an approval issued (`None`: none, or it was revoked already). Draws on it
    /// are refused from then on, in the posting transaction.
    async fn mandate_revoke(
        &self,
        approval_id: &ApprovalId,
        by: &str,
        now: UnixSecs,
    ) -> Result<Option<String>, StoreError>;
    /// `Some((suspended_at, reason))` while `who` is suspended: the agent as a whole, or this very
    /// (agent, user) pair. A row from before issuers were recorded applies under any issuer.
    async fn suspension(&self, who: &PrincipalRef) -> Result<Option<(UnixSecs, String)>, StoreError>;
    /// Suspend (issuer, subject) for what `scope` covers; whether it was not suspended already.
    async fn suspend(
        &self,
        issuer: &str,
        subject: &str,
        scope: &SuspensionScope,
        reason: &str,
        now: UnixSecs,
    ) -> Result<bool, StoreError>;
    /// Lift the agent's suspensions: every one (`user` = `None`), or only that of the agent acting
    /// for `user`. Returns whether any was lifted.
    async fn resume(&self, issuer: &str, subject: &str, user: Option<&str>, now: UnixSecs) -> Result<bool, StoreError>;
    /// What counts toward `who`'s stop rule, audited since `since` and since its last resume.
    async fn denials_since(&self, who: &PrincipalRef, since: UnixSecs) -> Result<Denials, StoreError>;

    // --- audit (append-only) ---
    async fn audit_append(&self, rec: AuditRecord) -> Result<(), StoreError>;
    /// Newest first; `principal_sub` filters when given.
    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;
    /// The oldest records made before `cutoff`, oldest first, at most `limit` (for archival).
    async fn audit_before(&self, cutoff: UnixSecs, limit: u32) -> Result<Vec<AuditRecord>, StoreError>;
    /// Delete the records `first_seq ..= last_seq` made before `cutoff` (once archived); how many.
    async fn audit_delete(&self, first_seq: i64, last_seq: i64, cutoff: UnixSecs) -> Result<u64, StoreError>;

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
    /// Records (of `rail`, or of every rail) in one of `states` last updated at or before
    /// `updated_before`, oldest first.
    async fn rail_list(
        &self,
        rail: Option<&str>,
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

    // --- operator reads: statements built once in `store::queries`, mapped once in `store::rows`;
    //     an engine only runs them (`select_rows`) ---
    #[doc(hidden)]
    fn dialect(&self) -> queries::Dialect;
    #[doc(hidden)]
    async fn select_rows(&self, st: queries::Statement) -> Result<Vec<rows::PlainRow>, StoreError>;

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

    // --- analytics and jobs ---
    /// Counts and totals over every payment the gateway knows (the reference ledger's and the rails').
    async fn payment_summary(&self, query: SummaryQuery) -> Result<Vec<SummaryRow>, StoreError>;
    /// Take (or keep) the lease on a scheduled job: `true` when `holder` may run `kind` now.
    /// One runner per kind across every replica sharing the store.
    async fn job_lease(&self, kind: &str, holder: &str, now: UnixSecs, lease_secs: i64) -> Result<bool, StoreError>;
}

/// Newest checkpoints kept; older ones are deleted when a new one is recorded.
pub const CHECKPOINTS_KEPT: i64 = 8;

/// The ledger check (one copy for every engine and for the ledger service): incremental from the
/// last verified checkpoint, or a full scan when `full` is asked or there is no checkpoint yet. A
/// clean result is recorded as the next checkpoint; a failed one leaves the last good one.
pub async fn check_ledger(store: &dyn Store, full: bool, now: UnixSecs) -> Result<IntegrityReport, StoreError> {
    let from = if full { None } else { store.checkpoint_get().await? };
    let (report, next) = match from {
        Some(from) => integrity::incremental(&from, store.integrity_since(from.watermark).await?, now),
        None => {
            let (facts, covered) = store.integrity_full().await?;
            integrity::full(facts, Checkpoint { at: now, ..covered })
        }
    };
    if let Some(next) = next {
        store.checkpoint_put(&next).await?;
    }
    Ok(report)
}

/// One ledger check at a time in this process, shared by everything that asks for one (the tool,
/// the scheduled job, reconciliation, the ledger service's route). A caller that arrives while a
/// check runs waits for it and then shares the next one with everyone else who waited, so a flood
/// of `full: true` calls costs at most two scans (the one running when they arrived and one that
/// began after all of them) instead of one scan per call, and scans never run side by side. A shared report never predates the call:
/// it comes from a check that began after the caller arrived, and a full call is only ever answered
/// by a full check.
#[derive(Default)]
pub struct LedgerChecks {
    /// Callers counted so far; a check that began when this read `n` covers callers `1..=n`.
    arrivals: std::sync::atomic::AtomicU64,
    last: tokio::sync::Mutex<Option<LastCheck>>,
}

struct LastCheck {
    covers: u64,
    full: bool,
    report: IntegrityReport,
}

impl LedgerChecks {
    pub async fn check(&self, store: &dyn Store, full: bool, now: UnixSecs) -> Result<IntegrityReport, StoreError> {
        self.coalesce(full, || check_ledger(store, full, now)).await
    }

    async fn coalesce<E, F, Fut>(&self, full: bool, run: F) -> Result<IntegrityReport, E>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Result<IntegrityReport, E>>,
    {
        use std::sync::atomic::Ordering::SeqCst;
        let ticket = self.arrivals.fetch_add(1, SeqCst) + 1;
        // Tokio's mutex is fair: waiters take it in arrival order. A dropped holder (a request that
        // timed out mid-scan) releases it, and the next waiter runs its own check.
        let mut last = self.last.lock().await;
        if let Some(l) = last.as_ref().filter(|l| l.covers >= ticket && (l.full || !full)) {
            return Ok(l.report.clone());
        }
        let covers = self.arrivals.load(SeqCst);
        let report = run().await?;
        *last = Some(LastCheck { covers, full, report: report.clone() });
        Ok(report)
    }

    /// Callers counted so far (for tests that wait until callers are queued).
    #[cfg(test)]
    fn arrived(&self) -> u64 {
        self.arrivals.load(std::sync::atomic::Ordering::SeqCst)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicU32, Ordering::SeqCst};

    use super::*;

    fn report(run: u32, mode: &str) -> IntegrityReport {
        IntegrityReport {
            ok: true,
            accounts_checked: 0,
            postings_checked: i64::from(run),
            currency_sums: vec![],
            problems: vec![],
            mode: mode.into(),
            since: None,
        }
    }

    /// Starts a full check that holds the gate until `release` fires; returns once it is running.
    async fn hold(
        checks: &Arc<LedgerChecks>,
        runs: &Arc<AtomicU32>,
        mode: &'static str,
    ) -> (tokio::task::JoinHandle<IntegrityReport>, tokio::sync::oneshot::Sender<()>) {
        let (started, running) = tokio::sync::oneshot::channel();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let (c, r) = (checks.clone(), runs.clone());
        let held = tokio::spawn(async move {
            c.coalesce(mode == "full", || async move {
                let n = r.fetch_add(1, SeqCst) + 1;
                started.send(()).unwrap();
                released.await.unwrap();
                Ok::<_, ()>(report(n, mode))
            })
            .await
            .unwrap()
        });
        running.await.unwrap();
        (held, release)
    }

    fn call(checks: &Arc<LedgerChecks>, runs: &Arc<AtomicU32>, full: bool) -> tokio::task::JoinHandle<IntegrityReport> {
        let (c, r) = (checks.clone(), runs.clone());
        tokio::spawn(async move {
            let mode = if full { "full" } else { "incremental" };
            c.coalesce(full, || async move { Ok::<_, ()>(report(r.fetch_add(1, SeqCst) + 1, mode)) }).await.unwrap()
        })
    }

    async fn queued(checks: &LedgerChecks, n: u64) {
        while checks.arrived() < n {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test]
    async fn a_flood_of_full_checks_costs_two_scans_and_none_is_answered_by_one_that_began_before_it() {
        let (checks, runs) = (Arc::new(LedgerChecks::default()), Arc::new(AtomicU32::new(0)));
        let (held, release) = hold(&checks, &runs, "full").await;
        let flood: Vec<_> = (0..20).map(|_| call(&checks, &runs, true)).collect();
        queued(&checks, 21).await;
        assert_eq!(runs.load(SeqCst), 1, "nobody scans beside the running check");
        release.send(()).unwrap();
        assert_eq!(held.await.unwrap().postings_checked, 1);
        for f in flood {
            // Not the running check's report (it began before they called): the one after it.
            assert_eq!(f.await.unwrap().postings_checked, 2);
        }
        assert_eq!(runs.load(SeqCst), 2);
        // A call after the flood is answered by a check of its own, not by the stored report.
        assert_eq!(call(&checks, &runs, true).await.unwrap().postings_checked, 3);
    }

    #[tokio::test]
    async fn an_incremental_call_shares_a_full_check_but_a_full_call_never_shares_an_incremental_one() {
        let (checks, runs) = (Arc::new(LedgerChecks::default()), Arc::new(AtomicU32::new(0)));
        let (held, release) = hold(&checks, &runs, "incremental").await;
        let full = call(&checks, &runs, true);
        queued(&checks, 2).await;
        release.send(()).unwrap();
        assert_eq!(held.await.unwrap().mode, "incremental");
        let full = full.await.unwrap();
        assert_eq!((full.mode.as_str(), full.postings_checked), ("full", 2), "a full call gets a full check");

        // Behind a running check: a full call first in line, then an incremental one.
        let (held, release) = hold(&checks, &runs, "incremental").await;
        let b = call(&checks, &runs, true);
        queued(&checks, 4).await;
        let a = call(&checks, &runs, false);
        queued(&checks, 5).await;
        release.send(()).unwrap();
        held.await.unwrap();
        let (a, b) = (a.await.unwrap(), b.await.unwrap());
        assert_eq!((b.mode.as_str(), b.postings_checked), ("full", 4));
        assert_eq!(a, b, "the incremental call waited through the full check, so it shares it");
        assert_eq!(runs.load(SeqCst), 4);
    }
}
