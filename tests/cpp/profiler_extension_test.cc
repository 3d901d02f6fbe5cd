// The profiler extension FlexNPU forwards: found anywhere in the inner chain, copied whole
// (the inner's function table included), relinked; absent or malformed: nothing offered.
#include "pjrt_flexnpu/runtime/profiler_extension.h"

#include <gtest/gtest.h>

namespace flexnpu {
namespace {

// The shape of a profiler extension: the base and the inner's API table pointer.
struct FakeProfilerExtension {
  PJRT_Extension_Base base;
  void* profiler_api;
};

PJRT_Api ApiWith(PJRT_Extension_Base* chain) {
  PJRT_Api api{};
  api.struct_size = PJRT_Api_STRUCT_SIZE;
  api.extension_start = chain;
  return api;
}

TEST(ProfilerExtensionTest, ForwardsTheInnerExtensionWithItsTable) {
  int table = 0;
  FakeProfilerExtension profiler{};
  profiler.base.struct_size = sizeof(profiler);
  profiler.base.type = PJRT_Extension_Type_Profiler;
  profiler.profiler_api = &table;
  PJRT_Extension_Base ffi{};
  ffi.struct_size = sizeof(ffi);
  ffi.type = PJRT_Extension_Type_FFI;
  ffi.next = &profiler.base;  // second in the chain
  PJRT_Extension_Base* forwarded = ForwardedProfilerExtension(ApiWith(&ffi));
  ASSERT_NE(forwarded, nullptr);
  EXPECT_NE(forwarded, &profiler.base) << "FlexNPU's own copy, linked into its own chain";
  EXPECT_EQ(forwarded->type, PJRT_Extension_Type_Profiler);
  EXPECT_EQ(forwarded->struct_size, sizeof(profiler));
  EXPECT_EQ(forwarded->next, nullptr);
  EXPECT_EQ(reinterpret_cast<FakeProfilerExtension*>(forwarded)->profiler_api, &table);
}

TEST(ProfilerExtensionTest, NothingWhenTheInnerHasNoneOrAMalformedOne) {
  EXPECT_EQ(ForwardedProfilerExtension(ApiWith(nullptr)), nullptr);
  PJRT_Extension_Base layouts{};
  layouts.struct_size = sizeof(layouts);
  layouts.type = PJRT_Extension_Type_Layouts;
  EXPECT_EQ(ForwardedProfilerExtension(ApiWith(&layouts)), nullptr);
  PJRT_Extension_Base tiny{};
  tiny.struct_size = 1;  // smaller than its own base
  tiny.type = PJRT_Extension_Type_Profiler;
  EXPECT_EQ(ForwardedProfilerExtension(ApiWith(&tiny)), nullptr);
  PJRT_Extension_Base loop{};  // a cycle without a profiler: bounded, nothing found
  loop.struct_size = sizeof(loop);
  loop.type = PJRT_Extension_Type_FFI;
  loop.next = &loop;
  EXPECT_EQ(ForwardedProfilerExtension(ApiWith(&loop)), nullptr);
  PJRT_Api old = ApiWith(&layouts);
  old.struct_size = offsetof(PJRT_Api, extension_start);  // no extension_start field
  EXPECT_EQ(ForwardedProfilerExtension(old), nullptr);
}

}  // namespace
}  // namespace flexnpu
