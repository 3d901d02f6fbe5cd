// The physical backend's client the daemon serves every session over, and its topology.
#ifndef FLEXNPU_DAEMON_PHYSICAL_CLIENT_H_
#define FLEXNPU_DAEMON_PHYSICAL_CLIENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/daemon/server.h"

namespace flexnpu::daemon {

struct Memory {
  PJRT_Memory* handle = nullptr;
  int64_t id = 0;
  std::string kind;
  int64_t kind_id = 0;
};

struct Device {
  PJRT_Device* handle = nullptr;
  int64_t id = 0;
  int64_t local_hardware_id = 0;
  std::string kind;
  int64_t default_memory = -1;
  std::vector<int64_t> memories;  // indices into PhysicalClient::memories
  // What the device has: its memory stats' limit, else (CPU devices) its share of the host's
  // RAM; -1 when neither says.
  int64_t bytes_limit = -1;
};

// Sessions name devices and memories by their index in `devices` and `memories`.
struct PhysicalClient {
  // Loads the backend, creates its client with the configured options and reads its platform,
  // devices and memories.
  Status Open(const ServerConfig& config);
  int64_t MemoryIndexOf(PJRT_Memory* memory) const {
    for (size_t i = 0; i < memories.size(); ++i) {
      if (memories[i].handle == memory) return static_cast<int64_t>(i);
    }
    return -1;
  }

  std::shared_ptr<const PhysicalBackend> backend;
  InnerClient client;
  std::string platform_name;
  std::string platform_version;
  std::vector<Device> devices;
  std::vector<Memory> memories;
  // FlexNPU's own plugin as the backend exports its runtime's state (placements by reason).
  const char* (*runtime_stats)() = nullptr;
};

}  // namespace flexnpu::daemon

#endif  // FLEXNPU_DAEMON_PHYSICAL_CLIENT_H_
