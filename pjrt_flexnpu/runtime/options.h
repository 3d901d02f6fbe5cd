// FlexNPU configuration: PJRT create options with FLEXNPU_* environment fallback.
#ifndef FLEXNPU_RUNTIME_OPTIONS_H_
#define FLEXNPU_RUNTIME_OPTIONS_H_

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "pjrt_flexnpu/base/status.h"

namespace flexnpu {

using OptionValue = std::variant<std::string, int64_t, double, bool>;

struct NamedOption {
  std::string name;
  OptionValue value;
};

struct Options {
  // "cpu" (the xla-cpu-pjrt plugin) or a path to any PJRT plugin library.
  std::string backend = "cpu";
  // Where the xla-cpu-pjrt plugin lives; the Python package fills it in.
  std::string cpu_plugin_path;
  // Options for the physical backend's client, already typed.
  std::vector<NamedOption> backend_options;
  // 0: one virtual device per physical device.
  int num_virtual_devices = 0;
  // Placement policy, in the placement core's syntax (placement/placement.h), e.g.
  // "dynamic" or "static-pd:prefill=0,1|decode=2,3".
  std::string policy = "passthrough";
  // Pools for "static-pd" given as separate options ("0,1"): JAX's option string cannot
  // carry the ':' of the one-string form.
  std::string prefill_devices;
  std::string decode_devices;
  // How single-device programs are compiled: "pinned" (for the physical device that runs
  // them, one compile per device used, cached), "portable" (one compile that runs on any
  // physical device; the CPU plugin's portable execute path costs ~3-8 us more per call) or
  // "auto" (as "pinned"; under a placing policy, should the pinned compile for a device fail,
  // one portable compile, made on that first need, runs executions placed there instead).
  std::string single_device_compile = "auto";
  // A program compiled for some physical devices is loaded (deserialized with the device
  // assignment rewritten) onto other devices of the same kinds instead of compiled again.
  bool share_compiles = true;
  // Telemetry of the physical devices (pjrt_flexnpu/hardware): "auto" (AscendCL when its
  // library loads; NVML when the backend is CUDA and NVML loads; else none), "ascendcl",
  // "nvml" or "none". An explicit source that fails is an error naming library and call.
  std::string telemetry = "auto";
  // "": $ASCEND_HOME_PATH/lib64, $ASCEND_TOOLKIT_HOME/lib64, then the loader path.
  std::string ascendcl_library;
  std::string nvml_library;  // "": libnvidia-ml.so.1 through the loader
  // How often the background thread reads memory and utilisation.
  int64_t telemetry_period_ms = 500;
  // Accept a physical backend whose PJRT C API minor version is newer than FlexNPU's header.
  // Off by default: FlexNPU passes its own (smaller) struct sizes, and a newer plugin that
  // writes newer output fields without checking struct_size would write past them.
  bool allow_newer_backend = false;
  // The platform name JAX sees: "flexnpu", or the physical backend's own ("cpu", "cuda", ...),
  // for frameworks that only know those (the client checks it names the physical platform).
  std::string platform_name = "flexnpu";
  // The tenant this process names itself to a FlexNPU daemon (backend=daemon:PATH); ignored
  // by other backends. FLEXNPU_TENANT is the environment form.
  std::string tenant;
};

// The physical backend library `options` name, or an error saying which option to set.
StatusOr<std::string> BackendPath(const Options& options);

// Looks up an environment variable; returns nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const char*)>;
EnvLookup ProcessEnv();

// Parses create options (explicit options win over the environment). Unknown option names
// and malformed values are errors that name the offending option.
StatusOr<Options> ParseOptions(const std::vector<NamedOption>& create_options,
                               const EnvLookup& env);

// Parses "k=v;k2=v2" (also "k:v" pairs and "," separators) into typed values:
// true/false -> bool, integers -> int64, other numbers -> double, the rest strings.
StatusOr<std::vector<NamedOption>> ParseBackendOptions(const std::string& text);

// The physical backend's create options: the user's, plus FlexNPU's default of 4 CPU
// devices when the backend is the CPU plugin and no cpu_device_count was given, plus the
// tenant when the backend is a FlexNPU daemon (its remote Client_Create reads it), plus
// cpu_plugin_path when the backend is emulated (its compiler).
std::vector<NamedOption> EffectiveBackendOptions(const Options& options);

inline constexpr int64_t kDefaultCpuDeviceCount = 4;

// The policy string for the placement core: `policy` with the separate pool options folded in.
std::string EffectivePolicy(const Options& options);

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_OPTIONS_H_
