//! Unit tests of the mandate keys' bounds: which keys verify when, what the JWKS publishes, the
//! audit checkpoints signed with the same keys, the size bound, and every shape a mandate may not
//! have (each violation on its own).
#![allow(clippy::unwrap_used)]

use super::*;

/// Hourly keys, mandates of at most an hour, 300 s of clock skew: key p signs during
/// [p·3600, (p+1)·3600) and verifies until (p+1)·3600 + 3600 + 300.
fn hourly() -> MandateKeys {
    let schedule = KeySchedule { rotate_secs: 3600, lifetime_max_secs: 3600, ..KeySchedule::new("mk1") };
    MandateKeys::new(schedule, &Secret::new("k".repeat(32))).unwrap()
}

fn claims(iat: UnixSecs, exp: UnixSecs) -> MandateClaims {
    MandateClaims {
        jti: "mdt_1".into(),
        iss: MANDATE_ISSUER.into(),
        sub: "agent".into(),
        agent_iss: "idp".into(),
        user: None,
        kind: MandateKind::Closed,
        iat,
        exp,
        approval_id: "apr_1".into(),
        approvers: vec!["alice".into()],
        currency: "KES".into(),
        tool: Some("create_payment".into()),
        payer: Some("acct-A".into()),
        payee: Some("acct-B".into()),
        amount_minor: Some(500_000),
        payment_id: None,
        intent_sha256: None,
        payees: None,
        per_payment_max_minor: None,
        budget_minor: None,
        max_uses: None,
        passkeys: None,
    }
}

fn open() -> MandateClaims {
    MandateClaims {
        kind: MandateKind::Open,
        tool: None,
        payee: None,
        amount_minor: None,
        payees: Some(vec!["acct-B".into()]),
        per_payment_max_minor: Some(10_000),
        budget_minor: Some(25_000),
        max_uses: Some(3),
        ..claims(100, 200)
    }
}

fn kids(jwks: &serde_json::Value) -> Vec<String> {
    jwks["keys"].as_array().unwrap().iter().map(|k| k["kid"].as_str().unwrap().to_string()).collect()
}

/// A key verifies to the second it must: the last mandate its period could sign lives an hour
/// past the period, plus the skew; the next key is published the skew before it signs.
#[test]
fn a_key_verifies_exactly_as_long_as_its_mandates_can_live() {
    let k = hourly();
    // Signed in the last second of period 0, living the longest a mandate may.
    let last = claims(3599, 3599 + 3600);
    let jws = k.sign(&last).unwrap();
    assert_eq!(k.verify(&jws, 7198).as_ref(), Ok(&last));
    assert!(kids(&k.jwks(7499)).contains(&"mk1-0".to_string()), "kept until 3600 + 3600 + 300");
    assert!(!kids(&k.jwks(7500)).contains(&"mk1-0".to_string()), "dropped from then on");
    let forever = k.sign(&claims(3599, 99_999)).unwrap();
    assert!(k.verify(&forever, 7499).is_ok());
    assert_eq!(k.verify(&forever, 7500), Err(MandateError::UnknownKey));
    // Published ahead: key 1 from 3600 - 300, key 2 not before 7200 - 300.
    assert_eq!(kids(&k.jwks(3299)), ["mk1-0", "mk1-1"]);
    assert_eq!(kids(&k.jwks(3300)), ["mk1-0", "mk1-1", "mk1-2"]);
    assert_eq!(kids(&k.jwks(6899)), ["mk1-0", "mk1-1", "mk1-2"]);
    assert_eq!(kids(&k.jwks(6900)), ["mk1-0", "mk1-1", "mk1-2", "mk1-3"]);
    // Before any period: nothing below period 0.
    assert_eq!(kids(&k.jwks(0)), ["mk1-0", "mk1-1"]);
}

/// Public keys are derived once and kept, up to a bound (then the cache starts over).
#[test]
fn derived_public_keys_are_kept_up_to_their_bound() {
    let k = hourly();
    for p in 0..10 {
        k.public_key(p);
    }
    assert_eq!(k.publics.lock().unwrap().len(), 10, "each kept");
    for p in 0..PUBLIC_KEYS_CACHED_MAX as i64 + 5 {
        assert_eq!(k.public_key(p), k.period_key(p).public);
        assert!(k.publics.lock().unwrap().len() <= PUBLIC_KEYS_CACHED_MAX);
    }
}

