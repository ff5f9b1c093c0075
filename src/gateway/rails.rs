//! External rails seen from the gateway: receipts, the payment summary, collection-rail callbacks
//! and polling, and reconciliation of the gateway's records with the backend and the rails.
//!
//! Architecture Invariant: the collection rail is reached only through `backend::rail`: no vendor
//! wire field, result code or limit appears here. The rail parses its callbacks and status answers
//! into a `RailEvent` / `Settlement`; this file decides what they do to the gateway's record, and
//! returns a `CallbackOutcome` whose HTTP answer `http` chooses.

use schemars::JsonSchema;
use serde::Serialize;

use super::reads::WindowAsk;
use super::windows::today_window;
use super::{Caller, Gateway};

use crate::clock::UnixSecs;
use crate::domain::ids::PaymentId;
use crate::domain::money::Currency;
use crate::domain::payment::{Payment, PaymentStatus};
use crate::domain::payment::{SummaryQuery, SummaryRow};
use crate::domain::rail::{RailFlow, RailPayment};
use crate::error::{AgentError, ErrorCode};

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

/// Longest rail reference an agent may look a payment up by.
const RAIL_REF_MAX_CHARS: usize = 128;

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PaymentSummary {
    pub from: UnixSecs,
    pub to: UnixSecs,
    pub rows: Vec<SummaryRow>,
}

/// The issuer of the gateway's own audit records (the scheduler's), which are no agent's.
pub(crate) const GATEWAY_ISSUER: &str = "paygate";

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
                // A customer's number, masked. A business paid (a paybill or till number, at most
                // 7 digits) is no one's phone: its account (`to_account`) names it.
                phone: r.phone.as_deref().filter(|p| p.len() > BUSINESS_NUMBER_DIGITS_MAX).map(mask_phone),
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
        if !caller.principal.sees(&payment) {
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
        payment_id: Option<&str>,
        checkout_request_id: Option<&str>,
    ) -> Result<(Payment, Option<Receipt>), AgentError> {
        match (payment_id, checkout_request_id) {
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
    pub async fn today_summary(&self, caller: &Caller, currency: Option<&str>) -> Result<PaymentSummary, AgentError> {
        self.payment_summary(caller, WindowAsk::default(), currency).await
    }

    /// Counts and totals by kind, status and currency over this agent's accounts.
    pub async fn payment_summary(
        &self,
        caller: &Caller,
        window: WindowAsk<'_>,
        currency: Option<&str>,
    ) -> Result<PaymentSummary, AgentError> {
        let (from, to) = today_window(self.clock.now(), window.from, window.to)?;
        let currency = currency.map(Currency::parse).transpose()?;
        let query = SummaryQuery {
            accounts: caller.principal.profile.allowed_accounts.clone(),
            from,
            to,
            currency,
            principal_user: Some(caller.principal.user.clone().unwrap_or_default()),
        };
        let rows = self.store.payment_summary(query).await.map_err(|error| {
            tracing::error!(correlation_id = %caller.correlation_id, %error, "summary failed");
            AgentError::internal()
        })?;
        Ok(PaymentSummary { from, to, rows })
    }
}

/// The longest business number a rail pays (M-Pesa's paybills and tills); a phone is longer.
const BUSINESS_NUMBER_DIGITS_MAX: usize = 7;

pub(super) fn mask_phone(phone: &str) -> String {
    let n = phone.len();
    if n <= 6 { "*".repeat(n) } else { format!("{}****{}", &phone[..5], &phone[n - 3..]) }
}

/// A rail reference as it may appear in an audit detail: its safe characters, bounded.
pub(super) fn clip(s: &str) -> String {
    s.chars().filter(|c| c.is_ascii_alphanumeric() || *c == '-' || *c == '_').take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_rail_reference_reaches_an_audit_detail_as_safe_characters_only_and_bounded() {
        assert_eq!(clip("ws_CO_07122026-abc9"), "ws_CO_07122026-abc9");
        assert_eq!(clip("QK1\n<script>'; DROP --x"), "QK1scriptDROP--x");
        assert_eq!(clip(&"ab".repeat(100)), "ab".repeat(32));
    }

    #[test]
    fn a_phone_shows_its_prefix_and_last_three_digits_and_a_short_one_nothing() {
        assert_eq!(mask_phone("254712345678"), "25471****678");
        assert_eq!(mask_phone("123456"), "******");
    }
}
