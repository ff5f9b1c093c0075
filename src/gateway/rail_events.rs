//! What a rail says after the call that made a payment: its callbacks (verified and parsed by the
//! rail, decided here into a `CallbackOutcome` whose HTTP answer `http` chooses) and the polling of
//! open collections.
//!
//! Architecture Invariant: the rail is reached only through `backend::rail`: no vendor wire field,
//! result code or limit appears here.

use super::rails::clip;
use super::{Decision, Gateway};

use crate::backend::rail::{Authority, CallbackChannel, CollectionRail, settle_record};
use crate::domain::audit::AuditRecord;
use crate::domain::rail::RailMove;
use crate::domain::rail::Settlement;
use crate::domain::rail::{RailFlow, RailPayment, RailQuery, RailState};
use crate::domain::rules::rail as rail_rules;
/// Open rail records read per batch; a run takes batches until none is due or its budget ends.
const POLL_BATCH_MAX: u32 = 50;
/// Questions to one rail in flight at once during a run (each is one status or enquiry call):
/// a backlog of thousands of open payouts settles in minutes, not hours, without flooding the
/// rail (its own breaker and rate limits still apply to every call).
pub const POLL_CONCURRENCY: usize = 8;

/// How a rail callback ended. Rail-neutral and HTTP-free: `http::callbacks` maps each to a status
/// and a short body (never echoing the callback).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallbackOutcome {
    /// No collection rail is enabled.
    RailDisabled,
    /// The rail could not parse it.
    Malformed,
    /// It answers a request the gateway has no record of.
    UnknownReference,
    /// The store could not be read or written: the rail should send it again.
    StoreUnavailable,
    /// A payment a query had already settled as succeeded learned its receipt.
    ReceiptRecorded,
    /// The payment is already settled (a duplicate or late callback), or was settled concurrently.
    Terminal,
    /// The payment is not waiting for a callback (not yet pushed, or its outcome unknown).
    NotPending,
    /// A success for another amount than the one asked for.
    AmountMismatch,
    /// A success paid by another payer than the one prompted.
    PayerMismatch,
    /// A success without the rail's receipt.
    ReceiptMissing,
    /// A success the rail's own status query contradicts.
    NotConfirmed,
    /// A success the rail cannot confirm yet: kept pending with its receipt.
    AwaitingConfirmation,
    Succeeded,
    Failed,
    /// Still pending (the rail's answer is not final, or not one this gateway knows).
    StillPending,
}

impl Gateway {
    /// A rail's word applied to its record (`backend::rail::settle_record`, the same for every rail).
    /// `said`: the audit record of that word (decision, code, detail), appended in the move's own
    /// transaction when the record moves: a record never settles without the trail saying why.
    pub(super) async fn settle(
        &self,
        rail: &dyn CollectionRail,
        rec: &RailPayment,
        settlement: &Settlement,
        receipt: Option<String>,
        said: Option<(&str, &str, String)>,
    ) -> Result<Option<RailPayment>, crate::domain::error::StoreError> {
        let audit =
            said.map(|(decision, code, detail)| self.rail_audit(rail.name(), Some(rec), decision, code, detail));
        self.settle_recorded(rail, rec, settlement, receipt, audit).await
    }

    /// [`Gateway::settle`] with the record of who settled it (tagged here), written in the
    /// settling transaction: the rail's word, or people's (`resolution`).
    pub(super) async fn settle_recorded(
        &self,
        rail: &dyn CollectionRail,
        rec: &RailPayment,
        settlement: &Settlement,
        receipt: Option<String>,
        audit: Option<AuditRecord>,
    ) -> Result<Option<RailPayment>, crate::domain::error::StoreError> {
        let audit = audit.map(|a| self.tag_audit(a));
        let settled = settle_record(&*self.store, &*self.clock, rail, rec, settlement, receipt, audit).await?;
        if let Some(done) = &settled
            && done.state == RailState::Succeeded
            && done.flow == RailFlow::Payout
            && let Some(mandate_id) = &done.mandate_id
        {
            // A payout a human approved settled: its payee is known from now (`learn_payee`).
            self.learn_payee(mandate_id, "-").await;
        }
        Ok(settled)
    }

