//! Log output: which lines are written (`PAYGATE_LOG`, with the wire-dumping crates capped), how
//! (`PAYGATE_LOG_FORMAT=json` or text), and what never reaches them: every line passes through
//! [`redact`] on its way out, whatever its level or origin (ours, rmcp's, a dependency's).
//!
//! Architecture Invariant: no bearer token, mandate (compact JWS), configured secret or full phone
//! number is written to a log. Tool arguments and results are never logged above `trace`.

use std::borrow::Cow;
use std::io;
use std::sync::{OnceLock, RwLock};

use tracing_subscriber::fmt::MakeWriter;

/// Crates that write whole protocol messages at `debug` and below (rmcp: every JSON-RPC request
/// and response, tool arguments and results included). They stay at `warn` unless `PAYGATE_LOG`
/// names them at `trace` explicitly (`PAYGATE_LOG=debug,rmcp=trace`).
pub const WIRE_DUMPING_TARGETS: &[&str] = &["rmcp"];

/// The filter for `spec` (`PAYGATE_LOG`'s syntax; default `info`), with [`WIRE_DUMPING_TARGETS`]
/// capped. An invalid spec falls back to `info` (and says so on the first line).
pub fn filter_spec(spec: Option<&str>) -> String {
    let spec = spec.map(str::trim).filter(|s| !s.is_empty()).unwrap_or("info");
    let mut directives: Vec<&str> = Vec::new();
    let mut lifted: Vec<&str> = Vec::new();
    for d in spec.split(',').map(str::trim).filter(|d| !d.is_empty()) {
        let target = d.split(['=', '[']).next().unwrap_or("");
        match WIRE_DUMPING_TARGETS.iter().find(|t| target == **t || target.starts_with(&format!("{t}::"))) {
            Some(t) if d.ends_with("=trace") => {
                lifted.push(t);
                directives.push(d);
            }
            Some(_) => {} // anything short of trace: the cap below decides
            None => directives.push(d),
        }
    }
    let mut out = directives.join(",");
    for t in WIRE_DUMPING_TARGETS.iter().filter(|t| !lifted.contains(t)) {
        if !out.is_empty() {
            out.push(',');
        }
        out.push_str(t);
        out.push_str("=warn");
    }
    out
}

/// Whether `PAYGATE_LOG_FORMAT` asks for JSON lines.
pub fn json_format() -> bool {
    std::env::var("PAYGATE_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json"))
}

/// Install the process's subscriber: `PAYGATE_LOG`, `PAYGATE_LOG_FORMAT`, stderr, redacted.
/// Idempotent (a second call is a no-op).
pub fn init() {
    init_with(None);
}

/// [`init`], and with a tracer (`[telemetry]` on) paygate's spans are also exported: every span
/// of this crate down to `debug` (the request span is `info`, the ones under it `debug`), whatever
/// `PAYGATE_LOG` says, which governs the log lines only. Log events are not exported.
pub fn init_with(tracer: Option<opentelemetry_sdk::trace::Tracer>) {
    use std::io::IsTerminal;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let spec = std::env::var("PAYGATE_LOG").ok();
    let filter = tracing_subscriber::EnvFilter::try_new(filter_spec(spec.as_deref()))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter_spec(None)));
    let fmt = tracing_subscriber::fmt::layer()
        .with_target(false)
        .with_ansi(std::io::stderr().is_terminal() && !json_format())
        .with_writer(Redacting(std::io::stderr));
    let fmt = if json_format() { fmt.json().flatten_event(true).boxed() } else { fmt.boxed() };
    let spans = tracer.map(|t| {
        // Spans only: events (log lines) never go to the collector, where the redactor is not.
        let ours = tracing_subscriber::filter::filter_fn(|m| {
            m.is_span() && m.target().split("::").next() == Some("paygate") && *m.level() <= tracing::Level::DEBUG
        });
        tracing_opentelemetry::layer().with_tracer(t).with_filter(ours)
    });
    let _ = tracing_subscriber::registry().with(fmt.with_filter(filter)).with(spans).try_init();
    install_panic_hook();
}

