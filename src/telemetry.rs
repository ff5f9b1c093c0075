//! OpenTelemetry traces (`[telemetry]`, off by default): the tracing spans paygate opens — the
//! HTTP request, the tool call, the policy decision, the unit of work, the backend or rail call —
//! exported over OTLP/HTTP (protobuf) with W3C trace context in (`traceparent` on a request makes
//! its span a child) and out (on calls to an HTTP ledger service and the rails).
//!
//! The span names and the fields every one of them carries are in [`spans`]; no span holds a
//! token, a tool argument, a memo or a phone number (the same rule as the logs).

use std::time::Duration;

use opentelemetry::trace::TracerProvider as _;
use opentelemetry_http::{Bytes, HttpClient, HttpError, Request, Response};
use opentelemetry_otlp::{WithExportConfig, WithHttpConfig};
use opentelemetry_sdk::trace::{BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider};
use tracing_opentelemetry::OpenTelemetrySpanExt;

/// What the exporter needs (from `[telemetry]`: `config::TelemetryConfig::settings`).
#[derive(Debug, Clone)]
pub struct Settings {
    pub otlp_endpoint: String,
    pub service_name: String,
    pub export_interval: Duration,
    pub export_timeout: Duration,
    pub queue_max: usize,
}

/// The spans, by name. Each carries `correlation_id` (the request's, as in its logs and errors).
pub mod spans {
    /// One HTTP request (`http.method`, `http.path`, `http.status_code`); parent: `traceparent`.
    pub const REQUEST: &str = "request";
    /// One tool call (`tool`), under its request.
    pub const TOOL: &str = "tool";
    /// The policy decision for a money-moving call (`tool`, `decision`).
    pub const POLICY: &str = "policy";
    /// The exactly-once unit of work: claim or reserve the keys, move the money, record the outcome.
    pub const UNIT_OF_WORK: &str = "unit_of_work";
    /// The call to the payment backend or rail (`backend`).
    pub const BACKEND: &str = "backend";
}

/// The span of the HTTP request a handler serves, in the request's extensions (the HTTP layer puts
/// it there; the MCP tool calls, which rmcp runs on its own tasks, hang under it).
#[derive(Clone)]
pub struct RequestSpan(pub tracing::Span);

/// The running exporter; [`Telemetry::shutdown`] sends what is still queued.
pub struct Telemetry {
    provider: SdkTracerProvider,
}

/// The tracing layer and its exporter, or why they could not be built. Call inside the Tokio
/// runtime: exports run on it.
pub fn start(cfg: &Settings) -> Result<(Telemetry, opentelemetry_sdk::trace::Tracer), String> {
    crate::install_crypto_provider();
    let timeout = cfg.export_timeout;
    let client = reqwest::Client::builder()
        .timeout(timeout)
        .connect_timeout(timeout.min(Duration::from_secs(5)))
        .build()
        .map_err(|e| format!("telemetry: {e}"))?;
    let handle = tokio::runtime::Handle::try_current().map_err(|_| "telemetry: no Tokio runtime".to_string())?;
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .with_http_client(OnRuntime { client, handle, timeout })
        .with_protocol(opentelemetry_otlp::Protocol::HttpBinary)
        .with_endpoint(cfg.otlp_endpoint.clone())
        .with_timeout(timeout)
        .build()
        .map_err(|e| format!("telemetry: {e}"))?;
    let batch = BatchConfigBuilder::default()
        .with_max_queue_size(cfg.queue_max)
        .with_max_export_batch_size(cfg.queue_max.min(512))
        .with_scheduled_delay(cfg.export_interval)
        .build();
    let resource = opentelemetry_sdk::Resource::builder()
        .with_service_name(cfg.service_name.clone())
        .with_attribute(opentelemetry::KeyValue::new("service.version", env!("CARGO_PKG_VERSION")))
        .build();
    let provider = SdkTracerProvider::builder()
        .with_span_processor(BatchSpanProcessor::builder(exporter).with_batch_config(batch).build())
        .with_resource(resource)
        .build();
    opentelemetry::global::set_text_map_propagator(opentelemetry_sdk::propagation::TraceContextPropagator::new());
    let tracer = provider.tracer("paygate");
    Ok((Telemetry { provider }, tracer))
}

impl Telemetry {
    /// Export what is queued, then stop (off the runtime's workers: the export needs them).
    pub async fn shutdown(self) {
        let provider = self.provider;
        let _ = tokio::task::spawn_blocking(move || provider.shutdown()).await;
    }
}

/// The OTLP exporter's HTTP client: our reqwest client, run on the server's Tokio runtime. The
/// batch processor exports from its own thread, where no runtime is current.
#[derive(Debug)]
struct OnRuntime {
    client: reqwest::Client,
    handle: tokio::runtime::Handle,
    timeout: Duration,
}

#[async_trait::async_trait]
impl HttpClient for OnRuntime {
    async fn send_bytes(&self, request: Request<Bytes>) -> Result<Response<Bytes>, HttpError> {
        let (client, timeout) = (self.client.clone(), self.timeout);
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.handle.spawn(async move {
            let sent = tokio::time::timeout(timeout, client.send_bytes(request))
                .await
                .unwrap_or_else(|_| Err("telemetry export timed out".into()));
            let _ = tx.send(sent);
        });
        rx.await.map_err(|_| HttpError::from("telemetry export abandoned (runtime stopped)"))?
    }
}

/// The context of the current span, as W3C trace context headers on an outgoing request (nothing
/// when telemetry is off).
pub fn inject(headers: &mut http::HeaderMap) {
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| {
        p.inject_context(&cx, &mut opentelemetry_http::HeaderInjector(headers));
    });
}

/// [`inject`] for a reqwest request about to be sent.
pub fn traced(builder: reqwest::RequestBuilder) -> reqwest::RequestBuilder {
    let mut headers = http::HeaderMap::new();
    inject(&mut headers);
    if headers.is_empty() { builder } else { builder.headers(headers) }
}

/// Make `span` a child of the trace an incoming request names in `traceparent`, if it names one.
pub fn adopt_parent(span: &tracing::Span, headers: &http::HeaderMap) {
    if !headers.contains_key("traceparent") {
        return;
    }
    let cx =
        opentelemetry::global::get_text_map_propagator(|p| p.extract(&opentelemetry_http::HeaderExtractor(headers)));
    let _ = span.set_parent(cx);
}
