// The client (its CPU compiler client, N emulated devices of the preset), its devices with
// their memory accounts and modelled time, and their memories.
#include <cstddef>
#include <cstdio>
#include <cstring>

#include "pjrt_flexnpu/backend/emulated/entry_points.h"
#include "pjrt_flexnpu/backend/emulated/handles.h"

namespace flexnpu::emulated {
namespace {

// The platform JAX lowers for, so programs compile with the CPU compiler that shapes them
// (LAPACK and callback custom calls included); the device kind names the preset.
constexpr char kPlatformName[] = "cpu";
constexpr char kMemoryKind[] = "device";


const EmulatedDevice& DeviceOf(PJRT_DeviceDescription* description) {
  return *reinterpret_cast<const EmulatedDevice*>(description);
}

}  // namespace

PJRT_Error* Client_Create(PJRT_Client_Create_Args* a) {
  return Run([&]() -> Status {
    FLEXNPU_ASSIGN_OR_RETURN(const xla_passes::DeviceSpec preset, ProcessPreset());
    FLEXNPU_ASSIGN_OR_RETURN(Config config, ParseConfig(preset, a->create_options, a->num_options));
    auto client = std::make_unique<EmulatedClient>();
    FLEXNPU_ASSIGN_OR_RETURN(client->cpu, CpuCompiler(config.cpu_plugin_path));
    const PhysicalBackend& cpu = *client->cpu;
    // As many CPU devices as emulated ones, with the same ids: device assignments compile.
    const PJRT_NamedValue count = Int64NamedValue("cpu_device_count", config.device_count);
    FLEXNPU_ASSIGN_OR_RETURN(client->cpu_client, cpu.CreateClient(&count, 1));
    FLEXNPU_ASSIGN_OR_RETURN(const InnerSpan<PJRT_Device*> cpu_devices,
                             cpu.AddressableDevices(client->cpu_client.get()));
    for (size_t i = 0; i < cpu_devices.size; ++i) {
      FLEXNPU_ASSIGN_OR_RETURN(PJRT_DeviceDescription* description,
                               cpu.Description(cpu_devices[i]));
      FLEXNPU_ASSIGN_OR_RETURN(const int id, cpu.DescriptionId(description));
      if (id != static_cast<int>(i)) {
        return Internal("emulated backend: the CPU compiler's device " + std::to_string(i) +
                        " has id " + std::to_string(id) + "; emulated device ids must match");
      }
    }
    if (cpu_devices.size != static_cast<size_t>(config.device_count)) {
      return Internal("emulated backend: the CPU compiler made " +
                      std::to_string(cpu_devices.size) + " devices for device_count=" +
                      std::to_string(config.device_count));
    }
    char scale[32];
    std::snprintf(scale, sizeof(scale), "%g", config.time_scale);
    client->platform_version = "emulated " + preset.name + " x" +
                               std::to_string(config.device_count) + ", time_scale " + scale +
                               (config.co_run ? ", co-run" : "") +
                               "; programs compiled by the XLA CPU plugin, never run";
    for (int64_t i = 0; i < config.device_count; ++i) {
      auto device = std::make_shared<EmulatedDevice>();
      device->client = client.get();
      device->id = static_cast<int>(i);
      device->kind = preset.name + " (emulated)";
      device->debug = "emulated " + preset.name + ":" + std::to_string(i);
      device->limit = static_cast<int64_t>(preset.memory_bytes);
      device->memory.device = device.get();
      device->memory.id = static_cast<int>(i);
      device->memory.debug = device->debug + " " + kMemoryKind + " memory";
      device->memory.device_handle = To<PJRT_Device>(device.get());
      device->memory_handle = To<PJRT_Memory>(&device->memory);
      client->device_handles.push_back(To<PJRT_Device>(device.get()));
      client->memory_handles.push_back(device->memory_handle);
      client->devices.push_back(std::move(device));
    }
    client->config = std::move(config);
    a->client = To<PJRT_Client>(client.release());
    return Status::Ok();
  });
}

PJRT_Error* Client_Destroy(PJRT_Client_Destroy_Args* a) {
  delete From<EmulatedClient>(a->client);
  return nullptr;
}
PJRT_Error* Client_PlatformName(PJRT_Client_PlatformName_Args* a) {
  a->platform_name = kPlatformName;
  a->platform_name_size = sizeof(kPlatformName) - 1;
  return nullptr;
}
PJRT_Error* Client_PlatformVersion(PJRT_Client_PlatformVersion_Args* a) {
  return own_api::ClientPlatformVersion<EmulatedClient>(a);
}
PJRT_Error* Client_ProcessIndex(PJRT_Client_ProcessIndex_Args* a) {
  return own_api::ClientProcessIndex(a);
}
PJRT_Error* Client_Devices(PJRT_Client_Devices_Args* a) {
  return own_api::ClientDevices<EmulatedClient>(a);
}
PJRT_Error* Client_AddressableDevices(PJRT_Client_AddressableDevices_Args* a) {
  return own_api::ClientAddressableDevices<EmulatedClient>(a);
}
PJRT_Error* Client_LookupDevice(PJRT_Client_LookupDevice_Args* a) {
  const EmulatedClient* c = From<EmulatedClient>(a->client);
  auto device = c->DeviceWithId(a->id);
  if (device == nullptr) {
    return ToError(InvalidArgument("emulated backend: no device with id " + std::to_string(a->id)));
  }
  a->device = To<PJRT_Device>(device.get());
  return nullptr;
}
PJRT_Error* Client_LookupAddressableDevice(PJRT_Client_LookupAddressableDevice_Args* a) {
  const EmulatedClient* c = From<EmulatedClient>(a->client);
  auto device = c->DeviceWithId(a->local_hardware_id);
  if (device == nullptr) {
    return ToError(InvalidArgument("emulated backend: no device with local hardware id " +
                                   std::to_string(a->local_hardware_id)));
  }
  a->addressable_device = To<PJRT_Device>(device.get());
  return nullptr;
}
PJRT_Error* Client_AddressableMemories(PJRT_Client_AddressableMemories_Args* a) {
  return own_api::ClientAddressableMemories<EmulatedClient>(a);
}

// Device descriptions are the devices themselves.
PJRT_Error* DeviceDescription_Id(PJRT_DeviceDescription_Id_Args* a) {
  a->id = DeviceOf(a->device_description).id;
  return nullptr;
}
PJRT_Error* DeviceDescription_ProcessIndex(PJRT_DeviceDescription_ProcessIndex_Args* a) {
  a->process_index = 0;
  return nullptr;
}
PJRT_Error* DeviceDescription_Attributes(PJRT_DeviceDescription_Attributes_Args* a) {
  a->attributes = nullptr;
  a->num_attributes = 0;
  return nullptr;
}
PJRT_Error* DeviceDescription_Kind(PJRT_DeviceDescription_Kind_Args* a) {
  const EmulatedDevice& d = DeviceOf(a->device_description);
  a->device_kind = d.kind.data();
  a->device_kind_size = d.kind.size();
  return nullptr;
}
PJRT_Error* DeviceDescription_DebugString(PJRT_DeviceDescription_DebugString_Args* a) {
  const EmulatedDevice& d = DeviceOf(a->device_description);
  a->debug_string = d.debug.data();
  a->debug_string_size = d.debug.size();
  return nullptr;
}
PJRT_Error* DeviceDescription_ToString(PJRT_DeviceDescription_ToString_Args* a) {
  const EmulatedDevice& d = DeviceOf(a->device_description);
  a->to_string = d.debug.data();
  a->to_string_size = d.debug.size();
  return nullptr;
}
PJRT_Error* Device_GetDescription(PJRT_Device_GetDescription_Args* a) {
  a->device_description = reinterpret_cast<PJRT_DeviceDescription*>(a->device);
  return nullptr;
}
PJRT_Error* Device_IsAddressable(PJRT_Device_IsAddressable_Args* a) {
  a->is_addressable = true;
  return nullptr;
}
PJRT_Error* Device_LocalHardwareId(PJRT_Device_LocalHardwareId_Args* a) {
  a->local_hardware_id = From<EmulatedDevice>(a->device)->id;
  return nullptr;
}
PJRT_Error* Device_AddressableMemories(PJRT_Device_AddressableMemories_Args* a) {
  EmulatedDevice* d = From<EmulatedDevice>(a->device);
  a->memories = &d->memory_handle;
  a->num_memories = 1;
  return nullptr;
}
PJRT_Error* Device_DefaultMemory(PJRT_Device_DefaultMemory_Args* a) {
  a->memory = From<EmulatedDevice>(a->device)->memory_handle;
  return nullptr;
}
PJRT_Error* Device_MemoryStats(PJRT_Device_MemoryStats_Args* a) {
  const EmulatedDevice& d = *From<EmulatedDevice>(a->device);
  const size_t header = offsetof(PJRT_Device_MemoryStats_Args, bytes_in_use);
  const size_t size = std::min(a->struct_size, sizeof(PJRT_Device_MemoryStats_Args));
  if (size > header) std::memset(reinterpret_cast<char*>(a) + header, 0, size - header);
  std::lock_guard<std::mutex> lock(d.mu);
  a->bytes_in_use = d.in_use;
  a->peak_bytes_in_use = d.peak;
  a->peak_bytes_in_use_is_set = true;
  a->num_allocs = d.num_allocs;
  a->num_allocs_is_set = true;
  a->largest_alloc_size = d.largest_alloc;
  a->largest_alloc_size_is_set = true;
  a->bytes_limit = d.limit;
  a->bytes_limit_is_set = true;
  if (a->struct_size >= offsetof(PJRT_Device_MemoryStats_Args, bytes_reservable_limit_is_set) +
                            sizeof(bool)) {
    a->bytes_reservable_limit = d.limit;
    a->bytes_reservable_limit_is_set = true;
  }
  return nullptr;
}

PJRT_Error* DeviceTime(PJRT_Device* device, ModelledDeviceTime* out) {
  const EmulatedDevice& d = *From<EmulatedDevice>(device);
  std::lock_guard<std::mutex> lock(d.mu);
  out->busy_s = d.busy_s;
  out->executions = d.executions;
  out->time_scale = d.client->config.time_scale;
  out->co_run = d.client->config.co_run;
  return nullptr;
}

PJRT_Error* Memory_Id(PJRT_Memory_Id_Args* a) {
  a->id = From<EmulatedMemory>(a->memory)->id;
  return nullptr;
}
PJRT_Error* Memory_Kind(PJRT_Memory_Kind_Args* a) {
  a->kind = kMemoryKind;
  a->kind_size = sizeof(kMemoryKind) - 1;
  return nullptr;
}
PJRT_Error* Memory_Kind_Id(PJRT_Memory_Kind_Id_Args* a) {
  a->kind_id = 0;
  return nullptr;
}
PJRT_Error* Memory_DebugString(PJRT_Memory_DebugString_Args* a) {
  const EmulatedMemory* m = From<EmulatedMemory>(a->memory);
  a->debug_string = m->debug.data();
  a->debug_string_size = m->debug.size();
  return nullptr;
}
PJRT_Error* Memory_ToString(PJRT_Memory_ToString_Args* a) {
  const EmulatedMemory* m = From<EmulatedMemory>(a->memory);
  a->to_string = m->debug.data();
  a->to_string_size = m->debug.size();
  return nullptr;
}
PJRT_Error* Memory_AddressableByDevices(PJRT_Memory_AddressableByDevices_Args* a) {
  EmulatedMemory* m = From<EmulatedMemory>(a->memory);
  a->devices = &m->device_handle;
  a->num_devices = 1;
  return nullptr;
}

}  // namespace flexnpu::emulated
