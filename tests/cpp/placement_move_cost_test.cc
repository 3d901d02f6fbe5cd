// What a move costs (dynamic policy): a placement away from the data device copies the located
// inputs over the link, and the work follows them afterwards. A step that carries its weights
// moves only when the gain is large against that transfer, never to escape the queue of the
// execution that produces its inputs; the bytes moved are counted per device and reason.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"
#include "tests/cpp/placement_test_util.h"

namespace flexnpu::placement {
namespace {

constexpr int64_t kMs = 1'000'000;

// 1e14 FLOP/s, 1 TB/s, 10 GB/s link: 900 MB of weights and KV cache take 90 ms to move.
DeviceModel Model() { return DeviceModel{1e14, 1e12, 1e10, false, 0}; }
constexpr int64_t kWeights = 900'000'000;
const Profile kStep{Phase::kPrefill, 1e12, 1e9};     // 10 ms
const Profile kDecode{Phase::kDecode, 1e9, 2e9};     // 2 ms
Profile Busy(double ms) { return Profile{Phase::kPrefill, ms * 1e11, 1e6}; }

std::unique_ptr<Core> MakeCore(int P, int V, Tuning tuning = {}) {
  Config c;
  c.policy = "dynamic";
  c.devices.assign(P, Model());
  c.num_virtual_devices = V;
  c.tuning = tuning;
  auto core = Core::Create(c);
  EXPECT_TRUE(core.ok()) << core.status().message();
  return std::move(*core);
}

// Queues `ms` of another virtual device's prefill on physical `device`.
void Occupy(Core& core, int v, int device, double ms, int64_t now) {
  const Profile p = Busy(ms);
  Request r{v, 900u + static_cast<uint64_t>(v), &p, nullptr, 0, now};
  Decision d;
  ASSERT_TRUE(core.PlaceOn(r, device, &d).ok());
}

constexpr int kLeastLoaded = static_cast<int>(Reason::kLeastLoaded);

// Device 0 (home of v0, which holds its 900 MB there) drains in 200 ms, the others in 195 ms.
// Moving would finish 5 ms earlier, the 90 ms copy hidden behind the target's queue: the step
// stays with its weights.
TEST(PlacementMoveCostTest, BigInputStepIsNotMovedToSaveLittle) {
  auto core = MakeCore(4, 8);
  Occupy(*core, 4, 0, 200, 0);
  for (int d = 1; d < 4; ++d) Occupy(*core, 4 + d, d, 195, 0);
  const Decision d = Place(*core, 0, kStep, {{0, kWeights}}, 0, 0, 1);
  EXPECT_EQ(d.physical_device, 0);
  EXPECT_EQ(d.reason, Reason::kAffinity);
  EXPECT_EQ(d.migrate_bytes, 0);
  EXPECT_EQ(d.predicted_finish_ns, 210 * kMs);

  // A decode step away from home (its 900 MB on device 1): going home would gain 5 ms (2 and 3
  // serve other instances' prefills).
  auto displaced = MakeCore(4, 8);
  Occupy(*displaced, 5, 1, 200, 0);
  Occupy(*displaced, 4, 0, 195, 0);
  Occupy(*displaced, 6, 2, 195, 0);
  Occupy(*displaced, 7, 3, 195, 0);
  const Decision back = Place(*displaced, 0, kDecode, {{1, kWeights}}, 0, 0, 2);
  EXPECT_EQ(back.physical_device, 1);
  EXPECT_EQ(back.migrate_bytes, 0);
  const Stats st = displaced->Snapshot(kMs);
  for (const DeviceStats& ds : st.physical) EXPECT_EQ(ds.bytes_migrated_in, 0);
}

// A 2 s burst on device 0: moving the 900 MB to an idle device (90 ms) gains almost 2 s.
TEST(PlacementMoveCostTest, BigInputStepMovesWhenTheGainIsLarge) {
  auto core = MakeCore(4, 8);
  Occupy(*core, 4, 0, 2000, 0);
  const Decision d = Place(*core, 0, kStep, {{0, kWeights}}, 0, 0, 1);
  EXPECT_EQ(d.physical_device, 1);
  EXPECT_EQ(d.reason, Reason::kLeastLoaded);
  EXPECT_EQ(d.migrate_bytes, kWeights);
  EXPECT_EQ(d.predicted_finish_ns, 100 * kMs);

  // The gain must beat move_gain transfers (+ the way back): at 25, 90 ms of copying is too
  // much for it.
  Tuning cautious;
  cautious.move_gain = 25;
  auto strict = MakeCore(4, 8, cautious);
  Occupy(*strict, 4, 0, 2000, 0);
  EXPECT_EQ(Place(*strict, 0, kStep, {{0, kWeights}}, 0, 0, 1).physical_device, 0);
}

// A chain of dependent steps (each reads the previous one's output, as a serving engine's
// steps do) on the device that holds the weights: the next step is placed while the previous
// one runs. Its queue is that very producer, so an idle device is no faster; without knowing
// the producer the model sees a 100 ms queue to escape and moves 100 MB for nothing.
TEST(PlacementMoveCostTest, QueueOfTheProducerIsNoReasonToMove) {
  constexpr int64_t kW = 100'000'000;   // 10 ms to move
  const Profile step{Phase::kPrefill, 1e13, 1e9};  // 100 ms
  for (const bool known : {true, false}) {
    SCOPED_TRACE(known ? "producer known" : "producer unknown");
    auto core = MakeCore(4, 4);
    const Decision first = Place(*core, 0, step, {{0, kW}}, 0, 0, 1);
    ASSERT_EQ(first.physical_device, 0);
    std::vector<Input> inputs = {{0, kW}, {0, 4'000'000, known ? first.ticket : 0}};
    const Decision next = Place(*core, 0, step, inputs, kMs, 0, 1);
    if (known) {
      EXPECT_EQ(next.physical_device, 0);
      EXPECT_EQ(next.predicted_start_ns, first.predicted_finish_ns);
    } else {
      EXPECT_NE(next.physical_device, 0);
      EXPECT_EQ(next.migrate_bytes, kW + 4'000'000);
    }
  }
  // Elsewhere, a step cannot start before its input is produced either.
  auto core = MakeCore(4, 4);
  const Decision first = Place(*core, 0, step, {}, 0, 0, 1);
  ASSERT_EQ(first.physical_device, 0);
  Occupy(*core, 2, 0, 50, 0);
  const Decision other = Place(*core, 1, kStep, {{0, 1000, first.ticket}}, 0, 0, 2);
  EXPECT_EQ(other.physical_device, 1);
  EXPECT_EQ(other.predicted_start_ns, first.predicted_finish_ns);
  // Once the producer finished, its ticket no longer delays anything.
  ASSERT_TRUE(core->OnFinish(first.ticket, 100 * kMs, true).ok());
  const Decision later = Place(*core, 3, kStep, {{0, 1000, first.ticket}}, 100 * kMs, 0, 2);
  EXPECT_EQ(later.predicted_start_ns, 100 * kMs + 100);  // 1000 B over the link: 100 ns
}

// Bytes moved in, per physical device and per reason, in Snapshot and its JSON.
TEST(PlacementMoveCostTest, BytesMovedAreCountedByDeviceAndReason) {
  auto core = MakeCore(4, 8);
  Occupy(*core, 4, 0, 2000, 0);
  ASSERT_EQ(Place(*core, 0, kStep, {{0, kWeights}}, 0, 0, 1).physical_device, 1);
  // A decode of v2 whose 20 MB KV cache sits on the busy device 0: it escapes to an idle one.
  const Decision steal = Place(*core, 2, kDecode, {{0, 20'000'000}}, kMs, 0, 2);
  ASSERT_EQ(steal.reason, Reason::kIdleSteal);
  const Stats st = core->Snapshot(2 * kMs);
  EXPECT_EQ(st.physical[1].bytes_migrated_in, kWeights);
  EXPECT_EQ(st.physical[1].bytes_migrated_in_by_reason[kLeastLoaded], kWeights);
  const int to = steal.physical_device;
  EXPECT_EQ(st.physical[to].bytes_migrated_in_by_reason[static_cast<int>(Reason::kIdleSteal)],
            20'000'000);
  EXPECT_EQ(st.physical[0].bytes_migrated_in, 0);
  EXPECT_EQ(st.virtual_devices[0].bytes_migrated, kWeights);
  const std::string json = st.ToJson();
  EXPECT_NE(json.find("\"bytes_migrated_in_by_reason\":{\"passthrough\":0,\"affinity\":0,"
                      "\"least_loaded\":900000000,"),
            std::string::npos)
      << json;
}

TEST(PlacementMoveCostTest, NegativeMoveGainIsRejected) {
  Config c;
  c.policy = "dynamic";
  c.devices.assign(2, Model());
  c.tuning.move_gain = -1;
  auto core = Core::Create(c);
  ASSERT_FALSE(core.ok());
  EXPECT_NE(core.status().message().find("move_gain"), std::string::npos);
}

}  // namespace
}  // namespace flexnpu::placement
