//! What operators look at: every payment the gateway knows (the reference ledger's and the rails'
//! records) with its audit trail, issued mandates, agents and the day's volume. Read-only nouns;
//! `store::queries` turns the queries into SQL once for both engines.

use crate::clock::UnixSecs;
use crate::domain::ids::AccountId;
use crate::domain::payment::{Payment, PaymentKind, PaymentStatus};

/// Where a payment lives: `ledger` (the embedded reference ledger) or the rail that carried it.
pub const LEDGER_RAIL: &str = "ledger";

/// Payments newest first, filtered; `before` is the last row of the previous page.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct OpsPaymentQuery {
    pub account: Option<AccountId>,
    pub status: Option<PaymentStatus>,
    pub kind: Option<PaymentKind>,
    pub rail: Option<String>,
    pub agent: Option<String>,
    /// The user the agent acted for.
    pub user: Option<String>,
    /// `created_at` in `[from, to)`.
    pub from: Option<UnixSecs>,
    pub to: Option<UnixSecs>,
    /// (created_at, id) of the last row already seen.
    pub before: Option<(UnixSecs, String)>,
    pub limit: u32,
}

/// One payment as operators see it.
#[derive(Debug, Clone, PartialEq)]
pub struct OpsPayment {
    pub rail: String,
    pub payment: Payment,
    /// A rail record's own state (`submitting`, `unknown`, …); `None` on the reference ledger.
    pub rail_state: Option<String>,
    pub idempotency_key: String,
    pub mandate_id: Option<String>,
    pub rail_ref: Option<String>,
    pub receipt: Option<String>,
}

/// Audit records newest first, filtered; `before_seq` is the last seq already seen.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditQuery {
    pub agent: Option<String>,
    /// The user the agent acted for.
    pub user: Option<String>,
    pub tool: Option<String>,
    pub decision: Option<String>,
    pub code: Option<String>,
    pub payment_id: Option<String>,
    pub approval_id: Option<String>,
    pub correlation_id: Option<String>,
    pub idempotency_key: Option<String>,
    pub from: Option<UnixSecs>,
    pub to: Option<UnixSecs>,
    pub before_seq: Option<i64>,
    pub limit: u32,
}

/// Everything audited about one payment: records naming it, its idempotency keys (the request
/// before the payment existed) or its approvals.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct AuditRelated {
    pub payment_id: String,
    pub keys: Vec<String>,
    pub approval_ids: Vec<String>,
    pub limit: u32,
}

/// A mandate's state, as of a moment.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MandateStatus {
    Active,
    Revoked,
    UsedUp,
    Expired,
}

impl MandateStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            MandateStatus::Active => "active",
            MandateStatus::Revoked => "revoked",
            MandateStatus::UsedUp => "used_up",
            MandateStatus::Expired => "expired",
        }
    }
    pub fn parse(s: &str) -> Option<MandateStatus> {
        [MandateStatus::Active, MandateStatus::Revoked, MandateStatus::UsedUp, MandateStatus::Expired]
            .into_iter()
            .find(|m| m.as_str() == s)
    }
}

/// Approvals newest first; `before` is the cursor (sequence) of the previous page. `status` is as
/// of `now`: a pending approval past its expiry lists as expired.
#[derive(Debug, Clone, PartialEq)]
pub struct ApprovalQuery {
    pub status: Option<String>,
    pub now: UnixSecs,
    pub before: Option<i64>,
    pub limit: u32,
}

/// Issued mandates newest first; `before` is (created_at, id) of the last row already seen.
#[derive(Debug, Clone, PartialEq)]
pub struct MandateQuery {
    pub status: Option<MandateStatus>,
    pub now: UnixSecs,
    pub before: Option<(UnixSecs, String)>,
    pub limit: u32,
}

/// An issued mandate and what has been drawn on it.
#[derive(Debug, Clone, PartialEq)]
pub struct MandateListing {
    pub id: String,
    pub kind: String,
    pub approval_id: String,
    pub subject: String,
    /// The user the agent acts for under it, if any.
    pub user: Option<String>,
    pub currency: String,
    pub budget_minor: Option<i64>,
    pub max_uses: i64,
    pub spent_minor: i64,
    pub uses: i64,
    pub expires_at: UnixSecs,
    pub created_at: UnixSecs,
    pub revoked_at: Option<UnixSecs>,
    pub revoked_by: Option<String>,
    pub status: MandateStatus,
}

/// An agent's stop-rule state (`principal_state`): one row per what a suspension covered.
#[derive(Debug, Clone, PartialEq)]
pub struct PrincipalState {
    /// '' for a row from before issuers were recorded (it applies under any issuer).
    pub issuer: String,
    pub subject: String,
    pub scope: crate::domain::principal::SuspensionScope,
    pub suspended_at: Option<UnixSecs>,
    pub suspended_reason: Option<String>,
    pub resumed_at: Option<UnixSecs>,
}

/// Payments by hour of a window (hour 0 starts at the window's start), kind, status and currency.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRow {
    pub hour: i64,
    pub kind: String,
    pub status: String,
    pub currency: String,
    pub count: i64,
    pub amount_minor: i64,
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The names operators filter mandates by: each reads back, nothing else parses.
    #[test]
    fn mandate_statuses_read_back_as_written() {
        use MandateStatus::*;
        assert_eq!(
            [Active, Revoked, UsedUp, Expired].map(MandateStatus::as_str),
            ["active", "revoked", "used_up", "expired"]
        );
        for s in [Active, Revoked, UsedUp, Expired] {
            assert_eq!(MandateStatus::parse(s.as_str()), Some(s));
        }
        for junk in ["", "Active", "used-up", "usedup", "xyzzy"] {
            assert_eq!(MandateStatus::parse(junk), None, "{junk:?}");
        }
    }
}
