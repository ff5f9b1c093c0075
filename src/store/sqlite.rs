//! The embedded SQLite engine. One connection serialises writes (SQLite allows one writer anyway);
//! calls run on tokio's blocking pool so the async runtime never waits on disk.
//!
//! Like every engine, it holds no business rule: it loads rows, asks `domain::rules`, and writes the
//! plan. This file opens, migrates and connects (the writer, the readers, the checkpointer) and
//! answers `Engine`; each entity's SQL is in its own file (`idempotency.rs`, `approvals.rs`,
//! `suspensions.rs`, `audit.rs`, `ledger.rs` with the posting transactions in `postings.rs`,
//! `rails.rs`, `reads.rs`, `leases.rs`).

use std::path::Path;
use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use rusqlite::types::{ToSqlOutput, ValueRef};
use rusqlite::{Connection, OptionalExtension, Params, Row, TransactionBehavior, params_from_iter};

mod approvals;
mod audit;
mod idempotency;
mod job;
mod leases;
mod ledger;
mod outbox;
mod passkeys;
mod payees;
mod policy;
mod postings;
mod rails;
mod reads;
mod suspensions;

use job::{BATCH_POISONED, JobScope};

// `postings.rs` reaches it through `super::`.
use audit::insert_audit;

use super::queries::{Dialect, Statement};
use super::rows::{Cell, Columns, PlainRow, Value};
use super::{Engine, StoreError};
use crate::domain::error::BackendError;

const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/sqlite/0001_init.sql"),
    include_str!("../../migrations/sqlite/0002_approvals_mandates.sql"),
    include_str!("../../migrations/sqlite/0003_budget_usage.sql"),
    include_str!("../../migrations/sqlite/0004_rails.sql"),
    include_str!("../../migrations/sqlite/0005_revocation.sql"),
    include_str!("../../migrations/sqlite/0006_refund_usage.sql"),
    include_str!("../../migrations/sqlite/0007_operator_reads.sql"),
    include_str!("../../migrations/sqlite/0008_rail_flows.sql"),
    include_str!("../../migrations/sqlite/0009_user_approvals.sql"),
    include_str!("../../migrations/sqlite/0010_integrity_checkpoints.sql"),
    include_str!("../../migrations/sqlite/0011_principals.sql"),
    include_str!("../../migrations/sqlite/0012_payees.sql"),
    include_str!("../../migrations/sqlite/0013_webhooks.sql"),
    include_str!("../../migrations/sqlite/0014_audit_chain.sql"),
    include_str!("../../migrations/sqlite/0015_passkeys.sql"),
    include_str!("../../migrations/sqlite/0016_policy_versions.sql"),
    include_str!("../../migrations/sqlite/0017_rate_quotas.sql"),
    include_str!("../../migrations/sqlite/0018_passkey_enrolment.sql"),
    include_str!("../../migrations/sqlite/0019_payee_cooling.sql"),
    include_str!("../../migrations/sqlite/0020_audit_by_user.sql"),
    include_str!("../../migrations/sqlite/0021_audit_record_tags.sql"),
    include_str!("../../migrations/sqlite/0022_policy_version_tags.sql"),
    include_str!("../../migrations/sqlite/0023_refunds_by_original.sql"),
    include_str!("../../migrations/sqlite/0024_payee_tags.sql"),
    include_str!("../../migrations/sqlite/0025_approval_tags.sql"),
    include_str!("../../migrations/sqlite/0026_rail_family_key.sql"),
    include_str!("../../migrations/sqlite/0027_rail_refund_of.sql"),
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
    /// A write meant to change exactly one row (a money write): any other count fails it
    /// (`StatementChangedRows`), so a row a trigger swallowed (`RAISE(IGNORE)`: the statement
    /// succeeds, nothing is written) fails the transaction instead of passing for a write.
    fn exec_one<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<()> {
        match self.exec(sql, params)? {
            1 => Ok(()),
            n => Err(rusqlite::Error::StatementChangedRows(n)),
        }
    }
    /// One row or none, through a shared mapper (`store::rows`).
    fn opt<T, P: Params>(
        &self,
        sql: &str,
        params: P,
        f: impl FnOnce(&dyn Columns) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        self.q_row(sql, params, |r| Ok(f(r))).optional()?.transpose()
    }
    /// Every row, through a shared mapper.
    fn all<T, P: Params>(
        &self,
        sql: &str,
        params: P,
        f: impl Fn(&dyn Columns) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError>;
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
    fn all<T, P: Params>(
        &self,
        sql: &str,
        params: P,
        f: impl Fn(&dyn Columns) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        let mut stmt = self.prepare_cached(sql)?;
        let rows = stmt.query_map(params, |r| Ok(f(r)))?;
        rows.map(|r| r?).collect()
    }
}

