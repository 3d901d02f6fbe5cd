// placement::Core::UpdateTelemetry: memory-aware placement (a device reported full gets no new
// work under non-passthrough policies) and external load in predicted finish times.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kGB = 1'000'000'000;
// 1e14 FLOP/s, 1 TB/s: a prefill of 5 TFLOP runs 50 ms; a decode reading 2 GB runs 2 ms.
DeviceModel Model() { return DeviceModel{1e14, 1e12, 1e10, false, 0}; }
const Profile kPrefill{Phase::kPrefill, 5e12, 2e9, 1 * kGB};
const Profile kDecode{Phase::kDecode, 1e9, 2e9, 1 * kGB};
const Profile kSmall{Phase::kSmall, 1e3, 1e3, 1 * kGB};

std::unique_ptr<Core> MakeCore(const std::string& policy, int P, int V = 0) {
  Config c;
  c.policy = policy;
  c.devices.assign(P, Model());
  c.num_virtual_devices = V;
  auto core = Core::Create(c);
  EXPECT_TRUE(core.ok()) << core.status().message();
  return std::move(*core);
}

Decision Place(Core& core, int v, const Profile& p, int64_t now, std::vector<Input> inputs = {}) {
  Request r{v, static_cast<uint64_t>(p.phase) + 1, &p, inputs.data(), inputs.size(), now};
  Decision d;
  const Status s = core.Place(r, &d);
  EXPECT_TRUE(s.ok()) << s.message();
  return d;
}

void Report(Core& core, int device, int64_t free_bytes, double utilization, int64_t now) {
  const Status s = core.UpdateTelemetry(device, DeviceTelemetry{free_bytes, utilization}, now);
  ASSERT_TRUE(s.ok()) << s.message();
}

TEST(PlacementTelemetryTest, FullDeviceGetsNoPlacementUnderNonPassthroughPolicies) {
  for (const std::string policy :
       {"dynamic", "static-colocate", "static-pd:prefill=0,1;decode=2,3"}) {
    SCOPED_TRACE(policy);
    auto core = MakeCore(policy, 4, 8);
    for (int d = 0; d < 4; ++d) Report(*core, d, d == 1 || d == 2 ? 0 : 1000 * kGB, -1, 0);
    int64_t now = 0;
    for (int round = 0; round < 6; ++round) {
      for (int v = 0; v < 8; ++v) {
        for (const Profile* p : {&kPrefill, &kDecode, &kSmall}) {
          // Decode and small work whose inputs live on the full devices still leave them.
          const int data = (v + round) % 4;
          const Decision d = Place(*core, v, *p, now, {Input{data, 1000}});
          EXPECT_NE(d.physical_device, 1);
          EXPECT_NE(d.physical_device, 2);
          ASSERT_TRUE(core->OnFinish(d.ticket, now + kMs, true).ok());
          now += kMs;
        }
      }
    }
    const Stats stats = core->Snapshot(now);
    EXPECT_GT(stats.physical[1].memory_skips, 0u);
    EXPECT_EQ(stats.physical[1].memory_free_bytes, 0);
    EXPECT_GT(stats.physical[0].decisions[static_cast<int>(Reason::kAvoidFailed)] +
                  stats.physical[3].decisions[static_cast<int>(Reason::kAvoidFailed)],
              0u);
  }
}

TEST(PlacementTelemetryTest, PassthroughIgnoresMemory) {
  auto core = MakeCore("passthrough", 2);
  Report(*core, 1, 0, -1, 0);
  EXPECT_EQ(Place(*core, 1, kPrefill, 0).physical_device, 1);
  EXPECT_EQ(core->Snapshot(0).physical[1].memory_skips, 0u);
}

TEST(PlacementTelemetryTest, PlacementsCountAgainstFreeMemoryUntilTheNextReading) {
  auto core = MakeCore("static-colocate", 2);
  Report(*core, 0, 2500 * kGB / 1000, -1, 0);  // room for two 1 GB executions
  Report(*core, 1, 0, -1, 0);
  const Decision a = Place(*core, 0, kPrefill, 0);
  const Decision b = Place(*core, 1, kPrefill, 0);
  EXPECT_EQ(a.physical_device, 0);
  EXPECT_EQ(b.physical_device, 0);
  EXPECT_EQ(core->Snapshot(0).physical[0].memory_free_bytes, 500 * kGB / 1000);
  // Neither device has room: the preferred one anyway, said so.
  const Decision c = Place(*core, 1, kPrefill, 0);
  EXPECT_EQ(c.reason, Reason::kFallback);
  // A cancelled placement gives its memory back; a new reading replaces the estimate.
  ASSERT_TRUE(core->Cancel(c.ticket).ok());
  ASSERT_TRUE(core->Cancel(b.ticket).ok());
  EXPECT_EQ(core->Snapshot(0).physical[0].memory_free_bytes, 1500 * kGB / 1000);
  Report(*core, 0, 10 * kGB, -1, kMs);
  const Decision d = Place(*core, 1, kPrefill, kMs);
  EXPECT_EQ(d.physical_device, 0);
  EXPECT_NE(d.reason, Reason::kFallback);
  EXPECT_EQ(core->Snapshot(kMs).physical[0].memory_free_bytes, 9 * kGB);
}

