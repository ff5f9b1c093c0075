//! A refund on the reference ledger: replay or refuse a reused key, then the original's status,
//! the cumulative cap (never more than was paid) and the payee's funds (money flows back from the
//! payee, who may have spent it).

use super::PostingPlan;
use crate::clock::UnixSecs;
use crate::domain::error::BackendError;
use crate::domain::money::format_minor;
use crate::domain::payment::{AccountRow, Payment, PaymentKind, PaymentStatus, RefundRequest};

/// Whether an existing payment under an idempotency key is the refund now asked for.
pub fn same_refund(existing: &Payment, req: &RefundRequest) -> bool {
    existing.kind == PaymentKind::Refund
        && existing.refund_of.as_ref() == Some(&req.payment_id)
        && req.amount_minor.is_none_or(|a| a == existing.amount_minor)
}

/// Decide a refund from what the transaction loaded: the payment already under the key (if any),
/// the original payment, and the original payee's account (`None`: missing).
pub fn plan(
    req: &RefundRequest,
    existing: Option<Payment>,
    original: Option<&Payment>,
    payee: Option<&AccountRow>,
    now: UnixSecs,
) -> Result<PostingPlan, BackendError> {
    if let Some(existing) = existing {
        return if same_refund(&existing, req) {
            Ok(PostingPlan::Replay(existing))
        } else {
            Err(BackendError::IdempotencyKeyReused)
        };
    }
    let original = original.ok_or_else(|| BackendError::PaymentNotFound(req.payment_id.clone()))?;
    // Only a succeeded payment has anything refundable (`Payment::refundable_minor` is 0 for a
    // refund, a pending or a failed payment, and once fully refunded): one rule, in one place.
    let remaining = original.refundable_minor();
    if remaining == 0 {
        return Err(BackendError::NotRefundable(original.id.clone()));
    }
    let amount = req.amount_minor.unwrap_or(remaining);
    if amount > remaining {
        return Err(BackendError::RefundExceedsRemaining {
            requested: format_minor(amount, original.currency),
            remaining: format_minor(remaining, original.currency),
        });
    }
    if let Some(cap) = req.autonomous_cap_minor
        && original.refunded_minor + amount > cap
    {
        return Err(BackendError::BudgetExceeded(format!(
            "refunds of one payment without a human total at most {} {}",
            format_minor(cap, original.currency),
            original.currency
        )));
    }
    let payee = payee.ok_or_else(|| BackendError::AccountNotFound(original.to_account.clone()))?;
    if !payee.allow_overdraft && payee.balance_minor < amount {
        return Err(BackendError::InsufficientFunds {
            account: original.to_account.clone(),
            balance: format_minor(payee.balance_minor, original.currency),
            needed: format_minor(amount, original.currency),
        });
    }
    Ok(PostingPlan::Post(Payment {
        id: req.refund_id.clone(),
        kind: PaymentKind::Refund,
        status: PaymentStatus::Succeeded,
        from_account: original.to_account.clone(),
        to_account: original.from_account.clone(),
        amount_minor: amount,
        currency: original.currency,
        refunded_minor: 0,
        refund_of: Some(original.id.clone()),
        memo: req.reason.clone(),
        principal_sub: req.principal_sub.clone(),
        principal_user: req.principal_user.clone(),
        created_at: now,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::{AccountId, PaymentId};
    use crate::domain::money::Currency;
    use crate::domain::payment::Attempt;
    use crate::domain::payment::Guards;

    fn kes() -> Currency {
        Currency::parse("KES").unwrap()
    }

    fn original(amount_minor: i64, refunded_minor: i64) -> Payment {
        Payment {
            id: PaymentId::generate(),
            kind: PaymentKind::Payment,
            status: PaymentStatus::Succeeded,
            from_account: AccountId::parse("payer").unwrap(),
            to_account: AccountId::parse("payee").unwrap(),
            amount_minor,
            currency: kes(),
            refunded_minor,
            refund_of: None,
            memo: None,
            principal_sub: "agent".into(),
            principal_user: None,
            created_at: 1,
        }
    }

    fn req(of: &Payment, amount_minor: Option<i64>) -> RefundRequest {
        RefundRequest {
            attempt: Attempt::reserved("idk"),
            refund_id: PaymentId::generate(),
            payment_id: of.id.clone(),
            amount_minor,
            reason: Some("damaged".into()),
            principal_sub: "agent".into(),
            principal_user: None,
            guards: Guards::default(),
            autonomous_cap_minor: None,
        }
    }

    fn payee(balance_minor: i64) -> AccountRow {
        AccountRow { currency: kes(), balance_minor, allow_overdraft: false }
    }

    #[test]
    fn refusals() {
        let paid = original(10_000, 4_000);
        let not_refundable = |p: &Payment| BackendError::NotRefundable(p.id.clone());
        let exceeds = |requested: &str, remaining: &str| BackendError::RefundExceedsRemaining {
            requested: requested.into(),
            remaining: remaining.into(),
        };
        let short = |balance: &str, needed: &str| BackendError::InsufficientFunds {
            account: AccountId::parse("payee").unwrap(),
            balance: balance.into(),
            needed: needed.into(),
        };
        let fully_refunded = original(10_000, 10_000);
        let failed = Payment { status: PaymentStatus::Failed, ..paid.clone() };
        let pending = Payment { status: PaymentStatus::Pending, ..paid.clone() };
        let a_refund = Payment { kind: PaymentKind::Refund, ..paid.clone() };
        let cases: Vec<(&Payment, Option<i64>, AccountRow, BackendError)> = vec![
            (&fully_refunded, None, payee(99_999), not_refundable(&fully_refunded)),
            (&failed, None, payee(99_999), not_refundable(&failed)),
            (&pending, None, payee(99_999), not_refundable(&pending)),
            (&a_refund, None, payee(99_999), not_refundable(&a_refund)),
            (&paid, Some(6_001), payee(99_999), exceeds("60.01", "60.00")),
            (&paid, Some(6_000), payee(5_999), short("59.99", "60.00")),
            (&paid, None, payee(100), short("1.00", "60.00")),
        ];
        for (orig, amount, acct, refusal) in cases {
            assert_eq!(plan(&req(orig, amount), None, Some(orig), Some(&acct), 5), Err(refusal));
        }
        let missing = req(&paid, None);
        assert_eq!(plan(&missing, None, None, None, 5), Err(BackendError::PaymentNotFound(paid.id.clone())));
        assert_eq!(
            plan(&missing, None, Some(&paid), None, 5),
            Err(BackendError::AccountNotFound(AccountId::parse("payee").unwrap()))
        );
        // Without a human, the refunds of one payment together stay within the cap (40.00 refunded
        // already): concurrent partial refunds serialise on the payment row and cannot pass it together.
        let capped = |amount| RefundRequest { autonomous_cap_minor: Some(5_000), ..req(&paid, Some(amount)) };
        assert!(plan(&capped(1_000), None, Some(&paid), Some(&payee(99_999)), 5).is_ok());
        assert_eq!(
            plan(&capped(1_001), None, Some(&paid), Some(&payee(99_999)), 5),
            Err(BackendError::BudgetExceeded("refunds of one payment without a human total at most 50.00 KES".into()))
        );
        // What an agent reads.
        assert_eq!(exceeds("60.01", "60.00").to_string(), "refund of 60.01 exceeds the 60.00 still refundable");
        assert_eq!(
            not_refundable(&failed).to_string(),
            format!("payment {} cannot be refunded (only succeeded payments can)", failed.id)
        );
    }

    #[test]
    fn refunds_what_remains_in_reverse() {
        let paid = original(10_000, 4_000);
        let r = req(&paid, None);
        let Ok(PostingPlan::Post(refund)) = plan(&r, None, Some(&paid), Some(&payee(6_000)), 5) else { panic!() };
        assert_eq!((refund.kind, refund.amount_minor, refund.created_at), (PaymentKind::Refund, 6_000, 5));
        assert_eq!((refund.from_account.as_str(), refund.to_account.as_str()), ("payee", "payer"));
        assert_eq!((refund.refund_of.as_ref(), refund.memo.as_deref()), (Some(&paid.id), Some("damaged")));
        assert_eq!(refund.id, r.refund_id);
        let overdraft = AccountRow { allow_overdraft: true, ..payee(-1) };
        assert!(matches!(plan(&req(&paid, Some(1)), None, Some(&paid), Some(&overdraft), 5), Ok(PostingPlan::Post(_))));
    }

    #[test]
    fn a_key_refunds_once() {
        let paid = original(10_000, 0);
        let Ok(PostingPlan::Post(done)) = plan(&req(&paid, Some(3_000)), None, Some(&paid), Some(&payee(10_000)), 5)
        else {
            panic!()
        };
        // The same refund (or "the rest" with no amount) replays, even though nothing is refundable now.
        for amount in [Some(3_000), None] {
            assert_eq!(
                plan(&req(&paid, amount), Some(done.clone()), None, None, 6),
                Ok(PostingPlan::Replay(done.clone()))
            );
        }
        let other = original(10_000, 0);
        for r in [req(&paid, Some(2_999)), req(&other, Some(3_000))] {
            assert_eq!(plan(&r, Some(done.clone()), Some(&paid), None, 6), Err(BackendError::IdempotencyKeyReused));
        }
        let not_a_refund = Payment { kind: PaymentKind::Payment, ..done };
        assert_eq!(plan(&req(&paid, None), Some(not_a_refund), None, None, 6), Err(BackendError::IdempotencyKeyReused));
    }
}
