//! External rails seen from the gateway: receipts, the payment summary, collection-rail callbacks
//! and polling, and reconciliation of the gateway's records with the backend and the rails.
//!
//! Architecture Invariant: the collection rail is reached only through `backend::rail`: no vendor
//! wire field, result code or limit appears here. The rail parses its callbacks and status answers
//! into a `RailEvent` / `Settlement`; this file decides what they do to the gateway's record, and
//! returns a `CallbackOutcome` whose HTTP answer `http` chooses.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{Caller, Decision, Gateway};
use crate::backend::rail::{Authority, CallbackChannel, Settlement};
use crate::backend::{Payment, PaymentKind, PaymentQuery, PaymentStatus};
use crate::catalogue::scopes;
use crate::clock::UnixSecs;
use crate::domain::rules::rail as rail_rules;
use crate::error::{AgentError, ErrorCode};
use crate::ids::PaymentId;
use crate::money::Currency;
use crate::store::{AuditRecord, RailFlow, RailPayment, RailState, SummaryQuery, SummaryRow};

/// Rail records examined per reconciliation page.
/// Finished (failed) collections a reconciliation run asks the rail about again, at most: each is
/// one query to the rail.
const RECHECK_FINISHED_MAX: usize = 50;
const RECONCILE_PAGE: u32 = 200;
/// Most findings one reconciliation reports (the rest are counted).
pub const RECONCILE_FINDINGS_MAX: usize = 500;
/// Pending collections queried per scheduler run.
const POLL_BATCH_MAX: u32 = 50;
/// Longest summary window (`to - from`).
const SUMMARY_WINDOW_MAX_SECS: i64 = 366 * 86_400;

/// Where a completed payment was settled, and the rail's own reference for it.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Receipt {
    /// ledger | http | mpesa
    pub rail: String,
    /// The rail's reference: the ledger's payment id, or the M-Pesa receipt number.
    pub reference: String,
    /// For M-Pesa: the STK push's CheckoutRequestID.
    pub checkout_request_id: Option<String>,
    /// For M-Pesa: the customer's number, masked.
    pub phone: Option<String>,
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

/// Longest rail reference an agent may look a payment up by.
const RAIL_REF_MAX_CHARS: usize = 128;

#[derive(Debug, Clone, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReconcileArgs {
    /// Only payments created at or after this instant (RFC 3339 or a date). Default: the configured window.
    #[serde(default)]
    pub since: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PaymentSummary {
    pub from: UnixSecs,
    pub to: UnixSecs,
    pub rows: Vec<SummaryRow>,
}

/// One thing reconciliation found.
#[derive(Debug, Clone, PartialEq, Serialize, JsonSchema)]
pub struct Finding {
    /// missing_in_gateway | missing_in_backend | amount_mismatch | status_mismatch | outcome_unknown |
    /// pending_too_long | resolved | integrity
    pub kind: String,
    pub payment_id: Option<String>,
    pub detail: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ReconcileReport {
    pub since: UnixSecs,
    pub backend: String,
    /// Gateway records and backend payments compared.
    pub checked: i64,
    /// Records whose unknown outcome was settled from the backend's answer.
    pub resolved: i64,
    pub findings: Vec<Finding>,
    /// Findings beyond `RECONCILE_FINDINGS_MAX`, counted but not listed.
    pub findings_omitted: i64,
}

/// The issuer of the gateway's own audit records (the scheduler's), which are no agent's.
pub(crate) const GATEWAY_ISSUER: &str = "paygate";

/// A reconciliation's audit decision; its detail is the report itself (JSON, findings bounded by
/// `RECONCILE_FINDINGS_MAX`), which the operator console shows as the last results.
pub(crate) fn reconcile_decision(report: &ReconcileReport) -> Decision<'static> {
    let mut d = Decision::new("reconcile", if report.problems() == 0 { "reconciled" } else { "reconcile_findings" });
    d.detail = Some(serde_json::to_string(report).unwrap_or_else(|e| format!("report not serializable: {e}")));
    d
}

