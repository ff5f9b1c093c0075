//! What the operator console reads and runs, behind the same operator tokens and scopes as the
//! approval routes: `payments:audit` reads, `payments:approve` reviews and revokes,
//! `payments:admin` suspends, resumes and reconciles. Every action is audited under the operator.

use serde_json::Value;

use super::approvals_api::OpError;
use super::operator_views::{
    AuditView, CheckView, HealthView, HourView, MandateView, OpsPaymentView, PaymentDetail, PrincipalView,
    ReconciliationRun, SummaryView, TotalView, audit_view, mandate_view, minor_text, payment_view, report_view,
};
use super::rails::GATEWAY_ISSUER;
use super::reconcile::{ReconcileReport, reconcile_decision};
use super::windows::parse_instant;
use super::{ApprovalView, Gateway, Operator};
use crate::catalogue::{self, scopes};
use crate::clock::{UnixSecs, rfc3339};
use crate::domain::error::StoreError;
use crate::domain::ids::{AccountId, ApprovalId, PaymentId};
use crate::domain::ops::{AuditQuery, AuditRelated, MandateQuery, MandateStatus, OpsPaymentQuery};
use crate::domain::payment::{PaymentKind, PaymentStatus};
use crate::domain::principal::SuspensionScope;
use crate::domain::rail::{RailQuery, RailState};
use crate::domain::rules::guards::day_of;

/// Audit records one payment's timeline shows at most.
pub const TIMELINE_EVENTS_MAX: u32 = 200;
/// Agents the principals view lists at most, and how far back it looks for them.
pub const AGENTS_LISTED_MAX: u32 = 500;
pub const AGENTS_SEEN_WINDOW_SECS: i64 = 7 * 86_400;

/// Filters of `GET /payments`, as the query string gave them.
#[derive(Debug, Clone, Default)]
pub struct PaymentFilters {
    pub account: Option<String>,
    pub status: Option<String>,
    pub kind: Option<String>,
    pub rail: Option<String>,
    pub agent: Option<String>,
    /// The user agents acted for.
    pub user: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// Filters of `GET /audit`.
#[derive(Debug, Clone, Default)]
pub struct AuditFilters {
    pub agent: Option<String>,
    pub user: Option<String>,
    pub tool: Option<String>,
    pub decision: Option<String>,
    pub code: Option<String>,
    pub payment_id: Option<String>,
    pub approval_id: Option<String>,
    pub correlation_id: Option<String>,
    pub from: Option<String>,
    pub to: Option<String>,
}

/// Keyset cursors over (created_at, id), opaque to clients.
pub fn encode_key_cursor(at: UnixSecs, id: &str) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("k1:{at}:{id}"))
}

/// The position a cursor from [`encode_key_cursor`] names; a clear refusal for anything else (fuzzed:
/// `fuzz/checks.rs`).
pub fn decode_key_cursor(cursor: Option<&str>) -> Result<Option<(UnixSecs, String)>, OpError> {
    use base64::Engine;
    let Some(c) = cursor else { return Ok(None) };
    let bad = || OpError::invalid("cursor is not one this server issued; pass next_cursor back unchanged".into());
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    let (at, id) = text.strip_prefix("k1:").and_then(|s| s.split_once(':')).ok_or_else(bad)?;
    // Only the spelling encode_key_cursor writes: "k1:05:x" and "k1:+5:x" are not cursors.
    let at = at.parse::<UnixSecs>().ok().filter(|n| n.to_string() == at).ok_or_else(bad)?;
    if id.is_empty() || id.len() > 128 {
        return Err(bad());
    }
    Ok(Some((at, id.to_string())))
}

/// A page of views from rows fetched with one extra (`limit + 1`): the extra row only says there
/// is more, and the cursor names the last row kept.
fn page_of<R, V>(
    mut rows: Vec<R>,
    limit: u32,
    cursor: impl Fn(&R) -> String,
    view: impl Fn(R) -> V,
) -> (Vec<V>, Option<String>) {
    let next = if rows.len() > limit as usize {
        rows.truncate(limit as usize);
        rows.last().map(cursor)
    } else {
        None
    };
    (rows.into_iter().map(view).collect(), next)
}

pub(super) fn internal(what: &'static str) -> impl Fn(StoreError) -> OpError {
    move |error| {
        tracing::error!(%error, "{what} failed");
        OpError::internal()
    }
}

/// A filter value: at most this many characters, or the request is refused.
const FILTER_CHARS_MAX: usize = 256;

