//! `create_payment`: move money between two accounts of the ledger, exactly once per operation_id.
//! Admit (parse every argument) → intent → mandate → policy → unit of work → answer.

use serde_json::json;

use super::admission::{Parties, Proposal, Terms, parse_text};
use super::unit_of_work::{Executed, movement};
use super::{Caller, Gateway};
use crate::domain::ids::{AccountId, OperationId};
use crate::domain::money::{Currency, Money};
use crate::domain::payment::{Attempt, PaymentKind, TransferRequest};
use crate::domain::policy;
use crate::error::AgentError;

/// `create_payment`'s arguments as the agent wrote them, unparsed: the operation parses each
/// and refuses (audited) what does not parse.
/// Wire form, schema and field docs: `mcp::args::CreatePaymentArgs`.
#[derive(Debug, Clone)]
pub struct CreatePayment {
    pub operation_id: String,
    pub from_account: String,
    pub to_account: String,
    pub amount: String,
    pub currency: String,
    pub memo: Option<String>,
    pub mandate: Option<String>,
}

impl Gateway {
    pub async fn create_payment(&self, caller: &Caller, args: CreatePayment) -> Result<Executed, AgentError> {
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
        let (op, from, to, amount, memo) = self.or_refuse(caller, TOOL, parsed).await?;
        let p = &caller.principal;
        let proposal = Proposal {
            tool: TOOL,
            op: &op,
            args: crate::idempotency::payment_args(&from, &to, amount, &memo),
            shown: json!({"memo": memo}),
            mandate: args.mandate.as_deref(),
            parties: Parties { payer: from.as_str(), payee: to.as_str(), payment_id: None },
            amount,
            kind: PaymentKind::Payment,
        };
        let question = policy::Question::transfer(&from, &to, amount);
        let (from, to, memo) = (&from, &to, &memo);
        self.operate(caller, proposal, question, self.ledger_strategy(), |t: Terms| {
            movement(move |a: Attempt| {
                let req = TransferRequest {
                    payment_id: a.payment_id.clone(),
                    attempt: a,
                    from_account: from.clone(),
                    to_account: to.clone(),
                    amount,
                    memo: memo.clone(),
                    principal_sub: p.subject.clone(),
                    principal_user: p.user.clone(),
                    guards: t.guards.clone(),
                };
                let backend = self.backend.clone();
                async move { backend.transfer(req).await }
            })
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::super::testkit::{self, caller, gateway, with_fake};
    use super::*;
    use crate::catalogue::scopes;
    use crate::error::ErrorCode;
    use crate::gateway::unit_of_work::Strategy;

    fn args(op: &str, amount: &str, memo: Option<&str>) -> CreatePayment {
        CreatePayment {
            operation_id: op.into(),
            from_account: "acct-A".into(),
            to_account: "acct-B".into(),
            amount: amount.into(),
            currency: "KES".into(),
            memo: memo.map(String::from),
            mandate: None,
        }
    }

    #[tokio::test]
    async fn an_admitted_payment_hands_one_intent_to_the_ledgers_unit_of_work() {
        let (gw, fake) = with_fake(gateway().await);
        let done = gw.create_payment(&caller(&[scopes::CREATE]), args("op-1", "50.00", Some("rent"))).await.unwrap();
        let handed = fake.handed();
        assert_eq!(handed.len(), 1);
        let h = &handed[0];
        assert_eq!((h.tool, h.strategy, h.decision.as_str()), ("create_payment", Strategy::ClaimInPosting, "allow"));
        assert_eq!((h.amount_minor, h.currency.as_str()), (5000, "KES"));
        assert_eq!((h.shown["payer"].as_str(), h.shown["payee"].as_str()), (Some("acct-A"), Some("acct-B")));
        assert_eq!(h.shown["memo"], "rent");
        assert!(h.alias_key.is_none());
        assert_eq!((done.payment.amount_minor, done.replayed), (5000, false));
    }

    #[tokio::test]
    async fn the_same_arguments_are_the_same_operation_and_a_changed_one_is_not() {
        let (gw, fake) = with_fake(gateway().await);
        let c = caller(&[scopes::CREATE]);
        for a in [args("op-1", "50.00", None), args("op-1", "50", None), args("op-1", "50.00", Some("x"))] {
            gw.create_payment(&c, a).await.unwrap();
        }
        gw.create_payment(&c, args("op-2", "50.00", None)).await.unwrap();
        let h = fake.handed();
        assert_eq!(h[0].key, h[1].key);
        assert_eq!(h[0].fingerprint, h[1].fingerprint, "50 and 50.00 are one amount");
        assert_eq!(h[0].key, h[2].key);
        assert_ne!(h[0].fingerprint, h[2].fingerprint, "another memo is other arguments under the key");
        assert_ne!(h[0].key, h[3].key, "another operation_id is another operation");
    }

    #[tokio::test]
    async fn bad_input_is_refused_before_the_unit_of_work() {
        let (gw, fake) = with_fake(gateway().await);
        let c = caller(&[scopes::CREATE]);
        let same = CreatePayment { to_account: "acct-A".into(), ..args("op-1", "1.00", None) };
        let cases = [
            args("op 1", "1.00", None),
            args("op-1", "1.001", None),
            args("op-1", "-1.00", None),
            args("op-1", "1.00", Some("a\u{7}b")),
            args("op-1", "1.00", Some(&"m".repeat(MEMO_CHARS))),
            same,
        ];
        for a in cases {
            let e = gw.create_payment(&c, a.clone()).await.unwrap_err();
            assert_eq!(e.code, ErrorCode::InvalidArgument, "{a:?}: {e}");
        }
        assert!(fake.handed().is_empty(), "nothing reached the unit of work");
    }

    const MEMO_CHARS: usize = crate::gateway::MEMO_CHARS_MAX + 1;

    #[tokio::test]
    async fn policy_decides_before_the_unit_of_work_and_it_carries_the_decision() {
        let (gw, fake) = with_fake(gateway().await);
        // Over the autonomous limit: a human must approve.
        let _ = gw.create_payment(&caller(&[scopes::CREATE]), args("op-1", "500.00", None)).await;
        // Without the scope: denied.
        let _ = gw.create_payment(&caller(&[]), args("op-2", "5.00", None)).await;
        // An account outside the profile: denied.
        let other = CreatePayment { to_account: "acct-Z".into(), ..args("op-3", "5.00", None) };
        let _ = gw.create_payment(&caller(&[scopes::CREATE]), other).await;
        let decisions: Vec<String> = fake.handed().into_iter().map(|h| h.decision).collect();
        assert_eq!(decisions[0], "approval");
        assert!(decisions[1].starts_with("deny:"), "{decisions:?}");
        assert!(decisions[2].starts_with("deny:"), "{decisions:?}");
        let _ = testkit::NOW;
    }
}