impl ReconcileReport {
    fn push(&mut self, kind: &str, payment_id: Option<&PaymentId>, detail: String) {
        if self.findings.len() >= RECONCILE_FINDINGS_MAX {
            self.findings_omitted += 1;
            return;
        }
        self.findings.push(Finding { kind: kind.into(), payment_id: payment_id.map(|p| p.to_string()), detail });
    }
    /// Findings that need a human (resolved ones do not).
    pub fn problems(&self) -> usize {
        self.findings.iter().filter(|f| f.kind != "resolved").count() + self.findings_omitted as usize
    }
}

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

fn mask_phone(phone: &str) -> String {
    let n = phone.len();
    if n <= 6 { "*".repeat(n) } else { format!("{}****{}", &phone[..5], &phone[n - 3..]) }
}

/// "2026-11-29T10:00:00Z" or "2026-11-29" (start of that UTC day; `end_of_day` gives its end).
pub(crate) fn parse_instant(field: &str, s: &str, end_of_day: bool) -> Result<UnixSecs, AgentError> {
    use time::format_description::well_known::Rfc3339;
    if let Ok(t) = time::OffsetDateTime::parse(s, &Rfc3339) {
        return Ok(t.unix_timestamp());
    }
    let fmt = time::macros::format_description!("[year]-[month]-[day]");
    match time::Date::parse(s, &fmt) {
        Ok(d) => {
            let start = d.midnight().assume_utc().unix_timestamp();
            Ok(if end_of_day { start + 86_400 } else { start })
        }
        Err(_) => {
            Err(AgentError::invalid(format!("{field} must be RFC 3339 (2026-11-29T10:00:00Z) or a date (2026-11-29)")))
        }
    }
}

/// Every window an agent gives is checked the same way: `from` before `to`, at most
/// `SUMMARY_WINDOW_MAX_SECS` apart.
fn check_window(from: UnixSecs, to: UnixSecs) -> Result<(), AgentError> {
    if to <= from || to - from > SUMMARY_WINDOW_MAX_SECS {
        return Err(AgentError::invalid("from must be before to, at most 366 days apart"));
    }
    Ok(())
}

/// Optional `from` (inclusive) and `to` (exclusive) arguments: RFC 3339 or a date, a bare `to`
/// date meaning the end of that day. Both given: checked like every window.
pub(crate) fn parse_window(
    from: Option<&str>,
    to: Option<&str>,
) -> Result<(Option<UnixSecs>, Option<UnixSecs>), AgentError> {
    let from = from.map(|s| parse_instant("from", s, false)).transpose()?;
    let to = to.map(|s| parse_instant("to", s, true)).transpose()?;
    if let (Some(f), Some(t)) = (from, to) {
        check_window(f, t)?;
    }
    Ok((from, to))
}

/// A window defaulting to today (UTC): a missing `from` is the start of today, a missing `to` now
/// (inclusive).
pub(crate) fn today_window(
    now: UnixSecs,
    from: Option<&str>,
    to: Option<&str>,
) -> Result<(UnixSecs, UnixSecs), AgentError> {
    let (f, t) = parse_window(from, to)?;
    let (from, to) = (f.unwrap_or(now - now.rem_euclid(86_400)), t.unwrap_or(now + 1));
    check_window(from, to)?;
    Ok((from, to))
}

/// `--since` of `paygate reconcile`: RFC 3339 or a date.
pub fn parse_instant_arg(s: &str) -> Result<UnixSecs, String> {
    parse_instant("since", s, false).map_err(|e| e.message)
}

impl Gateway {
    /// Whether a gateway record is a collection rail's rather than the payment backend's (the
    /// external ledger's records carry the backend's name). Decided by the record, not by which
    /// rail is enabled now: a rail turned off keeps its records' meaning (shown, refused for
    /// refund, reconciled as collections).
    pub(crate) fn is_collection_record(&self, rec: &RailPayment) -> bool {
        rec.rail != self.backend.name()
    }

