#include "pjrt_flexnpu/runtime/buffer.h"

#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/device.h"

namespace flexnpu {

namespace {

std::shared_ptr<PhysicalBuffer> MakePhysical(InnerBuffer handle, int physical_device,
                                             bool from_move) {
  // In the handle pool with its reference counts: no malloc per output or move.
  auto physical = std::allocate_shared<PhysicalBuffer>(handle_pool::Allocator<PhysicalBuffer>());
  physical->handle = std::move(handle);
  physical->physical_device = physical_device;
  physical->from_move = from_move;
  return physical;
}

}  // namespace

StatusOr<VirtualBuffer*> VirtualBuffer::Wrap(VirtualMemory* memory, InnerBuffer inner,
                                             int physical_device) {
  auto metadata = memory->device()->client()->backend().Metadata(inner.get());
  if (!metadata.ok()) return metadata.status();
  return WrapKnown(memory, std::move(inner), physical_device, *metadata);
}

VirtualBuffer* VirtualBuffer::WrapKnown(VirtualMemory* memory, InnerBuffer inner,
                                        int physical_device, const BufferMetadata& metadata) {
  auto* buffer =
      new VirtualBuffer(memory, MakePhysical(std::move(inner), physical_device, false));
  buffer->element_type_ = metadata.element_type;
  buffer->dims_.assign(metadata.dims.data(), metadata.dims.size());
  buffer->on_device_size_ = metadata.on_device_size;
  buffer->StartCounting();
  return buffer;
}

void VirtualBuffer::StartCounting() {
  memory_->device()->stats().Add(on_device_size_);
  counted_.store(true, std::memory_order_release);
}

VirtualBuffer::VirtualBuffer(VirtualMemory* memory, std::shared_ptr<PhysicalBuffer> physical)
    : Tagged(kTag, kPooled),
      client_(memory->device()->client()),
      memory_(memory),
      physical_(std::move(physical)),
      physical_device_(physical_->physical_device) {}

VirtualBuffer::~VirtualBuffer() {
  StopCounting();
  // External references JAX never released: give them back to the inner buffer before it
  // goes, so the backend does not keep its memory forever.
  while (external_references_ > 0 && pinned_ != nullptr) {
    if (!client_->backend().DecreaseExternalReferenceCount(pinned_->handle.get()).ok()) break;
    --external_references_;
  }
}

VirtualDevice* VirtualBuffer::device() const { return memory_->device(); }

void VirtualBuffer::StopCounting() {
  if (counted_.exchange(false, std::memory_order_acq_rel)) {
    memory_->device()->stats().Remove(on_device_size_);
  }
}

std::shared_ptr<PhysicalBuffer> VirtualBuffer::physical() const {
  std::lock_guard<SpinLock> lock(physical_mu_);
  return physical_;
}

StatusOr<std::shared_ptr<PhysicalBuffer>> VirtualBuffer::OnDevice(int physical_device) {
  {
    // Already there (every execution under passthrough, most under the other policies).
    std::lock_guard<SpinLock> lock(physical_mu_);
    if (physical_->physical_device == physical_device) return physical_;
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (physical_->physical_device == physical_device) return physical_;  // moved meanwhile
  const PhysicalBackend& b = client_->backend();
  PJRT_Memory* target = client_->PhysicalMemory(physical_device, memory_->kind_index());
  if (target == nullptr) {
    return FailedPrecondition("cannot move a buffer to physical device " +
                              std::to_string(physical_device) + ": it has no '" +
                              memory_->kind() + "' memory");
  }
  const int64_t start_ns = client_->trace()->enabled() ? Placer::NowNs() : 0;
  auto copy = b.CopyToMemory(physical_->handle.get(), target);
  if (!copy.ok()) return copy.status();
  if (start_ns != 0) {
    TraceEvent event;
    event.kind = TraceEvent::Kind::kMigration;
    event.physical_device = physical_->physical_device;
    event.target_device = physical_device;
    event.virtual_device = memory_->device()->index();
    event.start_ns = start_ns;
    event.end_ns = Placer::NowNs();
    event.bytes = on_device_size_;
    client_->trace()->Record(event);
  }
  // Publish the copy; the previous physical buffer lives on in whoever still holds it
  // (executions in flight, external references, handed-out addresses).
  std::shared_ptr<PhysicalBuffer> moved = MakePhysical(std::move(*copy), physical_device, true);
  {
    std::lock_guard<SpinLock> publish(physical_mu_);
    physical_.swap(moved);
  }
  moved.reset();  // the previous one, outside the spin lock (its last holder may be us)
  physical_device_.store(physical_device, std::memory_order_relaxed);
  client_->counters().migrations.fetch_add(1, std::memory_order_relaxed);
  client_->counters().bytes_migrated.fetch_add(on_device_size_, std::memory_order_relaxed);
  return physical_;
}

Status VirtualBuffer::Delete() {
  std::shared_ptr<PhysicalBuffer> physical = this->physical();
  FLEXNPU_RETURN_IF_ERROR(client_->backend().Delete(physical->handle.get()));
  deleted_.store(true, std::memory_order_release);
  StopCounting();
  return Status::Ok();
}

StatusOr<bool> VirtualBuffer::IsDeleted() const {
  return deleted_.load(std::memory_order_acquire);
}

void VirtualBuffer::NoteMaybeDonated() {
  if (deleted_.load(std::memory_order_acquire)) return;
  std::shared_ptr<PhysicalBuffer> physical = this->physical();
  auto deleted = client_->backend().IsDeleted(physical->handle.get());
  if (deleted.ok() && *deleted) {
    deleted_.store(true, std::memory_order_release);
    StopCounting();
  }
}

Status VirtualBuffer::AwaitComplete(PhysicalBuffer* physical) {
  if (!physical->from_move || physical->known_ready.load(std::memory_order_acquire)) {
    return Status::Ok();
  }
  const PhysicalBackend& b = client_->backend();
  auto event = b.ReadyEvent(physical->handle.get());
  if (!event.ok()) return event.status();
  FLEXNPU_RETURN_IF_ERROR(b.Await(event->get()));
  physical->known_ready.store(true, std::memory_order_release);
  return Status::Ok();
}

Status VirtualBuffer::IncreaseExternalReferenceCount() {
  std::shared_ptr<PhysicalBuffer> pinned;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (pinned_ == nullptr) pinned_ = physical_;
    pinned = pinned_;
    Status status = client_->backend().IncreaseExternalReferenceCount(pinned->handle.get());
    if (!status.ok()) {
      if (external_references_ == 0) pinned_.reset();
      return status;
    }
    ++external_references_;
  }
  // The caller reads the memory as soon as this returns: a copy still in flight must land
  // first (outside the lock: executions keep resolving the buffer meanwhile).
  return AwaitComplete(pinned.get());
}

Status VirtualBuffer::DecreaseExternalReferenceCount() {
  std::lock_guard<std::mutex> lock(mu_);
  if (external_references_ == 0) {
    return FailedPrecondition(
        "PJRT_Buffer_DecreaseExternalReferenceCount without a matching increase");
  }
  FLEXNPU_RETURN_IF_ERROR(
      client_->backend().DecreaseExternalReferenceCount(pinned_->handle.get()));
  if (--external_references_ == 0) pinned_.reset();
  return Status::Ok();
}

void VirtualBuffer::RetainAddressed(const std::shared_ptr<PhysicalBuffer>& physical) {
  for (const auto& kept : addressed_) {
    if (kept == physical) return;
  }
  addressed_.push_back(physical);
}

StatusOr<void*> VirtualBuffer::OpaqueDeviceMemoryDataPointer() {
  std::shared_ptr<PhysicalBuffer> physical;
  {
    std::lock_guard<std::mutex> lock(mu_);
    physical = pinned_ != nullptr ? pinned_ : physical_;
    if (pinned_ == nullptr) RetainAddressed(physical);
  }
  return client_->backend().OpaqueDeviceMemoryDataPointer(physical->handle.get());
}

StatusOr<uintptr_t> VirtualBuffer::UnsafePointer() {
  std::shared_ptr<PhysicalBuffer> physical;
  {
    std::lock_guard<std::mutex> lock(mu_);
    physical = pinned_ != nullptr ? pinned_ : physical_;
    if (pinned_ == nullptr) RetainAddressed(physical);
  }
  return client_->backend().UnsafePointer(physical->handle.get());
}

Status VirtualBuffer::UnpaddedDimensions(const int64_t** dims, size_t* num_dims) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!forwarded_.has_unpadded_dims) {
    FLEXNPU_ASSIGN_OR_RETURN(forwarded_.unpadded_dims,
                             client_->backend().UnpaddedDimensions(physical_->handle.get()));
    forwarded_.has_unpadded_dims = true;
  }
  *dims = forwarded_.unpadded_dims.data();
  *num_dims = forwarded_.unpadded_dims.size();
  return Status::Ok();
}

