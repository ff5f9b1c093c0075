//! No principal acts on itself: whoever an action is about (an agent, and the person it acts for)
//! is never the one who takes it. One rule for every such action: reviewing an approval,
//! pre-authorizing a mandate, suspending and resuming. (The user's own confirmation of a payment in
//! their tier is not an action on themselves in this sense: it is the person deciding what their
//! agent asked, and `review::plan` admits it only through the confirmation route.)

/// Who an action is about: an agent and, when it acts for someone, that user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Target<'a> {
    pub agent: &'a str,
    pub user: Option<&'a str>,
}

/// Whether `actor` (a subject) would be acting on itself. A person counts once whatever issuer
/// vouches for them, as reviewers do (`review::plan`): subjects compare, issuers do not, so the
/// same subject under another trusted issuer is still itself.
pub fn acts_on_itself(actor: &str, target: Target<'_>) -> bool {
    actor == target.agent || target.user == Some(actor)
}

/// Whether an action on `agent` that reaches every one of `users` (the people it acts for whom the
/// action touches: e.g. the pair suspensions a resume without a user lifts) is `actor` acting on
/// itself: the same rule, asked of each target the action reaches, not only of the one named.
pub fn reaches_itself<'a>(actor: &str, agent: &str, users: impl IntoIterator<Item = Option<&'a str>>) -> bool {
    acts_on_itself(actor, Target { agent, user: None })
        || users.into_iter().any(|user| acts_on_itself(actor, Target { agent, user }))
}

/// Whether an agent acting for `viewer_user` (`None`: on its own token) may see a payment made for
/// `made_for`. Delegation isolates people: the principal is the pair, so an agent acting for bob
/// sees bob's payments alone, never alice's, whichever agent made them and whatever accounts they
/// share; and the same agent on its own token sees the payments made for no one — not alice's, which
/// are the pair (alice, agent)'s to read and refund (and a suspension of that pair would otherwise be
/// walked around with the agent's own token).
pub fn sees(viewer_user: Option<&str>, made_for: Option<&str>) -> bool {
    viewer_user == made_for
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_action_reaching_the_actors_own_pair_is_acting_on_itself() {
        assert!(reaches_itself("alice", "bot", [None, Some("carol"), Some("alice")]));
        assert!(reaches_itself("bot", "bot", []));
        assert!(!reaches_itself("alice", "bot", [None, Some("carol")]));
        assert!(!reaches_itself("alice", "bot", []));
    }

    #[test]
    fn an_agent_acting_for_someone_sees_that_persons_payments_alone() {
        let cases = [
            (None, None, true),
            (None, Some("alice"), false),
            (Some("bob"), Some("bob"), true),
            (Some("bob"), Some("alice"), false),
            (Some("bob"), None, false),
            (Some(""), None, false),
        ];
        for (viewer, made_for, want) in cases {
            assert_eq!(sees(viewer, made_for), want, "{viewer:?} sees {made_for:?}");
        }
    }

    #[test]
    fn an_agent_and_the_person_it_acts_for_are_both_the_target() {
        let direct = Target { agent: "bot", user: None };
        let delegated = Target { agent: "bot", user: Some("alice") };
        let cases = [
            ("bot", direct, true),
            ("alice", direct, false),
            ("bot", delegated, true),
            ("alice", delegated, true),
            ("carol", delegated, false),
            ("", delegated, false),
        ];
        for (actor, target, want) in cases {
            assert_eq!(acts_on_itself(actor, target), want, "{actor} on {target:?}");
        }
    }
}
