// The co-run model of a device that runs several executions at once (compute and bandwidth
// overlap): one function for the placer, which predicts with it (placement/placement.h,
// "Co-run model"), and the emulated backend, whose devices run so (backend/emulated/).
#ifndef FLEXNPU_BASE_CO_RUN_H_
#define FLEXNPU_BASE_CO_RUN_H_

#include <algorithm>

namespace flexnpu {

// How long work of compute time `c` and memory time `m` takes (in their unit) on a device
// where `k` other executions are outstanding and `compute_left` / `memory_left` (>= 0) remain of
// its compute and memory horizons: it gets at least a fair 1/(k+1) share of each resource and
// finishes no later than all work on that resource. The device's launch cost comes on top.
inline double CoRunDuration(double c, double m, double k, double compute_left,
                            double memory_left) {
  return std::max(std::min(c * (k + 1), compute_left + c),
                  std::min(m * (k + 1), memory_left + m));
}

}  // namespace flexnpu

#endif  // FLEXNPU_BASE_CO_RUN_H_
