//! The gateway's record of external-rail payments (SQLite).

use async_trait::async_trait;
use rusqlite::{Connection, params, params_from_iter};

use super::postings::{add_usage, apply_guards};
use super::{Cached, SqliteStore, db};
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::BackendError;
use crate::domain::error::StoreError;
use crate::domain::ids::PaymentId;
use crate::domain::payment::Guards;
use crate::domain::rail::RailMove;
use crate::domain::rail::{RailOpened, RailPage, RailPayment, RailQuery, RailState, RailUpdate};
use crate::domain::rules::guards;
use crate::domain::rules::rail::{self as rules, Draws};
use crate::store::RailStore;
use crate::store::rows::{self, RAIL_COLS};

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
    audit: Option<&AuditRecord>,
    now: UnixSecs,
) -> Result<RailOpened, BackendError> {
    let tx = conn.savepoint().map_err(db)?;
    if let Some(existing) = load_rail(&tx, "idempotency_key", &rec.idempotency_key)? {
        tx.commit().map_err(db)?;
        return Ok(RailOpened { rec: existing, created: false });
    }
    // The operation's record on another rail is the answer (`send_once` refuses it as another
    // request): its family's idempotency record may have been deleted, the record stands.
    if let Some(family) = &rec.family_key
        && let Some(existing) = load_rail(&tx, "family_key", family)?
    {
        tx.commit().map_err(db)?;
        return Ok(RailOpened { rec: existing, created: false });
    }
    let rec = rules::opened(rec, &guards, now);
    let draws = Draws::of(&rec);
    apply_guards(&tx, &guards, &draws.usage, now)?;
    add_usage(&tx, &draws.usage).map_err(db)?;
    let n = tx
        .exec(
            "INSERT INTO rail_payments (id, idempotency_key, rail, kind, state, from_account, to_account, amount_minor,
                                    currency, refund_of, memo, principal_sub, mandate_id, rail_ref, receipt, phone,
                                    reason, created_at, updated_at, flow, principal_user, family_key)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20, ?21, ?22)",
            params_from_iter(rows::rail_values(&rec)),
        )
        .map_err(db)?;
    crate::store::wrote_one("rail record", n as u64).map_err(db)?;
    if let Some(r) = audit {
        super::insert_audit(&tx, r, Some(rec.id.as_str())).map_err(db)?;
    }
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
    let n = tx.exec(
        "UPDATE rail_payments SET state = ?1, rail_ref = COALESCE(?2, rail_ref), receipt = COALESCE(?3, receipt),
                                  reason = COALESCE(?4, reason), updated_at = ?5
         WHERE id = ?6",
        params![to.as_str(), update.rail_ref, update.receipt, update.reason, now, id],
    )?;
    crate::store::wrote_one("rail record", n as u64)?;
    if let Some(r) = &update.audit {
        super::insert_audit(&tx, r, Some(id))?;
    }
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

pub(super) fn list(c: &Connection, q: &RailQuery) -> Result<Vec<RailPayment>, StoreError> {
    let states = serde_json::to_string(&q.states.iter().map(|s| s.as_str()).collect::<Vec<_>>())
        .map_err(|e| StoreError::Database(e.to_string()))?;
    let sql = format!(
        "SELECT {RAIL_COLS} FROM rail_payments
         WHERE state IN (SELECT value FROM json_each(?1)) AND updated_at <= ?2 AND (?4 IS NULL OR rail = ?4)
         ORDER BY updated_at, seq LIMIT ?3"
    );
    Ok(c.all(&sql, params![states, q.updated_before, q.limit, q.rail], rows::rail)?
        .into_iter()
        .map(|(_, p)| p)
        .collect())
}

pub(super) fn since(c: &Connection, p: RailPage) -> Result<Vec<(i64, RailPayment)>, StoreError> {
    let sql =
        format!("SELECT {RAIL_COLS} FROM rail_payments WHERE created_at >= ?1 AND seq > ?2 ORDER BY seq LIMIT ?3");
    c.all(&sql, params![p.since, p.after_seq, p.limit], rows::rail)
}

#[async_trait]
impl RailStore for SqliteStore {
    async fn rail_open(
        &self,
        rec: RailPayment,
        guards: Guards,
        audit: Option<AuditRecord>,
        now: UnixSecs,
    ) -> Result<RailOpened, BackendError> {
        self.write(move |c| open_tx(c, rec, guards, audit.as_ref(), now)).await
    }

    async fn rail_transition(&self, m: RailMove<'_>, now: UnixSecs) -> Result<Option<RailPayment>, StoreError> {
        let RailMove { id, from, to, update } = m;
        let (id, from) = (id.to_string(), from.to_vec());
        self.write(move |c| transition_tx(c, &id, &from, to, update, now)).await
    }

    async fn rail_abandon(&self, id: &PaymentId) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |c| abandon_tx(c, &id)).await
    }

    async fn rail_get(&self, id: &PaymentId) -> Result<Option<RailPayment>, StoreError> {
        let id = id.to_string();
        self.run(move |c| load_rail(c, "id", &id)).await
    }

    async fn rail_by_key(&self, idempotency_key: &str) -> Result<Option<RailPayment>, StoreError> {
        let key = idempotency_key.to_string();
        self.run(move |c| load_rail(c, "idempotency_key", &key)).await
    }

    async fn rail_by_ref(&self, rail: &str, rail_ref: &str) -> Result<Option<RailPayment>, StoreError> {
        let (rail, rail_ref) = (rail.to_string(), rail_ref.to_string());
        self.run(move |c| {
            let sql = format!("SELECT {} FROM rail_payments WHERE rail = ?1 AND rail_ref = ?2", rows::RAIL_COLS);
            Ok(c.opt(&sql, params![rail, rail_ref], rows::rail)?.map(|(_, r)| r))
        })
        .await
    }

    async fn rail_list(&self, q: RailQuery) -> Result<Vec<RailPayment>, StoreError> {
        self.run_heavy(move |c| list(c, &q)).await
    }

    async fn rail_since(&self, p: RailPage) -> Result<Vec<(i64, RailPayment)>, StoreError> {
        self.run_heavy(move |c| self::since(c, p)).await
    }
}
