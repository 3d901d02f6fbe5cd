// The placement core: device state, the cost model and the policies (see placement.h).
#include <algorithm>
#include <cmath>
#include <iterator>
#include <list>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement {
namespace {

constexpr double kUnhealthy = 1e30;  // added to the cost of a quarantined device
constexpr double kMaxExternal = 0.9;  // external load share at most (times at most 10x)
// Added to a decode move's cost on a device serving another instance's prefills (its role),
// and to a prefill's on a device whose decode streams' stall budget it exceeds; below
// kUnhealthy, so work that has nowhere else to go may still go there.
constexpr double kOtherRole = 1e20;

struct TicketRecord {
  uint32_t generation = 0;
  bool live = false;
  int device = -1;
  int virtual_device = -1;
  Phase phase = Phase::kSmall;
  uint64_t executable_id = 0;     // keys the correction (it may be forgotten meanwhile)
  int64_t placed_ns = 0;
  int64_t start_ns = -1;          // from OnStart
  double mig_ns = 0;
  double pred_start = 0;          // as predicted at placement (before later shifts)
  double pred_finish = 0;
  double shift_at_place = 0;      // device shift when placed
  double c_ns = 0, m_ns = 0;      // compute / memory time (co-run horizons)
  double factor_at_place = 1;     // k_exec * k_dev * external slowdown the prediction used
  int64_t memory_bytes = 0;       // counted against the device's free memory
  uint32_t memory_epoch = 0;      // the device's telemetry reading it was counted against
};

}  // namespace

// Executable corrections, least recently placed last; bounded (Tuning::max_executables). Nodes
// are recycled on eviction, so a full table allocates only for the map's new key.
class ExecFactors {
 public:
  explicit ExecFactors(size_t capacity) : capacity_(std::max<size_t>(1, capacity)) {
    index_.reserve(std::min<size_t>(capacity_, 1024));
  }
  // The correction of `id`, created at 1 (evicting the least recent one when full).
  double* Touch(uint64_t id) {
    auto it = index_.find(id);
    if (it != index_.end()) {
      order_.splice(order_.begin(), order_, it->second);
      return &it->second->factor;
    }
    if (index_.size() >= capacity_) {
      auto last = std::prev(order_.end());
      index_.erase(last->id);
      order_.splice(order_.begin(), order_, last);
    } else {
      order_.emplace_front();
    }
    Entry& e = order_.front();
    e.id = id;
    e.factor = 1.0;
    index_.emplace(id, order_.begin());
    return &e.factor;
  }
  double* Find(uint64_t id) {
    auto it = index_.find(id);
    return it == index_.end() ? nullptr : &it->second->factor;
  }
  bool Forget(uint64_t id) {
    auto it = index_.find(id);
    if (it == index_.end()) return false;
    order_.erase(it->second);
    index_.erase(it);
    return true;
  }
  size_t size() const { return index_.size(); }

 private:
  struct Entry {
    uint64_t id = 0;
    double factor = 1.0;
  };
  size_t capacity_;
  std::list<Entry> order_;
  std::unordered_map<uint64_t, std::list<Entry>::iterator> index_;
};

struct Core::State {
  std::mutex mu;
  Tuning tuning;
  PolicySpec policy;
  int P = 0;
  int V = 0;
  int64_t created_ns = 0;
  bool have_created = false;
  uint64_t decisions = 0;
  uint64_t policy_switches = 0;

  // Devices (structure of arrays for the O(P) scan).
  std::vector<double> ns_per_flop, ns_per_byte;  // 1e9/peak, 1e9/bw, times k_dev
  std::vector<double> base_ns_per_flop, base_ns_per_byte;
  std::vector<double> ns_per_link_byte, launch_ns, k_dev;
  std::vector<char> overlap;
  std::vector<char> role;                        // static-pd: 1 prefill pool, 2 decode pool
  std::vector<double> avail, avail_c, avail_m;   // absolute drain times (ns)
  std::vector<double> shift;                     // accumulated corrections of the queue
  std::vector<int> outstanding, prefill_outstanding;
  std::vector<int64_t> quarantine_until;
  std::vector<int> consecutive_errors;
  std::vector<int64_t> last_decode_ns;
  std::vector<int> decode_streams;
  std::vector<double> decode_weight;             // sum of stream_weight of the streams there
  std::vector<int64_t> last_finish, busy_end;
  std::vector<DeviceStats> dstats;
  std::vector<double> on;    // scratch: located input bytes per device (zero between calls)
  std::vector<double> cost;  // scratch: ScanAll's per-device cost
  std::vector<int> overlap_devices;
  int64_t max_quarantine_until = INT64_MIN;
  double move_penalty_ns = 0;  // ScanAll: per active decode stream on a device (decode moves)
  int move_except = -1;        // ... except on the moving stream's current device
  int move_home = -1;          // ScanAll: a moving decode's home (>= 0: avoid prefill homes)
  std::vector<int64_t> prefill_home_ns;  // last prefill placed by a virtual device homed here
  std::vector<int> prefill_home_outstanding;  // ... and its prefills not finished yet
  std::vector<double> stall_bank;     // SLO-aware admission: decode stall budget (ns) ...
  std::vector<double> stall_pending;  // ... and the blocking time of prefills admitted since
  std::vector<double> away_weight;    // scratch: ComputeAwayWeight (zero outside a prefill)
  double request_weight = 1;   // scratch: Request::weight of the request being placed

  // Telemetry (UpdateTelemetry).
  std::vector<int64_t> mem_free;      // reported free bytes; -1: unknown
  std::vector<int64_t> mem_pending;   // memory_bytes placed on the device since that reading
  std::vector<uint32_t> mem_epoch;    // readings so far
  std::vector<double> ext_slow;       // 1 / (1 - external utilisation)
  std::vector<int64_t> telemetry_ns;  // time of the last reading; INT64_MIN: none
  std::vector<int64_t> own_busy_at_reading;
  std::vector<int64_t> inflight_since;  // FlexNPU work outstanding since (when outstanding > 0)
  bool any_memory_known = false;
  int64_t need = 0;  // scratch: memory_bytes of the request being placed (0 outside Place)

