#!/usr/bin/env bash
# Supported jax/jaxlib versions (docs/limits.md#supported-jax-versions): installs FlexNPU's wheel
# into a fresh venv per version with that jax/jaxlib and runs tools/jax_version_smoke.py (a small
# JAX program on flexnpu and on jaxlib's cpu, compared). tools/run_tests.sh runs the oldest
# version with --installed (the newest is the suite's own jax).
#   tools/check_jax_versions.sh [WHEEL]     (no WHEEL: builds one from this checkout, without
#                                            build isolation: $PYTHON needs scikit-build-core and
#                                            nanobind, as for a developer build)
#   tools/check_jax_versions.sh --installed (the FlexNPU installed in $PYTHON, as built, made
#                                            visible to each venv: what tools/run_tests.sh runs)
# FLEXNPU_JAX_VERSIONS: the versions to check (default: the oldest and newest supported);
# FLEXNPU_VENV_ROOT: where the venvs go (default: a temporary folder, removed at the end).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
PYTHON=${PYTHON:-python3}
VERSIONS=${FLEXNPU_JAX_VERSIONS:-"0.8.3 0.10.2"}
WORK=${FLEXNPU_VENV_ROOT:-$(mktemp -d -t flexnpu-jax-versions-XXXXXX)}
[ -n "${FLEXNPU_VENV_ROOT:-}" ] || trap 'rm -rf "$WORK"' EXIT

WHEEL=${1:-}
INSTALLED=""
if [ "$WHEEL" = "--installed" ]; then
  # The package and its metadata (the jax_plugins entry point) on each venv's path.
  INSTALLED="$WORK/installed"
  mkdir -p "$INSTALLED"
  "$PYTHON" - "$INSTALLED" <<'PY'
import os, sys
from importlib import metadata
dist = metadata.distribution("flexnpu")
site = str(dist.locate_file(""))
for name in os.listdir(site):
    if name == "flexnpu" or (name.startswith("flexnpu-") and name.endswith(".dist-info")):
        os.symlink(os.path.join(site, name), os.path.join(sys.argv[1], name))
PY
  WHEEL=""
elif [ -z "$WHEEL" ]; then
  echo "== building the wheel"
  CMAKE_BUILD_PARALLEL_LEVEL=${CMAKE_BUILD_PARALLEL_LEVEL:-2} \
    "$PYTHON" -m pip wheel "$ROOT" --no-deps --no-build-isolation -q -w "$WORK/wheel"
  WHEEL=$(ls "$WORK"/wheel/flexnpu-*.whl)
fi

status=0
for version in $VERSIONS; do
  venv="$WORK/venv-jax-$version"
  echo "== jax/jaxlib $version"
  "$PYTHON" -m venv "$venv"
  "$venv/bin/pip" install -q "jax==$version" "jaxlib==$version" xla-cpu-pjrt==0.0.1 flatbuffers
  if [ -n "$INSTALLED" ]; then
    "$venv/bin/python" -c "import site, sys; open(site.getsitepackages()[0] + '/flexnpu-installed.pth', 'w').write(sys.argv[1] + '\n')" "$INSTALLED"
  else
    "$venv/bin/pip" install -q --no-deps "$WHEEL"
  fi
  if ! (cd "$WORK" && JAX_PLATFORMS=flexnpu,cpu \
        XLA_FLAGS=--xla_force_host_platform_device_count=4 \
        "$venv/bin/python" "$ROOT/tools/jax_version_smoke.py"); then
    status=1
  fi
done
exit $status
