//! Approvals: a human decision on a request over the autonomous limit, its reviews, and the
//! mandate it turns into.

use serde::{Deserialize, Serialize};

/// Longest mandate string accepted, in bytes (bounded before any parsing; the ledger API's
/// `Paygate-Mandate` header is held to it too).
pub const MANDATE_BYTES_MAX: usize = 8192;

/// A closed mandate allows one payment exactly as approved; an open one, payments within its
/// bounds until it expires or is used up.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MandateKind {
    Closed,
    Open,
}

impl MandateKind {
    /// Its name in claims, views and the `kind` column of approvals and mandates.
    pub fn as_str(self) -> &'static str {
        match self {
            MandateKind::Closed => "closed",
            MandateKind::Open => "open",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "closed" => Some(MandateKind::Closed),
            "open" => Some(MandateKind::Open),
            _ => None,
        }
    }
}

use crate::clock::UnixSecs;
use crate::domain::audit_chain::{LinkKey, row_tag, row_tag_holds};
use crate::domain::error::StoreError;
use crate::domain::ids::ApprovalId;
use crate::domain::money::Currency;

/// Where an approval stands. Stored as its lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalStatus {
    Pending,
    Approved,
    Rejected,
    Expired,
}

impl ApprovalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ApprovalStatus::Pending => "pending",
            ApprovalStatus::Approved => "approved",
            ApprovalStatus::Rejected => "rejected",
            ApprovalStatus::Expired => "expired",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Pending, Self::Approved, Self::Rejected, Self::Expired].into_iter().find(|v| v.as_str() == s)
    }
}

impl std::fmt::Display for ApprovalStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One reviewer's decision. Stored as its lowercase name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ReviewDecision {
    Approve,
    Reject,
}

impl ReviewDecision {
    pub fn as_str(self) -> &'static str {
        match self {
            ReviewDecision::Approve => "approve",
            ReviewDecision::Reject => "reject",
        }
    }
    pub fn parse(s: &str) -> Option<Self> {
        [Self::Approve, Self::Reject].into_iter().find(|v| v.as_str() == s)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ApprovalRecord {
    pub id: ApprovalId,
    pub status: ApprovalStatus,
    /// closed (one payment) | open (constraints)
    pub kind: MandateKind,
    pub idempotency_key: String,
    pub fingerprint: String,
    pub principal_iss: String,
    pub principal_sub: String,
    /// The user the agent acts for (RFC 8693 delegation), if it does: with [`Approver::User`], the
    /// person who may confirm it.
    #[serde(default)]
    pub principal_user: Option<String>,
    pub tool: String,
    pub intent: serde_json::Value,
    pub amount_minor: i64,
    pub currency: Currency,
    pub reason: String,
    pub created_at: UnixSecs,
    pub expires_at: UnixSecs,
    pub reviewers_required: i64,
    /// Who asked: the agent subject, or the operator who pre-authorized.
    pub requested_by: String,
    pub mandate_id: Option<String>,
    pub mandate: Option<String>,
    pub decided_at: Option<UnixSecs>,
    pub decision_reason: Option<String>,
    /// Filled by `approval_get` / `approval_list`.
    #[serde(default)]
    pub reviews: Vec<Review>,
    /// Who may decide it: operators always; with [`Approver::User`], also the person the agent acts
    /// for (the token's subject), signed in themselves (see `rules::review::plan`).
    #[serde(default)]
    pub approver: Approver,
    /// Deciding it (approve or reject, an operator's review or the user's confirmation) needs a
    /// passkey assertion over [`passkey_payload`]: its agent's profile or its amount tier said so
    /// when it was asked for.
    #[serde(default)]
    pub passkey_required: bool,
    /// The gateway's tag over what the approval asks ([`ApprovalRecord::tagged`]): set where it is
    /// created, never changed. Never shown.
    #[serde(default, skip)]
    pub tag: Option<String>,
}

/// The domain of an approval row's tag (`audit_chain::row_tag`).
const APPROVAL_TAG_DOMAIN: &str = "paygate-approval-v1\n";

/// Who may decide an approval besides operators.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Approver {
    /// Operators only (the default).
    #[default]
    Operator,
    /// The user themselves may confirm it too: within their profile's user-approval tier.
    User,
}

