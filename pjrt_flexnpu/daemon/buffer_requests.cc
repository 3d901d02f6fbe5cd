// A session's requests on buffers: transfers to and from the host, readiness, deletion,
// copies, and the session's buffer table.
#include <memory>
#include <utility>

#include "pjrt_flexnpu/daemon/dispatch.h"

namespace flexnpu::daemon {
namespace {

// A PJRT_Buffer_MemoryLayout pointing into `l` (which must outlive it); nullptr for none.
struct InnerLayout {
  PJRT_Buffer_MemoryLayout layout{};
  std::vector<int64_t> tile_dims;
  std::vector<size_t> tile_dim_sizes;
  PJRT_Buffer_MemoryLayout* Build(const Layout& l) {
    if (l.type < 0) return nullptr;
    layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
    layout.type = static_cast<PJRT_Buffer_MemoryLayout_Type>(l.type);
    if (layout.type == PJRT_Buffer_MemoryLayout_Type_Strides) {
      layout.strides.struct_size = PJRT_Buffer_MemoryLayout_Strides_STRUCT_SIZE;
      layout.strides.byte_strides = l.byte_strides.data();
      layout.strides.num_byte_strides = l.byte_strides.size();
      return &layout;
    }
    for (const auto& tile : l.tiles) {
      tile_dims.insert(tile_dims.end(), tile.begin(), tile.end());
      tile_dim_sizes.push_back(tile.size());
    }
    layout.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
    layout.tiled.minor_to_major = l.minor_to_major.data();
    layout.tiled.minor_to_major_size = l.minor_to_major.size();
    layout.tiled.tile_dims = tile_dims.data();
    layout.tiled.tile_dim_sizes = tile_dim_sizes.data();
    layout.tiled.num_tiles = tile_dim_sizes.size();
    return &layout;
  }
};

}  // namespace

StatusOr<BufferEntry*> Dispatcher::FindBuffer(Session& s, const std::vector<int64_t>& ints,
                                              size_t at) {
  if (ints.size() <= at) return InvalidArgument("request names no buffer");
  auto it = s.buffers.find(ints[at]);
  if (it == s.buffers.end()) {
    return NotFound("buffer " + std::to_string(ints[at]) + " is not one of session " +
                    std::to_string(s.id) + "'s buffers");
  }
  if (it->second.handle == nullptr) return it->second.error;
  return &it->second;
}

Status Dispatcher::Describe(PJRT_Buffer* buffer, int64_t id, BufferMeta* m) {
  m->id = id;
  auto metadata = b().Metadata(buffer);
  if (!metadata.ok()) return metadata.status();
  m->type = metadata->element_type;
  m->dims = std::move(metadata->dims);
  m->on_device_size = metadata->on_device_size;
  auto memory = b().Memory(buffer);
  if (!memory.ok()) return memory.status();
  m->memory = physical_.MemoryIndexOf(*memory);
  // Tokens have no dynamic dimensions or layout (the CPU plugin aborts when asked).
  if (m->type == PJRT_Buffer_Type_TOKEN) return Status::Ok();
  PJRT_Buffer_DynamicDimensionIndices_Args dyn{};
  dyn.struct_size = PJRT_Buffer_DynamicDimensionIndices_Args_STRUCT_SIZE;
  dyn.buffer = buffer;
  if (FLEXNPU_INNER_CALL(b(), PJRT_Buffer_DynamicDimensionIndices, &dyn).ok()) {
    for (size_t i = 0; i < dyn.num_dynamic_dims; ++i) {
      m->dynamic_dims.push_back(static_cast<int64_t>(dyn.dynamic_dim_indices[i]));
    }
  }
  PJRT_Buffer_GetMemoryLayout_Args layout{};
  layout.struct_size = PJRT_Buffer_GetMemoryLayout_Args_STRUCT_SIZE;
  layout.buffer = buffer;
  if (FLEXNPU_INNER_CALL(b(), PJRT_Buffer_GetMemoryLayout, &layout).ok()) {
    m->layout_type = layout.layout.type;
    if (layout.layout.type == PJRT_Buffer_MemoryLayout_Type_Strides) {
      const auto& st = layout.layout.strides;
      m->byte_strides.assign(st.byte_strides, st.byte_strides + st.num_byte_strides);
    } else {
      const auto& t = layout.layout.tiled;
      m->minor_to_major.assign(t.minor_to_major, t.minor_to_major + t.minor_to_major_size);
      size_t offset = 0;
      for (size_t i = 0; i < t.num_tiles; ++i) {
        m->tiles.emplace_back(t.tile_dims + offset, t.tile_dims + offset + t.tile_dim_sizes[i]);
        offset += t.tile_dim_sizes[i];
      }
    }
  }
  return Status::Ok();
}

Status Dispatcher::AddBuffer(Session& s, PJRT_Buffer* handle, std::vector<int64_t>* ints,
                             int64_t* bytes, int64_t id) {
  BufferMeta meta;
  if (id == 0) id = next_id_++;
  Status st = Describe(handle, id, &meta);
  if (!st.ok()) {
    InnerDeleter<PJRT_Buffer>{&b()}(handle);
    return st;
  }
  s.buffers[id] = BufferEntry{handle, meta.on_device_size};
  *bytes += meta.on_device_size;
  AppendBufferMeta(ints, meta);
  return Status::Ok();
}

Status Dispatcher::BufferFromHost(Session& s, const Frame& r, std::vector<int>& fds,
                                  Frame* out) {
  IntCursor c(r.ints);
  int64_t type, device, memory, inline_payload, size, client_id;
  std::vector<int64_t> dims, strides;
  if (!c.Next(&type) || !c.List(&dims) || !c.List(&strides) || !c.Next(&device) ||
      !c.Next(&memory) || !c.Next(&inline_payload) || !c.Next(&size) || size < 0 ||
      !c.Next(&client_id)) {
    return InvalidArgument("malformed BufferFromHost request");
  }
  // One-way (no reply): the client names the buffer (a negative id, new to the session).
  if ((r.call_id == 0) != (client_id != 0) || client_id > 0 || s.buffers.count(client_id) > 0) {
    return InvalidArgument("BufferFromHost: buffer id " + std::to_string(client_id) +
                           " is not a new client id");
  }
  if (device >= 0 && s.devices.count(device) == 0) {
    return PermissionDenied("device index " + std::to_string(device) +
                            " is outside the device set of tenant '" + s.tenant + "'");
  }
  if (memory >= 0 && s.memories.count(memory) == 0) {
    return PermissionDenied("memory index " + std::to_string(memory) +
                            " is outside the device set of tenant '" + s.tenant + "'");
  }
  if (device < 0 && memory < 0) return InvalidArgument("BufferFromHost names no device or memory");
  const void* data = nullptr;
  std::shared_ptr<SharedSegment> segment;
  if (inline_payload) {
    if (r.blobs.empty() || static_cast<int64_t>(r.blobs[0].size()) != size) {
      return InvalidArgument("BufferFromHost: inline payload size does not match");
    }
    data = r.blobs[0].data();
  } else {
    if (fds.empty()) return InvalidArgument("BufferFromHost: no shared segment was passed");
    auto mapped = SharedSegment::Map(fds[0], static_cast<size_t>(size));
    fds[0] = -1;  // owned by the segment now
    if (!mapped.ok()) return mapped.status();
    segment = std::make_shared<SharedSegment>(std::move(*mapped));
    data = segment->data();
  }
  FLEXNPU_RETURN_IF_ERROR(tenants_.Charge(s.tenant, size, "a host-to-device transfer"));
  if (s.tenant_state != nullptr) s.tenant_state->bytes_to_device += size;
  PJRT_Client_BufferFromHostBuffer_Args args{};
  args.struct_size = PJRT_Client_BufferFromHostBuffer_Args_STRUCT_SIZE;
  args.client = physical_.client.get();
  args.data = data;
  args.type = static_cast<PJRT_Buffer_Type>(type);
  args.dims = dims.data();
  args.num_dims = dims.size();
  args.byte_strides = strides.empty() ? nullptr : strides.data();
  args.num_byte_strides = strides.size();
  // The segment is the daemon's own copy: the CPU backend can alias it (zero-copy) and the
  // done event says when it may be unmapped.
  args.host_buffer_semantics = segment ? PJRT_HostBufferSemantics_kImmutableZeroCopy
                                       : PJRT_HostBufferSemantics_kImmutableOnlyDuringCall;
  args.device = device >= 0 ? physical_.devices[device].handle : nullptr;
  args.memory = memory >= 0 ? physical_.memories[memory].handle : nullptr;
  Status st = FLEXNPU_INNER_CALL(b(), PJRT_Client_BufferFromHostBuffer, &args);
  tenants_.Release(s.tenant, size);
  if (!st.ok()) return st;
  if (args.done_with_host_buffer != nullptr) {
    WatchEvent(s, args.done_with_host_buffer, 0, nullptr, segment);
  }
  int64_t bytes = 0;
  std::vector<int64_t> ints;
  FLEXNPU_RETURN_IF_ERROR(AddBuffer(s, args.buffer, &ints, &bytes, client_id));
  Status charged = tenants_.Charge(s.tenant, bytes, "a host-to-device transfer");
  if (!charged.ok()) {
    InnerDeleter<PJRT_Buffer>{&b()}(s.buffers[ints[0]].handle);
    s.buffers.erase(ints[0]);
    return charged;
  }
  out->ints = std::move(ints);
  return Status::Ok();
}

Status Dispatcher::ToHost(Session& s, const Frame& r, std::vector<int>& fds, Frame* out) {
  auto buffer = FindBuffer(s, r.ints);
  if (!buffer.ok()) return buffer.status();
  if (r.ints.size() < 4 || r.ints[2] < 0) return InvalidArgument("malformed ToHost request");
  const int64_t event_id = r.ints[1];
  const size_t size = static_cast<size_t>(r.ints[2]);
  const bool inline_payload = r.ints[3] != 0;
  std::shared_ptr<std::string> payload;
  std::shared_ptr<SharedSegment> segment;
  void* dst;
  if (inline_payload) {
    if (size > kInlinePayloadBytes) return InvalidArgument("ToHost: inline payload too large");
    payload = std::make_shared<std::string>(size, '\0');
    dst = payload->data();
  } else {
    if (fds.empty()) return InvalidArgument("ToHost: no shared segment was passed");
    auto mapped = SharedSegment::Map(fds[0], size);
    fds[0] = -1;
    if (!mapped.ok()) return mapped.status();
    segment = std::make_shared<SharedSegment>(std::move(*mapped));
    dst = segment->data();
  }
  Layout layout;
  IntCursor lc(r.ints, 4);
  if (!ReadLayout(&lc, &layout)) return InvalidArgument("malformed ToHost request (layout)");
  InnerLayout inner_layout;
  PJRT_Buffer_ToHostBuffer_Args args{};
  args.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
  args.src = (*buffer)->handle;
  args.host_layout = inner_layout.Build(layout);
  args.dst = dst;
  args.dst_size = size;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Buffer_ToHostBuffer, &args));
  // Inline payloads are counted when pushed.
  if (segment && s.tenant_state != nullptr) s.tenant_state->bytes_to_host += size;
  std::function<void(Frame*)> fill;
  if (payload) fill = [payload](Frame* push) { push->blobs.push_back(*payload); };
  std::shared_ptr<void> keep = segment ? std::shared_ptr<void>(segment) : payload;
  WatchEvent(s, args.event, event_id, std::move(fill), std::move(keep));
  (void)out;
  return Status::Ok();
}

