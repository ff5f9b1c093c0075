//! The request middleware, outermost but for the sensitive-header marking: every request gets a
//! fresh correlation id (back in `x-correlation-id`), one `request` span carrying it, the method
//! and the (loggable) path — a child of an incoming W3C `traceparent` when telemetry is on — whose
//! closing line is the request log line, and the HTTP metric. The span is kept in the request's
//! extensions (`telemetry::RequestSpan`) so work that runs elsewhere (rmcp runs tool calls on its
//! own tasks) still hangs under it.
//!
//! One middleware, not tower-http's `TraceLayer` between two `from_fn` layers: each `from_fn`
//! clones the whole service stack below it on every request.

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;
use tracing::{Instrument, Span};

use super::AppState;
use crate::gateway::CorrelationId;
use crate::telemetry::RequestSpan;

/// A client-sent correlation id is not trusted (it would let one agent's records be confused with
/// another's); a client's `traceparent` is (telemetry on), as the parent of the request's span,
/// never as its id.
pub async fn request(State(state): State<AppState>, mut req: Request, next: Next) -> Response {
    let id = CorrelationId::generate();
    let route = crate::metrics::route(req.uri().path());
    let span = make_span(&id, &req);
    req.extensions_mut().insert(id.clone());
    req.extensions_mut().insert(RequestSpan(span.clone()));
    let started = tokio::time::Instant::now();
    let mut resp = next.run(req).instrument(span.clone()).await;
    let latency = started.elapsed();
    let status = resp.status().as_u16();
    span.record("http.status_code", status);
    span.in_scope(|| {
        tracing::info!(http.status = status, duration_ms = latency.as_millis() as u64, "request");
        if resp.status().is_server_error() {
            tracing::error!(http.status = status, duration_ms = latency.as_millis() as u64, "response failed");
        }
    });
    state.gateway.metrics().http(route, status, latency);
    if let Ok(v) = HeaderValue::from_str(&id.0) {
        resp.headers_mut().insert("x-correlation-id", v);
    }
    resp
}

/// The `request` span.
fn make_span(id: &CorrelationId, req: &Request) -> Span {
    let path = super::auth_layer::loggable_path(req.uri().path());
    let span = tracing::info_span!(
        "request",
        correlation_id = %id.0,
        http.method = %req.method(),
        http.path = %path,
        http.status_code = tracing::field::Empty,
        otel.kind = "server",
    );
    crate::telemetry::adopt_parent(&span, req.headers());
    span
}
