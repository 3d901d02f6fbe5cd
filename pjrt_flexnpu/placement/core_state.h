// Core's state and cost model, shared by core.cc (state, locking, tickets, OnFinish) and the
// policy files (passthrough.cc, static_pd.cc, static_colocate.cc, dynamic.cc). Private to
// placement/: the public API is placement.h.
#ifndef FLEXNPU_PLACEMENT_CORE_STATE_H_
#define FLEXNPU_PLACEMENT_CORE_STATE_H_

#include <algorithm>
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <limits>
#include <list>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "pjrt_flexnpu/base/co_run.h"
#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement {

inline constexpr double kUnhealthy = 1e30;  // added to the cost of a quarantined device
// Added to a decode move's cost on a device serving another instance's prefills (its role),
// and to a prefill's on a device whose decode streams' stall budget it exceeds; below
// kUnhealthy, so work that has nowhere else to go may still go there.
inline constexpr double kOtherRole = 1e20;

// One placed execution, from Place until OnFinish or Cancel (a slot of the ticket table).
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
  double inputs_ready = 0;        // predicted finish of its inputs' producers (-inf: none)
  int64_t memory_bytes = 0;       // counted against the device's free memory
  uint32_t memory_epoch = 0;      // the device's telemetry reading it was counted against
};

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

// Executions of one device the runtime ran under passthrough without Place (CountPassthrough,
// PassthroughFinished): written without the Core's lock, one cache line per device.
struct alignas(64) PassthroughCounts {
  std::atomic<uint64_t> executions[kNumPhases] = {};
  std::atomic<int64_t> busy_ns{0};
  std::atomic<int64_t> busy_end{INT64_MIN};  // physical devices: latest finish counted
};

// Everything the Core knows, guarded by mu (but for the passthrough counts), and the cost model
// over it: Finish predicts one device, Cost adds the penalties, Scan / ScanAll choose the
// cheapest candidate.
struct CoreState {
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
  // scratch: when the producers of its inputs are predicted to finish (Input::producer); -inf
  // outside Place and when its inputs are ready.
  double inputs_ready = -std::numeric_limits<double>::infinity();

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

  // Lock-free: per physical and per virtual device; the earliest start measured (INT64_MAX:
  // none), which starts the clock of the busy fractions when nothing was placed before.
  std::unique_ptr<PassthroughCounts[]> passthrough_physical, passthrough_virtual;
  std::atomic<int64_t> passthrough_since{INT64_MAX};

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
      *start = std::max({avail[d], now + mig, inputs_ready});
      return *start + std::max(c, m) + launch_ns[d];
    }
    const double C = std::max(0.0, avail_c[d] - now);
    const double M = std::max(0.0, avail_m[d] - now);
    *start = std::max(now + mig, inputs_ready);
    return *start + CoRunDuration(c, m, outstanding[d], C, M) + launch_ns[d];
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
    const double inputs = inputs_ready;
    for (int d = 0; d < n; ++d) {
      const double moved = now + (located - o[d]) * pl[d];
      const double ready = moved > inputs ? moved : inputs;
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

}  // namespace flexnpu::placement

#endif  // FLEXNPU_PLACEMENT_CORE_STATE_H_
