//! paygate serves HTTPS itself when a certificate and key are configured.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use common::*;

fn fixture(name: &str) -> String {
    format!("{}/tests/fixtures/{name}", env!("CARGO_MANIFEST_DIR"))
}

#[tokio::test]
async fn serves_https_with_a_configured_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (cert, key) = (fixture("tls-cert.pem"), fixture("tls-key.pem"));
    let app =
        spawn_on(dir.path(), &[("PAYGATE_SERVER__TLS_CERT_FILE", &cert), ("PAYGATE_SERVER__TLS_KEY_FILE", &key)]).await;
    assert!(app.url.starts_with("https://127.0.0.1:"), "{}", app.url);

    let ca = reqwest::Certificate::from_pem(&std::fs::read(fixture("tls-ca.pem")).unwrap()).unwrap();
    let https = reqwest::Client::builder().add_root_certificate(ca).build().unwrap();
    let health = https.get(format!("{}/healthz", app.base())).send().await.unwrap();
    assert_eq!(health.status(), 200);
    // The MCP endpoint and its auth work the same over TLS; the audience is the https URL.
    let token = app.dev_token();
    let resp = https
        .post(&app.url)
        .bearer_auth(&token)
        .header("content-type", "application/json")
        .header("accept", "application/json, text/event-stream")
        .body(r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().contains_key("mcp-session-id"));
    let doc: serde_json::Value = https
        .get(format!("{}/.well-known/oauth-protected-resource/mcp", app.base()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(doc["resource"], app.url.as_str());
    // Plain HTTP on the TLS port is not served.
    let plain = reqwest::get(format!("http://{}/healthz", app.running.addr)).await;
    assert!(plain.map(|r| !r.status().is_success()).unwrap_or(true));
    app.stop().await;
}
