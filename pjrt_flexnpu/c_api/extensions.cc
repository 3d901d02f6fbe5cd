// The extension chain and the FFI extension (handler and type registration, execute-context
// user data), forwarded to the physical backends by runtime/ffi.h.
#include "pjrt_flexnpu/c_api/extensions.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <string>

#include "pjrt_flexnpu/backend/factory.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/runtime/ffi.h"
#include "pjrt_flexnpu/runtime/host_callback.h"
#include "pjrt_flexnpu/runtime/profiler_extension.h"
#include "pjrt_flexnpu/runtime/options.h"

namespace flexnpu::c_api {
namespace {

Status RegisterType(ffi_abi::TypeRegisterArgs* args) {
  if (args == nullptr) return InvalidArgument("PJRT_FFI type_register: args is null");
  if (args->struct_size < offsetof(ffi_abi::TypeRegisterArgs, type_id) + sizeof(args->type_id)) {
    return InvalidArgument("PJRT_FFI type_register: args struct_size " +
                           std::to_string(args->struct_size) + " is too small");
  }
  if (args->type_name == nullptr) return InvalidArgument("PJRT_FFI type_register: type_name is null");
  const bool has_info = args->struct_size >= offsetof(ffi_abi::TypeRegisterArgs, type_info) +
                                                 sizeof(args->type_info);
  return RegisterFfiType(std::string(args->type_name, args->type_name_size), &args->type_id,
                         has_info ? args->type_info : nullptr);
}

Status AddUserData(ffi_abi::UserDataAddArgs* args) {
  if (args == nullptr) return InvalidArgument("PJRT_FFI user_data_add: args is null");
  if (args->struct_size < ffi_abi::kUserDataAddArgsSize) {
    return InvalidArgument("PJRT_FFI user_data_add: args struct_size " +
                           std::to_string(args->struct_size) + " is too small");
  }
  auto* context = FromHandle<ExecuteContext>(args->context);
  if (context == nullptr) {
    return InvalidArgument("PJRT_FFI user_data_add: context is not a FlexNPU execute context "
                           "(null, foreign or destroyed)");
  }
  const bool has_deleter = args->struct_size >= sizeof(ffi_abi::UserDataAddArgs);
  return context->AddUserData(args->user_data, has_deleter ? args->deleter : nullptr);
}

Status RegisterHandler(ffi_abi::RegisterHandlerArgs* args) {
  if (args == nullptr) return InvalidArgument("PJRT_FFI register_handler: args is null");
  if (args->struct_size < offsetof(ffi_abi::RegisterHandlerArgs, traits) + sizeof(args->traits)) {
    return InvalidArgument("PJRT_FFI register_handler: args struct_size " +
                           std::to_string(args->struct_size) + " is too small");
  }
  if (args->target_name == nullptr || args->platform_name == nullptr) {
    return InvalidArgument("PJRT_FFI register_handler: target_name or platform_name is null");
  }
  FfiHandlerRegistration r;
  r.target_name.assign(args->target_name, args->target_name_size);
  r.platform_name.assign(args->platform_name, args->platform_name_size);
  r.handler = args->handler;
  r.traits = args->traits;
  return RegisterFfiHandler(r);
}

PJRT_Error* FfiTypeRegister(ffi_abi::TypeRegisterArgs* args) {
  return Guard("PJRT_FFI type_register", [&] { return RegisterType(args); });
}
PJRT_Error* FfiUserDataAdd(ffi_abi::UserDataAddArgs* args) {
  return Guard("PJRT_FFI user_data_add", [&] { return AddUserData(args); });
}
PJRT_Error* FfiRegisterHandler(ffi_abi::RegisterHandlerArgs* args) {
  return Guard("PJRT_FFI register_handler", [&] { return RegisterHandler(args); });
}

PJRT_Extension_Base* BuildChain() {
  std::shared_ptr<const PhysicalBackend> inner = EnvironmentBackend();
  if (inner == nullptr) return nullptr;
  PJRT_Extension_Base* head = nullptr;
  // Prepends `e` (static storage) to the chain.
  auto link = [&head](PJRT_Extension_Base* e) {
    e->next = head;
    head = e;
  };
  if (InnerFfi(*inner) != nullptr) {
    static ffi_abi::Extension ffi{};
    ffi.base.struct_size = sizeof(ffi);
    ffi.base.type = PJRT_Extension_Type_FFI;
    ffi.type_register = FfiTypeRegister;
    ffi.user_data_add = FfiUserDataAdd;
    ffi.register_handler = FfiRegisterHandler;
    link(&ffi.base);
  }
  // The backend's profiler, as it is (runtime/profiler_extension.h; "serialize"'s hook).
  if (PJRT_Extension_Base* profiler = ForwardedProfilerExtension(*inner->api())) link(profiler);
  // Without Layouts JAX round-trips every optimized program through GetHloModules.
  if (PJRT_Extension_Base* layouts = LayoutsExtensionFor(*inner)) link(layouts);
  if (PJRT_Extension_Base* memory = MemoryDescriptionsExtensionFor(*inner)) link(memory);
  return head;
}

}  // namespace

// Also the backend whose versions Plugin_Attributes reports before a client exists.
std::shared_ptr<const PhysicalBackend> EnvironmentBackend() {
  auto options = ParseOptions({}, ProcessEnv());
  if (!options.ok()) return nullptr;
  auto path = BackendPath(*options);
  if (!path.ok()) return nullptr;
  // A daemon's API is opened per client (it connects); a plugin or an emulated backend now.
  if (BackendKindOf(*path) == BackendKind::kDaemon) return nullptr;
  auto backend = OpenBackend(*path);
  return backend.ok() ? *backend : nullptr;
}

PJRT_Extension_Base* ExtensionChain() {
  static PJRT_Extension_Base* const chain = BuildChain();
  return chain;
}

PJRT_Error* ExecuteContext_Create(PJRT_ExecuteContext_Create_Args* args) {
  return Guard("PJRT_ExecuteContext_Create", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_ExecuteContext_Create, context);
    args->context = ToHandle<PJRT_ExecuteContext>(new ExecuteContext());
    return Status::Ok();
  });
}

