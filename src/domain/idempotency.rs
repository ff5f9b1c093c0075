//! The idempotency record as the store keeps it (key derivation and fingerprints live in
//! `crate::idempotency`).

use crate::clock::UnixSecs;

/// What a reservation found under an idempotency key.
#[derive(Debug, Clone, PartialEq)]
pub enum Reservation {
    /// The key is now ours (fresh, expired, or taken over from a crashed holder whose lease ran out).
    Acquired,
    /// Someone completed it; `outcome` is the stored result.
    Completed { fingerprint: String, outcome: String },
    /// Someone holds it and their lease is live.
    InFlight { fingerprint: String },
}

#[derive(Debug, Clone)]
pub struct NewIdempotencyRecord {
    pub key: String,
    pub fingerprint: String,
    pub tool: String,
    pub principal_iss: String,
    pub principal_sub: String,
    pub lease_until: UnixSecs,
    pub expires_at: UnixSecs,
}
