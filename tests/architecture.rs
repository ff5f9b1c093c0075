//! The module graph stays acyclic: a module may use the ones below it, never one that uses it back.
//! (ARCHITECTURE.md draws the graph; this test keeps it true.) It reads `src/` as text: every
//! `crate::<module>` path outside comments is an edge.
#![allow(clippy::unwrap_used, clippy::expect_used)] // a test crate: a panic is a failed test

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;

fn strip_comments(text: &str) -> String {
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// Top-level module → the top-level modules it names (unit tests excluded: they may reach anywhere).
fn graph() -> BTreeMap<String, BTreeSet<String>> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut edges: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    let mut stack = vec![src.clone()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            let rel = path.strip_prefix(&src).unwrap().to_string_lossy().replace('\\', "/");
            if !rel.ends_with(".rs") || rel.starts_with("bin/") || rel == "main.rs" || rel == "lib.rs" {
                continue;
            }
            let module = rel.split('/').next().unwrap().trim_end_matches(".rs").to_string();
            let text = std::fs::read_to_string(&path).unwrap();
            if text.contains("\n#![cfg(test)]") {
                continue; // a test-only file (gateway/testkit.rs): it may reach anywhere
            }
            let text = text.split("#[cfg(test)]").next().unwrap_or("");
            let text = strip_comments(text);
            let deps = edges.entry(module.clone()).or_default();
            for (i, _) in text.match_indices("crate::") {
                let name: String =
                    text[i + 7..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() && name != module {
                    deps.insert(name);
                }
            }
            // `use crate::{a, b::c}` names several at once.
            for (i, _) in text.match_indices("use crate::{") {
                let group = &text[i + 12..text[i..].find('}').map_or(text.len(), |e| i + e)];
                for part in group.split(',') {
                    let name: String =
                        part.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                    if !name.is_empty() && name != module {
                        deps.insert(name);
                    }
                }
            }
        }
    }
    edges
}

#[test]
fn no_module_imports_in_a_cycle() {
    let edges = graph();
    // Depth-first search for a back edge; report the cycle it closes.
    fn visit(
        node: &str,
        edges: &BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_string());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_string());
        for next in edges.get(node).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(node.to_string());
        None
    }
    let mut done = BTreeSet::new();
    for node in edges.keys() {
        if let Some(cycle) = visit(node, &edges, &mut Vec::new(), &mut done) {
            panic!("modules import each other in a cycle: {}", cycle.join(" → "));
        }
    }
    // The graph is not empty (the scan found the code it is meant to guard).
    assert!(edges.get("gateway").is_some_and(|d| d.contains("store") && d.contains("domain")), "{edges:?}");
    assert!(!edges["domain"].contains("store") && !edges["domain"].contains("backend"), "domain stays below");
}

/// ARCHITECTURE.md's graph: the top-level rooms each room may import. An import not listed here
/// fails, so a new edge is a decision made in review (and drawn in ARCHITECTURE.md), not an
/// accident. The lowest rooms (`domain`, with its ids and money, and `clock`) stay pure; `store` never reaches
/// up into `gateway`, `backend`, `http` or `mcp`; only the edges (`http`, `mcp`, `jobs`, `app`)
/// import the gateway.
const MAY_IMPORT: &[(&str, &[&str])] = &[
    ("clock", &[]),
    ("catalogue", &[]),
    ("metrics", &[]),
    ("private_fs", &[]),
    ("logging", &[]),
    ("telemetry", &["install_crypto_provider"]),
    ("secret", &["logging"]),
    ("domain", &["catalogue", "clock"]),
    ("error", &["domain", "mandate"]),
    ("idempotency", &["domain", "error", "secret"]),
    ("mandate", &["clock", "domain", "secret"]),
    ("passkey", &[]),
    ("rate", &["clock", "domain", "store"]),
    ("request_state", &["clock", "idempotency"]),
    ("auth", &["catalogue", "clock", "domain", "secret"]),
    ("store", &["clock", "domain", "idempotency", "mandate", "private_fs"]),
    ("audit_chain", &["clock", "domain", "store"]),
    ("audit_archive", &["audit_chain", "clock", "domain", "private_fs", "store"]),
    ("backend", &["clock", "domain", "install_crypto_provider", "private_fs", "secret", "store", "telemetry"]),
    ("ledger_service", &["backend", "clock", "domain", "secret", "store"]),
    ("config", &["audit_archive", "backend", "catalogue", "domain", "secret", "store", "telemetry"]),
    (
        "gateway",
        &[
            "audit_chain",
            "auth",
            "backend",
            "catalogue",
            "clock",
            "domain",
            "error",
            "idempotency",
            "mandate",
            "metrics",
            "passkey",
            "rate",
            "request_state",
            "store",
        ],
    ),
    ("mcp", &["auth", "backend", "catalogue", "clock", "domain", "error", "gateway", "request_state", "telemetry"]),
    (
        "http",
        &[
            "auth",
            "backend",
            "catalogue",
            "domain",
            "error",
            "gateway",
            "mcp",
            "metrics",
            "rate",
            "secret",
            "telemetry",
        ],
    ),
    ("webhooks", &["clock", "domain", "secret", "store"]),
    ("jobs", &["audit_archive", "audit_chain", "backend", "config", "gateway", "rate", "webhooks"]),
    (
        "app",
        &[
            "auth",
            "backend",
            "clock",
            "config",
            "domain",
            "gateway",
            "http",
            "idempotency",
            "install_crypto_provider",
            "jobs",
            "mandate",
            "private_fs",
            "rate",
            "store",
            "webhooks",
        ],
    ),
    // The command line: it reaches whatever a subcommand runs (nothing imports it).
    (
        "cli",
        &[
            "app",
            "auth",
            "backend",
            "catalogue",
            "clock",
            "config",
            "gateway",
            "install_crypto_provider",
            "ledger_service",
            "logging",
            "mandate",
            "mcp",
            "private_fs",
            "store",
            "telemetry",
        ],
    ),
];

#[test]
fn every_import_is_one_the_architecture_allows() {
    let allowed: BTreeMap<&str, BTreeSet<&str>> =
        MAY_IMPORT.iter().map(|(room, deps)| (*room, deps.iter().copied().collect())).collect();
    let mut wrong = Vec::new();
    for (room, deps) in graph() {
        let Some(may) = allowed.get(room.as_str()) else {
            wrong.push(format!("{room} is a room ARCHITECTURE.md does not place (add it to MAY_IMPORT)"));
            continue;
        };
        for dep in deps {
            if !may.contains(dep.as_str()) {
                wrong.push(format!("{room} imports {dep}, which it must not"));
            }
        }
    }
    assert!(wrong.is_empty(), "imports outside the documented graph:\n{}", wrong.join("\n"));
}