fn filter(name: &str, v: Option<String>) -> Result<Option<String>, OpError> {
    match v {
        Some(s) if s.is_empty() => Ok(None),
        Some(s) if s.chars().count() > FILTER_CHARS_MAX => {
            Err(OpError::invalid(format!("{name} is longer than {FILTER_CHARS_MAX} characters")))
        }
        other => Ok(other),
    }
}

/// A filter with a closed form (an account id, a status, a kind): empty is malformed, not "none".
fn typed_filter(name: &str, v: Option<String>) -> Result<Option<String>, OpError> {
    match v {
        Some(s) if s.is_empty() => {
            Err(OpError::invalid(format!("{name} must not be empty (leave it out for every {name})")))
        }
        other => filter(name, other),
    }
}

/// `from` / `to`: an instant or a date; unlike the text filters, empty is not "no filter" but a
/// malformed value (the spec's `format`).
fn instant(name: &str, v: Option<String>, end_of_day: bool) -> Result<Option<UnixSecs>, OpError> {
    v.map(|s| parse_instant(name, &s, end_of_day).map_err(OpError::from)).transpose()
}

impl Gateway {
    pub(super) fn require_op(&self, op: &Operator, any_of: &[&'static str]) -> Result<(), OpError> {
        if any_of.iter().any(|s| op.scopes.contains(*s)) { Ok(()) } else { Err(OpError::forbidden(any_of[0])) }
    }

    fn op_page_limit(&self, limit: Option<u32>) -> Result<u32, OpError> {
        self.page_limit(limit).map_err(OpError::from)
    }

    /// Every payment the gateway knows, newest first.
    pub async fn ops_payments(
        &self,
        op: &Operator,
        f: PaymentFilters,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<(Vec<OpsPaymentView>, Option<String>), OpError> {
        self.require_op(op, &[scopes::AUDIT])?;
        let account = typed_filter("account", f.account)?
            .map(|a| AccountId::parse(&a).map_err(|_| OpError::invalid(format!("no account can be named {a:?}"))))
            .transpose()?;
        let status = typed_filter("status", f.status)?
            .map(|s| {
                PaymentStatus::parse(&s)
                    .ok_or_else(|| OpError::invalid("status must be succeeded, pending or failed".into()))
            })
            .transpose()?;
        let kind = typed_filter("kind", f.kind)?
            .map(|k| PaymentKind::parse(&k).ok_or_else(|| OpError::invalid("kind must be payment or refund".into())))
            .transpose()?;
        let limit = self.op_page_limit(limit)?;
        let q = OpsPaymentQuery {
            account,
            status,
            kind,
            rail: filter("rail", f.rail)?,
            agent: filter("agent", f.agent)?,
            user: filter("user", f.user)?,
            from: instant("from", f.from, false)?,
            to: instant("to", f.to, true)?,
            before: decode_key_cursor(cursor)?,
            limit: limit + 1,
        };
        let rows = self.store.ops_payments(q).await.map_err(internal("payment list"))?;
        Ok(page_of(rows, limit, |p| encode_key_cursor(p.payment.created_at, p.payment.id.as_str()), payment_view))
    }

    /// One payment and everything audited about it, oldest first: the request under its
    /// idempotency keys, the approval and its reviews, the mandate, the payment, receipts, refunds.
    pub async fn ops_payment(&self, op: &Operator, payment_id: &str) -> Result<PaymentDetail, OpError> {
        self.require_op(op, &[scopes::AUDIT])?;
        let id = PaymentId::parse(payment_id).map_err(|_| OpError::missing("payment"))?;
        let p = self.store.ops_payment(&id).await.map_err(internal("payment read"))?;
        let p = p.ok_or(OpError::missing("payment"))?;
        let mut keys = vec![p.idempotency_key.clone()];
        let mut approvals = self.store.approvals_for_keys(keys.clone()).await.map_err(internal("approval lookup"))?;
        // A mandated payment's key is anchored on its mandate; the approval that issued it was
        // asked for under the operation's own key.
        if let Some(mid) = &p.mandate_id
            && let Some(m) = self.store.mandate_get(mid, self.clock.now()).await.map_err(internal("mandate read"))?
            && !approvals.contains(&m.approval_id)
        {
            approvals.push(m.approval_id);
        }
        for a in &approvals {
            if let Ok(aid) = ApprovalId::parse(a)
                && let Some(rec) = self.store.approval_get(&aid).await.map_err(internal("approval read"))?
                && !keys.contains(&rec.idempotency_key)
            {
                keys.push(rec.idempotency_key);
            }
        }
        let related =
            AuditRelated { payment_id: id.to_string(), keys, approval_ids: approvals, limit: TIMELINE_EVENTS_MAX };
        let timeline = self.store.audit_related(related).await.map_err(internal("audit read"))?;
        Ok(PaymentDetail { payment: payment_view(p), timeline: timeline.into_iter().map(audit_view).collect() })
    }

    /// Audit records, newest first.
    pub async fn ops_audit(
        &self,
        op: &Operator,
        f: AuditFilters,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<(Vec<AuditView>, Option<String>), OpError> {
        self.require_op(op, &[scopes::AUDIT])?;
        let limit = self.op_page_limit(limit)?;
        let q = AuditQuery {
            agent: filter("agent", f.agent)?,
            user: filter("user", f.user)?,
            tool: filter("tool", f.tool)?,
            decision: filter("decision", f.decision)?,
            code: filter("code", f.code)?,
            payment_id: filter("payment_id", f.payment_id)?,
            approval_id: filter("approval_id", f.approval_id)?,
            correlation_id: filter("correlation_id", f.correlation_id)?,
            idempotency_key: None,
            from: instant("from", f.from, false)?,
            to: instant("to", f.to, true)?,
            before_seq: super::decode_cursor(cursor).map_err(OpError::from)?,
            limit: limit + 1,
        };
        let rows = self.store.audit_query(q).await.map_err(internal("audit search"))?;
        Ok(page_of(rows, limit, |r| super::encode_cursor(r.seq), audit_view))
    }

    /// Issued mandates, newest first.
    pub async fn ops_mandates(
        &self,
        op: &Operator,
        status: Option<String>,
        cursor: Option<&str>,
        limit: Option<u32>,
    ) -> Result<(Vec<MandateView>, Option<String>), OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::APPROVE])?;
        let status =
            match typed_filter("status", status)?.as_deref() {
                None | Some("all") => None,
                Some(s) => Some(MandateStatus::parse(s).ok_or_else(|| {
                    OpError::invalid("status must be active, revoked, used_up, expired or all".into())
                })?),
            };
        let limit = self.op_page_limit(limit)?;
        let q = MandateQuery { status, now: self.clock.now(), before: decode_key_cursor(cursor)?, limit: limit + 1 };
        let rows = self.store.mandate_list(q).await.map_err(internal("mandate list"))?;
        Ok(page_of(rows, limit, |m| encode_key_cursor(m.created_at, &m.id), mandate_view))
    }

