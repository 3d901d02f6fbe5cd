// Priority classes of the daemon's tenants: latency-class work first, batch-class work fills
// the gaps.
#ifndef FLEXNPU_DAEMON_PRIORITY_GATE_H_
#define FLEXNPU_DAEMON_PRIORITY_GATE_H_

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <vector>

namespace flexnpu::daemon {

// Per device (the devices this daemon serves), a batch-class execution waits while
// latency-class executions are in flight there (enqueued, not yet complete), at most
// `max_wait` so that batch work is never starved. It holds back what is not yet enqueued; what
// the backend has queued already runs in its order (a placer-level priority would reorder
// those too).
class PriorityGate {
 public:
  PriorityGate(size_t devices, std::chrono::milliseconds max_wait)
      : in_flight_(devices, 0), max_wait_(max_wait) {}
  void LatencyStarted(const std::vector<int64_t>& devices);
  void LatencyDone(int64_t device);
  enum class Turn { kNotHeld, kAfterLatencyWork, kPastMaxWait };
  // Waits while latency work is in flight on any of `devices` (at most max_wait): whether it
  // waited, and whether that work completed (its completion events fired) before it went.
  Turn AwaitBatchTurn(const std::vector<int64_t>& devices, const std::atomic<bool>& stopping);
  std::vector<int64_t> InFlight() const;
  void WakeAll() { cv_.notify_all(); }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int64_t> in_flight_;  // latency-class executions per device
  const std::chrono::milliseconds max_wait_;
};

}  // namespace flexnpu::daemon

#endif  // FLEXNPU_DAEMON_PRIORITY_GATE_H_
