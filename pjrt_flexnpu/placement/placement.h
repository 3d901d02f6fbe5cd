// FlexNPU placement core: which physical device runs each execution.
//
// Pure and deterministic: executable profiles, device models, input locations and an injected
// clock (nanoseconds, any epoch, supplied by the caller) go in; a placement comes out. No PJRT
// types, no wall clock, no randomness: the runtime feeds it real events (execution start and
// finish from PJRT events), a simulator can feed it simulated ones, and the same sequence of
// calls always yields the same decisions.
//
// Use (runtime side):
//   auto core = Core::Create(config);                      // once per client
//   Decision d; core->Place(request, &d);                  // on the dispatch path
//   ... move inputs to d.physical_device, execute there ...
//   core->OnStart(d.ticket, now);                          // optional: when it really started
//   core->OnFinish(d.ticket, now, ok);                     // required: completion (or error)
//   core->Cancel(d.ticket);                                // instead of OnFinish if never launched
//
// Policies (ParsePolicy, SetPolicy at run time; outstanding tickets stay valid):
//   passthrough      virtual v -> physical v mod P, always (baseline a). Errors are not avoided.
//   static-pd        fixed pools, e.g. "static-pd:prefill=0,1;decode=2,3" (also "|" or " "
//                    between pools and ranges "0-3"). Prefill-class executables run only in the
//                    prefill pool (earliest predicted finish there), decode-class only in the
//                    decode pool (stays where its inputs / KV cache are when that is in the pool,
//                    else earliest finish in the pool). Small executables stay with their inputs
//                    (they may run in either pool). Baseline b: static disaggregation.
//   static-colocate  every device runs both phases in FIFO arrival order: a prefill (a new
//                    request) goes to the device with the earliest predicted finish (admission
//                    load balancing); decode and small work stay with their inputs (home when the
//                    inputs live nowhere). Baseline c: static co-location.
//   dynamic          FlexNPU: the cost model below over all healthy devices, with decode
//                    affinity + hysteresis, prefill interference penalty and return-home.
//
// Cost model (dynamic; the static policies use the same finish prediction inside their pools):
//   For request r on candidate device d (all times in ns):
//     exec(r,d) = max(flops * ns_per_flop(d), bytes * ns_per_byte(d)) * k_exec(r) * k_dev(d)
//                 + launch(d)                                   roofline + online correction
//     mig(r,d)  = (bytes of r's located inputs not on d) / link_bytes_per_s(d)
//     ready(r)  = predicted finish of the placed executions producing r's inputs (Input::producer)
//     finish    = max(avail(d), now + mig, ready) + exec        FIFO device (can_overlap=false)
//   avail(d) is when d's queue drains: each placement appends its exec time; each finish event
//   shifts the queue by the prediction error (late: everything behind is late too), and an empty
//   queue drains "now". Migration is a copy over the link that overlaps the queue wait.
//   Online correction: on every successful finish the measured duration (finish - start, start
//   from OnStart or else max(placed, previous finish on that device)) is compared with the
//   predicted one; r = measured/predicted (clamped to [1/8, 8]) moves the executable's factor
//   k_exec by ewma_alpha*(r-1) (relative) and the device's factor k_dev by device_alpha*(r-1):
//   executables learn fast, a slow device is learnt slowly from all its work. The corrections
//   of at most max_executables executables are kept (an LRU: every compile of a new bucket or
//   program adds one; the least recently placed is forgotten and starts again from 1).
//
// Co-run model (can_overlap=true: the backend runs several executions on one device at once,
// e.g. CUDA streams): the outstanding work of a device is kept as two drain horizons, compute
// (sum of flop-times) and memory (sum of byte-times); compute and bandwidth overlap, so the
// device is busy until max(compute, memory) -- the roofline of the aggregate, not the sum. A
// newcomer with compute time c and memory time m beside k outstanding executions gets at least a
// fair 1/(k+1) share of each resource and finishes no later than all work on that resource:
//     finish = max(now + mig, ready) + max(min(c*(k+1), C + c), min(m*(k+1), M + m)) + launch
//   where C, M are the remaining compute / memory horizons. A decode (m >> c) beside a prefill
//   (C >> M) therefore finishes after ~M + m, not after the prefill: the two phases complement
//   each other. With can_overlap=false the model is the plain FIFO sum above (no co-run).
//
// Dynamic policy:
//   * Decode and small work have a current device: where most of their located input bytes are
//     (the KV cache), else their last device, else home (v mod P). They stay there (kAffinity)
//     unless another healthy device finishes earlier by more than the hysteresis margin
//       hysteresis_frac * exec(current) + hysteresis_ns + the move margin (see Moves).
//     Moving to an idle device is kIdleSteal ("moves decode off devices that a prefill burst has
//     taken"), to a busy one kLeastLoaded. A decode moving onto a device whose other decode
//     streams are active pays move_weight * (their decode weight / its own) * (its finish at
//     the current device - now): on a FIFO device the move only shifts its wait onto them (and
//     moves its KV cache twice), so with move_weight >= 1 streams of equal weight move to
//     devices without active streams (decode time against decode time: tpot_weight, which
//     prices decode delay in TTFT, does not enter). Nor does it move onto the home of another
//     virtual device with a prefill outstanding or placed within prefill_role_ns (a prefill
//     instance's device: its next prompts need it; escaping there swaps the two roles).
//   * Return home (kReturnHome): a virtual device whose decode runs away from home goes back when
//     it has stayed at least min_dwell_ns, home is healthy, has no prefill outstanding and its
//     queue drains within quiet_ns, and the move costs at most return_max_steps * exec. Together
//     with the margin this gives hysteresis: no A->B->A ping-pong.
//   * Moves: a placement away from the data device (a decode's current device, a prefill's
//     preferred one) moves the located inputs not on the target, and the work of that virtual
//     device follows them afterwards. The target must then finish earlier than staying by
//     more than the move margin: move_gain * mig(r,target) counted in full (the finish lets the
//     copy overlap the target's queue, where it would look free) + mig(r,target) again unless
//     the target is home (leaving home is a round trip, the way back costs about the way
//     there). A queue that holds the producer of an input is no reason to move (ready(r)):
//     the work could not start earlier elsewhere. So a step that carries its weights and KV
//     cache (hundreds of MB) does not move to save a few milliseconds, nor to escape its own
//     previous step; a KV cache of a few MB still escapes a prefill burst.
//   * Prefill (TTFT): earliest predicted finish over all healthy devices plus an interference
//     penalty for devices that serve decode: tpot_weight * (decode weight there / the
//     prefill's weight, if a decode is outstanding there or ended within decode_active_ns:
//     a stream stalled behind a prefill is waiting, not idle) * (time the prefill blocks
//     them: its exec on a FIFO device, its bandwidth share of it on an overlapping one).
//     The decode weight of a device is the sum over the decode streams with affinity there of
//     their last Request::weight (sequences in the batch; 1 each by default: then it counts
//     streams), plus that of active streams homed there but displaced elsewhere (a prefill on
//     their home keeps them away); the prefill's own weight is the sequences whose TTFT it
//     serves. So a prefill
//     of a few prompts does not stall a decode batch of a thousand sequences, while a full
//     prefill batch facing a small decode batch spills onto it. Prefill goes to idle
//     devices first and spills onto decode devices only when that is faster overall, so it is
//     never starved; decode does not queue behind long prefills where an alternative exists
//     (TPOT). With Tuning::tpot_slo_ns set, a decode device also keeps a stall budget: a
//     prefill may start in front of its active streams only while the budget (banked by their
//     steps' slack under the SLO, spent by earlier admitted prefills) covers the time it
//     blocks them; otherwise it waits for a prefill device (SLO-aware admission: the ratio
//     penalty alone lets a long prompt queue stall the same decode batch again and again).
//   * Errors: a device whose execution fails is quarantined for error_quarantine_ns, doubled per
//     consecutive error (up to 64x); a success resets the doubling. Quarantined devices are
//     skipped by every policy but passthrough (kAvoidFailed when the preferred device was
//     skipped); when every candidate is quarantined the preferred one is used anyway (kFallback).
//
// Threading: all methods are thread-safe. One short critical section per call (a mutex held for
// the O(P) scan); no allocation on the hot path once an executable has been seen and the ticket
// table has grown to the peak number of outstanding executions. Place is O(P + inputs).
// CountPassthrough and PassthroughFinished take no lock (relaxed atomics).
#ifndef FLEXNPU_PLACEMENT_PLACEMENT_H_
#define FLEXNPU_PLACEMENT_PLACEMENT_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "pjrt_flexnpu/base/phase.h"
#include "pjrt_flexnpu/base/status.h"

