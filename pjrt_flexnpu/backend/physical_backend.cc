#include "pjrt_flexnpu/backend/physical_backend.h"

#include <dlfcn.h>

#include <algorithm>
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

PhysicalBackend::PhysicalBackend(std::string path, const PJRT_Api* api)
    : path_(std::move(path)), api_(api) {
  std::memcpy(&table_, api, std::min<size_t>(api->struct_size, sizeof(table_)));
}

namespace {

Status MissingSlot(const char* name) {
  return Unimplemented(std::string(name) +
                       " is not provided by the physical backend (C API too old)");
}

}  // namespace

// Calls slot `Fn` of the resolved table with `args` (an Fn##_Args whose struct_size is set).
#define FLEXNPU_TYPED_CALL(Fn, args) \
  (table_.Fn == nullptr ? MissingSlot(#Fn) : Consume(table_.Fn(&(args)), #Fn))
// Declares `args` as an Fn##_Args with its struct_size set.
#define FLEXNPU_ARGS(Fn, args) \
  Fn##_Args args{};            \
  args.struct_size = Fn##_Args_STRUCT_SIZE

StatusOr<InnerClient> PhysicalBackend::CreateClient(const PJRT_NamedValue* options,
                                                    size_t num_options) const {
  FLEXNPU_ARGS(PJRT_Client_Create, args);
  args.create_options = options;
  args.num_options = num_options;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Client_Create, args));
  return Own(*this, args.client);
}

StatusOr<std::string_view> PhysicalBackend::PlatformName(PJRT_Client* client) const {
  FLEXNPU_ARGS(PJRT_Client_PlatformName, args);
  args.client = client;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Client_PlatformName, args));
  return std::string_view(args.platform_name, args.platform_name_size);
}

StatusOr<std::string_view> PhysicalBackend::PlatformVersion(PJRT_Client* client) const {
  FLEXNPU_ARGS(PJRT_Client_PlatformVersion, args);
  args.client = client;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Client_PlatformVersion, args));
  return std::string_view(args.platform_version, args.platform_version_size);
}

StatusOr<InnerSpan<PJRT_Device*>> PhysicalBackend::AddressableDevices(PJRT_Client* client) const {
  FLEXNPU_ARGS(PJRT_Client_AddressableDevices, args);
  args.client = client;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Client_AddressableDevices, args));
  return InnerSpan<PJRT_Device*>{args.addressable_devices, args.num_addressable_devices};
}

StatusOr<PJRT_DeviceDescription*> PhysicalBackend::Description(PJRT_Device* device) const {
  FLEXNPU_ARGS(PJRT_Device_GetDescription, args);
  args.device = device;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Device_GetDescription, args));
  return args.device_description;
}

StatusOr<int> PhysicalBackend::DescriptionId(PJRT_DeviceDescription* description) const {
  FLEXNPU_ARGS(PJRT_DeviceDescription_Id, args);
  args.device_description = description;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_DeviceDescription_Id, args));
  return args.id;
}

StatusOr<std::string_view> PhysicalBackend::DescriptionKind(
    PJRT_DeviceDescription* description) const {
  FLEXNPU_ARGS(PJRT_DeviceDescription_Kind, args);
  args.device_description = description;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_DeviceDescription_Kind, args));
  return std::string_view(args.device_kind, args.device_kind_size);
}

StatusOr<int> PhysicalBackend::LocalHardwareId(PJRT_Device* device) const {
  FLEXNPU_ARGS(PJRT_Device_LocalHardwareId, args);
  args.device = device;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Device_LocalHardwareId, args));
  return args.local_hardware_id;
}

StatusOr<InnerSpan<PJRT_Memory*>> PhysicalBackend::AddressableMemories(PJRT_Device* device) const {
  FLEXNPU_ARGS(PJRT_Device_AddressableMemories, args);
  args.device = device;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Device_AddressableMemories, args));
  return InnerSpan<PJRT_Memory*>{args.memories, args.num_memories};
}

StatusOr<PJRT_Memory*> PhysicalBackend::DefaultMemory(PJRT_Device* device) const {
  FLEXNPU_ARGS(PJRT_Device_DefaultMemory, args);
  args.device = device;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Device_DefaultMemory, args));
  return args.memory;
}

StatusOr<int64_t> PhysicalBackend::BytesLimit(PJRT_Device* device) const {
  FLEXNPU_ARGS(PJRT_Device_MemoryStats, args);
  args.device = device;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Device_MemoryStats, args));
  return args.bytes_limit_is_set ? args.bytes_limit : 0;
}

