//! The PostgreSQL engine: state shared by replicas. Uniqueness and single use are enforced by the
//! database (UNIQUE constraints, row locks taken in one fixed order, advisory locks for budgets),
//! never by process memory.
//!
//! Lock order inside a posting transaction: accounts (by id) → the subject's budget (advisory) →
//! the mandate row. Every transaction takes them in that order, so they cannot deadlock.

use async_trait::async_trait;
use deadpool_postgres::GenericClient;
use deadpool_postgres::{Manager, ManagerConfig, Pool, RecyclingMethod};
use tokio_postgres::error::SqlState;
use tokio_postgres::{IsolationLevel, NoTls, Row};

mod rails;

use super::{
    AccountSeed, ApprovalRecord, AuditRecord, DENIAL_CODES, MandateIssuer, NewIdempotencyRecord, RailOpened,
    RailPayment, RailState, RailUpdate, Reservation, Review, ReviewError, Store, StoreError, SummaryQuery, SummaryRow,
    kind_str, same_transfer,
};
use crate::backend::{
    BackendError, Balance, Guards, IntegrityReport, LedgerEntry, Page, Payment, PaymentKind, PaymentQuery,
    PaymentStatus, RefundRequest, TransferRequest,
};
use crate::clock::UnixSecs;
use crate::idempotency::StoredOutcome;
use crate::ids::{AccountId, ApprovalId, PaymentId};
use crate::mandate::MandateKind;
use crate::money::{Currency, format_minor};

const MIGRATIONS: &[&str] = &[
    include_str!("../../migrations/postgres/0001_init.sql"),
    include_str!("../../migrations/postgres/0002_budget_usage.sql"),
    include_str!("../../migrations/postgres/0003_rails.sql"),
];
/// Advisory lock key that serialises migrations between replicas starting together.
const MIGRATION_LOCK: i64 = 0x0070_6179_6761_7465;
/// Connections per replica (the pool's bound).
pub const POOL_SIZE_MAX: usize = 16;

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

impl From<tokio_postgres::Error> for StoreError {
    fn from(e: tokio_postgres::Error) -> Self {
        // tokio-postgres displays a server error as just "db error"; say which (SQLSTATE and message).
        match e.as_db_error() {
            Some(d) => StoreError::Database(format!("{} ({}): {}", e, d.code().code(), d.message())),
            None => StoreError::Database(e.to_string()),
        }
    }
}

impl From<deadpool_postgres::PoolError> for StoreError {
    fn from(e: deadpool_postgres::PoolError) -> Self {
        StoreError::Database(e.to_string())
    }
}

