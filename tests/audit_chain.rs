//! The audit trail is tamper-evident, in each engine's own database: a real gateway writes a trail
//! through MCP calls, it is sealed onto the hash chain and checkpointed (Ed25519), and then the
//! rows are edited, deleted, reordered, rewritten hash by hash and cut short directly in SQLite
//! or PostgreSQL. `paygate audit verify` (the CLI, another process) names the first broken record
//! each time; the operator route answers the same. Retention's archive files and the live rows
//! verify as one chain. PostgreSQL cases need PAYGATE_TEST_DATABASE_URL (skipped, said, without).
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::*;
use paygate::clock::{Clock, ManualClock, SystemClock};
use paygate::domain::audit_chain::{ChainLink, link_hash};
use reqwest::Method;
use serde_json::{Value, json};

/// Where the trail lives, and a raw connection to it (no paygate code).
enum Engine {
    Sqlite(PathBuf),
    Postgres { url: String, schema: String },
}

impl Engine {
    fn label(&self) -> &'static str {
        match self {
            Engine::Sqlite(_) => "sqlite",
            Engine::Postgres { .. } => "postgres",
        }
    }

    /// Run statements directly against the database, as someone with database access would.
    async fn tamper(&self, sql: &str) {
        match self {
            Engine::Sqlite(dir) => {
                let db = rusqlite::Connection::open(dir.join("paygate.sqlite3")).unwrap();
                db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
                db.execute_batch(sql).unwrap();
            }
            Engine::Postgres { url, schema } => {
                let (client, conn) = tokio_postgres::connect(url, tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(conn);
                client.batch_execute(&format!("SET search_path TO {schema}; {sql}")).await.unwrap();
            }
        }
    }
}

struct Trail {
    app: TestApp,
    engine: Engine,
    dir: tempfile::TempDir,
    env: Vec<(String, String)>,
    /// Every link, in order, with its record, as sealed.
    links: Vec<ChainLink>,
    /// Positions of the signed checkpoints.
    checkpoints: Vec<i64>,
    _db: Option<Db>,
}

