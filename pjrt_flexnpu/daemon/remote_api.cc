// The remote PJRT_Api of client mode. Handles given to the runtime are objects of this file
// (RemoteClient, RemoteBuffer, ...) that hold daemon-side ids; metadata the daemon sends
// with each new object answers the query slots locally, so only data and work (transfers,
// compile, execute, destroy) cross the socket.
//
// Threads: callers block on a reply (with a deadline). One thread at a time holds a
// connection's reading role: it routes replies and event pushes and runs OnReady callbacks
// itself (no hand-off on the way from a push to the program). The socket is always drained:
// a callback that is about to wait (a call's reply, an event, the write lock another thread
// holds) first hands the reading role to another reader thread, and a callback that runs
// longer than kCallbackStallMs for any other reason (a lock of the program's) loses the role
// to one (the watchdog). So a reply or push never waits behind a callback, the daemon's
// queue for this process drains, and no callback reads the socket itself.
#include "pjrt_flexnpu/daemon/remote_api.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cxxabi.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>
#include <vector>

#include "pjrt_flexnpu/base/forced_unwind.h"
#include "pjrt_flexnpu/daemon/protocol.h"

namespace flexnpu::daemon {
namespace {

struct RemoteError {
  Status status;
};

PJRT_Error* ToError(Status status) {
  if (status.ok()) return nullptr;
  return reinterpret_cast<PJRT_Error*>(new RemoteError{std::move(status)});
}

template <typename F>
PJRT_Error* Run(F&& body) {
  try {
    return ToError(body());
  } catch (const std::exception& e) {
    return ToError(Internal(std::string("flexnpu daemon client: ") + e.what()));
  } catch (...) {
    return ToError(Internal("flexnpu daemon client: unknown exception"));
  }
}

int CallTimeoutSeconds() {
  const char* v = std::getenv("FLEXNPU_DAEMON_TIMEOUT_S");
  const int s = v != nullptr ? std::atoi(v) : 0;
  return s > 0 ? s : 300;
}

// ---------------------------------------------------------------------------------------
// Events

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

struct EventHandle {
  std::shared_ptr<RemoteEvent> event;
};

// The connection whose reader thread this is (callbacks run there), else null, and the
// epoch of the reading role it holds.
thread_local Connection* t_reader_of = nullptr;
thread_local uint64_t t_role_epoch = 0;

// A callback running longer than this loses the reading role to another reader thread.
constexpr int kCallbackStallMs = 20;

void StartWatchdog(std::weak_ptr<Connection> connection);
// Reader threads running callbacks now, over all connections (the watchdog sleeps while 0),
// and a wake-up for the watchdog when it sleeps so.
std::atomic<int> g_callbacks_running{0};
void WakeWatchdog();

// ---------------------------------------------------------------------------------------
// Connection: one per PJRT client = one daemon session.

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  static StatusOr<std::shared_ptr<Connection>> Open(const std::string& path) {
    const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return Status(Code::kUnavailable, "flexnpu daemon client: socket() failed");
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    if (path.size() >= sizeof(addr.sun_path)) {
      ::close(fd);
      return InvalidArgument("flexnpu daemon socket path is too long: '" + path + "'");
    }
    std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      const std::string why = std::strerror(errno);
      ::close(fd);
      return Status(Code::kUnavailable,
                    "cannot connect to the flexnpu daemon at " + path + ": " + why +
                        " (is `python -m flexnpu daemon --socket " + path + "` running?)");
    }
    std::shared_ptr<Connection> c(new Connection(fd, path));
    c->SpawnReader();
    StartWatchdog(c);
    return c;
  }

  ~Connection() { ::close(fd_); }

  // Ends the session: the reader sees the end of the stream, fails what waits and exits.
  void Close() { ::shutdown(fd_, SHUT_RDWR); }

  const std::string& path() const { return path_; }

  // Sends `request` and waits for its reply; a non-OK reply becomes the returned status.
  StatusOr<Frame> Call(Frame request, const std::vector<int>& fds = {}) {
    auto reply = CallForReply(std::move(request), fds);
    if (!reply.ok()) return reply.status();
    if (reply->code != 0) {
      return Status(static_cast<Code>(reply->code), "flexnpu daemon at " + path_ + ": " +
                                                        reply->text);
    }
    return reply;
  }