fn db(e: impl Into<StoreError>) -> BackendError {
    BackendError::Unavailable(e.into().to_string())
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

#[derive(Clone)]
pub struct PostgresStore {
    pool: Pool,
}

impl PostgresStore {
    /// Connect (lazily, through a pool) and run migrations. `schema` isolates tests and tenants.
    pub async fn connect(url: &str, schema: &str) -> Result<Self, StoreError> {
        let mut cfg: tokio_postgres::Config =
            url.parse().map_err(|e: tokio_postgres::Error| StoreError::Database(e.to_string()))?;
        if !schema.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || schema.is_empty() {
            return Err(StoreError::Database("storage.postgres_schema must be letters, digits and _".into()));
        }
        cfg.options(format!("-c search_path={schema}"));
        cfg.connect_timeout(std::time::Duration::from_secs(5));
        let manager = Manager::from_config(cfg, NoTls, ManagerConfig { recycling_method: RecyclingMethod::Fast });
        let pool = Pool::builder(manager)
            .max_size(POOL_SIZE_MAX)
            .runtime(deadpool_postgres::Runtime::Tokio1)
            .wait_timeout(Some(std::time::Duration::from_secs(10)))
            .create_timeout(Some(std::time::Duration::from_secs(5)))
            .build()
            .map_err(|e| StoreError::Database(e.to_string()))?;
        let store = PostgresStore { pool };
        store.migrate(schema).await?;
        Ok(store)
    }

    /// The schema version in `schema`, read over one short connection: nothing is created or migrated.
    pub async fn schema_status(
        url: &str,
        schema: &str,
        timeout: std::time::Duration,
    ) -> Result<super::SchemaStatus, StoreError> {
        let mut cfg: tokio_postgres::Config =
            url.parse().map_err(|e: tokio_postgres::Error| StoreError::Database(e.to_string()))?;
        if !schema.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') || schema.is_empty() {
            return Err(StoreError::Database("storage.postgres_schema must be letters, digits and _".into()));
        }
        cfg.connect_timeout(timeout);
        let (client, connection) = tokio::time::timeout(timeout, cfg.connect(NoTls))
            .await
            .map_err(|_| StoreError::Database(format!("no answer within {} ms", timeout.as_millis())))??;
        let driver = tokio::spawn(connection);
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

    async fn migrate(&self, schema: &str) -> Result<(), StoreError> {
        let mut client = self.pool.get().await?;
        client.batch_execute(&format!("CREATE SCHEMA IF NOT EXISTS {schema}")).await?;
        let tx = client.transaction().await?;
        tx.exec("SELECT pg_advisory_xact_lock($1)", &[&MIGRATION_LOCK]).await?;
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

const PAYMENT_COLS: &str = "id, kind, status, from_account, to_account, amount_minor, currency, refunded_minor, \
                            refund_of, memo, principal_sub, created_at, seq";

fn payment_from_row(r: &Row) -> Result<(Payment, i64), StoreError> {
    let id: String = r.get(0);
    let kind: String = r.get(1);
    let status: String = r.get(2);
    let refund_of: Option<String> = r.get(8);
    let payment = Payment {
        id: PaymentId::parse(&id).map_err(|_| corrupt("payments.id"))?,
        kind: match kind.as_str() {
            "payment" => PaymentKind::Payment,
            "refund" => PaymentKind::Refund,
            _ => return Err(corrupt("payments.kind")),
        },
        status: PaymentStatus::parse(&status).ok_or_else(|| corrupt("payments.status"))?,
        from_account: AccountId::parse(r.get(3)).map_err(|_| corrupt("payments.from_account"))?,
        to_account: AccountId::parse(r.get(4)).map_err(|_| corrupt("payments.to_account"))?,
        amount_minor: r.get(5),
        currency: Currency::parse(r.get(6)).map_err(|_| corrupt("payments.currency"))?,
        refunded_minor: r.get(7),
        refund_of: refund_of.map(|s| PaymentId::parse(&s).map_err(|_| corrupt("payments.refund_of"))).transpose()?,
        memo: r.get(9),
        principal_sub: r.get(10),
        created_at: r.get(11),
    };
    Ok((payment, r.get(12)))
}

async fn load_payment(
    c: &impl GenericClient,
    column: &str,
    value: &str,
    lock: bool,
) -> Result<Option<Payment>, StoreError> {
    let lock = if lock { " FOR UPDATE" } else { "" };
    let row = c.opt(&format!("SELECT {PAYMENT_COLS} FROM payments WHERE {column} = $1{lock}"), &[&value]).await?;
    row.map(|r| payment_from_row(&r).map(|(p, _)| p)).transpose()
}

struct AccountRow {
    currency: Currency,
    balance: i64,
    allow_overdraft: bool,
}

/// Lock both accounts (in id order) and return them.
async fn lock_accounts(
    c: &impl GenericClient,
    a: &AccountId,
    b: &AccountId,
) -> Result<(AccountRow, AccountRow), BackendError> {
    let ids = vec![a.as_str().to_string(), b.as_str().to_string()];
    let rows = c
        .all(
            "SELECT id, currency, balance_minor, allow_overdraft FROM accounts WHERE id = ANY($1) ORDER BY id FOR UPDATE",
            &[&ids],
        )
        .await
        .map_err(db)?;
    let find = |id: &AccountId| -> Result<AccountRow, BackendError> {
        let r = rows
            .iter()
            .find(|r| r.get::<_, &str>(0) == id.as_str())
            .ok_or_else(|| BackendError::AccountNotFound(id.clone()))?;
        Ok(AccountRow {
            currency: Currency::parse(r.get(1))
                .map_err(|_| BackendError::Unavailable("corrupt account currency".into()))?,
            balance: r.get(2),
            allow_overdraft: r.get(3),
        })
    };
    Ok((find(a)?, find(b)?))
}

async fn post(
    c: &impl GenericClient,
    payment_id: Option<&str>,
    account: &str,
    amount: i64,
    currency: Currency,
    description: &str,
    now: UnixSecs,
) -> Result<i64, StoreError> {
    let balance: i64 = c
        .one(
            "UPDATE accounts SET balance_minor = balance_minor + $1 WHERE id = $2 RETURNING balance_minor",
            &[&amount, &account],
        )
        .await?
        .get(0);
    c.exec(
        "INSERT INTO postings (payment_id, account_id, amount_minor, currency, balance_after_minor, description, created_at)
         VALUES ($1, $2, $3, $4, $5, $6, $7)",
        &[&payment_id, &account, &amount, &currency.code(), &balance, &description, &now],
    )
    .await?;
    Ok(balance)
}

async fn insert_payment(
    c: &impl GenericClient,
    p: &Payment,
    key: &str,
    mandate_id: Option<&str>,
) -> Result<(), tokio_postgres::Error> {
    c.exec(
        "INSERT INTO payments (id, idempotency_key, kind, status, from_account, to_account, amount_minor, currency,
                               refunded_minor, refund_of, memo, principal_sub, created_at, mandate_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        &[
            &p.id.as_str(),
            &key,
            &p.kind.as_str(),
            &p.status.as_str(),
            &p.from_account.as_str(),
            &p.to_account.as_str(),
            &p.amount_minor,
            &p.currency.code(),
            &p.refunded_minor,
            &p.refund_of.as_ref().map(|r| r.as_str()),
            &p.memo,
            &p.principal_sub,
            &p.created_at,
            &mandate_id,
        ],
    )
    .await?;
    Ok(())
}

async fn complete_in_tx(
    c: &impl GenericClient,
    key: &str,
    alias: Option<&str>,
    payment: &Payment,
) -> Result<(), StoreError> {
    let outcome = StoredOutcome::Succeeded { payment: payment.clone() }.to_json();
    for k in std::iter::once(key).chain(alias) {
        c.exec(
            "UPDATE idempotency_records SET state = 'completed', outcome = $1 WHERE key = $2 AND state = 'in_flight'",
            &[&outcome, &k],
        )
        .await?;
    }
    Ok(())
}

async fn apply_guards(
    c: &impl GenericClient,
    guards: &Guards,
    principal_sub: &str,
    amount: i64,
    currency: Currency,
    now: UnixSecs,
) -> Result<(), BackendError> {
    if let Some(b) = &guards.budget {
        // One subject's autonomous payments serialise here, so the sum below cannot go stale.
        c.exec("SELECT pg_advisory_xact_lock(hashtextextended('budget:' || $1, 0))", &[&principal_sub])
            .await
            .map_err(db)?;
        let row = c
            .one(
                "SELECT COALESCE(SUM(payments), 0)::BIGINT,
                        COALESCE(SUM(CASE WHEN currency = $3 THEN spent_minor ELSE 0 END), 0)::BIGINT
                 FROM budget_usage WHERE subject = $1 AND day = $2",
                &[&principal_sub, &b.since, &currency.code()],
            )
            .await
            .map_err(db)?;
        let (count, spent): (i64, i64) = (row.get(0), row.get(1));
        if count >= b.max_payments {
            return Err(BackendError::BudgetExceeded(format!(
                "{count} payments today reach the daily maximum of {}",
                b.max_payments
            )));
        }
        if spent + amount > b.max_minor {
            return Err(BackendError::BudgetExceeded(format!(
                "{currency} {} spent today plus {} exceeds the daily limit of {}",
                format_minor(spent, currency),
                format_minor(amount, currency),
                format_minor(b.max_minor, currency)
            )));
        }
    }
    if let Some(d) = &guards.mandate {
        let row = c
            .opt(
                "SELECT currency, budget_minor, max_uses, spent_minor, uses, expires_at FROM mandates WHERE id = $1 FOR UPDATE",
                &[&d.mandate_id],
            )
            .await
            .map_err(db)?;
        let Some(row) = row else {
            return Err(BackendError::MandateExhausted("this gateway did not issue it".into()));
        };
        let (cur, budget, max_uses, spent, uses, expires_at): (String, Option<i64>, i64, i64, i64, i64) =
            (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4), row.get(5));
        if cur != currency.code() || now >= expires_at {
            return Err(BackendError::MandateExhausted("it does not cover this payment".into()));
        }
        if uses >= max_uses {
            return Err(BackendError::MandateExhausted(format!("all {max_uses} uses are spent")));
        }
        if budget.is_some_and(|b| spent + amount > b) {
            return Err(BackendError::MandateExhausted("its budget is spent".into()));
        }
        c.exec(
            "UPDATE mandates SET uses = uses + 1, spent_minor = spent_minor + $1 WHERE id = $2",
            &[&amount, &d.mandate_id],
        )
        .await
        .map_err(db)?;
    }
    Ok(())
}

async fn insert_audit(c: &impl GenericClient, r: &AuditRecord, payment_id: Option<&str>) -> Result<(), StoreError> {
    c.exec(
        "INSERT INTO audit_records (at, correlation_id, principal_iss, principal_sub, tool, decision, code,
                                    idempotency_key, payment_id, approval_id, detail)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)",
        &[
            &r.at,
            &r.correlation_id,
            &r.principal_iss,
            &r.principal_sub,
            &r.tool,
            &r.decision,
            &r.code,
            &r.idempotency_key,
            &payment_id.or(r.payment_id.as_deref()),
            &r.approval_id,
            &r.detail,
        ],
    )
    .await?;
    Ok(())
}

