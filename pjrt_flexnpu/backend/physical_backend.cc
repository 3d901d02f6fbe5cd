#include "pjrt_flexnpu/backend/physical_backend.h"

#include <dlfcn.h>

#include <cstring>
#include <map>
#include <mutex>

namespace flexnpu {
namespace {

std::mutex& LoadMutex() {
  static std::mutex mu;
  return mu;
}

std::map<std::string, std::shared_ptr<const PhysicalBackend>>& LoadedBackends() {
  static auto* loaded = new std::map<std::string, std::shared_ptr<const PhysicalBackend>>();
  return *loaded;
}

}  // namespace

Status PhysicalBackend::ConsumeError(PJRT_Error* error, const char* where) const {
  // The inner error is destroyed whatever happens below (building the message may throw).
  struct Destroy {
    const PJRT_Api* api;
    PJRT_Error* error;
    ~Destroy() {
      PJRT_Error_Destroy_Args destroy_args{};
      destroy_args.struct_size = PJRT_Error_Destroy_Args_STRUCT_SIZE;
      destroy_args.error = error;
      api->PJRT_Error_Destroy(&destroy_args);
    }
  } destroy{api_, error};

  PJRT_Error_Message_Args message_args{};
  message_args.struct_size = PJRT_Error_Message_Args_STRUCT_SIZE;
  message_args.error = error;
  api_->PJRT_Error_Message(&message_args);

  PJRT_Error_GetCode_Args code_args{};
  code_args.struct_size = PJRT_Error_GetCode_Args_STRUCT_SIZE;
  code_args.error = error;
  Code code = Code::kUnknown;
  if (api_->PJRT_Error_GetCode(&code_args) == nullptr) code = static_cast<Code>(code_args.code);
  std::string message = "physical backend: " + std::string(where) + ": ";
  if (message_args.message != nullptr) message.append(message_args.message, message_args.message_size);
  return Status(code, std::move(message));
}

StatusOr<std::shared_ptr<const PhysicalBackend>> PhysicalBackend::Load(const std::string& path) {
  std::lock_guard<std::mutex> lock(LoadMutex());
  auto& loaded = LoadedBackends();
  if (auto it = loaded.find(path); it != loaded.end()) return it->second;

  void* library = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) {
    const char* why = dlerror();
    return InvalidArgument("cannot load physical backend '" + path +
                           "': " + (why ? why : "dlopen failed"));
  }
  using GetPjrtApiFn = const PJRT_Api* (*)();
  auto get_api = reinterpret_cast<GetPjrtApiFn>(dlsym(library, "GetPjrtApi"));
  if (get_api == nullptr) {
    return InvalidArgument("physical backend '" + path +
                           "' is not a PJRT plugin: it does not export GetPjrtApi");
  }
  const PJRT_Api* api = get_api();
  if (api == nullptr) return InvalidArgument("GetPjrtApi of '" + path + "' returned null");
  const auto& version = api->pjrt_api_version;
  if (version.major_version != PJRT_API_MAJOR || version.minor_version < kMinInnerApiMinor) {
    return InvalidArgument("physical backend '" + path + "' has PJRT C API " +
                           std::to_string(version.major_version) + "." +
                           std::to_string(version.minor_version) + "; FlexNPU needs " +
                           std::to_string(PJRT_API_MAJOR) + ".x with x >= " +
                           std::to_string(kMinInnerApiMinor));
  }
  std::shared_ptr<const PhysicalBackend> backend(new PhysicalBackend(path, api));
  if (backend->HasSlot(offsetof(PJRT_Api, PJRT_Plugin_Initialize))) {
    PJRT_Plugin_Initialize_Args init_args{};
    init_args.struct_size = PJRT_Plugin_Initialize_Args_STRUCT_SIZE;
    FLEXNPU_RETURN_IF_ERROR(backend->Consume(api->PJRT_Plugin_Initialize(&init_args),
                                             "PJRT_Plugin_Initialize"));
  }
  loaded.emplace(path, backend);
  return backend;
}

std::shared_ptr<const PhysicalBackend> PhysicalBackend::FromApi(const PJRT_Api* api,
                                                                std::string name) {
  return std::shared_ptr<const PhysicalBackend>(new PhysicalBackend(std::move(name), api));
}

#define FLEXNPU_DEFINE_DELETER(Handle, Fn, field)        \
  template <>                                          \
  void InnerDeleter<Handle>::operator()(Handle* h) const { \
    Fn##_Args args{};                                  \
    args.struct_size = Fn##_Args_STRUCT_SIZE;          \
    args.field = h;                                    \
    (void)backend->Consume(backend->api()->Fn(&args), #Fn); \
  }

FLEXNPU_DEFINE_DELETER(PJRT_Client, PJRT_Client_Destroy, client)
FLEXNPU_DEFINE_DELETER(PJRT_Buffer, PJRT_Buffer_Destroy, buffer)
FLEXNPU_DEFINE_DELETER(PJRT_Event, PJRT_Event_Destroy, event)
FLEXNPU_DEFINE_DELETER(PJRT_Executable, PJRT_Executable_Destroy, executable)
FLEXNPU_DEFINE_DELETER(PJRT_LoadedExecutable, PJRT_LoadedExecutable_Destroy, executable)

#undef FLEXNPU_DEFINE_DELETER

}  // namespace flexnpu
