// Executables: compile and deserialize (once per program: program.h), their device
// assignment, and the queries, which the CPU compile answers. Execution: execute.cc.
#include <cstring>

#include "pjrt_flexnpu/backend/compile_options.h"
#include "pjrt_flexnpu/backend/emulated/entry_points.h"
#include "pjrt_flexnpu/backend/emulated/handles.h"

namespace flexnpu::emulated {
namespace {

// Serialized emulated executables are the CPU compiler's, behind this line: neither loads as
// the other.
constexpr char kSerializedMagic[] = "flexnpu emulated executable 1\n";

struct Serialized {
  std::string bytes;
};
void DeleteSerialized(PJRT_SerializedExecutable* s) { delete reinterpret_cast<Serialized*>(s); }

Status RefuseHostCallback(const Program& p) {
  if (p.host_callback.empty()) return Status::Ok();
  return Unimplemented("emulated backend: program '" + p.name + "' calls the host callback '" +
                       p.host_callback +
                       "' (a custom call; jax.debug.print/callback, pure_callback and "
                       "io_callback lower to it): the emulated backend computes nothing, so "
                       "host callbacks cannot run");
}

// A loaded executable of `program` on the devices `options` assign (none when portable; the
// first replicas x partitions devices when the options name none).
StatusOr<EmulatedLoadedExecutable*> NewLoaded(EmulatedClient* client,
                                              std::shared_ptr<const Program> program,
                                              const CompileOptionsInfo& info) {
  FLEXNPU_RETURN_IF_ERROR(RefuseHostCallback(*program));
  auto loaded = std::make_unique<EmulatedLoadedExecutable>();
  loaded->client = client;
  loaded->program = std::move(program);
  loaded->portable = info.compile_portable;
  std::vector<int64_t> ids = info.device_ids;
  if (!info.compile_portable && !info.has_device_assignment) {
    for (int64_t i = 0; i < info.num_replicas * info.num_partitions; ++i) ids.push_back(i);
  }
  if (info.compile_portable) ids.clear();
  for (int64_t id : ids) {
    auto device = client->DeviceWithId(id);
    if (device == nullptr) {
      return InvalidArgument("emulated backend: the device assignment names device " +
                             std::to_string(id) + "; there are " +
                             std::to_string(client->devices.size()));
    }
    loaded->device_handles.push_back(To<PJRT_Device>(device.get()));
    loaded->devices.push_back(std::move(device));
  }
  return loaded.release();
}

const Program& ProgramOf(const PJRT_Executable* executable) {
  return *reinterpret_cast<const EmulatedExecutable*>(executable)->program;
}

}  // namespace

PJRT_Error* Client_Compile(PJRT_Client_Compile_Args* a) {
  return Run([&]() -> Status {
    EmulatedClient* client = From<EmulatedClient>(a->client);
    const std::string_view options(a->compile_options, a->compile_options_size);
    FLEXNPU_ASSIGN_OR_RETURN(const CompileOptionsInfo info, ReadCompileOptions(options));
    FLEXNPU_ASSIGN_OR_RETURN(const std::string key, ProgramKey(*a->program, options));
    // The first request's device assignment compiles it: the CPU compiler's device ids are
    // the emulated ones, and its executable is never run.
    auto program = client->programs.Get(key, [&]() -> ProgramCache::Result {
      auto compiled = client->cpu->Compile(client->cpu_client.get(), a->program, options);
      if (!compiled.ok()) return compiled.status();
      return AnalyzeProgram(client->cpu, std::move(*compiled), client->config);
    });
    if (!program.ok()) return program.status();
    FLEXNPU_ASSIGN_OR_RETURN(EmulatedLoadedExecutable * loaded,
                             NewLoaded(client, std::move(*program), info));
    a->executable = To<PJRT_LoadedExecutable>(loaded);
    return Status::Ok();
  });
}

PJRT_Error* Executable_Serialize(PJRT_Executable_Serialize_Args* a) {
  return Run([&]() -> Status {
    const Program& p = ProgramOf(a->executable);
    FLEXNPU_ASSIGN_OR_RETURN(std::string bytes, p.cpu->Serialize(p.cpu_executable.get()));
    auto* s = new Serialized{kSerializedMagic + std::move(bytes)};
    a->serialized_bytes = s->bytes.data();
    a->serialized_bytes_size = s->bytes.size();
    a->serialized_executable = reinterpret_cast<PJRT_SerializedExecutable*>(s);
    a->serialized_executable_deleter = DeleteSerialized;
    return Status::Ok();
  });
}

PJRT_Error* Executable_DeserializeAndLoad(PJRT_Executable_DeserializeAndLoad_Args* a) {
  return Run([&]() -> Status {
    EmulatedClient* client = From<EmulatedClient>(a->client);
    const std::string_view bytes(a->serialized_executable, a->serialized_executable_size);
    const size_t magic = sizeof(kSerializedMagic) - 1;
    if (bytes.substr(0, magic) != kSerializedMagic) {
      return InvalidArgument("emulated backend: these bytes are not a serialized emulated "
                             "executable (an executable of another backend?)");
    }
    const std::string_view cpu_bytes = bytes.substr(magic);
    const std::string_view options(a->overridden_serialized_compile_options,
                                   a->overridden_serialized_compile_options != nullptr
                                       ? a->overridden_serialized_compile_options_size
                                       : 0);
    std::string key = "deserialized:" + std::to_string(cpu_bytes.size()) + ":";
    key.append(cpu_bytes);
    if (!options.empty()) {
      FLEXNPU_ASSIGN_OR_RETURN(const std::string device_free, DeviceFreeOptionsKey(options));
      key += device_free;
    }
    auto program = client->programs.Get(key, [&]() -> ProgramCache::Result {
      auto loaded = client->cpu->DeserializeAndLoad(client->cpu_client.get(), cpu_bytes, options);
      if (!loaded.ok()) return loaded.status();
      return AnalyzeProgram(client->cpu, std::move(*loaded), client->config);
    });
    if (!program.ok()) return program.status();
    CompileOptionsInfo info;
    if (!options.empty()) {
      FLEXNPU_ASSIGN_OR_RETURN(info, ReadCompileOptions(options));
    } else {
      // The devices it was compiled for, as the CPU compiler loaded it (same ids).
      FLEXNPU_ASSIGN_OR_RETURN(const InnerSpan<PJRT_Device*> devices,
                               (*program)->cpu->AddressableDevices((*program)->cpu_loaded.get()));
      info.has_device_assignment = true;
      for (PJRT_Device* device : devices) {
        FLEXNPU_ASSIGN_OR_RETURN(PJRT_DeviceDescription* d, (*program)->cpu->Description(device));
        FLEXNPU_ASSIGN_OR_RETURN(const int id, (*program)->cpu->DescriptionId(d));
        info.device_ids.push_back(id);
      }
      info.compile_portable = info.device_ids.empty();
    }
    FLEXNPU_ASSIGN_OR_RETURN(EmulatedLoadedExecutable * loaded,
                             NewLoaded(client, std::move(*program), info));
    a->loaded_executable = To<PJRT_LoadedExecutable>(loaded);
    return Status::Ok();
  });
}

PJRT_Error* LoadedExecutable_Destroy(PJRT_LoadedExecutable_Destroy_Args* a) {
  delete From<EmulatedLoadedExecutable>(a->executable);
  return nullptr;
}
PJRT_Error* LoadedExecutable_GetExecutable(PJRT_LoadedExecutable_GetExecutable_Args* a) {
  const auto* loaded = From<EmulatedLoadedExecutable>(a->loaded_executable);
  a->executable = To<PJRT_Executable>(new EmulatedExecutable{loaded->program});
  return nullptr;
}
PJRT_Error* LoadedExecutable_AddressableDevices(
    PJRT_LoadedExecutable_AddressableDevices_Args* a) {
  const auto* loaded = From<EmulatedLoadedExecutable>(a->executable);
  a->addressable_devices = const_cast<PJRT_Device* const*>(loaded->device_handles.data());
  a->num_addressable_devices = loaded->device_handles.size();
  return nullptr;
}
PJRT_Error* LoadedExecutable_Delete(PJRT_LoadedExecutable_Delete_Args* a) {
  From<EmulatedLoadedExecutable>(a->executable)->deleted = true;
  return nullptr;
}
PJRT_Error* LoadedExecutable_IsDeleted(PJRT_LoadedExecutable_IsDeleted_Args* a) {
  a->is_deleted = From<EmulatedLoadedExecutable>(a->executable)->deleted.load();
  return nullptr;
}
PJRT_Error* LoadedExecutable_Fingerprint(PJRT_LoadedExecutable_Fingerprint_Args* a) {
  return Run([&]() -> Status {
    const Program& p = *From<EmulatedLoadedExecutable>(a->executable)->program;
    PJRT_LoadedExecutable* mine = a->executable;
    a->executable = p.cpu_loaded.get();
    Status status = FLEXNPU_INNER_CALL(*p.cpu, PJRT_LoadedExecutable_Fingerprint, a);
    a->executable = mine;
    return status;
  });
}

PJRT_Error* Executable_Destroy(PJRT_Executable_Destroy_Args* a) {
  delete From<EmulatedExecutable>(a->executable);
  return nullptr;
}

// Queries the CPU compile answers: what it compiled is the program the devices run.
#define FLEXNPU_FORWARD_EXECUTABLE(Name)                                          \
  PJRT_Error* Executable_##Name(PJRT_Executable_##Name##_Args* a) {               \
    return Run([&]() -> Status {                                                  \
      const Program& p = ProgramOf(a->executable);                                \
      PJRT_Executable* mine = a->executable;                                      \
      a->executable = p.cpu_executable.get();                                     \
      Status status = FLEXNPU_INNER_CALL(*p.cpu, PJRT_Executable_##Name, a);      \
      a->executable = mine;                                                       \
      return status;                                                              \
    });                                                                           \
  }
FLEXNPU_FORWARD_EXECUTABLE(Name)
FLEXNPU_FORWARD_EXECUTABLE(NumReplicas)
FLEXNPU_FORWARD_EXECUTABLE(NumPartitions)
FLEXNPU_FORWARD_EXECUTABLE(NumOutputs)
FLEXNPU_FORWARD_EXECUTABLE(SizeOfGeneratedCodeInBytes)
FLEXNPU_FORWARD_EXECUTABLE(GetCostAnalysis)
FLEXNPU_FORWARD_EXECUTABLE(OutputMemoryKinds)
FLEXNPU_FORWARD_EXECUTABLE(OptimizedProgram)
FLEXNPU_FORWARD_EXECUTABLE(OutputElementTypes)
FLEXNPU_FORWARD_EXECUTABLE(OutputDimensions)
FLEXNPU_FORWARD_EXECUTABLE(Fingerprint)
FLEXNPU_FORWARD_EXECUTABLE(GetCompiledMemoryStats)
#undef FLEXNPU_FORWARD_EXECUTABLE

}  // namespace flexnpu::emulated
