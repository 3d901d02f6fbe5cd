// The trace timeline: an execution's event arrives from its completion callback, possibly after
// the program saw its outputs; ChromeJson waits for executions begun while tracing.
#include "pjrt_flexnpu/runtime/trace.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>

#include "pjrt_flexnpu/runtime/placer.h"

namespace flexnpu {
namespace {

TraceEvent Execution(int64_t start_ns) {
  TraceEvent event;
  event.phase = "decode";
  event.start_ns = start_ns;
  event.end_ns = start_ns + 1000;
  return event;
}

size_t Count(const std::string& json, const std::string& needle) {
  size_t n = 0;
  for (size_t at = json.find(needle); at != std::string::npos; at = json.find(needle, at + 1)) ++n;
  return n;
}

TEST(TraceTest, JsonWaitsForAnExecutionFinishingLater) {
  Trace trace;
  trace.Start();
  trace.BeginExecution();
  const int64_t start = Placer::NowNs();
  std::thread callback([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
    trace.FinishExecution(Execution(start));
  });
  const std::string json = trace.ChromeJson(1, "t");
  callback.join();
  EXPECT_EQ(Count(json, "\"cat\":\"decode\""), 1u) << json;
  EXPECT_NE(json.find("\"unfinished_executions\":0"), std::string::npos) << json;
}

TEST(TraceTest, AbandonedExecutionDoesNotHoldTheJson) {
  Trace trace;
  trace.Start();
  trace.BeginExecution();
  trace.AbandonExecution();
  const std::string json = trace.ChromeJson(1, "t");
  EXPECT_NE(json.find("\"unfinished_executions\":0"), std::string::npos) << json;
  EXPECT_EQ(Count(json, "\"cat\":\"decode\""), 0u);
}

TEST(TraceTest, UnfinishedExecutionIsReportedAfterTheTimeout) {
  Trace trace;
  trace.Start();
  trace.BeginExecution();
  const std::string json = trace.ChromeJson(1, "t");
  EXPECT_NE(json.find("\"unfinished_executions\":1"), std::string::npos) << json;
  trace.AbandonExecution();
}

TEST(TraceTest, EventsFromBeforeStartAreNotRecorded) {
  Trace trace;
  const int64_t before = Placer::NowNs();
  trace.Start();
  trace.Record(Execution(before - 1));
  trace.Record(Execution(Placer::NowNs()));
  EXPECT_EQ(Count(trace.ChromeJson(1, "t"), "\"cat\":\"decode\""), 1u);
}

TEST(TraceTest, EveryDeviceNamesItsExecutionAndMigrationTracks) {
  Trace trace;
  trace.Start();
  const std::string json = trace.ChromeJson(2, "t");
  EXPECT_EQ(Count(json, "\"name\":\"thread_name\""), 4u) << json;
  const std::string executions = R"("pid":1,"tid":0,"args":{"name":"executions"})";
  const std::string migrations = R"("pid":1,"tid":1,"args":{"name":"migrations"})";
  EXPECT_NE(json.find(executions), std::string::npos) << json;
  EXPECT_NE(json.find(migrations), std::string::npos) << json;
}

}  // namespace
}  // namespace flexnpu
