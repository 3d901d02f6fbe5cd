// passthrough: virtual device v runs on physical v mod P, always (baseline a; see placement.h).
// No cost model, no quarantine, no memory check. The runtime does not even ask: it maps the
// devices itself and only reports what ran (CountPassthrough, PassthroughFinished), lock-free.
#include <algorithm>
#include <atomic>
#include <cstdint>

#include "pjrt_flexnpu/placement/core_state.h"
#include "pjrt_flexnpu/placement/policies.h"

namespace flexnpu::placement {

Choice PlacePassthrough(const PlaceInput& in, CoreState& s) {
  return {in.virtual_device % s.P, Reason::kPassthrough};
}

void Core::CountPassthrough(int virtual_device, int physical_device, Phase phase) {
  CoreState& s = *s_;
  const int p = static_cast<int>(phase);
  if (virtual_device < 0 || virtual_device >= s.V || physical_device < 0 ||
      physical_device >= s.P || p < 0 || p >= kNumPhases) {
    return;
  }
  s.passthrough_physical[physical_device].executions[p].fetch_add(1, std::memory_order_relaxed);
  s.passthrough_virtual[virtual_device].executions[p].fetch_add(1, std::memory_order_relaxed);
}

void Core::PassthroughFinished(int virtual_device, int physical_device, int64_t start_ns,
                               int64_t finish_ns) {
  CoreState& s = *s_;
  if (virtual_device < 0 || virtual_device >= s.V || physical_device < 0 ||
      physical_device >= s.P) {
    return;
  }
  start_ns = std::min(start_ns, finish_ns);
  int64_t since = s.passthrough_since.load(std::memory_order_relaxed);
  while (start_ns < since &&
         !s.passthrough_since.compare_exchange_weak(since, start_ns, std::memory_order_relaxed)) {
  }
  // The union of the intervals, as OnFinish: the part of this one after the latest finish
  // counted so far (exact when completions are seen in the order they happen).
  PassthroughCounts& d = s.passthrough_physical[physical_device];
  int64_t end = d.busy_end.load(std::memory_order_relaxed);
  while (end < finish_ns &&
         !d.busy_end.compare_exchange_weak(end, finish_ns, std::memory_order_relaxed)) {
  }
  d.busy_ns.fetch_add(std::max<int64_t>(0, finish_ns - std::max(start_ns, end)),
                      std::memory_order_relaxed);
  s.passthrough_virtual[virtual_device].busy_ns.fetch_add(finish_ns - start_ns,
                                                          std::memory_order_relaxed);
}

}  // namespace flexnpu::placement
