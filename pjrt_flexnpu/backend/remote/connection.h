// One connection to the FlexNPU daemon (one per PJRT client = one daemon session): the
// socket, calls and their replies, the events the daemon pushes, and the reading role.
//
// Threads: callers block on a reply (with a deadline). One thread at a time holds a
// connection's reading role: it routes replies and event pushes and runs OnReady callbacks
// itself (no hand-off on the way from a push to the program). The socket is always drained:
// a callback that is about to wait (a call's reply, an event, the write lock another thread
// holds) first hands the reading role to another reader thread, and a callback that runs
// longer than kCallbackStallMs for any other reason (a lock of the program's) loses the role
// to one (the watchdog). So a reply or push never waits behind a callback, the daemon's
// queue for this process drains, and no callback reads the socket itself.
#ifndef FLEXNPU_BACKEND_REMOTE_CONNECTION_H_
#define FLEXNPU_BACKEND_REMOTE_CONNECTION_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/own_api.h"
#include "pjrt_flexnpu/backend/remote/protocol.h"
#include "pjrt_flexnpu/base/forced_unwind.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::remote {

// The protocol's messages and descriptions (protocol.h keeps the namespace it shares with the
// daemon's server).
using daemon::BufferMeta;
using daemon::ExecutableMeta;
using daemon::Frame;
using daemon::IntCursor;
using daemon::Layout;
using daemon::SharedSegment;

using own_api::ToError;

// Runs a slot's body; no exception leaves it.
template <typename F>
PJRT_Error* Run(F&& body) {
  return own_api::Run("flexnpu daemon client", std::forward<F>(body));
}

class Connection;

struct RemoteEvent {
  std::mutex mu;
  std::condition_variable cv;
  bool ready = false;
  Status status;
  std::vector<std::pair<PJRT_Event_OnReadyCallback, void*>> callbacks;
  // Runs (on the reader thread) with the push before the event turns ready: copies a
  // transfer's bytes to the caller's memory.
  std::function<void(const Frame&)> on_push;
  // The connection whose push makes it ready (compared by Await: a callback awaiting on that
  // connection's reader thread hands the reading role over first).
  Connection* owner = nullptr;
  // Executions' completion pushes: the argument positions (device * num_args + arg) the
  // execution consumed, set before the event turns ready.
  std::vector<int64_t> donated;
};

using Callbacks = std::vector<std::pair<PJRT_Event_OnReadyCallback, std::pair<Status, void*>>>;

// A callback running longer than this loses the reading role to another reader thread.
inline constexpr int kCallbackStallMs = 20;

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  static StatusOr<std::shared_ptr<Connection>> Open(const std::string& path);

  ~Connection();

  // Ends the session: the reader sees the end of the stream, fails what waits and exits.
  void Close();

  const std::string& path() const { return path_; }

  // Sends `request` and waits for its reply; a non-OK reply becomes the returned status.
  StatusOr<Frame> Call(Frame request, const std::vector<int>& fds = {});

  // Like Call, but a non-OK reply is returned as the frame (its code and text set): an
  // Execute refused after it ran lists the arguments it consumed.
  StatusOr<Frame> CallForReply(Frame request, const std::vector<int>& fds = {});

  // One-way request (destroys, transfers to host): no reply. A failure to send is returned;
  // the daemon reports a transfer's failure through its event.
  Status Post(Frame request, const std::vector<int>& fds = {});

  // A new event whose readiness the daemon will push under the returned id.
  std::pair<int64_t, std::shared_ptr<RemoteEvent>> NewEvent();
  // The daemon refused the request that would have produced event `id`.
  void DropEvent(int64_t id);

  // Called by a thread about to wait: if it holds this connection's reading role (a callback
  // on the reader thread), another reader thread takes the role, so the socket keeps being
  // read (the reply or push it waits for included). A no-op on any other thread.
  // (Static: `c` may be gone when this thread is not its reader; only compared then.)
  static void ReleaseReading(Connection* c);
  void ReleaseReading() { ReleaseReading(this); }

  // The watchdog: a callback that has run longer than kCallbackStallMs loses the role.
  void CheckStalledCallbacks(std::chrono::steady_clock::time_point now);

  bool dead();

 private:
  struct Pending {
    bool done = false;
    Status status;
    Frame reply;
  };

  Connection(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  void ReleaseReadingHeld();
  Status Send(const Frame& request, const std::vector<int>& fds);
  void Forget(uint64_t id);
  // Marks `event` ready (after its push's on_push) and hands back its callbacks to run.
  static void Complete(const std::shared_ptr<RemoteEvent>& event, Status status,
                       const Frame* push, Callbacks* callbacks);
  // Each callback once; a throw (a C callback that throws anyway, or a failed error
  // allocation) stops here: the reader thread must live on and run the rest.
  static FLEXNPU_RETHROWS_FORCED_UNWIND void Run(Callbacks& callbacks);
  Status Receive(Frame* frame);
  // One frame from the daemon: an event push or a reply.
  void Route(Frame frame, Callbacks* callbacks);
  // Fails everything waiting, now and later: no call hangs on a dead daemon.
  void Fail(const Status& failure);
  // Under role_mu_: frees the role and makes sure a reader thread will take it.
  void ReleaseRoleLocked();
  void SpawnReader();
  void SpawnReaderLocked();
  // A reader thread: takes the role when it is free, reads and routes until the connection
  // fails, and parks again when a callback it ran lost the role (at most one thread parks).
  void ReadLoop();

  const int fd_;
  const std::string path_;
  std::mutex write_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t next_call_ = 1;
  int64_t next_event_ = 1;
  Status dead_;
  std::map<uint64_t, std::shared_ptr<Pending>> pending_;
  std::map<int64_t, std::shared_ptr<RemoteEvent>> events_;
  // The reading role (one reader at a time).
  std::mutex role_mu_;
  std::condition_variable role_cv_;
  bool role_taken_ = false;
  bool in_callbacks_ = false;  // its holder runs callbacks (not reading)
  std::chrono::steady_clock::time_point callbacks_since_;
  uint64_t role_epoch_ = 0;
  int idle_readers_ = 0;  // reader threads parked (or starting) for the role
  bool closed_ = false;   // the socket failed: readers exit
};

}  // namespace flexnpu::remote

#endif  // FLEXNPU_BACKEND_REMOTE_CONNECTION_H_
