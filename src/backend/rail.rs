//! The rail seam: a rail that collects money from outside (a customer's phone wallet) into a
//! gateway account, asynchronously, and — when it offers them — pays out to a customer and
//! reverses a collection. M-Pesa (`backend::mpesa`) and Airtel Money Kenya (`backend::airtel`,
//! collections only) implement it; the second was added without touching the gateway.
//!
//! Architecture Invariant: nothing here names a vendor. A rail validates its own arguments (payer
//! handle, amount granularity, text limits), sends its own requests, and parses its own callbacks
//! and status answers into [`RailEvent`] and [`Settlement`]; the gateway sees no wire field and no
//! result code. What a settlement does to the gateway's record (`rail_payments`) is the same for
//! every rail: only `pending` moves, by compare-and-set.

use std::future::Future;

use async_trait::async_trait;

use super::{BackendError, Guards, Payment, PaymentKind};
use crate::clock::Clock;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::Money;
use crate::domain::rail::RailMove;
use crate::domain::rail::{Lookup, RailFlow, RailPayment, RailState, RailUpdate, Settlement};
use crate::domain::rules::rail as rules;
use crate::store::Store;

/// A collection as the agent asked for it, before the rail has looked at it.
#[derive(Debug, Clone, Copy)]
pub struct CollectionArgs<'a> {
    /// Who pays: a handle in the rail's own forms (a phone number for M-Pesa).
    pub payer: &'a str,
    /// A decimal string in major units; the rail decides the currency and the granularity.
    pub amount: &'a str,
    /// Shown to the payer as the account being paid.
    pub reference: &'a str,
    /// Shown to the payer.
    pub description: &'a str,
}

/// Which argument a rail refused, and why. The gateway names the argument for the agent; the
/// reason never echoes a secret.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CollectionRefusal {
    /// The payer handle is not one this rail can reach (a whole sentence).
    Payer(String),
    /// Malformed, or not an amount this rail can collect (a whole sentence).
    Amount(String),
    /// The reference: the reason reads after the argument's name ("must be 1-12 characters").
    Reference(String),
    /// The description: the reason reads after the argument's name.
    Description(String),
}

/// A collection a rail accepted: the payer handle normalized, the amount in the rail's currency,
/// the texts within the rail's limits. Only a rail makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidCollection {
    payer: String,
    payer_account: AccountId,
    amount: Money,
    reference: String,
    description: String,
}

impl ValidCollection {
    pub(crate) fn new(
        payer: String,
        payer_account: AccountId,
        amount: Money,
        reference: String,
        description: String,
    ) -> Self {
        ValidCollection { payer, payer_account, amount, reference, description }
    }
    /// The payer handle in the rail's normal form (what the record and a callback's payer hold).
    pub fn payer(&self) -> &str {
        &self.payer
    }
    /// The payer's side of the collection, as an account id.
    pub fn payer_account(&self) -> &AccountId {
        &self.payer_account
    }
    pub fn amount(&self) -> Money {
        self.amount
    }
    pub fn reference(&self) -> &str {
        &self.reference
    }
    pub fn description(&self) -> &str {
        &self.description
    }
}

/// Who a payout pays, as the agent wrote it.
#[derive(Debug, Clone, Copy)]
pub enum PayeeArg<'a> {
    /// A customer: a handle in the rail's own forms (a phone number for M-Pesa).
    Customer(&'a str),
    /// A business's bill-payment number, and the account the payment is for at that business
    /// (the customer number on a utility bill, an invoice number).
    Paybill { number: &'a str, account: &'a str },
    /// A business's till (buy goods).
    Till(&'a str),
}

/// A payout as the agent asked for it, before the rail has looked at it.
#[derive(Debug, Clone, Copy)]
pub struct PayoutArgs<'a> {
    pub payee: PayeeArg<'a>,
    /// A decimal string in major units; the rail decides the currency and the granularity.
    pub amount: &'a str,
    /// Shown on the payee's statement.
    pub remarks: &'a str,
}

