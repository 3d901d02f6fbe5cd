#include "pjrt_flexnpu/daemon/server.h"

#include <dlfcn.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <array>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <ctime>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>

#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/json.h"
#include "pjrt_flexnpu/daemon/protocol.h"

namespace flexnpu::daemon {
namespace {

Status ResourceExhausted(std::string m) { return Status(Code::kResourceExhausted, std::move(m)); }
Status PermissionDenied(std::string m) { return Status(Code::kPermissionDenied, std::move(m)); }

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
  std::vector<int64_t> memories;
};

struct TenantState {
  TenantConfig config;
  int64_t bytes_in_use = 0;
  int sessions = 0;
  // Counted by session threads without mu_ (entries of tenants_ never move).
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

// Priority classes: latency-class work first, batch-class work fills the gaps. Per device
// (the devices this daemon serves), a batch-class execution waits while latency-class
// executions are in flight there (enqueued, not yet complete), at most `max_wait` so that
// batch work is never starved. It holds back what is not yet enqueued; what the backend has
// queued already runs in its order (a placer-level priority would reorder those too).
class PriorityGate {
 public:
  PriorityGate(size_t devices, std::chrono::milliseconds max_wait)
      : in_flight_(devices, 0), max_wait_(max_wait) {}
  void LatencyStarted(const std::vector<int64_t>& devices) {
    std::lock_guard<std::mutex> lock(mu_);
    for (int64_t d : devices) ++in_flight_[d];
  }
  void LatencyDone(int64_t device) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (in_flight_[device] > 0) --in_flight_[device];
    }
    cv_.notify_all();
  }
  enum class Turn { kNotHeld, kAfterLatencyWork, kPastMaxWait };
  // Waits while latency work is in flight on any of `devices` (at most max_wait): whether it
  // waited, and whether that work completed (its completion events fired) before it went.
  Turn AwaitBatchTurn(const std::vector<int64_t>& devices, const std::atomic<bool>& stopping) {
    std::unique_lock<std::mutex> lock(mu_);
    auto clear = [&] {
      if (stopping) return true;
      for (int64_t d : devices) {
        if (in_flight_[d] > 0) return false;
      }
      return true;
    };
    if (clear()) return Turn::kNotHeld;
    return cv_.wait_for(lock, max_wait_, clear) ? Turn::kAfterLatencyWork : Turn::kPastMaxWait;
  }
  std::vector<int64_t> InFlight() const {
    std::lock_guard<std::mutex> lock(mu_);
    return in_flight_;
  }
  void WakeAll() { cv_.notify_all(); }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> in_flight_;  // latency-class executions per device
  const std::chrono::milliseconds max_wait_;
};

// Destroys buffers off the session threads. The CPU backend's PJRT_Buffer_Destroy of a
// donated buffer blocks until the execution it was donated to completes (a decode step's KV
// cache: the whole step); on a session thread that would hold back every later request of
// the session (its next execution, the read of this step's result) until then.
class Reaper {
 public:
  void Start(const PhysicalBackend* backend) {
    backend_ = backend;
    thread_ = std::thread([this] { Run(); });
  }
  void Destroy(PJRT_Buffer* buffer) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue_.push_back(buffer);
    }
    cv_.notify_one();
  }
  // Destroys what is queued, then stops.
  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_one();
    if (thread_.joinable()) thread_.join();
  }

 private:
  void Run() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
      PJRT_Buffer* buffer = queue_.front();
      queue_.pop_front();
      lock.unlock();
      InnerDeleter<PJRT_Buffer>{backend_}(buffer);
      lock.lock();
    }
  }
  const PhysicalBackend* backend_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PJRT_Buffer*> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  const int n = v != nullptr ? std::atoi(v) : 0;
  return n > 0 ? n : fallback;
}

// The socket side of a session, shared with event callbacks that outlive a request.
//
// Send never blocks on the socket: it runs on the session thread (replies) and on the
// backend's threads (readiness pushes, for every tenant), so a client that stops reading must
// not stall either. What the socket does not take at once waits in this channel's queue, in
// order, and the channel's writer thread (started at the first such frame) writes it when the
// socket drains. A client that takes nothing for the send timeout (FLEXNPU_DAEMON_SEND_
// TIMEOUT_S, default 60) or lets more than FLEXNPU_DAEMON_MAX_QUEUED_MB (default 1024) pile
// up has its session ended: the socket is shut down, the session thread sees the end, and
// Broken() says why.
struct Channel {
  explicit Channel(int fd)
      : fd(fd),
        send_timeout_ms(EnvInt("FLEXNPU_DAEMON_SEND_TIMEOUT_S", 60) * 1000),
        max_queued_bytes(static_cast<size_t>(EnvInt("FLEXNPU_DAEMON_MAX_QUEUED_MB", 1024)) << 20) {}
  ~Channel() {
    {
      std::lock_guard<std::mutex> lock(write_mu);
      stop = true;
    }
    write_cv.notify_all();
    // Wakes a writer waiting in poll for a client that does not read (up to the send
    // timeout otherwise, and this may run on a backend thread that carries every tenant's
    // completions). What the socket took already still reaches the client.
    if (writer.joinable()) ::shutdown(fd, SHUT_RDWR);
    if (writer.joinable()) writer.join();
    ::close(fd);
  }
  void Send(const Frame& frame) {
    const std::string body = Encode(frame);
    if (body.size() > kMaxFrameBytes) return;  // never built: payloads are bounded
    std::string data(4, '\0');
    const uint32_t n = static_cast<uint32_t>(body.size());
    for (int i = 0; i < 4; ++i) data[i] = static_cast<char>((n >> (8 * i)) & 0xff);
    data += body;
    std::lock_guard<std::mutex> lock(write_mu);
    if (!broken.empty() || stop) return;  // the session is ending
    size_t sent = 0;
    if (queue.empty() && !writing) {
      while (sent < data.size()) {
        const ssize_t r =
            ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (r < 0) {
          if (errno == EINTR) continue;
          if (errno == EAGAIN || errno == EWOULDBLOCK) break;
          return;  // a dead peer: the session's reader notices
        }
        sent += static_cast<size_t>(r);
      }
      if (sent == data.size()) return;
    }
    if (queued_bytes + data.size() - sent > max_queued_bytes) {
      BreakLocked("the client did not read " + std::to_string(queued_bytes) +
                  " bytes of replies and pushes queued for it (limit " +
                  std::to_string(max_queued_bytes >> 20) + " MiB)");
      return;
    }
    queued_bytes += data.size() - sent;
    queue.push_back(sent == 0 ? std::move(data) : data.substr(sent));
    if (!writer.joinable()) writer = std::thread([this] { WriteLoop(); });
    write_cv.notify_one();
  }
  // Why the daemon ended this session's connection itself; empty if it did not.
  std::string Broken() {
    std::lock_guard<std::mutex> lock(write_mu);
    return broken;
  }
  void Fired(PJRT_Event* event) {
    std::lock_guard<std::mutex> lock(fired_mu);
    fired.push_back(event);
  }
  std::vector<PJRT_Event*> TakeFired() {
    std::lock_guard<std::mutex> lock(fired_mu);
    return std::move(fired);
  }
  const int fd;
  // Set by the session thread at Hello, before any event is watched; null for observers.
  TenantState* tenant = nullptr;
  std::mutex fired_mu;
  std::vector<PJRT_Event*> fired;

 private:
  void BreakLocked(std::string why) {
    if (!broken.empty()) return;
    broken = std::move(why);
    queue.clear();
    queued_bytes = 0;
    ::shutdown(fd, SHUT_RDWR);
    write_cv.notify_all();
  }
  // Writes the queue in order while Send appends behind it. The frame being written is the
  // writer's own (taken off the queue; `writing` keeps Send from writing past it), so
  // BreakLocked may clear the queue meanwhile.
  void WriteLoop() {
    std::unique_lock<std::mutex> lock(write_mu);
    for (;;) {
      write_cv.wait(lock, [&] { return stop || !broken.empty() || !queue.empty(); });
      if (stop || !broken.empty()) return;
      std::string current = std::move(queue.front());
      queue.pop_front();
      writing = true;
      size_t offset = 0;
      while (offset < current.size()) {
        lock.unlock();
        pollfd p{fd, POLLOUT, 0};
        int r = ::poll(&p, 1, send_timeout_ms);
        ssize_t written = 0;
        bool failed = false;
        if (r > 0) {
          written = ::send(fd, current.data() + offset, current.size() - offset,
                           MSG_NOSIGNAL | MSG_DONTWAIT);
          failed = written < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
        } else if (r < 0) {
          failed = errno != EINTR;
        }
        lock.lock();
        if (stop || !broken.empty()) {
          writing = false;
          return;
        }
        if (r == 0) {
          BreakLocked("the client did not read what the daemon sent it for " +
                      std::to_string(send_timeout_ms / 1000) + " s (" +
                      std::to_string(queued_bytes) + " bytes of replies and pushes queued)");
          writing = false;
          return;
        }
        if (failed) {
          queue.clear();  // a dead peer: the session's reader notices
          queued_bytes = 0;
          break;
        }
        if (written > 0) {
          offset += static_cast<size_t>(written);
          queued_bytes -= std::min(queued_bytes, static_cast<size_t>(written));
        }
      }
      writing = false;
    }
  }
  const int send_timeout_ms;
  const size_t max_queued_bytes;
  std::mutex write_mu;
  std::condition_variable write_cv;
  std::deque<std::string> queue;  // encoded frames the socket has not taken yet
  size_t queued_bytes = 0;
  std::string broken;
  bool stop = false;
  bool writing = false;  // the writer holds a frame taken off the queue
  std::thread writer;
};