  // Too little free memory for the request being placed.
  bool Short(int d) const {
    return need > 0 && mem_free[d] >= 0 && mem_free[d] - mem_pending[d] < need;
  }
  int64_t OwnBusyNs(int d, int64_t now) const {
    const int64_t running =
        outstanding[d] > 0 ? std::max<int64_t>(0, now - std::max(inflight_since[d], busy_end[d]))
                           : 0;
    return dstats[d].busy_ns + running;
  }

  // Virtual devices.
  std::vector<int> home, current, stream_device;
  std::vector<double> stream_weight;  // weight of the virtual device's last decode
  std::vector<int64_t> stream_last_ns;  // predicted end of the virtual device's last decode
  std::vector<double> stream_finish;    // predicted finish of its last decode (ns)
  std::vector<int64_t> moved_ns;
  std::vector<VirtualStats> vstats;

  std::unique_ptr<ExecFactors> exec_factor;
  std::vector<TicketRecord> tickets;
  std::vector<uint32_t> free_slots;

  bool Healthy(int d, int64_t now) const { return now >= quarantine_until[d] && !Short(d); }

  // Predicted finish of work (c0 flop-units, m0 byte-units, mig_bytes) on d at `now`.
  double Finish(int d, double now, double c0, double m0, double mig_bytes, double* start,
                double* c_out, double* m_out) const {
    const double mig = mig_bytes * ns_per_link_byte[d];
    const double c = c0 * ns_per_flop[d];
    const double m = m0 * ns_per_byte[d];
    *c_out = c;
    *m_out = m;
    if (!overlap[d]) {
      *start = std::max(avail[d], now + mig);
      return *start + std::max(c, m) + launch_ns[d];
    }
    const double k1 = outstanding[d] + 1.0;
    const double C = std::max(0.0, avail_c[d] - now);
    const double M = std::max(0.0, avail_m[d] - now);
    *start = now + mig;
    return *start + std::max(std::min(c * k1, C + c), std::min(m * k1, M + m)) + launch_ns[d];
  }

  // The O(P) scan: the candidate with the lowest predicted finish (+ prefill interference
  // penalty), quarantined devices last. Ties: first candidate. Returns its cost in *best_cost.
  int Scan(const int* cands, int n, int64_t now_i, double c0, double m0, double located,
           double penalty, double* best_cost) {
    if (cands == nullptr) return ScanAll(now_i, c0, m0, located, penalty, best_cost);
    int best = -1;
    double best_v = 0;
    for (int i = 0; i < n; ++i) {
      const int d = cands[i];
      const double fin = Cost(d, now_i, c0, m0, located, penalty);
      if (best < 0 || fin < best_v) {
        best = d;
        best_v = fin;
      }
    }
    *best_cost = best_v;
    return best;
  }

  // Interference of work (c, m) placed on d with the decode streams active there: the
  // sequences it delays per sequence it serves, times `weight` (1 for prefill, 0: none).
  double Penalty(int d, int64_t now_i, double c, double m, double weight) const {
    const bool active = DecodeActive(d, now_i);
    const double w = (active ? decode_weight[d] : 0) + away_weight[d];
    if (w == 0) return 0;
    const double block = overlap[d] ? m : std::max(c, m);
    // SLO-aware admission: beyond the streams' stall budget only if nothing else is left.
    if (active && tuning.tpot_slo_ns > 0 && block > stall_bank[d] - stall_pending[d]) {
      return kOtherRole;
    }
    return weight * tuning.tpot_weight * (w / request_weight) * block;
  }

  bool DecodeActive(int d, int64_t now_i) const {
    return decode_streams[d] != 0 && last_decode_ns[d] > now_i - tuning.decode_active_ns;
  }

  // away_weight: the active decode streams homed at each device but running elsewhere (a
  // prefill placed on their home keeps them from coming back: it pays as if they were there;
  // otherwise a displaced stream's empty home draws prefills, which keep it displaced).
  void ComputeAwayWeight(int64_t now_i) {
    std::fill(away_weight.begin(), away_weight.end(), 0.0);
    for (int v = 0; v < V; ++v) {
      const int at = stream_device[v];
      if (at >= 0 && at != home[v] && stream_last_ns[v] > now_i - tuning.decode_active_ns) {
        away_weight[home[v]] += stream_weight[v];
      }
    }
  }

  double Cost(int d, int64_t now_i, double c0, double m0, double located, double penalty) const {
    double start, c, m;
    double fin = Finish(d, static_cast<double>(now_i), c0, m0, located - on[d], &start, &c, &m);
    if (penalty > 0) fin += Penalty(d, now_i, c, m, penalty);
    if (now_i < quarantine_until[d] || Short(d)) fin += kUnhealthy;
    return fin;
  }

