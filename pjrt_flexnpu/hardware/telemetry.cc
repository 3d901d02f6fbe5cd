// Presets, option parsing, source selection and the background sampler.
#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <utility>

#include "pjrt_flexnpu/base/thread_name.h"
#include "pjrt_flexnpu/hardware/hardware.h"

namespace flexnpu::hardware {
namespace {

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

bool StartsWith(std::string_view s, std::string_view prefix) {
  return s.substr(0, prefix.size()) == prefix;
}

// The one table of names to roofline presets. Ascend: aclrtGetSocName's text; NVIDIA:
// nvmlDeviceGetName's ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB").
struct PresetRule {
  enum Match { kPrefix, kContains } match;
  const char* pattern;  // lower case
  const char* preset;
};
constexpr PresetRule kPresetRules[] = {
    {PresetRule::kPrefix, "ascend910b1", "ascend910b"},
    {PresetRule::kPrefix, "ascend910b2", "ascend910b"},
    {PresetRule::kPrefix, "ascend910b3", "ascend910b"},
    {PresetRule::kPrefix, "ascend910b4", "ascend910b"},
    {PresetRule::kPrefix, "ascend910_93", "ascend910c"},  // Ascend910_9391.. (A3 / 910C)
    {PresetRule::kContains, "h100", "h100"},
    {PresetRule::kContains, "h200", "h200"},
    {PresetRule::kContains, "a100", "a100"},
};

}  // namespace

const char* SourceKindName(SourceKind kind) {
  switch (kind) {
    case SourceKind::kAscendCl:
      return "ascendcl";
    case SourceKind::kNvml:
      return "nvml";
    default:
      return "none";
  }
}

StatusOr<TelemetryMode> ParseTelemetryMode(std::string_view text) {
  const std::string mode = Lower(Trim(text));
  if (mode == "auto" || mode.empty()) return TelemetryMode::kAuto;
  if (mode == "ascendcl" || mode == "acl") return TelemetryMode::kAscendCl;
  if (mode == "nvml") return TelemetryMode::kNvml;
  if (mode == "none" || mode == "off") return TelemetryMode::kNone;
  return InvalidArgument("telemetry source must be auto, ascendcl, nvml or none, got '" +
                         std::string(text) + "'");
}

std::string PresetForName(std::string_view name) {
  const std::string lower = Lower(Trim(name));
  for (const PresetRule& rule : kPresetRules) {
    const bool hit = rule.match == PresetRule::kPrefix
                         ? StartsWith(lower, rule.pattern)
                         : lower.find(rule.pattern) != std::string::npos;
    if (hit) return rule.preset;
  }
  return "";
}

EnvLookup ProcessEnvironment() {
  return [](const char* name) -> std::optional<std::string> {
    const char* v = std::getenv(name);
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

StatusOr<std::vector<int>> ParseVisibleDevices(std::string_view text) {
  std::vector<int> out;
  const std::string_view all = Trim(text);
  if (all.empty()) return out;
  size_t start = 0;
  while (start <= all.size()) {
    size_t end = all.find(',', start);
    if (end == std::string_view::npos) end = all.size();
    const std::string_view item = Trim(all.substr(start, end - start));
    start = end + 1;
    const auto bad = [&](const std::string& why) {
      return InvalidArgument("ASCEND_RT_VISIBLE_DEVICES='" + std::string(text) + "': " + why);
    };
    if (item.empty()) return bad("empty entry");
    int value = 0;
    for (char c : item) {
      if (!std::isdigit(static_cast<unsigned char>(c))) {
        return bad("'" + std::string(item) + "' is not a device id");
      }
      value = value * 10 + (c - '0');
      if (value > 65535) return bad("'" + std::string(item) + "' is out of range");
    }
    if (std::find(out.begin(), out.end(), value) != out.end()) {
      return bad("device " + std::to_string(value) + " listed twice");
    }
    out.push_back(value);
  }
  return out;
}

StatusOr<OpenedSource> OpenTelemetry(const SourceOptions& options) {
  OpenedSource out;
  switch (options.mode) {
    case TelemetryMode::kNone:
      return out;
    case TelemetryMode::kAscendCl: {
      auto source = OpenAscendCl(options);
      if (!source.ok()) return source.status();
      out.source = std::move(*source);
      return out;
    }
    case TelemetryMode::kNvml: {
      auto source = OpenNvml(options);
      if (!source.ok()) return source.status();
      out.source = std::move(*source);
      return out;
    }
    case TelemetryMode::kAuto:
      break;
  }
  std::string why;
  bool absent = true;  // every library missing (NotFound), rather than one that failed
  auto acl = OpenAscendCl(options);
  absent = !acl.ok() && acl.status().code() == Code::kNotFound;
  if (acl.ok() && (*acl)->device_count() > 0) {
    out.source = std::move(*acl);
    return out;
  }
  why = acl.ok() ? "AscendCL sees no devices" : acl.status().message();
  if (options.backend_is_cuda) {
    auto nvml = OpenNvml(options);
    if (nvml.ok() && (*nvml)->device_count() > 0) {
      out.source = std::move(*nvml);
      out.fallback = "telemetry auto: NVML (" + why + ")";
      return out;
    }
    why += "; " + (nvml.ok() ? std::string("NVML sees no devices") : nvml.status().message());
    absent = absent && !nvml.ok() && nvml.status().code() == Code::kNotFound;
  }
  out.fallback = "telemetry auto: none (" + why + ")";
  out.nothing_installed = absent;
  return out;
}

// --- TelemetrySampler ---

StatusOr<std::unique_ptr<TelemetrySampler>> TelemetrySampler::Start(
    std::shared_ptr<TelemetrySource> source, std::chrono::milliseconds period,
    Callback callback) {
  if (source == nullptr) return InvalidArgument("telemetry sampler: no source");
  if (period.count() <= 0) {
    return InvalidArgument("telemetry period must be > 0 ms, got " +
                           std::to_string(period.count()));
  }
  std::unique_ptr<TelemetrySampler> sampler(
      new TelemetrySampler(std::move(source), period, std::move(callback)));
  sampler->thread_ = std::thread([s = sampler.get()] {
    NameThisThread("flexnpu-telem");
    s->Loop();
  });
  sampler->RefreshNow();  // the first round, before anyone reads
  return sampler;
}

TelemetrySampler::TelemetrySampler(std::shared_ptr<TelemetrySource> source,
                                   std::chrono::milliseconds period, Callback callback)
    : source_(std::move(source)), period_(period), callback_(std::move(callback)) {}

TelemetrySampler::~TelemetrySampler() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void TelemetrySampler::Loop() {
  std::unique_lock<std::mutex> lock(mu_);
  // Every round follows a wait: the first one is the RefreshNow in Start, so a thread that
  // happens to run before Start's request does not add a round of its own.
  uint64_t served = 0;
  while (true) {
    wake_.wait_for(lock, period_, [&] { return stop_ || refresh_requested_ != served; });
    if (stop_) break;
    ++started_;
    served = refresh_requested_;
    lock.unlock();
    Round();
    lock.lock();
    round_done_.notify_all();
  }
  round_done_.notify_all();
}

void TelemetrySampler::Round() {
  const int count = source_->device_count();
  std::vector<Sample> samples(count);
  std::vector<bool> read(count, false);
  std::string error;
  for (int i = 0; i < count; ++i) {
    auto sample = source_->Read(i);
    if (sample.ok()) {
      samples[i] = *sample;
      read[i] = true;
    } else {
      error = sample.status().message();
      samples[i].index = i;
    }
  }
  {
    // A device that could not be read keeps its previous reading.
    std::lock_guard<std::mutex> lock(mu_);
    for (int i = 0; i < count; ++i) {
      if (!read[i] && static_cast<size_t>(i) < latest_.size()) samples[i] = latest_[i];
    }
  }
  // Before the round counts as done: RefreshNow returns after the consumer saw it.
  if (callback_) callback_(samples);
  std::lock_guard<std::mutex> lock(mu_);
  latest_ = std::move(samples);
  ++rounds_;
  if (!error.empty()) ++errors_;
  last_error_ = error;
}

void TelemetrySampler::RefreshNow() {
  std::unique_lock<std::mutex> lock(mu_);
  // A round already running may have read before this call: wait for one that starts after.
  const uint64_t need = started_ + 1;
  ++refresh_requested_;
  wake_.notify_all();
  round_done_.wait(lock, [&] { return stop_ || rounds_ >= need; });
}

std::vector<Sample> TelemetrySampler::Latest() const {
  std::lock_guard<std::mutex> lock(mu_);
  return latest_;
}

uint64_t TelemetrySampler::rounds() const {
  std::lock_guard<std::mutex> lock(mu_);
  return rounds_;
}

uint64_t TelemetrySampler::errors() const {
  std::lock_guard<std::mutex> lock(mu_);
  return errors_;
}

std::string TelemetrySampler::last_error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return last_error_;
}

}  // namespace flexnpu::hardware
