#include "xla_passes/roofline.h"

#include <algorithm>
#include <cctype>

namespace flexnpu::xla_passes {

namespace {
// Efficiencies fitted by python/flexnpu/sim/hardware.py (fit_cloudmatrix, fit_vidur) to
// published figures; tests/python/test_sim_presets.py re-runs the fits against these values.
constexpr double kCloudMatrixEffCompute = 0.7426306913097451;
constexpr double kCloudMatrixEffMemory = 0.5593750068426555;
constexpr double kVidurH100EffCompute = 0.6530876955935099;
constexpr double kVidurH100EffMemory = 0.6862392378893605;
}  // namespace

const std::vector<DeviceSpec>& DevicePresets() {
  // small_work_s: a heuristic floor of roughly a few kernel launches (~5 us each on GPUs and
  // NPUs, more on the CPU runtime); executables whose roofline time is below it are
  // latency-bound whatever their intensity.
  static const std::vector<DeviceSpec>* presets = new std::vector<DeviceSpec>{
      // Huawei Ascend 910B: 313 TFLOPS dense FP16/BF16 (Atlas 800T A2: 8 NPUs, ~2.5 PFLOPS
      // FP16 per server), 64 GB HBM2e at 1.6 TB/s. Public spec reports of the Atlas A2 line.
      {"ascend910b", 313e12, 1.6e12, 20e-6, true,
       "Huawei Atlas 800T A2 spec reports: 313 TFLOPS FP16/BF16 dense, HBM2e 1.6 TB/s", 64e9,
       "hccs", kCloudMatrixEffCompute, kCloudMatrixEffMemory,
       "fitted to CloudMatrix-Infer DeepSeek-R1 per-NPU prefill/decode throughput (910C); "
       "not measured on this device: the 910C fit is used"},
      // Huawei Ascend 910C: two 910B-class dies; 752 TFLOPS dense BF16 (2 x 376), 128 GB
      // HBM at 3.2 TB/s per chip (CloudMatrix384 paper, arXiv 2506.12708, Sec. 3.3).
      {"ascend910c", 752e12, 3.2e12, 20e-6, true,
       "CloudMatrix384 (arXiv 2506.12708): 2 dies x 376 TFLOPS BF16 dense, 3.2 TB/s HBM",
       128e9 /* unverified */, "hccs", kCloudMatrixEffCompute, kCloudMatrixEffMemory,
       "fitted to CloudMatrix-Infer DeepSeek-R1 per-NPU prefill/decode throughput (910C)"},
      // NVIDIA H100 SXM5: 989.4 TFLOPS dense BF16 (1979 with 2:4 sparsity), 80 GB HBM3 at
      // 3.35 TB/s (NVIDIA H100 Tensor Core GPU datasheet).
      {"h100", 989.4e12, 3.35e12, 20e-6, true,
       "NVIDIA H100 SXM datasheet: 989.4 TFLOPS BF16 dense, HBM3 3.35 TB/s", 80e9, "nvlink",
       kVidurH100EffCompute, kVidurH100EffMemory,
       "fitted to Vidur's measured Llama-2-7B operator profiles on H100"},
      // NVIDIA H200 SXM: same compute as H100 (989.4 TFLOPS dense BF16), 141 GB HBM3e at
      // 4.8 TB/s (NVIDIA H200 Tensor Core GPU datasheet).
      {"h200", 989.4e12, 4.8e12, 20e-6, true,
       "NVIDIA H200 SXM datasheet: 989.4 TFLOPS BF16 dense, HBM3e 4.8 TB/s", 141e9, "nvlink",
       kVidurH100EffCompute, kVidurH100EffMemory,
       "fitted to Vidur's measured Llama-2-7B operator profiles on H100; not measured on H200: "
       "the H100 fit is used"},
      // NVIDIA A100 SXM 80GB: 312 TFLOPS dense BF16, 2.039 TB/s HBM2e (A100 datasheet).
      {"a100", 312e12, 2.039e12, 20e-6, true,
       "NVIDIA A100 SXM 80GB datasheet: 312 TFLOPS BF16 dense, 2.039 TB/s HBM2e", 80e9,
       "nvlink", 0.6320172391073914, 0.6795911706320733,
       "fitted to Vidur's measured Llama-2-7B operator profiles on A100"},
      // This development machine (XLA:CPU backend): lscpu reports an AMD EPYC (Zen 3,
      // family 25) with 2 vCPUs at ~2.45 GHz (BogoMIPS / 2) and AVX2 with two FMA pipes:
      // 2 cores x 2.45e9 x 32 FP32 FLOP/cycle = 156.8 GFLOP/s. Bandwidth measured with a
      // 64 MiB numpy copy (2 x bytes / time): 9.0 GB/s. FP32 only: bf16 is emulated.
      {"cpu", 156.8e9, 9.0e9, 50e-6, false,
       "dev VM: AMD EPYC Zen 3, 2 vCPU x 2.45 GHz x 32 FP32 FLOP/cycle; 9 GB/s measured copy",
       4e9, "memcpy"},
  };
  return *presets;
}

const std::vector<LinkSpec>& Links() {
  static const std::vector<LinkSpec>* links = new std::vector<LinkSpec>{
      {"hccs", 392e9, 2e-6, "CloudMatrix384 UB: 392 GB/s unidirectional per NPU"},
      {"nvlink", 450e9, 2e-6, "NVLink 4: 900 GB/s bidirectional per GPU"},
      {"roce", 50e9, 10e-6, "RoCE 400 Gb/s per device"},
      {"pcie", 32e9, 5e-6, "PCIe 4.0 x16"},
      {"memcpy", 9e9, 1e-6, "this VM's measured copy bandwidth (cpu devices)"},
  };
  return *links;
}

StatusOr<LinkSpec> FindLink(std::string_view name) {
  for (const LinkSpec& l : Links()) {
    if (l.name == name) return l;
  }
  return InvalidArgument("unknown link '" + std::string(name) + "'");
}

double ModelledSeconds(const DeviceSpec& device, double flops, double bytes) {
  return std::max(flops / (device.peak_flops * device.eff_compute),
                  bytes / (device.mem_bandwidth * device.eff_memory)) +
         device.small_work_s;
}

double TransferSeconds(const LinkSpec& link, double bytes) {
  return bytes / link.bytes_per_s + link.latency_s;
}

StatusOr<DeviceSpec> FindDevice(std::string_view name) {
  std::string key;
  for (char ch : name) {
    if (ch == '-' || ch == '_' || ch == ' ') continue;
    key.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(ch))));
  }
  for (const DeviceSpec& d : DevicePresets()) {
    if (d.name == key || d.name == "ascend" + key) return d;
  }
  std::string known;
  for (const DeviceSpec& d : DevicePresets()) known += (known.empty() ? "" : ", ") + d.name;
  return InvalidArgument("unknown device '" + std::string(name) + "' (known: " +
                                   known + ")");
}

