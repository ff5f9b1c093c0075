//! The embedded SQLite engine. One connection serialises writes (SQLite allows one writer anyway);
//! calls run on tokio's blocking pool so the async runtime never waits on disk.

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::{Connection, OptionalExtension, Row, TransactionBehavior, params};

mod rails;

use super::{
    AccountSeed, ApprovalRecord, AuditRecord, DENIAL_CODES, MandateIssuer, NewIdempotencyRecord, RailOpened,
    RailPayment, RailState, RailUpdate, Reservation, Review, ReviewError, Store, StoreError, SummaryQuery, SummaryRow,
    kind_str, same_transfer,
};
use crate::backend::{
    BackendError, Balance, Guards, IntegrityReport, LedgerEntry, Page, Payment, PaymentKind, PaymentQuery,
    PaymentStatus, RefundRequest, TransferRequest,
};
use crate::clock::UnixSecs;
use crate::idempotency::StoredOutcome;
use crate::ids::{AccountId, ApprovalId, PaymentId};
use crate::mandate::MandateKind;
use crate::money::{Currency, format_minor};

const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/sqlite/0001_init.sql"),
    include_str!("../../migrations/sqlite/0002_approvals_mandates.sql"),
    include_str!("../../migrations/sqlite/0003_budget_usage.sql"),
    include_str!("../../migrations/sqlite/0004_rails.sql"),
];

/// Prepared statements kept per connection (each store query is a fixed SQL text).
const STATEMENT_CACHE: usize = 128;

/// `query_row` / `execute` through the connection's prepared-statement cache: hot paths parse and
/// plan each statement once per connection, not once per call.
trait Cached {
    fn q_row<T, P: rusqlite::Params, F: FnOnce(&Row<'_>) -> rusqlite::Result<T>>(
        &self,
        sql: &str,
        params: P,
        f: F,
    ) -> rusqlite::Result<T>;
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
}

impl Cached for Connection {
    fn q_row<T, P: rusqlite::Params, F: FnOnce(&Row<'_>) -> rusqlite::Result<T>>(
        &self,
        sql: &str,
        params: P,
        f: F,
    ) -> rusqlite::Result<T> {
        self.prepare_cached(sql)?.query_row(params, f)
    }
    fn exec<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }
}

/// Most writes committed together by one fsync.
pub const WRITE_BATCH_MAX: usize = 256;
/// Connections serving reads alongside the writer (WAL lets them run while it commits).
pub const READERS: usize = 2;
/// Writes waiting for the writer before callers wait to enqueue (backpressure).
const WRITE_QUEUE_MAX: usize = 4096;

/// Runs after the batch's COMMIT: `true` when the job's changes are durable.
type Finisher = Box<dyn FnOnce(bool) + Send>;
/// One write, run by the writer thread inside the batch transaction (under its own savepoint).
type Job = Box<dyn FnOnce(&mut Connection) -> Finisher + Send>;

/// The embedded store. Writes go through one writer thread that **group-commits**: it takes every
/// write queued so far (up to [`WRITE_BATCH_MAX`]), runs each under its own SAVEPOINT inside one
/// IMMEDIATE transaction (a failing write rolls back to its savepoint and leaves the others), COMMITs
/// once (one fsync, synchronous=FULL), and only then answers each caller. Reads use their own
/// connections.
#[derive(Clone)]
pub struct SqliteStore {
    writer: tokio::sync::mpsc::Sender<Job>,
    readers: Arc<Vec<Mutex<Connection>>>,
    next_reader: Arc<std::sync::atomic::AtomicUsize>,
    _temp: Option<Arc<TempFile>>,
}

/// A database file removed when the last store handle is dropped (`open_in_memory`).
struct TempFile(std::path::PathBuf);

impl Drop for TempFile {
    fn drop(&mut self) {
        for suffix in ["", "-wal", "-shm"] {
            let _ = std::fs::remove_file(format!("{}{suffix}", self.0.display()));
        }
    }
}

fn configure(conn: &Connection) -> Result<(), StoreError> {
    // WAL for concurrent readers; FULL sync because a committed payment must survive power loss.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

impl SqliteStore {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::init(path, None)
    }

    /// The schema version of the database at `path`, opened read-only: nothing is created or migrated.
    /// A file that is not an SQLite database is an error.
    pub fn schema_status(path: &Path) -> Result<super::SchemaStatus, StoreError> {
        let conn = Connection::open_with_flags(path, rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY)?;
        // Reading the schema table makes SQLite check the file header.
        conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| r.get::<_, i64>(0))?;
        let applied: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        Ok(super::SchemaStatus { applied, known: MIGRATIONS.len() as i64 })
    }

    /// A private throwaway database (a temporary file, so readers and the writer share it).
    pub fn open_in_memory() -> Result<Self, StoreError> {
        let path = std::env::temp_dir().join(format!("paygate-{}.sqlite3", uuid::Uuid::new_v4().simple()));
        Self::init(&path, Some(Arc::new(TempFile(path.clone()))))
    }

    fn init(path: &Path, temp: Option<Arc<TempFile>>) -> Result<Self, StoreError> {
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        let version: i64 = conn.pragma_query_value(None, "user_version", |r| r.get(0))?;
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(version as usize) {
            let tx = conn.transaction_with_behavior(TransactionBehavior::Immediate)?;
            tx.execute_batch(sql)?;
            tx.pragma_update(None, "user_version", (i + 1) as i64)?;
            tx.commit()?;
        }
        let mut readers = Vec::with_capacity(READERS);
        for _ in 0..READERS {
            let r = Connection::open(path)?;
            configure(&r)?;
            readers.push(Mutex::new(r));
        }
        let (tx, rx) = tokio::sync::mpsc::channel::<Job>(WRITE_QUEUE_MAX);
        std::thread::Builder::new()
            .name("paygate-sqlite-writer".into())
            .spawn(move || writer_loop(conn, rx))
            .map_err(|e| StoreError::Database(format!("cannot start the writer thread: {e}")))?;
        Ok(SqliteStore {
            writer: tx,
            readers: Arc::new(readers),
            next_reader: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            _temp: temp,
        })
    }

    /// A short read (one key, or one bounded page). When a reader connection is free it runs right
    /// here on the async worker: a read of cached pages takes microseconds, far less than handing it
    /// to the blocking pool and waking a thread for it (the profile showed those wake-ups and task
    /// switches as the largest cost of a balance read). When both readers are busy, it queues on the
    /// blocking pool like a heavy read.
    async fn run<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    {
        let start = self.next_reader.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        for k in 0..self.readers.len() {
            let reader = &self.readers[(start + k) % self.readers.len()];
            if let Ok(mut conn) = reader.try_lock() {
                return f(&mut conn);
            }
        }
        self.run_heavy(f).await
    }

    /// A read that may take long (integrity, summaries, scans): always on the blocking pool.
    async fn run_heavy<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    {
        let readers = self.readers.clone();
        let i = self.next_reader.fetch_add(1, std::sync::atomic::Ordering::Relaxed) % readers.len();
        tokio::task::spawn_blocking(move || {
            let mut guard = readers[i].lock().map_err(|_| StoreError::Database("connection lock poisoned".into()))?;
            f(&mut guard)
        })
        .await
        .map_err(|e| E::from(StoreError::Database(format!("blocking task failed: {e}"))))?
    }

    /// A write, group-committed by the writer thread. `f` runs inside the batch transaction and
    /// must do its work under a savepoint (`conn.savepoint()`), so that its failure is its own.
    /// The answer arrives only after the batch's COMMIT.
    async fn write<T, E, F>(&self, f: F) -> Result<T, E>
    where
        T: Send + 'static,
        E: From<StoreError> + Send + 'static,
        F: FnOnce(&mut Connection) -> Result<T, E> + Send + 'static,
    {
        let (done, answer) = tokio::sync::oneshot::channel::<Result<T, E>>();
        let job: Job = Box::new(move |conn: &mut Connection| {
            let result = f(conn);
            Box::new(move |committed: bool| {
                let _ = done.send(if committed {
                    result
                } else {
                    Err(E::from(StoreError::Database("the batch did not commit; nothing was written".into())))
                });
            })
        });
        self.writer.send(job).await.map_err(|_| E::from(StoreError::Database("the writer has stopped".into())))?;
        answer.await.map_err(|_| E::from(StoreError::Database("the writer dropped a write".into())))?
    }
}

