#include "xla_passes/analysis.h"

#include <algorithm>
#include <string>
#include <vector>

#include "xla_passes/cost.h"
#include "xla_passes/cost_analyzer.h"

namespace flexnpu::xla_passes {
namespace {

using detail::Analyzer;
using detail::Cost;
using detail::DataBytes;
using detail::IsNoCodeOpcode;

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
