//! A transfer on the reference ledger: replay or refuse a reused key, then accounts, currency and
//! funds. Guards (budget, mandate) are drawn after this says `Post`.

use super::PostingPlan;
use crate::clock::UnixSecs;
use crate::domain::error::BackendError;
use crate::domain::money::format_minor;
use crate::domain::payment::{AccountRow, Payment, PaymentKind, PaymentStatus, TransferRequest};

/// Whether an existing payment under an idempotency key is the transfer now asked for.
pub fn same_transfer(existing: &Payment, req: &TransferRequest) -> bool {
    existing.kind == PaymentKind::Payment
        && existing.from_account == req.from_account
        && existing.to_account == req.to_account
        && existing.amount_minor == req.amount.minor()
        && existing.currency == req.amount.currency()
}

/// Decide a transfer from what the transaction loaded: the payment already under the key (if
/// any), and the payer's and payee's accounts (`None`: no such account).
pub fn plan(
    req: &TransferRequest,
    existing: Option<Payment>,
    from: Option<&AccountRow>,
    to: Option<&AccountRow>,
    now: UnixSecs,
) -> Result<PostingPlan, BackendError> {
    // The ledger's own guard: one key posts once, whatever happened above (crash, expired record).
    if let Some(existing) = existing {
        return if same_transfer(&existing, req) {
            Ok(PostingPlan::Replay(existing))
        } else {
            Err(BackendError::IdempotencyKeyReused)
        };
    }
    if req.from_account == req.to_account {
        return Err(BackendError::SameAccount);
    }
    let from = from.ok_or_else(|| BackendError::AccountNotFound(req.from_account.clone()))?;
    let to = to.ok_or_else(|| BackendError::AccountNotFound(req.to_account.clone()))?;
    let currency = req.amount.currency();
    for (id, acct) in [(&req.from_account, from), (&req.to_account, to)] {
        if acct.currency != currency {
            return Err(BackendError::CurrencyMismatch {
                account: id.clone(),
                account_currency: acct.currency,
                requested: currency,
            });
        }
    }
    let amount = req.amount.minor();
    if !from.allow_overdraft && from.balance_minor < amount {
        return Err(BackendError::InsufficientFunds {
            account: req.from_account.clone(),
            balance: format_minor(from.balance_minor, currency),
            needed: req.amount.to_decimal(),
        });
    }
    Ok(PostingPlan::Post(Payment {
        id: req.payment_id.clone(),
        kind: PaymentKind::Payment,
        status: PaymentStatus::Succeeded,
        from_account: req.from_account.clone(),
        to_account: req.to_account.clone(),
        amount_minor: amount,
        currency,
        refunded_minor: 0,
        refund_of: None,
        memo: req.memo.clone(),
        principal_sub: req.principal_sub.clone(),
        principal_user: req.principal_user.clone(),
        created_at: now,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::{AccountId, PaymentId};
    use crate::domain::money::{Currency, Money};
    use crate::domain::payment::Attempt;
    use crate::domain::payment::Guards;

    fn cur(c: &str) -> Currency {
        Currency::parse(c).unwrap()
    }

    fn req(from: &str, to: &str, minor: i64) -> TransferRequest {
        TransferRequest {
            attempt: Attempt::reserved("idk"),
            payment_id: PaymentId::generate(),
            from_account: AccountId::parse(from).unwrap(),
            to_account: AccountId::parse(to).unwrap(),
            amount: Money::from_minor(minor, cur("KES")).unwrap(),
            memo: Some("rent".into()),
            principal_sub: "agent".into(),
            principal_user: None,
            guards: Guards::default(),
        }
    }

    fn acct(currency: &str, balance_minor: i64, allow_overdraft: bool) -> AccountRow {
        AccountRow { currency: cur(currency), balance_minor, allow_overdraft }
    }

    fn posted(r: &TransferRequest) -> Payment {
        match plan(r, None, Some(&acct("KES", 1_000, false)), Some(&acct("KES", 0, false)), 7).unwrap() {
            PostingPlan::Post(p) => p,
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn refusals() {
        let kes = acct("KES", 1_000, false);
        let cases: Vec<(TransferRequest, Option<AccountRow>, Option<AccountRow>, &str)> = vec![
            (req("a", "a", 1), Some(kes.clone()), Some(kes.clone()), "payer and payee are the same account"),
            (req("a", "b", 1), None, Some(kes.clone()), "account a does not exist"),
            (req("a", "b", 1), Some(kes.clone()), None, "account b does not exist"),
            (req("a", "b", 1), Some(acct("USD", 1_000, false)), Some(kes.clone()), "account a holds USD, not KES"),
            (req("a", "b", 1), Some(kes.clone()), Some(acct("USD", 0, false)), "account b holds USD, not KES"),
            (
                req("a", "b", 1_001),
                Some(kes.clone()),
                Some(kes.clone()),
                "insufficient funds in a: balance 10.00, needed 10.01",
            ),
        ];
        for (r, from, to, message) in cases {
            let got = plan(&r, None, from.as_ref(), to.as_ref(), 0).unwrap_err();
            assert_eq!(got.to_string(), message);
        }
    }

    #[test]
    fn posts_within_funds_or_on_an_overdraft_account() {
        let r = req("a", "b", 1_000);
        let p = posted(&r);
        assert_eq!(
            (p.kind, p.status, p.amount_minor, p.created_at),
            (PaymentKind::Payment, PaymentStatus::Succeeded, 1_000, 7)
        );
        assert_eq!((p.from_account.as_str(), p.to_account.as_str(), p.memo.as_deref()), ("a", "b", Some("rent")));
        let overdraft = acct("KES", -5, true);
        let big = req("a", "b", 1_000_000);
        assert!(matches!(plan(&big, None, Some(&overdraft), Some(&overdraft), 0), Ok(PostingPlan::Post(_))));
    }

    #[test]
    fn a_key_posts_once() {
        let r = req("a", "b", 1_000);
        let existing = posted(&r);
        // The same transfer again replays, even when the funds are gone now.
        let broke = acct("KES", 0, false);
        assert_eq!(
            plan(&r, Some(existing.clone()), Some(&broke), Some(&broke), 9),
            Ok(PostingPlan::Replay(existing.clone()))
        );
        // Another transfer under the key is refused, whatever else holds.
        for other in [req("a", "b", 999), req("b", "a", 1_000), req("a", "c", 1_000)] {
            assert_eq!(plan(&other, Some(existing.clone()), None, None, 9), Err(BackendError::IdempotencyKeyReused));
        }
        let refund = Payment { kind: PaymentKind::Refund, ..existing };
        assert_eq!(plan(&r, Some(refund), None, None, 9), Err(BackendError::IdempotencyKeyReused));
    }
}
