//! The gateway's record of external-rail payments, analytics and job leases (SQLite).

use rusqlite::{Connection, OptionalExtension, Row, params};

use super::{Cached, apply_guards, corrupt, db};
use crate::backend::{BackendError, Guards, PaymentKind};
use crate::clock::UnixSecs;
use crate::ids::{AccountId, PaymentId};
use crate::money::Currency;
use crate::store::{RailOpened, RailPayment, RailState, RailUpdate, StoreError, SummaryQuery, SummaryRow};

pub(super) const RAIL_COLS: &str = "seq, id, idempotency_key, rail, kind, state, from_account, to_account, amount_minor, \
                                    currency, refund_of, memo, principal_sub, mandate_id, rail_ref, receipt, phone, \
                                    reason, created_at, updated_at";

pub(super) fn rail_from_row(r: &Row<'_>) -> rusqlite::Result<(i64, RailPayment)> {
    let text = |i: usize| r.get::<_, String>(i);
    let kind = match text(4)?.as_str() {
        "payment" => PaymentKind::Payment,
        "refund" => PaymentKind::Refund,
        _ => return Err(corrupt("rail payment kind")),
    };
    let rec = RailPayment {
        id: PaymentId::parse(&text(1)?).map_err(|_| corrupt("rail payment id"))?,
        idempotency_key: text(2)?,
        rail: text(3)?,
        kind,
        state: RailState::parse(&text(5)?).ok_or_else(|| corrupt("rail payment state"))?,
        from_account: AccountId::parse(&text(6)?).map_err(|_| corrupt("rail payment account"))?,
        to_account: AccountId::parse(&text(7)?).map_err(|_| corrupt("rail payment account"))?,
        amount_minor: r.get(8)?,
        currency: Currency::parse(&text(9)?).map_err(|_| corrupt("rail payment currency"))?,
        refund_of: r
            .get::<_, Option<String>>(10)?
            .map(|s| PaymentId::parse(&s))
            .transpose()
            .map_err(|_| corrupt("rail refund_of"))?,
        memo: r.get(11)?,
        principal_sub: text(12)?,
        mandate_id: r.get(13)?,
        rail_ref: r.get(14)?,
        receipt: r.get(15)?,
        phone: r.get(16)?,
        reason: r.get(17)?,
        created_at: r.get(18)?,
        updated_at: r.get(19)?,
    };
    Ok((r.get(0)?, rec))
}

pub(super) fn load_rail(c: &Connection, column: &str, value: &str) -> rusqlite::Result<Option<RailPayment>> {
    // `column` is one of a few fixed names chosen by this module, never input.
    c.q_row(&format!("SELECT {RAIL_COLS} FROM rail_payments WHERE {column} = ?1"), [value], rail_from_row)
        .optional()
        .map(|o| o.map(|(_, r)| r))
}

fn day_of(t: UnixSecs) -> UnixSecs {
    t - t.rem_euclid(86_400)
}

/// Give back what a record drew when it opened: its day's usage and its mandate use.
fn give_back(tx: &Connection, rec: &RailPayment) -> rusqlite::Result<()> {
    if rec.kind == PaymentKind::Payment {
        tx.exec(
            "UPDATE budget_usage SET spent_minor = spent_minor - ?1, payments = payments - 1
             WHERE subject = ?2 AND day = ?3 AND currency = ?4",
            params![rec.amount_minor, rec.principal_sub, day_of(rec.created_at), rec.currency.code()],
        )?;
    }
    if let Some(m) = &rec.mandate_id {
        tx.exec(
            "UPDATE mandates SET uses = uses - 1, spent_minor = spent_minor - ?1 WHERE id = ?2",
            params![rec.amount_minor, m],
        )?;
    }
    Ok(())
}

pub(super) fn open_tx(
    conn: &mut Connection,
    mut rec: RailPayment,
    guards: Guards,
    now: UnixSecs,
) -> Result<RailOpened, BackendError> {
    let tx = conn.savepoint().map_err(db)?;
    if let Some(existing) = load_rail(&tx, "idempotency_key", &rec.idempotency_key).map_err(db)? {
        tx.commit().map_err(db)?;
        return Ok(RailOpened { rec: existing, created: false });
    }
    apply_guards(&tx, &guards, &rec.principal_sub, rec.amount_minor, rec.currency, now)?;
    rec.mandate_id = guards.mandate.map(|m| m.mandate_id);
    rec.created_at = now;
    rec.updated_at = now;
    if rec.kind == PaymentKind::Payment {
        tx.exec(
            "INSERT INTO budget_usage (subject, day, currency, spent_minor, payments) VALUES (?1, ?2, ?3, ?4, 1)
             ON CONFLICT (subject, day, currency) DO UPDATE SET spent_minor = spent_minor + excluded.spent_minor,
                                                                payments = payments + 1",
            params![rec.principal_sub, day_of(now), rec.currency.code(), rec.amount_minor],
        )
        .map_err(db)?;
    }
    tx.exec(
        "INSERT INTO rail_payments (id, idempotency_key, rail, kind, state, from_account, to_account, amount_minor,
                                    currency, refund_of, memo, principal_sub, mandate_id, rail_ref, receipt, phone,
                                    reason, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19)",
        params![
            rec.id.as_str(),
            rec.idempotency_key,
            rec.rail,
            rec.kind.as_str(),
            rec.state.as_str(),
            rec.from_account.as_str(),
            rec.to_account.as_str(),
            rec.amount_minor,
            rec.currency.code(),
            rec.refund_of.as_ref().map(|p| p.as_str()),
            rec.memo,
            rec.principal_sub,
            rec.mandate_id,
            rec.rail_ref,
            rec.receipt,
            rec.phone,
            rec.reason,
            rec.created_at,
            rec.updated_at
        ],
    )
    .map_err(db)?;
    tx.commit().map_err(db)?;
    Ok(RailOpened { rec, created: true })
}

