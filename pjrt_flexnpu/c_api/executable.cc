// PJRT_Executable_* and PJRT_LoadedExecutable_* entry points.
#include "pjrt_flexnpu/c_api/entry_points.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/executable.h"

namespace flexnpu::c_api {
namespace {

// Forwards a query on the unloaded executable to the inner one it wraps.
#define FLEXNPU_FORWARD_EXECUTABLE(Name, last_field)                                    \
  PJRT_Error* Executable_##Name(PJRT_Executable_##Name##_Args* args) {                  \
    return Guard("PJRT_Executable_" #Name, [&]() -> Status {                            \
      FLEXNPU_CHECK_ARGS(PJRT_Executable_##Name, last_field);                           \
      FLEXNPU_RESOLVE(exe, VirtualExecutable, args->executable, PJRT_Executable_##Name, \
                      "executable");                                                    \
      return FLEXNPU_FORWARD(exe->backend(), PJRT_Executable_##Name, executable,        \
                             exe->inner());                                             \
    });                                                                                 \
  }

}  // namespace

FLEXNPU_FORWARD_EXECUTABLE(Name, executable_name_size)
FLEXNPU_FORWARD_EXECUTABLE(SizeOfGeneratedCodeInBytes, size_in_bytes)
FLEXNPU_FORWARD_EXECUTABLE(GetCostAnalysis, properties)
FLEXNPU_FORWARD_EXECUTABLE(OutputMemoryKinds, memory_kind_sizes)
FLEXNPU_FORWARD_EXECUTABLE(OptimizedProgram, program)
FLEXNPU_FORWARD_EXECUTABLE(OutputElementTypes, num_output_types)
FLEXNPU_FORWARD_EXECUTABLE(OutputDimensions, dim_sizes)
FLEXNPU_FORWARD_EXECUTABLE(Fingerprint, executable_fingerprint_size)
FLEXNPU_FORWARD_EXECUTABLE(GetCompiledMemoryStats, generated_code_size_in_bytes)
#undef FLEXNPU_FORWARD_EXECUTABLE

#define FLEXNPU_EXECUTABLE_COUNT(Name, field, getter)                                    \
  PJRT_Error* Executable_##Name(PJRT_Executable_##Name##_Args* args) {                  \
    return Guard("PJRT_Executable_" #Name, [&]() -> Status {                            \
      FLEXNPU_CHECK_ARGS(PJRT_Executable_##Name, field);                                \
      FLEXNPU_RESOLVE(exe, VirtualExecutable, args->executable, PJRT_Executable_##Name, \
                      "executable");                                                    \
      args->field = exe->getter();                                                      \
      return Status::Ok();                                                              \
    });                                                                                 \
  }

FLEXNPU_EXECUTABLE_COUNT(NumReplicas, num_replicas, num_replicas)
FLEXNPU_EXECUTABLE_COUNT(NumPartitions, num_partitions, num_partitions)
FLEXNPU_EXECUTABLE_COUNT(NumOutputs, num_outputs, num_outputs)
#undef FLEXNPU_EXECUTABLE_COUNT

PJRT_Error* Executable_Destroy(PJRT_Executable_Destroy_Args* args) {
  return Guard("PJRT_Executable_Destroy", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Executable_Destroy, executable);
    FLEXNPU_RESOLVE(exe, VirtualExecutable, args->executable, PJRT_Executable_Destroy,
                    "executable");
    delete exe;
    return Status::Ok();
  });
}

PJRT_Error* LoadedExecutable_Destroy(PJRT_LoadedExecutable_Destroy_Args* args) {
  return Guard("PJRT_LoadedExecutable_Destroy", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_LoadedExecutable_Destroy, executable);
    FLEXNPU_RESOLVE(exe, VirtualLoadedExecutable, args->executable,
                    PJRT_LoadedExecutable_Destroy, "executable");
    delete exe;
    return Status::Ok();
  });
}

PJRT_Error* LoadedExecutable_GetExecutable(PJRT_LoadedExecutable_GetExecutable_Args* args) {
  return Guard("PJRT_LoadedExecutable_GetExecutable", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_LoadedExecutable_GetExecutable, executable);
    FLEXNPU_RESOLVE(exe, VirtualLoadedExecutable, args->loaded_executable,
                    PJRT_LoadedExecutable_GetExecutable, "loaded_executable");
    const PhysicalBackend& b = exe->client()->backend();
    FLEXNPU_ASSIGN_OR_RETURN(InnerExecutable inner, b.GetExecutable(exe->any_inner()));
    auto exe_view = VirtualExecutable::Wrap(b, inner.release());
    if (!exe_view.ok()) return exe_view.status();
    (*exe_view)->set_serializable(exe->SerializationSnapshot());  // for Executable_Serialize
    args->executable = ToHandle<PJRT_Executable>(*exe_view);
    return Status::Ok();
  });
}

