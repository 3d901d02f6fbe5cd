// Virtual executables: the program JAX compiled, bound to its virtual devices. The compiled
// variants per physical mapping are runtime/compile_cache.h; an execution's path (validate,
// place, move inputs, launch, track, wrap outputs) is runtime/dispatch.cc; outputs are wrapped
// by runtime/outputs.h.
#ifndef FLEXNPU_RUNTIME_EXECUTABLE_H_
#define FLEXNPU_RUNTIME_EXECUTABLE_H_

#include <atomic>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/placement/placement.h"
#include "pjrt_flexnpu/runtime/buffer.h"
#include "pjrt_flexnpu/runtime/compile_cache.h"
#include "pjrt_flexnpu/runtime/handles.h"
#include "pjrt_flexnpu/runtime/outputs.h"
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
  size_t num_outputs() const { return outputs_.count(); }
  // An inner loaded executable, for queries that do not depend on the mapping.
  PJRT_LoadedExecutable* any_inner() const { return variants_.initial()->executable.get(); }

  // Tells the placement core to drop what it learnt about this executable.
  ~VirtualLoadedExecutable();

  Status Execute(PJRT_LoadedExecutable_Execute_Args* args);
  bool portable() const { return variants_.portable(); }
  const placement::Profile& profile() const { return profile_; }
  Status Delete();
  bool IsDeleted() const { return deleted_.load(std::memory_order_acquire); }
  // Mappings with a compiled variant in the cache (for tests and stats).
  size_t num_cached_mappings() { return variants_.num_cached_mappings(); }

 private:
  VirtualLoadedExecutable(VirtualClient* client)
      : Tagged(kTag), client_(client), variants_(client), outputs_(client) {}
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

  VirtualClient* client_;
  std::vector<VirtualDevice*> devices_;
  std::vector<PJRT_Device*> device_handles_;
  std::string serialized_assignment_;
  bool single_device_ = true;
  // Phase and cost from the HLO analysis; what the placer decides with.
  placement::Profile profile_;
  uint64_t executable_id_ = 0;
  // False when the program aliases no input to an output: no execution can donate, and the
  // per-argument donation check is skipped.
  bool may_donate_ = true;
  // The arguments the program may donate (from the analysis): only those are checked after
  // an execution; unknown (a deserialized or unreadable program): all are.
  DonatableArguments donatable_;
  std::string original_options_;  // as JAX gave them (serialized with the executable)
  CompileCache variants_;
  ExecutableOutputs outputs_;
  // Devices of an SPMD program kept inline on the dispatch path.
  static constexpr size_t kInlineDevices = 8;
  std::atomic<bool> deleted_{false};
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_EXECUTABLE_H_
