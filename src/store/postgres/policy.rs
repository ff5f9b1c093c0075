//! Policy versions and proposals (PostgreSQL). Replicas poll `policy_head` every
//! `policy.refresh_secs`; a version is written only as one past the newest (the primary key and the
//! `WHERE` make two concurrent changes one winner and one `false`).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;

use super::{Cached, Mapped, PostgresStore, bind};
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::domain::policy_doc::{PolicyProposal, PolicyVersion, ProposalStatus};
use crate::store::{PolicyStore, rows};

const INSERT_VERSION: &str = "INSERT INTO policy_versions (version, document, author_iss, author_sub, reason,
         approver_iss, approver_sub, proposal_id, created_at, tag)
     SELECT $1, $2, $3, $4, $5, $6, $7, $8, $9, $10
     WHERE $1 = (SELECT COALESCE(MAX(version), 0) + 1 FROM policy_versions)
     ON CONFLICT (version) DO NOTHING";

async fn insert_version(c: &impl GenericClient, v: &PolicyVersion) -> Result<bool, StoreError> {
    Ok(c.exec(INSERT_VERSION, &bind(&rows::policy_version_values(v))).await? == 1)
}

#[async_trait]
impl PolicyStore for PostgresStore {
    async fn policy_head(&self) -> Result<i64, StoreError> {
        let client = self.pool.get().await?;
        Ok(client.one("SELECT COALESCE(MAX(version), 0)::BIGINT FROM policy_versions", &[]).await?.get(0))
    }

    async fn policy_version(&self, version: i64) -> Result<Option<PolicyVersion>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!("SELECT {} FROM policy_versions WHERE version = $1", rows::POLICY_VERSION_COLS);
        client.get(&sql, &[&version], rows::policy_version).await
    }

    async fn policy_versions(&self, limit: u32) -> Result<Vec<PolicyVersion>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!("SELECT {} FROM policy_versions ORDER BY version DESC LIMIT $1", rows::POLICY_VERSION_COLS);
        client.list(&sql, &[&i64::from(limit)], rows::policy_version).await
    }

    async fn policy_adopt_tags(&self, tags: Vec<(i64, String)>) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        for (version, tag) in &tags {
            client
                .exec("UPDATE policy_versions SET tag = $1 WHERE version = $2 AND tag IS NULL", &[tag, version])
                .await?;
        }
        Ok(())
    }

    async fn policy_adopt_proposal_tags(&self, tags: Vec<(String, String)>) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        for (id, tag) in &tags {
            client.exec("UPDATE policy_proposals SET tag = $1 WHERE id = $2 AND tag IS NULL", &[tag, id]).await?;
        }
        Ok(())
    }

    async fn policy_append(&self, v: PolicyVersion) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        insert_version(&client, &v).await
    }

    async fn policy_propose(&self, p: PolicyProposal) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "INSERT INTO policy_proposals ({}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)",
            rows::POLICY_PROPOSAL_COLS
        );
        client.exec(&sql, &bind(&rows::policy_proposal_values(&p))).await?;
        Ok(())
    }

    async fn policy_proposal(&self, id: &str) -> Result<Option<PolicyProposal>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!("SELECT {} FROM policy_proposals WHERE id = $1", rows::POLICY_PROPOSAL_COLS);
        client.get(&sql, &[&id], rows::policy_proposal).await
    }

    async fn policy_proposals(
        &self,
        status: Option<ProposalStatus>,
        limit: u32,
    ) -> Result<Vec<PolicyProposal>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {} FROM policy_proposals WHERE ($1::TEXT IS NULL OR status = $1)
             ORDER BY created_at DESC, id LIMIT $2",
            rows::POLICY_PROPOSAL_COLS
        );
        let status = status.map(ProposalStatus::as_str);
        client.list(&sql, &[&status, &i64::from(limit)], rows::policy_proposal).await
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
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // Versions are written one at a time: a change racing this one waits, then sees its head.
        tx.exec("LOCK TABLE policy_versions IN SHARE ROW EXCLUSIVE MODE", &[]).await?;
        let applied = version.as_ref().map(|v| v.version);
        let decided = tx
            .exec(
                "UPDATE policy_proposals SET status = $2, decided_iss = $3, decided_sub = $4, decided_at = $5,
                        applied_version = $6, tag = $7
                 WHERE id = $1 AND status = 'pending'",
                &[&id, &status.as_str(), &decided_by.0, &decided_by.1, &at, &applied, &tag],
            )
            .await?
            == 1;
        if !decided {
            return Ok(false);
        }
        if let Some(v) = &version
            && !insert_version(&tx, v).await?
        {
            return Ok(false);
        }
        tx.commit().await?;
        Ok(true)
    }

    async fn policy_history(
        &self,
        since: UnixSecs,
        until: UnixSecs,
        limit: u32,
    ) -> Result<Vec<AuditRecord>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {} FROM audit_records WHERE at >= $1 AND at <= $2 AND intent IS NOT NULL ORDER BY seq LIMIT $3",
            rows::AUDIT_COLS
        );
        client.list(&sql, &[&since, &until, &i64::from(limit)], rows::audit).await
    }
}