  // All devices: one branch-free (vectorizable) pass for the FIFO model into cost[], fix-ups
  // for the few overlapping / decode-hosting / quarantined devices, then the argmin.
  int ScanAll(int64_t now_i, double c0, double m0, double located, double penalty,
              double* best_cost) {
    const double now = static_cast<double>(now_i);
    const int n = P;
    double* __restrict out = cost.data();
    const double* __restrict av = avail.data();
    const double* __restrict o = on.data();
    const double* __restrict pl = ns_per_link_byte.data();
    const double* __restrict pf = ns_per_flop.data();
    const double* __restrict pb = ns_per_byte.data();
    const double* __restrict la = launch_ns.data();
    for (int d = 0; d < n; ++d) {
      const double ready = now + (located - o[d]) * pl[d];
      const double c = c0 * pf[d];
      const double m = m0 * pb[d];
      out[d] = (av[d] > ready ? av[d] : ready) + (c > m ? c : m) + la[d];
    }
    for (int d : overlap_devices) out[d] = Cost(d, now_i, c0, m0, located, 0);
    if (penalty > 0) {
      for (int d = 0; d < n; ++d) {
        if (decode_streams[d] != 0 || away_weight[d] != 0) {
          out[d] += Penalty(d, now_i, c0 * pf[d], m0 * pb[d], penalty);
        }
      }
    }
    if (move_penalty_ns > 0) {
      for (int d = 0; d < n; ++d) {
        if (d != move_except && decode_streams[d] != 0 &&
            last_decode_ns[d] > now_i - tuning.decode_active_ns) {
          out[d] += move_penalty_ns * decode_weight[d];
        }
      }
    }
    if (move_home >= 0 && tuning.prefill_role_ns > 0) {
      const int64_t since = now_i - tuning.prefill_role_ns;
      for (int d = 0; d < n; ++d) {
        if (d != move_except && d != move_home &&
            (prefill_home_ns[d] > since || prefill_home_outstanding[d] > 0)) {
          out[d] += kOtherRole;
        }
      }
    }
    if (now_i < max_quarantine_until) {
      for (int d = 0; d < n; ++d) {
        if (now_i < quarantine_until[d]) out[d] += kUnhealthy;
      }
    }
    if (need > 0 && any_memory_known) {
      for (int d = 0; d < n; ++d) {
        if (Short(d)) out[d] += kUnhealthy;
      }
    }
    int best = 0;
    double best_v = out[0];
    for (int d = 1; d < n; ++d) {
      if (out[d] < best_v) {
        best_v = out[d];
        best = d;
      }
    }
    *best_cost = best_v;
    return best;
  }

  double CostOf(int d, int64_t now, double c0, double m0, double located) const {
    return Cost(d, now, c0, m0, located, 0);
  }
};

Core::Core(std::unique_ptr<State> state) : s_(std::move(state)) {}
Core::~Core() = default;

namespace {

bool Finite(double x) { return std::isfinite(x); }

Status CheckDevice(const DeviceModel& m, size_t i) {
  const std::string where = "placement: physical device " + std::to_string(i) + ": ";
  if (!(Finite(m.peak_flops) && m.peak_flops > 0)) {
    return InvalidArgument(where + "peak_flops must be a positive number");
  }
  if (!(Finite(m.bandwidth_bytes_per_s) && m.bandwidth_bytes_per_s > 0)) {
    return InvalidArgument(where + "bandwidth_bytes_per_s must be a positive number");
  }
  if (!(Finite(m.link_bytes_per_s) && m.link_bytes_per_s > 0)) {
    return InvalidArgument(where + "link_bytes_per_s must be a positive number");
  }
  if (!(Finite(m.launch_s) && m.launch_s >= 0)) {
    return InvalidArgument(where + "launch_s must be >= 0");
  }
  return Status::Ok();
}

Status CheckTuning(const Tuning& t) {
  auto bad = [](const char* what) {
    return InvalidArgument(std::string("placement tuning: ") + what);
  };
  if (!(t.hysteresis_frac >= 0 && Finite(t.hysteresis_frac))) return bad("hysteresis_frac < 0");
  if (t.hysteresis_ns < 0 || t.min_dwell_ns < 0 || t.quiet_ns < 0 || t.decode_active_ns < 0 ||
      t.error_quarantine_ns < 0 || t.prefill_role_ns < 0) {
    return bad("durations must be >= 0");
  }
  if (!(t.return_max_steps >= 0 && Finite(t.return_max_steps))) return bad("return_max_steps < 0");
  if (!(t.tpot_weight >= 0 && Finite(t.tpot_weight))) return bad("tpot_weight < 0");
  if (t.max_executables < 1) return bad("max_executables < 1");
  if (!(t.move_weight >= 0 && Finite(t.move_weight))) return bad("move_weight < 0");
  if (t.tpot_slo_ns < 0) return bad("tpot_slo_ns < 0");
  if (!(t.stall_bank_steps >= 0 && Finite(t.stall_bank_steps))) {
    return bad("stall_bank_steps < 0");
  }
  if (!(t.ewma_alpha >= 0 && t.ewma_alpha <= 1)) return bad("ewma_alpha outside [0, 1]");
  if (!(t.device_alpha >= 0 && t.device_alpha <= 1)) return bad("device_alpha outside [0, 1]");
  return Status::Ok();
}

}  // namespace

