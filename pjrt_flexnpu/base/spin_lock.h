// A spin lock for critical sections of a few instructions on the dispatch path (a handle
// lookup, a pointer copy), where std::mutex costs about twice as much.
#ifndef FLEXNPU_BASE_SPIN_LOCK_H_
#define FLEXNPU_BASE_SPIN_LOCK_H_

#include <atomic>
#include <thread>

namespace flexnpu {

class SpinLock {
 public:
  void lock() {
    while (locked_.exchange(true, std::memory_order_acquire)) {
      // A preempted holder (2 cores, many threads) is waited out by yielding, not spinning.
      for (int spins = 0; locked_.load(std::memory_order_relaxed); ++spins) {
        if (spins >= 64) std::this_thread::yield();
      }
    }
  }
  void unlock() { locked_.store(false, std::memory_order_release); }

 private:
  std::atomic<bool> locked_{false};
};

}  // namespace flexnpu

#endif  // FLEXNPU_BASE_SPIN_LOCK_H_
