#!/usr/bin/env python3
"""The README check: run what README.md tells a newcomer to run, exactly as written, on a fresh copy.

    python3 tests/readme/check.py          (.ci/run runs it after cargo test and the interop suite)

On a fresh copy of the repository (the tracked and not-ignored files of this checkout, so no ./data and
no config), in README order:

1. the first command, `cargo run --release`, must start the gateway and print the MCP URL and a dev
   token; tools/list with that token must list the tools;
2. the "Try it" block runs with that token (initialize, a payment, an over-limit payment);
3. every one-shot `cargo run --release -- <subcommand> …` line runs as written; a line that holds a
   placeholder (`…`, `...`, `<x>`) runs as `<subcommand> --help` instead (optional `[…]` parts are
   dropped first);
4. the README's Python client runs against the gateway (with the interop suite's pinned `mcp`, when
   tests/interop/run.sh has installed it);
5. every other server the README starts (`cargo run --release …` with environment or --config, and
   `ledger-serve`) starts, block by block, and answers its health probe; with the demo's server
   (`init --demo`) the demo block runs and must show an STK push, a payout and an Airtel collection
   go pending → succeeded;
6. `paygate <subcommand>` lines (an installed binary) and the benchmark run as `--help`.

Lines that cannot run here (third-party CLIs such as `claude`, curl lines with placeholders) are listed
as not run. The first failure stops the check with the command that broke and its output.
The copy's target/ is a link to this checkout's, so the release build is made once.
"""

from __future__ import annotations

import json
import os
import queue
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIRST_START_SECS = 1500  # the first `cargo run --release` compiles the release build
START_SECS = 120
ONE_SHOT_SECS = 300
PLACEHOLDER = re.compile(r"…|\.\.\.|<[A-Za-z][^<>]*>")
ENV_ASSIGN = re.compile(r"^(?:[A-Z_][A-Z0-9_]*=(?:'[^']*'|\"[^\"]*\"|\S*)\s+)+")
READY_LINES = ("paygate MCP endpoint: ", "paygate ledger service: ")


class CheckFailed(Exception):
    pass


@dataclass
class Block:
    lang: str
    start_line: int
    commands: list[str] = field(default_factory=list)
    text: str = ""


