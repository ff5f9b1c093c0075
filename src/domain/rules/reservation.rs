//! The idempotency reservation decision: what a key's stored record means for a new request with
//! a given fingerprint. New (or past retention) → claim it; completed → replay; in flight with a
//! live lease, or with other arguments → in flight; in flight past its lease with the same
//! arguments → take it over (the holder crashed; the backend sees the same key and applies it at
//! most once).

use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::domain::idempotency::Reservation;

/// `idempotency_records.state` values.
pub const IN_FLIGHT: &str = "in_flight";
pub const COMPLETED: &str = "completed";

/// A key's record as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdempotencyRow {
    pub fingerprint: String,
    pub state: String,
    pub outcome: Option<String>,
    pub lease_until: UnixSecs,
    pub expires_at: UnixSecs,
}

/// What the engine does with the key.
#[derive(Debug, Clone, PartialEq)]
pub enum ReserveStep {
    /// No live record: write the new one (replacing a record past retention). `Acquired`.
    Claim,
    /// An in-flight record whose holder's lease ran out: extend the lease to ours. `Acquired`.
    TakeOver,
    /// Someone else's record decides: answer with it and write nothing.
    Found(Reservation),
}

impl ReserveStep {
    /// The reservation this step answers once written.
    pub fn reservation(self) -> Reservation {
        match self {
            ReserveStep::Claim | ReserveStep::TakeOver => Reservation::Acquired,
            ReserveStep::Found(r) => r,
        }
    }
}

pub fn decide(existing: Option<IdempotencyRow>, fingerprint: &str, now: UnixSecs) -> Result<ReserveStep, StoreError> {
    let Some(row) = existing.filter(|r| r.expires_at > now) else { return Ok(ReserveStep::Claim) };
    match (row.state.as_str(), row.outcome) {
        (COMPLETED, Some(outcome)) => {
            Ok(ReserveStep::Found(Reservation::Completed { fingerprint: row.fingerprint, outcome }))
        }
        (IN_FLIGHT, _) if row.lease_until > now || row.fingerprint != fingerprint => {
            Ok(ReserveStep::Found(Reservation::InFlight { fingerprint: row.fingerprint }))
        }
        (IN_FLIGHT, _) => Ok(ReserveStep::TakeOver),
        _ => Err(StoreError::Corrupt(format!("idempotency record in state {:?}", row.state))),
    }
}

/// A posting transaction claims its keys in order (the operation's own key, then the mandate's);
/// when key `i` already answers (`answer`), what becomes of the keys it claimed before `i`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EarlierKeys {
    /// The later key already paid for this very operation (same arguments): record that outcome
    /// under the earlier keys too, so their retries replay it.
    Complete(String),
    /// Anything else: give them back (nothing is written).
    Release,
}

pub fn on_claim_answered(answer: &Reservation, own_fingerprint: &str) -> EarlierKeys {
    match answer {
        Reservation::Completed { fingerprint, outcome } if fingerprint == own_fingerprint => {
            EarlierKeys::Complete(outcome.clone())
        }
        _ => EarlierKeys::Release,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn earlier_keys_follow_a_later_keys_answer() {
        let done = |fp: &str| Reservation::Completed { fingerprint: fp.into(), outcome: "{\"ok\":1}".into() };
        assert_eq!(on_claim_answered(&done("fp"), "fp"), EarlierKeys::Complete("{\"ok\":1}".into()));
        assert_eq!(on_claim_answered(&done("other"), "fp"), EarlierKeys::Release);
        assert_eq!(on_claim_answered(&Reservation::InFlight { fingerprint: "fp".into() }, "fp"), EarlierKeys::Release);
    }

    fn row(fingerprint: &str, state: &str, outcome: Option<&str>, lease_until: i64, expires_at: i64) -> IdempotencyRow {
        IdempotencyRow {
            fingerprint: fingerprint.into(),
            state: state.into(),
            outcome: outcome.map(str::to_string),
            lease_until,
            expires_at,
        }
    }

    #[test]
    fn decisions() {
        let in_flight = |fp: &str| ReserveStep::Found(Reservation::InFlight { fingerprint: fp.into() });
        let completed = ReserveStep::Found(Reservation::Completed { fingerprint: "fp".into(), outcome: "{}".into() });
        let cases: Vec<(Option<IdempotencyRow>, &str, i64, ReserveStep)> = vec![
            (None, "fp", 100, ReserveStep::Claim),
            // Past retention: a record of anything, even another operation's, is gone.
            (Some(row("other", COMPLETED, Some("{}"), 0, 100)), "fp", 100, ReserveStep::Claim),
            (Some(row("fp", COMPLETED, Some("{}"), 0, 101)), "fp", 100, completed.clone()),
            // Completed with other arguments is still the stored outcome: the caller compares.
            (
                Some(row("fp", COMPLETED, Some("{}"), 0, 101)),
                "other",
                100,
                ReserveStep::Found(Reservation::Completed { fingerprint: "fp".into(), outcome: "{}".into() }),
            ),
            (Some(row("fp", IN_FLIGHT, None, 101, 200)), "fp", 100, in_flight("fp")),
            // The lease ran out: the same arguments take over, others wait.
            (Some(row("fp", IN_FLIGHT, None, 100, 200)), "fp", 100, ReserveStep::TakeOver),
            (Some(row("fp", IN_FLIGHT, None, 100, 200)), "other", 100, in_flight("fp")),
        ];
        for (existing, fp, now, want) in cases {
            assert_eq!(decide(existing.clone(), fp, now).unwrap(), want, "{existing:?} {fp} {now}");
        }
        assert_eq!(ReserveStep::Claim.reservation(), Reservation::Acquired);
        assert_eq!(ReserveStep::TakeOver.reservation(), Reservation::Acquired);
    }

    #[test]
    fn an_unknown_state_is_corrupt() {
        for r in [row("fp", "weird", None, 0, 200), row("fp", COMPLETED, None, 0, 200)] {
            let err = decide(Some(r), "fp", 100).unwrap_err();
            assert!(matches!(err, StoreError::Corrupt(_)), "{err}");
        }
    }
}
