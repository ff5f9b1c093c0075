//! The Safaricom M-Pesa rail: collections by STK push (Lipa Na M-Pesa Online).
//!
//! Daraja has no idempotency key, so the gateway's own `rail_payments` record is what keeps one
//! operation to one push: the record is opened (guards drawn) before the push, and a retry that
//! finds it never pushes again — whatever state it is in. Outcomes arrive asynchronously (the
//! callback, or an STK push query by the scheduler); only ResultCode 0 settles as success, known
//! failure codes settle as failed, anything else stays pending for reconciliation.
//!
//! Wire types live in [`daraja`] only.

pub mod daraja;

use std::sync::Arc;

use self::daraja::{DarajaClient, DarajaError, Msisdn, StkPush, StkQueryOutcome};
use super::{BackendError, Guards, Payment, PaymentKind};
use crate::clock::Clock;
use crate::domain::error::StoreError;
use crate::domain::rail::{RailPayment, RailState, RailUpdate};
use crate::ids::{AccountId, PaymentId};
use crate::money::Money;
use crate::store::Store;

/// The `rail` column of M-Pesa records.
pub const RAIL: &str = "mpesa";

/// One collection asked for by an agent.
#[derive(Debug, Clone)]
pub struct Collection {
    pub idempotency_key: String,
    pub payment_id: PaymentId,
    pub phone: Msisdn,
    /// KES, whole shillings (checked by the caller).
    pub amount: Money,
    pub account_reference: String,
    pub description: String,
    pub principal_sub: String,
    pub guards: Guards,
}

/// What a result code means for a pending payment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Settlement {
    Succeeded,
    Failed(String),
    /// Not a code this gateway knows: never success; reconciliation looks at it.
    Unrecognised(String),
}

pub fn classify(result_code: i64, result_desc: &str) -> Settlement {
    if result_code == daraja::RESULT_CODE_SUCCESS {
        return Settlement::Succeeded;
    }
    match daraja::failure_reason(result_code) {
        Some(reason) => Settlement::Failed(format!("{reason} (M-Pesa result {result_code})")),
        None => Settlement::Unrecognised(format!(
            "unrecognised M-Pesa result {result_code}: {}",
            result_desc.chars().filter(|c| !c.is_control()).take(120).collect::<String>()
        )),
    }
}

