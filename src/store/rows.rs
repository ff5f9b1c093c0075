//! Rows → domain types, once for both engines. Each engine's row type implements [`Columns`]
//! (typed access by column index); every mapper, column list and "corrupt" label lives here.

use crate::clock::UnixSecs;
use crate::domain::approval::{ApprovalRecord, ApprovalStatus, Approver, IssuedMandate, Review, ReviewDecision};
use crate::domain::audit::AuditRecord;
use crate::domain::error::StoreError;
use crate::domain::ids::{AccountId, ApprovalId, PaymentId};
use crate::domain::money::Currency;
use crate::domain::ops::{MandateListing, MandateStatus, OpsPayment, PrincipalState, VolumeRow};
use crate::domain::payment::{AccountRow, LedgerEntry, Payment, PaymentKind, PaymentStatus, SummaryRow};
use crate::domain::rail::{RailFlow, RailPayment, RailState};
use crate::domain::rules::guards::MandateRow;
use crate::domain::rules::reservation::IdempotencyRow;
use crate::mandate::MandateKind;

mod audit;
mod passkeys;
mod policy;
pub(crate) use audit::{AUDIT_COLS, audit, audit_checkpoint, chain_link};
pub(crate) use passkeys::{PASSKEY_COLS, passkey, passkey_values};
pub(crate) use policy::{
    POLICY_PROPOSAL_COLS, POLICY_VERSION_COLS, policy_proposal, policy_proposal_values, policy_version,
    policy_version_values,
};

/// One result row as plain values, whichever engine produced it: what `Store::select_rows` returns
/// for the operator's reads, mapped by the same functions as the engines' own rows.
#[doc(hidden)]
#[derive(Debug, Clone, PartialEq)]
pub struct PlainRow(pub(crate) Vec<Cell>);

#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Cell {
    Null,
    Int(i64),
    Text(String),
    Bool(bool),
}

impl PlainRow {
    fn cell(&self, i: usize) -> Result<&Cell, StoreError> {
        self.0.get(i).ok_or_else(|| corrupt("result column"))
    }
}

impl Columns for PlainRow {
    fn text(&self, i: usize) -> Result<String, StoreError> {
        self.opt_text(i)?.ok_or_else(|| corrupt("NULL text column"))
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Text(s) => Ok(Some(s.clone())),
            _ => Err(corrupt("text column")),
        }
    }
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        self.opt_int(i)?.ok_or_else(|| corrupt("NULL integer column"))
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        match self.cell(i)? {
            Cell::Null => Ok(None),
            Cell::Int(n) => Ok(Some(*n)),
            _ => Err(corrupt("integer column")),
        }
    }
    fn boolean(&self, i: usize) -> Result<bool, StoreError> {
        match self.cell(i)? {
            Cell::Bool(b) => Ok(*b),
            Cell::Int(n) => Ok(*n != 0),
            _ => Err(corrupt("boolean column")),
        }
    }
}

/// Map plain rows through a shared mapper.
pub(crate) fn map_plain<T>(
    rows: Vec<PlainRow>,
    f: impl Fn(&dyn Columns) -> Result<T, StoreError>,
) -> Result<Vec<T>, StoreError> {
    rows.iter().map(|r| f(r)).collect()
}

/// Typed access to one result row by column index.
pub(crate) trait Columns {
    fn text(&self, i: usize) -> Result<String, StoreError>;
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError>;
    fn int(&self, i: usize) -> Result<i64, StoreError>;
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError>;
    fn boolean(&self, i: usize) -> Result<bool, StoreError>;
}

impl Columns for rusqlite::Row<'_> {
    fn text(&self, i: usize) -> Result<String, StoreError> {
        Ok(self.get(i)?)
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        Ok(self.get(i)?)
    }
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        Ok(self.get(i)?)
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        Ok(self.get(i)?)
    }
    fn boolean(&self, i: usize) -> Result<bool, StoreError> {
        Ok(self.get(i)?)
    }
}

