// Phase classification of an executable profile against a device roofline.
//
//   compute time  t_c = FLOPs / peak FLOP/s        memory time  t_m = bytes / bandwidth
//   ridge point   I*  = peak FLOP/s / bandwidth    (FLOPs per byte)
//
//   small    max(t_c, t_m) < device.small_work_s: too little work for either resource to
//            matter; launch latency dominates.
//   prefill  arithmetic intensity >= ridge: compute-bound.
//   decode   arithmetic intensity <  ridge: bandwidth-bound.
#ifndef FLEXNPU_XLA_PASSES_ROOFLINE_H_
#define FLEXNPU_XLA_PASSES_ROOFLINE_H_

#include <string>
#include <string_view>
#include <vector>

#include "pjrt_flexnpu/base/phase.h"
#include "xla_passes/analysis.h"

namespace flexnpu::xla_passes {

struct DeviceSpec {
  std::string name;
  double peak_flops = 0;      // dense FLOP/s at the serving precision (BF16 for accelerators)
  double mem_bandwidth = 0;   // bytes/s of device memory (HBM)
  double small_work_s = 0;    // below this roofline time an executable is latency-bound
  // True when the device computes in BF16/FP16 natively, so the convert kernels a CPU
  // compilation inserts to emulate narrow types (profile.convert_overhead_bytes) do not exist.
  bool native_low_precision = true;
  std::string source;         // where the numbers come from

  double ridge() const { return mem_bandwidth > 0 ? peak_flops / mem_bandwidth : 0; }
};

using ::flexnpu::Phase;
using ::flexnpu::PhaseName;

struct Classification {
  Phase phase = Phase::kSmall;
  std::string device;
  double ridge = 0;                 // FLOPs/byte
  double arithmetic_intensity = 0;  // of the bytes used below
  double flops = 0;                 // FLOPs counted for this device
  double bytes = 0;                 // bytes counted for this device
  double compute_time_s = 0;
  double memory_time_s = 0;
  double roofline_time_s = 0;       // max of the two
  // How far from the ridge: intensity / ridge (>1 compute-bound, <1 bandwidth-bound).
  double ridge_ratio = 0;
};

// Built-in presets; names are lower case ("ascend910b", "ascend910c", "h100", "h200", "cpu").
const std::vector<DeviceSpec>& DevicePresets();
StatusOr<DeviceSpec> FindDevice(std::string_view name);
StatusOr<Classification> Classify(const ExecutableProfile& profile, const DeviceSpec& device);

}  // namespace flexnpu::xla_passes

#endif  // FLEXNPU_XLA_PASSES_ROOFLINE_H_