    /// The receipt of a completed payment, from the gateway's records.
    fn receipt(&self, payment: &Payment, rec: Option<&RailPayment>) -> Option<Receipt> {
        if payment.status != PaymentStatus::Succeeded {
            return None;
        }
        Some(match rec {
            Some(r) if self.is_collection_record(r) => Receipt {
                rail: r.rail.clone(),
                reference: r.receipt.clone()?,
                // A collection's prompt reference; money going out has none the customer saw.
                checkout_request_id: r.rail_ref.clone().filter(|_| r.flow == RailFlow::Collection),
                phone: r.phone.as_deref().map(mask_phone),
            },
            Some(r) => Receipt {
                rail: r.rail.clone(),
                reference: r.rail_ref.clone().unwrap_or_else(|| payment.id.to_string()),
                checkout_request_id: None,
                phone: None,
            },
            None => Receipt {
                rail: self.backend.name().to_string(),
                reference: payment.id.to_string(),
                checkout_request_id: None,
                phone: None,
            },
        })
    }

    /// A payment visible to this agent, with its receipt when completed. Collections live in the
    /// gateway's records; everything else is asked of the backend (the system of record).
    pub async fn get_payment(
        &self,
        caller: &Caller,
        payment_id: &str,
    ) -> Result<(Payment, Option<Receipt>), AgentError> {
        let id = PaymentId::parse(payment_id)?;
        let not_found = || AgentError::new(ErrorCode::NotFound, format!("payment {id} does not exist"));
        let rail_record = || async {
            self.store.rail_get(&id).await.map_err(|error| {
                tracing::error!(correlation_id = %caller.correlation_id, %error, "rail record read failed");
                AgentError::internal()
            })
        };
        // The backend first: on the embedded ledger (the common case) that is the only read. The
        // gateway's record is read for a payment the backend does not hold (a collection)
        // and for an external backend's receipt.
        let (payment, rec) = match self.backend.payment(&id).await {
            Ok(Some(p)) if self.backend.records_in_transaction() || p.status != PaymentStatus::Succeeded => (p, None),
            Ok(Some(p)) => (p, rail_record().await?),
            Ok(None) => match rail_record().await? {
                Some(r) if self.is_collection_record(&r) => (r.payment(), Some(r)),
                _ => return Err(not_found()),
            },
            Err(e) => return Err(AgentError::from(&e)),
        };
        if !payment.touches_any(&caller.principal.profile.allowed_accounts) {
            return Err(not_found());
        }
        let receipt = self.receipt(&payment, rec.as_ref());
        Ok((payment, receipt))
    }

    /// `check_transaction_status`: a payment as `get_payment` shows it, by its id or by the
    /// collection rail's reference (an M-Pesa CheckoutRequestID). Read-only: it asks the rail
    /// nothing (the scheduled query settles pending collections). A reference that is unknown, not
    /// the rail's, or whose payment touches none of the caller's accounts is NOT_FOUND, like an id.
    pub async fn transaction_status(
        &self,
        caller: &Caller,
        args: TransactionStatusArgs,
    ) -> Result<(Payment, Option<Receipt>), AgentError> {
        match (args.payment_id.as_deref(), args.checkout_request_id.as_deref()) {
            (Some(id), None) => self.get_payment(caller, id).await,
            (None, Some(reference)) => {
                if reference.is_empty() || reference.chars().count() > RAIL_REF_MAX_CHARS {
                    return Err(AgentError::invalid(format!(
                        "checkout_request_id must be 1-{RAIL_REF_MAX_CHARS} characters"
                    )));
                }
                let not_found = || {
                    AgentError::new(
                        ErrorCode::NotFound,
                        format!("no payment with checkout_request_id {}", clip(reference)),
                    )
                };
                let mut rec = None;
                for rail in &self.rails {
                    rec = self.store.rail_by_ref(rail.name(), reference).await.map_err(|error| {
                        tracing::error!(correlation_id = %caller.correlation_id, %error, "rail record read failed");
                        AgentError::internal()
                    })?;
                    if rec.is_some() {
                        break;
                    }
                }
                match rec {
                    // The payment as get_payment shows it, under get_payment's visibility rule.
                    Some(rec) => self.get_payment(caller, rec.id.as_str()).await.map_err(|e| match e.code {
                        ErrorCode::NotFound => not_found(),
                        _ => e,
                    }),
                    None => Err(not_found()),
                }
            }
            _ => Err(AgentError::invalid("give exactly one of payment_id and checkout_request_id")),
        }
    }

