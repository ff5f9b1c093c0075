//! The operator's read queries (and the agents' listing of rail records), built once for both
//! engines: each function returns the statement text in the engine's placeholder dialect and its
//! parameters; the engines only run them through the shared row mappers in `store::rows`.

use super::rows::{self, Value};
use crate::domain::approval::RejectedIntent;
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
    if let Some(user) = &q.principal_user {
        let p = b.text(user);
        b.when(format!("COALESCE(principal_user, '') = {p}"));
    }
    let limit = b.int(i64::from(q.limit));
    let text =
        format!("SELECT {} FROM rail_payments{} ORDER BY seq DESC LIMIT {limit}", rows::RAIL_COLS, b.where_clause());
    b.finish(text)
}

/// What the refunds recorded against `payment` (`refund_of`) add up to: every one not failed (a
/// refund pending or unknown may have moved money; one that failed moved none). One row, one
/// BIGINT, 0 when none.
pub(crate) fn rail_refunded(payment: &str, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let p = b.text(payment);
    b.finish(format!(
        "SELECT CAST(COALESCE(SUM(amount_minor), 0) AS BIGINT) FROM rail_payments
         WHERE refund_of = {p} AND state <> 'failed'"
    ))
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

/// The newest approval a human rejected at or after `since` for the same principal, tool and intent
/// (`fingerprint`: the arguments without the operation_id) under another operation than `key`,
/// unless `key`'s own approval is pending or approved: `id, decided_at`. Uses `approvals_status`
/// (a decision comes after its creation, so `created_at >= created_since` loses nothing).
pub(crate) fn rejected_intent(q: &RejectedIntent<'_>, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (iss, sub, user) = (b.text(q.issuer), b.text(q.subject), b.text(q.user.unwrap_or("")));
    let (tool, fingerprint, key) = (b.text(q.tool), b.text(q.fingerprint), b.text(q.key));
    let (since, created_since) = (b.int(q.since), b.int(q.created_since));
    let text = format!(
        "SELECT id, decided_at FROM approvals
         WHERE status = 'rejected' AND created_at >= {created_since} AND decided_at >= {since}
           AND principal_iss = {iss} AND principal_sub = {sub} AND COALESCE(principal_user, '') = {user}
           AND tool = {tool} AND fingerprint = {fingerprint} AND idempotency_key <> {key}
           AND NOT EXISTS (SELECT 1 FROM approvals o WHERE o.idempotency_key = {key}
                                                      AND o.status IN ('pending', 'approved'))
         ORDER BY decided_at DESC LIMIT 1"
    );
    b.finish(text)
}

/// Who issued the unexpired, unused enrolment code `code_sha256` of the person (issuer, subject),
/// read only (`PasskeyStore::passkey_enrol` consumes it).
pub(crate) fn passkey_code_issuer(code_sha256: &str, owner: (&str, &str), now: i64, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (hash, iss, sub, now) = (b.text(code_sha256), b.text(owner.0), b.text(owner.1), b.int(now));
    let text = format!(
        "SELECT issued_by FROM passkey_enrolment_codes
         WHERE code_sha256 = {hash} AND owner_iss = {iss} AND owner_sub = {sub} AND used_at IS NULL
           AND expires_at >= {now}"
    );
    b.finish(text)
}

/// The newest payment the gateway knows (a ledger payment or a rail record), and the newest thing
/// the audit trail holds (a record or a checkpoint): `newest_payment, newest_audit`.
pub(crate) fn audit_freshness(dialect: Dialect) -> Statement {
    let b = Builder::new(dialect);
    let text = "SELECT (SELECT MAX(t) FROM (SELECT MAX(created_at) AS t FROM payments
                                            UNION ALL SELECT MAX(created_at) FROM rail_payments) p),
                       (SELECT MAX(t) FROM (SELECT MAX(at) AS t FROM audit_records
                                            UNION ALL SELECT MAX(at) FROM audit_checkpoints) a)"
        .to_string();
    b.finish(text)
}

/// The oldest ledger payment made in `[since, before)` without its "allowed" audit record — one
/// naming it under the payment's own idempotency key (the record's key and decision are bound by
/// its writer's tag): the posting transaction writes a payment and that record together, so one
/// without the other lost its record, or had another record (a replay, a refusal) pinned on it.
pub(crate) fn unaudited_payment(since: i64, before: i64, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (since, before) = (b.int(since), b.int(before));
    let text = format!(
        "SELECT id, created_at FROM payments p
         WHERE created_at >= {since} AND created_at < {before}
           AND NOT EXISTS (SELECT 1 FROM audit_records a WHERE a.payment_id = p.id
                             AND a.idempotency_key = p.idempotency_key AND a.decision = 'allowed')
         ORDER BY created_at, id LIMIT 1"
    );
    b.finish(text)
}

