#!/usr/bin/env bash
# The image's build context is what the build needs: copy exactly what deploy/Dockerfile's build
# stage COPYs into an empty directory and compile paygate there. A source the Dockerfile forgets (a
# file include_str! embeds, a module, a migration) fails the compile; a forgotten build
# configuration (.cargo/config.toml: LIBSQLITE3_FLAGS) fails the check that every tracked file
# under .cargo/ came along.
#
#   deploy/check-context.sh        (deploy/validate.sh runs it; .ci/run runs that)
#
# It type-checks (`cargo check` with the Dockerfile's own `cargo build` targets) rather than building
# the release binary: the compile reads
# every file a build reads, and the dependencies' check artifacts cargo clippy already made are
# reused (the same target directory), so it costs the paygate crate alone.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/.." && pwd)
ctx=$(mktemp -d)
trap 'rm -rf "$ctx"' EXIT

# The build stage: from its FROM up to the next FROM. Each `COPY <src>... <dest>` (not --from=)
# copies sources relative to the context (the repository root) under WORKDIR, which is the
# context's own layout here: `COPY src ./src`, `COPY Cargo.toml Cargo.lock ./`.
python3 - "$here/Dockerfile" "$root" "$ctx" <<'PY'
import os, shlex, shutil, sys
dockerfile, root, ctx = sys.argv[1:]
stage, copies = 0, []
for raw in open(dockerfile):
    line = raw.strip()
    if not line or line.startswith("#"):
        continue
    word = line.split()[0].upper()
    if word == "FROM":
        stage += 1
        continue
    if stage == 1 and word == "RUN" and "cargo build" in line:
        # The targets the image builds (--bin paygate): the check compiles the same ones.
        args = shlex.split(line.split("cargo build", 1)[1].split("&&")[0])
        targets = [a for i, a in enumerate(args) if a in ("--bin", "--bins") or (i and args[i - 1] == "--bin")]
        open(os.path.join(ctx, ".targets"), "w").write(" ".join(targets or ["--bins"]) + "\n")
    if stage == 1 and word == "COPY":
        parts = shlex.split(line)[1:]
        if any(p.startswith("--from") for p in parts):
            continue
        *srcs, dest = [p for p in parts if not p.startswith("--")]
        for s in srcs:
            copies.append((s, dest))
if not copies:
    sys.exit("check-context: no COPY in the Dockerfile's build stage")
for src, dest in copies:
    path = os.path.join(root, src)
    if not os.path.exists(path):
        sys.exit(f"check-context: COPY {src}: no such file in the context")
    # `COPY a b ./` puts a and b in the WORKDIR; `COPY src ./src` makes ./src.
    target = os.path.join(ctx, os.path.basename(src.rstrip("/")) if dest.endswith("/") else dest)
    if os.path.isdir(path):
        shutil.copytree(path, target, dirs_exist_ok=True,
                        ignore=shutil.ignore_patterns(".venv", "node_modules", "target"))
    else:
        os.makedirs(os.path.dirname(target) or ctx, exist_ok=True)
        shutil.copy2(path, target)
    print(f"check-context: COPY {src} -> {dest}")
PY

# The build's own configuration must come along: every tracked file under .cargo/.
missing=0
while IFS= read -r f; do
  [ -n "$f" ] || continue
  if [ ! -f "$ctx/$f" ]; then
    echo "check-context: $f is not copied into the image's build (add a COPY for it)"
    missing=1
  fi
done < <(git -C "$root" ls-files .cargo)
[ "$missing" = 0 ] || exit 1

# Compile from the copied context alone (offline: Cargo.lock pins everything the cache holds).
target=${CARGO_TARGET_DIR:-$root/target}
read -r -a targets <"$ctx/.targets" || { echo "check-context: no cargo build in the Dockerfile's build stage"; exit 1; }
if ! (cd "$ctx" && CARGO_TARGET_DIR="$target" cargo check --locked --offline "${targets[@]}" --quiet 2>"$ctx/.check.log"); then
  sed 's/^/    /' "$ctx/.check.log" | grep -v '^    $' | head -30
  echo "check-context: paygate does not compile from the Dockerfile's COPY lines alone"
  exit 1
fi
echo "check-context: the Dockerfile's build context compiles paygate (cargo check ${targets[*]})"