Status Dispatcher::ToHostSize(Session& s, const Frame& r, Frame* out) {
  auto buffer = FindBuffer(s, r.ints);
  if (!buffer.ok()) return buffer.status();
  Layout layout;
  IntCursor lc(r.ints, 1);
  if (!ReadLayout(&lc, &layout)) return InvalidArgument("malformed ToHostSize request");
  InnerLayout inner_layout;
  PJRT_Buffer_ToHostBuffer_Args args{};
  args.struct_size = PJRT_Buffer_ToHostBuffer_Args_STRUCT_SIZE;
  args.src = (*buffer)->handle;
  args.host_layout = inner_layout.Build(layout);
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Buffer_ToHostBuffer, &args));
  out->ints = {static_cast<int64_t>(args.dst_size)};
  return Status::Ok();
}

Status Dispatcher::ReadyEvent(Session& s, const Frame& r) {
  auto buffer = FindBuffer(s, r.ints);
  if (!buffer.ok()) return buffer.status();
  if (r.ints.size() < 2) return InvalidArgument("malformed ReadyEvent request");
  PJRT_Buffer_ReadyEvent_Args args{};
  args.struct_size = PJRT_Buffer_ReadyEvent_Args_STRUCT_SIZE;
  args.buffer = (*buffer)->handle;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Buffer_ReadyEvent, &args));
  WatchEvent(s, args.event, r.ints[1], nullptr, nullptr);
  return Status::Ok();
}

