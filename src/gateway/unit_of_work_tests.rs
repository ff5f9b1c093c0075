//! Unit tests of the exactly-once unit of work: the real `ExactlyOnce` over an in-memory SQLite
//! store and the embedded ledger (`testkit::gateway`).
#![allow(clippy::unwrap_used)]
use std::sync::Arc;

use super::super::testkit::{caller, gateway, kes};
use crate::catalogue::scopes;
use crate::error::ErrorCode;
use crate::gateway::create_payment::CreatePayment;

fn pay(op: &str, amount: &str) -> CreatePayment {
    CreatePayment {
        operation_id: op.into(),
        from_account: "acct-A".into(),
        to_account: "acct-B".into(),
        amount: amount.into(),
        currency: "KES".into(),
        memo: None,
        mandate: None,
    }
}

/// An outcome recorded under the operation's key wins over policy: after the agent's limit was
/// lowered, its retry of a payment already made replays it (no approval asked, nothing paid
/// again), while a new operation for the same amount now needs a human.
#[tokio::test]
async fn a_recorded_outcome_wins_over_todays_policy() {
    let gw = gateway().await;
    let paid = gw.create_payment(&caller(&[scopes::CREATE]), pay("op-1", "50.00")).await.unwrap();
    assert!(!paid.replayed);
    let mut lowered = caller(&[scopes::CREATE]);
    let mut profile = (*lowered.principal.profile).clone();
    profile.autonomous_limit_minor.insert(kes(), 1_000);
    lowered.principal.profile = Arc::new(profile);
    let again = gw.create_payment(&lowered, pay("op-1", "50.00")).await.unwrap();
    assert_eq!((again.replayed, &again.payment.id), (true, &paid.payment.id));
    let new = gw.create_payment(&lowered, pay("op-2", "50.00")).await.unwrap_err();
    assert_eq!(new.code, ErrorCode::ApprovalRequired);
}
