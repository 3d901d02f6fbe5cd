// SPMD executions through the C API go through the same dispatcher as single-device ones:
// under a placing policy every shard takes a placer ticket on the physical device the group
// mapping gives it (its load is seen, its finish measured), and the trace records every shard.
#include <chrono>
#include <cstddef>
#include <string>
#include <thread>

#include "c_api_test_fixture.h"

namespace {

// kAddProgram replicated over two devices: each computes (a + b) * b on its own arguments.
constexpr char kReplicatedAddProgram[] = R"(
module @add2 attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 2 : i32} {
  func.func public @main(%a: tensor<4xf32>, %b: tensor<4xf32>) -> tensor<4xf32> {
    %0 = stablehlo.add %a, %b : tensor<4xf32>
    %1 = stablehlo.multiply %0, %b : tensor<4xf32>
    return %1 : tensor<4xf32>
  }
})";

std::string StatsJson() {
  auto stats = reinterpret_cast<const char* (*)()>(dlsym(plugin_library, "FlexNpu_StatsJson"));
  return stats == nullptr ? "" : stats();
}

// A number of the first client's placement stats: `key` at the top (index < 0) or inside the
// index-th object of the array `array` ("physical" or "virtual"); -1 when absent.
int64_t PlacementStat(const std::string& array, int index, const std::string& key) {
  const std::string json = StatsJson();
  size_t at = json.find("\"placement\":");
  if (at == std::string::npos) return -1;
  size_t end = std::string::npos;
  if (index >= 0) {
    at = json.find("\"" + array + "\":[", at);
    if (at == std::string::npos) return -1;
    at = json.find("{\"device\":" + std::to_string(index) + ",", at);
    if (at == std::string::npos) return -1;
    end = json.find("{\"device\":", at + 1);
  }
  const size_t k = json.find("\"" + key + "\":", at);
  if (k == std::string::npos || (end != std::string::npos && k > end)) return -1;
  return std::atoll(json.c_str() + k + key.size() + 3);
}

int64_t Executions(const std::string& array, int index) {
  return PlacementStat(array, index, "small") + PlacementStat(array, index, "prefill") +
         PlacementStat(array, index, "decode");
}

class CApiSpmdTest : public CApiTest {
 public:
  // Runs kReplicatedAddProgram `rounds` times over virtual devices `v0` and `v1` of `client`
  // and checks every shard's result against its own inputs.
  void RunReplicated(PJRT_Client* client, int64_t v0, int64_t v1, int rounds,
                     CallShape shape = CallShape()) {
    PJRT_LoadedExecutable* exe = nullptr;
    ErrorInfo info =
        TryCompile(client, kReplicatedAddProgram, CompileOptionsForReplicas({v0, v1}), &exe);
    ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    PJRT_Buffer* a0 = Upload(client, Device(client, v0), {1, 2, 3, 4});
    PJRT_Buffer* b0 = Upload(client, Device(client, v0), {1, 1, 1, 1});
    PJRT_Buffer* a1 = Upload(client, Device(client, v1), {5, 6, 7, 8});
    PJRT_Buffer* b1 = Upload(client, Device(client, v1), {2, 2, 2, 2});
    for (int i = 0; i < rounds; ++i) {
      std::vector<PJRT_Buffer*> outputs;
      info = ExecuteOnDevices(exe, {{a0, b0}, {a1, b1}}, 1, &outputs, true, nullptr, shape);
      ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
      EXPECT_EQ(Download(outputs[0], 4), (std::vector<float>{2, 3, 4, 5}));
      EXPECT_EQ(Download(outputs[1], 4), (std::vector<float>{14, 16, 18, 20}));
      for (PJRT_Buffer* out : outputs) DestroyBuffer(out);
    }
  }

  // Completion callbacks may run just after the events the test awaited: wait for them.
  static void WaitUntilIdle(std::vector<int> virtual_devices) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    for (int v : virtual_devices) {
      while (PlacementStat("virtual", v, "queue_length") != 0 &&
             std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_EQ(PlacementStat("virtual", v, "queue_length"), 0) << "virtual device " << v;
    }
  }
};

// Virtual 1 and 5 both live on physical 1 (8 over 4): the group mapping runs virtual 5's shard
// on physical 0. Each shard is one placement on its own physical device, and finishes.
TEST_F(CApiSpmdTest, ShardsTakePlacerTicketsOnTheirPhysicalDevices) {
  PJRT_Client* client = nullptr;
  ErrorInfo info = TryCreateClient(
      {IntOption("num_virtual_devices", 8), StringOption("policy", "dynamic")}, &client);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  const int64_t before = PlacementStat("", -1, "decisions_total");
  ASSERT_GE(before, 0) << StatsJson();
  constexpr int kRounds = 5;
  RunReplicated(client, 1, 5, kRounds);
  EXPECT_EQ(PlacementStat("", -1, "decisions_total"), before + 2 * kRounds) << StatsJson();
  WaitUntilIdle({1, 5});
  EXPECT_EQ(Executions("virtual", 1), kRounds);
  EXPECT_EQ(Executions("virtual", 5), kRounds);
  EXPECT_EQ(Executions("physical", 1), kRounds);
  EXPECT_EQ(Executions("physical", 0), kRounds);
  EXPECT_EQ(Executions("physical", 2), 0);
  // Finish feedback: the measured time of both shards was counted.
  EXPECT_GT(PlacementStat("virtual", 1, "busy_ns"), 0);
  EXPECT_GT(PlacementStat("virtual", 5, "busy_ns"), 0);
  EXPECT_GT(PlacementStat("physical", 0, "busy_ns"), 0);
  EXPECT_EQ(PlacementStat("physical", 0, "queue_length"), 0);
}

