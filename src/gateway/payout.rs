//! `send_*_payout`, `pay_paybill`, `pay_till`: pay a customer or a business through a rail (M-Pesa
//! B2C and B2B, Airtel disbursement), exactly once per operation_id: nobody is ever paid twice for
//! one operation.

use serde_json::json;

use super::admission::{Parties, Proposal, Terms};
use super::unit_of_work::{Executed, Strategy, movement};
use super::{Caller, Gateway};
use crate::backend::rail::{BusinessKind, PayeeArg, PayoutArgs, PayoutRefusal, PayoutRequest};
use crate::domain::ids::OperationId;
use crate::domain::payment::{Attempt, PaymentKind};
use crate::domain::policy;
use crate::domain::rail::RailFlow;
use crate::error::AgentError;

/// `send_*_payout`'s arguments as the agent wrote them, unparsed: the operation parses each
/// and refuses (audited) what does not parse.
/// Wire form, schema and field docs: `mcp::args::SendMpesaPayoutArgs`.
#[derive(Debug, Clone)]
pub struct SendPayout {
    pub operation_id: String,
    pub phone_number: String,
    pub amount: String,
    pub remarks: String,
    pub mandate: Option<String>,
}

/// `pay_paybill`'s and `pay_till`'s arguments as the agent wrote them, unparsed.
/// Wire forms: `mcp::args::PayPaybillArgs`, `mcp::args::PayTillArgs`.
#[derive(Debug, Clone)]
pub struct PayBusiness {
    pub operation_id: String,
    pub kind: BusinessKind,
    /// The paybill or till number.
    pub number: String,
    /// A paybill's account reference (`None` for a till).
    pub account_reference: Option<String>,
    pub amount: String,
    pub remarks: String,
    pub mandate: Option<String>,
}

/// A rail's refusal of a payout argument, named as the agent wrote it (`payee`: the argument that
/// names whom it pays).
fn payout_refusal(refusal: PayoutRefusal, payee: &str) -> AgentError {
    AgentError::invalid(match refusal {
        PayoutRefusal::Payee(why) => format!("{payee}: {why}"),
        PayoutRefusal::AccountReference(why) => format!("account_reference {why}"),
        PayoutRefusal::Amount(why) => why,
        PayoutRefusal::Remarks(why) => format!("remarks {why}"),
    })
}

/// One payout, whoever it pays: the tool, the argument naming the payee, the parsed-later args.
struct Payout<'a> {
    tool: &'static str,
    payee_field: &'static str,
    operation_id: &'a str,
    args: PayoutArgs<'a>,
    mandate: Option<&'a str>,
}

impl Gateway {
    /// A payout to a customer through the rail `rail_name`, for the tool `tool`.
    pub async fn send_payout(
        &self,
        caller: &Caller,
        tool: &'static str,
        rail_name: &str,
        args: SendPayout,
    ) -> Result<Executed, AgentError> {
        let payout = Payout {
            tool,
            payee_field: "phone_number",
            operation_id: &args.operation_id,
            args: PayoutArgs {
                payee: PayeeArg::Customer(&args.phone_number),
                amount: &args.amount,
                remarks: &args.remarks,
            },
            mandate: args.mandate.as_deref(),
        };
        self.pay(caller, rail_name, payout).await
    }

    /// A payment to a business (a paybill with its account reference, or a till) through the rail
    /// `rail_name`, for the tool `tool`.
    pub async fn pay_business(
        &self,
        caller: &Caller,
        tool: &'static str,
        rail_name: &str,
        args: PayBusiness,
    ) -> Result<Executed, AgentError> {
        let payee = match args.kind {
            BusinessKind::Paybill => {
                PayeeArg::Paybill { number: &args.number, account: args.account_reference.as_deref().unwrap_or("") }
            }
            BusinessKind::Till => PayeeArg::Till(&args.number),
        };
        let payout = Payout {
            tool,
            payee_field: args.kind.as_str(),
            operation_id: &args.operation_id,
            args: PayoutArgs { payee, amount: &args.amount, remarks: &args.remarks },
            mandate: args.mandate.as_deref(),
        };
        self.pay(caller, rail_name, payout).await
    }

