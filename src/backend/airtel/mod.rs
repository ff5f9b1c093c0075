//! The Airtel Money (Kenya) rail: collections, their refunds and disbursements (payouts to
//! customers), behind the [`CollectionRail`] seam — the seam's second implementation, next to
//! M-Pesa, with nothing in the gateway naming either.
//!
//! Airtel lets the merchant choose the transaction id, so the gateway sends its own payment id and
//! records it as the rail reference *before* sending. The record is opened (guards drawn) first, and
//! a retry that finds it never sends again, whatever state it is in: a collection whose answer was
//! lost is marked unknown, and — unlike M-Pesa — can still be asked about by that id, so the
//! scheduled enquiry settles it (from `rules::rail::settles_from_asked_by_own_ref`).
//!
//! Airtel's callback names neither amount nor payer ([`CollectionRail::callbacks_name_the_payment`]
//! is false): a success or failure it reports settles only once the enquiry confirms it. Only `TS`
//! is a success; `TF`/`TE` are failures; `TIP`/`TA` are still pending; anything else stays pending
//! for reconciliation, never guessed.
//!
//! A disbursement is sent under the gateway's payment id too, so one whose answer was lost is asked
//! about (`enquire_disbursement`) and settled by the scheduled enquiry like a collection; it is never
//! sent again. It is offered only with the wallet PIN and Airtel's public key configured.
//!
//! A refund reverses a succeeded collection in full, keyed by the collection's Airtel reference
//! (so Airtel itself refuses a second refund of it) and one at a time per collection
//! ([`reversal_key`]). Airtel answers a refund at once: a `SUCCESS` settles the record then and
//! there. One whose answer was lost has no id to ask by: it stays unknown, never re-sent, and
//! reconciliation reports it.
//!
//! Wire types live in [`wire`] only; this file turns them into the seam's rail-neutral values
//! ([`collection_from_args`], [`settlement_of`], [`event_from_callback`], [`settlement_from_enquiry`]).

pub mod simulator;
pub mod wire;

use std::sync::Arc;

use async_trait::async_trait;

use self::wire::{AirtelClient, AirtelError, CallbackBody, Enquiry, Msisdn, REFERENCE_CHARS_MAX, TransactionStatus};
use super::kenya::{customer_text, whole_shillings};
use super::rail::{
    Authority, CallbackChannel, CollectionArgs, CollectionRail, CollectionRefusal, CollectionRequest, PayeeArg,
    PayoutArgs, PayoutRefusal, PayoutRequest, RailEvent, ReversalRequest, Sent, ValidCollection, ValidPayout,
    send_once, settle_record,
};
use super::{BackendError, Payment, PaymentKind};
use crate::clock::Clock;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::rail::RailMove;
use crate::domain::rail::{Lookup, RailFlow, RailPayment, RailState, RailUpdate, Settlement};
use crate::domain::rules::rail as rules;
use crate::store::Store;

/// The `rail` column of Airtel Money records, and the rail's name in callback paths.
pub const RAIL: &str = "airtel";
/// The gateway's cap on a collection's description (kept as the record's memo; Airtel has no such field).
pub const DESCRIPTION_CHARS_MAX: usize = 100;
/// The reason a pending record keeps while the payer has not answered.
const STILL_PROCESSING: &str = "still being processed by Airtel Money";
/// The reason a pending record keeps when the enquiry could not be made.
const ENQUIRY_FAILED: &str = "Airtel Money enquiry failed; will ask again";
/// Airtel's answer to an enquiry about a transaction id it never received ("Transaction not found").
pub const ENQUIRY_NOT_FOUND: &str = "ESB000008";

