//! Passkeys (PostgreSQL): people's WebAuthn credentials and their signature counters, the
//! single-use registration challenges and the enrolment codes.

use async_trait::async_trait;

use super::outbox::insert_outbox;
use super::{Cached, Mapped, PostgresStore, bind};
use crate::clock::UnixSecs;
use crate::domain::approval::{ChallengeIssued, EnrolmentCode, EnrolmentProof, PasskeyChallenge};
use crate::domain::approval::{PasskeyEnrolled, PasskeyEnrolment, PasskeyRecord};
use crate::domain::error::StoreError;
use crate::store::{PasskeyStore, rows};

/// Serialises one person's registrations and challenges (the counts against their bounds hold).
const PERSON_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended('passkey:' || $1 || ' ' || $2, 0))";

#[async_trait]
impl PasskeyStore for PostgresStore {
    async fn passkey_challenge_put(&self, ch: PasskeyChallenge, max: i64) -> Result<ChallengeIssued, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.exec(PERSON_LOCK, &[&ch.owner_iss, &ch.owner_sub]).await?;
        tx.exec("DELETE FROM passkey_challenges WHERE expires_at < $1", &[&ch.created_at]).await?;
        let live: i64 = tx
            .one(
                "SELECT COUNT(*) FROM passkey_challenges WHERE owner_iss = $1 AND owner_sub = $2",
                &[&ch.owner_iss, &ch.owner_sub],
            )
            .await?
            .get(0);
        if live >= max {
            return Ok(ChallengeIssued::TooMany);
        }
        tx.exec(
            "INSERT INTO passkey_challenges (challenge_sha256, owner_iss, owner_sub, created_at, expires_at)
             VALUES ($1, $2, $3, $4, $5)",
            &[&ch.challenge_sha256, &ch.owner_iss, &ch.owner_sub, &ch.created_at, &ch.expires_at],
        )
        .await?;
        tx.commit().await?;
        Ok(ChallengeIssued::Stored)
    }

    async fn passkey_code_put(&self, code: EnrolmentCode) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client
            .exec(
                "INSERT INTO passkey_enrolment_codes (code_sha256, owner_iss, owner_sub, issued_by, issued_at, expires_at)
                 VALUES ($1, $2, $3, $4, $5, $6)",
                &[&code.code_sha256, &code.owner_iss, &code.owner_sub, &code.issued_by, &code.issued_at, &code.expires_at],
            )
            .await?;
        Ok(())
    }

    async fn passkey_enrol(&self, e: PasskeyEnrolment, now: UnixSecs) -> Result<PasskeyEnrolled, StoreError> {
        let mut client = self.pool.get().await?;
        // Every refusal below returns before the commit: dropping the transaction rolls it back.
        let tx = client.transaction().await?;
        let rec = &e.rec;
        // One person's concurrent registrations serialise here (the count below holds).
        tx.exec(PERSON_LOCK, &[&rec.owner_iss, &rec.owner_sub]).await?;
        let spent = tx
            .exec(
                "DELETE FROM passkey_challenges
                 WHERE challenge_sha256 = $1 AND owner_iss = $2 AND owner_sub = $3 AND expires_at >= $4",
                &[&e.challenge_sha256, &rec.owner_iss, &rec.owner_sub, &now],
            )
            .await?;
        if spent != 1 {
            return Ok(PasskeyEnrolled::ChallengeSpent);
        }
        let code_issued_by = match &e.proof {
            EnrolmentProof::Code { code_sha256 } => {
                let row = tx
                    .opt(
                        "UPDATE passkey_enrolment_codes SET used_at = $1, credential_id = $2
                         WHERE code_sha256 = $3 AND owner_iss = $4 AND owner_sub = $5
                           AND used_at IS NULL AND expires_at >= $1
                         RETURNING issued_by",
                        &[&now, &rec.credential_id, code_sha256, &rec.owner_iss, &rec.owner_sub],
                    )
                    .await?;
                match row {
                    Some(r) => Some(r.get::<_, String>(0)),
                    None => return Ok(PasskeyEnrolled::CodeRefused),
                }
            }
            EnrolmentProof::Passkey { credential_id, seen, count } => {
                let moved = tx
                    .exec(
                        "UPDATE passkeys SET sign_count = $1
                         WHERE credential_id = $2 AND sign_count = $3 AND revoked_at IS NULL
                           AND owner_iss = $4 AND owner_sub = $5",
                        &[count, credential_id, seen, &rec.owner_iss, &rec.owner_sub],
                    )
                    .await?;
                if moved != 1 {
                    return Ok(PasskeyEnrolled::PasskeyStale);
                }
                None
            }
        };
        let live: i64 = tx
            .one(
                "SELECT COUNT(*) FROM passkeys WHERE owner_iss = $1 AND owner_sub = $2 AND revoked_at IS NULL",
                &[&rec.owner_iss, &rec.owner_sub],
            )
            .await?
            .get(0);
        let taken = tx.opt("SELECT 1 FROM passkeys WHERE credential_id = $1", &[&rec.credential_id]).await?.is_some();
        if taken {
            return Ok(PasskeyEnrolled::Duplicate);
        }
        if live >= e.max {
            return Ok(PasskeyEnrolled::TooMany);
        }
        let inserted = tx
            .exec(
                &format!(
                    "INSERT INTO passkeys ({}) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12)
                     ON CONFLICT (credential_id) DO NOTHING",
                    rows::PASSKEY_COLS
                ),
                &bind(&rows::passkey_values(rec)),
            )
            .await?;
        if inserted != 1 {
            // Registered meanwhile by someone else (another person's lock): nothing of this stays.
            return Ok(PasskeyEnrolled::Duplicate);
        }
        insert_outbox(&tx, &e.notify).await?;
        tx.commit().await?;
        Ok(PasskeyEnrolled::Inserted { code_issued_by })
    }

    async fn passkey_get(&self, credential_id: &str) -> Result<Option<PasskeyRecord>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!("SELECT {} FROM passkeys WHERE credential_id = $1", rows::PASSKEY_COLS);
        Ok(client.get(&sql, &[&credential_id], rows::passkey).await?)
    }

    async fn passkey_list(&self, owner_iss: &str, owner_sub: &str) -> Result<Vec<PasskeyRecord>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!(
            "SELECT {} FROM passkeys WHERE owner_iss = $1 AND owner_sub = $2 ORDER BY created_at DESC, credential_id",
            rows::PASSKEY_COLS
        );
        Ok(client.list(&sql, &[&owner_iss, &owner_sub], rows::passkey).await?)
    }

    async fn passkey_revoke(&self, credential_id: &str, by: &str, at: UnixSecs) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .exec(
                "UPDATE passkeys SET revoked_at = $1, revoked_by = $2 WHERE credential_id = $3 AND revoked_at IS NULL",
                &[&at, &by, &credential_id],
            )
            .await?
            == 1)
    }

    async fn passkey_count(&self, credential_id: &str, seen: i64, count: i64) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .exec(
                "UPDATE passkeys SET sign_count = $1 WHERE credential_id = $2 AND sign_count = $3 AND revoked_at IS NULL",
                &[&count, &credential_id, &seen],
            )
            .await?
            == 1)
    }
}