    async fn pay(&self, caller: &Caller, rail_name: &str, asked: Payout<'_>) -> Result<Executed, AgentError> {
        let tool = asked.tool;
        let business = !matches!(asked.args.payee, PayeeArg::Customer(_));
        let rail = match self.rail(rail_name).cloned() {
            Some(rail) if rail.offers(RailFlow::Payout) && (!business || rail.pays_businesses()) => rail,
            _ => {
                let what = if business { "payments to businesses" } else { "payouts" };
                let e = AgentError::invalid(format!("{what} through {rail_name} are not enabled on this gateway"));
                return Err(self.refuse(caller, tool, None, e).await);
            }
        };
        let parsed = (|| {
            let op = OperationId::parse(asked.operation_id)?;
            let payout = rail.validate_payout(asked.args).map_err(|r| payout_refusal(r, asked.payee_field))?;
            Ok::<_, AgentError>((op, payout))
        })();
        let (op, payout) = self.or_refuse(caller, tool, parsed).await?;
        let p = &caller.principal;
        let (payer, payee, amount) = (rail.account().clone(), payout.payee_account().clone(), payout.amount());
        // What identifies the payment (its fingerprint) and what a human approving it sees: a
        // mandate pins the payee, a paybill's account reference and the remarks.
        let payee_key = payout.business().map_or("phone", BusinessKind::as_str);
        let mut args = json!({payee_key: payout.payee(), "amount_minor": amount.minor(), "remarks": payout.remarks()});
        let mut shown = json!({"remarks": payout.remarks()});
        if let Some(reference) = payout.account_reference() {
            args["account_reference"] = json!(reference);
            shown["account_reference"] = json!(reference);
        }
        let proposal = Proposal {
            tool,
            op: &op,
            args,
            shown,
            mandate: asked.mandate,
            parties: Parties { payer: payer.as_str(), payee: payee.as_str(), payment_id: None },
            amount,
            kind: PaymentKind::Payment,
        };
        let question = policy::Question::payout(tool, &payer, payee.as_str(), amount);
        let (rail, payout) = (&rail, &payout);
        self.operate(caller, proposal, question, Strategy::ReserveCallSettle, |t: Terms| {
            movement(move |a: Attempt| {
                let req = PayoutRequest { order: t.rail_order(a, p), payout: payout.clone() };
                let rail = rail.clone();
                async move { rail.pay_out(req).await }
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::testkit::{caller, gateway, mpesa, with_fake};
    use super::*;
    use crate::catalogue::scopes;
    use crate::error::ErrorCode;
    use crate::gateway::unit_of_work::Strategy;

    fn args(op: &str, amount: &str) -> SendPayout {
        SendPayout {
            operation_id: op.into(),
            phone_number: "0712345678".into(),
            amount: amount.into(),
            remarks: "refund of deposit".into(),
            mandate: None,
        }
    }

    #[tokio::test]
    async fn a_payout_is_the_rails_account_paying_the_customer_reserved_not_claimed() {
        let (gw, fake) = with_fake(mpesa(gateway().await, true));
        let c = caller(&[scopes::PAYOUT]);
        gw.send_payout(&c, "send_mpesa_payout", "mpesa", args("p-1", "90")).await.unwrap();
        let h = fake.handed();
        assert_eq!(
            (h[0].tool, h[0].strategy, h[0].decision.as_str()),
            ("send_mpesa_payout", Strategy::ReserveCallSettle, "allow")
        );
        assert_eq!(h[0].shown["payer"], "acct-mpesa");
        assert_eq!(h[0].amount_minor, 9000);
        // Over the autonomous limit: the unit of work is told a human must approve.
        let _ = gw.send_payout(&c, "send_mpesa_payout", "mpesa", args("p-2", "900")).await;
        assert_eq!(fake.handed()[1].decision, "approval");
    }

    #[tokio::test]
    async fn no_payouts_without_an_initiator_and_bad_amounts_never_reach_the_unit_of_work() {
        let (gw, fake) = with_fake(mpesa(gateway().await, false));
        let c = caller(&[scopes::PAYOUT]);
        let e = gw.send_payout(&c, "send_mpesa_payout", "mpesa", args("p-1", "90")).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument);
        let (gw, fake2) = with_fake(mpesa(gateway().await, true));
        for amount in ["0", "90.5", "-1", "abc"] {
            let e = gw.send_payout(&c, "send_mpesa_payout", "mpesa", args("p-1", amount)).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidArgument, "{amount}: {e}");
        }
        assert!(fake.handed().is_empty() && fake2.handed().is_empty());
    }

    fn business(op: &str, kind: BusinessKind, number: &str, reference: Option<&str>) -> PayBusiness {
        PayBusiness {
            operation_id: op.into(),
            kind,
            number: number.into(),
            account_reference: reference.map(str::to_string),
            amount: "90".into(),
            remarks: "power bill".into(),
            mandate: None,
        }
    }

    #[tokio::test]
    async fn a_business_payment_is_a_payout_to_the_businesss_account_and_its_reference_is_shown() {
        let (gw, fake) = with_fake(mpesa(gateway().await, true));
        let c = caller(&[scopes::PAYOUT]);
        let paybill = business("b-1", BusinessKind::Paybill, "888880", Some("ACC-42"));
        gw.pay_business(&c, "pay_paybill", "mpesa", paybill).await.unwrap();
        gw.pay_business(&c, "pay_till", "mpesa", business("b-2", BusinessKind::Till, "5123456", None)).await.unwrap();
        let h = fake.handed();
        assert_eq!((h[0].tool, h[0].strategy), ("pay_paybill", Strategy::ReserveCallSettle));
        assert_eq!(
            (h[0].shown["payee"].as_str(), h[0].shown["account_reference"].as_str()),
            (Some("mpesa-paybill-888880"), Some("ACC-42"))
        );
        assert_eq!(
            (h[1].shown["payee"].as_str(), h[1].shown.get("account_reference")),
            (Some("mpesa-till-5123456"), None)
        );
        // Refusals name the argument as the agent wrote it.
        let bad = gw
            .pay_business(&c, "pay_till", "mpesa", business("b-3", BusinessKind::Till, "12", None))
            .await
            .unwrap_err();
        assert!(bad.message.starts_with("till: "), "{bad}");
        let bad = gw
            .pay_business(&c, "pay_paybill", "mpesa", business("b-4", BusinessKind::Paybill, "888880", Some("")))
            .await
            .unwrap_err();
        assert!(bad.message.starts_with("account_reference "), "{bad}");
        // Without an initiator: not offered.
        let (gw, fake2) = with_fake(mpesa(gateway().await, false));
        let off = gw
            .pay_business(&c, "pay_till", "mpesa", business("b-5", BusinessKind::Till, "5123456", None))
            .await
            .unwrap_err();
        assert_eq!(off.code, ErrorCode::InvalidArgument);
        assert!(off.message.contains("payments to businesses"), "{off}");
        assert_eq!((fake.handed().len(), fake2.handed().len()), (2, 0));
    }
}
