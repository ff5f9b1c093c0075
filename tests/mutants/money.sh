#!/usr/bin/env bash
# Mutation testing of the money path beyond the core: the store engines' SQL, the gateway's
# operations, http/ and the backends and rail clients (~4,000 mutants). Every mutant with the whole
# suite is ~2.5 min on 2 cores (~170 hours), so one area at a time, a systematic sample of it
# (`--shard K/N --sharding round-robin`: every Nth mutant, spread over the area's files), in two
# passes:
#
#   1. each sampled mutant against the tests that own the area (the library's unit tests and a
#      few integration binaries: ~40-80 s a mutant);
#   2. each survivor of pass 1 against the whole suite (every test binary, PostgreSQL included
#      when PAYGATE_TEST_DATABASE_URL is set, stopping at the first binary that catches it; the
#      verdict names it): a survivor there is a behaviour nothing checks, to be killed by a new
#      test or explained as equivalent in docs/TESTING.md.
#
#   tests/mutants/money.sh store 0/20        pass 1 of shard 0 of 20 of the store
#   tests/mutants/money.sh --survivors DIR   pass 2 over the missed mutants of DIR/mutants.out
#
# Results go to target/mutants-money/AREA-K-of-N/mutants.out (copy the summary into
# tests/mutants/results/ to keep it).
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

if [ "${1:-}" = "--survivors" ]; then
  out="$2/mutants.out"
  # The missed mutants' names and diffs, from cargo-mutants' own record.
  missed=$(python3 -c '
import json, sys
d = json.load(open(sys.argv[1] + "/outcomes.json"))
for o in d["outcomes"]:
    m = o["scenario"]
    if isinstance(m, dict) and o["summary"] == "MissedMutant":
        print(o["diff_path"] + "\t" + m["Mutant"]["name"])
' "$out")
  [ -n "$missed" ] || { echo "mutants: no survivors in $out"; exit 0; }
  # Each survivor's diff on a throwaway worktree, then every test binary of the suite (the unit
  # tests first, the integration binaries in name order; the fault suite runs in its own CI step
  # and is not part of `cargo test` unless PAYGATE_FAULTS is set), stopping at the first that
  # fails: the survivor is caught by it, or survives the whole suite.
  work="$root/target/mutants-survivors"
  target="${MUTANTS_SURVIVOR_TARGET:-$root/target/mutants-target}"
  git worktree remove --force "$work" 2>/dev/null || rm -rf "$work"
  git worktree add --detach --quiet "$work" HEAD
  trap 'git -C "$root" worktree remove --force "$work" 2>/dev/null || true' EXIT
  bins=$(cd "$work" && ls tests/*.rs | sed 's#tests/##; s#\.rs$##')
  log="$2/survivors.log"
  : > "$2/survivors.txt"
  : > "$log"
  while IFS=$'\t' read -r diff name; do
    (cd "$work" && git checkout -q -- . && git apply "$out/$diff")
    if ! (cd "$work" && CARGO_TARGET_DIR="$target" timeout 1800 cargo test --locked -q --no-run \
        --lib --tests >> "$log" 2>&1); then
      echo "unviable in the whole build: $name" | tee -a "$2/survivors.txt"
      continue
    fi
    verdict="SURVIVED the whole suite"
    for b in lib $bins; do
      if [ "$b" = lib ]; then sel=(--lib); else sel=(--test "$b"); fi
      if ! (cd "$work" && CARGO_TARGET_DIR="$target" CI=1 timeout 900 cargo test --locked -q \
          "${sel[@]}" >> "$log" 2>&1); then
        verdict="caught by $b"
        break
      fi
    done
    echo "$verdict: $name" | tee -a "$2/survivors.txt"
  done <<< "$missed"
  exit 0
fi

area="${1:?area: store | gateway | http | backend}"
shard="${2:?shard: K/N}"
case "$area" in
  store)
    files=('src/store/**/*.rs')
    tests=(store_contract audit_chain integrity) ;;
  gateway)
    files=('src/gateway/**/*.rs')
    tests=(adversary approvals guard_rails mandates exactly_once payees principals policy operator_api) ;;
  http)
    files=('src/http/**/*.rs')
    tests=(operator_api auth mcp_surface observability adversary) ;;
  backend)
    files=('src/backend/**/*.rs')
    tests=(mpesa mpesa_payouts mpesa_client airtel http_backend wallet_service ledger_http_e2e) ;;
  *) echo "mutants: unknown area $area (store | gateway | http | backend)"; exit 2 ;;
esac
args=(--shard "$shard" --sharding round-robin)
for f in "${files[@]}"; do args+=(-f "$f"); done
for t in "${tests[@]}"; do args+=("--cargo-arg=--test=$t"); done
dest="$root/target/mutants-money/$area-${shard/\//-of-}"
mkdir -p "$dest"
set +e
MUTANTS_OUT="$dest" bash tests/mutants/run.sh "${args[@]}"
rc=$?
set -e
echo "mutants: $area shard $shard: results in $dest/mutants.out"
exit $rc
