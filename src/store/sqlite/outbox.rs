//! The webhook outbox (SQLite).

use async_trait::async_trait;
use rusqlite::{Connection, params};

use super::audit::insert_audit;
use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::domain::webhook::{DeliveryAttempt, OutboxMessage};
use crate::store::{AttemptOutcome, OutboxStore, rows};

/// Write an event's messages in the event's own transaction.
pub(super) fn insert_outbox(tx: &Connection, messages: &[OutboxMessage]) -> rusqlite::Result<()> {
    for m in messages {
        // Held to its row (`Cached::exec_one`): a message a trigger swallowed would leave the
        // people it tells uninformed while the change it tells of commits.
        tx.exec_one(
            "INSERT INTO webhook_outbox (id, endpoint, event, body, created_at, next_attempt_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![m.id, m.endpoint, m.event, m.body, m.created_at, m.next_attempt_at],
        )?;
    }
    Ok(())
}

#[async_trait]
impl OutboxStore for SqliteStore {
    async fn outbox_due(&self, now: UnixSecs, limit: i64) -> Result<Vec<OutboxMessage>, StoreError> {
        self.run(move |c| {
            let sql = format!(
                "SELECT {} FROM webhook_outbox WHERE state = 'pending' AND next_attempt_at <= ?1
                 ORDER BY next_attempt_at, created_at LIMIT ?2",
                rows::OUTBOX_COLS
            );
            c.all(&sql, params![now, limit], rows::outbox)
        })
        .await
    }

    async fn outbox_attempted(&self, a: DeliveryAttempt, outcome: AttemptOutcome) -> Result<(), StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            let (state, next, delivered_at) = match outcome {
                AttemptOutcome::Delivered => ("delivered", None, Some(a.at)),
                AttemptOutcome::RetryAt(t) => ("pending", Some(t), None),
                AttemptOutcome::GiveUp => ("failed", None, None),
            };
            let changed = tx.exec(
                "UPDATE webhook_outbox SET state = ?1, attempts = attempts + 1,
                        next_attempt_at = COALESCE(?2, next_attempt_at), delivered_at = ?3, last_status = ?4,
                        last_error = ?5
                 WHERE id = ?6 AND state = 'pending'",
                params![state, next, delivered_at, a.status, a.error, a.message_id],
            )?;
            if changed == 1 {
                tx.exec(
                    "INSERT OR IGNORE INTO webhook_attempts (message_id, attempt, at, status, error, duration_ms)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![a.message_id, a.attempt, a.at, a.status, a.error, a.duration_ms],
                )?;
            }
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn outbox_list(&self, state: Option<&str>, limit: i64) -> Result<Vec<OutboxMessage>, StoreError> {
        let state = state.map(str::to_string);
        self.run(move |c| {
            let sql = format!(
                "SELECT {} FROM webhook_outbox WHERE ?1 IS NULL OR state = ?1 ORDER BY created_at DESC, id LIMIT ?2",
                rows::OUTBOX_COLS
            );
            c.all(&sql, params![state, limit], rows::outbox)
        })
        .await
    }

    async fn outbox_attempts(&self, message_id: &str) -> Result<Vec<DeliveryAttempt>, StoreError> {
        let id = message_id.to_string();
        self.run(move |c| {
            let sql =
                format!("SELECT {} FROM webhook_attempts WHERE message_id = ?1 ORDER BY attempt", rows::ATTEMPT_COLS);
            c.all(&sql, params![id], rows::attempt)
        })
        .await
    }

    async fn audit_append_notify(&self, rec: AuditRecord, messages: Vec<OutboxMessage>) -> Result<i64, StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            let seq = insert_audit(&tx, &rec, None)?;
            insert_outbox(&tx, &messages)?;
            tx.commit()?;
            Ok(seq)
        })
        .await
    }
}