    /// Revoke a mandate by its id (the approval route revokes by the approval that issued it).
    pub async fn ops_revoke_mandate(
        &self,
        op: &Operator,
        mandate_id: &str,
        reason: Option<String>,
    ) -> Result<MandateView, OpError> {
        self.require_op(op, &[scopes::APPROVE])?;
        if mandate_id.is_empty() || mandate_id.len() > 128 {
            return Err(OpError::missing("mandate"));
        }
        let m = self.store.mandate_get(mandate_id, self.clock.now()).await.map_err(internal("mandate read"))?;
        let m = m.ok_or(OpError::missing("mandate"))?;
        self.revoke(op, &m.approval_id, reason).await?;
        let m = self.store.mandate_get(mandate_id, self.clock.now()).await.map_err(internal("mandate read"))?;
        Ok(mandate_view(m.ok_or(OpError::missing("mandate"))?))
    }

    /// Agents seen in the last week and every subject with stop-rule state, suspended first.
    pub async fn ops_principals(&self, op: &Operator) -> Result<Vec<PrincipalView>, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        let now = self.clock.now();
        let states = self.store.principal_states(AGENTS_LISTED_MAX).await.map_err(internal("principal list"))?;
        let tools: Vec<&str> = catalogue::TOOLS.iter().map(|t| t.name).collect();
        let seen = self
            .store
            .agents_seen(now - AGENTS_SEEN_WINDOW_SECS, &tools, GATEWAY_ISSUER, AGENTS_LISTED_MAX)
            .await
            .map_err(internal("agent list"))?;
        let mut out: Vec<PrincipalView> = states
            .into_iter()
            .map(|s| {
                let (scope, user) = match s.scope {
                    SuspensionScope::Agent => ("agent", None),
                    SuspensionScope::Pair(u) => ("pair", u),
                };
                PrincipalView {
                    last_seen: seen.iter().find(|(sub, _)| *sub == s.subject).map(|(_, at)| rfc3339(*at)),
                    suspended: s.suspended_at.is_some(),
                    suspended_at: s.suspended_at.map(rfc3339),
                    suspended_reason: s.suspended_reason,
                    resumed_at: s.resumed_at.map(rfc3339),
                    subject: s.subject,
                    issuer: s.issuer,
                    scope,
                    user,
                }
            })
            .collect();
        for (subject, at) in seen {
            if !out.iter().any(|p| p.subject == subject) {
                out.push(PrincipalView {
                    subject,
                    issuer: String::new(),
                    scope: "agent",
                    user: None,
                    suspended: false,
                    suspended_at: None,
                    suspended_reason: None,
                    resumed_at: None,
                    last_seen: Some(rfc3339(at)),
                });
            }
        }
        out.sort_by(|a, b| b.suspended.cmp(&a.suspended).then(b.last_seen.cmp(&a.last_seen)));
        out.truncate(AGENTS_LISTED_MAX as usize);
        Ok(out)
    }

    /// Today's (UTC) totals, hourly volume, approval queue and suspended agents.
    pub async fn ops_summary(&self, op: &Operator) -> Result<SummaryView, OpError> {
        self.require_op(op, &[scopes::AUDIT])?;
        let now = self.clock.now();
        let from = day_of(now);
        let rows = self.store.volume(from, from + 86_400).await.map_err(internal("volume"))?;
        // Rows come per hour: the day's totals add them up by kind, status and currency.
        let mut sums: std::collections::BTreeMap<(&str, &str, &str), (i64, i64)> = Default::default();
        for r in &rows {
            let sum = sums.entry((&r.kind, &r.status, &r.currency)).or_default();
            *sum = (sum.0 + r.count, sum.1 + r.amount_minor);
        }
        let totals = sums
            .into_iter()
            .map(|((kind, status, currency), (count, minor))| TotalView {
                kind: kind.into(),
                status: status.into(),
                currency: currency.into(),
                count,
                amount: minor_text(minor, currency),
            })
            .collect();
        let hourly = rows
            .iter()
            .filter(|r| r.kind == PaymentKind::Payment.as_str() && r.status == PaymentStatus::Succeeded.as_str())
            .map(|r| HourView {
                hour: r.hour,
                currency: r.currency.clone(),
                count: r.count,
                amount: minor_text(r.amount_minor, &r.currency),
            })
            .collect();
        let pending = self.store.approvals_pending(now).await.map_err(internal("approval count"))?;
        let states = self.store.principal_states(AGENTS_LISTED_MAX).await.map_err(internal("principal list"))?;
        Ok(SummaryView {
            date: rfc3339(from).chars().take(10).collect(),
            totals,
            hourly,
            pending_approvals: pending,
            suspended_agents: states.iter().filter(|s| s.suspended_at.is_some()).count() as i64,
        })
    }

    /// The store, the payment backend, the rail and the queues, checked now.
    pub async fn ops_health(&self, op: &Operator) -> Result<HealthView, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::APPROVE, scopes::ADMIN])?;
        let now = self.clock.now();
        let mut checks = Vec::new();
        checks.push(match self.store.ping().await {
            Ok(()) => CheckView { name: "store", ok: true, detail: "answers".into() },
            Err(e) => CheckView { name: "store", ok: false, detail: e.to_string() },
        });
        // Asking for a payment no one made reaches the backend without moving anything.
        checks.push(match self.backend.payment(&PaymentId::generate()).await {
            Ok(_) => CheckView { name: "backend", ok: true, detail: format!("{} answers", self.backend.name()) },
            Err(e) => CheckView { name: "backend", ok: false, detail: format!("{}: {e}", self.backend.name()) },
        });
        for rail in &self.rails {
            let stuck = self
                .store
                .rail_list(RailQuery {
                    rail: Some(rail.name().into()),
                    states: vec![RailState::Unknown],
                    updated_before: now,
                    limit: 100,
                })
                .await
                .map(|r| r.len())
                .map_err(internal("rail list"))?;
            let open: Vec<&str> =
                rail.circuits().into_iter().filter(|(_, state)| *state != "closed").map(|(e, _)| e).collect();
            let circuits = match open.is_empty() {
                true => String::new(),
                false => format!("; circuit open (requests refused unsent): {}", open.join(", ")),
            };
            checks.push(CheckView {
                name: "rail",
                ok: stuck == 0 && open.is_empty(),
                detail: format!("{}: {stuck} payments with an unknown outcome{circuits}", rail.display_name()),
            });
        }
        let breaks = self.metrics.audit_witness_breaks();
        let stalled = self.audit_sealing_stalled().await;
        let mut detail = match breaks {
            0 => "no record this replica wrote went missing before it was sealed".to_string(),
            n => format!(
                "{n} records this replica wrote were deleted or changed in the database before they were \
                 sealed (see the error log; paygate_audit_witness_breaks_total)"
            ),
        };
        if let Some((count, age)) = stalled {
            detail.push_str(&format!(
                "; sealing is not running: {count} records unsealed, the oldest {age} s old (audit verify fails \
                 on them; is a sealing job running, and who holds the seal_audit job lease?)"
            ));
        }
        checks.push(CheckView { name: "audit", ok: breaks == 0 && stalled.is_none(), detail });
        let pending = self.store.approvals_pending(now).await.map_err(internal("approval count"))?;
        checks.push(CheckView { name: "approvals", ok: true, detail: format!("{pending} pending") });
        let status = if checks.iter().all(|c| c.ok) { "ok" } else { "degraded" };
        Ok(HealthView { status, checks, version: env!("CARGO_PKG_VERSION"), time: rfc3339(now) })
    }

    /// The last reconciliation (scheduled, CLI or console), as audited.
    pub async fn ops_last_reconciliation(&self, op: &Operator) -> Result<Option<ReconciliationRun>, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        let q = AuditQuery { tool: Some("reconcile".into()), limit: 1, ..Default::default() };
        let last = self.store.audit_query(q).await.map_err(internal("audit search"))?;
        Ok(last.into_iter().next().map(|r| ReconciliationRun {
            at: rfc3339(r.at),
            by: r.principal_sub,
            report: report_view(r.detail.as_deref().and_then(|d| serde_json::from_str(d).ok()).unwrap_or(Value::Null)),
        }))
    }

    /// Run reconciliation now (admin), audited under the operator.
    pub async fn ops_reconcile(&self, op: &Operator) -> Result<ReconciliationRun, OpError> {
        self.require_op(op, &[scopes::ADMIN])?;
        let report: ReconcileReport = self.reconcile(None).await.map_err(|error| {
            tracing::error!(%error, "reconciliation failed");
            OpError::internal()
        })?;
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, reconcile_decision(&report)).await;
        Ok(ReconciliationRun {
            at: rfc3339(self.clock.now()),
            by: op.subject.clone(),
            report: report_view(serde_json::to_value(&report).unwrap_or(Value::Null)),
        })
    }

    /// An approval by id, for the console's routes (same checks as `/approvals/{id}`).
    pub async fn ops_approval(&self, op: &Operator, id: &str) -> Result<ApprovalView, OpError> {
        self.approval(op, id).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::audit::AuditRecord;
    use crate::gateway::operator_views::step_of;

    fn rec(tool: &str, decision: &str) -> AuditRecord {
        AuditRecord {
            seq: 1,
            at: 0,
            correlation_id: "c".into(),
            principal_iss: "i".into(),
            principal_sub: "s".into(),
            principal_user: None,
            tool: tool.into(),
            decision: decision.into(),
            code: None,
            idempotency_key: None,
            payment_id: None,
            approval_id: None,
            detail: None,
            repeats: 1,
            policy_version: None,
            intent: None,
            tag: None,
        }
    }

    #[test]
    fn timeline_steps() {
        let cases = [
            ("create_payment", "approval_required", "approval_requested"),
            ("approvals.preauthorize", "created", "approval_requested"),
            ("approvals.approve", "recorded", "approved"),
            ("approvals.approve", "refused", "refused"),
            ("approvals.reject", "recorded", "rejected"),
            ("mandates.issue", "issued", "mandate_issued"),
            ("mandates.revoke", "revoked", "revoked"),
            ("create_payment", "mandate_accepted", "mandate_accepted"),
            ("create_payment", "allowed", "paid"),
            ("refund_payment", "allowed", "refunded"),
            ("send_mpesa_payout", "submitted", "submitted"),
            ("create_payment", "answered", "answered"),
            ("create_payment", "replayed", "replayed"),
            ("mpesa_callback", "settled", "receipt"),
            ("create_payment", "denied", "refused"),
            ("resolve_payment", "resolution_proposed", "resolution_proposed"),
            ("resolve_payment", "resolution_confirmed", "settled_by_hand"),
            ("reconcile", "reconciled", "other"),
        ];
        for (tool, decision, step) in cases {
            assert_eq!(step_of(&rec(tool, decision)), step, "{tool} {decision}");
        }
    }

    #[test]
    fn key_cursors_round_trip_and_refuse_forgeries() {
        let c = encode_key_cursor(1_700_000_000, "pay_abc");
        assert_eq!(decode_key_cursor(Some(&c)).unwrap(), Some((1_700_000_000, "pay_abc".into())));
        // … "k1:05:pay", "k1:+5:pay" (another spelling of a position: found by fuzzing the list cursor)
        for bad in ["", "!!", "djE6MTA", "azE6eDpwYXk", "azE6MDU6cGF5", "azE6KzU6cGF5"] {
            assert!(decode_key_cursor(Some(bad)).is_err(), "{bad}");
        }
    }
}
