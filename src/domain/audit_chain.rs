//! The audit trail's hash chain: what makes it tamper-evident. Every sealed audit record has a
//! position on the chain (`chain_seq`, dense from 1), the previous link's hash and its own:
//! `hash = SHA-256("paygate-audit-v1\n" ‖ prev_hash ‖ "\n" ‖ canonical bytes)`, where the canonical
//! bytes are a JSON array of the position, the record's seq and every field of the record. A
//! periodic checkpoint signs a position's hash (Ed25519, the mandate keys), so a rewrite of the
//! chain itself — every hash recomputed — is caught at the next checkpoint, and records deleted off
//! the end are caught by the newest one.
//!
//! Pure: the walk (`Walk`) takes links in chain order and reports the first break.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::audit::AuditRecord;
use crate::clock::UnixSecs;

/// The hash before the first link.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// The issuer claim of a signed checkpoint.
pub const CHECKPOINT_ISSUER: &str = "paygate";
/// The JWS `typ` of a signed checkpoint.
pub const CHECKPOINT_TYP: &str = "paygate-audit-checkpoint+jwt";

/// The chain's newest sealed link (position 0 and [`GENESIS`] when nothing is sealed).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChainHead {
    pub chain_seq: i64,
    pub hash: String,
}

impl ChainHead {
    pub fn genesis() -> Self {
        ChainHead { chain_seq: 0, hash: GENESIS.to_string() }
    }
}

/// One link as stored: its record is `None` when the record row is gone (deleted).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainLink {
    pub chain_seq: i64,
    pub seq: i64,
    pub prev_hash: String,
    pub hash: String,
    pub record: Option<AuditRecord>,
}

/// An archived record: the record with its link (one JSON Lines row of an archive file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChainedRecord {
    #[serde(flatten)]
    pub record: AuditRecord,
    pub chain_seq: i64,
    pub prev_hash: String,
    pub hash: String,
}

impl From<ChainedRecord> for ChainLink {
    fn from(c: ChainedRecord) -> Self {
        ChainLink {
            chain_seq: c.chain_seq,
            seq: c.record.seq,
            prev_hash: c.prev_hash,
            hash: c.hash,
            record: Some(c.record),
        }
    }
}

/// A signed statement that the chain up to `chain_seq` hashes to `hash`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    pub chain_seq: i64,
    pub hash: String,
    pub at: UnixSecs,
    /// Compact JWS over [`CheckpointClaims`].
    pub jws: String,
}

/// What a checkpoint signs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointClaims {
    pub iss: String,
    pub chain_seq: i64,
    pub hash: String,
    pub iat: UnixSecs,
}

/// Signs and verifies checkpoints (the gateway's mandate keys).
pub trait CheckpointSigner: Send + Sync {
    fn sign_checkpoint(&self, claims: &CheckpointClaims) -> Result<String, String>;
    /// The claims of a checkpoint this signer (or its earlier keys) signed; why not otherwise.
    fn verify_checkpoint(&self, jws: &str) -> Result<CheckpointClaims, String>;
}

/// The link hash of `record` at `chain_seq` after `prev`. A record that names its policy version
/// or its intent hashes under "paygate-audit-v2" with both appended; one naming neither (operators'
/// records, and every record written before policies were versioned) under "paygate-audit-v1" as
/// it always did, so older chains verify unchanged. Clearing either field changes the hash.
pub fn link_hash(prev: &str, chain_seq: i64, r: &AuditRecord) -> String {
    let mut canonical = serde_json::json!([
        chain_seq,
        r.seq,
        r.at,
        r.correlation_id,
        r.principal_iss,
        r.principal_sub,
        r.principal_user,
        r.tool,
        r.decision,
        r.code,
        r.idempotency_key,
        r.payment_id,
        r.approval_id,
        r.detail,
        r.repeats,
    ]);
    let v2 = r.policy_version.is_some() || r.intent.is_some();
    if v2 && let Some(fields) = canonical.as_array_mut() {
        fields.push(serde_json::json!(r.policy_version));
        fields.push(serde_json::json!(r.intent));
    }
    let mut h = Sha256::new();
    h.update(if v2 { b"paygate-audit-v2\n" } else { b"paygate-audit-v1\n" });
    h.update(prev.as_bytes());
    h.update(b"\n");
    h.update(canonical.to_string().as_bytes());
    super::ids::hex(&h.finalize())
}

/// Where and why the chain first breaks.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Break {
    /// The chain position of the first link that does not hold.
    pub chain_seq: i64,
    /// Its record's seq, when known.
    pub seq: Option<i64>,
    pub reason: String,
}

