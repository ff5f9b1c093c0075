//! Binding MCP sessions (2025-11-25 era) to the principal that opened them. rmcp does not: without
//! this, anyone holding a session id could ride another agent's session.
//!
//! The table is bounded twice: `server.sessions_max` in all, and `server.sessions_per_principal_max`
//! per principal (issuer, subject and, with delegation, the user), so one token cannot fill the
//! table and lock every other client out. A place is reserved when `initialize` is admitted, in
//! the same step that checks the bounds, and released if no session comes of it: concurrent
//! `initialize` calls cannot pass the bound together.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

struct Binding {
    /// [`crate::auth::AgentPrincipal::key`] of the principal that opened it.
    principal: String,
    last_seen: Instant,
}

#[derive(Default)]
struct Table {
    bindings: HashMap<String, Binding>,
    /// Live sessions and reserved places per principal, kept with `bindings` and `reserved`.
    per_principal: HashMap<String, usize>,
    /// Places reserved by `initialize` calls still in flight.
    reserved: usize,
}

impl Table {
    fn remove(&mut self, session_id: &str) {
        if let Some(b) = self.bindings.remove(session_id) {
            self.forget(&b.principal);
        }
    }

    fn forget(&mut self, principal: &str) {
        if let Some(n) = self.per_principal.get_mut(principal) {
            *n = n.saturating_sub(1);
            if *n == 0 {
                self.per_principal.remove(principal);
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

    fn count(&self, principal: &str) -> usize {
        self.per_principal.get(principal).copied().unwrap_or(0)
    }

    fn total(&self) -> usize {
        self.bindings.len() + self.reserved
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

/// Why a principal may not open one more session.
#[derive(Debug, PartialEq, Eq)]
pub enum Refused {
    /// This principal holds (or is opening) `sessions_per_principal_max` sessions already.
    PrincipalFull,
    /// The table holds `sessions_max`.
    Full,
}

/// A place reserved for a session being opened. [`Slot::bind`] turns it into the session's
/// binding; dropped unbound (`initialize` failed, or answered without a session), it is released.
pub struct Slot {
    sessions: Arc<SessionBindings>,
    principal: String,
    bound: bool,
}

impl Slot {
    /// The session `initialize` opened belongs to the principal that reserved this place.
    pub fn bind(mut self, session_id: String) {
        let mut t = self.sessions.lock();
        // Rebinding an id does not count it twice.
        t.remove(&session_id);
        t.reserved = t.reserved.saturating_sub(1);
        t.bindings.insert(session_id, Binding { principal: self.principal.clone(), last_seen: Instant::now() });
        self.bound = true;
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        if !self.bound {
            let mut t = self.sessions.lock();
            t.reserved = t.reserved.saturating_sub(1);
            t.forget(&self.principal);
        }
    }
}

impl SessionBindings {
    pub fn new(idle: Duration, max: usize, per_principal_max: usize) -> Self {
        SessionBindings { table: Mutex::new(Table::default()), idle, max, per_principal_max }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn check(&self, session_id: &str, principal: &str) -> SessionCheck {
        let mut t = self.lock();
        match t.bindings.get_mut(session_id) {
            Some(b) if b.principal == principal => {
                b.last_seen = Instant::now();
                SessionCheck::Proceed
            }
            _ => SessionCheck::Unknown,
        }
    }

    /// Reserve a place for one more session of `principal`, in the same step that checks both
    /// bounds (idle bindings are pruned first when either is reached).
    pub fn reserve(self: &Arc<Self>, principal: &str) -> Result<Slot, Refused> {
        let mut t = self.lock();
        if t.count(principal) >= self.per_principal_max || t.total() >= self.max {
            t.prune(self.idle);
        }
        if t.count(principal) >= self.per_principal_max {
            return Err(Refused::PrincipalFull);
        }
        if t.total() >= self.max {
            return Err(Refused::Full);
        }
        *t.per_principal.entry(principal.to_string()).or_default() += 1;
        t.reserved += 1;
        Ok(Slot { sessions: self.clone(), principal: principal.to_string(), bound: false })
    }

    pub fn unbind(&self, session_id: &str) {
        self.lock().remove(session_id);
    }

    #[cfg(test)]
    fn held(&self, principal: &str) -> usize {
        self.lock().count(principal)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_principal_has_its_own_bound_and_the_table_its_total() {
        let s = Arc::new(SessionBindings::new(Duration::from_secs(300), 3, 2));
        s.reserve("a").unwrap().bind("s1".into());
        s.reserve("a").unwrap().bind("s2".into());
        assert_eq!(s.reserve("a").err(), Some(Refused::PrincipalFull));
        assert!(s.reserve("a-other-issuer").is_ok(), "another principal has its own bound");
        s.reserve("b").unwrap().bind("s3".into());
        assert_eq!(s.reserve("c").err(), Some(Refused::Full));
        s.unbind("s1");
        assert!(s.reserve("a").is_ok(), "ending a session frees its place");
        s.reserve("b").unwrap().bind("s3".into()); // rebinding an id does not count it twice
        assert_eq!(s.held("b"), 1);
        assert_eq!(s.check("s3", "b"), SessionCheck::Proceed);
        assert_eq!(s.check("s3", "a"), SessionCheck::Unknown, "another principal's session");
    }

    #[test]
    fn reserved_places_count_at_once_and_an_unbound_one_is_given_back() {
        let s = Arc::new(SessionBindings::new(Duration::from_secs(300), 100, 2));
        // Two initialize calls in flight hold both places before either answered.
        let first = s.reserve("a").unwrap();
        let second = s.reserve("a").unwrap();
        assert_eq!(s.reserve("a").err(), Some(Refused::PrincipalFull), "the bound holds while they run");
        drop(second); // that initialize failed: its place is given back
        assert_eq!(s.held("a"), 1);
        first.bind("s1".into());
        assert!(s.reserve("a").is_ok());
        assert_eq!(s.held("a"), 1, "the slot just reserved and dropped is back");
    }
}
