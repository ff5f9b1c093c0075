//! Rail records (`rail_payments`): opening draws the guards once per key; a record moves only from
//! the states its caller expects (compare-and-set), so a duplicate or late update changes nothing;
//! moving to `Failed`, or abandoning a record that never left, gives back what it drew.

use super::guards::{UsageDraw, usage_draw};
use crate::clock::UnixSecs;
use crate::domain::payment::Guards;
use crate::domain::rail::{RailFlow, RailMove, RailPayment, RailState, RailUpdate, Settlement};

/// What a record drew when it opened, to be given back: its day's usage and one mandate use.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Draws {
    pub usage: UsageDraw,
    /// (mandate id, amount)
    pub mandate: Option<(String, i64)>,
}

impl Draws {
    pub fn of(rec: &RailPayment) -> Draws {
        Draws {
            usage: usage_draw(rec.kind, &rec.usage_subject(), rec.currency, rec.amount_minor, rec.created_at),
            mandate: rec.mandate_id.clone().map(|m| (m, rec.amount_minor)),
        }
    }
}

/// The record as `rail_open` stores it once its guards are drawn: stamped now, naming its mandate.
pub fn opened(mut rec: RailPayment, guards: &Guards, now: UnixSecs) -> RailPayment {
    rec.mandate_id = guards.mandate.as_ref().map(|m| m.mandate_id.clone());
    rec.created_at = now;
    rec.updated_at = now;
    rec
}

/// What a transition to `to` gives back (the draws a failed payment never used), known before the
/// record is locked so that the engine can lock those rows first.
pub fn released_by(rec: &RailPayment, to: RailState) -> Option<Draws> {
    (to == RailState::Failed).then(|| Draws::of(rec))
}

/// Whether the record may move: only from one of the states the caller expects.
pub fn may_move(rec: &RailPayment, from: &[RailState]) -> bool {
    from.contains(&rec.state)
}

/// Whether a record found under a request's key is that request: the same rail, flow, accounts,
/// amount and original. Another is a reused key, refused.
pub fn same_request(asked: &RailPayment, found: &RailPayment) -> bool {
    (
        &asked.rail,
        asked.flow,
        &asked.from_account,
        &asked.to_account,
        asked.amount_minor,
        asked.currency,
        &asked.refund_of,
    ) == (
        &found.rail,
        found.flow,
        &found.from_account,
        &found.to_account,
        found.amount_minor,
        found.currency,
        &found.refund_of,
    )
}

/// The states a rail's word may settle a record from. A collection settles only once pushed and
/// pending. Money going out settles from any open state: its result may arrive before the request's
/// own answer was recorded (`Submitting`), or after that answer was lost (`Unknown`).
pub fn settles_from(flow: RailFlow) -> &'static [RailState] {
    match flow {
        RailFlow::Collection | RailFlow::Ledger => &[RailState::Pending],
        RailFlow::Payout | RailFlow::Reversal => &[RailState::Submitting, RailState::Pending, RailState::Unknown],
    }
}

/// The states a rail's own status answer may settle a record from when the rail asks by a
/// reference the gateway chose and recorded before sending (Airtel Money's transaction id): a
/// collection whose answer was lost (`Unknown`) can still be asked about, so the answer settles it
/// as it would a pending one. Callbacks still settle a collection only from [`settles_from`].
pub fn settles_from_asked_by_own_ref(flow: RailFlow) -> &'static [RailState] {
    match flow {
        RailFlow::Collection => &[RailState::Pending, RailState::Unknown],
        RailFlow::Ledger | RailFlow::Payout | RailFlow::Reversal => settles_from(flow),
    }
}

/// The one settlement rule every rail follows: the [`RailMove`] a rail's word makes. `from`: [`settles_from`] or
/// [`settles_from_asked_by_own_ref`], as the rail asks. `receipt`: what came with the word (a
/// callback's); `kept_receipt`: whether the record already holds one (a status answer's, the rail's
/// own word: a callback's only fills a gap). `None`: nothing to write (a late word on a closed record).
///
/// A success or failure closes the record. A word that is neither leaves it where it is: an unknown
/// collection keeps the reason its outcome is unknown, any other record takes the new reason, and
/// `updated_at` moves on either way so records that keep not answering do not starve newer ones
/// out of the query batch.
pub fn settles<'a>(
    rec: &'a RailPayment,
    settlement: &Settlement,
    from: &'static [RailState],
    receipt: Option<String>,
    kept_receipt: bool,
) -> Option<RailMove<'a>> {
    match settlement {
        Settlement::Succeeded => {
            let update = RailUpdate { receipt: receipt.filter(|_| !kept_receipt), ..Default::default() };
            Some(RailMove { id: &rec.id, from, to: RailState::Succeeded, update })
        }
        Settlement::Failed(reason) => {
            let update = RailUpdate { reason: Some(reason.clone()), ..Default::default() };
            Some(RailMove { id: &rec.id, from, to: RailState::Failed, update })
        }
        Settlement::Pending(_) | Settlement::Unrecognised(_) if rec.state.is_terminal() => None,
        Settlement::Pending(reason) | Settlement::Unrecognised(reason) => {
            let keep_reason = rec.state == RailState::Unknown && rec.flow == RailFlow::Collection;
            let update = RailUpdate { reason: (!keep_reason).then(|| reason.clone()), ..Default::default() };
            Some(RailMove { id: &rec.id, from: std::slice::from_ref(&rec.state), to: rec.state, update })
        }
    }
}

