// The physical backend's PJRT profiler extension (PJRT_Extension_Type_Profiler), offered in
// FlexNPU's own extension chain. Its API (PLUGIN_Profiler_Api: create / start / stop / collect a
// profiler session) takes no PJRT handles, so forwarding is handing out the inner's function
// table: FlexNPU copies the inner extension struct as it is (whatever its struct_size, so no
// profiler header is needed) and only relinks `next` into its own chain. jax.profiler then
// collects the backend's device activity through it. Neither CPU plugin here offers one.
#ifndef FLEXNPU_RUNTIME_PROFILER_EXTENSION_H_
#define FLEXNPU_RUNTIME_PROFILER_EXTENSION_H_

#include "pjrt_c_api.h"

namespace flexnpu {

// A FlexNPU-owned copy of the profiler extension in `inner`'s chain (its `next` null: the
// caller links it), or nullptr when `inner` has none or a malformed one. Called once, while
// the chain is built; the copy lives for the process.
PJRT_Extension_Base* ForwardedProfilerExtension(const PJRT_Api& inner);

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_PROFILER_EXTENSION_H_