StatusOr<ModelledDeviceTime> PhysicalBackend::ModelledTime(PJRT_Device* device) const {
  const size_t chain_end = offsetof(PJRT_Api, extension_start) + sizeof(api_->extension_start);
  for (const PJRT_Extension_Base* e = api_->struct_size >= chain_end ? api_->extension_start
                                                                     : nullptr;
       e != nullptr; e = e->next) {
    if (ExtensionTypeOf(*e) != kModelledTimeExtensionType || e->struct_size < sizeof(ModelledTimeExtension)) {
      continue;
    }
    ModelledDeviceTime out;
    FLEXNPU_RETURN_IF_ERROR(Consume(
        reinterpret_cast<const ModelledTimeExtension*>(e)->device_time(device, &out),
        "ModelledTimeExtension::device_time"));
    return out;
  }
  return Unimplemented("physical backend '" + path_ + "' does not model device time");
}

StatusOr<std::string_view> PhysicalBackend::MemoryKind(PJRT_Memory* memory) const {
  FLEXNPU_ARGS(PJRT_Memory_Kind, args);
  args.memory = memory;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Memory_Kind, args));
  return std::string_view(args.kind, args.kind_size);
}

StatusOr<int> PhysicalBackend::MemoryKindId(PJRT_Memory* memory) const {
  FLEXNPU_ARGS(PJRT_Memory_Kind_Id, args);
  args.memory = memory;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Memory_Kind_Id, args));
  return args.kind_id;
}

StatusOr<InnerSpan<PJRT_NamedValue>> PhysicalBackend::PluginAttributes() const {
  FLEXNPU_ARGS(PJRT_Plugin_Attributes, args);
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Plugin_Attributes, args));
  return InnerSpan<PJRT_NamedValue>{args.attributes, args.num_attributes};
}

StatusOr<HostTransfer> PhysicalBackend::BufferFromHostBuffer(
    PJRT_Client* client, const PJRT_Client_BufferFromHostBuffer_Args& request,
    PJRT_Memory* memory) const {
  FLEXNPU_ARGS(PJRT_Client_BufferFromHostBuffer, args);
  args.client = client;
  args.data = request.data;
  args.type = request.type;
  args.dims = request.dims;
  args.num_dims = request.num_dims;
  args.byte_strides = request.byte_strides;
  args.num_byte_strides = request.num_byte_strides;
  args.host_buffer_semantics = request.host_buffer_semantics;
  args.memory = memory;
  args.device_layout = request.device_layout;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Client_BufferFromHostBuffer, args));
  return HostTransfer{Own(*this, args.buffer), Own(*this, args.done_with_host_buffer)};
}

Status PhysicalBackend::Await(PJRT_Event* event) const {
  FLEXNPU_ARGS(PJRT_Event_Await, args);
  args.event = event;
  return FLEXNPU_TYPED_CALL(PJRT_Event_Await, args);
}

StatusOr<bool> PhysicalBackend::IsReady(PJRT_Event* event) const {
  FLEXNPU_ARGS(PJRT_Event_IsReady, args);
  args.event = event;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Event_IsReady, args));
  return args.is_ready;
}

Status PhysicalBackend::EventError(PJRT_Event* event) const {
  FLEXNPU_ARGS(PJRT_Event_Error, args);
  args.event = event;
  return FLEXNPU_TYPED_CALL(PJRT_Event_Error, args);
}

bool PhysicalBackend::ErrorIfReady(PJRT_Event* event, const char* where, Status* error) const {
  if (table_.PJRT_Event_IsReady == nullptr || table_.PJRT_Event_Error == nullptr) return false;
  FLEXNPU_ARGS(PJRT_Event_IsReady, ready);
  ready.event = event;
  if (!Consume(table_.PJRT_Event_IsReady(&ready), "PJRT_Event_IsReady").ok() || !ready.is_ready) {
    return false;
  }
  FLEXNPU_ARGS(PJRT_Event_Error, args);
  args.event = event;
  *error = Consume(table_.PJRT_Event_Error(&args), where);
  return true;
}

Status PhysicalBackend::OnReady(PJRT_Event* event, PJRT_Event_OnReadyCallback callback,
                                void* user_arg) const {
  FLEXNPU_ARGS(PJRT_Event_OnReady, args);
  args.event = event;
  args.callback = callback;
  args.user_arg = user_arg;
  return FLEXNPU_TYPED_CALL(PJRT_Event_OnReady, args);
}