PJRT_Error* LoadedExecutable_AddressableDevices(
    PJRT_LoadedExecutable_AddressableDevices_Args* args) {
  return Guard("PJRT_LoadedExecutable_AddressableDevices", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_LoadedExecutable_AddressableDevices, num_addressable_devices);
    FLEXNPU_RESOLVE(exe, VirtualLoadedExecutable, args->executable,
                    PJRT_LoadedExecutable_AddressableDevices, "executable");
    args->addressable_devices = exe->device_handles().data();
    args->num_addressable_devices = exe->device_handles().size();
    return Status::Ok();
  });
}

PJRT_Error* LoadedExecutable_Delete(PJRT_LoadedExecutable_Delete_Args* args) {
  return Guard("PJRT_LoadedExecutable_Delete", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_LoadedExecutable_Delete, executable);
    FLEXNPU_RESOLVE(exe, VirtualLoadedExecutable, args->executable, PJRT_LoadedExecutable_Delete,
                    "executable");
    return exe->Delete();
  });
}

PJRT_Error* LoadedExecutable_IsDeleted(PJRT_LoadedExecutable_IsDeleted_Args* args) {
  return Guard("PJRT_LoadedExecutable_IsDeleted", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_LoadedExecutable_IsDeleted, is_deleted);
    FLEXNPU_RESOLVE(exe, VirtualLoadedExecutable, args->executable,
                    PJRT_LoadedExecutable_IsDeleted, "executable");
    args->is_deleted = exe->IsDeleted();
    return Status::Ok();
  });
}

PJRT_Error* LoadedExecutable_Execute(PJRT_LoadedExecutable_Execute_Args* args) {
  return Guard("PJRT_LoadedExecutable_Execute", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_LoadedExecutable_Execute, execute_device);
    FLEXNPU_RESOLVE(exe, VirtualLoadedExecutable, args->executable,
                    PJRT_LoadedExecutable_Execute, "executable");
    if (args->num_args > 0 && args->argument_lists == nullptr) {
      return InvalidArgument("PJRT_LoadedExecutable_Execute: argument_lists is null");
    }
    if (args->output_lists == nullptr) {
      return InvalidArgument("PJRT_LoadedExecutable_Execute: output_lists is null");
    }
    return exe->Execute(args);
  });
}

PJRT_Error* LoadedExecutable_Fingerprint(PJRT_LoadedExecutable_Fingerprint_Args* args) {
  return Guard("PJRT_LoadedExecutable_Fingerprint", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_LoadedExecutable_Fingerprint, executable_fingerprint_size);
    FLEXNPU_RESOLVE(exe, VirtualLoadedExecutable, args->executable,
                    PJRT_LoadedExecutable_Fingerprint, "executable");
    return FLEXNPU_FORWARD(exe->client()->backend(), PJRT_LoadedExecutable_Fingerprint,
                           executable, exe->any_inner());
  });
}

namespace {
void DeleteSerializedAssignment(PJRT_DeviceAssignmentSerialized* serialized) {
  delete reinterpret_cast<std::string*>(serialized);
}
}  // namespace

PJRT_Error* LoadedExecutable_GetDeviceAssignment(
    PJRT_LoadedExecutable_GetDeviceAssignment_Args* args) {
  return Guard("PJRT_LoadedExecutable_GetDeviceAssignment", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_LoadedExecutable_GetDeviceAssignment,
                       serialized_device_assignment_deleter);
    FLEXNPU_RESOLVE(exe, VirtualLoadedExecutable, args->executable,
                    PJRT_LoadedExecutable_GetDeviceAssignment, "executable");
    auto* copy = new std::string(exe->serialized_assignment());
    args->serialized_bytes = copy->data();
    args->serialized_bytes_size = copy->size();
    args->serialized_device_assignment = reinterpret_cast<PJRT_DeviceAssignmentSerialized*>(copy);
    args->serialized_device_assignment_deleter = DeleteSerializedAssignment;
    return Status::Ok();
  });
}

}  // namespace flexnpu::c_api
