// static-colocate: every device runs both phases in FIFO order (baseline c, static co-location;
// see placement.h). A prefill goes to the earliest predicted finish (admission load balancing);
// decode and small work stay with their inputs unless that device is quarantined or short.
#include "pjrt_flexnpu/placement/core_state.h"
#include "pjrt_flexnpu/placement/policies.h"

namespace flexnpu::placement {

Choice PlaceStaticColocate(const PlaceInput& in, CoreState& s) {
  const int preferred = in.preferred;
  if (in.phase != Phase::kPrefill && s.Healthy(preferred, in.now)) {
    return {preferred, Reason::kAffinity};
  }
  double best_cost = 0;
  const int chosen = s.Scan(nullptr, s.P, in.now, in.c0, in.m0, in.located, 0, &best_cost);
  if (best_cost >= kUnhealthy) return {preferred, Reason::kFallback};
  if (in.phase != Phase::kPrefill) return {chosen, Reason::kAvoidFailed};
  return {chosen, chosen == preferred ? Reason::kAffinity : Reason::kLeastLoaded};
}

}  // namespace flexnpu::placement