impl Columns for tokio_postgres::Row {
    fn text(&self, i: usize) -> Result<String, StoreError> {
        Ok(self.try_get(i)?)
    }
    fn opt_text(&self, i: usize) -> Result<Option<String>, StoreError> {
        Ok(self.try_get(i)?)
    }
    fn int(&self, i: usize) -> Result<i64, StoreError> {
        Ok(self.try_get(i)?)
    }
    fn opt_int(&self, i: usize) -> Result<Option<i64>, StoreError> {
        Ok(self.try_get(i)?)
    }
    fn boolean(&self, i: usize) -> Result<bool, StoreError> {
        Ok(self.try_get(i)?)
    }
}

fn corrupt(what: &str) -> StoreError {
    StoreError::Corrupt(what.to_string())
}

fn account_id(r: &dyn Columns, i: usize, what: &str) -> Result<AccountId, StoreError> {
    AccountId::parse(&r.text(i)?).map_err(|_| corrupt(what))
}

fn payment_id(r: &dyn Columns, i: usize, what: &str) -> Result<Option<PaymentId>, StoreError> {
    r.opt_text(i)?.map(|s| PaymentId::parse(&s).map_err(|_| corrupt(what))).transpose()
}

fn currency(r: &dyn Columns, i: usize, what: &str) -> Result<Currency, StoreError> {
    Currency::parse(&r.text(i)?).map_err(|_| corrupt(what))
}

pub(crate) const PAYMENT_COLS: &str = "id, kind, status, from_account, to_account, amount_minor, currency, \
                                       refunded_minor, refund_of, memo, principal_sub, created_at, seq, \
                                       principal_user";

/// A `PAYMENT_COLS` row: the payment and its `seq` (the paging cursor).
pub(crate) fn payment(r: &dyn Columns) -> Result<(Payment, i64), StoreError> {
    let payment = Payment {
        id: payment_id(r, 0, "payments.id")?.ok_or_else(|| corrupt("payments.id"))?,
        kind: PaymentKind::parse(&r.text(1)?).ok_or_else(|| corrupt("payments.kind"))?,
        status: PaymentStatus::parse(&r.text(2)?).ok_or_else(|| corrupt("payments.status"))?,
        from_account: account_id(r, 3, "payments.from_account")?,
        to_account: account_id(r, 4, "payments.to_account")?,
        amount_minor: r.int(5)?,
        currency: currency(r, 6, "payments.currency")?,
        refunded_minor: r.int(7)?,
        refund_of: payment_id(r, 8, "payments.refund_of")?,
        memo: r.opt_text(9)?,
        principal_sub: r.text(10)?,
        principal_user: r.opt_text(13)?,
        created_at: r.int(11)?,
    };
    Ok((payment, r.int(12)?))
}

pub(crate) const RAIL_COLS: &str = "seq, id, idempotency_key, rail, kind, state, from_account, to_account, \
                                    amount_minor, currency, refund_of, memo, principal_sub, mandate_id, rail_ref, \
                                    receipt, phone, reason, created_at, updated_at, flow, principal_user, family_key";

/// A `RAIL_COLS` row: its `seq` and the record.
pub(crate) fn rail(r: &dyn Columns) -> Result<(i64, RailPayment), StoreError> {
    let rec = RailPayment {
        id: payment_id(r, 1, "rail payment id")?.ok_or_else(|| corrupt("rail payment id"))?,
        idempotency_key: r.text(2)?,
        rail: r.text(3)?,
        kind: PaymentKind::parse(&r.text(4)?).ok_or_else(|| corrupt("rail payment kind"))?,
        state: RailState::parse(&r.text(5)?).ok_or_else(|| corrupt("rail payment state"))?,
        from_account: account_id(r, 6, "rail payment account")?,
        to_account: account_id(r, 7, "rail payment account")?,
        amount_minor: r.int(8)?,
        currency: currency(r, 9, "rail payment currency")?,
        refund_of: payment_id(r, 10, "rail refund_of")?,
        memo: r.opt_text(11)?,
        principal_sub: r.text(12)?,
        principal_user: r.opt_text(21)?,
        mandate_id: r.opt_text(13)?,
        rail_ref: r.opt_text(14)?,
        receipt: r.opt_text(15)?,
        phone: r.opt_text(16)?,
        reason: r.opt_text(17)?,
        created_at: r.int(18)?,
        updated_at: r.int(19)?,
        flow: RailFlow::parse(&r.text(20)?).ok_or_else(|| corrupt("rail payment flow"))?,
        family_key: r.opt_text(22)?,
    };
    Ok((r.int(0)?, rec))
}

