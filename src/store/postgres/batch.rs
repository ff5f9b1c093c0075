//! Group commit for the common payment (PostgreSQL): autonomous transfers waiting at the same
//! time are decided and written in one transaction, so one hot account pair holds its row locks
//! once per batch instead of once per payment, and the database runs a few multi-row statements
//! per batch instead of a dozen statements per payment.
//!
//! A *lane* is a task with its own queue; a transfer goes to the lane of its payer's account, so
//! the payments of one hot account meet in one lane. A lane takes whatever waits in its queue (at
//! most [`BATCH_MAX`]), and runs it as one transaction:
//!
//! 1. one pipelined round trip: claim every key (one multi-row `INSERT … ON CONFLICT`, keys in
//!    order), lock every account (in id order), read the payments already made under the keys,
//!    take the budget locks (subjects in order) and read those subjects' usage — the engine's
//!    lock order (keys → accounts → budgets), so a batch cannot deadlock with another batch or
//!    with a single posting;
//! 2. in Rust, in arrival order: each transfer is decided by the same rules as alone
//!    (`rules::reservation`, `rules::transfer::plan`, `rules::guards`), on the balances and usage
//!    the transfers before it in the batch left;
//! 3. one pipelined round trip writes the batch: payments, postings (each with its balance after),
//!    the accounts' new balances, the day's usage, the keys completed (or given back, as a
//!    refusal's fate says) and the audit records — each one multi-row statement, each held to
//!    the number of rows it was meant to write (a row a trigger swallowed fails the batch);
//! 4. `COMMIT`, a round trip of its own, once every count is right.
//!
//! Nothing is answered before `COMMIT` returns. If any statement fails (a lost race, a dropped
//! connection, a count that is not right), the whole batch rolls back and each transfer runs again alone, through the single
//! posting (`postings::transfer_once`); the keys make that safe whatever the batch did.
//! Two transfers under one key never share a batch: the second runs alone after the batch, and
//! finds the first's answer under the key.
//!
//! Mandated payments, payments under two keys and refunds take the single posting.

use std::hash::BuildHasher;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use deadpool_postgres::{GenericClient, Pool};
use tokio::sync::{mpsc, oneshot};
use tokio_postgres::Row;
use tokio_postgres::types::ToSql;

use super::postings::{self, LOCK_ACCOUNTS};
use super::{Cached, TxError, db};
use crate::clock::UnixSecs;
use crate::domain::error::{BackendError, StoreError};
use crate::domain::idempotency::NewIdempotencyRecord;
use crate::domain::payment::{Payment, PaymentKind, TransferRequest};
use crate::domain::rules::reservation::ReserveStep;
use crate::store::rows::{self, Value};

mod decide;

use decide::{Loaded, PostingRow, Usage, WriteSet};

/// Transfers decided and written in one transaction, at most. A batch holds its accounts' row
/// locks for two round trips and a commit whatever its size; 64 keeps a batch's statements small
/// (each is one multi-row statement of at most 128 postings) and its wait short.
pub const BATCH_MAX: usize = 64;
/// Lanes per replica (each holds one pooled connection while it writes; the pool has
/// [`super::POOL_SIZE_MAX`]). A payer's account always maps to the same lane.
pub const LANES: usize = 4;
/// Transfers queued per lane before a caller waits for room.
const LANE_QUEUE: usize = 1024;

/// May this transfer join a batch? The common autonomous payment: one key (claimed by the
/// posting, or reserved by the caller), no mandate, a payment budget if any, no payee cap (a
/// capped payee's payments go through the single posting, which checks the cap).
pub(super) fn batchable(req: &TransferRequest) -> bool {
    let one_key = match &req.attempt.claim {
        None => true,
        Some(c) => c.records.len() == 1 && c.records[0].key == req.attempt.key,
    };
    one_key
        && req.attempt.alias_key.is_none()
        && req.guards.mandate.is_none()
        && req.guards.payee.is_none()
        && req.guards.budget.as_ref().is_none_or(|b| b.kind == PaymentKind::Payment)
}

