//! `Journaled`: an external ledger behind the gateway's own record of what it asked for.
//!
//! An external backend cannot join the gateway's transactions, so the guards that the embedded
//! ledger checks where it posts (daily budget, mandate draws) are drawn here, in the gateway's
//! store, together with a `rail_payments` record, *before* the request leaves. The record then
//! follows the backend's answer:
//!
//! - success → `succeeded` (or `pending`), with the backend's reference;
//! - a business refusal or "unavailable" on a first send → the record is abandoned and its draws
//!   given back: nothing moved, the operation may be tried again;
//! - a lost answer → `unknown`. A retry of the same operation re-sends the same idempotency key and
//!   payment id (the backend applies it at most once); reconciliation settles what no retry does.
//!
//! A record found under the key on a retry is re-sent as it was, with nothing drawn again.
//!
//! Every word of the backend that moves a record (its answer, a status read by the poll job)
//! is audited in the same transaction (`RailUpdate::audit`, tagged with the gateway's link key):
//! money the backend moved is never settled in the gateway's record without a record naming it,
//! whatever becomes of the "allowed" record the gateway appends after the answer.

use std::sync::Arc;

use async_trait::async_trait;

use super::rail::RailOrder;
use super::{
    BackendError, Balance, EntryQuery, Guards, IntegrityReport, LedgerEntry, Page, Payment, PaymentBackend,
    PaymentKind, PaymentQuery, PaymentStatus, RefundRequest, TransferRequest,
};
use crate::clock::Clock;
use crate::domain::audit::AuditRecord;
use crate::domain::audit_chain::LinkKey;
use crate::domain::error::StoreError;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::Money;
use crate::domain::payment::Attempt;
use crate::domain::rail::RailMove;
use crate::domain::rail::{RailFlow, RailPayment, RailQuery, RailState, RailUpdate, Settlement};
use crate::domain::rules::fate::{self, Verdict};
use crate::domain::rules::rail as rules;
use crate::store::Store;

/// Writes of a backend's answer to its record before giving up (`record_answer`), and the wait
/// before the second, doubling after each: 100 + 200 + 400 + 800 + 1600 ms, about 3 s in all.
const RECORD_ANSWER_TRIES: u32 = 6;
const RECORD_ANSWER_FIRST_WAIT: std::time::Duration = std::time::Duration::from_millis(100);

/// Most pending records one `settle_pending` run asks the backend about.
pub const SETTLE_BATCH_MAX: u32 = 100;

pub struct Journaled {
    inner: Arc<dyn PaymentBackend>,
    store: Arc<dyn Store>,
    clock: Arc<dyn Clock>,
    /// The gateway's audit link key (`audit_chain::LINK_KEY_LABEL`): the records this journal
    /// writes are tagged as the gateway's own.
    links: LinkKey,
}

/// The decision of the record written with a backend's answer to a send.
pub const ANSWERED: &str = "answered";
/// The decision of the record written with a backend's word read later (the poll job).
pub const QUERY_SETTLED: &str = "query_settled";

impl Journaled {
    pub fn new(inner: Arc<dyn PaymentBackend>, store: Arc<dyn Store>, clock: Arc<dyn Clock>, links: LinkKey) -> Self {
        Journaled { inner, store, clock, links }
    }

