//! Middleware for /mcp, inside the request middleware (`tracing_layer`: correlation id, span):
//! [`mcp_gate`], which checks Origin → bearer JWT → scope → session binding.
//!
//! Architecture Invariant: no token reaches a log line, an error body or an audit record. Tokens are
//! read from the Authorization header only; `?access_token=` is ignored.

use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use serde_json::value::RawValue;

use super::AppState;
use super::sessions::{Refused, SessionCheck};
use crate::auth::{AgentPrincipal, Audience, AuthError};
use crate::catalogue::scopes::AGENT_SCOPES;
use crate::catalogue::{READ_SCOPE, scope_for_tool};
use crate::gateway::CorrelationId;

const SESSION_HEADER: &str = "mcp-session-id";

/// The path as logged: a callback path holds the deployment's callback secret, so its last segment
/// is never written anywhere.
pub(super) fn loggable_path(path: &str) -> String {
    if !path.starts_with("/callbacks/") {
        return path.to_string();
    }
    // Only the known route is kept; whatever follows it (or replaces it) is never written.
    if path.starts_with("/callbacks/mpesa/stk/") { "/callbacks/mpesa/stk/***".into() } else { "/callbacks/***".into() }
}

/// What stands in front of /mcp, in order: [`origin_check`], [`authenticate`], [`scope_check`],
/// [`session_binding`]. One middleware rather than four: axum's `from_fn` clones the whole service
/// stack below it on every request, so each extra layer also cloned every layer under it.
pub async fn mcp_gate(State(state): State<AppState>, req: Request, next: Next) -> Response {
    if let Some(refused) = origin_check(&state, &req) {
        return refused;
    }
    let req = match authenticate(&state, req).await {
        Ok(req) => req,
        Err(refused) => return refused,
    };
    let req = match scope_check(&state, req).await {
        Ok(req) => req,
        Err(refused) => return refused,
    };
    session_binding(&state, req, next).await
}

/// DNS-rebinding defence: a browser Origin that is not ours gets 403 (the refusal returned). No
/// Origin (server agents) passes.
fn origin_check(state: &AppState, req: &Request) -> Option<Response> {
    if let Some(origin) = req.headers().get(header::ORIGIN) {
        let allowed = origin.to_str().is_ok_and(|o| state.allowed_origins.iter().any(|a| a.eq_ignore_ascii_case(o)));
        if !allowed {
            return Some(
                (
                    StatusCode::FORBIDDEN,
                    axum::Json(json!({"error": "forbidden", "error_description": "origin not allowed"})),
                )
                    .into_response(),
            );
        }
    }
    None
}

/// A bearer challenge (RFC 6750) naming the metadata of the resource `audience` is for. The body
/// is each resource's own error shape: OAuth's `{error, error_description}` on /mcp, the operator
/// API's one envelope `{"error": {code, message, correlation_id}}` for operators
/// (`docs/operator-api.yaml`); the header carries the OAuth error code either way.
pub fn bearer_challenge(
    state: &AppState,
    audience: Audience,
    status: StatusCode,
    params: &[(&str, String)],
    description: Option<&str>,
    correlation_id: &str,
) -> Response {
    let mut value = String::from("Bearer ");
    let mut parts: Vec<String> = params.iter().map(|(k, v)| format!("{k}=\"{v}\"")).collect();
    let metadata = match audience {
        Audience::Agent => &state.metadata_url,
        Audience::Operator => &state.operator_metadata_url,
    };
    parts.push(format!("resource_metadata=\"{metadata}\""));
    value.push_str(&parts.join(", "));
    let error = params.iter().find(|(k, _)| *k == "error").map(|(_, v)| v.as_str());
    let description = description.unwrap_or("a bearer token is required");
    let mut resp = match audience {
        Audience::Agent => {
            let body = json!({"error": error.unwrap_or("unauthorized"), "error_description": description});
            (status, axum::Json(body)).into_response()
        }
        Audience::Operator => {
            let code = if status == StatusCode::FORBIDDEN {
                crate::error::ErrorCode::InsufficientScope
            } else {
                crate::error::ErrorCode::Unauthorized
            };
            super::approvals::envelope(status, code, description, correlation_id)
        }
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        resp.headers_mut().insert(header::WWW_AUTHENTICATE, v);
    }
    resp
}

