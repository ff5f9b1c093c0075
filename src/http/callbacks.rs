//! Rail callbacks: `/callbacks/<rail>/{stk,result,timeout}/<secret>` (M-Pesa: `mpesa`). Daraja's callbacks are
//! unsigned, so a callback is accepted only with the deployment's secret — in the path, or, when
//! `mpesa.callback_secret_header` names one, in that header (set by a proxy) — compared in constant
//! time, and, when configured, only from the allowed source addresses. No bearer token: Safaricom
//! cannot hold one.

use std::net::{IpAddr, SocketAddr};

use axum::body::Bytes;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::json;
use std::sync::Mutex;
use std::time::Duration;
use tokio::time::Instant;

use super::AppState;
use crate::backend::rail::CallbackChannel;
use crate::gateway::CallbackOutcome;

/// Largest callback body accepted (a real one is about 1 KiB).
pub const CALLBACK_BODY_BYTES_MAX: usize = 16 * 1024;

/// Refusals before a callback is read (source not allowed, wrong or missing secret) are audited at
/// most once per this interval, the audit record counting those not audited since. Every refusal is
/// still counted in `/metrics` and logged: a flood of guesses cannot flood the audit trail.
pub const REFUSAL_AUDIT_EVERY: Duration = Duration::from_secs(60);

/// What a callback must present.
pub struct CallbackGuard {
    secret: crate::secret::Secret,
    allowed_ips: Vec<IpAddr>,
    /// Proxies in front of the gateway whose `X-Forwarded-For` is believed (the compose nginx).
    trusted_proxies: Vec<IpAddr>,
    /// A header that may carry the secret instead of the path (put there by a proxy).
    secret_header: Option<axum::http::HeaderName>,
    refusals: Mutex<RefusalLog>,
}

#[derive(Default)]
struct RefusalLog {
    last_audit: Option<Instant>,
    not_audited: u64,
}

impl CallbackGuard {
    /// `secret_header`: empty for none; config validated it as a header name (an invalid one is
    /// treated as none, which only ever refuses more).
    pub fn new(
        secret: &crate::secret::Secret,
        allowed_ips: Vec<IpAddr>,
        trusted_proxies: Vec<IpAddr>,
        secret_header: &str,
    ) -> Self {
        let secret_header = (!secret_header.is_empty())
            .then(|| axum::http::HeaderName::from_bytes(secret_header.as_bytes()).ok())
            .flatten();
        CallbackGuard {
            secret: secret.clone(),
            allowed_ips,
            trusted_proxies,
            secret_header,
            refusals: Mutex::default(),
        }
    }

    /// Whether the callback presents the secret: in the path, or in the configured header.
    fn presents_secret(&self, path_secret: Option<&str>, headers: &HeaderMap) -> bool {
        let in_path = path_secret.is_some_and(|s| self.secret.matches(s));
        let in_header = self.secret_header.as_ref().is_some_and(|name| {
            headers.get(name).and_then(|v| v.to_str().ok()).is_some_and(|v| self.secret.matches(v))
        });
        in_path || in_header
    }

    /// The sender: the TCP peer, or, when the peer is a trusted proxy, the nearest address in
    /// `X-Forwarded-For` that is not one (a client cannot forge past the proxies it went through).
    fn sender(&self, peer: Option<IpAddr>, headers: &HeaderMap) -> Option<IpAddr> {
        let peer = peer?;
        if !self.trusted_proxies.contains(&peer) {
            return Some(peer);
        }
        let forwarded: Vec<IpAddr> = headers
            .get_all("x-forwarded-for")
            .iter()
            .filter_map(|v| v.to_str().ok())
            .flat_map(|v| v.split(','))
            .map(|a| a.trim().parse::<IpAddr>())
            .collect::<Result<_, _>>()
            .ok()?; // A malformed header names no one.
        forwarded.into_iter().rev().find(|ip| !self.trusted_proxies.contains(ip))
    }

    fn source_allowed(&self, sender: Option<IpAddr>) -> bool {
        self.allowed_ips.is_empty() || sender.is_some_and(|ip| self.allowed_ips.contains(&ip))
    }

    /// Whether a refusal at `now` gets an audit record, and how many went unaudited before it.
    fn refusal_audit(&self, now: Instant) -> Option<u64> {
        let mut log = self.refusals.lock().unwrap_or_else(|p| p.into_inner());
        match log.last_audit {
            Some(t) if now.saturating_duration_since(t) < REFUSAL_AUDIT_EVERY => {
                log.not_audited += 1;
                None
            }
            _ => {
                log.last_audit = Some(now);
                Some(std::mem::take(&mut log.not_audited))
            }
        }
    }
}

