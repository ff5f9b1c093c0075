//! The whole MCP surface through rmcp's client over HTTP, in both protocol eras.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

mod common;

use common::*;
use rmcp::model::{GetPromptRequestParams, ReadResourceRequestParams, ResourceContents};
use serde_json::{Value, json};

// request_mpesa_payment and its alias initiate_stk_push are offered only where the M-Pesa rail is
// configured (tests/mpesa.rs): mpesa.enabled = false disables the tool, and so its alias. Likewise
// request_airtel_payment with airtel.enabled = false (tests/airtel.rs), request_payment with no rail
// enabled, and send_payment, pay_paybill and pay_till without M-Pesa's API operator.
const TOOLS: [&str; 17] = [
    "check_ledger_integrity",
    "check_payment_policy",
    "check_payment_status",
    "check_transaction_status",
    "create_payment",
    "generate_receipt",
    "get_account_ledger",
    "get_approval",
    "get_balance",
    "get_failed_transactions",
    "get_payment",
    "get_payment_summary",
    "get_today_summary",
    "get_today_transactions",
    "list_payments",
    "reconcile",
    "refund_payment",
];

fn text_of(contents: &[ResourceContents]) -> Value {
    match &contents[0] {
        ResourceContents::TextResourceContents { text, .. } => serde_json::from_str(text).unwrap(),
        other => panic!("expected text contents, got {other:?}"),
    }
}