fn challenge(state: &AppState, status: StatusCode, params: &[(&str, String)], description: Option<&str>) -> Response {
    bearer_challenge(state, Audience::Agent, status, params, description, "")
}

fn bearer(req: &Request) -> Result<&str, AuthError> {
    bearer_token(req.headers())
}

/// The bearer token of the Authorization header; never from the query string.
pub fn bearer_token(headers: &axum::http::HeaderMap) -> Result<&str, AuthError> {
    let Some(value) = headers.get(header::AUTHORIZATION) else { return Err(AuthError::Missing) };
    let value = value.to_str().map_err(|_| AuthError::Invalid("malformed authorization header"))?;
    let (scheme, token) = value.split_once(' ').ok_or(AuthError::Invalid("malformed authorization header"))?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(AuthError::Invalid("authorization scheme must be Bearer"));
    }
    Ok(token.trim())
}

/// Verify the bearer token on every request (not only a session's first) and attach the principal
/// (`auth::AgentAuth`, the path `paygate stdio` takes too). Only tokens for the MCP resource pass;
/// an operator's token is a 401 here.
async fn authenticate(state: &AppState, mut req: Request) -> Result<Request, Response> {
    let verified = match bearer(&req) {
        Ok(token) => state.agents.principal(token, state.gateway.policy()).await,
        Err(e) => Err(e),
    };
    let principal = match verified {
        Ok(p) => p,
        Err(AuthError::Missing) => {
            return Err(challenge(state, StatusCode::UNAUTHORIZED, &[("scope", AGENT_SCOPES.join(" "))], None));
        }
        Err(AuthError::Invalid(reason)) => {
            let correlation = req.extensions().get::<CorrelationId>().map(|c| c.0.clone()).unwrap_or_default();
            tracing::info!(correlation_id = %correlation, auth.reason = reason, "token rejected");
            return Err(challenge(
                state,
                StatusCode::UNAUTHORIZED,
                &[("error", "invalid_token".into()), ("error_description", reason.into())],
                Some(reason),
            ));
        }
    };
    req.extensions_mut().insert(principal);
    Ok(req)
}

/// Marks a request whose body holds `initialize`: it opens a session (2025-11-25 era).
#[derive(Clone, Copy)]
pub struct OpensSession;

/// What the scope peek reads from one JSON-RPC message: its `method`, and for any message its
/// `params.name` (the tool, when the method is `tools/call`). rmcp parses the same body again
/// downstream; the two readings must agree (tests/properties.rs), or a body could be checked as
/// one call and run as another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peeked {
    pub method: Option<String>,
    pub name: Option<String>,
}

/// The peek: the message(s) of a request body as the scope check reads them, or `None` for a body
/// that is not JSON at all.
///
/// Values are kept raw and only `method` and `params.name` are read, as rmcp reads them: nothing
/// else in the body is interpreted. (Reading the body as a `serde_json::Value` was blind to a body
/// carrying serde_json's private RawValue marker as a key anywhere, say in a member rmcp ignores:
/// `Value` refuses it, rmcp runs the call, and the peek demanded no scope. Found by fuzzing.) A key
/// given twice counts as its last, as `Value` counted it.
pub fn peek(body: &[u8]) -> Option<Vec<Peeked>> {
    let top: &RawValue = serde_json::from_slice(body).ok()?;
    let messages: Vec<&RawValue> = match top.get().trim_start().starts_with('[') {
        true => serde_json::from_str(top.get()).ok()?,
        false => vec![top],
    };
    Some(messages.into_iter().map(peek_message).collect())
}

