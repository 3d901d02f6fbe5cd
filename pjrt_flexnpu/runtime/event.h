// Events JAX waits on: a wrapped inner event, or one that is ready from the start.
#ifndef FLEXNPU_RUNTIME_EVENT_H_
#define FLEXNPU_RUNTIME_EVENT_H_

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/runtime/handles.h"

namespace flexnpu {

class Event : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kEvent;
  FLEXNPU_POOLED_HANDLE
  static Event* Ready(Status status) { return new Event(nullptr, InnerEvent(), std::move(status)); }
  static Event* Wrap(const PhysicalBackend& backend, PJRT_Event* inner) {
    return new Event(&backend, Own(backend, inner), Status::Ok());
  }

  StatusOr<bool> IsReady() const;
  // The event's own error (after it is ready); OK when it succeeded.
  Status Error() const;
  Status Await() const;
  // How the event's outcome reaches the caller's callback: the C API turns the Status into its
  // PJRT_Error and calls `callback` exactly once, without letting an exception escape.
  using Deliver = void (*)(Status status, PJRT_Event_OnReadyCallback callback, void* user_arg);
  // Calls `deliver` once ready (possibly inline, possibly on a backend thread).
  Status OnReady(Deliver deliver, PJRT_Event_OnReadyCallback callback, void* user_arg) const;

 private:
  Event(const PhysicalBackend* backend, InnerEvent inner, Status status)
      : Tagged(kTag, kPooled), backend_(backend), inner_(std::move(inner)), status_(std::move(status)) {}
  const PhysicalBackend* backend_;
  InnerEvent inner_;
  Status status_;
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_EVENT_H_
