//! Payments as every layer sees them: the reference ledger's rows, the requests that move money,
//! the guards drawn with them, and the pages and reports read back.

use serde::{Deserialize, Serialize};

use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::idempotency::NewIdempotencyRecord;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::{Currency, Money, format_minor};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentKind {
    Payment,
    Refund,
}

impl PaymentKind {
    pub fn as_str(self) -> &'static str {
        match self {
            PaymentKind::Payment => "payment",
            PaymentKind::Refund => "refund",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "payment" => Some(PaymentKind::Payment),
            "refund" => Some(PaymentKind::Refund),
            _ => None,
        }
    }
}

/// Payment states. `Succeeded` and `Failed` are terminal; `Pending` waits for a rail to settle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PaymentStatus {
    Pending,
    Succeeded,
    Failed,
}

impl PaymentStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            PaymentStatus::Pending => "pending",
            PaymentStatus::Succeeded => "succeeded",
            PaymentStatus::Failed => "failed",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "pending" => Some(PaymentStatus::Pending),
            "succeeded" => Some(PaymentStatus::Succeeded),
            "failed" => Some(PaymentStatus::Failed),
            _ => None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Payment {
    pub id: PaymentId,
    pub kind: PaymentKind,
    pub status: PaymentStatus,
    pub from_account: AccountId,
    pub to_account: AccountId,
    pub amount_minor: i64,
    pub currency: Currency,
    pub refunded_minor: i64,
    pub refund_of: Option<PaymentId>,
    pub memo: Option<String>,
    /// The agent that made it.
    pub principal_sub: String,
    /// The user the agent acted for (RFC 8693 delegation), if it did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub principal_user: Option<String>,
    pub created_at: UnixSecs,
}

