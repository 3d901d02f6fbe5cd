#include "pjrt_flexnpu/daemon/channel.h"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstdlib>

#include "pjrt_flexnpu/backend/remote/protocol.h"
#include "pjrt_flexnpu/base/thread_name.h"

namespace flexnpu::daemon {
namespace {

int EnvInt(const char* name, int fallback) {
  const char* v = std::getenv(name);
  const int n = v != nullptr ? std::atoi(v) : 0;
  return n > 0 ? n : fallback;
}

}  // namespace

Channel::Channel(int fd)
    : fd(fd),
      send_timeout_ms(EnvInt("FLEXNPU_DAEMON_SEND_TIMEOUT_S", 60) * 1000),
      max_queued_bytes(static_cast<size_t>(EnvInt("FLEXNPU_DAEMON_MAX_QUEUED_MB", 1024)) << 20) {}

Channel::~Channel() {
  {
    std::lock_guard<std::mutex> lock(write_mu);
    stop = true;
  }
  write_cv.notify_all();
  // Wakes a writer waiting in poll for a client that does not read (up to the send
  // timeout otherwise, and this may run on a backend thread that carries every tenant's
  // completions). What the socket took already still reaches the client.
  if (writer.joinable()) ::shutdown(fd, SHUT_RDWR);
  if (writer.joinable()) writer.join();
  ::close(fd);
}

void Channel::Send(const Frame& frame) {
  const std::string body = Encode(frame);
  if (body.size() > kMaxFrameBytes) return;  // never built: payloads are bounded
  std::string data(4, '\0');
  const uint32_t n = static_cast<uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) data[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  data += body;
  std::lock_guard<std::mutex> lock(write_mu);
  if (!broken.empty() || stop) return;  // the session is ending
  size_t sent = 0;
  if (queue.empty() && !writing) {
    while (sent < data.size()) {
      const ssize_t r =
          ::send(fd, data.data() + sent, data.size() - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (r < 0) {
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) break;
        return;  // a dead peer: the session's reader notices
      }
      sent += static_cast<size_t>(r);
    }
    if (sent == data.size()) return;
  }
  if (queued_bytes + data.size() - sent > max_queued_bytes) {
    BreakLocked("the client did not read " + std::to_string(queued_bytes) +
                " bytes of replies and pushes queued for it (limit " +
                std::to_string(max_queued_bytes >> 20) + " MiB)");
    return;
  }
  queued_bytes += data.size() - sent;
  queue.push_back(sent == 0 ? std::move(data) : data.substr(sent));
  if (!writer.joinable()) {
    writer = std::thread([this] {
      NameThisThread("flexnpu-dmn-wr");
      WriteLoop();
    });
  }
  write_cv.notify_one();
}

void Channel::BreakLocked(std::string why) {
  if (!broken.empty()) return;
  broken = std::move(why);
  queue.clear();
  queued_bytes = 0;
  ::shutdown(fd, SHUT_RDWR);
  write_cv.notify_all();
}

void Channel::WriteLoop() {
  std::unique_lock<std::mutex> lock(write_mu);
  for (;;) {
    write_cv.wait(lock, [&] { return stop || !broken.empty() || !queue.empty(); });
    if (stop || !broken.empty()) return;
    std::string current = std::move(queue.front());
    queue.pop_front();
    writing = true;
    size_t offset = 0;
    while (offset < current.size()) {
      lock.unlock();
      pollfd p{fd, POLLOUT, 0};
      int r = ::poll(&p, 1, send_timeout_ms);
      ssize_t written = 0;
      bool failed = false;
      if (r > 0) {
        written = ::send(fd, current.data() + offset, current.size() - offset,
                         MSG_NOSIGNAL | MSG_DONTWAIT);
        failed = written < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
      } else if (r < 0) {
        failed = errno != EINTR;
      }
      lock.lock();
      if (stop || !broken.empty()) {
        writing = false;
        return;
      }
      if (r == 0) {
        BreakLocked("the client did not read what the daemon sent it for " +
                    std::to_string(send_timeout_ms / 1000) + " s (" +
                    std::to_string(queued_bytes) + " bytes of replies and pushes queued)");
        writing = false;
        return;
      }
      if (failed) {
        queue.clear();  // a dead peer: the session's reader notices
        queued_bytes = 0;
        break;
      }
      if (written > 0) {
        offset += static_cast<size_t>(written);
        queued_bytes -= std::min(queued_bytes, static_cast<size_t>(written));
      }
    }
    writing = false;
  }
}

}  // namespace flexnpu::daemon
