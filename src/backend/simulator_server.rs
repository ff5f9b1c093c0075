//! A rail simulator as a process of its own (`paygate rail-simulator`): one rail's simulated API
//! at the root of its own address, so gateways reach it through `mpesa.base_url` /
//! `airtel.base_url` exactly as they reach the real rail (over the network, which a fault suite can
//! partition; in a process it can kill and restart), and the control routes the gateway serves for
//! its in-process simulators, at the same paths: `GET /simulator/control/<rail>` (the records
//! view), `POST /simulator/control/<rail>/lose-next-answer`,
//! `POST /simulator/control/<rail>/<id|latest>/<accept|decline|timeout>`.
//!
//! Architecture Invariant: the control routes are never open to the network by default. With a
//! control token, only a request bearing it; without one, only loopback peers. The rail's own API
//! needs the rail's credentials (an OAuth token made from them), as the real rail does.
//!
//! State is in memory: a restarted simulator remembers nothing, like a rail that lost its records
//! (what a checker counted before the kill it must read before the kill).

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{ConnectInfo, Path, State};
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::json;
use tower_http::limit::RequestBodyLimitLayer;

use super::simulator::{Answer, Pick, RailSimulator};
use crate::secret::Secret;

/// Largest request body accepted, in bytes (a rail request or a control call is a few hundred).
pub const BODY_BYTES_MAX: usize = 64 * 1024;

#[derive(Clone)]
struct Control {
    sim: Arc<dyn RailSimulator>,
    /// The bearer token the control routes ask for; `None`: loopback peers only.
    token: Option<Secret>,
}

/// The simulator's rail API at the root and its control routes under `/simulator/control/<rail>`.
pub fn router(sim: Arc<dyn RailSimulator>, control_token: Option<Secret>) -> Router {
    let control = Router::new()
        .route("/simulator/control/{rail}", get(view))
        .route("/simulator/control/{rail}/lose-next-answer", post(lose_next_answer))
        .route("/simulator/control/{rail}/{id}/{answer}", post(answer))
        .with_state(Control { sim: sim.clone(), token: control_token });
    sim.router()
        .merge(control)
        .route("/healthz", get(|| async { "ok" }))
        .layer(RequestBodyLimitLayer::new(BODY_BYTES_MAX))
}

/// Serves `sim` on `listener` until `shutdown` resolves.
pub async fn serve(
    listener: tokio::net::TcpListener,
    sim: Arc<dyn RailSimulator>,
    control_token: Option<Secret>,
    shutdown: impl std::future::Future<Output = ()> + Send + 'static,
) -> std::io::Result<()> {
    let addr = listener.local_addr()?;
    let rail = sim.rail();
    let guarded = if control_token.is_some() { "a bearer token" } else { "loopback peers only" };
    tracing::info!(simulator.rail = rail, simulator.addr = %addr, control = guarded, "rail simulator listening");
    let app = router(sim, control_token).into_make_service_with_connect_info::<SocketAddr>();
    axum::serve(listener, app).with_graceful_shutdown(shutdown).await
}

/// Whether a control call may proceed: the token, when one is set; else a loopback peer.
fn allowed(token: Option<&Secret>, peer: SocketAddr, headers: &HeaderMap) -> Result<(), StatusCode> {
    let presented = headers.get(header::AUTHORIZATION).and_then(|v| v.to_str().ok());
    match token {
        Some(t) => match presented.and_then(|h| h.strip_prefix("Bearer ")) {
            Some(p) if t.matches(p) => Ok(()),
            _ => Err(StatusCode::UNAUTHORIZED),
        },
        None if peer.ip().is_loopback() => Ok(()),
        None => Err(StatusCode::FORBIDDEN),
    }
}

fn refusal(status: StatusCode, why: &str) -> Response {
    (status, axum::Json(json!({"error": why}))).into_response()
}

/// The simulator, when the caller may steer it and names its rail; else the refusal.
fn steer(
    c: &Control,
    peer: SocketAddr,
    headers: &HeaderMap,
    rail: &str,
) -> Result<Arc<dyn RailSimulator>, Box<Response>> {
    if let Err(status) = allowed(c.token.as_ref(), peer, headers) {
        tracing::warn!(http.peer = %peer, "rail simulator: a control call was refused");
        let why = match status {
            StatusCode::UNAUTHORIZED => "the control routes need the control token (Authorization: Bearer …)",
            _ => "the control routes answer loopback peers only (start it with a control token)",
        };
        return Err(Box::new(refusal(status, why)));
    }
    if rail != c.sim.rail() {
        let why = format!("this simulator is {}'s, not {rail}'s", c.sim.rail());
        return Err(Box::new(refusal(StatusCode::NOT_FOUND, &why)));
    }
    Ok(c.sim.clone())
}

/// `GET /simulator/control/{rail}`: every item, newest first (see [`RailSimulator::view`]).
async fn view(
    State(c): State<Control>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(rail): Path<String>,
) -> Response {
    match steer(&c, peer, &headers, &rail) {
        Ok(sim) => axum::Json(sim.view()).into_response(),
        Err(refused) => *refused,
    }
}

/// `POST /simulator/control/{rail}/lose-next-answer`.
async fn lose_next_answer(
    State(c): State<Control>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path(rail): Path<String>,
) -> Response {
    match steer(&c, peer, &headers, &rail) {
        Ok(sim) => {
            sim.lose_next_answer();
            axum::Json(json!({"lose_next_answer": true})).into_response()
        }
        Err(refused) => *refused,
    }
}

/// `POST /simulator/control/{rail}/{id}/{accept|decline|timeout}` (`latest`: the newest pending).
async fn answer(
    State(c): State<Control>,
    ConnectInfo(peer): ConnectInfo<SocketAddr>,
    headers: HeaderMap,
    Path((rail, id, answer)): Path<(String, String, String)>,
) -> Response {
    let sim = match steer(&c, peer, &headers, &rail) {
        Ok(sim) => sim,
        Err(refused) => return *refused,
    };
    let Some(answer) = Answer::parse(&answer) else {
        return refusal(StatusCode::BAD_REQUEST, "answer with accept, decline or timeout");
    };
    match sim.answer(Pick::parse(&id), answer).await {
        Ok((id, status)) => axum::Json(json!({"id": id, "callback_status": status})).into_response(),
        Err(why) => refusal(StatusCode::NOT_FOUND, &why),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn control_needs_the_token_or_a_loopback_peer() {
        let local: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let remote: SocketAddr = "203.0.113.7:9".parse().unwrap();
        let none = HeaderMap::new();
        let mut bearer = HeaderMap::new();
        bearer.insert(header::AUTHORIZATION, "Bearer control-0123456789".parse().unwrap());
        let mut wrong = HeaderMap::new();
        wrong.insert(header::AUTHORIZATION, "Bearer control-x".parse().unwrap());
        assert_eq!(allowed(None, local, &none), Ok(()));
        assert_eq!(allowed(None, remote, &bearer), Err(StatusCode::FORBIDDEN), "no token: closed to the network");
        let t = Secret::new("control-0123456789".into());
        assert_eq!(allowed(Some(&t), remote, &bearer), Ok(()));
        assert_eq!(allowed(Some(&t), local, &none), Err(StatusCode::UNAUTHORIZED), "a token, once set, is needed");
        assert_eq!(allowed(Some(&t), local, &wrong), Err(StatusCode::UNAUTHORIZED));
    }
}
