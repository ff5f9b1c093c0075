//! The Daraja simulator's control routes (`mpesa.environment = "simulator"`): what a person does in
//! place of the customer's phone and of M-Pesa. Operators only (`payments:admin`): answering a
//! prompt "paid" credits the gateway's account, simulated or not.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::approvals::{Authed, refusal};
use crate::backend::mpesa::simulator::Answer;
use crate::catalogue::scopes;
use crate::error::ErrorCode;

/// The simulator, to an operator holding `payments:admin`; else the refusal.
fn simulator<'a>(
    state: &'a AppState,
    op: &crate::gateway::Operator,
) -> Result<&'a crate::backend::mpesa::simulator::DarajaSimulator, Box<Response>> {
    if !op.scopes.contains(scopes::ADMIN) {
        let why = format!("the simulator's controls need scope {}", scopes::ADMIN);
        return Err(Box::new(refusal(ErrorCode::InsufficientScope, &why, &op.correlation_id)));
    }
    let absent = || Box::new(refusal(ErrorCode::NotFound, "no simulator runs here", &op.correlation_id));
    state.simulator.as_ref().ok_or_else(absent)
}

/// `GET /simulator/control/mpesa`: every prompt and payment, newest first.
pub async fn view(State(state): State<AppState>, Authed(op): Authed) -> Response {
    match simulator(&state, &op) {
        Ok(sim) => axum::Json(sim.view()).into_response(),
        Err(refused) => *refused,
    }
}

/// `POST /simulator/control/mpesa/lose-next-answer`: the next money request is processed and its
/// answer never sent (the gateway sees an unknown outcome).
pub async fn lose_next_answer(State(state): State<AppState>, Authed(op): Authed) -> Response {
    match simulator(&state, &op) {
        Ok(sim) => {
            sim.lose_next_answer();
            axum::Json(json!({"lose_next_answer": true})).into_response()
        }
        Err(refused) => *refused,
    }
}

/// `POST /simulator/control/mpesa/{id}/{accept|decline|timeout}`: answers a pending prompt or
/// payment (`latest`: the newest pending one); the simulator posts Daraja's callback to the gateway
/// and tells what the gateway said.
pub async fn answer(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path((id, answer)): Path<(String, String)>,
) -> Response {
    let sim = match simulator(&state, &op) {
        Ok(sim) => sim,
        Err(refused) => return *refused,
    };
    let answer = match answer.as_str() {
        "accept" => Answer::Accept,
        "decline" => Answer::Decline,
        "timeout" => Answer::Timeout,
        _ => return refusal(ErrorCode::InvalidArgument, "answer with accept, decline or timeout", &op.correlation_id),
    };
    match sim.answer(&id, answer).await {
        Ok((id, status)) => (StatusCode::OK, axum::Json(json!({"id": id, "callback_status": status}))).into_response(),
        Err(why) => refusal(ErrorCode::NotFound, &why, &op.correlation_id),
    }
}
