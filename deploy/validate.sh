#!/usr/bin/env bash
# Validate deploy/: the compose file parses and resolves, the Kubernetes manifests are well-formed
# YAML documents with the expected kinds and every secret they read is created by the documented
# command (or optional), the healthchecks probe the server, and the image's build context compiles
# (check-context.sh). Where a container runtime answers (`docker info`), the image is built and the
# compose project started and probed; without one that part says it skipped.
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
python3 - "$here/k8s/paygate.yaml" "$here/compose.yaml" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
try:
    import yaml  # type: ignore
except ImportError:
    sys.exit("deploy: PyYAML is needed to read the manifests (pip install pyyaml)")
docs = [d for d in yaml.safe_load_all(text) if d]
kinds = [d["kind"] for d in docs]
want = {"ConfigMap", "Deployment", "Service", "PodDisruptionBudget"}
missing = want - set(kinds)
assert not missing, f"missing kinds: {missing}"
print("deploy: kubernetes manifests:", ", ".join(kinds))

# Every secretKeyRef a manifest reads is created by the documented `kubectl create secret`
# (the header comment) or marked optional: otherwise the pods cannot start as documented.
documented = set(re.findall(r"--from-literal=([a-z0-9-]+)=", text))
def refs(node):
    if isinstance(node, dict):
        if "secretKeyRef" in node:
            yield node["secretKeyRef"]
        for v in node.values():
            yield from refs(v)
    elif isinstance(node, list):
        for v in node:
            yield from refs(v)
bad = [r["key"] for d in docs for r in refs(d) if r["key"] not in documented and not r.get("optional")]
assert not bad, f"secretKeyRef keys neither created by the documented command nor optional: {bad}"
print("deploy: every secretKeyRef is created by the documented command or optional:", ", ".join(sorted(documented)))

# The probes ask the server: Kubernetes' httpGet on /healthz and /readyz, compose's paygate probe.
deployment = next(d for d in docs if d["kind"] == "Deployment")
container = deployment["spec"]["template"]["spec"]["containers"][0]
paths = {container[p]["httpGet"]["path"] for p in ("readinessProbe", "livenessProbe", "startupProbe")}
assert paths == {"/healthz", "/readyz"}, f"kubernetes probes: {paths}"
compose = yaml.safe_load(open(sys.argv[2]))
test = compose["x-paygate"]["healthcheck"]["test"]
assert "probe" in test and any(t.endswith("/readyz") for t in test), f"compose healthcheck: {test}"
print("deploy: probes: kubernetes /healthz and /readyz, compose paygate probe /readyz")
PY

bash "$here/check-context.sh"

# With a container runtime: build the image and start the compose project for real.
if docker info >/dev/null 2>&1; then
  root=$(cd "$here/.." && pwd)
  # The tag compose.yaml names, so `up` starts this image instead of building again.
  docker build -q -f "$here/Dockerfile" -t paygate:local "$root" >/dev/null
  echo "deploy: docker build: ok"
  project="paygate-ci-$$"
  trap 'docker compose -p "$project" -f "$here/compose.yaml" down -v >/dev/null 2>&1 || true' EXIT
  PAYGATE_IDEMPOTENCY_SECRET=$(openssl rand -base64 32) PAYGATE_MANDATES_SECRET=$(openssl rand -base64 32) \
    docker compose -p "$project" -f "$here/compose.yaml" up -d --wait --wait-timeout 180 >/dev/null
  echo "deploy: docker compose up: every service healthy"
  curl -sf http://127.0.0.1:8080/readyz >/dev/null || { echo "deploy: the proxy does not reach a ready replica"; exit 1; }
  echo "deploy: the proxy reaches a ready replica (/readyz)"
else
  echo "deploy: no container runtime here (docker info failed): image build and compose start SKIPPED"
fi
