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

// Runs on a backend thread, or on the caller's when the event is ready: no exception may
// escape into the backend (std::terminate there), and the caller's callback runs exactly once,
// with an error if the inner one cannot be converted. Not noexcept: a forced unwind (the thread
// exits or is cancelled inside the caller's callback) must pass.
FLEXNPU_RETHROWS_FORCED_UNWIND void InnerOnReady(PJRT_Error* inner_error, void* arg) {
  FLEXNPU_TSAN_ACQUIRE(arg);
  std::unique_ptr<OnReadyContext, handle_pool::Deleter> context(
      static_cast<OnReadyContext*>(arg));
  PJRT_Error* error = nullptr;
  try {
    error = ToPjrtError(context->backend->Consume(inner_error, kInnerEventWhere));
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    try {
      error = ToPjrtError(Internal("PJRT_Event: converting the backend's error failed"));
    } catch (abi::__forced_unwind&) {
      throw;
    } catch (...) {
      error = nullptr;  // out of memory: nothing can be allocated to report it
    }
  }
  try {
    context->callback(error, context->user_arg);
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    // A C callback that throws anyway: the backend thread must live on.
  }
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
    callback(ToPjrtError(status_), user_arg);
    return Status::Ok();
  }
  // Complete already (small programs on a CPU backend usually are when JAX asks): the callback
  // runs here, as the backend would run it inline, with the error InnerOnReady would pass, and
  // nothing is registered with the backend.
  Status done;
  if (backend_->ErrorIfReady(inner_.get(), kInnerEventWhere, &done)) {
    callback(ToPjrtError(std::move(done)), user_arg);  // may destroy this event
    return Status::Ok();
  }
  auto* context = handle_pool::New<OnReadyContext>(OnReadyContext{backend_, callback, user_arg});
  FLEXNPU_TSAN_RELEASE(context);
  Status status = backend_->OnReady(inner_.get(), InnerOnReady, context);
  if (!status.ok()) handle_pool::Delete(context);
  return status;
}

}  // namespace flexnpu
