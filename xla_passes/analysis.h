// Cost analysis of an optimized HLO module: how much an executable computes and how much
// memory it moves. Conventions follow XLA's HloCostAnalysis (xla/service/hlo_cost_analysis.cc)
// so that the numbers can be checked against `compiled.cost_analysis()`:
//   * FLOPs: dot = 2 * output elements * contracted size (batch dims are part of the output);
//     convolution = 2 * valid (unpadded) kernel positions * features; elementwise = one per
//     output element; reduce = reducer FLOPs * (input elements - output elements);
//     transcendental ops (exp, log, tanh, rsqrt, erf, ...) are counted separately.
//   * Bytes: counted at top-level instruction / fusion boundaries: a fusion reads its operands
//     (a parameter used only through a slice reads the slice) and writes its outputs; values
//     inside a fusion never touch memory. A dynamic-update-slice writes only the update
//     (the state buffer is updated in place). Parameters, constants, tuples-of-pointers,
//     get-tuple-element and bitcasts move nothing. Tuples cost 8 bytes per element (pointers).
//   * Deliberate deviations from XLA (off with AnalysisOptions::xla_compatible):
//     - while loops: the body and condition are multiplied by the known trip count from the
//       loop's backend_config (XLA counts one iteration). Unknown trip counts count once and
//       are reported in `while_loops_unknown_trip_count`.
//     - inside a fusion only the part of each value that the fusion's output needs is
//       computed and read (utilization): a gather reads the gathered rows, like a
//       dynamic-slice, and an elementwise op feeding a slice or gather runs on that share.
//       XLA charges the whole operand to every fusion that gathers from it: an embedding
//       lookup (convert + gather of a 1 GB vocabulary table) fused into three consumers
//       would convert and read the whole table three times.
//     - a fused scatter updates its inputs in place, as a dynamic-update-slice does: the fusion
//       writes the updates and does not read the scattered-into inputs (XLA charges the whole
//       state twice: an 8-token KV-cache write into a 235 MB cache would move 470 MB).
//   * Shared with XLA, by design: conditionals take the per-property maximum over branches
//     (an upper bound); custom calls cost zero and are counted (XLA reports -1, "unknown").
#ifndef FLEXNPU_XLA_PASSES_ANALYSIS_H_
#define FLEXNPU_XLA_PASSES_ANALYSIS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_flexnpu/base/status.h"
#include "xla_passes/hlo_module.h"

namespace flexnpu::xla_passes {

struct AnalysisOptions {
  // Count exactly as XLA's HloCostAnalysis (one loop iteration, whole gather tables), for
  // comparison with `compiled.cost_analysis()`. Off: the real cost of one execution.
  bool xla_compatible = false;
  // A dot is "GEMV-shaped" when its smaller free side (rows of the activation, or columns of
  // the weight) has at most this many elements: it streams a whole operand per few FLOPs.
  double gemv_max_free_size = 16;
  // A dynamic-update-slice (or scatter) is a "state append" (the KV-cache append of a decode
  // step) when the buffer it updates in place is at least this many times larger than the
  // update.
  double state_append_min_ratio = 16;
  // Entries reported in largest_parameters / largest_outputs.
  size_t top_k = 5;
  // Call depth (fusions, loops, calls nested in each other) beyond which input is rejected.
  int max_call_depth = 64;
  ParseLimits parse_limits;
};

struct BufferInfo {
  std::string name;  // parameter name or output index ("{0}")
  int64_t index = 0;  // parameter number or output tuple index (-1: the whole result)
  std::string shape;
  double bytes = 0;
};

struct AliasInfo {
  int64_t parameter_number = 0;
  std::string parameter_index;  // e.g. "{}" or "{1}"
  std::string output_index;     // empty for a buffer donor without a paired output
  bool must_alias = false;
  double bytes = 0;
};

struct KernelInfo {
  std::string name;    // top-level instruction of the entry computation
  std::string opcode;  // e.g. "fusion" (kind in parentheses) or "dot"
  double flops = 0;
  double bytes = 0;
};

struct ExecutableProfile {
  std::string module_name;
  // Totals (while bodies multiplied by trip counts unless xla_compatible).
  double flops = 0;
  double transcendentals = 0;
  double bytes_accessed = 0;  // bytes_read + bytes_written
  double bytes_read = 0;
  double bytes_written = 0;
  double arithmetic_intensity = 0;  // flops / bytes_accessed (0 when no bytes)
  // FLOP breakdown.
  double dot_flops = 0;
  double conv_flops = 0;
  double elementwise_flops = 0;
  double reduce_flops = 0;
  double other_flops = 0;
  // Structural hints.
  int64_t dot_count = 0;
  int64_t gemv_dot_count = 0;
  double gemv_dot_flops = 0;            // FLOPs of GEMV-shaped dots
  int64_t state_append_count = 0;       // in-place updates of a much larger buffer
  double state_append_buffer_bytes = 0;  // size of the buffers updated in place
  double state_append_update_bytes = 0;
  // Bytes that exist only because the compiling backend emulates a narrow type through
  // converts (e.g. XLA:CPU turns a bf16 dot into convert->f32 dot->convert): pure-convert
  // kernels plus the extra width their consumers read. A backend with native low-precision
  // math moves bytes_accessed - convert_overhead_bytes.
  double convert_overhead_bytes = 0;
  double convert_overhead_flops = 0;  // elementwise FLOPs of those convert kernels
  int64_t while_loops = 0;
  int64_t while_loops_unknown_trip_count = 0;
  int64_t max_trip_count = 0;
  int64_t custom_calls = 0;
  int64_t instruction_count = 0;     // all instructions of all computations
  int64_t top_level_kernels = 0;     // entry-computation instructions that launch work
  int64_t fusion_count = 0;          // top-level fusions
  // Buffers.
  double parameter_bytes = 0;
  double output_bytes = 0;
  std::vector<BufferInfo> largest_parameters;
  std::vector<BufferInfo> largest_outputs;
  std::vector<AliasInfo> aliased;  // in-place (aliased or donated) parameters
  // The entry computation's heaviest instructions (loops and calls include their bodies).
  std::vector<KernelInfo> heaviest_by_bytes;
  std::vector<KernelInfo> heaviest_by_flops;
  double aliased_bytes = 0;
  bool from_config_wrapper = false;
};

// Analyzes protobuf bytes: an HloModuleProto or HloModuleProtoWithConfig.
StatusOr<ExecutableProfile> AnalyzeHloProto(std::string_view bytes,
                                          const AnalysisOptions& options = {});
// Analyzes an already parsed module.
StatusOr<ExecutableProfile> AnalyzeModule(const HloModule& module,
                                        const AnalysisOptions& options = {});

}  // namespace flexnpu::xla_passes

#endif  // FLEXNPU_XLA_PASSES_ANALYSIS_H_
