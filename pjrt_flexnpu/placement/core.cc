// The placement core (see placement.h): Core's creation, locking, the request checks, the
// dispatch to the policy in force (policies.h; one file each) and the commit of its choice, the
// tickets with OnStart / OnFinish / Cancel (online correction, quarantine), and telemetry. The
// state and the cost model the policies share are in core_state.h; Snapshot is in stats.cc.
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "pjrt_flexnpu/placement/core_state.h"
#include "pjrt_flexnpu/placement/placement.h"
#include "pjrt_flexnpu/placement/policies.h"

namespace flexnpu::placement {

Core::Core(std::unique_ptr<CoreState> state) : s_(std::move(state)) {}
Core::~Core() = default;

namespace {

constexpr double kMaxExternal = 0.9;  // external load share at most (times at most 10x)

bool Finite(double x) { return std::isfinite(x); }

TicketRecord* Lookup(std::vector<TicketRecord>& tickets, uint64_t ticket) {
  const uint64_t slot1 = ticket & 0xffffffffu;
  if (slot1 == 0 || slot1 > tickets.size()) return nullptr;
  TicketRecord& t = tickets[slot1 - 1];
  if (!t.live || t.generation != static_cast<uint32_t>(ticket >> 32)) return nullptr;
  return &t;
}

// When the live execution behind `ticket` is predicted to finish now (its prediction at
// placement, shifted as its device's queue was since); -inf once it has finished.
double PredictedFinish(CoreState& s, uint64_t ticket) {
  const TicketRecord* t = Lookup(s.tickets, ticket);
  if (t == nullptr) return -std::numeric_limits<double>::infinity();
  return t->pred_finish + (s.shift[t->device] - t->shift_at_place);
}

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
  if (!(t.move_gain >= 0 && Finite(t.move_gain))) return bad("move_gain < 0");
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

  auto s = std::make_unique<CoreState>();
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
  s->passthrough_physical = std::make_unique<PassthroughCounts[]>(P);
  s->passthrough_virtual = std::make_unique<PassthroughCounts[]>(s->V);
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
  CoreState& s = *s_;
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
  CoreState& s = *s_;
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
  for (size_t i = 0; i < r.num_inputs; ++i) {
    if (r.inputs[i].producer != 0) {
      s.inputs_ready = std::max(s.inputs_ready, PredictedFinish(s, r.inputs[i].producer));
    }
  }
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

  Choice choice{given_device, Reason::kAffinity};
  if (given_device < 0) {
    const PlaceInput in{v, home, preferred, phase, now, c0, m0, loc};
    switch (s.policy.kind) {
      case PolicyKind::kPassthrough: choice = PlacePassthrough(in, s); break;
      case PolicyKind::kStaticPd: choice = PlaceStaticPd(in, s); break;
      case PolicyKind::kStaticColocate: choice = PlaceStaticColocate(in, s); break;
      case PolicyKind::kDynamic: choice = PlaceDynamic(in, s); break;
    }
  }
  s.need = 0;

  // Commit: the chosen device's queue, the ticket, the counters.
  const int d = choice.device;
  const Reason reason = choice.reason;
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
  t.inputs_ready = s.inputs_ready;
  s.inputs_ready = -std::numeric_limits<double>::infinity();
  t.memory_bytes = memory_bytes;
  t.memory_epoch = s.mem_epoch[d];

  const int pi = static_cast<int>(phase);
  const int ri = static_cast<int>(reason);
  DeviceStats& ds = s.dstats[d];
  ++ds.executions[pi];
  ++ds.decisions[ri];
  ds.bytes_migrated_in += mig_bytes;
  ds.bytes_migrated_in_by_reason[ri] += mig_bytes;
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

Status UnknownTicket(uint64_t ticket) {
  return NotFound("placement: unknown or already finished ticket " + std::to_string(ticket));
}

}  // namespace

Status Core::OnStart(uint64_t ticket, int64_t now_ns) {
  CoreState& s = *s_;
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
  CoreState& s = *s_;
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
  CoreState& s = *s_;
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
    // Not before its inputs were produced (elsewhere: the FIFO above covers this device).
    if (t->inputs_ready > static_cast<double>(start_eff)) {
      start_eff = static_cast<int64_t>(std::min(t->inputs_ready, now));
    }
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
  CoreState& s = *s_;
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

}  // namespace flexnpu::placement
