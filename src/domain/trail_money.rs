//! A ledger payment held to the "allowed" record that decided it. The record is the trail's: by the
//! time `audit verify` asks, its link or its writer's tag has shown it is what the gateway wrote.
//! The payment row is the ledger's, which a database writer can rewrite after the fact. The
//! record's intent is the policy question the gateway answered for the call (`policy::Question`:
//! accounts, payee, amount, currency, kind, mandate), so a payment whose amount, accounts,
//! currency, kind, principal or mandate no longer match what was decided — or a payment that
//! borrowed another operation's record (a rail payout's, say) — is named.

use super::policy::Question;

/// What a ledger payment row says (`payments`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PaymentFacts {
    pub id: String,
    /// "payment" or "refund".
    pub kind: String,
    pub from_account: String,
    pub to_account: String,
    pub amount_minor: i64,
    pub currency: String,
    pub principal_sub: String,
    pub principal_user: Option<String>,
    /// It drew on a mandate (its `mandate_id` is set).
    pub mandated: bool,
    /// The payment a refund gives back (`refund_of`).
    pub refund_of: Option<String>,
    /// "succeeded": a ledger payment is written only when it posts.
    pub status: String,
    pub created_at: i64,
    /// For a refund whose original the store holds: that original's refunds.
    pub original: Option<OriginalRefunds>,
}

/// A refund's original as the store holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OriginalRefunds {
    /// The original's amount.
    pub amount_minor: i64,
    /// What all its refunds add up to.
    pub refunded_minor: i64,
    /// How many of its refunds were posted after this one.
    pub refunds_after: i64,
}

/// What the payment's "allowed" record says of the call it decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decided {
    pub principal_sub: String,
    pub principal_user: Option<String>,
    /// The policy question, canonical JSON; `None` on records from before intents were kept.
    pub intent: Option<String>,
    /// When the record was made: in the payment's own transaction, by the same call.
    pub at: i64,
}

/// How far apart a payment's creation and its record's time may be (the record is made as the
/// call is judged, the payment as it posts, in the same call): more is a payment moved in time.
pub const RECORD_SKEW_MAX_SECS: i64 = 300;

