//! Passkeys (PostgreSQL): people's WebAuthn credentials and their signature counters.

use async_trait::async_trait;

use super::{Cached, Mapped, PostgresStore, bind};
use crate::clock::UnixSecs;
use crate::domain::approval::{PasskeyInsert, PasskeyRecord};
use crate::domain::error::StoreError;
use crate::store::{PasskeyStore, rows};

#[async_trait]
impl PasskeyStore for PostgresStore {
    async fn passkey_insert(&self, rec: PasskeyRecord, max: i64) -> Result<PasskeyInsert, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // One person's concurrent registrations serialise here (the count below holds).
        tx.exec(
            "SELECT pg_advisory_xact_lock(hashtextextended('passkey:' || $1 || ' ' || $2, 0))",
            &[&rec.owner_iss, &rec.owner_sub],
        )
        .await?;
        let live: i64 = tx
            .one(
                "SELECT COUNT(*) FROM passkeys WHERE owner_iss = $1 AND owner_sub = $2 AND revoked_at IS NULL",
                &[&rec.owner_iss, &rec.owner_sub],
            )
            .await?
            .get(0);
        if live >= max {
            return Ok(PasskeyInsert::TooMany);
        }
        let inserted = tx
            .exec(
                &format!(
                    "INSERT INTO passkeys ({}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                     ON CONFLICT (credential_id) DO NOTHING",
                    rows::PASSKEY_COLS
                ),
                &bind(&rows::passkey_values(&rec)),
            )
            .await?;
        tx.commit().await?;
        Ok(if inserted == 1 { PasskeyInsert::Inserted } else { PasskeyInsert::Duplicate })
    }

    async fn passkey_get(&self, credential_id: &str) -> Result<Option<PasskeyRecord>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!("SELECT {} FROM passkeys WHERE credential_id = $1", rows::PASSKEY_COLS);
        Ok(client.get(&sql, &[&credential_id], rows::passkey).await?)
    }

    async fn passkey_list(&self, owner_iss: &str, owner_sub: &str) -> Result<Vec<PasskeyRecord>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {} FROM passkeys WHERE owner_iss = $1 AND owner_sub = $2 ORDER BY created_at DESC, credential_id",
            rows::PASSKEY_COLS
        );
        Ok(client.list(&sql, &[&owner_iss, &owner_sub], rows::passkey).await?)
    }

    async fn passkey_revoke(&self, credential_id: &str, by: &str, at: UnixSecs) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .exec(
                "UPDATE passkeys SET revoked_at = $1, revoked_by = $2 WHERE credential_id = $3 AND revoked_at IS NULL",
                &[&at, &by, &credential_id],
            )
            .await?
            == 1)
    }

    async fn passkey_count(&self, credential_id: &str, seen: i64, count: i64) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .exec(
                "UPDATE passkeys SET sign_count = $1 WHERE credential_id = $2 AND sign_count = $3 AND revoked_at IS NULL",
                &[&count, &credential_id, &seen],
            )
            .await?
            == 1)
    }
}