impl Approver {
    pub fn as_str(self) -> &'static str {
        match self {
            Approver::Operator => "operator",
            Approver::User => "user",
        }
    }
    pub fn parse(s: &str) -> Option<Approver> {
        match s {
            "operator" => Some(Approver::Operator),
            "user" => Some(Approver::User),
            _ => None,
        }
    }
}

/// What deciding an approval takes under the policy in force now (its principal's profile, the
/// reviewer and passkey tiers as configured): a pending approval is judged by the stricter of
/// this and what it was created under (`ApprovalRecord::under`), so narrowing policy during an
/// incident reaches approvals already waiting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct InForce {
    /// The user may no longer confirm it alone (their tier no longer covers it): an operator decides.
    pub operator_only: bool,
    pub reviewers_required: i64,
    pub passkey_required: bool,
}

impl ApprovalRecord {
    /// What an approval's tag covers: everything it asks and everything it was created under,
    /// none of which changes after it is created (its status, decision and mandate do, and are
    /// held to the trail and the mandate's signature instead). An intent, amount, agent or expiry
    /// a database writer rewrote between two reviews makes the tag fail: the reviewers saw another.
    fn tag_fields(&self) -> serde_json::Value {
        serde_json::json!([
            self.id.as_str(),
            self.kind.as_str(),
            self.idempotency_key,
            self.fingerprint,
            self.principal_iss,
            self.principal_sub,
            self.principal_user,
            self.tool,
            self.intent,
            self.amount_minor,
            self.currency.code(),
            self.reason,
            self.created_at,
            self.expires_at,
            self.reviewers_required,
            self.requested_by,
            self.approver.as_str(),
            self.passkey_required
        ])
    }

    /// This approval with the gateway's tag under `key` and `nonce` (random, drawn by the writer).
    pub fn tagged(mut self, key: &LinkKey, nonce: [u8; 8]) -> Self {
        let nonce = super::ids::hex(&nonce);
        self.tag = Some(row_tag(key, APPROVAL_TAG_DOMAIN, &self.tag_fields(), &nonce));
        self
    }

    /// Whether the approval carries the gateway's tag over what it asks, as it was created.
    pub fn tag_holds(&self, key: &LinkKey) -> bool {
        self.tag.as_deref().is_some_and(|t| row_tag_holds(key, APPROVAL_TAG_DOMAIN, &self.tag_fields(), t))
    }

    /// This approval as it is decided now: the stricter of its creation terms and `now` — an
    /// operator instead of the user, more reviewers, a passkey. Never laxer than it was created.
    pub fn under(mut self, now: &InForce) -> ApprovalRecord {
        if now.operator_only {
            self.approver = Approver::Operator;
        }
        self.reviewers_required = self.reviewers_required.max(now.reviewers_required);
        self.passkey_required |= now.passkey_required;
        self
    }

