//! How the gateway appends its audit records (tagged at the hand-off), and how each replica
//! witnesses the records it appends until they are sealed. A record is
//! protected by its link only once a sealing run reaches it (up to `audit.seal_every_secs`, and on
//! PostgreSQL until older transactions end); before that, its writer's tag names an edit, but a
//! database writer could delete it and the chain would seal what was left. The writer remembers
//! each record it appended (seq and tag, in memory, never in the database) and checks, once the
//! record should have been sealed, that a link names it with the same tag. A record gone or changed
//! is a break: logged as an error, counted (`paygate_audit_witness_breaks_total`), and appended as
//! an `audit.witness` record — itself witnessed, so deleting that too is found again — which
//! `audit verify` names for ever after.
//!
//! A ledger payment's record is written in the posting's transaction and is not witnessed here:
//! verify names a payment without its record (`ReadStore::unaudited_payment`). What is lost at a
//! crash (the memory) is what a stop would have checked; a graceful stop seals and checks.

use std::collections::VecDeque;
use std::sync::Mutex;

use super::{Decision, Gateway};
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::webhook::OutboxMessage;

/// Records remembered at most per replica (about 100 bytes each): past it the oldest is let go
/// unchecked, with a warning (a sealing job stopped for long; `audit verify` names the unsealed).
pub const WITNESS_MAX: usize = 100_000;
/// Records asked about per read.
const READ_BATCH: usize = 500;
use crate::domain::audit_chain::WITNESS_TOOL;

struct Witnessed {
    seq: i64,
    tag: String,
    at: UnixSecs,
}

/// The records this replica appended and has not yet seen sealed, oldest first.
#[derive(Default)]
pub(super) struct Witness {
    pending: Mutex<VecDeque<Witnessed>>,
    /// The highest chain head this replica's sealing runs have seen (0 before the first).
    head: std::sync::atomic::AtomicI64,
}

impl Witness {
    fn lock(&self) -> std::sync::MutexGuard<'_, VecDeque<Witnessed>> {
        self.pending.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Remember a record; false when the oldest had to be let go.
    fn note(&self, seq: i64, tag: String, at: UnixSecs) -> bool {
        let mut pending = self.lock();
        pending.push_back(Witnessed { seq, tag, at });
        if pending.len() > WITNESS_MAX {
            pending.pop_front();
            return false;
        }
        true
    }

    /// Up to `n` records written at or before `upto`, oldest first, taken out.
    fn take(&self, upto: UnixSecs, n: usize) -> Vec<Witnessed> {
        let mut pending = self.lock();
        let due = pending.iter().take(n).take_while(|w| w.at <= upto).count();
        pending.drain(..due).collect()
    }

    /// Put records back at the front (not sealed yet, or not checked), in their order.
    fn keep(&self, back: Vec<Witnessed>) {
        let mut pending = self.lock();
        for w in back.into_iter().rev() {
            pending.push_front(w);
        }
    }
}

impl Gateway {
    pub(super) async fn append_audit(&self, rec: AuditRecord) {
        self.append_audit_notify(rec, Vec::new()).await
    }

    /// Append a record (tagged here) with its webhook messages, in one transaction, and witness it
    /// until it is sealed. A failure is logged and counted.
    pub async fn append_audit_notify(&self, rec: AuditRecord, messages: Vec<OutboxMessage>) {
        let rec = self.tag_audit(rec);
        let (tag, at, correlation_id) = (rec.tag.clone(), rec.at, rec.correlation_id.clone());
        let written = match messages.is_empty() {
            true => self.store.audit_append(rec).await,
            false => self.store.audit_append_notify(rec, messages).await,
        };
        match written {
            Ok(seq) => self.witness(seq, tag.as_deref(), at),
            Err(error) => {
                self.metrics.bookkeeping_failure("audit");
                tracing::error!(%correlation_id, %error, "audit append failed");
            }
        }
    }

    /// `rec` as the gateway hands it to the store: with its writer's tag (`audit_chain::record_tag`,
    /// under the link key), so an edit before it is sealed is named by `audit verify`. Every record
    /// is tagged at its hand-off, after its last change (an untagged record after tagged ones
    /// fails verify, so a forgotten site shows in the audit tests).
    pub(crate) fn tag_audit(&self, rec: AuditRecord) -> AuditRecord {
        crate::domain::audit_chain::tagged(&self.audit_link_key, rec, rand::random())
    }

    /// Remember a record this replica appended (its seq; its tag, set at the hand-off).
    pub(super) fn witness(&self, seq: i64, tag: Option<&str>, at: UnixSecs) {
        let Some(tag) = tag else { return };
        if !self.witness.note(seq, tag.to_string(), at) {
            tracing::warn!(max = WITNESS_MAX, "audit witness full: the oldest record is let go unchecked");
        }
    }

