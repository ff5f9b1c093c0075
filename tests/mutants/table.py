#!/usr/bin/env python3
"""The caught / missed / unviable / timeout table of docs/TESTING.md, per file of the core.

    python3 tests/mutants/table.py LIST OUT_DIR [OUT_DIR...]

LIST is `cargo mutants --list` of the tree (one mutant per line); each OUT_DIR is a mutants.out
directory (caught.txt, missed.txt, unviable.txt, timeout.txt, previously_caught.txt). A later
directory's verdict wins, so a full run followed by `--iterate` runs gives the tree's verdicts.
Prints the markdown table, then any mutant of LIST that no run tested.
"""
import collections
import pathlib
import sys

def lines(d, file):
    p = pathlib.Path(d) / file
    return [l.strip() for l in p.read_text().splitlines() if l.strip()] if p.is_file() else []


# `--iterate` lists what it skipped as previously caught (caught or unviable, not which): a
# default that any run's own verdict overrides, later runs over earlier ones.
verdict = {m: "caught" for out in sys.argv[2:] for m in lines(out, "previously_caught.txt")}
for out in sys.argv[2:]:
    for kind, file in [("caught", "caught.txt"), ("unviable", "unviable.txt"), ("missed", "missed.txt"),
                       ("timeout", "timeout.txt")]:
        for m in lines(out, file):
            verdict[m] = kind

mutants = [l.strip() for l in pathlib.Path(sys.argv[1]).read_text().splitlines() if l.strip()]
rows = collections.defaultdict(collections.Counter)
untested = []
for m in mutants:
    v = verdict.get(m)
    if v is None:
        untested.append(m)
        v = "untested"
    rows[m.split(":")[0]][v] += 1

print("| file | mutants | caught | missed | unviable | timeout | caught of viable |")
print("|---|---:|---:|---:|---:|---:|---:|")
total = collections.Counter()
for f in sorted(rows):
    c = rows[f]
    total.update(c)
    viable = c["caught"] + c["missed"] + c["timeout"]
    share = f"{100 * c['caught'] / viable:.1f} %" if viable else "—"
    print(f"| `{f}` | {sum(c.values())} | {c['caught']} | {c['missed']} | {c['unviable']} | {c['timeout']} | {share} |")
viable = total["caught"] + total["missed"] + total["timeout"]
print(f"| **all** | {sum(total.values())} | {total['caught']} | {total['missed']} | {total['unviable']} | "
      f"{total['timeout']} | {100 * total['caught'] / max(viable, 1):.1f} % |")
if untested:
    print(f"\n{len(untested)} untested:", *untested, sep="\n  ")
