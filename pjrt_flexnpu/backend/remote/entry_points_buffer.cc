// Buffers: transfers from and to the host (inline in the frame, or through a shared memory
// segment), copies, deletion and donation, readiness. Metadata queries are answered from the
// description the daemon sent with the buffer.
#include <algorithm>
#include <cstring>
#include <optional>

#include "pjrt_flexnpu/backend/remote/entry_points.h"
#include "pjrt_flexnpu/backend/remote/handles.h"

namespace flexnpu::remote {
namespace {

// Host bytes spanned by an array of `dims` with `byte_strides` (dense when empty).
StatusOr<size_t> HostBytes(int type, const int64_t* dims, size_t num_dims,
                           const int64_t* byte_strides, size_t num_strides) {
  const size_t element = daemon::HostElementBytes(type);
  if (element == 0) {
    return InvalidArgument("PJRT_Client_BufferFromHostBuffer over the daemon: element type " +
                           std::to_string(type) + " has no host representation");
  }
  size_t count = 1;
  for (size_t i = 0; i < num_dims; ++i) {
    if (dims[i] < 0) return InvalidArgument("negative dimension in BufferFromHostBuffer");
    count *= static_cast<size_t>(dims[i]);
  }
  if (count == 0) return size_t{0};
  if (byte_strides == nullptr || num_strides == 0) return count * element;
  if (num_strides != num_dims) {
    return InvalidArgument("BufferFromHostBuffer: " + std::to_string(num_strides) +
                           " byte strides for " + std::to_string(num_dims) + " dimensions");
  }
  size_t extent = element;
  for (size_t i = 0; i < num_dims; ++i) {
    if (byte_strides[i] < 0) return InvalidArgument("negative byte stride in BufferFromHostBuffer");
    extent += static_cast<size_t>(dims[i] - 1) * static_cast<size_t>(byte_strides[i]);
  }
  return extent;
}

}  // namespace

PJRT_Error* Client_BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* a) {
  return Run([&]() -> Status {
    RemoteClient* client = From<RemoteClient>(a->client);
    if (a->device_layout != nullptr) {
      return Unimplemented("PJRT_Client_BufferFromHostBuffer over the flexnpu daemon: a device "
                           "layout is not supported");
    }
    auto bytes = HostBytes(a->type, a->dims, a->num_dims, a->byte_strides, a->num_byte_strides);
    if (!bytes.ok()) return bytes.status();
    Frame request;
    request.op = daemon::kBufferFromHost;
    request.ints.push_back(a->type);
    daemon::AppendList(&request.ints, a->dims, a->num_dims);
    daemon::AppendList(&request.ints, a->byte_strides, a->byte_strides ? a->num_byte_strides : 0);
    request.ints.push_back(a->device ? From<RemoteDevice>(a->device)->index : -1);
    request.ints.push_back(MemoryIndex(a->memory));
    const bool inline_payload = *bytes <= daemon::kInlinePayloadBytes;
    request.ints.push_back(inline_payload ? 1 : 0);
    request.ints.push_back(static_cast<int64_t>(*bytes));
    const std::vector<int64_t> key(request.ints.begin(), request.ints.end() - 2);
    std::optional<BufferMeta> known;
    if (client->one_way) {
      std::lock_guard<std::mutex> lock(client->transfers_mu);
      auto it = client->transfers.find(key);
      if (it != client->transfers.end()) known = it->second;
    }
    std::vector<int> fds;
    SharedSegment segment;
    if (inline_payload) {
      request.blobs.emplace_back(static_cast<const char*>(a->data), *bytes);
    } else {
      auto created = SharedSegment::Create(*bytes, "flexnpu-h2d");
      if (!created.ok()) return created.status();
      segment = std::move(*created);
      std::memcpy(segment.data(), a->data, *bytes);
      fds.push_back(segment.fd());
    }
    // The bytes are copied (into the frame or the segment) before this returns.
    a->done_with_host_buffer = nullptr;
    if (known) {
      // One-way: this process names the buffer; a failure makes the id name the error.
      known->id = client->next_output_id.fetch_sub(1);
      request.ints.push_back(known->id);
      FLEXNPU_RETURN_IF_ERROR(client->connection->Post(std::move(request), fds));
      auto* buffer = new RemoteBuffer();
      buffer->client = client;
      buffer->connection = client->connection;
      buffer->meta = std::move(*known);
      buffer->zero_copy = !inline_payload;
      a->buffer = To<PJRT_Buffer>(buffer);
      a->done_with_host_buffer = ReadyEvent();
      return Status::Ok();
    }
    request.ints.push_back(0);  // the daemon names it in the reply
    auto reply = client->connection->Call(std::move(request), fds);
    if (!reply.ok()) return reply.status();
    IntCursor cursor(reply->ints);
    auto buffer = NewBuffer(client, &cursor);
    if (!buffer.ok()) return buffer.status();
    if (client->one_way && (*buffer)->meta.dynamic_dims.empty()) {
      std::lock_guard<std::mutex> lock(client->transfers_mu);
      if (client->transfers.size() < 4096) client->transfers.emplace(key, (*buffer)->meta);
    }
    (*buffer)->zero_copy = !inline_payload;
    a->buffer = To<PJRT_Buffer>(*buffer);
    a->done_with_host_buffer = ReadyEvent();
    return Status::Ok();
  });
}

