// What an emulated backend emulates: the preset named by its spec ("emulate:<preset>") and the
// client's create options (FLEXNPU_BACKEND_OPTIONS).
#ifndef FLEXNPU_BACKEND_EMULATED_CONFIG_H_
#define FLEXNPU_BACKEND_EMULATED_CONFIG_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/base/status.h"
#include "xla_passes/roofline.h"

namespace flexnpu::emulated {

// "emulate:<preset>" names an emulated accelerator of a device preset as the physical backend.
inline constexpr const char kBackendPrefix[] = "emulate:";
// The link host transfers take (BufferFromHostBuffer, ToHostBuffer): an accelerator's host
// interface, whatever the preset's device-to-device link.
inline constexpr const char kHostLink[] = "pcie";
inline constexpr int64_t kDefaultDeviceCount = 8;
inline constexpr int64_t kMaxDeviceCount = 1024;

struct Config {
  xla_passes::DeviceSpec preset;
  xla_passes::LinkSpec device_link;  // between emulated devices: the preset's
  xla_passes::LinkSpec host_link;    // to and from the host: kHostLink
  int64_t device_count = kDefaultDeviceCount;
  double time_scale = 1.0;           // every modelled duration takes time_scale x as long
  // Executions co-located on a device overlap as the placer's co-run model says
  // (base/co_run.h); otherwise (the default) a device runs them one after another.
  bool co_run = false;
  std::string cpu_plugin_path;       // the XLA CPU plugin that compiles (never runs) programs
};

// The preset `spec` ("emulate:910c") names, or an error listing the presets there are.
StatusOr<xla_passes::DeviceSpec> PresetOfSpec(std::string_view spec);

// The configuration of a client of `preset` from its create options: device_count (1..1024),
// time_scale (> 0), co_run (bool) and cpu_plugin_path (else FLEXNPU_CPU_PLUGIN_PATH). An unknown option or a
// malformed value is an INVALID_ARGUMENT naming it.
StatusOr<Config> ParseConfig(const xla_passes::DeviceSpec& preset,
                             const PJRT_NamedValue* options, size_t num_options);

}  // namespace flexnpu::emulated

#endif  // FLEXNPU_BACKEND_EMULATED_CONFIG_H_