fn writer_loop(mut conn: Connection, mut rx: tokio::sync::mpsc::Receiver<Job>) {
    while let Some(first) = rx.blocking_recv() {
        let mut batch = vec![first];
        while batch.len() < WRITE_BATCH_MAX {
            match rx.try_recv() {
                Ok(job) => batch.push(job),
                Err(_) => break,
            }
        }
        if conn.execute_batch("BEGIN IMMEDIATE").is_err() {
            // Could not open the batch: each write then commits on its own (its savepoint is
            // its transaction), which is slower but just as correct.
            for job in batch {
                let finish = job(&mut conn);
                finish(true);
            }
            continue;
        }
        let finishers: Vec<Finisher> = batch.into_iter().map(|job| job(&mut conn)).collect();
        let committed = match conn.execute_batch("COMMIT") {
            Ok(()) => true,
            Err(error) => {
                tracing::error!(%error, "group commit failed; every write in the batch is reported failed");
                let _ = conn.execute_batch("ROLLBACK");
                false
            }
        };
        for finish in finishers {
            finish(committed);
        }
    }
}

impl From<StoreError> for BackendError {
    fn from(e: StoreError) -> Self {
        // The transaction rolled back: nothing moved.
        BackendError::Unavailable(e.to_string())
    }
}

fn db(e: rusqlite::Error) -> BackendError {
    BackendError::Unavailable(e.to_string())
}

fn corrupt(what: &str) -> rusqlite::Error {
    rusqlite::Error::InvalidColumnType(0, what.to_string(), rusqlite::types::Type::Text)
}

const PAYMENT_COLS: &str = "id, kind, status, from_account, to_account, amount_minor, currency, refunded_minor, \
                            refund_of, memo, principal_sub, created_at, seq";

fn payment_from_row(r: &Row<'_>) -> rusqlite::Result<(Payment, i64)> {
    let id: String = r.get(0)?;
    let kind: String = r.get(1)?;
    let status: String = r.get(2)?;
    let from: String = r.get(3)?;
    let to: String = r.get(4)?;
    let currency: String = r.get(6)?;
    let refund_of: Option<String> = r.get(8)?;
    let payment = Payment {
        id: PaymentId::parse(&id).map_err(|_| corrupt("payments.id"))?,
        kind: match kind.as_str() {
            "payment" => PaymentKind::Payment,
            "refund" => PaymentKind::Refund,
            _ => return Err(corrupt("payments.kind")),
        },
        status: PaymentStatus::parse(&status).ok_or_else(|| corrupt("payments.status"))?,
        from_account: AccountId::parse(&from).map_err(|_| corrupt("payments.from_account"))?,
        to_account: AccountId::parse(&to).map_err(|_| corrupt("payments.to_account"))?,
        amount_minor: r.get(5)?,
        currency: Currency::parse(&currency).map_err(|_| corrupt("payments.currency"))?,
        refunded_minor: r.get(7)?,
        refund_of: refund_of.map(|s| PaymentId::parse(&s).map_err(|_| corrupt("payments.refund_of"))).transpose()?,
        memo: r.get(9)?,
        principal_sub: r.get(10)?,
        created_at: r.get(11)?,
    };
    Ok((payment, r.get(12)?))
}

fn load_payment(conn: &Connection, id: &str) -> rusqlite::Result<Option<Payment>> {
    conn.q_row(&format!("SELECT {PAYMENT_COLS} FROM payments WHERE id = ?1"), [id], payment_from_row)
        .optional()
        .map(|o| o.map(|(p, _)| p))
}

fn load_payment_by_key(conn: &Connection, key: &str) -> rusqlite::Result<Option<Payment>> {
    conn.q_row(&format!("SELECT {PAYMENT_COLS} FROM payments WHERE idempotency_key = ?1"), [key], payment_from_row)
        .optional()
        .map(|o| o.map(|(p, _)| p))
}

struct AccountRow {
    currency: Currency,
    balance: i64,
    allow_overdraft: bool,
}

fn load_account(conn: &Connection, id: &AccountId) -> Result<AccountRow, BackendError> {
    let row: Option<(String, i64, bool)> = conn
        .q_row("SELECT currency, balance_minor, allow_overdraft FROM accounts WHERE id = ?1", [id.as_str()], |r| {
            Ok((r.get(0)?, r.get(1)?, r.get(2)?))
        })
        .optional()
        .map_err(db)?;
    let (cur, balance, allow_overdraft) = row.ok_or_else(|| BackendError::AccountNotFound(id.clone()))?;
    let currency = Currency::parse(&cur).map_err(|_| BackendError::Unavailable("corrupt account currency".into()))?;
    Ok(AccountRow { currency, balance, allow_overdraft })
}

/// Apply one signed posting and return the balance after it.
fn post(
    tx: &Connection,
    payment_id: Option<&str>,
    account: &str,
    amount: i64,
    currency: Currency,
    description: &str,
    now: UnixSecs,
) -> rusqlite::Result<i64> {
    let balance: i64 = tx.q_row(
        "UPDATE accounts SET balance_minor = balance_minor + ?1 WHERE id = ?2 RETURNING balance_minor",
        params![amount, account],
        |r| r.get(0),
    )?;
    tx.exec(
        "INSERT INTO postings (payment_id, account_id, amount_minor, currency, balance_after_minor, description, created_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7)",
        params![payment_id, account, amount, currency.code(), balance, description, now],
    )?;
    Ok(balance)
}

fn insert_payment(tx: &Connection, p: &Payment, key: &str, mandate_id: Option<&str>) -> rusqlite::Result<()> {
    tx.exec(
        "INSERT INTO payments (id, idempotency_key, kind, status, from_account, to_account, amount_minor, currency,
                               refunded_minor, refund_of, memo, principal_sub, created_at, mandate_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14)",
        params![
            p.id.as_str(),
            key,
            p.kind.as_str(),
            p.status.as_str(),
            p.from_account.as_str(),
            p.to_account.as_str(),
            p.amount_minor,
            p.currency.code(),
            p.refunded_minor,
            p.refund_of.as_ref().map(|r| r.as_str()),
            p.memo,
            p.principal_sub,
            p.created_at,
            mandate_id,
        ],
    )?;
    Ok(())
}

/// The request's audit record, with the payment it produced, in the posting transaction.
fn audit_in_tx(tx: &Connection, audit: &Option<AuditRecord>, payment: &Payment) -> rusqlite::Result<()> {
    if let Some(r) = audit {
        insert_audit(tx, r, Some(payment.id.as_str()))?;
    }
    Ok(())
}

