//! The read tools' arguments as agents send them: field names, defaults and the JSON schemas
//! tools/list shows. The gateway takes what they hold as plain values (`gateway::PageAsk`,
//! `gateway::WindowAsk`, ids as strings it parses and refuses itself).

use schemars::JsonSchema;
use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListPaymentsArgs {
    /// Only payments touching this account (must be one of yours). Omit for all your accounts.
    #[serde(default)]
    pub account_id: Option<String>,
    /// pending | succeeded | failed
    #[serde(default)]
    pub status: Option<String>,
    /// Page size, 1-100 (default 20).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `next_cursor` from the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
    /// Only payments created at or after this instant: RFC 3339 (e.g. "2026-11-29T00:00:00Z") or a
    /// date ("2026-11-29", its start, UTC). Given with `to`: before it, at most 366 days apart.
    #[serde(default)]
    pub from: Option<String>,
    /// Only payments created before this instant, in the same forms; a bare date means the end of that day.
    #[serde(default)]
    pub to: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TodayTransactionsArgs {
    /// pending | succeeded | failed
    #[serde(default)]
    pub status: Option<String>,
    /// Page size, 1-100 (default 20).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `next_cursor` from the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct FailedTransactionsArgs {
    /// Start, inclusive: RFC 3339 or a date. Default: today (UTC).
    #[serde(default)]
    pub from: Option<String>,
    /// End, exclusive, in the same forms. Default: now. A bare date means the end of that day.
    #[serde(default)]
    pub to: Option<String>,
    /// Page size, 1-100 (default 20).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `next_cursor` from the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct AccountLedgerArgs {
    /// The account whose postings to list (must be one of yours).
    pub account_id: String,
    /// Page size, 1-100 (default 20).
    #[serde(default)]
    pub limit: Option<u32>,
    /// `next_cursor` from the previous page.
    #[serde(default)]
    pub cursor: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PaymentSummaryArgs {
    /// Start, inclusive: RFC 3339 (e.g. "2026-11-29T00:00:00Z") or a date ("2026-11-29"). Default: today (UTC).
    #[serde(default)]
    pub from: Option<String>,
    /// End, exclusive, in the same forms. Default: now. A bare date means the end of that day.
    #[serde(default)]
    pub to: Option<String>,
    /// Only this ISO 4217 currency.
    #[serde(default)]
    pub currency: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TodaySummaryArgs {
    /// Only this ISO 4217 currency.
    #[serde(default)]
    pub currency: Option<String>,
}

/// Exactly one of the two.
#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct TransactionStatusArgs {
    /// The payment id (pay_…).
    #[serde(default)]
    pub payment_id: Option<String>,
    /// The M-Pesa CheckoutRequestID of an STK push (e.g. "ws_CO_…").
    #[serde(default)]
    pub checkout_request_id: Option<String>,
}

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileArgs {
    /// Only payments created at or after this instant (RFC 3339 or a date). Default: the configured window.
    #[serde(default)]
    pub since: Option<String>,
}
