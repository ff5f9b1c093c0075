//! Outbound notifications (Standard Webhooks): the events a human should hear about, as messages in
//! a durable outbox written in the same transaction as the event itself, one per subscribed
//! endpoint, each with a stable id (`webhook-id`) that every retry repeats so receivers can
//! de-duplicate. Pure: the payloads and the retry schedule; delivery is `crate::webhooks`'.

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::clock::{UnixSecs, rfc3339};
use crate::domain::approval::ApprovalRecord;
use crate::domain::money::format_minor;

pub const APPROVAL_REQUESTED: &str = "approval.requested";
pub const APPROVAL_DECIDED: &str = "approval.decided";
pub const PRINCIPAL_SUSPENDED: &str = "principal.suspended";
pub const INTEGRITY_FAILED: &str = "integrity.failed";
pub const RECONCILIATION_MISMATCH: &str = "reconciliation.mismatch";
pub const PAYEE_ADDED: &str = "payee.added";
pub const PASSKEY_REGISTERED: &str = "passkey.registered";
/// Each signed audit checkpoint (`audit_chain::checkpoint_data`): a witness outside the database
/// keeps the newest and hands it to `paygate audit verify --expect`.
pub const AUDIT_CHECKPOINT: &str = "audit.checkpoint";

/// Every event a webhook endpoint may subscribe to.
pub const EVENTS: &[&str] = &[
    APPROVAL_REQUESTED,
    APPROVAL_DECIDED,
    PRINCIPAL_SUSPENDED,
    INTEGRITY_FAILED,
    RECONCILIATION_MISMATCH,
    PAYEE_ADDED,
    PASSKEY_REGISTERED,
    AUDIT_CHECKPOINT,
];

/// One delivery to one endpoint, as the outbox keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct OutboxMessage {
    /// `msg_…`: the `webhook-id` of every attempt.
    pub id: String,
    /// The endpoint's name (config).
    pub endpoint: String,
    pub event: String,
    /// The exact body sent (and signed): `{"type", "timestamp", "data"}`.
    pub body: String,
    pub created_at: UnixSecs,
    /// "pending", "delivered" or "failed" (attempts used up).
    pub state: String,
    pub attempts: i64,
    pub next_attempt_at: UnixSecs,
    pub delivered_at: Option<UnixSecs>,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
}

/// One attempt at delivering a message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeliveryAttempt {
    pub message_id: String,
    pub attempt: i64,
    pub at: UnixSecs,
    /// The endpoint's HTTP status, if it answered.
    pub status: Option<i64>,
    /// Why it failed (the gateway's words: a timeout, a refused connection, a non-2xx status).
    pub error: Option<String>,
    pub duration_ms: i64,
}

/// Who hears about an event: the endpoints subscribed to it, and when it happened. No endpoint:
/// nothing is written.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Notice {
    pub event: &'static str,
    pub endpoints: Vec<String>,
    pub at: UnixSecs,
}

impl Notice {
    /// The event's messages, one per endpoint, with `data` as the payload.
    pub fn messages(&self, data: Value) -> Vec<OutboxMessage> {
        if self.endpoints.is_empty() {
            return vec![];
        }
        let body = json!({"type": self.event, "timestamp": rfc3339(self.at), "data": data}).to_string();
        self.endpoints
            .iter()
            .map(|endpoint| OutboxMessage {
                id: format!("msg_{}", uuid::Uuid::new_v4().simple()),
                endpoint: endpoint.clone(),
                event: self.event.to_string(),
                body: body.clone(),
                created_at: self.at,
                state: "pending".into(),
                attempts: 0,
                next_attempt_at: self.at,
                delivered_at: None,
                last_status: None,
                last_error: None,
            })
            .collect()
    }
}

/// An approval as an event's payload: what a human needs to open and decide it. Never the mandate.
pub fn approval_data(a: &ApprovalRecord, url: &str) -> Value {
    json!({
        "approval_id": a.id,
        "status": a.status.as_str(),
        "tool": a.tool,
        "agent_subject": a.principal_sub,
        "user": a.principal_user,
        "amount": format_minor(a.amount_minor, a.currency),
        "currency": a.currency,
        "payee": a.intent.get("payee"),
        "reason": a.reason,
        "approver": a.approver.as_str(),
        "reviewers_required": a.reviewers_required,
        "expires_at": rfc3339(a.expires_at),
        "decision_reason": a.decision_reason,
        "approval_url": url,
    })
}

/// The signing key of a Standard Webhooks secret: the base64 after `whsec_`, 24 to 64 bytes.
pub fn key(secret: &str) -> Option<Vec<u8>> {
    use base64::Engine as _;
    let b64 = secret.strip_prefix("whsec_")?;
    let key = base64::engine::general_purpose::STANDARD.decode(b64).ok()?;
    (24..=64).contains(&key.len()).then_some(key)
}

/// When attempt `attempts + 1` is due after `attempts` failures: exponential from `initial_secs`,
/// capped at `max_secs`.
pub fn next_attempt(now: UnixSecs, attempts: i64, initial_secs: i64, max_secs: i64) -> UnixSecs {
    let exp = attempts.clamp(0, 30) as u32;
    let wait = initial_secs.saturating_mul(1_i64 << exp.min(40)).min(max_secs);
    now + wait.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_message_per_endpoint_with_the_same_body_and_its_own_id() {
        let n = Notice { event: PAYEE_ADDED, endpoints: vec!["ops".into(), "audit".into()], at: 0 };
        let m = n.messages(json!({"payee": "acct-B"}));
        assert_eq!(m.len(), 2);
        assert_eq!(m[0].body, m[1].body);
        assert_ne!(m[0].id, m[1].id);
        let body: Value = serde_json::from_str(&m[0].body).unwrap_or_default();
        assert_eq!((body["type"].as_str(), body["data"]["payee"].as_str()), (Some("payee.added"), Some("acct-B")));
        assert!(Notice::default().messages(json!({})).is_empty(), "no endpoint, nothing written");
    }

    /// What a human needs to open and decide the approval, and never its mandate.
    #[test]
    fn an_approval_event_carries_the_decision_page_never_the_mandate() {
        let mut a = crate::domain::approval::sample_record();
        a.intent["payee"] = json!("acct-B");
        a.mandate = Some("eyJhbGciOi.secret.mandate".into());
        let data = approval_data(&a, "https://gw/approvals/apr_1");
        assert_eq!(
            (data["approval_id"].as_str(), data["amount"].as_str(), data["payee"].as_str()),
            (Some("apr_1"), Some("5000.00"), Some("acct-B"))
        );
        assert_eq!(data["approval_url"], "https://gw/approvals/apr_1");
        assert!(!data.to_string().contains("secret.mandate"), "{data}");
    }

    #[test]
    fn retries_back_off_exponentially_up_to_the_cap() {
        let waits: Vec<i64> = (0..8).map(|a| next_attempt(100, a, 5, 60) - 100).collect();
        assert_eq!(waits, vec![5, 10, 20, 40, 60, 60, 60, 60]);
        assert_eq!(next_attempt(0, 1_000, 5, 3_600), 3_600, "no overflow however many attempts");
    }
}
