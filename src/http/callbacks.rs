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
fn answer(status: u16, outcome: &str) -> Response {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = if code.is_success() {
        json!({"ResultCode": 0, "ResultDesc": "Accepted", "outcome": outcome})
    } else {
        json!({"ResultCode": 1, "ResultDesc": "Rejected", "outcome": outcome})
    };
    (code, axum::Json(body)).into_response()
}

pub async fn mpesa_stk(
    State(state): State<AppState>,
    Path(secret): Path<String>,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    body: Bytes,
) -> Response {
    let g = &state.gateway;
    let Some(guard) = state.mpesa_callback.as_ref() else { return answer(404, "mpesa_disabled") };
    let peer_ip = peer.map(|axum::Extension(ConnectInfo(a))| a.ip());
    if !guard.secret_matches(&secret) {
        // Not audited per request with the path (it holds the guess); counted and logged without it.
        tracing::warn!(peer = ?peer_ip, "M-Pesa callback with a wrong path secret refused");
        g.metrics().callback("bad_secret");
        g.audit_callback_refusal("BAD_SECRET", format!("wrong path secret from {peer_ip:?}")).await;
        return answer(404, "not_found");
    }
    if !guard.source_allowed(peer_ip) {
        tracing::warn!(peer = ?peer_ip, "M-Pesa callback from an address not allowed");
        g.metrics().callback("bad_source");
        g.audit_callback_refusal("SOURCE_NOT_ALLOWED", format!("source {peer_ip:?} not in mpesa.callback_allowed_ips"))
            .await;
        return answer(403, "source_not_allowed");
    }
    let a = g.mpesa_callback(&body).await;
    answer(a.status, a.outcome)
}

/// A callback that presents no secret at all: refused and audited like a wrong one.
pub async fn mpesa_stk_without_secret(State(state): State<AppState>) -> Response {
    if state.mpesa_callback.is_none() {
        return answer(404, "mpesa_disabled");
    }
    state.gateway.metrics().callback("bad_secret");
    state.gateway.audit_callback_refusal("BAD_SECRET", "no path secret".into()).await;
    answer(404, "not_found")
}
