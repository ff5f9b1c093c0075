//! Ledger integrity: postings sum to zero per currency; every balance equals its postings; no
//! non-overdraft account is negative and no payment is refunded beyond its amount; every payment
//! is one balanced debit/credit pair. The engine runs the queries (one snapshot); this judges.

use crate::domain::payment::IntegrityReport;

/// What the integrity queries found.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct IntegrityFacts {
    /// (currency, sum of its postings), by currency.
    pub currency_sums: Vec<(String, i64)>,
    /// (account id, stored balance, sum of its postings).
    pub balances: Vec<(String, i64, i64)>,
    /// Ids of non-overdraft accounts below zero and of payments refunded beyond their amount.
    pub out_of_bounds: Vec<String>,
    /// Ids of payments whose postings are not one pair summing to zero.
    pub unbalanced_payments: Vec<String>,
    pub accounts_checked: i64,
    pub postings_checked: i64,
}

pub fn report(f: IntegrityFacts) -> IntegrityReport {
    let mut problems = Vec::new();
    for (cur, sum) in &f.currency_sums {
        if *sum != 0 {
            problems.push(format!("postings in {cur} sum to {sum}, not 0"));
        }
    }
    for (id, balance, sum) in &f.balances {
        if balance != sum {
            problems.push(format!("account {id} balance {balance} differs from its postings {sum}"));
        }
    }
    for id in &f.out_of_bounds {
        problems.push(format!("{id} violates its bounds"));
    }
    for id in &f.unbalanced_payments {
        problems.push(format!("payment {id} is not one balanced debit/credit pair"));
    }
    IntegrityReport {
        ok: problems.is_empty(),
        accounts_checked: f.accounts_checked,
        postings_checked: f.postings_checked,
        currency_sums: f.currency_sums,
        problems,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judgements() {
        let clean = IntegrityFacts {
            currency_sums: vec![("KES".into(), 0), ("USD".into(), 0)],
            balances: vec![("a".into(), 5, 5), ("b".into(), -5, -5)],
            accounts_checked: 2,
            postings_checked: 4,
            ..Default::default()
        };
        let cases: Vec<(IntegrityFacts, Vec<&str>)> = vec![
            (clean.clone(), vec![]),
            (
                IntegrityFacts { currency_sums: vec![("KES".into(), 3)], ..clean.clone() },
                vec!["postings in KES sum to 3, not 0"],
            ),
            (
                IntegrityFacts { balances: vec![("acct-B".into(), 1, 0)], ..clean.clone() },
                vec!["account acct-B balance 1 differs from its postings 0"],
            ),
            (
                IntegrityFacts {
                    out_of_bounds: vec!["acct-C".into()],
                    unbalanced_payments: vec!["pay_1".into()],
                    ..clean.clone()
                },
                vec!["acct-C violates its bounds", "payment pay_1 is not one balanced debit/credit pair"],
            ),
        ];
        for (facts, problems) in cases {
            let r = report(facts.clone());
            assert_eq!(r.problems, problems);
            assert_eq!(r.ok, problems.is_empty());
            assert_eq!((r.accounts_checked, r.postings_checked, r.currency_sums), (2, 4, facts.currency_sums));
        }
    }
}
