// Virtual devices, their memories and descriptions, and the virtual topology.
#ifndef FLEXNPU_RUNTIME_DEVICE_H_
#define FLEXNPU_RUNTIME_DEVICE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/runtime/handles.h"

namespace flexnpu {

class VirtualClient;
class VirtualDevice;
class VirtualMemory;

// Bytes FlexNPU holds on one virtual device: the buffers alive there, whatever physical
// device they currently occupy. Lock-free; updated on buffer creation, deletion and donation.
class MemoryStats {
 public:
  void Add(int64_t bytes);
  void Remove(int64_t bytes);
  int64_t bytes_in_use() const { return bytes_in_use_.load(std::memory_order_relaxed); }
  int64_t peak_bytes_in_use() const { return peak_.load(std::memory_order_relaxed); }
  int64_t num_allocs() const { return num_allocs_.load(std::memory_order_relaxed); }
  int64_t largest_alloc_size() const { return largest_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> bytes_in_use_{0};
  std::atomic<int64_t> peak_{0};
  std::atomic<int64_t> num_allocs_{0};
  std::atomic<int64_t> largest_{0};
};

class DeviceDescription : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kDeviceDescription;
  // `kind`: "virtual NPU", or the physical device's kind when the client presents the
  // physical platform (option platform_name).
  DeviceDescription(int id, int physical_device, const std::string& backend_platform,
                    std::string kind);

  int id() const { return id_; }
  const std::string& kind() const { return kind_; }
  const std::string& debug_string() const { return debug_string_; }
  const std::string& to_string() const { return to_string_; }
  const std::vector<PJRT_NamedValue>& attributes() const { return attributes_; }
  // The device described (the MemoryDescriptions extension asks its physical device).
  const VirtualDevice* device() const { return device_; }

 private:
  friend class VirtualDevice;
  const VirtualDevice* device_ = nullptr;
  int id_;
  std::string kind_;
  std::string debug_string_;
  std::string to_string_;
  int64_t physical_device_;
  std::string backend_platform_;
  std::vector<PJRT_NamedValue> attributes_;  // points into the members above
};

class VirtualDevice : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kDevice;
  VirtualDevice(VirtualClient* client, int index, int home_physical,
                const std::string& backend_platform, std::string kind)
      : Tagged(kTag),
        client_(client),
        index_(index),
        home_physical_(home_physical),
        description_(index, home_physical, backend_platform, std::move(kind)) {
    description_.device_ = this;
  }

  VirtualClient* client() const { return client_; }
  int index() const { return index_; }  // also its id and local hardware id
  int home_physical() const { return home_physical_; }
  DeviceDescription* description() { return &description_; }
  MemoryStats& stats() { return stats_; }
  // This device's share of its home physical device's memory (0: unknown).
  int64_t bytes_limit() const { return bytes_limit_; }

  // Memories by the client's memory-kind index (nullptr where the kind is absent).
  VirtualMemory* memory_of_kind(int kind_index) const { return memories_by_kind_[kind_index]; }
  VirtualMemory* default_memory() const { return default_memory_; }
  const std::vector<PJRT_Memory*>& memory_handles() const { return memory_handles_; }

 private:
  friend class VirtualClient;
  VirtualClient* client_;
  int index_;
  int home_physical_;
  DeviceDescription description_;
  MemoryStats stats_;
  int64_t bytes_limit_ = 0;
  std::vector<VirtualMemory*> memories_by_kind_;
  std::vector<PJRT_Memory*> memory_handles_;
  VirtualMemory* default_memory_ = nullptr;
};

class VirtualMemory : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kMemory;
  VirtualMemory(VirtualDevice* device, int id, int kind_index, std::string kind, int kind_id);

  VirtualDevice* device() const { return device_; }
  int id() const { return id_; }
  int kind_index() const { return kind_index_; }
  const std::string& kind() const { return kind_; }
  int kind_id() const { return kind_id_; }
  const std::string& debug_string() const { return debug_string_; }
  const std::string& to_string() const { return to_string_; }
  PJRT_Device* const* device_handle() const { return &device_handle_; }

 private:
  VirtualDevice* device_;
  int id_;
  int kind_index_;
  std::string kind_;
  int kind_id_;
  std::string debug_string_;
  std::string to_string_;
  PJRT_Device* device_handle_;
};

class Topology : public Tagged {
 public:
  static constexpr Tag kTag = Tag::kTopology;
  explicit Topology(VirtualClient* client) : Tagged(kTag), client_(client) {}
  VirtualClient* client() const { return client_; }
  // What compiled programs depend on, as bytes (JAX hashes them into its persistent-cache key):
  // the platform name and version (physical backend and its build, executable format) and the
  // kinds of the physical devices. Device counts and the virtual-to-physical mapping are left
  // out: FlexNPU's serialized executables load under any of them (they are rebuilt for the
  // placement), so a cache written with 4 virtual devices serves 8 over the same backend.
  std::string Serialize() const;
  const std::vector<PJRT_DeviceDescription*>& descriptions() const { return descriptions_; }

 private:
  friend class VirtualClient;
  VirtualClient* client_;
  std::vector<PJRT_DeviceDescription*> descriptions_;
};

}  // namespace flexnpu

#endif  // FLEXNPU_RUNTIME_DEVICE_H_
