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
#include "pjrt_flexnpu/backend/modelled_time.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu {

// An int64 create option or attribute named `name` (which must outlive it).
inline PJRT_NamedValue Int64NamedValue(const char* name, int64_t value) {
  PJRT_NamedValue v{};
  v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
  v.name = name;
  v.name_size = std::strlen(name);
  v.type = PJRT_NamedValue_kInt64;
  v.int64_value = value;
  v.value_size = 1;
  return v;
}

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

// A view of `size` elements an inner call returned (valid as long as their owner is).
template <typename T>
struct InnerSpan {
  const T* data = nullptr;
  size_t size = 0;
  const T* begin() const { return data; }
  const T* end() const { return data + size; }
  const T& operator[](size_t i) const { return data[i]; }
};

// A buffer created from host data, and the event after which the host data may be freed
// (null when the backend does not say).
struct HostTransfer {
  InnerOwned<PJRT_Buffer> buffer;
  InnerOwned<PJRT_Event> done_with_host_buffer;
};

// What the compiler says an executable needs on the device.
struct CompiledMemory {
  int64_t output_bytes = 0;
  int64_t temp_bytes = 0;
  int64_t alias_bytes = 0;
};

// One inner execution: n = num_devices argument and output lists, in the inner executable's
// device order; device_complete_events (n, may be null) and execute_device (a portable
// executable's device, else null) as PJRT_LoadedExecutable_Execute takes them.
struct InnerLaunch {
  PJRT_LoadedExecutable* executable = nullptr;
  PJRT_ExecuteOptions* options = nullptr;
  PJRT_Buffer* const* const* argument_lists = nullptr;
  size_t num_devices = 0;
  size_t num_args = 0;
  PJRT_Buffer** const* output_lists = nullptr;
  PJRT_Event** device_complete_events = nullptr;
  PJRT_Device* execute_device = nullptr;
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
  // Clients and devices. Strings and spans point into memory the inner plugin owns.
  StatusOr<InnerOwned<PJRT_Client>> CreateClient(const PJRT_NamedValue* options,
                                                 size_t num_options) const;
  StatusOr<std::string_view> PlatformName(PJRT_Client* client) const;
  StatusOr<std::string_view> PlatformVersion(PJRT_Client* client) const;
  StatusOr<InnerSpan<PJRT_Device*>> AddressableDevices(PJRT_Client* client) const;
  StatusOr<PJRT_DeviceDescription*> Description(PJRT_Device* device) const;
  StatusOr<int> DescriptionId(PJRT_DeviceDescription* description) const;
  StatusOr<std::string_view> DescriptionKind(PJRT_DeviceDescription* description) const;
  StatusOr<int> LocalHardwareId(PJRT_Device* device) const;
  StatusOr<InnerSpan<PJRT_Memory*>> AddressableMemories(PJRT_Device* device) const;
  StatusOr<PJRT_Memory*> DefaultMemory(PJRT_Device* device) const;
  // The device's memory limit in bytes; 0 when the backend does not report one.
  StatusOr<int64_t> BytesLimit(PJRT_Device* device) const;
  // The device time a backend of modelled devices (emulate:<preset>) has modelled on
  // `device`; UNIMPLEMENTED for real devices.
  StatusOr<ModelledDeviceTime> ModelledTime(PJRT_Device* device) const;
  StatusOr<std::string_view> MemoryKind(PJRT_Memory* memory) const;
  StatusOr<int> MemoryKindId(PJRT_Memory* memory) const;
  // The inner plugin's attributes (owned by it, valid for the process).
  StatusOr<InnerSpan<PJRT_NamedValue>> PluginAttributes() const;
  // `request` is the caller's BufferFromHostBuffer; client and memory are the inner ones.
  StatusOr<HostTransfer> BufferFromHostBuffer(PJRT_Client* client,
                                              const PJRT_Client_BufferFromHostBuffer_Args& request,
                                              PJRT_Memory* memory) const;
  // Events.
  Status Await(PJRT_Event* event) const;
  StatusOr<bool> IsReady(PJRT_Event* event) const;
  Status EventError(PJRT_Event* event) const;
  // True, with the event's error in `error` (converted naming `where`, as for the error an
  // OnReady callback gets), when the event has completed; false when it has not, or when the
  // backend cannot say so without OnReady (a slot missing or IsReady failing).
  bool ErrorIfReady(PJRT_Event* event, const char* where, Status* error) const;
  Status OnReady(PJRT_Event* event, PJRT_Event_OnReadyCallback callback, void* user_arg) const;
  // Buffers.
  StatusOr<BufferMetadata> Metadata(PJRT_Buffer* buffer) const;
  StatusOr<PJRT_Memory*> Memory(PJRT_Buffer* buffer) const;
  StatusOr<size_t> NumDynamicDims(PJRT_Buffer* buffer) const;
  StatusOr<InnerOwned<PJRT_Buffer>> CopyToMemory(PJRT_Buffer* buffer, PJRT_Memory* memory) const;
  Status Delete(PJRT_Buffer* buffer) const;
  StatusOr<bool> IsDeleted(PJRT_Buffer* buffer) const;
  StatusOr<InnerOwned<PJRT_Event>> ReadyEvent(PJRT_Buffer* buffer) const;
  StatusOr<void*> OpaqueDeviceMemoryDataPointer(PJRT_Buffer* buffer) const;
  StatusOr<uintptr_t> UnsafePointer(PJRT_Buffer* buffer) const;
  StatusOr<std::vector<int64_t>> UnpaddedDimensions(PJRT_Buffer* buffer) const;
  StatusOr<std::vector<size_t>> DynamicDimensionIndices(PJRT_Buffer* buffer) const;
  // The layout's arrays point into the inner buffer: copy them before it goes.
  StatusOr<PJRT_Buffer_MemoryLayout> MemoryLayout(PJRT_Buffer* buffer) const;
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
  StatusOr<CompiledMemory> CompiledMemoryStats(PJRT_Executable* executable) const;
  // The optimized program (an HloModuleProto for XLA backends).
  StatusOr<std::string> OptimizedProgram(PJRT_Executable* executable) const;
  StatusOr<std::string> Serialize(PJRT_Executable* executable) const;
  // `options` (may be empty: the ones serialized with it) are the compile options to load it
  // with; XLA backends take their debug options (dumps) from them.
  StatusOr<InnerOwned<PJRT_LoadedExecutable>> DeserializeAndLoad(
      PJRT_Client* client, std::string_view bytes, std::string_view options = {}) const;
  StatusOr<InnerSpan<PJRT_Device*>> AddressableDevices(PJRT_LoadedExecutable* executable) const;
  Status Execute(const InnerLaunch& launch) const;
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
