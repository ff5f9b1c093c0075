//! What an engine answers by itself, whatever the entity: readiness, and running a statement that
//! `store::queries` built (for `ReadStore`).

use async_trait::async_trait;

use crate::domain::error::StoreError;
use crate::store::{queries, rows};

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

    #[doc(hidden)]
    fn dialect(&self) -> queries::Dialect;
    #[doc(hidden)]
    async fn select_rows(&self, st: queries::Statement) -> Result<Vec<rows::PlainRow>, StoreError>;
}
