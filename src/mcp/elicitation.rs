//! Approvals through MCP URL-mode elicitation: a payment that needs a human sends the user to
//! the approval page and resumes when the client retries, with the mandate never passing through
//! the model.
//!
//! Only for clients that declared URL elicitation (`capabilities.elicitation.url`, in `initialize`
//! or, in 2026-07-28, in each request's `_meta`); every other client keeps the APPROVAL_REQUIRED
//! tool error, unchanged.
//!
//! - 2026-07-28: an `input_required` result carrying an `elicitation/create` (mode `url`, the
//!   approval page) and a sealed `requestState` ([`crate::request_state`]). The retry presents the
//!   state: approved → the call pays under the approval's closed mandate, looked up server-side;
//!   still pending → the retry waits (bounded) for the decision, then answers `input_required`
//!   again with a fresh state (bounded rounds); rejected → APPROVAL_REJECTED. A state that does not
//!   open (forged, expired, another agent's, another call's) moves nothing.
//! - 2025-11-25: the `-32042` URLElicitationRequiredError with the page and the approval id as
//!   `elicitationId`; `notifications/elicitation/complete` on the session once the approval is
//!   decided (best effort: the session's GET stream must be open on this replica). The client's
//!   plain retry then pays under the mandate.
//!
//! Either way the payment itself goes through the ordinary path: `mandate_for` verifies the
//! mandate against exactly this call and the key anchored on the mandate pays exactly once.

use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rmcp::handler::server::common::FromContextPart;
use rmcp::handler::server::tool::{InputResponses as ToolInputResponses, RequestState, ToolCallContext};
use rmcp::model::{
    CallToolResponse, CallToolResult, CustomNotification, ElicitRequest, ElicitRequestParams, ErrorCode as RpcCode,
    InputRequest, InputRequests, InputRequiredResult, JsonObject, ProtocolVersion, ServerNotification,
};
use rmcp::service::{Peer, RequestContext};
use rmcp::{ErrorData, RoleServer};
use serde_json::{Value, json};

use super::{PaygateMcp, fail};
use crate::error::{AgentError, ErrorCode};
use crate::gateway::{Caller, Executed, Gateway, Resume};
use crate::request_state::{Binding, OpenError, args_fingerprint};

/// JSON-RPC code of URLElicitationRequiredError (MCP 2025-11-25).
pub const URL_ELICITATION_REQUIRED: i32 = -32042;
/// The key of the approval page in `inputRequests` / `inputResponses`.
pub const INPUT_KEY: &str = "approval";
/// Approvals whose decision is watched for 2025-11-25 sessions at once, on this replica; past it,
/// no completion notice is sent (the client's retry still works).
pub const WATCHED_APPROVALS_MAX: usize = 1_000;
/// Sessions told about one approval's decision.
pub const SESSIONS_PER_APPROVAL_MAX: usize = 8;
/// How often a watch re-reads the store for a decision made on another replica (one on this
/// replica wakes it at once).
const WATCH_POLL: Duration = Duration::from_secs(30);

/// What the client said about itself and sent back, for one money-tool call.
pub(super) struct Round {
    /// It declared URL-mode elicitation.
    url: bool,
    /// 2026-07-28 or later (MRTR); otherwise 2025-11-25.
    modern: bool,
    peer: Peer<RoleServer>,
    session: Option<String>,
    state: Option<String>,
    responses: Option<rmcp::model::InputResponses>,
    /// The HTTP request's span: the tool call's span hangs under it (rmcp runs calls on its own tasks).
    span: tracing::Span,
}

/// A money tool's round, from its call: what the client declared, its session, and the state and
/// answers of a previous round (2026-07-28).
impl<S> FromContextPart<ToolCallContext<'_, S>> for Round {
    fn from_context_part(context: &mut ToolCallContext<'_, S>) -> Result<Self, ErrorData> {
        let state = RequestState::from_context_part(context)?;
        let responses = ToolInputResponses::from_context_part(context)?;
        Ok(Round::new(&context.request_context, state, responses))
    }
}

impl Round {
    fn new(ctx: &RequestContext<RoleServer>, state: RequestState, responses: ToolInputResponses) -> Self {
        let url = ctx.client_capabilities().and_then(|c| c.elicitation).is_some_and(|e| e.url.is_some());
        let modern = ctx.protocol_version().is_some_and(|v| v >= ProtocolVersion::V_2026_07_28);
        let parts = ctx.extensions.get::<http::request::Parts>();
        let session =
            parts.and_then(|p| p.headers.get("mcp-session-id")).and_then(|v| v.to_str().ok()).map(str::to_string);
        let span = super::attached::<crate::telemetry::RequestSpan>(ctx).map_or_else(tracing::Span::none, |s| s.0);
        Round { url, modern, peer: ctx.peer.clone(), session, state: state.0, responses: responses.0, span }
    }

    /// The user declined or cancelled opening the page.
    fn declined(&self) -> bool {
        let action = self.responses.as_ref().and_then(|r| r.get(INPUT_KEY)).and_then(|v| v.get("action"));
        matches!(action.and_then(Value::as_str), Some("decline" | "cancel"))
    }
}

