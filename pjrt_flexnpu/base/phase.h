// The phase of an LLM step, as the HLO analysis classifies a program and the placer and the
// simulator treat it: one enum for all three (Python mirrors its names).
#ifndef FLEXNPU_BASE_PHASE_H_
#define FLEXNPU_BASE_PHASE_H_

#include <cstdint>
#include <string_view>

namespace flexnpu {

// kSmall: too little work to matter for placement (below the analysis' threshold).
enum class Phase : uint8_t { kSmall = 0, kPrefill = 1, kDecode = 2 };
inline constexpr int kNumPhases = 3;

inline const char* PhaseName(Phase phase) {
  switch (phase) {
    case Phase::kSmall: return "small";
    case Phase::kPrefill: return "prefill";
    case Phase::kDecode: return "decode";
  }
  return "unknown";
}

// The phase named `name` (as PhaseName writes it); false for any other name.
inline bool PhaseFromName(std::string_view name, Phase* phase) {
  for (int p = 0; p < kNumPhases; ++p) {
    if (name == PhaseName(static_cast<Phase>(p))) {
      *phase = static_cast<Phase>(p);
      return true;
    }
  }
  return false;
}

}  // namespace flexnpu

#endif  // FLEXNPU_BASE_PHASE_H_
