//! Policy rows: versions and proposals (`domain::policy_doc`).

use super::{Columns, Value, corrupt, int, opt_text, text};
use crate::domain::error::StoreError;
use crate::domain::policy_doc::{PolicyProposal, PolicyVersion, ProposalStatus};

pub(crate) const POLICY_VERSION_COLS: &str =
    "version, document, author_iss, author_sub, reason, approver_iss, approver_sub, proposal_id, created_at, tag";

pub(crate) const POLICY_PROPOSAL_COLS: &str = "id, base_version, document, author_iss, author_sub, reason, \
                                               created_at, status, decided_iss, decided_sub, decided_at, applied_version, tag";

pub(crate) fn policy_version(r: &dyn Columns) -> Result<PolicyVersion, StoreError> {
    Ok(PolicyVersion {
        version: r.int(0)?,
        document: r.text(1)?,
        author_iss: r.text(2)?,
        author_sub: r.text(3)?,
        reason: r.text(4)?,
        approver_iss: r.text(5)?,
        approver_sub: r.text(6)?,
        proposal_id: r.opt_text(7)?,
        created_at: r.int(8)?,
        tag: r.opt_text(9)?,
    })
}

/// `POLICY_VERSION_COLS`, in order.
pub(crate) fn policy_version_values(v: &PolicyVersion) -> Vec<Value> {
    vec![
        int(v.version),
        text(&v.document),
        text(&v.author_iss),
        text(&v.author_sub),
        text(&v.reason),
        text(&v.approver_iss),
        text(&v.approver_sub),
        opt_text(v.proposal_id.as_deref()),
        int(v.created_at),
        opt_text(v.tag.as_deref()),
    ]
}

pub(crate) fn policy_proposal(r: &dyn Columns) -> Result<PolicyProposal, StoreError> {
    Ok(PolicyProposal {
        id: r.text(0)?,
        base_version: r.int(1)?,
        document: r.text(2)?,
        author_iss: r.text(3)?,
        author_sub: r.text(4)?,
        reason: r.text(5)?,
        created_at: r.int(6)?,
        status: ProposalStatus::parse(&r.text(7)?).ok_or_else(|| corrupt("policy_proposals.status"))?,
        decided_iss: r.opt_text(8)?,
        decided_sub: r.opt_text(9)?,
        decided_at: r.opt_int(10)?,
        applied_version: r.opt_int(11)?,
        tag: r.opt_text(12)?,
    })
}

/// `POLICY_PROPOSAL_COLS` of a new (pending) proposal, in order.
pub(crate) fn policy_proposal_values(p: &PolicyProposal) -> Vec<Value> {
    vec![
        text(&p.id),
        int(p.base_version),
        text(&p.document),
        text(&p.author_iss),
        text(&p.author_sub),
        text(&p.reason),
        int(p.created_at),
        text(p.status.as_str()),
        opt_text(p.decided_iss.as_deref()),
        opt_text(p.decided_sub.as_deref()),
        Value::Int(p.decided_at),
        Value::Int(p.applied_version),
        opt_text(p.tag.as_deref()),
    ]
}
