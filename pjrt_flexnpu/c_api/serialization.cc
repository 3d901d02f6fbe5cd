// PJRT_Executable_Serialize and PJRT_Executable_DeserializeAndLoad: the FlexNPU envelope of
// runtime/executable_serialization.h (JAX's persistent compilation cache and
// jax.experimental.serialize_executable use them).
#include <string>

#include "pjrt_flexnpu/c_api/entry_points.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/executable.h"
#include "pjrt_flexnpu/runtime/executable_serialization.h"

namespace flexnpu::c_api {
namespace {
void DeleteSerialized(PJRT_SerializedExecutable* serialized) {
  delete reinterpret_cast<std::string*>(serialized);
}
}  // namespace

PJRT_Error* Executable_Serialize(PJRT_Executable_Serialize_Args* args) {
  return Guard("PJRT_Executable_Serialize", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Executable_Serialize, serialized_executable_deleter);
    FLEXNPU_RESOLVE(exe, VirtualExecutable, const_cast<PJRT_Executable*>(args->executable),
                    PJRT_Executable_Serialize, "executable");
    if (exe->serializable() == nullptr) {
      return FailedPrecondition("PJRT_Executable_Serialize: this executable was not obtained "
                                "from a loaded executable (PJRT_LoadedExecutable_GetExecutable)");
    }
    auto bytes = SerializeExecutable(*exe->serializable());
    if (!bytes.ok()) return bytes.status();
    auto* owned = new std::string(std::move(*bytes));
    args->serialized_bytes = owned->data();
    args->serialized_bytes_size = owned->size();
    args->serialized_executable = reinterpret_cast<PJRT_SerializedExecutable*>(owned);
    args->serialized_executable_deleter = DeleteSerialized;
    return Status::Ok();
  });
}

PJRT_Error* Executable_DeserializeAndLoad(PJRT_Executable_DeserializeAndLoad_Args* args) {
  return Guard("PJRT_Executable_DeserializeAndLoad", [&]() -> Status {
    // overridden_serialized_compile_options arrived in a later C API minor than the call.
    FLEXNPU_CHECK_ARGS(PJRT_Executable_DeserializeAndLoad, loaded_executable);
    FLEXNPU_RESOLVE(client, VirtualClient, args->client, PJRT_Executable_DeserializeAndLoad,
                    "client");
    if (args->serialized_executable == nullptr || args->serialized_executable_size == 0) {
      return InvalidArgument(
          "PJRT_Executable_DeserializeAndLoad: serialized_executable is null or empty");
    }
    std::string_view overridden;
    if (FLEXNPU_HAS_FIELD(PJRT_Executable_DeserializeAndLoad,
                          overridden_serialized_compile_options_size) &&
        args->overridden_serialized_compile_options != nullptr) {
      overridden = std::string_view(args->overridden_serialized_compile_options,
                                    args->overridden_serialized_compile_options_size);
    }
    auto loaded = DeserializeAndLoadExecutable(
        client, std::string_view(args->serialized_executable, args->serialized_executable_size),
        overridden);
    if (!loaded.ok()) return loaded.status();
    args->loaded_executable = ToHandle<PJRT_LoadedExecutable>(*loaded);
    return Status::Ok();
  });
}

}  // namespace flexnpu::c_api
