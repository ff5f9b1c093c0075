//! The reference ledger's posting transactions (SQLite): load what a rule needs, ask it, write its
//! plan. Every payment is one savepoint inside the writer's batch transaction.

use rusqlite::{Connection, params, params_from_iter};

use super::{Cached, JobScope, db, insert_audit};
use crate::clock::UnixSecs;
use crate::domain::error::BackendError;
use crate::domain::error::StoreError;
use crate::domain::idempotency::{NewIdempotencyRecord, Reservation};
use crate::domain::ids::AccountId;
use crate::domain::payee;
use crate::domain::payment::{AccountRow, Attempt, Claim, Guards, Payment, RefundRequest, TransferRequest};
use crate::domain::rules::guards::{self, BudgetUsage, UsageDraw};
use crate::domain::rules::ledger::DoubleEntry;
use crate::domain::rules::reservation::{self, EarlierKeys, ReserveStep};
use crate::domain::rules::{PostingPlan, refund, transfer};
use crate::idempotency::StoredOutcome;
use crate::store::rows;
use crate::store::{Posting, completed_outcome};

/// `column` is one of a few fixed names chosen by this module, never input.
pub(super) fn load_payment(c: &Connection, column: &str, value: &str) -> Result<Option<Payment>, StoreError> {
    let sql = format!("SELECT {} FROM payments WHERE {column} = ?1", rows::PAYMENT_COLS);
    Ok(c.opt(&sql, [value], rows::payment)?.map(|(p, _)| p))
}

pub(super) fn load_account(c: &Connection, id: &AccountId) -> Result<Option<AccountRow>, StoreError> {
    c.opt("SELECT currency, balance_minor, allow_overdraft FROM accounts WHERE id = ?1", [id.as_str()], |r| {
        rows::account(r, 0)
    })
}

/// Apply one leg of `entry` and return the balance after it.
pub(super) fn post(tx: &Connection, entry: &DoubleEntry<'_>, leg: usize, now: UnixSecs) -> rusqlite::Result<i64> {
    let (account, amount) = entry.legs[leg];
    let balance: i64 = tx.q_row(
        "UPDATE accounts SET balance_minor = balance_minor + ?1 WHERE id = ?2 RETURNING balance_minor",
        params![amount, account],
        |r| r.get(0),
    )?;
    tx.exec_one(
        "INSERT INTO postings (payment_id, account_id, amount_minor, currency, balance_after_minor, description, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![entry.payment_id, account, amount, entry.currency.code(), balance, entry.description, now],
    )?;
    Ok(balance)
}

/// Count a payment or refund toward its subject's day.
pub(super) fn add_usage(tx: &Connection, d: &UsageDraw) -> rusqlite::Result<()> {
    let table = guards::usage_table(d.kind);
    tx.exec_one(
        &format!(
            "INSERT INTO {table} (subject, day, currency, spent_minor, payments) VALUES (?1, ?2, ?3, ?4, 1)
             ON CONFLICT (subject, day, currency) DO UPDATE SET spent_minor = spent_minor + excluded.spent_minor,
                                                                payments = payments + 1"
        ),
        params![d.subject, d.day, d.currency.code(), d.amount_minor],
    )
}