struct Job {
    req: TransferRequest,
    now: UnixSecs,
    answer: oneshot::Sender<Result<Payment, TxError>>,
}

/// How much batching happened (for tests and the bench: a batch of one is not a group commit).
#[derive(Default)]
pub struct BatchStats {
    /// Transfers handed to a lane.
    pub submitted: AtomicU64,
    /// Batches of two or more transfers committed.
    pub grouped_batches: AtomicU64,
    /// Transfers in those batches.
    pub grouped_transfers: AtomicU64,
    /// Batches that failed and whose transfers ran again alone.
    pub fallbacks: AtomicU64,
}

#[derive(Clone)]
pub(super) struct Lanes {
    queues: Arc<[mpsc::Sender<Job>]>,
    hasher: std::collections::hash_map::RandomState,
    pub(super) stats: Arc<BatchStats>,
}

impl Lanes {
    /// Start the lanes (tasks on the current runtime; each ends when the last `Lanes` is dropped).
    pub(super) fn start(pool: &Pool) -> Self {
        let stats = Arc::new(BatchStats::default());
        let queues: Vec<_> = (0..LANES)
            .map(|_| {
                let (tx, rx) = mpsc::channel(LANE_QUEUE);
                tokio::spawn(run_lane(pool.clone(), rx, stats.clone()));
                tx
            })
            .collect();
        Lanes { queues: queues.into(), hasher: Default::default(), stats }
    }

    /// Post `req` in its payer's lane and wait for its answer (after its batch committed).
    pub(super) async fn transfer(&self, req: TransferRequest, now: UnixSecs) -> Result<Payment, TxError> {
        let lane = self.hasher.hash_one(req.from_account.as_str()) % self.queues.len() as u64;
        let lane = &self.queues[lane as usize];
        let (answer, answered) = oneshot::channel();
        let stopped = || TxError::Backend(BackendError::Unavailable("the posting lane stopped".into()));
        lane.send(Job { req, now, answer }).await.map_err(|_| stopped())?;
        self.stats.submitted.fetch_add(1, Ordering::Relaxed);
        answered.await.map_err(|_| stopped())?
    }
}

async fn run_lane(pool: Pool, mut queue: mpsc::Receiver<Job>, stats: Arc<BatchStats>) {
    let mut jobs = Vec::with_capacity(BATCH_MAX);
    while queue.recv_many(&mut jobs, BATCH_MAX).await > 0 {
        // Its own task: were a batch to panic, its callers get an error and the lane goes on.
        let (pool, stats, batch) = (pool.clone(), stats.clone(), std::mem::take(&mut jobs));
        let _ = tokio::spawn(async move { run_batch(&pool, batch, &stats).await }).await;
    }
}

/// Run one batch and answer every transfer in it.
async fn run_batch(pool: &Pool, jobs: Vec<Job>, stats: &BatchStats) {
    // A key already in this batch: that transfer runs alone once the batch is over.
    let mut keys = std::collections::HashSet::new();
    let (batch, later): (Vec<Job>, Vec<Job>) = jobs.into_iter().partition(|j| keys.insert(j.req.attempt.key.clone()));
    let n = batch.len() as u64;
    match write_batch(pool, &batch).await {
        Ok(answers) => {
            if n > 1 {
                stats.grouped_batches.fetch_add(1, Ordering::Relaxed);
                stats.grouped_transfers.fetch_add(n, Ordering::Relaxed);
            }
            for (job, answer) in batch.into_iter().zip(answers) {
                let _ = job.answer.send(answer.map_err(TxError::Backend));
            }
        }
        Err(e) => {
            tracing::debug!(transfers = n, error = %e, "a batch rolled back; its transfers run alone");
            stats.fallbacks.fetch_add(1, Ordering::Relaxed);
            for job in batch {
                alone(pool, job);
            }
        }
    }
    for job in later {
        alone(pool, job);
    }
}

