//! Money-moving operations and the exactly-once machinery around them.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tracing::Instrument as _;

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;
use tokio::sync::Notify;
use tokio::time::Instant;

use super::exactly_once::{self, Fate};
use super::{Caller, Decision, Gateway, map_backend_error};
use crate::backend::rail::{
    CollectionArgs, CollectionRefusal, CollectionRequest, PayoutArgs, PayoutRefusal, PayoutRequest, ReversalRequest,
};
use crate::backend::{
    BackendError, DailyBudget, Guards, MandateDraw, Payment, PaymentKind, RefundRequest, TransferRequest,
};
use crate::domain::approval::{ApprovalStatus, Approver};
use crate::domain::payment::Claim;
use crate::domain::rules::guards;
use crate::error::{AgentError, ErrorCode};
use crate::idempotency::{StoredOutcome, fingerprint};
use crate::ids::{AccountId, ApprovalId, OperationId, PaymentId};
use crate::mandate::{CallIntent, MandateClaims, MandateKind, authorizes};
use crate::money::{Currency, Money};
use crate::policy::{self, Decision as Policy, Profile};
use crate::store::{
    ApprovalRecord, ApprovalRequest, DENIAL_CODES, NewIdempotencyRecord, RailFlow, RailPayment, RailState, Reservation,
};

/// Longest memo or reason kept, in characters. Free text from agents is data, never instructions.
pub const MEMO_CHARS_MAX: usize = 140;
/// How often a waiting duplicate re-reads the store (covers holders in other replicas).
const WAIT_POLL: Duration = Duration::from_millis(25);

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePaymentArgs {
    /// Your id for this payment. Reuse it to retry the SAME payment (it is never paid twice);
    /// use a new one for a new payment. 1-128 of A-Z a-z 0-9 - _ . :
    pub operation_id: String,
    /// Payer account id.
    pub from_account: String,
    /// Payee account id.
    pub to_account: String,
    /// Decimal string in major units, e.g. "50.00". No floats, signs or exponents.
    pub amount: String,
    /// ISO 4217 code, e.g. "KES".
    pub currency: String,
    /// Optional note (at most 140 characters).
    #[serde(default)]
    pub memo: Option<String>,
    /// A signed mandate from an approval, for payments over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefundPaymentArgs {
    /// Your id for this refund; reuse it to retry the same refund.
    pub operation_id: String,
    /// The payment to refund (pay_…).
    pub payment_id: String,
    /// Decimal string; omit to refund everything still refundable.
    #[serde(default)]
    pub amount: Option<String>,
    /// Optional reason (at most 140 characters).
    #[serde(default)]
    pub reason: Option<String>,
    /// A signed mandate from an approval, for refunds over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestMpesaPaymentArgs {
    /// Your id for this collection. Reuse it to retry the SAME request: the customer is never
    /// prompted twice for one operation_id.
    pub operation_id: String,
    /// The customer's M-Pesa number: 07XXXXXXXX, 01XXXXXXXX or 2547XXXXXXXX.
    pub phone_number: String,
    /// Whole Kenyan shillings as a decimal string, e.g. "150" or "150.00".
    pub amount: String,
    /// Shown to the customer as the account (at most 12 characters).
    pub account_reference: String,
    /// Shown to the customer (at most 13 characters).
    pub description: String,
    /// A signed mandate from an approval, for collections over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendMpesaPayoutArgs {
    /// Your id for this payout. Reuse it to retry the SAME payout: the customer is never paid
    /// twice for one operation_id.
    pub operation_id: String,
    /// The customer's M-Pesa number: 07XXXXXXXX, 01XXXXXXXX or 2547XXXXXXXX.
    pub phone_number: String,
    /// Whole Kenyan shillings as a decimal string, e.g. "150" or "150.00".
    pub amount: String,
    /// Shown on the customer's statement (at most 100 characters).
    pub remarks: String,
    /// A signed mandate from an approval, for payouts over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

/// A rail's refusal of a payout argument, named as the agent wrote it.
fn payout_refusal(refusal: PayoutRefusal) -> AgentError {
    AgentError::invalid(match refusal {
        PayoutRefusal::Payee(why) => format!("phone_number: {why}"),
        PayoutRefusal::Amount(why) => why,
        PayoutRefusal::Remarks(why) => format!("remarks {why}"),
    })
}

/// A rail's refusal of a collection argument, named as the agent wrote it.
fn collection_refusal(refusal: CollectionRefusal) -> AgentError {
    AgentError::invalid(match refusal {
        CollectionRefusal::Payer(why) => format!("phone_number: {why}"),
        CollectionRefusal::Amount(why) => why,
        CollectionRefusal::Reference(why) => format!("account_reference {why}"),
        CollectionRefusal::Description(why) => format!("description {why}"),
    })
}

/// A payment and whether this call replayed an earlier outcome.
#[derive(Debug, Clone)]
pub struct Executed {
    pub payment: Payment,
    pub replayed: bool,
}

fn parse_text(field: &str, value: Option<String>) -> Result<Option<String>, AgentError> {
    match value {
        Some(v) if v.chars().count() > MEMO_CHARS_MAX => {
            Err(AgentError::invalid(format!("{field} must be at most {MEMO_CHARS_MAX} characters")))
        }
        Some(v) if v.chars().any(|c| c.is_control()) => {
            Err(AgentError::invalid(format!("{field} must not contain control characters")))
        }
        other => Ok(other),
    }
}

/// What the stop rule counts: policy denials, and RATE_LIMITED answers (at their weight; an
/// approval flood past `approvals.pending_per_agent_max` answers RATE_LIMITED too).
fn counts_toward_stop_rule(code: ErrorCode) -> bool {
    code == ErrorCode::RateLimited || DENIAL_CODES.contains(&code.as_str())
}

/// A valid mandate authorizes what policy would send to a human; it never overrides a denial.
fn authorize(decision: Policy, has_mandate: bool) -> Policy {
    match decision {
        Policy::RequireApproval { .. } if has_mandate => Policy::Allow,
        other => other,
    }
}

/// The idempotency key and argument fingerprint of one call.
struct Idem {
    key: String,
    fingerprint: String,
    /// What a different fingerprint under this key means: a reused operation_id, or (for a key
    /// anchored on a closed mandate) a second use of a single-use mandate.
    conflict: (ErrorCode, &'static str),
    /// For a key anchored on a closed mandate: the operation_id's own key, reserved and completed
    /// with it, so the operation cannot move money again under another mandate.
    alias: Option<Box<Idem>>,
}

/// Where a call's keys stand when the backend answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Keys {
    /// Reserved before the call; the gateway completes or releases them.
    Reserved,
    /// Reserved before the call; the backend completes them with a success in its transaction.
    ReservedRecordedInTx,
    /// Claimed by the posting transaction, which also completed or gave them back.
    Claimed,
}

/// How a reservation ended.
enum Reserved {
    Acquired,
    /// Replayed, refused or timed out; `outcome` is the stored outcome when it was a replay.
    Finished(Box<(Result<Executed, AgentError>, Option<String>)>),
}

const REUSED_OPERATION: (ErrorCode, &str) =
    (ErrorCode::IdempotencyConflict, "this operation_id was already used with different arguments; nothing moved");
const REUSED_MANDATE: (ErrorCode, &str) =
    (ErrorCode::MandateInvalid, "this mandate was already used for another operation; nothing moved");

/// What a call asks for, before its mandate is looked at: the operation, the arguments that
/// identify it (its fingerprint), and the intent a human sees when it needs approval (which a closed
/// mandate pins whole: operation_id, memo or reason included).
struct Asked<'a> {
    tool: &'static str,
    op: &'a OperationId,
    args: serde_json::Value,
    intent: serde_json::Value,
}

