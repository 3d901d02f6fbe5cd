// The execution path of a virtual executable: arguments resolved and validated, placed (the
// placer's tickets, SPMD shards included), moved to their shard's physical device, launched,
// tracked to completion (placer feedback, trace), donations noted, outputs wrapped.
#include <cxxabi.h>

#include <cstddef>
#include <cstring>

#include "pjrt_flexnpu/base/forced_unwind.h"
#include "pjrt_flexnpu/base/small_vector.h"
#include "pjrt_flexnpu/base/tsan.h"
#include "pjrt_flexnpu/runtime/buffer.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/event.h"
#include "pjrt_flexnpu/runtime/executable.h"
#include "pjrt_flexnpu/runtime/ffi.h"

namespace flexnpu {
namespace {

constexpr size_t kInlineArgs = 8;

// What happens when a tracked execution completes: the placement core learns its time
// (ticket != 0) and the trace records it (trace != nullptr).
struct FinishContext {
  FinishContext() = default;
  FinishContext(const FinishContext&) = delete;
  FinishContext& operator=(const FinishContext&) = delete;
  // A context that never reaches its callback still ends its trace execution.
  ~FinishContext() {
    if (trace != nullptr) trace->AbandonExecution();
  }

  const PhysicalBackend* backend = nullptr;
  std::shared_ptr<placement::Core> core;
  uint64_t ticket = 0;
  std::shared_ptr<Trace> trace;  // set once BeginExecution was called on it
  TraceEvent event;
};
// In the handle pool: one per tracked execution, made and freed without malloc's locks.
using FinishContextPtr = std::unique_ptr<FinishContext, handle_pool::Deleter>;

// Runs on a backend thread: no exception may escape (an exception there is std::terminate).
// Not noexcept: a forced unwind (the thread exits or is cancelled) must pass.
FLEXNPU_RETHROWS_FORCED_UNWIND void OnExecutionDone(PJRT_Error* error, void* arg) {
  FLEXNPU_TSAN_ACQUIRE(arg);
  FinishContextPtr context(static_cast<FinishContext*>(arg));
  const bool ok = error == nullptr;
  try {
    if (!ok) (void)context->backend->Consume(error, "execution");
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    // The inner error is released by Consume before it builds any message.
  }
  try {
    const int64_t now = Placer::NowNs();
    // No OnStart at dispatch: the core then takes max(placed, previous finish on the device)
    // as the start, so time queued behind earlier work is not counted as this execution's.
    if (context->ticket != 0) {
      (void)context->core->OnFinish(context->ticket, now, ok);
    } else if (context->trace != nullptr) {  // passthrough, traced: its busy time
      context->core->PassthroughFinished(context->event.virtual_device,
                                         context->event.physical_device,
                                         context->event.start_ns, now);
    }
    if (context->trace != nullptr) {
      context->event.end_ns = now;
      context->event.ok = ok;
      std::shared_ptr<Trace> trace = std::move(context->trace);
      trace->FinishExecution(context->event);
    }
  } catch (abi::__forced_unwind&) {
    throw;
  } catch (...) {
    // Losing one measurement or trace event is better than terminating the process.
  }
}

// Runs OnExecutionDone when `inner_event` (an inner completion event) fires. The event itself
// stays with the caller.
void TrackCompletion(const PhysicalBackend& b, FinishContextPtr context,
                     PJRT_Event* inner_event) {
  FLEXNPU_TSAN_RELEASE(context.get());
  if (b.OnReady(inner_event, OnExecutionDone, context.get()).ok()) {
    context.release();  // the callback owns it now
  } else if (context->ticket != 0) {
    (void)context->core->Cancel(context->ticket);
  }
}

// Copies the fields of the caller's options that both it and FlexNPU's header know.
PJRT_ExecuteOptions TranslateOptions(const PJRT_ExecuteOptions* options) {
  PJRT_ExecuteOptions inner{};
  inner.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  if (options == nullptr) return inner;
  // A header with fields after incarnation_ids: decide for each whether the inner plugin may
  // see the caller's value (context, for one, is FlexNPU's and is replaced) before copying it.
  static_assert(PJRT_ExecuteOptions_STRUCT_SIZE ==
                    offsetof(PJRT_ExecuteOptions, incarnation_ids) + sizeof(int64_t*),
                "PJRT_ExecuteOptions has new fields: review TranslateOptions");
  if (options->struct_size >= PJRT_ExecuteOptions_STRUCT_SIZE) {
    // The caller knows every field FlexNPU does (JAX's case): one copy, then what is not the
    // inner plugin's: FlexNPU's extensions and context.
    std::memcpy(&inner, options, PJRT_ExecuteOptions_STRUCT_SIZE);
    inner.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
    inner.extension_start = nullptr;
    inner.context = nullptr;
    return inner;
  }
#define FLEXNPU_COPY_IF_PRESENT(field)                                                    \
  if (options->struct_size >= offsetof(PJRT_ExecuteOptions, field) + sizeof(options->field)) \
    inner.field = options->field;
  FLEXNPU_COPY_IF_PRESENT(send_callbacks)
  FLEXNPU_COPY_IF_PRESENT(recv_callbacks)
  FLEXNPU_COPY_IF_PRESENT(num_send_ops)
  FLEXNPU_COPY_IF_PRESENT(num_recv_ops)
  FLEXNPU_COPY_IF_PRESENT(launch_id)
  FLEXNPU_COPY_IF_PRESENT(non_donatable_input_indices)
  FLEXNPU_COPY_IF_PRESENT(num_non_donatable_input_indices)
  FLEXNPU_COPY_IF_PRESENT(call_location)
  FLEXNPU_COPY_IF_PRESENT(num_tasks)
  FLEXNPU_COPY_IF_PRESENT(task_ids)
  FLEXNPU_COPY_IF_PRESENT(incarnation_ids)
#undef FLEXNPU_COPY_IF_PRESENT
  // The caller's context is FlexNPU's: the execution passes the inner one (runtime/ffi.h).
  inner.context = nullptr;
  return inner;
}

// Resolves JAX's argument handle to a FlexNPU buffer of `client`.
StatusOr<VirtualBuffer*> ArgumentBuffer(VirtualClient* client, PJRT_Buffer* handle,
                                        size_t device, size_t arg) {
  VirtualBuffer* buffer = FromHandle<VirtualBuffer>(handle);
  if (buffer == nullptr) {
    return InvalidArgument("PJRT_LoadedExecutable_Execute: argument " + std::to_string(arg) +
                           " for device " + std::to_string(device) +
                           " is not a FlexNPU buffer (null, foreign or destroyed)");
  }
  if (buffer->client() != client) {
    return InvalidArgument("PJRT_LoadedExecutable_Execute: argument " + std::to_string(arg) +
                           " for device " + std::to_string(device) +
                           " belongs to another FlexNPU client");
  }
  return buffer;
}

}  // namespace

Status VirtualLoadedExecutable::Execute(PJRT_LoadedExecutable_Execute_Args* args) {
  if (IsDeleted()) {
    return FailedPrecondition("PJRT_LoadedExecutable_Execute: the executable has been deleted");
  }
  VirtualDevice* execute_device = nullptr;
  if (args->execute_device != nullptr) {
    execute_device = FromHandle<VirtualDevice>(args->execute_device);
    if (execute_device == nullptr || execute_device->client() != client_) {
      return InvalidArgument("PJRT_LoadedExecutable_Execute: execute_device is not a device of "
                             "this FlexNPU client");
    }
    if (!single_device_ || args->num_devices != 1) {
      return InvalidArgument("PJRT_LoadedExecutable_Execute: execute_device is only valid for a "
                             "single-device program run on one device");
    }
  } else if (args->num_devices != devices_.size()) {
    return InvalidArgument("PJRT_LoadedExecutable_Execute: the program was compiled for " +
                           std::to_string(devices_.size()) + " devices, got arguments for " +
                           std::to_string(args->num_devices));
  }
  const PJRT_ExecuteOptions* options = args->options;
  if (options != nullptr &&
      options->struct_size >= offsetof(PJRT_ExecuteOptions, num_recv_ops) +
                                  sizeof(options->num_recv_ops) &&
      options->num_recv_ops > 0) {
    // A recv callback is handed a PJRT_CopyToDeviceStream of the inner plugin to fill, through
    // PJRT_CopyToDeviceStream_* slots that FlexNPU does not offer.
    return Unimplemented("PJRT_LoadedExecutable_Execute: recv callbacks (num_recv_ops > 0) are "
                         "not supported by FlexNPU (it offers no PJRT_CopyToDeviceStream)");
  }
  // Every list the call reads must be there (argument lists may be absent without arguments).
  for (size_t d = 0; d < args->num_devices; ++d) {
    if (args->num_args > 0 && args->argument_lists[d] == nullptr) {
      return InvalidArgument("PJRT_LoadedExecutable_Execute: argument_lists[" +
                             std::to_string(d) + "] is null");
    }
    if (outputs_.count() > 0 && args->output_lists[d] == nullptr) {
      return InvalidArgument("PJRT_LoadedExecutable_Execute: output_lists[" + std::to_string(d) +
                             "] is null");
    }
  }
  if (execute_device != nullptr) return Dispatch<true>(args, &execute_device, 1);
  if (devices_.size() == 1) return Dispatch<true>(args, devices_.data(), 1);
  return Dispatch<false>(args, devices_.data(), devices_.size());
}

namespace {

// Tickets of placed executions that were never launched are cancelled (any failure before the
// inner Execute returns).
class UnlaunchedTickets {
 public:
  UnlaunchedTickets(Placer& placer, uint64_t* tickets, size_t n)
      : placer_(placer), tickets_(tickets), n_(n) {}
  ~UnlaunchedTickets() {
    if (launched_) return;
    for (size_t d = 0; d < n_; ++d) {
      if (tickets_[d] != 0) placer_.Cancel(tickets_[d]);
    }
  }
  void Launched() { launched_ = true; }

