//! The operator's read queries (and the agents' listing of rail records), built once for both
//! engines: each function returns the statement text in the engine's placeholder dialect and its
//! parameters; the engines only run them through the shared row mappers in `store::rows`.

use super::rows::{self, Value};
use crate::domain::ops::{AuditQuery, AuditRelated, MandateQuery, OpsPaymentQuery};
use crate::domain::payment::PaymentQuery;
use crate::domain::rail::RailState;

/// How an engine writes its statement parameters.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// `?1`, `?2`, …
    Sqlite,
    /// `$1`, `$2`, …
    Postgres,
}

/// A statement and its parameters, in order.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub struct Statement {
    pub(crate) text: String,
    pub(crate) params: Vec<Value>,
}

/// Builds a statement, numbering parameters as they are bound.
struct Builder {
    dialect: Dialect,
    params: Vec<Value>,
    conditions: Vec<String>,
}

impl Builder {
    fn new(dialect: Dialect) -> Builder {
        Builder { dialect, params: Vec::new(), conditions: Vec::new() }
    }

    /// Bind a value; returns its placeholder.
    fn bind(&mut self, v: Value) -> String {
        self.params.push(v);
        match self.dialect {
            Dialect::Sqlite => format!("?{}", self.params.len()),
            Dialect::Postgres => format!("${}", self.params.len()),
        }
    }

    fn text(&mut self, s: &str) -> String {
        self.bind(Value::Text(Some(s.to_string())))
    }

    fn int(&mut self, i: i64) -> String {
        self.bind(Value::Int(Some(i)))
    }

    /// `column = value` when a filter is given.
    fn eq(&mut self, column: &str, value: Option<&str>) {
        if let Some(v) = value {
            let p = self.text(v);
            self.conditions.push(format!("{column} = {p}"));
        }
    }

    fn when(&mut self, condition: String) {
        self.conditions.push(condition);
    }

    fn where_clause(&self) -> String {
        if self.conditions.is_empty() { String::new() } else { format!(" WHERE {}", self.conditions.join(" AND ")) }
    }

    fn finish(self, text: String) -> Statement {
        Statement { text, params: self.params }
    }
}

/// Every payment the gateway knows, one row shape (`rows::OPS_PAYMENT_COLS`): the reference
/// ledger's `payments` (rail `ops::LEDGER_RAIL`) and the rails' `rail_payments` (whose states read
/// as the payment statuses `get_payment` answers with: succeeded, failed, or else pending).
const ALL_PAYMENTS: &str = "(SELECT 'ledger' AS rail, id, kind, status, CAST(NULL AS TEXT) AS rail_state, from_account,
                                    to_account, amount_minor, currency, refunded_minor, refund_of, memo, principal_sub,
                                    created_at, mandate_id, idempotency_key, CAST(NULL AS TEXT) AS rail_ref,
                                    CAST(NULL AS TEXT) AS receipt, principal_user
                             FROM payments
                             UNION ALL
                             SELECT rail, id, kind,
                                    CASE state WHEN 'succeeded' THEN 'succeeded' WHEN 'failed' THEN 'failed' ELSE 'pending' END,
                                    state, from_account, to_account, amount_minor, currency, 0, refund_of, memo,
                                    principal_sub, created_at, mandate_id, idempotency_key, rail_ref, receipt,
                                    principal_user
                             FROM rail_payments) AS p";

pub(crate) fn ops_payments(q: &OpsPaymentQuery, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    if let Some(a) = &q.account {
        let p = b.text(a.as_str());
        b.when(format!("(from_account = {p} OR to_account = {p})"));
    }
    b.eq("status", q.status.map(|s| s.as_str()));
    b.eq("kind", q.kind.map(|k| k.as_str()));
    b.eq("rail", q.rail.as_deref());
    b.eq("principal_sub", q.agent.as_deref());
    b.eq("principal_user", q.user.as_deref());
    if let Some(from) = q.from {
        let p = b.int(from);
        b.when(format!("created_at >= {p}"));
    }
    if let Some(to) = q.to {
        let p = b.int(to);
        b.when(format!("created_at < {p}"));
    }
    if let Some((at, id)) = &q.before {
        let (pa, pi) = (b.int(*at), b.text(id));
        b.when(format!("(created_at < {pa} OR (created_at = {pa} AND id < {pi}))"));
    }
    let limit = b.int(i64::from(q.limit));
    let text = format!(
        "SELECT {} FROM {ALL_PAYMENTS}{} ORDER BY created_at DESC, id DESC LIMIT {limit}",
        rows::OPS_PAYMENT_COLS,
        b.where_clause()
    );
    b.finish(text)
}

