#!/usr/bin/env bash
# Fuzz the parsers an attacker reaches with cargo-fuzz (libFuzzer), on the nightly toolchain.
#   bash fuzz/run.sh --smoke       each target for a few seconds over a copy of its seed corpus (CI),
#                                  built unoptimised (`--dev`: a cold build in a third of the time;
#                                  a smoke run proves the targets build and run, not throughput)
#   bash fuzz/run.sh --long SECS   each target for SECS, optimised (`-O`); one markdown row per
#                                  target (SECURITY.md)
#   bash fuzz/run.sh --long SECS TARGET...   only those targets
# A crash fails the run and its input is copied to fuzz/regressions/<target>/, which
# tests/fuzz_regressions.rs replays on stable (keep it once the bug is fixed). The committed corpus
# never grows here: each run fuzzes a copy.
set -euo pipefail
cd "$(dirname "$0")"

CARGO_FUZZ_VERSION=0.13.1
TARGETS=(money scope_peek jwt mandate request_state rail_callbacks cursor time_filter)

mode=${1:---smoke}
case "$mode" in
  --smoke) secs=4 profile=--dev ;;
  --long) secs=${2:?--long needs a number of seconds} profile=-O; shift ;;
  *) echo "usage: $0 --smoke | --long SECS [TARGET...]" >&2; exit 2 ;;
esac
shift
[ "$#" -gt 0 ] && TARGETS=("$@")

if ! rustup toolchain list | grep -q '^nightly'; then
  echo "fuzz: the nightly toolchain is not installed (rustup toolchain install nightly)"
  [ -n "${CI:-}" ] && exit 1
  echo "fuzz: SKIPPED"; exit 0
fi
if ! cargo fuzz --version 2>/dev/null | grep -q " $CARGO_FUZZ_VERSION"; then
  cargo install cargo-fuzz --locked --version "$CARGO_FUZZ_VERSION"
fi
# PAYGATE_FUZZ_TARGET_DIR if set; else beside the main build when CI shares one target directory;
# else fuzz/target.
if [ -n "${PAYGATE_FUZZ_TARGET_DIR:-}" ]; then export CARGO_TARGET_DIR="$PAYGATE_FUZZ_TARGET_DIR"
elif [ -n "${CARGO_TARGET_DIR:-}" ]; then export CARGO_TARGET_DIR="$CARGO_TARGET_DIR/fuzz"; fi

cargo +nightly fuzz build "$profile"
echo "| target | seconds | execs | execs/s | cov | ft | crashes |"
echo "|---|---:|---:|---:|---:|---:|---:|"
failed=0
for t in "${TARGETS[@]}"; do
  work=$(mktemp -d); art=$(mktemp -d); log=$(mktemp)
  cp corpus/"$t"/* "$work"/
  set +e
  cargo +nightly fuzz run "$profile" "$t" "$work" -- -max_total_time="$secs" -print_final_stats=1 \
    -artifact_prefix="$art/" -rss_limit_mb=2048 > "$log" 2>&1
  rc=$?
  set -e
  execs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' | tail -n 1)
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -n 1)
  crashes=$(find "$art" -type f | wc -l)
  printf '| %s | %s | %s | %s | %s | %s | %s |\n' "$t" "$secs" "${execs:-?}" \
    "$(( ${execs:-0} / secs ))" "$(echo "$cov" | awk '{print $2}')" "$(echo "$cov" | awk '{print $4}')" "$crashes"
  if [ "$rc" != 0 ] || [ "$crashes" != 0 ]; then
    failed=1
    mkdir -p regressions/"$t"
    find "$art" -type f -exec cp {} regressions/"$t"/ \;
    echo "fuzz: $t failed (exit $rc); inputs kept in fuzz/regressions/$t/; its log:"
    tail -n 40 "$log"
  fi
  rm -rf "$work" "$art" "$log"
done
exit "$failed"
