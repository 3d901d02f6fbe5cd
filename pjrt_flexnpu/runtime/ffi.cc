#include "pjrt_flexnpu/runtime/ffi.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <cstring>
#include <utility>

#include "pjrt_flexnpu/backend/modelled_time.h"

namespace flexnpu {
namespace {

struct AttachedBackend {
  const PhysicalBackend* backend;
  const ffi_abi::Extension* ffi;  // nullptr: the backend offers no FFI
  std::string platform;
  const xla_ffi::Api* ffi_api = nullptr;  // the backend's XLA FFI API; nullptr: not learned
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
  std::vector<FfiRouteReport> routes;
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

// ---- the FFI version adapter -----------------------------------------------------------

// A trampoline's target: fixed once published (`handler` stored last, with release).
struct AdapterSlot {
  std::atomic<void*> handler{nullptr};
  FfiVersion declared;
  size_t required_api_size = 0;
  uint32_t traits = 0;
  std::string target_name;
};
constexpr size_t kAdapterSlots = 256;  // jaxlib 0.10.2 has 65 CPU targets
std::array<AdapterSlot, kAdapterSlots>& AdapterSlots() {
  static auto* slots = new std::array<AdapterSlot, kAdapterSlots>();
  return *slots;
}

void* RunAdapted(size_t index, xla_ffi::CallFrame* frame) {
  if (frame == nullptr) return nullptr;
  const AdapterSlot& slot = AdapterSlots()[index];
  auto handler = reinterpret_cast<xla_ffi::Handler>(slot.handler.load(std::memory_order_acquire));
  if (handler == nullptr) return nullptr;  // unreachable: registered only once published
  if (xla_ffi::AnswerMetadata(frame, slot.declared.major, slot.declared.minor, slot.traits)) {
    return nullptr;
  }
  const xla_ffi::Api* api = frame->api;
  if (api == nullptr || api->struct_size < slot.required_api_size) {
    return xla_ffi::MakeError(
        api, xla_ffi::kErrorFailedPrecondition,
        "flexnpu FFI adapter: target '" + slot.target_name + "' needs an XLA FFI API of " +
            std::to_string(slot.required_api_size) + " bytes; the backend's is " +
            (api == nullptr ? std::string("missing") : std::to_string(api->struct_size)));
  }
  return handler(frame);
}

template <size_t I>
void* AdapterEntry(xla_ffi::CallFrame* frame) {
  return RunAdapted(I, frame);
}
template <size_t... I>
constexpr std::array<xla_ffi::Handler, sizeof...(I)> MakeAdapterEntries(std::index_sequence<I...>) {
  return {&AdapterEntry<I>...};
}
constexpr std::array<xla_ffi::Handler, kAdapterSlots> kAdapterEntries =
    MakeAdapterEntries(std::make_index_sequence<kAdapterSlots>{});

// The probe FlexNPU registers with each backend to learn its FFI API: XLA asks a handler's
// metadata at registration with a call frame carrying the registering XLA's API.
std::atomic<const xla_ffi::Api*> g_probed_api{nullptr};
constexpr const char* kProbeTarget = "flexnpu_ffi_api_probe";

void* ProbeHandler(xla_ffi::CallFrame* frame) {
  if (frame == nullptr) return nullptr;
  if (xla_ffi::AnswerMetadata(frame, 0, 1, 0)) {
    g_probed_api.store(frame->api, std::memory_order_release);
    return nullptr;
  }
  return xla_ffi::MakeError(frame->api, xla_ffi::kErrorFailedPrecondition,
                            std::string(kProbeTarget) + " is FlexNPU's registration probe, not "
                            "callable");
}

Status Register(const AttachedBackend& target, const std::string& target_name,
                const std::string& platform, void* handler, uint32_t traits) {
  ffi_abi::RegisterHandlerArgs args{};
  args.struct_size = sizeof(args);
  args.target_name = target_name.data();
  args.target_name_size = target_name.size();
  args.handler = handler;
  args.platform_name = platform.data();
  args.platform_name_size = platform.size();
  args.traits = traits;
  Status s = target.backend->Consume(target.ffi->register_handler(&args), "PJRT_FFI register_handler");
  if (!s.ok()) {
    return Status(s.code(), "FFI target '" + target_name + "' for platform '" + platform +
                                "' was not registered with the physical backend: " + s.message());
  }
  return s;
}

// The backend's XLA FFI API, learned by registering the probe (nullptr when the backend never
// asks for metadata).
const xla_ffi::Api* ProbeFfiApi(const AttachedBackend& target) {
  if (target.ffi == nullptr) return nullptr;
  g_probed_api.store(nullptr, std::memory_order_relaxed);
  if (!Register(target, kProbeTarget, target.platform, reinterpret_cast<void*>(&ProbeHandler), 0)
           .ok()) {
    return nullptr;
  }
  const xla_ffi::Api* api = g_probed_api.load(std::memory_order_acquire);
  if (api == nullptr || api->struct_size < offsetof(xla_ffi::Api, internal_api)) return nullptr;
  return api;
}

FfiVersion ApiVersionOf(const xla_ffi::Api* api) {
  if (api == nullptr) return {};
  return {api->api_version.major_version, api->api_version.minor_version};
}

Status ApplyHandler(AttachedBackend& target, const FfiHandlerRegistration& r,
                    std::vector<FfiRouteReport>& routes) {
  if (target.ffi == nullptr) return Status::Ok();
  const std::string& platform = IsFlexNpuPlatform(r.platform_name) ? target.platform : r.platform_name;
  uint32_t handler_traits = 0;
  const FfiVersion handler_version = target.ffi_api == nullptr
                                         ? FfiVersion{}
                                         : HandlerFfiVersion(r.handler, target.ffi_api, &handler_traits);
  const FfiRoute route = ChooseFfiRoute(handler_version, target.ffi_api);
  void* handler = r.handler;
  if (route == FfiRoute::kAdapted) {
    handler = AdaptedFfiHandler(r.handler, ApiVersionOf(target.ffi_api),
                                kFfiApiSizeByMinor[handler_version.minor], handler_traits,
                                r.target_name);
    if (handler == nullptr) {
      return Status(Code::kResourceExhausted, "FFI target '" + r.target_name + "' needs XLA FFI " +
                               handler_version.ToString() + " and the physical backend implements " +
                               ApiVersionOf(target.ffi_api).ToString() + ": all " +
                               std::to_string(kAdapterSlots) + " FFI adapter slots are in use");
    }
  }
  // A handler for an FFI newer than the backend's, by a gap the adapter does not know: the backend
  // would refuse it anyway, and xla-cpu-pjrt 0.0.1 leaks the error it then discards. Not handing it
  // over gives the same outcome (compiling names the missing target; ffi_routes() says why).
  if (route != FfiRoute::kTooNew) {
    FLEXNPU_RETURN_IF_ERROR(Register(target, r.target_name, platform, handler, r.traits));
  }
  // Recorded only once the backend took it: lowering.py picks jaxlib's kernels by these routes.
  routes.push_back({r.target_name, target.backend->path(), route, handler_version,
                    ApiVersionOf(target.ffi_api)});
  return Status::Ok();
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

namespace xla_ffi {

void* MakeError(const Api* api, int32_t errc, const std::string& message) {
  if (api == nullptr || api->struct_size < kApiSizeWithErrorCreate || api->error_create == nullptr) {
    return nullptr;
  }
  ErrorCreateArgs args{};
  args.struct_size = kErrorCreateArgsSize;
  args.message = message.c_str();  // XLA copies it
  args.errc = errc;
  return api->error_create(&args);
}

bool AnswerMetadata(const CallFrame* frame, int major, int minor, uint32_t traits) {
  for (const ExtensionBase* e = frame->extension_start; e != nullptr; e = e->next) {
    if (e->type != kExtensionMetadata) continue;
    auto* metadata = reinterpret_cast<const MetadataExtension*>(e)->metadata;
    if (metadata != nullptr && metadata->struct_size >= kMetadataSize) {
      metadata->api_version.major_version = major;
      metadata->api_version.minor_version = minor;
      metadata->traits = traits;
    }
    return true;
  }
  return false;
}

}  // namespace xla_ffi

std::string FfiVersion::ToString() const {
  return known() ? std::to_string(major) + "." + std::to_string(minor) : std::string("unknown");
}

FfiVersion HandlerFfiVersion(void* handler, const xla_ffi::Api* api, uint32_t* traits) {
  if (handler == nullptr || api == nullptr) return {};
  xla_ffi::Metadata metadata{};
  metadata.struct_size = xla_ffi::kMetadataSize;
  metadata.api_version.struct_size = sizeof(xla_ffi::ApiVersion);
  xla_ffi::MetadataExtension extension{};
  extension.base.struct_size = sizeof(extension);
  extension.base.type = xla_ffi::kExtensionMetadata;
  extension.metadata = &metadata;
  xla_ffi::CallFrame frame{};
  frame.struct_size = xla_ffi::kCallFrameSize;
  frame.extension_start = &extension.base;
  frame.api = api;
  frame.stage = xla_ffi::kStageExecute;
  frame.args.struct_size = sizeof(frame.args);
  frame.rets.struct_size = sizeof(frame.rets);
  frame.attrs.struct_size = sizeof(frame.attrs);
  metadata.api_version.major_version = -1;
  void* error = reinterpret_cast<xla_ffi::Handler>(handler)(&frame);
  if (error != nullptr) {
    if (api->struct_size >= xla_ffi::kApiSizeWithErrors && api->error_destroy != nullptr) {
      xla_ffi::ErrorDestroyArgs destroy{};
      destroy.struct_size = sizeof(destroy);
      destroy.error = error;
      api->error_destroy(&destroy);
    }
    return {};
  }
  if (metadata.api_version.major_version < 0) return {};
  if (traits != nullptr) *traits = metadata.traits;
  return {metadata.api_version.major_version, metadata.api_version.minor_version};
}

FfiRoute ChooseFfiRoute(FfiVersion handler_version, const xla_ffi::Api* backend_api) {
  const FfiVersion backend = ApiVersionOf(backend_api);
  if (!handler_version.known() || !backend.known()) return FfiRoute::kDirect;
  if (handler_version.major != backend.major || handler_version.minor <= backend.minor) {
    return FfiRoute::kDirect;  // a major mismatch: the backend decides (and names it)
  }
  const size_t known = sizeof(kFfiApiSizeByMinor) / sizeof(kFfiApiSizeByMinor[0]);
  if (handler_version.major != 0 || handler_version.minor < 0 ||
      static_cast<size_t>(handler_version.minor) >= known ||
      kFfiApiSizeByMinor[handler_version.minor] == 0 ||
      backend_api->struct_size < kFfiApiSizeByMinor[handler_version.minor]) {
    return FfiRoute::kTooNew;
  }
  return FfiRoute::kAdapted;
}

void* AdaptedFfiHandler(void* handler, FfiVersion declared, size_t required_api_size,
                        uint32_t traits, const std::string& target_name) {
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  auto& slots = AdapterSlots();
  for (size_t i = 0; i < kAdapterSlots; ++i) {
    AdapterSlot& slot = slots[i];
    void* current = slot.handler.load(std::memory_order_acquire);
    if (current == handler && slot.declared.major == declared.major &&
        slot.declared.minor == declared.minor && slot.required_api_size == required_api_size &&
        slot.traits == traits) {
      return reinterpret_cast<void*>(kAdapterEntries[i]);
    }
    if (current != nullptr) continue;
    slot.declared = declared;
    slot.required_api_size = required_api_size;
    slot.target_name = target_name;
    slot.traits = traits;
    slot.handler.store(handler, std::memory_order_release);
    return reinterpret_cast<void*>(kAdapterEntries[i]);
  }
  return nullptr;
}

bool FfiTargetRunsEverywhere(const std::string& target_name) {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  if (registry.backends.empty()) return false;
  for (const AttachedBackend& b : registry.backends) {
    if (b.ffi == nullptr) return false;
    bool runs = false;
    for (const FfiRouteReport& route : registry.routes) {
      if (route.target_name == target_name && route.backend_path == b.backend->path()) {
        // Direct with a version unknown (the backend never asked the handler's metadata) is not
        // known to run: a backend may drop a handler while reporting success.
        runs = route.route == FfiRoute::kAdapted ||
               (route.route == FfiRoute::kDirect && route.handler.known() && route.backend.known());
      }
    }
    if (!runs) return false;
  }
  return true;
}

std::vector<FfiRouteReport> FfiRoutes() {
  Registry& registry = GetRegistry();
  std::lock_guard<std::mutex> lock(registry.mu);
  return registry.routes;
}

const PJRT_Extension_Base* FindExtension(const PJRT_Api* api, PJRT_Extension_Type type) {
  if (api == nullptr) return nullptr;
  for (const PJRT_Extension_Base* e = api->extension_start; e != nullptr; e = e->next) {
    if (ExtensionTypeOf(*e) == static_cast<uint32_t>(type)) return e;
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
  for (AttachedBackend& b : registry.backends) {
    FLEXNPU_RETURN_IF_ERROR(ApplyHandler(b, registration, registry.routes));
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
  target.ffi_api = ProbeFfiApi(target);
  for (TypeRegistration& t : registry.types) FLEXNPU_RETURN_IF_ERROR(ApplyType(target, t));
  std::vector<FfiRouteReport> routes;  // kept only if the whole backend attaches
  for (const FfiHandlerRegistration& r : registry.handlers) {
    FLEXNPU_RETURN_IF_ERROR(ApplyHandler(target, r, routes));
  }
  registry.routes.insert(registry.routes.end(), routes.begin(), routes.end());
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