    /// The status as of `now`: a pending approval past its expiry is expired, whether or not anyone
    /// has touched it since.
    pub fn status_at(&self, now: UnixSecs) -> ApprovalStatus {
        if self.status == ApprovalStatus::Pending && now >= self.expires_at {
            ApprovalStatus::Expired
        } else {
            self.status
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Review {
    pub reviewer_iss: String,
    pub reviewer_sub: String,
    pub decision: ReviewDecision,
    pub reason: Option<String>,
    pub at: UnixSecs,
    /// The passkey assertion this review was signed with, as received (JSON: `credential_id`,
    /// `client_data_json`, `authenticator_data`, `signature`, base64url); `None`: a plain click.
    #[serde(default)]
    pub passkey: Option<String>,
    /// Made by the user the agent acts for, through the confirmation route (not stored: only the
    /// review being planned carries it).
    #[serde(default, skip)]
    pub as_user: bool,
    /// The gateway's tag over the review as stored ([`review_tag`]); `None`: written before reviews
    /// were tagged, or by someone else. Never shown.
    #[serde(default, skip)]
    pub tag: Option<String>,
}

/// The domain of a review row's tag (`audit_chain::row_tag`).
const REVIEW_TAG_DOMAIN: &str = "paygate-approval-review-v1\n";

impl Review {
    /// What a review's tag covers: everything stored of it, and the approval it is on (a tagged
    /// review copied onto another approval does not hold there).
    fn tag_fields(&self, approval_id: &ApprovalId) -> serde_json::Value {
        serde_json::json!([
            approval_id.as_str(),
            self.reviewer_iss,
            self.reviewer_sub,
            self.decision.as_str(),
            self.reason,
            self.at,
            self.passkey
        ])
    }

    /// This review with the gateway's tag under `key` and `nonce` (random, drawn by the writer).
    pub fn tagged(mut self, key: &LinkKey, approval_id: &ApprovalId, nonce: [u8; 8]) -> Self {
        self.tag = Some(review_tag(key, approval_id, &self, &super::ids::hex(&nonce)));
        self
    }

    /// Whether the review carries the gateway's tag over what it says, on this approval.
    pub fn tag_holds(&self, key: &LinkKey, approval_id: &ApprovalId) -> bool {
        self.tag.as_deref().is_some_and(|t| row_tag_holds(key, REVIEW_TAG_DOMAIN, &self.tag_fields(approval_id), t))
    }
}

/// The gateway's tag of review `r` on approval `approval_id` under `nonce`: a review row a
/// database writer inserted or edited does not carry one that holds.
fn review_tag(key: &LinkKey, approval_id: &ApprovalId, r: &Review, nonce: &str) -> String {
    row_tag(key, REVIEW_TAG_DOMAIN, &r.tag_fields(approval_id), nonce)
}

/// What asking for an approval found or did.
#[derive(Debug, Clone, PartialEq)]
pub enum ApprovalRequest {
    /// The operation already has one (pending, approved, or rejected: a rejection sticks).
    Existing(ApprovalRecord),
    /// A new pending approval.
    Created(ApprovalRecord),
    /// The agent already has `approvals.pending_per_agent_max` approvals waiting for a human.
    TooManyPending,
}

/// Why a review was not recorded.
#[derive(Debug, thiserror::Error)]
pub enum ReviewError {
    #[error("no such approval")]
    NotFound,
    #[error("the approval is already {0}")]
    Terminal(ApprovalStatus),
    #[error("the approval has expired")]
    Expired,
    #[error("the requesting agent cannot review its own request")]
    SelfReview,
    #[error("this reviewer has already reviewed this approval")]
    AlreadyReviewed,
    #[error("only the user the payment is for may confirm it, and only an approval in their user-approval tier")]
    NotTheUser,
    #[error("cannot issue the mandate: {0}")]
    Mandate(String),
    /// A review on record does not hold its gateway's tag, or one person is on record twice: the
    /// approval's reviews were written outside the gateway, and it is decided no further.
    #[error("the approval's reviews were altered outside the gateway; it cannot be decided")]
    Altered,
    #[error(transparent)]
    Store(#[from] StoreError),
}

/// The mandate an approval turns into once enough reviewers approve: signed by the caller (who
/// holds the key) inside the review transaction, given the record and its approvers.
pub type MandateIssuer = Box<dyn FnOnce(&ApprovalRecord, &[String]) -> Result<IssuedMandate, String> + Send + 'static>;

/// One reviewer's decision on approval `id`, as the store records it (at `review.at`); `issue` signs
/// the mandate if the decision completes the approval.
pub struct ApprovalReview {
    pub id: ApprovalId,
    pub review: Review,
    pub issue: MandateIssuer,
    /// `approval.decided`: written with the review that decides it (approved or rejected), with
    /// the approval's page as its `approval_url`.
    pub decided: crate::domain::webhook::Notice,
    pub page: String,
    /// What deciding it takes under the policy in force (`ApprovalRecord::under`).
    pub in_force: InForce,
    /// The key the reviews on record are held to (`Review::tag_holds`).
    pub key: LinkKey,
    /// The decision's audit record (tagged), written in the review's transaction: a review that
    /// decides is never without its record on the trail.
    pub record: Option<crate::domain::audit::AuditRecord>,
}

/// A review the store recorded: the approval as it now stands, and the sequence number of the
/// decision's record written with it (the gateway witnesses it until it is sealed).
#[derive(Debug, Clone, PartialEq)]
pub struct Reviewed {
    pub approval: ApprovalRecord,
    pub record_seq: Option<i64>,
}

/// A mandate the store revoked, and the sequence number of the revocation's record written with it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    pub mandate_id: String,
    pub record_seq: Option<i64>,
}

/// Sign the mandate of approval `rec` inside its review transaction: over every review that
/// completes it, `review` (the one being recorded) included. Both store engines call this.
pub fn issue_mandate(
    issue: MandateIssuer,
    rec: &ApprovalRecord,
    review: &Review,
    approvers: &[String],
) -> Result<IssuedMandate, ReviewError> {
    let mut rec = rec.clone();
    rec.reviews.push(review.clone());
    issue(&rec, approvers).map_err(ReviewError::Mandate)
}

#[derive(Debug, Clone)]
pub struct IssuedMandate {
    pub id: String,
    pub jws: String,
    pub budget_minor: Option<i64>,
    pub max_uses: i64,
    pub expires_at: UnixSecs,
}

/// What a passkey signs to decide approval `rec`: the canonical JSON (sorted keys, no spaces) of its
/// id, the decision, and exactly what the mandate will pin (tool, amount, currency and the whole
/// intent the person sees: payer, payee, operation, memo, ...). The WebAuthn challenge is its
/// SHA-256, so an assertion made for another amount, payee, approval or decision never verifies.
pub fn passkey_payload(rec: &ApprovalRecord, decision: ReviewDecision) -> String {
    serde_json::json!({
        "approval_id": rec.id.as_str(),
        "decision": decision.as_str(),
        "tool": rec.tool,
        "amount_minor": rec.amount_minor.to_string(),
        "currency": rec.currency.code(),
        "intent": rec.intent,
    })
    .to_string()
}

/// The WebAuthn challenge that decides `rec` with `decision`: SHA-256 of [`passkey_payload`].
pub fn passkey_challenge(rec: &ApprovalRecord, decision: ReviewDecision) -> [u8; 32] {
    use sha2::{Digest, Sha256};
    Sha256::digest(passkey_payload(rec, decision).as_bytes()).into()
}

/// SHA-256 (hex) of a review's stored passkey evidence: what the mandate's `passkeys` claim lists.
pub fn passkey_evidence_digest(evidence: &str) -> String {
    use sha2::{Digest, Sha256};
    crate::domain::ids::hex(&Sha256::digest(evidence.as_bytes()))
}

/// A person's registered passkey (WebAuthn credential), as stored.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasskeyRecord {
    /// The credential id, base64url without padding.
    pub credential_id: String,
    pub owner_iss: String,
    pub owner_sub: String,
    /// SEC1 uncompressed P-256 point.
    pub public_key: Vec<u8>,
    pub sign_count: i64,
    pub backup_eligible: bool,
    /// What the person called it ("laptop", "phone").
    pub name: String,
    pub created_at: UnixSecs,
    pub revoked_at: Option<UnixSecs>,
    pub revoked_by: Option<String>,
    /// The relying party it was registered for (its assertions carry them): the RP id and origin.
    pub rp_id: String,
    pub origin: String,
}

/// A registration challenge handed out by `POST /operator/v1/passkeys/options`, as stored: only its
/// SHA-256 (hex), for one person, until `expires_at`. Deleted by the registration it admits.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PasskeyChallenge {
    pub challenge_sha256: String,
    pub owner_iss: String,
    pub owner_sub: String,
    pub created_at: UnixSecs,
    pub expires_at: UnixSecs,
}

/// An enrolment code, as stored: only its SHA-256 (hex), for one person, single-use, expiring.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EnrolmentCode {
    pub code_sha256: String,
    pub owner_iss: String,
    pub owner_sub: String,
    /// Who issued it: an operator's subject, or `cli:<user>` for the command line at the box.
    pub issued_by: String,
    pub issued_at: UnixSecs,
    pub expires_at: UnixSecs,
}