 private:
  Placer& placer_;
  uint64_t* tickets_;
  size_t n_;
  bool launched_ = false;
};

}  // namespace

Status VirtualLoadedExecutable::Place(VirtualDevice* const* devices, size_t n,
                                      VirtualBuffer* const* buffers, size_t num_args,
                                      int* physical, uint64_t* tickets) {
  Placer& placer = client_->placer();
  if (n > 1) {
    // SPMD: the group mapping decides (distinct physical devices, each shard at home where
    // that is free); the placer records one execution per shard so its load is seen.
    SmallVector<int, kInlineDevices> virtual_ids(n);
    for (size_t d = 0; d < n; ++d) virtual_ids[d] = devices[d]->index();
    FLEXNPU_RETURN_IF_ERROR(placer.PlaceGroup(virtual_ids.data(), n, physical));
    if (placer.passthrough()) return Status::Ok();
  } else if (placer.passthrough()) {
    physical[0] = devices[0]->home_physical();
    return Status::Ok();
  }
  SmallVector<placement::Input, kInlineArgs> inputs(num_args);
  for (size_t d = 0; d < n; ++d) {
    for (size_t a = 0; a < num_args; ++a) {
      VirtualBuffer* buffer = buffers[d * num_args + a];
      inputs[a].physical_device = buffer->physical_device();
      inputs[a].bytes = buffer->on_device_size();
      inputs[a].producer = buffer->producer();
    }
    placement::Request request;
    request.virtual_device = devices[d]->index();
    request.executable_id = executable_id_;
    request.profile = &profile_;
    request.inputs = inputs.data();
    request.num_inputs = num_args;
    request.now_ns = Placer::NowNs();
    placement::Decision decision;
    FLEXNPU_RETURN_IF_ERROR(n == 1 ? placer.Place(request, &decision)
                                   : placer.PlaceOn(request, physical[d], &decision));
    physical[d] = decision.physical_device;
    tickets[d] = decision.ticket;
  }
  return Status::Ok();
}

void VirtualLoadedExecutable::TrackShards(const PhysicalBackend& b, VirtualDevice* const* devices,
                                          size_t n, const int* physical, const uint64_t* tickets,
                                          const size_t* positions, PJRT_Event** inner_events,
                                          bool caller_wants_events, bool tracing,
                                          int64_t start_ns) {
  for (size_t d = 0; d < n; ++d) {
    FinishContextPtr context(handle_pool::New<FinishContext>());
    context->backend = &b;
    context->core = client_->placer().core();
    context->ticket = tickets[d];
    if (tracing) {
      context->trace = client_->trace();
      context->trace->BeginExecution();
      context->event.physical_device = physical[d];
      context->event.virtual_device = devices[d]->index();
      context->event.phase = placement::PhaseName(profile_.phase);
      context->event.start_ns = start_ns;
      context->event.executable_id = executable_id_;
    }
    PJRT_Event*& inner_event = inner_events[positions[d]];
    if (inner_event != nullptr) {
      TrackCompletion(b, std::move(context), inner_event);
    } else {
      OnExecutionDone(nullptr, context.release());
    }
    if (!caller_wants_events && inner_event != nullptr) {
      Own(b, inner_event);  // the callback keeps what it needs
      inner_event = nullptr;
    }
  }
}

void VirtualLoadedExecutable::NoteDonations(VirtualBuffer* const* buffers, size_t n,
                                            size_t num_args) {
  if (donatable_.known) {
    for (size_t d = 0; d < n; ++d) {
      for (int a : donatable_.arguments) {
        if (static_cast<size_t>(a) < num_args) buffers[d * num_args + a]->NoteMaybeDonated();
      }
    }
  } else {
    for (size_t i = 0; i < n * num_args; ++i) buffers[i]->NoteMaybeDonated();
  }
}

template <bool kSingle>
Status VirtualLoadedExecutable::Dispatch(PJRT_LoadedExecutable_Execute_Args* args,
                                         VirtualDevice* const* devices, size_t n) {
  // kSingle: a single-device execution (n == 1), the common case, compiled without the SPMD
  // loops and lists, so each execution touches less code; the source is the same.
  constexpr size_t kDevices = kSingle ? 1 : kInlineDevices;
  if constexpr (kSingle) n = 1;
  const size_t num_args = args->num_args;
  SmallVector<VirtualBuffer*, kInlineArgs> buffers(n * num_args);
  for (size_t d = 0; d < n; ++d) {
    for (size_t a = 0; a < num_args; ++a) {
      auto buffer = ArgumentBuffer(client_, args->argument_lists[d][a], d, a);
      if (!buffer.ok()) return buffer.status();
      buffers[d * num_args + a] = *buffer;
    }
  }
  SmallVector<int, kDevices> physical(n);
  SmallVector<uint64_t, kDevices> tickets(n);  // zeroed: untracked
  Placer& placer = client_->placer();
  UnlaunchedTickets cancel(placer, tickets.data(), n);
  if (kSingle && placer.passthrough()) {
    physical[0] = devices[0]->home_physical();
  } else {
    FLEXNPU_RETURN_IF_ERROR(
        Place(devices, n, buffers.data(), num_args, physical.data(), tickets.data()));
  }

  // The compiled variant for this mapping.
  std::shared_ptr<CompiledVariant> other;
  const CompiledVariant* compiled = variants_.initial().get();
  if (!kSingle) {
    auto found = variants_.For(physical.data(), n);
    if (!found.ok()) return found.status();
    other = std::move(*found);
    compiled = other.get();
  } else if (!variants_.portable() && physical[0] != variants_.initial()->physical[0]) {
    // Off home: the variant pinned to the device it was placed on; portable only as the
    // fallback (single_device_compile=auto) when that variant cannot be compiled.
    auto found = variants_.For(physical.data(), 1);
    if (!found.ok() && variants_.portable_fallback()) {
      found = variants_.For(nullptr, 0);
      if (found.ok()) variants_.RememberFallback(physical[0], *found);
    }
    if (!found.ok()) return found.status();
    other = std::move(*found);
    compiled = other.get();
  }
  // Where shard d sits in the inner executable's device list.
  SmallVector<size_t, kDevices> positions(n);
  if constexpr (!kSingle) {
    for (size_t d = 0; d < n; ++d) positions[d] = compiled->inner_position[d];
  }

  // Arguments on their shard's physical device; the holds keep them alive through the launch.
  SmallVector<std::shared_ptr<PhysicalBuffer>, kInlineArgs> holds(n * num_args);
  SmallVector<PJRT_Buffer*, kInlineArgs> inner_args(n * num_args);
  for (size_t d = 0; d < n; ++d) {
    for (size_t a = 0; a < num_args; ++a) {
      auto held = buffers[d * num_args + a]->OnDevice(physical[d]);
      if (!held.ok()) return held.status();
      holds[d * num_args + a] = std::move(*held);
      inner_args[positions[d] * num_args + a] = holds[d * num_args + a]->handle.get();
    }
  }
  SmallVector<PJRT_Buffer*, kInlineArgs> inner_outputs(n * outputs_.count());
  SmallVector<PJRT_Buffer* const*, kDevices> argument_lists(n);
  SmallVector<PJRT_Buffer**, kDevices> output_lists(n);
  SmallVector<PJRT_Event*, kDevices> inner_events(n);  // null until the launch sets them
  for (size_t i = 0; i < n; ++i) {
    argument_lists[i] = inner_args.data() + i * num_args;
    output_lists[i] = inner_outputs.data() + i * outputs_.count();
  }

  const PhysicalBackend& b = client_->backend();
  PJRT_ExecuteOptions options = TranslateOptions(args->options);
  // Send callbacks are listed per device: in the inner executable's device order.
  SmallVector<PJRT_SendCallbackInfo*, kDevices> send_callbacks(
      !kSingle && options.num_send_ops > 0 && options.send_callbacks != nullptr ? n : 0);
  if (send_callbacks.size() > 0) {
    for (size_t d = 0; d < n; ++d) send_callbacks[positions[d]] = options.send_callbacks[d];
    options.send_callbacks = send_callbacks.data();
  }
  auto inner_context = InnerExecuteContext(args->options, b);  // FFI user data (runtime/ffi.h)
  if (!inner_context.ok()) return inner_context.status();
  options.context = *inner_context;
  InnerLaunch inner;
  inner.executable = compiled->executable.get();
  inner.options = &options;
  inner.argument_lists = argument_lists.data();
  inner.num_devices = n;
  inner.num_args = num_args;
  inner.output_lists = output_lists.data();
  // Tracked executions always need the completion events: they end their time on the device.
  const bool tracing = client_->trace()->enabled();
  const bool tracked = tickets[0] != 0 || tracing;
  inner.device_complete_events =
      (args->device_complete_events != nullptr || tracked) ? inner_events.data() : nullptr;
  // A pinned executable runs where it was compiled for; a portable one where it is told.
  inner.execute_device = kSingle && compiled->physical.empty()
                             ? client_->physical(physical[0]).device
                             : nullptr;
  // Passthrough executions are not tracked: the caller's completion events (JAX asks for them)
  // tell the placer their busy time instead (CompletionNote).
  const bool note_completion = !tracked && args->device_complete_events != nullptr;
  const int64_t start_ns = tracing || note_completion ? Placer::NowNs() : 0;
  const Status launched = b.Execute(inner);
  // Also after a failed launch: a backend may consume donated arguments and still fail.
  if (may_donate_) NoteDonations(buffers.data(), n, num_args);
  FLEXNPU_RETURN_IF_ERROR(launched);
  cancel.Launched();
  client_->counters().executions.Add(1);
  if (tickets[0] == 0) {  // passthrough: not placed, only counted
    for (size_t d = 0; d < n; ++d) {
      placer.CountPassthrough(devices[d]->index(), physical[d], profile_.phase);
    }
  }
  if (tracked) {
    TrackShards(b, devices, n, physical.data(), tickets.data(), positions.data(),
                inner_events.data(), args->device_complete_events != nullptr, tracing,
                start_ns);
  }

  SmallVector<InnerEvent, kDevices> events(n);
  for (size_t i = 0; i < n; ++i) events[i] = Own(b, inner_events[i]);
  Status status;
  for (size_t d = 0; d < n; ++d) {
    PJRT_Buffer** shard_outputs = output_lists[positions[d]];
    if (!status.ok()) {
      for (size_t i = 0; i < outputs_.count(); ++i) Own(b, shard_outputs[i]);
      continue;
    }
    status = outputs_.Wrap(devices[d], physical[d], tickets[d], shard_outputs,
                           args->output_lists[d]);
    if (!status.ok()) {
      // Outputs of earlier shards were handed out already: take them back.
      for (size_t e = 0; e < d; ++e) {
        for (size_t i = 0; i < outputs_.count(); ++i) {
          delete FromHandle<VirtualBuffer>(args->output_lists[e][i]);
          args->output_lists[e][i] = nullptr;
        }
      }
    }
  }
  // Events only with outputs: on failure the caller takes nothing, and they go with `events`.
  if (args->device_complete_events != nullptr) {
    for (size_t d = 0; d < n; ++d) {
      InnerEvent& e = events[positions[d]];
      if (!status.ok() || !e) {
        args->device_complete_events[d] = nullptr;
        continue;
      }
      CompletionNote note;
      if (note_completion) {
        note = {placer.core(), devices[d]->index(), physical[d], start_ns};
      }
      args->device_complete_events[d] =
          ToHandle<PJRT_Event>(Event::Wrap(b, e.release(), std::move(note)));
    }
  }
  return status;
}

}  // namespace flexnpu
