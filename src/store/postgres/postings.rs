//! The reference ledger's posting transactions (PostgreSQL): take the locks in the engine's order,
//! load what a rule needs, ask it, write its plan.

use deadpool_postgres::{GenericClient, Pool};

use super::{Cached, INSERT_AUDIT, Mapped, TxError, bind, db, insert_audit};
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::BackendError;
use crate::domain::error::StoreError;
use crate::domain::idempotency::{NewIdempotencyRecord, Reservation};
use crate::domain::ids::AccountId;
use crate::domain::money::Currency;
use crate::domain::payee;
use crate::domain::payment::{AccountRow, Claim, Guards, Payment, RefundRequest, TransferRequest};
use crate::domain::rules::guards::{self, BudgetUsage, MandateRow, UsageDraw};
use crate::domain::rules::ledger::DoubleEntry;
use crate::domain::rules::reservation::{self, EarlierKeys};
use crate::domain::rules::{PostingPlan, refund, transfer};
use crate::idempotency::StoredOutcome;
use crate::store::rows;
use crate::store::{Posting, completed_outcome, wrote_one};

/// `column` is one of a few fixed names chosen by this module, never input.
pub(super) async fn load_payment(
    c: &impl GenericClient,
    column: &str,
    value: &str,
    lock: bool,
) -> Result<Option<Payment>, StoreError> {
    let lock = if lock { " FOR UPDATE" } else { "" };
    let sql = format!("SELECT {} FROM payments WHERE {column} = $1{lock}", rows::PAYMENT_COLS);
    Ok(c.get(&sql, &[&value], rows::payment).await?.map(|(p, _)| p))
}

const MOVE_AND_POST: &str =
    "WITH moved AS (UPDATE accounts SET balance_minor = balance_minor + $3 WHERE id = $2 RETURNING balance_minor)
     INSERT INTO postings (payment_id, account_id, amount_minor, currency, balance_after_minor, description, created_at)
     SELECT $1::TEXT, $2, $3, $4::TEXT, moved.balance_minor, $5::TEXT, $6::BIGINT FROM moved
     RETURNING balance_after_minor";
const COMPLETE_KEY: &str =
    "UPDATE idempotency_records SET state = 'completed', outcome = $1 WHERE key = $2 AND state = 'in_flight'";
const INSERT_PAYMENT: &str =
    "INSERT INTO payments (id, idempotency_key, kind, status, from_account, to_account, amount_minor, currency,
                           refunded_minor, refund_of, memo, principal_sub, created_at, mandate_id, principal_user)
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)";
/// The refunds a payment has, by their own rows (`payments_refund_of` index).
const REFUNDED_SUM: &str = "SELECT COALESCE(SUM(amount_minor), 0)::BIGINT FROM payments WHERE refund_of = $1";
const ADD_REFUNDED: &str = "UPDATE payments SET refunded_minor = refunded_minor + $1 WHERE id = $2";
const DRAW_MANDATE: &str = "UPDATE mandates SET uses = uses + 1, spent_minor = spent_minor + $1 WHERE id = $2";

/// A claimed posting's savepoint statement (`SAVEPOINT`, `RELEASE SAVEPOINT`), sent only when the
/// posting has one; a pipeline step like any other.
async fn savepoint_step(c: &impl GenericClient, savepoint: bool, sql: &str) -> Result<(), tokio_postgres::Error> {
    match savepoint {
        true => c.batch_execute(sql).await,
        false => Ok(()),
    }
}

/// Prepare every statement of a pipeline before sending any: a statement not yet prepared on this
/// connection would otherwise go out only after its preparation's answer, behind statements that
/// were meant to run after it (PostgreSQL runs a pipeline in the order it receives it).
/// (Each is prepared once per connection; after that this finds them all in the cache.)
async fn prepare_all(c: &impl GenericClient, statements: &[&str]) -> Result<(), tokio_postgres::Error> {
    for sql in statements {
        c.prepare_cached(sql).await?;
    }
    Ok(())
}

