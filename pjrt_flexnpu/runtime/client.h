// The virtual client: owns the inner (physical) client, the virtual devices and memories
// JAX sees, and the placer that maps one onto the other.
#ifndef FLEXNPU_RUNTIME_CLIENT_H_
#define FLEXNPU_RUNTIME_CLIENT_H_

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/sharded_counter.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/runtime/buffer.h"
#include "pjrt_flexnpu/runtime/compile_cache.h"
#include "pjrt_flexnpu/runtime/device.h"
#include "pjrt_flexnpu/runtime/handles.h"
#include "pjrt_flexnpu/runtime/options.h"
#include "pjrt_flexnpu/runtime/placer.h"
#include "pjrt_flexnpu/runtime/telemetry.h"
#include "pjrt_flexnpu/runtime/trace.h"
#include "xla_passes/roofline.h"

namespace flexnpu {

class VirtualLoadedExecutable;

struct PhysicalDevice {
  PJRT_Device* device = nullptr;
  int64_t id = 0;  // the backend's global device id (used in device assignments)
  std::string kind;  // the backend's device kind: programs compiled for one kind are shared
  std::vector<PJRT_Memory*> memory_by_kind;  // by the client's memory-kind index
  // Memory the device has: its own stats, else telemetry, else (CPU devices) its share of the
  // host's RAM; 0: unknown.
  int64_t bytes_limit = 0;
};

// Counters of what FlexNPU did, for observability (lock-free).
struct ClientCounters {
  ShardedCounter executions;  // bumped by every execution, on every thread
  std::atomic<int64_t> migrations{0};
  std::atomic<int64_t> bytes_migrated{0};
  std::atomic<int64_t> compiles{0};
  // Per physical mapping: compiled by the backend, or loaded from a serialized executable.
  std::atomic<int64_t> backend_compiles{0};
  std::atomic<int64_t> backend_loads{0};
  // Per physical mapping: loaded from the compile of the same program for other devices of the
  // same kinds (SharedCompiles) instead of compiled.
  std::atomic<int64_t> shared_loads{0};
};

class VirtualClient : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kClient;
  static StatusOr<std::unique_ptr<VirtualClient>> Create(const Options& options);
  ~VirtualClient();

  const PhysicalBackend& backend() const { return *backend_; }
  const std::shared_ptr<const PhysicalBackend>& shared_backend() const { return backend_; }
  PJRT_Client* inner() const { return inner_.get(); }
  const Options& options() const { return options_; }
  const std::string& platform_version() const { return platform_version_; }
  const std::string& backend_platform() const { return backend_platform_; }
  // The platform name JAX sees: "flexnpu", or the physical platform's (option platform_name).
  const std::string& platform_name() const { return options_.platform_name; }
  // Whether the virtual devices present the physical platform's name and device kinds.
  bool presents_physical() const { return options_.platform_name != "flexnpu"; }
  Placer& placer() { return *placer_; }
  // The roofline executables are profiled against (the physical devices' preset).
  const xla_passes::DeviceSpec& roofline() const { return roofline_; }
  ClientCounters& counters() { return counters_; }
  SharedCompiles& shared_compiles() { return shared_compiles_; }
  // Completion callbacks hold the trace: they may run after the client is gone.
  const std::shared_ptr<Trace>& trace() const { return trace_; }

  int num_physical() const { return static_cast<int>(physical_.size()); }
  const PhysicalDevice& physical(int index) const { return physical_[index]; }
  // The physical memory of `kind_index` on `physical_device`, or nullptr.
  PJRT_Memory* PhysicalMemory(int physical_device, int kind_index) const {
    return physical_[physical_device].memory_by_kind[kind_index];
  }
  // The memory-kind index of an inner memory, or -1.
  int KindIndexOf(PJRT_Memory* physical_memory) const;

  int num_devices() const { return static_cast<int>(devices_.size()); }
  VirtualDevice* device(int64_t index) const {
    return index >= 0 && index < num_devices() ? devices_[index].get() : nullptr;
  }
  const std::vector<PJRT_Device*>& device_handles() const { return device_handles_; }
  const std::vector<PJRT_Memory*>& memory_handles() const { return memory_handles_; }
  Topology* topology() { return &topology_; }

  StatusOr<VirtualBuffer*> BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* args,
                                                VirtualMemory* memory);
  StatusOr<VirtualBuffer*> CopyBuffer(VirtualBuffer* source, VirtualMemory* destination);
  StatusOr<VirtualLoadedExecutable*> Compile(const PJRT_Program* program,
                                             std::string_view compile_options);
  Status DefaultDeviceAssignment(int num_replicas, int num_partitions, int* out) const;

  // Per physical and virtual device state as JSON, for `flexnpu stats` and tests.
  std::string StatsJson() const;

 private:
  explicit VirtualClient(Options options) : Tagged(kTag), options_(std::move(options)),
                                            topology_(this) {}
  Status Init();
  void AssignPhysicalMemory();
  void ShareMemoryAmongVirtualDevices();

  Options options_;
  std::shared_ptr<const PhysicalBackend> backend_;
  InnerClient inner_;
  std::string backend_platform_;
  std::string platform_version_;
  std::vector<PhysicalDevice> physical_;
  std::unordered_map<PJRT_Memory*, int> kind_index_of_memory_;
  std::vector<std::unique_ptr<VirtualDevice>> devices_;
  std::vector<std::unique_ptr<VirtualMemory>> memories_;
  std::vector<PJRT_Device*> device_handles_;
  std::vector<PJRT_Memory*> memory_handles_;
  Topology topology_;
  xla_passes::DeviceSpec roofline_;
  std::unique_ptr<Placer> placer_;
  // After placer_: destroyed first, stopping the sampler that feeds the placer.
  std::unique_ptr<PhysicalTelemetry> telemetry_;
  ClientCounters counters_;
  SharedCompiles shared_compiles_;
  std::shared_ptr<Trace> trace_ = std::make_shared<Trace>();
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_CLIENT_H_
