#include "pjrt_flexnpu/runtime/trace.h"

#include <chrono>
#include <cstdio>
#include <sstream>

#include "pjrt_flexnpu/base/json.h"

namespace flexnpu {
namespace {

// Chrome's reserved color names: prefill red, decode green, small grey.
const char* ColorOf(const char* phase) {
  const std::string p(phase);
  if (p == "prefill") return "terrible";
  if (p == "decode") return "good";
  return "grey";
}

void Micros(std::ostringstream& out, int64_t ns) {
  char buffer[32];
  std::snprintf(buffer, sizeof(buffer), "%.3f", static_cast<double>(ns) / 1e3);
  out << buffer;
}

}  // namespace

void Trace::Start() {
  std::lock_guard<std::mutex> lock(mu_);
  events_.clear();
  dropped_ = 0;
  started_ns_ = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now().time_since_epoch())
                    .count();
  enabled_.store(true, std::memory_order_relaxed);
}

void Trace::RecordLocked(const TraceEvent& event) {
  if (event.start_ns < started_ns_) return;
  if (events_.size() >= kCapacity) {
    ++dropped_;
    return;
  }
  try {
    events_.push_back(event);
  } catch (const std::bad_alloc&) {
    ++dropped_;
  }
}

void Trace::EndLocked() {
  if (in_flight_ > 0 && --in_flight_ == 0) drained_.notify_all();
}

void Trace::Record(const TraceEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  RecordLocked(event);
}

void Trace::BeginExecution() {
  std::lock_guard<std::mutex> lock(mu_);
  ++in_flight_;
}

void Trace::FinishExecution(const TraceEvent& event) {
  std::lock_guard<std::mutex> lock(mu_);
  RecordLocked(event);
  EndLocked();
}

void Trace::AbandonExecution() {
  std::lock_guard<std::mutex> lock(mu_);
  EndLocked();
}

std::string Trace::ChromeJson(int num_physical, const std::string& title) const {
  std::unique_lock<std::mutex> lock(mu_);
  // Executions still running past the timeout (the program never waited for them) are
  // reported as unfinished rather than holding the caller.
  drained_.wait_for(lock, std::chrono::milliseconds(kDrainTimeoutMs),
                    [this] { return in_flight_ == 0; });
  int64_t origin = 0;
  for (const auto& e : events_) {
    if (origin == 0 || e.start_ns < origin) origin = e.start_ns;
  }
  std::ostringstream out;
  out << "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"title\":" << JsonString(title)
      << ",\"dropped_events\":" << dropped_
      << ",\"unfinished_executions\":" << in_flight_ << "},\"traceEvents\":[";
  bool first = true;
  auto comma = [&] {
    if (!first) out << ",";
    first = false;
  };
  for (int p = 0; p < num_physical; ++p) {
    comma();
    out << "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":" << p
        << ",\"args\":{\"name\":\"physical device " << p << "\"}}";
    comma();
    out << "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":" << p
        << ",\"args\":{\"sort_index\":" << p << "}}";
    // A device's two tracks: tid 0 its executions, tid 1 the migrations out of and into it.
    const char* const tracks[] = {"executions", "migrations"};
    for (int tid = 0; tid < 2; ++tid) {
      comma();
      out << "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":" << p << ",\"tid\":" << tid
          << ",\"args\":{\"name\":\"" << tracks[tid] << "\"}}";
    }
  }
  uint64_t flow_id = 0;
  for (const auto& e : events_) {
    if (e.kind == TraceEvent::Kind::kExecution) {
      comma();
      out << "{\"name\":\"" << e.phase << "\",\"cat\":\"" << e.phase << "\",\"ph\":\"X\",\"pid\":"
          << e.physical_device << ",\"tid\":0,\"ts\":";
      Micros(out, e.start_ns - origin);
      out << ",\"dur\":";
      Micros(out, e.end_ns - e.start_ns);
      out << ",\"cname\":\"" << ColorOf(e.phase) << "\",\"args\":{\"virtual_device\":"
          << e.virtual_device << ",\"executable\":" << e.executable_id
          << ",\"ok\":" << (e.ok ? "true" : "false") << "}}";
    } else if (e.kind == TraceEvent::Kind::kTelemetry) {
      comma();
      out << "{\"name\":\"telemetry\",\"ph\":\"C\",\"pid\":" << e.physical_device
          << ",\"ts\":";
      Micros(out, e.start_ns - origin);
      out << ",\"args\":{";
      if (e.bytes >= 0) out << "\"memory_free_GB\":" << static_cast<double>(e.bytes) / 1e9;
      if (e.utilization >= 0) {
        out << (e.bytes >= 0 ? "," : "") << "\"utilization\":" << e.utilization;
      }
      out << "}}";
    } else {
      ++flow_id;
      comma();
      out << "{\"name\":\"migration out\",\"cat\":\"migration\",\"ph\":\"X\",\"pid\":"
          << e.physical_device << ",\"tid\":1,\"ts\":";
      Micros(out, e.start_ns - origin);
      out << ",\"dur\":1,\"args\":{\"bytes\":" << e.bytes << ",\"to\":" << e.target_device
          << "}}";
      for (int side = 0; side < 2; ++side) {
        comma();
        out << "{\"name\":\"migrate\",\"cat\":\"migration\",\"ph\":\"" << (side ? "f" : "s")
            << "\",\"bp\":\"e\",\"id\":" << flow_id << ",\"pid\":"
            << (side ? e.target_device : e.physical_device) << ",\"tid\":1,\"ts\":";
        Micros(out, (side ? e.end_ns : e.start_ns) - origin);
        out << ",\"args\":{\"bytes\":" << e.bytes << ",\"virtual_device\":" << e.virtual_device
            << "}}";
      }
      // A short slice on the destination marks the arrival (flows attach to slices).
      comma();
      out << "{\"name\":\"migration in\",\"cat\":\"migration\",\"ph\":\"X\",\"pid\":"
          << e.target_device << ",\"tid\":1,\"ts\":";
      Micros(out, e.end_ns - origin);
      out << ",\"dur\":1,\"args\":{\"bytes\":" << e.bytes << ",\"from\":" << e.physical_device
          << "}}";
    }
  }
  out << "]}";
  return out.str();
}

}  // namespace flexnpu
