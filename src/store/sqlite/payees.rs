//! Payees (SQLite): who each owner may pay as a known payee, and the daily cap's usage.

use async_trait::async_trait;
use rusqlite::{OptionalExtension as _, params};

use super::outbox::insert_outbox;
use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::domain::payee::PayeeRecord;
use crate::domain::webhook::OutboxMessage;
use crate::store::{PayeeStore, rows};

/// Known again (or for the first time) from `known_since`; a payee known already keeps its time.
pub(super) const ADD_PAYEE: &str = "INSERT INTO payees (owner, payee, known_since, added_by, approval_id, tag)
     VALUES (?1, ?2, ?3, ?4, ?5, ?6)
     ON CONFLICT (owner, payee) DO UPDATE SET known_since = excluded.known_since, added_by = excluded.added_by,
         approval_id = excluded.approval_id, revoked_at = NULL, revoked_by = NULL, tag = excluded.tag
     WHERE payees.revoked_at IS NOT NULL";

#[async_trait]
impl PayeeStore for SqliteStore {
    async fn payee_add(&self, rec: PayeeRecord, notify: Vec<OutboxMessage>) -> Result<bool, StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            let added = tx.exec(
                ADD_PAYEE,
                params![rec.owner, rec.payee, rec.known_since, rec.added_by, rec.approval_id, rec.tag],
            )? == 1;
            if added {
                insert_outbox(&tx, &notify)?;
            }
            tx.commit()?;
            Ok(added)
        })
        .await
    }

    async fn payee_learn(
        &self,
        rec: PayeeRecord,
        mandate_id: &str,
        notify: Vec<OutboxMessage>,
    ) -> Result<bool, StoreError> {
        let mandate_id = mandate_id.to_string();
        // One writer: the mandate's state read here cannot change before this commits.
        self.write(move |c| {
            let tx = c.savepoint()?;
            let live: Option<i64> = tx
                .q_row("SELECT 1 FROM mandates WHERE id = ?1 AND revoked_at IS NULL", [&mandate_id], |r| r.get(0))
                .optional()?;
            let added = live.is_some()
                && tx.exec(
                    ADD_PAYEE,
                    params![rec.owner, rec.payee, rec.known_since, rec.added_by, rec.approval_id, rec.tag],
                )? == 1;
            if added {
                insert_outbox(&tx, &notify)?;
            }
            tx.commit()?;
            Ok(added)
        })
        .await
    }

    async fn payee_revoke(&self, owner: &str, payee: &str, by: &str, at: UnixSecs) -> Result<bool, StoreError> {
        let (owner, payee, by) = (owner.to_string(), payee.to_string(), by.to_string());
        self.write(move |c| {
            Ok(c.exec(
                "UPDATE payees SET revoked_at = ?1, revoked_by = ?2
                 WHERE owner = ?3 AND payee = ?4 AND revoked_at IS NULL",
                params![at, by, owner, payee],
            )? == 1)
        })
        .await
    }

    async fn payee_list(&self, owner: Option<&str>, limit: i64) -> Result<Vec<PayeeRecord>, StoreError> {
        let owner = owner.map(str::to_string);
        self.run(move |c| {
            let sql = format!(
                "SELECT {} FROM payees WHERE ?1 IS NULL OR owner = ?1 ORDER BY known_since DESC, owner, payee LIMIT ?2",
                rows::PAYEE_COLS
            );
            c.all(&sql, params![owner, limit], rows::payee)
        })
        .await
    }
}
