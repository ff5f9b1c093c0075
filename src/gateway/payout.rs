//! `send_*_payout`: pay a customer through a rail (M-Pesa B2C, Airtel disbursement), exactly
//! once per operation_id: the customer is never paid twice for one operation.

use serde_json::json;

use super::admission::{Parties, Proposal, Terms};
use super::unit_of_work::{Executed, Strategy, movement};
use super::{Caller, Gateway};
use crate::backend::rail::{PayoutArgs, PayoutRefusal, PayoutRequest};
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

/// A rail's refusal of a payout argument, named as the agent wrote it.
fn payout_refusal(refusal: PayoutRefusal) -> AgentError {
    AgentError::invalid(match refusal {
        PayoutRefusal::Payee(why) => format!("phone_number: {why}"),
        PayoutRefusal::Amount(why) => why,
        PayoutRefusal::Remarks(why) => format!("remarks {why}"),
    })
}

impl Gateway {
    /// A payout through the rail `rail_name`, for the tool `TOOL`.
    pub async fn send_payout(
        &self,
        caller: &Caller,
        tool: &'static str,
        rail_name: &str,
        args: SendPayout,
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
        let (op, payout) = self.or_refuse(caller, tool, parsed).await?;
        let p = &caller.principal;
        let (payer, payee, amount) = (rail.account().clone(), payout.payee_account().clone(), payout.amount());
        let proposal = Proposal {
            tool,
            op: &op,
            args: json!({"phone": payout.payee(), "amount_minor": amount.minor(), "remarks": payout.remarks()}),
            shown: json!({"remarks": payout.remarks()}),
            mandate: args.mandate.as_deref(),
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
}
