//! `paygate policy export | import | simulate`: the policy document as a file. Export prints a
//! version as the `[policy]` and `[tools]` sections of a config file; import proposes a file's as
//! a change under the same rules as the operator API (it applies at once only when it narrows, and
//! otherwise waits for a second operator to approve it in the console or the API); simulate runs
//! the dry run of a file against the audited history. Each runs the gateway's own assembly once.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;
use crate::config::PolicyDocument;
use crate::gateway::{Operator, ProposeArgs};

/// The operator a command acts as: `author` under the configured issuer (the dev key's when there
/// is none), so the person is the same one the operator API knows, and cannot approve their own
/// widening change there either.
fn operator(config: &Config, author: &str) -> Operator {
    let issuer = if config.auth.issuer.is_empty() {
        crate::app::dev_issuer(config, &crate::app::configured_public_url(config))
    } else {
        config.auth.issuer.clone()
    };
    let scopes = [crate::catalogue::scopes::ADMIN, crate::catalogue::scopes::AUDIT].map(str::to_string).into();
    Operator { issuer, subject: author.to_string(), scopes, correlation_id: "cli".into() }
}

/// A file holding `[policy]` and `[tools]` (an exported one, or the same sections of a config file).
fn read_document(path: &Path) -> Result<serde_json::Value, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    let doc: PolicyDocument = toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))?;
    serde_json::to_value(&doc).map_err(|e| e.to_string())
}

pub fn export(config: Config, version: Option<i64>) -> ExitCode {
    super::one_shot(config, |g| async move {
        let store = g.store();
        let version = match version {
            Some(v) => v,
            None => match store.policy_head().await {
                Ok(v) => v,
                Err(e) => return fail(&e.to_string()),
            },
        };
        let stored = match store.policy_version(version).await {
            Ok(Some(v)) => v,
            Ok(None) => return fail(&format!("no policy version {version}")),
            Err(e) => return fail(&e.to_string()),
        };
        let doc: PolicyDocument = match serde_json::from_str(&stored.document) {
            Ok(d) => d,
            Err(e) => return fail(&format!("version {version} is unreadable: {e}")),
        };
        match toml::to_string(&doc) {
            Ok(text) => {
                println!("# paygate policy version {version}: {} ({})\n{text}", stored.reason, stored.author_sub);
                ExitCode::SUCCESS
            }
            Err(e) => fail(&e.to_string()),
        }
    })
}

pub fn import(config: Config, file: &Path, author: &str, reason: &str) -> ExitCode {
    let document = match read_document(file) {
        Ok(d) => d,
        Err(e) => return fail(&e),
    };
    let op = operator(&config, author);
    super::one_shot(config, |g| async move {
        let args = ProposeArgs { document, reason: Some(reason.to_string()), base_version: None };
        match g.ops_policy_propose(&op, args).await {
            Ok(outcome) => {
                println!("{}", serde_json::to_string_pretty(&outcome).unwrap_or_default());
                match outcome.status {
                    "applied" => eprintln!("applied as version {}", outcome.version.unwrap_or_default()),
                    _ => eprintln!(
                        "it widens policy: proposal {} waits for a second operator (console, or POST \
                         /operator/v1/policy/proposals/{{id}}/approve)",
                        outcome.proposal_id.as_deref().unwrap_or("")
                    ),
                }
                ExitCode::SUCCESS
            }
            Err(e) => fail(&format!("{:?}: {}", e.code, e.message)),
        }
    })
}

pub fn simulate(config: Config, file: &Path, since: Option<&str>, until: Option<&str>) -> ExitCode {
    let document = match read_document(file) {
        Ok(d) => d,
        Err(e) => return fail(&e),
    };
    let op = operator(&config, "cli");
    super::one_shot(config, |g| async move {
        match g.ops_policy_simulate(&op, &document, since, until).await {
            Ok(report) => {
                println!("{}", serde_json::to_string_pretty(&report).unwrap_or_default());
                ExitCode::SUCCESS
            }
            Err(e) => fail(&format!("{:?}: {}", e.code, e.message)),
        }
    })
}

fn fail(message: &str) -> ExitCode {
    crate::logging::fatal(message);
    ExitCode::from(2)
}
