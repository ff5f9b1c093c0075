//! What each fuzz target checks, in one copy: the libFuzzer targets (`fuzz/fuzz_targets/`) and the
//! stable replay of the seed corpus and of every crash kept (`tests/fuzz_regressions.rs`) call these
//! functions. Each panics only when a promise users rely on breaks; refusing input is fine.
#![allow(dead_code, clippy::unwrap_used, clippy::expect_used)]

use std::sync::{Arc, OnceLock};

use paygate::auth::{Audience, Secret, Verifier, mint_dev_token};
use paygate::clock::ManualClock;
use paygate::domain::money::{Currency, Money, format_minor, parse_minor};
use paygate::mandate::{KeySchedule, MANDATE_ISSUER, MandateClaims, MandateKeys, MandateKind};
use paygate::request_state::{ApprovalState, Binding, StateSealer};
use rmcp::model::{ClientJsonRpcMessage, ClientRequest, JsonRpcMessage};

const NOW: i64 = 1_700_000_000;
const RESOURCE: &str = "https://gw.example/mcp";
const DEV_ISS: &str = "https://dev.paygate.test";
const DEV_SECRET: &str = "dev-key-dev-key-dev-key-dev-key!";

/// A first byte of 128 or more turns the input into an edit of a valid value: the second byte says
/// where (as a fraction of its length), the rest is written over it there. `None`: use the input as
/// it is. Most of a signed value is its signature, so edits reach the checks past it.
fn edit(valid: &str, data: &[u8]) -> Option<String> {
    let (&mode, rest) = data.split_first()?;
    if mode < 128 {
        return None;
    }
    let (&at, patch) = rest.split_first().unwrap_or((&0, &[]));
    let mut bytes = valid.as_bytes().to_vec();
    let start = usize::from(at) * bytes.len() / 256;
    for (i, b) in patch.iter().enumerate() {
        match bytes.get_mut(start + i) {
            Some(slot) => *slot = *b,
            None => bytes.push(*b),
        }
    }
    Some(String::from_utf8_lossy(&bytes).into_owned())
}

/// The input as text: an edit of `valid`, or the input itself.
fn candidate(valid: &str, data: &[u8]) -> String {
    edit(valid, data).unwrap_or_else(|| String::from_utf8_lossy(data.get(1..).unwrap_or_default()).into_owned())
}

fn runtime() -> &'static tokio::runtime::Runtime {
    static RT: OnceLock<tokio::runtime::Runtime> = OnceLock::new();
    RT.get_or_init(|| tokio::runtime::Builder::new_current_thread().build().unwrap())
}

/// `CODE\nAMOUNT` (or just an amount, in KES): an amount that parses formats back to itself, and the
/// two parsers (to `Money`, to minor units, which also takes zero for opening balances) agree on
/// every input.
pub fn money(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let (code, amount) = text.split_once('\n').unwrap_or(("KES", &text));
    let currency = Currency::parse(code).unwrap_or_else(|_| Currency::parse("KES").unwrap());
    let parsed = Money::parse(amount, currency);
    let minor = parse_minor(amount, currency).ok().filter(|m| *m != 0);
    assert_eq!(minor, parsed.as_ref().ok().map(Money::minor), "{amount:?}");
    if let Ok(m) = parsed {
        assert!(m.minor() > 0, "{amount:?} parsed to {m:?}");
        assert_eq!(Money::parse(&m.to_decimal(), currency), Ok(m), "{amount:?} → {}", m.to_decimal());
        assert_eq!(format_minor(m.minor(), currency), m.to_decimal());
    }
}

