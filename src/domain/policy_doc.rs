//! Policy as data: the document operators version in the store (profiles, their payee rules, tool
//! governance) — the `[policy]` and `[tools]` sections of the config file, which bootstrap it —
//! its validation, the live form requests are judged under, and what a change between two
//! versions does: each difference named, and whether it widens what an agent may do (raising a
//! limit, widening an allow-list, enabling a tool: a second operator must approve) or only narrows
//! it (one operator applies it at once). Pure: no I/O.

use std::cmp::Ordering;
use std::collections::{BTreeMap, BTreeSet, HashSet};

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::ids::AccountId;
use super::money::{Currency, MoneyMap};
use super::policy::Profiles;
use crate::clock::UnixSecs;

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ToolsConfig {
    /// Tools nobody may call (hidden from tools/list too); an alias may be named alone.
    pub disabled: Vec<String>,
    /// Money-moving tools every call of which needs a human (or a mandate).
    pub approval_required: Vec<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyConfig {
    pub default_profile: String,
    pub profiles: Vec<ProfileConfig>,
    /// How often each replica looks for a newer version in the store (not part of a version).
    #[serde(default = "default_refresh_secs", skip_serializing)]
    pub refresh_secs: i64,
    /// The longest window `policy simulate` replays (not part of a version).
    #[serde(default = "default_simulate_window_max_secs", skip_serializing)]
    pub simulate_window_max_secs: i64,
    /// The most audited calls one `policy simulate` replays (not part of a version).
    #[serde(default = "default_simulate_records_max", skip_serializing)]
    pub simulate_records_max: i64,
    /// Tag, once, the policy versions of a store that has never had tags (an upgrade from before
    /// versions were tagged). Off by default: untagged versions are never adopted unasked, since
    /// a database writer who strips every tag makes a forged version look like an old one.
    #[serde(default, skip_serializing)]
    pub adopt_untagged_versions: bool,
}

fn default_refresh_secs() -> i64 {
    2
}
fn default_simulate_window_max_secs() -> i64 {
    2_592_000
}
fn default_simulate_records_max() -> i64 {
    100_000
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProfileConfig {
    pub name: String,
    #[serde(default)]
    pub subjects: Vec<String>,
    #[serde(default)]
    pub client_ids: Vec<String>,
    /// The users agents act for (RFC 8693 delegation: the token's `sub`, with `act.sub` the agent).
    /// With `subjects` too, the profile matches only those agents acting for these users.
    #[serde(default)]
    pub users: Vec<String>,
    #[serde(default)]
    pub allowed_accounts: Vec<AccountId>,
    #[serde(default)]
    pub autonomous_limit: MoneyMap,
    #[serde(default)]
    pub daily_limit: MoneyMap,
    /// What autonomous refunds may total per UTC day, per currency; a currency not listed takes
    /// its `daily_limit`. Refunds count apart from payments, and their number is capped by
    /// `daily_payments_max` too.
    #[serde(default)]
    pub daily_refund_limit: MoneyMap,
    #[serde(default = "default_daily_payments_max")]
    pub daily_payments_max: i64,
    #[serde(default = "default_calls_per_minute")]
    pub calls_per_minute: i64,
    #[serde(default)]
    pub tool_calls_per_minute: BTreeMap<String, i64>,
    #[serde(default)]
    pub issuer: String,
    /// Matches only tokens signed with the dev key (the compiled-in "dev" profile).
    #[serde(default)]
    pub dev_key_only: bool,
    /// Who approves this profile's payments over its limits: "operator" (default), or "user": the
    /// person the agent acts for confirms it themselves, up to `user_approval_max` per currency.
    #[serde(default = "default_approvals_by")]
    pub approvals_by: String,
    #[serde(default)]
    pub user_approval_max: MoneyMap,
    /// Every approval this profile's agents ask for is decided only with a passkey (approve,
    /// reject, or the user's confirmation), whatever its amount.
    #[serde(default)]
    pub passkey_required: bool,
    /// Who this profile's agents may pay (`domain::payee`).
    #[serde(default)]
    pub payees: PayeesConfig,
}

/// A profile's payee rules, as configured.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PayeesConfig {
    /// "open" | "known" | "allow_list".
    pub mode: String,
    pub cooling_off_secs: i64,
    pub new_payee_limit: MoneyMap,
    /// Per currency: what autonomous payments to one payee may total during its cooling-off
    /// period (drawn where each payment commits). Not written when empty, so a version stored
    /// before it existed reads and writes back the same.
    #[serde(skip_serializing_if = "MoneyMap::is_empty")]
    pub cooling_off_total: MoneyMap,
    pub daily_cap: MoneyMap,
}

/// Longest cooling-off period a profile may set: a year.
pub const COOLING_OFF_SECS_MAX: i64 = 31_536_000;

impl Default for PayeesConfig {
    fn default() -> Self {
        PayeesConfig {
            mode: "open".into(),
            cooling_off_secs: 86_400,
            new_payee_limit: MoneyMap::default(),
            cooling_off_total: MoneyMap::default(),
            daily_cap: MoneyMap::default(),
        }
    }
}

impl PayeesConfig {
    fn rules(&self) -> super::payee::PayeeRules {
        super::payee::PayeeRules {
            // Validated at load: an unknown mode never gets here.
            mode: super::payee::PayeeMode::parse(&self.mode).unwrap_or_default(),
            cooling_off_secs: self.cooling_off_secs,
            new_payee_limit_minor: self.new_payee_limit.iter().collect(),
            cooling_off_total_minor: self.cooling_off_total.iter().collect(),
            daily_cap_minor: self.daily_cap.iter().collect(),
        }
    }
}

fn default_approvals_by() -> String {
    "operator".into()
}

fn default_daily_payments_max() -> i64 {
    100
}
fn default_calls_per_minute() -> i64 {
    120
}

impl PolicyConfig {
    /// The policy profiles, matched by subject and client id. Every value was parsed when the config
    /// loaded; this only arranges them. `dev_issuer`: the dev key's issuer while the dev key is on;
    /// a `dev_key_only` profile matches only its tokens (and, with the dev key off, no subject at all,
    /// though it may still be the default profile).
    pub fn profiles(&self, dev_issuer: Option<&str>) -> super::policy::Profiles {
        let mut profiles = super::policy::Profiles::new();
        let none: &[String] = &[];
        for p in &self.profiles {
            let issuer = match (p.dev_key_only, dev_issuer) {
                (true, Some(dev)) => Some(dev.to_string()),
                _ => (!p.issuer.is_empty()).then(|| p.issuer.clone()),
            };
            let matchable = !p.dev_key_only || dev_issuer.is_some();
            let matchers = if matchable {
                super::policy::Matchers { subjects: &p.subjects, users: &p.users, client_ids: &p.client_ids }
            } else {
                super::policy::Matchers { subjects: none, users: none, client_ids: none }
            };
            let profile = super::policy::Profile {
                name: p.name.clone(),
                issuer,
                allowed_accounts: p.allowed_accounts.clone(),
                autonomous_limit_minor: p.autonomous_limit.iter().collect(),
                daily_limit_minor: p.daily_limit.iter().collect(),
                daily_refund_limit_minor: p.daily_limit.iter().chain(p.daily_refund_limit.iter()).collect(),
                daily_payments_max: p.daily_payments_max,
                calls_per_minute: p.calls_per_minute.clamp(1, u32::MAX as i64) as u32,
                tool_calls_per_minute: p
                    .tool_calls_per_minute
                    .iter()
                    .map(|(t, n)| (t.clone(), (*n).clamp(1, u32::MAX as i64) as u32))
                    .collect(),
                user_approval_max_minor: match p.approvals_by.as_str() {
                    "user" => p.user_approval_max.iter().collect(),
                    _ => Default::default(),
                },
                passkey_required: p.passkey_required,
                payees: p.payees.rules(),
            };
            profiles.add(profile, matchers, p.name == self.default_profile);
        }
        profiles
    }
}
/// The versioned policy: what `[policy]` and `[tools]` say in the config file, and what one
/// version in the store holds (as canonical JSON, [`PolicyDocument::canonical`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PolicyDocument {
    pub policy: PolicyConfig,
    #[serde(default)]
    pub tools: ToolsConfig,
}