StatusOr<std::unique_ptr<Core>> Core::Create(const Config& config) {
  const int P = static_cast<int>(config.devices.size());
  if (P <= 0) return FailedPrecondition("placement needs at least one physical device model");
  for (size_t i = 0; i < config.devices.size(); ++i) {
    FLEXNPU_RETURN_IF_ERROR(CheckDevice(config.devices[i], i));
  }
  FLEXNPU_RETURN_IF_ERROR(CheckTuning(config.tuning));
  if (config.num_virtual_devices < 0) {
    return InvalidArgument("placement: num_virtual_devices must be >= 0");
  }
  auto policy = ParsePolicy(config.policy, P);
  if (!policy.ok()) return policy.status();

  auto s = std::make_unique<State>();
  s->tuning = config.tuning;
  s->P = P;
  s->V = config.num_virtual_devices > 0 ? config.num_virtual_devices : P;
  s->ns_per_flop.resize(P);
  s->ns_per_byte.resize(P);
  s->base_ns_per_flop.resize(P);
  s->base_ns_per_byte.resize(P);
  s->ns_per_link_byte.resize(P);
  s->launch_ns.resize(P);
  s->k_dev.assign(P, 1.0);
  s->overlap.resize(P);
  for (int d = 0; d < P; ++d) {
    const DeviceModel& m = config.devices[d];
    s->base_ns_per_flop[d] = s->ns_per_flop[d] = 1e9 / m.peak_flops;
    s->base_ns_per_byte[d] = s->ns_per_byte[d] = 1e9 / m.bandwidth_bytes_per_s;
    s->ns_per_link_byte[d] = 1e9 / m.link_bytes_per_s;
    s->launch_ns[d] = m.launch_s * 1e9;
    s->overlap[d] = m.can_overlap ? 1 : 0;
    if (m.can_overlap) s->overlap_devices.push_back(d);
  }
  s->role.assign(P, 0);
  s->avail.assign(P, 0);
  s->avail_c.assign(P, 0);
  s->avail_m.assign(P, 0);
  s->shift.assign(P, 0);
  s->outstanding.assign(P, 0);
  s->prefill_outstanding.assign(P, 0);
  s->quarantine_until.assign(P, INT64_MIN);
  s->consecutive_errors.assign(P, 0);
  s->last_decode_ns.assign(P, INT64_MIN);
  s->decode_streams.assign(P, 0);
  s->decode_weight.assign(P, 0);
  s->prefill_home_ns.assign(P, INT64_MIN);
  s->prefill_home_outstanding.assign(P, 0);
  s->away_weight.assign(P, 0);
  s->stall_bank.assign(P, 0);
  s->stall_pending.assign(P, 0);
  s->last_finish.assign(P, INT64_MIN);
  s->busy_end.assign(P, INT64_MIN);
  s->dstats.assign(P, DeviceStats{});
  s->mem_free.assign(P, -1);
  s->mem_pending.assign(P, 0);
  s->mem_epoch.assign(P, 0);
  s->ext_slow.assign(P, 1.0);
  s->telemetry_ns.assign(P, INT64_MIN);
  s->own_busy_at_reading.assign(P, 0);
  s->inflight_since.assign(P, 0);
  s->on.assign(P, 0);
  s->cost.assign(P, 0);
  s->home.resize(s->V);
  for (int v = 0; v < s->V; ++v) s->home[v] = v % P;
  s->current.assign(s->V, -1);
  s->stream_device.assign(s->V, -1);
  s->stream_weight.assign(s->V, 0);
  s->stream_last_ns.assign(s->V, INT64_MIN);
  s->stream_finish.assign(s->V, 0);
  s->moved_ns.assign(s->V, INT64_MIN / 2);
  s->vstats.assign(s->V, VirtualStats{});
  s->exec_factor =
      std::make_unique<ExecFactors>(static_cast<size_t>(config.tuning.max_executables));
  s->tickets.reserve(256);
  s->free_slots.reserve(256);
  std::unique_ptr<Core> core(new Core(std::move(s)));
  FLEXNPU_RETURN_IF_ERROR(core->SetPolicy(*policy));
  core->s_->policy_switches = 0;
  return core;
}

int Core::num_physical() const { return s_->P; }
int Core::num_virtual() const { return s_->V; }

Status Core::SetPolicy(std::string_view spec) {
  auto parsed = ParsePolicy(spec, s_->P);
  if (!parsed.ok()) return parsed.status();
  return SetPolicy(*parsed);
}

Status Core::SetPolicy(const PolicySpec& spec) {
  FLEXNPU_RETURN_IF_ERROR(ValidatePolicy(spec, s_->P));
  std::lock_guard<std::mutex> lock(s_->mu);
  State& s = *s_;
  s.policy = spec;
  std::fill(s.role.begin(), s.role.end(), 0);
  for (int d : spec.prefill_pool) s.role[d] |= 1;
  for (int d : spec.decode_pool) s.role[d] |= 2;
  ++s.policy_switches;
  return Status::Ok();
}

PolicySpec Core::policy() const {
  std::lock_guard<std::mutex> lock(s_->mu);
  return s_->policy;
}

Status Core::Place(const Request& r, Decision* out) { return PlaceImpl(r, -1, out); }

Status Core::PlaceOn(const Request& r, int physical_device, Decision* out) {
  if (physical_device < 0 || physical_device >= s_->P) {
    return InvalidArgument("placement: PlaceOn physical device " +
                           std::to_string(physical_device) + " does not exist (" +
                           std::to_string(s_->P) + " physical devices)");
  }
  return PlaceImpl(r, physical_device, out);
}

