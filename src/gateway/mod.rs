//! The operations. Each public method is one agent-visible action: parse → policy → idempotency →
//! backend → bookkeeping → audit. No MCP or HTTP types here; `mcp` shapes the results.

mod admission;
mod approval_request;
mod approvals;
mod audit_trail;
pub mod audit_witness;
mod authority_trail;
mod broken_builds;
#[cfg(feature = "broken-gateways-for-evals")]
pub use broken_builds::broken_for_evals;
#[cfg(feature = "weaken-idempotency-for-evals")]
pub(crate) use broken_builds::idempotency_weakened;
mod collection;
mod create_payment;
mod exactly_once;
mod keys;
mod mandate_issuer;
mod operator;
mod operator_views;
mod passkeys;
mod payees;
mod payout;
mod policy;
mod policy_tags;
mod preflight;
pub mod principal_admin;
mod refund;
mod reversal;
mod reviews;
mod routing;
mod stop_rule;
mod unit_of_work;
mod waiters;
mod windows;

/// Operator-facing approval types for the HTTP layer.
pub mod approvals_api {
    pub use super::approvals::OpError;
}
mod no_progress;
mod notifications;
mod rail_events;
mod rails;
mod reads;
mod reconcile;
mod refusals;
mod resolution;
mod testkit;

pub use crate::domain::approval::ReviewDecision;
pub use admission::MEMO_CHARS_MAX;
pub use approvals::{ApprovalView, Operator, REQUEST_STATE_TTL_SECS, Resume};
pub use collection::RequestCollection;
pub use create_payment::CreatePayment;
pub use notifications::{AttemptView, WEBHOOKS_LISTED_MAX, WebhookView};
pub use operator::{AuditFilters, PaymentFilters, decode_key_cursor, encode_key_cursor};
pub use operator_views::{
    AuditView, HealthView, MandateView, OpsPaymentView, PaymentDetail, PrincipalView, ReconciliationRun, SummaryView,
};
pub use passkeys::{EnrolmentCodeIssued, EnrolmentCodeRequest, PasskeyAssertion, PasskeyPayloads, PasskeyRegistration};
pub use passkeys::{PasskeyView, enrolment_challenge};
pub use payees::{PAYEES_LISTED_MAX, PayeeArgs, PayeeView};
pub use payout::{PayBusiness, SendPayout};
pub use policy::{
    CONFIG_FILE_AUTHOR, ChangeOutcome, PolicySettings, PolicyVersionView, ProposalView, ProposeArgs, SimulationView,
};
pub use preflight::{Headroom, PreflightView};
pub use rail_events::CallbackOutcome;
pub use rails::{PaymentSummary, Receipt};
pub use reads::{PageAsk, PaymentPage, WindowAsk};
pub use reconcile::{Finding, ReconcileReport};
pub use refund::RefundPayment;
pub use resolution::{RESOLVE_TOOL, ResolutionView, ResolveArgs};
pub use reviews::PreauthorizeArgs;
pub use routing::{PhoneRoutes, Routed};
pub use unit_of_work::Executed;
pub use windows::parse_instant_arg;

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::auth::AgentPrincipal;
use crate::backend::PaymentBackend;
use crate::backend::rail::CollectionRail;
use crate::clock::Clock;
use crate::domain::audit::AuditRecord;
use crate::error::{AgentError, ErrorCode};
use crate::idempotency::KeyDeriver;
use crate::mandate::MandateKeys;
use crate::rate::AgentLimits;
use crate::store::Store;

/// Where the public keys that verify mandates are served (`mandate::JWKS_PATH`).
pub const MANDATE_JWKS_PATH: &str = crate::mandate::JWKS_PATH;

/// Who is asking and under which correlation id: every operation takes one.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: AgentPrincipal,
    pub correlation_id: String,
    /// Set for a preflight (`check_payment_policy`): the operation runs to its decision and no
    /// further — nothing is written, audited or counted toward a stop rule (`preflight.rs`).
    pub(crate) preflight: Option<Arc<preflight::Preflight>>,
    /// A money call's question to policy, once asked (canonical JSON): its audit records carry it.
    pub(crate) intent: Option<Arc<str>>,
}