/// Rail records as `list_payments` lists them (`RAIL_COLS`, newest first by `seq`): touching one of
/// `q.accounts`, in `[q.from, q.to)`, before `q.before_seq` (a rail record's seq), whose payment view
/// has `q.status`, and not of rail `except_rail` (an external ledger's own records, which that
/// ledger lists itself). At most `q.limit` rows.
pub(crate) fn rail_payments(q: &PaymentQuery, except_rail: &str, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let accounts: Vec<String> = q.accounts.iter().map(|a| b.text(a.as_str())).collect();
    let accounts = if accounts.is_empty() { "NULL".to_string() } else { accounts.join(", ") };
    b.when(format!("(from_account IN ({accounts}) OR to_account IN ({accounts}))"));
    let rail = b.text(except_rail);
    b.when(format!("rail <> {rail}"));
    if let Some(status) = q.status {
        // The states whose payment view has this status (`RailState::status`, the one rule).
        const STATES: [RailState; 5] =
            [RailState::Submitting, RailState::Unknown, RailState::Pending, RailState::Succeeded, RailState::Failed];
        let states: Vec<String> = STATES.iter().filter(|s| s.status() == status).map(|s| b.text(s.as_str())).collect();
        b.when(format!("state IN ({})", states.join(", ")));
    }
    if let Some(from) = q.from {
        let p = b.int(from);
        b.when(format!("created_at >= {p}"));
    }
    if let Some(to) = q.to {
        let p = b.int(to);
        b.when(format!("created_at < {p}"));
    }
    if let Some(seq) = q.before_seq {
        let p = b.int(seq);
        b.when(format!("seq < {p}"));
    }
    let limit = b.int(i64::from(q.limit));
    let text =
        format!("SELECT {} FROM rail_payments{} ORDER BY seq DESC LIMIT {limit}", rows::RAIL_COLS, b.where_clause());
    b.finish(text)
}

/// One payment by id, from wherever it lives.
pub(crate) fn ops_payment(id: &str, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let p = b.text(id);
    b.when(format!("id = {p}"));
    let text = format!("SELECT {} FROM {ALL_PAYMENTS}{}", rows::OPS_PAYMENT_COLS, b.where_clause());
    b.finish(text)
}

pub(crate) fn audit(q: &AuditQuery, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    b.eq("principal_sub", q.agent.as_deref());
    b.eq("principal_user", q.user.as_deref());
    b.eq("tool", q.tool.as_deref());
    b.eq("decision", q.decision.as_deref());
    b.eq("code", q.code.as_deref());
    b.eq("payment_id", q.payment_id.as_deref());
    b.eq("approval_id", q.approval_id.as_deref());
    b.eq("correlation_id", q.correlation_id.as_deref());
    b.eq("idempotency_key", q.idempotency_key.as_deref());
    if let Some(from) = q.from {
        let p = b.int(from);
        b.when(format!("at >= {p}"));
    }
    if let Some(to) = q.to {
        let p = b.int(to);
        b.when(format!("at < {p}"));
    }
    if let Some(seq) = q.before_seq {
        let p = b.int(seq);
        b.when(format!("seq < {p}"));
    }
    let limit = b.int(i64::from(q.limit));
    let text =
        format!("SELECT {} FROM audit_records{} ORDER BY seq DESC LIMIT {limit}", rows::AUDIT_COLS, b.where_clause());
    b.finish(text)
}

/// A payment's audit trail, oldest first.
pub(crate) fn audit_related(q: &AuditRelated, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let mut any = vec![format!("payment_id = {}", b.text(&q.payment_id))];
    if !q.keys.is_empty() {
        let ps: Vec<String> = q.keys.iter().map(|k| b.text(k)).collect();
        any.push(format!("idempotency_key IN ({})", ps.join(", ")));
    }
    if !q.approval_ids.is_empty() {
        let ps: Vec<String> = q.approval_ids.iter().map(|k| b.text(k)).collect();
        any.push(format!("approval_id IN ({})", ps.join(", ")));
    }
    b.when(format!("({})", any.join(" OR ")));
    let limit = b.int(i64::from(q.limit));
    let text = format!("SELECT {} FROM audit_records{} ORDER BY seq LIMIT {limit}", rows::AUDIT_COLS, b.where_clause());
    b.finish(text)
}

/// The approvals asked for under any of these idempotency keys, by id.
pub(crate) fn approvals_for_keys(keys: &[String], dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let ps: Vec<String> = keys.iter().map(|k| b.text(k)).collect();
    let text = if ps.is_empty() {
        "SELECT id FROM approvals WHERE 1 = 0".to_string()
    } else {
        format!("SELECT id FROM approvals WHERE idempotency_key IN ({}) ORDER BY created_at", ps.join(", "))
    };
    b.finish(text)
}