Status Core::PlaceImpl(const Request& r, int given_device, Decision* out) {
  State& s = *s_;
  if (r.virtual_device < 0 || r.virtual_device >= s.V) {
    return InvalidArgument("placement: virtual device " + std::to_string(r.virtual_device) +
                           " does not exist (" + std::to_string(s.V) + " virtual devices)");
  }
  if (r.profile == nullptr) return InvalidArgument("placement: request without a profile");
  if (!std::isfinite(r.weight)) {
    return InvalidArgument("placement: request weight must be a finite number of sequences, got " +
                           std::to_string(r.weight));
  }
  if (r.num_inputs > 0 && r.inputs == nullptr) {
    return InvalidArgument("placement: num_inputs > 0 but no inputs");
  }
  for (size_t i = 0; i < r.num_inputs; ++i) {
    const int d = r.inputs[i].physical_device;
    if (d != kAnywhere && (d < 0 || d >= s.P)) {
      return InvalidArgument("placement: input " + std::to_string(i) + " is on physical device " +
                             std::to_string(d) + ", which does not exist (" +
                             std::to_string(s.P) + " physical devices)");
    }
    if (r.inputs[i].bytes < 0) {
      return InvalidArgument("placement: input " + std::to_string(i) + " has negative bytes");
    }
  }

  std::lock_guard<std::mutex> lock(s.mu);
  const int64_t now = r.now_ns;
  if (!s.have_created) {
    s.created_ns = now;
    s.have_created = true;
  }
  const int v = r.virtual_device;
  const Phase phase = r.profile->phase;
  s.request_weight = r.weight > 0 ? r.weight : 1.0;
  const double* kexec = s.exec_factor->Touch(r.executable_id);
  const double c0 = std::max(0.0, r.profile->flops) * *kexec;
  const double m0 = std::max(0.0, r.profile->bytes) * *kexec;

  // Where the located inputs are; the data device holds most of them (ties: lowest id).
  int64_t located = 0;
  int data_dev = -1;
  for (size_t i = 0; i < r.num_inputs; ++i) {
    const Input& in = r.inputs[i];
    if (in.physical_device == kAnywhere || in.bytes == 0) continue;
    s.on[in.physical_device] += static_cast<double>(in.bytes);
    located += in.bytes;
  }
  for (size_t i = 0; i < r.num_inputs; ++i) {
    const int d = r.inputs[i].physical_device;
    if (d == kAnywhere || r.inputs[i].bytes == 0) continue;
    if (data_dev < 0 || s.on[d] > s.on[data_dev] || (s.on[d] == s.on[data_dev] && d < data_dev)) {
      data_dev = d;
    }
  }
  const double loc = static_cast<double>(located);
  const int home = s.home[v];
  const int preferred = data_dev >= 0 ? data_dev : (s.current[v] >= 0 ? s.current[v] : home);
  s.need = s.policy.kind == PolicyKind::kPassthrough || given_device >= 0
               ? 0
               : std::max<int64_t>(0, r.profile->memory_bytes);
  if (s.need > 0 && s.any_memory_known) {
    for (int d = 0; d < s.P; ++d) {
      if (s.Short(d)) ++s.dstats[d].memory_skips;
    }
  }

  int chosen = -1;
  Reason reason = Reason::kPassthrough;
  double best_cost = 0;
  if (given_device >= 0) {
    chosen = given_device;
    reason = Reason::kAffinity;
  } else switch (s.policy.kind) {
    case PolicyKind::kPassthrough:
      chosen = v % s.P;
      reason = Reason::kPassthrough;
      break;
    case PolicyKind::kStaticPd: {
      const std::vector<int>* pool = nullptr;
      if (phase == Phase::kPrefill) pool = &s.policy.prefill_pool;
      if (phase == Phase::kDecode) pool = &s.policy.decode_pool;
      const char want = phase == Phase::kPrefill ? 1 : 2;
      if (pool == nullptr || ((s.role[preferred] & want) && phase == Phase::kDecode)) {
        // Small work anywhere, decode already in its pool: stay with the data.
        if (s.Healthy(preferred, now)) {
          chosen = preferred;
          reason = Reason::kAffinity;
          break;
        }
      }
      if (pool == nullptr) {
        chosen = s.Scan(nullptr, s.P, now, c0, m0, loc, 0, &best_cost);
        reason = best_cost >= kUnhealthy ? Reason::kFallback : Reason::kAvoidFailed;
        if (best_cost >= kUnhealthy) chosen = preferred;
        break;
      }
      chosen = s.Scan(pool->data(), static_cast<int>(pool->size()), now, c0, m0, loc, 0,
                      &best_cost);
      reason = Reason::kPool;
      if (best_cost >= kUnhealthy) {
        reason = Reason::kFallback;
      } else if ((s.role[preferred] & want) && !s.Healthy(preferred, now)) {
        reason = Reason::kAvoidFailed;
      }
      break;
    }
    case PolicyKind::kStaticColocate:
      if (phase != Phase::kPrefill && s.Healthy(preferred, now)) {
        chosen = preferred;
        reason = Reason::kAffinity;
        break;
      }
      chosen = s.Scan(nullptr, s.P, now, c0, m0, loc, 0, &best_cost);
      if (best_cost >= kUnhealthy) {
        chosen = preferred;
        reason = Reason::kFallback;
      } else if (phase != Phase::kPrefill) {
        reason = Reason::kAvoidFailed;
      } else {
        reason = chosen == preferred ? Reason::kAffinity : Reason::kLeastLoaded;
      }
      break;
    case PolicyKind::kDynamic: {
      if (phase == Phase::kPrefill) {
        s.ComputeAwayWeight(now);
        chosen = s.Scan(nullptr, s.P, now, c0, m0, loc, 1.0, &best_cost);
        std::fill(s.away_weight.begin(), s.away_weight.end(), 0.0);
        if (best_cost >= kUnhealthy) {
          chosen = preferred;
          reason = Reason::kFallback;
        } else if (!s.Healthy(preferred, now)) {
          reason = Reason::kAvoidFailed;
        } else {
          reason = chosen == preferred ? Reason::kAffinity : Reason::kLeastLoaded;
        }
        break;
      }
      const int cur = preferred;
      const double cur_cost = s.CostOf(cur, now, c0, m0, loc);
      // A decode moving in delays the streams already there by about what it escapes (FIFO
      // is work-conserving: it only shifts the wait onto them, and pays the KV migration).
      // Not when it must leave (current device quarantined or short of memory): cur_cost then
      // carries kUnhealthy, which would make every device hosting a stream look unusable.
      s.move_penalty_ns = phase == Phase::kDecode && s.Healthy(cur, now)
                              ? s.tuning.move_weight * (cur_cost - static_cast<double>(now)) /
                                    s.request_weight
                              : 0;
      s.move_except = cur;
      // Role: the home of a prefill instance that is serving prompts is not a place to escape
      // to. The decode would sit in front of that instance's next prefills (or push them onto
      // decode devices, whose streams then escape in turn: roles swap, KV caches travel, the
      // interference the prefill penalty priced in is paid anyway). Idle prefill homes, and
      // its own home, stay open.
      s.move_home = phase == Phase::kDecode && s.Healthy(cur, now) ? home : -1;
      const int best = s.Scan(nullptr, s.P, now, c0, m0, loc, 0, &best_cost);
      s.move_penalty_ns = 0;
      s.move_home = -1;
      double start, c, m;
      s.Finish(cur, static_cast<double>(now), c0, m0, 0, &start, &c, &m);
      const double exec_cur = std::max(c, m) + s.launch_ns[cur];
      if (!s.Healthy(cur, now)) {
        if (best_cost >= kUnhealthy) {
          chosen = cur;
          reason = Reason::kFallback;
        } else {
          chosen = best;
          reason = Reason::kAvoidFailed;
        }
        break;
      }
      // Moving away from home is a round trip: the way back costs about the way there.
      double margin = s.tuning.hysteresis_frac * exec_cur +
                      static_cast<double>(s.tuning.hysteresis_ns);
      if (best != home && best >= 0) {
        margin += (loc - s.on[best]) * s.ns_per_link_byte[best];
      }
      if (best != cur && cur_cost - best_cost > margin) {
        chosen = best;
        reason = s.outstanding[best] == 0 ? Reason::kIdleSteal : Reason::kLeastLoaded;
        break;
      }
      chosen = cur;
      reason = Reason::kAffinity;
      if (phase == Phase::kDecode && cur != home && s.Healthy(home, now) &&
          now - s.moved_ns[v] >= s.tuning.min_dwell_ns && s.prefill_outstanding[home] == 0) {
        const double quiet =
            s.tuning.quiet_ns > 0 ? static_cast<double>(s.tuning.quiet_ns) : exec_cur;
        const double home_cost = s.CostOf(home, now, c0, m0, loc);
        if (s.avail[home] - static_cast<double>(now) <= quiet &&
            home_cost - cur_cost <= s.tuning.return_max_steps * exec_cur) {
          chosen = home;
          reason = Reason::kReturnHome;
        }
      }
      break;
    }
  }

  s.need = 0;

  // Commit: the chosen device's queue, the ticket, the counters.
  const int d = chosen;
  const int64_t memory_bytes = std::max<int64_t>(0, r.profile->memory_bytes);
  s.mem_pending[d] += memory_bytes;
  if (s.outstanding[d] == 0) s.inflight_since[d] = now;
  const int64_t mig_bytes = located - static_cast<int64_t>(s.on[d]);
  double start, c, m;
  const double fin = s.Finish(d, static_cast<double>(now), c0, m0,
                              static_cast<double>(mig_bytes), &start, &c, &m);
  if (s.overlap[d]) {
    s.avail_c[d] = std::max(s.avail_c[d], start) + c;  // start: after the migration
    s.avail_m[d] = std::max(s.avail_m[d], start) + m;
    s.avail[d] = std::max({s.avail[d], fin, s.avail_c[d], s.avail_m[d]});
  } else {
    s.avail[d] = fin;
  }
  if (s.tuning.tpot_slo_ns > 0) {
    if (phase == Phase::kPrefill && s.DecodeActive(d, now)) {
      s.stall_pending[d] += s.overlap[d] ? m : std::max(c, m);
    } else if (phase == Phase::kDecode) {
      // The stream's time for this token (its wait included: the prefills admitted since
      // its last step, other streams' steps) against the SLO; k streams share the bank.
      const double slo = static_cast<double>(s.tuning.tpot_slo_ns);
      const double cap = slo * s.tuning.stall_bank_steps;
      const double gap = fin - std::max(static_cast<double>(now), s.stream_finish[v]);
      const int k = std::max(1, s.decode_streams[d] + (s.stream_device[v] == d ? 0 : 1));
      s.stall_bank[d] = std::clamp(s.stall_bank[d] + (slo - gap) / k, -cap, cap);
      s.stall_pending[d] *= 1.0 - 1.0 / k;  // the prefills are now in this stream's time
    }
  }
  ++s.outstanding[d];
  if (phase == Phase::kPrefill) {
    ++s.prefill_outstanding[d];
    s.prefill_home_ns[home] = now;
    ++s.prefill_home_outstanding[home];
  }
  if (phase == Phase::kDecode) {
    const int old_dev = s.stream_device[v];
    if (old_dev >= 0) {
      s.decode_weight[old_dev] -= s.stream_weight[v];
      if (old_dev != d) --s.decode_streams[old_dev];
      // Reset when empty: no drift from fractional weights.
      if (s.decode_streams[old_dev] == 0) s.decode_weight[old_dev] = 0;
    }
    if (old_dev != d) ++s.decode_streams[d];
    s.stream_weight[v] = s.request_weight;
    s.decode_weight[d] += s.request_weight;
    s.stream_device[v] = d;
    // Active until its step is predicted to end (a stream stalled behind a prefill for longer
    // than decode_active_ns is waiting, not idle) and decode_active_ns after.
    const int64_t end = std::max(now, static_cast<int64_t>(fin));
    s.last_decode_ns[d] = std::max(s.last_decode_ns[d], end);
    s.stream_last_ns[v] = end;
    s.stream_finish[v] = fin;
  }
  if (s.current[v] != d) {
    if (s.current[v] >= 0) s.moved_ns[v] = now;
    s.current[v] = d;
  }

  uint32_t slot;
  if (!s.free_slots.empty()) {
    slot = s.free_slots.back();
    s.free_slots.pop_back();
  } else {
    slot = static_cast<uint32_t>(s.tickets.size());
    s.tickets.emplace_back();
  }
  TicketRecord& t = s.tickets[slot];
  ++t.generation;
  t.live = true;
  t.device = d;
  t.virtual_device = v;
  t.phase = phase;
  t.executable_id = r.executable_id;
  t.placed_ns = now;
  t.start_ns = -1;
  t.mig_ns = static_cast<double>(mig_bytes) * s.ns_per_link_byte[d];
  t.pred_start = start;
  t.pred_finish = fin;
  t.shift_at_place = s.shift[d];
  t.c_ns = c;
  t.m_ns = m;
  t.factor_at_place = *kexec * s.k_dev[d] * s.ext_slow[d];
  t.memory_bytes = memory_bytes;
  t.memory_epoch = s.mem_epoch[d];

  const int pi = static_cast<int>(phase);
  const int ri = static_cast<int>(reason);
  DeviceStats& ds = s.dstats[d];
  ++ds.executions[pi];
  ++ds.decisions[ri];
  ds.bytes_migrated_in += mig_bytes;
  VirtualStats& vs = s.vstats[v];
  ++vs.executions[pi];
  ++vs.decisions[ri];
  vs.bytes_migrated += mig_bytes;
  ++vs.queue_length;
  ++s.decisions;

  for (size_t i = 0; i < r.num_inputs; ++i) {
    if (r.inputs[i].physical_device != kAnywhere) s.on[r.inputs[i].physical_device] = 0;
  }

  out->physical_device = d;
  out->reason = reason;
  out->predicted_start_ns = static_cast<int64_t>(start);
  out->predicted_finish_ns = static_cast<int64_t>(fin);
  out->migrate_bytes = mig_bytes;
  out->ticket = (static_cast<uint64_t>(t.generation) << 32) | (static_cast<uint64_t>(slot) + 1);
  return Status::Ok();
}

