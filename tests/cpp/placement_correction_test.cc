// The online correction (k_exec, k_dev) when executions of one executable overlap: several
// virtual devices run the same program at once (a serving engine's decode instances), so many
// tickets placed under one factor finish before the factor has caught up. Scripted on a fake
// clock, devices that take a fixed true time per execution.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement {
namespace {

constexpr int64_t kMs = 1'000'000;
// 1e12 FLOP/s, 100 GB/s: the model predicts 1 ms for 1e8 bytes.
const Profile kDecode{Phase::kDecode, 1e6, 1e8};

std::unique_ptr<Core> MakeCore(const char* policy, int P) {
  Config c;
  c.policy = policy;
  c.devices.assign(P, DeviceModel{1e12, 1e11, 1e10, false, 0});
  auto core = Core::Create(c);
  EXPECT_TRUE(core.ok()) << core.status().message();
  return std::move(*core);
}

// `streams` virtual devices run executable 7 together, round after round; every execution
// really takes `true_ms`. Returns each round's predicted execution time (ms) of stream 0.
std::vector<double> Rounds(const char* policy, int streams, double true_ms, int rounds) {
  auto core = MakeCore(policy, streams);
  std::vector<double> predicted;
  int64_t now = 0;
  for (int k = 0; k < rounds; ++k) {
    std::vector<Decision> placed(streams);
    for (int v = 0; v < streams; ++v) {
      Request r{v, 7, &kDecode, nullptr, 0, now};
      EXPECT_TRUE(core->Place(r, &placed[v]).ok());
      EXPECT_TRUE(core->OnStart(placed[v].ticket, now).ok());
    }
    predicted.push_back(
        static_cast<double>(placed[0].predicted_finish_ns - placed[0].predicted_start_ns) / kMs);
    now += static_cast<int64_t>(true_ms * kMs);
    for (const Decision& d : placed) EXPECT_TRUE(core->OnFinish(d.ticket, now, true).ok());
    now += kMs;
  }
  return predicted;
}

TEST(PlacementCorrectionTest, OverlappingExecutionsOfOneExecutableConvergeWithoutSwinging) {
  // 16 concurrent executions of a program the model underestimates 3x. Correcting the current
  // factor by each ticket's stale ratio multiplied it by 1.5^16 in one round (predictions then
  // swung by orders of magnitude); corrected against the factor in force, the prediction
  // approaches 3 ms from below and never overshoots far.
  for (const char* policy : {"passthrough", "dynamic"}) {
    const std::vector<double> p = Rounds(policy, 16, 3.0, 12);
    EXPECT_NEAR(p[0], 1.0, 1e-6) << policy << ": the first round uses the bare roofline";
    for (size_t k = 1; k < p.size(); ++k) {
      EXPECT_GT(p[k], 1.0) << policy << " round " << k;
      EXPECT_LT(p[k], 3.0 * 1.25) << policy << " round " << k << ": overshoot";
    }
    EXPECT_NEAR(p.back(), 3.0, 0.15) << policy << ": converged";
  }
}

TEST(PlacementCorrectionTest, OverestimatedProgramConvergesDownWithoutCollapsing) {
  // The model overestimates 4x (true 0.25 ms): 16 overlapping finishes each nudge the factor
  // towards the truth instead of compounding 0.81^16.
  const std::vector<double> p = Rounds("passthrough", 16, 0.25, 20);
  for (size_t k = 1; k < p.size(); ++k) {
    EXPECT_GT(p[k], 0.25 * 0.8) << "round " << k << ": undershoot";
    EXPECT_LT(p[k], p[0]) << "round " << k << ": swung back up";
  }
  EXPECT_NEAR(p.back(), 0.25, 0.02);
}

TEST(PlacementCorrectionTest, OneExecutionAtATimeLearnsAsBefore) {
  // Sequential executions: the factor moves by ewma_alpha * (measured / predicted - 1) each
  // time (1 ms predicted, 3 ms true: 1 -> 1.5 for the executable, 1 -> 1.04 for the device).
  const std::vector<double> p = Rounds("passthrough", 1, 3.0, 2);
  EXPECT_NEAR(p[1], 1.5 * 1.04, 1e-6);
}

}  // namespace
}  // namespace flexnpu::placement
