//! The shared nouns of paygate: payments, rail records, approvals, audit and idempotency records,
//! the pure rules over them (`rules`) and the policy decision (`policy`). Store engines, backends
//! and the gateway all speak these types.
//!
//! Architecture Invariant: `domain` imports nothing above it (no `store`, `backend`, `gateway`,
//! `http` or `mcp`), and does no I/O. Storage engines load rows, call a rule, and write its plan.

pub mod approval;
pub mod audit;
pub mod audit_chain;
pub mod error;
pub mod idempotency;
pub mod ids;
pub mod money;
pub mod ops;
pub mod payee;
pub mod payment;
pub mod policy;
pub mod policy_authority;
pub mod policy_doc;
pub mod policy_replay;
pub mod principal;
pub mod rail;
pub mod rules;
pub mod text;
pub mod trail_money;
pub mod webhook;
