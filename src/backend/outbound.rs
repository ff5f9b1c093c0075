//! Small helpers every outbound HTTP client of a rail needs (Daraja, Airtel): reading a bounded
//! answer, describing a failed send without its URL, and the lenient JSON forms vendors use.
//! Nothing here knows a vendor.

use serde_json::Value;

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
