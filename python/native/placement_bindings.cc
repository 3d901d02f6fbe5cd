// flexnpu._native placement bindings: the decision core (pjrt_flexnpu/placement) for tests and
// tools, plus a C++ timing loop for bench/placer_latency.py. The typed Python wrapper lives in
// flexnpu/placement.py. Errors become ValueError (KeyError for an unknown ticket).
#ifdef FLEXNPU_HAVE_PLACEMENT
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"
#include "pjrt_flexnpu/placement/split.h"

namespace nb = nanobind;

namespace flexnpu::python {
namespace {

using placement::Config;
using placement::Core;
using placement::Decision;
using placement::DeviceModel;
using placement::Input;
using placement::Phase;
using placement::Profile;
using placement::Request;

void Check(const Status& s) {
  if (s.ok()) return;
  if (s.code() == Code::kNotFound) throw nb::key_error(s.message().c_str());
  throw nb::value_error(s.message().c_str());
}

Phase PhaseFromString(const std::string& name) {
  Phase phase;
  if (PhaseFromName(name, &phase)) return phase;
  std::string known;
  for (int p = 0; p < kNumPhases; ++p) {
    known += (p ? ", " : "") + std::string(PhaseName(static_cast<Phase>(p)));
  }
  throw nb::value_error(("unknown phase '" + name + "' (" + known + ")").c_str());
}

template <typename T>
T Get(const nb::dict& d, const char* key, T fallback) {
  return d.contains(key) ? nb::cast<T>(d[key]) : fallback;
}

DeviceModel ModelFromDict(const nb::dict& d) {
  DeviceModel m;
  try {
    m.peak_flops = nb::cast<double>(d["peak_flops"]);
    m.bandwidth_bytes_per_s = nb::cast<double>(d["bandwidth_bytes_per_s"]);
    m.link_bytes_per_s = Get<double>(d, "link_bytes_per_s", m.link_bytes_per_s);
    m.can_overlap = Get<bool>(d, "can_overlap", false);
    m.launch_s = Get<double>(d, "launch_s", 0.0);
  } catch (const std::exception& e) {
    throw nb::value_error((std::string("invalid device model: ") + e.what()).c_str());
  }
  return m;
}

placement::Tuning TuningFromDict(const nb::dict& d) {
  placement::Tuning t;
  for (auto [key, value] : d) {
    const std::string k = nb::cast<std::string>(key);
    if (k == "hysteresis_frac") t.hysteresis_frac = nb::cast<double>(value);
    else if (k == "hysteresis_ns") t.hysteresis_ns = nb::cast<int64_t>(value);
    else if (k == "min_dwell_ns") t.min_dwell_ns = nb::cast<int64_t>(value);
    else if (k == "quiet_ns") t.quiet_ns = nb::cast<int64_t>(value);
    else if (k == "return_max_steps") t.return_max_steps = nb::cast<double>(value);
    else if (k == "tpot_weight") t.tpot_weight = nb::cast<double>(value);
    else if (k == "decode_active_ns") t.decode_active_ns = nb::cast<int64_t>(value);
    else if (k == "ewma_alpha") t.ewma_alpha = nb::cast<double>(value);
    else if (k == "device_alpha") t.device_alpha = nb::cast<double>(value);
    else if (k == "error_quarantine_ns") t.error_quarantine_ns = nb::cast<int64_t>(value);
    else if (k == "move_weight") t.move_weight = nb::cast<double>(value);
    else if (k == "move_gain") t.move_gain = nb::cast<double>(value);
    else if (k == "max_executables") t.max_executables = nb::cast<int64_t>(value);
    else if (k == "prefill_role_ns") t.prefill_role_ns = nb::cast<int64_t>(value);
    else if (k == "tpot_slo_ns") t.tpot_slo_ns = nb::cast<int64_t>(value);
    else if (k == "stall_bank_steps") t.stall_bank_steps = nb::cast<double>(value);
    else throw nb::value_error(("unknown placement tuning option '" + k + "'").c_str());
  }
  return t;
}

class PyCore {
 public:
  PyCore(const std::string& policy, const std::vector<nb::dict>& devices, int num_virtual,
         const nb::dict& tuning) {
    Config c;
    c.policy = policy;
    for (const nb::dict& d : devices) c.devices.push_back(ModelFromDict(d));
    c.num_virtual_devices = num_virtual;
    c.tuning = TuningFromDict(tuning);
    auto core = Core::Create(c);
    Check(core.status());
    core_ = std::move(*core);
  }