/// Most writes committed together by one fsync.
pub const WRITE_BATCH_MAX: usize = 256;
/// Connections serving reads alongside the writer (WAL lets them run while it commits).
pub const READERS: usize = 2;
/// Writes waiting for the writer before callers wait to enqueue (backpressure).
const WRITE_QUEUE_MAX: usize = 4096;

/// WAL frames past which a commit asks the checkpointer thread to copy them into the database
/// file (SQLite's own auto-checkpoint threshold, which the writer no longer runs itself).
pub const CHECKPOINT_FRAMES: i32 = 1000;
/// WAL frames past which the writer checkpoints itself, between batches (about 32 MiB of 4 KiB
/// pages). A checkpoint running beside continuous writes never catches the last frame, and the WAL
/// restarts from its beginning only once every frame is copied, so without this bound it would grow.
pub const WAL_FRAMES_MAX: i32 = 8192;
/// The WAL file is truncated back to this size when it restarts.
const WAL_BYTES_KEPT: i64 = 64 << 20;

/// When the writer hands checkpoints to the checkpointer, and when it takes one itself.
#[derive(Clone, Copy)]
struct Checkpoints {
    background_at: i32,
    writer_at: i32,
}

const CHECKPOINTS: Checkpoints = Checkpoints { background_at: CHECKPOINT_FRAMES, writer_at: WAL_FRAMES_MAX };

thread_local! {
    /// Frames in the WAL after this thread's last commit, as SQLite's WAL hook reports them. Each
    /// writer thread serves one database, so its thread-local is that database's.
    static WAL_FRAMES: std::cell::Cell<i32> = const { std::cell::Cell::new(0) };
}

fn note_wal_frames(_: &rusqlite::hooks::Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.with(|f| f.set(frames));
    Ok(())
}

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
    /// Principals last read as not suspended (`suspensions.rs`).
    clear: Arc<suspensions::ClearSeen>,
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

/// Memory SQLite may use per connection (`storage.sqlite_cache_mib`, `storage.sqlite_mmap_mib`).
/// SQLite's own page cache default is 2 MiB, far below the hot index pages of a ledger of a million
/// payments; memory-mapped reads skip a system call per page.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Tuning {
    /// Page cache of each reader, in MiB.
    pub cache_mib: i64,
    /// Page cache of the writer, in MiB: room for one batch's dirty pages. SQLite walks the whole
    /// cache at every commit (`pcache1TruncateUnsafe`), so a large one costs every batch; the
    /// writer reads the rest through mmap.
    pub writer_cache_mib: i64,
    /// Bytes of the database file read through mmap, in MiB (0: none). The build raises SQLite's own
    /// ceiling (2 GiB) to 64 GiB (`.cargo/config.toml`).
    pub mmap_mib: i64,
}

impl Default for Tuning {
    fn default() -> Self {
        Tuning { cache_mib: 64, writer_cache_mib: 8, mmap_mib: 32 * 1024 }
    }
}

fn tune(conn: &Connection, t: Tuning) -> Result<(), StoreError> {
    // A negative cache_size is in KiB.
    conn.pragma_update(None, "cache_size", -(t.cache_mib * 1024))?;
    conn.pragma_update(None, "mmap_size", t.mmap_mib * 1024 * 1024)?;
    Ok(())
}

