#include "pjrt_flexnpu/backend/emulated/emulated_backend.h"

#include <cstdlib>
#include <mutex>

#include "pjrt_flexnpu/backend/emulated/entry_points.h"
#include "pjrt_flexnpu/backend/emulated/handles.h"
#include "pjrt_flexnpu/backend/emulated/timeline.h"
#include "pjrt_flexnpu/backend/modelled_time.h"

namespace flexnpu::emulated {
namespace {

std::mutex g_mu;
std::string g_spec;                             // the process's emulated backend
xla_passes::DeviceSpec g_preset;
std::shared_ptr<const PhysicalBackend> g_cpu;  // the compiler, once loaded

// The FFI extension (xla/pjrt/c/pjrt_c_api_ffi_extension.h): three calls taking one argument
// struct each. The emulated API offers the CPU compiler's, forwarded: FFI targets (LAPACK,
// FlexNPU's host-callback handler) must be registered there for programs using them to
// compile. Its errors become this API's.
using FfiCall = PJRT_Error* (*)(void* args);
struct FfiExtensionLayout {
  PJRT_Extension_Base base;
  FfiCall calls[3];  // type_register, user_data_add, register_handler
};

template <int kCall>
PJRT_Error* ForwardFfi(void* args) {
  return Run([&]() -> Status {
    const char* env = std::getenv("FLEXNPU_CPU_PLUGIN_PATH");
    auto cpu = CpuCompiler("");
    if (!cpu.ok() && env != nullptr) cpu = CpuCompiler(env);
    if (!cpu.ok()) return cpu.status();
    for (const PJRT_Extension_Base* e = (*cpu)->api()->extension_start; e != nullptr;
         e = e->next) {
      if (ExtensionTypeOf(*e) != static_cast<uint32_t>(PJRT_Extension_Type_FFI) ||
          e->struct_size < sizeof(FfiExtensionLayout)) {
        continue;
      }
      const FfiCall call = reinterpret_cast<const FfiExtensionLayout*>(e)->calls[kCall];
      if (call == nullptr) break;
      return (*cpu)->Consume(call(args), "the CPU compiler's FFI extension");
    }
    return Unimplemented("emulated backend: the XLA CPU plugin at " + (*cpu)->path() +
                         " offers no FFI extension");
  });
}

PJRT_Extension_Base* BuildExtensions() {
  static ModelledTimeExtension modelled{};
  modelled.base.struct_size = sizeof(modelled);
  SetExtensionType(modelled.base, kModelledTimeExtensionType);
  modelled.device_time = DeviceTime;
  static FfiExtensionLayout ffi{};
  ffi.base.struct_size = sizeof(ffi);
  ffi.base.type = PJRT_Extension_Type_FFI;
  ffi.base.next = &modelled.base;
  ffi.calls[0] = ForwardFfi<0>;
  ffi.calls[1] = ForwardFfi<1>;
  ffi.calls[2] = ForwardFfi<2>;
  return &ffi.base;
}

PJRT_Api BuildApi() {
  PJRT_Api api = own_api::NewApi();
  api.extension_start = BuildExtensions();
#define FLEXNPU_SET_EMULATED_ENTRY_POINT(Name) api.PJRT_##Name = Name;
  FLEXNPU_EMULATED_ENTRY_POINTS(FLEXNPU_SET_EMULATED_ENTRY_POINT)
#undef FLEXNPU_SET_EMULATED_ENTRY_POINT
  return api;
}

}  // namespace

StatusOr<std::shared_ptr<const PhysicalBackend>> CpuCompiler(const std::string& path) {
  std::lock_guard<std::mutex> lock(g_mu);
  if (path.empty() || (g_cpu != nullptr && g_cpu->path() == path)) {
    if (g_cpu != nullptr) return g_cpu;
    return FailedPrecondition("emulated backend: no XLA CPU plugin loaded yet (set "
                              "FLEXNPU_CPU_PLUGIN_PATH or create option cpu_plugin_path)");
  }
  if (g_cpu != nullptr) {
    return InvalidArgument("emulated backend: this process compiles with the XLA CPU plugin at " +
                           g_cpu->path() + "; cannot switch to " + path);
  }
  auto cpu = PhysicalBackend::Load(path);
  if (!cpu.ok()) {
    return Status(cpu.status().code(),
                  "emulated backend: loading its compiler: " + cpu.status().message());
  }
  g_cpu = *cpu;
  return g_cpu;
}

StatusOr<xla_passes::DeviceSpec> ProcessPreset() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (g_spec.empty()) return FailedPrecondition("emulated backend: no preset opened");
  return g_preset;
}

StatusOr<std::shared_ptr<const PhysicalBackend>> EmulatedBackend(const std::string& spec) {
  FLEXNPU_ASSIGN_OR_RETURN(xla_passes::DeviceSpec preset, PresetOfSpec(spec));
  static const PJRT_Api api = BuildApi();
  static std::shared_ptr<const PhysicalBackend> shared;
  std::lock_guard<std::mutex> lock(g_mu);
  if (!g_spec.empty() && g_preset.name != preset.name) {
    return InvalidArgument("this process already emulates " + g_spec +
                           "; one emulated preset per process (asked for " + spec + ")");
  }
  if (shared == nullptr) {
    g_spec = spec;
    g_preset = preset;
    shared = PhysicalBackend::FromApi(&api, "emulate:" + preset.name);
  }
  return shared;
}

int64_t CpuCompiles(PJRT_Client* client) {
  return From<EmulatedClient>(client)->programs.compiles();
}

int64_t EventReadyNs(PJRT_Event* event) { return From<EventHandle>(event)->state->ready_ns; }

}  // namespace flexnpu::emulated
