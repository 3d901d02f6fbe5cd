// The list of C API entry points FlexNPU implements, and their declarations (implementations
// live in the family files of this folder, stubs in api.cc).
#ifndef FLEXNPU_C_API_ENTRY_POINTS_H_
#define FLEXNPU_C_API_ENTRY_POINTS_H_

#include <string>

#include "pjrt_flexnpu/c_api/common.h"

namespace flexnpu::c_api {

// PJRT_Error_Destroy and PJRT_Error_Message return nothing: outside the list below.
void Error_Destroy(PJRT_Error_Destroy_Args* args);
void Error_Message(PJRT_Error_Message_Args* args);

// Every other slot FlexNPU implements, once: X(Name) is PJRT_Name, implemented by
// `PJRT_Error* Name(PJRT_Name_Args*)` in this folder. It declares them below and fills the
// PJRT_Api table (api.cc); the slots FlexNPU refuses are api.cc's FLEXNPU_STUBBED_SLOTS.
#define FLEXNPU_ENTRY_POINTS(X) \
  X(Error_GetCode) \
  X(Plugin_Initialize) X(Plugin_Attributes) \
  X(Event_Destroy) X(Event_IsReady) X(Event_Error) X(Event_Await) X(Event_OnReady) \
  X(Client_Create) X(Client_Destroy) X(Client_PlatformName) X(Client_ProcessIndex) \
  X(Client_PlatformVersion) X(Client_Devices) X(Client_AddressableDevices) X(Client_LookupDevice) \
  X(Client_LookupAddressableDevice) X(Client_AddressableMemories) X(Client_Compile) \
  X(Client_DefaultDeviceAssignment) X(Client_BufferFromHostBuffer) X(Client_TopologyDescription) \
  X(DeviceDescription_Id) X(DeviceDescription_ProcessIndex) X(DeviceDescription_Attributes) \
  X(DeviceDescription_Kind) X(DeviceDescription_DebugString) X(DeviceDescription_ToString) \
  X(Device_GetDescription) X(Device_IsAddressable) X(Device_LocalHardwareId) \
  X(Device_AddressableMemories) X(Device_DefaultMemory) X(Device_MemoryStats) \
  X(Memory_Id) X(Memory_Kind) X(Memory_Kind_Id) X(Memory_DebugString) X(Memory_ToString) \
  X(Memory_AddressableByDevices) \
  X(Executable_Destroy) X(Executable_Name) X(Executable_NumReplicas) X(Executable_NumPartitions) \
  X(Executable_NumOutputs) X(Executable_SizeOfGeneratedCodeInBytes) X(Executable_GetCostAnalysis) \
  X(Executable_OutputMemoryKinds) X(Executable_OptimizedProgram) X(Executable_OutputElementTypes) \
  X(Executable_OutputDimensions) X(Executable_Fingerprint) X(Executable_GetCompiledMemoryStats) \
  X(LoadedExecutable_Destroy) X(LoadedExecutable_GetExecutable) \
  X(LoadedExecutable_AddressableDevices) X(LoadedExecutable_Delete) X(LoadedExecutable_IsDeleted) \
  X(LoadedExecutable_Execute) X(LoadedExecutable_Fingerprint) \
  X(LoadedExecutable_GetDeviceAssignment) \
  X(Buffer_Destroy) X(Buffer_ElementType) X(Buffer_Dimensions) X(Buffer_UnpaddedDimensions) \
  X(Buffer_DynamicDimensionIndices) X(Buffer_GetMemoryLayout) X(Buffer_OnDeviceSizeInBytes) \
  X(Buffer_Device) X(Buffer_Memory) X(Buffer_Delete) X(Buffer_IsDeleted) X(Buffer_CopyToDevice) \
  X(Buffer_CopyToMemory) X(Buffer_ToHostBuffer) X(Buffer_IsOnCpu) X(Buffer_ReadyEvent) \
  X(Buffer_UnsafePointer) X(Buffer_IncreaseExternalReferenceCount) \
  X(Buffer_DecreaseExternalReferenceCount) X(Buffer_OpaqueDeviceMemoryDataPointer) \
  X(Buffer_CopyRawToHost) \
  X(TopologyDescription_PlatformName) X(TopologyDescription_PlatformVersion) \
  X(TopologyDescription_GetDeviceDescriptions) X(TopologyDescription_Attributes) \
  X(TopologyDescription_Destroy) X(TopologyDescription_Serialize) \
  X(Executable_Serialize) X(Executable_DeserializeAndLoad) \
  X(ExecuteContext_Create) X(ExecuteContext_Destroy)

#define FLEXNPU_DECLARE_ENTRY_POINT(Name) PJRT_Error* Name(PJRT_##Name##_Args* args);
FLEXNPU_ENTRY_POINTS(FLEXNPU_DECLARE_ENTRY_POINT)
#undef FLEXNPU_DECLARE_ENTRY_POINT

// All live clients' state as a JSON array (for flexnpu stats).
std::string StatsJsonOfAllClients();
// Switches the placement policy of all live clients; returns an error message, or "".
std::string SetPolicyOfAllClients(const std::string& policy);
// Starts (clearing earlier events) or stops the timeline of all live clients.
void SetTracingOfAllClients(bool on);
// The timeline of the index-th live client as Chrome trace JSON; "" when there is none.
std::string TraceJsonOfClient(int index);

}  // namespace flexnpu::c_api

#endif  // FLEXNPU_C_API_ENTRY_POINTS_H_
