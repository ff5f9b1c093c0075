//! Binding MCP sessions (2025-11-25 era) to the principal that opened them. rmcp does not: without
//! this, anyone holding a session id could ride another agent's session.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

struct Binding {
    issuer: String,
    subject: String,
    last_seen: Instant,
}

pub struct SessionBindings {
    map: Mutex<HashMap<String, Binding>>,
    /// Bindings idle longer than this are dropped (rmcp has closed the session by then).
    idle: Duration,
    max: usize,
}

/// What a session id means for this caller.
#[derive(Debug, PartialEq, Eq)]
pub enum SessionCheck {
    /// Bound to this principal.
    Proceed,
    /// Bound to someone else, or to no one we know: answer as if the session did not exist (404),
    /// so the client re-initializes. Fail closed.
    Unknown,
}

impl SessionBindings {
    pub fn new(idle: Duration, max: usize) -> Self {
        SessionBindings { map: Mutex::new(HashMap::new()), idle, max }
    }

    pub fn check(&self, session_id: &str, issuer: &str, subject: &str) -> SessionCheck {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        match map.get_mut(session_id) {
            Some(b) if b.issuer == issuer && b.subject == subject => {
                b.last_seen = Instant::now();
                SessionCheck::Proceed
            }
            _ => SessionCheck::Unknown,
        }
    }

    /// Room for one more session? Idle bindings are pruned first.
    pub fn has_capacity(&self) -> bool {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        if map.len() >= self.max {
            let idle = self.idle;
            map.retain(|_, b| b.last_seen.elapsed() < idle);
        }
        map.len() < self.max
    }

    pub fn bind(&self, session_id: String, issuer: String, subject: String) {
        let mut map = self.map.lock().unwrap_or_else(|p| p.into_inner());
        map.insert(session_id, Binding { issuer, subject, last_seen: Instant::now() });
    }

    pub fn unbind(&self, session_id: &str) {
        self.map.lock().unwrap_or_else(|p| p.into_inner()).remove(session_id);
    }
}
