#include "pjrt_flexnpu/runtime/buffer.h"

#include "pjrt_flexnpu/runtime/client.h"
#include "pjrt_flexnpu/runtime/device.h"

namespace flexnpu {

StatusOr<BufferMetadata> QueryBufferMetadata(const PhysicalBackend& b, PJRT_Buffer* buffer) {
  BufferMetadata metadata;
  PJRT_Buffer_ElementType_Args type_args{};
  type_args.struct_size = PJRT_Buffer_ElementType_Args_STRUCT_SIZE;
  type_args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b, PJRT_Buffer_ElementType, &type_args));
  metadata.element_type = type_args.type;
  PJRT_Buffer_Dimensions_Args dims_args{};
  dims_args.struct_size = PJRT_Buffer_Dimensions_Args_STRUCT_SIZE;
  dims_args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b, PJRT_Buffer_Dimensions, &dims_args));
  metadata.dims.assign(dims_args.dims, dims_args.dims + dims_args.num_dims);
  PJRT_Buffer_OnDeviceSizeInBytes_Args size_args{};
  size_args.struct_size = PJRT_Buffer_OnDeviceSizeInBytes_Args_STRUCT_SIZE;
  size_args.buffer = buffer;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b, PJRT_Buffer_OnDeviceSizeInBytes, &size_args));
  metadata.on_device_size = static_cast<int64_t>(size_args.on_device_size_in_bytes);
  return metadata;
}

StatusOr<VirtualBuffer*> VirtualBuffer::Wrap(VirtualMemory* memory, InnerBuffer inner,
                                             int physical_device) {
  auto metadata = QueryBufferMetadata(memory->device()->client()->backend(), inner.get());
  if (!metadata.ok()) return metadata.status();
  return WrapKnown(memory, std::move(inner), physical_device, *metadata);
}

VirtualBuffer* VirtualBuffer::WrapKnown(VirtualMemory* memory, InnerBuffer inner,
                                        int physical_device, const BufferMetadata& metadata) {
  auto* buffer = new VirtualBuffer(
      memory, std::make_shared<PhysicalBuffer>(PhysicalBuffer{std::move(inner), physical_device}));
  buffer->element_type_ = metadata.element_type;
  buffer->dims_ = metadata.dims;
  buffer->on_device_size_ = metadata.on_device_size;
  buffer->StartCounting();
  return buffer;
}

void VirtualBuffer::StartCounting() {
  memory_->device()->stats().Add(on_device_size_);
  counted_.store(true, std::memory_order_release);
}

VirtualBuffer::VirtualBuffer(VirtualMemory* memory, std::shared_ptr<PhysicalBuffer> physical)
    : Tagged(kTag),
      client_(memory->device()->client()),
      memory_(memory),
      physical_(std::move(physical)) {}

VirtualBuffer::~VirtualBuffer() { StopCounting(); }

VirtualDevice* VirtualBuffer::device() const { return memory_->device(); }

void VirtualBuffer::StopCounting() {
  if (counted_.exchange(false, std::memory_order_acq_rel)) {
    memory_->device()->stats().Remove(on_device_size_);
  }
}

std::shared_ptr<PhysicalBuffer> VirtualBuffer::physical() const {
  std::lock_guard<std::mutex> lock(mu_);
  return physical_;
}

Status VirtualBuffer::MoveTo(int physical_device) {
  std::lock_guard<std::mutex> lock(mu_);
  if (physical_->physical_device == physical_device) return Status::Ok();
  const PhysicalBackend& b = client_->backend();
  PJRT_Memory* target = client_->PhysicalMemory(physical_device, memory_->kind_index());
  if (target == nullptr) {
    return FailedPrecondition("cannot move a buffer to physical device " +
                              std::to_string(physical_device) + ": it has no '" +
                              memory_->kind() + "' memory");
  }
  PJRT_Buffer_CopyToMemory_Args args{};
  args.struct_size = PJRT_Buffer_CopyToMemory_Args_STRUCT_SIZE;
  args.buffer = physical_->handle.get();
  args.dst_memory = target;
  const int64_t start_ns = client_->trace()->enabled() ? Placer::NowNs() : 0;
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(b, PJRT_Buffer_CopyToMemory, &args));
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
  physical_ = std::make_shared<PhysicalBuffer>(
      PhysicalBuffer{Own(b, args.dst_buffer), physical_device});
  client_->counters().migrations.fetch_add(1, std::memory_order_relaxed);
  client_->counters().bytes_migrated.fetch_add(on_device_size_, std::memory_order_relaxed);
  return Status::Ok();
}

Status VirtualBuffer::Delete() {
  std::shared_ptr<PhysicalBuffer> physical = this->physical();
  PJRT_Buffer_Delete_Args args{};
  args.struct_size = PJRT_Buffer_Delete_Args_STRUCT_SIZE;
  args.buffer = physical->handle.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(client_->backend(), PJRT_Buffer_Delete, &args));
  StopCounting();
  return Status::Ok();
}

StatusOr<bool> VirtualBuffer::IsDeleted() const {
  std::shared_ptr<PhysicalBuffer> physical = this->physical();
  PJRT_Buffer_IsDeleted_Args args{};
  args.struct_size = PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE;
  args.buffer = physical->handle.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(client_->backend(), PJRT_Buffer_IsDeleted, &args));
  return args.is_deleted;
}

void VirtualBuffer::NoteMaybeDonated() {
  if (!counted_.load(std::memory_order_acquire)) return;
  auto deleted = IsDeleted();
  if (deleted.ok() && *deleted) StopCounting();
}

Status VirtualBuffer::IncreaseExternalReferenceCount() {
  std::lock_guard<std::mutex> lock(mu_);
  PJRT_Buffer_IncreaseExternalReferenceCount_Args args{};
  args.struct_size = PJRT_Buffer_IncreaseExternalReferenceCount_Args_STRUCT_SIZE;
  args.buffer = physical_->handle.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(client_->backend(),
                                             PJRT_Buffer_IncreaseExternalReferenceCount, &args));
  externally_referenced_.push_back(physical_);
  return Status::Ok();
}

Status VirtualBuffer::DecreaseExternalReferenceCount() {
  std::lock_guard<std::mutex> lock(mu_);
  if (externally_referenced_.empty()) {
    return FailedPrecondition(
        "PJRT_Buffer_DecreaseExternalReferenceCount without a matching increase");
  }
  PJRT_Buffer_DecreaseExternalReferenceCount_Args args{};
  args.struct_size = PJRT_Buffer_DecreaseExternalReferenceCount_Args_STRUCT_SIZE;
  args.buffer = externally_referenced_.back()->handle.get();
  FLEXNPU_RETURN_IF_ERROR(FLEXNPU_INNER_CALL(client_->backend(),
                                             PJRT_Buffer_DecreaseExternalReferenceCount, &args));
  externally_referenced_.pop_back();
  return Status::Ok();
}

}  // namespace flexnpu
