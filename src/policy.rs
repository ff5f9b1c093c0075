//! The policy decision: a pure function of (principal's scopes, profile, intent). No I/O, no clock,
//! so every rule is table-tested.

use std::collections::HashMap;
use std::sync::Arc;

use crate::auth::scopes;
use crate::config::PolicyConfig;
use crate::error::{AgentError, ErrorCode};
use crate::ids::AccountId;
use crate::money::{Currency, Money, format_minor, parse_minor};

/// Which scope each tool needs. `tools/list` shows every tool; calling one needs its scope.
pub const TOOL_SCOPES: &[(&str, &str)] = &[
    ("get_balance", scopes::READ),
    ("get_payment", scopes::READ),
    ("list_payments", scopes::READ),
    ("get_account_ledger", scopes::READ),
    ("create_payment", scopes::CREATE),
    ("refund_payment", scopes::REFUND),
    ("check_ledger_integrity", scopes::ADMIN),
];

/// Scope needed to read resources and prompts.
pub const READ_SCOPE: &str = scopes::READ;

pub fn scope_for_tool(tool: &str) -> Option<&'static str> {
    TOOL_SCOPES.iter().find(|(t, _)| *t == tool).map(|(_, s)| *s)
}

/// What an agent may do without a human: its accounts and per-payment autonomous limits.
#[derive(Debug, Clone, PartialEq)]
pub struct Profile {
    pub name: String,
    pub allowed_accounts: Vec<AccountId>,
    /// Per currency, in minor units. A currency not present: every payment in it needs approval.
    pub autonomous_limit_minor: HashMap<Currency, i64>,
}

impl Profile {
    pub fn allows_account(&self, account: &AccountId) -> bool {
        self.allowed_accounts.contains(account)
    }
    pub fn limit_decimal(&self, currency: Currency) -> Option<String> {
        self.autonomous_limit_minor.get(&currency).map(|m| format_minor(*m, currency))
    }
}

/// Profiles by subject and by client id, with a default for everyone else.
#[derive(Debug, Clone)]
pub struct Profiles {
    by_subject: HashMap<String, Arc<Profile>>,
    by_client: HashMap<String, Arc<Profile>>,
    default: Arc<Profile>,
}

impl Profiles {
    /// Config has been validated; anything unparseable here is skipped rather than trusted.
    pub fn from_config(cfg: &PolicyConfig) -> Profiles {
        let mut by_subject = HashMap::new();
        let mut by_client = HashMap::new();
        let mut default = None;
        for p in &cfg.profiles {
            let profile = Arc::new(Profile {
                name: p.name.clone(),
                allowed_accounts: p.allowed_accounts.iter().filter_map(|a| AccountId::parse(a).ok()).collect(),
                autonomous_limit_minor: p
                    .autonomous_limit
                    .iter()
                    .filter_map(|(c, a)| {
                        let c = Currency::parse(c).ok()?;
                        Some((c, parse_minor(a, c).ok()?))
                    })
                    .collect(),
            });
            for s in &p.subjects {
                by_subject.insert(s.clone(), profile.clone());
            }
            for c in &p.client_ids {
                by_client.insert(c.clone(), profile.clone());
            }
            if p.name == cfg.default_profile {
                default = Some(profile);
            }
        }
        let default = default.unwrap_or_else(|| {
            Arc::new(Profile { name: "none".into(), allowed_accounts: vec![], autonomous_limit_minor: HashMap::new() })
        });
        Profiles { by_subject, by_client, default }
    }

