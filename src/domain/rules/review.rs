//! The approval review state machine: pending → approved | rejected | expired. Terminal states
//! never change; the requesting agent never reviews its own request (maker/checker); a reviewer
//! counts once; enough distinct approvals issue the mandate.

use super::authority::{Target, acts_on_itself};
use crate::clock::UnixSecs;
use crate::domain::approval::{ApprovalRecord, ApprovalStatus, Approver, Review, ReviewDecision, ReviewError};

/// What to write for a review the rules accept.
#[derive(Debug, Clone, PartialEq)]
pub enum ReviewPlan {
    /// The approval outlived its expiry while pending: mark it expired (and commit that), then
    /// refuse the review with [`ReviewError::Expired`].
    Expire,
    /// Record the review and reject the approval.
    Reject,
    /// Record the review; with `Some(approvers)` it completes the count: issue the mandate naming
    /// these approvers and mark the approval approved.
    Approve { issue: Option<Vec<String>> },
}

/// What to do when an agent's call needs an approval.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RequestPlan {
    /// Answer with the operation's latest approval.
    Existing,
    /// Insert the new pending approval.
    Create,
    /// Refuse: the agent has too many approvals waiting already (an approval flood).
    TooManyPending,
}

/// `latest`: the operation's newest approval, if any; `pending`: the agent's live pending approvals.
/// A pending or approved approval is the answer to a retry, and so is a rejected one (a rejection
/// sticks to its operation); only an expired one lets the same operation ask a human again.
pub fn on_request(latest: Option<&ApprovalRecord>, pending: i64, pending_max: i64, now: UnixSecs) -> RequestPlan {
    match latest.map(|a| a.status_at(now)) {
        Some(ApprovalStatus::Pending | ApprovalStatus::Approved | ApprovalStatus::Rejected) => RequestPlan::Existing,
        Some(ApprovalStatus::Expired) | None if pending >= pending_max => RequestPlan::TooManyPending,
        Some(ApprovalStatus::Expired) | None => RequestPlan::Create,
    }
}

pub fn plan(rec: &ApprovalRecord, review: &Review, now: UnixSecs) -> Result<ReviewPlan, ReviewError> {
    if rec.status != ApprovalStatus::Pending {
        return Err(ReviewError::Terminal(rec.status));
    }
    if now >= rec.expires_at {
        return Ok(ReviewPlan::Expire);
    }
    // The user's own confirmation: only for an approval in their user-approval tier, only by the
    // very identity (issuer and subject) the agent acts for, through the confirmation route. It
    // decides alone: the profile owner chose that the user, not an operator, is the human here.
    if review.as_user {
        // The person is the user the agent acts for (delegation): never the agent itself.
        let theirs = rec.approver == Approver::User
            && rec.principal_user.as_deref() == Some(review.reviewer_sub.as_str())
            && review.reviewer_iss == rec.principal_iss;
        if !theirs {
            return Err(ReviewError::NotTheUser);
        }
        return Ok(match review.decision {
            ReviewDecision::Reject => ReviewPlan::Reject,
            ReviewDecision::Approve => ReviewPlan::Approve { issue: Some(vec![review.reviewer_sub.clone()]) },
        });
    }
    // Maker/checker: neither the agent a payment is for nor the person it acts for reviews it as
    // an operator. (An operator's pre-authorization records the operator's own approval at
    // creation, so it cannot count twice.)
    let target = Target { agent: &rec.principal_sub, user: rec.principal_user.as_deref() };
    if acts_on_itself(&review.reviewer_sub, target) {
        return Err(ReviewError::SelfReview);
    }
    // One person counts once: a reviewer is their subject, whichever trusted issuer vouches for it
    // (the same subject under two issuers is not a second pair of eyes).
    if rec.reviews.iter().any(|r| r.reviewer_sub == review.reviewer_sub) {
        return Err(ReviewError::AlreadyReviewed);
    }
    if review.decision == ReviewDecision::Reject {
        return Ok(ReviewPlan::Reject);
    }
    let mut approvers: Vec<String> =
        rec.reviews.iter().filter(|r| r.decision == ReviewDecision::Approve).map(|r| r.reviewer_sub.clone()).collect();
    approvers.push(review.reviewer_sub.clone());
    let complete = approvers.len() as i64 >= rec.reviewers_required;
    Ok(ReviewPlan::Approve { issue: complete.then_some(approvers) })
}

