//! Store failures on the money path, injected into the real database: a trigger that raises on
//! one table's writes makes exactly that store call fail (no test hook in the gateway). Each case
//! runs on SQLite and, with `PAYGATE_TEST_DATABASE_URL`, on PostgreSQL. For each, the agent gets a
//! typed, retryable error (INTERNAL, or BACKEND_UNAVAILABLE where the embedded ledger's own posting
//! transaction failed), nothing moves, and once the fault is gone the same call converges on one
//! payment (or one approval). The HTTP-ledger path's key read, completion and release are in
//! `ledger_http_e2e.rs`.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;
#[path = "common/daraja.rs"]
mod daraja;

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
        Rig::start_with(db, None).await
    }

    /// The same, with a config file's text (`toml`) and a clock, under the engine's settings.
    async fn start_with(db: Option<Db>, toml: Option<(&str, std::sync::Arc<dyn paygate::clock::Clock>)>) -> Rig {
        let dir = tempfile::tempdir().unwrap();
        let mut overrides: Vec<(&str, &str)> = match &db {
            None => vec![],
            Some(db) => vec![
                ("PAYGATE_STORAGE__URL", db.url.as_str()),
                ("PAYGATE_STORAGE__POSTGRES_SCHEMA", db.schema.as_str()),
            ],
        };
        // The secret of the webhook endpoint a config file may name (webhook secrets are read
        // from the environment only).
        overrides.push(("PAYGATE_WEBHOOK_SECRET_OPS", WEBHOOK_SECRET));
        let app = match toml {
            None => spawn_on(dir.path(), &overrides).await,
            Some((toml, clock)) => spawn_with_toml(dir.path(), toml, &overrides, clock).await,
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

    /// Make every write of `event` on `table` vanish while its statement succeeds (SQLite
    /// `RAISE(IGNORE)`, a PostgreSQL BEFORE trigger returning NULL) until `unswallow`: a
    /// database writer's quieter fault, which a store must not take for a write.
    async fn swallow(&self, event: &str, table: &str) {
        let t = match &self.db {
            None => format!("CREATE TRIGGER swallowed BEFORE {event} ON {table} BEGIN SELECT RAISE(IGNORE); END;"),
            Some(_) => format!(
                "CREATE FUNCTION swallowed() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$; \
                 CREATE TRIGGER swallowed BEFORE {event} ON {table} FOR EACH ROW EXECUTE FUNCTION swallowed();"
            ),
        };
        self.sql(&t).await
    }

    /// A failing write (`inject`) or a swallowed one (`swallow`), until [`Rig::unfault`].
    async fn fault(&self, event: &str, table: &str, swallowed: bool) {
        match swallowed {
            true => self.swallow(event, table).await,
            false => self.inject(event, table).await,
        }
    }

    async fn unfault(&self, swallowed: bool) {
        match swallowed {
            true => self.unswallow().await,
            false => self.heal().await,
        }
    }

    async fn unswallow(&self) {
        match &self.db {
            None => self.sql("DROP TRIGGER swallowed").await,
            Some(_) => self.sql("DROP FUNCTION swallowed() CASCADE").await,
        }
    }

    /// Record every INSERT and UPDATE on `tables` in `fault_reach` (table, event) until
    /// [`Rig::reached`]: which writes a call really makes, so the matrix faults only what is there.
    async fn reach(&self, tables: &[&str]) {
        let mut sql = String::from("CREATE TABLE IF NOT EXISTS fault_reach (tbl TEXT, ev TEXT);");
        match &self.db {
            None => {
                for t in tables {
                    for ev in EVENTS {
                        sql += &format!(
                            "CREATE TRIGGER reach_{t}_{ev} AFTER {ev} ON {t} \
                             BEGIN INSERT INTO fault_reach VALUES ('{t}', '{ev}'); END;"
                        );
                    }
                }
            }
            Some(db) => {
                sql += &format!(
                    "CREATE FUNCTION fault_reach() RETURNS trigger LANGUAGE plpgsql AS \
                     $$ BEGIN INSERT INTO {}.fault_reach VALUES (TG_TABLE_NAME, TG_OP); RETURN NULL; END $$;",
                    db.schema
                );
                for t in tables {
                    sql += &format!(
                        "CREATE TRIGGER reach AFTER INSERT OR UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION fault_reach();"
                    );
                }
            }
        }
        self.sql(&sql).await
    }

    /// The writes recorded since [`Rig::reach`], which stops recording.
    async fn reached(&self, tables: &[&str]) -> std::collections::BTreeSet<(String, String)> {
        let read = "SELECT DISTINCT ev, tbl FROM fault_reach";
        let seen = match &self.db {
            None => {
                let db = rusqlite::Connection::open(self.app.data_dir.join("paygate.sqlite3")).unwrap();
                db.busy_timeout(std::time::Duration::from_secs(5)).unwrap();
                let mut q = db.prepare(read).unwrap();
                q.query_map([], |r| Ok((r.get(0)?, r.get(1)?))).unwrap().map(Result::unwrap).collect()
            }
            Some(db) => {
                let (client, conn) = tokio_postgres::connect(&db.url, tokio_postgres::NoTls).await.unwrap();
                tokio::spawn(conn);
                let rows = client.query(&read.replace("fault_reach", &format!("{}.fault_reach", db.schema)), &[]).await;
                rows.unwrap().iter().map(|r| (r.get(0), r.get(1))).collect()
            }
        };
        let drop = match &self.db {
            None => {
                let each = tables.iter().flat_map(|t| EVENTS.map(|ev| format!("DROP TRIGGER reach_{t}_{ev};")));
                each.collect::<String>() + "DROP TABLE fault_reach;"
            }
            Some(_) => "DROP FUNCTION fault_reach() CASCADE; DROP TABLE fault_reach;".to_string(),
        };
        self.sql(&drop).await;
        seen
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

// ── Every money table ─────────────────────────────────────────────────────────────────────────────
//
// Each money-moving call below, with a write it makes failing (every table it writes, INSERT and
// UPDATE, found by recording its writes on a clean run first: the matrix cannot fault a write that
// is not there, nor miss one that is). For each: the answer either claims what committed (the
// payment is there, its money moved once, an audit record names it) or is a retryable refusal
// after which nothing moved; the same call once healed converges on one payment, moved once
// (at the ledger, or at the rail: one request Daraja received), named by the audit trail.

const EVENTS: [&str; 2] = ["INSERT", "UPDATE"];

/// `whsec_` + base64 of 24 bytes: the matrix's webhook endpoint's secret (delivery never runs: jobs
/// are off; what matters is the outbox row written with the approval).
const WEBHOOK_SECRET: &str = "whsec_MDEyMzQ1Njc4OWFiY2RlZmdoaWprbG1u";

/// `idempotency.lease_secs` as the matrix's gateway runs.
const LEASE_SECS: i64 = 30;

/// Every table a money-moving call may write.
/// Every call the matrices fault, in order (an approval before its grant, a payout before its result).
const EVERY_MOVE: [Move; 7] =
    [Move::Payment, Move::Refund, Move::MandatePayment, Move::Approval, Move::Grant, Move::Payout, Move::PayoutResult];

const MONEY_TABLES: [&str; 13] = [
    "idempotency_records",
    "payments",
    "postings",
    "accounts",
    "budget_usage",
    "refund_usage",
    "payee_usage",
    "mandates",
    "approvals",
    "rail_payments",
    "audit_records",
    "webhook_outbox",
    "approval_reviews",
];

/// The gateway with the embedded ledger and M-Pesa (payouts to the Daraja fake), one agent profile:
/// autonomous up to 1,000, a daily budget (so payments draw on it), a webhook endpoint told of
/// approvals (its outbox row is written with the approval), jobs off.
fn matrix_config(fake: &daraja::DarajaFake) -> String {
    format!(
        r#"
[mpesa]
enabled = true
base_url = "{base}"
consumer_key = "fake-consumer-key"
consumer_secret = "fake-consumer-secret"
short_code = "174379"
passkey = "{passkey}"
callback_secret = "cb-secret-0123456789abcdefghij"
initiator_name = "testapi"
security_credential = "fake-security-credential"
b2c_short_code = "600996"
request_timeout_ms = 2000

[jobs]
enabled = false

[idempotency]
lease_secs = {LEASE_SECS}

[webhooks]
enabled = true

[[webhooks.endpoints]]
name = "ops"
url = "http://127.0.0.1:9/hooks"
secret_env = "PAYGATE_WEBHOOK_SECRET_OPS"
events = ["approval.requested", "approval.decided"]

[policy]
default_profile = "dev"

[[policy.profiles]]
name = "dev"
subjects = ["dev-agent"]
client_ids = []
allowed_accounts = ["acct-A", "acct-B", "mpesa-collections"]
autonomous_limit = {{ KES = "1000.00" }}
daily_limit = {{ KES = "1000000.00" }}
daily_refund_limit = {{ KES = "1000000.00" }}
daily_payments_max = 100000
calls_per_minute = 100000
tool_calls_per_minute = {{}}
issuer = ""
"#,
        base = fake.base_url(),
        passkey = daraja::SANDBOX_PASSKEY,
    )
}

/// One money-moving call the matrix faults.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Move {
    /// create_payment of 10.00 on the embedded ledger.
    Payment,
    /// refund_payment of 4.00 of a fresh 10.00 payment.
    Refund,
    /// create_payment of 5,000.00 with the mandate its approval issued.
    MandatePayment,
    /// An approval asked for (over the autonomous limit).
    Approval,
    /// An approval granted by one reviewer: the rows that make a mandate.
    Grant,
    /// send_mpesa_payout of 150 to the Daraja fake.
    Payout,
    /// Daraja's result callback settling a payout.
    PayoutResult,
}

/// What a call left: the ledger's two accounts, the payments listed, Daraja's B2C requests.
#[derive(Debug, Clone, PartialEq)]
struct Books {
    a: String,
    b: String,
    payments: usize,
    sent: usize,
}

struct Matrix {
    rig: Rig,
    fake: daraja::DarajaFake,
    agent: Client,
    clock: paygate::clock::ManualClock,
}

impl Matrix {
    /// Started, and every usage row written once (a first write INSERTs, later ones UPDATE: the
    /// matrices fault the UPDATEs too).
    async fn warmed(db: Option<Db>) -> Matrix {
        let x = Matrix::start(db).await;
        for m in [Move::Payment, Move::Refund, Move::MandatePayment, Move::Payout] {
            let args = x.prepare(m, &format!("warm-{m:?}").to_lowercase()).await;
            x.act(m, &args).await.unwrap();
        }
        x
    }

    async fn start(db: Option<Db>) -> Matrix {
        let clock = paygate::clock::ManualClock::new(now_secs());
        let fake = daraja::DarajaFake::start(daraja::FakeConfig {
            clock: std::sync::Arc::new(clock.clone()),
            ..Default::default()
        })
        .await;
        let rig = Rig::start_with(db, Some((&matrix_config(&fake), std::sync::Arc::new(clock.clone())))).await;
        let agent = connect(
            &rig.app.url,
            &rig.app.token("dev-agent", "payments:read payments:create payments:refund payments:payout"),
            Era::Modern,
        )
        .await;
        Matrix { rig, fake, agent, clock }
    }

    async fn books(&self) -> Books {
        Books {
            a: balance(&self.agent, "acct-A").await,
            b: balance(&self.agent, "acct-B").await,
            payments: all_payments(&self.agent).await,
            sent: self.fake.b2c_requests(),
        }
    }

    /// What `m` needs before the faulted call (a payment to refund, an approval and its mandate).
    async fn prepare(&self, m: Move, op: &str) -> Value {
        match m {
            Move::Refund => {
                let paid = call(&self.agent, "create_payment", pay(&format!("{op}-paid"), "10.00")).await;
                json!({"operation_id": op, "payment_id": ok(&paid)["payment_id"], "amount": "4.00"})
            }
            Move::MandatePayment => {
                let mandate = self.approved(op).await;
                let mut args = pay(op, "5000.00");
                args["mandate"] = json!(mandate);
                args
            }
            Move::PayoutResult => {
                let sent = call(&self.agent, "send_mpesa_payout", payout(op)).await;
                json!({"payment_id": ok(&sent)["payment_id"]})
            }
            Move::Grant => {
                let asked = call(&self.agent, "create_payment", pay(op, "5000.00")).await;
                json!({"approval_id": err(&asked)["approval_id"]})
            }
            Move::Payment => pay(op, "10.00"),
            Move::Approval => pay(op, "5000.00"),
            Move::Payout => payout(op),
        }
    }

    /// Ask for an approval of 5,000.00 under `op`, grant it, and return the mandate it issued.
    async fn approved(&self, op: &str) -> String {
        let asked = call(&self.agent, "create_payment", pay(op, "5000.00")).await;
        assert_eq!(code(&asked), "APPROVAL_REQUIRED", "{asked:?}");
        let id = err(&asked)["approval_id"].as_str().unwrap().to_string();
        let (status, view) = approve(&self.rig.app, &id, "alice").await;
        assert_eq!(status, 200, "{view}");
        let mine = call(&self.agent, "get_approval", json!({"approval_id": id})).await;
        ok(&mine)["mandate"].as_str().expect("the approval issued a mandate").to_string()
    }

    /// The faulted call itself: the agent's answer, or the HTTP status Daraja's callback got.
    async fn act(&self, m: Move, args: &Value) -> Result<Value, Value> {
        let tool = match m {
            Move::Payment | Move::MandatePayment | Move::Approval => "create_payment",
            Move::Refund => "refund_payment",
            Move::Payout => "send_mpesa_payout",
            Move::PayoutResult => {
                let id = args["payment_id"].as_str().unwrap();
                let status = self.fake.post_result(id, 0).await.as_u16();
                return if status == 200 { Ok(json!({"payment_id": id})) } else { Err(json!(status)) };
            }
            Move::Grant => {
                let (status, view) = approve(&self.rig.app, args["approval_id"].as_str().unwrap(), "alice").await;
                return if status == 200 { Ok(view) } else { Err(json!({"status": status.as_u16(), "body": view})) };
            }
        };
        let r = call(&self.agent, tool, args.clone()).await;
        match r.is_error {
            Some(true) => Err(err(&r).clone()),
            _ => Ok(ok(&r).clone()),
        }
    }

    /// Whether an audit record names `payment` (or, for an approval, `approval`).
    async fn audited(&self, key: &str, id: &str) -> bool {
        let records = self.rig.app.running.store.audit_list(None, 100_000).await.unwrap();
        records.iter().any(|r| match key {
            "approval" => r.approval_id.as_deref() == Some(id),
            _ => r.payment_id.as_deref() == Some(id),
        })
    }

    /// One case: `m` with every `event` write on `table` failing, then healed and tried again.
    /// A money call with one of its writes failing (`swallowed`: the row dropped while the
    /// statement succeeds — what a store must not take for a write): either it went through
    /// whole (its books, and with a swallowed write the ledger's integrity and the audit chain
    /// too) or it was refused retryably with nothing moved; once healed the same call converges
    /// on one payment.
    async fn case(&self, m: Move, event: &str, table: &str, n: usize, swallowed: bool) {
        let how = if swallowed { "swallowed" } else { "failing" };
        let what = format!("{m:?} with {event} on {table} {how}");
        let op = format!("{}{n}-{m:?}-{table}-{event}", if swallowed { "s" } else { "m" }).to_lowercase();
        let args = self.prepare(m, &op).await;
        let before = self.books().await;
        self.rig.fault(event, table, swallowed).await;
        let first = self.act(m, &args).await;
        self.rig.unfault(swallowed).await;
        if swallowed && first.is_ok() {
            self.whole(&what).await;
        }
        match &first {
            Ok(answer) => self.holds(m, answer, &before, &what).await,
            Err(refusal) if m == Move::PayoutResult => {
                assert_ne!(refusal, &json!(200), "{what}");
                let id = args["payment_id"].as_str().unwrap();
                let p = call(&self.agent, "get_payment", json!({"payment_id": id})).await;
                assert_eq!(ok(&p)["status"], "pending", "{what}: a refused callback settles nothing");
            }
            Err(refusal) => {
                assert_eq!(refusal["retryable"], true, "{what}: {refusal}");
                let code = refusal["code"].as_str().unwrap();
                // A rail that accepted a payout whose record could not say so: the outcome is not
                // known to the gateway, and it says so (never "failed", never sent again).
                let honest: &[&str] = match m {
                    Move::Payout => &["INTERNAL", "BACKEND_UNAVAILABLE", "OUTCOME_UNKNOWN"],
                    _ => &["INTERNAL", "BACKEND_UNAVAILABLE"],
                };
                assert!(honest.contains(&code), "{what}: {refusal}");
                assert!(!refusal["message"].as_str().unwrap().contains("injected"), "{what}: store text leaked");
                let after = self.books().await;
                if code == "OUTCOME_UNKNOWN" {
                    // Listed as what it is: a payment whose outcome is not known yet.
                    assert!(after.sent <= before.sent + 1 && after.payments <= before.payments + 1, "{what}");
                } else {
                    assert_eq!(Books { sent: before.sent, ..after.clone() }, before, "{what}: nothing moved");
                }
                assert!(after.sent <= before.sent + 1, "{what}");
            }
        }
        let mut again = self.act(m, &args).await;
        for _ in 0..3 {
            let Err(e) = &again else { break };
            match e["code"].as_str() {
                // The money moved and the answer said so, but the key's completion did not commit:
                // the key holds the operation until its lease ends (the agent is told to retry
                // shortly); then the retry takes it over and finds what was done.
                Some("OPERATION_IN_PROGRESS") if first.is_ok() => {
                    assert_eq!(table, "idempotency_records", "{what}: {e}");
                }
                // An unknown outcome keeps its key until the lease ends (never sent again meanwhile).
                Some("OPERATION_IN_PROGRESS") if first.as_ref().is_err_and(|f| f["code"] == "OUTCOME_UNKNOWN") => {}
                // The payout's outcome is unknown to the gateway: it is not sent again; Daraja's
                // result settles it, and the retry after the key's lease finds it settled.
                Some("OUTCOME_UNKNOWN") if m == Move::Payout => {
                    assert_eq!(self.fake.b2c_requests(), before.sent + 1, "{what}: Daraja got it once");
                    let id = self.fake.payouts().last().unwrap().originator_conversation_id.clone();
                    assert_eq!(self.fake.post_result(&id, 0).await.as_u16(), 200, "{what}");
                }
                _ => break,
            }
            assert_eq!(e["retryable"], true, "{what}: {e}");
            self.clock.advance(LEASE_SECS + 1);
            again = self.act(m, &args).await;
        }
        let again = again.unwrap_or_else(|e| panic!("{what}: the retry once healed: {e}"));
        self.holds(m, &again, &before, &what).await;
        if let (Ok(first), Some(id)) = (&first, again.get("payment_id")) {
            assert_eq!(first["payment_id"], *id, "{what}: the retry is the same payment");
        }
        // Settle a payout, so the next case starts from no payout in flight.
        if m == Move::Payout && again["status"] == "pending" {
            let id = again["payment_id"].as_str().unwrap();
            assert_eq!(self.fake.post_result(id, 0).await.as_u16(), 200, "{what}");
        }
    }

    /// The books a swallowed write must not leave behind an answer that went through: the
    /// ledger's full integrity check and the audit chain both hold.
    async fn whole(&self, what: &str) {
        let report = self.rig.app.running.store.ledger_integrity().await.unwrap();
        assert!(report.ok, "{what}: answered ok, and the ledger says {:?}", report.problems);
        // Sealed first: the manual clock runs ahead of the sealing job (PostgreSQL seals by job).
        self.rig.app.running.gateway.seal_audit_at_stop().await;
        let verdict = self.rig.app.running.gateway.verify_audit(None).await.unwrap();
        assert!(verdict.ok, "{what}: answered ok, and the audit chain says {verdict:?}");
    }

    /// An approval asked for or granted with a write failing (`swallowed`: dropped while its
    /// statement succeeds): either it is there whole (asked: the approval exists and the trail
    /// names it; granted: approved by the reviewer it names, its mandate issued) or the call was
    /// refused and nothing of it is there; once healed the same call makes it, once.
    async fn approval_case(&self, m: Move, event: &str, table: &str, n: usize, swallowed: bool) {
        let how = if swallowed { "swallowed" } else { "failing" };
        let what = format!("{m:?} with {event} on {table} {how}");
        let op = format!("{}{n}-{m:?}-{table}-{event}", if swallowed { "s" } else { "m" }).to_lowercase();
        let args = self.prepare(m, &op).await;
        let before = self.books().await;
        self.rig.fault(event, table, swallowed).await;
        let first = self.act(m, &args).await;
        self.rig.unfault(swallowed).await;
        let again = self.act(m, &args).await;
        assert_eq!(self.books().await, before, "{what}: nothing moved");
        match m {
            Move::Approval => {
                let (first, again) = (first.unwrap_err(), again.unwrap_err());
                assert_eq!(again["code"], "APPROVAL_REQUIRED", "{what}: the retry once healed asks: {again}");
                match first["code"].as_str().unwrap() {
                    "APPROVAL_REQUIRED" => assert_eq!(first["approval_id"], again["approval_id"], "{what}: asked once"),
                    "INTERNAL" => assert_eq!(first["retryable"], true, "{what}: {first}"),
                    _ => panic!("{what}: {first}"),
                }
                let id = again["approval_id"].as_str().unwrap();
                let token = self.rig.app.operator_token("auditor", "payments:audit");
                let (status, view) =
                    operator(&self.rig.app, reqwest::Method::GET, &format!("/approvals/{id}"), &token, None).await;
                assert_eq!((status.as_u16(), view["status"].as_str()), (200, Some("pending")), "{what}: {view}");
                let (_, listed) =
                    operator(&self.rig.app, reqwest::Method::GET, "/approvals?status=pending&limit=100", &token, None)
                        .await;
                let mine = listed["approvals"].as_array().unwrap().iter().filter(|a| a["approval_id"] == id).count();
                assert_eq!(mine, 1, "{what}: one approval for the operation");
                assert!(self.audited("approval", id).await, "{what}: no audit record names approval {id}");
            }
            Move::Grant => {
                let id = args["approval_id"].as_str().unwrap();
                let mine = call(&self.agent, "get_approval", json!({"approval_id": id})).await;
                if let Err(refusal) = &first {
                    assert!(refusal["status"].as_u64().unwrap() >= 500, "{what}: {refusal}");
                }
                match (&first, &again) {
                    (Ok(_), Err(second)) => assert_eq!(second["status"], 409, "{what}: decided once: {second}"),
                    (Err(_), Ok(view)) => assert_eq!(view["status"], "approved", "{what}: {view}"),
                    _ => panic!("{what}: {first:?} then {again:?}"),
                }
                let mandate = ok(&mine)["mandate"].as_str().unwrap_or_else(|| panic!("{what}: no mandate: {mine:?}"));
                assert!(self.audited("approval", id).await, "{what}");
                // Approved by the reviewer the record names (no approval without its review).
                let token = self.rig.app.operator_token("auditor", "payments:audit");
                let (_, view) =
                    operator(&self.rig.app, reqwest::Method::GET, &format!("/approvals/{id}"), &token, None).await;
                assert_eq!(view["approved_by"], json!(["alice"]), "{what}: {view}");
                // The mandate pays its operation once.
                let mut paid = pay(&op, "5000.00");
                paid["mandate"] = json!(mandate);
                let answer = ok(&call(&self.agent, "create_payment", paid).await).clone();
                self.holds(Move::MandatePayment, &answer, &before, &what).await;
            }
            _ => unreachable!(),
        }
    }

    /// What an answer that claims success must mean: it committed, moved once, and is audited.
    async fn holds(&self, m: Move, answer: &Value, before: &Books, what: &str) {
        let after = self.books().await;
        let moved =
            |a: &str, b: &str| Books { a: a.into(), b: b.into(), payments: before.payments + 1, ..before.clone() };
        let minor = |s: &str| (s.parse::<f64>().unwrap() * 100.0).round() as i64;
        let shifted = |by: i64| {
            let a = format!("{:.2}", (minor(&before.a) - by) as f64 / 100.0);
            let b = format!("{:.2}", (minor(&before.b) + by) as f64 / 100.0);
            moved(&a, &b)
        };
        match m {
            Move::Payment => assert_eq!(after, shifted(1_000), "{what}: {answer}"),
            Move::MandatePayment => assert_eq!(after, shifted(500_000), "{what}: {answer}"),
            Move::Refund => assert_eq!(after, shifted(-400), "{what}: {answer}"),
            Move::Payout => {
                assert!(["pending", "succeeded"].contains(&answer["status"].as_str().unwrap()), "{what}: {answer}");
                assert_eq!(after.sent, before.sent + 1, "{what}: Daraja received one B2C request");
                let sent = self.fake.payouts();
                assert_eq!(sent.last().unwrap().originator_conversation_id, answer["payment_id"].as_str().unwrap());
            }
            Move::PayoutResult => {
                assert_eq!(&after, before, "{what}");
                // Settled, and the trail says by what word.
                let records = self.rig.app.running.store.audit_list(None, 100_000).await.unwrap();
                let id = answer["payment_id"].as_str().unwrap();
                let said =
                    records.iter().any(|r| r.payment_id.as_deref() == Some(id) && r.decision == "callback_settled");
                assert!(said, "{what}: payout {id} settled without its callback's audit record");
                return;
            }
            Move::Approval | Move::Grant => unreachable!("approval_case"),
        }
        let id = answer["payment_id"].as_str().unwrap();
        assert!(self.audited("payment", id).await, "{what}: no audit record names payment {id}: {answer}");
    }
}

fn payout(op: &str) -> Value {
    json!({"operation_id": op, "phone_number": "0712 345 678", "amount": "150", "remarks": "Cashback"})
}

async fn all_payments(agent: &Client) -> usize {
    let (mut n, mut cursor) = (0, None::<String>);
    loop {
        let mut args = json!({"limit": 100});
        if let Some(c) = &cursor {
            args["cursor"] = json!(c);
        }
        let r = call(agent, "list_payments", args).await;
        n += ok(&r)["payments"].as_array().unwrap().len();
        match ok(&r)["next_cursor"].as_str() {
            Some(c) => cursor = Some(c.to_string()),
            None => return n,
        }
    }
}

/// The writes each call makes, recorded on a clean run: (event, table).
async fn writes_of(x: &Matrix, m: Move, n: usize) -> Vec<(String, String)> {
    let op = format!("reach{n}-{m:?}").to_lowercase();
    let args = x.prepare(m, &op).await;
    x.rig.reach(&MONEY_TABLES).await;
    let answer = x.act(m, &args).await;
    let seen = x.rig.reached(&MONEY_TABLES).await;
    assert!(answer.is_ok() || m == Move::Approval, "{m:?} on a clean run: {answer:?}");
    if m == Move::Payout {
        let id = answer.unwrap()["payment_id"].as_str().unwrap().to_string();
        assert_eq!(x.fake.post_result(&id, 0).await.as_u16(), 200);
    }
    seen.into_iter().collect()
}

async fn every_money_write_failing_is_refused_or_committed_whole_and_the_retry_moves_once(db: Option<Db>) {
    let x = Matrix::warmed(db).await;
    let mut n = 0;
    let mut faulted = std::collections::BTreeSet::new();
    for m in EVERY_MOVE {
        n += 1;
        let writes = writes_of(&x, m, n).await;
        assert!(!writes.is_empty(), "{m:?} writes nothing?");
        for (event, table) in writes {
            if matches!(m, Move::Approval | Move::Grant) {
                n += 1;
                x.approval_case(m, &event, &table, n, false).await;
            } else {
                n += 1;
                x.case(m, &event, &table, n, false).await;
            }
            faulted.insert(table);
        }
    }
    say(&format!("store_faults: {n} cases over {} tables: {faulted:?}", faulted.len()));
    for t in ["idempotency_records", "payments", "postings", "accounts", "budget_usage", "refund_usage", "mandates"] {
        assert!(faulted.contains(t), "{t} was never written by the matrix's calls");
    }
    for t in ["approvals", "approval_reviews", "webhook_outbox", "rail_payments", "audit_records"] {
        assert!(faulted.contains(t), "{t} was never written by the matrix's calls");
    }
    x.rig.app.assert_integrity().await;
    x.rig.app.stop().await;
}

/// Every write of the money calls, and of an approval asked for and granted, swallowed in turn (a
/// SQLite `RAISE(IGNORE)` trigger, a PostgreSQL BEFORE trigger returning NULL: the row dropped,
/// the statement successful — a database writer's quieter fault). Each call is refused retryably
/// with nothing moved, or went through whole: its books, the ledger's full integrity check and
/// the audit chain all hold, so no payment, posting, usage count, mandate draw or record is
/// missing behind an answer, and no approval stands without the review that granted it. Healed,
/// the same call converges on one payment (one approval).
async fn every_money_write_swallowed_is_refused_or_whole_and_the_retry_moves_once(db: Option<Db>) {
    let x = Matrix::warmed(db).await;
    let (mut n, mut swallowed) = (0, std::collections::BTreeSet::new());
    for m in EVERY_MOVE {
        n += 1;
        for (event, table) in writes_of(&x, m, n).await {
            n += 1;
            match m {
                Move::Approval | Move::Grant => x.approval_case(m, &event, &table, n, true).await,
                _ => x.case(m, &event, &table, n, true).await,
            }
            swallowed.insert(format!("{event} {table}"));
        }
    }
    say(&format!("store_faults: {n} swallowed writes: {swallowed:?}"));
    for t in [
        "INSERT payments",
        "INSERT postings",
        "UPDATE mandates",
        "INSERT rail_payments",
        "INSERT audit_records",
        "INSERT approvals",
        "INSERT approval_reviews",
        "INSERT webhook_outbox",
    ] {
        assert!(swallowed.contains(t), "{t} was never swallowed by the matrix's calls");
    }
    x.rig.app.assert_integrity().await;
    x.rig.app.stop().await;
}

/// The stop-66 review (medium): a trigger that rewrote a mandate's row after its draw (SQLite: an
/// AFTER UPDATE trigger setting the use count back; PostgreSQL: a BEFORE UPDATE trigger keeping
/// the old row) let an open mandate be drawn past its uses and budget with every check green. The
/// draw is read back where it commits: refused retryably, nothing moved; healed, it pays once. A
/// row lowered by hand afterwards is named by the full integrity check.
async fn a_mandate_row_that_does_not_show_its_draw_is_refused_and_a_lowered_one_is_named(db: Option<Db>) {
    let x = Matrix::start(db).await;
    let args = x.prepare(Move::MandatePayment, "rewrite-1").await;
    let before = x.books().await;
    let keep = match &x.rig.db {
        None => {
            "CREATE TRIGGER kept AFTER UPDATE OF uses ON mandates \
                 BEGIN UPDATE mandates SET uses = OLD.uses, spent_minor = OLD.spent_minor WHERE id = NEW.id; END;"
        }
        Some(_) => {
            "CREATE FUNCTION kept() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN OLD; END $$; \
                    CREATE TRIGGER kept BEFORE UPDATE ON mandates FOR EACH ROW EXECUTE FUNCTION kept();"
        }
    };
    x.rig.sql(keep).await;
    let refused = x.act(Move::MandatePayment, &args).await.expect_err("a draw its row does not show");
    assert_eq!(refused["retryable"], true, "{refused}");
    assert_eq!(x.books().await, before, "nothing moved: {refused}");
    match &x.rig.db {
        None => x.rig.sql("DROP TRIGGER kept").await,
        Some(_) => x.rig.sql("DROP FUNCTION kept() CASCADE").await,
    }
    let paid = x.act(Move::MandatePayment, &args).await.unwrap();
    x.holds(Move::MandatePayment, &paid, &before, "healed").await;
    x.rig.app.assert_integrity().await;
    // Lowered by hand after the payment: the full check names the mandate.
    x.rig.sql("UPDATE mandates SET uses = 0, spent_minor = 0").await;
    let report = x.rig.app.running.store.ledger_integrity().await.unwrap();
    assert!(!report.ok, "a mandate drawn more than its row says passed the full check");
    assert!(report.problems.iter().any(|p| p.contains("mdt_")), "{:?}", report.problems);
    x.rig.app.stop().await;
}

// ── A slow store ──────────────────────────────────────────────────────────────────────────────────

/// Make the store slow until the returned guard is dropped: on PostgreSQL every row written to a
/// money table waits `SLOW_MS` first (a trigger, latency per statement, locks held meanwhile); on
/// SQLite another connection holds the write lock `SLOW_MS` of every `SLOW_MS + 10` ms (a disk
/// that keeps the writer waiting), so every write waits its turn.
const SLOW_MS: u64 = 40;

struct Slow {
    stop: Option<std::sync::Arc<std::sync::atomic::AtomicBool>>,
    holder: Option<std::thread::JoinHandle<()>>,
    /// SQLite: how many times the other connection has held the write lock.
    holds: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Rig {
    async fn slow(&self) -> Slow {
        match &self.db {
            None => {
                let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
                let holds = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
                let (flag, held, path) = (stop.clone(), holds.clone(), self.app.data_dir.join("paygate.sqlite3"));
                let holder = std::thread::spawn(move || {
                    let db = rusqlite::Connection::open(path).unwrap();
                    // No busy handler: it asks again every millisecond, so it takes the lock as
                    // soon as the gateway's writer lets go (SQLite's own handler backs off to
                    // 100 ms, and would leave the lock to the gateway).
                    db.busy_timeout(std::time::Duration::ZERO).unwrap();
                    while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                        if db.execute_batch("BEGIN IMMEDIATE").is_err() {
                            std::thread::sleep(std::time::Duration::from_millis(1));
                            continue;
                        }
                        held.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        std::thread::sleep(std::time::Duration::from_millis(SLOW_MS));
                        db.execute_batch("COMMIT").unwrap();
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                });
                // Slow from the first call on: the lock has been taken once before any is made.
                while holds.load(std::sync::atomic::Ordering::Relaxed) == 0 {
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                }
                Slow { stop: Some(stop), holder: Some(holder), holds }
            }
            Some(_) => {
                let mut sql = format!(
                    "CREATE FUNCTION slow_store() RETURNS trigger LANGUAGE plpgsql AS \
                     $$ BEGIN PERFORM pg_sleep({}); RETURN NEW; END $$;",
                    SLOW_MS as f64 / 1000.0
                );
                for t in MONEY_TABLES {
                    sql += &format!(
                        "CREATE TRIGGER slow_store BEFORE INSERT OR UPDATE ON {t} FOR EACH ROW EXECUTE FUNCTION slow_store();"
                    );
                }
                self.sql(&sql).await;
                Slow { stop: None, holder: None, holds: Default::default() }
            }
        }
    }

    async fn fast(&self, mut slow: Slow) {
        if let Some(stop) = slow.stop.take() {
            stop.store(true, std::sync::atomic::Ordering::Relaxed);
        }
        if let Some(holder) = slow.holder.take() {
            tokio::task::spawn_blocking(move || holder.join().unwrap()).await.unwrap();
        }
        if self.db.is_some() {
            self.sql("DROP FUNCTION slow_store() CASCADE").await;
        }
    }
}

/// Payments and payouts sent three times each at once (an agent and its retries racing) while
/// every write waits: each answer is what committed or a typed, retryable refusal; once the store
/// is fast again every operation's retry converges on one payment, each moved once at the ledger
/// or sent once to Daraja, each named by the audit trail.
async fn a_slow_store_keeps_every_operation_once_under_racing_retries(db: Option<Db>) {
    let x = std::sync::Arc::new(Matrix::start(db).await);
    let before = x.books().await;
    let ops: Vec<(Move, String)> =
        (0..6).map(|i| (if i % 2 == 0 { Move::Payment } else { Move::Payout }, format!("slow-{i}"))).collect();
    let slow = x.rig.slow().await;
    let began = std::time::Instant::now();
    let mut racing = tokio::task::JoinSet::new();
    for (m, op) in &ops {
        for _ in 0..3 {
            let (x, m, op) = (x.clone(), *m, op.clone());
            racing.spawn(async move {
                let args = if m == Move::Payment { pay(&op, "10.00") } else { payout(&op) };
                (op, x.act(m, &args).await)
            });
        }
    }
    let (mut answered, mut oks) = (std::collections::BTreeMap::<String, String>::new(), 0);
    while let Some(done) = racing.join_next().await {
        let (op, answer) = done.unwrap();
        match answer {
            Ok(a) => {
                oks += 1;
                let id = a["payment_id"].as_str().unwrap().to_string();
                let earlier = answered.insert(op.clone(), id.clone());
                assert!(
                    earlier.as_ref().is_none_or(|e| *e == id),
                    "{op}: two payments for one operation: {earlier:?}, {id}"
                );
            }
            Err(e) => {
                assert_eq!(e["retryable"], true, "{op}: {e}");
                let code = e["code"].as_str().unwrap();
                // (A payout Daraja took whose record could not say so in time: its outcome is not
                // known to the gateway, and it says so.)
                let honest = ["OPERATION_IN_PROGRESS", "INTERNAL", "BACKEND_UNAVAILABLE", "OUTCOME_UNKNOWN"];
                assert!(honest.contains(&code), "{op}: {e}");
            }
        }
    }
    let (took, holds) = (began.elapsed(), slow.holds.load(std::sync::atomic::Ordering::Relaxed));
    say(&format!(
        "store_faults: slow store, 18 racing calls in {took:?}: {oks} answered, {} refused (SQLite lock held {holds} times)",
        18 - oks
    ));
    x.rig.fast(slow).await;
    x.clock.advance(LEASE_SECS + 1);
    for (m, op) in &ops {
        let args = if *m == Move::Payment { pay(op, "10.00") } else { payout(op) };
        let mut again = x.act(*m, &args).await;
        for _ in 0..3 {
            let Err(e) = &again else { break };
            // A payout whose outcome the gateway does not know: Daraja's result settles it (every
            // payout Daraja took is answered; a settled one answers 409), and the retry after the
            // key's lease finds it.
            assert!(
                *m == Move::Payout
                    && ["OUTCOME_UNKNOWN", "OPERATION_IN_PROGRESS"].contains(&e["code"].as_str().unwrap()),
                "{op}: {e}"
            );
            for sent in x.fake.payouts() {
                x.fake.post_result(&sent.originator_conversation_id, 0).await;
            }
            x.clock.advance(LEASE_SECS + 1);
            again = x.act(*m, &args).await;
        }
        let again = again.unwrap_or_else(|e| panic!("{op} once the store is fast: {e}"));
        let id = again["payment_id"].as_str().unwrap();
        if let Some(earlier) = answered.get(op) {
            assert_eq!(earlier, id, "{op}: the retry is the payment already answered");
        }
        assert!(x.audited("payment", id).await, "{op}: no audit record names {id}");
    }
    let after = x.books().await;
    let minor = |s: &str| (s.parse::<f64>().unwrap() * 100.0).round() as i64;
    assert_eq!(minor(&before.a) - minor(&after.a), 3 * 1_000, "three payments of 10.00 moved once each");
    assert_eq!(minor(&after.b) - minor(&before.b), 3 * 1_000);
    assert_eq!((after.payments, after.sent), (before.payments + 6, before.sent + 3), "one payment per operation");
    x.rig.app.assert_integrity().await;
}

/// The stop-65 review (high): a swallowed rail record (the row dropped, the statement successful)
/// let the gateway send a payout it had no record of, and send it again on every retry after the
/// key's lease; a swallowed audit record let one settle unnamed. On both engines, a payout whose
/// record or "submitted" record is swallowed is refused retryably and never sent; a result whose
/// record move is swallowed is refused and leaves the payout pending; healed, each goes through once.
async fn a_swallowed_rail_or_audit_write_sends_nothing_and_settles_nothing(db: Option<Db>) {
    let x = Matrix::start(db).await;
    for (n, (event, table)) in [("INSERT", "rail_payments"), ("INSERT", "audit_records")].into_iter().enumerate() {
        let what = format!("{event} on {table} swallowed");
        let args = x.prepare(Move::Payout, &format!("swallow-{n}")).await;
        let before = x.books().await;
        x.rig.swallow(event, table).await;
        for _ in 0..2 {
            let refused = x.act(Move::Payout, &args).await.expect_err(&what);
            assert_eq!(refused["retryable"], true, "{what}: {refused}");
            assert_ne!(refused["code"], "OUTCOME_UNKNOWN", "{what}: nothing was sent: {refused}");
            assert_eq!(x.books().await, before, "{what}: nothing moved, nothing sent");
            x.clock.advance(LEASE_SECS + 1);
        }
        x.rig.unswallow().await;
        let paid = x.act(Move::Payout, &args).await.unwrap_or_else(|e| panic!("{what}: healed: {e}"));
        assert_eq!(x.fake.b2c_requests(), before.sent + 1, "{what}: sent once");
        // Its result, with the record's move swallowed: refused, still pending; then settled once.
        let id = paid["payment_id"].as_str().unwrap();
        x.rig.swallow("UPDATE", "rail_payments").await;
        assert_ne!(x.fake.post_result(id, 0).await.as_u16(), 200, "{what}: a settle that did not happen");
        x.rig.unswallow().await;
        let p = call(&x.agent, "get_payment", json!({"payment_id": id})).await;
        assert_eq!(ok(&p)["status"], "pending", "{what}");
        assert_eq!(x.fake.post_result(id, 0).await.as_u16(), 200, "{what}");
        let p = call(&x.agent, "get_payment", json!({"payment_id": id})).await;
        assert_eq!(ok(&p)["status"], "succeeded", "{what}");
        assert!(x.audited("payment", id).await, "{what}");
    }
    x.rig.app.assert_integrity().await;
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
    an_unreadable_stored_outcome_is_refused_never_paid_again,
    every_money_write_failing_is_refused_or_committed_whole_and_the_retry_moves_once,
    a_slow_store_keeps_every_operation_once_under_racing_retries,
    a_swallowed_rail_or_audit_write_sends_nothing_and_settles_nothing,
    every_money_write_swallowed_is_refused_or_whole_and_the_retry_moves_once,
    a_mandate_row_that_does_not_show_its_draw_is_refused_and_a_lowered_one_is_named
);