/// What the call's mandate (if any) means.
enum MandateCheck {
    /// No mandate passed.
    Absent,
    /// Verified against this very call.
    Authorized(Authorized),
    /// It did not verify, but the operation already has its outcome: that outcome, replayed.
    Settled(Executed),
}

impl MandateCheck {
    /// The verified mandate, if one was passed; or the replayed outcome that answers the call.
    fn verified(self) -> Result<Option<Authorized>, Box<Executed>> {
        match self {
            MandateCheck::Absent => Ok(None),
            MandateCheck::Authorized(m) => Ok(Some(m)),
            MandateCheck::Settled(done) => Err(Box::new(done)),
        }
    }
}

/// A verified mandate, ready to anchor the key and draw on.
struct Authorized {
    claims: MandateClaims,
}

impl Authorized {
    fn guards(&self) -> Guards {
        Guards { budget: None, mandate: Some(MandateDraw { mandate_id: self.claims.jti.clone() }) }
    }
}

impl Gateway {
    pub async fn create_payment(&self, caller: &Caller, args: CreatePaymentArgs) -> Result<Executed, AgentError> {
        const TOOL: &str = "create_payment";
        let parsed = (|| {
            let op = OperationId::parse(&args.operation_id)?;
            let from = AccountId::parse(&args.from_account)?;
            let to = AccountId::parse(&args.to_account)?;
            let currency = Currency::parse(&args.currency)?;
            let amount = Money::parse(&args.amount, currency)?;
            let memo = parse_text("memo", args.memo.clone())?;
            if from == to {
                return Err(AgentError::invalid("from_account and to_account must differ"));
            }
            Ok::<_, AgentError>((op, from, to, amount, memo))
        })();
        let (op, from, to, amount, memo) = match parsed {
            Ok(p) => p,
            Err(e) => return Err(self.refuse(caller, TOOL, None, e).await),
        };
        let p = &caller.principal;
        let asked = Asked {
            tool: TOOL,
            op: &op,
            args: json!({
                "from": from, "to": to, "amount_minor": amount.minor(), "currency": amount.currency(), "memo": memo,
            }),
            intent: json!({
                "tool": TOOL, "operation_id": op, "payer": from, "payee": to,
                "amount": amount.to_decimal(), "currency": amount.currency(), "memo": memo,
            }),
        };
        let mandate = match self
            .mandate_for(caller, &asked, args.mandate.as_deref(), from.as_str(), to.as_str(), amount, None)
            .await?
            .verified()
        {
            Ok(m) => m,
            Err(replayed) => return Ok(*replayed),
        };
        let idem = self.idem_for(caller, TOOL, &op, mandate.as_ref(), asked.args);
        let intent = asked.intent;
        let force = self.always_needs_a_human(TOOL, mandate.as_ref());
        let decision = authorize(
            policy::decide_transfer(|s| p.has_scope(s), &p.profile, &from, &to, amount, force),
            mandate.is_some(),
        );
        let guards = self.guards_for(mandate.as_ref(), &p.profile, PaymentKind::Payment, amount.currency());
        self.execute(
            caller,
            TOOL,
            self.backend.records_in_transaction(),
            idem,
            decision,
            amount,
            intent,
            |key, alias_key, audit, claim| {
                let req = TransferRequest {
                    idempotency_key: key,
                    alias_key,
                    audit,
                    claim,
                    payment_id: PaymentId::generate(),
                    from_account: from.clone(),
                    to_account: to.clone(),
                    amount,
                    memo: memo.clone(),
                    principal_sub: p.subject.clone(),
                    principal_user: p.user.clone(),
                    guards: guards.clone(),
                };
                let backend = self.backend.clone();
                async move { backend.transfer(req).await }
            },
        )
        .await
    }