  // Like Call, but a non-OK reply is returned as the frame (its code and text set): an
  // Execute refused after it ran lists the arguments it consumed.
  StatusOr<Frame> CallForReply(Frame request, const std::vector<int>& fds = {}) {
    auto pending = std::make_shared<Pending>();
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!dead_.ok()) return dead_;
      request.call_id = next_call_++;
      pending_[request.call_id] = pending;
    }
    const uint64_t id = request.call_id;
    const uint32_t op = request.op;
    Status sent = Send(request, fds);
    if (!sent.ok()) {
      Forget(id);
      return Status(Code::kUnavailable,
                    "flexnpu daemon at " + path_ + ": send failed: " + sent.message());
    }
    const auto deadline =
        std::chrono::steady_clock::now() + std::chrono::seconds(CallTimeoutSeconds());
    ReleaseReading();  // a callback calling the daemon: another thread reads the reply
    std::unique_lock<std::mutex> lock(mu_);
    const bool done = cv_.wait_until(lock, deadline, [&] { return pending->done; });
    pending_.erase(id);
    if (!done) {
      return Status(Code::kDeadlineExceeded,
                    "flexnpu daemon at " + path_ + ": no reply to op " + std::to_string(op) +
                        " within " + std::to_string(CallTimeoutSeconds()) + " s");
    }
    if (!pending->status.ok()) return pending->status;
    return std::move(pending->reply);
  }

  // One-way request (destroys, transfers to host): no reply. A failure to send is returned;
  // the daemon reports a transfer's failure through its event.
  Status Post(Frame request, const std::vector<int>& fds = {}) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!dead_.ok()) return dead_;
    }
    Status sent = Send(request, fds);
    if (!sent.ok()) {
      return Status(Code::kUnavailable,
                    "flexnpu daemon at " + path_ + ": send failed: " + sent.message());
    }
    return Status::Ok();
  }

  // A new event whose readiness the daemon will push under the returned id.
  std::pair<int64_t, std::shared_ptr<RemoteEvent>> NewEvent() {
    auto event = std::make_shared<RemoteEvent>();
    event->owner = this;
    std::lock_guard<std::mutex> lock(mu_);
    const int64_t id = next_event_++;
    if (!dead_.ok()) {
      event->ready = true;
      event->status = dead_;
    } else {
      events_[id] = event;
    }
    return {id, event};
  }
  // The daemon refused the request that would have produced event `id`.
  void DropEvent(int64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    events_.erase(id);
  }

  // Called by a thread about to wait: if it holds this connection's reading role (a callback
  // on the reader thread), another reader thread takes the role, so the socket keeps being
  // read (the reply or push it waits for included). A no-op on any other thread.
  // (Static: `c` may be gone when this thread is not its reader; only compared then.)
  static void ReleaseReading(Connection* c) {
    if (c == nullptr || t_reader_of != c) return;
    c->ReleaseReadingHeld();
  }
  void ReleaseReading() { ReleaseReading(this); }

 private:
  void ReleaseReadingHeld() {
    std::lock_guard<std::mutex> lock(role_mu_);
    if (role_taken_ && in_callbacks_ && role_epoch_ == t_role_epoch) ReleaseRoleLocked();
  }

 public:
  // The watchdog: a callback that has run longer than kCallbackStallMs loses the role.
  void CheckStalledCallbacks(std::chrono::steady_clock::time_point now) {
    std::lock_guard<std::mutex> lock(role_mu_);
    if (role_taken_ && in_callbacks_ &&
        now - callbacks_since_ > std::chrono::milliseconds(kCallbackStallMs)) {
      ReleaseRoleLocked();
    }
  }

  bool dead() {
    std::lock_guard<std::mutex> lock(mu_);
    return !dead_.ok();
  }

 private:
  struct Pending {
    bool done = false;
    Status status;
    Frame reply;
  };

  Connection(int fd, std::string path) : fd_(fd), path_(std::move(path)) {}

  Status Send(const Frame& request, const std::vector<int>& fds) {
    std::unique_lock<std::mutex> lock(write_mu_, std::try_to_lock);
    if (!lock.owns_lock()) {
      ReleaseReading();  // another thread is sending: do not hold the socket unread meanwhile
      lock.lock();
    }
    return SendFrame(fd_, request, fds);
  }

  void Forget(uint64_t id) {
    std::lock_guard<std::mutex> lock(mu_);
    pending_.erase(id);
  }

  // Marks `event` ready (after its push's on_push) and hands back its callbacks to run.
  static void Complete(const std::shared_ptr<RemoteEvent>& event, Status status,
                       const Frame* push, Callbacks* callbacks) {
    std::vector<std::pair<PJRT_Event_OnReadyCallback, void*>> registered;
    {
      std::lock_guard<std::mutex> lock(event->mu);
      if (event->ready) return;
      if (push != nullptr && event->on_push && status.ok()) event->on_push(*push);
      if (push != nullptr && push->ints.size() > 2) {
        IntCursor cursor(push->ints, 2);
        (void)cursor.List(&event->donated);
      }
      event->on_push = nullptr;
      event->ready = true;
      event->status = status;
      registered.swap(event->callbacks);
    }
    event->cv.notify_all();
    for (auto& [cb, arg] : registered) callbacks->push_back({cb, {status, arg}});
  }

  // Each callback once; a throw (a C callback that throws anyway, or a failed error
  // allocation) stops here: the reader thread must live on and run the rest.
  static FLEXNPU_RETHROWS_FORCED_UNWIND void Run(Callbacks& callbacks) {
    for (auto& [cb, arg] : callbacks) {
      try {
        cb(ToError(arg.first), arg.second);
      } catch (abi::__forced_unwind&) {
        throw;
      } catch (...) {
      }
    }
  }

  Status Receive(Frame* frame) {
    std::vector<int> fds;
    Status s = RecvFrame(fd_, frame, &fds);
    for (int fd : fds) ::close(fd);  // the daemon sends none
    return s;
  }

  // One frame from the daemon: an event push or a reply.
  void Route(Frame frame, Callbacks* callbacks) {
    if (frame.op == kEventReady && frame.call_id == 0) {
      if (frame.ints.size() < 2) return;
      std::shared_ptr<RemoteEvent> event;
      {
        std::lock_guard<std::mutex> lock(mu_);
        auto it = events_.find(frame.ints[0]);
        if (it == events_.end()) return;
        event = std::move(it->second);
        events_.erase(it);
      }
      Status status = frame.ints[1] == 0
                          ? Status::Ok()
                          : Status(static_cast<Code>(frame.ints[1]), frame.text);
      Complete(event, std::move(status), &frame, callbacks);
      return;
    }
    std::lock_guard<std::mutex> lock(mu_);
    auto it = pending_.find(frame.call_id);
    if (it == pending_.end()) return;  // the caller gave up (deadline)
    it->second->reply = std::move(frame);
    it->second->done = true;
    cv_.notify_all();
  }

  // Fails everything waiting, now and later: no call hangs on a dead daemon.
  void Fail(const Status& failure) {
    const Status dead(Code::kUnavailable,
                      "flexnpu daemon at " + path_ + ": connection lost (" +
                          (failure.message() == "closed" ? std::string("the daemon closed it")
                                                         : failure.message()) +
                          "); is the daemon running?");
    std::map<int64_t, std::shared_ptr<RemoteEvent>> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!dead_.ok()) return;
      dead_ = dead;
      for (auto& [id, pending] : pending_) {
        pending->status = dead;
        pending->done = true;
      }
      events.swap(events_);
    }
    cv_.notify_all();
    Callbacks callbacks;
    for (auto& [id, event] : events) Complete(event, dead, nullptr, &callbacks);
    Run(callbacks);
  }

  // Under role_mu_: frees the role and makes sure a reader thread will take it.
  void ReleaseRoleLocked() {
    role_taken_ = false;
    in_callbacks_ = false;  // the next holder starts by reading; the old one's callbacks are its own
    if (idle_readers_ > 0) {
      role_cv_.notify_one();
    } else {
      SpawnReaderLocked();
    }
  }
  void SpawnReader() {
    std::lock_guard<std::mutex> lock(role_mu_);
    SpawnReaderLocked();
  }
  void SpawnReaderLocked() {
    ++idle_readers_;  // counted before it runs, so no second one is spawned for the same need
    // The reader keeps the connection alive until the socket closes (Close, or the daemon):
    // callbacks run on it, and one may drop the last other reference.
    std::thread([self = shared_from_this()] { self->ReadLoop(); }).detach();
  }

  // A reader thread: takes the role when it is free, reads and routes until the connection
  // fails, and parks again when a callback it ran lost the role (at most one thread parks).
  void ReadLoop() {
    t_reader_of = this;
    std::unique_lock<std::mutex> role(role_mu_);
    for (;;) {
      role_cv_.wait(role, [&] { return !role_taken_ || closed_ || idle_readers_ > 1; });
      if (closed_ || role_taken_) break;  // the connection ended, or another one is parked
      --idle_readers_;
      role_taken_ = true;
      t_role_epoch = ++role_epoch_;
      role.unlock();
      bool holds = true;
      while (holds) {
        Frame frame;
        Status s = Receive(&frame);
        if (!s.ok()) {
          Fail(s);
          role.lock();
          closed_ = true;
          role_taken_ = false;
          role_cv_.notify_all();
          t_reader_of = nullptr;
          return;
        }
        Callbacks callbacks;
        Route(std::move(frame), &callbacks);
        if (callbacks.empty()) continue;
        role.lock();
        in_callbacks_ = true;
        callbacks_since_ = std::chrono::steady_clock::now();
        role.unlock();
        if (g_callbacks_running++ == 0) WakeWatchdog();
        Run(callbacks);
        role.lock();
        --g_callbacks_running;
        // Only the holder's flag: a thread that lost the role must not clear its successor's.
        holds = role_taken_ && role_epoch_ == t_role_epoch;
        if (holds) {
          in_callbacks_ = false;
          role.unlock();
        }
      }
      ++idle_readers_;  // lost the role while running callbacks: park (role_mu_ held)
    }
    --idle_readers_;
    t_reader_of = nullptr;
  }

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

// One process-wide thread that takes the reading role from callbacks that run too long.
// Ticks every kCallbackStallMs while some reader runs callbacks; sleeps (no ticks) otherwise.
struct Watchdog {
  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::weak_ptr<Connection>> connections;
  bool running = false;
  std::atomic<bool> idle{false};  // asleep until a reader runs callbacks
};
Watchdog& TheWatchdog() {
  static Watchdog* w = new Watchdog();  // never destroyed: its thread may outlive main
  return *w;
}

// Called by a reader after it counted itself in g_callbacks_running (seq_cst, like `idle`:
// either this sees the watchdog idle and wakes it, or the watchdog sees the count).
void WakeWatchdog() {
  Watchdog& w = TheWatchdog();
  if (!w.idle.load()) return;
  std::lock_guard<std::mutex> lock(w.mu);
  w.cv.notify_all();
}

void StartWatchdog(std::weak_ptr<Connection> connection) {
  Watchdog* w = &TheWatchdog();
  std::lock_guard<std::mutex> lock(w->mu);
  w->connections.push_back(std::move(connection));
  if (w->running) return;
  w->running = true;
  std::thread([w] {
    std::unique_lock<std::mutex> lock(w->mu);
    while (!w->connections.empty()) {
      w->idle = true;
      w->cv.wait(lock, [] { return g_callbacks_running.load() > 0; });
      w->idle = false;
      w->cv.wait_for(lock, std::chrono::milliseconds(kCallbackStallMs));
      std::vector<std::shared_ptr<Connection>> live;
      for (auto it = w->connections.begin(); it != w->connections.end();) {
        std::shared_ptr<Connection> c = it->lock();
        if (c == nullptr || c->dead()) {
          it = w->connections.erase(it);
        } else {
          live.push_back(std::move(c));
          ++it;
        }
      }
      lock.unlock();
      const auto now = std::chrono::steady_clock::now();
      for (const auto& c : live) c->CheckStalledCallbacks(now);
      live.clear();  // may destroy a connection: outside the lock
      lock.lock();
    }
    w->running = false;
  }).detach();
}

// ---------------------------------------------------------------------------------------
// Topology and handles

struct RemoteClient;

struct RemoteMemory {
  int64_t index = 0;
  int64_t id = 0;
  std::string kind;
  int64_t kind_id = 0;
  std::string debug;
  std::vector<PJRT_Device*> devices;
};

struct RemoteDevice {
  RemoteClient* client = nullptr;
  int64_t index = 0;
  int64_t id = 0;
  int64_t local_hardware_id = 0;
  std::string kind;
  std::string debug;
  RemoteMemory* default_memory = nullptr;
  std::vector<PJRT_Memory*> memories;
};

struct RemoteClient {
  std::shared_ptr<Connection> connection;
  int64_t session = 0;
  bool one_way = false;  // the daemon offers one-way Execute/BufferFromHost (no quota)
  std::atomic<int64_t> next_output_id{-1};  // buffers named by this process: negative ids
  // Descriptions of transferred buffers by (type, dims, strides, device, memory), learnt from
  // the first synchronous transfer of each: later ones are one-way.
  std::mutex transfers_mu;
  std::map<std::vector<int64_t>, BufferMeta> transfers;
  std::string platform_name;
  std::string platform_version;
  std::vector<std::unique_ptr<RemoteDevice>> devices;
  std::vector<PJRT_Device*> device_handles;
  std::map<int64_t, std::unique_ptr<RemoteMemory>> memories;  // by daemon memory index
  std::vector<PJRT_Memory*> memory_handles;

