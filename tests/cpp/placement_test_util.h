// Shared by the placement core tests that script requests on a fake clock.
#ifndef FLEXNPU_TESTS_CPP_PLACEMENT_TEST_UTIL_H_
#define FLEXNPU_TESTS_CPP_PLACEMENT_TEST_UTIL_H_

#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "pjrt_flexnpu/placement/placement.h"

namespace flexnpu::placement {

// Places one execution of `exec` for virtual device `v` at `now`, serving `weight` sequences;
// a failed placement fails the test.
inline Decision Place(Core& core, int v, const Profile& p, std::vector<Input> inputs,
                      int64_t now, double weight, uint64_t exec) {
  Request r{v, exec, &p, inputs.data(), inputs.size(), now};
  r.weight = weight;
  Decision d;
  const Status s = core.Place(r, &d);
  EXPECT_TRUE(s.ok()) << s.message();
  return d;
}

}  // namespace flexnpu::placement

#endif  // FLEXNPU_TESTS_CPP_PLACEMENT_TEST_UTIL_H_
