//! The reference ledger's posting transactions (PostgreSQL): take the locks in the engine's order,
//! load what a rule needs, ask it, write its plan.

use deadpool_postgres::{GenericClient, Pool};

use super::{Cached, Mapped, TxError, bind, db, insert_audit};
use crate::clock::UnixSecs;
use crate::domain::error::BackendError;
use crate::domain::idempotency::{NewIdempotencyRecord, Reservation};
use crate::domain::payment::{AccountRow, Claim, Guards, Payment, RefundRequest, TransferRequest};
use crate::domain::rules::guards::{self, BudgetUsage, UsageDraw};
use crate::domain::rules::reservation::{self, EarlierKeys};
use crate::domain::rules::{PostingPlan, ledger, refund, transfer};
use crate::ids::AccountId;
use crate::money::Currency;
use crate::store::rows;
use crate::store::{AuditRecord, Posting, StoreError, completed_outcome};

/// `column` is one of a few fixed names chosen by this module, never input.
pub(super) async fn load_payment(
    c: &impl GenericClient,
    column: &str,
    value: &str,
    lock: bool,
) -> Result<Option<Payment>, StoreError> {
    let lock = if lock { " FOR UPDATE" } else { "" };
    let sql = format!("SELECT {} FROM payments WHERE {column} = $1{lock}", rows::PAYMENT_COLS);
    Ok(c.get(&sql, &[&value], rows::payment).await?.map(|(p, _)| p))
}

/// Lock both accounts (in id order) and return them (`None`: no such account).
pub(super) async fn lock_accounts(
    c: &impl GenericClient,
    a: &AccountId,
    b: &AccountId,
) -> Result<(Option<AccountRow>, Option<AccountRow>), StoreError> {
    let ids = vec![a.as_str().to_string(), b.as_str().to_string()];
    let found = c
        .list(
            "SELECT id, currency, balance_minor, allow_overdraft FROM accounts WHERE id = ANY($1) ORDER BY id FOR UPDATE",
            &[&ids],
            |r| Ok((r.text(0)?, rows::account(r, 1)?)),
        )
        .await?;
    let find = |id: &AccountId| found.iter().find(|(i, _)| i == id.as_str()).map(|(_, row)| row.clone());
    Ok((find(a), find(b)))
}