fn peek_message(message: &RawValue) -> Peeked {
    let top = members(message);
    let text = |v: Option<&RawValue>| v.and_then(|v| serde_json::from_str::<String>(v.get()).ok());
    let params = last(&top, "params").map(members).unwrap_or_default();
    Peeked { method: text(last(&top, "method")), name: text(last(&params, "name")) }
}

/// An object's members in order, their values unread; none for anything but an object.
fn members(value: &RawValue) -> Vec<(String, &RawValue)> {
    struct Members;
    impl<'de> serde::de::Visitor<'de> for Members {
        type Value = Vec<(String, &'de RawValue)>;
        fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            f.write_str("an object")
        }
        fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut members = Vec::new();
            while let Some(member) = map.next_entry::<String, &'de RawValue>()? {
                members.push(member);
            }
            Ok(members)
        }
    }
    let mut de = serde_json::Deserializer::from_str(value.get());
    serde::Deserializer::deserialize_map(&mut de, Members).unwrap_or_default()
}

/// The last value given for `key` (what `serde_json::Value` keeps of a key given twice).
fn last<'a>(members: &[(String, &'a RawValue)], key: &str) -> Option<&'a RawValue> {
    members.iter().rev().find(|(k, _)| k == key).map(|(_, v)| *v)
}

/// Scopes the JSON-RPC message(s) in this body need (a tool's scope for tools/call, read for
/// resources/read and prompts/get), and whether one of them is `initialize`.
fn inspect(body: &[u8]) -> (Vec<&'static str>, bool) {
    // A body this peek cannot read might still open a session downstream: count it as one (fail
    // closed), so no crafted body skips the session bounds.
    let Some(messages) = peek(body) else { return (vec![], true) };
    let opens_session = messages.iter().any(|m| m.method.as_deref() == Some("initialize"));
    (required_scopes(&messages), opens_session)
}

fn required_scopes(messages: &[Peeked]) -> Vec<&'static str> {
    let mut needed = Vec::new();
    for m in messages {
        let scope = match m.method.as_deref() {
            Some("tools/call") => m.name.as_deref().and_then(scope_for_tool),
            Some("resources/read" | "prompts/get") => Some(READ_SCOPE),
            _ => None,
        };
        if let Some(s) = scope
            && !needed.contains(&s)
        {
            needed.push(s);
        }
    }
    needed
}

/// A call whose tool needs a scope the token lacks is an HTTP 403 naming every scope it needs, so
/// clients can step up. tools/list stays open to every authenticated caller.
async fn scope_check(state: &AppState, req: Request) -> Result<Request, Response> {
    if req.method() != Method::POST {
        return Ok(req);
    }
    let (parts, body) = req.into_parts();
    let bytes = match axum::body::to_bytes(body, state.body_bytes_max).await {
        Ok(b) => b,
        Err(_) => {
            return Err(
                (StatusCode::PAYLOAD_TOO_LARGE, axum::Json(json!({"error": "request body too large"}))).into_response()
            );
        }
    };
    let (needed, opens_session) = inspect(&bytes);
    #[cfg(feature = "broken-gateways-for-evals")]
    if !needed.is_empty() && crate::gateway::broken_for_evals() == Some("http-500") {
        return Err(StatusCode::INTERNAL_SERVER_ERROR.into_response());
    }
    if let Some(principal) = parts.extensions.get::<AgentPrincipal>()
        && needed.iter().any(|s| !principal.has_scope(s))
    {
        let scope = needed.join(" ");
        let description = format!("this call needs scope {scope}");
        return Err(challenge(
            state,
            StatusCode::FORBIDDEN,
            &[("error", "insufficient_scope".into()), ("scope", scope)],
            Some(&description),
        ));
    }
    let mut parts = parts;
    if opens_session {
        parts.extensions.insert(OpensSession);
    }
    Ok(Request::from_parts(parts, Body::from(bytes)))
}