PJRT_Error* Buffer_Destroy(PJRT_Buffer_Destroy_Args* a) {
  RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  Frame request;
  request.op = daemon::kBufferDestroy;
  request.ints = {b->meta.id};
  (void)b->connection->Post(std::move(request));  // a dead daemon has dropped it already
  delete b;
  return nullptr;
}
PJRT_Error* Buffer_ElementType(PJRT_Buffer_ElementType_Args* a) {
  a->type = static_cast<PJRT_Buffer_Type>(From<RemoteBuffer>(a->buffer)->meta.type);
  return nullptr;
}
PJRT_Error* Buffer_Dimensions(PJRT_Buffer_Dimensions_Args* a) {
  const RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  a->dims = b->meta.dims.data();
  a->num_dims = b->meta.dims.size();
  return nullptr;
}
PJRT_Error* Buffer_UnpaddedDimensions(PJRT_Buffer_UnpaddedDimensions_Args* a) {
  const RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  a->unpadded_dims = b->meta.dims.data();
  a->num_dims = b->meta.dims.size();
  return nullptr;
}
PJRT_Error* Buffer_DynamicDimensionIndices(PJRT_Buffer_DynamicDimensionIndices_Args* a) {
  const RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  a->dynamic_dim_indices = reinterpret_cast<const size_t*>(b->meta.dynamic_dims.data());
  a->num_dynamic_dims = b->meta.dynamic_dims.size();
  return nullptr;
}
PJRT_Error* Buffer_GetMemoryLayout(PJRT_Buffer_GetMemoryLayout_Args* a) {
  RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  const BufferMeta& m = b->meta;
  if (m.layout_type < 0) {
    return ToError(Unimplemented("PJRT_Buffer_GetMemoryLayout: the daemon's backend gave no "
                                 "layout for this buffer"));
  }
  a->layout = PJRT_Buffer_MemoryLayout{};
  a->layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
  a->layout.type = static_cast<PJRT_Buffer_MemoryLayout_Type>(m.layout_type);
  if (a->layout.type == PJRT_Buffer_MemoryLayout_Type_Strides) {
    a->layout.strides.struct_size = PJRT_Buffer_MemoryLayout_Strides_STRUCT_SIZE;
    a->layout.strides.byte_strides = m.byte_strides.data();
    a->layout.strides.num_byte_strides = m.byte_strides.size();
    return nullptr;
  }
  if (b->tile_dim_sizes.size() != m.tiles.size()) {
    b->tile_dims.clear();
    b->tile_dim_sizes.clear();
    for (const auto& tile : m.tiles) {
      b->tile_dims.insert(b->tile_dims.end(), tile.begin(), tile.end());
      b->tile_dim_sizes.push_back(tile.size());
    }
  }
  a->layout.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
  a->layout.tiled.minor_to_major = m.minor_to_major.data();
  a->layout.tiled.minor_to_major_size = m.minor_to_major.size();
  a->layout.tiled.tile_dims = b->tile_dims.data();
  a->layout.tiled.tile_dim_sizes = b->tile_dim_sizes.data();
  a->layout.tiled.num_tiles = b->tile_dim_sizes.size();
  return nullptr;
}
PJRT_Error* Buffer_OnDeviceSizeInBytes(PJRT_Buffer_OnDeviceSizeInBytes_Args* a) {
  a->on_device_size_in_bytes =
      static_cast<size_t>(From<RemoteBuffer>(a->buffer)->meta.on_device_size);
  return nullptr;
}
PJRT_Error* Buffer_Memory(PJRT_Buffer_Memory_Args* a) {
  const RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  RemoteMemory* m = b->client->Memory(b->meta.memory);
  if (m == nullptr) return ToError(NotFound("buffer's memory is not visible to this session"));
  a->memory = To<PJRT_Memory>(m);
  return nullptr;
}
PJRT_Error* Buffer_Device(PJRT_Buffer_Device_Args* a) {
  const RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  RemoteMemory* m = b->client->Memory(b->meta.memory);
  if (m == nullptr || m->devices.empty()) {
    return ToError(NotFound("buffer's device is not visible to this session"));
  }
  a->device = m->devices[0];
  return nullptr;
}
PJRT_Error* Buffer_IsOnCpu(PJRT_Buffer_IsOnCpu_Args* a) {
  a->is_on_cpu = false;  // its memory is in the daemon: no pointer into it is usable here
  return nullptr;
}