TEST(PlacementTelemetryTest, UnknownMemoryOrNoRequirementSkipsNothing) {
  auto core = MakeCore("static-colocate", 2);
  Report(*core, 0, -1, -1, 0);  // unknown
  Report(*core, 1, 0, -1, 0);
  Profile no_need = kPrefill;
  no_need.memory_bytes = 0;
  EXPECT_EQ(Place(*core, 1, no_need, 0).physical_device, 0);  // least loaded tie -> 0
  const Decision d = Place(*core, 1, no_need, 0);
  EXPECT_EQ(d.physical_device, 1);  // device 1 is "full" but nothing is required
  EXPECT_EQ(core->Snapshot(0).physical[0].memory_free_bytes, -1);
}

TEST(PlacementTelemetryTest, ExternalLoadStretchesPredictionsAndSteersWorkAway) {
  auto alone = MakeCore("dynamic", 1);
  const Decision base = Place(*alone, 0, kPrefill, 0);
  ASSERT_TRUE(alone->Cancel(base.ticket).ok());
  EXPECT_EQ(base.predicted_finish_ns - base.predicted_start_ns, 50 * kMs);
  Report(*alone, 0, -1, 0.8, 0);  // another process keeps it 80% busy
  const Decision loaded = Place(*alone, 0, kPrefill, 0);
  EXPECT_NEAR(static_cast<double>(loaded.predicted_finish_ns - loaded.predicted_start_ns),
              250.0 * kMs, 1e3);  // it gets 20% of the device: 5x
  EXPECT_NEAR(alone->Snapshot(0).physical[0].external_utilization, 0.8, 1e-12);

  auto pair = MakeCore("dynamic", 2);
  EXPECT_EQ(Place(*pair, 0, kPrefill, 0).physical_device, 0);  // idle tie: its home
  auto shared = MakeCore("dynamic", 2);
  Report(*shared, 0, -1, 0.8, 0);
  const Decision moved = Place(*shared, 0, kPrefill, 0);
  EXPECT_EQ(moved.physical_device, 1);
  EXPECT_EQ(moved.reason, Reason::kLeastLoaded);
  // Saturated at 90%: at most 10x, never infinite.
  Report(*shared, 0, -1, 1.0, 0);
  EXPECT_NEAR(shared->Snapshot(0).physical[0].external_utilization, 0.9, 1e-12);
}

TEST(PlacementTelemetryTest, OwnExecutionsAreNotExternalLoad) {
  auto core = MakeCore("dynamic", 1);
  Report(*core, 0, -1, 0.0, 0);  // the window starts
  const Decision d = Place(*core, 0, kPrefill, 0);
  ASSERT_TRUE(core->OnStart(d.ticket, 0).ok());
  ASSERT_TRUE(core->OnFinish(d.ticket, 50 * kMs, true).ok());
  Report(*core, 0, -1, 0.5, 100 * kMs);  // 50% busy: all of it ours
  EXPECT_NEAR(core->Snapshot(100 * kMs).physical[0].external_utilization, 0.0, 1e-12);
  // Next window: ours 50 of 100 ms, device 90% busy -> 40% someone else's.
  const Decision e = Place(*core, 0, kPrefill, 100 * kMs);
  ASSERT_TRUE(core->OnStart(e.ticket, 100 * kMs).ok());
  ASSERT_TRUE(core->OnFinish(e.ticket, 150 * kMs, true).ok());
  Report(*core, 0, -1, 0.9, 200 * kMs);
  EXPECT_NEAR(core->Snapshot(200 * kMs).physical[0].external_utilization, 0.4, 1e-9);
  // Work still running at the reading counts as ours too.
  const Decision f = Place(*core, 0, kPrefill, 200 * kMs);
  ASSERT_TRUE(core->OnStart(f.ticket, 200 * kMs).ok());
  Report(*core, 0, -1, 1.0, 300 * kMs);
  EXPECT_NEAR(core->Snapshot(300 * kMs).physical[0].external_utilization, 0.0, 1e-9);
  ASSERT_TRUE(core->OnFinish(f.ticket, 310 * kMs, true).ok());
}

TEST(PlacementTelemetryTest, BadTelemetryIsRejectedWithAReason) {
  auto core = MakeCore("dynamic", 2);
  Status s = core->UpdateTelemetry(2, DeviceTelemetry{}, 0);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("telemetry for physical device 2, which does not exist (2 physical"),
            std::string::npos)
      << s.message();
  s = core->UpdateTelemetry(0, DeviceTelemetry{-1, 1.5}, 0);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("must be a fraction in [0, 1]"), std::string::npos);
  s = core->UpdateTelemetry(0, DeviceTelemetry{-1, std::numeric_limits<double>::quiet_NaN()}, 0);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(core->Snapshot(0).physical[0].utilization, -1);  // nothing was taken
}

TEST(PlacementTelemetryTest, SnapshotJsonCarriesTelemetry) {
  auto core = MakeCore("dynamic", 1);
  Report(*core, 0, 7 * kGB, 0.25, 0);
  const std::string json = core->Snapshot(0).ToJson();
  EXPECT_NE(json.find("\"memory_free_bytes\":7000000000"), std::string::npos) << json;
  EXPECT_NE(json.find("\"utilization\":0.25"), std::string::npos) << json;
  EXPECT_NE(json.find("\"external_utilization\":0.25"), std::string::npos) << json;
  EXPECT_NE(json.find("\"memory_skips\":0"), std::string::npos) << json;
}

}  // namespace
}  // namespace flexnpu::placement
