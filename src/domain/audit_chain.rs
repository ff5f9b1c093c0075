//! The audit trail's hash chain: what makes it tamper-evident. Every sealed audit record has a
//! position on the chain (`chain_seq`, dense from 1), the previous link's hash and its own. Links
//! are **keyed** (v3): `hash = HMAC-SHA256(link key, "paygate-audit-v3\n" ‖ prev_hash ‖ "\n" ‖
//! canonical bytes)`, the key a subkey of the idempotency secret, which the gateway holds from its
//! environment or key file and the database never does: someone who can write the database can
//! delete links but cannot make one. Links sealed before keys existed (v1/v2, unkeyed SHA-256)
//! verify as they did up to the first keyed link; an unkeyed link after a keyed one is a break (no
//! downgrade). Every sealing run that sealed anything signs the head (Ed25519, the mandate keys),
//! so nothing sealed stays outside a signed checkpoint for longer than a run; retention's signed
//! marker is the only way the chain may start past position 1; and a head kept outside the
//! database (a witness fed by the `audit.checkpoint` webhook) names a rollback.
//!
//! Pure: the walk (`Walk`) takes links in chain order and reports the first break.

use hmac::{Hmac, Mac};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::audit::AuditRecord;
use crate::clock::UnixSecs;

/// The hash before the first link.
pub const GENESIS: &str = "0000000000000000000000000000000000000000000000000000000000000000";
/// The issuer claim of a signed checkpoint.
pub const CHECKPOINT_ISSUER: &str = "paygate";
/// The tool of the record a replica appends when a record it wrote was deleted or changed before
/// it was sealed (`gateway::audit_witness`): `audit verify` names the first one, for ever after.
pub const WITNESS_TOOL: &str = "audit.witness";
/// The JWS `typ` of a signed checkpoint.
pub const CHECKPOINT_TYP: &str = "paygate-audit-checkpoint+jwt";
/// The label of the link key, a subkey of the idempotency secret (`KeyDeriver::subkey`).
pub const LINK_KEY_LABEL: &str = "paygate audit chain link v3";

/// The key keyed links are made with. Never printed.
#[derive(Clone)]
pub struct LinkKey([u8; 32]);

impl LinkKey {
    pub fn new(key: [u8; 32]) -> Self {
        LinkKey(key)
    }
}

impl std::fmt::Debug for LinkKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("LinkKey(***)")
    }
}

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

    /// `POSITION:HASH` (what `paygate audit verify --expect` takes): a position ≥ 1 and a
    /// 64-digit lowercase hex hash.
    pub fn parse(text: &str) -> Option<Self> {
        let (pos, hash) = text.trim().split_once(':')?;
        let chain_seq: i64 = pos.parse().ok().filter(|p| *p >= 1 && pos.bytes().all(|b| b.is_ascii_digit()))?;
        let hex = hash.len() == 64 && hash.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        hex.then(|| ChainHead { chain_seq, hash: hash.to_string() })
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
    /// A retention marker: the positions up to `chain_seq` were archived and may be gone from the
    /// database (the only way a walk over the database may start past position 1).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub retention: bool,
}

/// Signs and verifies checkpoints (the gateway's mandate keys).
pub trait CheckpointSigner: Send + Sync {
    fn sign_checkpoint(&self, claims: &CheckpointClaims) -> Result<String, String>;
    /// The claims of a checkpoint this signer (or its earlier keys) signed; why not otherwise.
    fn verify_checkpoint(&self, jws: &str) -> Result<CheckpointClaims, String>;
}

/// The canonical bytes of `record` at `chain_seq`: a JSON array of the position, the seq and every
/// field; `with_policy` appends the policy version and the intent.
fn canonical(chain_seq: i64, r: &AuditRecord, with_policy: bool) -> String {
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
    if with_policy && let Some(fields) = canonical.as_array_mut() {
        fields.push(serde_json::json!(r.policy_version));
        fields.push(serde_json::json!(r.intent));
    }
    canonical.to_string()
}

/// The unkeyed link hash of links sealed before links were keyed (v1/v2): a record that names its
/// policy version or its intent hashes under "paygate-audit-v2" with both appended; one naming
/// neither under "paygate-audit-v1". Anyone can compute it: it only verifies links older than the
/// chain's first keyed link.
pub fn link_hash(prev: &str, chain_seq: i64, r: &AuditRecord) -> String {
    let v2 = r.policy_version.is_some() || r.intent.is_some();
    let mut h = Sha256::new();
    h.update(if v2 { b"paygate-audit-v2\n" } else { b"paygate-audit-v1\n" });
    h.update(prev.as_bytes());
    h.update(b"\n");
    h.update(canonical(chain_seq, r, v2).as_bytes());
    super::ids::hex(&h.finalize())
}

