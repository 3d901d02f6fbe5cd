#include "pjrt_flexnpu/backend/compile_options.h"

#include <algorithm>

#include "pjrt_flexnpu/base/wire.h"

namespace flexnpu {
namespace {

namespace f = compile_options_fields;
using proto::Field;
using proto::Reader;
using proto::WireType;
using proto::Writer;

constexpr int64_t kMaxDevices = 1 << 20;

Status Malformed(const std::string& what, const Reader& reader) {
  return InvalidArgument("malformed compile options (" + what + "): " + reader.error());
}

// Protobuf merges repeated occurrences of a message field: concatenating payloads is the
// same message.
StatusOr<std::string> CollectMessage(std::string_view serialized, uint32_t number,
                                     const char* what) {
  std::string payload;
  Reader reader(serialized);
  Field field;
  while (reader.Next(&field)) {
    if (field.number != number) continue;
    if (field.type != WireType::kLengthDelimited) {
      return InvalidArgument(std::string("malformed compile options: ") + what +
                             " has the wrong wire type");
    }
    payload.append(field.bytes);
  }
  if (!reader.ok()) return Malformed(what, reader);
  return payload;
}

Status ReadDeviceAssignment(std::string_view bytes, CompileOptionsInfo* info) {
  int64_t replica_count = 0;
  int64_t computation_count = 0;
  std::vector<std::vector<int64_t>> computations;
  Reader reader(bytes);
  Field field;
  while (reader.Next(&field)) {
    if (field.number == f::kReplicaCount && field.type == WireType::kVarint) {
      replica_count = static_cast<int64_t>(field.value);
    } else if (field.number == f::kComputationCount && field.type == WireType::kVarint) {
      computation_count = static_cast<int64_t>(field.value);
    } else if (field.number == f::kComputationDevices &&
               field.type == WireType::kLengthDelimited) {
      std::vector<int64_t> ids;
      Reader inner(field.bytes);
      Field id_field;
      while (inner.Next(&id_field)) {
        if (id_field.number == f::kReplicaDeviceIds &&
            !proto::AppendVarints(id_field, &ids)) {
          return InvalidArgument("malformed compile options: bad replica_device_ids");
        }
      }
      if (!inner.ok()) return Malformed("computation_devices", inner);
      computations.push_back(std::move(ids));
    }
  }
  if (!reader.ok()) return Malformed("device_assignment", reader);
  if (replica_count <= 0 || computation_count <= 0 || replica_count > kMaxDevices ||
      computation_count > kMaxDevices ||
      static_cast<int64_t>(computations.size()) != computation_count) {
    return InvalidArgument("malformed compile options: device assignment has replica_count=" +
                           std::to_string(replica_count) + ", computation_count=" +
                           std::to_string(computation_count) + " and " +
                           std::to_string(computations.size()) + " computations");
  }
  info->device_ids.clear();
  for (int64_t r = 0; r < replica_count; ++r) {
    for (int64_t c = 0; c < computation_count; ++c) {
      const auto& ids = computations[c];
      if (static_cast<int64_t>(ids.size()) != replica_count) {
        return InvalidArgument("malformed compile options: computation " + std::to_string(c) +
                               " lists " + std::to_string(ids.size()) + " devices for " +
                               std::to_string(replica_count) + " replicas");
      }
      info->device_ids.push_back(ids[r]);
    }
  }
  info->has_device_assignment = true;
  if (replica_count != info->num_replicas || computation_count != info->num_partitions) {
    return InvalidArgument("compile options: device assignment is " +
                           std::to_string(replica_count) + "x" +
                           std::to_string(computation_count) + " but the build asks for " +
                           std::to_string(info->num_replicas) + " replicas x " +
                           std::to_string(info->num_partitions) + " partitions");
  }
  return Status::Ok();
}

// Rewrites the ExecutableBuildOptionsProto: drops num_replicas, num_partitions and
// device_assignment (and device_ordinal if `drop_ordinal`) and appends the given ones;
// everything else is kept verbatim.
std::string RewriteBuildOptions(std::string_view build, int64_t num_replicas,
                                int64_t num_partitions, const std::string* assignment,
                                bool drop_ordinal = false) {
  Writer out;
  Reader reader(build);
  Field field;
  while (reader.Next(&field)) {
    if (field.number == f::kNumReplicas || field.number == f::kNumPartitions ||
        field.number == f::kDeviceAssignment ||
        (drop_ordinal && field.number == f::kDeviceOrdinal)) {
      continue;
    }
    out.Raw(field.raw);
  }
  out.Varint(f::kNumReplicas, static_cast<uint64_t>(num_replicas));
  out.Varint(f::kNumPartitions, static_cast<uint64_t>(num_partitions));
  if (assignment != nullptr) out.Bytes(f::kDeviceAssignment, *assignment);
  return out.Take();
}

StatusOr<std::string> Rewrite(std::string_view serialized, bool portable, int64_t num_replicas,
                              int64_t num_partitions, const std::string* assignment,
                              bool drop_ordinal = false) {
  auto build = CollectMessage(serialized, f::kBuildOptions, "executable_build_options");
  if (!build.ok()) return build.status();
  Writer out;
  Reader reader(serialized);
  Field field;
  while (reader.Next(&field)) {
    if (field.number == f::kBuildOptions || field.number == f::kCompilePortable) continue;
    out.Raw(field.raw);
  }
  if (!reader.ok()) return Malformed("CompileOptionsProto", reader);
  out.Bytes(f::kBuildOptions, RewriteBuildOptions(*build, num_replicas, num_partitions, assignment,
                                                  drop_ordinal));
  if (portable) out.Bool(f::kCompilePortable, true);
  return out.Take();
}

// The message with each run of consecutive length-delimited entries of one field sorted by
// their bytes: protobuf writes a map field's entries in hash order, so equal options may be
// serialized differently. Other fields stay where they are.
StatusOr<std::string> SortRepeatedRuns(std::string_view message, const char* what) {
  std::vector<Field> fields;
  Reader reader(message);
  Field field;
  while (reader.Next(&field)) fields.push_back(field);
  if (!reader.ok()) return Malformed(what, reader);
  for (size_t begin = 0; begin < fields.size();) {
    size_t end = begin + 1;
    while (end < fields.size() && fields[end].type == WireType::kLengthDelimited &&
           fields[begin].type == WireType::kLengthDelimited &&
           fields[end].number == fields[begin].number) {
      ++end;
    }
    std::sort(fields.begin() + begin, fields.begin() + end,
              [](const Field& a, const Field& b) { return a.raw < b.raw; });
    begin = end;
  }
  Writer out;
  for (const Field& f : fields) out.Raw(f.raw);
  return out.Take();
}

}  // namespace

StatusOr<std::string> CompileOptionsKey(std::string_view serialized) {
  FLEXNPU_ASSIGN_OR_RETURN(
      const std::string build,
      CollectMessage(serialized, f::kBuildOptions, "executable_build_options"));
  FLEXNPU_ASSIGN_OR_RETURN(const std::string debug,
                           CollectMessage(build, f::kDebugOptions, "debug_options"));
  Writer canonical_build;
  Reader build_reader(build);
  Field field;
  while (build_reader.Next(&field)) {
    if (field.number == f::kDeviceAssignment || field.number == f::kDebugOptions) continue;
    canonical_build.Raw(field.raw);
  }
  if (!build_reader.ok()) return Malformed("executable_build_options", build_reader);
  FLEXNPU_ASSIGN_OR_RETURN(const std::string sorted_debug,
                           SortRepeatedRuns(debug, "debug_options"));
  canonical_build.Bytes(f::kDebugOptions, sorted_debug);

  Writer rest;
  Reader reader(serialized);
  while (reader.Next(&field)) {
    if (field.number != f::kBuildOptions) rest.Raw(field.raw);
  }
  if (!reader.ok()) return Malformed("CompileOptionsProto", reader);
  FLEXNPU_ASSIGN_OR_RETURN(std::string key,
                           SortRepeatedRuns(rest.str(), "CompileOptionsProto"));
  Writer build_field;
  build_field.Bytes(f::kBuildOptions, canonical_build.str());
  key += build_field.str();
  return key;
}

StatusOr<CompileOptionsInfo> ReadCompileOptions(std::string_view serialized) {
  CompileOptionsInfo info;
  Reader reader(serialized);
  Field field;
  while (reader.Next(&field)) {
    if (field.number == f::kCompilePortable && field.type == WireType::kVarint) {
      info.compile_portable = field.value != 0;
    }
  }
  if (!reader.ok()) return Malformed("CompileOptionsProto", reader);

  auto build = CollectMessage(serialized, f::kBuildOptions, "executable_build_options");
  if (!build.ok()) return build.status();
  std::string assignment;
  Reader build_reader(*build);
  while (build_reader.Next(&field)) {
    if (field.number == f::kNumReplicas && field.type == WireType::kVarint) {
      info.num_replicas = static_cast<int64_t>(field.value);
    } else if (field.number == f::kNumPartitions && field.type == WireType::kVarint) {
      info.num_partitions = static_cast<int64_t>(field.value);
    } else if (field.number == f::kDeviceAssignment &&
               field.type == WireType::kLengthDelimited) {
      assignment.append(field.bytes);
    }
  }
  if (!build_reader.ok()) return Malformed("executable_build_options", build_reader);
  // Proto3 zero means unset: XLA treats it as 1.
  if (info.num_replicas == 0) info.num_replicas = 1;
  if (info.num_partitions == 0) info.num_partitions = 1;
  if (info.num_replicas < 0 || info.num_partitions < 0 || info.num_replicas > kMaxDevices ||
      info.num_partitions > kMaxDevices ||
      info.num_replicas * info.num_partitions > kMaxDevices) {
    return InvalidArgument("compile options ask for " + std::to_string(info.num_replicas) +
                           " replicas x " + std::to_string(info.num_partitions) +
                           " partitions");
  }
  if (!assignment.empty()) FLEXNPU_RETURN_IF_ERROR(ReadDeviceAssignment(assignment, &info));
  return info;
}

std::string SerializeDeviceAssignment(int64_t num_replicas, int64_t num_partitions,
                                      const std::vector<int64_t>& device_ids) {
  Writer out;
  out.Varint(f::kReplicaCount, static_cast<uint64_t>(num_replicas));
  out.Varint(f::kComputationCount, static_cast<uint64_t>(num_partitions));
  for (int64_t c = 0; c < num_partitions; ++c) {
    std::vector<int64_t> ids;
    for (int64_t r = 0; r < num_replicas; ++r) ids.push_back(device_ids[r * num_partitions + c]);
    Writer computation;
    computation.PackedVarints(f::kReplicaDeviceIds, ids);
    out.Bytes(f::kComputationDevices, computation.str());
  }
  return out.Take();
}

StatusOr<std::string> RewriteAsPortable(std::string_view serialized) {
  return Rewrite(serialized, /*portable=*/true, 1, 1, nullptr);
}

StatusOr<std::string> RewriteDeviceAssignment(std::string_view serialized,
                                              const std::vector<int64_t>& device_ids) {
  auto info = ReadCompileOptions(serialized);
  if (!info.ok()) return info.status();
  const int64_t n = info->num_replicas * info->num_partitions;
  if (static_cast<int64_t>(device_ids.size()) != n) {
    return InvalidArgument("device assignment needs " + std::to_string(n) + " devices, got " +
                           std::to_string(device_ids.size()));
  }
  const std::string assignment =
      SerializeDeviceAssignment(info->num_replicas, info->num_partitions, device_ids);
  return Rewrite(serialized, /*portable=*/false, info->num_replicas, info->num_partitions,
                 &assignment);
}

StatusOr<std::string> WithoutDeviceChoice(std::string_view serialized) {
  auto info = ReadCompileOptions(serialized);
  if (!info.ok()) return info.status();
  return Rewrite(serialized, /*portable=*/false, info->num_replicas, info->num_partitions,
                 nullptr, /*drop_ordinal=*/true);
}

}  // namespace flexnpu
