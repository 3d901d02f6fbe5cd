#include "pjrt_flexnpu/runtime/handles.h"

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "pjrt_c_api.h"
#include "pjrt_flexnpu/c_api/error.h"
#include "pjrt_flexnpu/runtime/buffer.h"
#include "pjrt_flexnpu/runtime/device.h"
#include "pjrt_flexnpu/runtime/event.h"

namespace flexnpu {
namespace {

TEST(HandlesTest, RoundTripAndWrongTypeIsRejected) {
  DeviceDescription description(3, 1, "cpu", "virtual NPU");
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
  auto* description = new DeviceDescription(1, 0, "cpu", "virtual NPU");
  PJRT_DeviceDescription* handle = ToHandle<PJRT_DeviceDescription>(description);
  EXPECT_EQ(FromHandle<DeviceDescription>(handle), description);
  delete description;
  // Under AddressSanitizer, reading the freed object's tag would be a heap-use-after-free.
  EXPECT_EQ(FromHandle<DeviceDescription>(handle), nullptr);
}

// A handle resolved on one thread (so in that thread's lookup cache) and then destroyed on
// another is rejected on the first one afterwards, and a new object at the same address is
// found again.
TEST(HandlesTest, AHandleDestroyedOnAnotherThreadIsRejectedWhereItWasResolvedBefore) {
  // Storage of the test's own, so that the same address can hold a new object afterwards.
  alignas(DeviceDescription) unsigned char storage[sizeof(DeviceDescription)];
  auto* description = new (storage) DeviceDescription(1, 0, "cpu", "virtual NPU");
  PJRT_DeviceDescription* handle = ToHandle<PJRT_DeviceDescription>(description);
  std::mutex mu;
  std::condition_variable cv;
  int step = 0;
  std::thread destroyer([&] {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return step == 1; });
    description->~DeviceDescription();
    step = 2;
    cv.notify_all();
  });
  for (int i = 0; i < 3; ++i) EXPECT_EQ(FromHandle<DeviceDescription>(handle), description);
  {
    std::unique_lock<std::mutex> lock(mu);
    step = 1;
    cv.notify_all();
    cv.wait(lock, [&] { return step == 2; });
  }
  destroyer.join();
  EXPECT_EQ(FromHandle<DeviceDescription>(handle), nullptr);
  auto* again = new (storage) DeviceDescription(2, 0, "cpu", "virtual NPU");
  EXPECT_EQ(FromHandle<DeviceDescription>(handle), again);
  again->~DeviceDescription();
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

// Events made and destroyed on several threads at once (as executions create them and backend
// threads free them): no live handle is handed out twice, and each stays resolvable while it
// lives. Exercises the pool's lock-free free stacks (plain new/delete in sanitizer builds).
TEST(HandlesTest, ConcurrentChurnNeverHandsOutALiveSlotTwice) {
  constexpr int kThreads = 4;
  constexpr int kRounds = 2000;
  constexpr int kBatch = 16;
  std::mutex mu;
  std::set<const void*> live;
  std::atomic<int> duplicates{0}, unresolved{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&] {
      for (int round = 0; round < kRounds; ++round) {
        Event* batch[kBatch];
        for (Event*& event : batch) {
          event = Event::Ready(Status::Ok());
          std::lock_guard<std::mutex> lock(mu);
          if (!live.insert(event).second) ++duplicates;
        }
        for (Event* event : batch) {
          if (FromHandle<Event>(ToHandle<PJRT_Event>(event)) != event) ++unresolved;
          {
            std::lock_guard<std::mutex> lock(mu);
            live.erase(event);
          }
          delete event;
        }
      }
    });
  }
  for (auto& thread : threads) thread.join();
  EXPECT_EQ(duplicates.load(), 0);
  EXPECT_EQ(unresolved.load(), 0);
}

// Per-execution records share the pool with handles: a stale handle whose slot now holds a
// record is still rejected (the record's slot starts with a word no tag equals).
TEST(HandlesTest, ARecordInAFormerHandleSlotIsNotAHandle) {
  if (!handle_pool::kEnabled) GTEST_SKIP() << "sanitizer build: no handle pool";
  // A record as large as an event, filled with the event tag: in an event-sized slot.
  struct LooksLikeAnEvent {
    uint32_t words[(sizeof(Event) - handle_pool::kRecordHeader) / 4];
  };
  std::vector<LooksLikeAnEvent*> records;
  for (int i = 0; i < 64; ++i) {
    auto* record = handle_pool::New<LooksLikeAnEvent>();
    for (uint32_t& word : record->words) word = static_cast<uint32_t>(Tag::kEvent);
    records.push_back(record);
    auto* slot = reinterpret_cast<PJRT_Event*>(reinterpret_cast<char*>(record) -
                                               handle_pool::kRecordHeader);
    EXPECT_EQ(FromHandle<Event>(slot), nullptr);
    EXPECT_EQ(FromHandle<Event>(reinterpret_cast<PJRT_Event*>(record)), nullptr);
  }
  for (auto* record : records) handle_pool::Delete(record);
}

