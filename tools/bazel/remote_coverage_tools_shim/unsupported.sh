#!/bin/sh
# Stand-in for Bazel's remote coverage tools, which are a download: coverage is not available
# in the offline Bazel build (use the CMake build with gcov/llvm-cov instead).
echo "flexnpu: bazel coverage is not supported offline (remote_coverage_tools is a local shim)" >&2
exit 1
