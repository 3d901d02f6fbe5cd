// Host callbacks over a physical backend without send/recv (XLA:CPU plugins): FlexNPU's own
// execute-only XLA FFI handler, registered with the backend under kHostCallbackTargets. The
// custom call carries the callback's id (attribute "callback_id"); the handler hands operand
// and result buffers to a trampoline FlexNPU's Python side installed (flexnpu/host_callbacks.py),
// which runs the Python callable under the GIL. No PJRT types: it only sees the FFI call frame.
#ifndef FLEXNPU_RUNTIME_HOST_CALLBACK_H_
#define FLEXNPU_RUNTIME_HOST_CALLBACK_H_

#include <cstddef>
#include <cstdint>

#include "pjrt_flexnpu/base/status.h"

namespace flexnpu {

// The names jaxlib gives its own CPU callback targets: XLA's Shardy import/export recognises a
// Python callback by these names (its sharding survives into the SPMD partitioner), so FlexNPU's
// handler takes them in the physical backend, where jaxlib's handler cannot run.
inline constexpr const char* kHostCallbackTargets[] = {"xla_ffi_python_cpu_callback",
                                                       "xla_ffi_partitioned_python_cpu_callback"};
inline constexpr const char* kHostCallbackIdAttribute = "callback_id";

// One operand or result as the trampoline sees it. `dtype` is the XLA FFI data type code
// (XLA_FFI_DataType); token operands and results are not passed.
struct HostCallbackBuffer {
  int32_t dtype;
  void* data;
  int64_t rank;
  const int64_t* dims;
};

// Runs callback `callback_id` on `args`, writing `rets`. Returns 0 on success; otherwise
// writes a NUL-terminated message (at most `error_size` bytes) into `error`.
using HostCallbackTrampoline = int (*)(uint64_t callback_id, int64_t num_args,
                                       const HostCallbackBuffer* args, int64_t num_rets,
                                       const HostCallbackBuffer* rets, char* error,
                                       size_t error_size);

// Installs `trampoline` (replacing any earlier one) and registers the handler for every
// physical backend (through runtime/ffi.h, so backends attached later get it too). Idempotent.
Status InstallHostCallbacks(HostCallbackTrampoline trampoline);

// The XLA FFI handler (XLA_FFI_Handler*: XLA_FFI_Error* (XLA_FFI_CallFrame*)).
void* HostCallbackHandler();

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_HOST_CALLBACK_H_
