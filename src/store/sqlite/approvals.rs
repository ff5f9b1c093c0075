//! Approvals and the review state machine's transaction (SQLite).

use rusqlite::{Connection, params, params_from_iter};

use super::Cached;
use crate::clock::UnixSecs;
use crate::domain::rules::review::{self, ReviewPlan};
use crate::ids::ApprovalId;
use crate::store::rows;
use crate::store::{ApprovalRecord, MandateIssuer, Review, ReviewError, StoreError};

pub(super) fn insert_approval(tx: &Connection, rec: &ApprovalRecord) -> rusqlite::Result<usize> {
    tx.exec(
        &format!(
            "INSERT INTO approvals ({})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
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

pub(super) fn review_tx(
    c: &mut Connection,
    id: &ApprovalId,
    r: Review,
    now: UnixSecs,
    issue: MandateIssuer,
) -> Result<ApprovalRecord, ReviewError> {
    let tx = c.savepoint().map_err(StoreError::from)?;
    let rec = load_approval(&tx, id.as_str())?.ok_or(ReviewError::NotFound)?;
    let (plan, id) = (review::plan(&rec, &r, now)?, id.as_str());
    if plan == ReviewPlan::Expire {
        tx.exec("UPDATE approvals SET status = 'expired', decided_at = ?1 WHERE id = ?2", params![now, id])
            .map_err(StoreError::from)?;
        tx.commit().map_err(StoreError::from)?;
        return Err(ReviewError::Expired);
    }
    tx.exec(
        "INSERT INTO approval_reviews (approval_id, reviewer_iss, reviewer_sub, decision, reason, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![id, r.reviewer_iss, r.reviewer_sub, r.decision.as_str(), r.reason, now],
    )
    .map_err(StoreError::from)?;
    match plan {
        ReviewPlan::Reject => tx.exec(
            "UPDATE approvals SET status = 'rejected', decided_at = ?1, decision_reason = ?2 WHERE id = ?3",
            params![now, r.reason, id],
        ),
        ReviewPlan::Approve { issue: Some(approvers) } => {
            let issued = issue(&rec, &approvers).map_err(ReviewError::Mandate)?;
            tx.exec(
                "INSERT INTO mandates (id, kind, approval_id, subject, currency, budget_minor, max_uses, expires_at, created_at,
                                       principal_user)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
                params_from_iter(rows::mandate_values(&issued, &rec, now)),
            )
            .map_err(StoreError::from)?;
            tx.exec(
                "UPDATE approvals SET status = 'approved', decided_at = ?1, decision_reason = ?2, mandate_id = ?3, mandate = ?4
                 WHERE id = ?5",
                params![now, r.reason, issued.id, issued.jws, id],
            )
        }
        ReviewPlan::Approve { issue: None } | ReviewPlan::Expire => Ok(0),
    }
    .map_err(StoreError::from)?;
    let updated = load_approval(&tx, id)?.ok_or(ReviewError::NotFound)?;
    tx.commit().map_err(StoreError::from)?;
    Ok(updated)
}
