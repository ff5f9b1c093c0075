//! Approvals, the review state machine's transaction, and the mandates reviews issue (SQLite).

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, params, params_from_iter};

use super::outbox::insert_outbox;
use super::{Cached, SqliteStore};
use crate::clock::UnixSecs;
use crate::domain::approval::{
    ApprovalRecord, ApprovalRequest, ApprovalReview, Review, ReviewError, Reviewed, Revoked,
};
use crate::domain::error::StoreError;
use crate::domain::ids::ApprovalId;
use crate::domain::ops::ApprovalQuery;
use crate::domain::payment::Page;
use crate::domain::rules::review::{self, RequestPlan, ReviewPlan};
use crate::domain::webhook::{self, OutboxMessage};
use crate::store::ApprovalStore;
use crate::store::rows;

pub(super) fn insert_approval(tx: &Connection, rec: &ApprovalRecord) -> rusqlite::Result<()> {
    tx.exec_one(
        &format!(
            "INSERT INTO approvals ({})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22, ?23, ?24)",
            rows::APPROVAL_COLS
        ),
        params_from_iter(rows::approval_values(rec)),
    )
}

pub(super) fn load_reviews(c: &Connection, id: &str) -> Result<Vec<Review>, StoreError> {
    let sql = format!("SELECT {} FROM approval_reviews WHERE approval_id = ?1 ORDER BY at, rowid", rows::REVIEW_COLS);
    c.all(&sql, [id], rows::review)
}

pub(super) fn load_approval(c: &Connection, id: &str) -> Result<Option<ApprovalRecord>, StoreError> {
    let sql = format!("SELECT {} FROM approvals WHERE id = ?1", rows::APPROVAL_COLS);
    let Some(mut a) = c.opt(&sql, [id], rows::approval)? else { return Ok(None) };
    a.reviews = load_reviews(c, a.id.as_str())?;
    Ok(Some(a))
}

pub(super) fn review_tx(c: &mut Connection, ask: ApprovalReview) -> Result<Reviewed, ReviewError> {
    let ApprovalReview { id, review: r, issue, decided, page, in_force, key, record } = ask;
    let (id, now) = (&id, r.at);
    let tx = c.savepoint().map_err(StoreError::from)?;
    let loaded = load_approval(&tx, id.as_str())?.ok_or(ReviewError::NotFound)?;
    // What it asks, and who is on record, are the gateway's word or nobody's: fail closed.
    if !loaded.tag_holds(&key) || review::altered(&loaded.reviews, |x| x.tag_holds(&key, id)) {
        return Err(ReviewError::Altered);
    }
    let rec = loaded.under(&in_force);
    let (plan, id) = (review::plan(&rec, &r, now)?, id.as_str());
    if plan == ReviewPlan::Expire {
        tx.exec_one("UPDATE approvals SET status = 'expired', decided_at = ?1 WHERE id = ?2", params![now, id])
            .map_err(StoreError::from)?;
        tx.commit().map_err(StoreError::from)?;
        return Err(ReviewError::Expired);
    }
    // Every write of a decision is held to its row (`Cached::exec_one`): a review a trigger
    // swallowed would approve with no record of who approved.
    tx.exec_one(
        "INSERT INTO approval_reviews (approval_id, reviewer_iss, reviewer_sub, decision, reason, at, passkey, tag)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
        params![id, r.reviewer_iss, r.reviewer_sub, r.decision.as_str(), r.reason, now, r.passkey, r.tag],
    )
    .map_err(StoreError::from)?;
    match plan {
        ReviewPlan::Reject => tx.exec_one(
            "UPDATE approvals SET status = 'rejected', decided_at = ?1, decision_reason = ?2 WHERE id = ?3",
            params![now, r.reason, id],
        ),
        ReviewPlan::Approve { issue: Some(approvers) } => {
            let issued = crate::domain::approval::issue_mandate(issue, &rec, &r, &approvers)?;
            tx.exec_one(
                "INSERT INTO mandates (id, kind, approval_id, subject, currency, budget_minor, max_uses, expires_at, created_at,
                                       principal_user)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params_from_iter(rows::mandate_values(&issued, &rec, now)),
            )
            .map_err(StoreError::from)?;
            tx.exec_one(
                "UPDATE approvals SET status = 'approved', decided_at = ?1, decision_reason = ?2, mandate_id = ?3, mandate = ?4
                 WHERE id = ?5",
                params![now, r.reason, issued.id, issued.jws, id],
            )
        }
        ReviewPlan::Approve { issue: None } | ReviewPlan::Expire => Ok(()),
    }
    .map_err(StoreError::from)?;
    // The decision's record commits with it, or neither does.
    let record_seq =
        record.as_ref().map(|rec| super::insert_audit(&tx, rec, None)).transpose().map_err(StoreError::from)?;
    let updated = load_approval(&tx, id)?.ok_or(ReviewError::NotFound)?;
    if updated.status != rec.status {
        insert_outbox(&tx, &decided.messages(webhook::approval_data(&updated, &page))).map_err(StoreError::from)?;
    }
    // Read back last, after every write (what a trigger any of them fired did is read too): the
    // approval as the plan left it and still the gateway's, its reviews those the plan was made on
    // plus this one as written (else another person, or nobody, would be on record), and the
    // decision's record as written.
    let now_stored = load_approval(&tx, id)?.ok_or(ReviewError::NotFound)?;
    let as_meant = now_stored == updated
        && now_stored.tag_holds(&key)
        && review::recorded_as_meant(&rec.reviews, &now_stored.reviews, &r)
        && match (record_seq, &record) {
            (Some(seq), Some(written)) => super::audit::reads_back(&tx, seq, written)?,
            _ => true,
        };
    if !as_meant {
        return Err(StoreError::Database("the review did not read back as written".into()).into());
    }
    tx.commit().map_err(StoreError::from)?;
    Ok(Reviewed { approval: updated, record_seq })
}

