// The daemon's tenants: their configs, sessions, memory quotas and per-tenant counters.
#ifndef FLEXNPU_DAEMON_QUOTA_H_
#define FLEXNPU_DAEMON_QUOTA_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/backend/remote/protocol.h"
#include "pjrt_flexnpu/daemon/server.h"

namespace flexnpu::daemon {

struct TenantState {
  TenantConfig config;
  int64_t bytes_in_use = 0;  // guarded by Tenants' lock
  int sessions = 0;          // guarded by Tenants' lock
  // Counted by session threads without the lock (entries of Tenants never move).
  std::atomic<int64_t> executions{0};
  std::atomic<int64_t> held_for_latency{0};  // batch executions that waited for latency work
  // Of those, the ones that went at the starvation bound, before that work had completed (the
  // others went after its completion events fired: the daemon's own order).
  std::atomic<int64_t> held_past_max_wait{0};
  // What the tenant's sessions asked for (by op) and how long the daemon spent handling it,
  // readiness pushes sent and payload bytes moved: the per-step cost of the protocol.
  struct Requests {
    std::atomic<int64_t> count{0};
    std::atomic<int64_t> handler_ns{0};
  };
  std::array<Requests, kLastRequestOp + 1> requests;
  std::atomic<int64_t> pushes{0};
  std::atomic<int64_t> bytes_to_device{0};
  std::atomic<int64_t> bytes_to_host{0};
};

// Every tenant the daemon knows (the configured ones, and unknown ones as they connect when
// allowed), each session's tenant membership and the memory quota its buffers are charged to.
class Tenants {
 public:
  explicit Tenants(const std::vector<TenantConfig>& configs);

  // A session of tenant `name` says Hello: its tenant's entry (an unknown tenant's is made,
  // if allowed, unless the session is an observer), null for an observer of an unknown
  // tenant. A client session is counted in its tenant's sessions.
  StatusOr<TenantState*> Join(const std::string& name, bool observer,
                              bool allow_unknown_tenants);
  // A session ended: `bytes` of its tenant's quota are free again.
  void Leave(const std::string& name, bool observer, int64_t bytes);
  // Charges `bytes` of `what` to tenant `name`'s memory quota, or refuses them.
  Status Charge(const std::string& name, int64_t bytes, const char* what);
  void Release(const std::string& name, int64_t bytes);

  struct Stats {
    int64_t sessions_served = 0;
    int64_t sessions_reclaimed = 0;
    std::string json;  // {"tenant": {...}, ...}
  };
  // Taken under one lock.
  Stats Snapshot() const;

 private:
  mutable std::mutex mu_;
  std::map<std::string, TenantState> tenants_;
  int64_t sessions_served_ = 0;
  int64_t sessions_reclaimed_ = 0;
};

}  // namespace flexnpu::daemon

#endif  // FLEXNPU_DAEMON_QUOTA_H_
