#include "pjrt_flexnpu/runtime/outputs.h"

#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/device.h"

namespace flexnpu {

Status ExecutableOutputs::Learn(PJRT_Buffer** inner_outputs) {
  const PhysicalBackend& b = client_->backend();
  std::vector<OutputInfo> outputs(count_);
  for (size_t i = 0; i < count_; ++i) {
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
  std::lock_guard<std::mutex> lock(mu_);
  if (!known_.load(std::memory_order_acquire)) {
    infos_ = std::move(outputs);
    known_.store(true, std::memory_order_release);
  }
  return Status::Ok();
}

Status ExecutableOutputs::Wrap(VirtualDevice* device, int physical_device, uint64_t producer,
                               PJRT_Buffer** inner_outputs, PJRT_Buffer** outputs) {
  const PhysicalBackend& b = client_->backend();
  Status status = known_.load(std::memory_order_acquire) ? Status::Ok() : Learn(inner_outputs);
  for (size_t i = 0; i < count_; ++i) {
    InnerBuffer inner = Own(b, inner_outputs[i]);
    inner_outputs[i] = nullptr;
    outputs[i] = nullptr;
    if (!status.ok()) continue;
    const OutputInfo& info = infos_[i];
    VirtualMemory* memory = info.kind_index >= 0 ? device->memory_of_kind(info.kind_index) : nullptr;
    if (memory == nullptr) memory = device->default_memory();
    if (!info.varies) {
      VirtualBuffer* buffer =
          VirtualBuffer::WrapKnown(memory, std::move(inner), physical_device, info.metadata);
      buffer->set_producer(producer);
      outputs[i] = ToHandle<PJRT_Buffer>(buffer);
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
    (*wrapped)->set_producer(producer);
    outputs[i] = ToHandle<PJRT_Buffer>(*wrapped);
  }
  return status;
}

}  // namespace flexnpu