/// The keyed link hash (v3), what every sealing run writes: HMAC-SHA256 under the link key over
/// "paygate-audit-v3\n" ‖ prev ‖ "\n" ‖ the canonical bytes with the policy version and intent.
pub fn keyed_link_hash(key: &LinkKey, prev: &str, chain_seq: i64, r: &AuditRecord) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key.0)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    mac.update(b"paygate-audit-v3\n");
    mac.update(prev.as_bytes());
    mac.update(b"\n");
    mac.update(canonical(chain_seq, r, true).as_bytes());
    super::ids::hex(&mac.finalize().into_bytes())
}

/// The writer's tag of a record (v1): `NONCE.MAC`, NONCE 16 hex digits the writer drew for this
/// record alone, MAC HMAC-SHA256 under the link key over "paygate-audit-record-v1\n" ‖ NONCE ‖
/// "\n" ‖ every field but the `seq` (the database assigns it; the link binds it once sealed). The
/// `payment_id` is the writer's too: a posting's "allowed" record names the id its attempt drew
/// for the payment before the call (`Attempt::payment_id`), so a record moved to another payment
/// breaks its tag, and verify holds every ledger payment to an "allowed" record naming it under
/// its idempotency key. The gateway tags each record as it hands it to the store, so an edit of a
/// record not yet sealed is named too, nobody without the key can tag a forgery, and a copied
/// record shows as a repeated nonce.
pub fn record_tag(key: &LinkKey, r: &AuditRecord, nonce: &str) -> String {
    let fields = serde_json::json!([
        r.at,
        r.correlation_id,
        r.principal_iss,
        r.principal_sub,
        r.principal_user,
        r.tool,
        r.decision,
        r.code,
        r.idempotency_key,
        r.approval_id,
        r.detail,
        r.repeats,
        r.policy_version,
        r.intent,
        r.payment_id,
    ]);
    row_tag(key, "paygate-audit-record-v1\n", &fields, nonce)
}

/// The gateway's tag of a row it wrote outside the trail (a policy version): `NONCE.MAC` as
/// [`record_tag`], the MAC over `domain` ‖ NONCE ‖ "\n" ‖ `fields` (JSON). Nobody without the
/// link key can tag a row, so a row a database writer inserted or edited fails [`row_tag_holds`].
pub fn row_tag(key: &LinkKey, domain: &str, fields: &serde_json::Value, nonce: &str) -> String {
    let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key.0)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of any length"));
    mac.update(domain.as_bytes());
    mac.update(nonce.as_bytes());
    mac.update(b"\n");
    mac.update(fields.to_string().as_bytes());
    format!("{nonce}.{}", super::ids::hex(&mac.finalize().into_bytes()))
}

/// Whether `tag` is the gateway's [`row_tag`] of `fields` under `domain`.
pub fn row_tag_holds(key: &LinkKey, domain: &str, fields: &serde_json::Value, tag: &str) -> bool {
    tag_nonce(tag).is_some() && tag == row_tag(key, domain, fields, &tag[..16])
}

/// `record`, tagged by its writer (`record_tag`) under `nonce` (random, drawn by the writer).
pub fn tagged(key: &LinkKey, mut record: AuditRecord, nonce: [u8; 8]) -> AuditRecord {
    record.tag = Some(record_tag(key, &record, &super::ids::hex(&nonce)));
    record
}

/// Why a record whose tag's nonce was seen before breaks the trail.
pub const COPIED: &str = "a copy of an earlier record (its writer's tag repeats: inserted in the database)";

/// A tag's nonce, as a number (what a walk remembers to find a copied record).
pub fn tag_nonce(tag: &str) -> Option<u64> {
    let (nonce, _) = tag.split_once('.')?;
    (nonce.len() == 16).then(|| u64::from_str_radix(nonce, 16).ok()).flatten()
}

