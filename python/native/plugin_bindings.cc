// flexnpu._native plugin bindings: FlexNPU's Python side (flexnpu.stats, flexnpu.lowering,
// flexnpu.host_callbacks) calls the FlexNpu_* entry points of pjrt_plugin_flexnpu.so.
//
// They must reach the instance of the plugin JAX loaded (its live clients, FFI registry and
// host-callback trampoline), never this module's own: PluginLibrary dlopens the plugin by the
// path JAX loads it from, which returns that instance (or loads the one JAX will get), and
// resolves the exported C functions there (tools/bazel/pjrt_plugin.lds: GetPjrtApi and FlexNpu_*
// only). The plugin stays loaded for the process: it is never dlclosed.
//
// Each call releases the GIL, as a foreign call does: the plugin takes its own locks, which
// threads running host callbacks hold while they wait for the GIL.
#include <dlfcn.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>

#include "pjrt_flexnpu/runtime/host_callback.h"

namespace nb = nanobind;

namespace flexnpu::python {
namespace {

[[noreturn]] void Raise(PyObject* type, const std::string& message) {
  PyErr_SetString(type, message.c_str());
  throw nb::python_error();
}

std::optional<std::string> ErrorText(const char* error) {
  if (error == nullptr) return std::nullopt;
  return std::string(error);
}

// ---- Host callbacks ------------------------------------------------------------------------

// flexnpu.host_callbacks' runner: (callback_id, args, rets) -> None, or the failure's text as
// UTF-8 bytes; each buffer is (XLA FFI dtype code, data address, shape). Read and replaced
// under the GIL.
PyObject* g_host_callback_runner = nullptr;

nb::list BufferTuples(const HostCallbackBuffer* buffers, int64_t count) {
  nb::list out;
  for (int64_t i = 0; i < count; ++i) {
    const HostCallbackBuffer& buffer = buffers[i];
    nb::list dims;
    for (int64_t d = 0; d < buffer.rank; ++d) dims.append(buffer.dims[d]);
    out.append(nb::make_tuple(buffer.dtype, reinterpret_cast<uintptr_t>(buffer.data),
                              nb::tuple(dims)));
  }
  return out;
}

// The HostCallbackTrampoline installed in the plugin. Nothing may propagate into C: a failure
// is returned as its message.
int RunHostCallback(uint64_t callback_id, int64_t num_args, const HostCallbackBuffer* args,
                    int64_t num_rets, const HostCallbackBuffer* rets, char* error,
                    size_t error_size) {
  nb::gil_scoped_acquire acquire;
  std::string message;
  try {
    nb::object runner = nb::borrow(g_host_callback_runner);
    nb::object failure =
        runner(callback_id, BufferTuples(args, num_args), BufferTuples(rets, num_rets));
    if (failure.is_none()) return 0;
    nb::bytes text = nb::cast<nb::bytes>(failure);
    message.assign(text.c_str(), text.size());
  } catch (nb::python_error& e) {
    message = e.what();
  } catch (const std::exception& e) {
    message = e.what();
  } catch (...) {
    message = "host callback failed";
  }
  if (error != nullptr && error_size > 0) {
    const size_t n = std::min(message.size(), error_size - 1);
    std::memcpy(error, message.data(), n);
    error[n] = '\0';
  }
  return 1;
}

// ---- The plugin library --------------------------------------------------------------------

class PluginLibrary {
 public:
  explicit PluginLibrary(const std::string& path) {
    handle_ = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (handle_ == nullptr) {
      const char* error = ::dlerror();
      Raise(PyExc_OSError, error != nullptr ? error : "dlopen failed: " + path);
    }
  }

  // The state of every live client as JSON ("" when the plugin answers nothing).
  std::string StatsJson() const {
    auto entry = Entry<const char* (*)()>("FlexNpu_StatsJson");
    nb::gil_scoped_release release;
    const char* json = entry();
    return json == nullptr ? std::string() : std::string(json);
  }

  // None, or why a client rejected `policy` (then nothing changed).
  std::optional<std::string> SetPolicy(const std::string& policy) const {
    auto entry = Entry<const char* (*)(const char*)>("FlexNpu_SetPolicy");
    nb::gil_scoped_release release;
    return ErrorText(entry(policy.c_str()));
  }

  void SetTracing(bool on) const {
    auto entry = Entry<void (*)(int)>("FlexNpu_SetTracing");
    nb::gil_scoped_release release;
    entry(on ? 1 : 0);
  }

  // The index-th live client's timeline as Chrome trace JSON ("" when there is no such client).
  std::string TraceJson(int index) const {
    auto entry = Entry<const char* (*)(int)>("FlexNpu_TraceJson");
    nb::gil_scoped_release release;
    const char* json = entry(index);
    return json == nullptr ? std::string() : std::string(json);
  }