/// Why a policy document is refused (the config loader names these as its own errors).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PolicyError {
    #[error("config key {key} = {value} is out of range {min}..={max}")]
    OutOfRange { key: &'static str, value: i64, min: i64, max: i64 },
    #[error("{0}")]
    Invalid(String),
}

/// Largest policy document the store keeps or an operator may propose, in bytes of canonical JSON.
pub const DOCUMENT_BYTES_MAX: usize = 256 * 1024;
/// Most profiles one document may hold (500 of the smallest are ~190 KiB, within the byte bound).
pub const PROFILES_MAX: usize = 500;
/// Largest `calls_per_minute` (and per-tool quota) a profile may set: 100,000 calls a second, for
/// service agents (the default is 120 a minute).
pub const CALLS_PER_MINUTE_MAX: i64 = 6_000_000;

fn range(key: &'static str, value: i64, min: i64, max: i64) -> Result<(), PolicyError> {
    if (min..=max).contains(&value) { Ok(()) } else { Err(PolicyError::OutOfRange { key, value, min, max }) }
}

/// Governance is set on a tool, never on an alias: an alias is admitted under its canonical tool's
/// name, so a setting on the alias would never apply. Likewise a tool that routes to a rail's own
/// tool (`request_payment`, `send_payment`): the call runs, and is governed, as that tool, so an
/// approval rule or quota set on the router would silently never hold.
pub fn not_an_alias(key: &str, name: &str) -> Result<(), PolicyError> {
    if let Some(a) = crate::catalogue::alias(name) {
        return Err(PolicyError::Invalid(format!(
            "{key}: {name:?} is an alias of {:?}; set it on {:?}, which governs both names",
            a.canonical, a.canonical
        )));
    }
    if let Some(runs_as) = crate::catalogue::routed_to(name) {
        return Err(PolicyError::Invalid(format!("{key}: {name:?} runs as the rail's own tool; set it on {runs_as}")));
    }
    Ok(())
}

