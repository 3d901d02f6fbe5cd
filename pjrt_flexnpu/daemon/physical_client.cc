#include "pjrt_flexnpu/daemon/physical_client.h"

#include <dlfcn.h>

#include <utility>

#include "pjrt_flexnpu/backend/factory.h"
#include "pjrt_flexnpu/base/host_memory.h"

namespace flexnpu::daemon {
namespace {

Status LoadBackend(const std::string& path, PhysicalClient& p) {
  // A plugin's path, or one of FlexNPU's own backends (emulate:PRESET).
  auto backend = OpenBackend(path);
  if (!backend.ok()) return backend.status();
  p.backend = *backend;
  if (void* library = ::dlopen(path.c_str(), RTLD_NOW | RTLD_NOLOAD)) {
    p.runtime_stats = reinterpret_cast<const char* (*)()>(::dlsym(library, "FlexNpu_StatsJson"));
    ::dlclose(library);  // drops only the reference NOLOAD took; Load keeps its own
  }
  return Status::Ok();
}

Status CreateClient(const ServerConfig& config, PhysicalClient& p) {
  const PhysicalBackend& b = *p.backend;
  std::vector<PJRT_NamedValue> named;
  for (const auto& [key, value] : config.backend_int_options) {
    PJRT_NamedValue v{};
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = key.c_str();
    v.name_size = key.size();
    v.type = PJRT_NamedValue_kInt64;
    v.int64_value = value;
    v.value_size = 1;
    named.push_back(v);
  }
  for (const auto& [key, value] : config.backend_string_options) {
    PJRT_NamedValue v{};
    v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
    v.name = key.c_str();
    v.name_size = key.size();
    v.type = PJRT_NamedValue_kString;
    v.string_value = value.c_str();
    v.value_size = value.size();
    named.push_back(v);
  }
  PJRT_Client_Create_Args create{};
  create.struct_size = PJRT_Client_Create_Args_STRUCT_SIZE;
  create.create_options = named.data();
  create.num_options = named.size();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b, PJRT_Client_Create, &create));
  p.client = Own(b, create.client);
  return Status::Ok();
}

Status ReadPlatform(PhysicalClient& p) {
  const PhysicalBackend& b = *p.backend;
  PJRT_Client_PlatformName_Args name{};
  name.struct_size = PJRT_Client_PlatformName_Args_STRUCT_SIZE;
  name.client = p.client.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b, PJRT_Client_PlatformName, &name));
  p.platform_name.assign(name.platform_name, name.platform_name_size);
  PJRT_Client_PlatformVersion_Args version{};
  version.struct_size = PJRT_Client_PlatformVersion_Args_STRUCT_SIZE;
  version.client = p.client.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b, PJRT_Client_PlatformVersion, &version));
  p.platform_version.assign(version.platform_version, version.platform_version_size);
  // Over FlexNPU's own runtime, clients see the platform it runs on ("flexnpu 0.1.0 over cpu
  // (...)" -> "cpu"): JAX in the client lowers for that platform (LAPACK, callbacks).
  const std::string over = " over ";
  const size_t at = p.platform_version.find(over);
  if (p.platform_name == "flexnpu" && at != std::string::npos) {
    const size_t begin = at + over.size();
    p.platform_name = p.platform_version.substr(
        begin, p.platform_version.find_first_of(" (", begin) - begin);
  }
  return Status::Ok();
}

// The index of `handle` in p.memories, described and added there when it is new.
StatusOr<int64_t> AddMemory(PJRT_Memory* handle, PhysicalClient& p) {
  int64_t index = p.MemoryIndexOf(handle);
  if (index >= 0) return index;
  const PhysicalBackend& b = *p.backend;
  Memory memory;
  memory.handle = handle;
  PJRT_Memory_Id_Args mid{};
  mid.struct_size = PJRT_Memory_Id_Args_STRUCT_SIZE;
  mid.memory = memory.handle;
  memory.id = FLEXNPU_INNER_CALL(b, PJRT_Memory_Id, &mid).ok() ? mid.id : 0;
  FLEXNPU_ASSIGN_OR_RETURN(const std::string_view kind, b.MemoryKind(memory.handle));
  memory.kind.assign(kind);
  const StatusOr<int> kind_id = b.MemoryKindId(memory.handle);
  memory.kind_id = kind_id.ok() ? *kind_id : 0;
  index = static_cast<int64_t>(p.memories.size());
  p.memories.push_back(std::move(memory));
  return index;
}

// Describes addressable device `handle` (adding its memories to p.memories).
StatusOr<Device> DescribeDevice(PJRT_Device* handle, PhysicalClient& p) {
  const PhysicalBackend& b = *p.backend;
  Device d;
  d.handle = handle;
  FLEXNPU_ASSIGN_OR_RETURN(PJRT_DeviceDescription* const description, b.Description(handle));
  FLEXNPU_ASSIGN_OR_RETURN(d.id, b.DescriptionId(description));
  FLEXNPU_ASSIGN_OR_RETURN(const std::string_view kind, b.DescriptionKind(description));
  d.kind.assign(kind);
  const StatusOr<int> hardware_id = b.LocalHardwareId(handle);
  d.local_hardware_id = hardware_id.ok() ? *hardware_id : d.id;
  FLEXNPU_ASSIGN_OR_RETURN(const InnerSpan<PJRT_Memory*> mems, b.AddressableMemories(handle));
  for (PJRT_Memory* memory : mems) {
    FLEXNPU_ASSIGN_OR_RETURN(const int64_t index, AddMemory(memory, p));
    d.memories.push_back(index);
  }
  if (const StatusOr<PJRT_Memory*> memory = b.DefaultMemory(handle); memory.ok()) {
    d.default_memory = p.MemoryIndexOf(*memory);
  }
  return d;
}

Status DiscoverDevices(PhysicalClient& p) {
  FLEXNPU_ASSIGN_OR_RETURN(const InnerSpan<PJRT_Device*> devices,
                           p.backend->AddressableDevices(p.client.get()));
  const int64_t host = p.platform_name == "cpu" ? HostMemoryBytes() : 0;
  const int count = static_cast<int>(devices.size);
  for (int i = 0; i < count; ++i) {
    FLEXNPU_ASSIGN_OR_RETURN(Device d, DescribeDevice(devices[i], p));
    if (const StatusOr<int64_t> limit = p.backend->BytesLimit(d.handle); limit.ok() && *limit > 0) {
      d.bytes_limit = *limit;
    } else if (host > 0) {
      d.bytes_limit = ShareOf(host, count, i);
    }
    p.devices.push_back(std::move(d));
  }
  return Status::Ok();
}

}  // namespace

Status PhysicalClient::Open(const ServerConfig& config) {
  FLEXNPU_RETURN_IF_ERROR(LoadBackend(config.backend_path, *this));
  FLEXNPU_RETURN_IF_ERROR(CreateClient(config, *this));
  FLEXNPU_RETURN_IF_ERROR(ReadPlatform(*this));
  return DiscoverDevices(*this);
}

}  // namespace flexnpu::daemon
