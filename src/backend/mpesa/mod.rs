//! The Safaricom M-Pesa rail: collections by STK push (Lipa Na M-Pesa Online), payouts by B2C and
//! reversals of collections, behind the [`CollectionRail`] seam.
//!
//! Daraja has no idempotency key, so the gateway's own `rail_payments` record is what keeps one
//! operation to one push: the record is opened (guards drawn) before the push, and a retry that
//! finds it never pushes again — whatever state it is in. Outcomes arrive asynchronously (the
//! callback, or an STK push query by the scheduler); only ResultCode 0 settles as success, known
//! failure codes settle as failed, anything else stays pending for reconciliation.
//!
//! Payouts and reversals are keyed the same way (a reversal by the collection it reverses: one per
//! collection). Their results arrive at the result URL only; a payout is sent under an
//! `OriginatorConversationID` the gateway chose (its payment id), so when the answer to the request
//! is lost, the scheduler asks the Transaction Status API by that id and the answer settles it —
//! the payout itself is never sent again.
//!
//! Wire types live in [`daraja`] only; this file turns them into the seam's rail-neutral values
//! ([`collection_from_args`], [`classify`], [`event_from_callback`], [`settlement_from_query`]).

pub mod daraja;
pub mod simulator;

use std::sync::Arc;

use async_trait::async_trait;

use self::daraja::{
    ACCOUNT_REFERENCE_CHARS_MAX, ApiResult, B2B_ACCOUNT_REFERENCE_CHARS_MAX, B2bPayment, B2cPayment, BusinessTo,
    DarajaClient, DarajaError, Msisdn, REMARKS_CHARS_MAX, Reversal, Sender, StkCallback, StkPush, StkQueryOutcome,
    TRANSACTION_DESC_CHARS_MAX,
};
use super::kenya::{customer_text, whole_shillings};
use super::rail::{
    Authority, BusinessKind, CallbackChannel, CollectionArgs, CollectionRail, CollectionRefusal, CollectionRequest,
    PayeeArg, PayoutArgs, PayoutRefusal, PayoutRequest, RailEvent, RailOrder, ReversalRequest, Sent, ValidCollection,
    ValidPayout, send_once,
};
use super::{BackendError, Payment, PaymentKind};
use crate::clock::Clock;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::Money;
use crate::domain::rail::{Lookup, RailFlow, RailPayment, Settlement};
use crate::store::Store;

/// The `rail` column of M-Pesa records.
pub const RAIL: &str = "mpesa";
/// The reason a pending record keeps while the prompt is still open on the handset.
const STILL_PROCESSING: &str = "still being processed";
/// The reason a pending record keeps when the STK push query could not be made.
const QUERY_FAILED: &str = "STK push query failed; will ask again";
/// The reason an open payout or reversal keeps once its status was asked (the answer is a callback).
const STATUS_ASKED: &str = "transaction status asked; M-Pesa posts the answer";
const STATUS_FAILED: &str = "transaction status query failed; will ask again";

/// One collection asked for by an agent.
#[derive(Debug, Clone)]
pub struct Collection {
    pub order: RailOrder,
    pub phone: Msisdn,
    /// KES, whole shillings (checked by [`collection_from_args`]).
    pub amount: Money,
    pub account_reference: String,
    pub description: String,
}

/// The agent's arguments → a collection Daraja will take, checked in the order the agent wrote them:
/// the phone (normalized), the amount (KES, whole shillings), then the two texts the customer sees.
pub fn collection_from_args(args: CollectionArgs<'_>) -> Result<ValidCollection, CollectionRefusal> {
    let phone = daraja::normalize_phone(args.payer).map_err(CollectionRefusal::Payer)?;
    let amount = whole_shillings(args.amount, "M-Pesa").map_err(CollectionRefusal::Amount)?;
    let reference = customer_text(args.reference, ACCOUNT_REFERENCE_CHARS_MAX).map_err(CollectionRefusal::Reference)?;
    let description =
        customer_text(args.description, TRANSACTION_DESC_CHARS_MAX).map_err(CollectionRefusal::Description)?;
    let payer_account = payer_account(&phone).map_err(|e| CollectionRefusal::Payer(e.to_string()))?;
    Ok(ValidCollection::new(phone.to_string(), payer_account, amount, reference, description))
}