pub(super) const LOCK_ACCOUNTS: &str =
    "SELECT id, currency, balance_minor, allow_overdraft FROM accounts WHERE id = ANY($1) ORDER BY id FOR UPDATE";

/// Lock both accounts (in id order) and return them (`None`: no such account).
pub(super) async fn lock_accounts(
    c: &impl GenericClient,
    a: &AccountId,
    b: &AccountId,
) -> Result<(Option<AccountRow>, Option<AccountRow>), StoreError> {
    let ids = vec![a.as_str().to_string(), b.as_str().to_string()];
    let found = c.list(LOCK_ACCOUNTS, &[&ids], |r| Ok((r.text(0)?, rows::account(r, 1)?))).await?;
    let find = |id: &AccountId| found.iter().find(|(i, _)| i == id.as_str()).map(|(_, row)| row.clone());
    Ok((find(a), find(b)))
}

pub(super) async fn post(
    c: &impl GenericClient,
    e: &DoubleEntry<'_>,
    leg: usize,
    now: UnixSecs,
) -> Result<i64, StoreError> {
    let (account, amount) = e.legs[leg];
    // One statement: the balance moves and its posting records the balance after, in one round trip.
    let currency = e.currency.code();
    let balance: i64 =
        c.one(MOVE_AND_POST, &[&e.payment_id, &account, &amount, &currency, &e.description, &now]).await?.get(0);
    Ok(balance)
}

pub(super) async fn complete_in_tx(
    c: &impl GenericClient,
    key: &str,
    alias: Option<&str>,
    p: &Payment,
) -> Result<(), StoreError> {
    let outcome = completed_outcome(p);
    let complete = |k| complete_key(c, &outcome, k);
    // Pipelined: the alias's update does not wait for the key's answer.
    let (key_done, alias_done) = tokio::join!(complete(key), async {
        match alias {
            Some(a) => complete(a).await.map(Some),
            None => Ok(None),
        }
    });
    key_done?;
    alias_done?;
    Ok(())
}

fn add_usage_sql(table: &str) -> String {
    format!(
        "INSERT INTO {table} (subject, day, currency, spent_minor, payments) VALUES ($1, $2, $3, $4, 1)
         ON CONFLICT (subject, day, currency) DO UPDATE SET spent_minor = {table}.spent_minor + excluded.spent_minor,
                                                            payments = {table}.payments + 1"
    )
}

async fn complete_key(c: &impl GenericClient, outcome: &str, key: &str) -> Result<u64, tokio_postgres::Error> {
    c.exec(COMPLETE_KEY, &[&outcome, &key]).await
}

/// Count a payment or refund toward its subject's day.
pub(super) async fn add_usage(c: &impl GenericClient, d: &UsageDraw) -> Result<(), StoreError> {
    let sql = add_usage_sql(guards::usage_table(d.kind));
    let n = c.exec(&sql, &[&d.subject, &d.day, &d.currency.code(), &d.amount_minor]).await?;
    wrote_one("usage count", n)
}

/// What the guards check, as read in the posting transaction: the subject's usage for the day
/// (read under its budget lock) and the mandate row (locked).
#[derive(Default)]
pub(super) struct GuardState {
    usage: Option<BudgetUsage>,
    mandate: Option<MandateRow>,
    /// What the payee was already paid today, and since it became known (read under the same
    /// lock).
    payee_paid: Option<(i64, i64)>,
}

impl GuardState {
    /// The guards' verdict on this payment (`domain::rules::guards`); nothing is written.
    fn check(&self, g: &Guards, amount: i64, currency: Currency, now: UnixSecs) -> Result<(), BackendError> {
        if let (Some(b), Some(usage)) = (&g.budget, self.usage) {
            guards::check_budget(b, usage, amount, currency)?;
        }
        if let (Some(cap), Some((today, cooling))) = (&g.payee, self.payee_paid) {
            payee::check_cap(cap, today, amount, currency).map_err(BackendError::BudgetExceeded)?;
            payee::check_cooling(cap, cooling, amount, currency).map_err(BackendError::BudgetExceeded)?;
        }
        if g.mandate.is_some() {
            guards::check_mandate(self.mandate.as_ref(), amount, currency, now)?;
        }
        Ok(())
    }
}

