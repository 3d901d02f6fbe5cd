// FlexNPU role split advisor: how many units of a disaggregated (prefill / decode) deployment
// should take new prompts now, the others taking decode handoffs.
//
// Why: the dynamic placer lends decode units to prefill steps, but a decode stream stays where
// its KV cache is, so decode capacity is fixed by the number of decode instances. With a fixed
// split, a prompt-heavy phase wants many prefill units and an output-heavy one many decode
// units; no single split serves both. The serving layer asks this advisor (the same code in
// production and in the simulator) and routes new prompts to the prefill instances of the
// first prefill_units() units and handoffs to the decode instances of the rest; an instance
// that leaves its role drains what it holds (no KV moves).
//
// Decision, once per tick_ns:
//   prompt rate R = EWMA (time constant average_ns) of the prompt tokens reported per second
//                   (the first tick starts it at its own measurement)
//   prefill need  = (R + queued prompt tokens / backlog_drain) / prefill_tokens_per_s
//                   (units at a full prefill batch; sized on arrivals alone, a backlog built
//                   at the overload edge would never drain; backlog_drain_ns 0: not counted)
//   decode need   = decode sequences held / decode_sequences_per_unit
//   prefill need / target_utilization + decode need <= units:
//       proposal = ceil(prefill need / target_utilization)  (decode gets the rest: more units
//                  cut TPOT)
//   else (overloaded): proposal = units * prefill need / (prefill need + decode need), rounded
//                  up while more than one unit's tick of prefill is queued (rounded to nearest
//                  it would sit at the arrival rate and the backlog would never drain), else
//                  to nearest
//   clamped to [1, units - 1].
//   applied (hysteresis, hold_ns): the proposal at once if it moves the way the last change
//       went (or is the first change), or moves more than deadband_units and the last change
//       is hold_ns old; otherwise (a reversal) once every proposal for hold_ns asked for a
//       move that way, the smallest of those moves. A rate hovering at a unit boundary then
//       does not flip the split every tick, while a trend (the EWMA walking to a new phase's
//       level unit by unit) and a large shift move it at once. hold_ns 0: always at once.
// backlog_drain_ns = 0 and hold_ns = 0: the plain rule (the need from arrivals only, every
// proposal applied at once).
// Pure and deterministic (clock injected as in Core); one owner: not thread-safe.
#ifndef FLEXNPU_PLACEMENT_SPLIT_H_
#define FLEXNPU_PLACEMENT_SPLIT_H_

#include <cstdint>

#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::placement {

struct SplitConfig {
  int units = 0;                          // >= 2
  double prefill_tokens_per_s = 0;        // one unit's prefill throughput at a full batch, > 0
  double decode_sequences_per_unit = 0;   // sequences one unit decodes within the TPOT SLO, > 0
  double target_utilization = 0.75;       // of the prefill units, in (0, 1]
  int64_t average_ns = 2'000'000'000;     // EWMA time constant of the prompt rate, > 0
  int64_t tick_ns = 1'000'000'000;        // decisions at most this often, > 0
  int initial_prefill_units = 0;          // until the first decision; 0: units / 2
  int64_t backlog_drain_ns = 2'000'000'000;  // queued prompts drained over this, >= 0 (0: off)
  int64_t hold_ns = 2'000'000'000;        // hysteresis hold of a reversal, >= 0 (0: off)
  int deadband_units = 1;                 // a reversal this large or smaller always waits, >= 0
};

class SplitAdvisor {
 public:
  // InvalidArgument naming the field for a config out of range.
  static StatusOr<SplitAdvisor> Create(const SplitConfig& config);

  // A new prompt of `tokens` arrived (InvalidArgument if negative).
  Status OnPrompt(int64_t tokens);
  // Decides if a tick has passed since the last decision (the first call starts the clock);
  // decode_sequences: sequences the decode instances hold (running + waiting);
  // queued_prompt_tokens: prompt tokens queued on the prefill instances, not yet computed.
  // *changed (may be null): whether prefill_units() changed. InvalidArgument for negative
  // counts or a clock that goes back (nothing changes then).
  Status Update(int64_t now_ns, int64_t decode_sequences, int64_t queued_prompt_tokens,
                bool* changed);

  // Whether Update at now_ns would decide (a tick has passed since the last decision, or the
  // clock has not started): lets the caller skip counting decode sequences in between.
  bool Due(int64_t now_ns) const { return !started_ || now_ns - last_ns_ >= config_.tick_ns; }

  int prefill_units() const { return prefill_units_; }
  int proposal() const { return proposal_; }  // the last decision's rule output (before hold)
  int units() const { return config_.units; }
  double prompt_tokens_per_s() const { return rate_; }
  uint64_t decisions() const { return decisions_; }  // ticks that decided
  uint64_t changes() const { return changes_; }      // decisions that moved the split

 private:
  explicit SplitAdvisor(const SplitConfig& config);
  int Propose(int64_t decode_sequences, int64_t queued_prompt_tokens) const;
  bool Apply(int64_t now_ns, int proposal);  // hysteresis; whether the split changed
  void Change(int64_t now_ns, int prefill_units, int direction);
  SplitConfig config_;
  int prefill_units_;
  int proposal_;
  double rate_ = 0;         // prompt tokens per second (EWMA)
  double pending_ = 0;      // tokens reported since the last decision
  int64_t last_ns_ = 0;
  bool started_ = false;    // the clock started (first Update)
  bool averaged_ = false;   // the EWMA has a first measurement
  uint64_t decisions_ = 0;
  uint64_t changes_ = 0;
  int last_direction_ = 0;  // of the last change: +1 more prefill, -1 fewer, 0 none yet
  int64_t last_change_ns_ = 0;
  int ask_direction_ = 0;   // of the reversals held back since ask_since_ns_, 0 none
  int64_t ask_since_ns_ = 0;
  int ask_least_ = 0;       // the smallest move they asked for
};

}  // namespace flexnpu::placement

#endif  // FLEXNPU_PLACEMENT_SPLIT_H_
