#include "pjrt_flexnpu/daemon/priority_gate.h"

namespace flexnpu::daemon {

void PriorityGate::LatencyStarted(const std::vector<int64_t>& devices) {
  std::lock_guard<std::mutex> lock(mu_);
  for (int64_t d : devices) ++in_flight_[d];
}

void PriorityGate::LatencyDone(int64_t device) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (in_flight_[device] > 0) --in_flight_[device];
  }
  cv_.notify_all();
}

PriorityGate::Turn PriorityGate::AwaitBatchTurn(const std::vector<int64_t>& devices,
                                                const std::atomic<bool>& stopping) {
  std::unique_lock<std::mutex> lock(mu_);
  auto clear = [&] {
    if (stopping) return true;
    for (int64_t d : devices) {
      if (in_flight_[d] > 0) return false;
    }
    return true;
  };
  if (clear()) return Turn::kNotHeld;
  return cv_.wait_for(lock, max_wait_, clear) ? Turn::kAfterLatencyWork : Turn::kPastMaxWait;
}

std::vector<int64_t> PriorityGate::InFlight() const {
  std::lock_guard<std::mutex> lock(mu_);
  return in_flight_;
}

}  // namespace flexnpu::daemon