/// Take the guards' locks and read what they check. Its statements are sent without waiting for
/// each other's answers (pipelined): PostgreSQL runs them in the order sent, so the lock order
/// holds (budget, then mandate) and each read sees what committed before its lock was granted.
pub(super) async fn read_guards(
    c: &impl GenericClient,
    g: &Guards,
    subject: &str,
    currency: Currency,
) -> Result<GuardState, StoreError> {
    let usage_sql = g.budget.as_ref().map(|b| {
        format!(
            "SELECT COALESCE(SUM(payments), 0)::BIGINT,
                    COALESCE(SUM(CASE WHEN currency = $3 THEN spent_minor ELSE 0 END), 0)::BIGINT
             FROM {} WHERE subject = $1 AND day = $2",
            guards::usage_table(b.kind)
        )
    });
    let mandate_sql = format!("SELECT {} FROM mandates WHERE id = $1 FOR UPDATE", rows::MANDATE_COLS);
    const BUDGET_LOCK: &str = "SELECT pg_advisory_xact_lock(hashtextextended('budget:' || $1, 0))";
    let mut statements = vec![mandate_sql.as_str(), BUDGET_LOCK, PAYEE_PAID];
    statements.extend(usage_sql.as_deref());
    prepare_all(c, &statements).await?;
    let (locked, usage, payee_paid, mandate) = tokio::join!(
        async {
            if g.budget.is_some() || g.payee.is_some() {
                // One subject's autonomous payments serialise here, so the sums below cannot go
                // stale (a payee's owner is the budget's subject).
                c.exec(BUDGET_LOCK, &[&subject]).await.map(|_| ())
            } else {
                Ok(())
            }
        },
        async {
            match (&g.budget, &usage_sql) {
                (Some(b), Some(sql)) => {
                    let row = c.one(sql, &[&subject, &b.since, &currency.code()]).await?;
                    Ok(Some(BudgetUsage { payments: row.get(0), spent_minor: row.get(1) }))
                }
                _ => Ok::<_, tokio_postgres::Error>(None),
            }
        },
        async {
            match &g.payee {
                Some(cap) => {
                    let since = cap.cooling.map(|c| c.known_since);
                    let row =
                        c.one(PAYEE_PAID, &[&cap.owner, &cap.payee, &cap.since, &currency.code(), &since]).await?;
                    Ok(Some((row.get::<_, i64>(0), row.get::<_, i64>(1))))
                }
                None => Ok::<_, tokio_postgres::Error>(None),
            }
        },
        async {
            match &g.mandate {
                Some(d) => c.get(&mandate_sql, &[&d.mandate_id], rows::mandate).await,
                None => Ok(None),
            }
        },
    );
    locked?;
    Ok(GuardState { usage: usage?, mandate: mandate?, payee_paid: payee_paid? })
}

/// What a payee was already paid today by its owner (the daily cap's usage), and since it became
/// known at $5 (the cooling-off total's usage; 0 when $5 is NULL: not cooling off).
const PAYEE_PAID: &str = "SELECT
     (SELECT COALESCE(SUM(spent_minor), 0)::BIGINT FROM payee_usage
      WHERE owner = $1 AND payee = $2 AND day = $3 AND currency = $4),
     (SELECT COALESCE(SUM(spent_minor), 0)::BIGINT FROM payee_cooling_usage
      WHERE owner = $1 AND payee = $2 AND known_since = $5::BIGINT AND currency = $4)";
