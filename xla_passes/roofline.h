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
  // What a device of this kind has and how fast programs really run on it: the one table
  // the simulator (python/flexnpu/sim/hardware.py) and the emulated backend
  // (pjrt_flexnpu/backend/emulated/) both read. 0: not modelled (the "cpu" preset's
  // efficiencies come from a calibration file instead).
  double memory_bytes = 0;     // device memory (HBM)
  std::string link;            // the device-to-device link: a name in Links()
  double eff_compute = 1;      // achieved / peak FLOP/s on serving steps (fitted)
  double eff_memory = 1;       // achieved / peak bandwidth on serving steps (fitted)
  std::string efficiency_source = "uncalibrated (roofline)";

  double ridge() const { return mem_bandwidth > 0 ? peak_flops / mem_bandwidth : 0; }
};

// A link between devices: one direction, per device.
struct LinkSpec {
  std::string name;
  double bytes_per_s = 0;
  double latency_s = 0;
  std::string source;
};

const std::vector<LinkSpec>& Links();
StatusOr<LinkSpec> FindLink(std::string_view name);

// The modelled duration of a program of `flops` and `bytes` on one device of `device`:
// max(flops / (peak * eff_compute), bytes / (bandwidth * eff_memory)) + launch_s, launch_s
// being device.small_work_s. The simulator's step time and the emulated backend's execution
// time are this function.
double ModelledSeconds(const DeviceSpec& device, double flops, double bytes);
// Time to move `bytes` over `link`.
double TransferSeconds(const LinkSpec& link, double bytes);

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

// Built-in presets; names are lower case ("ascend910b", "ascend910c", "h100", "h200", "a100",
// "cpu"). FindDevice also takes "910b"/"910c" and ignores case, '-', '_' and spaces.
const std::vector<DeviceSpec>& DevicePresets();
StatusOr<DeviceSpec> FindDevice(std::string_view name);
StatusOr<Classification> Classify(const ExecutableProfile& profile, const DeviceSpec& device);

}  // namespace flexnpu::xla_passes

#endif  // FLEXNPU_XLA_PASSES_ROOFLINE_H_