/// Check the guards that must hold where the payment commits, and record mandate draws and the
/// payee's daily usage (the subject's own usage is `add_usage`'s).
pub(super) fn apply_guards(tx: &Connection, g: &Guards, draw: &UsageDraw, now: UnixSecs) -> Result<(), BackendError> {
    let (subject, amount, currency) = (&draw.subject, draw.amount_minor, draw.currency);
    if let Some(b) = &g.budget {
        let table = guards::usage_table(b.kind);
        let usage = tx
            .q_row(
                &format!(
                    "SELECT (SELECT COALESCE(SUM(payments), 0) FROM {table} WHERE subject = ?1 AND day = ?2),
                            (SELECT COALESCE(SUM(spent_minor), 0) FROM {table} WHERE subject = ?1 AND day = ?2 AND currency = ?3)"
                ),
                params![subject, b.since, currency.code()],
                |r| Ok(BudgetUsage { payments: r.get(0)?, spent_minor: r.get(1)? }),
            )
            .map_err(db)?;
        guards::check_budget(b, usage, amount, currency)?;
    }
    if let Some(cap) = &g.payee {
        let paid: i64 = tx
            .q_row(
                "SELECT COALESCE(SUM(spent_minor), 0) FROM payee_usage
                 WHERE owner = ?1 AND payee = ?2 AND day = ?3 AND currency = ?4",
                params![cap.owner, cap.payee, cap.since, currency.code()],
                |r| r.get(0),
            )
            .map_err(db)?;
        payee::check_cap(cap, paid, amount, currency).map_err(BackendError::BudgetExceeded)?;
        if let Some(cooling) = &cap.cooling {
            let paid: i64 = tx
                .q_row(COOLING_PAID, params![cap.owner, cap.payee, cooling.known_since, currency.code()], |r| r.get(0))
                .map_err(db)?;
            payee::check_cooling(cap, paid, amount, currency).map_err(BackendError::BudgetExceeded)?;
        }
    }
    if let Some(d) = &g.mandate {
        let sql = format!("SELECT {} FROM mandates WHERE id = ?1", rows::MANDATE_COLS);
        let mandate = tx.opt(&sql, [&d.mandate_id], rows::mandate).map_err(db)?;
        guards::check_mandate(mandate.as_ref(), amount, currency, now)?;
        tx.exec_one(
            "UPDATE mandates SET uses = uses + 1, spent_minor = spent_minor + ?1 WHERE id = ?2",
            params![amount, d.mandate_id],
        )
        .map_err(db)?;
        // Read back: the draw is what the row now says (a trigger that rewrote it after the
        // statement — the use count reset — would let the mandate be drawn past its bounds).
        let drawn = tx
            .q_row("SELECT uses, spent_minor FROM mandates WHERE id = ?1", [&d.mandate_id], |r| {
                Ok((r.get::<_, i64>(0)?, r.get::<_, i64>(1)?))
            })
            .map_err(db)?;
        if let Some(m) = &mandate {
            guards::drawn_as_meant(m, amount, drawn).map_err(db)?;
        }
    }
    // Every check passed: the writes (a check failing after a write would poison the batch).
    if let Some(cap) = &g.payee {
        tx.exec_one(
                "INSERT INTO payee_usage (owner, payee, day, currency, spent_minor, payments) VALUES (?1, ?2, ?3, ?4, ?5, 1)
                 ON CONFLICT (owner, payee, day, currency) DO UPDATE SET spent_minor = spent_minor + excluded.spent_minor,
                                                                      payments = payments + 1",
                params![cap.owner, cap.payee, cap.since, currency.code(), amount],
            )
            .map_err(db)?;
        if let Some(cooling) = &cap.cooling {
            tx.exec_one(ADD_COOLING, params![cap.owner, cap.payee, cooling.known_since, currency.code(), amount])
                .map_err(db)?;
        }
    }
    Ok(())
}

/// What a payee was paid by its owner since it became known (the cooling-off total's usage).
const COOLING_PAID: &str = "SELECT COALESCE(SUM(spent_minor), 0) FROM payee_cooling_usage
     WHERE owner = ?1 AND payee = ?2 AND known_since = ?3 AND currency = ?4";
/// Count a payment toward its payee's cooling-off total.
const ADD_COOLING: &str = "INSERT INTO payee_cooling_usage (owner, payee, known_since, currency, spent_minor, payments)
     VALUES (?1, ?2, ?3, ?4, ?5, 1)
     ON CONFLICT (owner, payee, known_since, currency) DO UPDATE SET spent_minor = spent_minor + excluded.spent_minor,
                                                                  payments = payments + 1";

/// Write a transfer's or refund's plan in its posting's job: a new payment draws its guards and posts
/// (a replay writes nothing of its own). The request's audit record goes in with it; the keys are
/// [`posting_tx`]'s.
fn write_posting(tx: &Connection, plan: PostingPlan, w: Posting<'_>, now: UnixSecs) -> Result<Payment, BackendError> {
    let p = match plan {
        PostingPlan::Replay(existing) => existing,
        PostingPlan::Post(p) => {
            let draw = guards::usage_draw(p.kind, &p.usage_subject(), p.currency, p.amount_minor, now);
            apply_guards(tx, w.guards, &draw, now)?;
            let mandate_id = w.guards.mandate.as_ref().map(|m| m.mandate_id.as_str());
            tx.exec_one(
                "INSERT INTO payments (id, idempotency_key, kind, status, from_account, to_account, amount_minor, currency,
                                       refunded_minor, refund_of, memo, principal_sub, created_at, mandate_id,
                                       principal_user)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15)",
                params_from_iter(rows::payment_values(&p, w.key, mandate_id)),
            )
            .map_err(db)?;
            add_usage(tx, &draw).map_err(db)?;
            if let Some(original) = &p.refund_of {
                tx.exec_one(
                    "UPDATE payments SET refunded_minor = refunded_minor + ?1 WHERE id = ?2",
                    params![p.amount_minor, original.as_str()],
                )
                .map_err(db)?;
            }
            let entry = DoubleEntry::of_payment(&p);
            post(tx, &entry, 0, now).map_err(db)?;
            post(tx, &entry, 1, now).map_err(db)?;
            p
        }
    };
    if let Some(r) = w.audit {
        insert_audit(tx, r, Some(p.id.as_str())).map_err(db)?;
    }
    Ok(p)
}

