#include "pjrt_flexnpu/runtime/placer.h"

namespace flexnpu {

StatusOr<std::vector<int>> PassthroughPlacer::PlaceGroup(const std::vector<int>& virtual_devices) {
  const int n = static_cast<int>(virtual_devices.size());
  if (n > num_physical_) {
    return InvalidArgument("an SPMD program over " + std::to_string(n) +
                           " virtual devices needs as many distinct physical devices; the "
                           "physical backend has " + std::to_string(num_physical_));
  }
  std::vector<bool> used(num_physical_, false);
  std::vector<int> mapping(n, -1);
  for (int i = 0; i < n; ++i) {
    const int home = HomeOf(virtual_devices[i]);
    if (!used[home]) {
      used[home] = true;
      mapping[i] = home;
    }
  }
  int next_free = 0;
  for (int i = 0; i < n; ++i) {
    if (mapping[i] >= 0) continue;
    while (used[next_free]) ++next_free;
    used[next_free] = true;
    mapping[i] = next_free;
  }
  return mapping;
}

StatusOr<std::unique_ptr<Placer>> MakePlacer(const std::string& policy, int num_physical) {
  if (num_physical <= 0) return FailedPrecondition("the physical backend has no devices");
  if (policy == "passthrough") return std::unique_ptr<Placer>(new PassthroughPlacer(num_physical));
  return InvalidArgument("unknown FlexNPU placement policy '" + policy + "'");
}

}  // namespace flexnpu
