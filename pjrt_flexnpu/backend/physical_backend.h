// The physical side: an inner PJRT plugin loaded with dlopen + GetPjrtApi, the API-version
// gate, inner-error conversion and RAII owners for every inner handle.
#ifndef FLEXNPU_BACKEND_PHYSICAL_BACKEND_H_
#define FLEXNPU_BACKEND_PHYSICAL_BACKEND_H_

#include <cstddef>
#include <cstring>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/runtime/status.h"

namespace flexnpu {

// RAII owners of inner handles: each destroys its handle through the inner API.
class PhysicalBackend;

template <typename Handle>
struct InnerDeleter {
  const PhysicalBackend* backend = nullptr;
  void operator()(Handle* handle) const;
};
template <typename Handle>
using InnerOwned = std::unique_ptr<Handle, InnerDeleter<Handle>>;

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

// What JAX asks of a buffer, read once from the backend.
struct BufferMetadata {
  PJRT_Buffer_Type element_type = PJRT_Buffer_Type_INVALID;
  std::vector<int64_t> dims;
  int64_t on_device_size = 0;
};

// The oldest inner C API minor version FlexNPU drives. Older plugins lack functions the
// forwarding layer relies on (CopyToMemory, memories).
inline constexpr int kMinInnerApiMinor = 40;

class PhysicalBackend {
 public:
  // Loads (once per process and path) the PJRT plugin at `path`. Plugins are never
  // unloaded: most cannot be dlclose'd safely.
  static StatusOr<std::shared_ptr<const PhysicalBackend>> Load(const std::string& path);
  // A backend over an API table that is not a loaded plugin (the daemon client's remote
  // API); `name` stands for the path in messages. `api` must outlive the backend, and its
  // slots are read once, here.
  static std::shared_ptr<const PhysicalBackend> FromApi(const PJRT_Api* api, std::string name);

  const PJRT_Api* api() const { return api_; }
  const std::string& path() const { return path_; }
  int minor_version() const { return api_->pjrt_api_version.minor_version; }

  // True when the inner API table is large enough to hold the slot at `offset` and fills it.
  bool HasSlot(size_t offset) const {
    if (offset + sizeof(void*) > sizeof(table_)) return false;
    void* slot;
    std::memcpy(&slot, reinterpret_cast<const char*>(&table_) + offset, sizeof(slot));
    return slot != nullptr;
  }

  // Converts an inner PJRT_Error (taking ownership) into a Status whose message says where
  // it happened; OK for nullptr. Inline: it runs after every forwarded call.
  Status Consume(PJRT_Error* error, const char* where) const {
    return error == nullptr ? Status() : ConsumeError(error, where);
  }

  // Typed calls over the inner API: the _Args structs are built here, an error comes back as
  // a Status naming the inner function, a slot the inner plugin lacks is UNIMPLEMENTED, and
  // handles it returns are owned. The slots were resolved once, at load (table_).
  // Events.
  Status Await(PJRT_Event* event) const;
  StatusOr<bool> IsReady(PJRT_Event* event) const;
  Status EventError(PJRT_Event* event) const;
  Status OnReady(PJRT_Event* event, PJRT_Event_OnReadyCallback callback, void* user_arg) const;
  // Buffers.
  StatusOr<BufferMetadata> Metadata(PJRT_Buffer* buffer) const;
  StatusOr<PJRT_Memory*> Memory(PJRT_Buffer* buffer) const;
  StatusOr<size_t> NumDynamicDims(PJRT_Buffer* buffer) const;
  StatusOr<InnerOwned<PJRT_Buffer>> CopyToMemory(PJRT_Buffer* buffer, PJRT_Memory* memory) const;
  Status Delete(PJRT_Buffer* buffer) const;
  StatusOr<bool> IsDeleted(PJRT_Buffer* buffer) const;
  StatusOr<InnerOwned<PJRT_Event>> ReadyEvent(PJRT_Buffer* buffer) const;
  Status IncreaseExternalReferenceCount(PJRT_Buffer* buffer) const;
  Status DecreaseExternalReferenceCount(PJRT_Buffer* buffer) const;
  // Executables.
  StatusOr<InnerOwned<PJRT_LoadedExecutable>> Compile(PJRT_Client* client,
                                                      const PJRT_Program* program,
                                                      std::string_view options) const;
  StatusOr<InnerOwned<PJRT_Executable>> GetExecutable(PJRT_LoadedExecutable* executable) const;
  StatusOr<size_t> NumReplicas(PJRT_Executable* executable) const;
  StatusOr<size_t> NumPartitions(PJRT_Executable* executable) const;
  StatusOr<size_t> NumOutputs(PJRT_Executable* executable) const;
  // Bytes of inputs the compiled program aliases to outputs (GetCompiledMemoryStats).
  StatusOr<int64_t> AliasSizeInBytes(PJRT_Executable* executable) const;
  Status AddressableDevices(PJRT_LoadedExecutable* executable, PJRT_Device* const** devices,
                            size_t* num_devices) const;
  // `args` as the inner Execute takes them (struct_size is set here).
  Status Execute(PJRT_LoadedExecutable_Execute_Args* args) const;
  Status Delete(PJRT_LoadedExecutable* executable) const;

 private:
  Status ConsumeError(PJRT_Error* error, const char* where) const;
  PhysicalBackend(std::string path, const PJRT_Api* api);
  std::string path_;
  const PJRT_Api* api_;
  // The inner table as far as it and FlexNPU's header overlap, zero beyond: a missing slot is
  // a null pointer here, whatever the inner plugin's version.
  PJRT_Api table_{};
};

template <typename Handle>
InnerOwned<Handle> Own(const PhysicalBackend& backend, Handle* handle) {
  return InnerOwned<Handle>(handle, InnerDeleter<Handle>{&backend});
}

// Calls inner function `fn` of backend `b` with `args` (struct_size set by the caller) and
// converts any error. Missing slots (an older inner plugin) become UNIMPLEMENTED.
#define FLEXNPU_INNER_CALL(b, fn, args)                                                     \
  ((b).HasSlot(offsetof(PJRT_Api, fn))                                                      \
       ? (b).Consume((b).api()->fn(args), #fn)                                              \
       : ::flexnpu::Unimplemented(std::string(#fn) + " is not provided by the physical " \
                                                      "backend (C API too old)"))

}  // namespace flexnpu

#endif  // FLEXNPU_BACKEND_PHYSICAL_BACKEND_H_
