//! Unit tests of the exactly-once unit of work: the real `ExactlyOnce` over an in-memory SQLite
//! store and the embedded ledger (`testkit::gateway`). Most drive it directly with a fake
//! [`Movement`] that counts its calls and answers as a backend would, so each test controls what
//! the backend (or the posting transaction's claim) says and sees what is left under the key.
#![allow(clippy::unwrap_used)]
use std::sync::{Arc, Mutex};

use serde_json::json;

use super::super::keys::Idem;
use super::super::testkit::{NOW, caller, gateway, kes};
use super::*;
use crate::catalogue::scopes;
use crate::domain::idempotency::NewIdempotencyRecord;
use crate::domain::ids::{AccountId, OperationId, PaymentId};
use crate::domain::payment::PaymentKind;
use crate::domain::policy::Refusal;
use crate::domain::rail::{RailFlow, RailMove, RailPayment, RailState, RailUpdate};
use crate::gateway::create_payment::CreatePayment;

const TOOL: &str = "create_payment";

fn pay(op: &str, amount: &str) -> CreatePayment {
    CreatePayment {
        operation_id: op.into(),
        from_account: "acct-A".into(),
        to_account: "acct-B".into(),
        amount: amount.into(),
        currency: "KES".into(),
        memo: None,
        mandate: None,
    }
}

fn payment(status: PaymentStatus) -> Payment {
    Payment {
        id: PaymentId::generate(),
        kind: PaymentKind::Payment,
        status,
        from_account: AccountId::parse("acct-A").unwrap(),
        to_account: AccountId::parse("acct-B").unwrap(),
        amount_minor: 5000,
        currency: kes(),
        refunded_minor: 0,
        refund_of: None,
        memo: None,
        principal_sub: "agent".into(),
        principal_user: None,
        created_at: NOW,
    }
}

fn succeeded(p: &Payment) -> String {
    StoredOutcome::Succeeded { payment: p.clone() }.to_json()
}

/// The key and fingerprint of operation `op` with arguments `args` (another `args`: the same
/// operation_id reused with other arguments).
fn idem(gw: &Gateway, c: &Caller, op: &str, args: &str) -> Idem {
    gw.idem_for(c, TOOL, &OperationId::parse(op).unwrap(), None, &json!({ "args": args }))
}

/// The attempts a fake backend was handed, one per call.
type Seen = Arc<Mutex<Vec<Attempt>>>;

fn calls(seen: &Seen) -> usize {
    seen.lock().unwrap().len()
}

