// SLO-aware admission in the dynamic policy (Tuning::tpot_slo_ns): a prefill starts in front of
// a device's active decode streams only while their stall budget covers the time it blocks
// them. Scripted on a fake clock.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"
#include "tests/cpp/placement_test_util.h"

namespace flexnpu::placement {
namespace {

constexpr int64_t kMs = 1'000'000;

// 1e12 FLOP/s, 100 GB/s, FIFO.
const Profile kDecode{Phase::kDecode, 1e6, 1e9};          // 10 ms
const Profile kPrefill{Phase::kPrefill, 1e11, 1e6};       // 100 ms
const Profile kHugePrefill{Phase::kPrefill, 1e12, 1e6};   // 1 s
constexpr int64_t kKv = 1'000'000;

std::unique_ptr<Core> MakeCore(int64_t tpot_slo_ns) {
  Config c;
  c.policy = "dynamic";
  c.devices.assign(2, DeviceModel{1e12, 1e11, 1e10, false, 0});
  c.num_virtual_devices = 2;  // v0: a prefill instance (home 0), v1: a decode one (home 1)
  c.tuning.tpot_slo_ns = tpot_slo_ns;
  auto core = Core::Create(c);
  EXPECT_TRUE(core.ok()) << core.status().message();
  return std::move(*core);
}

// Device 0 busy with a 1 s prefill from 0; v1 decodes 10 ms steps on device 1 at 0..40 ms
// (each one placed when the last finished). Returns the core at 50 ms.
std::unique_ptr<Core> BusyPrefillDeviceAndFiveDecodeSteps(int64_t tpot_slo_ns,
                                                          double decode_weight = 1) {
  auto core = MakeCore(tpot_slo_ns);
  const Decision busy = Place(*core, 0, kHugePrefill, {}, 0, 1, 1);
  EXPECT_EQ(busy.physical_device, 0);
  for (int i = 0; i < 5; ++i) {
    const int64_t t = i * 10 * kMs;
    const Decision d = Place(*core, 1, kDecode, {{1, kKv}}, t, decode_weight, 2);
    EXPECT_EQ(d.physical_device, 1);
    EXPECT_TRUE(core->OnStart(d.ticket, t).ok());
    EXPECT_TRUE(core->OnFinish(d.ticket, t + 10 * kMs, true).ok());
  }
  return core;
}

// Three 100 ms prefills of a long prompt queue (weight 100: the tpot_weight penalty for
// stalling one decode sequence is 1 ms) at `at`; their devices.
std::vector<int> ThreePrefills(Core& core, int64_t at) {
  std::vector<int> out;
  for (int i = 0; i < 3; ++i) {
    out.push_back(Place(core, 0, kPrefill, {}, at, 100, 3).physical_device);
  }
  return out;
}

TEST(PlacementSloTest, WithoutTheSloALongPromptQueueStallsTheDecodeDeviceAgainAndAgain) {
  auto core = BusyPrefillDeviceAndFiveDecodeSteps(0);
  EXPECT_EQ(ThreePrefills(*core, 50 * kMs), (std::vector<int>{1, 1, 1}));
}

TEST(PlacementSloTest, PrefillsStartInFrontOfDecodeOnlyWithinTheStallBudget) {
  // Five 10 ms steps under a 50 ms SLO banked 5 * 40 ms = 200 ms (the cap, 4 * 50 ms): two
  // 100 ms prefills fit, the third waits for the prefill device.
  auto core = BusyPrefillDeviceAndFiveDecodeSteps(50 * kMs);
  EXPECT_EQ(ThreePrefills(*core, 50 * kMs), (std::vector<int>{1, 1, 0}));
}

TEST(PlacementSloTest, AStalledTokenSpendsTheBudgetAndFastStepsEarnItBack) {
  auto core = BusyPrefillDeviceAndFiveDecodeSteps(50 * kMs);
  EXPECT_EQ(Place(*core, 0, kPrefill, {}, 50 * kMs, 100, 3).physical_device, 1);
  EXPECT_EQ(Place(*core, 0, kPrefill, {}, 50 * kMs, 100, 3).physical_device, 1);
  // The next token waits behind both (predicted finish 260 ms): 210 ms against 50 ms leaves
  // 200 - 160 = 40 ms, less than one more prefill.
  Decision d = Place(*core, 1, kDecode, {{1, kKv}}, 50 * kMs, 1, 2);
  EXPECT_EQ(d.physical_device, 1);
  EXPECT_EQ(d.predicted_finish_ns, 260 * kMs);
  EXPECT_EQ(Place(*core, 0, kPrefill, {}, 60 * kMs, 100, 3).physical_device, 0);
  // The stream catches up: two 10 ms steps bank 80 ms more (120 ms): one prefill fits again.
  for (int64_t t : {260 * kMs, 270 * kMs}) {
    d = Place(*core, 1, kDecode, {{1, kKv}}, t, 1, 2);
    EXPECT_EQ(d.physical_device, 1);
    EXPECT_TRUE(core->OnStart(d.ticket, t).ok());
    EXPECT_TRUE(core->OnFinish(d.ticket, t + 10 * kMs, true).ok());
  }
  EXPECT_EQ(Place(*core, 0, kPrefill, {}, 280 * kMs, 100, 3).physical_device, 1);
}

TEST(PlacementSloTest, ADeviceWithoutActiveDecodeStreamsIsNotLimited) {
  // The stream has been quiet for longer than decode_active_ns (100 ms): no one to stall.
  auto core = BusyPrefillDeviceAndFiveDecodeSteps(50 * kMs);
  EXPECT_EQ(ThreePrefills(*core, 200 * kMs), (std::vector<int>{1, 1, 1}));
}

TEST(PlacementSloTest, AStreamStalledBehindAPrefillIsStillActive) {
  // A 100-prompt prefill spills onto device 1 at 50 ms (it serves as many sequences as the
  // decode batch); the batch's next step, placed at 50 ms, waits behind it until 160 ms. At
  // 155 ms, longer than decode_active_ns after that placement, the stream is waiting, not
  // idle: a one-prompt prefill pays for stalling its 100 sequences and goes to device 0.
  auto core = BusyPrefillDeviceAndFiveDecodeSteps(0, 100);
  EXPECT_EQ(Place(*core, 0, kPrefill, {}, 50 * kMs, 100, 3).physical_device, 1);
  const Decision d = Place(*core, 1, kDecode, {{1, kKv}}, 50 * kMs, 100, 2);
  EXPECT_EQ(d.physical_device, 1);
  EXPECT_EQ(d.predicted_finish_ns, 160 * kMs);
  EXPECT_EQ(Place(*core, 0, kPrefill, {}, 155 * kMs, 1, 3).physical_device, 0);
}

TEST(PlacementSloTest, BadTuningIsRefusedByName) {
  Config c;
  c.policy = "dynamic";
  c.devices.assign(2, DeviceModel{});
  c.tuning.tpot_slo_ns = -1;
  auto core = Core::Create(c);
  ASSERT_FALSE(core.ok());
  EXPECT_EQ(core.status().code(), Code::kInvalidArgument);
  EXPECT_NE(core.status().message().find("tpot_slo_ns"), std::string::npos);
  c.tuning.tpot_slo_ns = 0;
  c.tuning.stall_bank_steps = -1;
  core = Core::Create(c);
  ASSERT_FALSE(core.ok());
  EXPECT_NE(core.status().message().find("stall_bank_steps"), std::string::npos);
}

}  // namespace
}  // namespace flexnpu::placement
