// The placement policies behind one interface: Core::Place prepares a PlaceInput under the
// Core's lock and calls the function of the policy in force (a switch, no virtual call on the
// dispatch path); the policy reads the state and the cost model (core_state.h) and returns the
// device and the reason, which Core then commits. Each policy is one file; placement.h
// describes what they decide. Private to placement/.
#ifndef FLEXNPU_PLACEMENT_POLICIES_H_
#define FLEXNPU_PLACEMENT_POLICIES_H_

#include <cstdint>

#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement {

struct CoreState;

// The request being placed, as every policy sees it.
struct PlaceInput {
  int virtual_device = 0;
  int home = 0;       // virtual_device mod P
  int preferred = 0;  // holds most located input bytes, else the last device, else home
  Phase phase = Phase::kSmall;
  int64_t now = 0;
  double c0 = 0;       // flops times the executable's correction
  double m0 = 0;       // bytes accessed times the executable's correction
  double located = 0;  // bytes of the inputs that live on one device
};

struct Choice {
  int device = -1;
  Reason reason = Reason::kPassthrough;
};

// Called under the Core's lock; s.on (located input bytes per device), s.need (memory) and
// s.request_weight describe the request too. Core commits the choice (queue, ticket, counters).
Choice PlacePassthrough(const PlaceInput& in, CoreState& s);     // passthrough.cc
Choice PlaceStaticPd(const PlaceInput& in, CoreState& s);        // static_pd.cc
Choice PlaceStaticColocate(const PlaceInput& in, CoreState& s);  // static_colocate.cc
Choice PlaceDynamic(const PlaceInput& in, CoreState& s);         // dynamic.cc

}  // namespace flexnpu::placement

#endif  // FLEXNPU_PLACEMENT_POLICIES_H_
