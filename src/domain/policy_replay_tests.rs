//! The dry run: exactly the calls whose answer a proposed version changes, each side's budgets
//! replayed in order, and the totals per agent and currency.

use super::*;
use crate::domain::ids::AccountId;
use crate::domain::money::Money;
use crate::domain::policy_doc::PolicyDocument;
use serde_json::json;

/// 2026-12-05T00:00:00Z.
const DAY: i64 = 1_796_428_800;

fn kes(s: &str) -> Money {
    Money::parse(s, Currency::parse("KES").unwrap()).unwrap()
}
fn acct(s: &str) -> AccountId {
    AccountId::parse(s).unwrap()
}

/// One profile for dev-agent: acct-A and acct-B, KES 1,000 alone, KES 10,000 a day; `edit` on top.
fn policy(version: i64, edit: impl FnOnce(&mut serde_json::Value)) -> LivePolicy {
    let mut v = json!({
        "policy": {"default_profile": "dev", "profiles": [{
            "name": "dev",
            "subjects": ["dev-agent"],
            "allowed_accounts": ["acct-A", "acct-B"],
            "autonomous_limit": {"KES": "1000.00"},
            "daily_limit": {"KES": "10000.00"},
        }]},
        "tools": {},
    });
    edit(&mut v);
    serde_json::from_value::<PolicyDocument>(v).unwrap().live(version, None)
}
fn v1() -> LivePolicy {
    policy(1, |_| {})
}

fn pay(amount: &str) -> Question {
    Question::transfer(&acct("acct-A"), &acct("acct-B"), kes(amount))
}

/// An audited call by dev-agent at `at`, answered `decision` under version 1.
fn rec(seq: i64, at: i64, q: &Question, decision: &str) -> AuditRecord {
    AuditRecord {
        seq,
        at,
        correlation_id: format!("c{seq}"),
        principal_iss: "https://iss".into(),
        principal_sub: "dev-agent".into(),
        principal_user: None,
        tool: q.tool.clone(),
        decision: decision.into(),
        code: None,
        idempotency_key: None,
        payment_id: None,
        approval_id: None,
        detail: None,
        repeats: 1,
        policy_version: Some(1),
        intent: Some(q.canonical()),
        tag: None,
    }
}

fn run(history: &[AuditRecord], proposed: &LivePolicy) -> Report {
    let v1 = v1();
    simulate(history, |v| (v == 1).then_some(&v1), proposed)
}
/// (seq, before, after) of each changed call.
fn changed(r: &Report) -> Vec<(i64, Outcome, Outcome)> {
    r.changed.iter().map(|c| (c.seq, c.before.clone(), c.after.clone())).collect()
}
fn refused(code: &str) -> Outcome {
    Outcome::Refused(code.into())
}
use Outcome::{Allowed, ApprovalRequired};

#[test]
fn a_lower_limit_reports_exactly_the_calls_it_would_send_to_a_human() {
    let mut mandated = pay("800.00");
    mandated.mandated = true;
    let history = [
        rec(1, DAY + 10, &pay("800.00"), "allowed"),
        rec(2, DAY + 20, &pay("500.00"), "allowed"),
        rec(3, DAY + 30, &pay("2000.00"), "approval_required"),
        rec(4, DAY + 40, &pay("500.01"), "allowed"),
        rec(5, DAY + 50, &mandated, "allowed"), // a human approved exactly this call
    ];
    let lower = policy(0, |v| v["policy"]["profiles"][0]["autonomous_limit"] = json!({"KES": "500.00"}));
    let r = run(&history, &lower);
    assert_eq!((r.replayed, r.skipped), (5, 0));
    assert_eq!(changed(&r), [(1, Allowed, ApprovalRequired), (4, Allowed, ApprovalRequired)]);
    let c = &r.changed[0];
    assert_eq!(
        (c.at.as_str(), c.correlation_id.as_str(), c.principal_iss.as_str(), c.agent.as_str(), c.user.as_deref()),
        ("2026-12-05T00:00:10Z", "c1", "https://iss", "dev-agent", None)
    );
    assert_eq!(
        (c.tool.as_str(), c.payee.as_str(), c.amount.as_str(), c.currency.as_str(), c.version),
        ("create_payment", "acct-B", "800.00", "KES", 1)
    );
    assert_eq!(
        r.totals,
        [Totals {
            agent: "dev-agent".into(),
            currency: "KES".into(),
            stricter: 2,
            stricter_amount: "1300.01".into(),
            looser: 0,
            looser_amount: "0.00".into(),
        }]
    );

    // Raising it is the reverse: what needed a human would have gone alone.
    let raise = policy(0, |v| v["policy"]["profiles"][0]["autonomous_limit"] = json!({"KES": "5000.00"}));
    let r = run(&history, &raise);
    assert_eq!(changed(&r), [(3, ApprovalRequired, Allowed)]);
    assert_eq!((r.totals[0].stricter, r.totals[0].looser, r.totals[0].looser_amount.as_str()), (0, 1, "2000.00"));
    // The version itself: nothing changes.
    let r = run(&history, &v1());
    assert_eq!((r.replayed, r.changed.len(), r.totals.len()), (5, 0, 0));
}

