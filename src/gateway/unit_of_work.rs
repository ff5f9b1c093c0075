//! Exactly-once as one unit of work. Every money-moving operation hands it one [`Intent`] (the
//! tool, the key(s) and fingerprint, the amount, what a human would be shown) with the policy's
//! decision and its [`Movement`] (the one backend or rail call); the unit of work does the rest:
//!
//! 1. peek: an outcome already recorded under the key wins over everything, policy included (a
//!    call policy allows under `ClaimInPosting` leaves it to the posting's claim where the store
//!    says that is cheap, `Engine::claim_is_cheap`: the claim answers the same in its one write);
//! 2. policy: a denial is audited and counted, an approval is asked for;
//! 3. the keys and the money, by the backend's [`Strategy`] (chosen once per backend): claimed
//!    inside the ledger's posting transaction, or reserved → called → settled;
//! 4. the answer: settled by `exactly_once::settle` (the key fates of `domain::rules::fate`).

use std::future::Future;
use std::pin::Pin;

use async_trait::async_trait;
use tracing::Instrument as _;

use super::exactly_once::{self, Fate};
use super::keys::{Idem, Reserved};
use super::{Caller, Decision, Gateway};
use crate::domain::audit::AuditRecord;
use crate::domain::error::{BackendError, StoreError};
use crate::domain::idempotency::Reservation;
use crate::domain::ids::PaymentId;
use crate::domain::money::Money;
use crate::domain::payment::{Attempt, Guards, Payment, PaymentStatus};
use crate::domain::policy::Decision as Policy;
use crate::error::{AgentError, ErrorCode};
use crate::idempotency::StoredOutcome;

/// A payment and whether this call replayed an earlier outcome.
#[derive(Debug, Clone)]
pub struct Executed {
    pub payment: Payment,
    pub replayed: bool,
}

/// How a backend takes part in exactly-once: decided once per backend, never per call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    /// The embedded ledger: its posting transaction claims the key(s), posts, completes them and
    /// appends the "allowed" record: one write. (A key held by a reserver falls back to reserving,
    /// and the posting transaction still records the success.)
    ClaimInPosting,
    /// An external ledger or a rail: reserve the key(s), call, then complete or release them.
    ReserveCallSettle,
}

/// What one money-moving call asks for, built once by its operation.
pub(super) struct Intent {
    pub tool: &'static str,
    /// The key(s) and fingerprint the operation is known by.
    pub keys: Idem,
    pub amount: Money,
    /// What a human sees when it needs approval (a closed mandate pins it whole).
    pub shown: serde_json::Value,
}

type Answer<'a> = Pin<Box<dyn Future<Output = Result<Payment, BackendError>> + Send + 'a>>;
/// The operation's one call to its backend or rail, under an [`Attempt`]'s keys.
pub(super) type Movement<'a> = Box<dyn Fn(Attempt) -> Answer<'a> + Send + Sync + 'a>;

/// Build a [`Movement`] from an async closure's shape.
pub(super) fn movement<'a, F, Fut>(f: F) -> Movement<'a>
where
    F: Fn(Attempt) -> Fut + Send + Sync + 'a,
    Fut: Future<Output = Result<Payment, BackendError>> + Send + 'a,
{
    Box::new(move |attempt| Box::pin(f(attempt)))
}

/// What an operation hands the unit of work: how its keys are kept, the intent, policy's
/// decision, and its one call.
pub(super) struct Work<'a> {
    pub strategy: Strategy,
    pub intent: Intent,
    pub decision: Policy,
    /// What the payment draws on where it commits (a preflight checks them without drawing).
    pub guards: Guards,
    pub movement: Movement<'a>,
}

