// A small discrete-event driver for placement::Core tests: a fake clock, FIFO physical devices
// that take a scripted true time per execution, input migration over a link, closed-loop decode
// streams whose KV cache follows them, and devices that can be made to fail.
#ifndef FLEXNPU_TESTS_CPP_PLACEMENT_SIM_H_
#define FLEXNPU_TESTS_CPP_PLACEMENT_SIM_H_

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <map>
#include <queue>
#include <tuple>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement::testing {

constexpr int64_t kUs = 1000;
constexpr int64_t kMs = 1000 * kUs;

struct Placed {
  int64_t at_ns;
  int virtual_device;
  Phase phase;
  Decision decision;
  int stream;  // -1: a one-off submission
};

struct Stream {
  int virtual_device;
  uint64_t executable_id;
  Profile profile;
  int64_t kv_bytes;
  int kv_device;      // where its KV cache is now
  int64_t true_ns;    // real execution time of one step
  int64_t gap_ns;     // think time between steps
  bool active = true;
  int steps = 0;
};

class Sim {
 public:
  Sim(Core& core, double link_bytes_per_s)
      : core_(core), link_(link_bytes_per_s), free_(core.num_physical(), 0),
        failing_(core.num_physical(), false) {}

  int64_t now() const { return now_; }
  const std::vector<Placed>& log() const { return log_; }
  std::vector<Stream>& streams() { return streams_; }
  void set_failing(int device, bool failing) { failing_[device] = failing; }

  // One execution submitted now.
  Decision Submit(int v, uint64_t exec, const Profile& profile, std::vector<Input> inputs,
                  int64_t true_ns) {
    return Launch(v, exec, profile, inputs, true_ns, -1);
  }

  // A decode stream: one step at a time, the next `gap_ns` after the previous finished.
  int AddStream(int v, uint64_t exec, const Profile& profile, int64_t kv_bytes, int kv_device,
                int64_t true_ns, int64_t gap_ns = 50 * kUs) {
    streams_.push_back(Stream{v, exec, profile, kv_bytes, kv_device, true_ns, gap_ns});
    const int id = static_cast<int>(streams_.size()) - 1;
    Push(now_, kNext, 0, id);
    return id;
  }

  void RunUntil(int64_t t) {
    while (!events_.empty() && std::get<0>(events_.top()) <= t) {
      auto [when, seq, kind, ticket, stream] = events_.top();
      events_.pop();
      now_ = when;
      if (kind == kStart) {
        ASSERT_TRUE(core_.OnStart(ticket, when).ok());
      } else if (kind == kFinish) {
        const int d = device_of_[ticket];
        ASSERT_TRUE(core_.OnFinish(ticket, when, !failing_[d]).ok());
        if (stream >= 0 && streams_[stream].active) {
          Push(when + streams_[stream].gap_ns, kNext, 0, stream);
        }
      } else {
        Stream& s = streams_[stream];
        if (!s.active) continue;
        std::vector<Input> inputs = {{s.kv_device, s.kv_bytes}, {kAnywhere, int64_t{1} << 30}};
        const Decision d = Launch(s.virtual_device, s.executable_id, s.profile, inputs, s.true_ns,
                                  stream);
        s.kv_device = d.physical_device;
        ++s.steps;
      }
    }
    now_ = t;
  }

  // Decisions of one stream placed in [from, to).
  std::vector<Placed> StreamLog(int stream, int64_t from = 0, int64_t to = INT64_MAX) const {
    std::vector<Placed> out;
    for (const Placed& p : log_) {
      if (p.stream == stream && p.at_ns >= from && p.at_ns < to) out.push_back(p);
    }
    return out;
  }

 private:
  enum Kind { kStart = 0, kFinish = 1, kNext = 2 };
  using Event = std::tuple<int64_t, uint64_t, int, uint64_t, int>;  // when, seq, kind, ticket, stream

  void Push(int64_t when, int kind, uint64_t ticket, int stream) {
    events_.emplace(when, seq_++, kind, ticket, stream);
  }

  Decision Launch(int v, uint64_t exec, const Profile& profile, const std::vector<Input>& inputs,
                  int64_t true_ns, int stream) {
    Request r;
    r.virtual_device = v;
    r.executable_id = exec;
    r.profile = &profile;
    r.inputs = inputs.data();
    r.num_inputs = inputs.size();
    r.now_ns = now_;
    Decision d;
    const Status st = core_.Place(r, &d);
    EXPECT_TRUE(st.ok()) << st.message();
    const int dev = d.physical_device;
    const int64_t mig = static_cast<int64_t>(static_cast<double>(d.migrate_bytes) / link_ * 1e9);
    const int64_t start = std::max(now_ + mig, free_[dev]);
    free_[dev] = start + true_ns;
    device_of_[d.ticket] = dev;
    Push(start, kStart, d.ticket, stream);
    Push(start + true_ns, kFinish, d.ticket, stream);
    log_.push_back(Placed{now_, v, profile.phase, d, stream});
    return d;
  }

  Core& core_;
  double link_;
  int64_t now_ = 0;
  uint64_t seq_ = 0;
  std::vector<int64_t> free_;
  std::vector<bool> failing_;
  std::vector<Stream> streams_;
  std::vector<Placed> log_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> events_;
  std::map<uint64_t, int> device_of_;
};

}  // namespace flexnpu::placement::testing

#endif  // FLEXNPU_TESTS_CPP_PLACEMENT_SIM_H_
