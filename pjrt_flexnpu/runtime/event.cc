#include "pjrt_flexnpu/runtime/event.h"

#include <cxxabi.h>

#include <memory>

#include "pjrt_flexnpu/runtime/error.h"
#include "pjrt_flexnpu/runtime/tsan.h"

namespace flexnpu {
namespace {

// How an inner event's error is named, whichever way it reaches the callback.
constexpr char kInnerEventWhere[] = "PJRT_Event";

struct OnReadyContext {
  const PhysicalBackend* backend;
  PJRT_Event_OnReadyCallback callback;
  void* user_arg;
};

// Calls `callback` exactly once with `convert()` as a PJRT_Error (nullptr when OK), whichever
// thread it runs on: a backend thread (InnerOnReady), or the caller's when the event is
// complete already. No exception escapes: thrown into a backend thread it is std::terminate,
// and thrown back through PJRT_Event_OnReady after the callback ran it would tell the caller
// that the callback was never registered (JAX would then free its state a second time). When
// the error cannot be converted or allocated the callback still runs (with an INTERNAL error,
// or with nullptr when nothing can be allocated to report it). Not noexcept: a forced unwind
// (the thread exits or is cancelled inside the caller's callback) must pass.
template <typename Convert>
FLEXNPU_RETHROWS_FORCED_UNWIND void Deliver(PJRT_Event_OnReadyCallback callback, void* user_arg,
                                            Convert&& convert) {
  PJRT_Error* error = nullptr;
  try {
    error = ToPjrtError(convert());
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    try {
      error = ToPjrtError(Internal("PJRT_Event: converting the event's error failed"));
    } catch (abi::__forced_unwind&) {
      throw;
    } catch (...) {
      error = nullptr;
    }
  }
  try {
    callback(error, user_arg);
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    // A C callback that throws anyway: its thread must live on, and it has run.
  }
}

// The inner event's callback, on a backend thread (or inline inside the backend's OnReady).
FLEXNPU_RETHROWS_FORCED_UNWIND void InnerOnReady(PJRT_Error* inner_error, void* arg) {
  FLEXNPU_TSAN_ACQUIRE(arg);
  std::unique_ptr<OnReadyContext, handle_pool::Deleter> context(
      static_cast<OnReadyContext*>(arg));
  const PhysicalBackend* backend = context->backend;
  Deliver(context->callback, context->user_arg,
          [&] { return backend->Consume(inner_error, kInnerEventWhere); });
}

}  // namespace

StatusOr<bool> Event::IsReady() const {
  if (!inner_) return true;
  return backend_->IsReady(inner_.get());
}

Status Event::Error() const {
  if (!inner_) return status_;
  return backend_->EventError(inner_.get());
}

Status Event::Await() const {
  if (!inner_) return status_;
  return backend_->Await(inner_.get());
}

Status Event::OnReady(PJRT_Event_OnReadyCallback callback, void* user_arg) const {
  if (!inner_) {
    // Converted before the callback runs, which may destroy this event.
    Deliver(callback, user_arg, [this] { return status_; });
    return Status::Ok();
  }
  // Complete already (small programs on a CPU backend usually are when JAX asks): the callback
  // runs here, as the backend would run it inline, with the error InnerOnReady would pass, and
  // nothing is registered with the backend.
  Status done;
  if (backend_->ErrorIfReady(inner_.get(), kInnerEventWhere, &done)) {
    Deliver(callback, user_arg, [&done] { return std::move(done); });  // may destroy this event
    return Status::Ok();
  }
  auto* context = handle_pool::New<OnReadyContext>(OnReadyContext{backend_, callback, user_arg});
  FLEXNPU_TSAN_RELEASE(context);
  Status status = backend_->OnReady(inner_.get(), InnerOnReady, context);
  if (!status.ok()) handle_pool::Delete(context);
  return status;
}

}  // namespace flexnpu
