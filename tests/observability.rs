//! /metrics moves with traffic; /readyz follows the store.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use std::net::SocketAddr;

use common::*;
use serde_json::json;

fn metric(text: &str, line_prefix: &str) -> f64 {
    text.lines()
        .find(|l| l.starts_with(line_prefix))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0)
}

async fn scrape(app: &TestApp) -> String {
    let resp = reqwest::get(format!("{}/metrics", app.base())).await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers()["content-type"].to_str().unwrap().starts_with("text/plain"));
    resp.text().await.unwrap()
}

#[tokio::test]
async fn metrics_count_payments_replays_denials_and_requests() {
    let (app, _dir) = spawn_app().await;
    let before = scrape(&app).await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let args = json!({"operation_id": "m-1", "from_account": "acct-A", "to_account": "acct-B", "amount": "5.00", "currency": "KES"});
    ok(&call(&c, "create_payment", args.clone()).await);
    ok(&call(&c, "create_payment", args).await);
    let r = call(&c, "get_balance", json!({"account_id": "acct-Z"})).await;
    assert_eq!(code(&r), "ACCOUNT_NOT_ALLOWED");
    let r = call(
        &c,
        "create_payment",
        json!({"operation_id": "m-2", "from_account": "acct-A", "to_account": "acct-B",
                                                "amount": "5000.00", "currency": "KES"}),
    )
    .await;
    assert_eq!(code(&r), "APPROVAL_REQUIRED");
    let after = scrape(&app).await;

    let delta = |name: &str| metric(&after, name) - metric(&before, name);
    assert_eq!(delta("paygate_payments_moved_total "), 1.0);
    assert_eq!(delta("paygate_replays_total "), 1.0);
    assert_eq!(delta("paygate_denials_total{code=\"ACCOUNT_NOT_ALLOWED\"}"), 1.0);
    assert_eq!(delta("paygate_approvals_pending "), 1.0, "the queue depth");
    assert!(delta("paygate_http_requests_total{route=\"/mcp\",status=\"200\"}") >= 4.0);
    assert_eq!(delta("paygate_tool_duration_seconds_count{tool=\"create_payment\"}"), 3.0);
    // The payment and its replay: an allowed retry is answered by the posting transaction's claim.
    assert_eq!(delta("paygate_ledger_transaction_seconds_count "), 2.0);
    assert_eq!(metric(&after, "paygate_store_up "), 1.0);
    assert!(!after.contains("paygate_postgres_lane_transfers_total"), "SQLite groups in its writer, not in lanes");
    app.stop().await;
}

/// On PostgreSQL, /metrics shows the group commit: each autonomous payment passes through a lane
/// (a replay, answered before the posting, does not), and no batch rolled back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_show_postgres_group_commit() {
    let Some(db) = database("group commit metrics") else { return };
    let dir = tempfile::tempdir().unwrap();
    let app =
        spawn_on(dir.path(), &[("PAYGATE_STORAGE__URL", &db.url), ("PAYGATE_STORAGE__POSTGRES_SCHEMA", &db.schema)])
            .await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    for n in 0..3 {
        let args = json!({"operation_id": format!("g-{n}"), "from_account": "acct-A", "to_account": "acct-B",
                          "amount": "1.00", "currency": "KES"});
        ok(&call(&c, "create_payment", args.clone()).await);
        ok(&call(&c, "create_payment", args).await);
    }
    let text = scrape(&app).await;
    assert_eq!(metric(&text, "paygate_postgres_lane_transfers_total "), 3.0, "{text}");
    assert_eq!(metric(&text, "paygate_postgres_batch_fallbacks_total "), 0.0);
    assert!(text.contains("# TYPE paygate_postgres_grouped_batches_total counter"));
    app.stop().await;
}

/// A TCP forwarder to PostgreSQL that the test can cut and restore.
struct Link {
    addr: SocketAddr,
    tasks: tokio::task::JoinSet<()>,
}

impl Link {
    async fn open(addr: Option<SocketAddr>, upstream: SocketAddr) -> Link {
        let listener =
            tokio::net::TcpListener::bind(addr.unwrap_or_else(|| "127.0.0.1:0".parse().unwrap())).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let mut tasks = tokio::task::JoinSet::new();
        tasks.spawn(async move {
            let mut conns = tokio::task::JoinSet::new();
            loop {
                let Ok((mut inbound, _)) = listener.accept().await else { break };
                conns.spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
        Link { addr, tasks }
    }

    /// Cut every connection and stop listening (the JoinSet drop aborts the nested connection tasks).
    async fn cut(mut self) -> SocketAddr {
        self.tasks.shutdown().await;
        self.addr
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_follows_the_store() {
    let Some(db) = database("readiness") else { return };
    let upstream = {
        let cfg: tokio_postgres::Config = db.url.parse().unwrap();
        let host = match &cfg.get_hosts()[0] {
            tokio_postgres::config::Host::Tcp(h) => h.clone(),
            other => panic!("PAYGATE_TEST_DATABASE_URL must name a TCP host, got {other:?}"),
        };
        let port = cfg.get_ports().first().copied().unwrap_or(5432);
        tokio::net::lookup_host((host.as_str(), port)).await.unwrap().next().unwrap()
    };
    let link = Link::open(None, upstream).await;
    // The same database, reached through the link.
    let mut cfg: tokio_postgres::Config = db.url.parse().unwrap();
    cfg.host("127.0.0.1").port(link.addr.port());
    let user = cfg.get_user().unwrap_or("postgres").to_string();
    let dbname = cfg.get_dbname().unwrap_or("postgres").to_string();
    let url = format!("postgres://{user}@127.0.0.1:{}/{dbname}", link.addr.port());
    let dir = tempfile::tempdir().unwrap();
    let app =
        spawn_on(dir.path(), &[("PAYGATE_STORAGE__URL", &url), ("PAYGATE_STORAGE__POSTGRES_SCHEMA", &db.schema)]).await;
    let ready = || async { reqwest::get(format!("{}/readyz", app.base())).await.unwrap().status().as_u16() };
    assert_eq!(ready().await, 200);

    let addr = link.cut().await;
    assert_eq!(ready().await, 503, "store unreachable: not ready");
    assert_eq!(reqwest::get(format!("{}/healthz", app.base())).await.unwrap().status(), 200, "but alive");
    assert_eq!(metric(&scrape(&app).await, "paygate_store_up "), 0.0);

    let _link = Link::open(Some(addr), upstream).await;
    assert_eq!(ready().await, 200, "ready again once the store answers");
    app.stop().await;
}