  RemoteMemory* Memory(int64_t index) const {
    auto it = memories.find(index);
    return it == memories.end() ? nullptr : it->second.get();
  }
  RemoteDevice* DeviceOfIndex(int64_t index) const {
    for (const auto& d : devices) {
      if (d->index == index) return d.get();
    }
    return nullptr;
  }
};

struct RemoteBuffer {
  RemoteClient* client = nullptr;
  std::shared_ptr<Connection> connection;  // outlives the client if the buffer does
  BufferMeta meta;
  std::atomic<bool> deleted{false};
  // Made from a shared segment (the daemon's CPU backend may alias it zero-copy): part of the
  // key of one-way executions, whose donation may differ with it.
  bool zero_copy = false;
  // One-way executions that should consume this buffer (as their first execution of the same
  // key did): whether one did is known at its completion push (RemoteEvent::donated), which
  // IsDeleted waits for. (execution event, argument position)
  std::mutex pending_mu;
  std::vector<std::pair<std::shared_ptr<RemoteEvent>, int64_t>> pending_donations;
  // For execution outputs: the execution's completion, which is also their readiness (asked
  // locally, without a round trip); null for other buffers.
  std::shared_ptr<RemoteEvent> ready;
  // Storage the layout query points into.
  std::vector<int64_t> tile_dims;
  std::vector<size_t> tile_dim_sizes;
};

// What an execution of a static-shaped executable makes, learnt from its first (synchronous)
// execution with the same devices and donation options: later ones are one-way.
struct ExecuteTemplate {
  std::vector<BufferMeta> outputs;  // device-major; ids unused
  std::vector<int64_t> donated;     // argument positions consumed
};

struct RemoteExecutableState {
  RemoteClient* client = nullptr;
  std::shared_ptr<Connection> connection;
  ExecutableMeta meta;
  std::vector<PJRT_Device*> devices;
  std::mutex templates_mu;
  std::map<std::vector<int64_t>, ExecuteTemplate> templates;  // by ExecuteKey
  std::mutex mu;
  bool have_program = false;
  std::string program_code;
  std::string program_format;
};

struct RemoteLoadedExecutable {
  std::shared_ptr<RemoteExecutableState> state;
  std::atomic<bool> deleted{false};
};

struct RemoteExecutable {
  std::shared_ptr<RemoteExecutableState> state;
};

struct RemoteSerialized {
  std::string bytes;
};

template <typename T, typename H>
T* From(H* handle) {
  return reinterpret_cast<T*>(handle);
}
template <typename H, typename T>
H* To(T* object) {
  return reinterpret_cast<H*>(object);
}

// The socket and tenant of this process's daemon backend (one per process).
std::mutex g_config_mu;
std::string g_socket_path;

// The memory index of `memory`, or -1.
int64_t MemoryIndex(PJRT_Memory* memory) {
  return memory == nullptr ? -1 : From<RemoteMemory>(memory)->index;
}

StatusOr<RemoteBuffer*> NewBuffer(RemoteClient* client, IntCursor* cursor) {
  auto buffer = std::make_unique<RemoteBuffer>();
  buffer->client = client;
  buffer->connection = client->connection;
  if (!ReadBufferMeta(cursor, &buffer->meta)) {
    return Internal("flexnpu daemon at " + client->connection->path() +
                    ": malformed buffer description in a reply");
  }
  return buffer.release();
}

StatusOr<RemoteLoadedExecutable*> NewLoaded(RemoteClient* client, const Frame& reply) {
  auto state = std::make_shared<RemoteExecutableState>();
  state->client = client;
  state->connection = client->connection;
  IntCursor cursor(reply.ints);
  if (!ReadExecutableMeta(&cursor, &state->meta) || reply.blobs.empty()) {
    return Internal("flexnpu daemon: malformed executable description in a reply");
  }
  state->meta.name = reply.blobs[0];
  for (int64_t index : state->meta.devices) {
    RemoteDevice* device = client->DeviceOfIndex(index);
    if (device == nullptr) return Internal("flexnpu daemon: executable on an unknown device");
    state->devices.push_back(To<PJRT_Device>(device));
  }
  auto* loaded = new RemoteLoadedExecutable();
  loaded->state = std::move(state);
  return loaded;
}

Status BadReply(const RemoteClient* client, const char* what) {
  return Internal("flexnpu daemon at " + client->connection->path() + ": malformed reply to " +
                  what);
}

// ---------------------------------------------------------------------------------------
// Slots

void Error_Destroy_(PJRT_Error_Destroy_Args* a) { delete From<RemoteError>(a->error); }
void Error_Message_(PJRT_Error_Message_Args* a) {
  const auto* e = reinterpret_cast<const RemoteError*>(a->error);
  a->message = e->status.message().data();
  a->message_size = e->status.message().size();
}
PJRT_Error* Error_GetCode_(PJRT_Error_GetCode_Args* a) {
  a->code = static_cast<PJRT_Error_Code>(
      reinterpret_cast<const RemoteError*>(a->error)->status.code());
  return nullptr;
}
PJRT_Error* Plugin_Initialize_(PJRT_Plugin_Initialize_Args*) { return nullptr; }
PJRT_Error* Plugin_Attributes_(PJRT_Plugin_Attributes_Args* a) {
  a->attributes = nullptr;
  a->num_attributes = 0;
  return nullptr;
}

PJRT_Error* Event_Destroy_(PJRT_Event_Destroy_Args* a) {
  delete From<EventHandle>(a->event);
  return nullptr;
}
PJRT_Error* Event_IsReady_(PJRT_Event_IsReady_Args* a) {
  RemoteEvent& e = *From<EventHandle>(a->event)->event;
  std::lock_guard<std::mutex> lock(e.mu);
  a->is_ready = e.ready;
  return nullptr;
}
PJRT_Error* Event_Error_(PJRT_Event_Error_Args* a) {
  RemoteEvent& e = *From<EventHandle>(a->event)->event;
  std::lock_guard<std::mutex> lock(e.mu);
  if (!e.ready) return ToError(FailedPrecondition("PJRT_Event_Error: the event is not ready"));
  return ToError(e.status);
}
// Waits for `e`; on its connection's reader thread (a callback), another thread takes over
// reading first, so the push it waits for is read.
void AwaitEvent(RemoteEvent& e) {
  Connection::ReleaseReading(e.owner);  // a no-op off its reader thread
  std::unique_lock<std::mutex> lock(e.mu);
  e.cv.wait(lock, [&] { return e.ready; });
}

PJRT_Error* Event_Await_(PJRT_Event_Await_Args* a) {
  RemoteEvent& e = *From<EventHandle>(a->event)->event;
  AwaitEvent(e);
  std::lock_guard<std::mutex> lock(e.mu);
  return ToError(e.status);
}

PJRT_Error* Event_OnReady_(PJRT_Event_OnReady_Args* a) {
  std::shared_ptr<RemoteEvent> e = From<EventHandle>(a->event)->event;
  Status status;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    if (!e->ready) {
      e->callbacks.emplace_back(a->callback, a->user_arg);
      return nullptr;
    }
    status = e->status;
  }
  a->callback(ToError(status), a->user_arg);
  return nullptr;
}

PJRT_Event* ReadyEvent(Status status = Status::Ok()) {
  auto e = std::make_shared<RemoteEvent>();
  e->ready = true;
  e->status = std::move(status);
  return To<PJRT_Event>(new EventHandle{std::move(e)});
}

