//! What an engine answers by itself, whatever the entity: readiness, and running a statement that
//! `store::queries` built (for `ReadStore`).

use async_trait::async_trait;

use crate::domain::error::StoreError;
use crate::store::{queries, rows};

/// How transfers were grouped into transactions since the engine started.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct GroupCommit {
    /// Transfers handed to a lane.
    pub transfers: u64,
    /// Transactions that committed two or more of them, and how many they held.
    pub grouped_batches: u64,
    pub grouped_transfers: u64,
    /// Batches that rolled back, their transfers run again one by one.
    pub fallbacks: u64,
}

#[async_trait]
pub trait Engine: Send + Sync {
    /// Readiness: the database answers.
    async fn ping(&self) -> Result<(), StoreError>;

    /// Whether a posting transaction's claim answers a retry as cheaply as a read before it would:
    /// then a call policy allows skips the pre-policy peek (`gateway::unit_of_work`). SQLite: yes
    /// (its one writer answers the claim inside a batch it commits anyway, while a reader's first
    /// read after each commit pays for the commit's remapping). PostgreSQL: no (a claim is a
    /// transaction taking row locks: several round trips against the peek's one).
    fn claim_is_cheap(&self) -> bool {
        false
    }

    /// Group commit's counters, for /metrics, where the engine groups transfers itself
    /// (PostgreSQL's lanes, `store/postgres/batch.rs`); `None` elsewhere.
    fn group_commit(&self) -> Option<GroupCommit> {
        None
    }

    #[doc(hidden)]
    fn dialect(&self) -> queries::Dialect;
    #[doc(hidden)]
    async fn select_rows(&self, st: queries::Statement) -> Result<Vec<rows::PlainRow>, StoreError>;
}
