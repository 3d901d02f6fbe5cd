// A program as the emulated backend knows it: compiled once by the XLA CPU plugin (never run)
// for its outputs' shapes and its optimized HLO, whose xla_passes analysis gives the FLOPs and
// bytes that the preset's cost model (xla_passes::ModelledSeconds) turns into its duration.
#ifndef FLEXNPU_BACKEND_EMULATED_PROGRAM_H_
#define FLEXNPU_BACKEND_EMULATED_PROGRAM_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <future>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/emulated/config.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::emulated {

struct OutputShape {
  PJRT_Buffer_Type type = PJRT_Buffer_Type_INVALID;
  std::vector<int64_t> dims;
  int64_t bytes = 0;
};

struct Program {
  std::string name;  // the module's, for messages
  std::shared_ptr<const PhysicalBackend> cpu;
  InnerLoadedExecutable cpu_loaded;  // answers the executable queries; never executed
  InnerExecutable cpu_executable;
  std::vector<OutputShape> outputs;  // of one device's execution
  // Parameters an execution consumes (input_output_alias and buffer donors), sorted; those of
  // `must_alias` are consumed even when the caller says they are not donatable.
  std::vector<int64_t> donated;
  std::vector<int64_t> must_alias;
  // What the compiler says one execution needs beside its inputs.
  int64_t output_bytes = 0;
  int64_t temp_bytes = 0;
  // The cost model on the preset: FLOPs and bytes as xla_passes::Classify counts them for
  // the preset (a native low-precision device: the CPU compile's convert kernels removed),
  // the modelled seconds (device time) and the wall-clock duration (x time_scale).
  double flops = 0;
  double bytes = 0;
  double modelled_s = 0;
  int64_t duration_ns = 0;
  // Its parts on the wall clock (x time_scale), for devices that co-run executions:
  // FLOPs / achieved FLOP/s, bytes / achieved bandwidth, and the launch cost.
  double compute_ns = 0;
  double memory_ns = 0;
  double launch_ns = 0;
  // The first custom call that must run on the host (a Python callback), "" when none.
  std::string host_callback;
};

// The custom-call targets that run host code (jax.debug.callback / print, pure_callback,
// io_callback, buffer_callback lower to them): their names contain "callback".
bool IsHostCallbackTarget(std::string_view target);

// The compiled programs of one client, by ProgramKey: compiled on first need (a concurrent
// request for the same key waits for that compile), kept while an executable uses them.
class ProgramCache {
 public:
  using Result = StatusOr<std::shared_ptr<const Program>>;
  Result Get(const std::string& key, const std::function<Result()>& compile);
  int64_t compiles() const { return compiles_.load(std::memory_order_relaxed); }

 private:
  struct Entry {
    std::shared_future<Result> pending;  // valid while the first compile runs
    std::weak_ptr<const Program> done;
  };
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
  size_t sweep_at_ = 64;
  std::atomic<int64_t> compiles_{0};
};

// The compile options as a key for any device: without what only names devices (device
// assignment, device ordinal, portability), in CompileOptionsKey's canonical field order.
StatusOr<std::string> DeviceFreeOptionsKey(std::string_view options);

// The cache key of a program: format, code and DeviceFreeOptionsKey. The runtime's per-device
// variants of one program (runtime/compile_cache.h) share it.
StatusOr<std::string> ProgramKey(const PJRT_Program& program, std::string_view options);

// A Program from a loaded CPU executable: its outputs, aliases, memory and cost.
StatusOr<std::shared_ptr<const Program>> AnalyzeProgram(std::shared_ptr<const PhysicalBackend> cpu,
                                                        InnerLoadedExecutable loaded,
                                                        const Config& config);

}  // namespace flexnpu::emulated

#endif  // FLEXNPU_BACKEND_EMULATED_PROGRAM_H_