/// What a walk of the chain found.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Verdict {
    pub ok: bool,
    /// Links checked.
    pub checked: u64,
    /// The first position walked (after the newest checkpointed range retention removed).
    pub from_chain_seq: i64,
    /// The last position walked.
    pub to_chain_seq: i64,
    /// Signed checkpoints whose position was walked and matched.
    pub checkpoints_matched: u64,
    /// Records not yet sealed onto the chain (newer than the last sealing run).
    pub unsealed: i64,
    pub first_break: Option<Break>,
}

/// A walk over links in chain order. Start it at the chain's genesis, or where retention left it:
/// right after a checkpoint (the first link must follow that checkpoint's hash).
pub struct Walk {
    next: i64,
    prev: String,
    checked: u64,
    from: i64,
    checkpoints: std::collections::BTreeMap<i64, String>,
    matched: u64,
    first_break: Option<Break>,
}

impl Walk {
    /// `checkpoints`: (position, hash) of every signed checkpoint (signatures already verified).
    pub fn new(after: ChainHead, checkpoints: impl IntoIterator<Item = (i64, String)>) -> Self {
        Walk {
            next: after.chain_seq + 1,
            prev: after.hash,
            checked: 0,
            from: after.chain_seq + 1,
            checkpoints: checkpoints.into_iter().collect(),
            matched: 0,
            first_break: None,
        }
    }

    pub fn broken(&self) -> bool {
        self.first_break.is_some()
    }

    fn fail(&mut self, chain_seq: i64, seq: Option<i64>, reason: String) {
        if self.first_break.is_none() {
            self.first_break = Some(Break { chain_seq, seq, reason });
        }
    }

    /// Check the next link. After a break nothing more is checked.
    pub fn push(&mut self, link: &ChainLink) {
        if self.broken() {
            return;
        }
        let at = link.chain_seq;
        if at < self.next {
            // Seen already (an archive overlapping the live records): it must be the same link.
            return self.fail(at, Some(link.seq), format!("position {at} appears twice, or out of order"));
        }
        if at > self.next {
            let missing = self.next;
            return self.fail(missing, None, format!("positions {missing}..{} are missing (deleted)", at - 1));
        }
        let Some(record) = &link.record else {
            return self.fail(at, Some(link.seq), format!("the record (seq {}) is missing (deleted)", link.seq));
        };
        if record.seq != link.seq {
            return self.fail(
                at,
                Some(record.seq),
                format!("the record's seq {} is not the link's {}", record.seq, link.seq),
            );
        }
        if link.prev_hash != self.prev {
            return self.fail(
                at,
                Some(link.seq),
                "its prev_hash is not the previous link's hash (reordered or rewritten)".into(),
            );
        }
        let computed = link_hash(&self.prev, at, record);
        if computed != link.hash {
            return self.fail(
                at,
                Some(link.seq),
                "its hash does not match its contents (the record was edited)".into(),
            );
        }
        if let Some(signed) = self.checkpoints.get(&at) {
            if *signed != link.hash {
                return self.fail(
                    at,
                    Some(link.seq),
                    "its hash differs from the signed checkpoint (the chain was rewritten)".into(),
                );
            }
            self.matched += 1;
        }
        self.prev = link.hash.clone();
        self.next += 1;
        self.checked += 1;
    }

