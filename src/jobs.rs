//! The in-process scheduler. Each job kind runs on one replica at a time: before a run, the
//! replica takes the kind's lease in the shared store for the job's interval, so replicas sharing
//! a database run each job about once per interval between them, and a replica that dies mid-run
//! hands the job over when its lease ends.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::backend::http::HttpLedger;
use crate::config::JobsConfig;
use crate::gateway::Gateway;

/// How often idle rate-limiter keys are forgotten (per replica; keeps limiter memory bounded).
const EVICT_INTERVAL: Duration = Duration::from_secs(60);

pub struct Scheduler {
    pub gateway: Arc<Gateway>,
    pub route_limits: Arc<crate::rate::KeyedLimits>,
    pub http_ledger: Option<Arc<HttpLedger>>,
    pub config: JobsConfig,
    pub mpesa_query_after_secs: i64,
    /// Audit retention, when on.
    pub audit_archive: Option<crate::audit_archive::Settings>,
    /// Sealing the audit trail onto its hash chain, and signing checkpoints.
    pub audit_seal: SealSettings,
    /// This replica's name in job leases.
    pub holder: String,
    /// Webhook delivery, when webhooks are on, and how often it runs.
    pub webhooks: Option<(Arc<crate::webhooks::Webhooks>, i64)>,
    pub stop: CancellationToken,
}

/// `[audit]`'s sealing settings.
#[derive(Debug, Clone, Copy)]
pub struct SealSettings {
    pub every_secs: i64,
    pub batch_max: u32,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Job {
    SealAudit,
    MpesaPoll,
    Purge,
    ExpireApprovals,
    Reconcile,
    ArchiveAudit,
    Integrity,
    IntegrityFull,
    Webhooks,
}

impl Job {
    fn name(self) -> &'static str {
        match self {
            Job::MpesaPoll => "mpesa_poll",
            Job::Purge => "purge_idempotency",
            Job::ExpireApprovals => "expire_approvals",
            Job::Reconcile => "reconcile",
            Job::ArchiveAudit => "archive_audit",
            Job::Integrity => "check_integrity",
            Job::IntegrityFull => "check_integrity_full",
            Job::Webhooks => "deliver_webhooks",
            Job::SealAudit => "seal_audit",
        }
    }
}

pub async fn run(s: Scheduler) {
    let mut tick = tokio::time::interval(Duration::from_millis(s.config.tick_ms as u64));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let every = |job: Job| -> i64 {
        match job {
            Job::MpesaPoll => s.config.mpesa_poll_every_secs,
            Job::Purge | Job::ExpireApprovals | Job::ArchiveAudit => s.config.purge_every_secs,
            Job::Reconcile => s.config.reconcile_every_secs,
            Job::Integrity => s.config.integrity_every_secs,
            Job::IntegrityFull => s.config.integrity_full_every_secs,
            Job::Webhooks => s.webhooks.as_ref().map_or(60, |(_, every)| *every),
            Job::SealAudit => s.audit_seal.every_secs,
        }
    };
    let mut next: HashMap<Job, Instant> = HashMap::new();
    let mut next_evict = Instant::now() + EVICT_INTERVAL;
    loop {
        tokio::select! {
            _ = s.stop.cancelled() => {
                // A graceful stop gives its leases back (a run under way has ended: runs are awaited
                // in this loop), so a restart, or another replica, runs the jobs at once.
                if let Err(error) = s.gateway.store().job_release(&s.holder).await {
                    tracing::warn!(%error, "job leases could not be given back; they end on their own");
                }
                break;
            }
            _ = tick.tick() => {}
        }
        let now = Instant::now();
        if now >= next_evict {
            s.gateway.evict_idle_limits().await;
            s.route_limits.evict_idle();
            // The last refusals of a flood, if no later refusal wrote them (one record per window).
            s.gateway.flush_refusals().await;
            // The records this replica wrote that should be sealed by now: still there, unchanged.
            s.gateway.audit_witness_due().await;
            next_evict = now + EVICT_INTERVAL;
        }
        if let Some(h) = &s.http_ledger {
            s.gateway.metrics().breaker(h.breaker_state());
        }
        if !s.config.enabled {
            continue;
        }
        let jobs = [
            Job::SealAudit,
            Job::MpesaPoll,
            Job::Purge,
            Job::ExpireApprovals,
            Job::Reconcile,
            Job::ArchiveAudit,
            Job::Integrity,
            Job::IntegrityFull,
            Job::Webhooks,
        ];
        for job in jobs {
            if (job == Job::ArchiveAudit && s.audit_archive.is_none()) || (job == Job::Webhooks && s.webhooks.is_none())
            {
                continue;
            }
            if next.get(&job).is_some_and(|t| now < *t) {
                continue;
            }
            let interval = every(job);
            next.insert(job, now + Duration::from_secs(interval as u64));
            let store = s.gateway.store();
            let wall = s.gateway.clock().now();
            match store.job_lease(job.name(), &s.holder, wall, interval.max(s.config.lease_secs)).await {
                Ok(true) => run_job(&s, job).await,
                Ok(false) => {}
                Err(error) => tracing::warn!(job = job.name(), %error, "job lease failed"),
            }
        }
    }
}

