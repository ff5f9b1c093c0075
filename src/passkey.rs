//! A WebAuthn relying party, the part a server verifies (Level 3, §7.1 registration and §7.2
//! authentication), for passkey-signed approvals. ES256 (P-256) credentials, attestation "none".
//!
//! The challenge is the caller's: for an approval it is the SHA-256 of the exact intent the mandate
//! will pin (with a server nonce), so the signature binds the person's decision to what they saw,
//! and a stored assertion can be verified again later from the credential's public key alone
//! (`verify_assertion` with `Counter::Ignore`). webauthn-rs is not used: 0.5 needs the system
//! OpenSSL and neither 0.5 nor 0.6 lets the caller choose the challenge (kanidm/webauthn-rs#549).
//!
//! Not wired to the approval routes yet (issue 31: registration, storage and the console are next).

use base64::Engine;
use p256::ecdsa::signature::Verifier;
use sha2::{Digest, Sha256};

/// Longest credential id accepted (WebAuthn: 1023 bytes).
pub const CREDENTIAL_ID_BYTES_MAX: usize = 1023;
/// Longest clientDataJSON, authenticatorData or attestationObject accepted, in bytes.
pub const CEREMONY_BYTES_MAX: usize = 16 * 1024;

const UP: u8 = 0x01;
const UV: u8 = 0x04;
const BE: u8 = 0x08;
const BS: u8 = 0x10;
const AT: u8 = 0x40;

/// Why a ceremony was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PasskeyError {
    #[error("malformed {0}")]
    Malformed(&'static str),
    #[error("clientDataJSON type is not {0}")]
    WrongType(&'static str),
    #[error("the challenge is not the one asked for")]
    WrongChallenge,
    #[error("the origin is not this console's")]
    WrongOrigin,
    #[error("made in a cross-origin frame")]
    CrossOrigin,
    #[error("made for another relying party")]
    WrongRelyingParty,
    #[error("the user was not present")]
    NotPresent,
    #[error("the user was not verified")]
    NotVerified,
    #[error("unsupported credential: {0}")]
    Unsupported(&'static str),
    #[error("the signature does not verify")]
    BadSignature,
    #[error("the signature counter went backwards: a cloned authenticator?")]
    CounterRegressed,
}

/// A registered credential: what is stored (the public key never changes; the counter does).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Credential {
    pub id: Vec<u8>,
    /// SEC1 uncompressed P-256 point (65 bytes).
    pub public_key: Vec<u8>,
    pub sign_count: u32,
    pub backup_eligible: bool,
}

/// An assertion as the browser returns it (`navigator.credentials.get`), raw bytes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Assertion {
    pub credential_id: Vec<u8>,
    pub client_data_json: Vec<u8>,
    pub authenticator_data: Vec<u8>,
    /// DER-encoded ECDSA signature.
    pub signature: Vec<u8>,
}

/// Whether the signature counter is checked (a live approval) or not (verifying a stored one again).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter {
    Check,
    Ignore,
}

/// The relying party: this console's RP id (a host name) and exact origin.
#[derive(Debug, Clone)]
pub struct RelyingParty {
    origin: String,
    rp_id_hash: [u8; 32],
}

struct AuthData<'a> {
    flags: u8,
    sign_count: u32,
    /// Present when AT is set: (credential id, COSE key bytes).
    attested: Option<(&'a [u8], &'a [u8])>,
}

impl RelyingParty {
    pub fn new(rp_id: &str, origin: &str) -> Self {
        RelyingParty { origin: origin.to_string(), rp_id_hash: Sha256::digest(rp_id.as_bytes()).into() }
    }

    /// §7.1: a new credential from `navigator.credentials.create` (attestation "none") answering
    /// `challenge`. User verification is required.
    pub fn finish_registration(
        &self,
        challenge: &[u8],
        client_data_json: &[u8],
        attestation_object: &[u8],
    ) -> Result<Credential, PasskeyError> {
        self.client_data(client_data_json, "webauthn.create", challenge)?;
        if attestation_object.len() > CEREMONY_BYTES_MAX {
            return Err(PasskeyError::Malformed("attestationObject"));
        }
        let auth_data = attestation_auth_data(attestation_object)?;
        let parsed = self.auth_data(auth_data)?;
        let (id, cose) = parsed.attested.ok_or(PasskeyError::Malformed("authenticatorData: no credential"))?;
        Ok(Credential {
            id: id.to_vec(),
            public_key: es256_public_key(cose)?,
            sign_count: parsed.sign_count,
            backup_eligible: parsed.flags & BE != 0,
        })
    }

