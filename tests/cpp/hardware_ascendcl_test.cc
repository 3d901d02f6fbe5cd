// AscendCL through the fake libascendcl.so: discovery, ASCEND_RT_VISIBLE_DEVICES, binding,
// telemetry, and every failure as a Status that names library, call, code and message.
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <fstream>

#include "pjrt_flexnpu/hardware/hardware.h"
#include "tests/fakes/fakes.h"

namespace flexnpu::hardware {
namespace {

using testing::FakeAcl;
using testing::FakeDcmi;
using testing::FakeFunction;
using testing::FakeOptions;
using testing::FakePath;
using testing::ScriptedHardware;

constexpr const char* kFourNpus =
    "devices=4;soc=Ascend910B2;memory_total=68719476736;memory_free=60000000000;"
    "memory_free.2=1000;aicores=24;cube=30;vector=10;memutil=40;cube.3=-1;vector.3=-1";

StatusOr<std::unique_ptr<TelemetrySource>> OpenFake(SourceOptions options = FakeOptions()) {
  return OpenAscendCl(options);
}

TEST(AscendClTest, DiscoversDevicesNamesPresetsMemoryAndUtilisation) {
  ScriptedHardware hw(kFourNpus, "");
  auto source = OpenFake();
  ASSERT_TRUE(source.ok()) << source.status().message();
  EXPECT_EQ((*source)->kind(), SourceKind::kAscendCl);
  EXPECT_NE((*source)->library().find(FakeAcl()), std::string::npos) << (*source)->library();
  ASSERT_EQ((*source)->device_count(), 4);
  auto d0 = (*source)->Describe(0);
  ASSERT_TRUE(d0.ok()) << d0.status().message();
  EXPECT_EQ(d0->name, "Ascend910B2");
  EXPECT_EQ(d0->preset, "ascend910b");
  EXPECT_EQ(d0->ai_cores, 24);
  EXPECT_EQ(d0->physical_index, 0);
  EXPECT_EQ(d0->sample.memory_total_bytes, 68719476736);
  EXPECT_EQ(d0->sample.memory_free_bytes, 60000000000);
  EXPECT_EQ(d0->sample.utilization.cube, 30);
  EXPECT_EQ(d0->sample.utilization.vector, 10);
  EXPECT_EQ(d0->sample.utilization.compute, 30);
  EXPECT_EQ(d0->sample.utilization.memory, 40);
  auto d2 = (*source)->Read(2);
  ASSERT_TRUE(d2.ok());
  EXPECT_EQ(d2->memory_free_bytes, 1000);
}

TEST(AscendClTest, UtilisationMinusOneIsUnsupportedNotAnError) {
  ScriptedHardware hw(kFourNpus, "");
  auto source = OpenFake();
  ASSERT_TRUE(source.ok());
  auto d3 = (*source)->Read(3);
  ASSERT_TRUE(d3.ok()) << d3.status().message();
  EXPECT_EQ(d3->utilization.cube, kUnsupported);
  EXPECT_EQ(d3->utilization.vector, kUnsupported);
  EXPECT_EQ(d3->utilization.compute, kUnsupported);
  EXPECT_EQ(d3->memory_free_bytes, 60000000000);  // memory still read
}

TEST(AscendClTest, VisibleDevicesRemapLogicalToPhysical) {
  ScriptedHardware hw(kFourNpus, "");
  setenv("ASCEND_RT_VISIBLE_DEVICES", "2,3", 1);
  auto source = OpenFake();
  ASSERT_TRUE(source.ok()) << source.status().message();
  ASSERT_EQ((*source)->device_count(), 2);
  auto d0 = (*source)->Describe(0);
  ASSERT_TRUE(d0.ok());
  EXPECT_EQ(d0->index, 0);
  EXPECT_EQ(d0->physical_index, 2);
  EXPECT_EQ(d0->sample.memory_free_bytes, 1000);  // physical 2's memory
  auto d1 = (*source)->Describe(1);
  ASSERT_TRUE(d1.ok());
  EXPECT_EQ(d1->physical_index, 3);
  EXPECT_EQ(d1->sample.utilization.compute, kUnsupported);
}

TEST(AscendClTest, MalformedVisibleDevicesIsAnErrorNamingTheVariable) {
  ScriptedHardware hw(kFourNpus, "");
  setenv("ASCEND_RT_VISIBLE_DEVICES", "0,x", 1);
  auto source = OpenFake();
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), Code::kInvalidArgument);
  EXPECT_NE(source.status().message().find("ASCEND_RT_VISIBLE_DEVICES='0,x'"), std::string::npos)
      << source.status().message();
  EXPECT_NE(source.status().message().find("'x' is not a device id"), std::string::npos);
}

