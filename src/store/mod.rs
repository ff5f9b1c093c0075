//! Persistence: one trait per entity (`traits/`: idempotency, approvals, suspensions, audit, ledger,
//! rails, reads, leases, payees, and the engine's own `Engine`), joined by [`Store`]; one engine per
//! database, each implementing every trait in its file of the same name. SQLite is the embedded
//! default; PostgreSQL (shared by replicas) implements the same contract.
//!
//! The store owns transactions. Operations that must be atomic (reserve an idempotency key, post a
//! transfer *and* complete its idempotency record) are single store methods, so no caller can
//! split them.

pub mod postgres;
pub(crate) mod queries;
pub(crate) mod rows;
pub mod sqlite;
mod traits;

pub use traits::{
    ApprovalStore, AttemptOutcome, AuditStore, Denials, Engine, GroupCommit, IdempotencyStore, LeaseStore, LedgerStore,
    OutboxStore, PasskeyStore, PayeeStore, PolicyStore, QuotaTake, RailStore, ReadStore, SuspensionStore,
};

use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;

use crate::domain::payment::{Attempt, Guards, IntegrityReport, Payment, RefundRequest, TransferRequest};
use crate::domain::rules::integrity::{self, Checkpoint};

/// A write that must change exactly one row did (`n`: the rows `what` changed). A trigger or rule
/// in the database can swallow a write and let its statement succeed (SQLite `RAISE(IGNORE)`, a
/// PostgreSQL BEFORE trigger returning NULL): a record the gateway believes it opened, or an audit
/// record it believes it wrote, that is not there. The transaction must fail instead (the stop-65
/// review: a swallowed rail record let each retry after the key's lease send a payout again).
pub(crate) fn wrote_one(what: &str, n: u64) -> Result<(), StoreError> {
    match n {
        1 => Ok(()),
        n => Err(StoreError::Database(format!("{what}: {n} rows written where one was meant"))),
    }
}

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

impl<'a> Posting<'a> {
    fn of(a: &'a Attempt, guards: &'a Guards) -> Self {
        Posting { key: &a.key, alias: a.alias_key.as_deref(), guards, audit: &a.audit }
    }
}

impl<'a> From<&'a TransferRequest> for Posting<'a> {
    fn from(r: &'a TransferRequest) -> Self {
        Posting::of(&r.attempt, &r.guards)
    }
}

impl<'a> From<&'a RefundRequest> for Posting<'a> {
    fn from(r: &'a RefundRequest) -> Self {
        Posting::of(&r.attempt, &r.guards)
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

/// The whole store: every entity's trait, as one object (`Arc<dyn Store>`). An engine implements
/// each entity's trait; this joins them.
pub trait Store:
    Engine
    + IdempotencyStore
    + ApprovalStore
    + SuspensionStore
    + AuditStore
    + LedgerStore
    + RailStore
    + ReadStore
    + LeaseStore
    + PayeeStore
    + PolicyStore
    + PasskeyStore
    + OutboxStore
    + Send
    + Sync
    + 'static
{
}

impl<T> Store for T where
    T: Engine
        + IdempotencyStore
        + ApprovalStore
        + SuspensionStore
        + AuditStore
        + LedgerStore
        + RailStore
        + ReadStore
        + LeaseStore
        + PayeeStore
        + PolicyStore
        + PasskeyStore
        + OutboxStore
        + Send
        + Sync
        + 'static
{
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
