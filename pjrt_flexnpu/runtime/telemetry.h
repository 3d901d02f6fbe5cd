// The runtime's side of the hardware layer: the telemetry source the `telemetry` option asks
// for, the binding of each physical PJRT device to the vendor library's device with the same
// local hardware id (ACL logical id / CUDA ordinal), and the sampler that feeds the placer.
#ifndef FLEXNPU_RUNTIME_TELEMETRY_H_
#define FLEXNPU_RUNTIME_TELEMETRY_H_

#include <memory>
#include <string>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/hardware/hardware.h"
#include "pjrt_flexnpu/placement/placement.h"
#include "pjrt_flexnpu/runtime/options.h"
#include "pjrt_flexnpu/runtime/trace.h"

namespace flexnpu {

class PhysicalTelemetry {
 public:
  // Opens the source (options.telemetry, ascendcl_library, nvml_library), reads each device
  // once and binds the physical devices to it (a CPU backend's only with an explicit source).
  // An explicit source that fails is an error naming library and call; `auto` without a
  // usable library gives an object with no source (one log line on stderr when a library was
  // there but failed).
  static StatusOr<std::unique_ptr<PhysicalTelemetry>> Open(
      const Options& options, const PhysicalBackend& backend,
      const std::vector<PJRT_Device*>& devices, const std::vector<int64_t>& pjrt_ids,
      const std::string& backend_platform);
  ~PhysicalTelemetry();

  // Roofline preset of physical device p by its SoC / GPU name; "" when unknown or unbound.
  std::string PresetOf(int p) const;
  // Memory of physical device p as the vendor library reported it at discovery; 0 when unknown.
  int64_t MemoryTotalOf(int p) const;
  // Samples every options.telemetry_period_ms on a background thread into `core`
  // (UpdateTelemetry for each bound physical device) and, while it records, `trace`
  // (counters). No-op without a source.
  Status Start(std::shared_ptr<placement::Core> core, std::shared_ptr<Trace> trace);
  // {"source", "library", "fallback", "period_ms", "rounds", "errors", "last_error",
  //  "devices": [{index, physical_index, source, name, preset, memory_total_bytes,
  //  memory_free_bytes, utilization: {compute, memory}, pjrt_device}]}
  std::string Json() const;

 private:
  PhysicalTelemetry() = default;

  std::string mode_;
  std::string fallback_;
  int64_t period_ms_ = 0;
  std::shared_ptr<hardware::TelemetrySource> source_;
  std::vector<hardware::DeviceInfo> infos_;  // by source index
  std::vector<int> physical_of_index_;      // source index -> FlexNPU physical device, -1
  std::vector<int> index_of_physical_;      // FlexNPU physical device -> source index, -1
  std::vector<int64_t> pjrt_ids_;           // FlexNPU physical device -> backend device id
  std::unique_ptr<hardware::TelemetrySampler> sampler_;
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_TELEMETRY_H_
