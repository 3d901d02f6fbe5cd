// FlexNPU's PJRT_Error: a Status behind the opaque C type.
#ifndef FLEXNPU_RUNTIME_ERROR_H_
#define FLEXNPU_RUNTIME_ERROR_H_

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/runtime/status.h"

// On a function that catches abi::__forced_unwind& to rethrow it: the forced unwind is a
// foreign exception, so that reference binds to no object, and UBSan's null check (in the
// sanitizer build) reports the binding itself as an error. In sanitizer builds such a
// function is also never inlined: inlined into a caller without the exemption, its catch is
// checked after all (seen with Guard inlined into PJRT_Event_OnReady).
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define FLEXNPU_RETHROWS_FORCED_UNWIND __attribute__((no_sanitize("null"), noinline))
#else
#define FLEXNPU_RETHROWS_FORCED_UNWIND __attribute__((no_sanitize("null")))
#endif

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
