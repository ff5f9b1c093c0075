//! A model API that plays a recorded transcript (`tests/fixtures/live-*.json`), for testing the
//! live driver's wire handling without a network. A real HTTP server on port 0: each request gets
//! the transcript's next response, after the request is checked against that turn's expectations
//! (path, headers, and JSON-pointer fields of the body). A request that misses any expectation is
//! answered 400 with what was wrong, so the driver stops there, and the mismatch is kept for the test.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use axum::Json;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use serde::Deserialize;
use serde_json::{Value, json};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Transcript {
    /// "anthropic" or "openai".
    pub provider: String,
    pub model: String,
    /// A made-up key the driver must send; checked through `headers`.
    pub api_key: String,
    pub prompt: String,
    /// The path every request must hit.
    pub path: String,
    /// Headers every request must carry, exactly (names in lower case).
    pub headers: BTreeMap<String, String>,
    pub turns: Vec<Turn>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Turn {
    /// JSON pointer into the request body → the value it must have (`null`: absent or null).
    #[serde(default)]
    pub expect: BTreeMap<String, Value>,
    /// JSON pointer → substrings its string value must contain.
    #[serde(default)]
    pub expect_contains: BTreeMap<String, Vec<String>>,
    /// What the model answers.
    pub response: Value,
}

impl Transcript {
    pub fn load(file: &str) -> Transcript {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures").join(file);
        let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
    }
}

/// A request the fake received.
#[derive(Debug, Clone)]
pub struct Recorded {
    pub body: Value,
}

struct Shared {
    transcript: Transcript,
    requests: Vec<Recorded>,
    mismatches: Vec<String>,
}

pub struct FakeModel {
    /// The server's root, e.g. `http://127.0.0.1:41234`.
    pub url: String,
    shared: Arc<Mutex<Shared>>,
    server: tokio::task::JoinHandle<()>,
}

impl FakeModel {
    pub async fn serve(transcript: Transcript) -> FakeModel {
        let shared = Arc::new(Mutex::new(Shared { transcript, requests: Vec::new(), mismatches: Vec::new() }));
        let app = axum::Router::new().fallback(answer).with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}", listener.local_addr().unwrap());
        let server = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        FakeModel { url, shared, server }
    }

    pub fn requests(&self) -> Vec<Recorded> {
        self.shared.lock().unwrap().requests.clone()
    }

    /// Every expectation a request missed, as "turn N: …".
    pub fn mismatches(&self) -> Vec<String> {
        self.shared.lock().unwrap().mismatches.clone()
    }
}

impl Drop for FakeModel {
    fn drop(&mut self) {
        self.server.abort();
    }
}

async fn answer(
    State(shared): State<Arc<Mutex<Shared>>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> (StatusCode, Json<Value>) {
    let mut shared = shared.lock().unwrap();
    let body: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let n = shared.requests.len();
    shared.requests.push(Recorded { body: body.clone() });
    let Some(turn) = shared.transcript.turns.get(n) else {
        let missed = format!("turn {}: the transcript has only {n} turns", n + 1);
        shared.mismatches.push(missed.clone());
        return (StatusCode::INTERNAL_SERVER_ERROR, Json(json!({"error": {"message": missed}})));
    };
    let mut missed = Vec::new();
    if uri.path() != shared.transcript.path {
        missed.push(format!("path is {}, expected {}", uri.path(), shared.transcript.path));
    }
    for (name, want) in &shared.transcript.headers {
        let got = headers.get(name).and_then(|v| v.to_str().ok());
        if got != Some(want.as_str()) {
            // Never echo a credential header's value back.
            missed.push(format!("header {name} is missing or wrong"));
        }
    }
    for (pointer, want) in &turn.expect {
        let got = body.pointer(pointer).unwrap_or(&Value::Null);
        if got != want {
            missed.push(format!("{pointer} is {got}, expected {want}"));
        }
    }
    for (pointer, wanted) in &turn.expect_contains {
        let got = body.pointer(pointer).and_then(Value::as_str);
        for want in wanted {
            if !got.is_some_and(|s| s.contains(want.as_str())) {
                missed.push(format!("{pointer} is {got:?}, expected it to contain {want:?}"));
            }
        }
    }
    if missed.is_empty() {
        return (StatusCode::OK, Json(turn.response.clone()));
    }
    let missed: Vec<String> = missed.into_iter().map(|m| format!("turn {}: {m}", n + 1)).collect();
    shared.mismatches.extend(missed.iter().cloned());
    (StatusCode::BAD_REQUEST, Json(json!({"error": {"type": "invalid_request_error", "message": missed.join("; ")}})))
}
