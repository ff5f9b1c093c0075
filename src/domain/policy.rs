//! The policy decision: a pure function of (principal's scopes, profile, intent). No I/O, no clock,
//! so every rule is table-tested.

use std::collections::{BTreeSet, HashMap};
use std::sync::Arc;

use crate::catalogue::scopes;
use crate::domain::ids::AccountId;
use crate::domain::money::{Currency, Money, format_minor};
use crate::domain::payee::PayeeRules;
use serde::{Deserialize, Serialize};

/// What an agent may do without a human: its accounts, per-payment autonomous limits, daily
/// budgets and call quotas.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    /// When set, the profile applies only to tokens from this issuer.
    pub issuer: Option<String>,
    pub allowed_accounts: Vec<AccountId>,
    /// Per currency, in minor units. A currency not present: every payment in it needs approval.
    pub autonomous_limit_minor: HashMap<Currency, i64>,
    /// Per currency, in minor units per UTC day.
    pub daily_limit_minor: HashMap<Currency, i64>,
    /// Autonomous refunds per currency, in minor units per UTC day (counted apart from payments).
    pub daily_refund_limit_minor: HashMap<Currency, i64>,
    pub daily_payments_max: i64,
    pub calls_per_minute: u32,
    pub tool_calls_per_minute: HashMap<String, u32>,
    /// `approvals_by = "user"`: per currency, in minor units, the largest payment the user the
    /// agent acts for may approve themselves (through the confirmation page). Empty: operators only.
    pub user_approval_max_minor: HashMap<Currency, i64>,
    /// Every approval of this profile's agents is decided with a passkey only.
    pub passkey_required: bool,
    /// Who this profile's agents may pay: open, known payees, or an allow-list (`domain::payee`).
    pub payees: PayeeRules,
}

impl Profile {
    pub fn allows_account(&self, account: &AccountId) -> bool {
        self.allowed_accounts.contains(account)
    }
    /// Whether the user may approve a payment of `amount` themselves (their user-approval tier).
    pub fn user_may_approve(&self, amount: Money) -> bool {
        self.user_approval_max_minor.get(&amount.currency()).is_some_and(|max| amount.minor() <= *max)
    }
    pub fn limit_decimal(&self, currency: Currency) -> Option<String> {
        self.autonomous_limit_minor.get(&currency).map(|m| format_minor(*m, currency))
    }
}

/// Profiles by agent subject, by the user an agent acts for, by both, and by client id, with a
/// default for everyone else.
#[derive(Debug, Clone)]
pub struct Profiles {
    by_subject: HashMap<String, Vec<Arc<Profile>>>,
    by_user: HashMap<String, Vec<Arc<Profile>>>,
    /// (agent subject, user): profiles naming both match only that pair.
    by_pair: HashMap<(String, String), Vec<Arc<Profile>>>,
    by_client: HashMap<String, Vec<Arc<Profile>>>,
    default: Arc<Profile>,
}

impl Default for Profiles {
    fn default() -> Self {
        Self::new()
    }
}

/// The names profiles match on, gathered from one or more `Profiles` (`Profiles::match_keys`).
#[derive(Debug, Clone, Default)]
pub struct MatchKeys {
    pub issuers: BTreeSet<String>,
    pub subjects: BTreeSet<String>,
    pub users: BTreeSet<String>,
    /// (agent subject, user).
    pub pairs: BTreeSet<(String, String)>,
    pub clients: BTreeSet<String>,
}

/// Who a profile is for: agent subjects, the users agents act for (RFC 8693 delegation), client ids.
#[derive(Debug, Clone, Copy, Default)]
pub struct Matchers<'a> {
    pub subjects: &'a [String],
    pub users: &'a [String],
    pub client_ids: &'a [String],
}