    /// Callback and query decisions are audited under the rail's name (`<rail>_callback`, issuer `<rail>`).
    fn rail_audit(
        &self,
        rail: &str,
        rec: Option<&RailPayment>,
        decision: &str,
        code: &str,
        detail: String,
    ) -> AuditRecord {
        let tool = format!("{rail}_callback");
        let mut d = Decision::new(&tool, decision);
        d.payment_id = rec.map(|r| r.id.as_str());
        d.detail = Some(detail);
        let mut a = self.audit_record(rail, rec.map_or("-", |r| r.principal_sub.as_str()), "-", d);
        a.code = Some(code.to_string());
        // A callback about an agent's payment made for a user names that user too.
        a.principal_user = rec.and_then(|r| r.principal_user.clone());
        a
    }

    async fn audit_callback(&self, rail: &str, rec: Option<&RailPayment>, decision: &str, code: &str, detail: String) {
        self.append_audit_notify(self.rail_audit(rail, rec, decision, code, detail), Vec::new()).await
    }

    /// A callback refused before it was read (wrong secret, source not allowed): audited.
    pub async fn audit_callback_refusal(&self, rail: &str, code: &str, detail: String) {
        self.audit_callback(rail, None, "callback_refused", code, detail).await;
    }

    /// A rail's callback, already past the secret and source check. The rail parses it; refusals
    /// change nothing and are audited. A collection's success settles only when the rail's own
    /// status query confirms it; a payout's or reversal's result is the rail's final word (it must
    /// still match the record); a queue timeout settles nothing. The HTTP answer is `http`'s choice.
    pub async fn rail_callback(&self, rail_name: &str, channel: CallbackChannel, body: &[u8]) -> CallbackOutcome {
        let Some(rail) = self.rail(rail_name).cloned() else { return CallbackOutcome::RailDisabled };
        let event = match rail.parse_callback(channel, body) {
            Ok(event) => event,
            Err(reason) => {
                self.audit_callback(rail.name(), None, "callback_refused", "MALFORMED", reason).await;
                self.metrics.callback(rail.name(), "malformed");
                return CallbackOutcome::Malformed;
            }
        };
        let found = match self.store.rail_by_ref(rail.name(), &event.rail_ref).await {
            // A record whose reference was never recorded (the request's answer was lost) is
            // found by the payment id the rail echoes back.
            Ok(None) if event.payment_ref.is_some() => match event.payment_ref.as_ref() {
                Some(id) => self.store.rail_get(id).await.map(|r| r.filter(|r| r.rail == rail.name())),
                None => Ok(None),
            },
            other => other,
        };
        // A callback answers one kind of request: a prompt's answer never settles money going
        // out, and a payout's result never settles a collection.
        let found = found.map(|r| {
            r.filter(|r| r.flow != RailFlow::Ledger && r.flow.is_outbound() == (event.authority != Authority::Confirm))
        });
        let rec = match found {
            Ok(Some(r)) => r,
            Ok(None) => {
                let detail = format!("unknown rail reference {}", clip(&event.rail_ref));
                self.audit_callback(rail.name(), None, "callback_refused", "UNKNOWN_CHECKOUT", detail).await;
                self.metrics.callback(rail.name(), "unknown");
                return CallbackOutcome::UnknownReference;
            }
            Err(error) => {
                tracing::error!(%error, "callback lookup failed");
                return CallbackOutcome::StoreUnavailable;
            }
        };
        if event.authority == Authority::Notice {
            // Settles nothing; the scheduled status query asks where it stands.
            let detail = event.settlement.reason().unwrap_or("notice").to_string();
            let touched = self.touch_open(rail.as_ref(), &rec, &event.settlement).await;
            self.audit_callback(rail.name(), Some(&rec), "callback_notice", "QUEUE_TIMEOUT", detail).await;
            self.metrics.callback(rail.name(), "still_pending");
            return touched;
        }
        let paid = event.settlement == Settlement::Succeeded;
        if !rail_rules::settles_from(rec.flow).contains(&rec.state) {
            // A payment a query already settled as succeeded learns its receipt from the callback
            // (the query carries none); nothing else about a terminal payment ever changes.
            let fills_receipt = rec.state == RailState::Succeeded
                && rec.receipt.is_none()
                && paid
                && event.amount_minor == Some(rec.amount_minor)
                && event.payer.as_deref() == rec.phone.as_deref()
                && event.receipt.is_some();
            if fills_receipt {
                let update = crate::domain::rail::RailUpdate { receipt: event.receipt.clone(), ..Default::default() };
                let now = self.clock.now();
                let from = [RailState::Succeeded];
                if let Ok(Some(updated)) = self
                    .store
                    .rail_transition(RailMove { id: &rec.id, from: &from, to: RailState::Succeeded, update }, now)
                    .await
                {
                    self.audit_callback(
                        rail.name(),
                        Some(&updated),
                        "callback_receipt",
                        "RECEIPT_RECORDED",
                        "receipt recorded".into(),
                    )
                    .await;
                    self.metrics.callback(rail.name(), "receipt");
                    return CallbackOutcome::ReceiptRecorded;
                }
            }
            // The rail's final word against a settled record (a payout people settled by hand as
            // failed, then paid after all): money moved that the record denies. Refused all the
            // same (a settled record never moves), but loudly: for a person to put right.
            let contradicts = event.authority == Authority::Final
                && matches!(
                    (rec.state, &event.settlement),
                    (RailState::Failed, Settlement::Succeeded) | (RailState::Succeeded, Settlement::Failed(_))
                );
            let (code, outcome) = if contradicts {
                tracing::error!(payment_id = %rec.id, rail = rail.name(), state = rec.state.as_str(),
                    "the rail's final result contradicts a settled record: money may have moved that the record denies");
                (super::reconcile::CONTRADICTS_RECORD, CallbackOutcome::Terminal)
            } else if rec.state.is_terminal() {
                ("DUPLICATE_OR_LATE", CallbackOutcome::Terminal)
            } else {
                ("NOT_PENDING", CallbackOutcome::NotPending)
            };
            let detail = format!("callback for a payment already {}", rec.state.as_str());
            self.audit_callback(rail.name(), Some(&rec), "callback_refused", code, detail).await;
            self.metrics.callback(rail.name(), if contradicts { "contradiction" } else { "duplicate" });
            return outcome;
        }
        if paid {
            // A success must say what was paid, by whom (where the rail's callbacks do), and what
            // it says must match what was asked.
            let claims_required = event.authority == Authority::Confirm && rail.callbacks_name_the_payment();
            // A result is the rail's final word on money going out: it must name the amount.
            let amount_required = claims_required || event.authority == Authority::Final;
            if (amount_required || event.amount_minor.is_some()) && event.amount_minor != Some(rec.amount_minor) {
                let detail = format!(
                    "amount {} does not match the {} asked for",
                    event.amount_minor.map_or("missing".to_string(), |a| a.to_string()),
                    rec.amount_minor
                );
                self.audit_callback(rail.name(), Some(&rec), "callback_refused", "AMOUNT_MISMATCH", detail).await;
                self.metrics.callback(rail.name(), "mismatch");
                return CallbackOutcome::AmountMismatch;
            }
            if (claims_required || event.payer.is_some()) && event.payer.as_deref() != rec.phone.as_deref() {
                let detail = "the paying phone does not match the one prompted".to_string();
                self.audit_callback(rail.name(), Some(&rec), "callback_refused", "PHONE_MISMATCH", detail).await;
                self.metrics.callback(rail.name(), "mismatch");
                return CallbackOutcome::PayerMismatch;
            }
            if event.receipt.is_none() {
                let detail = format!("a success without an {} receipt number", rail.display_name());
                self.audit_callback(rail.name(), Some(&rec), "callback_refused", "RECEIPT_MISSING", detail).await;
                self.metrics.callback(rail.name(), "mismatch");
                return CallbackOutcome::ReceiptMissing;
            }
        }
        let settlement = if event.authority == Authority::Final {
            // Money going out has no synchronous query: its result, matched above, is final.
            event.settlement
        } else if paid {
            // Callbacks are unsigned: confirm a success with the rail before crediting it.
            match rail.query(&rec).await {
                Settlement::Succeeded => Settlement::Succeeded,
                queried @ (Settlement::Failed(_) | Settlement::Unrecognised(_)) => {
                    let detail = format!(
                        "a success callback that {}'s query contradicts: {}",
                        rail.display_name(),
                        queried.reason().unwrap_or("-")
                    );
                    self.audit_callback(rail.name(), Some(&rec), "callback_refused", "NOT_CONFIRMED", detail).await;
                    self.metrics.callback(rail.name(), "mismatch");
                    // The query is the rail's own answer: a known failure settles the payment.
                    if let Settlement::Failed(_) = queried {
                        let said = ("query_settled", "FAILED", format!("{queried:?}"));
                        let _ = self.settle(&*rail, &rec, &queried, None, Some(said)).await;
                    }
                    return CallbackOutcome::NotConfirmed;
                }
                Settlement::Pending(_) => {
                    // Not confirmable yet: keep the receipt, stay pending; the scheduled query settles it.
                    let update = crate::domain::rail::RailUpdate {
                        receipt: event.receipt.clone(),
                        reason: Some(format!(
                            "success callback received; awaiting {}'s confirmation",
                            rail.display_name()
                        )),
                        ..Default::default()
                    };
                    let now = self.clock.now();
                    let from = [RailState::Pending];
                    return match self
                        .store
                        .rail_transition(RailMove { id: &rec.id, from: &from, to: RailState::Pending, update }, now)
                        .await
                    {
                        Ok(Some(updated)) => {
                            let detail = "success callback not yet confirmed by query".to_string();
                            self.audit_callback(
                                rail.name(),
                                Some(&updated),
                                "callback_unconfirmed",
                                "AWAITING_CONFIRMATION",
                                detail,
                            )
                            .await;
                            self.metrics.callback(rail.name(), "awaiting_confirmation");
                            CallbackOutcome::AwaitingConfirmation
                        }
                        Ok(None) => CallbackOutcome::Terminal,
                        Err(error) => {
                            tracing::error!(%error, "recording a callback failed");
                            CallbackOutcome::StoreUnavailable
                        }
                    };
                }
            }
        } else if let Settlement::Failed(_) = event.settlement {
            // A failure is confirmed too: a forged or mistaken one would mark a paid collection
            // failed (and the customer might be asked to pay again).
            match rail.query(&rec).await {
                confirmed @ Settlement::Failed(_) => confirmed,
                other => {
                    let detail = format!(
                        "a failure callback that {}'s query does not confirm: {}",
                        rail.display_name(),
                        other.reason().unwrap_or("it reports the payment succeeded")
                    );
                    self.audit_callback(rail.name(), Some(&rec), "callback_refused", "NOT_CONFIRMED", detail).await;
                    self.metrics.callback(rail.name(), "mismatch");
                    return CallbackOutcome::NotConfirmed;
                }
            }
        } else {
            event.settlement
        };
        let (decision, code, metric, outcome) = match &settlement {
            Settlement::Succeeded => ("callback_settled", "SUCCEEDED", "succeeded", CallbackOutcome::Succeeded),
            Settlement::Failed(_) => ("callback_settled", "FAILED", "failed", CallbackOutcome::Failed),
            Settlement::Pending(_) => {
                ("callback_pending", "STILL_PENDING", "still_pending", CallbackOutcome::StillPending)
            }
            Settlement::Unrecognised(_) => {
                ("callback_unrecognised", "UNRECOGNISED_RESULT", "still_pending", CallbackOutcome::StillPending)
            }
        };
        let detail = match settlement.reason() {
            // A receipt the record holds is kept; else the callback's fills the gap.
            None => format!("settled; receipt {}", rec.receipt.as_deref().or(event.receipt.as_deref()).unwrap_or("-")),
            Some(reason) => reason.to_string(),
        };
        let said = Some((decision, code, detail));
        match self.settle(&*rail, &rec, &settlement, event.receipt.clone(), said).await {
            Ok(Some(_)) => {
                self.metrics.callback(rail.name(), metric);
                outcome
            }
            Ok(None) => {
                // Settled by a concurrent callback or query between our read and write.
                self.audit_callback(
                    rail.name(),
                    Some(&rec),
                    "callback_refused",
                    "DUPLICATE_OR_LATE",
                    "settled concurrently".into(),
                )
                .await;
                self.metrics.callback(rail.name(), "duplicate");
                CallbackOutcome::Terminal
            }
            Err(error) => {
                tracing::error!(%error, "settling a callback failed");
                CallbackOutcome::StoreUnavailable
            }
        }
    }

