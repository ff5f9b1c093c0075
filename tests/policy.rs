//! Policy as data against the real server: operators change an agent's limits through the operator
//! API and the next call is judged under the new version; lowering a limit or disabling a tool
//! applies at once, raising one needs a second, distinct operator (never the author, never an
//! agent); every decision's audit record names the version it was judged under; a dry run replays
//! recorded history against a proposal and reports exactly the calls whose answer it changes,
//! writing nothing; the config file is version 1, and an operator's version outlives an edited
//! file. (Two replicas on PostgreSQL: tests/replicas.rs.)
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;

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
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"})
}

/// The version in force and its document.
async fn current(app: &TestApp, token: &str) -> (i64, Value) {
    let (status, body) = get(app, "/policy", token).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    (body["version"].as_i64().unwrap(), body["document"].clone())
}

/// `doc` with the dev profile's field set.
fn with_dev(mut doc: Value, field: &str, value: Value) -> Value {
    let profiles = doc["policy"]["profiles"].as_array_mut().unwrap();
    let dev = profiles.iter_mut().find(|p| p["name"] == "dev").expect("the dev profile");
    dev[field] = value;
    doc
}

async fn propose(app: &TestApp, token: &str, doc: Value, base: i64) -> (StatusCode, Value) {
    post(app, "/policy/proposals", token, json!({"document": doc, "reason": "test change", "base_version": base})).await
}

/// The agent's decision records of one operation, as the operator API shows them.
async fn audit_of(app: &TestApp, token: &str, decision: &str) -> Vec<Value> {
    let (status, body) = get(app, &format!("/audit?agent=dev-agent&decision={decision}&limit=100"), token).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    body["items"].as_array().unwrap().clone()
}

#[tokio::test]
async fn lowering_applies_at_once_raising_needs_a_second_operator_and_the_agent_can_do_neither() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let alice = app.operator_token("alice", "payments:admin payments:audit");
    let bob = app.operator_token("bob", "payments:admin");
    let (v1, doc) = current(&app, &alice).await;
    assert_eq!(v1, 1, "the config file is version 1 of an empty store");

    let r = call(&agent, "create_payment", pay("before", "800.00")).await;
    assert_eq!(ok(&r)["status"], "succeeded", "{r:?}");

    // Lowering the dev profile's autonomous limit: one operator, in force at once.
    let lower = with_dev(doc.clone(), "autonomous_limit", json!({"KES": "500.00"}));
    let (status, body) = propose(&app, &alice, lower.clone(), v1).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!(
        (body["status"].as_str(), body["version"].as_i64(), body["widens"].as_bool()),
        (Some("applied"), Some(2), Some(false))
    );
    let r = call(&agent, "create_payment", pay("after-lowering", "800.00")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "what was allowed needs a human now");

    // Raising it: alice alone only proposes; nothing changes for the agent.
    let raise = with_dev(lower, "autonomous_limit", json!({"KES": "5000.00"}));
    let (status, body) = propose(&app, &alice, raise.clone(), 2).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    assert_eq!(body["status"], "pending");
    assert!(body["changes"].as_array().unwrap().iter().any(|c| c["widens"] == true), "{body}");
    let id = body["proposal_id"].as_str().unwrap().to_string();
    let r =
        call(&agent, "check_payment_policy", json!({"tool": "create_payment", "arguments": pay("probe-1", "2000.00")}))
            .await;
    assert_eq!(ok(&r)["verdict"], "approval_required", "a pending raise is not in force");

    // Not by its author, not by an agent's token, not without payments:admin.
    let (status, body) = post(&app, &format!("/policy/proposals/{id}/approve"), &alice, json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("SELF_REVIEW")), "{body}");
    let (status, _) = post(&app, &format!("/policy/proposals/{id}/approve"), &app.dev_token(), json!({})).await;
    assert_eq!(status, StatusCode::UNAUTHORIZED, "an agent token is not an operator's");
    let agent_raise =
        post(&app, "/policy/proposals", &app.dev_token(), json!({"document": raise, "reason": "me"})).await;
    assert_eq!(agent_raise.0, StatusCode::UNAUTHORIZED, "{}", agent_raise.1);
    let approver = app.operator_token("carol", "payments:approve payments:audit");
    let (status, body) = post(&app, &format!("/policy/proposals/{id}/approve"), &approver, json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("INSUFFICIENT_SCOPE")));
    assert_eq!(current(&app, &alice).await.0, 2, "nothing applied");

    // A second operator applies it.
    let (status, body) = post(&app, &format!("/policy/proposals/{id}/approve"), &bob, json!({})).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    assert_eq!((body["status"].as_str(), body["version"].as_i64()), (Some("applied"), Some(3)));
    let (status, again) = post(&app, &format!("/policy/proposals/{id}/approve"), &bob, json!({})).await;
    assert_eq!(status, StatusCode::CONFLICT, "decided once: {again}");
    let r = call(&agent, "create_payment", pay("after-raise", "2000.00")).await;
    assert_eq!(ok(&r)["status"], "succeeded", "{r:?}");

    // The version record names both operators; each decision names the version it was judged under.
    let (_, v3) = get(&app, "/policy/versions/3", &alice).await;
    assert_eq!((v3["author"].as_str(), v3["in_force"].as_bool()), (Some("alice"), Some(true)), "{v3}");
    assert!(v3["approved_by"].as_str().unwrap().starts_with("bob"), "{v3}");
    let allowed = audit_of(&app, &alice, "allowed").await;
    let mut versions: Vec<i64> = allowed.iter().map(|r| r["policy_version"].as_i64().unwrap()).collect();
    versions.sort();
    assert_eq!(versions, vec![1, 3], "the 800.00 under version 1, the 2000.00 under 3: {allowed:?}");
    let asked = audit_of(&app, &alice, "approval_required").await;
    assert_eq!(asked.iter().map(|r| r["policy_version"].as_i64()).collect::<Vec<_>>(), vec![Some(2)], "{asked:?}");
    assert_eq!(asked[0]["intent"]["judged_minor"], 80_000, "{asked:?}");

    // The changes themselves are audited as the operators'.
    let (_, ops) = get(&app, "/audit?agent=bob&tool=policy.approve", &alice).await;
    assert_eq!(ops["items"].as_array().unwrap().len(), 1, "{ops}");
    // And the trail still verifies (records carrying a version hash as link v2).
    let (status, verdict) = get(&app, "/audit/verify", &alice).await;
    assert_eq!((status, verdict["ok"].as_bool()), (StatusCode::OK, Some(true)), "{verdict}");
}