impl Payment {
    /// The subject its budget draw is kept under (`domain::principal::usage_subject`).
    pub fn usage_subject(&self) -> String {
        crate::domain::principal::usage_subject(&self.principal_sub, self.principal_user.as_deref())
    }
    pub fn amount(&self) -> String {
        format_minor(self.amount_minor, self.currency)
    }
    pub fn refundable_minor(&self) -> i64 {
        match (self.kind, self.status) {
            (PaymentKind::Payment, PaymentStatus::Succeeded) => self.amount_minor - self.refunded_minor,
            _ => 0,
        }
    }
    pub fn touches_any(&self, accounts: &[AccountId]) -> bool {
        accounts.contains(&self.from_account) || accounts.contains(&self.to_account)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Balance {
    pub account_id: AccountId,
    pub currency: Currency,
    pub balance_minor: i64,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LedgerEntry {
    pub seq: i64,
    pub payment_id: Option<PaymentId>,
    pub amount_minor: i64,
    pub currency: Currency,
    pub balance_after_minor: i64,
    pub description: String,
    pub created_at: UnixSecs,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct IntegrityReport {
    pub ok: bool,
    pub accounts_checked: i64,
    pub postings_checked: i64,
    /// Per currency: the sum of all postings (must be zero).
    pub currency_sums: Vec<(String, i64)>,
    /// Human-readable violations; empty when `ok`.
    pub problems: Vec<String>,
    /// "full" (every posting read) or "incremental" (from the last verified checkpoint on).
    #[serde(default = "full_mode")]
    pub mode: String,
    /// Incremental: when the checkpoint it started from was taken.
    #[serde(default)]
    pub since: Option<crate::clock::UnixSecs>,
}

fn full_mode() -> String {
    "full".into()
}

#[derive(Debug, Clone, PartialEq)]
pub struct Page<T> {
    pub items: Vec<T>,
    /// Opaque: pass back to get the next page. `None` on the last page.
    pub next_cursor: Option<i64>,
}

impl<T> Page<T> {
    /// A page from up to `limit + 1` rows read newest first: the extra row, when there, only says
    /// that another page follows, whose cursor is the last kept row's.
    pub fn from_overfetch(mut rows: Vec<T>, limit: u32, cursor: impl Fn(&T) -> i64) -> Page<T> {
        let limit = limit as usize;
        let next_cursor = if rows.len() > limit {
            rows.truncate(limit);
            rows.last().map(cursor)
        } else {
            None
        };
        Page { items: rows, next_cursor }
    }
}

/// A reference-ledger account as a posting transaction reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct AccountRow {
    pub currency: Currency,
    pub balance_minor: i64,
    pub allow_overdraft: bool,
}

/// A UTC day's autonomous spending (or refunding) cap for one subject, checked where payments
/// commit so concurrent calls cannot overshoot it.
#[derive(Debug, Clone, PartialEq)]
pub struct DailyBudget {
    /// Which day's usage it caps: payments and refunds have separate budgets.
    pub kind: PaymentKind,
    /// Start of the current UTC day.
    pub since: UnixSecs,
    pub max_minor: i64,
    pub max_payments: i64,
}

/// A draw on an issued mandate: its uses and spend are checked and recorded with the payment.
#[derive(Debug, Clone, PartialEq)]
pub struct MandateDraw {
    pub mandate_id: String,
    /// The mandate itself (compact JWS), passed on to a backend that verifies it (the HTTP ledger).
    pub jws: Option<String>,
}

/// Checks that must hold in the same transaction as the posting.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Guards {
    pub budget: Option<DailyBudget>,
    pub mandate: Option<MandateDraw>,
    /// The payee's daily cap (`domain::payee`): checked and counted with the budget, under the
    /// owner's budget lock.
    pub payee: Option<crate::domain::payee::PayeeCap>,
}

/// Keys a posting transaction claims itself (backends that record in it): claiming the keys, the
/// posting, completing the keys and the audit record then commit together, as one write.
#[derive(Debug, Clone)]
pub struct Claim {
    /// In order: the operation's own key when the payment's key is anchored on a mandate, then the
    /// payment's key (`Attempt::key`).
    /// A refusal leaves under them what `domain::rules::fate` says (the store asks
    /// `StoredOutcome::after_refusal`).
    pub records: Vec<NewIdempotencyRecord>,
}

/// One attempt at a posting under its operation's key(s): what makes it exactly-once. The gateway's
/// unit of work builds it; a backend applies the posting at most once per `key`.
#[derive(Debug, Clone)]
pub struct Attempt {
    /// The idempotency key the posting is known by.
    pub key: String,
    /// A second idempotency record completed with the same outcome (the operation's own key when
    /// `key` is anchored on a closed mandate).
    pub alias_key: Option<String>,
    /// The operation's family key, for a flow one operation_id names across rails (a rail record
    /// opens under it at most once: `RailPayment::family_key`).
    pub family_key: Option<String>,
    /// The id a payment this attempt makes takes, drawn before the call so that the "allowed"
    /// record naming it is tagged by the gateway (`audit_chain::record_tag`). A replay (the key
    /// already posted) answers with the earlier payment; its record still names this id.
    pub payment_id: PaymentId,
    /// The record the attempt's first write appends, naming `payment_id`: "allowed", with the
    /// postings, by backends that record in the transaction; "submitted", with the record a rail
    /// or an external ledger opens before it sends anything (`Store::rail_open`).
    pub audit: Option<AuditRecord>,
    /// `Some`: the keys are not reserved yet; the posting transaction claims them.
    pub claim: Option<Claim>,
}

impl Attempt {
    /// An attempt under one key, already reserved by the caller: nothing claimed or recorded in the
    /// posting's transaction.
    pub fn reserved(key: impl Into<String>) -> Self {
        Attempt {
            key: key.into(),
            alias_key: None,
            family_key: None,
            payment_id: PaymentId::generate(),
            audit: None,
            claim: None,
        }
    }
}

/// Move `amount` from one account to another, exactly once per `attempt.key`.
#[derive(Debug, Clone)]
pub struct TransferRequest {
    pub attempt: Attempt,
    pub payment_id: PaymentId,
    pub from_account: AccountId,
    pub to_account: AccountId,
    pub amount: Money,
    pub memo: Option<String>,
    pub principal_sub: String,
    /// The user the agent acts for, if it does.
    pub principal_user: Option<String>,
    pub guards: Guards,
}

impl TransferRequest {
    /// The subject its budget is drawn under (`domain::principal::usage_subject`).
    pub fn usage_subject(&self) -> String {
        crate::domain::principal::usage_subject(&self.principal_sub, self.principal_user.as_deref())
    }
}

impl RefundRequest {
    /// The subject its budget is drawn under (`domain::principal::usage_subject`).
    pub fn usage_subject(&self) -> String {
        crate::domain::principal::usage_subject(&self.principal_sub, self.principal_user.as_deref())
    }
}

/// Return (part of) a succeeded payment, exactly once per `attempt.key`.
#[derive(Debug, Clone)]
pub struct RefundRequest {
    pub attempt: Attempt,
    pub refund_id: PaymentId,
    pub payment_id: PaymentId,
    /// `None` refunds everything still refundable.
    pub amount_minor: Option<i64>,
    pub reason: Option<String>,
    pub principal_sub: String,
    /// The user the agent acts for, if it does.
    pub principal_user: Option<String>,
    pub guards: Guards,
    /// Without a human: the most this payment's refunds may total (the agent's autonomous limit),
    /// checked in the posting transaction so concurrent partial refunds cannot pass it together.
    pub autonomous_cap_minor: Option<i64>,
}

#[derive(Debug, Clone, Default)]
pub struct PaymentQuery {
    /// Only payments touching one of these accounts (the principal's allow-list, or one of it).
    pub accounts: Vec<AccountId>,
    pub status: Option<PaymentStatus>,
    pub before_seq: Option<i64>,
    pub limit: u32,
    /// Only payments created at or after this instant (inclusive).
    pub from: Option<UnixSecs>,
    /// Only payments created before this instant (exclusive).
    pub to: Option<UnixSecs>,
    /// Only payments made for this user (an agent acting for someone sees that person's payments
    /// alone: `rules::authority::sees`); `Some("")`: only payments made for no one (an agent on its
    /// own token); `None`, no such filter.
    pub principal_user: Option<String>,
}

/// One account's ledger entries, newest first, below `before_seq` (a page's cursor).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EntryQuery {
    pub account: AccountId,
    pub before_seq: Option<i64>,
    pub limit: u32,
}

#[derive(Debug, Clone)]
pub struct AccountSeed {
    pub id: AccountId,
    pub currency: Currency,
    pub opening_minor: i64,
    pub allow_overdraft: bool,
}

/// Counts and totals of payments by kind, status and currency (`get_payment_summary`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SummaryRow {
    pub kind: String,
    pub status: String,
    pub currency: String,
    pub count: i64,
    pub total_minor: i64,
}