/// A backend that keeps every attempt it is handed and answers with `f`.
fn backend<F, Fut>(f: F) -> (Movement<'static>, Seen)
where
    F: Fn(Attempt) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Result<Payment, BackendError>> + Send + 'static,
{
    let seen = Seen::default();
    let kept = seen.clone();
    (
        movement(move |a: Attempt| {
            kept.lock().unwrap().push(a.clone());
            f(a)
        }),
        seen,
    )
}

/// A backend that answers every call with `answer`.
fn answering(answer: Result<Payment, BackendError>) -> (Movement<'static>, Seen) {
    backend(move |_| std::future::ready(answer.clone()))
}

/// What a posting transaction's claim answers when it finds `key` already taken.
fn held(key: &str, reservation: Reservation) -> BackendError {
    BackendError::KeyHeld { key: key.into(), reservation }
}

async fn run(
    gw: &Gateway,
    c: &Caller,
    strategy: Strategy,
    decision: Policy,
    keys: Idem,
    movement: Movement<'_>,
) -> Result<Executed, AgentError> {
    let intent = Intent { tool: TOOL, keys, amount: Money::parse("50.00", kes()).unwrap(), shown: json!({}) };
    let work = Work { strategy, intent, decision, guards: Guards::default(), movement };
    ExactlyOnce.run(gw, c, work).await
}

fn deny() -> Policy {
    Policy::Deny(Refusal::Invalid("not today"))
}

/// Another attempt's record under `key`: in flight (its lease live), or completed with `outcome`.
async fn hold(gw: &Gateway, key: &str, fingerprint: &str, outcome: Option<&str>) {
    let rec = NewIdempotencyRecord {
        key: key.into(),
        fingerprint: fingerprint.into(),
        tool: TOOL.into(),
        principal_iss: "iss".into(),
        principal_sub: "agent".into(),
        lease_until: NOW + 30,
        expires_at: NOW + 86_400,
    };
    assert_eq!(gw.store.idem_reserve(rec, NOW).await.unwrap(), Reservation::Acquired);
    if let Some(outcome) = outcome {
        gw.store.idem_complete(key, outcome).await.unwrap();
    }
}

/// What is left under `key`: (fingerprint, outcome or `None` while in flight), or nothing.
async fn peek(gw: &Gateway, key: &str) -> Option<(String, Option<String>)> {
    gw.store.idem_peek(key, NOW).await.unwrap()
}

/// The audit trail, oldest first: (decision, code, payment id).
async fn audited(gw: &Gateway) -> Vec<(String, Option<String>, Option<String>)> {
    let mut records = gw.store.audit_list(None, 100).await.unwrap();
    records.reverse();
    records.into_iter().map(|r| (r.decision, r.code, r.payment_id)).collect()
}

/// An outcome recorded under the operation's key wins over policy: after the agent's limit was
/// lowered, its retry of a payment already made replays it (no approval asked, nothing paid
/// again), while a new operation for the same amount now needs a human.
#[tokio::test]
async fn a_recorded_outcome_wins_over_todays_policy() {
    let gw = gateway().await;
    let paid = gw.create_payment(&caller(&[scopes::CREATE]), pay("op-1", "50.00")).await.unwrap();
    assert!(!paid.replayed);
    let mut lowered = caller(&[scopes::CREATE]);
    let mut profile = (*lowered.principal.profile).clone();
    profile.autonomous_limit_minor.insert(kes(), 1_000);
    lowered.principal.profile = Arc::new(profile);
    let again = gw.create_payment(&lowered, pay("op-1", "50.00")).await.unwrap();
    assert_eq!((again.replayed, &again.payment.id), (true, &paid.payment.id));
    let new = gw.create_payment(&lowered, pay("op-2", "50.00")).await.unwrap_err();
    assert_eq!(new.code, ErrorCode::ApprovalRequired);
}

/// A denied retry of an operation already made replays it too, whatever the strategy: the
/// backend is not called and no denial is recorded.
#[tokio::test]
async fn a_denied_retry_of_a_recorded_outcome_replays_it() {
    for strategy in [Strategy::ClaimInPosting, Strategy::ReserveCallSettle] {
        let gw = gateway().await;
        let c = caller(&[scopes::CREATE]);
        let earlier = payment(PaymentStatus::Succeeded);
        let id = idem(&gw, &c, "op-1", "a");
        hold(&gw, &id.key, &id.fingerprint, Some(&succeeded(&earlier))).await;
        let (m, seen) = answering(Ok(payment(PaymentStatus::Succeeded)));
        let again = run(&gw, &c, strategy, deny(), idem(&gw, &c, "op-1", "a"), m).await.unwrap();
        assert_eq!((again.replayed, &again.payment.id), (true, &earlier.id), "{strategy:?}");
        assert_eq!(calls(&seen), 0, "{strategy:?}");
        let decisions: Vec<String> = audited(&gw).await.into_iter().map(|a| a.0).collect();
        assert_eq!(decisions, ["replayed"], "{strategy:?}");
    }
}

/// The same operation_id with other arguments is a conflict, found before policy and before any
/// backend call, whether the key's holder finished (its outcome is never handed to this call) or
/// is still running; it is audited as a conflict and the holder's record is left as it was.
#[tokio::test]
async fn other_arguments_under_a_held_key_are_a_conflict_before_policy() {
    let theirs = payment(PaymentStatus::Succeeded);
    for outcome in [Some(succeeded(&theirs)), None] {
        let gw = gateway().await;
        let c = caller(&[scopes::CREATE]);
        let other = idem(&gw, &c, "op-1", "other");
        hold(&gw, &other.key, &other.fingerprint, outcome.as_deref()).await;
        let (m, seen) = answering(Ok(payment(PaymentStatus::Succeeded)));
        let e = run(&gw, &c, Strategy::ReserveCallSettle, deny(), idem(&gw, &c, "op-1", "a"), m).await.unwrap_err();
        assert_eq!(e.code, ErrorCode::IdempotencyConflict, "{outcome:?}");
        assert_eq!(calls(&seen), 0);
        let conflict = ("conflict".to_string(), Some("IDEMPOTENCY_CONFLICT".to_string()), None);
        assert_eq!(audited(&gw).await, [conflict], "{outcome:?}");
        assert_eq!(peek(&gw, &other.key).await, Some((other.fingerprint.clone(), outcome.clone())));
    }
}

/// A preflight (`check_payment_policy`) that policy allows stops before the money: the backend
/// is never called, nothing is written under the key or audited, and it says "allowed"; for an
/// operation already made it says "replay".
#[tokio::test]
async fn a_preflight_never_moves_money_and_sees_a_recorded_outcome() {
    for strategy in [Strategy::ClaimInPosting, Strategy::ReserveCallSettle] {
        let gw = gateway().await;
        let c = caller(&[scopes::CREATE]);
        let dry = gw.preflight_caller(&c);
        let (m, seen) = answering(Ok(payment(PaymentStatus::Succeeded)));
        let outcome = run(&gw, &dry, strategy, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await;
        let view = gw.preflight_answer(&c, &dry, TOOL, outcome).await.unwrap();
        assert_eq!((view.verdict.as_str(), calls(&seen)), ("allowed", 0), "{strategy:?}");
        let id = idem(&gw, &c, "op-1", "a");
        assert_eq!(peek(&gw, &id.key).await, None, "{strategy:?}");
        assert!(audited(&gw).await.is_empty(), "{strategy:?}");

        hold(&gw, &id.key, &id.fingerprint, Some(&succeeded(&payment(PaymentStatus::Succeeded)))).await;
        let dry = gw.preflight_caller(&c);
        let (m, seen) = answering(Ok(payment(PaymentStatus::Succeeded)));
        let outcome = run(&gw, &dry, strategy, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await;
        let view = gw.preflight_answer(&c, &dry, TOOL, outcome).await.unwrap();
        assert_eq!((view.verdict.as_str(), calls(&seen)), ("replay", 0), "{strategy:?}");
    }
}

/// Under `ClaimInPosting` on a store whose claim is cheap, a call policy allows is not preceded
/// by a read of its key: the posting transaction's claim is that read. Its one call carries the
/// claim of the key and the "allowed" record, and the claim's answer (the key completed by an
/// earlier attempt with the same arguments) is replayed.
#[tokio::test]
async fn an_allowed_call_in_posting_leaves_the_key_to_the_postings_claim() {
    let gw = gateway().await;
    let c = caller(&[scopes::CREATE]);
    let id = idem(&gw, &c, "op-1", "a");
    let earlier = payment(PaymentStatus::Succeeded);
    hold(&gw, &id.key, &id.fingerprint, Some(&succeeded(&earlier))).await;
    let completed = Reservation::Completed { fingerprint: id.fingerprint.clone(), outcome: succeeded(&earlier) };
    let (m, seen) = answering(Err(held(&id.key, completed)));
    let again = run(&gw, &c, Strategy::ClaimInPosting, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await.unwrap();
    assert_eq!((again.replayed, &again.payment.id), (true, &earlier.id));
    let attempts = seen.lock().unwrap().clone();
    assert_eq!(attempts.len(), 1, "one call: the claim");
    let claim = attempts[0].claim.as_ref().expect("the posting transaction claims the key");
    let claimed: Vec<&str> = claim.records.iter().map(|r| r.key.as_str()).collect();
    assert_eq!((claimed, claim.records[0].fingerprint.as_str()), (vec![id.key.as_str()], id.fingerprint.as_str()));
    assert_eq!(attempts[0].audit.as_ref().map(|a| a.decision.as_str()), Some("allowed"));
}

/// The posting's "allowed" record names the payment its attempt makes, and its writer's tag binds
/// that id (so a database writer moving it to another payment breaks the tag); a new attempt
/// draws a new id.
#[tokio::test]
async fn the_allowed_record_names_the_attempts_payment_under_its_tag() {
    let gw = gateway().await;
    let c = caller(&[scopes::CREATE]);
    let (m, seen) = backend(|a: Attempt| {
        std::future::ready(Ok(Payment { id: a.payment_id.clone(), ..payment(PaymentStatus::Succeeded) }))
    });
    let paid = run(&gw, &c, Strategy::ClaimInPosting, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await.unwrap();
    let (m, _) =
        backend(|a: Attempt| std::future::ready(Ok(Payment { id: a.payment_id, ..payment(PaymentStatus::Succeeded) })));
    let other = run(&gw, &c, Strategy::ClaimInPosting, Policy::Allow, idem(&gw, &c, "op-2", "a"), m).await.unwrap();
    assert_ne!(paid.payment.id, other.payment.id);
    let attempt = seen.lock().unwrap()[0].clone();
    let record = attempt.audit.expect("the posting appends the allowed record");
    assert_eq!(record.payment_id.as_deref(), Some(paid.payment.id.as_str()));
    assert_eq!(crate::domain::audit_chain::tag_fault(&gw.audit_link_key, &record, true), None);
    let moved = AuditRecord { payment_id: Some(other.payment.id.to_string()), ..record };
    assert!(crate::domain::audit_chain::tag_fault(&gw.audit_link_key, &moved, true).is_some());
}

/// The claim's answer is what decides, not a second read: a claim that found the earlier
/// outcome replays it even when the record is gone right after (retention purged it), and
/// nothing is paid again.
#[tokio::test]
async fn the_claims_replay_is_final_even_if_the_record_is_purged_after_it() {
    let gw = gateway().await;
    let c = caller(&[scopes::CREATE]);
    let id = idem(&gw, &c, "op-1", "a");
    let earlier = payment(PaymentStatus::Succeeded);
    hold(&gw, &id.key, &id.fingerprint, Some(&succeeded(&earlier))).await;
    let store = gw.store.clone();
    let (key, fingerprint, outcome) = (id.key.clone(), id.fingerprint.clone(), succeeded(&earlier));
    let (m, seen) = backend(move |a: Attempt| {
        let (store, key, fingerprint, outcome) = (store.clone(), key.clone(), fingerprint.clone(), outcome.clone());
        async move {
            if a.claim.is_none() {
                return Ok(payment(PaymentStatus::Succeeded)); // paid again
            }
            store.idem_purge(NOW + 86_400).await.unwrap();
            Err(held(&key, Reservation::Completed { fingerprint, outcome }))
        }
    });
    let again = run(&gw, &c, Strategy::ClaimInPosting, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await.unwrap();
    assert_eq!((again.replayed, &again.payment.id), (true, &earlier.id));
    assert_eq!(calls(&seen), 1);
    assert_eq!(peek(&gw, &id.key).await, None, "nothing reserved or paid under the key again");
}

/// A claim that finds the key taken with other arguments is a conflict (never a replay of the
/// other call's outcome), audited as one; the holder's record is left as it was.
#[tokio::test]
async fn a_claim_finding_other_arguments_is_a_conflict() {
    let gw = gateway().await;
    let c = caller(&[scopes::CREATE]);
    let other = idem(&gw, &c, "op-1", "other");
    let theirs = succeeded(&payment(PaymentStatus::Succeeded));
    hold(&gw, &other.key, &other.fingerprint, Some(&theirs)).await;
    let completed = Reservation::Completed { fingerprint: other.fingerprint.clone(), outcome: theirs.clone() };
    let (m, seen) = answering(Err(held(&other.key, completed)));
    let e = run(&gw, &c, Strategy::ClaimInPosting, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await.unwrap_err();
    assert_eq!((e.code, calls(&seen)), (ErrorCode::IdempotencyConflict, 1));
    let decisions: Vec<String> = audited(&gw).await.into_iter().map(|a| a.0).collect();
    assert_eq!(decisions, ["conflict"]);
    assert_eq!(peek(&gw, &other.key).await, Some((other.fingerprint, Some(theirs))));
}

/// A claim that finds the same operation still running elsewhere waits for it (bounded) and,
/// the holder not finishing, answers OPERATION_IN_PROGRESS: not a conflict, the backend not
/// called again, the holder's key left in flight.
#[tokio::test]
async fn a_claim_finding_the_same_operation_in_flight_waits_for_it() {
    let gw = gateway().await;
    let c = caller(&[scopes::CREATE]);
    let id = idem(&gw, &c, "op-1", "a");
    hold(&gw, &id.key, &id.fingerprint, None).await;
    let (m, seen) = answering(Err(held(&id.key, Reservation::InFlight { fingerprint: id.fingerprint.clone() })));
    let e = run(&gw, &c, Strategy::ClaimInPosting, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await.unwrap_err();
    assert_eq!((e.code, e.retry_after_seconds, calls(&seen)), (ErrorCode::OperationInProgress, Some(1), 1));
    assert_eq!(peek(&gw, &id.key).await, Some((id.fingerprint, None)));
}

/// `ReserveCallSettle`: the key is reserved (in flight) before the one call, which carries no
/// claim, only the "submitted" record its record opens with; the gateway then completes the key
/// with the payment and writes the "allowed" record itself, and a retry replays it without calling
/// again.
#[tokio::test]
async fn reserve_call_settle_reserves_then_completes_the_key_with_the_payment() {
    let gw = gateway().await;
    let c = caller(&[scopes::CREATE]);
    let id = idem(&gw, &c, "op-1", "a");
    let paid = payment(PaymentStatus::Succeeded);
    let during = Arc::new(Mutex::new(None));
    let (store, seen_during, answer) = (gw.store.clone(), during.clone(), paid.clone());
    let (m, seen) = backend(move |a: Attempt| {
        let (store, seen_during, answer) = (store.clone(), seen_during.clone(), answer.clone());
        async move {
            *seen_during.lock().unwrap() = store.idem_peek(&a.key, NOW).await.unwrap();
            Ok(answer)
        }
    });
    let done = run(&gw, &c, Strategy::ReserveCallSettle, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await.unwrap();
    assert_eq!((done.replayed, &done.payment.id), (false, &paid.id));
    let attempt = seen.lock().unwrap()[0].clone();
    assert_eq!(attempt.key, id.key);
    assert!(attempt.claim.is_none(), "{attempt:?}");
    // The "submitted" record the rail's or ledger's record opens with, naming the attempt's payment.
    let submitted = attempt.audit.as_ref().expect("the opening record travels with the attempt");
    assert_eq!(submitted.decision, "submitted");
    assert_eq!(submitted.payment_id.as_deref(), Some(attempt.payment_id.as_str()));
    assert_eq!(*during.lock().unwrap(), Some((id.fingerprint.clone(), None)), "reserved before the call");
    assert_eq!(peek(&gw, &id.key).await, Some((id.fingerprint.clone(), Some(succeeded(&paid)))));
    assert_eq!(audited(&gw).await, [("allowed".to_string(), None, Some(paid.id.as_str().to_string()))]);

    let (m, again) = answering(Ok(payment(PaymentStatus::Succeeded)));
    let retry = run(&gw, &c, Strategy::ReserveCallSettle, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await.unwrap();
    assert_eq!((retry.replayed, &retry.payment.id, calls(&again)), (true, &paid.id, 0));
}

/// `ReserveCallSettle`: a refusal leaves the key as its fate says. A refusal for good is stored
/// and replayed to a retry (the backend not called again); "unavailable" gives the key back (a
/// retry calls again); "outcome unknown" keeps it in flight (maybe moved).
#[tokio::test]
async fn reserve_call_settle_keeps_or_gives_back_the_key_by_the_refusals_fate() {
    let acct = AccountId::parse("acct-A").unwrap();
    let funds = BackendError::InsufficientFunds { account: acct, balance: "1".into(), needed: "50".into() };
    let cases = [
        (funds, ErrorCode::InsufficientFunds, "completed"),
        (BackendError::Unavailable("down".into()), ErrorCode::BackendUnavailable, "released"),
        (BackendError::OutcomeUnknown("timeout".into()), ErrorCode::OutcomeUnknown, "in_flight"),
    ];
    for (error, code, left) in cases {
        let gw = gateway().await;
        let c = caller(&[scopes::CREATE]);
        let id = idem(&gw, &c, "op-1", "a");
        let (m, seen) = answering(Err(error.clone()));
        let e = run(&gw, &c, Strategy::ReserveCallSettle, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await;
        assert_eq!((e.unwrap_err().code, calls(&seen)), (code, 1), "{error:?}");
        let under = match peek(&gw, &id.key).await {
            None => "released",
            Some((_, None)) => "in_flight",
            Some((_, Some(_))) => "completed",
        };
        assert_eq!(under, left, "{error:?}");
        if left == "in_flight" {
            continue;
        }
        let (m, again) = answering(Ok(payment(PaymentStatus::Succeeded)));
        let retry = run(&gw, &c, Strategy::ReserveCallSettle, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await;
        match left {
            "completed" => {
                let e = retry.unwrap_err();
                assert_eq!((e.code, e.details.get("replayed"), calls(&again)), (code, Some(&json!(true)), 0));
            }
            _ => assert_eq!((retry.unwrap().replayed, calls(&again)), (false, 1)),
        }
    }
}

/// A refused posting transaction rolled back its claim: the key is not this call's to complete
/// or release. Another attempt that reserved it meanwhile keeps it in flight.
#[tokio::test]
async fn a_refused_claim_leaves_a_key_another_attempt_took_meanwhile() {
    let acct = AccountId::parse("acct-A").unwrap();
    let funds = BackendError::InsufficientFunds { account: acct, balance: "1".into(), needed: "50".into() };
    for error in [BackendError::Unavailable("down".into()), funds] {
        let gw = gateway().await;
        let c = caller(&[scopes::CREATE]);
        let id = idem(&gw, &c, "op-1", "a");
        let (store, key, fingerprint, answer) =
            (gw.store.clone(), id.key.clone(), id.fingerprint.clone(), error.clone());
        let (m, seen) = backend(move |_| {
            let (store, key, fingerprint, answer) = (store.clone(), key.clone(), fingerprint.clone(), answer.clone());
            let rec = NewIdempotencyRecord {
                key,
                fingerprint,
                tool: TOOL.into(),
                principal_iss: "iss".into(),
                principal_sub: "agent".into(),
                lease_until: NOW + 30,
                expires_at: NOW + 86_400,
            };
            async move {
                assert_eq!(store.idem_reserve(rec, NOW).await.unwrap(), Reservation::Acquired);
                Err(answer)
            }
        });
        let e = run(&gw, &c, Strategy::ClaimInPosting, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await;
        assert_eq!((e.unwrap_err().code, calls(&seen)), (AgentError::from(&error).code, 1));
        assert_eq!(peek(&gw, &id.key).await, Some((id.fingerprint.clone(), None)), "{error:?}");
    }
}

/// A replayed rail payment is shown where it stands now: a payment stored as pending whose rail
/// record has since succeeded replays as succeeded.
#[tokio::test]
async fn a_replayed_rail_payment_is_shown_where_it_stands_now() {
    let gw = gateway().await;
    let c = caller(&[scopes::CREATE]);
    let id = idem(&gw, &c, "op-1", "a");
    let pending = payment(PaymentStatus::Pending);
    let rec = RailPayment {
        id: pending.id.clone(),
        idempotency_key: id.key.clone(),
        rail: "mpesa".into(),
        kind: PaymentKind::Payment,
        state: RailState::Submitting,
        from_account: pending.from_account.clone(),
        to_account: pending.to_account.clone(),
        amount_minor: pending.amount_minor,
        currency: kes(),
        refund_of: None,
        memo: None,
        principal_sub: "agent".into(),
        principal_user: None,
        family_key: None,
        mandate_id: None,
        rail_ref: None,
        receipt: None,
        phone: None,
        reason: None,
        created_at: NOW,
        updated_at: NOW,
        flow: RailFlow::Collection,
    };
    gw.store.rail_open(rec, Guards::default(), None, NOW).await.unwrap();
    let settle = RailMove {
        id: &pending.id,
        from: &[RailState::Submitting],
        to: RailState::Succeeded,
        update: RailUpdate::default(),
    };
    assert!(gw.store.rail_transition(settle, NOW).await.unwrap().is_some());
    hold(&gw, &id.key, &id.fingerprint, Some(&succeeded(&pending))).await;
    let (m, seen) = answering(Ok(payment(PaymentStatus::Succeeded)));
    let again = run(&gw, &c, Strategy::ReserveCallSettle, Policy::Allow, idem(&gw, &c, "op-1", "a"), m).await.unwrap();
    assert_eq!((again.replayed, &again.payment.id, calls(&seen)), (true, &pending.id, 0));
    assert_eq!(again.payment.status, PaymentStatus::Succeeded);
}
