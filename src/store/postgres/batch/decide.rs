//! A batch's decisions, in memory: each transfer in arrival order, by the rules a single posting
//! asks (`rules::reservation`, `rules::transfer::plan`, `rules::guards`), on the balances and the
//! day's usage that the transfers before it in the batch left. Nothing here touches the database:
//! the batch loads [`Loaded`] under its locks and writes the [`WriteSet`] this returns.

use std::collections::HashMap;

use crate::clock::UnixSecs;
use crate::domain::error::{BackendError, StoreError};
use crate::domain::idempotency::NewIdempotencyRecord;
use crate::domain::payment::{AccountRow, Payment, TransferRequest};
use crate::domain::rules::guards::{self, BudgetUsage};
use crate::domain::rules::ledger::DoubleEntry;
use crate::domain::rules::reservation::{self, IdempotencyRow, ReserveStep};
use crate::domain::rules::{PostingPlan, transfer};
use crate::idempotency::StoredOutcome;
use crate::store::completed_outcome;
use crate::store::rows::{self, Value};

/// One subject's usage of one day in one currency, as read and as the batch moves it.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Usage {
    pub subject: String,
    pub day: UnixSecs,
    pub currency: String,
    pub payments: i64,
    pub spent_minor: i64,
}

/// What the batch read under its locks.
#[derive(Default)]
pub(super) struct Loaded {
    /// Each claimed key: `None` if the batch inserted it (the key is ours), else the record found.
    pub claimed: HashMap<String, Option<IdempotencyRow>>,
    /// The locked accounts (`None` from `get`: no such account).
    pub accounts: HashMap<String, AccountRow>,
    /// Payments already made under the batch's keys.
    pub made: HashMap<String, Payment>,
    /// The budgeted subjects' usage rows for their budgets' days.
    pub usage: Vec<Usage>,
}

/// One new posting row: `(payment, account, amount, currency, balance after, description, at)`.
pub(super) type PostingRow = (String, String, i64, String, i64, String, UnixSecs);

