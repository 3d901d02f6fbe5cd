// PJRT_Client_* and PJRT_Plugin_Attributes entry points.
#include <mutex>
#include <set>

#include "pjrt_flexnpu/c_api/entry_points.h"
#include "pjrt_flexnpu/c_api/extensions.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/executable.h"

namespace flexnpu::c_api {
namespace {

struct ClientRegistry {
  std::mutex mu;
  std::set<VirtualClient*> clients;
  // The backend of the first client, for PJRT_Plugin_Attributes.
  std::shared_ptr<const PhysicalBackend> first_backend;
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
    const std::string which = "PJRT_Client_Create: create option " + std::to_string(i);
    if (v.struct_size < offsetof(PJRT_NamedValue, value_size) + sizeof(v.value_size)) {
      return InvalidArgument(which + " has struct_size " + std::to_string(v.struct_size) +
                             ", too small for a PJRT_NamedValue");
    }
    if (v.name == nullptr || v.name_size == 0) {
      return InvalidArgument(which + " has no name (null or empty)");
    }
    std::string name(v.name, v.name_size);
    if (v.type == PJRT_NamedValue_kString && v.string_value == nullptr && v.value_size > 0) {
      return InvalidArgument("FlexNPU create option '" + name + "' has a null string value");
    }
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
      if (registry.first_backend == nullptr) registry.first_backend = raw->shared_backend();
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

namespace {

// What PJRT_Plugin_Attributes answers: FlexNPU's own attributes, plus the physical backend's
// program-format versions (the programs JAX sends are deserialized by the backend). Nothing
// else of the backend's is advertised: FlexNPU offers its own set of features.
struct PluginAttributes {
  std::mutex mu;
  bool from_backend = false;
  std::vector<PJRT_NamedValue> values;
  std::vector<std::string> strings;
  std::vector<std::vector<int64_t>> lists;
};

constexpr const char* kForwardedAttributes[] = {"xla_version", "stablehlo_current_version",
                                                "stablehlo_minimum_version"};

// The backend whose versions count: the first client's, else the one the environment names.
std::shared_ptr<const PhysicalBackend> AttributesBackend() {
  {
    auto& registry = Registry();
    std::lock_guard<std::mutex> lock(registry.mu);
    if (registry.first_backend != nullptr) return registry.first_backend;
  }
  return EnvironmentBackend();
}

// Fills `attributes` once from `backend` (never changed afterwards: callers keep pointers).
Status FillAttributes(PluginAttributes& attributes, const PhysicalBackend* backend) {
  if (backend == nullptr || !backend->HasSlot(offsetof(PJRT_Api, PJRT_Plugin_Attributes))) {
    return Status::Ok();
  }
  FLEXNPU_ASSIGN_OR_RETURN(const InnerSpan<PJRT_NamedValue> inner, backend->PluginAttributes());
  std::vector<const PJRT_NamedValue*> kept;
  for (const PJRT_NamedValue& v : inner) {
    if (v.name == nullptr) continue;
    const std::string name(v.name, v.name_size);
    for (const char* allowed : kForwardedAttributes) {
      if (name == allowed) kept.push_back(&v);
    }
  }
  // Reserve first: values point into these vectors.
  attributes.strings.reserve(kept.size() * 2);
  attributes.lists.reserve(kept.size());
  for (const PJRT_NamedValue* v : kept) {
    PJRT_NamedValue out{};
    out.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    attributes.strings.emplace_back(v->name, v->name_size);
    out.name = attributes.strings.back().c_str();
    out.name_size = attributes.strings.back().size();
    out.type = v->type;
    out.value_size = v->value_size;
    switch (v->type) {
      case PJRT_NamedValue_kString:
        attributes.strings.emplace_back(v->string_value, v->value_size);
        out.string_value = attributes.strings.back().c_str();
        break;
      case PJRT_NamedValue_kInt64:
        out.int64_value = v->int64_value;
        break;
      case PJRT_NamedValue_kInt64List:
        attributes.lists.emplace_back(v->int64_array_value, v->int64_array_value + v->value_size);
        out.int64_array_value = attributes.lists.back().data();
        break;
      case PJRT_NamedValue_kFloat:
        out.float_value = v->float_value;
        break;
      case PJRT_NamedValue_kBool:
        out.bool_value = v->bool_value;
        break;
    }
    attributes.values.push_back(out);
  }
  attributes.from_backend = true;
  return Status::Ok();
}

}  // namespace

PJRT_Error* Plugin_Attributes(PJRT_Plugin_Attributes_Args* args) {
  return Guard("PJRT_Plugin_Attributes", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Plugin_Attributes, num_attributes);
    static auto* attributes = new PluginAttributes();
    std::lock_guard<std::mutex> lock(attributes->mu);
    if (!attributes->from_backend) {
      std::shared_ptr<const PhysicalBackend> backend = AttributesBackend();
      FLEXNPU_RETURN_IF_ERROR(FillAttributes(*attributes, backend.get()));
    }
    args->attributes = attributes->values.data();
    args->num_attributes = attributes->values.size();
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
    args->platform_name = client->platform_name().c_str();
    args->platform_name_size = client->platform_name().size();
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
    const PJRT_Program* program = args->program;
    if (program == nullptr || program->code == nullptr || program->code_size == 0) {
      return InvalidArgument("PJRT_Client_Compile: program is null or empty");
    }
    if (program->struct_size < offsetof(PJRT_Program, format_size) + sizeof(size_t)) {
      return InvalidArgument("PJRT_Client_Compile: program struct_size " +
                             std::to_string(program->struct_size) + " is too small");
    }
    if (program->format == nullptr || program->format_size == 0) {
      return InvalidArgument("PJRT_Client_Compile: program format is null or empty (expected "
                             "'mlir' or 'hlo')");
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
    int64_t elements = 1;
    for (size_t i = 0; i < args->num_dims; ++i) elements *= args->dims[i];
    if (args->data == nullptr && elements != 0) {
      return InvalidArgument("PJRT_Client_BufferFromHostBuffer: data is null for " +
                             std::to_string(elements) + " elements");
    }
    if (args->byte_strides != nullptr && args->num_byte_strides != args->num_dims) {
      return InvalidArgument("PJRT_Client_BufferFromHostBuffer: " +
                             std::to_string(args->num_byte_strides) + " byte_strides for " +
                             std::to_string(args->num_dims) + " dims");
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