pub(crate) const OPS_PAYMENT_COLS: &str = "rail, id, kind, status, rail_state, from_account, to_account, amount_minor, \
                                           currency, refunded_minor, refund_of, memo, principal_sub, created_at, \
                                           mandate_id, idempotency_key, rail_ref, receipt, principal_user";

/// An `OPS_PAYMENT_COLS` row (`store::queries`): a payment from the ledger or a rail record.
pub(crate) fn ops_payment(r: &dyn Columns) -> Result<OpsPayment, StoreError> {
    let payment = Payment {
        id: payment_id(r, 1, "payment id")?.ok_or_else(|| corrupt("payment id"))?,
        kind: PaymentKind::parse(&r.text(2)?).ok_or_else(|| corrupt("payment kind"))?,
        status: PaymentStatus::parse(&r.text(3)?).ok_or_else(|| corrupt("payment status"))?,
        from_account: account_id(r, 5, "payment from_account")?,
        to_account: account_id(r, 6, "payment to_account")?,
        amount_minor: r.int(7)?,
        currency: currency(r, 8, "payment currency")?,
        refunded_minor: r.int(9)?,
        refund_of: payment_id(r, 10, "payment refund_of")?,
        memo: r.opt_text(11)?,
        principal_sub: r.text(12)?,
        principal_user: r.opt_text(18)?,
        created_at: r.int(13)?,
    };
    Ok(OpsPayment {
        rail: r.text(0)?,
        payment,
        rail_state: r.opt_text(4)?,
        mandate_id: r.opt_text(14)?,
        idempotency_key: r.text(15)?,
        rail_ref: r.opt_text(16)?,
        receipt: r.opt_text(17)?,
    })
}

/// Followed by the status column `store::queries` computes.
pub(crate) const MANDATE_LISTING_COLS: &str = "id, kind, approval_id, subject, currency, budget_minor, max_uses, \
                                               spent_minor, uses, expires_at, created_at, revoked_at, revoked_by, \
                                               principal_user";

pub(crate) fn mandate_listing(r: &dyn Columns) -> Result<MandateListing, StoreError> {
    Ok(MandateListing {
        id: r.text(0)?,
        kind: r.text(1)?,
        approval_id: r.text(2)?,
        subject: r.text(3)?,
        currency: r.text(4)?,
        budget_minor: r.opt_int(5)?,
        max_uses: r.int(6)?,
        spent_minor: r.int(7)?,
        uses: r.int(8)?,
        expires_at: r.int(9)?,
        created_at: r.int(10)?,
        revoked_at: r.opt_int(11)?,
        revoked_by: r.opt_text(12)?,
        user: r.opt_text(13)?,
        status: MandateStatus::parse(&r.text(14)?).ok_or_else(|| corrupt("mandate status"))?,
    })
}

/// `subject, suspended_at, suspended_reason, resumed_at, issuer, scope, principal_user`
pub(crate) fn principal_state(r: &dyn Columns) -> Result<PrincipalState, StoreError> {
    Ok(PrincipalState {
        issuer: r.text(4)?,
        subject: r.text(0)?,
        scope: crate::domain::principal::SuspensionScope::from_columns(&r.text(5)?, &r.text(6)?),
        suspended_at: r.opt_int(1)?,
        suspended_reason: r.opt_text(2)?,
        resumed_at: r.opt_int(3)?,
    })
}

/// `hour, kind, status, currency, count, amount`
pub(crate) fn volume(r: &dyn Columns) -> Result<VolumeRow, StoreError> {
    Ok(VolumeRow {
        hour: r.int(0)?,
        kind: r.text(1)?,
        status: r.text(2)?,
        currency: r.text(3)?,
        count: r.int(4)?,
        amount_minor: r.int(5)?,
    })
}

pub(crate) const APPROVAL_COLS: &str = "id, status, idempotency_key, fingerprint, principal_iss, principal_sub, tool, \
                                        intent, amount_minor, currency, reason, created_at, expires_at, kind, \
                                        reviewers_required, requested_by, mandate_id, mandate, decided_at, \
                                        decision_reason, approver, principal_user, passkey_required, tag";

