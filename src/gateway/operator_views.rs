//! What operators see: the views of payments, audit records, mandates, agents, the summary and
//! health, made from the store's rows (amounts as decimal strings, times RFC 3339).

use serde::Serialize;
use serde_json::Value;

use crate::clock::rfc3339;
use crate::domain::audit::AuditRecord;
use crate::domain::money::{Currency, format_minor};
use crate::domain::ops::{MandateListing, OpsPayment};
use crate::domain::payment::PaymentKind;
/// A payment as operators see it.
#[derive(Debug, Clone, Serialize)]
pub struct OpsPaymentView {
    pub payment_id: String,
    pub kind: &'static str,
    pub status: &'static str,
    /// `ledger` (the embedded reference ledger) or the rail that carried it.
    pub rail: String,
    /// A rail record's own state (submitting, unknown, pending, …).
    pub rail_state: Option<String>,
    pub from_account: String,
    pub to_account: String,
    pub amount: String,
    pub currency: String,
    pub agent_subject: String,
    /// The user the agent acted for (RFC 8693 delegation), if it did.
    pub user: Option<String>,
    pub memo: Option<String>,
    pub refund_of: Option<String>,
    pub refunded: Option<String>,
    pub mandate_id: Option<String>,
    pub created_at: String,
    pub rail_ref: Option<String>,
    pub receipt: Option<String>,
}

/// One audit record, with the timeline step it stands for.
#[derive(Debug, Clone, Serialize)]
pub struct AuditView {
    pub seq: i64,
    pub at: String,
    pub step: &'static str,
    pub actor: String,
    pub actor_issuer: String,
    /// The user the actor (an agent) acted for, if it did.
    pub user: Option<String>,
    pub tool: String,
    pub decision: String,
    pub code: Option<String>,
    pub correlation_id: String,
    pub idempotency_key: Option<String>,
    pub approval_id: Option<String>,
    pub payment_id: Option<String>,
    pub detail: Option<String>,
    /// How many decisions this record stands for (a throttled refusal's count; 1 otherwise).
    pub repeats: i64,
    /// The policy version an agent's call was judged under ("which rule allowed this payment").
    pub policy_version: Option<i64>,
    /// A money call's question to policy, as recorded (what `policy simulate` replays).
    pub intent: Option<serde_json::Value>,
}

#[derive(Debug, Clone, Serialize)]
pub struct PaymentDetail {
    pub payment: OpsPaymentView,
    /// Oldest first: request, approval, reviews, mandate, payment, receipt, refunds.
    pub timeline: Vec<AuditView>,
}

#[derive(Debug, Clone, Serialize)]
pub struct MandateView {
    pub mandate_id: String,
    pub approval_id: String,
    pub kind: String,
    pub agent_subject: String,
    /// The user the agent acts for under it, if any.
    pub user: Option<String>,
    pub currency: String,
    pub budget: Option<String>,
    pub spent: String,
    pub max_uses: i64,
    pub uses: i64,
    pub expires_at: String,
    pub created_at: String,
    pub revoked_at: Option<String>,
    pub revoked_by: Option<String>,
    pub status: &'static str,
}

/// An agent as operators see it: one row per what a suspension covered (the agent as a whole, or
/// the agent acting for one user), and agents seen lately.
#[derive(Debug, Clone, Serialize)]
pub struct PrincipalView {
    pub subject: String,
    /// Its token issuer ('' for a suspension from before issuers were recorded: any issuer).
    pub issuer: String,
    /// `agent`: the agent whoever it acts for; `pair`: the agent acting for `user` (none: on its
    /// own token).
    pub scope: &'static str,
    pub user: Option<String>,
    pub suspended: bool,
    pub suspended_at: Option<String>,
    pub suspended_reason: Option<String>,
    pub resumed_at: Option<String>,
    pub last_seen: Option<String>,
}

