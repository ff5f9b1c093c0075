//! Sealing the audit trail onto its hash chain, signing checkpoints, and walking it
//! (`paygate audit verify`, `GET /operator/v1/audit/verify`). The chain's rules are in
//! `domain::audit_chain`; the stores seal (`AuditStore::audit_seal`) and read links.
//!
//! Records are sealed after they commit, by the `seal_audit` job (every `audit.seal_every_secs`,
//! one replica at a time) and once more at a graceful stop: writers pay nothing for the chain but a
//! column default on PostgreSQL. Links are keyed with the link key (a subkey of the idempotency
//! secret, which the database never holds). Every run that moved the head signs it with the mandate
//! keys; the checkpoint is stored, logged and sent as the `audit.checkpoint` webhook event, so a
//! witness outside the database holds the newest one and `paygate audit verify --expect` names a
//! rollback against it.

use std::path::{Path, PathBuf};

use crate::clock::UnixSecs;
use crate::domain::audit_chain::{
    Break, CHECKPOINT_ISSUER, COPIED, ChainHead, ChainLink, ChainedRecord, Checkpoint, CheckpointClaims,
    CheckpointSigner, LinkKey, Rules, Verdict, Walk, tag_fault, tag_nonce,
};
use crate::domain::error::StoreError;
use crate::domain::webhook::Notice;
use crate::store::Store;

/// Sealing batches in one run at most (the next run goes on).
pub const SEAL_BATCHES_PER_RUN_MAX: u32 = 50;
/// Links and checkpoints read per page while walking.
const PAGE: u32 = 1000;

/// What sealing needs: the link key, the checkpoint signer, and who hears of each checkpoint
/// (the endpoints subscribed to `audit.checkpoint`; none: no message).
pub struct Sealer<'a> {
    pub links: &'a LinkKey,
    pub signer: &'a dyn CheckpointSigner,
    pub notice: Notice,
    /// Checkpoints kept in the store: the newest, and at most one per this many seconds before it
    /// (retention markers always; 0 keeps every one). Each is logged and sent either way.
    pub keep_every_secs: i64,
    /// A chain is begun (sealed from position 1) only over records younger than this: a store's
    /// first records are sealed within the sealing interval, so older records before an empty
    /// chain are a chain deleted (`audit.seal_every_secs + audit.unsealed_slack_secs`).
    pub genesis_within_secs: i64,
}

/// What one sealing run did.
#[derive(Debug, Clone, PartialEq)]
pub struct SealRun {
    pub sealed: u64,
    /// The head as the run found it (what a replica holds against the heads it saw before).
    pub found: ChainHead,
    pub head: ChainHead,
    pub checkpoint: Option<Checkpoint>,
}

/// Seal what has committed (batches of `batch`), then sign the head whenever it is past the newest
/// checkpoint: nothing sealed stays outside a signed checkpoint longer than one run (a run that
/// crashed between the two is signed by the next).
pub async fn seal(store: &dyn Store, s: &Sealer<'_>, now: UnixSecs, batch: u32) -> Result<SealRun, StoreError> {
    let mut sealed = 0;
    let mut head = store.audit_chain_head().await?;
    let found = head.clone();
    // The twelfth review: the chain tables emptied on a stopped store (records deleted, the rest
    // left tagged) and the next start sealed what was left from position 1 as genuine. A store's
    // first records are sealed within the sealing interval; older ones before an empty chain had
    // their links deleted: never sealed again (verify names them as unsealed).
    if head.chain_seq == 0
        && let Some((seq, at)) = chain_deleted(store, now, s.genesis_within_secs).await?
    {
        tracing::error!(
            audit.seq = seq,
            audit.at = at,
            "the audit chain is empty but records older than the sealing interval are not sealed: the chain was \
             deleted in the database; it is not begun again (audit verify names the records)"
        );
        return Err(StoreError::Database(format!(
            "the audit chain is empty, yet record seq {seq} (made at {at}) is older than the sealing interval: the \
             chain was deleted; it is not begun again"
        )));
    }
    for _ in 0..SEAL_BATCHES_PER_RUN_MAX {
        let (n, h) = store.audit_seal(s.links, batch).await?;
        (sealed, head) = (sealed + n, h);
        if n < u64::from(batch) {
            break;
        }
    }
    let latest = store.audit_checkpoint_latest().await?;
    let due = head.chain_seq > 0 && latest.as_ref().is_none_or(|c| head.chain_seq > c.chain_seq);
    let checkpoint = match due {
        true => Some(checkpoint_at(store, s, &head, now, false).await?),
        false => None,
    };
    if let (Some(_), Some(prev)) = (&checkpoint, &latest) {
        thin(store, s, prev).await?;
    }
    Ok(SealRun { sealed, found, head, checkpoint })
}

