//! Passkeys: the people who decide approvals register WebAuthn credentials (ES256, from the
//! console) and sign their decisions with them. The challenge of a decision is the SHA-256 of
//! exactly what the mandate will pin (`domain::approval::passkey_payload`), so an assertion made for
//! another amount, payee, approval or decision never verifies; the assertion is stored with the
//! review, its hash goes into the mandate, and anyone can verify it again later from the stored
//! public key (`approval_passkeys`). An approval whose agent's profile or amount tier requires a
//! passkey refuses a plain click.
//!
//! A bearer token alone never registers a passkey (whoever holds the token could otherwise
//! register their own authenticator and sign as the person): a person's first passkey needs an
//! enrolment code issued for them by another operator (`payments:admin`, never for themself) or at
//! the box (`paygate passkeys enrol-code`); a later one needs an assertion by one of their live
//! passkeys over the new registration's challenge ([`enrolment_challenge`]), or a fresh code.
//! Codes are random (128 bits), stored only as their SHA-256, single-use, expiring
//! (`passkeys.enrolment_code_ttl_secs`). Registration challenges are random and single-use: the
//! store keeps their SHA-256 until they expire or register, and the registration deletes the row
//! in the transaction that consumes the code (or moves the vouching passkey's counter), stores the
//! credential and writes the `passkey.registered` webhook messages. Every code issued and every
//! registration (and every refusal) is audited.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::approvals::{OpError, Operator};
use super::{Decision, Gateway};
use crate::catalogue::scopes;
use crate::clock::{UnixSecs, rfc3339};
use crate::domain::approval::{ApprovalRecord, PasskeyRecord, ReviewDecision};
use crate::domain::approval::{ChallengeIssued, EnrolmentCode, EnrolmentProof, PasskeyEnrolled, PasskeyEnrolment};
use crate::domain::approval::{passkey_challenge, passkey_evidence_digest, passkey_payload};
use crate::domain::ids::ApprovalId;
use crate::error::ErrorCode;
use crate::passkey::{Assertion, Counter, Credential, RelyingParty};

/// How long a registration challenge may be answered, in seconds (WebAuthn's own ceremony timeout
/// is at most this).
pub const REGISTRATION_TTL_SECS: i64 = 300;
/// Longest passkey name, in characters.
pub const PASSKEY_NAME_CHARS_MAX: usize = 64;
/// What an existing passkey signs to vouch for a new registration: this label, then the
/// registration's challenge (never a JSON text, so never an approval's payload).
const ENROLMENT_LABEL: &[u8] = b"paygate passkey enrolment v1\0";
/// Random bytes in an enrolment code (written as 32 hex digits in groups of four).
const ENROLMENT_CODE_BYTES: usize = 16;

/// A passkey assertion answering an approval's challenge (`navigator.credentials.get`), every
/// field base64url: sent with approve, reject or confirm.
#[derive(Debug, Clone, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PasskeyAssertion {
    pub credential_id: String,
    pub client_data_json: String,
    pub authenticator_data: String,
    pub signature: String,
}

/// A new passkey (`navigator.credentials.create`, attestation "none"), base64url, answering the
/// challenge `POST /operator/v1/passkeys/options` gave.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PasskeyRegistration {
    pub challenge: String,
    pub client_data_json: String,
    pub attestation_object: String,
    #[serde(default)]
    pub name: Option<String>,
    /// An enrolment code issued for this person (the first passkey needs one).
    #[serde(default)]
    pub enrolment_code: Option<String>,
    /// Or: an assertion by one of the person's live passkeys over `enrolment.publicKey.challenge`
    /// of the same options.
    #[serde(default)]
    pub passkey: Option<PasskeyAssertion>,
}

/// `POST /operator/v1/passkeys/enrolment-codes`: a code for `owner` (a subject under the issuing
/// operator's issuer).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnrolmentCodeRequest {
    pub owner: String,
}

