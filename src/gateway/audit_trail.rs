//! The audit trail's hash chain, walked for operators (`GET /operator/v1/audit/verify`) and for
//! `paygate audit verify`: one walk (`audit_chain::verify`) over the store, the link key and the
//! mandate keys. Sealing (the job, retention, a graceful stop) goes through [`Gateway::audit_sealer`].

use std::path::Path;

use super::approvals_api::OpError;
use super::{Gateway, Operator};
use crate::audit_chain::{Sealer, VerifyError, VerifyOptions};
use crate::catalogue::scopes;
use crate::domain::audit_chain::{ChainHead, Verdict};

/// Witness checks at a graceful stop, at most (each may record breaks that one more seal covers).
const STOP_WITNESS_PASSES_MAX: u32 = 3;

impl Gateway {
    /// What sealing needs: the link key, the mandate keys that sign checkpoints, and the webhook
    /// endpoints that hear of each checkpoint (`audit.checkpoint`).
    pub fn audit_sealer(&self) -> Sealer<'_> {
        Sealer {
            links: &self.audit_link_key,
            signer: &*self.mandates,
            notice: self.notice(crate::domain::webhook::AUDIT_CHECKPOINT),
            keep_every_secs: self.limits.audit_checkpoint_every_secs,
            genesis_within_secs: self.limits.audit_stale_after_secs,
        }
    }

    /// A graceful stop: seal what has committed and sign the head, so nothing is left unsealed
    /// (editable) while the gateway is down. On PostgreSQL a record waits for every older
    /// transaction on the cluster; while a record made before the stop began is unsealed, this
    /// tries again, until `audit.shutdown_seal_ms` has passed (records other replicas make
    /// meanwhile are their sealing job's).
    pub async fn seal_audit_at_stop(&self) {
        let deadline = tokio::time::Instant::now() + self.limits.audit_shutdown_seal;
        let began = self.clock.now();
        // Witness passes at the stop: records it finds gone are recorded (and sealed by one more
        // pass); a database that deletes those too is not chased for ever.
        let mut witness_passes = 0;
        loop {
            let run = crate::audit_chain::seal(
                &*self.store,
                &self.audit_sealer(),
                self.clock.now(),
                self.limits.audit_seal_batch_max,
            )
            .await;
            let left = match (&run, self.store.audit_unsealed().await) {
                (Ok(_), Ok(u)) => u.oldest.filter(|(_, at)| *at < began).map_or(0, |_| u.count),
                (Err(error), _) => {
                    tracing::warn!(%error, "audit sealing at stop failed; the records stay unsealed until the next start");
                    return;
                }
                (_, Err(error)) => {
                    tracing::warn!(%error, "audit sealing at stop: the unsealed records could not be counted");
                    return;
                }
            };
            // The head went back (links deleted): recorded, and sealed by one more pass.
            if let Ok(r) = &run
                && (self.audit_witness_head(r.found.chain_seq).await | self.audit_witness_head(r.head.chain_seq).await)
                && tokio::time::Instant::now() < deadline
            {
                continue;
            }
            // Everything this replica wrote before the stop is sealed now: a record gone or changed
            // meanwhile is a break, recorded (and sealed by one more pass, while time is left).
            if left == 0 && witness_passes < STOP_WITNESS_PASSES_MAX {
                witness_passes += 1;
                if self.audit_witness_check(began).await > 0 && tokio::time::Instant::now() < deadline {
                    continue;
                }
            }
            if left == 0 {
                let head = run.map(|r| r.head.chain_seq).unwrap_or_default();
                tracing::info!(audit.chain_seq = head, "audit trail sealed and signed at stop");
                return;
            }
            if tokio::time::Instant::now() >= deadline {
                tracing::warn!(
                    audit.unsealed = left,
                    "audit records left unsealed at stop (older transactions still open)"
                );
                return;
            }
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// Walk the whole chain (the archive files in `archive_dir` first, when given): the verdict
    /// names the first break.
    pub async fn verify_audit(&self, archive_dir: Option<&Path>) -> Result<Verdict, VerifyError> {
        self.verify_audit_with(archive_dir, &[], None).await
    }

    /// The walk, also trusting checkpoints signed by `retired` keys (exported before the mandate
    /// secret or key id changed), and holding the chain to a head kept outside the database.
    pub async fn verify_audit_with(
        &self,
        archive_dir: Option<&Path>,
        retired: &[crate::mandate::JwksVerifier],
        expect: Option<ChainHead>,
    ) -> Result<Verdict, VerifyError> {
        let keys = crate::mandate::TrustedCheckpointKeys { current: &self.mandates, retired };
        let opts =
            VerifyOptions { now: self.clock.now(), stale_after_secs: self.limits.audit_stale_after_secs, expect };
        crate::audit_chain::verify(&*self.store, &keys, &self.audit_link_key, archive_dir, &opts).await
    }

    /// A head a witness kept: `POSITION:HASH`, or its checkpoint as JSON (the `audit.checkpoint`
    /// event, or a stored checkpoint), the signature checked under the mandate keys and `retired`.
    pub fn expected_audit_head(
        &self,
        spec: &str,
        retired: &[crate::mandate::JwksVerifier],
    ) -> Result<ChainHead, String> {
        if let Some(head) = ChainHead::parse(spec) {
            return Ok(head);
        }
        if !spec.trim_start().starts_with('{') {
            return Err("neither POSITION:HASH nor a file holding a signed checkpoint".into());
        }
        let keys = crate::mandate::TrustedCheckpointKeys { current: &self.mandates, retired };
        crate::audit_chain::expected_from_json(spec, &keys).map_err(|e| format!("the checkpoint: {e}"))
    }

    /// Every mandate public key since `since` (`paygate mandate export-keys`).
    pub fn mandate_keys_since(&self, since: crate::clock::UnixSecs) -> Result<serde_json::Value, String> {
        self.mandates.jwks_since(since, self.clock.now())
    }

    /// The walk over the database (archives are files on some replica's disk: the CLI's part),
    /// held to `expect` when given (`?expect=POSITION:HASH`).
    pub async fn ops_verify_audit(&self, op: &Operator, expect: Option<ChainHead>) -> Result<Verdict, OpError> {
        self.require_op(op, &[scopes::AUDIT])?;
        self.verify_audit_with(None, &[], expect).await.map_err(|error| {
            tracing::error!(%error, "audit verification failed to run");
            OpError::internal()
        })
    }
}
