// The socket side of a daemon session: replies and readiness pushes written without blocking,
// and the events whose callbacks have fired, for the session thread to destroy.
#ifndef FLEXNPU_DAEMON_CHANNEL_H_
#define FLEXNPU_DAEMON_CHANNEL_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "pjrt_c_api.h"

namespace flexnpu::daemon {

struct Frame;
struct TenantState;

// The socket side of a session, shared with event callbacks that outlive a request.
//
// Send never blocks on the socket: it runs on the session thread (replies) and on the
// backend's threads (readiness pushes, for every tenant), so a client that stops reading must
// not stall either. What the socket does not take at once waits in this channel's queue, in
// order, and the channel's writer thread (started at the first such frame) writes it when the
// socket drains. A client that takes nothing for the send timeout (FLEXNPU_DAEMON_SEND_
// TIMEOUT_S, default 60) or lets more than FLEXNPU_DAEMON_MAX_QUEUED_MB (default 1024) pile
// up has its session ended: the socket is shut down, the session thread sees the end, and
// Broken() says why.
struct Channel {
  explicit Channel(int fd);
  ~Channel();
  void Send(const Frame& frame);
  // Why the daemon ended this session's connection itself; empty if it did not.
  std::string Broken() {
    std::lock_guard<std::mutex> lock(write_mu);
    return broken;
  }
  void Fired(PJRT_Event* event) {
    std::lock_guard<std::mutex> lock(fired_mu);
    fired.push_back(event);
  }
  std::vector<PJRT_Event*> TakeFired() {
    std::lock_guard<std::mutex> lock(fired_mu);
    return std::move(fired);
  }
  const int fd;
  // Set by the session thread at Hello, before any event is watched; null for observers.
  TenantState* tenant = nullptr;
  std::mutex fired_mu;
  std::vector<PJRT_Event*> fired;

 private:
  void BreakLocked(std::string why);
  // Writes the queue in order while Send appends behind it. The frame being written is the
  // writer's own (taken off the queue; `writing` keeps Send from writing past it), so
  // BreakLocked may clear the queue meanwhile.
  void WriteLoop();
  const int send_timeout_ms;
  const size_t max_queued_bytes;
  std::mutex write_mu;
  std::condition_variable write_cv;
  std::deque<std::string> queue;  // encoded frames the socket has not taken yet
  size_t queued_bytes = 0;
  std::string broken;
  bool stop = false;
  bool writing = false;  // the writer holds a frame taken off the queue
  std::thread writer;
};

}  // namespace flexnpu::daemon

#endif  // FLEXNPU_DAEMON_CHANNEL_H_
