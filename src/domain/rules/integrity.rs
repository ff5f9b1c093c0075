//! Ledger integrity: postings sum to zero per currency; every balance equals its postings; no
//! non-overdraft account is negative and no payment is refunded beyond its amount; every payment
//! is one balanced debit/credit pair. The engine runs the queries (one snapshot); this judges.
//!
//! Two ways: a full scan of every posting, or an incremental check from the last verified
//! [`Checkpoint`]: the balances every posting below its watermark adds up to, so a check reads only
//! the postings written since (and every account's balance, which is small). A clean check becomes
//! the next checkpoint. The watermark's meaning is the engine's (SQLite: a posting `seq`, one writer
//! so it is commit order; PostgreSQL: a transaction id below which every transaction has ended);
//! the rule here is the same for both. What an incremental check cannot see is a posting changed in
//! place *before* its checkpoint: the full check (`full = true`) still reads everything.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::clock::UnixSecs;
use crate::domain::payment::IntegrityReport;

/// A verified point in the ledger: every posting below `watermark` is in `balances`.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub watermark: i64,
    /// Account id → the sum of its postings below the watermark.
    pub balances: BTreeMap<String, i64>,
    /// Postings below the watermark.
    pub postings: i64,
    pub at: UnixSecs,
    /// Made by a full scan (else extended from an earlier checkpoint).
    pub full: bool,
}

/// What the incremental queries found, in one snapshot, from a checkpoint's watermark on.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct DeltaFacts {
    /// The watermark a checkpoint taken from this snapshot would have.
    pub watermark: i64,
    /// (account, currency, sum of its postings at or past the checkpoint's watermark, the part of
    /// that sum below `watermark`).
    pub deltas: Vec<(String, String, i64, i64)>,
    /// (account id, stored balance) for every account.
    pub balances: Vec<(String, i64)>,
    /// As in [`IntegrityFacts`], over accounts and the payments the new postings touch.
    pub out_of_bounds: Vec<String>,
    /// As in [`IntegrityFacts`], over the new postings.
    pub unbalanced_payments: Vec<String>,
    /// Postings at or past the checkpoint's watermark.
    pub postings_checked: i64,
    /// Postings below `watermark` and at or past the checkpoint's.
    pub postings_covered: i64,
}

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

/// A full check's report, and the checkpoint it makes when clean (`covered`: the engine's
/// watermark and the per-account sums of the postings below it, from the same snapshot).
pub fn full(f: IntegrityFacts, covered: Checkpoint) -> (IntegrityReport, Option<Checkpoint>) {
    let report = report(f);
    let next = report.ok.then_some(Checkpoint { full: true, ..covered });
    (report, next)
}

