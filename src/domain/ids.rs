//! Identifier newtypes. Each is parsed once at the edge; past that, a value of the type is valid.

use std::fmt;

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} must be 1-{max} characters of letters, digits, '-', '_', '.' or ':'")]
pub struct IdError {
    pub field: &'static str,
    pub max: usize,
}

fn valid_token(s: &str, max: usize) -> bool {
    !s.is_empty()
        && s.len() <= max
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
}

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident, $field:literal, $max:expr) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub const MAX_LEN: usize = $max;
            pub fn parse(s: &str) -> Result<Self, IdError> {
                if valid_token(s, $max) { Ok(Self(s.to_string())) } else { Err(IdError { field: $field, max: $max }) }
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::parse(&s)
            }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }
    };
}

string_id!(
    /// A ledger account id (`acct-A`).
    AccountId, "account_id", 64
);
string_id!(
    /// The agent's name for one intended operation; the same id means the same operation.
    OperationId, "operation_id", 128
);

macro_rules! prefixed_id {
    ($(#[$doc:meta])* $name:ident, $prefix:literal, $field:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
        #[serde(try_from = "String", into = "String")]
        pub struct $name(String);

        impl $name {
            pub const PREFIX: &'static str = $prefix;
            /// A fresh, unguessable id (UUIDv7: 62+ random bits after a millisecond timestamp), in
            /// creation order within a process, so ids written together land together in an index
            /// instead of on random pages. The timestamp says no more than `created_at` does.
            pub fn generate() -> Self {
                Self(format!("{}{}", $prefix, uuid::Uuid::now_v7().simple()))
            }
            pub fn parse(s: &str) -> Result<Self, IdError> {
                let ok = s.strip_prefix($prefix).is_some_and(|rest| {
                    !rest.is_empty() && rest.len() <= 64 && rest.bytes().all(|b| b.is_ascii_alphanumeric())
                });
                if ok { Ok(Self(s.to_string())) } else { Err(IdError { field: $field, max: 64 + $prefix.len() }) }
            }
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }
        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
        impl TryFrom<String> for $name {
            type Error = IdError;
            fn try_from(s: String) -> Result<Self, IdError> {
                Self::parse(&s)
            }
        }
        impl From<$name> for String {
            fn from(v: $name) -> String {
                v.0
            }
        }
    };
}

prefixed_id!(
    /// A payment or refund (`pay_…`).
    PaymentId, "pay_", "payment_id"
);
prefixed_id!(
    /// A pending or decided approval (`apr_…`).
    ApprovalId, "apr_", "approval_id"
);
prefixed_id!(
    /// A proposed policy change waiting for a second operator (`pol_…`).
    ProposalId, "pol_", "proposal_id"
);

/// Lower-case hex, two digits a byte (one allocation: keys and fingerprints are built on every money call).
pub fn hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_is_two_lower_case_digits_a_byte() {
        let all: Vec<u8> = (0..=255).collect();
        let expected: String = all.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex(&all), expected);
        assert_eq!(hex(&[]), "");
    }

    /// A closed mandate's idempotency key is derived from `mandate/<jti>` (gateway/keys.rs): no
    /// operation_id may spell that, or it could take the mandate's key.
    #[test]
    fn an_operation_id_never_holds_a_slash() {
        for bad in ["mandate/mdt_1", "a/b", "/", "x/"] {
            assert!(OperationId::parse(bad).is_err(), "{bad}");
        }
        assert!(OperationId::parse("mandate:mdt_1").is_ok());
    }

    #[test]
    fn ids_parse_strictly() {
        assert!(AccountId::parse("acct-A").is_ok());
        assert!(AccountId::parse("").is_err());
        assert!(AccountId::parse("acct A").is_err());
        assert!(AccountId::parse(&"a".repeat(65)).is_err());
        let p = PaymentId::generate();
        assert_eq!(PaymentId::parse(p.as_str()).unwrap(), p);
        assert!(PaymentId::parse("apr_123").is_err());
        assert!(PaymentId::parse("pay_").is_err());
        assert!(PaymentId::parse("pay_../x").is_err());
    }

    #[test]
    fn generated_ids_sort_in_creation_order_and_never_repeat() {
        let ids: Vec<PaymentId> = (0..2_000).map(|_| PaymentId::generate()).collect();
        assert!(ids.windows(2).all(|w| w[0].as_str() < w[1].as_str()), "each id sorts after the one before it");
        let unique: std::collections::BTreeSet<&str> = ids.iter().map(PaymentId::as_str).collect();
        assert_eq!(unique.len(), ids.len());
        assert!(ids.iter().all(|p| PaymentId::parse(p.as_str()).is_ok()));
    }
}
