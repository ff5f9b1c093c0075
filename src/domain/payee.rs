//! Who gets paid: beneficiary rules, as banks keep them. Per profile, a payee (a ledger account, a
//! customer's M-Pesa or Airtel phone) is *open* (anyone), must be *known* (a human approved a
//! payment to it, or an operator added it) or must be on the operator's *allow-list*. A payee known
//! for less than `cooling_off_secs` may be paid alone only up to `new_payee_limit` a payment and
//! `cooling_off_total` in all, and every payee only up to its daily cap. A paybill payee is the pair
//! (paybill, account reference) ([`key`]): a bank paybill credits whatever account the reference
//! names. Pure: the gateway reads the payee's row and usage, asks here; the engine re-checks the
//! caps where the payment commits (under the budget lock).

use std::collections::HashMap;

use serde::{Deserialize, Serialize};

use crate::clock::UnixSecs;
use crate::domain::money::{Currency, Money, format_minor};
use crate::domain::policy::{Decision, Refusal};

/// How a profile treats payees.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PayeeMode {
    /// Any payee the profile's other rules allow (the default; no payee is read).
    #[default]
    Open,
    /// A payee nobody approved yet needs a human: approving that payment makes it known.
    Known,
    /// Only payees an operator added (or a human approved): anything else is refused.
    AllowList,
}

impl PayeeMode {
    pub fn parse(s: &str) -> Option<PayeeMode> {
        match s {
            "open" => Some(PayeeMode::Open),
            "known" => Some(PayeeMode::Known),
            "allow_list" => Some(PayeeMode::AllowList),
            _ => None,
        }
    }
    pub fn as_str(self) -> &'static str {
        match self {
            PayeeMode::Open => "open",
            PayeeMode::Known => "known",
            PayeeMode::AllowList => "allow_list",
        }
    }
}

/// A profile's payee rules.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct PayeeRules {
    pub mode: PayeeMode,
    /// For this long after a payee became known, payments to it alone are capped at
    /// `new_payee_limit_minor` (per payment).
    pub cooling_off_secs: i64,
    /// Per currency: the largest autonomous payment to a payee in its cooling-off period. A currency
    /// not listed: the autonomous limit alone.
    pub new_payee_limit_minor: HashMap<Currency, i64>,
    /// Per currency: what autonomous payments to one payee may total during its cooling-off
    /// period. A currency not listed: no total (each payment alone is bounded).
    pub cooling_off_total_minor: HashMap<Currency, i64>,
    /// Per currency: what autonomous payments to one payee may total per UTC day.
    pub daily_cap_minor: HashMap<Currency, i64>,
}

impl PayeeRules {
    /// Whether any rule needs the payee's row or today's usage for a payment in `currency`: when
    /// not, nothing is read (the default profile pays nothing extra).
    pub fn applies(&self, currency: Currency) -> bool {
        self.mode != PayeeMode::Open || self.daily_cap_minor.contains_key(&currency)
    }

    /// The cooling-off total that bounds a payment in `currency` at `now` to a payee known since
    /// `known_since`: only while it cools off, only outside open mode, only where one is set.
    pub fn cooling_total(&self, known_since: Option<UnixSecs>, currency: Currency, now: UnixSecs) -> Option<i64> {
        let since = known_since?;
        let cooling = self.mode != PayeeMode::Open && now < since.saturating_add(self.cooling_off_secs);
        cooling.then(|| self.cooling_off_total_minor.get(&currency).copied()).flatten()
    }
}

/// What separates a paybill's account from its account reference in a payee key. No account id
/// contains it (`AccountId`: letters, digits, `-_.:`), so the key splits back at its first one.
pub const REFERENCE_SEPARATOR: char = '/';

/// The payee a payment's rules are keyed by: the account paid, and for a paybill the account
/// reference too (`mpesa-paybill-247247/SUPPLIER-001`): knowing one reference of a paybill never
/// makes another known. Learning, allow-lists, caps, the operator's routes and the preflight all
/// key payees by it.
pub fn key(account: &str, account_reference: Option<&str>) -> String {
    match account_reference {
        Some(reference) => format!("{account}{REFERENCE_SEPARATOR}{reference}"),
        None => account.to_string(),
    }
}

/// A payee as stored (`payees`): known to one owner (an agent, or an agent acting for one user:
/// `domain::principal::usage_subject`) since a human approved it or an operator added it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PayeeRecord {
    pub owner: String,
    pub payee: String,
    pub known_since: UnixSecs,
    /// The operator (or user) who made it known: `iss sub`.
    pub added_by: String,
    /// The approval whose decision made it known, when one did.
    pub approval_id: Option<String>,
    pub revoked_at: Option<UnixSecs>,
    pub revoked_by: Option<String>,
    /// The gateway's row tag over what made it known ([`PayeeRecord::tag_fields`]): a row without
    /// one that holds was not written by the gateway, and makes no payee known.
    pub tag: Option<String>,
}

