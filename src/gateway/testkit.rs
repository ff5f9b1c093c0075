//! For the operations' unit tests: a gateway over an in-memory SQLite store and ledger whose unit
//! of work is a fake that records the intent it is handed and answers with a payment made from it,
//! moving nothing. An operation's own work (admission, intent, mandate, policy) is then what a test
//! sees.
#![cfg(test)]
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;

use super::unit_of_work::{Executed, Strategy, UnitOfWork, Work};
use super::{Caller, Gateway, GatewayLimits};
use crate::auth::AgentPrincipal;
use crate::backend::ledger::LedgerBackend;
use crate::clock::ManualClock;
use crate::domain::ids::{AccountId, PaymentId};
use crate::domain::money::Currency;
use crate::domain::payment::{AccountSeed, Payment, PaymentKind, PaymentStatus};
use crate::domain::policy::{Decision as Policy, Profile};
use crate::error::AgentError;
use crate::idempotency::KeyDeriver;
use crate::mandate::MandateKeys;
use crate::secret::Secret;
use crate::store::sqlite::SqliteStore;

pub const NOW: i64 = 1_800_000_000;

/// What the fake unit of work was handed.
#[derive(Debug, Clone)]
pub struct Handed {
    pub tool: &'static str,
    pub strategy: Strategy,
    pub key: String,
    pub fingerprint: String,
    /// The operation's own key when the call's is anchored on a closed mandate.
    pub alias_key: Option<String>,
    pub amount_minor: i64,
    pub currency: String,
    pub shown: serde_json::Value,
    /// "allow", "deny:<CODE>" or "approval".
    pub decision: String,
}

/// The fake: records, and answers a succeeded payment from payer to payee of the intent.
#[derive(Clone, Default)]
pub struct Recording(pub Arc<Mutex<Vec<Handed>>>);

impl Recording {
    pub fn handed(&self) -> Vec<Handed> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait]
impl UnitOfWork for Recording {
    async fn run(&self, _gw: &Gateway, _caller: &Caller, work: Work<'_>) -> Result<Executed, AgentError> {
        let Work { strategy, intent, decision, .. } = work;
        let decision_label = match &decision {
            Policy::Allow => "allow".to_string(),
            Policy::Deny(e) => format!("deny:{}", AgentError::from(e.clone()).code.as_str()),
            Policy::RequireApproval { .. } => "approval".to_string(),
        };
        let account = |k: &str| AccountId::parse(intent.shown[k].as_str().unwrap()).unwrap();
        let payment = Payment {
            id: PaymentId::generate(),
            kind: PaymentKind::Payment,
            status: PaymentStatus::Succeeded,
            from_account: account("payer"),
            to_account: account("payee"),
            amount_minor: intent.amount.minor(),
            currency: intent.amount.currency(),
            refunded_minor: 0,
            refund_of: None,
            memo: None,
            principal_sub: "agent".into(),
            principal_user: None,
            created_at: NOW,
        };
        self.0.lock().unwrap().push(Handed {
            tool: intent.tool,
            strategy,
            key: intent.keys.key.clone(),
            fingerprint: intent.keys.fingerprint.clone(),
            alias_key: intent.keys.alias.as_ref().map(|a| a.key.clone()),
            amount_minor: intent.amount.minor(),
            currency: intent.amount.currency().code().to_string(),
            shown: intent.shown,
            decision: decision_label,
        });
        match decision {
            Policy::Allow => Ok(Executed { payment, replayed: false }),
            Policy::Deny(e) => Err(e.into()),
            Policy::RequireApproval { reason } => {
                Err(AgentError::new(crate::error::ErrorCode::ApprovalRequired, reason))
            }
        }
    }
}

pub fn kes() -> Currency {
    Currency::parse("KES").unwrap()
}

/// Accounts acct-A, acct-B (and the M-Pesa account acct-mpesa); 100.00 KES autonomous.
pub fn profile() -> Profile {
    Profile {
        name: "test".into(),
        issuer: None,
        allowed_accounts: ["acct-A", "acct-B", "acct-mpesa"].iter().map(|a| AccountId::parse(a).unwrap()).collect(),
        autonomous_limit_minor: HashMap::from([(kes(), 10_000)]),
        daily_limit_minor: HashMap::from([(kes(), 1_000_000)]),
        daily_refund_limit_minor: HashMap::from([(kes(), 1_000_000)]),
        daily_payments_max: 1000,
        calls_per_minute: 1000,
        tool_calls_per_minute: HashMap::new(),
        user_approval_max_minor: HashMap::new(),
        passkey_required: false,
        payees: Default::default(),
    }
}