#[tokio::test]
async fn simulate_reports_exactly_the_calls_a_proposal_changes_and_writes_nothing() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let alice = app.operator_token("alice", "payments:admin payments:audit");
    let auditor = app.operator_token("auditor", "payments:audit");
    // History under version 1 (dev: 1000.00 autonomous, 100000.00 a day).
    for (op, amount) in [("h-100", "100.00"), ("h-600", "600.00"), ("h-900", "900.00")] {
        let r = call(&agent, "create_payment", pay(op, amount)).await;
        assert_eq!(ok(&r)["status"], "succeeded", "{op}: {r:?}");
    }
    let r = call(&agent, "create_payment", pay("h-1500", "1500.00")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED");
    // Calls policy never judged are not replayed: a conflict (same operation, other amount), a
    // replay, bad arguments.
    assert_eq!(code(&call(&agent, "create_payment", pay("h-100", "101.00")).await), "IDEMPOTENCY_CONFLICT");
    assert_eq!(ok(&call(&agent, "create_payment", pay("h-100", "100.00")).await)["status"], "succeeded");
    assert_eq!(code(&call(&agent, "create_payment", pay("h-bad", "1.001")).await), "INVALID_ARGUMENT");
    let (v, doc) = current(&app, &alice).await;

    let simulate = |doc: Value| {
        let (app, auditor) = (&app, &auditor);
        async move {
            let (status, body) = post(app, "/policy/simulate", auditor, json!({"document": doc})).await;
            assert_eq!(status, StatusCode::OK, "{body}");
            body
        }
    };
    let changed = |report: &Value| -> Vec<(String, String, String)> {
        report["changed"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| {
                (
                    c["amount"].as_str().unwrap().to_string(),
                    c["before"]["outcome"].as_str().unwrap().to_string(),
                    c["after"]["outcome"].as_str().unwrap().to_string(),
                )
            })
            .collect()
    };
    let s = |a: &str, b: &str, c: &str| (a.to_string(), b.to_string(), c.to_string());

    // Lowering the limit to 500.00: the 600 and 900 payments would have needed a human.
    let report = simulate(with_dev(doc.clone(), "autonomous_limit", json!({"KES": "500.00"}))).await;
    assert_eq!(report["replayed"], 4, "the four judged calls: {report}");
    // Without a window it looks back seven days from now.
    let day = |field: &str| {
        let t = time::OffsetDateTime::parse(
            report[field].as_str().unwrap(),
            &time::format_description::well_known::Rfc3339,
        );
        t.unwrap().unix_timestamp()
    };
    assert_eq!(day("until") - day("since"), 7 * 86_400, "{report}");
    // A window of bare dates runs from the start of `since` to the end of `until`: yesterday to
    // today holds every call above.
    let now = paygate::clock::Clock::now(&paygate::clock::SystemClock);
    let (yesterday, today) = (paygate::clock::rfc3339(now - 86_400), paygate::clock::rfc3339(now));
    let doc500 = with_dev(doc.clone(), "autonomous_limit", json!({"KES": "500.00"}));
    let body = json!({"document": doc500, "since": &yesterday[..10], "until": &today[..10]});
    let (status, dated) = post(&app, "/policy/simulate", &auditor, body).await;
    assert_eq!((status, dated["replayed"].as_i64()), (StatusCode::OK, Some(4)), "{dated}");
    assert_eq!(
        changed(&report),
        vec![s("600.00", "allowed", "approval_required"), s("900.00", "allowed", "approval_required")],
        "{report}"
    );
    let totals = &report["totals"][0];
    assert_eq!((totals["agent"].as_str(), totals["currency"].as_str()), (Some("dev-agent"), Some("KES")));
    assert_eq!((totals["stricter"].as_i64(), totals["stricter_amount"].as_str()), (Some(2), Some("1500.00")));
    assert_eq!((totals["looser"].as_i64(), report["changes"][0]["widens"].as_bool()), (Some(0), Some(false)));

    // Raising it to 2000.00: the 1500 payment would have gone through alone.
    let report = simulate(with_dev(doc.clone(), "autonomous_limit", json!({"KES": "2000.00"}))).await;
    assert_eq!(changed(&report), vec![s("1500.00", "approval_required", "allowed")], "{report}");

    // A daily limit of 1000.00, replayed in order: 100 + 600 fit, the 900 would have been refused.
    let report = simulate(with_dev(doc.clone(), "daily_limit", json!({"KES": "1000.00"}))).await;
    assert_eq!(changed(&report), vec![s("900.00", "allowed", "refused")], "{report}");
    assert_eq!(report["changed"][0]["after"]["code"], "BUDGET_EXCEEDED");

    // Governance: every create_payment needs a human.
    let mut governed = doc.clone();
    governed["tools"]["approval_required"] = json!(["create_payment"]);
    let report = simulate(governed).await;
    assert_eq!(changed(&report).len(), 3, "the three allowed payments: {report}");

    // The same document: nothing changes.
    let report = simulate(doc.clone()).await;
    assert_eq!((report["replayed"].as_i64(), report["changed"].as_array().unwrap().len()), (Some(4), 0));

    // It wrote nothing: the same version, no proposal. A bad window or document is refused.
    assert_eq!(current(&app, &alice).await.0, v);
    let (_, proposals) = get(&app, "/policy/proposals", &alice).await;
    assert_eq!(proposals["items"].as_array().unwrap().len(), 0, "{proposals}");
    for bad in [
        json!({"document": doc, "since": "yesterday"}),
        json!({"document": doc, "since": "2026-12-02", "until": "2026-11-30"}),
        json!({"document": doc, "since": "2000-01-01"}),
        json!({"document": {"policy": {}}}),
        json!({"document": with_dev(doc.clone(), "calls_per_minute", json!(0))}),
    ] {
        let (status, body) = post(&app, "/policy/simulate", &auditor, bad.clone()).await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("INVALID_ARGUMENT")),
            "{bad}: {body}"
        );
    }
}