TEST(AscendClTest, BindingSetsTheDeviceUntilUnbindOrDestruction) {
  ScriptedHardware hw(kFourNpus, "");
  auto* ref_count = FakeFunction<int(int32_t)>(FakeAcl(), "FakeAcl_RefCount");
  auto* init_count = FakeFunction<int()>(FakeAcl(), "FakeAcl_InitCount");
  ASSERT_NE(ref_count, nullptr);
  ASSERT_NE(init_count, nullptr);
  {
    auto source = OpenFake();
    ASSERT_TRUE(source.ok());
    EXPECT_EQ(init_count(), 1);
    ASSERT_TRUE((*source)->Bind(1).ok());
    ASSERT_TRUE((*source)->Bind(1).ok());  // no second reference
    EXPECT_TRUE((*source)->bound(1));
    EXPECT_EQ(ref_count(1), 1);
    ASSERT_TRUE((*source)->Read(1).ok());  // set + reset around aclrtGetMemInfo
    EXPECT_EQ(ref_count(1), 1);
    ASSERT_TRUE((*source)->Bind(3).ok());
    ASSERT_TRUE((*source)->Unbind(1).ok());
    EXPECT_FALSE((*source)->bound(1));
    EXPECT_EQ(ref_count(1), 0);
    EXPECT_EQ(ref_count(3), 1);
    auto out_of_range = (*source)->Bind(4);
    EXPECT_EQ(out_of_range.code(), Code::kInvalidArgument);
    EXPECT_NE(out_of_range.message().find("AscendCL device 4 out of range [0, 4)"),
              std::string::npos);
  }
  EXPECT_EQ(ref_count(3), 0);  // reset by the destructor
  EXPECT_EQ(init_count(), 0);  // aclFinalize
}

TEST(AscendClTest, SetDeviceFailureCarriesCodeAndRecentErrorMessage) {
  ScriptedHardware hw(std::string(kFourNpus) +
                          ";error.aclrtSetDevice=207001;message.aclrtSetDevice=EE9999 device busy",
                      "");
  auto source = OpenFake();
  ASSERT_TRUE(source.ok());
  Status s = (*source)->Bind(0);
  EXPECT_EQ(s.code(), Code::kResourceExhausted);  // 2xxxxx: resource class
  EXPECT_NE(s.message().find("aclrtSetDevice(0) failed with ACL error 207001: EE9999 device busy"),
            std::string::npos)
      << s.message();
  EXPECT_NE(s.message().find(FakeAcl()), std::string::npos);
}

TEST(AscendClTest, AclInitErrorHasCodeAndMessage) {
  ScriptedHardware hw(std::string(kFourNpus) +
                          ";error.aclInit=500002;message.aclInit=EH9999 driver not ready",
                      "");
  auto source = OpenFake();
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), Code::kInternal);
  const std::string& m = source.status().message();
  EXPECT_NE(m.find("AscendCL (libascendcl.so at " + FakeAcl() + "): aclInit failed with ACL "
                   "error 500002: EH9999 driver not ready"),
            std::string::npos)
      << m;
}

TEST(AscendClTest, MissingLibraryNamesWhatWasTriedAndTheOption) {
  ScriptedHardware hw(kFourNpus, "");
  SourceOptions options = FakeOptions();
  options.ascendcl_library = FakePath("nowhere/libascendcl.so");
  auto source = OpenFake(options);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), Code::kNotFound);
  EXPECT_NE(source.status().message().find(FakePath("nowhere/libascendcl.so")), std::string::npos);
  EXPECT_NE(source.status().message().find("FLEXNPU_ASCENDCL_LIBRARY"), std::string::npos);
}