#[async_trait]
impl ApprovalStore for SqliteStore {
    async fn approval_get_or_create(
        &self,
        rec: ApprovalRecord,
        max: i64,
        notify: Vec<OutboxMessage>,
    ) -> Result<ApprovalRequest, StoreError> {
        let now = rec.created_at;
        self.write(move |c| {
            let tx = c.savepoint()?;
            let sql = format!(
                "SELECT {} FROM approvals WHERE idempotency_key = ?1 ORDER BY created_at DESC, rowid DESC LIMIT 1",
                rows::APPROVAL_COLS
            );
            let latest = tx.opt(&sql, params![rec.idempotency_key], rows::approval)?;
            let pending: i64 = tx.q_row(
                "SELECT COUNT(*) FROM approvals
                 WHERE principal_iss = ?1 AND principal_sub = ?2 AND principal_user IS ?4 AND status = 'pending'
                   AND expires_at > ?3",
                params![rec.principal_iss, rec.principal_sub, now, rec.principal_user],
                |r| r.get(0),
            )?;
            match (review::on_request(latest.as_ref(), pending, max, now), latest) {
                (RequestPlan::Existing, Some(existing)) => Ok(ApprovalRequest::Existing(existing)),
                (RequestPlan::TooManyPending, _) => Ok(ApprovalRequest::TooManyPending),
                (RequestPlan::Create | RequestPlan::Existing, _) => {
                    insert_approval(&tx, &rec)?;
                    insert_outbox(&tx, &notify)?;
                    tx.commit()?;
                    Ok(ApprovalRequest::Created(rec))
                }
            }
        })
        .await
    }

    async fn approval_get(&self, id: &ApprovalId) -> Result<Option<ApprovalRecord>, StoreError> {
        let id = id.clone();
        self.run(move |c| load_approval(c, id.as_str())).await
    }

    async fn approvals_pending(&self, now: UnixSecs) -> Result<i64, StoreError> {
        self.run(move |c| {
            Ok(c.q_row("SELECT COUNT(*) FROM approvals WHERE status = 'pending' AND expires_at > ?1", [now], |r| {
                r.get(0)
            })?)
        })
        .await
    }

