//! Effective authority: what a change between two policy versions does to each principal. Whether
//! a change widens is decided here, never from the list of named differences
//! (`policy_doc::changes`, which is for people): for every principal any profile can tell apart —
//! each issuer a profile is bound to, each agent subject, each user agents act for, each (agent,
//! user) pair, each client id, and "anyone else" at every one of those — the profile it resolves
//! to before and after (`Profiles::resolve`'s own order, first match in a list included) is
//! compared in every dimension of authority. One dimension wider for one principal: the change
//! widens, and needs a second, distinct operator.
//!
//! Principals are compared by class, not one by one: two subjects that resolve to the same
//! profiles at the subject level, in both versions, are the same to every rule, so the work is
//! bounded by the number of distinct (before, after) profile pairs, never by the product of names.
//! Pure: no I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt::Display;
use std::hash::Hash;
use std::sync::Arc;

use serde::Serialize;
use serde_json::{Value, json};

use super::money::{Currency, format_minor};
use super::payee::{PayeeMode, PayeeRules};
use super::policy::{MatchKeys, Profile, Profiles};
use super::policy_doc::{Change, LivePolicy};

/// A principal as profiles match it; `None`: any value no profile names (or, for `user` and
/// `client_id`, none at all).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Principal {
    pub issuer: Option<String>,
    pub subject: Option<String>,
    pub user: Option<String>,
    pub client_id: Option<String>,
}

/// What a change does to one class of principals: the profile each resolved to, and every
/// dimension of authority that differs.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AuthorityChange {
    /// One principal of the class (the first by name); every principal of it changes alike.
    pub principal: Principal,
    /// The profile it resolved to before, and after.
    pub before: String,
    pub after: String,
    /// Some dimension is wider after: a second operator must approve.
    pub widens: bool,
    /// Paths relative to the profile: `autonomous_limit.KES`, `allowed_accounts+`, `payees.mode`…
    pub dimensions: Vec<Change>,
}

type Id = usize;
type Pair = (Option<Arc<Profile>>, Option<Arc<Profile>>);
type Key = (Option<Id>, Option<Id>);
/// The profiles one class of principals resolves to, before and after, with its smallest example.
type Realized = HashMap<(Id, Id), (Principal, (Arc<Profile>, Arc<Profile>))>;

fn id(p: &Arc<Profile>) -> Id {
    Arc::as_ptr(p) as Id
}

fn key(p: &Pair) -> Key {
    (p.0.as_ref().map(id), p.1.as_ref().map(id))
}

/// An issuer no profile is bound to: a NUL never appears in a configured issuer.
const ANY_OTHER_ISSUER: &str = "\u{0}";

/// Keep the smallest example of each class, so the answer does not depend on hashing order.
fn keep<K: Hash + Eq, V>(map: &mut HashMap<K, (Principal, V)>, k: K, principal: Principal, v: V) {
    match map.get_mut(&k) {
        Some(e) if e.0 <= principal => {}
        Some(e) => *e = (principal, v),
        None => {
            map.insert(k, (principal, v));
        }
    }
}

fn principal(issuer: Option<&str>, subject: Option<&str>, user: Option<&str>, client: Option<&str>) -> Principal {
    Principal {
        issuer: issuer.map(str::to_string),
        subject: subject.map(str::to_string),
        user: user.map(str::to_string),
        client_id: client.map(str::to_string),
    }
}

