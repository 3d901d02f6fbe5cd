// The physical side: an inner PJRT plugin loaded with dlopen + GetPjrtApi, the API-version
// gate, inner-error conversion and RAII owners for every inner handle.
#ifndef FLEXNPU_BACKEND_PHYSICAL_BACKEND_H_
#define FLEXNPU_BACKEND_PHYSICAL_BACKEND_H_

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/runtime/status.h"

namespace flexnpu {

// The oldest inner C API minor version FlexNPU drives. Older plugins lack functions the
// forwarding layer relies on (CopyToMemory, memories).
inline constexpr int kMinInnerApiMinor = 40;

class PhysicalBackend {
 public:
  // Loads (once per process and path) the PJRT plugin at `path`. Plugins are never
  // unloaded: most cannot be dlclose'd safely.
  static StatusOr<std::shared_ptr<const PhysicalBackend>> Load(const std::string& path);
  // A backend over an API table that is not a loaded plugin (the daemon client's remote
  // API); `name` stands for the path in messages. `api` must outlive the backend.
  static std::shared_ptr<const PhysicalBackend> FromApi(const PJRT_Api* api, std::string name);

  const PJRT_Api* api() const { return api_; }
  const std::string& path() const { return path_; }
  int minor_version() const { return api_->pjrt_api_version.minor_version; }

  // True when the inner API table is large enough to hold the slot at `offset` and fills it.
  bool HasSlot(size_t offset) const {
    if (offset + sizeof(void*) > api_->struct_size) return false;
    void* slot;
    std::memcpy(&slot, reinterpret_cast<const char*>(api_) + offset, sizeof(slot));
    return slot != nullptr;
  }

  // Converts an inner PJRT_Error (taking ownership) into a Status whose message says where
  // it happened; OK for nullptr. Inline: it runs after every forwarded call.
  Status Consume(PJRT_Error* error, const char* where) const {
    return error == nullptr ? Status() : ConsumeError(error, where);
  }

 private:
  Status ConsumeError(PJRT_Error* error, const char* where) const;
  PhysicalBackend(std::string path, const PJRT_Api* api) : path_(std::move(path)), api_(api) {}
  std::string path_;
  const PJRT_Api* api_;
};

// Calls inner function `fn` of backend `b` with `args` (struct_size set by the caller) and
// converts any error. Missing slots (an older inner plugin) become UNIMPLEMENTED.
#define FLEXNPU_INNER_CALL(b, fn, args)                                                     \
  ((b).HasSlot(offsetof(PJRT_Api, fn))                                                      \
       ? (b).Consume((b).api()->fn(args), #fn)                                              \
       : ::flexnpu::Unimplemented(std::string(#fn) + " is not provided by the physical " \
                                                      "backend (C API too old)"))

// RAII owners of inner handles: each destroys its handle through the inner API.
template <typename Handle>
struct InnerDeleter {
  const PhysicalBackend* backend = nullptr;
  void operator()(Handle* handle) const;
};
template <typename Handle>
using InnerOwned = std::unique_ptr<Handle, InnerDeleter<Handle>>;

template <typename Handle>
InnerOwned<Handle> Own(const PhysicalBackend& backend, Handle* handle) {
  return InnerOwned<Handle>(handle, InnerDeleter<Handle>{&backend});
}

template <>
void InnerDeleter<PJRT_Client>::operator()(PJRT_Client*) const;
template <>
void InnerDeleter<PJRT_Buffer>::operator()(PJRT_Buffer*) const;
template <>
void InnerDeleter<PJRT_Event>::operator()(PJRT_Event*) const;
template <>
void InnerDeleter<PJRT_Executable>::operator()(PJRT_Executable*) const;
template <>
void InnerDeleter<PJRT_LoadedExecutable>::operator()(PJRT_LoadedExecutable*) const;

using InnerClient = InnerOwned<PJRT_Client>;
using InnerBuffer = InnerOwned<PJRT_Buffer>;
using InnerEvent = InnerOwned<PJRT_Event>;
using InnerExecutable = InnerOwned<PJRT_Executable>;
using InnerLoadedExecutable = InnerOwned<PJRT_LoadedExecutable>;

}  // namespace flexnpu

#endif  // FLEXNPU_BACKEND_PHYSICAL_BACKEND_H_