  std::tuple<int, std::string, int64_t, int64_t, int64_t, uint64_t> Place(
      int virtual_device, uint64_t executable_id, const std::string& phase, double flops,
      double bytes, const std::vector<std::tuple<int, int64_t>>& inputs, int64_t now_ns,
      double weight) {
    const Profile profile{PhaseFromString(phase), flops, bytes};
    std::vector<Input> in;
    in.reserve(inputs.size());
    for (const auto& [device, size] : inputs) in.push_back(Input{device, size});
    const Request r{virtual_device, executable_id, &profile, in.data(), in.size(), now_ns,
                    weight};
    Decision d;
    Check(core_->Place(r, &d));
    return {d.physical_device, placement::ReasonName(d.reason), d.predicted_start_ns,
            d.predicted_finish_ns, d.migrate_bytes, d.ticket};
  }

  // Decision latency: a C++ loop of Place calls on a steady mixed workload (no Python in the
  // timed region). Every virtual device runs a decode stream whose KV cache follows it; every
  // `prefill_every`-th request is a prefill. The simulated clock advances `step_ns` per request;
  // executions finish in order once `max_outstanding` are in flight. Returns per-call times (ns,
  // each including one steady_clock read), the clock's own cost, and the mean over a batch-timed
  // rerun (no per-call clock).
  nb::dict Bench(int calls, int warmup, int prefill_every, int64_t step_ns, int max_outstanding) {
    if (calls <= 0 || warmup < 0 || prefill_every <= 0 || max_outstanding <= 0) {
      throw nb::value_error("bench: calls, prefill_every, max_outstanding must be > 0");
    }
    std::vector<int64_t> samples(static_cast<size_t>(calls));
    double clock_ns = 0, batch_mean_ns = 0;
    int64_t now = start_ns_;
    {
      nb::gil_scoped_release release;
      const int V = core_->num_virtual();
      const int P = core_->num_physical();
      std::vector<int> kv(V);
      for (int v = 0; v < V; ++v) kv[v] = v % P;
      const Profile decode{Phase::kDecode, 2e9, 2e9};
      const Profile prefill{Phase::kPrefill, 5e12, 2e9};
      std::deque<uint64_t> in_flight;
      uint64_t n = 0;
      auto one = [&](bool timed, int64_t* out) {
        const int v = static_cast<int>(n % static_cast<uint64_t>(V));
        const bool is_prefill = (n % static_cast<uint64_t>(prefill_every)) == 0;
        const Input in[2] = {{kv[v], 64 << 20}, {placement::kAnywhere, int64_t{1} << 30}};
        const Request r{v, is_prefill ? 2u : 1u, is_prefill ? &prefill : &decode, in,
                        is_prefill ? 1u : 2u, now};
        Decision d;
        std::chrono::steady_clock::time_point t0;
        if (timed) t0 = std::chrono::steady_clock::now();
        const Status s = core_->Place(r, &d);
        if (timed) {
          *out = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::steady_clock::now() - t0)
                     .count();
        }
        if (!s.ok()) return false;
        if (!is_prefill) kv[v] = d.physical_device;
        in_flight.push_back(d.ticket);
        now += step_ns;
        while (static_cast<int>(in_flight.size()) > max_outstanding) {
          (void)core_->OnFinish(in_flight.front(), now, true);
          in_flight.pop_front();
        }
        ++n;
        return true;
      };
      int64_t ignored = 0;
      for (int i = 0; i < warmup; ++i) one(false, &ignored);
      for (int i = 0; i < calls; ++i) one(true, &samples[i]);
      // Batch-timed: the same loop without per-call clock reads (includes OnFinish calls).
      const auto b0 = std::chrono::steady_clock::now();
      for (int i = 0; i < calls; ++i) one(false, &ignored);
      batch_mean_ns = std::chrono::duration<double, std::nano>(
                          std::chrono::steady_clock::now() - b0).count() / calls;
      const auto c0 = std::chrono::steady_clock::now();
      std::chrono::steady_clock::time_point sink;
      for (int i = 0; i < 10000; ++i) sink = std::chrono::steady_clock::now();
      clock_ns = std::chrono::duration<double, std::nano>(sink - c0).count() / 10000;
      while (!in_flight.empty()) {
        (void)core_->OnFinish(in_flight.front(), now, true);
        in_flight.pop_front();
      }
    }
    start_ns_ = now;
    nb::dict out;
    out["samples_ns"] = samples;
    out["clock_overhead_ns"] = clock_ns;
    out["batch_mean_ns"] = batch_mean_ns;  // Place + OnFinish per request, no clock reads
    out["now_ns"] = now;
    return out;
  }

