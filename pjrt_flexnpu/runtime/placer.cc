#include "pjrt_flexnpu/runtime/placer.h"

#include <chrono>

#include "pjrt_flexnpu/base/small_vector.h"

namespace flexnpu {

int64_t Placer::NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

Placer::Placer(std::shared_ptr<placement::Core> core, int num_physical)
    : core_(std::move(core)), num_physical_(num_physical) {
  passthrough_.store(core_->policy().kind == placement::PolicyKind::kPassthrough);
}

StatusOr<std::unique_ptr<Placer>> Placer::Create(std::string_view policy,
                                                 std::vector<placement::DeviceModel> devices,
                                                 int num_virtual) {
  if (devices.empty()) return FailedPrecondition("the physical backend has no devices");
  const int num_physical = static_cast<int>(devices.size());
  placement::Config config;
  config.policy = std::string(policy);
  config.devices = std::move(devices);
  config.num_virtual_devices = num_virtual;
  auto core = placement::Core::Create(config);
  if (!core.ok()) return core.status();
  return std::unique_ptr<Placer>(
      new Placer(std::shared_ptr<placement::Core>(std::move(*core)), num_physical));
}

Status Placer::SetPolicy(std::string_view policy) {
  FLEXNPU_RETURN_IF_ERROR(core_->SetPolicy(policy));
  passthrough_.store(core_->policy().kind == placement::PolicyKind::kPassthrough,
                     std::memory_order_release);
  return Status::Ok();
}

StatusOr<std::vector<int>> Placer::PlaceGroup(const std::vector<int>& virtual_devices) const {
  std::vector<int> mapping(virtual_devices.size(), -1);
  FLEXNPU_RETURN_IF_ERROR(PlaceGroup(virtual_devices.data(), virtual_devices.size(),
                                     mapping.data()));
  return mapping;
}

Status Placer::PlaceGroup(const int* virtual_devices, size_t n, int* mapping) const {
  if (n > static_cast<size_t>(num_physical_)) {
    return InvalidArgument("an SPMD program over " + std::to_string(n) +
                           " virtual devices needs as many distinct physical devices; the "
                           "physical backend has " + std::to_string(num_physical_));
  }
  SmallVector<char, 64> used(num_physical_);  // zeroed; inline up to 64 physical devices
  for (size_t i = 0; i < n; ++i) {
    const int home = HomeOf(virtual_devices[i]);
    mapping[i] = -1;
    if (!used[home]) {
      used[home] = true;
      mapping[i] = home;
    }
  }
  int next_free = 0;
  for (size_t i = 0; i < n; ++i) {
    if (mapping[i] >= 0) continue;
    while (used[next_free]) ++next_free;
    used[next_free] = true;
    mapping[i] = next_free;
  }
  return Status::Ok();
}

}  // namespace flexnpu
