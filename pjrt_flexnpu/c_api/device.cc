// PJRT_DeviceDescription_*, PJRT_Device_*, PJRT_Memory_* and PJRT_TopologyDescription_*
// entry points: all answered from FlexNPU's virtual objects.
#include "pjrt_flexnpu/c_api/entry_points.h"
#include "pjrt_flexnpu/runtime/client.h"

namespace flexnpu::c_api {

#define FLEXNPU_DESCRIPTION_STRING(Name, out, out_size, getter)                           \
  PJRT_Error* Name(PJRT_##Name##_Args* args) {                                             \
    return Guard("PJRT_" #Name, [&]() -> Status {                                          \
      FLEXNPU_CHECK_ARGS(PJRT_##Name, out_size);                                           \
      FLEXNPU_RESOLVE(d, DeviceDescription, args->device_description, PJRT_##Name,         \
                      "description");                                                      \
      args->out = d->getter().c_str();                                                     \
      args->out_size = d->getter().size();                                                 \
      return Status::Ok();                                                                 \
    });                                                                                    \
  }

FLEXNPU_DESCRIPTION_STRING(DeviceDescription_Kind, device_kind, device_kind_size, kind)
FLEXNPU_DESCRIPTION_STRING(DeviceDescription_DebugString, debug_string, debug_string_size,
                           debug_string)
FLEXNPU_DESCRIPTION_STRING(DeviceDescription_ToString, to_string, to_string_size, to_string)
#undef FLEXNPU_DESCRIPTION_STRING

PJRT_Error* DeviceDescription_Id(PJRT_DeviceDescription_Id_Args* args) {
  return Guard("PJRT_DeviceDescription_Id", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_DeviceDescription_Id, id);
    FLEXNPU_RESOLVE(d, DeviceDescription, args->device_description, PJRT_DeviceDescription_Id,
                    "description");
    args->id = d->id();
    return Status::Ok();
  });
}

PJRT_Error* DeviceDescription_ProcessIndex(PJRT_DeviceDescription_ProcessIndex_Args* args) {
  return Guard("PJRT_DeviceDescription_ProcessIndex", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_DeviceDescription_ProcessIndex, process_index);
    FLEXNPU_RESOLVE(d, DeviceDescription, args->device_description,
                    PJRT_DeviceDescription_ProcessIndex, "description");
    (void)d;
    args->process_index = 0;
    return Status::Ok();
  });
}

PJRT_Error* DeviceDescription_Attributes(PJRT_DeviceDescription_Attributes_Args* args) {
  return Guard("PJRT_DeviceDescription_Attributes", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_DeviceDescription_Attributes, attributes);
    FLEXNPU_RESOLVE(d, DeviceDescription, args->device_description,
                    PJRT_DeviceDescription_Attributes, "description");
    args->attributes = d->attributes().data();
    args->num_attributes = d->attributes().size();
    return Status::Ok();
  });
}

PJRT_Error* Device_GetDescription(PJRT_Device_GetDescription_Args* args) {
  return Guard("PJRT_Device_GetDescription", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Device_GetDescription, device_description);
    FLEXNPU_RESOLVE(device, VirtualDevice, args->device, PJRT_Device_GetDescription, "device");
    args->device_description = ToHandle<PJRT_DeviceDescription>(device->description());
    return Status::Ok();
  });
}

PJRT_Error* Device_IsAddressable(PJRT_Device_IsAddressable_Args* args) {
  return Guard("PJRT_Device_IsAddressable", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Device_IsAddressable, is_addressable);
    FLEXNPU_RESOLVE(device, VirtualDevice, args->device, PJRT_Device_IsAddressable, "device");
    (void)device;
    args->is_addressable = true;
    return Status::Ok();
  });
}

PJRT_Error* Device_LocalHardwareId(PJRT_Device_LocalHardwareId_Args* args) {
  return Guard("PJRT_Device_LocalHardwareId", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Device_LocalHardwareId, local_hardware_id);
    FLEXNPU_RESOLVE(device, VirtualDevice, args->device, PJRT_Device_LocalHardwareId, "device");
    args->local_hardware_id = device->index();
    return Status::Ok();
  });
}

PJRT_Error* Device_AddressableMemories(PJRT_Device_AddressableMemories_Args* args) {
  return Guard("PJRT_Device_AddressableMemories", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Device_AddressableMemories, num_memories);
    FLEXNPU_RESOLVE(device, VirtualDevice, args->device, PJRT_Device_AddressableMemories,
                    "device");
    args->memories = device->memory_handles().data();
    args->num_memories = device->memory_handles().size();
    return Status::Ok();
  });
}

