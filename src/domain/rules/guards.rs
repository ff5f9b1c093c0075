//! Guards drawn where a payment commits: the subject's daily budget and an issued mandate's uses,
//! budget and expiry. The engine loads the usage and the mandate row (under its locks), asks here,
//! and records the draw.

use crate::clock::UnixSecs;
use crate::domain::error::{BackendError, StoreError};
use crate::domain::money::{Currency, format_minor};
use crate::domain::payment::{DailyBudget, PaymentKind};

/// Seconds in a budget day (UTC).
const DAY_SECS: i64 = 86_400;

/// The start of the UTC day holding `t`: the `day` of `budget_usage`.
pub fn day_of(t: UnixSecs) -> UnixSecs {
    t - t.rem_euclid(DAY_SECS)
}

/// A subject's committed usage for one day: payments in every currency, spend in the payment's.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BudgetUsage {
    pub payments: i64,
    pub spent_minor: i64,
}

/// Where a kind's daily usage is kept. Payments and refunds count against separate budgets, so a
/// refund neither frees nor spends the day's payment budget (engines put this name in their SQL).
pub fn usage_table(kind: PaymentKind) -> &'static str {
    match kind {
        PaymentKind::Payment => "budget_usage",
        PaymentKind::Refund => "refund_usage",
    }
}

/// Refuse a payment (or refund) of `amount` that would take the day past the budget's count or
/// spend.
pub fn check_budget(
    budget: &DailyBudget,
    usage: BudgetUsage,
    amount: i64,
    currency: Currency,
) -> Result<(), BackendError> {
    let BudgetUsage { payments: count, spent_minor: spent } = usage;
    let (things, spent_verb, limit) = match budget.kind {
        PaymentKind::Payment => ("payments", "spent", "daily limit"),
        PaymentKind::Refund => ("refunds", "refunded", "daily refund limit"),
    };
    if count >= budget.max_payments {
        return Err(BackendError::BudgetExceeded(format!(
            "{count} {things} today reach the daily maximum of {}",
            budget.max_payments
        )));
    }
    if spent + amount > budget.max_minor {
        return Err(BackendError::BudgetExceeded(format!(
            "{currency} {} {spent_verb} today plus {} exceeds the {limit} of {}",
            format_minor(spent, currency),
            format_minor(amount, currency),
            format_minor(budget.max_minor, currency)
        )));
    }
    Ok(())
}

/// An issued mandate as stored (`mandates`), with what has been drawn on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MandateRow {
    pub currency: String,
    pub budget_minor: Option<i64>,
    pub max_uses: i64,
    pub spent_minor: i64,
    pub uses: i64,
    pub expires_at: UnixSecs,
    /// When an operator revoked it, if one did.
    pub revoked_at: Option<UnixSecs>,
}

/// The mandate row read back after its draw of `amount` (`drawn`: uses, spend) says exactly one
/// more use and `amount` more than `before`: anything else (a trigger that reset or rewrote it)
/// fails the posting, so a mandate is never drawn past its bounds on a count that did not move.
pub fn drawn_as_meant(before: &MandateRow, amount: i64, drawn: (i64, i64)) -> Result<(), StoreError> {
    let meant = (before.uses + 1, before.spent_minor + amount);
    if drawn == meant {
        Ok(())
    } else {
        Err(StoreError::Database(format!(
            "mandate draw: the row says {} uses and {} spent where {} and {} were meant",
            drawn.0, drawn.1, meant.0, meant.1
        )))
    }
}

/// Refuse a draw of `amount` on a mandate (`None`: not one this gateway issued). On `Ok` the engine
/// records one use and the spend.
pub fn check_mandate(
    mandate: Option<&MandateRow>,
    amount: i64,
    currency: Currency,
    now: UnixSecs,
) -> Result<(), BackendError> {
    let Some(m) = mandate else {
        return Err(BackendError::MandateExhausted("this gateway did not issue it".into()));
    };
    if m.revoked_at.is_some() {
        return Err(BackendError::MandateExhausted("an operator revoked it".into()));
    }
    if m.currency != currency.code() || now >= m.expires_at {
        return Err(BackendError::MandateExhausted("it does not cover this payment".into()));
    }
    if m.uses >= m.max_uses {
        return Err(BackendError::MandateExhausted(format!("all {} uses are spent", m.max_uses)));
    }
    if m.budget_minor.is_some_and(|b| m.spent_minor + amount > b) {
        return Err(BackendError::MandateExhausted("its budget is spent".into()));
    }
    Ok(())
}

/// What a payment or refund adds to its subject's day (in its kind's `usage_table`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageDraw {
    pub kind: PaymentKind,
    pub subject: String,
    pub day: UnixSecs,
    pub currency: Currency,
    pub amount_minor: i64,
}