impl Profiles {
    /// No profiles yet; until one is added as the default, unmatched agents get a profile that
    /// allows nothing (fail closed).
    pub fn new() -> Profiles {
        let none = Profile {
            name: "none".into(),
            issuer: None,
            allowed_accounts: vec![],
            autonomous_limit_minor: HashMap::new(),
            daily_limit_minor: HashMap::new(),
            daily_refund_limit_minor: HashMap::new(),
            daily_payments_max: 1,
            calls_per_minute: 1,
            tool_calls_per_minute: HashMap::new(),
            user_approval_max_minor: HashMap::new(),
            passkey_required: false,
            payees: PayeeRules::default(),
        };
        Profiles {
            by_subject: HashMap::new(),
            by_user: HashMap::new(),
            by_pair: HashMap::new(),
            by_client: HashMap::new(),
            default: Arc::new(none),
        }
    }

    /// Add a profile matched by these subjects, users and client ids; `default` makes it the
    /// fallback. A profile naming both subjects and users matches only an agent in `subjects`
    /// acting for a user in `users`.
    pub fn add(&mut self, profile: Profile, m: Matchers<'_>, default: bool) {
        let profile = Arc::new(profile);
        match (m.subjects.is_empty(), m.users.is_empty()) {
            (false, false) => {
                for s in m.subjects {
                    for u in m.users {
                        self.by_pair.entry((s.clone(), u.clone())).or_default().push(profile.clone());
                    }
                }
            }
            (false, true) => {
                for s in m.subjects {
                    self.by_subject.entry(s.clone()).or_default().push(profile.clone());
                }
            }
            (true, false) => {
                for u in m.users {
                    self.by_user.entry(u.clone()).or_default().push(profile.clone());
                }
            }
            (true, true) => {}
        }
        for c in m.client_ids {
            self.by_client.entry(c.clone()).or_default().push(profile.clone());
        }
        if default {
            self.default = profile;
        }
    }

    /// Every account some profile allows, once each.
    pub fn accounts(&self) -> Vec<AccountId> {
        let lists = [&self.by_subject, &self.by_user, &self.by_client].into_iter().flat_map(|m| m.values());
        let pairs = self.by_pair.values();
        let mut all: Vec<AccountId> = lists
            .chain(pairs)
            .flatten()
            .chain(std::iter::once(&self.default))
            .flat_map(|p| p.allowed_accounts.iter().cloned())
            .collect();
        all.sort_by(|a, b| a.as_str().cmp(b.as_str()));
        all.dedup();
        all
    }

    /// Every name some profile here matches on (for comparing two versions' effective authority,
    /// `domain::policy_authority`): issuers profiles are bound to, subjects, users, (subject, user)
    /// pairs (their parts counted as subjects and users too), client ids.
    pub fn match_keys(&self, keys: &mut MatchKeys) {
        let issuers = |list: &Vec<Arc<Profile>>| list.iter().filter_map(|p| p.issuer.clone()).collect::<Vec<_>>();
        for (s, list) in &self.by_subject {
            keys.subjects.insert(s.clone());
            keys.issuers.extend(issuers(list));
        }
        for (u, list) in &self.by_user {
            keys.users.insert(u.clone());
            keys.issuers.extend(issuers(list));
        }
        for ((s, u), list) in &self.by_pair {
            keys.pairs.insert((s.clone(), u.clone()));
            keys.subjects.insert(s.clone());
            keys.users.insert(u.clone());
            keys.issuers.extend(issuers(list));
        }
        for (c, list) in &self.by_client {
            keys.clients.insert(c.clone());
            keys.issuers.extend(issuers(list));
        }
    }

    fn pick(list: Option<&Vec<Arc<Profile>>>, issuer: &str) -> Option<Arc<Profile>> {
        let list = list?;
        list.iter()
            .find(|p| p.issuer.as_deref() == Some(issuer))
            .or_else(|| list.iter().find(|p| p.issuer.is_none()))
            .cloned()
    }

    /// The profile naming exactly this (agent, user) pair, for this issuer's tokens.
    pub fn for_pair(&self, issuer: &str, subject: &str, user: &str) -> Option<Arc<Profile>> {
        Self::pick(self.by_pair.get(&(subject.to_string(), user.to_string())), issuer)
    }
    pub fn for_user(&self, issuer: &str, user: &str) -> Option<Arc<Profile>> {
        Self::pick(self.by_user.get(user), issuer)
    }
    pub fn for_subject(&self, issuer: &str, subject: &str) -> Option<Arc<Profile>> {
        Self::pick(self.by_subject.get(subject), issuer)
    }
    pub fn for_client(&self, issuer: &str, client_id: &str) -> Option<Arc<Profile>> {
        Self::pick(self.by_client.get(client_id), issuer)
    }
    /// Whom no profile names gets this one.
    pub fn default_profile(&self) -> Arc<Profile> {
        self.default.clone()
    }

