//! What operators see of outbound webhooks (`/operator/v1/webhooks`): the outbox's messages and
//! each one's attempts (`domain::webhook`; delivery is `crate::webhooks`').

use serde::Serialize;

use super::approvals_api::OpError;
use super::operator::internal;
use super::{Gateway, Operator};
use crate::catalogue::scopes;
use crate::clock::rfc3339;
use crate::domain::payment::IntegrityReport;
use crate::domain::webhook::{self, DeliveryAttempt, OutboxMessage};
use serde_json::json;

/// Messages one list answers at most.
pub const WEBHOOKS_LISTED_MAX: u32 = 500;

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct WebhookView {
    /// The `webhook-id` of every attempt.
    pub id: String,
    pub endpoint: String,
    pub event: String,
    /// "pending", "delivered" or "failed".
    pub state: String,
    pub attempts: i64,
    pub created_at: String,
    pub next_attempt_at: Option<String>,
    pub delivered_at: Option<String>,
    pub last_status: Option<i64>,
    pub last_error: Option<String>,
    /// The body as sent (and signed).
    pub body: serde_json::Value,
}

fn webhook_view(m: OutboxMessage) -> WebhookView {
    WebhookView {
        next_attempt_at: (m.state == "pending").then(|| rfc3339(m.next_attempt_at)),
        body: serde_json::from_str(&m.body).unwrap_or(serde_json::Value::Null),
        id: m.id,
        endpoint: m.endpoint,
        event: m.event,
        state: m.state,
        attempts: m.attempts,
        created_at: rfc3339(m.created_at),
        delivered_at: m.delivered_at.map(rfc3339),
        last_status: m.last_status,
        last_error: m.last_error,
    }
}

#[derive(Debug, Clone, Serialize, schemars::JsonSchema)]
pub struct AttemptView {
    pub attempt: i64,
    pub at: String,
    pub status: Option<i64>,
    pub error: Option<String>,
    pub duration_ms: i64,
}

fn attempt_view(a: DeliveryAttempt) -> AttemptView {
    AttemptView { attempt: a.attempt, at: rfc3339(a.at), status: a.status, error: a.error, duration_ms: a.duration_ms }
}

impl Gateway {
    /// `integrity.failed`'s messages for a failed scheduled check.
    pub fn integrity_failed_notice(&self, report: &IntegrityReport) -> Vec<OutboxMessage> {
        self.notice(webhook::INTEGRITY_FAILED).messages(json!({
            "problems": report.problems,
            "checked_postings": report.postings_checked,
            "mode": report.mode,
        }))
    }

    /// `reconciliation.mismatch`'s messages for a run that found problems (none for a clean run).
    pub fn reconciliation_notice(&self, report: &super::ReconcileReport, detail: Option<&str>) -> Vec<OutboxMessage> {
        match report.problems() {
            0 => vec![],
            n => self.notice(webhook::RECONCILIATION_MISMATCH).messages(json!({
                "problems": n,
                "checked": report.checked,
                "report": detail.and_then(|d| serde_json::from_str::<serde_json::Value>(d).ok()),
            })),
        }
    }

    /// Webhook messages, newest first, of one state when given.
    pub async fn ops_webhooks(
        &self,
        op: &Operator,
        state: Option<&str>,
        limit: Option<u32>,
    ) -> Result<Vec<WebhookView>, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        if let Some(s) = state
            && !["pending", "delivered", "failed"].contains(&s)
        {
            return Err(OpError::invalid("state must be pending, delivered or failed".into()));
        }
        let limit = super::payees::listed(limit, WEBHOOKS_LISTED_MAX)?;
        let rows = self.store.outbox_list(state, i64::from(limit)).await.map_err(internal("webhook list"))?;
        Ok(rows.into_iter().map(webhook_view).collect())
    }

    /// One message's attempts, in order.
    pub async fn ops_webhook_attempts(&self, op: &Operator, id: &str) -> Result<Vec<AttemptView>, OpError> {
        self.require_op(op, &[scopes::AUDIT, scopes::ADMIN])?;
        if id.is_empty() || id.len() > 64 {
            return Err(OpError::missing("webhook message"));
        }
        let rows = self.store.outbox_attempts(id).await.map_err(internal("webhook attempts"))?;
        Ok(rows.into_iter().map(attempt_view).collect())
    }
}
