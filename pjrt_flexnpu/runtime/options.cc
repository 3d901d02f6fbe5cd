#include "pjrt_flexnpu/runtime/options.h"

#include <cerrno>
#include <cstdlib>
#include <string_view>

#include "pjrt_flexnpu/backend/factory.h"
#include "pjrt_flexnpu/hardware/hardware.h"

namespace flexnpu {
namespace {

constexpr const char* kKnownOptions =
    "allow_newer_backend, backend, backend_options, cpu_plugin_path, decode_devices, "
    "num_virtual_devices, policy, prefill_devices, share_compiles, single_device_compile, "
    "telemetry, telemetry_period_ms, ascendcl_library, nvml_library, tenant, platform_name";

std::string Trim(std::string_view s) {
  const auto begin = s.find_first_not_of(" \t\n");
  if (begin == std::string_view::npos) return "";
  const auto end = s.find_last_not_of(" \t\n");
  return std::string(s.substr(begin, end - begin + 1));
}

std::optional<int64_t> ParseInt(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const long long v = std::strtoll(text.c_str(), &end, 10);
  if (errno != 0 || end != text.c_str() + text.size()) return std::nullopt;
  return static_cast<int64_t>(v);
}

std::optional<double> ParseDouble(const std::string& text) {
  if (text.empty()) return std::nullopt;
  errno = 0;
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (errno != 0 || end != text.c_str() + text.size()) return std::nullopt;
  return v;
}

OptionValue TypedValue(const std::string& text) {
  if (text == "true" || text == "True") return true;
  if (text == "false" || text == "False") return false;
  if (auto i = ParseInt(text)) return *i;
  if (auto d = ParseDouble(text)) return *d;
  return text;
}

StatusOr<std::string> AsString(const NamedOption& option) {
  if (const auto* s = std::get_if<std::string>(&option.value)) return *s;
  return InvalidArgument("FlexNPU option '" + option.name + "' must be a string");
}

StatusOr<bool> AsBool(const NamedOption& option) {
  if (const auto* b = std::get_if<bool>(&option.value)) return *b;
  if (const auto* i = std::get_if<int64_t>(&option.value)) {
    if (*i == 0 || *i == 1) return *i == 1;
  }
  if (const auto* s = std::get_if<std::string>(&option.value)) {
    const std::string v = Trim(*s);
    if (v == "1" || v == "true" || v == "True") return true;
    if (v == "0" || v == "false" || v == "False" || v.empty()) return false;
  }
  return InvalidArgument("FlexNPU option '" + option.name + "' must be a boolean (true/false)");
}

StatusOr<int64_t> AsInt(const NamedOption& option) {
  if (const auto* i = std::get_if<int64_t>(&option.value)) return *i;
  if (const auto* s = std::get_if<std::string>(&option.value)) {
    if (auto i = ParseInt(Trim(*s))) return *i;
    return InvalidArgument("FlexNPU option '" + option.name + "' must be an integer, got '" + *s +
                           "'");
  }
  return InvalidArgument("FlexNPU option '" + option.name + "' must be an integer");
}

}  // namespace

EnvLookup ProcessEnv() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

StatusOr<std::vector<NamedOption>> ParseBackendOptions(const std::string& text) {
  std::vector<NamedOption> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find_first_of(";,", start);
    if (end == std::string::npos) end = text.size();
    const std::string item = Trim(std::string_view(text).substr(start, end - start));
    start = end + 1;
    if (item.empty()) continue;
    const size_t sep = item.find_first_of("=:");
    if (sep == std::string::npos || sep == 0) {
      return InvalidArgument("malformed backend option '" + item +
                             "': expected key=value (pairs separated by ';' or ',')");
    }
    const std::string key = Trim(std::string_view(item).substr(0, sep));
    const std::string value = Trim(std::string_view(item).substr(sep + 1));
    for (const auto& existing : out) {
      if (existing.name == key) return InvalidArgument("backend option '" + key + "' given twice");
    }
    out.push_back({key, TypedValue(value)});
  }
  return out;
}