/// A mandate's status as of `now`, in SQL: revoked, then used up, then expired, else active.
fn mandate_status(now: &str) -> String {
    format!(
        "CASE WHEN revoked_at IS NOT NULL THEN 'revoked' WHEN uses >= max_uses THEN 'used_up'
              WHEN expires_at <= {now} THEN 'expired' ELSE 'active' END"
    )
}

pub(crate) fn mandates(q: &MandateQuery, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let now = b.int(q.now);
    let status = mandate_status(&now);
    if let Some(s) = q.status {
        let p = b.text(s.as_str());
        b.when(format!("{status} = {p}"));
    }
    if let Some((at, id)) = &q.before {
        let (pa, pi) = (b.int(*at), b.text(id));
        b.when(format!("(created_at < {pa} OR (created_at = {pa} AND id < {pi}))"));
    }
    let limit = b.int(i64::from(q.limit));
    let text = format!(
        "SELECT {}, {status} FROM mandates{} ORDER BY created_at DESC, id DESC LIMIT {limit}",
        rows::MANDATE_LISTING_COLS,
        b.where_clause()
    );
    b.finish(text)
}

pub(crate) fn mandate(id: &str, now: i64, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let now = b.int(now);
    let p = b.text(id);
    b.when(format!("id = {p}"));
    let text =
        format!("SELECT {}, {} FROM mandates{}", rows::MANDATE_LISTING_COLS, mandate_status(&now), b.where_clause());
    b.finish(text)
}

/// A subject's usage of one kind's daily budget on `day`: its count (every currency) and its spend
/// in `currency` (what the posting's guard reads, outside any transaction).
pub(crate) fn budget_usage(
    kind: crate::domain::payment::PaymentKind,
    subject: &str,
    day: i64,
    currency: &str,
    dialect: Dialect,
) -> Statement {
    let mut b = Builder::new(dialect);
    let (subject, day, currency) = (b.text(subject), b.int(day), b.text(currency));
    let text = format!(
        "SELECT CAST(COALESCE(SUM(payments), 0) AS BIGINT),
                CAST(COALESCE(SUM(CASE WHEN currency = {currency} THEN spent_minor ELSE 0 END), 0) AS BIGINT)
         FROM {} WHERE subject = {subject} AND day = {day}",
        crate::domain::rules::guards::usage_table(kind)
    );
    b.finish(text)
}

pub(crate) fn principal_states(limit: u32, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let limit = b.int(i64::from(limit));
    let text = format!(
        "SELECT subject, suspended_at, suspended_reason, resumed_at, issuer, scope, principal_user FROM principal_state
         ORDER BY suspended_at IS NULL, subject, issuer, scope, principal_user LIMIT {limit}"
    );
    b.finish(text)
}

/// Subjects that called any of `tools` since `since` (under any issuer but `internal_issuer`, the
/// gateway's own), most recent first, with when they last did.
pub(crate) fn agents_seen(
    since: i64,
    tools: &[&str],
    internal_issuer: &str,
    limit: u32,
    dialect: Dialect,
) -> Statement {
    let mut b = Builder::new(dialect);
    let since = b.int(since);
    let internal = b.text(internal_issuer);
    let ps: Vec<String> = tools.iter().map(|t| b.text(t)).collect();
    let limit = b.int(i64::from(limit));
    let text = format!(
        "SELECT principal_sub, MAX(at) FROM audit_records WHERE at >= {since} AND principal_iss <> {internal} AND tool IN ({})
         GROUP BY principal_sub ORDER BY MAX(at) DESC, principal_sub LIMIT {limit}",
        if ps.is_empty() { "NULL".to_string() } else { ps.join(", ") }
    );
    b.finish(text)
}

/// Every payment's count and total in `[from, to)` by hour (from `from`), kind, status and currency.
pub(crate) fn volume(from: i64, to: i64, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (pf, pt) = (b.int(from), b.int(to));
    let text = format!(
        "SELECT (created_at - {pf}) / 3600 AS hour, kind, status, currency, COUNT(*),
                CAST(COALESCE(SUM(amount_minor), 0) AS BIGINT)
         FROM {ALL_PAYMENTS} WHERE created_at >= {pf} AND created_at < {pt}
         GROUP BY 1, 2, 3, 4 ORDER BY 1, 2, 3, 4"
    );
    b.finish(text)
}