/// The request's audit record, with the payment it produced, in the posting transaction.
async fn audit_in_tx(c: &impl GenericClient, audit: &Option<AuditRecord>, payment: &Payment) -> Result<(), StoreError> {
    match audit {
        Some(r) => insert_audit(c, r, Some(payment.id.as_str())).await,
        None => Ok(()),
    }
}

fn is_unique_violation(e: &tokio_postgres::Error) -> bool {
    e.code() == Some(&SqlState::UNIQUE_VIOLATION)
}

const APPROVAL_COLS: &str = "id, status, idempotency_key, fingerprint, principal_iss, principal_sub, tool, intent, \
                             amount_minor, currency, reason, created_at, expires_at, kind, reviewers_required, \
                             requested_by, mandate_id, mandate, decided_at, decision_reason, seq";

fn approval_from_row(r: &Row) -> Result<ApprovalRecord, StoreError> {
    let intent: String = r.get(7);
    let kind: String = r.get(13);
    Ok(ApprovalRecord {
        id: ApprovalId::parse(r.get(0)).map_err(|_| corrupt("approvals.id"))?,
        status: r.get(1),
        kind: match kind.as_str() {
            "closed" => MandateKind::Closed,
            "open" => MandateKind::Open,
            _ => return Err(corrupt("approvals.kind")),
        },
        idempotency_key: r.get(2),
        fingerprint: r.get(3),
        principal_iss: r.get(4),
        principal_sub: r.get(5),
        tool: r.get(6),
        intent: serde_json::from_str(&intent).map_err(|_| corrupt("approvals.intent"))?,
        amount_minor: r.get(8),
        currency: Currency::parse(r.get(9)).map_err(|_| corrupt("approvals.currency"))?,
        reason: r.get(10),
        created_at: r.get(11),
        expires_at: r.get(12),
        reviewers_required: r.get(14),
        requested_by: r.get(15),
        mandate_id: r.get(16),
        mandate: r.get(17),
        decided_at: r.get(18),
        decision_reason: r.get(19),
        reviews: vec![],
    })
}

async fn insert_approval(c: &impl GenericClient, rec: &ApprovalRecord) -> Result<(), StoreError> {
    c.exec(
        "INSERT INTO approvals (id, status, idempotency_key, fingerprint, principal_iss, principal_sub, tool, intent,
                                amount_minor, currency, reason, created_at, expires_at, kind, reviewers_required,
                                requested_by, mandate_id, mandate, decided_at, decision_reason)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)",
        &[
            &rec.id.as_str(),
            &rec.status,
            &rec.idempotency_key,
            &rec.fingerprint,
            &rec.principal_iss,
            &rec.principal_sub,
            &rec.tool,
            &rec.intent.to_string(),
            &rec.amount_minor,
            &rec.currency.code(),
            &rec.reason,
            &rec.created_at,
            &rec.expires_at,
            &kind_str(rec.kind),
            &rec.reviewers_required,
            &rec.requested_by,
            &rec.mandate_id,
            &rec.mandate,
            &rec.decided_at,
            &rec.decision_reason,
        ],
    )
    .await?;
    Ok(())
}

async fn load_reviews(c: &impl GenericClient, id: &str) -> Result<Vec<Review>, StoreError> {
    let rows = c
        .all(
            "SELECT reviewer_iss, reviewer_sub, decision, reason, at FROM approval_reviews WHERE approval_id = $1 ORDER BY at, seq",
            &[&id],
        )
        .await?;
    Ok(rows
        .iter()
        .map(|r| Review {
            reviewer_iss: r.get(0),
            reviewer_sub: r.get(1),
            decision: r.get(2),
            reason: r.get(3),
            at: r.get(4),
        })
        .collect())
}

async fn load_approval(c: &impl GenericClient, id: &str, lock: bool) -> Result<Option<ApprovalRecord>, StoreError> {
    let lock = if lock { " FOR UPDATE" } else { "" };
    let Some(row) = c.opt(&format!("SELECT {APPROVAL_COLS} FROM approvals WHERE id = $1{lock}"), &[&id]).await? else {
        return Ok(None);
    };
    let mut a = approval_from_row(&row)?;
    a.reviews = load_reviews(c, a.id.as_str()).await?;
    Ok(Some(a))
}