TEST(AscendClTest, DefaultSearchUsesAscendHomePath) {
  ScriptedHardware hw(kFourNpus, "");
  // A CANN-like layout: $ASCEND_HOME_PATH/lib64/libascendcl.so (a copy of the fake, so the
  // loader does not hand back the copy already loaded from the fakes' folder).
  char home[] = "/tmp/flexnpu_ascend_home_XXXXXX";
  ASSERT_NE(mkdtemp(home), nullptr);
  const std::string lib64 = std::string(home) + "/lib64";
  ASSERT_EQ(mkdir(lib64.c_str(), 0755), 0);
  {
    std::ifstream in(FakeAcl(), std::ios::binary);
    std::ofstream out(lib64 + "/libascendcl.so", std::ios::binary);
    out << in.rdbuf();
  }
  SourceOptions options = FakeOptions();
  options.ascendcl_library.clear();
  options.env = [&](const char* name) -> std::optional<std::string> {
    if (std::string(name) == "ASCEND_HOME_PATH") return std::string(home);
    return std::nullopt;
  };
  auto source = OpenFake(options);
  ASSERT_TRUE(source.ok()) << source.status().message();
  EXPECT_EQ((*source)->library(), "libascendcl.so at " + lib64 + "/libascendcl.so");
  EXPECT_EQ((*source)->device_count(), 4);
  source = Status(Code::kCancelled, "closed");
  std::remove((lib64 + "/libascendcl.so").c_str());
  rmdir(lib64.c_str());
  rmdir(home);
}

TEST(AscendClTest, MissingRequiredSymbolIsAnError) {
  ScriptedHardware hw(kFourNpus, "");
  SourceOptions options = FakeOptions();
  options.ascendcl_library = FakePath("ascendcl_no_meminfo/libascendcl.so");
  auto source = OpenFake(options);
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(source.status().message().find("missing symbol(s) aclrtGetMemInfo"), std::string::npos)
      << source.status().message();
}

TEST(AscendClTest, MissingUtilisationCallFallsBackToDcmiOrUnsupported) {
  ScriptedHardware hw(std::string(kFourNpus) + ";dcmi_aicore.1=77", "");
  SourceOptions options = FakeOptions();
  options.ascendcl_library = FakePath("ascendcl_no_util/libascendcl.so");
  {
    auto source = OpenFake(options);  // no DCMI either: unsupported, with a note
    ASSERT_TRUE(source.ok()) << source.status().message();
    auto d1 = (*source)->Read(1);
    ASSERT_TRUE(d1.ok());
    EXPECT_EQ(d1->utilization.compute, kUnsupported);
    EXPECT_EQ(d1->memory_free_bytes, 60000000000);
    ASSERT_EQ((*source)->notes().size(), 1u);
    EXPECT_NE((*source)->notes()[0].find("no aclrtGetDeviceUtilizationRate"), std::string::npos);
  }
  options.dcmi_library = FakeDcmi();
  auto source = OpenFake(options);
  ASSERT_TRUE(source.ok()) << source.status().message();
  auto d1 = (*source)->Read(1);
  ASSERT_TRUE(d1.ok());
  EXPECT_EQ(d1->utilization.compute, 77);  // DCMI AI core
  auto d0 = (*source)->Read(0);
  ASSERT_TRUE(d0.ok());
  EXPECT_EQ(d0->utilization.compute, kUnsupported);  // DCMI has none for 0 either
}

TEST(AscendClTest, ZeroDevicesOpensWithNothingToDescribe) {
  ScriptedHardware hw("devices=0;soc=Ascend910B2", "");
  auto source = OpenFake();
  ASSERT_TRUE(source.ok()) << source.status().message();
  EXPECT_EQ((*source)->device_count(), 0);
  auto d = (*source)->Describe(0);
  EXPECT_EQ(d.status().code(), Code::kInvalidArgument);
}

TEST(AscendClTest, MemInfoFailureNamesTheCallAndDevice) {
  ScriptedHardware hw(std::string(kFourNpus) +
                          ";error.aclrtGetMemInfo=507899;message.aclrtGetMemInfo=EL0004 hbm",
                      "");
  auto source = OpenFake();
  ASSERT_TRUE(source.ok());
  auto* ref_count = FakeFunction<int(int32_t)>(FakeAcl(), "FakeAcl_RefCount");
  auto d = (*source)->Read(1);
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find(
                "aclrtGetMemInfo(ACL_HBM_MEM) on device 1 failed with ACL error 507899: EL0004 hbm"),
            std::string::npos)
      << d.status().message();
  EXPECT_EQ(ref_count(1), 0);  // the device set for the call was reset again
}

TEST(AscendClTest, A3SocIs910C) {
  ScriptedHardware hw("devices=1;soc=Ascend910_9392;memory_total=100", "");
  auto source = OpenFake();
  ASSERT_TRUE(source.ok());
  auto d = (*source)->Describe(0);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->preset, "ascend910c");
}

}  // namespace
}  // namespace flexnpu::hardware