PJRT_Error* ExecuteContext_Destroy(PJRT_ExecuteContext_Destroy_Args* args) {
  return Guard("PJRT_ExecuteContext_Destroy", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_ExecuteContext_Destroy, context);
    if (args->context == nullptr) return Status::Ok();
    FLEXNPU_RESOLVE(context, ExecuteContext, args->context, PJRT_ExecuteContext_Destroy, "context");
    delete context;
    return Status::Ok();
  });
}

}  // namespace flexnpu::c_api

extern "C" {

// FFI registration for FlexNPU's Python side (flexnpu/lowering.py, through flexnpu._native.PluginLibrary): the same
// path as the FFI extension's register_handler / type_register. Returns nullptr on
// success, else a message that lives until the next call from the same thread.
__attribute__((visibility("default"))) const char* FlexNpu_RegisterFfiHandler(
    const char* target_name, const char* platform_name, int api_version, void* handler,
    uint32_t traits) {
  thread_local std::string error;
  if (api_version != 1) {
    error = "FFI target '" + std::string(target_name == nullptr ? "" : target_name) +
            "': api_version " + std::to_string(api_version) +
            " (untyped custom call) is not forwarded: PJRT FFI register_handler takes typed "
            "(api_version 1) handlers only";
    return error.c_str();
  }
  flexnpu::ffi_abi::RegisterHandlerArgs args{};
  args.struct_size = sizeof(args);
  args.target_name = target_name;
  args.target_name_size = target_name == nullptr ? 0 : std::strlen(target_name);
  args.handler = handler;
  args.platform_name = platform_name;
  args.platform_name_size = platform_name == nullptr ? 0 : std::strlen(platform_name);
  args.traits = traits;
  PJRT_Error* e = flexnpu::c_api::FfiRegisterHandler(&args);
  if (e == nullptr) return nullptr;
  error = e->status.message();
  delete e;
  return error.c_str();
}

__attribute__((visibility("default"))) const char* FlexNpu_RegisterFfiType(
    const char* type_name, int64_t* type_id, const void* type_info) {
  thread_local std::string error;
  flexnpu::ffi_abi::TypeRegisterArgs args{};
  args.struct_size = sizeof(args);
  args.type_name = type_name;
  args.type_name_size = type_name == nullptr ? 0 : std::strlen(type_name);
  args.type_id = type_id == nullptr ? 0 : *type_id;
  args.type_info = static_cast<const flexnpu::ffi_abi::TypeInfo*>(type_info);
  PJRT_Error* e = flexnpu::c_api::FfiTypeRegister(&args);
  if (e == nullptr) {
    if (type_id != nullptr) *type_id = args.type_id;
    return nullptr;
  }
  error = e->status.message();
  delete e;
  return error.c_str();
}

// The FFI version adapter's state (runtime/ffi.h) for FlexNPU's Python side (flexnpu/lowering.py):
// whether every attached backend runs target `target_name` (directly or adapted).
__attribute__((visibility("default"))) int FlexNpu_FfiTargetRunsEverywhere(const char* target_name) {
  if (target_name == nullptr) return 0;
  try {
    return flexnpu::FfiTargetRunsEverywhere(target_name) ? 1 : 0;
  } catch (...) {  // nothing may cross the C boundary
    return 0;
  }
}

// The routes FFI registrations took, one line per (target, backend): "target\troute\thandler
// version\tbackend version\tbackend path" (route: direct, adapted, too_new). Lives until the
// next call from the same thread.
__attribute__((visibility("default"))) const char* FlexNpu_FfiRoutes() {
  thread_local std::string text;
  text.clear();
  try {
    for (const flexnpu::FfiRouteReport& r : flexnpu::FfiRoutes()) {
      const char* route = r.route == flexnpu::FfiRoute::kDirect    ? "direct"
                          : r.route == flexnpu::FfiRoute::kAdapted ? "adapted"
                                                                   : "too_new";
      text += r.target_name + "\t" + route + "\t" + r.handler.ToString() + "\t" +
              r.backend.ToString() + "\t" + r.backend_path + "\n";
    }
  } catch (...) {  // nothing may cross the C boundary: an empty report
    text.clear();
  }
  return text.c_str();
}

// Host callbacks (runtime/host_callback.h) for FlexNPU's Python side (flexnpu/host_callbacks.py,
// through flexnpu._native.PluginLibrary): installs the trampoline and registers FlexNPU's
// handler with the backends.
// Returns nullptr on success, else a message that lives until the next call from the thread.
__attribute__((visibility("default"))) const char* FlexNpu_InstallHostCallbacks(
    void* trampoline) {
  thread_local std::string error;
  flexnpu::Status s = flexnpu::InstallHostCallbacks(
      reinterpret_cast<flexnpu::HostCallbackTrampoline>(trampoline));
  if (s.ok()) return nullptr;
  error = s.message();
  return error.c_str();
}

}  // extern "C"
