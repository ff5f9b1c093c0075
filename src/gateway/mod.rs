//! The operations. Each public method is one agent-visible action: parse → policy → idempotency →
//! backend → bookkeeping → audit. No MCP or HTTP types here; `mcp` shapes the results.

mod payments;
mod reads;

pub use payments::{CreatePaymentArgs, Executed, RefundPaymentArgs};
pub use reads::{AccountLedgerArgs, ListPaymentsArgs};

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;

use crate::auth::AgentPrincipal;
use crate::backend::{BackendError, PaymentBackend};
use crate::clock::Clock;
use crate::error::{AgentError, ErrorCode};
use crate::idempotency::KeyDeriver;
use crate::store::{AuditRecord, Store};

/// Who is asking and under which correlation id: every operation takes one.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: AgentPrincipal,
    pub correlation_id: String,
}

#[derive(Debug, Clone)]
pub struct GatewayLimits {
    pub idempotency_retention_secs: i64,
    pub idempotency_lease_secs: i64,
    pub idempotency_wait: Duration,
    pub approval_ttl_secs: i64,
    pub list_limit_max: u32,
    pub list_limit_default: u32,
}

pub struct Gateway {
    store: Arc<dyn Store>,
    backend: Arc<dyn PaymentBackend>,
    clock: Arc<dyn Clock>,
    keys: KeyDeriver,
    limits: GatewayLimits,
    /// Local waiters on in-flight idempotency keys; woken when the holder finishes. Waiters also
    /// poll the store, which covers holders in other replicas.
    waiters: Mutex<HashMap<String, Arc<Notify>>>,
}

/// A decision worth an audit record.
pub(crate) struct Decision<'a> {
    pub tool: &'a str,
    pub decision: &'a str,
    pub code: Option<ErrorCode>,
    pub idempotency_key: Option<&'a str>,
    pub payment_id: Option<&'a str>,
    pub approval_id: Option<&'a str>,
    pub detail: Option<String>,
}

impl<'a> Decision<'a> {
    pub fn new(tool: &'a str, decision: &'a str) -> Self {
        Decision {
            tool,
            decision,
            code: None,
            idempotency_key: None,
            payment_id: None,
            approval_id: None,
            detail: None,
        }
    }
}

impl Gateway {
    pub fn new(
        store: Arc<dyn Store>,
        backend: Arc<dyn PaymentBackend>,
        clock: Arc<dyn Clock>,
        keys: KeyDeriver,
        limits: GatewayLimits,
    ) -> Self {
        Gateway { store, backend, clock, keys, limits, waiters: Mutex::new(HashMap::new()) }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    pub fn limits(&self) -> &GatewayLimits {
        &self.limits
    }

    /// Append an audit record. An audit failure is logged, never silently dropped.
    pub(crate) async fn audit(&self, caller: &Caller, d: Decision<'_>) {
        let rec = AuditRecord {
            seq: 0,
            at: self.clock.now(),
            correlation_id: caller.correlation_id.clone(),
            principal_iss: caller.principal.issuer.clone(),
            principal_sub: caller.principal.subject.clone(),
            tool: d.tool.to_string(),
            decision: d.decision.to_string(),
            code: d.code.map(|c| c.as_str().to_string()),
            idempotency_key: d.idempotency_key.map(str::to_string),
            payment_id: d.payment_id.map(str::to_string),
            approval_id: d.approval_id.map(str::to_string),
            detail: d.detail,
        };
        if let Err(error) = self.store.audit_append(rec).await {
            tracing::error!(correlation_id = %caller.correlation_id, %error, "audit append failed");
        }
    }

    /// Parse a page size against the configured bounds.
    fn page_limit(&self, limit: Option<u32>) -> Result<u32, AgentError> {
        match limit {
            None => Ok(self.limits.list_limit_default),
            Some(n) if n >= 1 && n <= self.limits.list_limit_max => Ok(n),
            Some(n) => Err(AgentError::invalid(format!("limit must be 1..={}, got {n}", self.limits.list_limit_max))),
        }
    }
}

/// Cursors are opaque to agents: base64url of a version tag and the last row's sequence number.
pub fn encode_cursor(seq: i64) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("v1:{seq}"))
}

pub(crate) fn decode_cursor(cursor: Option<&str>) -> Result<Option<i64>, AgentError> {
    use base64::Engine;
    let Some(c) = cursor else { return Ok(None) };
    let bad = || AgentError::invalid("cursor is not one this server issued; pass next_cursor back unchanged");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    let seq = text.strip_prefix("v1:").and_then(|s| s.parse::<i64>().ok()).filter(|s| *s > 0).ok_or_else(bad)?;
    Ok(Some(seq))
}

/// Exhaustive: every backend error has exactly one agent meaning.
pub(crate) fn map_backend_error(e: &BackendError) -> AgentError {
    match e {
        BackendError::AccountNotFound(a) => AgentError::new(ErrorCode::NotFound, format!("account {a} does not exist"))
            .with_detail("account_id", a.to_string()),
        BackendError::CurrencyMismatch { .. } | BackendError::SameAccount => AgentError::invalid(e.to_string()),
        BackendError::InsufficientFunds { .. } => AgentError::new(ErrorCode::InsufficientFunds, e.to_string()),
        BackendError::PaymentNotFound(p) => AgentError::new(ErrorCode::NotFound, format!("payment {p} does not exist"))
            .with_detail("payment_id", p.to_string()),
        BackendError::NotRefundable(_) | BackendError::RefundExceedsRemaining { .. } => {
            AgentError::invalid(e.to_string())
        }
        BackendError::IdempotencyKeyReused => AgentError::new(ErrorCode::IdempotencyConflict, e.to_string()),
        BackendError::Unavailable(_) => {
            AgentError::new(ErrorCode::BackendUnavailable, "the payment system is unavailable; nothing moved")
                .with_retry_after(1)
        }
        BackendError::OutcomeUnknown(_) => AgentError::new(
            ErrorCode::OutcomeUnknown,
            "the payment system did not confirm the outcome; retry with the same operation_id",
        )
        .with_retry_after(2),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_forgeries() {
        assert_eq!(decode_cursor(Some(&encode_cursor(42))).unwrap(), Some(42));
        assert_eq!(decode_cursor(None).unwrap(), None);
        for bad in ["", "!!", "djE6LTE", "eHl6"] {
            assert!(decode_cursor(Some(bad)).is_err(), "{bad}");
        }
    }
}

/// The id that ties a request's log lines, error envelope and audit records together. Set by the
/// HTTP layer on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorrelationId(pub String);

impl CorrelationId {
    pub fn generate() -> Self {
        CorrelationId(format!("corr_{}", uuid::Uuid::new_v4().simple()))
    }
}
