//! `paygate stdio`: MCP over stdin/stdout for the one agent whose bearer token the process was
//! started with (`PAYGATE_TOKEN`). The handler is /mcp's own [`PaygateMcp`]: every tool, the same
//! gateway, policy, audit, rate limits and exactly-once path.
//!
//! What the HTTP auth layer does for each request is done here for each request too: the token is
//! verified again (`auth::AgentAuth`, the one path from a token to an agent, so a token that expires
//! or whose key the identity provider drops stops working mid-session, as over HTTP) and its agent
//! resolved under the policy in force; the principal and a fresh correlation id go into the MCP
//! request's extensions, where the tools find their `Caller` when no HTTP request carries it.
//!
//! There is no step-up here: the token is fixed for the life of the process, so there is no 403
//! challenge to answer with a new one. A call lacking a scope is refused where every HTTP call is
//! also checked, behind the 403: `Gateway::admit`, as the tool's INSUFFICIENT_SCOPE envelope naming
//! `required_scopes` (audited, and counted toward the stop rule like any denial).
//!
//! Architecture Invariant: stdout carries MCP messages only; logs go to stderr, and the token
//! (a `Secret`, registered with the log redactor) is never written anywhere.

use std::borrow::Cow;
use std::sync::Arc;

use rmcp::model::{ClientNotification, ClientRequest, ErrorCode, ProtocolVersion, ServerConfig, ServerResult};
use rmcp::service::{NotificationContext, RequestContext, ServerInitializeError};
use rmcp::{ErrorData, RoleServer, Service};
use serde_json::json;
use tracing::Instrument;

use super::PaygateMcp;
use crate::auth::{AgentAuth, AgentPrincipal, Audience, AuthError, Secret};
use crate::domain::policy_doc::LivePolicy;
use crate::gateway::{CorrelationId, Gateway};
use crate::telemetry::RequestSpan;

/// The MCP server of `paygate stdio`: /mcp's handler with the caller fixed from the token.
pub struct StdioServer {
    mcp: PaygateMcp,
    gateway: Arc<Gateway>,
    agents: AgentAuth,
    token: Secret,
}

/// Why the process's token is not an agent's for this gateway, in words for a person reading
/// stderr (never the token itself).
#[derive(Debug, thiserror::Error)]
pub enum TokenRefused {
    #[error(
        "PAYGATE_TOKEN is an operator's token (audience {0}); paygate stdio serves agents only: use an agent token (audience {1})"
    )]
    Operator(String, String),
    #[error("PAYGATE_TOKEN is not accepted: {reason} (an agent token for {audience} is needed)")]
    Invalid { reason: AuthError, audience: String },
}

impl StdioServer {
    /// `disabled`: the tools this configuration does not offer, as /mcp is given them.
    pub fn new(gateway: Arc<Gateway>, disabled: &[String], agents: AgentAuth, token: Secret) -> Self {
        StdioServer { mcp: PaygateMcp::new(gateway.clone(), disabled), gateway, agents, token }
    }

    /// The token's agent, as of now: verified and resolved as /mcp does on each request.
    async fn principal(&self) -> Result<AgentPrincipal, AuthError> {
        self.agents.principal(self.token.expose(), self.gateway.policy()).await
    }

    /// Serve MCP on stdin/stdout until the client closes stdin (or `stop`). A client that leaves
    /// before initializing is a clean end too.
    pub async fn serve(self, stop: tokio_util::sync::CancellationToken) -> Result<(), String> {
        let running = match rmcp::service::serve_server_with_ct(self, rmcp::transport::stdio_pipes(), stop).await {
            Ok(running) => running,
            Err(ServerInitializeError::ConnectionClosed(_) | ServerInitializeError::Cancelled) => return Ok(()),
            Err(e) => return Err(e.to_string()),
        };
        running.waiting().await.map(|_| ()).map_err(|e| e.to_string())
    }
}

/// Whether `token` is an agent's for this gateway, or why not, in words for the person reading
/// stderr. Before the store is opened (`gateway`: `None`) the token is verified and no profile is
/// resolved yet (none is in force: the fail-closed one); with the gateway, under its policy. An
/// operator's token is named as such: it fails the agent audience like any token meant for another
/// resource, but that mistake deserves its own sentence.
pub async fn check_token(
    agents: &AgentAuth,
    token: &Secret,
    gateway: Option<&Gateway>,
) -> Result<AgentPrincipal, TokenRefused> {
    let policy = gateway.map_or_else(|| Arc::new(LivePolicy::none()), Gateway::policy);
    let reason = match agents.principal(token.expose(), policy).await {
        Ok(p) => return Ok(p),
        Err(reason) => reason,
    };
    let verifier = &agents.verifier;
    let agent = verifier.resource(Audience::Agent).to_string();
    if verifier.verify(token.expose(), Audience::Operator).await.is_ok() {
        return Err(TokenRefused::Operator(verifier.resource(Audience::Operator).to_string(), agent));
    }
    Err(TokenRefused::Invalid { reason, audience: agent })
}

/// A request made with a token that no longer verifies (expired, say): the request is refused as
/// /mcp refuses it with a 401, in OAuth's words, and nothing runs.
fn token_refused(reason: &AuthError) -> ErrorData {
    ErrorData::new(
        ErrorCode::INVALID_REQUEST,
        format!("PAYGATE_TOKEN is no longer accepted ({reason}); restart paygate stdio with a valid agent token"),
        Some(json!({"error": "invalid_token", "error_description": reason.to_string()})),
    )
}

impl Service<RoleServer> for StdioServer {
    async fn handle_request(
        &self,
        request: ClientRequest,
        mut context: RequestContext<RoleServer>,
    ) -> Result<ServerResult, ErrorData> {
        let id = CorrelationId::generate();
        let span = tracing::info_span!(
            "request",
            correlation_id = %id.0,
            mcp.method = %request.method(),
            transport = "stdio",
            otel.kind = "server",
        );
        let started = tokio::time::Instant::now();
        let principal = match self.principal().await {
            Ok(p) => p,
            Err(reason) => {
                span.in_scope(|| tracing::warn!(auth.reason = %reason, "token rejected"));
                return Err(token_refused(&reason));
            }
        };
        context.extensions.insert(principal);
        context.extensions.insert(id);
        context.extensions.insert(RequestSpan(span.clone()));
        let result = Service::handle_request(&self.mcp, request, context).instrument(span.clone()).await;
        span.in_scope(|| {
            let duration_ms = started.elapsed().as_millis() as u64;
            match &result {
                Ok(_) => tracing::info!(duration_ms, "request"),
                Err(e) => tracing::info!(duration_ms, mcp.error_code = e.code.0, "request"),
            }
        });
        result
    }

    async fn handle_notification(
        &self,
        notification: ClientNotification,
        context: NotificationContext<RoleServer>,
    ) -> Result<(), ErrorData> {
        Service::handle_notification(&self.mcp, notification, context).await
    }

    fn get_info(&self) -> ServerConfig {
        Service::get_info(&self.mcp)
    }

    fn supported_protocol_versions(&self) -> Cow<'static, [ProtocolVersion]> {
        Service::supported_protocol_versions(&self.mcp)
    }
}
