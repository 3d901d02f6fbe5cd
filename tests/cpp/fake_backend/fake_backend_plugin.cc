// A fake physical backend for the C-API tests: the real CPU plugin (FLEXNPU_FAKE_INNER_PLUGIN)
// behind a copy of its PJRT_Api table, altered per build:
//   FLEXNPU_FAKE_MISSING_SLOTS  some slots left empty, as an older or partial plugin has them;
//   FLEXNPU_FAKE_NEWER_MINOR    a minor version one above the header FlexNPU is built with;
//   FLEXNPU_FAKE_FAILING_SIZE   PJRT_Buffer_OnDeviceSizeInBytes fails (after transfers and
//                               executions succeeded), with an error of the fake's own.
//   FLEXNPU_FAKE_SECOND_COMPILE_FAILS  the process's second PJRT_Client_Compile fails (with the
//                               error of the fake's own), every other one is the real plugin's.
#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "pjrt_c_api.h"

namespace {

PJRT_Api fake_api;
const PJRT_Api* real_api = nullptr;

#if defined(FLEXNPU_FAKE_FAILING_SIZE) || defined(FLEXNPU_FAKE_SECOND_COMPILE_FAILS)
// The fake's own error: one static object, recognised by address; the rest go to the real API.
struct FakeError {
} fake_error;
#ifdef FLEXNPU_FAKE_FAILING_SIZE
constexpr char kFakeMessage[] = "fake backend: on-device size unavailable";

PJRT_Error* FailingSize(PJRT_Buffer_OnDeviceSizeInBytes_Args*) {
  return reinterpret_cast<PJRT_Error*>(&fake_error);
}
#else
constexpr char kFakeMessage[] = "fake backend: this compile fails";

std::atomic<int> compiles{0};
PJRT_Error* SecondCompileFails(PJRT_Client_Compile_Args* args) {
  if (compiles.fetch_add(1) == 1) return reinterpret_cast<PJRT_Error*>(&fake_error);
  return real_api->PJRT_Client_Compile(args);
}
#endif
bool IsFake(const PJRT_Error* error) {
  return error == reinterpret_cast<const PJRT_Error*>(&fake_error);
}
void ErrorDestroy(PJRT_Error_Destroy_Args* args) {
  if (!IsFake(args->error)) real_api->PJRT_Error_Destroy(args);
}
void ErrorMessage(PJRT_Error_Message_Args* args) {
  if (!IsFake(args->error)) return real_api->PJRT_Error_Message(args);
  args->message = kFakeMessage;
  args->message_size = sizeof(kFakeMessage) - 1;
}
PJRT_Error* ErrorGetCode(PJRT_Error_GetCode_Args* args) {
  if (!IsFake(args->error)) return real_api->PJRT_Error_GetCode(args);
  args->code = PJRT_Error_Code_UNAVAILABLE;
  return nullptr;
}
#endif

const PJRT_Api* MakeFakeApi() {
  const char* path = std::getenv("FLEXNPU_FAKE_INNER_PLUGIN");
  if (path == nullptr) {
    std::fprintf(stderr, "fake backend: set FLEXNPU_FAKE_INNER_PLUGIN\n");
    return nullptr;
  }
  void* library = dlopen(path, RTLD_NOW | RTLD_LOCAL);
  if (library == nullptr) return nullptr;
  auto get_api = reinterpret_cast<const PJRT_Api* (*)()>(dlsym(library, "GetPjrtApi"));
  if (get_api == nullptr) return nullptr;
  const PJRT_Api* inner = get_api();
  if (inner == nullptr) return nullptr;
  real_api = inner;
  std::memcpy(&fake_api, inner, sizeof(fake_api));
  fake_api.struct_size = sizeof(fake_api);
#ifdef FLEXNPU_FAKE_MISSING_SLOTS
  fake_api.PJRT_Buffer_UnpaddedDimensions = nullptr;
  fake_api.PJRT_Executable_Fingerprint = nullptr;
  fake_api.PJRT_LoadedExecutable_Fingerprint = nullptr;
#endif
#ifdef FLEXNPU_FAKE_SECOND_COMPILE_FAILS
  fake_api.PJRT_Client_Compile = SecondCompileFails;
#endif
#if defined(FLEXNPU_FAKE_FAILING_SIZE) || defined(FLEXNPU_FAKE_SECOND_COMPILE_FAILS)
#ifdef FLEXNPU_FAKE_FAILING_SIZE
  fake_api.PJRT_Buffer_OnDeviceSizeInBytes = FailingSize;
#endif
  fake_api.PJRT_Error_Destroy = ErrorDestroy;
  fake_api.PJRT_Error_Message = ErrorMessage;
  fake_api.PJRT_Error_GetCode = ErrorGetCode;
#endif
#ifdef FLEXNPU_FAKE_NEWER_MINOR
  fake_api.pjrt_api_version.minor_version = PJRT_API_MINOR + 1;
#endif
  return &fake_api;
}

}  // namespace

extern "C" __attribute__((visibility("default"))) const PJRT_Api* GetPjrtApi() {
  static const PJRT_Api* api = MakeFakeApi();
  return api;
}
