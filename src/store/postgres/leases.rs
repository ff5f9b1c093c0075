//! Job leases (PostgreSQL).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;

use super::{Cached, PostgresStore};
use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::store::LeaseStore;

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
}
