// A session's requests on executables: compiling and loading them, and what it asks of them
// (the optimized program, serialization, deletion).
#include <algorithm>
#include <utility>

#include "pjrt_flexnpu/daemon/dispatch.h"

namespace flexnpu::daemon {

StatusOr<ExecutableEntry*> Dispatcher::FindExecutable(Session& s,
                                                      const std::vector<int64_t>& ints) {
  if (ints.empty()) return InvalidArgument("request names no executable");
  auto it = s.executables.find(ints[0]);
  if (it == s.executables.end()) {
    return NotFound("executable " + std::to_string(ints[0]) + " is not one of session " +
                    std::to_string(s.id) + "'s executables");
  }
  return &it->second;
}

Status Dispatcher::AddExecutable(Session& s, PJRT_LoadedExecutable* loaded_handle, Frame* out) {
  InnerLoadedExecutable loaded = Own(b(), loaded_handle);
  ExecutableMeta meta;
  auto got = b().GetExecutable(loaded.get());
  if (!got.ok()) return got.status();
  InnerExecutable exe = std::move(*got);
  auto replicas = b().NumReplicas(exe.get());
  if (!replicas.ok()) return replicas.status();
  meta.num_replicas = static_cast<int64_t>(*replicas);
  auto partitions = b().NumPartitions(exe.get());
  if (!partitions.ok()) return partitions.status();
  meta.num_partitions = static_cast<int64_t>(*partitions);
  auto outputs = b().NumOutputs(exe.get());
  if (!outputs.ok()) return outputs.status();
  meta.num_outputs = static_cast<int64_t>(*outputs);
  PJRT_Executable_GetCompiledMemoryStats_Args stats{};
  stats.struct_size = PJRT_Executable_GetCompiledMemoryStats_Args_STRUCT_SIZE;
  stats.executable = exe.get();
  if (FLEXNPU_INNER_CALL(b(), PJRT_Executable_GetCompiledMemoryStats, &stats).ok()) {
    meta.has_memory_stats = true;
    const int64_t values[kMemoryStatsFields] = {
        stats.generated_code_size_in_bytes, stats.argument_size_in_bytes,
        stats.output_size_in_bytes, stats.alias_size_in_bytes, stats.temp_size_in_bytes,
        stats.host_generated_code_size_in_bytes, stats.host_argument_size_in_bytes,
        stats.host_output_size_in_bytes, stats.host_alias_size_in_bytes,
        stats.host_temp_size_in_bytes, stats.peak_memory_in_bytes};
    std::copy(values, values + kMemoryStatsFields, meta.memory_stats);
  }
  PJRT_LoadedExecutable_AddressableDevices_Args devs{};
  devs.struct_size = PJRT_LoadedExecutable_AddressableDevices_Args_STRUCT_SIZE;
  devs.executable = loaded.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_LoadedExecutable_AddressableDevices, &devs));
  std::vector<int64_t> addressable;
  for (size_t i = 0; i < devs.num_addressable_devices; ++i) {
    int64_t index = -1;
    for (size_t d = 0; d < physical_.devices.size(); ++d) {
      if (physical_.devices[d].handle == devs.addressable_devices[i]) {
        index = static_cast<int64_t>(d);
      }
    }
    // A portable executable lists every device; only pinned ones must stay in the set.
    if (index < 0 || (s.devices.count(index) == 0 && devs.num_addressable_devices == 1)) {
      return PermissionDenied("the executable runs on a device outside the device set of tenant '" +
                              s.tenant + "'");
    }
    if (s.devices.count(index) > 0) meta.devices.push_back(index);
    addressable.push_back(index);
  }
  PJRT_Executable_Name_Args name{};
  name.struct_size = PJRT_Executable_Name_Args_STRUCT_SIZE;
  name.executable = exe.get();
  // jaxlib treats a failing name() as fatal (its cache serializes by name): an inner plugin
  // without the slot gets a stand-in name.
  if (FLEXNPU_INNER_CALL(b(), PJRT_Executable_Name, &name).ok() && name.executable_name != nullptr) {
    meta.name.assign(name.executable_name, name.executable_name_size);
  } else {
    meta.name = "flexnpu_daemon_executable";
  }
  meta.id = next_id_++;
  s.executables[meta.id] =
      ExecutableEntry{loaded.release(), meta.num_outputs, std::move(addressable)};
  AppendExecutableMeta(&out->ints, meta);
  out->blobs.push_back(meta.name);
  return Status::Ok();
}

