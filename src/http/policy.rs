//! The operator API's policy routes (`/operator/v1/policy…`, `docs/operator-api.yaml`): the
//! version in force, its history and diffs, proposals and their four-eyes approval, roll back, and
//! the dry run against history. The gateway checks scopes and rules (`gateway::policy`).

use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;
use serde_json::Value;

use super::AppState;
use super::approvals::{Authed, ReasonBody, parse_body, refusal, respond};
use crate::error::ErrorCode;
use crate::gateway::{ChangeOutcome, ProposeArgs};

type QueryResult<T> = Result<Query<T>, axum::extract::rejection::QueryRejection>;

fn version_arg(s: &str, correlation_id: &str) -> Result<i64, Box<Response>> {
    match s.parse::<i64>() {
        Ok(v) if v >= 1 => Ok(v),
        _ => Err(Box::new(refusal(
            ErrorCode::InvalidArgument,
            "a policy version is a whole number from 1",
            correlation_id,
        ))),
    }
}

/// 200 when the change is in force, 202 when it waits for a second operator.
fn change(result: Result<ChangeOutcome, crate::gateway::approvals_api::OpError>, correlation_id: &str) -> Response {
    let status = match &result {
        Ok(o) if o.status == "pending" => StatusCode::ACCEPTED,
        _ => StatusCode::OK,
    };
    respond(result, correlation_id, status)
}

pub async fn current(State(state): State<AppState>, Authed(op): Authed) -> Response {
    respond(state.gateway.ops_policy(&op).await, &op.correlation_id, StatusCode::OK)
}

pub async fn versions(State(state): State<AppState>, Authed(op): Authed) -> Response {
    let result = state.gateway.ops_policy_versions(&op).await.map(|items| serde_json::json!({ "items": items }));
    respond(result, &op.correlation_id, StatusCode::OK)
}

pub async fn version(State(state): State<AppState>, Authed(op): Authed, Path(v): Path<String>) -> Response {
    let v = match version_arg(&v, &op.correlation_id) {
        Ok(v) => v,
        Err(resp) => return *resp,
    };
    respond(state.gateway.ops_policy_version(&op, v).await, &op.correlation_id, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiffQuery {
    from: String,
    to: String,
}

pub async fn diff(State(state): State<AppState>, Authed(op): Authed, q: QueryResult<DiffQuery>) -> Response {
    let Ok(Query(q)) = q else {
        return refusal(ErrorCode::InvalidArgument, "from and to (policy versions) are required", &op.correlation_id);
    };
    let (from, to) = match (version_arg(&q.from, &op.correlation_id), version_arg(&q.to, &op.correlation_id)) {
        (Ok(a), Ok(b)) => (a, b),
        (Err(resp), _) | (_, Err(resp)) => return *resp,
    };
    // `widens`, the named `changes`, each principal's effective change (`authority`), `governance`.
    respond(state.gateway.ops_policy_diff(&op, from, to).await, &op.correlation_id, StatusCode::OK)
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProposalsQuery {
    status: Option<String>,
}

pub async fn proposals(State(state): State<AppState>, Authed(op): Authed, q: QueryResult<ProposalsQuery>) -> Response {
    let Ok(Query(q)) = q else {
        return refusal(ErrorCode::InvalidArgument, "unknown or malformed query parameter", &op.correlation_id);
    };
    let result = state
        .gateway
        .ops_policy_proposals(&op, q.status.as_deref())
        .await
        .map(|items| serde_json::json!({ "items": items }));
    respond(result, &op.correlation_id, StatusCode::OK)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProposeBody {
    document: Value,
    reason: Option<String>,
    base_version: Option<i64>,
}

pub async fn propose(State(state): State<AppState>, Authed(op): Authed, body: axum::body::Bytes) -> Response {
    let b: ProposeBody = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    let args = ProposeArgs { document: b.document, reason: b.reason, base_version: b.base_version };
    change(state.gateway.ops_policy_propose(&op, args).await, &op.correlation_id)
}

pub async fn proposal(State(state): State<AppState>, Authed(op): Authed, Path(id): Path<String>) -> Response {
    respond(state.gateway.ops_policy_proposal(&op, &id).await, &op.correlation_id, StatusCode::OK)
}

pub async fn approve(State(state): State<AppState>, Authed(op): Authed, Path(id): Path<String>) -> Response {
    change(state.gateway.ops_policy_approve(&op, &id).await, &op.correlation_id)
}

pub async fn reject(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path(id): Path<String>,
    body: axum::body::Bytes,
) -> Response {
    let b: ReasonBody = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    respond(state.gateway.ops_policy_reject(&op, &id, b.reason).await, &op.correlation_id, StatusCode::OK)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RollbackBody {
    version: i64,
    reason: Option<String>,
    base_version: Option<i64>,
}

pub async fn rollback(State(state): State<AppState>, Authed(op): Authed, body: axum::body::Bytes) -> Response {
    let b: RollbackBody = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    change(state.gateway.ops_policy_rollback(&op, b.version, b.reason, b.base_version).await, &op.correlation_id)
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SimulateBody {
    document: Value,
    since: Option<String>,
    until: Option<String>,
}

pub async fn simulate(State(state): State<AppState>, Authed(op): Authed, body: axum::body::Bytes) -> Response {
    let b: SimulateBody = match parse_body(&body, &op.correlation_id) {
        Ok(b) => b,
        Err(resp) => return *resp,
    };
    let result = state.gateway.ops_policy_simulate(&op, &b.document, b.since.as_deref(), b.until.as_deref()).await;
    respond(result, &op.correlation_id, StatusCode::OK)
}
