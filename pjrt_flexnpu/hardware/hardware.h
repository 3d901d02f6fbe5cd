// FlexNPU hardware layer: the physical accelerators as their vendor libraries see them.
//
// Discovery, binding and telemetry of Ascend NPUs through AscendCL (libascendcl.so, optional
// DCMI libdcmi.so for utilisation where ACL has none) and of NVIDIA GPUs through NVML
// (libnvidia-ml.so.1; CUDA ordinals matched to NVML devices by PCI bus id through libcuda).
// Every vendor library is loaded with dlopen at run time: FlexNPU builds and runs without them,
// and no vendor header is needed (the few types and functions used are declared here with the
// vendors' names and signatures). No PJRT types: the runtime maps PJRT devices onto `index`.
//
// Telemetry is read by TelemetrySampler on its own thread at a configurable period; callers on
// a dispatch path only read the latest sample (a copy under a short lock).
//
// Errors name the library (and the path it was loaded from), the call that failed, the
// library's error code and its own message (aclGetRecentErrMsg / nvmlErrorString).
#ifndef FLEXNPU_HARDWARE_HARDWARE_H_
#define FLEXNPU_HARDWARE_HARDWARE_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::hardware {

enum class SourceKind : uint8_t { kNone = 0, kAscendCl, kNvml };
const char* SourceKindName(SourceKind kind);  // "none", "ascendcl", "nvml"

// What the `telemetry` option asks for.
enum class TelemetryMode : uint8_t { kAuto = 0, kAscendCl, kNvml, kNone };
// "auto" | "ascendcl" | "nvml" | "none" (case-insensitive); InvalidArgument otherwise.
StatusOr<TelemetryMode> ParseTelemetryMode(std::string_view text);

// Percentages 0..100; kUnsupported where the library cannot say (ACL's -1, NVML's
// NOT_SUPPORTED, or a library without the call).
inline constexpr int kUnsupported = -1;
struct Utilization {
  int compute = kUnsupported;  // ACL: max(cube, vector) (else DCMI AI core); NVML: gpu
  int cube = kUnsupported;     // ACL only
  int vector = kUnsupported;   // ACL only
  int memory = kUnsupported;   // ACL: memoryUtilization; NVML: memory (controller busy)
};

// One reading of a device. -1: unknown.
struct Sample {
  int index = 0;
  int64_t memory_total_bytes = -1;
  int64_t memory_free_bytes = -1;
  Utilization utilization;
};

// A physical device: what does not change, plus the reading taken while discovering.
struct DeviceInfo {
  // The runtime's id: AscendCL logical device id (after ASCEND_RT_VISIBLE_DEVICES) or CUDA
  // ordinal; what PJRT plugins report as the device's local hardware id.
  int index = 0;
  // The management tools' id: the physical NPU id (npu-smi, DCMI logic id) or the NVML index
  // (nvidia-smi). -1 when unknown.
  int physical_index = -1;
  SourceKind source = SourceKind::kNone;
  std::string name;        // SoC name ("Ascend910B2") or GPU name ("NVIDIA H200")
  std::string preset;      // roofline preset (PresetForName); "" when unknown
  std::string pci_bus_id;  // NVML; "" when unknown
  int64_t ai_cores = -1;   // AscendCL
  Sample sample;
};

// Roofline preset of a SoC or GPU name, "" when none matches (one table for every source):
// Ascend910B1..B4 -> ascend910b, Ascend910_93xx -> ascend910c, *H100* -> h100, *H200* -> h200,
// *A100* -> a100. Case-insensitive.
std::string PresetForName(std::string_view name);

// Environment lookup (injectable for tests); nullopt when unset.
using EnvLookup = std::function<std::optional<std::string>(const char*)>;
EnvLookup ProcessEnvironment();

// ASCEND_RT_VISIBLE_DEVICES ("0,2,3"): logical id i is physical id list[i]. Empty text: all
// devices, identity. InvalidArgument for a malformed list (naming the variable).
StatusOr<std::vector<int>> ParseVisibleDevices(std::string_view text);

struct SourceOptions {
  TelemetryMode mode = TelemetryMode::kAuto;
  // Library paths; "" = the default search described at each field.
  std::string ascendcl_library;  // $ASCEND_HOME_PATH/lib64, $ASCEND_TOOLKIT_HOME/lib64, loader
  std::string dcmi_library;      // "libdcmi.so" through the loader; optional, failure ignored
  std::string nvml_library;      // "libnvidia-ml.so.1"
  std::string cuda_library;      // "libcuda.so.1": CUDA ordinal -> PCI bus id
  // The backend runs on CUDA: `auto` tries NVML (only) then.
  bool backend_is_cuda = false;
  EnvLookup env = ProcessEnvironment();
};