/// What a result code means for a pending payment.
pub fn classify(result_code: i64, result_desc: &str) -> Settlement {
    if result_code == daraja::RESULT_CODE_SUCCESS {
        return Settlement::Succeeded;
    }
    if result_code == daraja::RESULT_CODE_STILL_PROCESSING {
        // Not an answer yet: kept pending, and the next query asks again.
        return Settlement::Pending(format!("{STILL_PROCESSING} (M-Pesa result {result_code})"));
    }
    match daraja::failure_reason(result_code) {
        Some(reason) => Settlement::Failed(format!("{reason} (M-Pesa result {result_code})")),
        None => Settlement::Unrecognised(format!(
            "unrecognised M-Pesa result {result_code}: {}",
            result_desc.chars().filter(|c| !c.is_control()).take(120).collect::<String>()
        )),
    }
}

/// An STK callback → the rail-neutral event: the CheckoutRequestID finds the record, the result
/// code says what happened, the metadata says what was paid, by whom, under which receipt.
pub fn event_from_callback(cb: StkCallback) -> RailEvent {
    RailEvent {
        settlement: classify(cb.result_code, &cb.result_desc),
        rail_ref: cb.checkout_request_id,
        payment_ref: None,
        authority: Authority::Confirm,
        amount_minor: cb.amount_minor,
        payer: cb.phone,
        receipt: cb.receipt,
    }
}

/// A payout's, reversal's or status query's result → where the payment stands. A status answer
/// speaks of the transaction it was asked about; only "Completed" is a success.
pub fn settlement_from_result(r: &ApiResult) -> Settlement {
    let desc = || r.result_desc.chars().filter(|c| !c.is_control()).take(120).collect::<String>();
    if let Some(status) = &r.transaction_status {
        if r.result_code != "0" {
            return Settlement::Unrecognised(format!(
                "M-Pesa did not report the status (result {}): {}",
                r.result_code,
                desc()
            ));
        }
        let status: String = status.chars().filter(|c| c.is_ascii_alphanumeric() || *c == ' ').take(40).collect();
        return match status.to_ascii_lowercase().as_str() {
            "completed" => Settlement::Succeeded,
            "failed" | "cancelled" | "declined" | "expired" => {
                Settlement::Failed(format!("M-Pesa reports the transaction {status}"))
            }
            _ => Settlement::Pending(format!("M-Pesa reports the transaction {status}")),
        };
    }
    match r.result_code.parse::<i64>() {
        Ok(daraja::RESULT_CODE_SUCCESS) => Settlement::Succeeded,
        Ok(code) => match daraja::result_failure_reason(code) {
            Some(reason) => Settlement::Failed(format!("{reason} (M-Pesa result {code})")),
            None => Settlement::Unrecognised(format!("unrecognised M-Pesa result {code}: {}", desc())),
        },
        Err(_) => Settlement::Unrecognised(format!(
            "unrecognised M-Pesa result {}: {}",
            r.result_code.chars().filter(char::is_ascii_alphanumeric).take(20).collect::<String>(),
            desc()
        )),
    }
}

/// A result posted to the result URL (or a queue timeout) → the rail-neutral event. The record is
/// found by the `OriginatorConversationID`, or by the payment id the gateway put in `Occasion`.
pub fn event_from_result(r: ApiResult, channel: CallbackChannel) -> RailEvent {
    let (authority, settlement) = match channel {
        CallbackChannel::Timeout => (
            Authority::Notice,
            Settlement::Pending("the request timed out in M-Pesa's queue; its status will be asked".into()),
        ),
        CallbackChannel::Prompt | CallbackChannel::Result => (Authority::Final, settlement_from_result(&r)),
    };
    RailEvent {
        payment_ref: r.occasion.as_deref().and_then(|o| PaymentId::parse(o).ok()),
        rail_ref: r.originator_conversation_id,
        authority,
        settlement,
        amount_minor: r.amount_minor,
        payer: r.party,
        receipt: r.receipt,
    }
}

