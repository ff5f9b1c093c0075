//! `refund_payment`: give a ledger payment's money back, in part or whole, exactly once per
//! operation_id (a rail collection is given back by its reversal, `reversal.rs`).

use serde_json::json;

use super::admission::{Parties, Proposal, Terms, parse_text};
use super::unit_of_work::{Executed, movement};
use super::{Caller, Gateway};
use crate::domain::ids::{OperationId, PaymentId};
use crate::domain::money::Money;
use crate::domain::payment::{Attempt, Payment, PaymentKind, RefundRequest};
use crate::domain::policy;
use crate::error::{AgentError, ErrorCode};

/// `refund_payment`'s arguments as the agent wrote them, unparsed: the operation parses each
/// and refuses (audited) what does not parse.
/// Wire form, schema and field docs: `mcp::args::RefundPaymentArgs`.
#[derive(Debug, Clone)]
pub struct RefundPayment {
    pub operation_id: String,
    pub payment_id: String,
    pub amount: Option<String>,
    pub reason: Option<String>,
    pub mandate: Option<String>,
}

impl Gateway {
    pub async fn refund_payment(&self, caller: &Caller, args: RefundPayment) -> Result<Executed, AgentError> {
        const TOOL: &str = "refund_payment";
        let p = &caller.principal;
        let parsed = (|| {
            let op = OperationId::parse(&args.operation_id)?;
            let pid = PaymentId::parse(&args.payment_id)?;
            let reason = parse_text("reason", args.reason.clone())?;
            Ok::<_, AgentError>((op, pid, reason))
        })();
        let (op, pid, reason) = self.or_refuse(caller, TOOL, parsed).await?;
        // The original must be visible to this principal (its accounts, and made for the person it
        // acts for): a payment it cannot see does not exist for it.
        let not_found = || AgentError::new(ErrorCode::NotFound, format!("payment {pid} does not exist"));
        let original = match self.backend.payment(&pid).await {
            Ok(Some(pay)) if p.sees(&pay) => pay,
            Ok(None) => match self.store.rail_get(&pid).await {
                Ok(Some(r)) if self.is_collection_record(&r) && p.sees(&r.payment()) => {
                    // A rail payment is given back through its rail: a collection by a reversal.
                    return self.reverse_collection(caller, op, reason, args, r).await;
                }
                _ => return Err(self.refuse(caller, TOOL, None, not_found()).await),
            },
            Ok(_) => return Err(self.refuse(caller, TOOL, None, not_found()).await),
            Err(e) => return Err(self.refuse(caller, TOOL, None, AgentError::from(&e)).await),
        };
        let amount = match &args.amount {
            Some(a) => Money::parse(a, original.currency),
            None => Money::from_minor(original.refundable_minor(), original.currency),
        };
        let amount = match amount {
            Ok(a) => a,
            Err(_) if args.amount.is_none() => {
                // Nothing left: perhaps because this very operation refunded it. Its retry replays.
                let e = AgentError::invalid(format!("payment {pid} has nothing left to refund"));
                return self.replay_refund_or(caller, &op, &pid, &reason, e).await;
            }
            Err(e) => return Err(self.refuse(caller, TOOL, None, e.into()).await),
        };
        if caller.dry() && amount.minor() > original.refundable_minor() {
            // What the ledger would answer where the refund posts (a preflight does not reach it).
            let left = crate::domain::money::format_minor(original.refundable_minor(), original.currency);
            return Err(AgentError::invalid(format!("payment {pid} has {left} left to refund")));
        }
        let proposal = refund_proposal(&op, &original, amount, args.amount.is_some(), &reason, args.mandate.as_deref());
        let question = policy::Question { exact: args.amount.is_some(), ..policy::Question::refund(&original, amount) };
        let (pid, reason, explicit) = (&pid, &reason, args.amount.is_some());
        self.operate(caller, proposal, question, self.ledger_strategy(), |t: Terms| {
            // Without a mandate the posting transaction holds the refunds' total to the autonomous limit.
            let autonomous_cap_minor =
                if t.mandated { None } else { p.profile.autonomous_limit_minor.get(&amount.currency()).copied() };
            // An omitted amount means "everything left" to the posting transaction, unless a mandate
            // pinned the amount a human saw.
            let explicit_amount = (explicit || t.mandated).then(|| amount.minor());
            movement(move |a: Attempt| {
                let req = RefundRequest {
                    refund_id: a.payment_id.clone(),
                    attempt: a,
                    payment_id: pid.clone(),
                    amount_minor: explicit_amount,
                    reason: reason.clone(),
                    principal_sub: p.subject.clone(),
                    principal_user: p.user.clone(),
                    guards: t.guards.clone(),
                    autonomous_cap_minor,
                };
                let backend = self.backend.clone();
                async move { backend.refund(req).await }
            })
        })
        .await
    }