/// Which payout argument a rail refused, and why (the same sentence forms as [`CollectionRefusal`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PayoutRefusal {
    /// The payee (the phone, paybill or till): a whole sentence.
    Payee(String),
    /// A paybill's account reference: the reason reads after the argument's name.
    AccountReference(String),
    Amount(String),
    Remarks(String),
}

/// Which kind of business a payout pays.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BusinessKind {
    Paybill,
    Till,
}

impl BusinessKind {
    /// The argument that names it ("paybill", "till"), and the middle of its payee account id.
    pub fn as_str(self) -> &'static str {
        match self {
            BusinessKind::Paybill => "paybill",
            BusinessKind::Till => "till",
        }
    }
}

/// A payout a rail accepted. Only a rail makes one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidPayout {
    payee: String,
    payee_account: AccountId,
    amount: Money,
    remarks: String,
    business: Option<(BusinessKind, Option<String>)>,
}

impl ValidPayout {
    pub(crate) fn new(payee: String, payee_account: AccountId, amount: Money, remarks: String) -> Self {
        ValidPayout { payee, payee_account, amount, remarks, business: None }
    }
    /// A payout to a business: `payee` is its number; a paybill carries the account reference.
    pub(crate) fn for_business(self, kind: BusinessKind, account_reference: Option<String>) -> Self {
        ValidPayout { business: Some((kind, account_reference)), ..self }
    }
    /// The payee in the rail's normal form: a customer's phone, or a business's number.
    pub fn payee(&self) -> &str {
        &self.payee
    }
    pub fn payee_account(&self) -> &AccountId {
        &self.payee_account
    }
    pub fn amount(&self) -> Money {
        self.amount
    }
    pub fn remarks(&self) -> &str {
        &self.remarks
    }
    /// The kind of business paid, or `None` for a customer.
    pub fn business(&self) -> Option<BusinessKind> {
        self.business.as_ref().map(|(k, _)| *k)
    }
    /// A paybill payment's account reference.
    pub fn account_reference(&self) -> Option<&str> {
        self.business.as_ref().and_then(|(_, r)| r.as_deref())
    }
}

/// What every request to a rail carries, after policy: the key it is sent under, the payment id
/// chosen for it, who asks, and what it draws where its record opens.
#[derive(Debug, Clone)]
pub struct RailOrder {
    pub idempotency_key: String,
    /// The operation's family key (`Attempt::family_key`), which its record opens under.
    pub family_key: Option<String>,
    pub payment_id: PaymentId,
    pub principal_sub: String,
    /// The user the agent acts for, if it does.
    pub principal_user: Option<String>,
    pub guards: Guards,
    /// The "submitted" audit record naming `payment_id`, appended with the record when it opens.
    pub audit: Option<AuditRecord>,
}

impl RailOrder {
    /// What its record's opening draws and appends: the guards and the "submitted" record.
    pub fn terms(&self) -> (Guards, Option<AuditRecord>) {
        (self.guards.clone(), self.audit.clone())
    }

    /// The record a rail (or the journal around an external ledger) opens for this order before it
    /// sends anything: `Submitting`, moving `amount` from `from` to `to`; `rail_open` stamps it and
    /// names its mandate. The sender fills in what else it knows (memo, phone, reference).
    pub fn record(
        &self,
        rail: &str,
        (flow, kind): (RailFlow, PaymentKind),
        from: AccountId,
        to: AccountId,
        amount: Money,
    ) -> RailPayment {
        RailPayment {
            id: self.payment_id.clone(),
            idempotency_key: self.idempotency_key.clone(),
            rail: rail.to_string(),
            kind,
            state: RailState::Submitting,
            from_account: from,
            to_account: to,
            amount_minor: amount.minor(),
            currency: amount.currency(),
            refund_of: None,
            memo: None,
            principal_sub: self.principal_sub.clone(),
            principal_user: self.principal_user.clone(),
            mandate_id: None,
            rail_ref: None,
            receipt: None,
            phone: None,
            reason: None,
            created_at: 0,
            updated_at: 0,
            flow,
            family_key: self.family_key.clone(),
        }
    }
}