StatusOr<Options> ParseOptions(const std::vector<NamedOption>& create_options,
                               const EnvLookup& env) {
  // Environment first, then explicit options override.
  std::vector<NamedOption> merged;
  const std::pair<const char*, const char*> env_names[] = {
      {"backend", "FLEXNPU_BACKEND"},
      {"backend_options", "FLEXNPU_BACKEND_OPTIONS"},
      {"cpu_plugin_path", "FLEXNPU_CPU_PLUGIN_PATH"},
      {"num_virtual_devices", "FLEXNPU_NUM_VIRTUAL_DEVICES"},
      {"policy", "FLEXNPU_POLICY"},
      {"single_device_compile", "FLEXNPU_SINGLE_DEVICE_COMPILE"},
      {"share_compiles", "FLEXNPU_SHARE_COMPILES"},
      {"prefill_devices", "FLEXNPU_PREFILL_DEVICES"},
      {"decode_devices", "FLEXNPU_DECODE_DEVICES"},
      {"telemetry", "FLEXNPU_TELEMETRY"},
      {"telemetry_period_ms", "FLEXNPU_TELEMETRY_PERIOD_MS"},
      {"ascendcl_library", "FLEXNPU_ASCENDCL_LIBRARY"},
      {"nvml_library", "FLEXNPU_NVML_LIBRARY"},
      {"allow_newer_backend", "FLEXNPU_ALLOW_NEWER_BACKEND"},
      {"tenant", "FLEXNPU_TENANT"},
      {"platform_name", "FLEXNPU_PLATFORM_NAME"},
  };
  for (const auto& [name, env_name] : env_names) {
    if (auto v = env(env_name)) merged.push_back({name, *v});
  }
  for (const auto& option : create_options) {
    bool replaced = false;
    for (auto& m : merged) {
      if (m.name == option.name) {
        m.value = option.value;
        replaced = true;
      }
    }
    if (!replaced) merged.push_back(option);
  }

  Options options;
  for (const auto& option : merged) {
    if (option.name == "backend") {
      auto v = AsString(option);
      if (!v.ok()) return v.status();
      options.backend = Trim(*v);
      if (options.backend.empty()) return InvalidArgument("FlexNPU option 'backend' is empty");
    } else if (option.name == "cpu_plugin_path") {
      auto v = AsString(option);
      if (!v.ok()) return v.status();
      options.cpu_plugin_path = *v;
    } else if (option.name == "backend_options") {
      auto v = AsString(option);
      if (!v.ok()) return v.status();
      auto parsed = ParseBackendOptions(*v);
      if (!parsed.ok()) return parsed.status();
      options.backend_options = std::move(*parsed);
    } else if (option.name == "num_virtual_devices") {
      auto v = AsInt(option);
      if (!v.ok()) return v.status();
      if (*v < 1 || *v > 65536) {
        return InvalidArgument("FlexNPU option 'num_virtual_devices' must be in [1, 65536], got " +
                               std::to_string(*v));
      }
      options.num_virtual_devices = static_cast<int>(*v);
    } else if (option.name == "policy") {
      // Validated by the placement core, which knows the physical device count.
      auto v = AsString(option);
      if (!v.ok()) return v.status();
      options.policy = Trim(*v);
    } else if (option.name == "prefill_devices" || option.name == "decode_devices") {
      auto v = AsString(option);
      if (!v.ok()) return v.status();
      (option.name == "prefill_devices" ? options.prefill_devices : options.decode_devices) =
          Trim(*v);
    } else if (option.name == "single_device_compile") {
      auto v = AsString(option);
      if (!v.ok()) return v.status();
      if (*v != "pinned" && *v != "portable" && *v != "auto") {
        return InvalidArgument("FlexNPU option 'single_device_compile' must be 'auto', 'pinned' "
                               "or 'portable', got '" + *v + "'");
      }
      options.single_device_compile = *v;
    } else if (option.name == "share_compiles") {
      auto v = AsBool(option);
      if (!v.ok()) return v.status();
      options.share_compiles = *v;
    } else if (option.name == "allow_newer_backend") {
      auto v = AsBool(option);
      if (!v.ok()) return v.status();
      options.allow_newer_backend = *v;
    } else if (option.name == "telemetry") {
      auto v = AsString(option);
      if (!v.ok()) return v.status();
      auto mode = hardware::ParseTelemetryMode(*v);
      if (!mode.ok()) return InvalidArgument("FlexNPU option 'telemetry': " + mode.status().message());
      options.telemetry = Trim(*v);
    } else if (option.name == "telemetry_period_ms") {
      auto v = AsInt(option);
      if (!v.ok()) return v.status();
      if (*v < 1 || *v > 3'600'000) {
        return InvalidArgument("FlexNPU option 'telemetry_period_ms' must be in [1, 3600000], got " +
                               std::to_string(*v));
      }
      options.telemetry_period_ms = *v;
    } else if (option.name == "platform_name") {
      auto v = AsString(option);
      if (!v.ok()) return v.status();
      options.platform_name = Trim(*v);
      if (options.platform_name.empty()) options.platform_name = "flexnpu";
    } else if (option.name == "tenant") {
      auto v = AsString(option);
      if (!v.ok()) return v.status();
      options.tenant = Trim(*v);
    } else if (option.name == "ascendcl_library" || option.name == "nvml_library") {
      auto v = AsString(option);
      if (!v.ok()) return v.status();
      (option.name == "ascendcl_library" ? options.ascendcl_library : options.nvml_library) =
          Trim(*v);
    } else {
      return InvalidArgument("unknown FlexNPU create option '" + option.name +
                             "' (known: " + kKnownOptions +
                             "; options for the physical backend go in backend_options)");
    }
  }
  return options;
}

