// Virtual buffers: what JAX holds. Each knows the physical buffer behind it and can move to
// another physical device; JAX always sees the virtual device and memory it placed it on.
#ifndef FLEXNPU_RUNTIME_BUFFER_H_
#define FLEXNPU_RUNTIME_BUFFER_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/runtime/handles.h"
#include "pjrt_flexnpu/runtime/status.h"

namespace flexnpu {

class VirtualClient;
class VirtualDevice;
class VirtualMemory;

struct PhysicalBuffer {
  InnerBuffer handle;
  int physical_device;
};

// What JAX asks of a buffer, read once from the backend.
struct BufferMetadata {
  PJRT_Buffer_Type element_type = PJRT_Buffer_Type_INVALID;
  std::vector<int64_t> dims;
  int64_t on_device_size = 0;
};
StatusOr<BufferMetadata> QueryBufferMetadata(const PhysicalBackend& backend, PJRT_Buffer* buffer);

class VirtualBuffer : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kBuffer;

  // Wraps an inner buffer that lives on `physical_device`, as a buffer of `memory`.
  static StatusOr<VirtualBuffer*> Wrap(VirtualMemory* memory, InnerBuffer inner,
                                       int physical_device);
  // The same without asking the backend: the caller knows the buffer's metadata (outputs of
  // an executable whose output shapes it has seen).
  static VirtualBuffer* WrapKnown(VirtualMemory* memory, InnerBuffer inner, int physical_device,
                                  const BufferMetadata& metadata);
  ~VirtualBuffer();

  VirtualClient* client() const { return client_; }
  VirtualMemory* memory() const { return memory_; }
  VirtualDevice* device() const;
  PJRT_Buffer_Type element_type() const { return element_type_; }
  const std::vector<int64_t>& dims() const { return dims_; }
  int64_t on_device_size() const { return on_device_size_; }

  // The physical buffer now behind this one; holding the pointer keeps it alive.
  std::shared_ptr<PhysicalBuffer> physical() const;

  // Makes the buffer live on `physical_device` (a copy through the backend, then the old
  // physical buffer is released). A no-op when it is there already.
  Status MoveTo(int physical_device);

  // Deletes the device memory; the handle stays valid and answers IsDeleted.
  Status Delete();
  StatusOr<bool> IsDeleted() const;
  // Called after an execution that may have donated this buffer: stops counting its bytes
  // once the backend reports it consumed.
  void NoteMaybeDonated();

  Status IncreaseExternalReferenceCount();
  Status DecreaseExternalReferenceCount();

 private:
  VirtualBuffer(VirtualMemory* memory, std::shared_ptr<PhysicalBuffer> physical);
  void StartCounting();
  void StopCounting();

  VirtualClient* client_;
  VirtualMemory* memory_;
  PJRT_Buffer_Type element_type_ = PJRT_Buffer_Type_INVALID;
  std::vector<int64_t> dims_;
  int64_t on_device_size_ = 0;
  std::atomic<bool> counted_{false};

  mutable std::mutex mu_;
  std::shared_ptr<PhysicalBuffer> physical_;
  // Physical buffers whose memory JAX aliases (external references): kept alive even if the
  // virtual buffer moves, until the matching decrease.
  std::vector<std::shared_ptr<PhysicalBuffer>> externally_referenced_;
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_BUFFER_H_