Status Dispatcher::DeleteBuffer(Session& s, const Frame& r) {
  auto buffer = FindBuffer(s, r.ints);
  if (!buffer.ok()) return buffer.status();
  FLEXNPU_RETURN_IF_ERROR(b().Delete((*buffer)->handle));
  tenants_.Release(s.tenant, (*buffer)->counted_bytes);
  (*buffer)->counted_bytes = 0;
  return Status::Ok();
}

Status Dispatcher::IsDeleted(Session& s, const Frame& r, Frame* out) {
  auto buffer = FindBuffer(s, r.ints);
  if (!buffer.ok()) return buffer.status();
  auto deleted = b().IsDeleted((*buffer)->handle);
  if (!deleted.ok()) return deleted.status();
  out->ints = {*deleted ? 1 : 0};
  return Status::Ok();
}

Status Dispatcher::DestroyBuffer(Session& s, const Frame& r) {
  auto failed = s.buffers.find(r.ints.empty() ? 0 : r.ints[0]);
  if (failed != s.buffers.end() && failed->second.handle == nullptr) {
    s.buffers.erase(failed);  // a failed one-way execution's output: nothing to destroy
    return Status::Ok();
  }
  auto buffer = FindBuffer(s, r.ints);
  if (!buffer.ok()) return buffer.status();
  if (s.tenant_state != nullptr && s.tenant_state->config.memory_quota_bytes >= 0) {
    // A tenant with a quota gets its bytes back only once they are free, and its next
    // request must not be refused for bytes it has already given back: destroy in line
    // (the session's later requests wait, as they did before the reaper).
    InnerDeleter<PJRT_Buffer>{&b()}((*buffer)->handle);
    tenants_.Release(s.tenant, (*buffer)->counted_bytes);
  } else {
    tenants_.Release(s.tenant, (*buffer)->counted_bytes);
    reaper_.Destroy((*buffer)->handle);
  }
  s.buffers.erase(r.ints[0]);
  return Status::Ok();
}

Status Dispatcher::CopyToMemory(Session& s, const Frame& r, Frame* out) {
  auto buffer = FindBuffer(s, r.ints);
  if (!buffer.ok()) return buffer.status();
  if (r.ints.size() < 2 || s.memories.count(r.ints[1]) == 0) {
    return PermissionDenied("CopyToMemory: the memory is outside the device set of tenant '" +
                            s.tenant + "'");
  }
  PJRT_Buffer_CopyToMemory_Args args{};
  args.struct_size = PJRT_Buffer_CopyToMemory_Args_STRUCT_SIZE;
  args.buffer = (*buffer)->handle;
  args.dst_memory = physical_.memories[r.ints[1]].handle;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Buffer_CopyToMemory, &args));
  int64_t bytes = 0;
  FLEXNPU_RETURN_IF_ERROR(AddBuffer(s, args.dst_buffer, &out->ints, &bytes));
  Status charged = tenants_.Charge(s.tenant, bytes, "a device-to-device copy");
  if (!charged.ok()) {
    InnerDeleter<PJRT_Buffer>{&b()}(s.buffers[out->ints[0]].handle);
    s.buffers.erase(out->ints[0]);
    return charged;
  }
  return Status::Ok();
}

}  // namespace flexnpu::daemon