/// Reserve one idempotency key (`domain::rules::reservation::decide`) in the caller's transaction.
pub(crate) fn reserve_key(
    tx: &Connection,
    rec: &NewIdempotencyRecord,
    now: UnixSecs,
) -> Result<Reservation, StoreError> {
    let step = decide_key(tx, rec, now)?;
    // The key's record is what holds the operation (for a rail's shared key, the only thing that
    // does): a write a trigger swallowed is no reservation (`store::wrote_one`).
    let written = match &step {
        ReserveStep::Claim => Some(insert_record(tx, rec, None, now)?),
        ReserveStep::TakeOver => Some(tx.exec(
            "UPDATE idempotency_records SET lease_until = ?1 WHERE key = ?2",
            params![rec.lease_until, rec.key],
        )?),
        ReserveStep::Found(_) => None,
    };
    if let Some(n) = written {
        crate::store::wrote_one("idempotency record", n as u64)?;
    }
    Ok(step.reservation())
}

/// The record stored under `rec.key` and what it means for `rec` (`rules::reservation::decide`).
fn decide_key(tx: &Connection, rec: &NewIdempotencyRecord, now: UnixSecs) -> Result<ReserveStep, StoreError> {
    let existing = tx.opt(
        "SELECT fingerprint, state, outcome, lease_until, expires_at FROM idempotency_records WHERE key = ?1",
        [&rec.key],
        |r| rows::idempotency(r, 0),
    )?;
    reservation::decide(existing, &rec.fingerprint, now)
}

