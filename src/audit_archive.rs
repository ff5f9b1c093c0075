//! Audit retention: records older than `audit.retention_days` leave the database, never silently
//! and never breaking the chain. Only sealed records go, as a whole range of the hash chain that
//! ends at a signed retention marker (a checkpoint whose claims say `retention`, made here): each batch is written to a JSON Lines
//! file (one record per line with its link — `chain_seq`, `prev_hash`, `hash` — oldest first),
//! synced and renamed into place, and only when every file of the range is written is the range
//! deleted, records and links together. A failed write deletes nothing. `paygate audit verify
//! --archive-dir` walks the files and then the database as one chain; without the files the walk
//! starts at the marker the range ended at, and only there: a chain in the database that starts
//! past position 1 anywhere else had its beginning deleted. The archive's own run is audited. With
//! `audit.retention_days = 0` (the default) nothing leaves.
//!
//! Files are named `audit-<first chain position>-<last>.jsonl` (zero-padded, so they sort in order)
//! and read back with [`read`] / [`read_chained`] or any JSON Lines tool.

use std::io::Write;
use std::path::{Path, PathBuf};

use crate::audit_chain::Sealer;
use crate::clock::UnixSecs;
use crate::domain::audit::AuditRecord;
use crate::domain::audit_chain::{ChainHead, ChainedRecord};
use crate::domain::error::StoreError;
use crate::store::Store;

/// Batches archived in one run at most (the next run goes on).
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
    #[error(
        "the audit chain is broken at position {0} (its record is missing): nothing archived; run `paygate audit verify`"
    )]
    Broken(i64),
}

/// One archived batch (one file).
#[derive(Debug, Clone, PartialEq)]
pub struct Archived {
    pub file: PathBuf,
    pub records: usize,
    /// Records deleted with this batch (the range is deleted with its last file).
    pub deleted: u64,
    /// The last chain position the file holds.
    pub last_chain_seq: i64,
}

/// Archive what is past retention at `now`: the sealed chain up to the last position whose
/// records are all older than the cutoff (at most [`BATCHES_PER_RUN_MAX`] files per run), ending
/// at a signed checkpoint.
pub async fn archive(
    store: &dyn Store,
    sealer: &Sealer<'_>,
    s: &Settings,
    now: UnixSecs,
) -> Result<Vec<Archived>, ArchiveError> {
    let mut done = Vec::new();
    if s.retention_secs <= 0 {
        return Ok(done);
    }
    let cutoff = now - s.retention_secs;
    // What committed before is sealed first: only the chain's records leave.
    crate::audit_chain::seal(store, sealer, now, s.batch_max).await?;
    mark_legacy_range(store, sealer, &s.dir, now).await?;
    let (Some(first), Some(older)) = (store.audit_chain_first().await?, store.audit_chain_older_than(cutoff).await?)
    else {
        return Ok(done);
    };
    let through = older.min(first - 1 + (BATCHES_PER_RUN_MAX as i64) * i64::from(s.batch_max));
    let mut after = first - 1;
    let mut end: Option<ChainHead> = None;
    while after < through {
        let limit = (through - after).min(i64::from(s.batch_max)) as u32;
        let links = store.audit_chain_links(after, limit).await?;
        let Some(last) = links.last() else { break };
        let (first_pos, last_pos) = (links[0].chain_seq, last.chain_seq);
        end = Some(ChainHead { chain_seq: last_pos, hash: last.hash.clone() });
        let mut records = Vec::with_capacity(links.len());
        for l in links {
            let Some(record) = l.record else { return Err(ArchiveError::Broken(l.chain_seq)) };
            records.push(ChainedRecord { record, chain_seq: l.chain_seq, prev_hash: l.prev_hash, hash: l.hash });
        }
        let file = s.dir.join(format!("audit-{first_pos:020}-{last_pos:020}.jsonl"));
        let count = records.len();
        let (dir, path) = (s.dir.clone(), file.clone());
        tokio::task::spawn_blocking(move || write(&dir, &path, &records))
            .await
            .map_err(|e| ArchiveError::Io { path: file.clone(), source: std::io::Error::other(e.to_string()) })?
            .map_err(|source| ArchiveError::Io { path: file.clone(), source })?;
        done.push(Archived { file, records: count, deleted: 0, last_chain_seq: last_pos });
        after = last_pos;
    }
    let Some(end) = end else { return Ok(done) };
    // The range ends at a signed retention marker: the walk without the files starts there.
    crate::audit_chain::checkpoint_at(store, sealer, &end, now, true).await?;
    let deleted = store.audit_delete_through(end.chain_seq).await?;
    if let Some(last) = done.last_mut() {
        last.deleted = deleted;
    }
    Ok(done)
}

/// A range archived by an older paygate ended at a plain checkpoint, so the walk over the database
/// alone would name its positions as deleted. When the archive's newest file ends exactly there,
/// with the hash that checkpoint signed, the range was archived, not deleted: sign the retention
/// marker it lacks. Anything else (no such file, another hash, a checkpoint that does not verify)
/// marks nothing.
async fn mark_legacy_range(
    store: &dyn Store,
    sealer: &Sealer<'_>,
    dir: &Path,
    now: UnixSecs,
) -> Result<(), StoreError> {
    let Some(first) = store.audit_chain_first().await?.filter(|f| *f > 1) else { return Ok(()) };
    let Some(cp) = store.audit_checkpoints(first - 2, 1).await?.pop().filter(|c| c.chain_seq == first - 1) else {
        return Ok(());
    };
    match sealer.signer.verify_checkpoint(&cp.jws) {
        Ok(claims) if !claims.retention && claims.chain_seq == cp.chain_seq && claims.hash == cp.hash => {}
        _ => return Ok(()),
    }
    let dir = dir.to_path_buf();
    let last = tokio::task::spawn_blocking(move || {
        let file = crate::audit_chain::files(&dir).ok()?.pop()?;
        crate::audit_chain::read_chained(&file).ok()?.pop()
    })
    .await
    .ok()
    .flatten();
    if last.is_some_and(|r| r.chain_seq == cp.chain_seq && r.hash == cp.hash) {
        let end = ChainHead { chain_seq: cp.chain_seq, hash: cp.hash };
        crate::audit_chain::checkpoint_at(store, sealer, &end, now, true).await?;
        tracing::info!(audit.chain_seq = end.chain_seq, "an archived range's end marked for retention");
    }
    Ok(())
}

/// Write the batch to a temporary file, sync it, rename it into place and sync the directory.
fn write(dir: &Path, path: &Path, records: &[ChainedRecord]) -> std::io::Result<()> {
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
