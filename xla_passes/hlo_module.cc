#include "xla_passes/hlo_module.h"

#include <algorithm>
#include <cmath>
#include <unordered_map>
#include <utility>

#include "pjrt_flexnpu/base/wire.h"

namespace flexnpu::xla_passes {
namespace {

using proto::Field;
using proto::Reader;
using proto::WireType;

// ---------------------------------------------------------------------------------------------
// Opcode table. Names are HloOpcodeString values (xla/hlo/ir/hlo_opcode.h).
struct OpcodeName {
  const char* name;
  Opcode opcode;
};

constexpr OpcodeName kOpcodes[] = {
    {"parameter", Opcode::kParameter},
    {"constant", Opcode::kConstant},
    {"get-tuple-element", Opcode::kGetTupleElement},
    {"bitcast", Opcode::kBitcast},
    {"domain", Opcode::kDomain},
    {"after-all", Opcode::kAfterAll},
    {"add-dependency", Opcode::kAddDependency},
    {"tuple", Opcode::kTuple},
    {"slice", Opcode::kSlice},
    {"dynamic-slice", Opcode::kDynamicSlice},
    {"dynamic-update-slice", Opcode::kDynamicUpdateSlice},
    {"transpose", Opcode::kTranspose},
    {"copy", Opcode::kCopy},
    {"broadcast", Opcode::kBroadcast},
    {"reshape", Opcode::kReshape},
    {"concatenate", Opcode::kConcatenate},
    {"pad", Opcode::kPad},
    {"reverse", Opcode::kReverse},
    {"iota", Opcode::kIota},
    {"gather", Opcode::kGather},
    {"scatter", Opcode::kScatter},
    // Elementwise, counted as one FLOP per output element (HloCostAnalysis::HandleElementwiseOp).
    {"abs", Opcode::kElementwise},
    {"add", Opcode::kElementwise},
    {"and", Opcode::kElementwise},
    {"bitcast-convert", Opcode::kElementwise},
    {"ceil", Opcode::kElementwise},
    {"clamp", Opcode::kElementwise},
    {"compare", Opcode::kElementwise},
    {"complex", Opcode::kElementwise},
    {"convert", Opcode::kElementwise},
    {"count-leading-zeros", Opcode::kElementwise},
    {"divide", Opcode::kElementwise},
    {"floor", Opcode::kElementwise},
    {"imag", Opcode::kElementwise},
    {"is-finite", Opcode::kElementwise},
    {"maximum", Opcode::kElementwise},
    {"minimum", Opcode::kElementwise},
    {"multiply", Opcode::kElementwise},
    {"negate", Opcode::kElementwise},
    {"not", Opcode::kElementwise},
    {"or", Opcode::kElementwise},
    {"popcnt", Opcode::kElementwise},
    {"real", Opcode::kElementwise},
    {"reduce-precision", Opcode::kElementwise},
    {"remainder", Opcode::kElementwise},
    {"round-nearest-afz", Opcode::kElementwise},
    {"round-nearest-even", Opcode::kElementwise},
    {"select", Opcode::kElementwise},
    {"shift-left", Opcode::kElementwise},
    {"shift-right-arithmetic", Opcode::kElementwise},
    {"shift-right-logical", Opcode::kElementwise},
    {"sign", Opcode::kElementwise},
    {"stochastic-convert", Opcode::kElementwise},
    {"subtract", Opcode::kElementwise},
    {"xor", Opcode::kElementwise},
    // Transcendental: counted separately from FLOPs, one per output element.
    {"atan2", Opcode::kTranscendental},
    {"cbrt", Opcode::kTranscendental},
    {"cosine", Opcode::kTranscendental},
    {"erf", Opcode::kTranscendental},
    {"exponential", Opcode::kTranscendental},
    {"exponential-minus-one", Opcode::kTranscendental},
    {"log", Opcode::kTranscendental},
    {"log-plus-one", Opcode::kTranscendental},
    {"logistic", Opcode::kTranscendental},
    {"power", Opcode::kTranscendental},
    {"rsqrt", Opcode::kTranscendental},
    {"sine", Opcode::kTranscendental},
    {"sqrt", Opcode::kTranscendental},
    {"tan", Opcode::kTranscendental},
    {"tanh", Opcode::kTranscendental},
    {"dot", Opcode::kDot},
    {"convolution", Opcode::kConvolution},
    {"fft", Opcode::kFft},
    {"reduce", Opcode::kReduce},
    {"reduce-window", Opcode::kReduceWindow},
    {"map", Opcode::kMap},
    {"select-and-scatter", Opcode::kSelectAndScatter},
    {"sort", Opcode::kSort},
    {"rng", Opcode::kRng},
    {"rng-bit-generator", Opcode::kRngBitGenerator},
    {"all-reduce", Opcode::kAllReduce},
    {"all-reduce-start", Opcode::kAllReduce},
    {"triangular-solve", Opcode::kTriangularSolve},
    {"cholesky", Opcode::kCholesky},
    {"fusion", Opcode::kFusion},
    {"call", Opcode::kCall},
    {"while", Opcode::kWhile},
    {"conditional", Opcode::kConditional},
    {"custom-call", Opcode::kCustomCall},
    {"async-start", Opcode::kAsyncStart},
};

// ---------------------------------------------------------------------------------------------
// Small parsing helpers. Each returns false with `*error` set on malformed input.

bool Expect(const Field& f, WireType type, const char* what, std::string* error) {
  if (f.type == type) return true;
  *error = std::string("field ") + what + " (" + std::to_string(f.number) +
           ") has an unexpected wire type";
  return false;
}

bool ReadInts(const Field& f, std::vector<int64_t>* out, const char* what, std::string* error) {
  if (!proto::AppendVarints(f, out)) {
    *error = std::string("malformed repeated integer field ") + what;
    return false;
  }
  return true;
}

bool ReadInt(const Field& f, int64_t* out, const char* what, std::string* error) {
  if (!Expect(f, WireType::kVarint, what, error)) return false;
  *out = static_cast<int64_t>(f.value);
  return true;
}

bool ReadString(const Field& f, std::string* out, const char* what, std::string* error) {
  if (!Expect(f, WireType::kLengthDelimited, what, error)) return false;
  out->assign(f.bytes.data(), f.bytes.size());
  return true;
}

bool Finish(const Reader& r, const char* what, std::string* error) {
  if (r.ok()) return true;
  *error = std::string("malformed ") + what + ": " + r.error();
  return false;
}

bool ParseLayout(std::string_view data, Shape* shape, const ParseLimits& limits,
                 std::string* error) {
  Reader r(data);
  Field f;
  while (r.Next(&f)) {
    if (f.number == 1) {
      if (!ReadInts(f, &shape->minor_to_major, "minor_to_major", error)) return false;
      if (shape->minor_to_major.size() > limits.max_rank) {
        *error = "layout rank exceeds limit";
        return false;
      }
    } else if (f.number == 7) {
      if (!ReadInt(f, &shape->element_size_in_bits, "element_size_in_bits", error)) return false;
    }
  }
  return Finish(r, "LayoutProto", error);
}

bool ParseShape(std::string_view data, Shape* shape, int depth, const ParseLimits& limits,
                std::string* error) {
  if (depth > limits.max_shape_depth) {
    *error = "shape nested too deeply";
    return false;
  }
  Reader r(data);
  Field f;
  std::vector<int64_t> dynamic;
  while (r.Next(&f)) {
    switch (f.number) {
      case 2: {
        int64_t t;
        if (!ReadInt(f, &t, "element_type", error)) return false;
        shape->element_type = static_cast<int32_t>(t);
        break;
      }
      case 3:
        if (!ReadInts(f, &shape->dims, "dimensions", error)) return false;
        if (shape->dims.size() > limits.max_rank) {
          *error = "shape rank exceeds limit";
          return false;
        }
        break;
      case 4: {
        if (!Expect(f, WireType::kLengthDelimited, "tuple_shapes", error)) return false;
        shape->tuple_shapes.emplace_back();
        if (!ParseShape(f.bytes, &shape->tuple_shapes.back(), depth + 1, limits, error)) {
          return false;
        }
        break;
      }
      case 5:
        if (!Expect(f, WireType::kLengthDelimited, "layout", error)) return false;
        shape->has_layout = true;
        if (!ParseLayout(f.bytes, shape, limits, error)) return false;
        break;
      case 6:
        if (!ReadInts(f, &dynamic, "is_dynamic_dimension", error)) return false;
        break;
      default:
        break;
    }
  }
  if (!Finish(r, "ShapeProto", error)) return false;
  for (int64_t d : shape->dims) {
    if (d < 0) {
      *error = "negative dimension size";
      return false;
    }
  }
  shape->dynamic = std::any_of(dynamic.begin(), dynamic.end(), [](int64_t v) { return v != 0; });
  return true;
}

bool ParseDotDims(std::string_view data, DotDimensions* d, std::string* error) {
  Reader r(data);
  Field f;
  while (r.Next(&f)) {
    std::vector<int64_t>* target = nullptr;
    switch (f.number) {
      case 1: target = &d->lhs_contracting; break;
      case 2: target = &d->rhs_contracting; break;
      case 3: target = &d->lhs_batch; break;
      case 4: target = &d->rhs_batch; break;
      default: break;
    }
    if (target != nullptr && !ReadInts(f, target, "dot dimension numbers", error)) return false;
  }
  return Finish(r, "DotDimensionNumbers", error);
}

bool ParseConvDims(std::string_view data, ConvDimensions* d, std::string* error) {
  Reader r(data);
  Field f;
  while (r.Next(&f)) {
    bool ok = true;
    switch (f.number) {
      case 7: ok = ReadInt(f, &d->input_batch, "input_batch_dimension", error); break;
      case 8: ok = ReadInt(f, &d->input_feature, "input_feature_dimension", error); break;
      case 10: ok = ReadInt(f, &d->output_feature, "output_feature_dimension", error); break;
      case 11: ok = ReadInts(f, &d->input_spatial, "input_spatial_dimensions", error); break;
      case 6: ok = ReadInts(f, &d->kernel_spatial, "kernel_spatial_dimensions", error); break;
      case 12: ok = ReadInts(f, &d->output_spatial, "output_spatial_dimensions", error); break;
      default: break;
    }
    if (!ok) return false;
  }
  return Finish(r, "ConvolutionDimensionNumbers", error);
}

bool ParseWindow(std::string_view data, std::vector<WindowDim>* window, std::string* error) {
  Reader r(data);
  Field f;
  while (r.Next(&f)) {
    if (f.number != 1) continue;
    if (!Expect(f, WireType::kLengthDelimited, "window dimension", error)) return false;
    if (window->size() >= 64) {
      *error = "window rank exceeds limit";
      return false;
    }
    WindowDim w;
    w.stride = w.window_dilation = w.base_dilation = 0;  // proto3 defaults; fixed below
    Reader dr(f.bytes);
    Field g;
    while (dr.Next(&g)) {
      int64_t* target = nullptr;
      switch (g.number) {
        case 1: target = &w.size; break;
        case 2: target = &w.stride; break;
        case 3: target = &w.padding_low; break;
        case 4: target = &w.padding_high; break;
        case 5: target = &w.window_dilation; break;
        case 6: target = &w.base_dilation; break;
        default: break;
      }
      if (target != nullptr && !ReadInt(g, target, "window dimension", error)) return false;
    }
    if (!Finish(dr, "WindowDimension", error)) return false;
    // Unset (0) strides and dilations mean 1; negative sizes are malformed.
    if (w.stride <= 0) w.stride = 1;
    if (w.window_dilation <= 0) w.window_dilation = 1;
    if (w.base_dilation <= 0) w.base_dilation = 1;
    if (w.size < 0) {
      *error = "negative window size";
      return false;
    }
    window->push_back(w);
  }
  return Finish(r, "Window", error);
}

bool ParseInstruction(std::string_view data, Instruction* in, const ParseLimits& limits,
                      std::string* error) {
  Reader r(data);
  Field f;
  while (r.Next(&f)) {
    bool ok = true;
    switch (f.number) {
      case 1: ok = ReadString(f, &in->name, "name", error); break;
      case 2: ok = ReadString(f, &in->opcode_name, "opcode", error); break;
      case 3:
        ok = Expect(f, WireType::kLengthDelimited, "shape", error) &&
             ParseShape(f.bytes, &in->shape, 0, limits, error);
        break;
      case 9: ok = ReadInt(f, &in->parameter_number, "parameter_number", error); break;
      case 11: ok = ReadString(f, &in->fusion_kind, "fusion_kind", error); break;
      case 13: ok = ReadInt(f, &in->tuple_index, "tuple_index", error); break;
      case 14: ok = ReadInts(f, &in->dimensions, "dimensions", error); break;
      case 15:
        ok = Expect(f, WireType::kLengthDelimited, "window", error) &&
             ParseWindow(f.bytes, &in->window, error);
        break;
      case 16:
        ok = Expect(f, WireType::kLengthDelimited, "convolution_dimension_numbers", error) &&
             ParseConvDims(f.bytes, &in->conv, error);
        break;
      case 28: ok = ReadString(f, &in->custom_call_target, "custom_call_target", error); break;
      case 30:
        ok = Expect(f, WireType::kLengthDelimited, "dot_dimension_numbers", error) &&
             ParseDotDims(f.bytes, &in->dot, error);
        break;
      case 32: ok = ReadInts(f, &in->fft_length, "fft_length", error); break;
      case 35: ok = ReadInt(f, &in->id, "id", error); break;
      case 36: ok = ReadInts(f, &in->operand_ids, "operand_ids", error); break;
      case 38:
        ok = ReadInts(f, &in->called_computation_ids, "called_computation_ids", error);
        break;
      case 43: ok = ReadString(f, &in->backend_config, "backend_config", error); break;
      case 50: ok = ReadInt(f, &in->feature_group_count, "feature_group_count", error); break;
      case 58: ok = ReadInt(f, &in->batch_group_count, "batch_group_count", error); break;
      default: break;
    }
    if (!ok) return false;
  }
  if (!Finish(r, "HloInstructionProto", error)) return false;
  if (in->feature_group_count <= 0) in->feature_group_count = 1;
  if (in->batch_group_count <= 0) in->batch_group_count = 1;
  in->opcode = ClassifyOpcode(in->opcode_name);
  return true;
}

bool ParseComputation(std::string_view data, Computation* c, size_t* instruction_budget,
                      const ParseLimits& limits, std::string* error) {
  Reader r(data);
  Field f;
  while (r.Next(&f)) {
    bool ok = true;
    switch (f.number) {
      case 1: ok = ReadString(f, &c->name, "computation name", error); break;
      case 2:
        if (*instruction_budget == 0) {
          *error = "too many instructions";
          return false;
        }
        --*instruction_budget;
        ok = Expect(f, WireType::kLengthDelimited, "instructions", error);
        if (ok) {
          c->instructions.emplace_back();
          ok = ParseInstruction(f.bytes, &c->instructions.back(), limits, error);
        }
        break;
      case 5: ok = ReadInt(f, &c->id, "computation id", error); break;
      case 6: ok = ReadInt(f, &c->root_id, "root_id", error); break;
      case 7: {
        int64_t v = 0;
        ok = ReadInt(f, &v, "is_fusion_computation", error);
        c->is_fusion = v != 0;
        break;
      }
      default: break;
    }
    if (!ok) return false;
  }
  return Finish(r, "HloComputationProto", error);
}

bool ParseAliases(std::string_view data, std::vector<AliasEntry>* out, std::string* error) {
  Reader r(data);
  Field f;
  while (r.Next(&f)) {
    if (f.number != 1) continue;
    if (!Expect(f, WireType::kLengthDelimited, "alias entry", error)) return false;
    AliasEntry e;
    Reader er(f.bytes);
    Field g;
    while (er.Next(&g)) {
      bool ok = true;
      switch (g.number) {
        case 1: ok = ReadInts(g, &e.output_index, "output_shape_index", error); break;
        case 2: ok = ReadInt(g, &e.parameter_number, "parameter_number", error); break;
        case 3: ok = ReadInts(g, &e.parameter_index, "parameter_shape_index", error); break;
        case 4: ok = ReadInt(g, &e.kind, "kind", error); break;
        default: break;
      }
      if (!ok) return false;
    }
    if (!Finish(er, "AliasEntryProto", error)) return false;
    out->push_back(std::move(e));
  }
  return Finish(r, "HloInputOutputAliasProto", error);
}

bool ParseDonors(std::string_view data, std::vector<DonorEntry>* out, std::string* error) {
  Reader r(data);
  Field f;
  while (r.Next(&f)) {
    if (f.number != 1) continue;
    if (!Expect(f, WireType::kLengthDelimited, "buffer donor entry", error)) return false;
    DonorEntry e;
    Reader er(f.bytes);
    Field g;
    while (er.Next(&g)) {
      bool ok = true;
      if (g.number == 1) ok = ReadInt(g, &e.parameter_number, "parameter_number", error);
      if (g.number == 2) ok = ReadInts(g, &e.parameter_index, "parameter_shape_index", error);
      if (!ok) return false;
    }
    if (!Finish(er, "BufferDonorEntryProto", error)) return false;
    out->push_back(std::move(e));
  }
  return Finish(r, "HloBufferDonorProto", error);
}

// Resolves ids to indices and checks every cross reference.
bool Link(HloModule* m, bool has_entry_id, int64_t entry_id, const std::string& entry_name,
          std::string* error) {
  if (m->computations.empty()) {
    *error = "module has no computations";
    return false;
  }
  std::unordered_map<int64_t, int32_t> computation_index;
  computation_index.reserve(m->computations.size());
  for (size_t i = 0; i < m->computations.size(); ++i) {
    if (!computation_index.emplace(m->computations[i].id, static_cast<int32_t>(i)).second) {
      *error = "duplicate computation id " + std::to_string(m->computations[i].id);
      return false;
    }
  }
  for (Computation& c : m->computations) {
    if (c.instructions.empty()) {
      *error = "computation '" + c.name + "' has no instructions";
      return false;
    }
    std::unordered_map<int64_t, int32_t> index;
    index.reserve(c.instructions.size());
    for (size_t i = 0; i < c.instructions.size(); ++i) {
      if (!index.emplace(c.instructions[i].id, static_cast<int32_t>(i)).second) {
        *error = "duplicate instruction id " + std::to_string(c.instructions[i].id) +
                 " in computation '" + c.name + "'";
        return false;
      }
    }
    c.users.assign(c.instructions.size(), {});
    for (size_t i = 0; i < c.instructions.size(); ++i) {
      Instruction& in = c.instructions[i];
      in.operands.reserve(in.operand_ids.size());
      for (int64_t id : in.operand_ids) {
        auto it = index.find(id);
        if (it == index.end()) {
          *error = "instruction '" + in.name + "' refers to unknown operand id " +
                   std::to_string(id);
          return false;
        }
        in.operands.push_back(it->second);
        auto& users = c.users[it->second];
        if (users.empty() || users.back() != static_cast<int32_t>(i)) {
          users.push_back(static_cast<int32_t>(i));
        }
      }
      for (int64_t id : in.called_computation_ids) {
        auto it = computation_index.find(id);
        if (it == computation_index.end()) {
          *error = "instruction '" + in.name + "' calls unknown computation id " +
                   std::to_string(id);
          return false;
        }
        in.called.push_back(it->second);
      }
      if (in.opcode == Opcode::kParameter) {
        if (in.parameter_number < 0 ||
            in.parameter_number >= static_cast<int64_t>(c.instructions.size())) {
          *error = "parameter number out of range in computation '" + c.name + "'";
          return false;
        }
        const auto n = static_cast<size_t>(in.parameter_number);
        if (c.parameters.size() <= n) c.parameters.resize(n + 1, -1);
        if (c.parameters[n] != -1) {
          *error = "duplicate parameter number in computation '" + c.name + "'";
          return false;
        }
        c.parameters[n] = static_cast<int32_t>(i);
      }
    }
    for (int32_t p : c.parameters) {
      if (p == -1) {
        *error = "parameter numbers are not contiguous in computation '" + c.name + "'";
        return false;
      }
    }
    // Users lists must be unique even when the same operand appears at non-adjacent positions.
    for (auto& users : c.users) {
      std::sort(users.begin(), users.end());
      users.erase(std::unique(users.begin(), users.end()), users.end());
    }
    auto root = index.find(c.root_id);
    c.root = root != index.end() ? root->second : static_cast<int32_t>(c.instructions.size() - 1);
  }
  if (has_entry_id) {
    auto it = computation_index.find(entry_id);
    if (it == computation_index.end()) {
      *error = "entry computation id " + std::to_string(entry_id) + " not in module";
      return false;
    }
    m->entry = it->second;
  } else {
    m->entry = static_cast<int32_t>(m->computations.size() - 1);
    for (size_t i = 0; i < m->computations.size(); ++i) {
      if (!entry_name.empty() && m->computations[i].name == entry_name) {
        m->entry = static_cast<int32_t>(i);
      }
    }
  }
  return true;
}

bool ParseModuleFields(std::string_view data, HloModule* m, const ParseLimits& limits,
                       std::string* error) {
  Reader r(data);
  Field f;
  bool has_entry_id = false;
  int64_t entry_id = 0;
  std::string entry_name;
  size_t budget = limits.max_instructions;
  while (r.Next(&f)) {
    bool ok = true;
    switch (f.number) {
      case 1: ok = ReadString(f, &m->name, "module name", error); break;
      case 2: ok = ReadString(f, &entry_name, "entry_computation_name", error); break;
      case 3:
        ok = Expect(f, WireType::kLengthDelimited, "computations", error);
        if (ok) {
          m->computations.emplace_back();
          ok = ParseComputation(f.bytes, &m->computations.back(), &budget, limits, error);
        }
        break;
      case 6:
        ok = ReadInt(f, &entry_id, "entry_computation_id", error);
        has_entry_id = true;
        break;
      case 8:
        ok = Expect(f, WireType::kLengthDelimited, "input_output_alias", error) &&
             ParseAliases(f.bytes, &m->aliases, error);
        break;
      case 18:
        ok = Expect(f, WireType::kLengthDelimited, "buffer_donor", error) &&
             ParseDonors(f.bytes, &m->donors, error);
        break;
      default: break;
    }
    if (!ok) return false;
  }
  if (!Finish(r, "HloModuleProto", error)) return false;
  return Link(m, has_entry_id, entry_id, entry_name, error);
}

// True if the top-level message has the shape of a wrapper (HloModuleProtoWithConfig or
// HloProto): no `computations` field of its own and a length-delimited field 1 that itself
// carries computations.
bool LooksLikeWrapper(std::string_view data, std::string_view* inner) {
  Reader r(data);
  Field f;
  bool has_computations = false;
  std::string_view candidate;
  bool has_candidate = false;
  while (r.Next(&f)) {
    if (f.number == 1 && f.type == WireType::kLengthDelimited && !has_candidate) {
      candidate = f.bytes;
      has_candidate = true;
    } else if (f.number == 3 && f.type == WireType::kLengthDelimited) {
      // In HloModuleProto field 3 is `computations`; in HloProto it is the buffer assignment.
      // Decide below from the content of field 1.
      has_computations = true;
    }
  }
  if (!r.ok() || !has_candidate) return false;
  Reader ir(candidate);
  bool inner_has_computations = false;
  while (ir.Next(&f)) {
    if (f.number == 3 && f.type == WireType::kLengthDelimited) inner_has_computations = true;
  }
  if (!ir.ok() || !inner_has_computations) return false;
  // A module name (field 1 of HloModuleProto) that happens to parse as a message with a
  // field 3 is possible but only matters if the outer message has no computations itself.
  if (has_computations) {
    // HloProto: outer field 3 is a BufferAssignmentProto whose field 1 is logical buffers;
    // an HloModuleProto's computations carry instructions (field 2). Prefer the outer parse
    // unless field 1 is clearly a module.
    return false;
  }
  *inner = candidate;
  return true;
}

}  // namespace

int PrimitiveTypeBytes(int32_t type) {
  switch (type) {
    case 1:                                            // PRED
    case 2: case 6:                                    // S8 U8
    case 19: case 20: case 23: case 24: case 25:       // F8 variants
    case 28: case 29: case 33:
    case 21: case 22: case 26: case 27: case 30: case 31: case 32:  // sub-byte types
      return 1;
    case 3: case 7: case 10: case 16:                  // S16 U16 F16 BF16
      return 2;
    case 4: case 8: case 11:                           // S32 U32 F32
      return 4;
    case 5: case 9: case 12: case 15:                  // S64 U64 F64 C64
      return 8;
    case 18:                                           // C128
      return 16;
    default:
      return 0;
  }
}

const char* PrimitiveTypeName(int32_t type) {
  switch (type) {
    case 1: return "pred";
    case 2: return "s8";
    case 3: return "s16";
    case 4: return "s32";
    case 5: return "s64";
    case 6: return "u8";
    case 7: return "u16";
    case 8: return "u32";
    case 9: return "u64";
    case 10: return "f16";
    case 11: return "f32";
    case 12: return "f64";
    case 13: return "tuple";
    case 14: return "opaque";
    case 15: return "c64";
    case 16: return "bf16";
    case 17: return "token";
    case 18: return "c128";
    case 19: return "f8e5m2";
    case 20: return "f8e4m3fn";
    case 21: return "s4";
    case 22: return "u4";
    default: return "type";
  }
}

double Shape::Elements() const {
  double n = 1;
  for (int64_t d : dims) n *= static_cast<double>(d);
  return n;
}

std::string Shape::ToString() const {
  if (IsTuple()) {
    std::string s = "(";
    for (size_t i = 0; i < tuple_shapes.size(); ++i) {
      if (i) s += ", ";
      s += tuple_shapes[i].ToString();
    }
    return s + ")";
  }
  std::string s = PrimitiveTypeName(element_type);
  if (!IsArray()) return s;
  s += "[";
  for (size_t i = 0; i < dims.size(); ++i) {
    if (i) s += ",";
    s += std::to_string(dims[i]);
  }
  return s + "]";
}

Opcode ClassifyOpcode(std::string_view name) {
  static const auto* table = [] {
    auto* t = new std::unordered_map<std::string_view, Opcode>();
    for (const OpcodeName& o : kOpcodes) t->emplace(o.name, o.opcode);
    return t;
  }();
  auto it = table->find(name);
  return it == table->end() ? Opcode::kOther : it->second;
}

int64_t KnownTripCount(std::string_view config) {
  constexpr std::string_view kKey = "\"known_trip_count\"";
  size_t pos = config.find(kKey);
  if (pos == std::string_view::npos) return -1;
  pos = config.find("\"n\"", pos + kKey.size());
  if (pos == std::string_view::npos) return -1;
  pos += 3;
  while (pos < config.size() && (config[pos] == ' ' || config[pos] == ':' || config[pos] == '"')) {
    ++pos;
  }
  int64_t n = 0;
  size_t digits = 0;
  while (pos < config.size() && config[pos] >= '0' && config[pos] <= '9' && digits < 18) {
    n = n * 10 + (config[pos] - '0');
    ++pos;
    ++digits;
  }
  return digits == 0 ? -1 : n;
}

StatusOr<HloModule> ParseHloModule(std::string_view bytes, const ParseLimits& limits) {
  if (bytes.empty()) return InvalidArgument("empty HLO module bytes");
  HloModule m;
  std::string error;
  std::string_view inner;
  std::string_view module_bytes = bytes;
  if (LooksLikeWrapper(bytes, &inner)) {
    module_bytes = inner;
    m.had_config_wrapper = true;
  }
  if (!ParseModuleFields(module_bytes, &m, limits, &error)) {
    return InvalidArgument("invalid HLO module: " + error);
  }
  return m;
}

}  // namespace flexnpu::xla_passes
