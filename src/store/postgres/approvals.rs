//! Approvals and the review state machine's transaction (PostgreSQL).

use deadpool_postgres::{GenericClient, Pool};

use super::{Cached, Mapped, bind};
use crate::clock::UnixSecs;
use crate::domain::rules::review::{self as rules, ReviewPlan};
use crate::ids::ApprovalId;
use crate::store::rows;
use crate::store::{ApprovalRecord, MandateIssuer, Review, ReviewError, StoreError};

pub(super) async fn insert_approval(c: &impl GenericClient, rec: &ApprovalRecord) -> Result<(), StoreError> {
    c.exec(
        &format!(
            "INSERT INTO approvals ({})
             VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)",
            rows::APPROVAL_COLS
        ),
        &bind(&rows::approval_values(rec)),
    )
    .await?;
    Ok(())
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
pub(super) async fn review(
    pool: &Pool,
    id: &ApprovalId,
    review: Review,
    now: UnixSecs,
    issue: MandateIssuer,
) -> Result<ApprovalRecord, ReviewError> {
    let mut client = pool.get().await.map_err(StoreError::from)?;
    let tx = client.transaction().await.map_err(StoreError::from)?;
    let rec = load_approval(&tx, id.as_str(), true).await?.ok_or(ReviewError::NotFound)?;
    let (plan, id) = (rules::plan(&rec, &review, now)?, id.as_str());
    if plan == ReviewPlan::Expire {
        tx.exec("UPDATE approvals SET status = 'expired', decided_at = $1 WHERE id = $2", &[&now, &id])
            .await
            .map_err(StoreError::from)?;
        tx.commit().await.map_err(StoreError::from)?;
        return Err(ReviewError::Expired);
    }
    tx.exec(
        "INSERT INTO approval_reviews (approval_id, reviewer_iss, reviewer_sub, decision, reason, at) VALUES ($1, $2, $3, $4, $5, $6)",
        &[&id, &review.reviewer_iss, &review.reviewer_sub, &review.decision.as_str(), &review.reason, &now],
    )
    .await
    .map_err(StoreError::from)?;
    match plan {
        ReviewPlan::Reject => {
            tx.exec(
                "UPDATE approvals SET status = 'rejected', decided_at = $1, decision_reason = $2 WHERE id = $3",
                &[&now, &review.reason, &id],
            )
            .await
        }
        ReviewPlan::Approve { issue: Some(approvers) } => {
            let issued = issue(&rec, &approvers).map_err(ReviewError::Mandate)?;
            tx.exec(
                "INSERT INTO mandates (id, kind, approval_id, subject, currency, budget_minor, max_uses, expires_at, created_at,
                                       principal_user)
                 VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10)",
                &bind(&rows::mandate_values(&issued, &rec, now)),
            )
            .await
            .map_err(StoreError::from)?;
            tx.exec(
                "UPDATE approvals SET status = 'approved', decided_at = $1, decision_reason = $2, mandate_id = $3, mandate = $4
                 WHERE id = $5",
                &[&now, &review.reason, &issued.id, &issued.jws, &id],
            )
            .await
        }
        ReviewPlan::Approve { issue: None } | ReviewPlan::Expire => Ok(0),
    }
    .map_err(StoreError::from)?;
    let updated = load_approval(&tx, id, false).await?.ok_or(ReviewError::NotFound)?;
    tx.commit().await.map_err(StoreError::from)?;
    Ok(updated)
}