/// An incremental check from `from`: every balance must equal the checkpoint's plus what was posted
/// since, and what was posted since must sum to zero per currency and hold its bounds. When clean,
/// the next checkpoint (taken `now`).
pub fn incremental(from: &Checkpoint, f: DeltaFacts, now: UnixSecs) -> (IntegrityReport, Option<Checkpoint>) {
    let mut problems = Vec::new();
    let mut since: BTreeMap<&str, i64> = BTreeMap::new();
    let mut currency_sums: BTreeMap<String, i64> = BTreeMap::new();
    for (account, currency, sum, _) in &f.deltas {
        *since.entry(account).or_default() += sum;
        *currency_sums.entry(currency.clone()).or_default() += sum;
    }
    for (cur, sum) in &currency_sums {
        if *sum != 0 {
            problems.push(format!("postings in {cur} since the checkpoint sum to {sum}, not 0"));
        }
    }
    for (id, balance) in &f.balances {
        let expected = from.balances.get(id).copied().unwrap_or(0) + since.get(id.as_str()).copied().unwrap_or(0);
        if *balance != expected {
            problems.push(format!("account {id} balance {balance} differs from its postings {expected}"));
        }
    }
    for id in from.balances.keys() {
        if !f.balances.iter().any(|(a, _)| a == id) {
            problems.push(format!("account {id} is in the checkpoint but no longer in the ledger"));
        }
    }
    for id in &f.out_of_bounds {
        problems.push(format!("{id} violates its bounds"));
    }
    for id in &f.unbalanced_payments {
        problems.push(format!("payment {id} is not one balanced debit/credit pair"));
    }
    let ok = problems.is_empty();
    let next = ok.then(|| {
        let mut balances = from.balances.clone();
        for (account, _, _, below) in &f.deltas {
            *balances.entry(account.clone()).or_default() += below;
        }
        Checkpoint {
            watermark: f.watermark,
            balances,
            postings: from.postings + f.postings_covered,
            at: now,
            full: false,
        }
    });
    let report = IntegrityReport {
        ok,
        accounts_checked: f.balances.len() as i64,
        postings_checked: f.postings_checked,
        currency_sums: currency_sums.into_iter().collect(),
        problems,
        mode: "incremental".into(),
        since: Some(from.at),
    };
    (report, next)
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
        mode: "full".into(),
        since: None,
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

    #[test]
    fn an_incremental_check_adds_what_was_posted_since_to_the_checkpoint() {
        let from = Checkpoint {
            watermark: 10,
            balances: [("a".to_string(), 100), ("b".to_string(), -100)].into(),
            postings: 4,
            at: 5,
            full: true,
        };
        // Since: a → b 30 (both below the new watermark), and c (a new account) ← b 5, past it.
        let clean = DeltaFacts {
            watermark: 12,
            deltas: vec![
                ("a".into(), "KES".into(), -30, -30),
                ("b".into(), "KES".into(), 25, 30),
                ("c".into(), "KES".into(), 5, 0),
            ],
            balances: vec![("a".into(), 70), ("b".into(), -75), ("c".into(), 5)],
            postings_checked: 4,
            postings_covered: 2,
            ..Default::default()
        };
        let (r, next) = incremental(&from, clean.clone(), 9);
        assert!(r.ok, "{:?}", r.problems);
        assert_eq!((r.mode.as_str(), r.since, r.postings_checked, r.accounts_checked), ("incremental", Some(5), 4, 3));
        let next = next.unwrap();
        // Only what lies below the new watermark moves into the checkpoint.
        assert_eq!(next.balances, [("a".to_string(), 70), ("b".to_string(), -70), ("c".to_string(), 0)].into());
        assert_eq!((next.watermark, next.postings, next.at, next.full), (12, 6, 9, false));

        let tampered_balance =
            DeltaFacts { balances: vec![("a".into(), 71), ("b".into(), -75), ("c".into(), 5)], ..clean.clone() };
        let (r, next) = incremental(&from, tampered_balance, 9);
        assert_eq!(r.problems, vec!["account a balance 71 differs from its postings 70"]);
        assert!(next.is_none(), "a failed check makes no checkpoint");

        let mut tampered_posting = clean.clone();
        tampered_posting.deltas[0].2 = -31;
        let (r, _) = incremental(&from, tampered_posting, 9);
        assert_eq!(
            r.problems,
            vec![
                "postings in KES since the checkpoint sum to -1, not 0",
                "account a balance 70 differs from its postings 69"
            ]
        );

        let gone = DeltaFacts { balances: vec![("b".into(), -75), ("c".into(), 5)], ..clean };
        let (r, _) = incremental(&from, gone, 9);
        assert!(
            r.problems.iter().any(|p| p.contains("account a balance") || p.contains("account a is in the checkpoint"))
        );
    }

    #[test]
    fn a_clean_full_check_makes_a_full_checkpoint() {
        let covered =
            Checkpoint { watermark: 3, balances: [("a".to_string(), 1)].into(), postings: 2, at: 7, full: false };
        let clean = IntegrityFacts { currency_sums: vec![("KES".into(), 0)], ..Default::default() };
        let (r, next) = full(clean, covered.clone());
        assert!(r.ok && r.mode == "full" && r.since.is_none());
        assert_eq!(next, Some(Checkpoint { full: true, ..covered.clone() }));
        let dirty = IntegrityFacts { currency_sums: vec![("KES".into(), 1)], ..Default::default() };
        assert_eq!(full(dirty, covered).1, None);
    }
}
