// FlexNPU role split advisor: which units of a prefill / decode deployment take new prompts
// (PREFILL), which take decode handoffs (DECODE), and which do both in one chunked batch
// (MIXED, co-located).
//
// Why: the dynamic placer lends decode units to prefill steps, but a decode stream stays where
// its KV cache is, so decode capacity is fixed by the number of decode instances. With a fixed
// split, a prompt-heavy phase wants many prefill units and an output-heavy one many decode
// units; no single split serves both. And a split wastes what one side leaves idle: once the
// two needs together fill the cluster, co-location (every unit prefilling in chunks beside its
// decodes) serves more than any split (measured: docs/results.md, "Ablation"). The serving
// layer asks this advisor (the same code in production and in the simulator) and orders the
// units PREFILL [0, prefill_units()), MIXED [prefill_units(), + mixed_units()), DECODE after.
//
// Decision, once per tick_ns:
//   prompt rate R = EWMA (time constant average_ns) of the prompt tokens reported per second
//                   (the first tick starts it at its own measurement)
//   prefill need  = (R + queued prompt tokens / backlog_drain) / prefill_tokens_per_s
//                   (units at a full prefill batch; sized on arrivals alone, a backlog built
//                   at the overload edge would never drain; backlog_drain_ns 0: not counted)
//   decode need   = decode sequences held / decode_sequences_per_unit
//   colocate_at_capacity and prefill need / target_utilization + decode need > units - 1
//   (less than a whole unit to spare): every unit MIXED.
//   else prefill need / target_utilization + decode need <= units:
//       proposal = ceil(prefill need / target_utilization)  (decode gets the rest: more units
//                  cut TPOT)
//   else (overloaded): proposal = units * prefill need / (prefill need + decode need), rounded
//                  up while more than one unit's tick of prefill is queued (rounded to nearest
//                  it would sit at the arrival rate and the backlog would never drain), else
//                  to nearest
//   clamped to [1, units - 1].
//   applied (hysteresis, hold_ns): the proposal at once if it moves the way the last change
//       went (or is the first change), or feeds a side whose need is above the units it has
//       now (prefill need > prefill units, or decode need > decode units), or moves more than
//       deadband_units and the last change is hold_ns old; otherwise (a reversal) once every
//       proposal for hold_ns asked for a move that way, the smallest of those moves. A rate
//       hovering at a unit boundary then does not flip the split every tick, while a trend
//       (the EWMA walking to a new phase's level unit by unit), a large shift and a side
//       over its capacity move it at once. Co-location is entered at once (the needs fill
//       the cluster) and left once every proposal for hold_ns was a split (the last one is
//       applied). hold_ns 0: always at once.
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
  bool colocate_at_capacity = false;      // every unit MIXED while the needs fill the cluster
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
  int mixed_units() const { return mixed_units_; }  // 0, or units() when co-located
  int decode_units() const { return config_.units - prefill_units_ - mixed_units_; }
  // The last decision's rule output (before the hysteresis): prefill units, 0 when it asked
  // for co-location.
  int proposal() const { return proposal_; }
  int units() const { return config_.units; }
  double prompt_tokens_per_s() const { return rate_; }
  uint64_t decisions() const { return decisions_; }  // ticks that decided
  uint64_t changes() const { return changes_; }      // decisions that moved the split

 private:
  explicit SplitAdvisor(const SplitConfig& config);
  // proposal_ (0: co-locate) from the needs, which it keeps for Apply.
  void Propose(int64_t decode_sequences, int64_t queued_prompt_tokens);
  bool Apply(int64_t now_ns);  // hysteresis; whether the split changed
  bool Leave(int64_t now_ns);  // co-location's exit, held
  void Change(int64_t now_ns, int prefill_units, int direction);
  SplitConfig config_;
  int prefill_units_;
  int mixed_units_ = 0;
  int proposal_;
  double prefill_need_ = 0;  // units, of the last decision
  double decode_need_ = 0;
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
                            // (kLeaveMixed: splits asked while co-located)
  int64_t ask_since_ns_ = 0;
  int ask_least_ = 0;       // the smallest move they asked for
};

}  // namespace flexnpu::placement

#endif  // FLEXNPU_PLACEMENT_SPLIT_H_
