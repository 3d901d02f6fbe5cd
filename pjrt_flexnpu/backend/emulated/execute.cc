// An execution: nothing is computed. Each device it runs on takes it in order: it starts when
// the device is free, its inputs are ready and it is launched, and lasts the program's modelled
// duration (with co_run, it starts when ready and overlaps what runs there as the placer's
// co-run model says); a program over several devices starts on all of them together (its
// collectives synchronize them). Its outputs and completion events are ready when it finishes; donated
// inputs are consumed; its outputs and temporaries must fit in the device's memory.
#include <algorithm>
#include <cmath>
#include <mutex>

#include "pjrt_flexnpu/backend/emulated/entry_points.h"
#include "pjrt_flexnpu/backend/emulated/handles.h"
#include "pjrt_flexnpu/backend/emulated/timeline.h"
#include "pjrt_flexnpu/base/co_run.h"

namespace flexnpu::emulated {
namespace {

bool Contains(const int64_t* list, size_t n, int64_t value) {
  return list != nullptr && std::find(list, list + n, value) != list + n;
}

// The arguments of one device's share of an execution that it consumes.
std::vector<EmulatedBuffer*> Consumed(const Program& p, const PJRT_ExecuteOptions* options,
                                      PJRT_Buffer* const* arguments, size_t num_args) {
  const bool has_list =
      options != nullptr &&
      options->struct_size >= offsetof(PJRT_ExecuteOptions, num_non_donatable_input_indices) +
                                  sizeof(options->num_non_donatable_input_indices);
  const int64_t* keep = has_list ? options->non_donatable_input_indices : nullptr;
  const size_t num_keep = has_list ? options->num_non_donatable_input_indices : 0;
  std::vector<EmulatedBuffer*> consumed;
  for (int64_t parameter : p.donated) {
    if (parameter < 0 || static_cast<size_t>(parameter) >= num_args) continue;
    const bool must = std::binary_search(p.must_alias.begin(), p.must_alias.end(), parameter);
    if (!must && Contains(keep, num_keep, parameter)) continue;
    EmulatedBuffer* b = From<EmulatedBuffer>(arguments[parameter]);
    if (std::find(consumed.begin(), consumed.end(), b) == consumed.end()) consumed.push_back(b);
  }
  return consumed;
}

// In order: it starts when every device is free.
int64_t InOrderFinish(const Program& p, int64_t ready, const std::vector<EmulatedDevice*>& on) {
  int64_t start = ready;
  for (const EmulatedDevice* device : on) start = std::max(start, device->free_ns);
  const int64_t finish = start + p.duration_ns;
  for (EmulatedDevice* device : on) device->free_ns = finish;
  return finish;
}

// Co-run: it starts when ready, beside the executions still running there, and takes what
// the placer's co-run model says (CoRunDuration) on the busiest of its devices.
int64_t CoRunFinish(const Program& p, int64_t ready, const std::vector<EmulatedDevice*>& on) {
  double duration = 0;
  for (EmulatedDevice* device : on) {
    auto& running = device->running;
    running.erase(std::remove_if(running.begin(), running.end(),
                                 [&](int64_t finish) { return finish <= ready; }),
                  running.end());
    const double compute_left = std::max(0.0, device->compute_free_ns - ready);
    const double memory_left = std::max(0.0, device->memory_free_ns - ready);
    duration = std::max(duration, CoRunDuration(p.compute_ns, p.memory_ns,
                                                static_cast<double>(running.size()),
                                                compute_left, memory_left));
  }
  const int64_t finish = ready + static_cast<int64_t>(std::llround(duration + p.launch_ns));
  for (EmulatedDevice* device : on) {
    device->compute_free_ns = std::max(device->compute_free_ns, static_cast<double>(ready)) +
                              p.compute_ns;
    device->memory_free_ns = std::max(device->memory_free_ns, static_cast<double>(ready)) +
                             p.memory_ns;
    device->running.push_back(finish);
    device->free_ns = std::max(device->free_ns, finish);
  }
  return finish;
}

}  // namespace

PJRT_Error* LoadedExecutable_Execute(PJRT_LoadedExecutable_Execute_Args* a) {
  return Run([&]() -> Status {
    const auto& exe = *From<EmulatedLoadedExecutable>(a->executable);
    const Program& p = *exe.program;
    const std::string what = "an execution of '" + p.name + "'";
    if (exe.deleted) return FailedPrecondition("emulated backend: " + what + ": deleted");
    const PJRT_ExecuteOptions* options = a->options;
    if (options != nullptr && (options->num_send_ops != 0 || options->num_recv_ops != 0)) {
      return Unimplemented("emulated backend: send/recv callbacks are host code, which the "
                           "emulated backend does not run");
    }
    const size_t n = a->num_devices;
    if (n == 0) return InvalidArgument("emulated backend: " + what + " on no device");
    std::vector<std::shared_ptr<EmulatedDevice>> devices(n);
    for (size_t d = 0; d < n; ++d) {
      if (a->execute_device != nullptr && n == 1) {
        devices[d] = SharedDevice(a->execute_device);
      } else if (d < exe.devices.size()) {
        devices[d] = exe.devices[d];
      } else {
        return InvalidArgument("emulated backend: " + what + " on " + std::to_string(n) +
                               " devices; it was compiled for " +
                               std::to_string(exe.devices.size()) +
                               (exe.portable ? " (portable: pass execute_device)" : ""));
      }
    }
    // Inputs: present, and ready when?
    int64_t inputs_ready = 0;
    for (size_t d = 0; d < n; ++d) {
      for (size_t i = 0; i < a->num_args; ++i) {
        const EmulatedBuffer* b = From<EmulatedBuffer>(a->argument_lists[d][i]);
        if (b == nullptr || b->deleted) {
          return InvalidArgument("emulated backend: " + what + ": argument " +
                                 std::to_string(i) + " on device " + std::to_string(d) +
                                 (b == nullptr ? " is null" : " has been deleted or donated"));
        }
        inputs_ready = std::max(inputs_ready, b->ready_ns);
      }
    }
    // Memory: each device gives back what is donated, keeps the outputs, needs temporaries.
    int64_t output_bytes = 0;
    for (const OutputShape& o : p.outputs) output_bytes += o.bytes;
    std::vector<std::vector<EmulatedBuffer*>> consumed(n);
    std::vector<int64_t> released(n, 0);
    for (size_t d = 0; d < n; ++d) {
      consumed[d] = Consumed(p, options, a->argument_lists[d], a->num_args);
      for (EmulatedBuffer* b : consumed[d]) {
        if (b->device == devices[d]) released[d] += b->bytes;
      }
      Status fits = devices[d]->Exchange(released[d], output_bytes, p.temp_bytes, what);
      if (!fits.ok()) {
        for (size_t u = 0; u < d; ++u) devices[u]->Unexchange(released[u], output_bytes);
        return fits;
      }
    }
    for (size_t d = 0; d < n; ++d) {
      for (EmulatedBuffer* b : consumed[d]) {
        if (b->device == devices[d]) {
          b->deleted = true;  // its bytes went back in Exchange
        } else {
          b->Release();
        }
      }
    }
    // Time: in order on each device; together on all of them.
    std::vector<std::unique_lock<std::mutex>> locks;
    std::vector<EmulatedDevice*> order;
    for (const auto& device : devices) order.push_back(device.get());
    std::sort(order.begin(), order.end(),
              [](const EmulatedDevice* x, const EmulatedDevice* y) { return x->id < y->id; });
    order.erase(std::unique(order.begin(), order.end()), order.end());
    const int64_t ready = std::max(NowNs(), inputs_ready);
    const int64_t finish = exe.client->config.co_run ? CoRunFinish(p, ready, order)
                                                     : InOrderFinish(p, ready, order);
    for (EmulatedDevice* device : order) {
      device->busy_s += p.modelled_s;
      ++device->executions;
    }
    locks.clear();
    // Outputs, their memory reserved above.
    for (size_t d = 0; d < n; ++d) {
      for (size_t o = 0; o < p.outputs.size(); ++o) {
        const OutputShape& shape = p.outputs[o];
        auto buffer = NewBuffer(devices[d], shape.type, shape.dims, finish, what,
                                /*reserved=*/true);
        if (!buffer.ok()) return buffer.status();
        a->output_lists[d][o] = To<PJRT_Buffer>(*buffer);
      }
      if (a->device_complete_events != nullptr) a->device_complete_events[d] = NewEvent(finish);
    }
    return Status::Ok();
  });
}

}  // namespace flexnpu::emulated