PJRT_Error* Client_Create_(PJRT_Client_Create_Args* a) {
  return Run([&]() -> Status {
    std::string path;
    {
      std::lock_guard<std::mutex> lock(g_config_mu);
      path = g_socket_path;
    }
    auto connection = Connection::Open(path);
    if (!connection.ok()) return connection.status();
    // Until the client owns it: a failed handshake closes the session.
    struct CloseUnlessKept {
      Connection* c;
      ~CloseUnlessKept() {
        if (c != nullptr) c->Close();
      }
    } close_unless_kept{connection->get()};
    Frame hello;
    hello.op = kHello;
    hello.ints = {kProtocolVersion, 0};
    // The tenant: create option "tenant" (FlexNPU's runtime passes its own tenant option,
    // FLEXNPU_TENANT included, this way), else FLEXNPU_TENANT for a direct user of this API.
    if (const char* tenant = std::getenv("FLEXNPU_TENANT")) hello.text = tenant;
    for (size_t i = 0; i < a->num_options; ++i) {
      const PJRT_NamedValue& option = a->create_options[i];
      if (std::string_view(option.name, option.name_size) != "tenant") continue;
      if (option.type != PJRT_NamedValue_kString) {
        return InvalidArgument("flexnpu daemon client: create option 'tenant' must be a string");
      }
      hello.text.assign(option.string_value, option.value_size);
    }
    auto reply = (*connection)->Call(std::move(hello));
    if (!reply.ok()) return reply.status();
    auto client = std::make_unique<RemoteClient>();
    client->connection = *connection;
    // ints: [session, num_memories, (index, id, kind_id)..., num_devices,
    //        (index, id, local_hw, default_memory, memories list)...]
    // blobs: [platform, version, memory kinds..., device kinds...]
    IntCursor c(reply->ints);
    int64_t num_memories, num_devices;
    if (!c.Next(&client->session) || !c.Next(&num_memories) || num_memories < 0 ||
        reply->blobs.size() < 2 + static_cast<size_t>(num_memories)) {
      return BadReply(client.get(), "Hello");
    }
    client->platform_name = reply->blobs[0];
    client->platform_version = reply->blobs[1];
    for (int64_t m = 0; m < num_memories; ++m) {
      auto memory = std::make_unique<RemoteMemory>();
      if (!c.Next(&memory->index) || !c.Next(&memory->id) || !c.Next(&memory->kind_id)) {
        return BadReply(client.get(), "Hello");
      }
      memory->kind = reply->blobs[2 + m];
      memory->debug = "daemon memory " + std::to_string(memory->id) + " (" + memory->kind + ")";
      client->memory_handles.push_back(To<PJRT_Memory>(memory.get()));
      client->memories[memory->index] = std::move(memory);
    }
    if (!c.Next(&num_devices) || num_devices <= 0 ||
        reply->blobs.size() < 2 + static_cast<size_t>(num_memories + num_devices)) {
      return BadReply(client.get(), "Hello");
    }
    for (int64_t d = 0; d < num_devices; ++d) {
      auto device = std::make_unique<RemoteDevice>();
      device->client = client.get();
      int64_t default_memory;
      std::vector<int64_t> memories;
      if (!c.Next(&device->index) || !c.Next(&device->id) || !c.Next(&device->local_hardware_id) ||
          !c.Next(&default_memory) || !c.List(&memories)) {
        return BadReply(client.get(), "Hello");
      }
      device->kind = reply->blobs[2 + num_memories + d];
      device->debug = "daemon device " + std::to_string(device->id) + " (" + device->kind + ")";
      device->default_memory = client->Memory(default_memory);
      for (int64_t m : memories) {
        RemoteMemory* memory = client->Memory(m);
        if (memory == nullptr) return BadReply(client.get(), "Hello");
        device->memories.push_back(To<PJRT_Memory>(memory));
        memory->devices.push_back(To<PJRT_Device>(device.get()));
      }
      client->device_handles.push_back(To<PJRT_Device>(device.get()));
      client->devices.push_back(std::move(device));
    }
    int64_t one_way = 0;
    client->one_way = c.Next(&one_way) && one_way == 1;
    a->client = To<PJRT_Client>(client.release());
    close_unless_kept.c = nullptr;
    return Status::Ok();
  });
}

PJRT_Error* Client_Destroy_(PJRT_Client_Destroy_Args* a) {
  RemoteClient* client = From<RemoteClient>(a->client);
  client->connection->Close();  // ends the session; buffers outliving it are gone with it
  delete client;
  return nullptr;
}
PJRT_Error* Client_PlatformName_(PJRT_Client_PlatformName_Args* a) {
  const RemoteClient* c = From<RemoteClient>(a->client);
  a->platform_name = c->platform_name.data();
  a->platform_name_size = c->platform_name.size();
  return nullptr;
}
PJRT_Error* Client_PlatformVersion_(PJRT_Client_PlatformVersion_Args* a) {
  const RemoteClient* c = From<RemoteClient>(a->client);
  a->platform_version = c->platform_version.data();
  a->platform_version_size = c->platform_version.size();
  return nullptr;
}
PJRT_Error* Client_ProcessIndex_(PJRT_Client_ProcessIndex_Args* a) {
  a->process_index = 0;
  return nullptr;
}
PJRT_Error* Client_Devices_(PJRT_Client_Devices_Args* a) {
  const RemoteClient* c = From<RemoteClient>(a->client);
  a->devices = c->device_handles.data();
  a->num_devices = c->device_handles.size();
  return nullptr;
}
PJRT_Error* Client_AddressableDevices_(PJRT_Client_AddressableDevices_Args* a) {
  const RemoteClient* c = From<RemoteClient>(a->client);
  a->addressable_devices = c->device_handles.data();
  a->num_addressable_devices = c->device_handles.size();
  return nullptr;
}
PJRT_Error* Client_AddressableMemories_(PJRT_Client_AddressableMemories_Args* a) {
  const RemoteClient* c = From<RemoteClient>(a->client);
  a->addressable_memories = c->memory_handles.data();
  a->num_addressable_memories = c->memory_handles.size();
  return nullptr;
}

// Device descriptions are the devices themselves.
PJRT_Error* DeviceDescription_Id_(PJRT_DeviceDescription_Id_Args* a) {
  a->id = static_cast<int>(From<RemoteDevice>(a->device_description)->id);
  return nullptr;
}
PJRT_Error* DeviceDescription_ProcessIndex_(PJRT_DeviceDescription_ProcessIndex_Args* a) {
  a->process_index = 0;
  return nullptr;
}
PJRT_Error* DeviceDescription_Attributes_(PJRT_DeviceDescription_Attributes_Args* a) {
  a->attributes = nullptr;
  a->num_attributes = 0;
  return nullptr;
}
PJRT_Error* DeviceDescription_Kind_(PJRT_DeviceDescription_Kind_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device_description);
  a->device_kind = d->kind.data();
  a->device_kind_size = d->kind.size();
  return nullptr;
}
PJRT_Error* DeviceDescription_DebugString_(PJRT_DeviceDescription_DebugString_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device_description);
  a->debug_string = d->debug.data();
  a->debug_string_size = d->debug.size();
  return nullptr;
}
PJRT_Error* DeviceDescription_ToString_(PJRT_DeviceDescription_ToString_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device_description);
  a->to_string = d->debug.data();
  a->to_string_size = d->debug.size();
  return nullptr;
}
PJRT_Error* Device_GetDescription_(PJRT_Device_GetDescription_Args* a) {
  a->device_description = reinterpret_cast<PJRT_DeviceDescription*>(a->device);
  return nullptr;
}
PJRT_Error* Device_IsAddressable_(PJRT_Device_IsAddressable_Args* a) {
  a->is_addressable = true;
  return nullptr;
}
PJRT_Error* Device_LocalHardwareId_(PJRT_Device_LocalHardwareId_Args* a) {
  a->local_hardware_id = static_cast<int>(From<RemoteDevice>(a->device)->local_hardware_id);
  return nullptr;
}
PJRT_Error* Device_AddressableMemories_(PJRT_Device_AddressableMemories_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device);
  a->memories = d->memories.data();
  a->num_memories = d->memories.size();
  return nullptr;
}
PJRT_Error* Device_DefaultMemory_(PJRT_Device_DefaultMemory_Args* a) {
  const RemoteDevice* d = From<RemoteDevice>(a->device);
  if (d->default_memory == nullptr) {
    return ToError(NotFound("daemon device " + std::to_string(d->id) + " has no default memory"));
  }
  a->memory = To<PJRT_Memory>(d->default_memory);
  return nullptr;
}

PJRT_Error* Memory_Id_(PJRT_Memory_Id_Args* a) {
  a->id = static_cast<int>(From<RemoteMemory>(a->memory)->id);
  return nullptr;
}
PJRT_Error* Memory_Kind_(PJRT_Memory_Kind_Args* a) {
  const RemoteMemory* m = From<RemoteMemory>(a->memory);
  a->kind = m->kind.data();
  a->kind_size = m->kind.size();
  return nullptr;
}
PJRT_Error* Memory_Kind_Id_(PJRT_Memory_Kind_Id_Args* a) {
  a->kind_id = static_cast<int>(From<RemoteMemory>(a->memory)->kind_id);
  return nullptr;
}
PJRT_Error* Memory_DebugString_(PJRT_Memory_DebugString_Args* a) {
  const RemoteMemory* m = From<RemoteMemory>(a->memory);
  a->debug_string = m->debug.data();
  a->debug_string_size = m->debug.size();
  return nullptr;
}
PJRT_Error* Memory_ToString_(PJRT_Memory_ToString_Args* a) {
  const RemoteMemory* m = From<RemoteMemory>(a->memory);
  a->to_string = m->debug.data();
  a->to_string_size = m->debug.size();
  return nullptr;
}
PJRT_Error* Memory_AddressableByDevices_(PJRT_Memory_AddressableByDevices_Args* a) {
  const RemoteMemory* m = From<RemoteMemory>(a->memory);
  a->devices = m->devices.data();
  a->num_devices = m->devices.size();
  return nullptr;
}

