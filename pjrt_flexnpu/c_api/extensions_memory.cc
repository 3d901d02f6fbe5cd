// The PJRT MemoryDescriptions extension, forwarded: a FlexNPU device description is answered
// with the memory descriptions of its virtual device's home physical device (the backend's own
// objects: their kinds are what FlexNPU's memories report too).
#include <string>

#include "pjrt_flexnpu/c_api/extensions.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/device.h"
#include "pjrt_flexnpu/runtime/ffi.h"

namespace flexnpu::c_api {
namespace {

// The binary layout of the MemoryDescriptions extension, version 1 (no header ships with the
// plugins; both CPU plugins here offer it with these two functions).
struct MemoryDescription;
struct MemoryDescriptionsArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_DeviceDescription* device_description;
  const MemoryDescription* const* memory_descriptions;  // out
  size_t num_memory_descriptions;                       // out
  size_t default_memory_index;                          // out; -1: none
};
struct MemoryKindArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const MemoryDescription* memory_description;
  const char* kind;  // out
  size_t kind_size;  // out
  int kind_id;       // out
};
struct MemoryDescriptionsExtension {
  PJRT_Extension_Base base;
  PJRT_Error* (*memory_descriptions)(MemoryDescriptionsArgs*);
  PJRT_Error* (*kind)(MemoryKindArgs*);
};

const PhysicalBackend* g_backend = nullptr;               // the backend the chain was built for
const MemoryDescriptionsExtension* g_inner = nullptr;     // its extension

PJRT_Error* MemoryDescriptions(MemoryDescriptionsArgs* args) {
  constexpr const char* kWhere = "PJRT_DeviceDescription_MemoryDescriptions";
  return Guard(kWhere, [&]() -> Status {
    if (args == nullptr) return InvalidArgument(std::string(kWhere) + ": args is null");
    if (args->struct_size < offsetof(MemoryDescriptionsArgs, default_memory_index) +
                                sizeof(args->default_memory_index)) {
      return InvalidArgument(std::string(kWhere) + ": args struct_size " +
                             std::to_string(args->struct_size) + " is too small");
    }
    auto* description = FromHandle<DeviceDescription>(args->device_description);
    if (description == nullptr || description->device() == nullptr) {
      return InvalidArgument(std::string(kWhere) +
                             ": device_description is not a FlexNPU handle (null, foreign or "
                             "destroyed)");
    }
    const VirtualDevice& device = *description->device();
    VirtualClient* client = device.client();
    if (&client->backend() != g_backend) {
      return Unimplemented(std::string(kWhere) + ": this device's physical backend '" +
                           client->backend().path() + "' is not the one FlexNPU's extension "
                           "forwards to ('" + g_backend->path() + "')");
    }
    PJRT_Device_GetDescription_Args get{};
    get.struct_size = PJRT_Device_GetDescription_Args_STRUCT_SIZE;
    get.device = client->physical(device.home_physical()).device;
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(*g_backend, PJRT_Device_GetDescription, &get));
    PJRT_DeviceDescription* caller = args->device_description;
    args->device_description = get.device_description;
    PJRT_Error* error = g_inner->memory_descriptions(args);
    args->device_description = caller;
    return g_backend->Consume(error, kWhere);
  });
}

PJRT_Error* MemoryKind(MemoryKindArgs* args) {
  return Guard("PJRT_MemoryDescription_Kind", [&]() -> Status {
    // The descriptions are the backend's own objects.
    return g_backend->Consume(g_inner->kind(args), "PJRT_MemoryDescription_Kind");
  });
}

}  // namespace

PJRT_Extension_Base* MemoryDescriptionsExtensionFor(const PhysicalBackend& backend) {
  const PJRT_Extension_Base* e =
      ::flexnpu::FindExtension(backend.api(), PJRT_Extension_Type_MemoryDescriptions);
  if (e == nullptr || e->struct_size < sizeof(MemoryDescriptionsExtension)) return nullptr;
  const auto* inner = reinterpret_cast<const MemoryDescriptionsExtension*>(e);
  if (inner->memory_descriptions == nullptr || inner->kind == nullptr) return nullptr;
  g_backend = &backend;
  g_inner = inner;
  static MemoryDescriptionsExtension extension{};
  extension.base.struct_size = sizeof(extension);
  extension.base.type = PJRT_Extension_Type_MemoryDescriptions;
  extension.memory_descriptions = MemoryDescriptions;
  extension.kind = MemoryKind;
  return &extension.base;
}

}  // namespace flexnpu::c_api