class ServerImpl;

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
  TenantState* tenant_state = nullptr;  // in ServerImpl::tenants_; null for observers
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

// One OnReady registration: pushes readiness of client event `event_id`.
struct Watch {
  const PhysicalBackend* backend = nullptr;
  std::shared_ptr<Channel> channel;
  PJRT_Event* inner = nullptr;
  int64_t event_id = 0;  // 0: nothing to push (the segment release of a zero-copy buffer)
  std::function<void(Frame*)> fill;
  std::shared_ptr<void> keep_alive;
  std::function<void()> done;  // runs when the event fires, whatever its status
  // A one-way execution's completion: the arguments it consumed, pushed whatever its status
  // (ints [event, code, donated list]); null for other events.
  std::shared_ptr<const std::vector<int64_t>> donated;
};

void OnWatchReady(PJRT_Error* error, void* arg) {
  std::unique_ptr<Watch> w(static_cast<Watch*>(arg));
  Status status = w->backend->Consume(error, "execution");
  if (w->event_id != 0) {
    Frame push;
    push.op = kEventReady;
    push.ints = {w->event_id, static_cast<int64_t>(status.code())};
    push.text = status.message();
    if (status.ok() && w->fill) w->fill(&push);
    if (w->donated) AppendList(&push.ints, w->donated->data(), w->donated->size());
    w->channel->Send(push);
    if (TenantState* t = w->channel->tenant) {
      ++t->pushes;
      if (!push.blobs.empty()) t->bytes_to_host += static_cast<int64_t>(push.blobs[0].size());
    }
  }
  if (w->done) w->done();
  w->channel->Fired(w->inner);
}

// A PJRT_Buffer_MemoryLayout pointing into `l` (which must outlive it); nullptr for none.
struct InnerLayout {
  PJRT_Buffer_MemoryLayout layout{};
  std::vector<int64_t> tile_dims;
  std::vector<size_t> tile_dim_sizes;
  PJRT_Buffer_MemoryLayout* Build(const Layout& l) {
    if (l.type < 0) return nullptr;
    layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
    layout.type = static_cast<PJRT_Buffer_MemoryLayout_Type>(l.type);
    if (layout.type == PJRT_Buffer_MemoryLayout_Type_Strides) {
      layout.strides.struct_size = PJRT_Buffer_MemoryLayout_Strides_STRUCT_SIZE;
      layout.strides.byte_strides = l.byte_strides.data();
      layout.strides.num_byte_strides = l.byte_strides.size();
      return &layout;
    }
    for (const auto& tile : l.tiles) {
      tile_dims.insert(tile_dims.end(), tile.begin(), tile.end());
      tile_dim_sizes.push_back(tile.size());
    }
    layout.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
    layout.tiled.minor_to_major = l.minor_to_major.data();
    layout.tiled.minor_to_major_size = l.minor_to_major.size();
    layout.tiled.tile_dims = tile_dims.data();
    layout.tiled.tile_dim_sizes = tile_dim_sizes.data();
    layout.tiled.num_tiles = tile_dim_sizes.size();
    return &layout;
  }
};

class ServerImpl final : public Server {
 public:
  explicit ServerImpl(ServerConfig config) : config_(std::move(config)) {}
  ~ServerImpl() override { Stop(); }

  Status Init();
  void Stop() override;
  std::string StatsJson() const override;

 private:
  void Log(const std::string& line) const {
    if (!config_.log) return;
    std::time_t now = std::time(nullptr);
    char when[32];
    std::strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", std::localtime(&now));
    std::fprintf(stderr, "%s flexnpu daemon: %s\n", when, line.c_str());
    std::fflush(stderr);
  }
  void AcceptLoop();
  void Serve(std::shared_ptr<Session> session);
  Status Hello(Session& s, const Frame& request, Frame* reply);
  Status Handle(Session& s, const Frame& request, std::vector<int>& fds, Frame* reply);
  void EndSession(Session& s);
  void Reap(bool all);

  // Handlers.
  Status BufferFromHost(Session& s, const Frame& r, std::vector<int>& fds, Frame* out);
  Status ToHost(Session& s, const Frame& r, std::vector<int>& fds, Frame* out);
  Status Execute(Session& s, const Frame& r, Frame* out);
  Status Compile(Session& s, const Frame& r, Frame* out);
  Status Deserialize(Session& s, const Frame& r, Frame* out);
  Status ExecutableCall(Session& s, const Frame& r, Frame* out);

  StatusOr<BufferEntry*> FindBuffer(Session& s, const std::vector<int64_t>& ints, size_t at = 0);
  StatusOr<ExecutableEntry*> FindExecutable(Session& s, const std::vector<int64_t>& ints);
  Status Describe(PJRT_Buffer* buffer, int64_t id, BufferMeta* meta);
  Status Charge(Session& s, int64_t bytes, const char* what);
  void Release(Session& s, int64_t bytes);
  // Registers buffer `handle` in `s` and appends its description to `ints`.
  // `id` 0: a new daemon id; else the client's (outputs of a one-way execution).
  Status AddBuffer(Session& s, PJRT_Buffer* handle, std::vector<int64_t>* ints, int64_t* bytes,
                   int64_t id = 0);
  // A one-way execution failed: its events carry the error, its output ids name it.
  void FailOneWayExecute(Session& s, const Frame& r, const Status& status);
  Status AddExecutable(Session& s, PJRT_LoadedExecutable* loaded, Frame* out);
  void WatchEvent(Session& s, PJRT_Event* inner, int64_t event_id,
                  std::function<void(Frame*)> fill, std::shared_ptr<void> keep_alive,
                  std::function<void()> done = nullptr,
                  std::shared_ptr<const std::vector<int64_t>> donated = nullptr);
  void DrainFired(Session& s);
  int64_t MemoryIndexOf(PJRT_Memory* memory) const {
    for (size_t i = 0; i < memories_.size(); ++i) {
      if (memories_[i].handle == memory) return static_cast<int64_t>(i);
    }
    return -1;
  }

  const PhysicalBackend& b() const { return *backend_; }

  ServerConfig config_;
  std::shared_ptr<const PhysicalBackend> backend_;
  InnerClient client_;
  std::string platform_name_;
  std::string platform_version_;
  std::vector<Device> devices_;
  std::vector<Memory> memories_;
  std::shared_ptr<PriorityGate> gate_;  // shared with completion callbacks
  Reaper reaper_;
  // FlexNPU's own plugin as the backend exports its runtime's state (placements by reason).
  const char* (*runtime_stats_)() = nullptr;

  int listen_fd_ = -1;
  std::atomic<bool> stopping_{false};
  bool stopped_ = false;
  std::thread accept_thread_;
  std::atomic<int64_t> next_id_{1};

  mutable std::mutex mu_;  // sessions_, tenants_
  std::map<int64_t, std::shared_ptr<Session>> sessions_;
  std::map<std::string, TenantState> tenants_;
  int64_t sessions_served_ = 0;
  int64_t sessions_reclaimed_ = 0;
};

