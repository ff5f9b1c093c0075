//! Sealing the audit trail onto its hash chain, signing checkpoints, and walking it
//! (`paygate audit verify`, `GET /operator/v1/audit/verify`). The chain's rules are in
//! `domain::audit_chain`; the stores seal (`AuditStore::audit_seal`) and read links.
//!
//! Records are sealed after they commit, by the `seal_audit` job (every `audit.seal_every_secs`,
//! one replica at a time): writers pay nothing for the chain but a column default on PostgreSQL.
//! Every `audit.checkpoint_every_secs` the head is signed with the mandate keys and the checkpoint
//! is stored and written to the log (a witness outside the database).

use std::path::{Path, PathBuf};

use crate::clock::UnixSecs;
use crate::domain::audit_chain::{
    CHECKPOINT_ISSUER, ChainHead, ChainLink, ChainedRecord, Checkpoint, CheckpointClaims, CheckpointSigner, Verdict,
    Walk,
};
use crate::domain::error::StoreError;
use crate::store::Store;

/// Sealing batches in one run at most (the next run goes on).
pub const SEAL_BATCHES_PER_RUN_MAX: u32 = 50;
/// Links and checkpoints read per page while walking.
const PAGE: u32 = 1000;

/// What one sealing run did.
#[derive(Debug, Clone, PartialEq)]
pub struct SealRun {
    pub sealed: u64,
    pub head: ChainHead,
    pub checkpoint: Option<Checkpoint>,
}

/// Seal what has committed (batches of `batch`), then sign the head if the newest checkpoint is
/// older than `checkpoint_every_secs` and the chain has grown since (`None`: no checkpoint).
pub async fn seal(
    store: &dyn Store,
    signer: &dyn CheckpointSigner,
    now: UnixSecs,
    batch: u32,
    checkpoint_every_secs: Option<i64>,
) -> Result<SealRun, StoreError> {
    let mut sealed = 0;
    let mut head = store.audit_chain_head().await?;
    for _ in 0..SEAL_BATCHES_PER_RUN_MAX {
        let (n, h) = store.audit_seal(batch).await?;
        (sealed, head) = (sealed + n, h);
        if n < u64::from(batch) {
            break;
        }
    }
    let Some(every) = checkpoint_every_secs else { return Ok(SealRun { sealed, head, checkpoint: None }) };
    let latest = store.audit_checkpoint_latest().await?;
    let due = latest.as_ref().is_none_or(|c| head.chain_seq > c.chain_seq && now - c.at >= every);
    let checkpoint = match due && head.chain_seq > 0 {
        true => Some(checkpoint_at(store, signer, &head, now).await?),
        false => None,
    };
    Ok(SealRun { sealed, head, checkpoint })
}

/// Sign that the chain up to `at.chain_seq` hashes to `at.hash`, store it and log it.
pub async fn checkpoint_at(
    store: &dyn Store,
    signer: &dyn CheckpointSigner,
    at: &ChainHead,
    now: UnixSecs,
) -> Result<Checkpoint, StoreError> {
    let claims = CheckpointClaims {
        iss: CHECKPOINT_ISSUER.to_string(),
        chain_seq: at.chain_seq,
        hash: at.hash.clone(),
        iat: now,
    };
    let jws = signer.sign_checkpoint(&claims).map_err(StoreError::Database)?;
    let cp = Checkpoint { chain_seq: at.chain_seq, hash: at.hash.clone(), at: now, jws };
    store.audit_checkpoint_put(cp.clone()).await?;
    tracing::info!(audit.chain_seq = cp.chain_seq, audit.hash = %cp.hash, "audit checkpoint signed");
    Ok(cp)
}

/// Why a walk could not run at all (as opposed to a chain that does not hold).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reading the audit archive {path}: {source}")]
    Archive { path: String, source: std::io::Error },
}

