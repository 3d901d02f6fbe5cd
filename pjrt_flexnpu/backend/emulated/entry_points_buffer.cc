// Buffers: metadata, a device and a ready time; no contents. Host transfers take the host
// link's time and bring back zeros; copies between devices take the preset's link time.
#include <algorithm>
#include <cstring>

#include "pjrt_flexnpu/backend/emulated/entry_points.h"
#include "pjrt_flexnpu/backend/emulated/handles.h"
#include "pjrt_flexnpu/backend/emulated/timeline.h"
#include "pjrt_flexnpu/backend/remote/protocol.h"  // HostElementBytes

namespace flexnpu::emulated {
namespace {

EmulatedBuffer* BufferOf(PJRT_Buffer* buffer) { return From<EmulatedBuffer>(buffer); }

const Config& ConfigOf(const EmulatedBuffer& b) { return b.device->client->config; }

Status Deleted(const char* where) {
  return FailedPrecondition(std::string(where) + ": the buffer has been deleted or donated");
}

// Host bytes of `b` in `layout` (dense when null or tiled; the strided extent otherwise).
size_t HostBytes(const EmulatedBuffer& b, const PJRT_Buffer_MemoryLayout* layout) {
  const size_t element = daemon::HostElementBytes(b.type);
  if (layout == nullptr || layout->type != PJRT_Buffer_MemoryLayout_Type_Strides ||
      layout->strides.num_byte_strides != b.dims.size()) {
    return static_cast<size_t>(b.bytes);
  }
  size_t extent = element;
  for (size_t i = 0; i < b.dims.size(); ++i) {
    if (b.dims[i] == 0) return 0;
    extent += static_cast<size_t>(b.dims[i] - 1) *
              static_cast<size_t>(std::max<int64_t>(0, layout->strides.byte_strides[i]));
  }
  return extent;
}

// The instant a transfer of `bytes` over `link` that may start at `start_ns` completes.
int64_t TransferDone(int64_t start_ns, const xla_passes::LinkSpec& link, double bytes,
                     const Config& config) {
  return std::max(start_ns, NowNs()) +
         ScaledNs(xla_passes::TransferSeconds(link, bytes), config.time_scale);
}

Status CopyTo(PJRT_Buffer* source, const std::shared_ptr<EmulatedDevice>& target,
              PJRT_Buffer** out, const char* where) {
  const EmulatedBuffer& b = *BufferOf(source);
  if (b.deleted) return Deleted(where);
  const Config& config = ConfigOf(b);
  // Another device: over the preset's link. The same device: a copy in its memory (read and
  // write), modelled as a bandwidth-bound program.
  const int64_t ready =
      target.get() == b.device.get()
          ? std::max(b.ready_ns, NowNs()) +
                ScaledNs(xla_passes::ModelledSeconds(config.preset, 0, 2.0 * b.bytes),
                         config.time_scale)
          : TransferDone(b.ready_ns, config.device_link, static_cast<double>(b.bytes), config);
  FLEXNPU_ASSIGN_OR_RETURN(EmulatedBuffer * copy,
                           NewBuffer(target, b.type, b.dims, ready, std::string(where)));
  *out = To<PJRT_Buffer>(copy);
  return Status::Ok();
}

}  // namespace

// The host's data is never read: it may be freed at once (done_with_host_buffer is ready).
// The buffer is ready once the bytes would have crossed the host link.
PJRT_Error* Client_BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* a) {
  return Run([&]() -> Status {
    const EmulatedClient* client = From<EmulatedClient>(a->client);
    std::shared_ptr<EmulatedDevice> device;
    if (a->memory != nullptr) {
      device = SharedDevice(From<EmulatedMemory>(a->memory)->device_handle);
    } else if (a->device != nullptr) {
      device = SharedDevice(a->device);
    } else {
      device = client->devices.front();
    }
    std::vector<int64_t> dims(a->dims, a->dims + a->num_dims);
    int64_t bytes = static_cast<int64_t>(daemon::HostElementBytes(a->type));
    for (int64_t d : dims) bytes *= std::max<int64_t>(d, 0);
    const int64_t ready = TransferDone(NowNs(), client->config.host_link,
                                       static_cast<double>(bytes), client->config);
    FLEXNPU_ASSIGN_OR_RETURN(
        EmulatedBuffer * buffer,
        NewBuffer(device, a->type, std::move(dims), ready, "a transfer from the host"));
    a->buffer = To<PJRT_Buffer>(buffer);
    a->done_with_host_buffer = NewEvent(NowNs());
    return Status::Ok();
  });
}