/// Why payment `p` is not what its record `d` decided, or `None` when it is. A payment pays its
/// question's amount from its first account to its second; a refund gives back at most the
/// amount asked (an omitted amount is "everything left", which the posting may find smaller)
/// from the original's payee to its payer.
pub fn contradiction(p: &PaymentFacts, d: &Decided) -> Option<String> {
    if p.principal_sub != d.principal_sub || p.principal_user != d.principal_user {
        return Some(format!(
            "payment {} names principal {} (for {:?}), its allowed record {} (for {:?})",
            p.id, p.principal_sub, p.principal_user, d.principal_sub, d.principal_user
        ));
    }
    if p.status != "succeeded" {
        return Some(format!("payment {} is {}: a ledger payment is written only when it posts", p.id, p.status));
    }
    if (p.created_at - d.at).abs() > RECORD_SKEW_MAX_SECS {
        return Some(format!(
            "payment {} was made at {}, its allowed record at {}: the payment was moved in time",
            p.id, p.created_at, d.at
        ));
    }
    if p.kind != "refund" && p.refund_of.is_some() {
        return Some(format!("payment {} is no refund, yet names a payment it refunds", p.id));
    }
    let intent = d.intent.as_deref()?;
    let Ok(q) = serde_json::from_str::<Question>(intent) else {
        return Some(format!("payment {}'s allowed record holds no policy question it could be checked against", p.id));
    };
    let refund = p.kind == "refund";
    let (payer, payee) = if refund { (&q.accounts[1], &q.accounts[0]) } else { (&q.accounts[0], &q.accounts[1]) };
    let differs = |what: &str, paid: &str, decided: &str| {
        Some(format!("payment {}'s {what} is {paid}, its allowed record decided {decided}", p.id))
    };
    if p.kind != q.kind {
        return differs("kind", &p.kind, &q.kind);
    }
    if p.currency != q.currency.code() {
        return differs("currency", &p.currency, q.currency.code());
    }
    if p.from_account != payer.as_str() || p.to_account != payee.as_str() || p.to_account != q.payee {
        let paid = format!("{} → {}", p.from_account, p.to_account);
        return differs("accounts", &paid, &format!("{payer} → {payee}"));
    }
    // A refund that asked for "everything left" may find less left where it posts; one that named
    // its amount, and every payment, moves exactly it.
    let amount_holds =
        if refund && !q.exact { p.amount_minor <= q.amount_minor } else { p.amount_minor == q.amount_minor };
    if !amount_holds {
        return differs("amount (minor units)", &p.amount_minor.to_string(), &q.amount_minor.to_string());
    }
    if let Some(original) = &q.original
        && p.refund_of.as_deref() != Some(original.as_str())
    {
        let named = p.refund_of.as_deref().unwrap_or("no payment");
        return differs("original payment", named, original);
    }
    // "Everything left" leaves nothing: the original's refunds add up to its amount and none
    // comes after. Otherwise it was lowered in the database, so the original could be refunded
    // again (the tenth review).
    if refund
        && !q.exact
        && let (Some(original), Some(o)) = (&q.original, &p.original)
    {
        if o.refunds_after > 0 {
            return Some(format!(
                "payment {} refunded everything left of {original}, yet {} refund(s) of it were posted after",
                p.id, o.refunds_after
            ));
        }
        if o.refunded_minor != o.amount_minor {
            return Some(format!(
                "payment {} refunded everything left of {original}, yet its refunds add up to {} of its amount {} \
                 (minor units)",
                p.id, o.refunded_minor, o.amount_minor
            ));
        }
    }
    if p.mandated != q.mandated {
        let says = |m: bool| if m { "with a mandate" } else { "without one" };
        return differs("authority", says(p.mandated), says(q.mandated));
    }
    None
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::domain::ids::AccountId;
    use crate::domain::money::{Currency, Money};
    use crate::domain::payment::{Payment, PaymentKind, PaymentStatus};

    fn kes() -> Currency {
        Currency::parse("KES").unwrap()
    }

    fn acct(s: &str) -> AccountId {
        AccountId::parse(s).unwrap()
    }

    fn payment() -> PaymentFacts {
        PaymentFacts {
            id: "pay_1".into(),
            kind: "payment".into(),
            from_account: "acct-A".into(),
            to_account: "acct-B".into(),
            amount_minor: 5_000,
            currency: "KES".into(),
            principal_sub: "agent".into(),
            principal_user: Some("alice".into()),
            mandated: false,
            refund_of: None,
            status: "succeeded".into(),
            created_at: 1_000,
            original: None,
        }
    }

    fn decided(q: &Question) -> Decided {
        Decided {
            principal_sub: "agent".into(),
            principal_user: Some("alice".into()),
            intent: Some(q.canonical()),
            at: 1_000,
        }
    }

    fn transfer() -> Question {
        Question::transfer(&acct("acct-A"), &acct("acct-B"), Money::from_minor(5_000, kes()).unwrap())
    }

    /// A refund of 30.00 of a 50.00 payment from acct-A to acct-B (so from acct-B back to acct-A);
    /// `asked` is what the question judged (for "everything left", what was left then).
    fn refund_question(asked: i64) -> Question {
        let original = Payment {
            id: crate::domain::ids::PaymentId::generate(),
            kind: PaymentKind::Payment,
            status: PaymentStatus::Succeeded,
            from_account: acct("acct-A"),
            to_account: acct("acct-B"),
            amount_minor: 5_000,
            currency: kes(),
            refunded_minor: 0,
            refund_of: None,
            memo: None,
            principal_sub: "agent".into(),
            principal_user: Some("alice".into()),
            created_at: 0,
        };
        Question {
            original: Some("pay_orig".into()),
            ..Question::refund(&original, Money::from_minor(asked, kes()).unwrap())
        }
    }

    fn refund(amount_minor: i64) -> PaymentFacts {
        PaymentFacts {
            kind: "refund".into(),
            from_account: "acct-B".into(),
            to_account: "acct-A".into(),
            amount_minor,
            refund_of: Some("pay_orig".into()),
            original: Some(OriginalRefunds { amount_minor: 5_000, refunded_minor: 5_000, refunds_after: 0 }),
            ..payment()
        }
    }

    #[test]
    fn a_payment_as_decided_holds() {
        assert_eq!(contradiction(&payment(), &decided(&transfer())), None);
        let mandated = Question { mandated: true, ..transfer() };
        assert_eq!(contradiction(&PaymentFacts { mandated: true, ..payment() }, &decided(&mandated)), None);
        // Records from before intents were kept are held to their principal only.
        let old = Decided { intent: None, ..decided(&transfer()) };
        assert_eq!(contradiction(&PaymentFacts { amount_minor: 1, ..payment() }, &old), None);
        assert!(contradiction(&PaymentFacts { principal_sub: "x".into(), ..payment() }, &old).is_some());
    }

    #[test]
    fn a_refund_gives_back_at_most_what_was_asked_the_other_way() {
        let q = refund_question(3_000);
        assert_eq!(contradiction(&refund(3_000), &decided(&q)), None);
        assert_eq!(contradiction(&refund(2_999), &decided(&q)), None, "everything left, found smaller");
        let more = contradiction(&refund(3_001), &decided(&q)).unwrap();
        assert!(more.contains("amount") && more.contains("3001") && more.contains("3000"), "{more}");
        // The ninth review: a refund that named its amount, lowered in the database (so the
        // original could be refunded again), is named; only "everything left" may be smaller.
        let exact = Question { exact: true, ..q.clone() };
        assert_eq!(contradiction(&refund(3_000), &decided(&exact)), None);
        let lowered = contradiction(&refund(1), &decided(&exact)).unwrap();
        assert!(lowered.contains("amount") && lowered.contains("3000"), "{lowered}");
        let forward = PaymentFacts { from_account: "acct-A".into(), to_account: "acct-B".into(), ..refund(3_000) };
        assert!(contradiction(&forward, &decided(&q)).unwrap().contains("accounts"));
        // A refund's record does not decide a payment, nor a payment's a refund.
        assert!(contradiction(&PaymentFacts { kind: "payment".into(), ..refund(3_000) }, &decided(&q)).is_some());
        assert!(contradiction(&PaymentFacts { kind: "refund".into(), ..payment() }, &decided(&transfer())).is_some());
        // The eighth review: a refund detached from its original (refund_of cleared) or moved to
        // another payment, so the original could be refunded again.
        for moved in [None, Some("pay_other".to_string())] {
            let why = contradiction(&PaymentFacts { refund_of: moved.clone(), ..refund(3_000) }, &decided(&q));
            assert!(
                why.as_deref().is_some_and(|w| w.contains("original payment") && w.contains("pay_orig")),
                "{moved:?}: {why:?}"
            );
        }
        // A record from before refunds named their original holds the rest only.
        let old = Question { original: None, ..q };
        assert_eq!(contradiction(&PaymentFacts { refund_of: None, ..refund(3_000) }, &decided(&old)), None);
    }

    /// The tenth review (high): "everything left" (no amount) lowered in the database — 70.00 to
    /// 10.00, postings, balances and the original's refunded amount to match — so the original was
    /// refunded again. After such a refund its original has nothing left.
    #[test]
    fn everything_left_leaves_nothing() {
        let q = refund_question(3_000);
        let with = |refunded_minor, refunds_after| PaymentFacts {
            original: Some(OriginalRefunds { amount_minor: 5_000, refunded_minor, refunds_after }),
            ..refund(3_000)
        };
        assert_eq!(contradiction(&with(5_000, 0), &decided(&q)), None, "2,000 first, then everything left");
        let lowered = contradiction(&PaymentFacts { amount_minor: 1_000, ..with(3_000, 0) }, &decided(&q)).unwrap();
        assert!(lowered.contains("everything left") && lowered.contains("3000 of its amount 5000"), "{lowered}");
        let again = contradiction(&PaymentFacts { amount_minor: 1_000, ..with(5_000, 1) }, &decided(&q)).unwrap();
        assert!(again.contains("1 refund(s) of it were posted after"), "{again}");
        // A refund that named its amount leaves the rest refundable.
        let exact = Question { exact: true, ..q.clone() };
        assert_eq!(contradiction(&with(3_000, 2), &decided(&exact)), None);
        // A record from before refunds named their original is not held to it.
        assert_eq!(contradiction(&with(3_000, 1), &decided(&Question { original: None, ..q })), None);
    }

    /// Each field a database writer could rewrite after the decision is named.
    #[test]
    fn every_rewritten_field_is_named() {
        let d = decided(&transfer());
        let cases: Vec<(&str, PaymentFacts)> = vec![
            ("principal", PaymentFacts { principal_sub: "other".into(), ..payment() }),
            ("principal", PaymentFacts { principal_user: Some("bob".into()), ..payment() }),
            ("principal", PaymentFacts { principal_user: None, ..payment() }),
            ("kind", PaymentFacts { kind: "refund".into(), ..payment() }),
            ("currency", PaymentFacts { currency: "UGX".into(), ..payment() }),
            ("accounts", PaymentFacts { to_account: "acct-Z".into(), ..payment() }),
            ("accounts", PaymentFacts { from_account: "acct-Z".into(), ..payment() }),
            ("amount", PaymentFacts { amount_minor: 900_000, ..payment() }),
            ("amount", PaymentFacts { amount_minor: 4_999, ..payment() }),
            ("authority", PaymentFacts { mandated: true, ..payment() }),
            // The eighth review: a payment marked failed, moved days back, or named a refund.
            ("failed", PaymentFacts { status: "failed".into(), ..payment() }),
            ("moved in time", PaymentFacts { created_at: 1_000 - 3 * 86_400, ..payment() }),
            ("moved in time", PaymentFacts { created_at: 1_000 + RECORD_SKEW_MAX_SECS + 1, ..payment() }),
            ("no refund", PaymentFacts { refund_of: Some("pay_x".into()), ..payment() }),
        ];
        assert_eq!(contradiction(&PaymentFacts { created_at: 1_000 + RECORD_SKEW_MAX_SECS, ..payment() }, &d), None);
        for (what, p) in cases {
            let why = contradiction(&p, &d).unwrap_or_else(|| panic!("{what}: {p:?} not named"));
            assert!(why.contains(what) && why.contains("pay_1"), "{what}: {why}");
        }
        let unmandated = PaymentFacts { mandated: false, ..payment() };
        let why = contradiction(&unmandated, &decided(&Question { mandated: true, ..transfer() })).unwrap();
        assert!(why.contains("without one") && why.contains("with a mandate"), "{why}");
        // A payee that is not the second account (a rail operation's question names the rail's
        // account twice and the customer as payee): not a ledger payment's decision.
        let rail = Question { payee: "254700000000".into(), accounts: [acct("acct-A"), acct("acct-B")], ..transfer() };
        assert!(contradiction(&payment(), &decided(&rail)).unwrap().contains("accounts"));
        let garbled = Decided { intent: Some("{}".into()), ..d };
        assert!(contradiction(&payment(), &garbled).unwrap().contains("no policy question"));
    }
}
