// Virtual executables. Single-device programs are compiled portable once and run on
// whichever physical device the placer picks; SPMD programs are compiled per mapping of their
// N virtual devices onto N distinct physical devices (cached).
#ifndef FLEXNPU_RUNTIME_EXECUTABLE_H_
#define FLEXNPU_RUNTIME_EXECUTABLE_H_

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/runtime/handles.h"
#include "pjrt_flexnpu/runtime/status.h"

namespace flexnpu {

class VirtualClient;
class VirtualDevice;

// PJRT_Executable: the compiled program without a device binding (an inner executable).
class VirtualExecutable : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kExecutable;
  VirtualExecutable(const PhysicalBackend& backend, PJRT_Executable* inner)
      : Tagged(kTag), backend_(&backend), inner_(Own(backend, inner)) {}
  const PhysicalBackend& backend() const { return *backend_; }
  PJRT_Executable* inner() const { return inner_.get(); }

 private:
  const PhysicalBackend* backend_;
  InnerExecutable inner_;
};

class VirtualLoadedExecutable : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kLoadedExecutable;
  static StatusOr<VirtualLoadedExecutable*> Compile(VirtualClient* client,
                                                    const PJRT_Program* program,
                                                    std::string_view compile_options);

  VirtualClient* client() const { return client_; }
  const std::vector<PJRT_Device*>& device_handles() const { return device_handles_; }
  // DeviceAssignmentProto over virtual device ids, as JAX asked for it.
  const std::string& serialized_assignment() const { return serialized_assignment_; }
  size_t num_outputs() const { return num_outputs_; }
  // An inner loaded executable, for queries that do not depend on the mapping.
  PJRT_LoadedExecutable* any_inner() const { return initial_->executable.get(); }

  Status Execute(PJRT_LoadedExecutable_Execute_Args* args);
  Status Delete();
  bool IsDeleted() const { return deleted_.load(std::memory_order_acquire); }

 private:
  struct Compiled {
    InnerLoadedExecutable executable;
    std::vector<int> physical;        // physical device per position (SPMD)
    std::vector<int> inner_position;  // position in the inner executable's device list
  };

  VirtualLoadedExecutable(VirtualClient* client) : Tagged(kTag), client_(client) {}
  StatusOr<std::shared_ptr<Compiled>> CompileFor(const std::vector<int>& physical);
  StatusOr<std::shared_ptr<Compiled>> CompiledFor(const std::vector<int>& physical);
  Status ExecuteSingle(PJRT_LoadedExecutable_Execute_Args* args, VirtualDevice* device);
  Status ExecuteSpmd(PJRT_LoadedExecutable_Execute_Args* args);

  VirtualClient* client_;
  std::vector<VirtualDevice*> devices_;
  std::vector<PJRT_Device*> device_handles_;
  std::string serialized_assignment_;
  bool single_device_ = true;
  size_t num_outputs_ = 0;
  // Kept for compiles of further mappings.
  std::string program_code_;
  std::string program_format_;
  std::string compile_options_;  // rewritten: portable, or the assignment to replace

  std::shared_ptr<Compiled> initial_;
  std::mutex mu_;
  std::map<std::vector<int>, std::shared_ptr<Compiled>> by_mapping_;
  std::atomic<bool> deleted_{false};
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_EXECUTABLE_H_