Status ServerImpl::Init() {
  auto backend = PhysicalBackend::Load(config_.backend_path);
  if (!backend.ok()) return backend.status();
  backend_ = *backend;
  if (void* library = ::dlopen(config_.backend_path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    runtime_stats_ = reinterpret_cast<const char* (*)()>(::dlsym(library, "FlexNpu_StatsJson"));
    ::dlclose(library);  // drops only the reference NOLOAD took; Load keeps its own
  }
  std::vector<PJRT_NamedValue> named;
  for (const auto& [key, value] : config_.backend_int_options) {
    PJRT_NamedValue v{};
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = key.c_str();
    v.name_size = key.size();
    v.type = PJRT_NamedValue_kInt64;
    v.int64_value = value;
    v.value_size = 1;
    named.push_back(v);
  }
  for (const auto& [key, value] : config_.backend_string_options) {
    PJRT_NamedValue v{};
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = key.c_str();
    v.name_size = key.size();
    v.type = PJRT_NamedValue_kString;
    v.string_value = value.c_str();
    v.value_size = value.size();
    named.push_back(v);
  }
  PJRT_Client_Create_Args create{};
  create.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE;
  create.create_options = named.data();
  create.num_options = named.size();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Client_Create, &create));
  client_ = Own(b(), create.client);

  PJRT_Client_PlatformName_Args name{};
  name.struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE;
  name.client = client_.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Client_PlatformName, &name));
  platform_name_.assign(name.platform_name, name.platform_name_size);
  PJRT_Client_PlatformVersion_Args version{};
  version.struct_size = PJRT_Client_PlatformVersion_Args_STRUCT_SIZE;
  version.client = client_.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Client_PlatformVersion, &version));
  platform_version_.assign(version.platform_version, version.platform_version_size);
  // Over FlexNPU's own runtime, clients see the platform it runs on ("flexnpu 0.1.0 over cpu
  // (...)" -> "cpu"): JAX in the client lowers for that platform (LAPACK, callbacks).
  const std::string over = " over ";
  const size_t at = platform_version_.find(over);
  if (platform_name_ == "flexnpu" && at != std::string::npos) {
    const size_t begin = at + over.size();
    platform_name_ = platform_version_.substr(
        begin, platform_version_.find_first_of(" (", begin) - begin);
  }

  PJRT_Client_AddressableDevices_Args devs{};
  devs.struct_size = PJRT_Client_AddressableDevices_Args_STRUCT_SIZE;
  devs.client = client_.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Client_AddressableDevices, &devs));
  for (size_t i = 0; i < devs.num_addressable_devices; ++i) {
    Device d;
    d.handle = devs.addressable_devices[i];
    PJRT_Device_GetDescription_Args desc{};
    desc.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
    desc.device = d.handle;
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Device_GetDescription, &desc));
    PJRT_DeviceDescription_Id_Args id{};
    id.struct_size = PJRT_DeviceDescription_Id_Args_STRUCT_SIZE;
    id.device_description = desc.device_description;
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_DeviceDescription_Id, &id));
    d.id = id.id;
    PJRT_DeviceDescription_Kind_Args kind{};
    kind.struct_size = PJRT_DeviceDescription_Kind_Args_STRUCT_SIZE;
    kind.device_description = desc.device_description;
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_DeviceDescription_Kind, &kind));
    d.kind.assign(kind.device_kind, kind.device_kind_size);
    PJRT_Device_LocalHardwareId_Args hw{};
    hw.struct_size = PJRT_Device_LocalHardwareId_Args_STRUCT_SIZE;
    hw.device = d.handle;
    d.local_hardware_id = FLEXNPU_INNER_CALL(b(), PJRT_Device_LocalHardwareId, &hw).ok()
                              ? hw.local_hardware_id
                              : d.id;
    PJRT_Device_AddressableMemories_Args mems{};
    mems.struct_size = PJRT_Device_AddressableMemories_Args_STRUCT_SIZE;
    mems.device = d.handle;
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Device_AddressableMemories, &mems));
    for (size_t m = 0; m < mems.num_memories; ++m) {
      int64_t index = MemoryIndexOf(mems.memories[m]);
      if (index < 0) {
        Memory memory;
        memory.handle = mems.memories[m];
        PJRT_Memory_Id_Args mid{};
        mid.struct_size = PJRT_Memory_Id_Args_STRUCT_SIZE;
        mid.memory = memory.handle;
        memory.id = FLEXNPU_INNER_CALL(b(), PJRT_Memory_Id, &mid).ok() ? mid.id : 0;
        PJRT_Memory_Kind_Args mk{};
        mk.struct_size = PJRT_Memory_Kind_Args_STRUCT_SIZE;
        mk.memory = memory.handle;
        FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Memory_Kind, &mk));
        memory.kind.assign(mk.kind, mk.kind_size);
        PJRT_Memory_Kind_Id_Args mki{};
        mki.struct_size = PJRT_Memory_Kind_Id_Args_STRUCT_SIZE;
        mki.memory = memory.handle;
        memory.kind_id = FLEXNPU_INNER_CALL(b(), PJRT_Memory_Kind_Id, &mki).ok() ? mki.kind_id : 0;
        index = static_cast<int64_t>(memories_.size());
        memories_.push_back(std::move(memory));
      }
      d.memories.push_back(index);
    }
    PJRT_Device_DefaultMemory_Args dm{};
    dm.struct_size = PJRT_Device_DefaultMemory_Args_STRUCT_SIZE;
    dm.device = d.handle;
    if (FLEXNPU_INNER_CALL(b(), PJRT_Device_DefaultMemory, &dm).ok()) {
      d.default_memory = MemoryIndexOf(dm.memory);
    }
    devices_.push_back(std::move(d));
  }
  reaper_.Start(&b());
  gate_ = std::make_shared<PriorityGate>(devices_.size(),
                                         std::chrono::milliseconds(config_.batch_max_wait_ms));
  for (const TenantConfig& t : config_.tenants) {
    for (int64_t device : t.devices) {
      bool known = false;
      for (const Device& d : devices_) known = known || d.id == device;
      if (!known) {
        return InvalidArgument("tenant '" + t.name + "' names device " + std::to_string(device) +
                               ", which the physical backend does not have (it has " +
                               std::to_string(devices_.size()) + ")");
      }
    }
    tenants_[t.name].config = t;
  }

  // The socket: refuse to take over a live daemon's; replace a stale one.
  const std::string& path = config_.socket_path;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(addr.sun_path)) {
    return InvalidArgument("daemon socket path '" + path + "' is empty or too long");
  }
  std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  struct stat info {};
  if (::lstat(path.c_str(), &info) == 0) {
    if (!S_ISSOCK(info.st_mode)) {
      return InvalidArgument("daemon socket path '" + path + "' exists and is not a socket");
    }
    const int probe = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    const bool live = ::connect(probe, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) == 0;
    ::close(probe);
    if (live) return FailedPrecondition("a flexnpu daemon is already serving " + path);
    ::unlink(path.c_str());
  }
  listen_fd_ = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (listen_fd_ < 0) return Internal("socket() failed");
  if (::bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listen_fd_, 64) != 0) {
    const std::string why = std::strerror(errno);
    ::close(listen_fd_);
    listen_fd_ = -1;
    return Status(Code::kUnavailable, "cannot listen on " + path + ": " + why);
  }
  accept_thread_ = std::thread([this] { AcceptLoop(); });
  Log("serving " + path + " over " + platform_name_ + " (" + config_.backend_path + ", " +
      std::to_string(devices_.size()) + " devices, protocol " + std::to_string(kProtocolVersion) +
      ")");
  return Status::Ok();
}

void ServerImpl::AcceptLoop() {
  while (!stopping_) {
    pollfd p{listen_fd_, POLLIN, 0};
    const int r = ::poll(&p, 1, 200);
    Reap(false);
    if (r <= 0 || !(p.revents & POLLIN)) continue;
    const int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    auto session = std::make_shared<Session>();
    session->id = next_id_++;
    session->channel = std::make_shared<Channel>(fd);
    {
      std::lock_guard<std::mutex> lock(mu_);
      sessions_[session->id] = session;
    }
    session->thread = std::thread([this, session] { Serve(session); });
  }
}

void ServerImpl::Reap(bool all) {
  std::vector<std::shared_ptr<Session>> done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto it = sessions_.begin(); it != sessions_.end();) {
      if (all || it->second->finished) {
        done.push_back(it->second);
        it = sessions_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& s : done) {
    if (s->thread.joinable()) s->thread.join();
  }
}

