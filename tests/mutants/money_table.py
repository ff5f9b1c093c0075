#!/usr/bin/env python3
"""The money-path mutation table of docs/TESTING.md, from the committed raw results.

    python3 tests/mutants/money_table.py [tests/mutants/results]

Each directory AREA-K-of-N under the results holds cargo-mutants' verdicts of pass 1 (caught.txt,
missed.txt, unviable.txt, timeout.txt) and survivors.txt: one line per mutant missed in pass 1,
"VERDICT: MUTANT", where VERDICT is one of
    caught by BINARY ...          pass 2: a test binary outside the area's own catches it
    killed by a new ...           no test caught it; a test written for it does (it fails with it)
    equivalent: WHY               no test can tell it from the code (the reason is the line's)
    SURVIVED ...                  nothing catches it yet
Prints one row per sample and a total, each as a share of the viable mutants that are not
equivalent: "before new tests" is what the suite caught as it stood (the estimate for the whole
area: the sample is every Nth mutant of it), "now" what it catches with the tests written for the
sample's survivors (those tests were aimed at the sample, so "now" describes the sample only).
"""
import math
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1] if len(sys.argv) > 1 else "tests/mutants/results")


def lines(p):
    return [l.strip() for l in p.read_text().splitlines() if l.strip() and not l.startswith("#")] if p.is_file() else []


def wilson_low(k, n, z=1.96):
    """The lower end of the 95 % Wilson interval of k successes in n."""
    if n == 0:
        return 0.0
    p = k / n
    centre = p + z * z / (2 * n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n))
    return (centre - half) / (1 + z * z / n)


rows = []
for d in sorted(root.iterdir()):
    m = re.fullmatch(r"([a-z]+)-(\d+)-of-(\d+)", d.name)
    if not m or not d.is_dir():
        continue
    caught, missed = lines(d / "caught.txt"), lines(d / "missed.txt")
    unviable, timeout = lines(d / "unviable.txt"), lines(d / "timeout.txt")
    verdicts = {}
    for l in lines(d / "survivors.txt"):
        verdict, _, mutant = l.partition(": src/")
        verdicts["src/" + mutant] = verdict
    kinds = {"pass2": 0, "killed": 0, "equivalent": 0, "survived": 0}
    for mutant in missed:
        v = verdicts.get(mutant)
        if v is None:
            sys.exit(f"{d.name}: no pass-2 verdict for {mutant}")
        if v.startswith("caught by"):
            kinds["pass2"] += 1
        elif v.startswith("killed by"):
            kinds["killed"] += 1
        elif v.startswith("equivalent"):
            kinds["equivalent"] += 1
        else:
            kinds["survived"] += 1
    # A timeout is a mutant the tests stopped (a hang they would not let pass): caught.
    viable = len(caught) + len(missed) + len(timeout)
    rows.append((m.group(1), f"{m.group(2)}/{m.group(3)}", len(caught) + len(missed) + len(timeout) + len(unviable),
                 len(unviable), viable, len(caught) + len(timeout), kinds))

print("| area | sample | mutants | unviable | viable | caught in pass 1 | caught in pass 2 | killed by a new test "
      "| equivalent | survived | caught, before new tests | caught, now |")
print("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
tot = [0] * 9
for area, shard, n, unv, viable, p1, k in rows:
    before = p1 + k["pass2"]
    now = before + k["killed"]
    nonequiv = viable - k["equivalent"]
    vals = [n, unv, viable, p1, k["pass2"], k["killed"], k["equivalent"], k["survived"], 0]
    tot = [a + b for a, b in zip(tot, vals)]
    print(f"| {area} | {shard} | {n} | {unv} | {viable} | {p1} | {k['pass2']} | {k['killed']} | {k['equivalent']} | "
          f"{k['survived']} | {100 * before / max(nonequiv, 1):.1f} % | {100 * now / max(nonequiv, 1):.1f} % |")
n, unv, viable, p1, p2, killed, equiv, surv, _ = tot
before, now, nonequiv = p1 + p2, p1 + p2 + killed, viable - equiv
print(f"| **all** | | {n} | {unv} | {viable} | {p1} | {p2} | {killed} | {equiv} | {surv} | "
      f"**{100 * before / max(nonequiv, 1):.1f} %** | **{100 * now / max(nonequiv, 1):.1f} %** |")
# Each sampled mutant stands for N of its area (shard K/N): the money path's estimate weighs them so.
w_before = sum(int(r[1].split("/")[1]) * (r[5] + r[6]["pass2"]) for r in rows)
w_nonequiv = sum(int(r[1].split("/")[1]) * (r[4] - r[6]["equivalent"]) for r in rows)
print()
print(f"Weighted by each sample's rate (a mutant of a 1-in-N sample stands for N): "
      f"{100 * w_before / max(w_nonequiv, 1):.1f} % of the money path's non-equivalent viable mutants caught before new tests.")
print(f"Before new tests: {before} of {nonequiv} non-equivalent viable mutants caught; the 95 % (Wilson) interval "
      f"for the whole money path's share starts at {100 * wilson_low(before, nonequiv):.1f} %.")
