//! Result shapes the agent sees (and their output schemas). Amounts are decimal strings.

use schemars::JsonSchema;
use serde::Serialize;

use crate::clock::rfc3339;
use crate::domain::money::format_minor;
use crate::domain::payment::{Balance, IntegrityReport, LedgerEntry, Payment};
use crate::gateway::{Executed, Finding, PaymentPage, PaymentSummary, Receipt, ReconcileReport, encode_cursor};

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
    /// The agent that made it (its token's subject, or `act.sub` when it acted for a user).
    pub agent: String,
    /// The user the agent acted for (RFC 8693 delegation), if it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    /// For a completed payment (get_payment): where it settled and the rail's reference, e.g. the
    /// M-Pesa receipt number.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub receipt: Option<Receipt>,
}

impl PaymentView {
    pub fn with_receipt(p: &Payment, receipt: Option<Receipt>) -> Self {
        PaymentView { receipt, ..p.into() }
    }
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
            agent: p.principal_sub.clone(),
            user: p.principal_user.clone(),
            receipt: None,
        }
    }
}

/// A receipt a person can keep (`generate_receipt`): a succeeded payment, where it settled, and a
/// plain-text rendering written by the gateway alone (no memo or other free text goes into it).
#[derive(Debug, Serialize, JsonSchema)]
pub struct ReceiptDocument {
    pub payment_id: String,
    /// payment | refund
    pub kind: String,
    pub amount: String,
    pub currency: String,
    pub from_account: String,
    pub to_account: String,
    /// RFC 3339.
    pub created_at: String,
    /// Where it settled: ledger | http | mpesa
    pub rail: String,
    /// The rail's reference: the M-Pesa receipt number, or the ledger's payment id.
    pub reference: String,
    /// For M-Pesa: the STK push's CheckoutRequestID.
    pub checkout_request_id: Option<String>,
    /// For M-Pesa: the customer's number, masked.
    pub phone: Option<String>,
    /// The receipt as plain text, ready to paste.
    pub text: String,
}

impl ReceiptDocument {
    pub fn new(p: &Payment, r: Receipt) -> Self {
        let created_at = rfc3339(p.created_at);
        let mut lines = vec![
            "PAYMENT RECEIPT".to_string(),
            format!("Payment:   {}", p.id),
            format!("Type:      {}", p.kind.as_str()),
            format!("Amount:    {} {}", p.currency, p.amount()),
            format!("From:      {}", p.from_account),
            format!("To:        {}", p.to_account),
            format!("Date:      {created_at}"),
            format!("Status:    {}", p.status.as_str()),
            format!("Rail:      {}", r.rail),
            format!("Reference: {}", r.reference),
        ];
        if let Some(phone) = &r.phone {
            lines.push(format!("Phone:     {phone}"));
        }
        ReceiptDocument {
            payment_id: p.id.to_string(),
            kind: p.kind.as_str().into(),
            amount: p.amount(),
            currency: p.currency.to_string(),
            from_account: p.from_account.to_string(),
            to_account: p.to_account.to_string(),
            created_at,
            rail: r.rail,
            reference: r.reference,
            checkout_request_id: r.checkout_request_id,
            phone: r.phone,
            text: lines.join("\n"),
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

impl From<PaymentPage> for PaymentList {
    fn from(page: PaymentPage) -> Self {
        PaymentList { payments: page.items.iter().map(Into::into).collect(), next_cursor: page.next_cursor }
    }
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
    /// full (every posting read) | incremental (from the last verified checkpoint on)
    pub mode: String,
    /// Incremental: when the checkpoint it started from was taken (RFC 3339).
    pub since: Option<String>,
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
            mode: r.mode,
            since: r.since.map(crate::clock::rfc3339),
        }
    }
}

pub fn cursor(next: Option<i64>) -> Option<String> {
    next.map(encode_cursor)
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SummaryLine {
    /// payment | refund
    pub kind: String,
    /// pending | succeeded | failed
    pub status: String,
    pub currency: String,
    pub count: i64,
    /// Decimal string: the sum of the amounts.
    pub total: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SummaryView {
    /// Start (inclusive) and end (exclusive) of the window, RFC 3339.
    pub from: String,
    pub to: String,
    /// Over the payments touching your accounts, by kind, status and currency.
    pub totals: Vec<SummaryLine>,
}

impl From<PaymentSummary> for SummaryView {
    fn from(s: PaymentSummary) -> Self {
        SummaryView {
            from: rfc3339(s.from),
            to: rfc3339(s.to),
            totals: s
                .rows
                .into_iter()
                .map(|r| {
                    let total = match crate::domain::money::Currency::parse(&r.currency) {
                        Ok(c) => format_minor(r.total_minor, c),
                        Err(_) => r.total_minor.to_string(),
                    };
                    SummaryLine { kind: r.kind, status: r.status, currency: r.currency, count: r.count, total }
                })
                .collect(),
        }
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ReconcileView {
    pub since: String,
    /// The backend compared against: ledger | http.
    pub backend: String,
    pub checked: i64,
    /// Unknown outcomes settled from the backend's answer during this run.
    pub resolved: i64,
    /// Findings that need a human.
    pub problems: i64,
    pub findings: Vec<Finding>,
    pub findings_omitted: i64,
}

impl From<ReconcileReport> for ReconcileView {
    fn from(r: ReconcileReport) -> Self {
        ReconcileView {
            since: rfc3339(r.since),
            backend: r.backend.clone(),
            checked: r.checked,
            resolved: r.resolved,
            problems: r.problems() as i64,
            findings: r.findings,
            findings_omitted: r.findings_omitted,
        }
    }
}