fn insert_audit(c: &Connection, r: &AuditRecord, payment_id: Option<&str>) -> rusqlite::Result<()> {
    c.exec(
        "INSERT INTO audit_records (at, correlation_id, principal_iss, principal_sub, tool, decision, code,
                                    idempotency_key, payment_id, approval_id, detail)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11)",
        params![
            r.at,
            r.correlation_id,
            r.principal_iss,
            r.principal_sub,
            r.tool,
            r.decision,
            r.code,
            r.idempotency_key,
            payment_id.or(r.payment_id.as_deref()),
            r.approval_id,
            r.detail
        ],
    )?;
    Ok(())
}

/// Check the guards that must hold where the payment commits, and record mandate draws.
fn apply_guards(
    tx: &Connection,
    guards: &Guards,
    principal_sub: &str,
    amount: i64,
    currency: Currency,
    now: UnixSecs,
) -> Result<(), BackendError> {
    if let Some(b) = &guards.budget {
        let count: i64 = tx
            .q_row(
                "SELECT COALESCE(SUM(payments), 0) FROM budget_usage WHERE subject = ?1 AND day = ?2",
                params![principal_sub, b.since],
                |r| r.get(0),
            )
            .map_err(db)?;
        let spent: i64 = tx
            .q_row(
                "SELECT COALESCE(SUM(spent_minor), 0) FROM budget_usage WHERE subject = ?1 AND day = ?2 AND currency = ?3",
                params![principal_sub, b.since, currency.code()],
                |r| r.get(0),
            )
            .map_err(db)?;
        if count >= b.max_payments {
            return Err(BackendError::BudgetExceeded(format!(
                "{count} payments today reach the daily maximum of {}",
                b.max_payments
            )));
        }
        if spent + amount > b.max_minor {
            return Err(BackendError::BudgetExceeded(format!(
                "{currency} {} spent today plus {} exceeds the daily limit of {}",
                format_minor(spent, currency),
                format_minor(amount, currency),
                format_minor(b.max_minor, currency)
            )));
        }
    }
    if let Some(d) = &guards.mandate {
        let row: Option<(String, Option<i64>, i64, i64, i64, i64)> = tx
            .q_row(
                "SELECT currency, budget_minor, max_uses, spent_minor, uses, expires_at FROM mandates WHERE id = ?1",
                [&d.mandate_id],
                |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?, r.get(5)?)),
            )
            .optional()
            .map_err(db)?;
        let Some((cur, budget, max_uses, spent, uses, expires_at)) = row else {
            return Err(BackendError::MandateExhausted("this gateway did not issue it".into()));
        };
        if cur != currency.code() || now >= expires_at {
            return Err(BackendError::MandateExhausted("it does not cover this payment".into()));
        }
        if uses >= max_uses {
            return Err(BackendError::MandateExhausted(format!("all {max_uses} uses are spent")));
        }
        if budget.is_some_and(|b| spent + amount > b) {
            return Err(BackendError::MandateExhausted("its budget is spent".into()));
        }
        tx.exec(
            "UPDATE mandates SET uses = uses + 1, spent_minor = spent_minor + ?1 WHERE id = ?2",
            params![amount, d.mandate_id],
        )
        .map_err(db)?;
    }
    Ok(())
}

/// Mark the idempotency records for `key` (and its alias) completed with this payment, inside the
/// posting transaction.
fn complete_in_tx(tx: &Connection, key: &str, alias: Option<&str>, payment: &Payment) -> rusqlite::Result<()> {
    let outcome = StoredOutcome::Succeeded { payment: payment.clone() }.to_json();
    for k in std::iter::once(key).chain(alias) {
        tx.exec(
            "UPDATE idempotency_records SET state = 'completed', outcome = ?1 WHERE key = ?2 AND state = 'in_flight'",
            params![outcome, k],
        )?;
    }
    Ok(())
}

fn transfer_tx(conn: &mut Connection, req: TransferRequest, now: UnixSecs) -> Result<Payment, BackendError> {
    let tx = conn.savepoint().map_err(db)?;
    // The ledger's own guard: one key posts once, whatever happened above (crash, expired record).
    if let Some(existing) = load_payment_by_key(&tx, &req.idempotency_key).map_err(db)? {
        if !same_transfer(&existing, &req) {
            return Err(BackendError::IdempotencyKeyReused);
        }
        complete_in_tx(&tx, &req.idempotency_key, req.alias_key.as_deref(), &existing).map_err(db)?;
        audit_in_tx(&tx, &req.audit, &existing).map_err(db)?;
        tx.commit().map_err(db)?;
        return Ok(existing);
    }
    if req.from_account == req.to_account {
        return Err(BackendError::SameAccount);
    }
    let currency = req.amount.currency();
    let from = load_account(&tx, &req.from_account)?;
    let to = load_account(&tx, &req.to_account)?;
    for (id, acct) in [(&req.from_account, &from), (&req.to_account, &to)] {
        if acct.currency != currency {
            return Err(BackendError::CurrencyMismatch {
                account: id.clone(),
                account_currency: acct.currency,
                requested: currency,
            });
        }
    }
    let amount = req.amount.minor();
    if !from.allow_overdraft && from.balance < amount {
        return Err(BackendError::InsufficientFunds {
            account: req.from_account.clone(),
            balance: format_minor(from.balance, currency),
            needed: req.amount.to_decimal(),
        });
    }
    let payment = Payment {
        id: req.payment_id.clone(),
        kind: PaymentKind::Payment,
        status: PaymentStatus::Succeeded,
        from_account: req.from_account.clone(),
        to_account: req.to_account.clone(),
        amount_minor: amount,
        currency,
        refunded_minor: 0,
        refund_of: None,
        memo: req.memo.clone(),
        principal_sub: req.principal_sub.clone(),
        created_at: now,
    };
    apply_guards(&tx, &req.guards, &req.principal_sub, amount, currency, now)?;
    let mandate_id = req.guards.mandate.as_ref().map(|m| m.mandate_id.as_str());
    insert_payment(&tx, &payment, &req.idempotency_key, mandate_id).map_err(db)?;
    // Every payment counts toward its subject's day (mandated ones too), in the same transaction.
    tx.exec(
        "INSERT INTO budget_usage (subject, day, currency, spent_minor, payments) VALUES (?1, ?2, ?3, ?4, 1)
         ON CONFLICT (subject, day, currency) DO UPDATE SET spent_minor = spent_minor + excluded.spent_minor,
                                                            payments = payments + 1",
        params![req.principal_sub, now - now.rem_euclid(86_400), currency.code(), amount],
    )
    .map_err(db)?;
    let desc = format!("payment {}", payment.id);
    post(&tx, Some(payment.id.as_str()), req.from_account.as_str(), -amount, currency, &desc, now).map_err(db)?;
    post(&tx, Some(payment.id.as_str()), req.to_account.as_str(), amount, currency, &desc, now).map_err(db)?;
    complete_in_tx(&tx, &req.idempotency_key, req.alias_key.as_deref(), &payment).map_err(db)?;
    audit_in_tx(&tx, &req.audit, &payment).map_err(db)?;
    tx.commit().map_err(db)?;
    Ok(payment)
}

