//! The mandate an approval turns into: signed inside the review transaction once enough reviewers
//! approved, pinning what they saw (a closed mandate's whole intent, an open one's bounds) and the
//! hash of every passkey assertion that approved it.

use std::sync::Arc;

use serde_json::Value;

use super::Gateway;
use crate::clock::UnixSecs;
use crate::domain::approval::{ApprovalRecord, IssuedMandate, MandateIssuer, ReviewDecision};
use crate::mandate::{MANDATE_ISSUER, MandateClaims, MandateKeys, MandateKind};

impl Gateway {
    /// Signs the mandate inside the review transaction once enough reviewers approved.
    pub(super) fn mandate_issuer(&self, now: UnixSecs) -> MandateIssuer {
        let keys: Arc<MandateKeys> = self.mandates.clone();
        let ttl = self.limits.mandate_ttl_secs;
        let open_max = self.limits.open_mandate_valid_max_secs;
        Box::new(move |rec: &ApprovalRecord, approvers: &[String]| {
            let s = |k: &str| rec.intent.get(k).and_then(Value::as_str).map(str::to_string);
            let i = |k: &str| rec.intent.get(k).and_then(Value::as_i64);
            let mut claims = MandateClaims {
                jti: format!("mdt_{}", uuid::Uuid::now_v7().simple()),
                iss: MANDATE_ISSUER.into(),
                sub: rec.principal_sub.clone(),
                agent_iss: rec.principal_iss.clone(),
                user: rec.principal_user.clone(),
                kind: rec.kind,
                iat: now,
                exp: now + ttl,
                approval_id: rec.id.to_string(),
                approvers: approvers.to_vec(),
                currency: rec.currency.to_string(),
                tool: None,
                payer: s("payer"),
                payee: None,
                amount_minor: None,
                payment_id: None,
                intent_sha256: None,
                payees: None,
                per_payment_max_minor: None,
                budget_minor: None,
                max_uses: None,
                passkeys: None,
            };
            // Every passkey assertion that approved it (this review included), by its hash.
            let signed: Vec<String> = rec
                .reviews
                .iter()
                .filter(|r| r.decision == ReviewDecision::Approve)
                .filter_map(|r| r.passkey.as_deref().map(crate::domain::approval::passkey_evidence_digest))
                .collect();
            claims.passkeys = (!signed.is_empty()).then_some(signed);
            let (budget_minor, max_uses) = match rec.kind {
                MandateKind::Closed => {
                    claims.tool = Some(rec.tool.clone());
                    claims.payee = s("payee");
                    claims.amount_minor = Some(rec.amount_minor);
                    claims.payment_id = s("payment_id");
                    // An agent's request carries its operation: the mandate pins the whole intent the
                    // reviewers saw (an operator's pre-authorization names no operation).
                    if rec.intent.get("operation_id").is_some() {
                        claims.intent_sha256 = Some(crate::mandate::intent_digest(&rec.intent));
                    }
                    (None, 1)
                }
                MandateKind::Open => {
                    claims.payees = rec
                        .intent
                        .get("payees")
                        .and_then(Value::as_array)
                        .map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_string)).collect());
                    claims.per_payment_max_minor = i("per_payment_max_minor");
                    claims.budget_minor = i("budget_minor");
                    claims.max_uses = i("max_uses");
                    claims.exp = i("valid_until").unwrap_or(now + open_max).min(now + open_max);
                    (claims.budget_minor, claims.max_uses.unwrap_or(1))
                }
            };
            let jws = keys.sign(&claims)?;
            Ok(IssuedMandate { id: claims.jti.clone(), jws, budget_minor, max_uses, expires_at: claims.exp })
        })
    }
}
