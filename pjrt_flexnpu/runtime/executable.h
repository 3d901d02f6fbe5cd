// Virtual executables. A program over N virtual devices is compiled for a mapping onto N
// distinct physical devices (the device assignment rewritten to physical ids), once per mapping
// the placer uses, cached. Single-device programs can instead be compiled once, portable, and
// run on whichever physical device the placer picks (option single_device_compile=portable).
#ifndef FLEXNPU_RUNTIME_EXECUTABLE_H_
#define FLEXNPU_RUNTIME_EXECUTABLE_H_

#include <algorithm>
#include <atomic>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/placement/placement.h"
#include "pjrt_flexnpu/runtime/buffer.h"
#include "pjrt_flexnpu/runtime/handles.h"
#include "pjrt_flexnpu/runtime/profile.h"

namespace flexnpu {

class VirtualClient;
class VirtualDevice;
struct PrebuiltVariants;        // runtime/executable_serialization.h
struct SerializableExecutable;  // runtime/executable_serialization.h

// PJRT_Executable: the compiled program without a device binding (an inner executable).
class VirtualExecutable : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kExecutable;
  // Takes ownership of `inner`. JAX asks for the counts on every execution: they are read
  // from the backend once, here.
  static StatusOr<VirtualExecutable*> Wrap(const PhysicalBackend& backend, PJRT_Executable* inner);
  const PhysicalBackend& backend() const { return *backend_; }
  PJRT_Executable* inner() const { return inner_.get(); }
  size_t num_replicas() const { return num_replicas_; }
  size_t num_partitions() const { return num_partitions_; }
  size_t num_outputs() const { return num_outputs_; }
  // What PJRT_Executable_Serialize writes; null for a view not made from a loaded executable.
  const std::shared_ptr<const SerializableExecutable>& serializable() const {
    return serializable_;
  }
  void set_serializable(std::shared_ptr<const SerializableExecutable> serializable) {
    serializable_ = std::move(serializable);
  }

 private:
  VirtualExecutable(const PhysicalBackend& backend, PJRT_Executable* inner)
      : Tagged(kTag), backend_(&backend), inner_(Own(backend, inner)) {}
  const PhysicalBackend* backend_;
  InnerExecutable inner_;
  size_t num_replicas_ = 1;
  size_t num_partitions_ = 1;
  size_t num_outputs_ = 0;
  std::shared_ptr<const SerializableExecutable> serializable_;
};