// One vendor library, opened and initialised (aclInit / nvmlInit_v2); finalised by the
// destructor, which also undoes every Bind. Thread-safe.
class TelemetrySource {
 public:
  virtual ~TelemetrySource() = default;
  virtual SourceKind kind() const = 0;
  // The library as loaded ("libascendcl.so at /usr/local/Ascend/.../libascendcl.so").
  virtual std::string library() const = 0;
  virtual int device_count() const = 0;
  // Name, preset, ids and a first reading. InvalidArgument for an index out of range.
  virtual StatusOr<DeviceInfo> Describe(int index) = 0;
  // A reading: memory and utilisation (ACL: aclrtSetDevice + aclrtGetMemInfo(ACL_HBM_MEM) +
  // aclrtResetDevice on the calling thread, so call it from the sampler thread).
  virtual StatusOr<Sample> Read(int index) = 0;
  // Binding: ACL aclrtSetDevice(index), held until Unbind or destruction (then
  // aclrtResetDevice); NVML has nothing to bind (OK). Binding twice is a no-op.
  virtual Status Bind(int index) = 0;
  virtual Status Unbind(int index) = 0;
  virtual bool bound(int index) const = 0;
  // Where a field cannot be read (older library, DCMI missing...): one line each, for logs.
  virtual std::vector<std::string> notes() const = 0;
};

StatusOr<std::unique_ptr<TelemetrySource>> OpenAscendCl(const SourceOptions& options);
StatusOr<std::unique_ptr<TelemetrySource>> OpenNvml(const SourceOptions& options);

// What `options.mode` asks for. Explicit modes return the library's error when it fails.
// kAuto: AscendCL when it loads and sees devices; else NVML when backend_is_cuda and NVML
// loads; else no source (nullptr) with `fallback` set to one line saying why. kNone: nullptr.
struct OpenedSource {
  std::unique_ptr<TelemetrySource> source;  // nullptr: no telemetry
  std::string fallback;                     // auto only: why nothing (or what was skipped)
  // auto only: no vendor library could be loaded at all (a host without Ascend / NVIDIA
  // software: the ordinary case, not worth a log line).
  bool nothing_installed = false;
};
StatusOr<OpenedSource> OpenTelemetry(const SourceOptions& options);

// Reads every device of a source on a background thread, every `period`. The first round is
// read before Start returns (so a placer has numbers from the start). Readers get copies.
class TelemetrySampler {
 public:
  using Callback = std::function<void(const std::vector<Sample>&)>;
  // `callback` (optional) runs on the sampler thread after every round.
  static StatusOr<std::unique_ptr<TelemetrySampler>> Start(
      std::shared_ptr<TelemetrySource> source, std::chrono::milliseconds period,
      Callback callback = nullptr);
  ~TelemetrySampler();  // stops and joins the thread
  TelemetrySampler(const TelemetrySampler&) = delete;
  TelemetrySampler& operator=(const TelemetrySampler&) = delete;

  std::vector<Sample> Latest() const;
  uint64_t rounds() const;
  uint64_t errors() const;
  std::string last_error() const;  // "" when the last round was clean
  // Reads one round now on the sampler thread and waits for it (tests, CLI refresh).
  void RefreshNow();
  const std::shared_ptr<TelemetrySource>& source() const { return source_; }
  std::chrono::milliseconds period() const { return period_; }

 private:
  TelemetrySampler(std::shared_ptr<TelemetrySource> source, std::chrono::milliseconds period,
                   Callback callback);
  void Loop();
  void Round();

  std::shared_ptr<TelemetrySource> source_;
  std::chrono::milliseconds period_;
  Callback callback_;
  mutable std::mutex mu_;
  std::condition_variable wake_;
  std::condition_variable round_done_;
  bool stop_ = false;
  uint64_t refresh_requested_ = 0;
  uint64_t started_ = 0;  // rounds begun
  std::vector<Sample> latest_;
  uint64_t rounds_ = 0;
  uint64_t errors_ = 0;
  std::string last_error_;
  std::thread thread_;
};

}  // namespace flexnpu::hardware

#endif  // FLEXNPU_HARDWARE_HARDWARE_H_
