//! Three principals, never confused (issue 26): an agent (a token for the MCP resource), the user an
//! agent acts for (RFC 8693 delegation), and an operator (a token for the operator resource). Each
//! test here is one finding of the authority review, reproduced against the real server over HTTP;
//! SECURITY.md maps them (rows 15-23).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;

use common::*;
use paygate::clock::ManualClock;
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Every scope the gateway knows, agent's and operator's alike.
const EVERY_SCOPE: &str = "payments:read payments:create payments:refund payments:collect payments:payout \
                           payments:integrity payments:approve payments:audit payments:admin payments:confirm";

fn pay(op: &str, from: &str, to: &str, amount: &str) -> Value {
    json!({"operation_id": op, "from_account": from, "to_account": to, "amount": amount, "currency": "KES"})
}

/// Every operator route, from the table the router is built from (`paygate::http::operator_routes`),
/// its path parameters filled in.
fn operator_routes(approval: &str) -> Vec<(Method, String)> {
    paygate::http::operator_routes()
        .into_iter()
        .map(|(method, path)| {
            let path = path
                .replace("{id}", approval)
                .replace("{approval_id}", approval)
                .replace("{subject}", "dev-agent")
                .replace("{payment_id}", "pay_01a00000000000000000000000000000")
                .replace("{mandate_id}", "mdt_anything")
                .replace("{credential_id}", "AAAA")
                .replace("{message_id}", "msg_anything")
                .replace("{proposal_id}", "prop_anything")
                .replace("{version}", "1");
            (method, path)
        })
        .collect()
}

async fn raw(app: &TestApp, method: Method, path: &str, token: &str) -> reqwest::Response {
    paygate::install_crypto_provider();
    let mut req = reqwest::Client::new().request(method.clone(), format!("{}{path}", app.base())).bearer_auth(token);
    if method == Method::POST {
        req = req.json(&json!({"reason": "an agent tries", "subject": "dev-agent", "kind": "closed",
                               "currency": "KES", "payer": "acct-A", "payee": "acct-B", "amount": "1.00"}));
    }
    req.send().await.unwrap()
}