/// rmcp's reading of a message: its method and, for a tool call, the tool. (A `tools/call` rmcp
/// cannot read as one, say with `params.name` twice or not a string, becomes a custom request,
/// which the server answers "method not found": no tool runs, so no tool is named.)
pub fn rmcp_reading(message: &ClientJsonRpcMessage) -> (Option<String>, Option<String>) {
    match message {
        JsonRpcMessage::Request(r) => {
            let tool = match &r.request {
                ClientRequest::CallToolRequest(call) => Some(call.params.name.to_string()),
                _ => None,
            };
            (Some(r.request.method().to_string()), tool)
        }
        JsonRpcMessage::Notification(n) => {
            let method = serde_json::to_value(&n.notification).unwrap()["method"].as_str().map(str::to_string);
            (method, None)
        }
        JsonRpcMessage::Response(_) | JsonRpcMessage::Error(_) => (None, None),
    }
}

/// The scope check's peek and rmcp read every body alike (differential): whenever rmcp accepts a
/// body, the peek read it as one message with the same method and, for a tool call, the same tool —
/// so the scope demanded is the scope of what runs.
pub fn scope_peek(data: &[u8]) {
    let peeked = paygate::http::peek(data);
    if let Ok(message) = serde_json::from_slice::<ClientJsonRpcMessage>(data) {
        let body = String::from_utf8_lossy(data);
        let peeked = peeked.unwrap_or_else(|| panic!("rmcp read a body the peek could not: {body}"));
        assert_eq!(peeked.len(), 1, "{body}");
        let (method, tool) = rmcp_reading(&message);
        assert_eq!(peeked[0].method, method, "{body}");
        if let Some(tool) = tool {
            assert_eq!(peeked[0].name.as_deref(), Some(tool.as_str()), "{body}");
        }
    }
}

fn verifier() -> &'static Verifier {
    static V: OnceLock<Verifier> = OnceLock::new();
    V.get_or_init(|| {
        Verifier::new(RESOURCE.into(), "https://gw.example/operator".into(), 60, Arc::new(ManualClock::new(NOW)))
            .with_dev_key(DEV_ISS.into(), &Secret::new(DEV_SECRET.into()))
            .unwrap()
            .with_cache(0)
    })
}

/// A bearer token (any text, or an edit of a valid dev token): only the unedited token verifies,
/// and as what it says.
pub fn jwt(data: &[u8]) {
    static TOKEN: OnceLock<String> = OnceLock::new();
    let valid = TOKEN.get_or_init(|| {
        mint_dev_token(&Secret::new(DEV_SECRET.into()), DEV_ISS, RESOURCE, "agent-7", "payments:read", NOW, 300)
            .unwrap()
    });
    let token = candidate(valid, data);
    let verified = runtime().block_on(verifier().verify(&token, Audience::Agent));
    match verified {
        Ok(claims) => {
            assert_eq!(&token, valid, "an altered token verified: {claims:?}");
            assert_eq!(claims.subject, "agent-7");
        }
        Err(e) => assert_ne!(&token, valid, "the valid token was refused: {e}"),
    }
    assert!(
        runtime().block_on(verifier().verify(&token, Audience::Operator)).is_err(),
        "an agent token for the operator"
    );
}

fn mandate_keys() -> &'static MandateKeys {
    static K: OnceLock<MandateKeys> = OnceLock::new();
    K.get_or_init(|| {
        let schedule = KeySchedule { hs256_accept_until: Some(i64::MAX), ..KeySchedule::new("mk1") };
        MandateKeys::new(schedule, &Secret::new("mk1-mandate-secret-of-32-bytes-or-more".into())).unwrap()
    })
}

