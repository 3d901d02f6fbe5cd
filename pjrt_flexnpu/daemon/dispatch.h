// Runs the daemon's sessions against the physical backend, and owns what they share: the
// physical client, the tenants and their quotas, the priority gate and the reaper.
//
// Its methods live by concern: session.cc (a session's life: handshake, request loop, end),
// dispatch.cc (the op switch and readiness watches), buffer_requests.cc, executable_requests.cc
// and execute.cc (the requests on buffers, on executables, and executions).
#ifndef FLEXNPU_DAEMON_DISPATCH_H_
#define FLEXNPU_DAEMON_DISPATCH_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/backend/remote/protocol.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/daemon/physical_client.h"
#include "pjrt_flexnpu/daemon/priority_gate.h"
#include "pjrt_flexnpu/daemon/quota.h"
#include "pjrt_flexnpu/daemon/reaper.h"
#include "pjrt_flexnpu/daemon/server.h"
#include "pjrt_flexnpu/daemon/session.h"

namespace flexnpu::daemon {

// One line per session event on stderr, when config.log.
void Log(const ServerConfig& config, const std::string& line);

class Dispatcher {
 public:
  // `stopping` (the server's) ends the waits of batch-class executions; `server` answers
  // Stats requests.
  Dispatcher(const ServerConfig& config, const std::atomic<bool>& stopping, const Server& server);

  // Opens the physical client, starts the reaper and makes the priority gate.
  Status Open();
  // Serves session `s` on the calling thread until its connection ends, then destroys what
  // it owned.
  void Serve(Session& s);
  // Sessions, buffers and executables share one id space.
  int64_t NextId() { return next_id_++; }
  // Stopping: batch-class executions held back for latency work go; the reaper destroys what
  // is queued, then stops.
  void WakeBatchWaiters() {
    if (gate_) gate_->WakeAll();
  }
  void StopReaper() { reaper_.Stop(); }

  const PhysicalClient& physical() const { return physical_; }
  const Tenants& tenants() const { return tenants_; }
  std::vector<int64_t> LatencyInFlight() const { return gate_->InFlight(); }

 private:
  // session.cc
  Status Hello(Session& s, const Frame& request, Frame* reply);
  // What the client learns of a failed request: its reply's error, and for one-way requests
  // the failure of what they named (buffers, events).
  void ReportFailure(Session& s, const Frame& request, const Status& status, Frame* reply);
  void EndSession(Session& s);

  // dispatch.cc
  Status Handle(Session& s, const Frame& request, std::vector<int>& fds, Frame* reply);
  void WatchEvent(Session& s, PJRT_Event* inner, int64_t event_id,
                  std::function<void(Frame*)> fill, std::shared_ptr<void> keep_alive,
                  std::function<void()> done = nullptr,
                  std::shared_ptr<const std::vector<int64_t>> donated = nullptr);
  void DrainFired(Session& s);

  // buffer_requests.cc
  Status BufferFromHost(Session& s, const Frame& r, std::vector<int>& fds, Frame* out);
  Status ToHost(Session& s, const Frame& r, std::vector<int>& fds, Frame* out);
  Status ToHostSize(Session& s, const Frame& r, Frame* out);
  Status ReadyEvent(Session& s, const Frame& r);
  Status DeleteBuffer(Session& s, const Frame& r);
  Status IsDeleted(Session& s, const Frame& r, Frame* out);
  Status DestroyBuffer(Session& s, const Frame& r);
  Status CopyToMemory(Session& s, const Frame& r, Frame* out);
  StatusOr<BufferEntry*> FindBuffer(Session& s, const std::vector<int64_t>& ints, size_t at = 0);
  Status Describe(PJRT_Buffer* buffer, int64_t id, BufferMeta* meta);
  // Registers buffer `handle` in `s` and appends its description to `ints`.
  // `id` 0: a new daemon id; else the client's (outputs of a one-way execution).
  Status AddBuffer(Session& s, PJRT_Buffer* handle, std::vector<int64_t>* ints, int64_t* bytes,
                   int64_t id = 0);

  // executable_requests.cc
  StatusOr<ExecutableEntry*> FindExecutable(Session& s, const std::vector<int64_t>& ints);
  Status AddExecutable(Session& s, PJRT_LoadedExecutable* loaded, Frame* out);
  Status Compile(Session& s, const Frame& r, Frame* out);
  Status Deserialize(Session& s, const Frame& r, Frame* out);
  Status ExecutableCall(Session& s, const Frame& r, Frame* out);

  // execute.cc
  struct Execution;  // one Execute request, from its parse to its completion watches
  Status Execute(Session& s, const Frame& r, Frame* out);
  Status ParseExecute(Session& s, const Frame& r, Execution& e);
  Status PlaceExecute(Session& s, Execution& e);
  void AwaitPriorityTurn(Session& s, const Execution& e);
  Status Launch(Session& s, Execution& e);
  Status KeepOutputs(Session& s, Execution& e, Frame* out);
  void WatchCompletions(Session& s, Execution& e, bool kept);
  // A one-way execution failed: its events carry the error, its output ids name it.
  void FailOneWayExecute(Session& s, const Frame& r, const Status& status);

  const PhysicalBackend& b() const { return *physical_.backend; }

  const ServerConfig& config_;
  const std::atomic<bool>& stopping_;
  const Server& server_;
  PhysicalClient physical_;
  Tenants tenants_;
  std::shared_ptr<PriorityGate> gate_;  // shared with completion callbacks
  Reaper reaper_;
  std::atomic<int64_t> next_id_{1};
};

}  // namespace flexnpu::daemon

#endif  // FLEXNPU_DAEMON_DISPATCH_H_
