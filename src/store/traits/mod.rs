//! The store's contract, one trait per entity; `store::Store` joins them. Each engine implements
//! each trait in its file of the same name (`store/sqlite/<entity>.rs`, `store/postgres/<entity>.rs`).

mod approvals;
mod audit;
mod engine;
mod idempotency;
mod leases;
mod ledger;
mod outbox;
mod passkeys;
mod payees;
mod policy;
mod rails;
mod reads;
mod suspensions;

pub use approvals::ApprovalStore;
pub use audit::AuditStore;
pub use engine::{Engine, GroupCommit};
pub use idempotency::IdempotencyStore;
pub use leases::{LeaseStore, QuotaTake};
pub use ledger::LedgerStore;
pub use outbox::{AttemptOutcome, OutboxStore};
pub use passkeys::PasskeyStore;
pub use payees::PayeeStore;
pub use policy::PolicyStore;
pub use rails::RailStore;
pub use reads::ReadStore;
pub use suspensions::{Denials, SuspensionStore};
