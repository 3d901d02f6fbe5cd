// Emulated device memory: an account of the preset's bytes, no host memory behind it.
#include <cstdio>

#include "pjrt_flexnpu/backend/emulated/handles.h"
#include "pjrt_flexnpu/backend/remote/protocol.h"  // HostElementBytes

namespace flexnpu::emulated {

std::string Bytes(int64_t bytes) {
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f GB (%lld bytes)", static_cast<double>(bytes) / 1e9,
                static_cast<long long>(bytes));
  return text;
}

namespace {

Status OutOfMemory(const EmulatedDevice& d, int64_t request, const std::string& what,
                   const std::string& detail = "") {
  return ResourceExhausted("emulated " + d.client->config.preset.name + " device " +
                           std::to_string(d.id) + ": out of memory: " + what + " needs " +
                           Bytes(request) + " but " + Bytes(d.limit - d.in_use) + " of " +
                           Bytes(d.limit) + " are free" + detail);
}

}  // namespace

Status EmulatedDevice::Allocate(int64_t bytes, const std::string& what) {
  std::lock_guard<std::mutex> lock(mu);
  if (bytes > limit - in_use) return OutOfMemory(*this, bytes, what);
  in_use += bytes;
  peak = std::max(peak, in_use);
  ++num_allocs;
  largest_alloc = std::max(largest_alloc, bytes);
  return Status::Ok();
}

void EmulatedDevice::Free(int64_t bytes) {
  std::lock_guard<std::mutex> lock(mu);
  in_use -= bytes;
}

Status EmulatedDevice::Exchange(int64_t released, int64_t kept, int64_t transient,
                                const std::string& what) {
  std::lock_guard<std::mutex> lock(mu);
  const int64_t need = kept + transient;
  if (need > limit - in_use + released) {
    return OutOfMemory(*this, need, what,
                       " (outputs " + Bytes(kept) + " + temporaries " + Bytes(transient) +
                           "; donated inputs give back " + Bytes(released) + ")");
  }
  in_use -= released;
  peak = std::max(peak, in_use + need);
  in_use += kept;
  if (kept > 0) {
    ++num_allocs;
    largest_alloc = std::max(largest_alloc, kept);
  }
  return Status::Ok();
}

void EmulatedDevice::Unexchange(int64_t released, int64_t kept) {
  std::lock_guard<std::mutex> lock(mu);
  in_use += released - kept;
}

StatusOr<EmulatedBuffer*> NewBuffer(const std::shared_ptr<EmulatedDevice>& device,
                                    PJRT_Buffer_Type type, std::vector<int64_t> dims,
                                    int64_t ready_ns, const std::string& what, bool reserved) {
  const size_t element = daemon::HostElementBytes(type);
  if (element == 0 && type != PJRT_Buffer_Type_TOKEN) {
    return InvalidArgument("emulated backend: element type " + std::to_string(type) +
                           " cannot be held in a buffer");
  }
  int64_t elements = 1;
  for (int64_t d : dims) {
    if (d < 0) return InvalidArgument("emulated backend: negative dimension in " + what);
    elements *= d;
  }
  const int64_t bytes = elements * static_cast<int64_t>(element);
  if (!reserved) FLEXNPU_RETURN_IF_ERROR(device->Allocate(bytes, what));
  auto* buffer = new EmulatedBuffer();
  buffer->device = device;
  buffer->type = type;
  buffer->bytes = bytes;
  buffer->ready_ns = ready_ns;
  for (size_t i = dims.size(); i > 0; --i) {
    buffer->minor_to_major.push_back(static_cast<int64_t>(i - 1));
  }
  buffer->dims = std::move(dims);
  return buffer;
}

}  // namespace flexnpu::emulated