/// What vouches for a new passkey besides the bearer token: an enrolment code issued for this
/// person, or an assertion by one of their live passkeys over the registration's challenge (its
/// counter read as `seen` before it was verified, moving to `count`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EnrolmentProof {
    Code { code_sha256: String },
    Passkey { credential_id: String, seen: i64, count: i64 },
}

/// One registration, for the store to commit whole or not at all: consume the challenge, consume
/// the code or move the vouching passkey's counter, insert the credential (within `max` live ones
/// per person), and write the announcement's outbox messages.
#[derive(Debug, Clone)]
pub struct PasskeyEnrolment {
    pub rec: PasskeyRecord,
    pub challenge_sha256: String,
    pub proof: EnrolmentProof,
    pub max: i64,
    pub notify: Vec<crate::domain::webhook::OutboxMessage>,
}

/// What a registration did. Every refusal changed nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PasskeyEnrolled {
    /// Registered; with a code, who issued it.
    Inserted { code_issued_by: Option<String> },
    /// The challenge is unknown, used, expired or another person's.
    ChallengeSpent,
    /// The code is unknown, used, expired or another person's.
    CodeRefused,
    /// The vouching passkey is not a live one of this person's, or its counter moved meanwhile.
    PasskeyStale,
    /// That credential id is registered already (to anyone).
    Duplicate,
    /// The person already has this many live passkeys.
    TooMany,
}

