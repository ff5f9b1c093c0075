//! Double-entry bookkeeping on the reference ledger: what each posting says, and where opening
//! balances come from (a per-currency equity account, so postings still sum to zero).

use crate::domain::ids::AccountId;
use crate::domain::money::Currency;
use crate::domain::payment::Payment;

/// The description on both postings of a payment or refund.
pub fn posting_description(p: &Payment) -> String {
    match &p.refund_of {
        Some(original) => format!("refund {} of {original}", p.id),
        None => format!("payment {}", p.id),
    }
}

/// The equity account an opening balance in `currency` is drawn from (it may go negative).
pub fn opening_equity_account(currency: Currency) -> String {
    format!("equity-opening-{}", currency.code())
}

pub fn opening_description(account: &AccountId) -> String {
    format!("opening balance of {account}")
}

/// One double entry: two postings of opposite sign in one currency, with one description, that
/// the engine writes in the transaction that moves the balances.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DoubleEntry<'a> {
    pub payment_id: Option<&'a str>,
    pub currency: Currency,
    pub description: String,
    /// (account, signed amount in minor units): the debit first, then the credit.
    pub legs: [(&'a str, i64); 2],
}

impl<'a> DoubleEntry<'a> {
    /// A payment's (or refund's): the payer debited, the payee credited.
    pub fn of_payment(p: &'a Payment) -> Self {
        let amount = p.amount_minor;
        DoubleEntry {
            payment_id: Some(p.id.as_str()),
            currency: p.currency,
            description: posting_description(p),
            legs: [(p.from_account.as_str(), -amount), (p.to_account.as_str(), amount)],
        }
    }

    /// An account's opening balance: drawn from its currency's opening equity account.
    pub fn opening(account: &'a AccountId, equity: &'a str, opening_minor: i64, currency: Currency) -> Self {
        DoubleEntry {
            payment_id: None,
            currency,
            description: opening_description(account),
            legs: [(equity, -opening_minor), (account.as_str(), opening_minor)],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::PaymentId;
    use crate::domain::payment::{PaymentKind, PaymentStatus};

    #[test]
    fn descriptions() {
        let kes = Currency::parse("KES").unwrap();
        let payment = Payment {
            id: PaymentId::generate(),
            kind: PaymentKind::Payment,
            status: PaymentStatus::Succeeded,
            from_account: AccountId::parse("a").unwrap(),
            to_account: AccountId::parse("b").unwrap(),
            amount_minor: 1,
            currency: kes,
            refunded_minor: 0,
            refund_of: None,
            memo: None,
            principal_sub: "s".into(),
            principal_user: None,
            created_at: 0,
        };
        let refund = Payment { id: PaymentId::generate(), refund_of: Some(payment.id.clone()), ..payment.clone() };
        assert_eq!(posting_description(&payment), format!("payment {}", payment.id));
        assert_eq!(posting_description(&refund), format!("refund {} of {}", refund.id, payment.id));
        assert_eq!(opening_equity_account(kes), "equity-opening-KES");
        assert_eq!(opening_description(&AccountId::parse("acct-A").unwrap()), "opening balance of acct-A");

        // The payer is debited and the payee credited; every entry sums to zero.
        let e = DoubleEntry::of_payment(&payment);
        assert_eq!(
            (e.legs, e.payment_id, e.description.clone()),
            ([("a", -1), ("b", 1)], Some(payment.id.as_str()), posting_description(&payment))
        );
        let acct = AccountId::parse("acct-A").unwrap();
        let o = DoubleEntry::opening(&acct, "equity-opening-KES", 500, kes);
        assert_eq!((o.legs, o.payment_id), ([("equity-opening-KES", -500), ("acct-A", 500)], None));
        assert!([e, o].iter().all(|x| x.legs[0].1 + x.legs[1].1 == 0));
    }
}
