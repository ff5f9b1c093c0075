//! Job leases (PostgreSQL).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;

use super::{Cached, PostgresStore};
use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::store::{LeaseStore, QuotaTake};

async fn lease(c: &impl GenericClient, kind: &str, holder: &str, now: UnixSecs, secs: i64) -> Result<bool, StoreError> {
    Ok(c.exec(
        "INSERT INTO job_leases (kind, holder, lease_until) VALUES ($1, $2, $3)
         ON CONFLICT (kind) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until
         WHERE job_leases.lease_until <= $4 OR job_leases.holder = excluded.holder",
        &[&kind, &holder, &(now + secs), &now],
    )
    .await?
        == 1)
}

#[async_trait]
impl LeaseStore for PostgresStore {
    async fn job_lease(&self, kind: &str, holder: &str, now: UnixSecs, lease_secs: i64) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        lease(&client, kind, holder, now, lease_secs).await
    }

    async fn job_release(&self, holder: &str) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client.exec("DELETE FROM job_leases WHERE holder = $1", &[&holder]).await?;
        Ok(())
    }

    async fn quota_take(&self, key: &str, take: QuotaTake) -> Result<Option<i64>, StoreError> {
        if let Err(wait) = take.apply(None) {
            return Ok(Some(wait)); // more than the whole bucket: never fits
        }
        let client = self.pool.get().await?;
        // One statement: the row lock orders replicas taking from one bucket at once.
        let taken = client
            .exec(
                "INSERT INTO rate_quotas AS q (key, tat_us) VALUES ($1, $2::BIGINT + $3::BIGINT)
                 ON CONFLICT (key) DO UPDATE SET tat_us = GREATEST(q.tat_us, $2) + $3
                 WHERE GREATEST(q.tat_us, $2) + $3 - $2 <= $4",
                &[&key, &take.now_us, &take.cost_us, &take.burst_us],
            )
            .await?;
        if taken == 1 {
            return Ok(None);
        }
        let tat: Option<i64> =
            client.opt("SELECT tat_us FROM rate_quotas WHERE key = $1", &[&key]).await?.map(|r| r.get(0));
        Ok(take.apply(tat).err().or(Some(1)))
    }

    async fn quota_forget_full(&self, now_us: i64) -> Result<u64, StoreError> {
        let client = self.pool.get().await?;
        Ok(client.exec("DELETE FROM rate_quotas WHERE tat_us <= $1", &[&now_us]).await?)
    }
}