/// Sessions belong to the principal (issuer, subject and, with delegation, user) that opened them;
/// anyone else gets 404. An `initialize` reserves its place before it runs (the bound holds for
/// concurrent ones) and binds it to the session rmcp opens, or gives it back.
async fn session_binding(state: &AppState, req: Request, next: Next) -> Response {
    let Some(principal) = req.extensions().get::<AgentPrincipal>().map(AgentPrincipal::key) else {
        // Unreachable behind `authenticate`; fail closed all the same.
        return StatusCode::UNAUTHORIZED.into_response();
    };
    let session = req.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok()).map(str::to_string);
    let method = req.method().clone();
    let mut slot = None;
    match &session {
        Some(id) if state.sessions.check(id, &principal) == SessionCheck::Unknown => {
            return (StatusCode::NOT_FOUND, axum::Json(json!({"error": "session not found"}))).into_response();
        }
        Some(_) => {}
        // Only a request that opens a session (initialize) needs a place in the table: stateless
        // 2026-07-28 requests carry no session and are never turned away for a full table.
        None if req.extensions().get::<OpensSession>().is_some() => match state.sessions.reserve(&principal) {
            Ok(s) => slot = Some(s),
            Err(Refused::PrincipalFull) => {
                let retry = state.session_idle_secs.to_string();
                return (
                    StatusCode::TOO_MANY_REQUESTS,
                    [(header::RETRY_AFTER, retry)],
                    axum::Json(json!({"error": "this agent holds too many open sessions; end unused ones (DELETE) or reuse one"})),
                )
                    .into_response();
            }
            Err(Refused::Full) => {
                return (StatusCode::SERVICE_UNAVAILABLE, axum::Json(json!({"error": "too many sessions"})))
                    .into_response();
            }
        },
        None => {}
    }
    let resp = next.run(req).await;
    match session {
        None => {
            // The reserved place becomes the session's, or (no session came of it) is given back.
            if let (Some(slot), Some(id)) = (slot, resp.headers().get(SESSION_HEADER).and_then(|v| v.to_str().ok())) {
                slot.bind(id.to_string());
            }
        }
        Some(id) if method == Method::DELETE && resp.status().is_success() => {
            state.sessions.unbind(&id);
            // rmcp answers a session DELETE with 202 Accepted; the official clients expect 200 or 204
            // (the Python SDK logs "Session termination failed: 202" otherwise). The session is gone
            // by now, so say so plainly.
            return StatusCode::NO_CONTENT.into_response();
        }
        Some(_) => {}
    }
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn callback_paths_are_logged_without_their_secret() {
        for p in [
            "/callbacks/mpesa/stk/s3cret",
            "/callbacks/mpesa/stk/s3cret/",
            "/callbacks/mpesa/s3cret",
            "/callbacks/s3cret",
        ] {
            assert!(!loggable_path(p).contains("s3cret"), "{p}");
        }
        assert_eq!(loggable_path("/mcp"), "/mcp");
    }

    #[test]
    fn scopes_follow_the_method_and_tool() {
        let scopes = |body: &[u8]| inspect(body).0;
        let call =
            |name: &str| format!(r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"{name}"}}}}"#);
        assert_eq!(scopes(call("create_payment").as_bytes()), vec!["payments:create"]);
        assert_eq!(scopes(call("check_ledger_integrity").as_bytes()), vec!["payments:integrity"]);
        assert!(scopes(call("no_such_tool").as_bytes()).is_empty());
        assert!(scopes(br#"{"jsonrpc":"2.0","id":1,"method":"tools/list"}"#).is_empty());
        assert_eq!(
            scopes(br#"{"jsonrpc":"2.0","id":1,"method":"resources/read","params":{"uri":"x"}}"#),
            vec!["payments:read"]
        );
        let batch = format!("[{},{}]", call("create_payment"), call("refund_payment"));
        assert_eq!(scopes(batch.as_bytes()), vec!["payments:create", "payments:refund"]);
        assert!(scopes(b"not json").is_empty());
        let init = br#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}"#;
        assert!(inspect(init).1, "initialize opens a session");
        assert!(!inspect(call("create_payment").as_bytes()).1);
        assert!(inspect(b"not json").1, "an unreadable body is counted as opening a session");
    }
}
