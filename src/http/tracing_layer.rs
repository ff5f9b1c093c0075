//! The request span (tower-http's `TraceLayer`): one `request` span per HTTP request, carrying the
//! correlation id, method and (loggable) path, a child of an incoming W3C `traceparent` when
//! telemetry is on; its closing line is the request log line. The span is kept in the request's
//! extensions (`telemetry::RequestSpan`) so work that runs elsewhere (rmcp runs tool calls on its
//! own tasks) still hangs under it.

use std::time::Duration;

use axum::extract::Request;
use axum::middleware::Next;
use axum::response::Response;
use tracing::Span;

use crate::gateway::CorrelationId;
use crate::telemetry::RequestSpan;

/// `TraceLayer::make_span_with`: the `request` span (the correlation middleware, outside it, has
/// already set the id).
pub fn make_span(req: &Request) -> Span {
    let correlation = req.extensions().get::<CorrelationId>().map(|c| c.0.as_str()).unwrap_or("");
    let path = super::auth_layer::loggable_path(req.uri().path());
    let span = tracing::info_span!(
        "request",
        correlation_id = %correlation,
        http.method = %req.method(),
        http.path = %path,
        http.status_code = tracing::field::Empty,
        otel.kind = "server",
    );
    crate::telemetry::adopt_parent(&span, req.headers());
    span
}

/// `TraceLayer::on_response`: the request log line, inside the span (so it carries its fields).
pub fn on_response(resp: &Response, latency: Duration, span: &Span) {
    span.record("http.status_code", resp.status().as_u16());
    tracing::info!(http.status = resp.status().as_u16(), duration_ms = latency.as_millis() as u64, "request");
}

/// Innermost: keep the request span where handlers (and rmcp's tasks) can find it.
pub async fn remember_span(mut req: Request, next: Next) -> Response {
    req.extensions_mut().insert(RequestSpan(Span::current()));
    next.run(req).await
}