/// The seam the operations call; the real one is [`ExactlyOnce`], unit tests put a fake here.
#[async_trait]
pub(super) trait UnitOfWork: Send + Sync {
    async fn run(&self, gateway: &Gateway, caller: &Caller, work: Work<'_>) -> Result<Executed, AgentError>;
}

/// The unit of work the gateway runs: peek → policy → keys and money → settle.
pub(super) struct ExactlyOnce;

#[async_trait]
impl UnitOfWork for ExactlyOnce {
    async fn run(&self, gw: &Gateway, caller: &Caller, work: Work<'_>) -> Result<Executed, AgentError> {
        let Work { strategy, intent, decision, guards, movement } = work;
        let Intent { tool, keys: idem, amount, shown } = intent;
        // 1. An outcome already recorded under the operation's key (or the mandate's) wins over
        //    everything, policy included: a retry must never be judged as a new payment. A call
        //    policy allows under `ClaimInPosting` skips this read where the store's claim is cheap:
        //    the posting transaction's claim answers the same (`KeyHeld`: replay, conflict, or wait)
        //    in the write it makes anyway.
        let claim_decides = matches!(decision, Policy::Allow)
            && strategy == Strategy::ClaimInPosting
            && gw.store.claim_is_cheap()
            && !caller.dry();
        let now = gw.clock.now();
        for id in idem.all().filter(|_| !claim_decides) {
            match gw.store.idem_peek(&id.key, now).await {
                Ok(Some((fp, _))) if fp != id.fingerprint => return Err(gw.conflict(caller, tool, id).await),
                Ok(Some((_, Some(outcome)))) => return gw.replay(caller, tool, id, &outcome).await,
                Ok(_) => {}
                Err(error) => return Err(gw.internal(caller, tool, id, error).await),
            }
        }
        // 2. Policy. Its span covers the decision and what it writes (a refusal, an approval).
        let policy = tracing::debug_span!(
            "policy",
            correlation_id = %caller.correlation_id,
            tool,
            decision = match &decision {
                Policy::Allow => "allow",
                Policy::Deny(_) => "deny",
                Policy::RequireApproval { .. } => "approval_required",
            },
            code = tracing::field::Empty,
        );
        match decision {
            Policy::Allow if caller.dry() => {
                // A preflight stops here: the guards checked as they stand, nothing drawn or moved.
                drop(policy);
                return gw.preflight_guards(caller, &guards, amount).await;
            }
            Policy::Allow => drop(policy),
            Policy::Deny(refusal) => {
                let e = AgentError::from(refusal);
                policy.record("code", e.code.as_str());
                let e = gw.refuse(caller, tool, Some(&idem.key), e).instrument(policy).await;
                gw.enforce_no_progress(caller, tool, &idem, e.code).await;
                return Err(e);
            }
            Policy::RequireApproval { reason } => {
                let asked = gw.require_approval(caller, tool, idem.operation(), amount, shown, reason);
                return Err(asked.instrument(policy).await);
            }
        }
        // 3.-4. The keys, the money, the outcome, exactly once.
        let unit = tracing::debug_span!(
            "unit_of_work",
            correlation_id = %caller.correlation_id,
            tool,
            in_tx = strategy == Strategy::ClaimInPosting,
        );
        gw.move_money(caller, tool, strategy, idem, movement).instrument(unit).await
    }
}

/// Where a call's keys stand when the backend answers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum KeyState {
    /// Reserved before the call; the gateway completes or releases them.
    Reserved,
    /// Reserved before the call; the backend completes them with a success in its transaction.
    ReservedRecordedInTx,
    /// Claimed by the posting transaction, which also completed or gave them back.
    Claimed,
}

impl Gateway {
    /// The strategy of the payment backend (`create_payment`, `refund_payment`).
    pub(super) fn ledger_strategy(&self) -> Strategy {
        if self.backend.records_in_transaction() { Strategy::ClaimInPosting } else { Strategy::ReserveCallSettle }
    }

