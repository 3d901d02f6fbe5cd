// The PJRT_Api table: FlexNPU's entry points, and explicit UNIMPLEMENTED stubs (each with
// its reason) for the slots FlexNPU does not offer.
#include "pjrt_flexnpu/c_api/entry_points.h"
#include "pjrt_flexnpu/c_api/extensions.h"

namespace flexnpu::c_api {
namespace {

// The slots FlexNPU refuses, each with its reason: X(Name, why).
#define FLEXNPU_STUBBED_SLOTS(X) \
  X(Client_CreateViewOfDeviceBuffer, \
    "views of foreign device memory would bypass virtual placement") \
  X(CopyToDeviceStream_Destroy, "cross-host streams are not offered") \
  X(CopyToDeviceStream_AddChunk, "cross-host streams are not offered") \
  X(CopyToDeviceStream_TotalBytes, "cross-host streams are not offered") \
  X(CopyToDeviceStream_GranuleSize, "cross-host streams are not offered") \
  X(CopyToDeviceStream_CurrentBytes, "cross-host streams are not offered") \
  X(TopologyDescription_Create, \
    "ahead-of-time topologies need a client (use PJRT_Client_TopologyDescription)") \
  X(TopologyDescription_Deserialize, \
    "a serialized topology names the virtual devices of a live client (use " \
    "PJRT_Client_TopologyDescription)") \
  X(Compile, "ahead-of-time compilation without a client is not offered") \
  X(AsyncHostToDeviceTransferManager_Destroy, "async host-to-device transfers are not offered") \
  X(AsyncHostToDeviceTransferManager_TransferData, \
    "async host-to-device transfers are not offered") \
  X(AsyncHostToDeviceTransferManager_RetrieveBuffer, \
    "async host-to-device transfers are not offered") \
  X(AsyncHostToDeviceTransferManager_Device, "async host-to-device transfers are not offered") \
  X(AsyncHostToDeviceTransferManager_BufferCount, \
    "async host-to-device transfers are not offered") \
  X(AsyncHostToDeviceTransferManager_BufferSize, "async host-to-device transfers are not offered") \
  X(AsyncHostToDeviceTransferManager_SetBufferError, \
    "async host-to-device transfers are not offered") \
  X(AsyncHostToDeviceTransferManager_AddMetadata, \
    "async host-to-device transfers are not offered") \
  X(Client_CreateBuffersForAsyncHostToDevice, "async host-to-device transfers are not offered") \
  X(Client_DmaMap, "DMA mapping of host memory is not offered") \
  X(Client_DmaUnmap, "DMA mapping of host memory is not offered") \
  X(Client_CreateUninitializedBuffer, "uninitialized buffers are not offered") \
  X(Client_UpdateGlobalProcessInfo, "FlexNPU clients are single-process") \
  X(Client_CreateAliasBuffer, "alias buffers are not offered") \
  X(Client_FulfillAliasBuffer, "alias buffers are not offered")

#define FLEXNPU_DEFINE_STUB(Name, why)                                                     \
  PJRT_Error* Stub_##Name(PJRT_##Name##_Args*) {                                         \
    return ToPjrtError(Unimplemented("PJRT_" #Name " is not supported by FlexNPU: " why)); \
  }
FLEXNPU_STUBBED_SLOTS(FLEXNPU_DEFINE_STUB)
#undef FLEXNPU_DEFINE_STUB

PJRT_Api MakeApi() {
  PJRT_Api api{};
  api.struct_size = PJRT_Api_STRUCT_SIZE;
  api.extension_start = ExtensionChain();  // c_api/extensions.cc: those the backend has
  api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
  api.pjrt_api_version.major_version = PJRT_API_MAJOR;
  api.pjrt_api_version.minor_version = PJRT_API_MINOR;
  api.PJRT_Error_Destroy = Error_Destroy;
  api.PJRT_Error_Message = Error_Message;
#define FLEXNPU_SET_ENTRY_POINT(Name) api.PJRT_##Name = Name;
  FLEXNPU_ENTRY_POINTS(FLEXNPU_SET_ENTRY_POINT)
#undef FLEXNPU_SET_ENTRY_POINT
#define FLEXNPU_SET_STUB(Name, why) api.PJRT_##Name = Stub_##Name;
  FLEXNPU_STUBBED_SLOTS(FLEXNPU_SET_STUB)
#undef FLEXNPU_SET_STUB
  return api;
}

}  // namespace
}  // namespace flexnpu::c_api

extern "C" {

__attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static const PJRT_Api api = flexnpu::c_api::MakeApi();
  return &api;
}

// FlexNPU's own query for Python (flexnpu._native.PluginLibrary): the state of every live client as JSON.
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