/// One payout to send, after policy.
#[derive(Debug, Clone)]
pub struct PayoutRequest {
    pub order: RailOrder,
    pub payout: ValidPayout,
}

/// The reversal of a succeeded collection, in full, after policy. The order's key is the gateway's
/// for this call; the record itself is keyed by the collection (see [`reversal_key`]), so a
/// collection has one reversal at a time whatever the operation_id.
#[derive(Debug, Clone)]
pub struct ReversalRequest {
    pub order: RailOrder,
    pub original: RailPayment,
    pub reason: Option<String>,
}

impl PayoutRequest {
    /// The payout's record for rail `rail`, opened by nobody yet: money from the rail's `account` to
    /// the payee, the remarks as its memo, and the gateway's payment id as the rail's reference —
    /// chosen before sending, so a result can echo it and a status question can ask by it even when
    /// the answer is lost.
    pub fn record(&self, rail: &str, account: &AccountId) -> RailPayment {
        let v = &self.payout;
        let mut rec = self.order.record(
            rail,
            (RailFlow::Payout, PaymentKind::Payment),
            account.clone(),
            v.payee_account().clone(),
            v.amount(),
        );
        rec.memo = Some(v.remarks().to_string());
        rec.rail_ref = Some(self.order.payment_id.to_string());
        rec
    }
}

impl ReversalRequest {
    /// The reversal's record for rail `rail` (what people call it: `display`), opened by nobody yet:
    /// money from the rail's account back to the payer, in full, keyed by the collection
    /// ([`reversal_key`]: one at a time), naming the collection it refunds; and the collection's
    /// receipt, which the rail reverses by. Only a succeeded collection with a receipt is reversed.
    pub async fn record(
        &self,
        rail: &str,
        display: &str,
        store: &dyn Store,
    ) -> Result<(RailPayment, String), BackendError> {
        let o = &self.original;
        let receipt = match (&o.receipt, o.flow, o.state) {
            (Some(r), RailFlow::Collection, RailState::Succeeded) => r.clone(),
            _ => {
                return Err(BackendError::Rejected(format!(
                    "only a succeeded {display} collection with a receipt can be reversed"
                )));
            }
        };
        let amount =
            Money::from_minor(o.amount_minor, o.currency).map_err(|e| BackendError::Rejected(e.to_string()))?;
        let mut rec = self.order.record(
            rail,
            (RailFlow::Reversal, PaymentKind::Refund),
            o.to_account.clone(),
            o.from_account.clone(),
            amount,
        );
        rec.idempotency_key = reversal_key(store, &o.id).await?;
        rec.refund_of = Some(o.id.clone());
        rec.memo = self.reason.clone();
        rec.phone = o.phone.clone();
        Ok((rec, receipt))
    }
}

/// Reversals of one collection a rail may try: after this many failed, it is for a person (the
/// rail's own portal).
pub const REVERSAL_ATTEMPTS_MAX: usize = 3;

/// The record key a reversal of `collection` is sent under now: one reversal at a time per
/// collection, whatever the operation_id. The first is `reversal/<collection>`; only after one
/// *failed* (nothing moved) may another be tried, under `…/after/<failed reversal>`. A reversal
/// pending, unknown or succeeded keeps its key, so a retry finds it and never sends another.
pub async fn reversal_key(store: &dyn Store, collection: &PaymentId) -> Result<String, BackendError> {
    let first = format!("reversal/{collection}");
    let mut key = first.clone();
    for _ in 0..REVERSAL_ATTEMPTS_MAX {
        match store.rail_by_key(&key).await? {
            Some(failed) if failed.state == RailState::Failed => key = format!("{first}/after/{}", failed.id),
            _ => return Ok(key),
        }
    }
    Err(BackendError::Rejected(format!(
        "{REVERSAL_ATTEMPTS_MAX} reversals of payment {collection} failed; reverse it on the rail's own portal"
    )))
}

