// PJRT_Client_* and PJRT_Plugin_Attributes entry points.
#include <mutex>
#include <set>

#include "pjrt_flexnpu/c_api/entry_points.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/executable.h"

namespace flexnpu::c_api {
namespace {

constexpr char kPlatformName[] = "flexnpu";

struct ClientRegistry {
  std::mutex mu;
  std::set<VirtualClient*> clients;
  // The backend of the newest client answers PJRT_Plugin_Attributes (its StableHLO versions
  // are what the programs JAX sends must deserialize on).
  std::shared_ptr<const PhysicalBackend> newest_backend;
  // Set by FlexNpu_SetTracing: clients created while it is on record from the start.
  bool tracing = false;
};

ClientRegistry& Registry() {
  static auto* registry = new ClientRegistry();
  return *registry;
}

StatusOr<std::vector<NamedOption>> ToNamedOptions(const PJRT_NamedValue* values, size_t n) {
  std::vector<NamedOption> out;
  for (size_t i = 0; i < n; ++i) {
    const PJRT_NamedValue& v = values[i];
    std::string name(v.name, v.name_size);
    switch (v.type) {
      case PJRT_NamedValue_kString:
        out.push_back({name, std::string(v.string_value, v.value_size)});
        break;
      case PJRT_NamedValue_kInt64:
        out.push_back({name, v.int64_value});
        break;
      case PJRT_NamedValue_kFloat:
        out.push_back({name, static_cast<double>(v.float_value)});
        break;
      case PJRT_NamedValue_kBool:
        out.push_back({name, v.bool_value});
        break;
      default:
        return InvalidArgument("FlexNPU create option '" + name +
                               "' has an unsupported value type (int64 lists are not accepted)");
    }
  }
  return out;
}

}  // namespace

PJRT_Error* Client_Create(PJRT_Client_Create_Args* args) {
  return Guard("PJRT_Client_Create", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_Create, client);
    if (args->num_options > 0 && args->create_options == nullptr) {
      return InvalidArgument("PJRT_Client_Create: create_options is null");
    }
    auto named = ToNamedOptions(args->create_options, args->num_options);
    if (!named.ok()) return named.status();
    auto options = ParseOptions(*named, ProcessEnv());
    if (!options.ok()) return options.status();
    auto client = VirtualClient::Create(*options);
    if (!client.ok()) return client.status();
    VirtualClient* raw = client->release();
    {
      auto& registry = Registry();
      std::lock_guard<std::mutex> lock(registry.mu);
      registry.clients.insert(raw);
      registry.newest_backend = raw->shared_backend();
      if (registry.tracing) raw->trace()->Start();
    }
    args->client = ToHandle<PJRT_Client>(raw);
    return Status::Ok();
  });
}

PJRT_Error* Client_Destroy(PJRT_Client_Destroy_Args* args) {
  return Guard("PJRT_Client_Destroy", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_Destroy, client);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_Destroy, "client");
    {
      auto& registry = Registry();
      std::lock_guard<std::mutex> lock(registry.mu);
      registry.clients.erase(client);
    }
    delete client;
    return Status::Ok();
  });
}

PJRT_Error* Plugin_Attributes(PJRT_Plugin_Attributes_Args* args) {
  return Guard("PJRT_Plugin_Attributes", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Plugin_Attributes, num_attributes);
    args->attributes = nullptr;
    args->num_attributes = 0;
    std::shared_ptr<const PhysicalBackend> backend;
    {
      auto& registry = Registry();
      std::lock_guard<std::mutex> lock(registry.mu);
      backend = registry.newest_backend;
    }
    if (backend == nullptr || !backend->HasSlot(offsetof(PJRT_Api, PJRT_Plugin_Attributes))) {
      return Status::Ok();
    }
    PJRT_Plugin_Attributes_Args inner{};
    inner.struct_size = PJRT_Plugin_Attributes_Args_STRUCT_SIZE;
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(*backend, PJRT_Plugin_Attributes, &inner));
    args->attributes = inner.attributes;  // process lifetime: plugins are never unloaded
    args->num_attributes = inner.num_attributes;
    return Status::Ok();
  });
}

