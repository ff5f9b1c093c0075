//! Two paygate processes on one PostgreSQL database: exactly-once, closed mandates and budgets
//! hold when duplicates land on different replicas. Needs PAYGATE_TEST_DATABASE_URL (skipped
//! without it, saying so); `.ci/run` sets it.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::sync::Arc;

use common::*;
use serde_json::{Value, json};
use tokio::sync::Barrier;

/// Quotas raised so the rate limiter is not what this test measures; everything else is default.
const PROFILES: &str = r#"
[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "100000.00" }
daily_payments_max = 100000
calls_per_minute = 100000
tool_calls_per_minute = {}
"#;

/// Two replicas sharing the database and every secret, behind one public URL.
fn replicas(db: &Db, dir: &std::path::Path, extra: &str) -> (Proc, Proc) {
    replicas_with(db, dir, &format!("{PROFILES}{extra}"), &[])
}

fn replicas_with(db: &Db, dir: &std::path::Path, toml: &str, more_env: &[(&str, &str)]) -> (Proc, Proc) {
    let config = dir.join("replicas.toml");
    std::fs::write(&config, toml).unwrap();
    let env = [
        ("PAYGATE_CONFIG", config.to_str().unwrap()),
        ("PAYGATE_STORAGE__URL", db.url.as_str()),
        ("PAYGATE_STORAGE__POSTGRES_SCHEMA", db.schema.as_str()),
        ("PAYGATE_SERVER__PUBLIC_URL", "http://127.0.0.1:9"),
        ("PAYGATE_AUTH__DEV_KEY", "cmVwbGljYS10ZXN0LWRldi1rZXktMzItYnl0ZXMhIQ=="),
        ("PAYGATE_IDEMPOTENCY__SECRET", "cmVwbGljYS10ZXN0LWlkZW1wb3RlbmN5LXNlY3JldA=="),
        ("PAYGATE_MANDATES__SECRET", "cmVwbGljYS10ZXN0LW1hbmRhdGUtc2lnbmluZy1rZXk="),
        ("PAYGATE_DEV__SCOPES", "payments:read payments:create payments:refund"),
    ];
    let with_data = |n: &str| {
        let d = dir.join(n);
        std::fs::create_dir_all(&d).unwrap();
        let mut e: Vec<(&str, String)> = env.iter().chain(more_env).map(|(k, v)| (*k, v.to_string())).collect();
        e.push(("PAYGATE_STORAGE__DATA_DIR", d.display().to_string()));
        let refs: Vec<(&str, &str)> = e.iter().map(|(k, v)| (*k, v.as_str())).collect();
        spawn_binary(&refs)
    };
    let a = with_data("a");
    let b = with_data("b");
    (a, b)
}

/// The public URL is the load balancer's; each replica is reached at its own address.
async fn clients(p: &Proc, n: usize) -> Vec<Arc<Client>> {
    let mut v = Vec::new();
    for _ in 0..n {
        v.push(Arc::new(connect(&p.url, &p.token, Era::Modern).await));
    }
    v
}

fn pay(op: &str, amount: &str, mandate: Option<&str>) -> Value {
    let mut v = json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"});
    if let Some(m) = mandate {
        v["mandate"] = json!(m);
    }
    v
}

/// 64 concurrent calls, half on each replica; returns (fresh, replayed, other results).
async fn storm(all: &[Arc<Client>], args: impl Fn(usize) -> Value) -> (usize, usize, Vec<String>) {
    let barrier = Arc::new(Barrier::new(64));
    let mut tasks = tokio::task::JoinSet::new();
    for n in 0..64 {
        let (client, barrier, a) = (all[n % all.len()].clone(), barrier.clone(), args(n));
        tasks.spawn(async move {
            barrier.wait().await;
            call(&client, "create_payment", a).await
        });
    }
    let (mut fresh, mut replayed, mut other) = (0, 0, Vec::new());
    while let Some(r) = tasks.join_next().await {
        let r = r.unwrap();
        match (r.is_error, &r.structured_content) {
            (Some(true), Some(v)) => other.push(v["error"]["code"].as_str().unwrap_or("?").to_string()),
            (_, Some(v)) if v["replayed"] == true => replayed += 1,
            _ => fresh += 1,
        }
    }
    (fresh, replayed, other)
}