impl PolicyDocument {
    /// The document's one byte form: what is stored, compared and hashed.
    pub fn canonical(&self) -> String {
        // A struct of strings, numbers and ordered maps: serializing cannot fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// Parse a stored or proposed document (JSON), then validate it.
    pub fn parse(text: &str, high_risk_amount: &MoneyMap) -> Result<PolicyDocument, PolicyError> {
        if text.len() > DOCUMENT_BYTES_MAX {
            return Err(PolicyError::Invalid(format!("a policy document is at most {DOCUMENT_BYTES_MAX} bytes")));
        }
        let doc: PolicyDocument =
            serde_json::from_str(text).map_err(|e| PolicyError::Invalid(format!("not a policy document: {e}")))?;
        doc.validate(high_risk_amount)?;
        Ok(doc)
    }

    /// Every rule the config loader applies to `[policy]` and `[tools]`. `high_risk_amount`: the
    /// approvals' high-risk threshold, which a user's own approval tier stays under.
    pub fn validate(&self, high_risk_amount: &MoneyMap) -> Result<(), PolicyError> {
        let invalid = |m: String| Err(PolicyError::Invalid(m));
        if self.policy.profiles.len() > PROFILES_MAX {
            return invalid(format!("a policy holds at most {PROFILES_MAX} profiles"));
        }
        if self.canonical().len() > DOCUMENT_BYTES_MAX {
            return invalid(format!("a policy document is at most {DOCUMENT_BYTES_MAX} bytes"));
        }
        for t in self.tools.disabled.iter().chain(&self.tools.approval_required) {
            if crate::catalogue::scope_for_tool(t).is_none() {
                return invalid(format!("tools: no tool named {t:?}"));
            }
        }
        // (An alias may be disabled alone, which hides that name only; governance is the tool's.)
        for t in &self.tools.approval_required {
            not_an_alias("tools.approval_required", t)?;
            if !crate::catalogue::moves_money(t) {
                return invalid(format!("tools.approval_required: {t:?} moves no money"));
            }
        }
        let mut names = HashSet::new();
        for p in &self.policy.profiles {
            if p.name.is_empty() || p.name.len() > 64 || p.name.chars().any(char::is_control) {
                return invalid(format!("policy profile names are 1-64 printable characters, got {:?}", p.name));
            }
            if !names.insert(p.name.as_str()) {
                return invalid(format!("policy profile {:?} is defined twice", p.name));
            }
            if let Some((cur, _)) = p.autonomous_limit.iter().find(|(c, _)| !p.daily_limit.contains(*c)) {
                return invalid(format!("profile {:?}: {cur} has an autonomous_limit but no daily_limit", p.name));
            }
            // (No amount is negative: a money map refuses one when it is read.)
            match p.approvals_by.as_str() {
                "operator" if p.user_approval_max.iter().next().is_some() => {
                    return invalid(format!("profile {:?}: user_approval_max needs approvals_by = \"user\"", p.name));
                }
                "operator" => {}
                "user" => {
                    if p.user_approval_max.iter().next().is_none() {
                        return invalid(format!(
                            "profile {:?}: approvals_by = \"user\" needs user_approval_max (per currency)",
                            p.name
                        ));
                    }
                    // The user's tier stays below the high-risk amount: there, more than one
                    // person decides, and a currency with no threshold counts as high risk.
                    for (cur, max) in p.user_approval_max.iter() {
                        if high_risk_amount.get(cur).is_none_or(|high| max >= high) {
                            return invalid(format!(
                                "profile {:?}: user_approval_max for {cur} must be under approvals.high_risk_amount",
                                p.name
                            ));
                        }
                    }
                }
                other => {
                    return invalid(format!(
                        "profile {:?}: approvals_by must be \"operator\" or \"user\", got {other:?}",
                        p.name
                    ));
                }
            }
            if super::payee::PayeeMode::parse(&p.payees.mode).is_none() {
                return invalid(format!(
                    "profile {:?}: payees.mode must be \"open\", \"known\" or \"allow_list\", got {:?}",
                    p.name, p.payees.mode
                ));
            }
            range("policy.profiles.payees.cooling_off_secs", p.payees.cooling_off_secs, 0, COOLING_OFF_SECS_MAX)?;
            // A total under the per-payment limit would make that limit a lie: refused. (No amount
            // is negative, nor past the money bound: a money map refuses those when it is read.)
            for (cur, total) in p.payees.cooling_off_total.iter() {
                if p.payees.new_payee_limit.get(cur).is_some_and(|limit| total < limit) {
                    return invalid(format!(
                        "profile {:?}: payees.cooling_off_total for {cur} must be at least its new_payee_limit",
                        p.name
                    ));
                }
            }
            range("policy.profiles.daily_payments_max", p.daily_payments_max, 1, 1_000_000)?;
            range("policy.profiles.calls_per_minute", p.calls_per_minute, 1, CALLS_PER_MINUTE_MAX)?;
            for (tool, n) in &p.tool_calls_per_minute {
                if crate::catalogue::scope_for_tool(tool).is_none() {
                    return invalid(format!("profile {:?}: no tool named {tool:?}", p.name));
                }
                not_an_alias("policy.profiles.tool_calls_per_minute", tool)?;
                range("policy.profiles.tool_calls_per_minute", *n, 1, CALLS_PER_MINUTE_MAX)?;
            }
        }
        range("policy.refresh_secs", self.policy.refresh_secs, 1, 3600)?;
        range("policy.simulate_window_max_secs", self.policy.simulate_window_max_secs, 3600, 31_536_000)?;
        range("policy.simulate_records_max", self.policy.simulate_records_max, 100, 1_000_000)?;
        if !names.contains(self.policy.default_profile.as_str()) {
            return invalid(format!("policy.default_profile {:?} names no profile", self.policy.default_profile));
        }
        Ok(())
    }

    /// The live form of version `version`: profiles arranged for matching, tool governance.
    pub fn live(&self, version: i64, dev_issuer: Option<&str>) -> LivePolicy {
        let mut disabled: BTreeSet<String> = BTreeSet::new();
        for name in &self.tools.disabled {
            disabled.insert(name.clone());
            // A disabled tool's aliases go with it (an alias named alone is hidden alone).
            disabled.extend(crate::catalogue::aliases_of(name).map(str::to_string));
        }
        LivePolicy {
            version,
            profiles: self.policy.profiles(dev_issuer),
            disabled,
            approval_required: self.tools.approval_required.iter().cloned().collect(),
        }
    }
}

/// One version of the policy as requests are judged under it.
#[derive(Debug, Clone)]
pub struct LivePolicy {
    /// The store's version number (0: not stored — a test's or a tool's policy).
    pub version: i64,
    pub profiles: Profiles,
    /// Tools (and aliases) nobody may call.
    pub disabled: BTreeSet<String>,
    /// Money tools every call of which needs a human.
    pub approval_required: BTreeSet<String>,
}

impl LivePolicy {
    /// No policy yet: nobody matches a profile that allows anything (fail closed).
    pub fn none() -> LivePolicy {
        LivePolicy {
            version: 0,
            profiles: Profiles::new(),
            disabled: BTreeSet::new(),
            approval_required: BTreeSet::new(),
        }
    }
    pub fn is_disabled(&self, tool: &str) -> bool {
        self.disabled.contains(tool)
    }
    pub fn always_needs_a_human(&self, tool: &str) -> bool {
        self.approval_required.contains(tool)
    }
}

/// One difference between two policy versions.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Change {
    /// Where: `policy.default_profile`, `profiles.<name>.<field>[.<currency or tool>]`, `tools.…`.
    pub path: String,
    pub before: Value,
    pub after: Value,
    /// It lets some agent do more than before (or might): a second operator must approve it.
    pub widens: bool,
}

