//! The tools' arguments as agents send them: field names, defaults and the JSON schemas
//! tools/list shows. The gateway takes what they hold as plain values (`gateway::PageAsk`,
//! `gateway::WindowAsk`, ids as strings it parses and refuses itself). The money tools' arguments
//! become the gateway's commands (`gateway::CreatePayment`, …) field for field.

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

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreatePaymentArgs {
    /// Your id for this payment. Reuse it to retry the SAME payment (it is never paid twice);
    /// use a new one for a new payment. 1-128 of A-Z a-z 0-9 - _ . :
    pub operation_id: String,
    /// Payer account id.
    pub from_account: String,
    /// Payee account id.
    pub to_account: String,
    /// Decimal string in major units, e.g. "50.00". No floats, signs or exponents.
    pub amount: String,
    /// ISO 4217 code, e.g. "KES".
    pub currency: String,
    /// Optional note (at most 140 characters).
    #[serde(default)]
    pub memo: Option<String>,
    /// A signed mandate from an approval, for payments over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

impl From<CreatePaymentArgs> for crate::gateway::CreatePayment {
    fn from(a: CreatePaymentArgs) -> Self {
        let CreatePaymentArgs { operation_id, from_account, to_account, amount, currency, memo, mandate } = a;
        crate::gateway::CreatePayment { operation_id, from_account, to_account, amount, currency, memo, mandate }
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RefundPaymentArgs {
    /// Your id for this refund; reuse it to retry the same refund.
    pub operation_id: String,
    /// The payment to refund (pay_…).
    pub payment_id: String,
    /// Decimal string; omit to refund everything still refundable.
    #[serde(default)]
    pub amount: Option<String>,
    /// Optional reason (at most 140 characters).
    #[serde(default)]
    pub reason: Option<String>,
    /// A signed mandate from an approval, for refunds over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

impl From<RefundPaymentArgs> for crate::gateway::RefundPayment {
    fn from(a: RefundPaymentArgs) -> Self {
        let RefundPaymentArgs { operation_id, payment_id, amount, reason, mandate } = a;
        crate::gateway::RefundPayment { operation_id, payment_id, amount, reason, mandate }
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestMpesaPaymentArgs {
    /// Your id for this collection. Reuse it to retry the SAME request: the customer is never
    /// prompted twice for one operation_id.
    pub operation_id: String,
    /// The customer's M-Pesa number: 07XXXXXXXX, 01XXXXXXXX or 2547XXXXXXXX.
    pub phone_number: String,
    /// Whole Kenyan shillings as a decimal string, e.g. "150" or "150.00".
    pub amount: String,
    /// Shown to the customer as the account (at most 12 characters).
    pub account_reference: String,
    /// Shown to the customer (at most 13 characters).
    pub description: String,
    /// A signed mandate from an approval, for collections over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

impl From<RequestMpesaPaymentArgs> for crate::gateway::RequestCollection {
    fn from(a: RequestMpesaPaymentArgs) -> Self {
        let RequestMpesaPaymentArgs { operation_id, phone_number, amount, account_reference, description, mandate } = a;
        crate::gateway::RequestCollection {
            operation_id,
            phone_number,
            amount,
            account_reference,
            description,
            mandate,
        }
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendMpesaPayoutArgs {
    /// Your id for this payout. Reuse it to retry the SAME payout: the customer is never paid
    /// twice for one operation_id.
    pub operation_id: String,
    /// The customer's M-Pesa number: 07XXXXXXXX, 01XXXXXXXX or 2547XXXXXXXX.
    pub phone_number: String,
    /// Whole Kenyan shillings as a decimal string, e.g. "150" or "150.00".
    pub amount: String,
    /// Shown on the customer's statement (at most 100 characters).
    pub remarks: String,
    /// A signed mandate from an approval, for payouts over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

impl From<SendMpesaPayoutArgs> for crate::gateway::SendPayout {
    fn from(a: SendMpesaPayoutArgs) -> Self {
        let SendMpesaPayoutArgs { operation_id, phone_number, amount, remarks, mandate } = a;
        crate::gateway::SendPayout { operation_id, phone_number, amount, remarks, mandate }
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendAirtelPayoutArgs {
    /// Your id for this payout. Reuse it to retry the SAME payout: the customer is never paid
    /// twice for one operation_id.
    pub operation_id: String,
    /// The customer's Airtel Money Kenya number: 073XXXXXXX, 075XXXXXXX, 078XXXXXXX, 010XXXXXXX or
    /// 254 followed by the 9 digits.
    pub phone_number: String,
    /// Whole Kenyan shillings as a decimal string, e.g. "150" or "150.00".
    pub amount: String,
    /// Shown to the customer (at most 25 characters).
    pub remarks: String,
    /// A signed mandate from an approval, for payouts over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

impl From<SendAirtelPayoutArgs> for crate::gateway::SendPayout {
    fn from(a: SendAirtelPayoutArgs) -> Self {
        let SendAirtelPayoutArgs { operation_id, phone_number, amount, remarks, mandate } = a;
        crate::gateway::SendPayout { operation_id, phone_number, amount, remarks, mandate }
    }
}

/// `request_payment`'s arguments: `request_mpesa_payment`'s, and the rail. (The schema only: the
/// call runs as the chosen rail's tool, with `rail` taken out.)
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RequestPaymentArgs {
    /// Your id for this payment. Reuse it to retry the SAME payment: one prompt per operation_id
    /// (it is the chosen rail's tool's operation_id too).
    pub operation_id: String,
    /// The payer's Kenyan mobile number: 07XXXXXXXX, 01XXXXXXXX or 2547XXXXXXXX. Its operator
    /// chooses the rail unless `rail` is given.
    pub phone_number: String,
    /// Whole Kenyan shillings as a decimal string, e.g. "150".
    pub amount: String,
    /// Shown to the payer as the account being paid (at most 12 characters).
    pub account_reference: String,
    /// Shown to the payer (at most 13 characters).
    pub description: String,
    /// "mpesa" or "airtel" to choose the rail yourself.
    #[serde(default)]
    pub rail: Option<String>,
    /// A signed mandate from an approval, for payments over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

/// `send_payment`'s arguments: `send_mpesa_payout`'s, and the rail (the schema only, as
/// [`RequestPaymentArgs`]).
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SendPaymentArgs {
    /// Your id for this payout. Reuse it to retry the SAME payout: the customer is never paid
    /// twice for one operation_id.
    pub operation_id: String,
    /// The customer's Kenyan mobile number. Its operator chooses the rail unless `rail` is given.
    pub phone_number: String,
    /// Whole Kenyan shillings as a decimal string, e.g. "150".
    pub amount: String,
    /// Shown on the customer's statement (at most 100 characters).
    pub remarks: String,
    /// "mpesa" to choose the rail yourself (the only one that pays customers here).
    #[serde(default)]
    pub rail: Option<String>,
    /// A signed mandate from an approval, for payouts over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PayPaybillArgs {
    /// Your id for this payment. Reuse it to retry the SAME payment: the business is never paid
    /// twice for one operation_id.
    pub operation_id: String,
    /// The business's M-Pesa paybill number (5-7 digits), e.g. "888880".
    pub paybill: String,
    /// The account the payment is for at that business (the account number on the bill; at most
    /// 13 characters).
    pub account_reference: String,
    /// Whole Kenyan shillings as a decimal string, e.g. "2500" or "2500.00".
    pub amount: String,
    /// Kept with the payment (at most 100 characters).
    pub remarks: String,
    /// A signed mandate from an approval, for payments over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

impl From<PayPaybillArgs> for crate::gateway::PayBusiness {
    fn from(a: PayPaybillArgs) -> Self {
        let PayPaybillArgs { operation_id, paybill, account_reference, amount, remarks, mandate } = a;
        crate::gateway::PayBusiness {
            operation_id,
            kind: crate::backend::rail::BusinessKind::Paybill,
            number: paybill,
            account_reference: Some(account_reference),
            amount,
            remarks,
            mandate,
        }
    }
}

#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PayTillArgs {
    /// Your id for this payment. Reuse it to retry the SAME payment: the business is never paid
    /// twice for one operation_id.
    pub operation_id: String,
    /// The business's M-Pesa till (Buy Goods) number (5-7 digits), e.g. "5123456".
    pub till: String,
    /// Whole Kenyan shillings as a decimal string, e.g. "2500" or "2500.00".
    pub amount: String,
    /// Kept with the payment (at most 100 characters).
    pub remarks: String,
    /// A signed mandate from an approval, for payments over the autonomous limit.
    #[serde(default)]
    pub mandate: Option<String>,
}

impl From<PayTillArgs> for crate::gateway::PayBusiness {
    fn from(a: PayTillArgs) -> Self {
        let PayTillArgs { operation_id, till, amount, remarks, mandate } = a;
        crate::gateway::PayBusiness {
            operation_id,
            kind: crate::backend::rail::BusinessKind::Till,
            number: till,
            account_reference: None,
            amount,
            remarks,
            mandate,
        }
    }
}

#[derive(Debug, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckPaymentPolicyArgs {
    /// The money tool to ask about: create_payment, refund_payment, send_mpesa_payout, send_airtel_payout,
    /// pay_paybill, pay_till, request_mpesa_payment (or initiate_stk_push), request_airtel_payment,
    /// request_payment (or initiate_payment) or send_payment.
    pub tool: String,
    /// Exactly the arguments you would pass to that tool (operation_id included).
    pub arguments: serde_json::Map<String, serde_json::Value>,
}