/// `paygate mandate export-keys --since`: every key from the period of `since` through the one
/// after `now`, at most EXPORTED_KEYS_MAX of them.
#[test]
fn exported_keys_cover_since_through_the_next_and_are_bounded() {
    let k = hourly();
    let doc = k.jwks_since(3600, 3 * 3600).unwrap();
    assert_eq!(kids(&doc), ["mk1-1", "mk1-2", "mk1-3", "mk1-4"]);
    let verifier = JwksVerifier::from_jwks(&doc).unwrap();
    let jws = k.sign(&claims(3 * 3600, 3 * 3600 + 60)).unwrap();
    assert!(verifier.verify(&jws, 3 * 3600).is_ok(), "the exported keys verify");
    assert_eq!(kids(&k.jwks_since(-5, 0).unwrap()), ["mk1-0", "mk1-1"], "nothing before period 0");
    // From period 5: periods 5 ..= 5 + EXPORTED_KEYS_MAX - 1 are exactly the bound.
    let most = 5 + EXPORTED_KEYS_MAX - 2;
    let bounded = k.jwks_since(5 * 3600, most * 3600).unwrap();
    assert_eq!(bounded["keys"].as_array().unwrap().len() as i64, EXPORTED_KEYS_MAX);
    assert!(k.jwks_since(5 * 3600, (most + 1) * 3600).is_err(), "one key more than the bound");
}

fn checkpoint(iat: UnixSecs) -> CheckpointClaims {
    CheckpointClaims { iss: CHECKPOINT_ISSUER.into(), chain_seq: 42, hash: "ab".repeat(32), iat, retention: false }
}

/// A checkpoint signed by hand: `key`'s period, any claims, any header.
fn forged(k: &MandateKeys, period: i64, header: Header, c: &CheckpointClaims) -> String {
    let key = k.period_key(period);
    let mut header = header;
    header.kid = Some(key.kid.clone());
    encode(&header, c, &key.signing).unwrap()
}

fn checkpoint_header() -> Header {
    let mut h = Header::new(Algorithm::EdDSA);
    h.typ = Some(CHECKPOINT_TYP.into());
    h
}

/// Audit checkpoints are signed with the mandate keys and verify under any period's key, from
/// the gateway or from exported keys; nothing else passes for one.
#[test]
fn checkpoints_verify_under_their_own_periods_key_only() {
    let k = hourly();
    let c = checkpoint(2 * 3600 + 5);
    let jws = k.sign_checkpoint(&c).unwrap();
    assert_eq!(decode_header(&jws).unwrap().kid.as_deref(), Some("mk1-2"));
    assert_eq!(k.verify_checkpoint(&jws), Ok(c.clone()));
    // From exported public keys, and through the trusted set (current keys first).
    let exported = JwksVerifier::from_jwks(&k.jwks_since(0, 3 * 3600).unwrap()).unwrap();
    assert_eq!(exported.verify_checkpoint(&jws), Ok(c.clone()));
    assert!(exported.sign_checkpoint(&c).is_err(), "public keys sign nothing");
    let other = MandateKeys::new(KeySchedule::new("mk9"), &Secret::new("o".repeat(32))).unwrap();
    let retired = [exported];
    let trusted = TrustedCheckpointKeys { current: &other, retired: &retired };
    assert_eq!(trusted.verify_checkpoint(&jws), Ok(c.clone()), "a retired key's checkpoint");
    let signed_now = trusted.sign_checkpoint(&c).unwrap();
    assert_eq!(other.verify_checkpoint(&signed_now), Ok(c.clone()), "new ones by the current keys");
    assert!(k.verify_checkpoint(&signed_now).is_err());
    // Signed by another period's key than its iat's, or by another issuer: refused.
    let misdated = forged(&k, 1, checkpoint_header(), &c);
    assert!(k.verify_checkpoint(&misdated).is_err());
    let stranger = CheckpointClaims { iss: "someone".into(), ..c.clone() };
    let foreign = forged(&k, 2, checkpoint_header(), &stranger);
    assert!(k.verify_checkpoint(&foreign).is_err());
    assert!(retired[0].verify_checkpoint(&foreign).is_err());
    // A period below zero is never a key's.
    let mut negative = checkpoint_header();
    negative.kid = Some("mk1--1".into());
    let below = encode(&negative, &c, &k.period_key(0).signing).unwrap();
    assert!(k.verify_checkpoint(&below).is_err());
    // Checkpoint claims under another type (or none) are no checkpoint: the types keep mandates
    // and checkpoints apart whatever their claims.
    for typ in [Some(MANDATE_TYP.to_string()), None] {
        let mut h = Header::new(Algorithm::EdDSA);
        h.typ = typ;
        assert!(k.verify_checkpoint(&forged(&k, 2, h, &c)).is_err());
    }
    // A mandate is not a checkpoint, nor is anything not EdDSA.
    let mandate = k.sign(&claims(2 * 3600, 2 * 3600 + 60)).unwrap();
    assert!(k.verify_checkpoint(&mandate).is_err());
    let mut hs = Header::new(Algorithm::HS256);
    hs.typ = Some(CHECKPOINT_TYP.into());
    hs.kid = Some("mk1-2".into());
    let hmac = encode(&hs, &c, &EncodingKey::from_secret(b"k").unwrap()).unwrap();
    assert!(k.verify_checkpoint(&hmac).is_err());
    assert!(retired[0].verify_checkpoint(&hmac).is_err());
}

