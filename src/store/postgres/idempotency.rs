//! Idempotency records (PostgreSQL). Reserving a key runs the shared rule (`reserve_key`, which a
//! posting also runs inside its own transaction).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;

use super::{Cached, PostgresStore};
use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::domain::idempotency::{NewIdempotencyRecord, Reservation};
use crate::domain::rules::reservation::{self, ReserveStep};
use crate::store::IdempotencyStore;
use crate::store::rows;

impl PostgresStore {
    /// One statement inserts the record or locks the existing one: `ON CONFLICT DO UPDATE` never
    /// reports a conflict with a row that a concurrent release deleted (a plain `DO NOTHING` followed
    /// by a `SELECT` can find the row gone, and a herd of waiters on a hot key would keep finding that).
    async fn reserve_locked(&self, rec: &NewIdempotencyRecord, now: UnixSecs) -> Result<Reservation, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let reservation = reserve_key(&tx, rec, now).await?;
        tx.commit().await?;
        Ok(reservation)
    }
}

/// Reserve one idempotency key (`domain::rules::reservation::decide`) in the caller's transaction;
/// the key's row stays locked until it ends.
pub(super) async fn reserve_key(
    tx: &impl GenericClient,
    rec: &NewIdempotencyRecord,
    now: UnixSecs,
) -> Result<Reservation, StoreError> {
    {
        let row = tx
            .one(
                "INSERT INTO idempotency_records
                   (key, fingerprint, tool, principal_iss, principal_sub, state, outcome, lease_until, created_at, expires_at)
                 VALUES ($1, $2, $3, $4, $5, 'in_flight', NULL, $6, $7, $8)
                 ON CONFLICT (key) DO UPDATE SET key = idempotency_records.key
                 RETURNING (xmax = 0), fingerprint, state, outcome, lease_until, expires_at",
                &[&rec.key, &rec.fingerprint, &rec.tool, &rec.principal_iss, &rec.principal_sub, &rec.lease_until, &now, &rec.expires_at],
            )
            .await?;
        let inserted: bool = row.get(0);
        let reservation = if inserted {
            Reservation::Acquired
        } else {
            let step = reservation::decide(Some(rows::idempotency(&row, 1)?), &rec.fingerprint, now)?;
            // The key's record is what holds the operation (for a rail's shared key, the only
            // thing that does): a write a trigger swallowed is no reservation.
            match &step {
                ReserveStep::Claim => {
                    let n = tx.exec(
                        "UPDATE idempotency_records SET fingerprint = $2, tool = $3, principal_iss = $4, principal_sub = $5,
                                state = 'in_flight', outcome = NULL, lease_until = $6, created_at = $7, expires_at = $8 WHERE key = $1",
                        &[&rec.key, &rec.fingerprint, &rec.tool, &rec.principal_iss, &rec.principal_sub, &rec.lease_until, &now, &rec.expires_at],
                    )
                    .await?;
                    crate::store::wrote_one("idempotency record", n)?;
                }
                ReserveStep::TakeOver => {
                    let n = tx
                        .exec(
                            "UPDATE idempotency_records SET lease_until = $1 WHERE key = $2",
                            &[&rec.lease_until, &rec.key],
                        )
                        .await?;
                    crate::store::wrote_one("idempotency record", n)?;
                }
                ReserveStep::Found(_) => {}
            }
            step.reservation()
        };
        Ok(reservation)
    }
}

#[async_trait]
impl IdempotencyStore for PostgresStore {
    async fn idem_peek(&self, key: &str, now: UnixSecs) -> Result<Option<(String, Option<String>)>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .opt(
                "SELECT fingerprint, outcome FROM idempotency_records WHERE key = $1 AND expires_at > $2",
                &[&key, &now],
            )
            .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    async fn idem_reserve(&self, rec: NewIdempotencyRecord, now: UnixSecs) -> Result<Reservation, StoreError> {
        self.reserve_locked(&rec, now).await
    }

    async fn idem_complete(&self, key: &str, outcome: &str) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client
            .exec(
                "UPDATE idempotency_records SET state = 'completed', outcome = $1 WHERE key = $2 AND state = 'in_flight'",
                &[&outcome, &key],
            )
            .await?;
        Ok(())
    }

    async fn idem_release(&self, key: &str) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client.exec("DELETE FROM idempotency_records WHERE key = $1 AND state = 'in_flight'", &[&key]).await?;
        Ok(())
    }

    async fn idem_purge(&self, now: UnixSecs) -> Result<u64, StoreError> {
        let client = self.pool.get().await?;
        Ok(client.exec("DELETE FROM idempotency_records WHERE expires_at <= $1", &[&now]).await?)
    }
}