#[tokio::test]
async fn disabling_a_tool_is_live_and_enabling_it_again_takes_two_operators() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let (alice, bob) = (app.operator_token("alice", "payments:admin"), app.operator_token("bob", "payments:admin"));
    let (v, doc) = current(&app, &alice).await;
    let mut off = doc.clone();
    off["tools"]["disabled"] = json!(["create_payment"]);
    let (status, body) = propose(&app, &alice, off, v).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("applied")), "{body}");
    let names: Vec<String> = agent.list_all_tools().await.unwrap().into_iter().map(|t| t.name.to_string()).collect();
    assert!(!names.iter().any(|n| n == "create_payment") && names.iter().any(|n| n == "get_balance"), "{names:?}");
    let refused = agent
        .call_tool(
            rmcp::model::CallToolRequestParams::new("create_payment")
                .with_arguments(pay("while-off", "1.00").as_object().unwrap().clone()),
        )
        .await;
    assert_no_such_tool(&refused);
    let r =
        call(&agent, "check_payment_policy", json!({"tool": "create_payment", "arguments": pay("p", "1.00")})).await;
    assert!(format!("{r:?}").contains("disabled by policy"), "{r:?}");

    // Enabling it widens: pending until bob approves.
    let (status, body) = propose(&app, &alice, doc, v + 1).await;
    assert_eq!(status, StatusCode::ACCEPTED, "{body}");
    let id = body["proposal_id"].as_str().unwrap();
    let (status, _) = post(&app, &format!("/policy/proposals/{id}/approve"), &bob, json!({})).await;
    assert_eq!(status, StatusCode::OK);
    let r = call(&agent, "create_payment", pay("after-on", "1.00")).await;
    assert_eq!(ok(&r)["status"], "succeeded", "{r:?}");
}

