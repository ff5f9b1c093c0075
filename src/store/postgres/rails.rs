//! The gateway's record of external-rail payments (PostgreSQL).
//! Lock order as everywhere in this engine: the subject's budget (advisory) → the mandate row →
//! the rail record.

use async_trait::async_trait;
use deadpool_postgres::{GenericClient, Pool};

use super::postings::{add_usage, apply_guards};
use super::{Cached, Mapped, PostgresStore, TxError, bind, db};
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::BackendError;
use crate::domain::error::StoreError;
use crate::domain::ids::PaymentId;
use crate::domain::payment::Guards;
use crate::domain::rail::{RailMove, RailOpened, RailPage, RailPayment, RailQuery};
use crate::domain::rules::guards;
use crate::domain::rules::rail::{self as rules, Draws};
use crate::store::RailStore;
use crate::store::rows::{self, RAIL_COLS};

pub(super) async fn load_rail(
    c: &impl GenericClient,
    column: &str,
    value: &str,
    for_update: bool,
) -> Result<Option<RailPayment>, StoreError> {
    // `column` is one of a few fixed names chosen by this module, never input.
    let lock = if for_update { " FOR UPDATE" } else { "" };
    let sql = format!("SELECT {RAIL_COLS} FROM rail_payments WHERE {column} = $1{lock}");
    Ok(c.get(&sql, &[&value], rows::rail).await?.map(|(_, p)| p))
}

/// Lock what giving back `draws` will update, in the engine's order: the subject's budget
/// (advisory), then the mandate row; the caller locks the record after.
async fn lock_draws(tx: &impl GenericClient, draws: &Draws) -> Result<(), StoreError> {
    tx.exec("SELECT pg_advisory_xact_lock(hashtextextended('budget:' || $1, 0))", &[&draws.usage.subject]).await?;
    if let Some((mandate, _)) = &draws.mandate {
        tx.exec("SELECT 1 FROM mandates WHERE id = $1 FOR UPDATE", &[mandate]).await?;
    }
    Ok(())
}

/// Give back what a record drew when it opened: its day's usage and its mandate use.
async fn give_back(tx: &impl GenericClient, draws: &Draws) -> Result<(), StoreError> {
    let u = &draws.usage;
    tx.exec(
        &format!(
            "UPDATE {} SET spent_minor = spent_minor - $1, payments = payments - 1
             WHERE subject = $2 AND day = $3 AND currency = $4",
            guards::usage_table(u.kind)
        ),
        &[&u.amount_minor, &u.subject, &u.day, &u.currency.code()],
    )
    .await?;
    if let Some((mandate, amount)) = &draws.mandate {
        tx.exec(
            "UPDATE mandates SET uses = uses - 1, spent_minor = spent_minor - $1 WHERE id = $2",
            &[amount, mandate],
        )
        .await?;
    }
    Ok(())
}

pub(super) async fn open_once(
    pool: &Pool,
    rec: &RailPayment,
    guards: &Guards,
    audit: Option<&AuditRecord>,
    now: UnixSecs,
) -> Result<RailOpened, TxError> {
    let mut client = pool.get().await.map_err(|e| TxError::Backend(db(e)))?;
    let tx = client.transaction().await.map_err(TxError::pg)?;
    let key = rec.idempotency_key.as_str();
    if let Some(found) = load_rail(&tx, "idempotency_key", key, false).await.map_err(TxError::store)? {
        tx.commit().await.map_err(TxError::pg)?;
        return Ok(RailOpened { rec: found, created: false });
    }
    // The operation's record on another rail is the answer (`send_once` refuses it as another
    // request): its family's idempotency record may have been deleted, the record stands. Two
    // rails opening one family at once: the unique index makes the loser retry, and find it here.
    if let Some(family) = &rec.family_key
        && let Some(found) = load_rail(&tx, "family_key", family, false).await.map_err(TxError::store)?
    {
        tx.commit().await.map_err(TxError::pg)?;
        return Ok(RailOpened { rec: found, created: false });
    }
    let rec = rules::opened(rec.clone(), guards, now);
    let draws = Draws::of(&rec);
    if let Err(refusal) = apply_guards(&tx, guards, &draws.usage, now).await {
        // A concurrent open of the same key (a retry that took over an expired lease) may have
        // committed while we waited for the guards' locks: its record is the answer, not a refusal.
        if let Some(found) = load_rail(&tx, "idempotency_key", key, false).await.map_err(TxError::store)? {
            return Ok(RailOpened { rec: found, created: false });
        }
        return Err(TxError::Backend(refusal));
    }
    add_usage(&tx, &draws.usage).await.map_err(TxError::store)?;
    let n = tx
        .exec(
            "INSERT INTO rail_payments (id, idempotency_key, rail, kind, state, from_account, to_account, amount_minor,
                                    currency, refund_of, memo, principal_sub, mandate_id, rail_ref, receipt, phone,
                                    reason, created_at, updated_at, flow, principal_user, family_key)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20, $21, $22)",
            &bind(&rows::rail_values(&rec)),
        )
        .await
        .map_err(TxError::pg)?;
    crate::store::wrote_one("rail record", n).map_err(TxError::store)?;
    if let Some(r) = audit {
        super::audit::insert_audit(&tx, r, Some(rec.id.as_str())).await.map_err(TxError::store)?;
    }
    tx.commit().await.map_err(TxError::pg)?;
    Ok(RailOpened { rec, created: true })
}

