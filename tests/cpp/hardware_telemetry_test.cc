// Source selection (auto / explicit / none), the preset table, option parsing and the
// background sampler, against the fake libraries.
#include <gtest/gtest.h>
#include <pthread.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <vector>

#include "pjrt_flexnpu/hardware/hardware.h"
#include "tests/fakes/fakes.h"

namespace flexnpu::hardware {
namespace {

using testing::FakeOptions;
using testing::FakePath;
using testing::ScriptedHardware;

constexpr const char* kTwoNpus =
    "devices=2;soc=Ascend910B3;memory_total=1000;memory_free=900;cube=10;vector=5";
constexpr const char* kOneGpu = "devices=1;name.0=NVIDIA A100-SXM4-80GB;memory_total=80;gpu_util=7";

TEST(PresetTest, OneTableForAscendAndNvidiaNames) {
  EXPECT_EQ(PresetForName("Ascend910B1"), "ascend910b");
  EXPECT_EQ(PresetForName("Ascend910B2"), "ascend910b");
  EXPECT_EQ(PresetForName("Ascend910B2C"), "ascend910b");
  EXPECT_EQ(PresetForName("ascend910b4"), "ascend910b");
  EXPECT_EQ(PresetForName("Ascend910_9391"), "ascend910c");
  EXPECT_EQ(PresetForName("Ascend910_9382"), "ascend910c");
  EXPECT_EQ(PresetForName("NVIDIA H100 80GB HBM3"), "h100");
  EXPECT_EQ(PresetForName("NVIDIA H200"), "h200");
  EXPECT_EQ(PresetForName("NVIDIA A100-SXM4-80GB"), "a100");
  EXPECT_EQ(PresetForName("Ascend310P3"), "");
  EXPECT_EQ(PresetForName("Ascend910A"), "");
  EXPECT_EQ(PresetForName(""), "");
}

TEST(OptionsTest, TelemetryModes) {
  EXPECT_EQ(*ParseTelemetryMode("auto"), TelemetryMode::kAuto);
  EXPECT_EQ(*ParseTelemetryMode("AscendCL"), TelemetryMode::kAscendCl);
  EXPECT_EQ(*ParseTelemetryMode(" nvml "), TelemetryMode::kNvml);
  EXPECT_EQ(*ParseTelemetryMode("none"), TelemetryMode::kNone);
  auto bad = ParseTelemetryMode("dcmi");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), Code::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("auto, ascendcl, nvml or none, got 'dcmi'"),
            std::string::npos);
}

TEST(OptionsTest, VisibleDevices) {
  EXPECT_EQ(*ParseVisibleDevices("3, 1,0"), (std::vector<int>{3, 1, 0}));
  EXPECT_TRUE(ParseVisibleDevices("")->empty());
  EXPECT_NE(ParseVisibleDevices("1,1").status().message().find("device 1 listed twice"),
            std::string::npos);
  EXPECT_NE(ParseVisibleDevices("1,,2").status().message().find("empty entry"),
            std::string::npos);
  EXPECT_NE(ParseVisibleDevices("-1").status().message().find("'-1' is not a device id"),
            std::string::npos);
}

TEST(OpenTelemetryTest, AutoPrefersAscendCl) {
  ScriptedHardware hw(kTwoNpus, kOneGpu);
  SourceOptions options = FakeOptions();
  options.backend_is_cuda = true;
  auto opened = OpenTelemetry(options);
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  ASSERT_NE(opened->source, nullptr);
  EXPECT_EQ(opened->source->kind(), SourceKind::kAscendCl);
  EXPECT_TRUE(opened->fallback.empty());
}

TEST(OpenTelemetryTest, AutoFallsBackToNvmlOnlyForCudaBackends) {
  ScriptedHardware hw(kTwoNpus, kOneGpu);
  SourceOptions options = FakeOptions();
  options.ascendcl_library = FakePath("nowhere/libascendcl.so");
  auto cpu = OpenTelemetry(options);
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(cpu->source, nullptr);
  EXPECT_NE(cpu->fallback.find("telemetry auto: none (AscendCL: libascendcl.so could not be "
                               "loaded"),
            std::string::npos)
      << cpu->fallback;
  EXPECT_TRUE(cpu->nothing_installed);  // no library at all: the quiet case
  options.backend_is_cuda = true;
  auto cuda = OpenTelemetry(options);
  ASSERT_TRUE(cuda.ok());
  ASSERT_NE(cuda->source, nullptr);
  EXPECT_EQ(cuda->source->kind(), SourceKind::kNvml);
  EXPECT_NE(cuda->fallback.find("telemetry auto: NVML"), std::string::npos);
}

TEST(OpenTelemetryTest, AutoSkipsAnAscendClWithoutDevicesOrThatFails) {
  ScriptedHardware hw("devices=0", kOneGpu);
  auto none = OpenTelemetry(FakeOptions());
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->source, nullptr);
  EXPECT_NE(none->fallback.find("AscendCL sees no devices"), std::string::npos);
  ScriptedHardware failing("devices=2;error.aclInit=500002;message.aclInit=EH0001", kOneGpu);
  auto init = OpenTelemetry(FakeOptions());
  ASSERT_TRUE(init.ok());  // auto never fails ...
  EXPECT_EQ(init->source, nullptr);
  EXPECT_NE(init->fallback.find("aclInit failed with ACL error 500002: EH0001"),
            std::string::npos)  // ... and says why, once
      << init->fallback;
  EXPECT_FALSE(init->nothing_installed);  // a library that failed: worth a log line
}