impl PostgresStore {
    /// `None` when the row vanished between the INSERT and the SELECT (released concurrently).
    /// One statement inserts the record or locks the existing one: `ON CONFLICT DO UPDATE` never
    /// reports a conflict with a row that a concurrent release deleted (a plain `DO NOTHING` followed
    /// by a `SELECT` can find the row gone, and a herd of waiters on a hot key would keep finding that).
    async fn reserve_locked(&self, rec: &NewIdempotencyRecord, now: UnixSecs) -> Result<Reservation, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let row = tx
            .one(
                "INSERT INTO idempotency_records
                   (key, fingerprint, tool, principal_iss, principal_sub, state, outcome, lease_until, created_at, expires_at)
                 VALUES ($1, $2, $3, $4, $5, 'in_flight', NULL, $6, $7, $8)
                 ON CONFLICT (key) DO UPDATE SET key = idempotency_records.key
                 RETURNING (xmax = 0), fingerprint, state, outcome, lease_until, expires_at",
                &[&rec.key, &rec.fingerprint, &rec.tool, &rec.principal_iss, &rec.principal_sub, &rec.lease_until, &now, &rec.expires_at],
            )
            .await?;
        let (inserted, fingerprint, state, outcome, lease_until, expires_at): (
            bool,
            String,
            String,
            Option<String>,
            i64,
            i64,
        ) = (row.get(0), row.get(1), row.get(2), row.get(3), row.get(4), row.get(5));
        let result = if inserted {
            Reservation::Acquired
        } else if expires_at <= now {
            tx.exec(
                "UPDATE idempotency_records SET fingerprint = $2, tool = $3, principal_iss = $4, principal_sub = $5,
                        state = 'in_flight', outcome = NULL, lease_until = $6, created_at = $7, expires_at = $8 WHERE key = $1",
                &[&rec.key, &rec.fingerprint, &rec.tool, &rec.principal_iss, &rec.principal_sub, &rec.lease_until, &now, &rec.expires_at],
            )
            .await?;
            Reservation::Acquired
        } else {
            match (state.as_str(), outcome) {
                ("completed", Some(outcome)) => Reservation::Completed { fingerprint, outcome },
                ("in_flight", _) if lease_until > now || fingerprint != rec.fingerprint => {
                    Reservation::InFlight { fingerprint }
                }
                ("in_flight", _) => {
                    tx.exec(
                        "UPDATE idempotency_records SET lease_until = $1 WHERE key = $2",
                        &[&rec.lease_until, &rec.key],
                    )
                    .await?;
                    Reservation::Acquired
                }
                _ => return Err(StoreError::Corrupt(format!("idempotency record in state {state:?}"))),
            }
        };
        tx.commit().await?;
        Ok(result)
    }

    async fn transfer_once(&self, req: &TransferRequest, now: UnixSecs) -> Result<Payment, TxError> {
        let mut client = self.pool.get().await.map_err(|e| TxError::Backend(db(e)))?;
        let tx = client.transaction().await.map_err(TxError::pg)?;
        if req.from_account == req.to_account {
            return Err(TxError::Backend(BackendError::SameAccount));
        }
        let (from, to) = lock_accounts(&tx, &req.from_account, &req.to_account).await.map_err(TxError::Backend)?;
        // Under the account locks: a committed payment with this key is visible now.
        if let Some(existing) =
            load_payment(&tx, "idempotency_key", &req.idempotency_key, false).await.map_err(TxError::store)?
        {
            if !same_transfer(&existing, req) {
                return Err(TxError::Backend(BackendError::IdempotencyKeyReused));
            }
            complete_in_tx(&tx, &req.idempotency_key, req.alias_key.as_deref(), &existing)
                .await
                .map_err(TxError::store)?;
            audit_in_tx(&tx, &req.audit, &existing).await.map_err(TxError::store)?;
            tx.commit().await.map_err(TxError::pg)?;
            return Ok(existing);
        }
        let currency = req.amount.currency();
        for (id, acct) in [(&req.from_account, &from), (&req.to_account, &to)] {
            if acct.currency != currency {
                return Err(TxError::Backend(BackendError::CurrencyMismatch {
                    account: id.clone(),
                    account_currency: acct.currency,
                    requested: currency,
                }));
            }
        }
        let amount = req.amount.minor();
        if !from.allow_overdraft && from.balance < amount {
            return Err(TxError::Backend(BackendError::InsufficientFunds {
                account: req.from_account.clone(),
                balance: format_minor(from.balance, currency),
                needed: req.amount.to_decimal(),
            }));
        }
        apply_guards(&tx, &req.guards, &req.principal_sub, amount, currency, now).await.map_err(TxError::Backend)?;
        let payment = Payment {
            id: req.payment_id.clone(),
            kind: PaymentKind::Payment,
            status: PaymentStatus::Succeeded,
            from_account: req.from_account.clone(),
            to_account: req.to_account.clone(),
            amount_minor: amount,
            currency,
            refunded_minor: 0,
            refund_of: None,
            memo: req.memo.clone(),
            principal_sub: req.principal_sub.clone(),
            created_at: now,
        };
        let mandate_id = req.guards.mandate.as_ref().map(|m| m.mandate_id.as_str());
        let desc = format!("payment {}", payment.id);
        let day = now - now.rem_euclid(86_400);
        let code = currency.code();
        let usage_params: [&(dyn tokio_postgres::types::ToSql + Sync); 4] = [&req.principal_sub, &day, &code, &amount];
        // The account rows stay locked until COMMIT, so every round trip from here on is time other
        // payments between these accounts wait. The payment row goes first (a lost race on the key
        // fails here, and the postings name it); the statements after it do not depend on each
        // other's results, so they are pipelined on the connection.
        insert_payment(&tx, &payment, &req.idempotency_key, mandate_id).await.map_err(TxError::pg)?;
        let (usage, debit, credit, completed, audited) = tokio::join!(
            // Every payment counts toward its subject's day (mandated ones too), in the same transaction.
            tx.exec(
                "INSERT INTO budget_usage (subject, day, currency, spent_minor, payments) VALUES ($1, $2, $3, $4, 1)
                 ON CONFLICT (subject, day, currency) DO UPDATE SET spent_minor = budget_usage.spent_minor + excluded.spent_minor,
                                                                    payments = budget_usage.payments + 1",
                &usage_params,
            ),
            post(&tx, Some(payment.id.as_str()), req.from_account.as_str(), -amount, currency, &desc, now),
            post(&tx, Some(payment.id.as_str()), req.to_account.as_str(), amount, currency, &desc, now),
            complete_in_tx(&tx, &req.idempotency_key, req.alias_key.as_deref(), &payment),
            audit_in_tx(&tx, &req.audit, &payment),
        );
        // Any failure aborts the transaction (later statements then only report that): none of
        // these can be a lost race, so the first error found is reported as it is.
        usage.map_err(TxError::pg)?;
        debit.map_err(TxError::store)?;
        credit.map_err(TxError::store)?;
        completed.map_err(TxError::store)?;
        audited.map_err(TxError::store)?;
        tx.commit().await.map_err(TxError::pg)?;
        Ok(payment)
    }

    async fn refund_once(&self, req: &RefundRequest, now: UnixSecs) -> Result<Payment, TxError> {
        let mut client = self.pool.get().await.map_err(|e| TxError::Backend(db(e)))?;
        let tx = client.transaction().await.map_err(TxError::pg)?;
        // The original payment's row lock serialises refunds of it; accounts follow in id order.
        let original = load_payment(&tx, "id", req.payment_id.as_str(), true)
            .await
            .map_err(TxError::store)?
            .ok_or_else(|| TxError::Backend(BackendError::PaymentNotFound(req.payment_id.clone())))?;
        let (payee_row, _) = {
            let (a, b) =
                lock_accounts(&tx, &original.to_account, &original.from_account).await.map_err(TxError::Backend)?;
            (a, b)
        };
        if let Some(existing) =
            load_payment(&tx, "idempotency_key", &req.idempotency_key, false).await.map_err(TxError::store)?
        {
            let same = existing.kind == PaymentKind::Refund
                && existing.refund_of.as_ref() == Some(&req.payment_id)
                && req.amount_minor.is_none_or(|a| a == existing.amount_minor);
            if !same {
                return Err(TxError::Backend(BackendError::IdempotencyKeyReused));
            }
            complete_in_tx(&tx, &req.idempotency_key, req.alias_key.as_deref(), &existing)
                .await
                .map_err(TxError::store)?;
            audit_in_tx(&tx, &req.audit, &existing).await.map_err(TxError::store)?;
            tx.commit().await.map_err(TxError::pg)?;
            return Ok(existing);
        }
        let remaining = original.refundable_minor();
        if original.kind != PaymentKind::Payment || original.status != PaymentStatus::Succeeded || remaining == 0 {
            return Err(TxError::Backend(BackendError::NotRefundable(original.id.clone())));
        }
        let amount = req.amount_minor.unwrap_or(remaining);
        if amount > remaining {
            return Err(TxError::Backend(BackendError::RefundExceedsRemaining {
                requested: format_minor(amount, original.currency),
                remaining: format_minor(remaining, original.currency),
            }));
        }
        if !payee_row.allow_overdraft && payee_row.balance < amount {
            return Err(TxError::Backend(BackendError::InsufficientFunds {
                account: original.to_account.clone(),
                balance: format_minor(payee_row.balance, original.currency),
                needed: format_minor(amount, original.currency),
            }));
        }
        apply_guards(&tx, &req.guards, &req.principal_sub, amount, original.currency, now)
            .await
            .map_err(TxError::Backend)?;
        let refund = Payment {
            id: req.refund_id.clone(),
            kind: PaymentKind::Refund,
            status: PaymentStatus::Succeeded,
            from_account: original.to_account.clone(),
            to_account: original.from_account.clone(),
            amount_minor: amount,
            currency: original.currency,
            refunded_minor: 0,
            refund_of: Some(original.id.clone()),
            memo: req.reason.clone(),
            principal_sub: req.principal_sub.clone(),
            created_at: now,
        };
        let mandate_id = req.guards.mandate.as_ref().map(|m| m.mandate_id.as_str());
        insert_payment(&tx, &refund, &req.idempotency_key, mandate_id).await.map_err(TxError::pg)?;
        tx.exec(
            "UPDATE payments SET refunded_minor = refunded_minor + $1 WHERE id = $2",
            &[&amount, &original.id.as_str()],
        )
        .await
        .map_err(TxError::pg)?;
        let desc = format!("refund {} of {}", refund.id, original.id);
        post(&tx, Some(refund.id.as_str()), refund.from_account.as_str(), -amount, refund.currency, &desc, now)
            .await
            .map_err(TxError::store)?;
        post(&tx, Some(refund.id.as_str()), refund.to_account.as_str(), amount, refund.currency, &desc, now)
            .await
            .map_err(TxError::store)?;
        complete_in_tx(&tx, &req.idempotency_key, req.alias_key.as_deref(), &refund).await.map_err(TxError::store)?;
        audit_in_tx(&tx, &req.audit, &refund).await.map_err(TxError::store)?;
        tx.commit().await.map_err(TxError::pg)?;
        Ok(refund)
    }
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

