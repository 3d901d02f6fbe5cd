#include "pjrt_flexnpu/runtime/device.h"

#include <algorithm>

#include "pjrt_flexnpu/runtime/client.h"

namespace flexnpu {
namespace {

PJRT_NamedValue StringAttribute(const char* name, const std::string& value) {
  PJRT_NamedValue v{};
  v.struct_size = PJRT_NamedValue_STRUCT_SIZE;
  v.name = name;
  v.name_size = std::char_traits<char>::length(name);
  v.type = PJRT_NamedValue_kString;
  v.string_value = value.c_str();
  v.value_size = value.size();
  return v;
}

}  // namespace

void MemoryStats::Add(int64_t bytes) {
  const int64_t now = bytes_in_use_.fetch_add(bytes, std::memory_order_relaxed) + bytes;
  num_allocs_.fetch_add(1, std::memory_order_relaxed);
  int64_t peak = peak_.load(std::memory_order_relaxed);
  while (now > peak && !peak_.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
  int64_t largest = largest_.load(std::memory_order_relaxed);
  while (bytes > largest &&
         !largest_.compare_exchange_weak(largest, bytes, std::memory_order_relaxed)) {
  }
}

void MemoryStats::Remove(int64_t bytes) {
  bytes_in_use_.fetch_sub(bytes, std::memory_order_relaxed);
}

DeviceDescription::DeviceDescription(int id, int physical_device,
                                     const std::string& backend_platform, std::string kind)
    : Tagged(kTag),
      id_(id),
      kind_(std::move(kind)),
      debug_string_("flexnpu:" + std::to_string(id)),
      to_string_("FlexNpuDevice(id=" + std::to_string(id) + ", virtual NPU over " +
                 backend_platform + ":" + std::to_string(physical_device) + ")"),
      physical_device_(physical_device),
      backend_platform_(backend_platform) {
  attributes_.push_back(Int64NamedValue("home_physical_device", physical_device_));
  attributes_.push_back(StringAttribute("physical_platform", backend_platform_));
}

VirtualMemory::VirtualMemory(VirtualDevice* device, int id, int kind_index, std::string kind,
                             int kind_id)
    : Tagged(kTag),
      device_(device),
      id_(id),
      kind_index_(kind_index),
      kind_(std::move(kind)),
      kind_id_(kind_id),
      debug_string_("flexnpu:" + std::to_string(device->index()) + ":" + kind_),
      to_string_("FlexNpuMemory(device=" + std::to_string(device->index()) + ", kind=" + kind_ +
                 ")"),
      device_handle_(ToHandle<PJRT_Device>(device)) {}

std::string Topology::Serialize() const {
  // Length-prefixed fields, so no value can be mistaken for another's boundary.
  std::string out;
  auto add = [&out](const std::string& field) {
    out += std::to_string(field.size());
    out += ':';
    out += field;
  };
  add("flexnpu-topology/1");
  add(client_->platform_name());
  add(client_->platform_version());
  std::vector<std::string> kinds;
  for (int p = 0; p < client_->num_physical(); ++p) kinds.push_back(client_->physical(p).kind);
  std::sort(kinds.begin(), kinds.end());
  kinds.erase(std::unique(kinds.begin(), kinds.end()), kinds.end());
  for (const std::string& kind : kinds) add(kind);
  return out;
}

}  // namespace flexnpu