/// Panic messages go to the log redacted like every other line (a message may quote a value it
/// was given, a token included), as an ERROR event when the format is JSON.
fn install_panic_hook() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        std::panic::set_hook(Box::new(|info| {
            let message = redact(&info.to_string()).into_owned();
            let backtrace = std::backtrace::Backtrace::capture();
            if json_format() {
                tracing::error!(backtrace = %backtrace, "{message}");
            } else if backtrace.status() == std::backtrace::BacktraceStatus::Captured {
                eprintln!("{message}\n{backtrace}");
            } else {
                eprintln!("{message}\nnote: run with RUST_BACKTRACE=1 for a backtrace");
            }
        }));
    });
}

/// A failure before (or instead of) serving, on stderr: an ERROR event when the format is JSON (one
/// parseable line like every other), `paygate: <message>` otherwise. Redacted either way.
pub fn fatal(message: &str) {
    if json_format() {
        init();
        tracing::error!("{message}");
    } else {
        eprintln!("paygate: {}", redact(message));
    }
}

// ---------------------------------------------------------------------------------------------
// Redaction
// ---------------------------------------------------------------------------------------------

/// Shortest value [`register_secret`] keeps: shorter strings would redact ordinary words.
pub const SECRET_CHARS_MIN: usize = 8;
/// Secrets kept for good: the first ones a process registers (its configuration's, at start).
pub const SECRETS_PINNED_MAX: usize = 256;
/// Secrets registered later (a rail's access token, refreshed hourly): the most recent are kept,
/// the oldest forgotten first (long expired by then).
pub const SECRETS_RECENT_MAX: usize = 1024;

#[derive(Default)]
struct Registry {
    pinned: Vec<String>,
    recent: std::collections::VecDeque<String>,
}

fn secrets() -> &'static RwLock<Registry> {
    static SECRETS: OnceLock<RwLock<Registry>> = OnceLock::new();
    SECRETS.get_or_init(|| RwLock::new(Registry::default()))
}

/// Never write `value` to a log (every [`crate::secret::Secret`] registers itself).
pub fn register_secret(value: &str) {
    if value.chars().count() < SECRET_CHARS_MIN {
        return;
    }
    let mut r = secrets().write().unwrap_or_else(|p| p.into_inner());
    if r.pinned.iter().chain(r.recent.iter()).any(|s| s == value) {
        return;
    }
    if r.pinned.len() < SECRETS_PINNED_MAX {
        r.pinned.push(value.to_string());
        // Longest first: a secret that contains another is replaced whole.
        r.pinned.sort_by_key(|s| std::cmp::Reverse(s.len()));
    } else {
        if r.recent.len() >= SECRETS_RECENT_MAX {
            r.recent.pop_front();
        }
        r.recent.push_back(value.to_string());
    }
}

fn is_b64url(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'-' || b == b'_'
}

/// `line` with every compact JWS/JWT (tokens, mandates), bearer credential, registered secret and
/// phone number replaced. Borrowed when there was nothing to replace.
pub fn redact(line: &str) -> Cow<'_, str> {
    let mut out = Cow::Borrowed(line);
    {
        let r = secrets().read().unwrap_or_else(|p| p.into_inner());
        for s in r.pinned.iter().chain(r.recent.iter()) {
            if out.contains(s.as_str()) {
                out = Cow::Owned(out.replace(s.as_str(), "[redacted:secret]"));
            }
        }
    }
    if let Some(r) = redact_jws(&out) {
        out = Cow::Owned(r);
    }
    if let Some(r) = redact_bearer(&out) {
        out = Cow::Owned(r);
    }
    if let Some(r) = redact_phones(&out) {
        out = Cow::Owned(r);
    }
    out
}

/// `eyJ…` `.` `…` `.` `…`: a JWS header always starts with `{"` (base64url `eyJ`).
fn redact_jws(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = String::new();
    let (mut i, mut copied, mut changed) = (0, 0, false);
    while let Some(off) = s[i..].find("eyJ") {
        let start = i + off;
        let mut j = start;
        let mut dots = 0;
        let mut seg_len = 0;
        let mut first_seg = 0;
        while j < b.len() && (is_b64url(b[j]) || (b[j] == b'.' && dots < 2)) {
            if b[j] == b'.' {
                if dots == 0 {
                    first_seg = seg_len;
                }
                dots += 1;
                seg_len = 0;
            } else {
                seg_len += 1;
            }
            j += 1;
        }
        if dots == 2 && first_seg >= 10 && (start == 0 || !is_b64url(b[start - 1])) {
            out.push_str(&s[copied..start]);
            out.push_str("[redacted:jws]");
            copied = j;
            changed = true;
        }
        i = j.max(start + 3);
    }
    changed.then(|| {
        out.push_str(&s[copied..]);
        out
    })
}

