#!/usr/bin/env bash
# Validate deploy/ without a Docker engine: the compose file parses and resolves, the Kubernetes
# manifests are well-formed YAML documents with the expected kinds.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
export PAYGATE_IDEMPOTENCY_SECRET=validate PAYGATE_MANDATES_SECRET=validate
if docker compose version >/dev/null 2>&1; then
  docker compose -f "$here/compose.yaml" config -q
  echo "deploy: docker compose config: ok"
else
  # No compose plugin on this machine: the compose project's own Python implementation (pinned,
  # project-local) parses and validates the same file.
  venv="$here/.venv"
  if [ ! -x "$venv/bin/docker-compose" ]; then
    pip=("$venv/bin/pip" install -q --disable-pip-version-check)
    # docker-compose 1.29.2 pins PyYAML 5.4.1, which only builds with Cython < 3.
    python3 -m venv "$venv" && "${pip[@]}" 'cython<3' wheel 'setuptools<81' &&
      "${pip[@]}" --no-build-isolation 'pyyaml==5.4.1' && "${pip[@]}" 'docker-compose==1.29.2'
  fi
  "$venv/bin/docker-compose" -f "$here/compose.yaml" config -q
  echo "deploy: docker-compose config: ok"
fi
python3 - "$here/k8s/paygate.yaml" <<'PY'
import sys
kinds = []
text = open(sys.argv[1]).read()
try:
    import yaml  # type: ignore
    docs = [d for d in yaml.safe_load_all(text) if d]
    kinds = [d["kind"] for d in docs]
except ImportError:
    kinds = [l.split(":", 1)[1].strip() for l in text.splitlines() if l.startswith("kind:")]
want = {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
missing = want - set(kinds)
assert not missing, f"missing kinds: {missing}"
print("deploy: kubernetes manifests:", ", ".join(kinds))
PY
