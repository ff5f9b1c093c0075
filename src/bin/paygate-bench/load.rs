//! The load generator and the CPU it costs. wrk drives the load when it is on the machine (or can
//! be installed from Debian's packages): an event loop in C with a LuaJIT script per scenario,
//! which leaves the cores to the server it measures; its own CPU is read and shown. Without it the
//! in-process reqwest loop drives the load, sharing the cores with the server and compressing every
//! ratio toward 1; the output says which one ran. The server's CPU per request is read from
//! /proc/<pid>/stat around the run, whichever generator drove it.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::{Era, Scenario};

/// Clock ticks per second of /proc's CPU times (USER_HZ: 100 on Linux).
const TICKS_PER_SEC: f64 = 100.0;

/// Threads of wrk: one per core of this machine's two, as wrk's own guide recommends.
const WRK_THREADS: usize = 2;

/// How the load is generated.
pub struct Load {
    pub wrk: Option<PathBuf>,
    /// What the output says about the generator (found, installed, or absent).
    pub note: String,
}

impl Load {
    /// wrk on PATH; else, as root, `apt-get install -y wrk` (Debian's package); else none.
    pub fn find() -> Load {
        if let Some(p) = on_path("wrk") {
            return Load { note: format!("load by wrk ({})", p.display()), wrk: Some(p) };
        }
        let root = std::fs::read_to_string("/proc/self/status")
            .ok()
            .and_then(|s| s.lines().find(|l| l.starts_with("Uid:")).map(|l| l.split_whitespace().nth(1) == Some("0")))
            .unwrap_or(false);
        if root {
            let installed = Command::new("apt-get")
                .args(["install", "-y", "-q", "wrk"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if let (true, Some(p)) = (installed, on_path("wrk")) {
                return Load {
                    note: format!("load by wrk ({}, installed now from Debian's packages)", p.display()),
                    wrk: Some(p),
                };
            }
        }
        Load {
            wrk: None,
            note: "load by the in-process generator (wrk not found): it shares the cores with the server, so every \
                   ratio is compressed toward 1"
                .into(),
        }
    }
}

fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?.to_str()?.split(':').map(|d| Path::new(d).join(name)).find(|p| p.is_file())
}

/// A process's CPU time so far (user + system), in seconds.
pub fn cpu_secs(pid: u32) -> Option<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let fields = stat_fields(&stat);
    Some((fields.get(11)?.parse::<f64>().ok()? + fields.get(12)?.parse::<f64>().ok()?) / TICKS_PER_SEC)
}

/// The CPU time of this process's waited-for children (user + system), in seconds.
fn children_cpu_secs() -> f64 {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap_or_default();
    let fields = stat_fields(&stat);
    let at = |i: usize| fields.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (at(13) + at(14)) / TICKS_PER_SEC
}

/// /proc/<pid>/stat's fields after the command name (which may hold spaces): field 3 is first.
fn stat_fields(stat: &str) -> Vec<&str> {
    stat.rsplit_once(')').map_or("", |(_, rest)| rest).split_whitespace().collect()
}

/// One scenario's run, whichever generator drove it.
#[derive(Debug, Default, Clone)]
pub struct Measured {
    pub ok: u64,
    pub errors: u64,
    pub secs: f64,
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub first_error: Option<String>,
    /// The server's CPU per answered request, in milliseconds.
    pub server_cpu_ms: Option<f64>,
    /// The load generator's own CPU, in cores (wrk only; the in-process one is this process).
    pub load_cores: Option<f64>,
}

impl Measured {
    pub fn rps(&self) -> f64 {
        self.ok as f64 / self.secs.max(1e-9)
    }
}

/// What one scenario sends: to whom, as whom.
pub struct Target<'a> {
    pub url: &'a str,
    /// The server's process (for its CPU), when the bench started it.
    pub pid: Option<u32>,
    /// Tokens the requests rotate through (several agents: one agent's quota is bounded); for
    /// the many-payers scenario, agent i's token pays from acct-P{i} to acct-Q{i}.
    pub tokens: Vec<String>,
}