/// One 2025-11-25 session to tell: its `Mcp-Session-Id` (to tell it once) and its peer.
type Waiter = (Option<String>, Peer<RoleServer>);

/// 2025-11-25 sessions waiting for an approval's decision, by approval id.
#[derive(Default)]
pub struct Completions {
    waiting: Mutex<HashMap<String, Vec<Waiter>>>,
}

impl Completions {
    /// Tell this session when the approval is decided. One watch task per approval.
    fn register(
        self: &Arc<Self>,
        gateway: Arc<Gateway>,
        approval_id: &str,
        session: Option<String>,
        peer: Peer<RoleServer>,
    ) {
        let first = {
            let mut waiting = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
            if !waiting.contains_key(approval_id) && waiting.len() >= WATCHED_APPROVALS_MAX {
                return;
            }
            let sessions = waiting.entry(approval_id.to_string()).or_default();
            let first = sessions.is_empty();
            let known = session.is_some() && sessions.iter().any(|(s, _)| *s == session);
            if !known && sessions.len() < SESSIONS_PER_APPROVAL_MAX {
                sessions.push((session, peer));
            }
            first
        };
        if !first {
            return;
        }
        let this = self.clone();
        let id = approval_id.to_string();
        tokio::spawn(async move {
            // Until the approval is decided or expires (a terminal state either way), or no session
            // waiting for it is still open.
            while !gateway.await_decision(&id, Duration::from_secs(300), WATCH_POLL).await {
                let mut waiting = this.waiting.lock().unwrap_or_else(|p| p.into_inner());
                let sessions = waiting.entry(id.clone()).or_default();
                sessions.retain(|(_, peer)| !peer.is_transport_closed());
                if sessions.is_empty() {
                    waiting.remove(&id);
                    return;
                }
            }
            let sessions = this.waiting.lock().unwrap_or_else(|p| p.into_inner()).remove(&id).unwrap_or_default();
            for (_, peer) in sessions {
                if peer.is_transport_closed() {
                    continue;
                }
                let notice =
                    CustomNotification::new("notifications/elicitation/complete", Some(json!({"elicitationId": id})));
                if let Err(error) = peer.send_notification(ServerNotification::CustomNotification(notice)).await {
                    tracing::debug!(%error, approval_id = %id, "elicitation completion not delivered");
                }
            }
        });
    }
}

fn complete(caller: &Caller, result: Result<Executed, AgentError>) -> CallToolResponse {
    match result {
        Ok(done) => match serde_json::to_value(super::views::PaymentResult::from(done)) {
            Ok(v) => CallToolResult::structured(v).into(),
            Err(_) => fail(caller, AgentError::internal()).into(),
        },
        Err(e) => fail(caller, e).into(),
    }
}

impl PaygateMcp {
    /// A money tool's call (timed and admitted as `tool`), with URL elicitation for approvals.
    /// `run` makes the call through the gateway from (possibly mandate-completed) arguments.
    pub(super) async fn money<F, Fut>(
        &self,
        caller: &Caller,
        round: Round,
        tool: &'static str,
        args: JsonObject,
        run: F,
    ) -> Result<CallToolResponse, ErrorData>
    where
        F: Fn(JsonObject) -> Fut,
        Fut: Future<Output = Result<Executed, AgentError>>,
    {
        use tracing::Instrument;
        let span = tracing::debug_span!(parent: &round.span, "tool", tool, correlation_id = %caller.correlation_id);
        self.money_call(caller, round, tool, args, run).instrument(span).await
    }

