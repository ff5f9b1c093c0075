//! The PostgreSQL engine: state shared by replicas. Uniqueness and single use are enforced by the
//! database (UNIQUE constraints, row locks taken in one fixed order, advisory locks for budgets),
//! never by process memory.
//!
//! Lock order inside a posting transaction: the claimed keys → accounts (by id) → the subject's
//! budget (advisory) → the mandate row. Every transaction takes them in that order (a batch of
//! transfers, `batch.rs`, takes each kind sorted), so they cannot deadlock.
//!
//! Like every engine, it holds no business rule: it takes its locks, loads rows, asks
//! `domain::rules`, and writes the plan. This file connects, migrates and pools, and answers
//! `Engine`; each entity's SQL is in its own file (`idempotency.rs`, `approvals.rs`,
//! `suspensions.rs`, `audit.rs`, `ledger.rs` with the posting transactions in `postings.rs` and
//! their group commit in `batch.rs`, `rails.rs`, `reads.rs`, `leases.rs`).

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::error::SqlState;
use tokio_postgres::types::ToSql;
use tokio_postgres::{NoTls, Row};

/// A posting transaction retried once after a lost UNIQUE race (the winner's row is then visible).
macro_rules! with_retry {
    ($e:expr) => {{
        match $e {
            Ok(p) => Ok(p),
            Err(TxError::Backend(b)) => Err(b),
            Err(TxError::Retry) => match $e {
                Ok(p) => Ok(p),
                Err(TxError::Backend(b)) => Err(b),
                Err(TxError::Retry) => Err(BackendError::Unavailable("conflicting concurrent write".into())),
            },
        }
    }};
}

mod approvals;
mod audit;
pub mod batch;
mod idempotency;
mod leases;
mod ledger;
mod outbox;
mod passkeys;
mod payees;
mod policy;
mod postings;
mod rails;
mod reads;
mod suspensions;
pub mod tls;

// `postings.rs` reaches these through `super::`.
use audit::{INSERT_AUDIT, insert_audit};
use idempotency::reserve_key;

use super::queries::{Dialect, Statement};
use super::rows::{Cell, Columns, PlainRow, Value};
use super::{Engine, StoreError};
use crate::domain::error::BackendError;

const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/postgres/0001_init.sql"),
    include_str!("../../migrations/postgres/0002_budget_usage.sql"),
    include_str!("../../migrations/postgres/0003_rails.sql"),
    include_str!("../../migrations/postgres/0004_revocation.sql"),
    include_str!("../../migrations/postgres/0005_refund_usage.sql"),
    include_str!("../../migrations/postgres/0006_operator_reads.sql"),
    include_str!("../../migrations/postgres/0007_rail_flows.sql"),
    include_str!("../../migrations/postgres/0008_user_approvals.sql"),
    include_str!("../../migrations/postgres/0009_integrity_checkpoints.sql"),
    include_str!("../../migrations/postgres/0010_storage_params.sql"),
    include_str!("../../migrations/postgres/0011_principals.sql"),
    include_str!("../../migrations/postgres/0012_payees.sql"),
    include_str!("../../migrations/postgres/0013_webhooks.sql"),
    include_str!("../../migrations/postgres/0014_audit_chain.sql"),
    include_str!("../../migrations/postgres/0015_passkeys.sql"),
    include_str!("../../migrations/postgres/0016_policy_versions.sql"),
    include_str!("../../migrations/postgres/0017_rate_quotas.sql"),
    include_str!("../../migrations/postgres/0018_passkey_enrolment.sql"),
    include_str!("../../migrations/postgres/0019_payee_cooling.sql"),
    include_str!("../../migrations/postgres/0020_audit_by_user.sql"),
    include_str!("../../migrations/postgres/0021_audit_record_tags.sql"),
    include_str!("../../migrations/postgres/0022_policy_version_tags.sql"),
    include_str!("../../migrations/postgres/0023_refunds_by_original.sql"),
    include_str!("../../migrations/postgres/0024_payee_tags.sql"),
    include_str!("../../migrations/postgres/0025_approval_tags.sql"),
    include_str!("../../migrations/postgres/0026_rail_family_key.sql"),
    include_str!("../../migrations/postgres/0027_rail_refund_of.sql"),
];
/// Advisory lock key that serialises migrations between replicas starting together.
const MIGRATION_LOCK: i64 = 0x0070_6179_6761_7465;
/// Connections per replica (the pool's bound).
pub const POOL_SIZE_MAX: usize = 16;