// Host bytes spanned by an array of `dims` with `byte_strides` (dense when empty).
StatusOr<size_t> HostBytes(int type, const int64_t* dims, size_t num_dims,
                           const int64_t* byte_strides, size_t num_strides) {
  const size_t element = HostElementBytes(type);
  if (element == 0) {
    return InvalidArgument("PJRT_Client_BufferFromHostBuffer over the daemon: element type " +
                           std::to_string(type) + " has no host representation");
  }
  size_t count = 1;
  for (size_t i = 0; i < num_dims; ++i) {
    if (dims[i] < 0) return InvalidArgument("negative dimension in BufferFromHostBuffer");
    count *= static_cast<size_t>(dims[i]);
  }
  if (count == 0) return size_t{0};
  if (byte_strides == nullptr || num_strides == 0) return count * element;
  if (num_strides != num_dims) {
    return InvalidArgument("BufferFromHostBuffer: " + std::to_string(num_strides) +
                           " byte strides for " + std::to_string(num_dims) + " dimensions");
  }
  size_t extent = element;
  for (size_t i = 0; i < num_dims; ++i) {
    if (byte_strides[i] < 0) return InvalidArgument("negative byte stride in BufferFromHostBuffer");
    extent += static_cast<size_t>(dims[i] - 1) * static_cast<size_t>(byte_strides[i]);
  }
  return extent;
}

PJRT_Error* Client_BufferFromHostBuffer_(PJRT_Client_BufferFromHostBuffer_Args* a) {
  return Run([&]() -> Status {
    RemoteClient* client = From<RemoteClient>(a->client);
    if (a->device_layout != nullptr) {
      return Unimplemented("PJRT_Client_BufferFromHostBuffer over the flexnpu daemon: a device "
                           "layout is not supported");
    }
    auto bytes = HostBytes(a->type, a->dims, a->num_dims, a->byte_strides, a->num_byte_strides);
    if (!bytes.ok()) return bytes.status();
    Frame request;
    request.op = kBufferFromHost;
    request.ints.push_back(a->type);
    AppendList(&request.ints, a->dims, a->num_dims);
    AppendList(&request.ints, a->byte_strides, a->byte_strides ? a->num_byte_strides : 0);
    request.ints.push_back(a->device ? From<RemoteDevice>(a->device)->index : -1);
    request.ints.push_back(MemoryIndex(a->memory));
    const bool inline_payload = *bytes <= kInlinePayloadBytes;
    request.ints.push_back(inline_payload ? 1 : 0);
    request.ints.push_back(static_cast<int64_t>(*bytes));
    const std::vector<int64_t> key(request.ints.begin(), request.ints.end() - 2);
    std::optional<BufferMeta> known;
    if (client->one_way) {
      std::lock_guard<std::mutex> lock(client->transfers_mu);
      auto it = client->transfers.find(key);
      if (it != client->transfers.end()) known = it->second;
    }
    std::vector<int> fds;
    SharedSegment segment;
    if (inline_payload) {
      request.blobs.emplace_back(static_cast<const char*>(a->data), *bytes);
    } else {
      auto created = SharedSegment::Create(*bytes, "flexnpu-h2d");
      if (!created.ok()) return created.status();
      segment = std::move(*created);
      std::memcpy(segment.data(), a->data, *bytes);
      fds.push_back(segment.fd());
    }
    // The bytes are copied (into the frame or the segment) before this returns.
    a->done_with_host_buffer = nullptr;
    if (known) {
      // One-way: this process names the buffer; a failure makes the id name the error.
      known->id = client->next_output_id.fetch_sub(1);
      request.ints.push_back(known->id);
      FLEXNPU_RETURN_IF_ERROR(client->connection->Post(std::move(request), fds));
      auto* buffer = new RemoteBuffer();
      buffer->client = client;
      buffer->connection = client->connection;
      buffer->meta = std::move(*known);
      buffer->zero_copy = !inline_payload;
      a->buffer = To<PJRT_Buffer>(buffer);
      a->done_with_host_buffer = ReadyEvent();
      return Status::Ok();
    }
    request.ints.push_back(0);  // the daemon names it in the reply
    auto reply = client->connection->Call(std::move(request), fds);
    if (!reply.ok()) return reply.status();
    IntCursor cursor(reply->ints);
    auto buffer = NewBuffer(client, &cursor);
    if (!buffer.ok()) return buffer.status();
    if (client->one_way && (*buffer)->meta.dynamic_dims.empty()) {
      std::lock_guard<std::mutex> lock(client->transfers_mu);
      if (client->transfers.size() < 4096) client->transfers.emplace(key, (*buffer)->meta);
    }
    (*buffer)->zero_copy = !inline_payload;
    a->buffer = To<PJRT_Buffer>(*buffer);
    a->done_with_host_buffer = ReadyEvent();
    return Status::Ok();
  });
}

PJRT_Error* Buffer_Destroy_(PJRT_Buffer_Destroy_Args* a) {
  RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  Frame request;
  request.op = kBufferDestroy;
  request.ints = {b->meta.id};
  (void)b->connection->Post(std::move(request));  // a dead daemon has dropped it already
  delete b;
  return nullptr;
}
PJRT_Error* Buffer_ElementType_(PJRT_Buffer_ElementType_Args* a) {
  a->type = static_cast<PJRT_Buffer_Type>(From<RemoteBuffer>(a->buffer)->meta.type);
  return nullptr;
}
PJRT_Error* Buffer_Dimensions_(PJRT_Buffer_Dimensions_Args* a) {
  const RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  a->dims = b->meta.dims.data();
  a->num_dims = b->meta.dims.size();
  return nullptr;
}
PJRT_Error* Buffer_UnpaddedDimensions_(PJRT_Buffer_UnpaddedDimensions_Args* a) {
  const RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  a->unpadded_dims = b->meta.dims.data();
  a->num_dims = b->meta.dims.size();
  return nullptr;
}
PJRT_Error* Buffer_DynamicDimensionIndices_(PJRT_Buffer_DynamicDimensionIndices_Args* a) {
  const RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  a->dynamic_dim_indices = reinterpret_cast<const size_t*>(b->meta.dynamic_dims.data());
  a->num_dynamic_dims = b->meta.dynamic_dims.size();
  return nullptr;
}
PJRT_Error* Buffer_GetMemoryLayout_(PJRT_Buffer_GetMemoryLayout_Args* a) {
  RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  const BufferMeta& m = b->meta;
  if (m.layout_type < 0) {
    return ToError(Unimplemented("PJRT_Buffer_GetMemoryLayout: the daemon's backend gave no "
                                 "layout for this buffer"));
  }
  a->layout = PJRT_Buffer_MemoryLayout{};
  a->layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
  a->layout.type = static_cast<PJRT_Buffer_MemoryLayout_Type>(m.layout_type);
  if (a->layout.type == PJRT_Buffer_MemoryLayout_Type_Strides) {
    a->layout.strides.struct_size = PJRT_Buffer_MemoryLayout_Strides_STRUCT_SIZE;
    a->layout.strides.byte_strides = m.byte_strides.data();
    a->layout.strides.num_byte_strides = m.byte_strides.size();
    return nullptr;
  }
  if (b->tile_dim_sizes.size() != m.tiles.size()) {
    b->tile_dims.clear();
    b->tile_dim_sizes.clear();
    for (const auto& tile : m.tiles) {
      b->tile_dims.insert(b->tile_dims.end(), tile.begin(), tile.end());
      b->tile_dim_sizes.push_back(tile.size());
    }
  }
  a->layout.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
  a->layout.tiled.minor_to_major = m.minor_to_major.data();
  a->layout.tiled.minor_to_major_size = m.minor_to_major.size();
  a->layout.tiled.tile_dims = b->tile_dims.data();
  a->layout.tiled.tile_dim_sizes = b->tile_dim_sizes.data();
  a->layout.tiled.num_tiles = b->tile_dim_sizes.size();
  return nullptr;
}
PJRT_Error* Buffer_OnDeviceSizeInBytes_(PJRT_Buffer_OnDeviceSizeInBytes_Args* a) {
  a->on_device_size_in_bytes = static_cast<size_t>(From<RemoteBuffer>(a->buffer)->meta.on_device_size);
  return nullptr;
}
PJRT_Error* Buffer_Memory_(PJRT_Buffer_Memory_Args* a) {
  const RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  RemoteMemory* m = b->client->Memory(b->meta.memory);
  if (m == nullptr) return ToError(NotFound("buffer's memory is not visible to this session"));
  a->memory = To<PJRT_Memory>(m);
  return nullptr;
}
PJRT_Error* Buffer_Device_(PJRT_Buffer_Device_Args* a) {
  const RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  RemoteMemory* m = b->client->Memory(b->meta.memory);
  if (m == nullptr || m->devices.empty()) {
    return ToError(NotFound("buffer's device is not visible to this session"));
  }
  a->device = m->devices[0];
  return nullptr;
}
PJRT_Error* Buffer_IsOnCpu_(PJRT_Buffer_IsOnCpu_Args* a) {
  a->is_on_cpu = false;  // its memory is in the daemon: no pointer into it is usable here
  return nullptr;
}