impl PayeeRecord {
    /// What the gateway's tag covers: who may pay whom since when, on whose word.
    pub fn tag_fields(&self) -> serde_json::Value {
        serde_json::json!([self.owner, self.payee, self.known_since, self.added_by, self.approval_id])
    }

    /// Known now: added and not revoked.
    pub fn known_since(&self) -> Option<UnixSecs> {
        self.revoked_at.is_none().then_some(self.known_since)
    }
}

/// What the rules read for one payment: since when the payee is known (none: not known), what
/// autonomous payments to it already total today in the payment's currency, and what they total
/// since it became known (read only while it cools off under a cooling-off total).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PayeeState {
    pub known_since: Option<UnixSecs>,
    pub paid_today_minor: i64,
    pub paid_cooling_minor: i64,
}

/// Where the engine re-checks a payee's caps, in the payment's transaction: its daily cap, and
/// while it cools off, its cooling-off total.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PayeeCap {
    pub owner: String,
    pub payee: String,
    /// Start of the current UTC day.
    pub since: UnixSecs,
    /// The daily cap, when the currency has one.
    pub max_minor: Option<i64>,
    /// The cooling-off total, while the payee cools off.
    pub cooling: Option<CoolingCap>,
}

/// A payee's cooling-off total: what autonomous payments to it may total from `known_since` (its
/// usage is kept per `known_since`, so a payee known again starts a new period).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CoolingCap {
    pub known_since: UnixSecs,
    pub max_minor: i64,
}

/// The daily cap's verdict on `amount` over what is already paid today (`paid_minor`).
pub fn check_cap(cap: &PayeeCap, paid_minor: i64, amount: i64, currency: Currency) -> Result<(), String> {
    let Some(max) = cap.max_minor else { return Ok(()) };
    if paid_minor.saturating_add(amount) > max {
        return Err(format!(
            "{currency} {} paid to {} today plus {} exceeds its daily cap of {}",
            format_minor(paid_minor, currency),
            cap.payee,
            format_minor(amount, currency),
            format_minor(max, currency)
        ));
    }
    Ok(())
}

/// The cooling-off total's verdict on `amount` over what the payee was paid since it became known
/// (`paid_minor`).
pub fn check_cooling(cap: &PayeeCap, paid_minor: i64, amount: i64, currency: Currency) -> Result<(), String> {
    let Some(c) = cap.cooling else { return Ok(()) };
    if paid_minor.saturating_add(amount) > c.max_minor {
        return Err(format!(
            "{currency} {} paid to {} since it became a payee plus {} exceeds its cooling-off total of {}",
            format_minor(paid_minor, currency),
            cap.payee,
            format_minor(amount, currency),
            format_minor(c.max_minor, currency)
        ));
    }
    Ok(())
}

/// May `amount` go to `payee` without a human, by the payee rules alone? Deny: not on the
/// allow-list. Approval: unknown under "known", over the new-payee limit while cooling off, or
/// over the payee's daily cap. A mandate turns an approval into an allow (a human approved this
/// very payment); it never lifts a denial.
pub fn decide(rules: &PayeeRules, payee: &str, state: PayeeState, amount: Money, now: UnixSecs) -> Decision {
    let currency = amount.currency();
    let known_since = match (rules.mode, state.known_since) {
        (PayeeMode::Open, since) => since,
        (_, Some(since)) => Some(since),
        (PayeeMode::Known, None) => {
            return Decision::RequireApproval {
                reason: format!("{payee} is a new payee for this agent: a human approves the first payment to it"),
            };
        }
        (PayeeMode::AllowList, None) => return Decision::Deny(Refusal::PayeeNotAllowed(payee.to_string())),
    };
    if rules.mode != PayeeMode::Open
        && let Some(since) = known_since
        && now < since.saturating_add(rules.cooling_off_secs)
        && let Some(limit) = rules.new_payee_limit_minor.get(&currency)
        && amount.minor() > *limit
    {
        return Decision::RequireApproval {
            reason: format!(
                "{payee} became a payee less than {}s ago: alone, this agent pays it at most {currency} {} at a time",
                rules.cooling_off_secs,
                format_minor(*limit, currency)
            ),
        };
    }
    let cap = PayeeCap {
        owner: String::new(),
        payee: payee.to_string(),
        since: 0,
        max_minor: rules.daily_cap_minor.get(&currency).copied(),
        cooling: rules
            .cooling_total(known_since, currency, now)
            .map(|max_minor| CoolingCap { known_since: known_since.unwrap_or_default(), max_minor }),
    };
    if let Err(reason) = check_cooling(&cap, state.paid_cooling_minor, amount.minor(), currency) {
        return Decision::RequireApproval { reason };
    }
    if let Err(reason) = check_cap(&cap, state.paid_today_minor, amount.minor(), currency) {
        return Decision::RequireApproval { reason };
    }
    Decision::Allow
}