/// Each side spends its own budget in order, per principal, UTC day and kind; a refused call
/// spends nothing; a mandated call is never refused by it; the count is bounded too.
#[test]
fn budgets_are_replayed_in_order_on_each_side() {
    let mut for_alice = rec(5, DAY + 50, &pay("800.00"), "allowed");
    for_alice.principal_user = Some("alice".into());
    let mut refund = pay("800.00");
    refund.kind = "refund".into();
    refund.tool = "refund_payment".into();
    refund.scope = crate::catalogue::scopes::REFUND.into();
    let mut mandated = pay("2000.00");
    mandated.mandated = true;
    let history = [
        rec(1, DAY + 10, &pay("800.00"), "allowed"),
        rec(2, DAY + 20, &pay("800.00"), "allowed"),     // 1,600: over 1,500
        rec(3, DAY + 30, &pay("700.00"), "allowed"),     // 1,500 exactly: #2 spent nothing
        rec(4, DAY + 40, &refund, "allowed"),            // refunds count apart
        for_alice,                                       // so does the agent acting for alice
        rec(6, DAY + 60, &mandated, "allowed"),          // a human approved it
        rec(7, DAY + 86_400, &pay("800.00"), "allowed"), // a new day
        rec(8, DAY + 86_410, &pay("0.01"), "allowed"),
    ];
    let daily = policy(0, |v| v["policy"]["profiles"][0]["daily_limit"] = json!({"KES": "1500.00"}));
    let r = run(&history, &daily);
    assert_eq!(changed(&r), [(2, Allowed, refused("BUDGET_EXCEEDED"))]);
    assert_eq!(r.replayed, 8);

    // Refunds draw on their own limit where one is set.
    let refunds = policy(0, |v| {
        v["policy"]["profiles"][0]["daily_limit"] = json!({"KES": "1500.00"});
        v["policy"]["profiles"][0]["daily_refund_limit"] = json!({"KES": "799.99"});
    });
    let r = run(&history, &refunds);
    assert_eq!(changed(&r), [(2, Allowed, refused("BUDGET_EXCEEDED")), (4, Allowed, refused("BUDGET_EXCEEDED"))]);

    // The count: two calls a day.
    let count = policy(0, |v| v["policy"]["profiles"][0]["daily_payments_max"] = json!(2));
    let r = run(&history, &count);
    assert_eq!(changed(&r), [(3, Allowed, refused("BUDGET_EXCEEDED"))]);

    // Under the version it was decided by, a budget refusal is replayed too: both sides agree.
    let tight = policy(1, |v| v["policy"]["profiles"][0]["daily_limit"] = json!({"KES": "1000.00"}));
    let r = simulate(&history[..2], |_| Some(&tight), &tight);
    assert!(r.changed.is_empty());
    let r = simulate(&history[..2], |_| Some(&tight), &v1());
    assert_eq!(changed(&r), [(2, refused("BUDGET_EXCEEDED"), Allowed)]);
    assert_eq!((r.totals[0].looser, r.totals[0].stricter), (1, 0));
}

/// Tool governance and the accounts a profile allows; a mandated call needs no human.
#[test]
fn governance_and_accounts_are_replayed() {
    let mut mandated = pay("10.00");
    mandated.mandated = true;
    let stk = Question::collect("request_mpesa_payment", &acct("acct-B"), "mpesa-254712345678", kes("10.00"));
    let mut by_alias = rec(4, DAY + 40, &stk, "allowed");
    by_alias.tool = "initiate_stk_push".into();
    let history = [
        rec(1, DAY + 10, &pay("10.00"), "allowed"),
        rec(2, DAY + 20, &mandated, "allowed"),
        rec(3, DAY + 30, &stk, "allowed"),
        by_alias,
    ];
    let disabled = policy(0, |v| v["tools"]["disabled"] = json!(["create_payment"]));
    assert_eq!(
        changed(&run(&history, &disabled)),
        [(1, Allowed, refused("TOOL_DISABLED")), (2, Allowed, refused("TOOL_DISABLED"))]
    );
    // An alias disabled alone: only the calls made by that name.
    let alias = policy(0, |v| v["tools"]["disabled"] = json!(["initiate_stk_push"]));
    assert_eq!(changed(&run(&history, &alias)), [(4, Allowed, refused("TOOL_DISABLED"))]);
    let whole = policy(0, |v| v["tools"]["disabled"] = json!(["request_mpesa_payment"]));
    assert_eq!(
        changed(&run(&history, &whole)),
        [(3, Allowed, refused("TOOL_DISABLED")), (4, Allowed, refused("TOOL_DISABLED"))]
    );
    let human = policy(0, |v| v["tools"]["approval_required"] = json!(["create_payment"]));
    assert_eq!(changed(&run(&history, &human)), [(1, Allowed, ApprovalRequired)], "the mandated call had one");
    let fewer = policy(0, |v| v["policy"]["profiles"][0]["allowed_accounts"] = json!(["acct-A"]));
    let r = run(&history, &fewer);
    assert_eq!(changed(&r).len(), 4);
    assert!(r.changed.iter().all(|c| c.after == refused("ACCOUNT_NOT_ALLOWED")));
    // A refusal for another reason is neither stricter nor looser.
    let r = simulate(&history[..1], |_| Some(&disabled), &fewer);
    assert_eq!(changed(&r), [(1, refused("TOOL_DISABLED"), refused("ACCOUNT_NOT_ALLOWED"))]);
    assert_eq!((r.totals[0].stricter, r.totals[0].looser), (0, 0));
}