namespace flexnpu::placement {

// Same values as xla_passes::Phase (a static_cast converts; a switch is clearer).
using ::flexnpu::kNumPhases;
using ::flexnpu::Phase;
using ::flexnpu::PhaseName;

// Per executable, from xla_passes (ExecutableProfile.flops / bytes_accessed and the phase of
// its Classification on the physical device type).
struct Profile {
  Phase phase = Phase::kSmall;
  double flops = 0;
  double bytes = 0;
  // Device memory an execution needs (its outputs + temporaries); 0: unknown / none. Devices
  // whose reported free memory (UpdateTelemetry) is below it are skipped (not by passthrough).
  int64_t memory_bytes = 0;
};

// One physical device as the hardware layer (AscendCL / NVML) last read it, off the dispatch
// path. Negative: unknown.
struct DeviceTelemetry {
  int64_t memory_free_bytes = -1;
  // Busy fraction [0, 1] over the vendor's last sampling window, every process included.
  double utilization = -1;
};

// One physical device's roofline. Fill from xla_passes::DeviceSpec (peak_flops, mem_bandwidth,
// small_work_s as launch_s is a reasonable start) plus the link bandwidth to its peers.
struct DeviceModel {
  double peak_flops = 1e12;
  double bandwidth_bytes_per_s = 1e11;
  double link_bytes_per_s = 1e10;  // receiving end of an input migration
  bool can_overlap = false;        // the backend co-runs executions on this device
  double launch_s = 0;             // fixed cost per execution
};

// Where one argument lives now. kAnywhere: present everywhere (replicated, host), costs nothing.
inline constexpr int kAnywhere = -1;
struct Input {
  int physical_device = kAnywhere;
  int64_t bytes = 0;
  // Decision::ticket of the placed execution that produces it (an output of that one, not
  // finished yet); 0: ready. Nothing that reads it starts before that execution is predicted to
  // finish, wherever it runs: moving away from a queue that holds the producer gains nothing.
  uint64_t producer = 0;
};

struct Request {
  int virtual_device = 0;
  uint64_t executable_id = 0;     // stable per executable; keys the online correction
  const Profile* profile = nullptr;
  const Input* inputs = nullptr;
  size_t num_inputs = 0;
  int64_t now_ns = 0;
  // User streams (sequences in the batch) this execution serves; <= 0 or unset: 1, which is
  // what the runtime knows (one stream per virtual device). A serving engine that knows its
  // batch passes it: the interference penalties then weigh the sequences a prefill or a
  // moving decode delays against the sequences it serves (see "Dynamic policy").
  double weight = 0;
};

enum class Reason : uint8_t {
  kPassthrough = 0,  // passthrough policy: v mod P
  kAffinity,         // stayed with its inputs / KV cache / last device
  kLeastLoaded,      // earliest predicted finish (moved to, or chosen among, busy devices)
  kPool,             // static-pd: earliest finish inside the phase's pool
  kIdleSteal,        // decode/small moved off a busy device onto an idle one
  kReturnHome,       // went back home after the burst that displaced it passed
  kAvoidFailed,      // the preferred device is quarantined after errors, or short of memory
  kFallback,         // every candidate is quarantined: the preferred one anyway
};
inline constexpr int kNumReasons = 8;
const char* ReasonName(Reason reason);

struct Decision {
  int physical_device = -1;
  Reason reason = Reason::kPassthrough;
  int64_t predicted_start_ns = 0;
  int64_t predicted_finish_ns = 0;
  int64_t migrate_bytes = 0;  // located input bytes that are not on physical_device
  uint64_t ticket = 0;        // for OnStart / OnFinish / Cancel; never 0
};

enum class PolicyKind : uint8_t { kPassthrough, kStaticPd, kStaticColocate, kDynamic };
const char* PolicyKindName(PolicyKind kind);

struct PolicySpec {
  PolicyKind kind = PolicyKind::kPassthrough;
  std::vector<int> prefill_pool;  // static-pd only
  std::vector<int> decode_pool;   // static-pd only
  // Canonical text: "dynamic", "static-pd:prefill=0,1;decode=2,3", ...
  std::string ToString() const;
};

// "passthrough" | "static-colocate" | "dynamic" | "static-pd:prefill=LIST;decode=LIST" where
// LIST is comma-separated devices or ranges ("0,1", "0-3,6"); pools may be separated by ';',
// '|' or spaces (';' cannot appear inside a JAX create-options string). Names are case- and
// '_'/'-'-insensitive. Errors (InvalidArgument) name the problem: unknown policy, parameters on
// a policy that takes none, unknown pool key, malformed or out-of-range device, duplicates,
// overlapping or missing pools.
StatusOr<PolicySpec> ParsePolicy(std::string_view spec, int num_physical);
// One pool list ("0,1", "2-3"): for separate prefill_pool / decode_pool options. `what` names
// the option in error messages.
StatusOr<std::vector<int>> ParsePool(std::string_view list, int num_physical,
                                     std::string_view what);
// Checks a spec against a device count (pools present, in range, disjoint).
Status ValidatePolicy(const PolicySpec& spec, int num_physical);

struct Tuning {
  double hysteresis_frac = 0.5;      // of exec(current): gain needed to move decode/small work
  int64_t hysteresis_ns = 20'000;
  int64_t min_dwell_ns = 20'000'000; // before a displaced decode may return home
  int64_t quiet_ns = 0;              // home counts as quiet when it drains within this (0: exec)
  double return_max_steps = 4.0;     // return home only if it costs <= this many exec times
  double tpot_weight = 1.0;          // prefill penalty per decode sequence it would block,
                                     // per sequence it serves (Request::weight; default 1 each)
  int64_t decode_active_ns = 100'000'000;
  double move_gain = 1.0;            // dynamic moves located inputs only to finish earlier than
                                     // staying by more than move_gain times their transfer time
                                     // (plus the way back when leaving home): see "Moves"
  double move_weight = 1.0;          // a decode moving onto a device with other active decode
                                     // streams pays move_weight * (their weight / its own) *
                                     // the time it escapes (1: it never moves onto streams of
                                     // equal weight; 0: free)
  int64_t prefill_role_ns = 100'000'000;  // a decode does not move onto the home of another
                                     // virtual device with a prefill outstanding or placed
                                     // within this window (unless it must leave; 0: it may)
  // SLO-aware admission (dynamic): a prefill starts in front of a device's active decode
  // streams only if their stall budget covers the time it blocks them. Each decode step banks
  // tpot_slo_ns minus the time its token took (predicted finish - max(placement, the stream's
  // previous finish): waits behind prefills and other streams included), shared by the k
  // streams there, within +-stall_bank_steps * tpot_slo_ns; prefills admitted since are
  // reserved against it until the streams' next steps see them. 0: off (the tpot_weight
  // penalty alone decides).
  int64_t tpot_slo_ns = 0;
  double stall_bank_steps = 4.0;
  int64_t max_executables = 4096;    // executables whose correction is kept (least recently
                                     // placed ones are forgotten beyond; >= 1)
  double ewma_alpha = 0.25;          // executable correction
  double device_alpha = 0.02;        // device correction
  int64_t error_quarantine_ns = 1'000'000'000;
};

struct Config {
  std::string policy = "passthrough";  // ParsePolicy syntax
  std::vector<DeviceModel> devices;    // one per physical device; P = devices.size() >= 1
  int num_virtual_devices = 0;         // 0: one per physical device
  Tuning tuning;
};

struct DeviceStats {
  int queue_length = 0;           // outstanding (placed, not finished) executions
  int prefill_outstanding = 0;
  int64_t busy_ns = 0;            // union of measured execution intervals
  double busy_fraction = 0;       // busy_ns / (now - creation)
  int64_t predicted_drain_ns = 0; // predicted remaining queue time at `now`
  uint64_t executions[kNumPhases] = {};   // placed here, by phase
  uint64_t decisions[kNumReasons] = {};   // placed here, by reason
  uint64_t errors = 0;
  int64_t bytes_migrated_in = 0;  // input bytes moved here by placements
  int64_t bytes_migrated_in_by_reason[kNumReasons] = {};  // ... by the placement's reason
  bool quarantined = false;
  double speed_factor = 1;        // k_dev: measured / modeled time
  int decode_streams = 0;         // virtual devices whose decode lives here
  double decode_weight = 0;       // their sequences: sum of each stream's last decode weight
  // Telemetry (UpdateTelemetry); -1: none received.
  int64_t memory_free_bytes = -1;     // as reported, minus what was placed here since
  double utilization = -1;            // as reported
  double external_utilization = 0;    // the part not explained by FlexNPU's own executions
  uint64_t memory_skips = 0;          // placements that passed over this device for memory
};

struct VirtualStats {
  int home = 0;
  int current = -1;               // device of its last execution
  int queue_length = 0;
  int64_t busy_ns = 0;            // sum of measured execution times
  double busy_fraction = 0;
  uint64_t executions[kNumPhases] = {};
  uint64_t decisions[kNumReasons] = {};
  int64_t bytes_migrated = 0;
};

struct Stats {
  std::string policy;  // PolicySpec::ToString()
  std::vector<int> prefill_pool, decode_pool;
  int64_t now_ns = 0;
  int64_t elapsed_ns = 0;
  uint64_t decisions = 0;
  uint64_t policy_switches = 0;
  uint64_t executables = 0;  // executables with a learnt correction (<= max_executables)
  std::vector<DeviceStats> physical;
  std::vector<VirtualStats> virtual_devices;
  std::string ToJson() const;  // one JSON object, keys as the fields above
};

struct CoreState;  // Core's state and cost model: core_state.h, private to placement/

class Core {
 public:
  static StatusOr<std::unique_ptr<Core>> Create(const Config& config);
  ~Core();
  Core(const Core&) = delete;
  Core& operator=(const Core&) = delete;