Status Dispatcher::Compile(Session& s, const Frame& r, Frame* out) {
  if (r.blobs.size() < 3) return InvalidArgument("malformed Compile request");
  PJRT_Program program{};
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  std::string code = r.blobs[1];
  program.code = code.data();
  program.code_size = code.size();
  program.format = r.blobs[0].data();
  program.format_size = r.blobs[0].size();
  PJRT_Client_Compile_Args args{};
  args.struct_size = PJRT_Client_Compile_Args_STRUCT_SIZE;
  args.client = physical_.client.get();
  args.program = &program;
  args.compile_options = r.blobs[2].data();
  args.compile_options_size = r.blobs[2].size();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Client_Compile, &args));
  return AddExecutable(s, args.executable, out);
}

Status Dispatcher::Deserialize(Session& s, const Frame& r, Frame* out) {
  if (r.blobs.size() < 2 || r.ints.empty()) return InvalidArgument("malformed Deserialize request");
  PJRT_Executable_DeserializeAndLoad_Args args{};
  args.struct_size = PJRT_Executable_DeserializeAndLoad_Args_STRUCT_SIZE;
  args.client = physical_.client.get();
  args.serialized_executable = r.blobs[0].data();
  args.serialized_executable_size = r.blobs[0].size();
  if (r.ints[0] != 0) {
    args.overridden_serialized_compile_options = r.blobs[1].data();
    args.overridden_serialized_compile_options_size = r.blobs[1].size();
  }
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Executable_DeserializeAndLoad, &args));
  return AddExecutable(s, args.loaded_executable, out);
}

Status Dispatcher::ExecutableCall(Session& s, const Frame& r, Frame* out) {
  auto entry = FindExecutable(s, r.ints);
  if (!entry.ok()) return entry.status();
  PJRT_LoadedExecutable* loaded = (*entry)->handle;
  if (r.op == kExecutableDelete) {
    PJRT_LoadedExecutable_Delete_Args args{};
    args.struct_size = PJRT_LoadedExecutable_Delete_Args_STRUCT_SIZE;
    args.executable = loaded;
    return FLEXNPU_INNER_CALL(b(), PJRT_LoadedExecutable_Delete, &args);
  }
  if (r.op == kExecutableDestroy) {
    InnerDeleter<PJRT_LoadedExecutable>{&b()}(loaded);
    s.executables.erase(r.ints[0]);
    return Status::Ok();
  }
  auto got = b().GetExecutable(loaded);
  if (!got.ok()) return got.status();
  InnerExecutable exe = std::move(*got);
  if (r.op == kOptimizedProgram) {
    PJRT_Program program{};
    program.struct_size = PJRT_Program_STRUCT_SIZE;
    PJRT_Executable_OptimizedProgram_Args args{};
    args.struct_size = PJRT_Executable_OptimizedProgram_Args_STRUCT_SIZE;
    args.executable = exe.get();
    args.program = &program;
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Executable_OptimizedProgram, &args));
    std::string code(program.code_size, '\0');
    program.code = code.data();
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Executable_OptimizedProgram, &args));
    code.resize(program.code_size);
    out->blobs = {std::move(code), std::string(program.format, program.format_size)};
    return Status::Ok();
  }
  PJRT_Executable_Serialize_Args args{};
  args.struct_size = PJRT_Executable_Serialize_Args_STRUCT_SIZE;
  args.executable = exe.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b(), PJRT_Executable_Serialize, &args));
  out->blobs = {std::string(args.serialized_bytes, args.serialized_bytes_size)};
  if (args.serialized_executable_deleter != nullptr) {
    args.serialized_executable_deleter(args.serialized_executable);
  }
  return Status::Ok();
}

}  // namespace flexnpu::daemon
