//! The policy document: its rules (each refusal at its bound), its live form, and what a change
//! between two versions is called — widening or narrowing — field by field.

use super::*;
use crate::domain::money::Currency;

fn kes() -> Currency {
    Currency::parse("KES").unwrap()
}
fn usd() -> Currency {
    Currency::parse("USD").unwrap()
}
fn money(v: Value) -> MoneyMap {
    serde_json::from_value(v).unwrap()
}
fn high() -> MoneyMap {
    money(json!({"KES": "100000.00"}))
}

/// One profile "dev" for agent dev-agent: two accounts, KES 1,000 alone, KES 10,000 a day.
fn base() -> PolicyDocument {
    serde_json::from_value(json!({"policy": {"default_profile": "dev", "profiles": [{
        "name": "dev",
        "subjects": ["dev-agent"],
        "allowed_accounts": ["acct-A", "acct-B"],
        "autonomous_limit": {"KES": "1000.00"},
        "daily_limit": {"KES": "10000.00"},
    }]}}))
    .unwrap()
}
fn with(f: impl FnOnce(&mut PolicyDocument)) -> PolicyDocument {
    let mut d = base();
    f(&mut d);
    d
}
fn dev(d: &mut PolicyDocument) -> &mut ProfileConfig {
    &mut d.policy.profiles[0]
}
fn refused(d: &PolicyDocument) -> String {
    match d.validate(&high()) {
        Ok(()) => "valid".into(),
        Err(e) => e.to_string(),
    }
}

#[test]
fn the_base_document_is_valid_and_its_defaults_are_the_documented_ones() {
    let d = base();
    assert_eq!(refused(&d), "valid");
    let p = &d.policy;
    assert_eq!((p.refresh_secs, p.simulate_window_max_secs, p.simulate_records_max), (2, 2_592_000, 100_000));
    let dev = &p.profiles[0];
    assert_eq!((dev.daily_payments_max, dev.calls_per_minute, dev.approvals_by.as_str()), (100, 120, "operator"));
    assert_eq!(dev.payees, PayeesConfig::default());
    assert_eq!((dev.payees.mode.as_str(), dev.payees.cooling_off_secs), ("open", 86_400));
}

