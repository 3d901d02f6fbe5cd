// A daemon session: one client connection, its tenant and device set, and the handle tables
// that name what it owns (destroyed when it ends).
#ifndef FLEXNPU_DAEMON_SESSION_H_
#define FLEXNPU_DAEMON_SESSION_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/daemon/channel.h"

namespace flexnpu::daemon {

struct TenantState;

struct BufferEntry {
  PJRT_Buffer* handle = nullptr;  // null: an output of a one-way execution that failed
  int64_t counted_bytes = 0;
  Status error;                   // why, when `handle` is null
};
struct ExecutableEntry {
  PJRT_LoadedExecutable* handle = nullptr;
  int64_t num_outputs = 0;
  // Every addressable device's index, in the executable's order: the order of its per-device
  // completion events.
  std::vector<int64_t> addressable;
};

struct Session {
  int64_t id = 0;
  std::string tenant;
  TenantState* tenant_state = nullptr;  // in Tenants; null for observers
  bool latency = false;                 // the tenant's priority class is "latency"
  bool observer = false;
  std::shared_ptr<Channel> channel;
  std::set<int64_t> devices;  // allowed device indices
  std::set<int64_t> memories;  // allowed memory indices
  // Handle tables: only ids in these maps can be named by this session.
  std::map<int64_t, BufferEntry> buffers;
  std::map<int64_t, ExecutableEntry> executables;
  std::set<PJRT_Event*> events;  // inner events with a pending readiness push
  // An Execute that failed after the backend ran it (its outputs could not be kept): the
  // arguments it consumed, for the failure's reply or pushes.
  std::vector<int64_t> consumed_by_failed;
  std::thread thread;
  std::atomic<bool> greeted{false};
  std::atomic<bool> finished{false};
  // Table sizes for observers (the tables belong to the session's thread).
  std::atomic<size_t> buffer_count{0};
  std::atomic<size_t> executable_count{0};
};

}  // namespace flexnpu::daemon

#endif  // FLEXNPU_DAEMON_SESSION_H_
