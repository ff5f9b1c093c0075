//! The gateway's record of external-rail payments, analytics and job leases (SQLite).

use rusqlite::{Connection, params, params_from_iter};

use super::postings::{add_usage, apply_guards};
use super::{Cached, db};
use crate::clock::UnixSecs;
use crate::domain::error::BackendError;
use crate::domain::payment::Guards;
use crate::domain::rules::guards;
use crate::domain::rules::rail::{self as rules, Draws};
use crate::store::rows::{self, RAIL_COLS};
use crate::store::{RailOpened, RailPayment, RailState, RailUpdate, StoreError, SummaryQuery, SummaryRow};

pub(super) fn load_rail(c: &Connection, column: &str, value: &str) -> Result<Option<RailPayment>, StoreError> {
    // `column` is one of a few fixed names chosen by this module, never input.
    let sql = format!("SELECT {RAIL_COLS} FROM rail_payments WHERE {column} = ?1");
    Ok(c.opt(&sql, [value], rows::rail)?.map(|(_, r)| r))
}

/// Give back what a record drew when it opened: its day's usage and its mandate use.
fn give_back(tx: &Connection, draws: &Draws) -> rusqlite::Result<()> {
    let u = &draws.usage;
    tx.exec(
        &format!(
            "UPDATE {} SET spent_minor = spent_minor - ?1, payments = payments - 1
             WHERE subject = ?2 AND day = ?3 AND currency = ?4",
            guards::usage_table(u.kind)
        ),
        params![u.amount_minor, u.subject, u.day, u.currency.code()],
    )?;
    if let Some((mandate, amount)) = &draws.mandate {
        tx.exec(
            "UPDATE mandates SET uses = uses - 1, spent_minor = spent_minor - ?1 WHERE id = ?2",
            params![amount, mandate],
        )?;
    }
    Ok(())
}

pub(super) fn open_tx(
    conn: &mut Connection,
    rec: RailPayment,
    guards: Guards,
    now: UnixSecs,
) -> Result<RailOpened, BackendError> {
    let tx = conn.savepoint().map_err(db)?;
    if let Some(existing) = load_rail(&tx, "idempotency_key", &rec.idempotency_key)? {
        tx.commit().map_err(db)?;
        return Ok(RailOpened { rec: existing, created: false });
    }
    apply_guards(&tx, &guards, &rec.usage_subject(), rec.amount_minor, rec.currency, now)?;
    let rec = rules::opened(rec, &guards, now);
    add_usage(&tx, &Draws::of(&rec).usage).map_err(db)?;
    tx.exec(
        "INSERT INTO rail_payments (id, idempotency_key, rail, kind, state, from_account, to_account, amount_minor,
                                    currency, refund_of, memo, principal_sub, mandate_id, rail_ref, receipt, phone,
                                    reason, created_at, updated_at, flow, principal_user)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21)",
        params_from_iter(rows::rail_values(&rec)),
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
    if !rules::may_move(&rec, from) {
        return Ok(None);
    }
    tx.exec(
        "UPDATE rail_payments SET state = ?1, rail_ref = COALESCE(?2, rail_ref), receipt = COALESCE(?3, receipt),
                                  reason = COALESCE(?4, reason), updated_at = ?5
         WHERE id = ?6",
        params![to.as_str(), update.rail_ref, update.receipt, update.reason, now, id],
    )?;
    if let Some(draws) = rules::released_by(&rec, to) {
        give_back(&tx, &draws)?;
    }
    let updated = load_rail(&tx, "id", id)?;
    tx.commit()?;
    Ok(updated)
}

pub(super) fn abandon_tx(conn: &mut Connection, id: &str) -> Result<bool, StoreError> {
    let tx = conn.savepoint()?;
    let Some(rec) = load_rail(&tx, "id", id)? else { return Ok(false) };
    if !rules::may_abandon(&rec) {
        return Ok(false);
    }
    give_back(&tx, &Draws::of(&rec))?;
    tx.exec("DELETE FROM rail_payments WHERE id = ?1", [id])?;
    tx.commit()?;
    Ok(true)
}

pub(super) fn list(
    c: &Connection,
    rail: Option<&str>,
    states: &[RailState],
    updated_before: UnixSecs,
    limit: u32,
) -> Result<Vec<RailPayment>, StoreError> {
    let states = serde_json::to_string(&states.iter().map(|s| s.as_str()).collect::<Vec<_>>())
        .map_err(|e| StoreError::Database(e.to_string()))?;
    let sql = format!(
        "SELECT {RAIL_COLS} FROM rail_payments
         WHERE state IN (SELECT value FROM json_each(?1)) AND updated_at <= ?2 AND (?4 IS NULL OR rail = ?4)
         ORDER BY updated_at, seq LIMIT ?3"
    );
    Ok(c.all(&sql, params![states, updated_before, limit, rail], rows::rail)?.into_iter().map(|(_, p)| p).collect())
}

pub(super) fn since(
    c: &Connection,
    since: UnixSecs,
    after_seq: i64,
    limit: u32,
) -> Result<Vec<(i64, RailPayment)>, StoreError> {
    let sql =
        format!("SELECT {RAIL_COLS} FROM rail_payments WHERE created_at >= ?1 AND seq > ?2 ORDER BY seq LIMIT ?3");
    c.all(&sql, params![since, after_seq, limit], rows::rail)
}

pub(super) fn summary(c: &Connection, q: &SummaryQuery) -> Result<Vec<SummaryRow>, StoreError> {
    if q.accounts.is_empty() {
        return Ok(vec![]);
    }
    let accounts = serde_json::to_string(&q.accounts.iter().map(|a| a.as_str()).collect::<Vec<_>>())
        .map_err(|e| StoreError::Database(e.to_string()))?;
    c.all(
        "SELECT kind, status, currency, COUNT(*), COALESCE(SUM(amount_minor), 0) FROM (
             SELECT kind, status, currency, amount_minor, from_account, to_account, created_at FROM payments
             UNION ALL
             SELECT kind, CASE state WHEN 'succeeded' THEN 'succeeded' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
                    currency, amount_minor, from_account, to_account, created_at FROM rail_payments
         )
         WHERE created_at >= ?1 AND created_at < ?2 AND (?3 IS NULL OR currency = ?3)
           AND (from_account IN (SELECT value FROM json_each(?4)) OR to_account IN (SELECT value FROM json_each(?4)))
         GROUP BY kind, status, currency ORDER BY kind, status, currency",
        params![q.from, q.to, q.currency.map(|c| c.code()), accounts],
        rows::summary,
    )
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
