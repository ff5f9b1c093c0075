//! What every outbound HTTP client of a rail needs (Daraja, Airtel): one reqwest client that never
//! follows redirects, the retry loop behind the circuit breaker, the OAuth client-credentials token
//! cache with its refresh-once-on-refusal, reading a bounded answer, describing a failed send
//! without its URL, and the lenient JSON forms vendors use. Nothing here knows a vendor: each client
//! says how its answers and failures count.

use std::future::Future;
use std::time::Duration;

use serde_json::Value;

use crate::backend::breaker::{Breaker, backoff_with_jitter};
use crate::clock::{Clock, UnixSecs};
use crate::secret::Secret;

/// The most an answer may hold (a vendor's JSON is a few hundred bytes).
pub const RESPONSE_BYTES_MAX: usize = 64 * 1024;
/// The most `retries_max` may be: with the backoff below, a request's retries wait at most ~5 s.
pub const RETRIES_MAX_LIMIT: u32 = 5;
/// The first retry waits about this long (jittered), doubling up to [`RETRY_BACKOFF_MAX`].
pub const RETRY_BACKOFF_BASE: Duration = Duration::from_millis(100);
pub const RETRY_BACKOFF_MAX: Duration = Duration::from_millis(1_000);

/// A vendor's base URL, checked once: http(s), with no query or fragment; given back without its
/// trailing slash.
pub(crate) fn base_url(raw: &str) -> Result<String, String> {
    let base = raw.trim_end_matches('/').to_string();
    if !(base.starts_with("https://") || base.starts_with("http://")) || base.contains(['?', '#']) {
        return Err(format!("base_url must be an http(s) URL without query: {base:?}"));
    }
    Ok(base)
}

/// The bounds every rail client is configured with, checked once: positive timeouts, a token
/// refresh margin that is not negative, at most [`RETRIES_MAX_LIMIT`] retries, and a breaker that
/// trips after some failures and stays open for some time.
pub(crate) fn check_bounds(
    (connect, request): (Duration, Duration),
    token_refresh_margin_secs: i64,
    retries_max: u32,
    (breaker_failures_max, breaker_open): (u32, Duration),
) -> Result<(), String> {
    if connect.is_zero() || request.is_zero() {
        return Err("connect_timeout and request_timeout must be positive".into());
    }
    if token_refresh_margin_secs < 0 {
        return Err("token_refresh_margin_secs must not be negative".into());
    }
    if retries_max > RETRIES_MAX_LIMIT || breaker_failures_max == 0 || breaker_open.is_zero() {
        return Err(format!(
            "retries_max must be at most {RETRIES_MAX_LIMIT}; breaker_failures_max and breaker_open must be positive"
        ));
    }
    Ok(())
}

/// The HTTP client a rail or an HTTP backend sends with: its timeouts, and no redirects (a
/// redirect would re-send credentials, or replay a money-moving POST, elsewhere).
pub(crate) fn http_client(connect: Duration, request: Duration) -> Result<reqwest::Client, String> {
    http_client_with(connect, request, &OutboundTls::default())
}

/// [`http_client`] with a private CA and a client certificate (mutual TLS), where set.
pub(crate) fn http_client_with(
    connect: Duration,
    request: Duration,
    tls: &OutboundTls,
) -> Result<reqwest::Client, String> {
    crate::install_crypto_provider();
    let mut builder = reqwest::Client::builder()
        .connect_timeout(connect)
        .timeout(request)
        .redirect(reqwest::redirect::Policy::none());
    if let Some(pem) = &tls.ca_pem {
        let certs = reqwest::Certificate::from_pem_bundle(pem).map_err(|e| format!("tls_ca_file: {e}"))?;
        if certs.is_empty() {
            return Err("tls_ca_file holds no PEM certificate".into());
        }
        // The private CA alone: a certificate some public CA issued for the host is not the ledger.
        builder = builder.tls_certs_only(certs);
    }
    if let Some(pem) = &tls.identity_pem {
        let identity = reqwest::Identity::from_pem(pem)
            .map_err(|e| format!("tls_client_cert_file / tls_client_key_file: not a PEM certificate and key: {e}"))?;
        builder = builder.identity(identity);
    }
    builder.build().map_err(|e| format!("HTTP client: {e}"))
}

