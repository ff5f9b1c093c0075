//! Stop rules (SQLite): suspensions and the denials that count toward them.

use std::collections::HashMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::outbox::insert_outbox;
use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::audit::DENIAL_CODES;
use crate::domain::error::StoreError;
use crate::domain::principal::{PrincipalRef, Suspension};
use crate::domain::webhook::OutboxMessage;
use crate::store::{Denials, SuspensionStore};

/// Principals remembered as not suspended at most (past it the memory starts over).
const CLEAR_SEEN_MAX: usize = 10_000;

/// The principals last read as not suspended, and the generation of `principal_state` they were
/// read at. Every call asks whether its caller is suspended, and under load each ask was a read
/// transaction on a reader whose page cache every commit had invalidated (5.5% of a payment's
/// server CPU). The embedded store is its database file's only writer (one process; replicas run
/// on PostgreSQL), and every write to `principal_state` goes through `suspend` or `resume` below,
/// which move the generation on once they have committed: an answer remembered at the current
/// generation is the one a read would give.
#[derive(Default)]
pub(super) struct ClearSeen {
    generation: AtomicU64,
    clear: Mutex<HashMap<PrincipalRef, u64>>,
}

impl ClearSeen {
    /// The generation to read at, taken before the read: a write committed after it moves it on,
    /// so what that read remembers is already stale.
    fn now(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    fn is_clear(&self, who: &PrincipalRef, generation: u64) -> bool {
        let clear = self.clear.lock().unwrap_or_else(|p| p.into_inner());
        clear.get(who) == Some(&generation)
    }

    fn remember(&self, who: PrincipalRef, generation: u64) {
        let mut clear = self.clear.lock().unwrap_or_else(|p| p.into_inner());
        if clear.len() >= CLEAR_SEEN_MAX {
            clear.clear();
        }
        clear.insert(who, generation);
    }

    /// After a write to `principal_state` (committed or not: moving on is always safe).
    fn moved(&self) {
        self.generation.fetch_add(1, Ordering::AcqRel);
        self.clear.lock().unwrap_or_else(|p| p.into_inner()).clear();
    }
}

#[async_trait]
impl SuspensionStore for SqliteStore {
    async fn suspension(&self, who: &PrincipalRef) -> Result<Option<(UnixSecs, String)>, StoreError> {
        let generation = self.clear.now();
        if self.clear.is_clear(who, generation) {
            return Ok(None);
        }
        let found = self.read_suspension(who.clone()).await?;
        if found.is_none() {
            self.clear.remember(who.clone(), generation);
        }
        Ok(found)
    }

    async fn suspend(&self, s: Suspension, now: UnixSecs, notify: Vec<OutboxMessage>) -> Result<bool, StoreError> {
        let written = self.write_suspension(s, now, notify).await;
        self.clear.moved();
        written
    }

    async fn resume(&self, issuer: &str, subject: &str, user: Option<&str>, now: UnixSecs) -> Result<bool, StoreError> {
        let written = self.write_resume(issuer, subject, user, now).await;
        self.clear.moved();
        written
    }

    async fn denials_since(&self, who: &PrincipalRef, since: UnixSecs) -> Result<Denials, StoreError> {
        let who = who.clone();
        let codes = serde_json::to_string(DENIAL_CODES).map_err(|e| StoreError::Database(e.to_string()))?;
        self.run(move |c| {
            Ok(c.q_row(
                "SELECT COALESCE(SUM(CASE WHEN code = 'RATE_LIMITED' THEN 0 ELSE repeats END), 0),
                        COALESCE(SUM(CASE WHEN code = 'RATE_LIMITED' THEN repeats ELSE 0 END), 0)
                 FROM audit_records
                 WHERE principal_sub = ?1 AND principal_iss = ?2 AND principal_user IS ?3
                   AND at >= ?4
                   AND seq > (SELECT COALESCE(MAX(resumed_seq), 0) FROM principal_state
                              WHERE subject = ?1 AND issuer IN (?2, '')
                                AND (scope = 'agent' OR principal_user = COALESCE(?3, '')))
                   AND ((decision IN ('denied', 'conflict') AND code IN (SELECT value FROM json_each(?5)))
                        OR code = 'RATE_LIMITED')",
                params![who.subject, who.issuer, who.user, since, codes],
                |r| Ok(Denials { denials: r.get(0)?, rate_limited: r.get(1)? }),
            )?)
        })
        .await
    }
}

impl SqliteStore {
    async fn read_suspension(&self, who: PrincipalRef) -> Result<Option<(UnixSecs, String)>, StoreError> {
        self.run(move |c| {
            Ok(c.q_row(
                "SELECT suspended_at, COALESCE(suspended_reason, '') FROM principal_state
                 WHERE subject = ?1 AND issuer IN (?2, '') AND suspended_at IS NOT NULL
                   AND (scope = 'agent' OR principal_user = ?3)
                 ORDER BY suspended_at LIMIT 1",
                params![who.subject, who.issuer, who.user.as_deref().unwrap_or("")],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
        })
        .await
    }

    async fn write_suspension(
        &self,
        s: Suspension,
        now: UnixSecs,
        notify: Vec<OutboxMessage>,
    ) -> Result<bool, StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            let (scope, user) = s.scope.columns();
            let took = tx.exec(
                "INSERT INTO principal_state (issuer, subject, scope, principal_user, suspended_at, suspended_reason)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (issuer, subject, scope, principal_user) DO UPDATE SET suspended_at = excluded.suspended_at,
                     suspended_reason = excluded.suspended_reason WHERE principal_state.suspended_at IS NULL",
                params![s.issuer, s.subject, scope, user, now, s.reason],
            )? == 1;
            if took {
                insert_outbox(&tx, &notify)?;
            }
            tx.commit()?;
            Ok(took)
        })
        .await
    }

    async fn write_resume(
        &self,
        issuer: &str,
        subject: &str,
        user: Option<&str>,
        now: UnixSecs,
    ) -> Result<bool, StoreError> {
        let (issuer, subject, user) = (issuer.to_string(), subject.to_string(), user.map(str::to_string));
        self.write(move |c| {
            Ok(c.exec(
                "UPDATE principal_state SET suspended_at = NULL, suspended_reason = NULL, resumed_at = ?1,
                        resumed_seq = (SELECT COALESCE(MAX(seq), 0) FROM audit_records)
                 WHERE subject = ?2 AND issuer IN (?3, '') AND suspended_at IS NOT NULL
                   AND (?4 IS NULL OR (scope = 'pair' AND principal_user = ?4))",
                params![now, subject, issuer, user],
            )? > 0)
        })
        .await
    }
}