/// The first "allowed" record made in `[since, before)` that names a payment the store does not
/// hold: not in `payments` (by id, nor a payment under its idempotency key — a ledger replay's
/// record names the attempt's id while the earlier payment answers), nor in `rail_payments`. A
/// payment deleted, postings and balances with it, after it was decided; or a rail's or external
/// ledger's record deleted after its word settled it ("answered", "query_settled": such a record
/// is never abandoned). ("submitted" records are not held to it: a rail record the rail refused
/// before anything started is abandoned, deleted.)
pub(crate) fn vanished_payment(since: i64, before: i64, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (since, before) = (b.int(since), b.int(before));
    let text = format!(
        "SELECT a.seq, a.payment_id FROM audit_records a
         WHERE a.decision IN ('allowed', 'answered', 'query_settled') AND a.payment_id IS NOT NULL
           AND a.at >= {since} AND a.at < {before}
           AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.id = a.payment_id)
           AND NOT EXISTS (SELECT 1 FROM payments p WHERE p.idempotency_key = a.idempotency_key)
           AND NOT EXISTS (SELECT 1 FROM rail_payments r WHERE r.id = a.payment_id)
         ORDER BY a.seq LIMIT 1"
    );
    b.finish(text)
}

/// Ledger payments made in `[since, before)` after the position `after` (created_at, id, record
/// seq), each with every "allowed" record naming it under its idempotency key, in that order: what
/// `audit verify` holds each payment to (`domain::trail_money`). A refund comes with its
/// original's amount, what all the original's refunds add up to, and how many of them were posted
/// after it (their records are made in the posting transaction, under the original's row lock, so
/// record order is posting order).
pub(crate) fn payment_decisions(
    since: i64,
    before: i64,
    after: (i64, &str, i64),
    limit: u32,
    dialect: Dialect,
) -> Statement {
    let mut b = Builder::new(dialect);
    let (since, before) = (b.int(since), b.int(before));
    let (at, id, seq) = (b.int(after.0), b.text(after.1), b.int(after.2));
    let limit = b.int(i64::from(limit));
    let text = format!(
        "SELECT p.id, p.created_at, p.kind, p.from_account, p.to_account, p.amount_minor, p.currency,
                p.principal_sub, p.principal_user, p.mandate_id, a.principal_sub, a.principal_user, a.intent, a.seq,
                p.refund_of, p.status, a.at, o.amount_minor,
                (SELECT CAST(COALESCE(SUM(r.amount_minor), 0) AS BIGINT) FROM payments r
                 WHERE p.refund_of IS NOT NULL AND r.refund_of = p.refund_of),
                (SELECT COUNT(*) FROM payments r JOIN audit_records b
                   ON b.payment_id = r.id AND b.idempotency_key = r.idempotency_key AND b.decision = 'allowed'
                 WHERE p.refund_of IS NOT NULL AND r.refund_of = p.refund_of AND r.id <> p.id AND b.seq > a.seq)
         FROM payments p JOIN audit_records a
           ON a.payment_id = p.id AND a.idempotency_key = p.idempotency_key AND a.decision = 'allowed'
           LEFT JOIN payments o ON o.id = p.refund_of
         WHERE p.created_at >= {since} AND p.created_at < {before}
           AND (p.created_at > {at} OR (p.created_at = {at} AND (p.id > {id} OR (p.id = {id} AND a.seq > {seq}))))
         ORDER BY p.created_at, p.id, a.seq LIMIT {limit}"
    );
    b.finish(text)
}

/// The payments whose postings are not exactly one debit of the payment's amount from its payer
/// and one credit of it to its payee, in its currency (`rules::integrity`: "not one balanced
/// debit/credit pair"): a posting rewritten to another account or amount is named, not only an
/// unbalanced one. `postings`: the postings table as read (alias `p`, engine hints allowed);
/// `since`: the condition on them (`"TRUE"` for all).
pub(crate) fn unbalanced_payments(postings: &str, since: &str) -> String {
    format!(
        "SELECT p.payment_id FROM {postings} LEFT JOIN payments y ON y.id = p.payment_id
         WHERE p.payment_id IS NOT NULL AND {since}
         GROUP BY p.payment_id
         HAVING SUM(p.amount_minor) <> 0 OR COUNT(*) <> 2
             OR SUM(CASE WHEN p.account_id = y.from_account AND p.amount_minor = -y.amount_minor
                          AND p.currency = y.currency THEN 1 ELSE 0 END) <> 1
             OR SUM(CASE WHEN p.account_id = y.to_account AND p.amount_minor = y.amount_minor
                          AND p.currency = y.currency THEN 1 ELSE 0 END) <> 1"
    )
}

