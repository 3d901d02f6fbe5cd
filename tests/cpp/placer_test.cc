#include "pjrt_flexnpu/runtime/placer.h"

#include <gtest/gtest.h>

#include <set>

namespace flexnpu {
namespace {

TEST(PassthroughPlacerTest, IsIdentityModuloPhysicalCount) {
  PassthroughPlacer placer(4);
  for (int v = 0; v < 16; ++v) {
    EXPECT_EQ(placer.HomeOf(v), v % 4);
    EXPECT_EQ(placer.PlaceExecution(v), v % 4);
  }
}

TEST(PassthroughPlacerTest, GroupKeepsHomesWhenDistinct) {
  PassthroughPlacer placer(4);
  auto mapping = placer.PlaceGroup({2, 3, 0, 1});
  ASSERT_TRUE(mapping.ok());
  EXPECT_EQ(*mapping, (std::vector<int>{2, 3, 0, 1}));
}

TEST(PassthroughPlacerTest, GroupResolvesCollisionsWithFreeDevices) {
  PassthroughPlacer placer(4);
  auto mapping = placer.PlaceGroup({0, 4, 1, 5});  // homes 0, 0, 1, 1
  ASSERT_TRUE(mapping.ok());
  EXPECT_EQ((*mapping)[0], 0);
  EXPECT_EQ((*mapping)[2], 1);
  std::set<int> distinct(mapping->begin(), mapping->end());
  EXPECT_EQ(distinct, (std::set<int>{0, 1, 2, 3}));
}

TEST(PassthroughPlacerTest, GroupLargerThanPhysicalIsAnError) {
  PassthroughPlacer placer(2);
  auto mapping = placer.PlaceGroup({0, 1, 2});
  ASSERT_FALSE(mapping.ok());
  EXPECT_EQ(mapping.status().code(), Code::kInvalidArgument);
  EXPECT_NE(mapping.status().message().find("over 3 virtual devices"), std::string::npos);
}

TEST(MakePlacerTest, RejectsUnknownPolicyAndNoDevices) {
  EXPECT_FALSE(MakePlacer("dynamic-ish", 4).ok());
  auto none = MakePlacer("passthrough", 0);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), Code::kFailedPrecondition);
}

}  // namespace
}  // namespace flexnpu
