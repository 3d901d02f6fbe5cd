#include "pjrt_flexnpu/backend/compile_options.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <iterator>

#include "pjrt_flexnpu/backend/emulated/program.h"
#include "pjrt_flexnpu/base/wire.h"

namespace flexnpu {
namespace {

namespace f = compile_options_fields;

// A CompileOptionsProto like JAX's: build options with debug options (field 3), replicas,
// partitions and an assignment, plus an unknown top-level field 17 and profile_version 5.
std::string MakeOptions(int64_t replicas, int64_t partitions, const std::vector<int64_t>& ids) {
  proto::Writer build;
  build.Varint(1, static_cast<uint64_t>(-1));  // device_ordinal
  build.Bytes(3, std::string(40, '\x7f'));     // debug_options, opaque here
  build.Varint(f::kNumReplicas, replicas);
  build.Varint(f::kNumPartitions, partitions);
  build.Bool(6, partitions > 1);  // use_spmd_partitioning
  if (!ids.empty()) {
    build.Bytes(f::kDeviceAssignment, SerializeDeviceAssignment(replicas, partitions, ids));
  }
  proto::Writer options;
  options.Bytes(f::kBuildOptions, build.str());
  options.Varint(5, 42);             // profile_version
  options.Bytes(17, "keep me");      // a field FlexNPU does not know
  return options.Take();
}

TEST(CompileOptionsTest, ReadsReplicasPartitionsAndAssignmentInAddressableOrder) {
  // 2 replicas x 2 partitions: computation c, replica r -> ids[r * 2 + c].
  auto info = ReadCompileOptions(MakeOptions(2, 2, {10, 11, 12, 13}));
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_EQ(info->num_replicas, 2);
  EXPECT_EQ(info->num_partitions, 2);
  EXPECT_TRUE(info->has_device_assignment);
  EXPECT_EQ(info->device_ids, (std::vector<int64_t>{10, 11, 12, 13}));
}

TEST(CompileOptionsTest, PortableRewriteDropsAssignmentAndKeepsUnknownFields) {
  const std::string original = MakeOptions(1, 1, {3});
  auto portable = RewriteAsPortable(original);
  ASSERT_TRUE(portable.ok());
  auto info = ReadCompileOptions(*portable);
  ASSERT_TRUE(info.ok());
  EXPECT_TRUE(info->compile_portable);
  EXPECT_FALSE(info->has_device_assignment);
  EXPECT_EQ(info->num_replicas, 1);
  EXPECT_EQ(info->num_partitions, 1);
  EXPECT_NE(portable->find("keep me"), std::string::npos);
  EXPECT_NE(portable->find(std::string(40, '\x7f')), std::string::npos);
  // profile_version survives as a field.
  proto::Reader r(*portable);
  proto::Field field;
  bool saw_profile = false;
  while (r.Next(&field)) saw_profile |= (field.number == 5 && field.value == 42);
  EXPECT_TRUE(saw_profile);
}

TEST(CompileOptionsTest, AssignmentRewriteUsesPhysicalIds) {
  auto rewritten = RewriteDeviceAssignment(MakeOptions(1, 4, {0, 4, 5, 7}), {0, 1, 2, 3});
  ASSERT_TRUE(rewritten.ok()) << rewritten.status().message();
  auto info = ReadCompileOptions(*rewritten);
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->device_ids, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(info->num_partitions, 4);
  EXPECT_FALSE(info->compile_portable);
  EXPECT_NE(rewritten->find("keep me"), std::string::npos);
}

// Options as JAX writes them with a map field in the debug options (field 357, entries in
// hash order) and an assignment: the key is the same whatever the entries' order and the
// devices, and differs when anything else differs.
std::string OptionsWithMap(const std::vector<std::string>& entries, int64_t device,
                           int64_t replicas = 1) {
  proto::Writer debug;
  debug.Varint(2, 1);
  for (const std::string& entry : entries) debug.Bytes(357, entry);
  debug.Bytes(451, "inf");
  proto::Writer build;
  build.Bytes(3, debug.str());
  build.Varint(f::kNumReplicas, replicas);
  build.Varint(f::kNumPartitions, 1);
  std::vector<int64_t> ids;
  for (int64_t r = 0; r < replicas; ++r) ids.push_back(device + r);
  build.Bytes(f::kDeviceAssignment, SerializeDeviceAssignment(replicas, 1, ids));
  proto::Writer options;
  options.Bytes(f::kBuildOptions, build.str());
  options.Varint(5, 42);
  return options.Take();
}

TEST(CompileOptionsTest, KeyIgnoresTheAssignmentAndTheOrderOfMapEntries) {
  const std::string a = "\n\x06rtt_us\x12\x02-1";
  const std::string b = "\n\rgpus_per_node\x12\x02-1";
  auto first = CompileOptionsKey(OptionsWithMap({a, b}, 0));
  auto second = CompileOptionsKey(OptionsWithMap({b, a}, 3));
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(*first, *second);
  EXPECT_EQ(first->find(SerializeDeviceAssignment(1, 1, {0})), std::string::npos);
  auto other_entry = CompileOptionsKey(OptionsWithMap({a}, 0));
  ASSERT_TRUE(other_entry.ok());
  EXPECT_NE(*first, *other_entry);
  auto two_replicas = CompileOptionsKey(OptionsWithMap({a, b}, 0, 2));
  ASSERT_TRUE(two_replicas.ok());
  EXPECT_NE(*first, *two_replicas);
  EXPECT_FALSE(CompileOptionsKey("\xff").ok());
}

// The emulated backend compiles a program once for every device: its key also drops the
// device ordinal and portability, and keeps CompileOptionsKey's canonical order.
TEST(CompileOptionsTest, EmulatedKeyIsOneForEveryDeviceAndMapOrder) {
  const std::string a = "\n\x06rtt_us\x12\x02-1";
  const std::string b = "\n\rgpus_per_node\x12\x02-1";
  auto first = emulated::DeviceFreeOptionsKey(OptionsWithMap({a, b}, 0));
  auto second = emulated::DeviceFreeOptionsKey(OptionsWithMap({b, a}, 3));
  ASSERT_TRUE(first.ok()) << first.status().message();
  ASSERT_TRUE(second.ok()) << second.status().message();
  EXPECT_EQ(*first, *second);
  auto other_entry = emulated::DeviceFreeOptionsKey(OptionsWithMap({a}, 0));
  ASSERT_TRUE(other_entry.ok());
  EXPECT_NE(*first, *other_entry);
  EXPECT_FALSE(emulated::DeviceFreeOptionsKey("\xff").ok());
}

TEST(CompileOptionsTest, RewriteRejectsWrongDeviceCount) {
  auto rewritten = RewriteDeviceAssignment(MakeOptions(1, 2, {0, 1}), {0});
  ASSERT_FALSE(rewritten.ok());
  EXPECT_EQ(rewritten.status().code(), Code::kInvalidArgument);
  EXPECT_NE(rewritten.status().message().find("needs 2 devices, got 1"), std::string::npos);
}

TEST(CompileOptionsTest, EmptyOptionsMeanOneReplicaOnePartition) {
  auto info = ReadCompileOptions("");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->num_replicas, 1);
  EXPECT_EQ(info->num_partitions, 1);
  auto portable = RewriteAsPortable("");
  ASSERT_TRUE(portable.ok());
  auto again = ReadCompileOptions(*portable);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->compile_portable);
}