/// A freshly issued enrolment code: shown once, to hand to its owner out of band.
#[derive(Debug, Clone, Serialize)]
pub struct EnrolmentCodeIssued {
    pub code: String,
    pub owner: String,
    pub issuer: String,
    pub issued_by: String,
    pub expires_at: String,
}

/// The challenge an existing passkey signs to vouch for the registration answering `challenge`.
pub fn enrolment_challenge(challenge: &[u8]) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(ENROLMENT_LABEL);
    h.update(challenge);
    h.finalize().into()
}

/// SHA-256 (hex) of an enrolment code as typed: dashes and spaces dropped, lower case; `None` when
/// it is not 32 hex digits (no code ever is).
fn code_hash(code: &str) -> Option<String> {
    let digits: String = code.chars().filter(|c| *c != '-' && !c.is_whitespace()).collect::<String>().to_lowercase();
    (digits.len() == 2 * ENROLMENT_CODE_BYTES && digits.bytes().all(|b| b.is_ascii_hexdigit()))
        .then(|| crate::domain::ids::hex(&Sha256::digest(digits.as_bytes())))
}

fn sha256_hex(bytes: &[u8]) -> String {
    crate::domain::ids::hex(&Sha256::digest(bytes))
}

/// A registered passkey, as its owner sees it: the public key as a JWK, to verify its assertions
/// with any JOSE or WebAuthn library.
#[derive(Debug, Clone, Serialize)]
pub struct PasskeyView {
    pub credential_id: String,
    pub name: String,
    pub owner: String,
    pub created_at: String,
    pub revoked_at: Option<String>,
    pub revoked_by: Option<String>,
    pub sign_count: i64,
    pub backup_eligible: bool,
    pub public_key_jwk: Value,
}

/// What a passkey signs to decide a pending approval, one text per decision: the challenge is the
/// SHA-256 of the exact text, so the console shows what is signed and signs what it shows.
#[derive(Debug, Clone, Serialize, JsonSchema)]
pub struct PasskeyPayloads {
    pub approve: String,
    pub reject: String,
}

fn b64(field: &'static str, s: &str) -> Result<Vec<u8>, OpError> {
    B64.decode(s.trim_end_matches('=')).map_err(|_| OpError::invalid(format!("{field} is not base64url")))
}

fn invalid(why: impl std::fmt::Display) -> OpError {
    OpError::new(ErrorCode::PasskeyInvalid, format!("the passkey assertion does not verify: {why}"))
}

fn jwk(public_key: &[u8]) -> Value {
    // SEC1 uncompressed: 0x04 || x (32) || y (32).
    match public_key {
        [4, rest @ ..] if rest.len() == 64 => {
            json!({"kty": "EC", "crv": "P-256", "x": B64.encode(&rest[..32]), "y": B64.encode(&rest[32..])})
        }
        _ => Value::Null,
    }
}

fn view(p: &PasskeyRecord) -> PasskeyView {
    PasskeyView {
        credential_id: p.credential_id.clone(),
        name: p.name.clone(),
        owner: p.owner_sub.clone(),
        created_at: rfc3339(p.created_at),
        revoked_at: p.revoked_at.map(rfc3339),
        revoked_by: p.revoked_by.clone(),
        sign_count: p.sign_count,
        backup_eligible: p.backup_eligible,
        public_key_jwk: jwk(&p.public_key),
    }
}

fn credential(p: &PasskeyRecord) -> Result<Credential, OpError> {
    let id = B64.decode(&p.credential_id).map_err(|_| OpError::internal())?;
    Ok(Credential {
        id,
        public_key: p.public_key.clone(),
        sign_count: u32::try_from(p.sign_count).unwrap_or(u32::MAX),
        backup_eligible: p.backup_eligible,
    })
}

fn assertion(a: &PasskeyAssertion) -> Result<Assertion, OpError> {
    Ok(Assertion {
        credential_id: b64("passkey.credential_id", &a.credential_id)?,
        client_data_json: b64("passkey.client_data_json", &a.client_data_json)?,
        authenticator_data: b64("passkey.authenticator_data", &a.authenticator_data)?,
        signature: b64("passkey.signature", &a.signature)?,
    })
}

