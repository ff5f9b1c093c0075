//! The webhook outbox (PostgreSQL).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;

use super::{Cached, Mapped, PostgresStore};
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::domain::webhook::{DeliveryAttempt, OutboxMessage};
use crate::store::{AttemptOutcome, OutboxStore, rows};

/// Write an event's messages in the event's own transaction.
pub(super) async fn insert_outbox(c: &impl GenericClient, messages: &[OutboxMessage]) -> Result<(), StoreError> {
    for m in messages {
        // Held to its row: a message a trigger swallowed would leave the people it tells
        // uninformed while the change it tells of commits.
        let n = c
            .exec(
                "INSERT INTO webhook_outbox (id, endpoint, event, body, created_at, next_attempt_at)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[&m.id, &m.endpoint, &m.event, &m.body, &m.created_at, &m.next_attempt_at],
            )
            .await?;
        crate::store::wrote_one("webhook message", n)?;
    }
    Ok(())
}

#[async_trait]
impl OutboxStore for PostgresStore {
    async fn outbox_due(&self, now: UnixSecs, limit: i64) -> Result<Vec<OutboxMessage>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {} FROM webhook_outbox WHERE state = 'pending' AND next_attempt_at <= $1
             ORDER BY next_attempt_at, created_at LIMIT $2",
            rows::OUTBOX_COLS
        );
        client.list(&sql, &[&now, &limit], rows::outbox).await
    }

    async fn outbox_attempted(&self, a: DeliveryAttempt, outcome: AttemptOutcome) -> Result<(), StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let (state, next, delivered_at) = match outcome {
            AttemptOutcome::Delivered => ("delivered", None, Some(a.at)),
            AttemptOutcome::RetryAt(t) => ("pending", Some(t), None),
            AttemptOutcome::GiveUp => ("failed", None, None),
        };
        let changed = tx
            .exec(
                "UPDATE webhook_outbox SET state = $1, attempts = attempts + 1,
                        next_attempt_at = COALESCE($2, next_attempt_at), delivered_at = $3, last_status = $4,
                        last_error = $5
                 WHERE id = $6 AND state = 'pending'",
                &[&state, &next, &delivered_at, &a.status, &a.error, &a.message_id],
            )
            .await?;
        if changed == 1 {
            tx.exec(
                "INSERT INTO webhook_attempts (message_id, attempt, at, status, error, duration_ms)
                 VALUES ($1, $2, $3, $4, $5, $6) ON CONFLICT DO NOTHING",
                &[&a.message_id, &a.attempt, &a.at, &a.status, &a.error, &a.duration_ms],
            )
            .await?;
        }
        tx.commit().await?;
        Ok(())
    }

    async fn outbox_list(&self, state: Option<&str>, limit: i64) -> Result<Vec<OutboxMessage>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {} FROM webhook_outbox WHERE $1::TEXT IS NULL OR state = $1 ORDER BY created_at DESC, id LIMIT $2",
            rows::OUTBOX_COLS
        );
        client.list(&sql, &[&state, &limit], rows::outbox).await
    }

    async fn outbox_attempts(&self, message_id: &str) -> Result<Vec<DeliveryAttempt>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!("SELECT {} FROM webhook_attempts WHERE message_id = $1 ORDER BY attempt", rows::ATTEMPT_COLS);
        client.list(&sql, &[&message_id], rows::attempt).await
    }

    async fn audit_append_notify(&self, rec: AuditRecord, messages: Vec<OutboxMessage>) -> Result<i64, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let seq = super::audit::append_audit(&tx, &rec).await?;
        insert_outbox(&tx, &messages).await?;
        tx.commit().await?;
        Ok(seq)
    }
}
