#include "pjrt_flexnpu/runtime/event.h"

#include <cxxabi.h>

#include <memory>

#include "pjrt_flexnpu/base/forced_unwind.h"
#include "pjrt_flexnpu/base/tsan.h"
#include "pjrt_flexnpu/runtime/placer.h"

namespace flexnpu {
namespace {

// How an inner event's error is named, whichever way it reaches the callback.
constexpr char kInnerEventWhere[] = "PJRT_Event";

struct OnReadyContext {
  const PhysicalBackend* backend;
  Event::Deliver deliver;
  PJRT_Event_OnReadyCallback callback;
  void* user_arg;
  CompletionNote note;
};

// `convert()`, or INTERNAL when even that throws: the callback must run whatever happens.
// Not noexcept: a forced unwind (the thread exits or is cancelled) must pass.
template <typename Convert>
FLEXNPU_RETHROWS_FORCED_UNWIND Status Converted(Convert&& convert) {
  try {
    return convert();
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    return Internal("PJRT_Event: converting the event's error failed");
  }
}

// The inner event's callback, on a backend thread (or inline inside the backend's OnReady).
FLEXNPU_RETHROWS_FORCED_UNWIND void InnerOnReady(PJRT_Error* inner_error, void* arg) {
  FLEXNPU_TSAN_ACQUIRE(arg);
  std::unique_ptr<OnReadyContext, handle_pool::Deleter> context(
      static_cast<OnReadyContext*>(arg));
  const PhysicalBackend* backend = context->backend;
  if (context->note.core != nullptr) context->note.Finished();  // atomics only: cannot throw
  context->deliver(Converted([&] { return backend->Consume(inner_error, kInnerEventWhere); }),
                   context->callback, context->user_arg);
}

}  // namespace

void CompletionNote::Finished() const {
  core->PassthroughFinished(virtual_device, physical_device, start_ns, Placer::NowNs());
}

CompletionNote Event::TakeNote() const {
  if (!note_pending_.load(std::memory_order_relaxed) ||
      !note_pending_.exchange(false, std::memory_order_acq_rel)) {
    return {};
  }
  return std::move(note_);
}

StatusOr<bool> Event::IsReady() const {
  if (!inner_) return true;
  StatusOr<bool> ready = backend_->IsReady(inner_.get());
  if (ready.ok() && *ready) {
    if (CompletionNote note = TakeNote(); note.core != nullptr) note.Finished();
  }
  return ready;
}

Status Event::Error() const {
  if (!inner_) return status_;
  return backend_->EventError(inner_.get());
}

Status Event::Await() const {
  if (!inner_) return status_;
  Status status = backend_->Await(inner_.get());
  if (CompletionNote note = TakeNote(); note.core != nullptr) note.Finished();
  return status;
}

Status Event::OnReady(Deliver deliver, PJRT_Event_OnReadyCallback callback,
                      void* user_arg) const {
  if (!inner_) {
    // Copied before the callback runs, which may destroy this event.
    deliver(Converted([this] { return status_; }), callback, user_arg);
    return Status::Ok();
  }
  // Complete already (small programs on a CPU backend usually are when JAX asks): the callback
  // runs here, as the backend would run it inline, with the error InnerOnReady would pass, and
  // nothing is registered with the backend.
  Status done;
  if (backend_->ErrorIfReady(inner_.get(), kInnerEventWhere, &done)) {
    if (CompletionNote note = TakeNote(); note.core != nullptr) note.Finished();
    deliver(std::move(done), callback, user_arg);  // may destroy this event
    return Status::Ok();
  }
  auto* context = handle_pool::New<OnReadyContext>(
      OnReadyContext{backend_, deliver, callback, user_arg, TakeNote()});
  FLEXNPU_TSAN_RELEASE(context);
  Status status = backend_->OnReady(inner_.get(), InnerOnReady, context);
  if (!status.ok()) handle_pool::Delete(context);
  return status;
}

}  // namespace flexnpu
