// The PJRT_Api table FlexNPU hands out (generated from c_api/entry_points.h's
// FLEXNPU_ENTRY_POINTS and api.cc's FLEXNPU_STUBBED_SLOTS): every slot of the header it is
// built with is filled, and a refused slot answers UNIMPLEMENTED naming itself and why.
#include "c_api_test_fixture.h"

namespace {

TEST_F(CApiTest, EverySlotOfTheHeaderIsFilled) {
  // The function slots run from PJRT_Error_Destroy to the end of the header's table.
  const size_t first = offsetof(PJRT_Api, PJRT_Error_Destroy);
  ASSERT_GE(api->struct_size, PJRT_Api_STRUCT_SIZE);
  std::vector<size_t> empty;
  size_t slots = 0;
  for (size_t offset = first; offset + sizeof(void*) <= PJRT_Api_STRUCT_SIZE;
       offset += sizeof(void*)) {
    void* slot = nullptr;
    std::memcpy(&slot, reinterpret_cast<const char*>(api) + offset, sizeof(slot));
    if (slot == nullptr) empty.push_back((offset - first) / sizeof(void*));
    ++slots;
  }
  EXPECT_GT(slots, 100u);
  EXPECT_TRUE(empty.empty()) << empty.size() << " empty slots; the first is slot #"
                             << (empty.empty() ? 0 : empty[0]) << " after PJRT_Error_Destroy";
}

TEST_F(CApiTest, RefusedSlotsAreUnimplementedAndSaySo) {
  PJRT_Client_DmaMap_Args dma{};
  dma.struct_size = PJRT_Client_DmaMap_Args_STRUCT_SIZE;
  ErrorInfo info = Info(api->PJRT_Client_DmaMap(&dma));
  EXPECT_EQ(info.code, PJRT_Error_Code_UNIMPLEMENTED);
  EXPECT_NE(info.message.find("PJRT_Client_DmaMap is not supported by FlexNPU: DMA mapping"),
            std::string::npos)
      << info.message;

  PJRT_Compile_Args compile{};
  compile.struct_size = PJRT_Compile_Args_STRUCT_SIZE;
  info = Info(api->PJRT_Compile(&compile));
  EXPECT_EQ(info.code, PJRT_Error_Code_UNIMPLEMENTED);
  EXPECT_NE(info.message.find("PJRT_Compile is not supported by FlexNPU: ahead-of-time"),
            std::string::npos)
      << info.message;
}

TEST_F(CApiTest, ImplementedSlotsCheckTheirArguments) {
  // A generated entry point is FlexNPU's, not a stub: it validates its handle.
  PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args args{};
  args.struct_size = PJRT_Buffer_OpaqueDeviceMemoryDataPointer_Args_STRUCT_SIZE;
  args.buffer = nullptr;
  ErrorInfo info = Info(api->PJRT_Buffer_OpaqueDeviceMemoryDataPointer(&args));
  EXPECT_EQ(info.code, PJRT_Error_Code_INVALID_ARGUMENT);
  EXPECT_NE(info.message.find("PJRT_Buffer_OpaqueDeviceMemoryDataPointer"), std::string::npos)
      << info.message;
}

}  // namespace