    /// Subject first (most specific), then client id, then the default.
    pub fn resolve(&self, subject: &str, client_id: Option<&str>) -> Arc<Profile> {
        self.by_subject
            .get(subject)
            .or_else(|| client_id.and_then(|c| self.by_client.get(c)))
            .cloned()
            .unwrap_or_else(|| self.default.clone())
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Allow,
    /// Over the autonomous limit: a human must approve. `reason` is the gateway's own text.
    RequireApproval {
        reason: String,
    },
    Deny(AgentError),
}

fn require_scope(scopes: &[&str], have: impl Fn(&str) -> bool, tool: &str) -> Result<(), AgentError> {
    match scopes.iter().find(|s| !have(s)) {
        Some(missing) => Err(AgentError::new(ErrorCode::InsufficientScope, format!("{tool} needs scope {missing}"))
            .with_detail("required_scopes", scopes.to_vec())),
        None => Ok(()),
    }
}

fn require_accounts(profile: &Profile, accounts: &[&AccountId]) -> Result<(), AgentError> {
    match accounts.iter().find(|a| !profile.allows_account(a)) {
        Some(a) => Err(AgentError::new(ErrorCode::AccountNotAllowed, format!("this agent may not use account {a}"))
            .with_detail("account_id", a.to_string())),
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

/// May this principal move `amount` from `from` to `to` on its own?
pub fn decide_transfer(
    has_scope: impl Fn(&str) -> bool,
    profile: &Profile,
    from: &AccountId,
    to: &AccountId,
    amount: Money,
) -> Decision {
    if let Err(e) = require_scope(&[scopes::CREATE], &has_scope, "create_payment") {
        return Decision::Deny(e);
    }
    if let Err(e) = require_accounts(profile, &[from, to]) {
        return Decision::Deny(e);
    }
    within_limit(profile, amount)
}

/// May this principal refund `amount` of a payment between `payer` and `payee`?
pub fn decide_refund(
    has_scope: impl Fn(&str) -> bool,
    profile: &Profile,
    payer: &AccountId,
    payee: &AccountId,
    amount: Money,
) -> Decision {
    if let Err(e) = require_scope(&[scopes::REFUND], &has_scope, "refund_payment") {
        return Decision::Deny(e);
    }
    if let Err(e) = require_accounts(profile, &[payer, payee]) {
        return Decision::Deny(e);
    }
    within_limit(profile, amount)
}

/// May this principal read `account`?
pub fn check_read(has_scope: impl Fn(&str) -> bool, profile: &Profile, account: &AccountId) -> Result<(), AgentError> {
    require_scope(&[scopes::READ], &has_scope, "this tool")?;
    require_accounts(profile, &[account])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kes(s: &str) -> Money {
        Money::parse(s, Currency::parse("KES").unwrap()).unwrap()
    }
    fn acct(s: &str) -> AccountId {
        AccountId::parse(s).unwrap()
    }
    fn profile() -> Profile {
        Profile {
            name: "p".into(),
            allowed_accounts: vec![acct("acct-A"), acct("acct-B")],
            autonomous_limit_minor: [(Currency::parse("KES").unwrap(), 100_000)].into_iter().collect(),
        }
    }
    fn code(d: &Decision) -> Option<ErrorCode> {
        match d {
            Decision::Deny(e) => Some(e.code),
            _ => None,
        }
    }

    #[test]
    fn transfer_table() {
        let all = |_: &str| true;
        let none = |_: &str| false;
        let p = profile();
        let cases: Vec<(Decision, &str)> = vec![
            (decide_transfer(all, &p, &acct("acct-A"), &acct("acct-B"), kes("1000.00")), "allow"),
            (decide_transfer(all, &p, &acct("acct-A"), &acct("acct-B"), kes("0.01")), "allow"),
            (decide_transfer(all, &p, &acct("acct-A"), &acct("acct-B"), kes("1000.01")), "approval"),
            (decide_transfer(all, &p, &acct("acct-A"), &acct("acct-Z"), kes("1.00")), "ACCOUNT_NOT_ALLOWED"),
            (decide_transfer(all, &p, &acct("acct-Z"), &acct("acct-A"), kes("1.00")), "ACCOUNT_NOT_ALLOWED"),
            (decide_transfer(none, &p, &acct("acct-A"), &acct("acct-B"), kes("1.00")), "INSUFFICIENT_SCOPE"),
            (
                decide_transfer(
                    all,
                    &p,
                    &acct("acct-A"),
                    &acct("acct-B"),
                    Money::parse("1", Currency::parse("USD").unwrap()).unwrap(),
                ),
                "approval",
            ),
        ];
        for (i, (d, want)) in cases.iter().enumerate() {
            let got = match d {
                Decision::Allow => "allow",
                Decision::RequireApproval { .. } => "approval",
                Decision::Deny(e) => e.code.as_str(),
            };
            assert_eq!(got, *want, "case {i}");
        }
    }

    #[test]
    fn refund_and_read_rules() {
        let p = profile();
        let only_read = |s: &str| s == scopes::READ;
        assert_eq!(
            code(&decide_refund(only_read, &p, &acct("acct-A"), &acct("acct-B"), kes("1"))),
            Some(ErrorCode::InsufficientScope)
        );
        assert_eq!(decide_refund(|_: &str| true, &p, &acct("acct-A"), &acct("acct-B"), kes("1")), Decision::Allow);
        assert!(check_read(only_read, &p, &acct("acct-A")).is_ok());
        assert_eq!(check_read(only_read, &p, &acct("acct-Z")).unwrap_err().code, ErrorCode::AccountNotAllowed);
    }

    #[test]
    fn profiles_resolve_subject_then_client_then_default() {
        let cfg = crate::config::Config::load(None, Vec::<(String, String)>::new()).unwrap();
        let profiles = Profiles::from_config(&cfg.policy);
        assert_eq!(profiles.resolve("dev-agent", None).name, "dev");
        assert_eq!(profiles.resolve("stranger", Some("nobody")).name, "default");
        assert!(profiles.resolve("stranger", None).allowed_accounts.is_empty());
    }
}
