//! Job leases (SQLite).

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params};

use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::store::{LeaseStore, QuotaTake};

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

    async fn job_release(&self, holder: &str) -> Result<(), StoreError> {
        let holder = holder.to_string();
        self.write(move |c| {
            c.exec("DELETE FROM job_leases WHERE holder = ?1", params![holder])?;
            Ok(())
        })
        .await
    }

    async fn quota_take(&self, key: &str, take: QuotaTake) -> Result<Option<i64>, StoreError> {
        if let Err(wait) = take.apply(None) {
            return Ok(Some(wait)); // more than the whole bucket: never fits
        }
        let key = key.to_string();
        self.write(move |c| {
            let taken = c.exec(
                "INSERT INTO rate_quotas (key, tat_us) VALUES (?1, ?2 + ?3)
                 ON CONFLICT (key) DO UPDATE SET tat_us = MAX(rate_quotas.tat_us, ?2) + ?3
                 WHERE MAX(rate_quotas.tat_us, ?2) + ?3 - ?2 <= ?4",
                params![key, take.now_us, take.cost_us, take.burst_us],
            )?;
            if taken == 1 {
                return Ok(None);
            }
            let tat: Option<i64> =
                c.q_row("SELECT tat_us FROM rate_quotas WHERE key = ?1", params![key], |r| r.get(0)).optional()?;
            Ok(take.apply(tat).err().or(Some(1)))
        })
        .await
    }

    async fn quota_forget_full(&self, now_us: i64) -> Result<u64, StoreError> {
        self.write(move |c| Ok(c.exec("DELETE FROM rate_quotas WHERE tat_us <= ?1", params![now_us])? as u64)).await
    }
}