/// Whether the reviews on record were written outside the gateway: one whose tag does not hold
/// (`holds`: `Review::tag_holds` under the link key; a row inserted, edited, copied from another
/// approval, or from before reviews were tagged), or one person on record twice (a tagged row
/// copied within the approval). Such an approval is decided no further: who approved it is not
/// known (the second stop-67 review: an inserted review row counted as a person).
pub fn altered(reviews: &[Review], holds: impl Fn(&Review) -> bool) -> bool {
    reviews.iter().enumerate().any(|(i, r)| !holds(r) || reviews[..i].iter().any(|e| e.reviewer_sub == r.reviewer_sub))
}

/// Whether an approval's reviews, read back in the review's transaction after it was written, are
/// those the plan was made on plus `review`, each exactly as written (in any order; `as_user` is
/// not stored). A trigger that rewrote or deleted the new row, or touched an earlier one, would
/// otherwise decide with another person — or nobody — on record (the stop-67 review: one person
/// granted a two-person tier by approving twice under a rewritten subject).
pub fn recorded_as_meant(before: &[Review], after: &[Review], review: &Review) -> bool {
    let stored = |r: &Review| Review { as_user: false, ..r.clone() };
    let mut left: Vec<Review> = after.iter().map(stored).collect();
    for meant in before.iter().chain(std::iter::once(review)).map(stored) {
        match left.iter().position(|r| *r == meant) {
            Some(i) => {
                left.swap_remove(i);
            }
            None => return false,
        }
    }
    left.is_empty()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reviews_not_all_the_gateways_or_one_person_twice_are_altered() {
        let (alice, bob) = (review("iss", "alice", APPROVE), review("iss", "bob", APPROVE));
        let all = |_: &Review| true;
        assert!(!altered(&[], all));
        assert!(!altered(&[alice.clone(), bob.clone()], all));
        // A copy of one person's review, under any issuer or decision.
        assert!(altered(&[alice.clone(), bob.clone(), alice.clone()], all));
        assert!(altered(&[alice.clone(), review("other", "alice", REJECT)], all));
        // One review whose tag does not hold, wherever it is.
        let not_bob = |r: &Review| r.reviewer_sub != "bob";
        assert!(altered(&[bob.clone(), alice.clone()], not_bob));
        assert!(altered(&[alice.clone(), bob.clone()], not_bob));
        assert!(!altered(std::slice::from_ref(&alice), not_bob));
    }
    use crate::domain::approval::MandateKind;
    use crate::domain::ids::ApprovalId;
    use crate::domain::money::Currency;

    const PENDING: &str = "pending";
    const APPROVE: &str = "approve";
    const REJECT: &str = "reject";

    fn approval(status: &str, reviewers_required: i64, reviews: Vec<Review>) -> ApprovalRecord {
        ApprovalRecord {
            id: ApprovalId::generate(),
            status: ApprovalStatus::parse(status).unwrap(),
            kind: MandateKind::Closed,
            idempotency_key: "idk".into(),
            fingerprint: "fp".into(),
            principal_iss: "iss".into(),
            principal_sub: "agent".into(),
            principal_user: None,
            tool: "create_payment".into(),
            intent: serde_json::json!({}),
            amount_minor: 500_000,
            currency: Currency::parse("KES").unwrap(),
            reason: "over the limit".into(),
            created_at: 0,
            expires_at: 100,
            reviewers_required,
            requested_by: "agent".into(),
            mandate_id: None,
            mandate: None,
            decided_at: None,
            decision_reason: None,
            reviews,
            approver: Approver::Operator,
            passkey_required: false,
            tag: None,
        }
    }

    #[test]
    fn a_rejection_sticks_and_pending_approvals_are_bounded() {
        // (latest status, agent's pending count, max 3, now) → plan; expires_at is 100.
        let cases = [
            (None, 0, 0, RequestPlan::Create),
            (None, 3, 0, RequestPlan::TooManyPending),
            (Some(PENDING), 3, 0, RequestPlan::Existing),
            (Some("approved"), 9, 0, RequestPlan::Existing),
            (Some("rejected"), 0, 0, RequestPlan::Existing),
            (Some("expired"), 0, 0, RequestPlan::Create),
            (Some(PENDING), 0, 100, RequestPlan::Create),
            (Some(PENDING), 3, 100, RequestPlan::TooManyPending),
        ];
        for (status, pending, now, want) in cases {
            let latest = status.map(|s| approval(s, 1, vec![]));
            assert_eq!(on_request(latest.as_ref(), pending, 3, now), want, "{status:?} {pending} at {now}");
        }
    }

    fn review(iss: &str, sub: &str, decision: &str) -> Review {
        Review {
            reviewer_iss: iss.into(),
            reviewer_sub: sub.into(),
            decision: ReviewDecision::parse(decision).unwrap(),
            reason: None,
            at: 1,
            passkey: None,
            as_user: false,
            tag: None,
        }
    }

    #[test]
    fn the_user_confirms_only_their_own_approval_in_their_tier() {
        let user = |iss: &str, sub: &str, decision: &str| Review { as_user: true, ..review(iss, sub, decision) };
        // The agent acts for "pat" (delegation): pat is the person who may confirm.
        let tiered = |required: i64| ApprovalRecord {
            approver: Approver::User,
            principal_user: Some("pat".into()),
            ..approval(PENDING, required, vec![])
        };
        let not_theirs =
            "only the user the payment is for may confirm it, and only an approval in their user-approval tier";
        let self_review = "the requesting agent cannot review its own request";
        let cases: Vec<(ApprovalRecord, Review, Result<ReviewPlan, &str>)> = vec![
            // Their own, in the tier: decides alone (even where operators would need two).
            (tiered(1), user("iss", "pat", APPROVE), Ok(ReviewPlan::Approve { issue: Some(vec!["pat".into()]) })),
            (tiered(2), user("iss", "pat", APPROVE), Ok(ReviewPlan::Approve { issue: Some(vec!["pat".into()]) })),
            (tiered(1), user("iss", "pat", REJECT), Ok(ReviewPlan::Reject)),
            // Not in the tier: operators only.
            (
                ApprovalRecord { principal_user: Some("pat".into()), ..approval(PENDING, 1, vec![]) },
                user("iss", "pat", APPROVE),
                Err(not_theirs),
            ),
            // The agent itself is not the person, on the confirmation route either.
            (tiered(1), user("iss", "agent", APPROVE), Err(not_theirs)),
            // An agent acting on its own token has no person to confirm.
            (ApprovalRecord { principal_user: None, ..tiered(1) }, user("iss", "agent", APPROVE), Err(not_theirs)),
            // Someone else, or the same subject under another issuer.
            (tiered(1), user("iss", "mallory", APPROVE), Err(not_theirs)),
            (tiered(1), user("other-idp", "pat", APPROVE), Err(not_theirs)),
            // Through the operator route neither the agent nor the person it acts for reviews it.
            (tiered(1), review("iss", "agent", APPROVE), Err(self_review)),
            (tiered(1), review("ops", "pat", APPROVE), Err(self_review)),
            // And an operator may still decide a tiered approval.
            (tiered(1), review("ops", "alice", APPROVE), Ok(ReviewPlan::Approve { issue: Some(vec!["alice".into()]) })),
        ];
        for (rec, r, want) in cases {
            assert_eq!(plan(&rec, &r, 0).map_err(|e| e.to_string()), want.map_err(str::to_string), "{r:?}");
        }
    }

    #[test]
    fn the_state_machine() {
        let alice_ok = review("ops", "alice", APPROVE);
        type Want = Result<ReviewPlan, &'static str>;
        let issue =
            |subs: &[&str]| Ok(ReviewPlan::Approve { issue: Some(subs.iter().map(|s| s.to_string()).collect()) });
        let cases: Vec<(ApprovalRecord, Review, UnixSecs, Want)> = vec![
            // One approval of one required issues the mandate.
            (approval(PENDING, 1, vec![]), alice_ok.clone(), 99, issue(&["alice"])),
            // One of two: recorded, still pending.
            (approval(PENDING, 2, vec![]), alice_ok.clone(), 0, Ok(ReviewPlan::Approve { issue: None })),
            // The second distinct approver completes it, earlier approvers first.
            (approval(PENDING, 2, vec![alice_ok.clone()]), review("ops", "bob", APPROVE), 0, issue(&["alice", "bob"])),
            // A rejection by anyone decides it, whatever the count.
            (approval(PENDING, 2, vec![alice_ok.clone()]), review("ops", "bob", REJECT), 0, Ok(ReviewPlan::Reject)),
            // A rejection recorded earlier does not count as an approval.
            (
                approval(PENDING, 2, vec![review("ops", "carol", REJECT)]),
                alice_ok.clone(),
                0,
                Ok(ReviewPlan::Approve { issue: None }),
            ),
            // Expiry is checked before who reviews.
            (approval(PENDING, 1, vec![]), review("iss", "agent", APPROVE), 100, Ok(ReviewPlan::Expire)),
            (
                approval(PENDING, 1, vec![]),
                review("iss", "agent", APPROVE),
                99,
                Err("the requesting agent cannot review its own request"),
            ),
            (
                approval(PENDING, 2, vec![alice_ok.clone()]),
                review("ops", "alice", REJECT),
                0,
                Err("this reviewer has already reviewed this approval"),
            ),
            // One person counts once: the same subject under another trusted issuer is not a second reviewer.
            (
                approval(PENDING, 2, vec![alice_ok.clone()]),
                review("other-idp", "alice", APPROVE),
                0,
                Err("this reviewer has already reviewed this approval"),
            ),
            (approval("approved", 1, vec![]), alice_ok.clone(), 0, Err("the approval is already approved")),
            (approval("rejected", 1, vec![]), alice_ok.clone(), 0, Err("the approval is already rejected")),
            (approval("expired", 1, vec![]), alice_ok.clone(), 0, Err("the approval is already expired")),
        ];
        for (rec, r, now, want) in cases {
            let got = plan(&rec, &r, now).map_err(|e| e.to_string());
            assert_eq!(got, want.map_err(str::to_string), "{} {r:?} at {now}", rec.status);
        }
    }

    #[test]
    fn a_pending_approval_reads_expired_past_its_expiry() {
        let cases = [
            (PENDING, 99, PENDING),
            (PENDING, 100, "expired"),
            ("approved", 1_000, "approved"),
            ("rejected", 0, "rejected"),
        ];
        for (status, now, read) in cases {
            assert_eq!(approval(status, 1, vec![]).status_at(now).as_str(), read, "{status} at {now}");
        }
    }

    #[test]
    fn a_review_must_read_back_as_written_beside_the_others() {
        let alice = review("iss", "alice", APPROVE);
        let one = std::slice::from_ref(&alice);
        let bob = review("iss", "bob", APPROVE);
        let as_user = Review { as_user: true, ..bob.clone() };
        // Written as meant, in any order; `as_user` is not stored.
        assert!(recorded_as_meant(&[], std::slice::from_ref(&alice), &alice));
        assert!(recorded_as_meant(one, &[bob.clone(), alice.clone()], &bob));
        assert!(recorded_as_meant(one, &[alice.clone(), bob.clone()], &as_user));
        // The new row rewritten (another subject, issuer, decision, reason, time or passkey).
        let rewritten = [
            review("iss", "ghost-1", APPROVE),
            review("other", "alice", APPROVE),
            review("iss", "alice", REJECT),
            Review { reason: Some("x".into()), ..alice.clone() },
            Review { at: 2, ..alice.clone() },
            Review { passkey: Some("p".into()), ..alice.clone() },
        ];
        for r in &rewritten {
            assert!(!recorded_as_meant(&[], std::slice::from_ref(r), &alice), "{r:?}");
        }
        // Deleted, doubled, or an earlier one touched.
        assert!(!recorded_as_meant(one, std::slice::from_ref(&alice), &bob));
        assert!(!recorded_as_meant(&[], &[alice.clone(), alice.clone()], &alice));
        assert!(!recorded_as_meant(one, &[review("iss", "ghost", APPROVE), bob.clone()], &bob));
        assert!(!recorded_as_meant(one, &[bob.clone(), bob.clone()], &bob));
    }
}
