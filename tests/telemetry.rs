//! Traces, end to end: the real binary with `[telemetry]` on exports over OTLP/HTTP to an
//! in-process receiver (a real HTTP server decoding the protobuf the exporter sends). One
//! `create_payment`, sent with a W3C `traceparent`, yields the request span (a child of that
//! parent), the tool call, the policy decision, the unit of work and the backend call, each with
//! the request's correlation id, and no span holds the call's arguments.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use common::*;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message;
use serde_json::json;

/// One exported span, flattened.
#[derive(Debug, Clone)]
struct Exported {
    name: String,
    trace_id: String,
    span_id: String,
    parent: String,
    kind: i32,
    attributes: HashMap<String, String>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// An OTLP/HTTP traces receiver: every span it is sent, in order of arrival.
async fn receiver() -> (String, Arc<Mutex<Vec<Exported>>>) {
    let spans: Arc<Mutex<Vec<Exported>>> = Arc::default();
    let sink = spans.clone();
    let router = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: axum::body::Bytes| {
            let sink = sink.clone();
            async move {
                let req = ExportTraceServiceRequest::decode(body).expect("OTLP protobuf");
                let mut out = sink.lock().unwrap();
                for rs in req.resource_spans {
                    for ss in rs.scope_spans {
                        for s in ss.spans {
                            let attributes = s
                                .attributes
                                .iter()
                                .map(|kv| {
                                    let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                                        Some(AnyValue::StringValue(s)) => s.clone(),
                                        Some(AnyValue::IntValue(i)) => i.to_string(),
                                        Some(AnyValue::BoolValue(b)) => b.to_string(),
                                        other => format!("{other:?}"),
                                    };
                                    (kv.key.clone(), v)
                                })
                                .collect();
                            out.push(Exported {
                                name: s.name,
                                trace_id: hex(&s.trace_id),
                                span_id: hex(&s.span_id),
                                parent: hex(&s.parent_span_id),
                                kind: s.kind,
                                attributes,
                            });
                        }
                    }
                }
                // An empty ExportTraceServiceResponse: everything accepted.
                ([("content-type", "application/x-protobuf")], Vec::<u8>::new())
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("http://{}/v1/traces", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, router).await.unwrap() });
    (url, spans)
}

struct Gateway {
    child: Child,
    mcp_url: String,
    token: String,
}