fn configure(conn: &Connection) -> Result<(), StoreError> {
    // WAL for concurrent readers; FULL sync because a committed payment must survive power loss.
    conn.pragma_update(None, "journal_mode", "WAL")?;
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.pragma_update(None, "foreign_keys", "ON")?;
    // Each write in a group commit runs under its own SAVEPOINT, so SQLite keeps a statement
    // sub-journal of the pages it first touches; by default that is a temp file, written with a
    // pwrite per page (the profile's largest writer cost). It only ever serves ROLLBACK TO inside
    // an open transaction and is deleted on open, so it never took part in crash recovery (the
    // WAL does): keeping it in memory changes no durability guarantee.
    conn.pragma_update(None, "temp_store", "MEMORY")?;
    conn.busy_timeout(std::time::Duration::from_secs(5))?;
    conn.set_prepared_statement_cache_capacity(STATEMENT_CACHE);
    Ok(())
}

impl SqliteStore {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        Self::open_tuned(path, Tuning::default())
    }

    pub fn open_tuned(path: &Path, tuning: Tuning) -> Result<Self, StoreError> {
        Self::init_with(path, None, CHECKPOINTS, tuning)
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
        Self::init_with(path, temp, CHECKPOINTS, Tuning::default())
    }

    fn init_with(
        path: &Path,
        temp: Option<Arc<TempFile>>,
        checkpoints: Checkpoints,
        tuning: Tuning,
    ) -> Result<Self, StoreError> {
        // Owner-only before SQLite opens it: its -wal and -shm files take the database file's mode.
        let tightened = crate::private_fs::prepare_database(path).map_err(|e| StoreError::Database(e.to_string()))?;
        for file in tightened {
            tracing::warn!(file = %file, "database file was readable by others; now owner-only (0600)");
        }
        let mut conn = Connection::open(path)?;
        configure(&conn)?;
        tune(&conn, Tuning { cache_mib: tuning.writer_cache_mib, ..tuning })?;
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
            tune(&r, tuning)?;
            readers.push(Mutex::new(r));
        }
        // Checkpoints leave the writer: copying WAL frames into the database file and syncing it
        // took a tenth of the writer's time, and the writer is what bounds payments. The WAL hook
        // replaces SQLite's auto-checkpoint (which is itself a WAL hook).
        conn.wal_hook(Some(note_wal_frames));
        conn.pragma_update(None, "journal_size_limit", WAL_BYTES_KEPT)?;
        let checkpointer = Connection::open(path)?;
        configure(&checkpointer)?;
        let (wake, woken) = std::sync::mpsc::sync_channel::<()>(1);
        std::thread::Builder::new()
            .name("paygate-sqlite-checkpointer".into())
            .spawn(move || checkpointer_loop(checkpointer, woken))
            .map_err(|e| StoreError::Database(format!("cannot start the checkpointer thread: {e}")))?;
        let (tx, rx) = tokio::sync::mpsc::channel::<Job>(WRITE_QUEUE_MAX);
        std::thread::Builder::new()
            .name("paygate-sqlite-writer".into())
            .spawn(move || writer_loop(conn, rx, wake, checkpoints))
            .map_err(|e| StoreError::Database(format!("cannot start the writer thread: {e}")))?;
        Ok(SqliteStore {
            writer: tx,
            readers: Arc::new(readers),
            next_reader: Arc::new(std::sync::atomic::AtomicUsize::new(0)),
            clear: Arc::default(),
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
    /// must do its work under a savepoint (`conn.savepoint()`, or `job::JobSavepoint`), so that its
    /// failure is its own — except a posting (`job::JobScope`), which decides before it writes and
    /// poisons the batch if it fails after writing.
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

/// Copy committed WAL frames into the database file whenever the writer asks (PASSIVE: it never
/// waits for the writer or readers, and syncs the WAL before and the database after, as SQLite's own
/// auto-checkpoint does). Ends with the writer.
fn checkpointer_loop(conn: Connection, woken: std::sync::mpsc::Receiver<()>) {
    while woken.recv().is_ok() {
        if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(%error, "background checkpoint failed; the writer checkpoints past its bound");
        }
    }
}

/// After a commit: every `background_at` new frames, wake the checkpointer (a request already
/// pending is enough), so each stretch of the WAL is copied once, as SQLite's own auto-checkpoint
/// would; past the bound, checkpoint here so the WAL restarts at the next write. `woken_at`: the
/// WAL's frame count when the checkpointer was last woken.
fn after_commit(conn: &Connection, wake: &std::sync::mpsc::SyncSender<()>, at: Checkpoints, woken_at: &mut i32) {
    let frames = WAL_FRAMES.with(|f| f.get());
    if frames < *woken_at {
        *woken_at = 0; // the WAL restarted
    }
    if frames >= at.writer_at {
        if let Err(error) = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(())) {
            tracing::warn!(%error, "checkpoint failed");
        }
        WAL_FRAMES.with(|f| f.set(0));
        *woken_at = 0;
    } else if frames - *woken_at >= at.background_at {
        let _ = wake.try_send(());
        *woken_at = frames;
    }
}

