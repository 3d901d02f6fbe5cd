#include "pjrt_flexnpu/runtime/handles.h"

#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/runtime/buffer.h"
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

TEST(HandlesTest, ForeignMemoryWithAValidTagIsRejected) {
  // Not a FlexNPU object, although it starts with exactly the tag one would carry.
  uint32_t foreign[8] = {static_cast<uint32_t>(Tag::kDeviceDescription)};
  EXPECT_EQ(FromHandle<DeviceDescription>(reinterpret_cast<PJRT_DeviceDescription*>(foreign)),
            nullptr);
}

TEST(HandlesTest, DestroyedHandlesAreRejectedWithoutBeingRead) {
  auto* description = new DeviceDescription(1, 0, "cpu");
  PJRT_DeviceDescription* handle = ToHandle<PJRT_DeviceDescription>(description);
  EXPECT_EQ(FromHandle<DeviceDescription>(handle), description);
  delete description;
  // Under AddressSanitizer, reading the freed object's tag would be a heap-use-after-free.
  EXPECT_EQ(FromHandle<DeviceDescription>(handle), nullptr);
}

TEST(HandlesTest, PooledHandlesAreRecognisedByAddressAndTag) {
  // Events (like buffers) live in the handle pool, except in sanitizer builds.
  uint32_t foreign[16] = {static_cast<uint32_t>(Tag::kEvent)};
  EXPECT_EQ(FromHandle<Event>(reinterpret_cast<PJRT_Event*>(foreign)), nullptr);
  Event* event = Event::Ready(Status::Ok());
  PJRT_Event* handle = ToHandle<PJRT_Event>(event);
  EXPECT_EQ(FromHandle<Event>(handle), event);
  EXPECT_EQ(FromHandle<VirtualBuffer>(reinterpret_cast<PJRT_Buffer*>(handle)), nullptr);
  // An address inside the object is not a handle.
  EXPECT_EQ(FromHandle<Event>(reinterpret_cast<PJRT_Event*>(reinterpret_cast<char*>(handle) + 8)),
            nullptr);
  delete event;
  EXPECT_EQ(FromHandle<Event>(handle), nullptr);
}

TEST(HandlesTest, LiveSetSurvivesChurn) {
  std::vector<std::unique_ptr<Event>> events;
  for (int round = 0; round < 20; ++round) {
    for (int i = 0; i < 500; ++i) events.emplace_back(Event::Ready(Status::Ok()));
    std::vector<PJRT_Event*> gone;
    for (size_t i = 0; i < events.size(); i += 2) gone.push_back(ToHandle<PJRT_Event>(events[i].get()));
    std::vector<std::unique_ptr<Event>> kept;
    for (size_t i = 1; i < events.size(); i += 2) kept.push_back(std::move(events[i]));
    events = std::move(kept);  // the even ones are destroyed here
    for (const auto& event : events) {
      ASSERT_EQ(FromHandle<Event>(ToHandle<PJRT_Event>(event.get())), event.get());
    }
    for (PJRT_Event* handle : gone) {
      // The address may have been reused by a live event of this round: then it resolves.
      Event* found = FromHandle<Event>(handle);
      bool reused = false;
      for (const auto& event : events) reused |= ToHandle<PJRT_Event>(event.get()) == handle;
      ASSERT_EQ(found != nullptr, reused);
    }
  }
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