/// The evidence a review keeps: the assertion's fields, base64url re-encoded (one spelling).
fn evidence(a: &Assertion) -> String {
    json!({
        "credential_id": B64.encode(&a.credential_id),
        "client_data_json": B64.encode(&a.client_data_json),
        "authenticator_data": B64.encode(&a.authenticator_data),
        "signature": B64.encode(&a.signature),
    })
    .to_string()
}

impl Gateway {
    /// The relying party: this console's origin and RP id, or why passkeys are unavailable.
    fn relying_party(&self) -> Result<RelyingParty, OpError> {
        match &self.limits.passkey_rp {
            Ok((rp_id, origin)) => Ok(RelyingParty::new(rp_id, origin)),
            Err(why) => Err(OpError::conflict(why.clone())),
        }
    }

    /// Whether an approval of `amount_minor` asked for under a profile that does (or does not)
    /// require passkeys needs one: the profile, or the amount tier (`passkeys.required_amount`).
    pub(super) fn passkey_required_for(
        &self,
        profile: bool,
        amount_minor: i64,
        currency: crate::domain::money::Currency,
    ) -> bool {
        profile || self.limits.passkey_required_amount_minor.get(&currency).is_some_and(|t| amount_minor >= *t)
    }

    /// The payloads a pending approval's decisions sign (`None` once decided).
    pub(super) fn passkey_payloads(&self, a: &ApprovalRecord, now: UnixSecs) -> Option<PasskeyPayloads> {
        (a.status_at(now) == crate::domain::approval::ApprovalStatus::Pending).then(|| PasskeyPayloads {
            approve: passkey_payload(a, ReviewDecision::Approve),
            reject: passkey_payload(a, ReviewDecision::Reject),
        })
    }

    fn may_decide(&self, op: &Operator) -> Result<(), OpError> {
        if op.scopes.contains(scopes::APPROVE) || op.scopes.contains(scopes::CONFIRM) {
            Ok(())
        } else {
            Err(OpError::forbidden(scopes::APPROVE))
        }
    }

    /// `PublicKeyCredentialCreationOptions` for the signed-in person (ES256, a user-verifying
    /// authenticator, attestation none), with a fresh single-use challenge valid for
    /// [`REGISTRATION_TTL_SECS`]; and under `enrolment`, what must vouch for the new passkey: a
    /// code (`code_required`, the person has no live passkey) or the request options of an
    /// assertion by one of their live passkeys (`publicKey`).
    pub async fn passkey_options(&self, op: &Operator) -> Result<Value, OpError> {
        self.may_decide(op)?;
        let (rp_id, _) = self.limits.passkey_rp.as_ref().map_err(|why| OpError::conflict(why.clone()))?;
        let internal = |error: crate::domain::error::StoreError| {
            tracing::error!(%error, "passkey options failed");
            OpError::internal()
        };
        let now = self.clock.now();
        let challenge: [u8; 32] = rand::random();
        let stored = crate::domain::approval::PasskeyChallenge {
            challenge_sha256: sha256_hex(&challenge),
            owner_iss: op.issuer.clone(),
            owner_sub: op.subject.clone(),
            created_at: now,
            expires_at: now + REGISTRATION_TTL_SECS,
        };
        let max = self.limits.passkey_challenges_per_person_max;
        if self.store.passkey_challenge_put(stored, max).await.map_err(internal)? == ChallengeIssued::TooMany {
            return Err(OpError::new(
                ErrorCode::RateLimited,
                format!(
                    "{max} passkey registrations are under way for you already: finish one or wait {REGISTRATION_TTL_SECS} s"
                ),
            ));
        }
        let user_id = Sha256::digest(format!("{}\0{}", op.issuer, op.subject).as_bytes());
        let live: Vec<Value> = self
            .store
            .passkey_list(&op.issuer, &op.subject)
            .await
            .map_err(internal)?
            .iter()
            .filter(|p| p.revoked_at.is_none())
            .map(|p| json!({"type": "public-key", "id": p.credential_id}))
            .collect();
        let vouch = (!live.is_empty()).then(|| {
            json!({
                "challenge": B64.encode(enrolment_challenge(&challenge)),
                "rpId": rp_id,
                "allowCredentials": live,
                "userVerification": "required",
                "timeout": REGISTRATION_TTL_SECS * 1000,
            })
        });
        Ok(json!({
            "publicKey": {
                "challenge": B64.encode(challenge),
                "rp": {"id": rp_id, "name": "paygate"},
                "user": {"id": B64.encode(&user_id[..16]), "name": op.subject, "displayName": op.subject},
                "pubKeyCredParams": [{"type": "public-key", "alg": -7}],
                "authenticatorSelection": {"residentKey": "preferred", "userVerification": "required"},
                "attestation": "none",
                "timeout": REGISTRATION_TTL_SECS * 1000,
                "excludeCredentials": live,
            },
            "enrolment": {"code_required": vouch.is_none(), "publicKey": vouch},
        }))
    }

