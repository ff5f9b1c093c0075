//! What an engine answers by itself, whatever the entity: readiness, and running a statement that
//! `store::queries` built (for `ReadStore`).

use async_trait::async_trait;

use crate::domain::error::StoreError;
use crate::store::{queries, rows};

#[async_trait]
pub trait Engine: Send + Sync {
    /// Readiness: the database answers.
    async fn ping(&self) -> Result<(), StoreError>;

    #[doc(hidden)]
    fn dialect(&self) -> queries::Dialect;
    #[doc(hidden)]
    async fn select_rows(&self, st: queries::Statement) -> Result<Vec<rows::PlainRow>, StoreError>;
}
