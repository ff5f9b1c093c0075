//! Job leases (SQLite).

use async_trait::async_trait;
use rusqlite::{Connection, params};

use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::store::LeaseStore;

fn lease_tx(c: &mut Connection, kind: &str, holder: &str, now: UnixSecs, secs: i64) -> Result<bool, StoreError> {
    Ok(c.exec(
        "INSERT INTO job_leases (kind, holder, lease_until) VALUES (?1, ?2, ?3)
         ON CONFLICT (kind) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until
         WHERE job_leases.lease_until <= ?4 OR job_leases.holder = excluded.holder",
        params![kind, holder, now + secs, now],
    )? == 1)
}

#[async_trait]
impl LeaseStore for SqliteStore {
    async fn job_lease(&self, kind: &str, holder: &str, now: UnixSecs, lease_secs: i64) -> Result<bool, StoreError> {
        let (kind, holder) = (kind.to_string(), holder.to_string());
        self.write(move |c| lease_tx(c, &kind, &holder, now, lease_secs)).await
    }
}