StatusOr<Classification> Classify(const ExecutableProfile& profile, const DeviceSpec& device) {
  if (!(device.peak_flops > 0) || !(device.mem_bandwidth > 0) || !(device.small_work_s >= 0)) {
    return InvalidArgument(
        "device '" + device.name +
        "' needs peak_flops > 0, mem_bandwidth > 0 and small_work_s >= 0");
  }
  Classification c;
  c.device = device.name;
  c.ridge = device.ridge();
  c.bytes = profile.bytes_accessed;
  c.flops = profile.flops;
  if (device.native_low_precision) {
    c.bytes = std::max(profile.bytes_accessed - profile.convert_overhead_bytes, 0.0);
    c.flops = std::max(profile.flops - profile.convert_overhead_flops, 0.0);
  }
  c.arithmetic_intensity = c.bytes > 0 ? c.flops / c.bytes : 0;
  c.compute_time_s = c.flops / device.peak_flops;
  c.memory_time_s = c.bytes / device.mem_bandwidth;
  c.roofline_time_s = std::max(c.compute_time_s, c.memory_time_s);
  c.ridge_ratio = c.ridge > 0 ? c.arithmetic_intensity / c.ridge : 0;
  if (c.roofline_time_s < device.small_work_s) {
    c.phase = Phase::kSmall;
  } else if (c.arithmetic_intensity >= c.ridge) {
    c.phase = Phase::kPrefill;
  } else {
    c.phase = Phase::kDecode;
  }
  return c;
}

}  // namespace flexnpu::xla_passes