/// The agent's arguments → a collection Airtel will take, checked in the order the agent wrote them:
/// the phone (an Airtel Kenya number, normalized), the amount (KES, whole shillings), the reference
/// the payer sees, then the description (kept as the memo).
pub fn collection_from_args(args: CollectionArgs<'_>) -> Result<ValidCollection, CollectionRefusal> {
    let phone = wire::normalize_phone(args.payer).map_err(CollectionRefusal::Payer)?;
    let amount = whole_shillings(args.amount, "Airtel Money").map_err(CollectionRefusal::Amount)?;
    let reference = customer_text(args.reference, REFERENCE_CHARS_MAX).map_err(CollectionRefusal::Reference)?;
    let description = customer_text(args.description, DESCRIPTION_CHARS_MAX).map_err(CollectionRefusal::Description)?;
    let payer_account = payer_account(&phone).map_err(|e| CollectionRefusal::Payer(e.to_string()))?;
    Ok(ValidCollection::new(phone.to_string(), payer_account, amount, reference, description))
}

/// A payout's arguments → a disbursement Airtel will take: the payee (an Airtel Kenya phone; Airtel
/// pays no businesses here), the amount (KES, whole shillings), the remarks (Airtel's `reference`,
/// shown to the payee).
pub fn payout_from_args(args: PayoutArgs<'_>) -> Result<ValidPayout, PayoutRefusal> {
    let phone = match args.payee {
        PayeeArg::Customer(phone) => wire::normalize_phone(phone).map_err(PayoutRefusal::Payee)?,
        PayeeArg::Paybill { .. } | PayeeArg::Till(_) => {
            return Err(PayoutRefusal::Payee("Airtel Money pays customers' phones only".into()));
        }
    };
    let account = payer_account(&phone).map_err(|e| PayoutRefusal::Payee(e.to_string()))?;
    let amount = whole_shillings(args.amount, "Airtel Money").map_err(PayoutRefusal::Amount)?;
    let remarks = customer_text(args.remarks, REFERENCE_CHARS_MAX).map_err(PayoutRefusal::Remarks)?;
    Ok(ValidPayout::new(phone.to_string(), account, amount, remarks))
}

/// The payer's side of a collection, or the payee's of a payout, as an account id (`airtel-2547…`).
pub fn payer_account(phone: &Msisdn) -> Result<AccountId, crate::domain::ids::IdError> {
    AccountId::parse(&format!("{RAIL}-{phone}"))
}

/// What an Airtel transaction status means for an open collection. Every arm is named: a status
/// this gateway does not know is never a success nor a failure.
pub fn settlement_of(status: &TransactionStatus, message: &str) -> Settlement {
    match status {
        TransactionStatus::Success => Settlement::Succeeded,
        TransactionStatus::Failed => {
            Settlement::Failed(with_message("Airtel Money reports the payment failed", message))
        }
        TransactionStatus::Expired => {
            Settlement::Failed("the payer did not answer the Airtel Money prompt in time (expired)".into())
        }
        TransactionStatus::InProgress => Settlement::Pending(format!("{STILL_PROCESSING} (TIP)")),
        TransactionStatus::Ambiguous => Settlement::Pending(format!("{STILL_PROCESSING} (TA: being resolved)")),
        TransactionStatus::Other(code) => {
            Settlement::Unrecognised(with_message(&format!("unrecognised Airtel Money status {:?}", code), message))
        }
    }
}

fn with_message(what: &str, message: &str) -> String {
    if message.is_empty() { what.to_string() } else { format!("{what}: {message}") }
}

/// A callback → the rail-neutral event. The transaction id is the gateway's payment id: it finds
/// the record by reference (recorded before sending) or, failing that, by id. It names no amount
/// and no payer; its word is confirmed by the enquiry.
pub fn event_from_callback(cb: CallbackBody) -> RailEvent {
    RailEvent {
        settlement: settlement_of(&cb.status, &cb.message),
        payment_ref: PaymentId::parse(&cb.id).ok(),
        rail_ref: cb.id,
        authority: Authority::Confirm,
        amount_minor: None,
        payer: None,
        receipt: cb.airtel_money_id,
    }
}

