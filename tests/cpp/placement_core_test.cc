// placement::Core through its public API, driven by scripted workloads on a fake clock
// (placement_sim.h): the proof bullets, the cost model, errors and run-time switching.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"
#include "tests/cpp/placement_sim.h"

namespace flexnpu::placement {
namespace {

using testing::kMs;
using testing::kUs;
using testing::Placed;
using testing::Sim;

// 1e14 FLOP/s, 1 TB/s HBM, 10 GB/s link (PCIe-like): moving 20 MB of KV costs 2 ms.
constexpr double kLink = 1e10;
DeviceModel Model(bool overlap = false) {
  return DeviceModel{1e14, 1e12, kLink, overlap, 0};
}
// One decode step: 2 GB read (2 ms), few FLOPs. One prefill: 5 TFLOP (50 ms).
const Profile kDecode{Phase::kDecode, 1e9, 2e9};
const Profile kPrefill{Phase::kPrefill, 5e12, 2e9};
const Profile kSmall{Phase::kSmall, 1e3, 1e3};
constexpr int64_t kDecodeNs = 2 * kMs;
constexpr int64_t kPrefillNs = 50 * kMs;
constexpr int64_t kKvBytes = 20'000'000;

std::unique_ptr<Core> MakeCore(const std::string& policy, int P, int V = 0, bool overlap = false,
                               Tuning tuning = {}) {
  Config c;
  c.policy = policy;
  c.devices.assign(P, Model(overlap));
  c.num_virtual_devices = V;
  c.tuning = tuning;
  auto core = Core::Create(c);
  EXPECT_TRUE(core.ok()) << core.status().message();
  return std::move(*core);
}

Decision PlaceOne(Core& core, int v, const Profile& p, std::vector<Input> inputs, int64_t now,
                  uint64_t exec = 1) {
  Request r{v, exec, &p, inputs.data(), inputs.size(), now};
  Decision d;
  const Status s = core.Place(r, &d);
  EXPECT_TRUE(s.ok()) << s.message();
  return d;
}

TEST(PlacementCoreTest, PassthroughIsIdentityModuloP) {
  auto core = MakeCore("passthrough", 4, 10);
  int64_t now = 0;
  for (int round = 0; round < 3; ++round) {
    for (int v = 0; v < 10; ++v) {
      for (const Profile* p : {&kPrefill, &kDecode, &kSmall}) {
        // Inputs elsewhere, and a failing device, change nothing.
        const Decision d = PlaceOne(*core, v, *p, {{(v + 1) % 4, kKvBytes}}, now += kUs);
        EXPECT_EQ(d.physical_device, v % 4);
        EXPECT_EQ(d.reason, Reason::kPassthrough);
        ASSERT_TRUE(core->OnFinish(d.ticket, now + kUs, v != 2).ok());
      }
    }
  }
  const Stats st = core->Snapshot(now);
  EXPECT_EQ(st.policy, "passthrough");
  EXPECT_EQ(st.decisions, 90u);
  EXPECT_EQ(st.physical[0].decisions[static_cast<int>(Reason::kPassthrough)], 27u);
}

// The runtime's passthrough fast path does not call Place: it reports what ran and, where it
// sees the completion, for how long. Snapshot shows those as placed executions.
TEST(PlacementCoreTest, PassthroughExecutionsOutsidePlaceAreCounted) {
  auto core = MakeCore("passthrough", 4, 8);
  core->CountPassthrough(1, 1, Phase::kDecode);
  core->CountPassthrough(5, 1, Phase::kDecode);
  core->CountPassthrough(5, 0, Phase::kPrefill);  // an SPMD shard off home
  core->CountPassthrough(8, 0, Phase::kDecode);   // no such device: ignored
  core->CountPassthrough(1, 4, Phase::kDecode);
  core->PassthroughFinished(1, 1, 10 * kMs, 30 * kMs);
  core->PassthroughFinished(5, 1, 20 * kMs, 40 * kMs);  // overlaps: the device's union counts
  core->PassthroughFinished(5, 0, 50 * kMs, 60 * kMs);
  core->PassthroughFinished(5, 7, 50 * kMs, 60 * kMs);  // ignored
  const Stats st = core->Snapshot(110 * kMs);
  constexpr int kPass = static_cast<int>(Reason::kPassthrough);
  EXPECT_EQ(st.decisions, 3u);
  EXPECT_EQ(st.elapsed_ns, 100 * kMs);  // from the first start measured
  EXPECT_EQ(st.physical[1].executions[static_cast<int>(Phase::kDecode)], 2u);
  EXPECT_EQ(st.physical[1].decisions[kPass], 2u);
  EXPECT_EQ(st.physical[1].busy_ns, 30 * kMs);
  EXPECT_DOUBLE_EQ(st.physical[1].busy_fraction, 0.3);
  EXPECT_EQ(st.physical[0].executions[static_cast<int>(Phase::kPrefill)], 1u);
  EXPECT_EQ(st.physical[0].executions[static_cast<int>(Phase::kDecode)], 0u);
  EXPECT_EQ(st.physical[0].busy_ns, 10 * kMs);
  EXPECT_EQ(st.physical[2].busy_ns, 0);
  EXPECT_EQ(st.virtual_devices[5].decisions[kPass], 2u);
  EXPECT_EQ(st.virtual_devices[5].busy_ns, 30 * kMs);  // its own times, summed
  EXPECT_EQ(st.virtual_devices[5].current, 1);
  EXPECT_EQ(st.virtual_devices[1].busy_ns, 20 * kMs);
  EXPECT_EQ(st.virtual_devices[2].current, -1);
  EXPECT_EQ(st.physical[1].queue_length, 0);
  // Placements add to the same counters.
  const Decision d = PlaceOne(*core, 1, kDecode, {}, 110 * kMs);
  ASSERT_TRUE(core->OnFinish(d.ticket, 112 * kMs, true).ok());
  const Stats after = core->Snapshot(120 * kMs);
  EXPECT_EQ(after.decisions, 4u);
  EXPECT_EQ(after.physical[1].decisions[kPass], 3u);
  EXPECT_EQ(after.physical[1].busy_ns, 32 * kMs);
}

// A deterministic mixed workload: phases, virtual devices and input locations from an LCG.
void MixedWorkload(Sim& sim, int P, int V, int n, uint32_t seed) {
  uint32_t x = seed;
  auto next = [&] { return x = x * 1664525u + 1013904223u; };
  for (int i = 0; i < n; ++i) {
    const uint32_t r = next();
    const Profile& p = r % 3 == 0 ? kPrefill : (r % 3 == 1 ? kDecode : kSmall);
    const int v = static_cast<int>((next() >> 8) % V);
    const int where = static_cast<int>((next() >> 8) % (P + 1)) - 1;  // -1: anywhere
    sim.Submit(v, 1 + r % 3, p, {{where, kKvBytes}},
               &p == &kPrefill ? kPrefillNs / 10 : kDecodeNs);
    sim.RunUntil(sim.now() + kMs);
  }
  sim.RunUntil(sim.now() + 10'000 * kMs);
}

TEST(PlacementCoreTest, StaticPdNeverCrossesPools) {
  auto core = MakeCore("static-pd:prefill=0,1;decode=2,3", 4, 6);
  Sim sim(*core, kLink);
  MixedWorkload(sim, 4, 6, 400, 7);
  sim.set_failing(2, true);  // errors inside the decode pool keep decode in the pool
  MixedWorkload(sim, 4, 6, 200, 11);
  std::map<Phase, std::set<int>> used;
  for (const Placed& p : sim.log()) used[p.phase].insert(p.decision.physical_device);
  EXPECT_EQ(used[Phase::kPrefill], (std::set<int>{0, 1}));
  EXPECT_EQ(used[Phase::kDecode], (std::set<int>{2, 3}));
  bool avoided = false;
  for (const Placed& p : sim.log()) avoided |= p.decision.reason == Reason::kAvoidFailed;
  EXPECT_TRUE(avoided);
  const Stats st = core->Snapshot(sim.now());
  EXPECT_EQ(st.prefill_pool, (std::vector<int>{0, 1}));
  EXPECT_EQ(st.physical[2].executions[static_cast<int>(Phase::kPrefill)], 0u);
  EXPECT_EQ(st.physical[0].executions[static_cast<int>(Phase::kDecode)], 0u);
  EXPECT_GT(st.physical[2].errors, 0u);
}

TEST(PlacementCoreTest, StaticColocateBalancesPrefillAndKeepsDecodeWithItsData) {
  auto core = MakeCore("static-colocate", 4);
  // Four prefills at once (inputs replicated) spread over the four devices, FIFO.
  std::set<int> prefill_devices;
  for (int i = 0; i < 4; ++i) {
    prefill_devices.insert(PlaceOne(*core, 0, kPrefill, {}, 0).physical_device);
  }
  EXPECT_EQ(prefill_devices.size(), 4u);
  // Decode stays with its KV cache even behind a long queue (no phase awareness).
  const Decision d = PlaceOne(*core, 0, kDecode, {{2, kKvBytes}}, kUs);
  EXPECT_EQ(d.physical_device, 2);
  EXPECT_EQ(d.reason, Reason::kAffinity);
  EXPECT_GE(d.predicted_start_ns, kPrefillNs);
}

// The headline scenario. Decode streams of virtual devices 0 and 1 run at home (devices
// 0, 1; devices 2, 3 idle). A burst of prefills pinned to devices 0 and 1 by 4 GB of inputs
// there (400 ms to move) takes those devices: the decodes move to the idle devices 2 and 3
// instead of waiting 200 ms behind the burst, stay there while it lasts, and return home once it
// has passed, leaving 2 and 3 idle again.
TEST(PlacementCoreTest, DynamicPrefillBurstMovesDecodeToIdleDevicesAndBack) {
  auto core = MakeCore("dynamic", 4);
  Sim sim(*core, kLink);
  const int s0 = sim.AddStream(0, 100, kDecode, kKvBytes, 0, kDecodeNs);
  const int s1 = sim.AddStream(1, 101, kDecode, kKvBytes, 1, kDecodeNs);
  sim.RunUntil(20 * kMs);
  for (const Placed& p : sim.log()) {
    EXPECT_EQ(p.decision.physical_device, p.virtual_device);  // steady at home
  }
  const int64_t burst_at = sim.now();
  std::vector<Decision> prefills;
  for (int i = 0; i < 4; ++i) {
    for (int v = 0; v < 2; ++v) {
      prefills.push_back(sim.Submit(v, 200 + v, kPrefill, {{v, int64_t{4} << 30}}, kPrefillNs));
    }
  }
  for (const Decision& d : prefills) EXPECT_LT(d.physical_device, 2);  // the burst takes 0, 1
  const int64_t burst_end = burst_at + 4 * kPrefillNs + 5 * kMs;
  sim.RunUntil(burst_end + 200 * kMs);

  for (int s : {s0, s1}) {
    const int home = s;
    const auto during = sim.StreamLog(s, burst_at + kMs, burst_at + 4 * kPrefillNs);
    ASSERT_GT(during.size(), 20u);
    std::set<int> devices;
    for (const Placed& p : during) devices.insert(p.decision.physical_device);
    EXPECT_EQ(devices.size(), 1u) << "stream " << s << " ping-pongs during the burst";
    EXPECT_GE(*devices.begin(), 2) << "stream " << s << " waits behind the prefill burst";
    // The move itself is an idle steal; the steps after it follow the KV cache.
    int steals = 0, returns = 0;
    for (const Placed& p : sim.StreamLog(s)) {
      steals += p.decision.reason == Reason::kIdleSteal;
      returns += p.decision.reason == Reason::kReturnHome;
    }
    EXPECT_EQ(steals, 1);
    EXPECT_EQ(returns, 1);
    const auto after = sim.StreamLog(s, burst_end + 50 * kMs);
    ASSERT_GT(after.size(), 10u);
    for (const Placed& p : after) EXPECT_EQ(p.decision.physical_device, home);
    // Decode steps never waited long: TPOT stays near one step (+ one migration).
    for (const Placed& p : sim.StreamLog(s)) {
      EXPECT_LE(p.decision.predicted_finish_ns - p.at_ns, 3 * kDecodeNs);
    }
  }
  const Stats st = core->Snapshot(sim.now());
  EXPECT_EQ(st.physical[2].queue_length + st.physical[3].queue_length, 0);
  EXPECT_EQ(st.physical[0].decode_streams, 1);
  EXPECT_EQ(st.physical[1].decode_streams, 1);
  EXPECT_GT(st.virtual_devices[0].bytes_migrated, 0);
  EXPECT_EQ(st.virtual_devices[0].decisions[static_cast<int>(Reason::kIdleSteal)], 1u);
}

// Prefills that can run anywhere go to idle devices first (the queued phase gets the idle
// devices); the decode streams stay put and never queue behind a prefill.
TEST(PlacementCoreTest, DynamicGivesIdleDevicesToPrefillAndProtectsDecode) {
  auto core = MakeCore("dynamic", 4);
  Sim sim(*core, kLink);
  sim.AddStream(0, 100, kDecode, kKvBytes, 0, kDecodeNs);
  sim.AddStream(1, 101, kDecode, kKvBytes, 1, kDecodeNs);
  sim.RunUntil(10 * kMs);
  for (int i = 0; i < 4; ++i) {
    const Decision d = sim.Submit(i % 2, 200, kPrefill, {}, kPrefillNs);
    EXPECT_GE(d.physical_device, 2) << "prefill " << i << " blocks a decode stream";
  }
  sim.RunUntil(300 * kMs);
  for (const Placed& p : sim.log()) {
    if (p.phase == Phase::kDecode) {
      EXPECT_EQ(p.decision.physical_device, p.virtual_device);
      EXPECT_EQ(p.decision.reason, Reason::kAffinity);
    }
  }
  // Prefill is not starved: a burst larger than the idle devices spills onto decode devices
  // rather than queueing ever longer on 2 and 3.
  std::set<int> used;
  for (int i = 0; i < 12; ++i) used.insert(sim.Submit(0, 200, kPrefill, {}, kPrefillNs).physical_device);
  EXPECT_EQ(used.size(), 4u);
}

// Steady, imbalanced decode load (6 streams over 4 devices, homes 0,1,2,3,0,1) with a trickle of
// prefills: the placer may rebalance early, then settles; no stream ever goes A -> B -> A.
TEST(PlacementCoreTest, DynamicSteadyLoadDoesNotOscillate) {
  auto core = MakeCore("dynamic", 4, 6);
  Sim sim(*core, kLink);
  for (int v = 0; v < 6; ++v) sim.AddStream(v, 100, kDecode, kKvBytes, v % 4, kDecodeNs);
  for (int t = 0; t < 40; ++t) {
    sim.Submit(t % 6, 200, Profile{Phase::kPrefill, 5e11, 2e8}, {}, 5 * kMs);
    sim.RunUntil(sim.now() + 25 * kMs);
  }
  const int64_t end = sim.now();
  for (int s = 0; s < 6; ++s) {
    const auto log = sim.StreamLog(s);
    ASSERT_GT(log.size(), 100u);
    std::vector<int> visited;  // distinct consecutive devices
    for (const Placed& p : log) {
      if (visited.empty() || visited.back() != p.decision.physical_device) {
        visited.push_back(p.decision.physical_device);
      }
    }
    EXPECT_LE(visited.size(), 2u) << "stream " << s << " moved " << visited.size() - 1 << " times";
    // Settled: no move in the second half.
    const auto late = sim.StreamLog(s, end / 2);
    for (const Placed& p : late) {
      EXPECT_EQ(p.decision.physical_device, late.front().decision.physical_device);
    }
  }
}

TEST(PlacementCoreTest, DynamicAvoidsDeviceThatReportsErrors) {
  Tuning tuning;
  tuning.error_quarantine_ns = 100 * kMs;
  auto core = MakeCore("dynamic", 4, 4, false, tuning);
  Sim sim(*core, kLink);
  const int s1 = sim.AddStream(1, 100, kDecode, kKvBytes, 1, kDecodeNs);
  sim.RunUntil(10 * kMs);
  sim.set_failing(1, true);
  sim.RunUntil(20 * kMs);
  sim.set_failing(1, false);  // it failed a step; now it is quarantined
  sim.RunUntil(60 * kMs);
  const auto log = sim.StreamLog(s1, 10 * kMs, 60 * kMs);
  ASSERT_FALSE(log.empty());
  bool avoided = false;
  for (const Placed& p : log) {
    avoided |= p.decision.reason == Reason::kAvoidFailed;
  }
  EXPECT_TRUE(avoided);
  for (const Placed& p : sim.StreamLog(s1, 20 * kMs, 60 * kMs)) {
    EXPECT_NE(p.decision.physical_device, 1);
  }
  // Prefills avoid it too while it is quarantined...
  for (int i = 0; i < 8; ++i) {
    EXPECT_NE(sim.Submit(1, 300, kPrefill, {{1, kKvBytes}}, kPrefillNs).physical_device, 1);
  }
  const Stats st = core->Snapshot(sim.now());
  EXPECT_TRUE(st.physical[1].quarantined);
  EXPECT_GT(st.physical[1].errors, 0u);
  // ... and it is used again after the quarantine: the stream returns home.
  sim.RunUntil(1000 * kMs);
  EXPECT_FALSE(core->Snapshot(sim.now()).physical[1].quarantined);
  const auto late = sim.StreamLog(s1, 900 * kMs);
  ASSERT_FALSE(late.empty());
  for (const Placed& p : late) EXPECT_EQ(p.decision.physical_device, 1);
  // Every device failing: fall back instead of refusing.
  for (int d = 0; d < 4; ++d) sim.set_failing(d, true);
  sim.RunUntil(2000 * kMs);
  const Decision d = PlaceOne(*core, 0, kPrefill, {}, sim.now());
  EXPECT_EQ(d.reason, Reason::kFallback);
}

TEST(PlacementCoreTest, MeasuredTimesCorrectTheModel) {
  auto core = MakeCore("dynamic", 2);
  // Really 3x slower than the roofline: the prediction converges to the measured time.
  int64_t now = 0;
  int64_t predicted = 0;
  for (int i = 0; i < 40; ++i) {
    const Decision d = PlaceOne(*core, 0, kDecode, {{0, kKvBytes}}, now, 7);
    predicted = d.predicted_finish_ns - d.predicted_start_ns;
    ASSERT_TRUE(core->OnStart(d.ticket, now).ok());
    now += 3 * kDecodeNs;
    ASSERT_TRUE(core->OnFinish(d.ticket, now, true).ok());
  }
  EXPECT_NEAR(static_cast<double>(predicted), 3.0 * kDecodeNs, 0.05 * kDecodeNs);
  // Another executable on the same device starts from the (slightly corrected) device factor.
  const Decision other = PlaceOne(*core, 0, kDecode, {{0, kKvBytes}}, now, 8);
  EXPECT_LT(other.predicted_finish_ns - other.predicted_start_ns, 2 * kDecodeNs);
  EXPECT_GT(core->Snapshot(now).physical[0].speed_factor, 1.0);
}

TEST(PlacementCoreTest, CoRunFollowsTheRooflineWhereTheDeviceCanOverlap) {
  for (bool overlap : {false, true}) {
    auto core = MakeCore("passthrough", 1, 1, overlap);
    const Decision p = PlaceOne(*core, 0, kPrefill, {}, 0);
    const Decision d = PlaceOne(*core, 0, kDecode, {}, 0);
    EXPECT_EQ(p.predicted_finish_ns, kPrefillNs);
    if (overlap) {
      // The decode's bytes fit beside the compute-bound prefill: ~its own time (2 ms) plus the
      // prefill's share of bandwidth (2 ms), not 52 ms.
      EXPECT_LE(d.predicted_finish_ns, 2 * kDecodeNs + kUs);
      EXPECT_GE(d.predicted_finish_ns, kDecodeNs);
      // Two prefills share compute: the second takes twice as long.
      const Decision p2 = PlaceOne(*core, 0, kPrefill, {}, 0);
      EXPECT_NEAR(static_cast<double>(p2.predicted_finish_ns), 2.0 * kPrefillNs, kMs);
    } else {
      EXPECT_EQ(d.predicted_start_ns, kPrefillNs);
      EXPECT_EQ(d.predicted_finish_ns, kPrefillNs + kDecodeNs);
    }
  }
}

TEST(PlacementCoreTest, PolicySwitchesAtRunTime) {
  auto core = MakeCore("passthrough", 4);
  const Decision before = PlaceOne(*core, 1, kPrefill, {}, 0);
  EXPECT_EQ(before.physical_device, 1);
  ASSERT_TRUE(core->SetPolicy("static-pd:prefill=2,3|decode=0,1").ok());
  EXPECT_EQ(core->policy().kind, PolicyKind::kStaticPd);
  const Decision after = PlaceOne(*core, 1, kPrefill, {}, kUs);
  EXPECT_GE(after.physical_device, 2);
  EXPECT_EQ(after.reason, Reason::kPool);
  // A ticket placed under the old policy finishes normally.
  EXPECT_TRUE(core->OnFinish(before.ticket, kMs, true).ok());
  // A bad policy is refused and leaves the current one in place.
  const Status bad = core->SetPolicy("static-pd:prefill=0;decode=0");
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
  EXPECT_EQ(core->policy().ToString(), "static-pd:prefill=2,3;decode=0,1");
  ASSERT_TRUE(core->SetPolicy("dynamic").ok());
  const Stats st = core->Snapshot(kMs);
  EXPECT_EQ(st.policy, "dynamic");
  EXPECT_EQ(st.policy_switches, 2u);
  const std::string json = st.ToJson();
  EXPECT_EQ(json.front(), '{');
  EXPECT_EQ(json.back(), '}');
  EXPECT_NE(json.find("\"policy\":\"dynamic\""), std::string::npos);
  EXPECT_NE(json.find("\"decisions\":{\"passthrough\":1,"), std::string::npos) << json;
}

TEST(PlacementCoreTest, TicketsAndRequestsAreChecked) {
  auto core = MakeCore("dynamic", 2, 3);
  Decision d = PlaceOne(*core, 2, kSmall, {}, 0);
  EXPECT_NE(d.ticket, 0u);
  EXPECT_TRUE(core->OnFinish(d.ticket, kUs, true).ok());
  EXPECT_EQ(core->OnFinish(d.ticket, kUs, true).code(), Code::kNotFound);
  EXPECT_EQ(core->OnStart(12345, kUs).code(), Code::kNotFound);
  const Decision c = PlaceOne(*core, 0, kPrefill, {}, kUs);
  EXPECT_TRUE(core->Cancel(c.ticket).ok());
  EXPECT_EQ(core->Snapshot(kUs).physical[c.physical_device].queue_length, 0);
  EXPECT_EQ(core->Cancel(c.ticket).code(), Code::kNotFound);

  Decision untouched;
  Request r{3, 1, &kSmall, nullptr, 0, 0};
  Status s = core->Place(r, &untouched);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("virtual device 3 does not exist"), std::string::npos);
  const Input far{5, 10};
  r = Request{0, 1, &kSmall, &far, 1, 0};
  s = core->Place(r, &untouched);
  EXPECT_NE(s.message().find("input 0 is on physical device 5, which does not exist"),
            std::string::npos);
  r = Request{0, 1, nullptr, nullptr, 0, 0};
  EXPECT_EQ(core->Place(r, &untouched).code(), Code::kInvalidArgument);
  EXPECT_EQ(untouched.ticket, 0u);
}

TEST(PlacementCoreTest, CancelTakesTheWorkBackOutOfTheQueue) {
  for (bool overlap : {false, true}) {
    auto core = MakeCore("passthrough", 1, 1, overlap);
    const Decision first = PlaceOne(*core, 0, kPrefill, {}, 0);
    const Decision second = PlaceOne(*core, 0, kPrefill, {}, 0);
    ASSERT_TRUE(core->Cancel(second.ticket).ok());
    const Decision decode = PlaceOne(*core, 0, kDecode, {}, 0);
    // As if the cancelled prefill had never been placed.
    EXPECT_EQ(decode.predicted_finish_ns, overlap ? 2 * kDecodeNs : kPrefillNs + kDecodeNs);
    EXPECT_TRUE(core->OnFinish(first.ticket, kPrefillNs, true).ok());
  }
}

TEST(PlacementCoreTest, CreateRejectsBadConfig) {
  Config c;
  EXPECT_EQ(Core::Create(c).status().code(), Code::kFailedPrecondition);
  c.devices = {Model()};
  c.devices[0].bandwidth_bytes_per_s = 0;
  EXPECT_NE(Core::Create(c).status().message().find("device 0: bandwidth_bytes_per_s"),
            std::string::npos);
  c.devices = {Model(), Model()};
  c.policy = "static-pd:prefill=0;decode=2";
  EXPECT_NE(Core::Create(c).status().message().find("device 2 does not exist"), std::string::npos);
  c.policy = "dynamic";
  c.tuning.ewma_alpha = 2;
  EXPECT_NE(Core::Create(c).status().message().find("ewma_alpha"), std::string::npos);
}

// Decisions depend only on the calls: two cores driven call by call with the same workload,
// one on a clock at 0 and one on a clock 10^13 ns later (a steady_clock reading ~3 h after
// boot), decide the same devices and reasons and predict the same times. Fails if the core
// keeps state across instances, reads a clock of its own or depends on the clock's epoch.
TEST(PlacementCoreTest, DecisionsDependOnlyOnTheCallsNotOnTheClockEpoch) {
  constexpr int64_t kEpoch = 10'000'000'000'000;
  constexpr int P = 4, V = 7;
  auto a = MakeCore("dynamic", P, V);
  auto b = MakeCore("dynamic", P, V);
  struct Pending {
    uint64_t ticket_a, ticket_b;
    int64_t finish;
  };
  std::vector<Pending> pending;
  std::vector<int64_t> device_free(P, 0);
  std::vector<int> kv(V);
  for (int v = 0; v < V; ++v) kv[v] = v % P;
  std::set<int> devices, reasons;
  int64_t now = 0;
  for (int i = 0; i < 400; ++i) {
    now += kMs;
    for (auto it = pending.begin(); it != pending.end();) {
      if (it->finish > now) {
        ++it;
        continue;
      }
      ASSERT_TRUE(a->OnFinish(it->ticket_a, it->finish, true).ok());
      ASSERT_TRUE(b->OnFinish(it->ticket_b, it->finish + kEpoch, true).ok());
      it = pending.erase(it);
    }
    // Six decode streams round-robin, a 50 ms prefill of a prefill instance (v6, home device
    // 2) every 45 ms: about 3 of 4 devices busy.
    const bool prefill = i % 45 == 0;
    const int v = prefill ? 6 : (i * 7) % 6;
    const Profile& profile = prefill ? kPrefill : kDecode;
    const uint64_t exec = prefill ? 2 : 1;
    const Decision da = PlaceOne(*a, v, profile, {{kv[v], kKvBytes}}, now, exec);
    const Decision db = PlaceOne(*b, v, profile, {{kv[v], kKvBytes}}, now + kEpoch, exec);
    ASSERT_EQ(da.physical_device, db.physical_device) << "call " << i;
    ASSERT_EQ(da.reason, db.reason) << "call " << i;
    EXPECT_NEAR(da.predicted_start_ns, db.predicted_start_ns - kEpoch, 1) << "call " << i;
    EXPECT_NEAR(da.predicted_finish_ns, db.predicted_finish_ns - kEpoch, 1) << "call " << i;
    EXPECT_EQ(da.migrate_bytes, db.migrate_bytes) << "call " << i;
    devices.insert(da.physical_device);
    reasons.insert(static_cast<int>(da.reason));
    // The real devices: FIFO, true times 1.5x the model's, migrations over the link.
    const int d = da.physical_device;
    const int64_t migrate_ns = static_cast<int64_t>(da.migrate_bytes / kLink * 1e9);
    const int64_t true_ns = (prefill ? kPrefillNs : kDecodeNs) * 3 / 2;
    device_free[d] = std::max(device_free[d], now + migrate_ns) + true_ns;
    pending.push_back({da.ticket, db.ticket, device_free[d]});
    if (!prefill) kv[v] = d;
  }
  // Only meaningful if the workload made the policy choose: several devices, not only affinity.
  EXPECT_GE(devices.size(), 3u);
  EXPECT_GE(reasons.size(), 2u);
}

// Every compile of a new bucket or program is a new executable id: the learnt corrections are
// an LRU of max_executables entries, not a table that grows forever.
TEST(PlacementCoreTest, ExecutableCorrectionsAreBoundedLeastRecentFirst) {
  Tuning tuning;
  tuning.max_executables = 4;
  auto core = MakeCore("dynamic", 2, 0, false, tuning);
  int64_t now = 0;
  auto predicted = [&](uint64_t exec) {
    const Decision d = PlaceOne(*core, 0, kDecode, {}, now, exec);
    EXPECT_TRUE(core->Cancel(d.ticket).ok());
    return d.predicted_finish_ns - d.predicted_start_ns;
  };
  auto train = [&](uint64_t exec) {  // really 3x slower than the roofline
    for (int i = 0; i < 40; ++i) {
      const Decision d = PlaceOne(*core, 0, kDecode, {}, now, exec);
      ASSERT_TRUE(core->OnStart(d.ticket, now).ok());
      now += 3 * kDecodeNs;
      ASSERT_TRUE(core->OnFinish(d.ticket, now, true).ok());
    }
  };
  train(1);
  EXPECT_NEAR(static_cast<double>(predicted(1)), 3.0 * kDecodeNs, 0.1 * kDecodeNs);
  // 1000 other executables: the table stays at 4 and executable 1 is forgotten.
  for (uint64_t e = 100; e < 1100; ++e) {
    const Decision d = PlaceOne(*core, 0, kDecode, {}, now, e);
    now += kDecodeNs;
    ASSERT_TRUE(core->OnFinish(d.ticket, now, true).ok());
  }
  EXPECT_EQ(core->Snapshot(now).executables, 4u);
  EXPECT_LT(predicted(1), 2 * kDecodeNs);  // starts again from the (device-corrected) roofline
  // Least recently placed goes first: 1 is trained, 2..4 fill the table, 1 is placed again,
  // a fifth executable evicts 2, not 1.
  train(1);
  for (uint64_t e : {2, 3, 4}) predicted(e);
  predicted(1);
  predicted(5);
  EXPECT_NEAR(static_cast<double>(predicted(1)), 3.0 * kDecodeNs, 0.1 * kDecodeNs);
  EXPECT_EQ(core->Snapshot(now).executables, 4u);
  // An outstanding ticket of a forgotten executable still finishes (only the device learns).
  const Decision pending = PlaceOne(*core, 0, kDecode, {}, now, 1);
  ASSERT_TRUE(core->ForgetExecutable(1).ok());
  EXPECT_EQ(core->Snapshot(now).executables, 3u);
  EXPECT_TRUE(core->OnFinish(pending.ticket, now + kDecodeNs, true).ok());
  const Status again = core->ForgetExecutable(1);
  EXPECT_EQ(again.code(), Code::kNotFound);
  EXPECT_NE(again.message().find("executable 1 has no correction"), std::string::npos);
  Config c;
  c.policy = "dynamic";
  c.devices.assign(1, Model());
  c.tuning.max_executables = 0;
  EXPECT_NE(Core::Create(c).status().message().find("max_executables"), std::string::npos);
}

// Two devices, each with its own decode stream; a prefill burst lands on device 0. Moving
// stream 0 onto device 1 only shifts its wait onto stream 1 (FIFO) and moves its KV cache
// twice: with move_weight 1 it stays; with move_weight 0 (the old policy) it moves.
TEST(PlacementCoreTest, DynamicDecodeDoesNotMoveOntoAnotherActiveStream) {
  for (double weight : {1.0, 0.0}) {
    Tuning tuning;
    tuning.move_weight = weight;
    auto core = MakeCore("dynamic", 2, 0, false, tuning);
    Sim sim(*core, kLink);
    const int s0 = sim.AddStream(0, 100, kDecode, kKvBytes, 0, kDecodeNs);
    sim.AddStream(1, 101, kDecode, kKvBytes, 1, kDecodeNs);
    sim.RunUntil(20 * kMs);
    const int64_t burst_at = sim.now();
    for (int i = 0; i < 4; ++i) {
      const Decision d = sim.Submit(0, 200, kPrefill, {{0, int64_t{4} << 30}}, kPrefillNs);
      EXPECT_EQ(d.physical_device, 0);  // its 4 GB input is there
    }
    sim.RunUntil(burst_at + 4 * kPrefillNs + 100 * kMs);
    std::set<int> devices;
    for (const Placed& p : sim.StreamLog(s0)) devices.insert(p.decision.physical_device);
    if (weight > 0) {
      EXPECT_EQ(devices, std::set<int>{0}) << "stream 0 moved onto stream 1's device";
    } else {
      EXPECT_EQ(devices, (std::set<int>{0, 1})) << "the old policy moves it";
    }
  }
}

}  // namespace
}  // namespace flexnpu::placement
