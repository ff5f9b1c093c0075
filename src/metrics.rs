//! Prometheus text metrics, kept in process (per replica). Every label has a bounded set of
//! values: tool names, decisions and error codes are fixed by the code; HTTP paths are folded to
//! their route.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Mutex;
use std::time::Duration;

/// Histogram bucket upper bounds, in seconds.
const BUCKETS: [f64; 12] = [0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5];

#[derive(Default, Clone)]
struct Histogram {
    counts: [u64; BUCKETS.len()],
    sum: f64,
    count: u64,
}

impl Histogram {
    fn observe(&mut self, secs: f64) {
        for (i, le) in BUCKETS.iter().enumerate() {
            if secs <= *le {
                self.counts[i] += 1;
            }
        }
        self.sum += secs;
        self.count += 1;
    }

    fn render(&self, out: &mut String, name: &str, labels: &str) {
        let sep = if labels.is_empty() { "" } else { "," };
        for (i, le) in BUCKETS.iter().enumerate() {
            let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"{le}\"}} {}", self.counts[i]);
        }
        let _ = writeln!(out, "{name}_bucket{{{labels}{sep}le=\"+Inf\"}} {}", self.count);
        let braces = if labels.is_empty() { String::new() } else { format!("{{{labels}}}") };
        let _ = writeln!(out, "{name}_sum{braces} {}", self.sum);
        let _ = writeln!(out, "{name}_count{braces} {}", self.count);
    }
}

