// The PJRT_Api table: FlexNPU's entry points, and explicit UNIMPLEMENTED stubs (each with
// its reason) for the slots FlexNPU does not offer.
#include "pjrt_flexnpu/c_api/entry_points.h"
#include "pjrt_flexnpu/c_api/extensions.h"

namespace flexnpu::c_api {
namespace {

#define FLEXNPU_STUB(Name, why)                                                      \
  PJRT_Error* Stub_##Name(PJRT_##Name##_Args*) {                                   \
    return ToPjrtError(Unimplemented("PJRT_" #Name " is not supported by FlexNPU: " why)); \
  }

FLEXNPU_STUB(Client_CreateViewOfDeviceBuffer, "views of foreign device memory would bypass virtual placement")
FLEXNPU_STUB(CopyToDeviceStream_Destroy, "cross-host streams are not offered")
FLEXNPU_STUB(CopyToDeviceStream_AddChunk, "cross-host streams are not offered")
FLEXNPU_STUB(CopyToDeviceStream_TotalBytes, "cross-host streams are not offered")
FLEXNPU_STUB(CopyToDeviceStream_GranuleSize, "cross-host streams are not offered")
FLEXNPU_STUB(CopyToDeviceStream_CurrentBytes, "cross-host streams are not offered")
FLEXNPU_STUB(TopologyDescription_Create, "ahead-of-time topologies need a client (use PJRT_Client_TopologyDescription)")
FLEXNPU_STUB(TopologyDescription_Serialize, "the virtual topology is not serializable")
FLEXNPU_STUB(TopologyDescription_Deserialize, "the virtual topology is not serializable")
FLEXNPU_STUB(Compile, "ahead-of-time compilation without a client is not offered")
FLEXNPU_STUB(AsyncHostToDeviceTransferManager_Destroy, "async host-to-device transfers are not offered")
FLEXNPU_STUB(AsyncHostToDeviceTransferManager_TransferData, "async host-to-device transfers are not offered")
FLEXNPU_STUB(AsyncHostToDeviceTransferManager_RetrieveBuffer, "async host-to-device transfers are not offered")
FLEXNPU_STUB(AsyncHostToDeviceTransferManager_Device, "async host-to-device transfers are not offered")
FLEXNPU_STUB(AsyncHostToDeviceTransferManager_BufferCount, "async host-to-device transfers are not offered")
FLEXNPU_STUB(AsyncHostToDeviceTransferManager_BufferSize, "async host-to-device transfers are not offered")
FLEXNPU_STUB(AsyncHostToDeviceTransferManager_SetBufferError, "async host-to-device transfers are not offered")
FLEXNPU_STUB(AsyncHostToDeviceTransferManager_AddMetadata, "async host-to-device transfers are not offered")
FLEXNPU_STUB(Client_CreateBuffersForAsyncHostToDevice, "async host-to-device transfers are not offered")
FLEXNPU_STUB(Client_DmaMap, "DMA mapping of host memory is not offered")
FLEXNPU_STUB(Client_DmaUnmap, "DMA mapping of host memory is not offered")
FLEXNPU_STUB(Client_CreateUninitializedBuffer, "uninitialized buffers are not offered")
FLEXNPU_STUB(Client_UpdateGlobalProcessInfo, "FlexNPU clients are single-process")
FLEXNPU_STUB(Client_CreateAliasBuffer, "alias buffers are not offered")
FLEXNPU_STUB(Client_FulfillAliasBuffer, "alias buffers are not offered")
#undef FLEXNPU_STUB

PJRT_Api MakeApi() {
  PJRT_Api api{};
  api.struct_size = PJRT_Api_STRUCT_SIZE;
  api.extension_start = ExtensionChain();  // c_api/extensions.cc: those the backend has
  api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
  api.pjrt_api_version.major_version = PJRT_API_MAJOR;
  api.pjrt_api_version.minor_version = PJRT_API_MINOR;
  api.PJRT_Error_Destroy = Error_Destroy;
  api.PJRT_Error_Message = Error_Message;
  api.PJRT_Error_GetCode = Error_GetCode;
  api.PJRT_Plugin_Initialize = Plugin_Initialize;
  api.PJRT_Plugin_Attributes = Plugin_Attributes;
  api.PJRT_Event_Destroy = Event_Destroy;
  api.PJRT_Event_IsReady = Event_IsReady;
  api.PJRT_Event_Error = Event_Error;
  api.PJRT_Event_Await = Event_Await;
  api.PJRT_Event_OnReady = Event_OnReady;
  api.PJRT_Client_Create = Client_Create;
  api.PJRT_Client_Destroy = Client_Destroy;
  api.PJRT_Client_PlatformName = Client_PlatformName;
  api.PJRT_Client_ProcessIndex = Client_ProcessIndex;
  api.PJRT_Client_PlatformVersion = Client_PlatformVersion;
  api.PJRT_Client_Devices = Client_Devices;
  api.PJRT_Client_AddressableDevices = Client_AddressableDevices;
  api.PJRT_Client_LookupDevice = Client_LookupDevice;
  api.PJRT_Client_LookupAddressableDevice = Client_LookupAddressableDevice;
  api.PJRT_Client_AddressableMemories = Client_AddressableMemories;
  api.PJRT_Client_Compile = Client_Compile;
  api.PJRT_Client_DefaultDeviceAssignment = Client_DefaultDeviceAssignment;
  api.PJRT_Client_BufferFromHostBuffer = Client_BufferFromHostBuffer;
  api.PJRT_Client_TopologyDescription = Client_TopologyDescription;
  api.PJRT_DeviceDescription_Id = DeviceDescription_Id;
  api.PJRT_DeviceDescription_ProcessIndex = DeviceDescription_ProcessIndex;
  api.PJRT_DeviceDescription_Attributes = DeviceDescription_Attributes;
  api.PJRT_DeviceDescription_Kind = DeviceDescription_Kind;
  api.PJRT_DeviceDescription_DebugString = DeviceDescription_DebugString;
  api.PJRT_DeviceDescription_ToString = DeviceDescription_ToString;
  api.PJRT_Device_GetDescription = Device_GetDescription;
  api.PJRT_Device_IsAddressable = Device_IsAddressable;
  api.PJRT_Device_LocalHardwareId = Device_LocalHardwareId;
  api.PJRT_Device_AddressableMemories = Device_AddressableMemories;
  api.PJRT_Device_DefaultMemory = Device_DefaultMemory;
  api.PJRT_Device_MemoryStats = Device_MemoryStats;
  api.PJRT_Memory_Id = Memory_Id;
  api.PJRT_Memory_Kind = Memory_Kind;
  api.PJRT_Memory_Kind_Id = Memory_Kind_Id;
  api.PJRT_Memory_DebugString = Memory_DebugString;
  api.PJRT_Memory_ToString = Memory_ToString;
  api.PJRT_Memory_AddressableByDevices = Memory_AddressableByDevices;
  api.PJRT_Executable_Destroy = Executable_Destroy;
  api.PJRT_Executable_Name = Executable_Name;
  api.PJRT_Executable_NumReplicas = Executable_NumReplicas;
  api.PJRT_Executable_NumPartitions = Executable_NumPartitions;
  api.PJRT_Executable_NumOutputs = Executable_NumOutputs;
  api.PJRT_Executable_SizeOfGeneratedCodeInBytes = Executable_SizeOfGeneratedCodeInBytes;
  api.PJRT_Executable_GetCostAnalysis = Executable_GetCostAnalysis;
  api.PJRT_Executable_OutputMemoryKinds = Executable_OutputMemoryKinds;
  api.PJRT_Executable_OptimizedProgram = Executable_OptimizedProgram;
  api.PJRT_Executable_OutputElementTypes = Executable_OutputElementTypes;
  api.PJRT_Executable_OutputDimensions = Executable_OutputDimensions;
  api.PJRT_Executable_Fingerprint = Executable_Fingerprint;
  api.PJRT_Executable_GetCompiledMemoryStats = Executable_GetCompiledMemoryStats;
  api.PJRT_LoadedExecutable_Destroy = LoadedExecutable_Destroy;
  api.PJRT_LoadedExecutable_GetExecutable = LoadedExecutable_GetExecutable;
  api.PJRT_LoadedExecutable_AddressableDevices = LoadedExecutable_AddressableDevices;
  api.PJRT_LoadedExecutable_Delete = LoadedExecutable_Delete;
  api.PJRT_LoadedExecutable_IsDeleted = LoadedExecutable_IsDeleted;
  api.PJRT_LoadedExecutable_Execute = LoadedExecutable_Execute;
  api.PJRT_LoadedExecutable_Fingerprint = LoadedExecutable_Fingerprint;
  api.PJRT_LoadedExecutable_GetDeviceAssignment = LoadedExecutable_GetDeviceAssignment;
  api.PJRT_Buffer_Destroy = Buffer_Destroy;
  api.PJRT_Buffer_ElementType = Buffer_ElementType;
  api.PJRT_Buffer_Dimensions = Buffer_Dimensions;
  api.PJRT_Buffer_UnpaddedDimensions = Buffer_UnpaddedDimensions;
  api.PJRT_Buffer_DynamicDimensionIndices = Buffer_DynamicDimensionIndices;
  api.PJRT_Buffer_GetMemoryLayout = Buffer_GetMemoryLayout;
  api.PJRT_Buffer_OnDeviceSizeInBytes = Buffer_OnDeviceSizeInBytes;
  api.PJRT_Buffer_Device = Buffer_Device;
  api.PJRT_Buffer_Memory = Buffer_Memory;
  api.PJRT_Buffer_Delete = Buffer_Delete;
  api.PJRT_Buffer_IsDeleted = Buffer_IsDeleted;
  api.PJRT_Buffer_CopyToDevice = Buffer_CopyToDevice;
  api.PJRT_Buffer_CopyToMemory = Buffer_CopyToMemory;
  api.PJRT_Buffer_ToHostBuffer = Buffer_ToHostBuffer;
  api.PJRT_Buffer_IsOnCpu = Buffer_IsOnCpu;
  api.PJRT_Buffer_ReadyEvent = Buffer_ReadyEvent;
  api.PJRT_Buffer_UnsafePointer = Buffer_UnsafePointer;
  api.PJRT_Buffer_IncreaseExternalReferenceCount = Buffer_IncreaseExternalReferenceCount;
  api.PJRT_Buffer_DecreaseExternalReferenceCount = Buffer_DecreaseExternalReferenceCount;
  api.PJRT_Buffer_OpaqueDeviceMemoryDataPointer = Buffer_OpaqueDeviceMemoryDataPointer;
  api.PJRT_Buffer_CopyRawToHost = Buffer_CopyRawToHost;
  api.PJRT_TopologyDescription_PlatformName = TopologyDescription_PlatformName;
  api.PJRT_TopologyDescription_PlatformVersion = TopologyDescription_PlatformVersion;
  api.PJRT_TopologyDescription_GetDeviceDescriptions = TopologyDescription_GetDeviceDescriptions;
  api.PJRT_TopologyDescription_Attributes = TopologyDescription_Attributes;
  api.PJRT_TopologyDescription_Destroy = TopologyDescription_Destroy;
  api.PJRT_Client_CreateViewOfDeviceBuffer = Stub_Client_CreateViewOfDeviceBuffer;
  api.PJRT_CopyToDeviceStream_Destroy = Stub_CopyToDeviceStream_Destroy;
  api.PJRT_CopyToDeviceStream_AddChunk = Stub_CopyToDeviceStream_AddChunk;
  api.PJRT_CopyToDeviceStream_TotalBytes = Stub_CopyToDeviceStream_TotalBytes;
  api.PJRT_CopyToDeviceStream_GranuleSize = Stub_CopyToDeviceStream_GranuleSize;
  api.PJRT_CopyToDeviceStream_CurrentBytes = Stub_CopyToDeviceStream_CurrentBytes;
  api.PJRT_TopologyDescription_Create = Stub_TopologyDescription_Create;
  api.PJRT_TopologyDescription_Serialize = Stub_TopologyDescription_Serialize;
  api.PJRT_TopologyDescription_Deserialize = Stub_TopologyDescription_Deserialize;
  api.PJRT_Compile = Stub_Compile;
  api.PJRT_Executable_Serialize = Executable_Serialize;  // c_api/serialization.cc
  api.PJRT_Executable_DeserializeAndLoad = Executable_DeserializeAndLoad;
  api.PJRT_ExecuteContext_Create = ExecuteContext_Create;  // c_api/extensions.cc
  api.PJRT_ExecuteContext_Destroy = ExecuteContext_Destroy;
  api.PJRT_AsyncHostToDeviceTransferManager_Destroy = Stub_AsyncHostToDeviceTransferManager_Destroy;
  api.PJRT_AsyncHostToDeviceTransferManager_TransferData = Stub_AsyncHostToDeviceTransferManager_TransferData;
  api.PJRT_AsyncHostToDeviceTransferManager_RetrieveBuffer = Stub_AsyncHostToDeviceTransferManager_RetrieveBuffer;
  api.PJRT_AsyncHostToDeviceTransferManager_Device = Stub_AsyncHostToDeviceTransferManager_Device;
  api.PJRT_AsyncHostToDeviceTransferManager_BufferCount = Stub_AsyncHostToDeviceTransferManager_BufferCount;
  api.PJRT_AsyncHostToDeviceTransferManager_BufferSize = Stub_AsyncHostToDeviceTransferManager_BufferSize;
  api.PJRT_AsyncHostToDeviceTransferManager_SetBufferError = Stub_AsyncHostToDeviceTransferManager_SetBufferError;
  api.PJRT_AsyncHostToDeviceTransferManager_AddMetadata = Stub_AsyncHostToDeviceTransferManager_AddMetadata;
  api.PJRT_Client_CreateBuffersForAsyncHostToDevice = Stub_Client_CreateBuffersForAsyncHostToDevice;
  api.PJRT_Client_DmaMap = Stub_Client_DmaMap;
  api.PJRT_Client_DmaUnmap = Stub_Client_DmaUnmap;
  api.PJRT_Client_CreateUninitializedBuffer = Stub_Client_CreateUninitializedBuffer;
  api.PJRT_Client_UpdateGlobalProcessInfo = Stub_Client_UpdateGlobalProcessInfo;
  api.PJRT_Client_CreateAliasBuffer = Stub_Client_CreateAliasBuffer;
  api.PJRT_Client_FulfillAliasBuffer = Stub_Client_FulfillAliasBuffer;
  return api;
}

}  // namespace
}  // namespace flexnpu::c_api

extern "C" {

__attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static const PJRT_Api api = flexnpu::c_api::MakeApi();
  return &api;
}

// FlexNPU's own query for Python (ctypes): the state of every live client as JSON.
// The returned string lives until the next call from the same thread.
__attribute__((visibility("default"))) const char* FlexNpu_StatsJson() {
  thread_local std::string json;
  try {
    json = flexnpu::c_api::StatsJsonOfAllClients();
  } catch (...) {
    json = "[]";
  }
  return json.c_str();
}

// Switches the placement policy of every live client (Python: flexnpu.stats.set_policy).
// Returns nullptr on success, else an error message that lives until the next call.
__attribute__((visibility("default"))) const char* FlexNpu_SetPolicy(const char* policy) {
  thread_local std::string error;
  try {
    error = policy == nullptr ? "policy is null"
                              : flexnpu::c_api::SetPolicyOfAllClients(policy);
  } catch (const std::exception& e) {
    error = e.what();
  }
  return error.empty() ? nullptr : error.c_str();
}

// Starts or stops recording the timeline of every live client (flexnpu.stats.start_trace).
__attribute__((visibility("default"))) void FlexNpu_SetTracing(int on) {
  try {
    flexnpu::c_api::SetTracingOfAllClients(on != 0);
  } catch (...) {
  }
}

// The timeline of the index-th live client as Chrome trace JSON ("" when none); the string
// lives until the next call from the same thread.
__attribute__((visibility("default"))) const char* FlexNpu_TraceJson(int index) {
  thread_local std::string json;
  try {
    json = flexnpu::c_api::TraceJsonOfClient(index);
  } catch (...) {
    json.clear();
  }
  return json.c_str();
}

}  // extern "C"
