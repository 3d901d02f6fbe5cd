#include "pjrt_flexnpu/runtime/telemetry.h"

#include <algorithm>
#include <cctype>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <sstream>

#include "pjrt_flexnpu/base/json.h"
#include "pjrt_flexnpu/runtime/placer.h"

namespace flexnpu {
namespace {

std::string JsonInt(int64_t v) { return v < 0 ? "null" : std::to_string(v); }

bool IsCuda(const std::string& platform) {
  std::string p;
  for (char c : platform) p += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return p == "cuda" || p == "gpu" || p.find("cuda") != std::string::npos;
}

}  // namespace

StatusOr<std::unique_ptr<PhysicalTelemetry>> PhysicalTelemetry::Open(
    const Options& options, const PhysicalBackend& backend,
    const std::vector<PJRT_Device*>& devices, const std::vector<int64_t>& pjrt_ids,
    const std::string& backend_platform) {
  std::unique_ptr<PhysicalTelemetry> t(new PhysicalTelemetry());
  t->mode_ = options.telemetry;
  t->period_ms_ = options.telemetry_period_ms;
  t->pjrt_ids_ = pjrt_ids;
  t->index_of_physical_.assign(devices.size(), -1);
  auto mode = hardware::ParseTelemetryMode(options.telemetry);
  if (!mode.ok()) return Status(mode.status().code(), "FlexNPU option 'telemetry': " +
                                                          mode.status().message());
  const bool explicit_source = *mode == hardware::TelemetryMode::kAscendCl ||
                               *mode == hardware::TelemetryMode::kNvml;
  hardware::SourceOptions so;
  so.mode = *mode;
  so.ascendcl_library = options.ascendcl_library;
  so.nvml_library = options.nvml_library;
  so.backend_is_cuda = IsCuda(backend_platform);
  auto opened = hardware::OpenTelemetry(so);
  if (!opened.ok()) {
    return Status(opened.status().code(),
                  "FlexNPU telemetry '" + options.telemetry + "': " + opened.status().message());
  }
  t->fallback_ = opened->fallback;
  const auto give_up = [&](const std::string& why) -> StatusOr<std::unique_ptr<PhysicalTelemetry>> {
    if (explicit_source) return Status(Code::kFailedPrecondition, "FlexNPU telemetry '" +
                                                                      options.telemetry + "': " + why);
    t->fallback_ = "telemetry auto: none (" + why + ")";
    t->source_.reset();
    t->infos_.clear();
    std::fprintf(stderr, "flexnpu: %s\n", t->fallback_.c_str());
    return std::move(t);
  };
  if (opened->source == nullptr) {
    if (!opened->fallback.empty() && !opened->nothing_installed) {
      std::fprintf(stderr, "flexnpu: %s\n", opened->fallback.c_str());
    }
    return t;
  }
  t->source_ = std::shared_ptr<hardware::TelemetrySource>(std::move(opened->source));
  for (const std::string& note : t->source_->notes()) {
    std::fprintf(stderr, "flexnpu: telemetry: %s\n", note.c_str());
  }
  const int count = t->source_->device_count();
  t->physical_of_index_.assign(count, -1);
  for (int i = 0; i < count; ++i) {
    auto info = t->source_->Describe(i);
    if (!info.ok()) return give_up(info.status().message());
    t->infos_.push_back(*info);
  }
  // Binding: the PJRT device whose local hardware id is the library's device id. A CPU
  // backend's devices are not the NPUs / GPUs: bound only when asked for explicitly (to drive
  // the placer from telemetry in tests and experiments), never by `auto`.
  const bool bind = explicit_source || backend_platform != "cpu";
  for (size_t p = 0; p < devices.size() && bind; ++p) {
    auto hardware_id = backend.LocalHardwareId(devices[p]);
    if (!hardware_id.ok()) continue;
    const int h = *hardware_id;
    if (h < 0 || h >= count || t->physical_of_index_[h] >= 0) continue;
    Status bound = t->source_->Bind(h);
    if (!bound.ok()) return give_up(bound.message());
    t->physical_of_index_[h] = static_cast<int>(p);
    t->index_of_physical_[p] = h;
  }
  return t;
}

PhysicalTelemetry::~PhysicalTelemetry() {
  sampler_.reset();  // before the source it reads
}

std::string PhysicalTelemetry::PresetOf(int p) const {
  if (p < 0 || static_cast<size_t>(p) >= index_of_physical_.size()) return "";
  const int h = index_of_physical_[p];
  return h < 0 ? "" : infos_[h].preset;
}

int64_t PhysicalTelemetry::MemoryTotalOf(int p) const {
  if (p < 0 || static_cast<size_t>(p) >= index_of_physical_.size()) return 0;
  const int h = index_of_physical_[p];
  return h < 0 ? 0 : std::max<int64_t>(infos_[h].sample.memory_total_bytes, 0);
}

Status PhysicalTelemetry::Start(std::shared_ptr<placement::Core> core,
                                std::shared_ptr<Trace> trace) {
  if (source_ == nullptr) return Status::Ok();
  std::vector<int> physical_of = physical_of_index_;
  auto sampler = hardware::TelemetrySampler::Start(
      source_, std::chrono::milliseconds(period_ms_),
      [core, trace, physical_of](const std::vector<hardware::Sample>& samples) {
        const int64_t now = Placer::NowNs();
        for (const hardware::Sample& s : samples) {
          if (s.index < 0 || static_cast<size_t>(s.index) >= physical_of.size()) continue;
          const int p = physical_of[s.index];
          if (p < 0) continue;
          placement::DeviceTelemetry t;
          t.memory_free_bytes = s.memory_free_bytes;
          t.utilization = s.utilization.compute < 0 ? -1.0 : s.utilization.compute / 100.0;
          (void)core->UpdateTelemetry(p, t, now);
          if (trace != nullptr && trace->enabled()) {
            TraceEvent event;
            event.kind = TraceEvent::Kind::kTelemetry;
            event.physical_device = p;
            event.start_ns = event.end_ns = now;
            event.bytes = t.memory_free_bytes;
            event.utilization = t.utilization;
            trace->Record(event);
          }
        }
      });
  if (!sampler.ok()) return sampler.status();
  sampler_ = std::move(*sampler);
  return Status::Ok();
}

std::string PhysicalTelemetry::Json() const {
  std::ostringstream o;
  o << "{\"mode\":" << JsonString(mode_) << ",\"source\":"
    << JsonString(source_ ? hardware::SourceKindName(source_->kind()) : "none")
    << ",\"library\":" << (source_ ? JsonString(source_->library()) : "null")
    << ",\"fallback\":" << JsonString(fallback_) << ",\"period_ms\":" << period_ms_;
  std::vector<hardware::Sample> latest;
  if (sampler_) {
    latest = sampler_->Latest();
    o << ",\"rounds\":" << sampler_->rounds() << ",\"errors\":" << sampler_->errors()
      << ",\"last_error\":" << JsonString(sampler_->last_error());
  }
  o << ",\"devices\":[";
  for (size_t i = 0; i < infos_.size(); ++i) {
    const hardware::DeviceInfo& info = infos_[i];
    const hardware::Sample& s = i < latest.size() ? latest[i] : info.sample;
    const int p = physical_of_index_[i];
    const auto percent = [](int v) { return v < 0 ? std::string("null") : std::to_string(v); };
    if (i > 0) o << ",";
    o << "{\"index\":" << info.index << ",\"physical_index\":" << JsonInt(info.physical_index)
      << ",\"source\":" << JsonString(hardware::SourceKindName(info.source))
      << ",\"name\":" << JsonString(info.name)
      << ",\"preset\":" << (info.preset.empty() ? "null" : JsonString(info.preset))
      << ",\"memory_total_bytes\":" << JsonInt(s.memory_total_bytes)
      << ",\"memory_free_bytes\":" << JsonInt(s.memory_free_bytes)
      << ",\"utilization\":{\"compute\":" << percent(s.utilization.compute)
      << ",\"memory\":" << percent(s.utilization.memory) << "}"
      << ",\"pjrt_device\":" << (p < 0 ? std::string("null") : std::to_string(pjrt_ids_[p]))
      << ",\"physical_device\":" << (p < 0 ? std::string("null") : std::to_string(p))
      << ",\"bound\":" << (source_->bound(static_cast<int>(i)) ? "true" : "false") << "}";
  }
  o << "]}";
  return o.str();
}

}  // namespace flexnpu