/// The full integrity check's out-of-bounds ids, one text for both engines: non-overdraft
/// accounts below zero, payments refunded beyond their amount or whose `refunded_minor` is not the
/// sum of their refunds, refunds astray ([`REFUNDS_ASTRAY`]), mandates drawn more than their row
/// says ([`MANDATES_UNDERCOUNTED`]) and undercounted usage ([`usage_undercounted`]).
pub(crate) fn out_of_bounds_full(dialect: Dialect) -> String {
    let sep = match dialect {
        Dialect::Sqlite => "char(31)",
        Dialect::Postgres => "chr(31)",
    };
    format!(
        "SELECT id FROM accounts WHERE NOT allow_overdraft AND balance_minor < 0
         UNION ALL SELECT id FROM payments WHERE refunded_minor > amount_minor
         UNION ALL SELECT y.id FROM payments y
           LEFT JOIN (SELECT refund_of, SUM(amount_minor) AS refunded FROM payments
                      WHERE refund_of IS NOT NULL GROUP BY refund_of) r ON r.refund_of = y.id
           WHERE y.refunded_minor <> COALESCE(r.refunded, 0)
         UNION ALL {REFUNDS_ASTRAY}
         UNION ALL {MANDATES_UNDERCOUNTED}
         UNION ALL {}",
        usage_undercounted(sep)
    )
}

/// Mandates whose use count or spend is below the payments drawing on them: every ledger payment
/// and every rail payment not failed (a failure gives its draw back) made under a mandate drew one
/// use and its amount in the posting, so a row below that was reset or lowered in the database —
/// and a reset mandate can be drawn past its uses and budget. Both engines' full integrity check.
pub(crate) const MANDATES_UNDERCOUNTED: &str = "SELECT m.id FROM mandates m
     JOIN (SELECT mandate_id, COUNT(*) AS n, SUM(amount_minor) AS spent
           FROM (SELECT mandate_id, amount_minor FROM payments WHERE mandate_id IS NOT NULL
                 UNION ALL SELECT mandate_id, amount_minor FROM rail_payments
                           WHERE mandate_id IS NOT NULL AND state <> 'failed') d
           GROUP BY mandate_id) t ON t.mandate_id = m.id
     WHERE m.uses < t.n OR m.spent_minor < t.spent";

/// Refunds that do not give back a payment the ledger holds: no original (`refund_of` cleared or
/// naming nothing), an original that is itself a refund, or money going another way than back
/// from the original's payee to its payer in its currency. A refund detached from its original
/// would let the original be refunded again. Both engines' full integrity check.
pub(crate) const REFUNDS_ASTRAY: &str = "SELECT r.id FROM payments r LEFT JOIN payments o ON o.id = r.refund_of
     WHERE r.kind = 'refund' AND (o.id IS NULL OR o.kind <> 'payment' OR r.from_account <> o.to_account
                                  OR r.to_account <> o.from_account OR r.currency <> o.currency)";

/// Daily usage counters (`budget_usage`, `refund_usage`) that count less than the payments they
/// count: every ledger payment, and every rail payment not failed (a failure gives its draw back),
/// draws on its principal's row for its UTC day when it is made, so a counter below the sum was
/// reset or lowered in the database — and a reset counter lets an agent pay past its daily limit.
/// `sep`: the engine's expression for the unit separator of `principal::usage_subject`. Both
/// engines' full integrity check.
pub(crate) fn usage_undercounted(sep: &str) -> String {
    let subject = format!(
        "CASE WHEN principal_user IS NULL THEN principal_sub ELSE principal_sub || {sep} || principal_user END"
    );
    let who = "CASE WHEN principal_user IS NULL THEN principal_sub ELSE principal_sub || ' for ' || principal_user END";
    let drawn = |table: &str, only: &str| {
        format!(
            "SELECT CASE WHEN kind = 'refund' THEN 'refund_usage' ELSE 'budget_usage' END AS counter,
                    {subject} AS subject, {who} AS who, created_at - (created_at % 86400) AS day, currency,
                    amount_minor
             FROM {table} {only}"
        )
    };
    format!(
        "SELECT * FROM (WITH drawn AS ({} UNION ALL {}),
              totals AS (SELECT counter, subject, MIN(who) AS who, day, currency, SUM(amount_minor) AS spent,
                                COUNT(*) AS n
                         FROM drawn GROUP BY counter, subject, day, currency)
         SELECT t.counter || ' of ' || t.who || ' for the day starting ' || CAST(t.day AS TEXT) || ' (' || t.currency || ')'
         FROM totals t
         LEFT JOIN budget_usage b ON t.counter = 'budget_usage' AND b.subject = t.subject AND b.day = t.day
                                 AND b.currency = t.currency
         LEFT JOIN refund_usage r ON t.counter = 'refund_usage' AND r.subject = t.subject AND r.day = t.day
                                 AND r.currency = t.currency
         WHERE COALESCE(b.spent_minor, r.spent_minor, 0) < t.spent OR COALESCE(b.payments, r.payments, 0) < t.n
        ) undercounted",
        drawn("payments", ""),
        drawn("rail_payments", "WHERE state <> 'failed'"),
    )
}