StatusOr<BufferMetadata> PhysicalBackend::Metadata(PJRT_Buffer* buffer) const {
  BufferMetadata metadata;
  FLEXNPU_ARGS(PJRT_Buffer_ElementType, type);
  type.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_ElementType, type));
  metadata.element_type = type.type;
  FLEXNPU_ARGS(PJRT_Buffer_Dimensions, dims);
  dims.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_Dimensions, dims));
  metadata.dims.assign(dims.dims, dims.dims + dims.num_dims);
  FLEXNPU_ARGS(PJRT_Buffer_OnDeviceSizeInBytes, size);
  size.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_OnDeviceSizeInBytes, size));
  metadata.on_device_size = static_cast<int64_t>(size.on_device_size_in_bytes);
  return metadata;
}

StatusOr<PJRT_Memory*> PhysicalBackend::Memory(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_Memory, args);
  args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_Memory, args));
  return args.memory;
}

StatusOr<size_t> PhysicalBackend::NumDynamicDims(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_DynamicDimensionIndices, args);
  args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_DynamicDimensionIndices, args));
  return args.num_dynamic_dims;
}

StatusOr<InnerBuffer> PhysicalBackend::CopyToMemory(PJRT_Buffer* buffer,
                                                    PJRT_Memory* memory) const {
  FLEXNPU_ARGS(PJRT_Buffer_CopyToMemory, args);
  args.buffer = buffer;
  args.dst_memory = memory;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_CopyToMemory, args));
  return Own(*this, args.dst_buffer);
}

Status PhysicalBackend::Delete(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_Delete, args);
  args.buffer = buffer;
  return FLEXNPU_TYPED_CALL(PJRT_Buffer_Delete, args);
}

StatusOr<bool> PhysicalBackend::IsDeleted(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_IsDeleted, args);
  args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_IsDeleted, args));
  return args.is_deleted;
}

StatusOr<InnerEvent> PhysicalBackend::ReadyEvent(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_ReadyEvent, args);
  args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_ReadyEvent, args));
  return Own(*this, args.event);
}

StatusOr<void*> PhysicalBackend::OpaqueDeviceMemoryDataPointer(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_OpaqueDeviceMemoryDataPointer, args);
  args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_OpaqueDeviceMemoryDataPointer, args));
  return args.device_memory_ptr;
}

StatusOr<uintptr_t> PhysicalBackend::UnsafePointer(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_UnsafePointer, args);
  args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_UnsafePointer, args));
  return args.buffer_pointer;
}

StatusOr<std::vector<int64_t>> PhysicalBackend::UnpaddedDimensions(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_UnpaddedDimensions, args);
  args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_UnpaddedDimensions, args));
  return std::vector<int64_t>(args.unpadded_dims, args.unpadded_dims + args.num_dims);
}

StatusOr<std::vector<size_t>> PhysicalBackend::DynamicDimensionIndices(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_DynamicDimensionIndices, args);
  args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_DynamicDimensionIndices, args));
  return std::vector<size_t>(args.dynamic_dim_indices,
                             args.dynamic_dim_indices + args.num_dynamic_dims);
}

StatusOr<PJRT_Buffer_MemoryLayout> PhysicalBackend::MemoryLayout(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_GetMemoryLayout, args);
  args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Buffer_GetMemoryLayout, args));
  return args.layout;
}

Status PhysicalBackend::IncreaseExternalReferenceCount(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_IncreaseExternalReferenceCount, args);
  args.buffer = buffer;
  return FLEXNPU_TYPED_CALL(PJRT_Buffer_IncreaseExternalReferenceCount, args);
}

Status PhysicalBackend::DecreaseExternalReferenceCount(PJRT_Buffer* buffer) const {
  FLEXNPU_ARGS(PJRT_Buffer_DecreaseExternalReferenceCount, args);
  args.buffer = buffer;
  return FLEXNPU_TYPED_CALL(PJRT_Buffer_DecreaseExternalReferenceCount, args);
}

StatusOr<InnerLoadedExecutable> PhysicalBackend::Compile(PJRT_Client* client,
                                                         const PJRT_Program* program,
                                                         std::string_view options) const {
  FLEXNPU_ARGS(PJRT_Client_Compile, args);
  args.client = client;
  args.program = program;
  args.compile_options = options.data();
  args.compile_options_size = options.size();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Client_Compile, args));
  return Own(*this, args.executable);
}

StatusOr<InnerExecutable> PhysicalBackend::GetExecutable(
    PJRT_LoadedExecutable* executable) const {
  FLEXNPU_ARGS(PJRT_LoadedExecutable_GetExecutable, args);
  args.loaded_executable = executable;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_LoadedExecutable_GetExecutable, args));
  return Own(*this, args.executable);
}