/// A statement without parameters.
/// `owner`'s row for `payee`, a revoked one too (`rows::payee`).
pub(crate) fn payee(owner: &str, payee: &str, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (owner, payee) = (b.text(owner), b.text(payee));
    b.finish(format!("SELECT {} FROM payees WHERE owner = {owner} AND payee = {payee}", rows::PAYEE_COLS))
}

/// What `owner`'s autonomous payments to `payee` total on `day` in `currency` (the daily cap's
/// usage): one row, one BIGINT, 0 when none.
pub(crate) fn payee_usage(owner: &str, payee: &str, day: i64, currency: &str, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (owner, payee, day, currency) = (b.text(owner), b.text(payee), b.int(day), b.text(currency));
    b.finish(format!(
        "SELECT CAST(COALESCE(SUM(spent_minor), 0) AS BIGINT) FROM payee_usage
         WHERE owner = {owner} AND payee = {payee} AND day = {day} AND currency = {currency}"
    ))
}

pub(crate) fn plain(text: &str, dialect: Dialect) -> Statement {
    Builder::new(dialect).finish(text.to_string())
}

/// Chain links after `after`, in order, each joined to its record (`rows::chain_link`).
pub(crate) fn audit_chain_links(after: i64, limit: u32, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (after, limit) = (b.int(after), b.int(i64::from(limit)));
    let cols: Vec<String> = rows::AUDIT_COLS.split(',').map(|c| format!("a.{}", c.trim())).collect();
    let text = format!(
        "SELECT c.chain_seq, c.seq, c.prev_hash, c.hash, {} FROM audit_chain c LEFT JOIN audit_records a ON a.seq = c.seq
         WHERE c.chain_seq > {after} ORDER BY c.chain_seq LIMIT {limit}",
        cols.join(", ")
    );
    b.finish(text)
}

pub(crate) fn audit_checkpoints(after: i64, limit: u32, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (after, limit) = (b.int(after), b.int(i64::from(limit)));
    b.finish(format!(
        "SELECT chain_seq, hash, at, jws FROM audit_checkpoints WHERE chain_seq > {after} ORDER BY chain_seq LIMIT {limit}"
    ))
}

/// The position before the first link whose record was made at or after `cutoff`; the head's when
/// every sealed record is older. NULL when the first stored link is not older.
pub(crate) fn audit_chain_older_than(cutoff: i64, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let cutoff = b.int(cutoff);
    b.finish(format!(
        "SELECT CASE WHEN young.first IS NULL THEN (SELECT MAX(chain_seq) FROM audit_chain)
                     WHEN young.first > (SELECT MIN(chain_seq) FROM audit_chain) THEN young.first - 1
                END
         FROM (SELECT MIN(c.chain_seq) AS first FROM audit_chain c JOIN audit_records a ON a.seq = c.seq
               WHERE a.at >= {cutoff}) young"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::domain::payment::{PaymentKind, PaymentStatus};

    #[test]
    fn filters_bind_in_order_in_each_dialect() {
        let q = OpsPaymentQuery {
            status: Some(PaymentStatus::Succeeded),
            kind: Some(PaymentKind::Payment),
            agent: Some("a".into()),
            before: Some((10, "pay_x".into())),
            limit: 5,
            ..Default::default()
        };
        let s = ops_payments(&q, Dialect::Sqlite);
        assert!(s.text.contains("WHERE status = ?1 AND kind = ?2 AND principal_sub = ?3"), "{}", s.text);
        assert!(s.text.contains("(created_at < ?4 OR (created_at = ?4 AND id < ?5))"), "{}", s.text);
        assert!(s.text.ends_with("LIMIT ?6"), "{}", s.text);
        assert_eq!(s.params.len(), 6);
        let p = ops_payments(&q, Dialect::Postgres);
        assert!(p.text.contains("WHERE status = $1 AND kind = $2 AND principal_sub = $3"), "{}", p.text);
        assert_eq!(p.params, s.params);
        // No filter: no WHERE, only the limit.
        let none = audit(&AuditQuery { limit: 3, ..Default::default() }, Dialect::Postgres);
        assert!(!none.text.contains("WHERE") && none.text.ends_with("LIMIT $1"), "{}", none.text);
    }

    #[test]
    fn filter_values_are_bound_never_spliced() {
        let evil = "x' OR '1'='1";
        let q = AuditQuery { agent: Some(evil.into()), tool: Some(evil.into()), limit: 1, ..Default::default() };
        let s = audit(&q, Dialect::Sqlite);
        assert!(!s.text.contains(evil), "{}", s.text);
        let r = AuditRelated {
            payment_id: evil.into(),
            keys: vec![evil.into()],
            approval_ids: vec![evil.into()],
            limit: 1,
        };
        assert!(!audit_related(&r, Dialect::Postgres).text.contains(evil));
    }
}
