// Client mode: a PJRT_Api whose slots are calls to a FlexNPU daemon over a Unix-domain
// socket (protocol.h). The runtime drives it exactly like a dlopen'ed physical plugin.
#ifndef FLEXNPU_DAEMON_REMOTE_API_H_
#define FLEXNPU_DAEMON_REMOTE_API_H_

#include <memory>
#include <string>

#include "pjrt_flexnpu/backend/physical_backend.h"

namespace flexnpu::daemon {

// "daemon:PATH" names the daemon at socket PATH as the physical backend.
inline constexpr const char kBackendPrefix[] = "daemon:";
bool IsDaemonBackend(const std::string& backend);

// The physical backend for `backend` ("daemon:PATH"). Each PJRT client it creates is one
// connection (one daemon session) naming the tenant in FLEXNPU_TENANT. One daemon socket
// per process.
StatusOr<std::shared_ptr<const PhysicalBackend>> RemoteBackend(const std::string& backend);

}  // namespace flexnpu::daemon

#endif  // FLEXNPU_DAEMON_REMOTE_API_H_
