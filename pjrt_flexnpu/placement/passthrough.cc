// passthrough: virtual device v runs on physical v mod P, always (baseline a; see placement.h).
// No cost model, no quarantine, no memory check.
#include "pjrt_flexnpu/placement/core_state.h"
#include "pjrt_flexnpu/placement/policies.h"

namespace flexnpu::placement {

Choice PlacePassthrough(const PlaceInput& in, CoreState& s) {
  return {in.virtual_device % s.P, Reason::kPassthrough};
}

}  // namespace flexnpu::placement
