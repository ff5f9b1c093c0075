//! Operator routes: `/approvals` and `/principals/{subject}/resume`. Same JWT verification as /mcp;
//! authorized by operator scopes; one error envelope; 404/409/410 where they mean something.

use axum::Json;
use axum::extract::{FromRequestParts, Path, Query, State};
use axum::http::request::Parts;
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::auth_layer::{bearer_challenge, bearer_token};
use crate::auth::{Audience, AuthError};
use crate::catalogue::scopes::OPERATOR_SCOPES;
use crate::error::ErrorCode;
use crate::gateway::approvals_api::OpError;
use crate::gateway::principal_admin::PrincipalArgs;
use crate::gateway::{CorrelationId, Operator, PasskeyAssertion, PreauthorizeArgs, ReviewDecision};

/// Body size of operator requests, in bytes: they are small JSON documents.
pub const OPERATOR_BODY_BYTES_MAX: usize = 16 * 1024;
/// Largest body of the policy routes, which carry a whole policy document
/// (`domain::policy_doc::DOCUMENT_BYTES_MAX`, 256 KiB, with room for the rest of the body).
pub const POLICY_BODY_BYTES_MAX: usize = 272 * 1024;

/// The operators' error envelope, answered with `status` (what the framework chose, or
/// [`ErrorCode::http_status`] by way of [`refusal`]).
pub(super) fn envelope(status: StatusCode, code: ErrorCode, message: &str, correlation_id: &str) -> Response {
    let body = json!({"error": {"code": code.as_str(), "message": message, "correlation_id": correlation_id}});
    (status, Json(body)).into_response()
}

/// A refusal in the envelope, with its code's status (the one table).
pub(super) fn refusal(code: ErrorCode, message: &str, correlation_id: &str) -> Response {
    envelope(code.http_status(), code, message, correlation_id)
}

fn op_error(e: OpError, correlation_id: &str) -> Response {
    refusal(e.code, &e.message, correlation_id)
}

/// The authenticated, rate-limited operator behind a request: only a token for the operator
/// resource, in a person's own name (no RFC 8693 `act`: an agent acting for someone is an agent,
/// whatever it acts for), produces one.
pub struct Authed(pub Operator);

impl FromRequestParts<AppState> for Authed {
    type Rejection = Response;

    async fn from_request_parts(parts: &mut Parts, state: &AppState) -> Result<Self, Self::Rejection> {
        let correlation_id = parts.extensions.get::<CorrelationId>().map(|c| c.0.clone()).unwrap_or_default();
        let verified = match bearer_token(&parts.headers) {
            Ok(token) => state.verifier.verify(token, Audience::Operator).await,
            Err(e) => Err(e),
        };
        let claims = match verified {
            Ok(c) if c.actor.is_some() => {
                let reason = "an operator's token is their own: a delegated token (act) is an agent's";
                return Err(invalid_token(state, reason, &correlation_id));
            }
            Ok(c) => c,
            Err(AuthError::Missing) => {
                return Err(bearer_challenge(
                    state,
                    Audience::Operator,
                    StatusCode::UNAUTHORIZED,
                    &[("scope", OPERATOR_SCOPES.join(" "))],
                    None,
                    &correlation_id,
                ));
            }
            Err(AuthError::Invalid(reason)) => return Err(invalid_token(state, reason, &correlation_id)),
        };
        if let Err(wait) =
            state.route_limits.check(&format!("{}\u{0}{}", claims.issuer, claims.subject), state.routes_per_minute)
        {
            let secs = crate::rate::retry_after_secs(wait);
            let mut resp = refusal(ErrorCode::RateLimited, "too many requests", &correlation_id);
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                resp.headers_mut().insert(header::RETRY_AFTER, v);
            }
            return Err(resp);
        }
        Ok(Authed(Operator { issuer: claims.issuer, subject: claims.subject, scopes: claims.scopes, correlation_id }))
    }
}

fn invalid_token(state: &AppState, reason: &'static str, correlation_id: &str) -> Response {
    tracing::info!(correlation_id = %correlation_id, auth.reason = reason, "operator token rejected");
    bearer_challenge(
        state,
        Audience::Operator,
        StatusCode::UNAUTHORIZED,
        &[("error", "invalid_token".into()), ("error_description", reason.into())],
        Some(reason),
        correlation_id,
    )
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ListQuery {
    status: Option<String>,
    cursor: Option<String>,
    limit: Option<u32>,
}

/// The body of a revocation or suspension: why.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReasonBody {
    #[serde(default)]
    pub(super) reason: Option<String>,
}

/// The body of a decision: why, and the passkey that signs it.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReviewBody {
    #[serde(default)]
    pub(super) reason: Option<String>,
    /// A passkey assertion over the approval's payload for this decision (approve, reject, confirm).
    #[serde(default)]
    pub(super) passkey: Option<PasskeyAssertion>,
}

pub(super) fn respond<T: serde::Serialize>(
    result: Result<T, OpError>,
    correlation_id: &str,
    ok: StatusCode,
) -> Response {
    match result {
        Ok(v) => (ok, Json(v)).into_response(),
        Err(e) => op_error(e, correlation_id),
    }
}

/// A JSON body (empty means the default), or a 400 in the one envelope.
pub(super) fn parse_body<T: serde::de::DeserializeOwned + Default>(
    bytes: &[u8],
    correlation_id: &str,
) -> Result<T, Box<Response>> {
    if bytes.is_empty() {
        return Ok(T::default());
    }
    let bad = |message: String| Box::new(refusal(ErrorCode::InvalidArgument, &message, correlation_id));
    // An object only: serde would also read a struct from a JSON array (`["why"]`).
    let value: serde_json::Value = serde_json::from_slice(bytes).map_err(|e| bad(format!("invalid JSON body: {e}")))?;
    if !value.is_object() {
        return Err(bad("the body must be a JSON object".into()));
    }
    serde_json::from_value(value).map_err(|e| bad(format!("invalid JSON body: {e}")))
}

