//! The dry run of a policy change against history (`policy simulate`): the audited money
//! decisions of a window, each carrying the question policy answered (its intent) and the version
//! it answered under, asked again of that version and of the proposed one, in order, with each
//! side's daily budgets replayed in memory. A call is reported when the two answers differ. Pure.
//!
//! What is replayed: tool governance (disabled, approval required), the profile each call resolves
//! to (by issuer, agent, user, client id), allowed accounts, autonomous limits (a refund's
//! together with the refunds before it, and an original over the limit), mandates (a mandated call
//! needs no human and is not refused by the budget), and the daily budgets (amount and count) of
//! autonomous calls. What is not: scopes (a token's, unchanged by policy), rate limits, payee rules
//! (they read the payee book as it stood), and what the ledger or a rail answered afterwards. Both
//! sides are replayed the same way, so a difference is the policy's alone.

use std::collections::{BTreeMap, HashMap};

use serde::Serialize;

use super::audit::AuditRecord;
use super::money::{Currency, format_minor};
use super::policy::{Decision, Question, judge};
use super::policy_doc::LivePolicy;
use super::rules::guards::day_of;

/// Audit decisions that are the answer to a money call policy judged (not a replay, a mandate's
/// acceptance or a held key).
const JUDGED: &[&str] = &["allowed", "approval_required", "denied", "failed", "backend_unavailable", "outcome_unknown"];
/// Refusals made before policy was asked (the call never reached it): not replayed.
const BEFORE_POLICY: &[&str] = &[
    "IDEMPOTENCY_CONFLICT",
    "OPERATION_IN_PROGRESS",
    "MANDATE_INVALID",
    "MANDATE_EXPIRED",
    "MANDATE_MISMATCH",
    "RATE_LIMITED",
    "PRINCIPAL_SUSPENDED",
    "INVALID_ARGUMENT",
];

/// What policy would have answered a call.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case", tag = "outcome", content = "code")]
pub enum Outcome {
    Allowed,
    ApprovalRequired,
    Refused(String),
}

impl Outcome {
    /// How permissive: refused < needs a human < allowed.
    fn rank(&self) -> u8 {
        match self {
            Outcome::Refused(_) => 0,
            Outcome::ApprovalRequired => 1,
            Outcome::Allowed => 2,
        }
    }
}

/// One call whose answer the proposed version changes.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Changed {
    pub seq: i64,
    /// RFC 3339.
    pub at: String,
    pub correlation_id: String,
    pub principal_iss: String,
    pub agent: String,
    pub user: Option<String>,
    pub tool: String,
    pub payee: String,
    pub amount: String,
    pub currency: String,
    /// The version it was decided under.
    pub version: i64,
    pub before: Outcome,
    pub after: Outcome,
}

/// Per agent and currency: how many calls (and how much) the proposal would make stricter or looser.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct Totals {
    pub agent: String,
    pub currency: String,
    pub stricter: i64,
    pub stricter_amount: String,
    pub looser: i64,
    pub looser_amount: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// Calls replayed.
    pub replayed: i64,
    /// Calls skipped: their version is no longer stored or readable, or their intent unreadable.
    pub skipped: i64,
    pub changed: Vec<Changed>,
    pub totals: Vec<Totals>,
}

/// One side's running state: what autonomous calls drew per (principal, UTC day, currency, kind).
#[derive(Default)]
struct Budgets(HashMap<(String, i64, String, String), (i64, i64)>);

