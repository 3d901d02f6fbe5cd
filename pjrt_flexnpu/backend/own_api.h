// What every PJRT_Api of FlexNPU's own (the daemon client remote/, the emulated accelerators
// emulated/) shares: its PJRT_Error (a Status), the error slots, a slot runner no exception
// leaves, and the casts between handles and the objects behind them.
#ifndef FLEXNPU_BACKEND_OWN_API_H_
#define FLEXNPU_BACKEND_OWN_API_H_

#include <exception>
#include <string>
#include <utility>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::own_api {

struct Error {
  Status status;
};

inline PJRT_Error* ToError(Status status) {
  if (status.ok()) return nullptr;
  return reinterpret_cast<PJRT_Error*>(new Error{std::move(status)});
}

// Runs a slot's body; an exception becomes an INTERNAL error naming `api`.
template <typename F>
PJRT_Error* Run(const char* api, F&& body) {
  try {
    return ToError(body());
  } catch (const std::exception& e) {
    return ToError(Internal(std::string(api) + ": " + e.what()));
  } catch (...) {
    return ToError(Internal(std::string(api) + ": unknown exception"));
  }
}

inline void Error_Destroy(PJRT_Error_Destroy_Args* a) {
  delete reinterpret_cast<Error*>(a->error);
}
inline void Error_Message(PJRT_Error_Message_Args* a) {
  const Status& status = reinterpret_cast<const Error*>(a->error)->status;
  a->message = status.message().data();
  a->message_size = status.message().size();
}
inline PJRT_Error* Error_GetCode(PJRT_Error_GetCode_Args* a) {
  a->code = static_cast<PJRT_Error_Code>(reinterpret_cast<const Error*>(a->error)->status.code());
  return nullptr;
}

// A table of this header's version with the error slots filled; the API adds its own slots.
inline PJRT_Api NewApi() {
  PJRT_Api api{};
  api.struct_size = PJRT_Api_STRUCT_SIZE;
  api.pjrt_api_version.struct_size = PJRT_Api_Version_STRUCT_SIZE;
  api.pjrt_api_version.major_version = PJRT_API_MAJOR;
  api.pjrt_api_version.minor_version = PJRT_API_MINOR;
  api.PJRT_Error_Destroy = Error_Destroy;
  api.PJRT_Error_Message = Error_Message;
  api.PJRT_Error_GetCode = Error_GetCode;
  return api;
}

// The object behind a handle, and the handle of an object.
template <typename T, typename H>
T* From(H* handle) {
  return reinterpret_cast<T*>(handle);
}
template <typename H, typename T>
H* To(T* object) {
  return reinterpret_cast<H*>(object);
}

// Client slots answered from fields every client of FlexNPU's own APIs has (platform_version,
// device_handles, memory_handles): one process whose devices are all addressable.
template <typename Client>
PJRT_Error* ClientPlatformVersion(PJRT_Client_PlatformVersion_Args* a) {
  const Client* c = From<Client>(a->client);
  a->platform_version = c->platform_version.data();
  a->platform_version_size = c->platform_version.size();
  return nullptr;
}
inline PJRT_Error* ClientProcessIndex(PJRT_Client_ProcessIndex_Args* a) {
  a->process_index = 0;
  return nullptr;
}
template <typename Client>
PJRT_Error* ClientDevices(PJRT_Client_Devices_Args* a) {
  const Client* c = From<Client>(a->client);
  a->devices = c->device_handles.data();
  a->num_devices = c->device_handles.size();
  return nullptr;
}
template <typename Client>
PJRT_Error* ClientAddressableDevices(PJRT_Client_AddressableDevices_Args* a) {
  const Client* c = From<Client>(a->client);
  a->addressable_devices = c->device_handles.data();
  a->num_addressable_devices = c->device_handles.size();
  return nullptr;
}
template <typename Client>
PJRT_Error* ClientAddressableMemories(PJRT_Client_AddressableMemories_Args* a) {
  const Client* c = From<Client>(a->client);
  a->addressable_memories = c->memory_handles.data();
  a->num_addressable_memories = c->memory_handles.size();
  return nullptr;
}

}  // namespace flexnpu::own_api

#endif  // FLEXNPU_BACKEND_OWN_API_H_