#[tokio::test]
async fn bad_proposals_change_nothing_and_a_stale_one_is_refused() {
    let (app, _dir) = spawn_app().await;
    let (alice, bob) = (app.operator_token("alice", "payments:admin"), app.operator_token("bob", "payments:admin"));
    let (v, doc) = current(&app, &alice).await;
    let (status, body) =
        post(&app, "/policy/proposals", &alice, json!({"document": doc, "reason": "same", "base_version": v})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("CONFLICT")), "no change: {body}");
    let cases = [
        json!({"document": with_dev(doc.clone(), "autonomous_limit", json!({"KES": "1.001"})), "reason": "r"}),
        json!({"document": with_dev(doc.clone(), "autonomous_limit", json!({"USD": "5.00"})), "reason": "no daily"}),
        json!({"document": with_dev(doc.clone(), "daily_limit", json!({"KES": "-1.00"})), "reason": "negative"}),
        json!({"document": {"policy": {"default_profile": "nobody", "profiles": []}}, "reason": "r"}),
        json!({"document": with_dev(doc.clone(), "autonomous_limit", json!({"KES": "1.00"}))}),
        json!({"document": with_dev(doc.clone(), "autonomous_limit", json!({"KES": "1.00"})), "reason": "a\u{7}b"}),
        json!({"document": doc, "reason": "r", "extra": 1}),
    ];
    for body in cases {
        let (status, answer) = post(&app, "/policy/proposals", &alice, body.clone()).await;
        assert_eq!(
            (status, answer["error"]["code"].as_str()),
            (StatusCode::BAD_REQUEST, Some("INVALID_ARGUMENT")),
            "{body}: {answer}"
        );
    }
    assert_eq!(current(&app, &alice).await.0, v, "nothing applied");
    // A proposal written on version v cannot apply once another change landed.
    let raise = with_dev(doc.clone(), "autonomous_limit", json!({"KES": "9000.00"}));
    let (_, pending) = propose(&app, &alice, raise, v).await;
    let id = pending["proposal_id"].as_str().unwrap();
    let lower = with_dev(doc.clone(), "autonomous_limit", json!({"KES": "10.00"}));
    assert_eq!(propose(&app, &bob, lower.clone(), v).await.0, StatusCode::OK);
    let (status, body) = post(&app, &format!("/policy/proposals/{id}/approve"), &bob, json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("CONFLICT")), "{body}");
    assert_eq!(propose(&app, &bob, lower, v).await.0, StatusCode::CONFLICT, "base_version is stale");
    // Rejected, it stays rejected; a roll back to version 1 widens again and waits.
    let (status, body) = post(&app, &format!("/policy/proposals/{id}/reject"), &bob, json!({"reason": "stale"})).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("rejected")), "{body}");
    let (status, body) = post(&app, "/policy/rollback", &bob, json!({"version": 1, "reason": "undo"})).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::ACCEPTED, Some("pending")), "{body}");
    let (status, diff) = get(&app, "/policy/diff?from=1&to=2", &bob).await;
    assert_eq!(status, StatusCode::OK);
    assert_eq!(diff["changes"][0]["path"], "profiles.dev.autonomous_limit.KES", "{diff}");
    for bad in [
        "/policy/versions/0",
        "/policy/versions/x",
        "/policy/diff?from=1",
        "/policy/proposals?status=maybe",
        "/policy/proposals?status=",
    ] {
        assert_eq!(get(&app, bad, &bob).await.0, StatusCode::BAD_REQUEST, "{bad}");
    }
    assert_eq!(get(&app, "/policy/versions/99", &bob).await.0, StatusCode::NOT_FOUND);

    // A whole document travels in one body: 300 profiles (~100 KiB) are a proposal (300 agents
    // given an account widen), past 16 KiB, the rest of the operator API's bound; a body past 272 KiB is refused.
    let (_, now) = current(&app, &bob).await;
    let mut big = now.clone();
    let template = big["policy"]["profiles"][0].clone();
    for i in 0..300 {
        let mut p = template.clone();
        p["name"] = json!(format!("agent-{i:03}"));
        p["subjects"] = json!([format!("agent-{i:03}")]);
        p["allowed_accounts"] = json!(["acct-A"]);
        big["policy"]["profiles"].as_array_mut().unwrap().push(p);
    }
    let body = json!({"document": big, "reason": "onboard 300 agents"});
    assert!(body.to_string().len() > 64 * 1024, "{}", body.to_string().len());
    let (status, answer) = post(&app, "/policy/proposals", &bob, body).await;
    assert_eq!((status, answer["status"].as_str()), (StatusCode::ACCEPTED, Some("pending")), "{answer}");
    let huge = json!({"document": now, "reason": "x".repeat(300 * 1024)});
    let (status, answer) = post(&app, "/policy/proposals", &bob, huge).await;
    assert_eq!(
        (status, answer["error"]["code"].as_str()),
        (StatusCode::PAYLOAD_TOO_LARGE, Some("PAYLOAD_TOO_LARGE")),
        "{answer}"
    );
}