namespace {

TicketRecord* Lookup(std::vector<TicketRecord>& tickets, uint64_t ticket) {
  const uint64_t slot1 = ticket & 0xffffffffu;
  if (slot1 == 0 || slot1 > tickets.size()) return nullptr;
  TicketRecord& t = tickets[slot1 - 1];
  if (!t.live || t.generation != static_cast<uint32_t>(ticket >> 32)) return nullptr;
  return &t;
}

Status UnknownTicket(uint64_t ticket) {
  return NotFound("placement: unknown or already finished ticket " + std::to_string(ticket));
}

}  // namespace

Status Core::OnStart(uint64_t ticket, int64_t now_ns) {
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mu);
  TicketRecord* t = Lookup(s.tickets, ticket);
  if (t == nullptr) return UnknownTicket(ticket);
  if (t->start_ns >= 0) return Status::Ok();
  t->start_ns = now_ns;
  const int d = t->device;
  const double cur_start = t->pred_start + (s.shift[d] - t->shift_at_place);
  const double late = static_cast<double>(now_ns) - cur_start;
  if (late > 0) {  // the queue started later than predicted: everything behind is late too
    s.avail[d] += late;
    s.avail_c[d] += late;
    s.avail_m[d] += late;
    s.shift[d] += late;
  }
  return Status::Ok();
}

