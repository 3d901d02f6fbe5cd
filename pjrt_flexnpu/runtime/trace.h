// A timeline of what the physical devices did, for Chrome/Perfetto: one track per physical
// device, executions colored by phase, input migrations as flows between tracks, telemetry
// (free memory, utilisation from AscendCL / NVML) as counters. Off by default; recording
// takes one short lock per event.
#ifndef FLEXNPU_RUNTIME_TRACE_H_
#define FLEXNPU_RUNTIME_TRACE_H_

#include <atomic>
#include <condition_variable>
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

  // An execution's event is recorded by its completion callback, which the inner plugin may
  // run just after the outputs are ready: a program that waited for its results and then asks
  // for the trace would miss the last executions. So executions are counted from dispatch
  // (BeginExecution) to their event (FinishExecution) or to a callback that will never run
  // (AbandonExecution), and ChromeJson waits, for at most kDrainTimeout, for those in flight.
  void BeginExecution();
  void FinishExecution(const TraceEvent& event);
  void AbandonExecution();
  static constexpr int64_t kDrainTimeoutMs = 2000;

  // Chrome trace-event JSON (chrome://tracing, ui.perfetto.dev); `num_physical` tracks.
  std::string ChromeJson(int num_physical, const std::string& title) const;

 private:
  std::atomic<bool> enabled_{false};
  void RecordLocked(const TraceEvent& event);
  void EndLocked();

  mutable std::mutex mu_;
  mutable std::condition_variable drained_;
  std::vector<TraceEvent> events_;
  uint64_t dropped_ = 0;
  int64_t started_ns_ = 0;   // events that began before the last Start belong to no trace
  int64_t in_flight_ = 0;    // executions begun and not yet finished or abandoned
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_TRACE_H_