pub(super) async fn transition(pool: &Pool, m: RailMove<'_>, now: UnixSecs) -> Result<Option<RailPayment>, StoreError> {
    let RailMove { id, from, to, update } = m;
    let id = id.as_str();
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let Some(rec) = load_rail(&tx, "id", id, false).await? else { return Ok(None) };
    // Budget and mandate rows are locked before the record (the engine's lock order).
    if let Some(draws) = rules::released_by(&rec, to) {
        lock_draws(&tx, &draws).await?;
    }
    let Some(rec) = load_rail(&tx, "id", id, true).await? else { return Ok(None) };
    if !rules::may_move(&rec, from) {
        return Ok(None);
    }
    let n = tx
        .exec(
            "UPDATE rail_payments SET state = $1, rail_ref = COALESCE($2, rail_ref), receipt = COALESCE($3, receipt),
                                  reason = COALESCE($4, reason), updated_at = $5
         WHERE id = $6",
            &[&to.as_str(), &update.rail_ref, &update.receipt, &update.reason, &now, &id],
        )
        .await?;
    crate::store::wrote_one("rail record", n)?;
    if let Some(r) = &update.audit {
        super::audit::insert_audit(&tx, r, Some(id)).await?;
    }
    if let Some(draws) = rules::released_by(&rec, to) {
        give_back(&tx, &draws).await?;
    }
    let updated = load_rail(&tx, "id", id, false).await?;
    tx.commit().await?;
    Ok(updated)
}

pub(super) async fn abandon(pool: &Pool, id: &str) -> Result<bool, StoreError> {
    let mut client = pool.get().await?;
    let tx = client.transaction().await?;
    let Some(rec) = load_rail(&tx, "id", id, false).await? else { return Ok(false) };
    lock_draws(&tx, &Draws::of(&rec)).await?;
    let Some(rec) = load_rail(&tx, "id", id, true).await? else { return Ok(false) };
    if !rules::may_abandon(&rec) {
        return Ok(false);
    }
    give_back(&tx, &Draws::of(&rec)).await?;
    tx.exec("DELETE FROM rail_payments WHERE id = $1", &[&id]).await?;
    tx.commit().await?;
    Ok(true)
}

pub(super) async fn list(c: &impl GenericClient, q: &RailQuery) -> Result<Vec<RailPayment>, StoreError> {
    let states: Vec<&str> = q.states.iter().map(|s| s.as_str()).collect();
    let sql = format!(
        "SELECT {RAIL_COLS} FROM rail_payments WHERE state = ANY($1) AND updated_at <= $2
           AND ($4::text IS NULL OR rail = $4) ORDER BY updated_at, seq LIMIT $3"
    );
    Ok(c.list(&sql, &[&states, &q.updated_before, &i64::from(q.limit), &q.rail], rows::rail)
        .await?
        .into_iter()
        .map(|(_, p)| p)
        .collect())
}

pub(super) async fn since(c: &impl GenericClient, p: RailPage) -> Result<Vec<(i64, RailPayment)>, StoreError> {
    let sql =
        format!("SELECT {RAIL_COLS} FROM rail_payments WHERE created_at >= $1 AND seq > $2 ORDER BY seq LIMIT $3");
    c.list(&sql, &[&p.since, &p.after_seq, &i64::from(p.limit)], rows::rail).await
}

#[async_trait]
impl RailStore for PostgresStore {
    async fn rail_open(
        &self,
        rec: RailPayment,
        guards: Guards,
        audit: Option<AuditRecord>,
        now: UnixSecs,
    ) -> Result<RailOpened, BackendError> {
        with_retry!(open_once(&self.pool, &rec, &guards, audit.as_ref(), now).await)
    }

    async fn rail_transition(&self, m: RailMove<'_>, now: UnixSecs) -> Result<Option<RailPayment>, StoreError> {
        transition(&self.pool, m, now).await
    }

    async fn rail_abandon(&self, id: &PaymentId) -> Result<bool, StoreError> {
        abandon(&self.pool, id.as_str()).await
    }

    async fn rail_get(&self, id: &PaymentId) -> Result<Option<RailPayment>, StoreError> {
        let client = self.pool.get().await?;
        load_rail(&client, "id", id.as_str(), false).await
    }

    async fn rail_by_key(&self, idempotency_key: &str) -> Result<Option<RailPayment>, StoreError> {
        let client = self.pool.get().await?;
        load_rail(&client, "idempotency_key", idempotency_key, false).await
    }

    async fn rail_by_ref(&self, rail: &str, rail_ref: &str) -> Result<Option<RailPayment>, StoreError> {
        let client = self.pool.get().await?;
        let sql = format!("SELECT {} FROM rail_payments WHERE rail = $1 AND rail_ref = $2", rows::RAIL_COLS);
        Ok(client.get(&sql, &[&rail, &rail_ref], rows::rail).await?.map(|(_, p)| p))
    }

    async fn rail_list(&self, q: RailQuery) -> Result<Vec<RailPayment>, StoreError> {
        list(&self.pool.get().await?, &q).await
    }

    async fn rail_since(&self, p: RailPage) -> Result<Vec<(i64, RailPayment)>, StoreError> {
        self::since(&self.pool.get().await?, p).await
    }
}
