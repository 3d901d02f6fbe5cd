// The runtime's side of placement: the decision core (placement/) behind the interface the
// executables call, plus the mapping of SPMD programs onto distinct physical devices.
#ifndef FLEXNPU_RUNTIME_PLACER_H_
#define FLEXNPU_RUNTIME_PLACER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu {

class Placer {
 public:
  static StatusOr<std::unique_ptr<Placer>> Create(std::string_view policy,
                                                  std::vector<placement::DeviceModel> devices,
                                                  int num_virtual);

  int num_physical() const { return num_physical_; }
  // Where buffers created on `virtual_device` live: physical device v mod P.
  int HomeOf(int virtual_device) const { return virtual_device % num_physical_; }
  // True while the policy is passthrough: executions skip the decision core (they are only
  // counted, CountPassthrough).
  bool passthrough() const { return passthrough_.load(std::memory_order_acquire); }

  // A single-device execution: the physical device and a ticket for OnStart/OnFinish.
  Status Place(const placement::Request& request, placement::Decision* decision) {
    return core_->Place(request, decision);
  }
  // An SPMD shard on the physical device the group mapping gave it: a ticket as Place's.
  Status PlaceOn(const placement::Request& request, int physical_device,
                 placement::Decision* decision) {
    return core_->PlaceOn(request, physical_device, decision);
  }
  // An execution of the passthrough fast path (no Place): counted, lock-free.
  void CountPassthrough(int virtual_device, int physical_device, placement::Phase phase) {
    core_->CountPassthrough(virtual_device, physical_device, phase);
  }
  void OnStart(uint64_t ticket, int64_t now_ns) { (void)core_->OnStart(ticket, now_ns); }
  void Cancel(uint64_t ticket) { (void)core_->Cancel(ticket); }
  // Completion callbacks hold the core: they may fire on a backend thread after the client
  // is gone.
  const std::shared_ptr<placement::Core>& core() const { return core_; }

  // Distinct physical devices for an SPMD execution over `virtual_devices`: each keeps its
  // home where that is free; collisions (V > P) take the lowest unused devices.
  StatusOr<std::vector<int>> PlaceGroup(const std::vector<int>& virtual_devices) const;
  // The same into `physical` (n entries), without allocating: the dispatch path's form.
  Status PlaceGroup(const int* virtual_devices, size_t n, int* physical) const;

  Status SetPolicy(std::string_view policy);
  std::string policy() const { return core_->policy().ToString(); }
  std::string SnapshotJson() const { return core_->Snapshot(NowNs()).ToJson(); }

  static int64_t NowNs();

 private:
  Placer(std::shared_ptr<placement::Core> core, int num_physical);
  std::shared_ptr<placement::Core> core_;
  int num_physical_;
  std::atomic<bool> passthrough_{true};
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_PLACER_H_