/// Count a payment toward its payee's cooling-off total.
const ADD_COOLING: &str = "INSERT INTO payee_cooling_usage (owner, payee, known_since, currency, spent_minor, payments)
     VALUES ($1, $2, $3, $4, $5, 1)
     ON CONFLICT (owner, payee, known_since, currency) DO UPDATE
         SET spent_minor = payee_cooling_usage.spent_minor + excluded.spent_minor,
             payments = payee_cooling_usage.payments + 1";
/// Count a payment toward its payee's day.
const ADD_PAYEE_USAGE: &str = "INSERT INTO payee_usage (owner, payee, day, currency, spent_minor, payments)
     VALUES ($1, $2, $3, $4, $5, 1)
     ON CONFLICT (owner, payee, day, currency) DO UPDATE SET spent_minor = payee_usage.spent_minor + excluded.spent_minor,
                                                          payments = payee_usage.payments + 1";

/// Record a mandate draw (its uses and spend) and the payee's daily usage, once the guards passed.
/// Each write must change its one row (`store::wrote_one`: a row a trigger swallowed is no draw).
async fn draw_mandate(
    c: &impl GenericClient,
    g: &Guards,
    before: Option<&MandateRow>,
    amount: i64,
    currency: Currency,
) -> Result<(), StoreError> {
    if let Some(cap) = &g.payee {
        let n = c.exec(ADD_PAYEE_USAGE, &[&cap.owner, &cap.payee, &cap.since, &currency.code(), &amount]).await?;
        wrote_one("payee usage", n)?;
        if let Some(cooling) = &cap.cooling {
            let n =
                c.exec(ADD_COOLING, &[&cap.owner, &cap.payee, &cooling.known_since, &currency.code(), &amount]).await?;
            wrote_one("payee cooling-off usage", n)?;
        }
    }
    if let Some(d) = &g.mandate {
        wrote_one("mandate draw", c.exec(DRAW_MANDATE, &[&amount, &d.mandate_id]).await?)?;
        // Read back: the draw is what the row now says (a trigger that kept or rewrote the old
        // values would let the mandate be drawn past its bounds).
        let row = c.one("SELECT uses, spent_minor FROM mandates WHERE id = $1", &[&d.mandate_id]).await?;
        if let Some(m) = before {
            guards::drawn_as_meant(m, amount, (row.try_get(0)?, row.try_get(1)?))?;
        }
    }
    Ok(())
}

/// Check the guards and record the draw (rails: one call, no pipeline to share).
pub(super) async fn apply_guards(
    c: &impl GenericClient,
    g: &Guards,
    draw: &UsageDraw,
    now: UnixSecs,
) -> Result<(), BackendError> {
    let state = read_guards(c, g, &draw.subject, draw.currency).await.map_err(db)?;
    state.check(g, draw.amount_minor, draw.currency, now)?;
    draw_mandate(c, g, state.mandate.as_ref(), draw.amount_minor, draw.currency).await.map_err(db)?;
    Ok(())
}

/// The request's audit record, with the payment it produced, in the posting transaction.
async fn audit_in_tx(c: &impl GenericClient, audit: &Option<AuditRecord>, payment: &Payment) -> Result<(), StoreError> {
    match audit {
        Some(r) => insert_audit(c, r, Some(payment.id.as_str())).await,
        None => Ok(()),
    }
}

/// What a posting's rules read, fetched under its locks in one pipelined round trip.
struct Loaded {
    from: Option<AccountRow>,
    to: Option<AccountRow>,
    existing: Option<Payment>,
    guards: GuardState,
}

