//! `request_*_payment`: ask a customer to pay through a rail (M-Pesa STK push, Airtel USSD push),
//! exactly once per operation_id: the customer is never prompted twice for one operation.

use serde_json::json;

use super::admission::{Parties, Proposal, Terms};
use super::unit_of_work::{Executed, Strategy, movement};
use super::{Caller, Gateway};
use crate::backend::rail::{CollectionArgs, CollectionRefusal, CollectionRequest};
use crate::domain::ids::OperationId;
use crate::domain::payment::{Attempt, PaymentKind};
use crate::domain::policy;
use crate::error::AgentError;

/// `request_*_payment`'s arguments as the agent wrote them, unparsed: the operation parses each
/// and refuses (audited) what does not parse.
/// Wire form, schema and field docs: `mcp::args::RequestMpesaPaymentArgs`.
#[derive(Debug, Clone)]
pub struct RequestCollection {
    pub operation_id: String,
    pub phone_number: String,
    pub amount: String,
    pub account_reference: String,
    pub description: String,
    pub mandate: Option<String>,
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

impl Gateway {
    /// A collection through the rail `rail_name`, for the tool `TOOL` (its name keys, audits and
    /// governs the call).
    pub async fn request_collection(
        &self,
        caller: &Caller,
        tool: &'static str,
        rail_name: &str,
        args: RequestCollection,
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
        let (op, collection) = self.or_refuse(caller, tool, parsed).await?;
        let p = &caller.principal;
        let (payer, amount) = (collection.payer_account().clone(), collection.amount());
        let (reference, description) = (collection.reference(), collection.description());
        let payee = rail.account().clone();
        let proposal = Proposal {
            tool,
            op: &op,
            // The field names are part of stored fingerprints: kept as they were.
            args: json!({
                "phone": collection.payer(), "amount_minor": amount.minor(), "reference": reference, "description": description,
            }),
            shown: json!({"account_reference": reference, "description": description}),
            mandate: args.mandate.as_deref(),
            parties: Parties { payer: payer.as_str(), payee: payee.as_str(), payment_id: None },
            amount,
            kind: PaymentKind::Payment,
        };
        let question = policy::Question::collect(tool, &payee, payer.as_str(), amount);
        let (rail, collection) = (&rail, &collection);
        self.operate(caller, proposal, question, Strategy::ReserveCallSettle, |t: Terms| {
            movement(move |a: Attempt| {
                let req = CollectionRequest { order: t.rail_order(a, p), collection: collection.clone() };
                let rail = rail.clone();
                async move { rail.collect(req).await }
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

    fn args(op: &str, phone: &str, amount: &str) -> RequestCollection {
        RequestCollection {
            operation_id: op.into(),
            phone_number: phone.into(),
            amount: amount.into(),
            account_reference: "INV-1".into(),
            description: "invoice".into(),
            mandate: None,
        }
    }

    #[tokio::test]
    async fn a_collection_is_the_customer_paying_the_rails_account_reserved_not_claimed() {
        let (gw, fake) = with_fake(mpesa(gateway().await, false));
        let c = caller(&[scopes::COLLECT]);
        gw.request_collection(&c, "request_mpesa_payment", "mpesa", args("c-1", "0712345678", "50")).await.unwrap();
        // The same customer written the other way is the same operation.
        gw.request_collection(&c, "request_mpesa_payment", "mpesa", args("c-1", "254712345678", "50.00"))
            .await
            .unwrap();
        let h = fake.handed();
        assert_eq!((h[0].strategy, h[0].decision.as_str()), (Strategy::ReserveCallSettle, "allow"));
        assert_eq!(h[0].shown["payee"], "acct-mpesa");
        assert_eq!((h[0].amount_minor, h[0].currency.as_str()), (5_000, "KES"));
        assert_eq!((&h[0].key, &h[0].fingerprint), (&h[1].key, &h[1].fingerprint));
    }

    #[tokio::test]
    async fn the_rails_rules_and_a_missing_rail_refuse_before_the_unit_of_work() {
        let (gw, fake) = with_fake(mpesa(gateway().await, false));
        let c = caller(&[scopes::COLLECT]);
        for a in [args("c-1", "12345", "150"), args("c-1", "0712345678", "150.50"), args("c 1", "0712345678", "150")] {
            let e = gw.request_collection(&c, "request_mpesa_payment", "mpesa", a).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
        }
        let e = gw.request_collection(&c, "request_airtel_payment", "airtel", args("c-1", "0712345678", "150")).await;
        assert_eq!(e.unwrap_err().code, ErrorCode::InvalidArgument);
        assert!(fake.handed().is_empty());
    }
}