fn refund_tx(conn: &mut Connection, req: RefundRequest, now: UnixSecs) -> Result<Payment, BackendError> {
    let tx = conn.savepoint().map_err(db)?;
    if let Some(existing) = load_payment_by_key(&tx, &req.idempotency_key).map_err(db)? {
        let same = existing.kind == PaymentKind::Refund
            && existing.refund_of.as_ref() == Some(&req.payment_id)
            && req.amount_minor.is_none_or(|a| a == existing.amount_minor);
        if !same {
            return Err(BackendError::IdempotencyKeyReused);
        }
        complete_in_tx(&tx, &req.idempotency_key, req.alias_key.as_deref(), &existing).map_err(db)?;
        audit_in_tx(&tx, &req.audit, &existing).map_err(db)?;
        tx.commit().map_err(db)?;
        return Ok(existing);
    }
    let original = load_payment(&tx, req.payment_id.as_str())
        .map_err(db)?
        .ok_or(BackendError::PaymentNotFound(req.payment_id.clone()))?;
    let remaining = original.refundable_minor();
    if original.kind != PaymentKind::Payment || original.status != PaymentStatus::Succeeded || remaining == 0 {
        return Err(BackendError::NotRefundable(original.id.clone()));
    }
    let amount = req.amount_minor.unwrap_or(remaining);
    if amount > remaining {
        return Err(BackendError::RefundExceedsRemaining {
            requested: format_minor(amount, original.currency),
            remaining: format_minor(remaining, original.currency),
        });
    }
    // Money flows back from the payee; the payee may have spent it.
    let payee = load_account(&tx, &original.to_account)?;
    if !payee.allow_overdraft && payee.balance < amount {
        return Err(BackendError::InsufficientFunds {
            account: original.to_account.clone(),
            balance: format_minor(payee.balance, original.currency),
            needed: format_minor(amount, original.currency),
        });
    }
    let refund = Payment {
        id: req.refund_id.clone(),
        kind: PaymentKind::Refund,
        status: PaymentStatus::Succeeded,
        from_account: original.to_account.clone(),
        to_account: original.from_account.clone(),
        amount_minor: amount,
        currency: original.currency,
        refunded_minor: 0,
        refund_of: Some(original.id.clone()),
        memo: req.reason.clone(),
        principal_sub: req.principal_sub.clone(),
        created_at: now,
    };
    apply_guards(&tx, &req.guards, &req.principal_sub, amount, refund.currency, now)?;
    let mandate_id = req.guards.mandate.as_ref().map(|m| m.mandate_id.as_str());
    insert_payment(&tx, &refund, &req.idempotency_key, mandate_id).map_err(db)?;
    tx.exec(
        "UPDATE payments SET refunded_minor = refunded_minor + ?1 WHERE id = ?2",
        params![amount, original.id.as_str()],
    )
    .map_err(db)?;
    let desc = format!("refund {} of {}", refund.id, original.id);
    post(&tx, Some(refund.id.as_str()), refund.from_account.as_str(), -amount, refund.currency, &desc, now)
        .map_err(db)?;
    post(&tx, Some(refund.id.as_str()), refund.to_account.as_str(), amount, refund.currency, &desc, now).map_err(db)?;
    complete_in_tx(&tx, &req.idempotency_key, req.alias_key.as_deref(), &refund).map_err(db)?;
    audit_in_tx(&tx, &req.audit, &refund).map_err(db)?;
    tx.commit().map_err(db)?;
    Ok(refund)
}

fn approval_from_row(r: &Row<'_>) -> rusqlite::Result<ApprovalRecord> {
    let id: String = r.get(0)?;
    let intent: String = r.get(7)?;
    let currency: String = r.get(9)?;
    let kind: String = r.get(13)?;
    Ok(ApprovalRecord {
        id: ApprovalId::parse(&id).map_err(|_| corrupt("approvals.id"))?,
        status: r.get(1)?,
        kind: match kind.as_str() {
            "closed" => MandateKind::Closed,
            "open" => MandateKind::Open,
            _ => return Err(corrupt("approvals.kind")),
        },
        idempotency_key: r.get(2)?,
        fingerprint: r.get(3)?,
        principal_iss: r.get(4)?,
        principal_sub: r.get(5)?,
        tool: r.get(6)?,
        intent: serde_json::from_str(&intent).map_err(|_| corrupt("approvals.intent"))?,
        amount_minor: r.get(8)?,
        currency: Currency::parse(&currency).map_err(|_| corrupt("approvals.currency"))?,
        reason: r.get(10)?,
        created_at: r.get(11)?,
        expires_at: r.get(12)?,
        reviewers_required: r.get(14)?,
        requested_by: r.get(15)?,
        mandate_id: r.get(16)?,
        mandate: r.get(17)?,
        decided_at: r.get(18)?,
        decision_reason: r.get(19)?,
        reviews: vec![],
    })
}

const APPROVAL_COLS: &str = "id, status, idempotency_key, fingerprint, principal_iss, principal_sub, tool, intent, \
                             amount_minor, currency, reason, created_at, expires_at, kind, reviewers_required, \
                             requested_by, mandate_id, mandate, decided_at, decision_reason";

fn insert_approval(tx: &Connection, rec: &ApprovalRecord) -> rusqlite::Result<()> {
    tx.exec(
        &format!(
            "INSERT INTO approvals ({APPROVAL_COLS})
             VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)"
        ),
        params![
            rec.id.as_str(),
            rec.status,
            rec.idempotency_key,
            rec.fingerprint,
            rec.principal_iss,
            rec.principal_sub,
            rec.tool,
            rec.intent.to_string(),
            rec.amount_minor,
            rec.currency.code(),
            rec.reason,
            rec.created_at,
            rec.expires_at,
            kind_str(rec.kind),
            rec.reviewers_required,
            rec.requested_by,
            rec.mandate_id,
            rec.mandate,
            rec.decided_at,
            rec.decision_reason,
        ],
    )?;
    Ok(())
}

fn load_reviews(c: &Connection, id: &str) -> rusqlite::Result<Vec<Review>> {
    let mut stmt = c.prepare(
        "SELECT reviewer_iss, reviewer_sub, decision, reason, at FROM approval_reviews WHERE approval_id = ?1 ORDER BY at, rowid",
    )?;
    let rows = stmt.query_map([id], |r| {
        Ok(Review {
            reviewer_iss: r.get(0)?,
            reviewer_sub: r.get(1)?,
            decision: r.get(2)?,
            reason: r.get(3)?,
            at: r.get(4)?,
        })
    })?;
    rows.collect()
}

fn load_approval(c: &Connection, id: &str) -> rusqlite::Result<Option<ApprovalRecord>> {
    let rec =
        c.q_row(&format!("SELECT {APPROVAL_COLS} FROM approvals WHERE id = ?1"), [id], approval_from_row).optional()?;
    rec.map(|mut a| {
        a.reviews = load_reviews(c, a.id.as_str())?;
        Ok(a)
    })
    .transpose()
}

