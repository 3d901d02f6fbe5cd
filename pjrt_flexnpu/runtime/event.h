// Events JAX waits on: a wrapped inner event, or one that is ready from the start.
#ifndef FLEXNPU_RUNTIME_EVENT_H_
#define FLEXNPU_RUNTIME_EVENT_H_

#include <atomic>
#include <cstdint>
#include <memory>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/placement/placement.h"
#include "pjrt_flexnpu/runtime/handles.h"

namespace flexnpu {

// An execution of the passthrough fast path, which tracks no completion of its own: the event
// the caller asked for tells the placement core when it ended (its busy time).
struct CompletionNote {
  std::shared_ptr<placement::Core> core;  // null: nothing to note
  int virtual_device = -1;
  int physical_device = -1;
  int64_t start_ns = 0;
  // core->PassthroughFinished(..., now).
  void Finished() const;
};

class Event : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kEvent;
  FLEXNPU_POOLED_HANDLE
  static Event* Ready(Status status) { return new Event(nullptr, InnerEvent(), std::move(status)); }
  static Event* Wrap(const PhysicalBackend& backend, PJRT_Event* inner,
                     CompletionNote note = {}) {
    return new Event(&backend, Own(backend, inner), Status::Ok(), std::move(note));
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
  Event(const PhysicalBackend* backend, InnerEvent inner, Status status,
        CompletionNote note = {})
      : Tagged(kTag, kPooled), backend_(backend), inner_(std::move(inner)),
        status_(std::move(status)), note_(std::move(note)), note_pending_(note_.core != nullptr) {}
  // The note, to the first caller that sees the event complete; empty afterwards.
  CompletionNote TakeNote() const;
  const PhysicalBackend* backend_;
  InnerEvent inner_;
  Status status_;
  mutable CompletionNote note_;
  mutable std::atomic<bool> note_pending_;
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_EVENT_H_