/// "Absent" in a per-currency map means something different per map: no autonomous limit is 0
/// (every payment needs a human), no daily limit is no cap at all.
#[derive(Clone, Copy)]
enum Absent {
    Zero,
    Unbounded,
}

fn map_changes(out: &mut Vec<Change>, path: &str, before: &MoneyMap, after: &MoneyMap, absent: Absent) {
    let currencies: BTreeSet<Currency> = before.iter().chain(after.iter()).map(|(c, _)| c).collect();
    for c in currencies {
        let (b, a) = (before.get(c), after.get(c));
        if b == a {
            continue;
        }
        let effective = |v: Option<i64>| match (v, absent) {
            (Some(v), _) => v as i128,
            (None, Absent::Zero) => 0,
            (None, Absent::Unbounded) => i128::MAX,
        };
        let show = |v: Option<i64>| v.map_or(Value::Null, |m| json!(super::money::format_minor(m, c)));
        out.push(Change {
            path: format!("{path}.{c}"),
            before: show(b),
            after: show(a),
            widens: effective(a) > effective(b),
        });
    }
}

/// A bound that widens when it grows; `None`: no bound at all.
fn number_change(out: &mut Vec<Change>, path: String, before: Option<i64>, after: Option<i64>) {
    let bound = |v: Option<i64>| v.map_or(i128::MAX, i128::from);
    match bound(after).cmp(&bound(before)) {
        Ordering::Equal => {}
        order => out.push(Change { path, before: json!(before), after: json!(after), widens: order.is_gt() }),
    }
}

