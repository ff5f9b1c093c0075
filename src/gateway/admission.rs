//! What every money-moving operation does before its unit of work, once: its free text checked,
//! its mandate verified against exactly this call, what it draws on (a mandate, or today's
//! autonomous budget), tool governance, and the replay of an operation that already finished.

use serde_json::{Value, json};

use super::unit_of_work::{Executed, Intent, Movement, Strategy, Work};
use super::{Caller, Decision, Gateway};
use crate::auth::AgentPrincipal;
use crate::backend::rail::RailOrder;
use crate::domain::ids::OperationId;
use crate::domain::money::{Currency, Money};
use crate::domain::payee::{self, CoolingCap, PayeeCap, PayeeState};
use crate::domain::payment::{Attempt, DailyBudget, Guards, MandateDraw, PaymentKind, PaymentStatus};
use crate::domain::policy::{self, Decision as Policy, Profile};
use crate::domain::rules::guards;
use crate::error::AgentError;
use crate::mandate::{CallIntent, MandateClaims, authorizes};

/// The tools whose payee is someone the agent pays (an account it pays into, a customer's phone):
/// the profile's payee rules apply to them (`domain::payee`), and approving one of their payments
/// makes its payee known. Not collections (money comes in to the rail's own account) or refunds
/// (money goes back to whoever paid).
pub(super) const PAYS_PAYEE: &[&str] =
    &["create_payment", "send_mpesa_payout", "send_airtel_payout", "pay_paybill", "pay_till"];

/// Longest memo or reason kept, in characters. Free text from agents is data, never instructions.
pub const MEMO_CHARS_MAX: usize = 140;

pub(super) fn parse_text(field: &str, value: Option<String>) -> Result<Option<String>, AgentError> {
    match value {
        Some(v) if v.chars().count() > MEMO_CHARS_MAX => {
            Err(AgentError::invalid(format!("{field} must be at most {MEMO_CHARS_MAX} characters")))
        }
        Some(v) => match crate::domain::text::refusal(&v) {
            Some(why) => Err(AgentError::invalid(format!("{field} {why}"))),
            None => Ok(Some(v)),
        },
        None => Ok(None),
    }
}

/// A valid mandate authorizes what policy would send to a human; it never overrides a denial.
fn authorize(decision: Policy, has_mandate: bool) -> Policy {
    match decision {
        Policy::RequireApproval { .. } if has_mandate => Policy::Allow,
        other => other,
    }
}

/// The "allow-all" broken build of the evals (`--features broken-gateways-for-evals`,
/// `PAYGATE_EVALS_BROKEN=allow-all`): policy answers Allow to every money movement, with no limit,
/// budget or payee rule in the posting. Every other build: `decision` and `guards` as they are.
fn broken_allow_all(decision: Policy, guards: Guards) -> (Policy, Guards) {
    #[cfg(feature = "broken-gateways-for-evals")]
    if super::broken_for_evals() == Some("allow-all") {
        return (Policy::Allow, Guards::default());
    }
    (decision, guards)
}

/// What a call asks for, before its mandate is looked at: the operation, the arguments that
/// identify it (its fingerprint), and the intent a human sees when it needs approval (which a closed
/// mandate pins whole: operation_id, memo or reason included).
pub(super) struct Asked<'a> {
    pub tool: &'static str,
    pub op: &'a OperationId,
    pub args: serde_json::Value,
    pub intent: serde_json::Value,
}

/// What the call's mandate (if any) means.
pub(super) enum MandateCheck {
    /// No mandate passed.
    Absent,
    /// Verified against this very call.
    Authorized(Box<Authorized>),
    /// It did not verify, but the operation already has its outcome: that outcome, replayed.
    Settled(Box<Executed>),
}