pub(super) fn transition_tx(
    conn: &mut Connection,
    id: &str,
    from: &[RailState],
    to: RailState,
    update: RailUpdate,
    now: UnixSecs,
) -> Result<Option<RailPayment>, StoreError> {
    let tx = conn.savepoint()?;
    let Some(rec) = load_rail(&tx, "id", id)? else { return Ok(None) };
    if !from.contains(&rec.state) {
        return Ok(None);
    }
    tx.exec(
        "UPDATE rail_payments SET state = ?1, rail_ref = COALESCE(?2, rail_ref), receipt = COALESCE(?3, receipt),
                                  reason = COALESCE(?4, reason), updated_at = ?5
         WHERE id = ?6",
        params![to.as_str(), update.rail_ref, update.receipt, update.reason, now, id],
    )?;
    if to == RailState::Failed {
        give_back(&tx, &rec)?;
    }
    let updated = load_rail(&tx, "id", id)?;
    tx.commit()?;
    Ok(updated)
}

pub(super) fn abandon_tx(conn: &mut Connection, id: &str) -> Result<bool, StoreError> {
    let tx = conn.savepoint()?;
    let Some(rec) = load_rail(&tx, "id", id)? else { return Ok(false) };
    if rec.state != RailState::Submitting {
        return Ok(false);
    }
    give_back(&tx, &rec)?;
    tx.exec("DELETE FROM rail_payments WHERE id = ?1", [id])?;
    tx.commit()?;
    Ok(true)
}

pub(super) fn list(
    c: &Connection,
    states: &[RailState],
    updated_before: UnixSecs,
    limit: u32,
) -> Result<Vec<RailPayment>, StoreError> {
    let states = serde_json::to_string(&states.iter().map(|s| s.as_str()).collect::<Vec<_>>())
        .map_err(|e| StoreError::Database(e.to_string()))?;
    let mut stmt = c.prepare_cached(&format!(
        "SELECT {RAIL_COLS} FROM rail_payments
         WHERE state IN (SELECT value FROM json_each(?1)) AND updated_at <= ?2 ORDER BY updated_at, seq LIMIT ?3"
    ))?;
    let rows = stmt.query_map(params![states, updated_before, limit], rail_from_row)?;
    Ok(rows.map(|r| r.map(|(_, p)| p)).collect::<Result<_, _>>()?)
}

pub(super) fn since(
    c: &Connection,
    since: UnixSecs,
    after_seq: i64,
    limit: u32,
) -> Result<Vec<(i64, RailPayment)>, StoreError> {
    let mut stmt = c.prepare_cached(&format!(
        "SELECT {RAIL_COLS} FROM rail_payments WHERE created_at >= ?1 AND seq > ?2 ORDER BY seq LIMIT ?3"
    ))?;
    let rows = stmt.query_map(params![since, after_seq, limit], rail_from_row)?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(super) fn summary(c: &Connection, q: &SummaryQuery) -> Result<Vec<SummaryRow>, StoreError> {
    if q.accounts.is_empty() {
        return Ok(vec![]);
    }
    let accounts = serde_json::to_string(&q.accounts.iter().map(|a| a.as_str()).collect::<Vec<_>>())
        .map_err(|e| StoreError::Database(e.to_string()))?;
    let mut stmt = c.prepare_cached(
        "SELECT kind, status, currency, COUNT(*), COALESCE(SUM(amount_minor), 0) FROM (
             SELECT kind, status, currency, amount_minor, from_account, to_account, created_at FROM payments
             UNION ALL
             SELECT kind, CASE state WHEN 'succeeded' THEN 'succeeded' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
                    currency, amount_minor, from_account, to_account, created_at FROM rail_payments
         )
         WHERE created_at >= ?1 AND created_at < ?2 AND (?3 IS NULL OR currency = ?3)
           AND (from_account IN (SELECT value FROM json_each(?4)) OR to_account IN (SELECT value FROM json_each(?4)))
         GROUP BY kind, status, currency ORDER BY kind, status, currency",
    )?;
    let rows = stmt.query_map(params![q.from, q.to, q.currency.map(|c| c.code()), accounts], |r| {
        Ok(SummaryRow {
            kind: r.get(0)?,
            status: r.get(1)?,
            currency: r.get(2)?,
            count: r.get(3)?,
            total_minor: r.get(4)?,
        })
    })?;
    Ok(rows.collect::<Result<_, _>>()?)
}

pub(super) fn lease_tx(
    c: &mut Connection,
    kind: &str,
    holder: &str,
    now: UnixSecs,
    secs: i64,
) -> Result<bool, StoreError> {
    Ok(c.exec(
        "INSERT INTO job_leases (kind, holder, lease_until) VALUES (?1, ?2, ?3)
         ON CONFLICT (kind) DO UPDATE SET holder = excluded.holder, lease_until = excluded.lease_until
         WHERE job_leases.lease_until <= ?4 OR job_leases.holder = excluded.holder",
        params![kind, holder, now + secs, now],
    )? == 1)
}
