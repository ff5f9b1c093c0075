//! `create_payment`: move money between two accounts of the ledger, exactly once per operation_id.
//! Admit (parse every argument) → intent → mandate → policy → unit of work → answer.

use schemars::JsonSchema;
use serde::Deserialize;
use serde_json::json;

use super::admission::{Asked, authorize, parse_text};
use super::unit_of_work::{Attempt, Executed, movement};
use super::{Caller, Gateway};
use crate::domain::payment::{PaymentKind, TransferRequest};
use crate::error::AgentError;
use crate::ids::{AccountId, OperationId, PaymentId};
use crate::money::{Currency, Money};
use crate::policy;

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
        let intent = self.intent_for(caller, asked, mandate.as_ref(), amount);
        let force = self.always_needs_a_human(TOOL, mandate.as_ref());
        let decision = authorize(
            policy::decide_transfer(|s| p.has_scope(s), &p.profile, &from, &to, amount, force),
            mandate.is_some(),
        );
        let guards = self.guards_for(mandate.as_ref(), &p.profile, PaymentKind::Payment, amount.currency());
        self.carry_out(
            caller,
            self.ledger_strategy(),
            intent,
            decision,
            movement(|a: Attempt| {
                let req = TransferRequest {
                    idempotency_key: a.key,
                    alias_key: a.alias_key,
                    audit: a.audit,
                    claim: a.claim,
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
            }),
        )
        .await
    }
}