/// `paygate policy export` prints a version as config sections; `import` of the same file changes
/// nothing; an edited file that narrows applies as the next version, one that widens waits for a
/// second operator; `simulate` prints the dry run. Blocking subprocesses, off the async runtime.
#[test]
fn export_import_and_simulate_round_trip_through_the_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let paygate = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
            .args(args)
            .env("PAYGATE_STORAGE__DATA_DIR", dir.path())
            .env("PAYGATE_LOG", "error")
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, v1, err) = paygate(&["policy", "export"]);
    assert_eq!(code, Some(0), "{err}");
    assert!(v1.starts_with("# paygate policy version 1"), "{v1}");
    let file = dir.path().join("policy.toml");
    std::fs::write(&file, &v1).unwrap();
    let (code, _, err) =
        paygate(&["policy", "import", file.to_str().unwrap(), "--author", "alice", "--reason", "same"]);
    assert_eq!(code, Some(2), "the same document is no change: {err}");
    assert!(err.contains("nothing to change"), "{err}");

    let lower = v1.replace("autonomous_limit]\nKES = \"1000.00\"", "autonomous_limit]\nKES = \"400.00\"");
    assert_ne!(lower, v1, "the dev profile's limit is in the export: {v1}");
    std::fs::write(&file, &lower).unwrap();
    let (code, out, err) = paygate(&["policy", "simulate", file.to_str().unwrap()]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["replayed"], 0, "no history yet: {out}");
    let (code, out, err) =
        paygate(&["policy", "import", file.to_str().unwrap(), "--author", "alice", "--reason", "lower"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["version"], 2, "{out}");
    let (_, v2, _) = paygate(&["policy", "export"]);
    // Whoever ran it is nobody the gateway authenticated: the version is "cli"'s, the name a claim.
    assert!(
        v2.starts_with(
            "# paygate policy version 2: lower (paygate policy import; --author \"alice\", not verified) (cli)"
        ),
        "{v2}"
    );
    assert!(v2.contains("KES = \"400.00\""), "{v2}");

    std::fs::write(&file, &v1).unwrap();
    let (code, out, err) =
        paygate(&["policy", "import", file.to_str().unwrap(), "--author", "alice", "--reason", "raise"]);
    assert_eq!(code, Some(0), "{err}");
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()["status"], "pending", "{out}");
    let (_, still, _) = paygate(&["policy", "export"]);
    assert!(still.starts_with("# paygate policy version 2"), "a widening import waits: {still}");
}

/// Issue 52, item 2: two profiles name `ro-bot` (`tight` first, `wide` second). Swapping them
/// *and* lowering a number in the same proposal hands `ro-bot` the wide profile: that widens what
/// `ro-bot` may do, so one operator alone only proposes it, and the diff shows `ro-bot`'s
/// effective change, not only the number.
#[tokio::test]
async fn swapping_profiles_that_name_one_agent_and_lowering_a_number_needs_a_second_operator() {
    let dir = tempfile::tempdir().unwrap();
    let profile = |name: &str, limit: &str| {
        format!(
            "[[policy.profiles]]\nname = \"{name}\"\nsubjects = [\"ro-bot\"]\nallowed_accounts = [\"acct-A\", \"acct-B\"]\n\
             autonomous_limit = {{ KES = \"{limit}\" }}\ndaily_limit = {{ KES = \"100000.00\" }}\n\n"
        )
    };
    let toml = format!(
        "[[policy.profiles]]\nname = \"default\"\n\n{}{}",
        profile("tight", "10.00"),
        profile("wide", "5000.00")
    );
    let clock: Arc<dyn paygate::clock::Clock> = Arc::new(paygate::clock::SystemClock);
    let app = spawn_with_toml(dir.path(), &toml, &[], clock).await;
    let robot = connect(&app.url, &app.token("ro-bot", ALL_AGENT_SCOPES), Era::Modern).await;
    let (alice, bob) =
        (app.operator_token("alice", "payments:admin payments:audit"), app.operator_token("bob", "payments:admin"));
    let r = call(&robot, "create_payment", pay("before-swap", "4000.00")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "tight (10.00) is ro-bot's profile: {r:?}");

    // The attack as reproduced: swap the two, lower any number by one.
    let (v1, doc) = current(&app, &alice).await;
    let mut swapped = doc.clone();
    let profiles = swapped["policy"]["profiles"].as_array_mut().unwrap();
    let (t, w) = (
        profiles.iter().position(|p| p["name"] == "tight").unwrap(),
        profiles.iter().position(|p| p["name"] == "wide").unwrap(),
    );
    profiles.swap(t, w);
    let cpm = profiles[w]["calls_per_minute"].as_i64().unwrap();
    profiles[w]["calls_per_minute"] = json!(cpm - 1);
    let (status, body) = propose(&app, &alice, swapped.clone(), v1).await;
    assert_eq!(
        (status, body["status"].as_str(), body["widens"].as_bool()),
        (StatusCode::ACCEPTED, Some("pending"), Some(true)),
        "{body}"
    );
    // What it does to ro-bot is named: tight → wide, its autonomous limit raised.
    let robot_change = body["authority"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["principal"]["subject"] == "ro-bot")
        .unwrap_or_else(|| panic!("ro-bot's effective change: {body}"))
        .clone();
    assert_eq!(
        (robot_change["before"].as_str(), robot_change["after"].as_str()),
        (Some("tight"), Some("wide")),
        "{robot_change}"
    );
    assert!(
        robot_change["dimensions"]
            .as_array()
            .unwrap()
            .iter()
            .any(|d| d["path"] == "autonomous_limit.KES" && d["widens"] == true),
        "{robot_change}"
    );
    let r = call(&robot, "create_payment", pay("after-swap-alone", "4000.00")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "one operator changed nothing for ro-bot: {r:?}");
    assert_eq!(current(&app, &alice).await.0, v1, "nothing applied");
    let id = body["proposal_id"].as_str().unwrap().to_string();
    let (status, body) = post(&app, &format!("/policy/proposals/{id}/approve"), &alice, json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("SELF_REVIEW")), "{body}");

    // The same swap alone (nothing else changed) is the same widening.
    let mut swap_only = doc.clone();
    swap_only["policy"]["profiles"].as_array_mut().unwrap().swap(t, w);
    let (status, body) = propose(&app, &alice, swap_only, v1).await;
    assert_eq!((status, body["widens"].as_bool()), (StatusCode::ACCEPTED, Some(true)), "{body}");

    // With bob, it applies; the diff route shows ro-bot's effective change.
    let (status, body) = post(&app, &format!("/policy/proposals/{id}/approve"), &bob, json!({})).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("applied")), "{body}");
    let (status, diff) = get(&app, &format!("/policy/diff?from={v1}&to={}", v1 + 1), &alice).await;
    assert_eq!(status, StatusCode::OK, "{diff}");
    assert!(
        diff["authority"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["principal"]["subject"] == "ro-bot" && c["widens"] == true),
        "{diff}"
    );
    assert_eq!(diff["widens"], true, "{diff}");
    let r = call(&robot, "create_payment", pay("after-two", "4000.00")).await;
    assert_eq!(ok(&r)["status"], "succeeded", "{r:?}");

    // Swapping back (to tight) narrows ro-bot: one operator.
    let (v, now) = current(&app, &alice).await;
    let mut back = now.clone();
    back["policy"]["profiles"].as_array_mut().unwrap().swap(t, w);
    let (status, body) = propose(&app, &alice, back, v).await;
    assert_eq!(
        (status, body["status"].as_str(), body["widens"].as_bool()),
        (StatusCode::OK, Some("applied"), Some(false)),
        "{body}"
    );
    app.stop().await;
}