/// Why the TLS handshake failed, when it did (the peer never read a byte of the request), said so an
/// operator knows which the `tls_*` settings (`[backend]`) file to look at; `None` for any other failure.
pub(crate) fn tls_refusal(e: &(dyn std::error::Error + 'static)) -> Option<String> {
    use rustls::AlertDescription as A;
    let mut cause = Some(e);
    while let Some(c) = cause {
        if let Some(tls) = c.downcast_ref::<rustls::Error>() {
            return match tls {
                rustls::Error::AlertReceived(A::CertificateRequired) => Some(
                    "the server requires a client certificate: set tls_client_cert_file and tls_client_key_file".into(),
                ),
                rustls::Error::AlertReceived(
                    a @ (A::UnknownCA
                    | A::BadCertificate
                    | A::UnsupportedCertificate
                    | A::CertificateUnknown
                    | A::CertificateExpired
                    | A::CertificateRevoked
                    | A::AccessDenied),
                ) => {
                    Some(format!("the server refused this gateway's client certificate (tls_client_cert_file): {a:?}"))
                }
                rustls::Error::AlertReceived(A::HandshakeFailure) => {
                    Some("the server refused the TLS handshake".into())
                }
                rustls::Error::InvalidCertificate(why) => Some(format!(
                    "the server's certificate is not trusted ({why:?}): tls_ca_file names the CA it must chain to"
                )),
                _ => None,
            };
        }
        // An io::Error's `source` skips the error it wraps (tokio-rustls wraps rustls' in one).
        cause = match c.downcast_ref::<std::io::Error>().and_then(|io| io.get_ref()) {
            Some(inner) => Some(inner as &(dyn std::error::Error + 'static)),
            None => c.source(),
        };
    }
    None
}

/// What an outbound client trusts and presents, read from the files the `tls_*` settings (`[backend]`) names.
#[derive(Clone, Default)]
pub struct OutboundTls {
    /// PEM certificates of the private CA the server's certificate must chain to (only these).
    pub ca_pem: Option<Vec<u8>>,
    /// The client certificate (chain) followed by its private key, PEM.
    pub identity_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for OutboundTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("OutboundTls")
            .field("ca", &self.ca_pem.is_some())
            .field("client_certificate", &self.identity_pem.is_some())
            .finish()
    }
}

impl OutboundTls {
    /// Read the files (empty names: not set). The certificate and key go together, and the key
    /// file must be the owner's alone (0600): a key others can read is refused, not used.
    pub fn load(ca_file: &str, client_cert_file: &str, client_key_file: &str) -> Result<Self, String> {
        let read = |what: &str, path: &str| std::fs::read(path).map_err(|e| format!("{what} {path}: {e}"));
        let ca_pem = match ca_file {
            "" => None,
            path => Some(read("tls_ca_file", path)?),
        };
        let identity_pem = match (client_cert_file, client_key_file) {
            ("", "") => None,
            ("", _) | (_, "") => {
                return Err("tls_client_cert_file and tls_client_key_file go together".into());
            }
            (cert, key) => {
                if let Some(mode) = crate::private_fs::open_to_others(std::path::Path::new(key)) {
                    return Err(format!(
                        "tls_client_key_file {key} is readable by others (mode {mode:o}): chmod 600 {key}"
                    ));
                }
                let mut pem = read("tls_client_cert_file", cert)?;
                pem.push(b'\n');
                pem.extend(read("tls_client_key_file", key)?);
                Some(pem)
            }
        };
        Ok(OutboundTls { ca_pem, identity_pem })
    }
}

/// One attempt's failure, and whether it is safe and quick to try again: nothing was processed
/// (no connection, an overload refusal, a token fetch refused likewise).
pub(crate) struct Failure<E> {
    pub error: E,
    pub transient: bool,
}

impl<E> Failure<E> {
    pub fn fatal(error: E) -> Self {
        Failure { error, transient: false }
    }
}

/// An answer, read in full (bounded by [`RESPONSE_BYTES_MAX`]).
pub(crate) struct Answer {
    pub status: reqwest::StatusCode,
    pub body: Vec<u8>,
}

/// How a client counts an answer: whether the vendor is up (the breaker's view; a 4xx is about
/// the request), and whether the answer certainly left the request unprocessed so it may be sent
/// again (an overload refusal).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Counted {
    pub up: bool,
    pub unprocessed: bool,
}

/// Where and how a request is sent again: the vendor's breaker, at most `retries_max` retries.
pub(crate) struct Retries<'a> {
    /// The vendor, for the logs ("daraja", "airtel").
    pub vendor: &'static str,
    /// The operation, for the logs and the circuit-open refusal.
    pub op: &'static str,
    pub breaker: &'a Breaker,
    pub retries_max: u32,
}