/// Run one transfer through the single posting, off the lane.
fn alone(pool: &Pool, job: Job) {
    let pool = pool.clone();
    tokio::spawn(async move {
        let answer = postings::transfer_once(&pool, &job.req, job.now).await;
        let _ = job.answer.send(answer);
    });
}

/// A batch's failure: every transfer in it runs again alone.
#[derive(Debug, thiserror::Error)]
enum BatchError {
    #[error("{0}")]
    Pg(#[from] tokio_postgres::Error),
    #[error("{0}")]
    Store(#[from] StoreError),
    #[error("{0}")]
    Pool(#[from] deadpool_postgres::PoolError),
}

const CLAIM_KEYS: &str = "INSERT INTO idempotency_records
       (key, fingerprint, tool, principal_iss, principal_sub, state, outcome, lease_until, created_at, expires_at)
     SELECT k, f, t, i, s, 'in_flight', NULL, l, c, e
     FROM unnest($1::TEXT[], $2::TEXT[], $3::TEXT[], $4::TEXT[], $5::TEXT[], $6::BIGINT[], $7::BIGINT[], $8::BIGINT[])
          AS u(k, f, t, i, s, l, c, e)
     ON CONFLICT (key) DO UPDATE SET key = idempotency_records.key
     RETURNING key, (xmax = 0), fingerprint, state, outcome, lease_until, expires_at";
const RECLAIM_KEY: &str =
    "UPDATE idempotency_records SET fingerprint = $2, tool = $3, principal_iss = $4, principal_sub = $5,
            state = 'in_flight', outcome = NULL, lease_until = $6, created_at = $7, expires_at = $8 WHERE key = $1";
const TAKE_OVER_KEY: &str = "UPDATE idempotency_records SET lease_until = $1 WHERE key = $2";
const PAYMENTS_UNDER: &str = "SELECT id, kind, status, from_account, to_account, amount_minor, currency, \
     refunded_minor, refund_of, memo, principal_sub, created_at, seq, principal_user, idempotency_key \
     FROM payments WHERE idempotency_key = ANY($1)";
/// Budget locks in the array's order (sorted by the caller): one subject's payments serialise on it.
const LOCK_BUDGETS: &str =
    "SELECT count(pg_advisory_xact_lock(hashtextextended('budget:' || s, 0))) FROM unnest($1::TEXT[]) AS s";
const READ_USAGE: &str = "SELECT subject, day, currency, payments, spent_minor FROM budget_usage
     WHERE (subject, day) IN (SELECT * FROM unnest($1::TEXT[], $2::BIGINT[]))";
const SET_BALANCES: &str = "UPDATE accounts SET balance_minor = u.b FROM unnest($1::TEXT[], $2::BIGINT[]) AS u(id, b)
     WHERE accounts.id = u.id";
const INSERT_POSTINGS: &str =
    "INSERT INTO postings (payment_id, account_id, amount_minor, currency, balance_after_minor, description, created_at)
     SELECT * FROM unnest($1::TEXT[], $2::TEXT[], $3::BIGINT[], $4::TEXT[], $5::BIGINT[], $6::TEXT[], $7::BIGINT[])";
const ADD_USAGE: &str = "INSERT INTO budget_usage (subject, day, currency, spent_minor, payments)
     SELECT * FROM unnest($1::TEXT[], $2::BIGINT[], $3::TEXT[], $4::BIGINT[], $5::BIGINT[])
     ON CONFLICT (subject, day, currency) DO UPDATE
       SET spent_minor = budget_usage.spent_minor + excluded.spent_minor,
           payments = budget_usage.payments + excluded.payments";
const COMPLETE_KEYS: &str = "UPDATE idempotency_records SET state = 'completed', outcome = u.o
     FROM unnest($1::TEXT[], $2::TEXT[]) AS u(k, o) WHERE key = u.k AND state = 'in_flight'";
const RELEASE_KEYS: &str = "DELETE FROM idempotency_records WHERE key = ANY($1) AND state = 'in_flight'";
const PAYMENT_COLUMNS: &str = "id, idempotency_key, kind, status, from_account, to_account, amount_minor, currency, \
     refunded_minor, refund_of, memo, principal_sub, created_at, mandate_id, principal_user";
const AUDIT_COLUMNS: &str = "at, correlation_id, principal_iss, principal_sub, tool, decision, code, \
     idempotency_key, payment_id, approval_id, detail, principal_user, repeats, policy_version, intent, tag";

/// Rows of engine-neutral values (`store::rows`), as one array per column for `unnest`.
enum Column {
    Text(Vec<Option<String>>),
    Int(Vec<Option<i64>>),
}

impl Column {
    /// One column of values (all of one type: `Text` or `Int`).
    fn of(values: impl Iterator<Item = Value>) -> Column {
        let (mut text, mut int) = (Vec::new(), Vec::new());
        for v in values {
            match v {
                Value::Text(t) => text.push(t),
                Value::Int(i) => int.push(i),
            }
        }
        if int.is_empty() { Column::Text(text) } else { Column::Int(int) }
    }

    fn param(&self) -> &(dyn ToSql + Sync) {
        match self {
            Column::Text(v) => v,
            Column::Int(v) => v,
        }
    }
}

/// `INSERT INTO table (columns) SELECT * FROM unnest(…)` for `rows` (all of one shape), and its
/// parameters. The statement's text depends only on the table and the columns' types.
fn insert_rows(table: &str, columns: &str, rows: Vec<Vec<Value>>) -> Result<(String, Vec<Column>), StoreError> {
    if rows.is_empty() {
        return Ok((String::new(), Vec::new()));
    }
    let mut cols: Vec<Column> = Vec::new();
    for row in rows {
        if cols.is_empty() {
            cols = row
                .iter()
                .map(|v| match v {
                    Value::Text(_) => Column::Text(Vec::new()),
                    Value::Int(_) => Column::Int(Vec::new()),
                })
                .collect();
        }
        for (col, v) in cols.iter_mut().zip(row) {
            match (col, v) {
                (Column::Text(c), Value::Text(t)) => c.push(t),
                (Column::Int(c), Value::Int(i)) => c.push(i),
                // Every row of a table has one shape (`rows::*_values`).
                _ => return Err(StoreError::Corrupt(format!("rows of {table} differ in shape"))),
            }
        }
    }
    let types: Vec<String> = cols
        .iter()
        .enumerate()
        .map(|(i, c)| match c {
            Column::Text(_) => format!("${}::TEXT[]", i + 1),
            Column::Int(_) => format!("${}::BIGINT[]", i + 1),
        })
        .collect();
    Ok((format!("INSERT INTO {table} ({columns}) SELECT * FROM unnest({})", types.join(", ")), cols))
}

/// Run a query only when it has something to ask: no rows, no round trip.
async fn query_if(
    c: &impl GenericClient,
    any: bool,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<Vec<Row>, tokio_postgres::Error> {
    if any { c.all(sql, params).await } else { Ok(Vec::new()) }
}

/// Run a statement only when it has something to write: no rows, no round trip.
async fn exec_if(
    c: &impl GenericClient,
    any: bool,
    sql: &str,
    params: &[&(dyn ToSql + Sync)],
) -> Result<u64, tokio_postgres::Error> {
    if any { c.exec(sql, params).await } else { Ok(0) }
}

/// Decide and write `jobs` (keys distinct) in one transaction; each transfer's answer, in order.
async fn write_batch(pool: &Pool, jobs: &[Job]) -> Result<Vec<Result<Payment, BackendError>>, BatchError> {
    let tx = InTransaction(Some(pool.get().await?));
    let Some(client) = &tx.0 else { return Err(StoreError::Database("no connection".into()).into()) };
    let loaded = load(client, jobs).await?;
    let queued: Vec<(&TransferRequest, UnixSecs)> = jobs.iter().map(|j| (&j.req, j.now)).collect();
    let (answers, writes) = decide::decide(&queued, loaded)?;
    write(client, writes).await?;
    tx.committed();
    Ok(answers)
}

/// A pooled connection inside a batch's transaction. `BEGIN` rides in the batch's first pipeline
/// instead of taking a round trip, so nothing rolls the transaction back on drop by itself: unless
/// the batch committed, the connection leaves the pool and closes (a failure, a write that changed
/// other rows than meant, or a panic unwinding), and PostgreSQL rolls back whatever it held. A new
/// one takes its place.
struct InTransaction(Option<deadpool_postgres::Object>);

impl InTransaction {
    /// `COMMIT` succeeded: the connection goes back to the pool, outside any transaction.
    fn committed(mut self) {
        drop(self.0.take());
    }
}

impl Drop for InTransaction {
    fn drop(&mut self) {
        if let Some(open) = self.0.take() {
            drop(deadpool_postgres::Object::take(open));
        }
    }
}

/// Round trip 1: `BEGIN`, claim the keys, lock the accounts, read the payments under the keys, lock the
/// budgets and read their usage — in the engine's lock order, each list sorted.
async fn load(tx: &impl GenericClient, jobs: &[Job]) -> Result<Loaded, BatchError> {
    let mut claims: Vec<(&NewIdempotencyRecord, UnixSecs)> =
        jobs.iter().filter_map(|j| j.req.attempt.claim.as_ref().map(|c| (&c.records[0], j.now))).collect();
    claims.sort_by(|a, b| a.0.key.cmp(&b.0.key));
    let text = |f: fn(&NewIdempotencyRecord) -> &str| -> Vec<&str> { claims.iter().map(|(r, _)| f(r)).collect() };
    let int = |f: fn(&(&NewIdempotencyRecord, UnixSecs)) -> i64| -> Vec<i64> { claims.iter().map(f).collect() };
    let (ck, cf, ct) = (text(|r| &r.key), text(|r| &r.fingerprint), text(|r| &r.tool));
    let (ci, cs) = (text(|r| &r.principal_iss), text(|r| &r.principal_sub));
    let (cl, cc, ce) = (int(|(r, _)| r.lease_until), int(|(_, now)| *now), int(|(r, _)| r.expires_at));

    let mut accounts: Vec<&str> =
        jobs.iter().flat_map(|j| [j.req.from_account.as_str(), j.req.to_account.as_str()]).collect();
    accounts.sort_unstable();
    accounts.dedup();
    // Keys the caller reserved: a payment may already be under them. (A key this batch claims
    // fresh has none, unless its record expired and was purged: then the payment's UNIQUE key
    // fails the batch, and the transfer alone replays it. A claim that found a record is looked
    // up below.) Looking up only these keeps a lookup by key off the common path.
    let keys: Vec<&str> =
        jobs.iter().filter(|j| j.req.attempt.claim.is_none()).map(|j| j.req.attempt.key.as_str()).collect();
    let mut budgeted: Vec<(String, UnixSecs)> =
        jobs.iter().filter_map(|j| j.req.guards.budget.as_ref().map(|b| (j.req.usage_subject(), b.since))).collect();
    budgeted.sort();
    budgeted.dedup();
    let (usage_subjects, usage_days): (Vec<&str>, Vec<i64>) = budgeted.iter().map(|(s, d)| (s.as_str(), *d)).unzip();
    let mut subjects = usage_subjects.clone();
    subjects.dedup();

    // Prepared first, so that each statement goes out in this order when polled.
    for sql in [CLAIM_KEYS, LOCK_ACCOUNTS, PAYMENTS_UNDER, LOCK_BUDGETS, READ_USAGE] {
        tx.prepare_cached(sql).await?;
    }
    let claim_params: [&(dyn ToSql + Sync); 8] = [&ck, &cf, &ct, &ci, &cs, &cl, &cc, &ce];
    let (account_params, key_params): ([&(dyn ToSql + Sync); 1], [&(dyn ToSql + Sync); 1]) = ([&accounts], [&keys]);
    let budget_params: [&(dyn ToSql + Sync); 1] = [&subjects];
    let usage_params: [&(dyn ToSql + Sync); 2] = [&usage_subjects, &usage_days];
    let (began, claimed, locked, made, budgets, usage) = tokio::join!(
        tx.batch_execute("BEGIN"),
        query_if(tx, !claims.is_empty(), CLAIM_KEYS, &claim_params),
        query_if(tx, true, LOCK_ACCOUNTS, &account_params),
        query_if(tx, !keys.is_empty(), PAYMENTS_UNDER, &key_params),
        query_if(tx, !subjects.is_empty(), LOCK_BUDGETS, &budget_params),
        query_if(tx, !budgeted.is_empty(), READ_USAGE, &usage_params),
    );
    began?;
    budgets?;
    let mut loaded = Loaded::default();
    for r in claimed? {
        let found = if r.try_get::<_, bool>(1)? { None } else { Some(rows::idempotency(&r, 2)?) };
        loaded.claimed.insert(r.try_get(0)?, found);
    }
    for r in locked? {
        loaded.accounts.insert(r.try_get(0)?, rows::account(&r, 1)?);
    }
    let found: Vec<&str> =
        loaded.claimed.iter().filter(|(_, record)| record.is_some()).map(|(key, _)| key.as_str()).collect();
    let found_params: [&(dyn ToSql + Sync); 1] = [&found];
    let made_too = query_if(tx, !found.is_empty(), PAYMENTS_UNDER, &found_params).await;
    for r in made?.into_iter().chain(made_too?) {
        loaded.made.insert(r.try_get(14)?, rows::payment(&r)?.0);
    }
    for r in usage? {
        let (subject, day, currency) = (r.try_get(0)?, r.try_get(1)?, r.try_get(2)?);
        loaded.usage.push(Usage { subject, day, currency, payments: r.try_get(3)?, spent_minor: r.try_get(4)? });
    }
    Ok(loaded)
}

/// Round trip 2 (after any rare key step): every write, one statement each; their row counts
/// checked; then round trip 3, `COMMIT`.
async fn write(tx: &impl GenericClient, w: WriteSet<'_>) -> Result<(), BatchError> {
    for (rec, step, now) in &w.steps {
        let (r, now) = (*rec, *now);
        match step {
            ReserveStep::Claim => {
                let params: [&(dyn ToSql + Sync); 8] = [
                    &r.key,
                    &r.fingerprint,
                    &r.tool,
                    &r.principal_iss,
                    &r.principal_sub,
                    &r.lease_until,
                    &now,
                    &r.expires_at,
                ];
                tx.exec(RECLAIM_KEY, &params).await?
            }
            ReserveStep::TakeOver => tx.exec(TAKE_OVER_KEY, &[&r.lease_until, &r.key]).await?,
            ReserveStep::Found(_) => 0,
        };
    }
    let (payments_meant, audits_meant) = (w.payments.len(), w.audits.len());
    let (payments_sql, payment_cols) = insert_rows("payments", PAYMENT_COLUMNS, w.payments)?;
    let (audit_sql, audit_cols) = insert_rows("audit_records", AUDIT_COLUMNS, w.audits)?;
    let payment_params: Vec<&(dyn ToSql + Sync)> = payment_cols.iter().map(Column::param).collect();
    let audit_params: Vec<&(dyn ToSql + Sync)> = audit_cols.iter().map(Column::param).collect();
    let column = |f: fn(&PostingRow) -> Value| -> Column { Column::of(w.postings.iter().map(f)) };
    let posting_cols = [
        column(|p| Value::Text(Some(p.0.clone()))),
        column(|p| Value::Text(Some(p.1.clone()))),
        column(|p| Value::Int(Some(p.2))),
        column(|p| Value::Text(Some(p.3.clone()))),
        column(|p| Value::Int(Some(p.4))),
        column(|p| Value::Text(Some(p.5.clone()))),
        column(|p| Value::Int(Some(p.6))),
    ];
    let posting_params: Vec<&(dyn ToSql + Sync)> = posting_cols.iter().map(Column::param).collect();
    let (moved, balances): (Vec<&str>, Vec<i64>) = w.balances.iter().map(|(a, b)| (a.as_str(), *b)).unzip();
    let u = &w.usage;
    let (us, ud): (Vec<&str>, Vec<i64>) = u.iter().map(|u| (u.subject.as_str(), u.day)).unzip();
    let (uc, un): (Vec<&str>, Vec<i64>) = u.iter().map(|u| (u.currency.as_str(), u.payments)).unzip();
    let um: Vec<i64> = u.iter().map(|u| u.spent_minor).collect();
    let (done, outcomes): (Vec<&str>, Vec<&str>) = w.completed.iter().map(|(k, o)| (*k, o.as_str())).unzip();

    let mut statements = vec![SET_BALANCES, INSERT_POSTINGS, ADD_USAGE, COMPLETE_KEYS, RELEASE_KEYS];
    statements.extend([payments_sql.as_str(), audit_sql.as_str()].into_iter().filter(|s| !s.is_empty()));
    for sql in statements {
        tx.prepare_cached(sql).await?;
    }
    let balance_params: [&(dyn ToSql + Sync); 2] = [&moved, &balances];
    let usage_params: [&(dyn ToSql + Sync); 5] = [&us, &ud, &uc, &um, &un];
    let complete_params: [&(dyn ToSql + Sync); 2] = [&done, &outcomes];
    let release_params: [&(dyn ToSql + Sync); 1] = [&w.released];
    // The payments first: the postings refer to them.
    let (inserted, balanced, posted, counted, completed, released, audited) = tokio::join!(
        exec_if(tx, !payments_sql.is_empty(), &payments_sql, &payment_params),
        exec_if(tx, !moved.is_empty(), SET_BALANCES, &balance_params),
        exec_if(tx, !w.postings.is_empty(), INSERT_POSTINGS, &posting_params),
        exec_if(tx, !u.is_empty(), ADD_USAGE, &usage_params),
        exec_if(tx, !done.is_empty(), COMPLETE_KEYS, &complete_params),
        exec_if(tx, !w.released.is_empty(), RELEASE_KEYS, &release_params),
        exec_if(tx, !audit_sql.is_empty(), &audit_sql, &audit_params),
    );
    let (_, _) = (completed?, released?);
    // Every money write changed exactly its rows before anything commits: a row a trigger
    // swallowed (the statement succeeds, nothing is written) fails the batch, and the connection
    // closes with the transaction open (rolled back). So `COMMIT` takes a round trip of its own.
    for (what, written, meant) in [
        ("payments", inserted, payments_meant),
        ("account balances", balanced, moved.len()),
        ("postings", posted, w.postings.len()),
        ("usage counts", counted, u.len()),
        ("audit records", audited, audits_meant),
    ] {
        let written = written?;
        if written != meant as u64 {
            let e = format!("{what}: {written} rows written where {meant} were meant");
            return Err(StoreError::Database(e).into());
        }
    }
    tx.batch_execute("COMMIT").await?;
    Ok(())
}

impl From<BatchError> for BackendError {
    fn from(e: BatchError) -> Self {
        db(StoreError::Database(e.to_string()))
    }
}