fn file_policy(limit: &str) -> String {
    format!(
        "[[policy.profiles]]\nname = \"default\"\n\n[[policy.profiles]]\nname = \"dev\"\ndev_key_only = true\n\
         subjects = [\"dev-agent\"]\nallowed_accounts = [\"acct-A\", \"acct-B\"]\nautonomous_limit = {{ KES = \"{limit}\" }}\n\
         daily_limit = {{ KES = \"100000.00\" }}\n"
    )
}

fn limit_in_force(app: &TestApp) -> (i64, Option<String>) {
    let policy = app.running.gateway.policy();
    let profile = policy.profiles.resolve(DEV_ISSUER, "dev-agent", None, None);
    (policy.version, profile.limit_decimal(paygate::domain::money::Currency::parse("KES").unwrap()))
}

/// The config file is the baseline (version 1 of an empty store); after that a file that differs
/// from the version in force is never applied silently: one that only narrows, while no operator
/// has changed the policy since the file last set it, is the next version; anything else — one
/// that widens, or any edit once an operator has changed the policy — waits as a proposal by
/// "config-file", which no operator can apply alone when it widens (the first adopts it, a
/// second, distinct one approves).
#[tokio::test]
async fn a_restart_with_a_wider_config_file_applies_nothing_until_two_operators_approve() {
    wider_file_at_restart(&[]).await;
}

/// The same on PostgreSQL (`PAYGATE_TEST_DATABASE_URL`): proposals, adoption and approval are the
/// store's, and both engines keep them alike.
#[tokio::test]
async fn a_restart_with_a_wider_config_file_applies_nothing_until_two_operators_approve_on_postgres() {
    let Some(db) = database("policy: a wider config file at restart") else { return };
    wider_file_at_restart(&[("PAYGATE_STORAGE__URL", &db.url), ("PAYGATE_STORAGE__POSTGRES_SCHEMA", &db.schema)]).await;
}

