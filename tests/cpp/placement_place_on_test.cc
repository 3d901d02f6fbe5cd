// placement::Core::PlaceOn: executions on devices the caller chose (the runtime's SPMD shards)
// count as load that Place then sees, and their tickets finish and cancel like Place's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement {
namespace {

constexpr int64_t kMs = 1'000'000;
// 1e14 FLOP/s, 1 TB/s, 10 GB/s link. A prefill: 5 TFLOP (50 ms); a decode step: 2 GB (2 ms).
const Profile kPrefill{Phase::kPrefill, 5e12, 2e9};
const Profile kDecode{Phase::kDecode, 1e9, 2e9};
constexpr int64_t kKvBytes = 20'000'000;

std::unique_ptr<Core> MakeCore(const std::string& policy, int P, int V) {
  Config c;
  c.policy = policy;
  c.devices.assign(P, DeviceModel{1e14, 1e12, 1e10, false, 0});
  c.num_virtual_devices = V;
  auto core = Core::Create(c);
  EXPECT_TRUE(core.ok()) << core.status().message();
  return std::move(*core);
}

Request Make(int v, const Profile& p, const std::vector<Input>& inputs, int64_t now,
             uint64_t exec = 1) {
  return Request{v, exec, &p, inputs.data(), inputs.size(), now};
}

// An SPMD prefill over virtual 0 and 1 on physical 0 and 1, as the runtime records it.
std::vector<Decision> PlaceGroup(Core& core, int64_t now) {
  std::vector<Decision> out(2);
  for (int shard = 0; shard < 2; ++shard) {
    const Status s = core.PlaceOn(Make(shard, kPrefill, {}, now, 7), shard, &out[shard]);
    EXPECT_TRUE(s.ok()) << s.message();
    EXPECT_EQ(out[shard].physical_device, shard);
    EXPECT_NE(out[shard].ticket, 0u);
  }
  return out;
}

TEST(PlacementPlaceOnTest, ShardLoadIsSeenByLaterPlacements) {
  auto core = MakeCore("dynamic", 4, 4);
  const std::vector<Decision> group = PlaceGroup(*core, 0);
  EXPECT_EQ(group[0].predicted_finish_ns - group[0].predicted_start_ns, 50 * kMs);

  // A decode of virtual 0 whose KV cache is on physical 0: physical 0 is busy with the group's
  // 50 ms prefill for a while, so the decode leaves for an idle device.
  const std::vector<Input> kv = {{0, kKvBytes}};
  Decision decode;
  ASSERT_TRUE(core->Place(Make(0, kDecode, kv, kMs, 2), &decode).ok());
  EXPECT_NE(decode.physical_device, 0);
  EXPECT_NE(decode.physical_device, 1);
  EXPECT_EQ(decode.reason, Reason::kIdleSteal);
  ASSERT_TRUE(core->Cancel(decode.ticket).ok());

  // A prefill of virtual 1 goes to an idle device too, not behind the group on physical 1.
  Decision prefill;
  ASSERT_TRUE(core->Place(Make(1, kPrefill, {}, kMs, 3), &prefill).ok());
  EXPECT_GE(prefill.physical_device, 2);
  ASSERT_TRUE(core->Cancel(prefill.ticket).ok());

  const Stats busy = core->Snapshot(2 * kMs);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(busy.physical[d].queue_length, 1) << d;
    EXPECT_EQ(busy.physical[d].prefill_outstanding, 1) << d;
    EXPECT_EQ(busy.physical[d].executions[static_cast<int>(Phase::kPrefill)], 1u) << d;
    EXPECT_EQ(busy.physical[d].decisions[static_cast<int>(Reason::kAffinity)], 1u) << d;
  }

  // The shards finish: the devices' queues drain and their measured time is counted.
  for (const Decision& d : group) ASSERT_TRUE(core->OnFinish(d.ticket, 40 * kMs, true).ok());
  const Stats done = core->Snapshot(41 * kMs);
  for (int d = 0; d < 2; ++d) {
    EXPECT_EQ(done.physical[d].queue_length, 0) << d;
    EXPECT_EQ(done.physical[d].busy_ns, 40 * kMs) << d;
  }
  // Once they drained, a decode of virtual 0 with its KV cache at home stays there.
  ASSERT_TRUE(core->Place(Make(0, kDecode, kv, 41 * kMs, 2), &decode).ok());
  EXPECT_EQ(decode.physical_device, 0);
}

TEST(PlacementPlaceOnTest, ShardTicketsCancelLikePlacedOnes) {
  auto core = MakeCore("dynamic", 4, 4);
  const std::vector<Decision> group = PlaceGroup(*core, 0);
  for (const Decision& d : group) ASSERT_TRUE(core->Cancel(d.ticket).ok());
  const Stats stats = core->Snapshot(kMs);
  EXPECT_EQ(stats.physical[0].queue_length, 0);
  EXPECT_EQ(stats.physical[0].prefill_outstanding, 0);
  // Cancelled: nothing queued, so virtual 0's decode stays with its KV cache.
  Decision decode;
  ASSERT_TRUE(core->Place(Make(0, kDecode, {{0, kKvBytes}}, kMs, 2), &decode).ok());
  EXPECT_EQ(decode.physical_device, 0);
  const Status again = core->OnFinish(group[0].ticket, kMs, true);
  EXPECT_EQ(again.code(), Code::kNotFound);
}

TEST(PlacementPlaceOnTest, BadDevicesAndRequestsAreRejected) {
  auto core = MakeCore("dynamic", 4, 8);
  Decision d;
  d.physical_device = 123;
  Status s = core->PlaceOn(Make(0, kPrefill, {}, 0), 4, &d);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("physical device 4 does not exist (4 physical devices)"),
            std::string::npos)
      << s.message();
  s = core->PlaceOn(Make(0, kPrefill, {}, 0), -1, &d);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  s = core->PlaceOn(Make(8, kPrefill, {}, 0), 0, &d);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("virtual device 8 does not exist"), std::string::npos)
      << s.message();
  EXPECT_EQ(d.physical_device, 123) << "a rejected request must leave the decision untouched";
  EXPECT_EQ(core->Snapshot(0).decisions, 0u);
}

}  // namespace
}  // namespace flexnpu::placement
