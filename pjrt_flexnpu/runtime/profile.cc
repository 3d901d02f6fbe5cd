#include "pjrt_flexnpu/runtime/profile.h"

#include <algorithm>
#include <cctype>
#include <string_view>

#include "xla_passes/analysis.h"

namespace flexnpu {
namespace {

std::string Lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

// Host-to-device style links when the preset names none: PCIe 5 x16 for accelerators,
// memcpy bandwidth for CPU devices (one memory).
constexpr double kAcceleratorLinkBytesPerS = 50e9;

}  // namespace

xla_passes::DeviceSpec RooflineFor(const std::string& platform, const std::string& device_kind) {
  const std::string kind = Lower(device_kind);
  for (const auto& preset : xla_passes::DevicePresets()) {
    if (preset.name != "cpu" && kind.find(preset.name) != std::string::npos) return preset;
  }
  auto cpu = xla_passes::FindDevice("cpu");
  if (Lower(platform) == "cpu" && cpu.ok()) return cpu.value();
  // An accelerator FlexNPU has no numbers for: judge it as an H100-class device.
  auto fallback = xla_passes::FindDevice("h100");
  return fallback.ok() ? fallback.value() : xla_passes::DeviceSpec{};
}

placement::DeviceModel DeviceModelFor(const xla_passes::DeviceSpec& spec) {
  placement::DeviceModel model;
  if (spec.peak_flops > 0) model.peak_flops = spec.peak_flops;
  if (spec.mem_bandwidth > 0) model.bandwidth_bytes_per_s = spec.mem_bandwidth;
  const bool cpu = spec.name == "cpu";
  model.link_bytes_per_s = cpu ? model.bandwidth_bytes_per_s : kAcceleratorLinkBytesPerS;
  // A preset that names its device-to-device link (HCCS, NVLink) moves buffers at its speed,
  // as the emulated backend's copies do.
  if (!cpu && !spec.link.empty()) {
    if (auto link = xla_passes::FindLink(spec.link); link.ok() && link->bytes_per_s > 0) {
      model.link_bytes_per_s = link->bytes_per_s;
    }
  }
  // XLA:CPU devices share the host's cores; GPUs run one program at a time per stream.
  model.can_overlap = false;
  // Below this roofline time work is latency-bound: the fixed cost of an execution.
  model.launch_s = spec.small_work_s;
  return model;
}

placement::DeviceModel StretchedDeviceModel(placement::DeviceModel model, double time_scale) {
  if (!(time_scale > 0) || time_scale == 1) return model;
  model.peak_flops /= time_scale;
  model.bandwidth_bytes_per_s /= time_scale;
  model.link_bytes_per_s /= time_scale;
  model.launch_s *= time_scale;
  return model;
}

StatusOr<placement::Profile> ProfileExecutable(const PhysicalBackend& backend,
                                               PJRT_Executable* executable,
                                               const xla_passes::DeviceSpec& device,
                                               DonatableArguments* donatable) {
  FLEXNPU_ASSIGN_OR_RETURN(const std::string code, backend.OptimizedProgram(executable));

  auto profile = xla_passes::AnalyzeHloProto(code);
  if (!profile.ok()) return Internal("HLO analysis of the optimized program: " + profile.status().message());
  if (donatable != nullptr) {
    DonatableArguments found;
    found.known = true;
    for (const xla_passes::AliasInfo& alias : profile.value().aliased) {
      // A tupled parameter's elements are not arguments of their own: unknown.
      if (alias.parameter_index != "{}" || alias.parameter_number < 0) found.known = false;
      found.arguments.push_back(static_cast<int>(alias.parameter_number));
    }
    std::sort(found.arguments.begin(), found.arguments.end());
    found.arguments.erase(std::unique(found.arguments.begin(), found.arguments.end()),
                          found.arguments.end());
    // None found while the compiler reports aliased bytes: the analysis missed it, unknown.
    if (found.arguments.empty()) found.known = false;
    if (!found.known) found.arguments.clear();
    *donatable = std::move(found);
  }
  auto classified = xla_passes::Classify(profile.value(), device);
  if (!classified.ok()) return Internal("phase classification: " + classified.status().message());
  placement::Profile out;
  out.phase = classified.value().phase;
  out.flops = classified.value().flops;
  out.bytes = classified.value().bytes;
  // Device memory an execution needs, by the compiler: outputs + temporaries (placement skips
  // devices whose telemetry reports less free). Plugins without the call: 0, unknown.
  if (auto memory = backend.CompiledMemoryStats(executable); memory.ok()) {
    out.memory_bytes =
        std::max<int64_t>(0, memory->output_bytes) + std::max<int64_t>(0, memory->temp_bytes);
  }
  return out;
}

}  // namespace flexnpu