/// A newer checkpoint is stored: the previous newest is dropped when the one before it is less
/// than `keep_every_secs` older (it only ever stood for the head of its moment; the keyed links and
/// the newer checkpoint cover it). A retention marker, or one whose signature does not verify, is
/// never dropped.
async fn thin(store: &dyn Store, s: &Sealer<'_>, prev: &Checkpoint) -> Result<(), StoreError> {
    if s.keep_every_secs <= 0 || s.signer.verify_checkpoint(&prev.jws).map_or(true, |c| c.retention) {
        return Ok(());
    }
    match store.audit_checkpoint_before(prev.chain_seq).await? {
        Some(kept) if prev.at - kept.at < s.keep_every_secs => store.audit_checkpoint_drop(prev.chain_seq).await,
        _ => Ok(()),
    }
}

/// Sign that the chain up to `at.chain_seq` hashes to `at.hash`, store it with its webhook
/// messages, and log it. `retention`: the range up to it is archived and may leave the database
/// (the marker replaces a plain checkpoint at the same position and hash).
pub async fn checkpoint_at(
    store: &dyn Store,
    s: &Sealer<'_>,
    at: &ChainHead,
    now: UnixSecs,
    retention: bool,
) -> Result<Checkpoint, StoreError> {
    let claims = CheckpointClaims {
        iss: CHECKPOINT_ISSUER.to_string(),
        chain_seq: at.chain_seq,
        hash: at.hash.clone(),
        iat: now,
        retention,
    };
    let jws = s.signer.sign_checkpoint(&claims).map_err(StoreError::Database)?;
    let cp = Checkpoint { chain_seq: at.chain_seq, hash: at.hash.clone(), at: now, jws };
    let messages = Notice { at: now, ..s.notice.clone() }.messages(checkpoint_data(&cp, retention));
    store.audit_checkpoint_put(cp.clone(), retention, messages).await?;
    tracing::info!(audit.chain_seq = cp.chain_seq, audit.hash = %cp.hash, audit.retention = retention, "audit checkpoint signed");
    Ok(cp)
}

/// A checkpoint as the `audit.checkpoint` event's payload: what a witness keeps and later gives
/// `paygate audit verify --expect` (the file holding it, or `chain_seq:hash`).
pub fn checkpoint_data(cp: &Checkpoint, retention: bool) -> serde_json::Value {
    let kid = jsonwebtoken::decode_header(&cp.jws).ok().and_then(|h| h.kid);
    serde_json::json!({
        "chain_seq": cp.chain_seq,
        "hash": cp.hash,
        "at": crate::clock::rfc3339(cp.at),
        "kid": kid,
        "jws": cp.jws,
        "retention": retention,
    })
}