/// Why a record's tag does not hold, if it does not: `tagged_before` says an earlier record (in
/// chain or seq order) carried a tag, so an untagged one now is a tag removed, not an old record.
pub fn tag_fault(key: &LinkKey, r: &AuditRecord, tagged_before: bool) -> Option<&'static str> {
    match &r.tag {
        Some(tag) if tag_nonce(tag).is_some_and(|_| *tag == record_tag(key, r, &tag[..16])) => None,
        Some(_) => Some(
            "its contents are not what the gateway wrote (its writer's tag does not match: edited in the database)",
        ),
        None if tagged_before => Some("its writer's tag was removed (an untagged record after tagged ones)"),
        None => None,
    }
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
    /// The externally kept head (`--expect`), when given: "matched" (walked, same hash) or
    /// "archived" (before the walk's start, inside a range retention signed off).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub expected: Option<&'static str>,
    pub first_break: Option<Break>,
    /// A keyed link was walked: a gateway holding the link key sealed this store (and tagged it).
    #[serde(skip)]
    pub keyed: bool,
}

/// What the walk holds the chain to beyond its own links.
#[derive(Debug, Clone, Default)]
pub struct Rules {
    /// Records made before this instant must be sealed, and links whose record was made before it
    /// must be covered by a signed checkpoint (`None`: no age rule, e.g. a unit test).
    pub stale_before: Option<UnixSecs>,
    /// A head kept outside the database: this position must be on the chain with this hash.
    pub expect: Option<ChainHead>,
}

/// The oldest record not yet sealed, if any: how many, and the oldest's seq and time.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Unsealed {
    pub count: i64,
    pub oldest: Option<(i64, UnixSecs)>,
}

/// A walk over links in chain order. Start it at the chain's genesis, or where retention left it:
/// right after its signed marker (the first link must follow that marker's hash).
pub struct Walk {
    next: i64,
    prev: String,
    checked: u64,
    from: i64,
    checkpoints: std::collections::BTreeMap<i64, String>,
    matched: u64,
    key: LinkKey,
    /// A keyed link has been seen: every later link must be keyed.
    keyed: bool,
    /// A tagged record has been seen: every later record must be tagged.
    tagged: bool,
    /// The nonces of the tags walked: a repeated one is a copied record.
    nonces: std::collections::HashSet<u64>,
    rules: Rules,
    expected: Option<&'static str>,
    first_break: Option<Break>,
}

impl Walk {
    /// `checkpoints`: (position, hash) of every signed checkpoint (signatures already verified).
    pub fn new(
        after: ChainHead,
        checkpoints: impl IntoIterator<Item = (i64, String)>,
        key: LinkKey,
        rules: Rules,
    ) -> Self {
        Walk {
            next: after.chain_seq + 1,
            prev: after.hash,
            checked: 0,
            from: after.chain_seq + 1,
            checkpoints: checkpoints.into_iter().collect(),
            matched: 0,
            key,
            keyed: false,
            tagged: false,
            nonces: std::collections::HashSet::new(),
            rules,
            expected: None,
            first_break: None,
        }
    }

    pub fn broken(&self) -> bool {
        self.first_break.is_some()
    }

    /// A tagged record was walked — as every keyed link's record is (every record after it,
    /// sealed or not, must be tagged).
    pub fn tagged_seen(&self) -> bool {
        self.tagged
    }

