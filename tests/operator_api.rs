//! The operator API (`/operator/v1`, what the console calls) against the real server: scopes hold
//! (an auditor cannot approve, revoke, suspend or reconcile), a payment's timeline shows every step
//! from the agent's request to the money moving, revoking a mandate stops its next use, filters and
//! pages work, bad input is refused, and the console is served under a strict policy.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use common::*;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

const API: &str = "/operator/v1";

async fn get(app: &TestApp, path: &str, token: &str) -> (StatusCode, Value) {
    operator(app, Method::GET, &format!("{API}{path}"), token, None).await
}

async fn post(app: &TestApp, path: &str, token: &str, body: Value) -> (StatusCode, Value) {
    operator(app, Method::POST, &format!("{API}{path}"), token, Some(body)).await
}

fn pay(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount,
           "currency": "KES", "memo": format!("invoice {op}")})
}

/// An over-limit payment asks for approval; returns the approval id.
async fn ask(agent: &Client, op: &str) -> String {
    let r = call(agent, "create_payment", pay(op, "5000.00")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED");
    err(&r)["approval_id"].as_str().unwrap().to_string()
}

async fn mandate_of(agent: &Client, approval_id: &str) -> String {
    let r = call(agent, "get_approval", json!({"approval_id": approval_id})).await;
    ok(&r)["mandate"].as_str().unwrap().to_string()
}

#[tokio::test]
async fn an_auditor_reads_but_cannot_approve_revoke_suspend_or_reconcile() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let approval = ask(&agent, "scoped-1").await;
    let auditor = app.operator_token("auditor", "payments:audit");
    let approver = app.operator_token("approver", "payments:approve");

    for path in
        ["/health", "/summary", "/payments", "/audit", "/approvals", "/mandates", "/principals", "/reconciliation"]
    {
        let (status, body) = get(&app, path, &auditor).await;
        assert_eq!(status, StatusCode::OK, "{path}: {body}");
    }
    let forbidden: Vec<(String, &str)> = vec![
        (format!("/approvals/{approval}/approve"), "payments:approve"),
        (format!("/approvals/{approval}/reject"), "payments:approve"),
        ("/mandates/mdt_anything/revoke".into(), "payments:approve"),
        ("/principals/dev-agent/suspend".into(), "payments:admin"),
        ("/principals/dev-agent/resume".into(), "payments:admin"),
        ("/reconciliation/run".into(), "payments:admin"),
    ];
    for (path, scope) in &forbidden {
        let (status, body) = post(&app, path, &auditor, json!({"reason": "auditor tries"})).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(body["error"]["code"], "INSUFFICIENT_SCOPE", "{path}");
        assert!(body["error"]["message"].as_str().unwrap().contains(scope), "{path}: {body}");
    }
    // An approver may review but not suspend or reconcile.
    for path in ["/principals/dev-agent/suspend", "/reconciliation/run"] {
        let (status, _) = post(&app, path, &approver, json!({})).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}");
    }
    // Nothing changed: the approval is still pending, the agent not suspended.
    let (_, a) = get(&app, &format!("/approvals/{approval}"), &auditor).await;
    assert_eq!(a["status"], "pending");
    let (_, agents) = get(&app, "/principals", &auditor).await;
    assert!(agents["items"].as_array().unwrap().iter().all(|p| p["suspended"] == false), "{agents}");
    // No token: a challenge, not data.
    let resp = reqwest::Client::new().get(format!("{}{API}/payments", app.base())).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert!(resp.headers().get("www-authenticate").unwrap().to_str().unwrap().starts_with("Bearer "));
    // An agent's token is for another resource: refused here before any scope is looked at.
    let (status, _) = get(&app, "/audit", &app.dev_token()).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED);
    let _ = agent.cancel().await;
    app.stop().await;
}