    /// Register the passkey a registration ceremony made, vouched for by an enrolment code or an
    /// assertion by one of the person's live passkeys; audited (refusals too) and announced.
    pub async fn passkey_register(&self, op: &Operator, reg: PasskeyRegistration) -> Result<PasskeyView, OpError> {
        self.may_decide(op)?;
        let outcome = self.enrol(op, reg).await;
        let mut d = Decision::new("passkeys.register", if outcome.is_ok() { "registered" } else { "refused" });
        match &outcome {
            Ok((rec, by)) => {
                let vouch = match by {
                    Some(issuer) => format!("an enrolment code issued by {issuer}"),
                    None => "an assertion by a passkey of theirs".to_string(),
                };
                d.detail = Some(format!(
                    "credential {} ({}) of {}, registered with {vouch}",
                    rec.credential_id, rec.name, rec.owner_sub
                ));
            }
            Err(e) => {
                d.code = Some(e.code);
                d.detail = Some(e.message.clone());
            }
        }
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        outcome.map(|(rec, _)| view(&rec))
    }

    /// [`Gateway::passkey_register`]'s checks and the store's one transaction: the registered
    /// credential and who issued the code it was registered with (`None`: a passkey vouched).
    async fn enrol(&self, op: &Operator, reg: PasskeyRegistration) -> Result<(PasskeyRecord, Option<String>), OpError> {
        let rp = self.relying_party()?;
        let (rp_id, origin) = self.limits.passkey_rp.clone().map_err(OpError::conflict)?;
        let now = self.clock.now();
        let challenge = b64("challenge", &reg.challenge)?;
        let stale = || {
            OpError::invalid(
                "the registration challenge is not this person's, or was used or has expired: ask again".into(),
            )
        };
        let name = reg.name.unwrap_or_default().trim().to_string();
        let name = if name.is_empty() { "passkey".to_string() } else { name };
        if name.chars().count() > PASSKEY_NAME_CHARS_MAX || name.chars().any(char::is_control) {
            return Err(OpError::invalid(format!(
                "name is at most {PASSKEY_NAME_CHARS_MAX} characters, without control characters"
            )));
        }
        let code_refused = || {
            OpError::new(
                ErrorCode::EnrolmentCodeInvalid,
                "the enrolment code is not valid: wrong, used, expired or issued for someone else",
            )
        };
        let internal = |error: crate::domain::error::StoreError| {
            tracing::error!(%error, "passkey registration failed");
            OpError::internal()
        };
        let code = match (reg.enrolment_code.as_deref(), reg.passkey.as_ref()) {
            (Some(_), Some(_)) => {
                return Err(OpError::invalid("give an enrolment code or a passkey assertion, not both".into()));
            }
            (None, None) => {
                return Err(OpError::new(
                    ErrorCode::EnrolmentRequired,
                    "registering a passkey needs an enrolment code issued for you by another operator, \
                     or an assertion by one of your live passkeys",
                ));
            }
            (Some(code), None) => {
                let hash = code_hash(code).ok_or_else(code_refused)?;
                let issuer =
                    self.store.passkey_code_issuer(&hash, &op.issuer, &op.subject, now).await.map_err(internal)?;
                Some((hash, issuer.ok_or_else(code_refused)?))
            }
            (None, Some(_)) => None,
        };
        let cred = rp
            .finish_registration(
                &challenge,
                &b64("client_data_json", &reg.client_data_json)?,
                &b64("attestation_object", &reg.attestation_object)?,
            )
            .map_err(|e| OpError::invalid(format!("the passkey registration does not verify: {e}")))?;
        let (proof, code_issued_by) = match (code, reg.passkey.as_ref()) {
            (Some((code_sha256, issuer)), _) => (EnrolmentProof::Code { code_sha256 }, Some(issuer)),
            (None, Some(presented)) => {
                let a = assertion(presented)?;
                let id = B64.encode(&a.credential_id);
                let stored = match self.store.passkey_get(&id).await.map_err(internal)? {
                    Some(p) if p.owner_iss == op.issuer && p.owner_sub == op.subject && p.revoked_at.is_none() => p,
                    _ => return Err(invalid("not a live passkey of yours")),
                };
                if (rp_id.as_str(), origin.as_str()) != (stored.rp_id.as_str(), stored.origin.as_str()) {
                    return Err(invalid(format!(
                        "it was registered for {}: use an enrolment code here",
                        stored.origin
                    )));
                }
                let count = rp
                    .verify_assertion(&enrolment_challenge(&challenge), &credential(&stored)?, &a, Counter::Check)
                    .map_err(|e| match e {
                        crate::passkey::PasskeyError::WrongChallenge => {
                            invalid("it was not signed for this registration's challenge")
                        }
                        other => invalid(other),
                    })?;
                (EnrolmentProof::Passkey { credential_id: id, seen: stored.sign_count, count: i64::from(count) }, None)
            }
            (None, None) => return Err(OpError::internal()),
        };
        let rec = PasskeyRecord {
            credential_id: B64.encode(&cred.id),
            owner_iss: op.issuer.clone(),
            owner_sub: op.subject.clone(),
            public_key: cred.public_key,
            sign_count: i64::from(cred.sign_count),
            backup_eligible: cred.backup_eligible,
            name,
            created_at: now,
            revoked_at: None,
            revoked_by: None,
            rp_id,
            origin,
        };
        let notify = self.notice(crate::domain::webhook::PASSKEY_REGISTERED).messages(json!({
            "owner": rec.owner_sub,
            "owner_issuer": rec.owner_iss,
            "credential_id": rec.credential_id,
            "name": rec.name,
            "registered_at": rfc3339(now),
            "registered_with": if code_issued_by.is_some() { "enrolment_code" } else { "passkey" },
            "code_issued_by": code_issued_by,
            "vouching_credential_id": match &proof {
                EnrolmentProof::Passkey { credential_id, .. } => Some(credential_id.clone()),
                EnrolmentProof::Code { .. } => None,
            },
        }));
        let enrolment = PasskeyEnrolment {
            rec: rec.clone(),
            challenge_sha256: sha256_hex(&challenge),
            proof,
            max: self.limits.passkeys_per_person_max,
            notify,
        };
        match self.store.passkey_enrol(enrolment, now).await.map_err(internal)? {
            PasskeyEnrolled::Inserted { code_issued_by } => Ok((rec, code_issued_by)),
            PasskeyEnrolled::ChallengeSpent => Err(stale()),
            PasskeyEnrolled::CodeRefused => Err(code_refused()),
            PasskeyEnrolled::PasskeyStale => {
                Err(invalid("the passkey was used or revoked meanwhile (a replayed assertion?)"))
            }
            PasskeyEnrolled::Duplicate => Err(OpError::conflict("this passkey is registered already".into())),
            PasskeyEnrolled::TooMany => Err(OpError::conflict(format!(
                "you have {} passkeys already: revoke one first",
                self.limits.passkeys_per_person_max
            ))),
        }
    }