class VirtualLoadedExecutable : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kLoadedExecutable;
  // `prebuilt` (deserialized, runtime/executable_serialization.h): inner executables loaded
  // instead of compiled for the mappings it has, and the profile instead of an analysis.
  static StatusOr<VirtualLoadedExecutable*> Compile(
      VirtualClient* client, const PJRT_Program* program, std::string_view compile_options,
      std::shared_ptr<const PrebuiltVariants> prebuilt = nullptr);
  // The program, options, profile and compiled variants as they are now, for serialization
  // (defined in runtime/executable_serialization.cc).
  std::shared_ptr<const SerializableExecutable> SerializationSnapshot();

  VirtualClient* client() const { return client_; }
  const std::vector<PJRT_Device*>& device_handles() const { return device_handles_; }
  // DeviceAssignmentProto over virtual device ids, as JAX asked for it.
  const std::string& serialized_assignment() const { return serialized_assignment_; }
  size_t num_outputs() const { return num_outputs_; }
  // An inner loaded executable, for queries that do not depend on the mapping.
  PJRT_LoadedExecutable* any_inner() const { return initial_->executable.get(); }

  // Tells the placement core to drop what it learnt about this executable.
  ~VirtualLoadedExecutable();

  Status Execute(PJRT_LoadedExecutable_Execute_Args* args);
  bool portable() const { return portable_; }
  const placement::Profile& profile() const { return profile_; }
  Status Delete();
  bool IsDeleted() const { return deleted_.load(std::memory_order_acquire); }
  // Mappings with a compiled variant in the cache (for tests and stats).
  size_t num_cached_mappings();

 private:
  struct Compiled {
    InnerLoadedExecutable executable;
    std::vector<int> physical;        // physical device per position (empty when portable)
    std::vector<int> inner_position;  // position in the inner executable's device list
    // When an execution last used it (use_clock_): set on the fast path too, which skips
    // the map, so eviction sees real use.
    std::atomic<uint64_t> last_use{0};
  };

  // What every execution's outputs look like; learnt from the first one, so later outputs
  // are wrapped without asking the backend.
  struct OutputInfo {
    BufferMetadata metadata;
    int kind_index;
    // Dynamically shaped (bounded) output: dims and size can differ per execution, so they
    // are asked of the backend every time.
    bool varies = false;
  };
  using CompiledResult = StatusOr<std::shared_ptr<Compiled>>;
  // One mapping's compile: shared by every execution that wants it while it runs.
  struct CacheEntry {
    std::shared_future<CompiledResult> compiled;
    uint64_t last_use = 0;
  };

  VirtualLoadedExecutable(VirtualClient* client) : Tagged(kTag), client_(client) {}
  StatusOr<std::shared_ptr<Compiled>> CompileFor(const std::vector<int>& physical);
  // The cached variant for a mapping (n physical devices; n == 0: the portable compile),
  // compiled here, outside mu_, on first need.
  StatusOr<std::shared_ptr<Compiled>> CompiledFor(const int* physical, size_t n);
  void EvictLocked();
  static uint64_t LastUse(const CacheEntry& entry);
  // Makes `compiled` (a variant pinned to `physical_device`) the recent one.
  void Remember(int physical_device, const std::shared_ptr<Compiled>& compiled);
  // The pinned compile for `physical_device` failed and `portable` ran instead: cached as that
  // device's variant, so later executions there take it without compiling (and failing) again.
  void RememberFallback(int physical_device, const std::shared_ptr<Compiled>& portable);
  // One dispatcher for n >= 1 devices (single-device is n = 1): arguments resolved, placed
  // (the placer's tickets, SPMD shards included), moved, launched, tracked and wrapped.
  // kSingle: compiled for n == 1 (the lean instance every single-device execution takes).
  template <bool kSingle>
  Status Dispatch(PJRT_LoadedExecutable_Execute_Args* args, VirtualDevice* const* devices,
                  size_t n);
  // After a tracked launch: the placer's feedback and the trace, per shard, when each shard's
  // inner event fires. `positions`: shard d's place in `inner_events`; events the caller does
  // not want are released here. `tracing`: as read at the launch (start_ns is from then).
  void TrackShards(const PhysicalBackend& b, VirtualDevice* const* devices, size_t n,
                   const int* physical, const uint64_t* tickets, const size_t* positions,
                   PJRT_Event** inner_events, bool caller_wants_events, bool tracing,
                   int64_t start_ns);
  // After a launch of a program that may donate: stops counting donated arguments' bytes.
  void NoteDonations(VirtualBuffer* const* buffers, size_t n, size_t num_args);
  // The physical device per shard and the placer's tickets (0: untracked, passthrough).
  // `buffers` holds the n x num_args resolved arguments.
  Status Place(VirtualDevice* const* devices, size_t n, VirtualBuffer* const* buffers,
               size_t num_args, int* physical, uint64_t* tickets);
  // Wraps one device's inner outputs as buffers of `device`; takes ownership of them.
  Status WrapOutputs(VirtualDevice* device, int physical_device, PJRT_Buffer** inner_outputs,
                     PJRT_Buffer** outputs);
  Status LearnOutputs(PJRT_Buffer** inner_outputs);

  VirtualClient* client_;
  std::vector<VirtualDevice*> devices_;
  std::vector<PJRT_Device*> device_handles_;
  std::string serialized_assignment_;
  bool single_device_ = true;
  bool portable_ = false;
  // single_device_compile=auto under a placing policy: an execution placed off its home
  // device runs a variant pinned to the device it was placed on (compiled on the first
  // placement there; the fast execute path); the portable compile, made on first need, is only
  // the fallback when the backend cannot compile that pinned variant.
  bool portable_fallback_ = false;
  std::string portable_options_;
  // Phase and cost from the HLO analysis; what the placer decides with.
  placement::Profile profile_;
  uint64_t executable_id_ = 0;
  // False when the program aliases no input to an output: no execution can donate, and the
  // per-argument donation check is skipped.
  bool may_donate_ = true;
  // The arguments the program may donate (from the analysis): only those are checked after
  // an execution; unknown (a deserialized or unreadable program): all are.
  DonatableArguments donatable_;
  size_t num_outputs_ = 0;
  std::atomic<bool> outputs_known_{false};
  std::mutex outputs_mu_;
  std::vector<OutputInfo> outputs_;
  // Kept for compiles of further mappings.
  std::string program_code_;
  std::string program_format_;
  std::string compile_options_;  // rewritten: portable, or the assignment to replace
  std::string original_options_;  // as JAX gave them (serialized with the executable)
  std::shared_ptr<const PrebuiltVariants> prebuilt_;  // set when deserialized

  std::shared_ptr<Compiled> initial_;
  // Compiles for further mappings, least recently used evicted beyond kMaxCachedMappings
  // (the initial one stays). Compiles run outside mu_; executions in flight keep what they use.
  static constexpr size_t kMaxCachedMappings = 16;
  // Devices of an SPMD program kept inline on the dispatch path.
  static constexpr size_t kInlineDevices = 8;
  std::mutex mu_;
  // Keyed by the physical devices; looked up by pointer and length (MappingKey) so that a
  // cache hit on the dispatch path allocates nothing.
  struct MappingKey {
    const int* physical;
    size_t n;
  };
  struct MappingLess {
    using is_transparent = void;
    bool operator()(const std::vector<int>& a, const std::vector<int>& b) const { return a < b; }
    bool operator()(const std::vector<int>& a, const MappingKey& b) const {
      return std::lexicographical_compare(a.begin(), a.end(), b.physical, b.physical + b.n);
    }
    bool operator()(const MappingKey& a, const std::vector<int>& b) const {
      return std::lexicographical_compare(a.physical, a.physical + a.n, b.begin(), b.end());
    }
  };
  std::map<std::vector<int>, CacheEntry, MappingLess> by_mapping_;
  std::atomic<uint64_t> use_clock_{0};
  // The single-device variant the latest execution away from the initial one used: the next
  // one placed on that device (the common case: executions stay where their data is) takes
  // it without the map lookup, the future and mu_.
  std::mutex recent_mu_;
  int recent_device_ = -1;
  std::shared_ptr<Compiled> recent_;
  std::atomic<bool> deleted_{false};
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_EXECUTABLE_H_