TEST(CompileOptionsTest, MalformedOptionsAreInvalidArgument) {
  for (const std::string& bad :
       {std::string("\x1a\x10\x01", 3), std::string("\xff", 1),
        MakeOptions(2, 1, {0, 1}).substr(0, 20)}) {
    auto info = ReadCompileOptions(bad);
    ASSERT_FALSE(info.ok());
    EXPECT_EQ(info.status().code(), Code::kInvalidArgument);
    EXPECT_NE(info.status().message().find("malformed compile options"), std::string::npos)
        << info.status().message();
  }
}

TEST(CompileOptionsTest, AssignmentShapeMustMatchBuild) {
  proto::Writer build;
  build.Varint(f::kNumReplicas, 1);
  build.Varint(f::kNumPartitions, 2);
  build.Bytes(f::kDeviceAssignment, SerializeDeviceAssignment(1, 1, {0}));
  proto::Writer options;
  options.Bytes(f::kBuildOptions, build.str());
  auto info = ReadCompileOptions(options.str());
  ASSERT_FALSE(info.ok());
  EXPECT_NE(info.status().message().find("device assignment is 1x1"), std::string::npos);
}

}  // namespace
}  // namespace flexnpu

namespace flexnpu {
namespace {

// The fields of a message in field-number order (stable: repeated fields keep their order),
// as raw bytes, without field `drop`; protobuf field order carries no meaning.
std::string Canonical(std::string_view message, uint32_t drop, uint32_t descend) {
  std::vector<std::pair<uint32_t, std::string>> fields;
  proto::Reader reader(message);
  proto::Field field;
  while (reader.Next(&field)) {
    if (field.number == drop) continue;
    if (field.number == descend) {
      fields.emplace_back(field.number,
                          Canonical(field.bytes, compile_options_fields::kDeviceAssignment, 0));
    } else {
      fields.emplace_back(field.number, std::string(field.raw));
    }
  }
  EXPECT_TRUE(reader.ok()) << reader.error();
  std::stable_sort(fields.begin(), fields.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::string out;
  for (const auto& f : fields) out += std::to_string(f.first) + ":" + f.second + ";";
  return out;
}

// Everything but build_options.device_assignment: what a rewrite must keep as it was.
std::string AllButTheAssignment(std::string_view serialized) {
  return Canonical(serialized, 0, compile_options_fields::kBuildOptions);
}

std::string ReadGolden(const std::string& name) {
  std::ifstream in(std::string(FLEXNPU_TEST_DATA_DIR) + "/" + name, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Serialized by jaxlib 0.10.2 (jax._src.compiler.get_compile_options): one replica, two
// partitions on devices 5 and 2, SPMD and Shardy partitioning on, two env option overrides.
TEST(CompileOptionsGoldenTest, JaxlibSpmdShardyOptionsRewriteAndRoundTrip) {
  const std::string golden = ReadGolden("jaxlib_spmd_shardy_compile_options.pb");
  ASSERT_FALSE(golden.empty()) << "missing test data under " << FLEXNPU_TEST_DATA_DIR;
  auto info = ReadCompileOptions(golden);
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_EQ(info->num_replicas, 1);
  EXPECT_EQ(info->num_partitions, 2);
  EXPECT_FALSE(info->compile_portable);
  ASSERT_TRUE(info->has_device_assignment);
  EXPECT_EQ(info->device_ids, (std::vector<int64_t>{5, 2}));

  auto physical = RewriteDeviceAssignment(golden, {1, 3});
  ASSERT_TRUE(physical.ok()) << physical.status().message();
  auto rewritten = ReadCompileOptions(*physical);
  ASSERT_TRUE(rewritten.ok()) << rewritten.status().message();
  EXPECT_EQ(rewritten->device_ids, (std::vector<int64_t>{1, 3}));
  EXPECT_EQ(rewritten->num_partitions, 2);
  // Debug options, Shardy and SPMD flags, env overrides: all kept, value for value.
  EXPECT_EQ(AllButTheAssignment(*physical), AllButTheAssignment(golden));
  EXPECT_NE(physical->find("xla_cpu_enable_fast_math"), std::string::npos);

  // And back: the ids jaxlib chose, and again nothing else changed.
  auto back = RewriteDeviceAssignment(*physical, {5, 2});
  ASSERT_TRUE(back.ok()) << back.status().message();
  EXPECT_EQ(ReadCompileOptions(*back)->device_ids, (std::vector<int64_t>{5, 2}));
  EXPECT_EQ(AllButTheAssignment(*back), AllButTheAssignment(golden));
  EXPECT_EQ(back->size(), golden.size());
}

}  // namespace
}  // namespace flexnpu