std::string StatsJsonOfAllClients() {
  auto& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mu);
  std::string out = "[";
  for (VirtualClient* c : registry.clients) {
    if (out.size() > 1) out += ",";
    out += c->StatsJson();
  }
  return out + "]";
}

std::string SetPolicyOfAllClients(const std::string& policy) {
  auto& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mu);
  // Validate against every client first, so a rejected policy changes nothing.
  for (VirtualClient* c : registry.clients) {
    auto spec = placement::ParsePolicy(policy, c->num_physical());
    if (!spec.ok()) return spec.status().message();
  }
  for (VirtualClient* c : registry.clients) {
    Status status = c->placer().SetPolicy(policy);
    if (!status.ok()) return status.message();
  }
  return "";
}

void SetTracingOfAllClients(bool on) {
  auto& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mu);
  registry.tracing = on;
  for (VirtualClient* c : registry.clients) {
    if (on) {
      c->trace()->Start();
    } else {
      c->trace()->Stop();
    }
  }
}

std::string TraceJsonOfClient(int index) {
  auto& registry = Registry();
  std::lock_guard<std::mutex> lock(registry.mu);
  int i = 0;
  for (VirtualClient* c : registry.clients) {
    if (i++ == index) {
      return c->trace()->ChromeJson(c->num_physical(),
                                    "FlexNPU (" + c->placer().policy() + ") over " +
                                        c->backend_platform());
    }
  }
  return "";
}

PJRT_Error* Client_PlatformName(PJRT_Client_PlatformName_Args* args) {
  return Guard("PJRT_Client_PlatformName", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_PlatformName, platform_name_size);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_PlatformName, "client");
    (void)client;
    args->platform_name = kPlatformName;
    args->platform_name_size = sizeof(kPlatformName) - 1;
    return Status::Ok();
  });
}

PJRT_Error* Client_ProcessIndex(PJRT_Client_ProcessIndex_Args* args) {
  return Guard("PJRT_Client_ProcessIndex", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_ProcessIndex, process_index);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_ProcessIndex, "client");
    (void)client;
    args->process_index = 0;
    return Status::Ok();
  });
}

PJRT_Error* Client_PlatformVersion(PJRT_Client_PlatformVersion_Args* args) {
  return Guard("PJRT_Client_PlatformVersion", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_PlatformVersion, platform_version_size);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_PlatformVersion, "client");
    args->platform_version = client->platform_version().c_str();
    args->platform_version_size = client->platform_version().size();
    return Status::Ok();
  });
}

PJRT_Error* Client_Devices(PJRT_Client_Devices_Args* args) {
  return Guard("PJRT_Client_Devices", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_Devices, num_devices);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_Devices, "client");
    args->devices = client->device_handles().data();
    args->num_devices = client->device_handles().size();
    return Status::Ok();
  });
}

PJRT_Error* Client_AddressableDevices(PJRT_Client_AddressableDevices_Args* args) {
  return Guard("PJRT_Client_AddressableDevices", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_AddressableDevices, num_addressable_devices);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_AddressableDevices,
                    "client");
    args->addressable_devices = client->device_handles().data();
    args->num_addressable_devices = client->device_handles().size();
    return Status::Ok();
  });
}

PJRT_Error* Client_LookupDevice(PJRT_Client_LookupDevice_Args* args) {
  return Guard("PJRT_Client_LookupDevice", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_LookupDevice, device);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_LookupDevice, "client");
    VirtualDevice* device = client->device(args->id);
    if (device == nullptr) {
      return InvalidArgument("PJRT_Client_LookupDevice: no virtual device with id " +
                             std::to_string(args->id) + " (this client has ids 0.." +
                             std::to_string(client->num_devices() - 1) + ")");
    }
    args->device = ToHandle<PJRT_Device>(device);
    return Status::Ok();
  });
}

