#include "pjrt_flexnpu/backend/remote/connection.h"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cxxabi.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "pjrt_flexnpu/base/thread_name.h"

namespace flexnpu::remote {
namespace {

int CallTimeoutSeconds() {
  const char* v = std::getenv("FLEXNPU_DAEMON_TIMEOUT_S");
  const int s = v != nullptr ? std::atoi(v) : 0;
  return s > 0 ? s : 300;
}

// The connection whose reader thread this is (callbacks run there), else null, and the
// epoch of the reading role it holds.
thread_local Connection* t_reader_of = nullptr;
thread_local uint64_t t_role_epoch = 0;

void StartWatchdog(std::weak_ptr<Connection> connection);
// Reader threads running callbacks now, over all connections (the watchdog sleeps while 0),
// and a wake-up for the watchdog when it sleeps so.
std::atomic<int> g_callbacks_running{0};
void WakeWatchdog();

}  // namespace

StatusOr<std::shared_ptr<Connection>> Connection::Open(const std::string& path) {
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

Connection::~Connection() { ::close(fd_); }

void Connection::Close() { ::shutdown(fd_, SHUT_RDWR); }

StatusOr<Frame> Connection::Call(Frame request, const std::vector<int>& fds) {
  auto reply = CallForReply(std::move(request), fds);
  if (!reply.ok()) return reply.status();
  if (reply->code != 0) {
    return Status(static_cast<Code>(reply->code), "flexnpu daemon at " + path_ + ": " +
                                                      reply->text);
  }
  return reply;
}

StatusOr<Frame> Connection::CallForReply(Frame request, const std::vector<int>& fds) {
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

Status Connection::Post(Frame request, const std::vector<int>& fds) {
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

std::pair<int64_t, std::shared_ptr<RemoteEvent>> Connection::NewEvent() {
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

void Connection::DropEvent(int64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.erase(id);
}

void Connection::ReleaseReading(Connection* c) {
  if (c == nullptr || t_reader_of != c) return;
  c->ReleaseReadingHeld();
}

void Connection::ReleaseReadingHeld() {
  std::lock_guard<std::mutex> lock(role_mu_);
  if (role_taken_ && in_callbacks_ && role_epoch_ == t_role_epoch) ReleaseRoleLocked();
}

void Connection::CheckStalledCallbacks(std::chrono::steady_clock::time_point now) {
  std::lock_guard<std::mutex> lock(role_mu_);
  if (role_taken_ && in_callbacks_ &&
      now - callbacks_since_ > std::chrono::milliseconds(kCallbackStallMs)) {
    ReleaseRoleLocked();
  }
}

bool Connection::dead() {
  std::lock_guard<std::mutex> lock(mu_);
  return !dead_.ok();
}

Status Connection::Send(const Frame& request, const std::vector<int>& fds) {
  std::unique_lock<std::mutex> lock(write_mu_, std::try_to_lock);
  if (!lock.owns_lock()) {
    ReleaseReading();  // another thread is sending: do not hold the socket unread meanwhile
    lock.lock();
  }
  return daemon::SendFrame(fd_, request, fds);
}

void Connection::Forget(uint64_t id) {
  std::lock_guard<std::mutex> lock(mu_);
  pending_.erase(id);
}

void Connection::Complete(const std::shared_ptr<RemoteEvent>& event, Status status,
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

void Connection::Run(Callbacks& callbacks) {
  for (auto& [cb, arg] : callbacks) {
    try {
      cb(ToError(arg.first), arg.second);
    } catch (abi::__forced_unwind&) {
      throw;
    } catch (...) {
    }
  }
}

Status Connection::Receive(Frame* frame) {
  std::vector<int> fds;
  Status s = daemon::RecvFrame(fd_, frame, &fds);
  for (int fd : fds) ::close(fd);  // the daemon sends none
  return s;
}

void Connection::Route(Frame frame, Callbacks* callbacks) {
  if (frame.op == daemon::kEventReady && frame.call_id == 0) {
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

void Connection::Fail(const Status& failure) {
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

void Connection::ReleaseRoleLocked() {
  role_taken_ = false;
  in_callbacks_ = false;  // the next holder starts by reading; the old one's callbacks are its own
  if (idle_readers_ > 0) {
    role_cv_.notify_one();
  } else {
    SpawnReaderLocked();
  }
}

void Connection::SpawnReader() {
  std::lock_guard<std::mutex> lock(role_mu_);
  SpawnReaderLocked();
}

void Connection::SpawnReaderLocked() {
  ++idle_readers_;  // counted before it runs, so no second one is spawned for the same need
  // The reader keeps the connection alive until the socket closes (Close, or the daemon):
  // callbacks run on it, and one may drop the last other reference.
  std::thread([self = shared_from_this()] {
    NameThisThread("flexnpu-rmt-rd");
    self->ReadLoop();
  }).detach();
}

void Connection::ReadLoop() {
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

namespace {

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
    NameThisThread("flexnpu-rmt-wd");
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

}  // namespace
}  // namespace flexnpu::remote