/// A payout's arguments → one Daraja will take: the payee (a phone; or a paybill and its account
/// reference, or a till), the amount (KES, whole shillings), the remarks on the statement.
pub fn payout_from_args(args: PayoutArgs<'_>) -> Result<ValidPayout, PayoutRefusal> {
    let business = |kind: BusinessKind, number: &str| {
        let number = business_number(number, kind).map_err(PayoutRefusal::Payee)?;
        let account = business_account(kind, &number).map_err(|e| PayoutRefusal::Payee(e.to_string()))?;
        Ok::<_, PayoutRefusal>((number, account))
    };
    let (payee, payee_account, business) = match args.payee {
        PayeeArg::Customer(phone) => {
            let phone = daraja::normalize_phone(phone).map_err(PayoutRefusal::Payee)?;
            let account = payer_account(&phone).map_err(|e| PayoutRefusal::Payee(e.to_string()))?;
            (phone.to_string(), account, None)
        }
        PayeeArg::Paybill { number, account } => {
            let (number, payee_account) = business(BusinessKind::Paybill, number)?;
            let reference =
                customer_text(account, B2B_ACCOUNT_REFERENCE_CHARS_MAX).map_err(PayoutRefusal::AccountReference)?;
            (number, payee_account, Some((BusinessKind::Paybill, Some(reference))))
        }
        PayeeArg::Till(number) => {
            let (number, payee_account) = business(BusinessKind::Till, number)?;
            (number, payee_account, Some((BusinessKind::Till, None)))
        }
    };
    let amount = whole_shillings(args.amount, "M-Pesa").map_err(PayoutRefusal::Amount)?;
    let remarks = customer_text(args.remarks, REMARKS_CHARS_MAX).map_err(PayoutRefusal::Remarks)?;
    let payout = ValidPayout::new(payee, payee_account, amount, remarks);
    Ok(match business {
        Some((kind, reference)) => payout.for_business(kind, reference),
        None => payout,
    })
}

/// Digits in a paybill or till number (M-Pesa short codes are 5 to 7 digits).
pub const BUSINESS_NUMBER_DIGITS: std::ops::RangeInclusive<usize> = 5..=7;

/// A paybill or till number as the agent wrote it (spaces ignored) → its digits.
pub fn business_number(input: &str, kind: BusinessKind) -> Result<String, String> {
    let digits: String = input.chars().filter(|c| *c != ' ').collect();
    if digits.bytes().all(|b| b.is_ascii_digit()) && BUSINESS_NUMBER_DIGITS.contains(&digits.len()) {
        Ok(digits)
    } else {
        Err(format!(
            "a {} number is {} to {} digits, e.g. \"888880\"",
            kind.as_str(),
            BUSINESS_NUMBER_DIGITS.start(),
            BUSINESS_NUMBER_DIGITS.end()
        ))
    }
}

/// A business's side of a payment to it, as an account id (`mpesa-paybill-888880`, `mpesa-till-5123456`).
pub fn business_account(kind: BusinessKind, number: &str) -> Result<AccountId, crate::domain::ids::IdError> {
    AccountId::parse(&format!("mpesa-{}-{number}", kind.as_str()))
}

/// The business a record pays, read back from its payee account (`None`: a customer).
fn business_of(account: &AccountId) -> Option<(BusinessKind, &str)> {
    let rest = account.as_str().strip_prefix("mpesa-")?;
    [BusinessKind::Paybill, BusinessKind::Till]
        .into_iter()
        .find_map(|k| rest.strip_prefix(k.as_str()).and_then(|r| r.strip_prefix('-')).map(|n| (k, n)))
}

/// An STK push query's answer → where the payment stands. A query that failed, or a prompt still
/// open, is pending: never guessed.
pub fn settlement_from_query(answer: &Result<StkQueryOutcome, DarajaError>) -> Settlement {
    match answer {
        Ok(StkQueryOutcome::Pending) => Settlement::Pending(STILL_PROCESSING.into()),
        Ok(StkQueryOutcome::Completed { result_code, result_desc }) => classify(*result_code, result_desc),
        Err(_) => Settlement::Pending(QUERY_FAILED.into()),
    }
}

/// The payer's side of a collection, as an account id (`mpesa-2547…`).
pub fn payer_account(phone: &Msisdn) -> Result<AccountId, crate::domain::ids::IdError> {
    // A normalized MSISDN is 12 digits, so this always parses; the error is typed all the same.
    AccountId::parse(&format!("mpesa-{phone}"))
}

pub struct MpesaRail {
    client: DarajaClient,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    account: AccountId,
}

impl MpesaRail {
    pub fn new(client: DarajaClient, store: Arc<dyn Store>, clock: Arc<dyn Clock>, account: AccountId) -> Self {
        MpesaRail { client, store, clock, account }
    }