/// An `APPROVAL_COLS` row, without its reviews.
pub(crate) fn approval(r: &dyn Columns) -> Result<ApprovalRecord, StoreError> {
    Ok(ApprovalRecord {
        id: ApprovalId::parse(&r.text(0)?).map_err(|_| corrupt("approvals.id"))?,
        status: ApprovalStatus::parse(&r.text(1)?).ok_or_else(|| corrupt("approvals.status"))?,
        kind: MandateKind::parse(&r.text(13)?).ok_or_else(|| corrupt("approvals.kind"))?,
        idempotency_key: r.text(2)?,
        fingerprint: r.text(3)?,
        principal_iss: r.text(4)?,
        principal_sub: r.text(5)?,
        principal_user: r.opt_text(21)?,
        tool: r.text(6)?,
        intent: serde_json::from_str(&r.text(7)?).map_err(|_| corrupt("approvals.intent"))?,
        amount_minor: r.int(8)?,
        currency: currency(r, 9, "approvals.currency")?,
        reason: r.text(10)?,
        created_at: r.int(11)?,
        expires_at: r.int(12)?,
        reviewers_required: r.int(14)?,
        requested_by: r.text(15)?,
        mandate_id: r.opt_text(16)?,
        mandate: r.opt_text(17)?,
        decided_at: r.opt_int(18)?,
        decision_reason: r.opt_text(19)?,
        reviews: vec![],
        approver: Approver::parse(&r.text(20)?).ok_or_else(|| corrupt("approvals.approver"))?,
        passkey_required: r.int(22)? != 0,
        tag: r.opt_text(23)?,
    })
}

pub(crate) const REVIEW_COLS: &str = "reviewer_iss, reviewer_sub, decision, reason, at, passkey, tag";

pub(crate) fn review(r: &dyn Columns) -> Result<Review, StoreError> {
    Ok(Review {
        reviewer_iss: r.text(0)?,
        reviewer_sub: r.text(1)?,
        decision: ReviewDecision::parse(&r.text(2)?).ok_or_else(|| corrupt("approval_reviews.decision"))?,
        reason: r.opt_text(3)?,
        at: r.int(4)?,
        passkey: r.opt_text(5)?,
        as_user: false,
        tag: r.opt_text(6)?,
    })
}

pub(crate) const ENTRY_COLS: &str =
    "seq, payment_id, amount_minor, currency, balance_after_minor, description, created_at";

pub(crate) fn entry(r: &dyn Columns) -> Result<LedgerEntry, StoreError> {
    Ok(LedgerEntry {
        seq: r.int(0)?,
        payment_id: payment_id(r, 1, "postings.payment_id")?,
        amount_minor: r.int(2)?,
        currency: currency(r, 3, "postings.currency")?,
        balance_after_minor: r.int(4)?,
        description: r.text(5)?,
        created_at: r.int(6)?,
    })
}

pub(crate) fn summary(r: &dyn Columns) -> Result<SummaryRow, StoreError> {
    Ok(SummaryRow {
        kind: r.text(0)?,
        status: r.text(1)?,
        currency: r.text(2)?,
        count: r.int(3)?,
        total_minor: r.int(4)?,
    })
}

/// `currency, balance_minor, allow_overdraft` from column `first` on.
pub(crate) fn account(r: &dyn Columns, first: usize) -> Result<AccountRow, StoreError> {
    Ok(AccountRow {
        currency: currency(r, first, "account currency")?,
        balance_minor: r.int(first + 1)?,
        allow_overdraft: r.boolean(first + 2)?,
    })
}

pub(crate) const MANDATE_COLS: &str = "currency, budget_minor, max_uses, spent_minor, uses, expires_at, revoked_at";

pub(crate) fn mandate(r: &dyn Columns) -> Result<MandateRow, StoreError> {
    Ok(MandateRow {
        currency: r.text(0)?,
        budget_minor: r.opt_int(1)?,
        max_uses: r.int(2)?,
        spent_minor: r.int(3)?,
        uses: r.int(4)?,
        expires_at: r.int(5)?,
        revoked_at: r.opt_int(6)?,
    })
}

