// FFI forwarding: FFI handler and type registrations FlexNPU accepts are kept process-wide and
// applied to every physical backend (those loaded later too), and execute contexts carry FFI
// user data (e.g. jaxlib's host callbacks) to the inner execution.
#ifndef FLEXNPU_RUNTIME_FFI_H_
#define FLEXNPU_RUNTIME_FFI_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/runtime/handles.h"

namespace flexnpu {

// The binary layout of the PJRT FFI extension (type PJRT_Extension_Type_FFI), which the
// plugin's pip package ships no header for; extension version 3, as in the plugins at C API
// 0.81 and 0.115 measured here: register_handler takes typed (XLA_FFI_Handler*) execute
// handlers only, types carry a TypeInfo, user data has no deleter (older plugins differ).
namespace ffi_abi {
struct TypeInfo {
  void (*deleter)(void*);
  void* serialize;
  void* deserialize;
};
struct TypeRegisterArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  const char* type_name;
  size_t type_name_size;
  int64_t type_id;             // in-out: 0 asks the backend to assign one
  const TypeInfo* type_info;   // may be null
};
struct UserData {
  int64_t type_id;
  void* data;
};
struct UserDataAddArgs {
  size_t struct_size;
  PJRT_Extension_Base* extension_start;
  PJRT_ExecuteContext* context;
  UserData user_data;
  // Only in callers built before FFI extension 3 (struct_size 48): run when the context goes.
  void (*deleter)(void* data);
};
inline constexpr size_t kUserDataAddArgsSize = offsetof(UserDataAddArgs, deleter);
struct RegisterHandlerArgs {
  size_t struct_size;
  const char* target_name;
  size_t target_name_size;
  void* handler;  // XLA_FFI_Handler*
  const char* platform_name;
  size_t platform_name_size;
  uint32_t traits;
};
using TypeRegisterFn = PJRT_Error* (*)(TypeRegisterArgs*);
using UserDataAddFn = PJRT_Error* (*)(UserDataAddArgs*);
using RegisterHandlerFn = PJRT_Error* (*)(RegisterHandlerArgs*);
struct Extension {
  PJRT_Extension_Base base;
  TypeRegisterFn type_register;
  UserDataAddFn user_data_add;
  RegisterHandlerFn register_handler;
};
}  // namespace ffi_abi