pub async fn list(
    State(state): State<AppState>,
    Authed(op): Authed,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Response {
    let Ok(Query(q)) = query else {
        return refusal(ErrorCode::InvalidArgument, "unknown or malformed query parameter", &op.correlation_id);
    };
    let result = state
        .gateway
        .list_approvals(&op, q.status.as_deref(), q.cursor.as_deref(), q.limit)
        .await
        .map(|(approvals, next_cursor)| json!({"approvals": approvals, "next_cursor": next_cursor}));
    respond(result, &op.correlation_id, StatusCode::OK)
}

pub async fn get(State(state): State<AppState>, Authed(op): Authed, Path(id): Path<String>) -> Response {
    respond(state.gateway.approval(&op, &id).await, &op.correlation_id, StatusCode::OK)
}

async fn review(
    state: AppState,
    op: Operator,
    id: String,
    body: axum::body::Bytes,
    decision: ReviewDecision,
) -> Response {
    let body: ReviewBody = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    respond(
        state.gateway.review(&op, &id, decision, body.reason, body.passkey).await,
        &op.correlation_id,
        StatusCode::OK,
    )
}

pub async fn approve(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    review(state, op, id, body, ReviewDecision::Approve).await
}

pub async fn reject(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    review(state, op, id, body, ReviewDecision::Reject).await
}

/// The user's own approval (the confirmation page): `GET /operator/v1/confirmations/{id}`.
pub async fn user_get(State(state): State<AppState>, Authed(person): Authed, Path(id): Path<String>) -> Response {
    respond(state.gateway.user_approval(&person, &id).await, &person.correlation_id, StatusCode::OK)
}

async fn user_decide(
    state: AppState,
    person: Operator,
    id: String,
    body: axum::body::Bytes,
    decision: ReviewDecision,
) -> Response {
    let body: ReviewBody = match parse_body(&body, &person.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    respond(
        state.gateway.confirm(&person, &id, decision, body.reason, body.passkey).await,
        &person.correlation_id,
        StatusCode::OK,
    )
}

/// The user confirms their own payment: `POST /operator/v1/confirmations/{id}/approve`.
pub async fn user_approve(
    State(state): State<AppState>,
    Authed(person): Authed,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    user_decide(state, person, id, body, ReviewDecision::Approve).await
}

/// The user declines it: `POST /operator/v1/confirmations/{id}/reject`.
pub async fn user_reject(
    State(state): State<AppState>,
    Authed(person): Authed,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    user_decide(state, person, id, body, ReviewDecision::Reject).await
}

pub async fn preauthorize(State(state): State<AppState>, Authed(op): Authed, body: axum::body::Bytes) -> Response {
    let args: PreauthorizeArgs = match serde_json::from_slice(&body) {
        Ok(a) => a,
        Err(e) => {
            return refusal(ErrorCode::InvalidArgument, &format!("invalid JSON body: {e}"), &op.correlation_id);
        }
    };
    respond(state.gateway.preauthorize(&op, args).await, &op.correlation_id, StatusCode::CREATED)
}

pub async fn revoke(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let body: ReasonBody = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    respond(state.gateway.revoke(&op, &id, body.reason).await, &op.correlation_id, StatusCode::OK)
}

/// Which agent a suspend or resume is about, beyond its subject: `?issuer=` (its token issuer;
/// default: the operator's own) and `?user=` (only while it acts for this user).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrincipalQuery {
    issuer: Option<String>,
    user: Option<String>,
}

type PrincipalQueryResult = Result<Query<PrincipalQuery>, axum::extract::rejection::QueryRejection>;

fn principal_args(
    subject: String,
    q: PrincipalQueryResult,
    correlation_id: &str,
) -> Result<PrincipalArgs, Box<Response>> {
    let Ok(Query(q)) = q else {
        return Err(Box::new(refusal(
            ErrorCode::InvalidArgument,
            "unknown or malformed query parameter (issuer and user are known)",
            correlation_id,
        )));
    };
    Ok(PrincipalArgs { subject, issuer: q.issuer, user: q.user })
}

fn principal_json(who: &PrincipalArgs, key: &str, value: bool) -> serde_json::Value {
    let mut v = json!({"subject": who.subject, key: value});
    if let Some(i) = &who.issuer {
        v["issuer"] = json!(i);
    }
    if let Some(u) = &who.user {
        v["user"] = json!(u);
    }
    v
}

pub async fn suspend(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path(subject): Path<String>,
    query: PrincipalQueryResult,
    body: axum::body::Bytes,
) -> Response {
    let who = match principal_args(subject, query, &op.correlation_id) {
        Ok(w) => w,
        Err(resp) => return *resp,
    };
    let body: ReasonBody = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    let result = state
        .gateway
        .suspend_principal(&op, &who, body.reason)
        .await
        .map(|suspended| principal_json(&who, "suspended", suspended));
    respond(result, &op.correlation_id, StatusCode::OK)
}

pub async fn resume(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path(subject): Path<String>,
    query: PrincipalQueryResult,
) -> Response {
    let who = match principal_args(subject, query, &op.correlation_id) {
        Ok(w) => w,
        Err(resp) => return *resp,
    };
    let result =
        state.gateway.resume_principal(&op, &who).await.map(|resumed| principal_json(&who, "resumed", resumed));
    respond(result, &op.correlation_id, StatusCode::OK)
}