pub(super) async fn post(
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

pub(super) async fn complete_in_tx(
    c: &impl GenericClient,
    key: &str,
    alias: Option<&str>,
    p: &Payment,
) -> Result<(), StoreError> {
    let outcome = completed_outcome(p);
    for k in std::iter::once(key).chain(alias) {
        c.exec(
            "UPDATE idempotency_records SET state = 'completed', outcome = $1 WHERE key = $2 AND state = 'in_flight'",
            &[&outcome, &k],
        )
        .await?;
    }
    Ok(())
}

/// Count a payment or refund toward its subject's day.
pub(super) async fn add_usage(c: &impl GenericClient, d: &UsageDraw) -> Result<u64, tokio_postgres::Error> {
    let table = guards::usage_table(d.kind);
    c.exec(
        &format!(
            "INSERT INTO {table} (subject, day, currency, spent_minor, payments) VALUES ($1, $2, $3, $4, 1)
             ON CONFLICT (subject, day, currency) DO UPDATE SET spent_minor = {table}.spent_minor + excluded.spent_minor,
                                                                payments = {table}.payments + 1"
        ),
        &[&d.subject, &d.day, &d.currency.code(), &d.amount_minor],
    )
    .await
}

pub(super) async fn apply_guards(
    c: &impl GenericClient,
    g: &Guards,
    subject: &str,
    amount: i64,
    currency: Currency,
    now: UnixSecs,
) -> Result<(), BackendError> {
    if let Some(b) = &g.budget {
        // One subject's autonomous payments serialise here, so the sum below cannot go stale.
        c.exec("SELECT pg_advisory_xact_lock(hashtextextended('budget:' || $1, 0))", &[&subject]).await.map_err(db)?;
        let row = c
            .one(
                &format!(
                    "SELECT COALESCE(SUM(payments), 0)::BIGINT,
                            COALESCE(SUM(CASE WHEN currency = $3 THEN spent_minor ELSE 0 END), 0)::BIGINT
                     FROM {} WHERE subject = $1 AND day = $2",
                    guards::usage_table(b.kind)
                ),
                &[&subject, &b.since, &currency.code()],
            )
            .await
            .map_err(db)?;
        guards::check_budget(b, BudgetUsage { payments: row.get(0), spent_minor: row.get(1) }, amount, currency)?;
    }
    if let Some(d) = &g.mandate {
        let sql = format!("SELECT {} FROM mandates WHERE id = $1 FOR UPDATE", rows::MANDATE_COLS);
        let mandate = c.get(&sql, &[&d.mandate_id], rows::mandate).await.map_err(db)?;
        guards::check_mandate(mandate.as_ref(), amount, currency, now)?;
        c.exec(
            "UPDATE mandates SET uses = uses + 1, spent_minor = spent_minor + $1 WHERE id = $2",
            &[&amount, &d.mandate_id],
        )
        .await
        .map_err(db)?;
    }
    Ok(())
}

/// The request's audit record, with the payment it produced, in the posting transaction.
async fn audit_in_tx(c: &impl GenericClient, audit: &Option<AuditRecord>, payment: &Payment) -> Result<(), StoreError> {
    match audit {
        Some(r) => insert_audit(c, r, Some(payment.id.as_str())).await,
        None => Ok(()),
    }
}

/// Write a transfer's or refund's plan: a replay completes the key's records; a new payment draws
/// its guards and posts. The request's audit record goes in with it. Commits.
async fn write_posting(
    tx: deadpool_postgres::Transaction<'_>,
    plan: PostingPlan,
    w: Posting<'_>,
    now: UnixSecs,
) -> Result<Payment, TxError> {
    let p = match plan {
        PostingPlan::Replay(existing) => {
            complete_in_tx(&tx, w.key, w.alias, &existing).await.map_err(TxError::store)?;
            audit_in_tx(&tx, w.audit, &existing).await.map_err(TxError::store)?;
            tx.commit().await.map_err(TxError::pg)?;
            return Ok(existing);
        }
        PostingPlan::Post(p) => p,
    };
    apply_guards(&tx, w.guards, &p.principal_sub, p.amount_minor, p.currency, now).await.map_err(TxError::Backend)?;
    let mandate_id = w.guards.mandate.as_ref().map(|m| m.mandate_id.as_str());
    // The account rows stay locked until COMMIT, so every round trip from here on is time other
    // payments between these accounts wait. The payment row goes first (a lost race on the key
    // fails here, and the postings name it); the statements after it do not depend on each
    // other's results, so they are pipelined on the connection.
    tx.exec(
        "INSERT INTO payments (id, idempotency_key, kind, status, from_account, to_account, amount_minor, currency,
                               refunded_minor, refund_of, memo, principal_sub, created_at, mandate_id)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)",
        &bind(&rows::payment_values(&p, w.key, mandate_id)),
    )
    .await
    .map_err(TxError::pg)?;
    let usage = guards::usage_draw(p.kind, &p.principal_sub, p.currency, p.amount_minor, now);
    let desc = ledger::posting_description(&p);
    let (id, amount) = (Some(p.id.as_str()), p.amount_minor);
    let (counted, refunded, debit, credit, completed, audited) = tokio::join!(
        async { add_usage(&tx, &usage).await },
        async {
            match &p.refund_of {
                Some(original) => {
                    tx.exec(
                        "UPDATE payments SET refunded_minor = refunded_minor + $1 WHERE id = $2",
                        &[&amount, &original.as_str()],
                    )
                    .await
                }
                None => Ok(0),
            }
        },
        post(&tx, id, p.from_account.as_str(), -amount, p.currency, &desc, now),
        post(&tx, id, p.to_account.as_str(), amount, p.currency, &desc, now),
        complete_in_tx(&tx, w.key, w.alias, &p),
        audit_in_tx(&tx, w.audit, &p),
    );
    // Any failure aborts the transaction (later statements then only report that): none of
    // these can be a lost race, so the first error found is reported as it is.
    counted.map_err(TxError::pg)?;
    refunded.map_err(TxError::pg)?;
    debit.map_err(TxError::store)?;
    credit.map_err(TxError::store)?;
    completed.map_err(TxError::store)?;
    audited.map_err(TxError::store)?;
    tx.commit().await.map_err(TxError::pg)?;
    Ok(p)
}

/// Claim a request's keys in order. `Ok(Some(KeyHeld))`: one already answers; the keys claimed
/// before it were completed with its outcome or given back (`rules::reservation::on_claim_answered`).
async fn claim_keys(c: &impl GenericClient, claim: &Claim, now: UnixSecs) -> Result<Option<BackendError>, StoreError> {
    for (i, rec) in claim.records.iter().enumerate() {
        let reservation = super::reserve_key(c, rec, now).await?;
        if reservation == Reservation::Acquired {
            continue;
        }
        let earlier = &claim.records[..i];
        match reservation::on_claim_answered(&reservation, &rec.fingerprint) {
            EarlierKeys::Complete(outcome) => complete_keys(c, earlier, Some(&outcome)).await?,
            EarlierKeys::Release => complete_keys(c, earlier, None).await?,
        }
        return Ok(Some(BackendError::KeyHeld { key: rec.key.clone(), reservation }));
    }
    Ok(None)
}