    pub async fn refund_payment(&self, caller: &Caller, args: RefundPaymentArgs) -> Result<Executed, AgentError> {
        const TOOL: &str = "refund_payment";
        let p = &caller.principal;
        let parsed = (|| {
            let op = OperationId::parse(&args.operation_id)?;
            let pid = PaymentId::parse(&args.payment_id)?;
            let reason = parse_text("reason", args.reason.clone())?;
            Ok::<_, AgentError>((op, pid, reason))
        })();
        let (op, pid, reason) = match parsed {
            Ok(v) => v,
            Err(e) => return Err(self.refuse(caller, TOOL, None, e).await),
        };
        // The original must be visible to this agent: a payment it cannot see does not exist for it.
        let original = match self.backend.payment(&pid).await {
            Ok(Some(pay)) if pay.touches_any(&p.profile.allowed_accounts) => pay,
            Ok(None) => match self.store.rail_get(&pid).await {
                Ok(Some(r))
                    if self.is_collection_record(&r) && r.payment().touches_any(&p.profile.allowed_accounts) =>
                {
                    // A rail payment is given back through its rail: a collection by a reversal.
                    return self.reverse_collection(caller, op, reason, args, r).await;
                }
                _ => {
                    let e = AgentError::new(ErrorCode::NotFound, format!("payment {pid} does not exist"));
                    return Err(self.refuse(caller, TOOL, None, e).await);
                }
            },
            Ok(_) => {
                let e = AgentError::new(ErrorCode::NotFound, format!("payment {pid} does not exist"));
                return Err(self.refuse(caller, TOOL, None, e).await);
            }
            Err(e) => return Err(self.refuse(caller, TOOL, None, map_backend_error(&e)).await),
        };
        let amount = match &args.amount {
            Some(a) => Money::parse(a, original.currency),
            None => Money::from_minor(original.refundable_minor(), original.currency),
        };
        let amount = match amount {
            Ok(a) => a,
            Err(_) if args.amount.is_none() => {
                // Nothing left: perhaps because this very operation refunded it. Its retry replays.
                let args = json!({"payment_id": pid, "amount_minor": null, "reason": reason});
                if let Some(done) = self.recorded_outcome(caller, TOOL, &op, args).await {
                    return done;
                }
                let e = AgentError::invalid(format!("payment {pid} has nothing left to refund"));
                return Err(self.refuse(caller, TOOL, None, e).await);
            }
            Err(e) => return Err(self.refuse(caller, TOOL, None, e.into()).await),
        };
        // Money flows back: from the original payee to the original payer.
        let (payer, payee) = (&original.to_account, &original.from_account);
        let asked = Asked {
            tool: TOOL,
            op: &op,
            // An omitted amount fingerprints as "everything", not as today's remaining amount.
            args: json!({
                "payment_id": pid, "amount_minor": args.amount.as_ref().map(|_| amount.minor()), "reason": reason,
            }),
            intent: json!({
                "tool": TOOL, "operation_id": op, "payment_id": pid, "payer": payer, "payee": payee,
                "amount": amount.to_decimal(), "currency": amount.currency(), "reason": reason,
            }),
        };
        let mandate = match self
            .mandate_for(
                caller,
                &asked,
                args.mandate.as_deref(),
                payer.as_str(),
                payee.as_str(),
                amount,
                Some(pid.as_str()),
            )
            .await?
            .verified()
        {
            Ok(m) => m,
            Err(replayed) => return Ok(*replayed),
        };
        let idem = self.idem_for(caller, TOOL, &op, mandate.as_ref(), asked.args);
        let intent = asked.intent;
        let force = self.always_needs_a_human(TOOL, mandate.as_ref());
        let decision = authorize(
            policy::decide_refund(|s| p.has_scope(s), &p.profile, &original, amount, force),
            mandate.is_some(),
        );
        let guards = self.guards_for(mandate.as_ref(), &p.profile, PaymentKind::Refund, amount.currency());
        // Without a mandate the posting transaction holds the refunds' total to the autonomous limit.
        let autonomous_cap_minor =
            if mandate.is_none() { p.profile.autonomous_limit_minor.get(&amount.currency()).copied() } else { None };
        let explicit_amount = match (&args.amount, &mandate) {
            (Some(_), _) | (None, Some(_)) => Some(amount.minor()),
            (None, None) => None,
        };
        self.execute(
            caller,
            TOOL,
            self.backend.records_in_transaction(),
            idem,
            decision,
            amount,
            intent,
            |key, alias_key, audit, claim| {
                let req = RefundRequest {
                    idempotency_key: key,
                    alias_key,
                    audit,
                    claim,
                    refund_id: PaymentId::generate(),
                    payment_id: pid.clone(),
                    amount_minor: explicit_amount,
                    reason: reason.clone(),
                    principal_sub: p.subject.clone(),
                    principal_user: p.user.clone(),
                    guards: guards.clone(),
                    autonomous_cap_minor,
                };
                let backend = self.backend.clone();
                async move { backend.refund(req).await }
            },
        )
        .await
    }

    /// A collection through the rail `rail_name`, for the tool `TOOL` (its name keys, audits and
    /// governs the call).
    pub async fn request_collection(
        &self,
        caller: &Caller,
        tool: &'static str,
        rail_name: &str,
        args: RequestMpesaPaymentArgs,
    ) -> Result<Executed, AgentError> {
        let Some(rail) = self.rail(rail_name).cloned() else {
            let e = AgentError::invalid(format!("collections through {rail_name} are not enabled on this gateway"));
            return Err(self.refuse(caller, tool, None, e).await);
        };
        let parsed = (|| {
            let op = OperationId::parse(&args.operation_id)?;
            // The rail's own rules: payer handle, currency and granularity, text limits.
            let collection = rail
                .validate_collection(CollectionArgs {
                    payer: &args.phone_number,
                    amount: &args.amount,
                    reference: &args.account_reference,
                    description: &args.description,
                })
                .map_err(collection_refusal)?;
            Ok::<_, AgentError>((op, collection))
        })();
        let (op, collection) = match parsed {
            Ok(p) => p,
            Err(e) => return Err(self.refuse(caller, tool, None, e).await),
        };
        let p = &caller.principal;
        let (payer, amount) = (collection.payer_account().clone(), collection.amount());
        let (reference, description) = (collection.reference(), collection.description());
        let payee = rail.account().clone();
        let asked = Asked {
            tool,
            op: &op,
            // The field names are part of stored fingerprints: kept as they were.
            args: json!({
                "phone": collection.payer(), "amount_minor": amount.minor(), "reference": reference, "description": description,
            }),
            intent: json!({
                "tool": tool, "operation_id": op, "payer": payer, "payee": payee,
                "amount": amount.to_decimal(), "currency": amount.currency(),
                "account_reference": reference, "description": description,
            }),
        };
        let mandate = match self
            .mandate_for(caller, &asked, args.mandate.as_deref(), payer.as_str(), payee.as_str(), amount, None)
            .await?
            .verified()
        {
            Ok(m) => m,
            Err(replayed) => return Ok(*replayed),
        };
        let idem = self.idem_for(caller, tool, &op, mandate.as_ref(), asked.args);
        let intent = asked.intent;
        let force = self.always_needs_a_human(tool, mandate.as_ref());
        let decision = authorize(
            policy::decide_collect(|s| p.has_scope(s), tool, &p.profile, &payee, amount, force),
            mandate.is_some(),
        );
        let guards = self.guards_for(mandate.as_ref(), &p.profile, PaymentKind::Payment, amount.currency());
        self.execute(caller, tool, false, idem, decision, amount, intent, |key, _alias_key, _audit, _claim| {
            let req = CollectionRequest {
                idempotency_key: key,
                payment_id: PaymentId::generate(),
                collection: collection.clone(),
                principal_sub: p.subject.clone(),
                principal_user: p.user.clone(),
                guards: guards.clone(),
            };
            let rail = rail.clone();
            async move { rail.collect(req).await }
        })
        .await
    }