void ServerImpl::Serve(std::shared_ptr<Session> session) {
  Session& s = *session;
  bool greeted = false;
  Status end;
  for (;;) {
    Frame request;
    std::vector<int> fds;
    Status r = RecvFrame(s.channel->fd, &request, &fds);
    if (!r.ok()) {
      for (int fd : fds) ::close(fd);
      end = r;
      break;
    }
    DrainFired(s);
    Frame reply;
    reply.call_id = request.call_id;
    reply.op = request.op;
    Status status;
    if (!greeted) {
      status = request.op == kHello
                   ? Hello(s, request, &reply)
                   : FailedPrecondition("the first message of a session must be Hello");
      greeted = status.ok();
    } else if (s.observer && request.op != kStats) {
      status = PermissionDenied("an observer session can only ask for stats");
    } else {
      const auto start = std::chrono::steady_clock::now();
      status = Handle(s, request, fds, &reply);
      if (s.tenant_state != nullptr && request.op <= kLastRequestOp) {
        auto& counter = s.tenant_state->requests[request.op];
        ++counter.count;
        counter.handler_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - start)
                                  .count();
      }
    }
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    if (!status.ok() && request.call_id == 0 && request.op == kExecute) {
      FailOneWayExecute(s, request, status);
    }
    if (!status.ok() && request.call_id == 0 && request.op == kBufferFromHost &&
        !request.ints.empty() && request.ints.back() < 0 &&
        s.buffers.count(request.ints.back()) == 0) {
      // A one-way transfer's id names its failure.
      s.buffers[request.ints.back()] =
          BufferEntry{nullptr, 0, Status(status.code(), "the transfer that made this buffer "
                                                        "failed: " + std::string(status.message()))};
    }
    if (!status.ok() && request.call_id == 0 && request.op == kBufferToHost &&
        request.ints.size() > 1) {
      // A one-way transfer's failure is its event's.
      Frame push;
      push.op = kEventReady;
      push.ints = {request.ints[1], static_cast<int64_t>(status.code())};
      push.text = status.message();
      s.channel->Send(push);
    }
    if (!status.ok()) {
      reply.code = static_cast<int32_t>(status.code());
      reply.text = status.message();
      reply.ints.clear();
      reply.blobs.clear();
      if (request.op == kExecute) {
        // ints [donated list]: what an execution refused after it ran consumed.
        AppendList(&reply.ints, s.consumed_by_failed.data(), s.consumed_by_failed.size());
        s.consumed_by_failed.clear();
      }
    }
    if (request.call_id != 0) s.channel->Send(reply);
    if (!greeted) break;  // a refused handshake ends the session
    s.greeted = true;
    s.buffer_count = s.buffers.size();
    s.executable_count = s.executables.size();
  }
  const std::string broken = s.channel->Broken();
  EndSession(s);
  if (greeted && !s.observer) {
    Log("session " + std::to_string(s.id) + " (tenant '" + s.tenant + "') ended: " +
        (!broken.empty()               ? "by the daemon: " + broken
         : end.message() == "closed" ? std::string("closed")
                                     : std::string(end.message())) +
        "; its handles were destroyed");
  }
  s.finished = true;
}

Status ServerImpl::Hello(Session& s, const Frame& request, Frame* reply) {
  if (request.ints.empty() || request.ints[0] != kProtocolVersion) {
    return FailedPrecondition(
        "protocol version mismatch: the flexnpu daemon speaks version " +
        std::to_string(kProtocolVersion) + ", the client " +
        (request.ints.empty() ? std::string("sent none") : std::to_string(request.ints[0])) +
        " (use the same FlexNPU build for both)");
  }
  s.observer = request.ints.size() > 1 && request.ints[1] == 1;
  s.tenant = request.text.empty() ? "default" : request.text;
  const TenantConfig* tenant = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tenants_.find(s.tenant);
    if (it == tenants_.end() && !s.observer) {
      if (!config_.allow_unknown_tenants) {
        return PermissionDenied("unknown tenant '" + s.tenant +
                                "': this flexnpu daemon's tenants file does not list it and "
                                "refuses unknown tenants");
      }
      it = tenants_.try_emplace(s.tenant).first;
      it->second.config.name = s.tenant;
    }
    if (it != tenants_.end()) {
      tenant = &it->second.config;
      if (!s.observer) {
        s.tenant_state = &it->second;
        s.channel->tenant = &it->second;
        s.latency = tenant->priority == "latency";
      }
      if (!s.observer) {
        ++it->second.sessions;
        ++sessions_served_;
      }
    }
  }
  for (size_t d = 0; d < devices_.size(); ++d) {
    bool allowed = tenant == nullptr || tenant->devices.empty();
    if (!allowed) {
      for (int64_t id : tenant->devices) allowed = allowed || id == devices_[d].id;
    }
    if (!allowed) continue;
    s.devices.insert(static_cast<int64_t>(d));
    for (int64_t m : devices_[d].memories) s.memories.insert(m);
  }
  reply->ints.push_back(s.id);
  reply->ints.push_back(static_cast<int64_t>(s.memories.size()));
  reply->blobs = {platform_name_, platform_version_};
  for (int64_t m : s.memories) {
    reply->ints.insert(reply->ints.end(), {m, memories_[m].id, memories_[m].kind_id});
    reply->blobs.push_back(memories_[m].kind);
  }
  reply->ints.push_back(static_cast<int64_t>(s.devices.size()));
  for (int64_t d : s.devices) {
    const Device& device = devices_[d];
    reply->ints.insert(reply->ints.end(), {d, device.id, device.local_hardware_id,
                                           device.default_memory});
    AppendList(&reply->ints, device.memories.data(), device.memories.size());
    reply->blobs.push_back(device.kind);
  }
  // One-way executions and transfers are offered to tenants without a quota: a quota refusal
  // stays synchronous (RESOURCE_EXHAUSTED at dispatch).
  reply->ints.push_back(tenant == nullptr || tenant->memory_quota_bytes < 0 ? 1 : 0);
  if (!s.observer) {
    Log("session " + std::to_string(s.id) + " (tenant '" + s.tenant + "') connected, " +
        std::to_string(s.devices.size()) + " devices");
  }
  return Status::Ok();
}

StatusOr<BufferEntry*> ServerImpl::FindBuffer(Session& s, const std::vector<int64_t>& ints,
                                              size_t at) {
  if (ints.size() <= at) return InvalidArgument("request names no buffer");
  auto it = s.buffers.find(ints[at]);
  if (it == s.buffers.end()) {
    return NotFound("buffer " + std::to_string(ints[at]) + " is not one of session " +
                    std::to_string(s.id) + "'s buffers");
  }
  if (it->second.handle == nullptr) return it->second.error;
  return &it->second;
}

StatusOr<ExecutableEntry*> ServerImpl::FindExecutable(Session& s,
                                                      const std::vector<int64_t>& ints) {
  if (ints.empty()) return InvalidArgument("request names no executable");
  auto it = s.executables.find(ints[0]);
  if (it == s.executables.end()) {
    return NotFound("executable " + std::to_string(ints[0]) + " is not one of session " +
                    std::to_string(s.id) + "'s executables");
  }
  return &it->second;
}

Status ServerImpl::Describe(PJRT_Buffer* buffer, int64_t id, BufferMeta* m) {
  m->id = id;
  auto metadata = b().Metadata(buffer);
  if (!metadata.ok()) return metadata.status();
  m->type = metadata->element_type;
  m->dims = std::move(metadata->dims);
  m->on_device_size = metadata->on_device_size;
  auto memory = b().Memory(buffer);
  if (!memory.ok()) return memory.status();
  m->memory = MemoryIndexOf(*memory);
  // Tokens have no dynamic dimensions or layout (the CPU plugin aborts when asked).
  if (m->type == PJRT_Buffer_Type_TOKEN) return Status::Ok();
  PJRT_Buffer_DynamicDimensionIndices_Args dyn{};
  dyn.struct_size = PJRT_Buffer_DynamicDimensionIndices_Args_STRUCT_SIZE;
  dyn.buffer = buffer;
  if (FLEXNPU_INNER_CALL(b(), PJRT_Buffer_DynamicDimensionIndices, &dyn).ok()) {
    for (size_t i = 0; i < dyn.num_dynamic_dims; ++i) {
      m->dynamic_dims.push_back(static_cast<int64_t>(dyn.dynamic_dim_indices[i]));
    }
  }
  PJRT_Buffer_GetMemoryLayout_Args layout{};
  layout.struct_size = PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE;
  layout.buffer = buffer;
  if (FLEXNPU_INNER_CALL(b(), PJRT_Buffer_GetMemoryLayout, &layout).ok()) {
    m->layout_type = layout.layout.type;
    if (layout.layout.type == PJRT_Buffer_MemoryLayout_Type_Strides) {
      const auto& st = layout.layout.strides;
      m->byte_strides.assign(st.byte_strides, st.byte_strides + st.num_byte_strides);
    } else {
      const auto& t = layout.layout.tiled;
      m->minor_to_major.assign(t.minor_to_major, t.minor_to_major + t.minor_to_major_size);
      size_t offset = 0;
      for (size_t i = 0; i < t.num_tiles; ++i) {
        m->tiles.emplace_back(t.tile_dims + offset, t.tile_dims + offset + t.tile_dim_sizes[i]);
        offset += t.tile_dim_sizes[i];
      }
    }
  }
  return Status::Ok();
}

Status ServerImpl::Charge(Session& s, int64_t bytes, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  TenantState& t = tenants_[s.tenant];
  const int64_t quota = t.config.memory_quota_bytes;
  if (quota >= 0 && t.bytes_in_use + bytes > quota) {
    return ResourceExhausted("tenant '" + s.tenant + "' is over its memory quota: " + what +
                             " needs " + std::to_string(bytes) + " bytes, " +
                             std::to_string(t.bytes_in_use) + " of its quota of " +
                             std::to_string(quota) + " bytes are in use");
  }
  t.bytes_in_use += bytes;
  return Status::Ok();
}

void ServerImpl::Release(Session& s, int64_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  tenants_[s.tenant].bytes_in_use -= bytes;
}

