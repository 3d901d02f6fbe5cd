#include "pjrt_flexnpu/daemon/reaper.h"

#include "pjrt_flexnpu/base/thread_name.h"

namespace flexnpu::daemon {

void Reaper::Start(const PhysicalBackend* backend) {
  backend_ = backend;
  thread_ = std::thread([this] {
    NameThisThread("flexnpu-dmn-rea");
    Run();
  });
}

void Reaper::Destroy(PJRT_Buffer* buffer) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(buffer);
  }
  cv_.notify_one();
}

void Reaper::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_one();
  if (thread_.joinable()) thread_.join();
}

void Reaper::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) return;
    PJRT_Buffer* buffer = queue_.front();
    queue_.pop_front();
    lock.unlock();
    InnerDeleter<PJRT_Buffer>{backend_}(buffer);
    lock.lock();
  }
}

}  // namespace flexnpu::daemon
