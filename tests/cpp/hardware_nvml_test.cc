// NVML through the fake libnvidia-ml.so.1 and libcuda.so.1: CUDA ordinals matched to NVML
// devices by PCI bus id, memory and utilisation, and failures as clear Statuses.
#include <gtest/gtest.h>

#include "pjrt_flexnpu/hardware/hardware.h"
#include "tests/fakes/fakes.h"

namespace flexnpu::hardware {
namespace {

using testing::FakeNvml;
using testing::FakeOptions;
using testing::FakePath;
using testing::ScriptedHardware;

// NVML index 0 is the H100 on bus 0x3B, index 1 the H200 on 0x1A; CUDA ordinal 0 is the H200.
constexpr const char* kTwoGpus =
    "devices=2;name.0=NVIDIA H100 80GB HBM3;bus.0=00000000:3B:00.0;"
    "name.1=NVIDIA H200;bus.1=00000000:1A:00.0;cuda_order=1,0;"
    "memory_total=150000000000;memory_free.0=1000;memory_free.1=140000000000;"
    "gpu_util.0=55;mem_util.0=20;gpu_util.1=-1";

TEST(NvmlTest, CudaOrdinalsMatchNvmlDevicesByBusId) {
  ScriptedHardware hw("", kTwoGpus);
  auto source = OpenNvml(FakeOptions());
  ASSERT_TRUE(source.ok()) << source.status().message();
  ASSERT_EQ((*source)->device_count(), 2);
  EXPECT_TRUE((*source)->notes().empty());
  auto d0 = (*source)->Describe(0);
  ASSERT_TRUE(d0.ok()) << d0.status().message();
  EXPECT_EQ(d0->index, 0);            // CUDA ordinal 0 ...
  EXPECT_EQ(d0->physical_index, 1);   // ... is NVML index 1
  EXPECT_EQ(d0->name, "NVIDIA H200");
  EXPECT_EQ(d0->preset, "h200");
  EXPECT_EQ(d0->pci_bus_id, "00000000:1A:00.0");
  EXPECT_EQ(d0->sample.memory_free_bytes, 140000000000);
  EXPECT_EQ(d0->sample.utilization.compute, kUnsupported);  // NOT_SUPPORTED
  auto d1 = (*source)->Describe(1);
  ASSERT_TRUE(d1.ok());
  EXPECT_EQ(d1->physical_index, 0);
  EXPECT_EQ(d1->preset, "h100");
  EXPECT_EQ(d1->sample.memory_total_bytes, 150000000000);
  EXPECT_EQ(d1->sample.memory_free_bytes, 1000);
  EXPECT_EQ(d1->sample.utilization.compute, 55);
  EXPECT_EQ(d1->sample.utilization.memory, 20);
}

TEST(NvmlTest, WithoutTheCudaDriverFallsBackToNvmlOrderAndSaysSo) {
  ScriptedHardware hw("", kTwoGpus);
  SourceOptions options = FakeOptions();
  options.cuda_library = FakePath("nowhere/libcuda.so.1");
  auto source = OpenNvml(options);
  ASSERT_TRUE(source.ok()) << source.status().message();
  ASSERT_EQ((*source)->notes().size(), 1u);
  EXPECT_NE((*source)->notes()[0].find("NVML index order"), std::string::npos);
  auto d0 = (*source)->Describe(0);
  ASSERT_TRUE(d0.ok());
  EXPECT_EQ(d0->physical_index, 0);
  EXPECT_EQ(d0->name, "NVIDIA H100 80GB HBM3");
}

TEST(NvmlTest, InitFailureNamesCallCodeAndNvmlText) {
  ScriptedHardware hw("", std::string(kTwoGpus) + ";error.nvmlInit_v2=9");
  auto source = OpenNvml(FakeOptions());
  ASSERT_FALSE(source.ok());
  EXPECT_NE(source.status().message().find("NVML (libnvidia-ml.so.1 at " + FakeNvml() +
                                           "): nvmlInit_v2 failed with NVML error 9: Driver Not "
                                           "Loaded"),
            std::string::npos)
      << source.status().message();
}

TEST(NvmlTest, MissingLibraryAndMissingSymbol) {
  ScriptedHardware hw("", kTwoGpus);
  SourceOptions options = FakeOptions();
  options.nvml_library = FakePath("nowhere/libnvidia-ml.so.1");
  auto missing = OpenNvml(options);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), Code::kNotFound);
  EXPECT_NE(missing.status().message().find("FLEXNPU_NVML_LIBRARY"), std::string::npos);
  options.nvml_library = FakePath("nvml_no_bus_id/libnvidia-ml.so.1");
  auto no_symbol = OpenNvml(options);
  ASSERT_FALSE(no_symbol.ok());
  EXPECT_EQ(no_symbol.status().code(), Code::kFailedPrecondition);
  EXPECT_NE(no_symbol.status().message().find("missing symbol(s) nvmlDeviceGetHandleByPciBusId_v2"),
            std::string::npos)
      << no_symbol.status().message();
}

TEST(NvmlTest, UnknownBusIdIsNotFound) {
  // The CUDA driver reports a bus NVML does not know.
  ScriptedHardware hw("", std::string(kTwoGpus) + ";error.nvmlDeviceGetHandleByPciBusId_v2=6");
  auto source = OpenNvml(FakeOptions());
  ASSERT_FALSE(source.ok());
  EXPECT_EQ(source.status().code(), Code::kNotFound);
  EXPECT_NE(source.status().message().find("nvmlDeviceGetHandleByPciBusId_v2(0000:1a:00.0) "
                                           "failed with NVML error 6: Not Found"),
            std::string::npos)
      << source.status().message();
}

}  // namespace
}  // namespace flexnpu::hardware