/// Issue 53: replicas starting at once on a fresh custom schema raced on `CREATE SCHEMA IF NOT
/// EXISTS` (before the migration lock) and the losers failed to start (23505).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn replicas_starting_at_once_on_a_fresh_schema_all_migrate() {
    let Some(db) = database("replicas (fresh schema)") else { return };
    for round in 0..3 {
        let schema = format!("{}_{round}", db.schema);
        let starts: Vec<_> = (0..6)
            .map(|_| {
                let (url, schema) = (db.url.clone(), schema.clone());
                tokio::spawn(async move { paygate::store::postgres::PostgresStore::connect(&url, &schema).await })
            })
            .collect();
        for start in starts {
            if let Err(e) = start.await.unwrap() {
                panic!("round {round}: a replica failed to migrate a fresh schema: {e}");
            }
        }
        let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(conn);
        client.batch_execute(&format!("DROP SCHEMA {schema} CASCADE")).await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn two_replicas_pay_each_operation_once() {
    let Some(db) = database("replicas") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = replicas(&db, dir.path(), "");
    let mut all = clients(&a, 4).await;
    all.extend(clients(&b, 4).await);

    const ROUNDS: usize = 200;
    for round in 0..ROUNDS {
        let op = format!("round-{round}");
        let (fresh, replayed, other) = storm(&all, |_| pay(&op, "1.00", None)).await;
        assert_eq!((fresh, replayed, other.len()), (1, 63, 0), "round {round}: {other:?}");
    }
    let c = &all[0];
    assert_eq!(balance(c, "acct-B").await, format!("{ROUNDS}.00"));
    let store = paygate::store::postgres::PostgresStore::connect(&db.url, &db.schema).await.unwrap();
    let report = paygate::store::LedgerStore::ledger_integrity(&store).await.unwrap();
    assert!(report.ok, "{:?}", report.problems);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_closed_mandate_and_a_budget_hold_across_replicas() {
    let Some(db) = database("replicas") else { return };
    let dir = tempfile::tempdir().unwrap();
    // The refused second operation_ids are policy denials; keep the stop rules out of this test.
    let (a, b) = replicas(&db, dir.path(), "\n[stop_rules]\ndenials_max = 10000\nrepeat_max = 0\n");
    let mut all = clients(&a, 4).await;
    all.extend(clients(&b, 4).await);

    // A closed mandate, pre-authorized by an operator on replica A ...
    let ops_token = {
        let key = "cmVwbGljYS10ZXN0LWRldi1rZXktMzItYnl0ZXMhIQ==";
        paygate::auth::mint_dev_token(
            &paygate::auth::Secret::new(key.into()),
            DEV_ISSUER,
            "http://127.0.0.1:9/operator",
            "alice",
            "payments:approve",
            now_secs(),
            600,
        )
        .unwrap()
    };
    let base_a = a.url.trim_end_matches("/mcp").to_string();
    let resp = reqwest::Client::new()
        .post(format!("{base_a}/approvals"))
        .bearer_auth(&ops_token)
        .json(&json!({"subject": "dev-agent", "kind": "closed", "currency": "KES",
                      "payer": "acct-A", "payee": "acct-B", "amount": "2500.00"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 201);
    let approval: Value = resp.json().await.unwrap();
    // ... fetched by the agent on replica B ...
    let r = call(&all[4], "get_approval", json!({"approval_id": approval["approval_id"]})).await;
    let mandate = ok(&r)["mandate"].as_str().unwrap().to_string();
    // ... pays once, whichever replica each of 64 racing calls reaches, with two operation_ids.
    let (fresh, replayed, other) =
        storm(&all, |n| pay(&format!("mandated-{}", n % 2), "2500.00", Some(&mandate))).await;
    assert_eq!(fresh, 1, "one payment: {other:?}");
    assert_eq!(replayed + other.len(), 63);
    assert!(other.iter().all(|c| c == "MANDATE_INVALID"), "the other operation_id is refused: {other:?}");
    assert_eq!(balance(&all[0], "acct-B").await, "2500.00");

    // Budgets: today's limit is 100000.00 and the mandated 2500.00 counts toward it, so exactly 97
    // more autonomous payments of 1000.00 fit: two storms of 64 racing calls across both replicas
    // get 64, then 33.
    let (fresh, _, other) = storm(&all, |n| pay(&format!("budget-{n}"), "1000.00", None)).await;
    assert_eq!(fresh, 64, "{other:?}");
    let (fresh, _, other) = storm(&all, |n| pay(&format!("budget-2-{n}"), "1000.00", None)).await;
    assert_eq!(fresh, 33, "{other:?}");
    assert!(other.iter().all(|c| c == "BUDGET_EXCEEDED"), "{other:?}");
    assert_eq!(balance(&all[0], "acct-B").await, "99500.00");
}

/// An operator token for both replicas (they share the dev key and the public URL).
fn operator_token(sub: &str, scope: &str) -> String {
    paygate::auth::mint_dev_token(
        &paygate::auth::Secret::new("cmVwbGljYS10ZXN0LWRldi1rZXktMzItYnl0ZXMhIQ==".into()),
        DEV_ISSUER,
        "http://127.0.0.1:9/operator",
        sub,
        scope,
        now_secs(),
        600,
    )
    .unwrap()
}

async fn preflight(client: &Client, op: &str, amount: &str) -> String {
    let r = call(client, "check_payment_policy", json!({"tool": "create_payment", "arguments": pay(op, amount, None)}))
        .await;
    ok(&r)["verdict"].as_str().unwrap().to_string()
}

/// Policy is data: an operator lowers the agent's autonomous limit through replica A's operator
/// API; within `policy.refresh_secs` (2 s) replica B judges under the new version too, both refuse
/// to pay alone what they paid before, and the audit rows name the version before and after.
#[tokio::test]
async fn a_limit_lowered_on_one_replica_is_in_force_on_both_within_refresh_secs() {
    let Some(db) = database("replicas") else { return };
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = replicas(&db, dir.path(), "");
    let (ca, cb) = (connect(&a.url, &a.token, Era::Modern).await, connect(&b.url, &b.token, Era::Modern).await);
    for (client, op) in [(&ca, "before-a"), (&cb, "before-b")] {
        let r = call(client, "create_payment", pay(op, "800.00", None)).await;
        assert_eq!(ok(&r)["status"], "succeeded", "{r:?}");
    }
    let base_a = a.url.trim_end_matches("/mcp").to_string();
    let alice = operator_token("alice", "payments:admin payments:audit");
    let http = reqwest::Client::new();
    let policy: Value = http
        .get(format!("{base_a}/operator/v1/policy"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(policy["version"], 1, "{policy}");
    let mut doc = policy["document"].clone();
    for p in doc["policy"]["profiles"].as_array_mut().unwrap() {
        if p["name"] == "dev" {
            p["autonomous_limit"] = json!({"KES": "500.00"});
        }
    }
    let resp = http
        .post(format!("{base_a}/operator/v1/policy/proposals"))
        .bearer_auth(&alice)
        .json(&json!({"document": doc, "reason": "incident: lower dev-agent", "base_version": 1}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let applied = std::time::Instant::now();
    // Replica A applied it itself; B picks it up on its next poll. The deadline is generous (three
    // refresh periods) so a loaded machine does not fail it; the elapsed time is printed.
    let deadline = applied + std::time::Duration::from_secs(6);
    let mut n = 0;
    for (name, client) in [("a", &ca), ("b", &cb)] {
        loop {
            n += 1;
            let verdict = preflight(client, &format!("probe-{n}"), "800.00").await;
            if verdict == "approval_required" {
                eprintln!("replica {name} under the new version after {:?}", applied.elapsed());
                break;
            }
            assert_eq!(verdict, "allowed");
            assert!(
                std::time::Instant::now() < deadline,
                "replica {name} still allows 800.00 after {:?}",
                applied.elapsed()
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }
    for (client, op) in [(&ca, "after-a"), (&cb, "after-b")] {
        let r = call(client, "create_payment", pay(op, "800.00", None)).await;
        assert_eq!(code(&r), "APPROVAL_REQUIRED", "{op}: {r:?}");
    }
    // The audit rows name the version each call was judged under.
    let audit: Value = http
        .get(format!("{base_a}/operator/v1/audit?agent=dev-agent&tool=create_payment&limit=100"))
        .bearer_auth(&alice)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let mut seen: Vec<(String, i64)> = audit["items"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|r| r["decision"] == "allowed" || r["decision"] == "approval_required")
        .map(|r| (r["decision"].as_str().unwrap().to_string(), r["policy_version"].as_i64().unwrap()))
        .collect();
    seen.sort();
    let want = |d: &str, v: i64| (d.to_string(), v);
    assert_eq!(
        seen,
        vec![want("allowed", 1), want("allowed", 1), want("approval_required", 2), want("approval_required", 2)],
        "{audit}"
    );
}

/// One agent's `calls_per_minute` holds across two replicas within 10% (`limits.quotas`, "auto" on
/// PostgreSQL: shared); the same burst with quotas kept per replica gets about twice through, so
/// the count tells the two apart.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn one_agents_quota_holds_across_two_replicas_within_ten_percent() {
    const QUOTA: usize = 60;
    const CALLS: usize = 240;
    let profiles = format!(
        "[[policy.profiles]]\nname = \"default\"\n\n[[policy.profiles]]\nname = \"dev\"\nsubjects = [\"dev-agent\"]\n\
         allowed_accounts = [\"acct-A\", \"acct-B\"]\ncalls_per_minute = {QUOTA}\ntool_calls_per_minute = {{}}\n"
    );
    let mut through = Vec::new();
    for quotas in ["auto", "replica"] {
        let Some(db) = database("replicas: one agent's quota") else { return };
        let dir = tempfile::tempdir().unwrap();
        // RATE_LIMITED answers must not suspend the agent mid-burst: this test counts them.
        let env = [("PAYGATE_LIMITS__QUOTAS", quotas), ("PAYGATE_STOP_RULES__RATE_LIMITED_PER_DENIAL", "0")];
        let (a, b) = replicas_with(&db, dir.path(), &profiles, &env);
        let mut all = clients(&a, 3).await;
        all.extend(clients(&b, 3).await);
        let started = std::time::Instant::now();
        let mut tasks = tokio::task::JoinSet::new();
        for n in 0..CALLS {
            let client = all[n % all.len()].clone();
            tasks.spawn(async move { call(&client, "get_balance", json!({"account_id": "acct-A"})).await });
        }
        let (mut ok, mut limited) = (0usize, 0usize);
        while let Some(r) = tasks.join_next().await {
            let r = r.unwrap();
            match r.is_error {
                Some(true) => {
                    assert_eq!(code(&r), "RATE_LIMITED");
                    limited += 1;
                }
                _ => ok += 1,
            }
        }
        // The bucket holds QUOTA and refills one a second: what the quota allows in this time.
        let allowed = QUOTA + started.elapsed().as_secs() as usize + 1;
        eprintln!("quotas = {quotas}: {ok} through, {limited} limited, {allowed} allowed by one bucket");
        through.push((ok, allowed));
    }
    let ((shared, allowed), (per_replica, _)) = (through[0], through[1]);
    assert!(shared as f64 <= allowed as f64 * 1.1, "shared: {shared} through, one bucket allows {allowed}");
    assert!(shared as f64 >= QUOTA as f64 * 0.9, "shared: {shared} through, the quota is {QUOTA}");
    assert!(per_replica >= QUOTA * 3 / 2, "per replica: {per_replica} through: the test no longer tells them apart");
}