/// Finding 1 and the first "Done when": an agent-audience token with every scope the gateway knows
/// gets 401 from every operator route (and changes nothing), an operator-audience token gets 401 from
/// /mcp, and each resource's RFC 9728 document lists its own scopes.
#[tokio::test]
async fn agent_tokens_never_reach_an_operator_route_and_operator_tokens_never_reach_mcp() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let r = call(&agent, "create_payment", pay("p1-over", "acct-A", "acct-B", "5000.00")).await;
    let approval = err(&r)["approval_id"].as_str().unwrap().to_string();

    // The agent's token carrying every scope there is (minted without the /mcp refusal of confirm
    // mattering: the audience alone decides here).
    let agent_all = app.token("dev-agent", EVERY_SCOPE);
    let operator_metadata = format!("{}/.well-known/oauth-protected-resource/operator", app.base());
    for (method, path) in operator_routes(&approval) {
        let resp = raw(&app, method.clone(), &path, &agent_all).await;
        assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{method} {path}");
        let challenge = resp.headers()["www-authenticate"].to_str().unwrap().to_string();
        assert!(challenge.contains("invalid_token"), "{method} {path}: {challenge}");
        assert!(challenge.contains(&format!("resource_metadata=\"{operator_metadata}\"")), "{challenge}");
    }
    // Nothing changed: the approval is still pending and the agent not suspended.
    let auditor = app.operator_token("auditor", "payments:audit");
    let (_, a) = operator(&app, Method::GET, &format!("/approvals/{approval}"), &auditor, None).await;
    assert_eq!(a["status"], "pending", "{a}");
    let (_, agents) = operator(&app, Method::GET, "/operator/v1/principals", &auditor, None).await;
    assert!(agents["items"].as_array().unwrap().iter().all(|p| p["suspended"] == false), "{agents}");

    // An operator's token, every scope included, is refused by /mcp.
    let operator_all = app.operator_token("ops", EVERY_SCOPE);
    let Err(err) = try_connect(&app.url, &operator_all, Era::Modern).await else {
        panic!("an operator token reached /mcp")
    };
    assert!(format!("{err:?}").contains("token audience is not this resource"), "{err:?}");
    let resp = reqwest::Client::new()
        .post(&app.url)
        .bearer_auth(&operator_all)
        .header("accept", "application/json, text/event-stream")
        .json(&json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    assert!(resp.headers()["www-authenticate"].to_str().unwrap().contains("oauth-protected-resource/mcp\""));

    // Each resource's own metadata and scopes; no scope is in both.
    let doc = |path: &str| {
        let url = format!("{}{path}", app.base());
        async move { reqwest::get(url).await.unwrap().json::<Value>().await.unwrap() }
    };
    let mcp = doc("/.well-known/oauth-protected-resource/mcp").await;
    let ops = doc("/.well-known/oauth-protected-resource/operator").await;
    assert_eq!(mcp["resource"], app.url.as_str());
    assert_eq!(ops["resource"], format!("{}/operator", app.base()));
    let scopes = |d: &Value| {
        d["scopes_supported"].as_array().unwrap().iter().map(|s| s.as_str().unwrap().to_string()).collect::<Vec<_>>()
    };
    assert_eq!(
        scopes(&mcp),
        [
            "payments:read",
            "payments:create",
            "payments:refund",
            "payments:collect",
            "payments:payout",
            "payments:integrity"
        ]
    );
    assert_eq!(scopes(&ops), ["payments:audit", "payments:approve", "payments:admin", "payments:confirm"]);
    let _ = agent.cancel().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

/// Finding 1: suspended by the stop rule, the agent resumed itself with its own token (it carried
/// `payments:admin`), suspended another agent, and could reconcile. Now its token reaches no
/// operator route, its own subject signed in as an operator still cannot resume itself, and only a
/// colleague can.
#[tokio::test]
async fn a_suspended_agent_cannot_resume_itself_or_suspend_another() {
    let (app, _dir) = spawn_app().await;
    let token = app.token("dev-agent", "payments:read payments:create payments:integrity payments:admin");
    let agent = connect(&app.url, &token, Era::Modern).await;
    for n in 0..10 {
        // Ten amounts: ten intents, so the windowed count suspends, not the no-progress rule.
        let r =
            call(&agent, "create_payment", pay(&format!("probe-{n}"), "acct-A", "acct-Z", &format!("{}.00", n + 1)))
                .await;
        assert_eq!(code(&r), "ACCOUNT_NOT_ALLOWED");
    }
    let r = call(&agent, "create_payment", pay("after", "acct-A", "acct-B", "1.00")).await;
    assert_eq!(code(&r), "PRINCIPAL_SUSPENDED", "the stop rule suspended it");

    for path in ["/principals/dev-agent/resume", "/operator/v1/principals/dev-agent/resume"] {
        let (status, _) = operator(&app, Method::POST, path, &token, None).await;
        assert_eq!(status, StatusCode::UNAUTHORIZED, "{path}");
    }
    let (status, _) = operator(&app, Method::POST, "/operator/v1/principals/other/suspend", &token, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "it suspends no one");
    let (status, _) = operator(&app, Method::POST, "/operator/v1/reconciliation/run", &token, None).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "it runs no operator action");
    // Its own subject, signed in for the operator resource with payments:admin: still itself.
    let itself = app.operator_token("dev-agent", "payments:admin");
    let (status, body) = operator(&app, Method::POST, "/principals/dev-agent/resume", &itself, None).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("SELF_REVIEW")), "{body}");
    let (status, body) = operator(&app, Method::POST, "/principals/dev-agent/suspend", &itself, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "nor suspends itself: {body}");
    let r = call(&agent, "get_balance", json!({"account_id": "acct-A"})).await;
    assert_eq!(code(&r), "PRINCIPAL_SUSPENDED", "still suspended");

    let admin = app.operator_token("ops-root", "payments:admin");
    let (status, body) = operator(&app, Method::POST, "/principals/dev-agent/resume", &admin, None).await;
    assert_eq!((status, body["resumed"].as_bool()), (StatusCode::OK, Some(true)), "{body}");
    ok(&call(&agent, "create_payment", pay("after", "acct-A", "acct-B", "1.00")).await);
    let _ = agent.cancel().await;
    app.stop().await;
}

