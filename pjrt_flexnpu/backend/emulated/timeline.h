// Time in the emulated backend: completion instants on the host's steady clock, the events
// that turn ready at them, and the one timer thread that runs their OnReady callbacks.
//
// An event is ready when the clock has passed its instant: IsReady compares, Await sleeps until
// then. Only an OnReady callback registered before the instant needs the timer thread (a
// min-heap of deadlines), which runs it at the instant. Nothing an event stands for can fail
// once launched (nothing is computed), so every event completes without error.
#ifndef FLEXNPU_BACKEND_EMULATED_TIMELINE_H_
#define FLEXNPU_BACKEND_EMULATED_TIMELINE_H_

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "pjrt_c_api.h"

namespace flexnpu::emulated {

// Nanoseconds on the host's steady clock.
int64_t NowNs();

// `seconds` of modelled device time stretched by `time_scale`, in (rounded) nanoseconds.
int64_t ScaledNs(double seconds, double time_scale);

struct EventState {
  explicit EventState(int64_t ready_ns) : ready_ns(ready_ns) {}
  const int64_t ready_ns;  // when it turns ready (NowNs clock)
  std::mutex mu;
  bool fired = false;      // its callbacks have run; later ones run at once
  bool scheduled = false;  // the timer holds it
  std::vector<std::pair<PJRT_Event_OnReadyCallback, void*>> callbacks;
};

// What a PJRT_Event of this backend points to.
struct EventHandle {
  std::shared_ptr<EventState> state;
};

// A new event handle, ready at `ready_ns`.
PJRT_Event* NewEvent(int64_t ready_ns);
inline bool IsReady(const EventState& e) { return NowNs() >= e.ready_ns; }
// Sleeps until `e` is ready.
void AwaitReady(const EventState& e);
// Runs `callback` (with no error) when `e` is ready: at once when it is, else on the timer
// thread at its instant.
void OnReady(const std::shared_ptr<EventState>& e, PJRT_Event_OnReadyCallback callback,
             void* user_arg);

}  // namespace flexnpu::emulated

#endif  // FLEXNPU_BACKEND_EMULATED_TIMELINE_H_
