//! Passkey routes under `/operator/v1`: a person registers (with an enrolment code or an existing
//! passkey), lists and revokes their passkeys; an admin issues enrolment codes for others; an
//! auditor verifies the passkey-signed reviews of an approval again. Same operator tokens, rate
//! limit and error envelope as the rest of the operator API.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::Response;
use serde_json::json;

use super::AppState;
use super::approvals::{Authed, refusal, respond};
use crate::error::ErrorCode;
use crate::gateway::{EnrolmentCodeRequest, PasskeyRegistration};

/// `POST /operator/v1/passkeys/options`: the registration ceremony's options.
pub async fn options(State(state): State<AppState>, Authed(op): Authed) -> Response {
    respond(state.gateway.passkey_options(&op).await, &op.correlation_id, StatusCode::OK)
}

/// `GET /operator/v1/passkeys`: the signed-in person's passkeys.
pub async fn list(State(state): State<AppState>, Authed(op): Authed) -> Response {
    let result = state.gateway.passkeys(&op).await.map(|items| json!({"items": items}));
    respond(result, &op.correlation_id, StatusCode::OK)
}

/// `POST /operator/v1/passkeys`: register the passkey the ceremony made.
pub async fn register(State(state): State<AppState>, Authed(op): Authed, body: axum::body::Bytes) -> Response {
    let reg: PasskeyRegistration = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return refusal(ErrorCode::InvalidArgument, &format!("invalid JSON body: {e}"), &op.correlation_id),
    };
    respond(state.gateway.passkey_register(&op, reg).await, &op.correlation_id, StatusCode::CREATED)
}

/// `POST /operator/v1/passkeys/enrolment-codes`: an admin issues an enrolment code for another
/// person (shown once).
pub async fn enrolment_code(State(state): State<AppState>, Authed(op): Authed, body: axum::body::Bytes) -> Response {
    let req: EnrolmentCodeRequest = match serde_json::from_slice(&body) {
        Ok(r) => r,
        Err(e) => return refusal(ErrorCode::InvalidArgument, &format!("invalid JSON body: {e}"), &op.correlation_id),
    };
    respond(state.gateway.passkey_enrolment_code(&op, req).await, &op.correlation_id, StatusCode::CREATED)
}

/// `POST /operator/v1/passkeys/{credential_id}/revoke`.
pub async fn revoke(State(state): State<AppState>, Authed(op): Authed, Path(id): Path<String>) -> Response {
    respond(state.gateway.passkey_revoke(&op, &id).await, &op.correlation_id, StatusCode::OK)
}

/// `GET /operator/v1/approvals/{approval_id}/passkeys`: its passkey-signed reviews, verified again.
pub async fn approval(State(state): State<AppState>, Authed(op): Authed, Path(id): Path<String>) -> Response {
    respond(state.gateway.approval_passkeys(&op, &id).await, &op.correlation_id, StatusCode::OK)
}
