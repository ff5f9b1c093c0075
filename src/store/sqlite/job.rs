//! A write job's scope inside the writer's batch: the savepoint most jobs take, and the posting's
//! scope, which takes none inside a batch and poisons the batch when it fails after writing.

use rusqlite::Connection;

use super::Cached;

/// One job's savepoint inside the writer's batch transaction, through the connection's statement
/// cache (rusqlite's `Savepoint` parses its statements again on every use): a failed job undoes
/// only itself. Dropped while open (an early return, a panic), it rolls the job back.
pub(super) struct JobSavepoint<'c> {
    conn: &'c Connection,
    open: bool,
}

impl<'c> JobSavepoint<'c> {
    pub(super) fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        conn.exec("SAVEPOINT job", [])?;
        Ok(JobSavepoint { conn, open: true })
    }

    /// Undo everything the job wrote; the savepoint stays open for what it writes next.
    fn undo(&self) -> rusqlite::Result<()> {
        self.conn.exec("ROLLBACK TO job", []).map(drop)
    }

    /// Keep what the job wrote (it commits with the batch).
    fn release(mut self) -> rusqlite::Result<()> {
        self.conn.exec("RELEASE job", [])?;
        self.open = false;
        Ok(())
    }
}

impl Drop for JobSavepoint<'_> {
    fn drop(&mut self) {
        if self.open {
            let _ = self.conn.exec("ROLLBACK TO job", []);
            let _ = self.conn.exec("RELEASE job", []);
        }
    }
}

/// A posting job's scope. Inside the writer's batch transaction a posting takes no savepoint: it
/// decides everything (keys, rules, guards) before its first write, so a refusal has nothing to
/// undo, and a failure after its first write is a fault (a full disk, a broken constraint) that
/// poisons the batch: the writer rolls the whole batch back and reports every write in it failed
/// (nothing was written; each caller may retry). A savepoint made SQLite copy every page a job
/// first touched into its sub-journal (3.6% of a payment's server CPU) and cost two statements.
/// Outside a batch (the writer could not open one, so each write is its own transaction) the job
/// runs under a savepoint as before, which is then its transaction. Dropped unreleased (an early
/// return, a panic) after a write, it undoes or poisons what it wrote.
pub(super) enum JobScope<'c> {
    Batch(BatchJob<'c>),
    Savepoint(JobSavepoint<'c>),
}

/// A posting inside the batch transaction: the connection's change count when it began.
pub(super) struct BatchJob<'c> {
    conn: &'c Connection,
    before: u64,
    open: bool,
}

impl BatchJob<'_> {
    fn wrote(&self) -> bool {
        self.conn.total_changes() != self.before
    }
}

impl Drop for BatchJob<'_> {
    fn drop(&mut self) {
        if self.open && self.wrote() {
            BATCH_POISONED.with(|p| p.set(true));
        }
    }
}

thread_local! {
    /// Set by a job that failed after writing; the writer thread rolls its batch back.
    pub(super) static BATCH_POISONED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

impl<'c> JobScope<'c> {
    pub(super) fn begin(conn: &'c Connection) -> rusqlite::Result<Self> {
        if conn.is_autocommit() {
            return JobSavepoint::begin(conn).map(JobScope::Savepoint);
        }
        Ok(JobScope::Batch(BatchJob { conn, before: conn.total_changes(), open: true }))
    }

    /// Undo what the job wrote; it may write again after. In a batch there is nothing to undo
    /// before its first write; after one, the batch is poisoned and this is an error.
    pub(super) fn undo(&self) -> rusqlite::Result<()> {
        match self {
            JobScope::Savepoint(s) => s.undo(),
            JobScope::Batch(b) if b.wrote() => {
                BATCH_POISONED.with(|p| p.set(true));
                Err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_ABORT),
                    Some("a posting failed after it had written; its batch is rolled back".into()),
                ))
            }
            JobScope::Batch(_) => Ok(()),
        }
    }

    /// Keep what the job wrote (it commits with the batch).
    pub(super) fn release(self) -> rusqlite::Result<()> {
        match self {
            JobScope::Savepoint(s) => s.release(),
            JobScope::Batch(mut b) => {
                b.open = false;
                Ok(())
            }
        }
    }
}
