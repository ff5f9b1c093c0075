#!/usr/bin/env bash
# Install the Python packages the tests check paygate with (pinned in requirements.txt: the Standard
# Webhooks library, PyJWT) into tests/python/.venv, once per requirements.txt, and print the venv's
# python. tests/common's `python()` runs this; it exits non-zero (and the test says it skipped)
# without python3 or the package index.
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
    || { echo "cannot install tests/python/requirements.txt" >&2; exit 1; }
  touch ".venv/.paygate-$stamp"
fi
echo "$here/.venv/bin/python"
