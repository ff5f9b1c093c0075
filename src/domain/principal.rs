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

/// Longest subject (or actor) accepted, in bytes.
pub const SUBJECT_BYTES_MAX: usize = 256;

/// A subject the gateway can key on — a token's `sub` or `act.sub`, or one an operator names (to
/// suspend, resume or pre-authorize): 1 to [`SUBJECT_BYTES_MAX`] bytes, no control characters
/// (they could forge log lines, and no identity provider issues them) and nothing that is not shown
/// as itself (`domain::text`: bidi controls, zero-width characters — a person reading "alice" must
/// be reading alice), nor white space at either end ("alice " and "alice\u{a0}" read as alice and
/// would be another principal).
pub fn valid_subject(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= SUBJECT_BYTES_MAX
        && !s.chars().any(super::text::is_hidden)
        && !s.starts_with(char::is_whitespace)
        && !s.ends_with(char::is_whitespace)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_subject_is_one_to_256_bytes_without_control_characters() {
        assert!(valid_subject("a"));
        assert!(valid_subject(&"é".repeat(SUBJECT_BYTES_MAX / 2)), "bytes, not characters");
        assert!(!valid_subject(&"é".repeat(SUBJECT_BYTES_MAX / 2 + 1)));
        assert!(valid_subject(&"a".repeat(SUBJECT_BYTES_MAX)));
        for hidden in ["ali\u{202e}ce", "alice\u{200b}", "\u{feff}alice", "bob\u{2066}"] {
            assert!(!valid_subject(hidden), "{hidden:?}");
        }
        assert!(!valid_subject(&"a".repeat(SUBJECT_BYTES_MAX + 1)));
        for padded in [" alice", "alice ", "alice\u{a0}", "\u{3000}alice", "\u{2003}bob"] {
            assert!(!valid_subject(padded), "{padded:?}: white space at an end");
        }
        assert!(valid_subject("alice smith"), "inside is fine");
        for bad in ["", "ali\nce", "bo\u{7}b", "\u{85}"] {
            assert!(!valid_subject(bad), "{bad:?}");
        }
    }

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
