// The one place that turns a backend spec into a physical backend. A spec is what option
// `backend` resolves to (runtime/options.h BackendPath): a PJRT plugin's path, or a prefixed
// name of one of FlexNPU's own backends. A new kind of backend is one more BackendKind and
// its branches here; the runtime only calls OpenBackend.
#ifndef FLEXNPU_BACKEND_FACTORY_H_
#define FLEXNPU_BACKEND_FACTORY_H_

#include <memory>
#include <string>
#include <string_view>

#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu {

enum class BackendKind {
  kPlugin,  // a PJRT plugin library by path (CPU, CUDA, Ascend), loaded with dlopen
  kDaemon,  // "daemon:SOCKET": the FlexNPU daemon's backend, over its remote API (remote/)
  kEmulated,  // "emulate:PRESET": accelerators of a device preset, modelled (emulated/)
};

// The kind of backend `spec` names.
BackendKind BackendKindOf(std::string_view spec);

// Opens the backend `spec` names.
StatusOr<std::shared_ptr<const PhysicalBackend>> OpenBackend(const std::string& spec);

}  // namespace flexnpu

#endif  // FLEXNPU_BACKEND_FACTORY_H_
