//! Rail callbacks. Daraja's STK callbacks are unsigned, so a callback is accepted only on a path
//! holding the deployment's secret (compared in constant time) and, when configured, only from
//! the allowed source addresses. No bearer token: Safaricom cannot hold one.

use std::net::{IpAddr, SocketAddr};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use sha2::{Digest, Sha256};

use super::AppState;
use crate::gateway::CallbackOutcome;

/// Largest callback body accepted (a real one is about 1 KiB).
pub const CALLBACK_BODY_BYTES_MAX: usize = 16 * 1024;

/// What a callback must present.
pub struct CallbackGuard {
    secret_digest: [u8; 32],
    allowed_ips: Vec<IpAddr>,
}

impl CallbackGuard {
    pub fn new(secret: &crate::secret::Secret, allowed_ips: Vec<IpAddr>) -> Self {
        CallbackGuard { secret_digest: Sha256::digest(secret.expose().as_bytes()).into(), allowed_ips }
    }

    fn secret_matches(&self, presented: &str) -> bool {
        // Equal-length digests compared without an early exit: timing says nothing about the secret.
        let d: [u8; 32] = Sha256::digest(presented.as_bytes()).into();
        d.iter().zip(self.secret_digest.iter()).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }

    fn source_allowed(&self, peer: Option<IpAddr>) -> bool {
        self.allowed_ips.is_empty() || peer.is_some_and(|ip| self.allowed_ips.contains(&ip))
    }
}

/// Daraja expects a JSON acknowledgement; refusals carry a short machine-readable reason.
fn answer(status: StatusCode, outcome: &str) -> Response {
    let body = if status.is_success() {
        json!({"ResultCode": 0, "ResultDesc": "Accepted", "outcome": outcome})
    } else {
        json!({"ResultCode": 1, "ResultDesc": "Rejected", "outcome": outcome})
    };
    (status, axum::Json(body)).into_response()
}

/// The HTTP answer to each way a callback ends, in one exhaustive match. A refusal the sender
/// should not repeat is 4xx (404 unknown, 400 malformed, 409 already settled, 422 does not match);
/// 503 asks it to send again; anything the gateway took in is 200.
fn status_of(outcome: CallbackOutcome) -> (StatusCode, &'static str) {
    match outcome {
        CallbackOutcome::RailDisabled => (StatusCode::NOT_FOUND, "mpesa_disabled"),
        CallbackOutcome::Malformed => (StatusCode::BAD_REQUEST, "malformed"),
        CallbackOutcome::UnknownReference => (StatusCode::NOT_FOUND, "unknown_checkout"),
        CallbackOutcome::StoreUnavailable => (StatusCode::SERVICE_UNAVAILABLE, "store_unavailable"),
        CallbackOutcome::ReceiptRecorded => (StatusCode::OK, "receipt_recorded"),
        CallbackOutcome::Terminal => (StatusCode::CONFLICT, "terminal"),
        CallbackOutcome::NotPending => (StatusCode::CONFLICT, "not_pending"),
        CallbackOutcome::AmountMismatch => (StatusCode::UNPROCESSABLE_ENTITY, "amount_mismatch"),
        CallbackOutcome::PayerMismatch => (StatusCode::UNPROCESSABLE_ENTITY, "phone_mismatch"),
        CallbackOutcome::ReceiptMissing => (StatusCode::UNPROCESSABLE_ENTITY, "receipt_missing"),
        CallbackOutcome::NotConfirmed => (StatusCode::UNPROCESSABLE_ENTITY, "not_confirmed"),
        CallbackOutcome::AwaitingConfirmation => (StatusCode::OK, "awaiting_confirmation"),
        CallbackOutcome::Succeeded => (StatusCode::OK, "succeeded"),
        CallbackOutcome::Failed => (StatusCode::OK, "failed"),
        CallbackOutcome::StillPending => (StatusCode::OK, "still_pending"),
    }
}

pub async fn mpesa_stk(
    State(state): State<AppState>,
    Path(secret): Path<String>,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    body: Bytes,
) -> Response {
    let g = &state.gateway;
    let Some(guard) = state.mpesa_callback.as_ref() else {
        let (status, outcome) = status_of(CallbackOutcome::RailDisabled);
        return answer(status, outcome);
    };
    let peer_ip = peer.map(|axum::Extension(ConnectInfo(a))| a.ip());
    if !guard.secret_matches(&secret) {
        // Not audited per request with the path (it holds the guess); counted and logged without it.
        tracing::warn!(peer = ?peer_ip, "M-Pesa callback with a wrong path secret refused");
        g.metrics().callback("bad_secret");
        g.audit_callback_refusal("BAD_SECRET", format!("wrong path secret from {peer_ip:?}")).await;
        return answer(StatusCode::NOT_FOUND, "not_found");
    }
    if !guard.source_allowed(peer_ip) {
        tracing::warn!(peer = ?peer_ip, "M-Pesa callback from an address not allowed");
        g.metrics().callback("bad_source");
        g.audit_callback_refusal("SOURCE_NOT_ALLOWED", format!("source {peer_ip:?} not in mpesa.callback_allowed_ips"))
            .await;
        return answer(StatusCode::FORBIDDEN, "source_not_allowed");
    }
    let (status, outcome) = status_of(g.rail_callback(&body).await);
    answer(status, outcome)
}

/// A callback that presents no secret at all: refused and audited like a wrong one.
pub async fn mpesa_stk_without_secret(State(state): State<AppState>) -> Response {
    if state.mpesa_callback.is_none() {
        let (status, outcome) = status_of(CallbackOutcome::RailDisabled);
        return answer(status, outcome);
    }
    state.gateway.metrics().callback("bad_secret");
    state.gateway.audit_callback_refusal("BAD_SECRET", "no path secret".into()).await;
    answer(StatusCode::NOT_FOUND, "not_found")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answers Daraja has always had from this endpoint: the choice moved here from the
    /// gateway, the numbers did not change.
    #[test]
    fn every_callback_outcome_has_its_answer() {
        let cases = [
            (CallbackOutcome::RailDisabled, 404, "mpesa_disabled"),
            (CallbackOutcome::Malformed, 400, "malformed"),
            (CallbackOutcome::UnknownReference, 404, "unknown_checkout"),
            (CallbackOutcome::StoreUnavailable, 503, "store_unavailable"),
            (CallbackOutcome::ReceiptRecorded, 200, "receipt_recorded"),
            (CallbackOutcome::Terminal, 409, "terminal"),
            (CallbackOutcome::NotPending, 409, "not_pending"),
            (CallbackOutcome::AmountMismatch, 422, "amount_mismatch"),
            (CallbackOutcome::PayerMismatch, 422, "phone_mismatch"),
            (CallbackOutcome::ReceiptMissing, 422, "receipt_missing"),
            (CallbackOutcome::NotConfirmed, 422, "not_confirmed"),
            (CallbackOutcome::AwaitingConfirmation, 200, "awaiting_confirmation"),
            (CallbackOutcome::Succeeded, 200, "succeeded"),
            (CallbackOutcome::Failed, 200, "failed"),
            (CallbackOutcome::StillPending, 200, "still_pending"),
        ];
        for (outcome, status, name) in cases {
            let (got_status, got_name) = status_of(outcome);
            assert_eq!((got_status.as_u16(), got_name), (status, name), "{outcome:?}");
        }
    }
}
