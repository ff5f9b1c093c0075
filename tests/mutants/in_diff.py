#!/usr/bin/env python3
"""The diff CI's mutation step mutates (tests/mutants/run.sh --in-diff).

    in_diff.py BASE OUT FILE...

FILE... are the core's files. Writes to OUT a unified diff of the core since BASE that
cargo-mutants' `--in-diff` reads, in which a core file whose *unit tests* changed since BASE
appears as added in full: every mutant of that file is run again, so a change that only weakens a
test (an assertion dropped, a case deleted) is seen — the mutants it stopped catching survive. A
file's unit tests are its `#[cfg(test)] mod tests` (inline, from that line to the end, as the
house style puts them) or the companion file that module names with `#[path = "..."]`.
Prints one line per file mutated in full, and why.
"""
import os
import re
import subprocess
import sys

HUNK = re.compile(r"^@@ -(\d+)(?:,(\d+))? \+(\d+)(?:,(\d+))? @@")
PATH_ATTR = re.compile(r'^#\[path = "([^"]+)"\]')


def git(*args, check=True):
    return subprocess.run(["git", *args], capture_output=True, text=True, check=check).stdout


def test_start(text):
    """1-based line of the `#[cfg(test)]` that opens the file's test module, or None."""
    lines = text.splitlines()
    for i, line in enumerate(lines):
        if line.startswith("#[cfg(test)]"):
            rest = [l for l in lines[i + 1 : i + 3] if l.strip()]
            if any(re.match(r"^(#\[path = .*\]|mod tests\b)", l) for l in rest):
                return i + 1
    return None


def companion(path, text):
    """The `#[path]` companion file of the test module, or None."""
    lines = text.splitlines()
    start = test_start(text)
    if start is None:
        return None
    for line in lines[start : start + 2]:
        m = PATH_ATTR.match(line)
        if m:
            return os.path.normpath(os.path.join(os.path.dirname(path), m.group(1)))
    return None


def old_text(base, path):
    r = subprocess.run(["git", "show", f"{base}:{path}"], capture_output=True, text=True)
    return r.stdout if r.returncode == 0 else ""


def tests_touched(base, path):
    """Whether the diff of `path` since `base` changes lines of its inline test module."""
    new = open(path).read() if os.path.exists(path) else ""
    old = old_text(base, path)
    new_start, old_start = test_start(new), test_start(old)
    for line in git("diff", "-U0", base, "--", path).splitlines():
        m = HUNK.match(line)
        if not m:
            continue
        a, b = int(m.group(1)), int(m.group(2) or 1)
        c, d = int(m.group(3)), int(m.group(4) or 1)
        if b and old_start is not None and a + b - 1 >= old_start:
            return True
        if d and new_start is not None and c + d - 1 >= new_start:
            return True
    return False


def main():
    base, out, files = sys.argv[1], sys.argv[2], sys.argv[3:]
    whole = {}
    for path in files:
        if not os.path.exists(path):
            continue
        text = open(path).read()
        if tests_touched(base, path):
            whole[path] = "its unit tests changed"
        comp = companion(path, text)
        if comp and git("diff", "--name-only", base, "--", comp).strip():
            whole[path] = f"its unit tests ({comp}) changed"
    # The plain diff of every core file not mutated in full, then each of those in full.
    rest = [f for f in files if f not in whole]
    diff = git("diff", base, "--", *rest) if rest else ""
    for path in sorted(whole):
        lines = open(path).read().splitlines()
        if not lines:
            continue
        diff += f"diff --git a/{path} b/{path}\n--- /dev/null\n+++ b/{path}\n"
        diff += f"@@ -0,0 +1,{len(lines)} @@\n" + "".join(f"+{l}\n" for l in lines)
        print(f"mutants: {path} in full: {whole[path]} since {base[:12]}")
    with open(out, "w") as f:
        f.write(diff)


if __name__ == "__main__":
    main()
