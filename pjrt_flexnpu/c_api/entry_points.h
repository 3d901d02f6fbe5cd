// Declarations of every C API entry point (generated list; implementations live in the
// family files of this folder, stubs in api.cc).
#ifndef FLEXNPU_C_API_ENTRY_POINTS_H_
#define FLEXNPU_C_API_ENTRY_POINTS_H_

#include <string>

#include "pjrt_flexnpu/c_api/common.h"

namespace flexnpu::c_api {

void Error_Destroy(PJRT_Error_Destroy_Args* args);
void Error_Message(PJRT_Error_Message_Args* args);
PJRT_Error* Error_GetCode(PJRT_Error_GetCode_Args* args);
PJRT_Error* Plugin_Initialize(PJRT_Plugin_Initialize_Args* args);
PJRT_Error* Plugin_Attributes(PJRT_Plugin_Attributes_Args* args);
PJRT_Error* Event_Destroy(PJRT_Event_Destroy_Args* args);
PJRT_Error* Event_IsReady(PJRT_Event_IsReady_Args* args);
PJRT_Error* Event_Error(PJRT_Event_Error_Args* args);
PJRT_Error* Event_Await(PJRT_Event_Await_Args* args);
PJRT_Error* Event_OnReady(PJRT_Event_OnReady_Args* args);
PJRT_Error* Client_Create(PJRT_Client_Create_Args* args);
PJRT_Error* Client_Destroy(PJRT_Client_Destroy_Args* args);
PJRT_Error* Client_PlatformName(PJRT_Client_PlatformName_Args* args);
PJRT_Error* Client_ProcessIndex(PJRT_Client_ProcessIndex_Args* args);
PJRT_Error* Client_PlatformVersion(PJRT_Client_PlatformVersion_Args* args);
PJRT_Error* Client_Devices(PJRT_Client_Devices_Args* args);
PJRT_Error* Client_AddressableDevices(PJRT_Client_AddressableDevices_Args* args);
PJRT_Error* Client_LookupDevice(PJRT_Client_LookupDevice_Args* args);
PJRT_Error* Client_LookupAddressableDevice(PJRT_Client_LookupAddressableDevice_Args* args);
PJRT_Error* Client_AddressableMemories(PJRT_Client_AddressableMemories_Args* args);
PJRT_Error* Client_Compile(PJRT_Client_Compile_Args* args);
PJRT_Error* Client_DefaultDeviceAssignment(PJRT_Client_DefaultDeviceAssignment_Args* args);
PJRT_Error* Client_BufferFromHostBuffer(PJRT_Client_BufferFromHostBuffer_Args* args);
PJRT_Error* Client_TopologyDescription(PJRT_Client_TopologyDescription_Args* args);
PJRT_Error* DeviceDescription_Id(PJRT_DeviceDescription_Id_Args* args);
PJRT_Error* DeviceDescription_ProcessIndex(PJRT_DeviceDescription_ProcessIndex_Args* args);
PJRT_Error* DeviceDescription_Attributes(PJRT_DeviceDescription_Attributes_Args* args);
PJRT_Error* DeviceDescription_Kind(PJRT_DeviceDescription_Kind_Args* args);
PJRT_Error* DeviceDescription_DebugString(PJRT_DeviceDescription_DebugString_Args* args);
PJRT_Error* DeviceDescription_ToString(PJRT_DeviceDescription_ToString_Args* args);
PJRT_Error* Device_GetDescription(PJRT_Device_GetDescription_Args* args);
PJRT_Error* Device_IsAddressable(PJRT_Device_IsAddressable_Args* args);
PJRT_Error* Device_LocalHardwareId(PJRT_Device_LocalHardwareId_Args* args);
PJRT_Error* Device_AddressableMemories(PJRT_Device_AddressableMemories_Args* args);
PJRT_Error* Device_DefaultMemory(PJRT_Device_DefaultMemory_Args* args);
PJRT_Error* Device_MemoryStats(PJRT_Device_MemoryStats_Args* args);
PJRT_Error* Memory_Id(PJRT_Memory_Id_Args* args);
PJRT_Error* Memory_Kind(PJRT_Memory_Kind_Args* args);
PJRT_Error* Memory_Kind_Id(PJRT_Memory_Kind_Id_Args* args);
PJRT_Error* Memory_DebugString(PJRT_Memory_DebugString_Args* args);
PJRT_Error* Memory_ToString(PJRT_Memory_ToString_Args* args);
PJRT_Error* Memory_AddressableByDevices(PJRT_Memory_AddressableByDevices_Args* args);
PJRT_Error* Executable_Destroy(PJRT_Executable_Destroy_Args* args);
PJRT_Error* Executable_Name(PJRT_Executable_Name_Args* args);
PJRT_Error* Executable_NumReplicas(PJRT_Executable_NumReplicas_Args* args);
PJRT_Error* Executable_NumPartitions(PJRT_Executable_NumPartitions_Args* args);
PJRT_Error* Executable_NumOutputs(PJRT_Executable_NumOutputs_Args* args);
PJRT_Error* Executable_SizeOfGeneratedCodeInBytes(PJRT_Executable_SizeOfGeneratedCodeInBytes_Args* args);
PJRT_Error* Executable_GetCostAnalysis(PJRT_Executable_GetCostAnalysis_Args* args);
PJRT_Error* Executable_OutputMemoryKinds(PJRT_Executable_OutputMemoryKinds_Args* args);
PJRT_Error* Executable_OptimizedProgram(PJRT_Executable_OptimizedProgram_Args* args);
PJRT_Error* Executable_OutputElementTypes(PJRT_Executable_OutputElementTypes_Args* args);
PJRT_Error* Executable_OutputDimensions(PJRT_Executable_OutputDimensions_Args* args);
PJRT_Error* Executable_Fingerprint(PJRT_Executable_Fingerprint_Args* args);
PJRT_Error* Executable_GetCompiledMemoryStats(PJRT_Executable_GetCompiledMemoryStats_Args* args);
PJRT_Error* Executable_Serialize(PJRT_Executable_Serialize_Args* args);
PJRT_Error* Executable_DeserializeAndLoad(PJRT_Executable_DeserializeAndLoad_Args* args);
PJRT_Error* LoadedExecutable_Destroy(PJRT_LoadedExecutable_Destroy_Args* args);
PJRT_Error* LoadedExecutable_GetExecutable(PJRT_LoadedExecutable_GetExecutable_Args* args);
PJRT_Error* LoadedExecutable_AddressableDevices(PJRT_LoadedExecutable_AddressableDevices_Args* args);
PJRT_Error* LoadedExecutable_Delete(PJRT_LoadedExecutable_Delete_Args* args);
PJRT_Error* LoadedExecutable_IsDeleted(PJRT_LoadedExecutable_IsDeleted_Args* args);
PJRT_Error* LoadedExecutable_Execute(PJRT_LoadedExecutable_Execute_Args* args);
PJRT_Error* LoadedExecutable_Fingerprint(PJRT_LoadedExecutable_Fingerprint_Args* args);
PJRT_Error* LoadedExecutable_GetDeviceAssignment(PJRT_LoadedExecutable_GetDeviceAssignment_Args* args);
PJRT_Error* Buffer_Destroy(PJRT_Buffer_Destroy_Args* args);
PJRT_Error* Buffer_ElementType(PJRT_Buffer_ElementType_Args* args);
PJRT_Error* Buffer_Dimensions(PJRT_Buffer_Dimensions_Args* args);
PJRT_Error* Buffer_UnpaddedDimensions(PJRT_Buffer_UnpaddedDimensions_Args* args);
PJRT_Error* Buffer_DynamicDimensionIndices(PJRT_Buffer_DynamicDimensionIndices_Args* args);
PJRT_Error* Buffer_GetMemoryLayout(PJRT_Buffer_GetMemoryLayout_Args* args);
PJRT_Error* Buffer_OnDeviceSizeInBytes(PJRT_Buffer_OnDeviceSizeInBytes_Args* args);
PJRT_Error* Buffer_Device(PJRT_Buffer_Device_Args* args);
PJRT_Error* Buffer_Memory(PJRT_Buffer_Memory_Args* args);
PJRT_Error* Buffer_Delete(PJRT_Buffer_Delete_Args* args);
PJRT_Error* Buffer_IsDeleted(PJRT_Buffer_IsDeleted_Args* args);
PJRT_Error* Buffer_CopyToDevice(PJRT_Buffer_CopyToDevice_Args* args);
PJRT_Error* Buffer_CopyToMemory(PJRT_Buffer_CopyToMemory_Args* args);
PJRT_Error* Buffer_ToHostBuffer(PJRT_Buffer_ToHostBuffer_Args* args);
PJRT_Error* Buffer_IsOnCpu(PJRT_Buffer_IsOnCpu_Args* args);
PJRT_Error* Buffer_ReadyEvent(PJRT_Buffer_ReadyEvent_Args* args);
PJRT_Error* Buffer_UnsafePointer(PJRT_Buffer_UnsafePointer_Args* args);
PJRT_Error* Buffer_IncreaseExternalReferenceCount(PJRT_Buffer_IncreaseExternalReferenceCount_Args* args);
PJRT_Error* Buffer_DecreaseExternalReferenceCount(PJRT_Buffer_DecreaseExternalReferenceCount_Args* args);
PJRT_Error* Buffer_OpaqueDeviceMemoryDataPointer(PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args* args);
PJRT_Error* Buffer_CopyRawToHost(PJRT_Buffer_CopyRawToHost_Args* args);
PJRT_Error* TopologyDescription_PlatformName(PJRT_TopologyDescription_PlatformName_Args* args);
PJRT_Error* TopologyDescription_PlatformVersion(PJRT_TopologyDescription_PlatformVersion_Args* args);
PJRT_Error* TopologyDescription_GetDeviceDescriptions(PJRT_TopologyDescription_GetDeviceDescriptions_Args* args);
PJRT_Error* TopologyDescription_Attributes(PJRT_TopologyDescription_Attributes_Args* args);
PJRT_Error* TopologyDescription_Destroy(PJRT_TopologyDescription_Destroy_Args* args);

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