/// Every payment and every refund counts toward its subject's day of its kind (mandated ones too,
/// though only autonomous ones are checked against the budget).
pub fn usage_draw(kind: PaymentKind, subject: &str, currency: Currency, amount_minor: i64, at: UnixSecs) -> UsageDraw {
    UsageDraw { kind, subject: subject.to_string(), day: day_of(at), currency, amount_minor }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kes() -> Currency {
        Currency::parse("KES").unwrap()
    }

    #[test]
    fn days_start_at_utc_midnight() {
        for (t, day) in [(0, 0), (86_399, 0), (86_400, 86_400), (90_000, 86_400), (-1, -86_400)] {
            assert_eq!(day_of(t), day, "{t}");
        }
    }

    #[test]
    fn budget_refusals() {
        let budget = DailyBudget { kind: PaymentKind::Payment, since: 0, max_minor: 10_000, max_payments: 3 };
        let cases: &[(i64, i64, i64, Option<&str>)] = &[
            // (payments today, spent today, amount, refusal)
            (0, 0, 10_000, None),
            (2, 9_000, 1_000, None),
            (3, 0, 1, Some("daily budget exceeded: 3 payments today reach the daily maximum of 3")),
            (
                1,
                9_000,
                1_001,
                Some("daily budget exceeded: KES 90.00 spent today plus 10.01 exceeds the daily limit of 100.00"),
            ),
        ];
        for &(payments, spent_minor, amount, refusal) in cases {
            let got = check_budget(&budget, BudgetUsage { payments, spent_minor }, amount, kes());
            assert_eq!(got.err().map(|e| e.to_string()).as_deref(), refusal, "{payments} {spent_minor} {amount}");
        }
        // A refund budget refuses in its own words.
        let refunds = DailyBudget { kind: PaymentKind::Refund, ..budget };
        let got = check_budget(&refunds, BudgetUsage { payments: 1, spent_minor: 9_000 }, 1_001, kes());
        assert_eq!(
            got.err().map(|e| e.to_string()).as_deref(),
            Some("daily budget exceeded: KES 90.00 refunded today plus 10.01 exceeds the daily refund limit of 100.00")
        );
        let got = check_budget(&refunds, BudgetUsage { payments: 3, spent_minor: 0 }, 1, kes());
        assert_eq!(
            got.err().map(|e| e.to_string()).as_deref(),
            Some("daily budget exceeded: 3 refunds today reach the daily maximum of 3")
        );
    }

    #[test]
    fn a_draw_read_back_must_show_one_more_use_and_the_amount() {
        let before = MandateRow {
            currency: "KES".into(),
            budget_minor: Some(5_000),
            max_uses: 3,
            spent_minor: 1_000,
            uses: 1,
            expires_at: 100,
            revoked_at: None,
        };
        assert!(drawn_as_meant(&before, 400, (2, 1_400)).is_ok());
        // The row kept (a trigger returning OLD), reset, or moved by another amount or count.
        for drawn in [(1, 1_000), (0, 0), (2, 1_000), (1, 1_400), (3, 1_400), (2, 1_800), (2, 600)] {
            let e = drawn_as_meant(&before, 400, drawn).expect_err("a draw the row does not show");
            assert!(e.to_string().contains("where 2 and 1400 were meant"), "{drawn:?}: {e}");
        }
    }

    #[test]
    fn mandate_refusals() {
        let row = MandateRow {
            currency: "KES".into(),
            budget_minor: Some(5_000),
            max_uses: 2,
            spent_minor: 1_000,
            uses: 1,
            expires_at: 100,
            revoked_at: None,
        };
        // (mandate, amount, currency, now, refusal)
        type Case = (Option<MandateRow>, i64, &'static str, i64, Option<&'static str>);
        let cases: Vec<Case> = vec![
            (Some(row.clone()), 4_000, "KES", 99, None),
            (None, 1, "KES", 0, Some("mandate cannot be drawn on: this gateway did not issue it")),
            (Some(row.clone()), 1, "USD", 0, Some("mandate cannot be drawn on: it does not cover this payment")),
            (Some(row.clone()), 1, "KES", 100, Some("mandate cannot be drawn on: it does not cover this payment")),
            (
                Some(MandateRow { uses: 2, ..row.clone() }),
                1,
                "KES",
                0,
                Some("mandate cannot be drawn on: all 2 uses are spent"),
            ),
            (Some(row.clone()), 4_001, "KES", 0, Some("mandate cannot be drawn on: its budget is spent")),
            (
                Some(MandateRow { revoked_at: Some(50), ..row.clone() }),
                1,
                "KES",
                0,
                Some("mandate cannot be drawn on: an operator revoked it"),
            ),
            (Some(MandateRow { budget_minor: None, ..row }), 1_000_000, "KES", 0, None),
        ];
        for (m, amount, cur, now, refusal) in cases {
            let got = check_mandate(m.as_ref(), amount, Currency::parse(cur).unwrap(), now);
            assert_eq!(got.err().map(|e| e.to_string()).as_deref(), refusal, "{m:?} {amount} {cur} {now}");
        }
    }

    #[test]
    fn payments_and_refunds_count_toward_separate_days() {
        for kind in [PaymentKind::Payment, PaymentKind::Refund] {
            assert_eq!(
                usage_draw(kind, "sub", kes(), 500, 86_401),
                UsageDraw { kind, subject: "sub".into(), day: 86_400, currency: kes(), amount_minor: 500 }
            );
        }
        assert_ne!(usage_table(PaymentKind::Payment), usage_table(PaymentKind::Refund));
    }
}
