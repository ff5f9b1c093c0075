//! The operator API under `/operator/v1` (what the console calls; `docs/operator-api.yaml`). Same
//! operator tokens, rate limit and error envelope as `/approvals`; the gateway checks the scopes.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::approvals::{Authed, ReasonBody, parse_body, refusal, respond};
use crate::error::ErrorCode;
use crate::gateway::{AuditFilters, PayeeArgs, PaymentFilters, ResolveArgs};

type QueryResult<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;

fn bad_query(correlation_id: &str) -> Response {
    refusal(ErrorCode::InvalidArgument, "unknown or malformed query parameter", correlation_id)
}

/// `cursor=` (empty) is the first page, as no cursor at all.
fn cursor(c: &Option<String>) -> Option<&str> {
    c.as_deref().filter(|c| !c.is_empty())
}

fn page<T: serde::Serialize>(items: Vec<T>, next_cursor: Option<String>) -> serde_json::Value {
    json!({"items": items, "next_cursor": next_cursor})
}

pub async fn health(State(state): State<AppState>, Authed(op): Authed) -> Response {
    respond(state.gateway.ops_health(&op).await, &op.correlation_id, StatusCode::OK)
}

pub async fn summary(State(state): State<AppState>, Authed(op): Authed) -> Response {
    respond(state.gateway.ops_summary(&op).await, &op.correlation_id, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PaymentsQuery {
    account: Option<String>,
    status: Option<String>,
    kind: Option<String>,
    rail: Option<String>,
    agent: Option<String>,
    user: Option<String>,
    from: Option<String>,
    to: Option<String>,
    cursor: Option<String>,
    limit: Option<u32>,
}

pub async fn payments(State(state): State<AppState>, Authed(op): Authed, q: QueryResult<PaymentsQuery>) -> Response {
    let Ok(Query(q)) = q else { return bad_query(&op.correlation_id) };
    let filters = PaymentFilters {
        account: q.account,
        status: q.status,
        kind: q.kind,
        rail: q.rail,
        agent: q.agent,
        user: q.user,
        from: q.from,
        to: q.to,
    };
    let result = state.gateway.ops_payments(&op, filters, cursor(&q.cursor), q.limit).await;
    respond(result.map(|(items, next)| page(items, next)), &op.correlation_id, StatusCode::OK)
}

pub async fn payment(State(state): State<AppState>, Authed(op): Authed, Path(id): Path<String>) -> Response {
    respond(state.gateway.ops_payment(&op, &id).await, &op.correlation_id, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AuditParams {
    agent: Option<String>,
    user: Option<String>,
    tool: Option<String>,
    decision: Option<String>,
    code: Option<String>,
    payment_id: Option<String>,
    approval_id: Option<String>,
    correlation_id: Option<String>,
    from: Option<String>,
    to: Option<String>,
    cursor: Option<String>,
    limit: Option<u32>,
}

/// Walk the audit hash chain: 200 with the verdict, whether or not the chain holds (`ok`,
/// `first_break`); the walk is a read and changes nothing. `expect=POSITION:HASH` (a witness's
/// newest checkpoint) holds the chain to it: missing or different is named as a rollback.
pub async fn verify_audit(State(state): State<AppState>, Authed(op): Authed, q: QueryResult<VerifyParams>) -> Response {
    let Ok(Query(q)) = q else { return bad_query(&op.correlation_id) };
    let expect = match q.expect.as_deref() {
        None => None,
        Some(text) => match crate::domain::audit_chain::ChainHead::parse(text) {
            Some(head) => Some(head),
            None => return bad_query(&op.correlation_id),
        },
    };
    respond(state.gateway.ops_verify_audit(&op, expect).await, &op.correlation_id, StatusCode::OK)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VerifyParams {
    /// `POSITION:HASH`.
    expect: Option<String>,
}

pub async fn audit(State(state): State<AppState>, Authed(op): Authed, q: QueryResult<AuditParams>) -> Response {
    let Ok(Query(q)) = q else { return bad_query(&op.correlation_id) };
    let filters = AuditFilters {
        agent: q.agent,
        user: q.user,
        tool: q.tool,
        decision: q.decision,
        code: q.code,
        payment_id: q.payment_id,
        approval_id: q.approval_id,
        correlation_id: q.correlation_id,
        from: q.from,
        to: q.to,
    };
    let result = state.gateway.ops_audit(&op, filters, cursor(&q.cursor), q.limit).await;
    respond(result.map(|(items, next)| page(items, next)), &op.correlation_id, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StatusPage {
    status: Option<String>,
    cursor: Option<String>,
    limit: Option<u32>,
}

pub async fn approvals(State(state): State<AppState>, Authed(op): Authed, q: QueryResult<StatusPage>) -> Response {
    let Ok(Query(q)) = q else { return bad_query(&op.correlation_id) };
    let result = state.gateway.list_approvals(&op, q.status.as_deref(), cursor(&q.cursor), q.limit).await;
    respond(result.map(|(items, next)| page(items, next)), &op.correlation_id, StatusCode::OK)
}

pub async fn mandates(State(state): State<AppState>, Authed(op): Authed, q: QueryResult<StatusPage>) -> Response {
    let Ok(Query(q)) = q else { return bad_query(&op.correlation_id) };
    let result = state.gateway.ops_mandates(&op, q.status.clone(), cursor(&q.cursor), q.limit).await;
    respond(result.map(|(items, next)| page(items, next)), &op.correlation_id, StatusCode::OK)
}

pub async fn revoke_mandate(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let body: ReasonBody = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    respond(state.gateway.ops_revoke_mandate(&op, &id, body.reason).await, &op.correlation_id, StatusCode::OK)
}

/// A person's word on a payout whose outcome is unknown: 202 while it waits for a second person,
/// 200 once it settled the payment.
pub async fn resolve_payment(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let args: ResolveArgs = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    let result = state.gateway.ops_resolve_payment(&op, &id, args).await;
    let status = match &result {
        Ok(v) if v.status == "proposed" => StatusCode::ACCEPTED,
        _ => StatusCode::OK,
    };
    respond(result, &op.correlation_id, status)
}

pub async fn principals(State(state): State<AppState>, Authed(op): Authed) -> Response {
    let result = state.gateway.ops_principals(&op).await.map(|items| page(items, None));
    respond(result, &op.correlation_id, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayeesQuery {
    agent: Option<String>,
    user: Option<String>,
    limit: Option<u32>,
}

pub async fn payees(State(state): State<AppState>, Authed(op): Authed, q: QueryResult<PayeesQuery>) -> Response {
    let Ok(Query(q)) = q else { return bad_query(&op.correlation_id) };
    let result = state.gateway.ops_payees(&op, q.agent.as_deref(), q.user.as_deref(), q.limit).await;
    respond(result.map(|items| page(items, None)), &op.correlation_id, StatusCode::OK)
}

pub async fn add_payee(State(state): State<AppState>, Authed(op): Authed, body: axum::body::Bytes) -> Response {
    let args: PayeeArgs = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    respond(state.gateway.ops_add_payee(&op, args).await, &op.correlation_id, StatusCode::OK)
}

pub async fn revoke_payee(State(state): State<AppState>, Authed(op): Authed, body: axum::body::Bytes) -> Response {
    let args: PayeeArgs = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    respond(state.gateway.ops_revoke_payee(&op, args).await, &op.correlation_id, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WebhooksQuery {
    state: Option<String>,
    limit: Option<u32>,
}

pub async fn webhooks(State(state): State<AppState>, Authed(op): Authed, q: QueryResult<WebhooksQuery>) -> Response {
    let Ok(Query(q)) = q else { return bad_query(&op.correlation_id) };
    let result = state.gateway.ops_webhooks(&op, q.state.as_deref(), q.limit).await;
    respond(result.map(|items| page(items, None)), &op.correlation_id, StatusCode::OK)
}

pub async fn webhook_attempts(State(state): State<AppState>, Authed(op): Authed, Path(id): Path<String>) -> Response {
    let result = state.gateway.ops_webhook_attempts(&op, &id).await;
    respond(result.map(|items| page(items, None)), &op.correlation_id, StatusCode::OK)
}

pub async fn reconciliation(State(state): State<AppState>, Authed(op): Authed) -> Response {
    let result = state.gateway.ops_last_reconciliation(&op).await.map(|last| json!({"last": last}));
    respond(result, &op.correlation_id, StatusCode::OK)
}

pub async fn reconcile(State(state): State<AppState>, Authed(op): Authed) -> Response {
    respond(state.gateway.ops_reconcile(&op).await, &op.correlation_id, StatusCode::OK)
}

/// Every operator-route error in the one envelope: what axum and tower-http answer on their own
/// (404 for an unknown route, 405, 408, 413, a malformed path) is plain text; it is rewritten here,
/// status kept, so a client reads one error shape (`docs/operator-api.yaml`).
pub async fn json_errors(req: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let correlation_id =
        req.extensions().get::<crate::gateway::CorrelationId>().map(|c| c.0.clone()).unwrap_or_default();
    let resp = next.run(req).await;
    let status = resp.status();
    let is_json = resp
        .headers()
        .get(axum::http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return resp;
    }
    let (code, message) = match status {
        StatusCode::NOT_FOUND => (ErrorCode::NotFound, "no such operator route"),
        StatusCode::METHOD_NOT_ALLOWED => (ErrorCode::MethodNotAllowed, "method not allowed on this route"),
        StatusCode::REQUEST_TIMEOUT => (ErrorCode::Timeout, "the request took longer than server.request_timeout_ms"),
        StatusCode::PAYLOAD_TOO_LARGE => {
            (ErrorCode::PayloadTooLarge, "the body is larger than this route accepts (16 KiB; policy routes 272 KiB)")
        }
        StatusCode::UNSUPPORTED_MEDIA_TYPE => (ErrorCode::InvalidArgument, "the body must be JSON"),
        s if s.is_server_error() => (ErrorCode::Internal, "internal error"),
        _ => (ErrorCode::InvalidArgument, "malformed request"),
    };
    let mut out = super::approvals::envelope(status, code, message, &correlation_id);
    // Keep what the client needs beyond the body (Allow on a 405, Retry-After).
    for name in [axum::http::header::ALLOW, axum::http::header::RETRY_AFTER, axum::http::header::WWW_AUTHENTICATE] {
        if let Some(v) = resp.headers().get(&name) {
            out.headers_mut().insert(name, v.clone());
        }
    }
    out
}