#[derive(Default)]
struct Inner {
    decisions: BTreeMap<(String, String, String), u64>,
    http: BTreeMap<(&'static str, u16), u64>,
    http_latency: BTreeMap<&'static str, Histogram>,
    tool_latency: BTreeMap<String, Histogram>,
    ledger_latency: Histogram,
    /// Rail callbacks by (rail, outcome).
    callbacks: BTreeMap<(String, &'static str), u64>,
    /// Webhook delivery attempts by (endpoint, outcome), and each endpoint's breaker (open or not).
    webhook_attempts: BTreeMap<(String, &'static str), u64>,
    webhook_breakers: BTreeMap<String, bool>,
    reconcile_findings: BTreeMap<String, u64>,
    reconcile_runs: u64,
    reconcile_last_problems: u64,
    breaker_state: Option<&'static str>,
    bookkeeping_failures: BTreeMap<&'static str, u64>,
    audit_chain: AuditChainCounts,
    key_waits: u64,
    audit_witness_breaks: u64,
}

/// The audit hash chain's sealing runs on this replica (`seal_audit`).
#[derive(Default, Clone, Copy)]
struct AuditChainCounts {
    sealed: u64,
    failures: u64,
    head: Option<i64>,
    checkpoint_at: Option<i64>,
}

#[derive(Default)]
pub struct Metrics {
    inner: Mutex<Inner>,
}

/// Fold a request path to its route, so labels stay bounded: the operator API by its route
/// templates (`/operator/v1/payments/{payment_id}`), everything else by its prefix.
pub fn route(path: &str) -> &'static str {
    if let Some(rest) = path.strip_prefix("/operator/v1/") {
        return operator_route(rest);
    }
    match path {
        "/mcp" => "/mcp",
        "/healthz" => "/healthz",
        "/readyz" => "/readyz",
        "/metrics" => "/metrics",
        p if p.starts_with("/.well-known/") => "/.well-known",
        p if p.starts_with("/approvals") => "/approvals",
        p if p.starts_with("/principals/") => "/principals",
        p if p.starts_with("/callbacks/mpesa/") => "/callbacks/mpesa",
        p if p.starts_with("/callbacks/airtel/") => "/callbacks/airtel",
        p if p == "/console" || p.starts_with("/console/") => "/console",
        _ => "other",
    }
}

/// `docs/operator-api.yaml`'s paths, ids folded (tests/operator_api.rs checks the two agree).
pub const OPERATOR_ROUTES: &[&str] = &[
    "/operator/v1/health",
    "/operator/v1/summary",
    "/operator/v1/payments",
    "/operator/v1/payments/{payment_id}",
    "/operator/v1/payments/{payment_id}/resolve",
    "/operator/v1/audit",
    "/operator/v1/audit/verify",
    "/operator/v1/approvals",
    "/operator/v1/approvals/{approval_id}",
    "/operator/v1/approvals/{approval_id}/approve",
    "/operator/v1/approvals/{approval_id}/reject",
    "/operator/v1/approvals/{approval_id}/passkeys",
    "/operator/v1/passkeys",
    "/operator/v1/passkeys/options",
    "/operator/v1/passkeys/enrolment-codes",
    "/operator/v1/passkeys/{credential_id}/revoke",
    "/operator/v1/confirmations/{approval_id}",
    "/operator/v1/confirmations/{approval_id}/approve",
    "/operator/v1/confirmations/{approval_id}/reject",
    "/operator/v1/mandates",
    "/operator/v1/mandates/{mandate_id}/revoke",
    "/operator/v1/principals",
    "/operator/v1/principals/{subject}/suspend",
    "/operator/v1/principals/{subject}/resume",
    "/operator/v1/payees",
    "/operator/v1/payees/revoke",
    "/operator/v1/webhooks",
    "/operator/v1/webhooks/{message_id}/attempts",
    "/operator/v1/reconciliation",
    "/operator/v1/reconciliation/run",
    "/operator/v1/policy",
    "/operator/v1/policy/versions",
    "/operator/v1/policy/versions/{version}",
    "/operator/v1/policy/diff",
    "/operator/v1/policy/proposals",
    "/operator/v1/policy/proposals/{proposal_id}",
    "/operator/v1/policy/proposals/{proposal_id}/approve",
    "/operator/v1/policy/proposals/{proposal_id}/reject",
    "/operator/v1/policy/rollback",
    "/operator/v1/policy/simulate",
];

fn operator_route(rest: &str) -> &'static str {
    let segments: Vec<&str> = rest.split('/').collect();
    // A template matches when every literal segment does and each `{…}` matches one non-empty one.
    OPERATOR_ROUTES
        .iter()
        .find(|t| {
            let template: Vec<&str> = t["/operator/v1/".len()..].split('/').collect();
            template.len() == segments.len()
                && template.iter().zip(&segments).all(|(t, s)| if t.starts_with('{') { !s.is_empty() } else { t == s })
        })
        .copied()
        .unwrap_or("/operator/v1/other")
}

impl Metrics {
    fn with<T>(&self, f: impl FnOnce(&mut Inner) -> T) -> T {
        f(&mut self.inner.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// One audited decision (allowed, replayed, denied, …) with its error code, if any.
    pub fn decision(&self, tool: &str, decision: &str, code: Option<&str>) {
        let key = (tool.to_string(), decision.to_string(), code.unwrap_or("").to_string());
        self.with(|m| *m.decisions.entry(key).or_default() += 1);
    }

    /// One HTTP request, by its [`route`].
    pub fn http(&self, r: &'static str, status: u16, took: Duration) {
        self.with(|m| {
            *m.http.entry((r, status)).or_default() += 1;
            m.http_latency.entry(r).or_default().observe(took.as_secs_f64());
        });
    }

    pub fn tool(&self, tool: &str, took: Duration) {
        self.with(|m| m.tool_latency.entry(tool.to_string()).or_default().observe(took.as_secs_f64()));
    }

    /// One posting transaction at the backend (the store's cost of moving money).
    pub fn ledger(&self, took: Duration) {
        self.with(|m| m.ledger_latency.observe(took.as_secs_f64()));
    }

    /// One rail callback (`rail` a configured rail's name), by outcome (a fixed set of names).
    pub fn callback(&self, rail: &str, outcome: &'static str) {
        self.with(|m| *m.callbacks.entry((rail.to_string(), outcome)).or_default() += 1);
    }

    /// One webhook delivery attempt to `endpoint` (a configured endpoint's name): `delivered`,
    /// `failed` (tried again later) or `gave_up` (its last attempt failed).
    pub fn webhook_attempt(&self, endpoint: &str, outcome: &'static str) {
        self.with(|m| *m.webhook_attempts.entry((endpoint.to_string(), outcome)).or_default() += 1);
    }

    /// Whether `endpoint`'s webhook breaker is open (its messages held, unsent).
    pub fn webhook_breaker(&self, endpoint: &str, open: bool) {
        self.with(|m| {
            m.webhook_breakers.insert(endpoint.to_string(), open);
        });
    }

    /// One reconciliation finding, by kind (a fixed set of names).
    pub fn reconcile_finding(&self, kind: &str) {
        self.with(|m| *m.reconcile_findings.entry(kind.to_string()).or_default() += 1);
    }

    /// One reconciliation run and how many findings need a human.
    pub fn reconcile_run(&self, problems: u64) {
        self.with(|m| {
            m.reconcile_runs += 1;
            m.reconcile_last_problems = problems;
        });
    }

    /// A bookkeeping write that failed after money moved or was refused (an audit record, an
    /// idempotency completion or release, a rail record): logged where it happens, counted here
    /// so it can be alerted on. `write` is one of a fixed set of names.
    pub fn bookkeeping_failure(&self, write: &'static str) {
        self.with(|m| *m.bookkeeping_failures.entry(write).or_default() += 1);
    }

    /// A record this replica wrote was gone or changed before it was sealed (`audit_witness`).
    pub fn audit_witness_break(&self) {
        self.with(|m| m.audit_witness_breaks += 1);
    }

    /// How many such breaks this replica has seen since it started.
    pub fn audit_witness_breaks(&self) -> u64 {
        self.with(|m| m.audit_witness_breaks)
    }

    /// A call found its idempotency key held by another attempt in flight and waits for it.
    pub fn key_wait(&self) {
        self.with(|m| m.key_waits += 1);
    }

    /// A sealing run of the audit chain: how many records it sealed, the head after, and when it
    /// signed a checkpoint (if it did).
    pub fn audit_sealed(&self, sealed: u64, head: i64, checkpoint_at: Option<i64>) {
        self.with(|m| {
            let c = &mut m.audit_chain;
            c.sealed += sealed;
            c.head = Some(head);
            c.checkpoint_at = checkpoint_at.or(c.checkpoint_at);
        });
    }

    /// A sealing run that failed (the records stay unsealed, unprotected, until one succeeds).
    pub fn audit_seal_failed(&self) {
        self.with(|m| m.audit_chain.failures += 1);
    }

    fn render_audit_chain(&self, out: &mut String) {
        let c = self.with(|m| m.audit_chain);
        out.push_str("# HELP paygate_audit_sealed_total Audit records sealed onto the hash chain by this replica.\n");
        out.push_str("# TYPE paygate_audit_sealed_total counter\n");
        let _ = writeln!(out, "paygate_audit_sealed_total {}", c.sealed);
        out.push_str("# HELP paygate_audit_seal_failures_total Sealing runs that failed (records stay unsealed).\n");
        out.push_str("# TYPE paygate_audit_seal_failures_total counter\n");
        let _ = writeln!(out, "paygate_audit_seal_failures_total {}", c.failures);
        if let Some(head) = c.head {
            out.push_str("# HELP paygate_audit_chain_head The chain's newest position, as this replica last sealed.\n");
            out.push_str("# TYPE paygate_audit_chain_head gauge\n");
            let _ = writeln!(out, "paygate_audit_chain_head {head}");
        }
        if let Some(at) = c.checkpoint_at {
            out.push_str(
                "# HELP paygate_audit_checkpoint_timestamp_seconds When this replica last signed an audit checkpoint.\n",
            );
            out.push_str("# TYPE paygate_audit_checkpoint_timestamp_seconds gauge\n");
            let _ = writeln!(out, "paygate_audit_checkpoint_timestamp_seconds {at}");
        }
    }

    /// The HTTP ledger's circuit breaker, as last seen.
    pub fn breaker(&self, state: &'static str) {
        self.with(|m| m.breaker_state = Some(state));
    }

    fn render_bookkeeping(&self, out: &mut String) {
        let failures = self.with(|m| m.bookkeeping_failures.clone());
        out.push_str(
            "# HELP paygate_bookkeeping_failures_total Audit, idempotency or rail-record writes that failed (logged where they happened).\n",
        );
        out.push_str("# TYPE paygate_bookkeeping_failures_total counter\n");
        for (write, n) in &failures {
            let _ = writeln!(out, "paygate_bookkeeping_failures_total{{write=\"{write}\"}} {n}");
        }
        let waits = self.with(|m| m.key_waits);
        out.push_str(
            "# HELP paygate_idempotency_key_waits_total Calls that found their operation's key held by another attempt in flight and waited for it (up to idempotency.wait_ms_max).\n",
        );
        out.push_str("# TYPE paygate_idempotency_key_waits_total counter\n");
        let _ = writeln!(out, "paygate_idempotency_key_waits_total {waits}");
        let breaks = self.with(|m| m.audit_witness_breaks);
        out.push_str(
            "# HELP paygate_audit_witness_breaks_total Audit records this replica wrote that were deleted or changed in the database before they were sealed.\n",
        );
        out.push_str("# TYPE paygate_audit_witness_breaks_total counter\n");
        let _ = writeln!(out, "paygate_audit_witness_breaks_total {breaks}");
    }

    fn render_rails(&self, out: &mut String) {
        let (callbacks, findings, runs, last, breaker) = self.with(|m| {
            (
                m.callbacks.clone(),
                m.reconcile_findings.clone(),
                m.reconcile_runs,
                m.reconcile_last_problems,
                m.breaker_state,
            )
        });
        let (attempts, webhook_breakers) = self.with(|m| (m.webhook_attempts.clone(), m.webhook_breakers.clone()));
        out.push_str("# HELP paygate_webhook_attempts_total Webhook delivery attempts by endpoint and outcome (delivered, failed, gave_up).\n");
        out.push_str("# TYPE paygate_webhook_attempts_total counter\n");
        for ((endpoint, o), n) in &attempts {
            let _ = writeln!(out, "paygate_webhook_attempts_total{{endpoint=\"{endpoint}\",outcome=\"{o}\"}} {n}");
        }
        out.push_str(
            "# HELP paygate_webhook_breaker_open Whether a webhook endpoint's breaker is open (its messages held).\n",
        );
        out.push_str("# TYPE paygate_webhook_breaker_open gauge\n");
        for (endpoint, open) in &webhook_breakers {
            let _ = writeln!(out, "paygate_webhook_breaker_open{{endpoint=\"{endpoint}\"}} {}", u8::from(*open));
        }
        out.push_str("# HELP paygate_rail_callbacks_total Rail callbacks (M-Pesa, Airtel) by rail and outcome.\n");
        out.push_str("# TYPE paygate_rail_callbacks_total counter\n");
        for ((rail, o), n) in &callbacks {
            let _ = writeln!(out, "paygate_rail_callbacks_total{{rail=\"{rail}\",outcome=\"{o}\"}} {n}");
        }
        out.push_str("# HELP paygate_mpesa_callbacks_total M-Pesa callbacks by outcome (paygate_rail_callbacks_total{rail=\"mpesa\"}).\n");
        out.push_str("# TYPE paygate_mpesa_callbacks_total counter\n");
        for ((_, o), n) in callbacks.iter().filter(|((rail, _), _)| rail == "mpesa") {
            let _ = writeln!(out, "paygate_mpesa_callbacks_total{{outcome=\"{o}\"}} {n}");
        }
        out.push_str(
            "# HELP paygate_reconcile_runs_total Reconciliation runs.\n# TYPE paygate_reconcile_runs_total counter\n",
        );
        let _ = writeln!(out, "paygate_reconcile_runs_total {runs}");
        out.push_str("# HELP paygate_reconcile_findings_total Reconciliation findings by kind.\n");
        out.push_str("# TYPE paygate_reconcile_findings_total counter\n");
        for (k, n) in &findings {
            let _ = writeln!(out, "paygate_reconcile_findings_total{{kind=\"{k}\"}} {n}");
        }
        out.push_str("# HELP paygate_reconcile_open_findings Findings needing a human in the last run.\n");
        out.push_str("# TYPE paygate_reconcile_open_findings gauge\n");
        let _ = writeln!(out, "paygate_reconcile_open_findings {last}");
        if let Some(state) = breaker {
            out.push_str("# HELP paygate_backend_breaker_open 1 while the external ledger's (HTTP ledger's or wallet service's) circuit breaker is open.\n");
            out.push_str("# TYPE paygate_backend_breaker_open gauge\n");
            let _ = writeln!(out, "paygate_backend_breaker_open {}", u8::from(state != "closed"));
        }
    }

    pub fn render(
        &self,
        approvals_pending: Option<i64>,
        store_ping: Option<Duration>,
        group_commit: Option<GroupCommitCounts>,
    ) -> String {
        let m = self.with(|m| {
            (
                m.decisions.clone(),
                m.http.clone(),
                m.http_latency.clone(),
                m.tool_latency.clone(),
                m.ledger_latency.clone(),
            )
        });
        let (decisions, http, http_latency, tool_latency, ledger_latency) = m;
        let mut out = String::new();
        out.push_str("# HELP paygate_decisions_total Audited decisions by tool, decision and error code.\n");
        out.push_str("# TYPE paygate_decisions_total counter\n");
        for ((tool, decision, code), n) in &decisions {
            let _ =
                writeln!(out, "paygate_decisions_total{{tool=\"{tool}\",decision=\"{decision}\",code=\"{code}\"}} {n}");
        }
        let moved: u64 = decisions.iter().filter(|((_, d, _), _)| d == "allowed").map(|(_, n)| n).sum();
        let replays: u64 = decisions.iter().filter(|((_, d, _), _)| d == "replayed").map(|(_, n)| n).sum();
        out.push_str("# HELP paygate_payments_moved_total Payments and refunds that moved money.\n");
        out.push_str("# TYPE paygate_payments_moved_total counter\n");
        let _ = writeln!(out, "paygate_payments_moved_total {moved}");
        out.push_str("# HELP paygate_replays_total Calls answered with an earlier outcome of the same operation.\n");
        out.push_str("# TYPE paygate_replays_total counter\n");
        let _ = writeln!(out, "paygate_replays_total {replays}");
        out.push_str("# HELP paygate_denials_total Refusals by error code.\n# TYPE paygate_denials_total counter\n");
        let mut denials: BTreeMap<&str, u64> = BTreeMap::new();
        for ((_, d, code), n) in &decisions {
            if matches!(d.as_str(), "denied" | "conflict" | "rate_limited" | "failed") && !code.is_empty() {
                *denials.entry(code.as_str()).or_default() += n;
            }
        }
        for (code, n) in denials {
            let _ = writeln!(out, "paygate_denials_total{{code=\"{code}\"}} {n}");
        }
        out.push_str("# HELP paygate_http_requests_total HTTP requests by route and status.\n");
        out.push_str("# TYPE paygate_http_requests_total counter\n");
        for ((r, status), n) in &http {
            let _ = writeln!(out, "paygate_http_requests_total{{route=\"{r}\",status=\"{status}\"}} {n}");
        }
        out.push_str("# HELP paygate_http_request_duration_seconds Time to response headers, by route.\n");
        out.push_str("# TYPE paygate_http_request_duration_seconds histogram\n");
        for (r, h) in &http_latency {
            h.render(&mut out, "paygate_http_request_duration_seconds", &format!("route=\"{r}\""));
        }
        out.push_str("# HELP paygate_tool_duration_seconds Tool call latency inside the gateway, by tool.\n");
        out.push_str("# TYPE paygate_tool_duration_seconds histogram\n");
        for (t, h) in &tool_latency {
            h.render(&mut out, "paygate_tool_duration_seconds", &format!("tool=\"{t}\""));
        }
        out.push_str(
            "# HELP paygate_ledger_transaction_seconds Posting transactions (payments, refunds) at the store.\n",
        );
        out.push_str("# TYPE paygate_ledger_transaction_seconds histogram\n");
        ledger_latency.render(&mut out, "paygate_ledger_transaction_seconds", "");
        if let Some(n) = approvals_pending {
            out.push_str("# HELP paygate_approvals_pending Approvals waiting for a human (the queue depth).\n");
            out.push_str("# TYPE paygate_approvals_pending gauge\n");
            let _ = writeln!(out, "paygate_approvals_pending {n}");
        }
        out.push_str(
            "# HELP paygate_store_up Whether the store answered this scrape.\n# TYPE paygate_store_up gauge\n",
        );
        let _ = writeln!(out, "paygate_store_up {}", u8::from(store_ping.is_some()));
        if let Some(d) = store_ping {
            out.push_str("# HELP paygate_store_ping_seconds Round trip of a trivial store query at scrape time.\n");
            out.push_str("# TYPE paygate_store_ping_seconds gauge\n");
            let _ = writeln!(out, "paygate_store_ping_seconds {}", d.as_secs_f64());
        }
        if let Some(g) = group_commit {
            render_group_commit(&mut out, g);
        }
        self.render_rails(&mut out);
        self.render_bookkeeping(&mut out);
        self.render_audit_chain(&mut out);
        render_build(&mut out);
        render_process(&mut out);
        out
    }
}

/// PostgreSQL's group commit counters as /metrics shows them (the HTTP layer reads them from the
/// store's `Engine::group_commit`; this module imports nothing of the store).
#[derive(Debug, Clone, Copy, Default)]
pub struct GroupCommitCounts {
    pub transfers: u64,
    pub grouped_batches: u64,
    pub grouped_transfers: u64,
    pub fallbacks: u64,
}

/// PostgreSQL's group commit (`store/postgres/batch.rs`): a rising fallback count means batches keep
/// rolling back (each of their transfers then runs alone, slower but still exactly once).
fn render_group_commit(out: &mut String, g: GroupCommitCounts) {
    let counters = [
        ("paygate_postgres_lane_transfers_total", "Transfers handed to a group-commit lane.", g.transfers),
        (
            "paygate_postgres_grouped_batches_total",
            "Transactions that committed two or more transfers.",
            g.grouped_batches,
        ),
        ("paygate_postgres_grouped_transfers_total", "Transfers committed in those transactions.", g.grouped_transfers),
        (
            "paygate_postgres_batch_fallbacks_total",
            "Batches rolled back, their transfers run again alone.",
            g.fallbacks,
        ),
    ];
    for (name, help, n) in counters {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} counter\n{name} {n}");
    }
}

fn render_build(out: &mut String) {
    out.push_str("# HELP paygate_build_info The running build (always 1).\n# TYPE paygate_build_info gauge\n");
    let _ = writeln!(out, "paygate_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"));
}

/// The standard `process_*` metrics (Prometheus' process collector), from /proc; none elsewhere.
fn render_process(out: &mut String) {
    let Some(p) = process::read() else { return };
    let mut gauge = |name: &str, kind: &str, help: &str, value: f64| {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}");
    };
    gauge("process_cpu_seconds_total", "counter", "User and system CPU time spent, in seconds.", p.cpu_seconds);
    gauge("process_resident_memory_bytes", "gauge", "Resident memory size, in bytes.", p.resident_bytes);
    gauge("process_virtual_memory_bytes", "gauge", "Virtual memory size, in bytes.", p.virtual_bytes);
    gauge(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since the Unix epoch, in seconds.",
        p.start_time,
    );
    gauge("process_open_fds", "gauge", "Open file descriptors.", p.open_fds);
    if let Some(max) = p.max_fds {
        gauge("process_max_fds", "gauge", "The limit on open file descriptors.", max);
    }
    gauge("process_threads", "gauge", "OS threads in the process.", p.threads);
}