/// Two verdicts on one call, the stricter first: a denial, then approval (both reasons), then allow.
pub fn stricter(a: Decision, b: Decision) -> Decision {
    match (a, b) {
        (Decision::Deny(r), _) | (_, Decision::Deny(r)) => Decision::Deny(r),
        (Decision::RequireApproval { reason: x }, Decision::RequireApproval { reason: y }) => {
            Decision::RequireApproval { reason: format!("{x}; {y}") }
        }
        (d @ Decision::RequireApproval { .. }, Decision::Allow) | (Decision::Allow, d) => d,
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn kes(minor: i64) -> Money {
        Money::from_minor(minor, Currency::parse("KES").unwrap()).unwrap()
    }

    fn rules(mode: PayeeMode) -> PayeeRules {
        let k = Currency::parse("KES").unwrap();
        PayeeRules {
            mode,
            cooling_off_secs: 3_600,
            new_payee_limit_minor: [(k, 10_000)].into(),
            cooling_off_total_minor: HashMap::new(),
            daily_cap_minor: [(k, 50_000)].into(),
        }
    }

    fn known(since: UnixSecs, paid: i64) -> PayeeState {
        PayeeState { known_since: Some(since), paid_today_minor: paid, paid_cooling_minor: 0 }
    }

    fn is_approval(d: &Decision) -> bool {
        matches!(d, Decision::RequireApproval { .. })
    }

    /// The names operators write in config and the store keeps: each mode round-trips, nothing
    /// else parses (a typo never means "open").
    #[test]
    fn payee_modes_read_back_as_written_and_nothing_else_parses() {
        for mode in [PayeeMode::Open, PayeeMode::Known, PayeeMode::AllowList] {
            assert_eq!(PayeeMode::parse(mode.as_str()), Some(mode));
        }
        assert_eq!(
            [PayeeMode::Open, PayeeMode::Known, PayeeMode::AllowList].map(PayeeMode::as_str),
            ["open", "known", "allow_list"]
        );
        for typo in ["", "Open", "allowlist", "allow-list", "known "] {
            assert_eq!(PayeeMode::parse(typo), None, "{typo:?}");
        }
    }

    #[test]
    fn a_revoked_payee_is_no_longer_known() {
        let mut rec = PayeeRecord {
            owner: "agent".into(),
            payee: "acct-B".into(),
            known_since: 1_000,
            added_by: "iss op".into(),
            approval_id: None,
            revoked_at: None,
            revoked_by: None,
            tag: None,
        };
        assert_eq!(rec.known_since(), Some(1_000));
        // The gateway's tag covers who may pay whom since when, on whose word.
        assert_eq!(rec.tag_fields(), serde_json::json!(["agent", "acct-B", 1_000, "iss op", null]));
        rec.revoked_at = Some(2_000);
        assert_eq!(rec.known_since(), None);
    }

    #[test]
    fn an_unknown_payee_needs_a_human_under_known_and_is_refused_under_allow_list() {
        let unknown = PayeeState::default();
        let d = decide(&rules(PayeeMode::Known), "mpesa-254712345678", unknown, kes(100), 10);
        assert!(is_approval(&d), "{d:?}");
        let d = decide(&rules(PayeeMode::AllowList), "mpesa-254712345678", unknown, kes(100), 10);
        assert_eq!(d, Decision::Deny(Refusal::PayeeNotAllowed("mpesa-254712345678".into())));
        // Open: nobody is asked about a payee, and even one minor unit is not refused.
        assert_eq!(decide(&rules(PayeeMode::Open), "x", unknown, kes(1), 10), Decision::Allow);
    }

    #[test]
    fn a_payee_in_its_cooling_off_period_is_paid_alone_only_up_to_the_new_payee_limit() {
        let r = rules(PayeeMode::Known);
        assert_eq!(decide(&r, "p", known(1_000, 0), kes(10_000), 1_000 + 3_599), Decision::Allow);
        assert!(is_approval(&decide(&r, "p", known(1_000, 0), kes(10_001), 1_000 + 3_599)));
        // Cooled off: only the daily cap bounds it.
        assert_eq!(decide(&r, "p", known(1_000, 0), kes(10_001), 1_000 + 3_600), Decision::Allow);
    }

    #[test]
    fn the_daily_cap_counts_what_the_payee_was_already_paid_today() {
        let r = rules(PayeeMode::Known);
        assert_eq!(decide(&r, "p", known(0, 40_000), kes(10_000), 10_000), Decision::Allow);
        assert!(is_approval(&decide(&r, "p", known(0, 40_001), kes(10_000), 10_000)));
        // The cap holds in open mode too, where it is configured.
        assert!(is_approval(&decide(&rules(PayeeMode::Open), "p", PayeeState::default(), kes(50_001), 0)));
        let cap = PayeeCap { owner: "a".into(), payee: "p".into(), since: 0, max_minor: Some(100), cooling: None };
        assert!(check_cap(&cap, 60, 40, Currency::parse("KES").unwrap()).is_ok());
        assert!(check_cap(&cap, 60, 41, Currency::parse("KES").unwrap()).is_err());
    }

    /// Issue 52 item 12: the cooling-off limit bounds each payment; the cooling-off total bounds
    /// what they add up to, only while the payee cools off, and a payee known again starts over.
    #[test]
    fn a_cooling_off_total_bounds_the_sum_of_payments_to_a_new_payee() {
        let k = Currency::parse("KES").unwrap();
        let r = PayeeRules { cooling_off_total_minor: [(k, 30_000)].into(), ..rules(PayeeMode::Known) };
        let cooling = |paid: i64| PayeeState { paid_cooling_minor: paid, ..known(1_000, 0) };
        assert_eq!(decide(&r, "p", cooling(20_000), kes(10_000), 2_000), Decision::Allow);
        let d = decide(&r, "p", cooling(20_001), kes(10_000), 2_000);
        assert!(is_approval(&d), "{d:?}");
        assert!(format!("{d:?}").contains("cooling-off total of 300.00"), "{d:?}");
        // Cooled off: the total no longer applies (the daily cap still does).
        assert_eq!(decide(&r, "p", cooling(20_001), kes(10_000), 1_000 + 3_600), Decision::Allow);
        assert_eq!(r.cooling_total(Some(1_000), k, 1_000 + 3_599), Some(30_000));
        assert_eq!(r.cooling_total(Some(1_000), k, 1_000 + 3_600), None);
        assert_eq!(r.cooling_total(None, k, 0), None);
        assert_eq!(r.cooling_total(Some(1_000), Currency::parse("USD").unwrap(), 1_001), None);
        // Open mode keeps no cooling-off period.
        let open = PayeeRules { mode: PayeeMode::Open, ..r.clone() };
        assert_eq!(open.cooling_total(Some(1_000), k, 1_001), None);
        let cap = PayeeCap {
            owner: "a".into(),
            payee: "p".into(),
            since: 0,
            max_minor: None,
            cooling: Some(CoolingCap { known_since: 1_000, max_minor: 100 }),
        };
        assert!(check_cooling(&cap, 60, 40, k).is_ok());
        assert!(check_cooling(&cap, 60, 41, k).is_err());
        assert!(check_cap(&cap, i64::MAX, 1, k).is_ok(), "no daily cap: nothing to exceed");
    }

    /// Issue 52 item 8: a paybill payee is the pair (paybill, account reference), and the key
    /// splits back unambiguously (no account id holds the separator).
    #[test]
    fn a_paybill_payee_is_the_pair_of_paybill_and_account_reference() {
        assert_eq!(key("mpesa-paybill-247247", Some("SUPPLIER-001")), "mpesa-paybill-247247/SUPPLIER-001");
        assert_ne!(
            key("mpesa-paybill-247247", Some("SUPPLIER-001")),
            key("mpesa-paybill-247247", Some("ATTACKER-999"))
        );
        assert_ne!(key("mpesa-paybill-247247", Some("X")), key("mpesa-paybill-247247", None));
        assert_eq!(key("mpesa-254712345678", None), "mpesa-254712345678");
        assert!(crate::domain::ids::AccountId::parse("mpesa-paybill-247247/X").is_err());
        // A reference holding the separator still splits at the first one, after the account.
        let k = key("mpesa-paybill-1", Some("a/b"));
        assert_eq!(k.split_once(REFERENCE_SEPARATOR), Some(("mpesa-paybill-1", "a/b")));
    }

    #[test]
    fn the_stricter_verdict_wins_and_approval_reasons_are_both_kept() {
        let ask = |r: &str| Decision::RequireApproval { reason: r.into() };
        let deny = Decision::Deny(Refusal::PayeeNotAllowed("p".into()));
        assert_eq!(stricter(ask("a"), deny.clone()), deny);
        assert_eq!(stricter(deny.clone(), Decision::Allow), deny);
        assert_eq!(stricter(Decision::Allow, ask("b")), ask("b"));
        assert_eq!(stricter(ask("a"), ask("b")), ask("a; b"));
        assert_eq!(stricter(Decision::Allow, Decision::Allow), Decision::Allow);
        assert!(!rules(PayeeMode::Open).applies(Currency::parse("USD").unwrap()));
        assert!(rules(PayeeMode::Open).applies(Currency::parse("KES").unwrap()));
    }
}
