// Virtual buffers: what JAX holds. Each knows the physical buffer behind it and can move to
// another physical device; JAX always sees the virtual device and memory it placed it on.
#ifndef FLEXNPU_RUNTIME_BUFFER_H_
#define FLEXNPU_RUNTIME_BUFFER_H_

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/backend/physical_backend.h"
#include "pjrt_flexnpu/base/spin_lock.h"
#include "pjrt_flexnpu/base/status.h"
#include "pjrt_flexnpu/runtime/handles.h"

namespace flexnpu {

class VirtualClient;
class VirtualDevice;
class VirtualMemory;

// One physical incarnation of a virtual buffer. Shared: whoever uses its inner handle or an
// address inside it holds a reference, so a move that publishes a successor never frees memory
// still in use.
struct PhysicalBuffer {
  InnerBuffer handle;
  int physical_device;
  // Made by a move (an asynchronous copy): host readers of its memory must wait for it first.
  bool from_move = false;
  std::atomic<bool> known_ready{false};
};

// A buffer's dimensions, inline up to rank 6: wrapping an output allocates nothing for them.
class BufferDims {
 public:
  void assign(const int64_t* dims, size_t n) {
    size_ = n;
    if (n <= kInline) {
      std::copy(dims, dims + n, inline_);
      heap_.clear();
    } else {
      heap_.assign(dims, dims + n);
    }
  }
  const int64_t* data() const { return size_ <= kInline ? inline_ : heap_.data(); }
  size_t size() const { return size_; }

 private:
  static constexpr size_t kInline = 6;
  size_t size_ = 0;
  int64_t inline_[kInline] = {};
  std::vector<int64_t> heap_;
};

class VirtualBuffer : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kBuffer;
  FLEXNPU_POOLED_HANDLE

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
  const BufferDims& dims() const { return dims_; }
  int64_t on_device_size() const { return on_device_size_; }

  // The physical buffer now behind this one; holding the pointer keeps it alive.
  std::shared_ptr<PhysicalBuffer> physical() const;
  // The physical device it is on now (for placement decisions: no reference taken).
  int physical_device() const { return physical_device_.load(std::memory_order_relaxed); }
  // The placer's ticket of the execution whose output this is (0: none or untracked): work
  // that reads it cannot start before that one finishes. Set once, before the buffer is
  // handed out.
  uint64_t producer() const { return producer_; }
  void set_producer(uint64_t ticket) { producer_ = ticket; }

  // The physical buffer on `physical_device`, moving this buffer there first if needed (a copy
  // through the backend published as the new physical buffer; the old one goes when its last
  // holder does). Returns the one it published or found, even if another thread moves the
  // buffer again right after.
  StatusOr<std::shared_ptr<PhysicalBuffer>> OnDevice(int physical_device);

  // Deletes the device memory; the handle stays valid and answers IsDeleted.
  Status Delete();
  // Answered without the backend (JAX asks it of every argument of every execution): the
  // device memory only goes through Delete or a donation, which NoteMaybeDonated observes.
  StatusOr<bool> IsDeleted() const;
  // Called after every launch (failed ones too) of a program that may have donated this
  // buffer: asks the backend, and once it reports the buffer consumed, the buffer is deleted
  // and its bytes are no longer counted.
  void NoteMaybeDonated();

  // External references (zero-copy host views) pin one physical buffer: while any is held, the
  // data pointers below name that buffer's memory, which stays alive and unmoved however often
  // the virtual buffer moves. The first reference waits until a moved-in copy is complete.
  Status IncreaseExternalReferenceCount();
  Status DecreaseExternalReferenceCount();
  // Addresses of device memory. Without an external reference, the physical buffer they point
  // into is kept until this virtual buffer is destroyed, so the address stays valid.
  StatusOr<void*> OpaqueDeviceMemoryDataPointer();
  StatusOr<uintptr_t> UnsafePointer();

  // Inner metadata that PJRT returns by pointer, copied into this buffer on first use so the
  // pointers stay valid for the buffer's lifetime, however often it moves.
  Status UnpaddedDimensions(const int64_t** dims, size_t* num_dims);
  Status DynamicDimensionIndices(const size_t** indices, size_t* num_indices);
  Status MemoryLayout(PJRT_Buffer_MemoryLayout* layout);

 private:
  VirtualBuffer(VirtualMemory* memory, std::shared_ptr<PhysicalBuffer> physical);
  void StartCounting();
  void StopCounting();

  VirtualClient* client_;
  VirtualMemory* memory_;
  PJRT_Buffer_Type element_type_ = PJRT_Buffer_Type_INVALID;
  BufferDims dims_;
  int64_t on_device_size_ = 0;
  uint64_t producer_ = 0;
  std::atomic<bool> counted_{false};
  std::atomic<bool> deleted_{false};  // by Delete or a donation

  // The pinned physical buffer for external references, waiting for it to be complete first
  // when it came from a move.
  Status AwaitComplete(PhysicalBuffer* physical);
  // Keeps `physical` alive until destruction: an address inside it was handed out.
  void RetainAddressed(const std::shared_ptr<PhysicalBuffer>& physical);

  // mu_ orders moves, external references and the metadata copies; physical_ is written
  // under mu_ and physical_mu_ both, so it is read under either: executions and readers that
  // only want the buffer as it is take the spin lock alone.
  mutable std::mutex mu_;
  mutable SpinLock physical_mu_;
  std::shared_ptr<PhysicalBuffer> physical_;
  std::atomic<int> physical_device_;  // physical_->physical_device, readable without mu_
  // What external references pin (null when there are none) and how many there are.
  std::shared_ptr<PhysicalBuffer> pinned_;
  int64_t external_references_ = 0;
  // Physical buffers whose addresses were handed out without an external reference.
  std::vector<std::shared_ptr<PhysicalBuffer>> addressed_;
  // Copies of inner metadata (see UnpaddedDimensions); filled once each, under mu_.
  struct ForwardedMetadata {
    bool has_unpadded_dims = false;
    std::vector<int64_t> unpadded_dims;
    bool has_dynamic_dims = false;
    std::vector<size_t> dynamic_dim_indices;
    bool has_layout = false;
    PJRT_Buffer_MemoryLayout layout{};
    std::vector<int64_t> layout_ints;  // minor_to_major then tile_dims, or byte_strides
    std::vector<size_t> tile_dim_sizes;
  };
  ForwardedMetadata forwarded_;
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_BUFFER_H_