    /// `refund_payment` of a rail record: a succeeded collection is reversed through its rail, in
    /// full, at most once (the rail keys the reversal by the collection). Refunds' policy, mandates,
    /// budgets and idempotency apply as to any refund.
    async fn reverse_collection(
        &self,
        caller: &Caller,
        op: OperationId,
        reason: Option<String>,
        args: RefundPaymentArgs,
        rec: RailPayment,
    ) -> Result<Executed, AgentError> {
        const TOOL: &str = "refund_payment";
        let p = &caller.principal;
        let pid = rec.id.clone();
        let rail = match self.rail(&rec.rail).cloned() {
            Some(rail) if rail.offers(RailFlow::Reversal) => rail,
            // (A rail turned off since keeps its records: they are still its payments.)
            _ => {
                let name = self.rail(&rec.rail).map_or("external", |r| r.display_name());
                let e = AgentError::invalid(format!(
                    "payment {pid} is an {name} payment; this gateway does not reverse {name} payments"
                ));
                return Err(self.refuse(caller, TOOL, None, e).await);
            }
        };
        if rec.flow != RailFlow::Collection || rec.state != RailState::Succeeded || rec.receipt.is_none() {
            let args = json!({"payment_id": pid, "amount_minor": null, "reason": reason});
            if let Some(done) = self.recorded_outcome(caller, TOOL, &op, args).await {
                return done;
            }
            let e = AgentError::invalid(format!(
                "payment {pid} is not a succeeded {} collection with a receipt; only those can be reversed",
                rail.display_name()
            ));
            return Err(self.refuse(caller, TOOL, None, e).await);
        }
        let original = rec.payment();
        let full = Money::from_minor(original.amount_minor, original.currency).map_err(AgentError::from)?;
        if let Some(a) = &args.amount {
            match Money::parse(a, original.currency) {
                Ok(m) if m == full => {}
                Ok(_) => {
                    let e = AgentError::invalid(format!(
                        "{} reverses a collection in full: omit amount, or give {}",
                        rail.display_name(),
                        full.to_decimal()
                    ));
                    return Err(self.refuse(caller, TOOL, None, e).await);
                }
                Err(e) => return Err(self.refuse(caller, TOOL, None, e.into()).await),
            }
        }
        let amount = full;
        // Money flows back: from the rail's account to the customer who paid.
        let (payer, payee) = (&original.to_account, &original.from_account);
        let asked = Asked {
            tool: TOOL,
            op: &op,
            args: json!({
                "payment_id": pid, "amount_minor": args.amount.as_ref().map(|_| amount.minor()), "reason": reason,
            }),
            intent: json!({
                "tool": TOOL, "operation_id": op, "payment_id": pid, "payer": payer, "payee": payee,
                "amount": amount.to_decimal(), "currency": amount.currency(), "reason": reason,
            }),
        };
        let mandate = match self
            .mandate_for(
                caller,
                &asked,
                args.mandate.as_deref(),
                payer.as_str(),
                payee.as_str(),
                amount,
                Some(pid.as_str()),
            )
            .await?
            .verified()
        {
            Ok(m) => m,
            Err(replayed) => return Ok(*replayed),
        };
        let idem = self.idem_for(caller, TOOL, &op, mandate.as_ref(), asked.args);
        let intent = asked.intent;
        let force = self.always_needs_a_human(TOOL, mandate.as_ref());
        let decision =
            authorize(policy::decide_reversal(|s| p.has_scope(s), &p.profile, &original, force), mandate.is_some());
        let guards = self.guards_for(mandate.as_ref(), &p.profile, PaymentKind::Refund, amount.currency());
        self.execute(caller, TOOL, false, idem, decision, amount, intent, |key, _alias_key, _audit, _claim| {
            let req = ReversalRequest {
                idempotency_key: key,
                payment_id: PaymentId::generate(),
                original: rec.clone(),
                reason: reason.clone(),
                principal_sub: p.subject.clone(),
                principal_user: p.user.clone(),
                guards: guards.clone(),
            };
            let rail = rail.clone();
            async move { rail.reverse(req).await }
        })
        .await
    }

    /// A payout through the rail `rail_name`, for the tool `TOOL`.
    pub async fn send_payout(
        &self,
        caller: &Caller,
        tool: &'static str,
        rail_name: &str,
        args: SendMpesaPayoutArgs,
    ) -> Result<Executed, AgentError> {
        let rail = match self.rail(rail_name).cloned() {
            Some(rail) if rail.offers(RailFlow::Payout) => rail,
            _ => {
                let e = AgentError::invalid(format!("payouts through {rail_name} are not enabled on this gateway"));
                return Err(self.refuse(caller, tool, None, e).await);
            }
        };
        let parsed = (|| {
            let op = OperationId::parse(&args.operation_id)?;
            let payout = rail
                .validate_payout(PayoutArgs { payee: &args.phone_number, amount: &args.amount, remarks: &args.remarks })
                .map_err(payout_refusal)?;
            Ok::<_, AgentError>((op, payout))
        })();
        let (op, payout) = match parsed {
            Ok(p) => p,
            Err(e) => return Err(self.refuse(caller, tool, None, e).await),
        };
        let p = &caller.principal;
        let (payer, payee, amount) = (rail.account().clone(), payout.payee_account().clone(), payout.amount());
        let asked = Asked {
            tool,
            op: &op,
            args: json!({"phone": payout.payee(), "amount_minor": amount.minor(), "remarks": payout.remarks()}),
            intent: json!({
                "tool": tool, "operation_id": op, "payer": payer, "payee": payee,
                "amount": amount.to_decimal(), "currency": amount.currency(), "remarks": payout.remarks(),
            }),
        };
        let mandate = match self
            .mandate_for(caller, &asked, args.mandate.as_deref(), payer.as_str(), payee.as_str(), amount, None)
            .await?
            .verified()
        {
            Ok(m) => m,
            Err(replayed) => return Ok(*replayed),
        };
        let idem = self.idem_for(caller, tool, &op, mandate.as_ref(), asked.args);
        let intent = asked.intent;
        let force = self.always_needs_a_human(tool, mandate.as_ref());
        let decision = authorize(
            policy::decide_payout(|s| p.has_scope(s), tool, &p.profile, &payer, amount, force),
            mandate.is_some(),
        );
        let guards = self.guards_for(mandate.as_ref(), &p.profile, PaymentKind::Payment, amount.currency());
        self.execute(caller, tool, false, idem, decision, amount, intent, |key, _alias_key, _audit, _claim| {
            let req = PayoutRequest {
                idempotency_key: key,
                payment_id: PaymentId::generate(),
                payout: payout.clone(),
                principal_sub: p.subject.clone(),
                principal_user: p.user.clone(),
                guards: guards.clone(),
            };
            let rail = rail.clone();
            async move { rail.pay_out(req).await }
        })
        .await
    }