/// Every rule, just inside and just outside its bound; a refusal names what is wrong.
#[test]
fn every_rule_refuses_at_its_bound_and_names_what_is_wrong() {
    type Edit = Box<dyn Fn(&mut PolicyDocument)>;
    let long = |n: usize| "a".repeat(n);
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "unknown disabled tool",
            Box::new(|d| d.tools.disabled = vec!["nope".into()]),
            "tools: no tool named \"nope\"",
        ),
        (
            "unknown governed tool",
            Box::new(|d| d.tools.approval_required = vec!["nope".into()]),
            "tools: no tool named \"nope\"",
        ),
        ("an alias disabled alone", Box::new(|d| d.tools.disabled = vec!["initiate_stk_push".into()]), "valid"),
        (
            "governance on an alias",
            Box::new(|d| d.tools.approval_required = vec!["initiate_stk_push".into()]),
            "tools.approval_required: \"initiate_stk_push\" is an alias of \"request_mpesa_payment\"",
        ),
        (
            "governance on a router",
            Box::new(|d| d.tools.approval_required = vec!["send_payment".into()]),
            "tools.approval_required: \"send_payment\" runs as the rail's own tool; set it on send_mpesa_payout and send_airtel_payout",
        ),
        ("a router disabled", Box::new(|d| d.tools.disabled = vec!["request_payment".into()]), "valid"),
        (
            "governance on a read",
            Box::new(|d| d.tools.approval_required = vec!["get_balance".into()]),
            "tools.approval_required: \"get_balance\" moves no money",
        ),
        (
            "governance on a money tool",
            Box::new(|d| d.tools.approval_required = vec!["create_payment".into()]),
            "valid",
        ),
        ("empty name", Box::new(|d| dev(d).name = String::new()), "policy profile names are 1-64 printable"),
        (
            "64 characters",
            Box::new(move |d| {
                dev(d).name = long(64);
                d.policy.default_profile = long(64);
            }),
            "valid",
        ),
        ("65 characters", Box::new(move |d| dev(d).name = long(65)), "policy profile names are 1-64 printable"),
        ("a control character", Box::new(|d| dev(d).name = "a\nb".into()), "policy profile names are 1-64 printable"),
        (
            "defined twice",
            Box::new(|d| {
                let again = d.policy.profiles[0].clone();
                d.policy.profiles.push(again);
            }),
            "policy profile \"dev\" is defined twice",
        ),
        (
            "a limit without a budget",
            Box::new(|d| dev(d).autonomous_limit = money(json!({"KES": "1.00", "USD": "1.00"}))),
            "profile \"dev\": USD has an autonomous_limit but no daily_limit",
        ),
        (
            "a user tier for operators",
            Box::new(|d| dev(d).user_approval_max = money(json!({"KES": "10.00"}))),
            "profile \"dev\": user_approval_max needs approvals_by = \"user\"",
        ),
        (
            "users without a tier",
            Box::new(|d| dev(d).approvals_by = "user".into()),
            "profile \"dev\": approvals_by = \"user\" needs user_approval_max (per currency)",
        ),
        (
            "a user tier under the high-risk amount",
            Box::new(|d| {
                dev(d).approvals_by = "user".into();
                dev(d).user_approval_max = money(json!({"KES": "99999.99"}));
            }),
            "valid",
        ),
        (
            "a user tier at the high-risk amount",
            Box::new(|d| {
                dev(d).approvals_by = "user".into();
                dev(d).user_approval_max = money(json!({"KES": "100000.00"}));
            }),
            "profile \"dev\": user_approval_max for KES must be under approvals.high_risk_amount",
        ),
        (
            "a user tier where no amount is high risk",
            Box::new(|d| {
                dev(d).approvals_by = "user".into();
                dev(d).user_approval_max = money(json!({"USD": "1.00"}));
            }),
            "profile \"dev\": user_approval_max for USD must be under approvals.high_risk_amount",
        ),
        (
            "approvals by a robot",
            Box::new(|d| dev(d).approvals_by = "robot".into()),
            "profile \"dev\": approvals_by must be \"operator\" or \"user\", got \"robot\"",
        ),
        (
            "an unknown payee mode",
            Box::new(|d| dev(d).payees.mode = "closed".into()),
            "profile \"dev\": payees.mode must be \"open\", \"known\" or \"allow_list\", got \"closed\"",
        ),
        ("known payees", Box::new(|d| dev(d).payees.mode = "known".into()), "valid"),
        ("an allow-list", Box::new(|d| dev(d).payees.mode = "allow_list".into()), "valid"),
        (
            "no tool to quota",
            Box::new(|d| {
                dev(d).tool_calls_per_minute.insert("nope".into(), 1);
            }),
            "profile \"dev\": no tool named \"nope\"",
        ),
        (
            "a quota on an alias",
            Box::new(|d| {
                dev(d).tool_calls_per_minute.insert("initiate_stk_push".into(), 1);
            }),
            "policy.profiles.tool_calls_per_minute: \"initiate_stk_push\" is an alias",
        ),
        (
            "a quota on a router",
            Box::new(|d| {
                dev(d).tool_calls_per_minute.insert("request_payment".into(), 1);
            }),
            "policy.profiles.tool_calls_per_minute: \"request_payment\" runs as the rail's own tool; set it on request_mpesa_payment and request_airtel_payment",
        ),
        (
            "a quota on a rail tool",
            Box::new(|d| {
                dev(d).tool_calls_per_minute.insert("send_mpesa_payout".into(), 1);
            }),
            "valid",
        ),
        (
            "a default naming nobody",
            Box::new(|d| d.policy.default_profile = "nobody".into()),
            "policy.default_profile \"nobody\" names no profile",
        ),
        (
            "a cooling-off total under the new-payee limit",
            Box::new(|d| {
                dev(d).payees.new_payee_limit = money(json!({"KES": "100.00"}));
                dev(d).payees.cooling_off_total = money(json!({"KES": "99.99"}));
            }),
            "profile \"dev\": payees.cooling_off_total for KES must be at least its new_payee_limit",
        ),
        (
            "a cooling-off total at the new-payee limit",
            Box::new(|d| {
                dev(d).payees.new_payee_limit = money(json!({"KES": "100.00"}));
                dev(d).payees.cooling_off_total = money(json!({"KES": "100.00"}));
            }),
            "valid",
        ),
        (
            "a cooling-off total without a new-payee limit",
            Box::new(|d| dev(d).payees.cooling_off_total = money(json!({"KES": "1.00"}))),
            "valid",
        ),
    ];
    for (what, edit, want) in cases {
        let got = refused(&with(edit));
        assert!(got.starts_with(want), "{what}: {got}");
    }

    // The numeric bounds: min and max in range, one past either end out of it.
    type Field = fn(&mut PolicyDocument) -> &mut i64;
    let numbers: [(&str, Field, i64, i64); 7] = [
        ("policy.profiles.payees.cooling_off_secs", |d| &mut dev(d).payees.cooling_off_secs, 0, COOLING_OFF_SECS_MAX),
        ("policy.profiles.daily_payments_max", |d| &mut dev(d).daily_payments_max, 1, 1_000_000),
        ("policy.profiles.calls_per_minute", |d| &mut dev(d).calls_per_minute, 1, CALLS_PER_MINUTE_MAX),
        ("policy.refresh_secs", |d| &mut d.policy.refresh_secs, 1, 3600),
        ("policy.simulate_window_max_secs", |d| &mut d.policy.simulate_window_max_secs, 3600, 31_536_000),
        ("policy.simulate_records_max", |d| &mut d.policy.simulate_records_max, 100, 1_000_000),
        (
            "policy.profiles.tool_calls_per_minute",
            |d| dev(d).tool_calls_per_minute.entry("create_payment".into()).or_insert(1),
            1,
            CALLS_PER_MINUTE_MAX,
        ),
    ];
    for (key, field, min, max) in numbers {
        for (value, ok) in [(min - 1, false), (min, true), (max, true), (max + 1, false)] {
            let got = refused(&with(|d| *field(d) = value));
            let want = if ok {
                "valid".to_string()
            } else {
                format!("config key {key} = {value} is out of range {min}..={max}")
            };
            assert_eq!(got, want, "{key} = {value}");
        }
    }
}

