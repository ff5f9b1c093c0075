//! The HTTP edge: router, middleware, RFC 9728 metadata, probes. Only this module and `mcp` know
//! about HTTP and MCP types.

mod approvals;
mod auth_layer;
mod callbacks;
mod console;
mod operator;
mod passkeys;
mod policy;
mod sessions;
mod simulator;
mod tracing_layer;

pub use auth_layer::{Peeked, peek};
pub use callbacks::CallbackGuard;
pub use console::ConsoleSettings;
pub use sessions::SessionBindings;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::extract::State;
use axum::handler::Handler;
use axum::http::{HeaderName, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{MethodFilter, MethodRouter, get, on, post};
use rmcp::transport::streamable_http_server::session::local::LocalSessionManager;
use rmcp::transport::{StreamableHttpServerConfig, StreamableHttpService};
use serde_json::json;
use tokio_util::sync::CancellationToken;
use tower_http::cors::{AllowOrigin, CorsLayer};
use tower_http::limit::RequestBodyLimitLayer;
use tower_http::timeout::TimeoutLayer;

use crate::auth::Verifier;
use crate::catalogue::scopes::{AGENT_SCOPES, OPERATOR_SCOPES};
use crate::gateway::Gateway;
use crate::mcp::PaygateMcp;
use crate::secret::Secret;

pub const METADATA_PATH: &str = "/.well-known/oauth-protected-resource";
pub use crate::gateway::MANDATE_JWKS_PATH;

/// Everything a handler needs. Cloned by every middleware layer on every request, so it is one
/// `Arc` (a clone is a reference-count bump, not a copy of its strings and lists).
#[derive(Clone)]
pub struct AppState(Arc<AppInner>);

impl AppState {
    pub fn new(inner: AppInner) -> Self {
        AppState(Arc::new(inner))
    }
}

impl std::ops::Deref for AppState {
    type Target = AppInner;
    fn deref(&self) -> &AppInner {
        &self.0
    }
}

pub struct AppInner {
    pub gateway: Arc<Gateway>,
    /// Per-operator limits on the approval and principal routes.
    pub route_limits: Arc<crate::rate::KeyedLimits>,
    pub routes_per_minute: u32,
    pub verifier: Arc<Verifier>,
    pub sessions: Arc<SessionBindings>,
    /// The MCP resource (`<public_url>/mcp`): the audience every agent token must carry.
    pub resource_url: String,
    /// `<public_url>/.well-known/oauth-protected-resource/mcp`, named in every /mcp challenge.
    pub metadata_url: String,
    /// The operator resource (`<public_url>/operator`): the audience of operators' tokens (the
    /// approval routes, `/principals`, `/operator/v1`, the console).
    pub operator_resource_url: String,
    /// `<public_url>/.well-known/oauth-protected-resource/operator`, named in operator challenges.
    pub operator_metadata_url: String,
    /// Agent tokens → principals (`auth.legacy_agent_admin_scope` with it: an agent token's
    /// `payments:admin` reads as `payments:integrity`, a migration switch, off by default). The same
    /// path `paygate stdio` takes.
    pub agents: crate::auth::AgentAuth,
    pub authorization_servers: Vec<String>,
    /// Browser origins allowed on /mcp (the public URL's own origin and configured extras).
    pub allowed_origins: Vec<String>,
    pub body_bytes_max: usize,
    /// How long an idle session lives: the Retry-After of an agent at its session cap.
    pub session_idle_secs: u64,
    /// Each enabled rail's callback secret and source allow-list, by rail name.
    pub rail_callbacks: Arc<std::collections::HashMap<String, Arc<CallbackGuard>>>,
    /// The rails simulated here (`<rail>.environment = "simulator"`): each one's API under
    /// `/simulator/<rail>`, its control routes under `/simulator/control/<rail>` (operators).
    pub simulators: Vec<Arc<dyn crate::backend::simulator::RailSimulator>>,
    /// Bearer token /metrics asks for; `None`: loopback peers only.
    pub metrics_token: Option<Secret>,
    /// The operator console's sign-in settings; `None`: the console is off.
    pub console: Option<ConsoleSettings>,
}

pub struct RouterConfig {
    pub request_timeout: Duration,
    pub session_idle: Duration,
    /// Host header values rmcp accepts (DNS-rebinding defence): the public URL's host and the bound address.
    pub allowed_hosts: Vec<String>,
    pub shutdown: CancellationToken,
    /// Tools switched off by config.
    pub disabled_tools: Vec<String>,
}

pub fn router(state: AppState, cfg: RouterConfig) -> Router {
    let mut sessions = LocalSessionManager::default();
    sessions.session_config.keep_alive = Some(cfg.session_idle);
    let mcp_config = StreamableHttpServerConfig::default()
        // 2026-07-28 requests are answered with plain JSON (no SSE framing to build or parse).
        .with_json_response(true)
        .with_allowed_hosts(cfg.allowed_hosts)
        .with_max_request_body_bytes(state.body_bytes_max)
        .with_cancellation_token(cfg.shutdown.child_token());
    let server = PaygateMcp::new(state.gateway.clone(), &cfg.disabled_tools);
    // Shared behind one Arc: rmcp's own tower service clones its whole config (allowed hosts and
    // all) twice per request, once where axum clones the route's service and once in `call`.
    let mcp = Arc::new(StreamableHttpService::new(move || Ok(server.clone()), Arc::new(sessions), mcp_config));
    let mcp = axum::routing::any(move |req: axum::extract::Request| {
        let mcp = mcp.clone();
        async move { mcp.handle(req).await }
    });

    let cors = CorsLayer::new()
        .allow_origin(AllowOrigin::list(state.allowed_origins.iter().filter_map(|o| HeaderValue::from_str(o).ok())))
        .allow_methods([Method::GET, Method::POST, Method::DELETE])
        .allow_headers([
            header::AUTHORIZATION,
            header::CONTENT_TYPE,
            header::ACCEPT,
            HeaderName::from_static("mcp-protocol-version"),
            HeaderName::from_static("mcp-session-id"),
            HeaderName::from_static("mcp-method"),
            HeaderName::from_static("mcp-name"),
            HeaderName::from_static("last-event-id"),
        ])
        .expose_headers([
            header::WWW_AUTHENTICATE,
            HeaderName::from_static("mcp-session-id"),
            HeaderName::from_static("x-correlation-id"),
        ]);

    // Read top to bottom: the outermost layer comes last in `.layer` order, so list them reversed.
    let mcp_routes = Router::new()
        .nest_service("/mcp", mcp)
        .layer(axum::middleware::from_fn_with_state(state.clone(), auth_layer::mcp_gate))
        .layer(RequestBodyLimitLayer::new(state.body_bytes_max))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, cfg.request_timeout))
        .layer(cors);

    let operator_routes = table(Router::new(), approval_routes())
        .nest("/operator/v1", table(Router::new(), operator_api()))
        .layer(RequestBodyLimitLayer::new(approvals::OPERATOR_BODY_BYTES_MAX))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, cfg.request_timeout))
        .layer(axum::middleware::from_fn(operator::json_errors));
    let policy_routes = table(Router::new(), policy_api())
        .layer(RequestBodyLimitLayer::new(approvals::POLICY_BODY_BYTES_MAX))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, cfg.request_timeout))
        .layer(axum::middleware::from_fn(operator::json_errors));

    // The metadata is public: any browser origin may read it (that is how browser clients discover
    // the authorization server).
    let metadata_routes = Router::new()
        .route(METADATA_PATH, get(protected_resource_metadata))
        .route(&format!("{METADATA_PATH}/mcp"), get(protected_resource_metadata))
        .route(&format!("{METADATA_PATH}/operator"), get(operator_resource_metadata))
        .route(MANDATE_JWKS_PATH, get(mandate_jwks))
        .layer(CorsLayer::new().allow_origin(tower_http::cors::Any).allow_methods([Method::GET]));

    let callback_routes = Router::new()
        .route("/callbacks/{rail}/{channel}", post(callbacks::without_path_secret))
        .route("/callbacks/{rail}/{channel}/", post(callbacks::without_path_secret))
        .route("/callbacks/{rail}/{channel}/{secret}", post(callbacks::with_secret))
        .layer(RequestBodyLimitLayer::new(callbacks::CALLBACK_BODY_BYTES_MAX))
        .layer(TimeoutLayer::with_status_code(StatusCode::REQUEST_TIMEOUT, cfg.request_timeout));

    let console_routes = Router::new()
        .route("/console", get(console::index))
        .route("/console/", get(console::index))
        .route("/console/callback", get(console::index))
        .route("/console/app.js", get(console::script))
        .route("/console/app.css", get(console::style))
        .route("/console/config.json", get(console::config));

    let simulator_routes = if state.simulators.is_empty() {
        Router::new()
    } else {
        let mut routes = Router::new()
            .route("/simulator/control/{rail}", get(simulator::view))
            .route("/simulator/control/{rail}/lose-next-answer", post(simulator::lose_next_answer))
            .route("/simulator/control/{rail}/{id}/{answer}", post(simulator::answer));
        for sim in &state.simulators {
            routes = routes.nest_service(&crate::backend::simulator::path(sim.rail()), sim.router());
        }
        routes
            .layer(RequestBodyLimitLayer::new(callbacks::CALLBACK_BODY_BYTES_MAX))
            .layer(axum::middleware::from_fn(operator::json_errors))
    };

    Router::new()
        .merge(simulator_routes)
        .merge(operator_routes)
        .merge(policy_routes)
        .merge(console_routes)
        .merge(callback_routes)
        .merge(metadata_routes)
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .route("/metrics", get(metrics))
        .merge(mcp_routes)
        // Outermost last. Authorization and cookies are marked sensitive before anything could
        // print them; every request gets its correlation id and its span (the request log line,
        // the trace's server span); a panicking handler is a 500, never a dropped connection.
        .layer(tower_http::catch_panic::CatchPanicLayer::new())
        .layer(axum::middleware::from_fn_with_state(state.clone(), tracing_layer::request))
        .layer(tower_http::sensitive_headers::SetSensitiveRequestHeadersLayer::new([
            header::AUTHORIZATION,
            header::PROXY_AUTHORIZATION,
            header::COOKIE,
        ]))
        .with_state(state)
}

