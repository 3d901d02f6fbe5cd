// PJRT_Buffer_* entry points. Metadata comes from the virtual buffer; data operations go to
// the physical buffer behind it.
#include "pjrt_flexnpu/c_api/entry_points.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/event.h"

namespace flexnpu::c_api {
namespace {

// Forwards a call whose only handle is `buffer` to the physical buffer.
#define FLEXNPU_FORWARD_BUFFER(Name, handle_field, last_field)                          \
  PJRT_Error* Buffer_##Name(PJRT_Buffer_##Name##_Args* args) {                          \
    return Guard("PJRT_Buffer_" #Name, [&]() -> Status {                                \
      FLEXNPU_CHECK_ARGS(PJRT_Buffer_##Name, last_field);                               \
      FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->handle_field, PJRT_Buffer_##Name,    \
                      "buffer");                                                        \
      std::shared_ptr<PhysicalBuffer> physical = buffer->physical();                    \
      return FLEXNPU_FORWARD(buffer->client()->backend(), PJRT_Buffer_##Name,           \
                             handle_field, physical->handle.get());                    \
    });                                                                                 \
  }

// Replaces an inner event in `slot` by a FlexNPU event.
void WrapEvent(const PhysicalBackend& backend, PJRT_Event** slot) {
  if (*slot != nullptr) *slot = ToHandle<PJRT_Event>(Event::Wrap(backend, *slot));
}

}  // namespace

// Only for results that are plain values: anything returned by pointer into the inner buffer
// goes through VirtualBuffer, which keeps what it points into alive.
FLEXNPU_FORWARD_BUFFER(IsOnCpu, buffer, is_on_cpu)
#undef FLEXNPU_FORWARD_BUFFER

PJRT_Error* Buffer_UnpaddedDimensions(PJRT_Buffer_UnpaddedDimensions_Args* args) {
  return Guard("PJRT_Buffer_UnpaddedDimensions", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_UnpaddedDimensions, num_dims);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_UnpaddedDimensions,
                    "buffer");
    return buffer->UnpaddedDimensions(&args->unpadded_dims, &args->num_dims);
  });
}

PJRT_Error* Buffer_DynamicDimensionIndices(PJRT_Buffer_DynamicDimensionIndices_Args* args) {
  return Guard("PJRT_Buffer_DynamicDimensionIndices", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_DynamicDimensionIndices, num_dynamic_dims);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_DynamicDimensionIndices,
                    "buffer");
    return buffer->DynamicDimensionIndices(&args->dynamic_dim_indices, &args->num_dynamic_dims);
  });
}

PJRT_Error* Buffer_GetMemoryLayout(PJRT_Buffer_GetMemoryLayout_Args* args) {
  return Guard("PJRT_Buffer_GetMemoryLayout", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_GetMemoryLayout, layout);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_GetMemoryLayout, "buffer");
    return buffer->MemoryLayout(&args->layout);
  });
}

PJRT_Error* Buffer_UnsafePointer(PJRT_Buffer_UnsafePointer_Args* args) {
  return Guard("PJRT_Buffer_UnsafePointer", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_UnsafePointer, buffer_pointer);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_UnsafePointer, "buffer");
    auto pointer = buffer->UnsafePointer();
    if (!pointer.ok()) return pointer.status();
    args->buffer_pointer = *pointer;
    return Status::Ok();
  });
}

PJRT_Error* Buffer_OpaqueDeviceMemoryDataPointer(
    PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args* args) {
  return Guard("PJRT_Buffer_OpaqueDeviceMemoryDataPointer", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_OpaqueDeviceMemoryDataPointer, device_memory_ptr);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer,
                    PJRT_Buffer_OpaqueDeviceMemoryDataPointer, "buffer");
    auto pointer = buffer->OpaqueDeviceMemoryDataPointer();
    if (!pointer.ok()) return pointer.status();
    args->device_memory_ptr = *pointer;
    return Status::Ok();
  });
}

PJRT_Error* Buffer_Destroy(PJRT_Buffer_Destroy_Args* args) {
  return Guard("PJRT_Buffer_Destroy", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_Destroy, buffer);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_Destroy, "buffer");
    delete buffer;
    return Status::Ok();
  });
}

PJRT_Error* Buffer_ElementType(PJRT_Buffer_ElementType_Args* args) {
  return Guard("PJRT_Buffer_ElementType", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_ElementType, type);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_ElementType, "buffer");
    args->type = buffer->element_type();
    return Status::Ok();
  });
}

PJRT_Error* Buffer_Dimensions(PJRT_Buffer_Dimensions_Args* args) {
  return Guard("PJRT_Buffer_Dimensions", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_Dimensions, num_dims);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_Dimensions, "buffer");
    args->dims = buffer->dims().data();
    args->num_dims = buffer->dims().size();
    return Status::Ok();
  });
}

PJRT_Error* Buffer_OnDeviceSizeInBytes(PJRT_Buffer_OnDeviceSizeInBytes_Args* args) {
  return Guard("PJRT_Buffer_OnDeviceSizeInBytes", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_OnDeviceSizeInBytes, on_device_size_in_bytes);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_OnDeviceSizeInBytes,
                    "buffer");
    args->on_device_size_in_bytes = static_cast<size_t>(buffer->on_device_size());
    return Status::Ok();
  });
}

PJRT_Error* Buffer_Device(PJRT_Buffer_Device_Args* args) {
  return Guard("PJRT_Buffer_Device", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_Device, device);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_Device, "buffer");
    args->device = ToHandle<PJRT_Device>(buffer->device());
    return Status::Ok();
  });
}