StatusOr<std::string> BackendPath(const Options& options) {
  if (options.backend != "cpu") return options.backend;
  if (options.cpu_plugin_path.empty()) {
    return InvalidArgument(
        "backend 'cpu' needs the path of the xla-cpu-pjrt plugin: the flexnpu Python package "
        "passes it as create option 'cpu_plugin_path'; set it or FLEXNPU_CPU_PLUGIN_PATH");
  }
  return options.cpu_plugin_path;
}

std::string EffectivePolicy(const Options& options) {
  if (options.prefill_devices.empty() && options.decode_devices.empty()) return options.policy;
  std::string policy = options.policy;
  policy += policy.find(':') == std::string::npos ? ":" : "|";
  if (!options.prefill_devices.empty()) policy += "prefill=" + options.prefill_devices;
  if (!options.prefill_devices.empty() && !options.decode_devices.empty()) policy += "|";
  if (!options.decode_devices.empty()) policy += "decode=" + options.decode_devices;
  return policy;
}

std::vector<NamedOption> EffectiveBackendOptions(const Options& options) {
  std::vector<NamedOption> out = options.backend_options;
  if (options.backend == "cpu") {
    bool has_count = false;
    for (const auto& o : out) has_count |= (o.name == "cpu_device_count");
    if (!has_count) out.push_back({"cpu_device_count", kDefaultCpuDeviceCount});
  }
  if (!options.cpu_plugin_path.empty() &&
      BackendKindOf(options.backend) == BackendKind::kEmulated) {
    // The emulated backend compiles with the CPU plugin FlexNPU was given.
    bool has_path = false;
    for (const auto& o : out) has_path |= (o.name == "cpu_plugin_path");
    if (!has_path) out.push_back({"cpu_plugin_path", options.cpu_plugin_path});
  }
  if (!options.tenant.empty() && BackendKindOf(options.backend) == BackendKind::kDaemon) {
    bool has_tenant = false;
    for (const auto& o : out) has_tenant |= (o.name == "tenant");
    if (!has_tenant) out.push_back({"tenant", options.tenant});
  }
  return out;
}

}  // namespace flexnpu
