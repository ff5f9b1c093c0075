//! Approvals, the review state machine's transaction, and the mandates reviews issue (PostgreSQL).

use async_trait::async_trait;
use deadpool_postgres::{GenericClient, Pool};

use super::outbox::insert_outbox;
use super::{Cached, Mapped, PostgresStore, bind};
use crate::clock::UnixSecs;
use crate::domain::approval::{
    ApprovalRecord, ApprovalRequest, ApprovalReview, Review, ReviewError, Reviewed, Revoked,
};
use crate::domain::error::StoreError;
use crate::domain::ids::ApprovalId;
use crate::domain::ops::ApprovalQuery;
use crate::domain::payment::Page;
use crate::domain::rules::review::{self as rules, RequestPlan, ReviewPlan};
use crate::domain::webhook::{self, OutboxMessage};
use crate::store::rows::{self, Columns};
use crate::store::{ApprovalStore, wrote_one};

pub(super) async fn insert_approval(c: &impl GenericClient, rec: &ApprovalRecord) -> Result<(), StoreError> {
    let n = c.exec(
        &format!(
            "INSERT INTO approvals ({})
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22, $23, $24)",
            rows::APPROVAL_COLS
        ),
        &bind(&rows::approval_values(rec)),
    )
    .await?;
    crate::store::wrote_one("approval", n)
}

pub(super) async fn load_reviews(c: &impl GenericClient, id: &str) -> Result<Vec<Review>, StoreError> {
    let sql = format!("SELECT {} FROM approval_reviews WHERE approval_id = $1 ORDER BY at, seq", rows::REVIEW_COLS);
    c.list(&sql, &[&id], rows::review).await
}

pub(super) async fn load_approval(
    c: &impl GenericClient,
    id: &str,
    lock: bool,
) -> Result<Option<ApprovalRecord>, StoreError> {
    let lock = if lock { " FOR UPDATE" } else { "" };
    let sql = format!("SELECT {} FROM approvals WHERE id = $1{lock}", rows::APPROVAL_COLS);
    let Some(mut a) = c.get(&sql, &[&id], rows::approval).await? else { return Ok(None) };
    a.reviews = load_reviews(c, a.id.as_str()).await?;
    Ok(Some(a))
}