Status Core::Cancel(uint64_t ticket) {
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mu);
  TicketRecord* t = Lookup(s.tickets, ticket);
  if (t == nullptr) return UnknownTicket(ticket);
  const int d = t->device;
  // Take its predicted time back out of the queue.
  const double dur = t->pred_finish - t->pred_start;
  --s.outstanding[d];
  if (t->phase == Phase::kPrefill) {
    --s.prefill_outstanding[d];
    --s.prefill_home_outstanding[s.home[t->virtual_device]];
  }
  if (s.outstanding[d] == 0) {
    s.avail[d] = s.avail_c[d] = s.avail_m[d] = static_cast<double>(t->placed_ns);
  } else {
    s.avail[d] -= dur;
    s.avail_c[d] -= t->c_ns;
    s.avail_m[d] -= t->m_ns;
    s.shift[d] -= dur;
  }
  --s.vstats[t->virtual_device].queue_length;
  if (t->memory_bytes > 0 && t->memory_epoch == s.mem_epoch[d]) {
    s.mem_pending[d] = std::max<int64_t>(0, s.mem_pending[d] - t->memory_bytes);
  }
  t->live = false;
  s.free_slots.push_back(static_cast<uint32_t>(t - s.tickets.data()));
  return Status::Ok();
}

Status Core::OnFinish(uint64_t ticket, int64_t now_ns, bool ok) {
  State& s = *s_;
  std::lock_guard<std::mutex> lock(s.mu);
  TicketRecord* t = Lookup(s.tickets, ticket);
  if (t == nullptr) return UnknownTicket(ticket);
  const int d = t->device;
  const double now = static_cast<double>(now_ns);

  // Queue: shift what is behind by the prediction error; an empty queue drains now.
  const double shift = s.shift[d] - t->shift_at_place;
  const double cur_finish = t->pred_finish + shift;
  const double delta = now - cur_finish;
  --s.outstanding[d];
  if (t->phase == Phase::kPrefill) {
    --s.prefill_outstanding[d];
    --s.prefill_home_outstanding[s.home[t->virtual_device]];
  }
  if (s.outstanding[d] == 0) {
    s.avail[d] = s.avail_c[d] = s.avail_m[d] = now;
  } else {
    s.inflight_since[d] = now_ns;  // the next one runs from here
    s.avail[d] = std::max(now, s.avail[d] + delta);
    s.avail_c[d] = std::max(now, s.avail_c[d] + delta);
    s.avail_m[d] = std::max(now, s.avail_m[d] + delta);
  }
  s.shift[d] += delta;

  // Measured duration.
  int64_t start_eff;
  if (t->start_ns >= 0) {
    start_eff = t->start_ns;
  } else {
    start_eff = t->placed_ns + static_cast<int64_t>(t->mig_ns);
    if (!s.overlap[d]) start_eff = std::max(start_eff, s.last_finish[d]);
  }
  start_eff = std::min(start_eff, now_ns);
  const int64_t measured = now_ns - start_eff;
  DeviceStats& ds = s.dstats[d];
  ds.busy_ns += std::max<int64_t>(0, now_ns - std::max(start_eff, s.busy_end[d]));
  s.busy_end[d] = std::max(s.busy_end[d], now_ns);
  s.last_finish[d] = std::max(s.last_finish[d], now_ns);
  VirtualStats& vs = s.vstats[t->virtual_device];
  vs.busy_ns += measured;
  --vs.queue_length;

  if (ok) {
    const double predicted = t->pred_finish - t->pred_start;
    if (predicted > 0 && measured > 0) {
      // The error relative to the factors in force now, not to those the prediction used:
      // executions of one executable overlap (several virtual devices run the same program),
      // and each finish correcting the current factor by its own stale ratio compounded them
      // (12 decode streams finishing 8x late multiplied the factor by 2.75^12, the next round
      // divided it back: predictions swung between 0.1x and 1e4x). Sequential executions
      // see the same ratio as before (the factors have not changed since placement).
      double* kexec = s.exec_factor->Find(t->executable_id);
      const double factor_now = (kexec != nullptr ? *kexec : 1.0) * s.k_dev[d] * s.ext_slow[d];
      const double r = std::clamp(static_cast<double>(measured) / predicted *
                                      (t->factor_at_place / factor_now),
                                  0.125, 8.0);
      if (kexec != nullptr) {
        *kexec = std::clamp(*kexec * (1.0 + s.tuning.ewma_alpha * (r - 1.0)), 1e-6, 1e6);
      }
      s.k_dev[d] *= 1.0 + s.tuning.device_alpha * (r - 1.0);
      s.k_dev[d] = std::clamp(s.k_dev[d], 1e-3, 1e3);
      s.ns_per_flop[d] = s.base_ns_per_flop[d] * s.k_dev[d] * s.ext_slow[d];
      s.ns_per_byte[d] = s.base_ns_per_byte[d] * s.k_dev[d] * s.ext_slow[d];
    }
    s.consecutive_errors[d] = 0;
  } else {
    ++ds.errors;
    const int n = std::min(++s.consecutive_errors[d], 7);
    s.quarantine_until[d] = now_ns + (s.tuning.error_quarantine_ns << (n - 1));
    s.max_quarantine_until = std::max(s.max_quarantine_until, s.quarantine_until[d]);
  }
  t->live = false;
  s.free_slots.push_back(static_cast<uint32_t>(t - s.tickets.data()));
  return Status::Ok();
}