PJRT_Error* Buffer_Delete(PJRT_Buffer_Delete_Args* a) {
  return Run([&]() -> Status {
    RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
    Frame request;
    request.op = daemon::kBufferDelete;
    request.ints = {b->meta.id};
    auto reply = b->client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    b->deleted = true;
    return Status::Ok();
  });
}
// A buffer is deleted only by Buffer_Delete or by donation to an execution, whose reply (or,
// one-way, its completion push) lists the donated arguments: known here without asking. A
// buffer given to a one-way execution that should consume it waits for that push.
PJRT_Error* Buffer_IsDeleted(PJRT_Buffer_IsDeleted_Args* a) {
  RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
  std::vector<std::pair<std::shared_ptr<RemoteEvent>, int64_t>> pending;
  {
    std::lock_guard<std::mutex> lock(b->pending_mu);
    pending = b->pending_donations;
  }
  for (auto& [event, position] : pending) {
    AwaitEvent(*event);
    const std::vector<int64_t>& donated = event->donated;  // set before it turned ready
    if (std::find(donated.begin(), donated.end(), position) != donated.end()) b->deleted = true;
  }
  if (!pending.empty()) {
    // Exactly the entries checked here: another thread may have checked (and erased) some of
    // them meanwhile, and an execution may have added new ones behind them.
    std::lock_guard<std::mutex> lock(b->pending_mu);
    auto& list = b->pending_donations;
    for (const auto& checked : pending) {
      auto it = std::find(list.begin(), list.end(), checked);
      if (it != list.end()) list.erase(it);
    }
  }
  a->is_deleted = b->deleted.load();
  return nullptr;
}

PJRT_Error* Buffer_ReadyEvent(PJRT_Buffer_ReadyEvent_Args* a) {
  return Run([&]() -> Status {
    RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
    if (b->ready != nullptr) {
      a->event = To<PJRT_Event>(new EventHandle{b->ready});
      return Status::Ok();
    }
    Connection& c = *b->client->connection;
    auto [id, event] = c.NewEvent();
    Frame request;
    request.op = daemon::kBufferReadyEvent;
    request.ints = {b->meta.id, id};
    auto reply = c.Call(std::move(request));
    if (!reply.ok()) {
      c.DropEvent(id);
      return reply.status();
    }
    a->event = To<PJRT_Event>(new EventHandle{event});
    return Status::Ok();
  });
}