    /// `POST /operator/v1/passkeys/enrolment-codes`: an admin issues a code for another person
    /// (never for themself: no principal acts on itself); audited.
    pub async fn passkey_enrolment_code(
        &self,
        op: &Operator,
        req: EnrolmentCodeRequest,
    ) -> Result<EnrolmentCodeIssued, OpError> {
        if !op.scopes.contains(scopes::ADMIN) {
            return Err(OpError::forbidden(scopes::ADMIN));
        }
        let owner = req.owner;
        valid_owner(&owner)?;
        let target = crate::domain::rules::authority::Target { agent: &owner, user: None };
        if crate::domain::rules::authority::acts_on_itself(&op.subject, target) {
            let mut d = Decision::new("passkeys.enrolment_code", "refused");
            d.code = Some(ErrorCode::SelfReview);
            d.detail = Some(format!("for {owner}: nobody issues their own enrolment code"));
            self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
            return Err(OpError::self_review(
                "another operator must issue your enrolment code: nobody enrols their own passkey on their own say"
                    .into(),
            ));
        }
        self.issue_enrolment_code(&op.issuer, &owner, &op.subject, &op.correlation_id).await
    }

    /// An enrolment code for `owner` under `owner_iss`, issued by `issued_by` (an operator's
    /// subject, or `cli:<user>` at the box); stored as its hash, audited under the issuer's name.
    /// The code itself is returned once and never logged or audited.
    pub async fn issue_enrolment_code(
        &self,
        owner_iss: &str,
        owner: &str,
        issued_by: &str,
        correlation_id: &str,
    ) -> Result<EnrolmentCodeIssued, OpError> {
        valid_owner(owner)?;
        let now = self.clock.now();
        let bytes: [u8; ENROLMENT_CODE_BYTES] = rand::random();
        let digits = crate::domain::ids::hex(&bytes);
        let code =
            digits.as_bytes().chunks(4).map(|c| String::from_utf8_lossy(c).into_owned()).collect::<Vec<_>>().join("-");
        let expires_at = now + self.limits.passkey_enrolment_code_ttl_secs;
        let rec = EnrolmentCode {
            code_sha256: crate::domain::ids::hex(&Sha256::digest(digits.as_bytes())),
            owner_iss: owner_iss.to_string(),
            owner_sub: owner.to_string(),
            issued_by: issued_by.to_string(),
            issued_at: now,
            expires_at,
        };
        self.store.passkey_code_put(rec).await.map_err(|error| {
            tracing::error!(%error, "enrolment code store failed");
            OpError::internal()
        })?;
        let mut d = Decision::new("passkeys.enrolment_code", "issued");
        d.detail = Some(format!("for {owner}, by {issued_by}, until {}", rfc3339(expires_at)));
        self.audit_as(owner_iss, issued_by, correlation_id, d).await;
        Ok(EnrolmentCodeIssued {
            code,
            owner: owner.to_string(),
            issuer: owner_iss.to_string(),
            issued_by: issued_by.to_string(),
            expires_at: rfc3339(expires_at),
        })
    }