    /// §7.2: an assertion from `navigator.credentials.get` by `credential` answering `challenge`,
    /// user verified. Returns the new signature counter (to store, with `Counter::Check`).
    pub fn verify_assertion(
        &self,
        challenge: &[u8],
        credential: &Credential,
        a: &Assertion,
        counter: Counter,
    ) -> Result<u32, PasskeyError> {
        if a.credential_id != credential.id {
            return Err(PasskeyError::Malformed("credential id"));
        }
        self.client_data(&a.client_data_json, "webauthn.get", challenge)?;
        let parsed = self.auth_data(&a.authenticator_data)?;
        if (parsed.flags & BE != 0) != credential.backup_eligible {
            return Err(PasskeyError::Unsupported("backup eligibility changed"));
        }
        let key = p256::ecdsa::VerifyingKey::from_sec1_bytes(&credential.public_key)
            .map_err(|_| PasskeyError::Malformed("stored public key"))?;
        let signature =
            p256::ecdsa::Signature::from_der(&a.signature).map_err(|_| PasskeyError::Malformed("signature"))?;
        let mut signed = a.authenticator_data.clone();
        signed.extend_from_slice(&Sha256::digest(&a.client_data_json));
        key.verify(&signed, &signature).map_err(|_| PasskeyError::BadSignature)?;
        if counter == Counter::Check
            && (parsed.sign_count != 0 || credential.sign_count != 0)
            && parsed.sign_count <= credential.sign_count
        {
            return Err(PasskeyError::CounterRegressed);
        }
        Ok(parsed.sign_count)
    }

    /// clientDataJSON: type, challenge, exact origin, not cross-origin.
    fn client_data(&self, json: &[u8], kind: &'static str, challenge: &[u8]) -> Result<(), PasskeyError> {
        if json.len() > CEREMONY_BYTES_MAX {
            return Err(PasskeyError::Malformed("clientDataJSON"));
        }
        let c: serde_json::Value =
            serde_json::from_slice(json).map_err(|_| PasskeyError::Malformed("clientDataJSON"))?;
        if c["type"].as_str() != Some(kind) {
            return Err(PasskeyError::WrongType(kind));
        }
        let expected = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(challenge);
        if c["challenge"].as_str() != Some(expected.as_str()) {
            return Err(PasskeyError::WrongChallenge);
        }
        if c["origin"].as_str() != Some(self.origin.as_str()) {
            return Err(PasskeyError::WrongOrigin);
        }
        if c["crossOrigin"].as_bool() == Some(true) || c.get("topOrigin").is_some() {
            return Err(PasskeyError::CrossOrigin);
        }
        Ok(())
    }

    /// authenticatorData: RP id hash, UP and UV, BE/BS consistent, the attested credential.
    fn auth_data<'a>(&self, d: &'a [u8]) -> Result<AuthData<'a>, PasskeyError> {
        if d.len() < 37 || d.len() > CEREMONY_BYTES_MAX {
            return Err(PasskeyError::Malformed("authenticatorData"));
        }
        if d[..32] != self.rp_id_hash {
            return Err(PasskeyError::WrongRelyingParty);
        }
        let flags = d[32];
        if flags & UP == 0 {
            return Err(PasskeyError::NotPresent);
        }
        if flags & UV == 0 {
            return Err(PasskeyError::NotVerified);
        }
        if flags & BS != 0 && flags & BE == 0 {
            return Err(PasskeyError::Malformed("authenticatorData: backed up but not eligible"));
        }
        let sign_count = u32::from_be_bytes([d[33], d[34], d[35], d[36]]);
        let attested = match flags & AT {
            0 => None,
            _ => {
                let rest = &d[37..];
                if rest.len() < 18 {
                    return Err(PasskeyError::Malformed("attested credential data"));
                }
                let len = u16::from_be_bytes([rest[16], rest[17]]) as usize;
                if len == 0 || len > CREDENTIAL_ID_BYTES_MAX || rest.len() < 18 + len {
                    return Err(PasskeyError::Malformed("credential id"));
                }
                let id = &rest[18..18 + len];
                let key = &rest[18 + len..];
                // The COSE key is one CBOR item; extensions may follow it.
                let mut dec = minicbor::Decoder::new(key);
                dec.skip().map_err(|_| PasskeyError::Malformed("credential public key"))?;
                Some((id, &key[..dec.position()]))
            }
        };
        Ok(AuthData { flags, sign_count, attested })
    }
}