fn set_change(out: &mut Vec<Change>, path: String, before: &[String], after: &[String], added_widens: bool) {
    let b: BTreeSet<&String> = before.iter().collect();
    let a: BTreeSet<&String> = after.iter().collect();
    let added: Vec<&&String> = a.difference(&b).collect();
    let removed: Vec<&&String> = b.difference(&a).collect();
    if !added.is_empty() {
        out.push(Change { path: format!("{path}+"), before: Value::Null, after: json!(added), widens: added_widens });
    }
    if !removed.is_empty() {
        out.push(Change {
            path: format!("{path}-"),
            before: json!(removed),
            after: Value::Null,
            widens: !added_widens,
        });
    }
}

/// How strict a payee mode is; a mode no rule knows reads as open, as the live form reads it.
fn payee_strictness(mode: &str) -> u8 {
    match mode {
        "known" => 1,
        "allow_list" => 2,
        _ => 0,
    }
}

fn profile_changes(out: &mut Vec<Change>, b: &ProfileConfig, a: &ProfileConfig) {
    let at = |field: &str| format!("profiles.{}.{field}", a.name);
    // Who a profile is for: any change may hand some agent more than it had: four eyes.
    for (field, before, after) in [
        ("subjects", &b.subjects, &a.subjects),
        ("users", &b.users, &a.users),
        ("client_ids", &b.client_ids, &a.client_ids),
    ] {
        if before != after {
            out.push(Change { path: at(field), before: json!(before), after: json!(after), widens: true });
        }
    }
    if (b.issuer.as_str(), b.dev_key_only) != (a.issuer.as_str(), a.dev_key_only) {
        out.push(Change {
            path: at("issuer"),
            before: json!({"issuer": b.issuer, "dev_key_only": b.dev_key_only}),
            after: json!({"issuer": a.issuer, "dev_key_only": a.dev_key_only}),
            widens: true,
        });
    }
    let (ba, aa): (Vec<String>, Vec<String>) = (
        b.allowed_accounts.iter().map(|x| x.to_string()).collect(),
        a.allowed_accounts.iter().map(|x| x.to_string()).collect(),
    );
    set_change(out, at("allowed_accounts"), &ba, &aa, true);
    map_changes(out, &at("autonomous_limit"), &b.autonomous_limit, &a.autonomous_limit, Absent::Zero);
    map_changes(out, &at("daily_limit"), &b.daily_limit, &a.daily_limit, Absent::Unbounded);
    // A currency without a refund limit takes its daily limit: compare what is in force.
    let refunds = |p: &ProfileConfig| -> MoneyMap {
        serde_json::from_value(json!(
            p.daily_limit
                .iter()
                .chain(p.daily_refund_limit.iter())
                .map(|(c, m)| (c.code().to_string(), super::money::format_minor(m, c)))
                .collect::<BTreeMap<_, _>>()
        ))
        .unwrap_or_default()
    };
    map_changes(out, &at("daily_refund_limit"), &refunds(b), &refunds(a), Absent::Unbounded);
    number_change(out, at("daily_payments_max"), Some(b.daily_payments_max), Some(a.daily_payments_max));
    number_change(out, at("calls_per_minute"), Some(b.calls_per_minute), Some(a.calls_per_minute));
    let tools: BTreeSet<&String> = b.tool_calls_per_minute.keys().chain(a.tool_calls_per_minute.keys()).collect();
    for t in tools {
        let (x, y) = (b.tool_calls_per_minute.get(t).copied(), a.tool_calls_per_minute.get(t).copied());
        number_change(out, format!("{}.{t}", at("tool_calls_per_minute")), x, y);
    }
    // The user's own approval tier: only with approvals_by = "user".
    let tier =
        |p: &ProfileConfig| if p.approvals_by == "user" { p.user_approval_max.clone() } else { MoneyMap::default() };
    if b.approvals_by != a.approvals_by {
        out.push(Change {
            path: at("approvals_by"),
            before: json!(b.approvals_by),
            after: json!(a.approvals_by),
            widens: a.approvals_by == "user",
        });
    }
    map_changes(out, &at("user_approval_max"), &tier(b), &tier(a), Absent::Zero);
    if b.passkey_required != a.passkey_required {
        out.push(Change {
            path: at("passkey_required"),
            before: json!(b.passkey_required),
            after: json!(a.passkey_required),
            widens: !a.passkey_required,
        });
    }
    if b.payees.mode != a.payees.mode {
        out.push(Change {
            path: at("payees.mode"),
            before: json!(b.payees.mode),
            after: json!(a.payees.mode),
            widens: payee_strictness(&a.payees.mode) < payee_strictness(&b.payees.mode),
        });
    }
    // A shorter wait before a new payee's first payment widens.
    match a.payees.cooling_off_secs.cmp(&b.payees.cooling_off_secs) {
        Ordering::Equal => {}
        order => out.push(Change {
            path: at("payees.cooling_off_secs"),
            before: json!(b.payees.cooling_off_secs),
            after: json!(a.payees.cooling_off_secs),
            widens: order.is_lt(),
        }),
    }
    map_changes(
        out,
        &at("payees.new_payee_limit"),
        &b.payees.new_payee_limit,
        &a.payees.new_payee_limit,
        Absent::Unbounded,
    );
    map_changes(
        out,
        &at("payees.cooling_off_total"),
        &b.payees.cooling_off_total,
        &a.payees.cooling_off_total,
        Absent::Unbounded,
    );
    map_changes(out, &at("payees.daily_cap"), &b.payees.daily_cap, &a.payees.daily_cap, Absent::Unbounded);
}