#[derive(Debug, Clone, Serialize)]
pub struct TotalView {
    pub kind: String,
    pub status: String,
    pub currency: String,
    pub count: i64,
    pub amount: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct HourView {
    pub hour: i64,
    pub currency: String,
    pub count: i64,
    pub amount: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct SummaryView {
    /// The UTC day summed.
    pub date: String,
    pub totals: Vec<TotalView>,
    /// Succeeded payments (not refunds) per UTC hour of the day.
    pub hourly: Vec<HourView>,
    pub pending_approvals: i64,
    pub suspended_agents: i64,
}

#[derive(Debug, Clone, Serialize)]
pub struct CheckView {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct HealthView {
    pub status: &'static str,
    pub checks: Vec<CheckView>,
    pub version: &'static str,
    pub time: String,
}

#[derive(Debug, Clone, Serialize)]
pub struct ReconciliationRun {
    pub at: String,
    pub by: String,
    /// The report as audited (`reconcile_decision`).
    pub report: Value,
}

/// What one audit record means on a payment's timeline.
pub fn step_of(rec: &AuditRecord) -> &'static str {
    match (rec.tool.as_str(), rec.decision.as_str()) {
        ("approvals.preauthorize", _) | (_, "approval_required") => "approval_requested",
        ("approvals.approve", "recorded") => "approved",
        ("approvals.reject", "recorded") => "rejected",
        ("mandates.issue", _) => "mandate_issued",
        ("mandates.revoke", _) => "revoked",
        ("resolve_payment", "resolution_proposed") => "resolution_proposed",
        ("resolve_payment", "resolution_confirmed") => "settled_by_hand",
        (_, "mandate_accepted") => "mandate_accepted",
        ("refund_payment", "allowed") => "refunded",
        (_, "submitted") => "submitted",
        (_, "answered") => "answered",
        (_, "allowed") => "paid",
        (_, "replayed") => "replayed",
        (tool, _) if tool.ends_with("_callback") => "receipt",
        (_, "denied" | "failed" | "conflict" | "refused" | "suspended" | "rate_limited") => "refused",
        _ => "other",
    }
}

pub(super) fn audit_view(rec: AuditRecord) -> AuditView {
    AuditView {
        seq: rec.seq,
        at: rfc3339(rec.at),
        step: step_of(&rec),
        actor: rec.principal_sub,
        actor_issuer: rec.principal_iss,
        user: rec.principal_user,
        tool: rec.tool,
        decision: rec.decision,
        code: rec.code,
        correlation_id: rec.correlation_id,
        idempotency_key: rec.idempotency_key,
        approval_id: rec.approval_id,
        payment_id: rec.payment_id,
        detail: rec.detail,
        repeats: rec.repeats,
        policy_version: rec.policy_version,
        intent: rec.intent.as_deref().and_then(|i| serde_json::from_str(i).ok()),
    }
}

pub(super) fn payment_view(p: OpsPayment) -> OpsPaymentView {
    let pay = p.payment;
    OpsPaymentView {
        payment_id: pay.id.to_string(),
        kind: pay.kind.as_str(),
        status: pay.status.as_str(),
        rail: p.rail,
        rail_state: p.rail_state,
        from_account: pay.from_account.to_string(),
        to_account: pay.to_account.to_string(),
        amount: format_minor(pay.amount_minor, pay.currency),
        currency: pay.currency.to_string(),
        agent_subject: pay.principal_sub,
        user: pay.principal_user,
        memo: pay.memo,
        refund_of: pay.refund_of.map(|r| r.to_string()),
        refunded: (pay.kind == PaymentKind::Payment).then(|| format_minor(pay.refunded_minor, pay.currency)),
        mandate_id: p.mandate_id,
        created_at: rfc3339(pay.created_at),
        rail_ref: p.rail_ref,
        receipt: p.receipt,
    }
}

/// A reconciliation report as operators read it: `since` in RFC 3339 like every other time here.
pub(super) fn report_view(mut report: Value) -> Value {
    if let Some(since) = report.get("since").and_then(Value::as_i64) {
        report["since"] = Value::String(rfc3339(since));
    }
    report
}

pub(super) fn minor_text(minor: i64, currency: &str) -> String {
    match Currency::parse(currency) {
        Ok(c) => format_minor(minor, c),
        Err(_) => minor.to_string(),
    }
}

pub(super) fn mandate_view(m: MandateListing) -> MandateView {
    MandateView {
        budget: m.budget_minor.map(|b| minor_text(b, &m.currency)),
        spent: minor_text(m.spent_minor, &m.currency),
        mandate_id: m.id,
        approval_id: m.approval_id,
        kind: m.kind,
        agent_subject: m.subject,
        user: m.user,
        currency: m.currency,
        max_uses: m.max_uses,
        uses: m.uses,
        expires_at: rfc3339(m.expires_at),
        created_at: rfc3339(m.created_at),
        revoked_at: m.revoked_at.map(rfc3339),
        revoked_by: m.revoked_by,
        status: m.status.as_str(),
    }
}