mod process {
    pub struct Process {
        pub cpu_seconds: f64,
        pub resident_bytes: f64,
        pub virtual_bytes: f64,
        pub start_time: f64,
        pub open_fds: f64,
        pub max_fds: Option<f64>,
        pub threads: f64,
    }

    /// `/proc/self/stat` (fields after the command name, which may contain spaces), `/proc/stat`'s
    /// boot time, `/proc/self/fd`, `/proc/self/limits`.
    pub fn read() -> Option<Process> {
        let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
        let fields: Vec<&str> = stat.rsplit_once(')')?.1.split_whitespace().collect();
        // After ")": state is field 3 of proc(5), so field n is fields[n - 3].
        let num = |n: usize| fields.get(n - 3).and_then(|v| v.parse::<f64>().ok());
        // SAFETY: sysconf has no preconditions; it returns -1 for an unknown name.
        let ticks = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as f64;
        if ticks <= 0.0 || page <= 0.0 {
            return None;
        }
        let boot = std::fs::read_to_string("/proc/stat")
            .ok()?
            .lines()
            .find_map(|l| l.strip_prefix("btime ").and_then(|v| v.trim().parse::<f64>().ok()))?;
        let open_fds = std::fs::read_dir("/proc/self/fd").ok()?.count() as f64;
        let max_fds = std::fs::read_to_string("/proc/self/limits").ok().and_then(|l| {
            l.lines()
                .find(|line| line.starts_with("Max open files"))
                .and_then(|line| line.split_whitespace().nth(3).and_then(|v| v.parse::<f64>().ok()))
        });
        Some(Process {
            cpu_seconds: (num(14)? + num(15)?) / ticks,
            threads: num(20)?,
            start_time: boot + num(22)? / ticks,
            virtual_bytes: num(23)?,
            resident_bytes: num(24)? * page,
            open_fds,
            max_fds,
        })
    }
}

