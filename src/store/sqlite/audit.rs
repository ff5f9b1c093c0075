//! The audit trail (SQLite). A posting appends its audit record in its own transaction
//! (`insert_audit`).

use async_trait::async_trait;
use rusqlite::{Connection, params, params_from_iter};

use super::{Cached, SqliteStore};
use crate::domain::audit::AuditRecord;
use crate::domain::audit_chain::{ChainHead, Checkpoint, GENESIS, LinkKey, keyed_link_hash, tag_fault};
use crate::domain::error::StoreError;
use crate::domain::webhook::OutboxMessage;
use crate::store::AuditStore;
use crate::store::rows;

/// Insert one record; its seq.
/// Insert one record: its seq, as the insert returns it (a record a trigger swallowed returns
/// none, and fails: never `last_insert_rowid`, which would name another table's row).
pub(super) fn insert_audit(c: &Connection, r: &AuditRecord, payment_id: Option<&str>) -> rusqlite::Result<i64> {
    c.q_row(
        "INSERT INTO audit_records (at, correlation_id, principal_iss, principal_sub, tool, decision, code,
                                    idempotency_key, payment_id, approval_id, detail, principal_user, repeats,
                                    policy_version, intent, tag)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16) RETURNING seq",
        params_from_iter(rows::audit_values(r, payment_id)),
        |row| row.get(0),
    )
}

/// Whether record `seq` reads back as `written` (a trigger did not delete or rewrite it in the
/// transaction that wrote it).
pub(super) fn reads_back(c: &Connection, seq: i64, written: &AuditRecord) -> Result<bool, StoreError> {
    let sql = format!("SELECT {} FROM audit_records WHERE seq = ?1", rows::AUDIT_COLS);
    let stored = c.opt(&sql, [seq], rows::audit)?;
    Ok(stored.is_some_and(|s| s == AuditRecord { seq, ..written.clone() }))
}

#[async_trait]
impl AuditStore for SqliteStore {
    async fn audit_append(&self, r: AuditRecord) -> Result<i64, StoreError> {
        self.write(move |c| Ok(insert_audit(c, &r, None)?)).await
    }

    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let sub = principal_sub.map(str::to_string);
        self.run_heavy(move |c| {
            let sql = format!(
                "SELECT {} FROM audit_records WHERE (?1 IS NULL OR principal_sub = ?1) ORDER BY seq DESC LIMIT ?2",
                rows::AUDIT_COLS
            );
            c.all(&sql, params![sub, limit], rows::audit)
        })
        .await
    }

    async fn audit_seal(&self, key: &LinkKey, limit: u32) -> Result<(u64, ChainHead), StoreError> {
        let key = key.clone();
        self.write(move |c| {
            // One writer: seq order is commit order, and everything committed is visible here.
            let head = c.opt("SELECT chain_seq, hash, last_seq FROM audit_chain_head WHERE id = 1", [], |r| {
                Ok((r.int(0)?, r.text(1)?, r.int(2)?))
            })?;
            let (mut chain_seq, mut prev, mut last_seq) = head.unwrap_or((0, GENESIS.to_string(), 0));
            let sql = format!("SELECT {} FROM audit_records WHERE seq > ?1 ORDER BY seq LIMIT ?2", rows::AUDIT_COLS);
            let records = c.all(&sql, params![last_seq, limit], rows::audit)?;
            for r in &records {
                if tag_fault(&key, r, true).is_some() {
                    // Never sealed: a record without its writer's tag (stripped, forged, or from
                    // before tags) stays unsealed, and `audit verify` names it once it is stale.
                    tracing::error!(audit.seq = r.seq, "an audit record without its writer's tag is not sealed");
                    last_seq = r.seq;
                    continue;
                }
                chain_seq += 1;
                let hash = keyed_link_hash(&key, &prev, chain_seq, r);
                c.exec(
                    "INSERT INTO audit_chain (chain_seq, seq, prev_hash, hash) VALUES (?1, ?2, ?3, ?4)",
                    params![chain_seq, r.seq, prev, hash],
                )?;
                (prev, last_seq) = (hash, r.seq);
            }
            if !records.is_empty() {
                c.exec(
                    "INSERT INTO audit_chain_head (id, chain_seq, hash, last_seq) VALUES (1, ?1, ?2, ?3)
                     ON CONFLICT (id) DO UPDATE SET chain_seq = excluded.chain_seq, hash = excluded.hash,
                                                    last_seq = excluded.last_seq",
                    params![chain_seq, prev, last_seq],
                )?;
            }
            Ok((records.len() as u64, ChainHead { chain_seq, hash: prev }))
        })
        .await
    }

    async fn audit_checkpoint_put(
        &self,
        cp: Checkpoint,
        replace: bool,
        messages: Vec<OutboxMessage>,
    ) -> Result<(), StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            tx.exec(
                "INSERT INTO audit_checkpoints (chain_seq, hash, at, jws) VALUES (?1, ?2, ?3, ?4)
                 ON CONFLICT (chain_seq) DO UPDATE SET at = excluded.at, jws = excluded.jws
                 WHERE ?5 AND audit_checkpoints.hash = excluded.hash",
                params![cp.chain_seq, cp.hash, cp.at, cp.jws, replace],
            )?;
            super::outbox::insert_outbox(&tx, &messages)?;
            tx.commit()?;
            Ok(())
        })
        .await
    }

    async fn audit_checkpoint_drop(&self, chain_seq: i64) -> Result<(), StoreError> {
        self.write(move |c| {
            c.exec("DELETE FROM audit_checkpoints WHERE chain_seq = ?1", params![chain_seq])?;
            Ok(())
        })
        .await
    }

    async fn audit_delete_through(&self, chain_seq: i64) -> Result<u64, StoreError> {
        self.write(move |c| {
            let n = c.exec(
                "DELETE FROM audit_records WHERE seq IN (SELECT seq FROM audit_chain WHERE chain_seq <= ?1)",
                params![chain_seq],
            )?;
            c.exec("DELETE FROM audit_chain WHERE chain_seq <= ?1", params![chain_seq])?;
            Ok(n as u64)
        })
        .await
    }
}