/// An externally kept head, read from a witness's file: a checkpoint as the `audit.checkpoint`
/// event carries it (the whole event body, or its `data`), or as stored (`chain_seq`, `hash`,
/// `jws`). Its signature must verify under `signer` and name the same position and hash.
pub fn expected_from_json(text: &str, signer: &dyn CheckpointSigner) -> Result<ChainHead, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let cp = if v.get("data").is_some_and(|d| d.get("jws").is_some()) { &v["data"] } else { &v };
    let (Some(chain_seq), Some(hash), Some(jws)) = (cp["chain_seq"].as_i64(), cp["hash"].as_str(), cp["jws"].as_str())
    else {
        return Err("no checkpoint (chain_seq, hash, jws) in it".into());
    };
    let claims = signer.verify_checkpoint(jws).map_err(|e| format!("its signature does not verify: {e}"))?;
    if claims.chain_seq != chain_seq || claims.hash != hash {
        return Err("its signed claims differ from its position or hash".into());
    }
    Ok(ChainHead { chain_seq, hash: hash.to_string() })
}

/// Why a walk could not run at all (as opposed to a chain that does not hold).
#[derive(Debug, thiserror::Error)]
pub enum VerifyError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("reading the audit archive {path}: {source}")]
    Archive { path: String, source: std::io::Error },
}

/// What a walk holds the chain to, beyond its links and checkpoints.
#[derive(Debug, Clone)]
pub struct VerifyOptions {
    pub now: UnixSecs,
    /// Records older than this must be sealed, and links older than this signed
    /// (`audit.seal_every_secs + audit.unsealed_slack_secs`).
    pub stale_after_secs: i64,
    /// A head kept outside the database (`--expect`): missing or different is a rollback.
    pub expect: Option<ChainHead>,
}