    /// The nonces of the tags walked (the records not yet sealed must not repeat one).
    pub fn take_nonces(&mut self) -> std::collections::HashSet<u64> {
        std::mem::take(&mut self.nonces)
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
        let keyed = keyed_link_hash(&self.key, &self.prev, at, record) == link.hash;
        if keyed {
            self.keyed = true;
        } else if link_hash(&self.prev, at, record) == link.hash {
            if self.keyed {
                return self.fail(
                    at,
                    Some(link.seq),
                    "an unkeyed link after a keyed one (rewritten without the gateway's link key)".into(),
                );
            }
        } else {
            return self.fail(
                at,
                Some(link.seq),
                "its hash does not match its contents (the record was edited, or the link was not made with \
                 the gateway's link key)"
                    .into(),
            );
        }
        // The sealer never links an untagged record with a keyed link (it leaves it unsealed): an
        // untagged record under one had its tag stripped in the database (the eleventh review:
        // the chain deleted and every tag stripped, so the store looked never sealed).
        if let Some(fault) = tag_fault(&self.key, record, self.tagged || keyed) {
            return self.fail(at, Some(link.seq), fault.into());
        }
        self.tagged |= record.tag.is_some();
        if let Some(nonce) = record.tag.as_deref().and_then(tag_nonce)
            && !self.nonces.insert(nonce)
        {
            return self.fail(at, Some(link.seq), COPIED.into());
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
        if let Some(expect) = &self.rules.expect
            && expect.chain_seq == at
        {
            if expect.hash != link.hash {
                return self.fail(
                    at,
                    Some(link.seq),
                    format!(
                        "rollback or rewrite: the expected head is position {at} with hash {}, the chain has {}",
                        expect.hash, link.hash
                    ),
                );
            }
            self.expected = Some("matched");
        }
        let newest_signed = self.checkpoints.keys().next_back().copied().unwrap_or(0);
        if let Some(before) = self.rules.stale_before
            && at > newest_signed
            && record.at < before
        {
            return self.fail(
                at,
                Some(link.seq),
                format!(
                    "sealed but covered by no signed checkpoint, and its record is older than the sealing \
                     interval (the newest signed checkpoint is position {newest_signed}: later ones were \
                     deleted, or signing fails)"
                ),
            );
        }
        self.prev = link.hash.clone();
        self.next += 1;
        self.checked += 1;
    }

    /// The verdict, given the store's recorded head and the records not yet sealed.
    pub fn finish(mut self, head: &ChainHead, unsealed: Unsealed) -> Verdict {
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
        if let Some(expect) = self.rules.expect.clone() {
            if expect.chain_seq > last {
                self.fail(
                    last + 1,
                    None,
                    format!(
                        "rollback: the expected head is position {}, the chain ends at {last} (positions were \
                         deleted, with their checkpoints)",
                        expect.chain_seq
                    ),
                );
            } else if self.expected.is_none() {
                // Up to the end, yet never compared: every position walked from `from` on was
                // compared, so it lies before it, inside a range retention archived and signed off.
                self.expected = Some("archived");
            }
        }
        if let (Some(before), Some((seq, at))) = (self.rules.stale_before, unsealed.oldest)
            && at < before
        {
            self.fail(
                last + 1,
                Some(seq),
                format!(
                    "{} records are not sealed, the oldest (seq {seq}) made at {at}, longer ago than the sealing \
                     interval allows (sealing stopped, or their links were deleted)",
                    unsealed.count
                ),
            );
        }
        Verdict {
            ok: self.first_break.is_none(),
            checked: self.checked,
            from_chain_seq: self.from,
            to_chain_seq: last,
            checkpoints_matched: self.matched,
            unsealed: unsealed.count,
            expected: self.expected,
            first_break: self.first_break,
            keyed: self.keyed,
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
            tag: None,
        }
    }

    fn key() -> LinkKey {
        LinkKey::new([7; 32])
    }

    /// An unkeyed chain, as sealed before links were keyed (v1).
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
        let mut w = Walk::new(ChainHead::genesis(), checkpoints.iter().cloned(), key(), Rules::default());
        for l in links {
            w.push(l);
        }
        let head =
            links.last().map_or(ChainHead::genesis(), |l| ChainHead { chain_seq: l.chain_seq, hash: l.hash.clone() });
        w.finish(&head, Unsealed::default())
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
        let mut w = Walk::new(ChainHead::genesis(), cp.iter().cloned(), key(), Rules::default());
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
            let mut w = Walk::new(ChainHead::genesis(), [], key(), Rules::default());
            for l in links {
                w.push(l);
            }
            w.finish(&head, Unsealed::default())
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
        let mut w = Walk::new(anchor.clone(), [(3, links[2].hash.clone())], key(), Rules::default());
        for l in &links[3..] {
            w.push(l);
        }
        let head = ChainHead { chain_seq: 6, hash: links[5].hash.clone() };
        let v = w.finish(&head, Unsealed { count: 2, oldest: None });
        assert!(v.ok, "{v:?}");
        assert_eq!((v.from_chain_seq, v.checked, v.unsealed), (4, 3, 2));
        // Starting from the wrong anchor breaks at once.
        let mut w = Walk::new(ChainHead { chain_seq: 3, hash: GENESIS.into() }, [], key(), Rules::default());
        w.push(&links[3]);
        assert_eq!(w.finish(&head, Unsealed::default()).first_break.unwrap().chain_seq, 4);
    }

    /// A keyed chain (v3), as every sealing run now writes, after `unkeyed` links sealed before;
    /// its records tagged, as every gateway that keys links tags them.
    fn keyed_chain(unkeyed: i64, n: i64) -> Vec<ChainLink> {
        let mut links = chain(unkeyed);
        let mut prev = links.last().map_or(GENESIS.to_string(), |l| l.hash.clone());
        for i in unkeyed + 1..=n {
            let r = tagged(&key(), rec(i * 10, "x"), (i as u64).to_be_bytes());
            let hash = keyed_link_hash(&key(), &prev, i, &r);
            links.push(ChainLink {
                chain_seq: i,
                seq: r.seq,
                prev_hash: prev.clone(),
                hash: hash.clone(),
                record: Some(r),
            });
            prev = hash;
        }
        links
    }