def blocks(readme: str) -> list[Block]:
    """Fenced code blocks; shell blocks split into commands (continuations joined, comments dropped)."""
    out: list[Block] = []
    lines = readme.splitlines()
    i = 0
    while i < len(lines):
        # Fences may be indented (a block inside a list item); the body loses the same indentation.
        m = re.match(r"^(\s*)```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        pad = m.group(1)
        block = Block(lang=m.group(2), start_line=i + 1)
        i += 1
        body: list[str] = []
        while i < len(lines) and not lines[i].strip().startswith("```"):
            body.append(lines[i][len(pad):] if lines[i].startswith(pad) else lines[i])
            i += 1
        i += 1
        block.text = "\n".join(body) + "\n"
        if block.lang in ("sh", "bash"):
            pending = ""
            for raw in body:
                line = pending + strip_comment(raw)
                if line.rstrip().endswith("\\"):
                    pending = line.rstrip()[:-1] + " "
                    continue
                if not complete(line):  # a quoted string spans lines
                    pending = line + "\n"
                    continue
                pending = ""
                if line.strip():
                    block.commands.append(re.sub(r"[ \t]+", " ", line.strip()))
        out.append(block)
    return out


def complete(cmd: str) -> bool:
    """Whether every quote in `cmd` is closed."""
    try:
        shlex.split(cmd)
        return True
    except ValueError:
        return False


def strip_comment(line: str) -> str:
    """Drop a trailing `# comment` that is outside quotes."""
    quote = None
    for idx, ch in enumerate(line):
        if quote:
            if ch == quote:
                quote = None
        elif ch in "'\"":
            quote = ch
        elif ch == "#" and (idx == 0 or line[idx - 1] in " \t"):
            return line[:idx]
    return line


def prose(readme: str) -> str:
    """The README without its fenced code blocks."""
    return re.sub(r"^\s*```.*?^\s*```", "", readme, flags=re.S | re.M)


def cargo_args(cmd: str) -> list[str] | None:
    """The arguments after `cargo run --release --` (or [] for none); None if not a `cargo run --release` line."""
    m = re.search(r"cargo run --release(?: -- (.*?))?(?:\)|$)", cmd)
    if not m:
        return None
    return shlex.split(m.group(1) or "")


def subcommand(args: list[str]) -> str | None:
    i = 0
    while i < len(args):
        if args[i] == "--config":
            i += 2
            continue
        if args[i].startswith("--config="):
            i += 1
            continue
        return args[i]
    return None


def is_server(cmd: str) -> bool:
    args = cargo_args(cmd)
    return args is not None and "$(" not in cmd and subcommand(args) in (None, "serve", "ledger-serve")


def port_free(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def wait_port_free(port: int, secs: float = 15) -> None:
    deadline = time.monotonic() + secs
    while not port_free(port):
        if time.monotonic() > deadline:
            raise CheckFailed(f"port {port} is taken (the README's commands use it); free it and run again")
        time.sleep(0.2)


class Runner:
    def __init__(self, work: Path, env: dict[str, str]):
        self.work = work
        self.env = env
        self.servers: list[tuple[str, subprocess.Popen, Path]] = []
        self.ok = 0
        self.not_run: list[str] = []

    def say(self, status: str, cmd: str, note: str = "") -> None:
        print(f"{status:<5} {cmd}{'   (' + note + ')' if note else ''}", flush=True)

    def bash(self, cmd: str, secs: int = ONE_SHOT_SECS, extra_env: dict[str, str] | None = None) -> str:
        env = dict(self.env, **(extra_env or {}))
        try:
            p = subprocess.run(["bash", "-euo", "pipefail", "-c", cmd], cwd=self.work, env=env, capture_output=True,
                               text=True, timeout=secs)
        except subprocess.TimeoutExpired:
            raise CheckFailed(f"{cmd}\n  did not finish within {secs} s")
        if p.returncode != 0:
            raise CheckFailed(f"{cmd}\n  exit {p.returncode}\n{indent(p.stdout + p.stderr)}")
        return p.stdout

    def start(self, cmd: str, secs: int) -> tuple[str, str | None]:
        """Start a server line and wait for its ready line. Returns (ready line, dev token if printed)."""
        m = re.search(r"--bind (\S+)", cmd) or re.search(r"PAYGATE_SERVER__BIND=(\S+)", cmd)
        port = int(m.group(1).rsplit(":", 1)[1]) if m else 8080
        wait_port_free(port)
        log = self.work / f"server-{len(self.servers)}.log"
        p = subprocess.Popen(["bash", "-c", cmd], cwd=self.work, env=self.env, stdout=subprocess.PIPE,
                             stderr=open(log, "w"), text=True, start_new_session=True)
        self.servers.append((cmd, p, log))
        lines: queue.Queue[str | None] = queue.Queue()

        def pump() -> None:
            assert p.stdout is not None
            for line in p.stdout:
                lines.put(line.rstrip("\n"))
            lines.put(None)

        threading.Thread(target=pump, daemon=True).start()
        seen: list[str] = []
        ready, token = None, None
        deadline = time.monotonic() + secs
        while True:
            # After the ready line, the dev token (when printed) follows at once.
            wait = deadline - time.monotonic() if ready is None else 2.0
            try:
                line = lines.get(timeout=max(wait, 0.01))
            except queue.Empty:
                break
            if line is None:
                raise CheckFailed(f"{cmd}\n  exited ({p.wait()}) before it was ready\n{indent(chr(10).join(seen) + log.read_text())}")
            seen.append(line)
            if ready is None and line.startswith(READY_LINES):
                ready = line
            elif len(seen) >= 2 and seen[-2].startswith("dev token"):
                token = line.strip()
                break
        if not ready:
            raise CheckFailed(f"{cmd}\n  printed no {' / '.join(READY_LINES)} line within {secs} s\n{indent(chr(10).join(seen) + log.read_text())}")
        self.probe(port, cmd)
        return ready, token

    def probe(self, port: int, cmd: str) -> None:
        path = "/v1/health" if "ledger-serve" in cmd else "/readyz"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=10) as r:
                if r.status != 200:
                    raise CheckFailed(f"{cmd}\n  {path} answered {r.status}")
        except OSError as e:
            raise CheckFailed(f"{cmd}\n  {path} did not answer: {e}")

    def stop_servers(self) -> None:
        for _, p, _ in reversed(self.servers):
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGINT)
                try:
                    p.wait(15)
                except subprocess.TimeoutExpired:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
        self.servers.clear()


def short(cmd: str, n: int = 110) -> str:
    one = re.sub(r"\s+", " ", cmd)
    return one if len(one) <= n else one[: n - 1] + "…"


def indent(text: str, n: int = 40) -> str:
    lines = text.strip().splitlines()[-n:]
    return "\n".join("    " + l for l in lines)


