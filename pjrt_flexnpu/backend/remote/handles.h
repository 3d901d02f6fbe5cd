// The objects behind the handles this API gives the runtime (RemoteClient, RemoteBuffer, ...):
// each holds daemon-side ids, never pointers into the daemon, and the metadata the daemon sent
// with it, which answers the query slots locally: only data and work (transfers, compile,
// execute, destroy) cross the socket.
#ifndef FLEXNPU_BACKEND_REMOTE_HANDLES_H_
#define FLEXNPU_BACKEND_REMOTE_HANDLES_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/remote/connection.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::remote {

struct RemoteClient;

struct RemoteMemory {
  int64_t index = 0;
  int64_t id = 0;
  std::string kind;
  int64_t kind_id = 0;
  std::string debug;
  std::vector<PJRT_Device*> devices;
};

struct RemoteDevice {
  RemoteClient* client = nullptr;
  int64_t index = 0;
  int64_t id = 0;
  int64_t local_hardware_id = 0;
  std::string kind;
  std::string debug;
  RemoteMemory* default_memory = nullptr;
  std::vector<PJRT_Memory*> memories;
  // What the daemon says this session may hold on the device (its tenant's quota share, at
  // most what the device has); -1: it cannot say.
  int64_t bytes_limit = -1;
};

struct RemoteClient {
  std::shared_ptr<Connection> connection;
  int64_t session = 0;
  bool one_way = false;  // the daemon offers one-way Execute/BufferFromHost (no quota)
  std::atomic<int64_t> next_output_id{-1};  // buffers named by this process: negative ids
  // Descriptions of transferred buffers by (type, dims, strides, device, memory), learnt from
  // the first synchronous transfer of each: later ones are one-way.
  std::mutex transfers_mu;
  std::map<std::vector<int64_t>, BufferMeta> transfers;
  std::string platform_name;
  std::string platform_version;
  std::vector<std::unique_ptr<RemoteDevice>> devices;
  std::vector<PJRT_Device*> device_handles;
  std::map<int64_t, std::unique_ptr<RemoteMemory>> memories;  // by daemon memory index
  std::vector<PJRT_Memory*> memory_handles;

  RemoteMemory* Memory(int64_t index) const {
    auto it = memories.find(index);
    return it == memories.end() ? nullptr : it->second.get();
  }
  RemoteDevice* DeviceOfIndex(int64_t index) const {
    for (const auto& d : devices) {
      if (d->index == index) return d.get();
    }
    return nullptr;
  }
};

struct RemoteBuffer {
  RemoteClient* client = nullptr;
  std::shared_ptr<Connection> connection;  // outlives the client if the buffer does
  BufferMeta meta;
  std::atomic<bool> deleted{false};
  // Made from a shared segment (the daemon's CPU backend may alias it zero-copy): part of the
  // key of one-way executions, whose donation may differ with it.
  bool zero_copy = false;
  // One-way executions that should consume this buffer (as their first execution of the same
  // key did): whether one did is known at its completion push (RemoteEvent::donated), which
  // IsDeleted waits for. (execution event, argument position)
  std::mutex pending_mu;
  std::vector<std::pair<std::shared_ptr<RemoteEvent>, int64_t>> pending_donations;
  // For execution outputs: the execution's completion, which is also their readiness (asked
  // locally, without a round trip); null for other buffers.
  std::shared_ptr<RemoteEvent> ready;
  // Storage the layout query points into.
  std::vector<int64_t> tile_dims;
  std::vector<size_t> tile_dim_sizes;
};

// What an execution of a static-shaped executable makes, learnt from its first (synchronous)
// execution with the same devices and donation options: later ones are one-way.
struct ExecuteTemplate {
  std::vector<BufferMeta> outputs;  // device-major; ids unused
  std::vector<int64_t> donated;     // argument positions consumed
};

struct RemoteExecutableState {
  RemoteClient* client = nullptr;
  std::shared_ptr<Connection> connection;
  ExecutableMeta meta;
  std::vector<PJRT_Device*> devices;
  std::mutex templates_mu;
  std::map<std::vector<int64_t>, ExecuteTemplate> templates;  // by ExecuteKey
  std::mutex mu;
  bool have_program = false;
  std::string program_code;
  std::string program_format;
};

struct RemoteLoadedExecutable {
  std::shared_ptr<RemoteExecutableState> state;
  std::atomic<bool> deleted{false};
};

struct RemoteExecutable {
  std::shared_ptr<RemoteExecutableState> state;
};

struct RemoteSerialized {
  std::string bytes;
};

struct EventHandle {
  std::shared_ptr<RemoteEvent> event;
};

using own_api::From;
using own_api::To;

// The memory index of `memory`, or -1.
inline int64_t MemoryIndex(PJRT_Memory* memory) {
  return memory == nullptr ? -1 : From<RemoteMemory>(memory)->index;
}

// A buffer of `client` from the description at `cursor` in a reply.
StatusOr<RemoteBuffer*> NewBuffer(RemoteClient* client, IntCursor* cursor);
// A loaded executable of `client` from a Compile or Deserialize reply.
StatusOr<RemoteLoadedExecutable*> NewLoaded(RemoteClient* client, const Frame& reply);

Status BadReply(const RemoteClient* client, const char* what);

}  // namespace flexnpu::remote

#endif  // FLEXNPU_BACKEND_REMOTE_HANDLES_H_
