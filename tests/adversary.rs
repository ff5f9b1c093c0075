//! The adversarial suite: each test plays the attacker against one promise SECURITY.md makes
//! (its "Guarantees" table names the test), through the real server's routes, and asserts both that
//! the attack is refused and that nothing changed. The hostile review of issue 52 found each hole
//! here on the release binary; every test failed on the code before its fix.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;

use common::*;
use paygate::clock::{Clock, SystemClock};
use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

/// Every scope the gateway knows, agent's and operator's alike.
const EVERY_SCOPE: &str = "payments:read payments:create payments:refund payments:collect payments:payout \
                           payments:integrity payments:approve payments:audit payments:admin payments:confirm";

const AGENT_SCOPES: &str = "payments:read payments:create payments:refund";

fn pay(op: &str, amount: &str, memo: &str) -> Value {
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount,
           "currency": "KES", "memo": memo})
}

/// One agent (`x-bot`) serving two people over shared accounts; alice is also an operator.
const SHARED_AGENT: &str = r#"
[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "x"
subjects = ["x-bot"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "100000.00" }
daily_payments_max = 1000
calls_per_minute = 10000
"#;

// ---- delegation isolation ------------------------------------------------------------------------

/// Finding 4: one agent acting for bob read alice's payment (user, amount, memo) and refunded it,
/// and a refund of alice's mandated payment went to bob's confirmation. Now a payment made for
/// alice does not exist for the agent acting for bob, whatever accounts they share: every read,
/// the listing, the summary, the receipt, the refund and its preflight.
#[tokio::test]
async fn an_agent_acting_for_bob_cannot_see_or_refund_alices_payments() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(dir.path(), SHARED_AGENT, &[], Arc::new(SystemClock)).await;
    let for_alice = connect(&app.url, &app.delegated_token("alice", "x-bot", AGENT_SCOPES), Era::Modern).await;
    let for_bob = connect(&app.url, &app.delegated_token("bob", "x-bot", AGENT_SCOPES), Era::Legacy).await;

    let alices = ok(&call(&for_alice, "create_payment", pay("rent", "400.00", "alice's rent")).await).clone();
    let id = alices["payment_id"].as_str().unwrap().to_string();
    let bobs = ok(&call(&for_bob, "create_payment", pay("lunch", "7.00", "bob's lunch")).await).clone();

    // Reads: NOT_FOUND, exactly as for an id that does not exist.
    for (tool, args) in [
        ("get_payment", json!({"payment_id": id})),
        ("check_transaction_status", json!({"payment_id": id})),
        ("generate_receipt", json!({"payment_id": id})),
    ] {
        assert_eq!(code(&call(&for_bob, tool, args).await), "NOT_FOUND", "{tool}");
    }
    // Listings and the summary: bob's payments alone.
    for tool in ["list_payments", "get_today_transactions"] {
        let listed = ok(&call(&for_bob, tool, json!({})).await).clone();
        let text = listed.to_string();
        assert!(!text.contains(&id) && !text.contains("alice"), "{tool}: {listed}");
        assert!(text.contains(bobs["payment_id"].as_str().unwrap()), "{tool} lists bob's own: {listed}");
    }
    let summary = ok(&call(&for_bob, "get_today_summary", json!({})).await).to_string();
    assert!(!summary.contains("400.00") && summary.contains("7.00"), "{summary}");
    // The refund and its preflight: NOT_FOUND; nothing moved, no approval asked of anyone.
    let before = balance(&for_alice, "acct-A").await;
    let refund = json!({"operation_id": "steal", "payment_id": id, "amount": "400.00"});
    assert_eq!(code(&call(&for_bob, "refund_payment", refund.clone()).await), "NOT_FOUND");
    let preflight =
        call(&for_bob, "check_payment_policy", json!({"tool": "refund_payment", "arguments": refund})).await;
    assert_eq!(ok(&preflight)["code"], "NOT_FOUND", "{preflight:?}");
    assert_eq!(balance(&for_alice, "acct-A").await, before, "nothing refunded");
    let auditor = app.operator_token("auditor", "payments:audit");
    let (_, approvals) = operator(&app, Method::GET, "/operator/v1/approvals", &auditor, None).await;
    assert_eq!(approvals["items"].as_array().map(Vec::len), Some(0), "{approvals}");

    // The same agent on its own token is another principal: alice's payment is not its either (it
    // would walk around a suspension of the pair (alice, x-bot)); its own payments it sees.
    let org = connect(&app.url, &app.token("x-bot", AGENT_SCOPES), Era::Modern).await;
    assert_eq!(code(&call(&org, "get_payment", json!({"payment_id": id})).await), "NOT_FOUND");
    let refund = json!({"operation_id": "org-refund", "payment_id": id, "amount": "1.00"});
    assert_eq!(code(&call(&org, "refund_payment", refund).await), "NOT_FOUND");
    let own = ok(&call(&org, "create_payment", pay("org-own", "3.00", "the agent's own")).await).clone();
    let listed = ok(&call(&org, "list_payments", json!({})).await).to_string();
    assert!(listed.contains(own["payment_id"].as_str().unwrap()) && !listed.contains(&id), "{listed}");
    // Alice's own agent still sees and refunds it.
    assert_eq!(ok(&call(&for_alice, "get_payment", json!({"payment_id": id})).await)["user"], "alice");
    let refund = json!({"operation_id": "mine", "payment_id": id, "amount": "400.00"});
    assert_eq!(ok(&call(&for_alice, "refund_payment", refund).await)["status"], "succeeded");
    for c in [for_alice, for_bob, org] {
        let _ = c.cancel().await;
    }
    app.assert_integrity().await;
    app.stop().await;
}

// ---- no principal acts on itself ----------------------------------------------------------------

/// Finding 5: alice (an admin) resumed her own agent by leaving `?user=` off: a resume without a
/// user lifts every suspension of the agent, her pair's included. Now that is acting on herself.
#[tokio::test]
async fn a_person_cannot_resume_the_agent_acting_for_them_by_leaving_the_user_off() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(dir.path(), SHARED_AGENT, &[], Arc::new(SystemClock)).await;
    let colleague = app.operator_token("ops-root", "payments:admin");
    let alice = app.operator_token("alice", "payments:admin");
    let for_alice = connect(&app.url, &app.delegated_token("alice", "x-bot", AGENT_SCOPES), Era::Modern).await;
    let (status, body) = operator(
        &app,
        Method::POST,
        "/principals/x-bot/suspend?user=alice",
        &colleague,
        Some(json!({"reason": "alice's agent misbehaved"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    for path in
        ["/principals/x-bot/resume", "/operator/v1/principals/x-bot/resume", "/principals/x-bot/resume?user=alice"]
    {
        let (status, body) = operator(&app, Method::POST, path, &alice, Some(json!({}))).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{path}: {body}");
        assert_eq!(body["error"]["code"], "SELF_REVIEW", "{path}: {body}");
    }
    let r = call(&for_alice, "get_balance", json!({"account_id": "acct-A"})).await;
    assert_eq!(code(&r), "PRINCIPAL_SUSPENDED", "still suspended");
    // A colleague may; then alice may resume an agent that is not hers to act on (no pair of hers).
    let (status, _) = operator(&app, Method::POST, "/principals/x-bot/resume", &colleague, None).await;
    assert_eq!(status, StatusCode::OK);
    ok(&call(&for_alice, "get_balance", json!({"account_id": "acct-A"})).await);
    let _ = for_alice.cancel().await;
    app.stop().await;
}

/// Finding 6: a person who is also an operator made a payee known for their own agent, which then
/// paid it alone. A known payee is pre-authorization by another name: refused for oneself.
#[tokio::test]
async fn a_person_cannot_add_a_payee_for_the_agent_acting_for_them() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(dir.path(), SHARED_AGENT, &[], Arc::new(SystemClock)).await;
    let alice = app.operator_token("alice", "payments:approve payments:audit");
    for body in [
        json!({"agent_subject": "x-bot", "user": "alice", "payee": "acct-B", "reason": "mine"}),
        json!({"agent_subject": "alice", "payee": "acct-B", "reason": "me"}),
    ] {
        let (status, answer) = operator(&app, Method::POST, "/operator/v1/payees", &alice, Some(body.clone())).await;
        assert_eq!(status, StatusCode::FORBIDDEN, "{body}: {answer}");
        assert_eq!(answer["error"]["code"], "SELF_REVIEW", "{answer}");
    }
    let (_, listed) = operator(&app, Method::GET, "/operator/v1/payees?agent=x-bot&user=alice", &alice, None).await;
    assert_eq!(listed["items"].as_array().map(Vec::len), Some(0), "nothing recorded: {listed}");
    // A colleague may.
    let carol = app.operator_token("carol", "payments:approve");
    let body = json!({"agent_subject": "x-bot", "user": "alice", "payee": "acct-B", "reason": "supplier"});
    let (status, answer) = operator(&app, Method::POST, "/operator/v1/payees", &carol, Some(body)).await;
    assert_eq!(status, StatusCode::OK, "{answer}");
    app.stop().await;
}

// ---- the operator resource, every route of it ---------------------------------------------------

/// Path parameters filled with values of the right shape.
fn fill(path: &str, approval: &str) -> String {
    path.replace("{id}", approval)
        .replace("{approval_id}", approval)
        .replace("{subject}", "dev-agent")
        .replace("{payment_id}", "pay_01a00000000000000000000000000000")
        .replace("{mandate_id}", "mdt_anything")
        .replace("{credential_id}", "AAAA")
        .replace("{message_id}", "msg_anything")
        .replace("{proposal_id}", "prop_anything")
        .replace("{version}", "1")
}

/// Route coverage from the router itself (`paygate::http::operator_routes`, the one table the
/// router is built from): an agent-audience token carrying every scope, an operator-audience token
/// acting for someone (`act`), a token the dev key did not sign and no token at all are refused by
/// every operator route, and nothing changes. A route added later is walked without editing this.
#[tokio::test]
async fn no_agent_token_reaches_any_operator_route_the_router_serves() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let r = call(&agent, "create_payment", pay("over", "5000.00", "big")).await;
    let approval = err(&r)["approval_id"].as_str().unwrap().to_string();

    let routes = paygate::http::operator_routes();
    assert!(routes.len() >= 49, "the operator resource serves {} routes", routes.len());
    let agent_all = app.token("dev-agent", EVERY_SCOPE);
    let acting =
        app.running.mint(paygate::auth::Audience::Operator, "pat", Some("dev-agent"), EVERY_SCOPE, 600).unwrap();
    let forged = {
        // The dev token with its signature's last characters changed.
        let mut t = app.operator_token("ops", EVERY_SCOPE);
        t.truncate(t.len() - 4);
        t.push_str("AAAA");
        t
    };
    let body = json!({"reason": "an agent tries", "subject": "dev-agent", "kind": "closed", "currency": "KES",
                      "payer": "acct-A", "payee": "acct-B", "amount": "1.00", "agent_subject": "dev-agent",
                      "document": {}, "base_version": 1});
    paygate::install_crypto_provider();
    let http = reqwest::Client::new();
    let mut walked = 0;
    for (method, template) in &routes {
        let path = fill(template, &approval);
        for (who, token) in
            [("agent", Some(&agent_all)), ("acting", Some(&acting)), ("forged", Some(&forged)), ("none", None)]
        {
            let mut req = http.request(method.clone(), format!("{}{path}", app.base()));
            if let Some(t) = token {
                req = req.bearer_auth(t);
            }
            if *method == Method::POST {
                req = req.json(&body);
            }
            let resp = req.send().await.unwrap();
            assert_eq!(resp.status(), StatusCode::UNAUTHORIZED, "{who} token on {method} {template}");
            assert!(resp.headers().contains_key("www-authenticate"), "{who} on {method} {template}: a challenge");
        }
        walked += 1;
    }
    assert_eq!(walked, routes.len());
    // Nothing changed: the approval still pending, nobody suspended, the policy at version 1.
    let auditor = app.operator_token("auditor", "payments:audit");
    let (_, a) = operator(&app, Method::GET, &format!("/operator/v1/approvals/{approval}"), &auditor, None).await;
    assert_eq!(a["status"], "pending", "{a}");
    let (_, agents) = operator(&app, Method::GET, "/operator/v1/principals", &auditor, None).await;
    assert!(agents["items"].as_array().unwrap().iter().all(|p| p["suspended"] == false), "{agents}");
    let (_, policy) = operator(&app, Method::GET, "/operator/v1/policy", &auditor, None).await;
    assert_eq!(policy["version"], 1, "{policy}");
    let _ = agent.cancel().await;
    app.stop().await;
}

// ---- approvals ----------------------------------------------------------------------------------

/// pat's agent with a user tier: pat confirms up to KES 10,000 themselves.
const USER_TIER: &str = r#"
[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "pat"
users = ["pat"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "100.00" }
daily_limit = { KES = "1000000.00" }
daily_payments_max = 1000
calls_per_minute = 10000
approvals_by = "user"
user_approval_max = { KES = "10000.00" }
"#;

/// Finding 9: narrowing a profile during an incident (operators decide, with a passkey) did not
/// reach approvals already pending: pat still confirmed with a click. A pending approval is judged
/// at decision time by the stricter of the policy it was created under and the policy in force.
#[tokio::test]
async fn narrowing_policy_reaches_approvals_already_pending() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_with_toml(dir.path(), USER_TIER, &[], Arc::new(SystemClock)).await;
    let agent = connect(&app.url, &app.delegated_token("pat", "bot", AGENT_SCOPES), Era::Modern).await;
    let r = call(&agent, "create_payment", pay("incident", "5000.00", "during the incident")).await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED", "{r:?}");
    assert_eq!(err(&r)["approver"], "user");
    let approval = err(&r)["approval_id"].as_str().unwrap().to_string();

    // The incident: operators take the tier back and want passkeys.
    let alice = app.operator_token("alice", "payments:admin payments:audit");
    let (_, current) = operator(&app, Method::GET, "/operator/v1/policy", &alice, None).await;
    let (version, mut doc) = (current["version"].as_i64().unwrap(), current["document"].clone());
    let pat = doc["policy"]["profiles"].as_array_mut().unwrap().iter_mut().find(|p| p["name"] == "pat").unwrap();
    pat["approvals_by"] = json!("operator");
    pat["user_approval_max"] = json!({});
    pat["passkey_required"] = json!(true);
    let proposal = json!({"document": doc, "reason": "incident", "base_version": version});
    let (status, body) = operator(&app, Method::POST, "/operator/v1/policy/proposals", &alice, Some(proposal)).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("applied")), "{body}");

    // pat's click is refused; the page says an operator decides.
    let confirm = app.operator_token("pat", "payments:confirm");
    let path = format!("/operator/v1/confirmations/{approval}");
    let (status, view) = operator(&app, Method::GET, &path, &confirm, None).await;
    assert_eq!((status, view["approver"].as_str()), (StatusCode::OK, Some("operator")), "{view}");
    let (status, body) = operator(&app, Method::POST, &format!("{path}/approve"), &confirm, Some(json!({}))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "NOT_USER_APPROVABLE", "{body}");
    // An operator's plain click is refused too: a passkey is required now.
    let carol = app.operator_token("carol", "payments:approve");
    let (status, body) = operator(
        &app,
        Method::POST,
        &format!("/operator/v1/approvals/{approval}/approve"),
        &carol,
        Some(json!({"reason": "ok"})),
    )
    .await;
    assert_eq!(body["error"]["code"], "PASSKEY_REQUIRED", "{status} {body}");
    let (_, view) = operator(&app, Method::GET, &format!("/operator/v1/approvals/{approval}"), &alice, None).await;
    assert_eq!((view["status"].as_str(), view["passkey_required"].as_bool()), (Some("pending"), Some(true)), "{view}");
    // The listing the console reads says so too (else its page would not ask for the passkey).
    let (_, listed) = operator(&app, Method::GET, "/operator/v1/approvals?status=pending", &alice, None).await;
    let item = listed["items"].as_array().unwrap().iter().find(|a| a["approval_id"] == approval.as_str()).cloned();
    assert_eq!(
        item.map(|a| (a["passkey_required"].clone(), a["approver"].clone())),
        Some((json!(true), json!("operator"))),
        "{listed}"
    );
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The stop-67 review (high): a trigger rewriting each approval review's subject as it was written
/// let one person grant a two-person approval by approving twice (the mandate named a "ghost"),
/// and one deleting each review let an approval be granted with nobody on record. A review is read
/// back in its transaction now: rewritten or missing, it decides nothing.
#[tokio::test]
async fn a_review_a_trigger_rewrites_or_deletes_decides_nothing() {
    let rewrite = "CREATE TRIGGER t AFTER INSERT ON approval_reviews BEGIN UPDATE approval_reviews \
                   SET reviewer_sub = 'ghost-' || (SELECT count(*) FROM approval_reviews) WHERE rowid = new.rowid; END;";
    let delete = "CREATE TRIGGER t AFTER INSERT ON approval_reviews BEGIN \
                  DELETE FROM approval_reviews WHERE rowid = new.rowid; END;";
    for (name, trigger) in [("rewrite", rewrite), ("delete", delete)] {
        let dir = tempfile::tempdir().unwrap();
        let app = spawn_on(dir.path(), &[("PAYGATE_APPROVALS__REVIEWERS_REQUIRED", "2")]).await;
        let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
        let r = call(&agent, "create_payment", pay("four-eyes", "5000.00", "supplier")).await;
        assert_eq!(code(&r), "APPROVAL_REQUIRED", "{name}: {r:?}");
        let approval = err(&r)["approval_id"].as_str().unwrap().to_string();
        store_db(dir.path()).execute_batch(trigger).unwrap();
        for _ in 0..2 {
            let (status, body) = approve(&app, &approval, "alice").await;
            assert!(status.is_server_error(), "{name}: {status} {body}");
        }
        let auditor = app.operator_token("auditor", "payments:audit");
        let path = format!("/operator/v1/approvals/{approval}");
        let (_, view) = operator(&app, Method::GET, &path, &auditor, None).await;
        assert_eq!((view["status"].as_str(), view["mandate_id"].as_str()), (Some("pending"), None), "{name}: {view}");
        let again = call(&agent, "create_payment", pay("four-eyes", "5000.00", "supplier")).await;
        assert_eq!(code(&again), "APPROVAL_REQUIRED", "{name}: nothing moves: {again:?}");
        let _ = agent.cancel().await;
        app.stop().await;
    }
}

