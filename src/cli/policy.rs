//! `paygate policy export | import | simulate`: the policy document as a file. Export prints a
//! version as the `[policy]` and `[tools]` sections of a config file; import proposes a file's as
//! a change by "cli" — whoever runs the command is nobody the gateway authenticated, so `--author`
//! is recorded as a claim — that applies at once only when it narrows, and otherwise waits for
//! operators: the first to approve it adopts it, a second, distinct one approves that; simulate runs
//! the dry run of a file against the audited history. Each runs the gateway's own assembly once.

use std::path::Path;
use std::process::ExitCode;

use crate::config::Config;
use crate::config::PolicyDocument;
use crate::gateway::Operator;

/// The operator `simulate` reads as (it writes nothing; the dry run needs no person).
fn reader() -> Operator {
    let scopes = [crate::catalogue::scopes::AUDIT].map(str::to_string).into();
    Operator { issuer: String::new(), subject: "cli".into(), scopes, correlation_id: "cli".into() }
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
    super::one_shot(config, |g| async move {
        // Whoever runs this is nobody the gateway authenticated: `author` is kept as a claim.
        match g.import_policy(&document, author, reason).await {
            Ok(outcome) => {
                println!("{}", serde_json::to_string_pretty(&outcome).unwrap_or_default());
                match outcome.status {
                    "applied" => eprintln!("applied as version {}", outcome.version.unwrap_or_default()),
                    _ => eprintln!(
                        "it widens policy: proposal {} waits for operators (console, or POST \
                         /operator/v1/policy/proposals/{{id}}/approve): an import is nobody's word, so the \
                         first operator to approve it adopts it and a second, distinct one approves that",
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
    let op = reader();
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