/// Finding 1: suspension was keyed by subject alone, so suspending "twin" at one issuer suspended
/// (and resuming resumed) the "twin" of every issuer. Now it is (issuer, subject).
#[tokio::test]
async fn suspension_is_keyed_by_issuer_and_subject() {
    let dir = tempfile::tempdir().unwrap();
    let pem = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rsa1.pub.pem");
    let idp = "https://idp.principals.test";
    let app = spawn_on(
        dir.path(),
        &[
            ("PAYGATE_AUTH__ISSUER", idp),
            ("PAYGATE_AUTH__PUBLIC_KEY_FILES", &format!("[{:?}]", pem.display().to_string())),
            ("PAYGATE_AUTH__DEV_KEY_ENABLED", "true"),
        ],
    )
    .await;
    let key = std::fs::read(std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/rsa1.pem")).unwrap();
    let t = now_secs();
    let claims = json!({"iss": idp, "sub": "twin", "aud": app.url, "iat": t, "exp": t + 600, "scope": "payments:read"});
    let idp_twin = jsonwebtoken::encode(
        &jsonwebtoken::Header::new(jsonwebtoken::Algorithm::RS256),
        &claims,
        &jsonwebtoken::EncodingKey::from_rsa_pem(&key).unwrap(),
    )
    .unwrap();
    let dev_twin = app.token("twin", "payments:read");
    let read = |token: String| {
        let url = app.url.clone();
        async move {
            let c = connect(&url, &token, Era::Modern).await;
            let r = call(&c, "get_balance", json!({"account_id": "acct-A"})).await;
            let _ = c.cancel().await;
            code(&r)
        }
    };
    // No profile gives "twin" accounts: unsuspended, the read is ACCOUNT_NOT_ALLOWED.
    assert_eq!(read(dev_twin.clone()).await, "ACCOUNT_NOT_ALLOWED");
    assert_eq!(read(idp_twin.clone()).await, "ACCOUNT_NOT_ALLOWED");
    let admin = app.operator_token("ops-root", "payments:admin");
    let path = format!("/principals/twin/suspend?issuer={}", urlencode(DEV_ISSUER));
    let (status, body) = operator(&app, Method::POST, &path, &admin, Some(json!({"reason": "dev twin only"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(read(dev_twin.clone()).await, "PRINCIPAL_SUSPENDED");
    assert_eq!(read(idp_twin.clone()).await, "ACCOUNT_NOT_ALLOWED", "the other issuer's twin is another principal");
    // Resuming the IdP's twin (not suspended) leaves the dev twin suspended.
    let path = format!("/principals/twin/resume?issuer={}", urlencode(idp));
    let (status, body) = operator(&app, Method::POST, &path, &admin, None).await;
    assert_eq!((status, body["resumed"].as_bool()), (StatusCode::OK, Some(false)), "{body}");
    assert_eq!(read(dev_twin).await, "PRINCIPAL_SUSPENDED");
    app.stop().await;
}

fn urlencode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A value of the Prometheus text, or 0 when the series is absent.
async fn metric(app: &TestApp, series: &str) -> u64 {
    let text = reqwest::get(format!("{}/metrics", app.base())).await.unwrap().text().await.unwrap();
    text.lines().find_map(|l| l.strip_prefix(series).and_then(|v| v.trim().parse().ok())).unwrap_or(0)
}

const FLOOD: &str = r#"
[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "flooder"
subjects = ["flooder"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "100000.00" }
calls_per_minute = 3
"#;

/// Finding 2: 300 concurrent calls over the rate limit wrote an audit record each (179 of them on
/// the default profile), RATE_LIMITED never counted toward the stop rule, and suspension was
/// checked after the rate limit. Now: one record per interval carrying the count, metrics count
/// every refusal, the flood ends in suspension, and a suspended agent is refused before the limiter.
#[tokio::test]
async fn a_rate_limited_flood_is_one_audit_record_per_interval_and_ends_in_suspension() {
    let (dir, clock) = (tempfile::tempdir().unwrap(), ManualClock::new(now_secs()));
    let app = spawn_with_toml(dir.path(), FLOOD, &[], Arc::new(clock.clone())).await;
    let agent = Arc::new(connect(&app.url, &app.token("flooder", "payments:read"), Era::Modern).await);
    let mut flood = tokio::task::JoinSet::new();
    for _ in 0..300 {
        let a = agent.clone();
        flood.spawn(async move { call(&a, "get_balance", json!({"account_id": "acct-A"})).await });
    }
    let results = flood.join_all().await;
    let count = |c: &str| results.iter().filter(|r| r.is_error == Some(true) && code(r) == c).count() as i64;
    let (oks, limited, suspended) = (
        results.iter().filter(|r| r.is_error != Some(true)).count(),
        count("RATE_LIMITED"),
        count("PRINCIPAL_SUSPENDED"),
    );
    assert_eq!(oks, 3, "calls_per_minute = 3");
    assert_eq!(oks as i64 + limited + suspended, 300);
    // 20 RATE_LIMITED answers count as one denial (the default weight); 10 denials suspend.
    assert!(limited >= 200, "{limited}");
    // Suspended: the next call is refused before the (still exhausted) rate limiter.
    let r = call(&agent, "get_balance", json!({"account_id": "acct-A"})).await;
    assert_eq!(code(&r), "PRINCIPAL_SUSPENDED");

    let audit = app.audit("flooder").await;
    let of = |c: &str| {
        audit.iter().filter(|a| a.code.as_deref() == Some(c) && a.decision != "suspended").collect::<Vec<_>>()
    };
    assert_eq!(of("RATE_LIMITED").len(), 1, "one record for the window, not one per refusal: {:?}", of("RATE_LIMITED"));
    assert_eq!(audit.iter().filter(|a| a.decision == "suspended").count(), 1);
    assert!(of("PRINCIPAL_SUSPENDED").len() <= 1, "{:?}", of("PRINCIPAL_SUSPENDED"));
    assert!(audit.len() <= 4, "a handful of records, not hundreds: {}", audit.len());
    // Metrics count every refusal.
    let series = "paygate_decisions_total{tool=\"get_balance\",decision=\"rate_limited\",code=\"RATE_LIMITED\"}";
    assert_eq!(metric(&app, series).await as i64, limited);

    // The window ends: the rest of the count reaches the trail, and no refusal is lost.
    clock.advance(61);
    app.running.gateway.flush_refusals().await;
    let audit = app.audit("flooder").await;
    let repeats = |c: &str| {
        audit
            .iter()
            .filter(|a| a.code.as_deref() == Some(c) && a.decision != "suspended")
            .map(|a| a.repeats)
            .sum::<i64>()
    };
    assert_eq!(repeats("RATE_LIMITED"), limited, "every RATE_LIMITED answer is in the records' counts");
    assert_eq!(repeats("PRINCIPAL_SUSPENDED"), suspended + 1);
    if let Ok(a) = Arc::try_unwrap(agent) {
        let _ = a.cancel().await;
    }
    app.stop().await;
}

/// Finding 2: a flood of requests past `approvals.pending_per_agent_max` answered RATE_LIMITED and
/// never suspended anyone. Now those answers count toward the stop rule at their weight.
#[tokio::test]
async fn an_approval_flood_past_the_pending_bound_ends_in_suspension() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(
        dir.path(),
        &[
            ("PAYGATE_APPROVALS__PENDING_PER_AGENT_MAX", "2"),
            ("PAYGATE_STOP_RULES__DENIALS_MAX", "5"),
            ("PAYGATE_STOP_RULES__RATE_LIMITED_PER_DENIAL", "2"),
            // One intent, refused again and again: the windowed weight is what this tests.
            ("PAYGATE_STOP_RULES__REPEAT_MAX", "0"),
        ],
    )
    .await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let mut codes = Vec::new();
    for n in 0..20 {
        let r = call(&agent, "create_payment", pay(&format!("flood-{n}"), "acct-A", "acct-B", "5000.00")).await;
        codes.push(code(&r));
    }
    assert_eq!(&codes[..2], ["APPROVAL_REQUIRED", "APPROVAL_REQUIRED"]);
    let limited = codes.iter().filter(|c| *c == "RATE_LIMITED").count();
    assert_eq!(limited, 10, "5 denials × 2 RATE_LIMITED each, then suspended: {codes:?}");
    assert!(codes[12..].iter().all(|c| c == "PRINCIPAL_SUSPENDED"), "{codes:?}");
    let audit = app.audit("dev-agent").await;
    assert_eq!(audit.iter().filter(|a| a.decision == "suspended").count(), 1);
    let _ = agent.cancel().await;
    app.stop().await;
}

const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"t","version":"1"}}}"#;

/// Finding 3: the per-agent session cap was checked before the session existed and counted after
/// rmcp answered, so 320 concurrent `initialize` calls under a cap of 256 got 320 sessions. Now the
/// place is reserved in the step that admits the request.
#[tokio::test]
async fn concurrent_initialize_calls_cannot_pass_the_per_agent_session_cap() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_SERVER__SESSIONS_PER_PRINCIPAL_MAX", "8")]).await;
    paygate::install_crypto_provider();
    let http = reqwest::Client::new();
    let token = app.dev_token();
    let init = |n: usize| {
        let mut set = tokio::task::JoinSet::new();
        for _ in 0..n {
            let req = http
                .post(&app.url)
                .bearer_auth(&token)
                .header("content-type", "application/json")
                .header("accept", "application/json, text/event-stream")
                .body(INITIALIZE);
            set.spawn(async move { req.send().await });
        }
        set.join_all()
    };
    let replies = init(40).await;
    let mut sessions = Vec::new();
    let mut refused = 0;
    for r in replies {
        let r = r.unwrap();
        match r.status() {
            StatusCode::OK => sessions.push(r.headers()["mcp-session-id"].to_str().unwrap().to_string()),
            StatusCode::TOO_MANY_REQUESTS => refused += 1,
            other => panic!("unexpected {other}"),
        }
    }
    assert_eq!(sessions.len(), 8, "exactly the cap, however the 40 raced");
    assert_eq!(refused, 32);
    // Ending one frees exactly one place.
    let end = http.delete(&app.url).bearer_auth(&token).header("mcp-session-id", &sessions[0]).send().await.unwrap();
    assert!(end.status().is_success(), "{}", end.status());
    let more = init(5).await;
    let opened = more.into_iter().filter(|r| r.as_ref().unwrap().status() == StatusCode::OK).count();
    assert_eq!(opened, 1);
    app.stop().await;
}

const DELEGATION: &str = r#"
[[policy.profiles]]
name = "default"

# The agent's own profile: acct-A to acct-B, KES 1,000 without a human.
[[policy.profiles]]
name = "bot"
subjects = ["bot"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "100000.00" }
calls_per_minute = 10000

# Pat's profile bounds any agent acting for pat: KES 100 a payment, KES 150 a day.
[[policy.profiles]]
name = "pat"
users = ["pat"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "100.00" }
daily_limit = { KES = "150.00" }
calls_per_minute = 10000
"#;

/// Finding 8 and the third "Done when": with a delegated token (`sub` = the user, `act.sub` = the
/// agent) the principal is the pair. The profile matched on the user applies; budgets, keys and the
/// stop rule are per (user, agent); the audit row, get_payment and the operator timeline name both.
#[tokio::test]
async fn a_delegated_token_is_the_pair_of_agent_and_user() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(dir.path(), DELEGATION, &[], Arc::new(paygate::clock::SystemClock)).await;
    let scopes = "payments:read payments:create";
    let pat = connect(&app.url, &app.delegated_token("pat", "bot", scopes), Era::Modern).await;
    let quinn = connect(&app.url, &app.delegated_token("quinn", "bot", scopes), Era::Legacy).await;
    let bot = connect(&app.url, &app.token("bot", scopes), Era::Modern).await;

    // Pat's profile, not the agent's: over KES 100 needs a human, and the day holds KES 150.
    let r = call(&pat, "create_payment", pay("pat-big", "acct-A", "acct-B", "200.00")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "pat's limit applies");
    let first = ok(&call(&pat, "create_payment", pay("same-op", "acct-A", "acct-B", "100.00")).await).clone();
    ok(&call(&pat, "create_payment", pay("pat-2", "acct-A", "acct-B", "50.00")).await);
    let r = call(&pat, "create_payment", pay("pat-3", "acct-A", "acct-B", "10.00")).await;
    assert_eq!(code(&r), "BUDGET_EXCEEDED", "pat's day is spent");
    // Another person through the same agent: the agent's own profile, a budget of their own, and
    // the same operation_id is their own operation (not pat's replayed).
    let theirs = ok(&call(&quinn, "create_payment", pay("same-op", "acct-A", "acct-B", "500.00")).await).clone();
    assert_ne!(theirs["payment_id"], first["payment_id"]);
    assert_eq!(theirs["replayed"], false);
    ok(&call(&bot, "create_payment", pay("same-op", "acct-A", "acct-B", "600.00")).await);

    // get_payment names the agent and the user; each pair sees its own payments, and the agent on
    // its own token (another principal) sees neither person's.
    let got = ok(&call(&pat, "get_payment", json!({"payment_id": first["payment_id"]})).await).clone();
    assert_eq!((got["agent"].as_str(), got["user"].as_str()), (Some("bot"), Some("pat")), "{got}");
    let direct = ok(&call(&quinn, "get_payment", json!({"payment_id": theirs["payment_id"]})).await).clone();
    assert_eq!(direct["user"], "quinn");
    assert_eq!(code(&call(&bot, "get_payment", json!({"payment_id": first["payment_id"]})).await), "NOT_FOUND");
    // The audit row names both.
    let audit = app.audit("bot").await;
    let allowed =
        audit.iter().find(|a| a.decision == "allowed" && a.payment_id.as_deref() == first["payment_id"].as_str());
    let allowed = allowed.expect("the payment's audit row");
    assert_eq!((allowed.principal_sub.as_str(), allowed.principal_user.as_deref()), ("bot", Some("pat")));
    assert!(audit.iter().any(|a| a.principal_user.is_none() && a.decision == "allowed"), "the agent on its own");
    // The operator API: the payment, its timeline and an audit search by user.
    let ops = app.operator_token("ops", "payments:audit");
    let id = first["payment_id"].as_str().unwrap();
    let (status, detail) = operator(&app, Method::GET, &format!("/operator/v1/payments/{id}"), &ops, None).await;
    assert_eq!(status, StatusCode::OK, "{detail}");
    assert_eq!(
        (detail["payment"]["agent_subject"].as_str(), detail["payment"]["user"].as_str()),
        (Some("bot"), Some("pat"))
    );
    let paid = detail["timeline"].as_array().unwrap().iter().find(|e| e["step"] == "paid").expect("a paid step");
    assert_eq!((paid["actor"].as_str(), paid["user"].as_str()), (Some("bot"), Some("pat")), "{paid}");
    let (_, found) = operator(&app, Method::GET, "/operator/v1/audit?user=pat", &ops, None).await;
    let items = found["items"].as_array().unwrap();
    assert!(!items.is_empty() && items.iter().all(|e| e["user"] == "pat"), "{found}");
    let (_, listed) = operator(&app, Method::GET, "/operator/v1/payments?user=quinn", &ops, None).await;
    assert_eq!(listed["items"].as_array().unwrap().len(), 1, "{listed}");

    // Suspending the pair stops the agent for pat only.
    let admin = app.operator_token("ops-root", "payments:admin");
    let (status, body) =
        operator(&app, Method::POST, "/principals/bot/suspend?user=pat", &admin, Some(json!({"reason": "pat asked"})))
            .await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(code(&call(&pat, "get_balance", json!({"account_id": "acct-A"})).await), "PRINCIPAL_SUSPENDED");
    ok(&call(&quinn, "get_balance", json!({"account_id": "acct-A"})).await);
    ok(&call(&bot, "get_balance", json!({"account_id": "acct-A"})).await);
    // The agent for everyone: a suspension without a user.
    let (status, _) = operator(&app, Method::POST, "/principals/bot/suspend", &admin, Some(json!({}))).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(code(&call(&quinn, "get_balance", json!({"account_id": "acct-A"})).await), "PRINCIPAL_SUSPENDED");
    assert_eq!(code(&call(&bot, "get_balance", json!({"account_id": "acct-A"})).await), "PRINCIPAL_SUSPENDED");
    // Pat cannot resume the agent acting for pat (no principal acts on itself), a colleague can.
    let pat_ops = app.operator_token("pat", "payments:admin");
    let (status, _) = operator(&app, Method::POST, "/principals/bot/resume?user=pat", &pat_ops, None).await;
    assert_eq!(status, StatusCode::FORBIDDEN);
    let (status, body) = operator(&app, Method::POST, "/principals/bot/resume", &admin, None).await;
    assert_eq!((status, body["resumed"].as_bool()), (StatusCode::OK, Some(true)));
    ok(&call(&pat, "get_balance", json!({"account_id": "acct-A"})).await);
    for c in [pat, quinn, bot] {
        let _ = c.cancel().await;
    }
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

/// The operators' principals view lists the agents seen acting in the last seven days (beside
/// every agent with a suspension on record), each with when it was last seen: one seen two days
/// ago is listed, one last seen eight days ago is not.
#[tokio::test]
async fn the_principals_view_lists_agents_seen_within_seven_days() {
    use paygate::clock::Clock as _;
    let clock = ManualClock::new(paygate::clock::SystemClock.now());
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_clock(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")], Arc::new(clock.clone())).await;
    let act = |sub: &'static str| {
        let app = &app;
        async move {
            let agent = connect(&app.url, &app.token(sub, "payments:read payments:create"), Era::Modern).await;
            let _ = call(&agent, "create_payment", pay(&format!("{sub}-1"), "acct-A", "acct-B", "1.00")).await;
        }
    };
    act("dev-agent").await;
    clock.advance(6 * 86_400);
    act("agent-recent").await;
    clock.advance(2 * 86_400);
    let auditor = app.operator_token("auditor", "payments:audit");
    let (status, view) = operator(&app, Method::GET, "/operator/v1/principals", &auditor, None).await;
    assert_eq!(status, StatusCode::OK, "{view}");
    let listed: Vec<&str> = view["items"].as_array().unwrap().iter().map(|p| p["subject"].as_str().unwrap()).collect();
    assert!(listed.contains(&"agent-recent"), "seen two days ago: {view}");
    assert!(!listed.contains(&"dev-agent"), "last seen eight days ago: {view}");
    app.stop().await;
}
