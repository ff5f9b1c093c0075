//! Stop rules: what counts toward a principal's, and the suspensions they (or an operator) impose.

use async_trait::async_trait;

use crate::clock::UnixSecs;
use crate::domain::error::StoreError;
use crate::domain::principal::{PrincipalRef, Suspension};
use crate::domain::webhook::OutboxMessage;

/// What counts toward a principal's stop rule (`store::DENIAL_CODES` and throttled RATE_LIMITED
/// records, counted by the refusals each stands for).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Denials {
    /// Audited policy denials.
    pub denials: i64,
    /// RATE_LIMITED answers (a throttled record counts its repeats).
    pub rate_limited: i64,
}

#[async_trait]
pub trait SuspensionStore: Send + Sync {
    /// `Some((suspended_at, reason))` while `who` is suspended: the agent as a whole, or this very
    /// (agent, user) pair. A row from before issuers were recorded applies under any issuer.
    async fn suspension(&self, who: &PrincipalRef) -> Result<Option<(UnixSecs, String)>, StoreError>;
    /// Suspend (issuer, subject) for what `s.scope` covers; whether it was not suspended already.
    /// `notify` (`principal.suspended`) is written with the suspension, only when it took effect.
    async fn suspend(&self, s: Suspension, now: UnixSecs, notify: Vec<OutboxMessage>) -> Result<bool, StoreError>;
    /// Lift the agent's suspensions: every one (`user` = `None`), or only that of the agent acting
    /// for `user`. Returns whether any was lifted.
    async fn resume(&self, issuer: &str, subject: &str, user: Option<&str>, now: UnixSecs) -> Result<bool, StoreError>;
    /// What counts toward `who`'s stop rule, audited since `since` and since its last resume.
    async fn denials_since(&self, who: &PrincipalRef, since: UnixSecs) -> Result<Denials, StoreError>;
}
