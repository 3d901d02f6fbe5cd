// Helpers shared by the C API entry points: argument checks, handle resolution, exception
// containment and forwarding of calls whose arguments only differ by one handle.
#ifndef FLEXNPU_C_API_COMMON_H_
#define FLEXNPU_C_API_COMMON_H_

#include <cxxabi.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <exception>
#include <string>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/c_api/error.h"
#include "pjrt_flexnpu/runtime/handles.h"

namespace flexnpu::c_api {

// Runs `body` (returning Status) so that no C++ exception crosses the C boundary. A forced
// unwind (pthread_exit or pthread_cancel of the calling thread, e.g. inside a callback the body
// runs) is not an error: it must go on, or glibc aborts with "FATAL: exception not rethrown".
template <typename Body>
FLEXNPU_RETHROWS_FORCED_UNWIND PJRT_Error* Guard(const char* where, Body&& body) {
  try {
    return ToPjrtError(body());
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (const std::exception& e) {
    return ToPjrtError(Internal(std::string(where) + ": " + e.what()));
  } catch (...) {
    return ToPjrtError(Internal(std::string(where) + ": unknown C++ exception"));
  }
}

}  // namespace flexnpu::c_api

// Checks that `args` is non-null and large enough to hold `last_field` (">=", never "==":
// callers built against newer headers pass larger structs).
#define FLEXNPU_CHECK_ARGS(Fn, last_field)                                                  \
  do {                                                                                      \
    if (args == nullptr) return ::flexnpu::InvalidArgument(#Fn ": args is null");           \
    if (args->struct_size < offsetof(Fn##_Args, last_field) + sizeof(args->last_field)) {  \
      return ::flexnpu::InvalidArgument(#Fn ": args struct_size " +                         \
                                        std::to_string(args->struct_size) + " is too small"); \
    }                                                                                       \
  } while (0)

// True when the caller's `args` (of type Fn##_Args) is large enough to hold `field`: write
// optional outputs only then.
#define FLEXNPU_HAS_FIELD(Fn, field) \
  (args->struct_size >= offsetof(Fn##_Args, field) + sizeof(args->field))

// Declares `var` as the FlexNPU object behind `handle`, or returns INVALID_ARGUMENT.
#define FLEXNPU_RESOLVE(var, Type, handle, Fn, what)                                          \
  Type* var = ::flexnpu::FromHandle<Type>(handle);                                            \
  if (var == nullptr) {                                                                       \
    return ::flexnpu::InvalidArgument(std::string(#Fn ": ") + what +                          \
                                      " is not a FlexNPU handle (null, foreign or destroyed)"); \
  }

// Calls inner `Fn` with the caller's arguments, `handle_field` swapped for `inner_handle`,
// and copies the results back within the caller's struct size.
#define FLEXNPU_FORWARD(backend, Fn, handle_field, inner_handle)          \
  [&]() -> ::flexnpu::Status {                                            \
    Fn##_Args inner_args{};                                               \
    const size_t n = std::min(args->struct_size, sizeof(inner_args));     \
    std::memcpy(&inner_args, args, n);                                    \
    inner_args.struct_size = Fn##_Args_STRUCT_SIZE;                       \
    inner_args.handle_field = inner_handle;                               \
    ::flexnpu::Status s = FLEXNPU_INNER_CALL(backend, Fn, &inner_args);   \
    if (!s.ok()) return s;                                                \
    const size_t caller_size = args->struct_size;                         \
    auto caller_handle = args->handle_field;                              \
    std::memcpy(args, &inner_args, n);                                    \
    args->struct_size = caller_size;                                      \
    args->handle_field = caller_handle;                                   \
    return s;                                                             \
  }()

#endif  // FLEXNPU_C_API_COMMON_H_
