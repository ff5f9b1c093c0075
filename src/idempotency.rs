//! Exactly-once: an agent's `operation_id` becomes a stable key, its arguments a fingerprint.
//!
//! key = HMAC-SHA256(server secret, len‖issuer ‖ len‖subject ‖ len‖tool ‖ len‖operation_id).
//! Length prefixes make the encoding injective, so no two (issuer, subject, tool, operation_id)
//! tuples share a key; the secret makes keys unguessable, so one agent cannot occupy another's.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::domain::error::BackendError;
use crate::domain::payment::Payment;
use crate::domain::rules::fate::{self, KeyFate};
use crate::error::{AgentError, ErrorCode};
use crate::secret::Secret;

/// Derives keys; holds the server secret (never printed).
#[derive(Clone)]
pub struct KeyDeriver {
    secret: Secret,
}

impl std::fmt::Debug for KeyDeriver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("KeyDeriver(..)")
    }
}

impl KeyDeriver {
    pub fn new(secret: Secret) -> Self {
        KeyDeriver { secret }
    }

    pub fn key(&self, issuer: &str, subject: &str, tool: &str, operation_id: &str) -> String {
        self.key_for(issuer, subject, None, tool, operation_id)
    }

    /// The key of an agent acting for `user` (RFC 8693 delegation): the user is a fifth part, so one
    /// agent's operation_id for two people, or for a person and on its own, are different keys. An
    /// agent on its own token (`None`) keeps the four-part key it always had.
    pub fn key_for(&self, issuer: &str, subject: &str, user: Option<&str>, tool: &str, operation_id: &str) -> String {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.secret.expose().as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        // Length-prefixed parts: the encoding is injective across four and five parts alike (a
        // parse of the bytes finds the parts, and with them their number).
        for part in [Some(issuer), Some(subject), Some(tool), Some(operation_id), user].into_iter().flatten() {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        format!("idk_{}", crate::domain::ids::hex(&mac.finalize().into_bytes()))
    }

    /// A key for another purpose, derived from the secret under `label` (domain separation: no
    /// label is a length-prefixed key tuple, so no subkey equals an idempotency key's MAC).
    pub fn subkey(&self, label: &str) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(self.secret.expose().as_bytes())
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        mac.update(b"subkey\0");
        mac.update(label.as_bytes());
        mac.finalize().into_bytes().into()
    }
}

/// SHA-256 of a canonical JSON value (the caller builds it from parsed, normalized arguments, so
/// `"50"` and `"50.00"` fingerprint alike).
pub fn fingerprint(canonical: &serde_json::Value) -> String {
    crate::domain::ids::hex(&Sha256::digest(canonical.to_string().as_bytes()))
}

/// A payment's fingerprinted arguments (`create_payment`): parsed, the amount in minor units (so
/// "50" and "50.00" are one payment), the memo exactly as sent.
pub fn payment_args(
    from: &crate::domain::ids::AccountId,
    to: &crate::domain::ids::AccountId,
    amount: crate::domain::money::Money,
    memo: &Option<String>,
) -> serde_json::Value {
    serde_json::json!({
        "from": from, "to": to, "amount_minor": amount.minor(), "currency": amount.currency(), "memo": memo,
    })
}

/// A refund's fingerprinted arguments: no amount ("everything refundable") is not any amount.
pub fn refund_args(
    payment_id: &crate::domain::ids::PaymentId,
    amount_minor: Option<i64>,
    reason: &Option<String>,
) -> serde_json::Value {
    serde_json::json!({"payment_id": payment_id, "amount_minor": amount_minor, "reason": reason})
}

/// The fingerprint kept under a call's key: its arguments, and under a closed mandate's key (the
/// mandate anchors it) the operation_id too, so another operation on one mandate conflicts.
pub fn call_fingerprint(args: &serde_json::Value, mandate_operation: Option<&str>) -> String {
    match mandate_operation {
        None => fingerprint(&serde_json::json!({ "args": args })),
        Some(op) => fingerprint(&serde_json::json!({"args": args, "operation_id": op})),
    }
}

/// What is kept under a key and replayed to every later call with that key.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StoredOutcome {
    Succeeded {
        payment: Payment,
    },
    /// A business refusal (e.g. insufficient funds): replayed for this operation_id forever.
    Failed {
        code: String,
        message: String,
    },
}

