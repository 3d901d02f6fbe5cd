// The additive cost the analysis sums over instructions and computations, and XLA:CPU's
// conventions for the bytes a shape occupies. Internal to the analysis (analysis.h is its
// interface): shared by cost_analyzer.cc, fusion_cost.cc and analysis.cc.
#ifndef FLEXNPU_XLA_PASSES_COST_H_
#define FLEXNPU_XLA_PASSES_COST_H_

#include <algorithm>
#include <cmath>

#include "xla_passes/hlo_module.h"

namespace flexnpu::xla_passes::detail {

inline constexpr double kPointerBytes = 8;  // XLA:CPU sizes tuples and opaques as pointers

// Additive cost of an instruction or computation. Everything scales with a loop trip count.
struct Cost {
  double flops = 0, transcendentals = 0, bytes = 0, out_bytes = 0;
  double dot_flops = 0, conv_flops = 0, elementwise_flops = 0, reduce_flops = 0, other_flops = 0;
  double dot_count = 0, gemv_count = 0, gemv_flops = 0;
  double append_count = 0, append_buffer_bytes = 0, append_update_bytes = 0;
  double convert_overhead = 0, convert_flops = 0;
  double while_loops = 0, while_unknown = 0, custom_calls = 0;
  double max_trip = 0;

  template <typename F>
  void ForEach(const Cost& o, F f) {
    f(flops, o.flops);
    f(transcendentals, o.transcendentals);
    f(bytes, o.bytes);
    f(out_bytes, o.out_bytes);
    f(dot_flops, o.dot_flops);
    f(conv_flops, o.conv_flops);
    f(elementwise_flops, o.elementwise_flops);
    f(reduce_flops, o.reduce_flops);
    f(other_flops, o.other_flops);
    f(dot_count, o.dot_count);
    f(gemv_count, o.gemv_count);
    f(gemv_flops, o.gemv_flops);
    f(append_count, o.append_count);
    f(append_buffer_bytes, o.append_buffer_bytes);
    f(append_update_bytes, o.append_update_bytes);
    f(convert_overhead, o.convert_overhead);
    f(convert_flops, o.convert_flops);
    f(while_loops, o.while_loops);
    f(while_unknown, o.while_unknown);
    f(custom_calls, o.custom_calls);
  }
  void Add(const Cost& o, double scale = 1) {
    ForEach(o, [scale](double& a, double b) { a += b * scale; });
    max_trip = std::max(max_trip, o.max_trip);
  }
  void Max(const Cost& o) {
    ForEach(o, [](double& a, double b) { a = std::max(a, b); });
    max_trip = std::max(max_trip, o.max_trip);
  }
  // Copies what a reducer / mapped function contributes per application: compute only
  // (XLA's KeyToCopyFromSubcomputation drops the callee's bytes).
  void AddCompute(const Cost& o, double scale) {
    flops += o.flops * scale;
    transcendentals += o.transcendentals * scale;
  }
};

inline bool HasLayout(const Shape& s) {
  if (s.IsTuple()) {
    for (const Shape& t : s.tuple_shapes) {
      if (!HasLayout(t)) return false;
    }
    return true;
  }
  return s.IsArray() ? s.has_layout : true;
}

// Bytes of the data of an array (ignores layout presence); tuples: the sum of their leaves.
inline double DataBytes(const Shape& s) {
  if (s.IsTuple()) {
    double total = 0;
    for (const Shape& t : s.tuple_shapes) total += DataBytes(t);
    return total;
  }
  const int width = PrimitiveTypeBytes(s.element_type);
  if (width == 0) return 0;
  if (s.element_size_in_bits > 0 && s.element_size_in_bits < 8) {
    return std::ceil(s.Elements() * static_cast<double>(s.element_size_in_bits) / 8.0);
  }
  return s.Elements() * width;
}

// XLA:CPU's shape size function (CpuExecutable::ShapeSizeBytes) as used by HloCostAnalysis:
// 0 without a layout; tuples and opaques are pointers; dynamic shapes carry an s32 per dim.
inline double ShapeSize(const Shape& s) {
  if (!HasLayout(s)) return 0;
  if (s.IsTuple()) return kPointerBytes * static_cast<double>(s.tuple_shapes.size());
  if (s.element_type == kOpaque) return kPointerBytes;
  if (!s.IsArray()) return 0;
  double bytes = DataBytes(s);
  if (s.dynamic) bytes += 4.0 * static_cast<double>(s.dims.size());
  return bytes;
}

// Instructions that launch no work: they move no bytes at the top level and are no kernels.
inline bool IsNoCodeOpcode(Opcode op) {
  switch (op) {
    case Opcode::kParameter:
    case Opcode::kConstant:
    case Opcode::kGetTupleElement:
    case Opcode::kBitcast:
    case Opcode::kTuple:
    case Opcode::kDomain:
    case Opcode::kAfterAll:
    case Opcode::kAddDependency:
      return true;
    default:
      return false;
  }
}

}  // namespace flexnpu::xla_passes::detail

#endif  // FLEXNPU_XLA_PASSES_COST_H_
