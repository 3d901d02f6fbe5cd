#include "pjrt_flexnpu/placement/split.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>

namespace flexnpu::placement {

StatusOr<SplitAdvisor> SplitAdvisor::Create(const SplitConfig& c) {
  const std::string where = "split advisor: ";
  if (c.units < 2) {
    return InvalidArgument(where + "units must be >= 2, got " + std::to_string(c.units));
  }
  if (!(c.prefill_tokens_per_s > 0) || !std::isfinite(c.prefill_tokens_per_s)) {
    return InvalidArgument(where + "prefill_tokens_per_s must be a finite number > 0");
  }
  if (!(c.decode_sequences_per_unit > 0) || !std::isfinite(c.decode_sequences_per_unit)) {
    return InvalidArgument(where + "decode_sequences_per_unit must be a finite number > 0");
  }
  if (!(c.target_utilization > 0 && c.target_utilization <= 1)) {
    return InvalidArgument(where + "target_utilization must be in (0, 1]");
  }
  if (c.average_ns <= 0) return InvalidArgument(where + "average_ns must be > 0");
  if (c.tick_ns <= 0) return InvalidArgument(where + "tick_ns must be > 0");
  if (c.backlog_drain_ns < 0) {
    return InvalidArgument(where + "backlog_drain_ns must be >= 0 (0: off), got " +
                           std::to_string(c.backlog_drain_ns));
  }
  if (c.hold_ns < 0) {
    return InvalidArgument(where + "hold_ns must be >= 0 (0: off), got " +
                           std::to_string(c.hold_ns));
  }
  if (c.deadband_units < 0) {
    return InvalidArgument(where + "deadband_units must be >= 0, got " +
                           std::to_string(c.deadband_units));
  }
  if (c.initial_prefill_units < 0 || c.initial_prefill_units >= c.units) {
    return InvalidArgument(where + "initial_prefill_units must be in [0, units - 1] (0: units "
                           "/ 2), got " + std::to_string(c.initial_prefill_units));
  }
  return SplitAdvisor(c);
}

SplitAdvisor::SplitAdvisor(const SplitConfig& c)
    : config_(c),
      prefill_units_(c.initial_prefill_units ? c.initial_prefill_units
                                             : std::max(1, c.units / 2)),
      proposal_(prefill_units_) {}

Status SplitAdvisor::OnPrompt(int64_t tokens) {
  if (tokens < 0) {
    return InvalidArgument("split advisor: OnPrompt tokens must be >= 0, got " +
                           std::to_string(tokens));
  }
  pending_ += static_cast<double>(tokens);
  return Status::Ok();
}

Status SplitAdvisor::Update(int64_t now_ns, int64_t decode_sequences,
                            int64_t queued_prompt_tokens, bool* changed) {
  if (changed) *changed = false;
  if (decode_sequences < 0) {
    return InvalidArgument("split advisor: Update decode_sequences must be >= 0, got " +
                           std::to_string(decode_sequences));
  }
  if (queued_prompt_tokens < 0) {
    return InvalidArgument("split advisor: Update queued_prompt_tokens must be >= 0, got " +
                           std::to_string(queued_prompt_tokens));
  }
  if (started_ && now_ns < last_ns_) {
    return InvalidArgument("split advisor: Update clock went back (" + std::to_string(now_ns) +
                           " < " + std::to_string(last_ns_) + " ns)");
  }
  if (!started_) {  // tokens reported before the clock started count from here
    started_ = true;
    last_ns_ = now_ns;
    return Status::Ok();
  }
  const int64_t dt_ns = now_ns - last_ns_;
  if (dt_ns < config_.tick_ns) return Status::Ok();
  const double dt = static_cast<double>(dt_ns) * 1e-9;
  const double measured = pending_ / dt;
  // The first measurement starts the average (from 0 it would lag one time constant).
  const double a = averaged_ ? 1.0 - std::exp(-static_cast<double>(dt_ns) /
                                              static_cast<double>(config_.average_ns))
                             : 1.0;
  rate_ += a * (measured - rate_);
  averaged_ = true;
  pending_ = 0;
  last_ns_ = now_ns;
  ++decisions_;
  Propose(decode_sequences, queued_prompt_tokens);
  const bool moved = Apply(now_ns);
  if (changed) *changed = moved;
  return Status::Ok();
}

namespace {
constexpr int kLeaveMixed = 2;  // ask_direction_ of splits asked while co-located
}  // namespace

void SplitAdvisor::Propose(int64_t decode_sequences, int64_t queued_prompt_tokens) {
  const int units = config_.units;
  const double queued = static_cast<double>(queued_prompt_tokens);
  double demand = rate_;  // prompt tokens per second to prefill
  if (config_.backlog_drain_ns) {
    demand += queued / (static_cast<double>(config_.backlog_drain_ns) * 1e-9);
  }
  prefill_need_ = demand / config_.prefill_tokens_per_s;
  decode_need_ = static_cast<double>(decode_sequences) / config_.decode_sequences_per_unit;
  const double prefill_want = prefill_need_ / config_.target_utilization;
  if (config_.colocate_at_capacity && prefill_want + decode_need_ > units - 1) {
    proposal_ = 0;
    return;
  }
  int want;
  if (prefill_want + decode_need_ <= units) {
    want = static_cast<int>(std::ceil(prefill_want));
  } else {  // overloaded: share the units in proportion to the needs
    const double share = units * prefill_need_ / (prefill_need_ + decode_need_);
    const bool backlog =
        config_.backlog_drain_ns &&
        queued > config_.prefill_tokens_per_s * static_cast<double>(config_.tick_ns) * 1e-9;
    want = static_cast<int>(backlog ? std::ceil(share) : std::lround(share));
  }
  proposal_ = std::clamp(want, 1, units - 1);
}

bool SplitAdvisor::Apply(int64_t now_ns) {
  if (proposal_ == 0) {  // co-locate: the needs fill the cluster, at once
    ask_direction_ = 0;
    if (mixed_units_) return false;
    prefill_units_ = 0;
    mixed_units_ = config_.units;
    last_direction_ = 0;
    last_change_ns_ = now_ns;
    ++changes_;
    return true;
  }
  if (mixed_units_) return Leave(now_ns);
  const int move = proposal_ - prefill_units_;
  if (move == 0) {
    ask_direction_ = 0;
    return false;
  }
  const int direction = move > 0 ? 1 : -1;
  const int size = std::abs(move);
  const bool over_capacity = direction > 0 ? prefill_need_ > prefill_units_
                                           : decode_need_ > decode_units();
  const bool at_once = direction != -last_direction_ || over_capacity ||
                       (size > config_.deadband_units &&
                        now_ns - last_change_ns_ >= config_.hold_ns);
  if (!config_.hold_ns || at_once) {
    Change(now_ns, proposal_, direction);
    return true;
  }
  if (direction != ask_direction_) {  // a new ask: held from now
    ask_direction_ = direction;
    ask_since_ns_ = now_ns;
    ask_least_ = size;
  } else {
    ask_least_ = std::min(ask_least_, size);
  }
  if (now_ns - ask_since_ns_ < config_.hold_ns) return false;
  Change(now_ns, prefill_units_ + direction * ask_least_, direction);
  return true;
}

bool SplitAdvisor::Leave(int64_t now_ns) {
  if (ask_direction_ != kLeaveMixed) {
    ask_direction_ = kLeaveMixed;
    ask_since_ns_ = now_ns;
  }
  if (config_.hold_ns && now_ns - ask_since_ns_ < config_.hold_ns) return false;
  mixed_units_ = 0;
  Change(now_ns, proposal_, 0);
  return true;
}

void SplitAdvisor::Change(int64_t now_ns, int prefill_units, int direction) {
  prefill_units_ = prefill_units;
  last_direction_ = direction;
  last_change_ns_ = now_ns;
  ask_direction_ = 0;
  ++changes_;
}

}  // namespace flexnpu::placement