    /// The key and fingerprint of one call. A closed mandate anchors the key on the mandate, so
    /// any retry with it replays the one payment it allows.
    fn idem_for(
        &self,
        caller: &Caller,
        tool: &str,
        op: &OperationId,
        mandate: Option<&Authorized>,
        args: serde_json::Value,
    ) -> Idem {
        let p = &caller.principal;
        // The operation's identity: the same arguments are the same operation, with or without a
        // mandate (a retry after approval is the same payment, not a new one).
        // A deliberately broken build for the evals (`--features weaken-idempotency-for-evals`):
        // every call gets a key of its own, so retries pay again. The evals must catch it.
        #[cfg(feature = "weaken-idempotency-for-evals")]
        let op = &OperationId::parse(&format!(
            "{}.{}",
            &op.as_str()[..op.as_str().len().min(80)],
            uuid::Uuid::new_v4().simple()
        ))
        .unwrap_or_else(|_| op.clone());
        let operation = Idem {
            key: self.keys.key_for(&p.issuer, &p.subject, p.user.as_deref(), tool, op.as_str()),
            fingerprint: fingerprint(&json!({ "args": args })),
            conflict: REUSED_OPERATION,
            alias: None,
        };
        match mandate {
            Some(m) if m.claims.kind == MandateKind::Closed => Idem {
                // '/' cannot appear in an operation_id, so no operation can land on a mandate's key.
                key: self.keys.key_for(
                    &p.issuer,
                    &p.subject,
                    p.user.as_deref(),
                    tool,
                    &format!("mandate/{}", m.claims.jti),
                ),
                fingerprint: fingerprint(&json!({"args": args, "operation_id": op})),
                conflict: REUSED_MANDATE,
                alias: Some(Box::new(operation)),
            },
            _ => operation,
        }
    }

    /// The mandate passed with a call, verified against exactly this call. A mandate that no longer
    /// verifies (expired, say) does not hide an operation that already went through: when the
    /// operation's key holds an outcome for these very arguments, the call replays it.
    #[allow(clippy::too_many_arguments)]
    async fn mandate_for(
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
        let verified = self
            .mandates
            .verify(jws.trim(), self.clock.now())
            .map_err(AgentError::from)
            .and_then(|claims| authorizes(&claims, &call).map(|()| claims));
        match verified {
            Ok(claims) => {
                let mut d = Decision::new(asked.tool, "mandate_accepted");
                d.approval_id = Some(&claims.approval_id);
                d.detail = Some(format!("mandate {}", claims.jti));
                self.audit(caller, d).await;
                Ok(MandateCheck::Authorized(Authorized { claims }))
            }
            Err(e) => match self.recorded_outcome(caller, asked.tool, asked.op, asked.args.clone()).await {
                Some(done) => done.map(MandateCheck::Settled),
                None => Err(self.refuse(caller, asked.tool, None, e).await),
            },
        }
    }

    /// The outcome already recorded for this operation with these very arguments, replayed; `None`
    /// when there is none. For a call that would be refused for what the operation itself changed
    /// (an expired mandate it used, a payment it refunded whole): its retry must still replay.
    async fn recorded_outcome(
        &self,
        caller: &Caller,
        tool: &str,
        op: &OperationId,
        args: serde_json::Value,
    ) -> Option<Result<Executed, AgentError>> {
        let operation = self.idem_for(caller, tool, op, None, args);
        match self.store.idem_peek(&operation.key, self.clock.now()).await {
            Ok(Some((fp, Some(outcome)))) if fp == operation.fingerprint => {
                Some(self.replay(caller, tool, &operation, &outcome).await)
            }
            _ => None,
        }
    }

