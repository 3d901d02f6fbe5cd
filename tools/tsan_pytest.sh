#!/usr/bin/env bash
# ThreadSanitizer over the threaded pytest subset: a TSan build of FlexNPU's plugin (BUILD_DIR,
# default build/tsan, as tools/run_tests.sh's TSan step leaves it) runs under the uninstrumented
# CPython and jaxlib, in the pytest process and in every interpreter the tests start:
#   - libtsan is preloaded (a TSan-built shared library cannot bring its runtime itself);
#   - tools/tsan_pytest/sitecustomize.py points flexnpu at the TSan plugin (the installed
#     package stays untouched);
#   - reports go to files (the tests capture their subprocesses' stderr); any report fails.
# As in the C++ tests, accesses inside uninstrumented libraries are ignored
# (ignore_noninstrumented_modules=1); TSAN_IGNORE_NONINSTRUMENTED=0 turns that off for a look at
# what TSan then sees: about 100 reports on test_plugin_threads.py alone, all inside XLA, jaxlib
# and numpy but the one tests/cpp/tsan_suppressions.txt suppresses.
# Synchronisation inside jaxlib stays invisible either way: see tests/cpp/tsan_suppressions.txt.
# Usage: tools/tsan_pytest.sh [BUILD_DIR] [pytest args...]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
PYTHON=${PYTHON:-python3}
build_dir=${1:-build/tsan}
shift || true
build_dir=$(realpath "$build_dir")
plugin=$build_dir/pjrt_flexnpu/pjrt_plugin_flexnpu.so
[[ -f $plugin ]] || { echo "tsan_pytest: no TSan plugin at $plugin (build $build_dir first)" >&2; exit 1; }
cxx=$(sed -n 's/^CMAKE_CXX_COMPILER:[A-Z]*=//p' "$build_dir/CMakeCache.txt")
[[ $("$cxx" --version) == *"Free Software Foundation"* ]] \
  || { echo "tsan_pytest: $build_dir was not built with GCC; its libtsan is what gets preloaded" >&2; exit 1; }
libtsan=$("$cxx" -print-file-name=libtsan.so)
# The real interpreter: a pyenv shim (a bash script) crashes with libtsan preloaded.
python_bin=$("$PYTHON" -c "import sys; print(sys.executable)")
tests=(
  tests/python/test_plugin_threads.py
  tests/python/test_plugin_buffer_moves.py
  "tests/python/test_placement_observability.py::test_dynamic_concurrent_dispatch_trace_and_metrics"
)
(( $# )) && tests=("$@")
log_dir=$build_dir/tsan_pytest_logs
rm -rf "$log_dir" && mkdir -p "$log_dir"
status=0
PYTHONPATH="$PWD/tools/tsan_pytest${PYTHONPATH:+:$PYTHONPATH}" TSAN_FLEXNPU_PLUGIN="$plugin" \
  TSAN_OPTIONS="suppressions=$PWD/tests/cpp/tsan_suppressions.txt:ignore_noninstrumented_modules=${TSAN_IGNORE_NONINSTRUMENTED:-1}:log_path=$log_dir/report:exitcode=66" \
  LD_PRELOAD="$libtsan" "$python_bin" -m pytest -q -p no:cacheprovider "${tests[@]}" || status=$?
reports=("$log_dir"/report*)
if [[ -e ${reports[0]} ]]; then
  cat "${reports[@]}" >&2
  echo "tsan_pytest: ThreadSanitizer reports in ${#reports[@]} process(es): ${reports[*]}" >&2
  exit 1
fi
exit "$status"