    async fn approvals_expire(&self, now: UnixSecs) -> Result<u64, StoreError> {
        self.write(move |c| {
            Ok(c.exec(
                "UPDATE approvals SET status = 'expired', decided_at = ?1 WHERE status = 'pending' AND expires_at <= ?1",
                [now],
            )? as u64)
        })
        .await
    }

    async fn approval_insert(&self, rec: ApprovalRecord) -> Result<(), StoreError> {
        self.write(move |c| Ok(insert_approval(c, &rec)?)).await
    }

    async fn approval_list(&self, q: ApprovalQuery) -> Result<Page<(i64, ApprovalRecord)>, StoreError> {
        let ApprovalQuery { status, now, before, limit } = q;
        self.run(move |c| {
            // A pending approval past its expiry is expired, whether or not anyone touched it since.
            let sql = format!(
                "SELECT {}, rowid FROM approvals
                 WHERE (?1 IS NULL
                        OR (?1 = 'pending' AND status = 'pending' AND expires_at > ?4)
                        OR (?1 = 'expired' AND (status = 'expired' OR (status = 'pending' AND expires_at <= ?4)))
                        OR (?1 NOT IN ('pending', 'expired') AND status = ?1))
                   AND (?2 IS NULL OR rowid < ?2)
                 ORDER BY rowid DESC LIMIT ?3",
                rows::APPROVAL_COLS
            );
            let found = c.all(&sql, params![status, before, i64::from(limit) + 1, now], |r| {
                Ok((r.int(24)?, rows::approval(r)?))
            })?;
            let mut page = Page::from_overfetch(found, limit, |(seq, _)| *seq);
            for (_, a) in &mut page.items {
                a.reviews = load_reviews(c, a.id.as_str())?;
            }
            Ok(page)
        })
        .await
    }

    async fn approval_review(&self, r: ApprovalReview) -> Result<Reviewed, ReviewError> {
        self.write(move |c| review_tx(c, r)).await
    }

    async fn approval_elicitation_round(&self, id: &ApprovalId, max: i64) -> Result<Option<i64>, StoreError> {
        let id = id.to_string();
        self.write(move |c| {
            Ok(c.q_row(
                "UPDATE approvals SET elicitation_rounds = elicitation_rounds + 1
                 WHERE id = ?1 AND elicitation_rounds < ?2 RETURNING elicitation_rounds",
                params![id, max],
                |r| r.get(0),
            )
            .optional()?)
        })
        .await
    }

    async fn mandate_revoke(
        &self,
        id: &ApprovalId,
        by: &str,
        now: UnixSecs,
        record: Option<crate::domain::audit::AuditRecord>,
    ) -> Result<Option<Revoked>, StoreError> {
        let (id, by) = (id.to_string(), by.to_string());
        self.write(move |c| {
            let tx = c.savepoint()?;
            let sql = "UPDATE mandates SET revoked_at = ?1, revoked_by = ?2
                       WHERE approval_id = ?3 AND revoked_at IS NULL RETURNING id";
            let Some(mandate_id): Option<String> = tx.q_row(sql, params![now, by, id], |r| r.get(0)).optional()? else {
                return Ok(None);
            };
            // The payee this mandate's settled payment taught is forgotten with it.
            tx.exec(FORGET_PAYEES, params![now, by, id])?;
            // The revocation's record commits with it, or neither does; both are read back last.
            let record_seq = record.as_ref().map(|r| super::insert_audit(&tx, r, None)).transpose()?;
            let stored: Option<i64> =
                tx.q_row("SELECT revoked_at FROM mandates WHERE id = ?1", [&mandate_id], |r| r.get(0))?;
            let recorded = match (record_seq, &record) {
                (Some(seq), Some(written)) => super::audit::reads_back(&tx, seq, written)?,
                _ => true,
            };
            if stored != Some(now) || !recorded {
                return Err(StoreError::Database("the revocation did not read back as written".into()));
            }
            tx.commit()?;
            Ok(Some(Revoked { mandate_id, record_seq }))
        })
        .await
    }
}

/// A revoked mandate's payees (those its approval taught) are known no more.
const FORGET_PAYEES: &str =
    "UPDATE payees SET revoked_at = ?1, revoked_by = ?2 WHERE approval_id = ?3 AND revoked_at IS NULL";