    fn walk_with(links: &[ChainLink], checkpoints: &[(i64, String)], rules: Rules, unsealed: Unsealed) -> Verdict {
        let mut w = Walk::new(ChainHead::genesis(), checkpoints.iter().cloned(), key(), rules);
        for l in links {
            w.push(l);
        }
        let head =
            links.last().map_or(ChainHead::genesis(), |l| ChainHead { chain_seq: l.chain_seq, hash: l.hash.clone() });
        w.finish(&head, unsealed)
    }

    /// Keyed links are the link key's alone: a record edited and every later link recomputed
    /// (unkeyed, or under another key) breaks at the edit itself, checkpoint or none; unkeyed links
    /// before the first keyed one verify as they did, and none after it.
    #[test]
    fn keyed_links_cannot_be_remade_and_never_downgrade() {
        let links = keyed_chain(2, 6);
        assert!(walk(&links, &[]).ok, "{:?}", walk(&links, &[]));
        let hex = |h: &str| h.len() == 64 && h.bytes().all(|b| b.is_ascii_hexdigit());
        assert!(links.iter().all(|l| hex(&l.hash)));
        assert_ne!(keyed_link_hash(&key(), GENESIS, 1, &rec(10, "x")), link_hash(GENESIS, 1, &rec(10, "x")));
        assert_ne!(
            keyed_link_hash(&key(), GENESIS, 1, &rec(10, "x")),
            keyed_link_hash(&LinkKey::new([8; 32]), GENESIS, 1, &rec(10, "x"))
        );
        // Record 4 edited, every later link remade: unkeyed (a downgrade), or under a guessed key.
        for remake in [
            &(|prev: &str, at: i64, r: &AuditRecord| link_hash(prev, at, r))
                as &dyn Fn(&str, i64, &AuditRecord) -> String,
            &|prev: &str, at: i64, r: &AuditRecord| keyed_link_hash(&LinkKey::new([0; 32]), prev, at, r),
        ] {
            let mut forged = links.clone();
            forged[3].record.as_mut().unwrap().detail = Some("y".into());
            let mut prev = forged[2].hash.clone();
            for l in forged.iter_mut().skip(3) {
                l.prev_hash = prev.clone();
                l.hash = remake(&prev, l.chain_seq, l.record.as_ref().unwrap());
                prev = l.hash.clone();
            }
            let b = walk(&forged, &[]).first_break.unwrap();
            assert_eq!(b.chain_seq, 4, "{b:?}");
        }
        // The whole chain remade unkeyed from position 1 holds link by link, but is caught by a
        // checkpoint, or, with every checkpoint deleted, by the age rule below.
        let mut unkeyed = chain(6);
        unkeyed[3].record.as_mut().unwrap().detail = Some("x".into());
        assert!(walk(&unkeyed, &[]).ok);
        assert_eq!(walk(&unkeyed, &[(5, links[4].hash.clone())]).first_break.unwrap().chain_seq, 5);
    }

    /// Links after the newest signed checkpoint whose records are older than the sealing interval
    /// allows (checkpoints deleted, or signing failing) break; so do stale unsealed records.
    #[test]
    fn stale_unsigned_links_and_stale_unsealed_records_break() {
        let links = keyed_chain(0, 5);
        // Records are made at 1010..1050.
        let rules = |before| Rules { stale_before: Some(before), expect: None };
        let cp = [(5, links[4].hash.clone())];
        assert!(walk_with(&links, &cp, rules(2_000), Unsealed::default()).ok);
        // The newest checkpoint deleted: position 5's record (1050) is older than 2000.
        let v = walk_with(&links, &[(3, links[2].hash.clone())], rules(2_000), Unsealed::default());
        assert_eq!(v.first_break.unwrap().chain_seq, 4);
        // Young enough: the run that sealed them is signing now.
        assert!(walk_with(&links, &[(3, links[2].hash.clone())], rules(1_035), Unsealed::default()).ok);
        // Unsealed records: fine while young, a break once older than the interval allows.
        let young = Unsealed { count: 4, oldest: Some((60, 1_900)) };
        assert!(walk_with(&links, &cp, rules(1_800), young).ok);
        let b = walk_with(&links, &cp, rules(2_000), young).first_break.unwrap();
        assert_eq!((b.chain_seq, b.seq), (6, Some(60)), "{}", b.reason);
    }

