// A timeline of what the physical devices did, for Chrome/Perfetto: one track per physical
// device, executions colored by phase, input migrations as flows between tracks, telemetry
// (free memory, utilisation from AscendCL / NVML) as counters. Off by default; recording
// takes one short lock per event.
#ifndef FLEXNPU_RUNTIME_TRACE_H_
#define FLEXNPU_RUNTIME_TRACE_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace flexnpu {

struct TraceEvent {
  enum class Kind : uint8_t { kExecution, kMigration, kTelemetry };
  Kind kind = Kind::kExecution;
  int physical_device = 0;  // where it ran; a migration's source
  int target_device = 0;    // a migration's destination
  int virtual_device = 0;
  const char* phase = "small";  // static string
  int64_t start_ns = 0;
  int64_t end_ns = 0;
  int64_t bytes = 0;           // telemetry: free memory (-1 unknown), at start_ns
  double utilization = -1;     // telemetry: compute busy fraction (-1 unknown)
  uint64_t executable_id = 0;
  bool ok = true;
};

class Trace {
 public:
  static constexpr size_t kCapacity = 1 << 20;  // events kept; later ones are counted, not kept

  bool enabled() const { return enabled_.load(std::memory_order_relaxed); }
  // Starting clears what an earlier trace recorded.
  void Start();
  void Stop() { enabled_.store(false, std::memory_order_relaxed); }
  void Record(const TraceEvent& event);

  // Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev); `num_physical` tracks.
  std::string ChromeJson(int num_physical, const std::string& title) const;

 private:
  std::atomic<bool> enabled_{false};
  mutable std::mutex mu_;
  std::vector<TraceEvent> events_;
  uint64_t dropped_ = 0;
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_TRACE_H_