    /// Open the record and send the STK push, once per idempotency key.
    pub async fn collect(&self, c: Collection) -> Result<Payment, BackendError> {
        let payer = payer_account(&c.phone).map_err(|e| BackendError::Rejected(e.to_string()))?;
        let mut rec =
            c.order.record(RAIL, (RailFlow::Collection, PaymentKind::Payment), payer, self.account.clone(), c.amount);
        rec.memo = Some(c.description.clone());
        rec.phone = Some(c.phone.to_string());
        let push = StkPush {
            phone: c.phone.clone(),
            amount_whole: c.amount.minor() / 100,
            account_reference: c.account_reference.clone(),
            description: c.description.clone(),
        };
        let client = self.client.clone();
        send_once(self.store.as_ref(), self.clock.as_ref(), rec, c.order.terms(), "M-Pesa STK push", |_| async move {
            match client.stk_push(&push).await {
                Ok(accepted) => Sent::Accepted { rail_ref: Some(accepted.checkout_request_id) },
                Err(error) => sent(error, "STK push", "nothing was charged"),
            }
        })
        .await
    }
}

/// A Daraja failure → what it means for the request's record. `what` names the request.
fn sent(error: DarajaError, what: &str, nothing_moved: &str) -> Sent {
    match error {
        DarajaError::Rejected { code, .. } => {
            Sent::Refused(format!("M-Pesa refused the {what} (error {code}); {nothing_moved}"))
        }
        DarajaError::Unavailable(detail) | DarajaError::Config(detail) => {
            Sent::Unavailable(format!("M-Pesa: {detail}"))
        }
        DarajaError::OutcomeUnknown(detail) => Sent::Unknown(format!("M-Pesa: {detail}")),
    }
}

