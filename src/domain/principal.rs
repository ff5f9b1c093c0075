//! Principals as the records name them. Three kinds are never confused: an agent (a token for the
//! MCP resource), the user an agent may act for (RFC 8693 delegation), and an operator (a token
//! for the operator resource). Records of what agents did name the agent (issuer, subject) and,
//! when it acted for someone, that user.

use serde::{Deserialize, Serialize};

/// An agent as records are keyed on it: issuer, subject, and the user it acted for (if any).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct PrincipalRef {
    pub issuer: String,
    pub subject: String,
    pub user: Option<String>,
}

/// What a suspension covers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SuspensionScope {
    /// The agent, whoever it acts for (and on its own token).
    Agent,
    /// The agent acting for this user; `None`: the agent on its own token.
    Pair(Option<String>),
}

/// A suspension to impose: who (issuer, subject), what `scope` covers, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Suspension {
    pub issuer: String,
    pub subject: String,
    pub scope: SuspensionScope,
    pub reason: String,
}

impl SuspensionScope {
    /// The stored (scope, principal_user) pair.
    pub fn columns(&self) -> (&'static str, &str) {
        match self {
            SuspensionScope::Agent => ("agent", ""),
            SuspensionScope::Pair(user) => ("pair", user.as_deref().unwrap_or("")),
        }
    }

    pub fn from_columns(scope: &str, user: &str) -> SuspensionScope {
        match scope {
            "agent" => SuspensionScope::Agent,
            _ => SuspensionScope::Pair((!user.is_empty()).then(|| user.to_string())),
        }
    }
}

/// The subject a principal's daily budget and refund usage are kept under: the agent's subject, or
/// for an agent acting for a user, the pair (budgets apply per user and agent). Token subjects have
/// no control characters (the verifier refuses them), so a pair's key is never a lone subject's.
pub fn usage_subject(subject: &str, user: Option<&str>) -> String {
    match user {
        None => subject.to_string(),
        Some(u) => format!("{subject}\u{1f}{u}"),
    }
}

/// A subject an operator names (to suspend, resume or pre-authorize): what a token's `sub` could
/// be: 1 to 256 bytes, no control characters.
pub fn valid_subject(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && !s.chars().any(char::is_control)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pairs_usage_key_is_never_a_subjects() {
        assert_eq!(usage_subject("bot", None), "bot");
        let pair = usage_subject("bot", Some("alice"));
        assert_ne!(pair, usage_subject("bot", Some("bob")));
        assert!(!valid_subject(&pair), "no token subject can name a pair's key");
        for (scope, user) in [("agent", ""), ("pair", ""), ("pair", "alice")] {
            assert_eq!(SuspensionScope::from_columns(scope, user).columns(), (scope, user));
        }
    }
}