PJRT_Error* Device_DefaultMemory(PJRT_Device_DefaultMemory_Args* args) {
  return Guard("PJRT_Device_DefaultMemory", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Device_DefaultMemory, memory);
    FLEXNPU_RESOLVE(device, VirtualDevice, args->device, PJRT_Device_DefaultMemory, "device");
    args->memory = ToHandle<PJRT_Memory>(device->default_memory());
    return Status::Ok();
  });
}

PJRT_Error* Device_MemoryStats(PJRT_Device_MemoryStats_Args* args) {
  return Guard("PJRT_Device_MemoryStats", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Device_MemoryStats, largest_alloc_size_is_set);
    FLEXNPU_RESOLVE(device, VirtualDevice, args->device, PJRT_Device_MemoryStats, "device");
    // Zero what the caller's struct holds, then fill what FlexNPU tracks: the bytes of the
    // buffers alive on this virtual device.
    const size_t header = offsetof(PJRT_Device_MemoryStats_Args, bytes_in_use);
    const size_t size = std::min(args->struct_size, sizeof(PJRT_Device_MemoryStats_Args));
    std::memset(reinterpret_cast<char*>(args) + header, 0, size - header);
    const MemoryStats& stats = device->stats();
    args->bytes_in_use = stats.bytes_in_use();
    args->peak_bytes_in_use = stats.peak_bytes_in_use();
    args->peak_bytes_in_use_is_set = true;
    args->num_allocs = stats.num_allocs();
    args->num_allocs_is_set = true;
    args->largest_alloc_size = stats.largest_alloc_size();
    args->largest_alloc_size_is_set = true;
    // The device's share of its physical device's memory. Written only into callers whose
    // struct has the fields (older headers end earlier).
    const int64_t limit = device->bytes_limit();
    if (limit > 0) {
      if (FLEXNPU_HAS_FIELD(PJRT_Device_MemoryStats, bytes_limit_is_set)) {
        args->bytes_limit = limit;
        args->bytes_limit_is_set = true;
      }
      if (FLEXNPU_HAS_FIELD(PJRT_Device_MemoryStats, bytes_reservable_limit_is_set)) {
        args->bytes_reservable_limit = limit;
        args->bytes_reservable_limit_is_set = true;
      }
    }
    return Status::Ok();
  });
}

PJRT_Error* Memory_Id(PJRT_Memory_Id_Args* args) {
  return Guard("PJRT_Memory_Id", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Memory_Id, id);
    FLEXNPU_RESOLVE(memory, VirtualMemory, args->memory, PJRT_Memory_Id, "memory");
    args->id = memory->id();
    return Status::Ok();
  });
}

PJRT_Error* Memory_Kind(PJRT_Memory_Kind_Args* args) {
  return Guard("PJRT_Memory_Kind", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Memory_Kind, kind_size);
    FLEXNPU_RESOLVE(memory, VirtualMemory, args->memory, PJRT_Memory_Kind, "memory");
    args->kind = memory->kind().c_str();
    args->kind_size = memory->kind().size();
    return Status::Ok();
  });
}

PJRT_Error* Memory_Kind_Id(PJRT_Memory_Kind_Id_Args* args) {
  return Guard("PJRT_Memory_Kind_Id", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Memory_Kind_Id, kind_id);
    FLEXNPU_RESOLVE(memory, VirtualMemory, args->memory, PJRT_Memory_Kind_Id, "memory");
    args->kind_id = memory->kind_id();
    return Status::Ok();
  });
}

PJRT_Error* Memory_DebugString(PJRT_Memory_DebugString_Args* args) {
  return Guard("PJRT_Memory_DebugString", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Memory_DebugString, debug_string_size);
    FLEXNPU_RESOLVE(memory, VirtualMemory, args->memory, PJRT_Memory_DebugString, "memory");
    args->debug_string = memory->debug_string().c_str();
    args->debug_string_size = memory->debug_string().size();
    return Status::Ok();
  });
}

PJRT_Error* Memory_ToString(PJRT_Memory_ToString_Args* args) {
  return Guard("PJRT_Memory_ToString", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Memory_ToString, to_string_size);
    FLEXNPU_RESOLVE(memory, VirtualMemory, args->memory, PJRT_Memory_ToString, "memory");
    args->to_string = memory->to_string().c_str();
    args->to_string_size = memory->to_string().size();
    return Status::Ok();
  });
}

