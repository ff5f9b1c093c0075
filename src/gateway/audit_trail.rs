//! The audit trail's hash chain, walked for operators (`GET /operator/v1/audit/verify`) and for
//! `paygate audit verify`: one walk (`audit_chain::verify`) over the store and the mandate keys.

use std::path::Path;

use super::approvals_api::OpError;
use super::{Gateway, Operator};
use crate::audit_chain::VerifyError;
use crate::catalogue::scopes;
use crate::domain::audit_chain::Verdict;

impl Gateway {
    /// Walk the whole chain (the archive files in `archive_dir` first, when given): the verdict
    /// names the first break.
    pub async fn verify_audit(&self, archive_dir: Option<&Path>) -> Result<Verdict, VerifyError> {
        self.verify_audit_with(archive_dir, &[]).await
    }

    /// The walk, also trusting checkpoints signed by `retired` keys (exported before the mandate
    /// secret or key id changed).
    pub async fn verify_audit_with(
        &self,
        archive_dir: Option<&Path>,
        retired: &[crate::mandate::JwksVerifier],
    ) -> Result<Verdict, VerifyError> {
        let keys = crate::mandate::TrustedCheckpointKeys { current: &self.mandates, retired };
        crate::audit_chain::verify(&*self.store, &keys, archive_dir).await
    }

    /// Every mandate public key since `since` (`paygate mandate export-keys`).
    pub fn mandate_keys_since(&self, since: crate::clock::UnixSecs) -> Result<serde_json::Value, String> {
        self.mandates.jwks_since(since, self.clock.now())
    }

    /// The walk over the database (archives are files on some replica's disk: the CLI's part).
    pub async fn ops_verify_audit(&self, op: &Operator) -> Result<Verdict, OpError> {
        self.require_op(op, &[scopes::AUDIT])?;
        self.verify_audit(None).await.map_err(|error| {
            tracing::error!(%error, "audit verification failed to run");
            OpError::internal()
        })
    }
}
