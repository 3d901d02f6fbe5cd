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
#include "pjrt_flexnpu/runtime/handles.h"
#include "pjrt_flexnpu/runtime/status.h"

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