StatusOr<size_t> PhysicalBackend::NumReplicas(PJRT_Executable* executable) const {
  FLEXNPU_ARGS(PJRT_Executable_NumReplicas, args);
  args.executable = executable;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Executable_NumReplicas, args));
  return args.num_replicas;
}

StatusOr<size_t> PhysicalBackend::NumPartitions(PJRT_Executable* executable) const {
  FLEXNPU_ARGS(PJRT_Executable_NumPartitions, args);
  args.executable = executable;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Executable_NumPartitions, args));
  return args.num_partitions;
}

StatusOr<size_t> PhysicalBackend::NumOutputs(PJRT_Executable* executable) const {
  FLEXNPU_ARGS(PJRT_Executable_NumOutputs, args);
  args.executable = executable;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Executable_NumOutputs, args));
  return args.num_outputs;
}

StatusOr<CompiledMemory> PhysicalBackend::CompiledMemoryStats(PJRT_Executable* executable) const {
  FLEXNPU_ARGS(PJRT_Executable_GetCompiledMemoryStats, args);
  args.executable = executable;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Executable_GetCompiledMemoryStats, args));
  return CompiledMemory{args.output_size_in_bytes, args.temp_size_in_bytes,
                        args.alias_size_in_bytes};
}

StatusOr<std::string> PhysicalBackend::OptimizedProgram(PJRT_Executable* executable) const {
  PJRT_Program program{};
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  FLEXNPU_ARGS(PJRT_Executable_OptimizedProgram, args);
  args.executable = executable;
  args.program = &program;
  // Two calls: the first sizes the program, the second fills it.
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Executable_OptimizedProgram, args));
  std::string code(program.code_size, '\0');
  program.code = code.data();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Executable_OptimizedProgram, args));
  code.resize(program.code_size);
  return code;
}

StatusOr<std::string> PhysicalBackend::Serialize(PJRT_Executable* executable) const {
  FLEXNPU_ARGS(PJRT_Executable_Serialize, args);
  args.executable = executable;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Executable_Serialize, args));
  std::string bytes(args.serialized_bytes, args.serialized_bytes_size);
  if (args.serialized_executable_deleter != nullptr) {
    args.serialized_executable_deleter(args.serialized_executable);
  }
  return bytes;
}

StatusOr<InnerLoadedExecutable> PhysicalBackend::DeserializeAndLoad(
    PJRT_Client* client, std::string_view bytes, std::string_view options) const {
  FLEXNPU_ARGS(PJRT_Executable_DeserializeAndLoad, args);
  args.client = client;
  args.serialized_executable = bytes.data();
  args.serialized_executable_size = bytes.size();
  if (!options.empty()) {
    args.overridden_serialized_compile_options = options.data();
    args.overridden_serialized_compile_options_size = options.size();
  }
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_Executable_DeserializeAndLoad, args));
  return Own(*this, args.loaded_executable);
}

StatusOr<InnerSpan<PJRT_Device*>> PhysicalBackend::AddressableDevices(
    PJRT_LoadedExecutable* executable) const {
  FLEXNPU_ARGS(PJRT_LoadedExecutable_AddressableDevices, args);
  args.executable = executable;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_TYPED_CALL(PJRT_LoadedExecutable_AddressableDevices, args));
  return InnerSpan<PJRT_Device*>{args.addressable_devices, args.num_addressable_devices};
}

Status PhysicalBackend::Execute(const InnerLaunch& launch) const {
  FLEXNPU_ARGS(PJRT_LoadedExecutable_Execute, args);
  args.executable = launch.executable;
  args.options = launch.options;
  args.argument_lists = launch.argument_lists;
  args.num_devices = launch.num_devices;
  args.num_args = launch.num_args;
  args.output_lists = launch.output_lists;
  args.device_complete_events = launch.device_complete_events;
  args.execute_device = launch.execute_device;
  return FLEXNPU_TYPED_CALL(PJRT_LoadedExecutable_Execute, args);
}

Status PhysicalBackend::Delete(PJRT_LoadedExecutable* executable) const {
  FLEXNPU_ARGS(PJRT_LoadedExecutable_Delete, args);
  args.executable = executable;
  return FLEXNPU_TYPED_CALL(PJRT_LoadedExecutable_Delete, args);
}

#undef FLEXNPU_ARGS
#undef FLEXNPU_TYPED_CALL

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