/// `Bearer <credential>` (any case), whatever the credential's shape.
fn redact_bearer(s: &str) -> Option<String> {
    let lower = s.to_ascii_lowercase();
    if !lower.contains("bearer ") {
        return None;
    }
    let b = s.as_bytes();
    let mut out = String::new();
    let (mut i, mut copied, mut changed) = (0, 0, false);
    while let Some(off) = lower[i..].find("bearer ") {
        let start = i + off + "bearer ".len();
        let mut j = start;
        while j < b.len() && !b[j].is_ascii_whitespace() && !matches!(b[j], b'"' | b'\'' | b',' | b'\\') {
            j += 1;
        }
        if j > start && &s[start..j] != "[redacted]" {
            out.push_str(&s[copied..start]);
            out.push_str("[redacted]");
            copied = j;
            changed = true;
        }
        i = j.max(start);
    }
    changed.then(|| {
        out.push_str(&s[copied..]);
        out
    })
}

/// Mobile numbers: first any value after a `phone`/`msisdn`/`PartyA`/`PartyB` key that holds 9 or
/// more digits (spaces, dashes and a `+` allowed: `"phone_number": "0712 345 678"`), then, anywhere,
/// digit runs in the forms the rails use: `2547…`/`+2547…` (12 digits, any 25x country code) and
/// `07…`/`01…` (10 digits). Kept: the first digits and the last three (`2547*****678`), enough to
/// tell two apart.
fn redact_phones(s: &str) -> Option<String> {
    let keyed = redact_keyed_phones(s);
    let text = keyed.as_deref().unwrap_or(s);
    let b = text.as_bytes();
    let mut out = String::new();
    let (mut i, mut copied, mut changed) = (0, 0, false);
    while i < b.len() {
        if !b[i].is_ascii_digit() || (i > 0 && b[i - 1].is_ascii_digit()) {
            i += 1;
            continue;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            i += 1;
        }
        let run = &text[start..i];
        let Some(keep) = keep_for(run) else { continue };
        out.push_str(&text[copied..start]);
        out.push_str(&mask_digits(run, keep));
        copied = i;
        changed = true;
    }
    if changed {
        out.push_str(&text[copied..]);
        Some(out)
    } else {
        keyed
    }
}

/// How many leading digits a phone number in a rail's form keeps when masked; `None`: not one.
fn keep_for(digits: &str) -> Option<usize> {
    match digits.len() {
        12 if digits.starts_with("25") => Some(4),
        10 if digits.starts_with("07") || digits.starts_with("01") => Some(2),
        _ => None,
    }
}

/// `value` with every digit but the first `keep` and the last three replaced by `*`.
fn mask_digits(value: &str, keep: usize) -> String {
    let digits = value.bytes().filter(u8::is_ascii_digit).count();
    let mut seen = 0;
    value
        .chars()
        .map(|c| {
            if !c.is_ascii_digit() {
                return c;
            }
            seen += 1;
            if seen <= keep || seen > digits.saturating_sub(3) { c } else { '*' }
        })
        .collect()
}

const PHONE_KEYS: &[&str] = &["phone", "msisdn", "partya", "partyb"];