/// Record one reviewer's decision: the state machine (`rules::review`) under the approval's row lock.
pub(super) async fn review(pool: &Pool, ask: ApprovalReview) -> Result<Reviewed, ReviewError> {
    let ApprovalReview { id, review, issue, decided, page, in_force, key, record } = ask;
    let (id, now) = (&id, review.at);
    let mut client = pool.get().await.map_err(StoreError::from)?;
    let tx = client.transaction().await.map_err(StoreError::from)?;
    let loaded = load_approval(&tx, id.as_str(), true).await?.ok_or(ReviewError::NotFound)?;
    // What it asks, and who is on record, are the gateway's word or nobody's: fail closed.
    if !loaded.tag_holds(&key) || rules::altered(&loaded.reviews, |x| x.tag_holds(&key, id)) {
        return Err(ReviewError::Altered);
    }
    let rec = loaded.under(&in_force);
    let (plan, id) = (rules::plan(&rec, &review, now)?, id.as_str());
    if plan == ReviewPlan::Expire {
        let n = tx
            .exec("UPDATE approvals SET status = 'expired', decided_at = $1 WHERE id = $2", &[&now, &id])
            .await
            .map_err(StoreError::from)?;
        wrote_one("approval", n)?;
        tx.commit().await.map_err(StoreError::from)?;
        return Err(ReviewError::Expired);
    }
    // Every write of a decision is held to its row (`store::wrote_one`): a review a trigger
    // swallowed would approve with no record of who approved.
    let n = tx
        .exec(
            "INSERT INTO approval_reviews (approval_id, reviewer_iss, reviewer_sub, decision, reason, at, passkey, tag)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8)",
            &[
                &id,
                &review.reviewer_iss,
                &review.reviewer_sub,
                &review.decision.as_str(),
                &review.reason,
                &now,
                &review.passkey,
                &review.tag,
            ],
        )
        .await
        .map_err(StoreError::from)?;
    wrote_one("approval review", n)?;
    let n = match plan {
        ReviewPlan::Reject => {
            tx.exec(
                "UPDATE approvals SET status = 'rejected', decided_at = $1, decision_reason = $2 WHERE id = $3",
                &[&now, &review.reason, &id],
            )
            .await
        }
        ReviewPlan::Approve { issue: Some(approvers) } => {
            let issued = crate::domain::approval::issue_mandate(issue, &rec, &review, &approvers)?;
            let n = tx
                .exec(
                "INSERT INTO mandates (id, kind, approval_id, subject, currency, budget_minor, max_uses, expires_at, created_at,
                                       principal_user)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                &bind(&rows::mandate_values(&issued, &rec, now)),
            )
            .await
            .map_err(StoreError::from)?;
            wrote_one("mandate", n)?;
            tx.exec(
                "UPDATE approvals SET status = 'approved', decided_at = $1, decision_reason = $2, mandate_id = $3, mandate = $4
                 WHERE id = $5",
                &[&now, &review.reason, &issued.id, &issued.jws, &id],
            )
            .await
        }
        ReviewPlan::Approve { issue: None } | ReviewPlan::Expire => Ok(1),
    }
    .map_err(StoreError::from)?;
    wrote_one("approval", n)?;
    // The decision's record commits with it, or neither does.
    let record_seq = match &record {
        Some(r) => Some(super::audit::append_audit(&tx, r).await?),
        None => None,
    };
    let updated = load_approval(&tx, id, false).await?.ok_or(ReviewError::NotFound)?;
    if updated.status != rec.status {
        insert_outbox(&tx, &decided.messages(webhook::approval_data(&updated, &page))).await?;
    }
    // Read back last, after every write (what a trigger any of them fired did is read too): the
    // approval as the plan left it and still the gateway's, its reviews those the plan was made on
    // plus this one as written (else another person, or nobody, would be on record), and the
    // decision's record as written.
    let now_stored = load_approval(&tx, id, false).await?.ok_or(ReviewError::NotFound)?;
    let recorded = match (record_seq, &record) {
        (Some(seq), Some(written)) => super::audit::reads_back(&tx, seq, written).await?,
        _ => true,
    };
    let as_meant = now_stored == updated
        && now_stored.tag_holds(&key)
        && rules::recorded_as_meant(&rec.reviews, &now_stored.reviews, &review)
        && recorded;
    if !as_meant {
        return Err(StoreError::Database("the review did not read back as written".into()).into());
    }
    tx.commit().await.map_err(StoreError::from)?;
    Ok(Reviewed { approval: updated, record_seq })
}

#[async_trait]
impl ApprovalStore for PostgresStore {
    async fn approval_get_or_create(
        &self,
        rec: ApprovalRecord,
        max: i64,
        notify: Vec<OutboxMessage>,
    ) -> Result<ApprovalRequest, StoreError> {
        let now = rec.created_at;
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // Concurrent requests for one operation, and one agent's concurrent requests (its pending
        // count), serialise here.
        tx.exec("SELECT pg_advisory_xact_lock(hashtextextended('approval:' || $1, 0))", &[&rec.principal_sub]).await?;
        let sql = format!(
            "SELECT {} FROM approvals WHERE idempotency_key = $1 ORDER BY created_at DESC, seq DESC LIMIT 1",
            rows::APPROVAL_COLS
        );
        let latest = match tx.opt(&sql, &[&rec.idempotency_key]).await? {
            Some(row) => Some(rows::approval(&row)?),
            None => None,
        };
        let pending: i64 = tx
            .one(
                "SELECT COUNT(*) FROM approvals
                 WHERE principal_iss = $1 AND principal_sub = $2 AND principal_user IS NOT DISTINCT FROM $4
                   AND status = 'pending' AND expires_at > $3",
                &[&rec.principal_iss, &rec.principal_sub, &now, &rec.principal_user],
            )
            .await?
            .get(0);
        match (rules::on_request(latest.as_ref(), pending, max, now), latest) {
            (RequestPlan::Existing, Some(existing)) => {
                tx.commit().await?;
                Ok(ApprovalRequest::Existing(existing))
            }
            (RequestPlan::TooManyPending, _) => {
                tx.commit().await?;
                Ok(ApprovalRequest::TooManyPending)
            }
            (RequestPlan::Create | RequestPlan::Existing, _) => {
                insert_approval(&tx, &rec).await?;
                insert_outbox(&tx, &notify).await?;
                tx.commit().await?;
                Ok(ApprovalRequest::Created(rec))
            }
        }
    }