def mcp_post(url: str, token: str, body: dict, session: str | None = None) -> tuple[dict, dict]:
    headers = {"authorization": f"Bearer {token}", "content-type": "application/json",
               "accept": "application/json, text/event-stream"}
    if session:
        headers["mcp-session-id"] = session
        headers["mcp-protocol-version"] = "2025-11-25"
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers=headers, method="POST")
    with urllib.request.urlopen(req, timeout=30) as r:
        text = r.read().decode()
        hdrs = {k.lower(): v for k, v in r.headers.items()}
    if hdrs.get("content-type", "").startswith("text/event-stream"):
        data = [l[5:].strip() for l in text.splitlines() if l.startswith("data:") and l[5:].strip()]
        return (json.loads(data[-1]) if data else {}), hdrs
    return (json.loads(text) if text.strip() else {}), hdrs


def tools_list(url: str, token: str) -> list[str]:
    init, hdrs = mcp_post(url, token, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "readme-check", "version": "1"}}})
    session = hdrs.get("mcp-session-id")
    if not session or "result" not in init:
        raise CheckFailed(f"initialize with the printed token failed: {init}")
    mcp_post(url, token, {"jsonrpc": "2.0", "method": "notifications/initialized"}, session)
    res, _ = mcp_post(url, token, {"jsonrpc": "2.0", "id": 2, "method": "tools/list"}, session)
    return [t["name"] for t in res.get("result", {}).get("tools", [])]


def fresh_copy(dest: Path) -> None:
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           capture_output=True, check=True).stdout.split(b"\0")
    for f in files:
        if not f:
            continue
        src = ROOT / f.decode()
        if not src.is_file():
            continue  # deleted in the work tree
        dst = dest / f.decode()
        dst.parent.mkdir(parents=True, exist_ok=True)
        dst.write_bytes(src.read_bytes())
        dst.chmod(src.stat().st_mode & 0o777)


