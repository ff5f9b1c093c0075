//! The rail simulators' control routes (`<rail>.environment = "simulator"`): what a person does in
//! place of the customer's phone and of the rail, at `/simulator/control/<rail>`. Operators only
//! (`payments:admin`): answering a prompt "paid" credits the gateway's account, simulated or not.

use std::sync::Arc;

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;
use super::approvals::{Authed, refusal};
use crate::backend::simulator::{Answer, Pick, RailSimulator};
use crate::catalogue::scopes;
use crate::error::ErrorCode;

/// The simulator of `rail`, to an operator holding `payments:admin`; else the refusal.
fn simulator(
    state: &AppState,
    op: &crate::gateway::Operator,
    rail: &str,
) -> Result<Arc<dyn RailSimulator>, Box<Response>> {
    if !op.scopes.contains(scopes::ADMIN) {
        let why = format!("the simulator's controls need scope {}", scopes::ADMIN);
        return Err(Box::new(refusal(ErrorCode::InsufficientScope, &why, &op.correlation_id)));
    }
    let absent =
        || Box::new(refusal(ErrorCode::NotFound, &format!("no {rail} simulator runs here"), &op.correlation_id));
    state.simulators.iter().find(|s| s.rail() == rail).cloned().ok_or_else(absent)
}

/// `GET /simulator/control/{rail}`: every prompt and payment, newest first.
pub async fn view(State(state): State<AppState>, Authed(op): Authed, Path(rail): Path<String>) -> Response {
    match simulator(&state, &op, &rail) {
        Ok(sim) => axum::Json(sim.view()).into_response(),
        Err(refused) => *refused,
    }
}

/// `POST /simulator/control/{rail}/lose-next-answer`: the next money request is processed and its
/// answer never sent (the gateway sees an unknown outcome).
pub async fn lose_next_answer(State(state): State<AppState>, Authed(op): Authed, Path(rail): Path<String>) -> Response {
    match simulator(&state, &op, &rail) {
        Ok(sim) => {
            sim.lose_next_answer();
            axum::Json(json!({"lose_next_answer": true})).into_response()
        }
        Err(refused) => *refused,
    }
}

/// `POST /simulator/control/{rail}/{id}/{accept|decline|timeout}`: answers a pending prompt or
/// payment (`latest`: the newest pending one); the simulator tells the gateway as the rail would and
/// says what the gateway answered its callback (`null`: the rail posts none; the gateway's enquiry
/// finds the outcome).
pub async fn answer(
    State(state): State<AppState>,
    Authed(op): Authed,
    Path((rail, id, answer)): Path<(String, String, String)>,
) -> Response {
    let sim = match simulator(&state, &op, &rail) {
        Ok(sim) => sim,
        Err(refused) => return *refused,
    };
    let Some(answer) = Answer::parse(&answer) else {
        return refusal(ErrorCode::InvalidArgument, "answer with accept, decline or timeout", &op.correlation_id);
    };
    match sim.answer(Pick::parse(&id), answer).await {
        Ok((id, status)) => (StatusCode::OK, axum::Json(json!({"id": id, "callback_status": status}))).into_response(),
        Err(why) => refusal(ErrorCode::NotFound, &why, &op.correlation_id),
    }
}