/// The profile count and the byte size are bounded; each bound is reachable on its own.
#[test]
fn a_document_is_bounded_in_profiles_and_in_bytes() {
    let many = |n: usize| {
        with(|d| {
            let one = d.policy.profiles[0].clone();
            d.policy.profiles = (0..n).map(|i| ProfileConfig { name: format!("p{i}"), ..one.clone() }).collect();
            d.policy.default_profile = "p0".into();
        })
    };
    assert_eq!(refused(&many(PROFILES_MAX)), "valid");
    assert_eq!(refused(&many(PROFILES_MAX + 1)), format!("a policy holds at most {PROFILES_MAX} profiles"));

    // A subject long enough to bring the canonical form to exactly the bound, then one byte more.
    let sized = |n: usize| with(|d| dev(d).subjects = vec!["x".repeat(n)]);
    let room = DOCUMENT_BYTES_MAX - sized(0).canonical().len();
    assert_eq!(sized(room).canonical().len(), DOCUMENT_BYTES_MAX);
    assert_eq!(refused(&sized(room)), "valid");
    assert_eq!(refused(&sized(room + 1)), format!("a policy document is at most {DOCUMENT_BYTES_MAX} bytes"));
}

#[test]
fn parse_reads_the_canonical_form_back_and_refuses_what_is_not_a_valid_document() {
    let d = base();
    let text = d.canonical();
    assert!(text.starts_with("{\"policy\":{\"default_profile\":\"dev\""), "{text}");
    assert!(!text.contains("refresh_secs"), "settings of the replica are no part of a version: {text}");
    assert_eq!(PolicyDocument::parse(&text, &high()), Ok(d.clone()));
    // An empty cooling-off total is not written: a version stored before it existed reads back the same.
    assert!(!text.contains("cooling_off_total"), "{text}");
    let cooled = with(|d| dev(d).payees.cooling_off_total = money(json!({"KES": "5.00"})));
    assert_eq!(PolicyDocument::parse(&cooled.canonical(), &high()), Ok(cooled));
    // Whitespace counts toward the byte bound of the text as sent.
    let padded = format!("{text}{}", " ".repeat(DOCUMENT_BYTES_MAX - text.len()));
    assert_eq!(PolicyDocument::parse(&padded, &high()), Ok(d));
    let over = format!("{padded} ");
    assert_eq!(
        PolicyDocument::parse(&over, &high()).unwrap_err().to_string(),
        format!("a policy document is at most {DOCUMENT_BYTES_MAX} bytes")
    );
    for bad in [
        "not json",
        r#"{"policy": {"default_profile": "dev", "profiles": []}, "extra": 1}"#,
        r#"{"policy": {"default_profile": "dev", "profiles": [{"name": "dev", "daily_limit": {"KES": "-1.00"}}]}}"#,
    ] {
        let e = PolicyDocument::parse(bad, &high()).unwrap_err().to_string();
        assert!(e.starts_with("not a policy document: "), "{bad}: {e}");
    }
    let no_default = text.replace("\"default_profile\":\"dev\"", "\"default_profile\":\"nobody\"");
    assert_eq!(
        PolicyDocument::parse(&no_default, &high()).unwrap_err(),
        PolicyError::Invalid("policy.default_profile \"nobody\" names no profile".into())
    );
}

