//! Stop rules (PostgreSQL): suspensions and the denials that count toward them.

use async_trait::async_trait;

use super::outbox::insert_outbox;
use super::{Cached, PostgresStore};
use crate::clock::UnixSecs;
use crate::domain::audit::DENIAL_CODES;
use crate::domain::error::StoreError;
use crate::domain::principal::{PrincipalRef, Suspension};
use crate::domain::webhook::OutboxMessage;
use crate::store::{Denials, SuspensionStore};

#[async_trait]
impl SuspensionStore for PostgresStore {
    async fn suspension(&self, who: &PrincipalRef) -> Result<Option<(UnixSecs, String)>, StoreError> {
        let client = self.pool.get().await?;
        let user = who.user.as_deref().unwrap_or("");
        let row = client
            .opt(
                "SELECT suspended_at, COALESCE(suspended_reason, '') FROM principal_state
                 WHERE subject = $1 AND issuer IN ($2, '') AND suspended_at IS NOT NULL
                   AND (scope = 'agent' OR principal_user = $3)
                 ORDER BY suspended_at LIMIT 1",
                &[&who.subject, &who.issuer, &user],
            )
            .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    async fn suspend(&self, s: Suspension, now: UnixSecs, notify: Vec<OutboxMessage>) -> Result<bool, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let (scope, user) = s.scope.columns();
        let took = tx
            .exec(
                "INSERT INTO principal_state (issuer, subject, scope, principal_user, suspended_at, suspended_reason)
                 VALUES ($1, $2, $3, $4, $5, $6)
                 ON CONFLICT (issuer, subject, scope, principal_user) DO UPDATE SET suspended_at = excluded.suspended_at,
                     suspended_reason = excluded.suspended_reason WHERE principal_state.suspended_at IS NULL",
                &[&s.issuer, &s.subject, &scope, &user, &now, &s.reason],
            )
            .await?
            == 1;
        if took {
            insert_outbox(&tx, &notify).await?;
        }
        tx.commit().await?;
        Ok(took)
    }

    async fn resume(&self, issuer: &str, subject: &str, user: Option<&str>, now: UnixSecs) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .exec(
                "UPDATE principal_state SET suspended_at = NULL, suspended_reason = NULL, resumed_at = $1,
                        resumed_seq = (SELECT COALESCE(MAX(seq), 0) FROM audit_records)
                 WHERE subject = $2 AND issuer IN ($3, '') AND suspended_at IS NOT NULL
                   AND ($4::TEXT IS NULL OR (scope = 'pair' AND principal_user = $4))",
                &[&now, &subject, &issuer, &user],
            )
            .await?
            > 0)
    }

    async fn denials_since(&self, who: &PrincipalRef, since: UnixSecs) -> Result<Denials, StoreError> {
        let client = self.pool.get().await?;
        let codes: Vec<&str> = DENIAL_CODES.to_vec();
        let row = client
            .one(
                "SELECT COALESCE(SUM(CASE WHEN code = 'RATE_LIMITED' THEN 0 ELSE repeats END), 0)::BIGINT,
                        COALESCE(SUM(CASE WHEN code = 'RATE_LIMITED' THEN repeats ELSE 0 END), 0)::BIGINT
                 FROM audit_records
                 WHERE principal_sub = $1 AND principal_iss = $2 AND principal_user IS NOT DISTINCT FROM $3
                   AND at >= $4
                   AND seq > (SELECT COALESCE(MAX(resumed_seq), 0) FROM principal_state
                              WHERE subject = $1 AND issuer IN ($2, '')
                                AND (scope = 'agent' OR principal_user = COALESCE($3, '')))
                   AND ((decision IN ('denied', 'conflict') AND code = ANY($5)) OR code = 'RATE_LIMITED')",
                &[&who.subject, &who.issuer, &who.user, &since, &codes],
            )
            .await?;
        Ok(Denials { denials: row.get(0), rate_limited: row.get(1) })
    }
}
