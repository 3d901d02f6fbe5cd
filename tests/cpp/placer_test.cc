// The runtime's placer: home mapping, SPMD group mapping, policy switches. The decision core
// itself is tested in placement_*_test.cc.
#include "pjrt_flexnpu/runtime/placer.h"

#include <gtest/gtest.h>

#include <set>

namespace flexnpu {
namespace {

std::unique_ptr<Placer> MakePlacer(const std::string& policy, int physical, int virtual_count) {
  auto placer = Placer::Create(policy, std::vector<placement::DeviceModel>(physical),
                               virtual_count);
  EXPECT_TRUE(placer.ok()) << placer.status().message();
  return placer.ok() ? std::move(*placer) : nullptr;
}

TEST(PlacerTest, HomeIsIdentityModuloPhysicalCount) {
  auto placer = MakePlacer("passthrough", 4, 16);
  for (int v = 0; v < 16; ++v) EXPECT_EQ(placer->HomeOf(v), v % 4);
  EXPECT_TRUE(placer->passthrough());
}

TEST(PlacerTest, GroupKeepsHomesWhenDistinct) {
  auto placer = MakePlacer("passthrough", 4, 4);
  auto mapping = placer->PlaceGroup({2, 3, 0, 1});
  ASSERT_TRUE(mapping.ok());
  EXPECT_EQ(*mapping, (std::vector<int>{2, 3, 0, 1}));
}

TEST(PlacerTest, GroupResolvesCollisionsWithFreeDevices) {
  auto placer = MakePlacer("passthrough", 4, 8);
  auto mapping = placer->PlaceGroup({0, 4, 1, 5});  // homes 0, 0, 1, 1
  ASSERT_TRUE(mapping.ok());
  EXPECT_EQ((*mapping)[0], 0);
  EXPECT_EQ((*mapping)[2], 1);
  std::set<int> distinct(mapping->begin(), mapping->end());
  EXPECT_EQ(distinct, (std::set<int>{0, 1, 2, 3}));
}

TEST(PlacerTest, GroupLargerThanPhysicalIsAnError) {
  auto placer = MakePlacer("passthrough", 2, 3);
  auto mapping = placer->PlaceGroup({0, 1, 2});
  ASSERT_FALSE(mapping.ok());
  EXPECT_EQ(mapping.status().code(), Code::kInvalidArgument);
  EXPECT_NE(mapping.status().message().find("over 3 virtual devices"), std::string::npos);
}

TEST(PlacerTest, SwitchingPolicyLeavesThePassthroughFastPath) {
  auto placer = MakePlacer("passthrough", 4, 4);
  ASSERT_TRUE(placer->SetPolicy("dynamic").ok());
  EXPECT_FALSE(placer->passthrough());
  EXPECT_EQ(placer->policy(), "dynamic");
  Status bad = placer->SetPolicy("roundrobin");
  EXPECT_EQ(bad.code(), Code::kInvalidArgument);
  EXPECT_EQ(placer->policy(), "dynamic");  // a rejected switch changes nothing
  ASSERT_TRUE(placer->SetPolicy("passthrough").ok());
  EXPECT_TRUE(placer->passthrough());
}

TEST(PlacerTest, CreateRejectsBadPolicyAndNoDevices) {
  auto bad = Placer::Create("dynamic-ish", std::vector<placement::DeviceModel>(4), 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  auto none = Placer::Create("passthrough", {}, 4);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace flexnpu