/// The live form: who matches which profile (issuer-bound, dev-key-only, default), the limits in
/// force, and tool governance with a disabled tool's aliases.
#[test]
fn the_live_form_arranges_profiles_and_governance() {
    let d = with(|d| {
        let p = dev(d);
        p.dev_key_only = true;
        p.daily_refund_limit = money(json!({"USD": "5.00"}));
        p.daily_limit = money(json!({"KES": "10000.00", "USD": "50.00"}));
        p.tool_calls_per_minute.insert("create_payment".into(), 7);
        p.calls_per_minute = 9;
        let idp = ProfileConfig {
            name: "idp".into(),
            issuer: "https://idp".into(),
            dev_key_only: false,
            subjects: vec!["bot".into()],
            approvals_by: "user".into(),
            user_approval_max: money(json!({"KES": "50.00"})),
            passkey_required: true,
            payees: PayeesConfig { mode: "known".into(), ..Default::default() },
            ..p.clone()
        };
        let ops = ProfileConfig {
            name: "ops".into(),
            subjects: vec![],
            dev_key_only: false,
            user_approval_max: money(json!({"KES": "50.00"})),
            ..p.clone()
        };
        d.policy.profiles.push(idp);
        d.policy.profiles.push(ops);
        d.policy.default_profile = "ops".into();
        d.tools.disabled = vec!["request_mpesa_payment".into()];
        d.tools.approval_required = vec!["send_mpesa_payout".into()];
    });
    let dev_iss = "http://127.0.0.1:8080";
    let live = d.live(7, Some(dev_iss));
    assert_eq!(live.version, 7);
    let dev = live.profiles.resolve(dev_iss, "dev-agent", None, None);
    assert_eq!((dev.name.as_str(), dev.issuer.as_deref()), ("dev", Some(dev_iss)));
    assert_eq!(live.profiles.resolve("https://idp", "dev-agent", None, None).name, "ops", "the dev key's only");
    assert_eq!((dev.calls_per_minute, dev.tool_calls_per_minute.get("create_payment")), (9, Some(&7)));
    assert_eq!(dev.autonomous_limit_minor.get(&kes()), Some(&100_000));
    assert_eq!(dev.daily_limit_minor.get(&usd()), Some(&5_000));
    // A refund limit where set; the daily limit where not.
    assert_eq!(
        (dev.daily_refund_limit_minor.get(&usd()), dev.daily_refund_limit_minor.get(&kes())),
        (Some(&500), Some(&1_000_000))
    );
    assert_eq!(dev.allowed_accounts.len(), 2);
    let idp = live.profiles.resolve("https://idp", "bot", None, None);
    assert_eq!((idp.name.as_str(), idp.issuer.as_deref()), ("idp", Some("https://idp")));
    assert_eq!(idp.user_approval_max_minor.get(&kes()), Some(&5_000));
    assert!(idp.passkey_required && !dev.passkey_required);
    assert_eq!(idp.payees.mode, crate::domain::payee::PayeeMode::parse("known").unwrap());
    assert_eq!(live.profiles.resolve("https://other", "bot", None, None).name, "ops", "bound to its issuer");
    // A user tier counts only with approvals_by = "user".
    let ops = live.profiles.resolve("iss", "stranger", None, None);
    assert_eq!((ops.name.as_str(), ops.user_approval_max_minor.len()), ("ops", 0));

    // With the dev key off, a dev-key-only profile matches nobody.
    let off = d.live(7, None);
    assert_eq!(off.profiles.resolve(dev_iss, "dev-agent", None, None).name, "ops");

    // A disabled tool takes its aliases along; an alias disabled alone is hidden alone.
    assert!(live.is_disabled("request_mpesa_payment") && live.is_disabled("initiate_stk_push"));
    assert!(!live.is_disabled("create_payment"));
    let alias_only = with(|d| d.tools.disabled = vec!["initiate_stk_push".into()]).live(1, None);
    assert!(alias_only.is_disabled("initiate_stk_push") && !alias_only.is_disabled("request_mpesa_payment"));
    assert!(live.always_needs_a_human("send_mpesa_payout") && !live.always_needs_a_human("create_payment"));

    // No policy yet: version 0, nothing governed, everyone on a profile that allows nothing.
    let none = LivePolicy::none();
    assert_eq!(none.version, 0);
    let p = none.profiles.resolve(dev_iss, "dev-agent", None, None);
    assert_eq!((p.name.as_str(), p.allowed_accounts.len()), ("none", 0));
    assert!(!none.is_disabled("create_payment") && !none.always_needs_a_human("create_payment"));
}

/// (path, widens) of every change from the base document to `after`.
fn diff(after: &PolicyDocument) -> Vec<(String, bool)> {
    changes(&base(), after).into_iter().map(|c| (c.path, c.widens)).collect()
}
fn one(path: &str, widens: bool) -> Vec<(String, bool)> {
    vec![(path.to_string(), widens)]
}

