// The observability counters: Core::Snapshot reads them from the state, Stats::ToJson writes
// them as one JSON object.
#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <string>

#include "pjrt_flexnpu/placement/core_state.h"
#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement {
namespace {

void Num(std::string& o, const char* key, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "\"%s\":%.17g,", key, std::isfinite(v) ? v : 0.0);
  o += buf;
}
void Int(std::string& o, const char* key, long long v) {
  o += "\"" + std::string(key) + "\":" + std::to_string(v) + ",";
}
void Bool(std::string& o, const char* key, bool v) {
  o += "\"" + std::string(key) + "\":" + (v ? "true," : "false,");
}
void Close(std::string& o, char c) {
  if (!o.empty() && o.back() == ',') o.pop_back();
  o += c;
  o += ',';
}
void Phases(std::string& o, const uint64_t (&n)[kNumPhases]) {
  o += "\"executions\":{";
  for (int p = 0; p < kNumPhases; ++p) Int(o, PhaseName(static_cast<Phase>(p)), n[p]);
  Close(o, '}');
}
template <typename T>
void Reasons(std::string& o, const char* key, const T (&n)[kNumReasons]) {
  o += "\"" + std::string(key) + "\":{";
  for (int r = 0; r < kNumReasons; ++r) {
    Int(o, ReasonName(static_cast<Reason>(r)), static_cast<long long>(n[r]));
  }
  Close(o, '}');
}
void Pool(std::string& o, const char* key, const std::vector<int>& pool) {
  o += "\"" + std::string(key) + "\":[";
  for (int d : pool) o += std::to_string(d) + ",";
  Close(o, ']');
}

}  // namespace

Stats Core::Snapshot(int64_t now_ns) const {
  const CoreState& s = *s_;
  std::lock_guard<std::mutex> lock(s_->mu);
  Stats out;
  out.policy = s.policy.ToString();
  out.prefill_pool = s.policy.prefill_pool;
  out.decode_pool = s.policy.decode_pool;
  out.now_ns = now_ns;
  // The clock starts at the first placement or the first passthrough execution measured.
  const int64_t since =
      std::min(s.have_created ? s.created_ns : INT64_MAX,
               s.passthrough_since.load(std::memory_order_relaxed));
  out.elapsed_ns = since != INT64_MAX ? std::max<int64_t>(0, now_ns - since) : 0;
  out.decisions = s.decisions;
  out.policy_switches = s.policy_switches;
  out.executables = s.exec_factor->size();
  const double elapsed = static_cast<double>(out.elapsed_ns);
  constexpr int kPassthrough = static_cast<int>(Reason::kPassthrough);
  out.physical = s.dstats;
  for (int d = 0; d < s.P; ++d) {
    DeviceStats& ds = out.physical[d];
    const PassthroughCounts& pc = s.passthrough_physical[d];
    for (int p = 0; p < kNumPhases; ++p) {
      const uint64_t n = pc.executions[p].load(std::memory_order_relaxed);
      ds.executions[p] += n;
      ds.decisions[kPassthrough] += n;
      out.decisions += n;
    }
    ds.busy_ns += pc.busy_ns.load(std::memory_order_relaxed);
    ds.queue_length = s.outstanding[d];
    ds.prefill_outstanding = s.prefill_outstanding[d];
    ds.busy_fraction = elapsed > 0 ? std::min(1.0, ds.busy_ns / elapsed) : 0;
    ds.predicted_drain_ns =
        s.outstanding[d] > 0
            ? std::max<int64_t>(0, static_cast<int64_t>(s.avail[d]) - now_ns)
            : 0;
    ds.quarantined = now_ns < s.quarantine_until[d];
    ds.speed_factor = s.k_dev[d];
    ds.decode_streams = s.decode_streams[d];
    ds.decode_weight = s.decode_weight[d];
    ds.memory_free_bytes =
        s.mem_free[d] >= 0 ? std::max<int64_t>(0, s.mem_free[d] - s.mem_pending[d]) : -1;
  }
  out.virtual_devices = s.vstats;
  for (int v = 0; v < s.V; ++v) {
    VirtualStats& vs = out.virtual_devices[v];
    const PassthroughCounts& pc = s.passthrough_virtual[v];
    uint64_t passthrough = 0;
    for (int p = 0; p < kNumPhases; ++p) {
      const uint64_t n = pc.executions[p].load(std::memory_order_relaxed);
      vs.executions[p] += n;
      passthrough += n;
    }
    vs.decisions[kPassthrough] += passthrough;
    vs.busy_ns += pc.busy_ns.load(std::memory_order_relaxed);
    vs.home = s.home[v];
    // Never placed, but run at home by the passthrough fast path.
    vs.current = s.current[v] >= 0 || passthrough == 0 ? s.current[v] : s.home[v];
    vs.busy_fraction = elapsed > 0 ? std::min(1.0, vs.busy_ns / elapsed) : 0;
  }
  return out;
}

std::string Stats::ToJson() const {
  std::string o = "{";
  o += "\"policy\":\"" + policy + "\",";  // policy text is generated: no characters to escape
  Pool(o, "prefill_pool", prefill_pool);
  Pool(o, "decode_pool", decode_pool);
  Int(o, "now_ns", now_ns);
  Int(o, "elapsed_ns", elapsed_ns);
  Int(o, "decisions_total", static_cast<long long>(decisions));
  Int(o, "policy_switches", static_cast<long long>(policy_switches));
  Int(o, "executables", static_cast<long long>(executables));
  o += "\"physical\":[";
  for (size_t d = 0; d < physical.size(); ++d) {
    const DeviceStats& s = physical[d];
    o += "{";
    Int(o, "device", static_cast<long long>(d));
    Int(o, "queue_length", s.queue_length);
    Int(o, "prefill_outstanding", s.prefill_outstanding);
    Int(o, "busy_ns", s.busy_ns);
    Num(o, "busy_fraction", s.busy_fraction);
    Int(o, "predicted_drain_ns", s.predicted_drain_ns);
    Phases(o, s.executions);
    Reasons(o, "decisions", s.decisions);
    Int(o, "errors", static_cast<long long>(s.errors));
    Int(o, "bytes_migrated_in", s.bytes_migrated_in);
    Reasons(o, "bytes_migrated_in_by_reason", s.bytes_migrated_in_by_reason);
    Bool(o, "quarantined", s.quarantined);
    Num(o, "speed_factor", s.speed_factor);
    Int(o, "decode_streams", s.decode_streams);
    Num(o, "decode_weight", s.decode_weight);
    Int(o, "memory_free_bytes", s.memory_free_bytes);
    Num(o, "utilization", s.utilization);
    Num(o, "external_utilization", s.external_utilization);
    Int(o, "memory_skips", static_cast<long long>(s.memory_skips));
    Close(o, '}');
  }
  Close(o, ']');
  o += "\"virtual\":[";
  for (size_t v = 0; v < virtual_devices.size(); ++v) {
    const VirtualStats& s = virtual_devices[v];
    o += "{";
    Int(o, "device", static_cast<long long>(v));
    Int(o, "home", s.home);
    Int(o, "current", s.current);
    Int(o, "queue_length", s.queue_length);
    Int(o, "busy_ns", s.busy_ns);
    Num(o, "busy_fraction", s.busy_fraction);
    Phases(o, s.executions);
    Reasons(o, "decisions", s.decisions);
    Int(o, "bytes_migrated", s.bytes_migrated);
    Close(o, '}');
  }
  Close(o, ']');
  o.back() = '}';  // replaces the trailing ','
  return o;
}

}  // namespace flexnpu::placement