/// The agent a call resolves to under each version is the one replayed: profiles by user, and
/// the totals name the agent and the person it acted for.
#[test]
fn calls_resolve_to_their_profile_under_each_version() {
    let mut for_alice = rec(1, DAY + 10, &pay("800.00"), "allowed");
    for_alice.principal_user = Some("alice".into());
    let mut client = pay("800.00");
    client.client_id = Some("billing".into());
    let mut stranger = rec(2, DAY + 20, &client, "allowed");
    stranger.principal_sub = "stranger".into();
    let history = [for_alice, stranger];
    let alice_tighter = policy(0, |v| {
        let dev = v["policy"]["profiles"][0].clone();
        let mut alice = dev.clone();
        alice["name"] = json!("alice");
        alice["subjects"] = json!([]);
        alice["users"] = json!(["alice"]);
        alice["autonomous_limit"] = json!({"KES": "100.00"});
        let mut billing = dev;
        billing["name"] = json!("billing");
        billing["subjects"] = json!([]);
        billing["client_ids"] = json!(["billing"]);
        v["policy"]["profiles"].as_array_mut().unwrap().extend([alice, billing]);
    });
    let r = run(&history, &alice_tighter);
    // The stranger fell to the default profile (acct-A, acct-B, KES 1,000) before, and to the
    // client's (the same) after: unchanged.
    assert_eq!(changed(&r), [(1, Allowed, ApprovalRequired)]);
    assert_eq!(r.changed[0].user.as_deref(), Some("alice"));
    assert_eq!((r.totals[0].agent.as_str(), r.totals[0].stricter_amount.as_str()), ("dev-agent for alice", "800.00"));
    // The client id is asked: with it the stranger gets the client's profile (the default allows nothing).
    let no_default = policy(0, |v| {
        let mut billing = v["policy"]["profiles"][0].clone();
        billing["name"] = json!("billing");
        billing["subjects"] = json!([]);
        billing["client_ids"] = json!(["billing"]);
        v["policy"]["profiles"][0]["allowed_accounts"] = json!([]);
        v["policy"]["profiles"].as_array_mut().unwrap().push(billing);
    });
    let r = run(&history[1..], &no_default);
    assert!(r.changed.is_empty(), "{:?}", r.changed);
}

/// Only the answers policy gave are replayed; a call whose version or intent cannot be read is
/// counted as skipped, never guessed.
#[test]
fn only_judged_calls_are_replayed_and_unreadable_ones_are_skipped() {
    let q = pay("10.00");
    let judged: Vec<AuditRecord> =
        JUDGED.iter().enumerate().map(|(i, d)| rec(i as i64, DAY + i as i64, &q, d)).collect();
    assert!(judged.iter().all(is_judged));
    let mut not = vec![
        rec(20, DAY, &q, "replayed"),
        rec(21, DAY, &q, "mandate_accepted"),
        AuditRecord { intent: None, ..rec(22, DAY, &q, "allowed") },
        AuditRecord { policy_version: None, ..rec(23, DAY, &q, "allowed") },
    ];
    for code in BEFORE_POLICY {
        not.push(AuditRecord { code: Some(code.to_string()), ..rec(24, DAY, &q, "denied") });
    }
    assert!(not.iter().all(|r| !is_judged(r)));
    assert!(is_judged(&AuditRecord { code: Some("BUDGET_EXCEEDED".into()), ..rec(25, DAY, &q, "denied") }));

    let unreadable = [
        AuditRecord { policy_version: Some(9), ..rec(30, DAY, &q, "allowed") },
        AuditRecord { intent: Some("not a question".into()), ..rec(31, DAY, &q, "allowed") },
    ];
    let history: Vec<AuditRecord> = judged.iter().chain(&not).chain(&unreadable).cloned().collect();
    let r = run(&history, &v1());
    assert_eq!((r.replayed, r.skipped), (JUDGED.len() as i64, 2));
}