async fn wider_file_at_restart(store: &[(&str, &str)]) {
    let dir = tempfile::tempdir().unwrap();
    let clock: Arc<dyn paygate::clock::Clock> = Arc::new(paygate::clock::SystemClock);
    let app = spawn_with_toml(dir.path(), &file_policy("100.00"), store, clock.clone()).await;
    assert_eq!(limit_in_force(&app), (1, Some("100.00".into())), "the file is the baseline");
    app.stop().await;
    // Nobody has changed it; the edited file raises the limit: no second pair of eyes, not applied.
    let app = spawn_with_toml(dir.path(), &file_policy("5000.00"), store, clock.clone()).await;
    assert_eq!(limit_in_force(&app), (1, Some("100.00".into())), "a wider file waits");
    let alice = app.operator_token("alice", "payments:admin payments:audit");
    let (_, pending) = get(&app, "/policy/proposals?status=pending", &alice).await;
    let items = pending["items"].as_array().unwrap();
    assert_eq!(items.len(), 1, "{pending}");
    assert_eq!(
        (items[0]["author"].as_str(), items[0]["widens"].as_bool()),
        (Some("config-file"), Some(true)),
        "{pending}"
    );
    app.stop().await;
    // Started again with the same file: still waiting, no second proposal.
    let app = spawn_with_toml(dir.path(), &file_policy("5000.00"), store, clock.clone()).await;
    assert_eq!(limit_in_force(&app), (1, Some("100.00".into())));
    let (alice, bob) =
        (app.operator_token("alice", "payments:admin payments:audit"), app.operator_token("bob", "payments:admin"));
    let (_, pending) = get(&app, "/policy/proposals?status=pending", &alice).await;
    let items = pending["items"].as_array().unwrap().clone();
    assert_eq!(items.len(), 1, "{pending}");
    let id = items[0]["proposal_id"].as_str().unwrap().to_string();
    // One operator's approval only adopts it: they become its author, a second must approve.
    let (status, body) = post(&app, &format!("/policy/proposals/{id}/approve"), &alice, json!({})).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::ACCEPTED, Some("pending")), "{body}");
    assert_eq!(limit_in_force(&app), (1, Some("100.00".into())), "one operator applied nothing");
    let adopted = body["proposal_id"].as_str().unwrap().to_string();
    assert_ne!(adopted, id);
    let (status, body) = post(&app, &format!("/policy/proposals/{adopted}/approve"), &alice, json!({})).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("SELF_REVIEW")), "{body}");
    let (status, body) = post(&app, &format!("/policy/proposals/{adopted}/approve"), &bob, json!({})).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("applied")), "{body}");
    assert_eq!(limit_in_force(&app), (2, Some("5000.00".into())));
    app.stop().await;
    // The file now matches: nothing to do. A narrower file after an operator's change waits too
    // (it would silently undo what two operators approved); the store's version stands.
    let app = spawn_with_toml(dir.path(), &file_policy("5000.00"), store, clock.clone()).await;
    assert_eq!(limit_in_force(&app), (2, Some("5000.00".into())));
    app.stop().await;
    let app = spawn_with_toml(dir.path(), &file_policy("50.00"), store, clock.clone()).await;
    assert_eq!(limit_in_force(&app), (2, Some("5000.00".into())), "the operators' version stands");
    let (alice, bob) =
        (app.operator_token("alice", "payments:admin payments:audit"), app.operator_token("bob", "payments:admin"));
    let (_, pending) = get(&app, "/policy/proposals?status=pending", &alice).await;
    let items = pending["items"].as_array().unwrap();
    assert_eq!((items.len(), items[0]["widens"].as_bool()), (1, Some(false)), "{pending}");
    // A narrowing one needs one operator: approved, it applies.
    let id = items[0]["proposal_id"].as_str().unwrap();
    let (status, body) = post(&app, &format!("/policy/proposals/{id}/approve"), &bob, json!({})).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("applied")), "{body}");
    assert_eq!(limit_in_force(&app), (3, Some("50.00".into())));
    app.stop().await;
    // Two different files on the same version are two questions: the second is its own proposal,
    // not taken for the first one still waiting.
    for (n, limit) in [(1, "6000.00"), (2, "7000.00")] {
        let app = spawn_with_toml(dir.path(), &file_policy(limit), store, clock.clone()).await;
        assert_eq!(limit_in_force(&app), (3, Some("50.00".into())));
        let alice = app.operator_token("alice", "payments:admin payments:audit");
        let (_, pending) = get(&app, "/policy/proposals?status=pending", &alice).await;
        let items = pending["items"].as_array().unwrap();
        assert_eq!(items.len(), n, "{limit}: {pending}");
        assert!(items.iter().all(|p| p["author"] == "config-file"), "{pending}");
        app.stop().await;
    }
}

/// With no operator change since, a file that only narrows is the next version at start.
#[tokio::test]
async fn a_restart_with_a_narrower_config_file_applies_it_as_the_next_version() {
    let dir = tempfile::tempdir().unwrap();
    let clock: Arc<dyn paygate::clock::Clock> = Arc::new(paygate::clock::SystemClock);
    let app = spawn_with_toml(dir.path(), &file_policy("100.00"), &[], clock.clone()).await;
    assert_eq!(limit_in_force(&app), (1, Some("100.00".into())));
    app.stop().await;
    let app = spawn_with_toml(dir.path(), &file_policy("40.00"), &[], clock.clone()).await;
    assert_eq!(limit_in_force(&app), (2, Some("40.00".into())));
    app.stop().await;
}

