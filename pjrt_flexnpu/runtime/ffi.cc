#include "pjrt_flexnpu/runtime/ffi.h"

#include <algorithm>
#include <cctype>
#include <cstring>

namespace flexnpu {
namespace {

struct AttachedBackend {
  const PhysicalBackend* backend;
  const ffi_abi::Extension* ffi;  // nullptr: the backend offers no FFI
  std::string platform;
};

struct TypeRegistration {
  std::string name;
  int64_t type_id;
  const ffi_abi::TypeInfo* info;
};

// Everything accepted so far and the backends it went to. Backends are never unloaded
// (PhysicalBackend::Load keeps them), so raw pointers stay valid.
struct Registry {
  std::mutex mu;
  std::vector<FfiHandlerRegistration> handlers;
  std::vector<TypeRegistration> types;
  std::vector<AttachedBackend> backends;
};

Registry& GetRegistry() {
  static auto* registry = new Registry();
  return *registry;
}

bool IsFlexNpuPlatform(const std::string& platform) {
  std::string lower(platform);
  std::transform(lower.begin(), lower.end(), lower.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return lower == kFlexNpuPlatform;
}

// The name XLA's FFI registry files a platform's handlers under (it lower-cases names but maps
// only "host" to the CPU compiler's "Host"): what jaxlib's xla_platform_names says too.
std::string XlaPlatformName(const std::string& platform) {
  if (platform == "cpu") return "Host";
  if (platform == "cuda") return "CUDA";
  if (platform == "rocm") return "ROCM";
  return platform;
}

Status ApplyHandler(const AttachedBackend& target, const FfiHandlerRegistration& r) {
  if (target.ffi == nullptr) return Status::Ok();
  const std::string& platform = IsFlexNpuPlatform(r.platform_name) ? target.platform : r.platform_name;
  ffi_abi::RegisterHandlerArgs args{};
  args.struct_size = sizeof(args);
  args.target_name = r.target_name.data();
  args.target_name_size = r.target_name.size();
  args.handler = r.handler;
  args.platform_name = platform.data();
  args.platform_name_size = platform.size();
  args.traits = r.traits;
  Status s = target.backend->Consume(target.ffi->register_handler(&args), "PJRT_FFI register_handler");
  if (!s.ok()) {
    return Status(s.code(), "FFI target '" + r.target_name + "' for platform '" + platform +
                                "' was not registered with the physical backend: " + s.message());
  }
  return s;
}

Status ApplyType(const AttachedBackend& target, TypeRegistration& t) {
  if (target.ffi == nullptr) return Status::Ok();
  ffi_abi::TypeRegisterArgs args{};
  args.struct_size = sizeof(args);
  args.type_name = t.name.data();
  args.type_name_size = t.name.size();
  args.type_id = t.type_id;
  // Backends read the info unconditionally; "no deleter, not serializable" when none was given.
  static const ffi_abi::TypeInfo kNoInfo{nullptr, nullptr, nullptr};
  args.type_info = t.info != nullptr ? t.info : &kNoInfo;
  Status s = target.backend->Consume(target.ffi->type_register(&args), "PJRT_FFI type_register");
  if (!s.ok()) {
    return Status(s.code(), "FFI type '" + t.name + "' was not registered with the physical "
                            "backend: " + s.message());
  }
  t.type_id = args.type_id;  // the first backend assigns it; the others are given it
  return s;
}

}  // namespace

const PJRT_Extension_Base* FindExtension(const PJRT_Api* api, PJRT_Extension_Type type) {
  if (api == nullptr) return nullptr;
  for (const PJRT_Extension_Base* e = api->extension_start; e != nullptr; e = e->next) {
    if (e->type == type) return e;
  }
  return nullptr;
}

const ffi_abi::Extension* InnerFfi(const PhysicalBackend& backend) {
  const PJRT_Extension_Base* e = FindExtension(backend.api(), PJRT_Extension_Type_FFI);
  if (e == nullptr || e->struct_size < sizeof(ffi_abi::Extension)) return nullptr;
  // Older plugins' register_handler reads another argument layout: offer them nothing.
  if (backend.minor_version() < kMinFfiRegisterMinor) return nullptr;
  const auto* ffi = reinterpret_cast<const ffi_abi::Extension*>(e);
  if (ffi->type_register == nullptr || ffi->user_data_add == nullptr ||
      ffi->register_handler == nullptr) {
    return nullptr;
  }
  return ffi;
}

Status RegisterFfiHandler(const FfiHandlerRegistration& registration) {
  if (registration.target_name.empty()) return InvalidArgument("FFI register_handler: target_name is empty");
  if (registration.handler == nullptr) {
    return InvalidArgument("FFI register_handler: handler of '" + registration.target_name + "' is null");
  }
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  for (const AttachedBackend& b : registry.backends) {
    FLEXNPU_RETURN_IF_ERROR(ApplyHandler(b, registration));
  }
  registry.handlers.push_back(registration);
  return Status::Ok();
}

Status RegisterFfiType(const std::string& name, int64_t* type_id, const ffi_abi::TypeInfo* info) {
  if (name.empty()) return InvalidArgument("FFI type_register: type_name is empty");
  if (type_id == nullptr) return InvalidArgument("FFI type_register: type_id is null");
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  for (const TypeRegistration& t : registry.types) {
    if (t.name != name) continue;
    if (*type_id != 0 && *type_id != t.type_id) {
      return InvalidArgument("FFI type '" + name + "' is registered with id " +
                             std::to_string(t.type_id) + ", not " + std::to_string(*type_id));
    }
    *type_id = t.type_id;
    return Status::Ok();
  }
  TypeRegistration t{name, *type_id, info};
  for (const AttachedBackend& b : registry.backends) FLEXNPU_RETURN_IF_ERROR(ApplyType(b, t));
  if (t.type_id == 0) {
    // No backend yet to assign one: pick an id the backends are later told to use.
    static int64_t next = int64_t{1} << 40;
    t.type_id = next++;
  }
  *type_id = t.type_id;
  registry.types.push_back(std::move(t));
  return Status::Ok();
}

Status AttachFfiBackend(const PhysicalBackend& backend, const std::string& platform) {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  for (const AttachedBackend& b : registry.backends) {
    if (b.backend == &backend) return Status::Ok();
  }
  AttachedBackend target{&backend, InnerFfi(backend), XlaPlatformName(platform)};
  for (TypeRegistration& t : registry.types) FLEXNPU_RETURN_IF_ERROR(ApplyType(target, t));
  for (const FfiHandlerRegistration& r : registry.handlers) {
    FLEXNPU_RETURN_IF_ERROR(ApplyHandler(target, r));
  }
  registry.backends.push_back(std::move(target));
  return Status::Ok();
}

ExecuteContext::~ExecuteContext() {
  for (const Inner& inner : inner_) {
    PJRT_ExecuteContext_Destroy_Args args{};
    args.struct_size = PJRT_ExecuteContext_Destroy_Args_STRUCT_SIZE;
    args.context = inner.context;
    (void)FLEXNPU_INNER_CALL(*inner.backend, PJRT_ExecuteContext_Destroy, &args);
  }
  for (const auto& [deleter, data] : deleters_) deleter(data);
}

Status ExecuteContext::AddUserData(const ffi_abi::UserData& data, void (*deleter)(void*)) {
  std::lock_guard<std::mutex> lock(mu_);
  user_data_.push_back(data);
  if (deleter != nullptr) deleters_.emplace_back(deleter, data.data);
  for (const Inner& inner : inner_) FLEXNPU_RETURN_IF_ERROR(AddToInner(inner, data));
  return Status::Ok();
}

Status ExecuteContext::AddToInner(const Inner& inner, const ffi_abi::UserData& data) {
  const ffi_abi::Extension* ffi = InnerFfi(*inner.backend);
  if (ffi == nullptr) {
    return Unimplemented("FFI user data cannot reach the physical backend '" +
                         inner.backend->path() + "': it offers no FFI extension");
  }
  ffi_abi::UserDataAddArgs add{};
  add.struct_size = ffi_abi::kUserDataAddArgsSize;  // the data stays FlexNPU's to release
  add.context = inner.context;
  add.user_data = data;
  return inner.backend->Consume(ffi->user_data_add(&add), "PJRT_FFI user_data_add");
}

StatusOr<PJRT_ExecuteContext*> ExecuteContext::InnerFor(const PhysicalBackend& backend) {
  std::lock_guard<std::mutex> lock(mu_);
  for (const Inner& inner : inner_) {
    if (inner.backend == &backend) return inner.context;
  }
  PJRT_ExecuteContext_Create_Args create{};
  create.struct_size = PJRT_ExecuteContext_Create_Args_STRUCT_SIZE;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(backend, PJRT_ExecuteContext_Create, &create));
  inner_.push_back({&backend, create.context});
  for (const ffi_abi::UserData& d : user_data_) FLEXNPU_RETURN_IF_ERROR(AddToInner(inner_.back(), d));
  return create.context;
}

StatusOr<PJRT_ExecuteContext*> InnerExecuteContext(const PJRT_ExecuteOptions* options,
                                                   const PhysicalBackend& backend) {
  if (options == nullptr || options->struct_size < offsetof(PJRT_ExecuteOptions, context) +
                                                       sizeof(options->context) ||
      options->context == nullptr) {
    return static_cast<PJRT_ExecuteContext*>(nullptr);
  }
  auto* context = FromHandle<ExecuteContext>(options->context);
  if (context == nullptr) {
    return InvalidArgument("PJRT_LoadedExecutable_Execute: options->context is not a FlexNPU "
                           "execute context (null, foreign or destroyed)");
  }
  return context->InnerFor(backend);
}

}  // namespace flexnpu