impl StoredOutcome {
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_else(|_| unreachable!("outcome is plain data"))
    }
    pub fn from_json(s: &str) -> Option<Self> {
        serde_json::from_str(s).ok()
    }
    pub fn failed(err: &AgentError) -> Self {
        StoredOutcome::Failed { code: err.code.as_str().to_string(), message: err.message.clone() }
    }
    /// What a refusal leaves under the keys it was made under (`domain::rules::fate`): the failed
    /// outcome every retry replays when the refusal is the operation's fate, or `None` to give the
    /// keys back (nothing moved, and the operation may be tried again).
    pub fn after_refusal(refusal: &BackendError) -> Option<Self> {
        match fate::verdict(refusal).key_fate() {
            KeyFate::Complete => Some(StoredOutcome::failed(&AgentError::from(refusal))),
            KeyFate::Release | KeyFate::KeepInFlight => None,
        }
    }
    pub fn into_result(self) -> Result<Payment, AgentError> {
        match self {
            StoredOutcome::Succeeded { payment } => Ok(payment),
            StoredOutcome::Failed { code, message } => {
                Err(AgentError::new(ErrorCode::parse(&code).unwrap_or(ErrorCode::Internal), message))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_stable_distinct_and_injective() {
        let d = KeyDeriver::new(Secret::new("s3cret".into()));
        let k = d.key("iss", "sub", "create_payment", "op-1");
        assert_eq!(k, d.key("iss", "sub", "create_payment", "op-1"));
        assert_ne!(k, d.key("iss", "sub", "create_payment", "op-2"));
        assert_ne!(k, d.key("iss", "sub2", "create_payment", "op-1"));
        assert_ne!(k, d.key("iss", "sub", "refund_payment", "op-1"));
        // Delegation: the user is part of the key; an agent on its own keeps its four-part key.
        assert_eq!(k, d.key_for("iss", "sub", None, "create_payment", "op-1"));
        let alice = d.key_for("iss", "sub", Some("alice"), "create_payment", "op-1");
        assert_ne!(k, alice);
        assert_ne!(alice, d.key_for("iss", "sub", Some("bob"), "create_payment", "op-1"));
        assert_ne!(alice, d.key_for("iss", "sub", Some(""), "create_payment", "op-1"));
        // Without length prefixes these two would collide.
        assert_ne!(d.key("a", "bc", "t", "o"), d.key("ab", "c", "t", "o"));
        let other = KeyDeriver::new(Secret::new("other".into()));
        assert_ne!(k, other.key("iss", "sub", "create_payment", "op-1"));
    }

    /// Subkeys sign what replicas and restarts must agree on (URL-elicitation request states,
    /// mandate keys): fixed for a secret and a label, different for another of either, and the
    /// derivation itself pinned (HMAC-SHA256(secret, "subkey\0" ‖ label), computed by Python's hmac).
    #[test]
    fn subkeys_are_pinned_per_secret_and_label() {
        let d = KeyDeriver::new(Secret::new("test-secret-0123456789abcdef0123".into()));
        let label = "passkey registration challenge v1";
        assert_eq!(
            crate::domain::ids::hex(&d.subkey(label)),
            "fef7380ae7730ec15a76741dfe25547c989a200f1fa8a6fb28470e50ff1803b1"
        );
        assert_eq!(d.subkey(label), d.subkey(label));
        assert_ne!(d.subkey(label), d.subkey("another label"));
        assert_ne!(d.subkey(label), KeyDeriver::new(Secret::new("another secret".into())).subkey(label));
        // Never an idempotency key's MAC under the same secret.
        assert!(!d.key("i", "s", "t", "o").contains(&crate::domain::ids::hex(&d.subkey(""))));
    }

    /// A retried refund is one refund only with the same payment, amount and reason; "everything
    /// refundable" (no amount) is not any particular amount.
    #[test]
    fn a_refunds_fingerprint_covers_payment_amount_and_reason() {
        let p1 = crate::domain::ids::PaymentId::parse("pay_1").unwrap();
        let p2 = crate::domain::ids::PaymentId::parse("pay_2").unwrap();
        let reason = Some("damaged".to_string());
        let fp = |p, amount, reason: &Option<String>| call_fingerprint(&refund_args(p, amount, reason), None);
        let base = fp(&p1, Some(500), &reason);
        assert_eq!(base, fp(&p1, Some(500), &reason.clone()));
        for other in [
            fp(&p2, Some(500), &reason),
            fp(&p1, Some(501), &reason),
            fp(&p1, None, &reason),
            fp(&p1, Some(500), &None),
        ] {
            assert_ne!(base, other);
        }
        assert_eq!(
            refund_args(&p1, None, &None),
            serde_json::json!({"payment_id": "pay_1", "amount_minor": null, "reason": null})
        );
    }

    #[test]
    fn the_secret_never_shows_in_debug_output() {
        let d = KeyDeriver::new(Secret::new("s3cret-value".into()));
        assert_eq!(format!("{d:?}"), "KeyDeriver(..)");
    }
}