    /// The audit record of a backend's word on `rec`, written in the transaction that moves the
    /// record. `opening`: the attempt's "submitted" record (its caller, tool and key are this
    /// one's); without it (the poll job), the record is the backend's, under `<backend>_callback`
    /// as a rail's word is.
    fn said(
        &self,
        opening: Option<&AuditRecord>,
        rec: &RailPayment,
        decision: &str,
        status: PaymentStatus,
        detail: String,
    ) -> AuditRecord {
        let name = self.inner.name();
        let base = match opening {
            Some(o) => o.clone(),
            None => AuditRecord {
                seq: 0,
                at: 0,
                correlation_id: "-".into(),
                principal_iss: name.to_string(),
                principal_sub: rec.principal_sub.clone(),
                principal_user: rec.principal_user.clone(),
                tool: format!("{name}_callback"),
                decision: String::new(),
                code: None,
                idempotency_key: Some(rec.idempotency_key.clone()),
                payment_id: None,
                approval_id: None,
                detail: None,
                repeats: 1,
                policy_version: None,
                intent: None,
                tag: None,
            },
        };
        let code = match status {
            PaymentStatus::Succeeded => "SUCCEEDED",
            PaymentStatus::Pending => "PENDING",
            PaymentStatus::Failed => "FAILED",
        };
        let record = AuditRecord {
            seq: 0,
            at: self.clock.now(),
            decision: decision.to_string(),
            code: Some(code.to_string()),
            payment_id: Some(rec.id.to_string()),
            detail: Some(detail),
            repeats: 1,
            // Not a decision of policy: nothing for `policy simulate` to replay.
            policy_version: None,
            intent: None,
            tag: None,
            ..base
        };
        crate::domain::audit_chain::tagged(&self.links, record, rand::random())
    }

    /// Record the backend's answer to a send of `rec`. `created`: this call opened the record, so
    /// no earlier attempt can have sent it.
    async fn settle(
        &self,
        rec: &RailPayment,
        created: bool,
        opening: Option<&AuditRecord>,
        answer: Result<Payment, BackendError>,
    ) -> Result<Payment, BackendError> {
        let now = self.clock.now();
        let open = [RailState::Submitting, RailState::Unknown];
        match answer {
            Ok(payment) => {
                let state = match payment.status {
                    PaymentStatus::Succeeded => RailState::Succeeded,
                    PaymentStatus::Pending => RailState::Pending,
                    PaymentStatus::Failed => RailState::Failed,
                };
                let detail = format!("the {} answered: {} ({})", self.inner.name(), state.as_str(), payment.id);
                let said = self.said(opening, rec, ANSWERED, payment.status, detail);
                let update =
                    RailUpdate { rail_ref: Some(payment.id.to_string()), audit: Some(said), ..Default::default() };
                let answer = RailMove { id: &rec.id, from: &open, to: state, update };
                if let Err(error) = self.record_answer(answer, now).await {
                    // The backend holds the payment. The poll job asks a backend named by the
                    // gateway's id; one that names its own payments is settled by the agent's
                    // retry (the same key replays), else reconciliation reports it.
                    tracing::error!(payment_id = %rec.id, %error, "recording a rail payment's outcome failed");
                }
                if self.inner.names_its_payments() {
                    // The gateway's id and parties; the backend's word on where it stands.
                    return Ok(Payment { status: payment.status, ..rec.payment() });
                }
                Ok(payment)
            }
            Err(error) => match fate::verdict(&error) {
                Verdict::Unknown | Verdict::Held => {
                    // (Requests to an external backend claim no keys, so it cannot say a key is
                    // held; if it does, nothing is known about the payment.)
                    let detail = detail(&error);
                    super::mark_unknown(self.store.as_ref(), &rec.id, detail.clone(), now).await;
                    Err(BackendError::OutcomeUnknown(detail))
                }
                Verdict::Unavailable if created => {
                    // Nothing reached the backend, and no earlier attempt existed: give the draws
                    // back; a retry starts afresh.
                    if let Err(e) = self.store.rail_abandon(&rec.id).await {
                        tracing::error!(payment_id = %rec.id, error = %e, "abandoning an unsent rail payment failed");
                    }
                    Err(error)
                }
                Verdict::Unavailable => {
                    // An earlier attempt may have been applied, and this one did not get through:
                    // still unknown. The record (and what it drew) stays until the backend answers.
                    let detail = detail(&error);
                    super::mark_unknown(self.store.as_ref(), &rec.id, detail.clone(), now).await;
                    Err(BackendError::OutcomeUnknown(format!(
                        "an earlier attempt's outcome is still unknown ({detail})"
                    )))
                }
                Verdict::Denied { .. } | Verdict::Failed => {
                    // The backend refused this key for good (had an earlier attempt been applied,
                    // the key would have returned its payment): nothing moved.
                    let given_back = match rec.state {
                        RailState::Submitting => self.store.rail_abandon(&rec.id).await.map(|_| ()),
                        _ => {
                            let detail = format!("the {} refused it: {error}", self.inner.name());
                            let said = self.said(opening, rec, ANSWERED, PaymentStatus::Failed, detail);
                            let update =
                                RailUpdate { reason: Some(error.to_string()), audit: Some(said), ..Default::default() };
                            self.store
                                .rail_transition(
                                    RailMove { id: &rec.id, from: &open, to: RailState::Failed, update },
                                    now,
                                )
                                .await
                                .map(|_| ())
                        }
                    };
                    if let Err(e) = given_back {
                        tracing::error!(payment_id = %rec.id, error = %e, "recording a rail refusal failed");
                    }
                    Err(error)
                }
            },
        }
    }