impl Caller {
    pub fn new(principal: AgentPrincipal, correlation_id: String) -> Caller {
        Caller { principal, correlation_id, preflight: None, intent: None }
    }
    pub(crate) fn dry(&self) -> bool {
        self.preflight.is_some()
    }
}

/// Everything the operations read from config, already parsed and range-checked.
#[derive(Debug, Clone)]
pub struct GatewayLimits {
    /// Base of `approval_url`s.
    pub public_url: String,
    /// Where a person opens one approval in a browser (URL elicitation sends them there): the
    /// console (`…/console`) when it is on; `None`: the routes.
    pub approval_page_base: Option<String>,
    /// How long a retry of a call whose approval is still pending waits for the decision before
    /// answering `input_required` again, and how many such rounds one state allows.
    pub elicitation_wait: Duration,
    pub elicitation_rounds_max: u32,
    pub idempotency_retention_secs: i64,
    pub idempotency_lease_secs: i64,
    pub idempotency_wait: Duration,
    pub approval_ttl_secs: i64,
    /// Approvals one agent may have waiting for a human at once.
    pub pending_approvals_per_agent_max: i64,
    /// `approvals.rejected_cooldown_secs`.
    pub rejected_cooldown_secs: i64,
    pub reviewers_required: i64,
    pub high_risk_reviewers: i64,
    pub high_risk_amount_minor: HashMap<crate::domain::money::Currency, i64>,
    /// The WebAuthn relying party (RP id, origin) of the console, or why passkeys are unavailable.
    pub passkey_rp: Result<(String, String), String>,
    /// At or above this amount (per currency) an approval is decided with a passkey only.
    pub passkey_required_amount_minor: HashMap<crate::domain::money::Currency, i64>,
    pub passkeys_per_person_max: i64,
    /// How long an enrolment code may be used (`passkeys.enrolment_code_ttl_secs`).
    pub passkey_enrolment_code_ttl_secs: i64,
    /// Unexpired registration challenges per person (`passkeys.registration_challenges_max`).
    pub passkey_challenges_per_person_max: i64,
    pub mandate_ttl_secs: i64,
    pub open_mandate_valid_max_secs: i64,
    pub stop_denials_max: i64,
    pub stop_window_secs: i64,
    /// This many RATE_LIMITED answers count as one denial toward the stop rule (0: none count).
    pub rate_limited_per_denial: i64,
    /// The same refusal for the same intent this many times in a row, under distinct operations,
    /// suspends (`no_progress`; 0: off).
    pub stop_repeat_max: u32,
    /// Pre-body refusals (RATE_LIMITED, PRINCIPAL_SUSPENDED, a missing scope) are audited at most once
    /// per this many seconds per principal, tool and code; the record carries the count.
    pub refusal_audit_interval_secs: i64,
    /// Records sealed per batch (`audit.seal_batch_max`).
    pub audit_seal_batch_max: u32,
    /// Signed checkpoints kept: the newest and at most one per this many seconds before it.
    pub audit_checkpoint_every_secs: i64,
    /// Records older than this must be sealed, and sealed links signed, or `audit verify` fails
    /// (`audit.seal_every_secs + audit.unsealed_slack_secs`).
    pub audit_stale_after_secs: i64,
    /// How long a graceful stop keeps sealing (PostgreSQL: records wait for older transactions).
    pub audit_shutdown_seal: Duration,
    pub list_limit_max: u32,
    pub list_limit_default: u32,
    /// Reconciliation looks this far back by default.
    pub reconcile_window_secs: i64,
    /// A collection pending at its rail longer than this is a reconciliation finding.
    pub collection_pending_timeout_secs: i64,
    /// A payout whose outcome is unknown may be settled by two people this long after it was made
    /// (`approvals.resolution_after_secs`).
    pub resolution_after_secs: i64,
    /// Webhook endpoints (name, the events it hears: empty = all) while webhooks are on.
    pub webhook_routes: Vec<(String, Vec<String>)>,
    /// Policy as data: how documents are judged, and the dry run's bounds.
    pub policy: PolicySettings,
    /// Agents' quotas held across every replica on the store (`limits.quotas`), not per process.
    pub shared_quotas: bool,
}

