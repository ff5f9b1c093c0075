//! Audit retention: records older than `audit.retention_days` leave the database, never silently.
//! Each batch is first written to a JSON Lines file (one `AuditRecord` per line, oldest first),
//! synced and renamed into place, and only then deleted: a failed write deletes nothing. The
//! archive's own run is audited. With `audit.retention_days = 0` (the default) nothing leaves.
//!
//! Files are named `audit-<first seq>-<last seq>.jsonl` (zero-padded, so they sort in order) and
//! read back with [`read`] or any JSON Lines tool.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::store::Store;

/// Batches archived in one run at most (the run is a scheduled job; the next run goes on).
pub const BATCHES_PER_RUN_MAX: usize = 10;

#[derive(Debug, Clone)]
pub struct Settings {
    /// Records older than this many seconds are archived; 0 keeps every record.
    pub retention_secs: i64,
    pub dir: PathBuf,
    pub batch_max: u32,
}

#[derive(Debug, thiserror::Error)]
pub enum ArchiveError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("writing the audit archive {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
}

/// One archived batch.
#[derive(Debug, Clone, PartialEq)]
pub struct Archived {
    pub file: PathBuf,
    pub records: usize,
    pub deleted: u64,
    pub last_seq: i64,
}

/// Archive what is past retention at `now`, batch by batch (at most [`BATCHES_PER_RUN_MAX`]).
pub async fn archive(store: &dyn Store, s: &Settings, now: UnixSecs) -> Result<Vec<Archived>, ArchiveError> {
    let mut done = Vec::new();
    if s.retention_secs <= 0 {
        return Ok(done);
    }
    let cutoff = now - s.retention_secs;
    for _ in 0..BATCHES_PER_RUN_MAX {
        let records = store.audit_before(cutoff, s.batch_max).await?;
        let (Some(first), Some(last)) = (records.first(), records.last()) else { break };
        let (first_seq, last_seq) = (first.seq, last.seq);
        let file = s.dir.join(format!("audit-{first_seq:020}-{last_seq:020}.jsonl"));
        let count = records.len();
        let (dir, path) = (s.dir.clone(), file.clone());
        tokio::task::spawn_blocking(move || write(&dir, &path, &records))
            .await
            .map_err(|e| ArchiveError::Io { path: file.clone(), source: std::io::Error::other(e.to_string()) })?
            .map_err(|source| ArchiveError::Io { path: file.clone(), source })?;
        // Only what the file holds (and is still past retention) is deleted.
        let deleted = store.audit_delete(first_seq, last_seq, cutoff).await?;
        done.push(Archived { file, records: count, deleted, last_seq });
        if count < s.batch_max as usize {
            break;
        }
    }
    Ok(done)
}

/// Write the batch to a temporary file, sync it, rename it into place and sync the directory.
fn write(dir: &Path, path: &Path, records: &[AuditRecord]) -> std::io::Result<()> {
    // Owner-only, like the key files: the trail names agents, operators and what they wrote.
    crate::private_fs::create_dir(dir)?;
    let tmp = path.with_extension("jsonl.partial");
    {
        // A leftover from a crashed run (or anything planted there) is removed, never written
        // through: the new file is created exclusively and a symbolic link is not followed.
        match std::fs::remove_file(&tmp) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut out = std::io::BufWriter::new(crate::private_fs::create_new_private(&tmp)?);
        for r in records {
            serde_json::to_writer(&mut out, r)?;
            out.write_all(b"\n")?;
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
    }
    std::fs::rename(&tmp, path)?;
    std::fs::File::open(dir)?.sync_all()
}

/// The records an archive file holds, in order.
pub fn read(path: &Path) -> std::io::Result<Vec<AuditRecord>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
        .collect()
}
