// The placer's model of a physical device from a roofline preset (runtime/profile.h): its link
// is the preset's device-to-device link (the emulated backend's copies take that time), CPU
// devices copy at memory bandwidth, and time_scale stretches every rate.
#include <gtest/gtest.h>

#include "pjrt_flexnpu/runtime/profile.h"
#include "xla_passes/roofline.h"

namespace flexnpu {
namespace {

TEST(DeviceModelTest, AcceleratorsMoveBuffersOverTheirPresetsLink) {
  for (const char* name : {"910c", "h200"}) {
    const xla_passes::DeviceSpec spec = *xla_passes::FindDevice(name);
    ASSERT_FALSE(spec.link.empty()) << name;
    const placement::DeviceModel model = DeviceModelFor(spec);
    EXPECT_EQ(model.link_bytes_per_s, xla_passes::FindLink(spec.link)->bytes_per_s) << name;
    EXPECT_EQ(model.bandwidth_bytes_per_s, spec.mem_bandwidth);
    EXPECT_EQ(model.launch_s, spec.small_work_s);
  }
}

TEST(DeviceModelTest, CpuCopiesAtMemoryBandwidthAndUnknownLinksAtPcie) {
  const xla_passes::DeviceSpec cpu = *xla_passes::FindDevice("cpu");
  EXPECT_EQ(DeviceModelFor(cpu).link_bytes_per_s, cpu.mem_bandwidth);
  xla_passes::DeviceSpec custom = *xla_passes::FindDevice("h100");
  custom.name = "custom";
  custom.link.clear();
  EXPECT_EQ(DeviceModelFor(custom).link_bytes_per_s, 50e9);
  custom.link = "no-such-link";
  EXPECT_EQ(DeviceModelFor(custom).link_bytes_per_s, 50e9);
}

TEST(DeviceModelTest, TimeScaleStretchesEveryRate) {
  const placement::DeviceModel model = DeviceModelFor(*xla_passes::FindDevice("910c"));
  const placement::DeviceModel slow = StretchedDeviceModel(model, 10);
  EXPECT_DOUBLE_EQ(slow.link_bytes_per_s, model.link_bytes_per_s / 10);
  EXPECT_DOUBLE_EQ(slow.peak_flops, model.peak_flops / 10);
  EXPECT_DOUBLE_EQ(slow.launch_s, model.launch_s * 10);
}

}  // namespace
}  // namespace flexnpu
