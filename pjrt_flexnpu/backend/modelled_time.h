// A physical backend whose devices are modelled rather than real (backend/emulated/) reports
// the device time it has modelled through a PJRT extension of FlexNPU's own, which only
// FlexNPU's runtime reads (PhysicalBackend::ModelledTime); JAX never sees a physical API.
#ifndef FLEXNPU_BACKEND_MODELLED_TIME_H_
#define FLEXNPU_BACKEND_MODELLED_TIME_H_

#include <cstdint>
#include <cstring>

#include "pjrt_c_api.h"

namespace flexnpu {

// Outside the range of PJRT's own extension types ("FNPT"). PJRT_Extension_Type is a C enum
// whose range ends far below it, so the field is written and read as the integer it holds
// (an enum load of an out-of-range value is undefined behaviour).
inline constexpr uint32_t kModelledTimeExtensionType = 0x464E5054;
static_assert(sizeof(PJRT_Extension_Type) == sizeof(uint32_t));

inline uint32_t ExtensionTypeOf(const PJRT_Extension_Base& extension) {
  uint32_t type;
  std::memcpy(&type, &extension.type, sizeof(type));
  return type;
}
inline void SetExtensionType(PJRT_Extension_Base& extension, uint32_t type) {
  std::memcpy(&extension.type, &type, sizeof(type));
}

struct ModelledDeviceTime {
  double busy_s = 0;        // device time of the executions run or queued so far (modelled)
  int64_t executions = 0;   // executions run or queued so far
  double time_scale = 1;    // wall-clock time = time_scale x device time
  bool co_run = false;      // co-located executions overlap (base/co_run.h), else run in order
};

struct ModelledTimeExtension {
  PJRT_Extension_Base base;
  // Fills `*out` for `device`, a device of a client of this backend. Returns an error of the
  // backend's own API, or nullptr.
  PJRT_Error* (*device_time)(PJRT_Device* device, ModelledDeviceTime* out);
};

}  // namespace flexnpu

#endif  // FLEXNPU_BACKEND_MODELLED_TIME_H_
