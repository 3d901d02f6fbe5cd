// Donation at the C level: FlexNPU checks after an execution only the arguments the program
// may donate (from the HLO analysis), and the virtual device's memory stats must then count
// exactly the live buffers: the donated argument stops counting, the other does not.
#include <algorithm>

#include "c_api_test_fixture.h"

namespace {

// The second argument is donated (aliased to the output); the first is only read.
constexpr char kDonateSecondProgram[] = R"(
module @donate_second attributes {mhlo.num_partitions = 1 : i32, mhlo.num_replicas = 1 : i32} {
  func.func public @main(%a: tensor<256xf32>,
                         %b: tensor<256xf32> {tf.aliasing_output = 0 : i32}) -> tensor<256xf32> {
    %0 = stablehlo.add %a, %b : tensor<256xf32>
    return %0 : tensor<256xf32>
  }
})";

int64_t BytesInUse(PJRT_Device* device) {
  PJRT_Device_MemoryStats_Args stats{};
  stats.struct_size = PJRT_Device_MemoryStats_Args_STRUCT_SIZE;
  stats.device = device;
  EXPECT_EQ(Info(api->PJRT_Device_MemoryStats(&stats)).code, PJRT_Error_Code_OK);
  return stats.bytes_in_use;
}

bool IsDeleted(PJRT_Buffer* buffer) {
  PJRT_Buffer_IsDeleted_Args args{};
  args.struct_size = PJRT_Buffer_IsDeleted_Args_STRUCT_SIZE;
  args.buffer = buffer;
  EXPECT_EQ(Info(api->PJRT_Buffer_IsDeleted(&args)).code, PJRT_Error_Code_OK);
  return args.is_deleted;
}

class CApiDonationTest : public CApiTest {};

void ExpectOnlyTheDonatedArgumentStopsCounting(CApiDonationTest& test,
                                               std::vector<PJRT_NamedValue> options) {
  PJRT_Client* client = nullptr;
  ErrorInfo created = test.TryCreateClient(std::move(options), &client);
  ASSERT_EQ(created.code, PJRT_Error_Code_OK) << created.message;
  PJRT_Device* device = test.Device(client, 0);
  const int64_t base = BytesInUse(device);
  PJRT_LoadedExecutable* exe = nullptr;
  ErrorInfo compiled = test.TryCompile(client, kDonateSecondProgram, CompileOptionsFor(0), &exe);
  ASSERT_EQ(compiled.code, PJRT_Error_Code_OK) << compiled.message;

  for (int step = 0; step < 3; ++step) {
    PJRT_Buffer* a = test.Upload(client, device, std::vector<float>(256, 1.0f));
    PJRT_Buffer* b = test.Upload(client, device, std::vector<float>(256, 2.0f + step));
    ASSERT_EQ(BytesInUse(device), base + 2 * 1024);
    PJRT_Buffer* out = nullptr;
    ErrorInfo ran = test.TryExecute(exe, {a, b}, &out);
    ASSERT_EQ(ran.code, PJRT_Error_Code_OK) << ran.message;
    EXPECT_TRUE(IsDeleted(b)) << "the donated argument is consumed";
    EXPECT_FALSE(IsDeleted(a)) << "the read-only argument is not";
    // a and the output count; the donated b does not.
    EXPECT_EQ(BytesInUse(device), base + 2 * 1024) << "step " << step;
    EXPECT_EQ(CApiTest::Download(out, 256), std::vector<float>(256, 3.0f + step));
    EXPECT_EQ(CApiTest::Download(a, 256), std::vector<float>(256, 1.0f));
    for (PJRT_Buffer* buffer : {a, b, out}) {
      auto& kept = test.buffers_;
      kept.erase(std::remove(kept.begin(), kept.end(), buffer), kept.end());
      CApiTest::DestroyBuffer(buffer);
    }
    EXPECT_EQ(BytesInUse(device), base);
  }
}

TEST_F(CApiDonationTest, OnlyTheDonatedArgumentStopsCountingPassthrough) {
  ExpectOnlyTheDonatedArgumentStopsCounting(*this, {IntOption("num_virtual_devices", 2)});
}

TEST_F(CApiDonationTest, OnlyTheDonatedArgumentStopsCountingDynamic) {
  ExpectOnlyTheDonatedArgumentStopsCounting(
      *this, {IntOption("num_virtual_devices", 8), StringOption("policy", "dynamic")});
}

}  // namespace