#[derive(Debug, Clone, Default)]
pub struct SummaryQuery {
    /// Only payments touching one of these accounts.
    pub accounts: Vec<AccountId>,
    /// `created_at` in `[from, to)`.
    pub from: UnixSecs,
    pub to: UnixSecs,
    pub currency: Option<Currency>,
    /// Only payments made for this user (`PaymentQuery::principal_user`).
    pub principal_user: Option<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn payment() -> Payment {
        Payment {
            id: PaymentId::parse("pay_1").unwrap(),
            kind: PaymentKind::Payment,
            status: PaymentStatus::Succeeded,
            from_account: AccountId::parse("acct-A").unwrap(),
            to_account: AccountId::parse("acct-B").unwrap(),
            amount_minor: 123_456,
            currency: Currency::parse("KES").unwrap(),
            refunded_minor: 0,
            refund_of: None,
            memo: None,
            principal_sub: "agent".into(),
            principal_user: None,
            created_at: 0,
        }
    }

    /// The names the stores keep: each kind and status reads back, nothing else parses.
    #[test]
    fn kinds_and_statuses_read_back_as_stored() {
        for kind in [PaymentKind::Payment, PaymentKind::Refund] {
            assert_eq!(PaymentKind::parse(kind.as_str()), Some(kind));
        }
        for status in [PaymentStatus::Pending, PaymentStatus::Succeeded, PaymentStatus::Failed] {
            assert_eq!(PaymentStatus::parse(status.as_str()), Some(status));
        }
        for junk in ["", "Payment", "refunded", "SUCCEEDED", "cancelled"] {
            assert_eq!((PaymentKind::parse(junk), PaymentStatus::parse(junk)), (None, None), "{junk:?}");
        }
    }

    #[test]
    fn a_payment_shows_its_amount_and_whose_budget_it_drew_on() {
        let mut p = payment();
        assert_eq!(p.amount(), "1234.56");
        assert_eq!(p.usage_subject(), "agent");
        p.principal_user = Some("alice".into());
        assert_eq!(p.usage_subject(), crate::domain::principal::usage_subject("agent", Some("alice")));
        assert_ne!(p.usage_subject(), "agent");
    }

    /// A refund draws on the budget of whoever asks for it (the agent, or the agent for its user).
    #[test]
    fn a_refund_draws_on_the_budget_of_who_asks() {
        let mut r = RefundRequest {
            attempt: Attempt::reserved("k"),
            refund_id: PaymentId::parse("pay_2").unwrap(),
            payment_id: PaymentId::parse("pay_1").unwrap(),
            amount_minor: None,
            reason: None,
            principal_sub: "agent".into(),
            principal_user: None,
            guards: Guards::default(),
            autonomous_cap_minor: None,
        };
        assert_eq!(r.usage_subject(), "agent");
        r.principal_user = Some("alice".into());
        assert_eq!(r.usage_subject(), crate::domain::principal::usage_subject("agent", Some("alice")));
    }

    #[test]
    fn a_payment_touches_either_of_its_accounts() {
        let p = payment();
        let acct = |s: &str| AccountId::parse(s).unwrap();
        assert!(p.touches_any(&[acct("acct-A")]));
        assert!(p.touches_any(&[acct("acct-B")]));
        assert!(p.touches_any(&[acct("acct-Z"), acct("acct-B")]));
        assert!(!p.touches_any(&[acct("acct-Z")]));
        assert!(!p.touches_any(&[]));
    }

    /// A report from before incremental checks existed reads as a full one.
    #[test]
    fn an_integrity_report_without_a_mode_is_a_full_one() {
        let r: IntegrityReport = serde_json::from_str(
            r#"{"ok": true, "accounts_checked": 2, "postings_checked": 4, "currency_sums": [], "problems": []}"#,
        )
        .unwrap();
        assert_eq!((r.mode.as_str(), r.since), ("full", None));
    }

    #[test]
    fn a_page_says_another_follows_only_when_a_row_was_left_over() {
        let page = |n: i64, limit| Page::from_overfetch((1..=n).collect(), limit, |r| *r * 10);
        assert_eq!(page(3, 3), Page { items: vec![1, 2, 3], next_cursor: None }, "exactly a page");
        assert_eq!(
            page(4, 3),
            Page { items: vec![1, 2, 3], next_cursor: Some(30) },
            "one more: the last kept's cursor"
        );
        assert_eq!(page(2, 3), Page { items: vec![1, 2], next_cursor: None });
        assert_eq!(page(0, 3), Page { items: vec![], next_cursor: None });
    }
}
