//! Passkeys (SQLite): people's WebAuthn credentials and their signature counters.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params, params_from_iter};

use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::approval::{PasskeyInsert, PasskeyRecord};
use crate::domain::error::StoreError;
use crate::store::{PasskeyStore, rows};

#[async_trait]
impl PasskeyStore for SqliteStore {
    async fn passkey_insert(&self, rec: PasskeyRecord, max: i64) -> Result<PasskeyInsert, StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            let taken = tx
                .q_row("SELECT 1 FROM passkeys WHERE credential_id = ?1", [&rec.credential_id], |r| r.get::<_, i64>(0))
                .optional()?
                .is_some();
            if taken {
                return Ok(PasskeyInsert::Duplicate);
            }
            let live: i64 = tx.q_row(
                "SELECT COUNT(*) FROM passkeys WHERE owner_iss = ?1 AND owner_sub = ?2 AND revoked_at IS NULL",
                params![rec.owner_iss, rec.owner_sub],
                |r| r.get(0),
            )?;
            if live >= max {
                return Ok(PasskeyInsert::TooMany);
            }
            tx.exec(
                &format!(
                    "INSERT INTO passkeys ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                    rows::PASSKEY_COLS
                ),
                params_from_iter(rows::passkey_values(&rec)),
            )?;
            tx.commit()?;
            Ok(PasskeyInsert::Inserted)
        })
        .await
    }

    async fn passkey_get(&self, credential_id: &str) -> Result<Option<PasskeyRecord>, StoreError> {
        let id = credential_id.to_string();
        self.run(move |c| {
            let sql = format!("SELECT {} FROM passkeys WHERE credential_id = ?1", rows::PASSKEY_COLS);
            c.opt(&sql, [id], rows::passkey)
        })
        .await
    }

    async fn passkey_list(&self, owner_iss: &str, owner_sub: &str) -> Result<Vec<PasskeyRecord>, StoreError> {
        let (iss, sub) = (owner_iss.to_string(), owner_sub.to_string());
        self.run(move |c| {
            let sql = format!(
                "SELECT {} FROM passkeys WHERE owner_iss = ?1 AND owner_sub = ?2 ORDER BY created_at DESC, rowid DESC",
                rows::PASSKEY_COLS
            );
            c.all(&sql, params![iss, sub], rows::passkey)
        })
        .await
    }

    async fn passkey_revoke(&self, credential_id: &str, by: &str, at: UnixSecs) -> Result<bool, StoreError> {
        let (id, by) = (credential_id.to_string(), by.to_string());
        self.write(move |c| {
            Ok(c.exec(
                "UPDATE passkeys SET revoked_at = ?1, revoked_by = ?2 WHERE credential_id = ?3 AND revoked_at IS NULL",
                params![at, by, id],
            )? == 1)
        })
        .await
    }

    async fn passkey_count(&self, credential_id: &str, seen: i64, count: i64) -> Result<bool, StoreError> {
        let id = credential_id.to_string();
        self.write(move |c| {
            Ok(c.exec(
                "UPDATE passkeys SET sign_count = ?1
                 WHERE credential_id = ?2 AND sign_count = ?3 AND revoked_at IS NULL",
                params![count, id, seen],
            )? == 1)
        })
        .await
    }
}