PJRT_Error* Buffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* a) {
  return Run([&]() -> Status {
    RemoteBuffer* b = From<RemoteBuffer>(a->src);
    Connection& c = *b->client->connection;
    Layout host_layout;
    if (const PJRT_Buffer_MemoryLayout* l = a->host_layout) {
      host_layout.type = l->type;
      if (l->type == PJRT_Buffer_MemoryLayout_Type_Strides) {
        host_layout.byte_strides.assign(l->strides.byte_strides,
                                        l->strides.byte_strides + l->strides.num_byte_strides);
      } else {
        const auto& t = l->tiled;
        host_layout.minor_to_major.assign(t.minor_to_major,
                                          t.minor_to_major + t.minor_to_major_size);
        size_t offset = 0;
        for (size_t i = 0; i < t.num_tiles; ++i) {
          host_layout.tiles.emplace_back(t.tile_dims + offset,
                                         t.tile_dims + offset + t.tile_dim_sizes[i]);
          offset += t.tile_dim_sizes[i];
        }
      }
    }
    if (a->dst == nullptr) {
      Frame request;
      request.op = daemon::kBufferToHostSize;
      request.ints = {b->meta.id};
      daemon::AppendLayout(&request.ints, host_layout);
      auto reply = c.Call(std::move(request));
      if (!reply.ok()) return reply.status();
      if (reply->ints.empty()) return BadReply(b->client, "Buffer_ToHostBuffer");
      a->dst_size = static_cast<size_t>(reply->ints[0]);
      return Status::Ok();
    }
    const size_t size = a->dst_size;
    const bool inline_payload = size <= daemon::kInlinePayloadBytes;
    std::shared_ptr<SharedSegment> segment;
    std::vector<int> fds;
    if (!inline_payload) {
      auto created = SharedSegment::Create(size, "flexnpu-d2h");
      if (!created.ok()) return created.status();
      segment = std::make_shared<SharedSegment>(std::move(*created));
      fds.push_back(segment->fd());
    }
    auto [id, event] = c.NewEvent();
    void* dst = a->dst;
    {
      std::lock_guard<std::mutex> lock(event->mu);
      event->on_push = [dst, size, segment](const Frame& push) {
        if (segment != nullptr) {
          std::memcpy(dst, segment->data(), size);
        } else if (!push.blobs.empty()) {
          std::memcpy(dst, push.blobs[0].data(), std::min(size, push.blobs[0].size()));
        }
      };
    }
    Frame request;
    request.op = daemon::kBufferToHost;
    request.ints = {b->meta.id, id, static_cast<int64_t>(size), inline_payload ? 1 : 0};
    daemon::AppendLayout(&request.ints, host_layout);
    // One-way: the push answers it (with the bytes, or the daemon's error).
    Status sent = c.Post(std::move(request), fds);
    if (!sent.ok()) {
      c.DropEvent(id);
      return sent;
    }
    a->event = To<PJRT_Event>(new EventHandle{event});
    return Status::Ok();
  });
}

PJRT_Error* Buffer_CopyToMemory(PJRT_Buffer_CopyToMemory_Args* a) {
  return Run([&]() -> Status {
    RemoteBuffer* b = From<RemoteBuffer>(a->buffer);
    Frame request;
    request.op = daemon::kBufferCopyToMemory;
    request.ints = {b->meta.id, MemoryIndex(a->dst_memory)};
    auto reply = b->client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    IntCursor cursor(reply->ints);
    auto buffer = NewBuffer(b->client, &cursor);
    if (!buffer.ok()) return buffer.status();
    a->dst_buffer = To<PJRT_Buffer>(*buffer);
    return Status::Ok();
  });
}

}  // namespace flexnpu::remote