pub struct Gateway {
    // Where things are kept and where money moves.
    /// Everything the gateway keeps: keys, approvals, audit, rail records (and the embedded ledger).
    store: Arc<dyn Store>,
    /// Where money moves: the embedded ledger or an HTTP ledger, behind one seam.
    backend: Arc<dyn PaymentBackend>,
    /// The rails enabled (M-Pesa, ...), by name. The gateway sees them only through the seam.
    rails: Vec<Arc<dyn CollectionRail>>,
    /// Which rail serves a phone number, for the tools that choose one (`routing`).
    routes: routing::PhoneRoutes,
    /// The exactly-once unit of work the money-moving operations hand their intents to.
    work: Box<dyn unit_of_work::UnitOfWork>,
    /// The only source of "now" (tests inject a manual clock).
    clock: Arc<dyn Clock>,
    // Secrets.
    /// Derives idempotency keys and the request-state sealing key from the configured secret.
    keys: KeyDeriver,
    /// Signs and verifies mandates (the current key and those still accepted).
    /// The audit chain's link key (a subkey of the idempotency secret; never in the store).
    audit_link_key: crate::domain::audit_chain::LinkKey,
    mandates: Arc<MandateKeys>,
    /// Seals the `requestState` of approvals resumed through URL elicitation.
    states: crate::request_state::StateSealer,
    // Bounds and what they count.
    /// Every bound the gateway enforces, from config.
    limits: GatewayLimits,
    rate: AgentLimits,
    metrics: Arc<crate::metrics::Metrics>,
    /// Every account an agent profile may use (what reconciliation asks an external ledger about).
    known_accounts: Vec<crate::domain::ids::AccountId>,
    /// Local waiters on in-flight idempotency keys and approvals' decisions.
    waiters: waiters::Waiters,
    /// Retries held waiting for an approval's decision, per agent (issuer, subject, user).
    decision_waits: Mutex<HashMap<String, usize>>,
    /// Pre-body refusals being throttled (`refusals`).
    refusals: refusals::Throttle,
    /// Refusals of the same intent in a row, per (agent, user) pair (`no_progress`).
    streaks: no_progress::Streaks,
    /// Principals found suspended recently, by [`AgentPrincipal::key`]: a suspended agent's flood is
    /// refused without a store read per call for [`SUSPENDED_SEEN_SECS`].
    suspended_seen: Mutex<HashMap<String, (tokio::time::Instant, String)>>,
    /// The policy version in force on this replica (`policy.rs`): swapped whole, read once per
    /// request.
    policy: std::sync::RwLock<Arc<crate::domain::policy_doc::LivePolicy>>,
    /// One policy load or change at a time on this replica.
    policy_lock: tokio::sync::Mutex<()>,
    /// The audit records this replica appended, until it sees them sealed (`audit_witness`).
    witness: audit_witness::Witness,
}

/// How long a principal found suspended is refused without asking the store again, in seconds (a
/// resume on another replica is seen after at most this long).
pub const SUSPENDED_SEEN_SECS: u64 = 1;
/// Principals remembered as suspended at once (bounded memory; past it the store is asked).
pub(super) const SUSPENDED_SEEN_MAX: usize = 10_000;

/// What one enabled rail offers.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct RailOffer {
    pub rail: &'static str,
    pub display_name: &'static str,
    /// The gateway account its money goes through.
    pub account: String,
    pub collections: bool,
    pub payouts: bool,
    /// Payments to businesses (paybills, tills) through `pay_paybill` and `pay_till`.
    pub business_payments: bool,
    /// A succeeded collection given back in full through `refund_payment`.
    pub reversals: bool,
}

/// A decision worth an audit record.
pub(crate) struct Decision<'a> {
    pub tool: &'a str,
    pub decision: &'a str,
    pub code: Option<ErrorCode>,
    pub idempotency_key: Option<&'a str>,
    pub payment_id: Option<&'a str>,
    pub approval_id: Option<&'a str>,
    pub detail: Option<String>,
}

impl<'a> Decision<'a> {
    pub fn new(tool: &'a str, decision: &'a str) -> Self {
        Decision {
            tool,
            decision,
            code: None,
            idempotency_key: None,
            payment_id: None,
            approval_id: None,
            detail: None,
        }
    }
}