/// The size bound holds for authentic mandates too: the longest that fits verifies, a longer one
/// is refused unread.
#[test]
fn an_authentic_mandate_over_the_size_bound_is_refused() {
    let k = hourly();
    let (mut fits, mut over) = (None, None);
    for pad in (5_000..6_200).step_by(1) {
        let c = MandateClaims { approvers: vec!["a".repeat(pad)], ..claims(100, 200) };
        let jws = k.sign(&c).unwrap();
        match jws.len().cmp(&MANDATE_BYTES_MAX) {
            std::cmp::Ordering::Greater => {
                assert_eq!(k.verify(&jws, 150), Err(MandateError::Malformed), "{} bytes", jws.len());
                over = Some(jws.len());
                break;
            }
            _ => {
                assert!(k.verify(&jws, 150).is_ok(), "{} bytes", jws.len());
                fits = Some(jws.len());
            }
        }
    }
    assert_eq!(fits, Some(MANDATE_BYTES_MAX), "a mandate of exactly the bound is accepted");
    assert!(over.is_some());
}

/// Each shape rule on its own: any one violation makes a mandate inconsistent.
#[test]
fn every_shape_rule_holds_on_its_own() {
    assert_eq!(check_shape(&claims(100, 200)), Ok(()));
    assert_eq!(check_shape(&claims(100, 101)), Ok(()), "a one-second mandate");
    assert_eq!(check_shape(&open()), Ok(()));
    let closed_bad = [
        MandateClaims { iss: "someone".into(), ..claims(100, 200) },
        MandateClaims { jti: "apr_1".into(), ..claims(100, 200) },
        claims(100, 100),
        claims(100, 99),
        MandateClaims { tool: None, ..claims(100, 200) },
        MandateClaims { payer: None, ..claims(100, 200) },
        MandateClaims { payee: None, ..claims(100, 200) },
        MandateClaims { amount_minor: None, ..claims(100, 200) },
        MandateClaims { amount_minor: Some(0), ..claims(100, 200) },
        MandateClaims { payees: Some(vec!["acct-B".into()]), ..claims(100, 200) },
        MandateClaims { per_payment_max_minor: Some(1), ..claims(100, 200) },
        MandateClaims { budget_minor: Some(1), ..claims(100, 200) },
    ];
    for (i, c) in closed_bad.iter().enumerate() {
        assert!(matches!(check_shape(c), Err(MandateError::Inconsistent(_))), "closed case {i}");
    }
    let open_bad = [
        MandateClaims { tool: Some("create_payment".into()), ..open() },
        MandateClaims { payee: Some("acct-B".into()), ..open() },
        MandateClaims { amount_minor: Some(1), ..open() },
        MandateClaims { payment_id: Some("pay_1".into()), ..open() },
        MandateClaims { payees: None, ..open() },
        MandateClaims { payees: Some(vec![]), ..open() },
        MandateClaims { per_payment_max_minor: None, ..open() },
        MandateClaims { budget_minor: None, ..open() },
        MandateClaims { max_uses: None, ..open() },
        MandateClaims { per_payment_max_minor: Some(0), ..open() },
        MandateClaims { budget_minor: Some(0), ..open() },
        MandateClaims { max_uses: Some(0), ..open() },
        MandateClaims { jti: "x".into(), ..open() },
    ];
    for (i, c) in open_bad.iter().enumerate() {
        assert!(matches!(check_shape(c), Err(MandateError::Inconsistent(_))), "open case {i}");
    }
    assert_eq!(
        check_shape(&MandateClaims {
            per_payment_max_minor: Some(1),
            budget_minor: Some(1),
            max_uses: Some(1),
            ..open()
        }),
        Ok(())
    );
}
