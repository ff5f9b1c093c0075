//! `check_payment_policy`: what a money call would get — allowed, a human's approval (why, and who
//! decides), or refused (the code) — and the agent's headroom, without moving money, writing an
//! approval, auditing or counting anything toward a stop rule.
//!
//! The answer is the operation's own: the preflight runs the very operation the money tool runs
//! (its parsing, mandate check, policy, payee rules and the unit of work's replay and conflict
//! checks) under a caller marked [`Preflight`]. Along that path every write is skipped for such a
//! caller (`audit`, `refuse`, `refuse_as`, the stop rules, `require_approval`), and the unit of work
//! stops where it would move money: it checks the guards as they stand (today's budget, the
//! mandate's uses, the payee's cap) and says "allowed". What it cannot see is money itself (funds,
//! the rail's answer) and what another call does in between.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use serde::Serialize;

use super::unit_of_work::Executed;
use super::{Caller, Gateway};
use crate::clock::rfc3339;
use crate::domain::error::StoreError;
use crate::domain::money::{Currency, Money, format_minor};
use crate::domain::ops::{MandateQuery, MandateStatus};
use crate::domain::payee::{self, PayeeState};
use crate::domain::payment::{Guards, PaymentKind};
use crate::domain::rules::guards::{self, MandateRow};
use crate::error::{AgentError, ErrorCode};

/// Open mandates the headroom lists at most (the newest).
pub const OPEN_MANDATES_LISTED_MAX: u32 = 50;

/// What a dry run leaves behind: whether it got as far as moving money, and what the payee rules
/// read.
#[derive(Debug, Default)]
pub struct Preflight {
    allowed: AtomicBool,
    payee: Mutex<Option<(String, PayeeState)>>,
}

impl Preflight {
    pub(super) fn saw_payee(&self, payee: &str, state: PayeeState) {
        *self.payee.lock().unwrap_or_else(|p| p.into_inner()) = Some((payee.to_string(), state));
    }
}

/// The preflight's answer.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PreflightView {
    /// The money tool asked about (its canonical name).
    pub tool: String,
    /// "allowed", "approval_required", "denied", or "replay" (this operation_id already has an
    /// outcome: calling again returns it, nothing moves twice).
    pub verdict: String,
    /// The error code the call would get (denied, approval_required).
    pub code: Option<String>,
    /// Why, in the gateway's words.
    pub message: Option<String>,
    /// Who would decide an approval: "operator" or "user".
    pub approver: Option<String>,
    pub reviewers_required: Option<i64>,
    /// The payee, for a call that pays one (create_payment, send_mpesa_payout) under payee rules.
    pub payee: Option<PayeeRoom>,
    pub headroom: Headroom,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct PayeeRoom {
    pub payee: String,
    /// A human approved a payment to it (or an operator added it), and nobody revoked it.
    pub known: bool,
    pub known_since: Option<String>,
    /// What autonomous payments to it total today in the call's currency, in minor units.
    pub paid_today_minor: i64,
    /// While it cools off under a cooling-off total: what autonomous payments to it total since it
    /// became known, in minor units (0 otherwise).
    pub paid_cooling_off_minor: i64,
}

/// What an agent may still do today without a human.
#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct Headroom {
    /// Per currency with a daily limit: today's (UTC) autonomous payment budget.
    pub payments: Vec<BudgetRoom>,
    /// Per currency: today's autonomous refund budget.
    pub refunds: Vec<BudgetRoom>,
    /// Policy denials (or their weight in RATE_LIMITED answers) left before the stop rule suspends
    /// this agent; 0: the next one suspends it.
    pub denials_before_suspension: i64,
    /// The same refusal for the same payment this many times in a row suspends at once (0: off).
    pub same_refusal_in_a_row_max: u32,
    /// Active mandates issued to this agent (the newest), which carry a human's approval.
    pub open_mandates: Vec<MandateRoom>,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct BudgetRoom {
    pub currency: String,
    pub limit: String,
    pub spent: String,
    pub remaining: String,
    pub count_today: i64,
    pub count_max: i64,
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct MandateRoom {
    pub mandate_id: String,
    /// "closed" (one payment) or "open" (a standing budget).
    pub kind: String,
    pub currency: String,
    /// What is left of its budget; none: no budget of its own.
    pub budget_left: Option<String>,
    pub uses_left: i64,
    pub expires_at: String,
}

fn store_failure(caller: &Caller) -> impl Fn(StoreError) -> AgentError + '_ {
    move |error| {
        tracing::error!(correlation_id = %caller.correlation_id, %error, "preflight read failed");
        AgentError::internal()
    }
}