/// `authData` of an attestationObject `{fmt: "none", attStmt: {}, authData}`.
fn attestation_auth_data(obj: &[u8]) -> Result<&[u8], PasskeyError> {
    let bad = |_| PasskeyError::Malformed("attestationObject");
    let mut d = minicbor::Decoder::new(obj);
    let n = d.map().map_err(bad)?.ok_or(PasskeyError::Malformed("attestationObject"))?;
    let (mut fmt, mut auth_data, mut statement_empty) = (None, None, false);
    for _ in 0..n {
        match d.str().map_err(bad)? {
            "fmt" => fmt = Some(d.str().map_err(bad)?),
            "authData" => auth_data = Some(d.bytes().map_err(bad)?),
            "attStmt" => statement_empty = d.map().map_err(bad)? == Some(0),
            _ => d.skip().map_err(bad)?,
        }
    }
    if fmt != Some("none") || !statement_empty {
        return Err(PasskeyError::Unsupported("attestation other than \"none\""));
    }
    auth_data.ok_or(PasskeyError::Malformed("attestationObject: no authData"))
}

/// The SEC1 point of a COSE EC2 key `{1: 2, 3: -7, -1: 1, -2: x, -3: y}` (ES256 on P-256).
fn es256_public_key(cose: &[u8]) -> Result<Vec<u8>, PasskeyError> {
    let bad = |_| PasskeyError::Malformed("COSE key");
    let mut d = minicbor::Decoder::new(cose);
    let n = d.map().map_err(bad)?.ok_or(PasskeyError::Malformed("COSE key"))?;
    let (mut kty, mut alg, mut crv, mut x, mut y) = (None, None, None, None, None);
    for _ in 0..n {
        match d.i64().map_err(bad)? {
            1 => kty = Some(d.i64().map_err(bad)?),
            3 => alg = Some(d.i64().map_err(bad)?),
            -1 => crv = Some(d.i64().map_err(bad)?),
            -2 => x = Some(d.bytes().map_err(bad)?),
            -3 => y = Some(d.bytes().map_err(bad)?),
            _ => d.skip().map_err(bad)?,
        }
    }
    match (kty, alg, crv, x, y) {
        (Some(2), Some(-7), Some(1), Some(x), Some(y)) if x.len() == 32 && y.len() == 32 => {
            let mut point = vec![0x04];
            point.extend_from_slice(x);
            point.extend_from_slice(y);
            p256::ecdsa::VerifyingKey::from_sec1_bytes(&point).map_err(|_| PasskeyError::Malformed("COSE key"))?;
            Ok(point)
        }
        _ => Err(PasskeyError::Unsupported("only ES256 (P-256) credentials")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use p256::ecdsa::signature::Signer;

    const RP: &str = "console.example";
    const ORIGIN: &str = "https://console.example";

    /// A software authenticator: a P-256 key and a counter.
    struct Authenticator {
        key: p256::ecdsa::SigningKey,
        id: Vec<u8>,
        count: u32,
    }

    fn cbor_head(major: u8, n: u64, out: &mut Vec<u8>) {
        match n {
            0..=23 => out.push(major << 5 | n as u8),
            24..=255 => out.extend([major << 5 | 24, n as u8]),
            _ => {
                out.push(major << 5 | 25);
                out.extend((n as u16).to_be_bytes());
            }
        }
    }
    fn int(i: i64, out: &mut Vec<u8>) {
        if i >= 0 { cbor_head(0, i as u64, out) } else { cbor_head(1, (-1 - i) as u64, out) }
    }
    fn bytes(b: &[u8], out: &mut Vec<u8>) {
        cbor_head(2, b.len() as u64, out);
        out.extend_from_slice(b);
    }
    fn text(s: &str, out: &mut Vec<u8>) {
        cbor_head(3, s.len() as u64, out);
        out.extend_from_slice(s.as_bytes());
    }

    impl Authenticator {
        fn new(seed: u8) -> Self {
            let key = p256::ecdsa::SigningKey::from_slice(&[seed; 32]).unwrap();
            Authenticator { key, id: vec![seed; 16], count: 0 }
        }

        fn cose_key(&self) -> Vec<u8> {
            // SEC1 uncompressed: 0x04 ‖ x ‖ y.
            let sec1 = self.key.verifying_key().to_sec1_bytes();
            let (x, y) = (&sec1[1..33], &sec1[33..65]);
            let mut out = Vec::new();
            cbor_head(5, 5, &mut out);
            for (k, v) in [(1, 2), (3, -7), (-1, 1)] {
                int(k, &mut out);
                int(v, &mut out);
            }
            int(-2, &mut out);
            bytes(x, &mut out);
            int(-3, &mut out);
            bytes(y, &mut out);
            out
        }

        fn auth_data(&self, rp: &str, flags: u8, attested: bool) -> Vec<u8> {
            let mut d = Sha256::digest(rp.as_bytes()).to_vec();
            d.push(flags | if attested { AT } else { 0 });
            d.extend(self.count.to_be_bytes());
            if attested {
                d.extend([0u8; 16]);
                d.extend((self.id.len() as u16).to_be_bytes());
                d.extend(&self.id);
                d.extend(self.cose_key());
            }
            d
        }

        fn client_data(kind: &str, challenge: &[u8], origin: &str) -> Vec<u8> {
            let c = base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(challenge);
            format!(r#"{{"type":"{kind}","challenge":"{c}","origin":"{origin}","crossOrigin":false}}"#).into_bytes()
        }

        fn register(&self, challenge: &[u8]) -> (Vec<u8>, Vec<u8>) {
            let mut obj = Vec::new();
            cbor_head(5, 3, &mut obj);
            text("fmt", &mut obj);
            text("none", &mut obj);
            text("attStmt", &mut obj);
            cbor_head(5, 0, &mut obj);
            text("authData", &mut obj);
            bytes(&self.auth_data(RP, UP | UV, true), &mut obj);
            (Self::client_data("webauthn.create", challenge, ORIGIN), obj)
        }

        fn assert(&mut self, challenge: &[u8]) -> Assertion {
            self.count += 1;
            self.sign(Self::client_data("webauthn.get", challenge, ORIGIN), self.auth_data(RP, UP | UV, false))
        }

        fn sign(&self, client_data_json: Vec<u8>, authenticator_data: Vec<u8>) -> Assertion {
            let mut signed = authenticator_data.clone();
            signed.extend(Sha256::digest(&client_data_json));
            let sig: p256::ecdsa::Signature = self.key.sign(&signed);
            Assertion {
                credential_id: self.id.clone(),
                client_data_json,
                authenticator_data,
                signature: sig.to_der().as_bytes().to_vec(),
            }
        }
    }

    fn registered(a: &Authenticator) -> Credential {
        let rp = RelyingParty::new(RP, ORIGIN);
        let (cd, obj) = a.register(b"registration challenge");
        rp.finish_registration(b"registration challenge", &cd, &obj).unwrap()
    }

    #[test]
    fn a_registered_passkey_signs_an_approval_of_exactly_its_intent() {
        let rp = RelyingParty::new(RP, ORIGIN);
        let mut a = Authenticator::new(7);
        let cred = registered(&a);
        assert_eq!(cred.id, a.id);
        assert_eq!(cred.public_key.len(), 65);
        let intent = Sha256::digest(b"{\"amount_minor\":\"500000\",...}").to_vec();
        let assertion = a.assert(&intent);
        assert_eq!(rp.verify_assertion(&intent, &cred, &assertion, Counter::Check), Ok(1));
        // Made for another intent (another amount): refused.
        let other = Sha256::digest(b"{\"amount_minor\":\"5000000\",...}").to_vec();
        assert_eq!(rp.verify_assertion(&other, &cred, &assertion, Counter::Check), Err(PasskeyError::WrongChallenge));
        // Replayed against the stored counter: refused live, still verifiable later.
        let stored = Credential { sign_count: 1, ..cred.clone() };
        assert_eq!(
            rp.verify_assertion(&intent, &stored, &assertion, Counter::Check),
            Err(PasskeyError::CounterRegressed)
        );
        assert_eq!(rp.verify_assertion(&intent, &stored, &assertion, Counter::Ignore), Ok(1));
        // Another authenticator's signature over the same bytes.
        let forged = Assertion {
            signature: Authenticator::new(9)
                .sign(assertion.client_data_json.clone(), assertion.authenticator_data.clone())
                .signature,
            ..assertion.clone()
        };
        assert_eq!(rp.verify_assertion(&intent, &cred, &forged, Counter::Ignore), Err(PasskeyError::BadSignature));
    }

    #[test]
    fn every_ceremony_check_refuses() {
        let rp = RelyingParty::new(RP, ORIGIN);
        let a = Authenticator::new(7);
        let cred = registered(&a);
        let ch = b"challenge".to_vec();
        let cd = |kind: &str, origin: &str| Authenticator::client_data(kind, &ch, origin);
        let cases = [
            (
                "type",
                cd("webauthn.create", ORIGIN),
                a.auth_data(RP, UP | UV, false),
                PasskeyError::WrongType("webauthn.get"),
            ),
            (
                "origin",
                cd("webauthn.get", "https://evil.example"),
                a.auth_data(RP, UP | UV, false),
                PasskeyError::WrongOrigin,
            ),
            (
                "rp",
                cd("webauthn.get", ORIGIN),
                a.auth_data("evil.example", UP | UV, false),
                PasskeyError::WrongRelyingParty,
            ),
            ("up", cd("webauthn.get", ORIGIN), a.auth_data(RP, UV, false), PasskeyError::NotPresent),
            ("uv", cd("webauthn.get", ORIGIN), a.auth_data(RP, UP, false), PasskeyError::NotVerified),
        ];
        for (what, client_data, auth_data, expected) in cases {
            let assertion = a.sign(client_data, auth_data);
            assert_eq!(rp.verify_assertion(&ch, &cred, &assertion, Counter::Ignore), Err(expected), "{what}");
        }
        let cross = br#"{"type":"webauthn.get","challenge":"Y2hhbGxlbmdl","origin":"https://console.example","crossOrigin":true}"#;
        let assertion = a.sign(cross.to_vec(), a.auth_data(RP, UP | UV, false));
        assert_eq!(rp.verify_assertion(&ch, &cred, &assertion, Counter::Ignore), Err(PasskeyError::CrossOrigin));
        // Registration: the challenge and the attestation format.
        let (cd, obj) = a.register(b"one");
        assert_eq!(rp.finish_registration(b"two", &cd, &obj), Err(PasskeyError::WrongChallenge));
        let packed = [obj[..2].to_vec(), b"fmt".to_vec()].concat();
        assert!(rp.finish_registration(b"one", &cd, &packed).is_err());
        let mut other_fmt = obj.clone();
        let at = other_fmt.windows(4).position(|w| w == b"none").unwrap();
        other_fmt[at..at + 4].copy_from_slice(b"nonf");
        assert_eq!(
            rp.finish_registration(b"one", &cd, &other_fmt),
            Err(PasskeyError::Unsupported("attestation other than \"none\""))
        );
        // Garbage never panics.
        for junk in [&b""[..], b"\xff", b"\xa1\x63fmt", &[0xbf; 64]] {
            assert!(rp.finish_registration(b"one", &cd, junk).is_err());
        }
    }

    proptest::proptest! {
        /// Whatever bytes arrive — a valid ceremony with any byte changed, or anything at all —
        /// verification answers without a panic, and a changed assertion never verifies.
        #[test]
        fn altered_or_arbitrary_ceremonies_never_panic_and_never_verify(
            at in 0usize..4096, to in proptest::prelude::any::<u8>(),
            junk in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..400),
        ) {
            let rp = RelyingParty::new(RP, ORIGIN);
            let mut a = Authenticator::new(7);
            let cred = registered(&a);
            let (cd, mut obj) = a.register(b"r");
            let i = at % obj.len();
            obj[i] = to;
            let _ = rp.finish_registration(b"r", &cd, &obj);
            let _ = rp.finish_registration(b"r", &junk, &junk);
            let good = a.assert(b"c");
            for field in 0..3 {
                let mut bad = good.clone();
                let bytes = [&mut bad.client_data_json, &mut bad.authenticator_data, &mut bad.signature][field].as_mut_slice();
                let i = at % bytes.len();
                if bytes[i] == to { continue }
                bytes[i] = to;
                proptest::prop_assert!(rp.verify_assertion(b"c", &cred, &bad, Counter::Ignore).is_err());
            }
        }
    }
}
