// What the placer knows of an executable: its phase and cost on the physical devices,
// from the HLO analysis of the optimized program (xla_passes), and the roofline of the
// physical devices it is judged against.
#ifndef FLEXNPU_RUNTIME_PROFILE_H_
#define FLEXNPU_RUNTIME_PROFILE_H_

#include <string>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/placement/placement.h"
#include "xla_passes/roofline.h"

namespace flexnpu {

// The roofline preset for a physical device: by its kind (e.g. "NVIDIA H200") or, failing
// that, its platform ("cpu"); nullopt-like empty name when nothing matches.
xla_passes::DeviceSpec RooflineFor(const std::string& platform, const std::string& device_kind);

placement::DeviceModel DeviceModelFor(const xla_passes::DeviceSpec& spec);
// `model` with every duration `time_scale` times as long: the model of a device whose modelled
// time is stretched so (an emulated backend's time_scale, PhysicalBackend::ModelledTime).
placement::DeviceModel StretchedDeviceModel(placement::DeviceModel model, double time_scale);

// Profiles `executable` (an inner executable of `backend`) against `device`. When the
// analysis reads the program, `*donatable` (if given) becomes the argument numbers the program
// may alias to an output or donate, sorted; `known` is false when it cannot tell (none found,
// or a tupled parameter), and the caller must then assume any argument may be donated.
struct DonatableArguments {
  bool known = false;
  std::vector<int> arguments;
};
StatusOr<placement::Profile> ProfileExecutable(const PhysicalBackend& backend,
                                               PJRT_Executable* executable,
                                               const xla_passes::DeviceSpec& device,
                                               DonatableArguments* donatable = nullptr);

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_PROFILE_H_