fn outcome(policy: &LivePolicy, rec: &AuditRecord, q: &Question, budgets: &mut Budgets) -> Outcome {
    if policy.is_disabled(&q.tool) || policy.is_disabled(&rec.tool) {
        return Outcome::Refused("TOOL_DISABLED".into());
    }
    let profile = policy.profiles.resolve(
        &rec.principal_iss,
        &rec.principal_sub,
        rec.principal_user.as_deref(),
        q.client_id.as_deref(),
    );
    let force = !q.mandated && policy.always_needs_a_human(&q.tool);
    // Scopes are the token's, and policy versions do not change them: held, as they were.
    let decision = match judge(|_| true, &profile, q, force) {
        Decision::RequireApproval { .. } if q.mandated => Decision::Allow,
        other => other,
    };
    match decision {
        Decision::Deny(refusal) => Outcome::Refused(refusal.code().into()),
        Decision::RequireApproval { .. } => Outcome::ApprovalRequired,
        Decision::Allow => {
            let limits =
                if q.kind == "refund" { &profile.daily_refund_limit_minor } else { &profile.daily_limit_minor };
            let who = format!(
                "{}\u{1f}{}\u{1f}{}",
                rec.principal_iss,
                rec.principal_sub,
                rec.principal_user.as_deref().unwrap_or("")
            );
            let key = (who, day_of(rec.at), q.currency.code().to_string(), q.kind.clone());
            let (spent, count) = budgets.0.get(&key).copied().unwrap_or((0, 0));
            if !q.mandated
                && let Some(max) = limits.get(&q.currency)
                && (spent.saturating_add(q.amount_minor) > *max || count + 1 > profile.daily_payments_max)
            {
                return Outcome::Refused("BUDGET_EXCEEDED".into());
            }
            budgets.0.insert(key, (spent.saturating_add(q.amount_minor), count + 1));
            Outcome::Allowed
        }
    }
}

/// Whether `rec` is the answer to a money call policy judged (and so is replayed).
pub fn is_judged(rec: &AuditRecord) -> bool {
    rec.intent.is_some()
        && rec.policy_version.is_some()
        && JUDGED.contains(&rec.decision.as_str())
        && !rec.code.as_deref().is_some_and(|c| BEFORE_POLICY.contains(&c))
}

/// Replay `history` (oldest first) under each record's own version (`version_of`) and under
/// `proposed`.
pub fn simulate<'a>(
    history: &[AuditRecord],
    version_of: impl Fn(i64) -> Option<&'a LivePolicy>,
    proposed: &LivePolicy,
) -> Report {
    let (mut before_budgets, mut after_budgets) = (Budgets::default(), Budgets::default());
    let mut report = Report { replayed: 0, skipped: 0, changed: Vec::new(), totals: Vec::new() };
    let mut totals: BTreeMap<(String, Currency), (i64, i64, i64, i64)> = BTreeMap::new();
    for rec in history.iter().filter(|r| is_judged(r)) {
        let (Some(version), Some(intent)) = (rec.policy_version, rec.intent.as_deref()) else { continue };
        let (Some(then), Ok(q)) = (version_of(version), serde_json::from_str::<Question>(intent)) else {
            report.skipped += 1;
            continue;
        };
        report.replayed += 1;
        let before = outcome(then, rec, &q, &mut before_budgets);
        let after = outcome(proposed, rec, &q, &mut after_budgets);
        if before == after {
            continue;
        }
        let agent = match &rec.principal_user {
            Some(u) => format!("{} for {u}", rec.principal_sub),
            None => rec.principal_sub.clone(),
        };
        let t = totals.entry((agent, q.currency)).or_default();
        // (Refused for another reason only: neither stricter nor looser.)
        match after.rank().cmp(&before.rank()) {
            std::cmp::Ordering::Less => (t.0, t.1) = (t.0 + 1, t.1.saturating_add(q.amount_minor)),
            std::cmp::Ordering::Greater => (t.2, t.3) = (t.2 + 1, t.3.saturating_add(q.amount_minor)),
            std::cmp::Ordering::Equal => {}
        }
        report.changed.push(Changed {
            seq: rec.seq,
            at: crate::clock::rfc3339(rec.at),
            correlation_id: rec.correlation_id.clone(),
            principal_iss: rec.principal_iss.clone(),
            agent: rec.principal_sub.clone(),
            user: rec.principal_user.clone(),
            tool: rec.tool.clone(),
            payee: q.payee.clone(),
            amount: format_minor(q.amount_minor, q.currency),
            currency: q.currency.code().to_string(),
            version,
            before,
            after,
        });
    }
    report.totals = totals
        .into_iter()
        .map(|((agent, currency), (stricter, s_amount, looser, l_amount))| Totals {
            agent,
            currency: currency.code().to_string(),
            stricter,
            stricter_amount: format_minor(s_amount, currency),
            looser,
            looser_amount: format_minor(l_amount, currency),
        })
        .collect();
    report
}

#[cfg(test)]
#[path = "policy_replay_tests.rs"]
mod tests;