PJRT_Error* Client_LookupAddressableDevice(PJRT_Client_LookupAddressableDevice_Args* args) {
  return Guard("PJRT_Client_LookupAddressableDevice", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_LookupAddressableDevice, addressable_device);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_LookupAddressableDevice,
                    "client");
    VirtualDevice* device = client->device(args->local_hardware_id);
    if (device == nullptr) {
      return InvalidArgument("PJRT_Client_LookupAddressableDevice: no virtual device with local "
                             "hardware id " + std::to_string(args->local_hardware_id));
    }
    args->addressable_device = ToHandle<PJRT_Device>(device);
    return Status::Ok();
  });
}

PJRT_Error* Client_AddressableMemories(PJRT_Client_AddressableMemories_Args* args) {
  return Guard("PJRT_Client_AddressableMemories", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_AddressableMemories, num_addressable_memories);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_AddressableMemories,
                    "client");
    args->addressable_memories = client->memory_handles().data();
    args->num_addressable_memories = client->memory_handles().size();
    return Status::Ok();
  });
}

PJRT_Error* Client_Compile(PJRT_Client_Compile_Args* args) {
  return Guard("PJRT_Client_Compile", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_Compile, executable);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_Compile, "client");
    if (args->program == nullptr || args->program->code == nullptr) {
      return InvalidArgument("PJRT_Client_Compile: program is null or empty");
    }
    if (args->compile_options == nullptr && args->compile_options_size > 0) {
      return InvalidArgument("PJRT_Client_Compile: compile_options is null");
    }
    auto exe = client->Compile(args->program,
                               std::string_view(args->compile_options, args->compile_options_size));
    if (!exe.ok()) return exe.status();
    args->executable = ToHandle<PJRT_LoadedExecutable>(*exe);
    return Status::Ok();
  });
}

PJRT_Error* Client_DefaultDeviceAssignment(PJRT_Client_DefaultDeviceAssignment_Args* args) {
  return Guard("PJRT_Client_DefaultDeviceAssignment", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_DefaultDeviceAssignment, default_assignment);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_DefaultDeviceAssignment,
                    "client");
    const int64_t n = static_cast<int64_t>(args->num_replicas) * args->num_partitions;
    if (args->default_assignment == nullptr || static_cast<int64_t>(args->default_assignment_size) < n) {
      return InvalidArgument("PJRT_Client_DefaultDeviceAssignment: output array too small");
    }
    return client->DefaultDeviceAssignment(args->num_replicas, args->num_partitions,
                                           args->default_assignment);
  });
}

PJRT_Error* Client_BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* args) {
  return Guard("PJRT_Client_BufferFromHostBuffer", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_BufferFromHostBuffer, buffer);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_BufferFromHostBuffer,
                    "client");
    VirtualMemory* memory = nullptr;
    if (args->memory != nullptr) {
      memory = FromHandle<VirtualMemory>(args->memory);
      if (memory == nullptr || memory->device()->client() != client) {
        return InvalidArgument("PJRT_Client_BufferFromHostBuffer: memory is not a memory of this "
                               "FlexNPU client");
      }
    } else if (args->device != nullptr) {
      VirtualDevice* device = FromHandle<VirtualDevice>(args->device);
      if (device == nullptr || device->client() != client) {
        return InvalidArgument("PJRT_Client_BufferFromHostBuffer: device is not a device of this "
                               "FlexNPU client");
      }
      memory = device->default_memory();
    } else {
      return InvalidArgument("PJRT_Client_BufferFromHostBuffer: neither device nor memory given");
    }
    if (args->num_dims > 0 && args->dims == nullptr) {
      return InvalidArgument("PJRT_Client_BufferFromHostBuffer: dims is null");
    }
    auto buffer = client->BufferFromHostBuffer(args, memory);
    if (!buffer.ok()) return buffer.status();
    args->buffer = ToHandle<PJRT_Buffer>(*buffer);
    return Status::Ok();
  });
}

PJRT_Error* Client_TopologyDescription(PJRT_Client_TopologyDescription_Args* args) {
  return Guard("PJRT_Client_TopologyDescription", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Client_TopologyDescription, topology);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Client_TopologyDescription,
                    "client");
    args->topology = ToHandle<PJRT_TopologyDescription>(client->topology());
    return Status::Ok();
  });
}

}  // namespace flexnpu::c_api