/// Lock the two accounts (in id order), then find a payment already made under the key (visible
/// now that the accounts are locked), then take the guards' locks and read them: one round trip,
/// because PostgreSQL runs pipelined statements in the order sent. `savepoint`: open the claimed
/// posting's savepoint first, in the same round trip.
#[allow(clippy::too_many_arguments)]
async fn load_posting(
    c: &impl GenericClient,
    savepoint: bool,
    a: &AccountId,
    b: &AccountId,
    key: &str,
    g: &Guards,
    subject: &str,
    currency: Currency,
) -> Result<Loaded, TxError> {
    // Prepared first, so each statement goes out the moment it is polled, in this order.
    let payment_sql = format!("SELECT {} FROM payments WHERE idempotency_key = $1", rows::PAYMENT_COLS);
    prepare_all(c, &[LOCK_ACCOUNTS, &payment_sql]).await.map_err(TxError::pg)?;
    let key_param: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&key];
    let (opened, accounts, existing, guards) = tokio::join!(
        savepoint_step(c, savepoint, "SAVEPOINT posting"),
        lock_accounts(c, a, b),
        c.get(&payment_sql, &key_param, rows::payment),
        read_guards(c, g, subject, currency),
    );
    opened.map_err(TxError::pg)?;
    let (from, to) = accounts.map_err(TxError::store)?;
    let existing = existing.map_err(TxError::store)?.map(|(p, _)| p);
    Ok(Loaded { from, to, existing, guards: guards.map_err(TxError::store)? })
}

/// Write a transfer's or refund's plan: a replay completes the key's records; a new payment passes
/// its guards and posts. The request's audit record goes in with it. Every statement is sent in
/// one pipelined round trip (with the claimed posting's `RELEASE SAVEPOINT` last); the caller
/// commits. The first failure in the pipeline is the one reported: the statements after a failed
/// one only say the transaction is aborted.
async fn write_posting(
    c: &impl GenericClient,
    plan: PostingPlan,
    guard_state: &GuardState,
    w: Posting<'_>,
    savepoint: bool,
    now: UnixSecs,
) -> Result<Payment, TxError> {
    let release = || savepoint_step(c, savepoint, "RELEASE SAVEPOINT posting");
    let p = match plan {
        PostingPlan::Replay(existing) => {
            prepare_all(c, &[COMPLETE_KEY, INSERT_AUDIT]).await.map_err(TxError::pg)?;
            let (completed, audited, released) = tokio::join!(
                complete_in_tx(c, w.key, w.alias, &existing),
                audit_in_tx(c, w.audit, &existing),
                release()
            );
            completed.map_err(TxError::store)?;
            audited.map_err(TxError::store)?;
            released.map_err(TxError::pg)?;
            return Ok(existing);
        }
        PostingPlan::Post(p) => p,
    };
    guard_state.check(w.guards, p.amount_minor, p.currency, now).map_err(TxError::Backend)?;
    let mandate_id = w.guards.mandate.as_ref().map(|m| m.mandate_id.as_str());
    let usage = guards::usage_draw(p.kind, &p.usage_subject(), p.currency, p.amount_minor, now);
    let entry = DoubleEntry::of_payment(&p);
    let amount = p.amount_minor;
    let values = rows::payment_values(&p, w.key, mandate_id);
    let values = bind(&values);
    let usage_sql = add_usage_sql(guards::usage_table(usage.kind));
    let statements =
        [DRAW_MANDATE, INSERT_PAYMENT, &usage_sql, ADD_REFUNDED, MOVE_AND_POST, COMPLETE_KEY, INSERT_AUDIT];
    prepare_all(c, &statements).await.map_err(TxError::pg)?;
    // The account rows stay locked until COMMIT: every round trip from here on is time other
    // payments between these accounts wait, so the writes go out together.
    let (drawn, inserted, counted, refunded, debit, credit, completed, audited, released) = tokio::join!(
        draw_mandate(c, w.guards, guard_state.mandate.as_ref(), amount, p.currency),
        // The payment row goes first after the draw: a lost race on the key fails here (a retry).
        c.exec(INSERT_PAYMENT, &values),
        add_usage(c, &usage),
        async {
            match &p.refund_of {
                Some(original) => c.exec(ADD_REFUNDED, &[&amount, &original.as_str()]).await,
                None => Ok(0),
            }
        },
        post(c, &entry, 0, now),
        post(c, &entry, 1, now),
        complete_in_tx(c, w.key, w.alias, &p),
        audit_in_tx(c, w.audit, &p),
        release(),
    );
    drawn.map_err(TxError::store)?;
    // Every write changed its one row (a row a trigger swallowed is no write: the transaction
    // fails, nothing commits).
    wrote_one("payment", inserted.map_err(TxError::pg)?).map_err(TxError::store)?;
    counted.map_err(TxError::store)?;
    let refunded = refunded.map_err(TxError::pg)?;
    if p.refund_of.is_some() {
        wrote_one("refunded amount", refunded).map_err(TxError::store)?;
    }
    debit.map_err(TxError::store)?;
    credit.map_err(TxError::store)?;
    completed.map_err(TxError::store)?;
    audited.map_err(TxError::store)?;
    released.map_err(TxError::pg)?;
    Ok(p)
}

