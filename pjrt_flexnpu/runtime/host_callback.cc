#include "pjrt_flexnpu/runtime/host_callback.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "pjrt_flexnpu/runtime/ffi.h"

namespace flexnpu {
namespace {

// The few structs of the XLA FFI C ABI (xla/ffi/api/c_api.h) this handler reads, declared
// here as in FFI 0.1: every field used is in the stable prefix that FFI 0.2 (xla-cpu-pjrt
// 0.0.1), 0.3 (jaxlib 0.10.2) and 0.4 (lammps) share; sizes are checked before use.
namespace xla_ffi {
enum : int32_t { kExtensionMetadata = 1 };
enum : int32_t { kStageExecute = 3 };
enum : int32_t { kArgBuffer = 1, kRetBuffer = 1, kAttrScalar = 3 };
enum : int32_t { kDataTypeS64 = 5, kDataTypeU64 = 9, kDataTypeToken = 17 };
enum : int32_t { kErrorUnknown = 2, kErrorInvalidArgument = 3 };

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
  size_t struct_size;
  ApiVersion api_version;
  uint32_t traits;
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
using ErrorCreateFn = void* (*)(ErrorCreateArgs*);
struct Api {
  size_t struct_size;
  ExtensionBase* extension_start;
  ApiVersion api_version;
  const void* internal_api;
  ErrorCreateFn error_create;  // the first function; every version has it
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
inline constexpr size_t kCallFrameSize = offsetof(CallFrame, attrs) + sizeof(Attrs);
inline constexpr size_t kBufferSize = offsetof(Buffer, dims) + sizeof(int64_t*);
inline constexpr size_t kErrorCreateArgsSize = offsetof(ErrorCreateArgs, errc) + sizeof(int32_t);
inline constexpr size_t kApiSizeWithErrorCreate = offsetof(Api, error_create) + sizeof(ErrorCreateFn);
// The version this handler declares: it uses nothing newer.
inline constexpr int kMajor = 0;
inline constexpr int kMinor = 1;
}  // namespace xla_ffi

std::atomic<HostCallbackTrampoline> g_trampoline{nullptr};

void* MakeError(const xla_ffi::Api* api, int32_t errc, const std::string& message) {
  if (api == nullptr || api->struct_size < xla_ffi::kApiSizeWithErrorCreate ||
      api->error_create == nullptr) {
    return nullptr;  // no way to report: the backend gave no usable API
  }
  std::string text = "flexnpu host callback: " + message;
  xla_ffi::ErrorCreateArgs args{};
  args.struct_size = xla_ffi::kErrorCreateArgsSize;
  args.message = text.c_str();  // XLA copies it
  args.errc = errc;
  return api->error_create(&args);
}

// Answers XLA's registration-time query (a call frame carrying the metadata extension).
bool AnswerMetadata(const xla_ffi::CallFrame* frame) {
  for (const xla_ffi::ExtensionBase* e = frame->extension_start; e != nullptr; e = e->next) {
    if (e->type != xla_ffi::kExtensionMetadata) continue;
    auto* metadata = reinterpret_cast<const xla_ffi::MetadataExtension*>(e)->metadata;
    if (metadata != nullptr) {
      metadata->api_version.major_version = xla_ffi::kMajor;
      metadata->api_version.minor_version = xla_ffi::kMinor;
      metadata->traits = 0;
    }
    return true;
  }
  return false;
}

bool FindCallbackId(const xla_ffi::Attrs& attrs, uint64_t* id) {
  const size_t name_length = std::strlen(kHostCallbackIdAttribute);
  for (int64_t i = 0; i < attrs.size; ++i) {
    const xla_ffi::ByteSpan* name = attrs.names[i];
    if (name == nullptr || name->len != name_length ||
        std::memcmp(name->ptr, kHostCallbackIdAttribute, name_length) != 0) {
      continue;
    }
    if (attrs.types[i] != xla_ffi::kAttrScalar) return false;
    const auto* scalar = static_cast<const xla_ffi::Scalar*>(attrs.attrs[i]);
    if (scalar->dtype == xla_ffi::kDataTypeU64) {
      *id = *static_cast<const uint64_t*>(scalar->value);
    } else if (scalar->dtype == xla_ffi::kDataTypeS64) {
      *id = static_cast<uint64_t>(*static_cast<const int64_t*>(scalar->value));
    } else {
      return false;
    }
    return true;
  }
  return false;
}

// The non-token buffers of `list` (or an error message naming `what`).
bool CollectBuffers(const xla_ffi::List& list, int32_t buffer_type, const char* what,
                    std::vector<HostCallbackBuffer>* out, std::string* error) {
  for (int64_t i = 0; i < list.size; ++i) {
    const auto* buffer = static_cast<const xla_ffi::Buffer*>(list.items[i]);
    if (list.types[i] != buffer_type || buffer == nullptr ||
        buffer->struct_size < xla_ffi::kBufferSize) {
      *error = std::string(what) + " #" + std::to_string(i) + " is not an array buffer";
      return false;
    }
    if (buffer->dtype == xla_ffi::kDataTypeToken) continue;  // ordering only
    out->push_back({buffer->dtype, buffer->data, buffer->rank, buffer->dims});
  }
  return true;
}

void* Handle(xla_ffi::CallFrame* frame) {
  if (frame == nullptr) return nullptr;
  if (AnswerMetadata(frame)) return nullptr;
  const xla_ffi::Api* api = frame->api;
  if (frame->struct_size < xla_ffi::kCallFrameSize) {
    return MakeError(api, xla_ffi::kErrorInvalidArgument,
                     "the backend's XLA FFI call frame is " + std::to_string(frame->struct_size) +
                         " bytes, older than FFI 0.1 (" + std::to_string(xla_ffi::kCallFrameSize) +
                         ")");
  }
  if (frame->stage != xla_ffi::kStageExecute) return nullptr;  // registered execute-only
  uint64_t id = 0;
  if (!FindCallbackId(frame->attrs, &id)) {
    return MakeError(api, xla_ffi::kErrorInvalidArgument,
                     std::string("the custom call has no integer attribute '") +
                         kHostCallbackIdAttribute + "'");
  }
  std::vector<HostCallbackBuffer> args;
  std::vector<HostCallbackBuffer> rets;
  std::string error;
  if (!CollectBuffers(frame->args, xla_ffi::kArgBuffer, "operand", &args, &error) ||
      !CollectBuffers(frame->rets, xla_ffi::kRetBuffer, "result", &rets, &error)) {
    return MakeError(api, xla_ffi::kErrorInvalidArgument, error);
  }
  HostCallbackTrampoline trampoline = g_trampoline.load(std::memory_order_acquire);
  if (trampoline == nullptr) {
    return MakeError(api, xla_ffi::kErrorUnknown,
                     "no Python trampoline is installed (flexnpu.host_callbacks.install)");
  }
  char message[4096] = {0};
  const int rc = trampoline(id, static_cast<int64_t>(args.size()), args.data(),
                            static_cast<int64_t>(rets.size()), rets.data(), message,
                            sizeof(message));
  if (rc == 0) return nullptr;
  message[sizeof(message) - 1] = '\0';
  return MakeError(api, xla_ffi::kErrorUnknown, message[0] != '\0' ? message : "callback failed");
}

extern "C" void* FlexNpuHostCallbackFfiHandler(void* call_frame) {
  // Nothing may unwind into the backend's XLA.
  try {
    return Handle(static_cast<xla_ffi::CallFrame*>(call_frame));
  } catch (...) {
    auto* frame = static_cast<xla_ffi::CallFrame*>(call_frame);
    return MakeError(frame == nullptr ? nullptr : frame->api, xla_ffi::kErrorUnknown,
                     "internal error in FlexNPU's handler");
  }
}

}  // namespace

void* HostCallbackHandler() { return reinterpret_cast<void*>(&FlexNpuHostCallbackFfiHandler); }

Status InstallHostCallbacks(HostCallbackTrampoline trampoline) {
  if (trampoline == nullptr) return InvalidArgument("host callbacks: the trampoline is null");
  g_trampoline.store(trampoline, std::memory_order_release);
  static std::mutex mu;
  static bool registered = false;
  std::lock_guard<std::mutex> lock(mu);
  if (registered) return Status::Ok();
  for (const char* target : kHostCallbackTargets) {
    FfiHandlerRegistration registration;
    registration.target_name = target;
    registration.platform_name = kFlexNpuPlatform;
    registration.handler = HostCallbackHandler();
    FLEXNPU_RETURN_IF_ERROR(RegisterFfiHandler(registration));
  }
  registered = true;
  return Status::Ok();
}

}  // namespace flexnpu