/// The second stop-67 review (high): alice's first review rewritten to a "ghost" after it was
/// written — by hand, or by a trigger her approval's own audit record fires, after the decision
/// committed — let her second approval count as a second person (the mandate named the ghost,
/// money moved). The trail's record of her first decision stands: her second is refused.
#[tokio::test]
async fn one_person_rewritten_out_of_their_review_still_decides_once() {
    let on_the_trail = "CREATE TRIGGER g AFTER INSERT ON audit_records WHEN NEW.tool = 'approvals.approve' BEGIN \
                        UPDATE approval_reviews SET reviewer_sub = 'ghost-' || NEW.seq \
                        WHERE approval_id = NEW.approval_id AND reviewer_sub = NEW.principal_sub; END;";
    for (name, trigger) in [("by hand", None), ("by a trigger on the trail", Some(on_the_trail))] {
        let dir = tempfile::tempdir().unwrap();
        let app = spawn_on(dir.path(), &[("PAYGATE_APPROVALS__REVIEWERS_REQUIRED", "2")]).await;
        let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
        let r = call(&agent, "create_payment", pay("ghost", "5000.00", "supplier")).await;
        let approval = err(&r)["approval_id"].as_str().unwrap().to_string();
        let db = store_db(dir.path());
        if let Some(t) = trigger {
            db.execute_batch(t).unwrap();
        }
        let (status, body) = approve(&app, &approval, "alice").await;
        if trigger.is_some() {
            // Her record is written in the review's transaction, before the read-back: what the
            // trigger it fires does is read back too, and the review is not recorded at all.
            assert!(status.is_server_error(), "{name}: {status} {body}");
            let reviews: i64 = db
                .query_row("SELECT count(*) FROM approval_reviews WHERE approval_id = ?1", [&approval], |r| r.get(0))
                .unwrap();
            assert_eq!(reviews, 0, "{name}");
        } else {
            assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("pending")), "{name}: {body}");
            let sql = "UPDATE approval_reviews SET reviewer_sub = 'ghost' WHERE approval_id = ?1";
            assert_eq!(db.execute(sql, [&approval]).unwrap(), 1);
            let (status, body) = approve(&app, &approval, "alice").await;
            assert_eq!(
                (status, body["error"]["code"].as_str()),
                (StatusCode::CONFLICT, Some("CONFLICT")),
                "{name}: {body}"
            );
        }
        let auditor = app.operator_token("auditor", "payments:audit");
        let path = format!("/operator/v1/approvals/{approval}");
        let (_, view) = operator(&app, Method::GET, &path, &auditor, None).await;
        assert_eq!((view["status"].as_str(), view["mandate_id"].as_str()), (Some("pending"), None), "{name}: {view}");
        let _ = agent.cancel().await;
        app.stop().await;
    }
}

/// The second stop-67 review (medium-high): a review row a database writer inserted counted as a
/// person, and so did a copy of a real one. Reviews carry the gateway's tag now: an approval
/// holding a row that does not hold it, or one person twice, is decided no further.
#[tokio::test]
async fn a_review_written_outside_the_gateway_decides_nothing() {
    for case in ["inserted", "copied"] {
        let dir = tempfile::tempdir().unwrap();
        // Inserted: alice, the fake bob and carol would be three of three. Copied: alice's review of
        // another approval, and carol, would be two of two.
        let required = if case == "inserted" { "3" } else { "2" };
        let reviewers =
            [("PAYGATE_APPROVALS__REVIEWERS_REQUIRED", required), ("PAYGATE_APPROVALS__HIGH_RISK_REVIEWERS", "3")];
        let app = spawn_on(dir.path(), &reviewers).await;
        let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
        let r = call(&agent, "create_payment", pay(case, "5000.00", "supplier")).await;
        let approval = err(&r)["approval_id"].as_str().unwrap().to_string();
        let db = store_db(dir.path());
        let copy = "INSERT INTO approval_reviews (approval_id, reviewer_iss, reviewer_sub, decision, reason, at, passkey, tag)
                    SELECT ?2, reviewer_iss, ?3, decision, reason, at, passkey, ?4 FROM approval_reviews WHERE approval_id = ?1";
        let wrote = if case == "inserted" {
            let (status, body) = approve(&app, &approval, "alice").await;
            assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("pending")), "{case}: {body}");
            // A second person nobody was: the row names "bob" and carries no tag of the gateway's.
            db.execute(copy, rusqlite::params![approval, approval, "bob", None::<String>]).unwrap()
        } else {
            // Alice's review of another approval, tag and all.
            let r = call(&agent, "create_payment", pay("elsewhere", "6000.00", "supplier")).await;
            let other = err(&r)["approval_id"].as_str().unwrap().to_string();
            let (status, body) = approve(&app, &other, "alice").await;
            assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("pending")), "{case}: {body}");
            let sql = copy.replace("?4", "tag");
            db.execute(&sql, rusqlite::params![other, approval, "alice"]).unwrap()
        };
        assert_eq!(wrote, 1, "{case}");
        // Carol's approval would complete the count: it is refused, and nothing is issued.
        let (status, body) = approve(&app, &approval, "carol").await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::CONFLICT, Some("CONFLICT")),
            "{case}: {body}"
        );
        assert!(body["error"]["message"].as_str().unwrap().contains("altered"), "{case}: {body}");
        let auditor = app.operator_token("auditor", "payments:audit");
        let path = format!("/operator/v1/approvals/{approval}");
        let (_, view) = operator(&app, Method::GET, &path, &auditor, None).await;
        assert_eq!((view["status"].as_str(), view["mandate_id"].as_str()), (Some("pending"), None), "{case}: {view}");
        let again = call(&agent, "create_payment", pay(case, "5000.00", "supplier")).await;
        assert_eq!(code(&again), "APPROVAL_REQUIRED", "{case}: nothing moves: {again:?}");
        let _ = agent.cancel().await;
        app.stop().await;
    }
}