impl MandateCheck {
    /// The verified mandate, if one was passed; or the replayed outcome that answers the call.
    pub fn verified(self) -> Result<Option<Authorized>, Box<Executed>> {
        match self {
            MandateCheck::Absent => Ok(None),
            MandateCheck::Authorized(m) => Ok(Some(*m)),
            MandateCheck::Settled(done) => Err(done),
        }
    }
}

/// A verified mandate, ready to anchor the key and draw on.
pub(super) struct Authorized {
    pub claims: MandateClaims,
    /// As the agent passed it.
    pub jws: String,
}

impl Authorized {
    pub fn guards(&self) -> Guards {
        Guards {
            budget: None,
            mandate: Some(MandateDraw { mandate_id: self.claims.jti.clone(), jws: Some(self.jws.clone()) }),
            payee: None,
        }
    }
}

impl Gateway {
    /// The mandate passed with a call, verified against exactly this call. A mandate that no longer
    /// verifies (expired, say) does not hide an operation that already went through: when the
    /// operation's key holds an outcome for these very arguments, the call replays it.
    #[allow(clippy::too_many_arguments)]
    pub(super) async fn mandate_for(
        &self,
        caller: &Caller,
        asked: &Asked<'_>,
        jws: Option<&str>,
        payer: &str,
        payee: &str,
        amount: Money,
        payment_id: Option<&str>,
    ) -> Result<MandateCheck, AgentError> {
        let Some(jws) = jws else { return Ok(MandateCheck::Absent) };
        let p = &caller.principal;
        let intent_sha256 = crate::mandate::intent_digest(&asked.intent);
        let call = CallIntent {
            tool: asked.tool,
            agent_iss: &p.issuer,
            agent_sub: &p.subject,
            agent_user: p.user.as_deref(),
            payer,
            payee,
            amount_minor: amount.minor(),
            currency: amount.currency().code(),
            payment_id,
            intent_sha256: &intent_sha256,
        };
        let mut verified = self
            .mandates
            .verify(jws.trim(), self.clock.now())
            .and_then(|claims| authorizes(&claims, &call).map(|()| claims))
            .map_err(AgentError::from);
        // A revocation stands on the trail even if a database writer cleared it in `mandates`.
        if let Ok(claims) = &verified
            && self.revoked_in_trail(&claims.approval_id).await?
        {
            let revoked = crate::domain::error::BackendError::MandateExhausted("an operator revoked it".into());
            verified = Err(AgentError::from(&revoked));
        }
        match verified {
            Ok(claims) => {
                let mut d = Decision::new(asked.tool, "mandate_accepted");
                d.approval_id = Some(&claims.approval_id);
                d.detail = Some(format!("mandate {}", claims.jti));
                self.audit(caller, d).await;
                Ok(MandateCheck::Authorized(Box::new(Authorized { claims, jws: jws.trim().to_string() })))
            }
            Err(e) => match self.recorded_outcome(caller, asked.tool, asked.op, asked.args.clone()).await {
                Some(done) => done.map(|d| MandateCheck::Settled(Box::new(d))),
                None => {
                    let e = self.refuse(caller, asked.tool, None, e).await;
                    // A stale or foreign mandate offered again for the same payment under a new
                    // operation_id is no progress either (the operation's key, without a mandate).
                    let idem = self.idem_for(caller, asked.tool, asked.op, None, &asked.args);
                    self.enforce_no_progress(caller, asked.tool, &idem, e.code).await;
                    Err(e)
                }
            },
        }
    }

    /// The outcome already recorded for this operation with these very arguments, replayed; `None`
    /// when there is none. For a call that would be refused for what the operation itself changed
    /// (an expired mandate it used, a payment it refunded whole): its retry must still replay.
    pub(super) async fn recorded_outcome(
        &self,
        caller: &Caller,
        tool: &str,
        op: &OperationId,
        args: serde_json::Value,
    ) -> Option<Result<Executed, AgentError>> {
        let operation = self.idem_for(caller, tool, op, None, &args);
        match self.store.idem_peek(&operation.key, self.clock.now()).await {
            Ok(Some((fp, Some(outcome)))) if fp == operation.fingerprint => {
                Some(self.replay(caller, tool, &operation, &outcome).await)
            }
            _ => None,
        }
    }