Status ServerImpl::AddBuffer(Session& s, PJRT_Buffer* handle, std::vector<int64_t>* ints,
                             int64_t* bytes, int64_t id) {
  BufferMeta meta;
  if (id == 0) id = next_id_++;
  Status st = Describe(handle, id, &meta);
  if (!st.ok()) {
    InnerDeleter<PJRT_Buffer>{&b()}(handle);
    return st;
  }
  s.buffers[id] = BufferEntry{handle, meta.on_device_size};
  *bytes += meta.on_device_size;
  AppendBufferMeta(ints, meta);
  return Status::Ok();
}

void ServerImpl::WatchEvent(Session& s, PJRT_Event* inner, int64_t event_id,
                            std::function<void(Frame*)> fill, std::shared_ptr<void> keep_alive,
                            std::function<void()> done,
                            std::shared_ptr<const std::vector<int64_t>> donated) {
  auto* w = new Watch{&b(), s.channel, inner, event_id, std::move(fill), std::move(keep_alive),
                      std::move(done), donated};
  s.events.insert(inner);
  PJRT_Event_OnReady_Args args{};
  args.struct_size = PJRT_Event_OnReady_Args_STRUCT_SIZE;
  args.event = inner;
  args.callback = OnWatchReady;
  args.user_arg = w;
  Status st = FLEXNPU_INNER_CALL(b(), PJRT_Event_OnReady, &args);
  if (!st.ok()) {
    std::unique_ptr<Watch> owned(w);
    if (event_id != 0) {
      Frame push;
      push.op = kEventReady;
      push.ints = {event_id, static_cast<int64_t>(st.code())};
      push.text = st.message();
      if (donated) AppendList(&push.ints, donated->data(), donated->size());
      s.channel->Send(push);
    }
    if (w->done) w->done();
    s.channel->Fired(inner);
  }
}

void ServerImpl::DrainFired(Session& s) {
  for (PJRT_Event* e : s.channel->TakeFired()) {
    if (s.events.erase(e) > 0) InnerDeleter<PJRT_Event>{&b()}(e);
  }
}

Status ServerImpl::BufferFromHost(Session& s, const Frame& r, std::vector<int>& fds,
                                  Frame* out) {
  IntCursor c(r.ints);
  int64_t type, device, memory, inline_payload, size, client_id;
  std::vector<int64_t> dims, strides;
  if (!c.Next(&type) || !c.List(&dims) || !c.List(&strides) || !c.Next(&device) ||
      !c.Next(&memory) || !c.Next(&inline_payload) || !c.Next(&size) || size < 0 ||
      !c.Next(&client_id)) {
    return InvalidArgument("malformed BufferFromHost request");
  }
  // One-way (no reply): the client names the buffer (a negative id, new to the session).
  if ((r.call_id == 0) != (client_id != 0) || client_id > 0 || s.buffers.count(client_id) > 0) {
    return InvalidArgument("BufferFromHost: buffer id " + std::to_string(client_id) +
                           " is not a new client id");
  }
  if (device >= 0 && s.devices.count(device) == 0) {
    return PermissionDenied("device index " + std::to_string(device) +
                            " is outside the device set of tenant '" + s.tenant + "'");
  }
  if (memory >= 0 && s.memories.count(memory) == 0) {
    return PermissionDenied("memory index " + std::to_string(memory) +
                            " is outside the device set of tenant '" + s.tenant + "'");
  }
  if (device < 0 && memory < 0) return InvalidArgument("BufferFromHost names no device or memory");
  const void* data = nullptr;
  std::shared_ptr<SharedSegment> segment;
  if (inline_payload) {
    if (r.blobs.empty() || static_cast<int64_t>(r.blobs[0].size()) != size) {
      return InvalidArgument("BufferFromHost: inline payload size does not match");
    }
    data = r.blobs[0].data();
  } else {
    if (fds.empty()) return InvalidArgument("BufferFromHost: no shared segment was passed");
    auto mapped = SharedSegment::Map(fds[0], static_cast<size_t>(size));
    fds[0] = -1;  // owned by the segment now
    if (!mapped.ok()) return mapped.status();
    segment = std::make_shared<SharedSegment>(std::move(*mapped));
    data = segment->data();
  }
  FLEXNPU_RETURN_IF_ERROR(Charge(s, size, "a host-to-device transfer"));
  if (s.tenant_state != nullptr) s.tenant_state->bytes_to_device += size;
  PJRT_Client_BufferFromHostBuffer_Args args{};
  args.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
  args.client = client_.get();
  args.data = data;
  args.type = static_cast<PJRT_Buffer_Type>(type);
  args.dims = dims.data();
  args.num_dims = dims.size();
  args.byte_strides = strides.empty() ? nullptr : strides.data();
  args.num_byte_strides = strides.size();
  // The segment is the daemon's own copy: the CPU backend can alias it (zero-copy) and the
  // done event says when it may be unmapped.
  args.host_buffer_semantics = segment ? PJRT_HostBufferSemantics_kImmutableZeroCopy
                                       : PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  args.device = device >= 0 ? devices_[device].handle : nullptr;
  args.memory = memory >= 0 ? memories_[memory].handle : nullptr;
  Status st = FLEXNPU_INNER_CALL(b(), PJRT_Client_BufferFromHostBuffer, &args);
  Release(s, size);
  if (!st.ok()) return st;
  if (args.done_with_host_buffer != nullptr) {
    WatchEvent(s, args.done_with_host_buffer, 0, nullptr, segment);
  }
  int64_t bytes = 0;
  std::vector<int64_t> ints;
  FLEXNPU_RETURN_IF_ERROR(AddBuffer(s, args.buffer, &ints, &bytes, client_id));
  Status charged = Charge(s, bytes, "a host-to-device transfer");
  if (!charged.ok()) {
    InnerDeleter<PJRT_Buffer>{&b()}(s.buffers[ints[0]].handle);
    s.buffers.erase(ints[0]);
    return charged;
  }
  out->ints = std::move(ints);
  return Status::Ok();
}

Status ServerImpl::ToHost(Session& s, const Frame& r, std::vector<int>& fds, Frame* out) {
  auto buffer = FindBuffer(s, r.ints);
  if (!buffer.ok()) return buffer.status();
  if (r.ints.size() < 4 || r.ints[2] < 0) return InvalidArgument("malformed ToHost request");
  const int64_t event_id = r.ints[1];
  const size_t size = static_cast<size_t>(r.ints[2]);
  const bool inline_payload = r.ints[3] != 0;
  std::shared_ptr<std::string> payload;
  std::shared_ptr<SharedSegment> segment;
  void* dst;
  if (inline_payload) {
    if (size > kInlinePayloadBytes) return InvalidArgument("ToHost: inline payload too large");
    payload = std::make_shared<std::string>(size, '\0');
    dst = payload->data();
  } else {
    if (fds.empty()) return InvalidArgument("ToHost: no shared segment was passed");
    auto mapped = SharedSegment::Map(fds[0], size);
    fds[0] = -1;
    if (!mapped.ok()) return mapped.status();
    segment = std::make_shared<SharedSegment>(std::move(*mapped));
    dst = segment->data();
  }
  Layout layout;
  IntCursor lc(r.ints, 4);
  if (!ReadLayout(&lc, &layout)) return InvalidArgument("malformed ToHost request (layout)");
  InnerLayout inner_layout;
  PJRT_Buffer_ToHostBuffer_Args args{};
  args.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
  args.src = (*buffer)->handle;
  args.host_layout = inner_layout.Build(layout);
  args.dst = dst;
  args.dst_size = size;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Buffer_ToHostBuffer, &args));
  // Inline payloads are counted when pushed.
  if (segment && s.tenant_state != nullptr) s.tenant_state->bytes_to_host += size;
  std::function<void(Frame*)> fill;
  if (payload) fill = [payload](Frame* push) { push->blobs.push_back(*payload); };
  std::shared_ptr<void> keep = segment ? std::shared_ptr<void>(segment) : payload;
  WatchEvent(s, args.event, event_id, std::move(fill), std::move(keep));
  (void)out;
  return Status::Ok();
}

