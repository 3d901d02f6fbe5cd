// FlexNPU's PJRT_Error: a Status behind the opaque C type.
#ifndef FLEXNPU_C_API_ERROR_H_
#define FLEXNPU_C_API_ERROR_H_

#include <cxxabi.h>

#include <utility>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/base/forced_unwind.h"
#include "pjrt_flexnpu/base/status.h"

struct PJRT_Error {
  flexnpu::Status status;
};

namespace flexnpu {
// nullptr for OK; else a new error JAX destroys with PJRT_Error_Destroy.
inline PJRT_Error* ToPjrtError(Status status) {
  if (status.ok()) return nullptr;
  return new PJRT_Error{std::move(status)};
}

namespace c_api {
// Calls `callback` exactly once with `status` as a PJRT_Error (nullptr when OK), whichever
// thread it runs on: a backend thread, or the caller's when the event is complete already. No
// exception escapes: thrown into a backend thread it is std::terminate, and thrown back through
// PJRT_Event_OnReady after the callback ran it would tell the caller that the callback was never
// registered (JAX would then free its state a second time). When the error cannot be allocated
// the callback still runs, with nullptr. Not noexcept: a forced unwind (the thread exits or is
// cancelled inside the caller's callback) must pass.
FLEXNPU_RETHROWS_FORCED_UNWIND inline void DeliverOnReady(Status status,
                                                   PJRT_Event_OnReadyCallback callback,
                                                   void* user_arg) {
  PJRT_Error* error = nullptr;
  try {
    error = ToPjrtError(std::move(status));
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    error = nullptr;
  }
  try {
    callback(error, user_arg);
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    // A C callback that throws anyway: its thread must live on, and it has run.
  }
}
}  // namespace c_api
}  // namespace flexnpu

#endif  // FLEXNPU_C_API_ERROR_H_