    /// `generate_receipt`: a succeeded payment and its receipt. A payment not (yet) succeeded has
    /// none, and neither has a collection whose rail receipt number has not arrived yet.
    pub async fn payment_receipt(&self, caller: &Caller, payment_id: &str) -> Result<(Payment, Receipt), AgentError> {
        let (payment, receipt) = self.get_payment(caller, payment_id).await?;
        match (payment.status, receipt) {
            (PaymentStatus::Succeeded, Some(receipt)) => Ok((payment, receipt)),
            (PaymentStatus::Succeeded, None) => Err(AgentError::invalid(format!(
                "payment {} succeeded, but the rail's receipt number has not arrived yet; ask again later",
                payment.id
            ))
            .with_detail("status", payment.status.as_str())),
            (status, _) => Err(AgentError::invalid(format!(
                "payment {} is {}: only a succeeded payment has a receipt",
                payment.id,
                status.as_str()
            ))
            .with_detail("status", status.as_str())),
        }
    }

    /// `get_today_summary`: the payment summary over today (UTC).
    pub async fn today_summary(&self, caller: &Caller, args: TodaySummaryArgs) -> Result<PaymentSummary, AgentError> {
        self.payment_summary(caller, PaymentSummaryArgs { from: None, to: None, currency: args.currency }).await
    }