/// Count, log and (throttled) audit a callback refused before it was read.
async fn refuse_unread(
    state: &AppState,
    rail: &str,
    guard: Option<&CallbackGuard>,
    code: &str,
    metric: &'static str,
    what: String,
) {
    let g = &state.gateway;
    g.metrics().callback(rail, metric);
    tracing::warn!(rail, reason = %what, "rail callback refused");
    if let Some(unaudited) = guard.map_or(Some(0), |g| g.refusal_audit(Instant::now())) {
        let detail = if unaudited > 0 { format!("{what} ({unaudited} earlier refusals not audited)") } else { what };
        g.audit_callback_refusal(rail, code, detail).await;
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

fn channel(name: &str) -> Option<CallbackChannel> {
    match name {
        // M-Pesa names its collection callback after the STK push; other rails say "collection".
        "stk" | "collection" => Some(CallbackChannel::Prompt),
        "result" => Some(CallbackChannel::Result),
        "timeout" => Some(CallbackChannel::Timeout),
        _ => None,
    }
}

/// `/callbacks/{rail}/{channel}/{secret}`.
pub async fn with_secret(
    State(state): State<AppState>,
    Path((rail, channel_name, secret)): Path<(String, String, String)>,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    callback(state, &rail, &channel_name, Some(&secret), peer, headers, body).await
}

/// `/callbacks/{rail}/{channel}`: the secret must be in the configured header.
pub async fn without_path_secret(
    State(state): State<AppState>,
    Path((rail, channel_name)): Path<(String, String)>,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    callback(state, &rail, &channel_name, None, peer, headers, body).await
}

async fn callback(
    state: AppState,
    rail: &str,
    channel_name: &str,
    secret: Option<&str>,
    peer: Option<axum::Extension<ConnectInfo<SocketAddr>>>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let Some(guard) = state.rail_callbacks.get(rail).cloned() else {
        let (status, outcome) = status_of(CallbackOutcome::RailDisabled);
        return answer(status, outcome);
    };
    let Some(channel) = channel(channel_name) else { return answer(StatusCode::NOT_FOUND, "not_found") };
    // The source first: it costs nothing and says nothing about the secret.
    let sender = guard.sender(peer.map(|axum::Extension(ConnectInfo(a))| a.ip()), &headers);
    if !guard.source_allowed(sender) {
        let what = format!("source {sender:?} not in {rail}.callback_allowed_ips");
        refuse_unread(&state, rail, Some(&guard), "SOURCE_NOT_ALLOWED", "bad_source", what).await;
        return answer(StatusCode::FORBIDDEN, "source_not_allowed");
    }
    if !guard.presents_secret(secret, &headers) {
        // The guess is never logged or audited, only that it was wrong.
        let what = if secret.is_some() { "wrong callback secret" } else { "no callback secret" };
        let detail = format!("{what} from {sender:?}");
        refuse_unread(&state, rail, Some(&guard), "BAD_SECRET", "bad_secret", detail).await;
        return answer(StatusCode::NOT_FOUND, "not_found");
    }
    let (status, outcome) = status_of(state.gateway.rail_callback(rail, channel, &body).await);
    answer(status, outcome)
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

    /// A flood of refused callbacks writes one audit record per interval, and the next one counts
    /// every refusal that went unaudited since (the trail says how many were not written).
    #[test]
    fn refusals_are_audited_once_an_interval_counting_those_left_out() {
        let secret = crate::secret::Secret::new("callback-secret".into());
        let guard = CallbackGuard::new(&secret, Vec::new(), Vec::new(), "");
        let t0 = Instant::now();
        assert_eq!(guard.refusal_audit(t0), Some(0), "the first refusal is audited");
        for i in 1..=4 {
            assert_eq!(guard.refusal_audit(t0 + Duration::from_secs(i)), None, "refusal {i} inside the interval");
        }
        let almost = t0 + REFUSAL_AUDIT_EVERY - Duration::from_millis(1);
        assert_eq!(guard.refusal_audit(almost), None, "still inside the interval");
        let next = t0 + REFUSAL_AUDIT_EVERY;
        assert_eq!(guard.refusal_audit(next), Some(5), "the next record counts the five left out");
        assert_eq!(guard.refusal_audit(next + Duration::from_secs(1)), None);
        assert_eq!(guard.refusal_audit(next + REFUSAL_AUDIT_EVERY), Some(1), "the count starts again");
    }
}