/// `fingerprint, state, outcome, lease_until, expires_at` from column `first` on.
pub(crate) fn idempotency(r: &dyn Columns, first: usize) -> Result<IdempotencyRow, StoreError> {
    Ok(IdempotencyRow {
        fingerprint: r.text(first)?,
        state: r.text(first + 1)?,
        outcome: r.opt_text(first + 2)?,
        lease_until: r.int(first + 3)?,
        expires_at: r.int(first + 4)?,
    })
}

/// One statement parameter, engine-neutral: each engine binds it as its own type. The `*_values`
/// functions below list a row's columns once, in the order of their `INSERT` statements.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Value {
    Text(Option<String>),
    Int(Option<i64>),
}

fn text(s: &str) -> Value {
    Value::Text(Some(s.to_string()))
}

fn opt_text(s: Option<&str>) -> Value {
    Value::Text(s.map(str::to_string))
}

fn int(i: i64) -> Value {
    Value::Int(Some(i))
}

/// `id, idempotency_key, kind, status, from_account, to_account, amount_minor, currency,
/// refunded_minor, refund_of, memo, principal_sub, created_at, mandate_id, principal_user`
pub(crate) fn payment_values(p: &Payment, key: &str, mandate_id: Option<&str>) -> Vec<Value> {
    vec![
        text(p.id.as_str()),
        text(key),
        text(p.kind.as_str()),
        text(p.status.as_str()),
        text(p.from_account.as_str()),
        text(p.to_account.as_str()),
        int(p.amount_minor),
        text(p.currency.code()),
        int(p.refunded_minor),
        opt_text(p.refund_of.as_ref().map(|r| r.as_str())),
        opt_text(p.memo.as_deref()),
        text(&p.principal_sub),
        int(p.created_at),
        opt_text(mandate_id),
        opt_text(p.principal_user.as_deref()),
    ]
}

/// `APPROVAL_COLS`, in order.
pub(crate) fn approval_values(rec: &ApprovalRecord) -> Vec<Value> {
    vec![
        text(rec.id.as_str()),
        text(rec.status.as_str()),
        text(&rec.idempotency_key),
        text(&rec.fingerprint),
        text(&rec.principal_iss),
        text(&rec.principal_sub),
        text(&rec.tool),
        text(&rec.intent.to_string()),
        int(rec.amount_minor),
        text(rec.currency.code()),
        text(&rec.reason),
        int(rec.created_at),
        int(rec.expires_at),
        text(rec.kind.as_str()),
        int(rec.reviewers_required),
        text(&rec.requested_by),
        opt_text(rec.mandate_id.as_deref()),
        opt_text(rec.mandate.as_deref()),
        Value::Int(rec.decided_at),
        opt_text(rec.decision_reason.as_deref()),
        text(rec.approver.as_str()),
        opt_text(rec.principal_user.as_deref()),
        int(i64::from(rec.passkey_required)),
        opt_text(rec.tag.as_deref()),
    ]
}

/// `AUDIT_COLS` without `seq`; `payment_id` (the payment the posting made) names it when the record
/// does not (a gateway-written "allowed" record names the id its attempt drew, replay or not).
pub(crate) fn audit_values(r: &AuditRecord, payment_id: Option<&str>) -> Vec<Value> {
    vec![
        int(r.at),
        text(&r.correlation_id),
        text(&r.principal_iss),
        text(&r.principal_sub),
        text(&r.tool),
        text(r.decision.as_str()),
        opt_text(r.code.as_deref()),
        opt_text(r.idempotency_key.as_deref()),
        opt_text(r.payment_id.as_deref().or(payment_id)),
        opt_text(r.approval_id.as_deref()),
        opt_text(r.detail.as_deref()),
        opt_text(r.principal_user.as_deref()),
        int(r.repeats),
        Value::Int(r.policy_version),
        opt_text(r.intent.as_deref()),
        opt_text(r.tag.as_deref()),
    ]
}