    async fn money_call<F, Fut>(
        &self,
        caller: &Caller,
        round: Round,
        tool: &'static str,
        args: JsonObject,
        run: F,
    ) -> Result<CallToolResponse, ErrorData>
    where
        F: Fn(JsonObject) -> Fut,
        Fut: Future<Output = Result<Executed, AgentError>>,
    {
        let _timed = super::Timed::new(&self.gateway, tool);
        if let Err(e) = self.gateway.admit(caller, tool).await {
            return Ok(fail(caller, e).into());
        }
        if !round.url {
            // A state only ever goes to a client that declared URL elicitation.
            if round.state.is_some() {
                let e = self.gateway.refuse_state(caller, tool, OpenError::Forged).await;
                return Ok(complete(caller, Err(e)));
            }
            return Ok(complete(caller, run(args).await));
        }
        let op = args.get("operation_id").and_then(Value::as_str).unwrap_or_default().to_string();
        let fp = args_fingerprint(&args);
        let p = &caller.principal;
        let binding = Binding {
            issuer: &p.issuer,
            subject: &p.subject,
            user: p.user.as_deref(),
            tool,
            operation_id: &op,
            args: &fp,
        };
        if let Some(sealed) = round.state.as_deref() {
            return match self.gateway.open_state(&binding, sealed) {
                Ok(state) => self.resume(caller, &round, &binding, args, &state.apr, state.n, run).await,
                Err(why) => Ok(complete(caller, Err(self.gateway.refuse_state(caller, tool, why).await))),
            };
        }
        let first = run(args.clone()).await;
        let approval = match &first {
            Err(e) if e.code == ErrorCode::ApprovalRequired && !args.contains_key("mandate") => {
                e.details.get("approval_id").and_then(Value::as_str).map(str::to_string)
            }
            _ => None,
        };
        let (Some(apr), Err(e)) = (approval, first.as_ref()) else { return Ok(complete(caller, first)) };
        match self.gateway.resume_approval(caller, tool, &apr).await {
            // Approved already (a 2025-11-25 client retrying after the completion notice): pay under
            // the approval's mandate, which this agent could fetch with get_approval anyway.
            Ok(Resume::Approved { mandate }) => Ok(complete(caller, run(with_mandate(args, mandate)).await)),
            Ok(Resume::Pending { expires_at, approver }) => {
                let id = crate::domain::ids::ApprovalId::parse(&apr)
                    .map_err(|_| ErrorData::internal_error("approval id unreadable", None))?;
                let page = self.gateway.approval_page(&id, approver);
                let message = format!("{} Open the approval page to review it.", e.message);
                if round.modern {
                    // Rounds are counted per approval on the server: a fresh chain (no state) is no
                    // way around the bound either.
                    match self.gateway.elicitation_round(caller, &apr).await {
                        Ok(true) => {}
                        Ok(false) => return Ok(complete(caller, first)),
                        Err(e) => return Ok(complete(caller, Err(e))),
                    }
                    let state = self.gateway.seal_state(&binding, &apr, expires_at, 1);
                    let params = ElicitRequestParams::UrlElicitationParams {
                        meta: None,
                        message,
                        url: page,
                        elicitation_id: apr.clone(),
                    };
                    let requests: InputRequests =
                        [(INPUT_KEY.to_string(), InputRequest::Elicitation(ElicitRequest::new(params)))].into();
                    Ok(InputRequiredResult::new(Some(requests), Some(state)).into())
                } else {
                    self.completions.register(self.gateway.clone(), &apr, round.session.clone(), round.peer.clone());
                    let data = json!({
                        "elicitations": [{"mode": "url", "elicitationId": apr, "url": page, "message": message}],
                        "error": e.envelope(&caller.correlation_id)["error"],
                    });
                    Err(ErrorData::new(
                        RpcCode(URL_ELICITATION_REQUIRED),
                        "A human must approve this payment on the approval page.",
                        Some(data),
                    ))
                }
            }
            Ok(Resume::Closed) | Err(_) => Ok(complete(caller, first)),
        }
    }

    /// A retry that presented an open state for approval `apr`, round `n`.
    #[allow(clippy::too_many_arguments)]
    async fn resume<F, Fut>(
        &self,
        caller: &Caller,
        round: &Round,
        binding: &Binding<'_>,
        args: JsonObject,
        apr: &str,
        n: u32,
        run: F,
    ) -> Result<CallToolResponse, ErrorData>
    where
        F: Fn(JsonObject) -> Fut,
        Fut: Future<Output = Result<Executed, AgentError>>,
    {
        let tool = binding.tool;
        let limits = self.gateway.limits();
        let mut waited = false;
        let mut counted = false;
        loop {
            match self.gateway.resume_approval(caller, tool, apr).await {
                Err(e) => return Ok(complete(caller, Err(e))),
                Ok(Resume::Approved { mandate }) => {
                    if args.contains_key("mandate") {
                        let e = self.gateway.refuse_state(caller, tool, OpenError::Forged).await;
                        return Ok(complete(caller, Err(e)));
                    }
                    return Ok(complete(caller, run(with_mandate(args, mandate)).await));
                }
                // Rejected or expired: the call itself answers (APPROVAL_REJECTED, or a new approval).
                Ok(Resume::Closed) => return Ok(complete(caller, run(args).await)),
                Ok(Resume::Pending { expires_at, .. }) => {
                    if round.declined() || n >= limits.elicitation_rounds_max {
                        // Today's APPROVAL_REQUIRED: the agent may still follow the approval by hand.
                        return Ok(complete(caller, run(args).await));
                    }
                    // The bound is the server's count for this approval, not the round the state
                    // says: replaying an early state cannot start the rounds over.
                    if !counted {
                        match self.gateway.elicitation_round(caller, apr).await {
                            Ok(true) => counted = true,
                            Ok(false) => return Ok(complete(caller, run(args).await)),
                            Err(e) => return Ok(complete(caller, Err(e))),
                        }
                    }
                    // Hold the retry for the decision, if this agent has a slot free.
                    let slot = if waited { None } else { self.gateway.decision_wait(caller) };
                    let Some(_slot) = slot else {
                        let state = self.gateway.seal_state(binding, apr, expires_at, n + 1);
                        return Ok(InputRequiredResult::from_request_state(state).into());
                    };
                    self.gateway.await_decision(apr, limits.elicitation_wait, Duration::from_secs(1)).await;
                    waited = true;
                }
            }
        }
    }
}

fn with_mandate(mut args: JsonObject, mandate: String) -> JsonObject {
    args.insert("mandate".into(), Value::String(mandate));
    args
}
