//! Idempotency records (SQLite). Reserving a key runs the shared rule (`postings::reserve_key`,
//! which a posting also runs inside its own transaction).

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::{Cached, SqliteStore, postings};
use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::domain::idempotency::{NewIdempotencyRecord, Reservation};
use crate::store::IdempotencyStore;

#[async_trait]
impl IdempotencyStore for SqliteStore {
    async fn idem_peek(&self, key: &str, now: UnixSecs) -> Result<Option<(String, Option<String>)>, StoreError> {
        let key = key.to_string();
        self.run(move |c| {
            Ok(c.q_row(
                "SELECT fingerprint, outcome FROM idempotency_records WHERE key = ?1 AND expires_at > ?2",
                params![key, now],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
        })
        .await
    }

    async fn idem_reserve(&self, rec: NewIdempotencyRecord, now: UnixSecs) -> Result<Reservation, StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            let reservation = postings::reserve_key(&tx, &rec, now)?;
            tx.commit()?;
            Ok(reservation)
        })
        .await
    }

    async fn idem_complete(&self, key: &str, outcome: &str) -> Result<(), StoreError> {
        let (key, outcome) = (key.to_string(), outcome.to_string());
        self.write(move |c| {
            c.exec(
                "UPDATE idempotency_records SET state = 'completed', outcome = ?1 WHERE key = ?2 AND state = 'in_flight'",
                params![outcome, key],
            )?;
            Ok(())
        })
        .await
    }

    async fn idem_release(&self, key: &str) -> Result<(), StoreError> {
        let key = key.to_string();
        self.write(move |c| {
            c.exec("DELETE FROM idempotency_records WHERE key = ?1 AND state = 'in_flight'", [key])?;
            Ok(())
        })
        .await
    }

    async fn idem_purge(&self, now: UnixSecs) -> Result<u64, StoreError> {
        self.write(move |c| Ok(c.exec("DELETE FROM idempotency_records WHERE expires_at <= ?1", [now])? as u64)).await
    }
}