/// `RAIL_COLS` without `seq`.
pub(crate) fn rail_values(rec: &RailPayment) -> Vec<Value> {
    vec![
        text(rec.id.as_str()),
        text(&rec.idempotency_key),
        text(&rec.rail),
        text(rec.kind.as_str()),
        text(rec.state.as_str()),
        text(rec.from_account.as_str()),
        text(rec.to_account.as_str()),
        int(rec.amount_minor),
        text(rec.currency.code()),
        opt_text(rec.refund_of.as_ref().map(|p| p.as_str())),
        opt_text(rec.memo.as_deref()),
        text(&rec.principal_sub),
        opt_text(rec.mandate_id.as_deref()),
        opt_text(rec.rail_ref.as_deref()),
        opt_text(rec.receipt.as_deref()),
        opt_text(rec.phone.as_deref()),
        opt_text(rec.reason.as_deref()),
        int(rec.created_at),
        int(rec.updated_at),
        text(rec.flow.as_str()),
        opt_text(rec.principal_user.as_deref()),
        opt_text(rec.family_key.as_deref()),
    ]
}

/// `id, kind, approval_id, subject, currency, budget_minor, max_uses, expires_at, created_at,
/// principal_user`
pub(crate) fn mandate_values(m: &IssuedMandate, approval: &ApprovalRecord, now: UnixSecs) -> Vec<Value> {
    vec![
        text(&m.id),
        text(approval.kind.as_str()),
        text(approval.id.as_str()),
        text(&approval.principal_sub),
        text(approval.currency.code()),
        Value::Int(m.budget_minor),
        int(m.max_uses),
        int(m.expires_at),
        int(now),
        opt_text(approval.principal_user.as_deref()),
    ]
}

/// A checkpoint as stored (JSON).
pub(crate) fn checkpoint_body(c: &crate::domain::rules::integrity::Checkpoint) -> String {
    serde_json::to_string(c).unwrap_or_else(|_| unreachable!("a checkpoint is plain data"))
}

pub(crate) fn checkpoint(body: &str) -> Result<crate::domain::rules::integrity::Checkpoint, StoreError> {
    serde_json::from_str(body).map_err(|_| corrupt("integrity_checkpoints.body"))
}

/// The columns of `payees`, in this order.
pub(crate) const PAYEE_COLS: &str = "owner, payee, known_since, added_by, approval_id, revoked_at, revoked_by, tag";

pub(crate) fn payee(r: &dyn Columns) -> Result<crate::domain::payee::PayeeRecord, StoreError> {
    Ok(crate::domain::payee::PayeeRecord {
        owner: r.text(0)?,
        payee: r.text(1)?,
        known_since: r.int(2)?,
        added_by: r.text(3)?,
        approval_id: r.opt_text(4)?,
        revoked_at: r.opt_int(5)?,
        revoked_by: r.opt_text(6)?,
        tag: r.opt_text(7)?,
    })
}

/// The columns of `webhook_outbox`, in this order.
pub(crate) const OUTBOX_COLS: &str =
    "id, endpoint, event, body, created_at, state, attempts, next_attempt_at, delivered_at, last_status, last_error";

pub(crate) fn outbox(r: &dyn Columns) -> Result<crate::domain::webhook::OutboxMessage, StoreError> {
    Ok(crate::domain::webhook::OutboxMessage {
        id: r.text(0)?,
        endpoint: r.text(1)?,
        event: r.text(2)?,
        body: r.text(3)?,
        created_at: r.int(4)?,
        state: r.text(5)?,
        attempts: r.int(6)?,
        next_attempt_at: r.int(7)?,
        delivered_at: r.opt_int(8)?,
        last_status: r.opt_int(9)?,
        last_error: r.opt_text(10)?,
    })
}

/// The columns of `webhook_attempts`, in this order.
pub(crate) const ATTEMPT_COLS: &str = "message_id, attempt, at, status, error, duration_ms";

pub(crate) fn attempt(r: &dyn Columns) -> Result<crate::domain::webhook::DeliveryAttempt, StoreError> {
    Ok(crate::domain::webhook::DeliveryAttempt {
        message_id: r.text(0)?,
        attempt: r.int(1)?,
        at: r.int(2)?,
        status: r.opt_int(3)?,
        error: r.opt_text(4)?,
        duration_ms: r.int(5)?,
    })
}
