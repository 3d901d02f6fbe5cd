// The plugin's own slots (its errors: backend/own_api.h), events (timeline.h) and execute
// contexts.
#include <cstdlib>

#include "pjrt_flexnpu/backend/emulated/entry_points.h"
#include "pjrt_flexnpu/backend/emulated/handles.h"
#include "pjrt_flexnpu/backend/emulated/timeline.h"

namespace flexnpu::emulated {
namespace {

EventState& StateOf(PJRT_Event* event) { return *From<EventHandle>(event)->state; }

// The compiler, if it is loaded or can be (attributes and execute contexts are its).
StatusOr<std::shared_ptr<const PhysicalBackend>> CompilerIfAny() {
  auto cpu = CpuCompiler("");
  if (cpu.ok()) return cpu;
  if (const char* env = std::getenv("FLEXNPU_CPU_PLUGIN_PATH")) return CpuCompiler(env);
  return cpu;
}

}  // namespace

PJRT_Error* Plugin_Initialize(PJRT_Plugin_Initialize_Args*) { return nullptr; }
// The compiler's (StableHLO versions: what JAX may serialize programs as), when it is known.
PJRT_Error* Plugin_Attributes(PJRT_Plugin_Attributes_Args* a) {
  a->attributes = nullptr;
  a->num_attributes = 0;
  auto cpu = CompilerIfAny();
  if (!cpu.ok()) return nullptr;
  auto attributes = (*cpu)->PluginAttributes();
  if (!attributes.ok()) return nullptr;
  a->attributes = attributes->data;
  a->num_attributes = attributes->size;
  return nullptr;
}

PJRT_Error* Event_Destroy(PJRT_Event_Destroy_Args* a) {
  delete From<EventHandle>(a->event);
  return nullptr;
}
PJRT_Error* Event_IsReady(PJRT_Event_IsReady_Args* a) {
  a->is_ready = IsReady(StateOf(a->event));
  return nullptr;
}
PJRT_Error* Event_Error(PJRT_Event_Error_Args* a) {
  if (!IsReady(StateOf(a->event))) {
    return ToError(FailedPrecondition("PJRT_Event_Error: the event is not ready"));
  }
  return nullptr;
}
PJRT_Error* Event_Await(PJRT_Event_Await_Args* a) {
  AwaitReady(StateOf(a->event));
  return nullptr;
}
PJRT_Error* Event_OnReady(PJRT_Event_OnReady_Args* a) {
  OnReady(From<EventHandle>(a->event)->state, a->callback, a->user_arg);
  return nullptr;
}

// Execute contexts carry FFI user data for the handlers a program calls: the compiler's own,
// which its FFI extension (forwarded, emulated_backend.cc) fills. Executions ignore them.
PJRT_Error* ExecuteContext_Create(PJRT_ExecuteContext_Create_Args* a) {
  return Run([&]() -> Status {
    FLEXNPU_ASSIGN_OR_RETURN(auto cpu, CompilerIfAny());
    return FLEXNPU_INNER_CALL(*cpu, PJRT_ExecuteContext_Create, a);
  });
}
PJRT_Error* ExecuteContext_Destroy(PJRT_ExecuteContext_Destroy_Args* a) {
  return Run([&]() -> Status {
    FLEXNPU_ASSIGN_OR_RETURN(auto cpu, CompilerIfAny());
    return FLEXNPU_INNER_CALL(*cpu, PJRT_ExecuteContext_Destroy, a);
  });
}

}  // namespace flexnpu::emulated
