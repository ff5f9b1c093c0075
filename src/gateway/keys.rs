//! An operation's idempotency key(s): which key a call has (the operation's, or the mandate's with
//! the operation's as its alias), the records a reservation or claim writes, and the bounded wait
//! of a duplicate for the key's live holder.

use std::time::Duration;

use tokio::time::Instant;

use super::unit_of_work::Executed;
use super::{Caller, Gateway};
use crate::domain::idempotency::{NewIdempotencyRecord, Reservation};
use crate::domain::ids::OperationId;
use crate::domain::payment::Claim;
use crate::error::{AgentError, ErrorCode};
use crate::idempotency::call_fingerprint;
use crate::mandate::{MandateClaims, MandateKind};

/// How often a waiting duplicate re-reads the store (covers holders in other replicas).
const WAIT_POLL: Duration = Duration::from_millis(25);

/// The idempotency key and argument fingerprint of one call.
pub(super) struct Idem {
    pub key: String,
    pub fingerprint: String,
    /// What a different fingerprint under this key means: a reused operation_id, or (for a key
    /// anchored on a closed mandate) a second use of a single-use mandate.
    pub conflict: (ErrorCode, &'static str),
    /// For a key anchored on a closed mandate: the operation_id's own key, reserved and completed
    /// with it, so the operation cannot move money again under another mandate.
    pub alias: Option<Box<Idem>>,
    /// For a rail's payout or collection: the operation_id's key across the rails
    /// ([`crate::gateway::routing::operation_family`]), its fingerprint naming the rail's tool.
    /// Taken first, so the same operation_id cannot move money on a second rail (a retry of
    /// `send_payment` naming another `rail`, or another rail's own tool) while the other keys
    /// stay the ones every earlier version took.
    pub family: Option<Box<Idem>>,
    /// On the family's key: the operation's keys under the family's other rails' tools (a
    /// rejection of the operation on one rail, asked for under them, sticks on the other).
    pub siblings: Vec<String>,
}

impl Idem {
    /// The keys in the order they are taken: the operation's across the rails (a rail's payout
    /// or collection), the operation's own (when anchored on a mandate), then the call's.
    pub fn all(&self) -> impl Iterator<Item = &Idem> {
        self.family.as_deref().into_iter().chain(self.alias.as_deref()).chain(std::iter::once(self))
    }

    /// The operation's own key: the alias when the call's is anchored on a mandate.
    pub fn operation(&self) -> &Idem {
        self.alias.as_deref().unwrap_or(self)
    }
}

const REUSED_OPERATION: (ErrorCode, &str) =
    (ErrorCode::IdempotencyConflict, "this operation_id was already used with different arguments; nothing moved");
const REUSED_MANDATE: (ErrorCode, &str) =
    (ErrorCode::MandateInvalid, "this mandate was already used for another operation; nothing moved");
const OTHER_RAIL: (ErrorCode, &str) = (
    ErrorCode::IdempotencyConflict,
    "this operation_id was already used on another rail or with different arguments; nothing moved. Retry it \
     exactly as first called (the same tool and rail), or use a new operation_id for a new payment",
);

/// How a reservation ended.
pub(super) enum Reserved {
    Acquired,
    /// Replayed, refused or timed out; `outcome` is the stored outcome when it was a replay.
    Finished(Box<(Result<Executed, AgentError>, Option<String>)>),
}

impl Gateway {
    /// The key and fingerprint of one call. A closed mandate anchors the key on the mandate, so
    /// any retry with it replays the one payment it allows.
    pub(super) fn idem_for(
        &self,
        caller: &Caller,
        tool: &str,
        op: &OperationId,
        mandate: Option<&MandateClaims>,
        args: &serde_json::Value,
    ) -> Idem {
        let p = &caller.principal;
        // The operation's identity: the same arguments are the same operation, with or without a
        // mandate (a retry after approval is the same payment, not a new one).
        // A deliberately broken build for the evals (`--features weaken-idempotency-for-evals`):
        // every call gets a key of its own, so retries pay again. The evals must catch it.
        // (Not when another broken build is chosen at run time: each is caught on its own.)
        #[cfg(feature = "weaken-idempotency-for-evals")]
        let op = &match super::idempotency_weakened() {
            true => OperationId::parse(&format!(
                "{}.{}",
                &op.as_str()[..op.as_str().len().min(80)],
                uuid::Uuid::new_v4().simple()
            ))
            .unwrap_or_else(|_| op.clone()),
            false => op.clone(),
        };
        let operation = Idem {
            key: self.keys.key_for(&p.issuer, &p.subject, p.user.as_deref(), tool, op.as_str()),
            fingerprint: call_fingerprint(args, None),
            conflict: REUSED_OPERATION,
            alias: None,
            family: None,
            siblings: vec![],
        };
        // A family name is no tool's name, so no tool's key equals a family's.
        let family = super::routing::operation_family(tool).map(|family| {
            let canonical = crate::catalogue::canonical(tool);
            let siblings = super::routing::family_tools(family)
                .iter()
                .filter(|t| **t != canonical)
                .map(|t| self.keys.key_for(&p.issuer, &p.subject, p.user.as_deref(), t, op.as_str()))
                .collect();
            Box::new(Idem {
                key: self.keys.key_for(&p.issuer, &p.subject, p.user.as_deref(), family, op.as_str()),
                fingerprint: crate::idempotency::fingerprint(&serde_json::json!({
                    "tool": canonical,
                    "args": args,
                })),
                conflict: OTHER_RAIL,
                alias: None,
                family: None,
                siblings,
            })
        });
        match mandate {
            Some(m) if m.kind == MandateKind::Closed => Idem {
                // '/' cannot appear in an operation_id, so no operation can land on a mandate's key.
                key: self.keys.key_for(&p.issuer, &p.subject, p.user.as_deref(), tool, &format!("mandate/{}", m.jti)),
                fingerprint: call_fingerprint(args, Some(op.as_str())),
                conflict: REUSED_MANDATE,
                alias: Some(Box::new(operation)),
                family,
                siblings: vec![],
            },
            _ => Idem { family, ..operation },
        }
    }