impl Gateway {
    pub fn new(
        store: Arc<dyn Store>,
        backend: Arc<dyn PaymentBackend>,
        clock: Arc<dyn Clock>,
        keys: KeyDeriver,
        mandates: Arc<MandateKeys>,
        limits: GatewayLimits,
    ) -> Self {
        let rate = if limits.shared_quotas {
            AgentLimits::shared(store.clone(), clock.clone())
        } else {
            AgentLimits::new(clock.clone())
        };
        let metrics = Arc::new(crate::metrics::Metrics::default());
        let states = crate::request_state::StateSealer::new(keys.subkey(crate::request_state::KEY_LABEL));
        let audit_link_key =
            crate::domain::audit_chain::LinkKey::new(keys.subkey(crate::domain::audit_chain::LINK_KEY_LABEL));
        Gateway {
            store,
            backend,
            rails: Vec::new(),
            routes: routing::PhoneRoutes::default(),
            work: Box::new(unit_of_work::ExactlyOnce),
            clock,
            keys,
            audit_link_key,
            mandates,
            states,
            limits,
            rate,
            metrics,
            known_accounts: Vec::new(),
            waiters: waiters::Waiters::default(),
            decision_waits: Mutex::new(HashMap::new()),
            refusals: refusals::Throttle::default(),
            streaks: no_progress::Streaks::default(),
            suspended_seen: Mutex::new(HashMap::new()),
            policy: std::sync::RwLock::new(Arc::new(crate::domain::policy_doc::LivePolicy::none())),
            policy_lock: tokio::sync::Mutex::new(()),
            witness: audit_witness::Witness::default(),
        }
    }

    /// Which rail serves which phone numbers (`request_payment`, `send_payment`).
    pub fn with_phone_routes(mut self, routes: PhoneRoutes) -> Self {
        self.routes = routes;
        self
    }

    /// Enable a rail: its tools, callbacks and queries. A rail of the same name replaces it.
    pub fn with_collection_rail(mut self, rail: Arc<dyn CollectionRail>) -> Self {
        self.rails.retain(|r| r.name() != rail.name());
        self.rails.push(rail);
        self
    }

    /// The enabled rail of this name.
    pub(crate) fn rail(&self, name: &str) -> Option<&Arc<dyn CollectionRail>> {
        self.rails.iter().find(|r| r.name() == name)
    }

    /// What each enabled rail offers (the capabilities resource).
    pub fn rail_offers(&self) -> Vec<RailOffer> {
        use crate::domain::rail::RailFlow;
        self.rails
            .iter()
            .map(|r| RailOffer {
                rail: r.name(),
                display_name: r.display_name(),
                account: r.account().to_string(),
                collections: r.offers(RailFlow::Collection),
                payouts: r.offers(RailFlow::Payout),
                business_payments: r.offers(RailFlow::Payout) && r.pays_businesses(),
                reversals: r.offers(RailFlow::Reversal),
            })
            .collect()
    }

    /// The accounts reconciliation asks an external ledger about (every profile's allow-list).
    pub fn with_known_accounts(mut self, accounts: Vec<crate::domain::ids::AccountId>) -> Self {
        self.known_accounts = accounts;
        self
    }

    /// The accounts reconciliation asks about: those given at start and every account the policy
    /// version in force allows (an operator may have added one since).
    fn known_accounts(&self) -> Vec<crate::domain::ids::AccountId> {
        let mut all = self.known_accounts.clone();
        all.extend(self.policy().profiles.accounts());
        all.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        all.dedup();
        all
    }

    pub fn metrics(&self) -> &Arc<crate::metrics::Metrics> {
        &self.metrics
    }

    /// Every rail endpoint's circuit breaker: (rail, endpoint, state).
    pub fn rail_circuits(&self) -> Vec<(&'static str, &'static str, &'static str)> {
        self.rails.iter().flat_map(|r| r.circuits().into_iter().map(|(e, s)| (r.name(), e, s))).collect()
    }

    pub fn clock(&self) -> &Arc<dyn Clock> {
        &self.clock
    }

    /// Where and how mandates verify, for the capabilities resource.
    /// (The JWKS path is `MANDATE_JWKS_PATH`.)
    pub fn mandate_key_info(&self) -> serde_json::Value {
        let now = self.clock.now();
        serde_json::json!({
            "jwks_uri": format!("{}{}", self.limits.public_url, crate::mandate::JWKS_PATH),
            "alg": "EdDSA",
            "signing_kid": self.mandates.signing_kid(now),
            "kids": self.mandates.jwks(now)["keys"].as_array().map(|k| k.iter().map(|j| j["kid"].clone()).collect::<Vec<_>>()),
        })
    }

