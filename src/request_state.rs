//! The sealed `requestState` of an approval resumed through URL-mode elicitation (MCP 2026-07-28).
//!
//! A payment that needs a human answers a client that declared URL elicitation with an
//! `input_required` result: "open this page" plus a `requestState` the client echoes on its retry.
//! The spec makes that state attacker-controlled input, so it is sealed here:
//!
//! `v1.<base64url(payload)>.<base64url(HMAC-SHA256(key, binding ‖ payload))>`
//!
//! - the payload names the approval, an expiry (checked against the gateway's clock, not the wall
//!   clock) and the round;
//! - the binding, length-prefixed and never sent, is (issuer, subject, tool, operation_id,
//!   fingerprint of the arguments): a state opens only for the same agent repeating the same call;
//! - the key is a subkey of the idempotency secret, so replicas that share that secret open each
//!   other's states and no other use of the secret can produce one.
//!
//! A state is not single-use and need not be: it only ever leads to the approval's own closed
//! mandate, which pays exactly once (its key is anchored on the mandate).

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::Sha256;

use crate::clock::UnixSecs;

/// The subkey's label (domain separation from idempotency keys and anything else derived later).
pub const KEY_LABEL: &str = "paygate/request-state/v1";
/// Longest `requestState` opened, in bytes: anything longer is refused before decoding.
pub const STATE_BYTES_MAX: usize = 1024;
const PREFIX: &str = "v1.";

/// What the sealed state says.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ApprovalState {
    /// The approval id (apr_…).
    pub apr: String,
    /// Unix seconds after which the state no longer opens.
    pub exp: UnixSecs,
    /// The round: 1 when the page was first offered, +1 per retry answered while pending.
    pub n: u32,
}

/// Who may present a state, for which call.
#[derive(Debug, Clone, Copy)]
pub struct Binding<'a> {
    pub issuer: &'a str,
    pub subject: &'a str,
    /// The user the agent acts for (delegation), if it does: a state sealed for the agent acting for
    /// one person does not open for it acting for another, or on its own.
    pub user: Option<&'a str>,
    pub tool: &'a str,
    pub operation_id: &'a str,
    /// [`args_fingerprint`] of the call's arguments.
    pub args: &'a str,
}

/// Why a state did not open. Callers answer every one the same way (refused, nothing moves);
/// the distinction is for logs and tests.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum OpenError {
    #[error("malformed")]
    Malformed,
    /// A wrong MAC: forged, altered, or sealed for another agent, tool, operation or arguments.
    #[error("not sealed by this gateway for this call")]
    Forged,
    #[error("expired")]
    Expired,
}

/// Seals and opens states. Holds the subkey (never printed).
#[derive(Clone)]
pub struct StateSealer {
    key: [u8; 32],
}

impl std::fmt::Debug for StateSealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("StateSealer(..)")
    }
}

impl StateSealer {
    pub fn new(key: [u8; 32]) -> Self {
        StateSealer { key }
    }

