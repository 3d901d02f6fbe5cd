// The PJRT Layouts extension, forwarded: FlexNPU's client, buffer, topology and executable
// handles are swapped for the inner ones of the backend the chain was built for; the memory
// layouts handed out are that backend's (Destroy and Serialize go straight to it).
#include <cstring>
#include <string>

#include "pjrt_flexnpu/c_api/extensions.h"
#include "pjrt_flexnpu/runtime/buffer.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/device.h"
#include "pjrt_flexnpu/runtime/executable.h"
#include "pjrt_flexnpu/runtime/ffi.h"

namespace flexnpu::c_api {
namespace {

// The binary layout of the Layouts extension: six functions at C API 0.81; C API 0.93 added a
// seventh, GetParameterLayouts (the lammps plugin at 0.115 has it), offered when the backend's is.
struct MemoryLayout;
struct LayoutDestroyArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  MemoryLayout* layout;
};
struct LayoutSerializeArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  MemoryLayout* layout;
  const char* serialized_bytes;        // out
  size_t serialized_bytes_size;        // out
  void* serialized_layout;             // out
  void (*serialized_layout_deleter)(void*);  // out
};
struct ClientDefaultLayoutArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Client* client;
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  MemoryLayout* layout;  // out
};
struct BufferLayoutArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Buffer* buffer;
  MemoryLayout* layout;  // out
};
struct TopologyDefaultLayoutArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_TopologyDescription* topology;
  PJRT_Buffer_Type type;
  const int64_t* dims;
  size_t num_dims;
  MemoryLayout* layout;  // out
};
struct OutputLayoutsArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_outputs;      // out
  MemoryLayout** layouts;  // out, owned by the executable
};
struct ParameterLayoutsArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_Executable* executable;
  size_t num_parameters;   // out
  MemoryLayout** layouts;  // out, owned by the executable
};
struct LayoutsExtension {
  PJRT_Extension_Base base;
  PJRT_Error* (*destroy)(LayoutDestroyArgs*);
  PJRT_Error* (*serialize)(LayoutSerializeArgs*);
  PJRT_Error* (*client_default_layout)(ClientDefaultLayoutArgs*);
  PJRT_Error* (*buffer_layout)(BufferLayoutArgs*);
  PJRT_Error* (*topology_default_layout)(TopologyDefaultLayoutArgs*);
  PJRT_Error* (*output_layouts)(OutputLayoutsArgs*);
  PJRT_Error* (*parameter_layouts)(ParameterLayoutsArgs*);  // C API 0.93+
};
inline constexpr size_t kLayoutsWithoutParameterLayouts =
    offsetof(LayoutsExtension, parameter_layouts);

const PhysicalBackend* g_backend = nullptr;        // the backend the chain was built for
const LayoutsExtension* g_inner = nullptr;         // its Layouts extension

Status SameBackend(const PhysicalBackend& b, const char* where) {
  if (&b == g_backend) return Status::Ok();
  return Unimplemented(std::string(where) + ": this object's physical backend '" + b.path() +
                       "' is not the one FlexNPU's Layouts extension forwards to ('" +
                       g_backend->path() + "', named by the environment at load)");
}

// Calls `fn` with the caller's `args`, `*handle` swapped for `inner` meanwhile.
template <typename Args, typename Handle>
Status WithInner(PJRT_Error* (*fn)(Args*), Args* args, Handle** handle, Handle* inner,
                 const char* where) {
  Handle* caller = *handle;
  *handle = inner;
  PJRT_Error* error = fn(args);
  *handle = caller;
  return g_backend->Consume(error, where);
}

#define FLEXNPU_LAYOUT_ARGS(where, Args, last)                                            \
  if (args == nullptr) return InvalidArgument(std::string(where) + ": args is null");     \
  if (args->struct_size < offsetof(Args, last) + sizeof(args->last)) {                    \
    return InvalidArgument(std::string(where) + ": args struct_size " +                   \
                           std::to_string(args->struct_size) + " is too small");          \
  }

PJRT_Error* Destroy(LayoutDestroyArgs* args) {
  return Guard("PJRT_Layouts_MemoryLayout_Destroy", [&]() -> Status {
    return g_backend->Consume(g_inner->destroy(args), "PJRT_Layouts_MemoryLayout_Destroy");
  });
}

PJRT_Error* Serialize(LayoutSerializeArgs* args) {
  return Guard("PJRT_Layouts_MemoryLayout_Serialize", [&]() -> Status {
    return g_backend->Consume(g_inner->serialize(args), "PJRT_Layouts_MemoryLayout_Serialize");
  });
}

PJRT_Error* ClientDefaultLayout(ClientDefaultLayoutArgs* args) {
  constexpr const char* kWhere = "PJRT_Layouts_PJRT_Client_GetDefaultLayout";
  return Guard(kWhere, [&]() -> Status {
    FLEXNPU_LAYOUT_ARGS(kWhere, ClientDefaultLayoutArgs, layout);
    auto* client = FromHandle<VirtualClient>(args->client);
    if (client == nullptr) return InvalidArgument(std::string(kWhere) + ": client is not a FlexNPU handle");
    FLEXNPU_RETURN_IF_ERROR(SameBackend(client->backend(), kWhere));
    return WithInner(g_inner->client_default_layout, args, &args->client, client->inner(), kWhere);
  });
}

