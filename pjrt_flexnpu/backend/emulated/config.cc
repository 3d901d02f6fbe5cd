#include "pjrt_flexnpu/backend/emulated/config.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

namespace flexnpu::emulated {
namespace {

std::string KnownPresets() {
  std::string known;
  for (const xla_passes::DeviceSpec& d : xla_passes::DevicePresets()) {
    if (d.name == "cpu") continue;  // this machine's own: nothing to emulate
    known += (known.empty() ? "" : ", ") + d.name;
  }
  return known;
}

Status BadValue(const std::string& name, const std::string& expected) {
  return InvalidArgument("emulated backend: option '" + name + "' must be " + expected);
}

}  // namespace

StatusOr<xla_passes::DeviceSpec> PresetOfSpec(std::string_view spec) {
  std::string_view name = spec.substr(std::min(spec.size(), std::strlen(kBackendPrefix)));
  auto preset = xla_passes::FindDevice(name);
  if (name.empty() || !preset.ok() || preset->name == "cpu" || !(preset->memory_bytes > 0)) {
    return InvalidArgument("FlexNPU backend '" + std::string(spec) + "': unknown preset '" +
                           std::string(name) + "' (known: " + KnownPresets() +
                           "; '910b'/'910c' also name the Ascend ones)");
  }
  return preset;
}

StatusOr<Config> ParseConfig(const xla_passes::DeviceSpec& preset,
                             const PJRT_NamedValue* options, size_t num_options) {
  Config config;
  config.preset = preset;
  auto device_link = xla_passes::FindLink(preset.link);
  auto host_link = xla_passes::FindLink(kHostLink);
  if (!device_link.ok() || !host_link.ok()) {
    return Internal("emulated backend: preset '" + preset.name + "' names link '" + preset.link +
                    "', which the link table lacks");
  }
  config.device_link = *device_link;
  config.host_link = *host_link;
  if (const char* path = std::getenv("FLEXNPU_CPU_PLUGIN_PATH")) config.cpu_plugin_path = path;
  std::string unknown;
  for (size_t i = 0; i < num_options; ++i) {
    const PJRT_NamedValue& o = options[i];
    const std::string name(o.name, o.name_size);
    if (name == "device_count") {
      if (o.type != PJRT_NamedValue_kInt64 || o.int64_value < 1 ||
          o.int64_value > kMaxDeviceCount) {
        return BadValue(name, "an integer from 1 to " + std::to_string(kMaxDeviceCount));
      }
      config.device_count = o.int64_value;
    } else if (name == "time_scale") {
      double v = -1;
      if (o.type == PJRT_NamedValue_kInt64) v = static_cast<double>(o.int64_value);
      if (o.type == PJRT_NamedValue_kFloat) v = o.float_value;
      if (!(v > 0) || !std::isfinite(v)) return BadValue(name, "a number > 0, e.g. time_scale=10");
      config.time_scale = v;
    } else if (name == "co_run") {
      if (o.type == PJRT_NamedValue_kBool) {
        config.co_run = o.bool_value;
      } else if (o.type == PJRT_NamedValue_kInt64 && (o.int64_value == 0 || o.int64_value == 1)) {
        config.co_run = o.int64_value == 1;
      } else {
        return BadValue(name, "true or false");
      }
    } else if (name == "cpu_plugin_path") {
      if (o.type != PJRT_NamedValue_kString) return BadValue(name, "a path");
      config.cpu_plugin_path.assign(o.string_value, o.value_size);
    } else {
      unknown += (unknown.empty() ? "'" : ", '") + name + "'";
    }
  }
  if (!unknown.empty()) {
    return InvalidArgument("emulated backend: unknown option(s) " + unknown +
                           " (known: device_count, time_scale, co_run, cpu_plugin_path)");
  }
  if (config.cpu_plugin_path.empty()) {
    return InvalidArgument(
        "emulated backend: no XLA CPU plugin to compile programs with: set create option "
        "cpu_plugin_path or FLEXNPU_CPU_PLUGIN_PATH (the flexnpu Python package sets it)");
  }
  return config;
}

}  // namespace flexnpu::emulated