  // Installs `runner` behind this module's trampoline; None, or why the plugin refused.
  std::optional<std::string> InstallHostCallbacks(nb::callable runner) const {
    auto entry = Entry<const char* (*)(void*)>("FlexNpu_InstallHostCallbacks");
    PyObject* previous = g_host_callback_runner;
    g_host_callback_runner = runner.release().ptr();
    Py_XDECREF(previous);  // a running callback holds its own reference
    HostCallbackTrampoline trampoline = &RunHostCallback;
    nb::gil_scoped_release release;
    return ErrorText(entry(reinterpret_cast<void*>(trampoline)));
  }

  std::optional<std::string> RegisterFfiHandler(const std::string& target,
                                                const std::string& platform, int api_version,
                                                uintptr_t handler, uint32_t traits) const {
    auto entry = Entry<const char* (*)(const char*, const char*, int, void*, uint32_t)>(
        "FlexNpu_RegisterFfiHandler");
    nb::gil_scoped_release release;
    return ErrorText(entry(target.c_str(), platform.c_str(), api_version,
                           reinterpret_cast<void*>(handler), traits));
  }

  // `type_id` is the address of the XLA_FFI_TypeId the backend's id is written back into.
  std::optional<std::string> RegisterFfiType(const std::string& type_name, uintptr_t type_id,
                                             std::optional<uintptr_t> type_info) const {
    auto entry =
        Entry<const char* (*)(const char*, int64_t*, const void*)>("FlexNpu_RegisterFfiType");
    nb::gil_scoped_release release;
    return ErrorText(entry(type_name.c_str(), reinterpret_cast<int64_t*>(type_id),
                           type_info ? reinterpret_cast<const void*>(*type_info) : nullptr));
  }

  bool FfiTargetRunsEverywhere(const std::string& target) const {
    auto entry = Entry<int (*)(const char*)>("FlexNpu_FfiTargetRunsEverywhere");
    nb::gil_scoped_release release;
    return entry(target.c_str()) != 0;
  }

  // One line per (target, backend): "target\troute\thandler version\tbackend version\tpath".
  std::string FfiRoutes() const {
    auto entry = Entry<const char* (*)()>("FlexNpu_FfiRoutes");
    nb::gil_scoped_release release;
    const char* text = entry();
    return text == nullptr ? std::string() : std::string(text);
  }

 private:
  template <typename Fn>
  Fn Entry(const char* name) const {
    ::dlerror();
    void* symbol = ::dlsym(handle_, name);
    if (symbol == nullptr) {
      const char* error = ::dlerror();
      Raise(PyExc_AttributeError, error != nullptr ? error : name);
    }
    return reinterpret_cast<Fn>(symbol);
  }

  void* handle_ = nullptr;
};

// The pointer a PyCapsule holds (under its own name), as jaxlib hands FFI handlers and types.
uintptr_t CapsulePointer(nb::handle capsule) {
  const char* name = PyCapsule_GetName(capsule.ptr());
  if (name == nullptr && PyErr_Occurred()) throw nb::python_error();
  void* pointer = PyCapsule_GetPointer(capsule.ptr(), name);
  if (pointer == nullptr && PyErr_Occurred()) throw nb::python_error();
  return reinterpret_cast<uintptr_t>(pointer);
}

// A writable view of `size` bytes at `address`: a host callback's operand or result buffer,
// valid only while the callback runs.
nb::object HostCallbackMemory(uintptr_t address, size_t size) {
  PyObject* view = PyMemoryView_FromMemory(reinterpret_cast<char*>(address),
                                           static_cast<Py_ssize_t>(size), PyBUF_WRITE);
  if (view == nullptr) throw nb::python_error();
  return nb::steal(view);
}

}  // namespace

void RegisterPlugin(nb::module_& m) {
  nb::class_<PluginLibrary>(m, "PluginLibrary")
      .def(nb::init<const std::string&>(), nb::arg("path"))
      .def("stats_json", &PluginLibrary::StatsJson)
      .def("set_policy", &PluginLibrary::SetPolicy, nb::arg("policy"))
      .def("set_tracing", &PluginLibrary::SetTracing, nb::arg("on"))
      .def("trace_json", &PluginLibrary::TraceJson, nb::arg("index"))
      .def("install_host_callbacks", &PluginLibrary::InstallHostCallbacks, nb::arg("runner"))
      .def("register_ffi_handler", &PluginLibrary::RegisterFfiHandler, nb::arg("target"),
           nb::arg("platform"), nb::arg("api_version"), nb::arg("handler"), nb::arg("traits"))
      .def("register_ffi_type", &PluginLibrary::RegisterFfiType, nb::arg("type_name"),
           nb::arg("type_id"), nb::arg("type_info").none())
      .def("ffi_target_runs_everywhere", &PluginLibrary::FfiTargetRunsEverywhere,
           nb::arg("target"))
      .def("ffi_routes", &PluginLibrary::FfiRoutes);
  m.def("capsule_pointer", &CapsulePointer, nb::arg("capsule"));
  m.def("host_callback_memory", &HostCallbackMemory, nb::arg("address"), nb::arg("size"));
}

}  // namespace flexnpu::python
