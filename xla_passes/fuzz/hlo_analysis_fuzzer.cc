// libFuzzer target: arbitrary bytes through the HLO parser, the cost analysis and the
// roofline classification. Any crash, sanitizer report, leak or hang is a finding; an error
// Result is the expected outcome for malformed input.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "xla_passes/analysis.h"
#include "xla_passes/roofline.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (bool xla_compatible : {false, true}) {
    flexnpu::xla_passes::AnalysisOptions options;
    options.xla_compatible = xla_compatible;
    auto profile = flexnpu::xla_passes::AnalyzeHloProto(bytes, options);
    if (!profile.ok()) continue;
    for (const auto& device : flexnpu::xla_passes::DevicePresets()) {
      (void)flexnpu::xla_passes::Classify(profile.value(), device);
    }
  }
  return 0;
}