/// What an Airtel transaction status means for an open disbursement: as for a collection, but no
/// prompt is waiting for a payer.
pub fn payout_settlement_of(status: &TransactionStatus, message: &str) -> Settlement {
    match status {
        TransactionStatus::Failed => {
            Settlement::Failed(with_message("Airtel Money reports the payout failed; no money moved", message))
        }
        TransactionStatus::Expired => {
            Settlement::Failed(with_message("Airtel Money reports the payout expired; no money moved", message))
        }
        TransactionStatus::InProgress => {
            Settlement::Pending("the payout is still being processed by Airtel Money (TIP)".into())
        }
        other => settlement_of(other, message),
    }
}

/// An enquiry's answer → where the payment stands. An enquiry that could not be made (or that
/// Airtel refused, e.g. an id it does not know yet) is pending: asked again, never guessed.
pub fn settlement_from_enquiry(answer: &Result<Enquiry, AirtelError>) -> Settlement {
    match answer {
        Ok(e) => settlement_of(&e.status, &e.message),
        Err(_) => Settlement::Pending(ENQUIRY_FAILED.into()),
    }
}

/// A disbursement enquiry's answer, for a person about to settle a payout by hand.
fn lookup_of(answer: Result<Enquiry, AirtelError>) -> Lookup {
    match answer {
        Ok(e) => Lookup::Known(payout_settlement_of(&e.status, &e.message)),
        Err(AirtelError::Refused { code, .. }) if code == ENQUIRY_NOT_FOUND => Lookup::NotFound,
        Err(error) => Lookup::NoAnswer(format!("Airtel Money's enquiry failed: {error}")),
    }
}

pub struct AirtelRail {
    client: AirtelClient,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    account: AccountId,
}

impl AirtelRail {
    pub fn new(client: AirtelClient, store: Arc<dyn Store>, clock: Arc<dyn Clock>, account: AccountId) -> Self {
        AirtelRail { client, store, clock, account }
    }

    /// Keep the receipt an enquiry reported on a still-open record: a success settled by the
    /// scheduled enquiry has no callback to carry it, and Airtel's own answer outranks a callback's
    /// (unsigned) claim. A failed write is logged; the settlement still stands.
    async fn keep_receipt(&self, rec: &RailPayment, receipt: &str) {
        if rec.receipt.as_deref() == Some(receipt)
            || !rules::settles_from_asked_by_own_ref(rec.flow).contains(&rec.state)
        {
            return;
        }
        let update = RailUpdate { receipt: Some(receipt.to_string()), ..Default::default() };
        if let Err(error) = self
            .store
            .rail_transition(RailMove { id: &rec.id, from: &[rec.state], to: rec.state, update }, self.clock.now())
            .await
        {
            tracing::warn!(payment_id = %rec.id, %error, "keeping an Airtel Money receipt failed");
        }
    }
}

