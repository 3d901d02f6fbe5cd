#include "pjrt_flexnpu/backend/emulated/timeline.h"

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <queue>
#include <thread>

#include "pjrt_flexnpu/base/thread_name.h"

namespace flexnpu::emulated {
namespace {

using Clock = std::chrono::steady_clock;

Clock::time_point At(int64_t ns) { return Clock::time_point(std::chrono::nanoseconds(ns)); }

// Runs the callbacks of `e` (once), outside any lock of the timer's.
void Fire(EventState& e) {
  std::vector<std::pair<PJRT_Event_OnReadyCallback, void*>> callbacks;
  {
    std::lock_guard<std::mutex> lock(e.mu);
    e.fired = true;
    callbacks.swap(e.callbacks);
  }
  for (auto& [callback, user_arg] : callbacks) callback(nullptr, user_arg);
}

// The process's timer thread: events with callbacks waiting, earliest first. It lives as long
// as the process (events may outlive every client), so it is never joined.
class Timer {
 public:
  static Timer& Get() {
    static Timer* timer = new Timer();
    return *timer;
  }

  void Schedule(std::shared_ptr<EventState> e) {
    std::lock_guard<std::mutex> lock(mu_);
    const bool earliest = due_.empty() || e->ready_ns < due_.top().ready_ns;
    due_.push(Entry{e->ready_ns, next_++, std::move(e)});
    if (earliest) cv_.notify_one();
  }

 private:
  struct Entry {
    int64_t ready_ns;
    uint64_t order;  // first scheduled, first fired among equal instants
    std::shared_ptr<EventState> event;
    bool operator>(const Entry& o) const {
      return ready_ns != o.ready_ns ? ready_ns > o.ready_ns : order > o.order;
    }
  };

  Timer() { std::thread([this] { Loop(); }).detach(); }

  void Loop() {
    NameThisThread("flexnpu-emutime");
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      if (due_.empty()) {
        cv_.wait(lock);
        continue;
      }
      const int64_t next = due_.top().ready_ns;
      if (NowNs() < next) {
        cv_.wait_until(lock, At(next));
        continue;
      }
      std::shared_ptr<EventState> e = due_.top().event;
      due_.pop();
      lock.unlock();
      Fire(*e);
      lock.lock();
    }
  }

  std::mutex mu_;
  std::condition_variable cv_;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> due_;
  uint64_t next_ = 0;
};

}  // namespace

int64_t NowNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
      .count();
}

int64_t ScaledNs(double seconds, double time_scale) {
  return static_cast<int64_t>(std::llround(seconds * time_scale * 1e9));
}

PJRT_Event* NewEvent(int64_t ready_ns) {
  return reinterpret_cast<PJRT_Event*>(new EventHandle{std::make_shared<EventState>(ready_ns)});
}

void AwaitReady(const EventState& e) {
  // Nothing makes it ready earlier than its instant: a plain sleep.
  while (NowNs() < e.ready_ns) std::this_thread::sleep_until(At(e.ready_ns));
}

void OnReady(const std::shared_ptr<EventState>& e, PJRT_Event_OnReadyCallback callback,
             void* user_arg) {
  bool run_now = false;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    if (!e->fired && (e->scheduled || !IsReady(*e))) {
      // Not due, or due with earlier callbacks the timer is about to run: after them.
      e->callbacks.emplace_back(callback, user_arg);
      if (e->scheduled) return;
      e->scheduled = true;
    } else {
      e->fired = true;  // due, and nothing else waits on it
      run_now = true;
    }
  }
  if (run_now) {
    callback(nullptr, user_arg);
    return;
  }
  Timer::Get().Schedule(e);
}

}  // namespace flexnpu::emulated