    /// The signed-in person's passkeys, newest first (revoked ones too).
    pub async fn passkeys(&self, op: &Operator) -> Result<Vec<PasskeyView>, OpError> {
        self.may_decide(op)?;
        let list = self.store.passkey_list(&op.issuer, &op.subject).await.map_err(|error| {
            tracing::error!(%error, "passkey list failed");
            OpError::internal()
        })?;
        Ok(list.iter().map(view).collect())
    }

    /// Revoke a passkey: its owner's own, or anyone's by an admin (a lost device). Its stored
    /// assertions stay verifiable; it signs nothing more. Audited.
    pub async fn passkey_revoke(&self, op: &Operator, credential_id: &str) -> Result<PasskeyView, OpError> {
        let internal = |error: crate::domain::error::StoreError| {
            tracing::error!(%error, "passkey revoke failed");
            OpError::internal()
        };
        let rec = self.store.passkey_get(credential_id).await.map_err(internal)?.ok_or(OpError::missing("passkey"))?;
        let own = rec.owner_iss == op.issuer && rec.owner_sub == op.subject;
        if !(own && self.may_decide(op).is_ok() || op.scopes.contains(scopes::ADMIN)) {
            // Someone else's passkey does not exist for this person.
            return Err(OpError::missing("passkey"));
        }
        let now = self.clock.now();
        if !self.store.passkey_revoke(credential_id, &op.subject, now).await.map_err(internal)? {
            return Err(OpError::conflict("the passkey is revoked already".into()));
        }
        let mut d = Decision::new("passkeys.revoke", "revoked");
        d.detail = Some(format!("credential {credential_id} ({}) of {}", rec.name, rec.owner_sub));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        Ok(view(&PasskeyRecord { revoked_at: Some(now), revoked_by: Some(op.subject.clone()), ..rec }))
    }

