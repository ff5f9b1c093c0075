//! Double-entry bookkeeping on the reference ledger: what each posting says, and where opening
//! balances come from (a per-currency equity account, so postings still sum to zero).

use crate::domain::payment::Payment;
use crate::ids::AccountId;
use crate::money::Currency;

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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::payment::{PaymentKind, PaymentStatus};
    use crate::ids::PaymentId;

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
    }
}