/// When the oldest audit record still in the store was made.
pub(crate) fn oldest_audit_record(dialect: Dialect) -> Statement {
    Builder::new(dialect).finish("SELECT MIN(at) FROM audit_records".to_string())
}

/// The agents that have acted for `user` (delegated tokens), as the audit trail names them: at most
/// `limit`, by name.
pub(crate) fn agents_for_user(user: &str, limit: u32, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (user, limit) = (b.text(user), b.int(i64::from(limit)));
    let text = format!(
        "SELECT DISTINCT principal_sub FROM audit_records WHERE principal_user = {user}
         ORDER BY principal_sub LIMIT {limit}"
    );
    b.finish(text)
}

/// The suspensions in force of one agent (`principal_state` rows with `suspended_at`), under
/// `issuer` or from before issuers were recorded: what a resume without a user would lift.
pub(crate) fn agent_suspensions(issuer: &str, subject: &str, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (subject, issuer) = (b.text(subject), b.text(issuer));
    let text = format!(
        "SELECT subject, suspended_at, suspended_reason, resumed_at, issuer, scope, principal_user FROM principal_state
         WHERE subject = {subject} AND issuer IN ({issuer}, '') AND suspended_at IS NOT NULL
         ORDER BY scope, principal_user"
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

/// What `owner`'s autonomous payments to `payee` total since it became known at `known_since`, in
/// `currency` (the cooling-off total's usage): one row, one BIGINT, 0 when none.
pub(crate) fn payee_cooling_usage(
    owner: &str,
    payee: &str,
    known_since: i64,
    currency: &str,
    dialect: Dialect,
) -> Statement {
    let mut b = Builder::new(dialect);
    let (owner, payee, since, currency) = (b.text(owner), b.text(payee), b.int(known_since), b.text(currency));
    b.finish(format!(
        "SELECT CAST(COALESCE(SUM(spent_minor), 0) AS BIGINT) FROM payee_cooling_usage
         WHERE owner = {owner} AND payee = {payee} AND known_since = {since} AND currency = {currency}"
    ))
}

/// A statement without parameters.
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

/// The first record of `tool`: seq, detail.
pub(crate) fn audit_first_of_tool(tool: &str, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let tool = b.text(tool);
    b.finish(format!("SELECT seq, detail FROM audit_records WHERE tool = {tool} ORDER BY seq LIMIT 1"))
}

/// The highest policy version any record names (`policy_version`: the version a call was judged
/// under, or the version a policy change applied).
pub(crate) fn audit_policy_version_max(dialect: Dialect) -> Statement {
    plain("SELECT MAX(policy_version) FROM audit_records", dialect)
}

/// Which of the records `seqs` are stored: seq, tag, and 1 when a link names it (sealed).
pub(crate) fn audit_witness_read(seqs: &[i64], dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let list: Vec<String> = seqs.iter().map(|s| b.int(*s)).collect();
    let text = format!(
        "SELECT a.seq, a.tag, CASE WHEN EXISTS (SELECT 1 FROM audit_chain c WHERE c.seq = a.seq) THEN 1 ELSE 0 END
         FROM audit_records a WHERE a.seq IN ({})",
        list.join(", ")
    );
    b.finish(text)
}

/// Records no link names yet (not sealed), after seq `after`, in seq order.
pub(crate) fn audit_unsealed_records(after: i64, limit: u32, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let (after, limit) = (b.int(after), b.int(i64::from(limit)));
    let cols: Vec<String> = rows::AUDIT_COLS.split(',').map(|c| format!("a.{}", c.trim())).collect();
    let text = format!(
        "SELECT {} FROM audit_records a
         WHERE a.seq > {after} AND NOT EXISTS (SELECT 1 FROM audit_chain c WHERE c.seq = a.seq)
         ORDER BY a.seq LIMIT {limit}",
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

pub(crate) fn audit_checkpoint_before(before: i64, dialect: Dialect) -> Statement {
    let mut b = Builder::new(dialect);
    let before = b.int(before);
    b.finish(format!(
        "SELECT chain_seq, hash, at, jws FROM audit_checkpoints WHERE chain_seq < {before} ORDER BY chain_seq DESC LIMIT 1"
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