Status Core::UpdateTelemetry(int device, const DeviceTelemetry& telemetry, int64_t now_ns) {
  State& s = *s_;
  if (device < 0 || device >= s.P) {
    return InvalidArgument("placement: telemetry for physical device " + std::to_string(device) +
                           ", which does not exist (" + std::to_string(s.P) +
                           " physical devices)");
  }
  if (std::isnan(telemetry.utilization) || telemetry.utilization > 1.0) {
    return InvalidArgument("placement: telemetry utilization of physical device " +
                           std::to_string(device) +
                           " must be a fraction in [0, 1] (negative: unknown), got " +
                           std::to_string(telemetry.utilization));
  }
  std::lock_guard<std::mutex> lock(s.mu);
  const int d = device;
  s.mem_free[d] = telemetry.memory_free_bytes >= 0 ? telemetry.memory_free_bytes : -1;
  s.mem_pending[d] = 0;  // the reading already shows what was placed before it
  ++s.mem_epoch[d];
  if (s.mem_free[d] >= 0) s.any_memory_known = true;

  // External load: the reported busy fraction less FlexNPU's own over the same window.
  const int64_t own_total = s.OwnBusyNs(d, now_ns);
  double external = 0;
  if (telemetry.utilization >= 0) {
    double own = s.outstanding[d] > 0 ? 1.0 : 0.0;  // no window yet: is it running ours now?
    if (s.telemetry_ns[d] != INT64_MIN && now_ns > s.telemetry_ns[d]) {
      own = std::clamp(static_cast<double>(own_total - s.own_busy_at_reading[d]) /
                           static_cast<double>(now_ns - s.telemetry_ns[d]),
                       0.0, 1.0);
    }
    external = std::clamp(telemetry.utilization - own, 0.0, kMaxExternal);
  }
  s.telemetry_ns[d] = now_ns;
  s.own_busy_at_reading[d] = own_total;
  s.ext_slow[d] = 1.0 / (1.0 - external);
  s.ns_per_flop[d] = s.base_ns_per_flop[d] * s.k_dev[d] * s.ext_slow[d];
  s.ns_per_byte[d] = s.base_ns_per_byte[d] * s.k_dev[d] * s.ext_slow[d];
  s.dstats[d].utilization = telemetry.utilization >= 0 ? telemetry.utilization : -1;
  s.dstats[d].external_utilization = external;
  return Status::Ok();
}

Status Core::ForgetExecutable(uint64_t executable_id) {
  std::lock_guard<std::mutex> lock(s_->mu);
  if (!s_->exec_factor->Forget(executable_id)) {
    return NotFound("placement: executable " + std::to_string(executable_id) +
                    " has no correction to forget");
  }
  return Status::Ok();
}

Stats Core::Snapshot(int64_t now_ns) const {
  const State& s = *s_;
  std::lock_guard<std::mutex> lock(s_->mu);
  Stats out;
  out.policy = s.policy.ToString();
  out.prefill_pool = s.policy.prefill_pool;
  out.decode_pool = s.policy.decode_pool;
  out.now_ns = now_ns;
  out.elapsed_ns = s.have_created ? std::max<int64_t>(0, now_ns - s.created_ns) : 0;
  out.decisions = s.decisions;
  out.policy_switches = s.policy_switches;
  out.executables = s.exec_factor->size();
  const double elapsed = static_cast<double>(out.elapsed_ns);
  out.physical = s.dstats;
  for (int d = 0; d < s.P; ++d) {
    DeviceStats& ds = out.physical[d];
    ds.queue_length = s.outstanding[d];
    ds.prefill_outstanding = s.prefill_outstanding[d];
    ds.busy_fraction = elapsed > 0 ? std::min(1.0, ds.busy_ns / elapsed) : 0;
    ds.predicted_drain_ns =
        s.outstanding[d] > 0
            ? std::max<int64_t>(0, static_cast<int64_t>(s.avail[d]) - now_ns)
            : 0;
    ds.quarantined = now_ns < s.quarantine_until[d];
    ds.speed_factor = s.k_dev[d];
    ds.decode_streams = s.decode_streams[d];
    ds.decode_weight = s.decode_weight[d];
    ds.memory_free_bytes =
        s.mem_free[d] >= 0 ? std::max<int64_t>(0, s.mem_free[d] - s.mem_pending[d]) : -1;
  }
  out.virtual_devices = s.vstats;
  for (int v = 0; v < s.V; ++v) {
    VirtualStats& vs = out.virtual_devices[v];
    vs.home = s.home[v];
    vs.current = s.current[v];
    vs.busy_fraction = elapsed > 0 ? std::min(1.0, vs.busy_ns / elapsed) : 0;
  }
  return out;
}

}  // namespace flexnpu::placement
