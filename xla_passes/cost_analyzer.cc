#include "xla_passes/cost_analyzer.h"

#include <algorithm>
#include <cmath>

namespace flexnpu::xla_passes::detail {
namespace {

constexpr double kFmaFlops = 2;

double LeafElements(const Shape& s) {
  if (!s.IsTuple()) return s.IsArray() ? s.Elements() : 0;
  double total = 0;
  for (const Shape& t : s.tuple_shapes) total += LeafElements(t);
  return total;
}

// ShapeUtil::TransposeIsBitcast: the permuted output layout equals the input layout.
bool TransposeIsBitcast(const Shape& in, const Shape& out, const std::vector<int64_t>& perm) {
  if (!in.has_layout || !out.has_layout) return false;
  if (in.minor_to_major.size() != perm.size() || out.minor_to_major.size() != perm.size()) {
    return false;
  }
  for (size_t i = 0; i < perm.size(); ++i) {
    const int64_t out_dim = out.minor_to_major[i];
    if (out_dim < 0 || out_dim >= static_cast<int64_t>(perm.size())) return false;
    if (perm[out_dim] != in.minor_to_major[i]) return false;
  }
  return true;
}

int64_t Log2Floor(int64_t v) {
  int64_t r = -1;
  while (v > 0) {
    v >>= 1;
    ++r;
  }
  return r;
}

int64_t Log2Ceiling(double v) {
  if (v <= 1) return 0;
  return static_cast<int64_t>(std::ceil(std::log2(v)));
}

}  // namespace

std::vector<KernelInfo> Analyzer::EntryKernels(int32_t entry) {
  std::vector<KernelInfo> out;
  const Computation& c = m_.computations[entry];
  for (size_t i = 0; i < c.instructions.size(); ++i) {
    const Instruction& in = c.instructions[i];
    if (IsNoCodeOpcode(in.opcode)) continue;
    Cost cost;
    if (!InstructionCost(c, static_cast<int32_t>(i), 0, &cost)) continue;
    std::string op = in.opcode_name;
    if (!in.fusion_kind.empty()) op += "(" + in.fusion_kind + ")";
    out.push_back({in.name, op, cost.flops, cost.bytes});
  }
  return out;
}

bool Analyzer::ComputationCost(int32_t ci, int depth, Cost* out, bool fused) {
  if (ci < 0 || static_cast<size_t>(ci) >= m_.computations.size()) {
    return Fail("computation index out of range");
  }
  if (depth > o_.max_call_depth) return Fail("computations nested deeper than the limit");
  // Fused bodies in the default (non-XLA) convention scale each instruction by its
  // utilization; they are memoized apart from plain computations.
  fused = fused && !o_.xla_compatible;
  std::vector<int8_t>& state = fused ? fused_state_ : state_;
  std::vector<Cost>& memo = fused ? fused_memo_ : memo_;
  if (state[ci] == 2) {
    *out = memo[ci];
    return true;
  }
  if (state[ci] == 1) {
    return Fail("computation '" + m_.computations[ci].name + "' calls itself");
  }
  state[ci] = 1;
  const Computation& c = m_.computations[ci];
  const std::vector<double>* utilization = fused ? &Utilization(ci) : nullptr;
  Cost total;
  for (size_t i = 0; i < c.instructions.size(); ++i) {
    Cost one;
    if (!InstructionCost(c, static_cast<int32_t>(i), depth, &one)) return false;
    total.Add(one, utilization != nullptr ? (*utilization)[i] : 1.0);
  }
  memo[ci] = total;
  state[ci] = 2;
  *out = total;
  return true;
}

void Analyzer::NoteStateAppend(const Shape& buffer, const Shape& update, Cost* cost) const {
  const double buffer_elements = buffer.Elements();
  const double update_elements = update.Elements();
  if (!buffer.IsArray() || buffer_elements <= 0) return;
  if (buffer_elements < o_.state_append_min_ratio * std::max(update_elements, 1.0)) return;
  cost->append_count += 1;
  cost->append_buffer_bytes += DataBytes(buffer);
  cost->append_update_bytes += DataBytes(update);
}

bool Analyzer::DotCost(const Computation& c, const Instruction& in, Cost* cost) {
  if (!NeedOperands(in, 2)) return false;
  const Shape& lhs = OperandShape(c, in, 0);
  const Shape& rhs = OperandShape(c, in, 1);
  double reduction = 1, lhs_batch = 1, rhs_contracting = 1, rhs_batch = 1;
  for (int64_t d : in.dot.lhs_contracting) {
    if (!DimOk(lhs, d, in)) return false;
    reduction *= static_cast<double>(lhs.dims[d]);
  }
  for (int64_t d : in.dot.lhs_batch) {
    if (!DimOk(lhs, d, in)) return false;
    lhs_batch *= static_cast<double>(lhs.dims[d]);
  }
  for (int64_t d : in.dot.rhs_contracting) {
    if (!DimOk(rhs, d, in)) return false;
    rhs_contracting *= static_cast<double>(rhs.dims[d]);
  }
  for (int64_t d : in.dot.rhs_batch) {
    if (!DimOk(rhs, d, in)) return false;
    rhs_batch *= static_cast<double>(rhs.dims[d]);
  }
  // HloCostAnalysis::GetDotFlops: each output element needs `reduction` FMAs.
  const double flops = kFmaFlops * in.shape.Elements() * reduction;
  cost->flops += flops;
  cost->dot_flops += flops;
  cost->dot_count += 1;
  const double lhs_free = lhs.Elements() / std::max(reduction * lhs_batch, 1.0);
  const double rhs_free = rhs.Elements() / std::max(rhs_contracting * rhs_batch, 1.0);
  if (std::min(lhs_free, rhs_free) <= o_.gemv_max_free_size) {
    cost->gemv_count += 1;
    cost->gemv_flops += flops;
  }
  return true;
}

// HloCostAnalysis::GetConvolutionFlops: FMAs over the kernel positions that hit the input
// (padding and dilation holes do not count).
bool Analyzer::ConvolutionFlops(const Computation& c, const Instruction& in, double* flops) {
  if (!NeedOperands(in, 2)) return false;
  const Shape& lhs = OperandShape(c, in, 0);
  const Shape& rhs = OperandShape(c, in, 1);
  const Shape& out = in.shape;
  const ConvDimensions& d = in.conv;
  if (!DimOk(lhs, d.input_feature, in) || !DimOk(lhs, d.input_batch, in) ||
      !DimOk(out, d.output_feature, in)) {
    return false;
  }
  const double input_feature = static_cast<double>(lhs.dims[d.input_feature]);
  const double output_feature = static_cast<double>(out.dims[d.output_feature]);
  const double batch = static_cast<double>(lhs.dims[d.input_batch]);
  double positions = 1;
  const size_t spatial = in.window.size();
  if (d.kernel_spatial.size() < spatial || d.output_spatial.size() < spatial ||
      d.input_spatial.size() < spatial) {
    return Fail("convolution '" + in.name + "' has fewer spatial dimensions than its window");
  }
  for (size_t s = 0; s < spatial; ++s) {
    const WindowDim& w = in.window[s];
    if (!DimOk(rhs, d.kernel_spatial[s], in) || !DimOk(out, d.output_spatial[s], in) ||
        !DimOk(lhs, d.input_spatial[s], in)) {
      return false;
    }
    const int64_t kernel_limit = rhs.dims[d.kernel_spatial[s]];
    const int64_t output_limit = out.dims[d.output_spatial[s]];
    const int64_t input_limit = lhs.dims[d.input_spatial[s]];
    if (input_limit == output_limit && kernel_limit == output_limit &&
        input_limit == w.base_dilation && w.window_dilation == 1 &&
        std::max<int64_t>(1, input_limit - 1) == w.stride && w.padding_low == 0 &&
        w.padding_high == 0) {
      positions *= static_cast<double>(input_limit);
      continue;
    }
    if (input_limit == 1 && kernel_limit == output_limit && w.window_dilation == 1 &&
        w.base_dilation == 1 && w.stride == 1 && w.padding_high == output_limit - 1 &&
        w.padding_low == output_limit - 1) {
      positions *= static_cast<double>(output_limit);
      continue;
    }
    // Exact count when affordable; otherwise every kernel position at every output position
    // (an upper bound) so that adversarial sizes cannot make the analysis slow.
    constexpr double kMaxExactWork = 1 << 22;
    const bool simple = w.stride == 1 && w.base_dilation == 1;
    const double work = static_cast<double>(kernel_limit) *
                        (simple ? 1.0 : static_cast<double>(output_limit));
    if (work > kMaxExactWork) {
      positions *= static_cast<double>(kernel_limit) * static_cast<double>(output_limit);
      continue;
    }
    int64_t valid = 0;
    for (int64_t k = 0; k < kernel_limit; ++k) {
      if (simple) {
        const int64_t base = w.padding_low - k * w.window_dilation;
        valid += std::max<int64_t>(
            std::min<int64_t>(input_limit + base, output_limit) - std::max<int64_t>(base, 0), 0);
        continue;
      }
      for (int64_t o = 0; o < output_limit; ++o) {
        const int64_t undilated = o * w.stride - w.padding_low + k * w.window_dilation;
        const int64_t index = w.base_dilation > 1 ? undilated / w.base_dilation : undilated;
        if (undilated != index * w.base_dilation) continue;
        if (index < 0 || index >= input_limit) continue;
        ++valid;
      }
    }
    positions *= static_cast<double>(valid);
  }
  *flops = kFmaFlops * (input_feature / static_cast<double>(in.feature_group_count)) *
           output_feature * (batch / static_cast<double>(in.batch_group_count)) * positions;
  return true;
}

bool Analyzer::GatherScatterBytes(const Computation& c, const Instruction& in, int depth,
                                  Cost* cost) {
  if (in.opcode == Opcode::kGather) {
    if (!NeedOperands(in, 2)) return false;
    const double out = ShapeSize(in.shape);
    cost->bytes = out * 2 + ShapeSize(OperandShape(c, in, 1));
    cost->out_bytes = out;
    return true;
  }
  // Scatter: n inputs, the indices, n updates. Accesses ~3x the updates plus the indices.
  if (in.operands.size() < 3 || in.operands.size() % 2 == 0) {
    return Fail("scatter '" + in.name + "' has a malformed operand list");
  }
  const size_t n = (in.operands.size() - 1) / 2;
  double updates = 0;
  for (size_t i = 0; i < n; ++i) updates += ShapeSize(OperandShape(c, in, n + 1 + i));
  cost->bytes = updates * 3 + ShapeSize(OperandShape(c, in, n));
  cost->out_bytes = updates;
  NoteStateAppend(OperandShape(c, in, 0), OperandShape(c, in, n + 1), cost);
  if (!NeedCalled(in, 1)) return false;
  Cost sub;
  if (!ComputationCost(in.called[0], depth + 1, &sub)) return false;
  const double elements = OperandShape(c, in, n + 1).Elements();
  cost->AddCompute(sub, elements);
  cost->other_flops += sub.flops * elements;
  return true;
}

bool Analyzer::InstructionCost(const Computation& c, int32_t idx, int depth, Cost* cost) {
  const Instruction& in = c.instructions[idx];
  // Default (HloCostAnalysis::Preprocess): read every operand, write the output.
  cost->out_bytes = ShapeSize(in.shape);
  cost->bytes = cost->out_bytes;
  for (size_t i = 0; i < in.operands.size(); ++i) cost->bytes += ShapeSize(OperandShape(c, in, i));

  switch (in.opcode) {
    case Opcode::kParameter:
    case Opcode::kConstant:
    case Opcode::kGetTupleElement:
    case Opcode::kBitcast:
    case Opcode::kDomain:
    case Opcode::kAfterAll:
    case Opcode::kAddDependency:
      cost->bytes = cost->out_bytes = 0;
      break;
    case Opcode::kTuple:
      cost->bytes = cost->out_bytes = ShapeSize(in.shape);
      break;
    case Opcode::kTranspose:
      if (!in.operands.empty() &&
          TransposeIsBitcast(OperandShape(c, in, 0), in.shape, in.dimensions)) {
        cost->bytes = cost->out_bytes = 0;
      }
      break;
    case Opcode::kSlice:
      cost->bytes = 2 * ShapeSize(in.shape);
      break;
    case Opcode::kDynamicSlice:
      if (!NeedOperands(in, 2)) return false;
      cost->bytes = 2 * ShapeSize(in.shape) + ShapeSize(OperandShape(c, in, 1));
      break;
    case Opcode::kDynamicUpdateSlice: {
      if (!NeedOperands(in, 3)) return false;
      const double update = ShapeSize(OperandShape(c, in, 1));
      // Operand 0 is updated in place; XLA counts the first index operand only.
      cost->bytes = 2 * update + ShapeSize(OperandShape(c, in, 2));
      cost->out_bytes = update;
      NoteStateAppend(OperandShape(c, in, 0), OperandShape(c, in, 1), cost);
      break;
    }
    case Opcode::kElementwise:
      cost->flops = cost->elementwise_flops = in.shape.Elements();
      break;
    case Opcode::kTranscendental:
      cost->transcendentals = in.shape.Elements();
      break;
    case Opcode::kDot:
      if (!DotCost(c, in, cost)) return false;
      break;
    case Opcode::kConvolution: {
      double flops = 0;
      if (!ConvolutionFlops(c, in, &flops)) return false;
      cost->flops = cost->conv_flops = flops;
      break;
    }
    case Opcode::kFft: {
      if (!NeedOperands(in, 1)) return false;
      const Shape& operand = OperandShape(c, in, 0);
      const Shape& real =
          operand.IsTuple() && !operand.tuple_shapes.empty() ? operand.tuple_shapes[0] : operand;
      double log_factors = 1;
      for (int64_t len : in.fft_length) log_factors *= static_cast<double>(Log2Floor(len));
      cost->flops = cost->other_flops = kFmaFlops * 4 * log_factors * real.Elements();
      break;
    }
    case Opcode::kReduce:
    case Opcode::kMap:
    case Opcode::kReduceWindow: {
      if (!NeedOperands(in, 1) || !NeedCalled(in, 1)) return false;
      Cost sub;
      if (!ComputationCost(in.called[0], depth + 1, &sub)) return false;
      const Shape& out =
          in.shape.IsTuple() && !in.shape.tuple_shapes.empty() ? in.shape.tuple_shapes[0]
                                                               : in.shape;
      double applications = 0;
      if (in.opcode == Opcode::kReduce) {
        applications = OperandShape(c, in, 0).Elements() - out.Elements();
      } else if (in.opcode == Opcode::kMap) {
        applications = in.shape.Elements();
      } else {
        // Each output element applies the reducer window_size - 1 times; XLA's special case
        // for a reduce-window that is a reduce followed by a broadcast along one dimension.
        double window = 1;
        int reduced = 0, padded = 0;
        for (const WindowDim& w : in.window) {
          window *= static_cast<double>(w.size);
          reduced += w.size != 1;
          padded += w.padding_low != 0 || w.padding_high != 0;
        }
        applications = (window - 1) * out.Elements();
        if (reduced == 1 && padded == 1 && in.shape.IsArray()) {
          for (size_t d = 0; d < in.window.size(); ++d) {
            const WindowDim& w = in.window[d];
            if (w.size != 1 && w.padding_low != 0 && w.padding_high != 0 &&
                w.padding_low == w.padding_high && w.size == 2 * w.padding_low + 1 &&
                d < in.shape.dims.size() && w.padding_low == in.shape.dims[d] - 1) {
              const double span = static_cast<double>(in.shape.dims[d]);
              applications = out.Elements() / std::max(span, 1.0) + (span - 1);
              break;
            }
          }
        }
      }
      applications = std::max(applications, 0.0);
      cost->AddCompute(sub, applications);
      cost->reduce_flops += sub.flops * applications;
      break;
    }
    case Opcode::kSelectAndScatter: {
      if (!NeedOperands(in, 2) || !NeedCalled(in, 2)) return false;
      Cost select, scatter;
      if (!ComputationCost(in.called[0], depth + 1, &select) ||
          !ComputationCost(in.called[1], depth + 1, &scatter)) {
        return false;
      }
      double window = 1;
      for (const WindowDim& w : in.window) window *= static_cast<double>(w.size);
      const double source = OperandShape(c, in, 1).Elements();
      cost->AddCompute(select, source * (window - 1));
      cost->AddCompute(scatter, source);
      cost->other_flops += cost->flops;
      break;
    }
    case Opcode::kSort: {
      if (!NeedOperands(in, 1)) return false;
      const double n = OperandShape(c, in, 0).Elements();
      cost->flops = cost->other_flops = n * static_cast<double>(Log2Ceiling(n));
      break;
    }
    case Opcode::kRng:
      cost->transcendentals = in.shape.Elements();
      break;
    case Opcode::kRngBitGenerator:
      cost->transcendentals = LeafElements(in.shape);
      break;
    case Opcode::kAllReduce: {
      // XLA assumes two replicas: one add per output element.
      cost->flops = cost->other_flops = LeafElements(in.shape);
      break;
    }
    case Opcode::kTriangularSolve: {
      if (!NeedOperands(in, 2)) return false;
      const Shape& a = OperandShape(c, in, 0);
      const Shape& b = OperandShape(c, in, 1);
      cost->bytes = ShapeSize(in.shape) + ShapeSize(a) / 2 + ShapeSize(b);
      const double n = a.dims.empty() ? 0 : static_cast<double>(a.dims.back());
      cost->flops = cost->other_flops = kFmaFlops * n * b.Elements();
      break;
    }
    case Opcode::kCholesky: {
      if (!NeedOperands(in, 1)) return false;
      const Shape& a = OperandShape(c, in, 0);
      cost->bytes = ShapeSize(a);
      cost->out_bytes = ShapeSize(a) / 2;
      const double n = a.dims.empty() ? 0 : static_cast<double>(a.dims.back());
      cost->flops = cost->other_flops = std::floor(n * a.Elements() / 3);
      break;
    }
    case Opcode::kGather:
    case Opcode::kScatter:
      if (!GatherScatterBytes(c, in, depth, cost)) return false;
      break;
    case Opcode::kFusion:
      if (!FusionCost(c, in, depth, cost)) return false;
      break;
    case Opcode::kCall:
    case Opcode::kAsyncStart: {
      if (!NeedCalled(in, 1)) return false;
      Cost sub;
      if (!ComputationCost(in.called[0], depth + 1, &sub)) return false;
      *cost = sub;
      break;
    }
    case Opcode::kWhile: {
      if (!NeedCalled(in, 2)) return false;
      Cost body, condition;
      if (!ComputationCost(in.called[0], depth + 1, &body) ||
          !ComputationCost(in.called[1], depth + 1, &condition)) {
        return false;
      }
      // Deviation from XLA (which counts one iteration): multiply by the known trip count.
      // Condition and body both run `n` times (the final, failing condition check is
      // negligible and not counted).
      const int64_t trip = KnownTripCount(in.backend_config);
      double scale = 1;
      Cost loop;
      loop.while_loops = 1;
      if (trip < 0) {
        loop.while_unknown = 1;
      } else {
        loop.max_trip = static_cast<double>(trip);
        if (!o_.xla_compatible) scale = static_cast<double>(trip);
      }
      loop.Add(body, scale);
      loop.Add(condition, scale);
      *cost = loop;
      break;
    }
    case Opcode::kConditional: {
      if (!NeedCalled(in, 1)) return false;
      Cost branches;
      for (size_t b = 0; b < in.called.size(); ++b) {
        Cost branch;
        if (!ComputationCost(in.called[b], depth + 1, &branch)) return false;
        if (b == 0) {
          branches = branch;
        } else {
          branches.Max(branch);
        }
      }
      *cost = branches;
      break;
    }
    case Opcode::kCustomCall: {
      // Unknown cost: zero (XLA reports -1), counted so that callers can tell.
      Cost unknown;
      unknown.custom_calls = 1;
      *cost = unknown;
      break;
    }
    default:
      // Data movement and everything else: the default read-operands/write-output bytes.
      break;
  }
  if (!c.is_fusion) AddConvertOverhead(c, idx, cost);
  return true;
}

}  // namespace flexnpu::xla_passes::detail