  // Chooses the physical device. InvalidArgument for a bad request (virtual device out of
  // range, no profile, an input on a device that does not exist); *out is untouched then.
  Status Place(const Request& request, Decision* out);
  // Records an execution on a device the caller chose, as Place records its own choice (the
  // device's queue, memory and stats; a ticket for OnStart / OnFinish / Cancel; reason
  // kAffinity): for an SPMD program the runtime maps the group of virtual devices onto distinct
  // physical ones and records one execution per shard, so single-device placements see the
  // load. InvalidArgument for a bad request or a device out of range; *out is untouched then.
  Status PlaceOn(const Request& request, int physical_device, Decision* out);
  // The execution began (optional; improves the measured durations and the queue estimate).
  Status OnStart(uint64_t ticket, int64_t now_ns);
  // The execution completed; ok=false counts an error against the device (quarantine).
  Status OnFinish(uint64_t ticket, int64_t now_ns, bool ok);
  // The placed execution was never launched: forget it without measuring anything.
  Status Cancel(uint64_t ticket);
  // The executable is gone (unloaded): drop its learnt correction. Outstanding tickets of it
  // stay valid (their finish then corrects only the device). NotFound if it is not tracked.
  Status ForgetExecutable(uint64_t executable_id);
  // Telemetry of physical `device` read at `now_ns` (see DeviceTelemetry). Memory: every
  // policy but passthrough skips a device whose free memory, less the memory_bytes of what was
  // placed there since this reading, is below the request's memory_bytes (all short: the
  // preferred device anyway, kFallback). External load: external = utilization - FlexNPU's own
  // busy fraction on the device since the previous reading, clamped to [0, 0.9]; the device's
  // predicted execution times are divided by (1 - external), as it gets that share of it.
  // InvalidArgument for a device out of range or a utilization above 1.
  Status UpdateTelemetry(int device, const DeviceTelemetry& telemetry, int64_t now_ns);