TEST(HandlesTest, DescriptionSaysVirtualAndNamesItsPhysicalDevice) {
  DeviceDescription description(5, 1, "cpu", "virtual NPU");
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
                      c_api::DeliverOnReady,
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

// A backend whose events fail with "boom" (DATA_LOSS), complete or not when OnReady is asked.
namespace failing_events {
struct FakeEvent {
  bool ready;
};
int on_ready_calls = 0;
PJRT_Error* const kBoom = reinterpret_cast<PJRT_Error*>(&on_ready_calls);  // never read
PJRT_Error* IsReady(PJRT_Event_IsReady_Args* args) {
  args->is_ready = reinterpret_cast<FakeEvent*>(args->event)->ready;
  return nullptr;
}
PJRT_Error* Error(PJRT_Event_Error_Args*) { return kBoom; }
PJRT_Error* OnReady(PJRT_Event_OnReady_Args* args) {
  ++on_ready_calls;
  args->callback(kBoom, args->user_arg);  // as if it completed later, on a backend thread
  return nullptr;
}
PJRT_Error* Destroy(PJRT_Event_Destroy_Args*) { return nullptr; }
void ErrorDestroy(PJRT_Error_Destroy_Args*) {}
void ErrorMessage(PJRT_Error_Message_Args* args) {
  args->message = "boom";
  args->message_size = 4;
}
PJRT_Error* ErrorGetCode(PJRT_Error_GetCode_Args* args) {
  args->code = PJRT_Error_Code_DATA_LOSS;
  return nullptr;
}
PJRT_Api MakeApi() {
  PJRT_Api api{};
  api.struct_size = sizeof(PJRT_Api);
  api.PJRT_Event_IsReady = IsReady;
  api.PJRT_Event_Error = Error;
  api.PJRT_Event_OnReady = OnReady;
  api.PJRT_Event_Destroy = Destroy;
  api.PJRT_Error_Destroy = ErrorDestroy;
  api.PJRT_Error_Message = ErrorMessage;
  api.PJRT_Error_GetCode = ErrorGetCode;
  return api;
}
}  // namespace failing_events

// An inner event that already failed reaches the OnReady callback inline, without registering
// with the backend, with the same code and message as one that fails after OnReady.
TEST(EventTest, OnReadyPassesTheInnerErrorAlikeWhetherOrNotTheEventIsComplete) {
  static const PJRT_Api api = failing_events::MakeApi();
  auto backend = PhysicalBackend::FromApi(&api, "fake");
  struct Seen {
    int calls = 0;
    PJRT_Error_Code code = PJRT_Error_Code_OK;
    std::string message;
  };
  auto on_ready = [](PJRT_Error* error, void* arg) {
    auto* seen = static_cast<Seen*>(arg);
    ++seen->calls;
    ASSERT_NE(error, nullptr);
    seen->code = static_cast<PJRT_Error_Code>(error->status.code());
    seen->message = error->status.message();
    delete error;
  };
  for (bool ready : {true, false}) {
    failing_events::FakeEvent inner{ready};
    failing_events::on_ready_calls = 0;
    std::unique_ptr<Event> event(
        Event::Wrap(*backend, reinterpret_cast<PJRT_Event*>(&inner)));
    Seen seen;
    ASSERT_TRUE(event->OnReady(c_api::DeliverOnReady, on_ready, &seen).ok());
    EXPECT_EQ(seen.calls, 1) << "ready " << ready;
    EXPECT_EQ(seen.code, PJRT_Error_Code_DATA_LOSS) << "ready " << ready;
    EXPECT_EQ(seen.message, "physical backend: PJRT_Event: boom") << "ready " << ready;
    EXPECT_EQ(failing_events::on_ready_calls, ready ? 0 : 1) << "ready " << ready;
  }
}

// A callback that throws (issue 13 defect 11) runs exactly once and the throw stops in
// FlexNPU on every path: the inline one of a complete inner event, the inner plugin's callback
// (here inline inside the fake's OnReady, as on a backend thread), and a ready-made event.
// OnReady still succeeds: an error after the callback ran would tell the caller that it was
// never registered (JAX would free its state twice).
TEST(EventTest, AThrowingOnReadyCallbackRunsOnceAndTheThrowStopsInFlexNpu) {
  static const PJRT_Api api = failing_events::MakeApi();
  auto backend = PhysicalBackend::FromApi(&api, "fake");
  static int calls = 0;
  auto throwing = [](PJRT_Error* error, void*) {
    ++calls;
    delete error;
    throw std::runtime_error("callback threw");
  };
  for (bool ready : {true, false}) {
    failing_events::FakeEvent inner{ready};
    failing_events::on_ready_calls = 0;
    calls = 0;
    std::unique_ptr<Event> event(
        Event::Wrap(*backend, reinterpret_cast<PJRT_Event*>(&inner)));
    Status status = Status::Ok();
    EXPECT_NO_THROW(status = event->OnReady(c_api::DeliverOnReady, throwing, nullptr)) << "ready " << ready;
    EXPECT_TRUE(status.ok()) << "ready " << ready << ": " << status.message();
    EXPECT_EQ(calls, 1) << "ready " << ready;
    EXPECT_EQ(failing_events::on_ready_calls, ready ? 0 : 1) << "ready " << ready;
  }
  for (Status made : {Status::Ok(), Internal("boom")}) {
    calls = 0;
    std::unique_ptr<Event> event(Event::Ready(made));
    Status status = Status::Ok();
    EXPECT_NO_THROW(status = event->OnReady(c_api::DeliverOnReady, throwing, nullptr));
    EXPECT_TRUE(status.ok()) << status.message();
    EXPECT_EQ(calls, 1);
  }
}

}  // namespace
}  // namespace flexnpu