/// Every difference from `before` to `after`, each marked widening or not. Fail closed: a
/// difference no rule here names (a field added later) is reported as widening.
pub fn changes(before: &PolicyDocument, after: &PolicyDocument) -> Vec<Change> {
    let mut out = Vec::new();
    if before.policy.default_profile != after.policy.default_profile {
        out.push(Change {
            path: "policy.default_profile".into(),
            before: json!(before.policy.default_profile),
            after: json!(after.policy.default_profile),
            widens: true,
        });
    }
    // Disabling a tool narrows; enabling one widens. Requiring a human narrows; dropping it widens.
    set_change(&mut out, "tools.disabled".into(), &before.tools.disabled, &after.tools.disabled, false);
    set_change(
        &mut out,
        "tools.approval_required".into(),
        &before.tools.approval_required,
        &after.tools.approval_required,
        false,
    );
    let old: BTreeMap<&str, &ProfileConfig> = before.policy.profiles.iter().map(|p| (p.name.as_str(), p)).collect();
    let new: BTreeMap<&str, &ProfileConfig> = after.policy.profiles.iter().map(|p| (p.name.as_str(), p)).collect();
    for (name, p) in &new {
        match old.get(name) {
            Some(b) => profile_changes(&mut out, b, p),
            None => out.push(Change {
                path: format!("profiles.{name}"),
                before: Value::Null,
                after: serde_json::to_value(p).unwrap_or_default(),
                widens: true,
            }),
        }
    }
    for (name, p) in &old {
        if !new.contains_key(name) {
            // Its agents fall to another profile, which may allow more.
            out.push(Change {
                path: format!("profiles.{name}"),
                before: serde_json::to_value(p).unwrap_or_default(),
                after: Value::Null,
                widens: true,
            });
        }
    }
    // The order of profiles naming the same agent decides which one it gets (the first): named
    // whenever it moved, whatever else changed. Whose profile it changes, `review` says.
    let order = |d: &PolicyDocument| d.policy.profiles.iter().map(|p| p.name.clone()).collect::<Vec<_>>();
    let (ob, oa) = (order(before), order(after));
    if ob != oa && ob.len() == oa.len() && ob.iter().collect::<BTreeSet<_>>() == oa.iter().collect::<BTreeSet<_>>() {
        out.push(Change { path: "policy.profiles.order".into(), before: json!(ob), after: json!(oa), widens: true });
    }
    if out.is_empty() && before.canonical() != after.canonical() {
        // Any other difference no rule above names (listed for people; `review` decides).
        out.push(Change { path: "policy".into(), before: Value::Null, after: Value::Null, widens: true });
    }
    out
}