#[async_trait]
impl Store for PostgresStore {
    async fn ping(&self) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client.one("SELECT 1", &[]).await?;
        Ok(())
    }

    async fn idem_peek(&self, key: &str, now: UnixSecs) -> Result<Option<(String, Option<String>)>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .opt(
                "SELECT fingerprint, outcome FROM idempotency_records WHERE key = $1 AND expires_at > $2",
                &[&key, &now],
            )
            .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    async fn idem_reserve(&self, rec: NewIdempotencyRecord, now: UnixSecs) -> Result<Reservation, StoreError> {
        self.reserve_locked(&rec, now).await
    }

    async fn idem_complete(&self, key: &str, outcome: &str) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client
            .exec(
                "UPDATE idempotency_records SET state = 'completed', outcome = $1 WHERE key = $2 AND state = 'in_flight'",
                &[&outcome, &key],
            )
            .await?;
        Ok(())
    }

    async fn idem_release(&self, key: &str) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client.exec("DELETE FROM idempotency_records WHERE key = $1 AND state = 'in_flight'", &[&key]).await?;
        Ok(())
    }

    async fn idem_purge(&self, now: UnixSecs) -> Result<u64, StoreError> {
        let client = self.pool.get().await?;
        Ok(client.exec("DELETE FROM idempotency_records WHERE expires_at <= $1", &[&now]).await?)
    }

    async fn approval_get_or_create(&self, rec: ApprovalRecord, now: UnixSecs) -> Result<ApprovalRecord, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        // Concurrent requests for one operation create one approval.
        tx.exec("SELECT pg_advisory_xact_lock(hashtextextended('approval:' || $1, 0))", &[&rec.idempotency_key])
            .await?;
        let existing = tx
            .opt(
                &format!(
                    "SELECT {APPROVAL_COLS} FROM approvals
                     WHERE idempotency_key = $1 AND ((status = 'pending' AND expires_at > $2) OR status = 'approved')
                     ORDER BY created_at DESC, seq DESC LIMIT 1"
                ),
                &[&rec.idempotency_key, &now],
            )
            .await?;
        if let Some(row) = existing {
            let a = approval_from_row(&row)?;
            tx.commit().await?;
            return Ok(a);
        }
        insert_approval(&tx, &rec).await?;
        tx.commit().await?;
        Ok(rec)
    }

    async fn approval_get(&self, id: &ApprovalId) -> Result<Option<ApprovalRecord>, StoreError> {
        let client = self.pool.get().await?;
        load_approval(&client, id.as_str(), false).await
    }

    async fn approvals_pending(&self, now: UnixSecs) -> Result<i64, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .one("SELECT COUNT(*) FROM approvals WHERE status = 'pending' AND expires_at > $1", &[&now])
            .await?
            .get(0))
    }

    async fn approvals_expire(&self, now: UnixSecs) -> Result<u64, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .exec(
                "UPDATE approvals SET status = 'expired', decided_at = $1 WHERE status = 'pending' AND expires_at <= $1",
                &[&now],
            )
            .await?)
    }

    async fn approval_insert(&self, rec: ApprovalRecord) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        insert_approval(&client, &rec).await
    }

    async fn approval_list(
        &self,
        status: Option<&str>,
        before: Option<i64>,
        limit: u32,
        now: UnixSecs,
    ) -> Result<Page<(i64, ApprovalRecord)>, StoreError> {
        let client = self.pool.get().await?;
        let limit = i64::from(limit);
        let rows = client
            .all(
                &format!(
                    "SELECT {APPROVAL_COLS} FROM approvals
                     WHERE ($1::TEXT IS NULL
                            OR ($1 = 'pending' AND status = 'pending' AND expires_at > $4)
                            OR ($1 = 'expired' AND (status = 'expired' OR (status = 'pending' AND expires_at <= $4)))
                            OR ($1 NOT IN ('pending', 'expired') AND status = $1))
                       AND ($2::BIGINT IS NULL OR seq < $2)
                     ORDER BY seq DESC LIMIT $3"
                ),
                &[&status, &before, &(limit + 1), &now],
            )
            .await?;
        let mut items = Vec::with_capacity(rows.len());
        for r in &rows {
            let mut a = approval_from_row(r)?;
            a.reviews = load_reviews(&client, a.id.as_str()).await?;
            items.push((r.get::<_, i64>(20), a));
        }
        let next_cursor = if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().map(|(seq, _)| *seq)
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    async fn approval_review(
        &self,
        id: &ApprovalId,
        review: Review,
        now: UnixSecs,
        issue: MandateIssuer,
    ) -> Result<ApprovalRecord, ReviewError> {
        let mut client = self.pool.get().await.map_err(StoreError::from)?;
        let tx = client.transaction().await.map_err(StoreError::from)?;
        let rec = load_approval(&tx, id.as_str(), true).await?.ok_or(ReviewError::NotFound)?;
        if rec.status != "pending" {
            return Err(ReviewError::Terminal(rec.status));
        }
        if now >= rec.expires_at {
            tx.exec("UPDATE approvals SET status = 'expired', decided_at = $1 WHERE id = $2", &[&now, &id.as_str()])
                .await
                .map_err(StoreError::from)?;
            tx.commit().await.map_err(StoreError::from)?;
            return Err(ReviewError::Expired);
        }
        if review.reviewer_sub == rec.principal_sub {
            return Err(ReviewError::SelfReview);
        }
        if rec.reviews.iter().any(|r| r.reviewer_iss == review.reviewer_iss && r.reviewer_sub == review.reviewer_sub) {
            return Err(ReviewError::AlreadyReviewed);
        }
        tx.exec(
            "INSERT INTO approval_reviews (approval_id, reviewer_iss, reviewer_sub, decision, reason, at) VALUES ($1, $2, $3, $4, $5, $6)",
            &[&id.as_str(), &review.reviewer_iss, &review.reviewer_sub, &review.decision, &review.reason, &now],
        )
        .await
        .map_err(StoreError::from)?;
        if review.decision == "reject" {
            tx.exec(
                "UPDATE approvals SET status = 'rejected', decided_at = $1, decision_reason = $2 WHERE id = $3",
                &[&now, &review.reason, &id.as_str()],
            )
            .await
            .map_err(StoreError::from)?;
        } else {
            let mut approvers: Vec<String> =
                rec.reviews.iter().filter(|r| r.decision == "approve").map(|r| r.reviewer_sub.clone()).collect();
            approvers.push(review.reviewer_sub.clone());
            if approvers.len() as i64 >= rec.reviewers_required {
                let issued = issue(&rec, &approvers).map_err(ReviewError::Mandate)?;
                tx.exec(
                    "INSERT INTO mandates (id, kind, approval_id, subject, currency, budget_minor, max_uses, expires_at, created_at)
                     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)",
                    &[
                        &issued.id,
                        &kind_str(rec.kind),
                        &id.as_str(),
                        &rec.principal_sub,
                        &rec.currency.code(),
                        &issued.budget_minor,
                        &issued.max_uses,
                        &issued.expires_at,
                        &now,
                    ],
                )
                .await
                .map_err(StoreError::from)?;
                tx.exec(
                    "UPDATE approvals SET status = 'approved', decided_at = $1, decision_reason = $2, mandate_id = $3, mandate = $4
                     WHERE id = $5",
                    &[&now, &review.reason, &issued.id, &issued.jws, &id.as_str()],
                )
                .await
                .map_err(StoreError::from)?;
            }
        }
        let updated = load_approval(&tx, id.as_str(), false).await?.ok_or(ReviewError::NotFound)?;
        tx.commit().await.map_err(StoreError::from)?;
        Ok(updated)
    }

    async fn suspension(&self, subject: &str) -> Result<Option<(UnixSecs, String)>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .opt(
                "SELECT suspended_at, COALESCE(suspended_reason, '') FROM principal_state WHERE subject = $1 AND suspended_at IS NOT NULL",
                &[&subject],
            )
            .await?;
        Ok(row.map(|r| (r.get(0), r.get(1))))
    }

    async fn suspend(&self, subject: &str, reason: &str, now: UnixSecs) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        client
            .exec(
                "INSERT INTO principal_state (subject, suspended_at, suspended_reason) VALUES ($1, $2, $3)
                 ON CONFLICT (subject) DO UPDATE SET suspended_at = excluded.suspended_at,
                     suspended_reason = excluded.suspended_reason WHERE principal_state.suspended_at IS NULL",
                &[&subject, &now, &reason],
            )
            .await?;
        Ok(())
    }

    async fn resume(&self, subject: &str, now: UnixSecs) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        Ok(client
            .exec(
                "UPDATE principal_state SET suspended_at = NULL, suspended_reason = NULL, resumed_at = $1,
                        resumed_seq = (SELECT COALESCE(MAX(seq), 0) FROM audit_records)
                 WHERE subject = $2 AND suspended_at IS NOT NULL",
                &[&now, &subject],
            )
            .await?
            == 1)
    }

    async fn denials_since(&self, subject: &str, since: UnixSecs) -> Result<i64, StoreError> {
        let client = self.pool.get().await?;
        let codes: Vec<&str> = DENIAL_CODES.to_vec();
        Ok(client
            .one(
                "SELECT COUNT(*) FROM audit_records
                 WHERE principal_sub = $1 AND at >= $2
                   AND seq > COALESCE((SELECT resumed_seq FROM principal_state WHERE subject = $1), 0)
                   AND decision IN ('denied', 'conflict') AND code = ANY($3)",
                &[&subject, &since, &codes],
            )
            .await?
            .get(0))
    }

    async fn audit_append(&self, r: AuditRecord) -> Result<(), StoreError> {
        let client = self.pool.get().await?;
        insert_audit(&client, &r, None).await
    }

    async fn audit_list(&self, principal_sub: Option<&str>, limit: u32) -> Result<Vec<AuditRecord>, StoreError> {
        let client = self.pool.get().await?;
        let rows = client
            .all(
                "SELECT seq, at, correlation_id, principal_iss, principal_sub, tool, decision, code, idempotency_key,
                        payment_id, approval_id, detail
                 FROM audit_records WHERE ($1::TEXT IS NULL OR principal_sub = $1) ORDER BY seq DESC LIMIT $2",
                &[&principal_sub, &i64::from(limit)],
            )
            .await?;
        Ok(rows
            .iter()
            .map(|r| AuditRecord {
                seq: r.get(0),
                at: r.get(1),
                correlation_id: r.get(2),
                principal_iss: r.get(3),
                principal_sub: r.get(4),
                tool: r.get(5),
                decision: r.get(6),
                code: r.get(7),
                idempotency_key: r.get(8),
                payment_id: r.get(9),
                approval_id: r.get(10),
                detail: r.get(11),
            })
            .collect())
    }

    async fn ledger_open_account(&self, seed: AccountSeed, now: UnixSecs) -> Result<bool, StoreError> {
        let mut client = self.pool.get().await?;
        let tx = client.transaction().await?;
        let created = tx
            .exec(
                "INSERT INTO accounts (id, currency, balance_minor, allow_overdraft, created_at) VALUES ($1, $2, 0, $3, $4)
                 ON CONFLICT (id) DO NOTHING",
                &[&seed.id.as_str(), &seed.currency.code(), &seed.allow_overdraft, &now],
            )
            .await?
            == 1;
        if created && seed.opening_minor != 0 {
            let equity = format!("equity-opening-{}", seed.currency.code());
            tx.exec(
                "INSERT INTO accounts (id, currency, balance_minor, allow_overdraft, created_at) VALUES ($1, $2, 0, TRUE, $3)
                 ON CONFLICT (id) DO NOTHING",
                &[&equity, &seed.currency.code(), &now],
            )
            .await?;
            let desc = format!("opening balance of {}", seed.id);
            post(&tx, None, &equity, -seed.opening_minor, seed.currency, &desc, now).await?;
            post(&tx, None, seed.id.as_str(), seed.opening_minor, seed.currency, &desc, now).await?;
        }
        tx.commit().await?;
        Ok(created)
    }

    async fn ledger_transfer(&self, req: TransferRequest, now: UnixSecs) -> Result<Payment, BackendError> {
        with_retry!(self.transfer_once(&req, now).await)
    }

    async fn ledger_refund(&self, req: RefundRequest, now: UnixSecs) -> Result<Payment, BackendError> {
        with_retry!(self.refund_once(&req, now).await)
    }

    async fn ledger_payment(&self, id: &PaymentId) -> Result<Option<Payment>, StoreError> {
        let client = self.pool.get().await?;
        load_payment(&client, "id", id.as_str(), false).await
    }

    async fn ledger_balance(&self, account: &AccountId) -> Result<Option<Balance>, StoreError> {
        let client = self.pool.get().await?;
        let row =
            client.opt("SELECT currency, balance_minor FROM accounts WHERE id = $1", &[&account.as_str()]).await?;
        row.map(|r| {
            let currency = Currency::parse(r.get(0)).map_err(|_| corrupt("account currency"))?;
            Ok(Balance { account_id: account.clone(), currency, balance_minor: r.get(1) })
        })
        .transpose()
    }

    async fn ledger_list_payments(&self, q: PaymentQuery) -> Result<Page<Payment>, StoreError> {
        if q.accounts.is_empty() {
            return Ok(Page { items: vec![], next_cursor: None });
        }
        let client = self.pool.get().await?;
        let accounts: Vec<&str> = q.accounts.iter().map(|a| a.as_str()).collect();
        let limit = i64::from(q.limit);
        let rows = client
            .all(
                &format!(
                    "SELECT {PAYMENT_COLS} FROM payments
                     WHERE (from_account = ANY($1) OR to_account = ANY($1))
                       AND ($2::TEXT IS NULL OR status = $2)
                       AND ($3::BIGINT IS NULL OR seq < $3)
                     ORDER BY seq DESC LIMIT $4"
                ),
                &[&accounts, &q.status.map(|s| s.as_str()), &q.before_seq, &(limit + 1)],
            )
            .await?;
        let mut items = rows.iter().map(payment_from_row).collect::<Result<Vec<_>, _>>()?;
        let next_cursor = if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().map(|(_, seq)| *seq)
        } else {
            None
        };
        Ok(Page { items: items.into_iter().map(|(p, _)| p).collect(), next_cursor })
    }

    async fn ledger_entries(
        &self,
        account: &AccountId,
        before_seq: Option<i64>,
        limit: u32,
    ) -> Result<Page<LedgerEntry>, StoreError> {
        let client = self.pool.get().await?;
        let limit = i64::from(limit);
        let rows = client
            .all(
                "SELECT seq, payment_id, amount_minor, currency, balance_after_minor, description, created_at
                 FROM postings WHERE account_id = $1 AND ($2::BIGINT IS NULL OR seq < $2) ORDER BY seq DESC LIMIT $3",
                &[&account.as_str(), &before_seq, &(limit + 1)],
            )
            .await?;
        let mut items = rows
            .iter()
            .map(|r| {
                let pid: Option<String> = r.get(1);
                Ok(LedgerEntry {
                    seq: r.get(0),
                    payment_id: pid
                        .map(|p| PaymentId::parse(&p).map_err(|_| corrupt("postings.payment_id")))
                        .transpose()?,
                    amount_minor: r.get(2),
                    currency: Currency::parse(r.get(3)).map_err(|_| corrupt("postings.currency"))?,
                    balance_after_minor: r.get(4),
                    description: r.get(5),
                    created_at: r.get(6),
                })
            })
            .collect::<Result<Vec<_>, StoreError>>()?;
        let next_cursor = if items.len() as i64 > limit {
            items.truncate(limit as usize);
            items.last().map(|e| e.seq)
        } else {
            None
        };
        Ok(Page { items, next_cursor })
    }

    async fn ledger_integrity(&self) -> Result<IntegrityReport, StoreError> {
        let mut client = self.pool.get().await?;
        // One snapshot for every query, while payments keep posting.
        let tx =
            client.build_transaction().isolation_level(IsolationLevel::RepeatableRead).read_only(true).start().await?;
        let mut problems = Vec::new();
        let mut currency_sums = Vec::new();
        for r in tx
            .all("SELECT currency, SUM(amount_minor)::BIGINT FROM postings GROUP BY currency ORDER BY currency", &[])
            .await?
        {
            let (cur, sum): (String, i64) = (r.get(0), r.get(1));
            if sum != 0 {
                problems.push(format!("postings in {cur} sum to {sum}, not 0"));
            }
            currency_sums.push((cur, sum));
        }
        for r in tx
            .all(
                "SELECT a.id, a.balance_minor, COALESCE(SUM(p.amount_minor), 0)::BIGINT
                 FROM accounts a LEFT JOIN postings p ON p.account_id = a.id GROUP BY a.id, a.balance_minor",
                &[],
            )
            .await?
        {
            let (id, balance, sum): (String, i64, i64) = (r.get(0), r.get(1), r.get(2));
            if balance != sum {
                problems.push(format!("account {id} balance {balance} differs from its postings {sum}"));
            }
        }
        for r in tx
            .all(
                "SELECT id FROM accounts WHERE NOT allow_overdraft AND balance_minor < 0
                 UNION ALL SELECT id FROM payments WHERE refunded_minor > amount_minor",
                &[],
            )
            .await?
        {
            problems.push(format!("{} violates its bounds", r.get::<_, String>(0)));
        }
        for r in tx
            .all(
                "SELECT payment_id FROM postings WHERE payment_id IS NOT NULL GROUP BY payment_id
                 HAVING SUM(amount_minor) <> 0 OR COUNT(*) <> 2",
                &[],
            )
            .await?
        {
            problems.push(format!("payment {} is not one balanced debit/credit pair", r.get::<_, String>(0)));
        }
        let accounts_checked: i64 = tx.one("SELECT COUNT(*) FROM accounts", &[]).await?.get(0);
        let postings_checked: i64 = tx.one("SELECT COUNT(*) FROM postings", &[]).await?.get(0);
        tx.commit().await?;
        Ok(IntegrityReport { ok: problems.is_empty(), accounts_checked, postings_checked, currency_sums, problems })
    }
    async fn rail_open(&self, rec: RailPayment, guards: Guards, now: UnixSecs) -> Result<RailOpened, BackendError> {
        with_retry!(rails::open_once(&self.pool, &rec, &guards, now).await)
    }

    async fn rail_transition(
        &self,
        id: &PaymentId,
        from: &[RailState],
        to: RailState,
        update: RailUpdate,
        now: UnixSecs,
    ) -> Result<Option<RailPayment>, StoreError> {
        rails::transition(&self.pool, id.as_str(), from, to, update, now).await
    }

    async fn rail_abandon(&self, id: &PaymentId) -> Result<bool, StoreError> {
        rails::abandon(&self.pool, id.as_str()).await
    }

    async fn rail_get(&self, id: &PaymentId) -> Result<Option<RailPayment>, StoreError> {
        let client = self.pool.get().await?;
        rails::load_rail(&client, "id", id.as_str(), false).await
    }

    async fn rail_by_key(&self, idempotency_key: &str) -> Result<Option<RailPayment>, StoreError> {
        let client = self.pool.get().await?;
        rails::load_rail(&client, "idempotency_key", idempotency_key, false).await
    }

    async fn rail_by_ref(&self, rail: &str, rail_ref: &str) -> Result<Option<RailPayment>, StoreError> {
        let client = self.pool.get().await?;
        let row = client
            .opt(
                &format!("SELECT {} FROM rail_payments WHERE rail = $1 AND rail_ref = $2", rails::RAIL_COLS),
                &[&rail, &rail_ref],
            )
            .await?;
        row.map(|r| rails::rail_from_row(&r).map(|(_, p)| p)).transpose()
    }

    async fn rail_list(
        &self,
        states: &[RailState],
        updated_before: UnixSecs,
        limit: u32,
    ) -> Result<Vec<RailPayment>, StoreError> {
        let client = self.pool.get().await?;
        rails::list(&client, states, updated_before, limit).await
    }

    async fn rail_since(
        &self,
        since: UnixSecs,
        after_seq: i64,
        limit: u32,
    ) -> Result<Vec<(i64, RailPayment)>, StoreError> {
        let client = self.pool.get().await?;
        rails::since(&client, since, after_seq, limit).await
    }

    async fn payment_summary(&self, query: SummaryQuery) -> Result<Vec<SummaryRow>, StoreError> {
        let client = self.pool.get().await?;
        rails::summary(&client, &query).await
    }

    async fn job_lease(&self, kind: &str, holder: &str, now: UnixSecs, lease_secs: i64) -> Result<bool, StoreError> {
        let client = self.pool.get().await?;
        rails::lease(&client, kind, holder, now, lease_secs).await
    }
}
