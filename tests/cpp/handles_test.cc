#include "pjrt_flexnpu/runtime/handles.h"

#include <gtest/gtest.h>

#include <memory>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/runtime/device.h"
#include "pjrt_flexnpu/runtime/error.h"
#include "pjrt_flexnpu/runtime/event.h"

namespace flexnpu {
namespace {

TEST(HandlesTest, RoundTripAndWrongTypeIsRejected) {
  DeviceDescription description(3, 1, "cpu");
  PJRT_DeviceDescription* handle = ToHandle<PJRT_DeviceDescription>(&description);
  EXPECT_EQ(FromHandle<DeviceDescription>(handle), &description);
  // The same pointer viewed as another handle type is not accepted.
  EXPECT_EQ(FromHandle<Topology>(reinterpret_cast<PJRT_TopologyDescription*>(handle)), nullptr);
  EXPECT_EQ(FromHandle<DeviceDescription>(static_cast<PJRT_DeviceDescription*>(nullptr)), nullptr);
}

TEST(HandlesTest, ForeignMemoryIsRejected) {
  uint64_t foreign[4] = {0x1234, 0, 0, 0};
  EXPECT_EQ(FromHandle<DeviceDescription>(reinterpret_cast<PJRT_DeviceDescription*>(foreign)),
            nullptr);
}

TEST(HandlesTest, DescriptionSaysVirtualAndNamesItsPhysicalDevice) {
  DeviceDescription description(5, 1, "cpu");
  EXPECT_EQ(description.id(), 5);
  EXPECT_EQ(description.kind(), "virtual NPU");
  EXPECT_NE(description.to_string().find("virtual NPU over cpu:1"), std::string::npos);
  ASSERT_EQ(description.attributes().size(), 2u);
  EXPECT_EQ(description.attributes()[0].int64_value, 1);
}

TEST(MemoryStatsTest, TracksInUsePeakAndLargest) {
  MemoryStats stats;
  stats.Add(100);
  stats.Add(300);
  stats.Remove(100);
  EXPECT_EQ(stats.bytes_in_use(), 300);
  EXPECT_EQ(stats.peak_bytes_in_use(), 400);
  EXPECT_EQ(stats.largest_alloc_size(), 300);
  EXPECT_EQ(stats.num_allocs(), 2);
}

TEST(ErrorTest, StatusBecomesPjrtErrorWithCodeAndMessage) {
  EXPECT_EQ(ToPjrtError(Status::Ok()), nullptr);
  std::unique_ptr<PJRT_Error> error(ToPjrtError(InvalidArgument("bad thing at X")));
  ASSERT_NE(error, nullptr);
  EXPECT_EQ(static_cast<int>(error->status.code()), PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_EQ(error->status.message(), "bad thing at X");
}

TEST(EventTest, ReadyEventsReportTheirStatus) {
  std::unique_ptr<Event> ok(Event::Ready(Status::Ok()));
  EXPECT_TRUE(ok->IsReady().value());
  EXPECT_TRUE(ok->Await().ok());
  std::unique_ptr<Event> failed(Event::Ready(Internal("boom")));
  EXPECT_EQ(failed->Error().message(), "boom");
  struct Seen {
    bool called = false;
    PJRT_Error_Code code = PJRT_Error_Code_OK;
  } seen;
  ASSERT_TRUE(failed
                  ->OnReady(
                      [](PJRT_Error* error, void* arg) {
                        auto* s = static_cast<Seen*>(arg);
                        s->called = true;
                        s->code = static_cast<PJRT_Error_Code>(error->status.code());
                        delete error;
                      },
                      &seen)
                  .ok());
  EXPECT_TRUE(seen.called);
  EXPECT_EQ(seen.code, PJRT_Error_Code_INTERNAL);
}

}  // namespace
}  // namespace flexnpu
