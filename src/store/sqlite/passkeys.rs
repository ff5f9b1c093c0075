//! Passkeys (SQLite): people's WebAuthn credentials and their signature counters, the single-use
//! registration challenges and the enrolment codes.

use async_trait::async_trait;
use rusqlite::{OptionalExtension, params, params_from_iter};

use super::outbox::insert_outbox;
use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::approval::{ChallengeIssued, EnrolmentCode, EnrolmentProof, PasskeyChallenge};
use crate::domain::approval::{PasskeyEnrolled, PasskeyEnrolment, PasskeyRecord};
use crate::domain::error::StoreError;
use crate::store::{PasskeyStore, rows};

#[async_trait]
impl PasskeyStore for SqliteStore {
    async fn passkey_challenge_put(&self, ch: PasskeyChallenge, max: i64) -> Result<ChallengeIssued, StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            tx.exec("DELETE FROM passkey_challenges WHERE expires_at < ?1", [ch.created_at])?;
            let live: i64 = tx.q_row(
                "SELECT COUNT(*) FROM passkey_challenges WHERE owner_iss = ?1 AND owner_sub = ?2",
                params![ch.owner_iss, ch.owner_sub],
                |r| r.get(0),
            )?;
            if live >= max {
                return Ok(ChallengeIssued::TooMany);
            }
            tx.exec(
                "INSERT INTO passkey_challenges (challenge_sha256, owner_iss, owner_sub, created_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5)",
                params![ch.challenge_sha256, ch.owner_iss, ch.owner_sub, ch.created_at, ch.expires_at],
            )?;
            tx.commit()?;
            Ok(ChallengeIssued::Stored)
        })
        .await
    }

    async fn passkey_code_put(&self, code: EnrolmentCode) -> Result<(), StoreError> {
        self.write(move |c| {
            c.exec(
                "INSERT INTO passkey_enrolment_codes (code_sha256, owner_iss, owner_sub, issued_by, issued_at, expires_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![code.code_sha256, code.owner_iss, code.owner_sub, code.issued_by, code.issued_at, code.expires_at],
            )?;
            Ok(())
        })
        .await
    }

    async fn passkey_enrol(&self, e: PasskeyEnrolment, now: UnixSecs) -> Result<PasskeyEnrolled, StoreError> {
        self.write(move |c| {
            // Every refusal below returns before the commit: the savepoint rolls back all of it.
            let tx = c.savepoint()?;
            let rec = &e.rec;
            let spent = tx.exec(
                "DELETE FROM passkey_challenges
                 WHERE challenge_sha256 = ?1 AND owner_iss = ?2 AND owner_sub = ?3 AND expires_at >= ?4",
                params![e.challenge_sha256, rec.owner_iss, rec.owner_sub, now],
            )?;
            if spent != 1 {
                return Ok(PasskeyEnrolled::ChallengeSpent);
            }
            let code_issued_by = match &e.proof {
                EnrolmentProof::Code { code_sha256 } => {
                    let issuer: Option<String> = tx
                        .q_row(
                            "UPDATE passkey_enrolment_codes SET used_at = ?1, credential_id = ?2
                             WHERE code_sha256 = ?3 AND owner_iss = ?4 AND owner_sub = ?5
                               AND used_at IS NULL AND expires_at >= ?1
                             RETURNING issued_by",
                            params![now, rec.credential_id, code_sha256, rec.owner_iss, rec.owner_sub],
                            |r| r.get(0),
                        )
                        .optional()?;
                    match issuer {
                        Some(by) => Some(by),
                        None => return Ok(PasskeyEnrolled::CodeRefused),
                    }
                }
                EnrolmentProof::Passkey { credential_id, seen, count } => {
                    let moved = tx.exec(
                        "UPDATE passkeys SET sign_count = ?1
                         WHERE credential_id = ?2 AND sign_count = ?3 AND revoked_at IS NULL
                           AND owner_iss = ?4 AND owner_sub = ?5",
                        params![count, credential_id, seen, rec.owner_iss, rec.owner_sub],
                    )?;
                    if moved != 1 {
                        return Ok(PasskeyEnrolled::PasskeyStale);
                    }
                    None
                }
            };
            let taken = tx
                .q_row("SELECT 1 FROM passkeys WHERE credential_id = ?1", [&rec.credential_id], |r| r.get::<_, i64>(0))
                .optional()?
                .is_some();
            if taken {
                return Ok(PasskeyEnrolled::Duplicate);
            }
            let live: i64 = tx.q_row(
                "SELECT COUNT(*) FROM passkeys WHERE owner_iss = ?1 AND owner_sub = ?2 AND revoked_at IS NULL",
                params![rec.owner_iss, rec.owner_sub],
                |r| r.get(0),
            )?;
            if live >= e.max {
                return Ok(PasskeyEnrolled::TooMany);
            }
            tx.exec(
                &format!(
                    "INSERT INTO passkeys ({}) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12)",
                    rows::PASSKEY_COLS
                ),
                params_from_iter(rows::passkey_values(rec)),
            )?;
            insert_outbox(&tx, &e.notify)?;
            tx.commit()?;
            Ok(PasskeyEnrolled::Inserted { code_issued_by })
        })
        .await
    }

    async fn passkey_get(&self, credential_id: &str) -> Result<Option<PasskeyRecord>, StoreError> {
        let id = credential_id.to_string();
        self.run(move |c| {
            let sql = format!("SELECT {} FROM passkeys WHERE credential_id = ?1", rows::PASSKEY_COLS);
            c.opt(&sql, [id], rows::passkey)
        })
        .await
    }

    async fn passkey_list(&self, owner_iss: &str, owner_sub: &str) -> Result<Vec<PasskeyRecord>, StoreError> {
        let (iss, sub) = (owner_iss.to_string(), owner_sub.to_string());
        self.run(move |c| {
            let sql = format!(
                "SELECT {} FROM passkeys WHERE owner_iss = ?1 AND owner_sub = ?2 ORDER BY created_at DESC, rowid DESC",
                rows::PASSKEY_COLS
            );
            c.all(&sql, params![iss, sub], rows::passkey)
        })
        .await
    }

    async fn passkey_revoke(&self, credential_id: &str, by: &str, at: UnixSecs) -> Result<bool, StoreError> {
        let (id, by) = (credential_id.to_string(), by.to_string());
        self.write(move |c| {
            Ok(c.exec(
                "UPDATE passkeys SET revoked_at = ?1, revoked_by = ?2 WHERE credential_id = ?3 AND revoked_at IS NULL",
                params![at, by, id],
            )? == 1)
        })
        .await
    }

    async fn passkey_count(&self, credential_id: &str, seen: i64, count: i64) -> Result<bool, StoreError> {
        let id = credential_id.to_string();
        self.write(move |c| {
            Ok(c.exec(
                "UPDATE passkeys SET sign_count = ?1
                 WHERE credential_id = ?2 AND sign_count = ?3 AND revoked_at IS NULL",
                params![count, id, seen],
            )? == 1)
        })
        .await
    }
}
