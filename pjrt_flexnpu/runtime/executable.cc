#include "pjrt_flexnpu/runtime/executable.h"

#include <cxxabi.h>

#include <chrono>
#include <cstddef>
#include <cstring>

#include "pjrt_flexnpu/backend/compile_options.h"
#include "pjrt_flexnpu/base/forced_unwind.h"
#include "pjrt_flexnpu/base/small_vector.h"
#include "pjrt_flexnpu/base/tsan.h"
#include "pjrt_flexnpu/runtime/buffer.h"
#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/event.h"
#include "pjrt_flexnpu/runtime/executable_serialization.h"
#include "pjrt_flexnpu/runtime/ffi.h"
#include "pjrt_flexnpu/runtime/profile.h"

namespace flexnpu {
namespace {

constexpr size_t kInlineArgs = 8;

std::atomic<uint64_t> next_executable_id{1};

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
    if (context->ticket != 0) (void)context->core->OnFinish(context->ticket, now, ok);
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

StatusOr<VirtualExecutable*> VirtualExecutable::Wrap(const PhysicalBackend& b,
                                                   PJRT_Executable* inner) {
  std::unique_ptr<VirtualExecutable> exe(new VirtualExecutable(b, inner));
  auto replicas = b.NumReplicas(inner);
  if (!replicas.ok()) return replicas.status();
  exe->num_replicas_ = *replicas;
  auto partitions = b.NumPartitions(inner);
  if (!partitions.ok()) return partitions.status();
  exe->num_partitions_ = *partitions;
  auto outputs = b.NumOutputs(inner);
  if (!outputs.ok()) return outputs.status();
  exe->num_outputs_ = *outputs;
  return exe.release();
}

StatusOr<VirtualLoadedExecutable*> VirtualLoadedExecutable::Compile(
    VirtualClient* client, const PJRT_Program* program, std::string_view compile_options,
    std::shared_ptr<const PrebuiltVariants> prebuilt) {
  auto info = ReadCompileOptions(compile_options);
  if (!info.ok()) return info.status();
  const int64_t n = info->num_replicas * info->num_partitions;
  std::vector<int64_t> ids = info->device_ids;
  if (!info->has_device_assignment) {
    if (n > client->num_devices()) {
      return InvalidArgument("a program over " + std::to_string(n) + " devices needs as many " +
                             "virtual devices; this client has " +
                             std::to_string(client->num_devices()));
    }
    for (int64_t i = 0; i < n; ++i) ids.push_back(i);
  }

  std::unique_ptr<VirtualLoadedExecutable> exe(new VirtualLoadedExecutable(client));
  std::vector<bool> seen(client->num_devices(), false);
  for (int64_t id : ids) {
    VirtualDevice* device = client->device(id);
    if (device == nullptr) {
      return InvalidArgument("compile options assign virtual device id " + std::to_string(id) +
                             "; this FlexNPU client has devices 0.." +
                             std::to_string(client->num_devices() - 1));
    }
    if (seen[id]) {
      return InvalidArgument("compile options assign virtual device id " + std::to_string(id) +
                             " twice");
    }
    seen[id] = true;
    exe->devices_.push_back(device);
    exe->device_handles_.push_back(ToHandle<PJRT_Device>(device));
  }
  exe->serialized_assignment_ =
      SerializeDeviceAssignment(info->num_replicas, info->num_partitions, ids);
  exe->single_device_ = n == 1;
  exe->program_code_.assign(program->code, program->code_size);
  exe->program_format_.assign(program->format, program->format_size);
  exe->original_options_.assign(compile_options);
  exe->prebuilt_ = std::move(prebuilt);

  const std::string& mode = client->options().single_device_compile;
  exe->portable_ = exe->single_device_ && mode == "portable";
  exe->portable_fallback_ =
      exe->single_device_ && mode == "auto" && !client->placer().passthrough();
  exe->executable_id_ = next_executable_id.fetch_add(1, std::memory_order_relaxed);
  std::vector<int> mapping;
  if (exe->portable_) {
    auto portable = RewriteAsPortable(compile_options);
    if (!portable.ok()) return portable.status();
    exe->compile_options_ = std::move(*portable);
  } else {
    exe->compile_options_.assign(compile_options);
    if (exe->portable_fallback_) {
      auto portable = RewriteAsPortable(compile_options);
      if (!portable.ok()) return portable.status();
      exe->portable_options_ = std::move(*portable);
    }
    std::vector<int> virtual_ids(ids.begin(), ids.end());
    auto placed = exe->single_device_
                      ? StatusOr<std::vector<int>>(
                            std::vector<int>{client->placer().HomeOf(virtual_ids[0])})
                      : client->placer().PlaceGroup(virtual_ids);
    if (!placed.ok()) return placed.status();
    mapping = std::move(*placed);
  }
  auto compiled = exe->CompileFor(mapping);
  if (!compiled.ok()) return compiled.status();
  exe->initial_ = *compiled;

  const PhysicalBackend& b = client->backend();
  auto got = b.GetExecutable(exe->initial_->executable.get());
  if (!got.ok()) return got.status();
  InnerExecutable unloaded = std::move(*got);
  auto num_outputs = b.NumOutputs(unloaded.get());
  if (!num_outputs.ok()) return num_outputs.status();
  exe->num_outputs_ = *num_outputs;
  if (auto memory = b.CompiledMemoryStats(unloaded.get()); memory.ok()) {
    exe->may_donate_ = memory->alias_bytes > 0;
  }
  if (exe->prebuilt_ != nullptr && exe->prebuilt_->has_profile) {
    exe->profile_ = exe->prebuilt_->profile;  // analysed when it was first compiled
    return exe.release();
  }
  // A program the analysis cannot read still runs: the placer then sees small, costless work.
  auto profile = ProfileExecutable(b, unloaded.get(), client->roofline(), &exe->donatable_);
  if (profile.ok()) exe->profile_ = *profile;
  // An aliased argument of no bytes (an empty array) is donated all the same, and IsDeleted
  // learns of donations only from NoteDonations.
  if (exe->donatable_.known && !exe->donatable_.arguments.empty()) exe->may_donate_ = true;
  return exe.release();
}

VirtualLoadedExecutable::~VirtualLoadedExecutable() {
  // NotFound when it never ran under a learning policy: nothing to forget then.
  if (executable_id_ != 0) (void)client_->placer().core()->ForgetExecutable(executable_id_);
}

StatusOr<std::shared_ptr<VirtualLoadedExecutable::Compiled>> VirtualLoadedExecutable::CompileFor(
    const std::vector<int>& physical) {
  const PhysicalBackend& b = client_->backend();
  // An empty mapping is the portable compile.
  std::string options = portable_ || !physical.empty() ? compile_options_ : portable_options_;
  if (!physical.empty()) {
    std::vector<int64_t> physical_ids;
    for (int p : physical) physical_ids.push_back(client_->physical(p).id);
    auto rewritten = RewriteDeviceAssignment(compile_options_, physical_ids);
    if (!rewritten.ok()) return rewritten.status();
    options = std::move(*rewritten);
  }
  PJRT_Program program{};
  program.struct_size = PJRT_Program_STRUCT_SIZE;
  program.code = program_code_.data();
  program.code_size = program_code_.size();
  program.format = program_format_.data();
  program.format_size = program_format_.size();
  InnerLoadedExecutable loaded;
  if (prebuilt_ != nullptr) {  // deserialized: load the variant when the envelope has it
    auto found = LoadPrebuiltVariant(*prebuilt_, *client_, physical, options);
    if (!found.ok()) return found.status();
    loaded = std::move(*found);
    if (loaded != nullptr) {
      client_->counters().backend_loads.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (loaded == nullptr) {
    auto compiled = b.Compile(client_->inner(), &program, options);
    if (!compiled.ok()) return compiled.status();
    loaded = std::move(*compiled);
    client_->counters().backend_compiles.fetch_add(1, std::memory_order_relaxed);
  }

  auto compiled = std::make_shared<Compiled>();
  compiled->executable = std::move(loaded);
  compiled->physical = physical;
  if (physical.size() > 1) {
    FLEXNPU_ASSIGN_OR_RETURN(const InnerSpan<PJRT_Device*> devices,
                             b.AddressableDevices(compiled->executable.get()));
    for (int p : physical) {
      int position = -1;
      for (size_t i = 0; i < devices.size; ++i) {
        if (devices[i] == client_->physical(p).device) {
          position = static_cast<int>(i);
        }
      }
      if (position < 0) {
        return Internal("the physical backend compiled the SPMD program without physical device " +
                        std::to_string(p) + " that FlexNPU assigned");
      }
      compiled->inner_position.push_back(position);
    }
  }
  return compiled;
}

StatusOr<std::shared_ptr<VirtualLoadedExecutable::Compiled>>
VirtualLoadedExecutable::CompiledFor(const int* physical, size_t n) {
  if (!portable_ && n == initial_->physical.size() &&
      std::equal(physical, physical + n, initial_->physical.begin())) {
    return initial_;
  }
  if (n == 1) {
    std::lock_guard<std::mutex> lock(recent_mu_);
    if (recent_ != nullptr && recent_device_ == physical[0]) {
      recent_->last_use.store(++use_clock_, std::memory_order_relaxed);
      return recent_;
    }
  }
  std::promise<CompiledResult> promise;
  std::shared_future<CompiledResult> future;
  bool compile_here = false;
  const std::vector<int>* key = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = by_mapping_.find(MappingKey{physical, n});
    if (it != by_mapping_.end()) {
      it->second.last_use = ++use_clock_;
      future = it->second.compiled;
    } else {
      future = promise.get_future().share();
      it = by_mapping_.emplace(std::vector<int>(physical, physical + n),
                               CacheEntry{future, ++use_clock_}).first;
      key = &it->first;  // stays valid: compiles in progress are never evicted
      EvictLocked();
      compile_here = true;
    }
  }
  if (!compile_here) {
    CompiledResult found = future.get();
    if (found.ok() && n == 1) Remember(physical[0], *found);
    return found;
  }
  {
    // Outside mu_: executions of mappings already compiled go on meanwhile; those wanting this
    // one wait on the future.
    const std::vector<int> mapping = *key;
    CompiledResult compiled = CompileFor(mapping);
    if (!compiled.ok()) {
      // Failures are not cached: a later execution may try again.
      std::lock_guard<std::mutex> lock(mu_);
      by_mapping_.erase(mapping);
    }
    if (compiled.ok() && n == 1) Remember(physical[0], *compiled);
    promise.set_value(std::move(compiled));
  }
  return future.get();
}

void VirtualLoadedExecutable::Remember(int physical_device,
                                       const std::shared_ptr<Compiled>& compiled) {
  compiled->last_use.store(++use_clock_, std::memory_order_relaxed);
  std::lock_guard<std::mutex> lock(recent_mu_);
  recent_device_ = physical_device;
  recent_ = compiled;
}

void VirtualLoadedExecutable::RememberFallback(int physical_device,
                                               const std::shared_ptr<Compiled>& portable) {
  {
    std::promise<CompiledResult> ready;
    ready.set_value(portable);
    std::lock_guard<std::mutex> lock(mu_);
    // Another execution may have filled the entry meanwhile (a retry that compiled): keep it.
    by_mapping_.emplace(std::vector<int>{physical_device},
                        CacheEntry{ready.get_future().share(), ++use_clock_});
    EvictLocked();
  }
  Remember(physical_device, portable);
}

uint64_t VirtualLoadedExecutable::LastUse(const CacheEntry& entry) {
  const CompiledResult& result = entry.compiled.get();  // ready: only those are evicted
  if (!result.ok()) return entry.last_use;
  return std::max(entry.last_use, (*result)->last_use.load(std::memory_order_relaxed));
}

void VirtualLoadedExecutable::EvictLocked() {
  while (by_mapping_.size() > kMaxCachedMappings) {
    auto victim = by_mapping_.end();
    for (auto it = by_mapping_.begin(); it != by_mapping_.end(); ++it) {
      // Compiles in progress stay (their compiler thread erases or fills them).
      if (it->second.compiled.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
        continue;
      }
      if (victim == by_mapping_.end() || LastUse(it->second) < LastUse(victim->second)) {
        victim = it;
      }
    }
    if (victim == by_mapping_.end()) return;
    by_mapping_.erase(victim);
  }
}

size_t VirtualLoadedExecutable::num_cached_mappings() {
  std::lock_guard<std::mutex> lock(mu_);
  return by_mapping_.size() + (portable_ ? 0 : 1);
}

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
    if (num_outputs_ > 0 && args->output_lists[d] == nullptr) {
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
  std::shared_ptr<Compiled> other;
  const Compiled* compiled = initial_.get();
  if (!kSingle) {
    auto found = CompiledFor(physical.data(), n);
    if (!found.ok()) return found.status();
    other = std::move(*found);
    compiled = other.get();
  } else if (!portable_ && physical[0] != initial_->physical[0]) {
    // Off home: the variant pinned to the device it was placed on; portable only as the
    // fallback (single_device_compile=auto) when that variant cannot be compiled.
    auto found = CompiledFor(physical.data(), 1);
    if (!found.ok() && portable_fallback_) {
      found = CompiledFor(nullptr, 0);
      if (found.ok()) RememberFallback(physical[0], *found);
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
  SmallVector<PJRT_Buffer*, kInlineArgs> inner_outputs(n * num_outputs_);
  SmallVector<PJRT_Buffer* const*, kDevices> argument_lists(n);
  SmallVector<PJRT_Buffer**, kDevices> output_lists(n);
  SmallVector<PJRT_Event*, kDevices> inner_events(n);  // null until the launch sets them
  for (size_t i = 0; i < n; ++i) {
    argument_lists[i] = inner_args.data() + i * num_args;
    output_lists[i] = inner_outputs.data() + i * num_outputs_;
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
  const int64_t start_ns = tracing ? Placer::NowNs() : 0;
  const Status launched = b.Execute(inner);
  // Also after a failed launch: a backend may consume donated arguments and still fail.
  if (may_donate_) NoteDonations(buffers.data(), n, num_args);
  FLEXNPU_RETURN_IF_ERROR(launched);
  cancel.Launched();
  client_->counters().executions.Add(1);
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
      for (size_t i = 0; i < num_outputs_; ++i) Own(b, shard_outputs[i]);
      continue;
    }
    status = WrapOutputs(devices[d], physical[d], shard_outputs, args->output_lists[d]);
    if (!status.ok()) {
      // Outputs of earlier shards were handed out already: take them back.
      for (size_t e = 0; e < d; ++e) {
        for (size_t i = 0; i < num_outputs_; ++i) {
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
      args->device_complete_events[d] =
          status.ok() && e ? ToHandle<PJRT_Event>(Event::Wrap(b, e.release())) : nullptr;
    }
  }
  return status;
}

Status VirtualLoadedExecutable::LearnOutputs(PJRT_Buffer** inner_outputs) {
  const PhysicalBackend& b = client_->backend();
  std::vector<OutputInfo> outputs(num_outputs_);
  for (size_t i = 0; i < num_outputs_; ++i) {
    auto metadata = b.Metadata(inner_outputs[i]);
    if (!metadata.ok()) return metadata.status();
    auto memory = b.Memory(inner_outputs[i]);
    if (!memory.ok()) return memory.status();
    outputs[i] = OutputInfo{std::move(*metadata), client_->KindIndexOf(*memory)};
    // Only arrays have dimensions: the CPU plugin CHECK-fails (aborts the process) when asked
    // for a token's dynamic dimensions (jax.lax.create_token() returned from a jit).
    if (outputs[i].metadata.element_type == PJRT_Buffer_Type_TOKEN) continue;
    if (auto dynamic = b.NumDynamicDims(inner_outputs[i]); dynamic.ok()) {
      outputs[i].varies = *dynamic > 0;
    }
  }
  std::lock_guard<std::mutex> lock(outputs_mu_);
  if (!outputs_known_.load(std::memory_order_acquire)) {
    outputs_ = std::move(outputs);
    outputs_known_.store(true, std::memory_order_release);
  }
  return Status::Ok();
}

Status VirtualLoadedExecutable::WrapOutputs(VirtualDevice* device, int physical_device,
                                            PJRT_Buffer** inner_outputs, PJRT_Buffer** outputs) {
  const PhysicalBackend& b = client_->backend();
  Status status = outputs_known_.load(std::memory_order_acquire)
                      ? Status::Ok()
                      : LearnOutputs(inner_outputs);
  for (size_t i = 0; i < num_outputs_; ++i) {
    InnerBuffer inner = Own(b, inner_outputs[i]);
    inner_outputs[i] = nullptr;
    outputs[i] = nullptr;
    if (!status.ok()) continue;
    const OutputInfo& info = outputs_[i];
    VirtualMemory* memory = info.kind_index >= 0 ? device->memory_of_kind(info.kind_index) : nullptr;
    if (memory == nullptr) memory = device->default_memory();
    if (!info.varies) {
      outputs[i] = ToHandle<PJRT_Buffer>(
          VirtualBuffer::WrapKnown(memory, std::move(inner), physical_device, info.metadata));
      continue;
    }
    auto wrapped = VirtualBuffer::Wrap(memory, std::move(inner), physical_device);
    if (!wrapped.ok()) {
      status = wrapped.status();
      for (size_t j = 0; j < i; ++j) {
        delete FromHandle<VirtualBuffer>(outputs[j]);
        outputs[j] = nullptr;
      }
      continue;
    }
    outputs[i] = ToHandle<PJRT_Buffer>(*wrapped);
  }
  return status;
}

Status VirtualLoadedExecutable::Delete() {
  deleted_.store(true, std::memory_order_release);
  std::vector<std::shared_ptr<Compiled>> compiled{initial_};
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& [mapping, entry] : by_mapping_) {
      if (entry.compiled.wait_for(std::chrono::seconds(0)) != std::future_status::ready) continue;
      const CompiledResult& result = entry.compiled.get();
      // A device's fallback entry holds the portable variant, which has its own entry too.
      if (result.ok() && *result != initial_ &&
          std::find(compiled.begin(), compiled.end(), *result) == compiled.end()) {
        compiled.push_back(*result);
      }
    }
  }
  {
    // Evicted from the map but still the recent variant: deleted too.
    std::lock_guard<std::mutex> lock(recent_mu_);
    if (recent_ != nullptr &&
        std::find(compiled.begin(), compiled.end(), recent_) == compiled.end()) {
      compiled.push_back(recent_);
    }
  }
  const PhysicalBackend& b = client_->backend();
  for (const auto& c : compiled) FLEXNPU_RETURN_IF_ERROR(b.Delete(c->executable.get()));
  return Status::Ok();
}

}  // namespace flexnpu