    /// A notice about an open record: it stays where it is, its reason and `updated_at` move.
    async fn touch_open(
        &self,
        rail: &dyn crate::backend::rail::CollectionRail,
        rec: &RailPayment,
        settlement: &Settlement,
    ) -> CallbackOutcome {
        match self.settle(rail, rec, settlement, None, None).await {
            Ok(Some(_)) => CallbackOutcome::StillPending,
            Ok(None) => CallbackOutcome::Terminal,
            Err(error) => {
                tracing::error!(%error, "recording a callback notice failed");
                CallbackOutcome::StoreUnavailable
            }
        }
    }

    /// Query the collection rail about pending payments not touched for `older_than_secs` (the
    /// scheduler's job), until `budget` has passed (a run stays within its job lease). Returns how
    /// many settled.
    pub async fn poll_rails(&self, older_than_secs: i64, budget: std::time::Duration) -> usize {
        let deadline = std::time::Instant::now() + budget;
        let mut settled = 0;
        for rail in &self.rails {
            settled += self.poll_rail(rail.as_ref(), older_than_secs, deadline).await;
        }
        // An external ledger that answers before it is final (the wallet service's saga).
        settled + self.backend.settle_pending(older_than_secs, deadline).await
    }

    async fn poll_rail(
        &self,
        rail: &dyn crate::backend::rail::CollectionRail,
        older_than_secs: i64,
        deadline: std::time::Instant,
    ) -> usize {
        use futures_util::StreamExt as _;
        let mut settled = 0;
        let mut asked = std::collections::HashSet::new();
        // Batch after batch, oldest first, until none is due or the budget has passed: each record
        // asked is touched (updated_at), so the next batch holds others.
        while std::time::Instant::now() < deadline {
            let now = self.clock.now();
            // Pending records, and those whose answer was lost (a payout's status can be asked).
            let due = RailQuery {
                rail: Some(rail.name().into()),
                states: vec![RailState::Pending, RailState::Unknown],
                updated_before: now - older_than_secs,
                limit: POLL_BATCH_MAX,
            };
            let due = match self.store.rail_list(due).await {
                Ok(d) => d,
                Err(error) => {
                    tracing::error!(%error, rail = rail.name(), "listing open rail payments failed");
                    break;
                }
            };
            // (A record its settle could not touch comes back: asked once per run.)
            let fresh: Vec<&RailPayment> = due.iter().filter(|r| asked.insert(r.id.clone())).collect();
            if fresh.is_empty() {
                break;
            }
            let asks: Vec<_> = fresh.into_iter().map(|rec| self.poll_one(rail, rec, deadline)).collect();
            let mut answers = futures_util::stream::iter(asks).buffer_unordered(POLL_CONCURRENCY);
            while let Some(terminal) = answers.next().await {
                settled += usize::from(terminal);
            }
            if due.len() < POLL_BATCH_MAX as usize {
                break;
            }
        }
        settled
    }