/// One collection to send, after policy.
#[derive(Debug, Clone)]
pub struct CollectionRequest {
    pub order: RailOrder,
    pub collection: ValidCollection,
}

/// Which of a rail's callback addresses a callback came to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallbackChannel {
    /// The answer to a collection prompt (M-Pesa: the STK callback).
    Prompt,
    /// The result of a payout, a reversal or a status query.
    Result,
    /// A request that timed out in the rail's queue: says nothing final.
    Timeout,
}

impl CallbackChannel {
    pub fn as_str(self) -> &'static str {
        match self {
            CallbackChannel::Prompt => "stk",
            CallbackChannel::Result => "result",
            CallbackChannel::Timeout => "timeout",
        }
    }
}

/// What a callback's word is worth.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authority {
    /// A collection prompt's answer: a success or failure is confirmed by [`CollectionRail::query`]
    /// before it settles anything.
    Confirm,
    /// The result of money going out: the rail's final word (it has no synchronous query).
    Final,
    /// Informational only (a queue timeout): never settles.
    Notice,
}

/// A callback, parsed by the rail that sent the request it answers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RailEvent {
    /// The rail's reference for the request (what the rail recorded as `rail_ref`).
    pub rail_ref: String,
    /// The gateway's payment id when the callback echoes it (found by it when `rail_ref` is not
    /// recorded: the request's answer was lost).
    pub payment_ref: Option<PaymentId>,
    /// Which records it may settle: collections (`Confirm`) or money going out (`Final`).
    pub authority: Authority,
    pub settlement: Settlement,
    /// What the rail says was paid, in minor units (a success must carry it).
    pub amount_minor: Option<i64>,
    /// The customer (who paid, or who was paid), in the rail's normal form. A collection's success
    /// must carry it; a result's is checked when present.
    pub payer: Option<String>,
    /// The rail's receipt for the payment (a success must carry it).
    pub receipt: Option<String>,
}

/// A rail that collects from a payer into one gateway account. Callbacks are assumed unsigned: a
/// success is confirmed by [`CollectionRail::query`] before the gateway credits it.
#[async_trait]
pub trait CollectionRail: Send + Sync + 'static {
    /// The `rail` column of this rail's records, and the receipt's `rail` field.
    fn name(&self) -> &'static str;
    /// How agents and people know the rail ("M-Pesa").
    fn display_name(&self) -> &'static str;
    /// The gateway account collections are booked to.
    fn account(&self) -> &AccountId;
    /// Whether a collection's success callback names what was paid and by whom (M-Pesa's does).
    /// When it does, a success missing either is refused; when it does not, the rail's own status
    /// query — asked before any success settles — is the only confirmation. A claim that is present
    /// must always match the record.
    fn callbacks_name_the_payment(&self) -> bool {
        true
    }
    /// Whether this rail, as configured, offers this flow (collections always).
    fn offers(&self, flow: RailFlow) -> bool;
    /// This rail's circuit breakers: (endpoint, "closed" | "open" | "half_open"), for the health
    /// page and metrics (an open one refuses that endpoint's requests unsent).
    fn circuits(&self) -> Vec<(&'static str, &'static str)>;
    /// Parse the agent's arguments against this rail's rules, first refusal first.
    fn validate_collection(&self, args: CollectionArgs<'_>) -> Result<ValidCollection, CollectionRefusal>;
    /// Open the gateway's record and send the request, at most once per idempotency key.
    async fn collect(&self, req: CollectionRequest) -> Result<Payment, BackendError>;
    /// Whether this rail, as configured, pays businesses (paybills, tills) as well as customers.
    fn pays_businesses(&self) -> bool {
        false
    }
    /// Parse a payout's arguments (only called when [`CollectionRail::offers`] payouts, and for a
    /// business only when it [`CollectionRail::pays_businesses`]).
    fn validate_payout(&self, args: PayoutArgs<'_>) -> Result<ValidPayout, PayoutRefusal>;
    /// Open the record and send the payout, at most once per idempotency key.
    async fn pay_out(&self, req: PayoutRequest) -> Result<Payment, BackendError>;
    /// Open the record and send the reversal of a succeeded collection, one at a time per collection.
    async fn reverse(&self, req: ReversalRequest) -> Result<Payment, BackendError>;
    /// Parse a callback body that came to `channel`. `Err`: a sentence saying why it is malformed
    /// (never the body).
    fn parse_callback(&self, channel: CallbackChannel, body: &[u8]) -> Result<RailEvent, String>;
    /// Ask the rail where an open record stands. A query that fails is `Pending` (logged by the
    /// rail): it is asked again, never guessed. A rail whose status answers arrive by callback
    /// sends the question and answers `Pending`.
    async fn query(&self, rec: &RailPayment) -> Settlement;
    /// What the rail says about an open record a person is about to settle by hand: the answer
    /// of [`CollectionRail::query`] as the rail knowing the payment, unless the rail says "not
    /// found" itself (a record settled by hand only then).
    async fn lookup(&self, rec: &RailPayment) -> Lookup;
    /// The states this rail's word may settle a record from: [`rules::settles_from`], or
    /// [`rules::settles_from_asked_by_own_ref`] for a rail asked by the gateway's own reference.
    /// What the word then does is the same for every rail ([`settle_record`]).
    fn settles_from(&self, flow: RailFlow) -> &'static [RailState] {
        rules::settles_from(flow)
    }
}