/// The payer's side of a collection, as an account id (`mpesa-2547…`).
pub fn payer_account(phone: &Msisdn) -> Result<AccountId, crate::ids::IdError> {
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

    /// The gateway account collections are booked to.
    pub fn account(&self) -> &AccountId {
        &self.account
    }

    /// Open the record and send the STK push, once per idempotency key.
    pub async fn collect(&self, c: Collection) -> Result<Payment, BackendError> {
        let payer = payer_account(&c.phone).map_err(|e| BackendError::Rejected(e.to_string()))?;
        let rec = RailPayment {
            id: c.payment_id.clone(),
            idempotency_key: c.idempotency_key.clone(),
            rail: RAIL.to_string(),
            kind: PaymentKind::Payment,
            state: RailState::Submitting,
            from_account: payer.clone(),
            to_account: self.account.clone(),
            amount_minor: c.amount.minor(),
            currency: c.amount.currency(),
            refund_of: None,
            memo: Some(c.description.clone()),
            principal_sub: c.principal_sub.clone(),
            mandate_id: None,
            rail_ref: None,
            receipt: None,
            phone: Some(c.phone.to_string()),
            reason: None,
            created_at: 0,
            updated_at: 0,
        };
        let opened = self.store.rail_open(rec, c.guards.clone(), self.clock.now()).await?;
        let rec = opened.rec;
        if rec.from_account != payer || rec.amount_minor != c.amount.minor() || rec.to_account != self.account {
            return Err(BackendError::IdempotencyKeyReused);
        }
        if !opened.created {
            return match rec.state {
                RailState::Submitting | RailState::Unknown => {
                    // An earlier attempt opened this record and may have pushed (it crashed, or its
                    // lease ran out mid-call). Daraja cannot tell us, and a second push could charge
                    // twice: record it as unknown and never push again.
                    let reason = "an earlier attempt's push outcome is unknown".to_string();
                    super::mark_unknown(self.store.as_ref(), &rec.id, reason, self.clock.now()).await;
                    Err(BackendError::OutcomeUnknown(
                        "the STK push for this operation may have been sent and its answer was lost; it is not sent \
                         again. The customer may still complete it; reconciliation settles it"
                            .into(),
                    ))
                }
                _ => Ok(rec.payment()),
            };
        }
        let push = StkPush {
            phone: c.phone.clone(),
            amount_whole: c.amount.minor() / 100,
            account_reference: c.account_reference.clone(),
            description: c.description.clone(),
        };
        match self.client.stk_push(&push).await {
            Ok(accepted) => {
                let update = RailUpdate { rail_ref: Some(accepted.checkout_request_id), ..Default::default() };
                let now = self.clock.now();
                match self
                    .store
                    .rail_transition(&rec.id, &[RailState::Submitting], RailState::Pending, update, now)
                    .await
                {
                    Ok(Some(updated)) => Ok(updated.payment()),
                    Ok(None) => Err(BackendError::OutcomeUnknown("the payment record changed while pushing".into())),
                    Err(error) => {
                        // The push went out and its CheckoutRequestID could not be kept: the
                        // callback will not match; the record stays "submitting" and is reconciled.
                        tracing::error!(payment_id = %rec.id, %error, "recording an accepted STK push failed");
                        Err(BackendError::OutcomeUnknown("the push was accepted but could not be recorded".into()))
                    }
                }
            }
            Err(DarajaError::Rejected { code, .. }) => {
                self.abandon(&rec).await;
                Err(BackendError::Rejected(format!("M-Pesa refused the STK push (error {code}); nothing was charged")))
            }
            Err(DarajaError::Unavailable(detail) | DarajaError::Config(detail)) => {
                self.abandon(&rec).await;
                Err(BackendError::Unavailable(format!("M-Pesa: {detail}")))
            }
            Err(DarajaError::OutcomeUnknown(detail)) => {
                super::mark_unknown(self.store.as_ref(), &rec.id, detail.clone(), self.clock.now()).await;
                Err(BackendError::OutcomeUnknown(format!("M-Pesa: {detail}")))
            }
        }
    }

    async fn abandon(&self, rec: &RailPayment) {
        if let Err(error) = self.store.rail_abandon(&rec.id).await {
            tracing::error!(payment_id = %rec.id, %error, "abandoning a refused STK push failed");
        }
    }

    /// Settle a pending record. `None` when it was not pending (a duplicate or late outcome).
    pub async fn settle(
        &self,
        rec: &RailPayment,
        settlement: &Settlement,
        receipt: Option<String>,
    ) -> Result<Option<RailPayment>, StoreError> {
        let now = self.clock.now();
        let from = [RailState::Pending];
        match settlement {
            Settlement::Succeeded => {
                let update = RailUpdate { receipt, ..Default::default() };
                self.store.rail_transition(&rec.id, &from, RailState::Succeeded, update, now).await
            }
            Settlement::Failed(reason) => {
                let update = RailUpdate { reason: Some(reason.clone()), ..Default::default() };
                self.store.rail_transition(&rec.id, &from, RailState::Failed, update, now).await
            }
            Settlement::Unrecognised(reason) => {
                // Stays pending; the reason is kept for reconciliation.
                let update = RailUpdate { reason: Some(reason.clone()), ..Default::default() };
                self.store.rail_transition(&rec.id, &from, RailState::Pending, update, now).await
            }
        }
    }

    /// Ask Daraja where a pending push stands (STK push query). `Ok(None)`: still processing.
    pub async fn query(&self, rec: &RailPayment) -> Result<Option<(i64, String)>, DarajaError> {
        let Some(checkout) = rec.rail_ref.as_deref() else {
            return Err(DarajaError::Unavailable("no CheckoutRequestID recorded".into()));
        };
        match self.client.stk_query(checkout).await? {
            StkQueryOutcome::Pending => Ok(None),
            StkQueryOutcome::Completed { result_code, result_desc } => Ok(Some((result_code, result_desc))),
        }
    }
}