/// What storing a registration challenge did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChallengeIssued {
    Stored,
    /// The person has this many unexpired challenges already.
    TooMany,
}

/// A pending closed approval of KES 5,000.00 acct-A → acct-B (for unit tests across the domain).
#[cfg(test)]
pub(crate) fn sample_record() -> ApprovalRecord {
    ApprovalRecord {
        id: ApprovalId::parse("apr_1").unwrap(),
        status: ApprovalStatus::Pending,
        kind: MandateKind::Closed,
        idempotency_key: "idk".into(),
        fingerprint: "fp".into(),
        principal_iss: "iss".into(),
        principal_sub: "agent".into(),
        principal_user: None,
        tool: "create_payment".into(),
        intent: serde_json::json!({"to": "acct-B", "from": "acct-A"}),
        amount_minor: 500_000,
        currency: Currency::parse("KES").unwrap(),
        reason: "over the limit".into(),
        created_at: 1_000,
        expires_at: 2_000,
        reviewers_required: 1,
        requested_by: "agent".into(),
        mandate_id: None,
        mandate: None,
        decided_at: None,
        decision_reason: None,
        reviews: vec![],
        approver: Approver::Operator,
        passkey_required: false,
        tag: None,
    }
}

/// A rejected intent to look for before asking a human again (`approvals.rejected_cooldown_secs`):
/// the same principal, tool and fingerprint (the arguments without the operation_id), rejected at
/// or after `since`, under another operation than `key`, while `key`'s own approval is neither
/// pending nor approved. `created_since` bounds the scan (a decision follows its creation).
#[derive(Debug, Clone, Copy)]
pub struct RejectedIntent<'a> {
    pub issuer: &'a str,
    pub subject: &'a str,
    pub user: Option<&'a str>,
    pub tool: &'a str,
    pub fingerprint: &'a str,
    pub key: &'a str,
    pub since: i64,
    pub created_since: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pending_approval_is_decided_under_the_stricter_terms_never_laxer() {
        let mut rec = sample_record();
        rec.approver = Approver::User;
        rec.reviewers_required = 2;
        rec.passkey_required = false;
        // Stricter now: an operator, three reviewers, a passkey.
        let strict = InForce { operator_only: true, reviewers_required: 3, passkey_required: true };
        let now = rec.clone().under(&strict);
        assert_eq!((now.approver, now.reviewers_required, now.passkey_required), (Approver::Operator, 3, true));
        // Laxer now: nothing relaxes what it was created under.
        let lax = InForce { operator_only: false, reviewers_required: 1, passkey_required: false };
        let now = rec.clone().under(&lax);
        assert_eq!((now.approver, now.reviewers_required, now.passkey_required), (Approver::User, 2, false));
        rec.passkey_required = true;
        assert!(rec.under(&lax).passkey_required, "a passkey asked for at creation stays asked for");
    }

    /// The names the stores, claims and views use: each reads back, nothing else parses.
    #[test]
    fn names_read_back_as_stored() {
        for k in [MandateKind::Closed, MandateKind::Open] {
            assert_eq!(MandateKind::parse(k.as_str()), Some(k));
        }
        for s in [ApprovalStatus::Pending, ApprovalStatus::Approved, ApprovalStatus::Rejected, ApprovalStatus::Expired]
        {
            assert_eq!((ApprovalStatus::parse(s.as_str()), s.to_string()), (Some(s), s.as_str().to_string()));
        }
        for d in [ReviewDecision::Approve, ReviewDecision::Reject] {
            assert_eq!(ReviewDecision::parse(d.as_str()), Some(d));
        }
        for a in [Approver::Operator, Approver::User] {
            assert_eq!(Approver::parse(a.as_str()), Some(a));
        }
        assert_eq!(
            [
                MandateKind::Closed.as_str(),
                MandateKind::Open.as_str(),
                Approver::Operator.as_str(),
                Approver::User.as_str()
            ],
            ["closed", "open", "operator", "user"]
        );
        for junk in ["", "Closed", "approved ", "users", "xyzzy"] {
            assert_eq!(MandateKind::parse(junk), None);
            assert_eq!(Approver::parse(junk), None);
            assert_eq!(ApprovalStatus::parse(junk), None);
            assert_eq!(ReviewDecision::parse(junk), None);
        }
    }

    #[test]
    fn a_pending_approval_expires_at_its_second_and_a_decided_one_never_does() {
        let mut rec = sample_record();
        assert_eq!(rec.status_at(1_999), ApprovalStatus::Pending);
        assert_eq!(rec.status_at(2_000), ApprovalStatus::Expired);
        rec.status = ApprovalStatus::Approved;
        assert_eq!(rec.status_at(9_999), ApprovalStatus::Approved);
    }

    /// What a passkey signs is a contract with the console and the person's authenticator: pinned
    /// here (canonical JSON, sorted keys; its SHA-256 computed by Python's hashlib), and different
    /// for the other decision, another amount or another payee.
    #[test]
    fn the_passkey_payload_and_challenge_are_pinned_and_bind_the_decision() {
        let rec = sample_record();
        let payload = passkey_payload(&rec, ReviewDecision::Approve);
        assert_eq!(
            payload,
            r#"{"amount_minor":"500000","approval_id":"apr_1","currency":"KES","decision":"approve","intent":{"from":"acct-A","to":"acct-B"},"tool":"create_payment"}"#
        );
        assert_eq!(
            crate::domain::ids::hex(&passkey_challenge(&rec, ReviewDecision::Approve)),
            "b77128b2967cc533abf856b7e2705765878379495f681aad78f03d79ec55fefd"
        );
        let challenge = passkey_challenge(&rec, ReviewDecision::Approve);
        assert_ne!(challenge, passkey_challenge(&rec, ReviewDecision::Reject));
        let mut more = rec.clone();
        more.amount_minor += 1;
        assert_ne!(challenge, passkey_challenge(&more, ReviewDecision::Approve));
        let mut elsewhere = rec;
        elsewhere.intent["to"] = serde_json::json!("acct-Z");
        assert_ne!(challenge, passkey_challenge(&elsewhere, ReviewDecision::Approve));
    }

    #[test]
    fn evidence_digests_are_sha256_hex() {
        assert_eq!(
            passkey_evidence_digest("evidence"),
            "ee8250fb76e094b34b471f13a73dbbe51d1ae142e9df59d7c0d31ec20f0a0a8e"
        );
    }

    /// An approval holds its tag only as it was created: any field it asks or was created under,
    /// changed, and it does not; what a decision changes (status, mandate, reviews) leaves it.
    #[test]
    fn an_approval_holds_its_tag_only_as_it_was_created() {
        let key = LinkKey::new([5; 32]);
        let rec = sample_record();
        assert!(!rec.tag_holds(&key), "untagged");
        let tagged = rec.tagged(&key, [1; 8]);
        assert!(tagged.tag_holds(&key));
        assert!(!tagged.tag_holds(&LinkKey::new([6; 32])), "another key");
        let t = || tagged.clone();
        let edits = [
            ApprovalRecord { id: ApprovalId::parse("apr_other").unwrap(), ..t() },
            ApprovalRecord { kind: MandateKind::Open, ..t() },
            ApprovalRecord { idempotency_key: "k2".into(), ..t() },
            ApprovalRecord { fingerprint: "f2".into(), ..t() },
            ApprovalRecord { principal_iss: "i2".into(), ..t() },
            ApprovalRecord { principal_sub: "s2".into(), ..t() },
            ApprovalRecord { principal_user: Some("u2".into()), ..t() },
            ApprovalRecord { tool: "refund_payment".into(), ..t() },
            ApprovalRecord { intent: serde_json::json!({"amount": "90000.00"}), ..t() },
            ApprovalRecord { amount_minor: t().amount_minor + 1, ..t() },
            ApprovalRecord { currency: Currency::parse("USD").unwrap(), ..t() },
            ApprovalRecord { reason: "r2".into(), ..t() },
            ApprovalRecord { created_at: t().created_at + 1, ..t() },
            ApprovalRecord { expires_at: t().expires_at + 1, ..t() },
            ApprovalRecord { reviewers_required: t().reviewers_required + 1, ..t() },
            ApprovalRecord { requested_by: "r2".into(), ..t() },
            ApprovalRecord { approver: Approver::User, ..t() },
            ApprovalRecord { passkey_required: !t().passkey_required, ..t() },
        ];
        for e in edits {
            assert!(!e.tag_holds(&key), "{e:?}");
        }
        let decided = ApprovalRecord {
            status: ApprovalStatus::Approved,
            mandate_id: Some("m".into()),
            mandate: Some("jws".into()),
            decided_at: Some(9),
            decision_reason: Some("ok".into()),
            ..t()
        };
        assert!(decided.tag_holds(&key), "a decision leaves what was asked as it was");
    }

    /// A review holds its tag on its own approval only, and only as tagged.
    #[test]
    fn a_review_holds_its_tag_as_written_on_its_own_approval() {
        let key = LinkKey::new([7; 32]);
        let (id, other) = (ApprovalId::parse("apr_1").unwrap(), ApprovalId::parse("apr_2").unwrap());
        let review = Review {
            reviewer_iss: "iss".into(),
            reviewer_sub: "op".into(),
            decision: ReviewDecision::Approve,
            reason: Some("ok".into()),
            at: 1_500,
            passkey: None,
            as_user: false,
            tag: None,
        };
        assert!(!review.tag_holds(&key, &id), "untagged");
        let tagged = review.clone().tagged(&key, &id, [1; 8]);
        assert!(tagged.tag_holds(&key, &id));
        assert!(!tagged.tag_holds(&key, &other), "copied onto another approval");
        assert!(!tagged.tag_holds(&LinkKey::new([8; 32]), &id), "another key");
        let edits = [
            Review { reviewer_iss: "iss2".into(), ..tagged.clone() },
            Review { reviewer_sub: "op2".into(), ..tagged.clone() },
            Review { decision: ReviewDecision::Reject, ..tagged.clone() },
            Review { reason: None, ..tagged.clone() },
            Review { at: 1_501, ..tagged.clone() },
            Review { passkey: Some("p".into()), ..tagged.clone() },
        ];
        for e in edits {
            assert!(!e.tag_holds(&key, &id), "{e:?}");
        }
        // Another nonce is another tag, and both hold.
        let again = review.tagged(&key, &id, [2; 8]);
        assert_ne!(again.tag, tagged.tag);
        assert!(again.tag_holds(&key, &id));
    }

    /// The mandate is signed over every review that completes the approval, the one being
    /// recorded included; the issuer's refusal is the review's error.
    #[test]
    fn the_mandate_sees_the_review_that_completes_it() {
        let review = Review {
            reviewer_iss: "iss".into(),
            reviewer_sub: "op".into(),
            decision: ReviewDecision::Approve,
            reason: None,
            at: 1_500,
            passkey: None,
            as_user: false,
            tag: None,
        };
        let issue: MandateIssuer = Box::new(|rec, approvers| {
            assert_eq!(rec.reviews.len(), 1);
            assert_eq!(rec.reviews[0].reviewer_sub, "op");
            Ok(IssuedMandate {
                id: format!("m-{}", approvers.join(",")),
                jws: "jws".into(),
                budget_minor: None,
                max_uses: 1,
                expires_at: rec.expires_at,
            })
        });
        let issued = issue_mandate(issue, &sample_record(), &review, &["iss op".to_string()]).unwrap();
        assert_eq!((issued.id.as_str(), issued.expires_at), ("m-iss op", 2_000));
        let refuse: MandateIssuer = Box::new(|_, _| Err("no key".into()));
        let e = issue_mandate(refuse, &sample_record(), &review, &[]).unwrap_err();
        assert_eq!(e.to_string(), "cannot issue the mandate: no key");
    }
}
