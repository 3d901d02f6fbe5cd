// Stats::ToJson: the observability counters as one JSON object.
#include <cmath>
#include <cstdio>
#include <string>

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
void Reasons(std::string& o, const uint64_t (&n)[kNumReasons]) {
  o += "\"decisions\":{";
  for (int r = 0; r < kNumReasons; ++r) Int(o, ReasonName(static_cast<Reason>(r)), n[r]);
  Close(o, '}');
}
void Pool(std::string& o, const char* key, const std::vector<int>& pool) {
  o += "\"" + std::string(key) + "\":[";
  for (int d : pool) o += std::to_string(d) + ",";
  Close(o, ']');
}

}  // namespace

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
    Reasons(o, s.decisions);
    Int(o, "errors", static_cast<long long>(s.errors));
    Int(o, "bytes_migrated_in", s.bytes_migrated_in);
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
    Reasons(o, s.decisions);
    Int(o, "bytes_migrated", s.bytes_migrated);
    Close(o, '}');
  }
  Close(o, ']');
  o.back() = '}';  // replaces the trailing ','
  return o;
}

}  // namespace flexnpu::placement