/// One route of a table: a method, a path and its handler. A table is the one list its router is
/// built from and `operator_routes` reads, so a test that walks `operator_routes` walks every route
/// the operator resource serves: none can be added without being walked.
type Route = (Method, &'static str, MethodRouter<AppState>);

/// The methods operator routes take.
#[derive(Clone, Copy)]
enum Verb {
    Get,
    Post,
}

fn at<H, T>(verb: Verb, path: &'static str, handler: H) -> Route
where
    H: Handler<T, AppState>,
    T: 'static,
{
    let (method, filter) = match verb {
        Verb::Get => (Method::GET, MethodFilter::GET),
        Verb::Post => (Method::POST, MethodFilter::POST),
    };
    (method, path, on(filter, handler))
}

fn table(router: Router<AppState>, routes: Vec<Route>) -> Router<AppState> {
    routes.into_iter().fold(router, |r, (_, path, handler)| r.route(path, handler))
}

/// Every (method, path) that takes an operator's token (the approval routes, `/principals`,
/// `/operator/v1` and its policy routes), as the router serves them, path parameters in braces.
pub fn operator_routes() -> Vec<(Method, String)> {
    let plain = approval_routes().into_iter().chain(policy_api()).map(|(m, p, _)| (m, p.to_string()));
    let v1 = operator_api().into_iter().map(|(m, p, _)| (m, format!("/operator/v1{p}")));
    plain.chain(v1).collect()
}

/// The approval routes from before `/operator/v1` (kept: scripts call them).
fn approval_routes() -> Vec<Route> {
    use Verb::{Get, Post};
    vec![
        at(Get, "/approvals", approvals::list),
        at(Post, "/approvals", approvals::preauthorize),
        at(Get, "/approvals/{id}", approvals::get),
        at(Post, "/approvals/{id}/approve", approvals::approve),
        at(Post, "/approvals/{id}/reject", approvals::reject),
        at(Post, "/approvals/{id}/revoke", approvals::revoke),
        at(Post, "/principals/{subject}/suspend", approvals::suspend),
        at(Post, "/principals/{subject}/resume", approvals::resume),
    ]
}

/// `/operator/v1/policy…`: policy as data. Apart from the rest of `/operator/v1` only for its body
/// limit: a proposal carries a whole policy document.
fn policy_api() -> Vec<Route> {
    use Verb::{Get, Post};
    vec![
        at(Get, "/operator/v1/policy", policy::current),
        at(Get, "/operator/v1/policy/versions", policy::versions),
        at(Get, "/operator/v1/policy/versions/{version}", policy::version),
        at(Get, "/operator/v1/policy/diff", policy::diff),
        at(Get, "/operator/v1/policy/proposals", policy::proposals),
        at(Post, "/operator/v1/policy/proposals", policy::propose),
        at(Get, "/operator/v1/policy/proposals/{proposal_id}", policy::proposal),
        at(Post, "/operator/v1/policy/proposals/{proposal_id}/approve", policy::approve),
        at(Post, "/operator/v1/policy/proposals/{proposal_id}/reject", policy::reject),
        at(Post, "/operator/v1/policy/rollback", policy::rollback),
        at(Post, "/operator/v1/policy/simulate", policy::simulate),
    ]
}

/// `/operator/v1`: what the console calls (`docs/operator-api.yaml`).
fn operator_api() -> Vec<Route> {
    use Verb::{Get, Post};
    vec![
        at(Get, "/health", operator::health),
        at(Get, "/summary", operator::summary),
        at(Get, "/payments", operator::payments),
        at(Get, "/payments/{payment_id}", operator::payment),
        at(Post, "/payments/{payment_id}/resolve", operator::resolve_payment),
        at(Get, "/audit", operator::audit),
        at(Get, "/audit/verify", operator::verify_audit),
        at(Get, "/approvals", operator::approvals),
        at(Get, "/approvals/{approval_id}", approvals::get),
        at(Post, "/approvals/{approval_id}/approve", approvals::approve),
        at(Post, "/approvals/{approval_id}/reject", approvals::reject),
        at(Get, "/approvals/{approval_id}/passkeys", passkeys::approval),
        at(Get, "/passkeys", passkeys::list),
        at(Post, "/passkeys", passkeys::register),
        at(Post, "/passkeys/options", passkeys::options),
        at(Post, "/passkeys/enrolment-codes", passkeys::enrolment_code),
        at(Post, "/passkeys/{credential_id}/revoke", passkeys::revoke),
        at(Get, "/confirmations/{approval_id}", approvals::user_get),
        at(Post, "/confirmations/{approval_id}/approve", approvals::user_approve),
        at(Post, "/confirmations/{approval_id}/reject", approvals::user_reject),
        at(Get, "/mandates", operator::mandates),
        at(Post, "/mandates/{mandate_id}/revoke", operator::revoke_mandate),
        at(Get, "/principals", operator::principals),
        at(Post, "/principals/{subject}/suspend", approvals::suspend),
        at(Post, "/principals/{subject}/resume", approvals::resume),
        at(Get, "/payees", operator::payees),
        at(Post, "/payees", operator::add_payee),
        at(Post, "/payees/revoke", operator::revoke_payee),
        at(Get, "/webhooks", operator::webhooks),
        at(Get, "/webhooks/{message_id}/attempts", operator::webhook_attempts),
        at(Get, "/reconciliation", operator::reconciliation),
        at(Post, "/reconciliation/run", operator::reconcile),
    ]
}

/// RFC 9728 protected resource metadata of the MCP resource (agents).
async fn protected_resource_metadata(State(state): State<AppState>) -> Response {
    resource_metadata(&state, &state.resource_url, AGENT_SCOPES, "paygate")
}

/// RFC 9728 protected resource metadata of the operator resource (people).
async fn operator_resource_metadata(State(state): State<AppState>) -> Response {
    resource_metadata(&state, &state.operator_resource_url, OPERATOR_SCOPES, "paygate operator API")
}

fn resource_metadata(state: &AppState, resource: &str, scopes: &[&str], name: &str) -> Response {
    let mut doc = json!({
        "resource": resource,
        "bearer_methods_supported": ["header"],
        "scopes_supported": scopes,
        "resource_name": name,
    });
    if !state.authorization_servers.is_empty() {
        doc["authorization_servers"] = json!(state.authorization_servers);
    }
    ([(header::CACHE_CONTROL, "public, max-age=300")], axum::Json(doc)).into_response()
}

/// The mandate keys in force now (the next one included). Cached briefly: a key is published a
/// whole rotation period before it signs, so a verifier's copy is never missing a signing key.
async fn mandate_jwks(State(state): State<AppState>) -> Response {
    let g = &state.gateway;
    let doc = g.mandate_keys().jwks(g.clock().now());
    (
        [(header::CACHE_CONTROL, "public, max-age=300"), (header::CONTENT_TYPE, "application/jwk-set+json")],
        axum::Json(doc),
    )
        .into_response()
}

/// Who may read /metrics: with a token configured, whoever presents it; without, loopback peers only.
fn metrics_access(
    token: Option<&Secret>,
    peer: Option<std::net::IpAddr>,
    authorization: Option<&str>,
) -> Result<(), StatusCode> {
    match token {
        Some(t) => match authorization.and_then(|h| h.strip_prefix("Bearer ")) {
            Some(presented) if t.matches(presented) => Ok(()),
            _ => Err(StatusCode::UNAUTHORIZED),
        },
        None if peer.is_some_and(|ip| ip.is_loopback()) => Ok(()),
        None => Err(StatusCode::FORBIDDEN),
    }
}

/// Prometheus text (this replica's counters; the queue depth and store ping come from the store).
async fn metrics(
    State(state): State<AppState>,
    peer: Option<axum::Extension<axum::extract::ConnectInfo<std::net::SocketAddr>>>,
    headers: axum::http::HeaderMap,
) -> Response {
    let peer = peer.map(|axum::Extension(axum::extract::ConnectInfo(a))| a.ip());
    let authorization = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    if let Err(status) = metrics_access(state.metrics_token.as_ref(), peer, authorization) {
        return match status {
            StatusCode::UNAUTHORIZED => {
                (status, [(header::WWW_AUTHENTICATE, "Bearer realm=\"metrics\"")]).into_response()
            }
            _ => status.into_response(),
        };
    }
    let g = &state.gateway;
    let started = std::time::Instant::now();
    let ping = g.store().ping().await.ok().map(|()| started.elapsed());
    let pending = g.store().approvals_pending(g.clock().now()).await.ok();
    let group_commit = g.store().group_commit().map(|c| crate::metrics::GroupCommitCounts {
        transfers: c.transfers,
        grouped_batches: c.grouped_batches,
        grouped_transfers: c.grouped_transfers,
        fallbacks: c.fallbacks,
    });
    let mut body = g.metrics().render(pending, ping, group_commit);
    body.push_str(&crate::metrics::render_rail_circuits(&g.rail_circuits()));
    ([(header::CONTENT_TYPE, "text/plain; version=0.0.4")], body).into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    match state.gateway.store().ping().await {
        Ok(()) => (StatusCode::OK, "ready").into_response(),
        Err(error) => {
            tracing::warn!(%error, "readiness check failed");
            (StatusCode::SERVICE_UNAVAILABLE, "store unavailable").into_response()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn metrics_need_the_token_or_a_loopback_peer() {
        let local = Some("127.0.0.1".parse().unwrap());
        let remote = Some("203.0.113.7".parse().unwrap());
        assert_eq!(metrics_access(None, local, None), Ok(()));
        assert_eq!(metrics_access(None, remote, None), Err(StatusCode::FORBIDDEN));
        assert_eq!(metrics_access(None, None, Some("Bearer x")), Err(StatusCode::FORBIDDEN), "unknown peer: closed");
        let t = Secret::new("metrics-token-0123456789".into());
        assert_eq!(metrics_access(Some(&t), remote, Some("Bearer metrics-token-0123456789")), Ok(()));
        assert_eq!(
            metrics_access(Some(&t), local, None),
            Err(StatusCode::UNAUTHORIZED),
            "a token, once set, is needed"
        );
        assert_eq!(metrics_access(Some(&t), remote, Some("Bearer wrong")), Err(StatusCode::UNAUTHORIZED));
    }
}