// The few structs of the XLA FFI C ABI (xla/ffi/api/c_api.h) FlexNPU reads, declared here as in
// FFI 0.1: every field used is in the stable prefix that FFI 0.2 (xla-cpu-pjrt 0.0.1), 0.3
// (jaxlib 0.10.2) and 0.4 (lammps) share; sizes are checked before use.
namespace xla_ffi {
enum : int32_t { kExtensionMetadata = 1 };
enum : int32_t { kStageExecute = 3 };
enum : int32_t { kArgBuffer = 1, kRetBuffer = 1, kAttrScalar = 3 };
enum : int32_t { kDataTypeS64 = 5, kDataTypeU64 = 9, kDataTypeToken = 17 };
enum : int32_t { kErrorUnknown = 2, kErrorInvalidArgument = 3, kErrorFailedPrecondition = 9 };

struct ExtensionBase {
  size_t struct_size;
  int32_t type;
  ExtensionBase* next;
};
struct ApiVersion {
  size_t struct_size;
  ExtensionBase* extension_start;
  int major_version;
  int minor_version;
};
struct Metadata {
  size_t struct_size;  // up to `traits` (kMetadataSize); stateful handlers also write the id
  ApiVersion api_version;
  uint32_t traits;
  int64_t state_type_id;
};
struct MetadataExtension {
  ExtensionBase base;
  Metadata* metadata;
};
struct ErrorCreateArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  const char* message;
  int32_t errc;
};
struct ErrorGetMessageArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  void* error;
  const char* message;  // out
};
struct ErrorDestroyArgs {
  size_t struct_size;
  ExtensionBase* extension_start;
  void* error;
};
using ErrorCreateFn = void* (*)(ErrorCreateArgs*);
using ErrorGetMessageFn = void (*)(ErrorGetMessageArgs*);
using ErrorDestroyFn = void (*)(ErrorDestroyArgs*);
struct Api {
  size_t struct_size;
  ExtensionBase* extension_start;
  ApiVersion api_version;
  const void* internal_api;
  ErrorCreateFn error_create;  // the first three functions; every version has them
  ErrorGetMessageFn error_get_message;
  ErrorDestroyFn error_destroy;
};
struct Buffer {
  size_t struct_size;
  ExtensionBase* extension_start;
  int32_t dtype;
  void* data;
  int64_t rank;
  int64_t* dims;
};
struct List {  // XLA_FFI_Args and XLA_FFI_Rets
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  int32_t* types;
  void** items;
};
struct ByteSpan {
  const char* ptr;
  size_t len;
};
struct Attrs {
  size_t struct_size;
  ExtensionBase* extension_start;
  int64_t size;
  int32_t* types;
  ByteSpan** names;
  void** attrs;
};
struct Scalar {
  int32_t dtype;
  void* value;
};
struct CallFrame {
  size_t struct_size;
  ExtensionBase* extension_start;
  const Api* api;
  void* ctx;
  int32_t stage;
  List args;
  List rets;
  Attrs attrs;
};
using Handler = void* (*)(CallFrame*);
inline constexpr size_t kCallFrameSize = offsetof(CallFrame, attrs) + sizeof(Attrs);
inline constexpr size_t kBufferSize = offsetof(Buffer, dims) + sizeof(int64_t*);
inline constexpr size_t kMetadataSize = offsetof(Metadata, traits) + sizeof(uint32_t);
inline constexpr size_t kErrorCreateArgsSize = offsetof(ErrorCreateArgs, errc) + sizeof(int32_t);
inline constexpr size_t kApiSizeWithErrorCreate = offsetof(Api, error_create) + sizeof(ErrorCreateFn);
inline constexpr size_t kApiSizeWithErrors = offsetof(Api, error_destroy) + sizeof(ErrorDestroyFn);

// An error made by `api` (nullptr when `api` cannot make one: the backend gave no usable API).
void* MakeError(const Api* api, int32_t errc, const std::string& message);
// Answers XLA's registration-time query (a call frame carrying the metadata extension) with
// version `major`.`minor` and `traits`; false when `frame` is no such query.
bool AnswerMetadata(const CallFrame* frame, int major, int minor, uint32_t traits);
}  // namespace xla_ffi

// An XLA FFI version (major.minor) as a handler declares it or a backend implements it.
struct FfiVersion {
  int major = -1;  // -1: unknown
  int minor = -1;
  bool known() const { return major >= 0; }
  std::string ToString() const;
};

// The FFI version adapter. A backend implementing an older XLA FFI minor than a handler was
// built for (xla-cpu-pjrt 0.0.1: FFI 0.2; jaxlib 0.10.2's LAPACK kernels: 0.3) rejects the
// handler at registration. FlexNPU then registers, under the same target name, a trampoline
// declaring the backend's version that calls the handler with the backend's call frame: the
// call frame, buffers and the FFI API table the handler reads are ABI-identical across those
// minors (sizes in kFfiApiSizeByMinor, measured), and the trampoline checks the API table's
// size on every call before the handler can read past it.
// Index: FFI 0.<minor>; 0: not known (never adapted to).
inline constexpr size_t kFfiApiSizeByMinor[] = {0, 0, 192, 192, 200};
// How a registered handler reaches one backend.
enum class FfiRoute { kDirect, kAdapted, kTooNew };
struct FfiRouteReport {
  std::string target_name;
  std::string backend_path;
  FfiRoute route;
  FfiVersion handler;
  FfiVersion backend;
};
// The version `handler` declares in its metadata (and its traits into `traits`), asked as XLA
// asks, through `api` (a backend's FFI API, which the handler may use to report an error), or
// unknown.
FfiVersion HandlerFfiVersion(void* handler, const xla_ffi::Api* api, uint32_t* traits = nullptr);
// The route `handler` (declaring `handler_version`) takes into a backend whose FFI API is
// `backend_api` (nullptr: unknown; then kDirect).
FfiRoute ChooseFfiRoute(FfiVersion handler_version, const xla_ffi::Api* backend_api);
// A trampoline (XLA_FFI_Handler*) declaring `declared` and `traits` that runs `handler` after
// checking the caller's API table holds at least `required_api_size` bytes; the same one for
// the same arguments; nullptr when all slots are used.
void* AdaptedFfiHandler(void* handler, FfiVersion declared, size_t required_api_size,
                        uint32_t traits, const std::string& target_name);