async fn run_job(s: &Scheduler, job: Job) {
    let g = &s.gateway;
    let now = g.clock().now();
    match job {
        Job::MpesaPoll => {
            // Half the lease: the run ends before another replica may take the job over.
            let budget =
                Duration::from_secs((s.config.mpesa_poll_every_secs.max(s.config.lease_secs) / 2).max(1) as u64);
            let settled = g.poll_rails(s.mpesa_query_after_secs, budget).await;
            if settled > 0 {
                tracing::info!(settled, "rail payments settled by their rails' status answers");
            }
        }
        Job::Webhooks => {
            let Some((webhooks, _)) = &s.webhooks else { return };
            // Half the lease: the run ends before another replica may take the job over.
            let budget = Duration::from_secs((s.config.lease_secs / 2).max(1) as u64);
            let run = webhooks.deliver_due(budget).await;
            let metrics = g.metrics();
            for (endpoint, outcome) in &run.attempts {
                metrics.webhook_attempt(endpoint, outcome);
            }
            for (endpoint, open) in &run.breakers {
                metrics.webhook_breaker(endpoint, *open);
            }
            if run.delivered + run.failed > 0 {
                tracing::debug!(delivered = run.delivered, failed = run.failed, held = run.held, "webhooks sent");
            }
        }
        Job::SealAudit => {
            let c = s.audit_seal;
            match crate::audit_chain::seal(&**g.store(), &g.audit_sealer(), now, c.batch_max).await {
                Ok(run) => {
                    g.audit_witness_head(run.found.chain_seq).await;
                    g.audit_witness_head(run.head.chain_seq).await;
                    g.metrics().audit_sealed(run.sealed, run.head.chain_seq, run.checkpoint.as_ref().map(|c| c.at));
                    if run.sealed > 0 {
                        tracing::debug!(sealed = run.sealed, chain_seq = run.head.chain_seq, "audit sealed");
                    }
                }
                Err(error) => {
                    g.metrics().audit_seal_failed();
                    tracing::warn!(%error, "audit sealing failed; the records stay unsealed until a run succeeds")
                }
            }
        }
        Job::Purge => match g.store().idem_purge(now).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(idempotency.purged = n, "purged expired idempotency records"),
            Err(error) => tracing::warn!(%error, "idempotency purge failed"),
        },
        Job::ExpireApprovals => match g.store().approvals_expire(now).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(approvals.expired = n, "expired pending approvals"),
            Err(error) => tracing::warn!(%error, "approval expiry failed"),
        },
        Job::ArchiveAudit => {
            let Some(settings) = &s.audit_archive else { return };
            match crate::audit_archive::archive(&**g.store(), &g.audit_sealer(), settings, now).await {
                Ok(batches) => {
                    for b in batches {
                        tracing::info!(records = b.records, file = %b.file.display(), "audit records archived");
                        let detail = format!(
                            "{} records up to chain position {} to {}",
                            b.deleted,
                            b.last_chain_seq,
                            b.file.display()
                        );
                        g.append_audit_notify(g.system_audit("audit.archive", "archived", detail), Vec::new()).await;
                    }
                }
                // Nothing was deleted: the records stay until a run can archive them.
                Err(error) => tracing::error!(%error, "audit archival failed; nothing was deleted"),
            }
        }
        Job::Integrity | Job::IntegrityFull => match g.scheduled_integrity(job == Job::IntegrityFull).await {
            Ok(report) if report.ok => {}
            Ok(report) => {
                let problems = report.problems.join("; ");
                tracing::error!(%problems, "ledger integrity check failed");
                let notify = g.integrity_failed_notice(&report);
                let record = g.system_audit("check_ledger_integrity", "integrity_failed", problems);
                g.append_audit_notify(record, notify).await;
            }
            Err(error) => tracing::warn!(%error, "ledger integrity check failed to run"),
        },
        Job::Reconcile => match g.reconcile(None).await {
            Ok(report) => {
                let problems = report.problems();
                if problems > 0 {
                    tracing::warn!(problems, checked = report.checked, "reconciliation found problems");
                }
                let a = g.reconcile_audit(&report);
                let notify = g.reconciliation_notice(&report, a.detail.as_deref());
                g.append_audit_notify(a, notify).await;
            }
            Err(error) => tracing::warn!(%error, "reconciliation failed"),
        },
    }
}