    /// The tenth and eleventh reviews: every tag stripped at once (records' too), so "an untagged
    /// record after a tagged one" had nothing to go by. The sealer never links an untagged record
    /// with a keyed link: an untagged record under one is a break, checkpoint or none. Untagged
    /// records under unkeyed links (sealed before tags and keys) still hold.
    #[test]
    fn records_under_keyed_links_must_be_tagged_even_with_every_tag_stripped() {
        let links = keyed_chain(2, 6);
        let cp = vec![(4, links[3].hash.clone())];
        assert!(walk(&links, &cp).ok, "{:?}", walk(&links, &cp));
        // Every tag stripped (links do not cover the tag): a break at the first keyed link.
        let mut stripped = links.clone();
        for l in stripped.iter_mut() {
            l.record.as_mut().unwrap().tag = None;
        }
        for checkpoints in [cp.clone(), vec![]] {
            let v = walk(&stripped, &checkpoints);
            let b = v.first_break.unwrap();
            assert_eq!(b.chain_seq, 3, "{}", b.reason);
            assert!(b.reason.contains("tag was removed"), "{}", b.reason);
        }
        assert!(walk(&links, &cp).keyed);
        assert!(!walk(&chain(3), &[]).keyed);
        let mut w = Walk::new(ChainHead::genesis(), cp.clone(), key(), Rules::default());
        links.iter().take(4).for_each(|l| w.push(l));
        assert!(w.tagged_seen(), "the records not yet sealed must be tagged");
    }

    /// An externally kept head: its position must be on the chain with its hash, else a rollback.
    #[test]
    fn an_expected_head_names_a_rollback() {
        let links = keyed_chain(0, 6);
        let expect = |at: usize| Rules {
            stale_before: None,
            expect: Some(ChainHead { chain_seq: at as i64, hash: links[at - 1].hash.clone() }),
        };
        let v = walk_with(&links, &[], expect(4), Unsealed::default());
        assert_eq!((v.ok, v.expected), (true, Some("matched")), "{v:?}");
        // Rolled back to 3 (links, records, checkpoints and head): position 4 is missing.
        let b = walk_with(&links[..3], &[], expect(4), Unsealed::default()).first_break.unwrap();
        assert_eq!(b.chain_seq, 4);
        assert!(b.reason.starts_with("rollback"), "{}", b.reason);
        // The position there, another hash.
        let other = Rules { stale_before: None, expect: Some(ChainHead { chain_seq: 2, hash: links[3].hash.clone() }) };
        let b = walk_with(&links, &[], other, Unsealed::default()).first_break.unwrap();
        assert!(b.chain_seq == 2 && b.reason.contains("rollback"), "{b:?}");
        // Parsing: POSITION:HASH only.
        let h = &links[0].hash;
        assert_eq!(ChainHead::parse(&format!("4:{h}")), Some(ChainHead { chain_seq: 4, hash: h.clone() }));
        for bad in [
            format!("0:{h}"),
            format!("-1:{h}"),
            format!("+4:{h}"),
            format!("4:{}", &h[1..]),
            "4".into(),
            format!("4:{}", h.to_uppercase()),
        ] {
            assert_eq!(ChainHead::parse(&bad), None, "{bad}");
        }
    }

    #[test]
    fn the_link_key_never_prints() {
        assert_eq!(format!("{:?}", LinkKey::new([42; 32])), "LinkKey(***)");
    }

