//! Binding MCP sessions (2025-11-25 era) to the principal that opened them. rmcp does not: without
//! this, anyone holding a session id could ride another agent's session.
//!
//! The table is bounded twice: `server.sessions_max` in all, and `server.sessions_per_principal_max`
//! per (issuer, subject), so one token cannot fill the table and lock every other client out.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

struct Binding {
    issuer: String,
    subject: String,
    last_seen: Instant,
}

#[derive(Default)]
struct Table {
    bindings: HashMap<String, Binding>,
    /// Live sessions per (issuer, subject), kept with `bindings`.
    per_principal: HashMap<(String, String), usize>,
}

impl Table {
    fn remove(&mut self, session_id: &str) {
        if let Some(b) = self.bindings.remove(session_id) {
            self.forget(b);
        }
    }

    fn forget(&mut self, b: Binding) {
        let key = (b.issuer, b.subject);
        if let Some(n) = self.per_principal.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.per_principal.remove(&key);
            }
        }
    }

    /// Drop bindings idle longer than `idle` (rmcp has closed those sessions by then).
    fn prune(&mut self, idle: Duration) {
        let stale: Vec<String> =
            self.bindings.iter().filter(|(_, b)| b.last_seen.elapsed() >= idle).map(|(id, _)| id.clone()).collect();
        for id in stale {
            self.remove(&id);
        }
    }

    fn count(&self, issuer: &str, subject: &str) -> usize {
        self.per_principal.get(&(issuer.to_string(), subject.to_string())).copied().unwrap_or(0)
    }
}

pub struct SessionBindings {
    table: Mutex<Table>,
    /// Bindings idle longer than this are dropped (rmcp has closed the session by then).
    idle: Duration,
    max: usize,
    per_principal_max: usize,
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

/// Whether a principal may open one more session.
#[derive(Debug, PartialEq, Eq)]
pub enum Admission {
    Open,
    /// This principal holds `sessions_per_principal_max` live sessions already.
    PrincipalFull,
    /// The table holds `sessions_max`.
    Full,
}

impl SessionBindings {
    pub fn new(idle: Duration, max: usize, per_principal_max: usize) -> Self {
        SessionBindings { table: Mutex::new(Table::default()), idle, max, per_principal_max }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn check(&self, session_id: &str, issuer: &str, subject: &str) -> SessionCheck {
        let mut t = self.lock();
        match t.bindings.get_mut(session_id) {
            Some(b) if b.issuer == issuer && b.subject == subject => {
                b.last_seen = Instant::now();
                SessionCheck::Proceed
            }
            _ => SessionCheck::Unknown,
        }
    }

    /// Room for one more session of this principal? Idle bindings are pruned first when either
    /// bound is reached.
    pub fn admit(&self, issuer: &str, subject: &str) -> Admission {
        let mut t = self.lock();
        if t.count(issuer, subject) >= self.per_principal_max || t.bindings.len() >= self.max {
            t.prune(self.idle);
        }
        if t.count(issuer, subject) >= self.per_principal_max {
            Admission::PrincipalFull
        } else if t.bindings.len() >= self.max {
            Admission::Full
        } else {
            Admission::Open
        }
    }

    pub fn bind(&self, session_id: String, issuer: String, subject: String) {
        let mut t = self.lock();
        t.remove(&session_id);
        *t.per_principal.entry((issuer.clone(), subject.clone())).or_default() += 1;
        t.bindings.insert(session_id, Binding { issuer, subject, last_seen: Instant::now() });
    }

    pub fn unbind(&self, session_id: &str) {
        self.lock().remove(session_id);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_principal_has_its_own_bound_and_the_table_its_total() {
        let s = SessionBindings::new(Duration::from_secs(300), 3, 2);
        assert_eq!(s.admit("iss", "a"), Admission::Open);
        s.bind("s1".into(), "iss".into(), "a".into());
        s.bind("s2".into(), "iss".into(), "a".into());
        assert_eq!(s.admit("iss", "a"), Admission::PrincipalFull);
        assert_eq!(s.admit("other-iss", "a"), Admission::Open, "a principal is issuer and subject");
        s.bind("s3".into(), "iss".into(), "b".into());
        assert_eq!(s.admit("iss", "c"), Admission::Full);
        s.unbind("s1");
        assert_eq!(s.admit("iss", "a"), Admission::Open, "ending a session frees its place");
        s.bind("s3".into(), "iss".into(), "b".into()); // rebinding an id does not count twice
        assert_eq!(s.admit("iss", "c"), Admission::Open);
    }
}