#[async_trait]
impl CollectionRail for MpesaRail {
    fn name(&self) -> &'static str {
        RAIL
    }

    fn circuits(&self) -> Vec<(&'static str, &'static str)> {
        self.client.circuits()
    }

    fn display_name(&self) -> &'static str {
        "M-Pesa"
    }

    fn account(&self) -> &AccountId {
        &self.account
    }

    fn offers(&self, flow: RailFlow) -> bool {
        match flow {
            RailFlow::Collection => true,
            RailFlow::Payout | RailFlow::Reversal => self.client.initiator_configured(),
            RailFlow::Ledger => false,
        }
    }

    fn validate_collection(&self, args: CollectionArgs<'_>) -> Result<ValidCollection, CollectionRefusal> {
        collection_from_args(args)
    }

    fn pays_businesses(&self) -> bool {
        self.client.initiator_configured()
    }

    fn validate_payout(&self, args: PayoutArgs<'_>) -> Result<ValidPayout, PayoutRefusal> {
        payout_from_args(args)
    }

    async fn pay_out(&self, req: PayoutRequest) -> Result<Payment, BackendError> {
        let v = &req.payout;
        // Its reference is the payment id: what the result echoes, and what a status query asks by.
        let mut rec = req.record(RAIL, &self.account);
        let client = self.client.clone();
        let (store, clock, guards) = (self.store.as_ref(), self.clock.as_ref(), req.order.terms());
        let to = match (v.business(), v.account_reference()) {
            (None, _) => None,
            (Some(BusinessKind::Paybill), Some(reference)) => {
                Some(BusinessTo::Paybill { number: v.payee().to_string(), account_reference: reference.to_string() })
            }
            (Some(BusinessKind::Till), _) => Some(BusinessTo::Till { number: v.payee().to_string() }),
            (Some(BusinessKind::Paybill), None) => {
                return Err(BackendError::Rejected("a paybill payment needs an account reference".into()));
            }
        };
        // The counterparty a result names: the customer's phone, or the business's number.
        rec.phone = Some(match &to {
            None => daraja::normalize_phone(v.payee()).map_err(BackendError::Rejected)?.to_string(),
            Some(_) => v.payee().to_string(),
        });
        let Some(to) = to else {
            let phone = daraja::normalize_phone(v.payee()).map_err(BackendError::Rejected)?;
            return send_once(store, clock, rec, guards, "M-Pesa payout", |rec| async move {
                let payout = B2cPayment {
                    originator_conversation_id: rec.rail_ref.clone().unwrap_or_else(|| rec.id.to_string()),
                    phone,
                    amount_whole: rec.amount_minor / 100,
                    remarks: rec.memo.clone().unwrap_or_default(),
                };
                match client.b2c_payment(&payout).await {
                    // The reference was chosen before sending.
                    Ok(_) => Sent::Accepted { rail_ref: None },
                    Err(error) => sent(error, "payout", "no money moved"),
                }
            })
            .await;
        };
        send_once(store, clock, rec, guards, "M-Pesa business payment", |rec| async move {
            let payment = B2bPayment {
                originator_conversation_id: rec.rail_ref.clone().unwrap_or_else(|| rec.id.to_string()),
                to,
                amount_whole: rec.amount_minor / 100,
                remarks: rec.memo.clone().unwrap_or_default(),
            };
            match client.b2b_payment(&payment).await {
                Ok(_) => Sent::Accepted { rail_ref: None },
                Err(error) => sent(error, "business payment", "no money moved"),
            }
        })
        .await
    }

    async fn reverse(&self, req: ReversalRequest) -> Result<Payment, BackendError> {
        let (rec, receipt) = req.record(RAIL, "M-Pesa", self.store.as_ref()).await?;
        let client = self.client.clone();
        send_once(
            self.store.as_ref(),
            self.clock.as_ref(),
            rec,
            req.order.terms(),
            "M-Pesa reversal",
            |rec| async move {
                let reversal = Reversal {
                    transaction_id: receipt,
                    amount_whole: rec.amount_minor / 100,
                    remarks: rec.memo.clone().unwrap_or_else(|| "Reversal".into()),
                    occasion: rec.id.to_string(),
                };
                match client.reversal(&reversal).await {
                    // Daraja chose the reference: recorded so its result and a status query find it.
                    Ok(accepted) => Sent::Accepted { rail_ref: Some(accepted.originator_conversation_id) },
                    Err(error) => sent(error, "reversal", "no money moved"),
                }
            },
        )
        .await
    }

    async fn collect(&self, req: CollectionRequest) -> Result<Payment, BackendError> {
        let v = &req.collection;
        // Already normal: parsing again is the identity, and keeps `Msisdn` made only by parsing.
        let phone = daraja::normalize_phone(v.payer()).map_err(BackendError::Rejected)?;
        let c = Collection {
            phone,
            amount: v.amount(),
            account_reference: v.reference().to_string(),
            description: v.description().to_string(),
            order: req.order,
        };
        // The inherent `collect`, in Daraja's terms.
        MpesaRail::collect(self, c).await
    }

    fn parse_callback(&self, channel: CallbackChannel, body: &[u8]) -> Result<RailEvent, String> {
        match channel {
            CallbackChannel::Prompt => daraja::parse_callback(body).map(event_from_callback),
            CallbackChannel::Result | CallbackChannel::Timeout => {
                daraja::parse_result(body).map(|r| event_from_result(r, channel))
            }
        }
    }

    /// Daraja answers a payout's or reversal's status only by callback (`query` sends the question):
    /// there is no synchronous word to wait for, the people reading the statement decide.
    async fn lookup(&self, rec: &RailPayment) -> Lookup {
        match rec.flow {
            RailFlow::Payout | RailFlow::Reversal => Lookup::CannotBeAsked,
            RailFlow::Collection | RailFlow::Ledger => Lookup::Known(self.query(rec).await),
        }
    }

    async fn query(&self, rec: &RailPayment) -> Settlement {
        match (rec.flow, rec.rail_ref.as_deref()) {
            (RailFlow::Collection, Some(checkout)) => {
                let answer = self.client.stk_query(checkout).await;
                if let Err(error) = &answer {
                    tracing::warn!(payment_id = %rec.id, %error, "STK push query failed");
                }
                settlement_from_query(&answer)
            }
            // A push whose answer was lost has nothing to ask by: reconciliation reports it.
            (RailFlow::Collection, None) => Settlement::Pending(QUERY_FAILED.into()),
            (RailFlow::Payout | RailFlow::Reversal, Some(reference)) => {
                let sender = if business_of(&rec.to_account).is_some() { Sender::Business } else { Sender::Payouts };
                match self.client.transaction_status(reference, rec.id.as_str(), sender).await {
                    Ok(_) => Settlement::Pending(STATUS_ASKED.into()),
                    Err(error) => {
                        tracing::warn!(payment_id = %rec.id, %error, "M-Pesa transaction status query failed");
                        Settlement::Pending(STATUS_FAILED.into())
                    }
                }
            }
            // A reversal whose answer was lost: Daraja chose its reference, so there is nothing to
            // ask by; its result still finds the record by the payment id in `Occasion`.
            (RailFlow::Payout | RailFlow::Reversal, None) | (RailFlow::Ledger, _) => {
                Settlement::Pending("no M-Pesa reference to ask by; reconciliation reports it".into())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::backend::rail::testing::{args, assert_collection};

    #[test]
    fn a_valid_collection_is_normalized() {
        let v = collection_from_args(args("0712 345 678", "150.00", " INV-1001 ", "Order 1001")).unwrap();
        assert_collection(&v, "254712345678", "mpesa-254712345678", 15_000, ("INV-1001", "Order 1001"));
        // Exactly at Daraja's limits (characters, not bytes).
        let v = collection_from_args(args("254110345678", "1", "ABCDEFGHIJKL", "Malipo ya ñéü")).unwrap();
        assert_eq!((v.reference(), v.description()), ("ABCDEFGHIJKL", "Malipo ya ñéü"));
    }

    #[test]
    fn collection_refusals_name_the_argument_and_come_in_order() {
        let cases = [
            (args("+1 555 0100", "cents", "", ""), CollectionRefusal::Payer(String::new())),
            (args("0712345678", "150.50", "", ""), CollectionRefusal::Amount(String::new())),
            (args("0712345678", "-1", "", ""), CollectionRefusal::Amount(String::new())),
            (args("0712345678", "150", "THIRTEEN-CHAR", ""), CollectionRefusal::Reference(String::new())),
            (args("0712345678", "150", "INV-1", "  "), CollectionRefusal::Description(String::new())),
            (args("0712345678", "150", "INV\u{7}1", "d"), CollectionRefusal::Reference(String::new())),
        ];
        for (a, want) in cases {
            let got = collection_from_args(a).unwrap_err();
            assert_eq!(std::mem::discriminant(&got), std::mem::discriminant(&want), "{a:?}: {got:?}");
        }
        let reason = |a| match collection_from_args(a).unwrap_err() {
            CollectionRefusal::Payer(r)
            | CollectionRefusal::Amount(r)
            | CollectionRefusal::Reference(r)
            | CollectionRefusal::Description(r) => r,
        };
        // The texts the agent has always seen (the gateway adds the argument's name).
        assert!(reason(args("+1 555 0100", "150", "r", "d")).starts_with("phone number must be Kenyan (+254)"));
        assert_eq!(
            reason(args("0712345678", "150.50", "r", "d")),
            "M-Pesa amounts are whole shillings, e.g. \"150\" or \"150.00\""
        );
        assert_eq!(reason(args("0712345678", "0", "r", "d")), "amount must be greater than zero");
        assert_eq!(reason(args("0712345678", "150", "THIRTEEN-CHAR", "d")), "must be 1-12 characters");
        assert_eq!(reason(args("0712345678", "150", "r", "Fourteen chars")), "must be 1-13 characters");
        assert!(reason(args("0712345678", "150", "r", "a\tb")).starts_with("must not contain control"));
    }

    #[test]
    fn result_codes_map_to_settlements() {
        assert_eq!(classify(0, "The service request is processed successfully."), Settlement::Succeeded);
        assert_eq!(
            classify(1032, "Request cancelled by user"),
            Settlement::Failed("cancelled by the customer (M-Pesa result 1032)".into())
        );
        assert_eq!(
            classify(1037, "DS timeout user cannot be reached"),
            Settlement::Failed(
                "the customer's phone could not be reached (offline or did not respond) (M-Pesa result 1037)".into()
            )
        );
        // 4999 is Daraja's "still under processing": pending, asked again.
        assert_eq!(
            classify(4999, "still\nunder processing"),
            Settlement::Pending("still being processed (M-Pesa result 4999)".into())
        );
        // Unknown codes are never success nor failure.
        assert_eq!(
            classify(4998, "some\nnew code"),
            Settlement::Unrecognised("unrecognised M-Pesa result 4998: somenew code".into())
        );
        let Settlement::Unrecognised(long) = classify(7777, &"x".repeat(500)) else { panic!("unrecognised") };
        assert_eq!(long.len(), "unrecognised M-Pesa result 7777: ".len() + 120);
    }

    #[test]
    fn callbacks_map_to_rail_events() {
        let paid = StkCallback {
            merchant_request_id: "29115-34620561-1".into(),
            checkout_request_id: "ws_CO_191220191020363925".into(),
            result_code: 0,
            result_desc: "The service request is processed successfully.".into(),
            amount_minor: Some(100),
            receipt: Some("NLJ7RT61SV".into()),
            phone: Some("254708374149".into()),
            transaction_date: Some("20191219102115".into()),
        };
        assert_eq!(
            event_from_callback(paid.clone()),
            RailEvent {
                rail_ref: "ws_CO_191220191020363925".into(),
                payment_ref: None,
                authority: Authority::Confirm,
                settlement: Settlement::Succeeded,
                amount_minor: Some(100),
                payer: Some("254708374149".into()),
                receipt: Some("NLJ7RT61SV".into()),
            }
        );
        let cancelled = StkCallback {
            result_code: 1032,
            result_desc: "Request cancelled by user".into(),
            amount_minor: None,
            receipt: None,
            phone: None,
            transaction_date: None,
            ..paid
        };
        let event = event_from_callback(cancelled);
        assert_eq!(event.settlement, Settlement::Failed("cancelled by the customer (M-Pesa result 1032)".into()));
        assert_eq!((event.amount_minor, event.payer, event.receipt), (None, None, None));
    }

    fn api_result(code: &str, status: Option<&str>) -> ApiResult {
        ApiResult {
            result_code: code.into(),
            result_desc: "desc\n".into(),
            originator_conversation_id: "pay_1".into(),
            conversation_id: "AG_1".into(),
            transaction_id: Some("NLJ41HAY6Q".into()),
            amount_minor: Some(1_000),
            receipt: Some("NLJ41HAY6Q".into()),
            party: Some("254708374149".into()),
            transaction_status: status.map(str::to_string),
            occasion: Some(PaymentId::generate().to_string()),
        }
    }

    #[test]
    fn results_map_to_settlements_and_never_guess() {
        assert_eq!(settlement_from_result(&api_result("0", None)), Settlement::Succeeded);
        assert_eq!(
            settlement_from_result(&api_result("2001", None)),
            Settlement::Failed("the initiator information is invalid (M-Pesa result 2001)".into())
        );
        assert!(matches!(settlement_from_result(&api_result("26", None)), Settlement::Unrecognised(_)));
        assert!(matches!(settlement_from_result(&api_result("R000002", None)), Settlement::Unrecognised(_)));
        // A status query's answer speaks of the transaction asked about.
        assert_eq!(settlement_from_result(&api_result("0", Some("Completed"))), Settlement::Succeeded);
        assert!(matches!(settlement_from_result(&api_result("0", Some("Failed"))), Settlement::Failed(_)));
        assert!(matches!(settlement_from_result(&api_result("0", Some("Pending"))), Settlement::Pending(_)));
        // A status query M-Pesa could not answer ("no such transaction") is not a failure.
        assert!(matches!(settlement_from_result(&api_result("2032", Some("Unknown"))), Settlement::Unrecognised(_)));
    }

    #[test]
    fn results_map_to_final_events_and_timeouts_to_notices() {
        let r = api_result("0", None);
        let pid = r.occasion.clone();
        let event = event_from_result(r.clone(), CallbackChannel::Result);
        assert_eq!((event.authority, event.settlement.clone()), (Authority::Final, Settlement::Succeeded));
        assert_eq!((event.rail_ref.as_str(), event.payment_ref.map(|p| p.to_string())), ("pay_1", pid));
        assert_eq!((event.amount_minor, event.payer.as_deref()), (Some(1_000), Some("254708374149")));
        let notice = event_from_result(r.clone(), CallbackChannel::Timeout);
        assert_eq!(notice.authority, Authority::Notice);
        assert!(matches!(notice.settlement, Settlement::Pending(_)), "a timeout never settles");
        // An occasion that is not a payment id names no payment.
        let other = ApiResult { occasion: Some("Christmas".into()), ..r };
        assert_eq!(event_from_result(other, CallbackChannel::Result).payment_ref, None);
    }

    #[test]
    fn payouts_are_checked_like_collections() {
        let customer = |payee| PayeeArg::Customer(payee);
        let args = PayoutArgs { payee: customer("0712 345 678"), amount: "150.00", remarks: " Cashback " };
        let v = payout_from_args(args).unwrap();
        assert_eq!((v.payee(), v.payee_account().as_str()), ("254712345678", "mpesa-254712345678"));
        assert_eq!((v.amount().minor(), v.remarks(), v.business()), (15_000, "Cashback", None));
        let refusal = |payee, amount, remarks| {
            payout_from_args(PayoutArgs { payee: customer(payee), amount, remarks }).unwrap_err()
        };
        assert!(matches!(refusal("+1 555", "150", "r"), PayoutRefusal::Payee(_)));
        assert!(matches!(refusal("0712345678", "150.50", "r"), PayoutRefusal::Amount(_)));
        assert!(matches!(refusal("0712345678", "0", "r"), PayoutRefusal::Amount(_)));
        assert!(matches!(refusal("0712345678", "150", " "), PayoutRefusal::Remarks(_)));
        assert!(matches!(refusal("0712345678", "150", &"x".repeat(101)), PayoutRefusal::Remarks(_)));
    }

    #[test]
    fn business_payees_are_numbers_with_their_own_accounts() {
        let pay = |payee| payout_from_args(PayoutArgs { payee, amount: "2500", remarks: "Power bill" });
        let bill = pay(PayeeArg::Paybill { number: "888 880", account: " 1234567 " }).unwrap();
        assert_eq!((bill.payee(), bill.payee_account().as_str()), ("888880", "mpesa-paybill-888880"));
        assert_eq!((bill.business(), bill.account_reference()), (Some(BusinessKind::Paybill), Some("1234567")));
        let till = pay(PayeeArg::Till("5123456")).unwrap();
        assert_eq!((till.payee(), till.payee_account().as_str()), ("5123456", "mpesa-till-5123456"));
        assert_eq!((till.business(), till.account_reference()), (Some(BusinessKind::Till), None));
        assert_eq!(business_of(bill.payee_account()), Some((BusinessKind::Paybill, "888880")));
        assert_eq!(business_of(till.payee_account()), Some((BusinessKind::Till, "5123456")));
        assert_eq!(business_of(&AccountId::parse("mpesa-254712345678").unwrap()), None);
        // Four or eight digits, letters, a phone: not a business number.
        for number in ["1234", "12345678", "88888O", "", "0712345678"] {
            let e = pay(PayeeArg::Till(number)).unwrap_err();
            assert!(matches!(&e, PayoutRefusal::Payee(m) if m.contains("till number is 5 to 7 digits")), "{e:?}");
        }
        assert!(
            pay(PayeeArg::Paybill { number: "12345", account: "" })
                .is_err_and(|e| matches!(e, PayoutRefusal::AccountReference(_)))
        );
        let long = "x".repeat(14);
        assert!(
            pay(PayeeArg::Paybill { number: "12345", account: &long })
                .is_err_and(|e| matches!(e, PayoutRefusal::AccountReference(_)))
        );
        assert!(pay(PayeeArg::Paybill { number: "12345", account: "a\u{7}" }).is_err());
        // The payee is checked first, then the account, then the amount.
        let both = payout_from_args(PayoutArgs {
            payee: PayeeArg::Paybill { number: "1", account: "" },
            amount: "x",
            remarks: "r",
        });
        assert!(matches!(both, Err(PayoutRefusal::Payee(_))));
    }

    #[test]
    fn query_answers_map_to_settlements() {
        assert_eq!(settlement_from_query(&Ok(StkQueryOutcome::Pending)), Settlement::Pending(STILL_PROCESSING.into()));
        let done = |code: i64| Ok(StkQueryOutcome::Completed { result_code: code, result_desc: "d".into() });
        assert_eq!(settlement_from_query(&done(0)), Settlement::Succeeded);
        assert!(matches!(settlement_from_query(&done(1037)), Settlement::Failed(_)));
        assert!(matches!(settlement_from_query(&done(4999)), Settlement::Pending(_)));
        assert!(matches!(settlement_from_query(&done(4998)), Settlement::Unrecognised(_)));
        // A query that could not be made is never a guess: pending, asked again.
        for error in [
            DarajaError::Unavailable("503".into()),
            DarajaError::OutcomeUnknown("timeout".into()),
            DarajaError::Rejected { code: "400.002.02".into(), message: "Bad Request".into() },
        ] {
            assert_eq!(settlement_from_query(&Err(error)), Settlement::Pending(QUERY_FAILED.into()));
        }
    }
}