/// The current snapshot's xmin as a BIGINT: every transaction below it has ended.
const SNAPSHOT_XMIN: &str = "SELECT pg_snapshot_xmin(pg_current_snapshot())::TEXT::BIGINT";

/// Every statement through the connection's prepared-statement cache: a statement is parsed and
/// planned once per connection, and each call is one round trip instead of two (prepare, then
/// execute). Under the account row locks, round trips are what other payments wait for.
trait Cached: GenericClient {
    async fn exec(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<u64, tokio_postgres::Error> {
        let stmt = self.prepare_cached(sql).await?;
        self.execute(&stmt, params).await
    }
    async fn one(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Row, tokio_postgres::Error> {
        let stmt = self.prepare_cached(sql).await?;
        self.query_one(&stmt, params).await
    }
    async fn opt(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Option<Row>, tokio_postgres::Error> {
        let stmt = self.prepare_cached(sql).await?;
        self.query_opt(&stmt, params).await
    }
    async fn all(
        &self,
        sql: &str,
        params: &[&(dyn tokio_postgres::types::ToSql + Sync)],
    ) -> Result<Vec<Row>, tokio_postgres::Error> {
        let stmt = self.prepare_cached(sql).await?;
        self.query(&stmt, params).await
    }
}

impl<T: GenericClient> Cached for T {}

/// Queries through a shared row mapper (`store::rows`).
trait Mapped: Cached {
    async fn get<T>(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        f: impl FnOnce(&dyn Columns) -> Result<T, StoreError>,
    ) -> Result<Option<T>, StoreError> {
        self.opt(sql, params).await?.map(|r| f(&r)).transpose()
    }
    async fn list<T>(
        &self,
        sql: &str,
        params: &[&(dyn ToSql + Sync)],
        f: impl Fn(&dyn Columns) -> Result<T, StoreError>,
    ) -> Result<Vec<T>, StoreError> {
        self.all(sql, params).await?.iter().map(|r| f(r)).collect()
    }
}

impl<T: GenericClient> Mapped for T {}

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        // tokio-postgres displays a server error as just "db error"; say which (SQLSTATE and
        // message), and a connection's failure with its causes (a TLS handshake's, say).
        StoreError::Database(pg_error_text(&e))
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        // A failed connection is the pool's "error while creating a new object": say why (the
        // server's refusal, a TLS failure), as a direct connection would.
        match &e {
            deadpool_postgres::PoolError::Backend(pg) => {
                let why = pg_error_text(pg);
                StoreError::Database(format!("connecting: {why}"))
            }
            _ => StoreError::Database(e.to_string()),
        }
    }
}

/// A tokio-postgres error as an operator can act on it.
fn pg_error_text(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{} ({}): {}", e, d.code().code(), d.message()),
        None => {
            let mut text = e.to_string();
            let mut source = std::error::Error::source(e);
            while let Some(s) = source {
                text.push_str(&format!(": {s}"));
                source = s.source();
            }
            text
        }
    }
}

fn db(e: impl Into<StoreError>) -> BackendError {
    BackendError::Unavailable(e.into().to_string())
}

/// Bind engine-neutral values (`store::rows`) as statement parameters.
fn bind(values: &[Value]) -> Vec<&(dyn ToSql + Sync)> {
    values
        .iter()
        .map(|v| -> &(dyn ToSql + Sync) {
            match v {
                Value::Text(s) => s,
                Value::Int(i) => i,
            }
        })
        .collect()
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
    /// Group commit for the common transfer (`batch.rs`).
    lanes: batch::Lanes,
}