/// Applies a rail's word to an open record by [`rules::settles`], the same for every rail, from
/// the states [`CollectionRail::settles_from`] allows (a receipt with a success). A success keeps
/// a receipt the record already holds (read fresh: a status answer may have kept it). `None` when
/// the record was not open (a duplicate or late outcome): nothing changed.
pub async fn settle_record(
    store: &dyn Store,
    clock: &dyn Clock,
    rail: &dyn CollectionRail,
    rec: &RailPayment,
    settlement: &Settlement,
    receipt: Option<String>,
    audit: Option<AuditRecord>,
) -> Result<Option<RailPayment>, StoreError> {
    let from = rail.settles_from(rec.flow);
    let kept_receipt = match settlement {
        Settlement::Succeeded => store.rail_get(&rec.id).await?.is_some_and(|r| r.receipt.is_some()),
        _ => false,
    };
    match rules::settles(rec, settlement, from, receipt, kept_receipt) {
        Some(mut m) => {
            m.update.audit = audit;
            store.rail_transition(m, clock.now()).await
        }
        None => Ok(None),
    }
}

/// How a rail's request ended, in the terms that decide its record's fate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sent {
    /// Accepted. `rail_ref`: the rail's reference for it, when the rail chose one (recorded).
    Accepted { rail_ref: Option<String> },
    /// Refused before anything started (a sentence for the agent): the record is abandoned.
    Refused(String),
    /// Certainly not processed, safe to try again: the record is abandoned.
    Unavailable(String),
    /// It may have been processed: the record stays, marked unknown, and is never sent again.
    Unknown(String),
}

