//! Stop rules (SQLite): suspensions and the denials that count toward them.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params};

use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::audit::DENIAL_CODES;
use crate::domain::error::StoreError;
use crate::domain::principal::{PrincipalRef, Suspension};
use crate::store::{Denials, SuspensionStore};

#[async_trait]
impl SuspensionStore for SqliteStore {
    async fn suspension(&self, who: &PrincipalRef) -> Result<Option<(UnixSecs, String)>, StoreError> {
        let who = who.clone();
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

    async fn suspend(&self, s: Suspension, now: UnixSecs) -> Result<bool, StoreError> {
        self.write(move |c| {
            let (scope, user) = s.scope.columns();
            Ok(c.exec(
                "INSERT INTO principal_state (issuer, subject, scope, principal_user, suspended_at, suspended_reason)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)
                 ON CONFLICT (issuer, subject, scope, principal_user) DO UPDATE SET suspended_at = excluded.suspended_at,
                     suspended_reason = excluded.suspended_reason WHERE principal_state.suspended_at IS NULL",
                params![s.issuer, s.subject, scope, user, now, s.reason],
            )? == 1)
        })
        .await
    }

    async fn resume(&self, issuer: &str, subject: &str, user: Option<&str>, now: UnixSecs) -> Result<bool, StoreError> {
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
