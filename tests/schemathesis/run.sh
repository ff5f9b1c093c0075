#!/usr/bin/env bash
# schemathesis (pinned in requirements.txt) against the two HTTP contracts paygate serves:
# docs/operator-api.yaml on the gateway and docs/ledger-api.yaml on `paygate ledger-serve`, each a
# fresh process on loopback with seeded records (seed.py), default checks and a bounded number of
# examples per operation (operator.toml, ledger.toml). Prints one line per API and exits 1 on any
# failure; the full report of a failed run is printed.
#
#   tests/schemathesis/run.sh     (needs target/debug/paygate; builds it if missing)
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$here"
say() { printf '%s\n' "$*"; }

stamp=$(sha256sum requirements.txt | cut -c1-16)
if [ ! -f ".venv/.paygate-$stamp" ]; then
  say "== installing schemathesis (pinned) into tests/schemathesis/.venv"
  rm -rf .venv && python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt \
    || { say "pip install failed"; exit 1; }
  touch ".venv/.paygate-$stamp"
fi

bin="${CARGO_TARGET_DIR:-$root/target}/debug/paygate"
[ -x "$bin" ] || (cd "$root" && cargo build --quiet) || { say "cannot build paygate"; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  wait 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_ready() { # url
  for _ in $(seq 1 100); do curl -sf "$1" >/dev/null 2>&1 && return 0; sleep 0.1; done
  return 1
}

failed=0
run_st() { # name spec url config token
  local name=$1 spec=$2 url=$3 config=$4 token=$5 log="$work/$1.log"
  if .venv/bin/schemathesis --config-file "$config" run "$root/$spec" --url "$url" \
    -H "Authorization: Bearer $token" --no-color >"$log" 2>&1; then
    say "schemathesis: $name: pass ($(grep -Eo '[0-9]+ generated' "$log" | head -1) cases)"
  else
    failed=1
    cat "$log"
    say "schemathesis: $name: FAIL"
  fi
}

# --- the operator API, on the gateway ---------------------------------------------------------
port=$(free_port)
export PAYGATE_SERVER__BIND="127.0.0.1:$port" PAYGATE_STORAGE__DATA_DIR="$work/gateway"
# Generated requests arrive far faster than a person's: lift the operator rate limit for the run.
export PAYGATE_APPROVALS__ROUTES_PER_MINUTE=100000
"$bin" serve >"$work/gateway.out" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$port/readyz" || { say "gateway did not start"; cat "$work/gateway.out"; exit 1; }
agent=$("$bin" token --sub dev-agent --scope "payments:read payments:create payments:refund") || exit 1
ops=$("$bin" token --operator --sub st-operator \
  --scope "payments:audit payments:approve payments:admin payments:confirm") || exit 1
seeded=$(python3 seed.py operator "http://127.0.0.1:$port" "$agent" "$ops") || { say "seeding the gateway failed"; exit 1; }
eval "$seeded"
run_st operator-api docs/operator-api.yaml "http://127.0.0.1:$port/operator/v1" operator.toml "$ops"

# --- the ledger API, on ledger-serve ----------------------------------------------------------
lport=$(free_port)
credential=st-ledger-credential-0123456789abcdef
PAYGATE_LEDGER_SERVE_CREDENTIAL=$credential PAYGATE_STORAGE__DATA_DIR="$work/ledger" \
  "$bin" ledger-serve --bind "127.0.0.1:$lport" >"$work/ledger.out" 2>&1 &
pids+=($!)
wait_ready "http://127.0.0.1:$lport/v1/health" || { say "ledger-serve did not start"; cat "$work/ledger.out"; exit 1; }
seeded=$(python3 seed.py ledger "http://127.0.0.1:$lport" "$credential") || { say "seeding the ledger failed"; exit 1; }
eval "$seeded"
run_st ledger-api docs/ledger-api.yaml "http://127.0.0.1:$lport" ledger.toml "$credential"

# A server error or panic anywhere is a failure even if no check caught it.
if grep -q "panicked" "$work/gateway.out" "$work/ledger.out"; then
  failed=1
  say "schemathesis: a server panicked:"; grep -h -A3 "panicked" "$work/gateway.out" "$work/ledger.out"
fi
exit $failed