/// Each field's direction: what lets an agent do more widens, what lets it do less narrows.
#[test]
fn each_change_is_called_widening_or_narrowing_by_what_it_lets_an_agent_do() {
    type Edit = Box<dyn Fn(&mut PolicyDocument)>;
    let m = |v: Value| money(v);
    let cases: Vec<(Edit, Vec<(String, bool)>)> = vec![
        (Box::new(|_| {}), vec![]),
        // The autonomous limit: absent is zero.
        (
            Box::new(move |d| dev(d).autonomous_limit = m(json!({"KES": "999.99"}))),
            one("profiles.dev.autonomous_limit.KES", false),
        ),
        (
            Box::new(move |d| dev(d).autonomous_limit = m(json!({"KES": "1000.01"}))),
            one("profiles.dev.autonomous_limit.KES", true),
        ),
        (Box::new(move |d| dev(d).autonomous_limit = m(json!({}))), one("profiles.dev.autonomous_limit.KES", false)),
        (
            Box::new(move |d| {
                dev(d).autonomous_limit = m(json!({"KES": "1000.00", "USD": "0.00"}));
                dev(d).daily_limit = m(json!({"KES": "10000.00", "USD": "0.00"}));
            }),
            vec![
                ("profiles.dev.autonomous_limit.USD".into(), false),
                ("profiles.dev.daily_limit.USD".into(), false),
                ("profiles.dev.daily_refund_limit.USD".into(), false),
            ],
        ),
        (
            Box::new(move |d| {
                dev(d).autonomous_limit = m(json!({"KES": "1000.00", "USD": "0.01"}));
                dev(d).daily_limit = m(json!({"KES": "10000.00", "USD": "0.01"}));
            }),
            vec![
                ("profiles.dev.autonomous_limit.USD".into(), true),
                ("profiles.dev.daily_limit.USD".into(), false),
                ("profiles.dev.daily_refund_limit.USD".into(), false),
            ],
        ),
        // The daily limit: absent is no cap (and the refunds' limit follows it).
        (
            Box::new(move |d| dev(d).daily_limit = m(json!({"KES": "9999.99"}))),
            vec![("profiles.dev.daily_limit.KES".into(), false), ("profiles.dev.daily_refund_limit.KES".into(), false)],
        ),
        (
            Box::new(move |d| dev(d).daily_limit = m(json!({"KES": "10000.01"}))),
            vec![("profiles.dev.daily_limit.KES".into(), true), ("profiles.dev.daily_refund_limit.KES".into(), true)],
        ),
        (
            Box::new(move |d| dev(d).daily_limit = m(json!({}))),
            vec![("profiles.dev.daily_limit.KES".into(), true), ("profiles.dev.daily_refund_limit.KES".into(), true)],
        ),
        (
            Box::new(move |d| dev(d).daily_refund_limit = m(json!({"KES": "10.00"}))),
            one("profiles.dev.daily_refund_limit.KES", false),
        ),
        // The refunds' limit written out as what it was anyway: nothing in force changes, but the
        // document does, and no rule names it: four eyes (fail closed).
        (Box::new(move |d| dev(d).daily_refund_limit = m(json!({"KES": "10000.00"}))), one("policy", true)),
        (Box::new(|d| dev(d).daily_payments_max = 99), one("profiles.dev.daily_payments_max", false)),
        (Box::new(|d| dev(d).daily_payments_max = 101), one("profiles.dev.daily_payments_max", true)),
        (Box::new(|d| dev(d).calls_per_minute = 119), one("profiles.dev.calls_per_minute", false)),
        (Box::new(|d| dev(d).calls_per_minute = 121), one("profiles.dev.calls_per_minute", true)),
        // A per-tool quota: absent is no quota.
        (
            Box::new(|d| {
                dev(d).tool_calls_per_minute.insert("create_payment".into(), 5);
            }),
            one("profiles.dev.tool_calls_per_minute.create_payment", false),
        ),
        // Who a profile is for, its issuer, its accounts.
        (Box::new(|d| dev(d).subjects = vec![]), one("profiles.dev.subjects", true)),
        (Box::new(|d| dev(d).users = vec!["alice".into()]), one("profiles.dev.users", true)),
        (Box::new(|d| dev(d).client_ids = vec!["c".into()]), one("profiles.dev.client_ids", true)),
        (Box::new(|d| dev(d).issuer = "https://idp".into()), one("profiles.dev.issuer", true)),
        (Box::new(|d| dev(d).dev_key_only = true), one("profiles.dev.issuer", true)),
        (
            Box::new(|d| dev(d).allowed_accounts.push(crate::domain::ids::AccountId::parse("acct-C").unwrap())),
            one("profiles.dev.allowed_accounts+", true),
        ),
        (Box::new(|d| _ = dev(d).allowed_accounts.pop()), one("profiles.dev.allowed_accounts-", false)),
        (
            Box::new(|d| dev(d).allowed_accounts[1] = crate::domain::ids::AccountId::parse("acct-C").unwrap()),
            vec![("profiles.dev.allowed_accounts+".into(), true), ("profiles.dev.allowed_accounts-".into(), false)],
        ),
        // Who approves, and how.
        (
            Box::new(move |d| {
                dev(d).approvals_by = "user".into();
                dev(d).user_approval_max = m(json!({"KES": "50.00"}));
            }),
            vec![("profiles.dev.approvals_by".into(), true), ("profiles.dev.user_approval_max.KES".into(), true)],
        ),
        (Box::new(|d| dev(d).passkey_required = true), one("profiles.dev.passkey_required", false)),
        // Payee rules.
        (Box::new(|d| dev(d).payees.mode = "known".into()), one("profiles.dev.payees.mode", false)),
        (Box::new(|d| dev(d).payees.cooling_off_secs = 86_401), one("profiles.dev.payees.cooling_off_secs", false)),
        (Box::new(|d| dev(d).payees.cooling_off_secs = 86_399), one("profiles.dev.payees.cooling_off_secs", true)),
        (
            Box::new(move |d| dev(d).payees.new_payee_limit = m(json!({"KES": "1.00"}))),
            one("profiles.dev.payees.new_payee_limit.KES", false),
        ),
        (
            Box::new(move |d| dev(d).payees.cooling_off_total = m(json!({"KES": "1.00"}))),
            one("profiles.dev.payees.cooling_off_total.KES", false),
        ),
        (
            Box::new(move |d| dev(d).payees.daily_cap = m(json!({"KES": "1.00"}))),
            one("profiles.dev.payees.daily_cap.KES", false),
        ),
        // Tool governance.
        (Box::new(|d| d.tools.disabled = vec!["create_payment".into()]), one("tools.disabled+", false)),
        (
            Box::new(|d| d.tools.approval_required = vec!["create_payment".into()]),
            one("tools.approval_required+", false),
        ),
        // Profiles and the default.
        (
            Box::new(|d| {
                let other = ProfileConfig { name: "other".into(), ..d.policy.profiles[0].clone() };
                d.policy.profiles.push(other);
            }),
            one("profiles.other", true),
        ),
        (
            Box::new(|d| {
                let other = ProfileConfig { name: "other".into(), ..d.policy.profiles[0].clone() };
                d.policy.profiles.push(other);
                d.policy.default_profile = "other".into();
            }),
            vec![("policy.default_profile".into(), true), ("profiles.other".into(), true)],
        ),
    ];
    for (i, (edit, want)) in cases.into_iter().enumerate() {
        let after = with(edit);
        assert_eq!(diff(&after), want, "case {i}");
        // The named list over-approximates: what widens anyone's effective authority is named
        // as widening (the decision itself is `review`'s, tested below and in properties.rs).
        if widens(&base(), &after, None) {
            assert!(want.iter().any(|(_, w)| *w), "case {i}");
        }
    }
}

