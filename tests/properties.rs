//! Property tests over the parsers an attacker reaches (issue 12): money amounts, mandate JWS,
//! bearer JWTs, the scope peek against rmcp's own parse of the same body, and idempotency keys and
//! fingerprints. Each property states a promise users rely on; when one breaks, proptest shrinks
//! the input and prints the smallest one that breaks it. What such a failure taught stays below as
//! a plain `#[test]` whose name says why (no regression files: `failure_persistence: None`).
//!
//! No server, no sleeping: time is a number passed in or a `ManualClock`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../fuzz/checks.rs"]
mod checks;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::sync::Arc;

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD as B64;
use checks::rmcp_reading;
use hmac::{Hmac, Mac};
use paygate::auth::{Audience, Secret, Verifier, mint_dev_token};
use paygate::catalogue::{ALIASES, TOOLS};
use paygate::clock::ManualClock;
use paygate::domain::ids::{AccountId, PaymentId};
use paygate::domain::money::{AMOUNT_MINOR_MAX, Currency, Money, MoneyError, format_minor, parse_minor};
use paygate::http::peek;
use paygate::idempotency::{KeyDeriver, call_fingerprint, refund_args};
use paygate::mandate::{
    JwksVerifier, KeySchedule, MANDATE_ISSUER, MANDATE_TYP, MandateClaims, MandateError, MandateKeys, MandateKind,
};
use proptest::prelude::*;
use proptest::sample::{Index, select};
use rmcp::model::ClientJsonRpcMessage;
use serde_json::{Map, Value, json};

/// `cases` per property, or `PROPTEST_CASES` for a longer hunt (proptest's own variable, which an
/// explicit count would otherwise override).
fn config(cases: u32) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(cases);
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

/// Arbitrary text: any Unicode scalar, control characters included.
fn any_text(max: usize) -> impl Strategy<Value = String> + Clone {
    prop::collection::vec(any::<char>(), 0..max).prop_map(String::from_iter)
}

// ---------------------------------------------------------------------------------------------
// Money
// ---------------------------------------------------------------------------------------------

/// Every supported currency with its exponent, as `money.rs` lists them (closed on purpose).
const CURRENCIES: [(&str, u32); 12] = [
    ("KES", 2),
    ("USD", 2),
    ("EUR", 2),
    ("GBP", 2),
    ("UGX", 0),
    ("TZS", 2),
    ("RWF", 0),
    ("NGN", 2),
    ("ZAR", 2),
    ("JPY", 0),
    ("KWD", 3),
    ("BHD", 3),
];

fn codes() -> Vec<&'static str> {
    CURRENCIES.iter().map(|(c, _)| *c).collect()
}

fn currency() -> impl Strategy<Value = Currency> + Clone {
    select(codes()).prop_map(|c| Currency::parse(c).unwrap())
}

/// What an amount string means, written from the rule in the tool descriptions rather than from
/// `money.rs`: ASCII digits, then optionally '.' and one to `exponent` ASCII digits, nothing else.
#[derive(Debug, PartialEq)]
enum Spec {
    Malformed,
    TooManyDecimals,
    /// Minor units, saturating (anything huge is simply too large).
    Minor(u128),
}

fn spec(amount: &str, exponent: u32) -> Spec {
    let digits = |t: &str| !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit());
    let (whole, frac) = match amount.split_once('.') {
        Some((w, f)) => (w, Some(f)),
        None => (amount, None),
    };
    if !digits(whole) || frac.is_some_and(|f| !digits(f)) {
        return Spec::Malformed;
    }
    let frac = frac.unwrap_or("");
    if frac.len() > exponent as usize {
        return Spec::TooManyDecimals;
    }
    let padded = format!("{whole}{frac:0<width$}", width = exponent as usize);
    Spec::Minor(padded.bytes().fold(0u128, |v, b| v.saturating_mul(10).saturating_add(u128::from(b - b'0'))))
}

/// Characters an amount must never contain, each a way some parser somewhere reads a number.
const STRAY: [char; 18] =
    [' ', '\t', '\n', '-', '+', 'e', 'E', ',', '_', '.', '\u{0}', '٣', '５', '१', '¹', 'x', '\u{200b}', '\u{a0}'];

fn amount_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any_text(12),
        3 => "[0-9]{0,22}(\\.[0-9]{0,5})?",
        2 => "0{0,20}[0-9]{0,4}\\.?[0-9]{0,4}",
        3 => ("[0-9]{1,6}(\\.[0-9]{1,3})?", select(STRAY.to_vec()), any::<Index>()).prop_map(|(mut s, c, at)| {
            s.insert(at.index(s.len() + 1), c);
            s
        }),
    ]
}

fn minor_units() -> impl Strategy<Value = i64> + Clone {
    prop_oneof![Just(1), Just(AMOUNT_MINOR_MAX), 1..1_000_i64, 1..=AMOUNT_MINOR_MAX]
}

/// `canonical` spelled with `leading` extra zeros in front and up to `trim` trailing decimal zeros
/// dropped ("10.00" → "010.0", "10").
fn respell(canonical: &str, leading: usize, trim: usize) -> String {
    let mut spelled = format!("{}{canonical}", "0".repeat(leading));
    if spelled.contains('.') {
        for _ in 0..trim {
            if spelled.ends_with('0') {
                spelled.pop();
            }
        }
        if spelled.ends_with('.') {
            spelled.pop();
        }
    }
    spelled
}

/// One thing the spec forbids, added to a well-formed amount, and the refusal it must get.
fn corrupt(text: &str, exponent: u32, how: usize, at: Index) -> (String, fn(&MoneyError) -> bool) {
    let malformed: fn(&MoneyError) -> bool = |e| matches!(e, MoneyError::Malformed(_));
    // After the first character (format_minor's output is ASCII, never empty).
    let inside = 1 + at.index(text.len());
    let with = |c: &str| {
        let mut s = text.to_string();
        s.insert_str(inside, c);
        s
    };
    // One of its digits, swapped for the same digit in another script.
    let foreign = |zero: u32| {
        let digits: Vec<usize> = text.bytes().enumerate().filter(|(_, b)| b.is_ascii_digit()).map(|(i, _)| i).collect();
        let i = digits[at.index(digits.len())];
        let d = text.as_bytes()[i] - b'0';
        let mut s = text.to_string();
        s.replace_range(i..=i, &char::from_u32(zero + u32::from(d)).unwrap().to_string());
        s
    };
    match how {
        0 => (format!("-{text}"), malformed),
        1 => (format!("+{text}"), malformed),
        2 => (format!("{text}e0"), malformed),
        3 => (format!("{text}E2"), malformed),
        4 => (format!(" {text}"), malformed),
        5 => (format!("{text}\n"), malformed),
        6 => (with(" "), malformed),
        7 => (with(","), malformed),
        8 => (foreign(0x0660), malformed), // Arabic-Indic
        9 => (foreign(0xFF10), malformed), // fullwidth
        10 => (format!("0x{text}"), malformed),
        11 => (format!("{text}\u{0}"), malformed),
        12 => (format!(".{text}"), malformed),
        13 => (format!("{text}."), malformed),
        14 => {
            let more = if exponent == 0 { format!("{text}.5") } else { format!("{text}1") };
            (more, |e| matches!(e, MoneyError::TooManyDecimals { .. }))
        }
        _ => (format!("{}{text}", "9".repeat(17)), |e| *e == MoneyError::TooLarge),
    }
}

proptest! {
    #![proptest_config(config(4096))]

    /// Whatever text an agent sends as an amount gets an answer, never a panic, and the answer is
    /// the spec's: plain ASCII digits with at most the currency's decimals, at most
    /// AMOUNT_MINOR_MAX, and (for a payment) above zero. Everything else is refused with the error
    /// that names what was wrong; nothing wraps around.
    #[test]
    fn amounts_parse_exactly_as_specified(amount in amount_text(), currency in currency()) {
        let got = parse_minor(&amount, currency);
        match spec(&amount, currency.exponent()) {
            Spec::Malformed => prop_assert!(matches!(got, Err(MoneyError::Malformed(_))), "{amount:?}: {got:?}"),
            Spec::TooManyDecimals => {
                prop_assert!(matches!(got, Err(MoneyError::TooManyDecimals { .. })), "{amount:?}: {got:?}")
            }
            Spec::Minor(m) if m > AMOUNT_MINOR_MAX as u128 => prop_assert_eq!(&got, &Err(MoneyError::TooLarge)),
            Spec::Minor(m) => prop_assert_eq!(&got, &Ok(m as i64)),
        }
        match (got, Money::parse(&amount, currency)) {
            (Ok(0), money) => prop_assert_eq!(money, Err(MoneyError::NotPositive)),
            (Ok(m), Ok(money)) => {
                prop_assert!(money.minor() == m && (1..=AMOUNT_MINOR_MAX).contains(&m));
                prop_assert_eq!(money.currency(), currency);
            }
            (got, money) => prop_assert_eq!(got.map(|_| ()), money.map(|_| ())),
        }
    }

    /// Every amount paygate can hold reads back from its canonical spelling to the same minor
    /// units, so what a response or an approval shows is exactly what moves.
    #[test]
    fn canonical_spelling_round_trips(minor in minor_units(), currency in currency()) {
        let text = format_minor(minor, currency);
        let money = Money::parse(&text, currency).unwrap();
        prop_assert_eq!(money.minor(), minor);
        prop_assert_eq!(money.to_decimal(), text);
    }

    /// "10", "10.0", "10.00" and "010.00" are one amount: leading zeros and fewer trailing decimal
    /// zeros never change what an amount means.
    #[test]
    fn spellings_of_one_amount_agree(
        minor in prop_oneof![Just(0), minor_units()], currency in currency(), leading in 0usize..4, trim in 0usize..4,
    ) {
        let spelled = respell(&format_minor(minor, currency), leading, trim);
        prop_assert_eq!(parse_minor(&spelled, currency), Ok(minor), "{}", spelled);
    }

    /// A well-formed amount with one forbidden thing added is refused, never read as some other
    /// number: a sign, an exponent, whitespace, a thousands separator, another script's digit, a
    /// hex prefix, a NUL, a bare '.', a decimal past the currency's exponent, or more digits than
    /// any amount can have.
    #[test]
    fn corrupted_amounts_are_refused(
        minor in prop_oneof![Just(0), minor_units()], currency in currency(), how in 0usize..16, at in any::<Index>(),
    ) {
        let (text, expected) = corrupt(&format_minor(minor, currency), currency.exponent(), how, at);
        let got = parse_minor(&text, currency);
        prop_assert!(got.as_ref().is_err_and(expected), "{:?} gave {:?}", text, got);
    }

    /// Only the twelve listed ISO 4217 codes are currencies, spelled exactly (no case folding, no
    /// padding), each with its own exponent.
    #[test]
    fn currencies_are_a_closed_list(code in prop_oneof![
        select(codes()).prop_map(String::from),
        select(codes()).prop_map(|c| c.to_lowercase()),
        select(codes()).prop_map(|c| format!("{c} ")),
        "[A-Z]{3}",
        any_text(5),
    ]) {
        let known = CURRENCIES.iter().find(|(c, _)| *c == code);
        let got = Currency::parse(&code);
        let right = match (&got, known) {
            (Ok(c), Some((name, exponent))) => c.code() == *name && c.exponent() == *exponent,
            (Err(MoneyError::UnknownCurrency(_)), None) => true,
            _ => false,
        };
        prop_assert!(right, "{code:?} gave {got:?}");
    }
}

