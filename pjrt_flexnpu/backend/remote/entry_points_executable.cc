// Executables: compile and deserialize (the daemon compiles), execution (synchronous the first
// time for each key, one-way after: see ExecuteTemplate), the executable's description, its
// optimized program and serialization.
#include <algorithm>
#include <cstring>
#include <optional>

#include "pjrt_flexnpu/backend/remote/entry_points.h"
#include "pjrt_flexnpu/backend/remote/handles.h"

namespace flexnpu::remote {
namespace {

// Marks the arguments an execution consumed (positions device * num_args + arg) deleted.
void MarkDonated(const PJRT_LoadedExecutable_Execute_Args* a,
                 const std::vector<int64_t>& donated) {
  const size_t num_args = std::max<size_t>(a->num_args, 1);
  for (int64_t position : donated) {
    const auto d = static_cast<size_t>(position) / num_args;
    const auto i = static_cast<size_t>(position) % num_args;
    if (position < 0 || d >= a->num_devices) continue;
    From<RemoteBuffer>(a->argument_lists[d][i])->deleted = true;
  }
}

// A one-way execution: the arguments its key's first execution consumed are consumed by this
// one only if the daemon ran it as that one; its completion push says (RemoteEvent::donated).
void ExpectDonated(const PJRT_LoadedExecutable_Execute_Args* a,
                   const std::vector<int64_t>& donated,
                   const std::vector<std::pair<int64_t, std::shared_ptr<RemoteEvent>>>& events) {
  const size_t num_args = std::max<size_t>(a->num_args, 1);
  for (int64_t position : donated) {
    const auto d = static_cast<size_t>(position) / num_args;
    const auto i = static_cast<size_t>(position) % num_args;
    if (position < 0 || d >= a->num_devices || d >= events.size()) continue;
    RemoteBuffer* b = From<RemoteBuffer>(a->argument_lists[d][i]);
    std::lock_guard<std::mutex> lock(b->pending_mu);
    b->pending_donations.emplace_back(events[d].second, position);
  }
}

void DeleteSerialized(PJRT_SerializedExecutable* s) {
  delete reinterpret_cast<RemoteSerialized*>(s);
}

// Contexts only carry FFI user data, which cannot cross processes: an empty one.
struct RemoteContext {};

}  // namespace

PJRT_Error* Client_Compile(PJRT_Client_Compile_Args* a) {
  return Run([&]() -> Status {
    RemoteClient* client = From<RemoteClient>(a->client);
    Frame request;
    request.op = daemon::kCompile;
    request.blobs.emplace_back(a->program->format, a->program->format_size);
    request.blobs.emplace_back(a->program->code, a->program->code_size);
    request.blobs.emplace_back(a->compile_options, a->compile_options_size);
    auto reply = client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    auto loaded = NewLoaded(client, *reply);
    if (!loaded.ok()) return loaded.status();
    a->executable = To<PJRT_LoadedExecutable>(*loaded);
    return Status::Ok();
  });
}

PJRT_Error* Executable_DeserializeAndLoad(PJRT_Executable_DeserializeAndLoad_Args* a) {
  return Run([&]() -> Status {
    RemoteClient* client = From<RemoteClient>(a->client);
    Frame request;
    request.op = daemon::kDeserialize;
    request.blobs.emplace_back(a->serialized_executable, a->serialized_executable_size);
    const bool has_options = a->overridden_serialized_compile_options != nullptr;
    request.blobs.emplace_back(has_options ? a->overridden_serialized_compile_options : "",
                               has_options ? a->overridden_serialized_compile_options_size : 0);
    request.ints = {has_options ? 1 : 0};
    auto reply = client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    auto loaded = NewLoaded(client, *reply);
    if (!loaded.ok()) return loaded.status();
    a->loaded_executable = To<PJRT_LoadedExecutable>(*loaded);
    return Status::Ok();
  });
}

PJRT_Error* LoadedExecutable_Destroy(PJRT_LoadedExecutable_Destroy_Args* a) {
  RemoteLoadedExecutable* e = From<RemoteLoadedExecutable>(a->executable);
  Frame request;
  request.op = daemon::kExecutableDestroy;
  request.ints = {e->state->meta.id};
  (void)e->state->connection->Post(std::move(request));
  delete e;
  return nullptr;
}
PJRT_Error* LoadedExecutable_GetExecutable(PJRT_LoadedExecutable_GetExecutable_Args* a) {
  const auto* loaded = From<RemoteLoadedExecutable>(a->loaded_executable);
  a->executable = To<PJRT_Executable>(new RemoteExecutable{loaded->state});
  return nullptr;
}
PJRT_Error* LoadedExecutable_AddressableDevices(
    PJRT_LoadedExecutable_AddressableDevices_Args* a) {
  const auto& state = *From<RemoteLoadedExecutable>(a->executable)->state;
  a->addressable_devices = const_cast<PJRT_Device* const*>(state.devices.data());
  a->num_addressable_devices = state.devices.size();
  return nullptr;
}
PJRT_Error* LoadedExecutable_Delete(PJRT_LoadedExecutable_Delete_Args* a) {
  return Run([&]() -> Status {
    RemoteLoadedExecutable* e = From<RemoteLoadedExecutable>(a->executable);
    Frame request;
    request.op = daemon::kExecutableDelete;
    request.ints = {e->state->meta.id};
    auto reply = e->state->client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    e->deleted = true;
    return Status::Ok();
  });
}
PJRT_Error* LoadedExecutable_IsDeleted(PJRT_LoadedExecutable_IsDeleted_Args* a) {
  a->is_deleted = From<RemoteLoadedExecutable>(a->executable)->deleted.load();
  return nullptr;
}

PJRT_Error* LoadedExecutable_Execute(PJRT_LoadedExecutable_Execute_Args* a) {
  return Run([&]() -> Status {
    auto& state = *From<RemoteLoadedExecutable>(a->executable)->state;
    RemoteClient* client = state.client;
    Connection& c = *client->connection;
    const PJRT_ExecuteOptions* options = a->options;
    if (options != nullptr && (options->num_send_ops != 0 || options->num_recv_ops != 0)) {
      return Unimplemented("PJRT_LoadedExecutable_Execute over the flexnpu daemon: send/recv "
                           "callbacks are not supported");
    }
    // ints: [exe, num_devices, num_args, launch_id, execute_device, non-donatable list,
    //        argument ids (device-major), event ids list, output ids list (one-way)]
    Frame request;
    request.op = daemon::kExecute;
    request.ints = {state.meta.id, static_cast<int64_t>(a->num_devices),
                    static_cast<int64_t>(a->num_args), options ? options->launch_id : 0,
                    a->execute_device ? From<RemoteDevice>(a->execute_device)->index : -1};
    daemon::AppendList(&request.ints, options ? options->non_donatable_input_indices : nullptr,
               options ? options->num_non_donatable_input_indices : 0);
    // What decides the outputs' descriptions and the donation: devices and donation options.
    std::vector<int64_t> key(request.ints.begin() + 1, request.ints.end());
    key.erase(key.begin() + 2);  // not the launch id
    for (size_t d = 0; d < a->num_devices; ++d) {
      for (size_t i = 0; i < a->num_args; ++i) {
        const RemoteBuffer* argument = From<RemoteBuffer>(a->argument_lists[d][i]);
        request.ints.push_back(argument->meta.id);
        // Donation depends on an argument's provenance too (an aliased segment is not
        // consumed like an execution's output).
        key.push_back(argument->zero_copy ? 1 : 0);
      }
    }
    // Completion events are always asked for: they also make the outputs' ready events.
    std::vector<std::pair<int64_t, std::shared_ptr<RemoteEvent>>> events;
    for (size_t d = 0; d < a->num_devices; ++d) events.push_back(c.NewEvent());
    request.ints.push_back(static_cast<int64_t>(events.size()));
    for (const auto& e : events) request.ints.push_back(e.first);
    const size_t num_outputs = static_cast<size_t>(state.meta.num_outputs);

    std::optional<ExecuteTemplate> known;
    if (client->one_way) {
      std::lock_guard<std::mutex> lock(state.templates_mu);
      auto it = state.templates.find(key);
      if (it != state.templates.end()) known = it->second;
    }
    if (known) {
      // One-way: this process names the outputs; no round trip before returning.
      std::vector<int64_t> ids(a->num_devices * num_outputs);
      for (int64_t& id : ids) id = client->next_output_id.fetch_sub(1);
      daemon::AppendList(&request.ints, ids.data(), ids.size());
      Status sent = c.Post(std::move(request));
      if (!sent.ok()) {
        for (const auto& e : events) c.DropEvent(e.first);
        return sent;
      }
      for (size_t d = 0; d < a->num_devices; ++d) {
        for (size_t o = 0; o < num_outputs; ++o) {
          auto* buffer = new RemoteBuffer();
          buffer->client = client;
          buffer->connection = client->connection;
          buffer->meta = known->outputs[d * num_outputs + o];
          buffer->meta.id = ids[d * num_outputs + o];
          buffer->ready = events[d].second;
          a->output_lists[d][o] = To<PJRT_Buffer>(buffer);
        }
      }
      ExpectDonated(a, known->donated, events);
    } else {
      request.ints.push_back(0);  // no output ids: the reply describes the outputs
      auto reply = c.CallForReply(std::move(request));
      if (!reply.ok()) {
        for (const auto& e : events) c.DropEvent(e.first);
        return reply.status();
      }
      if (reply->code != 0) {
        // Refused after it ran (its outputs could not be kept): the reply lists what it
        // consumed all the same.
        for (const auto& e : events) c.DropEvent(e.first);
        std::vector<int64_t> consumed;
        IntCursor cursor(reply->ints);
        if (cursor.List(&consumed)) MarkDonated(a, consumed);
        return Status(static_cast<Code>(reply->code),
                      "flexnpu daemon at " + c.path() + ": " + reply->text);
      }
      IntCursor cursor(reply->ints);
      std::vector<RemoteBuffer*> outputs;
      ExecuteTemplate learnt;
      bool static_shapes = true;
      for (size_t d = 0; d < a->num_devices; ++d) {
        for (size_t o = 0; o < num_outputs; ++o) {
          auto buffer = NewBuffer(client, &cursor);
          if (!buffer.ok()) {
            for (RemoteBuffer* b : outputs) delete b;
            return buffer.status();
          }
          (*buffer)->ready = events[d].second;
          outputs.push_back(*buffer);
          static_shapes = static_shapes && (*buffer)->meta.dynamic_dims.empty();
          learnt.outputs.push_back((*buffer)->meta);
          a->output_lists[d][o] = To<PJRT_Buffer>(*buffer);
        }
      }
      if (!cursor.List(&learnt.donated)) {
        for (RemoteBuffer* b : outputs) delete b;
        return BadReply(client, "Execute (donated arguments)");
      }
      MarkDonated(a, learnt.donated);
      if (client->one_way && static_shapes) {
        std::lock_guard<std::mutex> lock(state.templates_mu);
        state.templates.emplace(key, std::move(learnt));
      }
    }
    if (a->device_complete_events != nullptr) {
      for (size_t d = 0; d < events.size(); ++d) {
        a->device_complete_events[d] = To<PJRT_Event>(new EventHandle{events[d].second});
      }
    }
    return Status::Ok();
  });
}

PJRT_Error* Executable_Destroy(PJRT_Executable_Destroy_Args* a) {
  delete From<RemoteExecutable>(a->executable);
  return nullptr;
}
PJRT_Error* Executable_Name(PJRT_Executable_Name_Args* a) {
  const std::string& name = From<RemoteExecutable>(a->executable)->state->meta.name;
  a->executable_name = name.data();
  a->executable_name_size = name.size();
  return nullptr;
}
PJRT_Error* Executable_NumReplicas(PJRT_Executable_NumReplicas_Args* a) {
  a->num_replicas = From<RemoteExecutable>(a->executable)->state->meta.num_replicas;
  return nullptr;
}
PJRT_Error* Executable_NumPartitions(PJRT_Executable_NumPartitions_Args* a) {
  a->num_partitions = From<RemoteExecutable>(a->executable)->state->meta.num_partitions;
  return nullptr;
}
PJRT_Error* Executable_NumOutputs(PJRT_Executable_NumOutputs_Args* a) {
  a->num_outputs = From<RemoteExecutable>(a->executable)->state->meta.num_outputs;
  return nullptr;
}
PJRT_Error* Executable_GetCompiledMemoryStats(PJRT_Executable_GetCompiledMemoryStats_Args* a) {
  const ExecutableMeta& m = From<RemoteExecutable>(a->executable)->state->meta;
  if (!m.has_memory_stats) {
    return ToError(Unimplemented("the daemon's backend gave no compiled memory stats"));
  }
  int64_t* out[daemon::kMemoryStatsFields] = {
      &a->generated_code_size_in_bytes, &a->argument_size_in_bytes,
      &a->output_size_in_bytes, &a->alias_size_in_bytes, &a->temp_size_in_bytes,
      &a->host_generated_code_size_in_bytes, &a->host_argument_size_in_bytes,
      &a->host_output_size_in_bytes, &a->host_alias_size_in_bytes,
      &a->host_temp_size_in_bytes, &a->peak_memory_in_bytes};
  for (int i = 0; i < daemon::kMemoryStatsFields; ++i) *out[i] = m.memory_stats[i];
  return nullptr;
}
PJRT_Error* Executable_OptimizedProgram(PJRT_Executable_OptimizedProgram_Args* a) {
  return Run([&]() -> Status {
    auto& state = *From<RemoteExecutable>(a->executable)->state;
    std::lock_guard<std::mutex> lock(state.mu);
    if (!state.have_program) {
      Frame request;
      request.op = daemon::kOptimizedProgram;
      request.ints = {state.meta.id};
      auto reply = state.client->connection->Call(std::move(request));
      if (!reply.ok()) return reply.status();
      if (reply->blobs.size() < 2) return BadReply(state.client, "Executable_OptimizedProgram");
      state.program_code = std::move(reply->blobs[0]);
      state.program_format = std::move(reply->blobs[1]);
      state.have_program = true;
    }
    PJRT_Program* program = a->program;
    program->format = state.program_format.data();
    program->format_size = state.program_format.size();
    if (program->code == nullptr) {
      program->code_size = state.program_code.size();
      return Status::Ok();
    }
    if (program->code_size < state.program_code.size()) {
      return InvalidArgument("PJRT_Executable_OptimizedProgram: code buffer too small");
    }
    std::memcpy(program->code, state.program_code.data(), state.program_code.size());
    program->code_size = state.program_code.size();
    return Status::Ok();
  });
}
PJRT_Error* Executable_Serialize(PJRT_Executable_Serialize_Args* a) {
  return Run([&]() -> Status {
    auto& state = *reinterpret_cast<const RemoteExecutable*>(a->executable)->state;
    Frame request;
    request.op = daemon::kSerialize;
    request.ints = {state.meta.id};
    auto reply = state.client->connection->Call(std::move(request));
    if (!reply.ok()) return reply.status();
    if (reply->blobs.empty()) return BadReply(state.client, "Executable_Serialize");
    auto* s = new RemoteSerialized{std::move(reply->blobs[0])};
    a->serialized_bytes = s->bytes.data();
    a->serialized_bytes_size = s->bytes.size();
    a->serialized_executable = reinterpret_cast<PJRT_SerializedExecutable*>(s);
    a->serialized_executable_deleter = DeleteSerialized;
    return Status::Ok();
  });
}

PJRT_Error* ExecuteContext_Create(PJRT_ExecuteContext_Create_Args* a) {
  a->context = reinterpret_cast<PJRT_ExecuteContext*>(new RemoteContext());
  return nullptr;
}
PJRT_Error* ExecuteContext_Destroy(PJRT_ExecuteContext_Destroy_Args* a) {
  delete reinterpret_cast<RemoteContext*>(a->context);
  return nullptr;
}

}  // namespace flexnpu::remote
