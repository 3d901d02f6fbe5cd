#include "pjrt_flexnpu/backend/factory.h"

#include "pjrt_flexnpu/backend/emulated/emulated_backend.h"
#include "pjrt_flexnpu/backend/remote/remote_backend.h"

namespace flexnpu {

BackendKind BackendKindOf(std::string_view spec) {
  if (spec.rfind(remote::kBackendPrefix, 0) == 0) return BackendKind::kDaemon;
  if (spec.rfind(emulated::kBackendPrefix, 0) == 0) return BackendKind::kEmulated;
  return BackendKind::kPlugin;
}

StatusOr<std::shared_ptr<const PhysicalBackend>> OpenBackend(const std::string& spec) {
  switch (BackendKindOf(spec)) {
    case BackendKind::kDaemon:
      return remote::RemoteBackend(spec);
    case BackendKind::kEmulated:
      return emulated::EmulatedBackend(spec);
    case BackendKind::kPlugin:
      break;
  }
  return PhysicalBackend::Load(spec);
}

}  // namespace flexnpu
