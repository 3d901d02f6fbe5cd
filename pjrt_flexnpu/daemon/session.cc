// A session's life: its handshake, its request loop and its end.
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <mutex>

#include "pjrt_flexnpu/base/host_memory.h"
#include "pjrt_flexnpu/daemon/dispatch.h"

namespace flexnpu::daemon {

void Dispatcher::Serve(Session& s) {
  bool greeted = false;
  Status end;
  for (;;) {
    Frame request;
    std::vector<int> fds;
    Status r = RecvFrame(s.channel->fd, &request, &fds);
    if (!r.ok()) {
      for (int fd : fds) ::close(fd);
      end = r;
      break;
    }
    DrainFired(s);
    Frame reply;
    reply.call_id = request.call_id;
    reply.op = request.op;
    Status status;
    if (!greeted) {
      status = request.op == kHello
                   ? Hello(s, request, &reply)
                   : FailedPrecondition("the first message of a session must be Hello");
      greeted = status.ok();
    } else if (s.observer && request.op != kStats) {
      status = PermissionDenied("an observer session can only ask for stats");
    } else {
      const auto start = std::chrono::steady_clock::now();
      status = Handle(s, request, fds, &reply);
      if (s.tenant_state != nullptr && request.op <= kLastRequestOp) {
        auto& counter = s.tenant_state->requests[request.op];
        ++counter.count;
        counter.handler_ns += std::chrono::duration_cast<std::chrono::nanoseconds>(
                                  std::chrono::steady_clock::now() - start)
                                  .count();
      }
    }
    for (int fd : fds) {
      if (fd >= 0) ::close(fd);
    }
    if (!status.ok()) ReportFailure(s, request, status, &reply);
    if (request.call_id != 0) s.channel->Send(reply);
    if (!greeted) break;  // a refused handshake ends the session
    s.greeted = true;
    s.buffer_count = s.buffers.size();
    s.executable_count = s.executables.size();
  }
  const std::string broken = s.channel->Broken();
  EndSession(s);
  if (greeted && !s.observer) {
    Log(config_, "session " + std::to_string(s.id) + " (tenant '" + s.tenant + "') ended: " +
                     (!broken.empty()               ? "by the daemon: " + broken
                      : end.message() == "closed" ? std::string("closed")
                                                  : std::string(end.message())) +
                     "; its handles were destroyed");
  }
  s.finished = true;
}

void Dispatcher::ReportFailure(Session& s, const Frame& request, const Status& status,
                               Frame* reply) {
  if (request.call_id == 0 && request.op == kExecute) FailOneWayExecute(s, request, status);
  if (request.call_id == 0 && request.op == kBufferFromHost && !request.ints.empty() &&
      request.ints.back() < 0 && s.buffers.count(request.ints.back()) == 0) {
    // A one-way transfer's id names its failure.
    s.buffers[request.ints.back()] =
        BufferEntry{nullptr, 0, Status(status.code(), "the transfer that made this buffer "
                                                      "failed: " + std::string(status.message()))};
  }
  if (request.call_id == 0 && request.op == kBufferToHost && request.ints.size() > 1) {
    // A one-way transfer's failure is its event's.
    Frame push;
    push.op = kEventReady;
    push.ints = {request.ints[1], static_cast<int64_t>(status.code())};
    push.text = status.message();
    s.channel->Send(push);
  }
  reply->code = static_cast<int32_t>(status.code());
  reply->text = status.message();
  reply->ints.clear();
  reply->blobs.clear();
  if (request.op == kExecute) {
    // ints [donated list]: what an execution refused after it ran consumed.
    AppendList(&reply->ints, s.consumed_by_failed.data(), s.consumed_by_failed.size());
    s.consumed_by_failed.clear();
  }
}

Status Dispatcher::Hello(Session& s, const Frame& request, Frame* reply) {
  if (request.ints.empty() || request.ints[0] != kProtocolVersion) {
    return FailedPrecondition(
        "protocol version mismatch: the flexnpu daemon speaks version " +
        std::to_string(kProtocolVersion) + ", the client " +
        (request.ints.empty() ? std::string("sent none") : std::to_string(request.ints[0])) +
        " (use the same FlexNPU build for both)");
  }
  s.observer = request.ints.size() > 1 && request.ints[1] == 1;
  s.tenant = request.text.empty() ? "default" : request.text;
  auto joined = tenants_.Join(s.tenant, s.observer, config_.allow_unknown_tenants);
  if (!joined.ok()) return joined.status();
  const TenantConfig* tenant = *joined != nullptr ? &(*joined)->config : nullptr;
  if (tenant != nullptr && !s.observer) {
    s.tenant_state = *joined;
    s.channel->tenant = *joined;
    s.latency = tenant->priority == "latency";
  }
  const std::vector<Device>& devices = physical_.devices;
  const std::vector<Memory>& memories = physical_.memories;
  for (size_t d = 0; d < devices.size(); ++d) {
    bool allowed = tenant == nullptr || tenant->devices.empty();
    if (!allowed) {
      for (int64_t id : tenant->devices) allowed = allowed || id == devices[d].id;
    }
    if (!allowed) continue;
    s.devices.insert(static_cast<int64_t>(d));
    for (int64_t m : devices[d].memories) s.memories.insert(m);
  }
  reply->ints.push_back(s.id);
  reply->ints.push_back(static_cast<int64_t>(s.memories.size()));
  reply->blobs = {physical_.platform_name, physical_.platform_version};
  for (int64_t m : s.memories) {
    reply->ints.insert(reply->ints.end(), {m, memories[m].id, memories[m].kind_id});
    reply->blobs.push_back(memories[m].kind);
  }
  reply->ints.push_back(static_cast<int64_t>(s.devices.size()));
  for (int64_t d : s.devices) {
    const Device& device = devices[d];
    reply->ints.insert(reply->ints.end(), {d, device.id, device.local_hardware_id,
                                           device.default_memory});
    AppendList(&reply->ints, device.memories.data(), device.memories.size());
    reply->blobs.push_back(device.kind);
  }
  // Each device's memory limit as this session sees it: what the device has, and with a tenant
  // quota at most an even share of the quota, so the limits add up to min(quota, memory).
  const int64_t quota = tenant == nullptr ? -1 : tenant->memory_quota_bytes;
  const int num_devices = static_cast<int>(s.devices.size());
  reply->ints.push_back(num_devices);
  int rank = 0;
  for (int64_t d : s.devices) {
    int64_t limit = devices[d].bytes_limit;
    if (quota >= 0) {
      const int64_t share = ShareOf(quota, num_devices, rank);
      limit = limit < 0 ? share : std::min(limit, share);
    }
    reply->ints.push_back(limit);
    ++rank;
  }
  // One-way executions and transfers are offered to tenants without a quota: a quota refusal
  // stays synchronous (RESOURCE_EXHAUSTED at dispatch).
  reply->ints.push_back(tenant == nullptr || tenant->memory_quota_bytes < 0 ? 1 : 0);
  if (!s.observer) {
    Log(config_, "session " + std::to_string(s.id) + " (tenant '" + s.tenant + "') connected, " +
                     std::to_string(s.devices.size()) + " devices");
  }
  return Status::Ok();
}

void Dispatcher::EndSession(Session& s) {
  ::shutdown(s.channel->fd, SHUT_RDWR);
  int64_t bytes = 0;
  for (auto& [id, entry] : s.buffers) {
    bytes += entry.counted_bytes;
    if (entry.handle != nullptr) InnerDeleter<PJRT_Buffer>{&b()}(entry.handle);
  }
  s.buffers.clear();
  for (auto& [id, entry] : s.executables) InnerDeleter<PJRT_LoadedExecutable>{&b()}(entry.handle);
  s.executables.clear();
  // Events whose callbacks have not run yet: destroying the handle leaves the callback armed
  // (it holds the channel, whose writes now fail quietly).
  DrainFired(s);
  for (PJRT_Event* e : s.events) InnerDeleter<PJRT_Event>{&b()}(e);
  s.events.clear();
  tenants_.Leave(s.tenant, s.observer, bytes);
}

}  // namespace flexnpu::daemon
