//! Audit records: append-only, one per decision, with the correlation id.

use serde::{Deserialize, Serialize};

use crate::clock::UnixSecs;

/// Audited refusals that count toward a subject's stop rule: policy denials, not argument typos or
/// business outcomes such as insufficient funds.
pub const DENIAL_CODES: &[&str] = &[
    "ACCOUNT_NOT_ALLOWED",
    "INSUFFICIENT_SCOPE",
    "MANDATE_INVALID",
    "MANDATE_EXPIRED",
    "MANDATE_MISMATCH",
    "BUDGET_EXCEEDED",
    "IDEMPOTENCY_CONFLICT",
    // Asking again for what a human rejected.
    "APPROVAL_REJECTED",
];

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRecord {
    pub seq: i64,
    pub at: UnixSecs,
    pub correlation_id: String,
    pub principal_iss: String,
    pub principal_sub: String,
    /// The user the agent acted for (RFC 8693 delegation), if it did.
    #[serde(default)]
    pub principal_user: Option<String>,
    pub tool: String,
    pub decision: String,
    pub code: Option<String>,
    pub idempotency_key: Option<String>,
    pub payment_id: Option<String>,
    pub approval_id: Option<String>,
    pub detail: Option<String>,
    /// How many decisions this record stands for: 1, or a throttled refusal's count (a flood of
    /// RATE_LIMITED answers is one record per interval).
    #[serde(default = "one")]
    pub repeats: i64,
    /// The policy version the decision was made under (records of agents' calls since policies
    /// are versioned; `None` on operators' records and older ones).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub policy_version: Option<i64>,
    /// A money call's intent as policy judged it (canonical JSON of a `domain::policy::Question`):
    /// what `policy simulate` replays.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub intent: Option<String>,
    /// The writer's keyed tag over the record's contents (`domain::audit_chain::record_tag`), set
    /// by the gateway as it writes the record: an edit is named by `audit verify` even before the
    /// record is sealed. `None` on records written before tags (and by tools outside the gateway).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tag: Option<String>,
}

fn one() -> i64 {
    1
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record written before throttled refusals were counted (archives, older rows) stands for
    /// one decision.
    #[test]
    fn a_record_without_a_count_stands_for_one_decision() {
        let r: AuditRecord = serde_json::from_value(serde_json::json!({
            "seq": 7, "at": 1_000, "correlation_id": "c", "principal_iss": "iss", "principal_sub": "agent",
            "tool": "create_payment", "decision": "allowed", "code": null, "idempotency_key": null,
            "payment_id": null, "approval_id": null, "detail": null
        }))
        .unwrap();
        assert_eq!((r.repeats, r.principal_user), (1, None));
    }
}
