// dynamic: FlexNPU's policy (see "Dynamic policy" in placement.h). Prefill goes to the earliest
// predicted finish plus the interference penalty of the decode streams it would block; decode
// and small work stay on their current device unless another finishes earlier by more than the
// hysteresis margin (a decode paying for the streams it would move onto and avoiding other
// instances' prefill homes), and a displaced decode returns home once the burst has passed.
#include <algorithm>
#include <cstdint>

#include "pjrt_flexnpu/placement/core_state.h"
#include "pjrt_flexnpu/placement/policies.h"

namespace flexnpu::placement {
namespace {

// What a move of the request's located inputs onto `target` must gain over staying: its
// transfer time (bytes not on the target / link) times move_gain, counted in full (the finish
// prediction lets the transfer overlap the target's queue, where it would look free), plus the
// way back when the target is not home (the work follows its data, so leaving home is a round
// trip). Weights of a few hundred MB therefore never move to save a few milliseconds.
double MoveMargin(const CoreState& s, int target, int home, double located) {
  const double transfer = (located - s.on[target]) * s.ns_per_link_byte[target];
  if (transfer <= 0) return 0;
  return s.tuning.move_gain * transfer + (target != home ? transfer : 0);
}

Choice PlacePrefill(const PlaceInput& in, CoreState& s) {
  double best_cost = 0;
  s.ComputeAwayWeight(in.now);
  const int chosen = s.Scan(nullptr, s.P, in.now, in.c0, in.m0, in.located, 1.0, &best_cost);
  std::fill(s.away_weight.begin(), s.away_weight.end(), 0.0);
  if (best_cost >= kUnhealthy) return {in.preferred, Reason::kFallback};
  if (!s.Healthy(in.preferred, in.now)) return {chosen, Reason::kAvoidFailed};
  if (chosen == in.preferred) return {chosen, Reason::kAffinity};
  // s.cost: the scan's cost of every device (penalties included), staying put among them.
  const double margin = MoveMargin(s, chosen, in.home, in.located);
  if (margin > 0 && s.cost[in.preferred] - best_cost <= margin) {
    return {in.preferred, Reason::kAffinity};
  }
  return {chosen, Reason::kLeastLoaded};
}

}  // namespace

Choice PlaceDynamic(const PlaceInput& in, CoreState& s) {
  const Phase phase = in.phase;
  if (phase == Phase::kPrefill) return PlacePrefill(in, s);
  const int64_t now = in.now;
  const int v = in.virtual_device;
  const int home = in.home;
  const double c0 = in.c0, m0 = in.m0, loc = in.located;
  double best_cost = 0;
  const int cur = in.preferred;
  const double cur_cost = s.CostOf(cur, now, c0, m0, loc);
  // A decode moving in delays the streams already there by about what it escapes (FIFO
  // is work-conserving: it only shifts the wait onto them, and pays the KV migration).
  // Not when it must leave (current device quarantined or short of memory): cur_cost then
  // carries kUnhealthy, which would make every device hosting a stream look unusable.
  s.move_penalty_ns = phase == Phase::kDecode && s.Healthy(cur, now)
                          ? s.tuning.move_weight * (cur_cost - static_cast<double>(now)) /
                                s.request_weight
                          : 0;
  s.move_except = cur;
  // Role: the home of a prefill instance that is serving prompts is not a place to escape
  // to. The decode would sit in front of that instance's next prefills (or push them onto
  // decode devices, whose streams then escape in turn: roles swap, KV caches travel, the
  // interference the prefill penalty priced in is paid anyway). Idle prefill homes, and
  // its own home, stay open.
  s.move_home = phase == Phase::kDecode && s.Healthy(cur, now) ? home : -1;
  const int best = s.Scan(nullptr, s.P, now, c0, m0, loc, 0, &best_cost);
  s.move_penalty_ns = 0;
  s.move_home = -1;
  double start, c, m;
  s.Finish(cur, static_cast<double>(now), c0, m0, 0, &start, &c, &m);
  const double exec_cur = std::max(c, m) + s.launch_ns[cur];
  if (!s.Healthy(cur, now)) {
    if (best_cost >= kUnhealthy) return {cur, Reason::kFallback};
    return {best, Reason::kAvoidFailed};
  }
  // The hysteresis, and what moving the inputs costs (a round trip when leaving home).
  double margin = s.tuning.hysteresis_frac * exec_cur +
                  static_cast<double>(s.tuning.hysteresis_ns);
  if (best >= 0) margin += MoveMargin(s, best, home, loc);
  if (best != cur && cur_cost - best_cost > margin) {
    return {best, s.outstanding[best] == 0 ? Reason::kIdleSteal : Reason::kLeastLoaded};
  }
  if (phase == Phase::kDecode && cur != home && s.Healthy(home, now) &&
      now - s.moved_ns[v] >= s.tuning.min_dwell_ns && s.prefill_outstanding[home] == 0) {
    const double quiet =
        s.tuning.quiet_ns > 0 ? static_cast<double>(s.tuning.quiet_ns) : exec_cur;
    const double home_cost = s.CostOf(home, now, c0, m0, loc);
    if (s.avail[home] - static_cast<double>(now) <= quiet &&
        home_cost - cur_cost <= s.tuning.return_max_steps * exec_cur) {
      return {home, Reason::kReturnHome};
    }
  }
  return {cur, Reason::kAffinity};
}

}  // namespace flexnpu::placement