    /// What a payment or refund draws on where it commits: its mandate, or else today's
    /// autonomous budget for its kind.
    pub(super) fn guards_for(
        &self,
        mandate: Option<&Authorized>,
        profile: &Profile,
        kind: PaymentKind,
        currency: Currency,
    ) -> Guards {
        match mandate {
            Some(m) => m.guards(),
            None => Guards { budget: self.budget_for(profile, kind, currency), mandate: None, payee: None },
        }
    }

    /// Today's (UTC) autonomous budget for payments or for refunds in this currency.
    fn budget_for(&self, profile: &Profile, kind: PaymentKind, currency: Currency) -> Option<DailyBudget> {
        let now = self.clock.now();
        let limits = match kind {
            PaymentKind::Payment => &profile.daily_limit_minor,
            PaymentKind::Refund => &profile.daily_refund_limit_minor,
        };
        limits.get(&currency).map(|max| DailyBudget {
            kind,
            since: guards::day_of(now),
            max_minor: *max,
            max_payments: profile.daily_payments_max,
        })
    }

    /// What the profile's payee rules say of paying `amount` to `payee` (its key,
    /// `domain::payee::key`; nothing is read when no rule applies): the verdict, the caps to
    /// re-check where the payment commits, and what was read (the preflight tool shows it).
    pub(super) async fn payee_verdict(
        &self,
        p: &AgentPrincipal,
        payee: &str,
        amount: Money,
    ) -> Result<PayeeVerdict, crate::domain::error::StoreError> {
        let rules = &p.profile.payees;
        let currency = amount.currency();
        if !rules.applies(currency) {
            return Ok(PayeeVerdict { decision: Policy::Allow, cap: None, state: None });
        }
        let now = self.clock.now();
        let owner = p.usage_subject();
        let day = guards::day_of(now);
        let (rec, paid) = self.store.payee_state(&owner, payee, Some((day, currency))).await?;
        // Only a row the gateway wrote makes a payee known (a row inserted or edited in the
        // database does not: the payment is judged as to an unknown payee).
        let known_since = rec.filter(|r| self.payee_tag_holds(r)).and_then(|r| r.known_since());
        let cooling = rules
            .cooling_total(known_since, currency, now)
            .zip(known_since)
            .map(|(max_minor, known_since)| CoolingCap { known_since, max_minor });
        let paid_cooling = match cooling {
            Some(c) => self.store.payee_cooling_paid(&owner, payee, c.known_since, currency).await?,
            None => 0,
        };
        let state = PayeeState { known_since, paid_today_minor: paid, paid_cooling_minor: paid_cooling };
        let max_minor = rules.daily_cap_minor.get(&currency).copied();
        let cap = (max_minor.is_some() || cooling.is_some()).then(|| PayeeCap {
            owner,
            payee: payee.to_string(),
            since: day,
            max_minor,
            cooling,
        });
        Ok(PayeeVerdict { decision: payee::decide(rules, payee, state, amount, now), cap, state: Some(state) })
    }

    /// Tool governance: every call of `tool` needs a human, unless a mandate already carries one.
    pub(super) fn always_needs_a_human(&self, caller: &Caller, tool: &str, mandate: Option<&Authorized>) -> bool {
        mandate.is_none() && caller.principal.policy.always_needs_a_human(tool)
    }

    /// The intent of an admitted call: its key(s) (anchored on a closed mandate when it has one)
    /// and what a human would be shown.
    pub(super) fn intent_for(
        &self,
        caller: &Caller,
        asked: Asked<'_>,
        mandate: Option<&Authorized>,
        amount: Money,
    ) -> Intent {
        let keys = self.idem_for(caller, asked.tool, asked.op, mandate.map(|m| &m.claims), &asked.args);
        Intent { tool: asked.tool, keys, amount, shown: asked.intent }
    }