Status VirtualBuffer::DynamicDimensionIndices(const size_t** indices, size_t* num_indices) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!forwarded_.has_dynamic_dims) {
    FLEXNPU_ASSIGN_OR_RETURN(forwarded_.dynamic_dim_indices,
                             client_->backend().DynamicDimensionIndices(physical_->handle.get()));
    forwarded_.has_dynamic_dims = true;
  }
  *indices = forwarded_.dynamic_dim_indices.data();
  *num_indices = forwarded_.dynamic_dim_indices.size();
  return Status::Ok();
}

Status VirtualBuffer::MemoryLayout(PJRT_Buffer_MemoryLayout* layout) {
  std::lock_guard<std::mutex> lock(mu_);
  ForwardedMetadata& f = forwarded_;
  if (!f.has_layout) {
    FLEXNPU_ASSIGN_OR_RETURN(const PJRT_Buffer_MemoryLayout inner,
                             client_->backend().MemoryLayout(physical_->handle.get()));
    f.layout = PJRT_Buffer_MemoryLayout{};
    f.layout.struct_size = PJRT_Buffer_MemoryLayout_STRUCT_SIZE;
    f.layout.type = inner.type;
    if (inner.type == PJRT_Buffer_MemoryLayout_Type_Tiled) {
      const PJRT_Buffer_MemoryLayout_Tiled& t = inner.tiled;
      size_t num_tile_dims = 0;
      for (size_t i = 0; i < t.num_tiles; ++i) num_tile_dims += t.tile_dim_sizes[i];
      f.layout_ints.assign(t.minor_to_major, t.minor_to_major + t.minor_to_major_size);
      if (num_tile_dims > 0) {
        f.layout_ints.insert(f.layout_ints.end(), t.tile_dims, t.tile_dims + num_tile_dims);
      }
      if (t.num_tiles > 0) f.tile_dim_sizes.assign(t.tile_dim_sizes, t.tile_dim_sizes + t.num_tiles);
      f.layout.tiled.struct_size = PJRT_Buffer_MemoryLayout_Tiled_STRUCT_SIZE;
      f.layout.tiled.minor_to_major = f.layout_ints.data();
      f.layout.tiled.minor_to_major_size = t.minor_to_major_size;
      f.layout.tiled.tile_dims = f.layout_ints.data() + t.minor_to_major_size;
      f.layout.tiled.tile_dim_sizes = f.tile_dim_sizes.data();
      f.layout.tiled.num_tiles = t.num_tiles;
    } else {
      const PJRT_Buffer_MemoryLayout_Strides& st = inner.strides;
      f.layout_ints.assign(st.byte_strides, st.byte_strides + st.num_byte_strides);
      f.layout.strides.struct_size = PJRT_Buffer_MemoryLayout_Strides_STRUCT_SIZE;
      f.layout.strides.byte_strides = f.layout_ints.data();
      f.layout.strides.num_byte_strides = f.layout_ints.size();
    }
    f.has_layout = true;
  }
  *layout = f.layout;
  return Status::Ok();
}

}  // namespace flexnpu