/// What a change does, for the people deciding it and for the four-eyes rule.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Review {
    /// It lets some principal do more than before: a second, distinct operator must approve it.
    /// Decided from `authority` and `governance` only, never from `changes`.
    pub widens: bool,
    /// Each difference in the document, named (`widens` there: it may widen; for reading).
    pub changes: Vec<Change>,
    /// Each class of principals whose effective profile changes, and how.
    pub authority: Vec<super::policy_authority::AuthorityChange>,
    /// Tool governance (the same for everyone).
    pub governance: Vec<Change>,
}

impl Review {
    /// Two documents that cannot be compared (one no longer validates): widening, nothing named.
    pub fn unknown() -> Review {
        Review { widens: true, changes: Vec::new(), authority: Vec::new(), governance: Vec::new() }
    }
}

/// Compare `after` with `before` by effective authority (`domain::policy_authority`): every
/// principal's resolved profile, every dimension, and tool governance. `dev_issuer`: the dev key's
/// issuer while it is on (a `dev_key_only` profile matches only its tokens), as in the live form.
pub fn review(before: &PolicyDocument, after: &PolicyDocument, dev_issuer: Option<&str>) -> Review {
    let (b, a) = (before.live(0, dev_issuer), after.live(0, dev_issuer));
    let authority = super::policy_authority::compare(&b.profiles, &a.profiles);
    let governance = super::policy_authority::governance(&b, &a);
    let widens = authority.iter().any(|c| c.widens) || governance.iter().any(|c| c.widens);
    Review { widens, changes: changes(before, after), authority, governance }
}

/// Whether applying `after` over `before` needs a second operator.
pub fn widens(before: &PolicyDocument, after: &PolicyDocument, dev_issuer: Option<&str>) -> bool {
    review(before, after, dev_issuer).widens
}