impl Gateway {
    /// The caller a preflight runs the operation as: the same principal, nothing written.
    pub fn preflight_caller(&self, c: &Caller) -> Caller {
        Caller {
            intent: None,
            principal: c.principal.clone(),
            correlation_id: c.correlation_id.clone(),
            preflight: Some(std::sync::Arc::new(Preflight::default())),
        }
    }

    /// Where a preflight's unit of work stops: the guards checked as they stand (nothing drawn),
    /// and the dry run marked allowed. The error it returns is never shown: the preflight reads
    /// the mark first.
    pub(super) async fn preflight_guards(
        &self,
        caller: &Caller,
        g: &Guards,
        amount: Money,
    ) -> Result<Executed, AgentError> {
        let now = self.clock.now();
        let currency = amount.currency();
        let failed = store_failure(caller);
        if let Some(b) = &g.budget {
            let subject = caller.principal.usage_subject();
            let usage = self.store.budget_usage(b.kind, &subject, b.since, currency).await.map_err(&failed)?;
            guards::check_budget(b, usage, amount.minor(), currency).map_err(|e| AgentError::from(&e))?;
        }
        if let Some(m) = &g.mandate {
            let listed = self.store.mandate_get(&m.mandate_id, now).await.map_err(&failed)?;
            let row = listed.map(|l| MandateRow {
                currency: l.currency,
                budget_minor: l.budget_minor,
                max_uses: l.max_uses,
                spent_minor: l.spent_minor,
                uses: l.uses,
                expires_at: l.expires_at,
                revoked_at: l.revoked_at,
            });
            guards::check_mandate(row.as_ref(), amount.minor(), currency, now).map_err(|e| AgentError::from(&e))?;
        }
        if let Some(cap) = &g.payee {
            let (_, paid) =
                self.store.payee_state(&cap.owner, &cap.payee, Some((cap.since, currency))).await.map_err(&failed)?;
            payee::check_cap(cap, paid, amount.minor(), currency)
                .map_err(|why| AgentError::new(ErrorCode::BudgetExceeded, why))?;
            if let Some(cooling) = &cap.cooling {
                let paid = self
                    .store
                    .payee_cooling_paid(&cap.owner, &cap.payee, cooling.known_since, currency)
                    .await
                    .map_err(&failed)?;
                payee::check_cooling(cap, paid, amount.minor(), currency)
                    .map_err(|why| AgentError::new(ErrorCode::BudgetExceeded, why))?;
            }
        }
        if let Some(pf) = &caller.preflight {
            pf.allowed.store(true, Ordering::Release);
        }
        Err(AgentError::internal())
    }

