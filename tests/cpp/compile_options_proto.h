// xla.CompileOptionsProto bytes built by hand (protobuf wire format) for the C-level tests and
// bench/dispatch_capi.cc: a program on given devices, one partition. No gtest, no protobuf.
#ifndef FLEXNPU_TESTS_CPP_COMPILE_OPTIONS_PROTO_H_
#define FLEXNPU_TESTS_CPP_COMPILE_OPTIONS_PROTO_H_

#include <cstdint>
#include <string>
#include <vector>

namespace {

void AppendVarint(std::string* out, uint64_t v) {
  while (v >= 0x80) {
    out->push_back(static_cast<char>((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out->push_back(static_cast<char>(v));
}

void AppendBytes(std::string* out, int field, const std::string& bytes) {
  AppendVarint(out, (static_cast<uint64_t>(field) << 3) | 2);
  AppendVarint(out, bytes.size());
  out->append(bytes);
}

// xla.CompileOptionsProto for one partition and one replica per id in `device_ids` (a
// replicated program over several devices when there are more).
std::string CompileOptionsForReplicas(const std::vector<int64_t>& device_ids) {
  std::string ids;
  for (int64_t id : device_ids) AppendVarint(&ids, static_cast<uint64_t>(id));
  std::string computation;
  AppendBytes(&computation, 1, ids);  // replica_device_ids (packed)
  std::string assignment;
  AppendVarint(&assignment, 1 << 3);  // replica_count
  AppendVarint(&assignment, device_ids.size());
  assignment += std::string("\x10\x01", 2);  // computation_count 1
  AppendBytes(&assignment, 3, computation);
  std::string build;
  AppendVarint(&build, 4 << 3);  // num_replicas
  AppendVarint(&build, device_ids.size());
  build += std::string("\x28\x01", 2);  // num_partitions 1
  AppendBytes(&build, 9, assignment);
  std::string options;
  AppendBytes(&options, 3, build);
  return options;
}

// xla.CompileOptionsProto for one replica and partition on `device_id`.
std::string CompileOptionsFor(int64_t device_id) { return CompileOptionsForReplicas({device_id}); }

}  // namespace

#endif  // FLEXNPU_TESTS_CPP_COMPILE_OPTIONS_PROTO_H_