fn review_tx(
    c: &mut Connection,
    id: &ApprovalId,
    review: Review,
    now: UnixSecs,
    issue: MandateIssuer,
) -> Result<ApprovalRecord, ReviewError> {
    let tx = c.savepoint().map_err(StoreError::from)?;
    let rec = load_approval(&tx, id.as_str()).map_err(StoreError::from)?.ok_or(ReviewError::NotFound)?;
    if rec.status != "pending" {
        return Err(ReviewError::Terminal(rec.status));
    }
    if now >= rec.expires_at {
        tx.exec("UPDATE approvals SET status = 'expired', decided_at = ?1 WHERE id = ?2", params![now, id.as_str()])
            .map_err(StoreError::from)?;
        tx.commit().map_err(StoreError::from)?;
        return Err(ReviewError::Expired);
    }
    // Maker/checker: the agent a payment is for never reviews it. (An operator's pre-authorization
    // records the operator's own approval at creation, so it cannot count twice.)
    if review.reviewer_sub == rec.principal_sub {
        return Err(ReviewError::SelfReview);
    }
    if rec.reviews.iter().any(|r| r.reviewer_iss == review.reviewer_iss && r.reviewer_sub == review.reviewer_sub) {
        return Err(ReviewError::AlreadyReviewed);
    }
    tx.exec(
        "INSERT INTO approval_reviews (approval_id, reviewer_iss, reviewer_sub, decision, reason, at) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
        params![id.as_str(), review.reviewer_iss, review.reviewer_sub, review.decision, review.reason, now],
    )
    .map_err(StoreError::from)?;
    if review.decision == "reject" {
        tx.exec(
            "UPDATE approvals SET status = 'rejected', decided_at = ?1, decision_reason = ?2 WHERE id = ?3",
            params![now, review.reason, id.as_str()],
        )
        .map_err(StoreError::from)?;
    } else {
        let mut approvers: Vec<String> =
            rec.reviews.iter().filter(|r| r.decision == "approve").map(|r| r.reviewer_sub.clone()).collect();
        approvers.push(review.reviewer_sub.clone());
        if approvers.len() as i64 >= rec.reviewers_required {
            let issued = issue(&rec, &approvers).map_err(ReviewError::Mandate)?;
            tx.exec(
                "INSERT INTO mandates (id, kind, approval_id, subject, currency, budget_minor, max_uses, expires_at, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9)",
                params![
                    issued.id,
                    kind_str(rec.kind),
                    id.as_str(),
                    rec.principal_sub,
                    rec.currency.code(),
                    issued.budget_minor,
                    issued.max_uses,
                    issued.expires_at,
                    now
                ],
            )
            .map_err(StoreError::from)?;
            tx.exec(
                "UPDATE approvals SET status = 'approved', decided_at = ?1, decision_reason = ?2, mandate_id = ?3, mandate = ?4
                 WHERE id = ?5",
                params![now, review.reason, issued.id, issued.jws, id.as_str()],
            )
            .map_err(StoreError::from)?;
        }
    }
    let updated = load_approval(&tx, id.as_str()).map_err(StoreError::from)?.ok_or(ReviewError::NotFound)?;
    tx.commit().map_err(StoreError::from)?;
    Ok(updated)
}