/// One stored version of the policy (never changed once written).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyVersion {
    pub version: i64,
    /// Canonical JSON of a [`PolicyDocument`].
    pub document: String,
    pub author_iss: String,
    pub author_sub: String,
    pub reason: String,
    /// The second operator of a widening change; empty when it only narrowed (or bootstrapped).
    pub approver_iss: String,
    pub approver_sub: String,
    pub proposal_id: Option<String>,
    pub created_at: UnixSecs,
    /// The gateway's tag over every field above (`audit_chain::row_tag` under
    /// [`VERSION_TAG_DOMAIN`]): a version a database writer inserted or edited has none that holds,
    /// and is never put in force.
    #[serde(skip)]
    pub tag: Option<String>,
}

/// What a policy version's tag is made under.
pub const VERSION_TAG_DOMAIN: &str = "paygate-policy-version-v1\n";

impl PolicyVersion {
    /// What its tag binds: every field but the tag.
    pub fn tag_fields(&self) -> Value {
        json!([
            self.version,
            self.document,
            self.author_iss,
            self.author_sub,
            self.reason,
            self.approver_iss,
            self.approver_sub,
            self.proposal_id,
            self.created_at,
        ])
    }
}

/// Where a proposed change stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum ProposalStatus {
    Pending,
    Applied,
    Rejected,
}

impl ProposalStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ProposalStatus::Pending => "pending",
            ProposalStatus::Applied => "applied",
            ProposalStatus::Rejected => "rejected",
        }
    }
    pub fn parse(s: &str) -> Option<ProposalStatus> {
        match s {
            "pending" => Some(ProposalStatus::Pending),
            "applied" => Some(ProposalStatus::Applied),
            "rejected" => Some(ProposalStatus::Rejected),
            _ => None,
        }
    }
}

/// A widening change waiting for a second operator (or decided).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PolicyProposal {
    pub id: String,
    /// It applies only while this is still the newest version.
    pub base_version: i64,
    pub document: String,
    pub author_iss: String,
    pub author_sub: String,
    pub reason: String,
    pub created_at: UnixSecs,
    pub status: ProposalStatus,
    pub decided_iss: Option<String>,
    pub decided_sub: Option<String>,
    pub decided_at: Option<UnixSecs>,
    pub applied_version: Option<i64>,
    /// The gateway's tag over the proposal (`tag_fields`; `audit_chain::row_tag` under
    /// [`PROPOSAL_TAG_DOMAIN`]): a proposal a database writer inserted, re-authored or re-opened
    /// is never decided.
    #[serde(skip)]
    pub tag: Option<String>,
}

/// What a proposal's tag is made under.
pub const PROPOSAL_TAG_DOMAIN: &str = "paygate-policy-proposal-v1\n";

impl PolicyProposal {
    /// What its tag binds: what its author wrote and where it stands (status, decider, applied
    /// version). The gateway tags it again as it is decided, so a decided proposal set back to
    /// pending in the database is never decided again.
    pub fn tag_fields(&self) -> Value {
        json!([
            self.id,
            self.base_version,
            self.document,
            self.author_iss,
            self.author_sub,
            self.reason,
            self.created_at,
            self.status.as_str(),
            self.decided_iss,
            self.decided_sub,
            self.decided_at,
            self.applied_version,
        ])
    }

    /// Written by no operator the gateway authenticated: the config file at start, or
    /// `paygate policy import` (whose `--author` is a claim). Operators' tokens always name an
    /// issuer. Such a proposal is never one operator's second pair of eyes: approving one that
    /// widens only adopts it (`gateway::policy`), and a second operator approves that.
    pub fn is_unauthenticated(&self) -> bool {
        self.author_iss.is_empty()
    }
}

/// Who may decide a proposal: never its author (four eyes), under the rule approvals use
/// (`rules::authority`): a person counts once whatever issuer vouches for them, so the author
/// under a second trusted issuer is still the author.
pub fn may_decide(p: &PolicyProposal, decider_sub: &str) -> bool {
    !super::rules::authority::acts_on_itself(
        decider_sub,
        super::rules::authority::Target { agent: &p.author_sub, user: None },
    )
}

#[cfg(test)]
#[path = "policy_doc_tests.rs"]
mod tests;