    fn mac(&self, binding: &Binding<'_>, payload: &[u8]) -> Hmac<Sha256> {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.key)
            .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
        let parts = [binding.issuer, binding.subject, binding.tool, binding.operation_id, binding.args];
        // The user, when there is one, is a sixth length-prefixed part (the payload that follows is
        // JSON, which never starts with a length prefix's zero bytes).
        for part in parts.into_iter().chain(binding.user) {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac.update(payload);
        mac
    }

    pub fn seal(&self, binding: &Binding<'_>, state: &ApprovalState) -> String {
        let payload = serde_json::to_vec(state).unwrap_or_else(|_| unreachable!("the state is plain data"));
        let tag = self.mac(binding, &payload).finalize().into_bytes();
        format!("{PREFIX}{}.{}", URL_SAFE_NO_PAD.encode(&payload), URL_SAFE_NO_PAD.encode(tag))
    }

    /// The state, if this gateway sealed it for exactly this call and it has not expired at `now`.
    pub fn open(&self, binding: &Binding<'_>, sealed: &str, now: UnixSecs) -> Result<ApprovalState, OpenError> {
        if sealed.len() > STATE_BYTES_MAX {
            return Err(OpenError::Malformed);
        }
        let body = sealed.strip_prefix(PREFIX).ok_or(OpenError::Malformed)?;
        let (payload, tag) = body.split_once('.').ok_or(OpenError::Malformed)?;
        let payload = URL_SAFE_NO_PAD.decode(payload).map_err(|_| OpenError::Malformed)?;
        let tag = URL_SAFE_NO_PAD.decode(tag).map_err(|_| OpenError::Malformed)?;
        // Verify before parsing: nothing unauthenticated is interpreted.
        self.mac(binding, &payload).verify_slice(&tag).map_err(|_| OpenError::Forged)?;
        let state: ApprovalState = serde_json::from_slice(&payload).map_err(|_| OpenError::Malformed)?;
        if now >= state.exp {
            return Err(OpenError::Expired);
        }
        Ok(state)
    }
}

/// A fingerprint of a call's arguments that does not depend on key order.
pub fn args_fingerprint(args: &serde_json::Map<String, serde_json::Value>) -> String {
    fn canonical(v: &serde_json::Value) -> serde_json::Value {
        match v {
            serde_json::Value::Object(m) => {
                let sorted: std::collections::BTreeMap<_, _> =
                    m.iter().map(|(k, v)| (k.clone(), canonical(v))).collect();
                serde_json::Value::Object(sorted.into_iter().collect())
            }
            serde_json::Value::Array(a) => serde_json::Value::Array(a.iter().map(canonical).collect()),
            other => other.clone(),
        }
    }
    crate::idempotency::fingerprint(&canonical(&serde_json::Value::Object(args.clone())))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding<'a>(sub: &'a str, op: &'a str, args: &'a str) -> Binding<'a> {
        Binding { issuer: "paygate-dev", subject: sub, user: None, tool: "create_payment", operation_id: op, args }
    }

    fn state() -> ApprovalState {
        ApprovalState { apr: "apr_1".into(), exp: 1_000, n: 1 }
    }

    #[test]
    fn a_state_opens_for_the_call_it_was_sealed_for_until_it_expires() {
        let s = StateSealer::new([7; 32]);
        let b = binding("agent", "op-1", "fp");
        let sealed = s.seal(&b, &state());
        assert_eq!(s.open(&b, &sealed, 999), Ok(state()));
        assert_eq!(s.open(&b, &sealed, 1_000), Err(OpenError::Expired));
    }

    #[test]
    fn another_agent_operation_tool_arguments_or_key_cannot_open_it() {
        let s = StateSealer::new([7; 32]);
        let b = binding("agent", "op-1", "fp");
        let sealed = s.seal(&b, &state());
        for other in [binding("mallory", "op-1", "fp"), binding("agent", "op-2", "fp"), binding("agent", "op-1", "fp2")]
        {
            assert_eq!(s.open(&other, &sealed, 0), Err(OpenError::Forged));
        }
        let mut other_tool = b;
        other_tool.tool = "refund_payment";
        assert_eq!(s.open(&other_tool, &sealed, 0), Err(OpenError::Forged));
        // Length prefixes: moving a character between fields is another binding.
        let shifted = Binding { subject: "agentop", operation_id: "-1", ..b };
        assert_eq!(s.open(&shifted, &sealed, 0), Err(OpenError::Forged));
        assert_eq!(StateSealer::new([8; 32]).open(&b, &sealed, 0), Err(OpenError::Forged));
        // Delegation: the agent acting for a user is another binding than on its own, or for another.
        let for_alice = Binding { user: Some("alice"), ..b };
        assert_eq!(s.open(&for_alice, &sealed, 0), Err(OpenError::Forged));
        let sealed_for_alice = s.seal(&for_alice, &state());
        assert_eq!(s.open(&for_alice, &sealed_for_alice, 0), Ok(state()));
        assert_eq!(s.open(&Binding { user: Some("bob"), ..b }, &sealed_for_alice, 0), Err(OpenError::Forged));
        assert_eq!(s.open(&b, &sealed_for_alice, 0), Err(OpenError::Forged));
    }

    #[test]
    fn an_altered_payload_or_garbage_is_refused() {
        let s = StateSealer::new([7; 32]);
        let b = binding("agent", "op-1", "fp");
        let sealed = s.seal(&b, &state());
        // Swap in a payload naming another approval with a later expiry, keeping the tag.
        let forged_payload = URL_SAFE_NO_PAD.encode(br#"{"apr":"apr_2","exp":99999999,"n":1}"#);
        let tag = sealed.rsplit('.').next().unwrap();
        assert_eq!(s.open(&b, &format!("v1.{forged_payload}.{tag}"), 0), Err(OpenError::Forged));
        for junk in ["", "v1.", "v1.a.b", "v2.abc.def", "not a state", &"x".repeat(STATE_BYTES_MAX + 1)] {
            assert!(s.open(&b, junk, 0).is_err(), "{junk:?}");
        }
    }

    /// The size bound holds for authentic states too: the longest seal that fits opens, one that
    /// does not is refused unread. (A seal is never exactly `STATE_BYTES_MAX` long: with the
    /// prefix, the dot and the 43-byte tag that needs a base64 payload of 4k+1 characters, which no
    /// byte string encodes to, so `>` and `>=` at the bound are one rule.)
    #[test]
    fn an_authentic_state_over_the_size_bound_is_refused_unread() {
        let s = StateSealer::new([7; 32]);
        let b = binding("agent", "op-1", "fp");
        let (mut fitted, mut over) = (None, None);
        for pad in 0..STATE_BYTES_MAX {
            let state = ApprovalState { apr: format!("apr_{}", "x".repeat(pad)), exp: 1_000, n: 1 };
            let sealed = s.seal(&b, &state);
            if sealed.len() <= STATE_BYTES_MAX {
                assert_eq!(s.open(&b, &sealed, 0), Ok(state));
                fitted = Some(sealed.len());
            } else {
                assert_eq!(s.open(&b, &sealed, 0), Err(OpenError::Malformed), "{} bytes", sealed.len());
                over = Some(sealed.len());
                break;
            }
        }
        assert_eq!((fitted, over), (Some(STATE_BYTES_MAX - 1), Some(STATE_BYTES_MAX + 1)));
    }

    #[test]
    fn the_key_never_shows_in_debug_output() {
        assert_eq!(format!("{:?}", StateSealer::new([7; 32])), "StateSealer(..)");
    }

    #[test]
    fn the_fingerprint_ignores_key_order_but_not_values() {
        let a: serde_json::Map<_, _> =
            serde_json::from_str(r#"{"amount":"5000.00","to":{"b":1,"a":2},"op":"x"}"#).unwrap();
        let b: serde_json::Map<_, _> =
            serde_json::from_str(r#"{"op":"x","to":{"a":2,"b":1},"amount":"5000.00"}"#).unwrap();
        let c: serde_json::Map<_, _> =
            serde_json::from_str(r#"{"op":"x","to":{"a":2,"b":1},"amount":"5000.01"}"#).unwrap();
        assert_eq!(args_fingerprint(&a), args_fingerprint(&b));
        assert_ne!(args_fingerprint(&a), args_fingerprint(&c));
    }
}
