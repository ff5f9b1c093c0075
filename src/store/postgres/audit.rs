//! The audit trail (PostgreSQL). A posting appends its audit record in its own transaction
//! (`insert_audit`, `INSERT_AUDIT`).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;

use super::{Cached, Mapped, PostgresStore, bind};
use crate::domain::audit::AuditRecord;
use crate::domain::audit_chain::{ChainHead, Checkpoint, GENESIS, LinkKey, keyed_link_hash, tag_fault};
use crate::domain::error::StoreError;
use crate::domain::webhook::OutboxMessage;
use crate::store::AuditStore;
use crate::store::rows;

pub(super) const INSERT_AUDIT: &str =
    "INSERT INTO audit_records (at, correlation_id, principal_iss, principal_sub, tool, decision, code,
                                                     idempotency_key, payment_id, approval_id, detail, principal_user,
                                                     repeats, policy_version, intent, tag)
                            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16)";

/// Insert one record on its own (not a posting's): its seq.
pub(super) async fn append_audit(c: &impl GenericClient, r: &AuditRecord) -> Result<i64, StoreError> {
    let sql = format!("{INSERT_AUDIT} RETURNING seq");
    Ok(c.one(&sql, &bind(&rows::audit_values(r, None))).await?.get(0))
}

pub(super) async fn insert_audit(
    c: &impl GenericClient,
    r: &AuditRecord,
    payment_id: Option<&str>,
) -> Result<(), StoreError> {
    let n = c.exec(INSERT_AUDIT, &bind(&rows::audit_values(r, payment_id))).await?;
    crate::store::wrote_one("audit record", n)
}

/// Whether record `seq` reads back as `written` (a trigger did not delete or rewrite it in the
/// transaction that wrote it).
pub(super) async fn reads_back(c: &impl GenericClient, seq: i64, written: &AuditRecord) -> Result<bool, StoreError> {
    let sql = format!("SELECT {} FROM audit_records WHERE seq = $1", rows::AUDIT_COLS);
    let stored = c.get(&sql, &[&seq], rows::audit).await?;
    Ok(stored.is_some_and(|s| s == AuditRecord { seq, ..written.clone() }))
}

#[async_trait]
impl AuditStore for PostgresStore {
    async fn audit_append(&self, r: AuditRecord) -> Result<i64, StoreError> {
        let client = self.pool.get().await?;
        append_audit(&client, &r).await
    }

    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {} FROM audit_records WHERE ($1::TEXT IS NULL OR principal_sub = $1) ORDER BY seq DESC LIMIT $2",
            rows::AUDIT_COLS
        );
        client.list(&sql, &[&principal_sub, &i64::from(limit)], rows::audit).await
    }

    async fn audit_seal(&self, key: &LinkKey, limit: u32) -> Result<(u64, ChainHead), StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // One sealing run at a time, whichever replica: the head's row lock.
        tx.exec(
            "INSERT INTO audit_chain_head (id, chain_seq, hash, last_seq, last_xid) VALUES (1, 0, $1, 0, '0')
             ON CONFLICT (id) DO NOTHING",
            &[&GENESIS],
        )
        .await?;
        let head = tx
            .one("SELECT chain_seq, hash, last_seq, last_xid::TEXT FROM audit_chain_head WHERE id = 1 FOR UPDATE", &[])
            .await?;
        let (mut chain_seq, mut prev, mut last_seq, mut last_xid): (i64, String, i64, String) =
            (head.get(0), head.get(1), head.get(2), head.get(3));
        // Records of transactions older than every running one: a set no commit can add to, taken
        // in (xid, seq) order, after the last record sealed.
        let sql = format!(
            "SELECT {}, xid::TEXT FROM audit_records
             WHERE (xid, seq) > ($1::TEXT::xid8, $2) AND xid < pg_snapshot_xmin(pg_current_snapshot())
             ORDER BY xid, seq LIMIT $3",
            rows::AUDIT_COLS
        );
        let found = tx.all(&sql, &[&last_xid, &last_seq, &i64::from(limit)]).await?;
        let mut links: (Vec<i64>, Vec<i64>, Vec<String>, Vec<String>) = Default::default();
        for row in &found {
            let r = rows::audit(row)?;
            if tag_fault(key, &r, true).is_some() {
                // Never sealed: a record without its writer's tag (stripped, forged, or from before
                // tags) stays unsealed, and `audit verify` names it once it is stale.
                tracing::error!(audit.seq = r.seq, "an audit record without its writer's tag is not sealed");
                (last_seq, last_xid) = (r.seq, row.get(rows::AUDIT_COLS.split(',').count()));
                continue;
            }
            chain_seq += 1;
            let hash = keyed_link_hash(key, &prev, chain_seq, &r);
            links.0.push(chain_seq);
            links.1.push(r.seq);
            links.2.push(std::mem::replace(&mut prev, hash.clone()));
            links.3.push(hash);
            (last_seq, last_xid) = (r.seq, row.get(rows::AUDIT_COLS.split(',').count()));
        }
        if !found.is_empty() {
            tx.exec(
                "INSERT INTO audit_chain (chain_seq, seq, prev_hash, hash)
                 SELECT * FROM unnest($1::BIGINT[], $2::BIGINT[], $3::TEXT[], $4::TEXT[])",
                &[&links.0, &links.1, &links.2, &links.3],
            )
            .await?;
            tx.exec(
                "UPDATE audit_chain_head SET chain_seq = $1, hash = $2, last_seq = $3, last_xid = $4::TEXT::xid8
                 WHERE id = 1",
                &[&chain_seq, &prev, &last_seq, &last_xid],
            )
            .await?;
        }
        tx.commit().await?;
        Ok((found.len() as u64, ChainHead { chain_seq, hash: prev }))
    }

    async fn audit_checkpoint_put(
        &self,
        cp: Checkpoint,
        replace: bool,
        messages: Vec<OutboxMessage>,
    ) -> Result<(), StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.exec(
            "INSERT INTO audit_checkpoints (chain_seq, hash, at, jws) VALUES ($1, $2, $3, $4)
             ON CONFLICT (chain_seq) DO UPDATE SET at = excluded.at, jws = excluded.jws
             WHERE $5 AND audit_checkpoints.hash = excluded.hash",
            &[&cp.chain_seq, &cp.hash, &cp.at, &cp.jws, &replace],
        )
        .await?;
        super::outbox::insert_outbox(&tx, &messages).await?;
        tx.commit().await?;
        Ok(())
    }

    async fn audit_checkpoint_drop(&self, chain_seq: i64) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client.exec("DELETE FROM audit_checkpoints WHERE chain_seq = $1", &[&chain_seq]).await?;
        Ok(())
    }

    async fn audit_delete_through(&self, chain_seq: i64) -> Result<u64, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let n = tx
            .exec(
                "DELETE FROM audit_records WHERE seq IN (SELECT seq FROM audit_chain WHERE chain_seq <= $1)",
                &[&chain_seq],
            )
            .await?;
        tx.exec("DELETE FROM audit_chain WHERE chain_seq <= $1", &[&chain_seq]).await?;
        tx.commit().await?;
        Ok(n)
    }
}