/// `rec` as a new record (replacing one past retention): in flight without an outcome, completed
/// with one.
fn insert_record(
    tx: &Connection,
    rec: &NewIdempotencyRecord,
    outcome: Option<&str>,
    now: UnixSecs,
) -> rusqlite::Result<usize> {
    let state = if outcome.is_some() { reservation::COMPLETED } else { reservation::IN_FLIGHT };
    tx.exec(
        "INSERT OR REPLACE INTO idempotency_records
           (key, fingerprint, tool, principal_iss, principal_sub, state, outcome, lease_until, created_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        params![
            rec.key,
            rec.fingerprint,
            rec.tool,
            rec.principal_iss,
            rec.principal_sub,
            state,
            outcome,
            rec.lease_until,
            now,
            rec.expires_at
        ],
    )
}

/// What a claim found under its keys, read before the posting: every key free (how each will be
/// written once the posting's outcome is known), or one already answering.
enum Checked {
    Free(Vec<ReserveStep>),
    Held(BackendError),
}

/// Check a request's keys in order (`domain::rules::reservation::decide`), writing nothing while
/// they are free: the posting's outcome is written under them once, in its final state
/// ([`write_keys`]). When key `i` already answers, the keys before it get that answer or are given
/// back (`rules::reservation::on_claim_answered`).
fn check_keys(tx: &Connection, claim: &Claim, now: UnixSecs) -> Result<Checked, StoreError> {
    let mut steps = Vec::with_capacity(claim.records.len());
    for (i, rec) in claim.records.iter().enumerate() {
        let step = decide_key(tx, rec, now)?;
        if let ReserveStep::Found(reservation) = step {
            let outcome = match reservation::on_claim_answered(&reservation, &rec.fingerprint) {
                EarlierKeys::Complete(outcome) => Some(outcome),
                EarlierKeys::Release => None,
            };
            write_keys(tx, &claim.records[..i], &steps, outcome.as_deref(), now)?;
            return Ok(Checked::Held(BackendError::KeyHeld { key: rec.key.clone(), reservation }));
        }
        steps.push(step);
    }
    Ok(Checked::Free(steps))
}

/// Write the claimed keys' outcome in its final state, one statement a key: a key nobody held gets
/// its record (replacing one past retention), a key taken over from a lapsed holder is completed;
/// no outcome (given back) leaves nothing under them.
fn write_keys(
    tx: &Connection,
    records: &[NewIdempotencyRecord],
    steps: &[ReserveStep],
    outcome: Option<&str>,
    now: UnixSecs,
) -> Result<(), StoreError> {
    for (rec, step) in records.iter().zip(steps) {
        let (written, meant) = match (step, outcome) {
            (ReserveStep::Claim, Some(o)) => (insert_record(tx, rec, Some(o), now)?, 1),
            (ReserveStep::TakeOver, Some(o)) => (
                tx.exec(
                    "UPDATE idempotency_records SET state = 'completed', outcome = ?1, lease_until = ?2
                     WHERE key = ?3 AND state = 'in_flight'",
                    params![o, rec.lease_until, rec.key],
                )?,
                1,
            ),
            (ReserveStep::TakeOver, None) => {
                (tx.exec("DELETE FROM idempotency_records WHERE key = ?1 AND state = 'in_flight'", [&rec.key])?, 0)
            }
            (ReserveStep::Claim, None) | (ReserveStep::Found(_), _) => (0, 0),
        };
        if meant == 1 {
            crate::store::wrote_one("idempotency record", written as u64)?;
        }
    }
    Ok(())
}

/// One posting's job (`JobScope`: no savepoint inside a batch): check the attempt's claimed keys
/// (reads only), post, then write the keys' outcome once. A refusal is decided before the posting
/// writes anything, and leaves under the keys what the claim says (the failed outcome, or
/// nothing). Without a claim the keys were reserved before (in flight) and are completed here.
fn posting_tx(
    conn: &Connection,
    attempt: &Attempt,
    now: UnixSecs,
    post: impl FnOnce(&Connection) -> Result<Payment, BackendError>,
) -> Result<Payment, BackendError> {
    let job = JobScope::begin(conn).map_err(db)?;
    let claimed = match &attempt.claim {
        None => None,
        Some(c) => match check_keys(conn, c, now)? {
            Checked::Free(steps) => Some((c, steps)),
            Checked::Held(held) => {
                job.release().map_err(db)?;
                return Err(held);
            }
        },
    };
    match post(conn) {
        Ok(p) => {
            let outcome = completed_outcome(&p);
            match &claimed {
                Some((c, steps)) => write_keys(conn, &c.records, steps, Some(&outcome), now)?,
                None => {
                    for k in std::iter::once(&attempt.key).chain(&attempt.alias_key) {
                        conn.exec(
                            "UPDATE idempotency_records SET state = 'completed', outcome = ?1
                             WHERE key = ?2 AND state = 'in_flight'",
                            params![outcome, k],
                        )
                        .map_err(db)?;
                    }
                }
            }
            job.release().map_err(db)?;
            Ok(p)
        }
        Err(refusal) => {
            job.undo().map_err(db)?;
            if let Some((c, steps)) = &claimed {
                let outcome = StoredOutcome::after_refusal(&refusal).map(|o| o.to_json());
                write_keys(conn, &c.records, steps, outcome.as_deref(), now)?;
                job.release().map_err(db)?;
            }
            Err(refusal)
        }
    }
}

pub(super) fn transfer_tx(conn: &Connection, req: TransferRequest, now: UnixSecs) -> Result<Payment, BackendError> {
    posting_tx(conn, &req.attempt, now, |tx| {
        let existing = load_payment(tx, "idempotency_key", &req.attempt.key)?;
        let from = load_account(tx, &req.from_account)?;
        let to = load_account(tx, &req.to_account)?;
        let plan = transfer::plan(&req, existing, from.as_ref(), to.as_ref(), now)?;
        write_posting(tx, plan, Posting::from(&req), now)
    })
}

pub(super) fn refund_tx(conn: &Connection, req: RefundRequest, now: UnixSecs) -> Result<Payment, BackendError> {
    posting_tx(conn, &req.attempt, now, |tx| {
        let existing = load_payment(tx, "idempotency_key", &req.attempt.key)?;
        let mut original = load_payment(tx, "id", req.payment_id.as_str())?;
        if let Some(o) = original.as_mut() {
            // What was refunded is what the refund rows say, never less: a `refunded_minor` reset
            // by a database writer does not make the payment refundable twice.
            let refunded: i64 = tx
                .q_row(
                    "SELECT COALESCE(SUM(amount_minor), 0) FROM payments WHERE refund_of = ?1",
                    [o.id.as_str()],
                    |r| r.get(0),
                )
                .map_err(db)?;
            o.refunded_minor = o.refunded_minor.max(refunded);
        }
        let payee = match &original {
            Some(o) => load_account(tx, &o.to_account)?,
            None => None,
        };
        let plan = refund::plan(&req, existing, original.as_ref(), payee.as_ref(), now)?;
        write_posting(tx, plan, Posting::from(&req), now)
    })
}
