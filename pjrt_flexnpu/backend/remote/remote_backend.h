// The remote backend: a PJRT_Api whose slots are calls to a FlexNPU daemon over a Unix-domain
// socket (protocol.h). The runtime drives it exactly like a dlopen'ed physical plugin.
#ifndef FLEXNPU_BACKEND_REMOTE_REMOTE_BACKEND_H_
#define FLEXNPU_BACKEND_REMOTE_REMOTE_BACKEND_H_

#include <memory>
#include <string>

#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::remote {

// "daemon:PATH" names the daemon at socket PATH as the physical backend.
inline constexpr const char kBackendPrefix[] = "daemon:";

// The physical backend for `backend` ("daemon:PATH"). Each PJRT client it creates is one
// connection (one daemon session) naming the tenant in FLEXNPU_TENANT. One daemon socket
// per process.
StatusOr<std::shared_ptr<const PhysicalBackend>> RemoteBackend(const std::string& backend);

}  // namespace flexnpu::remote

#endif  // FLEXNPU_BACKEND_REMOTE_REMOTE_BACKEND_H_