/// Sends one request through the circuit breaker, retrying (after a jittered backoff, at most
/// `retries_max` times) only a failure that certainly left nothing processed and was quick: a
/// transient [`Failure`], or an answer [`Counted`] as unprocessed. `circuit_open`: the error for a
/// request not sent because the breaker is open.
pub(crate) async fn send_with_retries<E, F, Fut>(
    r: Retries<'_>,
    circuit_open: impl FnOnce(String) -> E,
    count: impl Fn(&Answer) -> Counted,
    mut attempt: F,
) -> Result<Answer, E>
where
    E: std::fmt::Display,
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Answer, Failure<E>>>,
{
    let mut retry = 0;
    loop {
        let Some(permit) = r.breaker.acquire() else {
            return Err(circuit_open(format!(
                "{}: not sent: {} failed repeatedly and the circuit is open",
                r.op, r.vendor
            )));
        };
        let failure = match attempt().await {
            Ok(answer) => {
                let counted = count(&answer);
                permit.record(counted.up);
                if counted.up || !counted.unprocessed || retry >= r.retries_max {
                    return Ok(answer);
                }
                format!("HTTP {}", answer.status)
            }
            Err(f) => {
                permit.record(false);
                if !f.transient || retry >= r.retries_max {
                    return Err(f.error);
                }
                f.error.to_string()
            }
        };
        retry += 1;
        tracing::warn!(rail.vendor = r.vendor, rail.op = r.op, retry, retries_max = r.retries_max, error = %failure,
            "rail request not processed; retrying");
        tokio::time::sleep(backoff_with_jitter(retry, RETRY_BACKOFF_BASE, RETRY_BACKOFF_MAX)).await;
    }
}

/// A fetched access token and until when to use it.
#[derive(Clone)]
pub(crate) struct CachedToken {
    pub token: Secret,
    /// Use until this instant (the vendor's expiry minus the refresh margin), by the injected clock.
    pub use_until: UnixSecs,
}

impl CachedToken {
    /// A token the vendor says lives `expires_in_secs`, used until `margin_secs` before that.
    pub fn new(token: Secret, expires_in_secs: i64, margin_secs: i64, clock: &dyn Clock) -> Self {
        let lifetime_secs = expires_in_secs.saturating_sub(margin_secs).max(0);
        tracing::debug!(rail.token_lifetime_secs = lifetime_secs, "fetched a rail access token");
        CachedToken { token, use_until: clock.now().saturating_add(lifetime_secs) }
    }
}

/// The OAuth token a client sends with. The lock is held across a refresh so concurrent callers
/// wait for one token fetch instead of stampeding.
#[derive(Default)]
pub(crate) struct TokenCache {
    slot: tokio::sync::Mutex<Option<CachedToken>>,
}

impl TokenCache {
    /// The cached token, or a fresh one from `fetch`. Callers arriving during a fetch wait for it.
    pub async fn get<E, Fut>(&self, now: UnixSecs, fetch: impl FnOnce() -> Fut) -> Result<Secret, Failure<E>>
    where
        Fut: Future<Output = Result<CachedToken, Failure<E>>>,
    {
        let mut guard = self.slot.lock().await;
        if let Some(t) = guard.as_ref().filter(|t| now < t.use_until) {
            return Ok(t.token.clone());
        }
        *guard = None;
        let fresh = fetch().await?;
        let token = fresh.token.clone();
        *guard = Some(fresh);
        Ok(token)
    }

    /// Drops the cached token if it is still the one that was refused (another caller may have
    /// refreshed it already).
    pub async fn forget(&self, refused: &Secret) {
        let mut guard = self.slot.lock().await;
        if guard.as_ref().is_some_and(|t| t.token == *refused) {
            *guard = None;
        }
    }
}

