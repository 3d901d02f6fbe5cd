// flexnpu._native daemon bindings: the per-host daemon's server (pjrt_flexnpu/daemon) for
// `python -m flexnpu daemon` (flexnpu/cli/daemon.py). Its threads are C++ threads; Python only
// starts it, asks for stats and stops it (on SIGTERM).
#ifdef FLEXNPU_HAVE_DAEMON
#include <nanobind/nanobind.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/unique_ptr.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "pjrt_flexnpu/daemon/server.h"

namespace nb = nanobind;

namespace flexnpu::python {
namespace {

using Tenant = std::tuple<std::string, int64_t, std::vector<int64_t>, std::string>;

class DaemonServer {
 public:
  static std::unique_ptr<DaemonServer> Start(
      const std::string& socket, const std::string& backend_path,
      const std::vector<std::pair<std::string, int64_t>>& backend_int_options,
      const std::vector<Tenant>& tenants, bool allow_unknown_tenants, bool log,
      const std::vector<std::pair<std::string, std::string>>& backend_string_options,
      int64_t batch_max_wait_ms) {
    daemon::ServerConfig config;
    config.socket_path = socket;
    config.backend_path = backend_path;
    config.backend_int_options = backend_int_options;
    config.backend_string_options = backend_string_options;
    config.batch_max_wait_ms = batch_max_wait_ms;
    config.allow_unknown_tenants = allow_unknown_tenants;
    config.log = log;
    for (const auto& [name, quota, devices, priority] : tenants) {
      config.tenants.push_back(daemon::TenantConfig{name, quota, devices, priority});
    }
    StatusOr<std::unique_ptr<daemon::Server>> server = [&] {
      nb::gil_scoped_release release;
      return daemon::Server::Start(std::move(config));
    }();
    if (!server.ok()) throw std::runtime_error(server.status().message());
    auto out = std::make_unique<DaemonServer>();
    out->server_ = std::move(*server);
    return out;
  }
  void Stop() {
    nb::gil_scoped_release release;
    if (server_) server_->Stop();
  }
  std::string StatsJson() const { return server_ ? server_->StatsJson() : "{}"; }

 private:
  std::unique_ptr<daemon::Server> server_;
};

}  // namespace

void RegisterDaemon(nb::module_& m) {
  nb::class_<DaemonServer>(m, "DaemonServer")
      .def_static("start", &DaemonServer::Start, nb::arg("socket"), nb::arg("backend_path"),
                  nb::arg("backend_int_options"), nb::arg("tenants"),
                  nb::arg("allow_unknown_tenants"), nb::arg("log") = true,
                  nb::arg("backend_string_options") =
                      std::vector<std::pair<std::string, std::string>>{},
                  nb::arg("batch_max_wait_ms") = 50)
      .def("stop", &DaemonServer::Stop)
      .def("stats_json", &DaemonServer::StatsJson);
}

}  // namespace flexnpu::python
#endif  // FLEXNPU_HAVE_DAEMON