    /// What a payment or refund draws on where it commits: its mandate, or else today's
    /// autonomous budget for its kind.
    fn guards_for(
        &self,
        mandate: Option<&Authorized>,
        profile: &Profile,
        kind: PaymentKind,
        currency: Currency,
    ) -> Guards {
        match mandate {
            Some(m) => m.guards(),
            None => Guards { budget: self.budget_for(profile, kind, currency), mandate: None },
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

    /// After a counted refusal: suspend the (agent, user) pair once what counts toward its stop
    /// rule reaches the threshold. `pending`: counted refusals this replica has not written yet.
    pub(super) async fn enforce_stop_rule(&self, caller: &Caller, tool: &str, pending: crate::store::Denials) {
        let now = self.clock.now();
        let who = caller.principal.principal_ref();
        let counted = match self.store.denials_since(&who, now - self.limits.stop_window_secs).await {
            Ok(n) => n,
            Err(error) => {
                tracing::error!(correlation_id = %caller.correlation_id, %error, "stop-rule count failed");
                return;
            }
        };
        let (denials, rate_limited) = (counted.denials + pending.denials, counted.rate_limited + pending.rate_limited);
        let every = self.limits.rate_limited_per_denial;
        let weighted = if every > 0 { rate_limited / every } else { 0 };
        if denials + weighted < self.limits.stop_denials_max {
            return;
        }
        let reason = if weighted > 0 {
            format!(
                "suspended by the stop rule: {denials} policy denials and {rate_limited} RATE_LIMITED answers \
                 (counted as {weighted}) within {} s",
                self.limits.stop_window_secs
            )
        } else {
            format!("suspended by the stop rule: {denials} policy denials within {} s", self.limits.stop_window_secs)
        };
        let scope = crate::store::SuspensionScope::Pair(who.user.clone());
        match self.store.suspend(&who.issuer, &who.subject, &scope, &reason, now).await {
            Ok(true) => {
                tracing::warn!(principal.sub = %who.subject, %reason, "agent suspended by stop rule");
                let mut d = Decision::new(tool, "suspended");
                d.code = Some(ErrorCode::PrincipalSuspended);
                d.detail = Some(reason);
                self.audit(caller, d).await;
            }
            Ok(false) => {}
            Err(error) => tracing::error!(correlation_id = %caller.correlation_id, %error, "suspend failed"),
        }
    }

    /// Audit a refusal and hand the error back; policy denials count toward the stop rule.
    pub(super) async fn refuse(&self, caller: &Caller, tool: &str, key: Option<&str>, e: AgentError) -> AgentError {
        let mut d = Decision::new(tool, "denied");
        d.code = Some(e.code);
        d.idempotency_key = key;
        d.detail = Some(e.message.clone());
        self.audit(caller, d).await;
        if counts_toward_stop_rule(e.code) {
            self.enforce_stop_rule(caller, tool, crate::store::Denials::default()).await;
        }
        e
    }

    /// The exactly-once core shared by every money-moving tool.
    #[allow(clippy::too_many_arguments)]
    async fn execute<F, Fut>(
        &self,
        caller: &Caller,
        tool: &'static str,
        in_tx: bool,
        idem: Idem,
        decision: Policy,
        amount: Money,
        intent: serde_json::Value,
        call_backend: F,
    ) -> Result<Executed, AgentError>
    where
        F: Fn(String, Option<String>, Option<crate::store::AuditRecord>, Option<Claim>) -> Fut,
        Fut: Future<Output = Result<Payment, BackendError>>,
    {
        let now = self.clock.now();
        // 1. An outcome already recorded under the operation's key (or the mandate's) wins over
        //    everything, policy included: a retry must never be judged as a new payment.
        for id in idem.alias.as_deref().into_iter().chain(std::iter::once(&idem)) {
            match self.store.idem_peek(&id.key, now).await {
                Ok(Some((fp, _))) if fp != id.fingerprint => return Err(self.conflict(caller, tool, id).await),
                Ok(Some((_, Some(outcome)))) => return self.replay(caller, tool, id, &outcome).await,
                Ok(_) => {}
                Err(error) => return Err(self.internal(caller, tool, id, error).await),
            }
        }
        // 2. Policy. Its span covers the decision and what it writes (a refusal, an approval).
        let policy = tracing::debug_span!(
            "policy",
            correlation_id = %caller.correlation_id,
            tool,
            decision = match &decision {
                Policy::Allow => "allow",
                Policy::Deny(_) => "deny",
                Policy::RequireApproval { .. } => "approval_required",
            },
            code = tracing::field::Empty,
        );
        match decision {
            Policy::Allow => drop(policy),
            Policy::Deny(e) => {
                policy.record("code", e.code.as_str());
                return Err(self.refuse(caller, tool, Some(&idem.key), e).instrument(policy).await);
            }
            Policy::RequireApproval { reason } => {
                let operation = idem.alias.as_deref().unwrap_or(&idem);
                let asked = self.require_approval(caller, tool, operation, amount, intent, reason);
                return Err(asked.instrument(policy).await);
            }
        }
        // 3.-4. The unit of work: the keys, the money, the outcome, exactly once.
        let unit = tracing::debug_span!("unit_of_work", correlation_id = %caller.correlation_id, tool, in_tx);
        self.unit_of_work(caller, tool, in_tx, idem, call_backend).instrument(unit).await
    }

    /// Steps 3 and 4 of [`Self::execute`], past the policy: claim or reserve the keys, call the
    /// backend (its own span), settle the outcome.
    async fn unit_of_work<F, Fut>(
        &self,
        caller: &Caller,
        tool: &'static str,
        in_tx: bool,
        idem: Idem,
        call_backend: F,
    ) -> Result<Executed, AgentError>
    where
        F: Fn(String, Option<String>, Option<crate::store::AuditRecord>, Option<Claim>) -> Fut,
        Fut: Future<Output = Result<Payment, BackendError>>,
    {
        let backend_span = || {
            tracing::debug_span!(
                "backend",
                correlation_id = %caller.correlation_id,
                tool,
                backend = self.backend.name(),
                otel.kind = "client",
            )
        };
        // 3. Backends that record in the posting transaction claim the keys there: claim, posting,
        //    completion and audit are one write. Others reserve the operation's key, then the
        //    mandate's, first; duplicates wait and replay.
        if in_tx {
            let claim = self.claim_for(caller, tool, &idem);
            let audit = self.allowed_audit(caller, tool, &idem);
            let started = std::time::Instant::now();
            let alias_key = idem.alias.as_ref().map(|a| a.key.clone());
            let result =
                call_backend(idem.key.clone(), alias_key, Some(audit), Some(claim)).instrument(backend_span()).await;
            self.metrics.ledger(started.elapsed());
            match result {
                Err(BackendError::KeyHeld { key, reservation }) => {
                    let held = idem.alias.as_deref().into_iter().chain(std::iter::once(&idem)).find(|i| i.key == key);
                    match (held, reservation) {
                        (
                            Some(id),
                            Reservation::Completed { fingerprint, .. } | Reservation::InFlight { fingerprint },
                        ) if fingerprint != id.fingerprint => {
                            return Err(self.conflict(caller, tool, id).await);
                        }
                        (Some(id), Reservation::Completed { outcome, .. }) => {
                            return self.replay(caller, tool, id, &outcome).await;
                        }
                        // Held by an attempt that reserved it the other way (a replica on an
                        // older version, or one whose lease is still live): wait for it below.
                        _ => {}
                    }
                }
                result => return self.settle_call(caller, tool, &idem, Keys::Claimed, result).await,
            }
        }
        if let Some(alias) = idem.alias.as_deref()
            && let Reserved::Finished(done) = self.reserve(caller, tool, alias).await
        {
            return done.0;
        }
        if let Reserved::Finished(done) = self.reserve(caller, tool, &idem).await {
            let (result, outcome) = *done;
            if let Some(alias) = idem.alias.as_deref() {
                // The mandate already paid for this very operation: record that under its own key too;
                // anything else leaves the operation free to try again.
                match outcome.as_deref() {
                    Some(o) => self.complete_keys(caller, &[&alias.key], o).await,
                    None => self.release_keys(caller, &[&alias.key]).await,
                }
                self.wake(&alias.key);
            }
            return result;
        }
        // 4. Move the money. The key travels to the backend, which applies it at most once.
        // Backends that record in the posting transaction complete the key(s) and append the
        // "allowed" audit record there.
        let allowed_audit = in_tx.then(|| self.allowed_audit(caller, tool, &idem));
        let started = std::time::Instant::now();
        let result = call_backend(idem.key.clone(), idem.alias.as_ref().map(|a| a.key.clone()), allowed_audit, None)
            .instrument(backend_span())
            .await;
        self.metrics.ledger(started.elapsed());
        let keys = if in_tx { Keys::ReservedRecordedInTx } else { Keys::Reserved };
        self.settle_call(caller, tool, &idem, keys, result).await
    }

    /// The "allowed" audit record a backend that records in the posting transaction appends there.
    fn allowed_audit(&self, caller: &Caller, tool: &str, idem: &Idem) -> crate::store::AuditRecord {
        let mut d = Decision::new(tool, "allowed");
        d.idempotency_key = Some(&idem.key);
        self.agent_audit_record(caller, d)
    }

    /// Tool governance: every call of `tool` needs a human, unless a mandate already carries one.
    fn always_needs_a_human(&self, tool: &str, mandate: Option<&Authorized>) -> bool {
        mandate.is_none() && self.limits.approval_required_tools.iter().any(|t| t == tool)
    }

    /// The idempotency record a reservation or claim of `idem` writes at `now`.
    fn key_record(
        &self,
        caller: &Caller,
        tool: &str,
        idem: &Idem,
        now: crate::clock::UnixSecs,
    ) -> NewIdempotencyRecord {
        NewIdempotencyRecord {
            key: idem.key.clone(),
            fingerprint: idem.fingerprint.clone(),
            tool: tool.to_string(),
            principal_iss: caller.principal.issuer.clone(),
            principal_sub: caller.principal.subject.clone(),
            lease_until: now + self.limits.idempotency_lease_secs,
            expires_at: now + self.limits.idempotency_retention_secs,
        }
    }

    /// The keys a posting transaction claims: the operation's own (when anchored on a mandate),
    /// then the payment's.
    fn claim_for(&self, caller: &Caller, tool: &str, idem: &Idem) -> Claim {
        let now = self.clock.now();
        let record = |id: &Idem| self.key_record(caller, tool, id, now);
        Claim {
            records: idem.alias.as_deref().into_iter().chain(std::iter::once(idem)).map(record).collect(),
            refusal_outcome: exactly_once::refusal_outcome,
        }
    }

    /// What the backend's answer means for the keys, the audit trail and the agent.
    async fn settle_call(
        &self,
        caller: &Caller,
        tool: &str,
        idem: &Idem,
        how: Keys,
        result: Result<Payment, BackendError>,
    ) -> Result<Executed, AgentError> {
        let in_tx = how != Keys::Reserved;
        let keys: Vec<&str> =
            idem.alias.as_deref().into_iter().chain(std::iter::once(idem)).map(|i| i.key.as_str()).collect();
        if let Err(BackendError::Unavailable(detail) | BackendError::OutcomeUnknown(detail)) = &result {
            tracing::warn!(correlation_id = %caller.correlation_id, %detail, "backend did not move money or did not say");
        }
        let settled = exactly_once::settle(result, in_tx);
        match settled.fate {
            Fate::Recorded => self.metrics.decision(tool, settled.decision, None),
            // The posting transaction completed or gave back the keys it claimed itself.
            Fate::Complete(_) | Fate::Release if how == Keys::Claimed => {}
            Fate::Complete(outcome) => {
                self.complete_keys(caller, &keys, &outcome.to_json()).await;
                if settled.result.is_ok() {
                    // The gateway's own "allowed" record (the backend did not write it).
                    let mut d = Decision::new(tool, settled.decision);
                    d.idempotency_key = Some(&idem.key);
                    d.payment_id = settled.result.as_ref().ok().map(|p| p.id.as_str());
                    self.audit(caller, d).await;
                }
            }
            Fate::Release => self.release_keys(caller, &keys).await,
            Fate::KeepInFlight => {}
        }
        let outcome = match settled.result {
            Ok(payment) => Ok(Executed { payment, replayed: false }),
            Err(e) => Err(self.refuse_as(caller, tool, idem, settled.decision, e).await),
        };
        for key in keys {
            self.wake(key);
        }
        outcome
    }

    /// Store an outcome under each key. A failed write is logged and counted, never dropped
    /// silently: the key stays in flight, its lease ends, and a retry asks the backend again with
    /// the same key (which applies it at most once).
    async fn complete_keys(&self, caller: &Caller, keys: &[&str], outcome_json: &str) {
        for key in keys {
            if let Err(error) = self.store.idem_complete(key, outcome_json).await {
                self.metrics.bookkeeping_failure("idempotency_complete");
                tracing::error!(correlation_id = %caller.correlation_id, %error, "idempotency completion failed");
            }
        }
    }

    /// Give keys back (nothing moved). A failed write leaves the key in flight until its lease ends.
    async fn release_keys(&self, caller: &Caller, keys: &[&str]) {
        for key in keys {
            if let Err(error) = self.store.idem_release(key).await {
                self.metrics.bookkeeping_failure("idempotency_release");
                tracing::error!(correlation_id = %caller.correlation_id, %error, "idempotency release failed");
            }
        }
    }

    /// Reserve one key, waiting (bounded) for a live holder and replaying its outcome.
    async fn reserve(&self, caller: &Caller, tool: &str, idem: &Idem) -> Reserved {
        let deadline = Instant::now() + self.limits.idempotency_wait;
        loop {
            let now = self.clock.now();
            let rec = self.key_record(caller, tool, idem, now);
            let notify = self.waiter(&idem.key);
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.store.idem_reserve(rec, now).await {
                Ok(Reservation::Acquired) => return Reserved::Acquired,
                Ok(Reservation::Completed { fingerprint, .. } | Reservation::InFlight { fingerprint })
                    if fingerprint != idem.fingerprint =>
                {
                    return Reserved::Finished(Box::new((Err(self.conflict(caller, tool, idem).await), None)));
                }
                Ok(Reservation::Completed { outcome, .. }) => {
                    let result = self.replay(caller, tool, idem, &outcome).await;
                    return Reserved::Finished(Box::new((result, Some(outcome))));
                }
                Ok(Reservation::InFlight { .. }) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        let e = AgentError::new(
                            ErrorCode::OperationInProgress,
                            "the same operation is still running; retry with the same operation_id",
                        )
                        .with_retry_after(1);
                        let refused = self.refuse_as(caller, tool, idem, "in_progress", e).await;
                        return Reserved::Finished(Box::new((Err(refused), None)));
                    }
                    let _ = tokio::time::timeout(left.min(WAIT_POLL), notified).await;
                }
                Err(error) => {
                    return Reserved::Finished(Box::new((Err(self.internal(caller, tool, idem, error).await), None)));
                }
            }
        }
    }