/// The first (user, agent) of these members that no profile names as a pair (`None` in a member:
/// a value no profile names, so never a named pair); `None` when every combination is named.
fn unnamed_pair<'a>(
    users: &[Option<&'a str>],
    subjects: &[Option<&'a str>],
    pairs: &HashSet<(&str, &str)>,
) -> Option<(Option<&'a str>, Option<&'a str>)> {
    users.iter().flat_map(|u| subjects.iter().map(move |s| (*u, *s))).find(|(u, s)| match (u, s) {
        (Some(u), Some(s)) => !pairs.contains(&(*s, *u)),
        _ => true,
    })
}

/// Values of one matching level grouped by what they resolve to in both versions.
struct Classes<'a> {
    /// Class → (its profiles, its members in name order; `None`: a value no profile names).
    by_key: HashMap<Key, (Pair, Vec<Option<&'a str>>)>,
    of: HashMap<&'a str, Key>,
}

fn classes<'a>(names: &'a BTreeSet<String>, look: impl Fn(&str) -> Pair, with_unnamed: bool) -> Classes<'a> {
    let mut c = Classes { by_key: HashMap::new(), of: HashMap::new() };
    let unnamed = with_unnamed.then_some((None, (None, None)));
    for (name, pair) in names.iter().map(|n| (Some(n.as_str()), look(n))).chain(unnamed) {
        let k = key(&pair);
        if let Some(n) = name {
            c.of.insert(n, k);
        }
        c.by_key.entry(k).or_insert_with(|| (pair, Vec::new())).1.push(name);
    }
    c
}

/// Every class of principals whose effective profile differs between `before` and `after` in
/// name or in some dimension of authority, smallest example first.
pub fn compare(before: &Profiles, after: &Profiles) -> Vec<AuthorityChange> {
    let mut keys = MatchKeys::default();
    before.match_keys(&mut keys);
    after.match_keys(&mut keys);
    let both = |f: &dyn Fn(&Profiles) -> Option<Arc<Profile>>| -> Pair { (f(before), f(after)) };
    let mut realized: Realized = HashMap::new();
    let issuers = keys.issuers.iter().map(|i| Some(i.as_str())).chain([None]);
    for issuer in issuers {
        let iss = issuer.unwrap_or(ANY_OTHER_ISSUER);
        // Levels pair → user → subject, as (before, after) still undecided or decided.
        let mut heads: HashMap<Key, (Principal, Pair)> = HashMap::new();
        let subjects = classes(&keys.subjects, |s| both(&|p| p.for_subject(iss, s)), true);
        for (k, (pair, members)) in &subjects.by_key {
            // No user (a token of the agent's own): the subject decides.
            keep(&mut heads, *k, principal(issuer, members[0], None, None), pair.clone());
        }
        let users = classes(&keys.users, |u| both(&|p| p.for_user(iss, u)), false);
        let pair_set: HashSet<(&str, &str)> = keys.pairs.iter().map(|(s, u)| (s.as_str(), u.as_str())).collect();
        for (s, u) in &keys.pairs {
            let first =
                |p: &Profiles| p.for_pair(iss, s, u).or_else(|| p.for_user(iss, u)).or_else(|| p.for_subject(iss, s));
            let pair = both(&first);
            keep(&mut heads, key(&pair), principal(issuer, Some(s), Some(u), None), pair);
        }
        // A user with an agent they name in no pair: the user, then the subject. (Each class pair
        // costs one look plus the named pairs it skips: bounded by the pairs, not their product.)
        for ((ub, ua), umembers) in users.by_key.values() {
            for ((sb, sa), smembers) in subjects.by_key.values() {
                let Some((u, s)) = unnamed_pair(umembers, smembers, &pair_set) else {
                    continue; // every such (agent, user) is a pair some profile names
                };
                let pair = (ub.clone().or_else(|| sb.clone()), ua.clone().or_else(|| sa.clone()));
                keep(&mut heads, key(&pair), principal(issuer, s, u, None), pair);
            }
        }
        // Then the client id, then the default.
        let clients = classes(&keys.clients, |c| both(&|p| p.for_client(iss, c)), true);
        for (example, (hb, ha)) in heads.into_values() {
            let undecided = hb.is_none() || ha.is_none();
            let tails: Vec<(Option<&str>, Pair)> = if undecided {
                clients.by_key.values().map(|(pair, members)| (members[0], pair.clone())).collect()
            } else {
                vec![(None, (None, None))]
            };
            for (client, (cb, ca)) in tails {
                let b = hb.clone().or(cb).unwrap_or_else(|| before.default_profile());
                let a = ha.clone().or(ca).unwrap_or_else(|| after.default_profile());
                let mut p = example.clone();
                p.client_id = client.map(str::to_string);
                keep(&mut realized, (id(&b), id(&a)), p, (b, a));
            }
        }
    }
    let mut out: Vec<AuthorityChange> = realized
        .into_values()
        .filter_map(|(principal, (b, a))| {
            let dimensions = dimensions(&b, &a);
            (b.name != a.name || !dimensions.is_empty()).then(|| AuthorityChange {
                principal,
                before: b.name.clone(),
                after: a.name.clone(),
                widens: dimensions.iter().any(|d| d.widens),
                dimensions,
            })
        })
        .collect();
    out.sort_by(|x, y| (!x.widens, &x.principal).cmp(&(!y.widens, &y.principal)));
    out
}

