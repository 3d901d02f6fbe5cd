// Placement: which physical device stores a virtual device's buffers and runs its work.
// Pure decision code: no PJRT types, no clock here yet; the phase-aware policies plug in
// behind the same interface.
#ifndef FLEXNPU_RUNTIME_PLACER_H_
#define FLEXNPU_RUNTIME_PLACER_H_

#include <memory>
#include <string>
#include <vector>

#include "pjrt_flexnpu/runtime/status.h"

namespace flexnpu {

class Placer {
 public:
  virtual ~Placer() = default;
  virtual const char* name() const = 0;

  // The physical device that holds buffers created on `virtual_device`.
  virtual int HomeOf(int virtual_device) const = 0;

  // The physical device that runs a single-device execution addressed to `virtual_device`.
  virtual int PlaceExecution(int virtual_device) = 0;

  // Distinct physical devices for an SPMD execution over `virtual_devices` (one each).
  virtual StatusOr<std::vector<int>> PlaceGroup(const std::vector<int>& virtual_devices) = 0;
};

// Virtual device i lives and runs on physical device i mod P. SPMD groups keep that mapping
// where it is collision-free; a collision (V > P) takes the lowest unused physical device.
class PassthroughPlacer final : public Placer {
 public:
  explicit PassthroughPlacer(int num_physical) : num_physical_(num_physical) {}
  const char* name() const override { return "passthrough"; }
  int HomeOf(int virtual_device) const override { return virtual_device % num_physical_; }
  int PlaceExecution(int virtual_device) override { return HomeOf(virtual_device); }
  StatusOr<std::vector<int>> PlaceGroup(const std::vector<int>& virtual_devices) override;

 private:
  int num_physical_;
};

StatusOr<std::unique_ptr<Placer>> MakePlacer(const std::string& policy, int num_physical);

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_PLACER_H_
