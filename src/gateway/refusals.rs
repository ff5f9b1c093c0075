//! Refusals decided before a call's body runs (RATE_LIMITED, PRINCIPAL_SUSPENDED, a scope the token
//! lacks) cost nothing durable per request: a flood of them is one audit record per interval per
//! (principal, tool, code), carrying how many it stands for (`AuditRecord::repeats`). Metrics count
//! every one. Those that count toward the stop rule still do, each of them: the stop rule reads the
//! records' repeats and, between records, the count this replica has not written yet.
//!
//! In-process and per replica, bounded by [`THROTTLED_KEYS_MAX`]; a record is never lost: a key
//! that finds no room is audited unthrottled, and `flush` (the scheduler, every minute) writes the
//! counts of windows that ended.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{Caller, Decision, Gateway};
use crate::clock::{UnixSecs, rfc3339};
use crate::domain::audit::AuditRecord;
use crate::domain::principal::PrincipalRef;
use crate::error::{AgentError, ErrorCode};

/// (principal, tool, code) keys throttled at once on a replica; past it, refusals are audited one
/// by one (an audit record is never dropped to save memory).
pub const THROTTLED_KEYS_MAX: usize = 100_000;

/// How a pre-body refusal counts toward the stop rule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Counts {
    /// Not at all (PRINCIPAL_SUSPENDED: the agent is stopped already).
    No,
    /// As a policy denial, each one.
    Denial,
    /// As RATE_LIMITED: `stop_rules.rate_limited_per_denial` of them make one denial.
    RateLimited,
}

#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct Key {
    principal: String,
    tool: String,
    code: ErrorCode,
}

struct Window {
    /// When the current window's first record was written.
    started: UnixSecs,
    /// Refusals in this window not yet in a record.
    unrecorded: i64,
    /// What a flush writes them as.
    principal: PrincipalRef,
    correlation_id: String,
    message: String,
}

/// What to do with one refusal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Note {
    /// Write a record standing for this many refusals now.
    write: Option<i64>,
    /// Refusals of this key noted but not yet written (what the stop rule adds to the store's count).
    unrecorded: i64,
}

#[derive(Default)]
pub(crate) struct Throttle {
    windows: Mutex<HashMap<Key, Window>>,
}

impl Throttle {
    fn note(&self, key: Key, window: Window, interval_secs: i64, now: UnixSecs) -> Note {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        if !windows.contains_key(&key) && windows.len() >= THROTTLED_KEYS_MAX {
            // No room: audited on its own (the flush makes room as windows end).
            return Note { write: Some(1), unrecorded: 0 };
        }
        match windows.get_mut(&key) {
            Some(w) if now < w.started + interval_secs => {
                w.unrecorded += 1;
                Note { write: None, unrecorded: w.unrecorded }
            }
            Some(w) => {
                // A new window: this refusal's record carries the last window's unwritten ones too.
                let repeats = w.unrecorded + 1;
                w.started = now;
                w.unrecorded = 0;
                w.correlation_id = window.correlation_id;
                Note { write: Some(repeats), unrecorded: 0 }
            }
            None => {
                windows.insert(key, window);
                Note { write: Some(1), unrecorded: 0 }
            }
        }
    }

    /// The records of windows that ended with refusals unwritten; ended windows are forgotten.
    fn take_ended(&self, interval_secs: i64, now: UnixSecs) -> Vec<(Key, Window)> {
        let mut windows = self.windows.lock().unwrap_or_else(|p| p.into_inner());
        let ended: Vec<Key> =
            windows.iter().filter(|(_, w)| now >= w.started + interval_secs).map(|(k, _)| k.clone()).collect();
        ended.into_iter().filter_map(|k| windows.remove(&k).map(|w| (k, w))).filter(|(_, w)| w.unrecorded > 0).collect()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.windows.lock().unwrap_or_else(|p| p.into_inner()).len()
    }
}

