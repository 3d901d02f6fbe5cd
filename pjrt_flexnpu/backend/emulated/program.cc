#include "pjrt_flexnpu/backend/emulated/program.h"

#include <algorithm>
#include <exception>

#include "pjrt_flexnpu/backend/compile_options.h"
#include "pjrt_flexnpu/backend/emulated/timeline.h"
#include "pjrt_flexnpu/backend/remote/protocol.h"  // HostElementBytes
#include "xla_passes/analysis.h"
#include "xla_passes/hlo_module.h"
#include "xla_passes/roofline.h"

namespace flexnpu::emulated {
namespace {

StatusOr<std::vector<OutputShape>> OutputShapes(const PhysicalBackend& cpu,
                                                PJRT_Executable* executable) {
  PJRT_Executable_OutputElementTypes_Args types{};
  types.struct_size = PJRT_Executable_OutputElementTypes_Args_STRUCT_SIZE;
  types.executable = executable;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(cpu, PJRT_Executable_OutputElementTypes, &types));
  PJRT_Executable_OutputDimensions_Args dims{};
  dims.struct_size = PJRT_Executable_OutputDimensions_Args_STRUCT_SIZE;
  dims.executable = executable;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(cpu, PJRT_Executable_OutputDimensions, &dims));
  if (dims.num_outputs != types.num_output_types) {
    return Internal("emulated backend: the CPU compiler reports " +
                    std::to_string(types.num_output_types) + " output types but " +
                    std::to_string(dims.num_outputs) + " output shapes");
  }
  std::vector<OutputShape> outputs(dims.num_outputs);
  size_t at = 0;
  for (size_t o = 0; o < outputs.size(); ++o) {
    OutputShape& out = outputs[o];
    out.type = types.output_types[o];
    out.dims.assign(dims.dims + at, dims.dims + at + dims.dim_sizes[o]);
    at += dims.dim_sizes[o];
    int64_t elements = 1;
    for (int64_t d : out.dims) elements *= d;
    out.bytes = elements * static_cast<int64_t>(daemon::HostElementBytes(out.type));
  }
  return outputs;
}

// Parameters the module consumes: whole-parameter aliases and donors (a tupled parameter's
// element is not an argument of its own).
void ReadDonations(const xla_passes::HloModule& module, Program* p) {
  for (const auto& alias : module.aliases) {
    if (!alias.parameter_index.empty()) continue;
    p->donated.push_back(alias.parameter_number);
    if (alias.kind == 2) p->must_alias.push_back(alias.parameter_number);
  }
  for (const auto& donor : module.donors) {
    if (donor.parameter_index.empty()) p->donated.push_back(donor.parameter_number);
  }
  for (auto* list : {&p->donated, &p->must_alias}) {
    std::sort(list->begin(), list->end());
    list->erase(std::unique(list->begin(), list->end()), list->end());
  }
}

}  // namespace

bool IsHostCallbackTarget(std::string_view target) {
  return target.find("callback") != std::string_view::npos;
}

ProgramCache::Result ProgramCache::Get(const std::string& key,
                                       const std::function<Result()>& compile) {
  std::promise<Result> promise;
  {
    std::unique_lock<std::mutex> lock(mu_);
    auto it = entries_.find(key);
    if (it != entries_.end()) {
      if (auto program = it->second.done.lock()) return program;
      if (it->second.pending.valid()) {
        std::shared_future<Result> pending = it->second.pending;
        lock.unlock();
        return pending.get();
      }
      entries_.erase(it);  // its executables are gone
    }
    if (entries_.size() >= sweep_at_) {
      for (auto e = entries_.begin(); e != entries_.end();) {
        e = !e->second.pending.valid() && e->second.done.expired() ? entries_.erase(e) : ++e;
      }
      sweep_at_ = std::max<size_t>(64, 2 * entries_.size());
    }
    entries_[key].pending = promise.get_future().share();
  }
  compiles_.fetch_add(1, std::memory_order_relaxed);
  Result result = Internal("emulated backend: compiling threw");
  try {  // whatever happens, the requests waiting for this compile get an answer
    result = compile();
  } catch (const std::exception& e) {
    result = Internal(std::string("emulated backend: compiling: ") + e.what());
  } catch (...) {
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    Entry& entry = entries_[key];
    entry.pending = {};
    if (result.ok()) {
      entry.done = *result;
    } else {
      entries_.erase(key);  // the next request tries again
    }
  }
  promise.set_value(result);
  return result;
}

