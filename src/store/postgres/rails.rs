//! The gateway's record of external-rail payments, analytics and job leases (PostgreSQL).
//! Lock order as everywhere in this engine: the subject's budget (advisory) → the mandate row →
//! the rail record.

use deadpool_postgres::GenericClient;
use tokio_postgres::Row;

use super::{Cached, TxError, apply_guards, corrupt, db};
use crate::backend::{Guards, PaymentKind};
use crate::clock::UnixSecs;
use crate::ids::{AccountId, PaymentId};
use crate::money::Currency;
use crate::store::{RailOpened, RailPayment, RailState, RailUpdate, StoreError, SummaryQuery, SummaryRow};

pub(super) const RAIL_COLS: &str = "seq, id, idempotency_key, rail, kind, state, from_account, to_account, amount_minor, \
                                    currency, refund_of, memo, principal_sub, mandate_id, rail_ref, receipt, phone, \
                                    reason, created_at, updated_at";

pub(super) fn rail_from_row(r: &Row) -> Result<(i64, RailPayment), StoreError> {
    let kind = match r.get::<_, &str>(4) {
        "payment" => PaymentKind::Payment,
        "refund" => PaymentKind::Refund,
        _ => return Err(corrupt("rail payment kind")),
    };
    let rec = RailPayment {
        id: PaymentId::parse(r.get(1)).map_err(|_| corrupt("rail payment id"))?,
        idempotency_key: r.get(2),
        rail: r.get(3),
        kind,
        state: RailState::parse(r.get(5)).ok_or_else(|| corrupt("rail payment state"))?,
        from_account: AccountId::parse(r.get(6)).map_err(|_| corrupt("rail payment account"))?,
        to_account: AccountId::parse(r.get(7)).map_err(|_| corrupt("rail payment account"))?,
        amount_minor: r.get(8),
        currency: Currency::parse(r.get(9)).map_err(|_| corrupt("rail payment currency"))?,
        refund_of: r
            .get::<_, Option<&str>>(10)
            .map(PaymentId::parse)
            .transpose()
            .map_err(|_| corrupt("rail refund_of"))?,
        memo: r.get(11),
        principal_sub: r.get(12),
        mandate_id: r.get(13),
        rail_ref: r.get(14),
        receipt: r.get(15),
        phone: r.get(16),
        reason: r.get(17),
        created_at: r.get(18),
        updated_at: r.get(19),
    };
    Ok((r.get(0), rec))
}

pub(super) async fn load_rail(
    c: &impl GenericClient,
    column: &str,
    value: &str,
    for_update: bool,
) -> Result<Option<RailPayment>, StoreError> {
    // `column` is one of a few fixed names chosen by this module, never input.
    let lock = if for_update { " FOR UPDATE" } else { "" };
    let row = c.opt(&format!("SELECT {RAIL_COLS} FROM rail_payments WHERE {column} = $1{lock}"), &[&value]).await?;
    row.map(|r| rail_from_row(&r).map(|(_, p)| p)).transpose()
}

fn day_of(t: UnixSecs) -> UnixSecs {
    t - t.rem_euclid(86_400)
}

async fn give_back(tx: &impl GenericClient, rec: &RailPayment) -> Result<(), StoreError> {
    if rec.kind == PaymentKind::Payment {
        tx.exec(
            "UPDATE budget_usage SET spent_minor = spent_minor - $1, payments = payments - 1
             WHERE subject = $2 AND day = $3 AND currency = $4",
            &[&rec.amount_minor, &rec.principal_sub, &day_of(rec.created_at), &rec.currency.code()],
        )
        .await?;
    }
    if let Some(m) = &rec.mandate_id {
        tx.exec(
            "UPDATE mandates SET uses = uses - 1, spent_minor = spent_minor - $1 WHERE id = $2",
            &[&rec.amount_minor, m],
        )
        .await?;
    }
    Ok(())
}

