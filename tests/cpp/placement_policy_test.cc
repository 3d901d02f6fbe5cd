// Policy strings: accepted forms, canonical text, and errors that name the problem.
#include <gtest/gtest.h>

#include <string>

#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement {
namespace {

TEST(PlacementPolicyTest, ParsesEveryPolicy) {
  auto p = ParsePolicy("passthrough", 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kind, PolicyKind::kPassthrough);
  p = ParsePolicy(" Dynamic ", 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kind, PolicyKind::kDynamic);
  p = ParsePolicy("static_colocate", 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->kind, PolicyKind::kStaticColocate);
  EXPECT_EQ(p->ToString(), "static-colocate");
}

TEST(PlacementPolicyTest, ParsesStaticPdPoolsWithEverySeparator) {
  for (const char* text : {"static-pd:prefill=0,1;decode=2,3", "static-pd:prefill=0-1|decode=2-3",
                           "static-pd: decode=2,3 prefill=0,1", "STATIC-PD:prefill=0,1;;decode=3,2"}) {
    auto p = ParsePolicy(text, 4);
    ASSERT_TRUE(p.ok()) << text << ": " << p.status().message();
    EXPECT_EQ(p->kind, PolicyKind::kStaticPd);
    EXPECT_EQ(p->prefill_pool, (std::vector<int>{0, 1}));
    EXPECT_EQ(p->decode_pool.size(), 2u);
  }
  auto p = ParsePolicy("static-pd:prefill=0;decode=1-3", 4);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->ToString(), "static-pd:prefill=0;decode=1,2,3");
  // The canonical text parses back to the same spec.
  auto again = ParsePolicy(p->ToString(), 4);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(again->decode_pool, p->decode_pool);
}

void ExpectError(const std::string& text, int num_physical, const std::string& needle) {
  auto p = ParsePolicy(text, num_physical);
  ASSERT_FALSE(p.ok()) << text;
  EXPECT_EQ(p.status().code(), Code::kInvalidArgument) << text;
  EXPECT_NE(p.status().message().find(needle), std::string::npos)
      << text << " -> " << p.status().message() << " (expected to mention '" << needle << "')";
}

TEST(PlacementPolicyTest, RejectsBadStringsNamingTheProblem) {
  ExpectError("dynamik", 4, "unknown placement policy 'dynamik'");
  ExpectError("dynamik", 4, "known: passthrough, static-pd, static-colocate, dynamic");
  ExpectError("", 4, "unknown placement policy ''");
  ExpectError("dynamic:fast=1", 4, "takes no parameters");
  ExpectError("passthrough:", 4, "takes no parameters");
  ExpectError("static-pd", 4, "static-pd needs its pools");
  ExpectError("static-pd:", 4, "static-pd needs its pools");
  ExpectError("static-pd:prefill=0,1", 4, "decode pool is missing");
  ExpectError("static-pd:decode=0,1", 4, "prefill pool is missing");
  ExpectError("static-pd:prefill=0,1;decode=2,4", 4, "device 4 does not exist (physical devices 0-3)");
  ExpectError("static-pd:prefill=0,1;decode=1,2", 4, "device 1 is in both the prefill and the decode pool");
  ExpectError("static-pd:prefill=0,0;decode=2", 4, "device 0 is listed twice");
  ExpectError("static-pd:prefill=0-x;decode=2", 4, "'0-x' is not a device number or range");
  ExpectError("static-pd:prefill=3-1;decode=0", 4, "range '3-1' is backwards");
  ExpectError("static-pd:prefill=-1;decode=0", 4, "'-1' is not a device number");
  ExpectError("static-pd:prefill=;decode=0", 4, "static-pd prefill pool is empty");
  ExpectError("static-pd:prefill=0;decode=1;prefill=2", 4, "prefill pool is given twice");
  ExpectError("static-pd:prefil=0;decode=1", 4, "unknown pool 'prefil'");
  ExpectError("static-pd:prefill 0;decode=1", 4, "'prefill' is not key=devices");
  EXPECT_EQ(ParsePolicy("dynamic", 0).status().code(), Code::kFailedPrecondition);
}

TEST(PlacementPolicyTest, SeparatePoolOptions) {
  auto pool = ParsePool("0-2,5", 8, "prefill_pool");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(*pool, (std::vector<int>{0, 1, 2, 5}));
  auto bad = ParsePool("0,9", 8, "prefill_pool");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("prefill_pool: device 9 does not exist"),
            std::string::npos);
  PolicySpec spec;
  spec.kind = PolicyKind::kStaticPd;
  spec.prefill_pool = {0};
  EXPECT_FALSE(ValidatePolicy(spec, 2).ok());
  spec.decode_pool = {1};
  EXPECT_TRUE(ValidatePolicy(spec, 2).ok());
  spec.kind = PolicyKind::kDynamic;
  EXPECT_NE(ValidatePolicy(spec, 2).message().find("takes no pools"), std::string::npos);
}

}  // namespace
}  // namespace flexnpu::placement