    /// The verdict, given the store's recorded head and the count of unsealed records.
    pub fn finish(mut self, head: &ChainHead, unsealed: i64) -> Verdict {
        let last = self.next - 1;
        if !self.broken() {
            if let Some((&newest, _)) = self.checkpoints.range(last + 1..).next_back() {
                self.fail(
                    last + 1,
                    None,
                    format!("positions {}..={newest} are missing: a signed checkpoint covers them", last + 1),
                );
            } else if head.chain_seq != last || head.hash != self.prev {
                self.fail(
                    last + 1,
                    None,
                    format!("the recorded head is position {}, the chain ends at {last}", head.chain_seq),
                );
            }
        }
        Verdict {
            ok: self.first_break.is_none(),
            checked: self.checked,
            from_chain_seq: self.from,
            to_chain_seq: last,
            checkpoints_matched: self.matched,
            unsealed,
            first_break: self.first_break,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(seq: i64, detail: &str) -> AuditRecord {
        AuditRecord {
            seq,
            at: 1_000 + seq,
            correlation_id: format!("c{seq}"),
            principal_iss: "idp".into(),
            principal_sub: "agent".into(),
            principal_user: None,
            tool: "create_payment".into(),
            decision: "allowed".into(),
            code: None,
            idempotency_key: None,
            payment_id: None,
            approval_id: None,
            detail: Some(detail.into()),
            repeats: 1,
            policy_version: None,
            intent: None,
        }
    }

    fn chain(n: i64) -> Vec<ChainLink> {
        let mut prev = GENESIS.to_string();
        (1..=n)
            .map(|i| {
                let r = rec(i * 10, "x");
                let hash = link_hash(&prev, i, &r);
                let link = ChainLink {
                    chain_seq: i,
                    seq: r.seq,
                    prev_hash: prev.clone(),
                    hash: hash.clone(),
                    record: Some(r),
                };
                prev = hash;
                link
            })
            .collect()
    }

    fn walk(links: &[ChainLink], checkpoints: &[(i64, String)]) -> Verdict {
        let mut w = Walk::new(ChainHead::genesis(), checkpoints.iter().cloned());
        for l in links {
            w.push(l);
        }
        let head =
            links.last().map_or(ChainHead::genesis(), |l| ChainHead { chain_seq: l.chain_seq, hash: l.hash.clone() });
        w.finish(&head, 0)
    }

    /// A record naming neither a policy version nor an intent hashes as v1 always did (older chains
    /// and archives verify unchanged); one naming either hashes as v2 with both, so clearing,
    /// changing or adding either is a break.
    #[test]
    fn the_policy_version_and_intent_are_part_of_the_link_and_v1_records_hash_as_before() {
        let plain = rec(10, "x");
        // v1 by construction: the fixed field array under the v1 domain tag.
        let mut h = Sha256::new();
        h.update(b"paygate-audit-v1\n");
        h.update(GENESIS.as_bytes());
        h.update(b"\n");
        h.update(
            serde_json::json!([
                1,
                10,
                1_010,
                "c10",
                "idp",
                "agent",
                null,
                "create_payment",
                "allowed",
                null,
                null,
                null,
                null,
                "x",
                1
            ])
            .to_string()
            .as_bytes(),
        );
        assert_eq!(link_hash(GENESIS, 1, &plain), super::super::ids::hex(&h.finalize()));
        let with = |version: Option<i64>, intent: Option<&str>| {
            let mut r = plain.clone();
            r.policy_version = version;
            r.intent = intent.map(str::to_string);
            link_hash(GENESIS, 1, &r)
        };
        let hashes = [
            with(None, None),
            with(Some(1), None),
            with(Some(2), None),
            with(None, Some("{}")),
            with(Some(1), Some("{}")),
            with(Some(1), Some("{\"tool\":\"x\"}")),
        ];
        let distinct: std::collections::BTreeSet<&String> = hashes.iter().collect();
        assert_eq!(distinct.len(), hashes.len(), "{hashes:?}");
        // And a v2 record is hashed under the v2 tag with both fields appended.
        let mut h = Sha256::new();
        h.update(b"paygate-audit-v2\n");
        h.update(GENESIS.as_bytes());
        h.update(b"\n");
        h.update(
            serde_json::json!([
                1,
                10,
                1_010,
                "c10",
                "idp",
                "agent",
                null,
                "create_payment",
                "allowed",
                null,
                null,
                null,
                null,
                "x",
                1,
                7,
                null
            ])
            .to_string()
            .as_bytes(),
        );
        assert_eq!(with(Some(7), None), super::super::ids::hex(&h.finalize()));
        // A chain mixing both verifies; clearing a v2 record's version breaks it there.
        let mut links = chain(3);
        let mut prev = links[0].hash.clone();
        for (i, link) in links.iter_mut().enumerate().skip(1) {
            let r = link.record.as_mut().unwrap();
            r.policy_version = Some(3);
            link.prev_hash = prev.clone();
            link.hash = link_hash(&prev, i as i64 + 1, r);
            prev = link.hash.clone();
        }
        assert!(walk(&links, &[]).ok);
        links[2].record.as_mut().unwrap().policy_version = None;
        assert_eq!(walk(&links, &[]).first_break.unwrap().chain_seq, 3);
    }

    #[test]
    fn an_intact_chain_verifies_and_any_change_names_the_first_break() {
        let links = chain(5);
        let cp = vec![(3, links[2].hash.clone())];
        let v = walk(&links, &cp);
        assert!(v.ok, "{v:?}");
        assert_eq!((v.checked, v.checkpoints_matched, v.to_chain_seq), (5, 1, 5));

        let mut edited = links.clone();
        edited[1].record.as_mut().unwrap().detail = Some("y".into());
        assert_eq!(walk(&edited, &cp).first_break.unwrap().chain_seq, 2);
        // The verifier stops reading at the first break (`audit_chain::verify` loops while not
        // broken): the walk says so from that link on.
        let mut w = Walk::new(ChainHead::genesis(), cp.iter().cloned());
        w.push(&edited[0]);
        assert!(!w.broken());
        w.push(&edited[1]);
        assert!(w.broken());

        let mut gone = links.clone();
        gone[2].record = None;
        let b = walk(&gone, &cp).first_break.unwrap();
        assert_eq!((b.chain_seq, b.seq), (3, Some(30)));

        let mut skipped = links.clone();
        skipped.remove(3);
        assert_eq!(walk(&skipped, &cp).first_break.unwrap().chain_seq, 4);

        let mut swapped = links.clone();
        swapped.swap(1, 2);
        assert_eq!(walk(&swapped, &cp).first_break.unwrap().chain_seq, 2);

        // Swapping two records' contents under their links.
        let mut contents = links.clone();
        let (a, b) = (contents[1].record.clone(), contents[2].record.clone());
        contents[1].record = b;
        contents[2].record = a;
        assert_eq!(walk(&contents, &cp).first_break.unwrap().chain_seq, 2);
    }

    #[test]
    fn a_rewritten_chain_is_caught_by_its_checkpoint_and_a_cut_tail_by_the_newest() {
        let links = chain(5);
        let cp = vec![(4, links[3].hash.clone())];
        // Record 2 edited and every later hash recomputed: each link holds, the checkpoint does not.
        let mut rewritten = links.clone();
        rewritten[1].record.as_mut().unwrap().detail = Some("y".into());
        let mut prev = rewritten[0].hash.clone();
        for l in rewritten.iter_mut().skip(1) {
            l.prev_hash = prev.clone();
            l.hash = link_hash(&prev, l.chain_seq, l.record.as_ref().unwrap());
            prev = l.hash.clone();
        }
        assert_eq!(walk(&rewritten, &cp).first_break.unwrap().chain_seq, 4);
        // The last three links deleted: the checkpoint at 4 says they existed.
        let b = walk(&links[..2], &cp).first_break.unwrap();
        assert_eq!(b.chain_seq, 3, "{b:?}");
    }

    /// The store's recorded head must be where the chain ends, hash and all: a head moved back
    /// (the newest links cut) or rewritten breaks just past the chain's end.
    #[test]
    fn the_recorded_head_must_be_the_chains_end() {
        let links = chain(5);
        // The newest link checkpointed and present: intact.
        let v = walk(&links, &[(5, links[4].hash.clone())]);
        assert!(v.ok, "{v:?}");
        let ends = |head: ChainHead, links: &[ChainLink]| {
            let mut w = Walk::new(ChainHead::genesis(), []);
            for l in links {
                w.push(l);
            }
            w.finish(&head, 0)
        };
        let head = ChainHead { chain_seq: 5, hash: links[4].hash.clone() };
        assert!(ends(head.clone(), &links).ok);
        let rewritten = ends(ChainHead { chain_seq: 5, hash: links[3].hash.clone() }, &links);
        let b = rewritten.first_break.unwrap();
        assert_eq!((b.chain_seq, b.seq), (6, None), "{}", b.reason);
        let longer = ends(ChainHead { chain_seq: 6, hash: links[4].hash.clone() }, &links);
        assert_eq!(longer.first_break.unwrap().chain_seq, 6);
        // Nothing sealed: the head is the genesis, exactly.
        assert!(ends(ChainHead::genesis(), &[]).ok);
        assert_eq!(ends(ChainHead { chain_seq: 0, hash: "x".into() }, &[]).first_break.unwrap().chain_seq, 1);
    }

    #[test]
    fn a_walk_can_start_after_a_checkpointed_range_left_for_the_archive() {
        let links = chain(6);
        let anchor = ChainHead { chain_seq: 3, hash: links[2].hash.clone() };
        let mut w = Walk::new(anchor.clone(), [(3, links[2].hash.clone())]);
        for l in &links[3..] {
            w.push(l);
        }
        let head = ChainHead { chain_seq: 6, hash: links[5].hash.clone() };
        let v = w.finish(&head, 2);
        assert!(v.ok, "{v:?}");
        assert_eq!((v.from_chain_seq, v.checked, v.unsealed), (4, 3, 2));
        // Starting from the wrong anchor breaks at once.
        let mut w = Walk::new(ChainHead { chain_seq: 3, hash: GENESIS.into() }, []);
        w.push(&links[3]);
        assert_eq!(w.finish(&head, 0).first_break.unwrap().chain_seq, 4);
    }
}
