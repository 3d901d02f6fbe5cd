// The objects behind the handles the emulated PJRT_Api gives out: a client of N emulated
// devices (each with its memory account and its execution timeline), buffers that are only
// metadata, and executables that share one CPU compile of their program (program.h).
#ifndef FLEXNPU_BACKEND_EMULATED_HANDLES_H_
#define FLEXNPU_BACKEND_EMULATED_HANDLES_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/emulated/config.h"
#include "pjrt_flexnpu/backend/emulated/program.h"
#include "pjrt_flexnpu/backend/own_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::emulated {

using own_api::From;
using own_api::To;
using own_api::ToError;

// Runs a slot's body; no exception leaves it.
template <typename F>
PJRT_Error* Run(F&& body) {
  return own_api::Run("emulated backend", std::forward<F>(body));
}

struct EmulatedClient;
struct EmulatedDevice;

struct EmulatedMemory {
  EmulatedDevice* device = nullptr;
  int id = 0;
  std::string debug;
  PJRT_Device* device_handle = nullptr;
};

// "1.50 GB (1500000000 bytes)".
std::string Bytes(int64_t bytes);

struct EmulatedDevice {
  EmulatedClient* client = nullptr;
  int id = 0;  // also the CPU compiler's device id: device assignments stay valid
  std::string kind;
  std::string debug;
  EmulatedMemory memory;
  PJRT_Memory* memory_handle = nullptr;

  // Reserves `bytes` of the device's memory, or RESOURCE_EXHAUSTED naming device, request
  // (`what`) and the free bytes.
  Status Allocate(int64_t bytes, const std::string& what);
  void Free(int64_t bytes);
  // An execution's memory at once: frees `released` (donated inputs), then needs `transient`
  // (temporaries) beside `kept` (outputs) and keeps `kept`; nothing changes when it fails.
  Status Exchange(int64_t released, int64_t kept, int64_t transient, const std::string& what);
  // Undoes a successful Exchange (a later device of the same execution did not fit).
  void Unexchange(int64_t released, int64_t kept);

  mutable std::mutex mu;
  int64_t limit = 0;
  int64_t in_use = 0;
  int64_t peak = 0;
  int64_t num_allocs = 0;
  int64_t largest_alloc = 0;
  // The timeline: executions run in order; the device is free from free_ns on (in order), or
  // co-run (Config::co_run): its compute and memory horizons and the executions not finished.
  int64_t free_ns = 0;
  double compute_free_ns = 0;
  double memory_free_ns = 0;
  std::vector<int64_t> running;  // their finish instants
  double busy_s = 0;  // modelled device time of the executions placed on it so far
  int64_t executions = 0;
};

struct EmulatedClient {
  Config config;
  std::shared_ptr<const PhysicalBackend> cpu;  // the compiler
  InnerClient cpu_client;
  std::string platform_version;
  // Shared with the buffers on them, which may outlive the client.
  std::vector<std::shared_ptr<EmulatedDevice>> devices;
  std::vector<PJRT_Device*> device_handles;
  std::vector<PJRT_Memory*> memory_handles;
  ProgramCache programs;

  std::shared_ptr<EmulatedDevice> DeviceWithId(int64_t id) const {
    return id >= 0 && static_cast<size_t>(id) < devices.size() ? devices[id] : nullptr;
  }
};

struct EmulatedBuffer {
  std::shared_ptr<EmulatedDevice> device;
  PJRT_Buffer_Type type = PJRT_Buffer_Type_INVALID;
  std::vector<int64_t> dims;
  std::vector<int64_t> minor_to_major;  // dense row-major: what the layout query points into
  int64_t bytes = 0;
  int64_t ready_ns = 0;
  std::atomic<bool> deleted{false};

  // Deletes it (returns its memory) unless it is already; true when this call did.
  bool Release() {
    if (deleted.exchange(true)) return false;
    device->Free(bytes);
    return true;
  }
  ~EmulatedBuffer() { Release(); }
};

// A new buffer on `device`, ready at `ready_ns`, its memory allocated (`what` names the
// request in the error when it does not fit) unless the caller has `reserved` it.
StatusOr<EmulatedBuffer*> NewBuffer(const std::shared_ptr<EmulatedDevice>& device,
                                    PJRT_Buffer_Type type, std::vector<int64_t> dims,
                                    int64_t ready_ns, const std::string& what,
                                    bool reserved = false);

struct EmulatedLoadedExecutable {
  EmulatedClient* client = nullptr;
  std::shared_ptr<const Program> program;
  bool portable = false;                 // runs on the execute_device it is given
  std::vector<std::shared_ptr<EmulatedDevice>> devices;  // its assignment, addressable order
  std::vector<PJRT_Device*> device_handles;
  std::atomic<bool> deleted{false};
};

struct EmulatedExecutable {
  std::shared_ptr<const Program> program;
};

// The device a handle names, as its client shares it.
inline std::shared_ptr<EmulatedDevice> SharedDevice(PJRT_Device* handle) {
  EmulatedDevice* d = From<EmulatedDevice>(handle);
  return d->client->devices[d->id];
}

}  // namespace flexnpu::emulated

#endif  // FLEXNPU_BACKEND_EMULATED_HANDLES_H_
