// Destroys buffers off the daemon's session threads.
#ifndef FLEXNPU_DAEMON_REAPER_H_
#define FLEXNPU_DAEMON_REAPER_H_

#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "pjrt_flexnpu/backend/physical_backend.h"

namespace flexnpu::daemon {

// The CPU backend's PJRT_Buffer_Destroy of a donated buffer blocks until the execution it was
// donated to completes (a decode step's KV cache: the whole step); on a session thread that
// would hold back every later request of the session (its next execution, the read of this
// step's result) until then.
class Reaper {
 public:
  void Start(const PhysicalBackend* backend);
  void Destroy(PJRT_Buffer* buffer);
  // Destroys what is queued, then stops.
  void Stop();

 private:
  void Run();
  const PhysicalBackend* backend_ = nullptr;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<PJRT_Buffer*> queue_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace flexnpu::daemon

#endif  // FLEXNPU_DAEMON_REAPER_H_
