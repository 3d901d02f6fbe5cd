// The role split advisor (split.h): the prefill:decode split follows the prompt demand and the
// decode sequences held, on a fake clock; the queued prompt backlog counts in the prefill need
// and hysteresis holds reversals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "pjrt_flexnpu/placement/split.h"

namespace flexnpu::placement {
namespace {

constexpr int64_t kSec = 1'000'000'000;

// 24 units; one unit prefills 100k tokens/s and decodes 1000 sequences. Neither the backlog
// nor the hysteresis: the rule they refine.
SplitConfig Config24() {
  SplitConfig c;
  c.units = 24;
  c.prefill_tokens_per_s = 100'000;
  c.decode_sequences_per_unit = 1000;
  c.target_utilization = 0.8;
  c.average_ns = 2 * kSec;
  c.tick_ns = kSec;
  c.backlog_drain_ns = 0;
  c.hold_ns = 0;
  return c;
}

// 10 units of the same size, backlog drained over 2 s and a 2 s hold (the defaults).
SplitConfig Config10(int initial_prefill_units) {
  SplitConfig c;
  c.units = 10;
  c.prefill_tokens_per_s = 100'000;
  c.decode_sequences_per_unit = 1000;
  c.initial_prefill_units = initial_prefill_units;
  return c;
}

SplitAdvisor Make(const SplitConfig& c) {
  auto a = SplitAdvisor::Create(c);
  EXPECT_TRUE(a.ok()) << a.status().message();
  return std::move(*a);
}

// One second of prompts (`tokens` in total) ending at `t`, then the decision there.
bool Second(SplitAdvisor& a, int64_t t, int64_t tokens, int64_t decode_seqs,
            int64_t queued_tokens = 0) {
  EXPECT_TRUE(a.OnPrompt(tokens).ok());
  bool changed = false;
  EXPECT_TRUE(a.Update(t, decode_seqs, queued_tokens, &changed).ok());
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
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());  // starts the clock
  // 1.0M tokens/s = 10 units of prefill; / 0.8 -> 12.5 -> 13. Decode 5000 sequences = 5 units:
  // 13 + 5 <= 24, so prefill 13 (the first measurement starts the average: no lag).
  Second(a, kSec, 1'000'000, 5000);
  EXPECT_EQ(a.prefill_units(), 13);
  EXPECT_DOUBLE_EQ(a.prompt_tokens_per_s(), 1e6);
  EXPECT_EQ(a.decisions(), 1u);
}

TEST(SplitAdvisor, OutputHeavyPhaseHandsUnitsToDecode) {
  SplitAdvisor a = Make(Config24());
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());
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
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());
  // Prefill need 18 units (1.8M tokens/s), decode need 6 (6000 sequences): 18 / 0.8 + 6 > 24,
  // so 24 * 18 / 24 = 18 prefill units, not ceil(22.5) = 23.
  Second(a, kSec, 1'800'000, 6000);
  EXPECT_EQ(a.prefill_units(), 18);
}

TEST(SplitAdvisor, ClampsToOneUnitEachWay) {
  SplitAdvisor a = Make(Config24());
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());
  Second(a, kSec, 0, 0);  // no demand at all: one prefill unit stays
  EXPECT_EQ(a.prefill_units(), 1);
  Second(a, 2 * kSec, 1'000'000'000, 0);  // a flood of prompts: one decode unit stays
  EXPECT_EQ(a.prefill_units(), 23);
}