/// The stop-68 review (high): a database writer rewrote an approval's intent and amount between
/// two reviews (6,000 → 90,000; an open pre-authorization's limits ×250): the second reviewer's
/// approval completed it, the mandate named both people, 90,000 moved. An approval carries the
/// gateway's tag over what it asks now: rewritten, it is decided no further.
#[tokio::test]
async fn an_approval_rewritten_between_reviews_is_decided_no_further() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_APPROVALS__REVIEWERS_REQUIRED", "2")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let db = store_db(dir.path());
    let r = call(&agent, "create_payment", pay("rewritten", "5000.00", "supplier")).await;
    let asked = err(&r)["approval_id"].as_str().unwrap().to_string();
    // An open pre-authorization by alice: her approval counts once, a colleague completes it.
    let alice = app.operator_token("alice", "payments:approve");
    let open = json!({"subject": "dev-agent", "kind": "open", "currency": "KES", "payer": "acct-A",
                      "payees": ["acct-B"], "per_payment_max": "2000.00", "budget": "6000.00", "max_uses": 3});
    let (status, view) = operator(&app, Method::POST, "/approvals", &alice, Some(open)).await;
    assert_eq!((status.as_u16(), view["status"].as_str()), (201, Some("pending")), "{view}");
    let preauthorized = view["approval_id"].as_str().unwrap().to_string();
    let (status, body) = approve(&app, &asked, "alice").await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("pending")), "{body}");
    let intent: String = db.query_row("SELECT intent FROM approvals WHERE id = ?1", [&asked], |r| r.get(0)).unwrap();
    let raised = intent.replace("5000.00", "90000.00");
    assert_ne!(raised, intent);
    let sql = "UPDATE approvals SET intent = ?2, amount_minor = 9000000 WHERE id = ?1";
    assert_eq!(db.execute(sql, rusqlite::params![asked, raised]).unwrap(), 1);
    let sql = "UPDATE approvals SET intent = replace(replace(intent, '2000.00', '500000.00'), '6000.00', '500000.00'),
               amount_minor = 50000000 WHERE id = ?1";
    assert_eq!(db.execute(sql, [&preauthorized]).unwrap(), 1);
    let auditor = app.operator_token("auditor", "payments:audit");
    for approval in [&asked, &preauthorized] {
        let (status, body) = approve(&app, approval, "bob").await;
        assert_eq!(
            (status, body["error"]["code"].as_str()),
            (StatusCode::CONFLICT, Some("CONFLICT")),
            "{approval}: {body}"
        );
        assert!(body["error"]["message"].as_str().unwrap().contains("altered"), "{body}");
        let (_, view) =
            operator(&app, Method::GET, &format!("/operator/v1/approvals/{approval}"), &auditor, None).await;
        assert_eq!((view["status"].as_str(), view["mandate_id"].as_str()), (Some("pending"), None), "{view}");
    }
    // Rewritten before anyone reviewed it: the first click decides nothing either.
    let r = call(&agent, "create_payment", pay("rewritten-early", "5000.00", "supplier")).await;
    let early = err(&r)["approval_id"].as_str().unwrap().to_string();
    assert_eq!(db.execute("UPDATE approvals SET amount_minor = 100000 WHERE id = ?1", [&early]).unwrap(), 1);
    let (status, body) = approve(&app, &early, "carol").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The stop-68 review (high): an AFTER INSERT trigger on `audit_records` deleting the decision's
/// own record (written in the decision's transaction) let a rejection, an approval and a
/// revocation answer 200 with nothing on the trail; the rejection was then reopened and paid, the
/// revocation cleared and paid. The record is read back last in its transaction now: deleted, the
/// decision fails whole. Deleted by hand after it committed, the replica that wrote it names it.
#[tokio::test]
async fn a_decision_whose_record_is_deleted_is_not_answered_as_done_and_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let db = store_db(dir.path());
    db.execute_batch(
        "CREATE TRIGGER eat AFTER INSERT ON audit_records
         WHEN NEW.tool IN ('approvals.approve', 'approvals.reject', 'mandates.revoke')
         BEGIN DELETE FROM audit_records WHERE seq = NEW.seq; END;",
    )
    .unwrap();
    let r = call(&agent, "create_payment", pay("eaten", "5000.00", "supplier")).await;
    let approval = err(&r)["approval_id"].as_str().unwrap().to_string();
    let carol = app.operator_token("carol", "payments:approve");
    let reject = format!("/operator/v1/approvals/{approval}/reject");
    let (status, body) = operator(&app, Method::POST, &reject, &carol, Some(json!({"reason": "not ours"}))).await;
    assert!(status.is_server_error(), "{status} {body}");
    let (status, body) = approve(&app, &approval, "alice").await;
    assert!(status.is_server_error(), "{status} {body}");
    let auditor = app.operator_token("auditor", "payments:audit");
    let path = format!("/operator/v1/approvals/{approval}");
    let (_, view) = operator(&app, Method::GET, &path, &auditor, None).await;
    assert_eq!((view["status"].as_str(), view["mandate_id"].as_str()), (Some("pending"), None), "{view}");
    // Without the trigger: decided, and each record deleted by hand afterwards is named by the
    // replica that wrote it (it witnesses the records written in a decision's transaction too).
    db.execute_batch("DROP TRIGGER eat").unwrap();
    let (status, body) = approve(&app, &approval, "alice").await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("approved")), "{body}");
    let revoke = format!("/approvals/{approval}/revoke");
    let (status, body) = operator(&app, Method::POST, &revoke, &carol, Some(json!({"reason": "wrong"}))).await;
    assert_eq!(status, StatusCode::OK, "{body}");
    let deleted = db
        .execute(
            "DELETE FROM audit_records WHERE approval_id = ?1 AND tool IN ('approvals.approve', 'mandates.revoke')",
            [&approval],
        )
        .unwrap();
    assert_eq!(deleted, 2);
    // Named: both, and the two refusals' records the trigger ate earlier.
    assert_eq!(app.running.gateway.audit_witness_check(i64::MAX).await, 4);
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The second stop-67 review (medium): a rejection reopened in the database (the approval's row
/// back to pending, the rejecting review deleted) was then approved and paid. The rejection's
/// record is written in its transaction now, and the trail's word stands: it stays rejected.
#[tokio::test]
async fn a_rejection_reopened_in_the_database_stays_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let r = call(&agent, "create_payment", pay("reopened", "5000.00", "supplier")).await;
    let approval = err(&r)["approval_id"].as_str().unwrap().to_string();
    let carol = app.operator_token("carol", "payments:approve");
    let reject = format!("/operator/v1/approvals/{approval}/reject");
    let (status, body) = operator(&app, Method::POST, &reject, &carol, Some(json!({"reason": "not ours"}))).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("rejected")), "{body}");
    let db = store_db(dir.path());
    let reopened = db
        .execute(
            "UPDATE approvals SET status = 'pending', decided_at = NULL, decision_reason = NULL WHERE id = ?1",
            [&approval],
        )
        .unwrap();
    assert_eq!(reopened, 1);
    assert_eq!(db.execute("DELETE FROM approval_reviews WHERE approval_id = ?1", [&approval]).unwrap(), 1);
    let (status, body) = approve(&app, &approval, "alice").await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::CONFLICT, Some("CONFLICT")), "{body}");
    assert!(body["error"]["message"].as_str().unwrap().contains("rejected"), "{body}");
    let again = call(&agent, "create_payment", pay("reopened", "5000.00", "supplier")).await;
    assert_ne!(code(&again), "OK", "nothing moves: {again:?}");
    let auditor = app.operator_token("auditor", "payments:audit");
    let (_, view) = operator(&app, Method::GET, &format!("/operator/v1/approvals/{approval}"), &auditor, None).await;
    assert_eq!(view["mandate_id"].as_str(), None, "{view}");
    // Marked expired instead (the second stop-68 review): the operation would ask a human again,
    // and a fresh approval would be approved by anyone. The trail's rejection still answers.
    let expired = db.execute("UPDATE approvals SET status = 'expired' WHERE id = ?1", [&approval]).unwrap();
    assert_eq!(expired, 1);
    let again = call(&agent, "create_payment", pay("reopened", "5000.00", "supplier")).await;
    assert_eq!(code(&again), "APPROVAL_REJECTED", "{again:?}");
    assert_eq!(err(&again)["approval_id"].as_str(), Some(approval.as_str()), "{again:?}");
    let approvals: i64 = db.query_row("SELECT count(*) FROM approvals", [], |r| r.get(0)).unwrap();
    assert_eq!(approvals, 1, "no new approval was asked for");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// Finding 13 (approval fatigue): after a human rejected a payment, the agent asked again under a
/// new operation_id and got a fresh approval and fresh webhooks, as often as the pending bound
/// allowed. Now the same intent is APPROVAL_REJECTED for `approvals.rejected_cooldown_secs`, no
/// approval is created, and the asks count toward the no-progress stop rule, which suspends.
#[tokio::test]
async fn asking_again_after_a_rejection_is_refused_and_ends_in_suspension() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_STOP_RULES__REPEAT_MAX", "3")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let r = call(&agent, "create_payment", pay("ask-1", "5000.00", "invoice 7")).await;
    let approval = err(&r)["approval_id"].as_str().unwrap().to_string();
    let carol = app.operator_token("carol", "payments:approve");
    let (status, body) = operator(
        &app,
        Method::POST,
        &format!("/operator/v1/approvals/{approval}/reject"),
        &carol,
        Some(json!({"reason": "not ours"})),
    )
    .await;
    assert_eq!(status, StatusCode::OK, "{body}");

    let auditor = app.operator_token("auditor", "payments:audit");
    let approvals = || async {
        let (_, all) = operator(&app, Method::GET, "/operator/v1/approvals?status=pending", &auditor, None).await;
        all["items"].as_array().map(Vec::len).unwrap_or(0)
    };
    // The same intent under new operation_ids: refused, no approval for a person to click through.
    let r = call(&agent, "create_payment", pay("ask-2", "5000.00", "invoice 7")).await;
    assert_eq!(code(&r), "APPROVAL_REJECTED", "{r:?}");
    assert_eq!(err(&r)["approval_id"], approval.as_str());
    assert_eq!(approvals().await, 0, "no fresh approval");
    // The preflight says the same and writes nothing.
    let check = call(
        &agent,
        "check_payment_policy",
        json!({"tool": "create_payment",
                                                           "arguments": pay("ask-x", "5000.00", "invoice 7")}),
    )
    .await;
    assert_eq!(ok(&check)["code"], "APPROVAL_REJECTED", "{check:?}");
    // Another intent is another question.
    let other = call(&agent, "create_payment", pay("other", "4000.00", "invoice 8")).await;
    assert_eq!(code(&other), "APPROVAL_REQUIRED");
    // Asking again and again: the no-progress rule suspends the agent (repeat_max = 3).
    let mut last = String::new();
    for n in 3..=6 {
        last = code(&call(&agent, "create_payment", pay(&format!("ask-{n}"), "5000.00", "invoice 7")).await);
        if last == "PRINCIPAL_SUSPENDED" {
            break;
        }
        assert_eq!(last, "APPROVAL_REJECTED");
    }
    let r = call(&agent, "get_balance", json!({"account_id": "acct-A"})).await;
    assert_eq!(code(&r), "PRINCIPAL_SUSPENDED", "suspended after asking again ({last})");
    assert_eq!(approvals().await, 1, "only the other intent waits for a person");
    let _ = agent.cancel().await;
    app.stop().await;
}

// ---- agent-written text ----------------------------------------------------------------------------

