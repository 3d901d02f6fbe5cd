#include "xla_passes/analysis.h"

#include <algorithm>
#include <cmath>
#include <utility>

namespace flexnpu::xla_passes {
namespace {

constexpr double kFmaFlops = 2;
constexpr double kPointerBytes = 8;  // XLA:CPU sizes tuples and opaques as pointers

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

bool HasLayout(const Shape& s) {
  if (s.IsTuple()) {
    for (const Shape& t : s.tuple_shapes) {
      if (!HasLayout(t)) return false;
    }
    return true;
  }
  return s.IsArray() ? s.has_layout : true;
}

// Bytes of the data of an array (ignores layout presence); tuples: the sum of their leaves.
double DataBytes(const Shape& s) {
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
double ShapeSize(const Shape& s) {
  if (!HasLayout(s)) return 0;
  if (s.IsTuple()) return kPointerBytes * static_cast<double>(s.tuple_shapes.size());
  if (s.element_type == kOpaque) return kPointerBytes;
  if (!s.IsArray()) return 0;
  double bytes = DataBytes(s);
  if (s.dynamic) bytes += 4.0 * static_cast<double>(s.dims.size());
  return bytes;
}

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

bool IsNoCodeOpcode(Opcode op) {
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

class Analyzer {
 public:
  Analyzer(const HloModule& m, const AnalysisOptions& o)
      : m_(m),
        o_(o),
        state_(m.computations.size(), 0),
        memo_(m.computations.size()),
        param_state_(m.computations.size(), 0),
        param_bytes_(m.computations.size()),
        fused_state_(m.computations.size(), 0),
        fused_memo_(m.computations.size()),
        utilization_(m.computations.size()) {}

  bool ComputationCost(int32_t ci, int depth, Cost* out, bool fused = false);
  const std::string& error() const { return error_; }
  // Per-instruction costs of the entry computation (after ComputationCost succeeded).
  std::vector<KernelInfo> EntryKernels(int32_t entry) {
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

 private:
  bool Fail(std::string message) {
    if (error_.empty()) error_ = std::move(message);
    return false;
  }
  const Shape& OperandShape(const Computation& c, const Instruction& in, size_t i) const {
    return c.instructions[in.operands[i]].shape;
  }
  bool NeedOperands(const Instruction& in, size_t n) {
    if (in.operands.size() >= n) return true;
    return Fail("instruction '" + in.name + "' (" + in.opcode_name + ") has " +
                std::to_string(in.operands.size()) + " operands, needs " + std::to_string(n));
  }
  bool NeedCalled(const Instruction& in, size_t n) {
    if (in.called.size() >= n) return true;
    return Fail("instruction '" + in.name + "' (" + in.opcode_name + ") calls " +
                std::to_string(in.called.size()) + " computations, needs " + std::to_string(n));
  }
  bool DimOk(const Shape& s, int64_t d, const Instruction& in) {
    if (d >= 0 && d < static_cast<int64_t>(s.dims.size())) return true;
    return Fail("instruction '" + in.name + "' names dimension " + std::to_string(d) +
                " of a rank-" + std::to_string(s.dims.size()) + " shape");
  }

  bool InstructionCost(const Computation& c, int32_t idx, int depth, Cost* cost);
  bool DotCost(const Computation& c, const Instruction& in, Cost* cost);
  bool ConvolutionFlops(const Computation& c, const Instruction& in, double* flops);
  bool FusionCost(const Computation& c, const Instruction& in, int depth, Cost* cost);
  bool GatherScatterBytes(const Computation& c, const Instruction& in, int depth, Cost* cost);
  void NoteStateAppend(const Shape& buffer, const Shape& update, Cost* cost) const;
  void AddConvertOverhead(const Computation& c, int32_t idx, Cost* own) const;
  bool IsPureConvertFusion(const Instruction& in) const;
  // HloCostAnalysis::FusionParameterReadBytes for instruction `idx` of fused computation `ci`.
  bool ReadBytes(int32_t ci, int32_t idx, int depth, double* out);
  bool ParamReadBytes(int32_t ci, int64_t param, int depth, double* out);

  // Fraction of each fused instruction's output that the fusion needs (root: 1; a slice,
  // dynamic-slice or gather needs only its output's share of operand 0). Only an executed
  // fraction of an elementwise op inside a fusion runs: a convert of a whole embedding table
  // fused into the gather that reads 8 rows converts 8 rows.
  const std::vector<double>& Utilization(int32_t ci);

  const HloModule& m_;
  const AnalysisOptions& o_;
  std::string error_;
  std::vector<int8_t> state_;  // 0 new, 1 in progress, 2 done
  std::vector<Cost> memo_;
  std::vector<int8_t> param_state_;
  std::vector<std::vector<double>> param_bytes_;
  std::vector<int8_t> fused_state_;
  std::vector<Cost> fused_memo_;
  std::vector<std::vector<double>> utilization_;
};

const std::vector<double>& Analyzer::Utilization(int32_t ci) {
  std::vector<double>& u = utilization_[ci];
  if (!u.empty()) return u;
  const Computation& c = m_.computations[ci];
  u.assign(c.instructions.size(), 0.0);
  u[c.root] = 1;
  // Instructions are stored operands-first; walking backwards visits users before operands.
  // (If a malformed module breaks that order the result is only less exact.)
  for (size_t i = c.instructions.size(); i-- > 0;) {
    const Instruction& x = c.instructions[i];
    const double mine = std::min(u[i], 1.0);
    if (mine <= 0) continue;
    for (size_t k = 0; k < x.operands.size(); ++k) {
      double share = 1;
      const bool slicing = x.opcode == Opcode::kSlice || x.opcode == Opcode::kDynamicSlice ||
                           x.opcode == Opcode::kGather;
      if (slicing && k == 0) {
        const double whole = c.instructions[x.operands[k]].shape.Elements();
        share = whole > 0 ? std::min(x.shape.Elements() / whole, 1.0) : 1.0;
      }
      u[x.operands[k]] += mine * share;
    }
  }
  for (double& v : u) v = std::min(v, 1.0);
  return u;
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

bool Analyzer::ParamReadBytes(int32_t ci, int64_t param, int depth, double* out) {
  const Computation& c = m_.computations[ci];
  if (param < 0 || param >= static_cast<int64_t>(c.parameters.size())) {
    return Fail("fusion passes more operands than '" + c.name + "' has parameters");
  }
  if (param_state_[ci] == 2) {
    *out = param_bytes_[ci][param];
    return true;
  }
  if (param_state_[ci] == 1) return Fail("fused computation '" + c.name + "' fuses itself");
  if (depth > o_.max_call_depth) return Fail("fusions nested deeper than the limit");
  param_state_[ci] = 1;
  std::vector<double> bytes(c.parameters.size(), 0);
  for (size_t p = 0; p < c.parameters.size(); ++p) {
    const Shape& shape = c.instructions[c.parameters[p]].shape;
    if (!shape.IsTuple()) {
      if (!ReadBytes(ci, c.parameters[p], depth, &bytes[p])) return false;
      continue;
    }
    // A tuple parameter: follow get-tuple-element users down to each leaf.
    struct Item {
      int32_t instr;
      const Shape* shape;
      int level;
    };
    std::vector<Item> stack{{c.parameters[p], &shape, 0}};
    while (!stack.empty()) {
      Item item = stack.back();
      stack.pop_back();
      if (!item.shape->IsTuple()) {
        double leaf = 0;
        if (!ReadBytes(ci, item.instr, depth, &leaf)) return false;
        bytes[p] += leaf;
        continue;
      }
      if (item.level > o_.parse_limits.max_shape_depth) return Fail("tuple nested too deeply");
      for (size_t t = 0; t < item.shape->tuple_shapes.size(); ++t) {
        int32_t next = item.instr;
        for (int32_t user : c.users[item.instr]) {
          const Instruction& u = c.instructions[user];
          if (u.opcode == Opcode::kGetTupleElement && u.tuple_index == static_cast<int64_t>(t)) {
            next = user;
            break;
          }
        }
        if (next == item.instr) continue;  // leaf never read
        stack.push_back({next, &item.shape->tuple_shapes[t], item.level + 1});
      }
    }
  }
  param_bytes_[ci] = std::move(bytes);
  param_state_[ci] = 2;
  *out = param_bytes_[ci][param];
  return true;
}

bool Analyzer::ReadBytes(int32_t ci, int32_t idx, int depth, double* out) {
  const Computation& c = m_.computations[ci];
  const Instruction& hlo = c.instructions[idx];
  const double own = ShapeSize(hlo.shape);
  double size = 0;
  bool seen_trivial_user = false;
  auto trivial = [&] {
    if (!seen_trivial_user) {
      seen_trivial_user = true;
      size += own;
    }
  };
  for (int32_t user_index : c.users[idx]) {
    const Instruction& user = c.instructions[user_index];
    switch (user.opcode) {
      case Opcode::kFusion: {
        if (!NeedCalled(user, 1)) return false;
        for (size_t k = 0; k < user.operands.size(); ++k) {
          if (user.operands[k] != idx) continue;
          double nested = 0;
          if (!ParamReadBytes(user.called[0], static_cast<int64_t>(k), depth + 1, &nested)) {
            return false;
          }
          size += nested;
        }
        break;
      }
      case Opcode::kSlice:
        size += ShapeSize(user.shape);
        break;
      case Opcode::kGather:
        // Deviation (see analysis.h): a fused gather reads the rows it gathers.
        if (!o_.xla_compatible && !user.operands.empty() && user.operands[0] == idx) {
          size += ShapeSize(user.shape);
        } else {
          trivial();
        }
        break;
      case Opcode::kDynamicSlice:
        if (!user.operands.empty() && user.operands[0] == idx) {
          size += ShapeSize(user.shape);
        } else {
          trivial();
        }
        break;
      case Opcode::kDynamicUpdateSlice:
        // Operand 0 is aliased to the output.
        if (user.operands.empty() || user.operands[0] != idx) trivial();
        break;
      case Opcode::kBroadcast:
      case Opcode::kReshape:
        size += own;
        break;
      default:
        // Other readers are assumed to share one read from memory.
        trivial();
    }
  }
  *out = size;
  return true;
}

bool Analyzer::IsPureConvertFusion(const Instruction& in) const {
  if (in.opcode == Opcode::kElementwise && in.opcode_name == "convert") return true;
  if (in.opcode != Opcode::kFusion || in.called.empty()) return false;
  const Computation& f = m_.computations[in.called[0]];
  bool has_convert = false;
  for (const Instruction& x : f.instructions) {
    if (x.opcode_name == "convert") {
      has_convert = true;
    } else if (x.shape.IsArray() && x.shape.Elements() <= 1) {
      continue;  // scalar index arithmetic of a dynamic-slice
    } else if (x.opcode != Opcode::kParameter && x.opcode != Opcode::kBitcast &&
               x.opcode != Opcode::kReshape && x.opcode != Opcode::kCopy &&
               x.opcode != Opcode::kTranspose && x.opcode != Opcode::kDynamicSlice &&
               x.opcode != Opcode::kSlice) {
      return false;
    }
  }
  return has_convert;
}

// Estimated bytes and FLOPs that a backend with native low-precision arithmetic would not
// spend (see ExecutableProfile::convert_overhead_bytes): the whole convert kernel, plus, for a
// widening convert, the extra width every reader reads (a tuple passing the value into a loop
// or call counts as one reader), or, for a narrowing convert, the extra width its producer
// wrote.
void Analyzer::AddConvertOverhead(const Computation& c, int32_t idx, Cost* own) const {
  const Instruction& in = c.instructions[idx];
  if (in.operands.empty() || !in.shape.IsArray() || !IsPureConvertFusion(in)) return;
  // One data operand; any others are scalar slice indices. Compare its width with the
  // output's: a convert round trip (f32 -> bf16 -> f32, XLA:CPU keeping bf16 rounding) has
  // equal widths and only the kernel itself is overhead.
  const Instruction* data = nullptr;
  for (int32_t op : in.operands) {
    if (c.instructions[op].shape.Elements() <= 1) continue;
    if (data != nullptr) return;
    data = &c.instructions[op];
  }
  if (data == nullptr) return;
  const int in_width = PrimitiveTypeBytes(data->shape.element_type);
  const int out_width = PrimitiveTypeBytes(in.shape.element_type);
  if (in_width == 0 || out_width == 0) return;
  const double elements = in.shape.Elements();
  double overhead = own->bytes;
  if (out_width > in_width) {
    double readers = 0;
    for (int32_t u : c.users[idx]) {
      if (u == c.root) continue;  // an output of the computation, not a reader
      if (c.instructions[u].opcode != Opcode::kGetTupleElement) readers += 1;
    }
    overhead += readers * elements * (out_width - in_width);
  } else if (out_width < in_width) {
    overhead += elements * (in_width - out_width);
  }
  own->convert_overhead += overhead;
  own->convert_flops += own->flops;
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

bool Analyzer::FusionCost(const Computation& c, const Instruction& in, int depth, Cost* cost) {
  if (!NeedCalled(in, 1)) return false;
  const int32_t fi = in.called[0];
  const Computation& fused = m_.computations[fi];
  if (in.fusion_kind == "kCustom") {
    // HloCostAnalysis costs a custom fusion around a gather/scatter as that instruction.
    for (const Instruction& x : fused.instructions) {
      if (x.opcode == Opcode::kGather || x.opcode == Opcode::kScatter) {
        Cost inner;
        if (!GatherScatterBytes(fused, x, depth + 1, &inner)) return false;
        *cost = inner;
        return true;
      }
    }
  }
  Cost sub;
  if (!ComputationCost(fi, depth + 1, &sub, /*fused=*/true)) return false;
  *cost = sub;
  // Values inside a fusion never touch memory: recount bytes at the fusion boundary.
  cost->bytes = 0;
  cost->out_bytes = 0;
  cost->convert_overhead = 0;
  cost->convert_flops = 0;
  const Instruction& root = fused.instructions[fused.root];
  auto dus_update_size = [&](const Instruction& x, double* size) {
    if (x.opcode != Opcode::kDynamicUpdateSlice || x.operands.size() < 2) return false;
    *size = ShapeSize(fused.instructions[x.operands[1]].shape);
    return true;
  };
  // Outputs: every array subshape, except that a dynamic-update-slice root writes its update.
  if (in.shape.IsTuple()) {
    struct Item {
      const Shape* shape;
      int level;
      int64_t top_index;
    };
    std::vector<Item> stack;
    for (size_t i = 0; i < in.shape.tuple_shapes.size(); ++i) {
      stack.push_back({&in.shape.tuple_shapes[i], 1, static_cast<int64_t>(i)});
    }
    while (!stack.empty()) {
      Item item = stack.back();
      stack.pop_back();
      if (item.shape->IsTuple()) {
        if (item.level > o_.parse_limits.max_shape_depth) return Fail("tuple nested too deeply");
        for (const Shape& t : item.shape->tuple_shapes) stack.push_back({&t, item.level + 1, -1});
        continue;
      }
      if (!item.shape->IsArray()) continue;
      double size = ShapeSize(*item.shape);
      if (item.level == 1 && root.opcode == Opcode::kTuple &&
          item.top_index < static_cast<int64_t>(root.operands.size())) {
        double update = 0;
        if (dus_update_size(fused.instructions[root.operands[item.top_index]], &update)) {
          size = update;
        }
      }
      cost->bytes += size;
      cost->out_bytes += size;
    }
  } else if (in.shape.IsArray()) {
    double size = ShapeSize(in.shape);
    double update = 0;
    if (dus_update_size(root, &update)) size = update;
    cost->bytes += size;
    cost->out_bytes += size;
  }
  // Large constants inside the fusion are read from memory.
  for (const Instruction& x : fused.instructions) {
    if (x.opcode == Opcode::kConstant && x.shape.IsArray() && x.shape.Elements() > 1) {
      cost->bytes += ShapeSize(x.shape);
    }
  }
  const std::vector<double>* utilization = o_.xla_compatible ? nullptr : &Utilization(fi);
  // A state update that a backend emulating a narrow type wraps in converts,
  // convert(dynamic-update-slice(convert(state), convert(update))), rewrites the whole state;
  // natively it is an in-place update. The difference is convert overhead.
  auto strip = [&](const Instruction* x) {
    for (int hops = 0; hops < 8 && (x->opcode_name == "convert" || x->opcode == Opcode::kBitcast) &&
                       !x->operands.empty();
         ++hops) {
      x = &fused.instructions[x->operands[0]];
    }
    return x;
  };
  const Instruction* update_root = strip(&root);
  const Instruction* state = nullptr;
  if (update_root != &root && update_root->opcode == Opcode::kDynamicUpdateSlice &&
      update_root->operands.size() >= 2 && in.shape.IsArray()) {
    state = strip(&fused.instructions[update_root->operands[0]]);
    if (state->opcode != Opcode::kParameter) state = nullptr;
  }
  for (size_t p = 0; p < in.operands.size(); ++p) {
    double read = 0;
    if (!ParamReadBytes(fi, static_cast<int64_t>(p), depth + 1, &read)) return false;
    if (utilization != nullptr && static_cast<size_t>(p) < fused.parameters.size()) {
      // Deviation: a parameter is read only as far as the fusion uses it.
      const int32_t param = fused.parameters[p];
      read = std::min(read, ShapeSize(fused.instructions[param].shape) * (*utilization)[param]);
    }
    cost->bytes += read;
    if (state != nullptr && state->parameter_number == static_cast<int64_t>(p)) {
      const Shape& update = fused.instructions[update_root->operands[1]].shape;
      const double native_write =
          update.Elements() * PrimitiveTypeBytes(in.shape.element_type);
      cost->convert_overhead += read + std::max(ShapeSize(in.shape) - native_write, 0.0);
      cost->convert_flops += cost->flops;
    }
  }
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

std::string IndexString(const std::vector<int64_t>& index) {
  std::string s = "{";
  for (size_t i = 0; i < index.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(index[i]);
  }
  return s + "}";
}

const Shape* Subshape(const Shape& s, const std::vector<int64_t>& index) {
  const Shape* cur = &s;
  for (int64_t i : index) {
    if (!cur->IsTuple() || i < 0 || i >= static_cast<int64_t>(cur->tuple_shapes.size())) {
      return nullptr;
    }
    cur = &cur->tuple_shapes[i];
  }
  return cur;
}

void KeepLargest(std::vector<BufferInfo>* v, size_t k) {
  std::stable_sort(v->begin(), v->end(),
                   [](const BufferInfo& a, const BufferInfo& b) { return a.bytes > b.bytes; });
  if (v->size() > k) v->resize(k);
}

}  // namespace

StatusOr<ExecutableProfile> AnalyzeModule(const HloModule& module, const AnalysisOptions& options) {
  if (module.entry < 0 || static_cast<size_t>(module.entry) >= module.computations.size()) {
    return InvalidArgument("module has no entry computation");
  }
  Analyzer analyzer(module, options);
  Cost cost;
  if (!analyzer.ComputationCost(module.entry, 0, &cost)) {
    return InvalidArgument("HLO analysis failed: " + analyzer.error());
  }
  ExecutableProfile p;
  {
    std::vector<KernelInfo> kernels = analyzer.EntryKernels(module.entry);
    const size_t k = std::min(options.top_k, kernels.size());
    std::partial_sort(kernels.begin(), kernels.begin() + k, kernels.end(),
                      [](const KernelInfo& a, const KernelInfo& b) { return a.bytes > b.bytes; });
    p.heaviest_by_bytes.assign(kernels.begin(), kernels.begin() + k);
    std::partial_sort(kernels.begin(), kernels.begin() + k, kernels.end(),
                      [](const KernelInfo& a, const KernelInfo& b) { return a.flops > b.flops; });
    p.heaviest_by_flops.assign(kernels.begin(), kernels.begin() + k);
  }
  p.module_name = module.name;
  p.from_config_wrapper = module.had_config_wrapper;
  p.flops = cost.flops;
  p.transcendentals = cost.transcendentals;
  p.bytes_accessed = cost.bytes;
  p.bytes_written = cost.out_bytes;
  p.bytes_read = std::max(cost.bytes - cost.out_bytes, 0.0);
  p.arithmetic_intensity = cost.bytes > 0 ? cost.flops / cost.bytes : 0;
  p.dot_flops = cost.dot_flops;
  p.conv_flops = cost.conv_flops;
  p.elementwise_flops = cost.elementwise_flops;
  p.reduce_flops = cost.reduce_flops;
  p.other_flops = cost.other_flops;
  p.dot_count = static_cast<int64_t>(cost.dot_count);
  p.gemv_dot_count = static_cast<int64_t>(cost.gemv_count);
  p.gemv_dot_flops = cost.gemv_flops;
  p.state_append_count = static_cast<int64_t>(cost.append_count);
  p.state_append_buffer_bytes = cost.append_buffer_bytes;
  p.state_append_update_bytes = cost.append_update_bytes;
  p.convert_overhead_bytes = std::min(cost.convert_overhead, cost.bytes);
  p.convert_overhead_flops = std::min(cost.convert_flops, cost.flops);
  p.while_loops = static_cast<int64_t>(cost.while_loops);
  p.while_loops_unknown_trip_count = static_cast<int64_t>(cost.while_unknown);
  p.max_trip_count = static_cast<int64_t>(cost.max_trip);
  p.custom_calls = static_cast<int64_t>(cost.custom_calls);
  for (const Computation& c : module.computations) {
    p.instruction_count += static_cast<int64_t>(c.instructions.size());
  }
  const Computation& entry = module.computations[module.entry];
  for (const Instruction& in : entry.instructions) {
    if (IsNoCodeOpcode(in.opcode)) continue;
    ++p.top_level_kernels;
    if (in.opcode == Opcode::kFusion) ++p.fusion_count;
  }
  for (size_t n = 0; n < entry.parameters.size(); ++n) {
    const Instruction& param = entry.instructions[entry.parameters[n]];
    const double bytes = DataBytes(param.shape);
    p.parameter_bytes += bytes;
    p.largest_parameters.push_back(
        {param.name, static_cast<int64_t>(n), param.shape.ToString(), bytes});
  }
  KeepLargest(&p.largest_parameters, options.top_k);
  const Shape& result = entry.instructions[entry.root].shape;
  p.output_bytes = DataBytes(result);
  if (result.IsTuple()) {
    for (size_t i = 0; i < result.tuple_shapes.size(); ++i) {
      p.largest_outputs.push_back({"{" + std::to_string(i) + "}", static_cast<int64_t>(i),
                                   result.tuple_shapes[i].ToString(),
                                   DataBytes(result.tuple_shapes[i])});
    }
  } else {
    p.largest_outputs.push_back({"{}", -1, result.ToString(), DataBytes(result)});
  }
  KeepLargest(&p.largest_outputs, options.top_k);
  auto param_bytes = [&](int64_t number, const std::vector<int64_t>& index) -> double {
    if (number < 0 || number >= static_cast<int64_t>(entry.parameters.size())) return 0;
    const Shape* s = Subshape(entry.instructions[entry.parameters[number]].shape, index);
    return s == nullptr ? 0 : DataBytes(*s);
  };
  for (const AliasEntry& a : module.aliases) {
    const double bytes = param_bytes(a.parameter_number, a.parameter_index);
    p.aliased.push_back({a.parameter_number, IndexString(a.parameter_index),
                         IndexString(a.output_index), a.kind == 2, bytes});
    p.aliased_bytes += bytes;
  }
  for (const DonorEntry& d : module.donors) {
    const double bytes = param_bytes(d.parameter_number, d.parameter_index);
    p.aliased.push_back({d.parameter_number, IndexString(d.parameter_index), "", false, bytes});
    p.aliased_bytes += bytes;
  }
  return p;
}

StatusOr<ExecutableProfile> AnalyzeHloProto(std::string_view bytes, const AnalysisOptions& options) {
  StatusOr<HloModule> module = ParseHloModule(bytes, options.parse_limits);
  if (!module.ok()) return module.status();
  return AnalyzeModule(module.value(), options);
}

}  // namespace flexnpu::xla_passes
