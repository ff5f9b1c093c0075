//! The operator console: three static assets compiled into the binary, served under a strict
//! Content-Security-Policy, and the public settings the page signs in with. The page holds the
//! operator's token in memory and calls `/operator/v1` like any other client.

use axum::extract::State;
use axum::http::{HeaderValue, header};
use axum::response::{IntoResponse, Response};
use serde_json::json;

use super::AppState;

const INDEX_HTML: &str = include_str!("../../console/index.html");
const APP_JS: &str = include_str!("../../console/app.js");
const APP_CSS: &str = include_str!("../../console/app.css");

/// Where the console may sign in (from config), shown to the page by `/console/config.json`.
#[derive(Debug, Clone)]
pub struct ConsoleSettings {
    /// (issuer, client id) of the OpenID Connect provider operators sign in with.
    pub oidc: Option<(String, String)>,
    /// Whether the dev key is on (operators may paste a dev token).
    pub dev_sign_in: bool,
}

/// The page may load its own scripts and styles, talk to this server and to the identity
/// provider (discovery and the token endpoint), and nothing else; no framing, no inline code.
fn csp(settings: &ConsoleSettings) -> String {
    let issuer_origin = settings.oidc.as_ref().and_then(|(issuer, _)| origin_of(issuer));
    let connect = match issuer_origin {
        Some(o) => format!("'self' {o}"),
        None => "'self'".to_string(),
    };
    format!(
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src {connect}; \
         form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    )
}

/// `scheme://host[:port]` of a URL, if it is an http(s) URL whose origin is safe to put in a header.
fn origin_of(url: &str) -> Option<String> {
    let (scheme, rest) = url.split_once("://")?;
    if !matches!(scheme, "http" | "https") {
        return None;
    }
    let host = rest.split(['/', '?', '#']).next()?;
    let ok = !host.is_empty() && host.chars().all(|c| c.is_ascii_alphanumeric() || "-.:[]".contains(c));
    ok.then(|| format!("{scheme}://{host}"))
}

fn asset(settings: &ConsoleSettings, content_type: &'static str, body: &'static str) -> Response {
    let mut resp = ([(header::CONTENT_TYPE, content_type)], body).into_response();
    let h = resp.headers_mut();
    if let Ok(v) = HeaderValue::from_str(&csp(settings)) {
        h.insert(header::CONTENT_SECURITY_POLICY, v);
    }
    h.insert(header::X_CONTENT_TYPE_OPTIONS, HeaderValue::from_static("nosniff"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(header::REFERRER_POLICY, HeaderValue::from_static("no-referrer"));
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-cache"));
    resp
}

fn settings(state: &AppState) -> Option<&ConsoleSettings> {
    state.console.as_ref()
}

fn not_found() -> Response {
    axum::http::StatusCode::NOT_FOUND.into_response()
}

pub async fn index(State(state): State<AppState>) -> Response {
    match settings(&state) {
        Some(s) => asset(s, "text/html; charset=utf-8", INDEX_HTML),
        None => not_found(),
    }
}

pub async fn script(State(state): State<AppState>) -> Response {
    match settings(&state) {
        Some(s) => asset(s, "text/javascript; charset=utf-8", APP_JS),
        None => not_found(),
    }
}

pub async fn style(State(state): State<AppState>) -> Response {
    match settings(&state) {
        Some(s) => asset(s, "text/css; charset=utf-8", APP_CSS),
        None => not_found(),
    }
}

/// What the page needs before anyone signs in: no secrets.
pub async fn config(State(state): State<AppState>) -> Response {
    let Some(s) = settings(&state) else { return not_found() };
    let oidc = s.oidc.as_ref().map(|(issuer, client_id)| {
        json!({
            "issuer": issuer,
            "client_id": client_id,
            "scopes": "openid payments:audit payments:approve payments:admin payments:confirm",
        })
    });
    let doc = json!({
        "api": "/operator/v1",
        "resource": state.operator_resource_url,
        "dev_sign_in": s.dev_sign_in,
        "oidc": oidc,
    });
    ([(header::CACHE_CONTROL, "no-cache")], axum::Json(doc)).into_response()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_policy_names_only_this_server_and_the_issuer() {
        let dev = ConsoleSettings { oidc: None, dev_sign_in: true };
        assert!(csp(&dev).contains("connect-src 'self';"), "{}", csp(&dev));
        let idp = ConsoleSettings {
            oidc: Some(("https://login.example.com/realms/ops".into(), "paygate-console".into())),
            dev_sign_in: false,
        };
        assert!(csp(&idp).contains("connect-src 'self' https://login.example.com;"), "{}", csp(&idp));
        for p in ["script-src 'self'", "frame-ancestors 'none'", "default-src 'none'"] {
            assert!(csp(&idp).contains(p));
        }
        // An issuer that would smuggle directives into the header is left out.
        assert_eq!(origin_of("https://a.example; script-src *"), None);
        assert_eq!(origin_of("javascript:alert(1)"), None);
        assert_eq!(origin_of("http://127.0.0.1:8080/x"), Some("http://127.0.0.1:8080".into()));
    }
}