/// Tool governance, the same for every principal: a tool enabled again, or a tool no longer
/// always needing a human, widens.
pub fn governance(before: &LivePolicy, after: &LivePolicy) -> Vec<Change> {
    let LivePolicy { version: _, profiles: _, disabled, approval_required } = after;
    let mut out = Vec::new();
    set_dimension(&mut out, "tools.disabled", &before.disabled, disabled, false);
    set_dimension(&mut out, "tools.approval_required", &before.approval_required, approval_required, false);
    out
}

/// `+`: added, `-`: taken away; `added_widens`: whether adding lets an agent do more.
fn set_dimension<T: Ord + Display>(
    out: &mut Vec<Change>,
    path: &str,
    b: &BTreeSet<T>,
    a: &BTreeSet<T>,
    added_widens: bool,
) {
    let show = |s: Vec<&T>| json!(s.iter().map(|x| x.to_string()).collect::<Vec<_>>());
    let added: Vec<&T> = a.difference(b).collect();
    let removed: Vec<&T> = b.difference(a).collect();
    if !added.is_empty() {
        out.push(Change { path: format!("{path}+"), before: Value::Null, after: show(added), widens: added_widens });
    }
    if !removed.is_empty() {
        out.push(Change { path: format!("{path}-"), before: show(removed), after: Value::Null, widens: !added_widens });
    }
}

/// What a missing entry of a per-currency (or per-tool) bound means.
#[derive(Clone, Copy)]
enum Absent {
    /// Nothing without a human (an autonomous limit, a user's approval tier).
    Zero,
    /// No bound at all (a daily budget, a cap, a quota).
    Unbounded,
}

fn bound<K: Ord + Hash + Copy + Display, V: Copy + Into<i64>>(
    out: &mut Vec<Change>,
    path: &str,
    b: &HashMap<K, V>,
    a: &HashMap<K, V>,
    absent: Absent,
    show: impl Fn(i64, K) -> Value,
) {
    let all: BTreeSet<K> = b.keys().chain(a.keys()).copied().collect();
    for k in all {
        let (x, y) = (b.get(&k).map(|v| (*v).into()), a.get(&k).map(|v| (*v).into()));
        if x == y {
            continue;
        }
        let effective = |v: Option<i64>| match (v, absent) {
            (Some(v), _) => i128::from(v),
            (None, Absent::Zero) => 0,
            (None, Absent::Unbounded) => i128::MAX,
        };
        out.push(Change {
            path: format!("{path}.{k}"),
            before: x.map_or(Value::Null, |v| show(v, k)),
            after: y.map_or(Value::Null, |v| show(v, k)),
            widens: effective(y) > effective(x),
        });
    }
}

fn money(v: i64, c: Currency) -> Value {
    json!(format_minor(v, c))
}

fn number(out: &mut Vec<Change>, path: &str, b: i64, a: i64, larger_widens: bool) {
    let larger = match a.cmp(&b) {
        std::cmp::Ordering::Equal => return,
        order => order == std::cmp::Ordering::Greater,
    };
    out.push(Change { path: path.into(), before: json!(b), after: json!(a), widens: larger == larger_widens });
}

fn strictness(mode: PayeeMode) -> u8 {
    match mode {
        PayeeMode::Open => 0,
        PayeeMode::Known => 1,
        PayeeMode::AllowList => 2,
    }
}