/// Opens the gateway's record of `rec` (guards drawn once per key) and sends it **at most once**:
/// `send` runs only when this call opened the record. A record found under the key must be the
/// same request (else `IdempotencyKeyReused`); if an earlier attempt opened it and its fate is
/// open (`submitting`, `unknown`), it may have been sent, so it is marked unknown and never sent
/// again. `what` names the request for the agent ("M-Pesa payout").
///
/// Architecture Invariant: every rail request that can move money goes through here; no rail
/// re-sends one whose answer was lost.
pub async fn send_once<F, Fut>(
    store: &dyn Store,
    clock: &dyn Clock,
    rec: RailPayment,
    (guards, audit): (Guards, Option<AuditRecord>),
    what: &str,
    send: F,
) -> Result<Payment, BackendError>
where
    F: FnOnce(RailPayment) -> Fut,
    Fut: Future<Output = Sent>,
{
    let asked = rec.clone();
    let opened = store.rail_open(rec, guards, audit, clock.now()).await?;
    let rec = opened.rec;
    if !rules::same_request(&asked, &rec) {
        return Err(BackendError::IdempotencyKeyReused);
    }
    if !opened.created {
        return match rec.state {
            RailState::Submitting | RailState::Unknown => {
                let reason = format!("an earlier attempt's {what} outcome is unknown");
                super::mark_unknown(store, &rec.id, reason, clock.now()).await;
                Err(BackendError::OutcomeUnknown(format!(
                    "the {what} for this operation may have been sent and its answer was lost; it is not sent \
                     again. The rail's answer or reconciliation settles it"
                )))
            }
            _ => Ok(rec.payment()),
        };
    }
    match send(rec.clone()).await {
        Sent::Accepted { rail_ref } => {
            let update = RailUpdate { rail_ref: rail_ref.filter(|_| rec.rail_ref.is_none()), ..Default::default() };
            // From `unknown` too: another attempt found the record mid-send (a retry after this
            // attempt's lease, or another operation on the same reversal) and marked it
            // maybe-sent; the answer says what happened, and the reference lets callbacks match.
            let from = [RailState::Submitting, RailState::Unknown];
            match store
                .rail_transition(RailMove { id: &rec.id, from: &from, to: RailState::Pending, update }, clock.now())
                .await
            {
                Ok(Some(updated)) => Ok(updated.payment()),
                // The rail's result came first and settled it.
                Ok(None) => match store.rail_get(&rec.id).await {
                    Ok(Some(now)) => Ok(now.payment()),
                    _ => Err(BackendError::OutcomeUnknown(format!("the {what} record changed while sending"))),
                },
                Err(error) => {
                    // Accepted, and its reference could not be kept: the record stays open and is
                    // reconciled (a retry marks it unknown; it is never sent again).
                    tracing::error!(payment_id = %rec.id, %error, "recording an accepted {what} failed");
                    Err(BackendError::OutcomeUnknown(format!("the {what} was accepted but could not be recorded")))
                }
            }
        }
        Sent::Refused(sentence) => {
            abandon(store, &rec, what).await;
            Err(BackendError::Rejected(sentence))
        }
        Sent::Unavailable(detail) => {
            abandon(store, &rec, what).await;
            Err(BackendError::Unavailable(detail))
        }
        Sent::Unknown(detail) => {
            super::mark_unknown(store, &rec.id, detail.clone(), clock.now()).await;
            Err(BackendError::OutcomeUnknown(detail))
        }
    }
}

/// Deletes a record nothing was sent for, giving its draws back.
async fn abandon(store: &dyn Store, rec: &RailPayment, what: &str) {
    if let Err(error) = store.rail_abandon(&rec.id).await {
        tracing::error!(payment_id = %rec.id, %error, "abandoning an unsent {what} failed");
    }
}

/// What every rail's unit tests build and check a collection with.
#[cfg(test)]
pub(crate) mod testing {
    use super::{CollectionArgs, ValidCollection};

    pub fn args<'a>(payer: &'a str, amount: &'a str, reference: &'a str, description: &'a str) -> CollectionArgs<'a> {
        CollectionArgs { payer, amount, reference, description }
    }

    /// The collection as the rail's records hold it: the payer's normal form and account, the
    /// amount in KES minor units, and the two texts trimmed.
    pub fn assert_collection(v: &ValidCollection, payer: &str, account: &str, minor: i64, texts: (&str, &str)) {
        assert_eq!((v.payer(), v.payer_account().as_str()), (payer, account));
        assert_eq!((v.amount().minor(), v.amount().currency().to_string()), (minor, "KES".to_string()));
        assert_eq!((v.reference(), v.description()), texts);
    }
}