fn redact_keyed_phones(s: &str) -> Option<String> {
    let lower = s.to_ascii_lowercase();
    if !PHONE_KEYS.iter().any(|k| lower.contains(k)) {
        return None;
    }
    let b = s.as_bytes();
    let mut out = String::new();
    let (mut i, mut copied, mut changed) = (0, 0, false);
    while i < b.len() {
        // Bytes, not str slices: `i` steps through the middle of multi-byte characters.
        let Some(key) = PHONE_KEYS.iter().find(|k| lower.as_bytes()[i..].starts_with(k.as_bytes())) else {
            i += 1;
            continue;
        };
        let mut j = i + key.len();
        // The rest of the key's name (phone_number, PhoneNumber), then separators (`":"`, `=`, `: `).
        while j < b.len() && (b[j].is_ascii_alphanumeric() || b[j] == b'_') {
            j += 1;
        }
        while j < b.len() && matches!(b[j], b'"' | b'\'' | b'\\' | b':' | b'=' | b' ') {
            j += 1;
        }
        let start = j;
        while j < b.len() && (b[j].is_ascii_digit() || matches!(b[j], b' ' | b'-' | b'+')) {
            j += 1;
        }
        let value = s[start..j].trim_end_matches([' ', '-']);
        if value.bytes().filter(u8::is_ascii_digit).count() >= 9 {
            out.push_str(&s[copied..start]);
            let digits: String = value.chars().filter(char::is_ascii_digit).collect();
            out.push_str(&mask_digits(value, keep_for(&digits).unwrap_or(1)));
            copied = start + value.len();
            changed = true;
        }
        i = j.max(i + key.len());
    }
    changed.then(|| {
        out.push_str(&s[copied..]);
        out
    })
}

/// A [`MakeWriter`] whose writers redact each write: the fmt layer writes one whole event per call.
#[derive(Clone)]
pub struct Redacting<M>(pub M);

impl<'a, M: MakeWriter<'a>> MakeWriter<'a> for Redacting<M> {
    type Writer = RedactingWriter<M::Writer>;
    fn make_writer(&'a self) -> Self::Writer {
        RedactingWriter(self.0.make_writer())
    }
}

pub struct RedactingWriter<W>(W);