    /// The evidence a decision on pending approval `rec` carries: `None` without a passkey (refused
    /// when `rec` requires one), else the verified assertion (the person's own live credential, the
    /// challenge of exactly this approval and decision, user verified, the counter moved on).
    pub(super) async fn passkey_evidence(
        &self,
        op: &Operator,
        rec: &ApprovalRecord,
        decision: ReviewDecision,
        presented: Option<&PasskeyAssertion>,
    ) -> Result<Option<String>, OpError> {
        let Some(presented) = presented else {
            if rec.passkey_required {
                return Err(OpError::new(
                    ErrorCode::PasskeyRequired,
                    "this approval is decided only with a passkey: sign the decision with yours",
                ));
            }
            return Ok(None);
        };
        let rp = self.relying_party()?;
        let a = assertion(presented)?;
        let id = B64.encode(&a.credential_id);
        let internal = |error: crate::domain::error::StoreError| {
            tracing::error!(%error, "passkey read failed");
            OpError::internal()
        };
        let stored = match self.store.passkey_get(&id).await.map_err(internal)? {
            Some(p) if p.owner_iss == op.issuer && p.owner_sub == op.subject && p.revoked_at.is_none() => p,
            _ => return Err(invalid("not a live passkey of yours")),
        };
        let here = self.limits.passkey_rp.as_ref().map_err(|why| OpError::conflict(why.clone()))?;
        if (here.0.as_str(), here.1.as_str()) != (stored.rp_id.as_str(), stored.origin.as_str()) {
            return Err(invalid(format!("it was registered for {}: register a passkey here", stored.origin)));
        }
        let cred = credential(&stored)?;
        let count =
            rp.verify_assertion(&passkey_challenge(rec, decision), &cred, &a, Counter::Check).map_err(|e| match e {
                crate::passkey::PasskeyError::WrongChallenge => {
                    invalid("it was signed for another approval, intent or decision")
                }
                other => invalid(other),
            })?;
        if !self.store.passkey_count(&id, stored.sign_count, i64::from(count)).await.map_err(internal)? {
            return Err(invalid("the passkey was used meanwhile (a replayed assertion?)"));
        }
        Ok(Some(evidence(&a)))
    }

