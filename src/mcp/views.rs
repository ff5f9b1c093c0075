//! Result shapes the agent sees (and their output schemas). Amounts are decimal strings.

use schemars::JsonSchema;
use serde::Serialize;

use crate::backend::{Balance, IntegrityReport, LedgerEntry, Payment};
use crate::clock::rfc3339;
use crate::gateway::{Executed, encode_cursor};
use crate::money::format_minor;

#[derive(Debug, Serialize, JsonSchema)]
pub struct PaymentView {
    pub payment_id: String,
    /// payment | refund
    pub kind: String,
    /// pending | succeeded | failed
    pub status: String,
    pub from_account: String,
    pub to_account: String,
    pub amount: String,
    pub currency: String,
    pub amount_refunded: String,
    /// For a refund: the payment it returns money from.
    pub refund_of: Option<String>,
    pub memo: Option<String>,
    pub created_at: String,
}

impl From<&Payment> for PaymentView {
    fn from(p: &Payment) -> Self {
        PaymentView {
            payment_id: p.id.to_string(),
            kind: p.kind.as_str().into(),
            status: p.status.as_str().into(),
            from_account: p.from_account.to_string(),
            to_account: p.to_account.to_string(),
            amount: p.amount(),
            currency: p.currency.to_string(),
            amount_refunded: format_minor(p.refunded_minor, p.currency),
            refund_of: p.refund_of.as_ref().map(ToString::to_string),
            memo: p.memo.clone(),
            created_at: rfc3339(p.created_at),
        }
    }
}

/// The result of a money-moving call.
#[derive(Debug, Serialize, JsonSchema)]
pub struct PaymentResult {
    #[serde(flatten)]
    pub payment: PaymentView,
    /// True when this call returned the outcome of an earlier call with the same operation_id
    /// (nothing moved again).
    pub replayed: bool,
}

impl From<Executed> for PaymentResult {
    fn from(e: Executed) -> Self {
        PaymentResult { payment: (&e.payment).into(), replayed: e.replayed }
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct BalanceView {
    pub account_id: String,
    pub currency: String,
    pub balance: String,
}

impl From<Balance> for BalanceView {
    fn from(b: Balance) -> Self {
        BalanceView {
            account_id: b.account_id.to_string(),
            currency: b.currency.to_string(),
            balance: format_minor(b.balance_minor, b.currency),
        }
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct PaymentList {
    pub payments: Vec<PaymentView>,
    /// Pass back as `cursor` for the next page; null on the last page.
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct LedgerEntryView {
    pub payment_id: Option<String>,
    /// Signed: negative leaves the account, positive enters it.
    pub amount: String,
    pub currency: String,
    pub balance_after: String,
    pub description: String,
    pub created_at: String,
}

impl From<&LedgerEntry> for LedgerEntryView {
    fn from(e: &LedgerEntry) -> Self {
        LedgerEntryView {
            payment_id: e.payment_id.as_ref().map(ToString::to_string),
            amount: format_minor(e.amount_minor, e.currency),
            currency: e.currency.to_string(),
            balance_after: format_minor(e.balance_after_minor, e.currency),
            description: e.description.clone(),
            created_at: rfc3339(e.created_at),
        }
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct AccountLedger {
    pub account_id: String,
    pub entries: Vec<LedgerEntryView>,
    pub next_cursor: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CurrencySum {
    pub currency: String,
    /// Sum of all postings in minor units; zero when the ledger balances.
    pub sum_minor: i64,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct IntegrityView {
    pub ok: bool,
    pub accounts_checked: i64,
    pub postings_checked: i64,
    pub currency_sums: Vec<CurrencySum>,
    pub problems: Vec<String>,
}

impl From<IntegrityReport> for IntegrityView {
    fn from(r: IntegrityReport) -> Self {
        IntegrityView {
            ok: r.ok,
            accounts_checked: r.accounts_checked,
            postings_checked: r.postings_checked,
            currency_sums: r
                .currency_sums
                .into_iter()
                .map(|(currency, sum_minor)| CurrencySum { currency, sum_minor })
                .collect(),
            problems: r.problems,
        }
    }
}

pub fn cursor(next: Option<i64>) -> Option<String> {
    next.map(encode_cursor)
}