// ---------------------------------------------------------------------------------------------
// Compact JWS helpers (mandates and bearer tokens)
// ---------------------------------------------------------------------------------------------

/// `header.claims.signature`, the signature an HMAC of the kind `alg` names (HS256 for anything
/// else, so `RS256` is "an HMAC with the secret": the classic algorithm confusion). `none` signs
/// nothing.
fn compact(header: &Value, claims: &[u8], alg: &str, secret: &[u8]) -> String {
    let input = format!("{}.{}", B64.encode(header.to_string()), B64.encode(claims));
    let signature = match alg {
        "none" => Vec::new(),
        "HS384" => {
            let mut mac = Hmac::<sha2::Sha384>::new_from_slice(secret).unwrap();
            mac.update(input.as_bytes());
            mac.finalize().into_bytes().to_vec()
        }
        "HS512" => {
            let mut mac = Hmac::<sha2::Sha512>::new_from_slice(secret).unwrap();
            mac.update(input.as_bytes());
            mac.finalize().into_bytes().to_vec()
        }
        _ => {
            let mut mac = Hmac::<sha2::Sha256>::new_from_slice(secret).unwrap();
            mac.update(input.as_bytes());
            mac.finalize().into_bytes().to_vec()
        }
    };
    format!("{input}.{}", B64.encode(signature))
}

