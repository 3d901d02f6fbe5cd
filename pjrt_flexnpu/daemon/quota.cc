#include "pjrt_flexnpu/daemon/quota.h"

#include <sstream>

#include "pjrt_flexnpu/base/json.h"

namespace flexnpu::daemon {

Tenants::Tenants(const std::vector<TenantConfig>& configs) {
  for (const TenantConfig& t : configs) tenants_[t.name].config = t;
}

StatusOr<TenantState*> Tenants::Join(const std::string& name, bool observer,
                                     bool allow_unknown_tenants) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(name);
  if (it == tenants_.end() && !observer) {
    if (!allow_unknown_tenants) {
      return PermissionDenied("unknown tenant '" + name +
                              "': this flexnpu daemon's tenants file does not list it and "
                              "refuses unknown tenants");
    }
    it = tenants_.try_emplace(name).first;
    it->second.config.name = name;
  }
  if (it == tenants_.end()) return nullptr;
  if (!observer) {
    ++it->second.sessions;
    ++sessions_served_;
  }
  return &it->second;
}

void Tenants::Leave(const std::string& name, bool observer, int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = tenants_.find(name);
  if (it != tenants_.end() && !observer && !name.empty()) {
    it->second.bytes_in_use -= bytes;
    --it->second.sessions;
    ++sessions_reclaimed_;
  }
}

Status Tenants::Charge(const std::string& name, int64_t bytes, const char* what) {
  std::lock_guard<std::mutex> lock(mu_);
  TenantState& t = tenants_[name];
  const int64_t quota = t.config.memory_quota_bytes;
  if (quota >= 0 && t.bytes_in_use + bytes > quota) {
    return ResourceExhausted("tenant '" + name + "' is over its memory quota: " + what +
                             " needs " + std::to_string(bytes) + " bytes, " +
                             std::to_string(t.bytes_in_use) + " of its quota of " +
                             std::to_string(quota) + " bytes are in use");
  }
  t.bytes_in_use += bytes;
  return Status::Ok();
}

void Tenants::Release(const std::string& name, int64_t bytes) {
  if (bytes == 0) return;
  std::lock_guard<std::mutex> lock(mu_);
  tenants_[name].bytes_in_use -= bytes;
}

Tenants::Stats Tenants::Snapshot() const {
  std::ostringstream out;
  std::lock_guard<std::mutex> lock(mu_);
  out << "{";
  bool first = true;
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
  out << "}";
  return Stats{sessions_served_, sessions_reclaimed_, out.str()};
}

}  // namespace flexnpu::daemon