    /// Arguments parsed, or the refusal audited (and counted toward the stop rule): the first
    /// step of every operation.
    pub(super) async fn or_refuse<T>(
        &self,
        caller: &Caller,
        tool: &str,
        parsed: Result<T, AgentError>,
    ) -> Result<T, AgentError> {
        match parsed {
            Ok(v) => Ok(v),
            Err(e) => Err(self.refuse(caller, tool, None, e).await),
        }
    }

    /// From an admitted proposal to its answer, the same for every money operation: the mandate
    /// verified against exactly this call (or, when it no longer verifies, the operation's recorded
    /// outcome replayed), the intent and its key(s), policy's decision (`decide` is told whether
    /// tool governance forces a human; a valid mandate turns "ask a human" into "allow", never a
    /// denial), what the payment draws on where it commits ([`Terms`]), then the unit of work with
    /// the one call `move_money` builds from those terms.
    pub(super) async fn operate<'a>(
        &'a self,
        caller: &'a Caller,
        proposal: Proposal<'_>,
        question: policy::Question,
        strategy: Strategy,
        move_money: impl FnOnce(Terms) -> Movement<'a>,
    ) -> Result<Executed, AgentError> {
        let Proposal { tool, op, args, shown, mandate: jws, parties, amount, kind } = proposal;
        if caller.principal.policy.is_disabled(tool) {
            // A preflight names the tool it asks about: governance applies to it as to the call.
            let e = AgentError::invalid(format!(
                "{tool} is disabled by policy (version {})",
                caller.principal.policy.version
            ));
            return Err(self.refuse(caller, tool, None, e).await);
        }
        let Parties { payer, payee, payment_id } = parties;
        let mut intent = json!({
            "tool": tool, "operation_id": op, "payer": payer, "payee": payee,
            "amount": amount.to_decimal(), "currency": amount.currency(),
        });
        if let Some(pid) = payment_id {
            intent["payment_id"] = json!(pid);
        }
        if let (Some(all), Value::Object(extra)) = (intent.as_object_mut(), shown) {
            all.extend(extra);
        }
        let asked = Asked { tool, op, args, intent };
        let check = self.mandate_for(caller, &asked, jws, payer, payee, amount, payment_id).await?;
        let mandate = match check.verified() {
            Ok(m) => m,
            Err(replayed) => return Ok(*replayed),
        };
        let p = &caller.principal;
        let force = self.always_needs_a_human(caller, tool, mandate.as_ref());
        let question = policy::Question { mandated: mandate.is_some(), client_id: p.client_id.clone(), ..question };
        let mut decision = policy::judge(|s| p.has_scope(s), &p.profile, &question, force);
        // From here on, what is audited of this call carries the question policy answered and the
        // version it answered under (`policy simulate` replays them).
        let governed = Caller { intent: Some(question.canonical().into()), ..caller.clone() };
        let caller = &governed;
        let mut payee_cap = None;
        if PAYS_PAYEE.contains(&tool) && !matches!(decision, Policy::Deny(_)) {
            // A paybill's payee is the pair (paybill, account reference), as the intent shows it.
            let payee = &payee_key(tool, &asked.intent).unwrap_or_else(|| payee.to_string());
            match self.payee_verdict(&caller.principal, payee, amount).await {
                Ok(verdict) => {
                    if let (Some(pf), Some(state)) = (&caller.preflight, verdict.state) {
                        pf.saw_payee(payee, state);
                    }
                    decision = payee::stricter(decision, verdict.decision);
                    payee_cap = verdict.cap;
                }
                Err(error) => {
                    // Fail closed: a payee rule that cannot be read moves nothing.
                    tracing::error!(correlation_id = %caller.correlation_id, %error, "payee read failed");
                    return Err(self.refuse(caller, tool, None, AgentError::internal()).await);
                }
            }
        }
        let decision = authorize(decision, mandate.is_some());
        let guards = self.guards_for(mandate.as_ref(), &caller.principal.profile, kind, amount.currency());
        let (decision, mut guards) = broken_allow_all(decision, guards);
        if mandate.is_none() {
            // The payee's daily cap and cooling-off total are re-checked where the payment
            // commits, with the budget.
            guards.payee = payee_cap;
        }
        let mandated = mandate.is_some();
        let taught = mandate.as_ref().filter(|_| PAYS_PAYEE.contains(&tool)).map(|m| m.claims.jti.clone());
        let intent = self.intent_for(caller, asked, mandate.as_ref(), amount);
        let movement = move_money(Terms { guards: guards.clone(), mandated });
        let done = self.work.run(self, caller, Work { strategy, intent, decision, guards, movement }).await;
        if let (Ok(executed), Some(mandate_id)) = (&done, taught)
            && !executed.replayed
            && caller.preflight.is_none()
            && executed.payment.status == PaymentStatus::Succeeded
        {
            // A human approved this payment and it settled: its payee is known from now. (A payout
            // still pending learns it when the rail's word settles it: `rail_events`.)
            self.learn_payee(&mandate_id, &caller.correlation_id).await;
        }
        done
    }
}