/// Claim a request's keys in order. `Ok(Some(KeyHeld))`: one already answers; the keys claimed
/// before it were completed with its outcome or given back (`rules::reservation::on_claim_answered`).
async fn claim_keys(c: &impl GenericClient, claim: &Claim, now: UnixSecs) -> Result<Option<BackendError>, StoreError> {
    for (i, rec) in claim.records.iter().enumerate() {
        let reservation = super::reserve_key(c, rec, now).await?;
        if reservation == Reservation::Acquired {
            continue;
        }
        let earlier = &claim.records[..i];
        match reservation::on_claim_answered(&reservation, &rec.fingerprint) {
            EarlierKeys::Complete(outcome) => complete_keys(c, earlier, Some(&outcome)).await?,
            EarlierKeys::Release => complete_keys(c, earlier, None).await?,
        }
        return Ok(Some(BackendError::KeyHeld { key: rec.key.clone(), reservation }));
    }
    Ok(None)
}

/// Complete claimed keys with `outcome`, or give them back (`None`).
async fn complete_keys(
    c: &impl GenericClient,
    records: &[NewIdempotencyRecord],
    outcome: Option<&str>,
) -> Result<(), StoreError> {
    for rec in records {
        match outcome {
            Some(o) => {
                c.exec(
                    "UPDATE idempotency_records SET state = 'completed', outcome = $1 WHERE key = $2 AND state = 'in_flight'",
                    &[&o, &rec.key],
                )
                .await?
            }
            None => c.exec("DELETE FROM idempotency_records WHERE key = $1 AND state = 'in_flight'", &[&rec.key]).await?,
        };
    }
    Ok(())
}

/// A claimed posting's end: a success commits with its keys completed; a refusal rolls its
/// savepoint back and leaves under the keys what the claim says (the failed outcome, or nothing).
async fn finish_claimed(
    tx: deadpool_postgres::Transaction<'_>,
    claim: &Claim,
    posted: Result<Payment, TxError>,
) -> Result<Payment, TxError> {
    match posted {
        Ok(p) => {
            tx.commit().await.map_err(TxError::pg)?;
            Ok(p)
        }
        Err(TxError::Backend(refusal)) => {
            tx.batch_execute("ROLLBACK TO SAVEPOINT posting").await.map_err(TxError::pg)?;
            let outcome = StoredOutcome::after_refusal(&refusal).map(|o| o.to_json());
            complete_keys(&tx, &claim.records, outcome.as_deref()).await.map_err(TxError::store)?;
            tx.commit().await.map_err(TxError::pg)?;
            Err(TxError::Backend(refusal))
        }
        // A lost race: roll everything back and run the transaction again.
        Err(TxError::Retry) => Err(TxError::Retry),
    }
}