/// One attempt with the cached token; when the answer says the token was refused, drops it,
/// fetches a new one and sends once more. A refused token was refused at the vendor's gateway, so
/// nothing was processed and the second send cannot double a request.
pub(crate) async fn with_token<E, Fetch, FetchFut, Send, SendFut>(
    cache: &TokenCache,
    clock: &dyn Clock,
    vendor: &'static str,
    fetch: Fetch,
    refused: impl Fn(&Answer) -> bool,
    send: Send,
) -> Result<Answer, Failure<E>>
where
    Fetch: Fn() -> FetchFut,
    FetchFut: Future<Output = Result<CachedToken, Failure<E>>>,
    Send: Fn(Secret) -> SendFut,
    SendFut: Future<Output = Result<Answer, Failure<E>>>,
{
    let mut refreshed = false;
    loop {
        let token = cache.get(clock.now(), &fetch).await?;
        let answer = send(token.clone()).await?;
        if refused(&answer) {
            cache.forget(&token).await;
            if !refreshed {
                tracing::debug!(rail.vendor = vendor, "the rail refused the access token; refreshing once");
                refreshed = true;
                continue;
            }
        }
        return Ok(answer);
    }
}

/// Reads the whole body, at most `bytes_max`.
pub(crate) async fn read_body(resp: &mut reqwest::Response, bytes_max: usize) -> Result<Vec<u8>, String> {
    let mut body = Vec::new();
    loop {
        match resp.chunk().await {
            Ok(Some(chunk)) => {
                if body.len() + chunk.len() > bytes_max {
                    return Err(format!("response larger than {bytes_max} bytes"));
                }
                body.extend_from_slice(&chunk);
            }
            Ok(None) => return Ok(body),
            Err(e) if e.is_timeout() => return Err("timed out reading the answer".into()),
            Err(e) => return Err(format!("connection lost reading the answer ({})", source_chain(&e))),
        }
    }
}

/// A failed send as an attempt's [`Failure`]. A connect error means no byte of the request left
/// (transient: `unavailable`, try again); anything else (a timeout after connecting, a reset
/// mid-answer) may have reached the vendor: `after_sending` decides what that means for `op`.
pub(crate) fn send_failure<E>(
    op: &str,
    e: &reqwest::Error,
    unavailable: impl FnOnce(String) -> E,
    after_sending: impl FnOnce(String) -> E,
) -> Failure<E> {
    let why = format!("{op}: {}", describe_send_error(e));
    if e.is_connect() {
        return Failure { error: unavailable(why), transient: true };
    }
    Failure::fatal(after_sending(why))
}

/// A failed send in words: no connection, a timeout, or another failure with its cause.
pub(crate) fn describe_send_error(e: &reqwest::Error) -> String {
    if e.is_connect() {
        format!("could not connect ({})", source_chain(e))
    } else if e.is_timeout() {
        "timed out waiting for the answer".to_string()
    } else {
        format!("request failed ({})", source_chain(e))
    }
}

/// The error's source chain without the URL (reqwest's own Display repeats it).
pub(crate) fn source_chain(e: &reqwest::Error) -> String {
    let mut parts = Vec::new();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        parts.push(s.to_string());
        source = s.source();
    }
    if parts.is_empty() { "no detail".to_string() } else { parts.join(": ") }
}

/// Control characters removed, whitespace trimmed, cut to `chars_max` characters.
pub(crate) fn clean_text(s: &str, chars_max: usize) -> String {
    let cleaned: String = s.chars().filter(|c| !c.is_control()).collect();
    let cut: String = cleaned.trim().chars().take(chars_max).collect();
    cut.trim_end().to_string()
}

/// A response code sent as a string ("0", "200"); a number is tolerated.
pub(crate) fn code_text(v: &Value) -> String {
    match v {
        Value::String(s) => s.trim().to_string(),
        other => other.to_string(),
    }
}