    /// The writer's tag binds every field but the seq (the database's), the payment id included,
    /// under the key.
    #[test]
    fn a_records_tag_binds_what_its_writer_wrote() {
        let r = AuditRecord { policy_version: Some(3), intent: Some("{}".into()), ..rec(10, "x") };
        const N: &str = "00112233aabbccdd";
        let tag = record_tag(&key(), &r, N);
        assert!(tag.starts_with("00112233aabbccdd.") && tag.len() == 16 + 1 + 64, "{tag}");
        assert_eq!(tag_nonce(&tag), Some(0x0011_2233_aabb_ccdd));
        assert_eq!(tag, record_tag(&key(), &AuditRecord { seq: 99, ..r.clone() }, N));
        assert_ne!(tag, record_tag(&LinkKey::new([8; 32]), &r, N), "under the key");
        assert_ne!(tag[17..], record_tag(&key(), &r, "00112233aabbccde")[17..], "under the nonce");
        for bad in ["", "nodot", "0011.abc", "zz112233aabbccdd.00"] {
            assert_eq!(tag_nonce(bad), None, "{bad:?}");
        }
        let edits: Vec<fn(&mut AuditRecord)> = vec![
            |r| r.at += 1,
            |r| r.correlation_id.push('x'),
            |r| r.principal_iss.push('x'),
            |r| r.principal_sub.push('x'),
            |r| r.principal_user = Some("alice".into()),
            |r| r.tool.push('x'),
            |r| r.decision.push('x'),
            |r| r.code = Some("DENIED".into()),
            |r| r.idempotency_key = Some("k".into()),
            |r| r.approval_id = Some("apr".into()),
            |r| r.detail = None,
            |r| r.repeats += 1,
            |r| r.policy_version = None,
            |r| r.intent = None,
            |r| r.payment_id = Some("pay_other".into()),
        ];
        for (i, edit) in edits.iter().enumerate() {
            let mut e = r.clone();
            edit(&mut e);
            assert_ne!(record_tag(&key(), &e, N), tag, "edit {i}");
        }
        let t = tagged(&key(), r.clone(), [1; 8]);
        assert_eq!(tag_fault(&key(), &t, true), None);
        let edited = AuditRecord { detail: Some("y".into()), ..t.clone() };
        assert!(tag_fault(&key(), &edited, false).is_some_and(|f| f.contains("does not match")));
        let stripped = AuditRecord { tag: None, ..edited };
        assert!(tag_fault(&key(), &stripped, true).is_some_and(|f| f.contains("removed")));
        assert_eq!(tag_fault(&key(), &stripped, false), None, "an untagged record before any tagged one is an old one");
    }

    /// A row's tag holds for the row the gateway tagged, under its key and domain, and for nothing
    /// else: another field, domain, key or nonce, or a malformed tag.
    #[test]
    fn a_rows_tag_holds_only_for_the_row_it_was_made_for() {
        let fields = serde_json::json!([3, "doc", "alice"]);
        const D: &str = "paygate-policy-version-v1\n";
        let tag = row_tag(&key(), D, &fields, "00112233aabbccdd");
        assert!(tag.starts_with("00112233aabbccdd.") && tag.len() == 16 + 1 + 64, "{tag}");
        assert!(row_tag_holds(&key(), D, &fields, &tag));
        assert!(!row_tag_holds(&key(), D, &serde_json::json!([4, "doc", "alice"]), &tag), "another row");
        assert!(!row_tag_holds(&key(), "paygate-audit-record-v1\n", &fields, &tag), "another domain");
        assert!(!row_tag_holds(&LinkKey::new([8; 32]), D, &fields, &tag), "another key");
        let renonced = format!("00112233aabbccde{}", &tag[16..]);
        assert!(!row_tag_holds(&key(), D, &fields, &renonced), "another nonce");
        for bad in ["", "nodot", &tag[..40], "zz112233aabbccdd.00"] {
            assert!(!row_tag_holds(&key(), D, &fields, bad), "{bad:?}");
        }
        assert_ne!(row_tag(&key(), D, &fields, "00112233aabbccdd"), row_tag(&key(), D, &fields, "ffffffffffffffff"));
    }

