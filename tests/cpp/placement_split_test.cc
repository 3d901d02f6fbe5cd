// The role split advisor (split.h): the prefill:decode split follows the prompt demand and the
// decode sequences held, on a fake clock.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "pjrt_flexnpu/placement/split.h"

namespace flexnpu::placement {
namespace {

constexpr int64_t kSec = 1'000'000'000;

// 24 units; one unit prefills 100k tokens/s and decodes 1000 sequences.
SplitConfig Config24() {
  SplitConfig c;
  c.units = 24;
  c.prefill_tokens_per_s = 100'000;
  c.decode_sequences_per_unit = 1000;
  c.target_utilization = 0.8;
  c.average_ns = 2 * kSec;
  c.tick_ns = kSec;
  return c;
}

SplitAdvisor Make(const SplitConfig& c) {
  auto a = SplitAdvisor::Create(c);
  EXPECT_TRUE(a.ok()) << a.status().message();
  return std::move(*a);
}

// One second of prompts (`tokens` in total) ending at `t`, then the decision there.
bool Second(SplitAdvisor& a, int64_t t, int64_t tokens, int64_t decode_seqs) {
  EXPECT_TRUE(a.OnPrompt(tokens).ok());
  bool changed = false;
  EXPECT_TRUE(a.Update(t, decode_seqs, &changed).ok());
  return changed;
}

TEST(SplitAdvisor, StartsAtHalfOrTheInitialSplit) {
  EXPECT_EQ(Make(Config24()).prefill_units(), 12);
  SplitConfig c = Config24();
  c.initial_prefill_units = 5;
  EXPECT_EQ(Make(c).prefill_units(), 5);
}

TEST(SplitAdvisor, PrefillGetsItsNeedOverTheTargetAndDecodeTheRest) {
  SplitAdvisor a = Make(Config24());
  ASSERT_TRUE(a.Update(0, 0, nullptr).ok());  // starts the clock
  // 1.0M tokens/s = 10 units of prefill; / 0.8 -> 12.5 -> 13. Decode 5000 sequences = 5 units:
  // 13 + 5 <= 24, so prefill 13 (the first measurement starts the average: no lag).
  Second(a, kSec, 1'000'000, 5000);
  EXPECT_EQ(a.prefill_units(), 13);
  EXPECT_DOUBLE_EQ(a.prompt_tokens_per_s(), 1e6);
  EXPECT_EQ(a.decisions(), 1u);
}

TEST(SplitAdvisor, OutputHeavyPhaseHandsUnitsToDecode) {
  SplitAdvisor a = Make(Config24());
  ASSERT_TRUE(a.Update(0, 0, nullptr).ok());
  for (int s = 1; s <= 5; ++s) Second(a, s * kSec, 1'000'000, 4000);
  EXPECT_EQ(a.prefill_units(), 13);
  // Prompts drop to 100k tokens/s and decode holds 18,000 sequences: the EWMA decays towards
  // 1 unit of prefill (/0.8 -> 2); 2 + 18 <= 24.
  for (int s = 6; s <= 30; ++s) Second(a, s * kSec, 100'000, 18'000);
  EXPECT_EQ(a.prefill_units(), 2);
  EXPECT_GE(a.changes(), 2u);  // it stepped down, not in one jump
}

TEST(SplitAdvisor, OverloadSharesUnitsInProportionToTheNeeds) {
  SplitAdvisor a = Make(Config24());
  ASSERT_TRUE(a.Update(0, 0, nullptr).ok());
  // Prefill need 18 units (1.8M tokens/s), decode need 6 (6000 sequences): 18 / 0.8 + 6 > 24,
  // so 24 * 18 / 24 = 18 prefill units, not ceil(22.5) = 23.
  Second(a, kSec, 1'800'000, 6000);
  EXPECT_EQ(a.prefill_units(), 18);
}

TEST(SplitAdvisor, ClampsToOneUnitEachWay) {
  SplitAdvisor a = Make(Config24());
  ASSERT_TRUE(a.Update(0, 0, nullptr).ok());
  Second(a, kSec, 0, 0);  // no demand at all: one prefill unit stays
  EXPECT_EQ(a.prefill_units(), 1);
  Second(a, 2 * kSec, 1'000'000'000, 0);  // a flood of prompts: one decode unit stays
  EXPECT_EQ(a.prefill_units(), 23);
}

TEST(SplitAdvisor, DecidesOncePerTickAndAveragesPromptsInBetween) {
  SplitAdvisor a = Make(Config24());
  ASSERT_TRUE(a.Update(0, 0, nullptr).ok());
  EXPECT_FALSE(a.Due(kSec / 2));
  ASSERT_TRUE(a.OnPrompt(420'000).ok());
  bool changed = true;
  ASSERT_TRUE(a.Update(kSec / 2, 0, &changed).ok());  // before the tick: no decision
  EXPECT_FALSE(changed);
  EXPECT_EQ(a.decisions(), 0u);
  EXPECT_EQ(a.prefill_units(), 12);
  EXPECT_TRUE(a.Due(kSec));
  ASSERT_TRUE(a.OnPrompt(420'000).ok());
  ASSERT_TRUE(a.Update(2 * kSec, 0, &changed).ok());  // 840k tokens over 2 s
  EXPECT_TRUE(changed);
  EXPECT_DOUBLE_EQ(a.prompt_tokens_per_s(), 420'000);
  EXPECT_EQ(a.prefill_units(), 6);  // 4.2 / 0.8 = 5.25
  // The second measurement moves the average by 1 - exp(-dt / average), not all the way.
  Second(a, 3 * kSec, 0, 0);
  EXPECT_NEAR(a.prompt_tokens_per_s(), 420'000 * std::exp(-0.5), 1e-6);
}

TEST(SplitAdvisor, RejectsBadConfigAndInputsByName) {
  auto expect_invalid = [](const SplitConfig& c, const std::string& what) {
    auto a = SplitAdvisor::Create(c);
    ASSERT_FALSE(a.ok()) << what;
    EXPECT_EQ(a.status().code(), Code::kInvalidArgument);
    EXPECT_NE(a.status().message().find(what), std::string::npos) << a.status().message();
  };
  SplitConfig c = Config24();
  c.units = 1;
  expect_invalid(c, "units must be >= 2");
  c = Config24();
  c.prefill_tokens_per_s = 0;
  expect_invalid(c, "prefill_tokens_per_s");
  c = Config24();
  c.decode_sequences_per_unit = -1;
  expect_invalid(c, "decode_sequences_per_unit");
  c = Config24();
  c.target_utilization = 1.5;
  expect_invalid(c, "target_utilization");
  c = Config24();
  c.tick_ns = 0;
  expect_invalid(c, "tick_ns");
  c = Config24();
  c.average_ns = -1;
  expect_invalid(c, "average_ns");
  c = Config24();
  c.initial_prefill_units = 24;
  expect_invalid(c, "initial_prefill_units");

  SplitAdvisor a = Make(Config24());
  Status s = a.OnPrompt(-1);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("tokens must be >= 0"), std::string::npos) << s.message();
  ASSERT_TRUE(a.Update(5 * kSec, 0, nullptr).ok());
  s = a.Update(4 * kSec, 0, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("clock went back"), std::string::npos) << s.message();
  s = a.Update(6 * kSec, -3, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("decode_sequences must be >= 0"), std::string::npos);
  EXPECT_EQ(a.prefill_units(), 12);  // nothing accepted from the bad calls
}

}  // namespace
}  // namespace flexnpu::placement
