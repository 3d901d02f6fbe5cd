#!/usr/bin/env bash
# Fuzzes the HLO analysis for SECONDS (default 60) with libFuzzer + ASan/UBSan.
#   xla_passes/fuzz/run_fuzz.sh [SECONDS]
# Seeds: the committed jax-produced modules in xla_passes/tests/data, plus fresh ones written
# by make_seeds.py from the jax in $PYTHON (skipped if jax is unavailable). Exit status is
# non-zero on any finding (crash, sanitizer report, leak, timeout); artifacts go to $WORK.
# Needs clang++ (apt-get install -y clang), cmake and ninja; PYTHON defaults to python3.
set -euo pipefail
SECONDS_TO_RUN="${1:-60}"
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
# Per checkout (build/ is ignored): a work dir shared by several checkouts kept a CMake cache
# naming another checkout's (since deleted) ninja.
WORK="${FLEXNPU_FUZZ_WORK:-$ROOT/build/fuzz}"
PYTHON="${PYTHON:-python3}"
JOBS="${FLEXNPU_FUZZ_BUILD_JOBS:-2}"
mkdir -p "$WORK/corpus" "$WORK/artifacts"

# A standalone build of just the wire reader and the analysis (no PJRT header needed).
mkdir -p "$WORK/src"
cat > "$WORK/src/CMakeLists.txt" <<CMAKE
cmake_minimum_required(VERSION 3.20)
project(flexnpu_fuzz LANGUAGES CXX)
set(CMAKE_CXX_STANDARD 17)
set(CMAKE_CXX_STANDARD_REQUIRED ON)
set(PROJECT_SOURCE_DIR "$ROOT")
set(FLEXNPU_BUILD_FUZZERS ON)
add_subdirectory("$ROOT/pjrt_flexnpu/base" base)
add_subdirectory("$ROOT/xla_passes" xla_passes)
CMAKE
cmake -S "$WORK/src" -B "$WORK/build" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_MAKE_PROGRAM="$(command -v ninja)" -DCMAKE_CXX_COMPILER="${CXX_FUZZ:-clang++}" >/dev/null
ninja -C "$WORK/build" -j"$JOBS" hlo_analysis_fuzzer >/dev/null

cp "$ROOT"/xla_passes/tests/data/*.pb "$WORK/corpus/"
if "$PYTHON" -c "import jax" 2>/dev/null; then
  JAX_PLATFORMS=cpu "$PYTHON" "$ROOT/xla_passes/fuzz/make_seeds.py" "$WORK/seeds" >/dev/null
  cp "$WORK"/seeds/*.pb "$WORK/corpus/"
fi

"$WORK/build/xla_passes/fuzz/hlo_analysis_fuzzer" "$WORK/corpus" \
  -max_total_time="$SECONDS_TO_RUN" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -artifact_prefix="$WORK/artifacts/" -print_final_stats=1