    /// A record edited before it was sealed: the chain sealed the edit (its link holds), its tag
    /// does not; and once a tagged record is walked, an untagged one after it is a tag removed.
    #[test]
    fn the_walk_names_a_record_edited_before_it_was_sealed() {
        let sealed = |records: Vec<AuditRecord>| {
            let mut prev = GENESIS.to_string();
            let links: Vec<ChainLink> = records
                .into_iter()
                .zip(1..)
                .map(|(r, i)| {
                    // Records from before tags were sealed before keys (unkeyed links).
                    let hash = match r.detail.as_deref() {
                        Some("before tags") => link_hash(&prev, i, &r),
                        _ => keyed_link_hash(&key(), &prev, i, &r),
                    };
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
                .collect();
            walk(&links, &[])
        };
        let good: Vec<AuditRecord> = (1..=4).map(|i| tagged(&key(), rec(i * 10, "x"), [i as u8; 8])).collect();
        assert!(sealed(good.clone()).ok);
        let mut with_old = vec![rec(5, "before tags")];
        with_old.extend(good.clone());
        assert!(sealed(with_old).ok, "untagged records before the first tagged one are older ones");
        let mut edited = good.clone();
        edited[2].principal_sub = "another-agent".into();
        let b = sealed(edited).first_break.unwrap();
        assert_eq!((b.chain_seq, b.seq), (3, Some(30)), "{b:?}");
        assert!(b.reason.contains("tag does not match"), "{b:?}");
        let mut stripped = good.clone();
        stripped[3].tag = None;
        let b = sealed(stripped).first_break.unwrap();
        assert_eq!((b.chain_seq, b.reason.contains("removed")), (4, true), "{b:?}");
        // A record copied (tag and all) into the trail: its tag holds, but repeats.
        let mut copied = good;
        copied.insert(2, AuditRecord { seq: 25, ..copied[0].clone() });
        let b = sealed(copied).first_break.unwrap();
        assert_eq!((b.chain_seq, b.seq, b.reason.as_str()), (3, Some(25), COPIED), "{b:?}");
    }

    /// The age rules' bounds: a record made exactly at `stale_before` is not yet late (sealed but
    /// unsigned, or unsealed); one a second older is.
    #[test]
    fn a_record_is_late_only_once_it_is_older_than_the_bound() {
        let links = keyed_chain(0, 3);
        let first = links[0].record.as_ref().unwrap().at;
        let head = ChainHead { chain_seq: 3, hash: links[2].hash.clone() };
        let run = |before: i64, unsealed: Unsealed| {
            let rules = Rules { stale_before: Some(before), expect: None };
            let mut w = Walk::new(ChainHead::genesis(), [(3, links[2].hash.clone())], key(), rules);
            links.iter().for_each(|l| w.push(l));
            w.finish(&head, unsealed)
        };
        assert!(run(first, Unsealed::default()).ok, "signed: the age of a sealed record does not matter");
        let unsigned = |before: i64| {
            let rules = Rules { stale_before: Some(before), expect: None };
            let mut w = Walk::new(ChainHead::genesis(), [], key(), rules);
            links.iter().for_each(|l| w.push(l));
            w.finish(&head, Unsealed::default())
        };
        assert!(unsigned(first).ok, "made at the bound: not late");
        assert_eq!(unsigned(first + 1).first_break.map(|b| b.chain_seq), Some(1), "a second older: late");
        let waiting = |at: i64| Unsealed { count: 1, oldest: Some((99, at)) };
        assert!(run(first, waiting(first)).ok, "unsealed, made at the bound: not late");
        let b = run(first, waiting(first - 1)).first_break.unwrap();
        assert_eq!((b.chain_seq, b.seq), (4, Some(99)), "{b:?}");
    }

    /// A witness's head at the chain's last position holds when its hash is there; one inside a
    /// range retention archived (before the walk's start) is reported as archived, not compared.
    #[test]
    fn an_expected_head_at_the_end_matches_and_one_before_the_walk_is_archived() {
        let links = keyed_chain(0, 5);
        let head = ChainHead { chain_seq: 5, hash: links[4].hash.clone() };
        let run = |after: ChainHead, expect: ChainHead, from: usize| {
            let rules = Rules { stale_before: None, expect: Some(expect) };
            let mut w = Walk::new(after, [], key(), rules);
            links[from..].iter().for_each(|l| w.push(l));
            w.finish(&head, Unsealed::default())
        };
        let v = run(ChainHead::genesis(), head.clone(), 0);
        assert_eq!((v.ok, v.expected), (true, Some("matched")), "{v:?}");
        let marker = ChainHead { chain_seq: 2, hash: links[1].hash.clone() };
        let v = run(marker, ChainHead { chain_seq: 1, hash: links[0].hash.clone() }, 2);
        assert_eq!((v.ok, v.from_chain_seq, v.expected), (true, 3, Some("archived")), "{v:?}");
    }

    /// Whether a walk saw a tagged record (what the unsealed records after it are held to).
    #[test]
    fn a_walk_reports_whether_it_saw_a_tagged_record() {
        let walked = |records: Vec<AuditRecord>| {
            let mut w = Walk::new(ChainHead::genesis(), [], key(), Rules::default());
            let mut prev = GENESIS.to_string();
            for (r, i) in records.into_iter().zip(1..) {
                // Untagged records were sealed before keys (the sealer never keys one).
                let hash = match r.tag {
                    Some(_) => keyed_link_hash(&key(), &prev, i, &r),
                    None => link_hash(&prev, i, &r),
                };
                w.push(&ChainLink {
                    chain_seq: i,
                    seq: r.seq,
                    prev_hash: prev.clone(),
                    hash: hash.clone(),
                    record: Some(r),
                });
                prev = hash;
            }
            w.tagged_seen()
        };
        assert!(!walked(vec![rec(10, "x"), rec(20, "y")]));
        assert!(walked(vec![rec(10, "x"), tagged(&key(), rec(20, "y"), [2; 8])]));
    }
}