/// Seal everything committed (on PostgreSQL a record waits for every older transaction on the
/// cluster to end; bounded), then sign a checkpoint if asked.
async fn seal(app: &TestApp, checkpoint: bool) {
    let store = &*app.running.store;
    for _ in 0..500 {
        store.audit_seal(1000).await.unwrap();
        if store.audit_unsealed().await.unwrap() == 0 {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    assert_eq!(store.audit_unsealed().await.unwrap(), 0, "everything sealed");
    let every = checkpoint.then_some(0);
    paygate::audit_chain::seal(
        store,
        &**app.running.gateway.mandate_keys(),
        app.running.gateway.clock().now(),
        1000,
        every,
    )
    .await
    .unwrap();
}

/// A trail of a few dozen records: payments allowed and refused, an approval asked for and
/// granted. Checkpoints after the first and second parts; the third part is after the last one.
async fn trail(pg: bool, clock: Arc<dyn Clock>) -> Option<Trail> {
    let dir = tempfile::tempdir().unwrap();
    let mut env: Vec<(String, String)> = vec![
        ("PAYGATE_STORAGE__DATA_DIR".into(), dir.path().display().to_string()),
        ("PAYGATE_AUTH__DEV_ISSUER".into(), "https://dev.paygate.test".into()),
        // The test seals and checkpoints by hand, where it wants them.
        ("PAYGATE_JOBS__ENABLED".into(), "false".into()),
    ];
    let db = if pg {
        let db = database("audit chain (postgres)")?;
        env.push(("PAYGATE_STORAGE__URL".into(), db.url.clone()));
        env.push(("PAYGATE_STORAGE__POSTGRES_SCHEMA".into(), db.schema.clone()));
        Some(db)
    } else {
        None
    };
    let overrides: Vec<(&str, &str)> = env.iter().skip(2).map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let app = spawn_with_clock(dir.path(), &overrides, clock).await;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let pay = |op: String, to: &str, amount: &str| json!({"operation_id": op, "from_account": "acct-A", "to_account": to, "amount": amount, "currency": "KES"});
    let mut checkpoints = Vec::new();
    for part in 0..3 {
        for i in 0..3 {
            call(&agent, "create_payment", pay(format!("p{part}-{i}"), "acct-B", "10.00")).await;
        }
        call(&agent, "create_payment", pay(format!("p{part}-foreign"), "acct-Z", "10.00")).await;
        let asked = call(&agent, "create_payment", pay(format!("p{part}-big"), "acct-B", "5000.00")).await;
        let approval_id = err(&asked)["approval_id"].as_str().unwrap().to_string();
        assert_eq!(approve(&app, &approval_id, "alice").await.0, 200);
        seal(&app, part < 2).await;
        if part < 2 {
            checkpoints.push(app.running.store.audit_checkpoint_latest().await.unwrap().unwrap().chain_seq);
        }
    }
    agent.cancel().await.unwrap();
    let links = app.running.store.audit_chain_links(0, 1000).await.unwrap();
    assert!(
        links.len() > 20 && checkpoints[1] < links.len() as i64,
        "{} links, checkpoints {checkpoints:?}",
        links.len()
    );
    let engine = match &db {
        Some(db) => Engine::Postgres { url: db.url.clone(), schema: db.schema.clone() },
        None => Engine::Sqlite(dir.path().to_path_buf()),
    };
    Some(Trail { app, engine, dir, env, links, checkpoints, _db: db })
}

/// `paygate audit verify` in another process: (exit code, verdict, stderr).
async fn verify_cli(t: &Trail, archive_dir: Option<&Path>) -> (i32, Value, String) {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"));
    cmd.args(["audit", "verify"]).env_remove("PAYGATE_CONFIG").env_remove("PAYGATE_MANDATES__SECRET");
    if let Some(dir) = archive_dir {
        cmd.arg("--archive-dir").arg(dir);
    }
    for (k, v) in &t.env {
        cmd.env(k, v);
    }
    let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
    let verdict = serde_json::from_slice(&out.stdout).unwrap_or(Value::Null);
    (out.status.code().unwrap_or(-1), verdict, String::from_utf8_lossy(&out.stderr).into_owned())
}

/// The CLI says the chain breaks at `position` (and, when given, names the record's seq).
async fn assert_breaks_at(t: &Trail, case: &str, position: i64, seq: Option<i64>) {
    let (code, verdict, stderr) = verify_cli(t, None).await;
    let label = format!("{} / {case}", t.engine.label());
    assert_eq!(code, 1, "{label}: {verdict} {stderr}");
    assert_eq!(verdict["ok"], false, "{label}");
    assert_eq!(verdict["first_break"]["chain_seq"], position, "{label}: {verdict}");
    assert!(stderr.contains(&format!("broken at chain position {position}")), "{label}: {stderr}");
    if let Some(seq) = seq {
        assert_eq!(verdict["first_break"]["seq"], seq, "{label}: {verdict}");
        assert!(stderr.contains(&format!("(record seq {seq})")), "{label}: {stderr}");
    }
}

/// Each tampering on a fresh trail in `engine`, each named at its first broken record.
async fn tampering_is_named(pg: bool) {
    let now = SystemClock.now();
    let clock = || Arc::new(ManualClock::new(now)) as Arc<dyn Clock>;

    // Untouched, it verifies: every link, both checkpoints.
    let Some(t) = trail(pg, clock()).await else { return };
    let (code, verdict, stderr) = verify_cli(&t, None).await;
    assert_eq!(code, 0, "{}: {verdict} {stderr}", t.engine.label());
    assert_eq!(verdict["checked"], t.links.len() as u64);
    assert_eq!(verdict["checkpoints_matched"], 2);
    // The operator route walks the same chain; an agent's token is not an operator's.
    let ops = t.app.operator_token("auditor", "payments:audit");
    let (status, body) = operator(&t.app, Method::GET, "/operator/v1/audit/verify", &ops, None).await;
    assert_eq!((status.as_u16(), body["ok"].clone()), (200, json!(true)), "{body}");
    let (status, _) = operator(&t.app, Method::GET, "/operator/v1/audit/verify", &t.app.dev_token(), None).await;
    assert_eq!(status, 401, "an agent token is refused");

    // 1. An edit of one record's contents.
    let victim = &t.links[4];
    t.engine.tamper(&format!("UPDATE audit_records SET detail = 'nothing to see' WHERE seq = {}", victim.seq)).await;
    assert_breaks_at(&t, "edit", victim.chain_seq, Some(victim.seq)).await;
    let (status, body) = operator(&t.app, Method::GET, "/operator/v1/audit/verify", &ops, None).await;
    assert_eq!(status, 200);
    assert_eq!((body["ok"].clone(), body["first_break"]["chain_seq"].clone()), (json!(false), json!(victim.chain_seq)));
    t.app.stop().await;

    // 2. A record deleted.
    let t = trail(pg, clock()).await.unwrap();
    let victim = &t.links[7];
    t.engine.tamper(&format!("DELETE FROM audit_records WHERE seq = {}", victim.seq)).await;
    assert_breaks_at(&t, "delete", victim.chain_seq, Some(victim.seq)).await;
    t.app.stop().await;

    // 3. Two records reordered (their seqs swapped).
    let t = trail(pg, clock()).await.unwrap();
    let (a, b) = (t.links[2].seq, t.links[9].seq);
    t.engine
        .tamper(&format!(
            "UPDATE audit_records SET seq = -1 WHERE seq = {a};
             UPDATE audit_records SET seq = {a} WHERE seq = {b};
             UPDATE audit_records SET seq = {b} WHERE seq = -1;"
        ))
        .await;
    assert_breaks_at(&t, "reorder", t.links[2].chain_seq, None).await;
    t.app.stop().await;

    // 4. A record edited and every later link's hash recomputed (and the head): each link holds,
    //    the signed checkpoint after it does not.
    let t = trail(pg, clock()).await.unwrap();
    let mut prev = t.links[1].hash.clone();
    let mut sql = format!("UPDATE audit_records SET detail = 'rewritten' WHERE seq = {};", t.links[2].seq);
    for (i, link) in t.links.iter().enumerate().skip(2) {
        let mut record = link.record.clone().unwrap();
        if i == 2 {
            record.detail = Some("rewritten".into());
        }
        let hash = link_hash(&prev, link.chain_seq, &record);
        sql += &format!(
            "UPDATE audit_chain SET prev_hash = '{prev}', hash = '{hash}' WHERE chain_seq = {};",
            link.chain_seq
        );
        prev = hash;
    }
    sql += &format!("UPDATE audit_chain_head SET hash = '{prev}';");
    t.engine.tamper(&sql).await;
    assert_breaks_at(&t, "rewrite", t.checkpoints[0], None).await;
    t.app.stop().await;

    // 5. The tail cut off after the first checkpoint (records, links and head): the second
    //    checkpoint says those positions existed.
    let t = trail(pg, clock()).await.unwrap();
    let keep = t.checkpoints[0];
    let kept_hash = &t.links[keep as usize - 1].hash;
    t.engine
        .tamper(&format!(
            "DELETE FROM audit_records WHERE seq IN (SELECT seq FROM audit_chain WHERE chain_seq > {keep});
             DELETE FROM audit_chain WHERE chain_seq > {keep};
             UPDATE audit_chain_head SET chain_seq = {keep}, hash = '{kept_hash}';"
        ))
        .await;
    assert_breaks_at(&t, "cut tail", keep + 1, None).await;
    t.app.assert_secrets_not_logged();
    t.app.stop().await;
}

#[tokio::test]
async fn tampering_with_the_sqlite_trail_is_named_at_its_first_broken_record() {
    tampering_is_named(false).await;
}

#[tokio::test]
async fn tampering_with_the_postgres_trail_is_named_at_its_first_broken_record() {
    tampering_is_named(true).await;
}

/// Retention moves a checkpointed range of the chain to files: the database alone verifies from
/// that checkpoint on, files and database together verify as one chain from the start, and an
/// edit inside an archive file is named.
#[tokio::test]
async fn archived_and_live_records_verify_as_one_chain() {
    let clock = Arc::new(ManualClock::new(SystemClock.now() - 3 * 86_400));
    let t = trail(false, clock.clone()).await.unwrap();
    let store = &*t.app.running.store;
    let old = t.links.len() as i64;
    clock.advance(2 * 86_400);
    // More records, two days younger than the first.
    let agent = connect(&t.app.url, &t.app.dev_token(), Era::Modern).await;
    for i in 0..3 {
        call(&agent, "get_balance", json!({"account_id": format!("acct-{}", ["A", "B", "Z"][i])})).await;
    }
    agent.cancel().await.unwrap();
    seal(&t.app, false).await;
    let archive = t.dir.path().join("archive");
    let settings = paygate::audit_archive::Settings { retention_secs: 86_400, dir: archive.clone(), batch_max: 10 };
    let keys = t.app.running.gateway.mandate_keys().clone();
    let done = paygate::audit_archive::archive(store, &*keys, &settings, clock.now()).await.unwrap();
    assert_eq!(done.iter().map(|b| b.records as i64).sum::<i64>(), old, "every older record archived");
    assert_eq!(done.last().unwrap().last_chain_seq, old);
    assert_eq!(store.audit_chain_first().await.unwrap(), Some(old + 1), "the live chain starts after them");

    let (code, live, stderr) = verify_cli(&t, None).await;
    assert_eq!(code, 0, "{live} {stderr}");
    assert_eq!(live["from_chain_seq"], old + 1, "the walk starts at the range's checkpoint");
    let (code, whole, stderr) = verify_cli(&t, Some(&archive)).await;
    assert_eq!(code, 0, "{whole} {stderr}");
    assert_eq!(
        (whole["from_chain_seq"].clone(), whole["to_chain_seq"].clone()),
        (json!(1), live["to_chain_seq"].clone())
    );

    // An archived record edited in its file.
    let file = &done[1].file;
    let text = std::fs::read_to_string(file).unwrap();
    let mut lines: Vec<Value> = text.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    lines[3]["decision"] = json!("allowed");
    lines[3]["code"] = Value::Null;
    let edited = lines[3]["chain_seq"].as_i64().unwrap();
    let seq = lines[3]["seq"].as_i64().unwrap();
    std::fs::write(file, lines.iter().map(|l| format!("{l}\n")).collect::<String>()).unwrap();
    let (code, verdict, _) = verify_cli(&t, Some(&archive)).await;
    assert_eq!(code, 1, "{verdict}");
    assert_eq!(
        (verdict["first_break"]["chain_seq"].clone(), verdict["first_break"]["seq"].clone()),
        (json!(edited), json!(seq))
    );
    t.app.stop().await;
}

/// The mandate secret changes (it leaked): the checkpoints its keys signed no longer verify under
/// the new keys, and `paygate audit verify` says so, until the public keys exported beforehand
/// (`paygate mandate export-keys`) are trusted with `--keys`: then the whole chain verifies again.
#[tokio::test]
async fn checkpoints_signed_before_the_secret_changed_verify_with_the_keys_exported_before() {
    let mut t = trail(false, Arc::new(SystemClock)).await.unwrap();
    let run = |env: Vec<(String, String)>, args: Vec<String>| async move {
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_paygate"));
        cmd.args(&args).env_remove("PAYGATE_CONFIG").env_remove("PAYGATE_MANDATES__SECRET");
        for (k, v) in &env {
            cmd.env(k, v);
        }
        let out = tokio::task::spawn_blocking(move || cmd.output().unwrap()).await.unwrap();
        (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned())
    };
    let verify = |keys: Option<&Path>| {
        let mut args = vec!["audit".to_string(), "verify".to_string()];
        if let Some(k) = keys {
            args.extend(["--keys".to_string(), k.display().to_string()]);
        }
        args
    };
    assert_eq!(run(t.env.clone(), verify(None)).await.0, 0, "the trail holds before the change");
    let since = paygate::clock::rfc3339(SystemClock.now() - 86_400);
    let (code, jwks) = run(t.env.clone(), vec!["mandate".into(), "export-keys".into(), "--since".into(), since]).await;
    assert_eq!(code, 0, "{jwks}");
    let exported: Value = serde_json::from_str(&jwks).unwrap();
    assert!(exported["keys"].as_array().is_some_and(|k| k.len() >= 2), "{exported}");
    let file = t.dir.path().join("retired-keys.jwks");
    std::fs::write(&file, &jwks).unwrap();

    // A new secret: the old checkpoints' signatures are not the new keys'.
    t.env.push(("PAYGATE_MANDATES__SECRET".into(), "bmV3IG1hbmRhdGUgc2VjcmV0IGFmdGVyIHRoZSBsZWFrIQ==".into()));
    let (code, out) = run(t.env.clone(), verify(None)).await;
    let verdict: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((code, &verdict["ok"]), (1, &json!(false)), "{verdict}");
    let (code, out) = run(t.env.clone(), verify(Some(&file))).await;
    let verdict: Value = serde_json::from_str(&out).unwrap();
    assert_eq!((code, &verdict["ok"]), (0, &json!(true)), "{verdict}");
    assert_eq!(verdict["checkpoints_matched"], t.checkpoints.len(), "{verdict}");
    // Keys that signed nothing here vouch for nothing: another gateway's export does not help.
    let other = json!({"keys": [{"kty": "OKP", "crv": "Ed25519", "kid": "mk1-0", "x": "11qYAYKxCrfVS_7TyWQHOg7hcvPapiMlrwIaaPcHURo"}]});
    std::fs::write(&file, other.to_string()).unwrap();
    assert_eq!(run(t.env.clone(), verify(Some(&file))).await.0, 1);
}