impl PostgresStore {
    /// Connect (lazily, through a pool) and run migrations. `schema` isolates tests and tenants.
    /// TLS as the URL says (`sslmode=require`), else none: see [`PostgresStore::connect_with`].
    pub async fn connect(url: &str, schema: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, schema, &tls::TlsSettings::default()).await
    }

    /// Connect with `tls` (`storage.postgres_sslmode`, `storage.postgres_ssl_ca_file`).
    pub async fn connect_with(url: &str, schema: &str, tls: &tls::TlsSettings) -> Result<Self, StoreError> {
        tls::check_url(url)?;
        let mut cfg: tokio_postgres::Config =
            url.parse().map_err(|e: tokio_postgres::Error| StoreError::Database(e.to_string()))?;
        if !schema.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || schema.is_empty() {
            return Err(StoreError::Database("storage.postgres_schema must be letters, digits and _".into()));
        }
        // Options the URL already sets (`?options=-c statement_timeout=5000`, say) stay.
        let options = match cfg.get_options() {
            Some(own) if !own.trim().is_empty() => format!("{own} -c search_path={schema}"),
            _ => format!("-c search_path={schema}"),
        };
        cfg.options(options);
        cfg.connect_timeout(std::time::Duration::from_secs(5));
        let mode = tls.effective(&cfg);
        let recycling = ManagerConfig { recycling_method: RecyclingMethod::Fast };
        let manager = match tls::connector(mode, tls.ca_file.as_deref())? {
            Some(connector) => {
                cfg.ssl_mode(tokio_postgres::config::SslMode::Require);
                Manager::from_config(cfg, connector, recycling)
            }
            None => {
                cfg.ssl_mode(tokio_postgres::config::SslMode::Disable);
                Manager::from_config(cfg, NoTls, recycling)
            }
        };
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE_MAX)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(std::time::Duration::from_secs(10)))
            .create_timeout(Some(std::time::Duration::from_secs(5)))
            .build()
            .map_err(|e| StoreError::Database(e.to_string()))?;
        let lanes = batch::Lanes::start(&pool);
        let store = PostgresStore { pool, lanes };
        store.migrate(schema).await?;
        Ok(store)
    }

    /// The schema version in `schema`, read over one short connection: nothing is created or migrated.
    pub async fn schema_status(
        url: &str,
        schema: &str,
        tls: &tls::TlsSettings,
        timeout: std::time::Duration,
    ) -> Result<super::SchemaStatus, StoreError> {
        tls::check_url(url)?;
        let mut cfg: tokio_postgres::Config =
            url.parse().map_err(|e: tokio_postgres::Error| StoreError::Database(e.to_string()))?;
        if !schema.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || schema.is_empty() {
            return Err(StoreError::Database("storage.postgres_schema must be letters, digits and _".into()));
        }
        cfg.connect_timeout(timeout);
        let no_answer = |_| StoreError::Database(format!("no answer within {} ms", timeout.as_millis()));
        let (client, driver) = match tls::connector(tls.effective(&cfg), tls.ca_file.as_deref())? {
            Some(connector) => {
                cfg.ssl_mode(tokio_postgres::config::SslMode::Require);
                let (client, connection) =
                    tokio::time::timeout(timeout, cfg.connect(connector)).await.map_err(no_answer)??;
                (client, tokio::spawn(async move { drop(connection.await) }))
            }
            None => {
                cfg.ssl_mode(tokio_postgres::config::SslMode::Disable);
                let (client, connection) =
                    tokio::time::timeout(timeout, cfg.connect(NoTls)).await.map_err(no_answer)??;
                (client, tokio::spawn(async move { drop(connection.await) }))
            }
        };
        let table = format!("{schema}.schema_migrations");
        let applied = match client.query_one(&format!("SELECT COALESCE(MAX(version), 0) FROM {table}"), &[]).await {
            Ok(row) => row.get::<_, i64>(0),
            Err(e) if e.code() == Some(&SqlState::UNDEFINED_TABLE) => 0,
            Err(e) => return Err(e.into()),
        };
        drop(client);
        let _ = driver.await;
        Ok(super::SchemaStatus { applied, known: MIGRATIONS.len() as i64 })
    }

    /// How much group commit has happened on this store (`batch.rs`).
    pub fn batch_stats(&self) -> &batch::BatchStats {
        &self.lanes.stats
    }

    async fn migrate(&self, schema: &str) -> Result<(), StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        tx.exec("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
        // Under the lock: replicas starting at once on a fresh schema would otherwise race on
        // CREATE SCHEMA IF NOT EXISTS, and the losers fail (23505 on the catalog).
        tx.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}")).await?;
        tx.batch_execute("CREATE TABLE IF NOT EXISTS schema_migrations (version BIGINT PRIMARY KEY, applied_at TIMESTAMPTZ NOT NULL DEFAULT now())")
            .await?;
        let applied: i64 = tx.one("SELECT COALESCE(MAX(version), 0) FROM schema_migrations", &[]).await?.get(0);
        for (i, sql) in MIGRATIONS.iter().enumerate().skip(applied as usize) {
            tx.batch_execute(sql).await?;
            tx.exec("INSERT INTO schema_migrations (version) VALUES ($1)", &[&((i + 1) as i64)]).await?;
        }
        tx.commit().await?;
        Ok(())
    }
}

fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

/// A posting transaction's failure: a business refusal, or a lost race on a UNIQUE key (retry).
enum TxError {
    Backend(BackendError),
    Retry,
}

impl TxError {
    fn pg(e: tokio_postgres::Error) -> Self {
        if is_unique_violation(&e) { TxError::Retry } else { TxError::Backend(db(e)) }
    }
    fn store(e: StoreError) -> Self {
        TxError::Backend(db(e))
    }
}

#[async_trait]
impl Engine for PostgresStore {
    async fn ping(&self) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client.one("SELECT 1", &[]).await?;
        Ok(())
    }

    fn group_commit(&self) -> Option<super::GroupCommit> {
        use std::sync::atomic::Ordering::Relaxed;
        let s = self.batch_stats();
        Some(super::GroupCommit {
            transfers: s.submitted.load(Relaxed),
            grouped_batches: s.grouped_batches.load(Relaxed),
            grouped_transfers: s.grouped_transfers.load(Relaxed),
            fallbacks: s.fallbacks.load(Relaxed),
        })
    }

    fn dialect(&self) -> Dialect {
        Dialect::Postgres
    }

    async fn select_rows(&self, st: Statement) -> Result<Vec<PlainRow>, StoreError> {
        use tokio_postgres::types::Type;
        let client = self.pool.get().await?;
        let mut out = Vec::new();
        for row in client.all(&st.text, &bind(&st.params)).await? {
            let cells = (0..row.len())
                .map(|i| {
                    let t = row.columns()[i].type_();
                    Ok(if *t == Type::INT8 {
                        row.try_get::<_, Option<i64>>(i)?.map_or(Cell::Null, Cell::Int)
                    } else if *t == Type::INT4 {
                        row.try_get::<_, Option<i32>>(i)?.map_or(Cell::Null, |v| Cell::Int(v.into()))
                    } else if *t == Type::BOOL {
                        row.try_get::<_, Option<bool>>(i)?.map_or(Cell::Null, Cell::Bool)
                    } else {
                        row.try_get::<_, Option<String>>(i)?.map_or(Cell::Null, Cell::Text)
                    })
                })
                .collect::<Result<Vec<Cell>, tokio_postgres::Error>>()?;
            out.push(PlainRow(cells));
        }
        Ok(out)
    }
}