    pub fn mandate_keys(&self) -> &Arc<MandateKeys> {
        &self.mandates
    }

    /// Before any tool, resource read or prompt, in this order: a suspended principal is refused
    /// (before the rate limiter, so a suspended agent's flood neither waits in it nor writes a record
    /// per call); the scope it needs (checked here as well as by the HTTP layer's 403, so no path
    /// into the gateway skips it); then the rate limits (`RATE_LIMITED` with the limiter's own wait).
    /// Each refusal here is throttled in the audit trail (`refusals`).
    ///
    /// An alias is admitted as its canonical tool: one scope, one rate limit, one audit name.
    pub async fn admit(&self, caller: &Caller, tool: &str) -> Result<(), AgentError> {
        use refusals::Counts;
        #[cfg(feature = "broken-gateways-for-evals")]
        if broken_for_evals() == Some("refuse-all") {
            return Err(AgentError::invalid("refused: a deliberately broken build refuses every call"));
        }
        let tool = crate::catalogue::canonical(tool);
        let p = &caller.principal;
        let Some(scope) = crate::catalogue::scope_for_request(tool) else {
            return Err(AgentError::invalid(format!("no tool named {tool}")));
        };
        if p.policy.is_disabled(tool) {
            // Tool governance, live: the policy version this call is judged under disables it.
            let e = AgentError::invalid(format!("{tool} is disabled by policy (version {})", p.policy.version));
            return Err(self.refuse_early(caller, tool, "denied", e, Counts::No).await);
        }
        if let Some(why) = self.suspended(caller).await? {
            // Who suspended it and why, as recorded ("suspended by alice: …", "suspended by the stop
            // rule: …"): the agent, and whoever reads its transcript, can tell a person's decision
            // from the automatic one.
            let e = AgentError::new(
                ErrorCode::PrincipalSuspended,
                format!("this agent is {why}; an operator must resume it before it can call anything"),
            );
            return Err(self.refuse_early(caller, tool, "denied", e, Counts::No).await);
        }
        if let Err(e) = crate::domain::policy::require_scope(&[scope], |s| p.has_scope(s), tool) {
            return Err(self.refuse_early(caller, tool, "denied", e.into(), Counts::Denial).await);
        }
        match self.rate.check(&p.key(), &p.profile, tool).await {
            Ok(Ok(())) => Ok(()),
            Err(error) => {
                // Fail closed: a quota that cannot be read admits nothing.
                tracing::error!(correlation_id = %caller.correlation_id, %error, "shared rate quota unreadable");
                Err(AgentError::internal())
            }
            Ok(Err(wait)) => {
                let secs = crate::rate::retry_after_secs(wait);
                let e = AgentError::new(ErrorCode::RateLimited, format!("too many calls; retry in {secs} s"))
                    .with_retry_after(secs);
                Err(self.refuse_early(caller, tool, "rate_limited", e, Counts::RateLimited).await)
            }
        }
    }

