#!/usr/bin/env bash
# Mutation testing of the core (the files in .cargo/mutants.toml) with the unit tests.
#
#   tests/mutants/run.sh                 every mutant of the core (~800, ~90 min on 2 cores)
#   tests/mutants/run.sh --in-diff       only mutants in the core's lines changed since
#                                        tests/mutants/BASE, and every mutant of a core file whose
#                                        unit tests changed (what .ci/run does; nothing to do when
#                                        the core is unchanged)
#   tests/mutants/run.sh -f src/mandate.rs   those files instead of the core (any cargo-mutants
#                                        option passes through: --iterate, --re, -j with a copy...)
#
# Runs on a throwaway copy of the tree (git worktree under target/) with its own target dir, so a
# mutated build can never be mistaken for the real one. Exit 0 only when no viable mutant survives.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$(pwd)

# The core: the pure domain, and the modules money and authority pass through.
core=(
  'src/domain/**/*.rs'
  src/mandate.rs
  src/idempotency.rs
  src/request_state.rs
  src/auth/jwt.rs
  src/gateway/unit_of_work.rs
  src/gateway/exactly_once.rs
)

args=()
if [ "${1:-}" = "--in-diff" ]; then
  shift
  base=$(tr -d '[:space:]' < tests/mutants/BASE)
  diff=$(mktemp)
  trap 'rm -f "$diff"' EXIT
  # The core's changed lines, and in full every core file whose unit tests changed: a change
  # that only weakens a test shows as the mutants it no longer catches (tests/mutants/in_diff.py).
  mapfile -t core_files < <(git ls-files -- "${core[@]/#/:(glob)}")
  python3 tests/mutants/in_diff.py "$base" "$diff" "${core_files[@]}"
  if [ ! -s "$diff" ]; then
    echo "mutants: the core is unchanged since $base; nothing to mutate"
    exit 0
  fi
  args+=(--in-diff "$diff")
fi
case " $* " in
  *" -f "* | *" --file "* | *" --file="*) ;;
  *) for f in "${core[@]}"; do args+=(-f "$f"); done ;;
esac

version=27.1.0
if ! cargo mutants --version 2>/dev/null | grep -qx "cargo-mutants $version"; then
  cargo install cargo-mutants --version "$version" --locked --quiet
fi

# A diff that changes no mutable line (comments, tests) holds no mutants: stop before copying the
# target dir (tens of GB) for nothing. A listing that fails is no proof of that: go on.
if [ -n "${diff:-}" ]; then
  if listed=$(cargo mutants --list "${args[@]}" "$@" 2>/dev/null) && [ -z "$listed" ]; then
    echo "mutants: the core's changes since $base hold no mutants (comments or tests only); nothing to mutate"
    exit 0
  fi
fi

# A detached worktree of HEAD plus the uncommitted changes, and a target dir of its own (seeded
# from the real one when it exists, so only this crate rebuilds).
work="$root/target/mutants-tree"
target="${MUTANTS_TARGET_DIR:-$root/target/mutants-target}"
git worktree remove --force "$work" 2>/dev/null || rm -rf "$work"
git worktree add --detach --quiet "$work" HEAD
git diff HEAD | (cd "$work" && git apply --allow-empty)
# Only what the dependencies built (their libraries, build scripts and fingerprints): the test and
# bin executables (tens of GB; every file in deps/ without an extension) would be rebuilt here
# anyway, since the tree's path differs and this crate's fingerprints with it.
seed="${CARGO_TARGET_DIR:-$root/target}/debug"
if [ ! -d "$target" ] && [ -d "$seed/deps" ]; then
  mkdir -p "$target/debug/deps"
  (cd "$seed" && cp -a build .fingerprint "$target/debug/" &&
    find deps -maxdepth 1 -type f -name '*.*' -exec cp -a -t "$target/debug/deps" {} +)
fi
cleanup() { git -C "$root" worktree remove --force "$work" 2>/dev/null || true; rm -f "${diff:-}"; }
trap cleanup EXIT

cd "$work"
set +e
out="${MUTANTS_OUT:-$root/target}"
CARGO_TARGET_DIR="$target" cargo mutants --in-place --no-shuffle -o "$out" "${args[@]}" "$@"
rc=$?
set -e
echo "mutants: results in $out/mutants.out (caught.txt, missed.txt, unviable.txt, timeout.txt)"
# The table of docs/TESTING.md, over what this run was asked to mutate.
list=$(mktemp)
CARGO_TARGET_DIR="$target" cargo mutants --list "${args[@]}" "$@" > "$list" 2>/dev/null || true
python3 "$root/tests/mutants/table.py" "$list" "$out/mutants.out" || true
rm -f "$list"
exit $rc