PJRT_Error* Buffer_Delete_(PJRT_Buffer_Delete_Args* a) {
  return Run([&]() -> Status {
    RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
    Frame request;
    request.op = kBufferDelete;
    request.ints = {b->meta.id};
    auto reply = b->client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    b->deleted = true;
    return Status::Ok();
  });
}
// A buffer is deleted only by Buffer_Delete or by donation to an execution, whose reply (or,
// one-way, its completion push) lists the donated arguments: known here without asking. A
// buffer given to a one-way execution that should consume it waits for that push.
PJRT_Error* Buffer_IsDeleted_(PJRT_Buffer_IsDeleted_Args* a) {
  RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  std::vector<std::pair<std::shared_ptr<RemoteEvent>, int64_t>> pending;
  {
    std::lock_guard<std::mutex> lock(b->pending_mu);
    pending = b->pending_donations;
  }
  for (auto& [event, position] : pending) {
    AwaitEvent(*event);
    const std::vector<int64_t>& donated = event->donated;  // set before it turned ready
    if (std::find(donated.begin(), donated.end(), position) != donated.end()) b->deleted = true;
  }
  if (!pending.empty()) {
    // Exactly the entries checked here: another thread may have checked (and erased) some of
    // them meanwhile, and an execution may have added new ones behind them.
    std::lock_guard<std::mutex> lock(b->pending_mu);
    auto& list = b->pending_donations;
    for (const auto& checked : pending) {
      auto it = std::find(list.begin(), list.end(), checked);
      if (it != list.end()) list.erase(it);
    }
  }
  a->is_deleted = b->deleted.load();
  return nullptr;
}

PJRT_Error* Buffer_ReadyEvent_(PJRT_Buffer_ReadyEvent_Args* a) {
  return Run([&]() -> Status {
    RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
    if (b->ready != nullptr) {
      a->event = To<PJRT_Event>(new EventHandle{b->ready});
      return Status::Ok();
    }
    Connection& c = *b->client->connection;
    auto [id, event] = c.NewEvent();
    Frame request;
    request.op = kBufferReadyEvent;
    request.ints = {b->meta.id, id};
    auto reply = c.Call(std::move(request));
    if (!reply.ok()) {
      c.DropEvent(id);
      return reply.status();
    }
    a->event = To<PJRT_Event>(new EventHandle{event});
    return Status::Ok();
  });
}

PJRT_Error* Buffer_ToHostBuffer_(PJRT_Buffer_ToHostBuffer_Args* a) {
  return Run([&]() -> Status {
    RemoteBuffer* b = From<RemoteBuffer>(a->src);
    Connection& c = *b->client->connection;
    Layout host_layout;
    if (const PJRT_Buffer_MemoryLayout* l = a->host_layout) {
      host_layout.type = l->type;
      if (l->type == PJRT_Buffer_MemoryLayout_Type_Strides) {
        host_layout.byte_strides.assign(l->strides.byte_strides,
                                        l->strides.byte_strides + l->strides.num_byte_strides);
      } else {
        const auto& t = l->tiled;
        host_layout.minor_to_major.assign(t.minor_to_major,
                                          t.minor_to_major + t.minor_to_major_size);
        size_t offset = 0;
        for (size_t i = 0; i < t.num_tiles; ++i) {
          host_layout.tiles.emplace_back(t.tile_dims + offset,
                                         t.tile_dims + offset + t.tile_dim_sizes[i]);
          offset += t.tile_dim_sizes[i];
        }
      }
    }
    if (a->dst == nullptr) {
      Frame request;
      request.op = kBufferToHostSize;
      request.ints = {b->meta.id};
      AppendLayout(&request.ints, host_layout);
      auto reply = c.Call(std::move(request));
      if (!reply.ok()) return reply.status();
      if (reply->ints.empty()) return BadReply(b->client, "Buffer_ToHostBuffer");
      a->dst_size = static_cast<size_t>(reply->ints[0]);
      return Status::Ok();
    }
    const size_t size = a->dst_size;
    const bool inline_payload = size <= kInlinePayloadBytes;
    std::shared_ptr<SharedSegment> segment;
    std::vector<int> fds;
    if (!inline_payload) {
      auto created = SharedSegment::Create(size, "flexnpu-d2h");
      if (!created.ok()) return created.status();
      segment = std::make_shared<SharedSegment>(std::move(*created));
      fds.push_back(segment->fd());
    }
    auto [id, event] = c.NewEvent();
    void* dst = a->dst;
    {
      std::lock_guard<std::mutex> lock(event->mu);
      event->on_push = [dst, size, segment](const Frame& push) {
        if (segment != nullptr) {
          std::memcpy(dst, segment->data(), size);
        } else if (!push.blobs.empty()) {
          std::memcpy(dst, push.blobs[0].data(), std::min(size, push.blobs[0].size()));
        }
      };
    }
    Frame request;
    request.op = kBufferToHost;
    request.ints = {b->meta.id, id, static_cast<int64_t>(size), inline_payload ? 1 : 0};
    AppendLayout(&request.ints, host_layout);
    // One-way: the push answers it (with the bytes, or the daemon's error).
    Status sent = c.Post(std::move(request), fds);
    if (!sent.ok()) {
      c.DropEvent(id);
      return sent;
    }
    a->event = To<PJRT_Event>(new EventHandle{event});
    return Status::Ok();
  });
}

PJRT_Error* Buffer_CopyToMemory_(PJRT_Buffer_CopyToMemory_Args* a) {
  return Run([&]() -> Status {
    RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
    Frame request;
    request.op = kBufferCopyToMemory;
    request.ints = {b->meta.id, MemoryIndex(a->dst_memory)};
    auto reply = b->client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    IntCursor cursor(reply->ints);
    auto buffer = NewBuffer(b->client, &cursor);
    if (!buffer.ok()) return buffer.status();
    a->dst_buffer = To<PJRT_Buffer>(*buffer);
    return Status::Ok();
  });
}

PJRT_Error* Client_Compile_(PJRT_Client_Compile_Args* a) {
  return Run([&]() -> Status {
    RemoteClient* client = From<RemoteClient>(a->client);
    Frame request;
    request.op = kCompile;
    request.blobs.emplace_back(a->program->format, a->program->format_size);
    request.blobs.emplace_back(a->program->code, a->program->code_size);
    request.blobs.emplace_back(a->compile_options, a->compile_options_size);
    auto reply = client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    auto loaded = NewLoaded(client, *reply);
    if (!loaded.ok()) return loaded.status();
    a->executable = To<PJRT_LoadedExecutable>(*loaded);
    return Status::Ok();
  });
}

PJRT_Error* Executable_DeserializeAndLoad_(PJRT_Executable_DeserializeAndLoad_Args* a) {
  return Run([&]() -> Status {
    RemoteClient* client = From<RemoteClient>(a->client);
    Frame request;
    request.op = kDeserialize;
    request.blobs.emplace_back(a->serialized_executable, a->serialized_executable_size);
    const bool has_options = a->overridden_serialized_compile_options != nullptr;
    request.blobs.emplace_back(has_options ? a->overridden_serialized_compile_options : "",
                               has_options ? a->overridden_serialized_compile_options_size : 0);
    request.ints = {has_options ? 1 : 0};
    auto reply = client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    auto loaded = NewLoaded(client, *reply);
    if (!loaded.ok()) return loaded.status();
    a->loaded_executable = To<PJRT_LoadedExecutable>(*loaded);
    return Status::Ok();
  });
}

PJRT_Error* LoadedExecutable_Destroy_(PJRT_LoadedExecutable_Destroy_Args* a) {
  RemoteLoadedExecutable* e = From<RemoteLoadedExecutable>(a->executable);
  Frame request;
  request.op = kExecutableDestroy;
  request.ints = {e->state->meta.id};
  (void)e->state->connection->Post(std::move(request));
  delete e;
  return nullptr;
}
PJRT_Error* LoadedExecutable_GetExecutable_(PJRT_LoadedExecutable_GetExecutable_Args* a) {
  a->executable =
      To<PJRT_Executable>(new RemoteExecutable{From<RemoteLoadedExecutable>(a->loaded_executable)->state});
  return nullptr;
}
PJRT_Error* LoadedExecutable_AddressableDevices_(
    PJRT_LoadedExecutable_AddressableDevices_Args* a) {
  const auto& state = *From<RemoteLoadedExecutable>(a->executable)->state;
  a->addressable_devices = const_cast<PJRT_Device* const*>(state.devices.data());
  a->num_addressable_devices = state.devices.size();
  return nullptr;
}
PJRT_Error* LoadedExecutable_Delete_(PJRT_LoadedExecutable_Delete_Args* a) {
  return Run([&]() -> Status {
    RemoteLoadedExecutable* e = From<RemoteLoadedExecutable>(a->executable);
    Frame request;
    request.op = kExecutableDelete;
    request.ints = {e->state->meta.id};
    auto reply = e->state->client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    e->deleted = true;
    return Status::Ok();
  });
}
PJRT_Error* LoadedExecutable_IsDeleted_(PJRT_LoadedExecutable_IsDeleted_Args* a) {
  a->is_deleted = From<RemoteLoadedExecutable>(a->executable)->deleted.load();
  return nullptr;
}