/// Finding 10 (Trojan source): bidi overrides, isolates, zero-width characters and the BOM passed
/// the memo filter, so the approver read other text than the mandate pins. Every agent-written
/// text field refuses them, with the code point named, and nothing is recorded.
#[tokio::test]
async fn bidi_and_invisible_characters_are_refused_in_agent_text() {
    let (app, _dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    for (n, c) in ['\u{202E}', '\u{202C}', '\u{2066}', '\u{2069}', '\u{200B}', '\u{200F}', '\u{FEFF}', '\u{E0041}']
        .into_iter()
        .enumerate()
    {
        let memo = format!("invoice 42{c}24 ecioval");
        let r = call(&agent, "create_payment", pay(&format!("trojan-{n}"), "5000.00", &memo)).await;
        assert_eq!(code(&r), "INVALID_ARGUMENT", "U+{:04X}: {r:?}", u32::from(c));
        assert!(err(&r)["message"].as_str().unwrap().contains(&format!("U+{:04X}", u32::from(c))), "{r:?}");
        let paid = ok(&call(&agent, "create_payment", pay(&format!("plain-{n}"), "1.00", "invoice 42")).await).clone();
        let refund = json!({"operation_id": format!("r-{n}"), "payment_id": paid["payment_id"], "reason": memo});
        assert_eq!(code(&call(&agent, "refund_payment", refund).await), "INVALID_ARGUMENT");
    }
    let auditor = app.operator_token("auditor", "payments:audit");
    let (_, approvals) = operator(&app, Method::GET, "/operator/v1/approvals", &auditor, None).await;
    assert_eq!(approvals["items"].as_array().map(Vec::len), Some(0), "no approval shows the text: {approvals}");
    let _ = agent.cancel().await;
    app.stop().await;
}

// ---- the demo simulators ------------------------------------------------------------------------

/// Finding 11: with the demo credentials anyone who reached the port made the M-Pesa simulator
/// (and so the gateway) POST to any URL: an STK push's CallBackURL, a payout's ResultURL, a
/// Transaction Status query's ResultURL. It now posts only to the gateway's own callback routes.
#[tokio::test]
async fn the_mpesa_simulator_posts_only_to_the_gateways_own_callback_routes() {
    const SECRET: &str = "a-callback-path-secret-of-enough-length";
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        r#"
[mpesa]
enabled = true
environment = "simulator"
consumer_key = "k-0123456789abcdef0123456789abcdef"
consumer_secret = "s-0123456789abcdef0123456789abcdef"
short_code = "174379"
passkey = "p-0123456789abcdef"
initiator_name = "demo-initiator"
security_credential = "c-0123456789abcdef"
callback_secret = "{SECRET}"

[jobs]
enabled = false
"#
    );
    let app = spawn_with_toml(dir.path(), &config, &[], Arc::new(SystemClock)).await;
    paygate::install_crypto_provider();
    let http = reqwest::Client::new();
    let sim = format!("{}/simulator/mpesa", app.base());
    let basic = base64_basic("k-0123456789abcdef0123456789abcdef", "s-0123456789abcdef0123456789abcdef");
    let token: Value = http
        .get(format!("{sim}/oauth/v1/generate?grant_type=client_credentials"))
        .header("authorization", format!("Basic {basic}"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let bearer = token["access_token"].as_str().expect("a simulator token").to_string();
    let own = |channel: &str| format!("{}/callbacks/mpesa/{channel}/{SECRET}", app.base());
    let elsewhere = "http://127.0.0.1:9/collect-everything";
    let timestamp = "20261206120000";
    let password = {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(format!("174379p-0123456789abcdef{timestamp}"))
    };
    let push = |callback: &str| {
        json!({"BusinessShortCode": "174379", "Password": password, "Timestamp": timestamp,
               "TransactionType": "CustomerPayBillOnline", "Amount": "10", "PartyA": "254712345678",
               "PartyB": "174379", "PhoneNumber": "254712345678", "CallBackURL": callback,
               "AccountReference": "INV-1", "TransactionDesc": "x"})
    };
    let payout = |result: &str, timeout: &str| {
        json!({"OriginatorConversationID": "planted-1", "InitiatorName": "demo-initiator",
               "SecurityCredential": "c-0123456789abcdef", "CommandID": "BusinessPayment", "Amount": "10",
               "PartyA": "174379", "PartyB": "254712345678", "Remarks": "x", "QueueTimeOutURL": timeout,
               "ResultURL": result, "Occassion": ""})
    };
    let status = |result: &str| {
        json!({"Initiator": "demo-initiator", "SecurityCredential": "c-0123456789abcdef",
               "CommandID": "TransactionStatusQuery", "TransactionID": "", "OriginatorConversationID": "planted-1",
               "PartyA": "174379", "IdentifierType": "4", "ResultURL": result, "QueueTimeOutURL": result,
               "Remarks": "x", "Occasion": ""})
    };
    let post = |path: &'static str, body: Value| {
        let (http, sim, bearer) = (http.clone(), sim.clone(), bearer.clone());
        async move { http.post(format!("{sim}{path}")).bearer_auth(bearer).json(&body).send().await.unwrap().status() }
    };
    for (path, body) in [
        ("/mpesa/stkpush/v1/processrequest", push(elsewhere)),
        ("/mpesa/b2c/v3/paymentrequest", payout(elsewhere, &own("timeout"))),
        ("/mpesa/b2c/v3/paymentrequest", payout(&own("result"), elsewhere)),
        ("/mpesa/transactionstatus/v1/query", status(elsewhere)),
    ] {
        assert_eq!(post(path, body.clone()).await, StatusCode::BAD_REQUEST, "{path}: {body}");
    }
    // The gateway's own routes are taken (the simulator works for the gateway itself).
    assert_eq!(post("/mpesa/stkpush/v1/processrequest", push(&own("stk"))).await, StatusCode::OK);
    let admin = app.operator_token("ops", "payments:admin");
    let (_, items) = operator(&app, Method::GET, "/simulator/control/mpesa", &admin, None).await;
    assert_eq!(items["items"].as_array().map(Vec::len), Some(1), "only the push to the gateway: {items}");
    app.stop().await;
}

fn base64_basic(user: &str, password: &str) -> String {
    use base64::Engine as _;
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
}

// ---- policy -------------------------------------------------------------------------------------

/// No principal acts on itself, on the policy routes too: an operator who is also a person agents
/// act for (or an agent's subject) cannot be the second pair of eyes on a change that widens their
/// own authority. A colleague can.
#[tokio::test]
async fn an_operator_cannot_approve_a_policy_change_that_widens_their_own_authority() {
    let dir = tempfile::tempdir().unwrap();
    let toml = r#"
[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "alice"
users = ["alice"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "100.00" }
daily_limit = { KES = "1000.00" }
"#;
    let app = spawn_with_toml(dir.path(), toml, &[], Arc::new(SystemClock)).await;
    let (alice, bob, carol) = (
        app.operator_token("alice", "payments:admin"),
        app.operator_token("bob", "payments:admin"),
        app.operator_token("carol", "payments:admin"),
    );
    let (_, current) = operator(&app, Method::GET, "/operator/v1/policy", &bob, None).await;
    let (version, mut doc) = (current["version"].as_i64().unwrap(), current["document"].clone());
    let profile = doc["policy"]["profiles"].as_array_mut().unwrap().iter_mut().find(|p| p["name"] == "alice").unwrap();
    profile["autonomous_limit"] = json!({"KES": "5000.00"});
    let proposal = json!({"document": doc, "reason": "alice asked", "base_version": version});
    let (status, body) = operator(&app, Method::POST, "/operator/v1/policy/proposals", &bob, Some(proposal)).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::ACCEPTED, Some("pending")), "{body}");
    let id = body["proposal_id"].as_str().unwrap().to_string();
    let approve = format!("/operator/v1/policy/proposals/{id}/approve");
    let (status, body) = operator(&app, Method::POST, &approve, &alice, Some(json!({}))).await;
    assert_eq!(status, StatusCode::FORBIDDEN, "{body}");
    assert_eq!(body["error"]["code"], "SELF_REVIEW", "{body}");
    let (_, now) = operator(&app, Method::GET, "/operator/v1/policy", &bob, None).await;
    assert_eq!(now["version"], version, "nothing applied");
    let (status, body) = operator(&app, Method::POST, &approve, &carol, Some(json!({}))).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("applied")), "{body}");
    app.stop().await;
}

/// The hostile review of this fix: the own-widening check saw only profiles naming the operator.
/// Bob, an operator whose own agent acts for him through the agent's profile (no profile names
/// bob), approved giving that profile a user tier, then confirmed his own agent's payment alone.
/// The pairs the store has seen act for the approver count as theirs.
#[tokio::test]
async fn an_operator_cannot_widen_the_profile_their_own_agent_acts_for_them_under() {
    let dir = tempfile::tempdir().unwrap();
    let toml = r#"
[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "deleg"
subjects = ["helper"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "100.00" }
daily_limit = { KES = "100000.00" }
"#;
    let app = spawn_with_toml(dir.path(), toml, &[], Arc::new(SystemClock)).await;
    let for_bob = connect(&app.url, &app.delegated_token("bob", "helper", AGENT_SCOPES), Era::Modern).await;
    ok(&call(&for_bob, "create_payment", pay("bob-1", "5.00", "bob's")).await);
    let (alice, bob, carol) = (
        app.operator_token("alice", "payments:admin"),
        app.operator_token("bob", "payments:admin"),
        app.operator_token("carol", "payments:admin"),
    );
    let (_, current) = operator(&app, Method::GET, "/operator/v1/policy", &alice, None).await;
    let (version, mut doc) = (current["version"].as_i64().unwrap(), current["document"].clone());
    let profile = doc["policy"]["profiles"].as_array_mut().unwrap().iter_mut().find(|p| p["name"] == "deleg").unwrap();
    profile["approvals_by"] = json!("user");
    profile["user_approval_max"] = json!({"KES": "5000.00"});
    let proposal = json!({"document": doc, "reason": "let people confirm", "base_version": version});
    let (status, body) = operator(&app, Method::POST, "/operator/v1/policy/proposals", &alice, Some(proposal)).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::ACCEPTED, Some("pending")), "{body}");
    let approve = format!("/operator/v1/policy/proposals/{}/approve", body["proposal_id"].as_str().unwrap());
    let (status, body) = operator(&app, Method::POST, &approve, &bob, Some(json!({}))).await;
    assert_eq!((status, body["error"]["code"].as_str()), (StatusCode::FORBIDDEN, Some("SELF_REVIEW")), "{body}");
    let (status, body) = operator(&app, Method::POST, &approve, &carol, Some(json!({}))).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::OK, Some("applied")), "{body}");
    let _ = for_bob.cancel().await;
    app.stop().await;
}

// ---- the audit trail against a database writer ---------------------------------------------------

async fn verify(app: &TestApp) -> Value {
    let auditor = app.operator_token("auditor", "payments:audit");
    let (status, v) = operator(app, Method::GET, "/operator/v1/audit/verify", &auditor, None).await;
    assert_eq!(status, StatusCode::OK, "{v}");
    v
}