/// `paygate_rail_breaker_open{rail,endpoint}`: 1 while that endpoint's circuit is not closed (its
/// requests are refused unsent), from the rails' breakers as they stand at the scrape.
pub fn render_rail_circuits(circuits: &[(&'static str, &'static str, &'static str)]) -> String {
    let mut out = String::new();
    if circuits.is_empty() {
        return out;
    }
    out.push_str("# HELP paygate_rail_breaker_open Whether a rail endpoint's circuit breaker is open or half-open (requests refused unsent).\n");
    out.push_str("# TYPE paygate_rail_breaker_open gauge\n");
    for (rail, endpoint, state) in circuits {
        let open = u8::from(*state != "closed");
        let _ = writeln!(out, "paygate_rail_breaker_open{{rail=\"{rail}\",endpoint=\"{endpoint}\"}} {open}");
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn operator_routes_fold_to_their_templates() {
        assert_eq!(route("/operator/v1/payments"), "/operator/v1/payments");
        assert_eq!(route("/operator/v1/approvals/apr_1/approve"), "/operator/v1/approvals/{approval_id}/approve");
        assert_eq!(route("/operator/v1/principals/bot%20x/resume"), "/operator/v1/principals/{subject}/resume");
        assert_eq!(route("/operator/v1/reconciliation/run"), "/operator/v1/reconciliation/run");
        for other in ["/operator/v1/payments/", "/operator/v1/nope", "/operator/v1/approvals/a/b/c"] {
            assert_eq!(route(other), "/operator/v1/other", "{other}");
        }
        for t in OPERATOR_ROUTES {
            assert_eq!(route(t), *t, "a template folds to itself");
        }
    }

    #[test]
    fn renders_counters_and_histograms() {
        let m = Metrics::default();
        m.decision("create_payment", "allowed", None);
        m.decision("create_payment", "replayed", None);
        m.decision("create_payment", "denied", Some("ACCOUNT_NOT_ALLOWED"));
        m.http(route("/approvals/apr_123/approve"), 200, Duration::from_millis(3));
        m.http(route("/operator/v1/payments/pay_123"), 200, Duration::from_millis(3));
        m.tool("get_balance", Duration::from_micros(700));
        let text = m.render(Some(2), Some(Duration::from_millis(1)), None);
        assert!(text.contains("paygate_payments_moved_total 1"));
        assert!(text.contains("paygate_replays_total 1"));
        assert!(text.contains("paygate_denials_total{code=\"ACCOUNT_NOT_ALLOWED\"} 1"));
        assert!(text.contains("paygate_http_requests_total{route=\"/approvals\",status=\"200\"} 1"));
        assert!(
            text.contains("paygate_http_requests_total{route=\"/operator/v1/payments/{payment_id}\",status=\"200\"} 1")
        );
        assert!(text.contains("paygate_tool_duration_seconds_bucket{tool=\"get_balance\",le=\"0.001\"} 1"));
        assert!(text.contains("paygate_tool_duration_seconds_bucket{tool=\"get_balance\",le=\"0.0005\"} 0"));
        assert!(text.contains("paygate_approvals_pending 2"));
        assert!(text.contains("paygate_store_up 1"));
        assert!(text.contains(&format!("paygate_build_info{{version=\"{}\"}} 1", env!("CARGO_PKG_VERSION"))));
        let value = |name: &str| -> f64 {
            let line = text.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap_or_else(|| panic!("{name}"));
            line.rsplit(' ').next().unwrap().parse().unwrap()
        };
        assert!(value("process_resident_memory_bytes") > 1e6, "a live process has resident memory");
        assert!(value("process_threads") >= 1.0 && value("process_open_fds") >= 3.0);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs_f64();
        let started = value("process_start_time_seconds");
        assert!(started <= now + 1.0 && started > now - 86_400.0, "started {started}, now {now}");
        assert!(value("process_cpu_seconds_total") >= 0.0);
    }
}