    /// Forget idle rate-limit keys (called periodically).
    pub async fn evict_idle_limits(&self) {
        self.rate.evict_idle().await;
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Who hears about `event` now: the endpoints subscribed to it (none while webhooks are off).
    pub fn notice(&self, event: &'static str) -> crate::domain::webhook::Notice {
        let endpoints = self
            .limits
            .webhook_routes
            .iter()
            .filter(|(_, events)| events.is_empty() || events.iter().any(|e| e == event))
            .map(|(name, _)| name.clone())
            .collect();
        crate::domain::webhook::Notice { event, endpoints, at: self.clock.now() }
    }

    pub fn limits(&self) -> &GatewayLimits {
        &self.limits
    }

    /// Append an audit record of an agent's call (naming the user it acts for, if any). An audit
    /// failure is logged, never silently dropped.
    pub(crate) async fn audit(&self, caller: &Caller, d: Decision<'_>) {
        if caller.dry() {
            return;
        }
        self.metrics.decision(d.tool, d.decision, d.code.map(|c| c.as_str()));
        let rec = self.agent_audit_record(caller, d);
        self.append_audit(rec).await
    }

    /// Append an audit record of an operator's (or the gateway's own) action.
    pub(crate) async fn audit_as(&self, issuer: &str, subject: &str, correlation_id: &str, d: Decision<'_>) {
        self.metrics.decision(d.tool, d.decision, d.code.map(|c| c.as_str()));
        let rec = self.audit_record(issuer, subject, correlation_id, d);
        self.append_audit(rec).await
    }

    /// The record of an agent's decision: the agent and, with delegation, the user it acts for.
    pub(crate) fn agent_audit_record(&self, caller: &Caller, d: Decision<'_>) -> AuditRecord {
        let p = &caller.principal;
        let mut rec = self.audit_record(&p.issuer, &p.subject, &caller.correlation_id, d);
        rec.principal_user = p.user.clone();
        rec.policy_version = (p.policy.version > 0).then_some(p.policy.version);
        rec.intent = caller.intent.as_deref().map(str::to_string);
        rec
    }

    pub(crate) fn audit_record(
        &self,
        issuer: &str,
        subject: &str,
        correlation_id: &str,
        d: Decision<'_>,
    ) -> AuditRecord {
        AuditRecord {
            seq: 0,
            at: self.clock.now(),
            correlation_id: correlation_id.to_string(),
            principal_iss: issuer.to_string(),
            principal_sub: subject.to_string(),
            tool: d.tool.to_string(),
            decision: d.decision.to_string(),
            code: d.code.map(|c| c.as_str().to_string()),
            idempotency_key: d.idempotency_key.map(str::to_string),
            payment_id: d.payment_id.map(str::to_string),
            approval_id: d.approval_id.map(str::to_string),
            detail: d.detail,
            principal_user: None,
            repeats: 1,
            policy_version: None,
            intent: None,
            tag: None,
        }
    }

    /// Parse a page size against the configured bounds.
    fn page_limit(&self, limit: Option<u32>) -> Result<u32, AgentError> {
        match limit {
            None => Ok(self.limits.list_limit_default),
            Some(n) if n >= 1 && n <= self.limits.list_limit_max => Ok(n),
            Some(n) => Err(AgentError::invalid(format!("limit must be 1..={}, got {n}", self.limits.list_limit_max))),
        }
    }
}

/// Cursors are opaque to agents: base64url of a version tag and the last row's sequence number.
pub fn encode_cursor(seq: i64) -> String {
    use base64::Engine;
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(format!("v1:{seq}"))
}

/// The sequence a cursor from [`encode_cursor`] names; a clear refusal for anything else (fuzzed:
/// `fuzz/checks.rs`).
pub fn decode_cursor(cursor: Option<&str>) -> Result<Option<i64>, AgentError> {
    use base64::Engine;
    let Some(c) = cursor else { return Ok(None) };
    let bad = || AgentError::invalid("cursor is not one this server issued; pass next_cursor back unchanged");
    let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD.decode(c).map_err(|_| bad())?;
    let text = String::from_utf8(raw).map_err(|_| bad())?;
    // Only the spelling encode_cursor writes ("v1:01" and "v1:+1" are not cursors: found by fuzzing).
    let seq = text
        .strip_prefix("v1:")
        .and_then(|s| s.parse::<i64>().ok().filter(|n| *n > 0 && n.to_string() == s))
        .ok_or_else(bad)?;
    Ok(Some(seq))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cursors_round_trip_and_reject_forgeries() {
        assert_eq!(decode_cursor(Some(&encode_cursor(42))).unwrap(), Some(42));
        assert_eq!(decode_cursor(None).unwrap(), None);
        // "v1:-1", "xyz", "v1:01", "v1:+1", "v1:1 "
        for bad in ["", "!!", "djE6LTE", "eHl6", "djE6MDE", "djE6KzE", "djE6MSA"] {
            assert!(decode_cursor(Some(bad)).is_err(), "{bad}");
        }
    }
}

/// The id that ties a request's log lines, error envelope and audit records together. Set by the
/// HTTP layer on every request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorrelationId(pub String);

impl CorrelationId {
    pub fn generate() -> Self {
        // Time-ordered like payment ids: the audit index by correlation id appends.
        CorrelationId(format!("corr_{}", uuid::Uuid::now_v7().simple()))
    }
}
