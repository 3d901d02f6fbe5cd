// The slots of the remote PJRT_Api, once (implemented in entry_points_*.cc, one file per
// family: plugin and event, client and device, buffer, executable; the error slots are
// backend/own_api.h's; the table is built in remote_backend.cc). Slots not listed stay null,
// as in a plugin that lacks them.
#ifndef FLEXNPU_BACKEND_REMOTE_ENTRY_POINTS_H_
#define FLEXNPU_BACKEND_REMOTE_ENTRY_POINTS_H_

#include <string>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/remote/connection.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::remote {

// X(Name) is PJRT_Name, implemented by `PJRT_Error* Name(PJRT_Name_Args*)`.
#define FLEXNPU_REMOTE_ENTRY_POINTS(X) \
  X(Plugin_Initialize) X(Plugin_Attributes) \
  X(Event_Destroy) X(Event_IsReady) X(Event_Error) X(Event_Await) X(Event_OnReady) \
  X(Client_Create) X(Client_Destroy) X(Client_PlatformName) X(Client_PlatformVersion) \
  X(Client_ProcessIndex) X(Client_Devices) X(Client_AddressableDevices) \
  X(Client_AddressableMemories) X(Client_Compile) X(Client_BufferFromHostBuffer) \
  X(DeviceDescription_Id) X(DeviceDescription_ProcessIndex) X(DeviceDescription_Attributes) \
  X(DeviceDescription_Kind) X(DeviceDescription_DebugString) X(DeviceDescription_ToString) \
  X(Device_GetDescription) X(Device_IsAddressable) X(Device_LocalHardwareId) \
  X(Device_AddressableMemories) X(Device_DefaultMemory) X(Device_MemoryStats) \
  X(Memory_Id) X(Memory_Kind) X(Memory_Kind_Id) X(Memory_DebugString) X(Memory_ToString) \
  X(Memory_AddressableByDevices) \
  X(Executable_Destroy) X(Executable_NumReplicas) X(Executable_NumPartitions) \
  X(Executable_Name) X(Executable_NumOutputs) X(Executable_OptimizedProgram) \
  X(Executable_GetCompiledMemoryStats) X(Executable_Serialize) \
  X(Executable_DeserializeAndLoad) \
  X(LoadedExecutable_Destroy) X(LoadedExecutable_GetExecutable) \
  X(LoadedExecutable_AddressableDevices) X(LoadedExecutable_Delete) \
  X(LoadedExecutable_IsDeleted) X(LoadedExecutable_Execute) \
  X(Buffer_Destroy) X(Buffer_ElementType) X(Buffer_Dimensions) X(Buffer_UnpaddedDimensions) \
  X(Buffer_DynamicDimensionIndices) X(Buffer_GetMemoryLayout) X(Buffer_OnDeviceSizeInBytes) \
  X(Buffer_Device) X(Buffer_Memory) X(Buffer_Delete) X(Buffer_IsDeleted) \
  X(Buffer_CopyToMemory) X(Buffer_ToHostBuffer) X(Buffer_IsOnCpu) X(Buffer_ReadyEvent) \
  X(ExecuteContext_Create) X(ExecuteContext_Destroy)

#define FLEXNPU_DECLARE_REMOTE_ENTRY_POINT(Name) PJRT_Error* Name(PJRT_##Name##_Args* a);
FLEXNPU_REMOTE_ENTRY_POINTS(FLEXNPU_DECLARE_REMOTE_ENTRY_POINT)
#undef FLEXNPU_DECLARE_REMOTE_ENTRY_POINT

// Waits for `e`; on its connection's reader thread (a callback), another thread takes over
// reading first, so the push it waits for is read.
void AwaitEvent(RemoteEvent& e);

// A new event handle, ready with `status`.
PJRT_Event* ReadyEvent(Status status = Status::Ok());

// The daemon socket of this process's remote backend (remote_backend.cc: one per process).
std::string SocketPath();

}  // namespace flexnpu::remote

#endif  // FLEXNPU_BACKEND_REMOTE_ENTRY_POINTS_H_
