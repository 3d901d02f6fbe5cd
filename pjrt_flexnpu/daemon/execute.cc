// A session's executions: Execute in steps (parse, place, wait for its priority turn, launch,
// keep the outputs, watch the completions), and the failure of a one-way execution.
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <utility>

#include "pjrt_flexnpu/daemon/dispatch.h"

namespace flexnpu::daemon {

struct Dispatcher::Execution {
  ExecutableEntry* entry = nullptr;
  int64_t num_devices = 0;
  int64_t num_args = 0;
  int64_t num_outputs = 0;
  int64_t launch_id = 0;
  int64_t execute_device = -1;
  std::vector<int64_t> non_donatable;
  std::vector<std::vector<PJRT_Buffer*>> arguments;  // per device
  std::vector<int64_t> event_ids;
  // One-way (no reply): the client names the outputs (negative ids, new to the session).
  std::vector<int64_t> output_ids;
  // The devices this execution occupies, in the order of its per-device completion events.
  std::vector<int64_t> on_devices;
  // A latency-class execution is in flight until its completion events fire.
  bool track = false;
  std::vector<std::vector<PJRT_Buffer*>> outputs;  // per device
  std::vector<PJRT_Event*> events;                 // per device
  // The arguments the execution consumed (donated), decided at dispatch: the client answers
  // IsDeleted from this (a reply's list; one-way, the completion push's), also when what
  // follows fails.
  std::shared_ptr<std::vector<int64_t>> donated;
};

Status Dispatcher::Execute(Session& s, const Frame& r, Frame* out) {
  Execution e;
  FLEXNPU_RETURN_IF_ERROR(ParseExecute(s, r, e));
  FLEXNPU_RETURN_IF_ERROR(PlaceExecute(s, e));
  if (s.tenant_state != nullptr) ++s.tenant_state->executions;
  if (!s.latency) AwaitPriorityTurn(s, e);
  FLEXNPU_RETURN_IF_ERROR(Launch(s, e));
  const Status kept = KeepOutputs(s, e, out);
  WatchCompletions(s, e, kept.ok());
  if (!kept.ok()) {
    s.consumed_by_failed = *e.donated;
    return kept;
  }
  AppendList(&out->ints, e.donated->data(), e.donated->size());
  return Status::Ok();
}

Status Dispatcher::ParseExecute(Session& s, const Frame& r, Execution& e) {
  auto entry = FindExecutable(s, r.ints);
  if (!entry.ok()) return entry.status();
  e.entry = *entry;
  IntCursor c(r.ints, 1);
  if (!c.Next(&e.num_devices) || !c.Next(&e.num_args) || !c.Next(&e.launch_id) ||
      !c.Next(&e.execute_device) || !c.List(&e.non_donatable) || e.num_devices <= 0 ||
      e.num_args < 0 || e.num_devices > 4096 || e.num_args > (1 << 20)) {
    return InvalidArgument("malformed Execute request");
  }
  if (e.execute_device >= 0 && s.devices.count(e.execute_device) == 0) {
    return PermissionDenied("device index " + std::to_string(e.execute_device) +
                            " is outside the device set of tenant '" + s.tenant + "'");
  }
  e.arguments.resize(e.num_devices);
  for (int64_t d = 0; d < e.num_devices; ++d) {
    for (int64_t i = 0; i < e.num_args; ++i) {
      int64_t id;
      if (!c.Next(&id)) return InvalidArgument("malformed Execute request (arguments)");
      auto it = s.buffers.find(id);
      if (it == s.buffers.end()) {
        return NotFound("buffer " + std::to_string(id) + " is not one of session " +
                        std::to_string(s.id) + "'s buffers");
      }
      if (it->second.handle == nullptr) return it->second.error;
      e.arguments[d].push_back(it->second.handle);
    }
  }
  if (!c.List(&e.event_ids) ||
      (!e.event_ids.empty() && static_cast<int64_t>(e.event_ids.size()) != e.num_devices)) {
    return InvalidArgument("malformed Execute request (events)");
  }
  e.num_outputs = e.entry->num_outputs;
  if (!c.List(&e.output_ids) || (r.call_id == 0) != !e.output_ids.empty() ||
      (!e.output_ids.empty() &&
       static_cast<int64_t>(e.output_ids.size()) != e.num_devices * e.num_outputs)) {
    return InvalidArgument("malformed Execute request (output ids)");
  }
  for (int64_t id : e.output_ids) {
    if (id >= 0 || s.buffers.count(id) > 0) {
      return InvalidArgument("Execute: output id " + std::to_string(id) +
                             " is not a new client id");
    }
  }
  return Status::Ok();
}

Status Dispatcher::PlaceExecute(Session& s, Execution& e) {
  if (e.execute_device >= 0) {
    e.on_devices.push_back(e.execute_device);
  } else {
    for (int64_t d = 0;
         d < e.num_devices && d < static_cast<int64_t>(e.entry->addressable.size()); ++d) {
      e.on_devices.push_back(e.entry->addressable[d]);
    }
  }
  // Without an execute device the backend runs the executable on its addressable devices:
  // each must be in the tenant's set (one compiled for several devices may list others).
  if (static_cast<int64_t>(e.on_devices.size()) < e.num_devices) {
    return InvalidArgument("Execute names " + std::to_string(e.num_devices) +
                           " devices, the executable has " + std::to_string(e.on_devices.size()) +
                           " addressable ones (a portable executable needs an execute device)");
  }
  for (int64_t device : e.on_devices) {
    if (s.devices.count(device) == 0) {
      return PermissionDenied("the execution would run on device " +
                              std::to_string(physical_.devices[device].id) +
                              ", outside the device set of tenant '" + s.tenant + "'");
    }
  }
  return Status::Ok();
}

void Dispatcher::AwaitPriorityTurn(Session& s, const Execution& e) {
  const PriorityGate::Turn turn = gate_->AwaitBatchTurn(e.on_devices, stopping_);
  if (turn != PriorityGate::Turn::kNotHeld && s.tenant_state != nullptr) {
    ++s.tenant_state->held_for_latency;
    if (turn == PriorityGate::Turn::kPastMaxWait) ++s.tenant_state->held_past_max_wait;
  }
}

Status Dispatcher::Launch(Session& s, Execution& e) {
  const int64_t num_devices = e.num_devices;
  e.outputs.assign(num_devices, std::vector<PJRT_Buffer*>(e.num_outputs));
  std::vector<PJRT_Buffer* const*> argument_lists;
  std::vector<PJRT_Buffer**> output_lists;
  for (int64_t d = 0; d < num_devices; ++d) {
    argument_lists.push_back(e.arguments[d].data());
    output_lists.push_back(e.outputs[d].data());
  }
  e.events.assign(num_devices, nullptr);
  PJRT_ExecuteOptions options{};
  options.struct_size = PJRT_ExecuteOptions_STRUCT_SIZE;
  options.launch_id = static_cast<int>(e.launch_id);
  options.non_donatable_input_indices = e.non_donatable.data();
  options.num_non_donatable_input_indices = e.non_donatable.size();
  PJRT_LoadedExecutable_Execute_Args args{};
  args.struct_size = PJRT_LoadedExecutable_Execute_Args_STRUCT_SIZE;
  args.executable = e.entry->handle;
  args.options = &options;
  args.argument_lists = argument_lists.data();
  args.num_devices = static_cast<size_t>(num_devices);
  args.num_args = static_cast<size_t>(e.num_args);
  args.output_lists = output_lists.data();
  e.track = s.latency && static_cast<int64_t>(e.on_devices.size()) == num_devices;
  args.device_complete_events = e.event_ids.empty() && !e.track ? nullptr : e.events.data();
  args.execute_device =
      e.execute_device >= 0 ? physical_.devices[e.execute_device].handle : nullptr;
  if (e.track) gate_->LatencyStarted(e.on_devices);
  Status executed = FLEXNPU_INNER_CALL(b(), PJRT_LoadedExecutable_Execute, &args);
  if (!executed.ok()) {
    if (e.track) {
      for (int64_t device : e.on_devices) gate_->LatencyDone(device);
    }
    return executed;
  }
  e.donated = std::make_shared<std::vector<int64_t>>();
  for (int64_t d = 0; d < num_devices; ++d) {
    for (int64_t i = 0; i < e.num_args; ++i) {
      auto deleted = b().IsDeleted(e.arguments[d][i]);
      if (deleted.ok() && *deleted) e.donated->push_back(d * e.num_args + i);
    }
  }
  return Status::Ok();
}

Status Dispatcher::KeepOutputs(Session& s, Execution& e, Frame* out) {
  int64_t bytes = 0;
  std::vector<int64_t> created;
  Status st;
  for (int64_t d = 0; d < e.num_devices; ++d) {
    for (int64_t o = 0; o < e.num_outputs; ++o) {
      if (!st.ok()) {
        InnerDeleter<PJRT_Buffer>{&b()}(e.outputs[d][o]);
        continue;
      }
      const size_t before = out->ints.size();
      st = AddBuffer(s, e.outputs[d][o], &out->ints, &bytes,
                     e.output_ids.empty() ? 0 : e.output_ids[d * e.num_outputs + o]);
      if (st.ok()) created.push_back(out->ints[before]);
    }
  }
  if (st.ok()) st = tenants_.Charge(s.tenant, bytes, "the outputs of an execution");
  if (!st.ok()) {
    for (int64_t id : created) {
      InnerDeleter<PJRT_Buffer>{&b()}(s.buffers[id].handle);
      s.buffers.erase(id);
    }
  }
  return st;
}

void Dispatcher::WatchCompletions(Session& s, Execution& e, bool kept) {
  const bool one_way = !e.output_ids.empty();
  for (int64_t d = 0; d < e.num_devices; ++d) {
    // A failure to keep the outputs is answered at once (reply, or FailOneWayExecute's
    // pushes): the watches then only free the events and the priority gate.
    const int64_t event_id =
        kept && d < static_cast<int64_t>(e.event_ids.size()) ? e.event_ids[d] : 0;
    std::function<void()> done;
    if (e.track) done = [gate = gate_, device = e.on_devices[d]] { gate->LatencyDone(device); };
    if (e.events[d] != nullptr) {
      WatchEvent(s, e.events[d], event_id, nullptr, nullptr, std::move(done),
                 one_way ? e.donated : nullptr);
    } else if (done) {
      done();
    }
  }
}

namespace {

// The error an output of a failed execution names. An execution fed a failed buffer fails
// with that buffer's error: the root cause is kept once, with the number of executions it has
// propagated through (a decode loop fed a failed buffer does not grow it per step).
Status FailedOutputError(const Status& cause) {
  static const std::string kFailed = "the execution that made this buffer failed";
  static const std::string kThrough = " (propagated through ";
  std::string_view message = cause.message();
  int64_t steps = 0;
  if (message.substr(0, kFailed.size()) == kFailed) {
    std::string_view rest = message.substr(kFailed.size());
    if (rest.substr(0, 2) == ": ") {
      steps = 1;
      message = rest.substr(2);
    } else if (rest.substr(0, kThrough.size()) == kThrough) {
      rest = rest.substr(kThrough.size());
      const size_t close = rest.find(" executions): ");
      if (close != std::string_view::npos) {
        steps = std::atoll(std::string(rest.substr(0, close)).c_str());
        message = rest.substr(close + std::strlen(" executions): "));
      }
    }
  }
  if (steps == 0) return Status(cause.code(), kFailed + ": " + std::string(message));
  return Status(cause.code(), kFailed + kThrough + std::to_string(steps + 1) +
                                  " executions): " + std::string(message));
}

}  // namespace

void Dispatcher::FailOneWayExecute(Session& s, const Frame& r, const Status& status) {
  // Fails what it can name: a malformed request still has its event ids failed when they
  // can be found, so no client thread waits for them forever.
  std::vector<int64_t> consumed;
  consumed.swap(s.consumed_by_failed);
  IntCursor c(r.ints, 5);
  std::vector<int64_t> skip, event_ids, output_ids;
  int64_t id;
  const int64_t num_devices = r.ints.size() > 1 ? r.ints[1] : 0;
  const int64_t num_args = r.ints.size() > 2 ? r.ints[2] : 0;
  bool parsed = num_devices > 0 && num_devices <= 4096 && num_args >= 0 &&
                num_args <= (1 << 20) && c.List(&skip);
  for (int64_t i = 0; parsed && i < num_devices * num_args; ++i) parsed = c.Next(&id);
  parsed = parsed && c.List(&event_ids);
  if (parsed && c.List(&output_ids)) {
    const Status failed = FailedOutputError(status);
    for (int64_t output : output_ids) {
      if (output < 0 && s.buffers.count(output) == 0) {
        s.buffers[output] = BufferEntry{nullptr, 0, failed};
      }
    }
  }
  if (!parsed) {
    Log(config_, "session " + std::to_string(s.id) + " (tenant '" + s.tenant +
                     "'): a malformed one-way Execute names no events to fail: " +
                     std::string(status.message()));
  }
  for (int64_t event : event_ids) {
    Frame push;
    push.op = kEventReady;
    push.ints = {event, static_cast<int64_t>(status.code())};
    push.text = status.message();
    AppendList(&push.ints, consumed.data(), consumed.size());
    s.channel->Send(push);
  }
}

}  // namespace flexnpu::daemon