/// The JSON a scenario's check looks for in a response (and whether it must be an error).
fn expected(s: Scenario) -> (&'static [&'static str], bool) {
    match s {
        Scenario::Balance => (&[r#""account_id":"acct-A""#], false),
        Scenario::UniquePayments | Scenario::ManyPayers => (&[r#""replayed":false"#, r#""status":"succeeded""#], false),
        Scenario::RetryStorm => (&[r#""payment_id":""#], false),
        Scenario::OverLimit => (&["APPROVAL_REQUIRED"], true),
        Scenario::Baseline => (&[r#""ok":true"#], false),
    }
}

/// The Lua expression of a request's (tool name, arguments JSON), given `n` (the thread's request
/// number), `tid` (its thread) and `run_id`.
fn tool_and_args(s: Scenario) -> (&'static str, &'static str) {
    match s {
        Scenario::Baseline => ("x", r#"'{}'"#),
        Scenario::Balance => ("get_balance", r#"'{"account_id":"acct-A"}'"#),
        Scenario::UniquePayments => (
            "create_payment",
            r#"string.format('{"operation_id":"%s-%d-%d","from_account":"acct-A","to_account":"acct-B","amount":"1.00","currency":"KES"}', run_id, tid, n)"#,
        ),
        Scenario::ManyPayers => (
            "create_payment",
            r#"string.format('{"operation_id":"%s-%d-%d","from_account":"acct-P%d","to_account":"acct-Q%d","amount":"1.00","currency":"KES"}', run_id, tid, n, (pick - 1) % 64, (pick - 1) % 64)"#,
        ),
        Scenario::RetryStorm => (
            "create_payment",
            r#"string.format('{"operation_id":"%s-storm","from_account":"acct-A","to_account":"acct-B","amount":"1.00","currency":"KES"}', run_id)"#,
        ),
        // An agent retrying its over-limit calls: the same approvals answer every time.
        Scenario::OverLimit => (
            "create_payment",
            r#"string.format('{"operation_id":"%s-big-%d-%d","from_account":"acct-A","to_account":"acct-B","amount":"5000.00","currency":"KES"}', run_id, tid, n % 8)"#,
        ),
    }
}

fn lua_list(items: &[String]) -> String {
    items.iter().map(|t| format!("{t:?}")).collect::<Vec<_>>().join(", ")
}

/// The wrk script of one scenario: requests built in Lua, every response checked, the counts and
/// latency percentiles printed on one line at the end.
fn script(s: Scenario, era: Era, tokens: &[String], sessions: &[String], run_id: &str) -> String {
    let (tool, args) = tool_and_args(s);
    let (markers, must_fail) = expected(s);
    let meta = match era {
        Era::Modern => {
            r#","_meta":{"io.modelcontextprotocol/protocolVersion":"2026-07-28","io.modelcontextprotocol/clientCapabilities":{}}"#
        }
        Era::Legacy => "",
    };
    let era_headers = match era {
        Era::Modern => format!(
            "headers[\"mcp-protocol-version\"] = \"2026-07-28\"; headers[\"mcp-method\"] = \"tools/call\"; headers[\"mcp-name\"] = \"{tool}\""
        ),
        Era::Legacy => {
            "headers[\"mcp-protocol-version\"] = \"2025-11-25\"; headers[\"mcp-session-id\"] = sessions[pick]".into()
        }
    };
    format!(
        r#"-- paygate-bench: {label}
local tokens = {{ {tokens} }}
local sessions = {{ {sessions} }}
local run_id = {run_id:?}
local markers = {{ {markers} }}
local must_fail = {must_fail}
local threads = {{}}
local next_tid = 0
function setup(thread)
  next_tid = next_tid + 1
  thread:set("tid", next_tid)
  table.insert(threads, thread)
end
function init(args)
  n = 0
  ok = 0
  bad = 0
  first_bad = ""
end
function request()
  n = n + 1
  -- Consecutive requests of a thread (on its different connections) take different tokens and,
  -- in the 2025-11-25 era, different sessions, as that many separate clients would.
  local pick = ((n * 2 + tid) % #tokens) + 1
  local headers = {{}}
  headers["Content-Type"] = "application/json"
  headers["Accept"] = "application/json, text/event-stream"
  headers["Authorization"] = "Bearer " .. tokens[pick]
  {era_headers}
  local body = string.format('{{"jsonrpc":"2.0","id":%d,"method":"tools/call","params":{{"name":"{tool}","arguments":%s{meta}}}}}', n, {args})
  return wrk.format("POST", nil, headers, body)
end
function response(status, headers, body)
  local good = status == 200
  for _, m in ipairs(markers) do
    good = good and string.find(body, m, 1, true) ~= nil
  end
  good = good and ((string.find(body, '"isError":true', 1, true) ~= nil) == must_fail)
  if good then
    ok = ok + 1
  else
    bad = bad + 1
    if first_bad == "" then first_bad = status .. " " .. string.sub(body, 1, 200) end
  end
end
function done(summary, latency, requests)
  local tok, tbad, fb = 0, 0, ""
  for _, t in ipairs(threads) do
    tok = tok + t:get("ok")
    tbad = tbad + t:get("bad")
    if fb == "" then fb = t:get("first_bad") end
  end
  -- Requests wrk gave up on (timeouts, broken connections) got no answer to check: errors too.
  local e = summary.errors
  tbad = tbad + e.connect + e.read + e.write + e.timeout
  io.write(string.format("WRK_RESULT %.0f %.0f %.0f %.0f %.0f\n", tok, tbad, summary.duration, latency:percentile(50), latency:percentile(99)))
  io.write("WRK_FIRST_BAD " .. fb:gsub("\n", " ") .. "\n")
end
"#,
        label = s.label(),
        tokens = lua_list(tokens),
        sessions = lua_list(sessions),
        markers = markers.iter().map(|m| format!("'{m}'")).collect::<Vec<_>>().join(", "),
    )
}

/// Drive scenario `s` against `t` with wrk for `secs` seconds over `connections` connections.
/// `sessions`: the 2025-11-25 era's session ids, one per token of `t` (empty for the stateless
/// era); the many-payers' agent i is token i modulo 64.
pub fn run_wrk(
    wrk: &Path,
    s: Scenario,
    era: Era,
    t: &Target<'_>,
    sessions: &[String],
    (connections, secs): (u64, u64),
    run_id: &str,
) -> Measured {
    let dir = std::env::temp_dir().join(format!("paygate-bench-wrk-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).expect("script dir");
    let path = dir.join("scenario.lua");
    std::fs::write(&path, script(s, era, &t.tokens, sessions, run_id)).expect("script");
    let server0 = t.pid.and_then(cpu_secs);
    let load0 = children_cpu_secs();
    let out = Command::new(wrk)
        .args(["-t", &WRK_THREADS.to_string(), "-c", &connections.to_string(), "-d", &format!("{secs}s")])
        .args(["--timeout", "10s", "-s"])
        .arg(&path)
        .arg(t.url)
        .stderr(Stdio::inherit())
        .output()
        .expect("wrk");
    let load1 = children_cpu_secs();
    let server1 = t.pid.and_then(cpu_secs);
    let _ = std::fs::remove_dir_all(&dir);
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text.lines().find_map(|l| l.strip_prefix("WRK_RESULT ")).unwrap_or_else(|| panic!("wrk: {text}"));
    let f: Vec<f64> = line.split_whitespace().filter_map(|v| v.parse().ok()).collect();
    let (ok, errors, micros) = (f[0] as u64, f[1] as u64, f[2]);
    let secs = micros / 1e6;
    let first = text.lines().find_map(|l| l.strip_prefix("WRK_FIRST_BAD ")).map(str::trim).filter(|l| !l.is_empty());
    Measured {
        ok,
        errors,
        secs,
        p50_ms: f[3] / 1000.0,
        p99_ms: f[4] / 1000.0,
        first_error: first.map(str::to_string),
        server_cpu_ms: server0.zip(server1).map(|(a, b)| (b - a) * 1000.0 / (ok + errors).max(1) as f64),
        load_cores: Some((load1 - load0) / secs.max(1e-9)),
    }
}