def main() -> int:
    readme = (ROOT / "README.md").read_text()
    all_blocks = blocks(readme)
    shell = [b for b in all_blocks if b.commands]
    if not shell or shell[0].commands[0] != "cargo run --release":
        print("README check failed: the README's first command is not `cargo run --release`")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="paygate-readme-"))
    work = tmp / "paygate"
    fresh_copy(work)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PAYGATE_")}
    # This checkout's target directory ($CARGO_TARGET_DIR when set) stands in for the copy's, so the
    # release build is made once (and `target/release/…` paths in the README resolve as written).
    (work / "target").symlink_to(Path(os.environ.get("CARGO_TARGET_DIR") or ROOT / "target"))
    env["CARGO_TERM_COLOR"] = "never"
    r = Runner(work, env)
    print(f"README check on a fresh copy in {work}", flush=True)
    try:
        # 1. The first command, and a client with its token.
        ready, token = r.start("cargo run --release", FIRST_START_SECS)
        if not token:
            raise CheckFailed("cargo run --release\n  printed no dev token")
        mcp_url = ready.split(": ", 1)[1].strip()
        names = tools_list(mcp_url, token)
        if "create_payment" not in names or "get_balance" not in names:
            raise CheckFailed(f"tools/list with the printed token: {names}")
        r.ok += 1
        r.say("ok", "cargo run --release", f"serves {mcp_url}; tools/list with the printed token: {len(names)} tools")

        # 2. The "Try it" block, with the printed token.
        try_it = next((b for b in shell if any(c.startswith("TOKEN=") for c in b.commands)), None)
        if try_it is None:
            raise CheckFailed("no \"Try it\" block (TOKEN=…) in the README")
        script = re.sub(r"^TOKEN=\S+", lambda _: f"TOKEN={token}", try_it.text, count=1, flags=re.M)
        out = r.bash(script, secs=60)
        for want in ('"payment_id"', "APPROVAL_REQUIRED"):
            if want not in out:
                raise CheckFailed(f"the Try it block (README line {try_it.start_line}) printed no {want}:\n{indent(out)}")
        r.ok += 1
        r.say("ok", f"Try it block (README line {try_it.start_line})", "a payment and an APPROVAL_REQUIRED")

        # 3. One-shot `cargo run --release -- …` lines, in code blocks and in the prose.
        one_shots = [c for b in shell for c in b.commands]
        one_shots += [re.sub(r"\s+", " ", m.group(1)) for m in re.finditer(r"`(cargo run --release[^`]*)`", prose(readme))]
        done: set[str] = set()
        for cmd in one_shots:
            args = cargo_args(cmd)
            if args is None or is_server(cmd) or cmd in done:
                continue
            done.add(cmd)
            run, note = cmd, ""
            stripped = re.sub(r"\s*\[[^\]]*\]", "", cmd)
            if PLACEHOLDER.search(stripped):
                sub = subcommand(args) or ""
                words = [sub] + ([args[args.index(sub) + 1]] if sub == "mandate" else [])
                run = f"cargo run --release -- {' '.join(words)} --help"
                note = "placeholder: ran " + run
            elif stripped != cmd:
                run = stripped
                note = "optional part dropped: ran " + run
            # `VAR=$(…)` and `export VAR=$(…)` hide the inner exit code: check the variable got a value.
            assigned = re.match(r"^(?:export )?([A-Z_][A-Z0-9_]*)=\$\(", run)
            if assigned:
                run = f'{run}\ntest -n "${{{assigned.group(1)}}}"'
            out = r.bash(run, extra_env={"PAYGATE_TOKEN": token})
            if subcommand(args) == "token" and not assigned and out.strip().count(".") != 2:
                raise CheckFailed(f"{cmd}\n  printed no token: {out!r}")
            if subcommand(args) == "tools" and "create_payment" not in out:
                raise CheckFailed(f"{cmd}\n  lists no create_payment:\n{indent(out)}")
            r.ok += 1
            r.say("ok", cmd, note)

        # 4. The README's Python client against the running gateway.
        python = ROOT / "tests/interop/.venv/bin/python"
        for b in all_blocks:
            if b.lang != "python":
                continue
            if not python.exists():
                r.not_run.append(f"Python block (README line {b.start_line}): run tests/interop/run.sh first to install mcp 2.3.0")
                continue
            p = subprocess.run([str(python), "-c", b.text], cwd=work, env=dict(env, PAYGATE_TOKEN=token),
                               capture_output=True, text=True, timeout=120)
            if p.returncode != 0 or "acct-A" not in p.stdout or "INSUFFICIENT_SCOPE" in p.stdout:
                raise CheckFailed(f"the Python block (README line {b.start_line}) failed (exit {p.returncode}):\n{indent(p.stdout + p.stderr)}")
            r.ok += 1
            r.say("ok", f"Python block (README line {b.start_line})", "get_balance through the official SDK")
        r.stop_servers()

        # 5. Every other server, block by block. The demo's server (`init --demo`, M-Pesa simulated)
        #    also runs the demo block: an STK push, a payout (M-Pesa) and a collection (Airtel) go
        #    pending → paid on the simulators.
        demo = next((b for b in shell if "/simulator/control/" in b.text), None)
        for b in shell:
            servers = [c for c in b.commands if is_server(c) and c != "cargo run --release"]
            for cmd in servers:
                ready, _ = r.start(cmd, START_SECS)
                r.ok += 1
                r.say("ok", cmd, ready.strip())
                if demo is not None and "demo/paygate.toml" in cmd:
                    out = r.bash(demo.text, secs=120)
                    calls = re.findall(r'"structuredContent":\{[^{}]*"status":"(\w+)"', out)
                    if calls != ["pending", "succeeded"] * 3 or out.count('"callback_status":200') != 3:
                        raise CheckFailed(f"the demo block (README line {demo.start_line}) did not go pending → paid thrice "
                                          f"(statuses {calls}):\n{indent(out)}")
                    r.ok += 1
                    r.say("ok", f"demo block (README line {demo.start_line})", "an STK push, a payout and an Airtel collection: pending → succeeded on the simulators")
            r.stop_servers()

        # 6. The installed binary's subcommands, the benchmark, cargo build.
        for b in shell:
            for cmd in b.commands:
                bare = ENV_ASSIGN.sub("", cmd)
                if bare.startswith("paygate "):
                    words = shlex.split(bare)
                    run = f"target/release/paygate {words[1]} --help"
                    r.bash(run)
                    r.ok += 1
                    r.say("ok", cmd, f"ran `paygate {words[1]} --help`")
                elif "paygate-bench" in bare:
                    r.bash("cargo build --release && target/release/paygate-bench --help")
                    r.ok += 1
                    r.say("ok", cmd, "the benchmark takes minutes: ran its --help")
                elif bare == "cargo test" or bare.startswith("cargo test "):
                    r.not_run.append(f"{cmd}: .ci/run runs the test suite itself")
                elif cargo_args(cmd) is None and not cmd.startswith(("TOKEN=", "MCP=", "H=(", "SID=", "curl ", "export PAYGATE_TOKEN")):
                    r.not_run.append(f"{short(cmd)}: not paygate's (or needs a live value)")
                elif cmd.startswith("curl ") and b is not try_it:
                    r.not_run.append(f"{short(cmd)}: needs a live value")
    except CheckFailed as e:
        print(f"FAIL  {e}", flush=True)
        print("README check failed: the command above does not work as the README says", flush=True)
        return 1
    finally:
        r.stop_servers()
    shutil.rmtree(tmp, ignore_errors=True)  # kept when the check fails, for a look
    for line in r.not_run:
        r.say("skip", line)
    print(f"README check: {r.ok} commands work as written; {len(r.not_run)} lines not run (listed above)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