/// What narrows one way widens the other: each change read backwards flips (the pairs above).
#[test]
fn a_change_undone_is_called_the_other_way() {
    let from = |edit: fn(&mut PolicyDocument)| -> Vec<(String, bool)> {
        changes(&with(edit), &base()).into_iter().map(|c| (c.path, c.widens)).collect()
    };
    type Case = (fn(&mut PolicyDocument), Vec<(String, bool)>);
    let cases: [Case; 9] = [
        (|d| d.tools.disabled = vec!["create_payment".into()], one("tools.disabled-", true)),
        (|d| d.tools.approval_required = vec!["create_payment".into()], one("tools.approval_required-", true)),
        (|d| dev(d).passkey_required = true, one("profiles.dev.passkey_required", true)),
        (|d| dev(d).payees.mode = "known".into(), one("profiles.dev.payees.mode", true)),
        (|d| dev(d).payees.mode = "allow_list".into(), one("profiles.dev.payees.mode", true)),
        (
            |d| {
                dev(d).tool_calls_per_minute.insert("create_payment".into(), 5);
            },
            one("profiles.dev.tool_calls_per_minute.create_payment", true),
        ),
        (
            |d| dev(d).allowed_accounts.push(crate::domain::ids::AccountId::parse("acct-C").unwrap()),
            one("profiles.dev.allowed_accounts-", false),
        ),
        (
            |d| {
                dev(d).approvals_by = "user".into();
                dev(d).user_approval_max = money(json!({"KES": "50.00"}));
            },
            vec![("profiles.dev.approvals_by".into(), false), ("profiles.dev.user_approval_max.KES".into(), false)],
        ),
        (
            |d| {
                let other = ProfileConfig { name: "other".into(), ..d.policy.profiles[0].clone() };
                d.policy.profiles.push(other);
            },
            one("profiles.other", true),
        ),
    ];
    for (i, (edit, want)) in cases.into_iter().enumerate() {
        assert_eq!(from(edit), want, "case {i}");
    }
    // Between two strict modes: the allow-list is stricter than known payees.
    let known = with(|d| dev(d).payees.mode = "known".into());
    let list = with(|d| dev(d).payees.mode = "allow_list".into());
    assert!(!changes(&known, &list)[0].widens && changes(&list, &known)[0].widens);
    // An unvalidated mode reads as open, as the live form reads it: from open it changes nothing
    // in force, from an allow-list it widens.
    let bogus = with(|d| dev(d).payees.mode = "bogus".into());
    assert_eq!(diff(&bogus), one("profiles.dev.payees.mode", false));
    assert!(changes(&list, &bogus)[0].widens);
}

/// What a reviewer reads: the amounts as decimals, absent as null, a new profile whole.
#[test]
fn a_change_shows_before_and_after_as_a_reviewer_reads_them() {
    let after = with(|d| {
        dev(d).autonomous_limit = money(json!({"KES": "500.00", "USD": "1.00"}));
        dev(d).daily_limit = money(json!({"KES": "10000.00", "USD": "10.00"}));
        dev(d).dev_key_only = true;
        dev(d).tool_calls_per_minute.insert("create_payment".into(), 5);
    });
    let c = changes(&base(), &after);
    let at = |path: &str| c.iter().find(|c| c.path == path).unwrap_or_else(|| panic!("{path}: {c:?}"));
    assert_eq!(
        (&at("profiles.dev.autonomous_limit.KES").before, &at("profiles.dev.autonomous_limit.KES").after),
        (&json!("1000.00"), &json!("500.00"))
    );
    assert_eq!(at("profiles.dev.autonomous_limit.USD").before, Value::Null);
    assert_eq!(at("profiles.dev.issuer").after, json!({"issuer": "", "dev_key_only": true}));
    let quota = at("profiles.dev.tool_calls_per_minute.create_payment");
    assert_eq!((&quota.before, &quota.after), (&Value::Null, &json!(5)));
    let added = with(|d| {
        let other = ProfileConfig { name: "other".into(), ..d.policy.profiles[0].clone() };
        d.policy.profiles.push(other);
    });
    let c = changes(&base(), &added);
    assert_eq!((c[0].before.clone(), c[0].after["name"].clone()), (Value::Null, json!("other")));
    let c = changes(&added, &base());
    assert_eq!((c[0].before["name"].clone(), c[0].after.clone()), (json!("other"), Value::Null));
}

