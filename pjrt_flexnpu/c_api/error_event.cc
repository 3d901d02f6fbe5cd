// PJRT_Error_*, PJRT_Event_* and PJRT_Plugin_* entry points.
#include "pjrt_flexnpu/c_api/entry_points.h"
#include "pjrt_flexnpu/runtime/event.h"

namespace flexnpu::c_api {

void Error_Destroy(PJRT_Error_Destroy_Args* args) {
  // JAX calls this with a null error; both null args and null errors are no-ops.
  if (args == nullptr || args->struct_size < PJRT_Error_Destroy_Args_STRUCT_SIZE) return;
  delete args->error;
}

void Error_Message(PJRT_Error_Message_Args* args) {
  // No error can be returned: write whatever output fields the caller's struct has, so it
  // never reads an unset pointer.
  if (args == nullptr) return;
  const bool has_message = FLEXNPU_HAS_FIELD(PJRT_Error_Message, message);
  const bool has_size = FLEXNPU_HAS_FIELD(PJRT_Error_Message, message_size);
  const std::string* message =
      args->struct_size >= offsetof(PJRT_Error_Message_Args, error) + sizeof(args->error) &&
              args->error != nullptr
          ? &args->error->status.message()
          : nullptr;
  if (has_message) args->message = message != nullptr ? message->c_str() : "";
  if (has_size) args->message_size = message != nullptr ? message->size() : 0;
}

PJRT_Error* Error_GetCode(PJRT_Error_GetCode_Args* args) {
  return Guard("PJRT_Error_GetCode", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Error_GetCode, code);
    if (args->error == nullptr) return InvalidArgument("PJRT_Error_GetCode: error is null");
    args->code = static_cast<PJRT_Error_Code>(args->error->status.code());
    return Status::Ok();
  });
}

PJRT_Error* Plugin_Initialize(PJRT_Plugin_Initialize_Args* args) {
  return Guard("PJRT_Plugin_Initialize", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Plugin_Initialize, extension_start);
    return Status::Ok();  // the physical backend is loaded and initialized per client
  });
}

PJRT_Error* Event_Destroy(PJRT_Event_Destroy_Args* args) {
  return Guard("PJRT_Event_Destroy", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Event_Destroy, event);
    FLEXNPU_RESOLVE(event, Event, args->event, PJRT_Event_Destroy, "event");
    delete event;
    return Status::Ok();
  });
}

PJRT_Error* Event_IsReady(PJRT_Event_IsReady_Args* args) {
  return Guard("PJRT_Event_IsReady", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Event_IsReady, is_ready);
    FLEXNPU_RESOLVE(event, Event, args->event, PJRT_Event_IsReady, "event");
    auto ready = event->IsReady();
    if (!ready.ok()) return ready.status();
    args->is_ready = *ready;
    return Status::Ok();
  });
}

PJRT_Error* Event_Error(PJRT_Event_Error_Args* args) {
  return Guard("PJRT_Event_Error", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Event_Error, event);
    FLEXNPU_RESOLVE(event, Event, args->event, PJRT_Event_Error, "event");
    return event->Error();
  });
}

PJRT_Error* Event_Await(PJRT_Event_Await_Args* args) {
  return Guard("PJRT_Event_Await", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Event_Await, event);
    FLEXNPU_RESOLVE(event, Event, args->event, PJRT_Event_Await, "event");
    return event->Await();
  });
}

PJRT_Error* Event_OnReady(PJRT_Event_OnReady_Args* args) {
  return Guard("PJRT_Event_OnReady", [&]() -> Status {
    FLEXNPU_CHECK_ARGS(PJRT_Event_OnReady, user_arg);
    FLEXNPU_RESOLVE(event, Event, args->event, PJRT_Event_OnReady, "event");
    if (args->callback == nullptr) return InvalidArgument("PJRT_Event_OnReady: callback is null");
    return event->OnReady(DeliverOnReady, args->callback, args->user_arg);
  });
}

}  // namespace flexnpu::c_api
