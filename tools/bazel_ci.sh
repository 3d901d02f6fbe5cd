#!/usr/bin/env bash
# CI entry point for the Bazel build: builds the plugin and runs the C++ tests, offline.
#
#   tools/bazel_ci.sh                 # bazel build //... && bazel test //...
#   tools/bazel_ci.sh //tests/cpp/... # other target patterns
#
# Environment:
#   FLEXNPU_BAZEL_OUTPUT_USER_ROOT  Bazel's output root (default /tmp/flexnpu-bazel-$UID)
#   FLEXNPU_BAZEL_JOBS              parallel jobs (default 2)
#   FLEXNPU_BAZEL_KEEP_SERVER=1     leave the Bazel server running afterwards
#   FLEXNPU_BAZEL_DISK_CACHE        Bazel's disk cache (default ~/.cache/flexnpu-bazel-disk)
#   FLEXNPU_PJRT_INCLUDE_DIR, FLEXNPU_PYTHON   see tools/bazel_setup.sh
# Exits non-zero when the build or any test fails.
set -euo pipefail

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo_root"

# 1. Debian packages: Bazel 4.2.3 and the repositories it would otherwise download.
need=()
command -v bazel >/dev/null 2>&1 || need+=(bazel-bootstrap)
[[ -f /usr/share/bazel/rules/java/WORKSPACE ]] || need+=(bazel-rules-java)
[[ -f /usr/share/bazel/tools/platforms/WORKSPACE ]] || need+=(bazel-platforms)
[[ -d /usr/src/googletest/googletest/src ]] || need+=(googletest)
command -v g++ >/dev/null 2>&1 || need+=(g++)
if (( ${#need[@]} )); then
  sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null 2>&1 || { echo "bazel_ci: need root or sudo to install ${need[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "bazel_ci: installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  if ! "${sudo[@]}" apt-get install -y --no-install-recommends "${need[@]}"; then
    "${sudo[@]}" apt-get update
    "${sudo[@]}" apt-get install -y --no-install-recommends "${need[@]}"
  fi
fi

# 2. Machine-specific settings (the PJRT header) in .bazelrc.local.
tools/bazel_setup.sh

# 3. Build and test.
output_user_root="${FLEXNPU_BAZEL_OUTPUT_USER_ROOT:-/tmp/flexnpu-bazel-$(id -u)}"
jobs="${FLEXNPU_BAZEL_JOBS:-2}"
startup=(--output_user_root="$output_user_root")
# The disk cache outlives the output root's per-workspace state: a fresh clone elsewhere on the
# same machine (CI's) reuses the compiles and test results of an earlier run with the same inputs.
disk_cache="${FLEXNPU_BAZEL_DISK_CACHE:-${HOME:-/tmp}/.cache/flexnpu-bazel-disk}"
common=(--jobs="$jobs" --local_cpu_resources="$jobs" --curses=no --color=no
        --show_progress_rate_limit=30 --disk_cache="$disk_cache")
targets=("$@")
(( ${#targets[@]} )) || targets=(//...)

# `//...` would descend into convenience symlinks (bazel-<dir>, bazel-bin, ...) left by a
# Bazel run with another output root; Bazel only skips its own. Drop such stale links (only the
# links: Bazel recreates them on its next run).
for link in bazel-*; do
  [[ -L "$link" ]] || continue
  case "$(readlink "$link")" in
    "$output_user_root"/*) ;;
    *) echo "bazel_ci: removing stale convenience symlink $link"; rm -f -- "$link" ;;
  esac
done

finish() {
  if [[ "${FLEXNPU_BAZEL_KEEP_SERVER:-0}" != 1 ]]; then
    bazel "${startup[@]}" shutdown >/dev/null 2>&1 || true
  fi
}
trap finish EXIT

echo "bazel_ci: $(bazel "${startup[@]}" --version 2>/dev/null | tail -n1) (Debian reports no_version for 4.2.3)," \
     "output_user_root=$output_user_root, jobs=$jobs"
start=$SECONDS

echo "bazel build ${targets[*]}"
bazel "${startup[@]}" build "${common[@]}" -- "${targets[@]}"

echo "bazel test ${targets[*]}"
rc=0
bazel "${startup[@]}" test "${common[@]}" --test_summary=short -- "${targets[@]}" || rc=$?
if (( rc == 4 )); then
  # Bazel's "no test targets were found": the test folders hold no *_test.cc yet.
  echo "bazel_ci: WARNING: no test targets matched ${targets[*]}"
  rc=0
fi
echo "bazel_ci: $(( SECONDS - start ))s in bazel; exit $rc"
exit "$rc"