// Passthrough takes no tickets (as for single-device work: nothing is queued in the placer) and
// SPMD still runs right; every shard is counted on the physical device the group mapping gave
// it (virtual 5's shard on physical 0: its home, 1, is virtual 1's).
TEST_F(CApiSpmdTest, PassthroughShardsAreCountedNotTracked) {
  PJRT_Client* client = nullptr;
  ErrorInfo info = TryCreateClient({IntOption("num_virtual_devices", 8)}, &client);
  ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
  constexpr int kRounds = 3;
  RunReplicated(client, 1, 5, kRounds);
  EXPECT_EQ(PlacementStat("", -1, "decisions_total"), 2 * kRounds) << StatsJson();
  EXPECT_EQ(Executions("virtual", 1), kRounds);
  EXPECT_EQ(Executions("virtual", 5), kRounds);
  EXPECT_EQ(Executions("physical", 1), kRounds);
  EXPECT_EQ(Executions("physical", 0), kRounds);
  EXPECT_EQ(Executions("physical", 2), 0);
  EXPECT_EQ(PlacementStat("physical", 0, "passthrough"), kRounds);
  EXPECT_EQ(PlacementStat("physical", 0, "queue_length"), 0);
  EXPECT_EQ(PlacementStat("physical", 1, "queue_length"), 0);
  // Their time, from the completion events the caller awaited.
  EXPECT_GT(PlacementStat("physical", 0, "busy_ns"), 0);
  EXPECT_GT(PlacementStat("physical", 1, "busy_ns"), 0);
  EXPECT_GT(PlacementStat("virtual", 5, "busy_ns"), 0);
  EXPECT_EQ(PlacementStat("physical", 2, "busy_ns"), 0);
}

// A counter at the top of the first client's stats (e.g. "backend_compiles"); -1 when absent.
int64_t ClientCounter(const std::string& key) {
  const std::string json = StatsJson();
  const size_t at = json.find("\"" + key + "\":");
  return at == std::string::npos ? -1 : std::atoll(json.c_str() + at + key.size() + 3);
}

// The replicated program over other devices of the same kind, in either order: compiled once,
// loaded for the other mappings (share_compiles), every shard's result right.
TEST_F(CApiSpmdTest, OneSpmdProgramIsCompiledOnceForIdenticalDevices) {
  PJRT_Client* client = CreateClient(4);
  ASSERT_NE(client, nullptr);
  const int64_t compiles = ClientCounter("backend_compiles");
  const int64_t shared = ClientCounter("shared_loads");
  ASSERT_GE(shared, 0) << StatsJson();
  RunReplicated(client, 0, 1, 1);
  RunReplicated(client, 2, 3, 1);
  RunReplicated(client, 3, 0, 1);
  EXPECT_EQ(ClientCounter("backend_compiles"), compiles + 1);
  EXPECT_EQ(ClientCounter("shared_loads"), shared + 2);
}

// Callers that ask for no completion events, and options structs from older and newer
// headers: every shard's result is right whichever physical order the mapping gives the shards
// (virtual 5 before 1 puts shard 0 on physical 0's second position), and every placer ticket
// finishes (the events FlexNPU asked for on its own are released after their callbacks).
TEST_F(CApiSpmdTest, ShardsRunRightWithoutCallerEventsAndWithAnyOptionsSize) {
  const CallShape shapes[] = {
      {PJRT_ExecuteOptions_STRUCT_SIZE, false},
      {offsetof(PJRT_ExecuteOptions, context), false},  // field by field
      {sizeof(PJRT_ExecuteOptions) + 128, true},        // a newer caller's larger struct
      {offsetof(PJRT_ExecuteOptions, context), true},
  };
  for (const char* policy : {"dynamic", "passthrough"}) {
    PJRT_Client* client = nullptr;
    ErrorInfo info = TryCreateClient(
        {IntOption("num_virtual_devices", 8), StringOption("policy", policy)}, &client);
    ASSERT_EQ(info.code, PJRT_Error_Code_OK) << info.message;
    for (const CallShape& shape : shapes) {
      SCOPED_TRACE(std::string(policy) + ", options size " + std::to_string(shape.options_size) +
                   (shape.events ? ", events" : ", no events"));
      RunReplicated(client, 1, 5, 2, shape);
      RunReplicated(client, 5, 1, 2, shape);
      RunReplicated(client, 3, 1, 2, shape);
    }
    WaitUntilIdle({1, 3, 5});
  }
}

TEST_F(CApiSpmdTest, TraceRecordsEveryShard) {
  auto set_tracing = reinterpret_cast<void (*)(int)>(dlsym(plugin_library, "FlexNpu_SetTracing"));
  auto trace_json =
      reinterpret_cast<const char* (*)(int)>(dlsym(plugin_library, "FlexNpu_TraceJson"));
  ASSERT_NE(set_tracing, nullptr);
  ASSERT_NE(trace_json, nullptr);
  PJRT_Client* client = CreateClient(4);
  ASSERT_NE(client, nullptr);
  set_tracing(1);
  constexpr int kRounds = 3;
  RunReplicated(client, 3, 1, kRounds);
  // Trace events are recorded by the completion callbacks: wait for all of them.
  auto count = [&](int pid) {
    const std::string json = trace_json(0);
    const std::string needle = "\"ph\":\"X\",\"pid\":" + std::to_string(pid) + ",";
    int n = 0;
    for (size_t at = json.find(needle); at != std::string::npos; at = json.find(needle, at + 1)) {
      ++n;
    }
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while ((count(3) < kRounds || count(1) < kRounds) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  set_tracing(0);
  EXPECT_EQ(count(3), kRounds) << trace_json(0);
  EXPECT_EQ(count(1), kRounds);
  EXPECT_EQ(count(0), 0);
  EXPECT_EQ(count(2), 0);
}

}  // namespace