#[async_trait]
impl CollectionRail for AirtelRail {
    fn name(&self) -> &'static str {
        RAIL
    }

    fn circuits(&self) -> Vec<(&'static str, &'static str)> {
        self.client.circuits()
    }

    fn display_name(&self) -> &'static str {
        "Airtel Money"
    }

    fn account(&self) -> &AccountId {
        &self.account
    }

    /// Airtel's callback carries only the transaction id, a status and Airtel's reference.
    fn callbacks_name_the_payment(&self) -> bool {
        false
    }

    fn validate_collection(&self, args: CollectionArgs<'_>) -> Result<ValidCollection, CollectionRefusal> {
        collection_from_args(args)
    }

    /// Open the record (its reference is the payment id, chosen now) and send the collection once.
    async fn collect(&self, req: CollectionRequest) -> Result<Payment, BackendError> {
        let v = &req.collection;
        // Already normal: parsing again is the identity, and keeps `Msisdn` made only by parsing.
        let msisdn = wire::normalize_phone(v.payer()).map_err(BackendError::Rejected)?;
        let payer = payer_account(&msisdn).map_err(|e| BackendError::Rejected(e.to_string()))?;
        let order = &req.order;
        let mut rec =
            order.record(RAIL, (RailFlow::Collection, PaymentKind::Payment), payer, self.account.clone(), v.amount());
        rec.memo = Some(v.description().to_string());
        // Airtel's transaction id is ours: known before sending, so a lost answer can be asked about.
        rec.rail_ref = Some(order.payment_id.to_string());
        rec.phone = Some(msisdn.to_string());
        let collection = wire::Collection {
            id: order.payment_id.to_string(),
            msisdn,
            amount_whole: v.amount().minor() / 100,
            reference: v.reference().to_string(),
        };
        let client = self.client.clone();
        let what = "Airtel Money collection";
        send_once(self.store.as_ref(), self.clock.as_ref(), rec, req.order.terms(), what, |_| async move {
            match client.collect(&collection).await {
                // The transaction id is ours, recorded at opening.
                Ok(()) => Sent::Accepted { rail_ref: None },
                Err(AirtelError::Refused { code, .. }) => {
                    Sent::Refused(format!("Airtel Money refused the collection (error {code}); nothing was charged"))
                }
                Err(AirtelError::Unavailable(detail) | AirtelError::Config(detail)) => {
                    Sent::Unavailable(format!("Airtel Money: {detail}"))
                }
                Err(AirtelError::OutcomeUnknown(detail)) => Sent::Unknown(format!("Airtel Money: {detail}")),
            }
        })
        .await
    }

    fn offers(&self, flow: RailFlow) -> bool {
        match flow {
            // A refund needs no more than the collection credentials.
            RailFlow::Collection | RailFlow::Reversal => true,
            RailFlow::Payout => self.client.pays_out(),
            RailFlow::Ledger => false,
        }
    }

    fn validate_payout(&self, args: PayoutArgs<'_>) -> Result<ValidPayout, PayoutRefusal> {
        payout_from_args(args)
    }

    /// Open the record (its reference is the payment id, chosen now) and send the disbursement once.
    async fn pay_out(&self, req: PayoutRequest) -> Result<Payment, BackendError> {
        let v = &req.payout;
        let order = &req.order;
        // Already normal: parsing again is the identity.
        let msisdn = wire::normalize_phone(v.payee()).map_err(BackendError::Rejected)?;
        // Airtel's transaction id is ours (the record's reference): a lost answer can be asked about.
        let mut rec = req.record(RAIL, &self.account);
        rec.phone = Some(msisdn.to_string());
        let disbursement = wire::Disbursement {
            id: order.payment_id.to_string(),
            msisdn,
            amount_whole: v.amount().minor() / 100,
            reference: v.remarks().to_string(),
        };
        let client = self.client.clone();
        let what = "Airtel Money payout";
        send_once(self.store.as_ref(), self.clock.as_ref(), rec, req.order.terms(), what, |_| async move {
            match client.disburse(&disbursement).await {
                Ok(()) => Sent::Accepted { rail_ref: None },
                Err(AirtelError::Refused { code, message }) => {
                    Sent::Refused(format!("Airtel Money refused the payout (error {code}: {message}); no money moved"))
                }
                Err(AirtelError::Unavailable(detail) | AirtelError::Config(detail)) => {
                    Sent::Unavailable(format!("Airtel Money: {detail}"))
                }
                Err(AirtelError::OutcomeUnknown(detail)) => Sent::Unknown(format!("Airtel Money: {detail}")),
            }
        })
        .await
    }

    /// Refund a succeeded collection in full, by its Airtel reference. Airtel's `SUCCESS` settles the
    /// record at once; there is nothing to ask about later.
    async fn reverse(&self, req: ReversalRequest) -> Result<Payment, BackendError> {
        let (rec, receipt) = req.record(RAIL, "Airtel Money", self.store.as_ref()).await?;
        let client = self.client.clone();
        // Airtel's answer names the refund's reference: kept to settle the record once it is recorded.
        let done = std::sync::Mutex::new(None::<String>);
        let done_ref = &done;
        let sent = send_once(
            self.store.as_ref(),
            self.clock.as_ref(),
            rec,
            req.order.terms(),
            "Airtel Money refund",
            |_| async move {
                match client.refund(&receipt).await {
                    Ok(reference) => {
                        if let Ok(mut d) = done_ref.lock() {
                            *d = Some(reference.unwrap_or(receipt));
                        }
                        Sent::Accepted { rail_ref: None }
                    }
                    Err(AirtelError::Refused { code, message }) => Sent::Refused(format!(
                        "Airtel Money refused the refund (error {code}: {message}); no money moved"
                    )),
                    Err(AirtelError::Unavailable(detail) | AirtelError::Config(detail)) => {
                        Sent::Unavailable(format!("Airtel Money: {detail}"))
                    }
                    Err(AirtelError::OutcomeUnknown(detail)) => Sent::Unknown(format!("Airtel Money: {detail}")),
                }
            },
        )
        .await?;
        let refunded = done.lock().ok().and_then(|mut d| d.take());
        let Some(reference) = refunded else { return Ok(sent) };
        // Done at Airtel: settle it now (a failure to write leaves it pending for reconciliation).
        let settled = match self.store.rail_get(&sent.id).await {
            Ok(Some(rec)) => {
                settle_record(
                    self.store.as_ref(),
                    self.clock.as_ref(),
                    self,
                    &rec,
                    &Settlement::Succeeded,
                    Some(reference),
                    None,
                )
                .await
            }
            Ok(None) => Ok(None),
            Err(e) => Err(e),
        };
        match settled {
            Ok(Some(rec)) => Ok(rec.payment()),
            Ok(None) => Ok(sent),
            Err(error) => {
                tracing::error!(payment_id = %sent.id, %error, "recording a done Airtel Money refund failed");
                Ok(sent)
            }
        }
    }

    fn parse_callback(&self, channel: CallbackChannel, body: &[u8]) -> Result<RailEvent, String> {
        match channel {
            CallbackChannel::Prompt => wire::parse_callback(body).map(event_from_callback),
            CallbackChannel::Result | CallbackChannel::Timeout => {
                Err(format!("Airtel Money posts collection callbacks only, not to {:?}", channel.as_str()))
            }
        }
    }

    /// Ask Airtel by the transaction id recorded at opening — for a pending collection and for one
    /// whose answer was lost alike.
    async fn query(&self, rec: &RailPayment) -> Settlement {
        match (rec.flow, rec.rail_ref.as_deref()) {
            (RailFlow::Collection, Some(id)) => {
                let answer = self.client.enquire(id).await;
                match &answer {
                    Err(error) => tracing::warn!(payment_id = %rec.id, %error, "Airtel Money enquiry failed"),
                    Ok(Enquiry { status: TransactionStatus::Success, airtel_money_id: Some(receipt), .. }) => {
                        self.keep_receipt(rec, receipt).await;
                    }
                    Ok(_) => {}
                }
                settlement_from_enquiry(&answer)
            }
            (RailFlow::Payout, Some(id)) => {
                let answer = self.client.enquire_disbursement(id).await;
                match &answer {
                    Err(error) => {
                        tracing::warn!(payment_id = %rec.id, %error, "Airtel Money disbursement enquiry failed")
                    }
                    Ok(Enquiry { status: TransactionStatus::Success, airtel_money_id: Some(receipt), .. }) => {
                        self.keep_receipt(rec, receipt).await;
                    }
                    Ok(_) => {}
                }
                match answer {
                    Ok(e) => payout_settlement_of(&e.status, &e.message),
                    Err(_) => Settlement::Pending(ENQUIRY_FAILED.into()),
                }
            }
            (RailFlow::Collection | RailFlow::Payout, None) => {
                Settlement::Pending("no Airtel transaction id to ask by".into())
            }
            // A refund answers at once; one whose answer was lost has nothing to ask by.
            (RailFlow::Reversal, _) => Settlement::Pending(
                "an Airtel Money refund whose answer was lost cannot be asked about; reconciliation reports it".into(),
            ),
            (RailFlow::Ledger, _) => Settlement::Pending("not an Airtel Money request".into()),
        }
    }

    /// A payout asked about by the transaction id the gateway sent it under: Airtel knows it (its
    /// status, in progress included), or says it never received it. A refund whose answer was lost
    /// has no id to ask by.
    async fn lookup(&self, rec: &RailPayment) -> Lookup {
        match (rec.flow, rec.rail_ref.as_deref()) {
            (RailFlow::Payout, Some(id)) => lookup_of(self.client.enquire_disbursement(id).await),
            (RailFlow::Reversal, _) => Lookup::CannotBeAsked,
            _ => Lookup::Known(self.query(rec).await),
        }
    }

    fn settles_from(&self, flow: RailFlow) -> &'static [RailState] {
        // Asked by the transaction id the gateway chose and recorded before sending: a collection
        // whose answer was lost can still be asked about.
        rules::settles_from_asked_by_own_ref(flow)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::backend::rail::testing::{args, assert_collection};

    #[test]
    fn a_valid_collection_is_normalized() {
        let v = collection_from_args(args("0733 123 456", "150.00", " INV-1001 ", "Order 1001")).unwrap();
        assert_collection(&v, "254733123456", "airtel-254733123456", 15_000, ("INV-1001", "Order 1001"));
    }

    #[test]
    fn collection_refusals_name_the_argument_and_come_in_order() {
        let refusal = |a| collection_from_args(a).unwrap_err();
        assert!(matches!(refusal(args("0712345678", "cents", "", "")), CollectionRefusal::Payer(_)), "Safaricom");
        assert!(matches!(refusal(args("0733123456", "150.50", "", "")), CollectionRefusal::Amount(_)));
        assert!(matches!(refusal(args("0733123456", "0", "", "")), CollectionRefusal::Amount(_)));
        let long = "R".repeat(26);
        assert!(matches!(refusal(args("0733123456", "150", &long, "")), CollectionRefusal::Reference(_)));
        assert!(matches!(refusal(args("0733123456", "150", "INV-1", " ")), CollectionRefusal::Description(_)));
        assert_eq!(
            refusal(args("0733123456", "150.50", "r", "d")),
            CollectionRefusal::Amount("Airtel Money amounts are whole shillings, e.g. \"150\" or \"150.00\"".into())
        );
    }

    #[test]
    fn statuses_map_to_settlements_and_never_guess() {
        assert_eq!(settlement_of(&TransactionStatus::Success, ""), Settlement::Succeeded);
        assert!(
            matches!(settlement_of(&TransactionStatus::Failed, "declined"), Settlement::Failed(r) if r.contains("declined"))
        );
        assert!(matches!(settlement_of(&TransactionStatus::Expired, ""), Settlement::Failed(_)));
        assert!(matches!(settlement_of(&TransactionStatus::InProgress, ""), Settlement::Pending(_)));
        assert!(matches!(settlement_of(&TransactionStatus::Ambiguous, ""), Settlement::Pending(_)));
        assert!(matches!(settlement_of(&TransactionStatus::Other("TX".into()), ""), Settlement::Unrecognised(_)));
        // An enquiry that could not be made, or that Airtel refused, is asked again.
        for error in [
            AirtelError::Unavailable("503".into()),
            AirtelError::OutcomeUnknown("timeout".into()),
            AirtelError::Refused { code: "ESB000008".into(), message: "not found".into() },
        ] {
            assert_eq!(settlement_from_enquiry(&Err(error)), Settlement::Pending(ENQUIRY_FAILED.into()));
        }
    }

    #[test]
    fn only_airtels_not_found_leaves_a_payout_to_people() {
        assert_eq!(
            lookup_of(Err(AirtelError::Refused { code: ENQUIRY_NOT_FOUND.into(), message: "x".into() })),
            Lookup::NotFound
        );
        for error in [
            AirtelError::Refused { code: "ESB000001".into(), message: "x".into() },
            AirtelError::Unavailable("503".into()),
            AirtelError::OutcomeUnknown("timeout".into()),
        ] {
            assert!(matches!(lookup_of(Err(error)), Lookup::NoAnswer(_)));
        }
        let enquiry = |status| Enquiry { status, message: String::new(), airtel_money_id: None };
        assert_eq!(lookup_of(Ok(enquiry(TransactionStatus::Success))), Lookup::Known(Settlement::Succeeded));
        assert!(matches!(lookup_of(Ok(enquiry(TransactionStatus::InProgress))), Lookup::Known(Settlement::Pending(_))));
        assert!(matches!(lookup_of(Ok(enquiry(TransactionStatus::Failed))), Lookup::Known(Settlement::Failed(_))));
    }

    #[test]
    fn callbacks_map_to_events_that_name_no_amount_nor_payer() {
        let id = PaymentId::generate();
        let cb = CallbackBody {
            id: id.to_string(),
            status: TransactionStatus::Success,
            airtel_money_id: Some("MP210603.1234.L06941".into()),
            message: "Paid".into(),
        };
        let event = event_from_callback(cb.clone());
        assert_eq!(
            event,
            RailEvent {
                rail_ref: id.to_string(),
                payment_ref: Some(id.clone()),
                authority: Authority::Confirm,
                settlement: Settlement::Succeeded,
                amount_minor: None,
                payer: None,
                receipt: Some("MP210603.1234.L06941".into()),
            }
        );
        let other = event_from_callback(CallbackBody { id: "not-a-payment-id".into(), ..cb });
        assert_eq!(other.payment_ref, None);
    }

    #[test]
    fn payouts_pay_airtel_customers_only_in_whole_shillings() {
        let pay = |payee, amount, remarks| payout_from_args(PayoutArgs { payee, amount, remarks });
        let v = pay(PayeeArg::Customer("0733 123 456"), "250.00", " Cashback ").unwrap();
        assert_eq!((v.payee(), v.payee_account().as_str()), ("254733123456", "airtel-254733123456"));
        assert_eq!((v.amount().minor(), v.remarks(), v.business()), (25_000, "Cashback", None));
        let refusal = |payee, amount, remarks| pay(payee, amount, remarks).unwrap_err();
        assert!(matches!(refusal(PayeeArg::Customer("0712345678"), "1", "r"), PayoutRefusal::Payee(_)), "Safaricom");
        assert!(matches!(refusal(PayeeArg::Till("5123456"), "1", "r"), PayoutRefusal::Payee(_)));
        let paybill = PayeeArg::Paybill { number: "888880", account: "A-1" };
        assert!(matches!(refusal(paybill, "1", "r"), PayoutRefusal::Payee(_)));
        assert!(matches!(refusal(PayeeArg::Customer("0733123456"), "1.50", "r"), PayoutRefusal::Amount(_)));
        let long = "R".repeat(REFERENCE_CHARS_MAX + 1);
        assert!(matches!(refusal(PayeeArg::Customer("0733123456"), "1", &long), PayoutRefusal::Remarks(_)));
        assert!(matches!(refusal(PayeeArg::Customer("0733123456"), "1", " "), PayoutRefusal::Remarks(_)));
    }

    #[test]
    fn payout_statuses_settle_and_never_guess() {
        assert_eq!(payout_settlement_of(&TransactionStatus::Success, ""), Settlement::Succeeded);
        for failed in [TransactionStatus::Failed, TransactionStatus::Expired] {
            assert!(
                matches!(payout_settlement_of(&failed, "x"), Settlement::Failed(r) if r.contains("payout") && r.contains("x"))
            );
        }
        for open in [TransactionStatus::InProgress, TransactionStatus::Ambiguous] {
            assert!(matches!(payout_settlement_of(&open, ""), Settlement::Pending(_)));
        }
        assert!(matches!(
            payout_settlement_of(&TransactionStatus::Other("ZZ".into()), ""),
            Settlement::Unrecognised(_)
        ));
    }
}