    /// Counts and totals by kind, status and currency over this agent's accounts.
    pub async fn payment_summary(
        &self,
        caller: &Caller,
        args: PaymentSummaryArgs,
    ) -> Result<PaymentSummary, AgentError> {
        let (from, to) = today_window(self.clock.now(), args.from.as_deref(), args.to.as_deref())?;
        let currency = args.currency.as_deref().map(Currency::parse).transpose()?;
        let query = SummaryQuery { accounts: caller.principal.profile.allowed_accounts.clone(), from, to, currency };
        let rows = self.store.payment_summary(query).await.map_err(|error| {
            tracing::error!(correlation_id = %caller.correlation_id, %error, "summary failed");
            AgentError::internal()
        })?;
        Ok(PaymentSummary { from, to, rows })
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
        let a = self.rail_audit(rail, rec, decision, code, detail);
        if let Err(error) = self.store.audit_append(a).await {
            self.metrics.bookkeeping_failure("audit");
            tracing::error!(%error, "audit append failed");
        }
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
                self.metrics.callback("malformed");
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
                self.metrics.callback("unknown");
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
            self.metrics.callback("still_pending");
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
                let update = crate::store::RailUpdate { receipt: event.receipt.clone(), ..Default::default() };
                let now = self.clock.now();
                let from = [RailState::Succeeded];
                if let Ok(Some(updated)) =
                    self.store.rail_transition(&rec.id, &from, RailState::Succeeded, update, now).await
                {
                    self.audit_callback(
                        rail.name(),
                        Some(&updated),
                        "callback_receipt",
                        "RECEIPT_RECORDED",
                        "receipt recorded".into(),
                    )
                    .await;
                    self.metrics.callback("receipt");
                    return CallbackOutcome::ReceiptRecorded;
                }
            }
            let (code, outcome) = if rec.state.is_terminal() {
                ("DUPLICATE_OR_LATE", CallbackOutcome::Terminal)
            } else {
                ("NOT_PENDING", CallbackOutcome::NotPending)
            };
            let detail = format!("callback for a payment already {}", rec.state.as_str());
            self.audit_callback(rail.name(), Some(&rec), "callback_refused", code, detail).await;
            self.metrics.callback("duplicate");
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
                self.metrics.callback("mismatch");
                return CallbackOutcome::AmountMismatch;
            }
            if (claims_required || event.payer.is_some()) && event.payer.as_deref() != rec.phone.as_deref() {
                let detail = "the paying phone does not match the one prompted".to_string();
                self.audit_callback(rail.name(), Some(&rec), "callback_refused", "PHONE_MISMATCH", detail).await;
                self.metrics.callback("mismatch");
                return CallbackOutcome::PayerMismatch;
            }
            if event.receipt.is_none() {
                let detail = format!("a success without an {} receipt number", rail.display_name());
                self.audit_callback(rail.name(), Some(&rec), "callback_refused", "RECEIPT_MISSING", detail).await;
                self.metrics.callback("mismatch");
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
                    self.metrics.callback("mismatch");
                    // The query is the rail's own answer: a known failure settles the payment.
                    if let Settlement::Failed(_) = queried
                        && let Ok(Some(updated)) = rail.settle(&rec, &queried, None).await
                    {
                        self.audit_callback(
                            rail.name(),
                            Some(&updated),
                            "query_settled",
                            "FAILED",
                            format!("{queried:?}"),
                        )
                        .await;
                    }
                    return CallbackOutcome::NotConfirmed;
                }
                Settlement::Pending(_) => {
                    // Not confirmable yet: keep the receipt, stay pending; the scheduled query settles it.
                    let update = crate::store::RailUpdate {
                        receipt: event.receipt.clone(),
                        reason: Some(format!(
                            "success callback received; awaiting {}'s confirmation",
                            rail.display_name()
                        )),
                        ..Default::default()
                    };
                    let now = self.clock.now();
                    let from = [RailState::Pending];
                    return match self.store.rail_transition(&rec.id, &from, RailState::Pending, update, now).await {
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
                            self.metrics.callback("awaiting_confirmation");
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
                    self.metrics.callback("mismatch");
                    return CallbackOutcome::NotConfirmed;
                }
            }
        } else {
            event.settlement
        };
        match rail.settle(&rec, &settlement, event.receipt.clone()).await {
            Ok(Some(updated)) => {
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
                    None => format!("settled; receipt {}", updated.receipt.as_deref().unwrap_or("-")),
                    Some(reason) => reason.to_string(),
                };
                self.audit_callback(rail.name(), Some(&updated), decision, code, detail).await;
                self.metrics.callback(metric);
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
                self.metrics.callback("duplicate");
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
        match rail.settle(rec, settlement, None).await {
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
        settled
    }

    async fn poll_rail(
        &self,
        rail: &dyn crate::backend::rail::CollectionRail,
        older_than_secs: i64,
        deadline: std::time::Instant,
    ) -> usize {
        let now = self.clock.now();
        // Pending records, and those whose answer was lost (a payout's status can be asked).
        let open = [RailState::Pending, RailState::Unknown];
        let due = match self.store.rail_list(Some(rail.name()), &open, now - older_than_secs, POLL_BATCH_MAX).await {
            Ok(d) => d,
            Err(error) => {
                tracing::error!(%error, rail = rail.name(), "listing open rail payments failed");
                return 0;
            }
        };
        let mut settled = 0;
        for rec in &due {
            if std::time::Instant::now() >= deadline {
                break;
            }
            // The rail's own answer: success, a known failure, still pending (or not answerable
            // now), or an answer kept for reconciliation.
            let settlement = rail.query(rec).await;
            // Every queried record is touched (updated_at), so records that keep failing to answer
            // do not starve newer ones out of the oldest-first batch.
            match rail.settle(rec, &settlement, None).await {
                Ok(Some(updated)) if updated.state.is_terminal() => {
                    settled += 1;
                    let code = if updated.state == RailState::Succeeded { "SUCCEEDED" } else { "FAILED" };
                    let detail = format!("{settlement:?}");
                    self.audit_callback(rail.name(), Some(&updated), "query_settled", code, detail).await;
                }
                Ok(_) => {}
                Err(error) => tracing::warn!(payment_id = %rec.id, %error, "recording a rail query result failed"),
            }
        }
        settled
    }

    /// The audit record of a scheduled (or CLI) reconciliation.
    pub fn reconcile_audit(&self, report: &ReconcileReport) -> AuditRecord {
        self.audit_record(GATEWAY_ISSUER, "scheduler", "-", reconcile_decision(report))
    }

    /// A record of the scheduler's own work (`tool`: what ran).
    pub fn system_audit(&self, tool: &str, decision: &str, detail: String) -> AuditRecord {
        let mut d = Decision::new(tool, decision);
        d.detail = Some(detail);
        self.audit_record(GATEWAY_ISSUER, "scheduler", "-", d)
    }

    /// `reconcile` tool: admin only; audited.
    pub async fn reconcile_tool(&self, caller: &Caller, args: ReconcileArgs) -> Result<ReconcileReport, AgentError> {
        if !caller.principal.has_scope(scopes::INTEGRITY) {
            return Err(AgentError::new(ErrorCode::InsufficientScope, "reconcile needs payments:integrity"));
        }
        let since = match &args.since {
            Some(s) => Some(parse_instant("since", s, false)?),
            None => None,
        };
        let report = self.reconcile(since).await.map_err(|e| AgentError::from(&e))?;
        self.audit(caller, reconcile_decision(&report)).await;
        Ok(report)
    }

    /// Compare the gateway's records with the backend and the rails since `since` (default: the
    /// configured window). Settles unknown outcomes the backend can answer; reports the rest.
    pub async fn reconcile(&self, since: Option<UnixSecs>) -> Result<ReconcileReport, crate::backend::BackendError> {
        let now = self.clock.now();
        let since = since.unwrap_or(now - self.limits.reconcile_window_secs);
        let backend = self.backend.name().to_string();
        let mut report = ReconcileReport {
            since,
            backend: backend.clone(),
            checked: 0,
            resolved: 0,
            findings: vec![],
            findings_omitted: 0,
        };
        // 1. Every gateway record against the backend (or, for a collection, its own state).
        let mut after = 0;
        let mut rechecks_left = RECHECK_FINISHED_MAX;
        loop {
            let page = self.store.rail_since(since, after, RECONCILE_PAGE).await?;
            let Some((last, _)) = page.last() else { break };
            after = *last;
            for (_, rec) in &page {
                report.checked += 1;
                if self.is_collection_record(rec) {
                    self.reconcile_collection(rec, now, &mut report, &mut rechecks_left).await;
                } else {
                    self.reconcile_record(rec, now, &mut report).await?;
                }
            }
        }
        // 2. Payments the backend holds that the gateway has no record of (external ledgers only:
        //    the embedded ledger *is* the gateway's record, checked by its integrity report).
        if self.backend.records_in_transaction() {
            let integrity = self.backend.check_integrity(false).await?;
            for p in integrity.problems {
                report.push("integrity", None, p);
            }
        } else if !self.known_accounts.is_empty() {
            let mut before = None;
            'pages: loop {
                let page = self
                    .backend
                    .list_payments(PaymentQuery {
                        accounts: self.known_accounts.clone(),
                        status: None,
                        before_seq: before,
                        limit: RECONCILE_PAGE,
                        ..Default::default()
                    })
                    .await?;
                for p in &page.items {
                    if p.created_at < since {
                        break 'pages;
                    }
                    report.checked += 1;
                    if self.store.rail_get(&p.id).await?.is_none() {
                        report.push(
                            "missing_in_gateway",
                            Some(&p.id),
                            format!(
                                "the backend holds {} {} {} the gateway never recorded",
                                p.kind.as_str(),
                                p.amount(),
                                p.currency
                            ),
                        );
                    }
                }
                match page.next_cursor {
                    Some(c) => before = Some(c),
                    None => break,
                }
            }
        }
        for f in &report.findings {
            self.metrics.reconcile_finding(&f.kind);
        }
        self.metrics.reconcile_run(report.problems() as u64);
        Ok(report)
    }

    /// A collection's record against its own state: the rail is its system of record, and the
    /// scheduled query settles what is open. A collection recorded failed is asked about again
    /// (at most `RECHECK_FINISHED_MAX` a run): a failure the rail now calls a success is for a human.
    /// Money going out failed by the rail's own final result, and its status answer would come by
    /// callback, not here: it is not asked again.
    async fn reconcile_collection(
        &self,
        rec: &RailPayment,
        now: UnixSecs,
        report: &mut ReconcileReport,
        rechecks_left: &mut usize,
    ) {
        if rec.state == RailState::Failed
            && rec.flow == RailFlow::Collection
            && *rechecks_left > 0
            && let Some(rail) = self.rail(&rec.rail)
        {
            *rechecks_left -= 1;
            if rail.query(rec).await == Settlement::Succeeded {
                report.push(
                    "status_mismatch",
                    Some(&rec.id),
                    format!("recorded failed, but {} now says the customer paid", rail.display_name()),
                );
            }
            return;
        }
        match rec.state {
            RailState::Unknown | RailState::Submitting if now - rec.updated_at > self.limits.idempotency_lease_secs => {
                report.push(
                    "outcome_unknown",
                    Some(&rec.id),
                    format!(
                        "a {} request whose answer was lost: check the {} statement for this customer and amount",
                        rec.flow.as_str(),
                        rec.rail
                    ),
                )
            }
            RailState::Pending if now - rec.created_at > self.limits.collection_pending_timeout_secs => report.push(
                "pending_too_long",
                Some(&rec.id),
                format!("pending since {} s; {}", now - rec.created_at, rec.reason.as_deref().unwrap_or("no callback")),
            ),
            _ => {}
        }
    }

    async fn reconcile_record(
        &self,
        rec: &RailPayment,
        now: UnixSecs,
        report: &mut ReconcileReport,
    ) -> Result<(), crate::backend::BackendError> {
        let held = self.backend.payment(&rec.id).await?;
        let Some(p) = held else {
            match rec.state {
                RailState::Succeeded | RailState::Pending => report.push(
                    "missing_in_backend",
                    Some(&rec.id),
                    format!("the gateway recorded {} but the backend has no such payment", rec.state.as_str()),
                ),
                RailState::Unknown | RailState::Submitting if now - rec.updated_at > self.limits.idempotency_lease_secs => {
                    report.push(
                        "outcome_unknown",
                        Some(&rec.id),
                        "sent, never confirmed, and the backend has no such payment; a retry with the same operation_id re-sends it".into(),
                    )
                }
                _ => {}
            }
            return Ok(());
        };
        let want_kind = if rec.kind == PaymentKind::Refund { PaymentKind::Refund } else { PaymentKind::Payment };
        if p.amount_minor != rec.amount_minor || p.currency != rec.currency || p.kind != want_kind {
            report.push(
                "amount_mismatch",
                Some(&rec.id),
                format!(
                    "gateway {} {} {}, backend {} {} {}",
                    rec.kind.as_str(),
                    crate::money::format_minor(rec.amount_minor, rec.currency),
                    rec.currency,
                    p.kind.as_str(),
                    p.amount(),
                    p.currency
                ),
            );
            return Ok(());
        }
        let backend_state = match p.status {
            PaymentStatus::Succeeded => RailState::Succeeded,
            PaymentStatus::Failed => RailState::Failed,
            PaymentStatus::Pending => RailState::Pending,
        };
        match rec.state {
            RailState::Unknown | RailState::Submitting => {
                // The backend answers what the lost response did not: settle the record.
                let update = crate::store::RailUpdate { rail_ref: Some(p.id.to_string()), ..Default::default() };
                let from = [RailState::Unknown, RailState::Submitting];
                if let Ok(Some(_)) = self.store.rail_transition(&rec.id, &from, backend_state, update, now).await {
                    report.resolved += 1;
                    report.push(
                        "resolved",
                        Some(&rec.id),
                        format!("outcome settled from the backend: {}", p.status.as_str()),
                    );
                }
            }
            s if s != backend_state => report.push(
                "status_mismatch",
                Some(&rec.id),
                format!("gateway {}, backend {}", s.as_str(), p.status.as_str()),
            ),
            _ => {}
        }
        Ok(())
    }
}

fn clip(s: &str) -> String {
    s.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').take(64).collect()
}