    async fn approval_get(&self, id: &ApprovalId) -> Result<Option<ApprovalRecord>, StoreError> {
        let client = self.pool.get().await?;
        load_approval(&client, id.as_str(), false).await
    }

    async fn approvals_pending(&self, now: UnixSecs) -> Result<i64, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .one("SELECT COUNT(*) FROM approvals WHERE status = 'pending' AND expires_at > $1", &[&now])
            .await?
            .get(0))
    }

    async fn approvals_expire(&self, now: UnixSecs) -> Result<u64, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .exec(
                "UPDATE approvals SET status = 'expired', decided_at = $1 WHERE status = 'pending' AND expires_at <= $1",
                &[&now],
            )
            .await?)
    }

    async fn approval_insert(&self, rec: ApprovalRecord) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        insert_approval(&client, &rec).await
    }

    async fn approval_list(&self, q: ApprovalQuery) -> Result<Page<(i64, ApprovalRecord)>, StoreError> {
        let ApprovalQuery { status, now, before, limit } = q;
        let status = status.as_deref();
        let client = self.pool.get().await?;
        let found = client
            .all(
                &format!(
                    "SELECT {}, seq FROM approvals
                     WHERE ($1::TEXT IS NULL
                            OR ($1 = 'pending' AND status = 'pending' AND expires_at > $4)
                            OR ($1 = 'expired' AND (status = 'expired' OR (status = 'pending' AND expires_at <= $4)))
                            OR ($1 NOT IN ('pending', 'expired') AND status = $1))
                       AND ($2::BIGINT IS NULL OR seq < $2)
                     ORDER BY seq DESC LIMIT $3",
                    rows::APPROVAL_COLS
                ),
                &[&status, &before, &(i64::from(limit) + 1), &now],
            )
            .await?;
        let found =
            found.iter().map(|r| Ok((r.int(24)?, rows::approval(r)?))).collect::<Result<Vec<_>, StoreError>>()?;
        let mut page = Page::from_overfetch(found, limit, |(seq, _)| *seq);
        for (_, a) in &mut page.items {
            a.reviews = load_reviews(&client, a.id.as_str()).await?;
        }
        Ok(page)
    }

    async fn approval_review(&self, r: ApprovalReview) -> Result<Reviewed, ReviewError> {
        self::review(&self.pool, r).await
    }

    async fn approval_elicitation_round(&self, id: &ApprovalId, max: i64) -> Result<Option<i64>, StoreError> {
        let client = self.pool.get().await?;
        let sql = "UPDATE approvals SET elicitation_rounds = elicitation_rounds + 1
                   WHERE id = $1 AND elicitation_rounds < $2 RETURNING elicitation_rounds";
        Ok(client.opt(sql, &[&id.as_str(), &max]).await?.map(|r| r.get(0)))
    }

    async fn mandate_revoke(
        &self,
        id: &ApprovalId,
        by: &str,
        now: UnixSecs,
        record: Option<crate::domain::audit::AuditRecord>,
    ) -> Result<Option<Revoked>, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let sql = "UPDATE mandates SET revoked_at = $1, revoked_by = $2
                   WHERE approval_id = $3 AND revoked_at IS NULL RETURNING id";
        let Some(mandate_id): Option<String> = tx.opt(sql, &[&now, &by, &id.as_str()]).await?.map(|r| r.get(0)) else {
            return Ok(None);
        };
        // The payee this mandate's settled payment taught is forgotten with it (a learning in
        // flight holds the mandate's row: it committed before this update could lock it).
        tx.exec(
            "UPDATE payees SET revoked_at = $1, revoked_by = $2 WHERE approval_id = $3 AND revoked_at IS NULL",
            &[&now, &by, &id.as_str()],
        )
        .await?;
        // The revocation's record commits with it, or neither does; both are read back last.
        let record_seq = match &record {
            Some(r) => Some(super::audit::append_audit(&tx, r).await?),
            None => None,
        };
        let stored: Option<i64> = tx.one("SELECT revoked_at FROM mandates WHERE id = $1", &[&mandate_id]).await?.get(0);
        let recorded = match (record_seq, &record) {
            (Some(seq), Some(written)) => super::audit::reads_back(&tx, seq, written).await?,
            _ => true,
        };
        if stored != Some(now) || !recorded {
            return Err(StoreError::Database("the revocation did not read back as written".into()));
        }
        tx.commit().await?;
        Ok(Some(Revoked { mandate_id, record_seq }))
    }
}