pub(super) async fn open_once(
    pool: &deadpool_postgres::Pool,
    rec: &RailPayment,
    guards: &Guards,
    now: UnixSecs,
) -> Result<RailOpened, TxError> {
    let mut client = pool.get().await.map_err(|e| TxError::Backend(db(e)))?;
    let tx = client.transaction().await.map_err(TxError::pg)?;
    let key = rec.idempotency_key.as_str();
    if let Some(found) = load_rail(&tx, "idempotency_key", key, false).await.map_err(TxError::store)? {
        tx.commit().await.map_err(TxError::pg)?;
        return Ok(RailOpened { rec: found, created: false });
    }
    if let Err(refusal) = apply_guards(&tx, guards, &rec.principal_sub, rec.amount_minor, rec.currency, now).await {
        // A concurrent open of the same key (a retry that took over an expired lease) may have
        // committed while we waited for the guards' locks: its record is the answer, not a refusal.
        if let Some(found) = load_rail(&tx, "idempotency_key", key, false).await.map_err(TxError::store)? {
            return Ok(RailOpened { rec: found, created: false });
        }
        return Err(TxError::Backend(refusal));
    }
    let mut rec = rec.clone();
    rec.mandate_id = guards.mandate.as_ref().map(|m| m.mandate_id.clone());
    rec.created_at = now;
    rec.updated_at = now;
    if rec.kind == PaymentKind::Payment {
        tx.exec(
            "INSERT INTO budget_usage (subject, day, currency, spent_minor, payments) VALUES ($1, $2, $3, $4, 1)
             ON CONFLICT (subject, day, currency) DO UPDATE SET spent_minor = budget_usage.spent_minor + excluded.spent_minor,
                                                                payments = budget_usage.payments + 1",
            &[&rec.principal_sub, &day_of(now), &rec.currency.code(), &rec.amount_minor],
        )
        .await
        .map_err(TxError::pg)?;
    }
    tx.exec(
        "INSERT INTO rail_payments (id, idempotency_key, rail, kind, state, from_account, to_account, amount_minor,
                                    currency, refund_of, memo, principal_sub, mandate_id, rail_ref, receipt, phone,
                                    reason, created_at, updated_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19)",
        &[
            &rec.id.as_str(),
            &rec.idempotency_key,
            &rec.rail,
            &rec.kind.as_str(),
            &rec.state.as_str(),
            &rec.from_account.as_str(),
            &rec.to_account.as_str(),
            &rec.amount_minor,
            &rec.currency.code(),
            &rec.refund_of.as_ref().map(|p| p.as_str()),
            &rec.memo,
            &rec.principal_sub,
            &rec.mandate_id,
            &rec.rail_ref,
            &rec.receipt,
            &rec.phone,
            &rec.reason,
            &rec.created_at,
            &rec.updated_at,
        ],
    )
    .await
    .map_err(TxError::pg)?;
    tx.commit().await.map_err(TxError::pg)?;
    Ok(RailOpened { rec, created: true })
}

pub(super) async fn transition(
    pool: &deadpool_postgres::Pool,
    id: &str,
    from: &[RailState],
    to: RailState,
    update: RailUpdate,
    now: UnixSecs,
) -> Result<Option<RailPayment>, StoreError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let Some(rec) = load_rail(&tx, "id", id, false).await? else { return Ok(None) };
    // Budget and mandate rows are locked before the record (the engine's lock order).
    if to == RailState::Failed && rec.kind == PaymentKind::Payment {
        tx.exec("SELECT pg_advisory_xact_lock(hashtextextended('budget:' || $1, 0))", &[&rec.principal_sub]).await?;
    }
    if let (RailState::Failed, Some(m)) = (to, &rec.mandate_id) {
        tx.exec("SELECT 1 FROM mandates WHERE id = $1 FOR UPDATE", &[m]).await?;
    }
    let Some(rec) = load_rail(&tx, "id", id, true).await? else { return Ok(None) };
    if !from.contains(&rec.state) {
        return Ok(None);
    }
    tx.exec(
        "UPDATE rail_payments SET state = $1, rail_ref = COALESCE($2, rail_ref), receipt = COALESCE($3, receipt),
                                  reason = COALESCE($4, reason), updated_at = $5
         WHERE id = $6",
        &[&to.as_str(), &update.rail_ref, &update.receipt, &update.reason, &now, &id],
    )
    .await?;
    if to == RailState::Failed {
        give_back(&tx, &rec).await?;
    }
    let updated = load_rail(&tx, "id", id, false).await?;
    tx.commit().await?;
    Ok(updated)
}

