//! The webhook outbox (`domain::webhook`): messages written with their events, delivered by the
//! delivery job, every attempt kept.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::domain::webhook::{DeliveryAttempt, OutboxMessage};

/// What one attempt means for its message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttemptOutcome {
    /// The endpoint answered 2xx: delivered, never sent again.
    Delivered,
    /// Not delivered: due again at this time.
    RetryAt(UnixSecs),
    /// Not delivered, and its attempts are used up.
    GiveUp,
}

#[async_trait]
pub trait OutboxStore: Send + Sync {
    /// Pending messages due at `now`, the oldest due first, at most `limit`.
    async fn outbox_due(&self, now: UnixSecs, limit: i64) -> Result<Vec<OutboxMessage>, StoreError>;
    /// Record one attempt and what it means for its message (only while the message is pending:
    /// an attempt recorded twice, by a replica whose lease ended mid-send, changes nothing more).
    async fn outbox_attempted(&self, attempt: DeliveryAttempt, outcome: AttemptOutcome) -> Result<(), StoreError>;
    /// Messages, newest first, of one state when given.
    async fn outbox_list(&self, state: Option<&str>, limit: i64) -> Result<Vec<OutboxMessage>, StoreError>;
    /// One message's attempts, in order.
    async fn outbox_attempts(&self, message_id: &str) -> Result<Vec<DeliveryAttempt>, StoreError>;
    /// An event the gateway records as an audit record only (an integrity failure, a reconciliation
    /// mismatch): the record and its messages in one transaction; the record's seq.
    async fn audit_append_notify(&self, rec: AuditRecord, messages: Vec<OutboxMessage>) -> Result<i64, StoreError>;
}