    /// Most specific first: the (agent, user) pair, the user the agent acts for, the agent's
    /// subject, its client id, then the default. A user's profile bounds every agent acting for
    /// them, whatever profile the agent has of its own (policy per person); name both to bound one
    /// agent for one person. A profile bound to an issuer matches only that issuer's tokens, and wins
    /// over an unbound one.
    pub fn resolve(&self, issuer: &str, subject: &str, user: Option<&str>, client_id: Option<&str>) -> Arc<Profile> {
        user.and_then(|u| self.for_pair(issuer, subject, u))
            .or_else(|| user.and_then(|u| self.for_user(issuer, u)))
            .or_else(|| self.for_subject(issuer, subject))
            .or_else(|| client_id.and_then(|c| self.for_client(issuer, c)))
            .unwrap_or_else(|| self.default.clone())
    }

    /// Every profile that could be this principal's when its client id is not known (a stored
    /// approval keeps no client id): the one profile a pair, user or subject match gives, or else
    /// every client profile its issuer may match and the default. Whoever judges by these takes
    /// the strictest, so not knowing the client never makes anything laxer.
    pub fn candidates(&self, issuer: &str, subject: &str, user: Option<&str>) -> Vec<Arc<Profile>> {
        let named = self.resolve(issuer, subject, user, None);
        if !Arc::ptr_eq(&named, &self.default) {
            return vec![named];
        }
        let mut all: Vec<Arc<Profile>> = self
            .by_client
            .values()
            .flatten()
            .filter(|p| p.issuer.as_deref().is_none_or(|i| i == issuer))
            .cloned()
            .collect();
        all.push(named);
        all
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Allow,
    /// Over the autonomous limit: a human must approve. `reason` is the gateway's own text.
    RequireApproval {
        reason: String,
    },
    Deny(Refusal),
}

/// Why policy refuses a call. The edge (`error.rs`) maps each to the agent's code and envelope.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// The token lacks a scope the tool needs.
    #[error("{tool} needs scope {missing}")]
    MissingScope { tool: String, missing: String, required: Vec<String> },
    /// The agent's profile does not allow this account.
    #[error("this agent may not use account {0}")]
    AccountNotAllowed(AccountId),
    /// The payee is not on this agent's payee allow-list (`payees.mode = "allow_list"`).
    #[error("this agent may not pay {0}: it is not on the agent's payee allow-list")]
    PayeeNotAllowed(String),
    /// The call cannot be judged as asked (a sentence of the gateway's own).
    #[error("{0}")]
    Invalid(&'static str),
}

impl Refusal {
    /// The agent's error code for it (`error.rs` builds the envelope; its test holds the two alike).
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::MissingScope { .. } => "INSUFFICIENT_SCOPE",
            Refusal::AccountNotAllowed(_) | Refusal::PayeeNotAllowed(_) => "ACCOUNT_NOT_ALLOWED",
            Refusal::Invalid(_) => "INVALID_ARGUMENT",
        }
    }
}

pub fn require_scope(scopes: &[&str], have: impl Fn(&str) -> bool, tool: &str) -> Result<(), Refusal> {
    match scopes.iter().find(|s| !have(s)) {
        Some(missing) => Err(Refusal::MissingScope {
            tool: tool.to_string(),
            missing: missing.to_string(),
            required: scopes.iter().map(|s| s.to_string()).collect(),
        }),
        None => Ok(()),
    }
}

fn require_accounts(profile: &Profile, accounts: &[&AccountId]) -> Result<(), Refusal> {
    match accounts.iter().find(|a| !profile.allows_account(a)) {
        Some(a) => Err(Refusal::AccountNotAllowed((*a).clone())),
        None => Ok(()),
    }
}

