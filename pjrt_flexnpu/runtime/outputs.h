// A virtual executable's outputs: what every execution's outputs look like, learnt from the
// first one, so that later outputs are wrapped as FlexNPU buffers without asking the backend.
#ifndef FLEXNPU_RUNTIME_OUTPUTS_H_
#define FLEXNPU_RUNTIME_OUTPUTS_H_

#include <atomic>
#include <cstdint>
#include <mutex>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/runtime/buffer.h"

namespace flexnpu {

class VirtualClient;
class VirtualDevice;

class ExecutableOutputs {
 public:
  explicit ExecutableOutputs(VirtualClient* client) : client_(client) {}
  size_t count() const { return count_; }
  void set_count(size_t count) { count_ = count; }
  // Wraps one device's inner outputs as buffers of `device`; takes ownership of them.
  // `producer`: the placer's ticket of the execution that computes them (0: untracked).
  Status Wrap(VirtualDevice* device, int physical_device, uint64_t producer,
              PJRT_Buffer** inner_outputs, PJRT_Buffer** outputs);

 private:
  struct OutputInfo {
    BufferMetadata metadata;
    int kind_index;
    // Dynamically shaped (bounded) output: dims and size can differ per execution, so they
    // are asked of the backend every time.
    bool varies = false;
  };
  Status Learn(PJRT_Buffer** inner_outputs);

  VirtualClient* client_;
  size_t count_ = 0;
  std::atomic<bool> known_{false};
  std::mutex mu_;
  std::vector<OutputInfo> infos_;
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_OUTPUTS_H_