Status ServerImpl::AddExecutable(Session& s, PJRT_LoadedExecutable* loaded_handle, Frame* out) {
  InnerLoadedExecutable loaded = Own(b(), loaded_handle);
  ExecutableMeta meta;
  auto got = b().GetExecutable(loaded.get());
  if (!got.ok()) return got.status();
  InnerExecutable exe = std::move(*got);
  auto replicas = b().NumReplicas(exe.get());
  if (!replicas.ok()) return replicas.status();
  meta.num_replicas = static_cast<int64_t>(*replicas);
  auto partitions = b().NumPartitions(exe.get());
  if (!partitions.ok()) return partitions.status();
  meta.num_partitions = static_cast<int64_t>(*partitions);
  auto outputs = b().NumOutputs(exe.get());
  if (!outputs.ok()) return outputs.status();
  meta.num_outputs = static_cast<int64_t>(*outputs);
  PJRT_Executable_GetCompiledMemoryStats_Args stats{};
  stats.struct_size = PJRT_Executable_GetCompiledMemoryStats_Args_STRUCT_SIZE;
  stats.executable = exe.get();
  if (FLEXNPU_INNER_CALL(b(), PJRT_Executable_GetCompiledMemoryStats, &stats).ok()) {
    meta.has_memory_stats = true;
    const int64_t values[kMemoryStatsFields] = {
        stats.generated_code_size_in_bytes, stats.argument_size_in_bytes,
        stats.output_size_in_bytes, stats.alias_size_in_bytes, stats.temp_size_in_bytes,
        stats.host_generated_code_size_in_bytes, stats.host_argument_size_in_bytes,
        stats.host_output_size_in_bytes, stats.host_alias_size_in_bytes,
        stats.host_temp_size_in_bytes, stats.peak_memory_in_bytes};
    std::copy(values, values + kMemoryStatsFields, meta.memory_stats);
  }
  PJRT_LoadedExecutable_AddressableDevices_Args devs{};
  devs.struct_size = PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE;
  devs.executable = loaded.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_LoadedExecutable_AddressableDevices, &devs));
  std::vector<int64_t> addressable;
  for (size_t i = 0; i < devs.num_addressable_devices; ++i) {
    int64_t index = -1;
    for (size_t d = 0; d < devices_.size(); ++d) {
      if (devices_[d].handle == devs.addressable_devices[i]) index = static_cast<int64_t>(d);
    }
    // A portable executable lists every device; only pinned ones must stay in the set.
    if (index < 0 || (s.devices.count(index) == 0 && devs.num_addressable_devices == 1)) {
      return PermissionDenied("the executable runs on a device outside the device set of tenant '" +
                              s.tenant + "'");
    }
    if (s.devices.count(index) > 0) meta.devices.push_back(index);
    addressable.push_back(index);
  }
  PJRT_Executable_Name_Args name{};
  name.struct_size = PJRT_Executable_Name_Args_STRUCT_SIZE;
  name.executable = exe.get();
  // jaxlib treats a failing name() as fatal (its cache serializes by name): an inner plugin
  // without the slot gets a stand-in name.
  if (FLEXNPU_INNER_CALL(b(), PJRT_Executable_Name, &name).ok() && name.executable_name != nullptr) {
    meta.name.assign(name.executable_name, name.executable_name_size);
  } else {
    meta.name = "flexnpu_daemon_executable";
  }
  meta.id = next_id_++;
  s.executables[meta.id] =
      ExecutableEntry{loaded.release(), meta.num_outputs, std::move(addressable)};
  AppendExecutableMeta(&out->ints, meta);
  out->blobs.push_back(meta.name);
  return Status::Ok();
}

Status ServerImpl::Compile(Session& s, const Frame& r, Frame* out) {
  if (r.blobs.size() < 3) return InvalidArgument("malformed Compile request");
  PJRT_Program program{};
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  std::string code = r.blobs[1];
  program.code = code.data();
  program.code_size = code.size();
  program.format = r.blobs[0].data();
  program.format_size = r.blobs[0].size();
  PJRT_Client_Compile_Args args{};
  args.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE;
  args.client = client_.get();
  args.program = &program;
  args.compile_options = r.blobs[2].data();
  args.compile_options_size = r.blobs[2].size();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Client_Compile, &args));
  return AddExecutable(s, args.executable, out);
}

Status ServerImpl::Deserialize(Session& s, const Frame& r, Frame* out) {
  if (r.blobs.size() < 2 || r.ints.empty()) return InvalidArgument("malformed Deserialize request");
  PJRT_Executable_DeserializeAndLoad_Args args{};
  args.struct_size = PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE;
  args.client = client_.get();
  args.serialized_executable = r.blobs[0].data();
  args.serialized_executable_size = r.blobs[0].size();
  if (r.ints[0] != 0) {
    args.overridden_serialized_compile_options = r.blobs[1].data();
    args.overridden_serialized_compile_options_size = r.blobs[1].size();
  }
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Executable_DeserializeAndLoad, &args));
  return AddExecutable(s, args.loaded_executable, out);
}

Status ServerImpl::ExecutableCall(Session& s, const Frame& r, Frame* out) {
  auto entry = FindExecutable(s, r.ints);
  if (!entry.ok()) return entry.status();
  PJRT_LoadedExecutable* loaded = (*entry)->handle;
  if (r.op == kExecutableDelete) {
    PJRT_LoadedExecutable_Delete_Args args{};
    args.struct_size = PJRT_LoadedExecutable_Delete_Args_STRUCT_SIZE;
    args.executable = loaded;
    return FLEXNPU_INNER_CALL(b(), PJRT_LoadedExecutable_Delete, &args);
  }
  if (r.op == kExecutableDestroy) {
    InnerDeleter<PJRT_LoadedExecutable>{&b()}(loaded);
    s.executables.erase(r.ints[0]);
    return Status::Ok();
  }
  auto got = b().GetExecutable(loaded);
  if (!got.ok()) return got.status();
  InnerExecutable exe = std::move(*got);
  if (r.op == kOptimizedProgram) {
    PJRT_Program program{};
    program.struct_size = PJRT_Program_STRUCT_SIZE;
    PJRT_Executable_OptimizedProgram_Args args{};
    args.struct_size = PJRT_Executable_OptimizedProgram_Args_STRUCT_SIZE;
    args.executable = exe.get();
    args.program = &program;
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Executable_OptimizedProgram, &args));
    std::string code(program.code_size, '\0');
    program.code = code.data();
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Executable_OptimizedProgram, &args));
    code.resize(program.code_size);
    out->blobs = {std::move(code), std::string(program.format, program.format_size)};
    return Status::Ok();
  }
  PJRT_Executable_Serialize_Args args{};
  args.struct_size = PJRT_Executable_Serialize_Args_STRUCT_SIZE;
  args.executable = exe.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Executable_Serialize, &args));
  out->blobs = {std::string(args.serialized_bytes, args.serialized_bytes_size)};
  if (args.serialized_executable_deleter != nullptr) {
    args.serialized_executable_deleter(args.serialized_executable);
  }
  return Status::Ok();
}