fn within_limit(profile: &Profile, amount: Money) -> Decision {
    match profile.autonomous_limit_minor.get(&amount.currency()) {
        Some(limit) if amount.minor() <= *limit => Decision::Allow,
        Some(limit) => Decision::RequireApproval {
            reason: format!(
                "{amount} is over this agent's autonomous limit of {} {}",
                amount.currency(),
                format_minor(*limit, amount.currency())
            ),
        },
        None => {
            Decision::RequireApproval { reason: format!("this agent has no autonomous limit in {}", amount.currency()) }
        }
    }
}

/// What policy judges of one money call, as data: the gateway asks it (`judge`), records it with
/// the call's audit record (its intent, canonical JSON), and `policy simulate` asks it again of
/// another policy version (`domain::policy_replay`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Question {
    pub tool: String,
    /// The scope the call needs.
    pub scope: String,
    /// The accounts the profile must allow (the rail's account twice for a rail operation).
    pub accounts: [AccountId; 2],
    /// Who is paid (an account, a phone, the customer a collection is reversed to).
    pub payee: String,
    /// What is judged against the autonomous limit: the amount, or for a refund the payment's
    /// refunds together.
    pub judged_minor: i64,
    pub currency: Currency,
    /// What the call draws on today's budget.
    pub amount_minor: i64,
    /// "payment" or "refund": which daily budget it draws on.
    pub kind: String,
    /// A refund's original payment amount: a payment over the autonomous limit needed a human, and
    /// undoing it needs one too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original_minor: Option<i64>,
    /// It carried a verified mandate (a human approved exactly this call).
    #[serde(default)]
    pub mandated: bool,
    /// The token's client id, which profiles may match on.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub client_id: Option<String>,
    /// A refund's original payment: the refund's row must name it (`domain::trail_money`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub original: Option<String>,
    /// A refund that named its amount gives back exactly it; one that asked for "everything
    /// left" at most the amount judged (`domain::trail_money`).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub exact: bool,
}

impl Question {
    /// Moving `amount` from `from` to `to` (both the agent's accounts).
    pub fn transfer(from: &AccountId, to: &AccountId, amount: Money) -> Question {
        Question::of("create_payment", scopes::CREATE, [from, to], to.as_str(), amount, amount.minor())
    }
    /// Collecting `amount` over a rail into `account` (the rail's collection account).
    pub fn collect(tool: &str, account: &AccountId, payer: &str, amount: Money) -> Question {
        Question::of(tool, scopes::COLLECT, [account, account], payer, amount, amount.minor())
    }
    /// Paying `amount` out over a rail from `account` to a customer's `payee`. The customer's phone
    /// is no account of the agent's: the autonomous limit, the budget and approvals bound it.
    pub fn payout(tool: &str, account: &AccountId, payee: &str, amount: Money) -> Question {
        Question::of(tool, scopes::PAYOUT, [account, account], payee, amount, amount.minor())
    }
    /// Refunding `amount` of `original`: alone only while the refunds of that payment *together*
    /// stay within the autonomous limit (five refunds of 1,000 are one of 5,000), and never for a
    /// payment that itself needed a human.
    pub fn refund(original: &crate::domain::payment::Payment, amount: Money) -> Question {
        let together = original.refunded_minor.saturating_add(amount.minor());
        let accounts = [&original.from_account, &original.to_account];
        let mut q =
            Question::of("refund_payment", scopes::REFUND, accounts, original.from_account.as_str(), amount, together);
        q.kind = PAYMENT_KIND_REFUND.into();
        q.original_minor = Some(original.amount_minor);
        q.original = Some(original.id.to_string());
        q
    }
    /// Reversing `original`, a collection through a rail, in full: as a refund (scope, autonomous
    /// limit on the whole collection), except that the account is the rail's alone.
    pub fn reversal(original: &crate::domain::payment::Payment) -> Question {
        let account = &original.to_account;
        Question {
            tool: "refund_payment".into(),
            scope: scopes::REFUND.into(),
            accounts: [account.clone(), account.clone()],
            payee: original.from_account.as_str().to_string(),
            judged_minor: original.amount_minor,
            currency: original.currency,
            amount_minor: original.amount_minor,
            kind: PAYMENT_KIND_REFUND.into(),
            original_minor: None,
            mandated: false,
            client_id: None,
            original: None,
            exact: false,
        }
    }