StatusOr<std::string> DeviceFreeOptionsKey(std::string_view options) {
  FLEXNPU_ASSIGN_OR_RETURN(const std::string device_free, WithoutDeviceChoice(options));
  return CompileOptionsKey(device_free);
}

StatusOr<std::string> ProgramKey(const PJRT_Program& program, std::string_view options) {
  auto device_free = DeviceFreeOptionsKey(options);
  if (!device_free.ok()) return device_free.status();
  std::string key;
  key.reserve(program.format_size + program.code_size + device_free->size() + 24);
  for (std::string_view part : {std::string_view(program.format, program.format_size),
                                std::string_view(program.code, program.code_size),
                                std::string_view(*device_free)}) {
    key += std::to_string(part.size());
    key += ':';
    key.append(part.data(), part.size());
  }
  return key;
}

StatusOr<std::shared_ptr<const Program>> AnalyzeProgram(std::shared_ptr<const PhysicalBackend> cpu,
                                                        InnerLoadedExecutable loaded,
                                                        const Config& config) {
  auto p = std::make_shared<Program>();
  p->cpu = cpu;
  FLEXNPU_ASSIGN_OR_RETURN(p->cpu_executable, cpu->GetExecutable(loaded.get()));
  p->cpu_loaded = std::move(loaded);
  PJRT_Executable* executable = p->cpu_executable.get();
  PJRT_Executable_Name_Args name{};
  name.struct_size = PJRT_Executable_Name_Args_STRUCT_SIZE;
  name.executable = executable;
  if (FLEXNPU_INNER_CALL(*cpu, PJRT_Executable_Name, &name).ok()) {
    p->name.assign(name.executable_name, name.executable_name_size);
  }
  FLEXNPU_ASSIGN_OR_RETURN(p->outputs, OutputShapes(*cpu, executable));
  if (auto memory = cpu->CompiledMemoryStats(executable); memory.ok()) {
    p->output_bytes = std::max<int64_t>(0, memory->output_bytes);
    p->temp_bytes = std::max<int64_t>(0, memory->temp_bytes);
  } else {
    for (const OutputShape& o : p->outputs) p->output_bytes += o.bytes;
  }

  FLEXNPU_ASSIGN_OR_RETURN(const std::string code, cpu->OptimizedProgram(executable));
  auto module = xla_passes::ParseHloModule(code);
  if (!module.ok()) {
    return Internal("emulated backend: reading the optimized program: " +
                    module.status().message());
  }
  for (const auto& computation : module->computations) {
    for (const auto& instruction : computation.instructions) {
      if (instruction.opcode == xla_passes::Opcode::kCustomCall &&
          IsHostCallbackTarget(instruction.custom_call_target) && p->host_callback.empty()) {
        p->host_callback = instruction.custom_call_target;
      }
    }
  }
  ReadDonations(*module, p.get());
  auto profile = xla_passes::AnalyzeModule(*module);
  if (!profile.ok()) {
    return Internal("emulated backend: HLO analysis of the optimized program: " +
                    profile.status().message());
  }
  auto cost = xla_passes::Classify(*profile, config.preset);
  if (!cost.ok()) return Internal("emulated backend: " + cost.status().message());
  p->flops = cost->flops;
  p->bytes = cost->bytes;
  p->modelled_s = xla_passes::ModelledSeconds(config.preset, p->flops, p->bytes);
  p->duration_ns = ScaledNs(p->modelled_s, config.time_scale);
  const xla_passes::DeviceSpec& d = config.preset;
  const double scale_ns = config.time_scale * 1e9;
  p->compute_ns = p->flops / (d.peak_flops * d.eff_compute) * scale_ns;
  p->memory_ns = p->bytes / (d.mem_bandwidth * d.eff_memory) * scale_ns;
  p->launch_ns = d.small_work_s * scale_ns;
  return std::shared_ptr<const Program>(std::move(p));
}

}  // namespace flexnpu::emulated
