//! Passkeys: the people who decide approvals register WebAuthn credentials (ES256, from the
//! console) and sign their decisions with them. The challenge of a decision is the SHA-256 of
//! exactly what the mandate will pin (`domain::approval::passkey_payload`), so an assertion made for
//! another amount, payee, approval or decision never verifies; the assertion is stored with the
//! review, its hash goes into the mandate, and anyone can verify it again later from the stored
//! public key (`approval_passkeys`). An approval whose agent's profile or amount tier requires a
//! passkey refuses a plain click.
//!
//! Registration challenges are stateless: the expiry and an HMAC (a subkey of the idempotency
//! secret, which replicas share) over the person and the expiry; the credential's id is unique, so
//! a ceremony answered twice registers once.

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use hmac::{Hmac, Mac};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};
use sha2::{Digest, Sha256};

use super::approvals::{OpError, Operator};
use super::{Decision, Gateway};
use crate::catalogue::scopes;
use crate::clock::{UnixSecs, rfc3339};
use crate::domain::approval::{ApprovalRecord, PasskeyInsert, PasskeyRecord, ReviewDecision};
use crate::domain::approval::{passkey_challenge, passkey_evidence_digest, passkey_payload};
use crate::domain::ids::ApprovalId;
use crate::error::ErrorCode;
use crate::passkey::{Assertion, Counter, Credential, RelyingParty};

/// How long a registration challenge may be answered, in seconds (WebAuthn's own ceremony timeout
/// is at most this).
pub const REGISTRATION_TTL_SECS: i64 = 300;
/// Longest passkey name, in characters.
pub const PASSKEY_NAME_CHARS_MAX: usize = 64;
const REGISTRATION_LABEL: &str = "passkey registration challenge v1";

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

    fn registration_mac(&self, op: &Operator, exp: UnixSecs) -> [u8; 32] {
        let key = self.keys.subkey(REGISTRATION_LABEL);
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&key).unwrap_or_else(|_| unreachable!("any key length"));
        for part in [op.issuer.as_bytes(), b"\0", op.subject.as_bytes(), b"\0", &exp.to_be_bytes()] {
            mac.update(part);
        }
        mac.finalize().into_bytes().into()
    }

    fn may_decide(&self, op: &Operator) -> Result<(), OpError> {
        if op.scopes.contains(scopes::APPROVE) || op.scopes.contains(scopes::CONFIRM) {
            Ok(())
        } else {
            Err(OpError::forbidden(scopes::APPROVE))
        }
    }

    /// `PublicKeyCredentialCreationOptions` for the signed-in person (ES256, a user-verifying
    /// authenticator, attestation none), with a challenge valid for [`REGISTRATION_TTL_SECS`].
    pub async fn passkey_options(&self, op: &Operator) -> Result<Value, OpError> {
        self.may_decide(op)?;
        let (rp_id, _) = self.limits.passkey_rp.as_ref().map_err(|why| OpError::conflict(why.clone()))?;
        let exp = self.clock.now() + REGISTRATION_TTL_SECS;
        let mut challenge = exp.to_be_bytes().to_vec();
        challenge.extend_from_slice(&self.registration_mac(op, exp));
        let user_id = Sha256::digest(format!("{}\0{}", op.issuer, op.subject).as_bytes());
        let exclude: Vec<Value> = self
            .store
            .passkey_list(&op.issuer, &op.subject)
            .await
            .map_err(|error| {
                tracing::error!(%error, "passkey list failed");
                OpError::internal()
            })?
            .iter()
            .filter(|p| p.revoked_at.is_none())
            .map(|p| json!({"type": "public-key", "id": p.credential_id}))
            .collect();
        Ok(json!({"publicKey": {
            "challenge": B64.encode(&challenge),
            "rp": {"id": rp_id, "name": "paygate"},
            "user": {"id": B64.encode(&user_id[..16]), "name": op.subject, "displayName": op.subject},
            "pubKeyCredParams": [{"type": "public-key", "alg": -7}],
            "authenticatorSelection": {"residentKey": "preferred", "userVerification": "required"},
            "attestation": "none",
            "timeout": REGISTRATION_TTL_SECS * 1000,
            "excludeCredentials": exclude,
        }}))
    }

    /// Register the passkey a registration ceremony made; audited.
    pub async fn passkey_register(&self, op: &Operator, reg: PasskeyRegistration) -> Result<PasskeyView, OpError> {
        self.may_decide(op)?;
        let rp = self.relying_party()?;
        let (rp_id, origin) = self.limits.passkey_rp.clone().map_err(OpError::conflict)?;
        let now = self.clock.now();
        let challenge = b64("challenge", &reg.challenge)?;
        let stale =
            || OpError::invalid("the registration challenge is not this person's, or has expired: ask again".into());
        let (exp, mac) = challenge.split_at_checked(8).ok_or_else(stale)?;
        let exp = i64::from_be_bytes(exp.try_into().map_err(|_| stale())?);
        let expected = self.registration_mac(op, exp);
        if exp < now || exp > now + REGISTRATION_TTL_SECS || !constant_time_eq(mac, &expected) {
            return Err(stale());
        }
        let name = reg.name.unwrap_or_default().trim().to_string();
        let name = if name.is_empty() { "passkey".to_string() } else { name };
        if name.chars().count() > PASSKEY_NAME_CHARS_MAX || name.chars().any(char::is_control) {
            return Err(OpError::invalid(format!(
                "name is at most {PASSKEY_NAME_CHARS_MAX} characters, without control characters"
            )));
        }
        let cred = rp
            .finish_registration(
                &challenge,
                &b64("client_data_json", &reg.client_data_json)?,
                &b64("attestation_object", &reg.attestation_object)?,
            )
            .map_err(|e| OpError::invalid(format!("the passkey registration does not verify: {e}")))?;
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
        let outcome = self.store.passkey_insert(rec.clone(), self.limits.passkeys_per_person_max).await;
        let refused = match outcome {
            Ok(PasskeyInsert::Inserted) => None,
            Ok(PasskeyInsert::Duplicate) => Some(OpError::conflict("this passkey is registered already".into())),
            Ok(PasskeyInsert::TooMany) => Some(OpError::conflict(format!(
                "you have {} passkeys already: revoke one first",
                self.limits.passkeys_per_person_max
            ))),
            Err(error) => {
                tracing::error!(%error, "passkey insert failed");
                return Err(OpError::internal());
            }
        };
        let mut d = Decision::new("passkeys.register", if refused.is_none() { "registered" } else { "refused" });
        d.detail = Some(format!("credential {} ({})", rec.credential_id, rec.name));
        self.audit_as(&op.issuer, &op.subject, &op.correlation_id, d).await;
        match refused {
            Some(e) => Err(e),
            None => Ok(view(&rec)),
        }
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

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
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
        self.passkey_evidence(op, &rec, decision, presented).await
    }
}