pub fn caller(scopes: &[&str]) -> Caller {
    Caller {
        principal: AgentPrincipal {
            issuer: "iss".into(),
            subject: "agent".into(),
            user: None,
            client_id: None,
            scopes: scopes.iter().map(|s| s.to_string()).collect::<BTreeSet<_>>(),
            profile: Arc::new(profile()),
            policy: Arc::new(crate::domain::policy_doc::LivePolicy::none()),
        },
        correlation_id: "corr_test".into(),
        preflight: None,
        intent: None,
    }
}

fn limits() -> GatewayLimits {
    GatewayLimits {
        public_url: "http://gw.test".into(),
        approval_page_base: None,
        elicitation_wait: Duration::from_millis(10),
        elicitation_rounds_max: 3,
        idempotency_retention_secs: 86_400,
        idempotency_lease_secs: 30,
        idempotency_wait: Duration::from_millis(10),
        approval_ttl_secs: 3600,
        pending_approvals_per_agent_max: 10,
        rejected_cooldown_secs: 86_400,
        reviewers_required: 1,
        high_risk_reviewers: 2,
        high_risk_amount_minor: HashMap::new(),
        passkey_rp: Ok(("localhost".into(), "http://localhost".into())),
        passkey_required_amount_minor: HashMap::new(),
        passkeys_per_person_max: 10,
        passkey_enrolment_code_ttl_secs: 86_400,
        passkey_challenges_per_person_max: 5,
        mandate_ttl_secs: 600,
        open_mandate_valid_max_secs: 86_400,
        stop_denials_max: 100,
        stop_window_secs: 600,
        rate_limited_per_denial: 0,
        stop_repeat_max: 0,
        refusal_audit_interval_secs: 60,
        audit_seal_batch_max: 500,
        audit_checkpoint_every_secs: 300,
        audit_stale_after_secs: 31,
        audit_shutdown_seal: Duration::from_millis(100),
        list_limit_max: 100,
        list_limit_default: 20,
        reconcile_window_secs: 86_400,
        collection_pending_timeout_secs: 600,
        resolution_after_secs: 3600,
        webhook_routes: vec![],
        policy: super::PolicySettings {
            simulate_window_max_secs: 2_592_000,
            simulate_records_max: 1000,
            adopt_untagged_versions: false,
            ..Default::default()
        },
        shared_quotas: false,
    }
}

/// A gateway over a fresh in-memory ledger holding acct-A and acct-B (1,000.00 KES each), its
/// unit of work the real one; [`with_fake`] swaps in the recording fake.
pub async fn gateway() -> Gateway {
    let store = Arc::new(SqliteStore::open_in_memory().unwrap());
    let clock = Arc::new(ManualClock::new(NOW));
    for id in ["acct-A", "acct-B"] {
        let seed = AccountSeed {
            id: AccountId::parse(id).unwrap(),
            currency: kes(),
            opening_minor: 100_000,
            allow_overdraft: false,
        };
        crate::store::LedgerStore::ledger_open_account(store.as_ref(), seed, NOW).await.unwrap();
    }
    let backend = Arc::new(LedgerBackend::new(store.clone(), clock.clone()));
    let keys = KeyDeriver::new(Secret::new("k".repeat(32)));
    let mandates =
        Arc::new(MandateKeys::new(crate::mandate::KeySchedule::new("kid-1"), &Secret::new("m".repeat(32))).unwrap());
    Gateway::new(store, backend, clock, keys, mandates, limits())
}

/// Swap the gateway's unit of work for a recording fake.
pub fn with_fake(mut gw: Gateway) -> (Gateway, Recording) {
    let fake = Recording::default();
    gw.work = Box::new(fake.clone());
    (gw, fake)
}

/// The M-Pesa rail over a Daraja that is never called (the fake moves nothing).
pub fn mpesa(gw: Gateway, payouts: bool) -> Gateway {
    let mut config = crate::config::Config::load(None, std::iter::empty::<(String, String)>()).unwrap();
    let m = &mut config.mpesa;
    m.base_url = "http://127.0.0.1:9".into();
    m.short_code = "174379".into();
    m.consumer_key = Secret::new("test-consumer-key".into());
    m.consumer_secret = Secret::new("test-consumer-secret".into());
    m.passkey = Secret::new("test-passkey".into());
    m.callback_secret = Secret::new("test-callback-secret".into());
    m.account = AccountId::parse("acct-mpesa").unwrap();
    if payouts {
        m.initiator_name = "initiator".into();
        m.security_credential = Secret::new("test-credential".into());
    }
    let account = m.account.clone();
    let client = crate::backend::mpesa::daraja::DarajaClient::new(
        crate::app::daraja_config(&config, "http://gw.test"),
        gw.clock.clone(),
    )
    .unwrap();
    let rail = crate::backend::mpesa::MpesaRail::new(client, gw.store.clone(), gw.clock.clone(), account);
    gw.with_collection_rail(Arc::new(rail))
}