    /// The idempotency record a reservation or claim of `idem` writes at `now`.
    fn key_record(
        &self,
        caller: &Caller,
        tool: &str,
        idem: &Idem,
        now: crate::clock::UnixSecs,
    ) -> NewIdempotencyRecord {
        NewIdempotencyRecord {
            key: idem.key.clone(),
            fingerprint: idem.fingerprint.clone(),
            tool: tool.to_string(),
            principal_iss: caller.principal.issuer.clone(),
            principal_sub: caller.principal.subject.clone(),
            lease_until: now + self.limits.idempotency_lease_secs,
            expires_at: now + self.limits.idempotency_retention_secs,
        }
    }

    /// The keys a posting transaction claims: the operation's own (when anchored on a mandate),
    /// then the payment's.
    pub(super) fn claim_for(&self, caller: &Caller, tool: &str, idem: &Idem) -> Claim {
        let now = self.clock.now();
        Claim { records: idem.all().map(|id| self.key_record(caller, tool, id, now)).collect() }
    }

    /// Reserve one key, waiting (bounded) for a live holder and replaying its outcome.
    pub(super) async fn reserve(&self, caller: &Caller, tool: &str, idem: &Idem) -> Reserved {
        let deadline = Instant::now() + self.limits.idempotency_wait;
        let mut waited = false;
        loop {
            let now = self.clock.now();
            let rec = self.key_record(caller, tool, idem, now);
            let notify = self.waiter(&idem.key);
            let notified = notify.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            match self.store.idem_reserve(rec, now).await {
                Ok(Reservation::Acquired) => return Reserved::Acquired,
                Ok(Reservation::Completed { fingerprint, .. } | Reservation::InFlight { fingerprint })
                    if fingerprint != idem.fingerprint =>
                {
                    return Reserved::Finished(Box::new((Err(self.conflict(caller, tool, idem).await), None)));
                }
                Ok(Reservation::Completed { outcome, .. }) => {
                    let result = self.replay(caller, tool, idem, &outcome).await;
                    return Reserved::Finished(Box::new((result, Some(outcome))));
                }
                Ok(Reservation::InFlight { .. }) => {
                    let left = deadline.saturating_duration_since(Instant::now());
                    if left.is_zero() {
                        let e = AgentError::new(
                            ErrorCode::OperationInProgress,
                            "the same operation is still running; retry with the same operation_id",
                        )
                        .with_retry_after(1);
                        let refused = self.refuse_as(caller, tool, idem, "in_progress", e).await;
                        return Reserved::Finished(Box::new((Err(refused), None)));
                    }
                    if !std::mem::replace(&mut waited, true) {
                        self.metrics.key_wait();
                    }
                    let _ = tokio::time::timeout(left.min(WAIT_POLL), notified).await;
                }
                Err(error) => {
                    return Reserved::Finished(Box::new((Err(self.internal(caller, tool, idem, error).await), None)));
                }
            }
        }
    }

    /// Store an outcome under each key. A failed write is logged and counted, never dropped
    /// silently: the key stays in flight, its lease ends, and a retry asks the backend again with
    /// the same key (which applies it at most once).
    pub(super) async fn complete_keys(&self, caller: &Caller, keys: &[&str], outcome_json: &str) {
        for key in keys {
            if let Err(error) = self.store.idem_complete(key, outcome_json).await {
                self.metrics.bookkeeping_failure("idempotency_complete");
                tracing::error!(correlation_id = %caller.correlation_id, %error, "idempotency completion failed");
            }
        }
    }

    /// Give keys back (nothing moved). A failed write leaves the key in flight until its lease ends.
    pub(super) async fn release_keys(&self, caller: &Caller, keys: &[&str]) {
        for key in keys {
            if let Err(error) = self.store.idem_release(key).await {
                self.metrics.bookkeeping_failure("idempotency_release");
                tracing::error!(correlation_id = %caller.correlation_id, %error, "idempotency release failed");
            }
        }
    }
}
