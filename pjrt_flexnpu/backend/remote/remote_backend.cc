#include "pjrt_flexnpu/backend/remote/remote_backend.h"

#include <mutex>

#include "pjrt_flexnpu/backend/remote/entry_points.h"

namespace flexnpu::remote {
namespace {

// The socket of this process's daemon backend (one per process).
std::mutex g_config_mu;
std::string g_socket_path;

PJRT_Api BuildApi() {
  PJRT_Api api = own_api::NewApi();
#define FLEXNPU_SET_REMOTE_ENTRY_POINT(Name) api.PJRT_##Name = Name;
  FLEXNPU_REMOTE_ENTRY_POINTS(FLEXNPU_SET_REMOTE_ENTRY_POINT)
#undef FLEXNPU_SET_REMOTE_ENTRY_POINT
  return api;
}

}  // namespace

std::string SocketPath() {
  std::lock_guard<std::mutex> lock(g_config_mu);
  return g_socket_path;
}

StatusOr<std::shared_ptr<const PhysicalBackend>> RemoteBackend(const std::string& backend) {
  const std::string path = backend.substr(sizeof(kBackendPrefix) - 1);
  if (path.empty()) {
    return InvalidArgument("FlexNPU backend 'daemon:' needs the daemon's socket path, e.g. "
                           "daemon:/run/flexnpu.sock");
  }
  static const PJRT_Api api = BuildApi();
  static std::shared_ptr<const PhysicalBackend> shared;
  std::lock_guard<std::mutex> lock(g_config_mu);
  if (!g_socket_path.empty() && g_socket_path != path) {
    return InvalidArgument("this process already uses the flexnpu daemon at " + g_socket_path +
                           "; one daemon socket per process (asked for " + path + ")");
  }
  g_socket_path = path;
  if (shared == nullptr) shared = PhysicalBackend::FromApi(&api, backend);
  return shared;
}

}  // namespace flexnpu::remote
