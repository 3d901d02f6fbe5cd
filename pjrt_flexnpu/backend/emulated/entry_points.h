// The slots of the emulated PJRT_Api, once (implemented in entry_points_*.cc and execute.cc,
// one file per family: plugin and events; client, device and memory; buffer; executable; the
// error slots are backend/own_api.h's; the table is built in emulated_backend.cc). Slots not
// listed stay null, as in a plugin that lacks them.
#ifndef FLEXNPU_BACKEND_EMULATED_ENTRY_POINTS_H_
#define FLEXNPU_BACKEND_EMULATED_ENTRY_POINTS_H_

#include <memory>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"
#include "xla_passes/roofline.h"

namespace flexnpu::emulated {

// X(Name) is PJRT_Name, implemented by `PJRT_Error* Name(PJRT_Name_Args*)`.
#define FLEXNPU_EMULATED_ENTRY_POINTS(X) \
  X(Plugin_Initialize) X(Plugin_Attributes) \
  X(Event_Destroy) X(Event_IsReady) X(Event_Error) X(Event_Await) X(Event_OnReady) \
  X(Client_Create) X(Client_Destroy) X(Client_PlatformName) X(Client_PlatformVersion) \
  X(Client_ProcessIndex) X(Client_Devices) X(Client_AddressableDevices) \
  X(Client_LookupDevice) X(Client_LookupAddressableDevice) X(Client_AddressableMemories) \
  X(Client_Compile) X(Client_BufferFromHostBuffer) \
  X(DeviceDescription_Id) X(DeviceDescription_ProcessIndex) X(DeviceDescription_Attributes) \
  X(DeviceDescription_Kind) X(DeviceDescription_DebugString) X(DeviceDescription_ToString) \
  X(Device_GetDescription) X(Device_IsAddressable) X(Device_LocalHardwareId) \
  X(Device_AddressableMemories) X(Device_DefaultMemory) X(Device_MemoryStats) \
  X(Memory_Id) X(Memory_Kind) X(Memory_Kind_Id) X(Memory_DebugString) X(Memory_ToString) \
  X(Memory_AddressableByDevices) \
  X(Executable_Destroy) X(Executable_Name) X(Executable_NumReplicas) \
  X(Executable_NumPartitions) X(Executable_NumOutputs) X(Executable_SizeOfGeneratedCodeInBytes) \
  X(Executable_GetCostAnalysis) X(Executable_OutputMemoryKinds) \
  X(Executable_OptimizedProgram) X(Executable_OutputElementTypes) \
  X(Executable_OutputDimensions) X(Executable_Fingerprint) \
  X(Executable_GetCompiledMemoryStats) X(Executable_Serialize) \
  X(Executable_DeserializeAndLoad) \
  X(LoadedExecutable_Destroy) X(LoadedExecutable_GetExecutable) \
  X(LoadedExecutable_AddressableDevices) X(LoadedExecutable_Delete) \
  X(LoadedExecutable_IsDeleted) X(LoadedExecutable_Execute) X(LoadedExecutable_Fingerprint) \
  X(Buffer_Destroy) X(Buffer_ElementType) X(Buffer_Dimensions) X(Buffer_UnpaddedDimensions) \
  X(Buffer_DynamicDimensionIndices) X(Buffer_GetMemoryLayout) X(Buffer_OnDeviceSizeInBytes) \
  X(Buffer_Device) X(Buffer_Memory) X(Buffer_Delete) X(Buffer_IsDeleted) \
  X(Buffer_CopyToDevice) X(Buffer_CopyToMemory) X(Buffer_ToHostBuffer) \
  X(Buffer_CopyRawToHost) X(Buffer_IsOnCpu) X(Buffer_ReadyEvent) X(Buffer_UnsafePointer) \
  X(Buffer_OpaqueDeviceMemoryDataPointer) X(Buffer_IncreaseExternalReferenceCount) \
  X(Buffer_DecreaseExternalReferenceCount) \
  X(ExecuteContext_Create) X(ExecuteContext_Destroy)

#define FLEXNPU_DECLARE_EMULATED_ENTRY_POINT(Name) PJRT_Error* Name(PJRT_##Name##_Args* a);
FLEXNPU_EMULATED_ENTRY_POINTS(FLEXNPU_DECLARE_EMULATED_ENTRY_POINT)
#undef FLEXNPU_DECLARE_EMULATED_ENTRY_POINT

// The XLA CPU plugin that compiles programs: loaded from `path` (once per process; another
// path later is an error), or the one loaded already when `path` is empty (FAILED_PRECONDITION
// when there is none yet).
StatusOr<std::shared_ptr<const PhysicalBackend>> CpuCompiler(const std::string& path);

// The preset of the emulated backend this process opened (emulated_backend.cc: one preset per
// process).
StatusOr<xla_passes::DeviceSpec> ProcessPreset();

// The modelled time extension's call (entry_points_client.cc).
PJRT_Error* DeviceTime(PJRT_Device* device, ModelledDeviceTime* out);

}  // namespace flexnpu::emulated

#endif  // FLEXNPU_BACKEND_EMULATED_ENTRY_POINTS_H_