pub(super) async fn abandon(pool: &deadpool_postgres::Pool, id: &str) -> Result<bool, StoreError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let Some(rec) = load_rail(&tx, "id", id, false).await? else { return Ok(false) };
    if rec.kind == PaymentKind::Payment {
        tx.exec("SELECT pg_advisory_xact_lock(hashtextextended('budget:' || $1, 0))", &[&rec.principal_sub]).await?;
    }
    if let Some(m) = &rec.mandate_id {
        tx.exec("SELECT 1 FROM mandates WHERE id = $1 FOR UPDATE", &[m]).await?;
    }
    let Some(rec) = load_rail(&tx, "id", id, true).await? else { return Ok(false) };
    if rec.state != RailState::Submitting {
        return Ok(false);
    }
    give_back(&tx, &rec).await?;
    tx.exec("DELETE FROM rail_payments WHERE id = $1", &[&id]).await?;
    tx.commit().await?;
    Ok(true)
}

pub(super) async fn list(
    c: &impl GenericClient,
    states: &[RailState],
    updated_before: UnixSecs,
    limit: u32,
) -> Result<Vec<RailPayment>, StoreError> {
    let states: Vec<&str> = states.iter().map(|s| s.as_str()).collect();
    let rows = c
        .all(
            &format!(
                "SELECT {RAIL_COLS} FROM rail_payments WHERE state = ANY($1) AND updated_at <= $2
                 ORDER BY updated_at, seq LIMIT $3"
            ),
            &[&states, &updated_before, &i64::from(limit)],
        )
        .await?;
    rows.iter().map(|r| rail_from_row(r).map(|(_, p)| p)).collect()
}

pub(super) async fn since(
    c: &impl GenericClient,
    since: UnixSecs,
    after_seq: i64,
    limit: u32,
) -> Result<Vec<(i64, RailPayment)>, StoreError> {
    let rows = c
        .all(
            &format!("SELECT {RAIL_COLS} FROM rail_payments WHERE created_at >= $1 AND seq > $2 ORDER BY seq LIMIT $3"),
            &[&since, &after_seq, &i64::from(limit)],
        )
        .await?;
    rows.iter().map(rail_from_row).collect()
}

pub(super) async fn summary(c: &impl GenericClient, q: &SummaryQuery) -> Result<Vec<SummaryRow>, StoreError> {
    if q.accounts.is_empty() {
        return Ok(vec![]);
    }
    let accounts: Vec<&str> = q.accounts.iter().map(|a| a.as_str()).collect();
    let rows = c
        .all(
            "SELECT kind, status, currency, COUNT(*), COALESCE(SUM(amount_minor), 0)::BIGINT FROM (
                 SELECT kind, status, currency, amount_minor, from_account, to_account, created_at FROM payments
                 UNION ALL
                 SELECT kind, CASE state WHEN 'succeeded' THEN 'succeeded' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
                        currency, amount_minor, from_account, to_account, created_at FROM rail_payments
             ) p
             WHERE created_at >= $1 AND created_at < $2 AND ($3::TEXT IS NULL OR currency = $3)
               AND (from_account = ANY($4) OR to_account = ANY($4))
             GROUP BY kind, status, currency ORDER BY kind, status, currency",
            &[&q.from, &q.to, &q.currency.map(|c| c.code()), &accounts],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| SummaryRow {
            kind: r.get(0),
            status: r.get(1),
            currency: r.get(2),
            count: r.get(3),
            total_minor: r.get(4),
        })
        .collect())
}

pub(super) async fn lease(
    c: &impl GenericClient,
    kind: &str,
    holder: &str,
    now: UnixSecs,
    secs: i64,
) -> Result<bool, StoreError> {
    Ok(c.exec(
        "INSERT INTO job_leases (kind, holder, lease_until) VALUES ($1, $2, $3)
         ON CONFLICT (kind) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until
         WHERE job_leases.lease_until <= $4 OR job_leases.holder = excluded.holder",
        &[&kind, &holder, &(now + secs), &now],
    )
    .await?
        == 1)
}
