// Rewriting xla.CompileOptionsProto at the wire level: virtual device ids in, a portable
// single-device compile or a physical device assignment out. Unknown fields are kept.
#ifndef FLEXNPU_BACKEND_COMPILE_OPTIONS_H_
#define FLEXNPU_BACKEND_COMPILE_OPTIONS_H_

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_flexnpu/base/status.h"

namespace flexnpu {

struct CompileOptionsInfo {
  int64_t num_replicas = 1;
  int64_t num_partitions = 1;
  bool compile_portable = false;
  bool has_device_assignment = false;
  // Device ids in PJRT's addressable order: index = replica * num_partitions + partition.
  std::vector<int64_t> device_ids;
};

StatusOr<CompileOptionsInfo> ReadCompileOptions(std::string_view serialized);

// The same options, compiled portable: no device assignment, one replica and partition.
StatusOr<std::string> RewriteAsPortable(std::string_view serialized);

// The same options with the device assignment replaced by `device_ids` (addressable order).
StatusOr<std::string> RewriteDeviceAssignment(std::string_view serialized,
                                              const std::vector<int64_t>& device_ids);

// The same options without what only chooses devices (device assignment, device ordinal,
// portability): equal for the per-device variants of one program.
StatusOr<std::string> WithoutDeviceChoice(std::string_view serialized);
// The options as the key of what they compile to, for any device: the device assignment
// dropped and repeated entries in a canonical order (protobuf writes map fields, e.g. of the
// debug options, in hash order, so equal options can differ byte for byte).
StatusOr<std::string> CompileOptionsKey(std::string_view serialized);

// Field numbers from openxla/xla xla/pjrt/proto/compile_options.proto and xla/xla.proto.
namespace compile_options_fields {
inline constexpr uint32_t kBuildOptions = 3;        // CompileOptionsProto
inline constexpr uint32_t kCompilePortable = 4;     // CompileOptionsProto
inline constexpr uint32_t kDeviceOrdinal = 1;       // ExecutableBuildOptionsProto
inline constexpr uint32_t kDebugOptions = 3;        // ExecutableBuildOptionsProto
inline constexpr uint32_t kNumReplicas = 4;         // ExecutableBuildOptionsProto
inline constexpr uint32_t kNumPartitions = 5;       // ExecutableBuildOptionsProto
inline constexpr uint32_t kDeviceAssignment = 9;    // ExecutableBuildOptionsProto
inline constexpr uint32_t kReplicaCount = 1;        // DeviceAssignmentProto
inline constexpr uint32_t kComputationCount = 2;    // DeviceAssignmentProto
inline constexpr uint32_t kComputationDevices = 3;  // DeviceAssignmentProto
inline constexpr uint32_t kReplicaDeviceIds = 1;    // DeviceAssignmentProto.ComputationDevice
}  // namespace compile_options_fields

// DeviceAssignmentProto bytes for `device_ids` (addressable order).
std::string SerializeDeviceAssignment(int64_t num_replicas, int64_t num_partitions,
                                      const std::vector<int64_t>& device_ids);

}  // namespace flexnpu

#endif  // FLEXNPU_BACKEND_COMPILE_OPTIONS_H_