PJRT_Error* Buffer_Destroy(PJRT_Buffer_Destroy_Args* a) {
  delete BufferOf(a->buffer);
  return nullptr;
}
PJRT_Error* Buffer_ElementType(PJRT_Buffer_ElementType_Args* a) {
  a->type = BufferOf(a->buffer)->type;
  return nullptr;
}
PJRT_Error* Buffer_Dimensions(PJRT_Buffer_Dimensions_Args* a) {
  const EmulatedBuffer* b = BufferOf(a->buffer);
  a->dims = b->dims.data();
  a->num_dims = b->dims.size();
  return nullptr;
}
PJRT_Error* Buffer_UnpaddedDimensions(PJRT_Buffer_UnpaddedDimensions_Args* a) {
  const EmulatedBuffer* b = BufferOf(a->buffer);
  a->unpadded_dims = b->dims.data();
  a->num_dims = b->dims.size();
  return nullptr;
}
PJRT_Error* Buffer_DynamicDimensionIndices(PJRT_Buffer_DynamicDimensionIndices_Args* a) {
  a->dynamic_dim_indices = nullptr;
  a->num_dynamic_dims = 0;
  return nullptr;
}
PJRT_Error* Buffer_GetMemoryLayout(PJRT_Buffer_GetMemoryLayout_Args* a) {
  const EmulatedBuffer* b = BufferOf(a->buffer);
  a->layout = PJRT_Buffer_MemoryLayout{};
  a->layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
  a->layout.type = PJRT_Buffer_MemoryLayout_Type_Tiled;
  a->layout.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
  a->layout.tiled.minor_to_major = b->minor_to_major.data();
  a->layout.tiled.minor_to_major_size = b->minor_to_major.size();
  return nullptr;
}
PJRT_Error* Buffer_OnDeviceSizeInBytes(PJRT_Buffer_OnDeviceSizeInBytes_Args* a) {
  a->on_device_size_in_bytes = static_cast<size_t>(BufferOf(a->buffer)->bytes);
  return nullptr;
}
PJRT_Error* Buffer_Device(PJRT_Buffer_Device_Args* a) {
  a->device = To<PJRT_Device>(BufferOf(a->buffer)->device.get());
  return nullptr;
}
PJRT_Error* Buffer_Memory(PJRT_Buffer_Memory_Args* a) {
  a->memory = BufferOf(a->buffer)->device->memory_handle;
  return nullptr;
}
PJRT_Error* Buffer_Delete(PJRT_Buffer_Delete_Args* a) {
  BufferOf(a->buffer)->Release();
  return nullptr;
}
PJRT_Error* Buffer_IsDeleted(PJRT_Buffer_IsDeleted_Args* a) {
  a->is_deleted = BufferOf(a->buffer)->deleted.load();
  return nullptr;
}
PJRT_Error* Buffer_IsOnCpu(PJRT_Buffer_IsOnCpu_Args* a) {
  a->is_on_cpu = false;  // no host memory holds it
  return nullptr;
}
PJRT_Error* Buffer_ReadyEvent(PJRT_Buffer_ReadyEvent_Args* a) {
  a->event = NewEvent(BufferOf(a->buffer)->ready_ns);
  return nullptr;
}