/// Complete claimed keys with `outcome`, or give them back (`None`).
async fn complete_keys(
    c: &impl GenericClient,
    records: &[NewIdempotencyRecord],
    outcome: Option<&str>,
) -> Result<(), StoreError> {
    for rec in records {
        match outcome {
            Some(o) => {
                c.exec(
                    "UPDATE idempotency_records SET state = 'completed', outcome = $1 WHERE key = $2 AND state = 'in_flight'",
                    &[&o, &rec.key],
                )
                .await?
            }
            None => c.exec("DELETE FROM idempotency_records WHERE key = $1 AND state = 'in_flight'", &[&rec.key]).await?,
        };
    }
    Ok(())
}

/// A claimed posting's end: a success commits with its keys completed; a refusal rolled its
/// savepoint back and leaves under the keys what the claim says (the failed outcome, or nothing).
async fn finish_claimed(
    tx: deadpool_postgres::Transaction<'_>,
    claim: &Claim,
    posted: Result<Payment, TxError>,
) -> Result<Payment, TxError> {
    match posted {
        Ok(p) => {
            tx.commit().await.map_err(TxError::pg)?;
            Ok(p)
        }
        Err(TxError::Backend(refusal)) => {
            let outcome = (claim.refusal_outcome)(&refusal);
            complete_keys(&tx, &claim.records, outcome.as_deref()).await.map_err(TxError::store)?;
            tx.commit().await.map_err(TxError::pg)?;
            Err(TxError::Backend(refusal))
        }
        // A lost race: roll everything back and run the transaction again.
        Err(TxError::Retry) => Err(TxError::Retry),
    }
}

/// Claim the keys (when the request carries a `Claim`) and run the posting in a savepoint of its
/// own; without a claim, the posting is the transaction. Keys lock before accounts.
macro_rules! claimed_posting {
    ($pool:expr, $req:expr, $now:expr, $post:path) => {{
        let mut client = $pool.get().await.map_err(|e| TxError::Backend(db(e)))?;
        let mut tx = client.transaction().await.map_err(TxError::pg)?;
        match &$req.claim {
            None => $post(tx, $req, $now).await,
            Some(claim) => {
                if let Some(held) = claim_keys(&tx, claim, $now).await.map_err(TxError::store)? {
                    tx.commit().await.map_err(TxError::pg)?;
                    return Err(TxError::Backend(held));
                }
                let posting = tx.savepoint("posting").await.map_err(TxError::pg)?;
                let posted = $post(posting, $req, $now).await;
                finish_claimed(tx, claim, posted).await
            }
        }
    }};
}

pub(super) async fn transfer_once(pool: &Pool, req: &TransferRequest, now: UnixSecs) -> Result<Payment, TxError> {
    claimed_posting!(pool, req, now, transfer_in)
}

pub(super) async fn refund_once(pool: &Pool, req: &RefundRequest, now: UnixSecs) -> Result<Payment, TxError> {
    claimed_posting!(pool, req, now, refund_in)
}

async fn transfer_in(
    tx: deadpool_postgres::Transaction<'_>,
    req: &TransferRequest,
    now: UnixSecs,
) -> Result<Payment, TxError> {
    let (from, to) = lock_accounts(&tx, &req.from_account, &req.to_account).await.map_err(TxError::store)?;
    // Under the account locks: a committed payment with this key is visible now.
    let existing = load_payment(&tx, "idempotency_key", &req.idempotency_key, false).await.map_err(TxError::store)?;
    let plan = transfer::plan(req, existing, from.as_ref(), to.as_ref(), now).map_err(TxError::Backend)?;
    write_posting(tx, plan, Posting::from(req), now).await
}

async fn refund_in(
    tx: deadpool_postgres::Transaction<'_>,
    req: &RefundRequest,
    now: UnixSecs,
) -> Result<Payment, TxError> {
    // The original payment's row lock serialises refunds of it; accounts follow in id order.
    let original = load_payment(&tx, "id", req.payment_id.as_str(), true).await.map_err(TxError::store)?;
    let payee = match &original {
        Some(o) => lock_accounts(&tx, &o.to_account, &o.from_account).await.map_err(TxError::store)?.0,
        None => None,
    };
    let existing = load_payment(&tx, "idempotency_key", &req.idempotency_key, false).await.map_err(TxError::store)?;
    let plan = refund::plan(req, existing, original.as_ref(), payee.as_ref(), now).map_err(TxError::Backend)?;
    write_posting(tx, plan, Posting::from(req), now).await
}