impl Drop for Gateway {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `paygate serve` on a free port with telemetry exporting to `otlp`; its MCP URL and dev token
/// from the start banner.
fn start(dir: &std::path::Path, otlp: &str, extra: &str) -> Gateway {
    let config = dir.join("paygate.toml");
    std::fs::write(
        &config,
        format!(
            "[server]\nbind = \"127.0.0.1:0\"\n[storage]\ndata_dir = {data:?}\n[jobs]\nenabled = false\n\
             [telemetry]\nenabled = true\notlp_endpoint = {otlp:?}\nexport_interval_ms = 100\n{extra}",
            data = dir.join("data").to_str().unwrap(),
        ),
    )
    .unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_paygate"))
        .args(["serve", "--config", config.to_str().unwrap()])
        .env_clear()
        .env("PAYGATE_LOG", "warn")
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let (mut mcp_url, mut token) = (None, None);
    while let Some(Ok(line)) = lines.next() {
        if let Some(u) = line.strip_prefix("paygate MCP endpoint: ") {
            mcp_url = Some(u.trim().to_string());
        } else if line.starts_with("dev token") {
            token = lines.next().and_then(Result::ok);
        }
        if mcp_url.is_some() && token.is_some() {
            break;
        }
    }
    // Keep draining stdout so the server never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    Gateway { child, mcp_url: mcp_url.expect("MCP URL in the banner"), token: token.expect("dev token in the banner") }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_payment_is_one_trace_under_the_callers_traceparent_with_the_correlation_id_on_every_span() {
    paygate::install_crypto_provider();
    let (otlp, spans) = receiver().await;
    let dir = tempfile::tempdir().unwrap();
    let gw = start(dir.path(), &otlp, "");

    // The caller's trace: W3C trace context on every request it sends.
    let (trace_id, parent_id) = ("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7");
    let client = traced_client(&gw, trace_id, parent_id).await;
    let memo = "telemetry-memo-canary";
    let paid = call(
        &client,
        "create_payment",
        json!({"operation_id": "traced-1", "from_account": "acct-A", "to_account": "acct-B",
               "amount": "50.00", "currency": "KES", "memo": memo}),
    )
    .await;
    ok(&paid);

    // Wait for the batch to arrive (the exporter sends every 100 ms), not for a fixed time.
    let wanted = ["request", "tool", "policy", "unit_of_work", "backend"];
    let (_, all) = exported_backend(&spans, trace_id).await;
    let tool = all
        .iter()
        .find(|s| s.name == "tool" && s.attributes.get("tool").map(String::as_str) == Some("create_payment"))
        .cloned()
        .unwrap_or_else(|| panic!("no create_payment tool span: {all:#?}"));
    let trace: Vec<&Exported> = all.iter().filter(|s| s.trace_id == tool.trace_id).collect();
    let by_id: HashMap<&str, &Exported> = trace.iter().map(|s| (s.span_id.as_str(), *s)).collect();

    // The caller's traceparent is the parent: same trace, the request span a child of its span.
    assert_eq!(tool.trace_id, trace_id, "the payment joins the caller's trace");
    let request = by_id[tool.parent.as_str()];
    assert_eq!((request.name.as_str(), request.parent.as_str()), ("request", parent_id), "{request:?}");
    assert_eq!(request.kind, 2, "a server span: {request:?}"); // SPAN_KIND_SERVER
    assert_eq!(request.attributes.get("http.path").map(String::as_str), Some("/mcp"));
    assert_eq!(request.attributes.get("http.status_code").map(String::as_str), Some("200"));

    // Request → tool → policy, unit of work → backend: each carries the request's correlation id.
    let correlation = request.attributes["correlation_id"].clone();
    assert!(correlation.starts_with("corr_"), "{correlation}");
    let child = |parent: &Exported, name: &str| -> Exported {
        (*trace
            .iter()
            .find(|s| s.name == name && s.parent == parent.span_id)
            .unwrap_or_else(|| panic!("no {name} span under {}: {trace:#?}", parent.name)))
        .clone()
    };
    let policy = child(&tool, "policy");
    let unit = child(&tool, "unit_of_work");
    let backend = child(&unit, "backend");
    for span in [request, &tool, &policy, &unit, &backend] {
        assert_eq!(span.attributes.get("correlation_id"), Some(&correlation), "{}: {span:?}", span.name);
    }
    assert_eq!(
        [request, &tool, &policy, &unit, &backend].map(|s| s.name.as_str()),
        wanted,
        "request → tool → policy, unit of work → backend"
    );
    assert_eq!(policy.attributes.get("decision").map(String::as_str), Some("allow"));
    assert_eq!(backend.attributes.get("backend").map(String::as_str), Some("ledger"));
    assert_eq!(backend.kind, 3, "a client span: {backend:?}"); // SPAN_KIND_CLIENT

    // It is the request's real correlation id (the audit record of the payment carries it), and
    // no span holds an argument or the token.
    let records = paygate_audit(dir.path(), &correlation).await;
    assert!(records.iter().any(|r| r == "create_payment"), "{records:?}");
    for s in &all {
        for v in s.attributes.values() {
            assert!(!v.contains(memo) && !v.contains(&gw.token), "{s:?}");
        }
    }
    let _ = client.cancel().await;
}

/// A 2026-07-28 MCP client sending `traceparent: 00-<trace_id>-<parent_id>-01` on every request.
async fn traced_client(gw: &Gateway, trace_id: &str, parent_id: &str) -> Client {
    use rmcp::ClientServiceExt as _;
    let mut cfg = transport_config(&gw.mcp_url, &gw.token);
    cfg.custom_headers.insert(
        http::HeaderName::from_static("traceparent"),
        http::HeaderValue::from_str(&format!("00-{trace_id}-{parent_id}-01")).unwrap(),
    );
    let transport = rmcp::transport::StreamableHttpClientTransport::from_config(cfg);
    let mode =
        rmcp::ClientLifecycleMode::Discover { preferred_versions: vec![rmcp::model::ProtocolVersion::V_2026_07_28] };
    rmcp::model::ClientConfig::default()
        .with_protocol_version(rmcp::model::ProtocolVersion::V_2026_07_28)
        .serve_with_lifecycle(transport, mode)
        .await
        .unwrap()
}

/// Wait (up to 30 s) until a `backend` span of `trace_id` has been exported; all spans so far.
async fn exported_backend(spans: &Arc<Mutex<Vec<Exported>>>, trace_id: &str) -> (Exported, Vec<Exported>) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let got = spans.lock().unwrap().clone();
        if let Some(b) = got.iter().find(|s| s.name == "backend" && s.trace_id == trace_id) {
            return (b.clone(), got);
        }
        assert!(tokio::time::Instant::now() < deadline, "no backend span exported: {got:#?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_http_ledger_is_called_with_the_trace_context_of_the_backend_span() {
    use paygate::clock::Clock as _;
    paygate::install_crypto_provider();
    let (otlp, spans) = receiver().await;
    // ledger-serve's router (SQLite in memory, acct-A and acct-B), recording each traceparent.
    let clock = paygate::clock::SystemClock;
    let store: Arc<dyn paygate::store::Store> =
        Arc::new(paygate::store::sqlite::SqliteStore::open_in_memory().unwrap());
    for (id, opening_minor) in [("acct-A", 10_000_000), ("acct-B", 0)] {
        let seed = paygate::domain::payment::AccountSeed {
            id: paygate::domain::ids::AccountId::parse(id).unwrap(),
            currency: paygate::domain::money::Currency::parse("KES").unwrap(),
            opening_minor,
            allow_overdraft: false,
        };
        store.ledger_open_account(seed, clock.now()).await.unwrap();
    }
    let seen: Arc<Mutex<Vec<(String, String)>>> = Arc::default();
    let record = seen.clone();
    let credential = "telemetry-ledger-credential-0123456789";
    let ledger = paygate::ledger_service::router(store, Arc::new(clock), paygate::auth::Secret::new(credential.into()))
        .layer(axum::middleware::from_fn(move |req: axum::extract::Request, next: axum::middleware::Next| {
            let record = record.clone();
            async move {
                let tp = req.headers().get("traceparent").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
                record.lock().unwrap().push((req.uri().path().to_string(), tp));
                next.run(req).await
            }
        }));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let ledger_url = format!("http://{}", listener.local_addr().unwrap());
    tokio::spawn(async move { axum::serve(listener, ledger).await.unwrap() });

    let dir = tempfile::tempdir().unwrap();
    let backend = format!("[backend]\nkind = \"http\"\nhttp_url = {ledger_url:?}\nhttp_credential = {credential:?}\n");
    let gw = start(dir.path(), &otlp, &backend);
    let trace_id = "0af7651916cd43dd8448eb211c80319c";
    let client = traced_client(&gw, trace_id, "b7ad6b7169203331").await;
    ok(&call(
        &client,
        "create_payment",
        json!({"operation_id": "traced-http-1", "from_account": "acct-A", "to_account": "acct-B",
               "amount": "50.00", "currency": "KES"}),
    )
    .await);
    let (backend_span, _) = exported_backend(&spans, trace_id).await;
    assert_eq!(backend_span.attributes.get("backend").map(String::as_str), Some("http"));
    // The ledger's POST /v1/payments carried the trace: same trace id, the backend span as parent.
    let posts: Vec<String> =
        seen.lock().unwrap().iter().filter(|(path, _)| path == "/v1/payments").map(|(_, tp)| tp.clone()).collect();
    assert_eq!(posts.len(), 1, "{posts:?}");
    let parts: Vec<&str> = posts[0].split('-').collect();
    assert_eq!(parts.len(), 4, "a W3C traceparent: {posts:?}");
    assert_eq!((parts[1], parts[2]), (trace_id, backend_span.span_id.as_str()), "{posts:?}");
    let _ = client.cancel().await;
}

/// The tools of the audit records with `correlation` (the gateway's SQLite store, read directly).
async fn paygate_audit(dir: &std::path::Path, correlation: &str) -> Vec<String> {
    let cfg = config_for(&dir.join("data"), &[]);
    let store = paygate::app::open_store(&cfg).await.unwrap();
    let records = store.audit_list(None, 100).await.unwrap();
    records.into_iter().filter(|r| r.correlation_id == correlation).map(|r| r.tool).collect()
}
