// static-pd: fixed prefill and decode pools (baseline b, static disaggregation; see placement.h).
// Prefill runs in the prefill pool, decode in the decode pool (staying with its inputs when they
// are in it), each at the earliest predicted finish there; small work stays with its inputs.
#include <vector>

#include "pjrt_flexnpu/placement/core_state.h"
#include "pjrt_flexnpu/placement/policies.h"

namespace flexnpu::placement {

Choice PlaceStaticPd(const PlaceInput& in, CoreState& s) {
  const Phase phase = in.phase;
  const int preferred = in.preferred;
  const int64_t now = in.now;
  double best_cost = 0;
  const std::vector<int>* pool = nullptr;
  if (phase == Phase::kPrefill) pool = &s.policy.prefill_pool;
  if (phase == Phase::kDecode) pool = &s.policy.decode_pool;
  const char want = phase == Phase::kPrefill ? 1 : 2;
  if (pool == nullptr || ((s.role[preferred] & want) && phase == Phase::kDecode)) {
    // Small work anywhere, decode already in its pool: stay with the data.
    if (s.Healthy(preferred, now)) return {preferred, Reason::kAffinity};
  }
  if (pool == nullptr) {
    const int chosen = s.Scan(nullptr, s.P, now, in.c0, in.m0, in.located, 0, &best_cost);
    if (best_cost >= kUnhealthy) return {preferred, Reason::kFallback};
    return {chosen, Reason::kAvoidFailed};
  }
  const int chosen = s.Scan(pool->data(), static_cast<int>(pool->size()), now, in.c0, in.m0,
                            in.located, 0, &best_cost);
  if (best_cost >= kUnhealthy) return {chosen, Reason::kFallback};
  if ((s.role[preferred] & want) && !s.Healthy(preferred, now)) {
    return {chosen, Reason::kAvoidFailed};
  }
  return {chosen, Reason::kPool};
}

}  // namespace flexnpu::placement