/// Only the order of two profiles naming the same agent differs: the order is named, and whether
/// it widens is what the agent gets — the same profile (twice): nothing; a wider one: widening.
#[test]
fn the_order_of_profiles_is_named_and_judged_by_what_the_agent_gets() {
    let two = with(|d| {
        let other = ProfileConfig { name: "other".into(), ..d.policy.profiles[0].clone() };
        d.policy.profiles.push(other);
    });
    let mut swapped = two.clone();
    swapped.policy.profiles.reverse();
    assert_eq!(
        changes(&two, &swapped),
        vec![Change {
            path: "policy.profiles.order".into(),
            before: json!(["dev", "other"]),
            after: json!(["other", "dev"]),
            widens: true
        }]
    );
    let r = review(&two, &swapped, None);
    assert!(!r.widens, "both give dev-agent the same authority: {r:?}");
    assert_eq!(r.authority.len(), 1, "dev-agent's profile is another one by name: {r:?}");
    assert!(changes(&two, &two.clone()).is_empty() && !widens(&two, &two.clone(), None));

    // issue 52: `tight` first, `wide` second, both naming ro-bot; swap them and lower a number.
    let profile = |name: &str, limit: &str| ProfileConfig {
        name: name.into(),
        subjects: vec!["ro-bot".into()],
        autonomous_limit: money(json!({"KES": limit})),
        daily_limit: money(json!({"KES": "100000.00"})),
        ..base().policy.profiles[0].clone()
    };
    let before = with(|d| d.policy.profiles.extend([profile("tight", "10.00"), profile("wide", "5000.00")]));
    let after = with(|d| {
        let mut wide = profile("wide", "5000.00");
        wide.calls_per_minute -= 1;
        d.policy.profiles.extend([wide, profile("tight", "10.00")]);
    });
    assert!(changes(&before, &after).iter().any(|c| c.path == "profiles.wide.calls_per_minute" && !c.widens));
    let r = review(&before, &after, None);
    assert!(r.widens, "{r:?}");
    let robot = r.authority.iter().find(|c| c.principal.subject.as_deref() == Some("ro-bot")).expect("ro-bot");
    assert_eq!((robot.before.as_str(), robot.after.as_str(), robot.widens), ("tight", "wide", true));
    assert!(robot.dimensions.iter().any(|d| d.path == "autonomous_limit.KES" && d.widens), "{robot:?}");
    // Back again: ro-bot's limit narrows, and the one number lowered on the way comes back up —
    // a widening in that dimension alone.
    let back = review(&after, &before, None);
    let robot = back.authority.iter().find(|c| c.principal.subject.as_deref() == Some("ro-bot")).expect("ro-bot");
    let widened: Vec<&str> = robot.dimensions.iter().filter(|d| d.widens).map(|d| d.path.as_str()).collect();
    assert_eq!(widened, ["calls_per_minute"], "{robot:?}");
}

/// Matching is compared by resolving: moving an agent between profiles, by subject, user, pair,
/// client or issuer, widens exactly when what it ends up with is wider.
#[test]
fn moving_a_principal_between_profiles_is_judged_by_where_it_lands() {
    let wide = |name: &str| ProfileConfig {
        name: name.into(),
        subjects: vec![],
        autonomous_limit: money(json!({"KES": "9000.00"})),
        daily_limit: money(json!({"KES": "90000.00"})),
        ..base().policy.profiles[0].clone()
    };
    let mut tight = base().policy.profiles[0].clone();
    tight.name = "tight".into();
    tight.subjects = vec![];
    tight.autonomous_limit = money(json!({"KES": "1.00"}));
    let doc = |profiles: Vec<ProfileConfig>| {
        let mut d = base();
        d.policy.profiles.extend(profiles);
        d
    };
    let w = |f: &dyn Fn(&mut ProfileConfig)| {
        let mut p = wide("wide");
        f(&mut p);
        p
    };
    let t = |f: &dyn Fn(&mut ProfileConfig)| {
        let mut p = tight.clone();
        f(&mut p);
        p
    };
    let before = doc(vec![w(&|_| {}), t(&|_| {})]);
    let cases: Vec<(&str, PolicyDocument, bool)> = vec![
        ("a user onto wide", doc(vec![w(&|p| p.users = vec!["alice".into()]), t(&|_| {})]), true),
        ("a user onto tight", doc(vec![w(&|_| {}), t(&|p| p.users = vec!["alice".into()])]), false),
        ("a client onto wide", doc(vec![w(&|p| p.client_ids = vec!["c1".into()]), t(&|_| {})]), true),
        (
            "a pair onto wide",
            doc(vec![
                w(&|p| {
                    p.subjects = vec!["bot".into()];
                    p.users = vec!["alice".into()];
                }),
                t(&|_| {}),
            ]),
            true,
        ),
        ("an agent onto tight", doc(vec![w(&|_| {}), t(&|p| p.subjects = vec!["bot".into()])]), false),
        ("dev-agent onto wide", doc(vec![w(&|p| p.subjects = vec!["dev-agent".into()]), t(&|_| {})]), false),
        (
            "wide first for dev-agent under one issuer",
            {
                let mut d = doc(vec![w(&|p| {
                    p.subjects = vec!["dev-agent".into()];
                    p.issuer = "https://idp".into();
                })]);
                d.policy.profiles.rotate_left(1);
                d
            },
            true,
        ),
        (
            "the default to wide",
            {
                let mut d = before.clone();
                d.policy.default_profile = "wide".into();
                d
            },
            true,
        ),
        (
            "the default to tight",
            {
                let mut d = before.clone();
                d.policy.default_profile = "tight".into();
                d
            },
            false,
        ),
    ];
    for (what, after, want) in cases {
        let r = review(&before, &after, None);
        assert_eq!(r.widens, want, "{what}: {:?}", r.authority);
    }
}