    pub(crate) fn approval_url(&self, id: &ApprovalId) -> String {
        format!("{}/approvals/{id}", self.limits.public_url)
    }

    /// The page a person opens to decide one approval (the console's, when it is on): an
    /// operator's review, or the user's own confirmation page for an approval in their tier.
    pub fn approval_page(&self, id: &ApprovalId, approver: Approver) -> String {
        match (&self.limits.approval_page_base, approver) {
            (Some(console), Approver::Operator) => format!("{console}#approvals/{id}"),
            (Some(console), Approver::User) => format!("{console}#confirm/{id}"),
            (None, Approver::Operator) => self.approval_url(id),
            (None, Approver::User) => format!("{}/operator/v1/confirmations/{id}", self.limits.public_url),
        }
    }

    pub(super) fn waiter(&self, key: &str) -> Arc<Notify> {
        let mut map = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        map.entry(key.to_string()).or_default().clone()
    }

    /// Forget a waiter entry that nobody waits on any more (one that will never be woken).
    pub(super) fn unwait(&self, key: &str) {
        let mut map = self.waiters.lock().unwrap_or_else(|p| p.into_inner());
        if map.get(key).is_some_and(|n| Arc::strong_count(n) == 1) {
            map.remove(key);
        }
    }

    pub(super) fn wake(&self, key: &str) {
        let removed = self.waiters.lock().unwrap_or_else(|p| p.into_inner()).remove(key);
        if let Some(n) = removed {
            n.notify_waiters();
        }
    }