/// Walk the whole chain: the archive files in `archive_dir` first (when given), then the stored
/// links, checking every link and every signed checkpoint; the verdict names the first break.
pub async fn verify(
    store: &dyn Store,
    signer: &dyn CheckpointSigner,
    archive_dir: Option<&Path>,
) -> Result<Verdict, VerifyError> {
    // Every checkpoint's signature first: a forged one is itself a break.
    let mut checkpoints = Vec::new();
    let mut forged = None;
    let mut after = 0;
    loop {
        let page = store.audit_checkpoints(after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.chain_seq;
        for cp in page {
            match signer.verify_checkpoint(&cp.jws) {
                Ok(c) if c.chain_seq == cp.chain_seq && c.hash == cp.hash => checkpoints.push(cp),
                Ok(_) => {
                    forged =
                        forged.or(Some((cp.chain_seq, "its signed claims differ from its stored position or hash")))
                }
                Err(_) => forged = forged.or(Some((cp.chain_seq, "its signature does not verify"))),
            }
        }
    }
    // Read after the checkpoints (a checkpoint never names a position past the head it signed).
    let head = store.audit_chain_head().await?;
    let unsealed = store.audit_unsealed().await?;
    let signed = || checkpoints.iter().map(|c| (c.chain_seq, c.hash.clone()));
    if let Some((chain_seq, why)) = forged {
        let mut walk = Walk::new(ChainHead::genesis(), signed());
        let v = walk_stored(store, &mut walk, 0, &head).await.map(|()| walk.finish(&head, unsealed))?;
        let first_break = crate::domain::audit_chain::Break {
            chain_seq,
            seq: None,
            reason: format!("the checkpoint at position {chain_seq}: {why}"),
        };
        return Ok(Verdict { ok: false, first_break: Some(first_break), ..v });
    }

    let mut walk;
    let mut walked_to = 0;
    match archive_dir {
        Some(dir) => {
            walk = Walk::new(ChainHead::genesis(), signed());
            for file in files(dir).map_err(|source| archive_error(dir, source))? {
                for rec in read_chained(&file).map_err(|source| archive_error(&file, source))? {
                    walked_to = rec.chain_seq;
                    walk.push(&ChainLink::from(rec));
                }
            }
        }
        None => {
            // Retention removed positions before the first stored link: they must end at a
            // signed checkpoint, which the first link follows.
            let first = store.audit_chain_first().await?.unwrap_or(head.chain_seq + 1);
            let anchor = match first {
                1 => ChainHead::genesis(),
                _ => match checkpoints.iter().find(|c| c.chain_seq == first - 1) {
                    Some(c) => ChainHead { chain_seq: c.chain_seq, hash: c.hash.clone() },
                    None => ChainHead::genesis(),
                },
            };
            walked_to = anchor.chain_seq;
            walk = Walk::new(anchor, signed());
        }
    }
    walk_stored(store, &mut walk, walked_to, &head).await?;
    Ok(walk.finish(&head, unsealed))
}

/// Links after `after` up to the head read at the start (sealing goes on meanwhile: what it adds
/// later is the next walk's).
async fn walk_stored(store: &dyn Store, walk: &mut Walk, mut after: i64, head: &ChainHead) -> Result<(), StoreError> {
    while !walk.broken() && after < head.chain_seq {
        let page = store.audit_chain_links(after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.chain_seq;
        for link in page.iter().filter(|l| l.chain_seq <= head.chain_seq) {
            walk.push(link);
        }
    }
    Ok(())
}

/// The audit archive files (`audit_archive`) in `dir`, in chain order.
pub fn files(dir: &Path) -> std::io::Result<Vec<PathBuf>> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with("audit-") && n.ends_with(".jsonl"))
        })
        .collect();
    files.sort();
    Ok(files)
}

/// The records an archive file holds, with their chain links, in order.
pub fn read_chained(path: &Path) -> std::io::Result<Vec<ChainedRecord>> {
    let text = std::fs::read_to_string(path)?;
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).map_err(std::io::Error::other))
        .collect()
}

fn archive_error(path: &Path, source: std::io::Error) -> VerifyError {
    VerifyError::Archive { path: path.display().to_string(), source }
}