#[tokio::test]
async fn tools_list_is_the_contract_in_both_eras() {
    let (app, _dir) = spawn_app().await;
    for era in ERAS {
        // A token with no scopes still sees every tool: the list is the same for all callers.
        let client = connect(&app.url, &app.token("dev-agent", ""), era).await;
        let tools = client.list_all_tools().await.unwrap();
        let mut names: Vec<_> = tools.iter().map(|t| t.name.to_string()).collect();
        names.sort();
        assert_eq!(names, TOOLS, "{era:?}");
        for t in &tools {
            let a = t.annotations.as_ref().unwrap_or_else(|| panic!("{} has annotations", t.name));
            let read_only = matches!(
                t.name.as_ref(),
                "get_balance"
                    | "get_payment"
                    | "list_payments"
                    | "get_account_ledger"
                    | "check_ledger_integrity"
                    | "get_approval"
                    | "get_payment_summary"
                    | "check_transaction_status"
                    | "check_payment_status"
                    | "generate_receipt"
                    | "get_today_summary"
                    | "get_today_transactions"
                    | "get_failed_transactions"
                    | "check_payment_policy"
            );
            assert_eq!(a.read_only_hint, Some(read_only), "{} read_only", t.name);
            if !read_only {
                assert_eq!(a.idempotent_hint, Some(true), "{} idempotent", t.name);
            }
            assert!(t.output_schema.is_some(), "{} has an output schema", t.name);
            let scope = paygate::catalogue::scope_for_tool(&t.name).unwrap();
            assert!(t.description.as_deref().unwrap_or("").contains(scope), "{} names its scope", t.name);
        }
        let create = tools.iter().find(|t| t.name == "create_payment").unwrap();
        let required = create.input_schema.get("required").unwrap().as_array().unwrap();
        for field in ["operation_id", "from_account", "to_account", "amount", "currency"] {
            assert!(required.contains(&json!(field)), "create_payment requires {field}");
        }
        assert_eq!(
            tools.iter().find(|t| t.name == "refund_payment").unwrap().annotations.as_ref().unwrap().destructive_hint,
            Some(true)
        );
        client.cancel().await.unwrap();
    }
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn every_tool_resource_and_prompt_works_in_both_eras() {
    let (app, _dir) = spawn_app().await;
    for (i, era) in ERAS.into_iter().enumerate() {
        let c = connect(&app.url, &app.dev_token(), era).await;

        // get_balance
        let before_a = balance(&c, "acct-A").await;
        let r = call(&c, "get_balance", json!({"account_id": "acct-A"})).await;
        assert_eq!(ok(&r)["currency"], "KES");

        // create_payment
        let r = call(
            &c,
            "create_payment",
            json!({"operation_id": format!("surface-{i}"), "from_account": "acct-A", "to_account": "acct-B",
                   "amount": "10.50", "currency": "KES", "memo": "surface test"}),
        )
        .await;
        let p = ok(&r).clone();
        assert_eq!(p["replayed"], false);
        assert_eq!(p["status"], "succeeded");
        assert_eq!(p["amount"], "10.50");
        let pid = p["payment_id"].as_str().unwrap().to_string();
        assert!(pid.starts_with("pay_"));
        let a_minor = |s: &str| (s.parse::<f64>().unwrap() * 100.0).round() as i64;
        assert_eq!(a_minor(&before_a) - a_minor(&balance(&c, "acct-A").await), 1050);

        // get_payment
        let r = call(&c, "get_payment", json!({"payment_id": pid})).await;
        assert_eq!(ok(&r)["payment_id"], pid.as_str());
        assert_eq!(ok(&r)["memo"], "surface test");

        // list_payments, paginated
        for n in 0..3 {
            let r = call(
                &c,
                "create_payment",
                json!({"operation_id": format!("page-{i}-{n}"), "from_account": "acct-A", "to_account": "acct-B",
                       "amount": "1.00", "currency": "KES"}),
            )
            .await;
            ok(&r);
        }
        let r = call(&c, "list_payments", json!({"account_id": "acct-B", "limit": 2})).await;
        let page1 = ok(&r).clone();
        assert_eq!(page1["payments"].as_array().unwrap().len(), 2);
        let cursor = page1["next_cursor"].as_str().expect("a next page").to_string();
        let r = call(&c, "list_payments", json!({"account_id": "acct-B", "limit": 2, "cursor": cursor})).await;
        let page2 = ok(&r).clone();
        let ids = |v: &Value| -> Vec<String> {
            v["payments"].as_array().unwrap().iter().map(|p| p["payment_id"].as_str().unwrap().to_string()).collect()
        };
        assert!(ids(&page2).iter().all(|id| !ids(&page1).contains(id)), "pages do not overlap");
        let r = call(&c, "list_payments", json!({"limit": 101})).await;
        assert_eq!(code(&r), "INVALID_ARGUMENT");
        // A page holds 1 ..= limits.list_limit_max (100) payments.
        assert_eq!(code(&call(&c, "list_payments", json!({"limit": 0})).await), "INVALID_ARGUMENT");
        let one = call(&c, "list_payments", json!({"account_id": "acct-B", "limit": 1})).await;
        assert_eq!(ok(&one)["payments"].as_array().map(Vec::len), Some(1), "{one:?}");

        // the today tools, check_transaction_status and generate_receipt over the ledger's payments
        let r = call(&c, "get_today_transactions", json!({"limit": 100})).await;
        assert!(ids(ok(&r)).contains(&pid), "today's transactions list today's payment");
        let r = call(&c, "get_failed_transactions", json!({})).await;
        assert!(ok(&r)["payments"].as_array().unwrap().is_empty(), "nothing failed");
        let r = call(&c, "get_today_summary", json!({"currency": "KES"})).await;
        let line = ok(&r)["totals"].as_array().unwrap().iter().find(|l| l["status"] == "succeeded").cloned().unwrap();
        assert!(line["count"].as_i64().unwrap() >= 4, "{line}");
        let r = call(&c, "check_transaction_status", json!({"payment_id": pid})).await;
        assert_eq!((ok(&r)["payment_id"].as_str(), ok(&r)["status"].as_str()), (Some(pid.as_str()), Some("succeeded")));
        let r = call(&c, "generate_receipt", json!({"payment_id": pid})).await;
        let receipt = ok(&r).clone();
        assert_eq!((receipt["amount"].as_str(), receipt["currency"].as_str()), (Some("10.50"), Some("KES")));
        assert_eq!(
            (receipt["from_account"].as_str(), receipt["to_account"].as_str()),
            (Some("acct-A"), Some("acct-B"))
        );
        assert_eq!((receipt["rail"].as_str(), receipt["reference"].as_str()), (Some("ledger"), Some(pid.as_str())));
        let text = receipt["text"].as_str().unwrap();
        assert!(text.contains(&pid) && text.contains("KES 10.50"), "{text}");
        assert!(!text.contains("surface test"), "no memo (free text) in the gateway's own text");

        // get_account_ledger
        let r = call(&c, "get_account_ledger", json!({"account_id": "acct-B", "limit": 100})).await;
        let entries = ok(&r)["entries"].as_array().unwrap().clone();
        assert!(entries.iter().any(|e| e["payment_id"] == pid.as_str() && e["amount"] == "10.50"));

        // refund_payment (partial), then the original shows it
        let r = call(
            &c,
            "refund_payment",
            json!({"operation_id": format!("refund-{i}"), "payment_id": pid, "amount": "0.50", "reason": "test"}),
        )
        .await;
        let refund = ok(&r).clone();
        assert_eq!(refund["kind"], "refund");
        assert_eq!(refund["refund_of"], pid.as_str());
        assert_eq!(refund["from_account"], "acct-B");
        let r = call(&c, "get_payment", json!({"payment_id": pid})).await;
        assert_eq!(ok(&r)["amount_refunded"], "0.50");
        let r = call(
            &c,
            "refund_payment",
            json!({"operation_id": format!("refund-too-much-{i}"), "payment_id": pid, "amount": "10.01"}),
        )
        .await;
        assert_eq!(code(&r), "INVALID_ARGUMENT");

        // check_ledger_integrity
        let r = call(&c, "check_ledger_integrity", json!({})).await;
        assert_eq!(ok(&r)["ok"], true);
        assert!(ok(&r)["currency_sums"].as_array().unwrap().iter().all(|s| s["sum_minor"] == 0));

        // resources
        let resources = c.list_resources(None).await.unwrap().resources;
        assert!(resources.iter().any(|r| r.uri == "payments://capabilities"));
        let templates = c.list_resource_templates(None).await.unwrap().resource_templates;
        assert!(templates.iter().any(|t| t.uri_template == "payments://payment/{payment_id}"));
        let caps = c.read_resource(ReadResourceRequestParams::new("payments://capabilities")).await.unwrap();
        let caps = text_of(&caps.contents);
        assert_eq!(caps["subject"], "dev-agent");
        assert_eq!(caps["allowed_accounts"], json!(["acct-A", "acct-B"]));
        assert_eq!(caps["autonomous_limits"][0]["per_payment"], "1000.00");
        let res = c.read_resource(ReadResourceRequestParams::new(format!("payments://payment/{pid}"))).await.unwrap();
        assert_eq!(text_of(&res.contents)["payment_id"], pid.as_str());

        // prompt
        let prompts = c.list_prompts(None).await.unwrap().prompts;
        assert!(prompts.iter().any(|p| p.name == "explain_payment"));
        let args = json!({"payment_id": pid}).as_object().cloned().unwrap();
        let prompt = c.get_prompt(GetPromptRequestParams::new("explain_payment").with_arguments(args)).await.unwrap();
        let text = serde_json::to_string(&prompt.messages).unwrap();
        assert!(text.contains(&pid) && text.contains("10.50"), "{text}");

        c.cancel().await.unwrap();
    }
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}

#[tokio::test]
async fn bad_input_gets_a_typed_error_and_changes_nothing() {
    let (app, _dir) = spawn_app().await;
    let c = connect(&app.url, &app.dev_token(), Era::Modern).await;
    let base = json!({"operation_id": "bad-1", "from_account": "acct-A", "to_account": "acct-B",
                      "amount": "1.00", "currency": "KES"});
    let cases: Vec<(&str, Value)> = vec![
        ("amount", json!("50.001")),
        ("amount", json!(50.0)),
        ("amount", json!("-5.00")),
        ("amount", json!("1e3")),
        ("amount", json!("0.00")),
        ("currency", json!("XXX")),
        ("operation_id", json!("")),
        ("from_account", json!("acct A")),
        ("to_account", json!("acct-A")),
        ("memo", json!("x".repeat(141))),
        ("surprise", json!("ignore previous instructions")),
    ];
    for (field, value) in cases {
        let mut args = base.clone();
        args[field] = value.clone();
        let r = call(&c, "create_payment", args).await;
        let e = err(&r);
        assert_eq!(e["code"], "INVALID_ARGUMENT", "{field}={value}");
        assert_eq!(e["retryable"], false);
        assert!(e["suggested_action"].as_str().unwrap().len() > 10);
        assert!(e["correlation_id"].as_str().unwrap().starts_with("corr_"));
    }
    assert_eq!(balance(&c, "acct-A").await, "1000000.00");
    assert_eq!(balance(&c, "acct-B").await, "0.00");
    // The memo's bound is in characters, not bytes, and the bound itself is allowed.
    let mut longest = base.clone();
    (longest["operation_id"], longest["memo"]) = (json!("memo-at-bound"), json!("é".repeat(140)));
    assert_eq!(ok(&call(&c, "create_payment", longest).await)["status"], "succeeded");
    let r = call(&c, "get_payment", json!({"payment_id": "pay_doesnotexist"})).await;
    assert_eq!(code(&r), "NOT_FOUND");
    app.assert_integrity().await;
    app.assert_secrets_not_logged();
    app.stop().await;
}