/// What an admitted operation proposes. The intent a human sees is built from it: the tool, the
/// operation, who pays whom, how much, the payment given back (if any), and `shown`.
pub(super) struct Proposal<'a> {
    pub tool: &'static str,
    pub op: &'a OperationId,
    /// The arguments that identify the call (its fingerprint). Their field names are part of
    /// stored fingerprints: kept as they were.
    pub args: Value,
    /// What else the intent shows (a memo, a reason, the texts the customer sees): a JSON object.
    pub shown: Value,
    /// The mandate the call carries, as the agent passed it.
    pub mandate: Option<&'a str>,
    pub parties: Parties<'a>,
    pub amount: Money,
    pub kind: PaymentKind,
}

/// What the money movement is told of the governed call.
pub(super) struct Terms {
    /// What the payment draws on where it commits (a mandate's use, or today's budget).
    pub guards: Guards,
    /// It carries a verified mandate.
    pub mandated: bool,
}

impl Terms {
    /// The order a rail operation sends under attempt `a`: its key and payment id, the agent
    /// (and the user it acts for), and these terms' guards.
    pub(super) fn rail_order(&self, a: Attempt, p: &AgentPrincipal) -> RailOrder {
        RailOrder {
            idempotency_key: a.key,
            family_key: a.family_key,
            // The attempt's id: the "submitted" record it carries names it.
            payment_id: a.payment_id,
            principal_sub: p.subject.clone(),
            principal_user: p.user.clone(),
            guards: self.guards.clone(),
            audit: a.audit,
        }
    }
}

/// The payee rules' answer for one payment (`Gateway::payee_verdict`).
pub(super) struct PayeeVerdict {
    pub decision: Policy,
    pub cap: Option<PayeeCap>,
    /// What was read: `None` when no rule applies.
    pub state: Option<PayeeState>,
}

/// The payee key of a call whose intent names a paybill's account reference
/// (`domain::payee::key`); `None`: the payee account alone is the key.
pub(super) fn payee_key(tool: &str, intent: &Value) -> Option<String> {
    if !PAYS_PAYEE.contains(&tool) {
        return None;
    }
    let account = intent.get("payee")?.as_str()?;
    let reference = intent.get("account_reference")?.as_str()?;
    Some(payee::key(account, Some(reference)))
}

/// Who pays whom in a call (as a mandate names them), and the payment it gives back, if any.
pub(super) struct Parties<'a> {
    pub payer: &'a str,
    pub payee: &'a str,
    pub payment_id: Option<&'a str>,
}
