//! Policy versions and proposals (SQLite).

use async_trait::async_trait;
use rusqlite::{Connection, params, params_from_iter};

use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::domain::policy_doc::{PolicyProposal, PolicyVersion, ProposalStatus};
use crate::store::{PolicyStore, rows};

const INSERT_VERSION: &str = "INSERT INTO policy_versions (version, document, author_iss, author_sub, reason,
         approver_iss, approver_sub, proposal_id, created_at, tag)
     SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10
     WHERE ?1 = (SELECT COALESCE(MAX(version), 0) + 1 FROM policy_versions)";

fn insert_version(c: &Connection, v: &PolicyVersion) -> Result<bool, StoreError> {
    Ok(c.exec(INSERT_VERSION, params_from_iter(rows::policy_version_values(v)))? == 1)
}

#[async_trait]
impl PolicyStore for SqliteStore {
    async fn policy_head(&self) -> Result<i64, StoreError> {
        self.run(|c| Ok(c.q_row("SELECT COALESCE(MAX(version), 0) FROM policy_versions", [], |r| r.get(0))?)).await
    }

    async fn policy_version(&self, version: i64) -> Result<Option<PolicyVersion>, StoreError> {
        self.run(move |c| {
            let sql = format!("SELECT {} FROM policy_versions WHERE version = ?1", rows::POLICY_VERSION_COLS);
            c.opt(&sql, params![version], rows::policy_version)
        })
        .await
    }

    async fn policy_versions(&self, limit: u32) -> Result<Vec<PolicyVersion>, StoreError> {
        self.run(move |c| {
            let sql =
                format!("SELECT {} FROM policy_versions ORDER BY version DESC LIMIT ?1", rows::POLICY_VERSION_COLS);
            c.all(&sql, params![limit], rows::policy_version)
        })
        .await
    }

    async fn policy_adopt_tags(&self, tags: Vec<(i64, String)>) -> Result<(), StoreError> {
        self.write(move |c| {
            for (version, tag) in &tags {
                c.exec(
                    "UPDATE policy_versions SET tag = ?1 WHERE version = ?2 AND tag IS NULL",
                    params![tag, version],
                )?;
            }
            Ok(())
        })
        .await
    }

    async fn policy_adopt_proposal_tags(&self, tags: Vec<(String, String)>) -> Result<(), StoreError> {
        self.write(move |c| {
            for (id, tag) in &tags {
                c.exec("UPDATE policy_proposals SET tag = ?1 WHERE id = ?2 AND tag IS NULL", params![tag, id])?;
            }
            Ok(())
        })
        .await
    }

    async fn policy_append(&self, v: PolicyVersion) -> Result<bool, StoreError> {
        self.write(move |c| insert_version(c, &v)).await
    }

    async fn policy_propose(&self, p: PolicyProposal) -> Result<(), StoreError> {
        self.write(move |c| {
            let sql = format!(
                "INSERT INTO policy_proposals ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13)",
                rows::POLICY_PROPOSAL_COLS
            );
            c.exec(&sql, params_from_iter(rows::policy_proposal_values(&p)))?;
            Ok(())
        })
        .await
    }

    async fn policy_proposal(&self, id: &str) -> Result<Option<PolicyProposal>, StoreError> {
        let id = id.to_string();
        self.run(move |c| {
            let sql = format!("SELECT {} FROM policy_proposals WHERE id = ?1", rows::POLICY_PROPOSAL_COLS);
            c.opt(&sql, params![id], rows::policy_proposal)
        })
        .await
    }

    async fn policy_proposals(
        &self,
        status: Option<ProposalStatus>,
        limit: u32,
    ) -> Result<Vec<PolicyProposal>, StoreError> {
        let status = status.map(ProposalStatus::as_str);
        self.run(move |c| {
            let sql = format!(
                "SELECT {} FROM policy_proposals WHERE (?1 IS NULL OR status = ?1) ORDER BY created_at DESC, id LIMIT ?2",
                rows::POLICY_PROPOSAL_COLS
            );
            c.all(&sql, params![status, limit], rows::policy_proposal)
        })
        .await
    }

    async fn policy_decide(
        &self,
        id: &str,
        status: ProposalStatus,
        decided_by: (&str, &str),
        at: UnixSecs,
        version: Option<PolicyVersion>,
        tag: &str,
    ) -> Result<bool, StoreError> {
        let (id, iss, sub) = (id.to_string(), decided_by.0.to_string(), decided_by.1.to_string());
        let tag = tag.to_string();
        self.write(move |c| {
            let sp = c.savepoint()?;
            let decided = sp.exec(
                "UPDATE policy_proposals SET status = ?2, decided_iss = ?3, decided_sub = ?4, decided_at = ?5,
                        applied_version = ?6, tag = ?7
                 WHERE id = ?1 AND status = 'pending'",
                params![id, status.as_str(), iss, sub, at, version.as_ref().map(|v| v.version), tag],
            )? == 1;
            if !decided {
                return Ok(false);
            }
            if let Some(v) = &version
                && !insert_version(&sp, v)?
            {
                // Another change came first: the proposal stays pending (its author rebases it).
                return Ok(false);
            }
            sp.commit()?;
            Ok(true)
        })
        .await
    }

    async fn policy_history(
        &self,
        since: UnixSecs,
        until: UnixSecs,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        self.run_heavy(move |c| {
            let sql = format!(
                "SELECT {} FROM audit_records WHERE at >= ?1 AND at <= ?2 AND intent IS NOT NULL ORDER BY seq LIMIT ?3",
                rows::AUDIT_COLS
            );
            c.all(&sql, params![since, until, limit], rows::audit)
        })
        .await
    }
}
