// The FlexNPU daemon: owns the physical PJRT client and serves client processes' remote
// PJRT_Api calls (backend/remote/) over a Unix-domain socket. Each connection is a session
// with its own handle tables; closing it (or the client dying) destroys what it owned.
#ifndef FLEXNPU_DAEMON_SERVER_H_
#define FLEXNPU_DAEMON_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::daemon {

struct TenantConfig {
  std::string name;
  int64_t memory_quota_bytes = -1;  // bytes on physical devices; -1: unlimited
  std::vector<int64_t> devices;     // physical device ids it may use; empty: all
  // latency | batch: on a device where latency-class executions are in flight, batch-class
  // ones wait until those finish (at most ServerConfig::batch_max_wait_ms).
  std::string priority = "batch";
};

struct ServerConfig {
  std::string socket_path;
  // The PJRT plugin served: a physical one, or FlexNPU's own plugin (its runtime and placer
  // then decide for every session; see daemon.py --policy).
  std::string backend_path;
  // Create options of that plugin's client: integers (e.g. cpu_device_count) and strings
  // (e.g. FlexNPU's policy, backend, cpu_plugin_path).
  std::vector<std::pair<std::string, int64_t>> backend_int_options;
  std::vector<std::pair<std::string, std::string>> backend_string_options;
  // The starvation bound of batch-class executions held back for latency-class ones.
  int64_t batch_max_wait_ms = 50;
  std::vector<TenantConfig> tenants;
  bool allow_unknown_tenants = true;
  bool log = true;  // one line per session event on stderr
};

class Server {
 public:
  static StatusOr<std::unique_ptr<Server>> Start(ServerConfig config);
  virtual ~Server() = default;
  // Stops accepting, ends every session (destroying what it owns) and removes the socket.
  virtual void Stop() = 0;
  // {"sessions": [...], "tenants": {...}, ...}
  virtual std::string StatsJson() const = 0;
};

}  // namespace flexnpu::daemon

#endif  // FLEXNPU_DAEMON_SERVER_H_
