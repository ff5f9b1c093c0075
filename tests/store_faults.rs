//! Store failures on the money path, injected into the real database: a trigger that raises on
//! one table's writes makes exactly that store call fail (no test hook in the gateway). Each case
//! runs on SQLite and, with `PAYGATE_TEST_DATABASE_URL`, on PostgreSQL. For each, the agent gets a
//! typed, retryable error (INTERNAL, or BACKEND_UNAVAILABLE where the embedded ledger's own posting
//! transaction failed), nothing moves, and once the fault is gone the same call converges on one
//! payment (or one approval). The HTTP-ledger path's key read, completion and release are in
//! `ledger_http_e2e.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use common::*;
use serde_json::{Value, json};

/// The gateway on one engine, and a way to reach its database as another process would.
struct Rig {
    app: TestApp,
    db: Option<Db>,
    _dir: tempfile::TempDir,
}

impl Rig {
    /// SQLite when `db` is `None`, else PostgreSQL in the test's own schema.
    async fn start(db: Option<Db>) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let app = match &db {
            None => spawn_on(dir.path(), &[]).await,
            Some(db) => {
                let overrides = [
                    ("PAYGATE_STORAGE__URL", db.url.as_str()),
                    ("PAYGATE_STORAGE__POSTGRES_SCHEMA", db.schema.as_str()),
                ];
                spawn_on(dir.path(), &overrides).await
            }
        };
        Rig { app, db, _dir: dir }
    }

    async fn sql(&self, statement: &str) {
        match &self.db {
            None => {
                let db = rusqlite::Connection::open(self.app.data_dir.join("paygate.sqlite3")).unwrap();
                db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
                db.execute_batch(statement).unwrap();
            }
            Some(db) => {
                let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(conn);
                client.batch_execute(&format!("SET search_path TO {}; {statement}", db.schema)).await.unwrap();
            }
        }
    }

    /// Make every write of `event` on `table` (e.g. "INSERT", "approvals") fail until `heal`.
    async fn inject(&self, event: &str, table: &str) {
        match &self.db {
            None => {
                let t = format!(
                    "CREATE TRIGGER injected_fault BEFORE {event} ON {table} \
                     BEGIN SELECT RAISE(ABORT, 'injected fault'); END;"
                );
                self.sql(&t).await
            }
            Some(_) => {
                let t = format!(
                    "CREATE FUNCTION injected_fault() RETURNS trigger LANGUAGE plpgsql AS \
                     $$ BEGIN RAISE EXCEPTION 'injected fault'; END $$; \
                     CREATE TRIGGER injected_fault BEFORE {event} ON {table} \
                     FOR EACH ROW EXECUTE FUNCTION injected_fault();"
                );
                self.sql(&t).await
            }
        }
    }

    async fn heal(&self) {
        match &self.db {
            None => self.sql("DROP TRIGGER injected_fault").await,
            Some(_) => self.sql("DROP FUNCTION injected_fault() CASCADE").await,
        }
    }
}

fn pay(op: &str, amount: &str) -> Value {
    json!({"operation_id": op, "from_account": "acct-A", "to_account": "acct-B", "amount": amount, "currency": "KES"})
}

async fn payments(agent: &Client) -> usize {
    ok(&call(agent, "list_payments", json!({"limit": 100})).await)["payments"].as_array().unwrap().len()
}

/// The agent's error for a store failure: `want` (INTERNAL for the gateway's own records;
/// BACKEND_UNAVAILABLE when the embedded ledger's posting transaction fails: the payment system
/// could not post, and nothing moved), retryable, in the gateway's own words only.
fn assert_refused(r: &rmcp::model::CallToolResult, want: &str, what: &str) {
    assert_eq!(code(r), want, "{what}: {r:?}");
    assert_eq!(err(r)["retryable"], true, "{what}: the agent is told to retry the same call");
    assert!(!err(r)["message"].as_str().unwrap().contains("injected"), "{what}: store text leaked: {r:?}");
}

async fn a_failing_key_write_in_the_posting_transaction_moves_nothing_and_the_retry_pays_once(db: Option<Db>) {
    let rig = Rig::start(db).await;
    let app = &rig.app;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let before = (balance(&agent, "acct-A").await, balance(&agent, "acct-B").await);
    rig.inject("INSERT", "idempotency_records").await;
    let r = call(&agent, "create_payment", pay("fault-1", "25.00")).await;
    assert_refused(&r, "BACKEND_UNAVAILABLE", "the key's claim in the posting transaction failed");
    assert_eq!((balance(&agent, "acct-A").await, balance(&agent, "acct-B").await), before, "nothing moved");
    assert_eq!(payments(&agent).await, 0);
    rig.heal().await;
    let first = call(&agent, "create_payment", pay("fault-1", "25.00")).await;
    assert_eq!((ok(&first)["status"].as_str(), ok(&first)["replayed"].as_bool()), (Some("succeeded"), Some(false)));
    let again = call(&agent, "create_payment", pay("fault-1", "25.00")).await;
    assert_eq!(
        (ok(&again)["payment_id"].clone(), ok(&again)["replayed"].clone()),
        (ok(&first)["payment_id"].clone(), json!(true))
    );
    assert_eq!((payments(&agent).await, balance(&agent, "acct-B").await.as_str()), (1, "25.00"));
    app.assert_integrity().await;
    rig.app.stop().await;
}