Status ServerImpl::Execute(Session& s, const Frame& r, Frame* out) {
  auto entry = FindExecutable(s, r.ints);
  if (!entry.ok()) return entry.status();
  IntCursor c(r.ints, 1);
  int64_t num_devices, num_args, launch_id, execute_device;
  std::vector<int64_t> non_donatable;
  if (!c.Next(&num_devices) || !c.Next(&num_args) || !c.Next(&launch_id) ||
      !c.Next(&execute_device) || !c.List(&non_donatable) || num_devices <= 0 ||
      num_args < 0 || num_devices > 4096 || num_args > (1 << 20)) {
    return InvalidArgument("malformed Execute request");
  }
  if (execute_device >= 0 && s.devices.count(execute_device) == 0) {
    return PermissionDenied("device index " + std::to_string(execute_device) +
                            " is outside the device set of tenant '" + s.tenant + "'");
  }
  std::vector<std::vector<PJRT_Buffer*>> arguments(num_devices);
  for (int64_t d = 0; d < num_devices; ++d) {
    for (int64_t i = 0; i < num_args; ++i) {
      int64_t id;
      if (!c.Next(&id)) return InvalidArgument("malformed Execute request (arguments)");
      auto it = s.buffers.find(id);
      if (it == s.buffers.end()) {
        return NotFound("buffer " + std::to_string(id) + " is not one of session " +
                        std::to_string(s.id) + "'s buffers");
      }
      if (it->second.handle == nullptr) return it->second.error;
      arguments[d].push_back(it->second.handle);
    }
  }
  std::vector<int64_t> event_ids;
  if (!c.List(&event_ids) ||
      (!event_ids.empty() && static_cast<int64_t>(event_ids.size()) != num_devices)) {
    return InvalidArgument("malformed Execute request (events)");
  }
  const int64_t num_outputs = (*entry)->num_outputs;
  // One-way (no reply): the client names the outputs (negative ids, new to the session).
  std::vector<int64_t> output_ids;
  if (!c.List(&output_ids) || (r.call_id == 0) != !output_ids.empty() ||
      (!output_ids.empty() &&
       static_cast<int64_t>(output_ids.size()) != num_devices * num_outputs)) {
    return InvalidArgument("malformed Execute request (output ids)");
  }
  for (int64_t id : output_ids) {
    if (id >= 0 || s.buffers.count(id) > 0) {
      return InvalidArgument("Execute: output id " + std::to_string(id) +
                             " is not a new client id");
    }
  }
  // The devices this execution occupies, in the order of its per-device completion events.
  std::vector<int64_t> on_devices;
  if (execute_device >= 0) {
    on_devices.push_back(execute_device);
  } else {
    for (int64_t d = 0; d < num_devices && d < static_cast<int64_t>((*entry)->addressable.size());
         ++d) {
      on_devices.push_back((*entry)->addressable[d]);
    }
  }
  // Without an execute device the backend runs the executable on its addressable devices:
  // each must be in the tenant's set (one compiled for several devices may list others).
  if (static_cast<int64_t>(on_devices.size()) < num_devices) {
    return InvalidArgument("Execute names " + std::to_string(num_devices) +
                           " devices, the executable has " + std::to_string(on_devices.size()) +
                           " addressable ones (a portable executable needs an execute device)");
  }
  for (int64_t device : on_devices) {
    if (s.devices.count(device) == 0) {
      return PermissionDenied("the execution would run on device " +
                              std::to_string(devices_[device].id) +
                              ", outside the device set of tenant '" + s.tenant + "'");
    }
  }
  if (s.tenant_state != nullptr) ++s.tenant_state->executions;
  if (!s.latency) {
    const PriorityGate::Turn turn = gate_->AwaitBatchTurn(on_devices, stopping_);
    if (turn != PriorityGate::Turn::kNotHeld && s.tenant_state != nullptr) {
      ++s.tenant_state->held_for_latency;
      if (turn == PriorityGate::Turn::kPastMaxWait) ++s.tenant_state->held_past_max_wait;
    }
  }
  std::vector<std::vector<PJRT_Buffer*>> outputs(num_devices,
                                                 std::vector<PJRT_Buffer*>(num_outputs));
  std::vector<PJRT_Buffer* const*> argument_lists;
  std::vector<PJRT_Buffer**> output_lists;
  for (int64_t d = 0; d < num_devices; ++d) {
    argument_lists.push_back(arguments[d].data());
    output_lists.push_back(outputs[d].data());
  }
  std::vector<PJRT_Event*> events(num_devices, nullptr);
  PJRT_ExecuteOptions options{};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  options.launch_id = static_cast<int>(launch_id);
  options.non_donatable_input_indices = non_donatable.data();
  options.num_non_donatable_input_indices = non_donatable.size();
  PJRT_LoadedExecutable_Execute_Args args{};
  args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  args.executable = (*entry)->handle;
  args.options = &options;
  args.argument_lists = argument_lists.data();
  args.num_devices = static_cast<size_t>(num_devices);
  args.num_args = static_cast<size_t>(num_args);
  args.output_lists = output_lists.data();
  // A latency-class execution is in flight until its completion events fire.
  const bool track = s.latency && static_cast<int64_t>(on_devices.size()) == num_devices;
  args.device_complete_events = event_ids.empty() && !track ? nullptr : events.data();
  args.execute_device = execute_device >= 0 ? devices_[execute_device].handle : nullptr;
  if (track) gate_->LatencyStarted(on_devices);
  Status executed = FLEXNPU_INNER_CALL(b(), PJRT_LoadedExecutable_Execute, &args);
  if (!executed.ok()) {
    if (track) {
      for (int64_t device : on_devices) gate_->LatencyDone(device);
    }
    return executed;
  }
  // The arguments the execution consumed (donated), decided at dispatch: the client answers
  // IsDeleted from this (a reply's list; one-way, the completion push's), also when what
  // follows fails.
  auto donated = std::make_shared<std::vector<int64_t>>();
  for (int64_t d = 0; d < num_devices; ++d) {
    for (int64_t i = 0; i < num_args; ++i) {
      auto deleted = b().IsDeleted(arguments[d][i]);
      if (deleted.ok() && *deleted) donated->push_back(d * num_args + i);
    }
  }
  int64_t bytes = 0;
  std::vector<int64_t> created;
  Status st;
  for (int64_t d = 0; d < num_devices; ++d) {
    for (int64_t o = 0; o < num_outputs; ++o) {
      if (!st.ok()) {
        InnerDeleter<PJRT_Buffer>{&b()}(outputs[d][o]);
        continue;
      }
      const size_t before = out->ints.size();
      st = AddBuffer(s, outputs[d][o], &out->ints, &bytes,
                     output_ids.empty() ? 0 : output_ids[d * num_outputs + o]);
      if (st.ok()) created.push_back(out->ints[before]);
    }
  }
  if (st.ok()) st = Charge(s, bytes, "the outputs of an execution");
  if (!st.ok()) {
    for (int64_t id : created) {
      InnerDeleter<PJRT_Buffer>{&b()}(s.buffers[id].handle);
      s.buffers.erase(id);
    }
  }
  const bool one_way = !output_ids.empty();
  for (int64_t d = 0; d < num_devices; ++d) {
    // A failure here is answered at once (reply, or FailOneWayExecute's pushes): the watches
    // then only free the events and the priority gate.
    const int64_t event_id =
        st.ok() && d < static_cast<int64_t>(event_ids.size()) ? event_ids[d] : 0;
    std::function<void()> done;
    if (track) done = [gate = gate_, device = on_devices[d]] { gate->LatencyDone(device); };
    if (events[d] != nullptr) {
      WatchEvent(s, events[d], event_id, nullptr, nullptr, std::move(done),
                 one_way ? donated : nullptr);
    } else if (done) {
      done();
    }
  }
  if (!st.ok()) {
    s.consumed_by_failed = *donated;
    return st;
  }
  AppendList(&out->ints, donated->data(), donated->size());
  return Status::Ok();
}

// The error an output of a failed execution names. An execution fed a failed buffer fails
// with that buffer's error: the root cause is kept once, with the number of executions it has
// propagated through (a decode loop fed a failed buffer does not grow it per step).
Status FailedOutputError(const Status& cause) {
  static const std::string kFailed = "the execution that made this buffer failed";
  static const std::string kThrough = " (propagated through ";
  std::string_view message = cause.message();
  int64_t steps = 0;
  if (message.substr(0, kFailed.size()) == kFailed) {
    std::string_view rest = message.substr(kFailed.size());
    if (rest.substr(0, 2) == ": ") {
      steps = 1;
      message = rest.substr(2);
    } else if (rest.substr(0, kThrough.size()) == kThrough) {
      rest = rest.substr(kThrough.size());
      const size_t close = rest.find(" executions): ");
      if (close != std::string_view::npos) {
        steps = std::atoll(std::string(rest.substr(0, close)).c_str());
        message = rest.substr(close + std::strlen(" executions): "));
      }
    }
  }
  if (steps == 0) return Status(cause.code(), kFailed + ": " + std::string(message));
  return Status(cause.code(), kFailed + kThrough + std::to_string(steps + 1) +
                                  " executions): " + std::string(message));
}

void ServerImpl::FailOneWayExecute(Session& s, const Frame& r, const Status& status) {
  // Fails what it can name: a malformed request still has its event ids failed when they
  // can be found, so no client thread waits for them forever.
  std::vector<int64_t> consumed;
  consumed.swap(s.consumed_by_failed);
  IntCursor c(r.ints, 5);
  std::vector<int64_t> skip, event_ids, output_ids;
  int64_t id;
  const int64_t num_devices = r.ints.size() > 1 ? r.ints[1] : 0;
  const int64_t num_args = r.ints.size() > 2 ? r.ints[2] : 0;
  bool parsed = num_devices > 0 && num_devices <= 4096 && num_args >= 0 &&
                num_args <= (1 << 20) && c.List(&skip);
  for (int64_t i = 0; parsed && i < num_devices * num_args; ++i) parsed = c.Next(&id);
  parsed = parsed && c.List(&event_ids);
  if (parsed && c.List(&output_ids)) {
    const Status failed = FailedOutputError(status);
    for (int64_t output : output_ids) {
      if (output < 0 && s.buffers.count(output) == 0) {
        s.buffers[output] = BufferEntry{nullptr, 0, failed};
      }
    }
  }
  if (!parsed) {
    Log("session " + std::to_string(s.id) + " (tenant '" + s.tenant +
        "'): a malformed one-way Execute names no events to fail: " +
        std::string(status.message()));
  }
  for (int64_t event : event_ids) {
    Frame push;
    push.op = kEventReady;
    push.ints = {event, static_cast<int64_t>(status.code())};
    push.text = status.message();
    AppendList(&push.ints, consumed.data(), consumed.size());
    s.channel->Send(push);
  }
}