/// Whether the record may be abandoned (deleted, its draws given back): only while `Submitting`,
/// before anything reached the rail.
pub fn may_abandon(rec: &RailPayment) -> bool {
    rec.state == RailState::Submitting
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::ids::{AccountId, PaymentId};
    use crate::domain::money::Currency;
    use crate::domain::payment::{MandateDraw, PaymentKind};

    fn rec(kind: PaymentKind, state: RailState, mandate: Option<&str>) -> RailPayment {
        RailPayment {
            id: PaymentId::generate(),
            idempotency_key: "idk".into(),
            rail: "mpesa".into(),
            kind,
            state,
            from_account: AccountId::parse("a").unwrap(),
            to_account: AccountId::parse("b").unwrap(),
            amount_minor: 700,
            currency: Currency::parse("KES").unwrap(),
            refund_of: None,
            memo: None,
            principal_sub: "agent".into(),
            principal_user: None,
            family_key: None,
            mandate_id: mandate.map(str::to_string),
            rail_ref: None,
            receipt: None,
            phone: None,
            reason: None,
            created_at: 86_400 * 3 + 5,
            updated_at: 86_400 * 3 + 5,
            flow: RailFlow::Collection,
        }
    }

    #[test]
    fn a_rails_word_moves_an_open_record_once_and_never_guesses() {
        let pending = rec(PaymentKind::Payment, RailState::Pending, None);
        let from = settles_from(RailFlow::Collection);
        // A success writes the rail's receipt, unless the record already holds one (the rail's own word).
        let m = settles(&pending, &Settlement::Succeeded, from, Some("R1".into()), false).unwrap();
        assert_eq!(
            (m.id, m.from, m.to, m.update.receipt.as_deref()),
            (&pending.id, from, RailState::Succeeded, Some("R1"))
        );
        let kept = settles(&pending, &Settlement::Succeeded, from, Some("R2".into()), true).unwrap();
        assert_eq!(kept.update.receipt, None);
        let failed = settles(&pending, &Settlement::Failed("declined".into()), from, None, false).unwrap();
        assert_eq!((failed.to, failed.update.reason.as_deref()), (RailState::Failed, Some("declined")));
        // Neither: it stays where it is, compare-and-set on its own state, the reason updated…
        let asked = settles(&pending, &Settlement::Pending("still open".into()), from, None, false).unwrap();
        assert_eq!(
            (asked.from, asked.to, asked.update.reason.as_deref()),
            (&[RailState::Pending][..], RailState::Pending, Some("still open"))
        );
        // …except that an unknown collection keeps why its outcome is unknown.
        let unknown = rec(PaymentKind::Payment, RailState::Unknown, None);
        assert_eq!(
            settles(&unknown, &Settlement::Unrecognised("??".into()), from, None, false).unwrap().update.reason,
            None
        );
        // A late non-answer on a closed record writes nothing.
        let done = rec(PaymentKind::Payment, RailState::Succeeded, None);
        assert_eq!(settles(&done, &Settlement::Pending("late".into()), from, None, false), None);
    }

    #[test]
    fn what_a_record_gives_back() {
        let kes = Currency::parse("KES").unwrap();
        let usage =
            |kind| UsageDraw { kind, subject: "agent".into(), day: 86_400 * 3, currency: kes, amount_minor: 700 };
        let (payment, refund) = (usage(PaymentKind::Payment), usage(PaymentKind::Refund));
        let cases = [
            (rec(PaymentKind::Payment, RailState::Submitting, None), Draws { usage: payment.clone(), mandate: None }),
            (
                rec(PaymentKind::Payment, RailState::Pending, Some("mdt_1")),
                Draws { usage: payment, mandate: Some(("mdt_1".into(), 700)) },
            ),
            (
                rec(PaymentKind::Refund, RailState::Pending, Some("mdt_1")),
                Draws { usage: refund.clone(), mandate: Some(("mdt_1".into(), 700)) },
            ),
            (rec(PaymentKind::Refund, RailState::Pending, None), Draws { usage: refund, mandate: None }),
        ];
        for (r, draws) in cases {
            assert_eq!(released_by(&r, RailState::Failed), Some(draws.clone()));
            for to in [RailState::Succeeded, RailState::Pending, RailState::Unknown, RailState::Submitting] {
                assert_eq!(released_by(&r, to), None, "{to:?}");
            }
        }
    }

    #[test]
    fn compare_and_set() {
        use RailState::*;
        let cases: &[(RailState, &[RailState], bool)] = &[
            (Pending, &[Pending], true),
            (Pending, &[Submitting, Unknown], false),
            (Succeeded, &[Pending, Unknown], false),
            (Unknown, &[Pending, Unknown], true),
            (Failed, &[], false),
        ];
        for &(state, from, ok) in cases {
            assert_eq!(may_move(&rec(PaymentKind::Payment, state, None), from), ok, "{state:?} {from:?}");
        }
        for (state, ok) in [(Submitting, true), (Unknown, false), (Pending, false), (Succeeded, false), (Failed, false)]
        {
            assert_eq!(may_abandon(&rec(PaymentKind::Payment, state, None)), ok, "{state:?}");
        }
    }

    #[test]
    fn money_going_out_settles_from_any_open_state_a_collection_only_from_pending() {
        use RailState::*;
        assert_eq!(settles_from(RailFlow::Collection), [Pending]);
        assert_eq!(settles_from(RailFlow::Ledger), [Pending]);
        for flow in [RailFlow::Payout, RailFlow::Reversal] {
            assert_eq!(settles_from(flow), [Submitting, Pending, Unknown], "{flow:?}");
            assert!(!settles_from(flow).iter().any(|s| s.is_terminal()), "a settled record never settles again");
        }
    }

    #[test]
    fn a_rail_asking_by_its_own_reference_settles_lost_collections_too() {
        use RailState::*;
        // Callbacks settle a collection only once it is pending; an answer asked by the reference
        // the gateway chose also settles one whose request's answer was lost. Never a finished one.
        assert_eq!(settles_from(RailFlow::Collection), &[Pending]);
        assert_eq!(settles_from_asked_by_own_ref(RailFlow::Collection), &[Pending, Unknown]);
        for flow in [RailFlow::Payout, RailFlow::Reversal, RailFlow::Ledger] {
            assert_eq!(settles_from_asked_by_own_ref(flow), settles_from(flow), "{flow:?}");
        }
        for flow in [RailFlow::Collection, RailFlow::Payout, RailFlow::Reversal, RailFlow::Ledger] {
            let from = settles_from_asked_by_own_ref(flow);
            assert!(!from.contains(&Succeeded) && !from.contains(&Failed), "{flow:?}");
        }
    }

    #[test]
    fn a_key_finds_the_same_request_or_a_reused_key() {
        let asked = rec(PaymentKind::Payment, RailState::Submitting, None);
        // What the store adds (state, stamps, mandate, reference) does not make it another request.
        let found =
            RailPayment { state: RailState::Unknown, rail_ref: Some("r".into()), created_at: 9, ..asked.clone() };
        assert!(same_request(&asked, &found));
        let other = |f: fn(&mut RailPayment)| {
            let mut r = asked.clone();
            f(&mut r);
            r
        };
        for changed in [
            other(|r| r.amount_minor += 1),
            other(|r| r.to_account = AccountId::parse("c").unwrap()),
            other(|r| r.from_account = AccountId::parse("c").unwrap()),
            other(|r| r.flow = RailFlow::Payout),
            other(|r| r.rail = "airtel".into()),
            other(|r| r.refund_of = Some(PaymentId::generate())),
        ] {
            assert!(!same_request(&asked, &changed), "{changed:?}");
        }
    }

    #[test]
    fn opening_stamps_the_record() {
        let guards =
            Guards { budget: None, mandate: Some(MandateDraw { mandate_id: "mdt_9".into(), jws: None }), payee: None };
        let r = opened(rec(PaymentKind::Payment, RailState::Submitting, None), &guards, 42);
        assert_eq!((r.mandate_id.as_deref(), r.created_at, r.updated_at), (Some("mdt_9"), 42, 42));
        let r = opened(rec(PaymentKind::Payment, RailState::Submitting, Some("stale")), &Guards::default(), 43);
        assert_eq!(r.mandate_id, None);
    }
}