impl Gateway {
    /// Audit a refusal decided before the call's body ran, throttled (see the module), and count it
    /// toward the stop rule as `counts` says. Returns the error to answer with.
    pub(crate) async fn refuse_early(
        &self,
        caller: &Caller,
        tool: &str,
        decision: &'static str,
        e: AgentError,
        counts: Counts,
    ) -> AgentError {
        // Metrics count every refusal; the audit trail gets one record per window.
        self.metrics.decision(tool, decision, Some(e.code.as_str()));
        let now = self.clock.now();
        let p = &caller.principal;
        let key = Key { principal: p.key(), tool: tool.to_string(), code: e.code };
        let window = Window {
            started: now,
            unrecorded: 0,
            principal: p.principal_ref(),
            correlation_id: caller.correlation_id.clone(),
            message: e.message.clone(),
        };
        let note = self.refusals.note(key, window, self.limits.refusal_audit_interval_secs, now);
        if let Some(repeats) = note.write {
            let mut d = Decision::new(tool, decision);
            d.code = Some(e.code);
            d.detail = Some(throttled_detail(&e.message, repeats));
            let mut rec = self.agent_audit_record(caller, d);
            rec.repeats = repeats;
            self.append_audit(rec).await;
        }
        let every = self.limits.rate_limited_per_denial;
        let evaluate = match counts {
            Counts::No => false,
            Counts::Denial => true,
            // One more denial's worth since the last look, or a record just written.
            Counts::RateLimited => every > 0 && (note.write.is_some() || note.unrecorded % every == 0),
        };
        if evaluate {
            let pending = match counts {
                Counts::RateLimited => crate::store::Denials { denials: 0, rate_limited: note.unrecorded },
                _ => crate::store::Denials { denials: note.unrecorded, rate_limited: 0 },
            };
            self.enforce_stop_rule(caller, tool, pending).await;
        }
        e
    }

    /// Write the counts of throttling windows that ended (the scheduler calls this every minute), so
    /// the last refusals of a flood reach the audit trail even if no later refusal comes.
    pub async fn flush_refusals(&self) {
        let now = self.clock.now();
        for (key, w) in self.refusals.take_ended(self.limits.refusal_audit_interval_secs, now) {
            let rec = AuditRecord {
                seq: 0,
                at: now,
                correlation_id: w.correlation_id,
                principal_iss: w.principal.issuer,
                principal_sub: w.principal.subject,
                principal_user: w.principal.user,
                tool: key.tool,
                decision: decision_of(key.code).to_string(),
                code: Some(key.code.as_str().to_string()),
                idempotency_key: None,
                payment_id: None,
                approval_id: None,
                detail: Some(format!("{} (since {})", throttled_detail(&w.message, w.unrecorded), rfc3339(w.started))),
                repeats: w.unrecorded,
                policy_version: None,
                intent: None,
                tag: None,
            };
            self.append_audit(rec).await;
        }
    }
}

/// The audit decision a throttled code is recorded under.
fn decision_of(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::RateLimited => "rate_limited",
        _ => "denied",
    }
}

fn throttled_detail(message: &str, repeats: i64) -> String {
    if repeats == 1 { message.to_string() } else { format!("{repeats} refusals: {message}") }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(p: &str) -> Key {
        Key { principal: p.into(), tool: "get_balance".into(), code: ErrorCode::RateLimited }
    }
    fn window(now: UnixSecs) -> Window {
        Window {
            started: now,
            unrecorded: 0,
            principal: PrincipalRef { issuer: "iss".into(), subject: "a".into(), user: None },
            correlation_id: "corr".into(),
            message: "too many".into(),
        }
    }

    #[test]
    fn a_flood_is_one_record_per_window_and_no_refusal_is_lost() {
        let t = Throttle::default();
        let mut written = 0;
        let mut note = |now| {
            let n = t.note(key("a"), window(now), 60, now);
            written += n.write.unwrap_or(0);
            n
        };
        assert_eq!(note(100).write, Some(1), "the first is written at once");
        for i in 0..299 {
            assert_eq!(note(100 + i % 60).write, None, "the rest of the window waits");
        }
        // The next window's first refusal carries the 299 unwritten ones and itself.
        assert_eq!(note(160), Note { write: Some(300), unrecorded: 0 });
        assert_eq!(note(170), Note { write: None, unrecorded: 1 });
        // A flush after the window ended writes what is left, and forgets the window.
        let ended = t.take_ended(60, 220);
        assert_eq!(ended.len(), 1);
        written += ended[0].1.unrecorded;
        assert_eq!(written, 302, "every refusal is in some record");
        assert_eq!(t.len(), 0);
        assert!(t.take_ended(60, 1_000).is_empty());
    }

    #[test]
    fn keys_are_per_principal_tool_and_code() {
        let t = Throttle::default();
        assert_eq!(t.note(key("a"), window(0), 60, 0).write, Some(1));
        assert_eq!(t.note(key("b"), window(0), 60, 0).write, Some(1), "another principal");
        let other_tool = Key { tool: "create_payment".into(), ..key("a") };
        assert_eq!(t.note(other_tool, window(0), 60, 0).write, Some(1));
        let other_code = Key { code: ErrorCode::PrincipalSuspended, ..key("a") };
        assert_eq!(t.note(other_code, window(0), 60, 0).write, Some(1));
        assert_eq!(t.note(key("a"), window(0), 60, 0).write, None);
    }
}