#[test]
fn proposals_are_decided_by_another_person_and_their_status_reads_back() {
    for s in [ProposalStatus::Pending, ProposalStatus::Applied, ProposalStatus::Rejected] {
        assert_eq!(ProposalStatus::parse(s.as_str()), Some(s));
        assert_eq!(serde_json::to_value(s).unwrap(), json!(s.as_str()));
    }
    assert_eq!(ProposalStatus::parse("Pending"), None);
    assert_eq!(
        [ProposalStatus::Pending, ProposalStatus::Applied, ProposalStatus::Rejected].map(ProposalStatus::as_str),
        ["pending", "applied", "rejected"]
    );
    let p = PolicyProposal {
        id: "pp".into(),
        base_version: 1,
        document: base().canonical(),
        author_iss: "https://idp-a".into(),
        author_sub: "alice".into(),
        reason: "r".into(),
        created_at: 0,
        status: ProposalStatus::Pending,
        decided_iss: None,
        decided_sub: None,
        decided_at: None,
        applied_version: None,
        tag: None,
    };
    assert!(!may_decide(&p, "alice"), "its author");
    // Its tag binds what its author wrote and where it stands; not the tag itself.
    let fields = p.tag_fields();
    assert_eq!(PolicyProposal { tag: Some("x".into()), ..p.clone() }.tag_fields(), fields);
    let edits: Vec<fn(&mut PolicyProposal)> = vec![
        |p| p.id.push('x'),
        |p| p.base_version += 1,
        |p| p.document.push(' '),
        |p| p.author_iss.push('x'),
        |p| p.author_sub = "bob".into(),
        |p| p.reason.push('x'),
        |p| p.created_at += 1,
        |p| p.status = ProposalStatus::Rejected,
        |p| p.decided_iss = Some("iss".into()),
        |p| p.decided_sub = Some("bob".into()),
        |p| p.decided_at = Some(1),
        |p| p.applied_version = Some(2),
    ];
    for (i, edit) in edits.iter().enumerate() {
        let mut e = p.clone();
        edit(&mut e);
        assert_ne!(e.tag_fields(), fields, "edit {i}");
    }
    assert!(may_decide(&p, "bob"));
    // An operator's proposal names its token's issuer; the config file's or `policy import`'s
    // names none: nobody the gateway authenticated wrote it.
    assert!(!p.is_unauthenticated());
    assert!(PolicyProposal { author_iss: String::new(), ..p }.is_unauthenticated());
}

/// `widens` is the review's verdict: a raised limit needs a second operator, a lowered one not.
#[test]
fn widens_is_the_reviews_verdict() {
    let raised = with(|d| dev(d).autonomous_limit = money(json!({"KES": "2000.00"})));
    let lowered = with(|d| dev(d).autonomous_limit = money(json!({"KES": "500.00"})));
    assert!(widens(&base(), &raised, None));
    assert!(!widens(&base(), &lowered, None));
    assert!(!widens(&base(), &base(), None));
}

/// A version's tag binds every field but the tag itself.
#[test]
fn a_versions_tag_fields_are_every_field_but_the_tag() {
    let v = PolicyVersion {
        version: 2,
        document: "{}".into(),
        author_iss: "iss".into(),
        author_sub: "alice".into(),
        reason: "why".into(),
        approver_iss: "iss".into(),
        approver_sub: "bob".into(),
        proposal_id: Some("prop_1".into()),
        created_at: 10,
        tag: None,
    };
    let fields = v.tag_fields();
    assert_eq!(fields, PolicyVersion { tag: Some("x".into()), ..v.clone() }.tag_fields());
    let edits: Vec<fn(&mut PolicyVersion)> = vec![
        |v| v.version += 1,
        |v| v.document.push(' '),
        |v| v.author_iss.push('x'),
        |v| v.author_sub.push('x'),
        |v| v.reason.push('x'),
        |v| v.approver_iss.push('x'),
        |v| v.approver_sub.push('x'),
        |v| v.proposal_id = None,
        |v| v.created_at += 1,
    ];
    for (i, edit) in edits.iter().enumerate() {
        let mut e = v.clone();
        edit(&mut e);
        assert_ne!(e.tag_fields(), fields, "edit {i}");
    }
}