    /// Ask the rail about one open record (unless the run's budget has passed) and settle it by
    /// the answer; whether it reached a terminal state.
    async fn poll_one(
        &self,
        rail: &dyn crate::backend::rail::CollectionRail,
        rec: &RailPayment,
        deadline: std::time::Instant,
    ) -> bool {
        if std::time::Instant::now() >= deadline {
            return false;
        }
        // The rail's own answer: success, a known failure, still pending (or not answerable
        // now), or an answer kept for reconciliation.
        let settlement = rail.query(rec).await;
        // Every queried record is touched (updated_at), so records that keep failing to answer
        // do not starve newer ones out of the oldest-first batch.
        let said = match &settlement {
            Settlement::Succeeded => Some(("query_settled", "SUCCEEDED", format!("{settlement:?}"))),
            Settlement::Failed(_) => Some(("query_settled", "FAILED", format!("{settlement:?}"))),
            Settlement::Pending(_) | Settlement::Unrecognised(_) => None,
        };
        match self.settle(rail, rec, &settlement, None, said).await {
            Ok(Some(updated)) => updated.state.is_terminal(),
            Ok(None) => false,
            Err(error) => {
                tracing::warn!(payment_id = %rec.id, %error, "recording a rail query result failed");
                false
            }
        }
    }
}
