//! The no-progress stop rule: an (agent, user) pair that is refused the same thing for the same
//! intent `stop_rules.repeat_max` times in a row — each time under a new operation_id, so not a
//! retry of a lost answer — is suspended at once, beside the windowed count (`stop_rule.rs`).
//!
//! An intent is a money call's arguments without its operation_id (the operation key's
//! fingerprint); "the same thing" is the same tool and the same error code. A call of the pair
//! that moves money, or is refused something else, starts the row again. A retry under the same
//! operation_id (the answer was lost) neither counts nor breaks the row.
//!
//! Kept in memory per replica, bounded by [`STREAKS_MAX`] pairs: a pair that finds no room is not
//! followed by this rule (the windowed count still is), and the rows of pairs that moved on are
//! dropped.

use std::collections::HashMap;
use std::sync::Mutex;

use crate::domain::principal::PrincipalRef;
use crate::error::ErrorCode;

/// Pairs followed at once on a replica.
pub const STREAKS_MAX: usize = 100_000;

#[derive(Debug, Clone, PartialEq, Eq)]
struct Streak {
    tool: String,
    intent: String,
    code: ErrorCode,
    /// The operation key of the refusal counted last.
    key: String,
    count: u32,
}

/// A fresh refusal of a money call, as the rule sees it.
pub(super) struct Refused<'a> {
    pub tool: &'a str,
    /// The operation key's fingerprint: the arguments without the operation_id.
    pub intent: &'a str,
    /// The operation key.
    pub key: &'a str,
    pub code: ErrorCode,
}

#[derive(Default)]
pub(crate) struct Streaks {
    rows: Mutex<HashMap<String, Streak>>,
}

fn pair(who: &PrincipalRef) -> String {
    format!("{}\0{}\0{}", who.issuer, who.subject, who.user.as_deref().unwrap_or(""))
}

impl Streaks {
    /// Count a refusal; how many of the same, in a row, under distinct operations it makes.
    pub(super) fn refused(&self, who: &PrincipalRef, r: &Refused<'_>) -> u32 {
        let mut rows = self.rows.lock().unwrap_or_else(|p| p.into_inner());
        let key = pair(who);
        let same = |s: &Streak| s.tool == r.tool && s.intent == r.intent && s.code == r.code;
        let full = rows.len() >= STREAKS_MAX;
        match rows.get_mut(&key) {
            Some(s) if same(s) && s.key == r.key => s.count,
            Some(s) if same(s) => {
                s.count += 1;
                s.key = r.key.to_string();
                s.count
            }
            Some(s) => {
                *s = Streak { tool: r.tool.into(), intent: r.intent.into(), code: r.code, key: r.key.into(), count: 1 };
                1
            }
            None if full => 1,
            None => {
                let s =
                    Streak { tool: r.tool.into(), intent: r.intent.into(), code: r.code, key: r.key.into(), count: 1 };
                rows.insert(key, s);
                1
            }
        }
    }

    /// The pair moved money: its row starts again.
    pub(super) fn progressed(&self, who: &PrincipalRef) {
        self.rows.lock().unwrap_or_else(|p| p.into_inner()).remove(&pair(who));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn who(user: Option<&str>) -> PrincipalRef {
        PrincipalRef { issuer: "iss".into(), subject: "agent".into(), user: user.map(str::to_string) }
    }

    fn refusal<'a>(intent: &'a str, key: &'a str, code: ErrorCode) -> Refused<'a> {
        Refused { tool: "send_payout", intent, key, code }
    }

    #[test]
    fn the_same_refusal_under_new_operations_counts_up_and_anything_else_starts_again() {
        let s = Streaks::default();
        let denied = ErrorCode::AccountNotAllowed;
        assert_eq!(s.refused(&who(None), &refusal("i1", "k1", denied)), 1);
        // A retry of the same operation (its answer was lost) is not a new attempt.
        assert_eq!(s.refused(&who(None), &refusal("i1", "k1", denied)), 1);
        assert_eq!(s.refused(&who(None), &refusal("i1", "k2", denied)), 2);
        assert_eq!(s.refused(&who(None), &refusal("i1", "k3", denied)), 3);
        // Another user's pair is another row.
        assert_eq!(s.refused(&who(Some("u1")), &refusal("i1", "k4", denied)), 1);
        // Another intent or another code starts the row again.
        assert_eq!(s.refused(&who(None), &refusal("i2", "k5", denied)), 1);
        assert_eq!(s.refused(&who(None), &refusal("i2", "k6", ErrorCode::BudgetExceeded)), 1);
        assert_eq!(s.refused(&who(None), &refusal("i2", "k7", ErrorCode::BudgetExceeded)), 2);
        // Money moved: start again.
        s.progressed(&who(None));
        assert_eq!(s.refused(&who(None), &refusal("i2", "k8", ErrorCode::BudgetExceeded)), 1);
    }
}
