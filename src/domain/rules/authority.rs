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

#[cfg(test)]
mod tests {
    use super::*;

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