  Core& core() { return *core_; }

 private:
  std::unique_ptr<Core> core_;
  int64_t start_ns_ = 0;
};

}  // namespace

void RegisterPlacement(nb::module_& m) {
  m.def(
      "parse_policy",
      [](const std::string& spec, int num_physical) {
        auto p = placement::ParsePolicy(spec, num_physical);
        Check(p.status());
        nb::dict out;
        out["kind"] = std::string(placement::PolicyKindName(p->kind));
        out["prefill_pool"] = p->prefill_pool;
        out["decode_pool"] = p->decode_pool;
        out["text"] = p->ToString();
        return out;
      },
      nb::arg("spec"), nb::arg("num_physical"),
      "Parse a placement policy string; ValueError names what is wrong.");
  nb::class_<PyCore>(m, "PlacementCore")
      .def(nb::init<const std::string&, const std::vector<nb::dict>&, int, const nb::dict&>(),
           nb::arg("policy"), nb::arg("devices"), nb::arg("num_virtual_devices") = 0,
           nb::arg("tuning") = nb::dict())
      .def("place", &PyCore::Place, nb::arg("virtual_device"), nb::arg("executable_id"),
           nb::arg("phase"), nb::arg("flops"), nb::arg("bytes"), nb::arg("inputs"),
           nb::arg("now_ns"), nb::arg("weight") = 0.0,
           "-> (physical_device, reason, predicted_start_ns, predicted_finish_ns, "
           "migrate_bytes, ticket)")
      .def("on_start",
           [](PyCore& c, uint64_t ticket, int64_t now_ns) { Check(c.core().OnStart(ticket, now_ns)); },
           nb::arg("ticket"), nb::arg("now_ns"))
      .def("on_finish",
           [](PyCore& c, uint64_t ticket, int64_t now_ns, bool ok) {
             Check(c.core().OnFinish(ticket, now_ns, ok));
           },
           nb::arg("ticket"), nb::arg("now_ns"), nb::arg("ok") = true)
      .def("cancel", [](PyCore& c, uint64_t ticket) { Check(c.core().Cancel(ticket)); },
           nb::arg("ticket"))
      .def("forget_executable",
           [](PyCore& c, uint64_t id) { Check(c.core().ForgetExecutable(id)); },
           nb::arg("executable_id"))
      .def("set_policy", [](PyCore& c, const std::string& spec) { Check(c.core().SetPolicy(spec)); },
           nb::arg("spec"))
      .def_prop_ro("policy", [](PyCore& c) { return c.core().policy().ToString(); })
      .def_prop_ro("num_physical", [](PyCore& c) { return c.core().num_physical(); })
      .def_prop_ro("num_virtual", [](PyCore& c) { return c.core().num_virtual(); })
      .def("snapshot_json",
           [](PyCore& c, int64_t now_ns) { return c.core().Snapshot(now_ns).ToJson(); },
           nb::arg("now_ns"))
      .def("bench", &PyCore::Bench, nb::arg("calls"), nb::arg("warmup") = 1000,
           nb::arg("prefill_every") = 16, nb::arg("step_ns") = 10'000,
           nb::arg("max_outstanding") = 8);
  // The role split advisor (split.h): one owner, so no GIL release.
  nb::class_<placement::SplitAdvisor>(m, "SplitAdvisor")
      .def("__init__",
           [](placement::SplitAdvisor* self, int units, double prefill_tokens_per_s,
              double decode_sequences_per_unit, double target_utilization, int64_t average_ns,
              int64_t tick_ns, int initial_prefill_units, int64_t backlog_drain_ns,
              int64_t hold_ns, int deadband_units, bool colocate_at_capacity) {
             placement::SplitConfig c;
             c.units = units;
             c.prefill_tokens_per_s = prefill_tokens_per_s;
             c.decode_sequences_per_unit = decode_sequences_per_unit;
             c.target_utilization = target_utilization;
             c.average_ns = average_ns;
             c.tick_ns = tick_ns;
             c.initial_prefill_units = initial_prefill_units;
             c.backlog_drain_ns = backlog_drain_ns;
             c.hold_ns = hold_ns;
             c.deadband_units = deadband_units;
             c.colocate_at_capacity = colocate_at_capacity;
             auto a = placement::SplitAdvisor::Create(c);
             Check(a.status());
             new (self) placement::SplitAdvisor(std::move(*a));
           },
           nb::arg("units"), nb::arg("prefill_tokens_per_s"),
           nb::arg("decode_sequences_per_unit"), nb::arg("target_utilization") = 0.75,
           nb::arg("average_ns") = 2'000'000'000, nb::arg("tick_ns") = 1'000'000'000,
           nb::arg("initial_prefill_units") = 0,
           nb::arg("backlog_drain_ns") = placement::SplitConfig{}.backlog_drain_ns,
           nb::arg("hold_ns") = placement::SplitConfig{}.hold_ns,
           nb::arg("deadband_units") = placement::SplitConfig{}.deadband_units,
           nb::arg("colocate_at_capacity") = false)
      .def("on_prompt",
           [](placement::SplitAdvisor& a, int64_t tokens) { Check(a.OnPrompt(tokens)); },
           nb::arg("tokens"))
      .def("due", &placement::SplitAdvisor::Due, nb::arg("now_ns"))
      .def("update",
           [](placement::SplitAdvisor& a, int64_t now_ns, int64_t decode_sequences,
              int64_t queued_prompt_tokens) {
             bool changed = false;
             Check(a.Update(now_ns, decode_sequences, queued_prompt_tokens, &changed));
             return changed;
           },
           nb::arg("now_ns"), nb::arg("decode_sequences"), nb::arg("queued_prompt_tokens") = 0,
           "-> whether the split changed")
      .def_prop_ro("prefill_units", &placement::SplitAdvisor::prefill_units)
      .def_prop_ro("mixed_units", &placement::SplitAdvisor::mixed_units)
      .def_prop_ro("proposal", &placement::SplitAdvisor::proposal)
      .def_prop_ro("units", &placement::SplitAdvisor::units)
      .def_prop_ro("prompt_tokens_per_s", &placement::SplitAdvisor::prompt_tokens_per_s)
      .def_prop_ro("decisions", &placement::SplitAdvisor::decisions)
      .def_prop_ro("changes", &placement::SplitAdvisor::changes);
}

}  // namespace flexnpu::python
#endif  // FLEXNPU_HAVE_PLACEMENT