    /// A refund that cannot be made as asked: perhaps because this very operation already made
    /// it (nothing left, or the collection already reversed). Its retry replays; any other call
    /// is refused with `refusal`.
    pub(super) async fn replay_refund_or(
        &self,
        caller: &Caller,
        op: &OperationId,
        pid: &PaymentId,
        reason: &Option<String>,
        refusal: AgentError,
    ) -> Result<Executed, AgentError> {
        const TOOL: &str = "refund_payment";
        let args = json!({"payment_id": pid, "amount_minor": null, "reason": reason});
        if let Some(done) = self.recorded_outcome(caller, TOOL, op, args).await {
            return done;
        }
        Err(self.refuse(caller, TOOL, None, refusal).await)
    }
}

/// A refund's proposal, the same for a ledger refund and a rail reversal: money flows back from
/// the original payee to the original payer. An omitted amount fingerprints as "everything", not
/// as today's remaining amount.
pub(super) fn refund_proposal<'a>(
    op: &'a OperationId,
    original: &'a Payment,
    amount: Money,
    explicit: bool,
    reason: &Option<String>,
    mandate: Option<&'a str>,
) -> Proposal<'a> {
    let pid = &original.id;
    Proposal {
        tool: "refund_payment",
        op,
        args: crate::idempotency::refund_args(pid, explicit.then(|| amount.minor()), reason),
        shown: json!({"reason": reason}),
        mandate,
        parties: Parties {
            payer: original.to_account.as_str(),
            payee: original.from_account.as_str(),
            payment_id: Some(pid.as_str()),
        },
        amount,
        kind: PaymentKind::Refund,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::testkit::{caller, gateway, with_fake};
    use super::*;
    use crate::catalogue::scopes;
    use crate::gateway::CreatePayment;
    use crate::gateway::unit_of_work::Strategy;

    /// A real 80.00 KES payment acct-A → acct-B, then the fake unit of work.
    async fn paid() -> (Gateway, super::super::testkit::Recording, String) {
        let gw = gateway().await;
        let args = CreatePayment {
            operation_id: "pay-1".into(),
            from_account: "acct-A".into(),
            to_account: "acct-B".into(),
            amount: "80.00".into(),
            currency: "KES".into(),
            memo: None,
            mandate: None,
        };
        let paid = gw.create_payment(&caller(&[scopes::CREATE]), args).await.unwrap();
        let (gw, fake) = with_fake(gw);
        (gw, fake, paid.payment.id.to_string())
    }

    fn refund(op: &str, pid: &str, amount: Option<&str>) -> RefundPayment {
        RefundPayment {
            operation_id: op.into(),
            payment_id: pid.into(),
            amount: amount.map(String::from),
            reason: Some("returned".into()),
            mandate: None,
        }
    }

    #[tokio::test]
    async fn a_refund_flows_back_from_payee_to_payer_everything_left_when_no_amount() {
        let (gw, fake, pid) = paid().await;
        let c = caller(&[scopes::REFUND]);
        gw.refund_payment(&c, refund("r-1", &pid, None)).await.unwrap();
        gw.refund_payment(&c, refund("r-2", &pid, Some("30.00"))).await.unwrap();
        let h = fake.handed();
        assert_eq!(
            (h[0].tool, h[0].strategy, h[0].decision.as_str()),
            ("refund_payment", Strategy::ClaimInPosting, "allow")
        );
        assert_eq!((h[0].shown["payer"].as_str(), h[0].shown["payee"].as_str()), (Some("acct-B"), Some("acct-A")));
        assert_eq!((h[0].amount_minor, h[1].amount_minor), (8000, 3000));
        assert_eq!(h[0].shown["payment_id"], pid.as_str());
    }

    #[tokio::test]
    async fn a_payment_that_does_not_exist_or_bad_input_never_reaches_the_unit_of_work() {
        let (gw, fake, pid) = paid().await;
        let c = caller(&[scopes::REFUND]);
        let missing = PaymentId::generate().to_string();
        let e = gw.refund_payment(&c, refund("r-1", &missing, None)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        let e = gw.refund_payment(&c, refund("r 1", &pid, None)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        let e = gw.refund_payment(&c, refund("r-1", &pid, Some("1.234"))).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        assert!(fake.handed().is_empty());
    }

    #[tokio::test]
    async fn a_payment_the_agent_cannot_see_does_not_exist_for_it() {
        let (gw, fake, pid) = paid().await;
        let mut c = caller(&[scopes::REFUND]);
        let mut profile = (*c.principal.profile).clone();
        profile.allowed_accounts.retain(|a| a.as_str() == "acct-Z");
        c.principal.profile = std::sync::Arc::new(profile);
        let e = gw.refund_payment(&c, refund("r-1", &pid, None)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::NotFound);
        assert!(fake.handed().is_empty());
    }
}