PJRT_Error* Buffer_Memory(PJRT_Buffer_Memory_Args* args) {
  return Guard("PJRT_Buffer_Memory", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_Memory, memory);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_Memory, "buffer");
    args->memory = ToHandle<PJRT_Memory>(buffer->memory());
    return Status::Ok();
  });
}

PJRT_Error* Buffer_Delete(PJRT_Buffer_Delete_Args* args) {
  return Guard("PJRT_Buffer_Delete", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_Delete, buffer);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_Delete, "buffer");
    return buffer->Delete();
  });
}

PJRT_Error* Buffer_IsDeleted(PJRT_Buffer_IsDeleted_Args* args) {
  return Guard("PJRT_Buffer_IsDeleted", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_IsDeleted, is_deleted);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_IsDeleted, "buffer");
    auto deleted = buffer->IsDeleted();
    if (!deleted.ok()) return deleted.status();
    args->is_deleted = *deleted;
    return Status::Ok();
  });
}

PJRT_Error* Buffer_CopyToDevice(PJRT_Buffer_CopyToDevice_Args* args) {
  return Guard("PJRT_Buffer_CopyToDevice", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_CopyToDevice, dst_buffer);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_CopyToDevice, "buffer");
    VirtualDevice* device = FromHandle<VirtualDevice>(args->dst_device);
    if (device == nullptr || device->client() != buffer->client()) {
      return InvalidArgument("PJRT_Buffer_CopyToDevice: dst_device is not a device of the "
                             "buffer's FlexNPU client");
    }
    auto copy = buffer->client()->CopyBuffer(buffer, device->default_memory());
    if (!copy.ok()) return copy.status();
    args->dst_buffer = ToHandle<PJRT_Buffer>(*copy);
    return Status::Ok();
  });
}

PJRT_Error* Buffer_CopyToMemory(PJRT_Buffer_CopyToMemory_Args* args) {
  return Guard("PJRT_Buffer_CopyToMemory", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_CopyToMemory, dst_buffer);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_CopyToMemory, "buffer");
    VirtualMemory* memory = FromHandle<VirtualMemory>(args->dst_memory);
    if (memory == nullptr || memory->device()->client() != buffer->client()) {
      return InvalidArgument("PJRT_Buffer_CopyToMemory: dst_memory is not a memory of the "
                             "buffer's FlexNPU client");
    }
    auto copy = buffer->client()->CopyBuffer(buffer, memory);
    if (!copy.ok()) return copy.status();
    args->dst_buffer = ToHandle<PJRT_Buffer>(*copy);
    return Status::Ok();
  });
}

PJRT_Error* Buffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* args) {
  return Guard("PJRT_Buffer_ToHostBuffer", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_ToHostBuffer, event);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->src, PJRT_Buffer_ToHostBuffer, "src buffer");
    std::shared_ptr<PhysicalBuffer> physical = buffer->physical();
    const PhysicalBackend& b = buffer->client()->backend();
    FLEXNPU_RETURN_IF_ERROR(
        FLEXNPU_FORWARD(b, PJRT_Buffer_ToHostBuffer, src, physical->handle.get()));
    WrapEvent(b, &args->event);
    return Status::Ok();
  });
}

PJRT_Error* Buffer_CopyRawToHost(PJRT_Buffer_CopyRawToHost_Args* args) {
  return Guard("PJRT_Buffer_CopyRawToHost", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_CopyRawToHost, event);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_CopyRawToHost, "buffer");
    std::shared_ptr<PhysicalBuffer> physical = buffer->physical();
    const PhysicalBackend& b = buffer->client()->backend();
    FLEXNPU_RETURN_IF_ERROR(
        FLEXNPU_FORWARD(b, PJRT_Buffer_CopyRawToHost, buffer, physical->handle.get()));
    WrapEvent(b, &args->event);
    return Status::Ok();
  });
}

PJRT_Error* Buffer_ReadyEvent(PJRT_Buffer_ReadyEvent_Args* args) {
  return Guard("PJRT_Buffer_ReadyEvent", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_ReadyEvent, event);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer, PJRT_Buffer_ReadyEvent, "buffer");
    std::shared_ptr<PhysicalBuffer> physical = buffer->physical();
    const PhysicalBackend& b = buffer->client()->backend();
    // Typed (no copy of the caller's struct each way): JAX asks this of every output.
    auto event = b.ReadyEvent(physical->handle.get());
    if (!event.ok()) return event.status();
    args->event = event->release();
    WrapEvent(b, &args->event);
    return Status::Ok();
  });
}

PJRT_Error* Buffer_IncreaseExternalReferenceCount(
    PJRT_Buffer_IncreaseExternalReferenceCount_Args* args) {
  return Guard("PJRT_Buffer_IncreaseExternalReferenceCount", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_IncreaseExternalReferenceCount, buffer);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer,
                    PJRT_Buffer_IncreaseExternalReferenceCount, "buffer");
    return buffer->IncreaseExternalReferenceCount();
  });
}

PJRT_Error* Buffer_DecreaseExternalReferenceCount(
    PJRT_Buffer_DecreaseExternalReferenceCount_Args* args) {
  return Guard("PJRT_Buffer_DecreaseExternalReferenceCount", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Buffer_DecreaseExternalReferenceCount, buffer);
    FLEXNPU_RESOLVE(buffer, VirtualBuffer, args->buffer,
                    PJRT_Buffer_DecreaseExternalReferenceCount, "buffer");
    return buffer->DecreaseExternalReferenceCount();
  });
}

}  // namespace flexnpu::c_api