impl<W: io::Write> io::Write for RedactingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let text = String::from_utf8_lossy(buf);
        // A log line must never take a request down, nor go out unredacted: if redaction itself
        // failed, the line is dropped and says so.
        match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| redact(&text).into_owned())) {
            Ok(clean) => self.0.write_all(clean.as_bytes())?,
            Err(_) => self.0.write_all(b"[a log line was dropped: redaction failed]\n")?,
        }
        Ok(buf.len())
    }
    fn flush(&mut self) -> io::Result<()> {
        self.0.flush()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wire_dumping_crates_stay_at_warn_unless_asked_for_at_trace() {
        assert_eq!(filter_spec(None), "info,rmcp=warn");
        assert_eq!(filter_spec(Some("debug")), "debug,rmcp=warn");
        assert_eq!(filter_spec(Some("debug,rmcp=debug")), "debug,rmcp=warn", "debug is not enough");
        assert_eq!(filter_spec(Some("rmcp::service=info,paygate=debug")), "paygate=debug,rmcp=warn");
        assert_eq!(filter_spec(Some("info,rmcp=trace")), "info,rmcp=trace");
        for spec in [None, Some("debug"), Some("trace"), Some("info,rmcp=trace")] {
            assert!(tracing_subscriber::EnvFilter::try_new(filter_spec(spec)).is_ok(), "{spec:?}");
        }
    }

    #[test]
    fn tokens_mandates_and_bearer_credentials_are_redacted() {
        let jws = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJib3QiLCJhbXQiOjUwMDB9.c2lnbmF0dXJlLWJ5dGVz";
        let line = format!("mandate={jws} next");
        assert_eq!(redact(&line), "mandate=[redacted:jws] next");
        let json = format!(r#"{{"mandate":"{jws}","x":1}}"#);
        assert_eq!(redact(&json), r#"{"mandate":"[redacted:jws]","x":1}"#);
        // An unsigned JWT (alg none: empty signature) too.
        assert_eq!(redact("t=eyJhbGciOiJub25lIn0.eyJzdWIiOiJ4In0. end"), "t=[redacted:jws] end");
        assert_eq!(redact("authorization: Bearer opaque-Token_123 ok"), "authorization: Bearer [redacted] ok");
        assert_eq!(redact(r#""authorization": "bearer abc""#), r#""authorization": "bearer [redacted]""#);
        // Ordinary text is untouched (and not copied).
        assert!(matches!(redact("eyJust a word. and more. text"), Cow::Borrowed(_)));
        assert!(matches!(redact("paid 5000.00 KES at 2026-12-02T10:00:00Z"), Cow::Borrowed(_)));
    }

    #[test]
    fn registered_secrets_are_redacted_and_short_values_are_not_registered() {
        let _turn = REGISTRY_TURN.lock().unwrap_or_else(|p| p.into_inner());
        register_secret("s3cr3t-value-for-the-redaction-test");
        register_secret("short");
        assert_eq!(redact("key=s3cr3t-value-for-the-redaction-test;"), "key=[redacted:secret];");
        assert_eq!(redact("a short word"), "a short word");
        crate::secret::Secret::new("another-secret-for-the-redaction-test".into());
        assert_eq!(redact("x another-secret-for-the-redaction-test"), "x [redacted:secret]");
    }

    /// The registry is one per process: tests that fill it and tests that read it take turns.
    static REGISTRY_TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

    #[test]
    fn the_secret_registry_is_bounded_and_keeps_the_newest() {
        let _turn = REGISTRY_TURN.lock().unwrap_or_else(|p| p.into_inner());
        for i in 0..(SECRETS_PINNED_MAX + SECRETS_RECENT_MAX + 50) {
            register_secret(&format!("rotating-access-token-{i:06}"));
        }
        let newest = format!("rotating-access-token-{:06}", SECRETS_PINNED_MAX + SECRETS_RECENT_MAX + 49);
        assert_eq!(redact(&format!("t={newest}")), "t=[redacted:secret]");
        let r = secrets().read().unwrap();
        assert!(r.pinned.len() <= SECRETS_PINNED_MAX && r.recent.len() <= SECRETS_RECENT_MAX);
    }

    #[test]
    fn phone_numbers_keep_their_prefix_and_last_three_digits() {
        assert_eq!(redact("account=mpesa-254712345678"), "account=mpesa-2547*****678");
        assert_eq!(redact("to +254712345678."), "to +2547*****678.");
        assert_eq!(redact("call 0712345678 now"), "call 07*****678 now");
        assert_eq!(redact(r#"{"phone":"712345678"}"#), r#"{"phone":"7*****678"}"#);
        assert_eq!(redact(r#"{"phone_number":"0712 345 678"}"#), r#"{"phone_number":"07** *** 678"}"#);
        assert_eq!(redact(r#"\"PhoneNumber\":\"+254 712-345-678\""#), r#"\"PhoneNumber\":\"+254 7**-***-678\""#);
        assert_eq!(redact("PartyA: 254112345678"), "PartyA: 2541*****678");
        assert_eq!(
            redact(r#"{"Name":"PhoneNumber","Value":254712345678}"#),
            r#"{"Name":"PhoneNumber","Value":2547*****678}"#
        );
        // Not phone numbers: times, amounts, Daraja timestamps, ids, short runs.
        for line in
            ["since=1796195740", "amount_minor=500000000", "ts=20261202101500", "seq 712345678", "KES 1000000.00"]
        {
            assert_eq!(redact(line), line);
        }
    }

    proptest::proptest! {
        /// Any text, any mix of multi-byte characters, digits and key words: redaction never
        /// panics (a log line must never take a request down) and leaves no rail-form number.
        #[test]
        fn redaction_never_panics_and_leaves_no_phone_number(
            parts in proptest::collection::vec(
                proptest::prop_oneof![
                    proptest::string::string_regex("[a-zé…\\u{1F600} :=\"',.+-]{0,12}").unwrap(),
                    proptest::string::string_regex("(phone|msisdn|PartyA|Bearer |eyJ)").unwrap(),
                    proptest::string::string_regex("[0-9]{1,14}").unwrap(),
                    proptest::string::string_regex("(2547|07|01)[0-9]{8}").unwrap(),
                ],
                0..24,
            )
        ) {
            let line = parts.concat();
            let out = redact(&line).into_owned();
            let digits: Vec<&str> = out.split(|c: char| !c.is_ascii_digit()).collect();
            for run in digits {
                proptest::prop_assert!(keep_for(run).is_none(), "{run} left in {out:?} (from {line:?})");
            }
        }
    }

    #[test]
    fn the_writer_redacts_what_passes_through_it() {
        use std::io::Write;
        let mut buf = Vec::new();
        RedactingWriter(&mut buf).write_all(b"phone 254712345678 Bearer abc\n").unwrap();
        assert_eq!(String::from_utf8(buf).unwrap(), "phone 2547*****678 Bearer [redacted]\n");
    }
}
