//! Reconciliation: the gateway's records against the backend and the rails, findings bounded, each
//! run audited.

use schemars::JsonSchema;
use serde::Serialize;

use super::rails::GATEWAY_ISSUER;
use super::windows::parse_instant;
use super::{Caller, Decision, Gateway};

use crate::catalogue::scopes;
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::ids::PaymentId;
use crate::domain::ops::AuditQuery;
use crate::domain::payment::{PaymentKind, PaymentQuery, PaymentStatus};
use crate::domain::rail::RailMove;
use crate::domain::rail::Settlement;
use crate::domain::rail::{RailFlow, RailPage, RailPayment, RailState};
use crate::error::{AgentError, ErrorCode};
/// Rail records examined per reconciliation page.
/// Finished (failed) collections a reconciliation run asks the rail about again, at most: each is
/// one query to the rail.
const RECHECK_FINISHED_MAX: usize = 50;

const RECONCILE_PAGE: u32 = 200;

/// The audit code of a rail's final word against a record already settled (`rail_events`).
pub(crate) const CONTRADICTS_RECORD: &str = "CONTRADICTS_RECORD";

/// Most findings one reconciliation reports (the rest are counted).
pub const RECONCILE_FINDINGS_MAX: usize = 500;

/// One thing reconciliation found.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Finding {
    /// missing_in_gateway | missing_in_backend | amount_mismatch | status_mismatch | outcome_unknown |
    /// pending_too_long | contradicts_record | resolved | integrity
    pub kind: String,
    pub payment_id: Option<String>,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReconcileReport {
    pub since: UnixSecs,
    pub backend: String,
    /// Gateway records and backend payments compared.
    pub checked: i64,
    /// Records whose unknown outcome was settled from the backend's answer.
    pub resolved: i64,
    pub findings: Vec<Finding>,
    /// Findings beyond `RECONCILE_FINDINGS_MAX`, counted but not listed.
    pub findings_omitted: i64,
}

/// A reconciliation's audit decision; its detail is the report itself (JSON, findings bounded by
/// `RECONCILE_FINDINGS_MAX`), which the operator console shows as the last results.
pub(crate) fn reconcile_decision(report: &ReconcileReport) -> Decision<'static> {
    let mut d = Decision::new("reconcile", if report.problems() == 0 { "reconciled" } else { "reconcile_findings" });
    d.detail = Some(serde_json::to_string(report).unwrap_or_else(|e| format!("report not serializable: {e}")));
    d
}

impl ReconcileReport {
    fn push(&mut self, kind: &str, payment_id: Option<&PaymentId>, detail: String) {
        if self.findings.len() >= RECONCILE_FINDINGS_MAX {
            self.findings_omitted += 1;
            return;
        }
        self.findings.push(Finding { kind: kind.into(), payment_id: payment_id.map(|p| p.to_string()), detail });
    }
    /// Findings that need a human (resolved ones do not).
    pub fn problems(&self) -> usize {
        self.findings.iter().filter(|f| f.kind != "resolved").count() + self.findings_omitted as usize
    }
}

impl Gateway {
    /// The audit record of a scheduled (or CLI) reconciliation, tagged for the store.
    pub fn reconcile_audit(&self, report: &ReconcileReport) -> AuditRecord {
        self.tag_audit(self.audit_record(GATEWAY_ISSUER, "scheduler", "-", reconcile_decision(report)))
    }

    /// A record of the scheduler's own work (`tool`: what ran), tagged for the store.
    pub fn system_audit(&self, tool: &str, decision: &str, detail: String) -> AuditRecord {
        let mut d = Decision::new(tool, decision);
        d.detail = Some(detail);
        self.tag_audit(self.audit_record(GATEWAY_ISSUER, "scheduler", "-", d))
    }

    /// `reconcile` tool: admin only; audited.
    pub async fn reconcile_tool(&self, caller: &Caller, since: Option<&str>) -> Result<ReconcileReport, AgentError> {
        if !caller.principal.has_scope(scopes::INTEGRITY) {
            return Err(AgentError::new(ErrorCode::InsufficientScope, "reconcile needs payments:integrity"));
        }
        let since = match since {
            Some(s) => Some(parse_instant("since", s, false)?),
            None => None,
        };
        let report = self.reconcile(since).await.map_err(|e| AgentError::from(&e))?;
        self.audit(caller, reconcile_decision(&report)).await;
        Ok(report)
    }