/// Whether the change from `before` to `after` lets `person` (a token subject under `issuer`) do
/// more where a profile names them: as an agent (a profile's `subjects`) — on its own token or
/// acting for anyone, under any client id — or as the person agents act for (a profile's `users`,
/// or a pair), whichever agent — under any issuer, since a person counts once whatever
/// issuer vouches for them (`issuer` is the operator's own, asked with every bound one). An operator
/// for whom this holds is acting on themself when they approve the change (`rules::authority`):
/// another operator decides it.
///
/// `acted_for_by`: the agents known to have acted for `person` (the store's audit trail): what a
/// change does to those pairs is theirs too, however the pair resolves (the agent's own profile,
/// the default), even where no profile names the person.
pub fn widens_for(before: &Profiles, after: &Profiles, issuer: &str, person: &str, acted_for_by: &[String]) -> bool {
    let mut keys = MatchKeys::default();
    before.match_keys(&mut keys);
    after.match_keys(&mut keys);
    // A name no profile names (a NUL never appears in a configured one): "anyone else".
    const OTHER: &str = "\u{0}";
    // As an agent: on its own token, and for each person a profile names it with (acting for
    // someone else, the rest is that person's authority, judged under their name below).
    let paired = keys.pairs.iter().filter(|(s, _)| s == person).map(|(_, u)| Some(u.as_str()));
    let users: Vec<Option<&str>> = paired.chain([None, Some(OTHER)]).collect();
    let subjects: Vec<&str> = keys.subjects.iter().map(String::as_str).chain([OTHER]).collect();
    let clients: Vec<Option<&str>> = keys.clients.iter().map(|c| Some(c.as_str())).chain([None]).collect();
    // Only where a profile names the person: a change to what everyone else (or every agent acting
    // for anyone) may do is not theirs alone, or no operator could ever approve one.
    let named_agent = keys.subjects.contains(person);
    let named_user = keys.users.contains(person) || keys.pairs.iter().any(|(_, u)| u == person);
    let issuers: Vec<&str> = keys.issuers.iter().map(String::as_str).chain([issuer, OTHER]).collect();
    issuers.iter().any(|iss| {
        let wider = |subject: &str, user: Option<&str>, client: Option<&str>| {
            let (b, a) = (before.resolve(iss, subject, user, client), after.resolve(iss, subject, user, client));
            dimensions(&b, &a).iter().any(|d| d.widens)
        };
        let as_agent = named_agent && users.iter().any(|u| clients.iter().any(|c| wider(person, *u, *c)));
        let as_user = named_user && subjects.iter().any(|s| clients.iter().any(|c| wider(s, Some(person), *c)));
        let their_pairs = acted_for_by.iter().any(|a| clients.iter().any(|c| wider(a, Some(person), *c)));
        as_agent || as_user || their_pairs
    })
}