async fn a_failing_posting_write_moves_nothing_and_the_retry_pays_once(db: Option<Db>) {
    let rig = Rig::start(db).await;
    let app = &rig.app;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    rig.inject("INSERT", "postings").await;
    let r = call(&agent, "create_payment", pay("fault-2", "30.00")).await;
    assert_refused(&r, "BACKEND_UNAVAILABLE", "the posting failed");
    assert_eq!((payments(&agent).await, balance(&agent, "acct-B").await.as_str()), (0, "0.00"), "nothing moved");
    rig.heal().await;
    let paid = call(&agent, "create_payment", pay("fault-2", "30.00")).await;
    assert_eq!(ok(&paid)["replayed"], false, "the key was not left claimed by the failed attempt");
    assert_eq!((payments(&agent).await, balance(&agent, "acct-B").await.as_str()), (1, "30.00"));
    app.assert_integrity().await;
    rig.app.stop().await;
}

async fn a_failing_approval_write_asks_nobody_and_the_retry_asks_once(db: Option<Db>) {
    let rig = Rig::start(db).await;
    let app = &rig.app;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    rig.inject("INSERT", "approvals").await;
    let r = call(&agent, "create_payment", pay("fault-3", "5000.00")).await;
    assert_refused(&r, "INTERNAL", "the approval was not written");
    let token = app.operator_token("auditor", "payments:audit");
    let (_, listed) = operator(app, reqwest::Method::GET, "/operator/v1/approvals?status=pending", &token, None).await;
    assert_eq!(listed["items"], json!([]), "no approval half-made: {listed}");
    rig.heal().await;
    let asked = call(&agent, "create_payment", pay("fault-3", "5000.00")).await;
    assert_eq!(code(&asked), "APPROVAL_REQUIRED");
    let again = call(&agent, "create_payment", pay("fault-3", "5000.00")).await;
    assert_eq!(err(&again)["approval_id"], err(&asked)["approval_id"], "one approval for the operation");
    assert_eq!(payments(&agent).await, 0);
    rig.app.stop().await;
}

/// A stored outcome that no longer reads (a damaged row) is never taken for "not paid yet": the
/// retry is refused (INTERNAL), and nothing is paid a second time.
async fn an_unreadable_stored_outcome_is_refused_never_paid_again(db: Option<Db>) {
    let rig = Rig::start(db).await;
    let app = &rig.app;
    let agent = connect(&app.url, &app.dev_token(), Era::Modern).await;
    assert_eq!(ok(&call(&agent, "create_payment", pay("fault-4", "40.00")).await)["status"], "succeeded");
    rig.sql("UPDATE idempotency_records SET outcome = '{not json' WHERE state = 'completed'").await;
    let r = call(&agent, "create_payment", pay("fault-4", "40.00")).await;
    assert_refused(&r, "INTERNAL", "the stored outcome does not read");
    assert_eq!((payments(&agent).await, balance(&agent, "acct-B").await.as_str()), (1, "40.00"), "paid once");
    rig.app.stop().await;
}

/// Each case on SQLite, and on PostgreSQL when `PAYGATE_TEST_DATABASE_URL` is set.
macro_rules! on_both_engines {
    ($($case:ident),* $(,)?) => {
        mod sqlite {
            $(#[tokio::test]
            async fn $case() {
                super::$case(None).await
            })*
        }
        // Multi-threaded: the schema's drop at the end blocks its thread until the gateway's last
        // connections (a job's transaction) let go, and they need a runtime thread to do so.
        mod postgres {
            $(#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $case() {
                let Some(db) = super::database(concat!("store_faults::", stringify!($case), " (postgres)")) else { return };
                super::$case(Some(db)).await
            })*
        }
    };
}

on_both_engines!(
    a_failing_key_write_in_the_posting_transaction_moves_nothing_and_the_retry_pays_once,
    a_failing_posting_write_moves_nothing_and_the_retry_pays_once,
    a_failing_approval_write_asks_nobody_and_the_retry_asks_once,
    an_unreadable_stored_outcome_is_refused_never_paid_again
);