    /// Compare the gateway's records with the backend and the rails since `since` (default: the
    /// configured window). Settles unknown outcomes the backend can answer; reports the rest.
    pub async fn reconcile(
        &self,
        since: Option<UnixSecs>,
    ) -> Result<ReconcileReport, crate::domain::error::BackendError> {
        let now = self.clock.now();
        let since = since.unwrap_or(now - self.limits.reconcile_window_secs);
        let backend = self.backend.name().to_string();
        let mut report = ReconcileReport {
            since,
            backend: backend.clone(),
            checked: 0,
            resolved: 0,
            findings: vec![],
            findings_omitted: 0,
        };
        // 1. Every gateway record against the backend (or, for a collection, its own state).
        let mut after = 0;
        let mut rechecks_left = RECHECK_FINISHED_MAX;
        loop {
            let page = self.store.rail_since(RailPage { since, after_seq: after, limit: RECONCILE_PAGE }).await?;
            let Some((last, _)) = page.last() else { break };
            after = *last;
            for (_, rec) in &page {
                report.checked += 1;
                if self.is_collection_record(rec) {
                    self.reconcile_collection(rec, now, &mut report, &mut rechecks_left).await;
                } else {
                    self.reconcile_record(rec, now, &mut report).await?;
                }
            }
        }
        // 2. Payments the backend holds that the gateway has no record of (external ledgers only:
        //    the embedded ledger *is* the gateway's record, checked by its integrity report).
        if self.backend.records_in_transaction() {
            let integrity = self.backend.check_integrity(false).await?;
            for p in integrity.problems {
                report.push("integrity", None, p);
            }
        } else if !self.known_accounts().is_empty() {
            let accounts = self.known_accounts();
            let mut before = None;
            'pages: loop {
                let page = self
                    .backend
                    .list_payments(PaymentQuery {
                        accounts: accounts.clone(),
                        status: None,
                        before_seq: before,
                        limit: RECONCILE_PAGE,
                        ..Default::default()
                    })
                    .await?;
                for p in &page.items {
                    if p.created_at < since {
                        break 'pages;
                    }
                    report.checked += 1;
                    if self.store.rail_get(&p.id).await?.is_none() {
                        report.push(
                            "missing_in_gateway",
                            Some(&p.id),
                            format!(
                                "the backend holds {} {} {} the gateway never recorded",
                                p.kind.as_str(),
                                p.amount(),
                                p.currency
                            ),
                        );
                    }
                }
                match page.next_cursor {
                    Some(c) => before = Some(c),
                    None => break,
                }
            }
        }
        // 3. A rail's final word against a record already settled (CONTRADICTS_RECORD: a payout
        //    people settled as failed that the rail then paid): money may have moved that the
        //    record denies. Refused when it came (a settled record never moves); listed here, once
        //    per payment, for a person to put right.
        let q = AuditQuery {
            code: Some(CONTRADICTS_RECORD.into()),
            from: Some(since),
            limit: RECONCILE_FINDINGS_MAX as u32,
            ..Default::default()
        };
        let mut named = std::collections::BTreeSet::new();
        for r in self.store.audit_query(q).await? {
            let Some(id) = r.payment_id.as_deref().and_then(|p| PaymentId::parse(p).ok()) else { continue };
            if named.insert(id.to_string()) {
                let detail = format!(
                    "{}'s final result contradicts the settled record ({}): money may have moved that the record \
                     denies; compare with the rail's statement",
                    r.principal_sub,
                    r.detail.as_deref().unwrap_or("settled")
                );
                report.push("contradicts_record", Some(&id), detail);
            }
        }
        for f in &report.findings {
            self.metrics.reconcile_finding(&f.kind);
        }
        self.metrics.reconcile_run(report.problems() as u64);
        Ok(report)
    }

    /// A collection's record against its own state: the rail is its system of record, and the
    /// scheduled query settles what is open. A collection recorded failed is asked about again
    /// (at most `RECHECK_FINISHED_MAX` a run): a failure the rail now calls a success is for a human.
    /// Money going out failed by the rail's own final result, and its status answer would come by
    /// callback, not here: it is not asked again.
    async fn reconcile_collection(
        &self,
        rec: &RailPayment,
        now: UnixSecs,
        report: &mut ReconcileReport,
        rechecks_left: &mut usize,
    ) {
        if rec.state == RailState::Failed
            && rec.flow == RailFlow::Collection
            && *rechecks_left > 0
            && let Some(rail) = self.rail(&rec.rail)
        {
            *rechecks_left -= 1;
            if rail.query(rec).await == Settlement::Succeeded {
                report.push(
                    "status_mismatch",
                    Some(&rec.id),
                    format!("recorded failed, but {} now says the customer paid", rail.display_name()),
                );
            }
            return;
        }
        match rec.state {
            // By age since it was made: the poll job touches `updated_at` each time it asks, so a
            // record the rail never answers for would never look old enough (the stop-67 review).
            RailState::Unknown | RailState::Submitting if now - rec.created_at > self.limits.idempotency_lease_secs => {
                // Money sent out that the rail has no answer about is for two people to settle.
                let by_hand = match rec.flow {
                    RailFlow::Payout | RailFlow::Reversal => {
                        "; if the rail has no answer about it, two operators settle it by hand \
                         (POST /operator/v1/payments/{id}/resolve)"
                    }
                    RailFlow::Collection | RailFlow::Ledger => "",
                };
                report.push(
                    "outcome_unknown",
                    Some(&rec.id),
                    format!(
                        "a {} request whose answer was lost: check the {} statement for this customer and amount{by_hand}",
                        rec.flow.as_str(),
                        rec.rail
                    ),
                )
            }
            RailState::Pending if now - rec.created_at > self.limits.collection_pending_timeout_secs => report.push(
                "pending_too_long",
                Some(&rec.id),
                format!("pending since {} s; {}", now - rec.created_at, rec.reason.as_deref().unwrap_or("no callback")),
            ),
            _ => {}
        }
    }

    async fn reconcile_record(
        &self,
        rec: &RailPayment,
        now: UnixSecs,
        report: &mut ReconcileReport,
    ) -> Result<(), crate::domain::error::BackendError> {
        let held = self.backend.payment(&rec.id).await?;
        let Some(p) = held else {
            match rec.state {
                RailState::Succeeded | RailState::Pending => report.push(
                    "missing_in_backend",
                    Some(&rec.id),
                    format!("the gateway recorded {} but the backend has no such payment", rec.state.as_str()),
                ),
                RailState::Unknown | RailState::Submitting if now - rec.created_at > self.limits.idempotency_lease_secs => {
                    report.push(
                        "outcome_unknown",
                        Some(&rec.id),
                        "sent, never confirmed, and the backend has no such payment; a retry with the same operation_id re-sends it".into(),
                    )
                }
                _ => {}
            }
            return Ok(());
        };
        let want_kind = if rec.kind == PaymentKind::Refund { PaymentKind::Refund } else { PaymentKind::Payment };
        if p.amount_minor != rec.amount_minor || p.currency != rec.currency || p.kind != want_kind {
            report.push(
                "amount_mismatch",
                Some(&rec.id),
                format!(
                    "gateway {} {} {}, backend {} {} {}",
                    rec.kind.as_str(),
                    crate::domain::money::format_minor(rec.amount_minor, rec.currency),
                    rec.currency,
                    p.kind.as_str(),
                    p.amount(),
                    p.currency
                ),
            );
            return Ok(());
        }
        let backend_state = match p.status {
            PaymentStatus::Succeeded => RailState::Succeeded,
            PaymentStatus::Failed => RailState::Failed,
            PaymentStatus::Pending => RailState::Pending,
        };
        match rec.state {
            RailState::Unknown | RailState::Submitting => {
                // The backend answers what the lost response did not: settle the record.
                let update = crate::domain::rail::RailUpdate { rail_ref: Some(p.id.to_string()), ..Default::default() };
                let from = [RailState::Unknown, RailState::Submitting];
                if let Ok(Some(_)) = self
                    .store
                    .rail_transition(RailMove { id: &rec.id, from: &from, to: backend_state, update }, now)
                    .await
                {
                    report.resolved += 1;
                    report.push(
                        "resolved",
                        Some(&rec.id),
                        format!("outcome settled from the backend: {}", p.status.as_str()),
                    );
                }
            }
            // A ledger payment answered before it was final (the wallet service's saga): the
            // backend's final word settles it, by the rule the poll job follows.
            RailState::Pending if rec.flow == RailFlow::Ledger && backend_state.is_terminal() => {
                let settlement = match p.status {
                    PaymentStatus::Succeeded => Settlement::Succeeded,
                    _ => Settlement::Failed("the ledger service failed it".into()),
                };
                let from = crate::domain::rules::rail::settles_from(rec.flow);
                let Some(m) = crate::domain::rules::rail::settles(rec, &settlement, from, None, false) else {
                    return Ok(());
                };
                if let Ok(Some(_)) = self.store.rail_transition(m, now).await {
                    report.resolved += 1;
                    report.push("resolved", Some(&rec.id), format!("settled from the backend: {}", p.status.as_str()));
                }
            }
            s if s != backend_state => report.push(
                "status_mismatch",
                Some(&rec.id),
                format!("gateway {}, backend {}", s.as_str(), p.status.as_str()),
            ),
            _ => {}
        }
        Ok(())
    }
}