/// Every dimension of authority in which `a` differs from `b`, each marked widening or not.
/// Every field of `Profile` is named here (the match is exhaustive): a field added later does not
/// compile until it says whether it is authority.
pub fn dimensions(b: &Profile, a: &Profile) -> Vec<Change> {
    let Profile {
        // Who it is and whom it matches: not authority (matching is compared by resolving).
        name: _,
        issuer: _,
        allowed_accounts,
        autonomous_limit_minor,
        daily_limit_minor,
        daily_refund_limit_minor,
        daily_payments_max,
        calls_per_minute,
        tool_calls_per_minute,
        user_approval_max_minor,
        passkey_required,
        payees,
    } = a;
    let PayeeRules { mode, cooling_off_secs, new_payee_limit_minor, cooling_off_total_minor, daily_cap_minor } = payees;
    let mut out = Vec::new();
    let accounts = |p: &Profile| p.allowed_accounts.iter().map(|x| x.as_str().to_string()).collect::<BTreeSet<_>>();
    let after_accounts: BTreeSet<String> = allowed_accounts.iter().map(|x| x.as_str().to_string()).collect();
    set_dimension(&mut out, "allowed_accounts", &accounts(b), &after_accounts, true);
    bound(&mut out, "autonomous_limit", &b.autonomous_limit_minor, autonomous_limit_minor, Absent::Zero, money);
    bound(&mut out, "daily_limit", &b.daily_limit_minor, daily_limit_minor, Absent::Unbounded, money);
    bound(
        &mut out,
        "daily_refund_limit",
        &b.daily_refund_limit_minor,
        daily_refund_limit_minor,
        Absent::Unbounded,
        money,
    );
    number(&mut out, "daily_payments_max", b.daily_payments_max, *daily_payments_max, true);
    number(&mut out, "calls_per_minute", i64::from(b.calls_per_minute), i64::from(*calls_per_minute), true);
    let tools = |m: &HashMap<String, u32>| m.iter().map(|(k, v)| (k.clone(), *v)).collect::<BTreeMap<String, u32>>();
    let (tb, ta) = (tools(&b.tool_calls_per_minute), tools(tool_calls_per_minute));
    for t in tb.keys().chain(ta.keys()).collect::<BTreeSet<_>>() {
        let (x, y) = (tb.get(t), ta.get(t));
        // No quota for a tool: unbounded (a quota's largest value is still a bound).
        let effective = |v: Option<&u32>| v.map_or(i64::MAX, |n| i64::from(*n));
        let larger = match effective(y).cmp(&effective(x)) {
            std::cmp::Ordering::Equal => continue,
            order => order == std::cmp::Ordering::Greater,
        };
        out.push(Change {
            path: format!("tool_calls_per_minute.{t}"),
            before: json!(x),
            after: json!(y),
            widens: larger,
        });
    }
    bound(&mut out, "user_approval_max", &b.user_approval_max_minor, user_approval_max_minor, Absent::Zero, money);
    if b.passkey_required != *passkey_required {
        out.push(Change {
            path: "passkey_required".into(),
            before: json!(b.passkey_required),
            after: json!(passkey_required),
            widens: !passkey_required,
        });
    }
    if b.payees.mode != *mode {
        out.push(Change {
            path: "payees.mode".into(),
            before: json!(b.payees.mode.as_str()),
            after: json!(mode.as_str()),
            widens: strictness(*mode).cmp(&strictness(b.payees.mode)) == std::cmp::Ordering::Less,
        });
    }
    // A shorter wait before a new payee's first payment widens.
    number(&mut out, "payees.cooling_off_secs", b.payees.cooling_off_secs, *cooling_off_secs, false);
    bound(
        &mut out,
        "payees.new_payee_limit",
        &b.payees.new_payee_limit_minor,
        new_payee_limit_minor,
        Absent::Unbounded,
        money,
    );
    bound(
        &mut out,
        "payees.cooling_off_total",
        &b.payees.cooling_off_total_minor,
        cooling_off_total_minor,
        Absent::Unbounded,
        money,
    );
    bound(&mut out, "payees.daily_cap", &b.payees.daily_cap_minor, daily_cap_minor, Absent::Unbounded, money);
    out
}

#[cfg(test)]
mod tests {
    use std::collections::HashMap;

    use super::*;
    use crate::domain::ids::AccountId;
    use crate::domain::policy::Matchers;