#[tokio::test]
async fn a_payments_timeline_shows_every_step_and_revoking_a_mandate_stops_its_next_use() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let ops = app.operator_token("ops-alice", "payments:audit payments:approve payments:admin");

    // Over the limit: the approval appears in the queue with the pinned intent.
    let approval = ask(&agent, "inv-77").await;
    let (_, pending) = get(&app, "/approvals?status=pending", &ops).await;
    let item = &pending["items"][0];
    assert_eq!(item["approval_id"], approval.as_str());
    assert_eq!(
        (item["agent_subject"].as_str(), item["intent"]["memo"].as_str()),
        (Some("dev-agent"), Some("invoice inv-77"))
    );
    let (status, body) =
        post(&app, &format!("/approvals/{approval}/approve"), &ops, json!({"reason": "invoice checked"})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(body["status"], "approved");

    // The agent pays with the mandate.
    let mandate = mandate_of(&agent, &approval).await;
    let mut args = pay("inv-77", "5000.00");
    args["mandate"] = json!(mandate);
    let r = call(&agent, "create_payment", args.clone()).await;
    let payment_id = ok(&r)["payment_id"].as_str().unwrap().to_string();
    // A retry replays; the timeline shows it too.
    assert_eq!(ok(&call(&agent, "create_payment", args).await)["payment_id"], payment_id.as_str());

    let (status, detail) = get(&app, &format!("/payments/{payment_id}"), &ops).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(detail["payment"]["amount"], "5000.00");
    assert_eq!(detail["payment"]["rail"], "ledger");
    assert_eq!(detail["payment"]["agent_subject"], "dev-agent");
    assert!(detail["payment"]["mandate_id"].is_string());
    let steps: Vec<&str> = detail["timeline"].as_array().unwrap().iter().map(|e| e["step"].as_str().unwrap()).collect();
    let order = ["approval_requested", "approved", "mandate_issued", "paid", "replayed"];
    let positions: Vec<usize> =
        order.iter().map(|s| steps.iter().position(|t| t == s).unwrap_or_else(|| panic!("{s} in {steps:?}"))).collect();
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "in order: {steps:?}");
    let approved = detail["timeline"].as_array().unwrap().iter().find(|e| e["step"] == "approved").unwrap();
    assert_eq!((approved["actor"].as_str(), approved["detail"].as_str()), (Some("ops-alice"), Some("invoice checked")));
    assert!(detail["timeline"].as_array().unwrap().iter().all(|e| e["correlation_id"].is_string()));

    // The mandate is used up; the audit search finds the payment's records.
    let (_, used) = get(&app, "/mandates?status=used_up", &ops).await;
    assert_eq!(used["items"][0]["approval_id"], approval.as_str());
    assert_eq!(used["items"][0]["uses"], 1);
    let (_, audit) = get(&app, &format!("/audit?payment_id={payment_id}"), &ops).await;
    assert!(!audit["items"].as_array().unwrap().is_empty());

    // A second approval; an operator revokes its mandate before the agent uses it.
    let second = ask(&agent, "inv-78").await;
    post(&app, &format!("/approvals/{second}/approve"), &ops, json!({"reason": "ok"})).await;
    let mandate2 = mandate_of(&agent, &second).await;
    let (_, active) = get(&app, "/mandates?status=active", &ops).await;
    let mandate_id = active["items"][0]["mandate_id"].as_str().unwrap().to_string();
    assert_eq!(active["items"][0]["approval_id"], second.as_str());
    let (status, revoked) =
        post(&app, &format!("/mandates/{mandate_id}/revoke"), &ops, json!({"reason": "vendor disputed"})).await;
    assert_eq!(status, StatusCode::OK, "{revoked}");
    assert_eq!((revoked["status"].as_str(), revoked["revoked_by"].as_str()), (Some("revoked"), Some("ops-alice")));
    let before = balance(&agent, "acct-A").await;
    let mut args = pay("inv-78", "5000.00");
    args["mandate"] = json!(mandate2);
    let r = call(&agent, "create_payment", args).await;
    assert_eq!(code(&r), "MANDATE_INVALID", "{r:?}");
    assert_eq!(balance(&agent, "acct-A").await, before, "nothing moved");
    let (status, again) = post(&app, &format!("/mandates/{mandate_id}/revoke"), &ops, json!({})).await;
    assert_eq!((status, again["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("CONFLICT")));

    // Summary, agents, suspension, reconciliation.
    let (_, summary) = get(&app, "/summary", &ops).await;
    let paid = summary["totals"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["kind"] == "payment" && t["status"] == "succeeded")
        .unwrap();
    assert_eq!((paid["count"].as_i64(), paid["amount"].as_str()), (Some(1), Some("5000.00")));
    assert_eq!(summary["hourly"].as_array().unwrap().iter().map(|h| h["count"].as_i64().unwrap()).sum::<i64>(), 1);
    let (status, _) = post(&app, "/principals/dev-agent/suspend", &ops, json!({"reason": "looks compromised"})).await;
    assert_eq!(status, StatusCode::OK);
    let (_, agents) = get(&app, "/principals", &ops).await;
    let dev = agents["items"].as_array().unwrap().iter().find(|p| p["subject"] == "dev-agent").unwrap().clone();
    assert_eq!(dev["suspended"], true);
    assert!(dev["suspended_reason"].as_str().unwrap().contains("looks compromised"));
    assert!(dev["last_seen"].is_string());
    let refused = call(&agent, "create_payment", pay("after-suspend", "1.00")).await;
    assert_eq!(code(&refused), "PRINCIPAL_SUSPENDED");
    // The agent is told who suspended it and why, as the operator gave it.
    let message = err(&refused)["message"].as_str().unwrap().to_string();
    assert!(message.contains("suspended by ops-alice: looks compromised"), "{message}");
    post(&app, "/principals/dev-agent/resume", &ops, json!({})).await;
    let (status, run) = post(&app, "/reconciliation/run", &ops, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{run}");
    assert_eq!(run["by"], "ops-alice");
    assert!(run["report"]["checked"].is_i64(), "{run}");
    assert!(run["report"]["since"].as_str().is_some_and(|s| s.ends_with('Z')), "RFC 3339 like every time: {run}");
    let (_, last) = get(&app, "/reconciliation", &ops).await;
    assert_eq!(last["last"]["by"], "ops-alice");
    app.assert_integrity().await;
    let _ = agent.cancel().await;
    app.stop().await;
}

#[tokio::test]
async fn payments_filter_and_page_and_bad_input_is_refused() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Legacy).await;
    let ops = app.operator_token("ops-bob", "payments:audit");
    let mut ids = Vec::new();
    for i in 0..5 {
        ids.push(
            ok(&call(&agent, "create_payment", pay(&format!("p-{i}"), "10.00")).await)["payment_id"]
                .as_str()
                .unwrap()
                .to_string(),
        );
    }
    let refund =
        call(&agent, "refund_payment", json!({"operation_id": "r-0", "payment_id": ids[0], "amount": "4.00"})).await;
    let refund_id = ok(&refund)["payment_id"].as_str().unwrap().to_string();

    // Pages of two, newest first, every payment once.
    let (mut seen, mut cursor) = (Vec::new(), None::<String>);
    loop {
        let path = match &cursor {
            Some(c) => format!("/payments?kind=payment&limit=2&cursor={c}"),
            None => "/payments?kind=payment&limit=2".to_string(),
        };
        let (status, page) = get(&app, &path, &ops).await;
        assert_eq!(status, StatusCode::OK, "{page}");
        seen.extend(page["items"].as_array().unwrap().iter().map(|p| p["payment_id"].as_str().unwrap().to_string()));
        match page["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => break,
        }
    }
    let mut expected = ids.clone();
    expected.sort();
    let mut got = seen.clone();
    got.sort();
    assert_eq!(got, expected, "every payment once across pages");
    let (_, refunds) = get(&app, "/payments?kind=refund", &ops).await;
    assert_eq!(refunds["items"].as_array().unwrap().len(), 1);
    assert_eq!(refunds["items"][0]["payment_id"], refund_id.as_str());
    assert_eq!(refunds["items"][0]["refund_of"], ids[0].as_str());
    let (_, original) = get(&app, &format!("/payments/{}", ids[0]), &ops).await;
    assert_eq!(original["payment"]["refunded"], "4.00");
    for (query, n) in [
        ("agent=dev-agent", 6),
        ("agent=someone-else", 0),
        ("rail=ledger&status=succeeded", 6),
        ("rail=mpesa", 0),
        ("account=acct-B", 6),
    ] {
        let (_, page) = get(&app, &format!("/payments?{query}"), &ops).await;
        assert_eq!(page["items"].as_array().unwrap().len(), n, "{query}: {page}");
    }
    let today = &paygate::clock::rfc3339(now_secs())[..10];
    let (_, page) = get(&app, &format!("/payments?from={today}&to={today}"), &ops).await;
    assert_eq!(page["items"].as_array().unwrap().len(), 6);

    // Bad input: a clear 400 (or 404), in the one envelope.
    for path in [
        "/payments?status=paid",
        "/payments?kind=everything",
        "/payments?cursor=not-a-cursor",
        "/payments?from=yesterday",
        "/payments?limit=0",
        "/payments?account=bad%20account",
        "/payments?color=blue",
        "/audit?cursor=AAAA",
        "/mandates?status=sort-of",
    ] {
        let (status, body) = get(&app, path, &ops).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
        assert_eq!(body["error"]["code"], "INVALID_ARGUMENT", "{path}");
    }
    let (status, body) = get(&app, "/payments/pay_00000000000000000000000000", &ops).await;
    assert_eq!((status, body["error"]["message"].as_str()), (StatusCode::NOT_FOUND, Some("no such payment")));
    // Filter values are data, never SQL.
    let (status, page) = get(&app, "/audit?agent=x%27%20OR%20%271%27%3D%271", &ops).await;
    assert_eq!((status, page["items"].as_array().unwrap().len()), (StatusCode::OK, 0));
    let _ = agent.cancel().await;
    app.stop().await;
}

/// What a client reads of a raw operator request: status, the `WWW-Authenticate` header, the body.
async fn raw(
    app: &TestApp,
    method: Method,
    path: &str,
    token: Option<&str>,
    body: Option<Vec<u8>>,
) -> (StatusCode, Option<String>, Value) {
    let mut req = reqwest::Client::new().request(method, format!("{}{API}{path}", app.base()));
    if let Some(t) = token {
        req = req.bearer_auth(t);
    }
    if let Some(b) = body {
        req = req.header("content-type", "application/json").body(b);
    }
    let resp = req.send().await.unwrap();
    let status = resp.status();
    let challenge = resp.headers().get("www-authenticate").map(|v| v.to_str().unwrap().to_string());
    let text = resp.text().await.unwrap();
    (status, challenge, serde_json::from_str(&text).unwrap_or(Value::String(text)))
}

fn assert_envelope(body: &Value, code: &str, what: &str) {
    assert_eq!(body["error"]["code"], code, "{what}: {body}");
    assert!(body["error"]["message"].as_str().is_some_and(|m| !m.is_empty()), "{what}: {body}");
    assert!(body["error"]["correlation_id"].as_str().is_some_and(|c| c.starts_with("corr_")), "{what}: {body}");
}

#[tokio::test]
async fn every_operator_error_is_the_one_envelope_and_a_refused_body_changes_nothing() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let approval = ask(&agent, "envelope-1").await;
    let ops = app.operator_token("ops", "payments:audit payments:approve payments:admin");

    // 401s, missing and wrong tokens alike: the envelope, with the challenge in the header.
    let agent_token = app.token("dev-agent", "payments:read payments:create");
    for (token, what) in
        [(None, "no token"), (Some(agent_token.as_str()), "an agent's token"), (Some("x.y.z"), "garbage")]
    {
        let (status, challenge, body) = raw(&app, Method::GET, "/payments", token, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{what}");
        assert_envelope(&body, "UNAUTHORIZED", what);
        let challenge = challenge.unwrap_or_default();
        assert!(
            challenge.starts_with("Bearer ") && challenge.contains("oauth-protected-resource/operator"),
            "{what}: {challenge}"
        );
        assert_eq!(token.is_some(), challenge.contains("error=\"invalid_token\""), "{what}: {challenge}");
    }
    // What axum and tower-http answer by themselves: still the envelope.
    let (status, _, body) = raw(&app, Method::DELETE, "/payments", Some(&ops), None).await;
    assert_eq!(status, StatusCode::METHOD_NOT_ALLOWED);
    assert_envelope(&body, "METHOD_NOT_ALLOWED", "405");
    let big = serde_json::to_vec(&json!({"reason": "x".repeat(20 * 1024)})).unwrap();
    let (status, _, body) =
        raw(&app, Method::POST, &format!("/approvals/{approval}/reject"), Some(&ops), Some(big)).await;
    assert_eq!(status, StatusCode::PAYLOAD_TOO_LARGE);
    assert_envelope(&body, "PAYLOAD_TOO_LARGE", "413");

    // Bodies the spec refuses are refused, never read another way: a rejection without a reason,
    // a reason over 500 characters (not cut to 500), an array where an object belongs.
    let reject = format!("/approvals/{approval}/reject");
    for (body, says) in [
        (b"{}".to_vec(), "reason"),
        (br#"{"reason": "   "}"#.to_vec(), "reason"),
        (serde_json::to_vec(&json!({"reason": "y".repeat(501)})).unwrap(), "500"),
        (br#"["not ours"]"#.to_vec(), "object"),
    ] {
        let (status, _, answer) = raw(&app, Method::POST, &reject, Some(&ops), Some(body.clone())).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{}", String::from_utf8_lossy(&body));
        assert_envelope(&answer, "INVALID_ARGUMENT", "bad body");
        assert!(answer["error"]["message"].as_str().unwrap().contains(says), "{answer}");
    }
    let long = serde_json::to_vec(&json!({"reason": "z".repeat(501)})).unwrap();
    let (status, _, _) = raw(&app, Method::POST, "/principals/dev-agent/suspend", Some(&ops), Some(long)).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "a suspension's reason is bounded too");
    let (_, a) = get(&app, &format!("/approvals/{approval}"), &ops).await;
    assert_eq!(a["status"], "pending", "nothing was decided: {a}");
    let (_, agents) = get(&app, "/principals", &ops).await;
    assert!(agents["items"].as_array().unwrap().iter().all(|p| p["suspended"] == false), "{agents}");
    // Exactly 500 characters is kept whole.
    let (status, decided) = post(&app, &reject, &ops, json!({"reason": "r".repeat(500)})).await;
    assert_eq!(status, StatusCode::OK, "{decided}");
    assert_eq!(decided["decision_reason"].as_str().map(|r| r.chars().count()), Some(500));

    // Subjects: control characters are malformed; longer than any token's names no agent.
    let (status, body) = post(&app, "/principals/bot%07/suspend", &ops, json!({})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{body}");
    let long_subject = "é".repeat(200); // 200 characters, 400 bytes: no token's sub is that long
    let (status, body) = post(&app, &format!("/principals/{long_subject}/suspend"), &ops, json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");
    assert_envelope(&body, "NOT_FOUND", "long subject");
    let (status, body) =
        post(&app, &format!("/principals/dev-agent/resume?user={}", "u".repeat(257)), &ops, json!({})).await;
    assert_eq!(status, StatusCode::NOT_FOUND, "{body}");

    // An empty cursor is the first page; an empty status or date is malformed, not "all".
    let (status, first) = get(&app, "/approvals?cursor=", &ops).await;
    assert_eq!((status, first["items"].as_array().map(Vec::len)), (StatusCode::OK, Some(1)), "{first}");
    for path in
        ["/approvals?status=", "/mandates?status=", "/payments?status=", "/payments?from=", "/payments?account="]
    {
        let (status, body) = get(&app, path, &ops).await;
        assert_eq!(status, StatusCode::BAD_REQUEST, "{path}: {body}");
    }
    let _ = agent.cancel().await;
    app.stop().await;
}

#[tokio::test]
async fn the_console_is_served_under_a_strict_policy_and_can_be_switched_off() {
    let (app, _dir) = spawn_app().await;
    let http = reqwest::Client::new();
    let resp = http.get(format!("{}/console", app.base())).send().await.unwrap();
    assert_eq!(resp.status(), StatusCode::OK);
    let csp = resp.headers().get("content-security-policy").unwrap().to_str().unwrap().to_string();
    for directive in ["default-src 'none'", "script-src 'self'", "frame-ancestors 'none'", "connect-src 'self'"] {
        assert!(csp.contains(directive), "{csp}");
    }
    assert!(!csp.contains("unsafe-inline") && !csp.contains("unsafe-eval"), "{csp}");
    let html = resp.text().await.unwrap();
    assert!(html.contains("/console/app.js"), "{html}");
    for asset in ["/console/app.js", "/console/app.css"] {
        let r = http.get(format!("{}{asset}", app.base())).send().await.unwrap();
        assert_eq!(r.status(), StatusCode::OK, "{asset}");
        assert_eq!(r.headers()["x-content-type-options"], "nosniff");
    }
    let config: Value =
        http.get(format!("{}/console/config.json", app.base())).send().await.unwrap().json().await.unwrap();
    assert_eq!(config["api"], "/operator/v1");
    // The console signs in for the operator resource, never the agents' one.
    assert_eq!(config["resource"], format!("{}/operator", app.base()));
    assert_eq!((config["dev_sign_in"].as_bool(), config["oidc"].is_null()), (Some(true), true));
    app.stop().await;

    let dir = tempfile::tempdir().unwrap();
    let off = spawn_on(dir.path(), &[("PAYGATE_CONSOLE__ENABLED", "false")]).await;
    let r = http.get(format!("{}/console", off.base())).send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    off.stop().await;
}

/// `docs/operator-api.yaml` documents exactly the routes the server answers under `/operator/v1`.
#[tokio::test]
async fn the_openapi_file_lists_exactly_the_served_routes() {
    let root = env!("CARGO_MANIFEST_DIR");
    let doc = std::fs::read_to_string(format!("{root}/docs/operator-api.yaml")).unwrap();
    let documented: Vec<(String, String)> = {
        let mut out = Vec::new();
        let mut path = None;
        for line in doc.lines() {
            if let Some(p) = line.strip_prefix("  /").and_then(|l| l.strip_suffix(':')) {
                path = Some(format!("/{p}"));
            } else if let (Some(p), Some(m)) = (
                &path,
                line.strip_prefix("    ").and_then(|l| l.strip_suffix(':')).filter(|m| ["get", "post"].contains(m)),
            ) {
                out.push((m.to_uppercase(), p.clone()));
            } else if line == "components:" {
                break;
            }
        }
        out
    };
    // What the router serves, from the table it is built from.
    let served: Vec<(String, String)> = paygate::http::operator_routes()
        .into_iter()
        .filter_map(|(m, p)| p.strip_prefix("/operator/v1").map(|p| (m.as_str().to_string(), p.to_string())))
        .collect();
    let (mut d, mut s) = (documented.clone(), served);
    d.sort();
    s.sort();
    assert_eq!(d, s, "docs/operator-api.yaml vs operator_api() in src/http/mod.rs");
    // Each route has its own metrics label.
    let mut paths: Vec<String> = documented.iter().map(|(_, p)| format!("{API}{p}")).collect();
    paths.sort();
    paths.dedup();
    let mut labelled: Vec<String> = paygate::metrics::OPERATOR_ROUTES.iter().map(|r| r.to_string()).collect();
    labelled.sort();
    assert_eq!(paths, labelled, "docs/operator-api.yaml vs metrics::OPERATOR_ROUTES");

    // And the server answers each one (a missing route is a bare 404; a missing thing is an envelope).
    let (app, _dir) = spawn_app().await;
    let auditor = app.operator_token("auditor", "payments:audit");
    for (method, path) in documented {
        let concrete = path
            .replace("{payment_id}", "pay_00000000000000000000000000")
            .replace("{approval_id}", "apr_00000000000000000000000000")
            .replace("{mandate_id}", "mdt_x")
            .replace("{subject}", "someone");
        let m = if method == "GET" { Method::GET } else { Method::POST };
        let (status, body) = operator(&app, m, &format!("{API}{concrete}"), &auditor, Some(json!({}))).await;
        assert!(body["error"]["code"].is_string() || status.is_success(), "{method} {path}: {status} {body}");
    }
    app.stop().await;
}