/// Everything the batch writes, each list one multi-row statement.
#[derive(Default)]
pub(super) struct WriteSet<'a> {
    /// Keys whose expired record is claimed again, or whose dead holder's lease is taken over.
    pub steps: Vec<(&'a NewIdempotencyRecord, ReserveStep, UnixSecs)>,
    /// `rows::payment_values` of each new payment.
    pub payments: Vec<Vec<Value>>,
    pub postings: Vec<PostingRow>,
    /// Accounts whose balance moved, with the balance after the batch.
    pub balances: Vec<(String, i64)>,
    /// Usage to add, one row per subject, day and currency.
    pub usage: Vec<Usage>,
    /// Keys completed, with their outcome.
    pub completed: Vec<(&'a str, String)>,
    /// Keys given back (a refusal whose fate is to forget it).
    pub released: Vec<&'a str>,
    /// `rows::audit_values` of each audit record.
    pub audits: Vec<Vec<Value>>,
}

/// Add one payment of `amount` to its subject's day.
fn count(rows: &mut Vec<Usage>, subject: &str, day: UnixSecs, currency: &str, amount: i64) {
    match rows.iter_mut().find(|u| u.subject == subject && u.day == day && u.currency == currency) {
        Some(u) => {
            u.payments += 1;
            u.spent_minor += amount;
        }
        None => rows.push(Usage {
            subject: subject.into(),
            day,
            currency: currency.into(),
            payments: 1,
            spent_minor: amount,
        }),
    }
}

/// What a budget check reads (as the single posting's query does): the subject's payments that
/// day in any currency, and its spend in this one.
fn usage_of(rows: &[Usage], subject: &str, day: UnixSecs, currency: &str) -> BudgetUsage {
    let mut usage = BudgetUsage { payments: 0, spent_minor: 0 };
    for u in rows.iter().filter(|u| u.subject == subject && u.day == day) {
        usage.payments += u.payments;
        if u.currency == currency {
            usage.spent_minor += u.spent_minor;
        }
    }
    usage
}

/// Decide `jobs` (each a transfer and its `now`; keys distinct) in order: each one's answer, and
/// the batch's writes.
pub(super) fn decide<'a>(
    jobs: &[(&'a TransferRequest, UnixSecs)],
    mut loaded: Loaded,
) -> Result<(Vec<Result<Payment, BackendError>>, WriteSet<'a>), StoreError> {
    let mut answers = Vec::with_capacity(jobs.len());
    let mut w = WriteSet::default();
    let mut moved: Vec<&str> = Vec::new();
    for &(req, now) in jobs {
        let key = req.attempt.key.as_str();
        if let Some(c) = &req.attempt.claim {
            let rec = &c.records[0];
            match loaded.claimed.get(key) {
                Some(None) => {}
                Some(Some(row)) => match reservation::decide(Some(row.clone()), &rec.fingerprint, now)? {
                    ReserveStep::Found(r) => {
                        answers.push(Err(BackendError::KeyHeld { key: key.to_string(), reservation: r }));
                        continue;
                    }
                    step => w.steps.push((rec, step, now)),
                },
                None => return Err(StoreError::Corrupt(format!("key {key} was claimed but not returned"))),
            }
        }
        let existing = loaded.made.get(key).cloned();
        let (from, to) = (loaded.accounts.get(req.from_account.as_str()), loaded.accounts.get(req.to_account.as_str()));
        let plan = transfer::plan(req, existing, from, to, now).and_then(|plan| {
            if let (PostingPlan::Post(p), Some(b)) = (&plan, &req.guards.budget) {
                let usage = usage_of(&loaded.usage, &req.usage_subject(), b.since, p.currency.code());
                guards::check_budget(b, usage, p.amount_minor, p.currency)?;
            }
            Ok(plan)
        });
        let p = match plan {
            Err(refusal) => {
                // A claimed key keeps the refusal's fate; a key the caller reserved is the caller's.
                if req.attempt.claim.is_some() {
                    match StoredOutcome::after_refusal(&refusal) {
                        Some(o) => w.completed.push((key, o.to_json())),
                        None => w.released.push(key),
                    }
                }
                answers.push(Err(refusal));
                continue;
            }
            Ok(PostingPlan::Replay(p)) => p,
            Ok(PostingPlan::Post(p)) => {
                let entry = DoubleEntry::of_payment(&p);
                for (account, amount) in entry.legs {
                    let Some(row) = loaded.accounts.get_mut(account) else {
                        return Err(StoreError::Corrupt(format!("account {account} was planned but not locked")));
                    };
                    row.balance_minor += amount;
                    let (id, currency) = (p.id.to_string(), p.currency.code().to_string());
                    let description = entry.description.clone();
                    w.postings.push((id, account.to_string(), amount, currency, row.balance_minor, description, now));
                }
                moved.extend([req.from_account.as_str(), req.to_account.as_str()]);
                let draw = guards::usage_draw(p.kind, &req.usage_subject(), p.currency, p.amount_minor, now);
                count(&mut loaded.usage, &draw.subject, draw.day, draw.currency.code(), draw.amount_minor);
                count(&mut w.usage, &draw.subject, draw.day, draw.currency.code(), draw.amount_minor);
                w.payments.push(rows::payment_values(&p, key, None));
                p
            }
        };
        w.completed.push((key, completed_outcome(&p)));
        if let Some(a) = &req.attempt.audit {
            w.audits.push(rows::audit_values(a, Some(p.id.as_str())));
        }
        answers.push(Ok(p));
    }
    moved.sort_unstable();
    moved.dedup();
    w.balances = moved.into_iter().map(|a| (a.to_string(), loaded.accounts[a].balance_minor)).collect();
    Ok((answers, w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::{AccountId, PaymentId};
    use crate::domain::money::{Currency, Money};
    use crate::domain::payment::{Attempt, Claim, DailyBudget, Guards, PaymentKind};

    fn kes() -> Currency {
        Currency::parse("KES").unwrap()
    }

    fn req(key: &str, from: &str, to: &str, minor: i64, budget: Option<DailyBudget>) -> TransferRequest {
        let record = NewIdempotencyRecord {
            key: key.into(),
            fingerprint: "fp".into(),
            tool: "create_payment".into(),
            principal_iss: "iss".into(),
            principal_sub: "agent".into(),
            lease_until: 130,
            expires_at: 3_700,
        };
        let mut attempt = Attempt::reserved(key);
        attempt.claim = Some(Claim { records: vec![record] });
        TransferRequest {
            attempt,
            payment_id: PaymentId::generate(),
            from_account: AccountId::parse(from).unwrap(),
            to_account: AccountId::parse(to).unwrap(),
            amount: Money::from_minor(minor, kes()).unwrap(),
            memo: None,
            principal_sub: "agent".into(),
            principal_user: None,
            guards: Guards { budget, mandate: None, payee: None },
        }
    }

    fn loaded(keys: &[&str], accounts: &[(&str, i64)]) -> Loaded {
        Loaded {
            claimed: keys.iter().map(|k| (k.to_string(), None)).collect(),
            accounts: accounts
                .iter()
                .map(|(id, b)| {
                    (id.to_string(), AccountRow { currency: kes(), balance_minor: *b, allow_overdraft: false })
                })
                .collect(),
            ..Loaded::default()
        }
    }

    #[test]
    fn each_transfer_is_decided_on_what_the_ones_before_it_left() {
        // acct-A holds 250: two payments of 100 pass, the third is short; the fourth (50) fits.
        let reqs = [req("k1", "acct-A", "acct-B", 100, None), req("k2", "acct-A", "acct-B", 100, None)];
        let more = [req("k3", "acct-A", "acct-B", 100, None), req("k4", "acct-A", "acct-B", 50, None)];
        let jobs: Vec<_> = reqs.iter().chain(&more).map(|r| (r, 100)).collect();
        let (answers, w) = decide(&jobs, loaded(&["k1", "k2", "k3", "k4"], &[("acct-A", 250), ("acct-B", 0)])).unwrap();
        assert!(answers[0].is_ok() && answers[1].is_ok() && answers[3].is_ok(), "{answers:?}");
        assert!(matches!(answers[2], Err(BackendError::InsufficientFunds { .. })), "{answers:?}");
        // Postings chain each account's balance through the batch; the final balances are written.
        let after: Vec<(&str, i64)> = w.postings.iter().map(|p| (p.1.as_str(), p.4)).collect();
        let want = [("acct-A", 150), ("acct-B", 100), ("acct-A", 50), ("acct-B", 200), ("acct-A", 0), ("acct-B", 250)];
        assert_eq!(after, want);
        assert_eq!(w.balances, vec![("acct-A".to_string(), 0), ("acct-B".to_string(), 250)]);
        assert_eq!(w.payments.len(), 3);
        // Every key completed: three with their payment, the short one with its refusal (it sticks).
        assert_eq!(w.completed.len(), 4);
        assert!(w.completed.iter().any(|(k, o)| *k == "k3" && o.contains("insufficient funds")));
        assert!(w.released.is_empty());
        assert_eq!(w.usage.len(), 1);
        assert_eq!((w.usage[0].payments, w.usage[0].spent_minor), (3, 250));
    }

    #[test]
    fn the_days_budget_counts_the_payments_before_it_in_the_batch() {
        let budget = DailyBudget { kind: PaymentKind::Payment, since: 0, max_minor: 1_000, max_payments: 100 };
        let reqs: Vec<_> =
            (0..4).map(|n| req(&format!("b{n}"), "acct-A", "acct-B", 300, Some(budget.clone()))).collect();
        let jobs: Vec<_> = reqs.iter().map(|r| (r, 100)).collect();
        let mut l = loaded(&["b0", "b1", "b2", "b3"], &[("acct-A", 10_000), ("acct-B", 0)]);
        // 200 spent earlier today.
        l.usage.push(Usage { subject: "agent".into(), day: 0, currency: "KES".into(), payments: 1, spent_minor: 200 });
        let (answers, w) = decide(&jobs, l).unwrap();
        let passed: Vec<bool> = answers.iter().map(Result::is_ok).collect();
        assert_eq!(passed, [true, true, false, false], "200 + 300 + 300 fits 1,000; a third does not");
        assert_eq!(w.released, vec!["b2", "b3"], "a spent budget gives the key back");
        assert_eq!((w.usage[0].payments, w.usage[0].spent_minor), (2, 600), "only what moved is added");
    }

    #[test]
    fn an_answered_key_replays_and_moves_nothing() {
        let r = req("k1", "acct-A", "acct-B", 100, None);
        let mut l = loaded(&[], &[("acct-A", 1_000), ("acct-B", 0)]);
        let done = IdempotencyRow {
            fingerprint: "fp".into(),
            state: "completed".into(),
            outcome: Some("{}".into()),
            lease_until: 0,
            expires_at: 3_700,
        };
        l.claimed.insert("k1".into(), Some(done));
        let (answers, w) = decide(&[(&r, 100)], l).unwrap();
        assert!(matches!(&answers[0], Err(BackendError::KeyHeld { key, .. }) if key == "k1"), "{answers:?}");
        assert!(w.payments.is_empty() && w.postings.is_empty() && w.completed.is_empty() && w.balances.is_empty());
    }
}
