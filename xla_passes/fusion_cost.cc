// Bytes at fusion boundaries (values inside a fusion never touch memory: a fusion reads its
// operands, as far as it uses them, and writes its outputs) and the convert overhead of a
// backend that emulates narrow types.
#include <algorithm>
#include <vector>

#include "xla_passes/cost_analyzer.h"

namespace flexnpu::xla_passes::detail {

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

int64_t Analyzer::InPlaceScatterState(const Instruction& in) const {
  if (o_.xla_compatible || in.opcode != Opcode::kFusion || in.called.empty() ||
      !in.shape.IsArray()) {
    return -1;
  }
  const Computation& f = m_.computations[in.called[0]];
  if (f.root < 0 || static_cast<size_t>(f.root) >= f.instructions.size()) return -1;
  const Instruction& root = f.instructions[f.root];
  if (root.opcode != Opcode::kScatter || root.operands.size() != 3) return -1;
  const Instruction& state = f.instructions[root.operands[0]];
  return state.opcode == Opcode::kParameter ? state.parameter_number : -1;
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
  const int64_t scatter_state = InPlaceScatterState(in);
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
    // Deviation: a scatter root updates its state parameter in place (as an unfused scatter
    // is costed): it writes its updates and does not read the rest of the state.
    if (scatter_state >= 0) size = ShapeSize(fused.instructions[root.operands[2]].shape);
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
    if (scatter_state == static_cast<int64_t>(p)) read = 0;  // updated in place
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
      const Instruction& user = c.instructions[u];
      if (user.opcode == Opcode::kGetTupleElement) continue;
      // A scatter updating the converted value in place does not read it.
      const int64_t state = InPlaceScatterState(user);
      if (state >= 0 && static_cast<size_t>(state) < user.operands.size() &&
          user.operands[state] == idx) {
        continue;
      }
      readers += 1;
    }
    overhead += readers * elements * (out_width - in_width);
  } else if (out_width < in_width && InPlaceScatterState(*data) < 0) {
    // The producer wrote the wide value (an in-place scatter wrote only its updates).
    overhead += elements * (in_width - out_width);
  }
  own->convert_overhead += overhead;
  own->convert_flops += own->flops;
}

}  // namespace flexnpu::xla_passes::detail