/// The hostile review of this fix (F1): a database writer deleted a payment's audit record as it
/// was written (a trigger, or a DELETE before the sealing run), and the chain, sealed over what was
/// left, verified. A ledger payment and its record are written in one transaction, so a payment no
/// record names is a record removed: `audit verify` names it.
#[tokio::test]
async fn a_payments_record_removed_before_it_was_sealed_is_named() {
    let (app, dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    ok(&call(&agent, "create_payment", pay("before", "2.00", "kept")).await);
    assert_eq!(verify(&app).await["ok"], true);
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.execute_batch(
        "CREATE TRIGGER hide AFTER INSERT ON audit_records WHEN new.payment_id IS NOT NULL
         BEGIN DELETE FROM audit_records WHERE seq = new.seq; END;",
    )
    .unwrap();
    let hidden = ok(&call(&agent, "create_payment", pay("hidden", "3.00", "hidden")).await).clone();
    db.execute_batch("DROP TRIGGER hide").unwrap();
    ok(&call(&agent, "create_payment", pay("after", "4.00", "kept too")).await);
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    let reason = v["first_break"]["reason"].as_str().unwrap();
    assert!(reason.contains(hidden["payment_id"].as_str().unwrap()), "{reason}");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The residual that review left open: a database writer deleted a record no payment names (here
/// a refusal: the evidence of an agent's attempt) as it was written; the chain sealed what was left
/// and verified. The replica that wrote the record witnesses it until it is sealed: gone is a break,
/// recorded, and `audit verify` names it from then on.
#[tokio::test]
async fn a_record_deleted_before_it_was_sealed_is_named_by_the_replica_that_wrote_it() {
    let (app, dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    ok(&call(&agent, "create_payment", pay("before", "2.00", "kept")).await);
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.execute_batch(
        "CREATE TABLE hidden (seq INTEGER);
         CREATE TRIGGER hide AFTER INSERT ON audit_records WHEN new.code = 'ACCOUNT_NOT_ALLOWED'
         BEGIN INSERT INTO hidden VALUES (new.seq); DELETE FROM audit_records WHERE seq = new.seq; END;",
    )
    .unwrap();
    let foreign = json!({"operation_id": "hidden", "from_account": "acct-A", "to_account": "acct-Z",
                         "amount": "3.00", "currency": "KES"});
    assert_eq!(err(&call(&agent, "create_payment", foreign).await)["code"], "ACCOUNT_NOT_ALLOWED");
    db.execute_batch("DROP TRIGGER hide").unwrap();
    // The record the trigger deleted (the scheduler may have written others since).
    let hidden: i64 = db.query_row("SELECT seq FROM hidden", [], |r| r.get(0)).unwrap();
    // The links alone cannot tell: nothing is left of the refusal, and no payment lacks its record.
    assert_eq!(verify(&app).await["ok"], true);
    let g = &app.running.gateway;
    assert_eq!(g.audit_witness_check(i64::MAX).await, 1, "the writer finds its record gone");
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    let reason = v["first_break"]["reason"].as_str().unwrap();
    assert!(reason.contains("witnessed") && reason.contains(&format!("record seq {hidden} ")), "{reason}");
    // Checked once: the same record is not reported again; records still there are not reported.
    assert_eq!(g.audit_witness_check(i64::MAX).await, 0);
    // The operators' Health page says so too (the hostile review of this fix, F2: a database that
    // also deletes the witness's records leaves the log, the metric and this).
    let auditor = app.operator_token("auditor", "payments:audit");
    let (_, health) = operator(&app, Method::GET, "/operator/v1/health", &auditor, None).await;
    let audit = health["checks"].as_array().unwrap().iter().find(|c| c["name"] == "audit").unwrap().clone();
    assert_eq!((health["status"].clone(), audit["ok"].clone()), (json!("degraded"), json!(false)), "{health}");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The hostile review of the writer's tag and witness (F1, F3): a trigger moved a payment's
/// "allowed" record's payment id onto an earlier, unrelated record and deleted the allowed record
/// (the payment then had "a record"), and another trigger copied records whole (their tags held).
/// A payment needs its own allowed record (its idempotency key, bound by the tag); a copied tag
/// repeats.
#[tokio::test]
async fn a_payments_record_swapped_for_a_decoy_or_a_copied_record_is_named() {
    // No sealing run meanwhile: the decoy is certainly still unsealed when the trigger fires.
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    db.execute_batch(
        "CREATE TRIGGER hide AFTER INSERT ON audit_records
         WHEN NEW.decision = 'allowed' AND NEW.payment_id IS NOT NULL
         BEGIN
           UPDATE audit_records SET payment_id = NEW.payment_id
            WHERE seq = (SELECT max(seq) FROM audit_records WHERE seq < NEW.seq AND payment_id IS NULL
                           AND seq NOT IN (SELECT seq FROM audit_chain));
           DELETE FROM audit_records WHERE seq = NEW.seq;
         END;",
    )
    .unwrap();
    let foreign = json!({"operation_id": "decoy", "from_account": "acct-A", "to_account": "acct-Z",
                         "amount": "3.00", "currency": "KES"});
    assert_eq!(err(&call(&agent, "create_payment", foreign).await)["code"], "ACCOUNT_NOT_ALLOWED");
    let hidden = ok(&call(&agent, "create_payment", pay("hidden", "9.99", "to my mule")).await).clone();
    db.execute_batch("DROP TRIGGER hide").unwrap();
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    // The decoy now names the payment: its writer's tag (which binds the payment id) breaks first;
    // the payment itself has no allowed record of its own either.
    let reason = v["first_break"]["reason"].as_str().unwrap();
    assert!(reason.contains("unsealed record") && reason.contains("tag does not match"), "{reason}");
    let hidden = hidden["payment_id"].as_str().unwrap();
    let payments: i64 = db
        .query_row(&format!("SELECT count(*) FROM audit_records WHERE payment_id = '{hidden}'"), [], |r| r.get(0))
        .unwrap();
    assert_eq!(payments, 1, "the trigger moved the decoy onto the payment");
    let _ = agent.cancel().await;
    app.stop().await;

    let (app, dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    db.execute_batch(
        "CREATE TRIGGER dup AFTER INSERT ON audit_records WHEN NEW.code = 'ACCOUNT_NOT_ALLOWED'
         BEGIN INSERT INTO audit_records (at, correlation_id, principal_iss, principal_sub, tool, decision, code,
                idempotency_key, payment_id, approval_id, detail, principal_user, repeats, policy_version, intent, tag)
              VALUES (NEW.at, NEW.correlation_id, NEW.principal_iss, NEW.principal_sub, NEW.tool, NEW.decision,
                NEW.code, NEW.idempotency_key, NEW.payment_id, NEW.approval_id, NEW.detail, NEW.principal_user,
                NEW.repeats, NEW.policy_version, NEW.intent, NEW.tag);
         END;",
    )
    .unwrap();
    let foreign = json!({"operation_id": "copied", "from_account": "acct-A", "to_account": "acct-Z",
                         "amount": "3.00", "currency": "KES"});
    assert_eq!(err(&call(&agent, "create_payment", foreign).await)["code"], "ACCOUNT_NOT_ALLOWED");
    db.execute_batch("DROP TRIGGER dup").unwrap();
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    assert!(v["first_break"]["reason"].as_str().unwrap().contains("copy of an earlier record"), "{v}");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The fourth hostile review (high): before the sealing run, a database writer swapped two
/// payments' "allowed" records (their payment ids) and the payments' idempotency keys, so that
/// each payment still had an allowed record under its key — the trail then said the 9.99 to the
/// mule was decided as the other payment, and verify said ok. The writer's tag binds the payment
/// id: the moved record is named.
#[tokio::test]
async fn allowed_records_moved_between_payments_before_sealing_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let a = ok(&call(&agent, "create_payment", pay("first", "1.00", "rent")).await)["payment_id"].clone();
    let b = ok(&call(&agent, "create_payment", pay("second", "9.99", "to my mule")).await)["payment_id"].clone();
    let (a, b) = (a.as_str().unwrap(), b.as_str().unwrap());
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    let unsealed: i64 = db
        .query_row(
            &format!(
                "SELECT count(*) FROM audit_records WHERE payment_id IN ('{a}', '{b}') AND decision = 'allowed'
                   AND seq NOT IN (SELECT seq FROM audit_chain)"
            ),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(unsealed, 2, "both allowed records are still unsealed");
    db.execute_batch(&format!(
        "UPDATE audit_records SET payment_id = 'swap' WHERE payment_id = '{a}' AND decision = 'allowed';
         UPDATE audit_records SET payment_id = '{a}' WHERE payment_id = '{b}' AND decision = 'allowed';
         UPDATE audit_records SET payment_id = '{b}' WHERE payment_id = 'swap';
         UPDATE payments SET idempotency_key = 'swap' WHERE id = '{a}';
         UPDATE payments SET idempotency_key = (SELECT idempotency_key FROM audit_records
                                                 WHERE payment_id = '{b}' AND decision = 'allowed') WHERE id = '{b}';
         UPDATE payments SET idempotency_key = (SELECT idempotency_key FROM audit_records
                                                 WHERE payment_id = '{a}' AND decision = 'allowed') WHERE id = '{a}';"
    ))
    .unwrap();
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    let reason = v["first_break"]["reason"].as_str().unwrap();
    assert!(reason.contains("tag does not match"), "{reason}");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The fifth hostile review (high): a database writer rewrote a payment row after it was decided
/// — 50.00 to acct-B became 9,000.00 to acct-Z, its postings and balances rewritten to match —
/// and verify said ok (so did check-ledger). A payment is held to its "allowed" record's intent,
/// the policy question the gateway answered: amount, accounts, currency, principal, mandate.
#[tokio::test]
async fn a_payment_rewritten_after_it_was_decided_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let paid = ok(&call(&agent, "create_payment", pay("op-1", "50.00", "rent")).await)["payment_id"].clone();
    let paid = paid.as_str().unwrap();
    let tea = ok(&call(&agent, "create_payment", pay("op-2", "2.00", "tea")).await)["payment_id"].clone();
    // Refunds too: one of an amount, then "everything left".
    let refund = |op: &str, amount: Option<&str>| {
        let mut r = json!({"operation_id": op, "payment_id": tea, "reason": "returned"});
        if let Some(a) = amount {
            r["amount"] = json!(a);
        }
        r
    };
    ok(&call(&agent, "refund_payment", refund("r-1", Some("0.50"))).await);
    ok(&call(&agent, "refund_payment", refund("r-2", None)).await);
    assert_eq!(verify(&app).await["ok"], true, "as made, it holds");
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    for (tamper, named) in [
        (format!("UPDATE payments SET amount_minor = 900000, to_account = 'acct-Z' WHERE id = '{paid}'"), "accounts"),
        (format!("UPDATE payments SET amount_minor = 900000 WHERE id = '{paid}'"), "amount"),
        (format!("UPDATE payments SET principal_sub = 'another-agent' WHERE id = '{paid}'"), "principal"),
    ] {
        db.execute_batch(&tamper).unwrap();
        let v = verify(&app).await;
        db.execute_batch(&format!(
            "UPDATE payments SET amount_minor = 5000, to_account = 'acct-B', principal_sub = 'dev-agent' WHERE id = '{paid}'"
        ))
        .unwrap();
        assert_eq!(v["ok"], false, "{tamper}: {v}");
        let reason = v["first_break"]["reason"].as_str().unwrap();
        assert!(reason.contains(paid) && reason.contains(named), "{tamper}: {reason}");
    }
    assert_eq!(verify(&app).await["ok"], true, "put back, it holds again");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The eighth hostile review, as a database writer on a live store: a refund detached from its
/// original (or moved to another payment) so the original could be refunded again — both checks
/// said ok —, a whole payment deleted with its postings and the balances put back, a payment
/// marked failed or moved days back in time. `audit verify` names each against the record that
/// decided it, and the full integrity check names a refund that gives back no payment it holds.
#[tokio::test]
async fn ledger_rows_detached_deleted_or_moved_in_time_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let id = |v: &Value| v["payment_id"].as_str().unwrap().to_string();
    let paid = id(ok(&call(&agent, "create_payment", pay("op-1", "300.00", "rent")).await));
    let other = id(ok(&call(&agent, "create_payment", pay("op-2", "200.00", "tea")).await));
    let refund = json!({"operation_id": "r-1", "payment_id": paid, "amount": "100.00", "reason": "returned"});
    let refund = id(ok(&call(&agent, "refund_payment", refund).await));
    assert_ne!(refund, paid);
    assert_eq!(verify(&app).await["ok"], true, "as made, it holds");
    let store = &app.running.store;
    assert!(store.ledger_integrity().await.unwrap().ok);
    let db = store_db(dir.path());
    let created: i64 =
        db.query_row(&format!("SELECT created_at FROM payments WHERE id = '{other}'"), [], |r| r.get(0)).unwrap();
    let put_back = format!(
        "UPDATE payments SET refund_of = '{paid}', amount_minor = 10000 WHERE id = '{refund}';
         UPDATE postings SET amount_minor = -10000 WHERE payment_id = '{refund}' AND amount_minor < 0;
         UPDATE postings SET amount_minor = 10000 WHERE payment_id = '{refund}' AND amount_minor > 0;
         UPDATE payments SET refunded_minor = 10000 WHERE id = '{paid}';
         UPDATE payments SET refunded_minor = 0, status = 'succeeded', refund_of = NULL, created_at = {created}
           WHERE id = '{other}';"
    );
    for (tamper, named, integrity) in [
        (
            format!(
                "UPDATE payments SET refund_of = NULL WHERE id = '{refund}';
                 UPDATE payments SET refunded_minor = 0 WHERE id = '{paid}'"
            ),
            "original payment",
            true,
        ),
        (
            format!(
                "UPDATE payments SET refund_of = '{other}' WHERE id = '{refund}';
                 UPDATE payments SET refunded_minor = 0 WHERE id = '{paid}';
                 UPDATE payments SET refunded_minor = 10000 WHERE id = '{other}'"
            ),
            "original payment",
            false,
        ),
        (format!("UPDATE payments SET status = 'failed' WHERE id = '{other}'"), "failed", false),
        (format!("UPDATE payments SET created_at = created_at - 259200 WHERE id = '{other}'"), "moved in time", false),
        (format!("UPDATE payments SET refund_of = '{paid}' WHERE id = '{other}'"), "no refund", false),
        // The ninth review (high): a refund that named its amount lowered, postings and the
        // original's refunded amount to match, so the original could be refunded again.
        (
            format!(
                "UPDATE payments SET amount_minor = 1 WHERE id = '{refund}';
                 UPDATE payments SET refunded_minor = 1 WHERE id = '{paid}';
                 UPDATE postings SET amount_minor = -1 WHERE payment_id = '{refund}' AND amount_minor < 0;
                 UPDATE postings SET amount_minor = 1 WHERE payment_id = '{refund}' AND amount_minor > 0;"
            ),
            "amount",
            false,
        ),
    ] {
        db.execute_batch(&tamper).unwrap();
        let v = verify(&app).await;
        let report = store.ledger_integrity().await.unwrap();
        db.execute_batch(&put_back).unwrap();
        assert_eq!(v["ok"], false, "{tamper}: {v}");
        let reason = v["first_break"]["reason"].as_str().unwrap();
        assert!(reason.contains(named), "{tamper}: {reason}");
        if integrity {
            assert!(!report.ok && report.problems.iter().any(|p| p.contains(&refund)), "{tamper}: {report:?}");
        }
    }
    // Put back, it holds again.
    let v = verify(&app).await;
    assert_eq!(v["ok"], true, "{v}");
    // A whole payment deleted, postings and balances with it.
    db.execute_batch(&format!(
        "UPDATE accounts SET balance_minor = balance_minor -
             (SELECT amount_minor FROM postings WHERE payment_id = '{other}' AND account_id = accounts.id)
           WHERE id IN (SELECT account_id FROM postings WHERE payment_id = '{other}');
         DELETE FROM postings WHERE payment_id = '{other}';
         DELETE FROM payments WHERE id = '{other}';"
    ))
    .unwrap();
    assert!(store.ledger_integrity().await.unwrap().ok, "the ledger alone balances");
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    let reason = v["first_break"]["reason"].as_str().unwrap();
    assert!(reason.contains(&other) && reason.contains("no longer holds"), "{reason}");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The tenth hostile review (high), as a database writer on a live store: a refund of "everything
/// left" (no amount) lowered from 70.00 to 10.00 — postings, balances and the original's refunded
/// amount to match — let the original be refunded again (160.00 decided against 100.00), and
/// verify said ok. After an "everything left" refund its original has nothing left: verify names
/// the lowered refund, and the refund made after it.
#[tokio::test]
async fn an_everything_left_refund_lowered_in_the_database_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let id = |v: &Value| v["payment_id"].as_str().unwrap().to_string();
    let paid = id(ok(&call(&agent, "create_payment", pay("op-1", "100.00", "rent")).await));
    let refund = |op: &str, amount: Option<&str>| {
        let mut r = json!({"operation_id": op, "payment_id": paid, "reason": "returned"});
        if let Some(a) = amount {
            r["amount"] = json!(a);
        }
        r
    };
    ok(&call(&agent, "refund_payment", refund("r-1", Some("30.00"))).await);
    let rest = ok(&call(&agent, "refund_payment", refund("r-2", None)).await).clone();
    assert_eq!(rest["amount"], "70.00", "{rest}");
    let rest = id(&rest);
    assert_eq!(verify(&app).await["ok"], true, "as made, it holds");
    let db = store_db(dir.path());
    db.execute_batch(&format!(
        "UPDATE payments SET amount_minor = 1000 WHERE id = '{rest}';
         UPDATE payments SET refunded_minor = 4000 WHERE id = '{paid}';
         UPDATE accounts SET balance_minor = balance_minor +
             (SELECT -amount_minor - CASE WHEN amount_minor < 0 THEN 1000 ELSE -1000 END
              FROM postings WHERE payment_id = '{rest}' AND account_id = accounts.id)
           WHERE id IN (SELECT account_id FROM postings WHERE payment_id = '{rest}');
         UPDATE postings SET amount_minor = -1000 WHERE payment_id = '{rest}' AND amount_minor < 0;
         UPDATE postings SET amount_minor = 1000 WHERE payment_id = '{rest}' AND amount_minor > 0;"
    ))
    .unwrap();
    let store = &app.running.store;
    assert!(store.ledger_integrity().await.unwrap().ok, "the ledger alone is consistent");
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    let reason = v["first_break"]["reason"].as_str().unwrap();
    assert!(reason.contains(&rest) && reason.contains("everything left"), "{reason}");
    // The gateway believes 60.00 is left and refunds it; verify still names the lowered refund,
    // now by the refund posted after it.
    let again = ok(&call(&agent, "refund_payment", refund("r-3", None)).await).clone();
    assert_eq!(again["amount"], "60.00", "{again}");
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    let reason = v["first_break"]["reason"].as_str().unwrap();
    assert!(reason.contains(&rest) && reason.contains("posted after"), "{reason}");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The store's SQLite file, opened as a database writer would.
fn store_db(dir: &std::path::Path) -> rusqlite::Connection {
    let db = rusqlite::Connection::open(dir.join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    db
}

/// Policy version `version`'s document as stored, and the same with every profile's KES
/// autonomous limit set to `limit`.
fn with_kes_limit(db: &rusqlite::Connection, version: i64, limit: &str) -> (String, Value) {
    let document: String =
        db.query_row("SELECT document FROM policy_versions WHERE version = ?1", [version], |r| r.get(0)).unwrap();
    let mut doc: Value = serde_json::from_str(&document).unwrap();
    for profile in doc["policy"]["profiles"].as_array_mut().unwrap() {
        if profile["autonomous_limit"].get("KES").is_some() {
            profile["autonomous_limit"]["KES"] = json!(limit);
        }
    }
    (document, doc)
}

/// The fifth hostile review (F1, high): a database writer inserted a policy version (the dev
/// agent's autonomous limit raised to 90,000.00, "approved" by two people who never acted); every
/// replica put it in force within seconds, the agent paid 80,000.00 alone, and later genuine
/// changes were built on it. Versions carry the gateway's tag: an inserted one is never in force
/// nor built on, and stripping every tag does not make it look older than tags.
#[tokio::test]
async fn a_policy_version_written_in_the_database_is_never_in_force() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let g = &app.running.gateway;
    let in_force = g.policy().version;
    let db = store_db(dir.path());
    let (document, doc) = with_kes_limit(&db, in_force, "90000.00");
    db.execute(
        "INSERT INTO policy_versions (version, document, author_iss, author_sub, reason, approver_iss, approver_sub,
                                      proposal_id, created_at)
         VALUES (?1, ?2, 'https://dev.paygate.test', 'carol', 'routine', 'https://dev.paygate.test', 'dave', NULL, ?3)",
        rusqlite::params![in_force + 1, doc.to_string(), SystemClock.now()],
    )
    .unwrap();
    g.refresh_policy().await.unwrap();
    assert_eq!(g.policy().version, in_force, "the inserted version is not in force");
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let big = call(&agent, "create_payment", pay("big", "2000.00", "over the limit in force")).await;
    assert_eq!(code(&big), "APPROVAL_REQUIRED", "{big:?}");
    // Nothing is built on it either.
    let admin = app.operator_token("alice", "payments:admin");
    let (status, body) = operator(
        &app,
        Method::POST,
        "/operator/v1/policy/proposals",
        &admin,
        Some(json!({"document": serde_json::from_str::<Value>(&document).unwrap(), "reason": "narrow it"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("tag does not hold"), "{body}");
    let _ = agent.cancel().await;
    app.stop().await;
    // Every tag stripped: a restart does not adopt the inserted version as an old one.
    db.execute("UPDATE policy_versions SET tag = NULL", []).unwrap();
    let again =
        paygate::app::start(config_for(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]), Arc::new(SystemClock)).await;
    let error = again.err().expect("a store whose newest version is not the gateway's does not start").to_string();
    assert!(error.contains("never adopted"), "{error}");
    // The eighth review (high): with every tag stripped and no adoption on record, a restart, a
    // one-shot command or `audit verify` tagged every version as it stood, the forged one too, and
    // a running replica put it in force. Nothing adopts unless the operator asks, and none of them
    // writes a tag.
    for args in [&["check-ledger"][..], &["audit", "verify"]] {
        let out = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
            .args(args)
            .env_remove("PAYGATE_CONFIG")
            .env("PAYGATE_STORAGE__DATA_DIR", dir.path())
            .env("PAYGATE_AUTH__DEV_ISSUER", DEV_ISSUER)
            .output()
            .unwrap();
        assert!(!out.status.success(), "{args:?}: {}", String::from_utf8_lossy(&out.stdout));
        assert!(String::from_utf8_lossy(&out.stderr).contains("never adopted"), "{args:?}");
    }
    let tagged: i64 =
        db.query_row("SELECT COUNT(*) FROM policy_versions WHERE tag IS NOT NULL", [], |r| r.get(0)).unwrap();
    assert_eq!(tagged, 0, "nothing was adopted unasked");
    // The ninth review (medium): the operator, following the refusal's advice, set the flag, and the
    // forged version was adopted. A store whose audit records carry tags was never one from before
    // tags: it is not adopted, asked or not.
    let asked = [("PAYGATE_JOBS__ENABLED", "false"), ("PAYGATE_POLICY__ADOPT_UNTAGGED_VERSIONS", "true")];
    let again = paygate::app::start(config_for(dir.path(), &asked), Arc::new(SystemClock)).await;
    let error = again.err().expect("a tagged store's stripped versions are never adopted").to_string();
    assert!(error.contains("never adopted"), "{error}");
    let tagged: i64 =
        db.query_row("SELECT COUNT(*) FROM policy_versions WHERE tag IS NOT NULL", [], |r| r.get(0)).unwrap();
    assert_eq!(tagged, 0, "nothing was adopted, asked");
}

/// An upgrade from before policy versions were tagged: the store does not start until an
/// operator asks (`policy.adopt_untagged_versions`); then its versions are tagged as they stand and
/// the adoption is recorded, and a store whose tags are stripped after that is never adopted again.
#[tokio::test]
async fn untagged_policy_versions_are_adopted_only_when_an_operator_asks_and_only_once() {
    capture_logs();
    let dir = tempfile::tempdir().unwrap();
    let quiet = ("PAYGATE_JOBS__ENABLED", "false");
    let app = spawn_on(dir.path(), &[quiet]).await;
    let version = app.running.gateway.policy().version;
    // A refusal, so the trail holds a record (no payment: the records go below).
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let foreign = json!({"operation_id": "f-1", "from_account": "acct-A", "to_account": "acct-Z",
                         "amount": "1.00", "currency": "KES"});
    assert_eq!(err(&call(&agent, "create_payment", foreign).await)["code"], "ACCOUNT_NOT_ALLOWED");
    // A widening waiting for a second operator: adopted with the versions, it stays decidable.
    let alice = app.operator_token("alice", "payments:admin payments:audit");
    let (_, current) = operator(&app, Method::GET, "/operator/v1/policy", &alice, None).await;
    let mut doc = current["document"].clone();
    let dev = doc["policy"]["profiles"].as_array_mut().unwrap().iter_mut().find(|p| p["name"] == "dev").unwrap();
    dev["autonomous_limit"] = json!({"KES": "9000.00"});
    let raise = json!({"document": doc, "reason": "raise", "base_version": version});
    let (status, body) = operator(&app, Method::POST, "/operator/v1/policy/proposals", &alice, Some(raise)).await;
    assert_eq!((status, body["status"].as_str()), (StatusCode::ACCEPTED, Some("pending")), "{body}");
    let _ = agent.cancel().await;
    app.stop().await;
    let db = store_db(dir.path());
    db.execute("UPDATE policy_proposals SET tag = NULL", []).unwrap();
    // What a store from before tags looks like: no version tagged and no audit record left
    // unsealed without a tag (the builds before tags sealed what they wrote; the sealer now never
    // seals an untagged record, so one left unsealed is a tag stripped). Nothing was sealed here
    // (the scheduler is off), so the records go: the store's trail is empty.
    let start = |asked: bool| {
        let flag = ("PAYGATE_POLICY__ADOPT_UNTAGGED_VERSIONS", if asked { "true" } else { "false" });
        paygate::app::start(config_for(dir.path(), &[quiet, flag]), Arc::new(SystemClock))
    };
    // The eleventh review: records left unsealed with their tags stripped (the chain deleted
    // with them) are not a store from before tags — never adopted, asked or not.
    db.execute_batch("UPDATE policy_versions SET tag = NULL; UPDATE audit_records SET tag = NULL;").unwrap();
    let stripped = start(true).await.err().expect("unsealed records stripped of their tags").to_string();
    assert!(stripped.contains("carries none"), "{stripped}");
    db.execute_batch("DELETE FROM audit_records;").unwrap();
    let refused = start(false).await.err().expect("untagged versions are not adopted unasked").to_string();
    assert!(refused.contains("carry no tag"), "{refused}");
    let adopted = start(true).await.expect("adopted when asked");
    assert_eq!(adopted.gateway.policy().version, version);
    let records = adopted.store.audit_first_of_tool("policy.adopt_tags").await.unwrap();
    assert!(records.is_some(), "the adoption is in the trail");
    // And in the log, for whoever watches the start: what was adopted and that it was.
    let logs = logs_text();
    let line = logs
        .lines()
        .find(|l| l.contains("policy versions written before versions were tagged: tagged as they stood"))
        .unwrap_or_else(|| panic!("the adoption is logged: {logs}"));
    assert!(line.contains(" INFO ") && line.contains("versions="), "{line}");
    adopted.shutdown().await;
    let tagged: i64 =
        db.query_row("SELECT COUNT(*) FROM policy_versions WHERE tag IS NOT NULL", [], |r| r.get(0)).unwrap();
    assert!(tagged >= 1);
    let proposals: i64 = db
        .query_row("SELECT COUNT(*) FROM policy_proposals WHERE status = 'pending' AND tag IS NOT NULL", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(proposals, 1, "the pending proposal is tagged as it stood");
    start(false).await.expect("tagged, it starts without the flag").shutdown().await;
    // Stripped again after the adoption: never adopted a second time, asked or not.
    db.execute("UPDATE policy_versions SET tag = NULL", []).unwrap();
    let again = start(true).await.err().expect("not adopted twice").to_string();
    assert!(again.contains("adopted before") || again.contains("never adopted"), "{again}");
    // Nor when the adoption's record is deleted too (the ninth review): the records left carry
    // tags (the store was never one from before tags), or the trail does not verify.
    db.execute("DELETE FROM audit_records WHERE tool = 'policy.adopt_tags'", []).unwrap();
    let again = start(true).await.err().expect("not adopted over a deleted record").to_string();
    assert!(again.contains("never adopted") || again.contains("verifies"), "{again}");
}

/// The tenth hostile review (medium): every policy version's tag stripped and every audit record's
/// too, so "the store's records carry tags" found none, and an operator who set
/// `policy.adopt_untagged_versions` adopted the versions as they stood, a forged one among them.
/// A trail sealed with the gateway's keyed links was sealed by a gateway that tags: never adopted.
#[tokio::test]
async fn a_store_sealed_with_keyed_links_is_never_adopted_with_every_tag_stripped() {
    let dir = tempfile::tempdir().unwrap();
    let quiet = ("PAYGATE_JOBS__ENABLED", "false");
    let app = spawn_on(dir.path(), &[quiet]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    ok(&call(&agent, "create_payment", pay("op-1", "5.00", "tea")).await);
    let _ = agent.cancel().await;
    app.running.gateway.seal_audit_at_stop().await;
    let in_force = app.running.gateway.policy().version;
    app.stop().await;
    let db = store_db(dir.path());
    let (_, doc) = with_kes_limit(&db, in_force, "90000.00");
    db.execute_batch("UPDATE policy_versions SET tag = NULL; UPDATE audit_records SET tag = NULL;").unwrap();
    db.execute(
        "INSERT INTO policy_versions (version, document, author_iss, author_sub, reason, approver_iss, approver_sub,
                                      proposal_id, created_at)
         VALUES (?1, ?2, 'https://dev.paygate.test', 'carol', 'routine', 'https://dev.paygate.test', 'dave', NULL, ?3)",
        rusqlite::params![in_force + 1, doc.to_string(), SystemClock.now()],
    )
    .unwrap();
    let flag = ("PAYGATE_POLICY__ADOPT_UNTAGGED_VERSIONS", "true");
    let refused = paygate::app::start(config_for(dir.path(), &[quiet, flag]), Arc::new(SystemClock))
        .await
        .err()
        .expect("a store sealed with keyed links is never adopted")
        .to_string();
    // Refused: the trail's keyed links name the stripped tags themselves (the eleventh review's
    // rule), and a trail sealed with keyed links is never adopted.
    assert!(refused.contains("tag was removed") || refused.contains("keyed links"), "{refused}");
    let tagged: i64 =
        db.query_row("SELECT COUNT(*) FROM policy_versions WHERE tag IS NOT NULL", [], |r| r.get(0)).unwrap();
    assert_eq!(tagged, 0, "nothing was adopted");
}

/// The tenth hostile review (medium): every tag stripped at once, then a ledger payment's record
/// and row, not yet sealed, rewritten together (payee acct-B to acct-Z) and sealed: verify, the
/// full check and the witness said nothing, since "an untagged record after tagged ones" had no
/// tagged one left. After the sealing run that first keyed a link, every record is owed a tag.
#[tokio::test]
async fn a_record_rewritten_with_every_tag_stripped_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    ok(&call(&agent, "create_payment", pay("op-1", "5.00", "tea")).await);
    app.running.gateway.seal_audit_at_stop().await;
    let paid = ok(&call(&agent, "create_payment", pay("op-2", "50.00", "rent")).await)["payment_id"].clone();
    let paid = paid.as_str().unwrap();
    assert_eq!(verify(&app).await["ok"], true, "as made, it holds");
    let db = store_db(dir.path());
    db.execute_batch(&format!(
        "UPDATE policy_versions SET tag = NULL; UPDATE audit_records SET tag = NULL;
         UPDATE audit_records SET intent = replace(intent, 'acct-B', 'acct-Z') WHERE payment_id = '{paid}';
         UPDATE payments SET to_account = 'acct-Z' WHERE id = '{paid}';
         UPDATE postings SET account_id = 'acct-Z' WHERE payment_id = '{paid}' AND account_id = 'acct-B';"
    ))
    .unwrap();
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "unsealed: {v}");
    assert!(v["first_break"]["reason"].as_str().unwrap().contains("tag was removed"), "{v}");
    app.running.gateway.seal_audit_at_stop().await;
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "sealed: {v}");
    assert!(v["first_break"]["reason"].as_str().unwrap().contains("tag was removed"), "{v}");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The eleventh hostile review (high): the chain tables emptied and every record's tag stripped,
/// so the store looked never sealed and older than tags; a payment's record and row rewritten
/// (100.00 to 5,000.00); the next sealing run linked the rewrite with the gateway's own keyed
/// links and signed it, and verify said ok. The sealer never links a record without its writer's
/// tag: the rewrite stays unsealed, and verify names it once it is older than sealing allows.
#[tokio::test]
async fn a_trail_emptied_of_its_chain_and_tags_is_never_sealed_again() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    ok(&call(&agent, "create_payment", pay("op-1", "100.00", "rent")).await);
    app.running.gateway.seal_audit_at_stop().await;
    let paid = ok(&call(&agent, "create_payment", pay("op-2", "100.00", "rent")).await)["payment_id"].clone();
    let paid = paid.as_str().unwrap().to_string();
    let _ = agent.cancel().await;
    app.stop().await;
    let db = store_db(dir.path());
    db.execute_batch(&format!(
        "DELETE FROM audit_chain; DELETE FROM audit_chain_head; DELETE FROM audit_checkpoints;
         UPDATE audit_records SET tag = NULL;
         UPDATE audit_records SET intent = replace(intent, '10000', '500000') WHERE payment_id = '{paid}';
         UPDATE payments SET amount_minor = 500000 WHERE id = '{paid}';
         UPDATE postings SET amount_minor = amount_minor * 50 WHERE payment_id = '{paid}';"
    ))
    .unwrap();
    let app = spawn_on(
        dir.path(),
        &[
            ("PAYGATE_AUDIT__SEAL_EVERY_SECS", "1"),
            ("PAYGATE_AUDIT__UNSEALED_SLACK_SECS", "1"),
            ("PAYGATE_JOBS__TICK_MS", "20"),
        ],
    )
    .await;
    app.running.gateway.seal_audit_at_stop().await;
    let linked: i64 = db
        .query_row(
            &format!(
                "SELECT COUNT(*) FROM audit_chain c JOIN audit_records a ON a.seq = c.seq WHERE a.payment_id = '{paid}'"
            ),
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(linked, 0, "the stripped, rewritten record is never sealed");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let v = loop {
        let v = verify(&app).await;
        if v["ok"] == false || std::time::Instant::now() > deadline {
            break v;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(v["ok"], false, "{v}");
    let reason = v["first_break"]["reason"].as_str().unwrap();
    // Named at once when the new start's own records were sealed after them, else once stale.
    assert!(reason.contains("tag was removed") || reason.contains("not sealed"), "{reason}");
    app.stop().await;
}

/// The eleventh hostile review: with a replica running, the chain tables emptied; the replica
/// re-sealed from position 1, below the head it had signed itself, without a word (the log showed
/// the signed position going back). A replica remembers the highest head its sealing runs saw: a
/// lower one is recorded as an `audit.witness` record, which verify names from then on.
#[tokio::test]
async fn a_running_replica_names_its_chain_head_going_back() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_AUDIT__SEAL_EVERY_SECS", "1"), ("PAYGATE_JOBS__TICK_MS", "20")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    for op in ["op-1", "op-2", "op-3"] {
        ok(&call(&agent, "create_payment", pay(op, "1.00", "tea")).await);
    }
    let _ = agent.cancel().await;
    let store = app.running.store.clone();
    let poll = |what: &'static str| {
        let store = store.clone();
        async move {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let done = match what {
                    "sealed" => store.audit_chain_head().await.unwrap().chain_seq >= 3,
                    _ => store.audit_first_of_tool("audit.witness").await.unwrap().is_some(),
                };
                if done {
                    return;
                }
                assert!(std::time::Instant::now() < deadline, "timed out waiting: {what}");
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
            }
        }
    };
    poll("sealed").await;
    let db = store_db(dir.path());
    db.execute_batch("DELETE FROM audit_chain; DELETE FROM audit_chain_head; DELETE FROM audit_checkpoints;").unwrap();
    poll("witnessed").await;
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    let reason = v["first_break"]["reason"].as_str().unwrap();
    assert!(reason.contains("went back"), "{reason}");
    app.stop().await;
}

/// The twelfth hostile review (high): with the gateway stopped, sealed records deleted (an
/// approval, a `payees.add`, a whole payment with its record, a witness's report) and the chain
/// tables emptied; the next start sealed what was left from position 1 with the gateway's own
/// keyed links, and verify said ok. A chain is begun only over records younger than the sealing
/// interval (a store's first records are sealed within it): older ones before an empty chain stay
/// unsealed, and verify names them.
#[tokio::test]
async fn a_chain_deleted_on_a_stopped_store_is_never_begun_again() {
    let dir = tempfile::tempdir().unwrap();
    // The trail made an hour ago (the clock the first gateway ran on).
    let then = paygate::clock::ManualClock::new(SystemClock.now() - 3_600);
    let app = spawn_with_clock(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")], Arc::new(then)).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    for op in ["op-1", "op-2", "op-3"] {
        ok(&call(&agent, "create_payment", pay(op, "1.00", "tea")).await);
    }
    let foreign = json!({"operation_id": "f-1", "from_account": "acct-A", "to_account": "acct-Z",
                         "amount": "1.00", "currency": "KES"});
    assert_eq!(err(&call(&agent, "create_payment", foreign).await)["code"], "ACCOUNT_NOT_ALLOWED");
    let _ = agent.cancel().await;
    app.running.gateway.seal_audit_at_stop().await;
    app.stop().await;
    let db = store_db(dir.path());
    db.execute_batch(
        "DELETE FROM audit_records WHERE code = 'ACCOUNT_NOT_ALLOWED';
         DELETE FROM audit_chain; DELETE FROM audit_chain_head; DELETE FROM audit_checkpoints;",
    )
    .unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    app.running.gateway.seal_audit_at_stop().await;
    let links: i64 = db.query_row("SELECT COUNT(*) FROM audit_chain", [], |r| r.get(0)).unwrap();
    assert_eq!(links, 0, "the chain is not begun again over the hour-old records");
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    let reason = v["first_break"]["reason"].as_str().unwrap();
    assert!(reason.contains("not sealed"), "{reason}");
    app.stop().await;
    // `paygate serve` refuses the store (its policy and payments are not what the trail proves).
    let mut serve = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
        .env_remove("PAYGATE_CONFIG")
        .env("PAYGATE_STORAGE__DATA_DIR", dir.path())
        .env("PAYGATE_AUTH__DEV_ISSUER", DEV_ISSUER)
        .env("PAYGATE_SERVER__BIND", "127.0.0.1:0")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = serve.try_wait().unwrap() {
            break Some(status);
        }
        if std::time::Instant::now() > deadline {
            let _ = serve.kill();
            break None;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(serve.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    assert!(status.is_some_and(|s| !s.success()), "serve ran on a store whose chain was deleted: {stderr}");
    assert!(stderr.contains("chain was deleted"), "{stderr}");
}

/// Found reading the policy versions' tag: it proves a version is the gateway's, not that it is
/// the newest. A database writer deleting the newest version (an incident's narrowing) rolled
/// policy back at the next restart. The trail records each applied version: verify names the
/// rollback, a replica in force on a deleted version logs it, and the store does not start.
#[tokio::test]
async fn policy_rolled_back_by_deleting_its_newest_version_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let g = &app.running.gateway;
    let before = g.policy().version;
    let db = store_db(dir.path());
    let (_, doc) = with_kes_limit(&db, before, "500.00");
    let admin = app.operator_token("alice", "payments:admin");
    let (status, body) = operator(
        &app,
        Method::POST,
        "/operator/v1/policy/proposals",
        &admin,
        Some(json!({"document": doc, "reason": "incident: lower the limit"})),
    )
    .await;
    assert_eq!((status, body["status"].clone()), (StatusCode::OK, json!("applied")), "{body}");
    assert_eq!(g.policy().version, before + 1);
    // A call judged under the new version names it too.
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    ok(&call(&agent, "create_payment", pay("after", "1.00", "tea")).await);
    let _ = agent.cancel().await;
    assert_eq!(verify(&app).await["ok"], true);
    db.execute("DELETE FROM policy_versions WHERE version = ?1", [before + 1]).unwrap();
    let v = verify(&app).await;
    assert_eq!(v["ok"], false, "{v}");
    let reason = v["first_break"]["reason"].as_str().unwrap();
    assert!(reason.contains(&format!("version {}", before + 1)) && reason.contains("deleted"), "{reason}");
    g.refresh_policy().await.unwrap();
    assert_eq!(g.policy().version, before + 1, "a replica never goes back");
    // Seventh review (F1): nothing is built on the rolled-back store either (a decided widening
    // re-opened and approved there would have replaced the incident's narrowing).
    let (status, body) = operator(
        &app,
        Method::POST,
        "/operator/v1/policy/proposals",
        &admin,
        Some(json!({"document": doc, "reason": "again"})),
    )
    .await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("rolled back"), "{body}");
    app.stop().await;
    // The change's own record rewritten to name the older version as well (verify names that
    // edit): the calls judged under the deleted version still name it, and the store does not start.
    db.execute(
        "UPDATE audit_records SET policy_version = ?1 WHERE tool LIKE 'policy.%' AND decision = 'applied'",
        [before],
    )
    .unwrap();
    let again =
        paygate::app::start(config_for(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]), Arc::new(SystemClock)).await;
    let error = again.err().expect("a rolled-back policy does not start").to_string();
    assert!(error.contains("rolled back"), "{error}");
}

/// The sixth hostile review (F1, high): policy proposals carried no tag, so a database writer
/// rewrote a pending widening's author (alice's became "bob's") or inserted a whole proposal "by
/// bob", and alice alone approved it: one person widened policy. A proposal carries the gateway's
/// tag over what its author wrote; one that does not hold is never decided.
#[tokio::test]
async fn a_policy_proposal_whose_author_was_rewritten_is_never_decided() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let version = app.running.gateway.policy().version;
    let db = store_db(dir.path());
    let (_, doc) = with_kes_limit(&db, version, "900000.00");
    let alice = app.operator_token("alice", "payments:admin");
    let propose = json!({"document": doc, "reason": "widen", "base_version": version});
    let (status, body) = operator(&app, Method::POST, "/operator/v1/policy/proposals", &alice, Some(propose)).await;
    assert_eq!((status, body["status"].clone()), (StatusCode::ACCEPTED, json!("pending")), "{body}");
    let id = body["proposal_id"].as_str().unwrap().to_string();
    let approve = |id: &str| {
        let path = format!("/operator/v1/policy/proposals/{id}/approve");
        let (app, alice) = (&app, alice.clone());
        async move { operator(app, Method::POST, &path, &alice, Some(json!({}))).await }
    };
    assert_eq!(approve(&id).await.1["error"]["code"], "SELF_REVIEW");
    db.execute("UPDATE policy_proposals SET author_sub = 'bob' WHERE id = ?1", [&id]).unwrap();
    let (status, body) = approve(&id).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("tag does not hold"), "{body}");
    // A whole proposal inserted "by bob".
    db.execute(
        "INSERT INTO policy_proposals (id, base_version, document, author_iss, author_sub, reason, created_at, status)
         SELECT 'pol_inserted', base_version, document, author_iss, 'bob', 'routine', created_at, 'pending'
         FROM policy_proposals WHERE id = ?1",
        [&id],
    )
    .unwrap();
    let (status, body) = approve("pol_inserted").await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    // Seventh review (F2): a proposal bob withdrew (rejected), set back to pending in the database.
    db.execute("DELETE FROM policy_proposals WHERE id = 'pol_inserted'", []).unwrap();
    db.execute("UPDATE policy_proposals SET author_sub = 'alice' WHERE id = ?1", [&id]).unwrap();
    let bob = app.operator_token("bob", "payments:admin");
    let propose = json!({"document": doc, "reason": "widen, bob's", "base_version": version});
    let (_, body) = operator(&app, Method::POST, "/operator/v1/policy/proposals", &bob, Some(propose)).await;
    let bobs = body["proposal_id"].as_str().unwrap().to_string();
    let path = format!("/operator/v1/policy/proposals/{bobs}/reject");
    let (status, body) = operator(&app, Method::POST, &path, &bob, Some(json!({"reason": "withdrawn"}))).await;
    assert!(status.is_success(), "{body}");
    db.execute(
        "UPDATE policy_proposals SET status = 'pending', decided_iss = NULL, decided_sub = NULL, decided_at = NULL
         WHERE id = ?1",
        [&bobs],
    )
    .unwrap();
    let (status, body) = approve(&bobs).await;
    assert_eq!(status, StatusCode::CONFLICT, "{body}");
    assert!(body.to_string().contains("tag does not hold"), "{body}");
    assert_eq!(app.running.gateway.policy().version, version, "nothing applied");
    app.stop().await;
}

/// The sixth hostile review (F2, high): a payment's postings rewritten — its credit moved to an
/// account off the allow-list, or both legs multiplied by 100, balances recomputed — while the
/// payment row and the trail stayed as decided: verify, the full integrity check and
/// reconciliation all said ok. The integrity check holds each payment's postings to the payment:
/// one debit of its amount from its payer, one credit of it to its payee, in its currency.
#[tokio::test]
async fn a_payments_postings_rewritten_are_named_by_the_integrity_check() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let paid = ok(&call(&agent, "create_payment", pay("op-1", "400.00", "supplies")).await)["payment_id"].clone();
    let paid = paid.as_str().unwrap();
    let store = &app.running.store;
    assert!(store.ledger_integrity().await.unwrap().ok);
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
    // Balances recomputed from the postings, as a careful writer would.
    let rebalance = "UPDATE accounts SET balance_minor = (SELECT COALESCE(SUM(amount_minor), 0) FROM postings
                                                          WHERE account_id = accounts.id)";
    let reset = format!(
        "UPDATE postings SET account_id = 'acct-B', amount_minor = 40000 WHERE payment_id = '{paid}' AND amount_minor > 0;
         UPDATE postings SET amount_minor = -40000 WHERE payment_id = '{paid}' AND amount_minor < 0; {rebalance};"
    );
    for tamper in [
        format!("UPDATE postings SET account_id = 'acct-Z' WHERE payment_id = '{paid}' AND amount_minor > 0"),
        format!("UPDATE postings SET amount_minor = amount_minor * 100 WHERE payment_id = '{paid}'"),
    ] {
        db.execute_batch(&format!("{tamper}; {rebalance};")).unwrap();
        let report = store.ledger_integrity().await.unwrap();
        db.execute_batch(&reset).unwrap();
        assert!(!report.ok, "{tamper}: {report:?}");
        assert!(report.problems.iter().any(|p| p.contains(paid)), "{tamper}: {report:?}");
    }
    assert!(store.ledger_integrity().await.unwrap().ok, "put back, it holds");
    // Seventh review (F3): a refunded payment's `refunded_minor` set back to 0 (a second refund
    // would then go through) is named: it must equal the sum of its refunds.
    let refund = json!({"operation_id": "r-1", "payment_id": paid, "amount": "100.00", "reason": "returned"});
    ok(&call(&agent, "refund_payment", refund).await);
    assert!(store.ledger_integrity().await.unwrap().ok);
    db.execute_batch(&format!("UPDATE payments SET refunded_minor = 0 WHERE id = '{paid}'")).unwrap();
    let report = store.ledger_integrity().await.unwrap();
    assert!(!report.ok && report.problems.iter().any(|p| p.contains(paid)), "{report:?}");
    // ... and the reset column does not refund the same money twice: 300.00 is all that is left.
    let before = ok(&call(&agent, "get_balance", json!({"account_id": "acct-B"})).await)["balance"].clone();
    let again = json!({"operation_id": "r-2", "payment_id": paid, "amount": "400.00", "reason": "returned"});
    assert_eq!(code(&call(&agent, "refund_payment", again).await), "INVALID_ARGUMENT");
    assert_eq!(ok(&call(&agent, "get_balance", json!({"account_id": "acct-B"})).await)["balance"], before);
    let _ = agent.cancel().await;
    app.stop().await;
}

/// The ninth hostile review (medium): the day's budget counter deleted mid-day let the agent pay
/// past its daily limit (169,550 against 100,000), and nothing named it. The full integrity check
/// holds each usage counter (payments' and refunds') to the payments it counts.
#[tokio::test]
async fn a_usage_counter_reset_in_the_database_is_named_by_the_integrity_check() {
    let dir = tempfile::tempdir().unwrap();
    let app = spawn_on(dir.path(), &[("PAYGATE_JOBS__ENABLED", "false")]).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let paid = ok(&call(&agent, "create_payment", pay("op-1", "40.00", "x")).await)["payment_id"].clone();
    ok(&call(&agent, "create_payment", pay("op-2", "2.00", "y")).await);
    let refund = json!({"operation_id": "r-1", "payment_id": paid, "amount": "10.00", "reason": "returned"});
    ok(&call(&agent, "refund_payment", refund).await);
    let store = &app.running.store;
    assert!(store.ledger_integrity().await.unwrap().ok, "as made, it holds");
    let db = store_db(dir.path());
    for (table, tamper) in [
        ("budget_usage", "DELETE FROM budget_usage"),
        ("budget_usage", "UPDATE budget_usage SET spent_minor = 4000"),
        ("budget_usage", "UPDATE budget_usage SET payments = 1"),
        ("refund_usage", "DELETE FROM refund_usage"),
    ] {
        db.execute_batch(&format!("CREATE TABLE saved AS SELECT * FROM {table}; {tamper};")).unwrap();
        let report = store.ledger_integrity().await.unwrap();
        db.execute_batch(&format!("DELETE FROM {table}; INSERT INTO {table} SELECT * FROM saved; DROP TABLE saved;"))
            .unwrap();
        assert!(!report.ok, "{tamper}: {report:?}");
        assert!(report.problems.iter().any(|p| p.contains(table) && p.contains("dev-agent")), "{tamper}: {report:?}");
    }
    assert!(store.ledger_integrity().await.unwrap().ok, "put back, it holds");
    let _ = agent.cancel().await;
    app.stop().await;
}

/// F2 of the same review: emptying every audit table passed `audit verify` without a witness.
/// Payments the trail does not know about are a trail emptied (or cut back past them).
#[tokio::test]
async fn an_emptied_audit_trail_is_named_without_a_witness() {
    let (app, dir) = spawn_app().await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    ok(&call(&agent, "create_payment", pay("one", "2.00", "x")).await);
    ok(&call(&agent, "create_payment", pay("two", "3.00", "y")).await);
    let _ = agent.cancel().await;
    app.stop().await;
    let db = rusqlite::Connection::open(dir.path().join("paygate.sqlite3")).unwrap();
    db.execute_batch(
        "DELETE FROM audit_records; DELETE FROM audit_chain; DELETE FROM audit_checkpoints;
         DELETE FROM audit_chain_head; DELETE FROM sqlite_sequence WHERE name = 'audit_records';",
    )
    .unwrap();
    drop(db);
    // `paygate audit verify` on the stopped store, as the reviewer ran it.
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"))
        .args(["audit", "verify"])
        .env_remove("PAYGATE_CONFIG")
        .env("PAYGATE_STORAGE__DATA_DIR", dir.path())
        .env("PAYGATE_AUTH__DEV_ISSUER", DEV_ISSUER)
        .output()
        .unwrap();
    let v: Value = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    assert_eq!(
        (out.status.code(), v["ok"].clone()),
        (Some(1), json!(false)),
        "{v} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(v["first_break"]["reason"].as_str().unwrap().contains("the trail was emptied"), "{v}");
}