PJRT_Error* BufferLayout(BufferLayoutArgs* args) {
  constexpr const char* kWhere = "PJRT_Layouts_PJRT_Buffer_MemoryLayout";
  return Guard(kWhere, [&]() -> Status {
    FLEXNPU_LAYOUT_ARGS(kWhere, BufferLayoutArgs, layout);
    auto* buffer = FromHandle<VirtualBuffer>(args->buffer);
    if (buffer == nullptr) return InvalidArgument(std::string(kWhere) + ": buffer is not a FlexNPU handle (null, foreign or destroyed)");
    FLEXNPU_RETURN_IF_ERROR(SameBackend(buffer->client()->backend(), kWhere));
    // Held while the inner buffer is in use (runtime/buffer.h: it may move meanwhile).
    std::shared_ptr<PhysicalBuffer> physical = buffer->physical();
    if (physical == nullptr) return FailedPrecondition(std::string(kWhere) + ": the buffer is deleted");
    return WithInner(g_inner->buffer_layout, args, &args->buffer, physical->handle.get(), kWhere);
  });
}

PJRT_Error* TopologyDefaultLayout(TopologyDefaultLayoutArgs* args) {
  constexpr const char* kWhere = "PJRT_Layouts_PJRT_Topology_GetDefaultLayout";
  return Guard(kWhere, [&]() -> Status {
    FLEXNPU_LAYOUT_ARGS(kWhere, TopologyDefaultLayoutArgs, layout);
    auto* topology = FromHandle<Topology>(args->topology);
    if (topology == nullptr) return InvalidArgument(std::string(kWhere) + ": topology is not a FlexNPU handle");
    VirtualClient* client = topology->client();
    FLEXNPU_RETURN_IF_ERROR(SameBackend(client->backend(), kWhere));
    PJRT_Client_TopologyDescription_Args inner{};
    inner.struct_size = PJRT_Client_TopologyDescription_Args_STRUCT_SIZE;
    inner.client = client->inner();
    FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(*g_backend, PJRT_Client_TopologyDescription, &inner));
    return WithInner(g_inner->topology_default_layout, args, &args->topology, inner.topology, kWhere);
  });
}

PJRT_Error* OutputLayouts(OutputLayoutsArgs* args) {
  constexpr const char* kWhere = "PJRT_Layouts_PJRT_Executable_GetOutputLayouts";
  return Guard(kWhere, [&]() -> Status {
    FLEXNPU_LAYOUT_ARGS(kWhere, OutputLayoutsArgs, layouts);
    auto* executable = FromHandle<VirtualExecutable>(args->executable);
    if (executable == nullptr) return InvalidArgument(std::string(kWhere) + ": executable is not a FlexNPU handle");
    FLEXNPU_RETURN_IF_ERROR(SameBackend(executable->backend(), kWhere));
    return WithInner(g_inner->output_layouts, args, &args->executable, executable->inner(), kWhere);
  });
}

PJRT_Error* ParameterLayouts(ParameterLayoutsArgs* args) {
  constexpr const char* kWhere = "PJRT_Layouts_PJRT_Executable_GetParameterLayouts";
  return Guard(kWhere, [&]() -> Status {
    FLEXNPU_LAYOUT_ARGS(kWhere, ParameterLayoutsArgs, layouts);
    auto* executable = FromHandle<VirtualExecutable>(args->executable);
    if (executable == nullptr) return InvalidArgument(std::string(kWhere) + ": executable is not a FlexNPU handle");
    FLEXNPU_RETURN_IF_ERROR(SameBackend(executable->backend(), kWhere));
    return WithInner(g_inner->parameter_layouts, args, &args->executable, executable->inner(),
                     kWhere);
  });
}

}  // namespace

PJRT_Extension_Base* LayoutsExtensionFor(const PhysicalBackend& backend) {
  const PJRT_Extension_Base* e = ::flexnpu::FindExtension(backend.api(), PJRT_Extension_Type_Layouts);
  if (e == nullptr || e->struct_size < kLayoutsWithoutParameterLayouts) return nullptr;
  const auto* inner = reinterpret_cast<const LayoutsExtension*>(e);
  if (inner->destroy == nullptr || inner->serialize == nullptr ||
      inner->client_default_layout == nullptr || inner->buffer_layout == nullptr ||
      inner->topology_default_layout == nullptr || inner->output_layouts == nullptr) {
    return nullptr;
  }
  g_backend = &backend;
  g_inner = inner;
  static LayoutsExtension layouts{};
  const bool has_parameter_layouts =
      e->struct_size >= sizeof(LayoutsExtension) && inner->parameter_layouts != nullptr;
  layouts.base.struct_size =
      has_parameter_layouts ? sizeof(layouts) : kLayoutsWithoutParameterLayouts;
  layouts.base.type = PJRT_Extension_Type_Layouts;
  layouts.destroy = Destroy;
  layouts.serialize = Serialize;
  layouts.client_default_layout = ClientDefaultLayout;
  layouts.buffer_layout = BufferLayout;
  layouts.topology_default_layout = TopologyDefaultLayout;
  layouts.output_layouts = OutputLayouts;
  layouts.parameter_layouts = has_parameter_layouts ? ParameterLayouts : nullptr;
  return &layouts.base;
}

}  // namespace flexnpu::c_api
