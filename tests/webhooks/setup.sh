#!/usr/bin/env bash
# Install the webhook receiver's Python packages (pinned in requirements.txt) into
# tests/webhooks/.venv, once per requirements.txt, and print the venv's python. tests/webhooks.rs
# runs this; it exits non-zero (and the test says it skipped) without python3 or the package index.
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
cd "$here"
# Tests run in parallel: one installs, the others wait for it.
exec 9>"$here/.setup.lock"
flock 9
stamp=$(sha256sum requirements.txt | cut -c1-16)
if [ ! -f ".venv/.paygate-$stamp" ]; then
  rm -rf .venv
  python3 -m venv .venv >&2 && .venv/bin/pip install -q --disable-pip-version-check -r requirements.txt >&2 \
    || { echo "cannot install tests/webhooks/requirements.txt" >&2; exit 1; }
  touch ".venv/.paygate-$stamp"
fi
echo "$here/.venv/bin/python"
