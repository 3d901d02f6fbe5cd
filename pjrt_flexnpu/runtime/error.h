// FlexNPU's PJRT_Error: a Status behind the opaque C type.
#ifndef FLEXNPU_RUNTIME_ERROR_H_
#define FLEXNPU_RUNTIME_ERROR_H_

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/runtime/status.h"

struct PJRT_Error {
  flexnpu::Status status;
};

namespace flexnpu {
// nullptr for OK; else a new error JAX destroys with PJRT_Error_Destroy.
inline PJRT_Error* ToPjrtError(Status status) {
  if (status.ok()) return nullptr;
  return new PJRT_Error{std::move(status)};
}
}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_ERROR_H_