TEST(OpenTelemetryTest, ExplicitSourceFailureIsTheError) {
  ScriptedHardware hw("devices=2;error.aclInit=500002;message.aclInit=EH0001", kOneGpu);
  auto acl = OpenTelemetry(FakeOptions(TelemetryMode::kAscendCl));
  ASSERT_FALSE(acl.ok());
  EXPECT_NE(acl.status().message().find("aclInit failed with ACL error 500002: EH0001"),
            std::string::npos);
  SourceOptions options = FakeOptions(TelemetryMode::kNvml);
  options.nvml_library = FakePath("nowhere/libnvidia-ml.so.1");
  auto nvml = OpenTelemetry(options);
  ASSERT_FALSE(nvml.ok());
  EXPECT_NE(nvml.status().message().find("libnvidia-ml.so.1 could not be loaded"),
            std::string::npos);
  auto none = OpenTelemetry(FakeOptions(TelemetryMode::kNone));
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(none->source, nullptr);
  EXPECT_TRUE(none->fallback.empty());
}

TEST(SamplerTest, RejectsBadArguments) {
  auto no_source = TelemetrySampler::Start(nullptr, std::chrono::milliseconds(10));
  EXPECT_EQ(no_source.status().code(), Code::kInvalidArgument);
  ScriptedHardware hw(kTwoNpus, "");
  auto source = OpenAscendCl(FakeOptions());
  ASSERT_TRUE(source.ok());
  auto zero = TelemetrySampler::Start(std::move(*source), std::chrono::milliseconds(0));
  EXPECT_NE(zero.status().message().find("telemetry period must be > 0 ms"), std::string::npos);
}

TEST(SamplerTest, FirstRoundBeforeStartReturnsThenRefreshesFromTheScriptFile) {
  char path[] = "/tmp/flexnpu_fake_acl_XXXXXX";
  const int fd = mkstemp(path);
  ASSERT_GE(fd, 0);
  close(fd);
  const auto write = [&](const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
  };
  write(std::string(kTwoNpus) + "\nmemory_free.1=500\n");
  ScriptedHardware hw("", "");
  setenv("FLEXNPU_FAKE_ACL_FILE", path, 1);
  auto source = OpenAscendCl(FakeOptions());
  ASSERT_TRUE(source.ok()) << source.status().message();
  std::mutex mu;
  std::vector<std::vector<Sample>> seen;
  // A long period: every round after the first is one the test asks for.
  auto sampler = TelemetrySampler::Start(
      std::move(*source), std::chrono::hours(1), [&](const std::vector<Sample>& round) {
        std::lock_guard<std::mutex> lock(mu);
        seen.push_back(round);
      });
  ASSERT_TRUE(sampler.ok()) << sampler.status().message();
  EXPECT_EQ((*sampler)->rounds(), 1u);
  std::vector<Sample> latest = (*sampler)->Latest();
  ASSERT_EQ(latest.size(), 2u);
  EXPECT_EQ(latest[1].memory_free_bytes, 500);
  EXPECT_EQ(latest[0].utilization.compute, 10);

  write(std::string(kTwoNpus) + "\nmemory_free.1=0\ncube.0=95\n");
  (*sampler)->RefreshNow();
  latest = (*sampler)->Latest();
  EXPECT_EQ(latest[1].memory_free_bytes, 0);
  EXPECT_EQ(latest[0].utilization.compute, 95);
  EXPECT_EQ((*sampler)->errors(), 0u);
  {
    std::lock_guard<std::mutex> lock(mu);
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_EQ(seen[1][1].memory_free_bytes, 0);
  }

  // A failing read keeps the previous reading and reports the error.
  write(std::string(kTwoNpus) + "\nerror.aclrtGetMemInfo=507899\n");
  (*sampler)->RefreshNow();
  latest = (*sampler)->Latest();
  EXPECT_EQ(latest[1].memory_free_bytes, 0);
  EXPECT_EQ((*sampler)->errors(), 1u);
  EXPECT_NE((*sampler)->last_error().find("aclrtGetMemInfo(ACL_HBM_MEM) on device"),
            std::string::npos);
  sampler->reset();  // joins the thread
  unsetenv("FLEXNPU_FAKE_ACL_FILE");
  std::remove(path);
}

TEST(SamplerTest, SamplesPeriodicallyWithoutBeingAsked) {
  ScriptedHardware hw(kTwoNpus, "");
  auto source = OpenAscendCl(FakeOptions());
  ASSERT_TRUE(source.ok());
  auto sampler = TelemetrySampler::Start(std::move(*source), std::chrono::milliseconds(1));
  ASSERT_TRUE(sampler.ok());
  // Liveness only (no timing assert): rounds keep coming without RefreshNow.
  for (int i = 0; i < 10000 && (*sampler)->rounds() < 3; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_GE((*sampler)->rounds(), 3u);
}

TEST(SamplerTest, ItsThreadIsNamed) {
  ScriptedHardware hw(kTwoNpus, "");
  auto source = OpenAscendCl(FakeOptions());
  ASSERT_TRUE(source.ok());
  std::mutex mu;
  std::string name;
  auto sampler = TelemetrySampler::Start(std::move(*source), std::chrono::milliseconds(1000),
                                         [&](const std::vector<Sample>&) {
                                           char buf[16] = {};
                                           pthread_getname_np(pthread_self(), buf, sizeof buf);
                                           std::lock_guard<std::mutex> lock(mu);
                                           name = buf;
                                         });
  ASSERT_TRUE(sampler.ok());  // the first round ran on the sampler thread before Start returned
  std::lock_guard<std::mutex> lock(mu);
  EXPECT_EQ(name, "flexnpu-telem");
}

}  // namespace
}  // namespace flexnpu::hardware