PJRT_Error* Buffer_CopyToDevice(PJRT_Buffer_CopyToDevice_Args* a) {
  return Run([&] {
    return CopyTo(a->buffer, SharedDevice(a->dst_device), &a->dst_buffer,
                  "PJRT_Buffer_CopyToDevice");
  });
}
PJRT_Error* Buffer_CopyToMemory(PJRT_Buffer_CopyToMemory_Args* a) {
  return Run([&] {
    return CopyTo(a->buffer, SharedDevice(From<EmulatedMemory>(a->dst_memory)->device_handle),
                  &a->dst_buffer, "PJRT_Buffer_CopyToMemory");
  });
}

// The contents are zeros (nothing was computed), written before the event: it turns ready
// when the buffer is and the bytes have crossed the host link.
PJRT_Error* Buffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* a) {
  return Run([&]() -> Status {
    const EmulatedBuffer& b = *BufferOf(a->src);
    if (b.deleted) return Deleted("PJRT_Buffer_ToHostBuffer");
    const size_t size = HostBytes(b, a->host_layout);
    if (a->dst == nullptr) {
      a->dst_size = size;
      return Status::Ok();
    }
    if (a->dst_size < size) {
      return InvalidArgument("PJRT_Buffer_ToHostBuffer: dst_size " + std::to_string(a->dst_size) +
                             " is smaller than the buffer's " + std::to_string(size) + " bytes");
    }
    std::memset(a->dst, 0, size);
    a->event = NewEvent(
        TransferDone(b.ready_ns, ConfigOf(b).host_link, static_cast<double>(size), ConfigOf(b)));
    return Status::Ok();
  });
}
PJRT_Error* Buffer_CopyRawToHost(PJRT_Buffer_CopyRawToHost_Args* a) {
  return Run([&]() -> Status {
    const EmulatedBuffer& b = *BufferOf(a->buffer);
    if (b.deleted) return Deleted("PJRT_Buffer_CopyRawToHost");
    if (a->offset < 0 || a->transfer_size < 0 || a->offset + a->transfer_size > b.bytes) {
      return InvalidArgument("PJRT_Buffer_CopyRawToHost: bytes [" + std::to_string(a->offset) +
                             ", +" + std::to_string(a->transfer_size) + ") are outside the " +
                             std::to_string(b.bytes) + " of the buffer");
    }
    std::memset(a->dst, 0, static_cast<size_t>(a->transfer_size));
    a->event = NewEvent(TransferDone(b.ready_ns, ConfigOf(b).host_link,
                                     static_cast<double>(a->transfer_size), ConfigOf(b)));
    return Status::Ok();
  });
}

// What only a buffer in real memory has.
PJRT_Error* Buffer_UnsafePointer(PJRT_Buffer_UnsafePointer_Args*) {
  return ToError(Unimplemented("PJRT_Buffer_UnsafePointer: an emulated device buffer has no "
                               "memory behind it (nothing is computed)"));
}
PJRT_Error* Buffer_OpaqueDeviceMemoryDataPointer(
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args*) {
  return ToError(Unimplemented("PJRT_Buffer_OpaqueDeviceMemoryDataPointer: an emulated device "
                               "buffer has no memory behind it (nothing is computed)"));
}
PJRT_Error* Buffer_IncreaseExternalReferenceCount(
    PJRT_Buffer_IncreaseExternalReferenceCount_Args*) {
  return ToError(Unimplemented("PJRT_Buffer_IncreaseExternalReferenceCount: an emulated device "
                               "buffer has no memory to share"));
}
PJRT_Error* Buffer_DecreaseExternalReferenceCount(
    PJRT_Buffer_DecreaseExternalReferenceCount_Args*) {
  return ToError(Unimplemented("PJRT_Buffer_DecreaseExternalReferenceCount: an emulated device "
                               "buffer has no memory to share"));
}

}  // namespace flexnpu::emulated