    /// The backend's answer written to the record, tried again a few times over a store that
    /// just went away (a database restart or failover takes about a second): the answer may be
    /// the only word the gateway gets of a payment the backend named itself.
    async fn record_answer(&self, answer: RailMove<'_>, now: crate::clock::UnixSecs) -> Result<(), StoreError> {
        let mut wait = RECORD_ANSWER_FIRST_WAIT;
        let mut tries = 1;
        loop {
            let m = RailMove { id: answer.id, from: answer.from, to: answer.to, update: answer.update.clone() };
            match self.store.rail_transition(m, now).await {
                Ok(_) => return Ok(()),
                Err(StoreError::Database(e)) if tries < RECORD_ANSWER_TRIES => {
                    tracing::warn!(payment_id = %answer.id, error = %e, tries, "recording a rail payment's outcome failed; trying again");
                    tokio::time::sleep(wait).await;
                    wait *= 2;
                    tries += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The record as it stands when a retry finds it settled.
    async fn settled(&self, rec: &RailPayment) -> Result<Payment, BackendError> {
        match self.payment(&rec.id).await {
            Ok(Some(p)) => Ok(p),
            _ => Ok(rec.payment()),
        }
    }

    /// The backend's own name for a payment the gateway knows by `id`: the record's `rail_ref`
    /// when the backend names its payments, else `id` itself. `None`: the backend never
    /// confirmed it (or the gateway never made it).
    async fn backend_ref(&self, id: &PaymentId) -> Result<Option<(Option<RailPayment>, PaymentId)>, BackendError> {
        if !self.inner.names_its_payments() {
            return Ok(Some((None, id.clone())));
        }
        let Some(rec) = self.store.rail_get(id).await? else { return Ok(None) };
        if rec.rail != self.inner.name() {
            return Ok(None);
        }
        let Some(r) = rec.rail_ref.as_deref().and_then(|r| PaymentId::parse(r).ok()) else { return Ok(None) };
        Ok(Some((Some(rec), r)))
    }

    /// A backend that lists no payments (the wallet service): its payments as the gateway recorded
    /// them, newest first, paged by the records' `seq` (exactly `query.limit` of them when there
    /// are that many, so a page read again is the same page). The poll job keeps their status.
    async fn own_records(&self, query: PaymentQuery) -> Result<Page<Payment>, BackendError> {
        let limit = query.limit as usize;
        let mut items = Vec::with_capacity(limit);
        let mut before = query.before_seq;
        loop {
            // Every rail's records (the store filters by excluding one rail): ours are kept.
            let rows = self.store.rail_payments(PaymentQuery { before_seq: before, ..query.clone() }, "").await?;
            let full = rows.len() >= limit;
            for (seq, rec) in rows {
                before = Some(seq);
                if rec.rail == self.inner.name() && rec.flow == RailFlow::Ledger {
                    items.push(rec.payment());
                    if items.len() == limit {
                        return Ok(Page { items, next_cursor: Some(seq) });
                    }
                }
            }
            if !full || limit == 0 {
                return Ok(Page { items, next_cursor: None });
            }
        }
    }

    /// One pending record asked about again: settled when the backend's word is final.
    async fn settle_one(&self, rec: &RailPayment) -> Result<bool, BackendError> {
        let Some(p) = self.payment(&rec.id).await? else { return Ok(false) };
        let settlement = match p.status {
            PaymentStatus::Succeeded => Settlement::Succeeded,
            PaymentStatus::Failed => Settlement::Failed("the ledger service failed it".into()),
            PaymentStatus::Pending => return Ok(false),
        };
        let from = rules::settles_from(rec.flow);
        let Some(mut m) = rules::settles(rec, &settlement, from, None, false) else { return Ok(false) };
        let detail = format!("the {} said: {}", self.inner.name(), m.to.as_str());
        m.update.audit = Some(self.said(None, rec, QUERY_SETTLED, p.status, detail));
        let moved = self.store.rail_transition(m, self.clock.now()).await?;
        Ok(moved.is_some_and(|r| r.state.is_terminal()))
    }

    /// One open record (`submitting` or `unknown`: its answer was lost, or arrived and could not be
    /// recorded) that no retry settled, brought to the backend's word when the backend holds the
    /// payment — as reconciliation does, within the poll job's interval instead of its window.
    /// A payment the backend does not hold stays open: a retry with the same operation_id sends it
    /// again, and reconciliation reports it. Refunds are asked about like payments, except on a
    /// backend that names its own payments (it keeps no readable refund): reconciliation's.
    async fn settle_open(&self, rec: &RailPayment) -> Result<bool, BackendError> {
        if rec.kind == PaymentKind::Refund && self.inner.names_its_payments() {
            // Its refunds are read from the gateway's own record: nothing to ask.
            return Ok(false);
        }
        let held = self.payment(&rec.id).await?;
        let Some(p) = held.filter(|p| {
            p.kind == rec.kind
                && p.refund_of == rec.refund_of
                && p.amount_minor == rec.amount_minor
                && p.currency == rec.currency
        }) else {
            // Not held (or held differently: reconciliation reports it). Touched, so the next
            // run's batch (oldest first) reaches the records behind it.
            let touch = RailMove {
                id: &rec.id,
                from: std::slice::from_ref(&rec.state),
                to: rec.state,
                update: RailUpdate::default(),
            };
            self.store.rail_transition(touch, self.clock.now()).await?;
            return Ok(false);
        };
        let to = match p.status {
            PaymentStatus::Succeeded => RailState::Succeeded,
            PaymentStatus::Failed => RailState::Failed,
            PaymentStatus::Pending => RailState::Pending,
        };
        let detail = format!("the {} holds it: {} ({})", self.inner.name(), to.as_str(), p.id);
        let said = self.said(None, rec, QUERY_SETTLED, p.status, detail);
        let update = RailUpdate { rail_ref: Some(p.id.to_string()), audit: Some(said), ..Default::default() };
        let from = [RailState::Submitting, RailState::Unknown];
        let moved =
            self.store.rail_transition(RailMove { id: &rec.id, from: &from, to, update }, self.clock.now()).await?;
        Ok(moved.is_some_and(|r| r.state.is_terminal()))
    }
}

/// What an unanswered send said, for the rail record's reason.
fn detail(e: &BackendError) -> String {
    match e {
        BackendError::OutcomeUnknown(detail) | BackendError::Unavailable(detail) => detail.clone(),
        other => other.to_string(),
    }
}

/// What the ledger is sent of a request's guards once `rail_open` has drawn them: nothing to draw,
/// only the mandate itself, which the HTTP ledger passes on (`Paygate-Mandate`) for the ledger to
/// verify the human's approval.
fn evidence_only(guards: &Guards) -> Guards {
    Guards { mandate: guards.mandate.clone(), ..Guards::default() }
}

/// The order the journal opens a ledger request's record under: the request's key, payment id and
/// principal (its guards go to `rail_open` as they are).
fn ledger_order(key: &str, payment_id: &PaymentId, principal_sub: &str, principal_user: Option<&str>) -> RailOrder {
    RailOrder {
        idempotency_key: key.to_string(),
        family_key: None,
        payment_id: payment_id.clone(),
        principal_sub: principal_sub.to_string(),
        principal_user: principal_user.map(str::to_string),
        guards: Guards::default(),
        audit: None,
    }
}

#[async_trait]
impl PaymentBackend for Journaled {
    fn name(&self) -> &'static str {
        self.inner.name()
    }

    async fn transfer(&self, req: TransferRequest) -> Result<Payment, BackendError> {
        if req.from_account == req.to_account {
            return Err(BackendError::SameAccount);
        }
        let order = ledger_order(&req.attempt.key, &req.payment_id, &req.principal_sub, req.principal_user.as_deref());
        let (from, to) = (req.from_account.clone(), req.to_account.clone());
        let mut rec = order.record(self.inner.name(), (RailFlow::Ledger, PaymentKind::Payment), from, to, req.amount);
        rec.memo = req.memo.clone();
        let opening = req.attempt.audit.clone();
        let opened = self.store.rail_open(rec, req.guards.clone(), opening.clone(), self.clock.now()).await?;
        let (rec, created) = (opened.rec, opened.created);
        if rec.kind != PaymentKind::Payment
            || rec.from_account != req.from_account
            || rec.to_account != req.to_account
            || rec.amount_minor != req.amount.minor()
            || rec.currency != req.amount.currency()
        {
            return Err(BackendError::IdempotencyKeyReused);
        }
        if !matches!(rec.state, RailState::Submitting | RailState::Unknown) {
            return self.settled(&rec).await;
        }
        if !created && !self.inner.resend_safe(rec.reason.as_deref()) {
            // Sending it again could pay twice: it stays unknown for reconciliation and a person.
            return Err(BackendError::OutcomeUnknown(format!(
                "not sent again ({}); reconciliation reports it",
                rec.reason.as_deref().unwrap_or("an earlier attempt failed")
            )));
        }
        // The first attempt's payment id and key, every time.
        let send = TransferRequest {
            attempt: Attempt::reserved(req.attempt.key.clone()),
            payment_id: rec.id.clone(),
            guards: evidence_only(&req.guards),
            memo: rec.memo.clone(),
            ..req
        };
        let answer = self.inner.transfer(send).await;
        self.settle(&rec, created, opening.as_ref(), answer).await
    }

    async fn refund(&self, req: RefundRequest) -> Result<Payment, BackendError> {
        let original = self
            .payment(&req.payment_id)
            .await?
            .ok_or_else(|| BackendError::PaymentNotFound(req.payment_id.clone()))?;
        // How the backend knows the payment (before anything is drawn).
        let Some((_, backend_ref)) = self.backend_ref(&req.payment_id).await? else {
            return Err(BackendError::PaymentNotFound(req.payment_id.clone()));
        };
        // The journal records an amount: "everything still refundable" is fixed when first sent
        // (a retry finds the record and re-sends that amount).
        let earlier = self.store.rail_by_key(&req.attempt.key).await?;
        let amount_minor = match (req.amount_minor, &earlier) {
            (Some(a), _) => a,
            (None, Some(e)) => e.amount_minor,
            (None, None) if original.refundable_minor() > 0 => original.refundable_minor(),
            (None, None) => return Err(BackendError::NotRefundable(original.id)),
        };
        let amount =
            Money::from_minor(amount_minor, original.currency).map_err(|e| BackendError::Rejected(e.to_string()))?;
        let order = ledger_order(&req.attempt.key, &req.refund_id, &req.principal_sub, req.principal_user.as_deref());
        let (from, to) = (original.to_account.clone(), original.from_account.clone());
        let mut rec = order.record(self.inner.name(), (RailFlow::Ledger, PaymentKind::Refund), from, to, amount);
        rec.refund_of = Some(req.payment_id.clone());
        rec.memo = req.reason.clone();
        let opening = req.attempt.audit.clone();
        let opened = self.store.rail_open(rec, req.guards.clone(), opening.clone(), self.clock.now()).await?;
        let (rec, created) = (opened.rec, opened.created);
        if rec.kind != PaymentKind::Refund || rec.refund_of.as_ref() != Some(&req.payment_id) {
            return Err(BackendError::IdempotencyKeyReused);
        }
        if !matches!(rec.state, RailState::Submitting | RailState::Unknown) {
            return self.settled(&rec).await;
        }
        let gateway_id = req.payment_id.clone();
        let send = RefundRequest {
            payment_id: backend_ref,
            refund_id: rec.id.clone(),
            amount_minor: Some(rec.amount_minor),
            attempt: Attempt::reserved(req.attempt.key.clone()),
            guards: evidence_only(&req.guards),
            autonomous_cap_minor: None,
            ..req
        };
        // A refusal names the payment as the agent knows it.
        let answer = self.inner.refund(send).await.map_err(|e| match e {
            BackendError::NotRefundable(_) => BackendError::NotRefundable(gateway_id.clone()),
            BackendError::PaymentNotFound(_) => BackendError::PaymentNotFound(gateway_id.clone()),
            other => other,
        });
        self.settle(&rec, created, opening.as_ref(), answer).await
    }

    async fn payment(&self, id: &PaymentId) -> Result<Option<Payment>, BackendError> {
        let Some((rec, backend_ref)) = self.backend_ref(id).await? else { return Ok(None) };
        let Some(rec) = rec else { return self.inner.payment(id).await };
        if rec.kind == PaymentKind::Refund {
            // The backend keeps no readable refund: it was final when it answered.
            return Ok(Some(rec.payment()));
        }
        // The backend keeps no refunded amount (the wallet service's payment names none): the
        // refunds the gateway recorded against it, so "everything left" is what is left.
        let refunded_minor = self.store.rail_refunded(id).await?;
        Ok(self.inner.payment(&backend_ref).await?.map(|p| Payment {
            status: p.status,
            // What the backend holds, so reconciliation sees a difference.
            amount_minor: p.amount_minor,
            currency: p.currency,
            refunded_minor,
            ..rec.payment()
        }))
    }

    async fn settle_pending(&self, older_than_secs: i64, deadline: std::time::Instant) -> usize {
        // Pending records, and open ones (sent, answer lost or never recorded) that no retry
        // settled: the backend's word on each, asked by id, never by sending it again.
        let due = RailQuery {
            rail: Some(self.inner.name().into()),
            states: vec![RailState::Pending, RailState::Unknown, RailState::Submitting],
            updated_before: self.clock.now() - older_than_secs,
            limit: SETTLE_BATCH_MAX,
        };
        let due = match self.store.rail_list(due).await {
            Ok(d) => d,
            Err(error) => {
                tracing::error!(%error, backend = self.inner.name(), "listing pending ledger payments failed");
                return 0;
            }
        };
        let mut settled = 0;
        for rec in due.iter().filter(|r| r.flow == RailFlow::Ledger) {
            if std::time::Instant::now() >= deadline {
                break;
            }
            let asked =
                if rec.state == RailState::Pending { self.settle_one(rec).await } else { self.settle_open(rec).await };
            match asked {
                Ok(true) => {
                    settled += 1;
                    tracing::info!(payment_id = %rec.id, backend = self.inner.name(), "ledger payment settled from the backend");
                }
                Ok(false) => {}
                Err(error) => {
                    tracing::warn!(payment_id = %rec.id, %error, "asking the ledger about a payment failed")
                }
            }
        }
        settled
    }

    async fn balance(&self, account: &AccountId) -> Result<Option<Balance>, BackendError> {
        self.inner.balance(account).await
    }

    async fn list_payments(&self, query: PaymentQuery) -> Result<Page<Payment>, BackendError> {
        if self.inner.names_its_payments() {
            return self.own_records(query).await;
        }
        self.inner.list_payments(query).await
    }

    async fn account_entries(&self, q: EntryQuery) -> Result<Page<LedgerEntry>, BackendError> {
        self.inner.account_entries(q).await
    }

    async fn check_integrity(&self, full: bool) -> Result<IntegrityReport, BackendError> {
        self.inner.check_integrity(full).await
    }
}