fn writer_loop(
    mut conn: Connection,
    mut rx: tokio::sync::mpsc::Receiver<Job>,
    wake: std::sync::mpsc::SyncSender<()>,
    checkpoints: Checkpoints,
) {
    let mut woken_at = 0;
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
            after_commit(&conn, &wake, checkpoints, &mut woken_at);
            continue;
        }
        BATCH_POISONED.with(|p| p.set(false));
        let finishers: Vec<Finisher> = batch.into_iter().map(|job| job(&mut conn)).collect();
        let committed = if BATCH_POISONED.with(|p| p.replace(false)) {
            tracing::error!(
                "a posting failed after it had written; every write in its batch is rolled back and reported failed"
            );
            let _ = conn.execute_batch("ROLLBACK");
            false
        } else {
            match conn.execute_batch("COMMIT") {
                Ok(()) => true,
                Err(error) => {
                    tracing::error!(%error, "group commit failed; every write in the batch is reported failed");
                    let _ = conn.execute_batch("ROLLBACK");
                    false
                }
            }
        };
        for finish in finishers {
            finish(committed);
        }
        after_commit(&conn, &wake, checkpoints, &mut woken_at);
    }
}

impl From<rusqlite::Error> for StoreError {
    fn from(e: rusqlite::Error) -> Self {
        StoreError::Database(e.to_string())
    }
}

impl rusqlite::ToSql for Value {
    fn to_sql(&self) -> rusqlite::Result<ToSqlOutput<'_>> {
        match self {
            Value::Text(v) => v.to_sql(),
            Value::Int(v) => v.to_sql(),
        }
    }
}

fn db(e: impl Into<StoreError>) -> BackendError {
    BackendError::from(e.into())
}

#[async_trait]
impl Engine for SqliteStore {
    async fn ping(&self) -> Result<(), StoreError> {
        self.run(|c| Ok(c.q_row("SELECT 1", [], |r| r.get::<_, i64>(0)).map(|_| ())?)).await
    }

    fn claim_is_cheap(&self) -> bool {
        true
    }

    fn dialect(&self) -> Dialect {
        Dialect::Sqlite
    }

    async fn select_rows(&self, st: Statement) -> Result<Vec<PlainRow>, StoreError> {
        self.run_heavy(move |c| {
            let mut stmt = c.prepare_cached(&st.text)?;
            let n = stmt.column_count();
            let rows = stmt.query_map(params_from_iter(st.params), |r| {
                (0..n)
                    .map(|i| {
                        Ok(match r.get_ref(i)? {
                            ValueRef::Null => Cell::Null,
                            ValueRef::Integer(v) => Cell::Int(v),
                            ValueRef::Real(v) => Cell::Int(v as i64),
                            ValueRef::Text(t) | ValueRef::Blob(t) => {
                                Cell::Text(String::from_utf8_lossy(t).into_owned())
                            }
                        })
                    })
                    .collect::<rusqlite::Result<Vec<Cell>>>()
                    .map(PlainRow)
            })?;
            Ok(rows.collect::<rusqlite::Result<Vec<PlainRow>>>()?)
        })
        .await
    }
}

#[cfg(test)]
mod tests;