/// An integer sent as a JSON number or a string of digits ("0", "1032").
pub(crate) fn json_int(v: &Value) -> Option<i64> {
    match v {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every rail client is held to the same bounds, each refusal naming what is wrong.
    #[test]
    fn the_bounds_every_rail_client_is_held_to() {
        let (s, zero) = (Duration::from_secs(1), Duration::ZERO);
        assert_eq!(check_bounds((s, s), 0, RETRIES_MAX_LIMIT, (1, s)), Ok(()));
        for (timeouts, needle) in [((zero, s), "connect_timeout"), ((s, zero), "request_timeout")] {
            assert!(check_bounds(timeouts, 60, 0, (1, s)).unwrap_err().contains(needle));
        }
        assert!(check_bounds((s, s), -1, 0, (1, s)).unwrap_err().contains("token_refresh_margin_secs"));
        for (retries, breaker) in [(RETRIES_MAX_LIMIT + 1, (1, s)), (0, (0, s)), (0, (1, zero))] {
            let e = check_bounds((s, s), 60, retries, breaker).unwrap_err();
            assert!(e.contains("retries_max must be at most"), "{e}");
        }
    }

    /// A private CA file that holds no certificate is refused when the client is built, never
    /// taken as "trust nothing" or "trust the public CAs".
    #[test]
    fn a_ca_file_without_a_certificate_is_refused() {
        let tls = OutboundTls { ca_pem: Some(b"# nothing here\n".to_vec()), identity_pem: None };
        let e = http_client_with(Duration::from_secs(1), Duration::from_secs(1), &tls).unwrap_err();
        assert!(e.contains("tls_ca_file"), "{e}");
    }

    /// The handshake refusals an operator can act on are named, through the io::Error tokio-rustls
    /// wraps them in; anything else is no TLS refusal.
    #[test]
    fn tls_refusals_are_named_through_their_wrapping() {
        use rustls::AlertDescription as A;
        let wrapped = |e: rustls::Error| std::io::Error::other(e);
        let said = |e: rustls::Error| tls_refusal(&wrapped(e));
        assert!(said(rustls::Error::AlertReceived(A::HandshakeFailure)).unwrap().contains("refused the TLS handshake"));
        assert!(said(rustls::Error::AlertReceived(A::CertificateRequired)).unwrap().contains("tls_client_cert_file"));
        assert!(said(rustls::Error::AlertReceived(A::UnknownCA)).unwrap().contains("refused this gateway's client"));
        assert_eq!(said(rustls::Error::AlertReceived(A::DecodeError)), None);
        assert_eq!(tls_refusal(&std::io::Error::other("connection reset")), None);
    }

    /// A raw HTTP server that answers every connection with `answer`, then holds the connection
    /// open (`hold`) or closes it.
    async fn raw_server(answer: Vec<u8>, hold: bool) -> String {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            while let Ok((mut socket, _)) = listener.accept().await {
                let answer = answer.clone();
                tokio::spawn(async move {
                    let mut buf = [0u8; 4096];
                    let _ = socket.read(&mut buf).await;
                    let _ = socket.write_all(&answer).await;
                    if hold {
                        let _ = socket.read(&mut buf).await;
                    }
                });
            }
        });
        url
    }

    /// An answer is read whole and bounded: one over the bound, one cut off mid-body and one that
    /// stops arriving are each a failure saying which — never a short body taken for the answer.
    #[tokio::test]
    async fn a_body_over_the_bound_cut_off_or_stalled_is_a_failure_saying_which() {
        let client = http_client(Duration::from_secs(2), Duration::from_millis(500)).unwrap();
        let read = |url: String| {
            let client = client.clone();
            async move {
                let mut resp = client.get(url).send().await.unwrap();
                read_body(&mut resp, 64).await
            }
        };
        let body = |declared: usize, sent: usize| {
            let mut a = format!("HTTP/1.1 200 OK\r\ncontent-length: {declared}\r\n\r\n").into_bytes();
            a.extend(std::iter::repeat_n(b'x', sent));
            a
        };
        assert_eq!(read(raw_server(body(64, 64), false).await).await.unwrap().len(), 64);
        let over = read(raw_server(body(65, 65), false).await).await.unwrap_err();
        assert_eq!(over, "response larger than 64 bytes");
        let cut = read(raw_server(body(60, 10), false).await).await.unwrap_err();
        assert!(cut.starts_with("connection lost reading the answer"), "{cut}");
        let stalled = read(raw_server(body(60, 10), true).await).await.unwrap_err();
        assert_eq!(stalled, "timed out reading the answer");
    }

    /// Config dumps and error logs print the TLS settings: whether each is set, never the key.
    #[test]
    fn debug_says_what_is_set_and_never_the_key() {
        let tls = OutboundTls {
            ca_pem: Some(b"-----BEGIN CERTIFICATE-----\nCA\n".to_vec()),
            identity_pem: Some(b"-----BEGIN PRIVATE KEY-----\nsecret-key-bytes\n".to_vec()),
        };
        let shown = format!("{tls:?}");
        assert_eq!(shown, "OutboundTls { ca: true, client_certificate: true }");
        assert_eq!(format!("{:?}", OutboundTls::default()), "OutboundTls { ca: false, client_certificate: false }");
    }
}