/// Claim the keys (when the request carries a `Claim`) and run the posting in a savepoint of its
/// own; without a claim, the posting is the transaction. Keys lock before accounts. Dropping the
/// transaction unfinished (an error, or the caller going away) rolls all of it back.
macro_rules! claimed_posting {
    ($pool:expr, $req:expr, $now:expr, $post:path) => {{
        let mut client = $pool.get().await.map_err(|e| TxError::Backend(db(e)))?;
        let tx = client.transaction().await.map_err(TxError::pg)?;
        match &$req.attempt.claim {
            None => {
                let p = $post(&tx, $req, $now, false).await?;
                tx.commit().await.map_err(TxError::pg)?;
                Ok(p)
            }
            Some(claim) => {
                if let Some(held) = claim_keys(&tx, claim, $now).await.map_err(TxError::store)? {
                    tx.commit().await.map_err(TxError::pg)?;
                    return Err(TxError::Backend(held));
                }
                let posted = $post(&tx, $req, $now, true).await;
                finish_claimed(tx, claim, posted).await
            }
        }
    }};
}

pub(super) async fn transfer_once(pool: &Pool, req: &TransferRequest, now: UnixSecs) -> Result<Payment, TxError> {
    claimed_posting!(pool, req, now, transfer_in)
}

pub(super) async fn refund_once(pool: &Pool, req: &RefundRequest, now: UnixSecs) -> Result<Payment, TxError> {
    claimed_posting!(pool, req, now, refund_in)
}

/// Round trips with the accounts locked: the reads (one), the writes (one), COMMIT.
async fn transfer_in(
    tx: &deadpool_postgres::Transaction<'_>,
    req: &TransferRequest,
    now: UnixSecs,
    savepoint: bool,
) -> Result<Payment, TxError> {
    let currency = req.amount.currency();
    let loaded = load_posting(
        tx,
        savepoint,
        &req.from_account,
        &req.to_account,
        &req.attempt.key,
        &req.guards,
        &req.usage_subject(),
        currency,
    )
    .await?;
    let plan = transfer::plan(req, loaded.existing, loaded.from.as_ref(), loaded.to.as_ref(), now)
        .map_err(TxError::Backend)?;
    write_posting(tx, plan, &loaded.guards, Posting::from(req), savepoint, now).await
}

async fn refund_in(
    tx: &deadpool_postgres::Transaction<'_>,
    req: &RefundRequest,
    now: UnixSecs,
    savepoint: bool,
) -> Result<Payment, TxError> {
    // The original payment's row lock serialises refunds of it; accounts follow in id order. The
    // original names the accounts and the currency, so it is read first (with the savepoint).
    let (opened, original) = tokio::join!(
        savepoint_step(tx, savepoint, "SAVEPOINT posting"),
        load_payment(tx, "id", req.payment_id.as_str(), true),
    );
    opened.map_err(TxError::pg)?;
    let original = original.map_err(TxError::store)?;
    let Some(o) = &original else {
        let existing = load_payment(tx, "idempotency_key", &req.attempt.key, false).await.map_err(TxError::store)?;
        let plan = refund::plan(req, existing, None, None, now).map_err(TxError::Backend)?;
        return write_posting(tx, plan, &GuardState::default(), Posting::from(req), savepoint, now).await;
    };
    let (subject, original_id) = (req.usage_subject(), o.id.as_str());
    let by_original: [&(dyn tokio_postgres::types::ToSql + Sync); 1] = [&original_id];
    let (loaded, refunded) = tokio::join!(
        load_posting(tx, false, &o.to_account, &o.from_account, &req.attempt.key, &req.guards, &subject, o.currency,),
        tx.one(REFUNDED_SUM, &by_original),
    );
    let loaded = loaded?;
    let refunded: i64 = refunded.map_err(TxError::pg)?.get(0);
    // What was refunded is what the refund rows say, never less: a `refunded_minor` reset by a
    // database writer does not make the payment refundable twice.
    let original = original.map(|mut o| {
        o.refunded_minor = o.refunded_minor.max(refunded);
        o
    });
    let plan =
        refund::plan(req, loaded.existing, original.as_ref(), loaded.from.as_ref(), now).map_err(TxError::Backend)?;
    write_posting(tx, plan, &loaded.guards, Posting::from(req), savepoint, now).await
}