    /// The preflight's answer from what the dry run of `tool` returned.
    pub async fn preflight_answer(
        &self,
        caller: &Caller,
        dry: &Caller,
        tool: &str,
        outcome: Result<Executed, AgentError>,
    ) -> Result<PreflightView, AgentError> {
        let allowed = dry.preflight.as_ref().is_some_and(|pf| pf.allowed.load(Ordering::Acquire));
        let mut view = PreflightView {
            tool: tool.to_string(),
            verdict: String::new(),
            code: None,
            message: None,
            approver: None,
            reviewers_required: None,
            payee: None,
            headroom: self.headroom(caller).await?,
        };
        view.verdict = match (allowed, outcome) {
            (true, _) => "allowed".into(),
            (false, Ok(_)) => "replay".into(),
            (false, Err(e)) => {
                view.code = Some(e.code.as_str().to_string());
                view.message = Some(e.message.clone());
                if e.code == ErrorCode::ApprovalRequired {
                    view.approver = e.details.get("approver").and_then(|v| v.as_str()).map(str::to_string);
                    view.reviewers_required = e.details.get("reviewers_required").and_then(|v| v.as_i64());
                    "approval_required".into()
                } else {
                    "denied".into()
                }
            }
        };
        if let Some(pf) = &dry.preflight
            && let Some((payee, state)) = pf.payee.lock().unwrap_or_else(|p| p.into_inner()).take()
        {
            view.payee = Some(PayeeRoom {
                payee,
                known: state.known_since.is_some(),
                known_since: state.known_since.map(rfc3339),
                paid_today_minor: state.paid_today_minor,
                paid_cooling_off_minor: state.paid_cooling_minor,
            });
        }
        Ok(view)
    }

    /// What the caller may still do today without a human (`check_payment_policy`, and the
    /// capabilities resource).
    pub async fn headroom(&self, caller: &Caller) -> Result<Headroom, AgentError> {
        let p = &caller.principal;
        let now = self.clock.now();
        let day = guards::day_of(now);
        let subject = p.usage_subject();
        let failed = store_failure(caller);
        let rooms = |kind: PaymentKind| {
            let limits = match kind {
                PaymentKind::Payment => &p.profile.daily_limit_minor,
                PaymentKind::Refund => &p.profile.daily_refund_limit_minor,
            };
            let mut list: Vec<(Currency, i64)> = limits.iter().map(|(c, m)| (*c, *m)).collect();
            list.sort_by_key(|(c, _)| c.code());
            list
        };
        let mut payments = Vec::new();
        let mut refunds = Vec::new();
        for (kind, out) in [(PaymentKind::Payment, &mut payments), (PaymentKind::Refund, &mut refunds)] {
            for (currency, limit) in rooms(kind) {
                let used = self.store.budget_usage(kind, &subject, day, currency).await.map_err(&failed)?;
                out.push(BudgetRoom {
                    currency: currency.code().to_string(),
                    limit: format_minor(limit, currency),
                    spent: format_minor(used.spent_minor, currency),
                    remaining: format_minor((limit - used.spent_minor).max(0), currency),
                    count_today: used.payments,
                    count_max: p.profile.daily_payments_max,
                });
            }
        }
        let who = p.principal_ref();
        let counted = self.store.denials_since(&who, now - self.limits.stop_window_secs).await.map_err(&failed)?;
        let every = self.limits.rate_limited_per_denial;
        let weighted = if every > 0 { counted.rate_limited / every } else { 0 };
        let denials_before_suspension = (self.limits.stop_denials_max - counted.denials - weighted - 1).max(0);
        let q = MandateQuery { status: Some(MandateStatus::Active), now, before: None, limit: 1_000 };
        let open_mandates = self
            .store
            .mandate_list(q)
            .await
            .map_err(&failed)?
            .into_iter()
            .filter(|m| m.subject == p.subject && m.user == p.user)
            .take(OPEN_MANDATES_LISTED_MAX as usize)
            .map(|m| {
                let currency = Currency::parse(&m.currency).ok();
                let money = |minor: i64| currency.map_or_else(|| minor.to_string(), |c| format_minor(minor, c));
                MandateRoom {
                    budget_left: m.budget_minor.map(|b| money((b - m.spent_minor).max(0))),
                    uses_left: (m.max_uses - m.uses).max(0),
                    expires_at: rfc3339(m.expires_at),
                    mandate_id: m.id,
                    kind: m.kind,
                    currency: m.currency,
                }
            })
            .collect();
        Ok(Headroom {
            payments,
            refunds,
            denials_before_suspension,
            same_refusal_in_a_row_max: self.limits.stop_repeat_max,
            open_mandates,
        })
    }
}
