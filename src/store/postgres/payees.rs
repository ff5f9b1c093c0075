//! Payees (PostgreSQL): who each owner may pay as a known payee, and the daily cap's usage.

use async_trait::async_trait;

use super::outbox::insert_outbox;
use super::{Cached, Mapped, PostgresStore};
use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::domain::payee::PayeeRecord;
use crate::domain::webhook::OutboxMessage;
use crate::store::{PayeeStore, rows};

/// Known again (or for the first time) from `known_since`; a payee known already keeps its time.
const ADD_PAYEE: &str =
    "INSERT INTO payees (owner, payee, known_since, added_by, approval_id, tag) VALUES ($1, $2, $3, $4, $5, $6)
     ON CONFLICT (owner, payee) DO UPDATE SET known_since = excluded.known_since,
         added_by = excluded.added_by, approval_id = excluded.approval_id, revoked_at = NULL, revoked_by = NULL,
         tag = excluded.tag
     WHERE payees.revoked_at IS NOT NULL";

#[async_trait]
impl PayeeStore for PostgresStore {
    async fn payee_add(&self, rec: PayeeRecord, notify: Vec<OutboxMessage>) -> Result<bool, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let added = tx
            .exec(ADD_PAYEE, &[&rec.owner, &rec.payee, &rec.known_since, &rec.added_by, &rec.approval_id, &rec.tag])
            .await?
            == 1;
        if added {
            insert_outbox(&tx, &notify).await?;
        }
        tx.commit().await?;
        Ok(added)
    }

    async fn payee_learn(
        &self,
        rec: PayeeRecord,
        mandate_id: &str,
        notify: Vec<OutboxMessage>,
    ) -> Result<bool, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // The mandate's row, share-locked: a revoke waits for this to commit (and then forgets the
        // payee), or came first (and this sees it revoked).
        let live = tx
            .opt("SELECT 1 FROM mandates WHERE id = $1 AND revoked_at IS NULL FOR SHARE", &[&mandate_id])
            .await?
            .is_some();
        let added = live
            && tx
                .exec(ADD_PAYEE, &[&rec.owner, &rec.payee, &rec.known_since, &rec.added_by, &rec.approval_id, &rec.tag])
                .await?
                == 1;
        if added {
            insert_outbox(&tx, &notify).await?;
        }
        tx.commit().await?;
        Ok(added)
    }

    async fn payee_revoke(&self, owner: &str, payee: &str, by: &str, at: UnixSecs) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .exec(
                "UPDATE payees SET revoked_at = $1, revoked_by = $2
                 WHERE owner = $3 AND payee = $4 AND revoked_at IS NULL",
                &[&at, &by, &owner, &payee],
            )
            .await?
            == 1)
    }

    async fn payee_list(&self, owner: Option<&str>, limit: i64) -> Result<Vec<PayeeRecord>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {} FROM payees WHERE $1::TEXT IS NULL OR owner = $1
             ORDER BY known_since DESC, owner, payee LIMIT $2",
            rows::PAYEE_COLS
        );
        Ok(client.list(&sql, &[&owner, &limit], rows::payee).await?)
    }
}