    /// Steps 3 and 4, past the policy: claim or reserve the keys, call the backend (its own
    /// span), settle the outcome.
    async fn move_money(
        &self,
        caller: &Caller,
        tool: &'static str,
        strategy: Strategy,
        idem: Idem,
        movement: Movement<'_>,
    ) -> Result<Executed, AgentError> {
        let backend_span = || {
            tracing::debug_span!(
                "backend",
                correlation_id = %caller.correlation_id,
                tool,
                backend = self.backend.name(),
                otel.kind = "client",
            )
        };
        let alias_key = || idem.alias.as_ref().map(|a| a.key.clone());
        let family_key = || idem.family.as_ref().map(|f| f.key.clone());
        // 3. The ledger's posting transaction claims the keys: claim, posting, completion and
        //    audit are one write. Others reserve the operation's key, then the mandate's, first;
        //    duplicates wait and replay.
        if strategy == Strategy::ClaimInPosting {
            let payment_id = PaymentId::generate();
            let attempt = Attempt {
                key: idem.key.clone(),
                alias_key: alias_key(),
                family_key: family_key(),
                audit: Some(self.opening_audit(caller, tool, &idem, &payment_id, "allowed")),
                payment_id,
                claim: Some(self.claim_for(caller, tool, &idem)),
            };
            let started = std::time::Instant::now();
            let result = movement(attempt).instrument(backend_span()).await;
            self.metrics.ledger(started.elapsed());
            match result {
                Err(BackendError::KeyHeld { key, reservation }) => {
                    match (idem.all().find(|i| i.key == key), reservation) {
                        (
                            Some(id),
                            Reservation::Completed { fingerprint, .. } | Reservation::InFlight { fingerprint },
                        ) if fingerprint != id.fingerprint => {
                            return Err(self.conflict(caller, tool, id).await);
                        }
                        (Some(id), Reservation::Completed { outcome, .. }) => {
                            return self.replay(caller, tool, id, &outcome).await;
                        }
                        // Held by an attempt that reserved it the other way (a replica on an older
                        // version, or one whose lease is still live): wait for it below.
                        _ => {}
                    }
                }
                result => return self.settle_call(caller, tool, &idem, KeyState::Claimed, result).await,
            }
        }
        let taken: Vec<&Idem> = idem.all().collect();
        for (i, id) in taken.iter().enumerate() {
            if let Reserved::Finished(done) = self.reserve(caller, tool, id).await {
                let (result, outcome) = *done;
                // A later key (the mandate's) already paid for this very operation: record that
                // under the keys taken before it too; anything else gives them back, leaving the
                // operation free to try again.
                let earlier: Vec<&str> = taken[..i].iter().map(|k| k.key.as_str()).collect();
                match outcome.as_deref() {
                    Some(o) => self.complete_keys(caller, &earlier, o).await,
                    None => self.release_keys(caller, &earlier).await,
                }
                for key in earlier {
                    self.wake(key);
                }
                return result;
            }
        }
        // 4. Move the money. The key travels to the backend, which applies it at most once. A
        //    posting transaction completes the key(s) and appends the "allowed" record itself; a
        //    rail or an external ledger opens its record with the "submitted" one before it sends
        //    anything (no money moves that the trail does not name), and the outcome's record
        //    follows the answer.
        let in_tx = strategy == Strategy::ClaimInPosting;
        let payment_id = PaymentId::generate();
        let opening = if in_tx { "allowed" } else { "submitted" };
        let attempt = Attempt {
            key: idem.key.clone(),
            alias_key: alias_key(),
            family_key: family_key(),
            audit: Some(self.opening_audit(caller, tool, &idem, &payment_id, opening)),
            payment_id,
            claim: None,
        };
        let started = std::time::Instant::now();
        let result = movement(attempt).instrument(backend_span()).await;
        self.metrics.ledger(started.elapsed());
        let keys = if in_tx { KeyState::ReservedRecordedInTx } else { KeyState::Reserved };
        self.settle_call(caller, tool, &idem, keys, result).await
    }

    /// The record the attempt's first write appends, naming the payment it makes (tagged here,
    /// the payment id included: the store adds nothing): "allowed" in a posting transaction,
    /// "submitted" where a rail's or external ledger's record opens before it is sent.
    fn opening_audit(
        &self,
        caller: &Caller,
        tool: &str,
        idem: &Idem,
        payment: &PaymentId,
        decision: &str,
    ) -> AuditRecord {
        let mut d = Decision::new(tool, decision);
        d.idempotency_key = Some(&idem.key);
        d.payment_id = Some(payment.as_str());
        self.tag_audit(self.agent_audit_record(caller, d))
    }