    fn of(
        tool: &str,
        scope: &str,
        accounts: [&AccountId; 2],
        payee: &str,
        amount: Money,
        judged_minor: i64,
    ) -> Question {
        Question {
            tool: tool.to_string(),
            scope: scope.to_string(),
            accounts: [accounts[0].clone(), accounts[1].clone()],
            payee: payee.to_string(),
            judged_minor,
            currency: amount.currency(),
            amount_minor: amount.minor(),
            kind: "payment".into(),
            original_minor: None,
            mandated: false,
            client_id: None,
            original: None,
            exact: false,
        }
    }

    /// Its canonical JSON (the audit record's intent).
    pub fn canonical(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

const PAYMENT_KIND_REFUND: &str = "refund";

/// Policy's answer to `q` under `profile`. `force_approval` is tool governance: every call of
/// this tool needs a human. Scope, then accounts, then governance, then the autonomous limit.
pub fn judge(has_scope: impl Fn(&str) -> bool, profile: &Profile, q: &Question, force_approval: bool) -> Decision {
    if let Err(e) = require_scope(&[q.scope.as_str()], &has_scope, &q.tool) {
        return Decision::Deny(e);
    }
    if let Err(e) = require_accounts(profile, &[&q.accounts[0], &q.accounts[1]]) {
        return Decision::Deny(e);
    }
    let over_limit_original = q
        .original_minor
        .is_some_and(|original| profile.autonomous_limit_minor.get(&q.currency).is_some_and(|limit| original > *limit));
    if force_approval || over_limit_original {
        return Decision::RequireApproval { reason: format!("every {} call needs a human approval", q.tool) };
    }
    match Money::from_minor(q.judged_minor, q.currency) {
        Ok(judged) => within_limit(profile, judged),
        Err(_) => Decision::Deny(Refusal::Invalid("the amount is not a valid amount")),
    }
}

/// May this principal move `amount` from `from` to `to` on its own?
pub fn decide_transfer(
    has_scope: impl Fn(&str) -> bool,
    profile: &Profile,
    from: &AccountId,
    to: &AccountId,
    amount: Money,
    force_approval: bool,
) -> Decision {
    judge(has_scope, profile, &Question::transfer(from, to, amount), force_approval)
}

/// May this principal refund `amount` of `original` on its own?
pub fn decide_refund(
    has_scope: impl Fn(&str) -> bool,
    profile: &Profile,
    original: &crate::domain::payment::Payment,
    amount: Money,
    force_approval: bool,
) -> Decision {
    judge(has_scope, profile, &Question::refund(original, amount), force_approval)
}

/// May this principal reverse `original`, a rail collection, in full on its own?
pub fn decide_reversal(
    has_scope: impl Fn(&str) -> bool,
    profile: &Profile,
    original: &crate::domain::payment::Payment,
    force_approval: bool,
) -> Decision {
    judge(has_scope, profile, &Question::reversal(original), force_approval)
}

/// May this principal read `account`?
pub fn check_read(has_scope: impl Fn(&str) -> bool, profile: &Profile, account: &AccountId) -> Result<(), Refusal> {
    require_scope(&[scopes::READ], &has_scope, "this tool")?;
    require_accounts(profile, &[account])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::{AgentError, ErrorCode};

    fn kes(s: &str) -> Money {
        Money::parse(s, Currency::parse("KES").unwrap()).unwrap()
    }
    fn acct(s: &str) -> AccountId {
        AccountId::parse(s).unwrap()
    }
    fn profile() -> Profile {
        Profile {
            name: "p".into(),
            issuer: None,
            allowed_accounts: vec![acct("acct-A"), acct("acct-B")],
            autonomous_limit_minor: [(Currency::parse("KES").unwrap(), 100_000)].into_iter().collect(),
            daily_limit_minor: HashMap::new(),
            daily_refund_limit_minor: HashMap::new(),
            daily_payments_max: 10,
            calls_per_minute: 10,
            tool_calls_per_minute: HashMap::new(),
            user_approval_max_minor: HashMap::new(),
            passkey_required: false,
            payees: Default::default(),
        }
    }
    fn code(d: &Decision) -> Option<ErrorCode> {
        match d {
            Decision::Deny(e) => Some(AgentError::from(e.clone()).code),
            _ => None,
        }
    }

    /// The user-approval tier: up to and including its maximum, in its currency only; a profile
    /// without one leaves every approval to operators.
    #[test]
    fn a_user_approves_only_within_their_tier() {
        let mut p = profile();
        assert!(!p.user_may_approve(kes("0.01")), "no tier: operators only");
        p.user_approval_max_minor.insert(Currency::parse("KES").unwrap(), 500_000);
        assert!(p.user_may_approve(kes("5000.00")));
        assert!(!p.user_may_approve(kes("5000.01")));
        assert!(!p.user_may_approve(Money::parse("1", Currency::parse("USD").unwrap()).unwrap()));
    }

    #[test]
    fn the_autonomous_limit_reads_in_its_currency() {
        let p = profile();
        assert_eq!(p.limit_decimal(Currency::parse("KES").unwrap()).as_deref(), Some("1000.00"));
        assert_eq!(p.limit_decimal(Currency::parse("USD").unwrap()), None);
    }

    #[test]
    fn transfer_table() {
        let all = |_: &str| true;
        let none = |_: &str| false;
        let p = profile();
        let cases: Vec<(Decision, &str)> = vec![
            (decide_transfer(all, &p, &acct("acct-A"), &acct("acct-B"), kes("1000.00"), false), "allow"),
            (decide_transfer(all, &p, &acct("acct-A"), &acct("acct-B"), kes("0.01"), false), "allow"),
            (decide_transfer(all, &p, &acct("acct-A"), &acct("acct-B"), kes("1000.01"), false), "approval"),
            (decide_transfer(all, &p, &acct("acct-A"), &acct("acct-Z"), kes("1.00"), false), "ACCOUNT_NOT_ALLOWED"),
            (decide_transfer(all, &p, &acct("acct-Z"), &acct("acct-A"), kes("1.00"), false), "ACCOUNT_NOT_ALLOWED"),
            (decide_transfer(none, &p, &acct("acct-A"), &acct("acct-B"), kes("1.00"), false), "INSUFFICIENT_SCOPE"),
            (
                decide_transfer(
                    all,
                    &p,
                    &acct("acct-A"),
                    &acct("acct-B"),
                    Money::parse("1", Currency::parse("USD").unwrap()).unwrap(),
                    false,
                ),
                "approval",
            ),
        ];
        for (i, (d, want)) in cases.iter().enumerate() {
            let got = match d {
                Decision::Allow => "allow",
                Decision::RequireApproval { .. } => "approval",
                Decision::Deny(e) => AgentError::from(e.clone()).code.as_str(),
            };
            assert_eq!(got, *want, "case {i}");
        }
    }

    /// A succeeded payment acct-A → acct-B of `minor` KES cents, `refunded` of it refunded already.
    fn paid(minor: i64, refunded: i64) -> crate::domain::payment::Payment {
        use crate::domain::payment::{Payment, PaymentKind, PaymentStatus};
        Payment {
            id: crate::domain::ids::PaymentId::generate(),
            kind: PaymentKind::Payment,
            status: PaymentStatus::Succeeded,
            from_account: acct("acct-A"),
            to_account: acct("acct-B"),
            amount_minor: minor,
            currency: Currency::parse("KES").unwrap(),
            refunded_minor: refunded,
            refund_of: None,
            memo: None,
            principal_sub: "agent".into(),
            principal_user: None,
            created_at: 0,
        }
    }

    #[test]
    fn refund_and_read_rules() {
        let p = profile(); // autonomous limit KES 1,000.00
        let only_read = |s: &str| s == scopes::READ;
        let all = |_: &str| true;
        assert_eq!(
            code(&decide_refund(only_read, &p, &paid(10_000, 0), kes("1"), false)),
            Some(ErrorCode::InsufficientScope)
        );
        assert_eq!(decide_refund(all, &p, &paid(10_000, 0), kes("1"), false), Decision::Allow);
        assert!(matches!(decide_refund(all, &p, &paid(10_000, 0), kes("1"), true), Decision::RequireApproval { .. }));
        // (payment, already refunded, this refund) → needs a human?
        let cases = [
            (100_000, 0, "1000.00", false),     // the whole limit at once
            (100_000, 90_000, "100.00", false), // together exactly the limit
            (100_000, 90_000, "100.01", true),  // together over it: no splitting past the limit
            (500_000, 0, "1.00", true),         // the payment itself needed a human: so does its refund
        ];
        for (minor, refunded, amount, human) in cases {
            let d = decide_refund(all, &p, &paid(minor, refunded), kes(amount), false);
            assert_eq!(matches!(d, Decision::RequireApproval { .. }), human, "{minor} {refunded} {amount}: {d:?}");
        }
        assert!(check_read(only_read, &p, &acct("acct-A")).is_ok());
        assert_eq!(
            AgentError::from(check_read(only_read, &p, &acct("acct-Z")).unwrap_err()).code,
            ErrorCode::AccountNotAllowed
        );
    }

    #[test]
    fn rail_rules_name_only_the_rails_account() {
        let p = profile(); // acct-A and acct-B; autonomous limit KES 1,000.00
        let all = |_: &str| true;
        let collect_only = |s: &str| s == scopes::COLLECT;
        // A collection into acct-B from a customer: acct-B, and the customer is no account of ours.
        let mut collection = paid(50_000, 0);
        collection.from_account = acct("mpesa-254712345678");
        assert_eq!(decide_reversal(all, &p, &collection, false), Decision::Allow);
        assert_eq!(code(&decide_reversal(collect_only, &p, &collection, false)), Some(ErrorCode::InsufficientScope));
        collection.to_account = acct("acct-Z");
        assert_eq!(code(&decide_reversal(all, &p, &collection, false)), Some(ErrorCode::AccountNotAllowed));
        // Reversing a collection that itself needed a human needs one too: to the minor unit.
        let mut big = paid(100_001, 0);
        big.from_account = acct("mpesa-254712345678");
        assert!(matches!(decide_reversal(all, &p, &big, false), Decision::RequireApproval { .. }));
        big.amount_minor = 100_000;
        assert_eq!(decide_reversal(all, &p, &big, false), Decision::Allow, "exactly the limit");
        assert!(matches!(decide_reversal(all, &p, &big, true), Decision::RequireApproval { .. }), "forced");
        // Payouts: their own scope, the rail's account, the autonomous limit.
        let b = acct("acct-B");
        assert_eq!(
            judge(all, &p, &Question::payout("send_mpesa_payout", &b, "mpesa-254700000000", kes("1000.00")), false),
            Decision::Allow
        );
        assert!(matches!(
            judge(all, &p, &Question::payout("send_mpesa_payout", &b, "mpesa-254700000000", kes("1000.01")), false),
            Decision::RequireApproval { .. }
        ));
        let no_payout = |s: &str| s != scopes::PAYOUT;
        assert_eq!(
            code(&judge(
                no_payout,
                &p,
                &Question::payout("send_mpesa_payout", &b, "mpesa-254700000000", kes("1")),
                false
            )),
            Some(ErrorCode::InsufficientScope)
        );
        assert_eq!(
            code(&judge(
                all,
                &p,
                &Question::payout("send_mpesa_payout", &acct("acct-Z"), "mpesa-254700000000", kes("1")),
                false
            )),
            Some(ErrorCode::AccountNotAllowed)
        );
    }

    #[test]
    fn profiles_resolve_subject_then_client_then_default() {
        let named = |name: &str, issuer: Option<&str>| Profile {
            name: name.into(),
            issuer: issuer.map(str::to_string),
            allowed_accounts: vec![acct(name)],
            autonomous_limit_minor: HashMap::new(),
            daily_limit_minor: HashMap::new(),
            daily_refund_limit_minor: HashMap::new(),
            daily_payments_max: 1,
            calls_per_minute: 1,
            tool_calls_per_minute: HashMap::new(),
            user_approval_max_minor: HashMap::new(),
            passkey_required: false,
            payees: Default::default(),
        };
        let mut profiles = Profiles::new();
        assert!(
            profiles.resolve("iss", "anyone", None, None).allowed_accounts.is_empty(),
            "no default: nothing allowed"
        );
        let subjects = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let (dev, billing, idp_dev) = (subjects(&["dev-agent"]), subjects(&["billing"]), subjects(&["dev-agent"]));
        profiles.add(named("dev", None), Matchers { subjects: &dev, ..Default::default() }, false);
        profiles.add(named("by-client", None), Matchers { client_ids: &billing, ..Default::default() }, false);
        profiles.add(
            named("dev-at-idp", Some("https://idp")),
            Matchers { subjects: &idp_dev, ..Default::default() },
            false,
        );
        let (alice, bot) = (subjects(&["alice"]), subjects(&["bot"]));
        profiles.add(named("alice", None), Matchers { users: &alice, ..Default::default() }, false);
        profiles.add(
            named("bot-for-alice", None),
            Matchers { subjects: &bot, users: &alice, ..Default::default() },
            false,
        );
        profiles.add(named("default", None), Matchers::default(), true);
        // Every profile's accounts, each once, sorted: by subject, client, user, pair and default.
        profiles.add(named("dev", None), Matchers { subjects: &billing, ..Default::default() }, false);
        let names: Vec<String> = profiles.accounts().iter().map(|a| a.as_str().to_string()).collect();
        assert_eq!(names, ["alice", "bot-for-alice", "by-client", "default", "dev", "dev-at-idp"]);
        assert!(Profiles::new().accounts().is_empty(), "the fail-closed default allows none");
        assert_eq!(profiles.resolve("http://127.0.0.1:8080", "dev-agent", None, Some("billing")).name, "dev");
        assert_eq!(
            profiles.resolve("https://idp", "dev-agent", None, None).name,
            "dev-at-idp",
            "an issuer-bound profile wins"
        );
        assert_eq!(profiles.resolve("iss", "stranger", None, Some("billing")).name, "by-client");
        assert_eq!(profiles.resolve("iss", "stranger", None, Some("nobody")).name, "default");
        // Delegation: the pair, then the user, then the agent's own.
        assert_eq!(profiles.resolve("iss", "bot", Some("alice"), None).name, "bot-for-alice");
        assert_eq!(
            profiles.resolve("iss", "dev-agent", Some("alice"), None).name,
            "alice",
            "the user's profile bounds any agent"
        );
        assert_eq!(profiles.resolve("iss", "dev-agent", Some("bob"), None).name, "dev");
        assert_eq!(profiles.resolve("iss", "bot", None, None).name, "default", "a pair's profile needs the pair");
        assert_eq!(profiles.resolve("iss", "alice", None, None).name, "default", "a user's profile is not an agent's");
    }

    #[test]
    fn candidates_are_the_named_profile_or_else_every_client_profile_and_the_default() {
        let named = |name: &str, issuer: Option<&str>| Profile {
            name: name.into(),
            issuer: issuer.map(str::to_string),
            ..profile()
        };
        let strings = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let (dev, clients, pat) = (strings(&["dev-agent"]), strings(&["billing"]), strings(&["pat"]));
        let mut profiles = Profiles::new();
        profiles.add(named("dev", None), Matchers { subjects: &dev, ..Default::default() }, false);
        profiles.add(named("by-client", None), Matchers { client_ids: &clients, ..Default::default() }, false);
        profiles.add(
            named("by-client-elsewhere", Some("https://other")),
            Matchers { client_ids: &clients, ..Default::default() },
            false,
        );
        profiles.add(named("pat", None), Matchers { users: &pat, ..Default::default() }, false);
        profiles.add(named("default", None), Matchers::default(), true);
        let names = |v: Vec<Arc<Profile>>| {
            let mut n: Vec<String> = v.iter().map(|p| p.name.clone()).collect();
            n.sort();
            n
        };
        assert_eq!(names(profiles.candidates("iss", "dev-agent", None)), ["dev"]);
        assert_eq!(names(profiles.candidates("iss", "bot", Some("pat"))), ["pat"]);
        // Unnamed: the client profiles its issuer may match, and the default.
        assert_eq!(names(profiles.candidates("iss", "stranger", None)), ["by-client", "default"]);
        assert_eq!(
            names(profiles.candidates("https://other", "stranger", None)),
            ["by-client", "by-client-elsewhere", "default"]
        );
    }
}