TEST(SplitAdvisor, DecidesOncePerTickAndAveragesPromptsInBetween) {
  SplitAdvisor a = Make(Config24());
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());
  EXPECT_FALSE(a.Due(kSec / 2));
  ASSERT_TRUE(a.OnPrompt(420'000).ok());
  bool changed = true;
  ASSERT_TRUE(a.Update(kSec / 2, 0, 0, &changed).ok());  // before the tick: no decision
  EXPECT_FALSE(changed);
  EXPECT_EQ(a.decisions(), 0u);
  EXPECT_EQ(a.prefill_units(), 12);
  EXPECT_TRUE(a.Due(kSec));
  ASSERT_TRUE(a.OnPrompt(420'000).ok());
  ASSERT_TRUE(a.Update(2 * kSec, 0, 0, &changed).ok());  // 840k tokens over 2 s
  EXPECT_TRUE(changed);
  EXPECT_DOUBLE_EQ(a.prompt_tokens_per_s(), 420'000);
  EXPECT_EQ(a.prefill_units(), 6);  // 4.2 / 0.8 = 5.25
  // The second measurement moves the average by 1 - exp(-dt / average), not all the way.
  Second(a, 3 * kSec, 0, 0);
  EXPECT_NEAR(a.prompt_tokens_per_s(), 420'000 * std::exp(-0.5), 1e-6);
}

// A toy cluster on the advisor's clock: 600k prompt tokens/s arrive (6 units of prefill), 4000
// sequences decode (4 units): 6 / 0.75 + 4 > 10, so the advisor shares the units by need, 6
// prefill -- exactly the arrival rate. A 1.2M-token backlog waits at the start. Each tick the
// advisor sees what the last tick left queued, then the prefill units compute what they can
// of it and of the tick's arrivals. Returns the backlog after each of 30 ticks; `splits` the
// split.
std::vector<double> OverloadEdge(int64_t backlog_drain_ns, std::vector<int>* splits) {
  SplitConfig c = Config10(6);
  c.backlog_drain_ns = backlog_drain_ns;
  SplitAdvisor a = Make(c);
  double backlog = 1'200'000;
  std::vector<double> backlogs;
  EXPECT_TRUE(a.Update(0, 4000, static_cast<int64_t>(backlog), nullptr).ok());
  for (int t = 1; t <= 30; ++t) {
    Second(a, t * kSec, 600'000, 4000, static_cast<int64_t>(backlog));
    backlog = std::max(0.0, backlog + 600'000 - a.prefill_units() * 100'000.0);
    splits->push_back(a.prefill_units());
    backlogs.push_back(backlog);
  }
  return backlogs;
}

TEST(SplitAdvisor, BacklogAtTheOverloadEdgeNeverDrainsWhenTheNeedIgnoresIt) {
  std::vector<int> splits;
  std::vector<double> backlogs = OverloadEdge(/*backlog_drain_ns=*/0, &splits);
  for (int s : splits) EXPECT_EQ(s, 6);
  EXPECT_EQ(backlogs.back(), 1'200'000);  // every tick adds what it computes
}

TEST(SplitAdvisor, BacklogCountedInThePrefillNeedDrainsAndTheSplitReturns) {
  std::vector<int> splits;
  std::vector<double> backlogs = OverloadEdge(2 * kSec, &splits);
  // The backlog takes units from decode at once.
  EXPECT_GE(*std::max_element(splits.begin(), splits.begin() + 3), 8);
  // Drained down to what one unit prefills in a tick (the share rounds up above that), then
  // back to the arrivals' share.
  auto drained = std::find_if(backlogs.begin(), backlogs.end(),
                              [](double b) { return b <= 100'000; });
  EXPECT_LT(drained - backlogs.begin(), 10);
  EXPECT_LE(backlogs.back(), 100'000);
  EXPECT_EQ(splits.back(), 6);
}

TEST(SplitAdvisor, BacklogBelowTheEdgeAddsItsDrainRateToTheNeed) {
  SplitConfig c = Config10(0);
  c.hold_ns = 0;
  SplitAdvisor a = Make(c);
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());
  Second(a, kSec, 300'000, 0);  // 3 units / 0.75 -> 4
  EXPECT_EQ(a.prefill_units(), 4);
  Second(a, 2 * kSec, 300'000, 0, 600'000);  // + 600k over 2 s = 300k/s: 6 / 0.75 -> 8
  EXPECT_EQ(a.prefill_units(), 8);
}

// A prompt rate hovering across a unit boundary: 520k/s (7 units at 0.75) and 440k/s (6) on
// alternate ticks; the average follows each tick (average_ns 1).
SplitAdvisor Alternating(int64_t hold_ns) {
  SplitConfig c = Config10(6);
  c.average_ns = 1;
  c.hold_ns = hold_ns;
  SplitAdvisor a = Make(c);
  EXPECT_TRUE(a.Update(0, 0, 0, nullptr).ok());
  for (int t = 1; t <= 20; ++t) Second(a, t * kSec, t % 2 ? 520'000 : 440'000, 0);
  return a;
}

TEST(SplitAdvisor, HysteresisKeepsAHoveringRateFromFlippingTheSplitEveryTick) {
  EXPECT_EQ(Alternating(/*hold_ns=*/0).changes(), 20u);  // 7, 6, 7, 6, ...
  SplitAdvisor steady = Alternating(2 * kSec);  // up to 7 once, never back: each ask lasts 1 s
  EXPECT_EQ(steady.decisions(), 20u);
  EXPECT_EQ(steady.changes(), 1u);
  EXPECT_EQ(steady.prefill_units(), 7);
}

TEST(SplitAdvisor, HysteresisLetsTrendsThroughAndHoldsReversals) {
  SplitConfig c = Config10(3);
  c.average_ns = 1;  // hold 2 s
  SplitAdvisor a = Make(c);
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());
  EXPECT_TRUE(Second(a, kSec, 600'000, 0));  // 8 units: the first change goes at once
  EXPECT_EQ(a.prefill_units(), 8);
  EXPECT_TRUE(Second(a, 2 * kSec, 750'000, 0));  // 10 -> 9 (clamped): the same way, at once
  EXPECT_EQ(a.prefill_units(), 9);
  // 3 units: a large reversal of the change of 1 s ago is held ...
  EXPECT_FALSE(Second(a, 3 * kSec, 200'000, 0));
  EXPECT_EQ(a.prefill_units(), 9);
  EXPECT_EQ(a.proposal(), 3);
  // ... and goes at once when the last change is 2 s old.
  EXPECT_TRUE(Second(a, 4 * kSec, 200'000, 0));
  EXPECT_EQ(a.prefill_units(), 3);
  // A one-unit reversal up (4) within 1 s, the prefill side within its capacity: held ...
  EXPECT_FALSE(Second(a, 5 * kSec, 280'000, 0));
  EXPECT_EQ(a.proposal(), 4);
  // ... but a reversal that feeds a side over its capacity goes at once (6 units of need on 3).
  EXPECT_TRUE(Second(a, 6 * kSec, 600'000, 0));
  EXPECT_EQ(a.prefill_units(), 8);
  for (int t = 7; t <= 8; ++t) {  // a one-unit reversal (7) waits until asked for 2 s
    EXPECT_FALSE(Second(a, t * kSec, 520'000, 0));
    EXPECT_EQ(a.proposal(), 7);
  }
  EXPECT_TRUE(Second(a, 9 * kSec, 520'000, 0));
  EXPECT_EQ(a.prefill_units(), 7);
  EXPECT_EQ(a.changes(), 5u);
}

TEST(SplitAdvisor, AReversalToADecodeSideOverItsCapacityIsNotHeld) {
  SplitConfig c = Config10(3);
  c.average_ns = 1;
  c.deadband_units = 9;  // every reversal would wait the hold
  SplitAdvisor a = Make(c);
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());
  EXPECT_TRUE(Second(a, kSec, 900'000, 0));  // prompt-heavy: up to 9, one decode unit
  EXPECT_EQ(a.decode_units(), 1);
  // 1000 sequences fill that one unit: the way back (3 / 0.75 = 4 prefill) waits ...
  EXPECT_FALSE(Second(a, 2 * kSec, 300'000, 1000));
  // ... until they are more than it holds.
  EXPECT_TRUE(Second(a, 3 * kSec, 300'000, 2500));
  EXPECT_EQ(a.prefill_units(), 4);
}

TEST(SplitAdvisor, CoLocatesAtOnceWhileTheNeedsFillTheClusterAndLeavesAfterTheHold) {
  SplitConfig c = Config10(0);
  c.average_ns = 1;
  c.colocate_at_capacity = true;
  SplitAdvisor a = Make(c);
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());
  EXPECT_TRUE(Second(a, kSec, 300'000, 2000));  // 3 / 0.75 + 2 = 6 units of 10: a split
  EXPECT_EQ(a.prefill_units(), 4);
  EXPECT_EQ(a.mixed_units(), 0);
  EXPECT_EQ(a.decode_units(), 6);
  // 6 / 0.75 + 3 = 11 > 9 (less than a unit to spare): every unit co-located, at once.
  EXPECT_TRUE(Second(a, 2 * kSec, 600'000, 3000));
  EXPECT_EQ(a.proposal(), 0);
  EXPECT_EQ(a.prefill_units(), 0);
  EXPECT_EQ(a.mixed_units(), 10);
  EXPECT_EQ(a.decode_units(), 0);
  EXPECT_FALSE(Second(a, 3 * kSec, 600'000, 3000));  // still full: nothing changes
  // A split is asked from 4 s; left when it was asked for 2 s, at the last one asked.
  EXPECT_FALSE(Second(a, 4 * kSec, 300'000, 2000));
  EXPECT_FALSE(Second(a, 5 * kSec, 150'000, 2000));
  EXPECT_TRUE(Second(a, 6 * kSec, 300'000, 2000));
  EXPECT_EQ(a.prefill_units(), 4);
  EXPECT_EQ(a.mixed_units(), 0);
  EXPECT_EQ(a.changes(), 3u);
  // Without the option the same needs share the units by need (8 prefill: 6 / 9 of 10, up).
  c.colocate_at_capacity = false;
  SplitAdvisor split = Make(c);
  ASSERT_TRUE(split.Update(0, 0, 0, nullptr).ok());
  Second(split, kSec, 600'000, 3000);
  EXPECT_EQ(split.mixed_units(), 0);
  EXPECT_EQ(split.prefill_units(), 7);
}

TEST(SplitAdvisor, AHeldReversalMovesByTheLeastItWasAskedFor) {
  SplitConfig c = Config10(3);
  c.average_ns = 1;
  c.deadband_units = 9;  // every reversal waits the hold
  SplitAdvisor a = Make(c);
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());
  EXPECT_TRUE(Second(a, kSec, 600'000, 0));  // up to 8
  EXPECT_FALSE(Second(a, 2 * kSec, 150'000, 0));  // asks for 2 (-6)
  EXPECT_FALSE(Second(a, 3 * kSec, 450'000, 0));  // asks for 6 (-2)
  EXPECT_TRUE(Second(a, 4 * kSec, 150'000, 0));  // asked for 2 s: the smallest move, -2
  EXPECT_EQ(a.prefill_units(), 6);
  EXPECT_EQ(a.proposal(), 2);
}

TEST(SplitAdvisor, AProposalOfTheCurrentSplitEndsAHeldAsk) {
  SplitConfig c = Config10(3);
  c.average_ns = 1;
  SplitAdvisor a = Make(c);
  ASSERT_TRUE(a.Update(0, 0, 0, nullptr).ok());
  EXPECT_TRUE(Second(a, kSec, 600'000, 0));       // up to 8
  EXPECT_FALSE(Second(a, 2 * kSec, 520'000, 0));  // 7: a one-unit reversal, held from 2 s
  EXPECT_FALSE(Second(a, 3 * kSec, 600'000, 0));  // 8 again: the ask ends
  EXPECT_FALSE(Second(a, 4 * kSec, 520'000, 0));  // a new ask from 4 s ...
  EXPECT_FALSE(Second(a, 5 * kSec, 520'000, 0));
  EXPECT_TRUE(Second(a, 6 * kSec, 520'000, 0));   // ... goes 2 s later
  EXPECT_EQ(a.prefill_units(), 7);
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
  c = Config24();
  c.backlog_drain_ns = -1;
  expect_invalid(c, "backlog_drain_ns must be >= 0 (0: off)");
  c = Config24();
  c.hold_ns = -1;
  expect_invalid(c, "hold_ns must be >= 0 (0: off)");
  c = Config24();
  c.deadband_units = -1;
  expect_invalid(c, "deadband_units must be >= 0");

  SplitAdvisor a = Make(Config24());
  Status s = a.OnPrompt(-1);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("tokens must be >= 0"), std::string::npos) << s.message();
  ASSERT_TRUE(a.Update(5 * kSec, 0, 0, nullptr).ok());
  s = a.Update(4 * kSec, 0, 0, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("clock went back"), std::string::npos) << s.message();
  s = a.Update(6 * kSec, -3, 0, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("decode_sequences must be >= 0"), std::string::npos);
  s = a.Update(6 * kSec, 0, -3, nullptr);
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_NE(s.message().find("queued_prompt_tokens must be >= 0"), std::string::npos);
  EXPECT_EQ(a.prefill_units(), 12);  // nothing accepted from the bad calls
  EXPECT_EQ(a.decisions(), 0u);
}

}  // namespace
}  // namespace flexnpu::placement
