//! Audit rows: records, hash-chain links (`domain::audit_chain`) and signed checkpoints.

use super::Columns;
use crate::domain::audit::AuditRecord;
use crate::domain::audit_chain::{ChainLink, Checkpoint};
use crate::domain::error::StoreError;

pub(crate) const AUDIT_COLS: &str = "seq, at, correlation_id, principal_iss, principal_sub, tool, decision, code, \
                                     idempotency_key, payment_id, approval_id, detail, principal_user, repeats, \
                                     policy_version, intent, tag";

pub(crate) fn audit(r: &dyn Columns) -> Result<AuditRecord, StoreError> {
    audit_at(r, 0)
}

/// An audit record whose `AUDIT_COLS` start at column `o`.
fn audit_at(r: &dyn Columns, o: usize) -> Result<AuditRecord, StoreError> {
    Ok(AuditRecord {
        seq: r.int(o)?,
        at: r.int(o + 1)?,
        correlation_id: r.text(o + 2)?,
        principal_iss: r.text(o + 3)?,
        principal_sub: r.text(o + 4)?,
        principal_user: r.opt_text(o + 12)?,
        tool: r.text(o + 5)?,
        decision: r.text(o + 6)?,
        code: r.opt_text(o + 7)?,
        idempotency_key: r.opt_text(o + 8)?,
        payment_id: r.opt_text(o + 9)?,
        approval_id: r.opt_text(o + 10)?,
        detail: r.opt_text(o + 11)?,
        repeats: r.int(o + 13)?,
        policy_version: r.opt_int(o + 14)?,
        intent: r.opt_text(o + 15)?,
        tag: r.opt_text(o + 16)?,
    })
}

/// `chain_seq, hash, at, jws`
pub(crate) fn audit_checkpoint(r: &dyn Columns) -> Result<Checkpoint, StoreError> {
    Ok(Checkpoint { chain_seq: r.int(0)?, hash: r.text(1)?, at: r.int(2)?, jws: r.text(3)? })
}

/// `chain_seq, seq, prev_hash, hash` then the record's `AUDIT_COLS` (NULL when it is gone).
pub(crate) fn chain_link(r: &dyn Columns) -> Result<ChainLink, StoreError> {
    let present = r.opt_int(4)?.is_some();
    Ok(ChainLink {
        chain_seq: r.int(0)?,
        seq: r.int(1)?,
        prev_hash: r.text(2)?,
        hash: r.text(3)?,
        record: if present { Some(audit_at(r, 4)?) } else { None },
    })
}