    fn profile(name: &str, limit_minor: i64) -> Profile {
        Profile {
            name: name.into(),
            issuer: None,
            allowed_accounts: vec![AccountId::parse("acct-A").unwrap()],
            autonomous_limit_minor: [(Currency::parse("KES").unwrap(), limit_minor)].into_iter().collect(),
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

    /// `helper` (an agent), `alice` (a person agents act for), the default; `limits` their
    /// autonomous limits.
    fn policy(helper: i64, alice: i64, default: i64) -> Profiles {
        let names = |s: &[&str]| s.iter().map(|x| x.to_string()).collect::<Vec<_>>();
        let (helper_sub, alice_user) = (names(&["helper"]), names(&["alice"]));
        let mut p = Profiles::new();
        p.add(profile("helper", helper), Matchers { subjects: &helper_sub, ..Default::default() }, false);
        p.add(profile("alice", alice), Matchers { users: &alice_user, ..Default::default() }, false);
        p.add(profile("default", default), Matchers::default(), true);
        p
    }

    #[test]
    fn a_change_widens_for_a_person_where_a_profile_names_them_or_their_known_pairs() {
        let before = policy(100, 100, 100);
        let none: &[String] = &[];
        // alice is named as a user: raising her profile widens for her, not for carol.
        let after = policy(100, 500, 100);
        assert!(widens_for(&before, &after, "iss", "alice", none));
        assert!(!widens_for(&before, &after, "iss", "carol", none));
        // helper is named as an agent: raising its profile widens for helper itself.
        let after = policy(500, 100, 100);
        assert!(widens_for(&before, &after, "iss", "helper", none));
        assert!(!widens_for(&before, &after, "iss", "bob", none), "bob is named nowhere");
        // bob's own pair (helper acting for bob) resolves to helper's profile: his, once known.
        assert!(widens_for(&before, &after, "iss", "bob", &["helper".to_string()]));
        // A narrowing widens for nobody; the default widened widens for no one named elsewhere.
        let narrower = policy(50, 50, 50);
        assert!(!widens_for(&before, &narrower, "iss", "alice", &["helper".to_string()]));
        let wider_default = policy(100, 100, 900);
        assert!(!widens_for(&before, &wider_default, "iss", "alice", none));
        assert!(
            widens_for(&before, &wider_default, "iss", "bob", &["unnamed-bot".to_string()]),
            "a pair on the default"
        );
    }

    fn names(s: &[&str]) -> Vec<String> {
        s.iter().map(|x| x.to_string()).collect()
    }

    /// Each class keeps its smallest example, whatever order examples arrive in.
    #[test]
    fn a_class_keeps_its_smallest_example() {
        let p = |s: &str| principal(None, Some(s), None, None);
        let mut m: HashMap<u8, (Principal, &str)> = HashMap::new();
        for (name, v) in [("m", "first"), ("c", "smaller"), ("x", "larger"), ("c", "equal")] {
            keep(&mut m, 1, p(name), v);
        }
        assert_eq!(m[&1], (p("c"), "smaller"), "the smallest, and the first of equals");
    }

    /// The example of an (agent, user) combination no pair names: named pairs are skipped, a
    /// value no profile names is never a named pair, and none when every combination is named.
    #[test]
    fn an_unnamed_combination_is_found_past_the_named_pairs() {
        let pairs: HashSet<(&str, &str)> = [("bot", "alice"), ("bot", "bob"), ("aid", "alice")].into_iter().collect();
        let (alice, bob, bot, aid) = (Some("alice"), Some("bob"), Some("bot"), Some("aid"));
        assert_eq!(unnamed_pair(&[alice], &[bot], &pairs), None, "the only combination is a named pair");
        assert_eq!(unnamed_pair(&[alice, bob], &[bot], &pairs), None);
        assert_eq!(unnamed_pair(&[alice, bob], &[bot, aid], &pairs), Some((bob, aid)));
        assert_eq!(unnamed_pair(&[alice], &[bot, None], &pairs), Some((alice, None)));
        assert_eq!(unnamed_pair(&[None], &[bot], &pairs), Some((None, bot)));
    }

    /// Tool governance: a tool enabled again, or freed from always needing a human, widens; the
    /// opposite narrows; nothing changed, nothing listed.
    #[test]
    fn tools_enabled_again_or_freed_from_approval_widen() {
        let live = |disabled: &[&str], approval: &[&str]| LivePolicy {
            disabled: disabled.iter().map(|s| s.to_string()).collect(),
            approval_required: approval.iter().map(|s| s.to_string()).collect(),
            ..LivePolicy::none()
        };
        let before = live(&["send_payment"], &["create_payment"]);
        assert!(governance(&before, &live(&["send_payment"], &["create_payment"])).is_empty());
        let changes = governance(&before, &live(&["refund_payment"], &[]));
        let got: Vec<(&str, bool)> = changes.iter().map(|c| (c.path.as_str(), c.widens)).collect();
        assert_eq!(
            got,
            vec![("tools.disabled+", false), ("tools.disabled-", true), ("tools.approval_required-", true),]
        );
        assert_eq!(changes[1].before, json!(["send_payment"]));
    }

    /// No change, no class listed; a widening class is listed before a narrowing one.
    #[test]
    fn compare_lists_only_changed_classes_widening_first() {
        let before = policy(100, 100, 100);
        assert!(compare(&before, &before).is_empty(), "the same policy changes nobody");
        let mixed = policy(500, 50, 100);
        let out = compare(&before, &mixed);
        assert!(out.len() >= 2, "{out:?}");
        assert!(out[0].widens && !out[out.len() - 1].widens, "{out:?}");
        assert!(out.iter().any(|c| c.before == "helper" && c.widens));
        assert!(out.iter().any(|c| c.before == "alice" && !c.widens));
        // A profile renamed, nothing else: listed (who resolves where changed), widening nothing.
        let mut renamed = Profiles::new();
        let (helper_sub, alice_user) = (names(&["helper"]), names(&["alice"]));
        renamed.add(profile("helper2", 100), Matchers { subjects: &helper_sub, ..Default::default() }, false);
        renamed.add(profile("alice", 100), Matchers { users: &alice_user, ..Default::default() }, false);
        renamed.add(profile("default", 100), Matchers::default(), true);
        let out = compare(&before, &renamed);
        assert!(out.iter().any(|c| c.before == "helper" && c.after == "helper2" && !c.widens), "{out:?}");
    }

    /// A principal no longer named by its subject falls through to its client id's profile (not
    /// straight to the default): that is where its authority is judged after the change.
    #[test]
    fn a_principal_that_falls_through_is_judged_at_its_client_id() {
        let (bot, web) = (names(&["bot"]), names(&["web"]));
        let mut before = Profiles::new();
        before.add(profile("bot", 100), Matchers { subjects: &bot, ..Default::default() }, false);
        before.add(profile("web", 900), Matchers { client_ids: &web, ..Default::default() }, false);
        before.add(profile("default", 0), Matchers::default(), true);
        let mut after = Profiles::new();
        after.add(profile("web", 900), Matchers { client_ids: &web, ..Default::default() }, false);
        after.add(profile("default", 0), Matchers::default(), true);
        let out = compare(&before, &after);
        let bot_via_web = out
            .iter()
            .find(|c| c.principal.subject.as_deref() == Some("bot") && c.principal.client_id.as_deref() == Some("web"))
            .unwrap_or_else(|| panic!("{out:?}"));
        assert_eq!((bot_via_web.after.as_str(), bot_via_web.widens), ("web", true));
    }

    /// Every dimension of authority, each way: which direction widens, and what is shown.
    #[test]
    fn every_dimension_says_which_way_widens() {
        use crate::domain::payee::PayeeMode;
        let kes = Currency::parse("KES").unwrap();
        let base = profile("p", 100);
        let judged = |edit: &dyn Fn(&mut Profile)| {
            let mut a = base.clone();
            edit(&mut a);
            let out = dimensions(&base, &a);
            assert_eq!(out.len(), 1, "{out:?}");
            (out[0].path.clone(), out[0].widens, out[0].before.clone(), out[0].after.clone())
        };
        let widens = |edit: &dyn Fn(&mut Profile)| judged(edit).1;
        assert!(dimensions(&base, &base.clone()).is_empty());
        assert!(widens(&|p| p.allowed_accounts.push(AccountId::parse("acct-Z").unwrap())));
        assert!(!widens(&|p| p.allowed_accounts.clear()));
        assert_eq!(
            judged(&|p| {
                p.autonomous_limit_minor.insert(kes, 250);
            }),
            ("autonomous_limit.KES".into(), true, json!("1.00"), json!("2.50"))
        );
        assert!(!widens(&|p| p.autonomous_limit_minor.clear()), "no autonomous limit: nothing without a human");
        assert!(
            !widens(&|p| {
                p.daily_limit_minor.insert(kes, 100);
            }),
            "a daily limit where there was none narrows"
        );
        assert!(widens(&|p| p.daily_payments_max = 11));
        assert!(!widens(&|p| p.daily_payments_max = 9));
        assert!(widens(&|p| p.calls_per_minute = 11));
        assert!(!widens(&|p| p.calls_per_minute = 9));
        assert!(
            !widens(&|p| {
                p.tool_calls_per_minute.insert("create_payment".into(), 5);
            }),
            "a tool quota where there was none narrows"
        );
        let mut quota = base.clone();
        quota.tool_calls_per_minute.insert("create_payment".into(), 5);
        let faster = {
            let mut q = quota.clone();
            q.tool_calls_per_minute.insert("create_payment".into(), 6);
            q
        };
        assert!(dimensions(&quota, &faster)[0].widens);
        assert!(!dimensions(&faster, &quota)[0].widens);
        assert!(dimensions(&quota, &base)[0].widens, "the quota removed");
        assert!(widens(&|p| {
            p.user_approval_max_minor.insert(kes, 1);
        }));
        assert!(!widens(&|p| p.passkey_required = true));
        let mut keyed = base.clone();
        keyed.passkey_required = true;
        assert_eq!(dimensions(&keyed, &base)[0].path, "passkey_required");
        assert!(dimensions(&keyed, &base)[0].widens, "a passkey no longer required");
        for (from, to, wider) in [
            (PayeeMode::Open, PayeeMode::Known, false),
            (PayeeMode::Known, PayeeMode::AllowList, false),
            (PayeeMode::Open, PayeeMode::AllowList, false),
            (PayeeMode::Known, PayeeMode::Open, true),
            (PayeeMode::AllowList, PayeeMode::Known, true),
            (PayeeMode::AllowList, PayeeMode::Open, true),
        ] {
            let (mut b, mut a) = (base.clone(), base.clone());
            b.payees.mode = from;
            a.payees.mode = to;
            let out = dimensions(&b, &a);
            assert_eq!((out.len(), out[0].widens), (1, wider), "{from:?} -> {to:?}");
        }
        let mut waiting = base.clone();
        waiting.payees.cooling_off_secs = 3600;
        assert!(dimensions(&waiting, &base)[0].widens, "a shorter cooling-off widens");
        assert!(!dimensions(&base, &waiting)[0].widens);
        assert!(!widens(&|p| {
            p.payees.new_payee_limit_minor.insert(kes, 100);
        }));
        assert!(!widens(&|p| {
            p.payees.cooling_off_total_minor.insert(kes, 100);
        }));
        assert!(!widens(&|p| {
            p.payees.daily_cap_minor.insert(kes, 100);
        }));
        assert!(!widens(&|p| {
            p.daily_refund_limit_minor.insert(kes, 100);
        }));
    }

    /// A person named only in a pair — as its agent, or as the person it acts for — is named: a
    /// change to that pair's profile widens for them.
    #[test]
    fn a_person_named_only_in_a_pair_is_named() {
        let (bot, alice, other) = (names(&["bot"]), names(&["alice"]), names(&["other-bot"]));
        let helper = names(&["helper"]);
        let build = |limit: i64| {
            let mut p = Profiles::new();
            p.add(profile("pair", limit), Matchers { subjects: &bot, users: &alice, ..Default::default() }, false);
            p.add(profile("helper", limit), Matchers { subjects: &helper, ..Default::default() }, false);
            p.add(
                profile("other", 100),
                Matchers { subjects: &other, users: &names(&["carol"]), ..Default::default() },
                false,
            );
            p.add(profile("default", 100), Matchers::default(), true);
            p
        };
        let (before, after) = (build(100), build(900));
        let none: &[String] = &[];
        assert!(widens_for(&before, &after, "iss", "bot", none), "the pair's agent");
        assert!(widens_for(&before, &after, "iss", "alice", none), "the pair's person");
        // carol is named (as the person other-bot acts for): the helper agent acting for her
        // would now do more, so the change is hers too; other-bot's own authority is unchanged.
        assert!(widens_for(&before, &after, "iss", "carol", none));
        assert!(!widens_for(&before, &after, "iss", "other-bot", none));
        // dave is named nowhere: the helper agent's widening is not his, though an agent acting
        // for him would resolve to it (pairs naming others do not name him).
        assert!(!widens_for(&before, &after, "iss", "dave", none));
    }
}
