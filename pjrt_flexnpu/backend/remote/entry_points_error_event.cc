// The plugin's own slots and events (its errors: backend/own_api.h). Events are made ready by
// their connection's reader thread (connection.h), which runs their OnReady callbacks.
#include "pjrt_flexnpu/backend/remote/entry_points.h"
#include "pjrt_flexnpu/backend/remote/handles.h"

namespace flexnpu::remote {

PJRT_Error* Plugin_Initialize(PJRT_Plugin_Initialize_Args*) { return nullptr; }
PJRT_Error* Plugin_Attributes(PJRT_Plugin_Attributes_Args* a) {
  a->attributes = nullptr;
  a->num_attributes = 0;
  return nullptr;
}

PJRT_Error* Event_Destroy(PJRT_Event_Destroy_Args* a) {
  delete From<EventHandle>(a->event);
  return nullptr;
}
PJRT_Error* Event_IsReady(PJRT_Event_IsReady_Args* a) {
  RemoteEvent& e = *From<EventHandle>(a->event)->event;
  std::lock_guard<std::mutex> lock(e.mu);
  a->is_ready = e.ready;
  return nullptr;
}
PJRT_Error* Event_Error(PJRT_Event_Error_Args* a) {
  RemoteEvent& e = *From<EventHandle>(a->event)->event;
  std::lock_guard<std::mutex> lock(e.mu);
  if (!e.ready) return ToError(FailedPrecondition("PJRT_Event_Error: the event is not ready"));
  return ToError(e.status);
}

void AwaitEvent(RemoteEvent& e) {
  Connection::ReleaseReading(e.owner);  // a no-op off its reader thread
  std::unique_lock<std::mutex> lock(e.mu);
  e.cv.wait(lock, [&] { return e.ready; });
}

PJRT_Error* Event_Await(PJRT_Event_Await_Args* a) {
  RemoteEvent& e = *From<EventHandle>(a->event)->event;
  AwaitEvent(e);
  std::lock_guard<std::mutex> lock(e.mu);
  return ToError(e.status);
}

PJRT_Error* Event_OnReady(PJRT_Event_OnReady_Args* a) {
  std::shared_ptr<RemoteEvent> e = From<EventHandle>(a->event)->event;
  Status status;
  {
    std::lock_guard<std::mutex> lock(e->mu);
    if (!e->ready) {
      e->callbacks.emplace_back(a->callback, a->user_arg);
      return nullptr;
    }
    status = e->status;
  }
  a->callback(ToError(status), a->user_arg);
  return nullptr;
}

PJRT_Event* ReadyEvent(Status status) {
  auto e = std::make_shared<RemoteEvent>();
  e->ready = true;
  e->status = std::move(status);
  return To<PJRT_Event>(new EventHandle{std::move(e)});
}

}  // namespace flexnpu::remote