// Whether target `target_name` was registered and every attached backend runs it (directly or
// adapted): false before any backend is attached, or when one has no FFI extension.
bool FfiTargetRunsEverywhere(const std::string& target_name);
// The routes taken so far, one entry per (target, backend).
std::vector<FfiRouteReport> FfiRoutes();

// The extension of `type` in `api`'s chain, or nullptr.
const PJRT_Extension_Base* FindExtension(const PJRT_Api* api, PJRT_Extension_Type type);
// `backend`'s FFI extension when it has all three functions, else nullptr.
const ffi_abi::Extension* InnerFfi(const PhysicalBackend& backend);

// The oldest inner C API whose register_handler has the layout above.
inline constexpr int kMinFfiRegisterMinor = 81;

// The platform name JAX uses for FlexNPU; registrations for it go to the physical platform.
inline constexpr const char* kFlexNpuPlatform = "flexnpu";

struct FfiHandlerRegistration {
  std::string target_name;
  std::string platform_name;  // as given; "flexnpu" means each backend's own platform
  void* handler = nullptr;  // XLA_FFI_Handler* (typed FFI)
  uint32_t traits = 0;
};

// Records `registration` and applies it to every backend attached so far.
Status RegisterFfiHandler(const FfiHandlerRegistration& registration);
// Registers type `name` (in-out `type_id`, 0: assign; `info` may be null and must outlive the
// process) with every attached backend and records it for later ones.
Status RegisterFfiType(const std::string& name, int64_t* type_id, const ffi_abi::TypeInfo* info);
// Applies every recorded registration to `backend`, whose clients report `platform` (e.g.
// "cpu"); later registrations reach it too. Idempotent per backend. A backend without the FFI
// extension is remembered and receives nothing.
Status AttachFfiBackend(const PhysicalBackend& backend, const std::string& platform);

// FlexNPU's PJRT_ExecuteContext: FFI user data, handed to an inner execute context per backend.
class ExecuteContext : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kExecuteContext;
  ExecuteContext() : Tagged(kTag) {}
  ~ExecuteContext();
  // Keeps `data` (`deleter`, if any, runs when this context is destroyed) and adds it to the
  // inner contexts made so far.
  Status AddUserData(const ffi_abi::UserData& data, void (*deleter)(void*));
  // The inner context for `backend` carrying all user data (made on first use, owned here).
  StatusOr<PJRT_ExecuteContext*> InnerFor(const PhysicalBackend& backend);

 private:
  struct Inner {
    const PhysicalBackend* backend;
    PJRT_ExecuteContext* context;
  };
  static Status AddToInner(const Inner& inner, const ffi_abi::UserData& data);
  std::mutex mu_;
  std::vector<ffi_abi::UserData> user_data_;
  std::vector<std::pair<void (*)(void*), void*>> deleters_;
  std::vector<Inner> inner_;
};

// The inner execute context for the caller's `options` (nullptr when it passes none).
StatusOr<PJRT_ExecuteContext*> InnerExecuteContext(const PJRT_ExecuteOptions* options,
                                                   const PhysicalBackend& backend);

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_FFI_H_