/// One change to a token's text.
#[derive(Debug, Clone)]
enum Mutation {
    Replace(Index, char),
    Delete(Index),
    Insert(Index, char),
    SwapSegments(usize, usize),
    ExtraSegment(String),
    Truncate(Index),
    Twice,
    DropSignature,
    /// The header segment of the token with the alg set to `none` (or another) and no signature.
    Realg(&'static str),
}

const B64_CHARS: &str = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_";

fn mutation() -> impl Strategy<Value = Mutation> {
    let ch = prop_oneof![
        4 => select(B64_CHARS.chars().collect::<Vec<_>>()),
        1 => select(vec!['.', '=', '+', '/', ' ', '\u{0}', 'é']),
        1 => any::<char>(),
    ];
    prop_oneof![
        6 => (any::<Index>(), ch.clone()).prop_map(|(i, c)| Mutation::Replace(i, c)),
        2 => any::<Index>().prop_map(Mutation::Delete),
        2 => (any::<Index>(), ch).prop_map(|(i, c)| Mutation::Insert(i, c)),
        1 => (0usize..3, 0usize..3).prop_map(|(a, b)| Mutation::SwapSegments(a, b)),
        1 => "[A-Za-z0-9_-]{0,12}".prop_map(Mutation::ExtraSegment),
        1 => any::<Index>().prop_map(Mutation::Truncate),
        1 => Just(Mutation::Twice),
        1 => Just(Mutation::DropSignature),
        1 => select(vec!["none", "None", "HS512", "RS256", ""]).prop_map(Mutation::Realg),
    ]
}

/// The token with `m` applied; always different from `token` (which is ASCII).
fn mutate(token: &str, m: &Mutation) -> String {
    let chars: Vec<char> = token.chars().collect();
    let segments: Vec<&str> = token.split('.').collect();
    let mut out = match m {
        Mutation::Replace(at, c) => {
            let i = at.index(chars.len());
            let mut c = *c;
            if c == chars[i] {
                c = if c == 'A' { 'B' } else { 'A' };
            }
            let mut v = chars.clone();
            v[i] = c;
            v.into_iter().collect()
        }
        Mutation::Delete(at) => {
            let mut v = chars.clone();
            v.remove(at.index(chars.len()));
            v.into_iter().collect()
        }
        Mutation::Insert(at, c) => {
            let mut v = chars.clone();
            v.insert(at.index(chars.len() + 1), *c);
            v.into_iter().collect()
        }
        Mutation::SwapSegments(a, b) => {
            let b = if a == b { (a + 1) % 3 } else { *b };
            let mut s = segments.clone();
            s.swap(*a, b);
            s.join(".")
        }
        Mutation::ExtraSegment(extra) => format!("{token}.{extra}"),
        Mutation::Truncate(at) => chars[..at.index(chars.len())].iter().collect(),
        Mutation::Twice => format!("{token}{token}"),
        Mutation::DropSignature => format!("{}.{}.", segments[0], segments[1]),
        Mutation::Realg(alg) => {
            let mut header: Value = serde_json::from_slice(&B64.decode(segments[0]).unwrap()).unwrap();
            header["alg"] = json!(alg);
            format!("{}.{}.", B64.encode(header.to_string()), segments[1])
        }
    };
    if out == token {
        // Swapping two equal segments, say: make it a change all the same.
        out.push('A');
    }
    out
}

// ---------------------------------------------------------------------------------------------
// Mandates
// ---------------------------------------------------------------------------------------------

fn mandate_secret(kid: &str) -> String {
    format!("{kid}-mandate-secret-of-32-bytes-or-more")
}

/// The gateway's keys: Ed25519 keys `mk1-<period>` sign; HS256 under `mk1` (the mandate secret)
/// still verifies (a migration window that never ends, so the HMAC paths can be explored).
/// Mandates below live up to 10^7 s: keys are kept that long after they stop signing.
fn mandate_keys() -> MandateKeys {
    let schedule =
        KeySchedule { lifetime_max_secs: 20_000_000, hs256_accept_until: Some(i64::MAX), ..KeySchedule::new("mk1") };
    MandateKeys::new(schedule, &Secret::new(mandate_secret("mk1"))).unwrap()
}

fn text() -> impl Strategy<Value = String> + Clone {
    prop_oneof![3 => "[A-Za-z0-9_.:-]{1,16}", 1 => any_text(10)]
}

fn positive() -> impl Strategy<Value = i64> + Clone {
    prop_oneof![Just(1), Just(i64::MAX), 1..10_000_i64, 1..=i64::MAX]
}

/// Well-formed mandates of both kinds, as the gateway issues them.
fn mandate_claims() -> impl Strategy<Value = MandateClaims> {
    let common = (
        "[A-Za-z0-9]{1,24}",
        text(),
        text(),
        0..2_000_000_000_i64,
        1..10_000_000_i64,
        "apr_[A-Za-z0-9]{1,20}",
        prop::collection::vec(text(), 0..3),
        select(codes()),
        prop::option::of("[0-9a-f]{64}"),
    );
    let closed = (
        select(vec!["create_payment", "refund_payment"]),
        text(),
        text(),
        positive(),
        prop::option::of("pay_[A-Za-z0-9]{1,20}"),
        prop::option::of(positive()),
    )
        .prop_map(|(tool, payer, payee, amount, payment_id, max_uses)| MandateClaims {
            kind: MandateKind::Closed,
            tool: Some(tool.into()),
            payer: Some(payer),
            payee: Some(payee),
            amount_minor: Some(amount),
            payment_id,
            max_uses,
            ..blank_mandate()
        });
    let open = (prop::option::of(text()), prop::collection::vec(text(), 1..4), positive(), positive(), positive())
        .prop_map(|(payer, payees, per_payment, budget, uses)| MandateClaims {
            kind: MandateKind::Open,
            payer,
            payees: Some(payees),
            per_payment_max_minor: Some(per_payment),
            budget_minor: Some(budget),
            max_uses: Some(uses),
            ..blank_mandate()
        });
    (common, prop_oneof![closed, open]).prop_map(
        |((id, sub, agent_iss, iat, lifetime, approval_id, approvers, currency, intent), shape)| MandateClaims {
            jti: format!("mdt_{id}"),
            sub,
            agent_iss,
            iat,
            exp: iat + lifetime,
            approval_id,
            approvers,
            currency: currency.into(),
            intent_sha256: intent,
            ..shape
        },
    )
}

fn blank_mandate() -> MandateClaims {
    MandateClaims {
        jti: String::new(),
        iss: MANDATE_ISSUER.into(),
        sub: String::new(),
        agent_iss: String::new(),
        user: None,
        kind: MandateKind::Closed,
        iat: 0,
        exp: 0,
        approval_id: String::new(),
        approvers: vec![],
        currency: String::new(),
        tool: None,
        payer: None,
        payee: None,
        amount_minor: None,
        payment_id: None,
        intent_sha256: None,
        payees: None,
        per_payment_max_minor: None,
        budget_minor: None,
        max_uses: None,
        passkeys: None,
    }
}

/// The shape rules of a mandate, from the module docs: issued by paygate with an `mdt_` id and a
/// lifetime that ends after it starts; a closed mandate pins one payment (tool, payer, payee and a
/// positive amount, no open-mandate constraints); an open one carries positive constraints
/// (payees, per-payment maximum, budget, uses) and pins no single payment.
fn well_formed(c: &MandateClaims) -> bool {
    let positive = |v: Option<i64>| v.is_some_and(|n| n > 0);
    let issued = c.iss == MANDATE_ISSUER && c.jti.starts_with("mdt_") && c.exp > c.iat;
    issued
        && match c.kind {
            MandateKind::Closed => {
                c.tool.is_some()
                    && c.payer.is_some()
                    && c.payee.is_some()
                    && positive(c.amount_minor)
                    && c.payees.is_none()
                    && c.per_payment_max_minor.is_none()
                    && c.budget_minor.is_none()
            }
            MandateKind::Open => {
                c.tool.is_none()
                    && c.payee.is_none()
                    && c.amount_minor.is_none()
                    && c.payment_id.is_none()
                    && c.payees.as_ref().is_some_and(|p| !p.is_empty())
                    && positive(c.per_payment_max_minor)
                    && positive(c.budget_minor)
                    && positive(c.max_uses)
            }
        }
}

const MANDATE_FIELDS: [&str; 20] = [
    "jti",
    "iss",
    "sub",
    "agent_iss",
    "kind",
    "iat",
    "exp",
    "approval_id",
    "approvers",
    "currency",
    "tool",
    "payer",
    "payee",
    "amount_minor",
    "payment_id",
    "intent_sha256",
    "payees",
    "per_payment_max_minor",
    "budget_minor",
    "max_uses",
];

/// JSON values that tend to sit on an edge of some claim's type or range.
fn edge_value() -> impl Strategy<Value = Value> + Clone {
    select(vec![
        Value::Null,
        json!(true),
        json!(0),
        json!(-1),
        json!(1),
        json!(i64::MAX),
        json!(i64::MIN),
        json!(u64::MAX),
        json!(1.5),
        json!(1e300),
        json!(""),
        json!("x"),
        json!("mdt_x"),
        json!("paygate"),
        json!("closed"),
        json!("open"),
        json!("create_payment"),
        json!([]),
        json!(["a"]),
        json!([1]),
        json!({}),
        json!({"a": 1}),
    ])
}

/// An edit to a claims object: drop a field, or set one (known or not) to an edge value.
fn claim_edit() -> impl Strategy<Value = (String, Option<Value>)> {
    let key = prop_oneof![
        6 => select(MANDATE_FIELDS.to_vec()).prop_map(String::from),
        1 => select(vec!["nbf", "aud", "alg", "extra"]).prop_map(String::from),
    ];
    (key, prop::option::weighted(0.8, edge_value()))
}

/// Strings of the shape of a compact JWS, segments drawn from base64 of arbitrary bytes.
fn jws_shaped() -> impl Strategy<Value = String> {
    prop::collection::vec(prop::collection::vec(any::<u8>(), 0..48).prop_map(|b| B64.encode(b)), 0..5)
        .prop_map(|segments| segments.join("."))
}

proptest! {
    #![proptest_config(config(512))]

    /// A mandate the gateway signs verifies, with every claim exactly as signed, from its issue
    /// time until just before it expires; from its expiry on it is refused as expired.
    #[test]
    fn signed_mandates_verify_and_round_trip(claims in mandate_claims(), into in 0.0..1.0_f64, late in 0..1000_i64) {
        let keys = mandate_keys();
        let jws = keys.sign(&claims).unwrap();
        let now = claims.iat + ((claims.exp - claims.iat) as f64 * into) as i64;
        prop_assert_eq!(keys.verify(&jws, now.min(claims.exp - 1)), Ok(claims.clone()));
        prop_assert_eq!(keys.verify(&jws, claims.exp + late), Err(MandateError::Expired));
        // And from the published keys alone, as a ledger or an auditor verifies it.
        let outside = JwksVerifier::from_jwks(&keys.jwks(now)).unwrap();
        prop_assert_eq!(outside.verify(&jws, now.min(claims.exp - 1)), Ok(claims.clone()));
    }

    /// Any change to a signed mandate's text (a character replaced, dropped or added anywhere,
    /// segments swapped, truncated, doubled, an extra segment, the signature dropped, the alg
    /// rewritten to none) makes it refused. Nothing about a mandate can be edited by its holder.
    #[test]
    fn tampered_mandates_are_refused(claims in mandate_claims(), m in mutation()) {
        let keys = mandate_keys();
        let jws = keys.sign(&claims).unwrap();
        prop_assert_eq!(keys.verify(&jws, claims.iat), Ok(claims.clone()));
        let forged = mutate(&jws, &m);
        prop_assert!(keys.verify(&forged, claims.iat).is_err(), "{:?} verified", m);
    }

    /// Of HMAC-signed mandates, only the migration window's verify: HS256, typ
    /// `paygate-mandate+jwt`, kid `mk1` (the configured key id) and the mandate secret. alg `none`,
    /// HS384/HS512 with the right key, RS256 or EdDSA computed as an HMAC of the secret, another
    /// typ, an Ed25519 key's kid, an unknown or missing kid, or another key are all refused.
    #[test]
    fn only_the_gateways_signature_verifies(
        claims in mandate_claims(),
        alg in prop_oneof![6 => Just("HS256"), 1 => select(vec!["HS384", "HS512", "none", "RS256", "hs256", "EdDSA"])],
        typ in prop_oneof![
            6 => Just(Some(MANDATE_TYP)),
            1 => select(vec![None, Some("JWT"), Some("paygate-mandate+JWT"), Some("paygate-mandate")]),
        ],
        (kid, signer) in prop_oneof![
            6 => Just((Some("mk1"), "mk1")),
            1 => (select(vec![Some("mk1"), Some("mk1-0"), Some("mk1-656"), Some("mk2"), Some(""), None]), select(vec!["mk1", "mk1-0", "other"])),
        ],
    ) {
        let mut header = json!({"alg": alg});
        if let Some(typ) = typ {
            header["typ"] = json!(typ);
        }
        if let Some(kid) = kid {
            header["kid"] = json!(kid);
        }
        let jws = compact(&header, &serde_json::to_vec(&claims).unwrap(), alg, mandate_secret(signer).as_bytes());
        let genuine = alg == "HS256" && typ == Some(MANDATE_TYP) && kid == Some("mk1") && signer == "mk1";
        let got = mandate_keys().verify(&jws, claims.iat);
        if genuine {
            prop_assert_eq!(got, Ok(claims));
        } else {
            prop_assert!(got.is_err(), "{header} signed by {signer} verified");
        }
    }

    /// Even a token the gateway's key really signed is refused unless its claims are a well-formed
    /// mandate: no unknown claims, every claim of its type, the shape rules of its kind, and not
    /// expired. (The gateway only signs what it built; this holds if that ever goes wrong.)
    #[test]
    fn signed_claims_must_be_a_well_formed_mandate(
        claims in mandate_claims(), edits in prop::collection::vec(claim_edit(), 1..4),
    ) {
        let now = claims.iat;
        let mut object = serde_json::to_value(&claims).unwrap();
        for (key, value) in &edits {
            match value {
                Some(v) => object[key.as_str()] = v.clone(),
                None => {
                    object.as_object_mut().unwrap().remove(key);
                }
            }
        }
        let header = json!({"alg": "HS256", "typ": MANDATE_TYP, "kid": "mk1"});
        let jws = compact(&header, object.to_string().as_bytes(), "HS256", mandate_secret("mk1").as_bytes());
        let expected = serde_json::from_value::<MandateClaims>(object.clone()).ok().filter(|c| well_formed(c) && now < c.exp);
        prop_assert_eq!(mandate_keys().verify(&jws, now).ok(), expected, "{}", object);
    }

    /// Whatever string arrives where a mandate belongs, verification refuses it without a panic.
    #[test]
    fn arbitrary_mandate_strings_are_refused(s in prop_oneof![any_text(64), "[A-Za-z0-9_.=-]{0,128}", jws_shaped()]) {
        prop_assert!(mandate_keys().verify(&s, 1_700_000_000).is_err());
    }
}

/// A mandate longer than MANDATE_BYTES_MAX is refused before any parsing, however well signed.
#[test]
fn oversized_mandates_are_refused_before_parsing() {
    let claims = MandateClaims {
        jti: "mdt_big".into(),
        sub: "agent".into(),
        agent_iss: "idp".into(),
        iat: 100,
        exp: 200,
        approval_id: "apr_1".into(),
        approvers: vec!["x".repeat(100); 80],
        currency: "KES".into(),
        tool: Some("create_payment".into()),
        payer: Some("a".into()),
        payee: Some("b".into()),
        amount_minor: Some(1),
        ..blank_mandate()
    };
    let keys = mandate_keys();
    let jws = keys.sign(&claims).unwrap();
    assert!(jws.len() > paygate::mandate::MANDATE_BYTES_MAX);
    assert_eq!(keys.verify(&jws, 150), Err(MandateError::Malformed));
}

// ---------------------------------------------------------------------------------------------
// Bearer JWTs
// ---------------------------------------------------------------------------------------------

const RESOURCE: &str = "https://gw.example/mcp";
/// The other protected resource: a token naming it (too) is not this resource's.
const OPERATOR_RESOURCE: &str = "https://gw.example/operator";
const DEV_ISS: &str = "https://dev.paygate.test";
const DEV_SECRET: &str = "dev-key-dev-key-dev-key-dev-key!";
const NOW: i64 = 1_700_000_000;
const LEEWAY: i64 = 60;

fn verifier(cache: usize) -> Verifier {
    Verifier::new(RESOURCE.into(), OPERATOR_RESOURCE.into(), LEEWAY, Arc::new(ManualClock::new(NOW)))
        .with_dev_key(DEV_ISS.into(), &Secret::new(DEV_SECRET.into()))
        .unwrap()
        .with_cache(cache)
}

thread_local! {
    static RUNTIME: RefCell<Option<tokio::runtime::Runtime>> = const { RefCell::new(None) };
}

fn block_on<F: std::future::Future>(f: F) -> F::Output {
    RUNTIME.with(|rt| {
        rt.borrow_mut()
            .get_or_insert_with(|| tokio::runtime::Builder::new_current_thread().build().unwrap())
            .block_on(f)
    })
}

/// A claim or header field: absent or a value, and whether it is acceptable by the token rules.
type Field = (Option<Value>, bool);

fn good(v: Value) -> Field {
    (Some(v), true)
}
fn bad(v: Value) -> Field {
    (Some(v), false)
}

// Each field is mostly acceptable and now and then not, so most cases hold at most one fault and
// every fault gets seen on its own.

fn jwt_iss() -> impl Strategy<Value = Field> {
    prop_oneof![
        12 => Just(good(json!(DEV_ISS))),
        1 => select(vec![
            (None, false),
            bad(Value::Null),
            bad(json!("https://DEV.paygate.test")),
            bad(json!("https://evil.example")),
            bad(json!(42)),
            bad(json!([DEV_ISS])),
        ]),
    ]
}

fn jwt_sub() -> impl Strategy<Value = Field> {
    prop_oneof![
        // A subject the gateway keys on: no control characters (they would forge log lines),
        // nothing a person would not see as written (bidi controls, zero-width characters), and no
        // white space at either end ("alice " would read as alice).
        12 => prop_oneof!["[a-z0-9-]{1,12}", any_text(8).prop_filter("non-empty", |s| !s.is_empty())].prop_map(|s| {
            let padded = s.starts_with(char::is_whitespace) || s.ends_with(char::is_whitespace);
            if s.chars().any(paygate::domain::text::is_hidden) || padded { bad(json!(s)) } else { good(json!(s)) }
        }),
        1 => select(vec![
            (None, false),
            bad(json!("")),
            bad(json!(7)),
            bad(Value::Null),
            bad(json!(["agent"])),
            bad(json!("a".repeat(257))),
            good(json!("a".repeat(256))),
        ]),
    ]
}

fn jwt_aud() -> impl Strategy<Value = Field> {
    prop_oneof![
        12 => select(vec![
            good(json!(RESOURCE)),
            good(json!("HTTPS://GW.EXAMPLE/mcp")),
            good(json!([RESOURCE])),
            good(json!(["https://other.example/mcp", RESOURCE])),
        ]),
        2 => select(vec![
            (None, false),
            bad(Value::Null),
            bad(json!("https://gw.example/MCP")),
            bad(json!("https://gw.example/mcp/")),
            bad(json!("https://gw.example/mcp?x=1")),
            bad(json!("gw.example/mcp")),
            bad(json!("https://other.example/mcp")),
            bad(json!([])),
            bad(json!(["https://other.example/mcp"])),
            bad(json!([RESOURCE, 5])),
            bad(json!(5)),
            // The operator resource's token, or one naming both resources: an agent's token never
            // carries operator power.
            bad(json!(OPERATOR_RESOURCE)),
            bad(json!([RESOURCE, OPERATOR_RESOURCE])),
        ]),
    ]
}

/// RFC 8693 `act`: absent, or an object whose `sub` is a subject (the agent acting for `sub`).
fn jwt_act() -> impl Strategy<Value = Field> {
    prop_oneof![
        6 => Just((None, true)),
        3 => "[a-z0-9-]{1,12}".prop_map(|s| good(json!({"sub": s}))),
        1 => Just(good(json!({"sub": "bot", "act": {"sub": "older-bot"}}))),
        2 => select(vec![
            bad(json!("bot")),
            bad(json!({})),
            bad(json!({"sub": ""})),
            bad(json!({"sub": 7})),
            bad(json!({"sub": "b\u{7}ot"})),
            bad(Value::Null),
        ]),
    ]
}

fn jwt_exp() -> impl Strategy<Value = Field> {
    prop_oneof![
        10 => (-LEEWAY..3600).prop_map(|d| good(json!(NOW + d))),
        2 => (-3 * LEEWAY..2 * LEEWAY).prop_map(|d| (Some(json!(NOW + d)), d >= -LEEWAY)),
        1 => select(vec![
            good(json!(i64::MAX)),
            (None, false),
            bad(Value::Null),
            bad(json!(i64::MIN)),
            bad(json!(u64::MAX)),
            bad(json!(NOW as f64 + 100.5)),
            bad(json!(1e300)),
            bad(json!((NOW + 100).to_string())),
        ]),
    ]
}

fn jwt_nbf() -> impl Strategy<Value = Field> {
    prop_oneof![
        6 => Just((None, true)),
        6 => (-3600..LEEWAY).prop_map(|d| good(json!(NOW + d))),
        2 => (-2 * LEEWAY..3 * LEEWAY).prop_map(|d| (Some(json!(NOW + d)), d <= LEEWAY)),
        1 => select(vec![
            good(Value::Null),
            good(json!(i64::MIN)),
            bad(json!(i64::MAX)),
            bad(json!(1.5)),
            bad(json!("0")),
        ]),
    ]
}

/// Optional text claims (`scope`, `client_id`, `azp`): absent, null or a string, never another type.
fn jwt_text_claim() -> impl Strategy<Value = Field> {
    prop_oneof![
        6 => Just((None, true)),
        6 => prop_oneof!["[a-z:]{0,14}( [a-z:]{1,14}){0,3}", any_text(12)].prop_map(|s| good(json!(s))),
        1 => select(vec![good(Value::Null), bad(json!(1)), bad(json!(["payments:read"])), bad(json!({}))]),
    ]
}

/// `scp`: a string or a list of strings.
fn jwt_scp() -> impl Strategy<Value = Field> {
    prop_oneof![
        6 => Just((None, true)),
        4 => prop::collection::vec("[a-z:]{1,14}", 0..3).prop_map(|v| good(json!(v))),
        2 => "[a-z: ]{0,20}".prop_map(|s| good(json!(s))),
        1 => select(vec![good(Value::Null), bad(json!(1)), bad(json!([1])), bad(json!([["a"]]))]),
    ]
}

fn jwt_alg() -> impl Strategy<Value = Field> {
    prop_oneof![
        12 => Just(good(json!("HS256"))),
        2 => select(vec![
            (None, false),
            bad(json!("none")),
            bad(json!("HS384")),
            bad(json!("HS512")),
            bad(json!("RS256")),
            bad(json!("ES256")),
            bad(json!("EdDSA")),
            bad(json!("hs256")),
            bad(json!(256)),
        ]),
    ]
}

/// `typ` and `kid` mean nothing to the dev key, but must still be strings when present.
fn jwt_header_text() -> impl Strategy<Value = Field> {
    prop_oneof![
        6 => Just((None, true)),
        6 => select(vec!["JWT", "at+jwt", "", "../../etc/passwd", "k1\u{0}"]).prop_map(|s| good(json!(s))),
        1 => select(vec![good(Value::Null), bad(json!(5)), bad(json!(["JWT"]))]),
    ]
}

/// One more header member: harmless, or one a verifier must not ignore.
fn jwt_header_extra() -> impl Strategy<Value = Option<(&'static str, Value, bool)>> {
    prop_oneof![
        12 => Just(None),
        2 => select(vec![
            Some(("x-extra", json!({"a": [1, 2]}), true)),
            Some(("crit", json!(["exp"]), false)),
            Some(("crit", json!([]), false)),
            Some(("b64", json!(false), false)),
            Some(("jwk", json!("not a key"), false)),
        ]),
    ]
}

#[derive(Debug, Clone)]
struct JwtCase {
    header: Vec<(&'static str, Field)>,
    extra_header: Option<(&'static str, Value, bool)>,
    claims: Vec<(&'static str, Field)>,
    right_key: bool,
}

impl JwtCase {
    fn token(&self) -> String {
        let object = |fields: &[(&'static str, Field)]| {
            let mut m = Map::new();
            for (name, (value, _)) in fields {
                if let Some(v) = value {
                    m.insert((*name).to_string(), v.clone());
                }
            }
            m
        };
        let mut header = object(&self.header);
        if let Some((name, value, _)) = &self.extra_header {
            header.insert((*name).to_string(), value.clone());
        }
        let alg = header.get("alg").and_then(Value::as_str).unwrap_or("HS256").to_string();
        let secret = if self.right_key { DEV_SECRET } else { "another-key-another-key-another!" };
        compact(
            &Value::Object(header),
            Value::Object(object(&self.claims)).to_string().as_bytes(),
            &alg,
            secret.as_bytes(),
        )
    }

    fn acceptable(&self) -> bool {
        self.right_key
            && self.header.iter().chain(&self.claims).all(|(_, (_, ok))| *ok)
            && self.extra_header.as_ref().is_none_or(|(_, _, ok)| *ok)
    }

    fn claim(&self, name: &str) -> Option<&Value> {
        self.claims.iter().find(|(n, _)| *n == name).and_then(|(_, (v, _))| v.as_ref())
    }
}

fn jwt_case() -> impl Strategy<Value = JwtCase> {
    let header = (jwt_alg(), jwt_header_text(), jwt_header_text(), jwt_header_extra());
    let claims = (
        jwt_iss(),
        jwt_sub(),
        jwt_aud(),
        jwt_exp(),
        jwt_nbf(),
        jwt_text_claim(),
        jwt_scp(),
        jwt_text_claim(),
        jwt_text_claim(),
        prop::option::of(edge_value()),
        jwt_act(),
    );
    (header, claims, prop::bool::weighted(0.93)).prop_map(
        |(
            (alg, typ, kid, extra_header),
            (iss, sub, aud, exp, nbf, scope, scp, client_id, azp, iat, act),
            right_key,
        )| {
            JwtCase {
                header: vec![("alg", alg), ("typ", typ), ("kid", kid)],
                extra_header,
                claims: vec![
                    ("iss", iss),
                    ("sub", sub),
                    ("aud", aud),
                    ("exp", exp),
                    ("nbf", nbf),
                    ("scope", scope),
                    ("scp", scp),
                    ("client_id", client_id),
                    ("azp", azp),
                    ("act", act),
                    // A claim the verifier does not read: any value at all is fine.
                    ("iat", (iat, true)),
                ],
                right_key,
            }
        },
    )
}

/// Claim names and values an attacker would try, for tokens built from nothing.
fn attacker_object(keys: Vec<&'static str>) -> impl Strategy<Value = Value> {
    let value = prop_oneof![
        3 => edge_value(),
        2 => select(vec![
            json!(DEV_ISS),
            json!(RESOURCE),
            json!([RESOURCE]),
            json!(NOW),
            json!(NOW + 3600),
            json!(NOW - 3600),
            json!("HS256"),
            json!("none"),
            json!("agent"),
            json!("payments:admin"),
        ]),
    ];
    prop::collection::vec((select(keys), value), 0..10)
        .prop_map(|entries| Value::Object(entries.into_iter().map(|(k, v)| (k.to_string(), v)).collect()))
}

proptest! {
    #![proptest_config(config(1024))]

    /// A bearer token verifies exactly when it should: HS256 under the dev key, issued by the dev
    /// issuer, naming this resource as (one of its) audience (scheme and host compared without
    /// case, the path exactly), with a non-empty subject and an integer `exp` not past (within the
    /// leeway), no `nbf` still ahead, and every claim it carries of its type. alg none/HS384/HS512/
    /// RS256, another key, a wrong issuer or audience, a missing or fractional or huge exp, a future
    /// nbf, an unknown critical header, wrong types anywhere: refused. A cached verifier answers
    /// the same, twice.
    #[test]
    fn bearer_tokens_verify_exactly_when_valid(case in jwt_case()) {
        let token = case.token();
        let plain = block_on(verifier(0).verify(&token, Audience::Agent));
        prop_assert_eq!(plain.is_ok(), case.acceptable(), "{:?}", plain);
        let cached = verifier(8);
        prop_assert_eq!(&block_on(cached.verify(&token, Audience::Agent)), &plain);
        prop_assert_eq!(&block_on(cached.verify(&token, Audience::Agent)), &plain);
        if let Ok(v) = plain {
            prop_assert_eq!(v.issuer.as_str(), DEV_ISS);
            prop_assert_eq!(Some(&json!(v.subject)), case.claim("sub"));
            prop_assert_eq!(v.actor.as_ref().map(|a| json!(a)), case.claim("act").map(|a| a["sub"].clone()));
            let mut scopes = std::collections::BTreeSet::new();
            if let Some(Value::String(s)) = case.claim("scope") {
                scopes.extend(s.split_whitespace().map(str::to_string));
            }
            match case.claim("scp") {
                Some(Value::String(s)) => scopes.extend(s.split_whitespace().map(str::to_string)),
                Some(Value::Array(list)) => {
                    scopes.extend(list.iter().flat_map(|s| s.as_str().unwrap().split_whitespace().map(str::to_string)))
                }
                _ => {}
            }
            prop_assert_eq!(v.scopes, scopes);
        }
    }

    /// Any change to a valid bearer token's text is refused: it is the signature, not the shape,
    /// that grants access.
    #[test]
    fn tampered_bearer_tokens_are_refused(sub in "[a-z0-9-]{1,12}", scope in "[a-z: ]{0,30}", m in mutation()) {
        let token = mint_dev_token(&Secret::new(DEV_SECRET.into()), DEV_ISS, RESOURCE, &sub, &scope, NOW, 300).unwrap();
        prop_assert!(block_on(verifier(0).verify(&token, Audience::Agent)).is_ok());
        let forged = mutate(&token, &m);
        prop_assert!(block_on(verifier(0).verify(&forged, Audience::Agent)).is_err(), "{:?} verified", m);
    }

    /// Tokens made of anything at all (arbitrary text, base64 of arbitrary bytes, or any header and
    /// claims JSON, even properly signed with the dev key) are answered without a panic, and the
    /// only ones accepted carry the dev issuer, this audience, a subject and a live integer exp.
    #[test]
    fn arbitrary_bearer_tokens_never_panic_and_never_pass_unchecked(
        text in prop_oneof![any_text(64), jws_shaped()],
        header in attacker_object(vec!["alg", "alg", "typ", "kid", "crit", "b64", "jwk", "x5c", "cty", "zip", "enc"]),
        claims in attacker_object(vec!["iss", "sub", "aud", "exp", "nbf", "iat", "scope", "scp", "client_id", "azp", "jti", "act"]),
        with_alg in prop::bool::ANY,
    ) {
        prop_assert!(block_on(verifier(0).verify(&text, Audience::Agent)).is_err());
        let mut header = header;
        if with_alg {
            header["alg"] = json!("HS256");
        }
        let token = compact(&header, claims.to_string().as_bytes(), "HS256", DEV_SECRET.as_bytes());
        if block_on(verifier(0).verify(&token, Audience::Agent)).is_ok() {
            prop_assert_eq!(&header["alg"], &json!("HS256"));
            prop_assert_eq!(&claims["iss"], &json!(DEV_ISS));
            prop_assert!(claims["sub"].as_str().is_some_and(|s| !s.is_empty()));
            prop_assert!(claims["exp"].as_i64().is_some_and(|exp| exp.saturating_add(LEEWAY) >= NOW));
            prop_assert!(claims["aud"] == json!(RESOURCE) || claims["aud"] == json!([RESOURCE]));
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The scope peek against rmcp's own parse
// ---------------------------------------------------------------------------------------------

/// A JSON text, built so it can say what `serde_json::Value` cannot: duplicate keys, escaped
/// spellings of the same key, any whitespace.
#[derive(Debug, Clone)]
enum Json {
    Lit(&'static str),
    Num(i64),
    Str(String, Esc),
    Arr(Vec<Json>),
    Obj(Vec<(String, Esc, Json)>),
}

/// How a string is spelled in the JSON text (all mean the same string).
#[derive(Debug, Clone, Copy)]
enum Esc {
    Plain,
    /// Every UTF-16 unit as `\uXXXX` (`"\u006dethod"` is `"method"`).
    Unicode,
    /// '/' as `\/` (`"tools\/call"` is `"tools/call"`).
    Solidus,
}

fn quote(s: &str, esc: Esc) -> String {
    match esc {
        Esc::Plain => serde_json::to_string(s).unwrap(),
        Esc::Solidus => serde_json::to_string(s).unwrap().replace('/', "\\/"),
        Esc::Unicode => {
            let mut out = String::from('"');
            for unit in s.encode_utf16() {
                write!(out, "\\u{unit:04x}").unwrap();
            }
            out.push('"');
            out
        }
    }
}

/// The next whitespace of the case's cycle (whitespace between tokens means nothing to JSON).
fn space(ws: &[&str], k: &mut usize, out: &mut String) {
    out.push_str(ws[*k % ws.len()]);
    *k += 1;
}

fn render(j: &Json, ws: &[&str], k: &mut usize, out: &mut String) {
    match j {
        Json::Lit(l) => out.push_str(l),
        Json::Num(n) => out.push_str(&n.to_string()),
        Json::Str(s, esc) => out.push_str(&quote(s, *esc)),
        Json::Arr(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                space(ws, k, out);
                render(item, ws, k, out);
            }
            space(ws, k, out);
            out.push(']');
        }
        Json::Obj(entries) => {
            out.push('{');
            for (i, (key, esc, value)) in entries.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                space(ws, k, out);
                out.push_str(&quote(key, *esc));
                space(ws, k, out);
                out.push(':');
                space(ws, k, out);
                render(value, ws, k, out);
            }
            space(ws, k, out);
            out.push('}');
        }
    }
}

fn esc() -> impl Strategy<Value = Esc> + Clone {
    prop_oneof![6 => Just(Esc::Plain), 1 => Just(Esc::Unicode), 1 => Just(Esc::Solidus)]
}

const METHODS: [&str; 20] = [
    "tools/call",
    "tools/call",
    "tools/call",
    "tools/list",
    "initialize",
    "resources/read",
    "prompts/get",
    "ping",
    "notifications/initialized",
    "notifications/cancelled",
    "resources/list",
    "completion/complete",
    "logging/setLevel",
    "Tools/Call",
    "tools/call ",
    " tools/call",
    "tools/call\u{0}",
    "tools/call\u{200b}",
    "tools/calls",
    "tools\\call",
];

fn method_name() -> BoxedStrategy<String> {
    prop_oneof![
        4 => Just("tools/call".to_string()),
        4 => select(METHODS.to_vec()).prop_map(String::from),
        1 => any_text(12),
    ]
    .boxed()
}

/// Tool names: the real ones, near misses an attacker would try, and anything.
fn tool_name() -> BoxedStrategy<String> {
    let real: Vec<&'static str> = TOOLS.iter().map(|t| t.name).chain(ALIASES.iter().map(|a| a.name)).collect();
    let near = |(name, how): (&str, usize)| match how {
        0 => name.to_uppercase(),
        1 => format!("{name} "),
        2 => format!(" {name}"),
        3 => format!("{name}\u{0}"),
        4 => format!("{name}\u{200b}"),
        5 => name.replacen('a', "\u{430}", 1), // Cyrillic а
        6 => format!("{name}\u{301}"),
        _ => name.replace('_', "-"),
    };
    prop_oneof![
        6 => select(real.clone()).prop_map(String::from),
        2 => (select(real), 0usize..8).prop_map(near),
        1 => any_text(12),
    ]
    .boxed()
}

fn scalar() -> BoxedStrategy<Json> {
    prop_oneof![
        Just(Json::Lit("null")),
        Just(Json::Lit("true")),
        Just(Json::Lit("1.5")),
        Just(Json::Lit("-0")),
        Just(Json::Lit("1e400")),
        (-5..100_i64).prop_map(Json::Num),
        any::<i64>().prop_map(Json::Num),
        (any_text(8), esc()).prop_map(|(s, e)| Json::Str(s, e)),
    ]
    .boxed()
}

/// Keys that mean something to one of the two readers, and any other.
fn key() -> BoxedStrategy<String> {
    prop_oneof![
        4 => select(vec!["name", "method", "params", "arguments", "id", "jsonrpc", "_meta", "Name"]).prop_map(String::from),
        1 => any_text(6),
    ]
    .boxed()
}

/// Nested JSON whose keys and strings look like the ones the readers look for.
fn nested() -> BoxedStrategy<Json> {
    let leaf = prop_oneof![3 => scalar(), 1 => (tool_name(), esc()).prop_map(|(s, e)| Json::Str(s, e))];
    leaf.prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Json::Arr),
            prop::collection::vec((key(), esc(), inner), 0..4).prop_map(Json::Obj),
        ]
    })
    .boxed()
}

fn name_value() -> BoxedStrategy<Json> {
    prop_oneof![
        10 => (tool_name(), esc()).prop_map(|(s, e)| Json::Str(s, e)),
        1 => scalar(),
        1 => tool_name().prop_map(|n| Json::Arr(vec![Json::Str(n, Esc::Plain)])),
        1 => tool_name().prop_map(|n| Json::Obj(vec![("name".into(), Esc::Plain, Json::Str(n, Esc::Plain))])),
    ]
    .boxed()
}

/// `arguments`: mostly an object (as rmcp requires), with look-alike keys and values inside.
fn arguments() -> BoxedStrategy<Json> {
    prop_oneof![4 => prop::collection::vec((key(), esc(), nested()), 0..4).prop_map(Json::Obj), 1 => nested()].boxed()
}

fn params() -> BoxedStrategy<Json> {
    let entry = prop_oneof![
        6 => (esc(), name_value()).prop_map(|(e, v)| ("name".to_string(), e, v)),
        3 => (esc(), arguments()).prop_map(|(e, v)| ("arguments".to_string(), e, v)),
        1 => (select(vec!["_meta", "task", "uri", "inputResponses", "requestState", "cursor"]), esc(), nested())
            .prop_map(|(k, e, v)| (k.to_string(), e, v)),
        1 => (key(), esc(), nested()),
    ];
    let call = (esc(), name_value(), prop::option::weighted(0.6, (esc(), arguments()))).prop_map(|(e, name, args)| {
        let mut entries = vec![("name".to_string(), e, name)];
        entries.extend(args.map(|(e, a)| ("arguments".to_string(), e, a)));
        entries
    });
    prop_oneof![
        12 => prop_oneof![3 => call, 1 => prop::collection::vec(entry, 0..4)].prop_shuffle().prop_map(Json::Obj),
        1 => scalar(),
        1 => prop::collection::vec(name_value(), 0..2).prop_map(Json::Arr),
    ]
    .boxed()
}

/// One JSON-RPC message, mostly well-formed, sometimes with a member twice or a stray member.
fn message() -> BoxedStrategy<Json> {
    let jsonrpc = prop_oneof![
        10 => Just(Json::Str("2.0".into(), Esc::Plain)),
        1 => Just(Json::Str("1.0".into(), Esc::Plain)),
        1 => Just(Json::Lit("2.0")),
    ];
    let id = prop::option::weighted(
        0.9,
        prop_oneof![
            4 => (0..1000_i64).prop_map(Json::Num),
            1 => "[a-z0-9-]{0,8}".prop_map(|s| Json::Str(s, Esc::Plain)),
            1 => Just(Json::Lit("null")),
            1 => Just(Json::Lit("1.5")),
        ],
    );
    let method = prop::option::weighted(0.95, (method_name(), esc()).prop_map(|(m, e)| Json::Str(m, e)));
    let stray = prop_oneof![
        3 => (Just("method".to_string()), esc(), (method_name(), esc()).prop_map(|(m, e)| Json::Str(m, e))),
        3 => (Just("params".to_string()), esc(), params()),
        1 => (
            select(vec!["id", "jsonrpc", "result", "error", "Method", "name"]).prop_map(String::from),
            esc(),
            nested()
        ),
        1 => (any_text(6), esc(), nested()),
    ];
    let strays = prop_oneof![4 => Just(vec![]), 1 => prop::collection::vec(stray, 1..3)];
    (jsonrpc, id, method, prop::option::weighted(0.9, params()), [esc(), esc(), esc(), esc()], strays)
        .prop_flat_map(|(jsonrpc, id, method, params, escs, strays)| {
            let mut entries = vec![("jsonrpc".to_string(), escs[0], jsonrpc)];
            entries.extend(id.map(|v| ("id".to_string(), escs[1], v)));
            entries.extend(method.map(|v| ("method".to_string(), escs[2], v)));
            entries.extend(params.map(|v| ("params".to_string(), escs[3], v)));
            entries.extend(strays);
            Just(entries).prop_shuffle()
        })
        .prop_map(Json::Obj)
        .boxed()
}

/// A byte-level change after rendering: the bytes JSON parsers disagree about most.
#[derive(Debug, Clone)]
enum Edit {
    Keep,
    Bom,
    Truncate(Index),
    Insert(Index, &'static [u8]),
    Append(&'static str),
}

fn edit() -> impl Strategy<Value = Edit> {
    prop_oneof![
        12 => Just(Edit::Keep),
        1 => Just(Edit::Bom),
        1 => any::<Index>().prop_map(Edit::Truncate),
        2 => (
            any::<Index>(),
            select(vec![
                &b"\xff"[..],
                &b"\xc3"[..],
                &b"\xed\xa0\x80"[..],
                &b"\xc0\xaf"[..],
                &b"\x00"[..],
                &b"\\"[..],
                &b"\""[..],
            ])
        )
            .prop_map(|(i, b)| Edit::Insert(i, b)),
        1 => select(vec![" ", "\n", "x", "{}", "\u{0}", "]", ",", "\u{feff}"]).prop_map(Edit::Append),
    ]
}

fn body() -> impl Strategy<Value = Vec<u8>> {
    let document = prop_oneof![
        10 => message(),
        1 => prop::collection::vec(message(), 0..3).prop_map(Json::Arr),
        1 => scalar(),
    ];
    let whitespace = prop::collection::vec(select(vec!["", "", "", " ", "\n", "\t", "\r\n  "]), 1..6);
    let structured = (document, whitespace, edit()).prop_map(|(doc, ws, edit)| {
        let mut text = String::new();
        render(&doc, &ws, &mut 0, &mut text);
        let mut bytes = text.into_bytes();
        match edit {
            Edit::Keep => {}
            Edit::Bom => bytes = [&b"\xef\xbb\xbf"[..], &bytes].concat(),
            Edit::Truncate(at) => bytes.truncate(at.index(bytes.len().max(1))),
            Edit::Insert(at, b) => {
                let i = at.index(bytes.len() + 1);
                bytes = [&bytes[..i], b, &bytes[i..]].concat();
            }
            Edit::Append(s) => bytes.extend_from_slice(s.as_bytes()),
        }
        bytes
    });
    prop_oneof![20 => structured, 1 => prop::collection::vec(any::<u8>(), 0..64)]
}

proptest! {
    #![proptest_config(config(8192))]

    /// The scope check and rmcp read every body alike. Whenever rmcp accepts a body (and only then
    /// does anything run), the peek read it too, as one message, with the same method and, for a
    /// tool call, the same tool, so the scope demanded is the scope of what runs. Tried: duplicate
    /// members (`"method"` twice, `"params"` twice, `"name"` twice), escaped spellings of keys and
    /// values, near-miss method and tool names, nested look-alikes, batches, non-objects, BOMs,
    /// invalid UTF-8, truncation, trailing bytes, and raw random bytes. Nothing panics.
    #[test]
    fn the_peek_and_rmcp_agree_on_method_and_tool(body in body()) {
        let peeked = peek(&body);
        if let Ok(message) = serde_json::from_slice::<ClientJsonRpcMessage>(&body) {
            let text = String::from_utf8_lossy(&body);
            prop_assert!(peeked.is_some(), "rmcp read a body the peek could not: {}", text);
            let peeked = peeked.unwrap();
            prop_assert_eq!(peeked.len(), 1, "{}", text);
            let (method, tool) = rmcp_reading(&message);
            prop_assert_eq!(&peeked[0].method, &method, "{}", text);
            if let Some(tool) = tool {
                prop_assert_eq!(peeked[0].name.as_deref(), Some(tool.as_str()), "{}", text);
            }
        }
    }
}

/// serde_json's `Value` gives its private RawValue marker a meaning when it is a key: a body
/// carrying it in a member rmcp ignores was unreadable to a `Value`-based peek, so the scope check
/// demanded nothing while rmcp ran the tool (found by fuzzing: `fuzz/regressions/scope_peek/`).
#[test]
fn serde_jsons_raw_value_marker_does_not_blind_the_peek() {
    let bodies = [
        r#"{"jsonrpc":"2.0","id":1,"x":{"$serde_json::private::RawValue":"not json"},"method":"tools/call","params":{"name":"create_payment","arguments":{}}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","x":{"$serde_json::private::RawValue":"{}"},"params":{"name":"create_payment"}}"#,
    ];
    for body in bodies {
        let (method, tool) = rmcp_reading(&serde_json::from_str::<ClientJsonRpcMessage>(body).unwrap());
        assert_eq!((method.as_deref(), tool.as_deref()), (Some("tools/call"), Some("create_payment")), "{body}");
        let peeked = peek(body.as_bytes()).unwrap_or_else(|| panic!("the peek could not read {body}"));
        assert_eq!(peeked[0].method.as_deref(), Some("tools/call"), "{body}");
        assert_eq!(peeked[0].name.as_deref(), Some("create_payment"), "{body}");
    }
}

/// Duplicate members are the classic way to make two JSON readers disagree: serde_json's `Value`
/// (the peek) keeps the last, other readers the first. rmcp refuses a body with `method`, `params`,
/// `id` or `jsonrpc` twice, and reads a `tools/call` with `params.name` twice as no tool call at all
/// (a custom request, answered "method not found"). So the peek's last-wins reading can never name
/// one tool while rmcp runs another. If an rmcp upgrade changes that, this test says so first.
#[test]
fn duplicate_members_never_reach_a_tool() {
    let bodies = [
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/list","method":"tools/call","params":{"name":"create_payment"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","method":"tools/list","params":{"name":"create_payment"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"initialize","method":"tools/call","params":{"name":"create_payment"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_balance"},"params":{"name":"create_payment"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_payment"},"params":{"name":"get_balance"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_balance","name":"create_payment"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"create_payment","name":"get_balance"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"get_balance","n\u0061me":"create_payment"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"\u006dethod":"tools/list","method":"tools/call","params":{"name":"create_payment"}}"#,
        r#"{"jsonrpc":"2.0","id":1,"id":2,"method":"tools/call","params":{"name":"create_payment"}}"#,
    ];
    for body in bodies {
        match serde_json::from_slice::<ClientJsonRpcMessage>(body.as_bytes()) {
            Err(_) => {}
            Ok(message) => {
                let (method, tool) = rmcp_reading(&message);
                assert_eq!(tool, None, "rmcp runs a tool for {body}");
                assert_eq!(peek(body.as_bytes()).unwrap()[0].method, method, "{body}");
            }
        }
    }
}

/// The two readers agree on the plain cases too, escapes included: `"tools\/call"` and
/// `"\u0063reate_payment"` are `tools/call` and `create_payment` to both.
#[test]
fn escaped_spellings_read_alike() {
    let body = r#"{"jsonrpc":"2.0","id":1,"method":"tools\/call","params":{"n\u0061me":"\u0063reate_payment"}}"#;
    let message = serde_json::from_slice::<ClientJsonRpcMessage>(body.as_bytes()).unwrap();
    assert_eq!(rmcp_reading(&message), (Some("tools/call".into()), Some("create_payment".into())));
    let peeked = peek(body.as_bytes()).unwrap();
    assert_eq!(peeked[0].method.as_deref(), Some("tools/call"));
    assert_eq!(peeked[0].name.as_deref(), Some("create_payment"));
}

/// Deep nesting inside `arguments`: up to serde_json's recursion limit both readers read the call;
/// past it rmcp refuses (nothing runs) while the peek, which leaves `arguments` unread, may still
/// read the method and tool; neither crashes on the way.
#[test]
fn deep_nesting_is_read_alike_up_to_the_limit() {
    for depth in 100..=140 {
        let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{{"name":"create_payment","arguments":{{"a":{nested}}}}}}}"#
        );
        let rmcp = serde_json::from_slice::<ClientJsonRpcMessage>(body.as_bytes()).map(|m| rmcp_reading(&m));
        match (rmcp, peek(body.as_bytes())) {
            (Ok(reading), Some(peeked)) => {
                assert_eq!(reading, (Some("tools/call".into()), Some("create_payment".into())));
                assert_eq!(peeked[0].name.as_deref(), Some("create_payment"));
            }
            (Err(_), None) => {}
            (Err(_), Some(peeked)) => assert_eq!(peeked[0].name.as_deref(), Some("create_payment")),
            (rmcp, peeked) => panic!("depth {depth}: rmcp {rmcp:?}, peek {peeked:?}"),
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Idempotency keys and fingerprints
// ---------------------------------------------------------------------------------------------

fn deriver() -> KeyDeriver {
    KeyDeriver::new(Secret::new("idempotency-secret".into()))
}

/// create_payment's arguments as an agent sends them.
#[derive(Debug, Clone, PartialEq)]
struct PaymentArgs {
    from: String,
    to: String,
    amount: String,
    currency: &'static str,
    memo: Option<String>,
}

impl PaymentArgs {
    /// The fingerprint `Gateway::create_payment` keeps under the key, by the gateway's own
    /// functions: its parsers, `idempotency::payment_args` and `idempotency::call_fingerprint`.
    fn fingerprint(&self) -> String {
        call_fingerprint(&self.canonical(), None)
    }

    /// The same under a closed mandate's key, which also pins the operation_id.
    fn mandate_fingerprint(&self, operation_id: &str) -> String {
        call_fingerprint(&self.canonical(), Some(operation_id))
    }

    fn canonical(&self) -> Value {
        let currency = Currency::parse(self.currency).unwrap();
        let amount = Money::parse(&self.amount, currency).unwrap();
        paygate::idempotency::payment_args(
            &AccountId::parse(&self.from).unwrap(),
            &AccountId::parse(&self.to).unwrap(),
            amount,
            &self.memo,
        )
    }

    /// What the arguments mean, for comparing two calls.
    fn meaning(&self) -> (String, String, i64, &'static str, Option<String>) {
        let minor = parse_minor(&self.amount, Currency::parse(self.currency).unwrap()).unwrap();
        (self.from.clone(), self.to.clone(), minor, self.currency, self.memo.clone())
    }
}

/// Payment arguments from small pools, so that two draws often mean the same payment.
fn payment_args() -> impl Strategy<Value = PaymentArgs> {
    let account = select(vec!["acct-A", "acct-B", "acct-a", "acct-B.1", "acct:B"]).prop_map(String::from);
    let memo =
        prop::option::of(select(vec!["", " ", "invoice 7", "invoice 7 ", "null", "ínvoice"]).prop_map(String::from));
    (account.clone(), account, 1..5_i64, select(vec!["KES", "USD", "JPY", "KWD"]), 0usize..3, 0usize..3, memo).prop_map(
        |(from, to, minor, currency, leading, trim, memo)| {
            let amount = respell(&format_minor(minor, Currency::parse(currency).unwrap()), leading, trim);
            PaymentArgs { from, to, amount, currency, memo }
        },
    )
}

/// Strings made of the characters most likely to make two joined tuples look alike.
fn key_part() -> impl Strategy<Value = String> {
    prop::collection::vec(select(vec!['a', 'b', '|', ':', '\u{0}', '\u{8}', 'é']), 0..4).prop_map(String::from_iter)
}

proptest! {
    #![proptest_config(config(1024))]

    /// A retry that spells the same amount differently ("10" and "10.00", "010.0") is the same
    /// payment: same fingerprint, so it replays instead of conflicting.
    #[test]
    fn spellings_of_one_payment_fingerprint_alike(args in payment_args(), leading in 0usize..3, trim in 0usize..3) {
        let currency = Currency::parse(args.currency).unwrap();
        let minor = parse_minor(&args.amount, currency).unwrap();
        let respelled = PaymentArgs { amount: respell(&format_minor(minor, currency), leading, trim), ..args.clone() };
        prop_assert_eq!(respelled.fingerprint(), args.fingerprint());
    }

    /// Two calls fingerprint alike exactly when they mean the same payment: any difference in
    /// payer, payee, amount (one minor unit is enough), currency or memo (an absent memo and an
    /// empty one, "null" and no memo, a trailing space) is a different fingerprint, so a reused
    /// operation_id with other arguments is a conflict, never a replay of the wrong payment.
    #[test]
    fn payment_fingerprints_collide_only_for_the_same_payment(a in payment_args(), b in payment_args()) {
        prop_assert_eq!(a.fingerprint() == b.fingerprint(), a.meaning() == b.meaning(), "{:?} / {:?}", a, b);
    }

    /// Under a closed mandate the operation_id is part of the fingerprint too: another
    /// operation_id with the same mandate is a different operation, and no mandate fingerprint
    /// ever equals a plain one.
    #[test]
    fn mandate_fingerprints_pin_the_operation(
        a in payment_args(), b in payment_args(), op_a in "[a-z0-9:._-]{1,8}", op_b in "[a-z0-9:._-]{1,8}",
    ) {
        let same = a.meaning() == b.meaning() && op_a == op_b;
        prop_assert_eq!(a.mandate_fingerprint(&op_a) == b.mandate_fingerprint(&op_b), same);
        prop_assert_ne!(a.mandate_fingerprint(&op_a), b.fingerprint());
    }

    /// A refund without an amount ("everything refundable") never fingerprints like one with an
    /// amount, whatever that amount; amounts and reasons that differ never fingerprint alike.
    #[test]
    fn refund_fingerprints_tell_every_amount_apart(
        a in prop::option::of(0..5_i64), b in prop::option::of(0..5_i64),
        reason_a in prop::option::of("[a ]{0,2}"), reason_b in prop::option::of("[a ]{0,2}"),
    ) {
        let paid = PaymentId::generate();
        let refund = |amount: Option<i64>, reason: &Option<String>| call_fingerprint(&refund_args(&paid, amount, reason), None);
        prop_assert_eq!(refund(a, &reason_a) == refund(b, &reason_b), a == b && reason_a == reason_b);
    }

    /// Idempotency keys of distinct (issuer, subject, tool, operation_id) tuples never collide,
    /// however the parts are cut: ("a|b", "c") and ("a", "b|c") are different agents' keys.
    #[test]
    fn keys_collide_only_for_the_same_tuple(
        a in (key_part(), key_part(), key_part(), key_part()), b in (key_part(), key_part(), key_part(), key_part()),
    ) {
        let d = deriver();
        let key = |(iss, sub, tool, op): &(String, String, String, String)| d.key(iss, sub, tool, op);
        prop_assert_eq!(key(&a) == key(&b), a == b);
    }

    /// The same four parts joined into one string and cut at different places give different
    /// keys: no separator, escape or length trick makes one tuple's key another's.
    #[test]
    fn keys_of_one_string_cut_differently_differ(
        joined in prop::collection::vec(select(vec!['a', '|', ':', '\u{0}']), 0..8).prop_map(String::from_iter),
        cuts_a in [any::<Index>(), any::<Index>(), any::<Index>()],
        cuts_b in [any::<Index>(), any::<Index>(), any::<Index>()],
    ) {
        let cut = |cuts: &[Index; 3]| {
            let mut at: Vec<usize> = cuts.iter().map(|i| i.index(joined.len() + 1)).collect();
            at.sort_unstable();
            let part = |from: usize, to: usize| joined[from..to].to_string();
            (part(0, at[0]), part(at[0], at[1]), part(at[1], at[2]), part(at[2], joined.len()))
        };
        let (a, b) = (cut(&cuts_a), cut(&cuts_b));
        let d = deriver();
        prop_assert_eq!(d.key(&a.0, &a.1, &a.2, &a.3) == d.key(&b.0, &b.1, &b.2, &b.3), a == b);
    }
}

/// The separator attack of issue 12, spelled out: subject "a|b" with operation "c" and subject "a"
/// with operation "b|c" are two keys, as are "a" + "bc" and "ab" + "c".
#[test]
fn separator_crafted_tuples_get_their_own_keys() {
    let d = deriver();
    assert_ne!(d.key("iss", "a|b", "create_payment", "c"), d.key("iss", "a", "create_payment", "b|c"));
    assert_ne!(d.key("iss", "a", "create_payment", "bc"), d.key("iss", "ab", "create_payment", "c"));
    assert_ne!(d.key("iss|sub", "", "create_payment", "op"), d.key("iss", "sub", "create_payment", "op"));
}

// ---- Policy changes: "widens" is effective authority (issue 52, item 2) ----

use paygate::domain::money::MoneyMap;
use paygate::domain::policy::Profile;
use paygate::domain::policy_doc::{PolicyDocument, review};

const SUBJECTS: [&str; 3] = ["a1", "a2", "a3"];
const USERS: [&str; 2] = ["u1", "u2"];
const CLIENTS: [&str; 2] = ["c1", "c2"];
const ACCOUNTS: [&str; 3] = ["acct-A", "acct-B", "acct-C"];
const IDP: &str = "https://idp.test";

fn kes_text(minor: i64) -> String {
    format!("{}.{:02}", minor / 100, minor % 100)
}

/// One profile as JSON: matchers from small alphabets (so profiles often name the same principal)
/// and every dimension of authority.
fn policy_profile() -> impl Strategy<Value = Value> {
    (
        (
            proptest::sample::subsequence(SUBJECTS.to_vec(), 0..=2),
            proptest::sample::subsequence(USERS.to_vec(), 0..=1),
            proptest::sample::subsequence(CLIENTS.to_vec(), 0..=1),
            any::<bool>(),
        ),
        (
            proptest::sample::subsequence(ACCOUNTS.to_vec(), 0..=3),
            prop::option::of(0..4_i64),
            0..4_i64,
            1..4_i64,
            any::<bool>(),
            select(vec!["open", "known", "allow_list"]),
            0..3_i64,
            prop::option::of(1..3_i64),
        ),
    )
        .prop_map(
            |((subjects, users, clients, bound), (accounts, auto, daily, cpm, passkey, mode, cooling, quota))| {
                let mut p = json!({
                    "name": "",
                    "subjects": subjects, "users": users, "client_ids": clients,
                    "issuer": if bound { IDP } else { "" },
                    "allowed_accounts": accounts,
                    "daily_limit": {"KES": kes_text(daily * 100_000 + 100_000)},
                    "calls_per_minute": cpm,
                    "daily_payments_max": cpm,
                    "passkey_required": passkey,
                    "payees": {"mode": mode, "cooling_off_secs": cooling * 3600},
                });
                if let Some(a) = auto {
                    p["autonomous_limit"] = json!({"KES": kes_text(a * 100_000)});
                }
                if let Some(q) = quota {
                    p["tool_calls_per_minute"] = json!({"create_payment": q});
                }
                p
            },
        )
}

fn policy_doc() -> impl Strategy<Value = Value> {
    (prop::collection::vec(policy_profile(), 1..5), any::<Index>()).prop_map(|(mut profiles, default)| {
        for (i, p) in profiles.iter_mut().enumerate() {
            p["name"] = json!(format!("p{i}"));
        }
        let default = format!("p{}", default.index(profiles.len()));
        json!({"policy": {"default_profile": default, "profiles": profiles}, "tools": {"disabled": [], "approval_required": []}})
    })
}

/// An edit an operator might make; applied to profile `Index`.
#[derive(Debug, Clone)]
enum PolicyEdit {
    Swap(Index, Index),
    Auto(Index, i64),
    Daily(Index, i64),
    Account(Index, Index),
    Subject(Index, Index),
    User(Index, Index),
    Client(Index, Index),
    Issuer(Index),
    Passkey(Index),
    Mode(Index, Index),
    Cpm(Index, i64),
    Cooling(Index, i64),
    Default(Index),
    Disable(bool),
}

fn policy_edit() -> impl Strategy<Value = PolicyEdit> {
    prop_oneof![
        3 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| PolicyEdit::Swap(a, b)),
        2 => (any::<Index>(), -2..3_i64).prop_map(|(a, d)| PolicyEdit::Auto(a, d)),
        1 => (any::<Index>(), -2..3_i64).prop_map(|(a, d)| PolicyEdit::Daily(a, d)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| PolicyEdit::Account(a, b)),
        2 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| PolicyEdit::Subject(a, b)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| PolicyEdit::User(a, b)),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| PolicyEdit::Client(a, b)),
        1 => any::<Index>().prop_map(PolicyEdit::Issuer),
        1 => any::<Index>().prop_map(PolicyEdit::Passkey),
        1 => (any::<Index>(), any::<Index>()).prop_map(|(a, b)| PolicyEdit::Mode(a, b)),
        1 => (any::<Index>(), -1..2_i64).prop_map(|(a, d)| PolicyEdit::Cpm(a, d)),
        1 => (any::<Index>(), -1..2_i64).prop_map(|(a, d)| PolicyEdit::Cooling(a, d)),
        1 => any::<Index>().prop_map(PolicyEdit::Default),
        1 => any::<bool>().prop_map(PolicyEdit::Disable),
    ]
}

fn toggle_name(list: &mut Value, item: &str) {
    let a = list.as_array_mut().unwrap();
    match a.iter().position(|x| x == item) {
        Some(i) => _ = a.remove(i),
        None => a.push(json!(item)),
    }
}

fn minor_of(v: &Value) -> Option<i64> {
    v.as_str().map(|s| parse_minor(s, Currency::parse("KES").unwrap()).unwrap())
}

fn apply_edit(doc: &mut Value, e: &PolicyEdit) {
    let n = doc["policy"]["profiles"].as_array().unwrap().len();
    let profiles = doc["policy"]["profiles"].as_array_mut().unwrap();
    match e {
        PolicyEdit::Swap(a, b) => profiles.swap(a.index(n), b.index(n)),
        PolicyEdit::Auto(a, d) => {
            let p = &mut profiles[a.index(n)];
            let now = minor_of(&p["autonomous_limit"]["KES"]).unwrap_or(0);
            p["autonomous_limit"] = json!({"KES": kes_text((now + d * 50_000).max(0))});
        }
        PolicyEdit::Daily(a, d) => {
            let p = &mut profiles[a.index(n)];
            let now = minor_of(&p["daily_limit"]["KES"]).unwrap_or(0);
            p["daily_limit"] = json!({"KES": kes_text((now + d * 50_000).max(0))});
        }
        PolicyEdit::Account(a, b) => toggle_name(&mut profiles[a.index(n)]["allowed_accounts"], ACCOUNTS[b.index(3)]),
        PolicyEdit::Subject(a, b) => toggle_name(&mut profiles[a.index(n)]["subjects"], SUBJECTS[b.index(3)]),
        PolicyEdit::User(a, b) => toggle_name(&mut profiles[a.index(n)]["users"], USERS[b.index(2)]),
        PolicyEdit::Client(a, b) => toggle_name(&mut profiles[a.index(n)]["client_ids"], CLIENTS[b.index(2)]),
        PolicyEdit::Issuer(a) => {
            let p = &mut profiles[a.index(n)];
            p["issuer"] = json!(if p["issuer"] == IDP { "" } else { IDP });
        }
        PolicyEdit::Passkey(a) => {
            let p = &mut profiles[a.index(n)];
            p["passkey_required"] = json!(!p["passkey_required"].as_bool().unwrap());
        }
        PolicyEdit::Mode(a, b) => {
            profiles[a.index(n)]["payees"]["mode"] = json!(["open", "known", "allow_list"][b.index(3)])
        }
        PolicyEdit::Cpm(a, d) => {
            let p = &mut profiles[a.index(n)];
            p["calls_per_minute"] = json!((p["calls_per_minute"].as_i64().unwrap() + d).max(1));
        }
        PolicyEdit::Cooling(a, d) => {
            let p = &mut profiles[a.index(n)];
            p["payees"]["cooling_off_secs"] =
                json!((p["payees"]["cooling_off_secs"].as_i64().unwrap() + d * 3600).max(0));
        }
        PolicyEdit::Default(a) => doc["policy"]["default_profile"] = json!(format!("p{}", a.index(n))),
        PolicyEdit::Disable(on) => {
            doc["tools"]["disabled"] = if *on { json!(["create_payment"]) } else { json!([]) };
        }
    }
}

fn parse_doc(v: &Value) -> Option<PolicyDocument> {
    let high: MoneyMap = serde_json::from_value(json!({"KES": "100000.00"})).unwrap();
    PolicyDocument::parse(&v.to_string(), &high).ok()
}

/// The definition, by brute force and independently of the gateway's comparison: some principal
/// (every name the alphabets hold, and one no profile names, at every level) is allowed more after
/// than before in some dimension, or a tool became callable.
fn wider_for_someone(before: &PolicyDocument, after: &PolicyDocument) -> bool {
    let (b, a) = (before.live(0, None), after.live(0, None));
    if b.disabled.iter().any(|t| !a.disabled.contains(t)) {
        return true;
    }
    let kes = Currency::parse("KES").unwrap();
    let more = |x: &Profile, y: &Profile| -> bool {
        let zero = |m: &std::collections::HashMap<Currency, i64>| m.get(&kes).copied().unwrap_or(0);
        let cap = |m: &std::collections::HashMap<Currency, i64>| m.get(&kes).copied().unwrap_or(i64::MAX);
        let quota = |p: &Profile| p.tool_calls_per_minute.get("create_payment").copied().unwrap_or(u32::MAX);
        let strict = |p: &Profile| p.payees.mode as u8;
        y.allowed_accounts.iter().any(|acct| !x.allowed_accounts.contains(acct))
            || zero(&y.autonomous_limit_minor) > zero(&x.autonomous_limit_minor)
            || cap(&y.daily_limit_minor) > cap(&x.daily_limit_minor)
            || cap(&y.daily_refund_limit_minor) > cap(&x.daily_refund_limit_minor)
            || y.daily_payments_max > x.daily_payments_max
            || y.calls_per_minute > x.calls_per_minute
            || quota(y) > quota(x)
            || (x.passkey_required && !y.passkey_required)
            || strict(y) < strict(x)
            || y.payees.cooling_off_secs < x.payees.cooling_off_secs
    };
    let subjects = SUBJECTS.iter().copied().chain(["nobody"]);
    for iss in [IDP, "https://other.test"] {
        for s in subjects.clone() {
            for u in USERS.iter().copied().map(Some).chain([Some("nobody"), None]) {
                for c in CLIENTS.iter().copied().map(Some).chain([Some("nobody"), None]) {
                    if more(&b.profiles.resolve(iss, s, u, c), &a.profiles.resolve(iss, s, u, c)) {
                        return true;
                    }
                }
            }
        }
    }
    false
}

proptest! {
    #![proptest_config(config(256))]

    /// Swaps, moved matchers, raised and lowered numbers, in any mix: the gateway calls a change
    /// widening exactly when some principal is allowed more after it (the definition, by brute
    /// force over every principal).
    #[test]
    fn a_change_widens_exactly_when_some_principal_may_do_more(
        doc in policy_doc(), edits in prop::collection::vec(policy_edit(), 1..6),
    ) {
        let mut after = doc.clone();
        for e in &edits {
            apply_edit(&mut after, e);
        }
        let (Some(b), Some(a)) = (parse_doc(&doc), parse_doc(&after)) else { return Ok(()) };
        let r = review(&b, &a, None);
        prop_assert_eq!(r.widens, wider_for_someone(&b, &a), "{:?} {:#?}", edits, r.authority);
    }

    /// Narrowings alone (limits lowered, accounts taken away, passkeys required, payee rules made
    /// stricter, quotas lowered, a tool disabled) never widen; the same narrowings with one
    /// principal's own profile raised by a cent, hidden among them and a reordering of profiles
    /// that match nobody, always do.
    #[test]
    fn narrowings_never_widen_and_one_raise_among_them_always_does(
        doc in policy_doc(),
        narrowings in prop::collection::vec((any::<Index>(), 0..6_u8), 0..6),
        who in (any::<Index>(), any::<Index>(), any::<Index>()),
    ) {
        let Some(b) = parse_doc(&doc) else { return Ok(()) };
        let n = doc["policy"]["profiles"].as_array().unwrap().len();
        let mut after = doc.clone();
        for (i, kind) in &narrowings {
            let p = &mut after["policy"]["profiles"][i.index(n)];
            match kind {
                0 => if let Some(m) = minor_of(&p["autonomous_limit"]["KES"]) { p["autonomous_limit"]["KES"] = json!(kes_text(m / 2)) },
                1 => { let m = minor_of(&p["daily_limit"]["KES"]).unwrap(); p["daily_limit"]["KES"] = json!(kes_text(m / 2)) }
                2 => _ = p["allowed_accounts"].as_array_mut().unwrap().pop(),
                3 => p["passkey_required"] = json!(true),
                4 => p["payees"]["mode"] = json!("allow_list"),
                _ => p["calls_per_minute"] = json!(1),
            }
        }
        after["tools"]["disabled"] = json!(["create_payment"]);
        let a = parse_doc(&after).unwrap();
        prop_assert!(!review(&b, &a, None).widens, "narrowings only: {:?}", narrowings);

        // One principal's profile (as it resolves now) gets a cent more than it ever had.
        let (s, u, c) = (SUBJECTS[who.0.index(3)], USERS.get(who.1.index(3)).copied(), CLIENTS.get(who.2.index(3)).copied());
        let target = b.live(0, None).profiles.resolve(IDP, s, u, c).name.clone();
        let profiles = after["policy"]["profiles"].as_array_mut().unwrap();
        let p = profiles.iter_mut().find(|p| p["name"] == target.as_str()).unwrap();
        let was = doc["policy"]["profiles"].as_array().unwrap().iter().find(|p| p["name"] == target.as_str()).unwrap();
        let raised = minor_of(&was["autonomous_limit"]["KES"]).unwrap_or(0) + 1;
        p["autonomous_limit"] = json!({"KES": kes_text(raised)});
        // A profile that matches nobody, added and moved to the front, hides nothing.
        profiles.insert(0, json!({"name": "decoy", "daily_limit": {"KES": "1.00"}}));
        let a = parse_doc(&after).unwrap();
        let r = review(&b, &a, None);
        prop_assert!(r.widens, "{} raised to {}: {:#?}", target, raised, r.authority);
    }
}

/// Issue 52's reproduction (`ro-bot` is `a1` here, inside the alphabet the brute force walks), as
/// the smallest case of the properties above.
#[test]
fn swapping_two_profiles_of_one_agent_and_lowering_a_number_widens() {
    let p = |name: &str, limit: &str| {
        json!({"name": name, "subjects": ["a1"], "allowed_accounts": ["acct-A"],
               "autonomous_limit": {"KES": limit}, "daily_limit": {"KES": "100000.00"}})
    };
    let before = json!({"policy": {"default_profile": "d", "profiles": [{"name": "d"}, p("tight", "10.00"), p("wide", "5000.00")]}});
    let mut wide = p("wide", "5000.00");
    wide["calls_per_minute"] = json!(119);
    let after = json!({"policy": {"default_profile": "d", "profiles": [{"name": "d"}, wide, p("tight", "10.00")]}});
    let (b, a) = (parse_doc(&before).unwrap(), parse_doc(&after).unwrap());
    assert!(wider_for_someone(&b, &a));
    assert!(review(&b, &a, None).widens);
}
