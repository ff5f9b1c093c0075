//! The operator API under `/operator/v1` (what the console calls; `docs/operator-api.yaml`). Same
//! operator tokens, rate limit and error envelope as `/approvals`; the gateway checks the scopes.

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::json;

use super::AppState;
use super::approvals::{Authed, ReviewBody, envelope, parse_body, respond};
use crate::gateway::{AuditFilters, PaymentFilters};

type QueryResult<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;

fn bad_query(correlation_id: &str) -> Response {
    envelope(StatusCode::BAD_REQUEST, "INVALID_ARGUMENT", "unknown or malformed query parameter", correlation_id)
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
    let result = state.gateway.ops_payments(&op, filters, q.cursor.as_deref(), q.limit).await;
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
    let result = state.gateway.ops_audit(&op, filters, q.cursor.as_deref(), q.limit).await;
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
    let status = q.status.filter(|s| !s.is_empty());
    let result = state.gateway.list_approvals(&op, status.as_deref(), q.cursor.as_deref(), q.limit).await;
    respond(result.map(|(items, next)| page(items, next)), &op.correlation_id, StatusCode::OK)
}

pub async fn mandates(State(state): State<AppState>, Authed(op): Authed, q: QueryResult<StatusPage>) -> Response {
    let Ok(Query(q)) = q else { return bad_query(&op.correlation_id) };
    let result = state.gateway.ops_mandates(&op, q.status, q.cursor.as_deref(), q.limit).await;
    respond(result.map(|(items, next)| page(items, next)), &op.correlation_id, StatusCode::OK)
}

pub async fn revoke_mandate(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let body: ReviewBody = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    respond(state.gateway.ops_revoke_mandate(&op, &id, body.reason).await, &op.correlation_id, StatusCode::OK)
}

pub async fn principals(State(state): State<AppState>, Authed(op): Authed) -> Response {
    let result = state.gateway.ops_principals(&op).await.map(|items| page(items, None));
    respond(result, &op.correlation_id, StatusCode::OK)
}

pub async fn reconciliation(State(state): State<AppState>, Authed(op): Authed) -> Response {
    let result = state.gateway.ops_last_reconciliation(&op).await.map(|last| json!({"last": last}));
    respond(result, &op.correlation_id, StatusCode::OK)
}

pub async fn reconcile(State(state): State<AppState>, Authed(op): Authed) -> Response {
    respond(state.gateway.ops_reconcile(&op).await, &op.correlation_id, StatusCode::OK)
}