// Marks the arguments an execution consumed (positions device * num_args + arg) deleted.
void MarkDonated(const PJRT_LoadedExecutable_Execute_Args* a,
                 const std::vector<int64_t>& donated) {
  const size_t num_args = std::max<size_t>(a->num_args, 1);
  for (int64_t position : donated) {
    const auto d = static_cast<size_t>(position) / num_args;
    const auto i = static_cast<size_t>(position) % num_args;
    if (position < 0 || d >= a->num_devices) continue;
    From<RemoteBuffer>(a->argument_lists[d][i])->deleted = true;
  }
}

// A one-way execution: the arguments its key's first execution consumed are consumed by this
// one only if the daemon ran it as that one; its completion push says (RemoteEvent::donated).
void ExpectDonated(const PJRT_LoadedExecutable_Execute_Args* a,
                   const std::vector<int64_t>& donated,
                   const std::vector<std::pair<int64_t, std::shared_ptr<RemoteEvent>>>& events) {
  const size_t num_args = std::max<size_t>(a->num_args, 1);
  for (int64_t position : donated) {
    const auto d = static_cast<size_t>(position) / num_args;
    const auto i = static_cast<size_t>(position) % num_args;
    if (position < 0 || d >= a->num_devices || d >= events.size()) continue;
    RemoteBuffer* b = From<RemoteBuffer>(a->argument_lists[d][i]);
    std::lock_guard<std::mutex> lock(b->pending_mu);
    b->pending_donations.emplace_back(events[d].second, position);
  }
}

PJRT_Error* LoadedExecutable_Execute_(PJRT_LoadedExecutable_Execute_Args* a) {
  return Run([&]() -> Status {
    auto& state = *From<RemoteLoadedExecutable>(a->executable)->state;
    RemoteClient* client = state.client;
    Connection& c = *client->connection;
    const PJRT_ExecuteOptions* options = a->options;
    if (options != nullptr && (options->num_send_ops != 0 || options->num_recv_ops != 0)) {
      return Unimplemented("PJRT_LoadedExecutable_Execute over the flexnpu daemon: send/recv "
                           "callbacks are not supported");
    }
    // ints: [exe, num_devices, num_args, launch_id, execute_device, non-donatable list,
    //        argument ids (device-major), event ids list, output ids list (one-way)]
    Frame request;
    request.op = kExecute;
    request.ints = {state.meta.id, static_cast<int64_t>(a->num_devices),
                    static_cast<int64_t>(a->num_args), options ? options->launch_id : 0,
                    a->execute_device ? From<RemoteDevice>(a->execute_device)->index : -1};
    AppendList(&request.ints, options ? options->non_donatable_input_indices : nullptr,
               options ? options->num_non_donatable_input_indices : 0);
    // What decides the outputs' descriptions and the donation: devices and donation options.
    std::vector<int64_t> key(request.ints.begin() + 1, request.ints.end());
    key.erase(key.begin() + 2);  // not the launch id
    for (size_t d = 0; d < a->num_devices; ++d) {
      for (size_t i = 0; i < a->num_args; ++i) {
        const RemoteBuffer* argument = From<RemoteBuffer>(a->argument_lists[d][i]);
        request.ints.push_back(argument->meta.id);
        // Donation depends on an argument's provenance too (an aliased segment is not
        // consumed like an execution's output).
        key.push_back(argument->zero_copy ? 1 : 0);
      }
    }
    // Completion events are always asked for: they also make the outputs' ready events.
    std::vector<std::pair<int64_t, std::shared_ptr<RemoteEvent>>> events;
    for (size_t d = 0; d < a->num_devices; ++d) events.push_back(c.NewEvent());
    request.ints.push_back(static_cast<int64_t>(events.size()));
    for (const auto& e : events) request.ints.push_back(e.first);
    const size_t num_outputs = static_cast<size_t>(state.meta.num_outputs);

    std::optional<ExecuteTemplate> known;
    if (client->one_way) {
      std::lock_guard<std::mutex> lock(state.templates_mu);
      auto it = state.templates.find(key);
      if (it != state.templates.end()) known = it->second;
    }
    if (known) {
      // One-way: this process names the outputs; no round trip before returning.
      std::vector<int64_t> ids(a->num_devices * num_outputs);
      for (int64_t& id : ids) id = client->next_output_id.fetch_sub(1);
      AppendList(&request.ints, ids.data(), ids.size());
      Status sent = c.Post(std::move(request));
      if (!sent.ok()) {
        for (const auto& e : events) c.DropEvent(e.first);
        return sent;
      }
      for (size_t d = 0; d < a->num_devices; ++d) {
        for (size_t o = 0; o < num_outputs; ++o) {
          auto* buffer = new RemoteBuffer();
          buffer->client = client;
          buffer->connection = client->connection;
          buffer->meta = known->outputs[d * num_outputs + o];
          buffer->meta.id = ids[d * num_outputs + o];
          buffer->ready = events[d].second;
          a->output_lists[d][o] = To<PJRT_Buffer>(buffer);
        }
      }
      ExpectDonated(a, known->donated, events);
    } else {
      request.ints.push_back(0);  // no output ids: the reply describes the outputs
      auto reply = c.CallForReply(std::move(request));
      if (!reply.ok()) {
        for (const auto& e : events) c.DropEvent(e.first);
        return reply.status();
      }
      if (reply->code != 0) {
        // Refused after it ran (its outputs could not be kept): the reply lists what it
        // consumed all the same.
        for (const auto& e : events) c.DropEvent(e.first);
        std::vector<int64_t> consumed;
        IntCursor cursor(reply->ints);
        if (cursor.List(&consumed)) MarkDonated(a, consumed);
        return Status(static_cast<Code>(reply->code),
                      "flexnpu daemon at " + c.path() + ": " + reply->text);
      }
      IntCursor cursor(reply->ints);
      std::vector<RemoteBuffer*> outputs;
      ExecuteTemplate learnt;
      bool static_shapes = true;
      for (size_t d = 0; d < a->num_devices; ++d) {
        for (size_t o = 0; o < num_outputs; ++o) {
          auto buffer = NewBuffer(client, &cursor);
          if (!buffer.ok()) {
            for (RemoteBuffer* b : outputs) delete b;
            return buffer.status();
          }
          (*buffer)->ready = events[d].second;
          outputs.push_back(*buffer);
          static_shapes = static_shapes && (*buffer)->meta.dynamic_dims.empty();
          learnt.outputs.push_back((*buffer)->meta);
          a->output_lists[d][o] = To<PJRT_Buffer>(*buffer);
        }
      }
      if (!cursor.List(&learnt.donated)) {
        for (RemoteBuffer* b : outputs) delete b;
        return BadReply(client, "Execute (donated arguments)");
      }
      MarkDonated(a, learnt.donated);
      if (client->one_way && static_shapes) {
        std::lock_guard<std::mutex> lock(state.templates_mu);
        state.templates.emplace(key, std::move(learnt));
      }
    }
    if (a->device_complete_events != nullptr) {
      for (size_t d = 0; d < events.size(); ++d) {
        a->device_complete_events[d] = To<PJRT_Event>(new EventHandle{events[d].second});
      }
    }
    return Status::Ok();
  });
}