/// Walk the whole chain: the archive files in `archive_dir` first (when given), then the stored
/// links, checking every link and every signed checkpoint; the verdict names the first break.
pub async fn verify(
    store: &dyn Store,
    signer: &dyn CheckpointSigner,
    links: &LinkKey,
    archive_dir: Option<&Path>,
    opts: &VerifyOptions,
) -> Result<Verdict, VerifyError> {
    // Every checkpoint's signature first: a forged one is itself a break.
    let mut checkpoints = Vec::new();
    let mut markers = Vec::new();
    let mut forged = None;
    let mut after = 0;
    loop {
        let page = store.audit_checkpoints(after, PAGE).await?;
        let Some(last) = page.last() else { break };
        after = last.chain_seq;
        for cp in page {
            match signer.verify_checkpoint(&cp.jws) {
                Ok(c) if c.chain_seq == cp.chain_seq && c.hash == cp.hash => {
                    if c.retention {
                        markers.push(cp.chain_seq);
                    }
                    checkpoints.push(cp)
                }
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
    let rules = Rules { stale_before: Some(opts.now - opts.stale_after_secs), expect: opts.expect.clone() };
    if let Some((chain_seq, why)) = forged {
        let mut walk = Walk::new(ChainHead::genesis(), signed(), links.clone(), rules);
        let v = walk_stored(store, &mut walk, 0, &head).await.map(|()| walk.finish(&head, unsealed))?;
        let first_break =
            Break { chain_seq, seq: None, reason: format!("the checkpoint at position {chain_seq}: {why}") };
        return Ok(Verdict { ok: false, first_break: Some(first_break), ..v });
    }

    let mut walk;
    let mut walked_to = 0;
    match archive_dir {
        Some(dir) => {
            walk = Walk::new(ChainHead::genesis(), signed(), links.clone(), rules);
            for file in files(dir).map_err(|source| archive_error(dir, source))? {
                for rec in read_chained(&file).map_err(|source| archive_error(&file, source))? {
                    walked_to = rec.chain_seq;
                    walk.push(&ChainLink::from(rec));
                }
            }
        }
        None => {
            // Retention removed positions before the first stored link: they must end at a
            // signed retention marker, which the first link follows. Anything else (a plain
            // checkpoint there, or none) is a prefix deleted: the walk starts at the genesis and
            // names the missing positions.
            let first = store.audit_chain_first().await?.unwrap_or(head.chain_seq + 1);
            let anchor = match first {
                1 => ChainHead::genesis(),
                _ => match checkpoints.iter().find(|c| c.chain_seq == first - 1 && markers.contains(&c.chain_seq)) {
                    Some(c) => ChainHead { chain_seq: c.chain_seq, hash: c.hash.clone() },
                    None => ChainHead::genesis(),
                },
            };
            walked_to = anchor.chain_seq;
            walk = Walk::new(anchor, signed(), links.clone(), rules);
        }
    }
    walk_stored(store, &mut walk, walked_to, &head).await?;
    let tagged = walk.tagged_seen();
    let nonces = walk.take_nonces();
    let verdict = walk.finish(&head, unsealed);
    // Records not yet sealed have no link to hold them, but each carries its writer's tag: an
    // edit made before sealing (a trigger rewriting rows as they are written) is named here.
    if verdict.ok
        && let Some((seq, fault)) = unsealed_tag_fault(store, links, tagged, nonces).await?
    {
        let reason = format!("the unsealed record seq {seq}: {fault}");
        let first_break = Break { chain_seq: verdict.to_chain_seq + 1, seq: Some(seq), reason };
        return Ok(Verdict { ok: false, first_break: Some(first_break), ..verdict });
    }
    // Money the trail does not know about: every payment writes its audit record as it is made,
    // so a payment newer than everything the trail holds (records and checkpoints), by more than
    // the sealing allowance, means the trail was emptied or rolled back past it — caught here
    // even without a witness's head.
    if verdict.ok
        && let (Some(paid), newest) = store.audit_freshness().await?
        && newest.is_none_or(|audited| paid > audited + opts.stale_after_secs)
    {
        let reason = match newest {
            Some(at) => format!(
                "a payment made at {} is newer than everything the audit trail holds (its newest at {}): the trail was truncated or rolled back",
                crate::clock::rfc3339(paid),
                crate::clock::rfc3339(at)
            ),
            None => format!(
                "the audit trail is empty, yet payments were made (the newest at {}): the trail was emptied",
                crate::clock::rfc3339(paid)
            ),
        };
        let first_break = Break { chain_seq: verdict.to_chain_seq + 1, seq: None, reason };
        return Ok(Verdict { ok: false, first_break: Some(first_break), ..verdict });
    }
    // A replica saw a record it wrote deleted or changed before it was sealed (`audit_witness`):
    // the trail is known to have lost it, whatever the links say now.
    if verdict.ok
        && let Some((seq, detail)) = store.audit_first_of_tool(crate::domain::audit_chain::WITNESS_TOOL).await?
    {
        let reason = format!(
            "the gateway witnessed tampering before sealing (record seq {seq}): {}",
            detail.unwrap_or_default()
        );
        let first_break = Break { chain_seq: verdict.to_chain_seq + 1, seq: Some(seq), reason };
        return Ok(Verdict { ok: false, first_break: Some(first_break), ..verdict });
    }
    // A payment whose record is gone: removed before it was sealed (a database writer deleting
    // records as they are written), which no link can show.
    if verdict.ok
        && let Some((id, at)) = store.unaudited_payment(!markers.is_empty(), opts.now + 1).await?
    {
        let reason = format!(
            "payment {id} (made at {}) has no audit record: a record was removed before it was sealed",
            crate::clock::rfc3339(at)
        );
        let first_break = Break { chain_seq: verdict.to_chain_seq + 1, seq: None, reason };
        return Ok(Verdict { ok: false, first_break: Some(first_break), ..verdict });
    }
    // A payment deleted after it was decided (with its postings, balances put back): its record
    // names a payment the store no longer holds.
    if verdict.ok
        && let Some((seq, id)) = store.vanished_payment(!markers.is_empty(), opts.now + 1).await?
    {
        let reason =
            format!("the allowed record seq {seq} names payment {id}, which the store no longer holds: deleted");
        let first_break = Break { chain_seq: verdict.to_chain_seq + 1, seq: Some(seq), reason };
        return Ok(Verdict { ok: false, first_break: Some(first_break), ..verdict });
    }
    // A payment rewritten after it was decided (amount, accounts, principal, mandate), or one that
    // borrowed another operation's record: the record's intent says what was decided.
    if verdict.ok
        && let Some((seq, reason)) = payment_contradiction(store, !markers.is_empty(), opts.now + 1).await?
    {
        let first_break = Break { chain_seq: verdict.to_chain_seq + 1, seq: Some(seq), reason };
        return Ok(Verdict { ok: false, first_break: Some(first_break), ..verdict });
    }
    // Policy rolled back: the trail records a version applied that the store no longer holds.
    if verdict.ok
        && let Some(named) = store.audit_policy_version_max().await?
        && let head = store.policy_head().await?
        && named > head
    {
        let reason = format!(
            "the trail names policy version {named}, the store's newest is {head}: policy versions were deleted \
             (rolled back)"
        );
        let first_break = Break { chain_seq: verdict.to_chain_seq + 1, seq: None, reason };
        return Ok(Verdict { ok: false, first_break: Some(first_break), ..verdict });
    }
    Ok(verdict)
}

/// The first ledger payment that is not what its "allowed" record decided
/// (`domain::trail_money::contradiction`): the record's seq and why.
async fn payment_contradiction(
    store: &dyn Store,
    retained: bool,
    before: i64,
) -> Result<Option<(i64, String)>, StoreError> {
    let Some(since) = store.trail_payments_since(retained).await? else { return Ok(None) };
    let mut after = (i64::MIN, String::new(), i64::MIN);
    loop {
        let page = store.payment_decisions(since, before, after.clone(), PAGE).await?;
        let Some((last, _, _)) = page.last() else { return Ok(None) };
        after = last.clone();
        for ((_, _, seq), payment, decided) in &page {
            if let Some(why) = crate::domain::trail_money::contradiction(payment, decided) {
                return Ok(Some((*seq, why)));
            }
        }
    }
}

/// The oldest unsealed record (seq, made at) when the chain is empty yet that record is older than
/// `within` seconds at `now`: a store's first records are sealed within the sealing interval, so
/// this is a chain deleted in the database. The sealer never begins a chain over it, and `serve`
/// refuses the store (`Gateway::audit_chain_deleted`).
pub async fn chain_deleted(store: &dyn Store, now: UnixSecs, within: i64) -> Result<Option<(i64, i64)>, StoreError> {
    if store.audit_chain_head().await?.chain_seq != 0 {
        return Ok(None);
    }
    Ok(store.audit_unsealed().await?.oldest.filter(|(_, at)| *at < now - within))
}

/// The first record not yet sealed that carries no tag: the sealer never seals one, so on a store
/// adopted as "from before tags" it is a tag stripped (with the chain deleted), not an old record.
pub async fn first_untagged_unsealed(store: &dyn Store) -> Result<Option<i64>, StoreError> {
    let mut after = 0;
    loop {
        let page = store.audit_unsealed_records(after, PAGE).await?;
        let Some(last) = page.last() else { return Ok(None) };
        after = last.seq;
        if let Some(r) = page.iter().find(|r| r.tag.is_none()) {
            return Ok(Some(r.seq));
        }
    }
}

/// The first record not yet sealed whose writer's tag does not hold (`tagged`: a sealed record
/// carried a tag, so every later one must).
async fn unsealed_tag_fault(
    store: &dyn Store,
    links: &LinkKey,
    mut tagged: bool,
    mut nonces: std::collections::HashSet<u64>,
) -> Result<Option<(i64, &'static str)>, StoreError> {
    let mut after = 0;
    loop {
        let page = store.audit_unsealed_records(after, PAGE).await?;
        let Some(last) = page.last() else { return Ok(None) };
        after = last.seq;
        for r in &page {
            if let Some(fault) = tag_fault(links, r, tagged) {
                return Ok(Some((r.seq, fault)));
            }
            if let Some(nonce) = r.tag.as_deref().and_then(tag_nonce)
                && !nonces.insert(nonce)
            {
                return Ok(Some((r.seq, COPIED)));
            }
            tagged |= r.tag.is_some();
        }
    }
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