    /// After a sealing run on this replica: the chain's head never goes back. One lower than a
    /// head this replica saw is links deleted in the database (the eleventh review emptied the
    /// chain tables and a replica re-sealed below its own signed head without a word): logged,
    /// counted, and recorded as an `audit.witness` record, which `audit verify` names for ever
    /// after. Each fall is recorded once (the mark follows the head down). Whether it fell.
    pub async fn audit_witness_head(&self, head: i64) -> bool {
        use std::sync::atomic::Ordering;
        let seen = self.witness.head.fetch_max(head, Ordering::SeqCst);
        if head >= seen {
            return false;
        }
        self.witness.head.store(head, Ordering::SeqCst);
        self.metrics.audit_witness_break();
        tracing::error!(
            audit.chain_seq = head,
            audit.seen_chain_seq = seen,
            "the audit chain's head went back: links were deleted in the database"
        );
        let mut d = Decision::new(WITNESS_TOOL, "rolled_back");
        d.detail = Some(format!(
            "the chain's head went back from position {seen} (seen by this replica) to {head}: links were deleted"
        ));
        self.audit_as(super::rails::GATEWAY_ISSUER, "witness", "-", d).await;
        true
    }

    /// The scheduler's check (every replica, every minute): the records written longer ago than
    /// `audit.seal_every_secs + audit.unsealed_slack_secs`, which `audit verify` requires sealed.
    /// Also says, as an error, when records that old are still unsealed: sealing is not running
    /// (every replica's jobs stopped, or someone holds the `seal_audit` job lease).
    pub async fn audit_witness_due(&self) -> usize {
        if let Some((count, age)) = self.audit_sealing_stalled().await {
            tracing::error!(
                unsealed = count,
                oldest_age_secs = age,
                "audit records are not being sealed: the oldest unsealed is older than audit.seal_every_secs + \
                 audit.unsealed_slack_secs (is a replica's sealing job running? who holds the seal_audit job lease?)"
            );
        }
        self.audit_witness_check(self.clock.now() - self.limits.audit_stale_after_secs).await
    }

    /// Why this store's audit chain was deleted, if it was: the chain is empty, yet a record is
    /// older than the sealing interval (a store's first records are sealed within it, and no
    /// chain is begun again over older ones: `audit_chain::Sealer::genesis_within_secs`). `serve`
    /// refuses such a store: the policy and payments it holds are not what the trail proves.
    pub async fn audit_chain_deleted(&self) -> Option<String> {
        let (now, within) = (self.clock.now(), self.limits.audit_stale_after_secs);
        let (seq, at) = crate::audit_chain::chain_deleted(&*self.store, now, within).await.ok()??;
        Some(format!(
            "the audit chain is empty, yet record seq {seq} (made at {}) is older than the sealing interval: the \
             chain was deleted in the database; this store is not served (run `paygate audit verify`, restore the \
             store from a backup)",
            crate::clock::rfc3339(at)
        ))
    }

    /// `Some((unsealed records, age of the oldest in seconds))` when the oldest unsealed record is
    /// older than `audit.seal_every_secs + audit.unsealed_slack_secs` (what `audit verify` fails on).
    pub async fn audit_sealing_stalled(&self) -> Option<(i64, i64)> {
        let unsealed = match self.store.audit_unsealed().await {
            Ok(u) => u,
            Err(error) => {
                tracing::warn!(%error, "audit: the unsealed records could not be counted");
                return None;
            }
        };
        let age = self.clock.now() - unsealed.oldest?.1;
        (age > self.limits.audit_stale_after_secs).then_some((unsealed.count, age))
    }

    /// Check the records this replica wrote at or before `upto` (what should be sealed by now):
    /// sealed with the tag it wrote, done; stored but not sealed yet, checked again later; gone,
    /// or with another tag, a break (logged, counted, recorded). How many breaks.
    pub async fn audit_witness_check(&self, upto: UnixSecs) -> usize {
        let mut breaks = Vec::new();
        let mut later = Vec::new();
        loop {
            let batch = self.witness.take(upto, READ_BATCH);
            if batch.is_empty() {
                break;
            }
            let seqs: Vec<i64> = batch.iter().map(|w| w.seq).collect();
            let found = match self.store.audit_witness_read(&seqs).await {
                Ok(found) => found,
                Err(error) => {
                    tracing::warn!(%error, "audit witness: the records could not be read; checked again later");
                    later.extend(batch);
                    break;
                }
            };
            let full = batch.len() == READ_BATCH;
            for w in batch {
                match found.iter().find(|(seq, _, _)| *seq == w.seq) {
                    Some((_, tag, _)) if tag.as_deref() != Some(w.tag.as_str()) => breaks.push((w, "changed")),
                    Some((_, _, true)) => {}
                    Some((_, _, false)) => later.push(w),
                    None => breaks.push((w, "deleted")),
                }
            }
            if !full {
                break;
            }
        }
        self.witness.keep(later);
        let n = breaks.len();
        for (w, how) in breaks {
            self.metrics.audit_witness_break();
            tracing::error!(
                audit.seq = w.seq,
                audit.at = w.at,
                how,
                "an audit record this replica wrote was {how} in the database before it was sealed"
            );
            let mut d = Decision::new(WITNESS_TOOL, how);
            d.detail = Some(format!(
                "record seq {} (written at {}, tag {}) was {how} before it was sealed",
                w.seq,
                crate::clock::rfc3339(w.at),
                w.tag
            ));
            self.audit_as(super::rails::GATEWAY_ISSUER, "witness", "-", d).await;
        }
        n
    }
}
