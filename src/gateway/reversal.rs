//! `refund_payment` of a rail collection: reversed through its rail, in full, at most once.

use super::admission::Terms;
use super::refund::{RefundPayment, refund_proposal};
use super::unit_of_work::{Executed, Strategy, movement};
use super::{Caller, Gateway};
use crate::backend::rail::ReversalRequest;
use crate::domain::ids::OperationId;
use crate::domain::money::Money;
use crate::domain::payment::Attempt;
use crate::domain::policy;
use crate::domain::rail::{RailFlow, RailPayment, RailState};
use crate::error::AgentError;

impl Gateway {
    /// `refund_payment` of a rail record: a succeeded collection is reversed through its rail, in
    /// full, at most once (the rail keys the reversal by the collection). Refunds' policy, mandates,
    /// budgets and idempotency apply as to any refund.
    pub(super) async fn reverse_collection(
        &self,
        caller: &Caller,
        op: OperationId,
        reason: Option<String>,
        args: RefundPayment,
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
            let e = AgentError::invalid(format!(
                "payment {pid} is not a succeeded {} collection with a receipt; only those can be reversed",
                rail.display_name()
            ));
            return self.replay_refund_or(caller, &op, &pid, &reason, e).await;
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
        let proposal = refund_proposal(&op, &original, amount, args.amount.is_some(), &reason, args.mandate.as_deref());
        let question = policy::Question::reversal(&original);
        let (rail, rec, reason) = (&rail, &rec, &reason);
        self.operate(caller, proposal, question, Strategy::ReserveCallSettle, |t: Terms| {
            movement(move |a: Attempt| {
                let req = ReversalRequest { order: t.rail_order(a, p), original: rec.clone(), reason: reason.clone() };
                let rail = rail.clone();
                async move { rail.reverse(req).await }
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::testkit::{NOW, caller, gateway, kes, mpesa, with_fake};
    use super::*;
    use crate::catalogue::scopes;
    use crate::domain::ids::AccountId;
    use crate::domain::ids::PaymentId;
    use crate::domain::payment::{Guards, PaymentKind};
    use crate::domain::rail::{RailMove, RailUpdate};
    use crate::error::ErrorCode;
    use crate::gateway::unit_of_work::Strategy;
    use crate::store::Store;

    /// A 50.00 KES M-Pesa collection from the customer's account into acct-mpesa, in `state`.
    async fn collection(store: &dyn Store, state: RailState) -> PaymentId {
        let id = PaymentId::generate();
        let rec = RailPayment {
            id: id.clone(),
            idempotency_key: format!("idk_{id}"),
            rail: "mpesa".into(),
            kind: PaymentKind::Payment,
            state: RailState::Submitting,
            from_account: AccountId::parse("acct-A").unwrap(),
            to_account: AccountId::parse("acct-mpesa").unwrap(),
            amount_minor: 5_000,
            currency: kes(),
            refund_of: None,
            memo: None,
            principal_sub: "agent".into(),
            principal_user: None,
            family_key: None,
            mandate_id: None,
            rail_ref: None,
            receipt: None,
            phone: Some("254712345678".into()),
            reason: None,
            created_at: NOW,
            updated_at: NOW,
            flow: RailFlow::Collection,
        };
        store.rail_open(rec, Guards::default(), None, NOW).await.unwrap();
        let update = RailUpdate {
            receipt: Some(format!("R{id}")),
            rail_ref: Some(format!("ws_{id}")),
            reason: None,
            audit: None,
        };
        store
            .rail_transition(RailMove { id: &id, from: &[RailState::Submitting], to: state, update }, NOW)
            .await
            .unwrap();
        id
    }

    fn refund(op: &str, pid: &PaymentId, amount: Option<&str>) -> RefundPayment {
        RefundPayment {
            operation_id: op.into(),
            payment_id: pid.to_string(),
            amount: amount.map(String::from),
            reason: None,
            mandate: None,
        }
    }

    #[tokio::test]
    async fn a_succeeded_collection_is_reversed_in_full_back_to_the_customer() {
        let (gw, fake) = with_fake(mpesa(gateway().await, true));
        let pid = collection(gw.store.as_ref(), RailState::Succeeded).await;
        let c = caller(&[scopes::REFUND]);
        gw.refund_payment(&c, refund("rv-1", &pid, None)).await.unwrap();
        gw.refund_payment(&c, refund("rv-2", &pid, Some("50.00"))).await.unwrap();
        let h = fake.handed();
        assert_eq!(
            (h[0].tool, h[0].strategy, h[0].decision.as_str()),
            ("refund_payment", Strategy::ReserveCallSettle, "allow")
        );
        assert_eq!((h[0].shown["payer"].as_str(), h[0].shown["payee"].as_str()), (Some("acct-mpesa"), Some("acct-A")));
        assert_eq!((h[0].amount_minor, h[1].amount_minor), (5_000, 5_000));
    }

    #[tokio::test]
    async fn a_part_a_pending_collection_or_a_rail_without_reversals_is_refused_first() {
        let (gw, fake) = with_fake(mpesa(gateway().await, true));
        let c = caller(&[scopes::REFUND]);
        let done = collection(gw.store.as_ref(), RailState::Succeeded).await;
        let e = gw.refund_payment(&c, refund("rv-1", &done, Some("20.00"))).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument, "a collection is reversed in full: {e}");
        let pending = collection(gw.store.as_ref(), RailState::Pending).await;
        let e = gw.refund_payment(&c, refund("rv-2", &pending, None)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
        let (no_initiator, fake2) = with_fake(mpesa(gateway().await, false));
        let pid = collection(no_initiator.store.as_ref(), RailState::Succeeded).await;
        let e = no_initiator.refund_payment(&c, refund("rv-3", &pid, None)).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::InvalidArgument, "{e}");
        assert!(fake.handed().is_empty() && fake2.handed().is_empty());
    }
}