  // Executions run under passthrough without Place: the runtime's fast path maps virtual v to
  // physical v mod P (an SPMD shard: to its group mapping's device) by itself and tells the core
  // only this, so that Snapshot shows them (executions by phase, kPassthrough decisions) like
  // placed ones. Lock-free, no allocation (relaxed atomics per device); devices out of range are
  // ignored.
  void CountPassthrough(int virtual_device, int physical_device, Phase phase);
  // ... and, where the runtime sees one complete, its time on the device: busy time as OnFinish
  // counts it (the union of the [start, finish] intervals on the physical device; the sum on the
  // virtual one). Lock-free; no effect on placement.
  void PassthroughFinished(int virtual_device, int physical_device, int64_t start_ns,
                           int64_t finish_ns);

  Status SetPolicy(std::string_view spec);
  Status SetPolicy(const PolicySpec& spec);
  PolicySpec policy() const;

  int num_physical() const;
  int num_virtual() const;
  Stats Snapshot(int64_t now_ns) const;

 private:
  explicit Core(std::unique_ptr<CoreState> state);
  // Place (given_device < 0: the policy chooses) and PlaceOn.
  Status PlaceImpl(const Request& request, int given_device, Decision* out);
  std::unique_ptr<CoreState> s_;
};

}  // namespace flexnpu::placement

#endif  // FLEXNPU_PLACEMENT_PLACEMENT_H_