    /// Every passkey-signed review of an approval, verified again from the stored credentials'
    /// public keys (revoked ones too) against the challenge recomputed from the stored intent,
    /// and whether the mandate names each assertion's hash.
    pub async fn approval_passkeys(&self, op: &Operator, approval_id: &str) -> Result<Value, OpError> {
        if !(op.scopes.contains(scopes::AUDIT) || op.scopes.contains(scopes::APPROVE)) {
            return Err(OpError::forbidden(scopes::AUDIT));
        }
        let internal = |error: crate::domain::error::StoreError| {
            tracing::error!(%error, "approval read failed");
            OpError::internal()
        };
        let id = ApprovalId::parse(approval_id).map_err(|_| OpError::not_found())?;
        let rec = self.store.approval_get(&id).await.map_err(internal)?.ok_or(OpError::not_found())?;
        let mandate_passkeys: Option<Vec<String>> = match (&rec.mandate, rec.decided_at) {
            (Some(jws), Some(at)) => self.mandates.verify(jws, at).ok().and_then(|c| c.passkeys),
            _ => None,
        };
        let mut reviews = Vec::new();
        for r in &rec.reviews {
            let Some(ev) = &r.passkey else { continue };
            let digest = passkey_evidence_digest(ev);
            let parsed: Option<PasskeyAssertion> = serde_json::from_str(ev).ok();
            // Against the relying party the credential was registered for, whatever the gateway's
            // public URL is now.
            let verdict = match parsed {
                None => Err("the stored assertion is malformed".to_string()),
                Some(p) => match (assertion(&p), self.store.passkey_get(&p.credential_id).await) {
                    (Ok(a), Ok(Some(stored)))
                        if stored.owner_iss == r.reviewer_iss && stored.owner_sub == r.reviewer_sub =>
                    {
                        let rp = RelyingParty::new(&stored.rp_id, &stored.origin);
                        match credential(&stored) {
                            Ok(cred) => rp
                                .verify_assertion(&passkey_challenge(&rec, r.decision), &cred, &a, Counter::Ignore)
                                .map(|_| ())
                                .map_err(|e| e.to_string()),
                            Err(_) => Err("the stored credential is malformed".into()),
                        }
                    }
                    (_, Err(e)) => return Err(internal(e)),
                    _ => Err("no credential of this reviewer has this id".to_string()),
                },
            };
            reviews.push(json!({
                "reviewer": r.reviewer_sub,
                "decision": r.decision.as_str(),
                "at": rfc3339(r.at),
                "credential_id": serde_json::from_str::<Value>(ev).ok().and_then(|v| v.get("credential_id").cloned()),
                "assertion_sha256": digest,
                "verified": verdict.is_ok(),
                "error": verdict.err(),
                "in_mandate": mandate_passkeys.as_ref().is_some_and(|m| m.contains(&digest)),
                "assertion": serde_json::from_str::<Value>(ev).unwrap_or(Value::Null),
            }));
        }
        Ok(json!({
            "approval_id": rec.id.as_str(),
            "passkey_required": rec.passkey_required,
            "mandate_id": rec.mandate_id,
            "mandate_passkeys": mandate_passkeys.unwrap_or_default(),
            "reviews": reviews,
        }))
    }
}

impl Gateway {
    /// The passkey evidence a decision on approval `id` carries ([`Gateway::passkey_evidence`]),
    /// checked while it is pending; a missing, decided or expired approval answers as such in the
    /// review itself.
    pub(super) async fn decision_evidence(
        &self,
        op: &Operator,
        id: &ApprovalId,
        decision: ReviewDecision,
        presented: Option<&PasskeyAssertion>,
        now: UnixSecs,
    ) -> Result<Option<String>, OpError> {
        let rec = match self.store.approval_get(id).await {
            Ok(Some(rec)) if rec.status_at(now) == crate::domain::approval::ApprovalStatus::Pending => rec,
            Ok(_) => return Ok(None),
            Err(error) => {
                tracing::error!(%error, "approval read failed");
                return Err(OpError::internal());
            }
        };
        // The passkey tier in force now, if stricter than when it was asked for.
        let rec = self.judged_now(rec);
        self.passkey_evidence(op, &rec, decision, presented).await
    }
}

/// The owner of an enrolment code is a token subject, so it meets the rule every subject the
/// gateway keys on meets (`domain::principal::valid_subject`): the API and the CLI both pass here.
fn valid_owner(owner: &str) -> Result<(), OpError> {
    if crate::domain::principal::valid_subject(owner) {
        return Ok(());
    }
    let max = crate::auth::jwt::SUBJECT_BYTES_MAX;
    Err(OpError::invalid(format!(
        "owner must be 1 to {max} bytes, without control, bidirectional or invisible characters"
    )))
}