PJRT_Error* Memory_AddressableByDevices(PJRT_Memory_AddressableByDevices_Args* args) {
  return Guard("PJRT_Memory_AddressableByDevices", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Memory_AddressableByDevices, num_devices);
    FLEXNPU_RESOLVE(memory, VirtualMemory, args->memory, PJRT_Memory_AddressableByDevices,
                    "memory");
    args->devices = memory->device_handle();
    args->num_devices = 1;
    return Status::Ok();
  });
}

PJRT_Error* TopologyDescription_PlatformName(PJRT_TopologyDescription_PlatformName_Args* args) {
  return Guard("PJRT_TopologyDescription_PlatformName", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_TopologyDescription_PlatformName, platform_name_size);
    FLEXNPU_RESOLVE(topology, Topology, const_cast<PJRT_TopologyDescription*>(args->topology),
                    PJRT_TopologyDescription_PlatformName, "topology");
    const std::string& name = topology->client()->platform_name();
    args->platform_name = name.c_str();
    args->platform_name_size = name.size();
    return Status::Ok();
  });
}

PJRT_Error* TopologyDescription_PlatformVersion(
    PJRT_TopologyDescription_PlatformVersion_Args* args) {
  return Guard("PJRT_TopologyDescription_PlatformVersion", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_TopologyDescription_PlatformVersion, platform_version_size);
    FLEXNPU_RESOLVE(topology, Topology, args->topology, PJRT_TopologyDescription_PlatformVersion,
                    "topology");
    const std::string& version = topology->client()->platform_version();
    args->platform_version = version.c_str();
    args->platform_version_size = version.size();
    return Status::Ok();
  });
}

PJRT_Error* TopologyDescription_GetDeviceDescriptions(
    PJRT_TopologyDescription_GetDeviceDescriptions_Args* args) {
  return Guard("PJRT_TopologyDescription_GetDeviceDescriptions", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_TopologyDescription_GetDeviceDescriptions, num_descriptions);
    FLEXNPU_RESOLVE(topology, Topology, const_cast<PJRT_TopologyDescription*>(args->topology),
                    PJRT_TopologyDescription_GetDeviceDescriptions, "topology");
    args->descriptions = topology->descriptions().data();
    args->num_descriptions = topology->descriptions().size();
    return Status::Ok();
  });
}

PJRT_Error* TopologyDescription_Attributes(PJRT_TopologyDescription_Attributes_Args* args) {
  return Guard("PJRT_TopologyDescription_Attributes", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_TopologyDescription_Attributes, num_attributes);
    FLEXNPU_RESOLVE(topology, Topology, args->topology, PJRT_TopologyDescription_Attributes,
                    "topology");
    (void)topology;
    args->attributes = nullptr;
    args->num_attributes = 0;
    return Status::Ok();
  });
}

namespace {
void DeleteSerializedTopology(PJRT_SerializedTopology* serialized) {
  delete reinterpret_cast<std::string*>(serialized);
}
}  // namespace

PJRT_Error* TopologyDescription_Serialize(PJRT_TopologyDescription_Serialize_Args* args) {
  return Guard("PJRT_TopologyDescription_Serialize", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_TopologyDescription_Serialize, serialized_topology_deleter);
    FLEXNPU_RESOLVE(topology, Topology, args->topology, PJRT_TopologyDescription_Serialize,
                    "topology");
    auto* owned = new std::string(topology->Serialize());
    args->serialized_bytes = owned->data();
    args->serialized_bytes_size = owned->size();
    args->serialized_topology = reinterpret_cast<PJRT_SerializedTopology*>(owned);
    args->serialized_topology_deleter = DeleteSerializedTopology;
    return Status::Ok();
  });
}

PJRT_Error* TopologyDescription_Destroy(PJRT_TopologyDescription_Destroy_Args* args) {
  return Guard("PJRT_TopologyDescription_Destroy", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_TopologyDescription_Destroy, topology);
    FLEXNPU_RESOLVE(topology, Topology, args->topology, PJRT_TopologyDescription_Destroy,
                    "topology");
    (void)topology;  // owned by its client: nothing to free
    return Status::Ok();
  });
}

}  // namespace flexnpu::c_api
