// Device roles in the dynamic policy: a decode stream does not escape onto the home of another
// virtual device that is serving prefills (Tuning::prefill_role_ns), unless it must leave its
// own device. Scripted on a fake clock.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"
#include "tests/cpp/placement_test_util.h"

namespace flexnpu::placement {
namespace {

constexpr int64_t kMs = 1'000'000;

// 1e12 FLOP/s, 100 GB/s, 10 GB/s link.
const Profile kDecode{Phase::kDecode, 1e6, 1e8};           // 1 ms
const Profile kShortPrefill{Phase::kPrefill, 5e9, 1e6};    // 5 ms
const Profile kLongPrefill{Phase::kPrefill, 3e11, 1e6};    // 300 ms
constexpr int64_t kKv = 1'000'000;                          // 0.1 ms over the link

std::unique_ptr<Core> MakeCore(int64_t prefill_role_ns) {
  Config c;
  c.policy = "dynamic";
  c.devices.assign(3, DeviceModel{1e12, 1e11, 1e10, false, 0});
  c.num_virtual_devices = 6;  // home v mod 3
  c.tuning.prefill_role_ns = prefill_role_ns;
  auto core = Core::Create(c);
  EXPECT_TRUE(core.ok()) << core.status().message();
  return std::move(*core);
}

// v1 decodes on device 1 (its home, KV there). At 1 ms prefill instances place three
// prefills: v0's 5 ms one on device 0, v2's 300 ms one on device 2 and a 300 ms one of
// `long_prefill_v` (100 prompts: worth stalling the single decode sequence) on device 1.
// Device 0 (home of v0 and v3) is idle from 6 ms on. Returns where v1's next decode goes at
// `decode_at`.
Decision DecodeWhileItsDeviceServesAPrefill(int64_t prefill_role_ns, int64_t decode_at,
                                            bool decode_device_failed = false,
                                            int long_prefill_v = 5) {
  auto core = MakeCore(prefill_role_ns);
  const Decision first = Place(*core, 1, kDecode, {{1, kKv}}, 0, 1, 1);
  EXPECT_EQ(first.physical_device, 1);
  EXPECT_TRUE(core->OnStart(first.ticket, 0).ok());
  EXPECT_TRUE(core->OnFinish(first.ticket, 1 * kMs, !decode_device_failed).ok());
  const Decision a = Place(*core, 0, kShortPrefill, {}, 1 * kMs, 1, 2);
  EXPECT_EQ(a.physical_device, 0);
  const Decision b = Place(*core, 2, kLongPrefill, {}, 1 * kMs, 1, 3);
  EXPECT_EQ(b.physical_device, 2);
  const Decision c = Place(*core, long_prefill_v, kLongPrefill, {}, 1 * kMs, 100, 3);
  if (!decode_device_failed) EXPECT_EQ(c.physical_device, 1);
  EXPECT_TRUE(core->OnStart(a.ticket, 1 * kMs).ok());
  EXPECT_TRUE(core->OnFinish(a.ticket, 6 * kMs, true).ok());
  return Place(*core, 1, kDecode, {{1, kKv}}, decode_at, 1, 1);
}

TEST(PlacementRoleTest, DecodeDoesNotEscapeOntoAnActivePrefillHome) {
  // Device 0 would finish the step at ~11 ms instead of ~302 ms, but it is where v0 (a
  // prefill instance) lives, and v0 placed a prefill 9 ms ago.
  const Decision d = DecodeWhileItsDeviceServesAPrefill(100 * kMs, 10 * kMs);
  EXPECT_EQ(d.physical_device, 1);
  EXPECT_EQ(d.reason, Reason::kAffinity);
  EXPECT_EQ(d.migrate_bytes, 0);
}

TEST(PlacementRoleTest, WithoutRolesOrAfterTheWindowTheDecodeStealsTheIdleDevice) {
  Decision d = DecodeWhileItsDeviceServesAPrefill(0, 10 * kMs);
  EXPECT_EQ(d.physical_device, 0);
  EXPECT_EQ(d.reason, Reason::kIdleSteal);
  EXPECT_EQ(d.migrate_bytes, kKv);
  // v0 has been quiet for 149 ms > 100 ms: device 0 is just idle.
  d = DecodeWhileItsDeviceServesAPrefill(100 * kMs, 150 * kMs);
  EXPECT_EQ(d.physical_device, 0);
  EXPECT_EQ(d.reason, Reason::kIdleSteal);
}

TEST(PlacementRoleTest, APrefillStillRunningKeepsItsHomesRole) {
  // The 300 ms prefill on device 1 belongs to v3, homed at device 0: at 150 ms it is still
  // running (a prefill instance whose steps wait in a queue places nothing new meanwhile).
  const Decision d = DecodeWhileItsDeviceServesAPrefill(100 * kMs, 150 * kMs, false, 3);
  EXPECT_EQ(d.physical_device, 1);
  EXPECT_EQ(d.reason, Reason::kAffinity);
}

TEST(PlacementRoleTest, ADecodeThatMustLeaveMayUseAPrefillHome) {
  // Its own device is quarantined after an error: the prefill homes are the only way out.
  const Decision d = DecodeWhileItsDeviceServesAPrefill(100 * kMs, 10 * kMs, true);
  EXPECT_NE(d.physical_device, 1);
  EXPECT_EQ(d.reason, Reason::kAvoidFailed);
}

TEST(PlacementRoleTest, PrefillPricesTheDisplacedStreamAtItsHome) {
  // v1's decode stream (100 sequences, home device 1) was pushed onto device 0 by an error on
  // device 1. Device 1 is idle again, but a prefill there would keep the stream from coming
  // home: it pays for the stream as if it were there (1 x 100 / 1 x 10 ms), so the 10 ms
  // prefill waits for device 2 (busy until 32 ms) instead. Without that, the empty home drew
  // prefills and the stream stayed doubled up with another one for good.
  Config c;
  c.policy = "dynamic";
  c.devices.assign(3, DeviceModel{1e12, 1e11, 1e10, false, 0});
  c.num_virtual_devices = 6;
  c.tuning.error_quarantine_ns = 1 * kMs;
  auto made = Core::Create(c);
  ASSERT_TRUE(made.ok()) << made.status().message();
  Core& core = **made;
  const Profile kPrefill10{Phase::kPrefill, 1e10, 1e6};
  Decision d = Place(core, 1, kDecode, {{1, kKv}}, 0, 100, 1);
  ASSERT_EQ(d.physical_device, 1);
  ASSERT_TRUE(core.OnFinish(d.ticket, 1 * kMs, false).ok());
  d = Place(core, 1, kDecode, {{1, kKv}}, 1 * kMs, 100, 1);
  ASSERT_EQ(d.physical_device, 0);
  ASSERT_EQ(d.reason, Reason::kAvoidFailed);
  ASSERT_TRUE(core.OnFinish(d.ticket, 2 * kMs, true).ok());
  const Decision busy = Place(core, 5, kLongPrefill, {}, 2 * kMs, 1000, 3);
  ASSERT_EQ(busy.physical_device, 2);
  d = Place(core, 1, kDecode, {{0, kKv}}, 3 * kMs, 100, 1);
  ASSERT_EQ(d.physical_device, 0);
  ASSERT_TRUE(core.OnFinish(d.ticket, 4 * kMs, true).ok());
  const Decision p = Place(core, 3, kPrefill10, {}, 4 * kMs, 1, 2);
  EXPECT_EQ(p.physical_device, 2);
  EXPECT_EQ(p.reason, Reason::kLeastLoaded);
}

TEST(PlacementRoleTest, NegativeWindowIsRejected) {
  Config c;
  c.policy = "dynamic";
  c.devices.assign(2, DeviceModel{});
  c.tuning.prefill_role_ns = -1;
  auto core = Core::Create(c);
  ASSERT_FALSE(core.ok());
  EXPECT_EQ(core.status().code(), Code::kInvalidArgument);
  EXPECT_NE(core.status().message().find("durations must be >= 0"), std::string::npos)
      << core.status().message();
}

}  // namespace
}  // namespace flexnpu::placement