PJRT_Error* Executable_Destroy_(PJRT_Executable_Destroy_Args* a) {
  delete From<RemoteExecutable>(a->executable);
  return nullptr;
}
PJRT_Error* Executable_Name_(PJRT_Executable_Name_Args* a) {
  const std::string& name = From<RemoteExecutable>(a->executable)->state->meta.name;
  a->executable_name = name.data();
  a->executable_name_size = name.size();
  return nullptr;
}
PJRT_Error* Executable_NumReplicas_(PJRT_Executable_NumReplicas_Args* a) {
  a->num_replicas = From<RemoteExecutable>(a->executable)->state->meta.num_replicas;
  return nullptr;
}
PJRT_Error* Executable_NumPartitions_(PJRT_Executable_NumPartitions_Args* a) {
  a->num_partitions = From<RemoteExecutable>(a->executable)->state->meta.num_partitions;
  return nullptr;
}
PJRT_Error* Executable_NumOutputs_(PJRT_Executable_NumOutputs_Args* a) {
  a->num_outputs = From<RemoteExecutable>(a->executable)->state->meta.num_outputs;
  return nullptr;
}
PJRT_Error* Executable_GetCompiledMemoryStats_(PJRT_Executable_GetCompiledMemoryStats_Args* a) {
  const ExecutableMeta& m = From<RemoteExecutable>(a->executable)->state->meta;
  if (!m.has_memory_stats) {
    return ToError(Unimplemented("the daemon's backend gave no compiled memory stats"));
  }
  int64_t* out[kMemoryStatsFields] = {
      &a->generated_code_size_in_bytes, &a->argument_size_in_bytes,
      &a->output_size_in_bytes, &a->alias_size_in_bytes, &a->temp_size_in_bytes,
      &a->host_generated_code_size_in_bytes, &a->host_argument_size_in_bytes,
      &a->host_output_size_in_bytes, &a->host_alias_size_in_bytes,
      &a->host_temp_size_in_bytes, &a->peak_memory_in_bytes};
  for (int i = 0; i < kMemoryStatsFields; ++i) *out[i] = m.memory_stats[i];
  return nullptr;
}
PJRT_Error* Executable_OptimizedProgram_(PJRT_Executable_OptimizedProgram_Args* a) {
  return Run([&]() -> Status {
    auto& state = *From<RemoteExecutable>(a->executable)->state;
    std::lock_guard<std::mutex> lock(state.mu);
    if (!state.have_program) {
      Frame request;
      request.op = kOptimizedProgram;
      request.ints = {state.meta.id};
      auto reply = state.client->connection->Call(std::move(request));
      if (!reply.ok()) return reply.status();
      if (reply->blobs.size() < 2) return BadReply(state.client, "Executable_OptimizedProgram");
      state.program_code = std::move(reply->blobs[0]);
      state.program_format = std::move(reply->blobs[1]);
      state.have_program = true;
    }
    PJRT_Program* program = a->program;
    program->format = state.program_format.data();
    program->format_size = state.program_format.size();
    if (program->code == nullptr) {
      program->code_size = state.program_code.size();
      return Status::Ok();
    }
    if (program->code_size < state.program_code.size()) {
      return InvalidArgument("PJRT_Executable_OptimizedProgram: code buffer too small");
    }
    std::memcpy(program->code, state.program_code.data(), state.program_code.size());
    program->code_size = state.program_code.size();
    return Status::Ok();
  });
}
void DeleteSerialized(PJRT_SerializedExecutable* s) {
  delete reinterpret_cast<RemoteSerialized*>(s);
}
PJRT_Error* Executable_Serialize_(PJRT_Executable_Serialize_Args* a) {
  return Run([&]() -> Status {
    auto& state = *reinterpret_cast<const RemoteExecutable*>(a->executable)->state;
    Frame request;
    request.op = kSerialize;
    request.ints = {state.meta.id};
    auto reply = state.client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    if (reply->blobs.empty()) return BadReply(state.client, "Executable_Serialize");
    auto* s = new RemoteSerialized{std::move(reply->blobs[0])};
    a->serialized_bytes = s->bytes.data();
    a->serialized_bytes_size = s->bytes.size();
    a->serialized_executable = reinterpret_cast<PJRT_SerializedExecutable*>(s);
    a->serialized_executable_deleter = DeleteSerialized;
    return Status::Ok();
  });
}

// Contexts only carry FFI user data, which cannot cross processes: an empty one.
struct RemoteContext {};
PJRT_Error* ExecuteContext_Create_(PJRT_ExecuteContext_Create_Args* a) {
  a->context = reinterpret_cast<PJRT_ExecuteContext*>(new RemoteContext());
  return nullptr;
}
PJRT_Error* ExecuteContext_Destroy_(PJRT_ExecuteContext_Destroy_Args* a) {
  delete reinterpret_cast<RemoteContext*>(a->context);
  return nullptr;
}

PJRT_Api BuildApi() {
  PJRT_Api api{};
  api.struct_size = PJRT_Api_STRUCT_SIZE;
  api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
  api.pjrt_api_version.major_version = PJRT_API_MAJOR;
  api.pjrt_api_version.minor_version = PJRT_API_MINOR;
#define FLEXNPU_SLOT(Name) api.PJRT_##Name = Name##_;
  FLEXNPU_SLOT(Error_Destroy)
  FLEXNPU_SLOT(Error_Message)
  FLEXNPU_SLOT(Error_GetCode)
  FLEXNPU_SLOT(Plugin_Initialize)
  FLEXNPU_SLOT(Plugin_Attributes)
  FLEXNPU_SLOT(Event_Destroy)
  FLEXNPU_SLOT(Event_IsReady)
  FLEXNPU_SLOT(Event_Error)
  FLEXNPU_SLOT(Event_Await)
  FLEXNPU_SLOT(Event_OnReady)
  FLEXNPU_SLOT(Client_Create)
  FLEXNPU_SLOT(Client_Destroy)
  FLEXNPU_SLOT(Client_PlatformName)
  FLEXNPU_SLOT(Client_PlatformVersion)
  FLEXNPU_SLOT(Client_ProcessIndex)
  FLEXNPU_SLOT(Client_Devices)
  FLEXNPU_SLOT(Client_AddressableDevices)
  FLEXNPU_SLOT(Client_AddressableMemories)
  FLEXNPU_SLOT(Client_Compile)
  FLEXNPU_SLOT(Client_BufferFromHostBuffer)
  FLEXNPU_SLOT(DeviceDescription_Id)
  FLEXNPU_SLOT(DeviceDescription_ProcessIndex)
  FLEXNPU_SLOT(DeviceDescription_Attributes)
  FLEXNPU_SLOT(DeviceDescription_Kind)
  FLEXNPU_SLOT(DeviceDescription_DebugString)
  FLEXNPU_SLOT(DeviceDescription_ToString)
  FLEXNPU_SLOT(Device_GetDescription)
  FLEXNPU_SLOT(Device_IsAddressable)
  FLEXNPU_SLOT(Device_LocalHardwareId)
  FLEXNPU_SLOT(Device_AddressableMemories)
  FLEXNPU_SLOT(Device_DefaultMemory)
  FLEXNPU_SLOT(Memory_Id)
  FLEXNPU_SLOT(Memory_Kind)
  FLEXNPU_SLOT(Memory_Kind_Id)
  FLEXNPU_SLOT(Memory_DebugString)
  FLEXNPU_SLOT(Memory_ToString)
  FLEXNPU_SLOT(Memory_AddressableByDevices)
  FLEXNPU_SLOT(Executable_Destroy)
  FLEXNPU_SLOT(Executable_NumReplicas)
  FLEXNPU_SLOT(Executable_NumPartitions)
  FLEXNPU_SLOT(Executable_Name)
  FLEXNPU_SLOT(Executable_NumOutputs)
  FLEXNPU_SLOT(Executable_OptimizedProgram)
  FLEXNPU_SLOT(Executable_GetCompiledMemoryStats)
  FLEXNPU_SLOT(Executable_Serialize)
  FLEXNPU_SLOT(Executable_DeserializeAndLoad)
  FLEXNPU_SLOT(LoadedExecutable_Destroy)
  FLEXNPU_SLOT(LoadedExecutable_GetExecutable)
  FLEXNPU_SLOT(LoadedExecutable_AddressableDevices)
  FLEXNPU_SLOT(LoadedExecutable_Delete)
  FLEXNPU_SLOT(LoadedExecutable_IsDeleted)
  FLEXNPU_SLOT(LoadedExecutable_Execute)
  FLEXNPU_SLOT(Buffer_Destroy)
  FLEXNPU_SLOT(Buffer_ElementType)
  FLEXNPU_SLOT(Buffer_Dimensions)
  FLEXNPU_SLOT(Buffer_UnpaddedDimensions)
  FLEXNPU_SLOT(Buffer_DynamicDimensionIndices)
  FLEXNPU_SLOT(Buffer_GetMemoryLayout)
  FLEXNPU_SLOT(Buffer_OnDeviceSizeInBytes)
  FLEXNPU_SLOT(Buffer_Device)
  FLEXNPU_SLOT(Buffer_Memory)
  FLEXNPU_SLOT(Buffer_Delete)
  FLEXNPU_SLOT(Buffer_IsDeleted)
  FLEXNPU_SLOT(Buffer_CopyToMemory)
  FLEXNPU_SLOT(Buffer_ToHostBuffer)
  FLEXNPU_SLOT(Buffer_IsOnCpu)
  FLEXNPU_SLOT(Buffer_ReadyEvent)
  FLEXNPU_SLOT(ExecuteContext_Create)
  FLEXNPU_SLOT(ExecuteContext_Destroy)
#undef FLEXNPU_SLOT
  return api;
}

}  // namespace

bool IsDaemonBackend(const std::string& backend) {
  return backend.rfind(kBackendPrefix, 0) == 0;
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

}  // namespace flexnpu::daemon