#[async_trait]
impl Store for SqliteStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.run(|c| Ok(c.q_row("SELECT 1", [], |r| r.get::<_, i64>(0)).map(|_| ())?)).await
    }

    async fn idem_peek(&self, key: &str, now: UnixSecs) -> Result<Option<(String, Option<String>)>, StoreError> {
        let key = key.to_string();
        self.run(move |c| {
            Ok(c.q_row(
                "SELECT fingerprint, outcome FROM idempotency_records WHERE key = ?1 AND expires_at > ?2",
                params![key, now],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
        })
        .await
    }

    async fn idem_reserve(&self, rec: NewIdempotencyRecord, now: UnixSecs) -> Result<Reservation, StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            let existing: Option<(String, String, Option<String>, i64, i64)> = tx
                .q_row(
                    "SELECT fingerprint, state, outcome, lease_until, expires_at FROM idempotency_records WHERE key = ?1",
                    [&rec.key],
                    |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?, r.get(4)?)),
                )
                .optional()?;
            let result = match existing {
                Some((fingerprint, state, outcome, lease_until, expires_at)) if expires_at > now => {
                    match (state.as_str(), outcome) {
                        ("completed", Some(outcome)) => Reservation::Completed { fingerprint, outcome },
                        ("in_flight", _) if lease_until > now || fingerprint != rec.fingerprint => {
                            Reservation::InFlight { fingerprint }
                        }
                        ("in_flight", _) => {
                            // The holder's lease ran out (crash): take over. The backend sees the same
                            // key again and applies it at most once.
                            tx.exec(
                                "UPDATE idempotency_records SET lease_until = ?1 WHERE key = ?2",
                                params![rec.lease_until, rec.key],
                            )?;
                            Reservation::Acquired
                        }
                        _ => return Err(StoreError::Corrupt(format!("idempotency record in state {state:?}"))),
                    }
                }
                _ => {
                    tx.exec(
                        "INSERT OR REPLACE INTO idempotency_records
                           (key, fingerprint, tool, principal_iss, principal_sub, state, outcome, lease_until, created_at, expires_at)
                         VALUES (?1, ?2, ?3, ?4, ?5, 'in_flight', NULL, ?6, ?7, ?8)",
                        params![
                            rec.key,
                            rec.fingerprint,
                            rec.tool,
                            rec.principal_iss,
                            rec.principal_sub,
                            rec.lease_until,
                            now,
                            rec.expires_at
                        ],
                    )?;
                    Reservation::Acquired
                }
            };
            tx.commit()?;
            Ok(result)
        })
        .await
    }

    async fn idem_complete(&self, key: &str, outcome: &str) -> Result<(), StoreError> {
        let (key, outcome) = (key.to_string(), outcome.to_string());
        self.write(move |c| {
            c.exec(
                "UPDATE idempotency_records SET state = 'completed', outcome = ?1 WHERE key = ?2 AND state = 'in_flight'",
                params![outcome, key],
            )?;
            Ok(())
        })
        .await
    }

    async fn idem_release(&self, key: &str) -> Result<(), StoreError> {
        let key = key.to_string();
        self.write(move |c| {
            c.exec("DELETE FROM idempotency_records WHERE key = ?1 AND state = 'in_flight'", [key])?;
            Ok(())
        })
        .await
    }

    async fn idem_purge(&self, now: UnixSecs) -> Result<u64, StoreError> {
        self.write(move |c| Ok(c.exec("DELETE FROM idempotency_records WHERE expires_at <= ?1", [now])? as u64)).await
    }

    async fn approval_get_or_create(&self, rec: ApprovalRecord, now: UnixSecs) -> Result<ApprovalRecord, StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            let existing = tx
                .q_row(
                    &format!(
                        "SELECT {APPROVAL_COLS} FROM approvals
                         WHERE idempotency_key = ?1 AND ((status = 'pending' AND expires_at > ?2) OR status = 'approved')
                         ORDER BY created_at DESC, rowid DESC LIMIT 1"
                    ),
                    params![rec.idempotency_key, now],
                    approval_from_row,
                )
                .optional()?;
            if let Some(existing) = existing {
                return Ok(existing);
            }
            insert_approval(&tx, &rec)?;
            tx.commit()?;
            Ok(rec)
        })
        .await
    }

    async fn approval_get(&self, id: &ApprovalId) -> Result<Option<ApprovalRecord>, StoreError> {
        let id = id.clone();
        self.run(move |c| Ok(load_approval(c, id.as_str())?)).await
    }

    async fn approvals_pending(&self, now: UnixSecs) -> Result<i64, StoreError> {
        self.run(move |c| {
            Ok(c.q_row("SELECT COUNT(*) FROM approvals WHERE status = 'pending' AND expires_at > ?1", [now], |r| {
                r.get(0)
            })?)
        })
        .await
    }

    async fn approvals_expire(&self, now: UnixSecs) -> Result<u64, StoreError> {
        self.write(move |c| {
            Ok(c.exec(
                "UPDATE approvals SET status = 'expired', decided_at = ?1 WHERE status = 'pending' AND expires_at <= ?1",
                [now],
            )? as u64)
        })
        .await
    }

    async fn approval_insert(&self, rec: ApprovalRecord) -> Result<(), StoreError> {
        self.write(move |c| Ok(insert_approval(c, &rec)?)).await
    }

    async fn approval_list(
        &self,
        status: Option<&str>,
        before: Option<i64>,
        limit: u32,
        now: UnixSecs,
    ) -> Result<Page<(i64, ApprovalRecord)>, StoreError> {
        let status = status.map(str::to_string);
        self.run(move |c| {
            // A pending approval past its expiry is expired, whether or not anyone touched it since.
            let mut stmt = c.prepare(&format!(
                "SELECT {APPROVAL_COLS}, rowid FROM approvals
                 WHERE (?1 IS NULL
                        OR (?1 = 'pending' AND status = 'pending' AND expires_at > ?4)
                        OR (?1 = 'expired' AND (status = 'expired' OR (status = 'pending' AND expires_at <= ?4)))
                        OR (?1 NOT IN ('pending', 'expired') AND status = ?1))
                   AND (?2 IS NULL OR rowid < ?2)
                 ORDER BY rowid DESC LIMIT ?3"
            ))?;
            let limit = i64::from(limit);
            let rows = stmt.query_map(params![status, before, limit + 1, now], |r| {
                Ok((r.get::<_, i64>(20)?, approval_from_row(r)?))
            })?;
            let mut items: Vec<(i64, ApprovalRecord)> = rows.collect::<Result<_, _>>()?;
            let next_cursor = if items.len() as i64 > limit {
                items.truncate(limit as usize);
                items.last().map(|(seq, _)| *seq)
            } else {
                None
            };
            for (_, a) in &mut items {
                a.reviews = load_reviews(c, a.id.as_str())?;
            }
            Ok(Page { items, next_cursor })
        })
        .await
    }

    async fn approval_review(
        &self,
        id: &ApprovalId,
        review: Review,
        now: UnixSecs,
        issue: MandateIssuer,
    ) -> Result<ApprovalRecord, ReviewError> {
        let id = id.clone();
        self.write(move |c| review_tx(c, &id, review, now, issue)).await
    }

    async fn suspension(&self, subject: &str) -> Result<Option<(UnixSecs, String)>, StoreError> {
        let subject = subject.to_string();
        self.run(move |c| {
            Ok(c.q_row(
                "SELECT suspended_at, COALESCE(suspended_reason, '') FROM principal_state
                 WHERE subject = ?1 AND suspended_at IS NOT NULL",
                [subject],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .optional()?)
        })
        .await
    }

    async fn suspend(&self, subject: &str, reason: &str, now: UnixSecs) -> Result<(), StoreError> {
        let (subject, reason) = (subject.to_string(), reason.to_string());
        self.write(move |c| {
            c.exec(
                "INSERT INTO principal_state (subject, suspended_at, suspended_reason) VALUES (?1, ?2, ?3)
                 ON CONFLICT (subject) DO UPDATE SET suspended_at = excluded.suspended_at,
                     suspended_reason = excluded.suspended_reason WHERE principal_state.suspended_at IS NULL",
                params![subject, now, reason],
            )?;
            Ok(())
        })
        .await
    }

    async fn resume(&self, subject: &str, now: UnixSecs) -> Result<bool, StoreError> {
        let subject = subject.to_string();
        self.write(move |c| {
            Ok(c.exec(
                "UPDATE principal_state SET suspended_at = NULL, suspended_reason = NULL, resumed_at = ?1,
                        resumed_seq = (SELECT COALESCE(MAX(seq), 0) FROM audit_records)
                 WHERE subject = ?2 AND suspended_at IS NOT NULL",
                params![now, subject],
            )? == 1)
        })
        .await
    }

    async fn denials_since(&self, subject: &str, since: UnixSecs) -> Result<i64, StoreError> {
        let subject = subject.to_string();
        let codes = serde_json::to_string(DENIAL_CODES).map_err(|e| StoreError::Database(e.to_string()))?;
        self.run(move |c| {
            Ok(c.q_row(
                "SELECT COUNT(*) FROM audit_records
                 WHERE principal_sub = ?1
                   AND at >= ?2
                   AND seq > COALESCE((SELECT resumed_seq FROM principal_state WHERE subject = ?1), 0)
                   AND decision IN ('denied', 'conflict')
                   AND code IN (SELECT value FROM json_each(?3))",
                params![subject, since, codes],
                |r| r.get(0),
            )?)
        })
        .await
    }

    async fn audit_append(&self, r: AuditRecord) -> Result<(), StoreError> {
        self.write(move |c| Ok(insert_audit(c, &r, None)?)).await
    }

    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let sub = principal_sub.map(str::to_string);
        self.run_heavy(move |c| {
            let mut stmt = c.prepare(
                "SELECT seq, at, correlation_id, principal_iss, principal_sub, tool, decision, code, idempotency_key,
                        payment_id, approval_id, detail
                 FROM audit_records WHERE (?1 IS NULL OR principal_sub = ?1) ORDER BY seq DESC LIMIT ?2",
            )?;
            let rows = stmt.query_map(params![sub, limit], |r| {
                Ok(AuditRecord {
                    seq: r.get(0)?,
                    at: r.get(1)?,
                    correlation_id: r.get(2)?,
                    principal_iss: r.get(3)?,
                    principal_sub: r.get(4)?,
                    tool: r.get(5)?,
                    decision: r.get(6)?,
                    code: r.get(7)?,
                    idempotency_key: r.get(8)?,
                    payment_id: r.get(9)?,
                    approval_id: r.get(10)?,
                    detail: r.get(11)?,
                })
            })?;
            Ok(rows.collect::<Result<Vec<_>, _>>()?)
        })
        .await
    }

    async fn ledger_open_account(&self, seed: AccountSeed, now: UnixSecs) -> Result<bool, StoreError> {
        self.write(move |c| {
            let tx = c.savepoint()?;
            let created = tx.exec(
                "INSERT OR IGNORE INTO accounts (id, currency, balance_minor, allow_overdraft, created_at) VALUES (?1, ?2, 0, ?3, ?4)",
                params![seed.id.as_str(), seed.currency.code(), seed.allow_overdraft, now],
            )? == 1;
            if created && seed.opening_minor != 0 {
                // Opening balances come from a per-currency equity account, so postings still sum to zero.
                let equity = format!("equity-opening-{}", seed.currency.code());
                tx.exec(
                    "INSERT OR IGNORE INTO accounts (id, currency, balance_minor, allow_overdraft, created_at) VALUES (?1, ?2, 0, 1, ?3)",
                    params![equity, seed.currency.code(), now],
                )?;
                let desc = format!("opening balance of {}", seed.id);
                post(&tx, None, &equity, -seed.opening_minor, seed.currency, &desc, now)?;
                post(&tx, None, seed.id.as_str(), seed.opening_minor, seed.currency, &desc, now)?;
            }
            tx.commit()?;
            Ok(created)
        })
        .await
    }

    async fn ledger_transfer(&self, req: TransferRequest, now: UnixSecs) -> Result<Payment, BackendError> {
        self.write(move |c| transfer_tx(c, req, now)).await
    }

    async fn ledger_refund(&self, req: RefundRequest, now: UnixSecs) -> Result<Payment, BackendError> {
        self.write(move |c| refund_tx(c, req, now)).await
    }

    async fn ledger_payment(&self, id: &PaymentId) -> Result<Option<Payment>, StoreError> {
        let id = id.clone();
        self.run(move |c| Ok(load_payment(c, id.as_str())?)).await
    }

    async fn ledger_balance(&self, account: &AccountId) -> Result<Option<Balance>, StoreError> {
        let account = account.clone();
        self.run(move |c| {
            let row: Option<(String, i64)> = c
                .q_row("SELECT currency, balance_minor FROM accounts WHERE id = ?1", [account.as_str()], |r| {
                    Ok((r.get(0)?, r.get(1)?))
                })
                .optional()?;
            row.map(|(cur, balance_minor)| {
                let currency = Currency::parse(&cur).map_err(|_| StoreError::Corrupt("account currency".into()))?;
                Ok(Balance { account_id: account.clone(), currency, balance_minor })
            })
            .transpose()
        })
        .await
    }

    async fn ledger_list_payments(&self, q: PaymentQuery) -> Result<Page<Payment>, StoreError> {
        self.run(move |c| {
            if q.accounts.is_empty() {
                return Ok(Page { items: vec![], next_cursor: None });
            }
            let accounts = serde_json::to_string(&q.accounts.iter().map(|a| a.as_str()).collect::<Vec<_>>())
                .map_err(|e| StoreError::Database(e.to_string()))?;
            let sql = format!(
                "SELECT {PAYMENT_COLS} FROM payments
                 WHERE (from_account IN (SELECT value FROM json_each(?1)) OR to_account IN (SELECT value FROM json_each(?1)))
                   AND (?2 IS NULL OR status = ?2)
                   AND (?3 IS NULL OR seq < ?3)
                 ORDER BY seq DESC LIMIT ?4"
            );
            let mut stmt = c.prepare(&sql)?;
            let limit = i64::from(q.limit);
            let rows = stmt.query_map(
                params![accounts, q.status.map(|s| s.as_str()), q.before_seq, limit + 1],
                payment_from_row,
            )?;
            let mut items: Vec<(Payment, i64)> = rows.collect::<Result<_, _>>()?;
            let next_cursor = if items.len() as i64 > limit {
                items.truncate(limit as usize);
                items.last().map(|(_, seq)| *seq)
            } else {
                None
            };
            Ok(Page { items: items.into_iter().map(|(p, _)| p).collect(), next_cursor })
        })
        .await
    }

    async fn ledger_entries(
        &self,
        account: &AccountId,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Page<LedgerEntry>, StoreError> {
        let account = account.clone();
        self.run(move |c| {
            let mut stmt = c.prepare(
                "SELECT seq, payment_id, amount_minor, currency, balance_after_minor, description, created_at
                 FROM postings WHERE account_id = ?1 AND (?2 IS NULL OR seq < ?2) ORDER BY seq DESC LIMIT ?3",
            )?;
            let limit = i64::from(limit);
            let rows = stmt.query_map(params![account.as_str(), before_seq, limit + 1], |r| {
                let pid: Option<String> = r.get(1)?;
                let cur: String = r.get(3)?;
                Ok(LedgerEntry {
                    seq: r.get(0)?,
                    payment_id: pid
                        .map(|p| PaymentId::parse(&p).map_err(|_| corrupt("postings.payment_id")))
                        .transpose()?,
                    amount_minor: r.get(2)?,
                    currency: Currency::parse(&cur).map_err(|_| corrupt("postings.currency"))?,
                    balance_after_minor: r.get(4)?,
                    description: r.get(5)?,
                    created_at: r.get(6)?,
                })
            })?;
            let mut items: Vec<LedgerEntry> = rows.collect::<Result<_, _>>()?;
            let next_cursor = if items.len() as i64 > limit {
                items.truncate(limit as usize);
                items.last().map(|e| e.seq)
            } else {
                None
            };
            Ok(Page { items, next_cursor })
        })
        .await
    }

    async fn ledger_integrity(&self) -> Result<IntegrityReport, StoreError> {
        self.run_heavy(|c| {
            // One read transaction: a consistent snapshot even while payments post.
            let tx = c.transaction_with_behavior(TransactionBehavior::Deferred)?;
            let mut problems = Vec::new();
            let mut currency_sums = Vec::new();
            {
                let mut stmt =
                    tx.prepare("SELECT currency, SUM(amount_minor) FROM postings GROUP BY currency ORDER BY currency")?;
                let rows = stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?)))?;
                for row in rows {
                    let (cur, sum) = row?;
                    if sum != 0 {
                        problems.push(format!("postings in {cur} sum to {sum}, not 0"));
                    }
                    currency_sums.push((cur, sum));
                }
                let mut stmt = tx.prepare(
                    "SELECT a.id, a.balance_minor, COALESCE(SUM(p.amount_minor), 0)
                     FROM accounts a LEFT JOIN postings p ON p.account_id = a.id GROUP BY a.id",
                )?;
                let rows =
                    stmt.query_map([], |r| Ok((r.get::<_, String>(0)?, r.get::<_, i64>(1)?, r.get::<_, i64>(2)?)))?;
                for row in rows {
                    let (id, balance, sum) = row?;
                    if balance != sum {
                        problems.push(format!("account {id} balance {balance} differs from its postings {sum}"));
                    }
                }
                let mut stmt = tx.prepare(
                    "SELECT id FROM accounts WHERE allow_overdraft = 0 AND balance_minor < 0
                     UNION ALL SELECT id FROM payments WHERE refunded_minor > amount_minor",
                )?;
                for row in stmt.query_map([], |r| r.get::<_, String>(0))? {
                    problems.push(format!("{} violates its bounds", row?));
                }
                let mut stmt = tx.prepare(
                    "SELECT payment_id FROM postings WHERE payment_id IS NOT NULL GROUP BY payment_id
                     HAVING SUM(amount_minor) <> 0 OR COUNT(*) <> 2",
                )?;
                for row in stmt.query_map([], |r| r.get::<_, String>(0))? {
                    problems.push(format!("payment {} is not one balanced debit/credit pair", row?));
                }
            }
            let accounts_checked: i64 = tx.q_row("SELECT COUNT(*) FROM accounts", [], |r| r.get(0))?;
            let postings_checked: i64 = tx.q_row("SELECT COUNT(*) FROM postings", [], |r| r.get(0))?;
            tx.commit()?;
            Ok(IntegrityReport { ok: problems.is_empty(), accounts_checked, postings_checked, currency_sums, problems })
        })
        .await
    }
    async fn rail_open(&self, rec: RailPayment, guards: Guards, now: UnixSecs) -> Result<RailOpened, BackendError> {
        self.write(move |c| rails::open_tx(c, rec, guards, now)).await
    }

    async fn rail_transition(
        &self,
        id: &PaymentId,
        from: &[RailState],
        to: RailState,
        update: RailUpdate,
        now: UnixSecs,
    ) -> Result<Option<RailPayment>, StoreError> {
        let (id, from) = (id.to_string(), from.to_vec());
        self.write(move |c| rails::transition_tx(c, &id, &from, to, update, now)).await
    }

    async fn rail_abandon(&self, id: &PaymentId) -> Result<bool, StoreError> {
        let id = id.to_string();
        self.write(move |c| rails::abandon_tx(c, &id)).await
    }

    async fn rail_get(&self, id: &PaymentId) -> Result<Option<RailPayment>, StoreError> {
        let id = id.to_string();
        self.run(move |c| Ok(rails::load_rail(c, "id", &id)?)).await
    }

    async fn rail_by_key(&self, idempotency_key: &str) -> Result<Option<RailPayment>, StoreError> {
        let key = idempotency_key.to_string();
        self.run(move |c| Ok(rails::load_rail(c, "idempotency_key", &key)?)).await
    }

    async fn rail_by_ref(&self, rail: &str, rail_ref: &str) -> Result<Option<RailPayment>, StoreError> {
        let (rail, rail_ref) = (rail.to_string(), rail_ref.to_string());
        self.run(move |c| {
            let sql = format!("SELECT {} FROM rail_payments WHERE rail = ?1 AND rail_ref = ?2", rails::RAIL_COLS);
            Ok(c.q_row(&sql, params![rail, rail_ref], rails::rail_from_row).optional()?.map(|(_, r)| r))
        })
        .await
    }

    async fn rail_list(
        &self,
        states: &[RailState],
        updated_before: UnixSecs,
        limit: u32,
    ) -> Result<Vec<RailPayment>, StoreError> {
        let states = states.to_vec();
        self.run_heavy(move |c| rails::list(c, &states, updated_before, limit)).await
    }

    async fn rail_since(
        &self,
        since: UnixSecs,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<(i64, RailPayment)>, StoreError> {
        self.run_heavy(move |c| rails::since(c, since, after_seq, limit)).await
    }

    async fn payment_summary(&self, query: SummaryQuery) -> Result<Vec<SummaryRow>, StoreError> {
        self.run_heavy(move |c| rails::summary(c, &query)).await
    }

    async fn job_lease(&self, kind: &str, holder: &str, now: UnixSecs, lease_secs: i64) -> Result<bool, StoreError> {
        let (kind, holder) = (kind.to_string(), holder.to_string());
        self.write(move |c| rails::lease_tx(c, &kind, &holder, now, lease_secs)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::money::Money;

    fn rec(key: &str, fp: &str, now: UnixSecs) -> NewIdempotencyRecord {
        NewIdempotencyRecord {
            key: key.into(),
            fingerprint: fp.into(),
            tool: "create_payment".into(),
            principal_iss: "iss".into(),
            principal_sub: "sub".into(),
            lease_until: now + 30,
            expires_at: now + 3600,
        }
    }

    async fn store_with_accounts() -> SqliteStore {
        let s = SqliteStore::open_in_memory().unwrap();
        let kes = Currency::parse("KES").unwrap();
        for (id, opening) in [("acct-A", 10_000), ("acct-B", 0)] {
            let seed = AccountSeed {
                id: AccountId::parse(id).unwrap(),
                currency: kes,
                opening_minor: opening,
                allow_overdraft: false,
            };
            assert!(s.ledger_open_account(seed.clone(), 0).await.unwrap());
            assert!(!s.ledger_open_account(seed, 0).await.unwrap(), "opening twice is a no-op");
        }
        s
    }

    fn transfer(key: &str, minor: i64) -> TransferRequest {
        TransferRequest {
            idempotency_key: key.into(),
            alias_key: None,
            payment_id: PaymentId::generate(),
            from_account: AccountId::parse("acct-A").unwrap(),
            to_account: AccountId::parse("acct-B").unwrap(),
            amount: Money::from_minor(minor, Currency::parse("KES").unwrap()).unwrap(),
            memo: None,
            principal_sub: "sub".into(),
            guards: Guards::default(),
            audit: None,
        }
    }

    #[tokio::test]
    async fn reservation_states() {
        let s = SqliteStore::open_in_memory().unwrap();
        assert_eq!(s.idem_reserve(rec("k", "fp", 100), 100).await.unwrap(), Reservation::Acquired);
        // Live lease: a duplicate sees it in flight.
        assert_eq!(
            s.idem_reserve(rec("k", "fp", 101), 101).await.unwrap(),
            Reservation::InFlight { fingerprint: "fp".into() }
        );
        // The holder crashed: after the lease, a retry with the same arguments takes over ...
        assert_eq!(s.idem_reserve(rec("k", "fp", 131), 131).await.unwrap(), Reservation::Acquired);
        // ... but one with other arguments does not.
        assert_eq!(
            s.idem_reserve(rec("k", "other", 200), 200).await.unwrap(),
            Reservation::InFlight { fingerprint: "fp".into() }
        );
        s.idem_complete("k", "{\"done\":1}").await.unwrap();
        assert_eq!(
            s.idem_reserve(rec("k", "fp", 201), 201).await.unwrap(),
            Reservation::Completed { fingerprint: "fp".into(), outcome: "{\"done\":1}".into() }
        );
        // Completion is final: a second completion changes nothing.
        s.idem_complete("k", "{\"done\":2}").await.unwrap();
        assert_eq!(s.idem_peek("k", 202).await.unwrap(), Some(("fp".into(), Some("{\"done\":1}".into()))));
        // Past retention the key is free again, and purge removes it.
        assert_eq!(s.idem_peek("k", 100 + 3600).await.unwrap(), None);
        assert_eq!(s.idem_purge(100 + 3600).await.unwrap(), 1);
        // Release gives back an in-flight key only.
        assert_eq!(s.idem_reserve(rec("r", "fp", 0), 0).await.unwrap(), Reservation::Acquired);
        s.idem_release("r").await.unwrap();
        assert_eq!(s.idem_peek("r", 1).await.unwrap(), None);
    }

    #[tokio::test]
    async fn the_ledger_applies_a_key_once_and_completes_its_record_in_the_same_transaction() {
        let s = store_with_accounts().await;
        assert_eq!(s.idem_reserve(rec("key-1", "fp", 0), 0).await.unwrap(), Reservation::Acquired);
        let p1 = s.ledger_transfer(transfer("key-1", 2_500), 1).await.unwrap();
        let (_, outcome) = s.idem_peek("key-1", 1).await.unwrap().unwrap();
        let stored = StoredOutcome::from_json(&outcome.expect("completed with the posting")).unwrap();
        assert_eq!(stored, StoredOutcome::Succeeded { payment: p1.clone() });
        // The same key again (e.g. after the idempotency record expired) returns the same payment.
        let p2 = s.ledger_transfer(transfer("key-1", 2_500), 2).await.unwrap();
        assert_eq!(p1.id, p2.id);
        // The same key for a different transfer is refused.
        assert_eq!(s.ledger_transfer(transfer("key-1", 999), 3).await, Err(BackendError::IdempotencyKeyReused));
        let b = s.ledger_balance(&AccountId::parse("acct-B").unwrap()).await.unwrap().unwrap();
        assert_eq!(b.balance_minor, 2_500);
        assert!(s.ledger_integrity().await.unwrap().ok);
    }

    #[tokio::test]
    async fn overdrafts_and_refunds_are_bounded() {
        let s = store_with_accounts().await;
        assert!(matches!(
            s.ledger_transfer(transfer("big", 10_001), 0).await,
            Err(BackendError::InsufficientFunds { .. })
        ));
        let p = s.ledger_transfer(transfer("ok", 10_000), 0).await.unwrap();
        let refund = |key: &str, amount: Option<i64>| RefundRequest {
            idempotency_key: key.into(),
            alias_key: None,
            refund_id: PaymentId::generate(),
            payment_id: p.id.clone(),
            amount_minor: amount,
            reason: None,
            principal_sub: "sub".into(),
            guards: Guards::default(),
            audit: None,
        };
        assert!(matches!(
            s.ledger_refund(refund("r0", Some(10_001)), 1).await,
            Err(BackendError::RefundExceedsRemaining { .. })
        ));
        s.ledger_refund(refund("r1", Some(4_000)), 1).await.unwrap();
        let rest = s.ledger_refund(refund("r2", None), 1).await.unwrap();
        assert_eq!(rest.amount_minor, 6_000);
        assert!(matches!(s.ledger_refund(refund("r3", None), 1).await, Err(BackendError::NotRefundable(_))));
        let report = s.ledger_integrity().await.unwrap();
        assert!(report.ok, "{:?}", report.problems);
        assert_eq!(report.currency_sums, vec![("KES".to_string(), 0)]);
    }

    #[tokio::test]
    async fn integrity_notices_a_tampered_balance() {
        let s = store_with_accounts().await;
        s.run(|c| {
            Ok::<_, StoreError>(
                c.execute("UPDATE accounts SET balance_minor = balance_minor + 1 WHERE id = 'acct-B'", [])?,
            )
        })
        .await
        .unwrap();
        let report = s.ledger_integrity().await.unwrap();
        assert!(!report.ok);
        assert!(report.problems.iter().any(|p| p.contains("acct-B")), "{:?}", report.problems);
    }
}