    /// What the backend's answer means for the keys, the audit trail and the agent.
    async fn settle_call(
        &self,
        caller: &Caller,
        tool: &str,
        idem: &Idem,
        how: KeyState,
        result: Result<Payment, BackendError>,
    ) -> Result<Executed, AgentError> {
        let keys: Vec<&str> = idem.all().map(|i| i.key.as_str()).collect();
        if let Err(BackendError::Unavailable(detail) | BackendError::OutcomeUnknown(detail)) = &result {
            tracing::warn!(correlation_id = %caller.correlation_id, %detail, "backend did not move money or did not say");
        }
        let settled = exactly_once::settle(result, how != KeyState::Reserved);
        match settled.fate {
            Fate::Recorded => self.metrics.decision(tool, settled.decision, None),
            // The posting transaction completed or gave back the keys it claimed itself.
            Fate::Complete(_) | Fate::Release if how == KeyState::Claimed => {}
            Fate::Complete(outcome) => {
                self.complete_keys(caller, &keys, &outcome.to_json()).await;
                if settled.result.is_ok() {
                    // The gateway's own "allowed" record (the backend did not write it).
                    let mut d = Decision::new(tool, settled.decision);
                    d.idempotency_key = Some(&idem.key);
                    d.payment_id = settled.result.as_ref().ok().map(|p| p.id.as_str());
                    self.audit(caller, d).await;
                }
            }
            Fate::Release => self.release_keys(caller, &keys).await,
            Fate::KeepInFlight => {}
        }
        let outcome = match settled.result {
            Ok(payment) => {
                self.streaks.progressed(&caller.principal.principal_ref());
                Ok(Executed { payment, replayed: false })
            }
            Err(e) => Err(self.refuse_as(caller, tool, idem, settled.decision, e).await),
        };
        for key in keys {
            self.wake(key);
        }
        outcome
    }

    /// A key answering with other arguments: a reused operation_id, or a mandate used twice.
    pub(super) async fn conflict(&self, caller: &Caller, tool: &str, idem: &Idem) -> AgentError {
        let (code, message) = idem.conflict;
        let decision = if code == ErrorCode::IdempotencyConflict { "conflict" } else { "denied" };
        self.refuse_as(caller, tool, idem, decision, AgentError::new(code, message)).await
    }

    pub(super) async fn internal(&self, caller: &Caller, tool: &str, idem: &Idem, error: StoreError) -> AgentError {
        tracing::error!(correlation_id = %caller.correlation_id, %error, "store failure");
        self.refuse_as(caller, tool, idem, "error", AgentError::internal()).await
    }

    /// The outcome stored under `idem`, replayed (a rail payment where it stands now).
    pub(super) async fn replay(
        &self,
        caller: &Caller,
        tool: &str,
        idem: &Idem,
        outcome: &str,
    ) -> Result<Executed, AgentError> {
        self.wake(&idem.key);
        let Some(stored) = StoredOutcome::from_json(outcome) else {
            tracing::error!(correlation_id = %caller.correlation_id, "unreadable stored outcome");
            return Err(AgentError::internal());
        };
        let mut result = stored.into_result();
        if let Ok(p) = &mut result
            && p.status == PaymentStatus::Pending
            && let Ok(Some(rec)) = self.store.rail_get(&p.id).await
        {
            // A rail payment settles after the call that made it: replay where it stands now.
            p.status = rec.state.status();
        }
        let mut d = Decision::new(tool, "replayed");
        d.idempotency_key = Some(&idem.key);
        d.payment_id = result.as_ref().ok().map(|p| p.id.as_str());
        d.code = result.as_ref().err().map(|e| e.code);
        self.audit(caller, d).await;
        result.map(|payment| Executed { payment, replayed: true }).map_err(|e| e.with_detail("replayed", true))
    }
}

#[cfg(test)]
#[path = "unit_of_work_tests.rs"]
mod tests;