Status ServerImpl::Handle(Session& s, const Frame& r, std::vector<int>& fds, Frame* out) {
  switch (r.op) {
    case kBufferFromHost:
      return BufferFromHost(s, r, fds, out);
    case kBufferToHost:
      return ToHost(s, r, fds, out);
    case kBufferToHostSize: {
      auto buffer = FindBuffer(s, r.ints);
      if (!buffer.ok()) return buffer.status();
      Layout layout;
      IntCursor lc(r.ints, 1);
      if (!ReadLayout(&lc, &layout)) return InvalidArgument("malformed ToHostSize request");
      InnerLayout inner_layout;
      PJRT_Buffer_ToHostBuffer_Args args{};
      args.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
      args.src = (*buffer)->handle;
      args.host_layout = inner_layout.Build(layout);
      FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Buffer_ToHostBuffer, &args));
      out->ints = {static_cast<int64_t>(args.dst_size)};
      return Status::Ok();
    }
    case kBufferReadyEvent: {
      auto buffer = FindBuffer(s, r.ints);
      if (!buffer.ok()) return buffer.status();
      if (r.ints.size() < 2) return InvalidArgument("malformed ReadyEvent request");
      PJRT_Buffer_ReadyEvent_Args args{};
      args.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
      args.buffer = (*buffer)->handle;
      FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Buffer_ReadyEvent, &args));
      WatchEvent(s, args.event, r.ints[1], nullptr, nullptr);
      return Status::Ok();
    }
    case kBufferDelete: {
      auto buffer = FindBuffer(s, r.ints);
      if (!buffer.ok()) return buffer.status();
      FLEXNPU_RETURN_IF_ERROR(b().Delete((*buffer)->handle));
      Release(s, (*buffer)->counted_bytes);
      (*buffer)->counted_bytes = 0;
      return Status::Ok();
    }
    case kBufferIsDeleted: {
      auto buffer = FindBuffer(s, r.ints);
      if (!buffer.ok()) return buffer.status();
      auto deleted = b().IsDeleted((*buffer)->handle);
      if (!deleted.ok()) return deleted.status();
      out->ints = {*deleted ? 1 : 0};
      return Status::Ok();
    }
    case kBufferDestroy: {
      auto failed = s.buffers.find(r.ints.empty() ? 0 : r.ints[0]);
      if (failed != s.buffers.end() && failed->second.handle == nullptr) {
        s.buffers.erase(failed);  // a failed one-way execution's output: nothing to destroy
        return Status::Ok();
      }
      auto buffer = FindBuffer(s, r.ints);
      if (!buffer.ok()) return buffer.status();
      if (s.tenant_state != nullptr && s.tenant_state->config.memory_quota_bytes >= 0) {
        // A tenant with a quota gets its bytes back only once they are free, and its next
        // request must not be refused for bytes it has already given back: destroy in line
        // (the session's later requests wait, as they did before the reaper).
        InnerDeleter<PJRT_Buffer>{&b()}((*buffer)->handle);
        Release(s, (*buffer)->counted_bytes);
      } else {
        Release(s, (*buffer)->counted_bytes);
        reaper_.Destroy((*buffer)->handle);
      }
      s.buffers.erase(r.ints[0]);
      return Status::Ok();
    }
    case kBufferCopyToMemory: {
      auto buffer = FindBuffer(s, r.ints);
      if (!buffer.ok()) return buffer.status();
      if (r.ints.size() < 2 || s.memories.count(r.ints[1]) == 0) {
        return PermissionDenied("CopyToMemory: the memory is outside the device set of tenant '" +
                                s.tenant + "'");
      }
      PJRT_Buffer_CopyToMemory_Args args{};
      args.struct_size = PJRT_Buffer_CopyToMemory_Args_STRUCT_SIZE;
      args.buffer = (*buffer)->handle;
      args.dst_memory = memories_[r.ints[1]].handle;
      FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Buffer_CopyToMemory, &args));
      int64_t bytes = 0;
      FLEXNPU_RETURN_IF_ERROR(AddBuffer(s, args.dst_buffer, &out->ints, &bytes));
      Status charged = Charge(s, bytes, "a device-to-device copy");
      if (!charged.ok()) {
        InnerDeleter<PJRT_Buffer>{&b()}(s.buffers[out->ints[0]].handle);
        s.buffers.erase(out->ints[0]);
        return charged;
      }
      return Status::Ok();
    }
    case kCompile:
      return Compile(s, r, out);
    case kDeserialize:
      return Deserialize(s, r, out);
    case kOptimizedProgram:
    case kSerialize:
    case kExecutableDelete:
    case kExecutableDestroy:
      return ExecutableCall(s, r, out);
    case kExecute:
      return Execute(s, r, out);
    case kStats:
      out->text = StatsJson();
      return Status::Ok();
    default:
      return Unimplemented("flexnpu daemon: unknown op " + std::to_string(r.op));
  }
}

void ServerImpl::EndSession(Session& s) {
  ::shutdown(s.channel->fd, SHUT_RDWR);
  int64_t bytes = 0;
  for (auto& [id, entry] : s.buffers) {
    bytes += entry.counted_bytes;
    if (entry.handle != nullptr) InnerDeleter<PJRT_Buffer>{&b()}(entry.handle);
  }
  s.buffers.clear();
  for (auto& [id, entry] : s.executables) InnerDeleter<PJRT_LoadedExecutable>{&b()}(entry.handle);
  s.executables.clear();
  // Events whose callbacks have not run yet: destroying the handle leaves the callback armed
  // (it holds the channel, whose writes now fail quietly).
  DrainFired(s);
  for (PJRT_Event* e : s.events) InnerDeleter<PJRT_Event>{&b()}(e);
  s.events.clear();
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(s.tenant);
  if (it != tenants_.end() && !s.observer && !s.tenant.empty()) {
    it->second.bytes_in_use -= bytes;
    --it->second.sessions;
    ++sessions_reclaimed_;
  }
}

void ServerImpl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  if (accept_thread_.joinable()) accept_thread_.join();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    ::unlink(config_.socket_path.c_str());
  }
  if (gate_) gate_->WakeAll();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, s] : sessions_) ::shutdown(s->channel->fd, SHUT_RD);
  }
  Reap(true);
  reaper_.Stop();
  Log("stopped");
}

std::string ServerImpl::StatsJson() const {
  std::ostringstream out;
  std::unique_lock<std::mutex> lock(mu_);
  out << "{\"socket\": " << JsonString(config_.socket_path)
      << ", \"backend\": " << JsonString(config_.backend_path)
      << ", \"platform\": " << JsonString(platform_name_)
      << ", \"devices\": " << devices_.size() << ", \"protocol\": " << kProtocolVersion
      << ", \"sessions_served\": " << sessions_served_
      << ", \"sessions_reclaimed\": " << sessions_reclaimed_ << ", \"sessions\": [";
  bool first = true;
  for (const auto& [id, s] : sessions_) {
    if (!s->greeted || s->observer || s->finished) continue;
    if (!first) out << ", ";
    first = false;
    out << "{\"id\": " << id << ", \"tenant\": " << JsonString(s->tenant)
        << ", \"buffers\": " << s->buffer_count.load() << ", \"executables\": "
        << s->executable_count.load() << "}";
  }
  out << "], \"tenants\": {";
  first = true;
  for (const auto& [name, t] : tenants_) {
    if (!first) out << ", ";
    first = false;
    out << JsonString(name) << ": {\"sessions\": " << t.sessions
        << ", \"bytes_in_use\": " << t.bytes_in_use
        << ", \"memory_quota_bytes\": " << t.config.memory_quota_bytes
        << ", \"priority\": " << JsonString(t.config.priority)
        << ", \"executions\": " << t.executions.load()
        << ", \"held_for_latency\": " << t.held_for_latency.load()
        << ", \"held_past_max_wait\": " << t.held_past_max_wait.load() << ", \"devices\": [";
    for (size_t i = 0; i < t.config.devices.size(); ++i) {
      out << (i ? ", " : "") << t.config.devices[i];
    }
    out << "], \"requests\": {";
    bool first_op = true;
    for (uint32_t op = 1; op <= kLastRequestOp; ++op) {
      const int64_t count = t.requests[op].count.load();
      if (count == 0) continue;
      out << (first_op ? "" : ", ") << JsonString(OpName(op)) << ": {\"count\": " << count
          << ", \"handler_us\": " << t.requests[op].handler_ns.load() / 1000 << "}";
      first_op = false;
    }
    out << "}, \"pushes\": " << t.pushes.load()
        << ", \"bytes_to_device\": " << t.bytes_to_device.load()
        << ", \"bytes_to_host\": " << t.bytes_to_host.load() << "}";
  }
  out << "}, \"latency_in_flight\": [";
  const std::vector<int64_t> in_flight = gate_->InFlight();
  for (size_t d = 0; d < in_flight.size(); ++d) out << (d ? ", " : "") << in_flight[d];
  out << "]";
  lock.unlock();  // the runtime takes its own locks: never under the daemon's
  // The runtime's own state when the backend is FlexNPU's plugin: its placer decides for
  // every session, so its placements (by reason) are the daemon's.
  if (runtime_stats_ != nullptr) {
    const char* runtime = runtime_stats_();
    out << ", \"runtime\": " << (runtime != nullptr && *runtime ? runtime : "[]");
  }
  out << "}";
  return out.str();
}

}  // namespace

StatusOr<std::unique_ptr<Server>> Server::Start(ServerConfig config) {
  auto server = std::make_unique<ServerImpl>(std::move(config));
  FLEXNPU_RETURN_IF_ERROR(server->Init());
  return std::unique_ptr<Server>(std::move(server));
}

}  // namespace flexnpu::daemon