/// `policy import --author` is not taken on trust: whoever runs the command is nobody the gateway
/// authenticated. A widening import is a proposal by "cli" (the claimed name only in its reason);
/// an operator over the API cannot apply it alone — not even one whose name the import claimed.
#[tokio::test]
async fn an_import_naming_an_author_is_not_that_operators_word() {
    let dir = tempfile::tempdir().unwrap();
    let paygate = |args: &[&str]| {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
            .args(args)
            .env("PAYGATE_STORAGE__DATA_DIR", dir.path())
            .env("PAYGATE_LOG", "error")
            .current_dir(dir.path())
            .output()
            .unwrap();
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).to_string(),
            String::from_utf8_lossy(&out.stderr).to_string(),
        )
    };
    let (code, v1, err) = paygate(&["policy", "export"]);
    assert_eq!(code, Some(0), "{err}");
    let raise = v1.replace("autonomous_limit]\nKES = \"1000.00\"", "autonomous_limit]\nKES = \"9000.00\"");
    assert_ne!(raise, v1, "{v1}");
    let file = dir.path().join("policy.toml");
    std::fs::write(&file, &raise).unwrap();
    // Bob, at a shell, claims alice wrote it; then approves it over the API as himself.
    let (code, out, err) =
        paygate(&["policy", "import", file.to_str().unwrap(), "--author", "alice", "--reason", "raise"]);
    assert_eq!(code, Some(0), "{err}");
    let outcome: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(outcome["status"], "pending", "{out}");
    let id = outcome["proposal_id"].as_str().unwrap().to_string();

    let app = spawn_on(dir.path(), &[]).await;
    let (bob, carol) =
        (app.operator_token("bob", "payments:admin payments:audit"), app.operator_token("carol", "payments:admin"));
    let (_, p) = get(&app, &format!("/policy/proposals/{id}"), &bob).await;
    assert_eq!(p["author"], "cli", "the claimed author is not the author: {p}");
    assert!(p["reason"].as_str().unwrap().contains("alice"), "the claim is kept, as a claim: {p}");
    let (status, body) = post(&app, &format!("/policy/proposals/{id}/approve"), &bob, json!({})).await;
    assert_eq!(
        (status, body["status"].as_str()),
        (StatusCode::ACCEPTED, Some("pending")),
        "bob alone applies nothing: {body}"
    );
    assert_eq!(current(&app, &bob).await.0, 1);
    let adopted = body["proposal_id"].as_str().unwrap().to_string();
    let (status, body) = post(&app, &format!("/policy/proposals/{adopted}/approve"), &carol, json!({})).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("applied")), "{body}");
    assert_eq!(current(&app, &bob).await.0, 2);
    app.stop().await;
}

/// Another replica appending between this one's read of the newest version and its own append
/// (played here by a trigger that writes the rival version first, as the other replica's insert
/// would, and drops this one's): the change is refused as stale, naming the version that won,
/// and nothing of it is in force.
#[tokio::test]
async fn a_change_that_loses_the_append_to_another_replica_is_refused_naming_the_newest_version() {
    let (app, dir) = spawn_app().await;
    let alice = app.operator_token("alice", "payments:admin");
    let (v, doc) = current(&app, &alice).await;
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    db.execute_batch(
        "CREATE TRIGGER another_replica BEFORE INSERT ON policy_versions WHEN NEW.reason = 'test change' BEGIN
           INSERT INTO policy_versions (version, document, author_iss, author_sub, reason, approver_iss,
             approver_sub, proposal_id, created_at, tag)
           VALUES (NEW.version, NEW.document, NEW.author_iss, 'bob', 'the other replica', '', '', NULL,
             NEW.created_at, NEW.tag);
           SELECT RAISE(IGNORE);
         END;",
    )
    .unwrap();
    let (status, body) = propose(&app, &alice, with_dev(doc, "autonomous_limit", json!({"KES": "500.00"})), v).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("CONFLICT")), "{body}");
    let message = body["error"]["message"].as_str().unwrap();
    let expected = format!("the policy changed since version {v} (version {} is the newest)", v + 1);
    assert!(message.contains(&expected), "{message}");
    let author: String =
        db.query_row("SELECT author_sub FROM policy_versions WHERE version = ?1", [v + 1], |r| r.get(0)).unwrap();
    assert_eq!(author, "bob", "the other replica's version stands");
    app.stop().await;
}

/// The preflight of a refund answers what the ledger would: everything still refundable is
/// allowed, a cent more is not — and it says how much is left. Nothing is written.
#[tokio::test]
async fn a_refund_preflight_allows_exactly_what_is_left() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let paid = ok(&call(&agent, "create_payment", pay("refundable-1", "10.00")).await).clone();
    let id = paid["payment_id"].as_str().unwrap().to_string();
    let part = json!({"operation_id": "refund-part", "payment_id": id, "amount": "4.00"});
    assert_eq!(ok(&call(&agent, "refund_payment", part).await)["status"], "succeeded");
    let ask = |amount: &str| {
        json!({"tool": "refund_payment",
               "arguments": {"operation_id": format!("probe-{amount}"), "payment_id": id, "amount": amount}})
    };
    let exact = call(&agent, "check_payment_policy", ask("6.00")).await;
    assert_eq!(ok(&exact)["verdict"], "allowed", "{exact:?}");
    let over = call(&agent, "check_payment_policy", ask("6.01")).await;
    let said = format!("{over:?}");
    assert!(said.contains("6.00 left to refund"), "{said}");
    assert_eq!(balance(&agent, "acct-B").await, "6.00", "nothing was written by the preflight");
    app.stop().await;
}
