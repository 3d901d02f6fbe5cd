#include "pjrt_flexnpu/runtime/host_callback.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "pjrt_flexnpu/runtime/ffi.h"

namespace flexnpu {
namespace {

// The XLA FFI C ABI views (runtime/ffi.h). The version this handler declares: it uses nothing
// newer than FFI 0.1.
constexpr int kDeclaredMajor = 0;
constexpr int kDeclaredMinor = 1;

std::atomic<HostCallbackTrampoline> g_trampoline{nullptr};

void* CallbackError(const xla_ffi::Api* api, int32_t errc, const std::string& message) {
  return xla_ffi::MakeError(api, errc, "flexnpu host callback: " + message);
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
  if (xla_ffi::AnswerMetadata(frame, kDeclaredMajor, kDeclaredMinor, 0)) return nullptr;
  const xla_ffi::Api* api = frame->api;
  if (frame->struct_size < xla_ffi::kCallFrameSize) {
    return CallbackError(api, xla_ffi::kErrorInvalidArgument,
                     "the backend's XLA FFI call frame is " + std::to_string(frame->struct_size) +
                         " bytes, older than FFI 0.1 (" + std::to_string(xla_ffi::kCallFrameSize) +
                         ")");
  }
  if (frame->stage != xla_ffi::kStageExecute) return nullptr;  // registered execute-only
  uint64_t id = 0;
  if (!FindCallbackId(frame->attrs, &id)) {
    return CallbackError(api, xla_ffi::kErrorInvalidArgument,
                     std::string("the custom call has no integer attribute '") +
                         kHostCallbackIdAttribute + "'");
  }
  std::vector<HostCallbackBuffer> args;
  std::vector<HostCallbackBuffer> rets;
  std::string error;
  if (!CollectBuffers(frame->args, xla_ffi::kArgBuffer, "operand", &args, &error) ||
      !CollectBuffers(frame->rets, xla_ffi::kRetBuffer, "result", &rets, &error)) {
    return CallbackError(api, xla_ffi::kErrorInvalidArgument, error);
  }
  HostCallbackTrampoline trampoline = g_trampoline.load(std::memory_order_acquire);
  if (trampoline == nullptr) {
    return CallbackError(api, xla_ffi::kErrorUnknown,
                     "no Python trampoline is installed (flexnpu.host_callbacks.install)");
  }
  char message[4096] = {0};
  const int rc = trampoline(id, static_cast<int64_t>(args.size()), args.data(),
                            static_cast<int64_t>(rets.size()), rets.data(), message,
                            sizeof(message));
  if (rc == 0) return nullptr;
  message[sizeof(message) - 1] = '\0';
  return CallbackError(api, xla_ffi::kErrorUnknown, message[0] != '\0' ? message : "callback failed");
}

extern "C" void* FlexNpuHostCallbackFfiHandler(void* call_frame) {
  // Nothing may unwind into the backend's XLA.
  try {
    return Handle(static_cast<xla_ffi::CallFrame*>(call_frame));
  } catch (...) {
    auto* frame = static_cast<xla_ffi::CallFrame*>(call_frame);
    return CallbackError(frame == nullptr ? nullptr : frame->api, xla_ffi::kErrorUnknown,
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