/// A mandate (any text, or an edit of a valid one): only the unedited mandate verifies, with its
/// claims.
pub fn mandate(data: &[u8]) {
    static SIGNED: OnceLock<(MandateClaims, String)> = OnceLock::new();
    let (claims, valid) = SIGNED.get_or_init(|| {
        let claims = MandateClaims {
            jti: "mdt_fuzz".into(),
            iss: MANDATE_ISSUER.into(),
            sub: "agent-7".into(),
            agent_iss: DEV_ISS.into(),
            user: None,
            kind: MandateKind::Closed,
            iat: NOW,
            exp: NOW + 600,
            approval_id: "apr_fuzz".into(),
            approvers: vec!["alice".into()],
            currency: "KES".into(),
            tool: Some("create_payment".into()),
            payer: Some("acct-A".into()),
            payee: Some("acct-B".into()),
            amount_minor: Some(250_000),
            payment_id: None,
            intent_sha256: None,
            payees: None,
            per_payment_max_minor: None,
            budget_minor: None,
            max_uses: None,
            passkeys: None,
        };
        let jws = mandate_keys().sign(&claims).unwrap();
        (claims, jws)
    });
    let jws = candidate(valid, data);
    match mandate_keys().verify(&jws, NOW + 1) {
        Ok(got) => {
            assert_eq!(&jws, valid, "an altered mandate verified: {got:?}");
            assert_eq!(&got, claims);
        }
        Err(e) => assert_ne!(&jws, valid, "the valid mandate was refused: {e}"),
    }
}

/// A `requestState` (any text, or an edit of a sealed one): only the unedited state opens, for the
/// call it was sealed for, and says what was sealed.
pub fn request_state(data: &[u8]) {
    let sealer = StateSealer::new([7; 32]);
    let binding = Binding {
        issuer: DEV_ISS,
        subject: "agent-7",
        user: None,
        tool: "create_payment",
        operation_id: "op-1",
        args: "fingerprint",
    };
    let state = ApprovalState { apr: "apr_fuzz".into(), exp: NOW + 600, n: 1 };
    let valid = sealer.seal(&binding, &state);
    let sealed = candidate(&valid, data);
    match sealer.open(&binding, &sealed, NOW) {
        Ok(opened) => {
            assert_eq!(sealed, valid, "an altered state opened: {opened:?}");
            assert_eq!(opened, state);
        }
        Err(e) => assert_ne!(sealed, valid, "the sealed state did not open: {e}"),
    }
    let other = Binding { operation_id: "op-2", ..binding };
    assert!(sealer.open(&other, &sealed, NOW).is_err(), "a state opened for another operation");
}

/// M-Pesa (STK callback, result) and Airtel callback bodies: refused or read, never a panic; what
/// reads was JSON.
pub fn rail_callbacks(data: &[u8]) {
    let json = serde_json::from_slice::<serde_json::Value>(data).is_ok();
    let read = [
        paygate::backend::mpesa::daraja::parse_callback(data).is_ok(),
        paygate::backend::mpesa::daraja::parse_result(data).is_ok(),
        paygate::backend::airtel::wire::parse_callback(data).is_ok(),
    ];
    assert!(json || !read.contains(&true), "a body that is not JSON was read: {read:?}");
}

/// List cursors (the agent tools' and the operator API's keyset cursors): only the spelling this
/// server writes decodes, to the position it names; anything else is a clear refusal.
pub fn cursor(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(Some(seq)) = paygate::gateway::decode_cursor(Some(&text)) {
        assert!(seq > 0);
        assert_eq!(paygate::gateway::encode_cursor(seq), text, "two cursors name one position");
    }
    if let Ok(Some((at, id))) = paygate::gateway::decode_key_cursor(Some(&text)) {
        assert_eq!(paygate::gateway::encode_key_cursor(at, &id), text, "two key cursors name one position");
    }
}

/// The operator API's and the agent tools' time filters (`from`, `to`, `since`): an instant that
/// parses, written back as RFC 3339, parses to itself (instants from 1970 on; an earlier one has no
/// four-digit RFC 3339 form after its offset is applied, and is written as a number).
pub fn time_filter(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    if let Ok(t) = paygate::gateway::parse_instant_arg(&text)
        && t >= 0
    {
        let written = paygate::clock::rfc3339(t);
        assert_eq!(paygate::gateway::parse_instant_arg(&written), Ok(t), "{text:?} → {written}");
    }
}
