// The daemon's server: its socket and accept loop, the sessions' threads, start, stop and
// stats. What sessions run against is the Dispatcher's (dispatch.h).
#include "pjrt_flexnpu/daemon/server.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>

#include "pjrt_flexnpu/base/json.h"
#include "pjrt_flexnpu/base/thread_name.h"
#include "pjrt_flexnpu/daemon/dispatch.h"

namespace flexnpu::daemon {
namespace {

// Every device a tenant names must be one the physical backend has.
Status CheckTenantDevices(const std::vector<TenantConfig>& tenants,
                          const std::vector<Device>& devices) {
  for (const TenantConfig& t : tenants) {
    for (int64_t device : t.devices) {
      bool known = false;
      for (const Device& d : devices) known = known || d.id == device;
      if (!known) {
        return InvalidArgument("tenant '" + t.name + "' names device " + std::to_string(device) +
                               ", which the physical backend does not have (it has " +
                               std::to_string(devices.size()) + ")");
      }
    }
  }
  return Status::Ok();
}

// A listening socket at `path`: refuses to take over a live daemon's, replaces a stale one.
StatusOr<int> Listen(const std::string& path) {
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
  const int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Internal("socket() failed");
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(fd, 64) != 0) {
    const std::string why = std::strerror(errno);
    ::close(fd);
    return Status(Code::kUnavailable, "cannot listen on " + path + ": " + why);
  }
  return fd;
}

class ServerImpl final : public Server {
 public:
  explicit ServerImpl(ServerConfig config) : config_(std::move(config)) {}
  ~ServerImpl() override { Stop(); }

  Status Init();
  void Stop() override;
  std::string StatsJson() const override;

 private:
  void AcceptLoop();
  // Joins the threads of finished sessions (of every session when `all`).
  void Reap(bool all);

  ServerConfig config_;
  std::atomic<bool> stopping_{false};
  Dispatcher dispatcher_{config_, stopping_, *this};

  int listen_fd_ = -1;
  bool stopped_ = false;
  std::thread accept_thread_;

  mutable std::mutex mu_;  // sessions_
  std::map<int64_t, std::shared_ptr<Session>> sessions_;
};

Status ServerImpl::Init() {
  FLEXNPU_RETURN_IF_ERROR(dispatcher_.Open());
  FLEXNPU_RETURN_IF_ERROR(CheckTenantDevices(config_.tenants, dispatcher_.physical().devices));
  FLEXNPU_ASSIGN_OR_RETURN(listen_fd_, Listen(config_.socket_path));
  accept_thread_ = std::thread([this] {
    NameThisThread("flexnpu-dmn-acc");
    AcceptLoop();
  });
  Log(config_, "serving " + config_.socket_path + " over " + dispatcher_.physical().platform_name +
                   " (" + config_.backend_path + ", " +
                   std::to_string(dispatcher_.physical().devices.size()) + " devices, protocol " +
                   std::to_string(kProtocolVersion) + ")");
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
    session->id = dispatcher_.NextId();
    session->channel = std::make_shared<Channel>(fd);
    {
      std::lock_guard<std::mutex> lock(mu_);
      sessions_[session->id] = session;
    }
    session->thread = std::thread([this, session] {
      NameThisThread("flexnpu-dmn-ses");
      dispatcher_.Serve(*session);
    });
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

void ServerImpl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_ = true;
  // A daemon that failed to start says why (Init's error), not that it stopped.
  const bool was_serving = accept_thread_.joinable();
  if (was_serving) accept_thread_.join();
  if (listen_fd_ >= 0) {
    ::close(listen_fd_);
    listen_fd_ = -1;
    ::unlink(config_.socket_path.c_str());
  }
  dispatcher_.WakeBatchWaiters();
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [id, s] : sessions_) ::shutdown(s->channel->fd, SHUT_RD);
  }
  Reap(true);
  dispatcher_.StopReaper();
  if (was_serving) Log(config_, "stopped");
}

std::string ServerImpl::StatsJson() const {
  const PhysicalClient& physical = dispatcher_.physical();
  std::ostringstream out;
  std::unique_lock<std::mutex> lock(mu_);
  const Tenants::Stats tenants = dispatcher_.tenants().Snapshot();
  out << "{\"socket\": " << JsonString(config_.socket_path)
      << ", \"backend\": " << JsonString(config_.backend_path)
      << ", \"platform\": " << JsonString(physical.platform_name)
      << ", \"devices\": " << physical.devices.size() << ", \"protocol\": " << kProtocolVersion
      << ", \"sessions_served\": " << tenants.sessions_served
      << ", \"sessions_reclaimed\": " << tenants.sessions_reclaimed << ", \"sessions\": [";
  bool first = true;
  for (const auto& [id, s] : sessions_) {
    if (!s->greeted || s->observer || s->finished) continue;
    if (!first) out << ", ";
    first = false;
    out << "{\"id\": " << id << ", \"tenant\": " << JsonString(s->tenant)
        << ", \"buffers\": " << s->buffer_count.load() << ", \"executables\": "
        << s->executable_count.load() << "}";
  }
  out << "], \"tenants\": " << tenants.json << ", \"latency_in_flight\": [";
  const std::vector<int64_t> in_flight = dispatcher_.LatencyInFlight();
  for (size_t d = 0; d < in_flight.size(); ++d) out << (d ? ", " : "") << in_flight[d];
  out << "]";
  lock.unlock();  // the runtime takes its own locks: never under the daemon's
  // The runtime's own state when the backend is FlexNPU's plugin: its placer decides for
  // every session, so its placements (by reason) are the daemon's.
  if (physical.runtime_stats != nullptr) {
    const char* runtime = physical.runtime_stats();
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
