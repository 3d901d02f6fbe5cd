// Request::weight (sequences an execution serves): the dynamic policy's interference penalties
// weigh the decode sequences a prefill or a moving decode would delay against the sequences it
// serves; unset weights keep the one-per-stream behaviour. Scripted on a fake clock.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"
#include "tests/cpp/placement_test_util.h"

namespace flexnpu::placement {
namespace {

constexpr int64_t kMs = 1'000'000;

// 1e12 FLOP/s, 100 GB/s, 10 GB/s link.
DeviceModel Model() { return DeviceModel{1e12, 1e11, 1e10, false, 0}; }
const Profile kDecode{Phase::kDecode, 1e6, 1e8};        // 1 ms
const Profile kLongPrefill{Phase::kPrefill, 3e10, 1e6};  // 30 ms
const Profile kPrefill{Phase::kPrefill, 1e10, 1e6};      // 10 ms
constexpr int64_t kKv = 1'000'000;

std::unique_ptr<Core> MakeCore(int P, int V, double tpot_weight = 1.0) {
  Config c;
  c.policy = "dynamic";
  c.devices.assign(P, Model());
  c.num_virtual_devices = V;
  c.tuning.tpot_weight = tpot_weight;
  auto core = Core::Create(c);
  EXPECT_TRUE(core.ok()) << core.status().message();
  return std::move(*core);
}

// 2 devices, virtual v0/v2 (home 0) prefill instances, v1 (home 1) a decode stream of
// `decode_weight` sequences that just ran on device 1. A 30 ms prefill occupies device 0; a
// 10 ms prefill of `prefill_weight` sequences then finishes at 41 ms on device 0 or at
// 11 ms + tpot_weight * (decode_weight / prefill_weight) * 10 ms on device 1.
int SecondPrefillDevice(double decode_weight, double prefill_weight) {
  auto core = MakeCore(2, 4);
  const Decision dec = Place(*core, 1, kDecode, {{1, kKv}}, 0, decode_weight, 1);
  EXPECT_EQ(dec.physical_device, 1);
  EXPECT_TRUE(core->OnStart(dec.ticket, 0).ok());
  EXPECT_TRUE(core->OnFinish(dec.ticket, 1 * kMs, true).ok());
  const Decision a = Place(*core, 0, kLongPrefill, {}, 1 * kMs, prefill_weight, 2);
  EXPECT_EQ(a.physical_device, 0) << "an idle device without decode takes the first prefill";
  const Decision b = Place(*core, 2, kPrefill, {}, 1 * kMs, prefill_weight, 3);
  return b.physical_device;
}

TEST(PlacementWeightTest, UnsetWeightCountsOneSequencePerStream) {
  // Penalty 10 ms (1 stream x 10 ms): 21 ms on device 1 beats 41 ms on device 0.
  EXPECT_EQ(SecondPrefillDevice(0, 0), 1);
  EXPECT_EQ(SecondPrefillDevice(1, 1), 1);
  // 8 sequences blocked by a 1-sequence prefill: 11 + 80 ms > 41 ms.
  EXPECT_EQ(SecondPrefillDevice(8, 1), 0);
}

TEST(PlacementWeightTest, PrefillDoesNotStallALargeDecodeBatchForAFewPrompts) {
  // 1000 decode sequences vs 4 prompts: penalty 2.5 s; waiting 30 ms on device 0 is cheaper.
  EXPECT_EQ(SecondPrefillDevice(1000, 4), 0);
}

TEST(PlacementWeightTest, FullPrefillBatchSpillsOntoASmallDecodeBatch) {
  // 2 decode sequences vs 64 prompts: penalty 0.3 ms; 11.3 ms on device 1 beats 41 ms.
  EXPECT_EQ(SecondPrefillDevice(2, 64), 1);
  // Same ratio, larger numbers: only the ratio matters.
  EXPECT_EQ(SecondPrefillDevice(200, 6400), 1);
}

TEST(PlacementWeightTest, DecodeWeightFollowsEachStreamsLastStep) {
  auto core = MakeCore(2, 4);
  int64_t now = 0;
  auto step = [&](int v, int device, double weight) {
    const Decision d = Place(*core, v, kDecode, {{device, kKv}}, now, weight, 1);
    EXPECT_TRUE(core->OnStart(d.ticket, now).ok());
    now += kMs;
    EXPECT_TRUE(core->OnFinish(d.ticket, now, true).ok());
    return d.physical_device;
  };
  EXPECT_EQ(step(1, 1, 1000), 1);
  EXPECT_EQ(step(3, 1, 24), 1);
  Stats s = core->Snapshot(now);
  EXPECT_EQ(s.physical[1].decode_streams, 2);
  EXPECT_DOUBLE_EQ(s.physical[1].decode_weight, 1024);
  EXPECT_DOUBLE_EQ(s.physical[0].decode_weight, 0);
  // The batch shrank: its new size replaces the old one, it is not added.
  EXPECT_EQ(step(1, 1, 900), 1);
  s = core->Snapshot(now);
  EXPECT_DOUBLE_EQ(s.physical[1].decode_weight, 924);
  EXPECT_NE(s.ToJson().find("\"decode_weight\":924"), std::string::npos) << s.ToJson();
  // Unset weight: one per stream, as before the field existed.
  EXPECT_EQ(step(3, 1, 0), 1);
  s = core->Snapshot(now);
  EXPECT_DOUBLE_EQ(s.physical[1].decode_weight, 901);
}

// Device 0 is busy with a 30 ms prefill queued ahead of v0's next decode; device 1 hosts an
// active decode stream (v1). v0's decode moving to device 1 escapes ~30 ms and delays v1's
// sequences by about that. Returns where v0's decode goes.
int MoverDevice(double mover_weight, double resident_weight, double tpot_weight = 1.0) {
  auto core = MakeCore(2, 4, tpot_weight);
  const Decision r = Place(*core, 1, kDecode, {{1, kKv}}, 0, resident_weight, 1);
  EXPECT_TRUE(core->OnStart(r.ticket, 0).ok());
  EXPECT_TRUE(core->OnFinish(r.ticket, 1 * kMs, true).ok());
  const Decision m0 = Place(*core, 0, kDecode, {{0, kKv}}, 1 * kMs, mover_weight, 1);
  EXPECT_EQ(m0.physical_device, 0);
  EXPECT_TRUE(core->OnStart(m0.ticket, 1 * kMs).ok());
  EXPECT_TRUE(core->OnFinish(m0.ticket, 2 * kMs, true).ok());
  // Its prompt (100 MB, 10 ms over the link) is on device 0; its weight makes the decode
  // penalties negligible: it takes device 0 (busy until 32 ms).
  const Decision p = Place(*core, 2, kLongPrefill, {{0, 100'000'000}}, 2 * kMs, 1e6, 2);
  EXPECT_EQ(p.physical_device, 0);
  return Place(*core, 0, kDecode, {{0, kKv}}, 2 * kMs, mover_weight, 1).physical_device;
}

TEST(PlacementWeightTest, HeavyDecodeMovesOntoADeviceWithALightStreamNotTheReverse) {
  // Worth it when v0 carries many more sequences than v1.
  EXPECT_EQ(MoverDevice(1, 1), 0)
      << "equal weights: a move only shifts the wait onto the other stream";
  EXPECT_EQ(MoverDevice(1000, 1), 1);
  EXPECT_EQ(MoverDevice(1, 1000), 0);
}

TEST(PlacementWeightTest, TpotWeightDoesNotCheapenDecodeMovesOntoOtherStreams) {
  // tpot_weight prices decode delay against TTFT; a decode move trades decode time for decode
  // time. At 0.25 the move penalty was a quarter of the wait it shifts: equal streams piled
  // onto one device (the simulator's co-located Qwen: two decode instances per unit).
  EXPECT_EQ(MoverDevice(1, 1, 0.25), 0);
  EXPECT_EQ(MoverDevice(1000, 1, 0.25), 1);
}

TEST(PlacementWeightTest, NonFiniteWeightIsRejected) {
  auto core = MakeCore(2, 2);
  for (double bad : {std::nan(""), HUGE_VAL}) {
    Request r{0, 1, &kDecode, nullptr, 0, 0};
    r.weight = bad;
    Decision d;
    d.physical_device = -7;
    const Status s = core->Place(r, &d);
    EXPECT_EQ(s.code(), Code::kInvalidArgument);
    EXPECT_NE(s.message().find("request weight must be a finite number"), std::string::npos)
        << s.message();
    EXPECT_EQ(d.physical_device, -7) << "out untouched on error";
  }
}

}  // namespace
}  // namespace flexnpu::placement