    async fn refuse_as(&self, caller: &Caller, tool: &str, idem: &Idem, decision: &str, e: AgentError) -> AgentError {
        let mut d = Decision::new(tool, decision);
        d.code = Some(e.code);
        d.idempotency_key = Some(&idem.key);
        d.detail = Some(e.message.clone());
        self.audit(caller, d).await;
        if matches!(decision, "denied" | "conflict") && counts_toward_stop_rule(e.code) {
            self.enforce_stop_rule(caller, tool, crate::store::Denials::default()).await;
        }
        e
    }

    async fn conflict(&self, caller: &Caller, tool: &str, idem: &Idem) -> AgentError {
        let (code, message) = idem.conflict;
        let decision = if code == ErrorCode::IdempotencyConflict { "conflict" } else { "denied" };
        self.refuse_as(caller, tool, idem, decision, AgentError::new(code, message)).await
    }

    async fn internal(&self, caller: &Caller, tool: &str, idem: &Idem, error: crate::store::StoreError) -> AgentError {
        tracing::error!(correlation_id = %caller.correlation_id, %error, "store failure");
        self.refuse_as(caller, tool, idem, "error", AgentError::internal()).await
    }

    async fn replay(&self, caller: &Caller, tool: &str, idem: &Idem, outcome: &str) -> Result<Executed, AgentError> {
        self.wake(&idem.key);
        let Some(stored) = StoredOutcome::from_json(outcome) else {
            tracing::error!(correlation_id = %caller.correlation_id, "unreadable stored outcome");
            return Err(AgentError::internal());
        };
        let mut result = stored.into_result();
        if let Ok(p) = &mut result
            && p.status == crate::backend::PaymentStatus::Pending
            && let Ok(Some(rec)) = self.store.rail_get(&p.id).await
        {
            // A rail payment settles after the call that made it: replay where it stands now.
            p.status = rec.state.status();
        }
        let mut d = Decision::new(tool, "replayed");
        d.idempotency_key = Some(&idem.key);
        d.payment_id = result.as_ref().ok().map(|p| p.id.as_str());
        d.code = result.as_ref().err().map(|e| e.code);
        self.audit(caller, d).await;
        result.map(|payment| Executed { payment, replayed: true }).map_err(|e| e.with_detail("replayed", true))
    }

    async fn require_approval(
        &self,
        caller: &Caller,
        tool: &str,
        idem: &Idem,
        amount: Money,
        intent: serde_json::Value,
        reason: String,
    ) -> AgentError {
        let now = self.clock.now();
        let p = &caller.principal;
        let reviewers_required = self.reviewers_for(amount.minor(), amount.currency());
        // The user's own tier: only for an agent acting for a user (delegation: there is a person
        // to ask), below the high-risk amount (config checks it) and where one reviewer would do.
        let approver = if p.user.is_some() && p.profile.user_may_approve(amount) && reviewers_required == 1 {
            Approver::User
        } else {
            Approver::Operator
        };
        let rec = ApprovalRecord {
            approver,
            id: ApprovalId::generate(),
            status: ApprovalStatus::Pending,
            kind: MandateKind::Closed,
            reviewers_required,
            requested_by: p.subject.clone(),
            mandate_id: None,
            mandate: None,
            decided_at: None,
            decision_reason: None,
            reviews: vec![],
            idempotency_key: idem.key.clone(),
            fingerprint: idem.fingerprint.clone(),
            principal_iss: p.issuer.clone(),
            principal_sub: p.subject.clone(),
            principal_user: p.user.clone(),
            tool: tool.to_string(),
            intent,
            amount_minor: amount.minor(),
            currency: amount.currency(),
            reason: reason.clone(),
            created_at: now,
            expires_at: now + self.limits.approval_ttl_secs,
        };
        let approval =
            match self.store.approval_get_or_create(rec, now, self.limits.pending_approvals_per_agent_max).await {
                Ok(ApprovalRequest::Existing(a) | ApprovalRequest::Created(a)) => a,
                Ok(ApprovalRequest::TooManyPending) => {
                    // An approval flood: the queue a human works through is bounded per agent.
                    let e = AgentError::new(
                        ErrorCode::RateLimited,
                        format!(
                            "{} approvals of this agent are already waiting for a human; wait for them to be decided",
                            self.limits.pending_approvals_per_agent_max
                        ),
                    )
                    .with_retry_after(60);
                    return self.refuse_as(caller, tool, idem, "denied", e).await;
                }
                Err(error) => return self.internal(caller, tool, idem, error).await,
            };
        if approval.fingerprint != idem.fingerprint {
            return self.conflict(caller, tool, idem).await;
        }
        if approval.status == ApprovalStatus::Rejected {
            // A rejection sticks to its operation: asking again is refused (and counts toward the stop rule).
            let e = AgentError::new(
                ErrorCode::ApprovalRejected,
                "a human rejected this operation; it will not be approved again. Nothing moved.",
            )
            .with_detail("approval_id", approval.id.to_string());
            return self.refuse_as(caller, tool, idem, "denied", e).await;
        }
        let mut d = Decision::new(tool, "approval_required");
        d.code = Some(ErrorCode::ApprovalRequired);
        d.idempotency_key = Some(&idem.key);
        d.approval_id = Some(approval.id.as_str());
        d.detail = Some(reason.clone());
        self.audit(caller, d).await;
        let message = if approval.status == ApprovalStatus::Approved {
            "approved: fetch the mandate with get_approval and repeat this call with it as `mandate`. Nothing moved."
                .to_string()
        } else {
            format!("{reason}; a human must approve it. Nothing moved.")
        };
        AgentError::new(ErrorCode::ApprovalRequired, message)
            .with_detail("approval_id", approval.id.to_string())
            .with_detail("approver", approval.approver.as_str())
            .with_detail("approval_status", approval.status.as_str())
            .with_detail("approval_url", self.approval_url(&approval.id))
            .with_detail("reviewers_required", approval.reviewers_required)
            .with_detail("expires_at", crate::clock::rfc3339(approval.expires_at))
    }
}
